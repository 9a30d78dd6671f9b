//! The cluster: owns every component of one run and is the only place that
//! knows the event enum. Components are passive — the workers, the KV
//! connector and its save rules ([`SaveRules`]), the router ([`Router`])
//! with the P/D hand-over ([`Handover`]), and the metrics recorder
//! ([`Recorder`]) take the time and what happened and return effects; the
//! cluster turns those into events and tells the recorder. It decides
//! nothing itself: what a step saves, whether a response waits for its
//! writes and how a prefilled request moves to its decode worker are the
//! KV layer's and the router's rules, carried out here.
//!
//! KV flow per request: on reaching a worker its blocks' chains are found;
//! the worker's scheduler decides, with the KV connector, what the request
//! already has (GPU prefix, then the tiers) and starts loads; the connector's
//! device timers, finished loads and finished saves come back here as
//! effects and are dispatched to the worker, the router and the recorder.

use crate::config::Scenario;
use crate::engine::{self, EventQueue, Model, Scheduler};
use crate::ids::{RequestId, StageId, WorkerId};
use crate::kvcache::saving::{AfterSave, SaveRules};
use crate::kvcache::{ConnectorOutput, KvConnector};
use crate::metrics::{RowSink, StepRow};
use crate::recorder::{Recorder, RunEnd, gauges};
use crate::request::Arena;
use crate::rng::SeedTree;
use crate::router::pd::{Handover, Next, PdRule, Transfer};
use crate::router::{Autoscaler, RequestView, Router, autoscale::ScaleAction};
use crate::storage::DeviceTimer;
use crate::time::SimTime;
use crate::worker::{StepOutcome, Worker};
use crate::workload::{NewRequest, Workload};

pub use crate::recorder::RunOutput;

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

/// Refuses an event beyond the time a run may reach, naming the likely causes.
fn beyond_horizon<T>(next: Option<(T, SimTime)>) -> Result<Option<(T, SimTime)>, RunError> {
    match next {
        Some((_, t)) if t > crate::time::HORIZON => Err(RunError::Horizon { at_s: t.as_secs_f64() }),
        next => Ok(next),
    }
}

/// Scratch buffers reused across events.
#[derive(Default)]
struct Scratch {
    new_requests: Vec<NewRequest>,
    /// Workers given requests at the current arrival, in the order first given one.
    kicks: Vec<WorkerId>,
    outcome: StepOutcome,
    /// Effects of connector calls not yet applied, and a spare buffer.
    conn_out: ConnectorOutput,
    conn_spare: ConnectorOutput,
}

/// Rows a run holds before handing them to its [`RowSink`] (checked every
/// [`SINK_CHECK_EVENTS`] events, so a table holds at most about twice this
/// many: tens of megabytes whatever the run's length).
const SINK_CHUNK_ROWS: usize = 32_768;
/// Events between two looks at the rows held.
const SINK_CHECK_EVENTS: u32 = 128;

/// The state of one run.
pub struct Cluster<'a> {
    scenario: &'a Scenario,
    arena: Arena,
    workers: Vec<Worker>,
    router: Router<'a>,
    autoscaler: Option<Autoscaler>,
    connector: KvConnector,
    /// What steps and finished requests save to the tiers.
    saving: SaveRules,
    /// The P/D hand-over (with disaggregation).
    handover: Option<Handover>,
    workload: Workload,
    recorder: Recorder,
    scratch: Scratch,
    /// Keep a row per step (the `steps` table).
    log_steps: bool,
    fatal: Option<RunError>,
    /// Events before this time find nothing for [`Model::advance_to`] to
    /// do: before the series' next boundary and within the horizons (or
    /// the run has failed).
    quiet_until: SimTime,
    /// Whether anything reads requests' block hashes (the GPU prefix cache,
    /// a tier, the router's KV index; with disaggregation, always).
    hashes_read: bool,
    /// Where the per-row tables go as the run goes (else they are kept to the end).
    sink: Option<&'a mut dyn RowSink>,
    /// Events since the rows held were last looked at.
    since_sink_check: u32,
}

