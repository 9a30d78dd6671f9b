//! Each output row type declares its columns once, here: name, type and
//! value together in one [`Row::visit`]. The output layer writes any row
//! generically ([`columns_of`] for the schema, [`cells_of`] for the
//! values), and the report reads the columns it needs by the names in
//! [`col`], the same constants the rows are written with.

use super::{IntervalRow, RequestRecord, Sc25Row, StageRow, StepRow, WorkerRow};
use crate::kvcache::Tier;
use crate::metrics::table::{Cell, ColType};
use crate::workload::Label;
use std::fmt::Arguments;

/// Column names other modules read (the report), shared with the rows that write them.
pub mod col {
    /// Every table's first column.
    pub const RUN_ID: &str = "run_id";
    /// Requests: the request (their order within a run).
    pub const REQUEST_ID: &str = "request_id";
    /// Steps: the worker (their order within a run, after the start).
    pub const WORKER: &str = "worker";
    /// Steps: when the step started (their order within a run).
    pub const START_S: &str = "start_s";
    /// Runs: the grid point.
    pub const POINT_ID: &str = "point_id";
    /// Runs: the replicate.
    pub const REPLICATE: &str = "replicate";
    /// Runs: `ok`, `failed` or `interrupted`.
    pub const STATUS: &str = "status";
    /// Runs: why a run failed.
    pub const ERROR: &str = "error";
    /// Histograms: the latency metric.
    pub const METRIC: &str = "metric";
    /// Histograms: the HDR histogram's bytes.
    pub const HDR: &str = "hdr";
    /// Timeseries: the interval's start.
    pub const INTERVAL_START_S: &str = "interval_start_s";
    /// Runs: requests completed; timeseries: responses in the interval.
    pub const REQUESTS_COMPLETED: &str = "requests_completed";
    /// Timeseries, sc25: prompt tokens.
    pub const PROMPT_TOKENS: &str = "prompt_tokens";
    /// Timeseries: output tokens generated in the interval.
    pub const GENERATED_TOKENS: &str = "generated_tokens";
    /// Timeseries: requests waiting.
    pub const QUEUE_DEPTH: &str = "queue_depth";
    /// Timeseries: workers accepting requests.
    pub const ACTIVE_WORKERS: &str = "active_workers";
    /// Timeseries: share of the interval the GPUs were busy.
    pub const GPU_BUSY_FRACTION: &str = "gpu_busy_fraction";
    /// Timeseries: share of peak compute used.
    pub const GPU_COMPUTE_FRACTION: &str = "gpu_compute_fraction";
    /// Timeseries: share of peak memory bandwidth used.
    pub const GPU_HBM_FRACTION: &str = "gpu_hbm_fraction";
    /// Sc25: TTFT of the cold pass.
    pub const COLD_TTFT_MS: &str = "cold_ttft_ms";
    /// Sc25: TTFT of the warm pass.
    pub const WARM_TTFT_MS: &str = "warm_ttft_ms";
    /// Stages: the stage's index.
    pub const STAGE: &str = "stage";
    /// Stages: the stage's type.
    pub const TYPE: &str = "type";
    /// Runs: requests rejected (longer than the engine serves).
    pub const REQUESTS_REJECTED: &str = "requests_rejected";
    /// Runs: requests in flight when the run stopped.
    pub const REQUESTS_INCOMPLETE: &str = "requests_incomplete";
    /// Runs: simulated seconds covered.
    pub const SIM_TIME_S: &str = "sim_time_s";
    /// Runs: prompt tokens of completed requests per simulated second.
    pub const INPUT_TOKENS_PER_S: &str = "input_tokens_per_s";
    /// Runs: output tokens of completed requests per simulated second.
    pub const OUTPUT_TOKENS_PER_S: &str = "output_tokens_per_s";

