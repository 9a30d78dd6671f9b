//! The analytic operator model: every operator at its speed of light
//! (FLOPs at the tensor peak, bytes at the HBM peak, an all-reduce's bytes
//! over the interconnect), at efficiencies fitted to measured tables, plus a
//! fixed launch latency.
//!
//! The efficiencies were fitted (least squares on log latency) jointly to
//! aiconfigurator's vLLM tables of four GPUs — h100_sxm, h200_sxm, b200_sxm
//! (vLLM 0.24.0) and a100_sxm (vLLM 0.14.0), BF16, every measured shape —
//! the same tables `profiles/aiconfigurator/` ships (see its README). Median
//! absolute error of the fit, per operator: GEMM 11.9 %, prefill attention
//! 21 %, decode attention 32 %, all-reduce 18 % (the tables themselves are
//! used wherever a GPU has them). Element-wise operators follow
//! aiconfigurator's rule for operators it has no table for:
//! `bytes / (0.8 · bandwidth) + 3 µs`.

use super::{AttnShape, Bound, Experts, Gemm, Peaks, Priced};
use crate::worker::model::expected_experts;

/// GEMM: `max(FLOPs / (peak · e_c · m / (m + m½)), bytes / (bandwidth · e_m)) + t₀`
/// — small-m GEMMs are far from the compute peak (tiles mostly empty).
pub const GEMM_COMPUTE_EFFICIENCY: f64 = 0.777;
/// Rows at which a GEMM reaches half its compute efficiency.
pub const GEMM_HALF_ROWS: f64 = 89.2;
/// Share of the HBM peak a memory-bound GEMM reaches.
pub const GEMM_MEMORY_EFFICIENCY: f64 = 0.771;
/// A GEMM's fixed latency, seconds.
pub const GEMM_LATENCY_S: f64 = 3.31e-6;
/// Prefill attention: share of the compute peak.
pub const CTX_COMPUTE_EFFICIENCY: f64 = 0.432;
/// Prefill attention: share of the HBM peak.
pub const CTX_MEMORY_EFFICIENCY: f64 = 0.219;
/// Prefill attention's fixed latency, seconds.
pub const CTX_LATENCY_S: f64 = 13.6e-6;
/// Decode attention: share of the compute peak.
pub const GEN_COMPUTE_EFFICIENCY: f64 = 0.500;
/// Decode attention: share of the HBM peak.
pub const GEN_MEMORY_EFFICIENCY: f64 = 0.509;
/// Decode attention's fixed latency, seconds.
pub const GEN_LATENCY_S: f64 = 13.4e-6;
/// An all-reduce's fixed latency, seconds.
pub const ALLREDUCE_LATENCY_S: f64 = 5.98e-6;
/// Share of the interconnect a ring all-reduce's `2(tp − 1)/tp` bytes per GPU move at.
pub const ALLREDUCE_LINK_EFFICIENCY: f64 = 0.617;
/// Share of the HBM peak an element-wise operator reaches (aiconfigurator's).
pub const ELEMENTWISE_MEMORY_EFFICIENCY: f64 = 0.8;
/// An element-wise operator's fixed latency, seconds (aiconfigurator's).
pub const ELEMENTWISE_LATENCY_S: f64 = 3e-6;

/// The analytic model of one GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Analytic {
    /// The GPU's peaks.
    pub peaks: Peaks,
}

/// `max(compute, memory) + latency`, bound by the larger.
fn roof(compute: f64, memory: f64, latency: f64) -> Priced {
    Priced {
        secs: compute.max(memory) + latency,
        bound: if compute >= memory { Bound::Compute } else { Bound::Memory },
    }
}

impl Analytic {
    /// A GEMM.
    pub fn gemm(&self, g: &Gemm) -> Priced {
        let (compute, memory) = self.peaks.gemm_sol(g);
        let e_c = GEMM_COMPUTE_EFFICIENCY * g.m / (g.m + GEMM_HALF_ROWS);
        roof(compute / e_c, memory / GEMM_MEMORY_EFFICIENCY, GEMM_LATENCY_S)
    }

