//! The `operators` step model: a step priced like the forward pass vLLM
//! runs, operator by operator, on one GPU of a tensor-parallel worker.
//!
//! Per layer (vLLM's model files, e.g. `vllm/model_executor/models/llama.py`;
//! the shapes as aiconfigurator's `sdk/models/llama.py` prices them):
//! the fused QKV projection (`n = (H/tp + 2·⌈K/tp⌉)·h`, `k = d`), attention,
//! the output projection (`n = d`, `k = H·h/tp`), the MLP's fused gate/up
//! (`n = 2F/tp`) and down (`k = F/tp`) projections — or, for a mixture of
//! experts, its router, shared experts and the routed experts its tokens
//! touch — two RMSNorms, the activation, RoPE and the KV-cache write, and
//! with `tp > 1` two all-reduces of the step's `tokens × d` activations.
//! Once per step: the embedding lookup (and its all-reduce) and the LM head
//! on the sequences that sample a token. DeepSeek-V3's multi-head latent
//! attention, where aiconfigurator measured it whole (its MLA module tables:
//! H100, H200, B200), is that module per layer — its projections, RoPE and
//! cache write inside it — as aiconfigurator prices it (`sdk/models/deepseek.py`:
//! the module when the q, kv and o projections share a dtype, the granular
//! operators as its fallback).
//!
//! The linear operators run **once on the step's total tokens** (prefill
//! chunk tokens plus one per decoding sequence): their GEMMs have `m` = that
//! count. Attention is per sequence: each prefill chunk by its (chunk,
//! context), the decoding sequences by their batch and mean context. A
//! mixed batch is priced by construction.
//!
//! Operator prices come from a [`Profile`]; every price says whether it is
//! compute-, memory- or communication-bound. A step takes the longer of
//! its GPU work and its CPU work ([`StepCost::secs`]):
//!
//! - GPU: `compute_scale·compute + memory_scale·memory + comm_scale·comm`;
//! - CPU: `step_overhead + seq_overhead·sequences + prefill_overhead` (the
//!   last only for a step with prefill work) — the engine's scheduling,
//!   input preparation, sampling and kernel launches, which overlap the
//!   GPU's kernels: a step whose kernels are shorter than launching them
//!   is launch-bound (vLLM runs decode steps as CUDA graphs and prefill
//!   eagerly, kernel by kernel, hence the prefill term). The measured
//!   kernel tables hold none of it: the overheads are 0 by default and
//!   `opal-sweep calibrate` fits them to a stack's measurements. A stack
//!   whose decode step hardly changes with TP (SplitwiseSim's 2023 vLLM:
//!   43–45 ms on A100 from TP 4 to 8) is launch-bound there.
//!
//! Each part is linear in its constants, which is what lets `calibrate`
//! fit them.
//!
//! Precomputed per (model, GPU, tp, profile): the per-step operators as a
//! piecewise-linear curve over the step's tokens (knots at every size the
//! tables measure and four per octave beyond; linear beyond the last), the
//! LM head over the sequences that sample, prefill attention over the
//! sequence length and decode attention over (batch, keys) — so a step
//! costs a few binary searches, whatever the model.

use super::StepWork;
use super::profile::{AttnShape, Bound, Elementwise, Experts, Gemm, MlaModule, Precision, Priced, Profile, Role};
use crate::worker::model::{Attention, ModelArch, Sharding, attention_pairs};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The constants a stack's measurements fit (`worker.inference_params`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OperatorConstants {
    /// Multiplies compute-bound time (1: as the profile prices it).
    pub compute_scale: f64,
    /// Multiplies memory-bound time.
    pub memory_scale: f64,
    /// Multiplies all-reduce time.
    pub comm_scale: f64,
    /// CPU seconds of every step (overlapping its GPU work).
    pub step_overhead_s: f64,
    /// CPU seconds per sequence in a step (each prefill chunk and each decoding sequence).
    pub seq_overhead_s: f64,
    /// CPU seconds added to a step with prefill work (run eagerly, without CUDA graphs).
    pub prefill_overhead_s: f64,
}

impl OperatorConstants {
    /// The profile's prices, no overheads.
    pub const DEFAULT: OperatorConstants = OperatorConstants {
        compute_scale: 1.0,
        memory_scale: 1.0,
        comm_scale: 1.0,
        step_overhead_s: 0.0,
        seq_overhead_s: 0.0,
        prefill_overhead_s: 0.0,
    };

    /// The constants as a vector, in [`StepCost::features`] order.
    pub fn as_array(&self) -> [f64; 6] {
        [
            self.compute_scale,
            self.memory_scale,
            self.comm_scale,
            self.step_overhead_s,
            self.seq_overhead_s,
            self.prefill_overhead_s,
        ]
    }

    /// The constants from a vector in [`StepCost::features`] order.
    pub fn from_array(a: [f64; 6]) -> OperatorConstants {
        OperatorConstants {
            compute_scale: a[0],
            memory_scale: a[1],
            comm_scale: a[2],
            step_overhead_s: a[3],
            seq_overhead_s: a[4],
            prefill_overhead_s: a[5],
        }
    }
}

/// A step's seconds by what bounds them, before the constants scale them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepCost {
    /// Compute-bound seconds.
    pub compute: f64,
    /// Memory-bound seconds.
    pub memory: f64,
    /// All-reduce seconds.
    pub comm: f64,
    /// Steps (1 for one step; sums add up).
    pub steps: f64,
    /// Sequences in the step.
    pub seqs: f64,
    /// Steps with prefill work (1 or 0 for one step).
    pub prefill_steps: f64,
}

/// Constants (in [`OperatorConstants::as_array`] order) that price GPU work;
/// the others price CPU work.
pub const GPU_CONSTANTS: usize = 3;

impl StepCost {
    /// What the constants multiply, in [`OperatorConstants::as_array`] order.
    pub fn features(&self) -> [f64; 6] {
        [self.compute, self.memory, self.comm, self.steps, self.seqs, self.prefill_steps]
    }

    /// The step's GPU and CPU seconds under `c`.
    pub fn parts(&self, c: &OperatorConstants) -> (f64, f64) {
        let (f, k) = (self.features(), c.as_array());
        let dot = |r: std::ops::Range<usize>| r.map(|i| f[i] * k[i]).sum::<f64>();
        (dot(0..GPU_CONSTANTS), dot(GPU_CONSTANTS..6))
    }

