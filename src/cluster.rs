//! The cluster: owns every component of one run and is the only place that
//! knows the event enum. Components are passive; their returned effects are
//! turned into events here.
//!
//! KV flow per request: on reaching a worker its block hashes are computed;
//! the worker's scheduler decides, with the KV connector, what the request
//! already has (GPU prefix, then the tiers) and starts loads; the connector's
//! device timers, finished loads and finished saves come back here as
//! effects and are dispatched to the worker, the router and the metrics.
//! After its last token the connector saves the request's KV to the tiers.

use crate::RunError;
use crate::config::Scenario;
use crate::config::disagg::Role;
use crate::engine::{self, EventQueue, Model, RunStats, Scheduler};
use crate::ids::{RequestId, StageId, WorkerId};
use crate::kvcache::{BlockHash, ConnectorOutput, KvConnector, KvEvent};
use crate::metrics::{
    Gauges, InSystem, IntervalRow, Latencies, LatencyMetric, RequestRecord, RunSummary, Sc25Row, StageRow, StageTally,
    StepRow, TierSummary, TimeSeries, WorkerRow,
};
use crate::request::PdPhase;
use crate::request::Request;
use crate::rng::{SeedTree, StreamRng};
use crate::router::{
    Autoscaler, KvIndex, Match, Policy, RouteContext, RoutingPolicy, SystemEvent, WorkerLoad, autoscale::ScaleAction,
};
use crate::storage::DeviceTimer;
use crate::time::{SimDuration, SimTime};
use crate::worker::{StepOutcome, Worker, WorkerConfig};
use crate::workload::{Label, NewRequest, Workload};
use std::collections::VecDeque;

/// Everything that happens in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// The workload's next arrival for a stage is due.
    Arrival(StageId),
    /// A worker's step ends (stale if `version` was superseded).
    StepEnd {
        /// The worker.
        worker: WorkerId,
        /// Stamp of the planned step.
        version: u32,
    },
    /// A storage device's timer.
    Device {
        /// Tier instance.
        instance: u32,
        /// The device's own timer.
        timer: DeviceTimer,
    },
    /// A worker sends the KV events it gathered.
    KvFlush(WorkerId),
    /// The router applies queued events (periodic when its queue is empty,
    /// or the next batch of a drain).
    RouterCollect {
        /// A periodic collection (schedules the next one).
        periodic: bool,
    },
    /// Every worker reports its load to the router.
    SystemReport,
    /// The autoscaler looks at the queues.
    ScaleCheck,
    /// A provisioned worker joins.
    ScaleUp,
}

/// A message in the router's event queue.
#[derive(Clone, Copy, Debug)]
enum RouterMsg {
    Kv(KvEvent),
    /// A worker's load report.
    System(SystemEvent),
}

/// Run totals over the requests that have left the arena (and, at the
/// end, those still in it).
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    /// Prompt tokens of requests that were admitted.
    prompt_tokens: u64,
    /// Their hit tokens at first admission, per tier.
    hit_tokens: [u64; 4],
    hit_tokens_total: u64,
    prefill_tokens_computed: u64,
    /// KV-aware routing decisions, and those off by a chunk or more.
    predictions: u64,
    mispredictions: u64,
}

impl Tally {
    fn add(&mut self, r: &Request, chunk_tokens: u64) {
        self.hit_tokens_total += r.hit_tokens_total;
        self.prefill_tokens_computed += r.prefill_tokens_computed;
        if r.first_scheduled.is_none() {
            return;
        }
        self.prompt_tokens += u64::from(r.prompt_tokens);
        for (acc, h) in self.hit_tokens.iter_mut().zip(r.hit_tokens) {
            *acc += h;
        }
        if let Some(p) = r.predicted_hit_tokens {
            self.predictions += 1;
            self.mispredictions += u64::from(p.abs_diff(r.hit_tokens.iter().sum()) >= chunk_tokens);
        }
    }
}

/// What an `SC25Workload` request contributes to the cold/warm table.
#[derive(Clone, Copy, Debug)]
struct Sc25Request {
    serial: u32,
    stage: StageId,
    warm: bool,
    prompt_tokens: u32,
    ttft_ms: Option<f64>,
    prefill_tokens: u64,
    hit_tokens: [u64; 4],
    fetch_ms: Option<f64>,
}

/// Per-worker counters for the workers table.
#[derive(Clone, Copy, Debug, Default)]
struct WorkerStats {
    started: SimTime,
    routed: u64,
    completed: u64,
    prompt_tokens: u64,
    hit_tokens: u64,
    /// KV bytes pulled over its link (remote prefills).
    link_bytes: u64,
}

/// The settings of worker `w`: its pool's, or the spec's when every worker is mixed.
fn worker_cfg(s: &Scenario, w: usize) -> &WorkerConfig {
    match &s.disagg {
        Some(d) => &d.pool_of(w).1.worker,
        None => &s.worker,
    }
}

/// The results of one run.
#[derive(Clone, Debug)]
pub struct RunOutput {
    /// The summary row.
    pub summary: RunSummary,
    /// Latency histograms.
    pub latencies: Latencies,
    /// The time series.
    pub series: Vec<IntervalRow>,
    /// One record per generated request, in id order (empty unless asked for).
    pub requests: Vec<RequestRecord>,
    /// One row per scheduler step, by start time then worker (empty unless asked for).
    pub steps: Vec<StepRow>,
    /// Most requests in the arena at once (requests in flight; finished ones give their slot back).
    pub peak_live_requests: u64,
    /// One row per worker (including those added by autoscaling).
    pub workers: Vec<WorkerRow>,
    /// Cold and warm TTFT per prompt size of `SC25Workload` stages (empty without one).
    pub sc25: Vec<Sc25Row>,
    /// One row per workload stage.
    pub stages: Vec<StageRow>,
    /// Digest of the event sequence (equal digests: identical runs).
    pub event_digest: u64,
    /// Wall seconds spent routing and applying router events (when profiled).
    pub routing_wall_s: Option<f64>,
}

/// Refuses an event beyond the time a run may reach, naming the likely causes.
fn beyond_horizon<T>(next: Option<(T, SimTime)>) -> Result<Option<(T, SimTime)>, String> {
    match next {
        Some((_, t)) if t > crate::time::HORIZON => Err(format!(
            "the next arrival is at {:.3e} simulated seconds, beyond the {:.0e} s a run may reach\n  fix: check the request rates (a rate near 0 spaces arrivals by ages) and the trace timestamps (epoch times need shift_to_first = true, and Mooncake's milliseconds multiplier_to_sec = 0.001)",
            t.as_secs_f64(),
            crate::time::HORIZON.as_secs_f64()
        )),
        next => Ok(next),
    }
}

