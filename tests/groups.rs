//! Worker groups, by hand: a fleet of unequal workers sized and priced
//! group by group, each worker's capacity estimated from the step model,
//! and load-based routing dividing each worker's load by it.

use crate::fixtures::Spec;
use opal::router::LoadScale;
use toml::toml;

/// Llama-3.1-8B with no tiers, requests of `prompt` and `output` tokens
/// arriving `rate` a second (evenly spaced), `n` of them.
fn fleet(prompt: i64, output: i64, rate: f64, n: i64) -> Spec {
    Spec::llama8b().tiers(&[]).stage(
        "UniformReqRate",
        toml! { request_rate = rate total_requests = n prompt_size = prompt output_tokens = output },
    )
}

/// The KV blocks of Llama-3.1-8B (16,060,522,496 bytes of weights, 2 MiB
/// blocks of 16 tokens) on one GPU of `gib` GiB at 0.9 utilisation.
fn llama8b_blocks(gib: f64) -> u64 {
    ((gib * 1073741824.0 * 0.9 - 16_060_522_496.0) / 2_097_152.0).floor() as u64
}

#[test]
fn a_fleet_of_groups_is_sized_and_priced_group_by_group() {
    let spec = fleet(1000, 20, 50.0, 20)
        .set("worker.hw.usd_per_gpu_hour", 3.0)
        .group("a100", 2, toml! { gpu = "A100-80G" usd_per_gpu_hour = 1.5 })
        .group("h100", 3, toml::Table::new());
    let s = spec.scenario();
    assert_eq!(s.num_workers, 5);
    // Both GPUs have 80 GiB: the same pool (the A100's 80 GB preset is 80 GiB, as the H100's).
    assert_eq!(s.worker_config(0).total_blocks, llama8b_blocks(80.0));
    assert_eq!(s.worker_config(4).total_blocks, 29_205);
    assert_eq!((s.hardware_of(1).0.name.as_str(), s.hardware_of(2).0.name.as_str()), ("A100-80G", "H100"));
    let out = spec.run();
    let groups: Vec<&str> = out.workers.iter().map(|w| w.group.as_str()).collect();
    assert_eq!(groups, ["a100", "a100", "h100", "h100", "h100"]);
    for w in &out.workers {
        let price = if w.group == "a100" { 1.5 } else { 3.0 };
        assert!((w.cost.usd - price * w.cost.gpu_hours).abs() < 1e-12, "{}: {:?}", w.group, w.cost);
        assert!(w.cost.gpu_hours > 0.0);
    }
    assert_eq!(out.workers.iter().map(|w| w.requests_completed).sum::<u64>(), 20);
}

#[test]
fn a_workers_capacity_is_its_saturated_request_rate_by_the_step_model() {
    // Synthetic 10 ms steps; 1,024-token prompts fit one chunk of the 8,192-token
    // budget (one step), then 256 decode steps shared by B sequences:
    // 1 / (0.01 + 256 × 0.01 / B) requests a second.
    let spec = fleet(1024, 256, 1.0, 1)
        .set("worker.inference_params.model", "synthetic")
        .set("worker.inference_params.mean_latency_secs", 0.010)
        // B = 256 (max_num_seqs; the 29,205 blocks hold 365 sequences of 1,280 tokens).
        .group("wide", 1, toml::Table::new())
        // B = 64.
        .group("narrow", 1, toml! { vllm_params = { max_num_seqs = 64 } });
    let s = spec.scenario();
    let caps: Vec<f64> = s.groups.iter().map(|g| g.capacity).collect();
    assert!((caps[0] - 1.0 / (0.01 + 0.01)).abs() < 1e-9, "{caps:?}");
    assert!((caps[1] - 1.0 / (0.01 + 256.0 * 0.01 / 64.0)).abs() < 1e-9, "{caps:?}");
    // The narrow worker's requests weigh 50 / 20 = 2.5 of the wide one's;
    // it has 64 slots, the wide one 256.
    let scales = (s.load_scale(0), s.load_scale(1));
    assert_eq!(scales, (LoadScale { weight: 1024, slots: 256 }, LoadScale { weight: 2560, slots: 64 }));
}

