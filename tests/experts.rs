//! Mixtures of experts priced from aiconfigurator's measured MoE table, and
//! expert parallelism (`worker.hw.ep`), by hand.

use crate::fixtures::Spec;
use toml::toml;

fn steps(spec: &Spec) -> Vec<opal::metrics::StepRow> {
    let opts = opal::RunOptions { step_records: true, ..Default::default() };
    opal::simulate_with(&spec.scenario(), &opts).unwrap_or_else(|e| panic!("{e}")).steps
}

/// Qwen3-30B-A3B on two H100s: one prompt of 2,048 tokens, one step.
fn qwen3_prefill(ep: i64) -> f64 {
    let spec = Spec::llama8b()
        .tiers(&[])
        .set("model.model_params.name", "qwen3-30b-a3b")
        .set("worker.hw.tp", 2)
        .set("worker.hw.ep", ep)
        .stage("UniformReqRate", toml! { request_rate = 1.0 total_requests = 1 prompt_size = 2048 output_tokens = 1 });
    let rows = steps(&spec);
    assert_eq!(rows.len(), 1);
    rows[0].duration_s
}

#[test]
fn sharding_the_experts_swaps_the_tp_split_kernel_for_the_expert_parallel_one_and_nothing_else() {
    // aiconfigurator 0.12.0's MoE rows for Qwen3-30B-A3B on H100 (BF16,
    // balanced routing, 2,048 tokens), per MoE layer: 0.36195735 ms with each
    // expert split over 2 GPUs (moe_tp 2), 0.37149866 ms with half the experts
    // on each (moe_ep 2) — asked of its engine, `ops.MoE(...)._engine_query`.
    // The step differs by 48 layers × the difference and by nothing else (the
    // same attention, all-reduces and, with 128 experts on 2 GPUs, memory).
    let (tp_split, ep_split) = (0.3619573513666789e-3, 0.37149866422017414e-3);
    let want = 48.0 * (ep_split - tp_split);
    let got = qwen3_prefill(2) - qwen3_prefill(1);
    assert!((got - want).abs() < 3e-9, "{got} vs {want}");
    assert!((want - 0.457_983e-3).abs() < 1e-9);
}

#[test]
fn an_uneven_expert_split_costs_the_busiest_gpus_memory() {
    // 60 experts over 8 GPUs: vLLM puts 8 on each of the first four and 7 on
    // the others; the KV pool is the busiest GPU's, as if all held 8: 4 more
    // experts a layer than the model has. Qwen3-30B-A3B's expert is
    // 3 × 2,048 × 768 BF16 weights = 9,437,184 B, over 48 layers.
    let mut m = opal::worker::model::ModelArch::preset("qwen3-30b-a3b").unwrap();
    m.moe.as_mut().unwrap().experts = 60;
    assert_eq!(m.expert_parallel_padding_bytes(8), 48 * 4 * 9_437_184);
    assert_eq!(m.expert_parallel_padding_bytes(4), 0); // 15 each
    assert_eq!(m.expert_parallel_padding_bytes(1), 0);
    let dense = opal::worker::model::ModelArch::preset("llama-3.1-8b").unwrap();
    assert_eq!(dense.expert_parallel_padding_bytes(8), 0);
    // In a worker's pool: the weights grow by exactly that, the blocks shrink to fit.
    let pool = opal::worker::model::KvPool::new(&m, 80.0, 8, 0.9, 16);
    let ep = pool.with_experts_over(&m, opal::worker::model::Sharding { tp: 8, ep: 8, dp: 1 });
    assert_eq!(ep.weight_bytes - pool.weight_bytes, 1_811_939_328.0);
    let free = pool.memory_bytes - ep.weight_bytes;
    assert_eq!(ep.blocks, (free / pool.block_bytes as f64).floor() as u64);
    assert!(ep.blocks < pool.blocks);
}

#[test]
fn expert_parallelism_is_refused_where_it_is_not_modelled_naming_the_key() {
    let spec = |model: &str, tp: i64, ep: i64, pp: i64| {
        Spec::llama8b()
            .set("model.model_params.name", model)
            .set("worker.hw.tp", tp)
            .set("worker.hw.ep", ep)
            .set("worker.hw.pp", pp)
            .stage(
                "UniformReqRate",
                toml! { request_rate = 1.0 total_requests = 1 prompt_size = 100 output_tokens = 1 },
            )
    };
    for (s, says) in [
        (spec("llama-3.1-8b", 2, 2, 1), "no experts"),
        (spec("qwen3-30b-a3b", 2, 4, 1), "so ep is tp"),
        (spec("qwen3-30b-a3b", 2, 2, 2), "pipeline stages"),
    ] {
        let file = opal::config::parse_spec(&s.toml(), "ep.toml").unwrap();
        let e = opal::config::resolve(&file, "ep.toml", std::path::Path::new(".")).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("worker.hw.ep"), "{e}");
        assert!(e.to_string().contains(says), "{e}");
    }
    assert!(
        opal::config::resolve(
            &opal::config::parse_spec(&spec("qwen3-30b-a3b", 2, 2, 1).toml(), "ep.toml").unwrap(),
            "ep.toml",
            std::path::Path::new(".")
        )
        .is_ok()
    );
}
