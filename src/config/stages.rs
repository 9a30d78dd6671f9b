//! Workload stages: each `[[workload.stages]]` entry's `workload_params`
//! checked against its type's own keys and resolved, distributions included.

use super::context::Ctx;
use super::error::{ConfigError, closest};
use super::schema::{
    RagParams, RateParams, Sc25Params, SessionsParams, SpecFile, StageSection, TraceParams, VllmBenchParams,
};
use crate::time::SimDuration;
use crate::workload::{
    ArrivalProcess, BENCH_COMMAND, BenchFile, BenchTiming, Dist, PromptContent, RagStage, RateStage, SC25_PROMPT_SIZES,
    Sc25Stage, SessionsStage, StageConfig, StageKind, TraceStage, VllmBenchStage,
};
use std::path::Path;
use std::sync::Arc;

/// Workload types, as Opal spells them (matched case-insensitively).
const TYPES: [&str; 7] =
    ["UniformReqRate", "ExponentialReqRate", "Trace", "SC25Workload", "RAGWorkload", "Sessions", "VllmBench"];

/// What a distribution describes: lengths are at least one token, times at least zero seconds.
#[derive(Clone, Copy, PartialEq)]
enum Unit {
    Tokens,
    Seconds,
}

impl Unit {
    fn floor(self) -> f64 {
        match self {
            Unit::Tokens => 1.0,
            Unit::Seconds => 0.0,
        }
    }
}

/// Resolves every stage of `file`.
pub(super) fn resolve_stages(cx: &Ctx<'_>, file: &SpecFile, base_dir: &Path) -> Result<Vec<StageConfig>, ConfigError> {
    if file.workload.stages.is_empty() {
        return Err(cx.err("workload.stages", "no workload stages", "add at least one [[workload.stages]] table"));
    }
    let global_limit = file.simulation.simulation_time > 0.0;
    file.workload
        .stages
        .iter()
        .enumerate()
        .map(|(i, st)| {
            let sc = StageCx { cx, at: format!("workload.stages.{i}.workload_params"), base_dir, global_limit };
            sc.resolve(i, st)
        })
        .collect()
}

/// Resolution of one stage's parameters; keys are named `workload.stages.<i>.workload_params.<key>`.
struct StageCx<'a> {
    cx: &'a Ctx<'a>,
    at: String,
    base_dir: &'a Path,
    global_limit: bool,
}

/// Most documents a `RAGWorkload` with a Zipf popularity may have.
const MAX_ZIPF_DOCUMENTS: u32 = 1_000_000;
/// Most requests a burst (`request_rate = inf`) may put in flight at once.
const MAX_BURST: u64 = 1_000_000;

/// A trace file's problem as a spec error: the file, its line, the fix.
fn trace_error(e: crate::workload::TraceError) -> ConfigError {
    let at = ConfigError::file(e.path, e.message).hint(e.hint);
    match e.line {
        Some(line) => at.at_line(line as usize),
        None => at,
    }
}

/// A count of every stage: `-1` or `0` mean no limit (a rate stage
/// generates until a time limit, a trace replays the whole file), as in the
/// Python Opal; a positive value is the count; anything else is refused.
fn unlimited_or(cx: &StageCx<'_>, k: &str, v: i64) -> Result<Option<u64>, ConfigError> {
    match v {
        -1 | 0 => Ok(None),
        n if n > 0 => Ok(Some(n as u64)),
        n => Err(cx.err(k, format!("must be -1 or 0 (no limit) or a positive count, got {n}"), "use -1 for no limit")),
    }
}

