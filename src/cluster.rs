//! The cluster: owns every component of one run and is the only place that
//! knows the event enum. Components are passive — the workers, the KV
//! connector, the router ([`Router`]) and the metrics recorder
//! ([`Recorder`]) take the time and what happened and return effects; the
//! cluster turns those into events and tells the recorder.
//!
//! KV flow per request: on reaching a worker its block hashes are computed;
//! the worker's scheduler decides, with the KV connector, what the request
//! already has (GPU prefix, then the tiers) and starts loads; the connector's
//! device timers, finished loads and finished saves come back here as
//! effects and are dispatched to the worker, the router and the recorder.
//! After its last token the connector saves the request's KV to the tiers.

use crate::RunError;
use crate::config::Scenario;
use crate::config::disagg::KvPath;
use crate::engine::{self, EventQueue, Model, Scheduler};
use crate::ids::{RequestId, StageId, WorkerId};
use crate::kvcache::{ConnectorOutput, KvConnector, KvEvent, KvcConfig, SaveTiming};
use crate::metrics::{Recorder, RunEnd, StepRecord, gauges};
use crate::request::{Arena, PdPhase, Request};
use crate::rng::SeedTree;
use crate::router::pd::PdRule;
use crate::router::{Autoscaler, RequestView, Router, autoscale::ScaleAction};
use crate::storage::DeviceTimer;
use crate::time::SimTime;
use crate::worker::{StepOutcome, Worker};
use crate::workload::{NewRequest, Workload};

pub use crate::metrics::RunOutput;

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
    /// The decode steps materialised from runs.
    substeps: Vec<StepRecord>,
    /// Effects of connector calls not yet applied, and a spare buffer.
    conn_out: ConnectorOutput,
    conn_spare: ConnectorOutput,
}

/// The state of one run.
pub struct Cluster<'a> {
    scenario: &'a Scenario,
    arena: Arena,
    workers: Vec<Worker>,
    router: Router<'a>,
    autoscaler: Option<Autoscaler>,
    connector: KvConnector,
    workload: Workload,
    recorder: Recorder,
    scratch: Scratch,
    /// Keep a row per step (the `steps` table).
    log_steps: bool,
    fatal: Option<RunError>,
    /// Whether anything reads requests' block hashes (the GPU prefix cache,
    /// a tier, the router's KV index; with disaggregation, always).
    hashes_read: bool,
}

