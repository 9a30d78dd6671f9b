//! Operator prices: what one operator of a forward pass costs on one GPU of
//! a tensor-parallel worker — from measured tables where they have it, and
//! from an analytic model (speed of light at efficiencies fitted to those
//! tables) where they do not.
//!
//! Sources, asked in order for every operator:
//!
//! 1. a **Vidur** profile (`mlp.csv`, `attention.csv` of
//!    `data/profiling/compute/<gpu>/<model>/` in microsoft/vidur): per-layer
//!    operator times of one model at one TP degree ([`vidur`]);
//! 2. **aiconfigurator** tables (`gemm_perf`, `context_attention_perf`,
//!    `generation_attention_perf`, `custom_allreduce_perf` Parquet files, as
//!    NVIDIA's aiconfigurator ships them for vLLM; [`aic`]) — the GPU
//!    presets with shipped tables use them by default;
//! 3. the **analytic** model ([`analytic`]), which prices everything.
//!
//! Each price says what bounds it ([`Bound`]): `calibrate` scales compute-,
//! memory- and communication-bound time separately.

pub mod aic;
pub mod aic_rows;
pub mod analytic;
mod grid;
pub mod shipped;
pub mod vidur;

use std::sync::Arc;

/// What bounds an operator's time (each class has its own calibration scale).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// Tensor-core FLOPs (a GEMM above its ridge point, prefill attention).
    Compute,
    /// HBM traffic (weights read by small GEMMs, decode attention, element-wise operators).
    Memory,
    /// The tensor-parallel interconnect (all-reduces).
    Comm,
}

/// The seconds an operator takes and what bounds it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Priced {
    /// Seconds.
    pub secs: f64,
    /// The bound.
    pub bound: Bound,
}

/// The number format a GEMM runs in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Precision {
    /// BF16 (or FP16) weights and activations.
    Bf16,
    /// FP8 weights and activations on FP8 tensor cores, one scale per tensor (or channel).
    Fp8,
    /// FP8 with a scale per 128 × 128 weight block and per 128 activations
    /// of a token (DeepSeek-V3's and Qwen3-FP8's checkpoints; vLLM runs them
    /// with its block-scaled FP8 kernels, which aiconfigurator measures apart).
    Fp8Block,
    /// Weights stored in this many bytes each (int4, MXFP4, …), computed in BF16.
    WeightOnly(f64),
}

impl Precision {
    /// Bytes of one weight.
    pub fn weight_bytes(self) -> f64 {
        match self {
            Precision::Bf16 => 2.0,
            Precision::Fp8 | Precision::Fp8Block => 1.0,
            Precision::WeightOnly(b) => b,
        }
    }

    /// Bytes of one activation element.
    pub fn activation_bytes(self) -> f64 {
        match self {
            Precision::Fp8 | Precision::Fp8Block => 1.0,
            _ => 2.0,
        }
    }
}

/// A GEMM of an `m × k` activation by a `k × n` weight.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemm {
    /// Rows: the step's tokens (or sequences, for the LM head).
    pub m: f64,
    /// Output features.
    pub n: u64,
    /// Input features.
    pub k: u64,
    /// Number format.
    pub precision: Precision,
}

impl Gemm {
    /// `2·m·n·k`.
    pub fn flops(&self) -> f64 {
        2.0 * self.m * self.n as f64 * self.k as f64
    }

    /// Bytes moved: the weight once, the input and the output.
    pub fn bytes(&self) -> f64 {
        let (n, k) = (self.n as f64, self.k as f64);
        self.precision.weight_bytes() * n * k + self.precision.activation_bytes() * self.m * (n + k)
    }
}

/// Which GEMM of a layer (for profiles keyed by operator name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The fused query/key/value projection (MLA: the query and latent projections).
    Qkv,
    /// The attention output projection.
    AttnOut,
    /// The fused gate and up projection of the MLP.
    GateUp,
    /// The MLP's down projection.
    Down,
    /// A mixture of experts' router.
    Router,
    /// The output projection to the vocabulary.
    LmHead,
}

/// A memory-bound element-wise operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elementwise {
    /// An RMSNorm with its residual add.
    Norm,
    /// The MLP's gated activation.
    Activation,
    /// Rotary embedding of queries and keys.
    Rope,
    /// Writing the new tokens' keys and values to the paged cache.
    KvWrite,
    /// The embedding lookup.
    Embedding,
    /// The RMSNorm after the last layer.
    FinalNorm,
}

