//! Step-time models: how long one scheduler step (one forward pass over the
//! batch) takes.
//!
//! A step has a prefill part (chunks of prompt tokens, each with the number of
//! tokens already in the KV cache) and a decode part (one token for each
//! decoding sequence, reading its KV context). The models:
//!
//! * `roofline` — Opal's analytic model, generalised to today's model
//!   families (see [`Roofline`]). A prefill chunk taking a sequence from `p`
//!   to `n` computed tokens costs
//!   `a·d_attn·(n(n+1) − p(p+1))·L / flops + b·D·(n−p) / flops_linear`
//!   seconds, where `D` is `L·d²` for a dense model (Opal's term; `b = 24`
//!   stands for 2 FLOPs × the ≈ 12 d² weights of a dense layer) and, for
//!   other families, their active linear weights per token / 12; windowed
//!   layers count at most `window` earlier tokens per token. The decode part
//!   costs `overhead + (weights read + KV read) / (efficiency·tp·mem_bw)`:
//!   every forward pass streams the weights (a mixture of experts only the
//!   experts its tokens touch) and each decoding sequence its KV context.
//!   Chunks of one step add up (their FLOPs add; Opal takes the max over
//!   requests, which under-charges batched prefill — a deliberate difference).
//! * `synthetic` — every step takes the same fixed time.
//! * `table` — measured latencies, linearly interpolated (see [`LatencyTable`]).
//!
//! Prefill and decode parts combine by [`MixRule`]: `max` (Opal's rule) or `sum`.

use crate::metrics::PeakSeconds;
use crate::time::SimDuration;
use crate::worker::model::{ModelArch, ModelShape, attention_pairs};
use crate::worker::presets::GpuSpec;

/// One prefill chunk in a step: the sequence goes from `cached` to `end` computed tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillChunk {
    /// Tokens already in the KV cache before the chunk (p).
    pub cached: u64,
    /// Tokens in the KV cache after the chunk (n).
    pub end: u64,
}

/// The work of one step.
#[derive(Clone, Copy, Debug)]
pub struct StepWork<'a> {
    /// Prefill chunks.
    pub prefill: &'a [PrefillChunk],
    /// Decoding sequences (one new token each).
    pub decodes: u64,
    /// Σ over decoding sequences of the tokens already in their KV cache.
    pub decode_context_tokens: u64,
    /// The same with each sequence's context capped at the model's sliding
    /// window (equal to `decode_context_tokens` without one).
    pub decode_window_tokens: u64,
}

/// How a step's prefill and decode parts combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixRule {
    /// The step takes the longer of the two parts (Opal).
    Max,
    /// The step takes both parts back to back.
    Sum,
}

impl MixRule {
    fn combine(self, prefill: f64, decode: f64) -> f64 {
        match self {
            MixRule::Max => prefill.max(decode),
            MixRule::Sum => prefill + decode,
        }
    }
}

/// The roofline with every constant resolved (Opal's model, generalised).
#[derive(Clone, Debug, PartialEq)]
pub struct Roofline {
    /// Attention coefficient a.
    pub a: f64,
    /// Dense coefficient b.
    pub b: f64,
    /// The model, as the roofline sees it.
    pub shape: ModelShape,
    /// FLOP/s of the worker for attention (BF16 peak · tp).
    pub attn_flops_per_sec: f64,
    /// FLOP/s of the worker for the linear layers (the FP8 peak for FP8 weights on a GPU that has one).
    pub linear_flops_per_sec: f64,
    /// Memory bytes/s of the worker (datasheet peak · tp).
    pub mem_bytes_per_sec: f64,
    /// Fraction of the peak memory bandwidth a decode step achieves (1: the peak).
    pub decode_bw_efficiency: f64,
    /// Fixed time added to every step's decode part (scheduling, kernel launches), seconds.
    pub step_overhead_secs: f64,
    /// Weight bytes read by a forward pass over all its tokens.
    pub weights: WeightTraffic,
}

