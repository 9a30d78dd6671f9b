//! A measured `vllm bench serve` run as a workload: the result file it
//! writes with `--save-result --save-detailed` replayed request by request.
//!
//! The file (`vllm/benchmarks/serve.py`, `benchmark` and `main_async`) holds
//! per-request `input_lens`, `output_lens`, `ttfts`, `itls`, `errors`, in
//! newer versions `latencies` and `start_times` (the client's
//! `time.perf_counter()` when each request was sent), and the traffic it was
//! run with: `request_rate` (a number or `"inf"`), `burstiness`,
//! `max_concurrency` and any `ramp_up_*`. A replay sends every successful
//! request (an empty `errors` entry; a failed one has no output length) with
//! its prompt and output lengths:
//!
//! - at its recorded send time less the first one's, when the file has
//!   `start_times`;
//! - else as `get_request` schedules them: every request at once for a rate
//!   of `inf`; otherwise cumulative gamma gaps of shape `burstiness` and
//!   scale `1 / (rate · burstiness)` (constant `1 / rate` for an infinite
//!   burstiness), rescaled so that the last of the file's requests goes out
//!   at `n / rate` (as vLLM does without a ramp-up), or at the ramp's rate of
//!   the request's index. Failed requests keep their place in that schedule.
//!
//! `max_concurrency` caps the requests in flight (vLLM's client semaphore).
//! Prompts are unique to their request but for a shared prefix of
//! `shared_prefix_tokens` (the `random` dataset's `--random-prefix-len`).

use super::{Due, Emit, Generator, Label};
use crate::kvcache::{Content, content_id};
use crate::rng::{SeedTree, StreamRng};
use crate::time::{SimDuration, SimTime};
use rand_distr::Distribution;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A `vllm bench serve` ramp-up: the request rate moves from `start` to
/// `end` requests/s over the requests' indices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RampUp {
    /// `exponential` (else linear).
    pub exponential: bool,
    /// First request's rate.
    pub start: f64,
    /// Last request's rate.
    pub end: f64,
}

impl RampUp {
    /// The rate of request `i` of `n`, as `_get_current_request_rate` computes it.
    fn rate(&self, i: usize, n: usize) -> f64 {
        let progress = i as f64 / n.saturating_sub(1).max(1) as f64;
        if self.exponential {
            self.start * (self.end / self.start).powf(progress)
        } else {
            self.start + (self.end - self.start) * progress
        }
    }
}

/// A `--save-result` file as read: the per-request detail, the traffic it
/// was sent with and every top-level number (the summary metrics).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BenchFile {
    /// Prompt tokens per request.
    pub input_lens: Vec<u64>,
    /// Output tokens per request (0 for a failed one).
    pub output_lens: Vec<u64>,
    /// Time to first token per request, seconds.
    pub ttfts: Vec<f64>,
    /// Gaps between a request's output chunks, seconds.
    pub itls: Vec<Vec<f64>>,
    /// Send to last token per request, seconds (newer versions).
    pub latencies: Vec<f64>,
    /// When each request was sent, seconds on the client's clock (newer versions).
    pub start_times: Vec<f64>,
    /// Why each request failed (empty: it succeeded).
    pub errors: Vec<String>,
    /// Requests/s (`None`: `inf`, all at once).
    pub request_rate: Option<f64>,
    /// Gamma shape of the gaps (1 = Poisson; `inf` = fixed gaps).
    pub burstiness: f64,
    /// The client's in-flight cap.
    pub max_concurrency: Option<u64>,
    /// A ramp-up instead of a fixed rate.
    pub ramp_up: Option<RampUp>,
    /// Every top-level number, in file order (`duration`, `completed`,
    /// `mean_ttft_ms`, `p99_itl_ms`, …).
    pub scalars: Vec<(String, f64)>,
}

/// Why a result file cannot be used: its path, the problem and the fix.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchError {
    /// The file.
    pub path: PathBuf,
    /// Line of the problem, when the JSON parser knows it.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub hint: String,
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        write!(f, ": {} ({})", self.message, self.hint)
    }
}

/// The `vllm bench serve` command line that writes a file this reads.
pub const BENCH_COMMAND: &str = "vllm bench serve --model <model> --dataset-name random --random-input-len 1024 \
     --random-output-len 128 --num-prompts 1000 --request-rate 10 --save-result --save-detailed \
     --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 --result-filename measured.json";

