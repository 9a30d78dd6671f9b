//! The scenario file as written (TOML), section and key names as in the
//! original Opal's JSON configuration. Every key has a default; defaults equal
//! Opal's `configs/defaults.json` where it has one (differences are noted on
//! the field). Units are in the key names or the comments:
//! `memory_gb`/`capacity_GB` are GiB (2³⁰ B), `bandwidth_GBps` 10⁹ B/s,
//! `mem_bw_TBps` 10¹² B/s, `tflops` 10¹² FLOP/s, times in seconds.
//!
//! These structs only describe shape; [`super::resolve`] validates values.

use serde::{Deserialize, Serialize};

/// A spec file: optional `[sweep]` settings and axes (`[grid]`, `[[zip]]`)
/// plus the scenario sections. A file with no axes and one replicate is a
/// single run.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SpecFile {
    /// Sweep settings.
    #[serde(default)]
    pub sweep: SweepSection,
    /// Axes varied independently (Cartesian product): dotted scenario path → list of values.
    #[serde(default)]
    pub grid: toml::Table,
    /// Groups of paths varied together (each group is one axis; its lists have equal length).
    #[serde(default)]
    pub zip: Vec<toml::Table>,
    /// Search, per grid point, for the largest (or smallest) value of one parameter that meets an SLO.
    #[serde(default)]
    pub search: Option<SearchSection>,
    /// Run length, seed and cluster size.
    #[serde(default)]
    pub simulation: SimulationSection,
    /// Which model is served.
    #[serde(default)]
    pub model: ModelSection,
    /// The request router.
    #[serde(default)]
    pub router: RouterSection,
    /// The request workload (stages run in sequence).
    #[serde(default)]
    pub workload: WorkloadSection,
    /// The vLLM-like workers.
    #[serde(default)]
    pub worker: WorkerSection,
    /// The KV-cache tiers below the GPU.
    #[serde(default)]
    pub kvc: KvcSection,
    /// Prefill and decode on separate worker pools (absent: every worker does both).
    #[serde(default)]
    pub disaggregation: Option<DisaggregationSection>,
    /// Groups of workers of unequal hardware behind one router (`[[worker_groups]]`; absent: `simulation.num_workers` copies of `[worker]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub worker_groups: Vec<WorkerGroupSection>,
}

/// `[search]`: per grid point, the largest (or smallest) value of one
/// parameter whose runs meet every SLO constraint (`kind = "capacity"`), or
/// the Pareto frontier of objectives over a lattice of parameter values
/// (`kind = "pareto"`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SearchSection {
    /// `capacity` (the default: one parameter's largest or smallest value meeting the SLO) or `pareto` (the frontier of `objectives` over `parameters`).
    #[serde(default)]
    pub kind: Option<String>,
    /// The searched parameter, a dotted scenario path (e.g. `workload.stages.0.workload_params.request_rate`).
    #[serde(default)]
    pub parameter: Option<String>,
    /// Smallest value searched.
    #[serde(default)]
    pub min: Option<f64>,
    /// Largest value searched.
    #[serde(default)]
    pub max: Option<f64>,
    /// `maximize` (the largest value meeting the SLO, e.g. a rate) or `minimize` (the smallest, e.g. a worker count).
    #[serde(default = "default_direction")]
    pub direction: String,
    /// Constraints on runs-table columns, all to hold, e.g. `["ttft_p99_ms <= 2000", "tpot_p99_ms <= 50"]` (a Pareto search may have none).
    #[serde(default)]
    pub slo: Vec<String>,
    /// Probes lie on a geometric grid of this relative step (so the answer is this precise and does not depend on `min`); integers step by one.
    #[serde(default = "default_tolerance")]
    pub tolerance: f64,
    /// Search whole numbers (default: when the parameter's value in the scenario is an integer).
    #[serde(default)]
    pub integer: Option<bool>,
    /// Most probes per grid point.
    #[serde(default = "default_max_probes")]
    pub max_probes: u32,
    /// Most replicates a probe grows to (from `sweep.replicates`, doubling) while its 95 % interval straddles a threshold (default 8).
    #[serde(default)]
    pub max_replicates: Option<u32>,
    /// `pareto`: each parameter's candidate values, in order (dotted path → list; 1 to 3 parameters).
    #[serde(default)]
    pub parameters: toml::Table,
    /// `pareto`: what to optimise, e.g. `["min usd_per_m_output_tokens", "min ttft_p99_ms", "max output_tokens_per_s"]`.
    #[serde(default)]
    pub objectives: Vec<String>,
    /// `pareto`: most lattice points to evaluate per grid point (default: all of them).
    #[serde(default)]
    pub max_points: Option<u32>,
}

fn default_direction() -> String {
    "maximize".into()
}

fn default_tolerance() -> f64 {
    0.01
}

fn default_max_probes() -> u32 {
    40
}

/// `[disaggregation]`: prefill and decode on separate worker pools (Dynamo,
/// llm-d, Mooncake style), the prompt's KV moved between them over a link.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
#[allow(non_snake_case)]
pub struct DisaggregationSection {
    /// The prefill pool (`[disaggregation.prefill]`); `count = 0` makes the decode pool's workers mixed (a sweep's baseline).
    pub prefill: Option<PoolSection>,
    /// The decode pool (`[disaggregation.decode]`).
    pub decode: Option<PoolSection>,
    /// Prefill remotely only when the prompt's part not cached on the decode worker is longer than this many tokens (Dynamo's `max_local_prefill_length`).
    pub max_local_prefill_length: i64,
    /// Prefill locally when the prefill pool has at least this many requests waiting (Dynamo's prefill queue); -1 = never for this reason.
    pub max_prefill_queue_size: i64,
    /// Bandwidth of each decode worker's link (NIC) over which it pulls KV, 10⁹ bytes/s, shared by its transfers.
    pub link_bandwidth_GBps: f64,
    /// Latency of one KV transfer, microseconds.
    pub link_latency_usec: f64,
    /// How a prompt's KV reaches its decode worker: `link` (pulled point to point from the prefill worker, as vLLM's NixlConnector) or `store` (through the shared DistributedFS tier: the prefill worker's writes complete before the hand-over and the decode worker loads the chunks, as LMCache's and Mooncake's stores).
    pub kv_path: String,
}

