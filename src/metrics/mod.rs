//! What a run measures: latency histograms, a per-interval time series,
//! per-request records and the run summary (definitions in DESIGN §4).
//!
//! Latencies go into HDR histograms in **microseconds** (3 significant
//! digits; a duration is rounded up to whole µs). Percentiles come from the
//! histograms, so they can be merged exactly across replicates; means and
//! maxima are kept exactly beside them.

mod hdr;
pub mod rows;
mod series;
pub mod steady;
pub mod table;

/// Where a run's per-row tables go as the run goes, so that its memory does
/// not grow with its length: each call hands over a chunk of rows sorted by
/// the table's order (requests by id, steps by start then worker); the
/// chunks of one run together hold every row once.
pub trait RowSink {
    /// A sorted chunk of request records.
    fn requests(&mut self, rows: &[RequestRecord]) -> Result<(), SinkError>;
    /// A sorted chunk of step rows.
    fn steps(&mut self, rows: &[StepRow]) -> Result<(), SinkError>;
}

/// Why a [`RowSink`] could not take rows (the writer's own error).
pub type SinkError = Box<dyn std::error::Error + Send + Sync>;
pub use series::{Gauges, IntervalRow, MAX_INTERVALS, MIN_INTERVAL_SECS, PeakSeconds, StepSpan, TimeSeries};

use crate::time::{Ramp, SimDuration, SimTime};
use rows::col;
use serde::Serialize;

/// A latency distribution.
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    /// The HDR histogram's counts (µs), read and encoded as the crate's.
    hist: hdr::Counts,
    sum_ns: u128,
    count: u64,
    max_ns: u64,
    min_ns: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram::with_digits(3)
    }
}

impl LatencyHistogram {
    /// An empty histogram to `digits` significant digits (the default has 3).
    pub fn with_digits(digits: u8) -> LatencyHistogram {
        LatencyHistogram { hist: hdr::Counts::new(digits), sum_ns: 0, count: 0, max_ns: 0, min_ns: u64::MAX }
    }

    /// Adds `o`'s samples.
    pub fn merge(&mut self, o: &LatencyHistogram) {
        if o.count == 0 {
            return;
        }
        self.hist.add(&o.hist);
        self.sum_ns += o.sum_ns;
        self.count += o.count;
        self.max_ns = self.max_ns.max(o.max_ns);
        self.min_ns = self.min_ns.min(o.min_ns);
    }

    /// Records one sample ([`Self::record_n`] of one, its count known here).
    pub fn record(&mut self, d: SimDuration) {
        self.count_exact(d, 1);
        self.record_hist(d.as_micros_ceil(), 1);
    }

    /// Records `n` samples of the same duration (one decode step for a batch).
    pub fn record_n(&mut self, d: SimDuration, n: u64) {
        if n == 0 {
            return;
        }
        self.count_exact(d, n);
        self.record_hist(d.as_micros_ceil(), n);
    }

    /// Records steps `k0..k1` of `ramp`, each `n` times, as [`Self::record_n`]
    /// would one by one: the steps whose durations one histogram bucket
    /// holds go into it at once, found by arithmetic, so the work grows
    /// with the buckets the ramp crosses, not its steps.
    /// `duration` is theirs in all (`ramp.sum(k0, k1)`).
    pub fn record_ramp(&mut self, ramp: &Ramp, k0: u64, k1: u64, duration: SimDuration, n: u64) {
        if n == 0 || k0 >= k1 {
            return;
        }
        let rising = ramp.last >= ramp.first;
        self.sum_ns += u128::from(duration.0) * u128::from(n);
        self.count += (k1 - k0) * n;
        let (low, high) = if rising { (ramp.at(k0), ramp.at(k1 - 1)) } else { (ramp.at(k1 - 1), ramp.at(k0)) };
        self.min_ns = self.min_ns.min(low);
        self.max_ns = self.max_ns.max(high);
        let mut k = k0;
        while k < k1 {
            let us = SimDuration(ramp.at(k)).as_micros_ceil();
            // The steps whose durations (whole µs, rounded up) fall in this bucket.
            let kk = if rising {
                let top_ns = self.hist.highest_equivalent(us).saturating_mul(1_000);
                if ramp.at(k1 - 1) <= top_ns { k1 } else { ramp.last_at_most(k, k1, top_ns) + 1 }
            } else {
                let bottom_ns = self.hist.lowest_equivalent(us).saturating_sub(1) * 1_000 + 1;
                if ramp.at(k1 - 1) >= bottom_ns { k1 } else { ramp.last_at_least(k, k1, bottom_ns) + 1 }
            };
            self.record_hist(us, n * (kk - k));
            k = kk;
        }
    }

    #[inline(always)]
    fn count_exact(&mut self, d: SimDuration, n: u64) {
        self.sum_ns += u128::from(d.0) * u128::from(n);
        self.count += n;
        self.max_ns = self.max_ns.max(d.0);
        self.min_ns = self.min_ns.min(d.0);
    }

