//! Whole-scenario behaviour with exact expectations.

use crate::fixtures::Spec;
use opal::time::SimDuration;
use toml::toml;

/// Seconds → ns, rounded up, as the simulator converts step times.
fn ns(secs: f64) -> u64 {
    SimDuration::from_secs_f64(secs).0
}

#[test]
fn one_request_through_an_idle_worker_has_the_hand_computed_roofline_ttft_and_e2e() {
    let out = Spec::llama8b()
        .set("worker.inference_params.model", "roofline")
        .stage(
            "UniformReqRate",
            toml! {
                total_requests = 1
                prompt_size_min = 1000
                prompt_size_max = 1000
                output_tokens_min = 4
                output_tokens_max = 4
            },
        )
        .run();
    let r = &out.requests[0];
    // Llama-3.1-8B: L = 32, d = 4096, 8,030,261,248 parameters × 2 B, 131,072 KV B/token.
    // H100 (datasheet): 989.5 TFLOP/s dense BF16, 3.35 TB/s. Opal's a = 4, b = 24.
    let flops = 989.5e12;
    let bw = 3.35e12;
    let weights = 8_030_261_248.0 * 2.0;
    let prefill = 32.0 * (4.0 * 1000.0 * 1001.0 * 4096.0 + 24.0 * 1000.0 * 4096.0 * 4096.0) / flops; // ≈ 13.3 ms
    let weights_only = weights / bw; // ≈ 4.79 ms, less than the prefill
    assert!(prefill > weights_only);
    // Step 1 is the prefill and yields token 1; steps 2–4 decode with 1000, 1001, 1002 cached tokens.
    let decode = |ctx: f64| (weights + 131_072.0 * ctx) / bw;
    let ttft = ns(prefill);
    let e2e = ttft + ns(decode(1000.0)) + ns(decode(1001.0)) + ns(decode(1002.0));
    assert_eq!(SimDuration::from_secs_f64(r.ttft_s.unwrap()).0.abs_diff(ttft), 0, "TTFT");
    assert_eq!((r.e2e_s.unwrap() * 1e9).round() as u64, e2e, "E2E");
    assert_eq!(r.queue_wait_s, Some(0.0));
    assert_eq!(out.summary.requests_completed, 1);
}

#[test]
fn same_scenario_and_seed_give_identical_summaries_and_event_digests() {
    let spec = Spec::empty()
        .set("simulation.num_workers", 3)
        .set("simulation.seed", 7)
        .set("model.model_params.name", "qwen2.5-7b")
        .set("router.router_params.policy", "Random")
        .stage(
            "ExponentialReqRate",
            toml! {
                request_rate = 30.0
                total_requests = 600
                prompt_size_min = 100
                prompt_size_max = 6000
            },
        );
    let a = spec.run();
    let b = spec.run();
    assert_eq!(a.event_digest, b.event_digest);
    assert_eq!(serde_json::to_string(&a.summary).unwrap(), serde_json::to_string(&b.summary).unwrap());
    assert_eq!(a.requests, b.requests);
    let other = spec.set("simulation.seed", 8).run();
    assert_ne!(a.event_digest, other.event_digest, "a different seed must change the run");
}