    /// The step's seconds under `c`: the longer of its GPU and CPU work.
    pub fn secs(&self, c: &OperatorConstants) -> f64 {
        let (gpu, cpu) = self.parts(c);
        gpu.max(cpu)
    }

    fn add(&mut self, p: Priced, times: f64) {
        match p.bound {
            Bound::Compute => self.compute += p.secs * times,
            Bound::Memory => self.memory += p.secs * times,
            Bound::Comm => self.comm += p.secs * times,
        }
    }
}

impl std::ops::AddAssign for StepCost {
    fn add_assign(&mut self, o: StepCost) {
        self.compute += o.compute;
        self.memory += o.memory;
        self.comm += o.comm;
        self.steps += o.steps;
        self.seqs += o.seqs;
        self.prefill_steps += o.prefill_steps;
    }
}

/// Knots on one axis: every integer up to `2^p`, then `2^p` per octave
/// (`2^e·(1 + t/2^p)`), up to `2^max_log2` — so a point is located in O(1)
/// from its binary exponent and leading bits, with no search. With `p = 3`
/// the knots include every size aiconfigurator's GEMM tables measure up to
/// 4,096 rows (its curves are linear in m between them) and every power of two.
#[derive(Clone, Debug, PartialEq)]
struct Axis {
    p: u32,
    knots: Vec<f64>,
}

impl Axis {
    fn new(p: u32, max_log2: u32) -> Axis {
        let mut knots: Vec<f64> = (1..=1u64 << p).map(|x| x as f64).collect();
        for e in p..max_log2 {
            for t in 1..=1u64 << p {
                knots.push(((1u64 << e) + t * (1u64 << (e - p))) as f64);
            }
        }
        Axis { p, knots }
    }

    /// The knots.
    fn knots(&self) -> &[f64] {
        &self.knots
    }

    /// The segment holding `x` (the first or last beyond the knots) and the weight of its upper end.
    fn locate(&self, x: f64) -> (usize, f64) {
        let last = self.knots.len() - 2;
        let i = if x < 1.0 {
            0
        } else {
            let xi = x as u64;
            let e = 63 - u64::from(xi.leading_zeros()) as u32;
            if e < self.p {
                (xi - 1) as usize
            } else {
                let t = (xi >> (e - self.p)) & ((1 << self.p) - 1);
                (((e - self.p + 1) << self.p) + t as u32) as usize - 1
            }
        }
        .min(last);
        let (x0, x1) = (self.knots[i], self.knots[i + 1]);
        (i, (x - x0) / (x1 - x0))
    }
}

/// A piecewise-linear function of one variable with values by bound.
#[derive(Clone, Debug, PartialEq)]
struct Curve {
    axis: Axis,
    values: Vec<[f64; 3]>,
}

impl Curve {
    fn build(axis: &Axis, f: impl Fn(f64) -> StepCost) -> Curve {
        let values = axis
            .knots()
            .iter()
            .map(|&x| {
                let c = f(x);
                [c.compute, c.memory, c.comm]
            })
            .collect();
        Curve { axis: axis.clone(), values }
    }

    /// The value at `x` (0 at 0; linear between knots and beyond the last two).
    fn at(&self, x: f64) -> [f64; 3] {
        if x <= 0.0 {
            return [0.0; 3];
        }
        let (i, w) = self.axis.locate(x);
        let (a, b) = (self.values[i], self.values[i + 1]);
        std::array::from_fn(|j| (a[j] + (b[j] - a[j]) * w).max(0.0))
    }
}

/// A price of (batch, keys), computed when a grid point is first needed.
type Price2 = Arc<dyn Fn(f64, f64) -> f64 + Send + Sync>;

/// A function of (batch, keys), bilinear between grid points and beyond.
/// Each grid point is priced when a lookup first needs it (a run uses few
/// of them; pricing all 748 took 30 M instructions, two fifths of a
/// one-request run) and kept: the same point always has the same price.
#[derive(Clone)]
struct Grid2 {
    batches: Axis,
    keys: Axis,
    /// Row-major: `secs[i * keys + j]`, as f64 bits ([`UNPRICED`] until priced).
    secs: Arc<[AtomicU64]>,
    price: Price2,
}

/// The bits of a grid point not priced yet (a NaN no price is).
const UNPRICED: u64 = u64::MAX;

impl std::fmt::Debug for Grid2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grid2").field("batches", &self.batches).field("keys", &self.keys).finish_non_exhaustive()
    }
}

/// Two grids are equal when they price every point alike.
impl PartialEq for Grid2 {
    fn eq(&self, o: &Grid2) -> bool {
        self.batches == o.batches
            && self.keys == o.keys
            && (0..self.secs.len()).all(|c| self.point(c).to_bits() == o.point(c).to_bits())
    }
}

impl Grid2 {
    fn new(batches: Axis, keys: Axis, price: Price2) -> Grid2 {
        let secs = (0..batches.knots().len() * keys.knots().len()).map(|_| AtomicU64::new(UNPRICED)).collect();
        Grid2 { batches, keys, secs, price }
    }

    /// Grid point number `c` (row-major). A point priced twice at once (two
    /// threads) gets the same price twice: a plain load is enough.
    #[inline]
    fn point(&self, c: usize) -> f64 {
        match self.secs[c].load(Ordering::Relaxed) {
            UNPRICED => self.price_point(c),
            bits => f64::from_bits(bits),
        }
    }

    #[cold]
    #[inline(never)]
    fn price_point(&self, c: usize) -> f64 {
        let n = self.keys.knots().len();
        let v = (self.price)(self.batches.knots()[c / n], self.keys.knots()[c % n]);
        self.secs[c].store(v.to_bits(), Ordering::Relaxed);
        v
    }

    fn at(&self, batch: f64, keys: f64) -> f64 {
        self.at_row(self.batches.locate(batch), keys)
    }

    /// [`Self::at`] with the batch already located (`(i0, wi)` from the batch axis).
    fn at_row(&self, (i0, wi): (usize, f64), keys: f64) -> f64 {
        let (j0, wj) = self.keys.locate(keys);
        let n = self.keys.knots().len();
        let row = |i: usize| {
            let (a, b) = (self.point(i * n + j0), self.point(i * n + j0 + 1));
            a + (b - a) * wj
        };
        let (r0, r1) = (row(i0), row(i0 + 1));
        (r0 + (r1 - r0) * wi).max(0.0)
    }
}