    /// Runs: the run's seed.
    pub const SEED: &str = "seed";
    /// Runs: the run's identity (its scenario and seed), kept across resumes.
    pub const RUN_KEY: &str = "run_key";
    /// Runs: wall-clock seconds the run took.
    pub const WALL_S: &str = "wall_s";
    /// Histograms: samples recorded.
    pub const COUNT: &str = "count";
    /// Runs, stages: requests the workload generated.
    pub const REQUESTS_GENERATED: &str = "requests_generated";
    /// Runs, stages: completed requests per simulated second.
    pub const REQUESTS_PER_S: &str = "requests_per_s";
    /// Runs, workers, requests: preemptions.
    pub const PREEMPTIONS: &str = "preemptions";
    /// Runs, workers, stages: share of prompt tokens found cached.
    pub const PREFIX_HIT_RATIO: &str = "prefix_hit_ratio";
    /// Runs: `stable`, `too_short` or `unstable`.
    pub const STABILITY: &str = "stability";
    /// Runs: for a `too_short` run, the run length its warm-up and queue drains suggest.
    pub const REQUESTS_NEEDED: &str = "requests_needed";
    /// Runs: dollars per million output tokens.
    pub const USD_PER_M_OUTPUT_TOKENS: &str = "usd_per_m_output_tokens";
    /// Runs: joules per output token.
    pub const JOULES_PER_OUTPUT_TOKEN: &str = "joules_per_output_token";
    /// Runs: TTFT p50 (`latency(Ttft, "p50")`).
    pub const TTFT_P50_MS: &str = "ttft_p50_ms";
    /// Runs: TTFT p99.
    pub const TTFT_P99_MS: &str = "ttft_p99_ms";
    /// Runs: TPOT p50.
    pub const TPOT_P50_MS: &str = "tpot_p50_ms";
    /// Runs: TPOT p99.
    pub const TPOT_P99_MS: &str = "tpot_p99_ms";
    /// Runs: E2E p50.
    pub const E2E_P50_MS: &str = "e2e_p50_ms";
    /// Runs: E2E p99.
    pub const E2E_P99_MS: &str = "e2e_p99_ms";
    /// Runs: queue wait p99.
    pub const QUEUE_WAIT_P99_MS: &str = "queue_wait_p99_ms";
    /// Steps: how long the step took.
    pub const DURATION_S: &str = "duration_s";
    /// Steps: `prefill`, `decode`, `mixed` or `idle`.
    pub const KIND: &str = "kind";
    /// Steps: prefill chunks in the step.
    pub const PREFILL_CHUNKS: &str = "prefill_chunks";
    /// Steps: prompt tokens computed.
    pub const PREFILL_TOKENS: &str = "prefill_tokens";
    /// Steps: prompt tokens of its chunks already cached.
    pub const PREFILL_CACHED_TOKENS: &str = "prefill_cached_tokens";
    /// Steps: sequences that decoded one token.
    pub const DECODES: &str = "decodes";
    /// Steps: the decoders' context tokens.
    pub const DECODE_CONTEXT_TOKENS: &str = "decode_context_tokens";
    /// Steps: requests preempted since the last step started.
    pub const PREEMPTED: &str = "preempted";
    /// Steps: KV loads started since the last step started.
    pub const KV_LOADS: &str = "kv_loads";
    /// Steps: the tokens those loads bring.
    pub const KV_LOAD_TOKENS: &str = "kv_load_tokens";
    /// Steps: tokens saved to the tiers at its end.
    pub const KV_SAVED_TOKENS: &str = "kv_saved_tokens";
    /// Steps: the compute part of its time (operator model).
    pub const GPU_COMPUTE_S: &str = "gpu_compute_s";
    /// Steps: the memory part of its time (operator model).
    pub const GPU_MEMORY_S: &str = "gpu_memory_s";
    /// Steps: the communication part of its time (operator model).
    pub const GPU_COMM_S: &str = "gpu_comm_s";
    /// Steps: the counts and times the timeline shows with each step.
    pub const STEP_NUMBERS: [&str; 12] = [
        PREFILL_CHUNKS,
        PREFILL_TOKENS,
        PREFILL_CACHED_TOKENS,
        DECODES,
        DECODE_CONTEXT_TOKENS,
        PREEMPTED,
        KV_LOADS,
        KV_LOAD_TOKENS,
        KV_SAVED_TOKENS,
        GPU_COMPUTE_S,
        GPU_MEMORY_S,
        GPU_COMM_S,
    ];

