//! Data-parallel attention (`worker.hw.dp_attention`): ranks that step
//! together, each routed to on its own with its own KV cache, and the
//! memory each rank's GPUs keep for KV once the experts are spread.

use crate::fixtures::Spec;
use std::path::Path;
use toml::toml;

/// Qwen3-30B-A3B on ranks of one H100 each, `dp` of them a group, experts over `ep` GPUs.
fn qwen3(dp: i64, ep: i64, workers: i64) -> Spec {
    Spec::llama8b()
        .tiers(&[])
        .set("model.model_params.name", "qwen3-30b-a3b")
        .set("simulation.num_workers", workers)
        .set("worker.hw.dp_attention", dp)
        .set("worker.hw.ep", ep)
}

/// A trace of requests all sent at time 0: (prompt, output) each.
fn trace(name: &str, requests: &[(u32, u32)]) -> String {
    crate::fixtures::trace_at_zero(&crate::temp_dir(name), requests)
}

fn steps(spec: &Spec) -> (Vec<opal::metrics::StepRow>, Vec<opal::metrics::RequestRecord>) {
    let opts = opal::RunOptions { step_records: true, ..Default::default() };
    let out = opal::simulate_with(&spec.scenario(), &opts).unwrap_or_else(|e| panic!("{e}"));
    (out.steps, out.requests)
}

#[test]
fn ranks_step_together_so_the_slowest_sets_the_pace_and_an_idle_rank_runs_dummy_batches() {
    // A 6,000-token prompt on rank 0 and a 100-token one on rank 1, sent
    // together: the short prompt's first token comes with the long one's,
    // at the end of their one shared step. Then rank 0 decodes 19 more
    // tokens and rank 1, done, runs a dummy batch beside each.
    let file = trace("dp-lockstep", &[(6000, 20), (100, 1)]);
    let stage = toml! { trace_file = file chunk_size = 512 };
    let group = qwen3(2, 2, 2).set("router.router_params.policy", "RoundRobin").stage("Trace", stage.clone());
    let (rows, reqs) = steps(&group);
    let ttft = |w: u32| reqs.iter().find(|r| r.worker == Some(w)).unwrap().ttft_s.unwrap();
    assert_eq!(ttft(0), ttft(1));
    let first: Vec<_> = rows.iter().filter(|r| r.start_s == 0.0).collect();
    assert_eq!(first.len(), 2);
    assert!(first.iter().all(|r| r.duration_s == ttft(0)));
    let rank = |w: u32| rows.iter().filter(move |r| r.worker == w);
    assert_eq!(rank(0).count(), 20);
    assert_eq!(rank(1).count(), 20);
    let dummies: Vec<_> = rank(1).filter(|r| r.prefill_chunks == 0 && r.decodes == 0).collect();
    assert_eq!(dummies.len(), 19);
    for (a, b) in rank(0).zip(rank(1)) {
        assert_eq!((a.start_s, a.duration_s), (b.start_s, b.duration_s));
    }
    // The same two ranks stepping apart (two engines of one H100, each
    // with all the experts): the short prompt is answered far sooner.
    let apart = Spec::llama8b()
        .tiers(&[])
        .set("model.model_params.name", "qwen3-30b-a3b")
        .set("simulation.num_workers", 2)
        .set("router.router_params.policy", "RoundRobin")
        .stage("Trace", stage);
    let (_, alone) = steps(&apart);
    let short = alone.iter().find(|r| r.worker == Some(1)).unwrap().ttft_s.unwrap();
    assert!(short * 3.0 < ttft(1), "{short} vs {}", ttft(1));
}

#[test]
fn every_rank_is_an_engine_the_router_sees_with_a_cache_of_its_own() {
    // Eight requests sharing nothing, RoundRobin over 4 ranks: two each.
    let file = trace("dp-engines", &[(500, 4); 8]);
    let out = qwen3(4, 4, 4)
        .set("router.router_params.policy", "RoundRobin")
        .stage("Trace", toml! { trace_file = file chunk_size = 512 })
        .run();
    for w in 0..4 {
        assert_eq!(out.requests.iter().filter(|r| r.worker == Some(w)).count(), 2, "rank {w}");
    }
    assert_eq!(out.workers.len(), 4);
}