impl BenchFile {
    /// Reads `path`; without `with_itls` the per-token gaps are skipped
    /// (a replay needs only the lengths and the timing).
    pub fn read(path: &Path, with_itls: bool) -> Result<BenchFile, BenchError> {
        let err = |line: Option<usize>, message: String, hint: &str| BenchError {
            path: path.to_path_buf(),
            line,
            message,
            hint: hint.to_string(),
        };
        let file = std::fs::File::open(path).map_err(|e| {
            err(None, format!("cannot read it: {e}"), "give the file `vllm bench serve --save-result` wrote")
        })?;
        let mut de = serde_json::Deserializer::from_reader(std::io::BufReader::new(file));
        let f = FileSeed { with_itls }.deserialize(&mut de).map_err(|e| {
            err(
                Some(e.line()).filter(|&l| l > 0),
                format!("not a vllm bench serve result: {e}"),
                "give the JSON file `vllm bench serve --save-result --save-detailed` wrote",
            )
        })?;
        f.check().map_err(|(message, hint)| err(None, message, &hint))?;
        Ok(f)
    }

    /// The requests the file lists (successful or not).
    pub fn len(&self) -> usize {
        self.input_lens.len()
    }

    /// True when the file lists no request.
    pub fn is_empty(&self) -> bool {
        self.input_lens.is_empty()
    }

    /// Whether request `i` succeeded.
    pub fn succeeded(&self, i: usize) -> bool {
        match self.errors.get(i) {
            Some(e) => e.is_empty(),
            None => self.output_lens[i] > 0,
        }
    }

    /// A top-level number.
    pub fn scalar(&self, name: &str) -> Option<f64> {
        self.scalars.iter().find(|(k, _)| k == name).map(|&(_, v)| v)
    }

    fn check(&self) -> Result<(), (String, String)> {
        let n = self.input_lens.len();
        if n == 0 {
            return Err((
                "it has no per-request detail (input_lens)".into(),
                "run vllm bench serve with --save-detailed as well as --save-result".into(),
            ));
        }
        let lists: [(&str, usize); 6] = [
            ("output_lens", self.output_lens.len()),
            ("ttfts", self.ttfts.len()),
            ("itls", self.itls.len()),
            ("latencies", self.latencies.len()),
            ("start_times", self.start_times.len()),
            ("errors", self.errors.len()),
        ];
        for (name, len) in lists {
            // Only output_lens is required; the others may be absent (0) or skipped.
            if (len != 0 || name == "output_lens") && len != n {
                return Err((
                    format!("{name} has {len} entries but input_lens has {n}"),
                    "give the file as vllm wrote it: every per-request list has one entry per request".into(),
                ));
            }
        }
        if self.start_times.iter().any(|t| !t.is_finite()) {
            return Err((
                "start_times holds a value that is not a finite number".into(),
                "give the file as vllm wrote it".into(),
            ));
        }
        for (i, (&p, &o)) in self.input_lens.iter().zip(&self.output_lens).enumerate() {
            if self.succeeded(i) && (p == 0 || p > u64::from(u32::MAX) || o > u64::from(u32::MAX)) {
                return Err((
                    format!("request {i} has {p} prompt and {o} output tokens"),
                    "a served request has between 1 and 2^32 − 1 prompt tokens".into(),
                ));
            }
        }
        if !self.rate_ok() {
            return Err((
                format!("request_rate {:?} is not a positive rate", self.request_rate),
                "vllm writes a positive number or \"inf\"".into(),
            ));
        }
        if self.burstiness.is_nan() || self.burstiness <= 0.0 {
            return Err((
                format!("burstiness {} is not positive", self.burstiness),
                "vllm requires burstiness > 0".into(),
            ));
        }
        if let Some(r) = self.ramp_up
            && !(r.start.is_finite()
                && r.end.is_finite()
                && r.start >= 0.0
                && r.end >= r.start
                && (r.start > 0.0 || !r.exponential)
                && r.end > 0.0)
        {
            return Err((
                format!("ramp-up from {} to {} requests/s is not a ramp vllm runs", r.start, r.end),
                "vllm requires 0 ≤ ramp_up_start_rps ≤ ramp_up_end_rps (start > 0 for exponential)".into(),
            ));
        }
        Ok(())
    }

    fn rate_ok(&self) -> bool {
        self.request_rate.is_none_or(|r| r.is_finite() && r > 0.0)
    }
}

/// Deserializes a result file field by field, keeping what a replay or a
/// comparison needs and skipping the rest (generated texts, and the gaps
/// unless asked for) without holding it.
struct FileSeed {
    with_itls: bool,
}