#[test]
fn with_speculative_decoding_a_workers_capacity_counts_the_tokens_a_verify_emits() {
    // As above, with ngram drafts of which both are always accepted: every
    // 10 ms decode step emits 3 tokens a sequence, so 256 output tokens
    // take 256 / 3 steps: 1 / (0.01 + 256 × 0.01 / (3B)).
    let s = fleet(1024, 256, 1.0, 1)
        .set("worker.inference_params.model", "synthetic")
        .set("worker.inference_params.mean_latency_secs", 0.010)
        .table(
            "worker.speculative",
            toml! { method = "ngram" num_speculative_tokens = 2 acceptance_rates = [1.0, 1.0] },
        )
        .group("wide", 1, toml::Table::new())
        .group("narrow", 1, toml! { vllm_params = { max_num_seqs = 64 } })
        .scenario();
    let caps: Vec<f64> = s.groups.iter().map(|g| g.capacity).collect();
    assert!((caps[0] - 1.0 / (0.01 + 256.0 * 0.01 / (3.0 * 256.0))).abs() < 1e-9, "{caps:?}");
    assert!((caps[1] - 1.0 / (0.01 + 256.0 * 0.01 / (3.0 * 64.0))).abs() < 1e-9, "{caps:?}");
}

#[test]
fn a_faster_gpu_is_estimated_the_more_capable() {
    let s = fleet(2000, 200, 1.0, 1)
        .group("a100", 1, toml! { gpu = "A100-80G" })
        .group("h100", 1, toml::Table::new())
        .scenario();
    let (a100, h100) = (s.groups[0].capacity, s.groups[1].capacity);
    // HBM 3.35 vs 2.04 TB/s, 989 vs 312 dense TFLOP/s: between the two ratios.
    assert!(h100 / a100 > 3.35 / 2.039 * 0.9 && h100 / a100 < 989.0 / 312.0, "{h100} / {a100}");
}

#[test]
fn least_loaded_divides_each_workers_load_by_its_capacity() {
    // Eight requests 1 ms apart, each decoding for ~10 s: none completes
    // while they are routed. With capacities 1 and 3 a request on worker 0
    // weighs 3: its load after k requests is 3k against worker 1's j. Ties
    // go to the lower id: 0 (0 = 0), 1, 1, 1, 0 (3 = 3), 1, 1, 1 → 2 and 6.
    let routed = |caps: Option<(f64, f64)>| {
        let (a, b) = match caps {
            Some((a, b)) => (toml! { capacity = a }, toml! { capacity = b }),
            None => (toml::Table::new(), toml::Table::new()),
        };
        let out = fleet(100, 1000, 1000.0, 8)
            .set("worker.inference_params.model", "synthetic")
            .set("worker.inference_params.mean_latency_secs", 0.010)
            .set("router.router_params.policy", "LeastLoaded")
            .group("slow", 1, a)
            .group("fast", 1, b)
            .run();
        out.workers.iter().map(|w| w.requests_routed).collect::<Vec<_>>()
    };
    assert_eq!(routed(Some((1.0, 3.0))), [2, 6]);
    // Equal workers (the capacities estimated alike): an even split.
    assert_eq!(routed(None), [4, 4]);
}

#[test]
fn worker_groups_refuse_what_they_cannot_mean_naming_the_key() {
    let base = || fleet(100, 10, 1.0, 1).set("worker.hw.usd_per_gpu_hour", 3.0);
    let err = |spec: Spec| crate::scenario_err(&spec.toml());
    let e = err(base().group("a", 1, toml::Table::new()).group("a", 1, toml::Table::new()));
    assert_eq!(e.key.as_deref(), Some("worker_groups.1.name"), "{e}");
    let e = err(base().group("a", 1, toml! { gpu = "A100-80G" }));
    assert_eq!(e.key.as_deref(), Some("worker_groups.0.gpu"), "{e}");
    assert!(e.hint.as_deref().unwrap().contains("worker_groups.0.usd_per_gpu_hour"), "{e}");
    let e = err(base().set("simulation.num_workers", 4).group("a", 1, toml::Table::new()));
    assert_eq!(e.key.as_deref(), Some("simulation.num_workers"), "{e}");
    let e = err(base().group("a", 0, toml::Table::new()));
    assert!(e.message.contains("every worker group is empty"), "{e}");
    let e = err(base().group("a", 1, toml! { vllm_params = { max_model_len = 4096 } }));
    assert_eq!(e.key.as_deref(), Some("worker_groups.0.vllm_params.max_model_len"), "{e}");
    let e = err(base().group("a", 1, toml! { capacity = 0.0 }));
    assert_eq!(e.key.as_deref(), Some("worker_groups.0.capacity"), "{e}");
    // P/D pools made of groups: the groups make the pools, each says which.
    let e = err(base().group("a", 1, toml! { role = "decode" }).table("disaggregation", toml! { [decode] count = 1 }));
    assert_eq!(e.key.as_deref(), Some("disaggregation.decode"), "{e}");
    let e = err(base().group("a", 1, toml! { role = "decode" }));
    assert_eq!(e.key.as_deref(), Some("worker_groups.0.role"), "{e}");
    let pd = || base().table("disaggregation", toml! { max_local_prefill_length = 0 });
    let e = err(pd().group("a", 1, toml! { role = "prefill" }).group("b", 1, toml::Table::new()));
    assert_eq!(e.key.as_deref(), Some("worker_groups.1.role"), "{e}");
    let e = err(pd().group("a", 1, toml! { role = "prefil" }));
    assert_eq!(e.key.as_deref(), Some("worker_groups.0.role"), "{e}");
    let e = err(pd().group("a", 1, toml! { role = "prefill" }).group("b", 0, toml! { role = "decode" }));
    assert!(e.message.contains("decode groups are empty"), "{e}");
}