impl StageCx<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.at)
    }

    fn err(&self, k: &str, message: impl Into<String>, hint: impl Into<String>) -> ConfigError {
        self.cx.err(&self.key(k), message, hint)
    }

    fn params<T: serde::de::DeserializeOwned>(&self, st: &StageSection) -> Result<T, ConfigError> {
        super::from_table(&st.workload_params, self.cx.source, &self.at)
    }

    fn resolve(&self, i: usize, st: &StageSection) -> Result<StageConfig, ConfigError> {
        match st.kind.to_ascii_lowercase().as_str() {
            kind @ ("uniformreqrate" | "exponentialreqrate") => self.rate(self.params(st)?, kind == "uniformreqrate"),
            "trace" => self.trace(self.params(st)?),
            "sc25workload" => self.sc25(self.params(st)?),
            "ragworkload" => self.rag(self.params(st)?),
            "sessions" => self.sessions(self.params(st)?),
            "vllmbench" => self.vllm_bench(self.params(st)?),
            _ => Err(self
                .cx
                .err(
                    &format!("workload.stages.{i}.type"),
                    format!("unknown workload type {:?}", st.kind),
                    match closest(&st.kind, TYPES) {
                        Some(c) => format!("did you mean `{c}`? types: {}", TYPES.join(", ")),
                        None => format!("types: {}", TYPES.join(", ")),
                    },
                )
                .schema()),
        }
    }

    fn at_least(&self, k: &str, v: i64, min: i64) -> Result<u32, ConfigError> {
        self.cx.at_least(&self.key(k), v, min)
    }

    fn time_limit(&self, v: f64) -> Result<Option<SimDuration>, ConfigError> {
        self.cx.optional_secs(&self.key("time_duration_sec"), v)
    }

    /// `-1` = unlimited, else at least 1.
    fn cap(&self, k: &str, v: i64) -> Result<Option<u64>, ConfigError> {
        match v {
            -1 => Ok(None),
            n => Ok(Some(u64::from(self.at_least(k, n, 1)?))),
        }
    }

    fn jitter(&self, v: f64) -> Result<f64, ConfigError> {
        if (0.0..=1.0).contains(&v) {
            Ok(v)
        } else {
            Err(self.err(
                "jitter",
                format!("must be between 0 and 1, got {v}"),
                "use 1 for Poisson arrivals, 0 for fixed gaps",
            ))
        }
    }

    /// A count where `-1` or `0` means unlimited — then something else must end the stage.
    fn count(&self, k: &str, v: i64, time_limit: Option<SimDuration>) -> Result<Option<u64>, ConfigError> {
        let total = unlimited_or(self, k, v)?;
        if total.is_none() && time_limit.is_none() && !self.global_limit {
            return Err(self.err(
                k,
                format!("this stage would never end: {k} is unlimited and neither time_duration_sec nor simulation.simulation_time is set"),
                format!("set {k} > 0, time_duration_sec > 0, or simulation.simulation_time > 0"),
            ));
        }
        Ok(total)
    }

    /// A request rate: positive, and not so small that arrivals would lie
    /// beyond the horizon a run may reach (one per 10⁹ s).
    fn request_rate(&self, v: f64) -> Result<f64, ConfigError> {
        self.rate_of("request_rate", v, "requests", "10.0")
    }

    /// A rate of `what` per second under `key`: positive, and at least one
    /// per horizon (a run's latest time), so that arrivals can come at all.
    fn rate_of(&self, key: &str, v: f64, what: &str, example: &str) -> Result<f64, ConfigError> {
        let least = 1.0 / crate::time::HORIZON.as_secs_f64();
        if v.is_finite() && v >= least {
            Ok(v)
        } else {
            Err(self.cx.err(
                &self.key(key),
                format!("must be a positive number of {what} per second, at least {least:e}, got {v}"),
                format!("give the rate in {what} per second, e.g. {example}"),
            ))
        }
    }

    /// A rate stage's `request_rate`: a rate, or `inf` — every request at
    /// the stage start (as vLLM's `benchmark_serving.py --request-rate inf`),
    /// held back only by `max_outstanding_requests`. A burst needs a count,
    /// and without a cap all of it is in flight at once, so it is bounded.
    fn burst_or_rate(&self, p: &RateParams) -> Result<f64, ConfigError> {
        if p.request_rate != f64::INFINITY {
            return self.request_rate(p.request_rate);
        }
        let in_flight = match (p.total_requests, p.max_outstanding_requests) {
            (n, _) if n <= 0 => None,
            (n, cap) if cap > 0 => Some((n as u64).min(cap as u64)),
            (n, _) => Some(n as u64),
        };
        match in_flight {
            Some(n) if n <= MAX_BURST => Ok(f64::INFINITY),
            Some(n) => Err(self.err(
                "request_rate",
                format!("a burst (request_rate = inf) of {n} requests at once; at most {MAX_BURST}"),
                "send fewer requests, or cap them with max_outstanding_requests",
            )),
            None => Err(self.err(
                "request_rate",
                "request_rate = inf sends every request at once and needs a count".to_string(),
                "set total_requests > 0",
            )),
        }
    }

    fn rate(&self, p: RateParams, uniform: bool) -> Result<StageConfig, ConfigError> {
        let arrival = if uniform {
            ArrivalProcess::Uniform
        } else {
            ArrivalProcess::Exponential { jitter: self.jitter(p.jitter)? }
        };
        let rate = self.burst_or_rate(&p)?;
        let prompt = self.lengths(
            "prompt_size",
            p.prompt_size.as_ref(),
            ("prompt_size_min", p.prompt_size_min, 32),
            ("prompt_size_max", p.prompt_size_max, 16384),
        )?;
        let output = self.lengths(
            "output_tokens",
            p.output_tokens.as_ref(),
            ("output_tokens_min", p.output_tokens_min, 32),
            ("output_tokens_max", p.output_tokens_max, 128),
        )?;
        let content = match p.prompt_content.to_ascii_lowercase().as_str() {
            "shared_prefix" => {
                PromptContent::SharedPrefix(self.at_least("default_prefix_length", p.default_prefix_length, 0)?)
            }
            "single_sequence" => PromptContent::SingleSequence,
            other => {
                return Err(self.err(
                    "prompt_content",
                    format!("unknown prompt content {other:?}"),
                    "use shared_prefix (default_prefix_length shared tokens, then unique ones) or single_sequence (every prompt is the start of one sequence, as in the Python Opal)",
                ));
            }
        };
        let time_limit = self.time_limit(p.time_duration_sec)?;
        let total = self.count("total_requests", p.total_requests, time_limit)?;
        Ok(StageConfig {
            kind: StageKind::Rate(RateStage { arrival, rate, total, prompt, output, content }),
            time_limit,
            max_outstanding: self.cap("max_outstanding_requests", p.max_outstanding_requests)?,
        })
    }

    /// A length given either as a distribution (`name`) or as Opal's uniform `[min, max]`.
    fn lengths(
        &self,
        name: &str,
        dist: Option<&toml::Value>,
        (min_key, min, min_default): (&str, Option<i64>, i64),
        (max_key, max, max_default): (&str, Option<i64>, i64),
    ) -> Result<Dist, ConfigError> {
        if let Some(d) = dist {
            if min.is_some() || max.is_some() {
                return Err(self.err(
                    name,
                    format!("{name} and {min_key}/{max_key} are both set"),
                    format!("keep {name} (any distribution) or {min_key}/{max_key} (uniform), not both"),
                ));
            }
            return self.dist(name, d, Unit::Tokens);
        }
        let lo = self.at_least(min_key, min.unwrap_or(min_default), 1)?;
        let hi = self.at_least(max_key, max.unwrap_or(max_default), 1)?;
        if lo > hi {
            return Err(self.err(
                min_key,
                format!("{min_key} ({lo}) is greater than {max_key} ({hi})"),
                format!("make {min_key} ≤ {max_key}"),
            ));
        }
        Ok(Dist::Uniform { min: f64::from(lo), max: f64::from(hi) })
    }

    /// A trace's `request_rate` (with `arrival` and `arrival_cv`): the
    /// process its requests are re-timed by, or `None` to keep the trace's times.
    fn retime(&self, p: &TraceParams) -> Result<Option<(ArrivalProcess, f64)>, ConfigError> {
        let defaults = TraceParams::default();
        if p.request_rate == -1.0 {
            if p.arrival != defaults.arrival || p.arrival_cv != defaults.arrival_cv {
                return Err(self.err(
                    "arrival",
                    "arrival and arrival_cv shape re-timed arrivals, and request_rate is not set",
                    "set request_rate (requests/s) to re-time the trace, or remove arrival and arrival_cv",
                ));
            }
            return Ok(None);
        }
        if !(p.request_rate.is_finite() && p.request_rate > 0.0) {
            return Err(self.err(
                "request_rate",
                format!("must be -1 (the trace's own times) or a positive rate, got {}", p.request_rate),
                "use e.g. 10 (requests per second)",
            ));
        }
        self.request_rate(p.request_rate)?;
        if p.time_scale != defaults.time_scale {
            return Err(self.err(
                "time_scale",
                "time_scale scales the trace's timestamps, which request_rate replaces",
                "keep one of the two",
            ));
        }
        let process = match p.arrival.to_ascii_lowercase().as_str() {
            "poisson" => ArrivalProcess::Exponential { jitter: 1.0 },
            "uniform" => ArrivalProcess::Uniform,
            "gamma" => {
                let cv = p.arrival_cv;
                if !(cv.is_finite() && (0.01..=100.0).contains(&cv)) {
                    return Err(self.err(
                        "arrival_cv",
                        format!("must be between 0.01 and 100, got {cv}"),
                        "use 1 for Poisson-like gaps, more for burstier ones",
                    ));
                }
                ArrivalProcess::Gamma { cv }
            }
            other => {
                return Err(self
                    .err("arrival", format!("unknown arrival process {other:?}"), "use poisson, gamma or uniform")
                    .schema());
            }
        };
        if p.arrival_cv != defaults.arrival_cv && !matches!(process, ArrivalProcess::Gamma { .. }) {
            return Err(self.err(
                "arrival_cv",
                "only a gamma process has a cv",
                "set arrival = \"gamma\" or remove arrival_cv",
            ));
        }
        Ok(Some((process, p.request_rate)))
    }

    fn trace(&self, p: TraceParams) -> Result<StageConfig, ConfigError> {
        if p.trace_file.is_empty() {
            return Err(self
                .err(
                    "trace_file",
                    "a Trace stage needs a trace file",
                    "set trace_file = \"traces/…jsonl\" (relative to the spec)",
                )
                .schema());
        }
        let path = self.input_file("trace_file", &p.trace_file, "a trace file", "JSONL")?;
        let chunk_size = self.at_least("chunk_size", p.chunk_size, 1)?;
        let multiplier_to_sec = self.cx.positive(&self.key("multiplier_to_sec"), p.multiplier_to_sec)?;
        let time_scale = self.cx.positive(&self.key("time_scale"), p.time_scale)?;
        if !(p.start_offset.is_finite() && p.start_offset >= 0.0) {
            return Err(self.err(
                "start_offset",
                format!("must be ≥ 0 seconds, got {}", p.start_offset),
                "use 0 to start at the stage start",
            ));
        }
        let total = unlimited_or(self, "total_requests", p.total_requests)?;
        let retime = self.retime(&p)?;
        let trace = TraceStage {
            path,
            chunk_size,
            multiplier_to_sec,
            time_scale,
            start_offset: p.start_offset,
            total,
            skip_bad_lines: p.skip_bad_lines,
            shift_to_first: p.shift_to_first,
            retime,
        };
        // The first request now, so that an empty file, an unreadable first
        // line or absolute timestamps stop the sweep before any run.
        let first = crate::workload::TraceReader::open(&trace).and_then(|mut r| r.next_request(0));
        match first {
            Ok(Some(_)) => {}
            Ok(None) => {
                return Err(self.err(
                    "trace_file",
                    format!("{} holds no requests", trace.path.display()),
                    "give a Mooncake-style JSONL file with one request per line",
                ));
            }
            Err(e) => return Err(trace_error(e)),
        }
        Ok(StageConfig {
            kind: StageKind::Trace(trace),
            time_limit: self.time_limit(p.time_duration_sec)?,
            max_outstanding: self.cap("max_outstanding_requests", p.max_outstanding_requests)?,
        })
    }

    /// The file `name` (relative to the spec) of key `k`: it must be a regular file.
    fn input_file(&self, k: &str, name: &str, what: &str, format: &str) -> Result<std::path::PathBuf, ConfigError> {
        let path = self.base_dir.join(name);
        if path.is_dir() {
            return Err(self.err(
                k,
                format!("{} is a directory, not {what}", path.display()),
                format!("name the {format} file itself"),
            ));
        }
        if path.exists() && !path.is_file() {
            return Err(self.err(
                k,
                format!("{} is not a regular file (a device or a FIFO cannot be replayed)", path.display()),
                format!("name a {format} file"),
            ));
        }
        if !path.is_file() {
            return Err(self.err(
                k,
                format!("{} does not exist", path.display()),
                "paths are relative to the spec file",
            ));
        }
        Ok(path)
    }

    fn vllm_bench(&self, p: VllmBenchParams) -> Result<StageConfig, ConfigError> {
        if p.result_file.is_empty() {
            return Err(self
                .err(
                    "result_file",
                    "a VllmBench stage needs the result of a vllm bench serve run",
                    format!("set result_file = \"measured.json\" (relative to the spec), written by: {BENCH_COMMAND}"),
                )
                .schema());
        }
        let path = self.input_file("result_file", &p.result_file, "a vllm bench serve result", "JSON")?;
        let file = BenchFile::read(&path, false).map_err(|e| {
            let at = ConfigError::file(e.path.display().to_string(), e.message).hint(e.hint);
            match e.line {
                Some(l) => at.at_line(l),
                None => at,
            }
        })?;
        let total = unlimited_or(self, "total_requests", p.total_requests)?;
        let timing = match (p.request_rate, p.burstiness) {
            (-1.0, -1.0) => None,
            (-1.0, _) => {
                return Err(self.err(
                    "burstiness",
                    "burstiness shapes the gaps of request_rate, which is not set",
                    "set request_rate (requests/s) as well, or remove burstiness",
                ));
            }
            (r, b) => {
                let rate = if r.is_infinite() && r > 0.0 { None } else { Some(self.request_rate(r)?) };
                let burstiness = match b {
                    -1.0 => file.burstiness,
                    b if b > 0.0 && !b.is_nan() => b,
                    b => {
                        return Err(self.err(
                            "burstiness",
                            format!("must be positive, got {b}"),
                            "use 1 for Poisson arrivals, less for burstier ones, inf for fixed gaps",
                        ));
                    }
                };
                Some(BenchTiming::Rate { rate, burstiness, ramp_up: None })
            }
        };
        let shared = self.at_least("shared_prefix_tokens", p.shared_prefix_tokens, 0)?;
        let stage = VllmBenchStage::new(path, &file, total, timing, shared);
        if stage.requests.is_empty() {
            return Err(self.err(
                "result_file",
                format!("{} lists no successful request ({} failed)", stage.path.display(), file.len()),
                "replay a run whose requests succeeded",
            ));
        }
        let max_outstanding = match p.max_outstanding_requests {
            0 => file.max_concurrency,
            v => self.cap("max_outstanding_requests", v)?,
        };
        Ok(StageConfig {
            kind: StageKind::VllmBench(stage),
            time_limit: self.time_limit(p.time_duration_sec)?,
            max_outstanding,
        })
    }

    fn sc25(&self, p: Sc25Params) -> Result<StageConfig, ConfigError> {
        let prompt_sizes = match p.prompt_sizes {
            None => SC25_PROMPT_SIZES.to_vec(),
            Some(v) if v.is_empty() => {
                return Err(self.err(
                    "prompt_sizes",
                    "no prompt sizes",
                    "list at least one size, or leave it out for Opal's ten",
                ));
            }
            Some(v) => v.iter().map(|&n| self.at_least("prompt_sizes", n, 1)).collect::<Result<_, _>>()?,
        };
        if !(p.gap_sec.is_finite() && p.gap_sec >= 0.0) {
            return Err(self.err(
                "gap_sec",
                format!("must be ≥ 0 seconds, got {}", p.gap_sec),
                "use 0 to send each request as the previous one completes",
            ));
        }
        Ok(StageConfig {
            kind: StageKind::Sc25(Sc25Stage {
                prompt_sizes,
                output_tokens: self.at_least("output_tokens", p.output_tokens, 1)?,
                gap: SimDuration::from_secs_f64(p.gap_sec),
            }),
            time_limit: self.time_limit(p.time_duration_sec)?,
            max_outstanding: None,
        })
    }

    fn rag(&self, p: RagParams) -> Result<StageConfig, ConfigError> {
        let time_limit = self.time_limit(p.time_duration_sec)?;
        let num_documents = self.at_least("num_documents", p.num_documents, 1)?;
        let docs_per_request = self.at_least("docs_per_request", p.docs_per_request, 1)?;
        if docs_per_request > num_documents {
            return Err(self.err(
                "docs_per_request",
                format!("{docs_per_request} distinct documents per request but the corpus has {num_documents}"),
                "make docs_per_request ≤ num_documents",
            ));
        }
        if !(p.doc_popularity_zipf.is_finite() && p.doc_popularity_zipf >= 0.0) {
            return Err(self.err(
                "doc_popularity_zipf",
                format!("must be ≥ 0, got {}", p.doc_popularity_zipf),
                "use 0 for uniform popularity, about 1 for a typical skew",
            ));
        }
        // A Zipf law keeps a table of every document's weight (about 40 bytes each).
        if p.doc_popularity_zipf > 0.0 && num_documents > MAX_ZIPF_DOCUMENTS {
            return Err(self.err(
                "num_documents",
                format!("{num_documents} documents with a Zipf popularity; at most {MAX_ZIPF_DOCUMENTS}"),
                "use fewer documents (a corpus of a million already spreads hits over more KV than any tier holds), or uniform popularity",
            ));
        }
        let stage = RagStage {
            rate: self.request_rate(p.request_rate)?,
            jitter: self.jitter(p.jitter)?,
            total: self.count("total_requests", p.total_requests, time_limit)?,
            system_prompt_size: self.at_least("system_prompt_size", p.system_prompt_size, 0)?,
            num_documents,
            document_size: self.at_least("document_size", p.document_size, 1)?,
            docs_per_request,
            query_size: self.at_least("query_size", p.query_size, 0)?,
            output_tokens: self.dist("output_tokens", &p.output_tokens, Unit::Tokens)?,
            zipf: p.doc_popularity_zipf,
        };
        if stage.prompt_tokens() > u64::from(u32::MAX) {
            return Err(self.err(
                "document_size",
                format!("prompts of {} tokens are too long", stage.prompt_tokens()),
                "use fewer or smaller documents",
            ));
        }
        Ok(StageConfig {
            kind: StageKind::Rag(stage),
            time_limit,
            max_outstanding: self.cap("max_outstanding_requests", p.max_outstanding_requests)?,
        })
    }

    fn sessions(&self, p: SessionsParams) -> Result<StageConfig, ConfigError> {
        let time_limit = self.time_limit(p.time_duration_sec)?;
        let or = |v: Option<&toml::Value>, k: &str, unit: Unit, default: Dist| {
            v.map_or(Ok(default), |v| self.dist(k, v, unit))
        };
        let uniform = |min: f64, max: f64| Dist::Uniform { min, max };
        let stage = SessionsStage {
            session_rate: self.rate_of("session_rate", p.session_rate, "sessions", "2.0")?,
            jitter: self.jitter(p.jitter)?,
            total_sessions: self.count("total_sessions", p.total_sessions, time_limit)?,
            turns: or(p.turns.as_ref(), "turns", Unit::Tokens, uniform(2.0, 8.0))?,
            system_prompt_size: self.at_least("system_prompt_size", p.system_prompt_size, 0)?,
            input_tokens: or(p.input_tokens.as_ref(), "input_tokens", Unit::Tokens, uniform(64.0, 512.0))?,
            output_tokens: or(p.output_tokens.as_ref(), "output_tokens", Unit::Tokens, uniform(64.0, 512.0))?,
            think_time: or(
                p.think_time_sec.as_ref(),
                "think_time_sec",
                Unit::Seconds,
                Dist::Exponential { mean: 10.0, min: 0.0, max: f64::INFINITY },
            )?,
            max_context_tokens: match p.max_context_tokens {
                -1 => None,
                n => Some(u64::from(self.at_least("max_context_tokens", n, 2)?)),
            },
        };
        Ok(StageConfig {
            kind: StageKind::Sessions(stage),
            time_limit,
            max_outstanding: self.cap("max_outstanding_requests", p.max_outstanding_requests)?,
        })
    }

    /// A distribution: a number (fixed) or `{ dist = "…", … }` (see [`crate::workload::dist`]).
    fn dist(&self, k: &str, v: &toml::Value, unit: Unit) -> Result<Dist, ConfigError> {
        const FORMS: &str = "a number, or a table such as { dist = \"lognormal\", mean = 2000, std = 1000, max = 32768 }; dist is one of fixed, uniform, normal, lognormal, exponential, empirical";
        let number = |v: &toml::Value| v.as_float().or_else(|| v.as_integer().map(|i| i as f64));
        let floor = unit.floor();
        // Values, means and bounds are lengths or times (at least `floor`);
        // a standard deviation only needs to be ≥ 0.
        let checked = |key: &str, x: f64, floor: f64| {
            if x.is_finite() && x >= floor {
                Ok(x)
            } else {
                Err(self.err(key, format!("must be a number ≥ {floor}, got {x}"), FORMS))
            }
        };
        if let Some(x) = number(v) {
            return Ok(Dist::Fixed(checked(k, x, floor)?));
        }
        let Some(t) = v.as_table() else {
            return Err(self.err(k, format!("expected a number or a distribution table, got {v}"), FORMS).schema());
        };
        let Some(kind) = t.get("dist").and_then(toml::Value::as_str) else {
            return Err(self.err(k, "a distribution table needs `dist`", FORMS).schema());
        };
        const KINDS: [&str; 6] = ["fixed", "uniform", "normal", "lognormal", "exponential", "empirical"];
        let allowed: &[&str] = match kind {
            "fixed" => &["value"],
            "uniform" => &["min", "max"],
            "normal" | "lognormal" => &["mean", "std", "min", "max"],
            "exponential" => &["mean", "min", "max"],
            "empirical" => &["trace_file", "field"],
            other => {
                let hint = match closest(other, KINDS) {
                    Some(c) => format!("did you mean `{c}`? distributions: {}", KINDS.join(", ")),
                    None => format!("distributions: {}", KINDS.join(", ")),
                };
                return Err(self.err(&format!("{k}.dist"), format!("unknown distribution {other:?}"), hint).schema());
            }
        };
        if let Some(extra) = t.keys().find(|x| *x != "dist" && !allowed.contains(&x.as_str())) {
            return Err(self
                .err(
                    &format!("{k}.{extra}"),
                    format!("unknown key `{extra}` for a {kind} distribution"),
                    format!("valid keys: dist, {}", allowed.join(", ")),
                )
                .unknown_key());
        }
        let get = |name: &str| -> Result<Option<f64>, ConfigError> {
            let key = format!("{k}.{name}");
            match t.get(name) {
                None => Ok(None),
                Some(v) => match number(v) {
                    Some(x) => checked(&key, x, if name == "std" { 0.0 } else { floor }).map(Some),
                    None => Err(self.err(&key, format!("must be a number, got {v}"), FORMS).schema()),
                },
            }
        };
        let need = |name: &str| {
            get(name)?.ok_or_else(|| {
                self.err(
                    &format!("{k}.{name}"),
                    format!("a {kind} distribution needs `{name}`"),
                    format!("valid keys: dist, {}", allowed.join(", ")),
                )
                .schema()
            })
        };
        let min = get("min")?.unwrap_or(floor);
        let max = get("max")?.unwrap_or(f64::INFINITY);
        if min > max {
            return Err(self.err(
                &format!("{k}.min"),
                format!("min ({min}) is greater than max ({max})"),
                "make min ≤ max",
            ));
        }
        let positive = |name: &str, x: f64| {
            if x > 0.0 {
                Ok(x)
            } else {
                Err(self.err(&format!("{k}.{name}"), format!("must be greater than 0, got {x}"), FORMS))
            }
        };
        Ok(match kind {
            "fixed" => Dist::Fixed(need("value")?),
            "uniform" => {
                let (lo, hi) = (need("min")?, need("max")?);
                if unit == Unit::Tokens && (lo.fract() != 0.0 || hi.fract() != 0.0) {
                    return Err(self.err(k, "uniform lengths need integer min and max", "use whole numbers of tokens"));
                }
                Dist::Uniform { min: lo, max: hi }
            }
            "normal" => Dist::Normal { mean: need("mean")?, std: get("std")?.unwrap_or(0.0), min, max },
            "lognormal" => Dist::lognormal(positive("mean", need("mean")?)?, get("std")?.unwrap_or(0.0), min, max),
            "exponential" => Dist::Exponential { mean: positive("mean", need("mean")?)?, min, max },
            _ => self.empirical(k, t)?,
        })
    }

    /// Lengths read from a trace file's `input_length` or `output_length`.
    fn empirical(&self, k: &str, t: &toml::Table) -> Result<Dist, ConfigError> {
        let file = t.get("trace_file").and_then(toml::Value::as_str).ok_or_else(|| {
            self.err(
                &format!("{k}.trace_file"),
                "an empirical distribution needs `trace_file`",
                "give a JSONL trace, relative to the spec",
            )
            .schema()
        })?;
        let field = t.get("field").map_or(Some("input_length"), toml::Value::as_str).unwrap_or("");
        if !["input_length", "output_length"].contains(&field) {
            return Err(self
                .err(&format!("{k}.field"), format!("unknown field {field:?}"), "use input_length or output_length")
                .schema());
        }
        // Read as a trace is replayed (the same reader, checks and
        // file:line errors): lengths only, so timestamps are taken as they
        // come and hash ids are not checked against a chunk size.
        let trace =
            TraceStage { chunk_size: 1, shift_to_first: true, ..TraceStage::whole_file(self.base_dir.join(file)) };
        let mut reader = crate::workload::TraceReader::open(&trace).map_err(trace_error)?;
        let mut values = Vec::new();
        while let Some(r) = reader.next_request(0).map_err(trace_error)? {
            let v = if field == "input_length" { r.prompt_tokens } else { r.output_tokens };
            values.push(f64::from(v));
        }
        if values.is_empty() {
            return Err(self.err(
                &format!("{k}.trace_file"),
                format!("{} has no requests", trace.path.display()),
                "use a non-empty trace",
            ));
        }
        Ok(Dist::Empirical(Arc::from(values)))
    }
}