impl<'de> DeserializeSeed<'de> for FileSeed {
    type Value = BenchFile;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<BenchFile, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FileSeed {
    type Value = BenchFile;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<BenchFile, A::Error> {
        let mut f = BenchFile { burstiness: 1.0, ..BenchFile::default() };
        let (mut ramp, mut ramp_start, mut ramp_end): (Option<String>, Option<f64>, Option<f64>) = (None, None, None);
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "input_lens" => f.input_lens = map.next_value()?,
                "output_lens" => f.output_lens = map.next_value()?,
                "ttfts" => {
                    f.ttfts = map.next_value::<Vec<Option<f64>>>()?.into_iter().map(|t| t.unwrap_or(0.0)).collect()
                }
                "itls" if self.with_itls => f.itls = map.next_value()?,
                "latencies" => {
                    f.latencies = map.next_value::<Vec<Option<f64>>>()?.into_iter().map(|t| t.unwrap_or(0.0)).collect();
                }
                "start_times" => f.start_times = map.next_value()?,
                "errors" => {
                    f.errors =
                        map.next_value::<Vec<Option<String>>>()?.into_iter().map(Option::unwrap_or_default).collect();
                }
                "request_rate" => f.request_rate = map.next_value::<Rate>()?.0,
                "burstiness" => f.burstiness = map.next_value::<Rate>()?.0.unwrap_or(f64::INFINITY),
                "max_concurrency" => f.max_concurrency = map.next_value()?,
                "ramp_up_strategy" => ramp = map.next_value()?,
                "ramp_up_start_rps" => ramp_start = map.next_value()?,
                "ramp_up_end_rps" => ramp_end = map.next_value()?,
                _ => {
                    if let Some(v) = map.next_value::<Scalar>()?.0 {
                        f.scalars.push((key, v));
                    }
                }
            }
        }
        if let Some(s) = ramp {
            let (Some(start), Some(end)) = (ramp_start, ramp_end) else {
                return Err(de::Error::custom("ramp_up_strategy without ramp_up_start_rps and ramp_up_end_rps"));
            };
            let exponential = match s.as_str() {
                "linear" => false,
                "exponential" => true,
                other => return Err(de::Error::custom(format!("unknown ramp_up_strategy {other:?}"))),
            };
            f.ramp_up = Some(RampUp { exponential, start, end });
        }
        Ok(f)
    }
}

/// A rate as vllm writes it: a number, or `"inf"` (`None`).
struct Rate(Option<f64>);

