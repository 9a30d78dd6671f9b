//! Pipeline parallelism, by hand: a worker's layers split over stages as
//! vLLM splits them, its KV pool the smallest any stage leaves, and a step
//! a round of up to `pp` micro-batches whose length is the longest trip
//! through the stages or the busiest stage's work.

use crate::fixtures::Spec;
use opal::worker::perf::{StepModel, StepWork};
use toml::toml;

/// Bytes a Llama-3.1-8B token sends between stages: hidden states and
/// residual, 2 × 4,096 × 2 bytes.
const LLAMA8B_HOP_BYTES: f64 = 16_384.0;
/// The H100's TP link, which stages of one node use: 450 GB/s.
const NVLINK: f64 = 450e9;
/// One hop's latency (the default): 10 µs.
const LATENCY: f64 = 10e-6;

fn steps(spec: &Spec) -> Vec<opal::metrics::StepRow> {
    let opts = opal::RunOptions { step_records: true, ..Default::default() };
    opal::simulate_with(&spec.scenario(), &opts).unwrap_or_else(|e| panic!("{e}")).steps
}

#[test]
fn a_two_stage_round_is_its_micro_batch_on_the_whole_model_a_hop_and_the_way_back() {
    // Synthetic 10 ms per micro-batch on the whole model; one request of 100
    // prompt tokens and 3 output tokens on Llama-3.1-8B, TP1 × PP2 (16 + 16 layers).
    let spec = Spec::llama8b()
        .tiers(&[])
        .set("worker.hw.pp", 2)
        .set("worker.inference_params.model", "synthetic")
        .set("worker.inference_params.mean_latency_secs", 0.010)
        .stage("UniformReqRate", toml! { request_rate = 1.0 total_requests = 1 prompt_size = 100 output_tokens = 3 });
    let rows = steps(&spec);
    // A hop of n tokens: 10 µs + n × 16,384 B / 450 GB/s (one GPU a stage: no all-gather).
    let hop = |n: f64| LATENCY + n * LLAMA8B_HOP_BYTES / NVLINK;
    // The prefill: 10 ms through both stages (5 ms each), a hop of 100 tokens
    // (13.641 µs) and the sampled token's 10 µs back = 10.023641 ms; then
    // two rounds of one decode: 10 ms + 10.036 µs + 10 µs.
    let want = [0.010 + hop(100.0) + LATENCY, 0.010 + hop(1.0) + LATENCY, 0.010 + hop(1.0) + LATENCY];
    assert_eq!(rows.len(), 3);
    for (r, w) in rows.iter().zip(want) {
        assert!((r.duration_s - w).abs() < 1.5e-9, "{} vs {w}", r.duration_s);
    }
    assert!((want[0] - 0.010_023_641).abs() < 1e-9);
}

/// The round a saturated worker of `stages` (decoder layers each) takes for
/// `decodes` sequences holding `context` tokens, from the step model's
/// price of each micro-batch on the whole model (`perf`), by the rule in
/// `src/worker/pipeline.rs`: the decoders split evenly, each micro-batch's
/// trip `t + (pp − 1) hop + latency`, or the busiest stage's share of all.
fn round(perf: &StepModel, stages: &[u64], decodes: u64, context: u64) -> (f64, f64, Vec<f64>) {
    let pp = stages.len() as u64;
    let (mut trips, mut prices, mut left) = (0.0f64, Vec::new(), context);
    for m in 0..pp {
        let n = decodes / pp + u64::from(m < decodes % pp);
        let c = if m == pp - 1 { left } else { context * n / decodes };
        left -= c;
        let t = perf.step_time(&StepWork::decode(n, c, c)).as_secs_f64();
        prices.push(t);
        trips = trips.max(t + (pp - 1) as f64 * (LATENCY + n as f64 * LLAMA8B_HOP_BYTES / NVLINK) + LATENCY);
    }
    let busiest = *stages.iter().max().unwrap() as f64 / stages.iter().sum::<u64>() as f64 * prices.iter().sum::<f64>();
    (trips, busiest, prices)
}

