//! The cluster: owns every component of one run and is the only place that
//! knows the event enum. Components are passive; their returned effects are
//! turned into events here.
//!
//! KV flow per request: on reaching a worker its block hashes are computed;
//! under an I/O slot the cluster looks up the longest cached prefix (GPU
//! prefix cache, then the tiers below, chunk by chunk, each chunk from the
//! fastest tier holding it) and, if part of it is below the GPU, allocates
//! GPU blocks and reads those chunks (pinned until read) from the tiers'
//! devices; when every read is done the request is ready. After its last
//! token its chunks are written to the tiers (write-through or spill,
//! synchronously or not).

use crate::config::Scenario;
use crate::engine::{self, EventQueue, Model, RunStats, Scheduler};
use crate::ids::{RequestId, StageId, WorkerId};
use crate::kvcache::{
    BlockHash, ChunkStore, KvEvent, KvEventKind, Reserve, Tier, WriteMode, WritePolicy, block_hashes,
};
use crate::metrics::{
    Gauges, InSystem, IntervalRow, Latencies, LatencyMetric, RequestRecord, RunSummary, Sc25Row, TierSummary,
    TimeSeries, WorkerRow,
};
use crate::request::Request;
use crate::rng::{SeedTree, StreamRng};
use crate::router::{
    Autoscaler, KvIndex, Match, Policy, RouteContext, RoutingPolicy, SystemEvent, WorkerLoad, autoscale::ScaleAction,
};
use crate::storage::{Device, DeviceOutput, DeviceTimer, OpId, OpKind};
use crate::time::{SimDuration, SimTime};
use crate::worker::{StepOutcome, Worker};
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

/// Per-worker counters for the workers table.
#[derive(Clone, Copy, Debug, Default)]
struct WorkerStats {
    started: SimTime,
    routed: u64,
    completed: u64,
    prompt_tokens: u64,
    hit_tokens: u64,
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
    /// One row per worker (including those added by autoscaling).
    pub workers: Vec<WorkerRow>,
    /// Cold and warm TTFT per prompt size of `SC25Workload` stages (empty without one).
    pub sc25: Vec<Sc25Row>,
    /// Digest of the event sequence (equal digests: identical runs).
    pub event_digest: u64,
    /// Wall seconds spent routing and applying router events (when profiled).
    pub routing_wall_s: Option<f64>,
}

/// One tier's store and device (per worker for CPU/NVMe, one for the DFS).
struct TierInstance {
    tier: Tier,
    store: ChunkStore,
    device: Device,
}

enum Purpose {
    Fetch { request: RequestId, keys: Vec<BlockHash> },
    Write { keys: Vec<BlockHash>, waiter: Option<RequestId>, worker: WorkerId },
}

struct IoOp {
    instance: u32,
    purpose: Purpose,
}

/// The state of one run.
pub struct Cluster<'a> {
    scenario: &'a Scenario,
    requests: Vec<Request>,
    workers: Vec<Worker>,
    outstanding: Vec<u32>,
    loads: Vec<WorkerLoad>,
    policy: RoutingPolicy,
    router_rng: StreamRng,
    index: KvIndex,
    inbox: VecDeque<(WorkerId, SimTime, RouterMsg)>,
    draining: bool,
    /// The router's view of each worker (its last system event).
    system: Vec<SystemEvent>,
    /// Each worker's busy time at its last system event.
    reported_busy: Vec<SimDuration>,
    scores: Vec<Match>,
    keys: Vec<BlockHash>,
    autoscaler: Option<Autoscaler>,
    worker_stats: Vec<WorkerStats>,
    workload: Workload,
    new_requests: Vec<NewRequest>,
    outcome: StepOutcome,
    instances: Vec<TierInstance>,
    /// Per worker: its tier instances in lookup order.
    worker_tiers: Vec<Vec<u32>>,
    ops: Vec<Option<IoOp>>,
    free_ops: Vec<u32>,
    dev_out: DeviceOutput,
    kv_pending: Vec<Vec<(SimTime, KvEvent)>>,
    kv_events: u64,
    kv_batches: u64,
    latencies: Latencies,
    series: TimeSeries,
    in_system: InSystem,
    completed: u64,
    rejected: u64,
    completed_prompt_tokens: u64,
    completed_output_tokens: u64,
    fatal: Option<String>,
    /// Wall time spent routing, when profiling (never read by the simulation).
    routing_wall: Option<std::time::Duration>,
}