impl Default for DisaggregationSection {
    fn default() -> Self {
        DisaggregationSection {
            prefill: None,
            decode: None,
            max_local_prefill_length: 1000,
            max_prefill_queue_size: -1,
            link_bandwidth_GBps: 50.0,
            link_latency_usec: 20.0,
            kv_path: "link".into(),
        }
    }
}

/// `[disaggregation.prefill]`, `[disaggregation.decode]`: a pool of identical workers.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSection {
    /// Workers in the pool.
    pub count: i64,
    /// The pool's GPU (default: `worker.hw.gpu`).
    #[serde(default)]
    pub gpu: Option<String>,
    /// The pool's tensor-parallel degree (default: `worker.hw.tp`).
    #[serde(default)]
    pub tp: Option<u32>,
    /// The pool's pipeline-parallel stages (default: `worker.hw.pp`).
    #[serde(default)]
    pub pp: Option<u32>,
    /// The pool's `[worker.vllm_params]` overrides (e.g. `{ max_num_batched_tokens = 16384 }`).
    #[serde(default)]
    pub vllm_params: Option<toml::Table>,
}

/// `[[worker_groups]]`: `count` workers of one kind — `[worker]`'s settings
/// with the group's GPU, TP, price and vLLM overrides (a fleet mixing
/// generations, say 8 A100 and 8 H100, behind one router).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerGroupSection {
    /// The group's name (the workers table's `group`; unique).
    pub name: String,
    /// Workers in the group (0 leaves it out, for a sweep's baseline).
    pub count: i64,
    /// The group's GPU preset (default: `worker.hw.gpu`).
    #[serde(default)]
    pub gpu: Option<String>,
    /// The group's tensor-parallel degree (default: `worker.hw.tp`).
    #[serde(default)]
    pub tp: Option<u32>,
    /// The group's pipeline-parallel stages (default: `worker.hw.pp`).
    #[serde(default)]
    pub pp: Option<u32>,
    /// Price of one of the group's GPU-hours, US dollars (default: `worker.hw.usd_per_gpu_hour`).
    #[serde(default)]
    pub usd_per_gpu_hour: Option<f64>,
    /// The group's `[worker.vllm_params]` overrides (e.g. `{ max_num_seqs = 128 }`; `block_size` and `max_model_len` are the fleet's).
    #[serde(default)]
    pub vllm_params: Option<toml::Table>,
    /// With `[disaggregation]`: the pool the group's workers join, `prefill` or `decode`.
    #[serde(default)]
    pub role: Option<String>,
    /// One worker's capacity relative to the other groups', by which load-based routing divides its load (default: estimated from the step model, see the README).
    #[serde(default)]
    pub capacity: Option<f64>,
}

/// `[sweep]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SweepSection {
    /// Name of the study; results go to `results/<name>/` by default.
    /// Defaults to the spec file's stem.
    pub name: Option<String>,
    /// Output directory, relative to the spec file (as every path in a spec is); overrides `results/<name>/` (which is relative to the current directory).
    pub output: Option<String>,
    /// Runs per grid point, each with its own seed (default 1).
    pub replicates: Option<u32>,
    /// Seed of replicate 0; replicate r runs with `base_seed + r` (default `simulation.seed`).
    pub base_seed: Option<u64>,
    /// Tables to write: `runs` (always), `histograms`, `timeseries`, `workers`,
    /// `stages`, `sc25`, `requests`, `steps` (default: all but requests and steps;
    /// sc25 only with an SC25Workload stage).
    pub tables: Option<Vec<String>>,
    /// Time-series interval for every run, seconds (overrides `simulation.time_series_interval_sec`).
    pub time_series_interval_sec: Option<f64>,
    /// A scenario file to use as the base (relative to this spec); the spec
    /// then holds only `[sweep]`, `[grid]` and `[[zip]]` (unset: the spec is its own scenario).
    pub base: Option<String>,
    /// Write the HTML report (`opal-sweep report`) into `<output>/report/`
    /// when the sweep finishes (default false).
    pub report: Option<bool>,
}

/// `[simulation]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimulationSection {
    /// Simulated seconds to run; `-1` runs until the workload is done.
    pub simulation_time: f64,
    /// Run seed (the root of every random stream).
    pub seed: u64,
    /// Workers at start.
    pub num_workers: u32,
    /// Width of one time-series interval, simulated seconds (not in Opal, which samples every second).
    pub time_series_interval_sec: f64,
    /// A request meets its SLO when its TTFT is at most this, ms (with `slo_tpot_ms`: both); gives `slo_attainment` and `goodput_rps` (DistServe's goodput). Unset (with `slo_tpot_ms`): no per-request SLO, both null.
    pub slo_ttft_ms: Option<f64>,
    /// A request meets its SLO when its TPOT is at most this, ms (one-token answers meet it); unset: no TPOT bound.
    pub slo_tpot_ms: Option<f64>,
}

impl Default for SimulationSection {
    fn default() -> Self {
        SimulationSection {
            simulation_time: -1.0,
            seed: 42,
            num_workers: 1,
            time_series_interval_sec: 1.0,
            slo_ttft_ms: None,
            slo_tpot_ms: None,
        }
    }
}

/// `[model]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// `[model.model_params]`.
    #[serde(default)]
    pub model_params: ModelParams,
}