#[test]
fn a_saturated_pipeline_serves_pp_times_its_per_batch_rate_less_the_bubble() {
    // 64 requests at once, 256 prompt tokens and 400 output tokens each,
    // max_num_seqs 64: after the prefills, rounds of 64 decodes.
    let base = Spec::llama8b().tiers(&[]).set("worker.vllm_params.max_num_seqs", 64).stage(
        "UniformReqRate",
        toml! { request_rate = 1e6 total_requests = 64 prompt_size = 256 output_tokens = 400 },
    );
    // The step model prices a micro-batch on the whole model: the same on one GPU as on two stages.
    let perf = base.scenario().worker.perf.clone();
    for (pp, stages) in [(2, vec![16, 16]), (3, vec![11, 11, 10])] {
        let rows = steps(&base.clone().set("worker.hw.pp", pp));
        let decode_rounds: Vec<_> = rows.iter().filter(|r| r.decodes == 64 && r.prefill_chunks == 0).collect();
        assert!(decode_rounds.len() > 300, "{}", decode_rounds.len());
        let (mut tokens, mut secs, mut ideal, mut bubble_free, mut one_gpu) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for r in &decode_rounds {
            let (trip, busiest, prices) = round(&perf, &stages, 64, r.decode_context_tokens);
            let want = trip.max(busiest);
            assert!((r.duration_s - want).abs() < 1.5e-9, "pp {pp}: {} vs {want}", r.duration_s);
            tokens += 64.0;
            secs += r.duration_s;
            // pp micro-batches, each at its own per-batch rate (n / t), side by side.
            ideal += prices.iter().sum::<f64>() / pp as f64;
            bubble_free += prices.iter().cloned().fold(0.0, f64::max);
            // The same 64 sequences on one GPU holding every layer: one step.
            let c = r.decode_context_tokens;
            one_gpu += perf.step_time(&StepWork::decode(64, c, c)).as_secs_f64();
        }
        let rate = tokens / secs;
        let per_batch = tokens / pp as f64 / (ideal);
        // The bubble: two stages balanced (16 + 16 layers), the trip's hop
        // (10 µs + 21.3 or 22 × 16,384 B / 450 GB/s) and the 10 µs back,
        // against a ≈ 7 ms micro-batch; three stages 11 + 11 + 10, the
        // busiest holds 11/32 of each micro-batch, 3 × 11/32 = 33/32 of a
        // micro-batch's time a round: a bubble of 1/33 whatever the hops.
        let bubble = 1.0 - rate / (pp as f64 * per_batch);
        eprintln!(
            "pp {pp}: {rate:.0} tok/s, per batch {per_batch:.0} tok/s, bubble {:.4} %; one GPU {:.0} tok/s",
            bubble * 100.0,
            tokens / one_gpu
        );
        // Decoding reads each stage's weights once per micro-batch, so `pp`
        // GPUs read the whole model's weights a round as one GPU would for
        // the whole batch: only the KV reads and the attention are spread.
        // The stages buy room for the model and its KV, and a little speed.
        let gain = rate / (tokens / one_gpu);
        assert!(gain > 1.0 && gain < 1.25, "{gain}");
        if pp == 2 {
            let hops = LATENCY + 32.0 * LLAMA8B_HOP_BYTES / NVLINK + LATENCY;
            let t = bubble_free / decode_rounds.len() as f64;
            assert!((bubble - hops / (t + hops)).abs() < 2e-4, "{bubble} vs {}", hops / (t + hops));
            assert!(bubble > 0.0 && bubble < 0.005);
        } else {
            assert!((bubble - 1.0 / 33.0).abs() < 1e-3, "{bubble}");
        }
    }
}

