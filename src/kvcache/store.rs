//! A tier's chunk index: which chunks a CPU memory, NVMe or distributed file
//! system store holds, its capacity, and its eviction order.
//!
//! Chunks are written with space reserved first (they become visible to
//! lookups only when the write completes) and can be pinned while a read is
//! in flight; neither in-flight nor pinned chunks are evicted, so a fetch is
//! never counted as a hit for data evicted between lookup and read.

use super::BlockHash;
use nohash_hasher::IntMap;
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

#[derive(Clone, Copy, Debug)]
struct Entry {
    bytes: u64,
    ready: bool,
    pins: u32,
    rank: (u64, u64),
}

/// The outcome of reserving space for a chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reserve {
    /// The chunk is already held (or being written); nothing to write.
    Present,
    /// Space is reserved; these chunks (key, bytes) were evicted for it.
    Reserved(Vec<(BlockHash, u64)>),
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
    map: IntMap<BlockHash, Entry>,
    order: BTreeSet<(u64, u64, BlockHash)>,
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

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Whether `key` is held and readable.
    pub fn contains(&self, key: BlockHash) -> bool {
        self.map.get(&key).is_some_and(|e| e.ready)
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn rerank(&mut self, key: BlockHash, rank: (u64, u64)) {
        let e = self.map.get_mut(&key).expect("reranked chunk is held");
        let old = std::mem::replace(&mut e.rank, rank);
        match self.policy {
            EvictionPolicy::Lfu => {
                self.order.remove(&(old.0, old.1, key));
                self.order.insert((rank.0, rank.1, key));
            }
            EvictionPolicy::Lru | EvictionPolicy::Fifo => {
                self.queue.push_back((rank.1, key));
                if self.queue.len() > 2 * self.map.len() + 64 {
                    let map = &self.map;
                    self.queue.retain(|&(t, k)| map.get(&k).is_some_and(|e| e.rank.1 == t));
                }
            }
        }
    }

    /// Keys in eviction order (first = evicted first), skipping stale records.
    fn victims_in_order(&self) -> Box<dyn Iterator<Item = BlockHash> + '_> {
        match self.policy {
            EvictionPolicy::Lfu => Box::new(self.order.iter().map(|&(_, _, k)| k)),
            EvictionPolicy::Lru | EvictionPolicy::Fifo => Box::new(
                self.queue.iter().filter(|&&(t, k)| self.map.get(&k).is_some_and(|e| e.rank.1 == t)).map(|&(_, k)| k),
            ),
        }
    }

    /// Records a read hit on `key` (recency / frequency).
    pub fn touch(&mut self, key: BlockHash) {
        let t = self.tick();
        let Some(e) = self.map.get(&key) else { return };
        let rank = match self.policy {
            EvictionPolicy::Lru => (0, t),
            EvictionPolicy::Lfu => (e.rank.0 + 1, t),
            EvictionPolicy::Fifo => return,
        };
        self.rerank(key, rank);
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
    /// policy order if needed. The chunk is invisible until [`Self::complete`].
    pub fn reserve(&mut self, key: BlockHash, bytes: u64) -> Reserve {
        if self.map.contains_key(&key) {
            self.touch(key);
            return Reserve::Present;
        }
        if bytes > self.capacity {
            return Reserve::NoRoom;
        }
        let mut victims = Vec::new();
        if self.used + bytes > self.capacity {
            let mut freeable = 0;
            for k in self.victims_in_order() {
                let e = &self.map[&k];
                if e.ready && e.pins == 0 {
                    victims.push((k, e.bytes));
                    freeable += e.bytes;
                    if self.used - freeable + bytes <= self.capacity {
                        break;
                    }
                }
            }
            if self.used - freeable + bytes > self.capacity {
                return Reserve::NoRoom;
            }
            for &(k, _) in &victims {
                let e = self.map.remove(&k).expect("victim is held");
                if self.policy == EvictionPolicy::Lfu {
                    self.order.remove(&(e.rank.0, e.rank.1, k));
                }
                self.used -= e.bytes;
            }
            // Drop the stale records the victims left at the front.
            while let Some(&(t, k)) = self.queue.front() {
                if self.map.get(&k).is_some_and(|e| e.rank.1 == t) {
                    break;
                }
                self.queue.pop_front();
            }
        }
        let t = self.tick();
        let rank = match self.policy {
            EvictionPolicy::Lfu => (1, t),
            EvictionPolicy::Lru | EvictionPolicy::Fifo => (0, t),
        };
        self.map.insert(key, Entry { bytes, ready: false, pins: 0, rank });
        match self.policy {
            EvictionPolicy::Lfu => {
                self.order.insert((rank.0, rank.1, key));
            }
            EvictionPolicy::Lru | EvictionPolicy::Fifo => self.queue.push_back((t, key)),
        }
        self.used += bytes;
        Reserve::Reserved(victims)
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

    fn filled(policy: EvictionPolicy) -> ChunkStore {
        // Capacity for three 10-byte chunks, written 1, 2, 3.
        let mut s = ChunkStore::new(30, policy);
        for x in 1..=3 {
            assert_eq!(s.reserve(k(x), 10), Reserve::Reserved(vec![]));
            assert!(s.complete(k(x)));
        }
        s
    }

    #[test]
    fn lru_evicts_the_least_recently_used() {
        let mut s = filled(EvictionPolicy::Lru);
        s.touch(k(1));
        assert_eq!(s.reserve(k(4), 10), Reserve::Reserved(vec![(k(2), 10)]));
        assert!(!s.contains(k(4)), "invisible until written");
        s.complete(k(4));
        assert!(s.contains(k(4)) && s.contains(k(1)) && !s.contains(k(2)));
        assert_eq!(s.used(), 30);
    }

    #[test]
    fn fifo_ignores_reads() {
        let mut s = filled(EvictionPolicy::Fifo);
        s.touch(k(1));
        assert_eq!(s.reserve(k(4), 10), Reserve::Reserved(vec![(k(1), 10)]));
    }

    #[test]
    fn lfu_evicts_the_least_read_with_lru_ties() {
        let mut s = filled(EvictionPolicy::Lfu);
        s.touch(k(1));
        s.touch(k(1));
        s.touch(k(3));
        // Frequencies: 1 → 3, 2 → 1, 3 → 2.
        assert_eq!(s.reserve(k(4), 10), Reserve::Reserved(vec![(k(2), 10)]));
    }

    #[test]
    fn repeated_touches_keep_the_lru_queue_compact() {
        let mut s = filled(EvictionPolicy::Lru);
        for _ in 0..10_000 {
            s.touch(k(2));
        }
        assert!(s.queue.len() <= 2 * 3 + 64 + 1, "stale records are compacted: {}", s.queue.len());
        assert_eq!(s.reserve(k(4), 10), Reserve::Reserved(vec![(k(1), 10)]));
    }

    #[test]
    fn pinned_and_in_flight_chunks_are_never_evicted() {
        let mut s = filled(EvictionPolicy::Lru);
        s.pin(k(1));
        s.pin(k(2));
        assert_eq!(s.reserve(k(4), 20), Reserve::NoRoom, "only chunk 3 is evictable");
        assert_eq!(s.reserve(k(4), 10), Reserve::Reserved(vec![(k(3), 10)]));
        assert_eq!(s.reserve(k(5), 10), Reserve::NoRoom, "chunk 4 is still being written");
        s.unpin(k(1));
        assert_eq!(s.reserve(k(5), 10), Reserve::Reserved(vec![(k(1), 10)]));
        assert!(s.used() <= s.capacity());
        assert_eq!(s.reserve(k(2), 10), Reserve::Present);
        assert_eq!(s.reserve(k(6), 31), Reserve::NoRoom);
    }
}