impl<'a> Cluster<'a> {
    /// A cluster at time zero, per `scenario`.
    pub fn new(scenario: &'a Scenario) -> Cluster<'a> {
        let seeds = SeedTree::new(scenario.seed);
        let pd = scenario.disagg.as_ref().map(|d| PdRule {
            prefill_workers: d.prefill.count as usize,
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
            workload: Workload::new(scenario.stages.clone(), &seeds),
            recorder: Recorder::new(scenario),
            scratch: Scratch::default(),
            log_steps: false,
            fatal: None,
            hashes_read: false,
        };
        c.hashes_read = c.router.needs().kv_index
            || !scenario.kvc.tiers.is_empty()
            || scenario.disagg.is_some()
            || scenario.worker.prefix_caching;
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
        self.workers.push(Worker::new(id, self.scenario.worker_config(id.index())));
        if self.log_steps {
            self.workers[id.index()].log_steps();
        }
        self.router.add_worker(id);
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
        // The block hashes are the request's, needed by any worker whatever
        // the policy — unless nothing reads them (no prefix caching, no
        // tier, no KV index): then it has none.
        if self.hashes_read {
            r.hash_blocks(self.scenario.worker.block_size as u32, &mut self.arena.hasher);
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
            if self.scenario.disagg.as_ref().is_some_and(|d| d.kv_path == KvPath::Store) {
                // Its hand-over waits for its prompt's writes to the shared store.
                self.connector.hold(id);
            }
            r.pd = PdPhase::Prefill { decode, output_tokens: r.output_tokens, pending: routed.prefill_tokens };
            // The prefill worker is asked for one token, as the P/D proxies ask vLLM (max_tokens = 1).
            r.output_tokens = 1;
        }
        self.recorder.on_routed(routed.worker, self.scenario.disagg.as_ref().map(|_| routed.decode.is_some()));
        self.workers[routed.worker.index()].enqueue(id);
        routed.worker
    }

    /// A prefill worker finished request `id` (its first token is out): its
    /// prompt's KV is offered to its decode worker, which pulls it over its
    /// link once it has the blocks (see [`Worker::accept_handoff`]).
    fn hand_over(&mut self, now: SimTime, id: RequestId, sched: &mut Scheduler<'_, Event>) {
        let r = &self.arena.requests[id.index()];
        let PdPhase::Prefill { decode, pending, .. } = r.pd else { unreachable!("only prefill jobs are handed over") };
        let prefill = r.worker.expect("routed");
        self.router.released(prefill);
        self.router.prefilled(prefill, pending);
        self.recorder.on_handed_over(prefill, decode);
        let through_store = self.scenario.disagg.as_ref().is_some_and(|d| d.kv_path == KvPath::Store);
        if through_store {
            self.connector.release(id);
        }
        if !self.workers[decode.index()].accept_handoff(id, &mut self.arena.requests, now) {
            // Nothing to decode: the prefill's token was the answer.
            self.respond(now, id, sched);
            return;
        }
        if !through_store {
            // Pulled over the decode worker's link; through the store, its
            // lookup finds the chunks in the shared tier.
            self.connector.offer_remote(id);
        }
        self.kick(now, decode, sched);
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

    /// Tells the recorder of the decode steps worker `w` has materialised from a run.
    fn record_substeps(&mut self, w: WorkerId) {
        let subs = &mut self.scratch.substeps;
        self.workers[w.index()].take_substeps(subs);
        self.recorder.on_substeps(subs);
        subs.clear();
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
        while !self.scratch.conn_out.is_empty() {
            let spare = std::mem::take(&mut self.scratch.conn_spare);
            let mut out = std::mem::replace(&mut self.scratch.conn_out, spare);
            for &(t, instance, timer) in &out.timers {
                sched.at(t, Event::Device { instance, timer });
            }
            for &(tier, bytes) in &out.moved {
                self.recorder.on_tier_bytes(now, tier, bytes);
            }
            for &(w, e) in &out.events {
                self.kv_event(now, w, e, sched);
            }
            // Every load that finished now first, then each worker once, so
            // that a step planned now sees all of them.
            for d in &out.loaded {
                let r = &mut self.arena.requests[d.request.index()];
                for (acc, b) in r.read_bytes.iter_mut().zip(d.bytes) {
                    *acc += b;
                }
                if d.link_bytes == 0 {
                    r.fetch_time.get_or_insert(now - d.started);
                }
                self.recorder.on_load_done(now, d);
                let cfg = self.scenario.worker_config(d.worker.index());
                self.workers[d.worker.index()].fetched(d.request, now, &mut self.arena.requests, cfg);
            }
            for (i, d) in out.loaded.iter().enumerate() {
                if out.loaded[..i].iter().all(|e| e.worker != d.worker) {
                    self.poll_worker(now, d.worker, sched);
                }
            }
            for &id in &out.saved {
                match self.arena.requests[id.index()].pd {
                    PdPhase::Prefill { .. } => self.hand_over(now, id, sched),
                    _ => self.respond(now, id, sched),
                }
            }
            out.clear();
            self.scratch.conn_spare = out;
        }
    }

    fn kv_event(&mut self, now: SimTime, w: WorkerId, e: KvEvent, sched: &mut Scheduler<'_, Event>) {
        if let Some(t) = self.router.publish(w, now, e) {
            sched.at(t, Event::KvFlush(w));
        }
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
        self.scratch.conn_out.events.extend(events.drain(..).map(|e| (w, e)));
        // Only reported when write-back on eviction is on.
        self.connector.save_evicted(now, w, evicted.drain(..).map(|(h, _)| h), &mut self.scratch.conn_out);
        let cache = self.workers[w.index()].cache_mut();
        cache.events = events;
        cache.evicted = evicted;
    }

    fn on_step_end(&mut self, now: SimTime, worker: WorkerId, version: u32, sched: &mut Scheduler<'_, Event>) {
        let w = &mut self.workers[worker.index()];
        let cfg = self.scenario.worker_config(worker.index());
        if w.finish_step(now, version, &mut self.arena.requests, cfg, &mut self.scratch.outcome).is_err() {
            return;
        }
        self.record_substeps(worker);
        let out = &self.scratch.outcome;
        self.recorder.on_step(now, out);
        for &id in &out.first_tokens {
            let r = &self.arena.requests[id.index()];
            match r.pd {
                // The prefill worker's token; the client's comes from the decode worker.
                PdPhase::Prefill { output_tokens, .. } if output_tokens > 1 => self.recorder.on_prefill_token(now, r),
                _ => self.recorder.on_first_token(now, r),
            }
        }
        for &(id, _) in &out.first_decodes {
            self.recorder.on_first_token(now, &self.arena.requests[id.index()]);
        }
        if self.scenario.kvc.save_timing == SaveTiming::OnCompute {
            let prefilled = std::mem::take(&mut self.scratch.outcome.prefilled);
            self.connector.begin_batch();
            for &(id, computed) in &prefilled {
                self.save_computed(now, worker, id, computed);
            }
            self.connector.end_batch(now, worker, &mut self.scratch.conn_out);
            self.scratch.outcome.prefilled = prefilled;
        }
        let done = std::mem::take(&mut self.scratch.outcome.completed);
        for &id in &done {
            let r = &self.arena.requests[id.index()];
            if matches!(r.pd, PdPhase::Prefill { .. }) {
                // The prefill worker's part is done: its prompt goes to the
                // tiers as any finished request's would (LMCache on the
                // prefill worker), and the request moves to its decode worker.
                let seq = r.chunked(u64::from(r.prompt_tokens), self.scenario.worker.block_size);
                let from = save_from(&self.scenario.kvc, r);
                self.connector.save(now, worker, id, &seq, from, &mut self.scratch.conn_out);
                self.workers[worker.index()].log_saved(seq.tokens.saturating_sub(r.seq.saved));
                if !self.connector.finish_saves(id) {
                    self.hand_over(now, id, sched);
                }
                // (Else through the store: handed over when its writes complete.)
                continue;
            }
            self.recorder.on_last_token(r);
            // Its prompt's KV (and its output's with `save_decode_cache`) goes to the tiers.
            let tokens = if self.scenario.kvc.save_decode_cache { r.seq.computed } else { u64::from(r.prompt_tokens) };
            // Saved as computed already (on_compute): LMCache stores nothing more at the finish.
            if tokens > r.seq.saved || self.scenario.kvc.save_timing == SaveTiming::OnFinish {
                let seq = r.chunked(tokens, self.scenario.worker.block_size);
                let from = save_from(&self.scenario.kvc, r);
                self.connector.save(now, worker, id, &seq, from, &mut self.scratch.conn_out);
                self.workers[worker.index()].log_saved(tokens.saturating_sub(r.seq.saved));
            }
            if !self.connector.finish_saves(id) {
                self.respond(now, id, sched);
            }
        }
        self.scratch.outcome.completed = done;
        self.kick(now, worker, sched);
    }

    /// Request `id` has `computed` tokens computed on `worker` after a step:
    /// the prompt's chunks completed since its last save go to the tiers
    /// (full chunks while it prefills, and the last, partial one when the
    /// prompt is done), as LMCache saves KV during the forward pass.
    fn save_computed(&mut self, now: SimTime, worker: WorkerId, id: RequestId, computed: u64) {
        let r = &mut self.arena.requests[id.index()];
        let prompt = u64::from(r.prompt_tokens);
        let chunk = self.scenario.kvc.chunk_blocks * self.scenario.worker.block_size;
        let upto = if computed >= prompt { prompt } else { computed / chunk * chunk };
        if upto > r.seq.saved {
            self.workers[worker.index()].log_saved(upto - r.seq.saved);
            let from = save_from(&self.scenario.kvc, r);
            r.seq.saved = upto;
            let seq = r.chunked(upto, self.scenario.worker.block_size);
            self.connector.save(now, worker, id, &seq, from, &mut self.scratch.conn_out);
        }
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

    /// Runs to the end and reports.
    pub fn run(mut self, opts: &crate::RunOptions<'_>) -> Result<RunOutput, RunError> {
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
        self.materialize_all(stats.end_time, false);
        let mut steps: Vec<_> = self.workers.iter_mut().flat_map(Worker::take_step_rows).collect();
        steps.sort_by(|a, b| a.start_s.total_cmp(&b.start_s).then(a.worker.cmp(&b.worker)));
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
        Ok(out)
    }
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

    fn advance_to(&mut self, now: SimTime) {
        if self.fatal.is_some() {
            return;
        }
        if let Err(e) = beyond_horizon(Some(((), now))) {
            self.fail(e);
            return;
        }
        let series = self.recorder.series();
        if !series.can_reach(now) {
            let e = RunError::TimeSeries { at_s: now.as_secs_f64(), interval_s: series.width().as_secs_f64() };
            self.fail(e);
            return;
        }
        while self.recorder.series().next_boundary() <= now {
            // The interval's last state: runs of decode steps up to its end.
            self.materialize_all(self.recorder.series().next_boundary(), false);
            let g = gauges(self.scenario, &self.workers);
            self.recorder.close_interval(g);
        }
    }
}

/// Where request `r`'s next save starts (the connector skips the chunks
/// below it). On compute, LMCache's `num_saved_tokens`: what its lookup found
/// the tiers holding when it was scheduled, or what its earlier saves
/// stored (`vllm_v1_adapter.py`). On finish, the original Opal's rule: its
/// `store` offers every chunk from the first (`kvc_manager.py`,
/// `OpalKVCacheEngine.store`), those held being skipped.
fn save_from(kvc: &KvcConfig, r: &Request) -> u64 {
    match kvc.save_timing {
        SaveTiming::OnCompute => r.seq.saved.max(r.seq.tier_prefix),
        SaveTiming::OnFinish => 0,
    }
}
