//! Data-parallel attention: `D` engines ("ranks") of `tp` GPUs each, every
//! one with its own scheduler, waiting queue and KV cache, whose mixture of
//! experts layers run together over all `D · tp` GPUs — vLLM's
//! `--data-parallel-size D` on a mixture of experts (with or without
//! `--enable-expert-parallel`), SGLang's `--enable-dp-attention`.
//!
//! What vLLM does (v1; `vllm/v1/engine/core.py`, `DPEngineCoreProc`):
//! - **Ranks are engines.** Each rank runs its own `EngineCore` busy loop and
//!   scheduler; a router in front (llm-d, Dynamo) addresses the ranks one by
//!   one, so here each rank is a worker the router sees.
//! - **Lockstep.** Every MoE layer is a collective over the ranks, so a
//!   forward pass runs on all of them at once. A rank with nothing scheduled
//!   runs a dummy batch (`execute_dummy_batch`) while any rank of the group
//!   has requests (the DP "wave"); when none has, all stop.
//! - **Padding.** The ranks agree on each step's shape
//!   (`coordinate_batch_across_dp`, `vllm/v1/worker/dp_utils.py`): the CUDA
//!   graph mode is the least any rank can use, and only when it is one
//!   ("DP padding is needed when cudagraph is enabled") is every rank's
//!   batch padded to the most tokens any rank runs. A batch runs as a graph
//!   when its tokens are within the largest capture size
//!   (`max_cudagraph_capture_size`, `min(2 · max_num_seqs, 512)`,
//!   `vllm/config/compilation.py`), so: if every rank's tokens are within
//!   it, every rank runs the most of them (a dummy batch too); else each
//!   runs its own (a dummy batch one token).
//! - **Experts.** The routed experts span the `D · tp` GPUs: whole experts
//!   with expert parallelism, else each expert split over them
//!   (`FusedMoEParallelConfig.make`); see [`super::model::Sharding`].
//! - **Exchange.** Around each MoE layer the tokens go to the experts and
//!   back. By default (`VLLM_ALL2ALL_BACKEND = allgather_reducescatter`,
//!   `AgRsAll2AllManager`) an all-gather over the DP group of every rank's
//!   hidden states and router logits (`dispatch`), then a reduce-scatter of
//!   the experts' outputs (`combine`); with DeepEP (`deepep_high_throughput`,
//!   `deepep_low_latency`) an all-to-all sending each token to the GPUs of its
//!   top-k experts and the results back (the low-latency kernels dispatch
//!   FP8 with a scale per 128 values).
//!
//! The model: a step of the group, rank `r` running `n_r` rows (its planned
//! work's tokens, or per the padding rule above), takes
//!
//! `max( max_r gpu_r(n_r) + experts(Σ n_r) + exchange(n),  max_r cpu_r )`
//!
//! where `gpu_r`, `cpu_r` are the step model's GPU and CPU seconds of rank
//! `r`'s layers but the routed experts on `n_r` rows with its own attention
//! and LM head ([`OperatorCurves::rank_cost`]), `experts` the routed experts
//! on every rank's rows at the group's split ([`OperatorCurves::experts_cost`])
//! and the exchange as [`Exchange::secs`] prices it.
//! (Per layer the ranks meet at the MoE layer; all layers alike, the slowest
//! rank's layers set the pace — summing per-layer maxima is the maximum of sums.)
//!
//! [`OperatorCurves::rank_cost`]: super::perf::operators::OperatorCurves::rank_cost
//! [`OperatorCurves::experts_cost`]: super::perf::operators::OperatorCurves::experts_cost

use super::perf::operators::StepCost;
use super::perf::{StepModel, StepWork};
use crate::time::SimDuration;

