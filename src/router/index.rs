//! The router's KV index (a KV block manager): which chunks each worker
//! holds, and in which tier, as far as the router knows.
//!
//! It changes only through stored/removed events from workers, so it is
//! stale by the workers' coalescing window plus the router's collection
//! interval. An event names a run of a chain's chunks, and the index keeps
//! runs too: per lane (a chain and the residue of its chunks' last blocks,
//! as the tier stores key them) the chunk ranges each worker holds, each
//! with the tiers it is in, and the ranges the shared distributed file
//! system holds (available to every worker). Applying an event costs a
//! hash-table probe and the few ranges it touches, however many chunks it
//! names; scoring a request touches only the workers that hold one of its
//! lanes.

use crate::ids::WorkerId;
use crate::kvcache::{KvEvent, KvEventKind, Lane, Run, Tier};
use nohash_hasher::IntMap;
use smallvec::SmallVec;
use std::collections::hash_map::Entry;

/// Chunks `q0..q1` of a lane, in the tiers `bits` (never 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seg {
    q0: u32,
    q1: u32,
    bits: u8,
}

/// Ranges of a lane, sorted, disjoint, and merged where they touch with
/// the same tiers.
type Segs = SmallVec<[Seg; 2]>;

/// Sets each chunk `a..b` of `segs` to `f` of its tiers (0 where it has
/// none; a chunk left with none is dropped). Returns how many chunks came
/// to be held and how many stopped being held.
fn update(segs: &mut Segs, a: u32, b: u32, f: impl Fn(u8) -> u8) -> (u64, u64) {
    // The common cases, at once: a range into a lane not held, just after
    // the one range held, or exactly the one range held.
    match segs.as_mut_slice() {
        [] if a < b => {
            let bits = f(0);
            if bits != 0 {
                segs.push(Seg { q0: a, q1: b, bits });
            }
            return (if bits != 0 { u64::from(b - a) } else { 0 }, 0);
        }
        [s] if s.q1 == a && a < b && f(0) == s.bits => {
            s.q1 = b;
            return (u64::from(b - a), 0);
        }
        [s] if s.q0 == a && s.q1 == b && f(s.bits) == 0 => {
            segs.clear();
            return (0, u64::from(b - a));
        }
        // The one range's tail or head dropped (evictions take a run's last chunks).
        [s] if s.q0 < a && a < b && s.q1 == b && f(s.bits) == 0 => {
            s.q1 = a;
            return (0, u64::from(b - a));
        }
        [s] if s.q0 == a && a < b && b < s.q1 && f(s.bits) == 0 => {
            s.q0 = b;
            return (0, u64::from(b - a));
        }
        _ => {}
    }
    let mut out = Segs::new();
    let push = |out: &mut Segs, q0: u32, q1: u32, bits: u8| {
        if q0 >= q1 || bits == 0 {
            return;
        }
        match out.last_mut() {
            Some(l) if l.q1 == q0 && l.bits == bits => l.q1 = q1,
            _ => out.push(Seg { q0, q1, bits }),
        }
    };
    let (mut gained, mut lost, mut at) = (0, 0, a);
    let mut gap = |out: &mut Segs, to: u32, at: &mut u32| {
        if *at < to {
            let bits = f(0);
            gained += if bits != 0 { u64::from(to - *at) } else { 0 };
            push(out, *at, to, bits);
            *at = to;
        }
    };
    for &s in segs.iter() {
        if s.q1 <= a {
            push(&mut out, s.q0, s.q1, s.bits);
            continue;
        }
        gap(&mut out, s.q0.min(b), &mut at);
        push(&mut out, s.q0, s.q1.min(a), s.bits);
        let (i0, i1) = (s.q0.max(a), s.q1.min(b));
        if i0 < i1 {
            let bits = f(s.bits);
            lost += if bits == 0 { u64::from(i1 - i0) } else { 0 };
            push(&mut out, i0, i1, bits);
            at = i1;
        }
        push(&mut out, s.q0.max(b), s.q1, s.bits);
    }
    gap(&mut out, b, &mut at);
    *segs = out;
    (gained, lost)
}

/// The tiers of chunk `q` in `segs` (0 if none), moving the cursor `i`
/// (which only moves forward: ask for increasing `q`).
fn bits_at(segs: &[Seg], i: &mut usize, q: u32) -> u8 {
    while *i < segs.len() && segs[*i].q1 <= q {
        *i += 1;
    }
    segs.get(*i).filter(|s| s.q0 <= q).map_or(0, |s| s.bits)
}