/// Weight bytes a forward pass reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WeightTraffic {
    /// Every weight.
    pub total_bytes: f64,
    /// Bytes of one routed expert in one layer (0 for a dense model).
    pub expert_bytes: f64,
    /// MoE layers.
    pub moe_layers: f64,
    /// Routed experts per MoE layer (E).
    pub experts: u64,
    /// Experts per token (k).
    pub active: u64,
}

impl WeightTraffic {
    /// All weights but the routed experts, plus in each MoE layer the
    /// `E·(1 − (1 − k/E)^T)` experts `T` tokens are expected to touch.
    pub fn read(&self, tokens: f64) -> f64 {
        if self.experts == 0 {
            return self.total_bytes;
        }
        let per_layer = crate::worker::model::expected_experts(self.experts, self.active, tokens.max(1.0));
        self.total_bytes - self.moe_layers * self.expert_bytes * (self.experts as f64 - per_layer)
    }
}

/// The roofline's fitted constants (`worker.inference_params`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Coefficients {
    /// Attention coefficient a (Opal's default 4).
    pub a: f64,
    /// Dense coefficient b (Opal's default 24).
    pub b: f64,
    /// Fraction of peak memory bandwidth decode achieves (default 1).
    pub decode_bw_efficiency: f64,
    /// Fixed seconds per step (default 0).
    pub step_overhead_secs: f64,
}

impl Coefficients {
    /// Opal's `a = 4, b = 24`, the datasheet bandwidth, no overhead.
    pub const OPAL: Coefficients = Coefficients { a: 4.0, b: 24.0, decode_bw_efficiency: 1.0, step_overhead_secs: 0.0 };
}

impl Roofline {
    /// The roofline of `model` on a worker of `tp` × `gpu`.
    pub fn new(model: &ModelArch, gpu: &GpuSpec, tp: u32, c: Coefficients) -> Roofline {
        let tp = f64::from(tp);
        let shape = model.shape();
        let bf16 = gpu.tflops * tp * 1e12;
        let moe = model.moe.as_ref();
        Roofline {
            a: c.a,
            b: c.b,
            shape,
            attn_flops_per_sec: bf16,
            linear_flops_per_sec: match gpu.fp8_tflops {
                Some(fp8) if shape.fp8_weights => fp8 * tp * 1e12,
                _ => bf16,
            },
            mem_bytes_per_sec: gpu.mem_bw_tbps * tp * 1e12,
            decode_bw_efficiency: c.decode_bw_efficiency,
            step_overhead_secs: c.step_overhead_secs,
            weights: WeightTraffic {
                total_bytes: model.weight_bytes() as f64,
                expert_bytes: model.expert_bytes(),
                moe_layers: moe.map_or(0.0, |m| m.layers as f64),
                experts: moe.map_or(0, |m| m.experts),
                active: moe.map_or(0, |m| m.active),
            },
        }
    }

    /// Seconds to prefill from `p` to `n` computed tokens.
    pub fn prefill_secs(&self, p: u64, n: u64) -> f64 {
        debug_assert!(n >= p, "prefill chunk ends before it starts");
        let m = &self.shape;
        let pairs = m.full_layers * attention_pairs(p, n, u64::MAX)
            + if m.windowed_layers > 0.0 { m.windowed_layers * attention_pairs(p, n, m.window) } else { 0.0 };
        self.a * m.d_attn * pairs / self.attn_flops_per_sec
            + self.b * m.linear_d2 * (n - p) as f64 / self.linear_flops_per_sec
    }

    /// Seconds of the decode part of a step over `tokens` tokens: the fixed
    /// overhead, then the weights and the decoding sequences' KV streamed
    /// from memory (`context` tokens in all; `window_context` with each
    /// sequence capped at the sliding window).
    pub fn decode_secs(&self, tokens: u64, context: u64, window_context: u64) -> f64 {
        let m = &self.shape;
        let kv = m.kv_full_bytes_per_token * context as f64 + m.kv_window_bytes_per_token * window_context as f64;
        self.step_overhead_secs
            + (self.weights.read(tokens as f64) + kv) / (self.decode_bw_efficiency * self.mem_bytes_per_sec)
    }
}