impl<'a> Cluster<'a> {
    /// A cluster at time zero, per `scenario`.
    pub fn new(scenario: &'a Scenario) -> Cluster<'a> {
        let seeds = SeedTree::new(scenario.seed);
        let pd = scenario.disagg.as_ref().map(|d| PdRule {
            prefill_workers: d.prefill_workers as usize,
            max_local_prefill_length: d.max_local_prefill_length,
            max_prefill_queue_size: d.max_prefill_queue_size,
        });
        let router =
            Router::new(&scenario.router, &scenario.kvc, scenario.worker.block_size, pd, seeds.stream("router"));
        let mut c = Cluster {
            scenario,
            arena: Arena::default(),
            workers: Vec::new(),
            router,
            autoscaler: scenario.router.autoscale.map(Autoscaler::new),
            connector: KvConnector::new(&scenario.kvc, scenario.worker.block_size),
            saving: SaveRules::new(&scenario.kvc, scenario.worker.block_size),
            handover: scenario.disagg.as_ref().map(|d| Handover::new(d.kv_path)),
            workload: Workload::new(scenario.stages.clone(), &seeds),
            recorder: Recorder::new(scenario),
            scratch: Scratch::default(),
            log_steps: false,
            fatal: None,
            quiet_until: SimTime::ZERO,
            hashes_read: false,
            sink: None,
            since_sink_check: 0,
        };
        c.hashes_read = c.router.needs().kv_index
            || !scenario.kvc.tiers.is_empty()
            || scenario.disagg.is_some()
            || scenario.worker.prefix_caching
            || scenario.groups.iter().any(|g| g.pool.worker.prefix_caching);
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
        self.workers.push(Worker::new(id, self.scenario.worker_config(id.index())).seeded(self.scenario.seed));
        if self.log_steps {
            self.workers[id.index()].log_steps();
        }
        self.router.add_worker(id, self.scenario.load_scale(id.index()));
        self.recorder.on_worker_added(now);
        self.connector.add_worker();
        id
    }

    fn fail(&mut self, e: RunError) {
        self.fatal.get_or_insert(e);
    }

    fn schedule_arrival(&mut self, step: crate::workload::Step, sched: &mut Scheduler<'_, Event>) {
        match step.map_err(RunError::Workload).and_then(beyond_horizon) {
            Ok(Some((s, t))) => sched.at(t, Event::Arrival(s)),
            Ok(None) => {}
            Err(e) => self.fail(e),
        }
    }

    fn on_arrival(&mut self, now: SimTime, stage: StageId, sched: &mut Scheduler<'_, Event>) {
        let mut fresh = std::mem::take(&mut self.scratch.new_requests);
        let step = self.workload.on_arrival(now, stage, &mut fresh);
        self.schedule_arrival(step, sched);
        for nr in fresh.drain(..) {
            let (stage, label) = (nr.stage, nr.label);
            let id = self.arena.admit(now, nr);
            let r = &self.arena.requests[id.index()];
            let serial = r.serial;
            let too_long = u64::from(r.prompt_tokens) + u64::from(r.output_tokens) > self.scenario.worker.max_model_len;
            self.recorder.on_arrival(now, stage);
            if too_long {
                // vLLM rejects it outright; it is reported, not queued.
                self.recorder.on_rejected(stage);
                self.retire(id);
                let step = self.workload.on_completion(now, stage, label, false);
                self.schedule_arrival(step, sched);
                continue;
            }
            self.recorder.on_admitted(now, serial);
            let w = self.route(id);
            if !self.scratch.kicks.contains(&w) {
                self.scratch.kicks.push(w);
            }
        }
        self.scratch.new_requests = fresh;
        // The workers plan their next steps once every request of this
        // instant is queued, so requests arriving together are batched.
        let mut kicks = std::mem::take(&mut self.scratch.kicks);
        for w in kicks.drain(..) {
            self.kick(now, w, sched);
        }
        self.scratch.kicks = kicks;
    }

    /// The request is done with (responded or rejected): the recorder
    /// keeps its figures, the arena its slot.
    fn retire(&mut self, id: RequestId) {
        self.recorder.on_retire(&self.arena.requests[id.index()]);
        self.arena.free(id);
    }

    /// Routes the request and queues it at its first worker (the caller kicks it).
    fn route(&mut self, id: RequestId) -> WorkerId {
        let r = &mut self.arena.requests[id.index()];
        // The block chains are the request's, needed by any worker whatever
        // the policy — unless nothing reads them (no prefix caching, no
        // tier, no KV index): then it has none.
        if self.hashes_read {
            r.find_chains(self.scenario.worker.block_size as u32, self.scenario.kvc.save_unfull_chunk);
        }
        let view = RequestView {
            seq: r.chunked(r.seq.num_tokens, self.scenario.worker.block_size),
            prompt_tokens: r.prompt_tokens,
        };
        let workers = &self.workers;
        let routed = self.router.route(view, |w| workers[w.index()].waiting());
        r.worker = Some(routed.worker);
        if routed.predicted_hit_tokens.is_some() {
            r.predicted_hit_tokens = routed.predicted_hit_tokens;
        }
        if let Some(decode) = routed.decode {
            let handover = self.handover.expect("a remote prefill is routed only with disaggregation");
            if handover.routed(r, decode, routed.prefill_tokens).hold_writes {
                self.connector.hold(id);
            }
        }
        let (serial, waiting) = (r.serial, self.workers[routed.worker.index()].waiting());
        self.recorder.on_routed(
            serial,
            routed.worker,
            waiting,
            self.scenario.disagg.as_ref().map(|_| routed.decode.is_some()),
        );
        self.workers[routed.worker.index()].enqueue(id);
        routed.worker
    }

    /// Request `id` is done on its worker (and its awaited writes are
    /// complete): it answers the client or is handed over.
    fn proceed(&mut self, now: SimTime, id: RequestId, sched: &mut Scheduler<'_, Event>) {
        match Handover::next(&self.arena.requests[id.index()]) {
            Next::Respond => self.respond(now, id, sched),
            Next::HandOver => self.hand_over(now, id, sched),
        }
    }

    /// Carries out the hand-over of prefill job `id` (see [`Handover`]).
    fn hand_over(&mut self, now: SimTime, id: RequestId, sched: &mut Scheduler<'_, Event>) {
        let handover = self.handover.expect("prefill jobs exist only with disaggregation");
        let h = handover.hand_over(&mut self.arena.requests[id.index()], now);
        self.router.released(h.prefill);
        self.router.prefilled(h.prefill, h.pending);
        self.recorder.on_handed_over(h.prefill, h.decode);
        if h.release_writes {
            self.connector.release(id);
        }
        match h.then {
            Transfer::Respond => return self.respond(now, id, sched),
            Transfer::PullOverLink => {
                self.workers[h.decode.index()].enqueue(id);
                self.connector.offer_remote(id);
            }
            Transfer::LoadFromStore => self.workers[h.decode.index()].enqueue(id),
        }
        self.kick(now, h.decode, sched);
    }

    /// Lets worker `w` react to a change (see [`Worker::poll`]) and applies
    /// every effect that follows.
    fn kick(&mut self, now: SimTime, w: WorkerId, sched: &mut Scheduler<'_, Event>) {
        self.poll_worker(now, w, sched);
        self.apply_connector(now, sched);
    }

    /// [`Self::kick`] without applying the connector's effects.
    fn poll_worker(&mut self, now: SimTime, w: WorkerId, sched: &mut Scheduler<'_, Event>) {
        if let Some(dp) = &self.scenario.worker.data_parallel {
            return self.poll_rank(now, w, dp.ranks as usize, sched);
        }
        let worker = &mut self.workers[w.index()];
        if let Some((end, version)) = worker.poll(
            now,
            &mut self.arena.requests,
            self.scenario.worker_config(w.index()),
            &mut self.connector,
            &mut self.scratch.conn_out,
        ) {
            sched.at(end, Event::StepEnd { worker: w, version });
        }
        self.record_substeps(w);
        self.drain_cache(now, w);
    }

    /// [`Self::poll_worker`] for rank `w` of a data-parallel group of
    /// `ranks`: while the group's step runs, the rank starts the loads it
    /// can; when the group is idle, every rank plans its step, and if any
    /// planned one the group prices the step (see
    /// [`crate::worker::data_parallel`]) and every
    /// rank's ends with it — those with nothing planned run a dummy batch.
    /// One event ends the group's step, stamped with its first rank's step.
    #[cold]
    #[inline(never)]
    fn poll_rank(&mut self, now: SimTime, w: WorkerId, ranks: usize, sched: &mut Scheduler<'_, Event>) {
        let first = w.index() / ranks * ranks;
        let group = first..first + ranks;
        let cfg = self.scenario.worker_config(first);
        let reqs = &mut self.arena.requests;
        if self.workers[group.clone()].iter().any(|r| r.step_start().is_some()) {
            let (conn, out) = (&mut self.connector, &mut self.scratch.conn_out);
            self.workers[w.index()].start_loads(now, reqs, cfg, conn, out);
            return self.drain_cache(now, w);
        }
        let mut planned = false;
        for r in group.clone() {
            let (conn, out) = (&mut self.connector, &mut self.scratch.conn_out);
            planned |= self.workers[r].poll(now, &mut self.arena.requests, cfg, conn, out).is_some();
            self.drain_cache(now, WorkerId(r as u32));
        }
        if !planned {
            return;
        }
        let dp = cfg.data_parallel.as_ref().expect("a rank's group has data-parallel settings");
        let end = now + dp.step_time(&cfg.perf, self.workers[group.clone()].iter().map(Worker::planned_work));
        let stamp = group.map(|r| self.workers[r].begin_lockstep(now, end, cfg)).reduce(|first, _| first);
        sched.at(end, Event::StepEnd { worker: WorkerId(first as u32), version: stamp.expect("a group has ranks") });
    }

    /// Tells the recorder of the decode steps worker `w` has materialised from a run.
    /// (Most polls materialise none: that is checked here, inlined.)
    #[inline]
    fn record_substeps(&mut self, w: WorkerId) {
        let subs = self.workers[w.index()].substeps_mut();
        if !subs.is_empty() {
            self.recorder.on_substeps(subs);
            subs.clear();
        }
    }

    /// Brings every worker's run of decode steps up to `until` (see
    /// [`Worker::materialize`]) before their state is read.
    fn materialize_all(&mut self, until: SimTime, inclusive: bool) {
        for i in 0..self.workers.len() {
            if self.workers[i].in_run() {
                self.workers[i].materialize(until, inclusive, self.scenario.worker_config(i));
                self.record_substeps(WorkerId(i as u32));
            }
        }
    }

    /// Applies the connector's effects until none are left (applying them
    /// can make more: a finished load lets its worker start others). Most
    /// calls find none: that is checked before the work's own call.
    #[inline]
    fn apply_connector(&mut self, now: SimTime, sched: &mut Scheduler<'_, Event>) {
        if !self.scratch.conn_out.is_empty() {
            self.apply_connector_output(now, sched);
        }
    }

    fn apply_connector_output(&mut self, now: SimTime, sched: &mut Scheduler<'_, Event>) {
        loop {
            // Timers, bytes moved and KV events make no connector output:
            // they are applied where they are.
            let out = &mut self.scratch.conn_out;
            for &(t, instance, timer) in &out.timers {
                sched.at(t, Event::Device { instance, timer });
            }
            for &(tier, bytes) in &out.moved {
                self.recorder.on_tier_bytes(now, tier, bytes);
            }
            for &(w, e) in &out.events {
                if let Some(t) = self.router.publish(w, now, e) {
                    sched.at(t, Event::KvFlush(w));
                }
            }
            out.timers.clear();
            out.moved.clear();
            out.events.clear();
            if out.loaded.is_empty() && out.saved.is_empty() {
                return;
            }
            // Finished loads and saves go on with their workers, which can
            // make more output: that goes to the spare lists, applied next.
            let spare = std::mem::take(&mut self.scratch.conn_spare);
            let mut out = std::mem::replace(&mut self.scratch.conn_out, spare);
            // Every load that finished now first, then each worker once, so
            // that a step planned now sees all of them.
            for d in &out.loaded {
                self.recorder.on_load_done(now, d);
                let cfg = self.scenario.worker_config(d.worker.index());
                self.workers[d.worker.index()].fetched(d, now, &mut self.arena.requests, cfg);
            }
            for (i, d) in out.loaded.iter().enumerate() {
                if out.loaded[..i].iter().all(|e| e.worker != d.worker) {
                    self.poll_worker(now, d.worker, sched);
                }
            }
            for &id in &out.saved {
                self.proceed(now, id, sched);
            }
            out.clear();
            self.scratch.conn_spare = out;
            if self.scratch.conn_out.is_empty() {
                return;
            }
        }
    }

    /// Moves the worker's prefix-cache events to its pending KV events and
    /// has the connector write back evicted chunk-ending blocks if configured.
    /// (The flush of pending events is scheduled when they are next applied.)
    #[inline(always)]
    fn drain_cache(&mut self, now: SimTime, w: WorkerId) {
        let worker = &mut self.workers[w.index()];
        let cache = worker.cache_mut();
        if cache.events.is_empty() && cache.evicted.is_empty() {
            return;
        }
        let mut events = std::mem::take(&mut cache.events);
        let mut evicted = std::mem::take(&mut cache.evicted);
        self.scratch.conn_out.events.extend(events.drain(..).map(|e| (w, e)));
        // Only reported when write-back on eviction is on.
        if !evicted.is_empty() {
            self.connector.save_evicted(now, w, evicted.drain(..), &mut self.scratch.conn_out);
        }
        let cache = self.workers[w.index()].cache_mut();
        cache.events = events;
        cache.evicted = evicted;
    }

    fn on_step_end(&mut self, now: SimTime, worker: WorkerId, version: u32, sched: &mut Scheduler<'_, Event>) {
        if let Some(dp) = &self.scenario.worker.data_parallel {
            return self.on_group_step_end(now, worker, version, dp.ranks as usize, sched);
        }
        let w = &mut self.workers[worker.index()];
        let cfg = self.scenario.worker_config(worker.index());
        if w.finish_step(now, version, &mut self.arena.requests, cfg, &mut self.scratch.outcome).is_err() {
            return;
        }
        self.after_step(now, worker, sched);
        self.kick(now, worker, sched);
    }

    /// The step of the data-parallel group whose first rank is `first` ends:
    /// every rank's step ends, what each produced is taken in, then the
    /// group plans its next.
    #[cold]
    #[inline(never)]
    fn on_group_step_end(
        &mut self,
        now: SimTime,
        first: WorkerId,
        version: u32,
        ranks: usize,
        sched: &mut Scheduler<'_, Event>,
    ) {
        let cfg = self.scenario.worker_config(first.index());
        for r in first.index()..first.index() + ranks {
            let w = &mut self.workers[r];
            let stamp = if r == first.index() { version } else { w.stamp() };
            if w.finish_step(now, stamp, &mut self.arena.requests, cfg, &mut self.scratch.outcome).is_err() {
                debug_assert_eq!(r, first.index(), "a group's ranks end their steps together");
                return;
            }
            self.after_step(now, WorkerId(r as u32), sched);
        }
        self.kick(now, first, sched);
    }

    /// Takes in what worker `worker`'s step that just ended produced
    /// (`self.scratch.outcome`): tokens, saves, completed requests.
    #[inline(never)]
    fn after_step(&mut self, now: SimTime, worker: WorkerId, sched: &mut Scheduler<'_, Event>) {
        self.record_substeps(worker);
        let out = &self.scratch.outcome;
        self.recorder.on_step(now, out);
        for &id in &out.first_tokens {
            let r = &self.arena.requests[id.index()];
            if Handover::first_token_is_clients(r) {
                self.recorder.on_first_token(now, r);
            } else {
                self.recorder.on_prefill_token(now, r);
            }
        }
        for &(id, _) in &out.first_decodes {
            self.recorder.on_first_token(now, &self.arena.requests[id.index()]);
        }
        let (saving, w) = (self.saving, worker);
        let offered = saving.after_step(
            now,
            w,
            &self.scratch.outcome.prefilled,
            &mut self.arena.requests,
            &mut self.connector,
            &mut self.scratch.conn_out,
        );
        self.workers[w.index()].log_saved(offered);
        let done = std::mem::take(&mut self.scratch.outcome.completed);
        for &id in &done {
            let r = &self.arena.requests[id.index()];
            if Handover::next(r) == Next::Respond {
                self.recorder.on_last_token(r);
            }
            let (offered, after) =
                saving.finished(now, w, id, &self.arena.requests, &mut self.connector, &mut self.scratch.conn_out);
            self.workers[w.index()].log_saved(offered);
            if after == AfterSave::Proceed {
                self.proceed(now, id, sched);
            }
        }
        self.scratch.outcome.completed = done;
    }

    /// The response leaves the platform.
    fn respond(&mut self, now: SimTime, id: RequestId, sched: &mut Scheduler<'_, Event>) {
        let r = &mut self.arena.requests[id.index()];
        r.responded = Some(now);
        self.recorder.on_response(now, r);
        let (stage, label) = (r.stage, r.label);
        self.router.released(r.worker.expect("routed"));
        self.retire(id);
        let step = self.workload.on_completion(now, stage, label, true);
        self.schedule_arrival(step, sched);
    }

    /// Hands the rows held to the sink: all of them at the end of the run
    /// (`all`), else each table's once it holds [`SINK_CHUNK_ROWS`].
    fn drain_rows(&mut self, all: bool) {
        let Some(sink) = self.sink.as_deref_mut() else { return };
        let mut result = Ok(());
        if all || self.recorder.records_kept() >= SINK_CHUNK_ROWS {
            result = sink.requests(&self.recorder.take_records());
        }
        if self.log_steps {
            let held: usize = self.workers.iter().map(Worker::step_rows_held).sum();
            if result.is_ok() && (all || held >= SINK_CHUNK_ROWS) {
                let mut steps: Vec<StepRow> = self.workers.iter_mut().flat_map(Worker::take_step_rows).collect();
                sort_steps(&mut steps);
                result = sink.steps(&steps);
            }
        }
        if let Err(e) = result {
            self.fail(RunError::Rows(e.to_string()));
        }
    }

    /// Runs to the end and reports; with a `sink`, the per-row tables go to
    /// it as the run goes (see [`RowSink`]).
    pub fn run(mut self, opts: &RunOptions<'_>, sink: Option<&'a mut dyn RowSink>) -> Result<RunOutput, RunError> {
        self.sink = sink;
        if opts.profile_routing {
            self.router.profile();
        }
        if opts.request_records {
            self.recorder.keep_records();
        }
        self.log_steps = opts.step_records;
        if self.log_steps {
            self.workers.iter_mut().for_each(Worker::log_steps);
        }
        let mut queue = EventQueue::new();
        let r = &self.scenario.router;
        let needs = self.router.needs();
        if needs.kv_index && r.collection_interval.0 > 0 {
            queue.push(SimTime::ZERO + r.collection_interval, Event::RouterCollect { periodic: true });
        }
        if needs.load_reports {
            queue.push(SimTime::ZERO, Event::SystemReport);
        }
        if self.autoscaler.is_some() {
            queue.push(Autoscaler::first_check(), Event::ScaleCheck);
        }
        let first = self.workload.start(SimTime::ZERO).map_err(RunError::Workload).and_then(beyond_horizon)?;
        if let Some((s, t)) = first {
            queue.push(t, Event::Arrival(s));
        }
        let limit = self.scenario.time_limit;
        let stats =
            engine::run(&mut self, &mut queue, limit, engine::Watch { stop: opts.stop, progress: opts.progress });
        if let Some(e) = self.fatal.take() {
            return Err(e);
        }
        if stats.stop == engine::StopReason::Interrupted {
            return Err(RunError::Interrupted { sim_time_s: stats.end_time.as_secs_f64() });
        }
        if stats.stop == engine::StopReason::QueueEmpty {
            let stuck: Vec<String> = self.workers.iter().filter_map(Worker::describe_held).collect();
            return Err(RunError::Stalled { at_s: stats.end_time.as_secs_f64(), workers: stuck.join("; ") });
        }
        self.materialize_all(stats.end_time, false);
        let mut steps: Vec<_> = self.workers.iter_mut().flat_map(Worker::take_step_rows).collect();
        sort_steps(&mut steps);
        let end = RunEnd {
            scenario: self.scenario,
            stats,
            workers: &self.workers,
            connector: &self.connector,
            router: &self.router,
            workload: &self.workload,
            generated: self.arena.generated,
            peak_live_requests: self.arena.requests.len() as u64,
        };
        let mut out = self.recorder.finish(&end, self.arena.live());
        out.steps = steps;
        if let Some(sink) = self.sink.take() {
            let written = sink.requests(&out.requests).and_then(|()| sink.steps(&out.steps));
            written.map_err(|e| RunError::Rows(e.to_string()))?;
            out.requests = Vec::new();
            out.steps = Vec::new();
        }
        Ok(out)
    }
}

/// The steps table's order: by start, then worker.
fn sort_steps(steps: &mut [StepRow]) {
    steps.sort_by(|a, b| a.start_s.total_cmp(&b.start_s).then(a.worker.cmp(&b.worker)));
}

impl Model for Cluster<'_> {
    type Event = Event;