    /// One MoE layer's routed experts for `m` tokens, priced as the fused
    /// grouped GEMM vLLM runs (`fused_moe`): the FLOPs of the experts each
    /// token uses, the weights of the `E·(1 − (1 − k/E)^m)` experts the
    /// tokens are expected to touch (this GPU's `1/ep` of them), at the GEMM
    /// efficiencies for the tokens each touched expert gets (one launch for
    /// the gate/up and one for the down GEMM). Balanced routing.
    pub fn experts(&self, x: &Experts, m: f64) -> Priced {
        let touched = expected_experts(x.experts, x.topk, m);
        let per_expert = m * x.topk as f64 / touched;
        let (flops, bytes) = self.experts_work(x, m);
        let compute = flops
            / (self.peaks.flops(x.precision) * GEMM_COMPUTE_EFFICIENCY * per_expert / (per_expert + GEMM_HALF_ROWS));
        let memory = bytes / (self.peaks.mem_bw * GEMM_MEMORY_EFFICIENCY);
        Priced {
            secs: compute.max(memory) + 2.0 * GEMM_LATENCY_S,
            bound: if compute >= memory { Bound::Compute } else { Bound::Memory },
        }
    }

    /// The routed experts' speed of light for `m` tokens: their FLOPs and bytes at the peaks, seconds.
    pub fn experts_sol(&self, x: &Experts, m: f64) -> (f64, f64) {
        let (flops, bytes) = self.experts_work(x, m);
        (flops / self.peaks.flops(x.precision), bytes / self.peaks.mem_bw)
    }

    /// The routed experts' FLOPs and bytes on this GPU for `m` tokens.
    fn experts_work(&self, x: &Experts, m: f64) -> (f64, f64) {
        let (p, ep, active) = (x.precision, x.ep as f64, x.topk as f64);
        let (d, f) = (x.hidden, x.inter / x.tp);
        let touched = expected_experts(x.experts, x.topk, m) / ep;
        let weights = 3.0 * (d * f) as f64;
        let flops = 2.0 * m * active * weights / ep;
        let bytes =
            touched * weights * p.weight_bytes() + p.activation_bytes() * m * active * (3 * f + 2 * d) as f64 / ep;
        (flops, bytes)
    }

    /// An element-wise operator moving `bytes`.
    pub fn elementwise(&self, bytes: f64) -> Priced {
        Priced {
            secs: bytes / (ELEMENTWISE_MEMORY_EFFICIENCY * self.peaks.mem_bw) + ELEMENTWISE_LATENCY_S,
            bound: Bound::Memory,
        }
    }

    /// A ring all-reduce of `elements` BF16 values over `tp` GPUs: each
    /// sends and receives `2(tp − 1)/tp` of the message.
    pub fn allreduce(&self, tp: u32, elements: f64) -> Priced {
        let tp = f64::from(tp);
        let bytes = 2.0 * (tp - 1.0) / tp * 2.0 * elements;
        Priced {
            secs: ALLREDUCE_LATENCY_S + bytes / (ALLREDUCE_LINK_EFFICIENCY * self.peaks.link_bw),
            bound: Bound::Comm,
        }
    }

    /// One sequence's prefill chunk in one layer: queries `prefix + 1 ..= s`
    /// against their causal keys. FLOPs: `4 · heads · head_dim` per
    /// query–key pair (QKᵀ and PV; MLA: `2·(q/k dim) + 2·(v dim)` per head);
    /// bytes: the queries and outputs, and the keys and values read.
    pub fn ctx_attention(&self, a: &AttnShape, s: f64, prefix: f64) -> Priced {
        let pairs = (s * s - prefix * prefix) / 2.0;
        let per_pair = match a.mla {
            Some((_, v)) => 2.0 * (a.head_dim + v) as f64 * a.heads as f64,
            None => 4.0 * (a.heads * a.head_dim) as f64,
        };
        let q = s - prefix;
        let bytes = 2.0 * 2.0 * q * (a.heads * a.head_dim) as f64 + a.kv_bytes_per_token() * s;
        roof(
            per_pair * pairs / (CTX_COMPUTE_EFFICIENCY * self.peaks.bf16_flops),
            bytes / (CTX_MEMORY_EFFICIENCY * self.peaks.mem_bw),
            CTX_LATENCY_S,
        )
    }