/// The state of one run.
pub struct Cluster<'a> {
    scenario: &'a Scenario,
    requests: Vec<Request>,
    /// Slots of `requests` free for reuse.
    free_slots: Vec<u32>,
    /// Hashes requests' blocks (remembering a shared leading segment's).
    hasher: crate::kvcache::BlockHasher,
    /// Scratch for the decode steps materialised from runs.
    substeps: Vec<crate::metrics::StepRecord>,
    /// Requests generated so far (the next one's serial).
    generated: u32,
    tally: Tally,
    /// Keep a record of every request (the requests table is written).
    keep_records: bool,
    records: Vec<RequestRecord>,
    /// Keep a row per step (the `steps` table).
    log_steps: bool,
    sc25: Vec<Sc25Request>,
    workers: Vec<Worker>,
    /// The router's view of each worker, by index: requests it routed there
    /// that have not completed, and the worker's last system event. Kept up
    /// to date in place, so routing reads one compact array rather than
    /// every worker.
    loads: Vec<WorkerLoad>,
    policy: RoutingPolicy,
    router_rng: StreamRng,
    index: KvIndex,
    inbox: VecDeque<(WorkerId, SimTime, RouterMsg)>,
    draining: bool,
    /// Each worker's busy time at its last system event.
    reported_busy: Vec<SimDuration>,
    scores: Vec<Match>,
    keys: Vec<BlockHash>,
    autoscaler: Option<Autoscaler>,
    worker_stats: Vec<WorkerStats>,
    workload: Workload,
    new_requests: Vec<NewRequest>,
    /// Workers given requests at the current arrival, in the order first given one.
    kicks: Vec<WorkerId>,
    outcome: StepOutcome,
    connector: KvConnector,
    /// Effects of connector calls not yet applied, and a spare buffer.
    conn_out: ConnectorOutput,
    conn_spare: ConnectorOutput,
    kv_pending: Vec<Vec<(SimTime, KvEvent)>>,
    kv_events: u64,
    kv_batches: u64,
    latencies: Latencies,
    /// Per workload stage, in `scenario.stages` order.
    stage_tallies: Vec<StageTally>,
    series: TimeSeries,
    in_system: InSystem,
    completed: u64,
    rejected: u64,
    completed_prompt_tokens: u64,
    completed_output_tokens: u64,
    fatal: Option<String>,
    /// Wall time spent routing, when profiling (never read by the simulation).
    routing_wall: Option<std::time::Duration>,
    /// Requests prefilled on the prefill pool, and by their decode worker.
    pd_counts: (u64, u64),
}

