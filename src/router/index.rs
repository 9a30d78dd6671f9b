//! The router's KV index (a KV block manager): which chunks each worker
//! holds, and in which tier, as far as the router knows.
//!
//! It changes only through stored/removed events from workers, so it is
//! stale by the workers' coalescing window plus the router's collection
//! interval. It is keyed by chunk (the hash of a chunk's last block, the key
//! the tiers and the workers' events use) and kept as a reverse map chunk →
//! holders, so scoring a request touches only workers that hold one of its
//! chunks. Chunks in the shared distributed file system are available to
//! every worker.

use crate::ids::WorkerId;
use crate::kvcache::{BlockHash, KvEvent, KvEventKind, Tier};
use nohash_hasher::IntMap;
use smallvec::SmallVec;

/// Holders of one chunk: `(worker, tier bits)` sorted by worker, plus
/// whether the DFS holds it.
/// Most chunks have one or two holders; they are stored inline, so applying
/// an event costs one hash-table probe and no pointer chase.
#[derive(Clone, Debug, Default)]
struct Holders {
    workers: SmallVec<[(u32, u8); 2]>,
    dfs: bool,
}

impl Holders {
    fn find(&self, w: u32) -> Result<usize, usize> {
        self.workers.binary_search_by_key(&w, |&(x, _)| x)
    }
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
    chunks: IntMap<BlockHash, Holders>,
    /// Chunks each worker holds (any tier).
    per_worker: Vec<u64>,
    /// Scratch for scoring: candidates, and tier bits by worker.
    alive: Vec<u32>,
    next: Vec<u32>,
    bits: Vec<u8>,
}

impl KvIndex {
    /// An empty index of chunks of `stride` engine blocks.
    pub fn new(stride: u64) -> KvIndex {
        KvIndex { stride, ..KvIndex::default() }
    }

    /// Applies one event from `worker`: each chunk it names in turn.
    pub fn apply(&mut self, worker: WorkerId, e: &KvEvent) {
        for h in e.chunks.hashes(self.stride) {
            self.apply_one(worker, e, h);
        }
    }

    /// Applies event `e` of `worker` to chunk `hash`.
    fn apply_one(&mut self, worker: WorkerId, e: &KvEvent, hash: BlockHash) {
        let w = worker.0;
        if self.per_worker.len() <= w as usize {
            self.per_worker.resize(w as usize + 1, 0);
        }
        match (e.kind, e.tier) {
            (KvEventKind::Stored, Tier::Dfs) => self.chunks.entry(hash).or_default().dfs = true,
            (KvEventKind::Removed, Tier::Dfs) => {
                if let Some(h) = self.chunks.get_mut(&hash) {
                    h.dfs = false;
                    if h.workers.is_empty() {
                        self.chunks.remove(&hash);
                    }
                }
            }
            (KvEventKind::Stored, t) => {
                let h = self.chunks.entry(hash).or_default();
                match h.find(w) {
                    Ok(i) => h.workers[i].1 |= bit(t),
                    Err(i) => {
                        h.workers.insert(i, (w, bit(t)));
                        self.per_worker[w as usize] += 1;
                    }
                }
            }
            (KvEventKind::Removed, t) => {
                let Some(h) = self.chunks.get_mut(&hash) else { return };
                if let Ok(i) = h.find(w) {
                    h.workers[i].1 &= !bit(t);
                    if h.workers[i].1 == 0 {
                        h.workers.remove(i);
                        self.per_worker[w as usize] -= 1;
                    }
                }
                if h.workers.is_empty() && !h.dfs {
                    self.chunks.remove(&hash);
                }
            }
        }
    }

    /// Chunks `worker` holds in any tier (the DFS not counted).
    pub fn held_by(&self, worker: WorkerId) -> u64 {
        self.per_worker.get(worker.index()).copied().unwrap_or(0)
    }