/// One layer's GEMMs and element-wise traffic per token.
#[derive(Clone, Debug, PartialEq)]
struct LayerOps {
    /// Layers like this one.
    count: f64,
    gemms: Vec<(Role, u64, u64, Precision)>,
    /// Routed experts, and their activation's bytes per token (priced
    /// apart where the analytic model prices them; a measured fused MoE
    /// kernel includes it).
    experts: Option<(Experts, f64)>,
    /// Element-wise operators: bytes per token.
    elementwise: Vec<(Elementwise, f64)>,
    /// A MoE layer with a shared expert (its gate/up and down projections and
    /// activation are among `gemms` and `elementwise`).
    shared_expert: bool,
}

/// The most tokens of a step whose MoE layers run their shared expert
/// beside the routed ones (vLLM's `VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD`).
const SHARED_EXPERTS_STREAM_TOKENS: f64 = 256.0;

/// What is precomputed per (model, GPU, tp, profile).
#[derive(Clone, Debug, PartialEq)]
pub struct OperatorCurves {
    /// Everything but attention and the LM head, for a step of `m` tokens
    /// (with data-parallel attention, everything but the routed experts too).
    dense: Curve,
    /// With data-parallel attention, the routed experts (and their
    /// activation), for a step of `m` tokens over all the engines.
    experts: Option<Curve>,
    /// The LM head, for `s` sampling sequences.
    head: Curve,
    /// `dense` and `head` together at the same count: a decode-only step of `b` sequences.
    decode_fixed: Curve,
    /// One full-attention layer's prefill of a sequence of `s` tokens from an empty cache.
    ctx: Curve,
    /// One layer's decode attention over (batch, keys) — full attention.
    decode: Grid2,
    /// Full-attention and sliding-window layers, and the window.
    full_layers: f64,
    windowed_layers: f64,
    window: u64,
    /// The profile's sources, for messages.
    pub source: String,
    /// What a user should know about the prices: routed experts the
    /// measured tables lack, priced analytically.
    pub notes: Vec<String>,
}

/// The `operators` step model: the precomputed curves and the constants.
#[derive(Clone, Debug, PartialEq)]
pub struct Operators {
    /// The precomputed prices (shared by every worker and run of one configuration).
    pub curves: Arc<OperatorCurves>,
    /// The fitted constants.
    pub constants: OperatorConstants,
}

/// Knots of the per-step curves: tokens (or sampling sequences, or a
/// prompt's length) up to 2²¹, eight per octave; linear beyond.
fn token_axis() -> Axis {
    Axis::new(3, 21)
}

/// The precision of a GEMM whose weights take `bytes` bytes each.
fn precision(bytes: f64, fp8_cores: bool) -> Precision {
    if bytes >= 2.0 {
        Precision::Bf16
    } else if (1.0..=1.05).contains(&bytes) && fp8_cores {
        Precision::Fp8
    } else {
        Precision::WeightOnly(bytes)
    }
}

/// The precision of `model`'s weights: quantised (`yes`) or not.
fn weights(model: &ModelArch, fp8_cores: bool, yes: bool) -> Precision {
    match model.quantization.as_ref() {
        Some(q) if yes => match precision(q.bytes_per_param, fp8_cores) {
            Precision::Fp8 if q.block_scaled => Precision::Fp8Block,
            p => p,
        },
        _ => precision(model.dtype_bytes as f64, fp8_cores),
    }
}

/// `model`'s attention as the MLA module tables measure it, on one GPU of
/// `tp`: multi-head latent attention of DeepSeek-V3's shape (hidden 7,168,
/// query latent 1,536, KV latent 512, query/key heads 128 + 64 RoPE, value
/// heads 128 — the module aiconfigurator's collector builds; DeepSeek-V3,
/// R1 and Kimi K2 have it), else `None`.
fn mla_module(model: &ModelArch, tp: u32, fp8_cores: bool) -> Option<MlaModule> {
    let Attention::Mla {
        heads,
        q_lora_rank: Some(1536),
        kv_lora_rank: 512,
        qk_nope_head_dim: 128,
        qk_rope_head_dim: 64,
        v_head_dim: 128,
    } = model.attention
    else {
        return None;
    };
    (model.hidden_size == 7168).then(|| MlaModule {
        heads: heads.div_ceil(u64::from(tp)),
        kv_bytes: model.kv_dtype_bytes as f64,
        gemm: weights(model, fp8_cores, model.quantization.as_ref().is_some_and(|q| q.attention)),
    })
}