    /// Runs: statistic `stat` (`p50`, `p90`, `p95`, `p99`, `p999`, `mean`,
    /// `max`) of a latency metric, milliseconds.
    pub fn latency(metric: crate::metrics::LatencyMetric, stat: &str) -> String {
        format!("{}_{stat}_ms", metric.name())
    }
}

/// Where a row's columns go: the schema, or a row's cells.
pub trait Sink<'a> {
    /// One column: its name (formatted only when the schema is built), type and this row's value.
    fn col(&mut self, name: Arguments<'_>, t: ColType, v: Cell<'a>);
}

/// A row of an output table (after its `run_id`).
pub trait Row: Default {
    /// Every column in order, with this row's value.
    fn visit<'a, S: Sink<'a>>(&'a self, s: &mut S);
}

struct Schema(Vec<(String, ColType)>);

impl Sink<'_> for Schema {
    fn col(&mut self, name: Arguments<'_>, t: ColType, _: Cell<'_>) {
        self.0.push((name.to_string(), t));
    }
}

struct Cells<'a, 'b>(&'b mut Vec<Cell<'a>>);

impl<'a> Sink<'a> for Cells<'a, '_> {
    fn col(&mut self, _: Arguments<'_>, _: ColType, v: Cell<'a>) {
        self.0.push(v);
    }
}

/// The columns of rows of type `R`.
pub fn columns_of<R: Row>() -> Vec<(String, ColType)> {
    let mut s = Schema(Vec::new());
    R::default().visit(&mut s);
    s.0
}

/// Appends `row`'s cells to `out`.
pub fn cells_of<'a, R: Row>(row: &'a R, out: &mut Vec<Cell<'a>>) {
    row.visit(&mut Cells(out));
}

fn opt(v: Option<f64>) -> Cell<'static> {
    v.map_or(Cell::Null, Cell::F64)
}

use ColType::{Bool, F64, Str, U32, U64};

impl Row for IntervalRow {
    fn visit<'a, S: Sink<'a>>(&'a self, s: &mut S) {
        s.col(format_args!("{}", col::INTERVAL_START_S), F64, Cell::F64(self.start_s));
        s.col(format_args!("{}", col::REQUESTS_COMPLETED), U64, Cell::U64(self.requests_completed));
        s.col(format_args!("{}", col::PROMPT_TOKENS), U64, Cell::U64(self.prompt_tokens));
        s.col(format_args!("{}", col::GENERATED_TOKENS), U64, Cell::U64(self.generated_tokens));
        s.col(format_args!("{}", col::TTFT_P50_MS), F64, Cell::F64(self.ttft_p50_ms));
        s.col(format_args!("{}", col::TTFT_P99_MS), F64, Cell::F64(self.ttft_p99_ms));
        s.col(format_args!("{}", col::QUEUE_DEPTH), U64, Cell::U64(self.queue_depth));
        s.col(format_args!("queue_depth_prefill"), U64, Cell::U64(self.queue_depth_prefill));
        s.col(format_args!("running"), U64, Cell::U64(self.running));
        s.col(format_args!("{}", col::ACTIVE_WORKERS), U32, Cell::U32(self.active_workers));
        s.col(format_args!("{}", col::GPU_BUSY_FRACTION), F64, Cell::F64(self.gpu_busy_fraction));
        s.col(format_args!("{}", col::GPU_COMPUTE_FRACTION), F64, Cell::F64(self.gpu_compute_fraction));
        s.col(format_args!("{}", col::GPU_HBM_FRACTION), F64, Cell::F64(self.gpu_hbm_fraction));
        s.col(format_args!("gpu_kv_usage"), F64, Cell::F64(self.gpu_kv_usage));
        for (t, &h) in Tier::ALL.iter().zip(&self.hit_tokens) {
            s.col(format_args!("hit_tokens_{}", t.short()), U64, Cell::U64(h));
        }
        for (t, &b) in Tier::ALL.iter().zip(&self.tier_bytes).skip(1) {
            s.col(format_args!("bytes_{}", t.short()), U64, Cell::U64(b));
        }
    }
}