/// What the index knows of one lane.
#[derive(Clone, Debug, Default)]
struct LaneHolders {
    /// `(worker, its ranges)`, sorted by worker; none with no range.
    workers: SmallVec<[(u32, Segs); 2]>,
    /// The ranges the DFS holds (`bits` 1).
    dfs: Segs,
}

fn bit(t: Tier) -> u8 {
    1 << t.index()
}

/// What a worker could serve of a request, per the index.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Match {
    /// Leading chunks held (by the worker in any tier, or by the DFS).
    pub chunks: u32,
    /// Σ over those chunks of the weight of the fastest tier holding each.
    pub weighted: f64,
}

/// The router's view of the workers' caches.
#[derive(Debug, Default)]
pub struct KvIndex {
    /// Engine blocks per chunk (how a run's chunks are named).
    stride: u64,
    lanes: IntMap<u64, LaneHolders>,
    /// Chunks each worker holds (any tier).
    per_worker: Vec<u64>,
    /// Scratch for scoring: the request's runs' lanes, the candidates, and
    /// those still matching.
    spans: Vec<Lane>,
    alive: Vec<u32>,
    going: Vec<u32>,
}

/// A lane range as the index keeps it (chunk indices fit in 32 bits: a
/// sequence has fewer than 2³² blocks).
fn range(l: &Lane) -> (u32, u32) {
    (l.q0 as u32, l.q1 as u32)
}

impl KvIndex {
    /// An empty index of chunks of `stride` engine blocks.
    pub fn new(stride: u64) -> KvIndex {
        KvIndex { stride, ..KvIndex::default() }
    }

    /// Applies one event from `worker`: the run it names, at once.
    pub fn apply(&mut self, worker: WorkerId, e: &KvEvent) {
        let w = worker.0;
        if self.per_worker.len() <= w as usize {
            self.per_worker.resize(w as usize + 1, 0);
        }
        let lane = Lane::of(e.chunks.run(), self.stride);
        let (a, b) = range(&lane);
        let stored = e.kind == KvEventKind::Stored;
        let mut entry = match self.lanes.entry(lane.key) {
            Entry::Occupied(o) => o,
            Entry::Vacant(v) if stored => v.insert_entry(LaneHolders::default()),
            Entry::Vacant(_) => return,
        };
        let h = entry.get_mut();
        if e.tier == Tier::Dfs {
            update(&mut h.dfs, a, b, |_| u8::from(stored));
        } else {
            let t = bit(e.tier);
            let i = match h.workers.binary_search_by_key(&w, |x| x.0) {
                Ok(i) => i,
                Err(_) if !stored => return,
                Err(i) => {
                    h.workers.insert(i, (w, Segs::new()));
                    i
                }
            };
            let (gained, lost) = update(&mut h.workers[i].1, a, b, |x| if stored { x | t } else { x & !t });
            let held = &mut self.per_worker[w as usize];
            *held = *held + gained - lost;
            if h.workers[i].1.is_empty() {
                h.workers.remove(i);
            }
        }
        if h.workers.is_empty() && h.dfs.is_empty() {
            entry.remove();
        }
    }

    /// Chunks `worker` holds in any tier (the DFS not counted).
    pub fn held_by(&self, worker: WorkerId) -> u64 {
        self.per_worker.get(worker.index()).copied().unwrap_or(0)
    }

