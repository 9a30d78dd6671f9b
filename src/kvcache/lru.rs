//! The GPU prefix cache's eviction order: its unreferenced leaves by (last
//! use, node), least recent first.
//!
//! A binary min-heap with lazy removal. A leaf joins the set when it is
//! released, at the current time — the heap's bottom — so a push is a
//! comparison or two; a node that leaves the set (taken again, given a
//! child, evicted) is only forgotten: its entry goes stale and is dropped
//! when it reaches the top, or all at once when stale entries outnumber
//! live ones. The top is always live, so the least recently used leaf is
//! read in O(1). (It replaced a B-tree set — an insert per released
//! request, a removal per evicted leaf — and took the core bench's
//! reference from 24.1k to 23.9k instructions per request.)

use crate::time::SimTime;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A node's place in the order, and the stamp of the insertion that put it
/// there (an entry is live while its node's stamp is still its own): last
/// use, node and stamp in one integer (high to low bits), so the heap's
/// comparisons are one integer comparison each, in `(last use, node)` order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Entry(u128);

impl Entry {
    fn new(t: SimTime, i: u32, stamp: u32) -> Entry {
        Entry(u128::from(t.0) << 64 | u128::from(i) << 32 | u128::from(stamp))
    }

    fn key(self) -> (SimTime, u32) {
        (SimTime((self.0 >> 64) as u64), self.node())
    }

    fn node(self) -> u32 {
        (self.0 >> 32) as u32
    }

    fn stamp(self) -> u32 {
        self.0 as u32
    }
}

/// Where the set keeps each node's stamp: the stamp of its live entry, 0
/// when it is not in the set. The prefix cache keeps it in the node itself,
/// so a release, which writes the node anyway, writes the stamp in the same
/// cache line instead of a line of a separate table.
pub(super) trait Stamps {
    /// Node `i`'s stamp.
    fn stamp(&self, i: u32) -> u32;
    /// Sets node `i`'s stamp.
    fn set_stamp(&mut self, i: u32, stamp: u32);
}

/// Nodes ordered by `(last use, node)`; their stamps live with the nodes
/// ([`Stamps`]), passed to every call that reads or writes them.
#[derive(Clone, Debug, Default)]
pub(super) struct Lru {
    heap: BinaryHeap<Reverse<Entry>>,
    /// The last stamp given.
    stamp: u32,
    /// Nodes in the set.
    live: usize,
}

impl Lru {
    fn is_live(e: &Entry, stamps: &impl Stamps) -> bool {
        stamps.stamp(e.node()) == e.stamp()
    }

    /// Whether node `i` is in the set.
    pub(super) fn contains(i: u32, stamps: &impl Stamps) -> bool {
        stamps.stamp(i) != 0
    }

    /// Puts node `i` (not in the set) in, last used at `t`.
    pub(super) fn insert(&mut self, t: SimTime, i: u32, stamps: &mut impl Stamps) {
        debug_assert!(!Self::contains(i, stamps), "node {i} is in the set already");
        if self.stamp == u32::MAX {
            self.restamp(stamps);
        }
        self.stamp += 1;
        stamps.set_stamp(i, self.stamp);
        self.heap.push(Reverse(Entry::new(t, i, self.stamp)));
        self.live += 1;
    }

    /// Takes node `i` out of the set; false if it was not in.
    pub(super) fn remove(&mut self, i: u32, stamps: &mut impl Stamps) -> bool {
        if !Self::contains(i, stamps) {
            return false;
        }
        stamps.set_stamp(i, 0);
        self.live -= 1;
        while let Some(Reverse(e)) = self.heap.peek()
            && !Self::is_live(e, stamps)
        {
            self.heap.pop();
        }
        if crate::engine::lazy_heap_needs_rebuild(self.heap.len(), self.live) {
            self.retain_live(stamps);
        }
        true
    }

    /// Rebuilds the heap from its live entries (the stale ones go).
    fn retain_live(&mut self, stamps: &impl Stamps) {
        self.heap.retain(|Reverse(e)| Self::is_live(e, stamps));
    }

    /// Drops the stale entries and stamps the live ones 1, 2, …: no entry
    /// then holds a stamp above the count, so the stamps given next match
    /// none until they run out again.
    fn restamp(&mut self, stamps: &mut impl Stamps) {
        self.retain_live(stamps);
        let mut entries = std::mem::take(&mut self.heap).into_vec();
        for (k, Reverse(e)) in entries.iter_mut().enumerate() {
            let (t, i) = e.key();
            *e = Entry::new(t, i, k as u32 + 1);
            stamps.set_stamp(i, e.stamp());
        }
        self.stamp = entries.len() as u32;
        self.heap = BinaryHeap::from(entries);
    }

    /// The least recently used node and its last use.
    pub(super) fn first(&self) -> Option<(SimTime, u32)> {
        self.heap.peek().map(|Reverse(e)| e.key())
    }