    fn record_hist(&mut self, us: u64, n: u64) {
        self.hist.record_n(us, n);
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The HDR histogram (µs), built (for the tests that compare with the crate).
    #[cfg(test)]
    pub fn histogram(&self) -> hdrhistogram::Histogram<u64> {
        self.hist.histogram()
    }

    /// Appends the histogram's V2 encoding (as hdrhistogram's
    /// `V2Serializer` writes it) to `out`, without building it.
    pub fn write_v2(&self, out: &mut Vec<u8>) {
        self.hist.write_v2(out);
    }

    /// Percentiles (from the histogram), exact mean and max, in milliseconds;
    /// all NaN without samples.
    pub fn stats(&self) -> LatencyStats {
        if self.count == 0 {
            return LatencyStats {
                p50: f64::NAN,
                p90: f64::NAN,
                p95: f64::NAN,
                p99: f64::NAN,
                p999: f64::NAN,
                mean: f64::NAN,
                max: f64::NAN,
            };
        }
        // The histogram answers with the top of a bucket (3 significant
        // digits), which can lie above the exact maximum (or below the exact
        // minimum): a percentile is clamped into [min, max].
        let (min, max) = (self.min_ns as f64 / 1e6, self.max_ns as f64 / 1e6);
        let mut v = [0; 5];
        self.hist.values_at_quantiles(&[0.50, 0.90, 0.95, 0.99, 0.999], &mut v);
        let q = |v: u64| (v as f64 / 1e3).clamp(min, max);
        LatencyStats {
            p50: q(v[0]),
            p90: q(v[1]),
            p95: q(v[2]),
            p99: q(v[3]),
            p999: q(v[4]),
            mean: self.sum_ns as f64 / self.count as f64 / 1e6,
            max,
        }
    }
}

/// Summary statistics of one latency metric, milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LatencyStats {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Exact mean.
    pub mean: f64,
    /// Exact maximum.
    pub max: f64,
}

impl LatencyStats {
    /// `(suffix, value)` pairs in column order.
    pub fn fields(&self) -> [(&'static str, f64); 7] {
        [
            ("p50", self.p50),
            ("p90", self.p90),
            ("p95", self.p95),
            ("p99", self.p99),
            ("p999", self.p999),
            ("mean", self.mean),
            ("max", self.max),
        ]
    }
}

/// The latency metrics of a run, in output order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LatencyMetric {
    /// Arrival → first token.
    Ttft,
    /// (E2E − TTFT) / (output − 1), per request with more than one output token.
    Tpot,
    /// Gap between consecutive tokens of a request.
    Itl,
    /// Arrival → last token.
    E2e,
    /// Arrival → first scheduled step.
    QueueWait,
    /// Duration of a KV fetch from the tiers below the GPU (requests that had one).
    KvFetch,
    /// Time from a KV change on a worker to the router applying its event.
    KvStaleness,
    /// A remote prefill's KV transfer to its decode worker (start to end).
    KvTransfer,
    /// From a remotely prefilled request's first token to the first token
    /// its decode worker produced (transfer wait and time, queueing, first step).
    FirstDecode,
    /// A remotely prefilled request's arrival → its prefill worker's token
    /// (the client's first token comes later, from the decode worker: [`LatencyMetric::Ttft`]).
    TtftPrefill,
}

impl LatencyMetric {
    /// All metrics in output order.
    pub const ALL: [LatencyMetric; 10] = [
        LatencyMetric::Ttft,
        LatencyMetric::Tpot,
        LatencyMetric::Itl,
        LatencyMetric::E2e,
        LatencyMetric::QueueWait,
        LatencyMetric::KvFetch,
        LatencyMetric::KvStaleness,
        LatencyMetric::KvTransfer,
        LatencyMetric::FirstDecode,
        LatencyMetric::TtftPrefill,
    ];

    /// The column-name stem.
    pub fn name(self) -> &'static str {
        match self {
            LatencyMetric::Ttft => "ttft",
            LatencyMetric::Tpot => "tpot",
            LatencyMetric::Itl => "itl",
            LatencyMetric::E2e => "e2e",
            LatencyMetric::QueueWait => "queue_wait",
            LatencyMetric::KvFetch => "kv_fetch",
            LatencyMetric::KvStaleness => "kv_staleness",
            LatencyMetric::KvTransfer => "kv_transfer",
            LatencyMetric::FirstDecode => "first_decode",
            LatencyMetric::TtftPrefill => "ttft_prefill",
        }
    }
}

/// The latency histograms of a run, indexed by [`LatencyMetric`].
#[derive(Clone, Debug, Default)]
pub struct Latencies {
    hists: [LatencyHistogram; 10],
}

impl Latencies {
    /// The histogram of `m`.
    pub fn get(&self, m: LatencyMetric) -> &LatencyHistogram {
        &self.hists[m as usize]
    }

    /// The histogram of `m`, mutably.
    pub fn get_mut(&mut self, m: LatencyMetric) -> &mut LatencyHistogram {
        &mut self.hists[m as usize]
    }
}