#[test]
fn prefill_and_decode_pools_made_of_groups_route_each_phase_within_its_pool() {
    // One H100 prefills every prompt (max_local_prefill_length = 0); two
    // A100s and one H100 decode. The spec lists a decode group first: the
    // prefill group's workers are numbered first all the same.
    let spec = fleet(2000, 100, 8.0, 160)
        .table("disaggregation", toml! { max_local_prefill_length = 0 })
        .set("worker.hw.usd_per_gpu_hour", 2.5)
        .group("a100-decode", 2, toml! { gpu = "A100-80G" usd_per_gpu_hour = 1.8 role = "decode" })
        .group("h100-prefill", 1, toml! { role = "prefill" })
        .group("h100-decode", 1, toml! { role = "decode" });
    let s = spec.scenario();
    let d = s.disagg.as_ref().expect("pools");
    assert_eq!((d.prefill_workers, d.decode_workers), (1, 3));
    let names: Vec<&str> = (0..4).map(|w| s.group_name(w)).collect();
    assert_eq!(names, ["h100-prefill", "a100-decode", "a100-decode", "h100-decode"]);
    assert_eq!(s.hardware_of(1).0.name, "A100-80G");
    // Each pool's weights are against its own most capable group: the
    // prefill group alone weighs 1,024; the A100 decoders more than the H100.
    let (p, a, h) = (s.load_scale(0), s.load_scale(1), s.load_scale(3));
    assert_eq!((p.weight, h.weight), (1024, 1024));
    assert!(a.weight > 1024, "{a:?}");
    let out = spec.run();
    assert_eq!(out.summary.requests_completed, 160);
    assert_eq!(out.summary.pd.remote_prefills, 160);
    let roles: Vec<&str> = out.workers.iter().map(|w| w.role).collect();
    assert_eq!(roles, ["prefill", "decode", "decode", "decode"]);
    // The prefill worker completes every prompt; every request decodes on
    // a decode worker, the H100 most.
    let routed: Vec<u64> = out.workers.iter().map(|w| w.requests_completed).collect();
    assert_eq!(routed[0], 160, "{routed:?}");
    assert_eq!(routed[1..].iter().sum::<u64>(), 160);
    assert!(routed[3] > routed[1] && routed[3] > routed[2], "{routed:?}");
    for w in &out.workers {
        let price = if w.group == "a100-decode" { 1.8 } else { 2.5 };
        assert!((w.cost.usd - price * w.cost.gpu_hours).abs() < 1e-12, "{}: {:?}", w.group, w.cost);
    }
    // The effective configuration writes the groups with their roles.
    let parsed = opal::config::Spec::from_text(&spec.toml(), std::path::Path::new("pd.toml")).unwrap();
    let again = crate::scenario(&opal::sweep::effective_config(&parsed, None).unwrap());
    assert_eq!(again, s);
    // Without a prefill worker the groups serve requests whole (a sweep's baseline).
    let mixed = spec.clone().set("worker_groups.1.count", 0).scenario();
    assert!(mixed.disagg.is_none());
    assert_eq!(mixed.num_workers, 3);
}

