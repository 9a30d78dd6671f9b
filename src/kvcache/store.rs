//! A tier's chunk index: which chunks a CPU memory, NVMe or distributed file
//! system store holds, its capacity, and its eviction order.
//!
//! Chunks are held as **runs**: consecutive chunks of one chain (a chunk is
//! named by the chain of its last block and that block's index, so chunks
//! `i, i + 1, …` of a chain are blocks `b, b + stride, …` of it) that were
//! written, refreshed, pinned and completed together are one entry, so a
//! prefix written or refreshed at once costs one entry and one list splice,
//! not one per chunk. The order is exactly that of a store of single
//! chunks (a run's chunks lie next to each other in the recency list, its
//! last chunk nearest the least recent end — writes and refreshes take a
//! prefix last chunk first); entries split where an operation covers part
//! of one and merge again where neighbours agree. Under LFU every entry is
//! one chunk (each has its own count).
//!
//! Chunks are written with space reserved first (they become visible to
//! lookups only when the write completes) and can be pinned while a read is
//! in flight; neither in-flight nor pinned chunks are evicted, so a fetch is
//! never counted as a hit for data evicted between lookup and read.

use super::ChunkKey;
use nohash_hasher::IntMap;
use smallvec::SmallVec;
use std::collections::BTreeSet;

/// Which chunk a full store gives up first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// Least recently used (written or read).
    Lru,
    /// Least frequently used (reads + 1), ties least recently used.
    Lfu,
    /// Oldest written.
    Fifo,
}

impl EvictionPolicy {
    /// Parses `lru`, `lfu` or `fifo` (case-insensitive).
    pub fn from_name(name: &str) -> Option<EvictionPolicy> {
        match name.to_ascii_lowercase().as_str() {
            "lru" => Some(EvictionPolicy::Lru),
            "lfu" => Some(EvictionPolicy::Lfu),
            "fifo" => Some(EvictionPolicy::Fifo),
            _ => None,
        }
    }
}

const NIL: u32 = u32::MAX;

/// Chunks `block, block + stride, …` (`n` of them) of chain `chain`: a run
/// (a single chunk when `block` is [`ChunkKey::EXACT`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Run {
    /// The chain.
    pub chain: u64,
    /// The last block of its first chunk.
    pub block: u64,
    /// Chunks.
    pub n: u64,
}

impl Run {
    /// The run of one chunk.
    pub fn one(key: ChunkKey) -> Run {
        Run { chain: key.chain, block: key.block, n: 1 }
    }

    /// Its first `n` chunks.
    pub fn first(self, n: u64) -> Run {
        Run { n, ..self }
    }

    /// Its chunks from the `i`-th on, for chunks of `stride` blocks.
    pub fn skip(self, i: u64, stride: u64) -> Run {
        if i == 0 { self } else { Run { block: self.block + i * stride, n: self.n - i, ..self } }
    }

    /// Its `i`-th chunk, for chunks of `stride` blocks.
    pub fn key(&self, i: u64, stride: u64) -> ChunkKey {
        let block = if self.block == ChunkKey::EXACT { ChunkKey::EXACT } else { self.block + i * stride };
        ChunkKey::from_parts(self.chain, block)
    }
}

/// One run of chunks, in a slab slot, linked into the recency list (LRU
/// and FIFO): chunks `q0..q1` of its lane, the chunk with the highest index
/// nearest the head (the least recent end). Its 64 bytes are aligned to a
/// cache line, so an entry read cold costs one line, not two.
#[derive(Clone, Copy, Debug)]
#[repr(align(64))]
struct Entry {
    chain: u64,
    /// Which blocks of the chain end its chunks: those `≡ res (mod stride)`
    /// ([`ChunkKey::EXACT`] for an exact key).
    res: u64,
    q0: u64,
    q1: u64,
    /// Bytes per chunk.
    bytes: u32,
    pins: u16,
    ready: bool,
    /// LFU: (reads + 1, stamp of the last use).
    rank: (u32, u64),
    prev: u32,
    next: u32,
}

impl Entry {
    fn chunks(&self) -> u64 {
        self.q1 - self.q0
    }

    /// Whether the two can be one entry: the same lane, chunk size, pins
    /// and readiness (the caller checks that their chunks adjoin).
    fn joins(&self, o: &Entry) -> bool {
        self.chain == o.chain
            && self.res == o.res
            && self.bytes == o.bytes
            && self.pins == o.pins
            && self.ready == o.ready
    }

    fn run(&self, q0: u64, q1: u64, stride: u64) -> Run {
        run_at(self.chain, self.res, q0, q1 - q0, stride)
    }
}

/// The key of the lane of chain `chain`'s chunks whose last blocks are
/// `≡ res` modulo the stride.
fn lane_key(chain: u64, res: u64) -> u64 {
    chain ^ res.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// A run's place among the chunks a store or the router's index holds:
/// its lane (a chain and a residue of its chunks' last blocks) and its
/// chunk indices `q0..q1` there.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lane {
    /// The lane's key in a hash map.
    pub key: u64,
    chain: u64,
    res: u64,
    /// Its first chunk's index in the lane.
    pub q0: u64,
    /// One past its last chunk's.
    pub q1: u64,
}

impl Lane {
    /// Run `r`'s lane and chunk range, for chunks of `stride` blocks.
    pub fn of(r: Run, stride: u64) -> Lane {
        let (res, q0) =
            if r.block == ChunkKey::EXACT { (ChunkKey::EXACT, 0) } else { (r.block % stride, r.block / stride) };
        let key = lane_key(r.chain, res);
        let n = if res == ChunkKey::EXACT { r.n.min(1) } else { r.n };
        Lane { key, chain: r.chain, res, q0, q1: q0 + n }
    }
}