#[test]
fn every_generated_request_completes_and_tokens_are_conserved() {
    let out = Spec::llama8b()
        .set("simulation.num_workers", 2)
        .set("worker.vllm_params.max_num_batched_tokens", 2048)
        .stage("ExponentialReqRate", toml! { request_rate = 8.0 total_requests = 300 })
        .stage("UniformReqRate", toml! { request_rate = 4.0 total_requests = 50 })
        .run();
    assert_eq!(out.summary.requests_generated, 350);
    assert_eq!(out.summary.requests_completed, 350);
    assert!(out.requests.iter().all(|r| r.completed));
    // Every prompt token is either found cached or computed (computed again only after preemption).
    let prompts: u64 = out.requests.iter().map(|r| u64::from(r.prompt_tokens)).sum();
    let hits: u64 = out.requests.iter().map(|r| r.hit_tokens.iter().sum::<u64>()).sum();
    assert!(hits > 0, "the stages share a 1024-token prefix");
    assert!(
        out.requests.iter().all(|r| r.hit_tokens.iter().sum::<u64>() < u64::from(r.prompt_tokens)),
        "hits never cover the last token"
    );
    assert!(out.summary.prefill_tokens_computed + hits >= prompts);
    if out.summary.preemptions == 0 {
        assert_eq!(out.summary.prefill_tokens_computed + hits, prompts);
    }
    // Time series counts add up to the totals.
    let generated: u64 = out.series.iter().map(|r| r.generated_tokens).sum();
    let outputs: u64 = out.requests.iter().map(|r| u64::from(r.output_tokens)).sum();
    assert_eq!(generated, outputs);
    assert_eq!(out.series.iter().map(|r| r.requests_completed).sum::<u64>(), 350);
    // Stage 1 starts only after stage 0's last request completed.
    let last_stage0 =
        out.requests.iter().filter(|r| r.stage == 0).map(|r| r.arrival_s + r.e2e_s.unwrap()).fold(0.0, f64::max);
    let first_stage1 = out.requests.iter().filter(|r| r.stage == 1).map(|r| r.arrival_s).fold(f64::INFINITY, f64::min);
    assert!((first_stage1 - last_stage0).abs() < 1e-9, "{first_stage1} vs {last_stage0}");
}

#[test]
fn simulation_time_stops_the_run_and_reports_unfinished_requests() {
    let out = Spec::empty()
        .set("simulation.simulation_time", 5.0)
        .stage("UniformReqRate", toml! { request_rate = 50.0 total_requests = -1 })
        .run();
    assert_eq!(out.summary.sim_time_s, 5.0);
    // The run covers [0, 5 s): arrivals at 0, 0.02, …, 4.98 — 250 requests.
    assert_eq!(out.summary.requests_generated, 250);
    assert!(out.summary.requests_incomplete > 0);
    assert_eq!(out.summary.requests_generated, out.summary.requests_completed + out.summary.requests_incomplete);
    assert_eq!(out.series.len(), 5);
}

#[test]
fn a_mixture_of_experts_computes_its_active_experts_and_reads_the_experts_it_touches() {
    let out = Spec::empty()
        .set("model.model_params.name", "mixtral-8x7b")
        .set("worker.inference_params.model", "roofline")
        .set("worker.hw.gpu", "H100")
        .set("worker.hw.tp", 2)
        .stage("UniformReqRate", toml! { total_requests = 1 prompt_size = 1000 output_tokens = 3 })
        .run();
    let r = &out.requests[0];
    // Mixtral-8x7B: 32 layers, d = 4096, 32 heads of 128, 8 experts of 3·4096·14336 weights, top-2.
    let (attn, expert) = (41_943_040.0, 176_160_768.0);
    let total = 2.0 * 32_000.0 * 4096.0 + 32.0 * (attn + 8.0 * expert + 4096.0 * 8.0 + 2.0 * 4096.0) + 4096.0;
    // 2 × H100: 2 × 989.5 TFLOP/s, 2 × 3.35 TB/s. The dense term counts the
    // active weights per layer (attention + 2 experts) / 12 in place of d².
    let (flops, bw) = (2.0 * 989.5e12, 2.0 * 3.35e12);
    let linear_d2 = 32.0 * (attn + 2.0 * expert) / 12.0;
    let prefill = (4.0 * 4096.0 * 1000.0 * 1001.0 * 32.0 + 24.0 * linear_d2 * 1000.0) / flops;
    // The prefill step's 1000 tokens touch all 8 experts of every layer
    // (8·(1 − (3/4)^1000) = 8): all 2·total weight bytes are read.
    let touched = |tokens: f64| 8.0 * (1.0 - 0.75f64.powf(tokens));
    let weights = |tokens: f64| 2.0 * (total - 32.0 * expert * (8.0 - touched(tokens)));
    assert!((weights(1000.0) - 2.0 * total).abs() < 1.0);
    let ttft = ns(prefill.max(weights(1000.0) / bw));
    // Each decode step's one token touches 2 experts per layer.
    let decode = |ctx: f64| (weights(1.0) + 131_072.0 * ctx) / bw;
    let e2e = ttft + ns(decode(1000.0)) + ns(decode(1001.0));
    assert_eq!(SimDuration::from_secs_f64(r.ttft_s.unwrap()).0, ttft, "TTFT");
    assert_eq!((r.e2e_s.unwrap() * 1e9).round() as u64, e2e, "E2E");
    assert_eq!(out.summary.model_params, total as u64);
}