impl<'de> de::Deserialize<'de> for Rate {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Rate, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Rate;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number or \"inf\"")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Rate, E> {
                Ok(Rate(Some(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Rate, E> {
                Ok(Rate(Some(v as f64)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Rate, E> {
                Ok(Rate(Some(v as f64)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Rate, E> {
                match v.to_ascii_lowercase().as_str() {
                    "inf" | "infinity" => Ok(Rate(None)),
                    _ => v.parse().map(|r| Rate(Some(r))).map_err(|_| E::custom(format!("{v:?} is not a rate"))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A top-level value: kept when it is a number, skipped otherwise.
struct Scalar(Option<f64>);

impl<'de> de::Deserialize<'de> for Scalar {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Scalar, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(Some(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(Some(v as f64)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(Some(v as f64)))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Scalar, E> {
                Ok(Scalar(None))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Scalar, E> {
                Ok(Scalar(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Scalar, E> {
                Ok(Scalar(None))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut s: A) -> Result<Scalar, A::Error> {
                while s.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Scalar(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Scalar, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Scalar(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// One request to replay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BenchRequest {
    /// Its index among all the file's requests (its place in vLLM's schedule).
    pub index: u32,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens.
    pub output_tokens: u32,
    /// Recorded send time less the first request's, seconds (files with `start_times`).
    pub sent_s: Option<f64>,
}

/// How a replay times its requests.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BenchTiming {
    /// At their recorded send times.
    Recorded,
    /// As `vllm bench serve` schedules `requests` requests at this rate.
    Rate {
        /// Requests/s (`None`: all at once).
        rate: Option<f64>,
        /// Gamma shape of the gaps (`inf`: fixed gaps).
        burstiness: f64,
        /// A ramp-up instead of the rate.
        ramp_up: Option<RampUp>,
    },
}

/// A resolved `VllmBench` stage.
#[derive(Clone, Debug, PartialEq)]
pub struct VllmBenchStage {
    /// The result file.
    pub path: PathBuf,
    /// The successful requests, in sending order.
    pub requests: Arc<[BenchRequest]>,
    /// Requests the file lists, failed ones included (vLLM's schedule spans them all).
    pub listed: u32,
    /// How they are timed.
    pub timing: BenchTiming,
    /// Leading prompt tokens every request shares.
    pub shared_prefix_tokens: u32,
}

impl VllmBenchStage {
    /// The stage of `file` read from `path`: its first `total` successful
    /// requests (all with `None`), timed by `timing` (`None`: the file's own).
    pub fn new(
        path: PathBuf,
        file: &BenchFile,
        total: Option<u64>,
        timing: Option<BenchTiming>,
        shared: u32,
    ) -> VllmBenchStage {
        let first = file
            .start_times
            .iter()
            .copied()
            .enumerate()
            .filter(|&(i, _)| file.succeeded(i))
            .map(|(_, t)| t)
            .fold(f64::INFINITY, f64::min);
        let mut requests: Vec<BenchRequest> = (0..file.len())
            .filter(|&i| file.succeeded(i))
            .map(|i| BenchRequest {
                index: i as u32,
                prompt_tokens: file.input_lens[i] as u32,
                output_tokens: file.output_lens[i].max(1) as u32,
                sent_s: file.start_times.get(i).map(|&t| t - first),
            })
            .collect();
        let timing = timing.unwrap_or(if file.start_times.is_empty() {
            BenchTiming::Rate { rate: file.request_rate, burstiness: file.burstiness, ramp_up: file.ramp_up }
        } else {
            BenchTiming::Recorded
        });
        if timing == BenchTiming::Recorded {
            // Sending order (the client's semaphore can reorder sends slightly).
            requests.sort_by(|a, b| a.sent_s.partial_cmp(&b.sent_s).expect("finite send times"));
        }
        if let Some(t) = total {
            requests.truncate(t.min(requests.len() as u64) as usize);
        }
        VllmBenchStage {
            path,
            requests: requests.into(),
            listed: file.len() as u32,
            timing,
            shared_prefix_tokens: shared,
        }
    }

    /// Send offsets from the stage start, seconds, one per replayed request,
    /// drawn from `rng` when the timing is a rate.
    fn offsets(&self, rng: &mut StreamRng) -> Vec<f64> {
        let (rate, burstiness, ramp_up) = match self.timing {
            BenchTiming::Recorded => return self.requests.iter().map(|r| r.sent_s.unwrap_or(0.0)).collect(),
            BenchTiming::Rate { rate: None, ramp_up: None, .. } => return vec![0.0; self.requests.len()],
            BenchTiming::Rate { rate, burstiness, ramp_up } => (rate.unwrap_or(f64::INFINITY), burstiness, ramp_up),
        };
        // `get_request`: one delay per listed request, cumulative.
        let n = self.listed as usize;
        let mut at = Vec::with_capacity(n);
        let mut t = 0.0;
        for i in 0..n {
            let r = ramp_up.map_or(rate, |ramp| ramp.rate(i, n));
            t += if r.is_infinite() {
                0.0
            } else if burstiness.is_infinite() {
                1.0 / r
            } else {
                let theta = 1.0 / (r * burstiness);
                rand_distr::Gamma::new(burstiness, theta).expect("a positive shape and scale").sample(rng)
            };
            at.push(t);
        }
        // Without a ramp-up the schedule is rescaled to end at n / rate.
        if ramp_up.is_none() && t > 0.0 {
            let scale = n as f64 / rate / t;
            at.iter_mut().for_each(|a| *a *= scale);
        }
        self.requests.iter().map(|r| at[r.index as usize]).collect()
    }
}

/// The generator of a `VllmBench` stage.
#[derive(Debug)]
pub(crate) struct VllmBenchSource {
    cfg: VllmBenchStage,
    rng: StreamRng,
    start: SimTime,
    offsets: Vec<f64>,
    next: usize,
}

impl VllmBenchSource {
    /// Gaps (when drawn) from `workload.stage<i>.arrivals`.
    pub fn new(cfg: &VllmBenchStage, stage: usize, seeds: &SeedTree) -> VllmBenchSource {
        VllmBenchSource {
            cfg: cfg.clone(),
            rng: seeds.stream(&format!("workload.stage{stage}.arrivals")),
            start: SimTime::ZERO,
            offsets: Vec::new(),
            next: 0,
        }
    }

    fn due(&self) -> Due {
        match self.offsets.get(self.next) {
            Some(&o) => Due::At(self.start + SimDuration::from_secs_f64(o)),
            None => Due::Done,
        }
    }
}

impl Generator for VllmBenchSource {
    fn start(&mut self, now: SimTime) -> Result<Due, String> {
        self.start = now;
        self.offsets = self.cfg.offsets(&mut self.rng);
        self.next = 0;
        Ok(self.due())
    }

    fn emit(&mut self, now: SimTime, room: u64, out: &mut Emit<'_>) -> Result<Due, String> {
        match self.due() {
            Due::At(t) if t <= now && room > 0 => {}
            due => return Ok(due),
        }
        let r = self.cfg.requests[self.next];
        let shared = self.cfg.shared_prefix_tokens.min(r.prompt_tokens);
        let mut content = Content::default();
        content.push(content_id("prefix", out.stage_index()), shared);
        content.push(content_id("unique", out.key()), r.prompt_tokens - shared);
        out.push(r.prompt_tokens, r.output_tokens, content, Label::None);
        self.next += 1;
        Ok(self.due())
    }
}
