//! The generic discrete-event engine: a time-ordered queue and a run loop.
//!
//! It knows nothing about LLMs. A [`Model`] receives each event with the
//! current time and schedules follow-up events through a [`Scheduler`].
//! Cancellation is lazy: a component that re-plans a completion bumps a
//! [`Version`] and ignores the stale event when it is popped.

mod queue;

pub use queue::EventQueue;

use crate::time::{SimDuration, SimTime};
use std::hash::{Hash, Hasher};

/// A simulation driven by the engine.
pub trait Model {
    /// The event type: small, `Copy`, carrying ids (and versions), never state.
    type Event: Copy + Hash;

    /// Handles one event at time `now`, scheduling any follow-ups.
    fn handle(&mut self, now: SimTime, event: Self::Event, sched: &mut Scheduler<'_, Self::Event>);

    /// True once nothing more can happen that the run cares about (the
    /// workload is finished and every request has completed).
    fn finished(&self) -> bool;

    /// Called with the current time before each event is handled, and once at
    /// the end with the final time; used to close metric intervals. The default
    /// does nothing.
    fn advance_to(&mut self, _now: SimTime) {}

    /// Work units done so far (requests completed), for progress displays.
    fn done(&self) -> u64 {
        0
    }
}

/// What a run shows of itself while it runs: written by the engine every few
/// thousand events, read by whoever displays progress (another thread).
#[derive(Debug, Default)]
pub struct Progress {
    /// Simulated nanoseconds reached.
    pub sim_ns: std::sync::atomic::AtomicU64,
    /// [`Model::done`] then.
    pub done: std::sync::atomic::AtomicU64,
}

/// What a run is watched by: a flag that stops it and a progress record
/// it keeps up to date (both optional).
#[derive(Clone, Copy, Debug, Default)]
pub struct Watch<'a> {
    /// Stop when this becomes true.
    pub stop: Option<&'a std::sync::atomic::AtomicBool>,
    /// Keep this up to date.
    pub progress: Option<&'a Progress>,
}

/// The view of the queue a model gets while handling an event.
pub struct Scheduler<'a, E> {
    now: SimTime,
    queue: &'a mut EventQueue<E>,
}

impl<E> Scheduler<'_, E> {
    /// The current simulated time.
    pub fn now(&self) -> SimTime {
        self.now
    }

    /// Schedules `event` after `delay` (zero runs it after the events already
    /// queued for the current instant).
    pub fn after(&mut self, delay: SimDuration, event: E) {
        self.queue.push(self.now + delay, event);
    }

    /// Schedules `event` at `time`, which must not be in the past.
    pub fn at(&mut self, time: SimTime, event: E) {
        assert!(time >= self.now, "event scheduled in the past: {time:?} < {:?}", self.now);
        self.queue.push(time, event);
    }
}

/// Why a run stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model reported it was finished.
    Finished,
    /// The time limit was reached with work still pending.
    TimeLimit,
    /// No events were left although the model was not finished.
    QueueEmpty,
    /// The stop flag was raised.
    Interrupted,
}

/// Events handled between two looks at the stop flag (a few milliseconds).
const STOP_CHECK_EVENTS: u64 = 4096;

/// What the run loop reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunStats {
    /// Events popped and handled (stale cancelled events included).
    pub events: u64,
    /// The simulated time at which the run stopped.
    pub end_time: SimTime,
    /// Why it stopped.
    pub stop: StopReason,
    /// A digest of the whole event sequence: every handled event's time
    /// and `Hash` image folded in ([`EventDigest`]). Equal digests mean the runs
    /// handled the same events at the same times in the same order.
    pub digest: u64,
}