/// The next two tests' scenario: one request of 1,000 prompt tokens and one
/// output token on one H100 with a synthetic 1 s step, GPU cache only.
fn one_step() -> Spec {
    Spec::llama8b()
        .set("worker.inference_params.model", "synthetic")
        .set("worker.inference_params.mean_latency_secs", 1.0)
        .tiers(&[])
        .stage("UniformReqRate", toml! { total_requests = 1 prompt_size = 1000 output_tokens = 1 })
}

#[test]
fn busy_time_and_the_share_of_peak_compute_differ_as_hand_computed_for_one_step() {
    // One request of 1,000 prompt tokens and one output token on one H100
    // with a synthetic 1 s step: one prefill step, busy all of its second.
    let out = one_step().run().summary;
    // Llama-3.1-8B: 32 layers, attention width 32 × 128 = 4,096, d = 4,096.
    // Attention: 4·d per causal pair per layer, 1000·1001/2 pairs.
    let attention = 4.0 * 4096.0 * 32.0 * (1000.0 * 1001.0 / 2.0);
    // Linear layers: the roofline's 24·d² per layer and token.
    let linear = 24.0 * 32.0 * 4096.0 * 4096.0 * 1000.0;
    let h100 = opal::worker::presets::GpuSpec::preset("H100").unwrap();
    let compute_secs = (attention + linear) / (h100.tflops * 1e12); // dense BF16 peak (989.5 TFLOP/s)
    // HBM: every weight once, the 1,000 tokens' KV (32 layers × 8 KV heads × 128 × K and V × 2 B).
    let weights = opal::worker::model::ModelArch::preset("llama-3.1-8b").unwrap().weight_bytes() as f64;
    let memory_secs = (weights + 1000.0 * 131_072.0) / (h100.mem_bw_tbps * 1e12);
    let worker_secs = out.sim_time_s;
    assert!((out.gpu_busy_fraction - 1.0 / worker_secs).abs() < 1e-9, "{}", out.gpu_busy_fraction);
    assert!(
        (out.gpu_compute_fraction - compute_secs / worker_secs).abs() < 1e-9,
        "{} vs {} ({} s)",
        out.gpu_compute_fraction,
        compute_secs / worker_secs,
        worker_secs
    );
    assert!((out.gpu_hbm_fraction - memory_secs / worker_secs).abs() < 1e-9, "{}", out.gpu_hbm_fraction);
    // A GPU busy every second of a step used 1.3 % of its compute.
    assert!((compute_secs - 0.01328).abs() < 1e-4, "{compute_secs}");
}