impl<'a> Cluster<'a> {
    /// A cluster at time zero, per `scenario`.
    pub fn new(scenario: &'a Scenario) -> Cluster<'a> {
        let seeds = SeedTree::new(scenario.seed);
        let mut c = Cluster {
            scenario,
            requests: Vec::new(),
            free_slots: Vec::new(),
            hasher: crate::kvcache::BlockHasher::default(),
            substeps: Vec::new(),
            generated: 0,
            tally: Tally::default(),
            keep_records: false,
            records: Vec::new(),
            log_steps: false,
            sc25: Vec::new(),
            workers: Vec::new(),
            loads: Vec::new(),
            policy: RoutingPolicy::from_config(&scenario.router),
            router_rng: seeds.stream("router"),
            index: KvIndex::default(),
            inbox: VecDeque::new(),
            draining: false,
            reported_busy: Vec::new(),
            scores: Vec::new(),
            keys: Vec::new(),
            autoscaler: scenario.router.autoscale.map(Autoscaler::new),
            worker_stats: Vec::new(),
            workload: Workload::new(scenario.stages.clone(), &seeds),
            new_requests: Vec::new(),
            kicks: Vec::new(),
            outcome: StepOutcome::default(),
            connector: KvConnector::new(&scenario.kvc, scenario.worker.block_size),
            conn_out: ConnectorOutput::default(),
            conn_spare: ConnectorOutput::default(),
            kv_pending: Vec::new(),
            kv_events: 0,
            kv_batches: 0,
            latencies: Latencies::default(),
            stage_tallies: vec![StageTally::default(); scenario.stages.len()],
            series: TimeSeries::new(scenario.interval),
            in_system: InSystem::default(),
            completed: 0,
            rejected: 0,
            completed_prompt_tokens: 0,
            completed_output_tokens: 0,
            fatal: None,
            routing_wall: None,
            pd_counts: (0, 0),
        };
        if let Some(d) = &scenario.disagg {
            c.connector.set_link(d.link, scenario.model.kv_bytes_per_token());
        }
        for _ in 0..scenario.num_workers {
            c.add_worker(SimTime::ZERO);
        }
        c
    }

    /// Adds a worker with cold caches (and its per-worker tiers) at `now`.
    fn add_worker(&mut self, now: SimTime) -> WorkerId {
        let id = WorkerId(self.workers.len() as u32);
        self.workers.push(Worker::new(id, worker_cfg(self.scenario, id.index())));
        if self.log_steps {
            self.workers[id.index()].log_steps();
        }
        self.loads.push(WorkerLoad { id, outstanding: 0, system: SystemEvent::default() });
        self.kv_pending.push(Vec::new());
        self.reported_busy.push(SimDuration(0));
        self.worker_stats.push(WorkerStats { started: now, ..WorkerStats::default() });
        self.connector.add_worker();
        id
    }

    fn gauges(&self) -> Gauges {
        Gauges {
            queue_depth: self.workers.iter().map(|w| w.waiting() as u64).sum(),
            queue_depth_prefill: self
                .scenario
                .disagg
                .as_ref()
                .map_or(0, |d| self.workers[..d.prefill.count as usize].iter().map(|w| w.waiting() as u64).sum()),
            running: self.workers.iter().map(|w| w.running() as u64).sum(),
            active_workers: self.workers.len() as u32,
            used_blocks: self.workers.iter().map(Worker::used_blocks).sum(),
            total_blocks: (0..self.workers.len()).map(|w| worker_cfg(self.scenario, w).total_blocks).sum(),
        }
    }

    fn fail(&mut self, message: String) {
        self.fatal.get_or_insert(message);
    }

    fn schedule_arrival(&mut self, step: crate::workload::Step, sched: &mut Scheduler<'_, Event>) {
        match step.and_then(beyond_horizon) {
            Ok(Some((s, t))) => sched.at(t, Event::Arrival(s)),
            Ok(None) => {}
            Err(e) => self.fail(e),
        }
    }

    fn on_arrival(&mut self, now: SimTime, stage: StageId, sched: &mut Scheduler<'_, Event>) {
        let mut fresh = std::mem::take(&mut self.new_requests);
        let step = self.workload.on_arrival(now, stage, &mut fresh);
        self.schedule_arrival(step, sched);
        for nr in fresh.drain(..) {
            let (stage, label) = (nr.stage, nr.label);
            let id = self.admit_to_arena(now, nr);
            let r = &self.requests[id.index()];
            let too_long = u64::from(r.prompt_tokens) + u64::from(r.output_tokens) > self.scenario.worker.max_model_len;
            let tally = &mut self.stage_tallies[stage.index()];
            tally.arrived(now);
            if too_long {
                // vLLM rejects it outright; it is reported, not queued.
                self.rejected += 1;
                tally.rejected += 1;
                self.retire(id);
                let step = self.workload.on_completion(now, stage, label, false);
                self.schedule_arrival(step, sched);
                continue;
            }
            self.in_system.change(now, 1);
            let w = self.route(id);
            if !self.kicks.contains(&w) {
                self.kicks.push(w);
            }
        }
        self.new_requests = fresh;
        // The workers plan their next steps once every request of this
        // instant is queued, so requests arriving together are batched.
        let mut kicks = std::mem::take(&mut self.kicks);
        for w in kicks.drain(..) {
            self.kick(now, w, sched);
        }
        self.kicks = kicks;
    }

    /// Puts a new request in a free slot of the arena (or a new one).
    fn admit_to_arena(&mut self, now: SimTime, new: NewRequest) -> RequestId {
        let serial = self.generated;
        self.generated += 1;
        match self.free_slots.pop() {
            Some(slot) => {
                let id = RequestId(slot);
                self.requests[id.index()] = Request::new(id, serial, now, new);
                id
            }
            None => {
                let id = RequestId(self.requests.len() as u32);
                self.requests.push(Request::new(id, serial, now, new));
                id
            }
        }
    }

    /// The request is done with (responded or rejected): its totals, record
    /// and SC25 figures are kept, its slot given back.
    fn retire(&mut self, id: RequestId) {
        let chunk_tokens = self.scenario.kvc.chunk_blocks * self.scenario.worker.block_size;
        let r = &mut self.requests[id.index()];
        self.tally.add(r, chunk_tokens);
        if self.keep_records {
            self.records.push(record(r));
        }
        if let Some(s) = sc25_request(r) {
            self.sc25.push(s);
        }
        // Content and hashes go now; the slot is reused by a later request.
        r.blocks = Vec::new();
        r.content = crate::kvcache::Content::default();
        self.free_slots.push(id.0);
    }

    /// Chooses the request's worker and queues it there (the caller kicks the worker).
    fn route(&mut self, id: RequestId) -> WorkerId {
        // The block hashes are the request's, needed by any worker whatever the policy.
        self.requests[id.index()].hash_blocks(self.scenario.worker.block_size as u32, &mut self.hasher);
        let started = self.routing_wall.map(|_| std::time::Instant::now());
        let w = match self.scenario.disagg.is_some() {
            true => self.choose_pd(id),
            false => self.choose_worker(id, 0..self.workers.len()),
        };
        if let (Some(t), Some(acc)) = (started, self.routing_wall.as_mut()) {
            *acc += t.elapsed();
        }
        self.workers[w.index()].enqueue(id);
        w
    }

    /// Disaggregated routing: the decode worker by load (least outstanding
    /// requests), the prefill worker by the routing policy over the prefill
    /// pool. Conditional disaggregation as Dynamo's disaggregated router
    /// decides it (`prefill_remote`: the prompt's part not cached on the
    /// decode worker is longer than `max_local_prefill_length`; Dynamo's
    /// vLLM worker also prefills locally when the prefill queue is too long
    /// — here the chosen prefill worker's waiting requests against
    /// `max_prefill_queue_size`): otherwise the decode worker serves the
    /// request whole. Returns the worker it goes to first.
    fn choose_pd(&mut self, id: RequestId) -> WorkerId {
        let d = self.scenario.disagg.as_ref().expect("disaggregated");
        let p = d.prefill.count as usize;
        let n = self.workers.len();
        let ctx = RouteContext { workers: &self.loads[p..n], prefix: &[], chunks: 0 };
        let decode = crate::router::LeastLoaded.choose(&ctx, &mut self.router_rng);
        // The prefill candidate (this also scores every worker's cached prefix).
        let prefill = self.choose_worker(id, 0..p);
        let r = &self.requests[id.index()];
        let chunk_tokens = self.scenario.kvc.chunk_blocks * self.scenario.worker.block_size;
        let cached_on_decode = self.scores.get(decode.index()).map_or(0, |m| u64::from(m.chunks)) * chunk_tokens;
        let uncached = u64::from(r.prompt_tokens).saturating_sub(cached_on_decode);
        let queue_ok = d.max_prefill_queue_size.is_none_or(|q| (self.workers[prefill.index()].waiting() as u64) < q);
        let remote = uncached > d.max_local_prefill_length && queue_ok;
        if !remote {
            // Undo the prefill choice; the decode worker serves it whole.
            self.loads[prefill.index()].outstanding -= 1;
            self.worker_stats[prefill.index()].routed -= 1;
            self.loads[decode.index()].outstanding += 1;
            self.worker_stats[decode.index()].routed += 1;
            self.requests[id.index()].worker = Some(decode);
            self.pd_counts.1 += 1;
            return decode;
        }
        self.pd_counts.0 += 1;
        self.loads[decode.index()].outstanding += 1;
        let r = &mut self.requests[id.index()];
        r.pd = PdPhase::Prefill { decode, output_tokens: r.output_tokens };
        // The prefill worker is asked for one token, as the P/D proxies ask vLLM (max_tokens = 1).
        r.output_tokens = 1;
        prefill
    }

    /// A prefill worker finished request `id` (its first token is out): its
    /// prompt's KV is offered to its decode worker, which pulls it over its
    /// link once it has the blocks, and continues from the second token
    /// (the prefill worker's first token stands, as in SGLang's and
    /// Mooncake's P/D: the decode worker computes that token's KV in its
    /// first step and samples the second).
    fn hand_over(&mut self, now: SimTime, id: RequestId, sched: &mut Scheduler<'_, Event>) {
        let r = &mut self.requests[id.index()];
        let PdPhase::Prefill { decode, output_tokens } = r.pd else {
            unreachable!("only prefill jobs are handed over")
        };
        let prefill = r.worker.expect("routed");
        self.loads[prefill.index()].outstanding -= 1;
        self.worker_stats[prefill.index()].completed += 1;
        r.output_tokens = output_tokens;
        r.pd = PdPhase::Decode { awaiting_first_step: true };
        r.worker = Some(decode);
        r.finished = None;
        r.seq = crate::request::SeqState {
            num_tokens: u64::from(r.prompt_tokens) + 1,
            generated: 1,
            last_token_at: now,
            ..Default::default()
        };
        self.worker_stats[decode.index()].routed += 1;
        if output_tokens == 1 {
            // Nothing to decode: the prefill's token was the answer.
            r.finished = Some(now);
            self.respond(now, id, sched);
            return;
        }
        self.connector.offer_remote(id);
        self.workers[decode.index()].enqueue(id);
        self.kick(now, decode, sched);
    }

    /// The routing decision (and its bookkeeping) for request `id`, among
    /// the workers in `among` (every worker, or the prefill pool).
    fn choose_worker(&mut self, id: RequestId, among: std::ops::Range<usize>) -> WorkerId {
        let mut chunks = 0;
        if self.scenario.router.policy.reads_kv_events() {
            // The chunks the connector would look up: every full block's.
            let r = &self.requests[id.index()];
            let limit = (r.seq.num_tokens / self.scenario.worker.block_size).min(r.blocks.len() as u64);
            self.keys.clear();
            let mut j = 0;
            while let Some((key, _, _)) = self.scenario.kvc.chunk(&r.blocks, j, limit) {
                self.keys.push(key);
                j += 1;
            }
            chunks = self.keys.len() as u32;
            self.index.score(&self.keys, self.workers.len(), &self.scenario.router.tier_weights, &mut self.scores);
        } else {
            self.scores.clear();
        }
        let prefix = if self.scores.is_empty() { &[][..] } else { &self.scores[among.clone()] };
        let ctx = RouteContext { workers: &self.loads[among], prefix, chunks };
        let w = self.policy.choose(&ctx, &mut self.router_rng);
        self.loads[w.index()].outstanding += 1;
        self.worker_stats[w.index()].routed += 1;
        let r = &mut self.requests[id.index()];
        r.worker = Some(w);
        if chunks > 0 || self.scenario.router.policy.reads_kv_events() {
            let matched = self.scores.get(w.index()).map_or(0, |m| u64::from(m.chunks));
            let chunk_tokens = self.scenario.kvc.chunk_blocks * self.scenario.worker.block_size;
            // The last token is always computed.
            r.predicted_hit_tokens = Some((matched * chunk_tokens).min(r.seq.num_tokens - 1));
        }
        w
    }

    /// Lets worker `w` react to a change (see [`Worker::poll`]) and applies
    /// every effect that follows.
    fn kick(&mut self, now: SimTime, w: WorkerId, sched: &mut Scheduler<'_, Event>) {
        self.poll_worker(now, w, sched);
        self.apply_connector(now, sched);
    }

    /// [`Self::kick`] without applying the connector's effects.
    fn poll_worker(&mut self, now: SimTime, w: WorkerId, sched: &mut Scheduler<'_, Event>) {
        let worker = &mut self.workers[w.index()];
        if let Some((end, version)) = worker.poll(
            now,
            &mut self.requests,
            worker_cfg(self.scenario, w.index()),
            &mut self.connector,
            &mut self.conn_out,
        ) {
            sched.at(end, Event::StepEnd { worker: w, version });
        }
        self.record_substeps(w);
        self.drain_cache(now, w);
    }

    /// Records the decode steps worker `w` has materialised from a run:
    /// busy time, tokens and inter-token gaps, as their own step ends would.
    fn record_substeps(&mut self, w: WorkerId) {
        let mut subs = std::mem::take(&mut self.substeps);
        self.workers[w.index()].take_substeps(&mut subs);
        self.series.on_steps(&subs);
        self.latencies.get_mut(LatencyMetric::Itl).record_each(subs.iter().map(|s| (s.duration, s.decodes)));
        subs.clear();
        self.substeps = subs;
    }

    /// Brings every worker's run of decode steps up to `until` (see
    /// [`Worker::materialize`]) before their state is read.
    fn materialize_all(&mut self, until: SimTime, inclusive: bool) {
        for i in 0..self.workers.len() {
            if self.workers[i].in_run() {
                self.workers[i].materialize(until, inclusive);
                self.record_substeps(WorkerId(i as u32));
            }
        }
    }

    /// Applies the connector's effects until none are left (applying them
    /// can make more: a finished load lets its worker start others).
    fn apply_connector(&mut self, now: SimTime, sched: &mut Scheduler<'_, Event>) {
        while !self.conn_out.is_empty() {
            let mut out = std::mem::replace(&mut self.conn_out, std::mem::take(&mut self.conn_spare));
            for &(t, instance, timer) in &out.timers {
                sched.at(t, Event::Device { instance, timer });
            }
            for &(tier, bytes) in &out.moved {
                self.series.on_tier_bytes(now, tier, bytes);
            }
            for &(w, e) in &out.events {
                self.kv_event(now, w, e, sched);
            }
            // Every load that finished now first, then each worker once, so
            // that a step planned now sees all of them.
            for d in &out.loaded {
                let r = &mut self.requests[d.request.index()];
                for (acc, b) in r.read_bytes.iter_mut().zip(d.bytes) {
                    *acc += b;
                }
                let took = now - d.started;
                if d.link_bytes > 0 {
                    self.latencies.get_mut(LatencyMetric::KvTransfer).record(took);
                    self.worker_stats[d.worker.index()].link_bytes += d.link_bytes;
                } else {
                    r.fetch_time.get_or_insert(took);
                    self.latencies.get_mut(LatencyMetric::KvFetch).record(took);
                }
                let cfg = worker_cfg(self.scenario, d.worker.index());
                self.workers[d.worker.index()].fetched(d.request, now, &mut self.requests, cfg);
            }
            for (i, d) in out.loaded.iter().enumerate() {
                if out.loaded[..i].iter().all(|e| e.worker != d.worker) {
                    self.poll_worker(now, d.worker, sched);
                }
            }
            for &id in &out.saved {
                self.respond(now, id, sched);
            }
            out.clear();
            self.conn_spare = out;
        }
    }

    fn kv_event(&mut self, now: SimTime, w: WorkerId, e: KvEvent, sched: &mut Scheduler<'_, Event>) {
        if !self.scenario.kvc.publish_events {
            return;
        }
        let pending = &mut self.kv_pending[w.index()];
        if pending.is_empty() {
            sched.at(now + self.scenario.kvc.event_coalesce, Event::KvFlush(w));
        }
        pending.push((now, e));
    }

    /// Moves the worker's prefix-cache events to its pending KV events and
    /// has the connector write back evicted chunk-ending blocks if configured.
    /// (The flush of pending events is scheduled when they are next applied.)
    fn drain_cache(&mut self, now: SimTime, w: WorkerId) {
        let cache = self.workers[w.index()].cache_mut();
        if cache.events.is_empty() && cache.evicted.is_empty() {
            return;
        }
        let mut events = std::mem::take(&mut cache.events);
        let mut evicted = std::mem::take(&mut cache.evicted);
        self.conn_out.events.extend(events.drain(..).map(|e| (w, e)));
        // Only reported when write-back on eviction is on.
        self.connector.save_evicted(now, w, evicted.drain(..).map(|(h, _)| h), &mut self.conn_out);
        let cache = self.workers[w.index()].cache_mut();
        cache.events = events;
        cache.evicted = evicted;
    }

    fn on_step_end(&mut self, now: SimTime, worker: WorkerId, version: u32, sched: &mut Scheduler<'_, Event>) {
        let w = &mut self.workers[worker.index()];
        if w.finish_step(now, version, &mut self.requests, worker_cfg(self.scenario, worker.index()), &mut self.outcome)
            .is_err()
        {
            return;
        }
        self.record_substeps(worker);
        let out = &self.outcome;
        self.series.on_busy(now - out.duration, now);
        self.series.on_tokens(now, out.prompt_tokens, out.generated_tokens);
        self.series.on_peak(now, out.peak);
        self.latencies.get_mut(LatencyMetric::Itl).record_n(out.duration, out.decodes);
        for &gap in &out.resumed_gaps {
            self.latencies.get_mut(LatencyMetric::Itl).record(gap);
        }
        for &gap in &out.first_decodes {
            self.latencies.get_mut(LatencyMetric::FirstDecode).record(gap);
        }
        for &id in &out.first_tokens {
            let r = &self.requests[id.index()];
            let ttft = now - r.arrival;
            self.latencies.get_mut(LatencyMetric::Ttft).record(ttft);
            let wait = r.first_scheduled.expect("a request with a token was scheduled") - r.arrival;
            self.latencies.get_mut(LatencyMetric::QueueWait).record(wait);
            let tally = &mut self.stage_tallies[r.stage.index()];
            tally.ttft.record(ttft);
            tally.queue_wait.record(wait);
            self.series.on_first_token(now, ttft, &r.hit_tokens);
        }
        let done = std::mem::take(&mut self.outcome.completed);
        for &id in &done {
            let r = &self.requests[id.index()];
            if matches!(r.pd, PdPhase::Prefill { .. }) {
                // The prefill worker's part is done: its prompt goes to the
                // tiers as any finished request's would (LMCache on the
                // prefill worker), and the request moves to its decode worker.
                let tokens = u64::from(r.prompt_tokens);
                self.connector.save(now, worker, id, &r.blocks, tokens, &mut self.conn_out);
                self.hand_over(now, id, sched);
                continue;
            }
            if r.output_tokens > 1 {
                let ttft = r.first_token.expect("completed request has a first token") - r.arrival;
                let decode = (r.finished.expect("completed") - r.arrival).0 - ttft.0;
                let tpot = SimDuration(decode / u64::from(r.output_tokens - 1));
                self.latencies.get_mut(LatencyMetric::Tpot).record(tpot);
                self.stage_tallies[r.stage.index()].tpot.record(tpot);
            }
            // Its prompt's KV (and its output's with `save_decode_cache`) goes to the tiers.
            let tokens = if self.scenario.kvc.save_decode_cache { r.seq.computed } else { u64::from(r.prompt_tokens) };
            let waits = self.connector.save(now, worker, id, &r.blocks, tokens, &mut self.conn_out);
            if !waits {
                self.respond(now, id, sched);
            }
        }
        self.outcome.completed = done;
        self.kick(now, worker, sched);
    }

    /// The response leaves the platform: end-to-end accounting.
    fn respond(&mut self, now: SimTime, id: RequestId, sched: &mut Scheduler<'_, Event>) {
        let r = &mut self.requests[id.index()];
        let e2e = now - r.arrival;
        r.responded = Some(now);
        self.latencies.get_mut(LatencyMetric::E2e).record(e2e);
        self.completed += 1;
        self.completed_prompt_tokens += u64::from(r.prompt_tokens);
        self.completed_output_tokens += u64::from(r.output_tokens);
        let tally = &mut self.stage_tallies[r.stage.index()];
        tally.e2e.record(e2e);
        tally.completed += 1;
        tally.prompt_tokens += u64::from(r.prompt_tokens);
        tally.output_tokens += u64::from(r.output_tokens);
        tally.hit_tokens += r.hit_tokens.iter().sum::<u64>();
        tally.last_response = Some(now);
        let (stage, label) = (r.stage, r.label);
        let w = r.worker.expect("routed");
        let stats = &mut self.worker_stats[w.index()];
        stats.completed += 1;
        stats.prompt_tokens += u64::from(r.prompt_tokens);
        stats.hit_tokens += r.hit_tokens.iter().sum::<u64>();
        self.loads[w.index()].outstanding -= 1;
        self.in_system.change(now, -1);
        self.series.on_completion(now);
        self.retire(id);
        let step = self.workload.on_completion(now, stage, label, true);
        self.schedule_arrival(step, sched);
    }

    /// Applies the router's queued events in batches of at most
    /// `max_event_batch_size`; with a per-batch time the next batch is a
    /// later event.
    fn drain(&mut self, now: SimTime, sched: &mut Scheduler<'_, Event>) {
        let started = self.routing_wall.map(|_| std::time::Instant::now());
        self.drain_batches(now, sched);
        if let (Some(t), Some(acc)) = (started, self.routing_wall.as_mut()) {
            *acc += t.elapsed();
        }
    }

    fn drain_batches(&mut self, now: SimTime, sched: &mut Scheduler<'_, Event>) {
        let cfg = &self.scenario.router;
        while !self.inbox.is_empty() {
            if self.draining {
                return; // a batch is being applied; the rest follows it
            }
            let n = cfg.max_event_batch.min(self.inbox.len() as u32);
            self.index.warm(self.inbox.range(..n as usize).filter_map(|(_, _, m)| match m {
                RouterMsg::Kv(e) => Some(e.hash),
                RouterMsg::System(_) => None,
            }));
            // Events of one flush share their age: record runs of equal ages at once.
            let mut run = (SimDuration(0), 0);
            for _ in 0..n {
                let (w, at, msg) = self.inbox.pop_front().expect("checked non-empty");
                match msg {
                    RouterMsg::Kv(e) => {
                        self.index.apply(w, &e);
                        let age = now - at;
                        if age != run.0 && run.1 > 0 {
                            self.latencies.get_mut(LatencyMetric::KvStaleness).record_n(run.0, run.1);
                            run.1 = 0;
                        }
                        run = (age, run.1 + 1);
                    }
                    RouterMsg::System(e) => self.loads[w.index()].system = e,
                }
            }
            if run.1 > 0 {
                self.latencies.get_mut(LatencyMetric::KvStaleness).record_n(run.0, run.1);
            }
            if cfg.batch_time.0 > 0 && !self.inbox.is_empty() {
                self.draining = true;
                sched.after(cfg.batch_time, Event::RouterCollect { periodic: false });
                return;
            }
        }
    }

    /// Runs to the end and reports.
    pub fn run(mut self, opts: &crate::RunOptions<'_>) -> Result<RunOutput, RunError> {
        if opts.profile_routing {
            self.routing_wall = Some(std::time::Duration::ZERO);
        }
        self.keep_records = opts.request_records;
        self.log_steps = opts.step_records;
        if self.log_steps {
            self.workers.iter_mut().for_each(Worker::log_steps);
        }
        let mut queue = EventQueue::new();
        let r = &self.scenario.router;
        if r.policy.reads_kv_events() && r.collection_interval.0 > 0 {
            queue.push(SimTime::ZERO + r.collection_interval, Event::RouterCollect { periodic: true });
        }
        if r.policy == crate::router::PolicyKind::Balanced {
            queue.push(SimTime::ZERO, Event::SystemReport);
        }
        if self.autoscaler.is_some() {
            queue.push(Autoscaler::first_check(), Event::ScaleCheck);
        }
        match self.workload.start(SimTime::ZERO).and_then(beyond_horizon) {
            Ok(Some((s, t))) => queue.push(t, Event::Arrival(s)),
            Ok(None) => {}
            Err(e) => return Err(RunError::Failed(e)),
        }
        let limit = self.scenario.time_limit;
        let stats =
            engine::run(&mut self, &mut queue, limit, engine::Watch { stop: opts.stop, progress: opts.progress });
        if let Some(e) = self.fatal.take() {
            return Err(RunError::Failed(e));
        }
        if stats.stop == engine::StopReason::Interrupted {
            return Err(RunError::Interrupted { sim_time_s: stats.end_time.as_secs_f64() });
        }
        Ok(self.report(stats))
    }

    fn report(mut self, stats: RunStats) -> RunOutput {
        let end = stats.end_time;
        self.materialize_all(end, false);
        let secs = end.as_secs_f64();
        let per_s = |x: u64| if secs > 0.0 { x as f64 / secs } else { 0.0 };
        // Steps still in flight count as busy up to the end of the run.
        let mut busy: u64 = 0;
        for w in &self.workers {
            busy += w.busy_time().0;
            if let Some(start) = w.step_start() {
                self.series.on_busy(start, end);
                busy += (end - start).0;
            }
        }
        let worker_time: f64 = self.worker_stats.iter().map(|st| end.saturating_since(st.started).0 as f64).sum();
        // The requests still in the arena count as they stand.
        let mut live = vec![true; self.requests.len()];
        for &slot in &self.free_slots {
            live[slot as usize] = false;
        }
        let chunk_tokens = self.scenario.kvc.chunk_blocks * self.scenario.worker.block_size;
        for r in self.requests.iter().zip(&live).filter(|(_, live)| **live).map(|(r, _)| r) {
            self.tally.add(r, chunk_tokens);
            if self.keep_records {
                self.records.push(record(r));
            }
            self.sc25.extend(sc25_request(r));
        }
        let t = self.tally;
        let tiers = TierSummary {
            prompt_tokens: t.prompt_tokens,
            hit_tokens: t.hit_tokens,
            hit_tokens_total: t.hit_tokens_total,
            prefill_tokens_computed: t.prefill_tokens_computed,
            ..TierSummary::default()
        };
        let mut tiers = tiers;
        let mut instances = [0u64; 4];
        for inst in self.connector.report(end) {
            let t = inst.tier.index();
            tiers.bytes_read[t] += inst.stats.bytes_read;
            tiers.bytes_written[t] += inst.stats.bytes_written;
            tiers.device_busy_s[t] += inst.stats.busy.as_secs_f64();
            instances[t] += 1;
            if inst.capacity_bytes > 0 {
                tiers.occupancy_peak[t] =
                    tiers.occupancy_peak[t].max(inst.peak_bytes as f64 / inst.capacity_bytes as f64);
            }
        }
        for ((util, busy), &n) in tiers.device_utilization.iter_mut().zip(&tiers.device_busy_s).zip(&instances) {
            *util = if n > 0 && secs > 0.0 { busy / (n as f64 * secs) } else { 0.0 };
        }
        let gauges = self.gauges();
        let trace = self.workload.trace_counts();
        let mut peak = crate::metrics::PeakSeconds::default();
        for w in &self.workers {
            peak += w.peak_total();
        }
        let workers: Vec<WorkerRow> = self
            .workers
            .iter()
            .zip(&self.worker_stats)
            .map(|(w, st)| {
                let alive = end.saturating_since(st.started).as_secs_f64();
                let busy = w.busy_at(end).as_secs_f64();
                WorkerRow {
                    worker: w.id().0,
                    started_s: st.started.as_secs_f64(),
                    requests_routed: st.routed,
                    requests_completed: st.completed,
                    prefix_hit_ratio: if st.prompt_tokens > 0 {
                        st.hit_tokens as f64 / st.prompt_tokens as f64
                    } else {
                        0.0
                    },
                    busy_s: busy,
                    busy_fraction: if alive > 0.0 { busy / alive } else { 0.0 },
                    compute_fraction: if alive > 0.0 { w.peak_total().compute / alive } else { 0.0 },
                    hbm_fraction: if alive > 0.0 { w.peak_total().memory / alive } else { 0.0 },
                    preemptions: w.preemptions(),
                    chunks_indexed: self.index.held_by(w.id()),
                    cost: match &self.scenario.disagg {
                        Some(d) => {
                            let pool = d.pool_of(w.id().index()).1;
                            pool.gpu.cost(pool.tp, alive, busy, w.step_joules())
                        }
                        None => self.scenario.gpu.cost(self.scenario.tp, alive, busy, w.step_joules()),
                    },
                    role: self.scenario.disagg.as_ref().map_or(Role::Mixed, |d| d.pool_of(w.id().index()).0).name(),
                    link_bytes: st.link_bytes,
                }
            })
            .collect();
        let mut cost = crate::metrics::CostSummary { usd: 0.0, ..Default::default() };
        for w in &workers {
            cost += w.cost;
        }
        let summary = RunSummary {
            requests_generated: u64::from(self.generated),
            requests_completed: self.completed,
            requests_rejected: self.rejected,
            requests_incomplete: u64::from(self.generated) - self.completed - self.rejected,
            sim_time_s: secs,
            events: stats.events,
            stop_reason: stats.stop,
            input_tokens_per_s: per_s(self.completed_prompt_tokens),
            output_tokens_per_s: per_s(self.completed_output_tokens),
            requests_per_s: per_s(self.completed),
            ttft_ms: self.latencies.get(LatencyMetric::Ttft).stats(),
            tpot_ms: self.latencies.get(LatencyMetric::Tpot).stats(),
            itl_ms: self.latencies.get(LatencyMetric::Itl).stats(),
            e2e_ms: self.latencies.get(LatencyMetric::E2e).stats(),
            queue_wait_ms: self.latencies.get(LatencyMetric::QueueWait).stats(),
            kv_fetch_ms: self.latencies.get(LatencyMetric::KvFetch).stats(),
            gpu_busy_fraction: if worker_time > 0.0 { busy as f64 / worker_time } else { 0.0 },
            gpu_compute_fraction: if worker_time > 0.0 { peak.compute * 1e9 / worker_time } else { 0.0 },
            gpu_hbm_fraction: if worker_time > 0.0 { peak.memory * 1e9 / worker_time } else { 0.0 },
            preemptions: self.workers.iter().map(Worker::preemptions).sum(),
            prefill_tokens_computed: t.prefill_tokens_computed,
            mean_requests_in_system: self.in_system.mean(end),
            workers: self.workers.len() as u32,
            tiers,
            kv_events: self.kv_events + self.kv_pending.iter().map(|p| p.len() as u64).sum::<u64>(),
            kv_event_batches: self.kv_batches,
            kv_staleness_ms: self.latencies.get(LatencyMetric::KvStaleness).stats(),
            routing_mispredictions: if t.predictions > 0 {
                t.mispredictions as f64 / t.predictions as f64
            } else {
                0.0
            },
            trace_lines_skipped: trace.skipped,
            trace_lines_reordered: trace.reordered,
            trace_outputs_raised: trace.outputs_raised,
            sessions_truncated: self.workload.sessions_truncated(),
            model_params: self.scenario.model.parameter_count(),
            model_active_params: self.scenario.model.active_parameter_count(),
            kv_bytes_per_token: self.scenario.model.kv_bytes_per_token(),
            cost,
            pd: self.pd_summary(end, &workers),
        };
        let mut requests = std::mem::take(&mut self.records);
        requests.sort_unstable_by_key(|r| r.id);
        let mut steps: Vec<StepRow> = self.workers.iter_mut().flat_map(Worker::take_step_rows).collect();
        steps.sort_by(|a, b| a.start_s.total_cmp(&b.start_s).then(a.worker.cmp(&b.worker)));
        self.sc25.sort_unstable_by_key(|s| s.serial);
        RunOutput {
            summary,
            latencies: self.latencies,
            series: self.series.finish(end, gauges),
            requests,
            steps,
            peak_live_requests: self.requests.len() as u64,
            workers,
            sc25: sc25_rows(&self.sc25),
            stages: self
                .stage_tallies
                .iter()
                .zip(&self.scenario.stages)
                .enumerate()
                .map(|(i, (t, st))| t.row(i as u32, st.type_name()))
                .collect(),
            event_digest: stats.digest,
            routing_wall_s: self.routing_wall.map(|d| d.as_secs_f64()),
        }
    }
}

impl Cluster<'_> {
    /// What disaggregated prefill/decode did (defaults without it).
    fn pd_summary(&self, end: SimTime, workers: &[WorkerRow]) -> crate::metrics::PdSummary {
        let Some(d) = &self.scenario.disagg else { return crate::metrics::PdSummary::default() };
        let secs = end.as_secs_f64();
        let busy = |role: Role| {
            let rows = workers.iter().filter(|w| w.role == role.name());
            let (busy, alive) = rows.fold((0.0, 0.0), |(b, a), w| (b + w.busy_s, a + (secs - w.started_s)));
            if alive > 0.0 { busy / alive } else { 0.0 }
        };
        let links: Vec<_> = self.connector.link_report(end).collect();
        let decode_links = &links[d.prefill.count as usize..];
        crate::metrics::PdSummary {
            remote_prefills: self.pd_counts.0,
            local_prefills: self.pd_counts.1,
            link_bytes: workers.iter().map(|w| w.link_bytes).sum(),
            link_utilization: if secs > 0.0 && !decode_links.is_empty() {
                decode_links.iter().map(|l| l.busy.as_secs_f64()).sum::<f64>() / (secs * decode_links.len() as f64)
            } else {
                0.0
            },
            kv_transfer_ms: self.latencies.get(LatencyMetric::KvTransfer).stats(),
            first_decode_ms: self.latencies.get(LatencyMetric::FirstDecode).stats(),
            prefill_busy_fraction: busy(Role::Prefill),
            decode_busy_fraction: busy(Role::Decode),
        }
    }
}