/// `[model.model_params]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelParams {
    /// A model preset (`opal-sweep presets` lists them; Hugging Face ids and `-instruct` names
    /// accepted) or, with `config_dir`, a sub-directory holding `config.json`.
    pub name: String,
    /// Directory containing `<name>/config.json` (Opal's layout), relative to the spec file (unset: `name` is a preset).
    pub config_dir: Option<String>,
    /// A Hugging Face `config.json` to read directly, relative to the spec file (unset: `name` is a preset).
    pub config_path: Option<String>,
}

impl Default for ModelParams {
    fn default() -> Self {
        ModelParams { name: "granite-3.3-8b-instruct".into(), config_dir: None, config_path: None }
    }
}

/// `[router]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouterSection {
    /// `[router.router_params]`.
    #[serde(default)]
    pub router_params: RouterParams,
}

/// `[router.router_params]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RouterParams {
    /// Routing policy, case-insensitive: RoundRobin, Random, LeastLoaded,
    /// MaxPrefix, TieredPrefix, Balanced, PowerOfTwo.
    pub policy: String,
    /// Add workers when queues grow.
    pub enable_scaling: bool,
    /// Outstanding requests on one worker above which a worker is added.
    pub max_queue_threshold: u32,
    /// Seconds from the decision to add a worker until it accepts requests.
    pub scale_latency: f64,
    /// Most workers.
    pub max_workers: u32,
    /// With `[[worker_groups]]`: the group autoscaling adds workers to (default: the last group).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale_group: Option<String>,
    /// Seconds between the router's event collections when its queue is empty (0: as events arrive).
    pub periodic_infra_update_collection_time: f64,
    /// Most events applied per batch (an event of n chunks counting n), when a batch takes time.
    pub max_event_batch_size: u32,
    /// Seconds one event batch takes to apply (0: instantly, as Opal).
    pub event_batch_time: f64,
    /// TieredPrefix: weight of a chunk found in each tier.
    pub tier_weights: TierWeights,
    /// Balanced: weight of the cached-prefix fraction.
    pub balanced_prefix_weight: f64,
    /// Balanced: weight of the load term.
    pub balanced_load_weight: f64,
    /// Balanced: outstanding-request gap (max − min) beyond which the least loaded worker is used…
    pub balance_abs_threshold: f64,
    /// …when also max > balance_rel_threshold × min.
    pub balance_rel_threshold: f64,
}

impl Default for RouterParams {
    fn default() -> Self {
        RouterParams {
            policy: "MaxPrefix".into(),
            enable_scaling: false,
            max_queue_threshold: 4,
            scale_latency: 40.0,
            max_workers: 50,
            scale_group: None,
            periodic_infra_update_collection_time: 30.0,
            max_event_batch_size: 64,
            event_batch_time: 0.0,
            tier_weights: TierWeights::default(),
            balanced_prefix_weight: 1.0,
            balanced_load_weight: 0.5,
            balance_abs_threshold: 32.0,
            balance_rel_threshold: 1.5,
        }
    }
}

/// `[router.router_params.tier_weights]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
#[allow(non_snake_case)]
pub struct TierWeights {
    /// A chunk in the worker's GPU.
    pub GPU: f64,
    /// In its CPU memory.
    pub CPUMemory: f64,
    /// On its local NVMe.
    pub LocalNVMe: f64,
    /// On the distributed file system.
    pub DistributedFS: f64,
}

impl Default for TierWeights {
    fn default() -> Self {
        TierWeights { GPU: 1.0, CPUMemory: 0.8, LocalNVMe: 0.5, DistributedFS: 0.3 }
    }
}

/// `[workload]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSection {
    /// `[[workload.stages]]`, run in order.
    pub stages: Vec<StageSection>,
}

impl Default for WorkloadSection {
    fn default() -> Self {
        WorkloadSection {
            stages: vec![StageSection { kind: "UniformReqRate".into(), workload_params: toml::Table::new() }],
        }
    }
}

/// One `[[workload.stages]]` entry.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StageSection {
    /// Workload type, case-insensitive: UniformReqRate, ExponentialReqRate, Trace,
    /// SC25Workload, RAGWorkload, Sessions, VllmBench.
    #[serde(rename = "type")]
    pub kind: String,
    /// Parameters of that type (checked against the type's own keys).
    #[serde(default)]
    pub workload_params: toml::Table,
}

/// `workload_params` of `UniformReqRate` and `ExponentialReqRate`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateParams {
    /// Mean requests per second; `inf`: every request at the stage start
    /// (a burst, as vLLM's `benchmark_serving.py --request-rate inf`).
    pub request_rate: f64,
    /// Requests to generate; `-1` or `0` = unlimited (then a time limit must end the stage).
    pub total_requests: i64,
    /// Smallest prompt, tokens (uniform over [min, max], inclusive; default 32).
    pub prompt_size_min: Option<i64>,
    /// Largest prompt, tokens (default 16384).
    pub prompt_size_max: Option<i64>,
    /// Prompt length distribution instead of min/max: a number or
    /// `{ dist = "normal" | "lognormal" | "exponential" | "uniform" | "fixed" | "empirical", … }`.
    pub prompt_size: Option<toml::Value>,
    /// Fewest output tokens (uniform over [min, max], inclusive; default 32).
    pub output_tokens_min: Option<i64>,
    /// Most output tokens (default 128).
    pub output_tokens_max: Option<i64>,
    /// Output length distribution instead of min/max (as `prompt_size`).
    pub output_tokens: Option<toml::Value>,
    /// Leading tokens every request of the stage shares (capped at the prompt size),
    /// with `prompt_content = "shared_prefix"`.
    pub default_prefix_length: i64,
    /// What prompts contain: `shared_prefix` (the stage's first `default_prefix_length`
    /// tokens, then tokens unique to the request) or `single_sequence` (the Python
    /// Opal's model: every prompt is the first n tokens of one fixed sequence, the same
    /// for every stage, so a prompt is a prefix of every longer one).
    pub prompt_content: String,
    /// ExponentialReqRate: gap = mean·(1−jitter) + Exp(mean)·jitter; 1 = Poisson, 0 = fixed.
    /// Ignored by UniformReqRate (as in Opal).
    pub jitter: f64,
    /// Stage time limit, seconds from the stage start; `-1` = none.
    pub time_duration_sec: f64,
    /// In-flight cap: an arrival due while this many of the stage's requests are
    /// outstanding waits for a completion; `-1` = unlimited.
    pub max_outstanding_requests: i64,
}