#[test]
fn energy_and_dollars_follow_the_board_power_model_by_hand() {
    // The one-step run above, with the board power and a price given: a
    // 600 W GPU that idles at 100 W, draws 200 W while a step runs plus
    // 800 W × its share of peak FLOP/s and 400 W × its share of peak HBM
    // bandwidth, at $3 per GPU-hour.
    let out = one_step()
        .table(
            "worker.hw",
            toml! {
                max_watts = 600
                idle_watts = 100
                active_watts = 200
                compute_watts = 800
                memory_watts = 400
                usd_per_gpu_hour = 3.0
            },
        )
        .run();
    let sum = &out.summary;
    // The step's FLOPs at the peak (the busy test's 13.3 ms of the 1 s
    // step) and its bytes (16 GB of weights + KV at 3.35 TB/s ≈ 4.8 ms).
    let h100 = opal::worker::presets::GpuSpec::preset("H100").unwrap();
    let compute =
        (4.0 * 4096.0 * 32.0 * (1000.0 * 1001.0 / 2.0) + 24.0 * 32.0 * 4096.0 * 4096.0 * 1000.0) / (h100.tflops * 1e12);
    let weights = opal::worker::model::ModelArch::preset("llama-3.1-8b").unwrap().weight_bytes() as f64;
    let memory = (weights + 1000.0 * 131_072.0) / (h100.mem_bw_tbps * 1e12);
    let t = sum.sim_time_s;
    // Idle power outside the step; in it 200 W × 1 s + 800 W × compute + 400 W × memory
    // (≈ 212.6 J, below the board's 600 J for the second).
    let step = 200.0 + 800.0 * compute + 400.0 * memory;
    assert!(step < 600.0);
    let joules = 100.0 * (t - 1.0) + step;
    assert!((sum.cost.energy_j - joules).abs() < 1e-6, "{} vs {joules}", sum.cost.energy_j);
    assert!((sum.cost.gpu_hours - t / 3600.0).abs() < 1e-12);
    assert!((sum.cost.usd - 3.0 * t / 3600.0).abs() < 1e-12);
    let cols: std::collections::BTreeMap<String, f64> = sum
        .columns()
        .into_iter()
        .filter_map(|(n, v)| match v {
            opal::metrics::SummaryValue::Real(x) => Some((n, x)),
            _ => None,
        })
        .collect();
    assert!((cols["energy_kwh"] - joules / 3.6e6).abs() < 1e-12);
    assert!((cols["joules_per_output_token"] - joules).abs() < 1e-6, "one output token");
    assert!((cols["usd_per_m_output_tokens"] - 3.0 * t / 3600.0 * 1e6).abs() < 1e-6);
    assert!((cols["usd_per_m_input_tokens"] - 3.0 * t / 3600.0 / 1000.0 * 1e6).abs() < 1e-6);
    assert_eq!(out.workers[0].cost, sum.cost, "one worker: its row is the run's");
    // Without a price there are no dollars (null in the tables).
    let free = Spec::llama8b().stage("UniformReqRate", toml! { total_requests = 1 });
    assert!(free.run().summary.cost.usd.is_nan());
}

#[test]
fn tier_capacity_is_priced_per_gib_hour_beside_the_gpus() {
    // The one-step run on two workers, each with a 64 GiB CPU tier at
    // $0.004 per GiB-hour drawing 0.375 W per GiB, and one shared 1,000 GiB
    // DFS at $0.0002 per GiB-hour; GPUs at $3 per GPU-hour. Dollars =
    // GPU-hours × 3 + Σ tier GiB-hours × price; the tiers' watts add to the energy.
    let priced = one_step()
        .set("simulation.num_workers", 2)
        .tiers(&["CPUMemory", "DistributedFS"])
        .set("worker.hw.usd_per_gpu_hour", 3.0)
        .table("kvc.CPUMemory", toml! { capacity_GB = 64 usd_per_gb_hour = 0.004 watts_per_gb = 0.375 })
        .table("kvc.DistributedFS", toml! { capacity_GB = 1000 usd_per_gb_hour = 0.0002 });
    let sum = priced.clone().run().summary;
    let hours = sum.sim_time_s / 3600.0;
    let (cpu, dfs) = (2.0 * 64.0 * hours, 1000.0 * hours);
    assert_eq!(sum.tier_cost.gib_hours, [cpu, 0.0, dfs]);
    let tiers = cpu * 0.004 + dfs * 0.0002;
    assert!((sum.tier_cost.usd - tiers).abs() < 1e-15);
    assert!((sum.cost.usd - (2.0 * hours * 3.0 + tiers)).abs() < 1e-12, "{}", sum.cost.usd);
    // The same run without tier prices: the energy differs by the CPU tiers' 48 W.
    let unpriced = priced
        .table("kvc.CPUMemory", toml! { usd_per_gb_hour = 0.0 watts_per_gb = 0.0 })
        .table("kvc.DistributedFS", toml! { usd_per_gb_hour = 0.0 })
        .run()
        .summary;
    assert_eq!(unpriced.tier_cost.usd, 0.0);
    assert!((unpriced.cost.usd - 2.0 * hours * 3.0).abs() < 1e-12);
    let tier_joules = 2.0 * 64.0 * 0.375 * sum.sim_time_s;
    assert!((sum.cost.energy_j - unpriced.cost.energy_j - tier_joules).abs() < 1e-6);
    // Per GPU the power is the GPUs' alone: the tiers' watts are their own column.
    let column = |s: &opal::metrics::RunSummary, name: &str| match s.columns().into_iter().find(|(n, _)| n == name) {
        Some((_, opal::metrics::SummaryValue::Real(v))) => v,
        other => panic!("{name}: {other:?}"),
    };
    assert!((column(&sum, "mean_power_w") - column(&unpriced, "mean_power_w")).abs() < 1e-9);
    assert!((column(&sum, "tier_energy_kwh") - tier_joules / 3.6e6).abs() < 1e-15);
    assert_eq!(column(&unpriced, "tier_energy_kwh"), 0.0);
}