/// How the tokens reach the experts and come back (vLLM's `VLLM_ALL2ALL_BACKEND`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// An all-gather of hidden states and router logits over the DP group,
    /// then a reduce-scatter of the outputs (vLLM's default).
    AllgatherReducescatter,
    /// DeepEP's high-throughput all-to-all: each token to its top-k experts'
    /// GPUs and back, in the activations' type.
    DeepepHighThroughput,
    /// DeepEP's low-latency all-to-all: dispatched in FP8 (a 4-byte scale
    /// per 128 values), combined in the activations' type.
    DeepepLowLatency,
}

impl Backend {
    /// Backend names, as vLLM spells them.
    pub const NAMES: [&'static str; 3] = ["allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency"];

    /// The backend named `name` (vLLM's spelling, any case).
    pub fn parse(name: &str) -> Option<Backend> {
        match name.to_ascii_lowercase().as_str() {
            "allgather_reducescatter" => Some(Backend::AllgatherReducescatter),
            "deepep_high_throughput" => Some(Backend::DeepepHighThroughput),
            "deepep_low_latency" => Some(Backend::DeepepLowLatency),
            _ => None,
        }
    }
}

/// A collective's fixed latency over `n` GPUs and the share of the link its
/// bytes move at, fitted (least squares on relative error) to
/// aiconfigurator's NCCL 2.27.3 tables for the H100 SXM (`nccl_perf.parquet`,
/// FP16, 2, 4 and 8 GPUs, 256 B to 128 MiB): all-gather and reduce-scatter
/// 6.1 / 8.1 / 11.5 µs and 46 / 59 / 66 % of NVLink's 450 GB/s; all-to-all
/// 8.0 / 8.2 / 8.9 µs and 53 / 62 / 61 %. More than 8 GPUs take the 8-GPU
/// figures on their link.
fn collective(all_to_all: bool, n: u64) -> (f64, f64) {
    let at = |v: [f64; 3]| match n {
        0..=2 => v[0],
        3..=4 => v[1],
        _ => v[2],
    };
    if all_to_all {
        (at([8.0e-6, 8.2e-6, 8.9e-6]), at([0.53, 0.62, 0.61]))
    } else {
        (at([6.1e-6, 8.1e-6, 11.5e-6]), at([0.46, 0.59, 0.66]))
    }
}

/// The dispatch and combine around a step's MoE layers.
#[derive(Clone, Debug, PartialEq)]
pub struct Exchange {
    /// How.
    pub backend: Backend,
    /// MoE layers in the model.
    pub moe_layers: f64,
    /// Model width.
    pub hidden: u64,
    /// Routed experts (a router logit each).
    pub experts: u64,
    /// Experts a token goes to.
    pub topk: u64,
    /// Ranks (`D`).
    pub ranks: u64,
    /// GPUs per rank.
    pub tp: u64,
    /// Bytes of one activation value.
    pub act_bytes: f64,
    /// The link between the ranks' GPUs, bytes/s per GPU and direction.
    pub link_bytes_per_s: f64,
}

impl Exchange {
    /// Bytes the busiest GPU moves in one MoE layer's dispatch and in its
    /// combine. All-gather: the other ranks' hidden states and router logits
    /// (the GPU of the rank with the fewest rows receives the most);
    /// reduce-scatter: as many rows' partial outputs. All-to-all: over `R =
    /// D·tp` GPUs each GPU's `1/tp` of its rank's rows go to their top-k
    /// experts, `(R − 1)/R` of which lie on another GPU, and come back; the
    /// rank with the most rows sends the most (uniform routing: a GPU
    /// receives the mean, no more).
    pub fn bytes(&self, rows: Rows) -> (f64, f64) {
        let d = self.hidden as f64;
        match self.backend {
            Backend::AllgatherReducescatter => {
                let others = (rows.total - rows.least) as f64;
                (others * (d + self.experts as f64) * self.act_bytes, others * d * self.act_bytes)
            }
            Backend::DeepepHighThroughput | Backend::DeepepLowLatency => {
                let gpus = (self.ranks * self.tp) as f64;
                let copies = rows.most as f64 / self.tp as f64 * self.topk as f64 * (gpus - 1.0) / gpus;
                let dispatched = match self.backend {
                    Backend::DeepepLowLatency => d * (1.0 + 4.0 / 128.0),
                    _ => d * self.act_bytes,
                };
                (copies * dispatched, copies * d * self.act_bytes)
            }
        }
    }