impl Default for RateParams {
    fn default() -> Self {
        RateParams {
            request_rate: 2.0,
            total_requests: 100,
            prompt_size_min: None,
            prompt_size_max: None,
            prompt_size: None,
            output_tokens_min: None,
            output_tokens_max: None,
            output_tokens: None,
            default_prefix_length: 1024,
            prompt_content: "shared_prefix".into(),
            jitter: 1.0,
            time_duration_sec: -1.0,
            max_outstanding_requests: -1,
        }
    }
}

/// `workload_params` of `SC25Workload`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sc25Params {
    /// Prompt sizes, tokens, in sending order (default Opal's ten, 4092 … 130944).
    pub prompt_sizes: Option<Vec<i64>>,
    /// Output tokens of every request.
    pub output_tokens: i64,
    /// Seconds between a completion and the next request.
    pub gap_sec: f64,
    /// Stage time limit, seconds from the stage start; `-1` = none.
    pub time_duration_sec: f64,
}

impl Default for Sc25Params {
    fn default() -> Self {
        Sc25Params { prompt_sizes: None, output_tokens: 16, gap_sec: 0.0, time_duration_sec: -1.0 }
    }
}

/// `workload_params` of `RAGWorkload`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RagParams {
    /// Mean requests per second.
    pub request_rate: f64,
    /// Gap = mean·(1−jitter) + Exp(mean)·jitter; 1 = Poisson, 0 = fixed.
    pub jitter: f64,
    /// Requests to generate; `-1` or `0` = unlimited (then a time limit must end the stage).
    pub total_requests: i64,
    /// Tokens of the system prompt every request starts with.
    pub system_prompt_size: i64,
    /// Documents in the corpus.
    pub num_documents: i64,
    /// Tokens per document.
    pub document_size: i64,
    /// Distinct documents per request (sorted by id in the prompt).
    pub docs_per_request: i64,
    /// Tokens of the request's own question, after the documents.
    pub query_size: i64,
    /// Output tokens: a number or a distribution (as `prompt_size` of a rate stage).
    pub output_tokens: toml::Value,
    /// Zipf exponent of document popularity; 0 = every document equally likely.
    pub doc_popularity_zipf: f64,
    /// In-flight cap; `-1` = unlimited (Opal's `max_concurrent_requests`).
    pub max_outstanding_requests: i64,
    /// Stage time limit, seconds from the stage start; `-1` = none.
    pub time_duration_sec: f64,
}

impl Default for RagParams {
    fn default() -> Self {
        RagParams {
            request_rate: 2.0,
            jitter: 1.0,
            total_requests: 100,
            system_prompt_size: 1024,
            num_documents: 1000,
            document_size: 512,
            docs_per_request: 4,
            query_size: 64,
            output_tokens: toml::Value::Integer(128),
            doc_popularity_zipf: 0.0,
            max_outstanding_requests: -1,
            time_duration_sec: -1.0,
        }
    }
}

/// `workload_params` of `Sessions` (multi-turn conversations).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsParams {
    /// Sessions started per second.
    pub session_rate: f64,
    /// Session gaps: mean·(1−jitter) + Exp(mean)·jitter; 1 = Poisson.
    pub jitter: f64,
    /// Sessions to start; `-1` or `0` = unlimited (then a time limit must end the stage).
    pub total_sessions: i64,
    /// Turns per session (a number or a distribution; default uniform 2–8).
    pub turns: Option<toml::Value>,
    /// Tokens of the system prompt every session starts with.
    pub system_prompt_size: i64,
    /// New input tokens per turn (default uniform 64–512).
    pub input_tokens: Option<toml::Value>,
    /// Output tokens per turn (default uniform 64–512).
    pub output_tokens: Option<toml::Value>,
    /// Seconds between a turn's completion and the next turn (default exponential, mean 10).
    pub think_time_sec: Option<toml::Value>,
    /// A session ends before a turn whose prompt + output would exceed this; `-1` = no limit.
    pub max_context_tokens: i64,
    /// Stage time limit, seconds from the stage start; `-1` = none.
    pub time_duration_sec: f64,
    /// In-flight cap; `-1` = unlimited.
    pub max_outstanding_requests: i64,
}

impl Default for SessionsParams {
    fn default() -> Self {
        SessionsParams {
            session_rate: 0.5,
            jitter: 1.0,
            total_sessions: 10,
            turns: None,
            system_prompt_size: 1024,
            input_tokens: None,
            output_tokens: None,
            think_time_sec: None,
            max_context_tokens: -1,
            time_duration_sec: -1.0,
            max_outstanding_requests: -1,
        }
    }
}