#[test]
fn each_stage_row_equals_what_its_requests_say() {
    // Two stages back to back: a busy one and a light one.
    let out = Spec::llama8b()
        .set("simulation.num_workers", 2)
        .set("simulation.seed", 3)
        .stage(
            "ExponentialReqRate",
            toml! {
                request_rate = 40.0
                total_requests = 300
                prompt_size_min = 200
                prompt_size_max = 2000
                output_tokens_min = 10
                output_tokens_max = 80
            },
        )
        .stage(
            "UniformReqRate",
            toml! {
                request_rate = 2.0
                total_requests = 20
                prompt_size_min = 100
                prompt_size_max = 4000
                output_tokens_min = 20
                output_tokens_max = 20
            },
        )
        .run();
    assert_eq!(out.stages.len(), 2);
    assert_eq!((out.stages[0].kind, out.stages[1].kind), ("ExponentialReqRate", "UniformReqRate"));
    for (i, row) in out.stages.iter().enumerate() {
        let reqs: Vec<_> = out.requests.iter().filter(|r| r.stage == i as u32).collect();
        let done: Vec<_> = reqs.iter().filter(|r| r.completed).collect();
        assert_eq!(row.requests_generated, reqs.len() as u64, "stage {i}");
        assert_eq!(row.requests_completed, done.len() as u64, "stage {i}");
        // Span: first arrival to last response; rates over it.
        let start = reqs.iter().map(|r| r.arrival_s).fold(f64::INFINITY, f64::min);
        let end = done.iter().map(|r| r.arrival_s + r.e2e_s.unwrap()).fold(0.0, f64::max);
        assert!((row.start_s - start).abs() < 1e-9 && (row.end_s - end).abs() < 1e-6, "stage {i} span");
        let out_tokens: u64 = done.iter().map(|r| u64::from(r.output_tokens)).sum();
        assert!((row.output_tokens_per_s - out_tokens as f64 / (end - start)).abs() < 1e-6 * row.output_tokens_per_s);
        let prompt: u64 = done.iter().map(|r| u64::from(r.prompt_tokens)).sum();
        let hits: u64 = done.iter().map(|r| r.hit_tokens.iter().sum::<u64>()).sum();
        assert!((row.prefix_hit_ratio - hits as f64 / prompt as f64).abs() < 1e-12);
        // Exact mean and max of TTFT and E2E from the requests (ms; the
        // records round to ns like the histograms' exact sums).
        let ttft: Vec<f64> = done.iter().map(|r| r.ttft_s.unwrap() * 1e3).collect();
        let e2e: Vec<f64> = done.iter().map(|r| r.e2e_s.unwrap() * 1e3).collect();
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        assert!((row.ttft_ms.mean - mean(&ttft)).abs() < 1e-6, "stage {i} TTFT mean");
        assert!((row.ttft_ms.max - max(&ttft)).abs() < 1e-6, "stage {i} TTFT max");
        assert!((row.e2e_ms.mean - mean(&e2e)).abs() < 1e-6, "stage {i} E2E mean");
        assert!(row.ttft_ms.p99 <= row.ttft_ms.max);
    }
    // The stages add up to the run.
    let completed: u64 = out.stages.iter().map(|r| r.requests_completed).sum();
    assert_eq!(completed, out.summary.requests_completed);
}

