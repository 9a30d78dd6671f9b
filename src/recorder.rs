//! The metrics recorder: an observer that owns every tally of a run. The
//! cluster tells it what happened (`on_*`) and, at the end, hands it the
//! components' final state to read ([`Recorder::finish`]); it never
//! reaches back into the simulation. A new run-level metric is collected
//! here and declared in its row type in [`crate::metrics`], nowhere else.

use crate::config::Scenario;
use crate::config::disagg::Role;
use crate::engine::RunStats;
use crate::ids::{StageId, WorkerId};
use crate::kvcache::{KvConnector, LoadDone, Tier};
use crate::metrics::steady::{Steady, SteadyState};
use crate::metrics::{
    CostSummary, Gauges, InSystem, IntervalRow, Latencies, LatencyHistogram, LatencyMetric, PdSummary, PeakSeconds,
    RequestRecord, RunSummary, Sc25Row, StageRow, StageTally, StepRow, StepSpan, TierCost, TierSummary, TimeSeries,
    WorkerRow,
};
use crate::request::Request;
use crate::router::Router;
use crate::time::{SimDuration, SimTime};
use crate::worker::{StepOutcome, Worker};
use crate::workload::{Label, Workload};

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
    /// The work the tiers' stores did, summed over their instances (for
    /// benchmarks and tests; no table has it).
    pub store_ops: crate::kvcache::StoreOps,
    /// Step prices the workers computed (a decode run's pieces priced at
    /// their ends count two each; for benchmarks and tests, no table has it).
    pub priced_steps: u64,
    /// KV events the router's index applied, each naming a run of chunks
    /// (for benchmarks and tests; no table has it).
    pub index_updates: u64,
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

/// The queue, batch and KV-pool gauges of `workers` now.
pub fn gauges(s: &Scenario, workers: &[Worker]) -> Gauges {
    Gauges {
        queue_depth: workers.iter().map(|w| w.waiting() as u64).sum(),
        queue_depth_prefill: s
            .disagg
            .as_ref()
            .map_or(0, |d| workers[..d.prefill_workers as usize].iter().map(|w| w.waiting() as u64).sum()),
        running: workers.iter().map(|w| w.running() as u64).sum(),
        active_workers: workers.len() as u32,
        used_blocks: workers.iter().map(Worker::used_blocks).sum(),
        total_blocks: (0..workers.len()).map(|w| s.worker_config(w).total_blocks).sum(),
    }
}

/// Every tally of one run.
pub struct Recorder {
    chunk_tokens: u64,
    tally: Tally,
    /// Keep a record of every request (the requests table is written).
    keep_records: bool,
    records: Vec<RequestRecord>,
    sc25: Vec<Sc25Request>,
    worker_stats: Vec<WorkerStats>,
    latencies: Latencies,
    /// Per workload stage, in `scenario.stages` order. With one stage its
    /// latency histograms are the run's: they are copied at the end, not
    /// recorded twice.
    stage_tallies: Vec<StageTally>,
    series: TimeSeries,
    in_system: InSystem,
    /// The per-arrival series the steady-state verdict reads.
    steady: SteadyState,
    completed: u64,
    /// When the last response left.
    last_response: Option<SimTime>,
    rejected: u64,
    completed_prompt_tokens: u64,
    completed_output_tokens: u64,
    /// Requests prefilled on the prefill pool, and by their decode worker.
    pd_counts: (u64, u64),
    /// The per-request SLO, and the completed requests that met it.
    slo: crate::config::RequestSlo,
    slo_met: u64,
}

impl Recorder {
    /// A recorder for a run of `s`.
    pub fn new(s: &Scenario) -> Recorder {
        Recorder {
            chunk_tokens: s.kvc.chunk_blocks * s.worker.block_size,
            tally: Tally::default(),
            keep_records: false,
            records: Vec::new(),
            sc25: Vec::new(),
            worker_stats: Vec::new(),
            latencies: Latencies::default(),
            stage_tallies: vec![StageTally::default(); s.stages.len()],
            series: TimeSeries::new(s.interval),
            in_system: InSystem::default(),
            steady: SteadyState::default(),
            completed: 0,
            last_response: None,
            rejected: 0,
            completed_prompt_tokens: 0,
            completed_output_tokens: 0,
            pd_counts: (0, 0),
            slo: s.request_slo,
            slo_met: 0,
        }
    }