/// Work a store did, counted for the benchmarks and the work-per-request
/// regression test (not a table column).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreOps {
    /// Reservations asked for (a write of a run of chunks, held or not).
    pub writes: u64,
    /// Recency refreshes (a use of a run of chunks).
    pub refreshes: u64,
    /// Device operations (reads and writes) of the instance; filled in by
    /// the connector's report.
    pub io_ops: u64,
}

impl std::ops::AddAssign for StoreOps {
    fn add_assign(&mut self, o: StoreOps) {
        self.writes += o.writes;
        self.refreshes += o.refreshes;
        self.io_ops += o.io_ops;
    }
}

/// One tier instance's index.
///
/// Eviction order: LRU and FIFO keep the entries in a doubly linked list
/// threaded through a slab (least recent at the head; a use moves chunks to
/// the tail under LRU), so insert, use and evict are O(1) per entry; LFU
/// keeps an ordered set of `(frequency, stamp, slot)`. Each lane — a chain
/// and a residue of its blocks — keeps its entries sorted by chunk index.
#[derive(Debug)]
pub struct ChunkStore {
    policy: EvictionPolicy,
    stride: u64,
    capacity: u64,
    used: u64,
    peak: u64,
    lanes: IntMap<u64, SmallVec<[u32; 2]>>,
    slab: Vec<Entry>,
    free_slots: Vec<u32>,
    head: u32,
    tail: u32,
    order: BTreeSet<(u32, u64, u32)>,
    clock: u64,
    /// Scratch: the entries an eviction gives up, and how many chunks of each.
    victims: Vec<(u32, u64)>,
    /// Scratch: the entries an operation covers.
    covered: Vec<u32>,
    /// The last two entries [`Self::exact`] found, most recent first: an
    /// admission refreshes the same shared prefix again and again, between
    /// writes completing ([`Self::exact_recent`]).
    recent: [u32; 2],
    ops: StoreOps,
}

impl ChunkStore {
    /// An empty store of `capacity` bytes for chunks of `stride` blocks.
    pub fn new(capacity: u64, policy: EvictionPolicy, stride: u64) -> ChunkStore {
        ChunkStore {
            policy,
            stride: stride.max(1),
            capacity,
            used: 0,
            peak: 0,
            lanes: IntMap::default(),
            slab: Vec::new(),
            free_slots: Vec::new(),
            head: NIL,
            tail: NIL,
            order: BTreeSet::new(),
            clock: 0,
            victims: Vec::new(),
            covered: Vec::new(),
            recent: [NIL; 2],
            ops: StoreOps::default(),
        }
    }

    /// The work done so far.
    pub fn ops(&self) -> StoreOps {
        self.ops
    }

    /// Bytes held or reserved.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Most bytes ever held or reserved.
    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Run `r`'s lane and chunk range.
    fn lane(&self, r: Run) -> Lane {
        Lane::of(r, self.stride)
    }

    /// In lane `l`'s entries: `Ok((i, e))` if entry `i` (slot `e`) covers
    /// chunk `q`, else `Err((i, before))` with the entries from `i` on all
    /// after `q` and `before` the slot of the one before them, if any.
    fn find(&self, l: &Lane, q: u64) -> Result<(usize, u32), (usize, Option<u32>)> {
        let Some(v) = self.lanes.get(&l.key) else { return Err((0, None)) };
        let i = v.partition_point(|&e| self.slab[e as usize].q0 <= q);
        match i.checked_sub(1).map(|j| v[j]) {
            Some(e) if self.slab[e as usize].q1 > q => Ok((i - 1, e)),
            before => Err((i, before)),
        }
    }

    /// [`Self::exact`], first from the entries it found last: a live entry
    /// with the lane and range asked for is the one (a lane's entries are
    /// disjoint; a dropped one has no chunks).
    fn exact_recent(&mut self, l: &Lane) -> Option<u32> {
        let is = |x: &Entry| x.q1 > x.q0 && x.q0 == l.q0 && x.q1 == l.q1 && x.chain == l.chain && x.res == l.res;
        for k in 0..2 {
            let e = self.recent[k];
            if self.slab.get(e as usize).is_some_and(is) {
                debug_assert_eq!(self.exact(l), Some(e), "a recent entry is the exact one");
                self.recent = [e, self.recent[1 - k]];
                return Some(e);
            }
        }
        let e = self.exact(l)?;
        self.recent = [e, self.recent[0]];
        Some(e)
    }

    /// The one entry holding exactly lane `l`'s chunk range, if one does.
    fn exact(&self, l: &Lane) -> Option<u32> {
        let (_, e) = self.find(l, l.q0).ok()?;
        let x = &self.slab[e as usize];
        (x.q0 == l.q0 && x.q1 == l.q1).then_some(e)
    }

    /// Of run `r`'s chunks from its first on: how many are held and
    /// readable one after another, and, when that is none, how many are
    /// not before the first that is (at most `r.n` either way).
    pub fn readable(&self, r: Run) -> (u64, u64) {
        let l = self.lane(r);
        let Some(v) = self.lanes.get(&l.key) else { return (0, l.q1 - l.q0) };
        let mut i = v.partition_point(|&e| self.slab[e as usize].q1 <= l.q0);
        let mut q = l.q0;
        // Held from q on.
        while q < l.q1 && i < v.len() {
            let e = &self.slab[v[i] as usize];
            if e.q0 > q || !e.ready {
                break;
            }
            q = e.q1;
            i += 1;
        }
        if q > l.q0 {
            return (q.min(l.q1) - l.q0, 0);
        }
        // Not held (or not readable) from q on: up to the next readable entry.
        while i < v.len() {
            let e = &self.slab[v[i] as usize];
            if e.ready {
                return (0, e.q0.max(l.q0).min(l.q1) - l.q0);
            }
            i += 1;
        }
        (0, l.q1 - l.q0)
    }