/// The digest of the shipped Opal example (`examples/opal/exponential-12rps.json`)
/// as imported: the a/b roofline, with the original's KV and batch rules
/// (since issue 35: KV stored at completion, hits copied nowhere, a
/// batch's prefill priced as its longest request's) and partial chunks
/// keyed by their exact tokens (issue 24); since issue 38, a decode run
/// is priced as pieces (its sub-steps within 1 ns of their own prices, the
/// run lasting until a member finishes), which moves step ends by
/// nanoseconds and drops the events of the shorter runs it used to plan.
/// (Also since issue 38 the digest folds each of an event's integers in
/// whole instead of FNV-1a's byte at a time: the same event sequence, whose
/// FNV-1a digests were 5_669_234_544_589_373_641 here and
/// 5_916_224_502_790_896_345 below, checked on the same build.)
const OPAL_EXAMPLE_DIGEST: u64 = 9_273_085_745_743_088_789;

/// The same with partial chunks keyed by their full blocks
/// (`kvc.partial_chunk_key = "blocks"`), as the roofline ran it before the
/// operator-level step model became the default — except that, since issue
/// 26, a save no longer refreshes the recency of chunks a tier already
/// holds and a request refreshes its held prefix once, when it is scheduled
/// (LMCache's put of a held key changes nothing; the original Opal's store
/// keeps no recency at all), which moves its CPU tier's evictions; and,
/// since issue 35, a tier load starts only when its first chunk's blocks fit
/// beside those promised to the loads ahead, as the original's FIFO batch
/// scan stops at the first ready request that does not fit.
const OPAL_EXAMPLE_DIGEST_BLOCK_KEYS: u64 = 11_042_142_112_715_314_431;

#[test]
fn the_shipped_opal_example_runs_the_roofline_exactly_as_before() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/opal/exponential-12rps.json");
    let spec = opal::config::load_spec(&path).unwrap_or_else(|e| panic!("{e}"));
    let plan = opal::sweep::plan(&spec).unwrap_or_else(|e| panic!("{e}"));
    let run = plan.runs().next().unwrap();
    let mut scenario = opal::sweep::run_scenario(&run).unwrap();
    assert_eq!(scenario.kvc.save_timing, opal::kvcache::SaveTiming::OnFinish, "the original's save rule");
    let out = opal::simulate(&scenario).unwrap();
    assert_eq!(out.event_digest, OPAL_EXAMPLE_DIGEST, "{} requests", out.summary.requests_completed);
    scenario.kvc.partial_chunks = opal::kvcache::PartialChunks::FullBlocks;
    assert_eq!(opal::simulate(&scenario).unwrap().event_digest, OPAL_EXAMPLE_DIGEST_BLOCK_KEYS);
}