/// Runs `model` from the events in `queue` until it is finished, the queue is
/// empty, or the next event is at or after `until`.
///
/// With a time limit the run observes the half-open window `[0, until)`: an
/// event exactly at the limit is not handled, and the final time is the limit
/// itself. Otherwise the final time is that of the last event handled.
/// When `watch.stop` becomes true the run ends early
/// ([`StopReason::Interrupted`]); `watch.progress` is kept up to date.
pub fn run<M: Model>(
    model: &mut M,
    queue: &mut EventQueue<M::Event>,
    until: Option<SimTime>,
    watch: Watch<'_>,
) -> RunStats {
    let mut events = 0;
    let mut digest = EventDigest::default();
    let mut now = SimTime::ZERO;
    let stop = loop {
        if model.finished() {
            break StopReason::Finished;
        }
        let Some(next) = queue.peek_time() else {
            break StopReason::QueueEmpty;
        };
        if until.is_some_and(|limit| next >= limit) {
            now = until.unwrap_or(now);
            break StopReason::TimeLimit;
        }
        if events % STOP_CHECK_EVENTS == 0 {
            use std::sync::atomic::Ordering::Relaxed;
            if let Some(p) = watch.progress {
                p.sim_ns.store(now.0, Relaxed);
                p.done.store(model.done(), Relaxed);
            }
            if watch.stop.is_some_and(|s| s.load(Relaxed)) {
                break StopReason::Interrupted;
            }
        }
        let (time, event) = queue.pop().expect("peeked event vanished");
        now = time;
        digest.write_u64(time.0);
        event.hash(&mut digest);
        events += 1;
        model.advance_to(now);
        let mut sched = Scheduler { now, queue: &mut *queue };
        model.handle(now, event, &mut sched);
    };
    model.advance_to(now);
    RunStats { events, end_time: now, stop, digest: digest.finish() }
}

/// A version counter for a re-plannable completion (lazy cancellation).
///
/// Scheduling a completion stamps it with [`Version::bump`]; when it is popped,
/// [`Version::is_current`] tells whether a later re-plan superseded it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Version(u32);

impl Version {
    /// Invalidates every event stamped so far and returns the new stamp.
    pub fn bump(&mut self) -> u32 {
        self.0 = self.0.wrapping_add(1);
        self.0
    }

    /// True if `stamp` is the latest one issued.
    pub fn is_current(&self, stamp: u32) -> bool {
        self.0 == stamp
    }

    /// The latest stamp issued.
    pub fn current(&self) -> u32 {
        self.0
    }
}

/// Whether a heap with lazy removal (stale entries left in place and
/// skipped when they reach the top) that holds `entries` entries, `live` of
/// them current, should drop its stale ones now: once they exceed the live
/// ones by more than a fixed slack. The heap then stays within twice its
/// live size plus the slack, and each rebuild — O(entries) — is paid for by
/// the stale entries pushed since the one before. The prefix cache's LRU
/// and the decode group's finish and window heaps use it.
#[inline]
pub fn lazy_heap_needs_rebuild(entries: usize, live: usize) -> bool {
    entries > 2 * live + 64
}

/// The digest of a run's events ([`RunStats::digest`]): each integer an
/// event's `Hash` image writes is folded in whole, `h = (h ^ x) · K` with
/// `K` odd. Each fold is a bijection of the state and of the integer, so a
/// change in any one field of any one event changes the digest; a word at
/// a time it costs a fraction of FNV-1a's byte at a time, on every event.
/// Stable and unkeyed, for comparing runs only (not persisted).
#[derive(Clone, Copy, Debug)]
struct EventDigest(u64);

impl Default for EventDigest {
    fn default() -> Self {
        EventDigest(0xcbf2_9ce4_8422_2325)
    }
}