impl Roofline {
    /// The physical work of a step, whatever step-time model times it:
    /// attention 4·d FLOPs per causal query–key pair per layer, the linear
    /// layers 2 FLOPs per active weight per token (24·Σd², the `b = 24` of
    /// the roofline's dense term); HBM traffic is the weights the step's
    /// tokens read once, plus the KV cache every token attends to (decode:
    /// each sequence's context; prefill: the chunk's whole prefix), plus the
    /// new tokens' KV written.
    pub fn peak_seconds(&self, work: &StepWork<'_>) -> PeakSeconds {
        let m = &self.shape;
        let attention = |pairs_x2: f64, windowed_x2: f64| {
            2.0 * m.d_attn * (m.full_layers * pairs_x2 + m.windowed_layers * windowed_x2)
        };
        let mut attn_flops = 0.0;
        let mut tokens = work.decodes;
        let mut kv_bytes = 0.0;
        for c in work.prefill {
            attn_flops +=
                attention(attention_pairs(c.cached, c.end, u64::MAX), attention_pairs(c.cached, c.end, m.window));
            tokens += c.end - c.cached;
            kv_bytes +=
                m.kv_full_bytes_per_token * c.end as f64 + m.kv_window_bytes_per_token * c.end.min(m.window) as f64;
        }
        // A decode token attends to its sequence's context: 4·d per context token per layer.
        attn_flops += 4.0
            * m.d_attn
            * (m.full_layers * work.decode_context_tokens as f64
                + m.windowed_layers * work.decode_window_tokens as f64);
        kv_bytes += m.kv_full_bytes_per_token * (work.decode_context_tokens + work.decodes) as f64
            + m.kv_window_bytes_per_token * (work.decode_window_tokens + work.decodes) as f64;
        let linear_flops = 24.0 * m.linear_d2 * tokens as f64;
        let weights = if tokens > 0 { self.weights.read(tokens as f64) } else { 0.0 };
        PeakSeconds {
            compute: attn_flops / self.attn_flops_per_sec + linear_flops / self.linear_flops_per_sec,
            memory: (weights + kv_bytes) / self.mem_bytes_per_sec,
        }
    }
}

/// Measured latencies as a CSV gives them: the input of the `table` step
/// model and of `opal-sweep calibrate`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatencyRows {
    /// Prefill rows: (prompt tokens from an empty cache, seconds).
    pub prefill: Vec<(f64, f64)>,
    /// Decode rows: (batch size, context tokens per sequence, seconds per step).
    pub decode: Vec<(f64, f64, f64)>,
}