/// The layers of `model` on one of its engine's GPUs (routed experts per
/// [`Sharding::expert_split`]); with `module`, its attention — projections,
/// RoPE and the cache write included — is priced apart as one module, so
/// none of it is among the layers' operators.
fn layers(model: &ModelArch, sharding: Sharding, fp8_cores: bool, module: bool) -> (Vec<LayerOps>, AttnShape) {
    let (tp, (expert_tp, ep)) = (u64::from(sharding.tp), sharding.expert_split());
    let d = model.hidden_size;
    let q = model.quantization.as_ref();
    let quantized = |yes: bool| weights(model, fp8_cores, yes);
    let attn_p = quantized(q.is_some_and(|q| q.attention));
    let (mut gemms, shape, rope_bytes) = match model.attention {
        Attention::Gqa { heads, kv_heads, head_dim, .. } => {
            let (h, k) = (heads.div_ceil(tp), kv_heads.div_ceil(tp));
            let g = vec![(Role::Qkv, (h + 2 * k) * head_dim, d, attn_p), (Role::AttnOut, d, h * head_dim, attn_p)];
            let shape = AttnShape { heads: h, kv_heads: k, head_dim, kv_bytes: model.kv_dtype_bytes as f64, mla: None };
            (g, shape, 2.0 * 2.0 * ((h + k) * head_dim) as f64)
        }
        Attention::Mla { heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim } => {
            let h = heads.div_ceil(tp);
            let qk = qk_nope_head_dim + qk_rope_head_dim;
            let mut g = match q_lora_rank {
                Some(r) => vec![(Role::Qkv, r, d, attn_p), (Role::Qkv, h * qk, r, attn_p)],
                None => vec![(Role::Qkv, h * qk, d, attn_p)],
            };
            g.push((Role::Qkv, kv_lora_rank + qk_rope_head_dim, d, attn_p));
            g.push((Role::Qkv, h * (qk_nope_head_dim + v_head_dim), kv_lora_rank, attn_p));
            g.push((Role::AttnOut, d, h * v_head_dim, attn_p));
            let shape = AttnShape {
                heads: h,
                kv_heads: 1,
                head_dim: qk,
                kv_bytes: model.kv_dtype_bytes as f64,
                mla: Some((kv_lora_rank + qk_rope_head_dim, v_head_dim)),
            };
            (g, shape, 2.0 * 2.0 * ((h + 1) * qk_rope_head_dim) as f64)
        }
    };
    if module {
        gemms.clear();
    }
    let norms = model.norms_per_layer as f64;
    let base = |f: u64| {
        let mut ops = vec![(Elementwise::Norm, norms * 8.0 * d as f64), (Elementwise::Activation, 6.0 * f as f64)];
        if !module {
            ops.extend([(Elementwise::Rope, rope_bytes), (Elementwise::KvWrite, 2.0 * shape.kv_bytes_per_token())]);
        }
        ops
    };
    let mlp_p = quantized(q.is_some_and(|q| q.dense_mlp) || (q.is_some() && model.moe.is_none()));
    let mut out = Vec::new();
    let dense_layers = model.num_layers - model.moe.as_ref().map_or(0, |m| m.layers);
    if dense_layers > 0 {
        let f = model.intermediate_size / tp;
        let mut g = gemms.clone();
        g.push((Role::GateUp, 2 * f, d, mlp_p));
        g.push((Role::Down, d, f, mlp_p));
        out.push(LayerOps {
            count: dense_layers as f64,
            gemms: g,
            experts: None,
            elementwise: base(f),
            shared_expert: false,
        });
    }
    if let Some(m) = &model.moe {
        gemms.push((Role::Router, m.experts, d, Precision::Bf16));
        if m.shared_intermediate > 0 {
            let f = m.shared_intermediate / tp;
            gemms.push((Role::GateUp, 2 * f, d, mlp_p));
            gemms.push((Role::Down, d, f, mlp_p));
        }
        // Expert parallelism (vLLM's `--enable-expert-parallel`): each GPU
        // holds whole experts, 1/ep of them, and runs the tokens routed there.
        let x = Experts {
            experts: m.experts,
            topk: m.active,
            hidden: d,
            inter: m.expert_intermediate,
            tp: expert_tp,
            ep,
            precision: quantized(q.is_some()),
        };
        let activation = 6.0 * (m.active * (m.expert_intermediate / expert_tp)) as f64 / ep as f64;
        out.push(LayerOps {
            count: m.layers as f64,
            gemms,
            experts: Some((x, activation)),
            elementwise: base(m.shared_intermediate / tp),
            shared_expert: m.shared_intermediate > 0,
        });
    }
    (out, shape)
}

/// Memoised curves: building them costs milliseconds (thousands of table
/// lookups), and a sweep resolves the same configuration at every run.
fn cache() -> &'static Mutex<HashMap<String, Arc<OperatorCurves>>> {
    static CACHE: std::sync::OnceLock<Mutex<HashMap<String, Arc<OperatorCurves>>>> = std::sync::OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

impl OperatorCurves {
    /// The curves of `model` on `tp` GPUs priced by `profile` (memoised by
    /// `key`, which must name everything the curves depend on).
    pub fn cached(key: String, model: &ModelArch, split: Sharding, profile: &Profile) -> Arc<OperatorCurves> {
        if let Some(c) = cache().lock().expect("the curve cache is never poisoned").get(&key) {
            return c.clone();
        }
        let curves = Arc::new(OperatorCurves::build(model, split, profile));
        let mut map = cache().lock().expect("the curve cache is never poisoned");
        if map.len() >= 256 {
            map.clear();
        }
        map.insert(key, curves.clone());
        curves
    }