/// One finished (or unfinished) request, as reported.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RequestRecord {
    /// Request id (generation order).
    pub id: u32,
    /// Generating stage.
    pub stage: u32,
    /// Worker it was routed to.
    pub worker: Option<u32>,
    /// Arrival, seconds.
    pub arrival_s: f64,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens asked for.
    pub output_tokens: u32,
    /// Digest of the prompt's content: equal prompts, equal digests (so a
    /// request stream can be compared across runs).
    pub prompt_hash: u64,
    /// Prompt tokens prefilled (including recomputation after preemption).
    pub prefill_tokens_computed: u64,
    /// Arrival → first scheduled step, seconds.
    pub queue_wait_s: Option<f64>,
    /// Arrival → first token, seconds.
    pub ttft_s: Option<f64>,
    /// Arrival → last token, seconds.
    pub e2e_s: Option<f64>,
    /// (E2E − TTFT) / (output − 1), seconds.
    pub tpot_s: Option<f64>,
    /// Preemptions suffered.
    pub preemptions: u32,
    /// Whether its response left the platform within the run.
    pub completed: bool,
    /// Tokens found cached at its first admission, per tier (gpu, cpu, nvme, dfs).
    pub hit_tokens: [u64; 4],
    /// Tokens found cached over all its admissions (again after each preemption), every tier.
    pub hit_tokens_total: u64,
    /// Bytes fetched per tier, over all its loads (gpu unused).
    pub read_bytes: [u64; 4],
    /// Duration of its KV fetch, seconds.
    pub kv_fetch_s: Option<f64>,
    /// What the workload says it is (SC25 pass, session and turn).
    pub label: crate::workload::Label,
}

/// One prompt size of an `SC25Workload` stage: its cold and warm request.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Sc25Row {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// TTFT of the cold request, ms (`None` if it did not finish its prefill).
    pub cold_ttft_ms: Option<f64>,
    /// TTFT of the warm request, ms.
    pub warm_ttft_ms: Option<f64>,
    /// Prompt tokens the cold request computed.
    pub cold_prefill_tokens: u64,
    /// Prompt tokens the warm request computed (the rest came from cache).
    pub warm_prefill_tokens: u64,
    /// Prompt tokens the warm request found in each tier (gpu, cpu, nvme, dfs).
    pub warm_hit_tokens: [u64; 4],
    /// The warm request's KV fetch time, ms (`None`: nothing fetched below the GPU).
    pub warm_kv_fetch_ms: Option<f64>,
}

/// One workload stage's share of a run, accumulated as the run goes (the
/// Python Opal prints its summary per stage; so does the `stages` table).
#[derive(Clone, Debug, Default)]
pub struct StageTally {
    /// Requests the stage generated.
    pub generated: u64,
    /// Of which completed.
    pub completed: u64,
    /// Of which rejected (longer than `max_model_len`).
    pub rejected: u64,
    /// Prompt tokens of the completed requests.
    pub prompt_tokens: u64,
    /// Output tokens of the completed requests.
    pub output_tokens: u64,
    /// Prefix-hit tokens (all tiers, first admission) of the completed requests.
    pub hit_tokens: u64,
    /// The stage's first arrival.
    pub first_arrival: Option<SimTime>,
    /// Its last response.
    pub last_response: Option<SimTime>,
    /// Time to first token.
    pub ttft: LatencyHistogram,
    /// Time per output token.
    pub tpot: LatencyHistogram,
    /// End to end.
    pub e2e: LatencyHistogram,
    /// Arrival to first scheduling.
    pub queue_wait: LatencyHistogram,
}

impl StageTally {
    /// Counts an arrival at `now`.
    pub fn arrived(&mut self, now: SimTime) {
        self.generated += 1;
        self.first_arrival.get_or_insert(now);
    }

    /// The stage's row: rates are over its active span, from its first
    /// arrival to its last response (NaN — null in the table — without one).
    pub fn row(&self, stage: u32, kind: &'static str) -> StageRow {
        let start = self.first_arrival.map_or(f64::NAN, SimTime::as_secs_f64);
        let end = self.last_response.map_or(f64::NAN, SimTime::as_secs_f64);
        let span = end - start;
        let per_s = |x: u64| if span > 0.0 { x as f64 / span } else { f64::NAN };
        StageRow {
            stage,
            kind,
            start_s: start,
            end_s: end,
            requests_generated: self.generated,
            requests_completed: self.completed,
            requests_rejected: self.rejected,
            requests_per_s: per_s(self.completed),
            input_tokens_per_s: per_s(self.prompt_tokens),
            output_tokens_per_s: per_s(self.output_tokens),
            prefix_hit_ratio: if self.prompt_tokens > 0 {
                self.hit_tokens as f64 / self.prompt_tokens as f64
            } else {
                f64::NAN
            },
            ttft_ms: self.ttft.stats(),
            tpot_ms: self.tpot.stats(),
            e2e_ms: self.e2e.stats(),
            queue_wait_ms: self.queue_wait.stats(),
        }
    }
}

/// One workload stage over a run (a row of the stages table).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StageRow {
    /// Stage index (as in `workload.stages`).
    pub stage: u32,
    /// Its `type`.
    pub kind: &'static str,
    /// First arrival, simulated seconds.
    pub start_s: f64,
    /// Last response, simulated seconds.
    pub end_s: f64,
    /// Requests generated.
    pub requests_generated: u64,
    /// Requests completed.
    pub requests_completed: u64,
    /// Requests rejected.
    pub requests_rejected: u64,
    /// Completed requests per second of the stage's span.
    pub requests_per_s: f64,
    /// Prompt tokens of completed requests per second.
    pub input_tokens_per_s: f64,
    /// Output tokens of completed requests per second.
    pub output_tokens_per_s: f64,
    /// Prefix-hit tokens / prompt tokens of completed requests.
    pub prefix_hit_ratio: f64,
    /// Time to first token, ms.
    pub ttft_ms: LatencyStats,
    /// Time per output token, ms.
    pub tpot_ms: LatencyStats,
    /// End to end, ms.
    pub e2e_ms: LatencyStats,
    /// Queue wait, ms.
    pub queue_wait_ms: LatencyStats,
}