    fn unlink(&mut self, i: u32) {
        let Entry { prev, next, .. } = self.slab[i as usize];
        match prev {
            NIL => self.head = next,
            p => self.slab[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.slab[n as usize].prev = prev,
        }
    }

    fn push_tail(&mut self, i: u32) {
        self.slab[i as usize].prev = self.tail;
        self.slab[i as usize].next = NIL;
        match self.tail {
            NIL => self.head = i,
            t => self.slab[t as usize].next = i,
        }
        self.tail = i;
    }

    /// Links `f` just before `e` (on the head side).
    fn link_before(&mut self, f: u32, e: u32) {
        let p = self.slab[e as usize].prev;
        self.slab[f as usize].prev = p;
        self.slab[f as usize].next = e;
        self.slab[e as usize].prev = f;
        match p {
            NIL => self.head = f,
            p => self.slab[p as usize].next = f,
        }
    }

    fn alloc(&mut self, entry: Entry) -> u32 {
        match self.free_slots.pop() {
            Some(i) => {
                self.slab[i as usize] = entry;
                i
            }
            None => {
                self.slab.push(entry);
                (self.slab.len() - 1) as u32
            }
        }
    }

    /// Splits the entry of lane `l` covering chunk `q` (if any, and if `q`
    /// is inside it) so that an entry starts at `q`.
    fn split_at(&mut self, l: &Lane, q: u64) {
        let Ok((i, e)) = self.find(l, q) else { return };
        let entry = self.slab[e as usize];
        if entry.q0 == q {
            return;
        }
        debug_assert!(self.policy != EvictionPolicy::Lfu, "LFU entries are single chunks");
        // `f` takes the chunks from q on, nearer the head.
        let f = self.alloc(Entry { q0: q, ..entry });
        self.slab[e as usize].q1 = q;
        self.link_before(f, e);
        self.lanes.get_mut(&l.key).expect("the lane holds e").insert(i + 1, f);
    }

    /// The entries of lane `l` inside its chunk range (split to fit), from
    /// the highest chunks down, into `self.covered`.
    fn cover(&mut self, l: &Lane) {
        self.covered.clear();
        // Most operations name exactly one entry's chunks (a write completing, a hit refreshed).
        if let Some(e) = self.exact_recent(l) {
            self.covered.push(e);
            return;
        }
        if !self.lanes.contains_key(&l.key) {
            return;
        }
        self.split_at(l, l.q0);
        self.split_at(l, l.q1);
        let v = &self.lanes[&l.key];
        let from = v.partition_point(|&e| self.slab[e as usize].q0 < l.q0);
        let to = v.partition_point(|&e| self.slab[e as usize].q0 < l.q1);
        self.covered.extend(v[from..to].iter().rev());
    }

    /// Joins entry `e` with its neighbours in the list where they continue
    /// it (LRU and FIFO).
    fn merge(&mut self, e: u32) {
        if self.policy == EvictionPolicy::Lfu {
            return;
        }
        let x = self.slab[e as usize];
        let lane_key = lane_key(x.chain, x.res);
        // The head-side neighbour holds the chunks just above.
        let p = x.prev;
        if p != NIL {
            let y = self.slab[p as usize];
            if y.joins(&x) && y.q0 == x.q1 {
                self.slab[e as usize].q1 = y.q1;
                self.drop_entry(lane_key, p);
            }
        }
        let n = self.slab[e as usize].next;
        if n != NIL {
            let y = self.slab[n as usize];
            let x = self.slab[e as usize];
            if y.joins(&x) && y.q1 == x.q0 {
                self.slab[e as usize].q0 = y.q0;
                self.drop_entry(lane_key, n);
            }
        }
    }

    /// Removes entry `e` from its lane and the list and frees its slot
    /// (its chunks are now another entry's, or gone).
    fn drop_entry(&mut self, lane_key: u64, e: u32) {
        let v = self.lanes.get_mut(&lane_key).expect("an entry is in its lane");
        let at = v.iter().position(|&x| x == e).expect("an entry is in its lane");
        v.remove(at);
        if v.is_empty() {
            self.lanes.remove(&lane_key);
        }
        match self.policy {
            EvictionPolicy::Lfu => {
                let r = self.slab[e as usize].rank;
                self.order.remove(&(r.0, r.1, e));
            }
            EvictionPolicy::Lru | EvictionPolicy::Fifo => self.unlink(e),
        }
        let x = &mut self.slab[e as usize];
        (x.q0, x.q1) = (0, 0);
        self.free_slots.push(e);
    }

    /// Records a use of run `r`'s chunks (a read hit), last chunk first, as
    /// a use of each in turn: under LRU they move to the most recent end,
    /// the first chunk last; chunks not held are skipped. One refresh.
    pub fn touch(&mut self, r: Run) {
        self.ops.refreshes += 1;
        let l = self.lane(r);
        match self.policy {
            EvictionPolicy::Fifo => {}
            EvictionPolicy::Lru => {
                self.cover(&l);
                let covered = std::mem::take(&mut self.covered);
                for &e in &covered {
                    if self.tail != e {
                        self.unlink(e);
                        self.push_tail(e);
                    }
                }
                self.merge_all(&covered);
                self.covered = covered;
            }
            EvictionPolicy::Lfu => {
                self.cover(&l);
                let covered = std::mem::take(&mut self.covered);
                for &e in &covered {
                    self.clock += 1;
                    let x = &mut self.slab[e as usize];
                    let old = x.rank;
                    x.rank = (old.0.saturating_add(1), self.clock);
                    let new = x.rank;
                    self.order.remove(&(old.0, old.1, e));
                    self.order.insert((new.0, new.1, e));
                }
                self.covered = covered;
            }
        }
    }

    /// Pins run `r`'s chunks (all held) against eviction: a read is in flight.
    pub fn pin(&mut self, r: Run) {
        self.add_pins(r, 1);
    }

    /// Releases a pin of run `r`'s chunks (those still held).
    pub fn unpin(&mut self, r: Run) {
        self.add_pins(r, -1);
    }

    fn add_pins(&mut self, r: Run, d: i32) {
        let l = self.lane(r);
        self.cover(&l);
        let covered = std::mem::take(&mut self.covered);
        debug_assert!(
            d < 0 || covered.iter().map(|&e| self.slab[e as usize].chunks()).sum::<u64>() == l.q1 - l.q0,
            "pinned chunks are held"
        );
        for &e in &covered {
            let x = &mut self.slab[e as usize];
            x.pins = x.pins.checked_add_signed(d as i16).expect("pins balance");
        }
        self.merge_all(&covered);
        self.covered = covered;
    }

    /// Merges each of `entries` with its neighbours (skipping those merged
    /// away meanwhile: a dropped entry is left empty).
    fn merge_all(&mut self, entries: &[u32]) {
        for &e in entries {
            if self.slab[e as usize].q1 > self.slab[e as usize].q0 {
                self.merge(e);
            }
        }
    }

    /// Reserves `bytes` per chunk for run `r`'s chunks that are not held,
    /// as reserving each in turn, last chunk first, would: a chunk held (or
    /// being written) is left as it is; a chunk that does not fit even after
    /// evicting every evictable one is skipped. Chunks evicted for room —
    /// readable, unpinned, in policy order — are appended to `evicted` as
    /// runs with their bytes per chunk (each run's chunks go last first);
    /// the runs reserved, to `reserved`. Reserved chunks are invisible
    /// until [`Self::complete`]. One write.
    pub fn reserve(&mut self, r: Run, bytes: u64, evicted: &mut Vec<(Run, u64)>, reserved: &mut Vec<Run>) {
        self.ops.writes += 1;
        let l = self.lane(r);
        let mut q = l.q1;
        while q > l.q0 {
            match self.find(&l, q - 1) {
                Ok((_, e)) => q = self.slab[e as usize].q0.max(l.q0),
                Err((_, before)) => {
                    let lo = before.map_or(l.q0, |e| self.slab[e as usize].q1.max(l.q0));
                    let m = self.make_room(q - lo, bytes, evicted);
                    if m > 0 {
                        self.insert(&l, q - m, q, bytes);
                        reserved.push(run_at(l.chain, l.res, q - m, m, self.stride));
                    }
                    q = lo;
                }
            }
        }
    }

    /// Evicts what `n` more chunks of `bytes` need, or, if not all fit, what
    /// the most that fit need; returns how many fit.
    fn make_room(&mut self, n: u64, bytes: u64, evicted: &mut Vec<(Run, u64)>) -> u64 {
        if n == 0 || bytes > self.capacity || bytes > u64::from(u32::MAX) {
            return 0;
        }
        let over = |m: u64, freed: u64| (self.used + m * bytes).saturating_sub(self.capacity + freed);
        if over(n, 0) == 0 {
            return n;
        }
        // Candidates in policy order, taking what n chunks need.
        let mut victims = std::mem::take(&mut self.victims);
        victims.clear();
        let mut freed = 0u64;
        let mut consider = |i: u32, freed: &mut u64| -> bool {
            let e = &self.slab[i as usize];
            if e.ready && e.pins == 0 {
                let need = over(n, *freed);
                let take = e.chunks().min(need.div_ceil(u64::from(e.bytes).max(1)));
                victims.push((i, take));
                *freed += take * u64::from(e.bytes);
            }
            over(n, *freed) == 0
        };
        match self.policy {
            EvictionPolicy::Lfu => {
                for &(_, _, i) in &self.order {
                    if consider(i, &mut freed) {
                        break;
                    }
                }
            }
            EvictionPolicy::Lru | EvictionPolicy::Fifo => {
                let mut i = self.head;
                while i != NIL && !consider(i, &mut freed) {
                    i = self.slab[i as usize].next;
                }
            }
        }
        let m = if over(n, freed) == 0 {
            n
        } else {
            // Everything evictable is not enough: as many as fit, with the
            // fewest victims they need.
            ((self.capacity + freed).saturating_sub(self.used) / bytes).min(n)
        };
        // The fewest victims the m chunks need (none if they fit as it is).
        let mut need = if m == 0 { 0 } else { over(m, 0) };
        let mut keep = 0;
        for (e, take) in victims.iter_mut() {
            if need == 0 {
                break;
            }
            let b = u64::from(self.slab[*e as usize].bytes).max(1);
            *take = (*take).min(need.div_ceil(b));
            need = need.saturating_sub(*take * b);
            keep += 1;
        }
        victims.truncate(keep);
        if self.peak < self.capacity && !victims.is_empty() {
            // The most held on the way: reserving chunk by chunk, each one
            // evicts only what it needs before it is added.
            let (mut freed, mut v, mut taken) = (0u64, 0usize, 0u64);
            for i in 1..=m {
                while freed < over(i, 0) {
                    let (e, take) = victims[v];
                    freed += u64::from(self.slab[e as usize].bytes);
                    taken += 1;
                    if taken == take {
                        (v, taken) = (v + 1, 0);
                    }
                }
                self.peak = self.peak.max(self.used + i * bytes - freed);
            }
        }
        for &(e, take) in &victims {
            let x = self.slab[e as usize];
            let run = x.run(x.q1 - take, x.q1, self.stride);
            evicted.push((run, u64::from(x.bytes)));
            self.used -= take * u64::from(x.bytes);
            if take == x.chunks() {
                self.drop_entry(lane_key(x.chain, x.res), e);
            } else {
                self.slab[e as usize].q1 -= take;
            }
        }
        self.victims = victims;
        m
    }

    /// A new, unreadable entry for chunks `q0..q1` of lane `l` at the most
    /// recent end (under LFU one entry per chunk, the last first).
    fn insert(&mut self, l: &Lane, q0: u64, q1: u64, bytes: u64) {
        let blank = Entry {
            chain: l.chain,
            res: l.res,
            q0,
            q1,
            bytes: bytes as u32,
            pins: 0,
            ready: false,
            rank: (1, 0),
            prev: NIL,
            next: NIL,
        };
        let pieces: SmallVec<[(u64, u64); 1]> = if self.policy == EvictionPolicy::Lfu {
            (q0..q1).rev().map(|q| (q, q + 1)).collect()
        } else {
            smallvec::smallvec![(q0, q1)]
        };
        for (a, b) in pieces {
            self.clock += 1;
            let e = self.alloc(Entry { q0: a, q1: b, rank: (1, self.clock), ..blank });
            let v = self.lanes.entry(l.key).or_default();
            let at = v.partition_point(|&x| self.slab[x as usize].q0 < a);
            v.insert(at, e);
            match self.policy {
                EvictionPolicy::Lfu => {
                    self.order.insert((1, self.clock, e));
                }
                EvictionPolicy::Lru | EvictionPolicy::Fifo => {
                    self.push_tail(e);
                    self.merge(e);
                }
            }
        }
        self.used += (q1 - q0) * bytes;
        self.peak = self.peak.max(self.used);
        debug_assert!(self.used <= self.capacity, "a store holds more than its capacity");
    }

    /// The writes of run `r`'s chunks finished: those reserved become
    /// readable, and are appended to `done` as runs (highest chunks first).
    pub fn complete(&mut self, r: Run, done: &mut Vec<Run>) {
        let l = self.lane(r);
        self.cover(&l);
        let covered = std::mem::take(&mut self.covered);
        for &e in &covered {
            let x = &mut self.slab[e as usize];
            if !x.ready {
                x.ready = true;
                let x = *x;
                done.push(x.run(x.q0, x.q1, self.stride));
            }
        }
        self.merge_all(&covered);
        self.covered = covered;
    }
}

/// The run of chunks `q0..q0 + n` of chain `chain`'s lane `res`.
fn run_at(chain: u64, res: u64, q0: u64, n: u64, stride: u64) -> Run {
    let block = if res == ChunkKey::EXACT { ChunkKey::EXACT } else { q0 * stride + res };
    Run { chain, block, n }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oracle::Reserve;

    /// The store of single chunks this one replaced, kept as the reference
    /// the runs are checked against: one entry per chunk, the same rules.
    mod oracle {
        #![allow(dead_code)]
        use super::super::{ChunkKey, EvictionPolicy, StoreOps};
        use crate::kvcache::BlockHash;
        use nohash_hasher::IntMap;
        use std::collections::BTreeSet;

        /// The outcome of reserving space for a chunk.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Reserve {
            /// The chunk is already held (or being written); nothing to write, and its recency is unchanged.
            Present,
            /// Space is reserved (chunks evicted for it were appended to the caller's list).
            Reserved,
            /// There is no room even after evicting everything evictable.
            NoRoom,
        }

        const NIL: u32 = u32::MAX;

        /// One chunk, in a slab slot, linked into the recency list (LRU and FIFO).
        #[derive(Clone, Copy, Debug)]
        struct Entry {
            /// The chunk's key as (chain, block) — its hash is recomputed when it
            /// goes, which keeps the entry small.
            chain: u64,
            block: u64,
            bytes: u32,
            pins: u16,
            ready: bool,
            /// LFU: (reads + 1, stamp of the last use).
            rank: (u32, u64),
            prev: u32,
            next: u32,
        }

        /// One tier instance's index.
        ///
        /// Eviction order: LRU and FIFO keep the chunks in a doubly linked list
        /// threaded through a slab (least recent at the head; a use moves a chunk to
        /// the tail under LRU), so insert, use and evict are O(1); LFU keeps an
        /// ordered set of `(frequency, stamp, slot)`.
        #[derive(Debug)]
        pub(super) struct Chunks {
            policy: EvictionPolicy,
            capacity: u64,
            used: u64,
            peak: u64,
            map: IntMap<BlockHash, u32>,
            slab: Vec<Entry>,
            free_slots: Vec<u32>,
            head: u32,
            tail: u32,
            order: BTreeSet<(u32, u64, u32)>,
            clock: u64,
            /// Scratch: the slots an eviction gives up.
            victims: Vec<u32>,
            ops: StoreOps,
        }

        impl Chunks {
            /// An empty store of `capacity` bytes.
            pub fn new(capacity: u64, policy: EvictionPolicy) -> Chunks {
                Chunks {
                    policy,
                    capacity,
                    used: 0,
                    peak: 0,
                    map: IntMap::default(),
                    slab: Vec::new(),
                    free_slots: Vec::new(),
                    head: NIL,
                    tail: NIL,
                    order: BTreeSet::new(),
                    clock: 0,
                    victims: Vec::new(),
                    ops: StoreOps::default(),
                }
            }

            /// The work done so far.
            pub fn ops(&self) -> StoreOps {
                self.ops
            }

            /// Bytes held or reserved.
            pub fn used(&self) -> u64 {
                self.used
            }

            /// Most bytes ever held or reserved.
            pub fn peak(&self) -> u64 {
                self.peak
            }

            /// Capacity in bytes.
            pub fn capacity(&self) -> u64 {
                self.capacity
            }

            /// Whether `key` is held and readable.
            pub fn contains(&self, key: ChunkKey) -> bool {
                self.map.get(&key.hash()).is_some_and(|&i| self.slab[i as usize].ready)
            }

            fn unlink(&mut self, i: u32) {
                let Entry { prev, next, .. } = self.slab[i as usize];
                match prev {
                    NIL => self.head = next,
                    p => self.slab[p as usize].next = next,
                }
                match next {
                    NIL => self.tail = prev,
                    n => self.slab[n as usize].prev = prev,
                }
            }

            fn push_tail(&mut self, i: u32) {
                self.slab[i as usize].prev = self.tail;
                self.slab[i as usize].next = NIL;
                match self.tail {
                    NIL => self.head = i,
                    t => self.slab[t as usize].next = i,
                }
                self.tail = i;
            }

            /// Records a use of `key` (a read hit, or a write of a chunk already held).
            pub fn touch(&mut self, key: ChunkKey) {
                self.ops.refreshes += 1;
                let Some(&i) = self.map.get(&key.hash()) else { return };
                match self.policy {
                    EvictionPolicy::Fifo => {}
                    EvictionPolicy::Lru => {
                        if self.tail != i {
                            self.unlink(i);
                            self.push_tail(i);
                        }
                    }
                    EvictionPolicy::Lfu => {
                        self.clock += 1;
                        let e = &mut self.slab[i as usize];
                        let old = e.rank;
                        e.rank = (old.0.saturating_add(1), self.clock);
                        let new = e.rank;
                        self.order.remove(&(old.0, old.1, i));
                        self.order.insert((new.0, new.1, i));
                    }
                }
            }

            /// Records a use of `keys`, in order (the last becomes the most
            /// recent) — the same order as [`Self::touch`] of each in turn. Under LRU
            /// a run of them already consecutive in the recency list (as a prefix
            /// written or refreshed together is) is moved to the recent end in one
            /// splice, and counts as one refresh; keys not held are skipped.
            pub fn touch_all(&mut self, keys: impl Iterator<Item = ChunkKey>) {
                if self.policy != EvictionPolicy::Lru {
                    keys.for_each(|k| self.touch(k));
                    return;
                }
                // The run being gathered: `first..=last`, consecutive in the list.
                let mut run: Option<(u32, u32)> = None;
                for key in keys {
                    let Some(&i) = self.map.get(&key.hash()) else { continue };
                    run = match run {
                        Some((first, last)) if self.slab[last as usize].next == i => Some((first, i)),
                        Some((first, last)) => {
                            self.move_to_tail(first, last);
                            Some((i, i))
                        }
                        None => Some((i, i)),
                    };
                }
                if let Some((first, last)) = run {
                    self.move_to_tail(first, last);
                }
            }

            /// Moves the consecutive entries `first..=last` of the recency list to
            /// its tail (one refresh).
            fn move_to_tail(&mut self, first: u32, last: u32) {
                self.ops.refreshes += 1;
                if self.tail == last {
                    return;
                }
                let (prev, next) = (self.slab[first as usize].prev, self.slab[last as usize].next);
                match prev {
                    NIL => self.head = next,
                    p => self.slab[p as usize].next = next,
                }
                // `last` is not the tail, so `next` is an entry.
                self.slab[next as usize].prev = prev;
                self.slab[self.tail as usize].next = first;
                self.slab[first as usize].prev = self.tail;
                self.slab[last as usize].next = NIL;
                self.tail = last;
            }

            /// Pins `key` against eviction (a read is in flight).
            pub fn pin(&mut self, key: ChunkKey) {
                let i = *self.map.get(&key.hash()).expect("pinned chunk is held");
                self.slab[i as usize].pins += 1;
            }

            /// Releases a pin.
            pub fn unpin(&mut self, key: ChunkKey) {
                if let Some(&i) = self.map.get(&key.hash()) {
                    self.slab[i as usize].pins -= 1;
                }
            }

            /// Reserves `bytes` for `key`, evicting unpinned, readable chunks in
            /// policy order if needed (appended to `evicted` as `(key, bytes)`). The
            /// chunk is invisible until [`Self::complete`].
            pub fn reserve(&mut self, key: ChunkKey, bytes: u64, evicted: &mut Vec<(ChunkKey, u64)>) -> Reserve {
                self.ops.writes += 1;
                let hash = key.hash();
                if self.map.contains_key(&hash) {
                    // LMCache's put of a key it holds changes nothing, recency included.
                    return Reserve::Present;
                }
                if bytes > self.capacity || bytes > u64::from(u32::MAX) {
                    return Reserve::NoRoom;
                }
                if self.used + bytes > self.capacity && !self.evict_for(bytes, evicted) {
                    return Reserve::NoRoom;
                }
                self.clock += 1;
                let entry = Entry {
                    chain: key.chain,
                    block: key.block,
                    bytes: bytes as u32,
                    pins: 0,
                    ready: false,
                    rank: (1, self.clock),
                    prev: NIL,
                    next: NIL,
                };
                let i = match self.free_slots.pop() {
                    Some(i) => {
                        self.slab[i as usize] = entry;
                        i
                    }
                    None => {
                        self.slab.push(entry);
                        (self.slab.len() - 1) as u32
                    }
                };
                self.map.insert(hash, i);
                match self.policy {
                    EvictionPolicy::Lfu => {
                        self.order.insert((1, self.clock, i));
                    }
                    EvictionPolicy::Lru | EvictionPolicy::Fifo => self.push_tail(i),
                }
                self.used += bytes;
                self.peak = self.peak.max(self.used);
                debug_assert!(self.used <= self.capacity, "a store holds more than its capacity");
                Reserve::Reserved
            }

            /// Evicts readable, unpinned chunks in policy order until `bytes` fit;
            /// false (and nothing evicted) if they cannot.
            fn evict_for(&mut self, bytes: u64, evicted: &mut Vec<(ChunkKey, u64)>) -> bool {
                let first = evicted.len();
                let mut victims = std::mem::take(&mut self.victims);
                victims.clear();
                let mut freeable = 0;
                let fits = |freeable: u64| self.used - freeable + bytes <= self.capacity;
                let mut consider = |i: u32, freeable: &mut u64| {
                    let e = &self.slab[i as usize];
                    if e.ready && e.pins == 0 {
                        victims.push(i);
                        *freeable += u64::from(e.bytes);
                    }
                };
                match self.policy {
                    EvictionPolicy::Lfu => {
                        for &(_, _, i) in &self.order {
                            consider(i, &mut freeable);
                            if fits(freeable) {
                                break;
                            }
                        }
                    }
                    EvictionPolicy::Lru | EvictionPolicy::Fifo => {
                        let mut i = self.head;
                        while i != NIL && !fits(freeable) {
                            consider(i, &mut freeable);
                            i = self.slab[i as usize].next;
                        }
                    }
                }
                if !fits(freeable) {
                    self.victims = victims;
                    return false;
                }
                for &i in &victims {
                    let e = self.slab[i as usize];
                    match self.policy {
                        EvictionPolicy::Lfu => {
                            self.order.remove(&(e.rank.0, e.rank.1, i));
                        }
                        EvictionPolicy::Lru | EvictionPolicy::Fifo => self.unlink(i),
                    }
                    let key = ChunkKey::from_parts(e.chain, e.block);
                    self.map.remove(&key.hash());
                    self.free_slots.push(i);
                    self.used -= u64::from(e.bytes);
                    evicted.push((key, u64::from(e.bytes)));
                }
                self.victims = victims;
                debug_assert!(evicted.len() > first || bytes == 0 || self.used + bytes <= self.capacity);
                true
            }

            /// The write of `key` finished: it becomes readable. Returns false if it
            /// was not reserved.
            pub fn complete(&mut self, key: ChunkKey) -> bool {
                match self.map.get(&key.hash()) {
                    Some(&i) if !self.slab[i as usize].ready => {
                        self.slab[i as usize].ready = true;
                        true
                    }
                    _ => false,
                }
            }
        }

        impl Chunks {
            /// Whether `key` is held, readable or not.
            pub fn held(&self, key: ChunkKey) -> bool {
                self.map.contains_key(&key.hash())
            }

            /// Keys from the least recent on (LRU, FIFO) or in eviction order (LFU).
            pub fn keys(&self) -> Vec<ChunkKey> {
                let key = |e: &Entry| ChunkKey::from_parts(e.chain, e.block);
                match self.policy {
                    EvictionPolicy::Lfu => self.order.iter().map(|&(_, _, i)| key(&self.slab[i as usize])).collect(),
                    _ => {
                        let mut out = Vec::new();
                        let mut i = self.head;
                        while i != NIL {
                            out.push(key(&self.slab[i as usize]));
                            i = self.slab[i as usize].next;
                        }
                        out
                    }
                }
            }
        }
    }

