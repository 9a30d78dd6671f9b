//! The cluster: owns every component of one run and is the only place that
//! knows the event enum. Components are passive; their returned effects are
//! turned into events here.

use crate::config::Scenario;
use crate::engine::{self, EventQueue, Model, RunStats, Scheduler};
use crate::ids::{RequestId, StageId, WorkerId};
use crate::metrics::{Gauges, InSystem, IntervalRow, Latencies, LatencyMetric, RequestRecord, RunSummary, TimeSeries};
use crate::request::Request;
use crate::rng::{SeedTree, StreamRng};
use crate::router::{Policy, RoutingPolicy, WorkerLoad};
use crate::time::SimTime;
use crate::worker::{StepOutcome, Worker};
use crate::workload::{NewRequest, Workload};

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
    /// One record per generated request, in id order.
    pub requests: Vec<RequestRecord>,
    /// Digest of the event sequence (equal digests: identical runs).
    pub event_digest: u64,
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
    workload: Workload,
    new_requests: Vec<NewRequest>,
    outcome: StepOutcome,
    latencies: Latencies,
    series: TimeSeries,
    in_system: InSystem,
    completed: u64,
    completed_prompt_tokens: u64,
    completed_output_tokens: u64,
}

impl<'a> Cluster<'a> {
    /// A cluster at time zero, per `scenario`.
    pub fn new(scenario: &'a Scenario) -> Cluster<'a> {
        let seeds = SeedTree::new(scenario.seed);
        let workers: Vec<Worker> =
            (0..scenario.num_workers).map(|i| Worker::new(WorkerId(i), &scenario.worker)).collect();
        Cluster {
            scenario,
            requests: Vec::new(),
            outstanding: vec![0; workers.len()],
            loads: Vec::with_capacity(workers.len()),
            workers,
            policy: RoutingPolicy::from_config(scenario.policy),
            router_rng: seeds.stream("router"),
            workload: Workload::new(scenario.stages.clone(), &seeds),
            new_requests: Vec::new(),
            outcome: StepOutcome::default(),
            latencies: Latencies::default(),
            series: TimeSeries::new(scenario.interval),
            in_system: InSystem::default(),
            completed: 0,
            completed_prompt_tokens: 0,
            completed_output_tokens: 0,
        }
    }

    fn gauges(&self) -> Gauges {
        let cfg = &self.scenario.worker;
        Gauges {
            queue_depth: self.workers.iter().map(|w| w.waiting() as u64).sum(),
            running: self.workers.iter().map(|w| w.running() as u64).sum(),
            active_workers: self.workers.len() as u32,
            used_blocks: self.workers.iter().map(|w| w.used_blocks(cfg)).sum(),
            total_blocks: cfg.total_blocks * self.workers.len() as u64,
        }
    }

    fn route(&mut self, now: SimTime, id: RequestId, sched: &mut Scheduler<'_, Event>) {
        self.loads.clear();
        self.loads.extend(
            self.workers.iter().map(|w| WorkerLoad { id: w.id(), outstanding: self.outstanding[w.id().index()] }),
        );
        let w = self.policy.choose(&self.loads, &mut self.router_rng);
        self.outstanding[w.index()] += 1;
        self.requests[id.index()].worker = Some(w);
        if let Some((end, version)) =
            self.workers[w.index()].enqueue(now, id, &mut self.requests, &self.scenario.worker)
        {
            sched.at(end, Event::StepEnd { worker: w, version });
        }
    }

    fn on_arrival(&mut self, now: SimTime, stage: StageId, sched: &mut Scheduler<'_, Event>) {
        let mut fresh = std::mem::take(&mut self.new_requests);
        if let Some((s, t)) = self.workload.on_arrival(now, stage, &mut fresh) {
            sched.at(t, Event::Arrival(s));
        }
        for nr in fresh.drain(..) {
            let id = RequestId(self.requests.len() as u32);
            self.requests.push(Request::new(
                id,
                nr.stage,
                now,
                nr.prompt_tokens,
                nr.output_tokens,
                nr.shared_prefix_tokens,
            ));
            self.in_system.change(now, 1);
            self.route(now, id, sched);
        }
        self.new_requests = fresh;
    }

    fn on_step_end(&mut self, now: SimTime, worker: WorkerId, version: u32, sched: &mut Scheduler<'_, Event>) {
        let w = &mut self.workers[worker.index()];
        let Ok(next) = w.finish_step(now, version, &mut self.requests, &self.scenario.worker, &mut self.outcome) else {
            return;
        };
        if let Some((end, v)) = next {
            sched.at(end, Event::StepEnd { worker, version: v });
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
            self.series.on_first_token(now, ttft);
        }
        for i in 0..self.outcome.completed.len() {
            let id = self.outcome.completed[i];
            let r = &self.requests[id.index()];
            let e2e = now - r.arrival;
            self.latencies.get_mut(LatencyMetric::E2e).record(e2e);
            if r.output_tokens > 1 {
                let ttft = r.first_token.expect("completed request has a first token") - r.arrival;
                let tpot = crate::time::SimDuration((e2e.0 - ttft.0) / u64::from(r.output_tokens - 1));
                self.latencies.get_mut(LatencyMetric::Tpot).record(tpot);
            }
            self.completed += 1;
            self.completed_prompt_tokens += u64::from(r.prompt_tokens);
            self.completed_output_tokens += u64::from(r.output_tokens);
            let stage = r.stage;
            self.outstanding[worker.index()] -= 1;
            self.in_system.change(now, -1);
            self.series.on_completion(now);
            if let Some((s, t)) = self.workload.on_completion(now, stage) {
                sched.at(t, Event::Arrival(s));
            }
        }
    }

    /// Runs to the end and reports.
    pub fn run(mut self, opts: &crate::RunOptions) -> RunOutput {
        let mut queue = EventQueue::new();
        if let Some((s, t)) = self.workload.start(SimTime::ZERO) {
            queue.push(t, Event::Arrival(s));
        }
        let limit = self.scenario.time_limit;
        let stats = engine::run(&mut self, &mut queue, limit);
        self.report(stats, opts)
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
        let worker_time = end.0 as f64 * self.workers.len() as f64;
        let gauges = self.gauges();
        let summary = RunSummary {
            requests_generated: self.requests.len() as u64,
            requests_completed: self.completed,
            requests_incomplete: self.requests.len() as u64 - self.completed,
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
            gpu_utilization: if worker_time > 0.0 { busy as f64 / worker_time } else { 0.0 },
            preemptions: self.workers.iter().map(Worker::preemptions).sum(),
            prefill_tokens_computed: self.requests.iter().map(|r| r.prefill_tokens_computed).sum(),
            mean_requests_in_system: self.in_system.mean(end),
            workers: self.workers.len() as u32,
        };
        let requests = if opts.request_records { self.requests.iter().map(record).collect() } else { Vec::new() };
        RunOutput {
            summary,
            latencies: self.latencies,
            series: self.series.finish(end, gauges),
            requests,
            event_digest: stats.digest,
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
        e2e_s: since(r.finished),
        tpot_s: tpot,
        preemptions: r.preemptions,
        completed: r.finished.is_some(),
    }
}

impl Model for Cluster<'_> {
    type Event = Event;

    fn handle(&mut self, now: SimTime, event: Event, sched: &mut Scheduler<'_, Event>) {
        match event {
            Event::Arrival(stage) => self.on_arrival(now, stage, sched),
            Event::StepEnd { worker, version } => self.on_step_end(now, worker, version, sched),
        }
    }

    fn finished(&self) -> bool {
        self.workload.finished() && self.in_system.count() == 0
    }

    fn advance_to(&mut self, now: SimTime) {
        while self.series.next_boundary() <= now {
            let g = self.gauges();
            self.series.close_interval(g);
        }
    }
}