impl StageRow {
    /// The latency columns' stems and values, in column order.
    pub fn latencies(&self) -> [(&'static str, &LatencyStats); 4] {
        [("ttft", &self.ttft_ms), ("tpot", &self.tpot_ms), ("e2e", &self.e2e_ms), ("queue_wait", &self.queue_wait_ms)]
    }
}

/// One worker over a run (a row of the workers table).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WorkerRow {
    /// Worker id.
    pub worker: u32,
    /// When it started accepting requests, seconds (later than 0 if added by autoscaling).
    pub started_s: f64,
    /// Requests the router sent it.
    pub requests_routed: u64,
    /// Of those, completed.
    pub requests_completed: u64,
    /// Prompt tokens its completed requests found cached (any tier) / their prompt tokens.
    pub prefix_hit_ratio: f64,
    /// Seconds spent computing steps.
    pub busy_s: f64,
    /// Busy fraction since it started: time spent in steps.
    pub busy_fraction: f64,
    /// Fraction of its peak FLOP/s its steps used since it started.
    pub compute_fraction: f64,
    /// Fraction of its peak HBM bandwidth its steps used since it started.
    pub hbm_fraction: f64,
    /// Preemptions.
    pub preemptions: u64,
    /// Chunks the router's index says it holds at the end.
    pub chunks_indexed: u64,
    /// What its GPUs cost.
    pub cost: CostSummary,
    /// Its role: `mixed`, `prefill` or `decode`.
    pub role: &'static str,
    /// Its group: a `[[worker_groups]]` name, its P/D pool's role, or `default`.
    pub group: String,
    /// KV bytes it pulled over its link (remote prefills).
    pub link_bytes: u64,
}

/// KV-cache tiers over a run, indexed by `Tier::index` (gpu, cpu, nvme, dfs).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TierSummary {
    /// Prompt tokens of the requests that were scheduled.
    pub prompt_tokens: u64,
    /// Of those, tokens found cached in each tier at the requests' first admission.
    pub hit_tokens: [u64; 4],
    /// Tokens found cached over every admission (a preempted request is
    /// admitted again, with its prompt and generated tokens), every tier.
    pub hit_tokens_total: u64,
    /// Tokens computed by prefill over every admission (recomputation included).
    pub prefill_tokens_computed: u64,
    /// Bytes read from each tier's devices.
    pub bytes_read: [u64; 4],
    /// Bytes written to each tier's devices.
    pub bytes_written: [u64; 4],
    /// Busy seconds of each tier's devices, summed over instances.
    pub device_busy_s: [f64; 4],
    /// Busy fraction of each tier's devices (mean over instances).
    pub device_utilization: [f64; 4],
    /// Highest occupancy of any instance of each tier, as a fraction of its capacity.
    pub occupancy_peak: [f64; 4],
}

impl TierSummary {
    /// Fraction of scheduled prompt tokens found in `tier`.
    pub fn hit_ratio(&self, tier: crate::kvcache::Tier) -> f64 {
        if self.prompt_tokens == 0 { 0.0 } else { self.hit_tokens[tier.index()] as f64 / self.prompt_tokens as f64 }
    }

    /// Fraction of scheduled prompt tokens found in any tier at first admission.
    pub fn prefix_hit_ratio(&self) -> f64 {
        if self.prompt_tokens == 0 {
            0.0
        } else {
            self.hit_tokens.iter().sum::<u64>() as f64 / self.prompt_tokens as f64
        }
    }

    /// Over every admission, the fraction of the tokens whose KV the workers
    /// needed that was found cached rather than computed:
    /// `hit_tokens_total / (hit_tokens_total + prefill_tokens_computed)`.
    /// Equals [`Self::prefix_hit_ratio`] when nothing is preempted and every
    /// admitted request finished its prefill.
    pub fn prefix_hit_ratio_total(&self) -> f64 {
        let needed = self.hit_tokens_total + self.prefill_tokens_computed;
        if needed == 0 { 0.0 } else { self.hit_tokens_total as f64 / needed as f64 }
    }
}

