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
    /// FP8 weights and activations on FP8 tensor cores.
    Fp8,
    /// Weights stored in this many bytes each (int4, MXFP4, …), computed in BF16.
    WeightOnly(f64),
}

impl Precision {
    /// Bytes of one weight.
    pub fn weight_bytes(self) -> f64 {
        match self {
            Precision::Bf16 => 2.0,
            Precision::Fp8 => 1.0,
            Precision::WeightOnly(b) => b,
        }
    }

    /// Bytes of one activation element.
    pub fn activation_bytes(self) -> f64 {
        match self {
            Precision::Fp8 => 1.0,
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
            Precision::Fp8 => self.fp8_flops.unwrap_or(self.bf16_flops),
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
        parts.join("; ")
    }
}