fn record(r: &Request) -> RequestRecord {
    let since = |t: Option<SimTime>| t.map(|t| (t - r.arrival).as_secs_f64());
    let tpot = match (r.first_token, r.finished) {
        (Some(f), Some(d)) if r.output_tokens > 1 => Some((d - f).as_secs_f64() / f64::from(r.output_tokens - 1)),
        _ => None,
    };
    RequestRecord {
        id: r.serial,
        stage: r.stage.0,
        worker: r.worker.map(|w| w.0),
        arrival_s: r.arrival.as_secs_f64(),
        prompt_tokens: r.prompt_tokens,
        output_tokens: r.output_tokens,
        prompt_hash: r.content.digest(),
        prefill_tokens_computed: r.prefill_tokens_computed,
        queue_wait_s: since(r.first_scheduled),
        ttft_s: since(r.first_token),
        e2e_s: since(r.responded),
        tpot_s: tpot,
        preemptions: r.preemptions,
        completed: r.responded.is_some(),
        hit_tokens: r.hit_tokens,
        hit_tokens_total: r.hit_tokens_total,
        read_bytes: r.read_bytes,
        kv_fetch_s: r.fetch_time.map(SimDuration::as_secs_f64),
        label: r.label,
    }
}

/// What an `SC25Workload` request contributes to its stage's table.
fn sc25_request(r: &Request) -> Option<Sc25Request> {
    let Label::Sc25 { warm } = r.label else { return None };
    Some(Sc25Request {
        serial: r.serial,
        stage: r.stage,
        warm,
        prompt_tokens: r.prompt_tokens,
        ttft_ms: r.first_token.map(|t| (t - r.arrival).as_secs_f64() * 1e3),
        prefill_tokens: r.prefill_tokens_computed,
        hit_tokens: r.hit_tokens,
        fetch_ms: r.fetch_time.map(|d| d.as_secs_f64() * 1e3),
    })
}