    /// The set in order, least recently used first. The first costs
    /// nothing more than [`Self::first`]; each next one a step through the
    /// heap (O(log n)).
    pub(super) fn iter<'a>(&'a self, stamps: &'a impl Stamps) -> impl Iterator<Item = (SimTime, u32)> + 'a {
        let heap: &[Reverse<Entry>] = self.heap.as_slice();
        // Heap places not yet visited whose parents were, by their entries.
        let mut frontier: BinaryHeap<Reverse<(Entry, usize)>> = BinaryHeap::new();
        // The root comes first; the place whose children join the frontier
        // before the next one is taken (so that reading the first allocates nothing).
        let (mut root, mut expand): (bool, Option<usize>) = (!heap.is_empty(), None);
        std::iter::from_fn(move || {
            loop {
                if let Some(k) = expand.take() {
                    for c in [2 * k + 1, 2 * k + 2].into_iter().filter(|&c| c < heap.len()) {
                        frontier.push(Reverse((heap[c].0, c)));
                    }
                }
                let k = if std::mem::take(&mut root) { 0 } else { frontier.pop()?.0.1 };
                expand = Some(k);
                if Self::is_live(&heap[k].0, stamps) {
                    return Some(heap[k].0.key());
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Stamps in a table of their own, grown as nodes are named.
    impl Stamps for Vec<u32> {
        fn stamp(&self, i: u32) -> u32 {
            self.get(i as usize).copied().unwrap_or(0)
        }
        fn set_stamp(&mut self, i: u32, stamp: u32) {
            if self.len() <= i as usize {
                self.resize(i as usize + 1, 0);
            }
            self[i as usize] = stamp;
        }
    }

    /// A small deterministic generator.
    fn lcg(state: &mut u64) -> u64 {
        *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *state >> 33
    }

    #[test]
    fn it_orders_inserts_and_removals_as_an_ordered_set_does() {
        let (mut lru, mut set, mut st) = (Lru::default(), BTreeSet::new(), Vec::<u32>::new());
        let (mut s, mut now) = (7, 0);
        let mut last_used = vec![SimTime(0); 300];
        for step in 0..20_000 {
            let i = (lcg(&mut s) % 300) as u32;
            match lcg(&mut s) % 4 {
                // Mostly now (a release), sometimes earlier (a parent left a leaf).
                0 | 1 if !Lru::contains(i, &st) => {
                    now += lcg(&mut s) % 3;
                    let t = if lcg(&mut s).is_multiple_of(5) { SimTime(now / 2) } else { SimTime(now) };
                    last_used[i as usize] = t;
                    lru.insert(t, i, &mut st);
                    set.insert((t, i));
                }
                2 => assert_eq!(lru.remove(i, &mut st), set.remove(&(last_used[i as usize], i)), "step {step}"),
                _ => {
                    if let Some(first) = set.first().copied() {
                        assert!(lru.remove(first.1, &mut st));
                        set.remove(&first);
                    }
                }
            }
            assert_eq!(lru.first(), set.first().copied(), "step {step}");
            assert_eq!(lru.live, set.len());
            assert!(lru.heap.len() <= 2 * lru.live + 64, "stale entries are dropped");
            if step % 97 == 0 {
                assert_eq!(lru.iter(&st).collect::<Vec<_>>(), set.iter().copied().collect::<Vec<_>>(), "step {step}");
            }
        }
    }

    #[test]
    fn a_node_taken_out_and_put_back_at_the_same_time_is_in_once() {
        let (mut lru, mut st) = (Lru::default(), Vec::<u32>::new());
        lru.insert(SimTime(5), 1, &mut st);
        lru.insert(SimTime(5), 2, &mut st);
        assert!(lru.remove(2, &mut st));
        assert!(!lru.remove(2, &mut st), "not in the set any more");
        lru.insert(SimTime(5), 2, &mut st);
        lru.insert(SimTime(3), 0, &mut st);
        assert_eq!(lru.iter(&st).collect::<Vec<_>>(), [(SimTime(3), 0), (SimTime(5), 1), (SimTime(5), 2)]);
        assert_eq!(lru.first(), Some((SimTime(3), 0)));
    }

    #[test]
    fn stamps_start_again_without_reviving_a_stale_entry() {
        let (mut lru, mut st) = (Lru::default(), Vec::<u32>::new());
        lru.insert(SimTime(1), 0, &mut st);
        lru.insert(SimTime(2), 1, &mut st);
        assert!(lru.remove(1, &mut st)); // a stale entry below the top
        lru.stamp = u32::MAX - 1;
        lru.insert(SimTime(3), 2, &mut st); // the last stamp
        lru.insert(SimTime(4), 3, &mut st); // stale entries go, the live are stamped 1 and 2, this one 3
        assert_eq!((lru.heap.len(), lru.stamp), (3, 3));
        assert!(lru.heap.iter().all(|Reverse(e)| e.stamp() <= 3), "no entry keeps a stamp from before");
        // Out and in again, each time leaving a stale entry behind: the
        // stamps given next are above every one an entry holds.
        for _ in 0..4 {
            assert!(lru.remove(0, &mut st));
            lru.insert(SimTime(5), 0, &mut st);
        }
        let order = [(SimTime(3), 2), (SimTime(4), 3), (SimTime(5), 0)];
        assert_eq!(lru.iter(&st).collect::<Vec<_>>(), order, "each node once");
    }
}