    /// Builds the curves of `model` on an engine of `sharding.tp` GPUs
    /// priced by `profile`, its routed experts split per `sharding` — with
    /// data-parallel attention on a curve of their own, over every engine's tokens.
    pub fn build(model: &ModelArch, sharding: Sharding, profile: &Profile) -> OperatorCurves {
        let tp = sharding.tp;
        let tpu = u64::from(tp);
        let fp8 = profile.analytic.peaks.fp8_flops.is_some();
        // DeepSeek-V3's attention from the MLA module tables where they measured it.
        let module = mla_module(model, tp, fp8).filter(|m| profile.has_mla_module(m));
        let (groups, shape) = layers(model, sharding, fp8, module.is_some());
        let apart = sharding.dp > 1;
        // A layer's routed experts on `m` tokens: the measured fused kernel
        // (activation included), else the analytic GEMMs — and then (after
        // the element-wise operators, `activation`) their activation.
        let routed = |g: &LayerOps, m: f64, c: &mut StepCost, activation: bool| {
            let Some((x, bytes)) = g.experts else { return };
            match profile.measured_experts(&x, m) {
                Some(p) if !activation => c.add(p, g.count),
                Some(_) => {}
                None if !activation => c.add(profile.analytic.experts(&x, m), g.count),
                None => c.add(profile.elementwise(Elementwise::Activation, m, bytes * m), g.count),
            }
        };
        let d = model.hidden_size as f64;
        let m_axis = token_axis();
        let head_p = precision(model.dtype_bytes as f64, fp8);
        let vocab = model.vocab_size.div_ceil(tpu);
        let dense = Curve::build(&m_axis, |m| {
            let mut c = StepCost::default();
            for g in &groups {
                // A step of at most 256 tokens runs a MoE layer's shared expert on a
                // second CUDA stream beside the routed ones (vLLM's
                // `VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD`, 256 by default, in
                // `fused_moe/layer.py`'s `use_shared_experts_stream`; aiconfigurator's
                // decode `moe_overlap`): the longer of the two counts. With data-parallel
                // attention the routed experts are priced apart, after.
                let overlap = g.shared_expert && !apart && m <= SHARED_EXPERTS_STREAM_TOKENS;
                let (mut shared, mut experts) = (StepCost::default(), StepCost::default());
                let beside = |role: Role| overlap && matches!(role, Role::GateUp | Role::Down);
                for &(role, n, k, p) in &g.gemms {
                    let priced = profile.gemm(role, &Gemm { m, n, k, precision: p });
                    if beside(role) { shared.add(priced, g.count) } else { c.add(priced, g.count) }
                }
                if !apart {
                    routed(g, m, if overlap { &mut experts } else { &mut c }, false);
                }
                for &(op, bytes) in &g.elementwise {
                    let priced = profile.elementwise(op, m, bytes * m);
                    if overlap && op == Elementwise::Activation {
                        shared.add(priced, g.count)
                    } else {
                        c.add(priced, g.count)
                    }
                }
                if !apart {
                    routed(g, m, if overlap { &mut experts } else { &mut c }, true);
                }
                if overlap {
                    let total = |x: &StepCost| x.compute + x.memory + x.comm;
                    c += if total(&shared) >= total(&experts) { shared } else { experts };
                }
                if tp > 1 {
                    c.add(profile.allreduce(tp, m * d), 2.0 * g.count);
                }
            }
            // Once per step: the embedding (and its all-reduce) and the final norm.
            c.add(profile.elementwise(Elementwise::Embedding, m, m * d * model.dtype_bytes as f64), 1.0);
            c.add(profile.elementwise(Elementwise::FinalNorm, m, m * 8.0 * d), 1.0);
            if tp > 1 {
                c.add(profile.allreduce(tp, m * d), 1.0);
            }
            c
        });
        let experts = apart.then(|| {
            Curve::build(&m_axis, |m| {
                let mut c = StepCost::default();
                for g in &groups {
                    routed(g, m, &mut c, false);
                    routed(g, m, &mut c, true);
                }
                c
            })
        });
        let head = Curve::build(&m_axis, |s| {
            let mut c = StepCost::default();
            c.add(profile.gemm(Role::LmHead, &Gemm { m: s, n: vocab, k: model.hidden_size, precision: head_p }), 1.0);
            c
        });
        let ctx = Curve::build(&m_axis, |s| {
            let mut c = StepCost::default();
            match module.and_then(|m| profile.mla_ctx(&m, s)) {
                Some(p) => c.add(p, 1.0),
                None => c.add(profile.ctx_attention(&shape, s, 0.0), 1.0),
            }
            c
        });
        // Decode attention is linear in batch and keys beyond the tables
        // (2,048 sequences, 131,072 keys): the grid stops there (two knots
        // per octave) and extrapolates.
        let (p, sh) = (profile.clone(), shape);
        let decode = Grid2::new(
            Axis::new(1, 11),
            Axis::new(1, 17),
            Arc::new(move |b, s| match module.and_then(|m| p.mla_gen(&m, b, s)) {
                Some(priced) => priced.secs,
                None => p.gen_attention(&sh, b, s).secs,
            }),
        );
        let (window, windowed) = model.window.unwrap_or((u64::MAX, 0));
        let decode_fixed = Curve {
            axis: m_axis.clone(),
            values: dense.values.iter().zip(&head.values).map(|(d, h)| std::array::from_fn(|i| d[i] + h[i])).collect(),
        };
        OperatorCurves {
            dense,
            experts,
            head,
            decode_fixed,
            ctx,
            decode,
            full_layers: (model.num_layers - windowed) as f64,
            windowed_layers: windowed as f64,
            window,
            source: profile.describe(),
            notes: groups
                .iter()
                .filter_map(|g| g.experts.as_ref())
                .filter(|(x, _)| profile.tables.is_some() && profile.measured_experts(x, 1.0).is_none())
                .map(|(x, _)| format!("{} at TP {tp}: {}", model.name, profile.describe_experts(x)))
                .chain(
                    (profile.tables.is_some() && shape.mla.is_some() && module.is_none()).then(|| {
                        format!(
                            "{} at TP {tp}: multi-head latent attention priced operator by operator (GEMM tables, analytic attention) — the MLA module tables measure DeepSeek-V3's shape only, with BF16 or FP8-block projections",
                            model.name
                        )
                    }),
                )
                .collect(),
        }
    }

    /// One full-attention layer's prefill of the chunk `p → n`: the full
    /// sequence's latency × `(n² − p²)/n²` (aiconfigurator's prefix rule).
    fn ctx_layer(&self, p: u64, n: u64) -> [f64; 3] {
        let full = self.ctx.at(n as f64);
        let (p, n) = (p as f64, n as f64);
        full.map(|v| v * (n * n - p * p) / (n * n))
    }

    /// The step's cost by bound.
    pub fn cost(&self, work: &StepWork<'_>) -> StepCost {
        let tokens = work.tokens();
        if work.prefill.is_empty() && work.samples == tokens {
            self.with_attention(work, self.decode_fixed.at(tokens as f64))
        } else {
            self.cost_at(work, tokens)
        }
    }

    /// The step's cost with the layers but attention and the LM head priced
    /// for `padded` tokens — its own, or with data-parallel attention the
    /// most any engine runs (each engine's batch is padded to it: vLLM's
    /// `get_dp_padding`). With data-parallel attention the routed experts
    /// are left out ([`Self::experts_cost`] prices them over all the engines).
    pub fn rank_cost(&self, work: &StepWork<'_>, padded: u64) -> StepCost {
        self.cost_at(work, padded)
    }

    /// [`Self::rank_cost`], inlined into [`Self::cost`] (every step's price).
    #[inline(always)]
    fn cost_at(&self, work: &StepWork<'_>, padded: u64) -> StepCost {
        let (d, h) = (self.dense.at(padded as f64), self.head.at(work.samples as f64));
        self.with_attention(work, std::array::from_fn(|i| d[i] + h[i]))
    }

    /// With data-parallel attention, the routed experts of a step of
    /// `tokens` tokens over every engine (`None` without).
    pub fn experts_cost(&self, tokens: u64) -> Option<StepCost> {
        let [compute, memory, comm] = self.experts.as_ref()?.at(tokens as f64);
        Some(StepCost { compute, memory, comm, ..StepCost::default() })
    }