    fn handle(&mut self, now: SimTime, event: Event, sched: &mut Scheduler<'_, Event>) {
        if self.fatal.is_some() {
            // The run has failed (e.g. in `advance_to`): nothing more happens.
            return;
        }
        if self.sink.is_some() {
            self.since_sink_check += 1;
            if self.since_sink_check >= SINK_CHECK_EVENTS {
                self.since_sink_check = 0;
                self.drain_rows(false);
            }
        }
        match event {
            Event::Arrival(stage) => self.on_arrival(now, stage, sched),
            Event::StepEnd { worker, version } => self.on_step_end(now, worker, version, sched),
            Event::Device { instance, timer } => {
                self.connector.on_timer(now, instance, timer, &mut self.scratch.conn_out);
                self.apply_connector(now, sched);
            }
            Event::KvFlush(w) => {
                if let Some(t) = self.router.flush(w, now, self.recorder.staleness()) {
                    sched.at(t, Event::RouterCollect { periodic: false });
                }
            }
            Event::RouterCollect { periodic } => {
                if let Some(t) = self.router.collect(now, !periodic, self.recorder.staleness()) {
                    sched.at(t, Event::RouterCollect { periodic: false });
                }
                if periodic {
                    sched.after(self.scenario.router.collection_interval, Event::RouterCollect { periodic: true });
                }
            }
            Event::SystemReport => {
                self.materialize_all(now, true);
                let s = self.scenario;
                self.router.report_loads(
                    now,
                    self.workers.iter().enumerate().map(|(i, w)| {
                        let kv_usage = w.used_blocks() as f64 / s.worker_config(i).total_blocks as f64;
                        (w.busy_at(now), w.running() as u32, w.waiting() as u32, kv_usage)
                    }),
                );
                sched.after(s.router.system_interval, Event::SystemReport);
                if let Some(t) = self.router.collect_if_immediate(now, self.recorder.staleness()) {
                    sched.at(t, Event::RouterCollect { periodic: false });
                }
            }
            Event::ScaleCheck => {
                let a = self.autoscaler.expect("checks are scheduled only with autoscaling");
                match a.check(now, self.router.max_outstanding(), self.workers.len() as u32) {
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
        self.fatal.is_some() || (self.workload.finished() && self.recorder.in_system() == 0 && self.connector.idle())
    }

    fn done(&self) -> u64 {
        self.recorder.completed()
    }

    #[inline]
    fn advance_to(&mut self, now: SimTime) {
        if now >= self.quiet_until {
            self.advance_past_quiet(now);
        }
    }
}

impl Cluster<'_> {
    /// [`Model::advance_to`] from [`Self::quiet_until`] on: the run fails
    /// beyond the horizons; the series' intervals up to `now` close.
    #[inline(never)]
    fn advance_past_quiet(&mut self, now: SimTime) {
        if self.fatal.is_some() {
            self.quiet_until = SimTime::MAX;
            return;
        }
        if let Err(e) = beyond_horizon(Some(((), now))) {
            self.fail(e);
            self.quiet_until = SimTime::MAX;
            return;
        }
        let series = self.recorder.series();
        if !series.can_reach(now) {
            let e = RunError::TimeSeries {
                at_s: now.as_secs_f64(),
                interval_s: series.width().as_secs_f64(),
                in_system: self.recorder.in_system(),
                last_response_s: self.recorder.last_response().map(SimTime::as_secs_f64),
            };
            self.fail(e);
            self.quiet_until = SimTime::MAX;
            return;
        }
        while self.recorder.series().next_boundary() <= now {
            // The interval's last state: runs of decode steps up to its end.
            self.materialize_all(self.recorder.series().next_boundary(), false);
            let g = gauges(self.scenario, &self.workers);
            self.recorder.close_interval(g);
        }
        self.quiet_until = self.recorder.series().quiet_until().min(SimTime(crate::time::HORIZON.0 + 1));
    }
}

/// What a run should keep beyond the summary, histograms and time series,
/// and when to give up.
#[derive(Clone, Copy, Debug)]
pub struct RunOptions<'a> {
    /// Build one record per request (memory grows with the request count).
    pub request_records: bool,
    /// Build one record per scheduler step (the `steps` table; memory grows with the steps).
    pub step_records: bool,
    /// Measure the wall time spent routing and maintaining the router's KV
    /// index (for benchmarks; it never influences the simulation).
    pub profile_routing: bool,
    /// Stop the run when this becomes true (checked every few thousand
    /// events, so within milliseconds); the run then fails with
    /// [`RunError::Interrupted`].
    pub stop: Option<&'a std::sync::atomic::AtomicBool>,
    /// Keep this up to date with the simulated time and the requests
    /// completed (every few thousand events), for a progress display.
    pub progress: Option<&'a engine::Progress>,
}

impl Default for RunOptions<'_> {
    fn default() -> Self {
        RunOptions { request_records: true, step_records: false, profile_routing: false, stop: None, progress: None }
    }
}