/// The attention of one layer on one GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnShape {
    /// Query heads on this GPU.
    pub heads: u64,
    /// Key/value heads on this GPU (at least 1: vLLM replicates them when tp exceeds their count).
    pub kv_heads: u64,
    /// Dimension of a head (MLA: of the query/key head, with RoPE).
    pub head_dim: u64,
    /// Bytes of one KV-cache element.
    pub kv_bytes: f64,
    /// Multi-head latent attention: `(latent values cached per token, value head dim)`.
    pub mla: Option<(u64, u64)>,
}

impl AttnShape {
    /// KV-cache bytes one token holds in this layer on this GPU.
    pub fn kv_bytes_per_token(&self) -> f64 {
        match self.mla {
            Some((latent, _)) => latent as f64 * self.kv_bytes,
            None => 2.0 * (self.kv_heads * self.head_dim) as f64 * self.kv_bytes,
        }
    }
}

/// DeepSeek-V3's multi-head latent attention on one GPU, as the MLA
/// module tables measure it whole (projections, latent norms, RoPE, the
/// cache write, attention, output projection).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MlaModule {
    /// Query heads on this GPU.
    pub heads: u64,
    /// Bytes of one KV-cache element.
    pub kv_bytes: f64,
    /// The projections' precision.
    pub gemm: Precision,
}

/// How a mixture of experts' router spreads a step's tokens over its
/// experts: the distributions aiconfigurator's MoE tables measure
/// (`balanced`: evenly; `power_law_α`: expert loads drawn from a power law,
/// the smaller α the more skewed — aiconfigurator's default for
/// Qwen3/Mixtral-style models is 1.2, for DeepSeek's 1.01).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Routing {
    /// Every expert gets its share.
    #[default]
    Balanced,
    /// `power_law_1.01`.
    PowerLaw101,
    /// `power_law_1.2`.
    PowerLaw12,
}

impl Routing {
    const ALL: [Routing; 3] = [Routing::Balanced, Routing::PowerLaw101, Routing::PowerLaw12];

    /// By its name in the tables (`balanced`, `power_law_1.01`, `power_law_1.2`).
    pub fn parse(name: &str) -> Option<Routing> {
        Routing::ALL.into_iter().find(|r| r.name() == name)
    }

    /// Its name in the tables.
    pub fn name(self) -> &'static str {
        aic_rows::ROUTINGS[self.code() as usize]
    }

    /// Its code in [`aic_rows::MoeKey`].
    fn code(self) -> u8 {
        self as u8
    }
}

/// One MoE layer's routed experts on one GPU of a worker.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Experts {
    /// Routed experts of the model.
    pub experts: u64,
    /// Experts each token uses (top-k).
    pub topk: u64,
    /// Model width.
    pub hidden: u64,
    /// One expert's intermediate size (the whole expert's, before any split).
    pub inter: u64,
    /// Each expert's width split over this many GPUs (vLLM without expert parallelism: the worker's TP).
    pub tp: u64,
    /// The experts split over this many GPUs (expert parallelism).
    pub ep: u64,
    /// Their number format.
    pub precision: Precision,
}

/// A GPU's peaks, as the speed of light of every operator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Peaks {
    /// Dense BF16 tensor FLOP/s.
    pub bf16_flops: f64,
    /// Dense FP8 tensor FLOP/s (`None`: no FP8 tensor cores; FP8 GEMMs run at the BF16 rate).
    pub fp8_flops: Option<f64>,
    /// HBM bytes/s.
    pub mem_bw: f64,
    /// Tensor-parallel interconnect bytes/s per GPU and direction.
    pub link_bw: f64,
}

impl Peaks {
    /// FLOP/s for a GEMM in `p`.
    pub fn flops(&self, p: Precision) -> f64 {
        match p {
            Precision::Fp8 | Precision::Fp8Block => self.fp8_flops.unwrap_or(self.bf16_flops),
            _ => self.bf16_flops,
        }
    }

    /// A GEMM's speed of light: the longer of its FLOPs and its bytes at the peaks.
    pub fn gemm_sol(&self, g: &Gemm) -> (f64, f64) {
        (g.flops() / self.flops(g.precision), g.bytes() / self.mem_bw)
    }
}

/// Where operator prices come from, in the order they are asked.
#[derive(Clone, Debug)]
pub struct Profile {
    /// A Vidur profile of this model.
    pub vidur: Option<Arc<vidur::VidurProfile>>,
    /// aiconfigurator tables of this GPU.
    pub tables: Option<Arc<aic::AicTables>>,
    /// The analytic model (everything the others lack).
    pub analytic: analytic::Analytic,
    /// How routed experts share the tokens (picks the MoE table's rows).
    pub routing: Routing,
}