/// Pairs the cold and warm requests of each `SC25Workload` stage (in
/// sending order: the warm pass repeats the cold one's sizes in order). A
/// cold request whose warm one was never sent (the stage was cut short)
/// gets a row without warm numbers.
fn sc25_rows(requests: &[Sc25Request]) -> Vec<Sc25Row> {
    let mut stages: Vec<StageId> = requests.iter().map(|r| r.stage).collect();
    stages.sort_unstable();
    stages.dedup();
    let mut rows = Vec::new();
    for stage in stages {
        let pass = |warm: bool| requests.iter().filter(move |r| r.stage == stage && r.warm == warm);
        let mut warm = pass(true);
        for c in pass(false) {
            let w = warm.next();
            rows.push(Sc25Row {
                prompt_tokens: c.prompt_tokens,
                cold_ttft_ms: c.ttft_ms,
                warm_ttft_ms: w.and_then(|w| w.ttft_ms),
                cold_prefill_tokens: c.prefill_tokens,
                warm_prefill_tokens: w.map_or(0, |w| w.prefill_tokens),
                warm_hit_tokens: w.map_or([0; 4], |w| w.hit_tokens),
                warm_kv_fetch_ms: w.and_then(|w| w.fetch_ms),
            });
        }
    }
    rows
}