/// Why a run produced no output.
#[derive(Clone, Debug, PartialEq)]
pub enum RunError {
    /// Input met during the run was unusable (a malformed trace line, a
    /// size beyond a guard), as the workload's message naming it.
    Workload(String),
    /// The next arrival would come after the latest time a run may reach.
    Horizon {
        /// When it would come, simulated seconds.
        at_s: f64,
    },
    /// The run went on so long that its time series would hold too many intervals.
    TimeSeries {
        /// Simulated time reached, seconds.
        at_s: f64,
        /// The interval width, seconds.
        interval_s: f64,
        /// Requests in the system then.
        in_system: u64,
        /// When the last response left, simulated seconds.
        last_response_s: Option<f64>,
    },
    /// Nothing was left to happen while requests were still in the system:
    /// no worker could move any of them (a defect of the simulator's
    /// scheduling rules, reported rather than ended as a short run).
    Stalled {
        /// When the last event happened, simulated seconds.
        at_s: f64,
        /// What the workers holding requests held then.
        workers: String,
    },
    /// The run's grid point has an invalid scenario.
    Config(crate::config::ConfigError),
    /// The simulation broke an invariant (a bug), with the panic's message.
    Panic(String),
    /// The run's rows could not be written as it went (see [`crate::metrics::RowSink`]).
    Rows(String),
    /// [`RunOptions::stop`] was raised; the run had simulated this many seconds.
    Interrupted {
        /// Simulated time reached, seconds.
        sim_time_s: f64,
    },
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Panic(m) => write!(f, "panic: {m}"),
            RunError::Workload(m) => f.write_str(m),
            RunError::Horizon { at_s } => write!(
                f,
                "the next arrival is at {at_s:.3e} simulated seconds, beyond the {:.0e} s a run may reach\n  fix: check the request rates (a rate near 0 spaces arrivals by ages) and the trace timestamps (epoch times need shift_to_first = true, and Mooncake's milliseconds multiplier_to_sec = 0.001)",
                crate::time::HORIZON.as_secs_f64()
            ),
            RunError::TimeSeries { at_s, interval_s, in_system, last_response_s } => {
                write!(
                    f,
                    "the run reached {at_s:.0} simulated seconds: at simulation.time_series_interval_sec = {interval_s} the time series would need more than {} intervals",
                    crate::metrics::MAX_INTERVALS,
                )?;
                let last = last_response_s.map_or("none yet".to_string(), |t| format!("the last at {t:.3} s"));
                write!(f, " ({in_system} requests in the system; responses: {last})")?;
                if *in_system > 0 && last_response_s.is_none_or(|t| t < at_s / 2.0) {
                    write!(
                        f,
                        "\n  the platform had stopped answering: check that the load is one it can serve (a shorter run's queue and preemption columns tell)"
                    )?;
                }
                write!(
                    f,
                    "\n  fix: raise time_series_interval_sec (in [simulation] or [sweep]) to at least {:.3}, or set simulation.simulation_time",
                    at_s / crate::metrics::MAX_INTERVALS as f64
                )
            }
            RunError::Stalled { at_s, workers } => write!(
                f,
                "the run stopped at {at_s:.3} simulated seconds with requests in the system and nothing left to happen: {workers}\n  fix: this is a defect of the simulator's scheduler (please report it with the spec); more KV blocks per worker (gpu_memory_utilization) or fewer sequences (max_num_seqs) may avoid it"
            ),
            RunError::Config(e) => write!(f, "{e}"),
            RunError::Rows(m) => write!(f, "could not write the run's rows: {m}"),
            RunError::Interrupted { sim_time_s } => {
                write!(f, "interrupted by a signal after {sim_time_s:.3} simulated seconds")
            }
        }
    }
}