    /// The step's cost from that of its layers but attention (by bound):
    /// the step's own counts, and its attention added.
    #[inline(always)]
    fn with_attention(&self, work: &StepWork<'_>, [compute, memory, comm]: [f64; 3]) -> StepCost {
        let mut c = StepCost {
            compute,
            memory,
            comm,
            steps: 1.0,
            seqs: (work.decodes + work.prefill.len() as u64) as f64,
            prefill_steps: if work.prefill.is_empty() { 0.0 } else { 1.0 },
        };
        self.add_attention(work, &mut c);
        c
    }

    /// Adds the step's attention: each prefill chunk's, and the decoding
    /// sequences' together.
    fn add_attention(&self, work: &StepWork<'_>, c: &mut StepCost) {
        for chunk in work.prefill {
            let mut layers = self.full_layers;
            if self.windowed_layers > 0.0 {
                layers += self.windowed_layers * attention_pairs(chunk.cached, chunk.end, self.window)
                    / attention_pairs(chunk.cached, chunk.end, u64::MAX);
            }
            let [compute, memory, comm] = self.ctx_layer(chunk.cached, chunk.end);
            c.compute += layers * compute;
            c.memory += layers * memory;
            c.comm += layers * comm;
        }
        if work.decodes > 0 {
            // Each sequence reads its KV once for its token and its drafts
            // (a verify is memory-bound attention like a decode), the drafts'
            // KV included.
            let b = work.decodes as f64;
            let q = if work.drafts == 0 { 1.0 } else { 1.0 + work.drafts as f64 / b };
            c.memory += self.full_layers * self.decode.at(b, work.decode_context_tokens as f64 / b + q);
            if self.windowed_layers > 0.0 {
                c.memory += self.windowed_layers * self.decode.at(b, work.decode_window_tokens as f64 / b + q);
            }
        }
    }
}

impl Operators {
    /// The step's seconds.
    pub fn secs(&self, work: &StepWork<'_>) -> f64 {
        self.curves.cost(work).secs(&self.constants)
    }

    /// Prices decode-only steps of `decodes` sequences, each sampling (a
    /// decode run's sub-steps): what does not change from step to step —
    /// the dense layers and the LM head, where the batch lies on the
    /// attention grid — is priced once.
    pub fn decode_run(&self, decodes: u64) -> DecodeRun<'_> {
        let c = &self.curves;
        DecodeRun {
            ops: self,
            b: decodes as f64,
            fixed: c.decode_fixed.at(decodes as f64),
            row: c.decode.batches.locate(decodes as f64),
        }
    }
}

/// Decode-only steps of one batch size, priced as [`OperatorCurves::cost`]
/// prices them (bit for bit: the same operations in the same order).
#[derive(Clone, Copy, Debug)]
pub struct DecodeRun<'a> {
    ops: &'a Operators,
    b: f64,
    fixed: [f64; 3],
    row: (usize, f64),
}