/// The run summary: one row of the runs table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunSummary {
    /// Requests generated.
    pub requests_generated: u64,
    /// Requests completed.
    pub requests_completed: u64,
    /// Requests rejected because prompt + output exceed the model's context length.
    pub requests_rejected: u64,
    /// Requests still in flight when the run stopped.
    pub requests_incomplete: u64,
    /// Simulated seconds covered.
    pub sim_time_s: f64,
    /// Events handled.
    pub events: u64,
    /// Why the run stopped.
    pub stop_reason: crate::engine::StopReason,
    /// Prompt tokens of completed requests per simulated second.
    pub input_tokens_per_s: f64,
    /// Output tokens of completed requests per simulated second.
    pub output_tokens_per_s: f64,
    /// Completed requests per simulated second.
    pub requests_per_s: f64,
    /// Latency statistics, ms.
    pub ttft_ms: LatencyStats,
    /// Time per output token, ms.
    pub tpot_ms: LatencyStats,
    /// Inter-token latency, ms.
    pub itl_ms: LatencyStats,
    /// End-to-end latency, ms.
    pub e2e_ms: LatencyStats,
    /// Queue wait, ms.
    pub queue_wait_ms: LatencyStats,
    /// KV fetch time of requests that fetched, ms.
    pub kv_fetch_ms: LatencyStats,
    /// Fraction of worker time spent in steps ("busy"; a batch of one keeps
    /// a GPU as busy as a full one).
    pub gpu_busy_fraction: f64,
    /// Fraction of the workers' peak FLOP/s the steps used (model FLOPs
    /// utilisation, as [`crate::worker::perf::Roofline::peak_seconds`] counts them).
    pub gpu_compute_fraction: f64,
    /// Fraction of the workers' peak HBM bandwidth the steps used.
    pub gpu_hbm_fraction: f64,
    /// Preemptions.
    pub preemptions: u64,
    /// Prompt tokens prefilled, including recomputation.
    pub prefill_tokens_computed: u64,
    /// Speculative decoding's mean acceptance length: tokens a sequence's
    /// verify emits on average, `1 + accepted drafts / verifies` (vLLM's
    /// `spec_decode` metric; NaN without speculative decoding).
    pub spec_acceptance_length: f64,
    /// Time-average number of requests in the system (generated, not completed).
    pub mean_requests_in_system: f64,
    /// Its warm-up, steady latencies and stability verdict.
    pub steady: steady::SteadySummary,
    /// Share of completed requests that met the per-request SLO
    /// (`simulation.slo_ttft_ms`, `slo_tpot_ms`; NaN without one).
    pub slo_attainment: f64,
    /// Requests that met it per simulated second (DistServe's goodput at this rate; NaN without one).
    pub goodput_rps: f64,
    /// Workers at the end of the run.
    pub workers: u32,
    /// KV-cache tiers.
    pub tiers: TierSummary,
    /// KV events (stored/removed) the workers published.
    pub kv_events: u64,
    /// Batches they were sent in (one per worker per coalescing window with events).
    pub kv_event_batches: u64,
    /// Time from a KV change on a worker to the router seeing it, ms.
    pub kv_staleness_ms: LatencyStats,
    /// Fraction of KV-aware routing decisions whose predicted prefix hit was
    /// off by a chunk or more from what the request found on admission.
    pub routing_mispredictions: f64,
    /// Malformed trace lines skipped.
    pub trace_lines_skipped: u64,
    /// Trace lines whose timestamp was earlier than the line before (sent at once).
    pub trace_lines_reordered: u64,
    /// Trace lines with `output_length` 0 (sent with 1 token).
    pub trace_outputs_raised: u64,
    /// Sessions ended early: their next turn would exceed `max_context_tokens`.
    pub sessions_truncated: u64,
    /// The served model's parameters (all experts included).
    pub model_params: u64,
    /// Of those, the parameters one token uses.
    pub model_active_params: u64,
    /// The model's KV-cache bytes per token (every layer).
    pub kv_bytes_per_token: u64,
    /// What the run's GPUs and KV tiers cost in time, energy and money.
    pub cost: CostSummary,
    /// Of that, what the KV tiers' capacity cost.
    pub tier_cost: TierCost,
    /// Disaggregated prefill and decode (zeros and NaN without).
    pub pd: PdSummary,
}

/// What disaggregated prefill/decode did in a run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PdSummary {
    /// Requests prefilled on the prefill pool.
    pub remote_prefills: u64,
    /// Requests a decode worker prefilled itself (conditional disaggregation).
    pub local_prefills: u64,
    /// KV bytes pulled over the decode workers' links.
    pub link_bytes: u64,
    /// Mean share of the time the decode workers' links were transferring.
    pub link_utilization: f64,
    /// KV transfers, ms.
    pub kv_transfer_ms: LatencyStats,
    /// First token to the decode worker's first token, ms.
    pub first_decode_ms: LatencyStats,
    /// Arrival to the prefill worker's token, ms (TTFT is the client's: the decode worker's first token).
    pub ttft_prefill_ms: LatencyStats,
    /// Busy share of the prefill pool's GPUs.
    pub prefill_busy_fraction: f64,
    /// Busy share of the decode pool's GPUs.
    pub decode_busy_fraction: f64,
}

impl Default for PdSummary {
    fn default() -> Self {
        let none = LatencyHistogram::default().stats();
        PdSummary {
            remote_prefills: 0,
            local_prefills: 0,
            link_bytes: 0,
            link_utilization: f64::NAN,
            kv_transfer_ms: none,
            first_decode_ms: none,
            ttft_prefill_ms: none,
            prefill_busy_fraction: f64::NAN,
            decode_busy_fraction: f64::NAN,
        }
    }
}