/// `workload_params` of `Trace`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TraceParams {
    /// Mooncake-format JSONL file, relative to the spec file.
    pub trace_file: String,
    /// Requests to replay; `-1` = the whole file.
    pub total_requests: i64,
    /// Tokens per hash id (Mooncake: 512).
    pub chunk_size: i64,
    /// Timestamp units to seconds (Mooncake timestamps are milliseconds: 0.001).
    pub multiplier_to_sec: f64,
    /// Factor on every arrival time (0.5 replays twice as fast).
    pub time_scale: f64,
    /// Re-time the trace's requests (in order, content kept) as arrivals at this rate, requests/s; `-1` keeps the trace's timestamps.
    pub request_rate: f64,
    /// With `request_rate`: `poisson` (exponential gaps, the default), `gamma` (gaps of coefficient of variation `arrival_cv`) or `uniform` (fixed gaps).
    pub arrival: String,
    /// With `arrival = "gamma"`: the gaps' coefficient of variation (1 is Poisson; above 1 burstier).
    pub arrival_cv: f64,
    /// Seconds added to every arrival time.
    pub start_offset: f64,
    /// Skip malformed lines (they are counted) instead of failing the run.
    pub skip_bad_lines: bool,
    /// Make timestamps relative to the first line's (traces with absolute, epoch timestamps).
    pub shift_to_first: bool,
    /// Stage time limit, seconds from the stage start; `-1` = none.
    pub time_duration_sec: f64,
    /// In-flight cap; `-1` = unlimited.
    pub max_outstanding_requests: i64,
}

impl Default for TraceParams {
    fn default() -> Self {
        TraceParams {
            trace_file: String::new(),
            total_requests: -1,
            chunk_size: 512,
            multiplier_to_sec: 0.001,
            time_scale: 1.0,
            request_rate: -1.0,
            arrival: "poisson".into(),
            arrival_cv: 1.0,
            start_offset: 0.0,
            skip_bad_lines: false,
            shift_to_first: false,
            time_duration_sec: -1.0,
            max_outstanding_requests: -1,
        }
    }
}

/// `workload_params` of `VllmBench`: a measured `vllm bench serve` run replayed.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct VllmBenchParams {
    /// The JSON file `vllm bench serve --save-result --save-detailed` wrote, relative to the spec file.
    pub result_file: String,
    /// Successful requests to replay, from the first; `-1` = all of them.
    pub total_requests: i64,
    /// Leading prompt tokens every request shares (the `random` dataset's `--random-prefix-len`).
    pub shared_prefix_tokens: i64,
    /// Requests/s to send them at instead of the file's own timing; `-1` = as measured (its `start_times`, else its `request_rate`).
    pub request_rate: f64,
    /// With `request_rate`: the gamma shape of the gaps (vLLM's `--burstiness`; 1 = Poisson); `-1` = the file's.
    pub burstiness: f64,
    /// Stage time limit, seconds from the stage start; `-1` = none.
    pub time_duration_sec: f64,
    /// In-flight cap (vLLM's `--max-concurrency`); `0` = the file's `max_concurrency` (none if it has none), `-1` = unlimited.
    pub max_outstanding_requests: i64,
}

impl Default for VllmBenchParams {
    fn default() -> Self {
        VllmBenchParams {
            result_file: String::new(),
            total_requests: -1,
            shared_prefix_tokens: 0,
            request_rate: -1.0,
            burstiness: -1.0,
            time_duration_sec: -1.0,
            max_outstanding_requests: 0,
        }
    }
}

/// `[kvc]`: the tiers below the GPU (LMCache-like), Opal's key names.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
#[allow(non_snake_case)]
pub struct KvcSection {
    /// Tiers in lookup order: `CPUMemory`, `LocalNVMe` (per worker), `DistributedFS` (one for the cluster).
    pub kvc_tiers: Vec<String>,
    /// Tokens per stored chunk (a multiple of `worker.vllm_params.block_size`).
    pub chunk_size: u32,
    /// Also store a request's last, partial chunk.
    pub save_unfull_chunk: bool,
    /// What identifies a partial chunk: `tokens` (LMCache: the hash of its exact tokens, so only the identical token run hits it) or `blocks` (its full blocks: any sequence with the same full blocks there hits it).
    pub partial_chunk_key: String,
    /// Also store the KV of generated tokens (LMCache's `save_decode_cache`; default
    /// false: only prompt KV is stored, as LMCache does by default).
    pub save_decode_cache: bool,
    /// `write_through` (every tier) or `spill` (the first tier; evicted chunks move down a tier).
    pub write_policy: String,
    /// `async` (completion does not wait for the writes) or `sync` (it does).
    pub write_mode: String,
    /// `on_compute` (LMCache: each step's newly computed full chunks are written as the step ends) or `on_finish` (a request's chunks are written when it finishes).
    pub save_timing: String,
    /// Also write a chunk to the first tier when the GPU cache evicts the block that ends it.
    pub store_on_gpu_eviction: bool,
    /// Keep what a worker loads from a slower tier in its faster per-worker tiers (LMCache's `StorageManager.get` writes a disk or remote hit back to its CPU cache); false: a hit stays where it was found.
    pub write_back_hits: bool,
    /// `[kvc.CPUMemory]` (defaults: 50 GB/s, 200 ns, concurrency 1,000,000, 8 GiB).
    pub CPUMemory: TierParams,
    /// `[kvc.LocalNVMe]` (defaults: 10 GB/s, 10 µs, concurrency 1,000, 1,024 GiB).
    pub LocalNVMe: TierParams,
    /// `[kvc.DistributedFS]` (defaults: 100 GB/s, 100 µs, concurrency 1,000, 1,048,576 GiB).
    pub DistributedFS: TierParams,
}

impl Default for KvcSection {
    fn default() -> Self {
        KvcSection {
            kvc_tiers: vec!["CPUMemory".into()],
            chunk_size: 256,
            save_unfull_chunk: true,
            partial_chunk_key: "tokens".into(),
            save_decode_cache: false,
            write_policy: "write_through".into(),
            write_mode: "async".into(),
            save_timing: "on_compute".into(),
            store_on_gpu_eviction: false,
            write_back_hits: true,
            CPUMemory: TierParams::default(),
            LocalNVMe: TierParams::default(),
            DistributedFS: TierParams::default(),
        }
    }
}