impl RunError {
    /// Whether the run failed (rather than being interrupted).
    pub fn is_failure(&self) -> bool {
        !matches!(self, RunError::Interrupted { .. })
    }
}

impl std::error::Error for RunError {}

/// Runs one scenario to completion (deterministic: same scenario, same
/// output). Fails only on input met during the run (a malformed trace line).
pub fn simulate(scenario: &Scenario) -> Result<RunOutput, RunError> {
    simulate_with(scenario, &RunOptions::default())
}

/// [`simulate`] with options.
pub fn simulate_with(scenario: &Scenario, opts: &RunOptions<'_>) -> Result<RunOutput, RunError> {
    Cluster::new(scenario).run(opts, None)
}

/// [`simulate_with`], the per-row tables the options ask for handed to
/// `sink` as the run goes (the output's `requests` and `steps` stay empty):
/// memory bounded whatever the run's length.
pub fn simulate_into(
    scenario: &Scenario,
    opts: &RunOptions<'_>,
    sink: &mut dyn RowSink,
) -> Result<RunOutput, RunError> {
    Cluster::new(scenario).run(opts, Some(sink))
}

#[cfg(test)]
mod tests {
    use super::RunError;

    #[test]
    fn a_run_too_long_for_its_time_series_says_whether_the_platform_had_stopped_answering() {
        let e = |in_system, last_response_s| {
            RunError::TimeSeries { at_s: 400_000.0, interval_s: 1.0, in_system, last_response_s }.to_string()
        };
        // Requests waiting and no response for most of the run: the real cause is named.
        let stuck = e(16, Some(12.2));
        assert!(stuck.contains("16 requests in the system; responses: the last at 12.200 s"), "{stuck}");
        assert!(stuck.contains("the platform had stopped answering"), "{stuck}");
        assert!(stuck.contains("fix: raise time_series_interval_sec"), "{stuck}");
        // A long run that kept answering (or had nothing in flight) is only too long.
        assert!(!e(3, Some(399_990.0)).contains("stopped answering"));
        assert!(!e(0, Some(5.0)).contains("stopped answering"));
        assert!(e(2, None).contains("responses: none yet"));
    }
}
