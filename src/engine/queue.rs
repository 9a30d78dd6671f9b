//! The event queue: a binary min-heap keyed by `(time, seq)`.
//!
//! **Tie rule** (the only one in the simulator): events with equal time come
//! out in the order they were pushed. `seq` is a per-queue counter, so the
//! order is total and independent of the event payload.

use crate::time::SimTime;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A time-ordered queue of events with FIFO order among equal times.
#[derive(Debug)]
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    next_seq: u64,
}

#[derive(Debug)]
struct Entry<E> {
    /// The time in the high 64 bits, the push number in the low ones: the
    /// order of `(time, seq)` in one integer comparison.
    key: u128,
    event: E,
}

impl<E> Entry<E> {
    fn time(&self) -> SimTime {
        SimTime((self.key >> 64) as u64)
    }
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    /// Reversed so that `BinaryHeap` (a max-heap) pops the earliest key first.
    fn cmp(&self, other: &Self) -> Ordering {
        other.key.cmp(&self.key)
    }
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> EventQueue<E> {
    /// An empty queue.
    pub fn new() -> Self {
        EventQueue { heap: BinaryHeap::new(), next_seq: 0 }
    }

    /// Adds `event` at `time`, after every event already queued at that time.
    pub fn push(&mut self, time: SimTime, event: E) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Entry { key: (u128::from(time.0) << 64) | u128::from(seq), event });
    }

    /// Removes and returns the earliest event.
    pub fn pop(&mut self) -> Option<(SimTime, E)> {
        self.heap.pop().map(|e| (e.time(), e.event))
    }

    /// The time of the earliest event.
    pub fn peek_time(&self) -> Option<SimTime> {
        self.heap.peek().map(Entry::time)
    }

    /// Number of queued events (including stale ones not yet popped).
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// True if no events are queued.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_times_pop_in_insertion_order_and_earlier_times_first() {
        let mut q = EventQueue::new();
        q.push(SimTime(20), "c");
        q.push(SimTime(10), "a");
        q.push(SimTime(20), "d");
        q.push(SimTime(10), "b");
        q.push(SimTime(5), "first");
        q.push(SimTime(20), "e");
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            order,
            vec![
                (SimTime(5), "first"),
                (SimTime(10), "a"),
                (SimTime(10), "b"),
                (SimTime(20), "c"),
                (SimTime(20), "d"),
                (SimTime(20), "e"),
            ]
        );
    }

    #[test]
    fn fifo_tie_order_holds_for_many_events_pushed_while_popping() {
        // Interleave pushes and pops at one instant: the heap must never
        // reorder equal-time events (a classic failure of unstable heaps).
        let mut q = EventQueue::new();
        for i in 0..100u32 {
            q.push(SimTime(7), i);
        }
        let mut out = Vec::new();
        for i in 100..200u32 {
            out.push(q.pop().unwrap().1);
            q.push(SimTime(7), i);
        }
        while let Some((_, e)) = q.pop() {
            out.push(e);
        }
        assert_eq!(out, (0..200).collect::<Vec<_>>());
    }
}