#[test]
fn the_steps_table_holds_every_step_with_its_work_and_how_its_time_divides() {
    let run = |spec: Spec| {
        let s = spec
            .tiers(&[])
            .stage(
                "UniformReqRate",
                toml! {
                    request_rate = inf
                    total_requests = 2
                    prompt_size = 300
                    output_tokens = 3
                    default_prefix_length = 0
                },
            )
            .scenario();
        opal::simulate_with(&s, &opal::RunOptions { step_records: true, ..Default::default() }).unwrap()
    };
    // Synthetic 10 ms steps: both prompts prefill in the first step (their first tokens),
    // then two decode steps over 300 and 301 cached tokens each.
    let out = run(Spec::llama8b()
        .set("worker.inference_params.model", "synthetic")
        .set("worker.inference_params.mean_latency_secs", 0.01));
    let rows: Vec<_> = out
        .steps
        .iter()
        .map(|s| {
            (s.start_s, s.duration_s, s.kind(), s.prefill_chunks, s.prefill_tokens, s.decodes, s.decode_context_tokens)
        })
        .collect();
    assert_eq!(
        rows,
        [
            (0.0, 0.01, "prefill", 2, 600, 0, 0),
            (0.01, 0.01, "decode", 0, 0, 2, 600),
            (0.02, 0.01, "decode", 0, 0, 2, 602)
        ]
    );
    assert!(out.steps.iter().all(|s| s.cpu_s.is_none()), "only the operators model divides its time");
    // The operators model: each step's duration is the longer of its GPU parts' sum and its CPU part.
    let out = run(Spec::llama8b());
    assert_eq!(out.steps.len(), 3);
    for s in &out.steps {
        let gpu = s.gpu_compute_s.unwrap() + s.gpu_memory_s.unwrap() + s.gpu_comm_s.unwrap();
        assert!((gpu.max(s.cpu_s.unwrap()) - s.duration_s).abs() < 2e-9, "{s:?}");
    }
    let busy: f64 = out.steps.iter().map(|s| s.duration_s).sum();
    assert!((busy - out.workers[0].busy_s).abs() < 1e-9);
    // Without asking, no rows.
    assert!(Spec::empty().stage("UniformReqRate", toml::Table::new()).run().steps.is_empty());
}

/// DistServe's goodput by hand: ten one-token requests at t = 0 on one
/// worker that serves one at a time in 10 ms synthetic steps; request k's
/// TTFT is 10·(k + 1) ms. With `slo_ttft_ms = 45`, four meet it: attainment
/// 0.4, goodput 4 requests over the 0.1 s run = 40 per second. A TPOT
/// target alone is met by every one-token answer; without a target both
/// columns are NaN (null in the tables).
#[test]
fn slo_attainment_and_goodput_count_the_requests_that_meet_the_per_request_slo() {
    let burst = Spec::empty()
        .set("worker.inference_params.model", "synthetic")
        .set("worker.inference_params.mean_latency_secs", 0.01)
        .set("worker.vllm_params.max_num_seqs", 1)
        .tiers(&[])
        .stage(
            "UniformReqRate",
            toml! {
                request_rate = inf
                total_requests = 10
                prompt_size_min = 16
                prompt_size_max = 16
                output_tokens_min = 1
                output_tokens_max = 1
            },
        );
    let s = burst.clone().set("simulation.slo_ttft_ms", 45.0).run().summary;
    assert_eq!(s.sim_time_s, 0.1);
    assert_eq!(s.slo_attainment, 0.4);
    assert!((s.goodput_rps - 40.0).abs() < 1e-9, "{}", s.goodput_rps);
    let tpot_only = burst.clone().set("simulation.slo_tpot_ms", 1.0).run().summary;
    assert_eq!(tpot_only.slo_attainment, 1.0);
    let none = burst.run().summary;
    assert!(none.slo_attainment.is_nan() && none.goodput_rps.is_nan());
}