impl Model for Cluster<'_> {
    type Event = Event;

    fn handle(&mut self, now: SimTime, event: Event, sched: &mut Scheduler<'_, Event>) {
        if self.fatal.is_some() {
            // The run has failed (e.g. in `advance_to`): nothing more happens.
            return;
        }
        match event {
            Event::Arrival(stage) => self.on_arrival(now, stage, sched),
            Event::StepEnd { worker, version } => self.on_step_end(now, worker, version, sched),
            Event::Device { instance, timer } => {
                self.connector.on_timer(now, instance, timer, &mut self.conn_out);
                self.apply_connector(now, sched);
            }
            Event::KvFlush(w) => {
                let batch = std::mem::take(&mut self.kv_pending[w.index()]);
                self.kv_events += batch.len() as u64;
                self.kv_batches += 1;
                self.inbox.extend(batch.iter().map(|&(t, e)| (w, t, RouterMsg::Kv(e))));
                self.kv_pending[w.index()] = batch;
                self.kv_pending[w.index()].clear();
                if self.scenario.router.collection_interval.0 == 0 {
                    self.drain(now, sched);
                }
            }
            Event::RouterCollect { periodic } => {
                if !periodic {
                    self.draining = false;
                }
                self.drain(now, sched);
                if periodic {
                    sched.after(self.scenario.router.collection_interval, Event::RouterCollect { periodic: true });
                }
            }
            Event::SystemReport => {
                self.materialize_all(now, true);
                let interval = self.scenario.router.system_interval.as_secs_f64();
                for (i, w) in self.workers.iter().enumerate() {
                    let busy = w.busy_at(now);
                    let since = SimDuration(busy.0 - self.reported_busy[i].0).as_secs_f64();
                    self.reported_busy[i] = busy;
                    let e = SystemEvent {
                        running: w.running() as u32,
                        waiting: w.waiting() as u32,
                        kv_usage: w.used_blocks() as f64 / worker_cfg(self.scenario, i).total_blocks as f64,
                        gpu_utilization: if interval > 0.0 { (since / interval).min(1.0) } else { 0.0 },
                    };
                    self.inbox.push_back((WorkerId(i as u32), now, RouterMsg::System(e)));
                }
                sched.after(self.scenario.router.system_interval, Event::SystemReport);
                if self.scenario.router.collection_interval.0 == 0 {
                    self.drain(now, sched);
                }
            }
            Event::ScaleCheck => {
                let a = self.autoscaler.expect("checks are scheduled only with autoscaling");
                let max = self.loads.iter().map(|l| l.outstanding).max().unwrap_or(0);
                match a.check(now, max, self.workers.len() as u32) {
                    ScaleAction::CheckAt(t) => sched.at(t, Event::ScaleCheck),
                    ScaleAction::AddAt(t) => sched.at(t, Event::ScaleUp),
                }
            }
            Event::ScaleUp => {
                self.add_worker(now);
                let a = self.autoscaler.expect("scale-ups are scheduled only with autoscaling");
                sched.at(a.joined(now), Event::ScaleCheck);
            }
        }
    }

    /// Done when every request has responded and every storage operation
    /// (asynchronous writes included) has completed.
    fn finished(&self) -> bool {
        self.fatal.is_some() || (self.workload.finished() && self.in_system.count() == 0 && self.connector.idle())
    }

    fn done(&self) -> u64 {
        self.completed
    }

    fn advance_to(&mut self, now: SimTime) {
        if self.fatal.is_some() {
            return;
        }
        if let Err(e) = beyond_horizon(Some(((), now))) {
            self.fail(e);
            return;
        }
        if !self.series.can_reach(now) {
            self.fail(format!(
                "the run reached {:.0} simulated seconds: at simulation.time_series_interval_sec = {} the time series would need more than {} intervals\n  fix: raise time_series_interval_sec (in [simulation] or [sweep]) to at least {:.3}, or set simulation.simulation_time",
                now.as_secs_f64(),
                self.series.width().as_secs_f64(),
                crate::metrics::MAX_INTERVALS,
                now.as_secs_f64() / crate::metrics::MAX_INTERVALS as f64
            ));
            return;
        }
        while self.series.next_boundary() <= now {
            // The interval's last state: runs of decode steps up to its end.
            self.materialize_all(self.series.next_boundary(), false);
            let g = self.gauges();
            self.series.close_interval(g);
        }
    }
}