impl LatencyRows {
    /// Reads a CSV with header `phase,batch_size,tokens,latency_ms`
    /// (`batch_size` is ignored on prefill rows and may be empty; lines
    /// starting with `#` are comments); errors name the file and line.
    pub fn from_csv(path: &std::path::Path) -> Result<LatencyRows, String> {
        #[derive(serde::Deserialize)]
        struct Row {
            phase: String,
            batch_size: Option<f64>,
            tokens: f64,
            latency_ms: f64,
        }
        let where_ =
            |line: Option<u64>| format!("{}{}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default());
        let mut reader = csv::ReaderBuilder::new()
            .trim(csv::Trim::All)
            .comment(Some(b'#'))
            .from_path(path)
            .map_err(|e| format!("{}: {e}", where_(None)))?;
        let headers = reader.headers().map_err(|e| format!("{}: {e}", where_(None)))?.clone();
        let mut rows = LatencyRows::default();
        for record in reader.records() {
            let record = record.map_err(|e| format!("{}: {e}", where_(e.position().map(|p| p.line()))))?;
            let line = record.position().map(|p| p.line());
            let row: Row = record
                .deserialize(Some(&headers))
                .map_err(|e| format!("{}: {e} (expected columns phase,batch_size,tokens,latency_ms)", where_(line)))?;
            if !(row.latency_ms >= 0.0 && row.tokens >= 0.0) {
                return Err(format!("{}: tokens and latency_ms must be non-negative numbers", where_(line)));
            }
            match row.phase.to_ascii_lowercase().as_str() {
                "prefill" => rows.prefill.push((row.tokens, row.latency_ms / 1e3)),
                "decode" => {
                    let b = row.batch_size.ok_or_else(|| format!("{}: a decode row needs batch_size", where_(line)))?;
                    rows.decode.push((b, row.tokens, row.latency_ms / 1e3));
                }
                other => return Err(format!("{}: phase {other:?} is neither `prefill` nor `decode`", where_(line))),
            }
        }
        Ok(rows)
    }
}

/// Measured step latencies.
///
/// Prefill rows give the latency of prefilling `tokens` tokens from an empty
/// cache; a chunk from `p` to `n` costs `T(n) − T(p)` with `T` linear between
/// rows, through (0, 0) below the first row and along the last segment above
/// the last. Decode rows give the latency of one decode step for a batch of
/// `batch_size` sequences with `tokens` context tokens *per sequence*; they
/// must form a full grid and are interpolated bilinearly (linearly
/// extrapolated outside it).
#[derive(Clone, Debug, PartialEq)]
pub struct LatencyTable {
    /// (tokens, seconds), strictly increasing tokens.
    pub prefill: Vec<(f64, f64)>,
    /// Batch sizes of the decode grid, strictly increasing.
    pub decode_batches: Vec<f64>,
    /// Per-sequence context sizes of the decode grid, strictly increasing.
    pub decode_contexts: Vec<f64>,
    /// Seconds, row-major: `decode_secs[i * contexts + j]` is (batch i, context j).
    pub decode_secs: Vec<f64>,
}

impl LatencyTable {
    /// Reads a CSV with header `phase,batch_size,tokens,latency_ms`
    /// (`batch_size` is ignored on prefill rows and may be empty).
    pub fn from_csv(path: &std::path::Path) -> Result<LatencyTable, String> {
        let rows = LatencyRows::from_csv(path)?;
        Self::from_rows(rows.prefill, rows.decode).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Builds the table from prefill (tokens, s) and decode (batch, context, s) rows.
    pub fn from_rows(mut prefill: Vec<(f64, f64)>, decode: Vec<(f64, f64, f64)>) -> Result<LatencyTable, String> {
        if prefill.is_empty() || decode.is_empty() {
            return Err("the table needs at least one prefill row and one decode row".into());
        }
        prefill.sort_by(|x, y| x.0.total_cmp(&y.0));
        if prefill.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err("two prefill rows have the same token count".into());
        }
        let mut batches: Vec<f64> = decode.iter().map(|r| r.0).collect();
        let mut contexts: Vec<f64> = decode.iter().map(|r| r.1).collect();
        for v in [&mut batches, &mut contexts] {
            v.sort_by(f64::total_cmp);
            v.dedup();
        }
        if batches.len() * contexts.len() != decode.len() {
            return Err(format!(
                "decode rows must form a full grid: {} batch sizes × {} contexts needs {} rows, found {}",
                batches.len(),
                contexts.len(),
                batches.len() * contexts.len(),
                decode.len()
            ));
        }
        let mut grid = vec![f64::NAN; decode.len()];
        for (b, c, s) in decode {
            let i = batches.iter().position(|&x| x == b).expect("batch value came from the rows");
            let j = contexts.iter().position(|&x| x == c).expect("context value came from the rows");
            grid[i * contexts.len() + j] = s;
        }
        if grid.iter().any(|s| s.is_nan()) {
            return Err("a (batch_size, tokens) pair appears twice in the decode rows".into());
        }
        Ok(LatencyTable { prefill, decode_batches: batches, decode_contexts: contexts, decode_secs: grid })
    }

    fn prefill_cumulative(&self, tokens: f64) -> f64 {
        let pts = &self.prefill;
        let (x0, y0, x1, y1) = match pts.iter().position(|&(x, _)| x >= tokens) {
            Some(0) => (0.0, 0.0, pts[0].0, pts[0].1),
            Some(i) => (pts[i - 1].0, pts[i - 1].1, pts[i].0, pts[i].1),
            None if pts.len() == 1 => (0.0, 0.0, pts[0].0, pts[0].1),
            None => {
                let n = pts.len();
                (pts[n - 2].0, pts[n - 2].1, pts[n - 1].0, pts[n - 1].1)
            }
        };
        lerp(x0, y0, x1, y1, tokens)
    }