/// One tier's device and store; unset keys take the tier's defaults.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
#[allow(non_snake_case)]
pub struct TierParams {
    /// Bandwidth, 10⁹ bytes/s (shared by every transfer on the device).
    pub bandwidth_GBps: Option<f64>,
    /// Latency per operation, nanoseconds.
    pub latency_nsec: Option<f64>,
    /// Operations in service at once.
    pub concurrency: Option<u64>,
    /// Capacity, GiB.
    pub capacity_GB: Option<f64>,
    /// `lru` (default), `lfu` or `fifo`.
    pub eviction_policy: Option<String>,
    /// DistributedFS only: each worker's link to it, 10⁹ bytes/s, shared max-min fairly by the worker's transfers (unset: no per-worker cap, only the device's bandwidth).
    pub client_bandwidth_GBps: Option<f64>,
    /// Price of its capacity, dollars per GiB (as `capacity_GB`) per hour, per instance (unset: free; none built in, the README gives sources).
    pub usd_per_gb_hour: Option<f64>,
    /// Power its capacity draws, watts per GiB, counted in the run's energy (unset: 0).
    pub watts_per_gb: Option<f64>,
}

/// `[worker]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSection {
    /// `[worker.worker_params]`.
    #[serde(default)]
    pub worker_params: WorkerParams,
    /// `[worker.hw]`.
    #[serde(default)]
    pub hw: HwParams,
    /// `[worker.vllm_params]`.
    #[serde(default)]
    pub vllm_params: VllmParams,
    /// `[worker.slots]`.
    #[serde(default)]
    pub slots: SlotsParams,
    /// `[worker.inference_params]`.
    #[serde(default)]
    pub inference_params: InferenceParams,
    /// `[worker.speculative]` (unset: no speculative decoding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpeculativeParams>,
}

/// `[worker.speculative]`: speculative decoding, as vLLM's
/// `--speculative-config` (`vllm/config/speculative.py`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeParams {
    /// How drafts are proposed: `ngram` (prompt lookup, no model), `eagle`
    /// (an EAGLE head: one decoder layer on the target's features), `mtp`
    /// (the model's own multi-token-prediction layer, DeepSeek-V3's) or
    /// `draft_model` (a smaller model of the same vocabulary); `none` turns
    /// it off (the other keys then unused), so a sweep axis can compare.
    pub method: String,
    /// Draft tokens proposed per sequence and step, k.
    pub num_speculative_tokens: u32,
    /// The chance each draft is accepted given the ones before it were, α
    /// (draft j is then accepted with probability α^j). One of this and
    /// `acceptance_rates`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptance_rate: Option<f64>,
    /// Per-position acceptance, k values: the fraction of drafts whose
    /// position j was accepted (vLLM's `spec_decode` per-position metric,
    /// `num_accepted_tokens_per_pos[j] / num_drafts`), non-increasing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptance_rates: Option<Vec<f64>>,
    /// `draft_model`: the draft model, a preset name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_model: Option<String>,
    /// `draft_model`: the draft model's Hugging Face `config.json`, relative to the spec file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_config_path: Option<String>,
}

/// `[worker.worker_params]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerParams {
    /// Seconds a worker gathers KV events before sending them to the router.
    pub kvcevent_coalesce_time: f64,
    /// Seconds between a worker's load reports (system events) to the router.
    /// Default 5, as IBM/opal-sim's current `configs/defaults.json`; the
    /// original's (animeshtrivedi/opal-sim 819f7dec) says 30, which an
    /// imported Opal JSON that leaves the key out gets.
    pub periodic_infra_update_time: f64,
}

impl Default for WorkerParams {
    fn default() -> Self {
        WorkerParams { kvcevent_coalesce_time: 30.0, periodic_infra_update_time: 5.0 }
    }
}