/// One scheduler step of one worker (the optional `steps` table): when it
/// ran, what it held, and — with the `operators` step model — how its time
/// divides (a step takes the longer of its GPU and its CPU work).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StepRow {
    /// The worker.
    pub worker: u32,
    /// When it started, seconds.
    pub start_s: f64,
    /// How long it took, seconds.
    pub duration_s: f64,
    /// Prefill chunks in it.
    pub prefill_chunks: u32,
    /// Prompt tokens it computed.
    pub prefill_tokens: u64,
    /// Σ over its chunks of the tokens already cached before each.
    pub prefill_cached_tokens: u64,
    /// Decoding sequences in it.
    pub decodes: u64,
    /// Σ over the decoding sequences of their cached tokens.
    pub decode_context_tokens: u64,
    /// Requests preempted (by recompute) to make room for it.
    pub preempted: u32,
    /// KV loads from the tiers (or a P/D link) its scheduling started.
    pub kv_loads: u32,
    /// Tokens of KV those loads bring.
    pub kv_load_tokens: u64,
    /// Tokens of KV sent to the tiers when it ended (saved as computed, or
    /// at a request's finish).
    pub kv_saved_tokens: u64,
    /// Compute-bound GPU seconds (scaled), `operators` only.
    pub gpu_compute_s: Option<f64>,
    /// Memory-bound GPU seconds (scaled), `operators` only.
    pub gpu_memory_s: Option<f64>,
    /// All-reduce seconds (scaled), `operators` only.
    pub gpu_comm_s: Option<f64>,
    /// CPU seconds (overheads), `operators` only.
    pub cpu_s: Option<f64>,
}

impl StepRow {
    /// `prefill`, `decode` or `mixed`.
    pub fn kind(&self) -> &'static str {
        match (self.prefill_chunks > 0, self.decodes > 0) {
            (true, true) => "mixed",
            (true, false) => "prefill",
            _ => "decode",
        }
    }
}

/// What a run's (or a worker's) GPUs cost: GPU-hours, energy from the
/// board-power model ([`crate::worker::power::PowerModel::energy_j`]) and
/// dollars at the given price; NaN (null in the tables) where unknown.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CostSummary {
    /// GPUs × hours alive.
    pub gpu_hours: f64,
    /// Energy drawn, joules.
    pub energy_j: f64,
    /// Dollars (GPU-hours × price; NaN without a price).
    pub usd: f64,
}

impl Default for CostSummary {
    fn default() -> Self {
        CostSummary { gpu_hours: 0.0, energy_j: 0.0, usd: f64::NAN }
    }
}

impl std::ops::AddAssign for CostSummary {
    fn add_assign(&mut self, o: CostSummary) {
        self.gpu_hours += o.gpu_hours;
        self.energy_j += o.energy_j;
        self.usd += o.usd;
    }
}

/// What a run's KV-tier capacity cost: GiB-hours per storage tier (CPU,
/// NVMe, DFS), dollars and joules at the tiers' prices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct TierCost {
    /// GiB of capacity × hours it was provisioned, per storage tier.
    pub gib_hours: [f64; 3],
    /// Dollars (0 without prices).
    pub usd: f64,
    /// Joules (0 without power figures).
    pub energy_j: f64,
}

/// A typed value of a summary column.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SummaryValue {
    /// A count.
    Count(u64),
    /// A measurement.
    Real(f64),
    /// A label.
    Label(&'static str),
}

impl Default for RunSummary {
    /// A summary with no requests (NaN latencies); its column names and types
    /// are those of every summary.
    fn default() -> Self {
        let none = LatencyHistogram::default().stats();
        RunSummary {
            requests_generated: 0,
            requests_completed: 0,
            requests_rejected: 0,
            requests_incomplete: 0,
            sim_time_s: 0.0,
            events: 0,
            stop_reason: crate::engine::StopReason::Finished,
            input_tokens_per_s: 0.0,
            output_tokens_per_s: 0.0,
            requests_per_s: 0.0,
            ttft_ms: none,
            tpot_ms: none,
            itl_ms: none,
            e2e_ms: none,
            queue_wait_ms: none,
            kv_fetch_ms: none,
            gpu_busy_fraction: 0.0,
            gpu_compute_fraction: 0.0,
            gpu_hbm_fraction: 0.0,
            preemptions: 0,
            prefill_tokens_computed: 0,
            spec_acceptance_length: f64::NAN,
            mean_requests_in_system: 0.0,
            steady: steady::SteadySummary::default(),
            slo_attainment: f64::NAN,
            goodput_rps: f64::NAN,
            workers: 0,
            tiers: TierSummary::default(),
            kv_events: 0,
            kv_event_batches: 0,
            kv_staleness_ms: none,
            routing_mispredictions: 0.0,
            trace_lines_skipped: 0,
            trace_lines_reordered: 0,
            trace_outputs_raised: 0,
            sessions_truncated: 0,
            model_params: 0,
            model_active_params: 0,
            kv_bytes_per_token: 0,
            cost: CostSummary::default(),
            tier_cost: TierCost::default(),
            pd: PdSummary::default(),
        }
    }
}