    impl ChunkStore {
        /// Whether `key` is held and readable.
        fn contains(&self, key: ChunkKey) -> bool {
            self.readable(Run::one(key)).0 == 1
        }

        /// Keys from the least recent on (LRU, FIFO) or in eviction order (LFU).
        fn keys(&self) -> Vec<ChunkKey> {
            let slots: Vec<u32> = match self.policy {
                EvictionPolicy::Lfu => self.order.iter().map(|&(_, _, i)| i).collect(),
                _ => {
                    let mut out = Vec::new();
                    let mut i = self.head;
                    while i != NIL {
                        out.push(i);
                        i = self.slab[i as usize].next;
                    }
                    out
                }
            };
            slots
                .iter()
                .flat_map(|&i| {
                    expand(
                        self.slab[i as usize].run(self.slab[i as usize].q0, self.slab[i as usize].q1, self.stride),
                        self.stride,
                    )
                })
                .collect()
        }
    }

    /// A run's chunks, last first.
    fn expand(r: Run, stride: u64) -> Vec<ChunkKey> {
        (0..r.n).rev().map(|i| r.key(i, stride)).collect()
    }

    #[test]
    fn runs_keep_exactly_the_order_and_contents_of_single_chunks() {
        use rand::RngExt;
        let mut rng = crate::rng::SeedTree::new(11).stream("runs");
        let policies = [EvictionPolicy::Lru, EvictionPolicy::Fifo, EvictionPolicy::Lfu];
        let (mut evictions, mut merges) = (0, 0);
        for case in 0..3_000 {
            let policy = policies[case % 3];
            let stride: u64 = [1, 2, 4][rng.random_range(0..3)];
            let full = 10 * stride;
            let cap = rng.random_range(0..16) * full + rng.random_range(0..3) * stride;
            let mut a = ChunkStore::new(cap, policy, stride);
            let mut b = oracle::Chunks::new(cap, policy);
            let (mut reserved, mut pinned) = (Vec::new(), Vec::new());
            let universe: Vec<ChunkKey> = (100..103)
                .flat_map(|c| (0..10 * stride).map(move |k| ChunkKey::new(c, k)))
                .chain((1100..1103).map(|c| ChunkKey::exact(crate::kvcache::BlockHash(c))))
                .collect();
            for step in 0..40 {
                let chain = rng.random_range(0..3u64) + 100;
                let kind = rng.random_range(0..10);
                let (run, bytes) = if kind < 8 || stride == 1 && kind < 9 {
                    let q0 = rng.random_range(0..8);
                    (Run { chain, block: q0 * stride + stride - 1, n: rng.random_range(1..6) }, full)
                } else if kind < 9 {
                    let q = rng.random_range(0..8);
                    (Run { chain, block: q * stride + rng.random_range(0..stride - 1), n: 1 }, full / 2)
                } else {
                    (Run { chain: chain + 1000, block: ChunkKey::EXACT, n: 1 }, 3)
                };
                let keys = expand(run, stride);
                let what = format!("case {case} step {step}: {policy:?} stride {stride} cap {cap} {run:?}");
                match rng.random_range(0..5) {
                    0 | 1 => {
                        let (mut ev, mut res, mut ev_b, mut res_b) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                        a.reserve(run, bytes, &mut ev, &mut res);
                        for &k in &keys {
                            if b.reserve(k, bytes, &mut ev_b) == Reserve::Reserved {
                                res_b.push(k);
                            }
                        }
                        let ev_a: Vec<(ChunkKey, u64)> = ev
                            .iter()
                            .flat_map(|&(r, by)| expand(r, stride).into_iter().map(move |k| (k, by)))
                            .collect();
                        assert_eq!(ev_a, ev_b, "evicted, {what}");
                        evictions += ev_b.len();
                        let res_a: Vec<ChunkKey> = res.iter().flat_map(|&r| expand(r, stride)).collect();
                        assert_eq!(res_a, res_b, "reserved, {what}");
                        reserved.extend(res);
                    }
                    2 => {
                        a.touch(run);
                        b.touch_all(keys.iter().copied());
                    }
                    3 if !reserved.is_empty() => {
                        let r = reserved.swap_remove(rng.random_range(0..reserved.len()));
                        let mut done = Vec::new();
                        a.complete(r, &mut done);
                        let done_a: Vec<ChunkKey> = done.iter().flat_map(|&d| expand(d, stride)).collect();
                        let done_b: Vec<ChunkKey> = expand(r, stride).into_iter().filter(|&k| b.complete(k)).collect();
                        assert_eq!(done_a, done_b, "completed, {what}");
                    }
                    _ => {
                        if rng.random_bool(0.5) && keys.iter().all(|&k| b.held(k)) {
                            a.pin(run);
                            keys.iter().for_each(|&k| b.pin(k));
                            pinned.push(run);
                        } else if let Some(r) = pinned.pop() {
                            a.unpin(r);
                            expand(r, stride).into_iter().for_each(|k| b.unpin(k));
                        }
                    }
                }
                assert_eq!(a.keys(), b.keys(), "order, {what}");
                assert_eq!((a.used(), a.peak()), (b.used(), b.peak()), "{what}");
                for &k in &universe {
                    assert_eq!(a.contains(k), b.contains(k), "{k:?}, {what}");
                }
                let entries = a.slab.len() - a.free_slots.len();
                merges += b.keys().len().saturating_sub(entries);
            }
        }
        assert!(evictions > 10_000 && merges > 10_000, "the cases evict ({evictions}) and hold runs ({merges})");
    }