/// 40 random configurations — both schedulers, chunked prefill on and off,
/// budgets from 256 tokens, tiers, prefix caching, P/D pools with their own
/// budgets — each run with its steps kept.
#[test]
fn no_step_holds_more_than_the_token_budget_and_only_v0_without_chunking_never_mixes() {
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = |lo: u64, hi: u64| {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        lo + (x >> 33) % (hi - lo + 1)
    };
    let (mut v0_mixed, mut v0_chunked_runs) = (0, 0);
    for case in 0..40 {
        let v0 = next(0, 1) == 1;
        let chunked = next(0, 1) == 1;
        let seqs = next(4, 64);
        let max_len = 4096;
        let budget = if chunked { next(seqs.max(256), 8192) } else { next(max_len, 12_000) };
        let pd = next(0, 3) == 0;
        let tiers = if next(0, 1) == 1 { "[\"CPUMemory\"]" } else { "[]" };
        let caching = next(0, 1) == 1;
        let scheduler = if v0 { "v0" } else { "v1" };
        let pools = if pd {
            let prefill_budget = if chunked { next(seqs.max(256), 8192) } else { max_len };
            format!(
                "[disaggregation]\nmax_local_prefill_length = 300\n[disaggregation.prefill]\ncount = 1\nvllm_params = {{ max_num_batched_tokens = {prefill_budget} }}\n[disaggregation.decode]\ncount = 1\n"
            )
        } else {
            "[simulation]\nnum_workers = 2\n".to_string()
        };
        let text = format!(
            r#"
            {pools}
            [model.model_params]
            name = "llama-3.1-8b"
            [worker.vllm_params]
            scheduler = "{scheduler}"
            chunked_prefill = {chunked}
            max_num_seqs = {seqs}
            max_num_batched_tokens = {budget}
            max_model_len = {max_len}
            enable_prefix_caching = {caching}
            [kvc]
            kvc_tiers = {tiers}
            [[workload.stages]]
            type = "ExponentialReqRate"
            [workload.stages.workload_params]
            request_rate = {}
            total_requests = 150
            prompt_size_min = 16
            prompt_size_max = 3000
            output_tokens_min = 1
            output_tokens_max = 300
            "#,
            next(5, 60)
        );
        let s = crate::scenario(&text);
        let opts = opal::RunOptions { step_records: true, ..Default::default() };
        let out = opal::simulate_with(&s, &opts).unwrap_or_else(|e| panic!("case {case}: {e}"));
        assert_eq!(out.summary.requests_completed, 150, "case {case}");
        for step in &out.steps {
            let cap = s.worker_config(step.worker as usize).token_budget;
            let tokens = step.prefill_tokens + step.decodes;
            assert!(tokens <= cap, "case {case}: a step of {tokens} tokens with a budget of {cap}:\n{text}");
            let mixed = step.prefill_tokens > 0 && step.decodes > 0;
            // (A handed-over request's first step on a P/D decode worker is a
            // decode priced with the prefills beside it: v0 schedules it as a
            // prompt whose KV is all there.)
            if v0 && !chunked && !pd {
                assert!(!mixed, "case {case}: v0 without chunked prefill mixed a step:\n{text}");
            }
            v0_mixed += u64::from(v0 && chunked && mixed);
        }
        v0_chunked_runs += u64::from(v0 && chunked);
    }
    assert!(
        v0_chunked_runs > 0 && v0_mixed > 0,
        "v0 with chunked prefill mixes steps ({v0_mixed} in {v0_chunked_runs} runs)"
    );
}

#[test]
fn a_batch_1_decode_of_llama_2_7b_on_a100_grows_with_its_context_as_flashattention_measured() {
    // Vidur's measured FlashAttention rows (A100, Llama-2-7B, 32 layers): a
    // batch-1 decode step's attention grows by ≈ 1.7 ms from 128 keys to
    // 4,032. The shipped A100 tables measure multi-head attention up to 8
    // heads; Llama-2-7B's 32 are priced from the 32-query-head rows by their
    // KV bytes, the fixed cost once (issue 35: it grew by 10.4 ms).
    let s = crate::scenario(
        r#"
        [model.model_params]
        name = "llama-2-7b"
        [worker.hw]
        gpu = "A100-80G"
        [worker.vllm_params]
        max_model_len = 4096
        [[workload.stages]]
        type = "UniformReqRate"
        [workload.stages.workload_params]
        prompt_size_min = 100
        prompt_size_max = 1000
        "#,
    );
    let step = |ctx: u64| {
        let work = opal::worker::perf::StepWork {
            prefill: &[],
            decodes: 1,
            drafts: 0,
            decode_context_tokens: ctx,
            decode_window_tokens: ctx,
            samples: 1,
        };
        s.worker.perf.step_time(&work).as_secs_f64()
    };
    let growth = step(4032) - step(128);
    assert!(growth > 1e-3 && growth <= 3e-3, "{:.3} ms", growth * 1e3);
}