#[test]
fn the_effective_configuration_of_a_fleet_resolves_to_the_same_fleet() {
    // [worker.hw] is written as the spec's own GPU, not the first group's:
    // a group without a GPU of its own keeps [worker.hw]'s.
    let spec =
        fleet(1000, 20, 50.0, 20).group("a100", 2, toml! { gpu = "A100-80G" }).group("h100", 1, toml::Table::new());
    let parsed = opal::config::Spec::from_text(&spec.toml(), std::path::Path::new("fleet.toml")).unwrap();
    let effective = opal::sweep::effective_config(&parsed, None).unwrap();
    let again = crate::scenario(&effective);
    assert_eq!(again.hardware_of(2).0.name, "H100");
    assert_eq!(again, spec.scenario());
}

/// Requests a second a closed-loop run served while every worker was
/// full, and the share of them each group served: the completions between
/// the 20th and the 60th percentile of finish times (the ramp-up and the
/// drain — when the last requests finish together — left out).
fn saturated_rate(out: &opal::RunOutput) -> (f64, std::collections::BTreeMap<String, f64>) {
    let mut finish: Vec<(f64, &str)> = out
        .requests
        .iter()
        .filter(|r| r.completed)
        .map(|r| (r.arrival_s + r.e2e_s.unwrap(), out.workers[r.worker.unwrap() as usize].group.as_str()))
        .collect();
    finish.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (a, b) = (finish.len() / 5, finish.len() * 3 / 5);
    let mut shares = std::collections::BTreeMap::new();
    for (_, g) in &finish[a..b] {
        *shares.entry(g.to_string()).or_insert(0.0) += 1.0 / (b - a) as f64;
    }
    ((b - a) as f64 / (finish[b].0 - finish[a].0), shares)
}

#[test]
fn eight_a100s_and_eight_h100s_serve_the_sum_of_their_capacities_each_its_share() {
    // Llama-3.1-8B, 1,000-token prompts with nothing shared, 200-token
    // outputs, no KV tiers; LeastLoaded.
    let spec = |rate: f64, n: i64| {
        Spec::llama8b()
            .tiers(&[])
            .set("worker.hw.usd_per_gpu_hour", 3.0)
            .set("router.router_params.policy", "LeastLoaded")
            .stage(
                "ExponentialReqRate",
                toml! { request_rate = rate total_requests = n prompt_size = 1000 output_tokens = 200 default_prefix_length = 0 },
            )
    };
    let a100 = || toml! { gpu = "A100-80G" usd_per_gpu_hour = 1.5 };
    let fleet = |spec: Spec, flat: bool| {
        let (mut a, mut h) = (a100(), toml::Table::new());
        if flat {
            // Equal capacities: a request weighs the same anywhere.
            a.insert("capacity".into(), 1.0.into());
            h.insert("capacity".into(), 1.0.into());
        }
        spec.group("a100", 8, a).group("h100", 8, h).run()
    };
    let s = spec(1.0, 1).group("a100", 8, a100()).group("h100", 8, toml::Table::new()).scenario();
    let slots = i64::from(s.groups[0].slots);
    assert_eq!((slots, s.groups[1].slots), (256, 256), "max_num_seqs binds on both");
    // Closed loop: `outstanding` requests in flight, a new one arriving as one completes.
    let closed = |outstanding: i64| {
        spec(1e5, 24_000).set("workload.stages.0.workload_params.max_outstanding_requests", outstanding)
    };

    // Each GPU's capacity, measured: one worker kept full (as many requests
    // outstanding as it has slots).
    let c_a = saturated_rate(&closed(slots).group("a100", 1, a100()).run()).0;
    let c_h = saturated_rate(&closed(slots).group("h100", 1, toml::Table::new()).run()).0;
    // What the router weighs requests by is within 10 % of it.
    let (est_a, est_h) = (s.groups[0].capacity, s.groups[1].capacity);
    assert!((est_a / c_a - 1.0).abs() < 0.1 && (est_h / c_h - 1.0).abs() < 0.1, "{est_a} {c_a}; {est_h} {c_h}");

    // At the fleet's capacity — every worker full and a quarter as many
    // again waiting — it serves within 10 % of the sum of its workers'
    // capacities, each group within 10 % of its share of that sum.
    let sum = 8.0 * (c_a + c_h);
    let (served, shares) = saturated_rate(&fleet(closed(16 * slots * 5 / 4), false));
    assert!((served / sum - 1.0).abs() < 0.1, "served {served:.1} req/s of {sum:.1}");
    for (g, c) in [("a100", c_a), ("h100", c_h)] {
        let want = c / (c_a + c_h);
        assert!(
            (shares[g] / want - 1.0).abs() < 0.1,
            "{g}: {:.3} of the requests, {want:.3} of the capacity",
            shares[g]
        );
    }

    // Below capacity the slower GPUs get less than their capacity's share:
    // a request weighs 1 / capacity, so an A100 holds about 40 % as many
    // as an H100 (a smaller batch, shorter steps). Unnormalised, it holds
    // as many: its batch is as large, its steps 1.6–2.6× as slow, and its
    // requests make the fleet's tail. At 90 % of the capacity TPOT p99 is
    // half again as long, and TTFT p99 and mean E2E longer too.
    let open = |flat| fleet(spec(0.9 * sum, 20_000), flat);
    let (norm, flat) = (open(false), open(true));
    let routed = |out: &opal::RunOutput, g: &str| {
        out.workers.iter().filter(|w| w.group == g).map(|w| w.requests_routed).sum::<u64>() as f64 / 20_000.0
    };
    // (measured: 0.24 of the requests to the A100s normalised, 0.30 not)
    assert!(routed(&norm, "a100") < 0.9 * c_a / (c_a + c_h) && routed(&flat, "a100") > routed(&norm, "a100"));
    let (n, f) = (&norm.summary, &flat.summary);
    assert!(
        f.tpot_ms.p99 > 1.5 * n.tpot_ms.p99,
        "TPOT p99 {:.1} ms unnormalised, {:.1} normalised",
        f.tpot_ms.p99,
        n.tpot_ms.p99
    );
    assert!(f.ttft_ms.p99 > n.ttft_ms.p99 && f.e2e_ms.mean > n.e2e_ms.mean);
}