impl Profile {
    /// Prices a GEMM.
    pub fn gemm(&self, role: Role, g: &Gemm) -> Priced {
        if let Some(p) = self.vidur.as_ref().and_then(|v| v.gemm(role, g.m)) {
            return self.classify(g, p);
        }
        if let Some(p) = self.tables.as_ref().and_then(|t| t.gemm(g)) {
            return self.classify(g, p);
        }
        self.analytic.gemm(g)
    }

    /// A measured GEMM time, bound by whichever of compute and memory its speed of light says.
    fn classify(&self, g: &Gemm, secs: f64) -> Priced {
        let (compute, memory) = self.analytic.peaks.gemm_sol(g);
        Priced { secs, bound: if compute >= memory { Bound::Compute } else { Bound::Memory } }
    }

    /// Prices an element-wise operator over `m` tokens moving `bytes` bytes.
    pub fn elementwise(&self, op: Elementwise, m: f64, bytes: f64) -> Priced {
        if let Some(secs) = self.vidur.as_ref().and_then(|v| v.elementwise(op, m)) {
            return Priced { secs, bound: Bound::Memory };
        }
        self.analytic.elementwise(bytes)
    }

    /// Prices one all-reduce of `elements` BF16 values over `tp` GPUs.
    pub fn allreduce(&self, tp: u32, elements: f64) -> Priced {
        if let Some(secs) = self.vidur.as_ref().and_then(|v| v.allreduce(tp, elements)) {
            return Priced { secs, bound: Bound::Comm };
        }
        if let Some(secs) = self.tables.as_ref().and_then(|t| t.allreduce(tp, elements)) {
            return Priced { secs, bound: Bound::Comm };
        }
        self.analytic.allreduce(tp, elements)
    }

    /// Prices one layer's attention for one sequence's prefill chunk: the
    /// query tokens `prefix + 1 ..= s` against keys `1 ..= s` (causal).
    pub fn ctx_attention(&self, a: &AttnShape, s: f64, prefix: f64) -> Priced {
        let secs = self
            .vidur
            .as_ref()
            .and_then(|v| v.ctx_attention(s, prefix))
            .or_else(|| self.tables.as_ref().and_then(|t| t.ctx_attention(a, s, prefix)));
        match secs {
            Some(secs) => Priced { secs, bound: Bound::Compute },
            None => self.analytic.ctx_attention(a, s, prefix),
        }
    }

    /// Prices one layer's decode attention for `batch` sequences whose
    /// queries each attend to `s` keys (the context and the new token).
    pub fn gen_attention(&self, a: &AttnShape, batch: f64, s: f64) -> Priced {
        let secs = self
            .vidur
            .as_ref()
            .and_then(|v| v.gen_attention(batch, s))
            .or_else(|| self.tables.as_ref().and_then(|t| t.gen_attention(a, batch, s)));
        match secs {
            Some(secs) => Priced { secs, bound: Bound::Memory },
            None => self.analytic.gen_attention(a, batch, s),
        }
    }

    /// Whether the measured tables price the MLA module `m` whole.
    pub fn has_mla_module(&self, m: &MlaModule) -> bool {
        self.tables.as_ref().is_some_and(|t| t.has_mla_module(m))
    }

    /// One layer's MLA module for the prefill of one sequence of `s`
    /// tokens from an empty cache (`None`: not measured).
    pub fn mla_ctx(&self, m: &MlaModule, s: f64) -> Option<Priced> {
        let secs = self.tables.as_ref()?.mla_ctx(m, s)?;
        Some(Priced { secs, bound: Bound::Compute })
    }

    /// One layer's MLA module for a decode of `batch` sequences each
    /// attending to `s` keys (`None`: not measured).
    pub fn mla_gen(&self, m: &MlaModule, batch: f64, s: f64) -> Option<Priced> {
        let secs = self.tables.as_ref()?.mla_gen(m, batch, s)?;
        Some(Priced { secs, bound: Bound::Memory })
    }

    /// One MoE layer's routed experts for `m` tokens from the measured
    /// table (`None`: no table measured this configuration): the fused MoE
    /// kernel, its activation included; bound by whichever of its FLOPs and
    /// the weights of the experts the tokens touch its speed of light says.
    pub fn measured_experts(&self, x: &Experts, m: f64) -> Option<Priced> {
        let t = self.tables.as_ref()?;
        let key = self.moe_key(t, x)?;
        let secs = t.moe(&key, m)?;
        let (compute, memory) = self.analytic.experts_sol(x, m);
        Some(Priced { secs, bound: if compute >= memory { Bound::Compute } else { Bound::Memory } })
    }