    /// Keeps a record of every request (for the requests table).
    pub fn keep_records(&mut self) {
        self.keep_records = true;
    }

    /// A worker joined at `now`.
    pub fn on_worker_added(&mut self, now: SimTime) {
        self.worker_stats.push(WorkerStats { started: now, ..WorkerStats::default() });
    }

    /// A request of `stage` arrived.
    pub fn on_arrival(&mut self, now: SimTime, stage: StageId) {
        self.stage_tallies[stage.index()].arrived(now);
    }

    /// It was rejected (longer than the engine serves).
    pub fn on_rejected(&mut self, stage: StageId) {
        self.rejected += 1;
        self.stage_tallies[stage.index()].rejected += 1;
    }

    /// Arrival number `serial` entered the system (it is routed next).
    pub fn on_admitted(&mut self, now: SimTime, serial: u32) {
        self.steady.on_admitted(serial, self.in_system.count());
        self.in_system.change(now, 1);
    }

    /// Arrival number `serial` was queued at `w`, whose waiting queue held
    /// `waiting` requests; with disaggregation, `remote` says whether a
    /// prefill worker takes its prompt.
    pub fn on_routed(&mut self, serial: u32, w: WorkerId, waiting: usize, remote: Option<bool>) {
        self.steady.on_queued(serial, w.index(), waiting);
        self.worker_stats[w.index()].routed += 1;
        match remote {
            Some(true) => self.pd_counts.0 += 1,
            Some(false) => self.pd_counts.1 += 1,
            None => {}
        }
    }

    /// A prefill worker handed a request over to its decode worker.
    pub fn on_handed_over(&mut self, prefill: WorkerId, decode: WorkerId) {
        self.worker_stats[prefill.index()].completed += 1;
        self.worker_stats[decode.index()].routed += 1;
    }

    /// Decode steps a worker materialised from a run: busy time, tokens and
    /// inter-token gaps, as their own step ends would.
    pub fn on_substeps(&mut self, spans: &[StepSpan]) {
        self.series.on_steps(spans);
        let itl = self.latencies.get_mut(LatencyMetric::Itl);
        for s in spans {
            itl.record_ramp(&s.ramp, s.k0, s.k1, s.duration, s.decodes);
        }
    }

    /// A step ended at `now`.
    pub fn on_step(&mut self, now: SimTime, out: &StepOutcome) {
        self.series.on_step(now - out.duration, now, out.prompt_tokens, out.generated_tokens, out.peak);
        let itl = self.latencies.get_mut(LatencyMetric::Itl);
        itl.record_n(out.duration, out.gaps_of_duration);
        itl.record_n(out.pause_gap, out.gaps_of_pause);
        for &gap in &out.gaps {
            itl.record(gap);
        }
        for &(_, gap) in &out.first_decodes {
            self.latencies.get_mut(LatencyMetric::FirstDecode).record(gap);
        }
    }

    /// Request `r`'s first token reached the client at `now` (with a remote
    /// prefill: its decode worker's first token).
    pub fn on_first_token(&mut self, now: SimTime, r: &Request) {
        let ttft = now - r.arrival;
        self.latencies.get_mut(LatencyMetric::Ttft).record(ttft);
        let wait = r.first_scheduled.expect("a request with a token was scheduled") - r.arrival;
        self.latencies.get_mut(LatencyMetric::QueueWait).record(wait);
        if self.stage_tallies.len() > 1 {
            let tally = &mut self.stage_tallies[r.stage.index()];
            tally.ttft.record(ttft);
            tally.queue_wait.record(wait);
        }
        self.series.on_first_token(now, ttft, &r.hit_tokens);
        self.steady.on_first_token(r.serial, r.arrival, ttft, wait);
    }

    /// A remotely prefilled request's prefill worker produced its token at
    /// `now` (the client's first token comes from the decode worker).
    pub fn on_prefill_token(&mut self, now: SimTime, r: &Request) {
        self.latencies.get_mut(LatencyMetric::TtftPrefill).record(now - r.arrival);
    }