#[test]
fn each_rank_keeps_for_kv_what_its_share_of_the_experts_leaves() {
    // Qwen3-30B-A3B: 30,532,122,624 BF16 parameters = 61,064,245,248 B, of
    // which the routed experts are 48 layers × 128 × 3 × 2,048 × 768 × 2 B
    // = 57,982,058,496 B. A rank of one 80 GiB H100 at 90 % has
    // 77,309,411,328 B; KV is 48 × 2 × 4 × 128 × 2 = 98,304 B a token,
    // 1,572,864 B a block of 16.
    let model = opal::worker::model::ModelArch::preset("qwen3-30b-a3b").unwrap();
    assert_eq!(model.weight_bytes(), 61_064_245_248);
    assert_eq!(model.routed_expert_bytes(), 57_982_058_496.0);
    let blocks = |weights: f64| ((77_309_411_328.0 - weights) / 1_572_864.0f64).floor() as u64;
    // Alone, a GPU holds every expert.
    assert_eq!(qwen3(1, 1, 1).scenario().worker.total_blocks, blocks(61_064_245_248.0));
    // Four ranks: a quarter of the experts each, 17,577,701,376 B of weights;
    // whole experts (ep 4) or each split four ways (ep 1) weigh the same.
    assert_eq!(qwen3(4, 4, 4).scenario().worker.total_blocks, 37_976);
    assert_eq!(blocks(17_577_701_376.0), 37_976);
    assert_eq!(qwen3(4, 1, 4).scenario().worker.total_blocks, 37_976);
    // Six ranks: 128 experts do not divide by 6; each GPU holds 22 slots, the
    // busiest's, 4 more a layer than the model has (48 × 4 × 9,437,184 B,
    // a sixth each): 61,064,245,248 − 5/6 × 57,982,058,496 + 301,989,888.
    assert_eq!(qwen3(6, 6, 6).scenario().worker.total_blocks, blocks(13_047_853_056.0));
    assert_eq!(blocks(13_047_853_056.0), 40_856);
}

#[test]
fn data_parallel_attention_is_refused_where_it_is_not_modelled_naming_the_key() {
    let base = |dp: i64| qwen3(dp, 1, 4).stage("UniformReqRate", toml! { request_rate = 1.0 total_requests = 2 });
    let err = |spec: Spec| crate::scenario_err(&spec.toml());
    let cases = [
        (base(4).set("model.model_params.name", "llama-3.1-8b"), "worker.hw.dp_attention", "dense"),
        (base(4).set("worker.hw.ep", 2), "worker.hw.ep", "dp_attention × tp"),
        (base(4).set("worker.hw.pp", 2), "worker.hw.dp_attention", "pipeline"),
        (base(4).set("worker.vllm_params.scheduler", "v0"), "worker.hw.dp_attention", "v0"),
        // A misspelt scheduler is named as such, not refused as v0.
        (base(4).set("worker.vllm_params.scheduler", "v2"), "worker.vllm_params.scheduler", "unknown scheduler"),
        (base(4).set("worker.inference_params.model", "roofline"), "worker.hw.dp_attention", "roofline"),
        (base(4).set("worker.hw.all2all_backend", "pplx"), "worker.hw.all2all_backend", "unknown backend"),
        (base(1).set("worker.hw.dp_link_GBps", 50.0), "worker.hw.dp_link_GBps", "off"),
        (base(3), "simulation.num_workers", "whole data-parallel groups"),
        (base(4).set("router.router_params.enable_scaling", true), "worker.hw.dp_attention", "autoscaling"),
    ];
    for (spec, key, says) in cases {
        let e = err(spec);
        assert_eq!(e.key.as_deref(), Some(key), "{e}");
        assert!(e.to_string().contains(says), "{e}");
    }
}

#[test]
fn the_shipped_example_keeps_on_each_rank_more_kv_than_a_tp_engine_keeps_in_all() {
    // README ("Data-parallel attention"): DeepSeek-V3 on eight H200s keeps
    // 504,000 tokens of KV on each of eight ranks, 741,600 as one TP 8
    // engine (the latent whole on every GPU).
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/dp-attention/deepseek-v3-8xh200.toml"),
    )
    .unwrap();
    let ranks = crate::scenario(&text);
    assert_eq!(ranks.worker.total_blocks * 16, 504_000);
    let tp = text
        .replace("num_workers = 8", "num_workers = 1")
        .replace("tp = 1", "tp = 8")
        .replace("dp_attention = 8", "dp_attention = 1");
    assert_eq!(crate::scenario(&tp).worker.total_blocks * 16, 741_600);
}