impl Row for WorkerRow {
    fn visit<'a, S: Sink<'a>>(&'a self, s: &mut S) {
        s.col(format_args!("worker"), U32, Cell::U32(self.worker));
        s.col(format_args!("started_s"), F64, Cell::F64(self.started_s));
        s.col(format_args!("requests_routed"), U64, Cell::U64(self.requests_routed));
        s.col(format_args!("requests_completed"), U64, Cell::U64(self.requests_completed));
        s.col(format_args!("{}", col::PREFIX_HIT_RATIO), F64, Cell::F64(self.prefix_hit_ratio));
        s.col(format_args!("busy_s"), F64, Cell::F64(self.busy_s));
        s.col(format_args!("busy_fraction"), F64, Cell::F64(self.busy_fraction));
        s.col(format_args!("compute_fraction"), F64, Cell::F64(self.compute_fraction));
        s.col(format_args!("hbm_fraction"), F64, Cell::F64(self.hbm_fraction));
        s.col(format_args!("{}", col::PREEMPTIONS), U64, Cell::U64(self.preemptions));
        s.col(format_args!("chunks_indexed"), U64, Cell::U64(self.chunks_indexed));
        s.col(format_args!("gpu_hours"), F64, Cell::F64(self.cost.gpu_hours));
        s.col(format_args!("energy_j"), F64, Cell::F64(self.cost.energy_j));
        s.col(format_args!("usd"), F64, Cell::F64(self.cost.usd));
        s.col(format_args!("role"), Str, Cell::Str(self.role));
        s.col(format_args!("group"), Str, Cell::Str(&self.group));
        s.col(format_args!("link_bytes"), U64, Cell::U64(self.link_bytes));
    }
}

impl Row for StageRow {
    fn visit<'a, S: Sink<'a>>(&'a self, s: &mut S) {
        s.col(format_args!("{}", col::STAGE), U32, Cell::U32(self.stage));
        s.col(format_args!("{}", col::TYPE), Str, Cell::Str(self.kind));
        s.col(format_args!("start_s"), F64, Cell::F64(self.start_s));
        s.col(format_args!("end_s"), F64, Cell::F64(self.end_s));
        s.col(format_args!("{}", col::REQUESTS_GENERATED), U64, Cell::U64(self.requests_generated));
        s.col(format_args!("requests_completed"), U64, Cell::U64(self.requests_completed));
        s.col(format_args!("requests_rejected"), U64, Cell::U64(self.requests_rejected));
        s.col(format_args!("{}", col::REQUESTS_PER_S), F64, Cell::F64(self.requests_per_s));
        s.col(format_args!("input_tokens_per_s"), F64, Cell::F64(self.input_tokens_per_s));
        s.col(format_args!("output_tokens_per_s"), F64, Cell::F64(self.output_tokens_per_s));
        s.col(format_args!("{}", col::PREFIX_HIT_RATIO), F64, Cell::F64(self.prefix_hit_ratio));
        for (stem, stats) in self.latencies() {
            for (suffix, v) in stats.fields() {
                s.col(format_args!("{stem}_{suffix}_ms"), F64, Cell::F64(v));
            }
        }
    }
}