impl EventDigest {
    fn fold(&mut self, x: u64) {
        self.0 = (self.0 ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

impl Hasher for EventDigest {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.fold(u64::from(b));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.fold(u64::from(i));
    }

    fn write_u16(&mut self, i: u16) {
        self.fold(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.fold(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.fold(i);
    }

    fn write_usize(&mut self, i: usize) {
        self.fold(i as u64);
    }

    fn write_isize(&mut self, i: isize) {
        self.fold(i as u64);
    }
}

/// 64-bit FNV-1a as a [`Hasher`] (stable, unkeyed, for digests only).
#[derive(Clone, Copy, Debug)]
pub struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv64 {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model that records what it sees and re-schedules a countdown.
    struct Countdown {
        seen: Vec<(u64, u32)>,
        done_after: usize,
    }

    impl Model for Countdown {
        type Event = u32;
        fn handle(&mut self, now: SimTime, event: u32, sched: &mut Scheduler<'_, u32>) {
            self.seen.push((now.0, event));
            if event > 0 {
                sched.after(SimDuration(10), event - 1);
            }
        }
        fn finished(&self) -> bool {
            self.seen.len() >= self.done_after
        }
    }

    #[test]
    fn run_stops_when_the_model_is_finished() {
        let mut q = EventQueue::new();
        q.push(SimTime(5), 9);
        let mut m = Countdown { seen: vec![], done_after: 3 };
        let stats = run(&mut m, &mut q, None, Watch::default());
        assert_eq!(m.seen, vec![(5, 9), (15, 8), (25, 7)]);
        assert_eq!(stats.stop, StopReason::Finished);
        assert_eq!(stats.end_time, SimTime(25));
        assert_eq!(stats.events, 3);
    }

    #[test]
    fn run_stops_at_the_time_limit_without_handling_events_exactly_at_it() {
        let mut q = EventQueue::new();
        q.push(SimTime(0), 100);
        let mut m = Countdown { seen: vec![], done_after: usize::MAX };
        let stats = run(&mut m, &mut q, Some(SimTime(30)), Watch::default());
        // Events at 0, 10, 20 run; the one at 30 does not (the window is [0, 30)).
        assert_eq!(m.seen.len(), 3);
        assert_eq!(stats.stop, StopReason::TimeLimit);
        assert_eq!(stats.end_time, SimTime(30));
    }

    #[test]
    fn run_stops_when_the_queue_drains_and_digests_differ_by_content() {
        let digest_of = |start: u32| {
            let mut q = EventQueue::new();
            q.push(SimTime(0), start);
            let mut m = Countdown { seen: vec![], done_after: usize::MAX };
            let stats = run(&mut m, &mut q, None, Watch::default());
            assert_eq!(stats.stop, StopReason::QueueEmpty);
            stats.digest
        };
        assert_eq!(digest_of(3), digest_of(3));
        assert_ne!(digest_of(3), digest_of(4));
    }

    #[test]
    fn a_raised_stop_flag_ends_the_run_within_one_check_interval() {
        use std::sync::atomic::{AtomicBool, Ordering};
        // Raised before the run: nothing is handled.
        let stop = AtomicBool::new(true);
        let mut q = EventQueue::new();
        q.push(SimTime(0), u32::MAX);
        let mut m = Countdown { seen: vec![], done_after: usize::MAX };
        let stats = run(&mut m, &mut q, None, Watch { stop: Some(&stop), progress: None });
        assert_eq!((stats.stop, stats.events), (StopReason::Interrupted, 0));
        // Raised mid-run (by the model, at its 5,000th event): the run ends at
        // the next check, after 8,192 events.
        struct Raiser<'a>(Countdown, &'a AtomicBool);
        impl Model for Raiser<'_> {
            type Event = u32;
            fn handle(&mut self, now: SimTime, event: u32, sched: &mut Scheduler<'_, u32>) {
                self.0.handle(now, event, sched);
                if self.0.seen.len() == 5_000 {
                    self.1.store(true, Ordering::Relaxed);
                }
            }
            fn finished(&self) -> bool {
                false
            }
        }
        let stop = AtomicBool::new(false);
        let mut q = EventQueue::new();
        q.push(SimTime(0), u32::MAX);
        let mut m = Raiser(Countdown { seen: vec![], done_after: usize::MAX }, &stop);
        let progress = Progress::default();
        let stats = run(&mut m, &mut q, None, Watch { stop: Some(&stop), progress: Some(&progress) });
        assert_eq!((stats.stop, stats.events), (StopReason::Interrupted, 2 * STOP_CHECK_EVENTS));
        // Progress as of the last look: 8,192 events handled, the last at 10·8,191.
        assert_eq!(progress.sim_ns.load(Ordering::Relaxed), 10 * (2 * STOP_CHECK_EVENTS - 1));
        assert_eq!(stats.end_time, SimTime(10 * (2 * STOP_CHECK_EVENTS - 1)));
    }

    #[test]
    fn version_invalidates_older_stamps() {
        let mut v = Version::default();
        let a = v.bump();
        let b = v.bump();
        assert!(!v.is_current(a));
        assert!(v.is_current(b));
    }
}