    /// Seconds to prefill from `p` to `n` computed tokens.
    pub fn prefill_secs(&self, p: u64, n: u64) -> f64 {
        (self.prefill_cumulative(n as f64) - self.prefill_cumulative(p as f64)).max(0.0)
    }

    /// Seconds of a decode step over `batch` sequences with `context_tokens` in total.
    pub fn decode_secs(&self, batch: u64, context_tokens: u64) -> f64 {
        let per_seq = context_tokens as f64 / batch as f64;
        let (i0, i1) = bracket(&self.decode_batches, batch as f64);
        let (j0, j1) = bracket(&self.decode_contexts, per_seq);
        let nc = self.decode_contexts.len();
        let at = |i: usize, j: usize| self.decode_secs[i * nc + j];
        let (c0, c1) = (self.decode_contexts[j0], self.decode_contexts[j1]);
        let row = |i: usize| lerp(c0, at(i, j0), c1, at(i, j1), per_seq);
        let (b0, b1) = (self.decode_batches[i0], self.decode_batches[i1]);
        lerp(b0, row(i0), b1, row(i1), batch as f64).max(0.0)
    }
}

/// Indices of the grid points bracketing `x` (the edge segment outside the grid).
fn bracket(grid: &[f64], x: f64) -> (usize, usize) {
    if grid.len() == 1 {
        return (0, 0);
    }
    let i = grid.iter().position(|&g| g >= x).unwrap_or(grid.len() - 1).max(1);
    (i - 1, i)
}

fn lerp(x0: f64, y0: f64, x1: f64, y1: f64, x: f64) -> f64 {
    if x1 == x0 { y0 } else { y0 + (y1 - y0) * (x - x0) / (x1 - x0) }
}

/// A resolved step-time model.
#[derive(Clone, Debug, PartialEq)]
pub enum StepModel {
    /// Opal's analytic roofline.
    Roofline(Roofline),
    /// A fixed time per step.
    Synthetic(SimDuration),
    /// Measured latencies.
    Table(LatencyTable),
}

/// A step-time model with its mix rule.
#[derive(Clone, Debug, PartialEq)]
pub struct PerfModel {
    /// The model.
    pub model: StepModel,
    /// How prefill and decode parts combine.
    pub mix: MixRule,
}

impl PerfModel {
    /// Duration of one step (at least 1 ns; rounding per [`SimDuration::from_secs_f64`]).
    pub fn step_time(&self, work: &StepWork<'_>) -> SimDuration {
        let secs = match &self.model {
            StepModel::Synthetic(d) => return *d,
            StepModel::Roofline(r) => {
                let prefill: f64 = work.prefill.iter().map(|c| r.prefill_secs(c.cached, c.end)).sum();
                let tokens = work.decodes + work.prefill.iter().map(|c| c.end - c.cached).sum::<u64>();
                let decode = r.decode_secs(tokens, work.decode_context_tokens, work.decode_window_tokens);
                self.mix.combine(prefill, decode)
            }
            StepModel::Table(t) => {
                let prefill: f64 = work.prefill.iter().map(|c| t.prefill_secs(c.cached, c.end)).sum();
                let decode =
                    if work.decodes > 0 { t.decode_secs(work.decodes, work.decode_context_tokens) } else { 0.0 };
                self.mix.combine(prefill, decode)
            }
        };
        SimDuration::from_secs_f64(secs).max(SimDuration(1))
    }
}

#[cfg(test)]
impl Roofline {
    /// A dense model of `layers` layers of width `d` with `a`, `b`, one FLOP
    /// rate, one bandwidth, `weights` bytes and `kv` KV bytes per token.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn toy(layers: f64, d: f64, a: f64, b: f64, flops: f64, bw: f64, weights: f64, kv: f64) -> Roofline {
        Roofline {
            a,
            b,
            shape: ModelShape {
                full_layers: layers,
                windowed_layers: 0.0,
                window: u64::MAX,
                d_attn: d,
                linear_d2: layers * d * d,
                kv_full_bytes_per_token: kv,
                kv_window_bytes_per_token: 0.0,
                fp8_weights: false,
            },
            attn_flops_per_sec: flops,
            linear_flops_per_sec: flops,
            mem_bytes_per_sec: bw,
            decode_bw_efficiency: 1.0,
            step_overhead_secs: 0.0,
            weights: WeightTraffic { total_bytes: weights, expert_bytes: 0.0, moe_layers: 0.0, experts: 0, active: 0 },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// L = 2, d = 10, a = 4, b = 24, 1e6 FLOP/s, 1e3 B/s, 500 B weights, 10 B/token.
    fn toy_roofline() -> Roofline {
        Roofline::toy(2.0, 10.0, 4.0, 24.0, 1e6, 1e3, 500.0, 10.0)
    }

    #[test]
    fn a_steps_peak_seconds_follow_the_physical_counts_by_hand() {
        // L = 2, d = 10, 1e6 FLOP/s, 1e3 B/s, 500 B weights, 10 B/token of KV.
        let r = toy_roofline();
        // Prefill of tokens 0..4: causal pairs 4·5/2 = 10 → attention 4·10·10·2 = 800 FLOPs;
        // linear 24·(2·10²)·4 = 19,200 FLOPs; HBM 500 B weights + 10·4 B KV.
        let chunk = [PrefillChunk { cached: 0, end: 4 }];
        let w = StepWork { prefill: &chunk, decodes: 0, decode_context_tokens: 0, decode_window_tokens: 0 };
        let p = r.peak_seconds(&w);
        assert!((p.compute - 20_000.0 / 1e6).abs() < 1e-12, "{p:?}");
        assert!((p.memory - 540.0 / 1e3).abs() < 1e-12, "{p:?}");
        // Two decodes over 30 context tokens: attention 4·10·30·2 = 2,400; linear 24·200·2 = 9,600;
        // HBM 500 + 10·(30 + 2).
        let w = StepWork { prefill: &[], decodes: 2, decode_context_tokens: 30, decode_window_tokens: 30 };
        let p = r.peak_seconds(&w);
        assert!((p.compute - 12_000.0 / 1e6).abs() < 1e-12, "{p:?}");
        assert!((p.memory - 820.0 / 1e3).abs() < 1e-12, "{p:?}");
        let idle = StepWork { prefill: &[], decodes: 0, decode_context_tokens: 0, decode_window_tokens: 0 };
        assert_eq!(r.peak_seconds(&idle), PeakSeconds::default());
    }

    #[test]
    fn roofline_prefill_matches_opal_formula_by_hand() {
        let r = toy_roofline();
        // p = 0, n = 10: 2·(4·110·10 + 24·10·100)/1e6 = 2·(4400 + 24000)/1e6 = 0.0568 s.
        assert!((r.prefill_secs(0, 10) - 0.0568).abs() < 1e-15);
        // p = 10, n = 20: 2·(4·(420 − 110)·10 + 24·10·100)/1e6 = 2·(12400 + 24000)/1e6 = 0.0728 s.
        assert!((r.prefill_secs(10, 20) - 0.0728).abs() < 1e-15);
    }

    #[test]
    fn mixed_step_takes_max_or_sum_of_prefill_sum_and_decode() {
        let r = toy_roofline();
        let chunks = [PrefillChunk { cached: 0, end: 10 }, PrefillChunk { cached: 10, end: 20 }];
        let work = StepWork { prefill: &chunks, decodes: 3, decode_context_tokens: 30, decode_window_tokens: 30 };
        // prefill = 0.0568 + 0.0728 = 0.1296 s; decode = (500 + 10·30)/1e3 = 0.8 s.
        let max = PerfModel { model: StepModel::Roofline(r.clone()), mix: MixRule::Max };
        assert_eq!(max.step_time(&work), SimDuration(800_000_000));
        let sum = PerfModel { model: StepModel::Roofline(r), mix: MixRule::Sum };
        assert_eq!(sum.step_time(&work), SimDuration(929_600_000));
    }

    #[test]
    fn windowed_layers_attend_to_at_most_the_window() {
        let mut r = toy_roofline();
        // One of the two layers slides over 4 tokens.
        r.shape.full_layers = 1.0;
        r.shape.windowed_layers = 1.0;
        r.shape.window = 4;
        // p = 0, n = 10: full layer Σ 2i = 110; windowed Σ 2·min(i, 4) = 2·(1+2+3+4) + 6·8 = 68.
        // 4·10·(110 + 68)/1e6 + 24·200·10/1e6 = 0.00712 + 0.048 = 0.05512 s.
        assert!((r.prefill_secs(0, 10) - 0.05512).abs() < 1e-15);
        // Decode: 1 KV byte per token in the windowed layer, 9 in the full one:
        // contexts 2 and 20 → 9·22 + 1·(2 + 4) = 204 B; (500 + 204)/1e3 = 0.704 s.
        r.shape.kv_full_bytes_per_token = 9.0;
        r.shape.kv_window_bytes_per_token = 1.0;
        assert!((r.decode_secs(2, 22, 6) - 0.704).abs() < 1e-15);
    }

    #[test]
    fn a_mixture_of_experts_reads_the_experts_its_tokens_touch() {
        let mut r = toy_roofline();
        // 500 B of weights of which 2 layers × 4 experts × 50 B = 400 B routed, top-1.
        r.weights = WeightTraffic { total_bytes: 500.0, expert_bytes: 50.0, moe_layers: 2.0, experts: 4, active: 1 };
        // One token touches 1 expert per layer: 100 + 2·1·50 = 200 B.
        assert!((r.decode_secs(1, 0, 0) - 0.2).abs() < 1e-12);
        // Two tokens: 4·(1 − (3/4)²) = 1.75 experts per layer: 100 + 2·1.75·50 = 275 B.
        assert!((r.decode_secs(2, 0, 0) - 0.275).abs() < 1e-12);
        // Many tokens touch them all.
        assert!((r.decode_secs(10_000, 0, 0) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn decode_efficiency_and_overhead_apply_to_every_step() {
        let mut r = toy_roofline();
        r.decode_bw_efficiency = 0.5;
        r.step_overhead_secs = 0.001;
        // 0.001 + (500 + 10·30)/(0.5·1e3) = 1.601 s.
        assert!((r.decode_secs(3, 30, 30) - 1.601).abs() < 1e-12);
    }

    #[test]
    fn synthetic_steps_take_the_fixed_time_whatever_the_work() {
        let m = PerfModel { model: StepModel::Synthetic(SimDuration(5)), mix: MixRule::Max };
        let chunks = [PrefillChunk { cached: 0, end: 1000 }];
        let work = StepWork { prefill: &chunks, decodes: 9, decode_context_tokens: 99, decode_window_tokens: 99 };
        assert_eq!(m.step_time(&work), SimDuration(5));
    }

    #[test]
    fn table_interpolates_prefill_differences_and_decode_bilinearly() {
        let t = LatencyTable::from_rows(
            vec![(1000.0, 0.010), (2000.0, 0.030)],
            vec![(1.0, 100.0, 0.001), (1.0, 200.0, 0.002), (3.0, 100.0, 0.003), (3.0, 200.0, 0.005)],
        )
        .unwrap();
        // T(500) = 0.005 (through the origin), T(1500) = 0.020, T(3000) = 0.050 (last slope).
        assert!((t.prefill_secs(500, 1500) - 0.015).abs() < 1e-12);
        assert!((t.prefill_secs(2000, 3000) - 0.020).abs() < 1e-12);
        // Batch 2 at 150 tokens/seq: row b=1 → 0.0015, row b=3 → 0.004, midpoint → 0.00275.
        assert!((t.decode_secs(2, 300) - 0.00275).abs() < 1e-12);
        assert!(
            LatencyTable::from_rows(vec![(1.0, 1.0)], vec![(1.0, 1.0, 1.0), (2.0, 2.0, 1.0)])
                .unwrap_err()
                .contains("full grid")
        );
    }
}