impl<'a> Cluster<'a> {
    /// A cluster at time zero, per `scenario`.
    pub fn new(scenario: &'a Scenario) -> Cluster<'a> {
        let seeds = SeedTree::new(scenario.seed);
        let mut c = Cluster {
            scenario,
            requests: Vec::new(),
            workers: Vec::new(),
            outstanding: Vec::new(),
            loads: Vec::new(),
            policy: RoutingPolicy::from_config(&scenario.router),
            router_rng: seeds.stream("router"),
            index: KvIndex::default(),
            inbox: VecDeque::new(),
            draining: false,
            system: Vec::new(),
            reported_busy: Vec::new(),
            scores: Vec::new(),
            keys: Vec::new(),
            autoscaler: scenario.router.autoscale.map(Autoscaler::new),
            worker_stats: Vec::new(),
            workload: Workload::new(scenario.stages.clone(), &seeds),
            new_requests: Vec::new(),
            outcome: StepOutcome::default(),
            instances: Vec::new(),
            worker_tiers: Vec::new(),
            ops: Vec::new(),
            free_ops: Vec::new(),
            dev_out: DeviceOutput::default(),
            kv_pending: Vec::new(),
            kv_events: 0,
            kv_batches: 0,
            latencies: Latencies::default(),
            series: TimeSeries::new(scenario.interval),
            in_system: InSystem::default(),
            completed: 0,
            rejected: 0,
            completed_prompt_tokens: 0,
            completed_output_tokens: 0,
            fatal: None,
            routing_wall: None,
        };
        for _ in 0..scenario.num_workers {
            c.add_worker(SimTime::ZERO);
        }
        c
    }

    fn new_instance(&mut self, t: &crate::kvcache::TierConfig) -> u32 {
        self.instances.push(TierInstance {
            tier: t.tier,
            store: ChunkStore::new(t.capacity_bytes, t.eviction),
            device: Device::new(t.device),
        });
        (self.instances.len() - 1) as u32
    }

    /// Adds a worker with cold caches (and its per-worker tiers) at `now`.
    fn add_worker(&mut self, now: SimTime) -> WorkerId {
        let id = WorkerId(self.workers.len() as u32);
        self.workers.push(Worker::new(id, &self.scenario.worker));
        self.outstanding.push(0);
        self.kv_pending.push(Vec::new());
        self.system.push(SystemEvent::default());
        self.reported_busy.push(SimDuration(0));
        self.worker_stats.push(WorkerStats { started: now, ..WorkerStats::default() });
        let mut tiers = Vec::new();
        for t in &self.scenario.kvc.tiers {
            let shared = t.tier == Tier::Dfs;
            let existing = if shared { self.instances.iter().position(|i| i.tier == Tier::Dfs) } else { None };
            tiers.push(match existing {
                Some(i) => i as u32,
                None => self.new_instance(t),
            });
        }
        self.worker_tiers.push(tiers);
        id
    }

    fn gauges(&self) -> Gauges {
        Gauges {
            queue_depth: self.workers.iter().map(|w| w.waiting() as u64).sum(),
            running: self.workers.iter().map(|w| w.running() as u64).sum(),
            active_workers: self.workers.len() as u32,
            used_blocks: self.workers.iter().map(Worker::used_blocks).sum(),
            total_blocks: self.scenario.worker.total_blocks * self.workers.len() as u64,
        }
    }

    fn fail(&mut self, message: String) {
        self.fatal.get_or_insert(message);
    }

    fn schedule_arrival(&mut self, step: crate::workload::Step, sched: &mut Scheduler<'_, Event>) {
        match step {
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
            let id = RequestId(self.requests.len() as u32);
            let (stage, label) = (nr.stage, nr.label);
            let r = Request::new(id, now, nr);
            let too_long = u64::from(r.prompt_tokens) + u64::from(r.output_tokens) > self.scenario.worker.max_model_len;
            self.requests.push(r);
            if too_long {
                // vLLM rejects it outright; it is reported, not queued.
                self.rejected += 1;
                let step = self.workload.on_completion(now, stage, label, false);
                self.schedule_arrival(step, sched);
                continue;
            }
            self.in_system.change(now, 1);
            self.route(now, id, sched);
        }
        self.new_requests = fresh;
    }

    fn route(&mut self, now: SimTime, id: RequestId, sched: &mut Scheduler<'_, Event>) {
        // The block hashes are the request's, needed by any worker whatever the policy.
        let r = &mut self.requests[id.index()];
        let content = r.full_content();
        block_hashes(&content, self.scenario.worker.block_size as u32, usize::MAX, &mut r.blocks);
        let started = self.routing_wall.map(|_| std::time::Instant::now());
        let w = self.choose_worker(id);
        if let (Some(t), Some(acc)) = (started, self.routing_wall.as_mut()) {
            *acc += t.elapsed();
        }
        self.workers[w.index()].enqueue(id);
        self.pump(now, w, sched);
        self.kick(now, w, sched);
    }

    /// The routing decision (and its bookkeeping) for request `id`.
    fn choose_worker(&mut self, id: RequestId) -> WorkerId {
        self.loads.clear();
        self.loads.extend(self.workers.iter().map(|w| WorkerLoad {
            id: w.id(),
            outstanding: self.outstanding[w.id().index()],
            system: self.system[w.id().index()],
        }));
        let mut chunks = 0;
        if self.scenario.router.policy.reads_kv_events() {
            let r = &self.requests[id.index()];
            let limit = self.scenario.worker.max_hit_blocks(r.seq.num_tokens).min(r.blocks.len()) as u64;
            self.keys.clear();
            let mut j = 0;
            while let Some((key, _, _)) = self.chunk(&r.blocks, j, limit) {
                self.keys.push(key);
                j += 1;
            }
            chunks = self.keys.len() as u32;
            self.index.score(&self.keys, self.workers.len(), &self.scenario.router.tier_weights, &mut self.scores);
        } else {
            self.scores.clear();
        }
        let ctx = RouteContext { workers: &self.loads, prefix: &self.scores, chunks };
        let w = self.policy.choose(&ctx, &mut self.router_rng);
        self.outstanding[w.index()] += 1;
        self.worker_stats[w.index()].routed += 1;
        let r = &mut self.requests[id.index()];
        r.worker = Some(w);
        if chunks > 0 || self.scenario.router.policy.reads_kv_events() {
            let matched = self.scores.get(w.index()).map_or(0, |m| u64::from(m.chunks));
            let cfg = &self.scenario.worker;
            let max_hit = cfg.max_hit_blocks(r.seq.num_tokens) as u64 * cfg.block_size;
            r.predicted_hit_tokens = Some((matched * self.scenario.kvc.chunk_blocks * cfg.block_size).min(max_hit));
        }
        w
    }

    /// Starts a step on `w` if it is idle and has work.
    fn kick(&mut self, now: SimTime, w: WorkerId, sched: &mut Scheduler<'_, Event>) {
        if let Some((end, version)) = self.workers[w.index()].try_start(now, &mut self.requests, &self.scenario.worker)
        {
            sched.at(end, Event::StepEnd { worker: w, version });
        }
        self.drain_cache(now, w, sched);
    }

    /// The chunk of blocks `[j·m, …)` of a `limit`-block prefix: its key and block range.
    fn chunk(&self, blocks: &[BlockHash], j: u64, limit: u64) -> Option<(BlockHash, u64, u64)> {
        let m = self.scenario.kvc.chunk_blocks;
        let start = j * m;
        let end = ((j + 1) * m).min(limit);
        if end <= start || (end < (j + 1) * m && !self.scenario.kvc.save_unfull_chunk) {
            return None;
        }
        Some((blocks[end as usize - 1], start, end))
    }

    /// Starts KV fetches for the head of `w`'s waiting queue: looks up each
    /// candidate's cached prefix (GPU first, then the tiers chunk by chunk,
    /// each chunk from the fastest tier holding it) and, if part of it is
    /// below the GPU, allocates GPU blocks for it and reads it (pinned until
    /// read). A request is searched once, when it comes within `io_slots` of
    /// the head (chunks written after that are not used by it).
    fn pump(&mut self, now: SimTime, w: WorkerId, sched: &mut Scheduler<'_, Event>) {
        if self.worker_tiers[w.index()].is_empty() {
            return;
        }
        let cfg = &self.scenario.worker;
        let m = self.scenario.kvc.chunk_blocks;
        for id in self.workers[w.index()].fetch_candidates(&self.requests, cfg) {
            if !self.workers[w.index()].io_slot_free(cfg) {
                break;
            }
            let r = &self.requests[id.index()];
            let limit = cfg.max_hit_blocks(r.seq.num_tokens).min(r.blocks.len());
            let worker = &mut self.workers[w.index()];
            let gpu = worker.cache_mut().lookup(&r.blocks[..limit]) as u64;
            let mut runs: Vec<(u32, u64, Vec<BlockHash>)> = Vec::new(); // (instance, blocks, keys)
            let mut next = gpu;
            let mut j = gpu / m;
            while let Some((key, _, end)) = self.chunk(&r.blocks, j, limit as u64) {
                let Some(&inst) =
                    self.worker_tiers[w.index()].iter().find(|&&i| self.instances[i as usize].store.contains(key))
                else {
                    break;
                };
                match runs.last_mut() {
                    Some(run) if run.0 == inst => {
                        run.1 += end - next;
                        run.2.push(key);
                    }
                    _ => runs.push((inst, end - next, vec![key])),
                }
                next = end;
                j += 1;
            }
            let fetched = next - gpu;
            if fetched == 0 {
                self.requests[id.index()].seq.tiers_checked = true;
                continue;
            }
            let worker = &mut self.workers[w.index()];
            let idle = worker.running() == 0;
            let cache = worker.cache_mut();
            let path = cache.acquire(&self.requests[id.index()].blocks, gpu as usize, now);
            if !cache.can_allocate(fetched, now, idle) {
                cache.release(path, now);
                break; // retried when blocks are freed
            }
            cache.allocate(fetched, now, idle);
            worker.begin_fetch(id, &mut self.requests);
            let bb = self.scenario.kvc.block_bytes;
            let r = &mut self.requests[id.index()];
            r.seq.tiers_checked = true;
            r.seq.path = path;
            r.seq.registered = gpu;
            r.seq.computed = (gpu + fetched) * cfg.block_size;
            r.fetch = Some((now, runs.len() as u32));
            r.fetched =
                Some((gpu, runs.iter().map(|(inst, n, _)| (self.instances[*inst as usize].tier, *n)).collect()));
            for (inst, n, keys) in runs {
                let store = &mut self.instances[inst as usize].store;
                for &k in &keys {
                    store.pin(k);
                    store.touch(k);
                }
                self.submit(now, inst, OpKind::Read, n * bb, w, Purpose::Fetch { request: id, keys }, sched);
            }
        }
        self.drain_cache(now, w, sched);
    }

    #[allow(clippy::too_many_arguments)]
    fn submit(
        &mut self,
        now: SimTime,
        inst: u32,
        kind: OpKind,
        bytes: u64,
        w: WorkerId,
        purpose: Purpose,
        sched: &mut Scheduler<'_, Event>,
    ) {
        let op = IoOp { instance: inst, purpose };
        let id = match self.free_ops.pop() {
            Some(i) => {
                self.ops[i as usize] = Some(op);
                i
            }
            None => {
                self.ops.push(Some(op));
                (self.ops.len() - 1) as u32
            }
        };
        let mut out = std::mem::take(&mut self.dev_out);
        self.instances[inst as usize].device.submit(now, OpId(id), kind, bytes, w.0, &mut out);
        self.apply_device(now, inst, &mut out, sched);
        self.dev_out = out;
    }

    fn apply_device(&mut self, now: SimTime, inst: u32, out: &mut DeviceOutput, sched: &mut Scheduler<'_, Event>) {
        for &(t, timer) in &out.timers {
            sched.at(t, Event::Device { instance: inst, timer });
        }
        out.timers.clear();
        // Completions can submit new operations (re-entering this device's
        // output), so they are taken out first.
        let mut completed = std::mem::take(&mut out.completed);
        for &c in &completed {
            self.series.on_tier_bytes(now, self.instances[inst as usize].tier, c.bytes);
            let op = self.ops[c.op.0 as usize].take().expect("completed op is live");
            self.free_ops.push(c.op.0);
            self.op_done(now, op, c.bytes, sched);
        }
        completed.clear();
        if out.completed.is_empty() {
            out.completed = completed;
        }
    }

    fn op_done(&mut self, now: SimTime, op: IoOp, bytes: u64, sched: &mut Scheduler<'_, Event>) {
        let tier = self.instances[op.instance as usize].tier;
        match op.purpose {
            Purpose::Fetch { request, keys } => {
                let store = &mut self.instances[op.instance as usize].store;
                keys.iter().for_each(|&k| store.unpin(k));
                let cfg = &self.scenario.worker;
                let r = &mut self.requests[request.index()];
                r.read_bytes[tier.index()] += bytes;
                let (start, left) = r.fetch.expect("fetching");
                if left > 1 {
                    r.fetch = Some((start, left - 1));
                    return;
                }
                r.fetch = None;
                let took = now - start;
                r.fetch_time = Some(took);
                self.latencies.get_mut(LatencyMetric::KvFetch).record(took);
                let w = r.worker.expect("routed");
                self.workers[w.index()].fetched(request, now, &mut self.requests, cfg);
                self.pump(now, w, sched);
                self.kick(now, w, sched);
            }
            Purpose::Write { keys, waiter, worker } => {
                for k in keys {
                    if self.instances[op.instance as usize].store.complete(k) {
                        self.kv_event(now, worker, KvEvent { tier, hash: k, kind: KvEventKind::Stored }, sched);
                    }
                }
                if let Some(id) = waiter {
                    let r = &mut self.requests[id.index()];
                    r.pending_writes -= 1;
                    if r.pending_writes == 0 {
                        self.respond(now, id, sched);
                    }
                }
            }
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
    /// writes back evicted chunk-ending blocks if configured.
    fn drain_cache(&mut self, now: SimTime, w: WorkerId, sched: &mut Scheduler<'_, Event>) {
        let cache = self.workers[w.index()].cache_mut();
        if cache.events.is_empty() && cache.evicted.is_empty() {
            return;
        }
        let mut events = std::mem::take(&mut cache.events);
        let mut evicted = std::mem::take(&mut cache.evicted);
        let pending = &mut self.kv_pending[w.index()];
        if pending.is_empty() && !events.is_empty() {
            sched.at(now + self.scenario.kvc.event_coalesce, Event::KvFlush(w));
        }
        pending.extend(events.drain(..).map(|e| (now, e)));
        if !evicted.is_empty() {
            // Only reported when write-back on eviction is on (and there is a tier).
            let first = self.worker_tiers[w.index()][0];
            let bytes = self.scenario.kvc.chunk_blocks * self.scenario.kvc.block_bytes;
            let chunks: Vec<(BlockHash, u64)> = evicted.drain(..).map(|(h, _)| (h, bytes)).collect();
            self.write_chunks(now, w, first, &chunks, None, sched);
        }
        let cache = self.workers[w.index()].cache_mut();
        cache.events = events;
        cache.evicted = evicted;
    }

    /// Reserves and writes `chunks` to tier instance `inst`; with the spill
    /// policy, what it evicts goes on to the next tier. Returns write ops issued.
    fn write_chunks(
        &mut self,
        now: SimTime,
        w: WorkerId,
        inst: u32,
        chunks: &[(BlockHash, u64)],
        waiter: Option<RequestId>,
        sched: &mut Scheduler<'_, Event>,
    ) -> u32 {
        let tier = self.instances[inst as usize].tier;
        let mut keys = Vec::with_capacity(chunks.len());
        let mut bytes = 0;
        let mut spilled = Vec::new();
        for &(k, b) in chunks {
            if self.instances[inst as usize].store.reserve(k, b, &mut spilled) == Reserve::Reserved {
                keys.push(k);
                bytes += b;
            }
        }
        for &(v, _) in &spilled {
            self.kv_event(now, w, KvEvent { tier, hash: v, kind: KvEventKind::Removed }, sched);
        }
        let mut ops = 0;
        if !keys.is_empty() {
            self.submit(now, inst, OpKind::Write, bytes, w, Purpose::Write { keys, waiter, worker: w }, sched);
            ops += 1;
        }
        if self.scenario.kvc.write_policy == WritePolicy::Spill && !spilled.is_empty() {
            let tiers = &self.worker_tiers[w.index()];
            if let Some(pos) = tiers.iter().position(|&i| i == inst)
                && let Some(&next) = tiers.get(pos + 1)
            {
                ops += self.write_chunks(now, w, next, &spilled, waiter, sched);
            }
        }
        ops
    }

    /// Writes a finished request's chunks to the tiers; returns write ops issued.
    fn store(&mut self, now: SimTime, id: RequestId, sched: &mut Scheduler<'_, Event>) -> u32 {
        let w = self.requests[id.index()].worker.expect("routed");
        if self.worker_tiers[w.index()].is_empty() {
            return 0;
        }
        let kvc = &self.scenario.kvc;
        let r = &self.requests[id.index()];
        let full = (r.seq.computed / self.scenario.worker.block_size).min(r.blocks.len() as u64);
        let chunks: Vec<(BlockHash, u64)> = (0..full.div_ceil(kvc.chunk_blocks))
            .filter_map(|j| self.chunk(&r.blocks, j, full))
            .map(|(key, start, end)| (key, (end - start) * kvc.block_bytes))
            .collect();
        let waiter = (kvc.write_mode == WriteMode::Sync).then_some(id);
        let targets = match kvc.write_policy {
            WritePolicy::WriteThrough => self.worker_tiers[w.index()].len(),
            WritePolicy::Spill => 1,
        };
        (0..targets).map(|i| self.write_chunks(now, w, self.worker_tiers[w.index()][i], &chunks, waiter, sched)).sum()
    }

    fn on_step_end(&mut self, now: SimTime, worker: WorkerId, version: u32, sched: &mut Scheduler<'_, Event>) {
        let w = &mut self.workers[worker.index()];
        if w.finish_step(now, version, &mut self.requests, &self.scenario.worker, &mut self.outcome).is_err() {
            return;
        }
        let out = &self.outcome;
        self.series.on_busy(now - out.duration, now);
        self.series.on_tokens(now, out.prompt_tokens, out.generated_tokens);
        self.latencies.get_mut(LatencyMetric::Itl).record_n(out.duration, out.decodes);
        for &gap in &out.resumed_gaps {
            self.latencies.get_mut(LatencyMetric::Itl).record(gap);
        }
        for &id in &out.first_tokens {
            let r = &self.requests[id.index()];
            let ttft = now - r.arrival;
            self.latencies.get_mut(LatencyMetric::Ttft).record(ttft);
            let wait = r.first_scheduled.expect("a request with a token was scheduled") - r.arrival;
            self.latencies.get_mut(LatencyMetric::QueueWait).record(wait);
            self.series.on_first_token(now, ttft, &r.hit_tokens);
        }
        let done = std::mem::take(&mut self.outcome.completed);
        for &id in &done {
            let r = &self.requests[id.index()];
            if r.output_tokens > 1 {
                let ttft = r.first_token.expect("completed request has a first token") - r.arrival;
                let decode = (r.finished.expect("completed") - r.arrival).0 - ttft.0;
                self.latencies
                    .get_mut(LatencyMetric::Tpot)
                    .record(SimDuration(decode / u64::from(r.output_tokens - 1)));
            }
            let ops = self.store(now, id, sched);
            if ops > 0 && self.scenario.kvc.write_mode == WriteMode::Sync {
                self.requests[id.index()].pending_writes = ops;
            } else {
                self.respond(now, id, sched);
            }
        }
        self.outcome.completed = done;
        self.drain_cache(now, worker, sched);
        self.pump(now, worker, sched);
        self.kick(now, worker, sched);
    }

    /// The response leaves the platform: end-to-end accounting.
    fn respond(&mut self, now: SimTime, id: RequestId, sched: &mut Scheduler<'_, Event>) {
        let r = &mut self.requests[id.index()];
        // Content and hashes are not needed once the response is out.
        r.blocks = Vec::new();
        r.content = crate::kvcache::Content::default();
        let e2e = now - r.arrival;
        r.responded = Some(now);
        self.latencies.get_mut(LatencyMetric::E2e).record(e2e);
        self.completed += 1;
        self.completed_prompt_tokens += u64::from(r.prompt_tokens);
        self.completed_output_tokens += u64::from(r.output_tokens);
        let (stage, label) = (r.stage, r.label);
        let w = r.worker.expect("routed");
        let stats = &mut self.worker_stats[w.index()];
        stats.completed += 1;
        stats.prompt_tokens += u64::from(r.prompt_tokens);
        stats.hit_tokens += r.hit_tokens.iter().sum::<u64>();
        self.outstanding[w.index()] -= 1;
        self.in_system.change(now, -1);
        self.series.on_completion(now);
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
                    RouterMsg::System(e) => self.system[w.index()] = e,
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
    pub fn run(mut self, opts: &crate::RunOptions) -> Result<RunOutput, String> {
        if opts.profile_routing {
            self.routing_wall = Some(std::time::Duration::ZERO);
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
        match self.workload.start(SimTime::ZERO) {
            Ok(Some((s, t))) => queue.push(t, Event::Arrival(s)),
            Ok(None) => {}
            Err(e) => return Err(e),
        }
        let limit = self.scenario.time_limit;
        let stats = engine::run(&mut self, &mut queue, limit);
        if let Some(e) = self.fatal.take() {
            return Err(e);
        }
        Ok(self.report(stats, opts))
    }

    fn report(mut self, stats: RunStats, opts: &crate::RunOptions) -> RunOutput {
        let end = stats.end_time;
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
        let mut tiers = TierSummary::default();
        let mut prompt = 0u64;
        for r in self.requests.iter().filter(|r| r.first_scheduled.is_some()) {
            prompt += u64::from(r.prompt_tokens);
            for t in Tier::ALL {
                tiers.hit_tokens[t.index()] += r.hit_tokens[t.index()];
            }
        }
        tiers.prompt_tokens = prompt;
        let mut instances = [0u64; 4];
        for inst in &self.instances {
            let s = inst.device.stats_at(end);
            let t = inst.tier.index();
            tiers.bytes_read[t] += s.bytes_read;
            tiers.bytes_written[t] += s.bytes_written;
            tiers.device_busy_s[t] += s.busy.as_secs_f64();
            instances[t] += 1;
            let cap = inst.store.capacity();
            if cap > 0 {
                tiers.occupancy_peak[t] = tiers.occupancy_peak[t].max(inst.store.peak() as f64 / cap as f64);
            }
        }
        for ((util, busy), &n) in tiers.device_utilization.iter_mut().zip(&tiers.device_busy_s).zip(&instances) {
            *util = if n > 0 && secs > 0.0 { busy / (n as f64 * secs) } else { 0.0 };
        }
        let gauges = self.gauges();
        let summary = RunSummary {
            requests_generated: self.requests.len() as u64,
            requests_completed: self.completed,
            requests_rejected: self.rejected,
            requests_incomplete: self.requests.len() as u64 - self.completed - self.rejected,
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
            gpu_utilization: if worker_time > 0.0 { busy as f64 / worker_time } else { 0.0 },
            preemptions: self.workers.iter().map(Worker::preemptions).sum(),
            prefill_tokens_computed: self.requests.iter().map(|r| r.prefill_tokens_computed).sum(),
            mean_requests_in_system: self.in_system.mean(end),
            workers: self.workers.len() as u32,
            tiers,
            kv_events: self.kv_events + self.kv_pending.iter().map(|p| p.len() as u64).sum::<u64>(),
            kv_event_batches: self.kv_batches,
            kv_staleness_ms: self.latencies.get(LatencyMetric::KvStaleness).stats(),
            routing_mispredictions: {
                let chunk_tokens = self.scenario.kvc.chunk_blocks * self.scenario.worker.block_size;
                let (mut n, mut wrong) = (0u64, 0u64);
                for r in self.requests.iter().filter(|r| r.first_scheduled.is_some()) {
                    if let Some(p) = r.predicted_hit_tokens {
                        n += 1;
                        wrong += u64::from(p.abs_diff(r.hit_tokens.iter().sum()) >= chunk_tokens);
                    }
                }
                if n > 0 { wrong as f64 / n as f64 } else { 0.0 }
            },
            trace_lines_skipped: self.workload.skipped_lines(),
            sessions_truncated: self.workload.sessions_truncated(),
        };
        let requests = if opts.request_records { self.requests.iter().map(record).collect() } else { Vec::new() };
        let workers = self
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
                    utilization: if alive > 0.0 { busy / alive } else { 0.0 },
                    preemptions: w.preemptions(),
                    chunks_indexed: self.index.held_by(w.id()),
                }
            })
            .collect();
        RunOutput {
            summary,
            latencies: self.latencies,
            series: self.series.finish(end, gauges),
            requests,
            workers,
            sc25: sc25_rows(&self.requests),
            event_digest: stats.digest,
            routing_wall_s: self.routing_wall.map(|d| d.as_secs_f64()),
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
        id: r.id.0,
        stage: r.stage.0,
        worker: r.worker.map(|w| w.0),
        arrival_s: r.arrival.as_secs_f64(),
        prompt_tokens: r.prompt_tokens,
        output_tokens: r.output_tokens,
        prefill_tokens_computed: r.prefill_tokens_computed,
        queue_wait_s: since(r.first_scheduled),
        ttft_s: since(r.first_token),
        e2e_s: since(r.responded),
        tpot_s: tpot,
        preemptions: r.preemptions,
        completed: r.responded.is_some(),
        hit_tokens: r.hit_tokens,
        read_bytes: r.read_bytes,
        kv_fetch_s: r.fetch_time.map(SimDuration::as_secs_f64),
        label: r.label,
    }
}

/// Pairs the cold and warm requests of each `SC25Workload` stage, in
/// sending order (the warm pass repeats the cold one's sizes in order). A
/// cold request whose warm one was never sent (the stage was cut short)
/// gets a row without warm numbers.
fn sc25_rows(requests: &[Request]) -> Vec<Sc25Row> {
    let ttft_ms = |r: &Request| r.first_token.map(|t| (t - r.arrival).as_secs_f64() * 1e3);
    let mut stages: Vec<_> =
        requests.iter().filter(|r| matches!(r.label, Label::Sc25 { .. })).map(|r| r.stage).collect();
    stages.dedup();
    let mut rows = Vec::new();
    for stage in stages {
        let pass = |warm: bool| requests.iter().filter(move |r| r.stage == stage && r.label == Label::Sc25 { warm });
        let mut warm = pass(true);
        for c in pass(false) {
            let w = warm.next();
            rows.push(Sc25Row {
                prompt_tokens: c.prompt_tokens,
                cold_ttft_ms: ttft_ms(c),
                warm_ttft_ms: w.and_then(ttft_ms),
                cold_prefill_tokens: c.prefill_tokens_computed,
                warm_prefill_tokens: w.map_or(0, |w| w.prefill_tokens_computed),
                warm_hit_tokens: w.map_or([0; 4], |w| w.hit_tokens),
                warm_kv_fetch_ms: w.and_then(|w| w.fetch_time).map(|d| d.as_secs_f64() * 1e3),
            });
        }
    }
    rows
}

impl Model for Cluster<'_> {
    type Event = Event;

    fn handle(&mut self, now: SimTime, event: Event, sched: &mut Scheduler<'_, Event>) {
        match event {
            Event::Arrival(stage) => self.on_arrival(now, stage, sched),
            Event::StepEnd { worker, version } => self.on_step_end(now, worker, version, sched),
            Event::Device { instance, timer } => {
                let mut out = std::mem::take(&mut self.dev_out);
                self.instances[instance as usize].device.on_timer(now, timer, &mut out);
                self.apply_device(now, instance, &mut out, sched);
                self.dev_out = out;
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
                let interval = self.scenario.router.system_interval.as_secs_f64();
                for (i, w) in self.workers.iter().enumerate() {
                    let busy = w.busy_at(now);
                    let since = SimDuration(busy.0 - self.reported_busy[i].0).as_secs_f64();
                    self.reported_busy[i] = busy;
                    let e = SystemEvent {
                        running: w.running() as u32,
                        waiting: w.waiting() as u32,
                        kv_usage: w.used_blocks() as f64 / self.scenario.worker.total_blocks as f64,
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
                let max = self.outstanding.iter().copied().max().unwrap_or(0);
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
        self.fatal.is_some()
            || (self.workload.finished() && self.in_system.count() == 0 && self.free_ops.len() == self.ops.len())
    }

    fn advance_to(&mut self, now: SimTime) {
        while self.series.next_boundary() <= now {
            let g = self.gauges();
            self.series.close_interval(g);
        }
    }
}