    /// For each of `workers` workers, the leading run of the chunks `runs`
    /// name (in order) it could serve — and, given tier `weights`, each
    /// chunk weighted by `weights[tier]` of the fastest tier it is in there
    /// (DFS if only the DFS has it; without them `weighted` stays 0).
    /// Written into `out` (indexed by worker). While the DFS holds the
    /// prefix every worker is a candidate; that common part is added once
    /// at the end, so the work is proportional to the local holders of the
    /// matched chunks — and, without weights, to their ranges, not chunks.
    pub fn score(&mut self, runs: &[Run], workers: usize, weights: Option<&[f64; 4]>, out: &mut Vec<Match>) {
        out.clear();
        out.resize(workers, Match::default());
        if self.lanes.is_empty() {
            return; // Nothing held anywhere (no prefix caching and no tiers, or not yet).
        }
        self.spans.clear();
        self.spans.extend(runs.iter().map(|&r| Lane::of(r, self.stride)));
        let lanes = &self.lanes;
        let holders = |l: &Lane| lanes.get(&l.key);
        // Phase 1: the chunks the DFS holds from the first on.
        let mut common = 0u32;
        let mut first = (self.spans.len(), 0);
        for (s, l) in self.spans.iter().enumerate() {
            let (a, b) = range(l);
            let to = reach(holders(l).map_or(&[][..], |h| &h.dfs[..]), &[], a, b);
            common += to - a;
            if to < b {
                first = (s, to);
                break;
            }
        }
        // Phase 2 starts at the first chunk not in the DFS: its holders, each
        // going on from there while it (or the DFS) holds the next chunk.
        self.alive.clear();
        self.going.clear();
        if let Some(h) = self.spans.get(first.0).and_then(holders) {
            let (a, b) = (first.1, range(&self.spans[first.0]).1);
            for (w, segs) in h.workers.iter().filter(|(w, _)| (*w as usize) < workers) {
                if bits_at(segs, &mut 0, a) == 0 {
                    continue;
                }
                self.alive.push(*w);
                let to = span_reach(segs, &h.dfs, a, b);
                out[*w as usize].chunks += to - a;
                if to == b {
                    self.going.push(*w);
                }
            }
        }
        // Span by span after it: each span's holders found once, and the
        // candidates still going (in worker order, as a lane's holders are)
        // met in one merge with them.
        for l in self.spans.iter().skip(first.0 + 1) {
            let Some(h) = holders(l).filter(|_| !self.going.is_empty()) else { break };
            let (a, b) = range(l);
            let mut j = 0;
            self.going.retain(|&w| {
                while h.workers.get(j).is_some_and(|x| x.0 < w) {
                    j += 1;
                }
                let segs = h.workers.get(j).filter(|x| x.0 == w).map_or(&[][..], |x| &x.1[..]);
                let to = span_reach(segs, &h.dfs, a, b);
                out[w as usize].chunks += to - a;
                to == b
            });
        }
        if let Some(weights) = weights {
            self.weigh(holders, first, weights, out);
        }
        for m in out.iter_mut() {
            m.chunks += common;
        }
    }

    /// [`Self::score`]'s tier weights, chunk by chunk (each worker's
    /// weights summed in chunk order, the DFS prefix's added last, so that
    /// equal holdings weigh exactly alike): the DFS prefix's chunks (up to
    /// `first`) weigh the DFS's weight for everyone, local copies adding
    /// their tier's advantage; then each candidate's chunks while it (or
    /// the DFS) holds them.
    fn weigh<'a>(
        &self,
        holders: impl Fn(&Lane) -> Option<&'a LaneHolders>,
        first: (usize, u32),
        weights: &[f64; 4],
        out: &mut [Match],
    ) {
        let dfs_w = weights[Tier::Dfs.index()];
        let weight = |bits: u8| Tier::ALL.iter().find(|t| bits & bit(**t) != 0).map_or(dfs_w, |t| weights[t.index()]);
        let mut common_weight = 0.0;
        for (s, l) in self.spans.iter().enumerate().take(first.0 + 1) {
            let (a, b) = range(l);
            let b = if s == first.0 { first.1 } else { b };
            (a..b).for_each(|_| common_weight += dfs_w);
            let Some(h) = holders(l) else { continue };
            for (w, segs) in &h.workers {
                let Some(m) = out.get_mut(*w as usize) else { continue };
                for seg in segs.iter().filter(|x| x.q1 > a && x.q0 < b) {
                    for _ in seg.q0.max(a)..seg.q1.min(b) {
                        m.weighted += weight(seg.bits) - dfs_w;
                    }
                }
            }
        }
        for &w in &self.alive {
            let m = &mut out[w as usize];
            'chunks: for (s, l) in self.spans.iter().enumerate().skip(first.0) {
                let Some(h) = holders(l) else { break };
                let (a, b) = range(l);
                let a = if s == first.0 { first.1 } else { a };
                let (segs, mut i, mut j) = (worker_segs(h, w), 0, 0);
                for q in a..b {
                    let bits = bits_at(segs, &mut i, q);
                    if bits == 0 && bits_at(&h.dfs, &mut j, q) == 0 {
                        break 'chunks;
                    }
                    m.weighted += weight(bits);
                }
            }
        }
        if common_weight > 0.0 {
            for m in out.iter_mut() {
                m.weighted += common_weight;
            }
        }
    }
}

