//! Speculative decoding (`[worker.speculative]`), by hand: where verifying
//! drafts stops paying, the memory a drafter takes, common random numbers.

use crate::fixtures::Spec;
use opal::worker::perf::StepWork;
use toml::toml;

/// Llama-3.1-8B on one H100 under Opal's roofline, `batch` requests of a
/// 32-token prompt and 64 output tokens arriving together; with `speculate`,
/// ngram drafts of k = 3 whose first two are always accepted and the third
/// never (every verify emits exactly 3 tokens).
fn batch(batch: i64, speculate: bool) -> Spec {
    let mut spec = Spec::llama8b()
        .tiers(&[])
        .set("worker.inference_params.model", "roofline")
        .set("worker.vllm_params.max_num_seqs", batch)
        .stage(
            "UniformReqRate",
            toml! { request_rate = 1.0e6 total_requests = batch prompt_size = 32 output_tokens = 64 },
        );
    if speculate {
        spec = spec.table(
            "worker.speculative",
            toml! { method = "ngram" num_speculative_tokens = 3 acceptance_rates = [1.0, 1.0, 0.0] },
        );
    }
    spec
}

#[test]
fn verifying_drafts_pays_at_batch_one_and_costs_past_the_batch_where_it_turns_compute_bound() {
    // By hand, from the datasheets: the weights (8,030,261,248 BF16
    // parameters) take W/bw = 16,060,522,496 B / 3.35e12 B/s = 4.794186 ms
    // to read, a context token's KV 131,072 B / 3.35e12 = 39.126 ns, and a
    // token's linear layers 24 · 32 · 4096² FLOPs / 989.5e12 FLOP/s =
    // 13.0216 µs. A decode step of B sequences at context c takes
    // W/bw + B·c·39.126 ns (Opal's decode is memory-bound); a verify of 4
    // tokens each the same or, once its 4B tokens' FLOPs take longer,
    // 4B · 13.0216 µs — and emits 3 tokens per sequence, not 1. It pays
    // while 4B · 13.0216 µs < 3 (W/bw + B·c·39.126 ns): at c = 100 up to
    // B* = 3 · 4.794186 ms / (4 · 13.0216 − 3 · 100 · 0.039126) µs = 356.46.
    let s = batch(1, true).scenario();
    let cfg = &s.worker;
    let step = |b: u64, drafts: u64| {
        let work = StepWork {
            prefill: &[],
            decodes: b,
            drafts,
            decode_context_tokens: 100 * b,
            decode_window_tokens: 100 * b,
            samples: b + drafts,
        };
        cfg.price(&work, |_| false).0.as_secs_f64()
    };
    let gain = |b: u64| 3.0 * step(b, 0) / step(b, 3 * b);
    assert!((step(1, 0) - (4.794_186e-3 + 100.0 * 39.126e-9)).abs() < 1e-9);
    assert_eq!(step(1, 3), step(1, 0), "at batch 1 the verify is as cheap as a decode");
    assert!((gain(1) - 3.0).abs() < 1e-12);
    assert!((step(512, 3 * 512) - 4.0 * 512.0 * 13.021_629e-6).abs() < 1e-9);
    assert!(gain(356) > 1.0 && gain(357) < 1.0, "{} {}", gain(356), gain(357));

    // And in whole runs (contexts 32 to 96, so B* = 298 to 352): one
    // sequence decodes about 3× as fast; 512 together serve fewer tokens/s.
    // One inter-token gap per verify, as `vllm bench serve` counts the
    // chunks: a request's 63 tokens after its first come in 21 verifies.
    let one = batch(1, true).run();
    assert_eq!(one.latencies.get(opal::metrics::LatencyMetric::Itl).count(), 21);
    assert_eq!(one.summary.spec_acceptance_length, 3.0);
    let rate = |b: i64, speculate: bool| batch(b, speculate).run().summary.output_tokens_per_s;
    let (plain, spec) = (rate(1, false), rate(1, true));
    assert!(spec > 2.5 * plain, "batch 1: {spec} vs {plain} tokens/s");
    let (plain, spec) = (rate(512, false), rate(512, true));
    assert!(spec < 0.9 * plain, "batch 512: {spec} vs {plain} tokens/s");
}