#[test]
fn autoscaling_adds_workers_of_the_group_it_names() {
    // Requests arrive far faster than two workers serve them: every check
    // finds a queue, and a worker joins 1 s after each decision (then the
    // next check 1 s later), up to 4 workers.
    let spec = |scale_group: Option<&str>| {
        let mut s = fleet(2000, 200, 200.0, 2000)
            .set("worker.hw.usd_per_gpu_hour", 3.0)
            .set("router.router_params.policy", "LeastLoaded")
            .set("router.router_params.enable_scaling", true)
            .set("router.router_params.max_queue_threshold", 4)
            .set("router.router_params.scale_latency", 1.0)
            .set("router.router_params.max_workers", 4)
            .group("a100", 1, toml! { gpu = "A100-80G" usd_per_gpu_hour = 1.5 })
            .group("h100", 1, toml::Table::new());
        if let Some(g) = scale_group {
            s = s.set("router.router_params.scale_group", g);
        }
        s
    };
    let added = |spec: Spec| {
        let out = spec.run();
        let rows: Vec<(String, f64)> =
            out.workers.iter().map(|w| (w.group.clone(), w.cost.usd / w.cost.gpu_hours)).collect();
        rows
    };
    // Named: the added workers are A100s, at the A100's price.
    let a = added(spec(Some("a100")));
    assert_eq!(a.iter().map(|(g, _)| g.as_str()).collect::<Vec<_>>(), ["a100", "h100", "a100", "a100"]);
    assert!(a.iter().all(|(g, usd)| (usd - if g == "a100" { 1.5 } else { 3.0 }).abs() < 1e-9), "{a:?}");
    let s = spec(Some("a100")).scenario();
    assert_eq!((s.hardware_of(3).0.name.as_str(), s.load_scale(3)), ("A100-80G", s.load_scale(0)));
    // By default, the last group.
    let h = added(spec(None));
    assert_eq!(h.iter().map(|(g, _)| g.as_str()).collect::<Vec<_>>(), ["a100", "h100", "h100", "h100"]);
    // A name that is no group, or a group without groups, names the key.
    let e = crate::scenario_err(&spec(Some("b200")).toml());
    assert_eq!(e.key.as_deref(), Some("router.router_params.scale_group"), "{e}");
    assert!(e.hint.as_deref().unwrap().contains("a100, h100"), "{e}");
    let e = crate::scenario_err(&fleet(100, 10, 1.0, 1).set("router.router_params.scale_group", "a100").toml());
    assert_eq!(e.key.as_deref(), Some("router.router_params.scale_group"), "{e}");
}