    /// Seconds of every MoE layer's dispatch and combine: per layer two
    /// collectives, each its latency plus its bytes at its share of the
    /// link ([`collective`]).
    pub fn secs(&self, rows: Rows) -> f64 {
        let a2a = self.backend != Backend::AllgatherReducescatter;
        let gpus = if a2a { self.ranks * self.tp } else { self.ranks };
        let (latency, share) = collective(a2a, gpus);
        let (dispatch, combine) = self.bytes(rows);
        let rate = share * self.link_bytes_per_s;
        self.moe_layers * (2.0 * latency + (dispatch + combine) / rate)
    }
}

/// The rows the ranks of a group run in a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rows {
    /// The most any rank runs.
    pub most: u64,
    /// The fewest any rank runs.
    pub least: u64,
    /// All ranks' together.
    pub total: u64,
}

impl Rows {
    /// `n` rows on each of `ranks` ranks.
    pub fn even(n: u64, ranks: u64) -> Rows {
        Rows { most: n, least: n, total: n * ranks }
    }
}

/// Data-parallel attention's settings (identical for every rank).
#[derive(Clone, Debug, PartialEq)]
pub struct DataParallel {
    /// Ranks stepping together (`D`): workers `g·D .. (g+1)·D` are one group.
    pub ranks: u32,
    /// The largest batch, in tokens, that runs as a CUDA graph (vLLM's
    /// `max_cudagraph_capture_size`): when every rank's is within it, all
    /// are padded to the most.
    pub graph_tokens: u64,
    /// The dispatch and combine around the MoE layers.
    pub exchange: Exchange,
}