impl Row for RequestRecord {
    fn visit<'a, S: Sink<'a>>(&'a self, s: &mut S) {
        s.col(format_args!("{}", col::REQUEST_ID), U32, Cell::U32(self.id));
        s.col(format_args!("stage"), U32, Cell::U32(self.stage));
        s.col(format_args!("worker"), U32, self.worker.map_or(Cell::Null, Cell::U32));
        s.col(format_args!("arrival_s"), F64, Cell::F64(self.arrival_s));
        s.col(format_args!("prompt_tokens"), U32, Cell::U32(self.prompt_tokens));
        s.col(format_args!("output_tokens"), U32, Cell::U32(self.output_tokens));
        s.col(format_args!("prompt_hash"), U64, Cell::U64(self.prompt_hash));
        s.col(format_args!("prefill_tokens_computed"), U64, Cell::U64(self.prefill_tokens_computed));
        s.col(format_args!("queue_wait_s"), F64, opt(self.queue_wait_s));
        s.col(format_args!("ttft_s"), F64, opt(self.ttft_s));
        s.col(format_args!("e2e_s"), F64, opt(self.e2e_s));
        s.col(format_args!("tpot_s"), F64, opt(self.tpot_s));
        s.col(format_args!("{}", col::PREEMPTIONS), U32, Cell::U32(self.preemptions));
        s.col(format_args!("completed"), Bool, Cell::Bool(self.completed));
        s.col(format_args!("kv_fetch_s"), F64, opt(self.kv_fetch_s));
        for (t, &h) in Tier::ALL.iter().zip(&self.hit_tokens) {
            s.col(format_args!("hit_tokens_{}", t.short()), U64, Cell::U64(h));
        }
        s.col(format_args!("hit_tokens_total"), U64, Cell::U64(self.hit_tokens_total));
        for (t, &b) in Tier::ALL.iter().zip(&self.read_bytes).skip(1) {
            s.col(format_args!("read_bytes_{}", t.short()), U64, Cell::U64(b));
        }
        let (pass, session, turn) = match self.label {
            Label::None => (Cell::Null, Cell::Null, Cell::Null),
            Label::Sc25 { warm } => (Cell::Str(if warm { "warm" } else { "cold" }), Cell::Null, Cell::Null),
            Label::Session { session, turn } => (Cell::Null, Cell::U32(session), Cell::U32(turn)),
        };
        s.col(format_args!("sc25_pass"), Str, pass);
        s.col(format_args!("session"), U32, session);
        s.col(format_args!("turn"), U32, turn);
    }
}

impl Row for StepRow {
    fn visit<'a, S: Sink<'a>>(&'a self, s: &mut S) {
        s.col(format_args!("{}", col::WORKER), U32, Cell::U32(self.worker));
        s.col(format_args!("{}", col::START_S), F64, Cell::F64(self.start_s));
        s.col(format_args!("{}", col::DURATION_S), F64, Cell::F64(self.duration_s));
        s.col(format_args!("{}", col::KIND), Str, Cell::Str(self.kind()));
        s.col(format_args!("{}", col::PREFILL_CHUNKS), U32, Cell::U32(self.prefill_chunks));
        s.col(format_args!("{}", col::PREFILL_TOKENS), U64, Cell::U64(self.prefill_tokens));
        s.col(format_args!("{}", col::PREFILL_CACHED_TOKENS), U64, Cell::U64(self.prefill_cached_tokens));
        s.col(format_args!("{}", col::DECODES), U64, Cell::U64(self.decodes));
        s.col(format_args!("{}", col::DECODE_CONTEXT_TOKENS), U64, Cell::U64(self.decode_context_tokens));
        s.col(format_args!("{}", col::PREEMPTED), U32, Cell::U32(self.preempted));
        s.col(format_args!("{}", col::KV_LOADS), U32, Cell::U32(self.kv_loads));
        s.col(format_args!("{}", col::KV_LOAD_TOKENS), U64, Cell::U64(self.kv_load_tokens));
        s.col(format_args!("{}", col::KV_SAVED_TOKENS), U64, Cell::U64(self.kv_saved_tokens));
        s.col(format_args!("{}", col::GPU_COMPUTE_S), F64, opt(self.gpu_compute_s));
        s.col(format_args!("{}", col::GPU_MEMORY_S), F64, opt(self.gpu_memory_s));
        s.col(format_args!("{}", col::GPU_COMM_S), F64, opt(self.gpu_comm_s));
        s.col(format_args!("cpu_s"), F64, opt(self.cpu_s));
    }
}

