//! The router as a component: it owns the routing policy, the KV index
//! and the event queue that feeds it, each worker's published-but-unsent
//! KV events, the per-worker load view and the P/D decision. It takes the
//! time and what it observes and returns decisions and "collect again at
//! t"; it never schedules an event or touches a worker itself, so the
//! cluster only turns its answers into events.
//!
//! Event plane, as Dynamo's KV router has it: a worker gathers its KV
//! events for `kvcevent_coalesce_time` and sends them as one batch
//! ([`Router::publish`], [`Router::flush`]); the router applies its queue
//! every `periodic_infra_update_collection_time` (as they arrive when 0),
//! at most `max_event_batch_size` events per batch, each batch taking
//! `event_batch_time` ([`Router::collect`]). Load reports
//! ([`Router::report_load`]) share the queue.

use super::index::{KvIndex, Match};
use super::least_loaded::Fewest;
use super::pd::PdRule;
use super::{LoadScale, Needs, RouteContext, RouterConfig, RoutingPolicy, SystemEvent, WorkerLoad};
use crate::ids::WorkerId;
use crate::kvcache::{ChunkedSeq, KvEvent, KvcConfig, Run};
use crate::metrics::LatencyHistogram;
use crate::rng::StreamRng;
use crate::time::{SimDuration, SimTime};
use std::collections::VecDeque;
use std::ops::Range;

/// A message in the router's event queue.
#[derive(Clone, Copy, Debug)]
enum RouterMsg {
    /// A KV event from a worker's batch.
    Kv(KvEvent),
    /// A worker's load report.
    System(SystemEvent),
}

/// What the router needs to know of a request to route it.
#[derive(Clone, Copy, Debug)]
pub struct RequestView<'r> {
    /// The tokens whose KV the request has or needs (prompt, plus output so
    /// far), as the tiers chunk them.
    pub seq: ChunkedSeq<'r>,
    /// Prompt tokens.
    pub prompt_tokens: u32,
}

/// Where a request goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Routed {
    /// The worker it is queued at first.
    pub worker: WorkerId,
    /// With a KV-aware policy, the prefix the index promised on that worker, tokens.
    pub predicted_hit_tokens: Option<u64>,
    /// With disaggregation and a remote prefill: its decode worker (the
    /// request is a one-token prefill job on `worker` until handed over).
    pub decode: Option<WorkerId>,
    /// With a remote prefill: the prompt tokens it adds to its prefill
    /// worker's pending prefill work (its prompt net of the prefix the index
    /// says is cached there), given back by [`Router::prefilled`].
    pub prefill_tokens: u64,
}

/// The router component of one run.
pub struct Router<'a> {
    cfg: &'a RouterConfig,
    kvc: &'a KvcConfig,
    block_size: u64,
    pd: Option<PdRule>,
    policy: RoutingPolicy,
    needs: Needs,
    rng: StreamRng,
    index: KvIndex,
    /// The router's view of each worker, by index: requests routed there
    /// that have not completed, and its last load report. Kept up to date
    /// in place, so routing reads one compact array.
    loads: Vec<WorkerLoad>,
    /// The least loaded worker of any range, kept as `loads` change when
    /// something reads it (the policy, or the P/D rule's decode choice).
    fewest: Fewest,
    /// Whether `fewest` is kept.
    track_fewest: bool,
    inbox: VecDeque<(WorkerId, SimTime, RouterMsg)>,
    /// A batch is being applied; the rest of the queue follows it.
    draining: bool,
    /// Each worker's busy time at its last load report.
    reported_busy: Vec<SimDuration>,
    scores: Vec<Match>,
    /// Scratch: the runs of the request being scored.
    runs: Vec<Run>,
    /// Each prefill worker's pending prefill work: prompt tokens, net of
    /// their cached prefixes, of the requests routed there not yet handed over.
    pending_prefill: Vec<u64>,
    /// Each worker's KV events gathered but not yet sent.
    pending: Vec<Vec<(SimTime, KvEvent)>>,
    kv_events: u64,
    kv_batches: u64,
    /// Events the index applied (each a run of chunks).
    index_updates: u64,
    /// Wall time spent routing and collecting, when profiling (never read by the simulation).
    wall: Option<std::time::Duration>,
}