    /// For each of `workers` workers, the leading run of `keys` it could serve,
    /// with each chunk weighted by `weights[tier]` of the fastest tier it is
    /// in there (DFS if only the DFS has it). Written into `out` (indexed by
    /// worker). While the DFS holds the prefix every worker is a candidate;
    /// that common part is added once at the end, so the work is
    /// proportional to the local holders of the matched chunks.
    pub fn score(&mut self, keys: &[BlockHash], workers: usize, weights: &[f64; 4], out: &mut Vec<Match>) {
        out.clear();
        out.resize(workers, Match::default());
        self.bits.clear();
        self.bits.resize(workers, 0);
        let dfs_w = weights[Tier::Dfs.index()];
        let weight = |bits: u8| Tier::ALL.iter().find(|t| bits & bit(**t) != 0).map_or(dfs_w, |t| weights[t.index()]);
        // Phase 1: every worker can read the prefix from the DFS; local copies add their tier's advantage.
        let mut common = 0u32;
        let mut common_weight = 0.0;
        let mut j = 0;
        while j < keys.len() {
            let Some(h) = self.chunks.get(&keys[j]) else { break };
            if !h.dfs {
                break;
            }
            common += 1;
            common_weight += dfs_w;
            for &(w, b) in &h.workers {
                if let Some(m) = out.get_mut(w as usize) {
                    m.weighted += weight(b) - dfs_w;
                }
            }
            j += 1;
        }
        // Phase 2: from the first chunk not in the DFS on, only local holders continue.
        self.alive.clear();
        let mut first = true;
        while j < keys.len() {
            let Some(h) = self.chunks.get(&keys[j]) else { break };
            self.next.clear();
            if first {
                self.next.extend(h.workers.iter().map(|&(w, _)| w).filter(|&w| (w as usize) < workers));
                for &(w, b) in &h.workers {
                    if (w as usize) < workers {
                        self.bits[w as usize] = b;
                    }
                }
            } else {
                for &(w, b) in &h.workers {
                    if (w as usize) < workers {
                        self.bits[w as usize] = b;
                    }
                }
                let bits = &self.bits;
                self.next.extend(self.alive.iter().copied().filter(|&w| h.dfs || bits[w as usize] != 0));
            }
            for &w in &self.next {
                let m = &mut out[w as usize];
                m.chunks += 1;
                m.weighted += weight(self.bits[w as usize]);
            }
            for &(w, _) in &h.workers {
                if (w as usize) < workers {
                    self.bits[w as usize] = 0;
                }
            }
            if self.next.is_empty() {
                break;
            }
            std::mem::swap(&mut self.alive, &mut self.next);
            first = false;
            j += 1;
        }
        if common > 0 {
            for m in out.iter_mut() {
                m.chunks += common;
                m.weighted += common_weight;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvcache::EventChunks;

    fn ev(tier: Tier, hash: u64, kind: KvEventKind) -> KvEvent {
        KvEvent { tier, chunks: EventChunks::One(BlockHash(hash)), kind }
    }

    const W: [f64; 4] = [1.0, 0.5, 0.25, 0.1];

    fn keys(xs: &[u64]) -> Vec<BlockHash> {
        xs.iter().map(|&x| BlockHash(x)).collect()
    }

    #[test]
    fn stored_and_removed_events_update_holders() {
        let mut ix = KvIndex::default();
        ix.apply(WorkerId(1), &ev(Tier::Gpu, 7, KvEventKind::Stored));
        ix.apply(WorkerId(1), &ev(Tier::Cpu, 7, KvEventKind::Stored));
        assert_eq!(ix.held_by(WorkerId(1)), 1, "one chunk, two tiers");
        ix.apply(WorkerId(1), &ev(Tier::Gpu, 7, KvEventKind::Removed));
        assert_eq!(ix.held_by(WorkerId(1)), 1, "still in CPU memory");
        ix.apply(WorkerId(1), &ev(Tier::Cpu, 7, KvEventKind::Removed));
        assert_eq!(ix.held_by(WorkerId(1)), 0);
        assert!(ix.chunks.is_empty(), "no empty entries are left behind");
    }

    #[test]
    fn scoring_a_known_state_counts_leading_chunks_and_weights_tiers() {
        let mut ix = KvIndex::default();
        // Worker 0: chunks 1, 2, 3 in GPU. Worker 1: chunks 1, 2 in CPU, 3 missing.
        // Worker 2: chunk 2 only (no prefix). Chunk 4 is in the DFS.
        for h in [1, 2, 3] {
            ix.apply(WorkerId(0), &ev(Tier::Gpu, h, KvEventKind::Stored));
        }
        for h in [1, 2] {
            ix.apply(WorkerId(1), &ev(Tier::Cpu, h, KvEventKind::Stored));
        }
        ix.apply(WorkerId(2), &ev(Tier::Gpu, 2, KvEventKind::Stored));
        ix.apply(WorkerId(0), &ev(Tier::Dfs, 4, KvEventKind::Stored));
        let mut out = Vec::new();
        ix.score(&keys(&[1, 2, 3, 4, 5]), 3, &W, &mut out);
        // Worker 0: 1, 2, 3 (GPU) + 4 (DFS) = 4 chunks, weight 1+1+1+0.1.
        assert_eq!(out[0], Match { chunks: 4, weighted: 3.1 });
        // Worker 1: 1, 2 (CPU) then 3 is missing: 2 chunks, 0.5 + 0.5.
        assert_eq!(out[1], Match { chunks: 2, weighted: 1.0 });
        assert_eq!(out[2], Match::default(), "a chunk without its prefix does not count");
    }

    #[test]
    fn dfs_chunks_count_for_every_worker_and_removals_stop_scoring() {
        let mut ix = KvIndex::default();
        ix.apply(WorkerId(3), &ev(Tier::Dfs, 9, KvEventKind::Stored));
        let mut out = Vec::new();
        ix.score(&keys(&[9]), 4, &W, &mut out);
        assert!(out.iter().all(|m| m.chunks == 1 && m.weighted == 0.1));
        ix.apply(WorkerId(0), &ev(Tier::Gpu, 9, KvEventKind::Stored));
        ix.score(&keys(&[9]), 4, &W, &mut out);
        assert_eq!(out[0].weighted, 1.0, "the local GPU copy is the fastest");
        ix.apply(WorkerId(3), &ev(Tier::Dfs, 9, KvEventKind::Removed));
        ix.apply(WorkerId(0), &ev(Tier::Gpu, 9, KvEventKind::Removed));
        ix.score(&keys(&[9]), 4, &W, &mut out);
        assert!(out.iter().all(|m| m.chunks == 0), "removed everywhere: nobody scores");
    }
}