    /// The MoE table's configuration for `x` under this routing, if measured
    /// (FP8 experts: rows of their own scaling, else of the other).
    fn moe_key(&self, t: &aic::AicTables, x: &Experts) -> Option<aic::MoeKey> {
        let dtypes: &[u8] = match x.precision {
            Precision::Bf16 => &[1],
            Precision::Fp8 => &[2, 3],
            Precision::Fp8Block => &[3, 2],
            Precision::WeightOnly(_) => &[],
        };
        let u = |v: u64| u32::try_from(v).ok();
        dtypes.iter().find_map(|&dtype| {
            let key = aic::MoeKey {
                dtype,
                routing: self.routing.code(),
                topk: u(x.topk)?,
                experts: u(x.experts)?,
                hidden: u(x.hidden)?,
                inter: u(x.inter)?,
                tp: u(x.tp)?,
                ep: u(x.ep)?,
            };
            t.has_moe(&key).then_some(key)
        })
    }

    /// Where routed experts `x` are priced from, for messages.
    pub fn describe_experts(&self, x: &Experts) -> String {
        match self.tables.as_ref().and_then(|t| self.moe_key(t, x).map(|_| t)) {
            Some(t) => format!("routed experts: {} moe_perf rows ({} routing)", t.describe(), self.routing.name()),
            None => format!(
                "routed experts: analytic (balanced routing) — no measured MoE rows for {} experts top-{}, hidden {}, intermediate {}, MoE TP {} × EP {}, {:?}, {} routing",
                x.experts,
                x.topk,
                x.hidden,
                x.inter,
                x.tp,
                x.ep,
                x.precision,
                self.routing.name()
            ),
        }
    }

    /// The sources, for messages (`opal-sweep model`, the effective configuration).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(v) = &self.vidur {
            parts.push(v.describe());
        }
        if let Some(t) = &self.tables {
            parts.push(t.describe());
        }
        parts.push("analytic (efficiencies fitted to aiconfigurator's tables) for what those lack".to_string());
        if self.routing != Routing::default() {
            parts.push(format!("{} expert routing", self.routing.name()));
        }
        parts.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::presets::GpuSpec;

    fn profile(gpu: &str, routing: Routing) -> Profile {
        let peaks = GpuSpec::preset(gpu).unwrap().peaks();
        Profile { vidur: None, tables: shipped::tables(gpu, peaks), analytic: analytic::Analytic { peaks }, routing }
    }

    /// Qwen3-30B-A3B's routed experts at TP 1.
    const QWEN3: Experts =
        Experts { experts: 128, topk: 8, hidden: 2048, inter: 768, tp: 1, ep: 1, precision: Precision::Bf16 };

    #[test]
    fn routed_experts_come_from_the_measured_table_where_it_has_them_else_from_the_analytic_model_with_a_note() {
        // H100 measured Qwen3's experts under every routing: its rows, whatever they are.
        let h100 = profile("H100", Routing::PowerLaw12);
        let p = h100.measured_experts(&QWEN3, 2048.0).unwrap();
        assert!((p.secs - 0.6968704223632812e-3).abs() < 1e-15, "{}", p.secs);
        // Bound as its speed of light says: 2,048 × 8 / 128 = 128 tokens an expert
        // (155 GFLOP, 156 µs at 989 TFLOP/s) against all 128 experts' 1.2 GB of
        // BF16 weights (361 µs at 3.35 TB/s): memory.
        assert_eq!(p.bound, Bound::Memory);
        assert!(h100.describe_experts(&QWEN3).contains("moe_perf rows (power_law_1.2 routing)"));
        let balanced = profile("H100", Routing::Balanced).measured_experts(&QWEN3, 16.0).unwrap();
        assert!((balanced.secs - 0.420384e-3).abs() < 1e-9);
        // A100's table measured no balanced routing: the analytic model prices it, and says so.
        let a100 = profile("A100-80G", Routing::Balanced);
        assert_eq!(a100.measured_experts(&QWEN3, 16.0), None);
        let note = a100.describe_experts(&QWEN3);
        assert!(note.starts_with("routed experts: analytic") && note.contains("balanced routing"), "{note}");
        // An expert split the table never measured (TP 3), or weights it has no rows for (int4): analytic.
        assert_eq!(h100.measured_experts(&Experts { tp: 3, ..QWEN3 }, 16.0), None);
        assert_eq!(h100.measured_experts(&Experts { precision: Precision::WeightOnly(0.5), ..QWEN3 }, 16.0), None);
    }

    #[test]
    fn routings_are_named_as_the_tables_name_them() {
        for name in ["balanced", "power_law_1.01", "power_law_1.2"] {
            assert_eq!(Routing::parse(name).unwrap().name(), name);
        }
        assert_eq!(Routing::parse("uniform"), None);
        assert_eq!(Routing::default(), Routing::Balanced);
    }
}