impl<'a> Router<'a> {
    /// A router per `cfg` with no workers yet; `pd` is the P/D rule with
    /// disaggregation (the first `prefill` workers form the prefill pool).
    pub fn new(
        cfg: &'a RouterConfig,
        kvc: &'a KvcConfig,
        block_size: u64,
        pd: Option<PdRule>,
        rng: StreamRng,
    ) -> Router<'a> {
        let policy = RoutingPolicy::from_config(cfg);
        let needs = policy.needs();
        Router {
            cfg,
            kvc,
            block_size,
            pd,
            needs,
            track_fewest: needs.loads || pd.is_some(),
            policy,
            rng,
            index: KvIndex::new(kvc.chunk_blocks),
            loads: Vec::new(),
            fewest: Fewest::default(),
            inbox: VecDeque::new(),
            draining: false,
            reported_busy: Vec::new(),
            scores: Vec::new(),
            runs: Vec::new(),
            pending_prefill: Vec::new(),
            pending: Vec::new(),
            kv_events: 0,
            kv_batches: 0,
            index_updates: 0,
            wall: None,
        }
    }

    /// Measures the wall time spent routing and collecting.
    pub fn profile(&mut self) {
        self.wall = Some(std::time::Duration::ZERO);
    }

    /// What the policy reads (the index, load reports).
    pub fn needs(&self) -> Needs {
        self.needs
    }

    /// A new worker (ids are given in order).
    pub fn add_worker(&mut self, id: WorkerId, scale: LoadScale) {
        debug_assert_eq!(id.index(), self.loads.len());
        self.loads.push(WorkerLoad { id, outstanding: 0, scale, system: SystemEvent::default() });
        if self.track_fewest {
            self.fewest.update(&self.loads, id.index());
        }
        self.pending.push(Vec::new());
        self.pending_prefill.push(0);
        self.reported_busy.push(SimDuration(0));
    }

    /// Chooses the worker for a request among all of them (or, with
    /// disaggregation, per the P/D rule); the choice counts as an
    /// outstanding request there until [`Router::released`].
    pub fn route(&mut self, r: RequestView<'_>, prefill_waiting: impl Fn(WorkerId) -> usize) -> Routed {
        let started = self.wall.map(|_| std::time::Instant::now());
        let routed = match self.pd {
            Some(rule) => self.route_pd(r, rule, prefill_waiting),
            None => self.choose(r, 0..self.loads.len()),
        };
        if let (Some(t), Some(acc)) = (started, self.wall.as_mut()) {
            *acc += t.elapsed();
        }
        routed
    }

    /// Disaggregated routing: the decode worker by load (least outstanding
    /// requests); the prefill worker by pending prefill work — the one whose
    /// pending prefill tokens plus this prompt's tokens not cached there
    /// (per the index, under a KV-aware policy; with worker groups, times
    /// the worker's [`LoadScale`] weight) are fewest, lowest id on
    /// ties, as Dynamo's KV router costs a prefill by its new blocks — or,
    /// with RoundRobin and Random, by the policy; then [`PdRule::remote`]
    /// decides whether the prefill worker takes the prompt or the decode
    /// worker serves it whole.
    fn route_pd(&mut self, r: RequestView<'_>, rule: PdRule, prefill_waiting: impl Fn(WorkerId) -> usize) -> Routed {
        let (p, n) = (rule.prefill_workers, self.loads.len());
        let decode = self.fewest.among(&self.loads, p..n);
        let prompt = u64::from(r.prompt_tokens);
        let mut prefill = if self.needs.loads || self.needs.kv_index {
            self.score(r);
            let uncached = |w: usize| prompt.saturating_sub(self.cached(w, prompt));
            // With worker groups, tokens weigh the inverse of the worker's prefill capacity.
            let weight = |w: usize| u128::from(self.loads[w].scale.weight);
            let best = (0..p)
                .min_by_key(|&w| (u128::from(self.pending_prefill[w] + uncached(w)) * weight(w), w))
                .expect("a prefill pool");
            self.pick(WorkerId(best as u32), r)
        } else {
            self.choose(r, 0..p)
        };
        let uncached = prompt.saturating_sub(self.cached(decode.index(), prompt));
        self.count(decode.index(), 1);
        // Dynamo's prefill queue: the requests waiting anywhere in the prefill pool.
        let queue = (0..p).map(|w| prefill_waiting(WorkerId(w as u32))).sum();
        if rule.remote(uncached, queue) {
            let w = prefill.worker.index();
            prefill.prefill_tokens = prompt.saturating_sub(self.cached(w, prompt));
            self.pending_prefill[w] += prefill.prefill_tokens;
            return Routed { decode: Some(decode), ..prefill };
        }
        // The decode worker serves it whole: undo the prefill choice.
        self.count(prefill.worker.index(), -1);
        Routed { worker: decode, ..prefill }
    }

    /// Prompt tokens the index says worker `w` holds of the request last scored.
    fn cached(&self, w: usize, prompt: u64) -> u64 {
        (self.scores.get(w).map_or(0, |m| u64::from(m.chunks)) * self.chunk_tokens()).min(prompt)
    }

    fn chunk_tokens(&self) -> u64 {
        self.kvc.chunk_blocks * self.block_size
    }

    /// Scores every worker's cached prefix of the request (a KV-aware
    /// policy), else clears the scores; returns the request's chunks.
    fn score(&mut self, r: RequestView<'_>) -> u32 {
        if !self.needs.kv_index {
            self.scores.clear();
            return 0;
        }
        // The chunks the connector would look up.
        self.runs.clear();
        self.runs.extend(self.kvc.runs(&r.seq, 0).map(|(run, _, _)| run));
        let weights = self.needs.tier_weights.then_some(&self.cfg.tier_weights);
        self.index.score(&self.runs, self.loads.len(), weights, &mut self.scores);
        self.runs.iter().map(|r| r.n).sum::<u64>() as u32
    }

    /// The policy's choice among the workers in `among`.
    fn choose(&mut self, r: RequestView<'_>, among: Range<usize>) -> Routed {
        let chunks = self.score(r);
        let prefix = if self.scores.is_empty() { &[][..] } else { &self.scores[among.clone()] };
        let fewest = self.needs.loads.then(|| self.fewest.among(&self.loads, among.clone()));
        let ctx = RouteContext { workers: &self.loads[among], prefix, chunks, fewest };
        let worker = self.policy.choose(&ctx, &mut self.rng);
        self.pick(worker, r)
    }

    /// Counts the request as outstanding at `worker` (scored already).
    fn pick(&mut self, worker: WorkerId, r: RequestView<'_>) -> Routed {
        self.count(worker.index(), 1);
        let predicted_hit_tokens = self.needs.kv_index.then(|| {
            let matched = self.scores.get(worker.index()).map_or(0, |m| u64::from(m.chunks));
            // The last token is always computed.
            (matched * self.chunk_tokens()).min(r.seq.tokens - 1)
        });
        Routed { worker, predicted_hit_tokens, decode: None, prefill_tokens: 0 }
    }

    /// A remote prefill of `tokens` pending prefill tokens on worker `w` is done.
    pub fn prefilled(&mut self, w: WorkerId, tokens: u64) {
        self.pending_prefill[w.index()] -= tokens;
    }

    /// A request routed to `w` has left it (completed there, or handed over).
    pub fn released(&mut self, w: WorkerId) {
        self.count(w.index(), -1);
    }

    /// Worker `w`'s outstanding count changes by `delta`.
    fn count(&mut self, w: usize, delta: i32) {
        let o = &mut self.loads[w].outstanding;
        *o = o.checked_add_signed(delta).expect("outstanding requests stay within u32");
        if self.track_fewest {
            self.fewest.update(&self.loads, w);
        }
    }

    /// Most outstanding requests on one worker (what the autoscaler watches).
    pub fn max_outstanding(&self) -> u32 {
        self.loads.iter().map(|l| l.outstanding).max().unwrap_or(0)
    }

    /// Worker `w` published a KV event at `now`. Returns when its batch is
    /// sent (the first event of a batch starts the coalescing window).
    pub fn publish(&mut self, w: WorkerId, now: SimTime, e: KvEvent) -> Option<SimTime> {
        if !self.kvc.publish_events {
            return None;
        }
        let pending = &mut self.pending[w.index()];
        let flush = pending.is_empty().then(|| now + self.kvc.event_coalesce);
        pending.push((now, e));
        flush
    }

    /// Worker `w`'s gathered events reach the router's queue. Returns when
    /// the next batch is to be applied, if [`Router::collect`] left one.
    pub fn flush(&mut self, w: WorkerId, now: SimTime, stale: &mut LatencyHistogram) -> Option<SimTime> {
        let batch = &mut self.pending[w.index()];
        self.kv_events += batch.iter().map(|(_, e)| e.chunks.len()).sum::<u64>();
        self.kv_batches += 1;
        self.inbox.extend(batch.drain(..).map(|(t, e)| (w, t, RouterMsg::Kv(e))));
        self.collect_if_immediate(now, stale)
    }

    /// Every worker reports its load at `now`: `(busy time so far, running,
    /// waiting, KV usage)` per worker, in id order. The reports join the
    /// queue (see [`Router::collect_if_immediate`]).
    pub fn report_loads(&mut self, now: SimTime, reports: impl Iterator<Item = (SimDuration, u32, u32, f64)>) {
        let interval = self.cfg.system_interval.as_secs_f64();
        for (i, (busy, running, waiting, kv_usage)) in reports.enumerate() {
            let since = SimDuration(busy.0 - self.reported_busy[i].0).as_secs_f64();
            self.reported_busy[i] = busy;
            let e = SystemEvent {
                running,
                waiting,
                kv_usage,
                gpu_utilization: if interval > 0.0 { (since / interval).min(1.0) } else { 0.0 },
            };
            self.inbox.push_back((WorkerId(i as u32), now, RouterMsg::System(e)));
        }
    }

    /// Collecting as events arrive (`periodic_infra_update_collection_time
    /// = 0`): applies the queue now, as [`Router::collect`]; otherwise the
    /// queue waits for the periodic collection.
    pub fn collect_if_immediate(&mut self, now: SimTime, stale: &mut LatencyHistogram) -> Option<SimTime> {
        if self.cfg.collection_interval.0 == 0 { self.collect(now, false, stale) } else { None }
    }

    /// Applies the queue at `now` in batches of at most
    /// `max_event_batch_size`, recording each KV event's age in `stale`.
    /// With a per-batch time the queue left after a batch waits for the
    /// next one: the returned time, at which the caller collects again with
    /// `batch_done`. A collection while a batch is being applied does
    /// nothing.
    pub fn collect(&mut self, now: SimTime, batch_done: bool, stale: &mut LatencyHistogram) -> Option<SimTime> {
        let started = self.wall.map(|_| std::time::Instant::now());
        if batch_done {
            self.draining = false;
        }
        let next = self.drain(now, stale);
        if let (Some(t), Some(acc)) = (started, self.wall.as_mut()) {
            *acc += t.elapsed();
        }
        next
    }

    fn drain(&mut self, now: SimTime, stale: &mut LatencyHistogram) -> Option<SimTime> {
        while !self.inbox.is_empty() {
            if self.draining {
                return None; // a batch is being applied; the rest follows it
            }
            // A batch is at most `max_event_batch` messages, an event of
            // many chunks counting one per chunk (split where a batch ends).
            // Events of one flush share their age: record runs of equal ages at once.
            let mut run = (SimDuration(0), 0);
            // Batches applied in no time are one: events are split only where
            // a batch that takes time ends.
            let timed = self.cfg.batch_time.0 > 0;
            let mut budget = if timed { u64::from(self.cfg.max_event_batch) } else { u64::MAX };
            while budget > 0 {
                let Some((w, at, msg)) = self.inbox.pop_front() else { break };
                match msg {
                    RouterMsg::Kv(mut e) => {
                        if e.chunks.len() > budget {
                            let front = e.chunks.split_front(budget, self.kvc.chunk_blocks);
                            self.inbox.push_front((w, at, RouterMsg::Kv(e)));
                            e.chunks = front;
                        }
                        let k = e.chunks.len();
                        budget -= k;
                        self.index.apply(w, &e);
                        self.index_updates += 1;
                        let age = now - at;
                        if age != run.0 && run.1 > 0 {
                            stale.record_n(run.0, run.1);
                            run.1 = 0;
                        }
                        run = (age, run.1 + k);
                    }
                    RouterMsg::System(e) => {
                        budget -= 1;
                        self.loads[w.index()].system = e;
                    }
                }
            }
            if run.1 > 0 {
                stale.record_n(run.0, run.1);
            }
            if timed && !self.inbox.is_empty() {
                self.draining = true;
                return Some(now + self.cfg.batch_time);
            }
        }
        None
    }

    /// Chunks the index says worker `w` holds.
    pub fn chunks_indexed(&self, w: WorkerId) -> u64 {
        self.index.held_by(w)
    }

    /// Events the index applied so far, each naming a run of chunks.
    pub fn index_updates(&self) -> u64 {
        self.index_updates
    }

    /// KV events published (sent or still gathered) and batches sent.
    pub fn kv_event_counts(&self) -> (u64, u64) {
        let pending = self.pending.iter().flatten().map(|(_, e)| e.chunks.len()).sum::<u64>();
        (self.kv_events + pending, self.kv_batches)
    }

    /// Wall seconds spent routing and collecting (when profiled).
    pub fn wall_s(&self) -> Option<f64> {
        self.wall.map(|d| d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvcache::{
        ChainSpan, EventChunks, KvEventKind, PartialChunks, SaveTiming, Tier, WriteMode, WritePolicy,
    };
    use crate::router::{BalancedParams, PolicyKind};

    fn cfg(policy: PolicyKind, collection_ms: u64, batch: u32, batch_ms: u64) -> RouterConfig {
        RouterConfig {
            policy,
            collection_interval: ms(collection_ms),
            max_event_batch: batch,
            batch_time: ms(batch_ms),
            system_interval: ms(1000),
            tier_weights: [1.0; 4],
            balanced: BalancedParams::default(),
            autoscale: None,
        }
    }

    /// Chunks of 2 blocks of 16 tokens; events published after 10 ms of coalescing.
    fn kvc() -> KvcConfig {
        KvcConfig {
            tiers: Vec::new(),
            chunk_blocks: 2,
            save_unfull_chunk: true,
            partial_chunks: PartialChunks::ExactTokens,
            block_size: 16,
            save_decode_cache: false,
            write_policy: WritePolicy::WriteThrough,
            write_mode: WriteMode::Async,
            save_timing: SaveTiming::OnCompute,
            store_on_gpu_eviction: false,
            write_back_hits: false,
            block_bytes: 1 << 16,
            event_coalesce: ms(10),
            publish_events: true,
        }
    }

    fn ms(n: u64) -> SimDuration {
        SimDuration(n * 1_000_000)
    }

    /// A GPU stored event for block `n` (1-based) of the chain of [`view`].
    fn stored(n: u64) -> KvEvent {
        let key = crate::kvcache::ChunkKey::new(CHAINS[0].chain, n - 1);
        KvEvent { tier: Tier::Gpu, chunks: EventChunks::RunUp(Run::one(key)), kind: KvEventKind::Stored }
    }

    fn at(n: u64) -> SimTime {
        SimTime::ZERO + ms(n)
    }

    fn router<'a>(cfg: &'a RouterConfig, kvc: &'a KvcConfig, workers: u32, pd: Option<PdRule>) -> Router<'a> {
        let mut r = Router::new(cfg, kvc, 16, pd, crate::rng::SeedTree::new(1).stream("router"));
        (0..workers).for_each(|w| r.add_worker(WorkerId(w), LoadScale::EQUAL));
        r
    }

    /// A request of 8 blocks on one chain (4 chunks, ending with blocks 2, 4, 6, 8), 128 tokens.
    const CHAINS: [ChainSpan; 1] = [ChainSpan { chain: 77, end: 8 }];

    fn view() -> RequestView<'static> {
        RequestView { seq: ChunkedSeq { chains: &CHAINS, tokens: 128, tail: None }, prompt_tokens: 128 }
    }

    #[test]
    fn a_flush_waits_for_the_periodic_collection_and_records_each_events_age() {
        let (cfg, kvc) = (cfg(PolicyKind::MaxPrefix, 100, 64, 0), kvc());
        let mut r = router(&cfg, &kvc, 2, None);
        let mut stale = LatencyHistogram::default();
        // Worker 1 publishes at 0 and 4 ms: one batch, sent at 10 ms.
        assert_eq!(r.publish(WorkerId(1), at(0), stored(2)), Some(at(10)));
        assert_eq!(r.publish(WorkerId(1), at(4), stored(4)), None, "the batch is already open");
        assert_eq!(r.flush(WorkerId(1), at(10), &mut stale), None, "collected periodically, not on arrival");
        assert_eq!(r.route(view(), |_| 0).predicted_hit_tokens, Some(0), "not yet in the index");
        assert_eq!(stale.count(), 0);
        // The periodic collection at 100 ms applies both: ages 100 and 96 ms.
        assert_eq!(r.collect(at(100), false, &mut stale), None);
        assert_eq!(stale.count(), 2);
        let s = stale.stats();
        assert_eq!((s.mean, s.max), (98.0, 100.0));
        // Now worker 1 holds the first two chunks (64 tokens): MaxPrefix sends it there.
        let routed = r.route(view(), |_| 0);
        assert_eq!((routed.worker, routed.predicted_hit_tokens), (WorkerId(1), Some(64)));
        assert_eq!(r.chunks_indexed(WorkerId(1)), 2);
        assert_eq!(r.kv_event_counts(), (2, 1));
    }

    #[test]
    fn batches_that_take_time_leave_the_rest_of_the_queue_for_the_next_batch() {
        // Collected as they arrive, 2 events per batch, each batch 5 ms.
        let (cfg, kvc) = (cfg(PolicyKind::MaxPrefix, 0, 2, 5), kvc());
        let mut r = router(&cfg, &kvc, 1, None);
        let mut stale = LatencyHistogram::default();
        for h in [2, 4, 6, 8, 10] {
            r.publish(WorkerId(0), at(0), stored(h));
        }
        // At 10 ms the first batch (2 events) is applied; the next is due at 15 ms.
        assert_eq!(r.flush(WorkerId(0), at(10), &mut stale), Some(at(15)));
        assert_eq!(r.chunks_indexed(WorkerId(0)), 2);
        // A collection while the batch is being applied does nothing.
        assert_eq!(r.collect_if_immediate(at(12), &mut stale), None);
        assert_eq!(r.chunks_indexed(WorkerId(0)), 2);
        assert_eq!(r.collect(at(15), true, &mut stale), Some(at(20)));
        assert_eq!(r.chunks_indexed(WorkerId(0)), 4);
        assert_eq!(r.collect(at(20), true, &mut stale), None, "the last event: nothing left");
        assert_eq!(r.chunks_indexed(WorkerId(0)), 5);
        // Ages: 10, 10, 15, 15, 20 ms.
        assert_eq!(stale.count(), 5);
        assert_eq!(stale.stats().mean, 14.0);
    }

    #[test]
    fn an_event_of_many_chunks_counts_each_and_is_split_where_a_batch_ends() {
        // As above, with the five chunks in one event of a tier: chunks 1..=5
        // of the view's chain (blocks 1, 3, …, 9), named last chunk first.
        let (cfg, kvc) = (cfg(PolicyKind::MaxPrefix, 0, 2, 5), kvc());
        let mut r = router(&cfg, &kvc, 1, None);
        let mut stale = LatencyHistogram::default();
        let run = crate::kvcache::Run { chain: CHAINS[0].chain, block: 1, n: 5 };
        let e = KvEvent { tier: Tier::Cpu, chunks: EventChunks::Run(run), kind: KvEventKind::Stored };
        r.publish(WorkerId(0), at(0), e);
        assert_eq!(r.flush(WorkerId(0), at(10), &mut stale), Some(at(15)));
        // Chunks 5 and 4 first: no leading prefix of the view yet.
        assert_eq!(r.chunks_indexed(WorkerId(0)), 2);
        assert_eq!(r.route(view(), |_| 0).predicted_hit_tokens, Some(0));
        r.released(WorkerId(0));
        assert_eq!(r.collect(at(15), true, &mut stale), Some(at(20)));
        assert_eq!(r.chunks_indexed(WorkerId(0)), 4);
        assert_eq!(r.collect(at(20), true, &mut stale), None);
        assert_eq!(r.chunks_indexed(WorkerId(0)), 5);
        // All four of the view's chunks (128 tokens, the last one computed).
        assert_eq!(r.route(view(), |_| 0).predicted_hit_tokens, Some(127));
        // Counted and aged per chunk, exactly as five events: 10, 10, 15, 15, 20 ms.
        assert_eq!((stale.count(), stale.stats().mean), (5, 14.0));
        assert_eq!(r.kv_event_counts(), (5, 1));
    }

    #[test]
    fn load_reports_join_the_queue_and_carry_the_busy_share_since_the_last() {
        let (cfg, kvc) = (cfg(PolicyKind::Balanced, 0, 64, 0), kvc());
        let mut r = router(&cfg, &kvc, 2, None);
        let mut stale = LatencyHistogram::default();
        let busy = ms(250);
        r.report_loads(at(1000), [(busy, 3, 7, 0.5), (SimDuration(0), 0, 0, 0.0)].into_iter());
        assert_eq!(r.loads[0].system, SystemEvent::default(), "queued, not yet applied");
        assert_eq!(r.collect_if_immediate(at(1000), &mut stale), None);
        let e = r.loads[0].system;
        assert_eq!((e.running, e.waiting, e.kv_usage, e.gpu_utilization), (3, 7, 0.5, 0.25));
        assert_eq!(stale.count(), 0, "load reports are not KV events");
    }

    #[test]
    fn pd_routing_takes_the_least_loaded_decode_worker_and_the_policys_prefill_worker() {
        // Workers 0 and 1 prefill, 2 and 3 decode; remote beyond 32 uncached tokens.
        let (cfg, kvc) = (cfg(PolicyKind::MaxPrefix, 0, 64, 0), kvc());
        let rule = PdRule { prefill_workers: 2, max_local_prefill_length: 32, max_prefill_queue_size: Some(2) };
        let mut r = router(&cfg, &kvc, 4, Some(rule));
        let mut stale = LatencyHistogram::default();
        // Prefill worker 1 holds the first chunk; decode worker 2 already has a request.
        r.publish(WorkerId(1), at(0), stored(2));
        r.flush(WorkerId(1), at(10), &mut stale);
        r.count(2, 1);
        // Prefill work: worker 0 would compute 128 tokens, worker 1 (which holds 32) 96.
        let routed = r.route(view(), |_| 0);
        let expect = Routed {
            worker: WorkerId(1),
            predicted_hit_tokens: Some(32),
            decode: Some(WorkerId(3)),
            prefill_tokens: 96,
        };
        assert_eq!(routed, expect);
        assert_eq!(r.loads.iter().map(|l| l.outstanding).collect::<Vec<_>>(), [0, 1, 1, 1]);
        // Now worker 1 has 96 pending (96 + 96 > 128): worker 0 is the prefill
        // candidate; with the prefill queues full (2 waiting), decode worker 2
        // (tied at 1, lower id) serves it whole.
        let routed = r.route(view(), |_| 2);
        assert_eq!(
            routed,
            Routed { worker: WorkerId(2), predicted_hit_tokens: Some(0), decode: None, prefill_tokens: 0 }
        );
        assert_eq!(r.loads.iter().map(|l| l.outstanding).collect::<Vec<_>>(), [0, 1, 2, 1]);
        // Decode worker 3 holds all 4 chunks and is the less loaded decode worker: nothing to prefill remotely.
        for h in [2, 4, 6, 8] {
            r.publish(WorkerId(3), at(20), stored(h));
        }
        r.flush(WorkerId(3), at(30), &mut stale);
        r.count(2, 3);
        let routed = r.route(view(), |_| 0);
        assert_eq!((routed.worker, routed.decode), (WorkerId(3), None));
        assert_eq!(r.loads.iter().map(|l| l.outstanding).collect::<Vec<_>>(), [0, 1, 5, 2]);
        // Worker 1's prefill is handed over: its pending work goes.
        r.prefilled(WorkerId(1), 96);
        assert_eq!(r.pending_prefill, [0, 0, 0, 0]);
    }

    #[test]
    fn a_long_prompt_stays_off_the_decode_workers_until_the_prefill_pools_queue_is_full() {
        // Dynamo's rule: remote beyond 1,000 uncached tokens while fewer than
        // 4 requests wait in the prefill pool (here: on both its workers).
        let (cfg, kvc) = (cfg(PolicyKind::LeastLoaded, 0, 64, 0), kvc());
        let rule = PdRule { prefill_workers: 2, max_local_prefill_length: 1000, max_prefill_queue_size: Some(4) };
        let mut r = router(&cfg, &kvc, 3, Some(rule));
        let long = RequestView { seq: ChunkedSeq { chains: &[], tokens: 16_384, tail: None }, prompt_tokens: 16_384 };
        // 1 + 2 waiting: remote, on the prefill worker with less pending work.
        let waiting = |w: WorkerId| [1, 2][w.index()];
        assert_eq!(r.route(long, waiting).decode, Some(WorkerId(2)));
        // 2 + 2 waiting: the queue is full, the decode worker prefills it.
        let full = |_: WorkerId| 2;
        assert_eq!(
            r.route(long, full),
            Routed { worker: WorkerId(2), predicted_hit_tokens: None, decode: None, prefill_tokens: 0 }
        );
        // A short prompt stays local whatever the queue.
        let short = RequestView { seq: ChunkedSeq { chains: &[], tokens: 900, tail: None }, prompt_tokens: 900 };
        assert_eq!(r.route(short, |_| 0).decode, None);
    }

    #[test]
    fn the_prefill_pool_is_chosen_by_pending_prefill_tokens_not_by_request_count() {
        // LeastLoaded; workers 0 and 1 prefill, 2 decodes; every prompt goes remote.
        let (cfg, kvc) = (cfg(PolicyKind::LeastLoaded, 0, 64, 0), kvc());
        let rule = PdRule { prefill_workers: 2, max_local_prefill_length: 0, max_prefill_queue_size: None };
        let mut r = router(&cfg, &kvc, 3, Some(rule));
        let prompt = |tokens: u32| RequestView {
            seq: ChunkedSeq { chains: &[], tokens: u64::from(tokens), tail: None },
            prompt_tokens: tokens,
        };
        // A 16k-token prompt goes to worker 0, a short one to worker 1.
        assert_eq!(r.route(prompt(16_384), |_| 0).worker, WorkerId(0));
        assert_eq!(r.route(prompt(100), |_| 0).worker, WorkerId(1));
        // One request each: by count they tie (and worker 0 would win); by
        // pending prefill tokens (16,384 vs 100) the next short prompt goes to worker 1.
        assert_eq!(r.route(prompt(100), |_| 0).worker, WorkerId(1));
        assert_eq!(r.pending_prefill[..2], [16_384, 200]);
    }
}