impl DataParallel {
    /// The group's step, given each rank's planned work (an idle rank's is
    /// empty): the slowest rank's layers on its rows, then the routed experts
    /// on every rank's rows and the exchange (see the module's docs).
    /// `perf` is the operators model (the only one resolution allows here).
    pub fn step_time<'a>(&self, perf: &StepModel, ranks: impl Iterator<Item = StepWork<'a>> + Clone) -> SimDuration {
        debug_assert!(self.ranks > 1);
        let StepModel::Operators(ops) = perf else {
            unreachable!("data-parallel attention is resolved with the operators step model only")
        };
        let most = ranks.clone().map(|w| w.tokens()).max().unwrap_or(0).max(1);
        // Within a CUDA graph every rank runs the most rows; else its own (a dummy batch one).
        let rows_of = |w: &StepWork<'_>| if most <= self.graph_tokens { most } else { w.tokens().max(1) };
        let (mut gpu, mut cpu) = (0.0f64, 0.0f64);
        let mut rows = Rows { most, least: u64::MAX, total: 0 };
        for w in ranks {
            let n = rows_of(&w);
            (rows.least, rows.total) = (rows.least.min(n), rows.total + n);
            let (g, c) = ops.curves.rank_cost(&w, n).parts(&ops.constants);
            gpu = gpu.max(g);
            cpu = cpu.max(c);
        }
        let mut shared = ops.curves.experts_cost(rows.total).unwrap_or_default();
        shared += StepCost { comm: self.exchange.secs(rows), ..StepCost::default() };
        let (together, _) = shared.parts(&ops.constants);
        SimDuration::from_secs_f64((gpu + together).max(cpu)).max(SimDuration(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exchange(backend: Backend) -> Exchange {
        // DeepSeek-V3's MoE layers on 8 ranks of one H100 each, BF16 activations.
        Exchange {
            backend,
            moe_layers: 58.0,
            hidden: 7168,
            experts: 256,
            topk: 8,
            ranks: 8,
            tp: 1,
            act_bytes: 2.0,
            link_bytes_per_s: 450e9,
        }
    }

    #[test]
    fn an_allgather_reducescatter_moves_the_other_ranks_rows_and_takes_its_latency_plus_bytes_at_its_share() {
        let x = exchange(Backend::AllgatherReducescatter);
        // 64 rows a rank: a GPU receives 7 × 64 rows of (7,168 + 256) × 2 B
        // in the all-gather and 7 × 64 × 7,168 × 2 B in the reduce-scatter.
        let even = |n| Rows::even(n, 8);
        let (dispatch, combine) = x.bytes(even(64));
        assert_eq!(dispatch, 6_651_904.0);
        assert_eq!(combine, 6_422_528.0);
        // Per layer 2 × 11.5 µs + 13,074,432 B / (0.66 × 450 GB/s) = 67.022 µs.
        let per_layer: f64 = 2.0 * 11.5e-6 + 13_074_432.0 / (0.66 * 450e9);
        assert!((per_layer - 67.022e-6).abs() < 1e-9, "{per_layer}");
        assert!((x.secs(even(64)) - 58.0 * per_layer).abs() < 1e-15);
        // Twice the rows, twice the bytes; the latency stays.
        assert!((x.secs(even(128)) - 58.0 * (2.0 * 11.5e-6 + 2.0 * 13_074_432.0 / (0.66 * 450e9))).abs() < 1e-15);
        // Unequal ranks: the GPU of the rank with the fewest rows (1) receives
        // all the others' (448 − 1 + 63 more of the busiest).
        let rows = Rows { most: 127, least: 1, total: 448 };
        assert_eq!(x.bytes(rows).1, 447.0 * 7_168.0 * 2.0);
    }

    #[test]
    fn an_all_to_all_sends_each_row_to_its_top_k_experts_off_the_gpu() {
        let x = exchange(Backend::DeepepHighThroughput);
        // 64 rows × 8 experts × 7/8 off the GPU = 448 copies of 7,168 × 2 B each way.
        let even = Rows::even(64, 8);
        assert_eq!(x.bytes(even), (6_422_528.0, 6_422_528.0));
        let per_layer = 2.0 * 8.9e-6 + 2.0 * 6_422_528.0 / (0.61 * 450e9);
        assert!((x.secs(even) - 58.0 * per_layer).abs() < 1e-15);
        // The busiest rank sends the most: 64 rows there, whatever the rest.
        assert_eq!(x.bytes(Rows { most: 64, least: 1, total: 100 }), x.bytes(even));
        // Low latency: FP8 out (7,168 B + 56 scales of 4 B), BF16 back.
        let ll = exchange(Backend::DeepepLowLatency);
        assert_eq!(ll.bytes(even), (448.0 * 7_392.0, 6_422_528.0));
        // Two ranks of 4 GPUs: each GPU sends its quarter of the rank's rows.
        let x = Exchange { ranks: 2, tp: 4, ..x };
        assert_eq!(x.bytes(Rows::even(64, 2)).0, 16.0 * 8.0 * 7.0 / 8.0 * 7_168.0 * 2.0);
    }

    #[test]
    fn the_slowest_rank_sets_the_pace_and_the_experts_run_on_every_ranks_rows() {
        use crate::worker::model::ModelArch;
        use crate::worker::model::Sharding;
        use crate::worker::perf::PrefillChunk;
        use crate::worker::perf::operators::{OperatorConstants, OperatorCurves, Operators};
        use crate::worker::perf::profile::{Profile, analytic::Analytic};
        use crate::worker::presets::GpuSpec;
        // Qwen3-30B-A3B on two ranks of one H100, its 128 experts 64 a GPU.
        let model = ModelArch::preset("qwen3-30b-a3b").unwrap();
        let peaks = GpuSpec::preset("H100").unwrap().peaks();
        let profile = Profile { vidur: None, tables: None, analytic: Analytic { peaks }, routing: Default::default() };
        let curves = OperatorCurves::build(&model, Sharding { tp: 1, ep: 2, dp: 2 }, &profile);
        let k = OperatorConstants { step_overhead_s: 1e-3, ..OperatorConstants::DEFAULT };
        let perf = StepModel::Operators(Operators { curves: std::sync::Arc::new(curves), constants: k });
        let StepModel::Operators(ops) = &perf else { unreachable!() };
        let dp = DataParallel {
            ranks: 2,
            graph_tokens: 512,
            exchange: Exchange {
                moe_layers: 48.0,
                hidden: 2048,
                experts: 128,
                ranks: 2,
                ..exchange(Backend::AllgatherReducescatter)
            },
        };
        let t = |ranks: &[StepWork<'_>]| dp.step_time(&perf, ranks.iter().copied());
        let long = [PrefillChunk { cached: 0, end: 4096 }];
        let a = StepWork {
            prefill: &long,
            decodes: 0,
            drafts: 0,
            decode_context_tokens: 0,
            decode_window_tokens: 0,
            samples: 1,
        };
        let b = StepWork::decode(1, 100, 100);
        let idle = StepWork::decode(0, 0, 0);
        // By hand: 4,096 rows are beyond a CUDA graph (512), so no padding:
        // each rank runs its own rows (4,096 and 1), the prompt's make the
        // long rank the slower, the experts run on 4,097 rows, and the short
        // rank's GPU receives the long one's 4,096 in the exchange.
        let c = &ops.curves;
        let (gpu_a, cpu_a) = c.rank_cost(&a, 4096).parts(&k);
        let (gpu_b, _) = c.rank_cost(&b, 1).parts(&k);
        assert!(gpu_a > gpu_b && gpu_a > cpu_a);
        let x = c.experts_cost(4097).unwrap();
        let rows = Rows { most: 4096, least: 1, total: 4097 };
        let want = gpu_a + x.compute + x.memory + x.comm + dp.exchange.secs(rows);
        assert_eq!(t(&[a, b]), SimDuration::from_secs_f64(want));
        // The short rank adds nothing, in either place; an idle one (a dummy
        // batch of one row) neither.
        assert_eq!(t(&[b, a]), t(&[a, b]));
        assert_eq!(t(&[a, idle]), t(&[a, b]));
        // Within a CUDA graph the ranks are padded to the most: a rank of 100
        // decodes beside one of 1 runs 100 rows, and so does the short one.
        let hundred = StepWork::decode(100, 10_000, 10_000);
        let (gpu_h, cpu_h) = c.rank_cost(&hundred, 100).parts(&k);
        let (gpu_b, _) = c.rank_cost(&b, 100).parts(&k);
        assert!(gpu_h > gpu_b);
        let x = c.experts_cost(200).unwrap();
        let padded = (gpu_h + x.compute + x.memory + x.comm + dp.exchange.secs(Rows::even(100, 2))).max(cpu_h);
        assert_eq!(t(&[b, hundred]), SimDuration::from_secs_f64(padded));
        assert_eq!(t(&[idle, hundred]), t(&[b, hundred]));
        // With its partner idle the short rank's step is 1 row each.
        let (gpu_b, cpu_b) = c.rank_cost(&b, 1).parts(&k);
        let x = c.experts_cost(2).unwrap();
        let alone = (gpu_b + x.compute + x.memory + x.comm + dp.exchange.secs(Rows::even(1, 2))).max(cpu_b);
        assert_eq!(t(&[b, idle]), SimDuration::from_secs_f64(alone));
        assert!(t(&[b, idle]).0 * 4 < t(&[a, b]).0, "{:?} vs {:?}", t(&[b, idle]), t(&[a, b]));
    }

    #[test]
    fn backends_are_named_as_vllm_names_them() {
        for name in Backend::NAMES {
            assert!(Backend::parse(name).is_some(), "{name}");
        }
        assert_eq!(Backend::parse("DeepEP_Low_Latency"), Some(Backend::DeepepLowLatency));
        assert_eq!(Backend::parse("naive"), None);
    }
}