impl DecodeRun<'_> {
    /// The seconds of a step whose sequences hold `context` tokens in all
    /// (`window`: capped at the sliding window).
    pub fn secs(&self, context: u64, window: u64) -> f64 {
        let (gpu, cpu) = self.parts(context, window);
        gpu.max(cpu)
    }

    /// Such a step's GPU and CPU seconds ([`StepCost::parts`]; the step takes the larger).
    pub fn parts(&self, context: u64, window: u64) -> (f64, f64) {
        let c = &self.ops.curves;
        let [compute, mut memory, comm] = self.fixed;
        if self.b > 0.0 {
            memory += c.full_layers * c.decode.at_row(self.row, self.keys(context));
            if c.windowed_layers > 0.0 {
                memory += c.windowed_layers * c.decode.at_row(self.row, self.keys(window));
            }
        }
        let cost = StepCost { compute, memory, comm, steps: 1.0, seqs: self.b, prefill_steps: 0.0 };
        cost.parts(&self.ops.constants)
    }

    /// Keys per sequence where the attention grid is read.
    fn keys(&self, context: u64) -> f64 {
        context as f64 / self.b + 1.0
    }

    /// Pushes the sub-steps in `a + 1 ..= b` of run `g` where the keys per
    /// sequence (full or windowed) enter a new segment of the attention
    /// grid: between two of them the GPU seconds are affine in the sub-step.
    pub(super) fn breaks(&self, g: &super::RunGrowth, a: u64, b: u64, out: &mut Vec<u64>) {
        if self.b <= 0.0 {
            return;
        }
        let c = &self.ops.curves;
        let axis = &c.decode.keys;
        let mut along = |keys: &dyn Fn(u64) -> f64| {
            let (from, to) = (axis.locate(keys(a)).0, axis.locate(keys(b)).0);
            for i in from + 1..=to {
                let knot = axis.knots()[i];
                out.push(super::first_beyond(a, b, |j| keys(j) >= knot));
            }
        };
        along(&|j| self.keys(g.at(j).0));
        if c.windowed_layers > 0.0 {
            along(&|j| self.keys(g.at(j).1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::perf::PrefillChunk;
    use crate::worker::perf::profile::analytic::Analytic;
    use crate::worker::presets::GpuSpec;

    fn analytic_h100() -> Profile {
        Profile {
            vidur: None,
            tables: None,
            analytic: Analytic { peaks: GpuSpec::preset("H100").unwrap().peaks() },
            routing: Default::default(),
        }
    }

    #[test]
    fn an_axis_locates_every_knot_and_the_segments_between() {
        let a = Axis::new(3, 21);
        // 1 … 8, then eight per octave: 9 … 16, 18 … 32, 36 … 64, …
        assert_eq!(&a.knots()[..12], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
        assert_eq!(&a.knots()[15..18], &[16.0, 18.0, 20.0]);
        for (i, &k) in a.knots().iter().enumerate().take(a.knots().len() - 1) {
            assert_eq!(a.locate(k), (i, 0.0), "knot {k}");
        }
        // 19 lies halfway between 18 and 20; beyond 2²¹ the last segment extends.
        assert_eq!(a.locate(19.0), (16, 0.5));
        let (i, w) = a.locate(4_194_304.0);
        assert_eq!(i, a.knots().len() - 2);
        assert!((w - (4_194_304.0 - 1_966_080.0) / (2_097_152.0 - 1_966_080.0)).abs() < 1e-12);
    }

    /// The operators of one step, priced one by one from the profile: the
    /// composition rule written out independently of [`OperatorCurves::build`].
    fn by_hand(p: &Profile, tp: u64, m: f64, samples: f64, chunk: (f64, f64), decodes: (f64, f64)) -> StepCost {
        // Llama-3.1-8B: 32 layers, d 4096, 32 heads and 8 KV heads of 128, MLP 14336, vocabulary 128256.
        let (h, kv) = (32 / tp, 8 / tp);
        let f = 14336 / tp;
        let shape = AttnShape { heads: h, kv_heads: kv, head_dim: 128, kv_bytes: 2.0, mla: None };
        let mut c = StepCost::default();
        let bf = Precision::Bf16;
        for (role, n, k) in [
            (Role::Qkv, (h + 2 * kv) * 128, 4096),
            (Role::AttnOut, 4096, h * 128),
            (Role::GateUp, 2 * f, 4096),
            (Role::Down, 4096, f),
        ] {
            c.add(p.gemm(role, &Gemm { m, n, k, precision: bf }), 32.0);
        }
        for (op, per_token) in [
            (Elementwise::Norm, 2.0 * 8.0 * 4096.0),
            (Elementwise::Activation, 6.0 * f as f64),
            (Elementwise::Rope, 4.0 * ((h + kv) * 128) as f64),
            (Elementwise::KvWrite, 2.0 * 2.0 * (kv * 128) as f64 * 2.0),
        ] {
            c.add(p.elementwise(op, m, per_token * m), 32.0);
        }
        c.add(p.elementwise(Elementwise::Embedding, m, m * 4096.0 * 2.0), 1.0);
        c.add(p.elementwise(Elementwise::FinalNorm, m, m * 8.0 * 4096.0), 1.0);
        if tp > 1 {
            c.add(p.allreduce(tp as u32, m * 4096.0), 2.0 * 32.0 + 1.0);
        }
        c.add(p.gemm(Role::LmHead, &Gemm { m: samples, n: 128_256 / tp, k: 4096, precision: bf }), 1.0);
        if chunk.1 > 0.0 {
            c.add(p.ctx_attention(&shape, chunk.1, chunk.0), 32.0);
        }
        if decodes.0 > 0.0 {
            c.add(p.gen_attention(&shape, decodes.0, decodes.1), 32.0);
        }
        c
    }

    fn assert_close(got: StepCost, want: StepCost) {
        for (g, w) in [(got.compute, want.compute), (got.memory, want.memory), (got.comm, want.comm)] {
            assert!((g - w).abs() <= 1e-12 * w.abs().max(1e-9), "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn a_mixed_step_is_its_operators_once_on_its_tokens_plus_attention_per_sequence() {
        let model = ModelArch::preset("llama-3.1-8b").unwrap();
        let p = analytic_h100();
        let curves = OperatorCurves::build(&model, Sharding::tensor(1), &p);
        // One 96-token prompt finishing (0 → 96) and 8 decodes with 1,023 cached tokens each:
        // the linear operators on 96 + 8 = 104 tokens, the LM head on 9 sequences, the
        // prompt's attention over 96 tokens, decode attention of 8 sequences over 1,024 keys.
        let chunk = [PrefillChunk { cached: 0, end: 96 }];
        let work = StepWork {
            prefill: &chunk,
            decodes: 8,
            drafts: 0,
            decode_context_tokens: 8 * 1023,
            decode_window_tokens: 8 * 1023,
            samples: 9,
        };
        let c = curves.cost(&work);
        assert_close(c, by_hand(&p, 1, 104.0, 9.0, (0.0, 96.0), (8.0, 1024.0)));
        assert_eq!((c.steps, c.seqs, c.prefill_steps), (1.0, 9.0, 1.0));
        // A chunk that does not finish its prompt samples nothing: the LM head goes.
        let partial = StepWork { samples: 8, ..work };
        let head = p.gemm(Role::LmHead, &Gemm { m: 1.0, n: 128_256, k: 4096, precision: Precision::Bf16 });
        let (full, part) = (curves.cost(&work), curves.cost(&partial));
        let diff = (full.compute + full.memory) - (part.compute + part.memory);
        let lm_head = |m: f64| p.gemm(Role::LmHead, &Gemm { m, n: 128_256, k: 4096, precision: Precision::Bf16 }).secs;
        let lone = lm_head(9.0) - lm_head(8.0);
        assert!((diff - lone).abs() < 1e-15 && head.secs > lone, "{diff} vs {lone}");
    }

    #[test]
    fn tensor_parallel_steps_shard_the_operators_and_add_two_allreduces_per_layer() {
        let model = ModelArch::preset("llama-3.1-8b").unwrap();
        let p = analytic_h100();
        let curves = OperatorCurves::build(&model, Sharding::tensor(2), &p);
        // 16 decodes at 4,095 cached tokens on 2 GPUs: 16 tokens, heads 16 and 4 per GPU,
        // 2·32 + 1 all-reduces of 16 × 4096 values.
        let work = StepWork::decode(16, 16 * 4095, 16 * 4095);
        let c = curves.cost(&work);
        assert_close(c, by_hand(&p, 2, 16.0, 16.0, (0.0, 0.0), (16.0, 4096.0)));
        // 65 all-reduces of 65,536 values: (5.98 µs + 2·(1/2)·2·65,536 B / (0.617 · 450 GB/s)) each.
        let one = 5.98e-6 + 131_072.0 / (0.617 * 450e9);
        assert!((c.comm - 65.0 * one).abs() < 1e-15, "{c:?}");
    }

    #[test]
    fn a_step_takes_the_longer_of_its_gpu_and_its_cpu_work() {
        let c = StepCost { compute: 0.010, memory: 0.004, comm: 0.001, steps: 1.0, seqs: 8.0, prefill_steps: 1.0 };
        // GPU 2·0.010 + 1·0.004 + 3·0.001 = 0.027 s; CPU 0.005 + 8·0.001 + 0.002 = 0.015 s.
        let k = OperatorConstants {
            compute_scale: 2.0,
            memory_scale: 1.0,
            comm_scale: 3.0,
            step_overhead_s: 0.005,
            seq_overhead_s: 0.001,
            prefill_overhead_s: 0.002,
        };
        let (gpu, cpu) = c.parts(&k);
        assert!((gpu - 0.027).abs() < 1e-15 && (cpu - 0.015).abs() < 1e-15, "{gpu} {cpu}");
        assert_eq!(c.secs(&k), gpu);
        // A launch-bound step: the CPU's 0.005 + 8·0.004 + 0.002 = 0.039 s.
        assert!((c.secs(&OperatorConstants { seq_overhead_s: 0.004, ..k }) - 0.039).abs() < 1e-15);
    }

    /// The H200's shipped tables, routing as `routing`.
    fn h200(routing: crate::worker::perf::profile::Routing) -> Profile {
        let peaks = GpuSpec::preset("H200").unwrap().peaks();
        Profile {
            vidur: None,
            tables: crate::worker::perf::profile::shipped::tables("H200", peaks),
            analytic: Analytic { peaks },
            routing,
        }
    }

    #[test]
    fn deepseek_v3s_attention_is_one_measured_module_in_place_of_its_projections_rope_and_cache_write() {
        let model = ModelArch::preset("deepseek-v3").unwrap();
        let p = h200(Default::default());
        let sharding = Sharding { tp: 8, ep: 8, dp: 1 };
        // FP8 block-scaled projections, BF16 KV cache, 128 / 8 heads a GPU.
        let m = mla_module(&model, 8, true).unwrap();
        assert_eq!(m, MlaModule { heads: 16, kv_bytes: 2.0, gemm: Precision::Fp8Block });
        assert!(p.has_mla_module(&m));
        // Without the module a layer has the four latent projections and the output
        // projection, RoPE and the cache write; with it, none — all else alike.
        let (granular, _) = layers(&model, sharding, true, false);
        let (module, _) = layers(&model, sharding, true, true);
        for (g, x) in granular.iter().zip(&module) {
            let attention = |r: &Role| matches!(r, Role::Qkv | Role::AttnOut);
            assert_eq!(g.gemms.iter().filter(|o| attention(&o.0)).count(), 5);
            let kept: Vec<_> = g.gemms.iter().filter(|o| !attention(&o.0)).cloned().collect();
            assert_eq!(x.gemms, kept);
            let others = |e: &Elementwise| !matches!(e, Elementwise::Rope | Elementwise::KvWrite);
            assert_eq!(x.elementwise, g.elementwise.iter().filter(|o| others(&o.0)).cloned().collect::<Vec<_>>());
            assert_eq!((x.count, x.experts), (g.count, g.experts));
        }
        // A step's attention is then 61 layers of the module: a 2,048-token prompt (a knot of
        // the prefill curve) and 8 decodes at 1,023 cached tokens (a knot of the decode grid).
        let curves = OperatorCurves::build(&model, sharding, &p);
        let chunk = [PrefillChunk { cached: 0, end: 2048 }];
        let prefill = StepWork {
            prefill: &chunk,
            decodes: 0,
            drafts: 0,
            decode_context_tokens: 0,
            decode_window_tokens: 0,
            samples: 1,
        };
        let attention = |w: &StepWork<'_>| {
            let mut c = StepCost::default();
            curves.add_attention(w, &mut c);
            c
        };
        let want = 61.0 * p.mla_ctx(&m, 2048.0).unwrap().secs;
        assert!((attention(&prefill).compute - want).abs() < 1e-15, "{:?} vs {want}", attention(&prefill));
        let decode = StepWork::decode(8, 8 * 1023, 8 * 1023);
        let want = 61.0 * p.mla_gen(&m, 8.0, 1024.0).unwrap().secs;
        assert!((attention(&decode).memory - want).abs() < 1e-15, "{:?} vs {want}", attention(&decode));
        // A model of another MLA shape (DeepSeek-V2-Lite: no query latent) keeps the granular operators.
        assert_eq!(mla_module(&ModelArch::preset("deepseek-v2-lite").unwrap(), 1, true), None);
    }

    #[test]
    fn a_shared_expert_runs_beside_the_routed_ones_in_steps_of_at_most_256_tokens() {
        // DeepSeek-V3 on 8 × H200, experts sharded: each MoE layer's shared expert (gate/up,
        // activation, down) and routed experts, serial or overlapped, written out by hand.
        let model = ModelArch::preset("deepseek-v3").unwrap();
        let p = h200(crate::worker::perf::profile::Routing::PowerLaw101);
        let sharding = Sharding { tp: 8, ep: 8, dp: 1 };
        let curves = OperatorCurves::build(&model, sharding, &p);
        let (groups, _) = layers(&model, sharding, true, true);
        let total = |c: &StepCost| c.compute + c.memory + c.comm;
        let by_hand = |m: f64| {
            let (mut sum, mut saved) = (0.0, 0.0);
            for g in &groups {
                let mut shared = 0.0;
                for &(role, n, k, pr) in &g.gemms {
                    let secs = p.gemm(role, &Gemm { m, n, k, precision: pr }).secs;
                    sum += g.count * secs;
                    if g.experts.is_some() && matches!(role, Role::GateUp | Role::Down) {
                        shared += secs;
                    }
                }
                for &(op, bytes) in &g.elementwise {
                    let secs = p.elementwise(op, m, bytes * m).secs;
                    sum += g.count * secs;
                    if g.experts.is_some() && op == Elementwise::Activation {
                        shared += secs;
                    }
                }
                if let Some((x, _)) = g.experts {
                    let routed = p.measured_experts(&x, m).unwrap().secs;
                    sum += g.count * routed;
                    saved += g.count * shared.min(routed);
                }
                sum += 2.0 * g.count * p.allreduce(8, m * 7168.0).secs;
            }
            sum += p.elementwise(Elementwise::Embedding, m, m * 7168.0 * 2.0).secs
                + p.elementwise(Elementwise::FinalNorm, m, m * 8.0 * 7168.0).secs
                + p.allreduce(8, m * 7168.0).secs;
            (sum, saved)
        };
        // 128 tokens: the shorter of the two is hidden; 512 tokens: both count.
        let at = |m: f64| {
            let [c, mem, comm] = curves.dense.at(m);
            total(&StepCost { compute: c, memory: mem, comm, ..StepCost::default() })
        };
        let (serial, saved) = by_hand(128.0);
        assert!(saved > 0.05 * serial, "{saved} of {serial}");
        assert!((at(128.0) - (serial - saved)).abs() < 1e-12 * serial, "{} vs {}", at(128.0), serial - saved);
        let (serial, _) = by_hand(512.0);
        assert!((at(512.0) - serial).abs() < 1e-12 * serial, "{} vs {serial}", at(512.0));
    }
}