impl RunSummary {
    /// Every column in output order, named as in `runs.parquet`.
    pub fn columns(&self) -> Vec<(String, SummaryValue)> {
        use SummaryValue::{Count, Label, Real};
        let stop = match self.stop_reason {
            crate::engine::StopReason::Finished => "finished",
            crate::engine::StopReason::TimeLimit => "time_limit",
            crate::engine::StopReason::QueueEmpty => "queue_empty",
            // An interrupted run has no summary row (its status says so).
            crate::engine::StopReason::Interrupted => "interrupted",
        };
        let mut c: Vec<(String, SummaryValue)> = vec![
            (col::REQUESTS_GENERATED.into(), Count(self.requests_generated)),
            (col::REQUESTS_COMPLETED.into(), Count(self.requests_completed)),
            (col::REQUESTS_REJECTED.into(), Count(self.requests_rejected)),
            (col::REQUESTS_INCOMPLETE.into(), Count(self.requests_incomplete)),
            (col::SIM_TIME_S.into(), Real(self.sim_time_s)),
            ("events".into(), Count(self.events)),
            ("stop_reason".into(), Label(stop)),
            (col::INPUT_TOKENS_PER_S.into(), Real(self.input_tokens_per_s)),
            (col::OUTPUT_TOKENS_PER_S.into(), Real(self.output_tokens_per_s)),
            (col::REQUESTS_PER_S.into(), Real(self.requests_per_s)),
        ];
        for (metric, stats) in [
            (LatencyMetric::Ttft, &self.ttft_ms),
            (LatencyMetric::Tpot, &self.tpot_ms),
            (LatencyMetric::Itl, &self.itl_ms),
            (LatencyMetric::E2e, &self.e2e_ms),
            (LatencyMetric::QueueWait, &self.queue_wait_ms),
            (LatencyMetric::KvFetch, &self.kv_fetch_ms),
            (LatencyMetric::KvStaleness, &self.kv_staleness_ms),
        ] {
            c.extend(stats.fields().iter().map(|(s, v)| (col::latency(metric, s), Real(*v))));
        }
        c.extend([
            (col::GPU_BUSY_FRACTION.into(), Real(self.gpu_busy_fraction)),
            (col::GPU_COMPUTE_FRACTION.into(), Real(self.gpu_compute_fraction)),
            (col::GPU_HBM_FRACTION.into(), Real(self.gpu_hbm_fraction)),
            (col::PREEMPTIONS.into(), Count(self.preemptions)),
            ("prefill_tokens_computed".into(), Count(self.prefill_tokens_computed)),
            ("spec_acceptance_length".into(), Real(self.spec_acceptance_length)),
            ("mean_requests_in_system".into(), Real(self.mean_requests_in_system)),
            ("slo_attainment".into(), Real(self.slo_attainment)),
            ("goodput_rps".into(), Real(self.goodput_rps)),
            (col::STABILITY.into(), Label(self.steady.stability.name())),
            ("warmup_s".into(), Real(self.steady.warmup_s)),
            ("warmup_requests".into(), Count(self.steady.warmup_requests)),
            ("steady_requests".into(), Count(self.steady.steady_requests)),
            (col::REQUESTS_NEEDED.into(), Count(self.steady.requests_needed)),
        ]);
        for (name, stats) in [
            ("ttft", &self.steady.ttft_ms),
            ("tpot", &self.steady.tpot_ms),
            ("e2e", &self.steady.e2e_ms),
            ("queue_wait", &self.steady.queue_wait_ms),
        ] {
            let kept = [("p50", stats.p50), ("p90", stats.p90), ("p99", stats.p99), ("mean", stats.mean)];
            c.extend(kept.iter().map(|(s, v)| (format!("{name}_steady_{s}_ms"), Real(*v))));
        }
        c.extend([
            ("workers".into(), Count(u64::from(self.workers))),
            (col::PREFIX_HIT_RATIO.into(), Real(self.tiers.prefix_hit_ratio())),
            ("hit_tokens_total".into(), Count(self.tiers.hit_tokens_total)),
            ("prefix_hit_ratio_total".into(), Real(self.tiers.prefix_hit_ratio_total())),
        ]);
        use crate::kvcache::Tier;
        for t in Tier::ALL {
            c.push((format!("hit_ratio_{}", t.short()), Real(self.tiers.hit_ratio(t))));
        }
        for t in &Tier::ALL[1..] {
            let i = t.index();
            c.push((format!("bytes_read_{}", t.short()), Count(self.tiers.bytes_read[i])));
            c.push((format!("bytes_written_{}", t.short()), Count(self.tiers.bytes_written[i])));
            c.push((format!("device_utilization_{}", t.short()), Real(self.tiers.device_utilization[i])));
            c.push((format!("occupancy_peak_{}", t.short()), Real(self.tiers.occupancy_peak[i])));
        }
        c.push(("kv_events".into(), Count(self.kv_events)));
        c.push(("kv_event_batches".into(), Count(self.kv_event_batches)));
        c.push(("routing_mispredictions".into(), Real(self.routing_mispredictions)));
        c.push(("trace_lines_skipped".into(), Count(self.trace_lines_skipped)));
        c.push(("trace_lines_reordered".into(), Count(self.trace_lines_reordered)));
        c.push(("trace_outputs_raised".into(), Count(self.trace_outputs_raised)));
        c.push(("sessions_truncated".into(), Count(self.sessions_truncated)));
        c.push(("model_params".into(), Count(self.model_params)));
        c.push(("model_active_params".into(), Count(self.model_active_params)));
        c.push(("kv_bytes_per_token".into(), Count(self.kv_bytes_per_token)));
        let p = &self.pd;
        c.extend([
            ("remote_prefills".into(), Count(p.remote_prefills)),
            ("local_prefills".into(), Count(p.local_prefills)),
            ("kv_transfer_bytes".into(), Count(p.link_bytes)),
            ("link_utilization".into(), Real(p.link_utilization)),
            ("prefill_busy_fraction".into(), Real(p.prefill_busy_fraction)),
            ("decode_busy_fraction".into(), Real(p.decode_busy_fraction)),
        ]);
        for (name, stats) in [
            ("kv_transfer", &p.kv_transfer_ms),
            ("first_decode", &p.first_decode_ms),
            ("ttft_prefill", &p.ttft_prefill_ms),
        ] {
            c.extend(stats.fields().iter().map(|(s, v)| (format!("{name}_{s}_ms"), Real(*v))));
        }
        let k = &self.cost;
        let (input, output) = (self.input_tokens_per_s * self.sim_time_s, self.output_tokens_per_s * self.sim_time_s);
        c.extend([
            ("gpu_hours".into(), Real(k.gpu_hours)),
            ("energy_kwh".into(), Real(k.energy_j / 3.6e6)),
            ("mean_power_w".into(), Real(self.gpu_power_w())),
            (col::JOULES_PER_OUTPUT_TOKEN.into(), Real(k.energy_j / output)),
            ("usd".into(), Real(k.usd)),
            ("usd_per_m_input_tokens".into(), Real(k.usd / input * 1e6)),
            (col::USD_PER_M_OUTPUT_TOKENS.into(), Real(k.usd / output * 1e6)),
        ]);
        for t in &Tier::ALL[1..] {
            c.push((format!("tier_gib_hours_{}", t.short()), Real(self.tier_cost.gib_hours[t.index() - 1])));
        }
        c.push(("tier_usd".into(), Real(self.tier_cost.usd)));
        c.push(("tier_energy_kwh".into(), Real(self.tier_cost.energy_j / 3.6e6)));
        c
    }

