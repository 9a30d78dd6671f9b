//! Opal's analytic roofline, generalised to today's model families (see
//! [`Roofline`]): kept bit for bit for imported Opal configurations, and the
//! physical counts ([`Roofline::peak_seconds`]) every step model's
//! utilisation and power figures use.

use super::StepWork;
use crate::metrics::PeakSeconds;
use crate::worker::model::{ModelArch, ModelShape, attention_pairs};
use crate::worker::presets::GpuSpec;

/// How a step's prefill and decode parts combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixRule {
    /// The step takes the longer of the two parts (Opal).
    Max,
    /// The step takes both parts back to back.
    Sum,
}

impl MixRule {
    pub(super) fn combine(self, prefill: f64, decode: f64) -> f64 {
        match self {
            MixRule::Max => prefill.max(decode),
            MixRule::Sum => prefill + decode,
        }
    }
}

/// How the prefill chunks of one step combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillBatch {
    /// The GPU computes them all: their times add up.
    Sum,
    /// The step's longest prefill: the original Opal's `_calculate_batch_time`
    /// (`opal/vllm_worker.py`, animeshtrivedi/opal-sim 6c7c38a: "max_prefill_time
    /// = max(max_prefill_time, prefill_time)" over the batch's prefill requests).
    Max,
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
    /// How a step's prefill chunks combine.
    pub prefill_batch: PrefillBatch,
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
            prefill_batch: PrefillBatch::Sum,
        }
    }

    /// Seconds of a step's prefill chunks (`(computed before, computed after)`), combined per [`PrefillBatch`].
    pub fn prefill_batch_secs(&self, chunks: impl Iterator<Item = (u64, u64)>) -> f64 {
        let secs = chunks.map(|(p, n)| self.prefill_secs(p, n));
        match self.prefill_batch {
            PrefillBatch::Sum => secs.sum(),
            PrefillBatch::Max => secs.fold(0.0, f64::max),
        }
    }

    /// Seconds to prefill from `p` to `n` computed tokens.
    pub fn prefill_secs(&self, p: u64, n: u64) -> f64 {
        debug_assert!(n >= p, "prefill chunk ends before it starts");
        let m = &self.shape;
        let pairs = m.full_layers * attention_pairs(p, n, u64::MAX)
            + if m.windowed_layers > 0.0 { m.windowed_layers * attention_pairs(p, n, m.window) } else { 0.0 };
        self.a * m.d_attn * pairs / self.attn_flops_per_sec + self.linear_secs(n - p)
    }

    /// Seconds of the dense (linear) layers' FLOPs over `tokens` tokens: `b·Σd²·tokens / FLOP/s`.
    pub fn linear_secs(&self, tokens: u64) -> f64 {
        self.b * self.shape.linear_d2 * tokens as f64 / self.linear_flops_per_sec
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
        let mut tokens = work.decodes + work.drafts;
        let mut kv_bytes = 0.0;
        for c in work.prefill {
            attn_flops +=
                attention(attention_pairs(c.cached, c.end, u64::MAX), attention_pairs(c.cached, c.end, m.window));
            tokens += c.end - c.cached;
            kv_bytes +=
                m.kv_full_bytes_per_token * c.end as f64 + m.kv_window_bytes_per_token * c.end.min(m.window) as f64;
        }
        // A decode token attends to its sequence's context: 4·d per context
        // token per layer (and each draft verified beside it, as much again).
        let queries = if work.decodes > 0 { (work.decodes + work.drafts) as f64 / work.decodes as f64 } else { 1.0 };
        attn_flops += 4.0
            * m.d_attn
            * queries
            * (m.full_layers * work.decode_context_tokens as f64
                + m.windowed_layers * work.decode_window_tokens as f64);
        let written = work.decodes + work.drafts;
        kv_bytes += m.kv_full_bytes_per_token * (work.decode_context_tokens + written) as f64
            + m.kv_window_bytes_per_token * (work.decode_window_tokens + written) as f64;
        let linear_flops = 24.0 * m.linear_d2 * tokens as f64;
        let weights = if tokens > 0 { self.weights.read(tokens as f64) } else { 0.0 };
        PeakSeconds {
            compute: attn_flops / self.attn_flops_per_sec + linear_flops / self.linear_flops_per_sec,
            memory: (weights + kv_bytes) / self.mem_bytes_per_sec,
        }
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
            prefill_batch: PrefillBatch::Sum,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::SimDuration;
    use crate::worker::perf::{PrefillChunk, StepModel, StepWork};

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
        let w = StepWork {
            prefill: &chunk,
            decodes: 0,
            drafts: 0,
            decode_context_tokens: 0,
            decode_window_tokens: 0,
            samples: 0,
        };
        let p = r.peak_seconds(&w);
        assert!((p.compute - 20_000.0 / 1e6).abs() < 1e-12, "{p:?}");
        assert!((p.memory - 540.0 / 1e3).abs() < 1e-12, "{p:?}");
        // Two decodes over 30 context tokens: attention 4·10·30·2 = 2,400; linear 24·200·2 = 9,600;
        // HBM 500 + 10·(30 + 2).
        let w = StepWork {
            prefill: &[],
            decodes: 2,
            drafts: 0,
            decode_context_tokens: 30,
            decode_window_tokens: 30,
            samples: 0,
        };
        let p = r.peak_seconds(&w);
        assert!((p.compute - 12_000.0 / 1e6).abs() < 1e-12, "{p:?}");
        assert!((p.memory - 820.0 / 1e3).abs() < 1e-12, "{p:?}");
        let idle = StepWork {
            prefill: &[],
            decodes: 0,
            drafts: 0,
            decode_context_tokens: 0,
            decode_window_tokens: 0,
            samples: 0,
        };
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
        let work = StepWork {
            prefill: &chunks,
            decodes: 3,
            drafts: 0,
            decode_context_tokens: 30,
            decode_window_tokens: 30,
            samples: 0,
        };
        // prefill = 0.0568 + 0.0728 = 0.1296 s; decode = (500 + 10·30)/1e3 = 0.8 s.
        let max = StepModel::Roofline(r.clone(), MixRule::Max);
        assert_eq!(max.step_time(&work), SimDuration(800_000_000));
        let sum = StepModel::Roofline(r.clone(), MixRule::Sum);
        assert_eq!(sum.step_time(&work), SimDuration(929_600_000));
        // The original Opal's batch pricing: the longest prefill, 0.0728 s.
        let opal = Roofline { prefill_batch: PrefillBatch::Max, ..r };
        assert_eq!(StepModel::Roofline(opal, MixRule::Sum).step_time(&work), SimDuration(872_800_000));
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
}