    /// Request `r` produced its last token.
    pub fn on_last_token(&mut self, r: &Request) {
        if let Some(tpot) = tpot(r) {
            self.latencies.get_mut(LatencyMetric::Tpot).record(tpot);
            if self.stage_tallies.len() > 1 {
                self.stage_tallies[r.stage.index()].tpot.record(tpot);
            }
            self.steady.record(r.serial, Steady::Tpot, tpot);
        }
    }

    /// A KV load (from the tiers, or a P/D transfer over a link) finished at `now`.
    pub fn on_load_done(&mut self, now: SimTime, d: &LoadDone) {
        let took = now - d.started;
        if d.link_bytes > 0 {
            self.latencies.get_mut(LatencyMetric::KvTransfer).record(took);
            self.worker_stats[d.worker.index()].link_bytes += d.link_bytes;
        } else {
            self.latencies.get_mut(LatencyMetric::KvFetch).record(took);
        }
    }

    /// `bytes` moved to or from `tier` at `now`.
    pub fn on_tier_bytes(&mut self, now: SimTime, tier: Tier, bytes: u64) {
        self.series.on_tier_bytes(now, tier, bytes);
    }

    /// The ages of KV events as the router applies them.
    pub fn staleness(&mut self) -> &mut LatencyHistogram {
        self.latencies.get_mut(LatencyMetric::KvStaleness)
    }

    /// Request `r`'s response left the platform at `now`.
    pub fn on_response(&mut self, now: SimTime, r: &Request) {
        let e2e = now - r.arrival;
        self.latencies.get_mut(LatencyMetric::E2e).record(e2e);
        if self.slo.is_set() {
            let ttft = r.first_token.expect("a responded request has a first token") - r.arrival;
            let met =
                self.slo.ttft.is_none_or(|t| ttft <= t) && self.slo.tpot.is_none_or(|t| tpot(r).is_none_or(|x| x <= t));
            self.slo_met += u64::from(met);
        }
        self.steady.record(r.serial, Steady::E2e, e2e);
        self.completed += 1;
        self.completed_prompt_tokens += u64::from(r.prompt_tokens);
        self.completed_output_tokens += u64::from(r.output_tokens);
        let several = self.stage_tallies.len() > 1;
        let tally = &mut self.stage_tallies[r.stage.index()];
        if several {
            tally.e2e.record(e2e);
        }
        tally.completed += 1;
        tally.prompt_tokens += u64::from(r.prompt_tokens);
        tally.output_tokens += u64::from(r.output_tokens);
        tally.hit_tokens += r.hit_tokens.iter().sum::<u64>();
        tally.last_response = Some(now);
        self.last_response = Some(now);
        let stats = &mut self.worker_stats[r.worker.expect("routed").index()];
        stats.completed += 1;
        stats.prompt_tokens += u64::from(r.prompt_tokens);
        stats.hit_tokens += r.hit_tokens.iter().sum::<u64>();
        self.in_system.change(now, -1);
        self.series.on_completion(now);
    }

    /// Request `r` is done with (responded or rejected): its totals, record
    /// and SC25 figures are kept.
    pub fn on_retire(&mut self, r: &Request) {
        self.tally.add(r, self.chunk_tokens);
        if self.keep_records {
            self.records.push(record(r));
        }
        if let Some(s) = sc25_request(r) {
            self.sc25.push(s);
        }
    }

    /// The request records kept so far, taken (sorted by id).
    pub fn take_records(&mut self) -> Vec<RequestRecord> {
        let mut records = std::mem::take(&mut self.records);
        records.sort_unstable_by_key(|r| r.id);
        records
    }

    /// Request records kept and not yet taken.
    pub fn records_kept(&self) -> usize {
        self.records.len()
    }

    /// Requests in the system now.
    pub fn in_system(&self) -> u64 {
        self.in_system.count()
    }

    /// When the last response left.
    pub fn last_response(&self) -> Option<SimTime> {
        self.last_response
    }

    /// Requests responded so far.
    pub fn completed(&self) -> u64 {
        self.completed
    }

    /// The time series (its interval boundaries).
    pub fn series(&self) -> &TimeSeries {
        &self.series
    }

    /// Closes the current interval with these gauges.
    pub fn close_interval(&mut self, g: Gauges) {
        self.series.close_interval(g);
    }