/// `[worker.hw]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
#[allow(non_snake_case)]
pub struct HwParams {
    /// GPU preset: A100-40G, A100-80G, H100, H100-PCIe, H200, B200, MI300X, L40S
    /// (or any name when memory_gb, tflops and mem_bw_TBps are given).
    pub gpu: String,
    /// HBM per GPU, GiB; overrides the preset.
    pub memory_gb: Option<f64>,
    /// Dense bf16 peak per GPU, TFLOP/s; overrides the preset.
    pub tflops: Option<f64>,
    /// HBM bandwidth per GPU, TB/s (10¹² B/s); overrides the preset.
    pub mem_bw_TBps: Option<f64>,
    /// Dense FP8 peak per GPU, TFLOP/s (used for the linear layers of FP8 models); overrides the preset.
    pub tflops_fp8: Option<f64>,
    /// Tensor-parallel GPUs per worker (memory, FLOPs and bandwidth scale with it).
    pub tp: u32,
    /// Board power at full use, W per GPU; overrides the preset's datasheet maximum.
    pub max_watts: Option<f64>,
    /// Board power with no step running, W per GPU (default: measured for H100, H200 and A100; else 10 % of the maximum).
    pub idle_watts: Option<f64>,
    /// Board power while a step runs, before what it does, W per GPU (default: measured, or 27 % of the maximum).
    pub active_watts: Option<f64>,
    /// Power added at full use of the tensor cores (× the step's share of peak FLOP/s), W per GPU.
    pub compute_watts: Option<f64>,
    /// Power added at full use of HBM bandwidth (× the step's share of peak bandwidth), W per GPU.
    pub memory_watts: Option<f64>,
    /// Tensor-parallel interconnect per GPU and direction, GB/s (10⁹ B/s); overrides the preset's (NVLink, or PCIe).
    pub link_GBps: Option<f64>,
    /// Pipeline-parallel stages per worker, each `tp` GPUs holding its share
    /// of the layers and their KV (vLLM's `--pipeline-parallel-size`; needs
    /// the v1 scheduler).
    pub pp: u32,
    /// Link between pipeline stages per GPU and direction, GB/s (default: the
    /// TP link when the worker's `tp × pp` GPUs fit one 8-GPU node, else 50,
    /// one 400 Gb/s InfiniBand NIC per GPU).
    pub pp_link_GBps: Option<f64>,
    /// Latency of one hop between pipeline stages, µs (default 10).
    pub pp_link_latency_us: Option<f64>,
    /// GPUs a mixture of experts' routed experts are sharded over, each
    /// holding whole experts (vLLM's `--enable-expert-parallel`): 1 (the
    /// default: every expert split over the GPUs they span) or all of them —
    /// `tp`, or with data-parallel attention `dp_attention × tp`.
    pub ep: u32,
    /// Data-parallel attention ranks stepping together (vLLM's
    /// `--data-parallel-size` on a mixture of experts, SGLang's
    /// `--enable-dp-attention`): every `dp_attention` consecutive workers —
    /// engines of `tp` GPUs, each with its own scheduler and KV cache, each
    /// routed to on its own — run their MoE layers together over all their
    /// GPUs. 1 (the default): off.
    pub dp_attention: u32,
    /// With data-parallel attention, the link between the ranks' GPUs per GPU
    /// and direction, GB/s (default: the TP link when the group's GPUs fit
    /// one 8-GPU node, else 50, one 400 Gb/s InfiniBand NIC per GPU).
    pub dp_link_GBps: Option<f64>,
    /// With data-parallel attention, how tokens reach the experts (vLLM's
    /// `VLLM_ALL2ALL_BACKEND`): `allgather_reducescatter` (the default),
    /// `deepep_high_throughput` or `deepep_low_latency`.
    pub all2all_backend: Option<String>,
    /// Price of one GPU-hour, US dollars (no default: without it no dollar figures are reported).
    pub usd_per_gpu_hour: Option<f64>,
}

impl Default for HwParams {
    fn default() -> Self {
        HwParams {
            gpu: "H100".into(),
            memory_gb: None,
            tflops: None,
            mem_bw_TBps: None,
            tflops_fp8: None,
            tp: 1,
            max_watts: None,
            idle_watts: None,
            active_watts: None,
            compute_watts: None,
            memory_watts: None,
            link_GBps: None,
            pp: 1,
            pp_link_GBps: None,
            pp_link_latency_us: None,
            ep: 1,
            dp_attention: 1,
            dp_link_GBps: None,
            all2all_backend: None,
            usd_per_gpu_hour: None,
        }
    }
}

/// `max_num_batched_tokens` with chunked prefill, when unset.
pub const DEFAULT_BATCHED_TOKENS: u32 = 8192;

/// `[worker.vllm_params]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct VllmParams {
    /// Most sequences in the running batch.
    pub max_num_seqs: u32,
    /// Token budget of one scheduler step (prefill chunks and decodes together),
    /// binding with chunked prefill on or off. Default (as vLLM): 8,192 with
    /// chunked prefill, `max(max_model_len, 8192)` without.
    pub max_num_batched_tokens: Option<u32>,
    /// Requests that may hold an I/O slot at once (the default of `slots.io_slots`).
    pub max_kvc_ready_requests: u32,
    /// Split long prefills across steps; when off, a prompt is prefilled in one step.
    pub chunked_prefill: bool,
    /// Tokens per KV block.
    pub block_size: u32,
    /// Fraction of GPU memory vLLM may use (weights + KV blocks). Not in Opal (which uses 1.0); vLLM's default.
    pub gpu_memory_utilization: f64,
    /// Longest sequence (prompt + output) served; longer requests are rejected.
    /// Default: the model's context length. The KV pool must hold one such sequence.
    pub max_model_len: Option<u64>,
    /// KV blocks of the GPU pool, as the engine reports them (vLLM's `--num-gpu-blocks-override`;
    /// copy "# GPU blocks" from the server's log), instead of the memory arithmetic. Default: unset (computed).
    pub num_gpu_blocks_override: Option<u64>,
    /// Let `max_model_len` exceed the model's context length (vLLM's
    /// `VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`: for timing studies; outputs past the
    /// trained context would be meaningless).
    pub allow_long_max_model_len: bool,
    /// Automatic prefix caching: reuse resident KV blocks of earlier requests.
    pub enable_prefix_caching: bool,
    /// Seconds a cached block stays unevictable after its last use (0 = plain LRU).
    pub apc_lru_ttl: f64,
    /// KV-cache element type: `auto` (the model's weight dtype) or `fp8` (1 byte), as vLLM's `--kv-cache-dtype`.
    pub kv_cache_dtype: String,
    /// The engine's scheduler: `v1` (decodes and prefill chunks share a step) or `v0` (a step is prefill-only or decode-only, prefills first, new prompts admitted above a 1 % free-block watermark).
    pub scheduler: String,
}

impl Default for VllmParams {
    fn default() -> Self {
        VllmParams {
            max_num_seqs: 256,
            max_num_batched_tokens: None,
            max_kvc_ready_requests: 8,
            chunked_prefill: true,
            block_size: 16,
            gpu_memory_utilization: 0.9,
            max_model_len: None,
            num_gpu_blocks_override: None,
            allow_long_max_model_len: false,
            enable_prefix_caching: true,
            apc_lru_ttl: 0.0,
            kv_cache_dtype: "auto".into(),
            scheduler: "v1".into(),
        }
    }
}

/// `[worker.slots]` (Opal's README: I/O and GPU slots).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlotsParams {
    /// Concurrent KV-cache I/O slots; default `vllm_params.max_kvc_ready_requests`.
    pub io_slots: Option<u32>,
    /// Compute slots (sequences in the batch); default `vllm_params.max_num_seqs`.
    pub gpu_slots: Option<u32>,
    /// `pipelined`: a request holds its I/O slot only during its KV fetch;
    /// `single_stage`: from fetch start until it finishes.
    pub mode: String,
}