    /// Mean power per GPU, watts: the GPUs' energy (the run's less the KV
    /// tiers') over their GPU-hours.
    pub fn gpu_power_w(&self) -> f64 {
        (self.cost.energy_j - self.tier_cost.energy_j) / (self.cost.gpu_hours * 3600.0)
    }
}

/// Time-integral of the number of requests in the system (for Little's law).
#[derive(Clone, Copy, Debug, Default)]
pub struct InSystem {
    count: u64,
    since: SimTime,
    area_ns: u128,
}

impl InSystem {
    /// The count changes by `delta` at `now`.
    pub fn change(&mut self, now: SimTime, delta: i64) {
        self.area_ns += u128::from(self.count) * u128::from((now - self.since).0);
        self.since = now;
        self.count = self.count.checked_add_signed(delta).expect("more requests left than entered");
    }

    /// Requests in the system now.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Time-average count over [0, `end`].
    pub fn mean(&self, end: SimTime) -> f64 {
        if end.0 == 0 {
            return 0.0;
        }
        let area = self.area_ns + u128::from(self.count) * u128::from(end.saturating_since(self.since).0);
        area as f64 / end.0 as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recording_a_ramp_equals_recording_its_steps_one_by_one() {
        // Rising across bucket edges (3 significant digits of µs), flat, falling, and 1-step ramps.
        for (first, last, len) in
            [(9_990_000, 10_050_000, 201), (2_047_100, 2_049_900, 1_000), (5, 5, 9), (80_000, 60_001, 40), (777, 1, 1)]
        {
            let r = Ramp { first, last, len };
            for (k0, k1) in [(0, len), (len / 3, len), (0, 1)] {
                let mut at_once = LatencyHistogram::default();
                at_once.record_ramp(&r, k0, k1, r.sum(k0, k1), 8);
                let mut one_by_one = LatencyHistogram::default();
                (k0..k1).for_each(|k| one_by_one.record_n(SimDuration(r.at(k)), 8));
                assert_eq!(at_once.histogram(), one_by_one.histogram(), "{r:?} {k0}..{k1}");
                assert_eq!(at_once.stats(), one_by_one.stats());
                assert_eq!(at_once.count(), 8 * (k1 - k0));
            }
        }
    }

    #[test]
    fn histogram_percentiles_are_in_ms_and_mean_and_max_exact() {
        let mut h = LatencyHistogram::default();
        // 998 samples of 1 ms and two of 1.5 s: the 999th-ranked sample is 1.5 s.
        h.record_n(SimDuration(1_000_000), 998);
        h.record_n(SimDuration(1_500_000_000), 2);
        let s = h.stats();
        assert_eq!(s.p50, 1.0);
        assert_eq!(s.p99, 1.0);
        // 1.5e6 µs is stored with 3 significant digits: the bucket's highest equivalent value.
        assert!((s.p999 - 1500.0).abs() / 1500.0 < 1e-3, "{}", s.p999);
        assert!((s.mean - (998.0 + 3000.0) / 1000.0).abs() < 1e-12);
        assert_eq!(s.max, 1500.0);
        assert_eq!(h.count(), 1000);
        // One sample of 6,801 ms: its bucket's top is 6,803.2 ms, above the
        // exact maximum; every percentile is clamped to it.
        let mut one = LatencyHistogram::default();
        one.record(SimDuration(6_801_000_000));
        assert!(one.histogram().value_at_quantile(0.99) > 6_801_000);
        assert_eq!((one.stats().p50, one.stats().p99, one.stats().max), (6801.0, 6801.0, 6801.0));
        assert!(LatencyHistogram::default().stats().p50.is_nan());
    }

    #[test]
    fn in_system_integrates_the_count_over_time() {
        let mut n = InSystem::default();
        n.change(SimTime(0), 1); // 1 in [0, 10)
        n.change(SimTime(10), 1); // 2 in [10, 20)
        n.change(SimTime(20), -2); // 0 in [20, 40)
        // area = 10 + 20 = 30 over 40 ns.
        assert_eq!(n.mean(SimTime(40)), 0.75);
    }
}