    /// The run's results, from the tallies and the components' final state.
    /// `live` are the requests still in the arena (they count as they
    /// stand); `generated` is how many requests the run generated.
    pub fn finish<'r>(mut self, end: &RunEnd<'_>, live: impl Iterator<Item = &'r Request>) -> RunOutput {
        if let [tally] = &mut self.stage_tallies[..] {
            tally.ttft = self.latencies.get(LatencyMetric::Ttft).clone();
            tally.queue_wait = self.latencies.get(LatencyMetric::QueueWait).clone();
            tally.tpot = self.latencies.get(LatencyMetric::Tpot).clone();
            tally.e2e = self.latencies.get(LatencyMetric::E2e).clone();
        }
        let (s, at, workers) = (end.scenario, end.stats.end_time, end.workers);
        let secs = at.as_secs_f64();
        let per_s = |x: u64| if secs > 0.0 { x as f64 / secs } else { 0.0 };
        // Steps still in flight count as busy up to the end of the run.
        let mut busy: u64 = 0;
        for w in workers {
            busy += w.busy_time().0;
            if let Some(start) = w.step_start() {
                self.series.on_busy(start, at);
                busy += (at - start).0;
            }
        }
        let worker_time: f64 = self.worker_stats.iter().map(|st| at.saturating_since(st.started).0 as f64).sum();
        for r in live {
            self.on_retire(r);
        }
        let t = self.tally;
        let mut tiers = TierSummary {
            prompt_tokens: t.prompt_tokens,
            hit_tokens: t.hit_tokens,
            hit_tokens_total: t.hit_tokens_total,
            prefill_tokens_computed: t.prefill_tokens_computed,
            ..TierSummary::default()
        };
        let mut instances = [0u64; 4];
        let mut store_ops = crate::kvcache::StoreOps::default();
        for inst in end.connector.report(at) {
            store_ops += inst.ops;
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
        let g = gauges(s, workers);
        let trace = end.workload.trace_counts();
        let mut peak = PeakSeconds::default();
        for w in workers {
            peak += w.peak_total();
        }
        let worker_rows: Vec<WorkerRow> = workers
            .iter()
            .zip(&self.worker_stats)
            .map(|(w, st)| {
                let alive = at.saturating_since(st.started).as_secs_f64();
                let busy = w.busy_at(at).as_secs_f64();
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
                    chunks_indexed: end.router.chunks_indexed(w.id()),
                    cost: {
                        let (gpu, tp) = s.hardware_of(w.id().index());
                        gpu.cost(tp, alive, busy, w.step_joules())
                    },
                    role: s.disagg.as_ref().map_or(Role::Mixed, |d| d.role_of(w.id().index())).name(),
                    group: s.group_name(w.id().index()).to_string(),
                    link_bytes: st.link_bytes,
                }
            })
            .collect();
        let mut cost = CostSummary { usd: 0.0, ..Default::default() };
        for w in &worker_rows {
            cost += w.cost;
        }
        // The tiers' capacity, priced per GiB-hour: a per-worker tier for as
        // long as its worker is alive, the one DFS for the whole run.
        let mut tier_cost = TierCost::default();
        for t in &s.kvc.tiers {
            let hours = if t.tier == Tier::Dfs { secs } else { worker_time / 1e9 } / 3600.0;
            let gib_hours = t.capacity_bytes as f64 / f64::from(1u32 << 30) * hours;
            tier_cost.gib_hours[t.tier.index() - 1] += gib_hours;
            tier_cost.usd += gib_hours * t.usd_per_gib_hour;
            tier_cost.energy_j += gib_hours * t.watts_per_gib * 3600.0;
        }
        cost.usd += tier_cost.usd;
        cost.energy_j += tier_cost.energy_j;
        let (kv_events, kv_event_batches) = end.router.kv_event_counts();
        let generated = u64::from(end.generated);
        let summary = RunSummary {
            requests_generated: generated,
            requests_completed: self.completed,
            requests_rejected: self.rejected,
            requests_incomplete: generated - self.completed - self.rejected,
            sim_time_s: secs,
            events: end.stats.events,
            stop_reason: end.stats.stop,
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
            preemptions: workers.iter().map(Worker::preemptions).sum(),
            prefill_tokens_computed: t.prefill_tokens_computed,
            spec_acceptance_length: {
                let (verifies, accepted) =
                    workers.iter().map(Worker::speculation).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
                if verifies > 0 { 1.0 + accepted as f64 / verifies as f64 } else { f64::NAN }
            },
            mean_requests_in_system: self.in_system.mean(at),
            steady: self.steady.finish(),
            slo_attainment: if self.slo.is_set() && self.completed > 0 {
                self.slo_met as f64 / self.completed as f64
            } else {
                f64::NAN
            },
            goodput_rps: if self.slo.is_set() { per_s(self.slo_met) } else { f64::NAN },
            workers: workers.len() as u32,
            tiers,
            kv_events,
            kv_event_batches,
            kv_staleness_ms: self.latencies.get(LatencyMetric::KvStaleness).stats(),
            routing_mispredictions: if t.predictions > 0 {
                t.mispredictions as f64 / t.predictions as f64
            } else {
                0.0
            },
            trace_lines_skipped: trace.skipped,
            trace_lines_reordered: trace.reordered,
            trace_outputs_raised: trace.outputs_raised,
            sessions_truncated: end.workload.sessions_truncated(),
            model_params: s.model.parameter_count(),
            model_active_params: s.model.active_parameter_count(),
            kv_bytes_per_token: s.model.kv_bytes_per_token(),
            cost,
            tier_cost,
            pd: self.pd_summary(s, end.connector, at, &worker_rows),
        };
        let requests = self.take_records();
        self.sc25.sort_unstable_by_key(|s| s.serial);
        RunOutput {
            summary,
            latencies: self.latencies,
            series: self.series.finish(at, g),
            requests,
            steps: Vec::new(),
            peak_live_requests: end.peak_live_requests,
            workers: worker_rows,
            sc25: sc25_rows(&self.sc25),
            stages: self
                .stage_tallies
                .iter()
                .zip(&s.stages)
                .enumerate()
                .map(|(i, (t, st))| t.row(i as u32, st.type_name()))
                .collect(),
            event_digest: end.stats.digest,
            routing_wall_s: end.router.wall_s(),
            store_ops,
            priced_steps: end.workers.iter().map(Worker::priced_steps).sum(),
            index_updates: end.router.index_updates(),
        }
    }

    /// What disaggregated prefill/decode did (defaults without it).
    fn pd_summary(&self, s: &Scenario, connector: &KvConnector, end: SimTime, workers: &[WorkerRow]) -> PdSummary {
        let Some(d) = &s.disagg else { return PdSummary::default() };
        let secs = end.as_secs_f64();
        let busy = |role: Role| {
            let rows = workers.iter().filter(|w| w.role == role.name());
            let (busy, alive) = rows.fold((0.0, 0.0), |(b, a), w| (b + w.busy_s, a + (secs - w.started_s)));
            if alive > 0.0 { busy / alive } else { 0.0 }
        };
        let links: Vec<_> = connector.link_report(end).collect();
        let decode_links = &links[d.prefill_workers as usize..];
        PdSummary {
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
            ttft_prefill_ms: self.latencies.get(LatencyMetric::TtftPrefill).stats(),
            prefill_busy_fraction: busy(Role::Prefill),
            decode_busy_fraction: busy(Role::Decode),
        }
    }
}

/// The components' state at the end of a run, for [`Recorder::finish`].
pub struct RunEnd<'r> {
    /// The scenario run.
    pub scenario: &'r Scenario,
    /// The engine's totals.
    pub stats: RunStats,
    /// Every worker, brought up to the end.
    pub workers: &'r [Worker],
    /// The KV connector (tiers and links).
    pub connector: &'r KvConnector,
    /// The router (its index and event counts).
    pub router: &'r Router<'r>,
    /// The workload (trace and session counters).
    pub workload: &'r Workload,
    /// Requests generated.
    pub generated: u32,
    /// Most requests in the arena at once.
    pub peak_live_requests: u64,
}

/// `r`'s time per output token, (last token − first token) / (output − 1),
/// once it has its last token and more than one.
fn tpot(r: &Request) -> Option<SimDuration> {
    match (r.first_token, r.finished) {
        (Some(first), Some(last)) if r.output_tokens > 1 => {
            Some(SimDuration((last - first).0 / u64::from(r.output_tokens - 1)))
        }
        _ => None,
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