    #[test]
    fn readable_counts_the_held_run_or_the_gap_before_one() {
        let mut s = ChunkStore::new(1 << 20, EvictionPolicy::Lru, 2);
        let run = |block, n| Run { chain: 5, block, n };
        let (mut ev, mut res, mut done) = (Vec::new(), Vec::new(), Vec::new());
        // Chunks 2..5 (blocks 5, 7, 9) written and completed; chunk 6 (block 13) written, not complete.
        s.reserve(run(5, 3), 10, &mut ev, &mut res);
        s.complete(run(5, 3), &mut done);
        s.reserve(run(13, 1), 10, &mut ev, &mut res);
        assert_eq!(s.readable(run(5, 3)), (3, 0));
        assert_eq!(s.readable(run(7, 10)), (2, 0), "from chunk 3: chunks 3, 4");
        assert_eq!(s.readable(run(1, 10)), (0, 2), "chunks 0, 1 missing, then chunk 2");
        assert_eq!(s.readable(run(11, 3)), (0, 3), "chunk 5 missing, 6 not readable, 7 missing");
        assert_eq!(s.readable(run(1, 1)), (0, 1));
        assert_eq!(done, [run(5, 3)]);
        assert_eq!(s.slab.len() - s.free_slots.len(), 2, "one entry per run");
    }
}