#[test]
fn llama_405b_on_two_nodes_of_eight_h100s_is_sized_stage_by_stage() {
    let spec = Spec::empty()
        .set("model.model_params.name", "llama-3.1-405b")
        .tiers(&[])
        .set("worker.hw.tp", 8)
        .set("worker.hw.pp", 2)
        .set("worker.hw.usd_per_gpu_hour", 2.5)
        .stage("UniformReqRate", toml! { request_rate = 2.0 total_requests = 8 prompt_size = 2000 output_tokens = 50 });
    let s = spec.scenario();
    // 126 layers of 3,187,703,808 parameters (attention 570,425,344, MLP
    // 3 × 16,384 × 53,248, norms 32,768), 63 a stage; the embedding
    // (128,256 × 16,384 = 2,101,346,304) on the first, the LM head and the
    // final norm (16,384) on the second; BF16.
    let layer = 3_187_703_808u64;
    let (first, second) = ((63 * layer + 2_101_346_304) * 2, (63 * layer + 2_101_346_304 + 16_384) * 2);
    assert_eq!((first, second), (405_853_372_416, 405_853_405_184));
    assert_eq!(s.model.stage_weight_bytes(0, 63, 2), first);
    assert_eq!(s.model.stage_weight_bytes(63, 63, 2), second);
    // Per GPU: 50,731,675,648 B = 47.25 GiB of weights on the second stage;
    // KV 63 layers × 2 × 1 KV head × 128 × 2 B = 32,256 B a token.
    assert_eq!(second / 8, 50_731_675_648);
    assert_eq!(s.model.kv_bytes_per_token_of(63, 8) / 8, 32_256);
    // 80 GiB × 0.9 = 77,309,411,328 B a GPU: (77,309,411,328 − 50,731,675,648)
    // / (16 × 32,256) = 51,497.66 blocks on the second stage (51,497.67 on
    // the first): 51,497 for the engine, 823,952 tokens.
    assert_eq!(s.worker.total_blocks, 51_497);
    assert_eq!(s.hardware_of(0).1, 16, "TP 8 × PP 2 GPUs per worker");
    // It runs, and it is priced for 16 GPUs.
    let out = spec.run();
    assert_eq!(out.summary.requests_completed, 8);
    let w = &out.workers[0];
    assert!((w.cost.gpu_hours - 16.0 * (out.summary.sim_time_s - w.started_s) / 3600.0).abs() < 1e-9, "{:?}", w.cost);
    // On one node (TP 8 alone) it does not fit, and the fix names the stages.
    let e = crate::scenario_err(&spec.clone().set("worker.hw.pp", 1).toml());
    assert!(e.message.contains("does not fit") && e.hint.as_deref().unwrap_or("").contains("worker.hw.pp"), "{e}");
}

#[test]
fn stages_are_refused_where_the_model_or_the_scheduler_cannot_have_them() {
    let e = crate::scenario_err(&Spec::llama8b().set("worker.hw.pp", 33).toml());
    assert_eq!(e.key.as_deref(), Some("worker.hw.pp"));
    assert!(e.message.contains("32 layers"), "{e}");
    let e =
        crate::scenario_err(&Spec::llama8b().set("worker.hw.pp", 2).set("worker.vllm_params.scheduler", "v0").toml());
    assert_eq!(e.key.as_deref(), Some("worker.hw.pp"));
    let e = crate::scenario_err(&Spec::llama8b().set("worker.hw.pp", 0).toml());
    assert_eq!(e.key.as_deref(), Some("worker.hw.pp"));
    // vLLM's name for it points here.
    let text = Spec::llama8b().set("worker.hw.pipeline_parallel_size", 2).toml();
    let e = opal::config::parse_spec(&text, "test.toml").expect_err("an unknown key");
    assert!(e.to_string().contains("here that is worker.hw.pp"), "{e}");
}

#[test]
fn a_group_of_pipelined_workers_counts_its_stages_gpus() {
    let s = Spec::llama8b()
        .tiers(&[])
        .stage("UniformReqRate", toml! { request_rate = 1.0 total_requests = 1 })
        .group("flat", 1, toml::Table::new())
        .group("piped", 1, toml! { tp = 2 pp = 2 })
        .scenario();
    assert_eq!((s.hardware_of(0).1, s.hardware_of(1).1), (1, 4));
    assert_eq!((s.worker_config(0).stages(), s.worker_config(1).stages()), (1, 2));
    // Each stage holds 16 layers on two GPUs: more room for KV than one GPU holding 32.
    assert!(s.worker_config(1).total_blocks > 4 * s.worker_config(0).total_blocks);
}
