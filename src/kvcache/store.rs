//! A tier's chunk index: which chunks a CPU memory, NVMe or distributed file
//! system store holds, its capacity, and its eviction order.
//!
//! Chunks are written with space reserved first (they become visible to
//! lookups only when the write completes) and can be pinned while a read is
//! in flight; neither in-flight nor pinned chunks are evicted, so a fetch is
//! never counted as a hit for data evicted between lookup and read.

use super::{BlockHash, ChunkKey};
use nohash_hasher::IntMap;
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

/// Work a store did, counted for the benchmarks and the work-per-request
/// regression test (not a table column).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreOps {
    /// Reservations asked for (a write of a chunk, held or not).
    pub writes: u64,
    /// Recency refreshes (a use of a held chunk).
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
/// Eviction order: LRU and FIFO keep the chunks in a doubly linked list
/// threaded through a slab (least recent at the head; a use moves a chunk to
/// the tail under LRU), so insert, use and evict are O(1); LFU keeps an
/// ordered set of `(frequency, stamp, slot)`.
#[derive(Debug)]
pub struct ChunkStore {
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

impl ChunkStore {
    /// An empty store of `capacity` bytes.
    pub fn new(capacity: u64, policy: EvictionPolicy) -> ChunkStore {
        ChunkStore {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn k(x: u64) -> ChunkKey {
        ChunkKey::new(x, 0)
    }

    /// Reserves and returns the outcome with the evicted chunks.
    fn reserve(s: &mut ChunkStore, x: u64, bytes: u64) -> (Reserve, Vec<(ChunkKey, u64)>) {
        let mut ev = Vec::new();
        let r = s.reserve(k(x), bytes, &mut ev);
        (r, ev)
    }

    fn filled(policy: EvictionPolicy) -> ChunkStore {
        // Capacity for three 10-byte chunks, written 1, 2, 3.
        let mut s = ChunkStore::new(30, policy);
        for x in 1..=3 {
            assert_eq!(reserve(&mut s, x, 10), (Reserve::Reserved, vec![]));
            assert!(s.complete(k(x)));
        }
        s
    }

    #[test]
    fn lru_evicts_the_least_recently_used() {
        let mut s = filled(EvictionPolicy::Lru);
        s.touch(k(1));
        assert_eq!(reserve(&mut s, 4, 10), (Reserve::Reserved, vec![(k(2), 10)]));
        assert!(!s.contains(k(4)), "invisible until written");
        s.complete(k(4));
        assert!(s.contains(k(4)) && s.contains(k(1)) && !s.contains(k(2)));
        assert_eq!((s.used(), s.peak()), (30, 30));
    }

    /// The keys from head (least recent) to tail.
    fn order(s: &ChunkStore) -> Vec<u64> {
        let mut out = Vec::new();
        let mut i = s.head;
        while i != NIL {
            out.push(s.slab[i as usize].chain);
            i = s.slab[i as usize].next;
        }
        out
    }

    #[test]
    fn touching_many_orders_as_touching_each_and_counts_runs_of_neighbours() {
        use rand::RngExt;
        let mut rng = crate::rng::SeedTree::new(7).stream("store");
        for case in 0..2_000 {
            let n: u64 = rng.random_range(1..12);
            let mut a = ChunkStore::new(1 << 20, EvictionPolicy::Lru);
            for x in 0..n {
                reserve(&mut a, x, 1);
            }
            // Some touches first, so the list is not in written order.
            for _ in 0..rng.random_range(0..6) {
                a.touch(k(rng.random_range(0..n)));
            }
            let mut b = ChunkStore::new(1 << 20, EvictionPolicy::Lru);
            for x in order(&a) {
                reserve(&mut b, x, 1);
            }
            // Keys not held (n, n + 1) are skipped; repeats are allowed.
            let keys: Vec<u64> = (0..rng.random_range(0..2 * n)).map(|_| rng.random_range(0..n + 2)).collect();
            // The expected runs, by a list kept as a vector: a key continues
            // the run when it follows the run's last key in the list as it
            // was when the run began (nothing in it has moved yet).
            let (mut list, mut at_start, mut runs, mut prev) = (order(&b), Vec::new(), 0, None);
            for &x in keys.iter().filter(|&&x| x < n) {
                let follows = prev.is_some_and(|p| {
                    at_start.iter().position(|&y| y == p).and_then(|i| at_start.get(i + 1)) == Some(&x)
                });
                if !follows {
                    runs += 1;
                    at_start = list.clone();
                }
                list.retain(|&y| y != x);
                list.push(x);
                prev = Some(x);
            }
            for &x in &keys {
                a.touch(k(x));
            }
            let before = b.ops().refreshes;
            b.touch_all(keys.iter().map(|&x| k(x)));
            assert_eq!(order(&a), order(&b), "case {case}: {keys:?}");
            assert_eq!(order(&b), list, "case {case}");
            assert_eq!(b.ops().refreshes - before, runs, "case {case}: {keys:?}");
        }
    }

    #[test]
    fn a_run_written_together_is_refreshed_in_one_splice() {
        // Written 1..=5 (head 1); refreshing 4, 3, 2 (neighbours, in list
        // order) and then 1 (before 2 in the list, not after it): 2 refreshes.
        let mut s = ChunkStore::new(100, EvictionPolicy::Lru);
        for x in 1..=5 {
            reserve(&mut s, x, 1);
        }
        s.touch_all([2, 3, 4, 1].into_iter().map(k));
        assert_eq!(order(&s), [5, 2, 3, 4, 1]);
        assert_eq!(s.ops().refreshes, 2);
        // The run 2, 3, 4 is still consecutive: one splice brings it to the tail.
        s.touch_all([2, 3, 4, 9].into_iter().map(k));
        assert_eq!(order(&s), [5, 1, 2, 3, 4]);
        assert_eq!(s.ops().refreshes, 3);
        // Already at the tail: a refresh, nothing moves.
        s.touch_all([3, 4].into_iter().map(k));
        assert_eq!(order(&s), [5, 1, 2, 3, 4]);
        assert_eq!(s.ops().refreshes, 4);
    }

    #[test]
    fn fifo_ignores_reads() {
        let mut s = filled(EvictionPolicy::Fifo);
        s.touch(k(1));
        assert_eq!(reserve(&mut s, 4, 10), (Reserve::Reserved, vec![(k(1), 10)]));
    }

    #[test]
    fn lfu_evicts_the_least_read_with_lru_ties() {
        let mut s = filled(EvictionPolicy::Lfu);
        s.touch(k(1));
        s.touch(k(1));
        s.touch(k(3));
        // Frequencies: 1 → 3, 2 → 1, 3 → 2.
        assert_eq!(reserve(&mut s, 4, 10), (Reserve::Reserved, vec![(k(2), 10)]));
    }

    #[test]
    fn repeated_touches_keep_one_entry_per_chunk() {
        let mut s = filled(EvictionPolicy::Lru);
        for _ in 0..10_000 {
            s.touch(k(2));
        }
        assert_eq!((s.slab.len(), s.map.len()), (3, 3), "a use moves a chunk, it adds nothing");
        assert_eq!(reserve(&mut s, 4, 10), (Reserve::Reserved, vec![(k(1), 10)]));
        assert_eq!(s.slab.len(), 3, "the victim's slot is reused");
    }

    #[test]
    fn pinned_and_in_flight_chunks_are_never_evicted() {
        let mut s = filled(EvictionPolicy::Lru);
        s.pin(k(1));
        s.pin(k(2));
        assert_eq!(reserve(&mut s, 4, 20).0, Reserve::NoRoom, "only chunk 3 is evictable");
        assert!(s.contains(k(3)), "a failed reservation evicts nothing");
        assert_eq!(reserve(&mut s, 4, 10), (Reserve::Reserved, vec![(k(3), 10)]));
        assert_eq!(reserve(&mut s, 5, 10).0, Reserve::NoRoom, "chunk 4 is still being written");
        s.unpin(k(1));
        assert_eq!(reserve(&mut s, 5, 10), (Reserve::Reserved, vec![(k(1), 10)]));
        assert!(s.used() <= s.capacity());
        assert_eq!(reserve(&mut s, 2, 10).0, Reserve::Present);
        assert_eq!(reserve(&mut s, 6, 31).0, Reserve::NoRoom);
    }
}