impl Row for Sc25Row {
    fn visit<'a, S: Sink<'a>>(&'a self, s: &mut S) {
        s.col(format_args!("{}", col::PROMPT_TOKENS), U32, Cell::U32(self.prompt_tokens));
        s.col(format_args!("{}", col::COLD_TTFT_MS), F64, opt(self.cold_ttft_ms));
        s.col(format_args!("{}", col::WARM_TTFT_MS), F64, opt(self.warm_ttft_ms));
        s.col(format_args!("cold_prefill_tokens"), U64, Cell::U64(self.cold_prefill_tokens));
        s.col(format_args!("warm_prefill_tokens"), U64, Cell::U64(self.warm_prefill_tokens));
        s.col(format_args!("warm_kv_fetch_ms"), F64, opt(self.warm_kv_fetch_ms));
        for (t, &h) in Tier::ALL.iter().zip(&self.warm_hit_tokens) {
            s.col(format_args!("warm_hit_tokens_{}", t.short()), U64, Cell::U64(h));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_named_latency_columns_are_the_ones_the_runs_table_writes() {
        use crate::metrics::LatencyMetric::{E2e, QueueWait, Tpot, Ttft};
        let named = [
            (col::TTFT_P50_MS, Ttft, "p50"),
            (col::TTFT_P99_MS, Ttft, "p99"),
            (col::TPOT_P50_MS, Tpot, "p50"),
            (col::TPOT_P99_MS, Tpot, "p99"),
            (col::E2E_P50_MS, E2e, "p50"),
            (col::E2E_P99_MS, E2e, "p99"),
            (col::QUEUE_WAIT_P99_MS, QueueWait, "p99"),
        ];
        let written: Vec<String> =
            crate::metrics::RunSummary::default().columns().into_iter().map(|(n, _)| n).collect();
        for (name, metric, stat) in named {
            assert_eq!(name, col::latency(metric, stat));
            assert!(written.iter().any(|w| w == name), "{name} is not a runs column");
        }
        let steps: Vec<String> = columns_of::<StepRow>().into_iter().map(|(n, _)| n).collect();
        for name in col::STEP_NUMBERS.iter().chain(&[col::DURATION_S, col::KIND]) {
            assert!(steps.iter().any(|s| s == name), "{name} is not a steps column");
        }
    }

    #[test]
    fn a_rows_cells_match_its_columns_one_for_one_and_in_type() {
        fn check<R: Row>(row: &R) {
            let cols = columns_of::<R>();
            let mut cells = Vec::new();
            cells_of(row, &mut cells);
            assert_eq!(cols.len(), cells.len());
            for ((name, t), c) in cols.iter().zip(&cells) {
                let ok = matches!(
                    (t, c),
                    (_, Cell::Null)
                        | (U32, Cell::U32(_))
                        | (U64, Cell::U64(_))
                        | (F64, Cell::F64(_))
                        | (Bool, Cell::Bool(_))
                        | (Str, Cell::Str(_))
                );
                assert!(ok, "{name}: {t:?} holds {c:?}");
            }
        }
        check(&IntervalRow::default());
        check(&WorkerRow::default());
        check(&StageRow::default());
        check(&RequestRecord { label: Label::Session { session: 1, turn: 2 }, ..RequestRecord::default() });
        check(&StepRow::default());
        check(&Sc25Row::default());
        let names: Vec<String> = columns_of::<IntervalRow>().into_iter().map(|c| c.0).collect();
        assert_eq!(names[0], col::INTERVAL_START_S);
        assert_eq!(names.last().map(String::as_str), Some("bytes_dfs"));
        assert_eq!(names.len(), 14 + 4 + 3);
    }
}
