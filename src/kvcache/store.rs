//! A tier's chunk index: which chunks a CPU memory, NVMe or distributed file
//! system store holds, its capacity, and its eviction order.
//!
//! Chunks are written with space reserved first (they become visible to
//! lookups only when the write completes) and can be pinned while a read is
//! in flight; neither in-flight nor pinned chunks are evicted, so a fetch is
//! never counted as a hit for data evicted between lookup and read.

use super::BlockHash;
use nohash_hasher::IntMap;
use std::collections::hash_map::Entry as MapEntry;
use std::collections::{BTreeSet, VecDeque};

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

/// Kept small: a store may index millions of chunks.
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// (frequency, stamp): only LFU uses the frequency.
    rank: (u32, u64),
    bytes: u32,
    pins: u16,
    ready: bool,
}

/// The outcome of reserving space for a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserve {
    /// The chunk is already held (or being written); nothing to write.
    Present,
    /// Space is reserved (chunks evicted for it were appended to the caller's list).
    Reserved,
    /// There is no room even after evicting everything evictable.
    NoRoom,
}

/// One tier instance's index.
///
/// Eviction order: LRU and FIFO keep a queue of `(stamp, key)` records in
/// which a re-used chunk is pushed again and its older records go stale
/// (skipped, and compacted away); LFU keeps an ordered set of
/// `(frequency, stamp, key)`.
#[derive(Debug)]
pub struct ChunkStore {
    policy: EvictionPolicy,
    capacity: u64,
    used: u64,
    peak: u64,
    map: IntMap<BlockHash, Entry>,
    order: BTreeSet<(u32, u64, BlockHash)>,
    queue: VecDeque<(u64, BlockHash)>,
    clock: u64,
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
            order: BTreeSet::new(),
            queue: VecDeque::new(),
            clock: 0,
        }
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
    pub fn contains(&self, key: BlockHash) -> bool {
        self.map.get(&key).is_some_and(|e| e.ready)
    }

    fn is_current(&self, stamp: u64, key: BlockHash) -> bool {
        self.map.get(&key).is_some_and(|e| e.rank.1 == stamp)
    }

    /// Records a read hit on `key` (recency / frequency).
    pub fn touch(&mut self, key: BlockHash) {
        if self.policy == EvictionPolicy::Fifo {
            return;
        }
        self.clock += 1;
        let t = self.clock;
        let Some(e) = self.map.get_mut(&key) else { return };
        let old = e.rank;
        e.rank = (old.0.saturating_add(u32::from(self.policy == EvictionPolicy::Lfu)), t);
        let new = e.rank;
        if self.policy == EvictionPolicy::Lfu {
            self.order.remove(&(old.0, old.1, key));
            self.order.insert((new.0, new.1, key));
        } else {
            self.queue.push_back((t, key));
            if self.queue.len() > 2 * self.map.len() + 64 {
                let map = &self.map;
                self.queue.retain(|&(s, k)| map.get(&k).is_some_and(|e| e.rank.1 == s));
            }
        }
    }

    /// Pins `key` against eviction (a read is in flight).
    pub fn pin(&mut self, key: BlockHash) {
        self.map.get_mut(&key).expect("pinned chunk is held").pins += 1;
    }

    /// Releases a pin.
    pub fn unpin(&mut self, key: BlockHash) {
        if let Some(e) = self.map.get_mut(&key) {
            e.pins -= 1;
        }
    }

    /// Reserves `bytes` for `key`, evicting unpinned, readable chunks in
    /// policy order if needed (appended to `evicted` as `(key, bytes)`). The
    /// chunk is invisible until [`Self::complete`].
    pub fn reserve(&mut self, key: BlockHash, bytes: u64, evicted: &mut Vec<(BlockHash, u64)>) -> Reserve {
        if bytes > self.capacity || bytes > u64::from(u32::MAX) {
            return if self.map.contains_key(&key) { Reserve::Present } else { Reserve::NoRoom };
        }
        if self.used + bytes > self.capacity {
            if self.map.contains_key(&key) {
                self.touch(key);
                return Reserve::Present;
            }
            if !self.evict_for(bytes, evicted) {
                return Reserve::NoRoom;
            }
        }
        let rank = (u32::from(self.policy == EvictionPolicy::Lfu), self.clock + 1);
        match self.map.entry(key) {
            MapEntry::Occupied(_) => {
                self.touch(key);
                return Reserve::Present;
            }
            MapEntry::Vacant(v) => {
                v.insert(Entry { rank, bytes: bytes as u32, pins: 0, ready: false });
            }
        }
        self.clock = rank.1;
        match self.policy {
            EvictionPolicy::Lfu => {
                self.order.insert((rank.0, rank.1, key));
            }
            EvictionPolicy::Lru | EvictionPolicy::Fifo => self.queue.push_back((rank.1, key)),
        }
        self.used += bytes;
        self.peak = self.peak.max(self.used);
        debug_assert!(self.used <= self.capacity, "a store holds more than its capacity");
        Reserve::Reserved
    }

    /// Evicts readable, unpinned chunks in policy order until `bytes` fit;
    /// false (and nothing evicted) if they cannot.
    fn evict_for(&mut self, bytes: u64, evicted: &mut Vec<(BlockHash, u64)>) -> bool {
        let first = evicted.len();
        let mut freeable = 0;
        let mut choose = |k: BlockHash, e: &Entry| {
            if e.ready && e.pins == 0 {
                evicted.push((k, u64::from(e.bytes)));
                freeable += u64::from(e.bytes);
            }
            self.used - freeable + bytes <= self.capacity
        };
        let enough = match self.policy {
            EvictionPolicy::Lfu => self.order.iter().any(|&(_, _, k)| choose(k, &self.map[&k])),
            EvictionPolicy::Lru | EvictionPolicy::Fifo => self
                .queue
                .iter()
                .filter(|&&(s, k)| self.map.get(&k).is_some_and(|e| e.rank.1 == s))
                .any(|&(_, k)| choose(k, &self.map[&k])),
        };
        if !enough {
            evicted.truncate(first);
            return false;
        }
        for &(k, _) in &evicted[first..] {
            let e = self.map.remove(&k).expect("victim is held");
            if self.policy == EvictionPolicy::Lfu {
                self.order.remove(&(e.rank.0, e.rank.1, k));
            }
            self.used -= u64::from(e.bytes);
        }
        // Drop the stale records the victims left at the front.
        while let Some(&(s, k)) = self.queue.front() {
            if self.is_current(s, k) {
                break;
            }
            self.queue.pop_front();
        }
        true
    }

    /// The write of `key` finished: it becomes readable. Returns false if it
    /// was not reserved.
    pub fn complete(&mut self, key: BlockHash) -> bool {
        match self.map.get_mut(&key) {
            Some(e) if !e.ready => {
                e.ready = true;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(x: u64) -> BlockHash {
        BlockHash(x)
    }

    /// Reserves and returns the outcome with the evicted chunks.
    fn reserve(s: &mut ChunkStore, x: u64, bytes: u64) -> (Reserve, Vec<(BlockHash, u64)>) {
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
    fn repeated_touches_keep_the_lru_queue_compact() {
        let mut s = filled(EvictionPolicy::Lru);
        for _ in 0..10_000 {
            s.touch(k(2));
        }
        assert!(s.queue.len() <= 2 * 3 + 64 + 1, "stale records are compacted: {}", s.queue.len());
        assert_eq!(reserve(&mut s, 4, 10), (Reserve::Reserved, vec![(k(1), 10)]));
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