impl Default for SlotsParams {
    fn default() -> Self {
        SlotsParams { io_slots: None, gpu_slots: None, mode: "pipelined".into() }
    }
}

/// A number that Opal's JSON may write as a string (`"a": "4"`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum NumberOrString {
    /// A number.
    Number(f64),
    /// A number written as a string.
    String(String),
}

/// `[worker.inference_params]`. Each key belongs to the step-time models
/// named in its comment; a key set for another model is an error.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct InferenceParams {
    /// Step-time model: `operators` (the forward pass, operator by operator), `roofline` (Opal's a/b model), `synthetic` or `table`.
    pub model: String,
    /// `operators`: where operator prices come from — `auto` (the GPU preset's shipped measured tables, else analytic), `analytic`, or a directory of aiconfigurator Parquet tables or Vidur profile CSVs (relative to the spec).
    pub profile: Option<String>,
    /// `operators`: how a mixture of experts' router spreads tokens over its experts, which picks the measured MoE table's rows: `balanced` (default), `power_law_1.01` or `power_law_1.2` (skewed; aiconfigurator's defaults are 1.2 for Qwen3/Mixtral-style models and 1.01 for DeepSeek's).
    pub expert_routing: Option<String>,
    /// `operators`: multiplies compute-bound time (1 = as the profile prices it; `opal-sweep calibrate` fits it).
    pub compute_scale: Option<f64>,
    /// `operators`: multiplies memory-bound time (`opal-sweep calibrate` fits it).
    pub memory_scale: Option<f64>,
    /// `operators`: multiplies tensor-parallel all-reduce time (`opal-sweep calibrate` fits it).
    pub comm_scale: Option<f64>,
    /// `operators`: CPU seconds of every step, overlapping its GPU work (a step takes the longer of the two); `roofline`: seconds added to every step. `opal-sweep calibrate` fits it; default 0.
    pub step_overhead_secs: Option<f64>,
    /// `operators`: CPU seconds per sequence in a step (`opal-sweep calibrate` fits it; default 0).
    pub seq_overhead_secs: Option<f64>,
    /// `operators`: CPU seconds added to a step with prefill work, which vLLM launches eagerly, without CUDA graphs (`opal-sweep calibrate` fits it; default 0).
    pub prefill_overhead_secs: Option<f64>,
    /// `synthetic`: seconds per scheduler step (default 1).
    pub mean_latency_secs: Option<f64>,
    /// `roofline`: attention FLOP coefficient per causal token pair per hidden unit per layer (default 4).
    pub a: Option<NumberOrString>,
    /// `roofline`: dense FLOP coefficient per new token per d² per layer (default 24).
    pub b: Option<NumberOrString>,
    /// `roofline`: fraction of the datasheet memory bandwidth a decode step achieves (default 1).
    pub decode_bw_efficiency: Option<f64>,
    /// `roofline`, `table`: how a step with prefill and decode work combines them: `max` (Opal; the roofline's default) or `sum` (the table's default; its fixed cost once).
    pub mixed_step: Option<String>,
    /// `roofline`: how the prefill chunks of one step combine: `sum` (default: the GPU computes them all) or `max` (the original Opal's `_calculate_batch_time`: the step's longest prefill; an imported Opal configuration's).
    pub prefill_batch: Option<String>,
    /// `table`: CSV of measured latencies (columns `phase,batch_size,tokens,latency_ms`), relative to the spec file.
    pub table_path: Option<String>,
}

impl Default for InferenceParams {
    fn default() -> Self {
        InferenceParams {
            model: "operators".into(),
            profile: None,
            expert_routing: None,
            compute_scale: None,
            memory_scale: None,
            comm_scale: None,
            step_overhead_secs: None,
            seq_overhead_secs: None,
            prefill_overhead_secs: None,
            mean_latency_secs: None,
            a: None,
            b: None,
            decode_bw_efficiency: None,
            mixed_step: None,
            prefill_batch: None,
            table_path: None,
        }
    }
}

/// The keys of `[worker.inference_params]` that belong to some step models
/// only, with those models.
pub const MODEL_KEYS: [(&str, &[&str]); 15] = [
    ("profile", &["operators"]),
    ("expert_routing", &["operators"]),
    ("compute_scale", &["operators"]),
    ("memory_scale", &["operators"]),
    ("comm_scale", &["operators"]),
    ("step_overhead_secs", &["operators", "roofline"]),
    ("seq_overhead_secs", &["operators"]),
    ("prefill_overhead_secs", &["operators"]),
    ("mean_latency_secs", &["synthetic"]),
    ("a", &["roofline"]),
    ("b", &["roofline"]),
    ("decode_bw_efficiency", &["roofline"]),
    ("mixed_step", &["roofline", "table"]),
    ("prefill_batch", &["roofline"]),
    ("table_path", &["table"]),
];

/// The keys of an `[worker.inference_params]` table that `model` does not
/// use, with the models they belong to.
pub fn foreign_keys(table: &toml::Table, model: &str) -> Vec<(&'static str, &'static [&'static str])> {
    let model = model.to_ascii_lowercase();
    MODEL_KEYS
        .iter()
        .copied()
        .filter(|(k, models)| table.contains_key(*k) && !models.contains(&model.as_str()))
        .collect()
}

impl InferenceParams {
    /// The keys set that the chosen model does not use, with the models they belong to.
    pub fn foreign_keys(&self) -> Vec<(&'static str, &'static [&'static str])> {
        let table = toml::Table::try_from(self).unwrap_or_default();
        foreign_keys(&table, &self.model)
    }
}