#[test]
fn every_grid_point_of_a_replicate_sees_the_same_acceptances() {
    // Each request's verifies are drawn by its place in the stream and its
    // position in its output, so however the platform times them, the same
    // drafts are accepted: the runs' acceptance lengths agree to the bit.
    let lengths: Vec<f64> = [(1, "RoundRobin", 4), (4, "RoundRobin", 64), (3, "LeastLoaded", 16)]
        .iter()
        .map(|&(workers, policy, seqs)| {
            let out = Spec::llama8b()
                .tiers(&[])
                .set("simulation.seed", 5)
                .set("simulation.num_workers", workers)
                .set("router.router_params.policy", policy)
                .set("worker.vllm_params.max_num_seqs", seqs)
                .table("worker.speculative", toml! { method = "eagle" num_speculative_tokens = 4 acceptance_rate = 0.7 })
                .stage(
                    "UniformReqRate",
                    toml! { request_rate = 20.0 total_requests = 60 prompt_size_min = 100 prompt_size_max = 900 output_tokens_min = 20 output_tokens_max = 300 },
                )
                .run();
            assert_eq!(out.summary.requests_completed, 60);
            assert_eq!(out.summary.preemptions, 0, "a recompute samples a token outside a verify");
            out.summary.spec_acceptance_length
        })
        .collect();
    assert!(lengths.iter().all(|&l| l == lengths[0]), "{lengths:?}");
    // (1 − 0.7⁵) / (1 − 0.7) = 2.7731, within sampling error of some 3,000 verifies.
    assert!((lengths[0] - 2.7731).abs() < 0.1, "{}", lengths[0]);
    // A different seed draws differently.
    let other = Spec::llama8b()
        .tiers(&[])
        .set("simulation.seed", 6)
        .table("worker.speculative", toml! { method = "eagle" num_speculative_tokens = 4 acceptance_rate = 0.7 })
        .stage(
            "UniformReqRate",
            toml! { request_rate = 20.0 total_requests = 60 prompt_size = 500 output_tokens = 100 },
        )
        .run();
    assert_ne!(other.summary.spec_acceptance_length, lengths[0]);
    // Without speculative decoding the column is empty (NaN).
    let plain = Spec::llama8b()
        .tiers(&[])
        .stage("UniformReqRate", toml! { request_rate = 20.0 total_requests = 5 prompt_size = 500 output_tokens = 10 })
        .run();
    assert!(plain.summary.spec_acceptance_length.is_nan());
}

#[test]
fn a_drafter_takes_its_weights_and_its_kv_from_the_pool() {
    // An EAGLE head on Llama-3.1-8B: one decoder layer (218,112,000
    // parameters: attention 41,943,040, MLP 176,160,768, norms 8,192) and
    // its 2d × d fusion (33,554,432), in BF16: 503,332,864 B more weights;
    // its layer's KV, 4,096 B per token, beside the model's 131,072.
    let plain = Spec::llama8b().tiers(&[]).scenario();
    let eagle = Spec::llama8b()
        .tiers(&[])
        .table("worker.speculative", toml! { method = "eagle" num_speculative_tokens = 3 acceptance_rate = 0.7 })
        .scenario();
    let m = opal::worker::model::ModelArch::preset("llama-3.1-8b").unwrap();
    let pool = opal::worker::model::KvPool::new(&m, 80.0, 1, 0.9, 16);
    assert_eq!(pool.blocks, plain.worker.total_blocks);
    let free = pool.memory_bytes - pool.weight_bytes - 503_332_864.0;
    let want = (free / (16.0 * (131_072.0 + 4_096.0))).floor() as u64;
    assert_eq!(eagle.worker.total_blocks, want);
    // A draft model: Llama-3.1-8B drafting for Llama-3.1-70B on 4 GPUs adds
    // its 16,060,522,496 B of weights and its 131,072 B of KV per token to
    // the 70B's 327,680.
    let big = |draft: bool| {
        let mut s = Spec::empty().set("model.model_params.name", "llama-3.1-70b").set("worker.hw.tp", 4).tiers(&[]);
        if draft {
            s = s.table(
                "worker.speculative",
                toml! { method = "draft_model" draft_model = "llama-3.1-8b" num_speculative_tokens = 4 acceptance_rate = 0.8 },
            );
        }
        s.scenario().worker.total_blocks
    };
    let m70 = opal::worker::model::ModelArch::preset("llama-3.1-70b").unwrap();
    let pool = opal::worker::model::KvPool::new(&m70, 80.0, 4, 0.9, 16);
    assert_eq!(big(false), pool.blocks);
    let free = pool.memory_bytes - pool.weight_bytes - 16_060_522_496.0;
    assert_eq!(big(true), (free / (16.0 * (327_680.0 + 131_072.0))).floor() as u64);
}

#[test]
fn an_eagle_head_runs_once_over_the_steps_tokens_then_once_per_further_draft() {
    // Llama-3.1-8B's EAGLE head under the roofline: a one-layer model
    // reading (embedding and LM head 1,050,673,152 + layer 218,112,000 +
    // norm 4,096) × 2 B = 2,537,578,496 B of weights and its layer's KV,
    // 4,096 B a token. A verify at batch 1 and context 100 with k = 3: the
    // head's first pass over the step's 4 tokens and 2 more of one token,
    // each memory-bound: 3 × (2,537,578,496 + 409,600) B / 3.35e12 B/s.
    let price = |method: &str| {
        let s = Spec::llama8b()
            .tiers(&[])
            .set("worker.inference_params.model", "roofline")
            .table("worker.speculative", toml! { method = method num_speculative_tokens = 3 acceptance_rate = 0.7 })
            .scenario();
        let work = StepWork {
            prefill: &[],
            decodes: 1,
            drafts: 3,
            decode_context_tokens: 100,
            decode_window_tokens: 100,
            samples: 4,
        };
        s.worker.price(&work, |_| false).0.as_secs_f64()
    };
    let head = 3.0 * (2_537_578_496.0 + 409_600.0) / 3.35e12;
    assert!((price("eagle") - price("ngram") - head).abs() < 4e-9, "{} vs {head}", price("eagle") - price("ngram"));
}