/// Worker `w`'s ranges in a lane (none if it holds nothing there).
fn worker_segs(h: &LaneHolders, w: u32) -> &[Seg] {
    h.workers.binary_search_by_key(&w, |x| x.0).map_or(&[][..], |i| &h.workers[i].1[..])
}

/// [`reach`] of a worker's ranges `segs` and the DFS's `dfs` over a span
/// `a..b`, taking the common case — one range covering it — at once.
fn span_reach(segs: &[Seg], dfs: &[Seg], a: u32, b: u32) -> u32 {
    match segs {
        [s] if s.q0 <= a && s.q1 >= b => b,
        _ => reach(segs, dfs, a, b),
    }
}

/// How far from chunk `a` (up to `b`) the chunks are held, one after
/// another, by `x` or `y`: range by range.
fn reach(x: &[Seg], y: &[Seg], a: u32, b: u32) -> u32 {
    let end_of = |segs: &[Seg], q: u32| {
        let i = segs.partition_point(|s| s.q1 <= q);
        segs.get(i).filter(|s| s.q0 <= q).map(|s| s.q1)
    };
    let mut q = a;
    while q < b {
        match end_of(x, q).max(end_of(y, q)) {
            Some(e) => q = e.min(b),
            None => break,
        }
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvcache::{ChunkKey, EventChunks};
    use std::collections::BTreeMap;

    const W: [f64; 4] = [1.0, 0.5, 0.25, 0.1];
    /// Chunks of 2 blocks: chunk `q` of the lane ends at block `2q + 1`.
    const STRIDE: u64 = 2;

    /// An event naming chunks `q..q + n` of chain `chain`.
    fn ev(tier: Tier, chain: u64, q: u64, n: u64, kind: KvEventKind) -> KvEvent {
        KvEvent { tier, chunks: EventChunks::Run(Run { chain, block: q * STRIDE + 1, n }), kind }
    }

    /// Runs naming chunks `q..q + n` of chain `chain`, for each `(chain, q, n)`.
    fn runs(xs: &[(u64, u64, u64)]) -> Vec<Run> {
        xs.iter().map(|&(chain, q, n)| Run { chain, block: q * STRIDE + 1, n }).collect()
    }

    #[test]
    fn stored_and_removed_events_update_holders() {
        let mut ix = KvIndex::new(STRIDE);
        ix.apply(WorkerId(1), &ev(Tier::Gpu, 7, 0, 4, KvEventKind::Stored));
        ix.apply(WorkerId(1), &ev(Tier::Cpu, 7, 2, 4, KvEventKind::Stored));
        assert_eq!(ix.held_by(WorkerId(1)), 6, "chunks 0..6, two of them in two tiers");
        ix.apply(WorkerId(1), &ev(Tier::Gpu, 7, 0, 4, KvEventKind::Removed));
        assert_eq!(ix.held_by(WorkerId(1)), 4, "2..6 still in CPU memory");
        ix.apply(WorkerId(1), &ev(Tier::Cpu, 7, 3, 2, KvEventKind::Removed));
        assert_eq!(ix.held_by(WorkerId(1)), 2, "2 and 5 left");
        let segs = &ix.lanes.values().next().expect("a lane").workers[0].1;
        let cpu = bit(Tier::Cpu);
        assert_eq!(segs[..], [Seg { q0: 2, q1: 3, bits: cpu }, Seg { q0: 5, q1: 6, bits: cpu }]);
        ix.apply(WorkerId(1), &ev(Tier::Cpu, 7, 0, 9, KvEventKind::Removed));
        assert_eq!(ix.held_by(WorkerId(1)), 0);
        assert!(ix.lanes.is_empty(), "no empty entries are left behind");
    }

    #[test]
    fn scoring_a_known_state_counts_leading_chunks_and_weights_tiers() {
        let mut ix = KvIndex::new(STRIDE);
        // Chain 1, chunks 0..5. Worker 0: 0, 1, 2 in GPU. Worker 1: 0, 1 in
        // CPU, 2 missing. Worker 2: 1 only (no prefix). Chunk 3 is in the DFS.
        ix.apply(WorkerId(0), &ev(Tier::Gpu, 1, 0, 3, KvEventKind::Stored));
        ix.apply(WorkerId(1), &ev(Tier::Cpu, 1, 0, 2, KvEventKind::Stored));
        ix.apply(WorkerId(2), &ev(Tier::Gpu, 1, 1, 1, KvEventKind::Stored));
        ix.apply(WorkerId(0), &ev(Tier::Dfs, 1, 3, 1, KvEventKind::Stored));
        let mut out = Vec::new();
        ix.score(&runs(&[(1, 0, 5)]), 3, Some(&W), &mut out);
        // Worker 0: 0, 1, 2 (GPU) + 3 (DFS) = 4 chunks, weight 1+1+1+0.1.
        assert_eq!(out[0], Match { chunks: 4, weighted: 3.1 });
        // Worker 1: 0, 1 (CPU) then 2 is missing: 2 chunks, 0.5 + 0.5.
        assert_eq!(out[1], Match { chunks: 2, weighted: 1.0 });
        assert_eq!(out[2], Match::default(), "a chunk without its prefix does not count");
        // The same chunks as two runs on two chains score alike.
        let mut ix2 = KvIndex::new(STRIDE);
        ix2.apply(WorkerId(0), &ev(Tier::Gpu, 1, 0, 2, KvEventKind::Stored));
        ix2.apply(WorkerId(0), &ev(Tier::Gpu, 2, 2, 1, KvEventKind::Stored));
        ix2.apply(WorkerId(0), &ev(Tier::Dfs, 2, 3, 1, KvEventKind::Stored));
        ix2.score(&runs(&[(1, 0, 2), (2, 2, 3)]), 1, Some(&W), &mut out);
        assert_eq!(out[0], Match { chunks: 4, weighted: 3.1 });
    }

    #[test]
    fn dfs_chunks_count_for_every_worker_and_removals_stop_scoring() {
        let mut ix = KvIndex::new(STRIDE);
        ix.apply(WorkerId(3), &ev(Tier::Dfs, 9, 0, 1, KvEventKind::Stored));
        let mut out = Vec::new();
        ix.score(&runs(&[(9, 0, 1)]), 4, Some(&W), &mut out);
        assert!(out.iter().all(|m| m.chunks == 1 && m.weighted == 0.1));
        ix.apply(WorkerId(0), &ev(Tier::Gpu, 9, 0, 1, KvEventKind::Stored));
        ix.score(&runs(&[(9, 0, 1)]), 4, Some(&W), &mut out);
        assert_eq!(out[0].weighted, 1.0, "the local GPU copy is the fastest");
        ix.apply(WorkerId(3), &ev(Tier::Dfs, 9, 0, 1, KvEventKind::Removed));
        ix.apply(WorkerId(0), &ev(Tier::Gpu, 9, 0, 1, KvEventKind::Removed));
        ix.score(&runs(&[(9, 0, 1)]), 4, Some(&W), &mut out);
        assert!(out.iter().all(|m| m.chunks == 0), "removed everywhere: nobody scores");
    }

    /// The index chunk by chunk, as it was kept before it kept runs: each
    /// chunk's holders with their tiers, and whether the DFS holds it.
    #[derive(Default)]
    struct Oracle {
        chunks: BTreeMap<BlockHash, (BTreeMap<u32, u8>, bool)>,
    }

    use crate::kvcache::BlockHash;

    impl Oracle {
        fn apply(&mut self, w: u32, e: &KvEvent) {
            for h in e.chunks.hashes(STRIDE) {
                let c = self.chunks.entry(h).or_default();
                match (e.kind, e.tier) {
                    (KvEventKind::Stored, Tier::Dfs) => c.1 = true,
                    (KvEventKind::Removed, Tier::Dfs) => c.1 = false,
                    (KvEventKind::Stored, t) => *c.0.entry(w).or_default() |= bit(t),
                    (KvEventKind::Removed, t) => {
                        if let Some(b) = c.0.get_mut(&w) {
                            *b &= !bit(t);
                            if *b == 0 {
                                c.0.remove(&w);
                            }
                        }
                    }
                }
                if c.0.is_empty() && !c.1 {
                    self.chunks.remove(&h);
                }
            }
        }

        fn held_by(&self, w: u32) -> u64 {
            self.chunks.values().filter(|c| c.0.contains_key(&w)).count() as u64
        }

        /// The scoring rule chunk by chunk: the DFS prefix counts for
        /// everyone (local copies adding their advantage), then the holders
        /// of the first chunk past it go on while they or the DFS hold the next.
        fn score(&self, keys: &[BlockHash], workers: usize) -> Vec<Match> {
            let mut out = vec![Match::default(); workers];
            let dfs_w = W[Tier::Dfs.index()];
            let weight = |bits: u8| Tier::ALL.iter().find(|t| bits & bit(**t) != 0).map_or(dfs_w, |t| W[t.index()]);
            let (mut common, mut common_weight, mut j) = (0, 0.0, 0);
            while let Some(c) = keys.get(j).and_then(|k| self.chunks.get(k)).filter(|c| c.1) {
                common += 1;
                common_weight += dfs_w;
                for (&w, &b) in c.0.iter().filter(|x| (*x.0 as usize) < workers) {
                    out[w as usize].weighted += weight(b) - dfs_w;
                }
                j += 1;
            }
            let first = keys.get(j).and_then(|k| self.chunks.get(k));
            let alive: Vec<u32> =
                first.map_or(Vec::new(), |c| c.0.keys().copied().filter(|&w| (w as usize) < workers).collect());
            for w in alive {
                for k in &keys[j..] {
                    let Some(c) = self.chunks.get(k).filter(|c| c.1 || c.0.contains_key(&w)) else { break };
                    out[w as usize].chunks += 1;
                    out[w as usize].weighted += weight(c.0.get(&w).copied().unwrap_or(0));
                }
            }
            for m in &mut out {
                m.chunks += common;
                m.weighted += common_weight;
            }
            out
        }
    }

    #[test]
    fn runs_apply_and_score_exactly_as_chunk_by_chunk() {
        // Random runs on 3 chains of 12 chunks (and partial chunks, whose
        // lane is another residue) stored in and removed from random tiers
        // of 5 workers; after every event, what each worker holds and every
        // request's score (random leading runs across the chains) agree.
        let mut next = crate::rng::lcg_below(0x1234_5678_9abc_def1_u64);
        let tiers = [Tier::Gpu, Tier::Cpu, Tier::Nvme, Tier::Dfs];
        let (mut ix, mut oracle) = (KvIndex::new(STRIDE), Oracle::default());
        let mut out = Vec::new();
        for step in 0..4_000 {
            let (chain, w) = (100 + next(3), next(5) as u32);
            let q = next(12);
            // Mostly full chunks (block 2q + 1); now and then a partial one (block 2q).
            let block = q * STRIDE + 1 - u64::from(next(8) == 0);
            let n = if block.is_multiple_of(STRIDE) { 1 } else { 1 + next(12 - q) };
            let run = Run { chain, block, n };
            let chunks = if next(2) == 0 { EventChunks::Run(run) } else { EventChunks::RunUp(run) };
            let kind = if next(3) == 0 { KvEventKind::Removed } else { KvEventKind::Stored };
            let e = KvEvent { tier: tiers[next(4) as usize], chunks, kind };
            ix.apply(WorkerId(w), &e);
            oracle.apply(w, &e);
            for v in 0..5 {
                assert_eq!(ix.held_by(WorkerId(v)), oracle.held_by(v), "step {step}, worker {v}");
            }
            // A request: chunks 0..a of one chain, then a.. of another (full chunks).
            let (c1, c2, a) = (100 + next(3), 100 + next(3), next(13));
            let req = [Run { chain: c1, block: 1, n: a }, Run { chain: c2, block: a * STRIDE + 1, n: 12 - a }];
            let req: Vec<Run> = req.into_iter().filter(|r| r.n > 0).collect();
            let keys: Vec<BlockHash> = req
                .iter()
                .flat_map(|r| (0..r.n).map(|i| ChunkKey::new(r.chain, r.block + i * STRIDE).hash()))
                .collect();
            let workers = 4 + next(2) as usize;
            ix.score(&req, workers, Some(&W), &mut out);
            let expected = oracle.score(&keys, workers);
            assert_eq!(out, expected, "step {step}");
            // Without weights, the same chunks, range by range.
            ix.score(&req, workers, None, &mut out);
            let chunks: Vec<Match> = expected.iter().map(|m| Match { chunks: m.chunks, weighted: 0.0 }).collect();
            assert_eq!(out, chunks, "step {step}, unweighted");
        }
        assert!(ix.lanes.len() <= 6, "three chains, two residues each");
    }
}