    /// Decode attention in one layer: `batch` queries, each against `s`
    /// keys. FLOPs `4 · heads · head_dim` per key (MLA, absorbed as vLLM
    /// decodes it: `2·(latent) + 2·(latent − rope)` per head); bytes: every
    /// key and value read once, and the queries and outputs.
    pub fn gen_attention(&self, a: &AttnShape, batch: f64, s: f64) -> Priced {
        let per_key = match a.mla {
            Some((latent, v)) => (2 * latent + 2 * v) as f64 * a.heads as f64,
            None => 4.0 * (a.heads * a.head_dim) as f64,
        };
        let bytes = batch * (a.kv_bytes_per_token() * s + 2.0 * 2.0 * (a.heads * a.head_dim) as f64);
        roof(
            batch * per_key * s / (GEN_COMPUTE_EFFICIENCY * self.peaks.bf16_flops),
            bytes / (GEN_MEMORY_EFFICIENCY * self.peaks.mem_bw),
            GEN_LATENCY_S,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::perf::profile::Precision;

    /// 1e12 FLOP/s, 1e9 B/s, 1e8 B/s of link.
    fn toy() -> Analytic {
        Analytic { peaks: Peaks { bf16_flops: 1e12, fp8_flops: Some(2e12), mem_bw: 1e9, link_bw: 1e8 } }
    }

    #[test]
    fn a_gemm_below_its_ridge_point_is_bound_by_its_bytes_and_above_by_its_flops() {
        let a = toy();
        // m = 1, n = k = 1000, BF16: 2e6 FLOPs, bytes 2·1e6 + 2·1·2000 = 2,004,000.
        // compute: 2e6 / (1e12 · 0.777 · 1/90.2) = 2.3217e-4 s; memory 2.004e-3 / 0.771 = 2.59922e-3 s.
        let g = Gemm { m: 1.0, n: 1000, k: 1000, precision: Precision::Bf16 };
        let p = a.gemm(&g);
        assert_eq!(p.bound, Bound::Memory);
        assert!((p.secs - (2.004e-3 / 0.771 + 3.31e-6)).abs() < 1e-15, "{p:?}");
        // m = 100,000: 2e11 FLOPs → 2e11 / (1e12 · 0.777 · 100000/100089.2) = 0.257628 s;
        // bytes 2e6 + 2·1e5·2000 = 4.02e8 → 0.402 / 0.771 = 0.521401 s: still memory-bound at 1e9 B/s.
        // At 1e11 B/s the bytes take 5.21e-3 s and the FLOPs bound it.
        let fast = Analytic { peaks: Peaks { mem_bw: 1e11, ..a.peaks } };
        let g = Gemm { m: 1e5, ..g };
        let p = fast.gemm(&g);
        assert_eq!(p.bound, Bound::Compute);
        let want = 2e11 / (1e12 * 0.777 * 1e5 / (1e5 + 89.2)) + 3.31e-6;
        assert!((p.secs - want).abs() < 1e-12, "{p:?} vs {want}");
        // FP8 runs at the FP8 peak and moves one byte per element.
        let g8 = Gemm { precision: Precision::Fp8, ..g };
        assert!((fast.gemm(&g8).secs - (1e11 / (1e12 * 0.777 * 1e5 / (1e5 + 89.2)) + 3.31e-6)).abs() < 1e-12);
    }

    #[test]
    fn a_ring_allreduce_moves_two_tp_minus_one_over_tp_of_its_bytes() {
        // 1e6 elements over 4 GPUs: 2·3/4·2e6 B = 3e6 B at 0.617·1e8 B/s = 0.0486224 s + 5.98 µs.
        let p = toy().allreduce(4, 1e6);
        assert_eq!(p.bound, Bound::Comm);
        assert!((p.secs - (5.98e-6 + 3e6 / (0.617 * 1e8))).abs() < 1e-15, "{p:?}");
    }

    #[test]
    fn decode_attention_reads_every_cached_key_and_value() {
        // 2 heads, 1 KV head, head dim 4, 2-byte KV: 16 B per token; batch 3 at 100 keys:
        // bytes 3·(16·100 + 4·8) = 4896 → 4896 / (0.509·1e9) s; FLOPs 3·32·100 = 9600 → negligible.
        let a = AttnShape { heads: 2, kv_heads: 1, head_dim: 4, kv_bytes: 2.0, mla: None };
        let p = toy().gen_attention(&a, 3.0, 100.0);
        assert_eq!(p.bound, Bound::Memory);
        assert!((p.secs - (4896.0 / (0.509 * 1e9) + 13.4e-6)).abs() < 1e-15, "{p:?}");
    }
}
