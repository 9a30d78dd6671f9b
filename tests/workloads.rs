//! The workload generators end to end: SC25 cold/warm, RAG, multi-turn
//! sessions, length distributions.

use crate::fixtures::Spec;
use crate::run;
use opal::workload::Label;
use toml::toml;

/// Tokens a request with a fully cached prompt of `p` tokens must still
/// compute when the GPU holds it: a prefix hit covers at most ⌊(p − 1)/16⌋
/// blocks of 16 (vLLM always computes at least the last token, and its GPU
/// hits are whole blocks).
fn recomputed_tail(p: u64) -> u64 {
    p - 16 * ((p - 1) / 16)
}

/// The same when a tier below the GPU holds the prompt: its chunks are keyed
/// by their exact tokens (LMCache), the last, partial one included, so the
/// connector loads all but the last token (LMCache's full-hit rule) and one
/// token is computed.
fn recomputed_with_tier(_p: u64) -> u64 {
    1
}

/// Llama-3.1-8B behind a round-robin router, first an SC25 stage with `params`.
fn sc25(params: toml::Table) -> Spec {
    Spec::llama8b().set("router.router_params.policy", "RoundRobin").stage("SC25Workload", params)
}

#[test]
fn sc25_warm_requests_beat_cold_ones_at_every_size_and_recompute_only_the_tail() {
    // Served from the GPU (a B200 holds all ten prompts) and from a CPU tier
    // (an H100 does not; chunks of one block so every full block is a hit).
    let gpu = sc25(toml::Table::new()).set("worker.hw.gpu", "B200").tiers(&[]).run();
    let cpu = sc25(toml::Table::new())
        .tiers(&["CPUMemory"])
        .set("kvc.chunk_size", 16)
        .set("kvc.CPUMemory.capacity_GB", 200)
        .run();
    for (name, out) in [("gpu", &gpu), ("cpu", &cpu)] {
        assert_eq!(out.summary.requests_completed, 20, "{name}: ten cold, ten warm");
        let sizes: Vec<u32> = out.sc25.iter().map(|r| r.prompt_tokens).collect();
        assert_eq!(sizes, opal::workload::SC25_PROMPT_SIZES, "{name}");
        for r in &out.sc25 {
            let (cold, warm) = (r.cold_ttft_ms.unwrap(), r.warm_ttft_ms.unwrap());
            assert!(warm < cold, "{name} {}: warm {warm} ms vs cold {cold} ms", r.prompt_tokens);
            assert_eq!(r.cold_prefill_tokens, u64::from(r.prompt_tokens), "{name}: the cold pass shares nothing");
            let p = u64::from(r.prompt_tokens);
            let tail = if name == "gpu" { recomputed_tail(p) } else { recomputed_with_tier(p) };
            assert_eq!(r.warm_prefill_tokens, tail, "{name} {p}");
        }
    }
    // Where the warm hits came from.
    assert!(gpu.sc25.iter().all(|r| r.warm_hit_tokens[1..] == [0, 0, 0] && r.warm_kv_fetch_ms.is_none()));
    let last = cpu.sc25.last().unwrap();
    assert!(
        last.warm_hit_tokens[1] > 0 && last.warm_kv_fetch_ms.is_some(),
        "the largest prompt was evicted from the H100"
    );
    // Requests are labelled cold then warm, each sent after the previous completes.
    let labels: Vec<Label> = gpu.requests.iter().map(|r| r.label).collect();
    assert!(labels[..10].iter().all(|l| *l == Label::Sc25 { warm: false }));
    assert!(labels[10..].iter().all(|l| *l == Label::Sc25 { warm: true }));
    for pair in gpu.requests.windows(2) {
        assert!(pair[1].arrival_s >= pair[0].arrival_s + pair[0].e2e_s.unwrap() - 1e-9, "closed loop");
    }
}

#[test]
fn rag_requests_share_the_system_prompt_and_repeat_document_sets() {
    let out = Spec::empty()
        .stage(
            "RAGWorkload",
            toml! {
                total_requests = 40
                request_rate = 0.5
                system_prompt_size = 1000
                num_documents = 3
                docs_per_request = 2
                document_size = 400
                query_size = 50
                output_tokens = 8
                max_outstanding_requests = 1
            },
        )
        .tiers(&[])
        .run();
    assert_eq!(out.summary.requests_completed, 40);
    let r = &out.requests;
    assert!(r.iter().all(|q| q.prompt_tokens == 1000 + 2 * 400 + 50));
    assert_eq!(r[0].hit_tokens[0], 0, "the first request finds nothing");
    // Every later request finds at least the system prompt's 62 full blocks;
    // with 3 documents there are only 3 sets of 2, so most find a whole set
    // (1000 + 800 = 1800 tokens: 112 full blocks).
    assert!(
        r[1..].iter().all(|q| q.hit_tokens[0] >= 992),
        "{:?}",
        r.iter().map(|q| q.hit_tokens[0]).collect::<Vec<_>>()
    );
    let whole = r.iter().filter(|q| q.hit_tokens[0] == 1792).count();
    assert!(whole >= 30, "{whole} of 40 found their document set cached");
}

#[test]
fn a_sessions_next_turn_goes_to_the_worker_that_holds_its_conversation_and_hits_all_of_it() {
    let out = Spec::empty()
        .set("simulation.num_workers", 4)
        .set("router.router_params.policy", "MaxPrefix")
        .set("router.router_params.periodic_infra_update_collection_time", 0)
        .set("worker.worker_params.kvcevent_coalesce_time", 0)
        .tiers(&[])
        .stage(
            "Sessions",
            toml! {
                total_sessions = 30
                session_rate = 2.0
                turns = 4
                system_prompt_size = 500
                input_tokens = { dist = "uniform", min = 50, max = 300 }
                output_tokens = { dist = "lognormal", mean = 120, std = 60, max = 400 }
                think_time_sec = { dist = "exponential", mean = 2 }
            },
        )
        .run();
    assert_eq!(out.summary.requests_completed, 120, "30 sessions of 4 turns");
    let mut turns = std::collections::HashMap::new();
    for r in &out.requests {
        let Label::Session { session, turn } = r.label else { panic!("unlabelled request") };
        turns.insert((session, turn), r);
    }
    for ((session, turn), r) in &turns {
        if *turn == 1 {
            continue;
        }
        let prev = turns[&(*session, turn - 1)];
        // Turn k+1 = turn k's prompt + its answer + new input.
        assert!(r.prompt_tokens > prev.prompt_tokens + prev.output_tokens);
        assert!(r.arrival_s >= prev.arrival_s + prev.e2e_s.unwrap(), "closed loop within a session");
        assert_eq!(r.worker, prev.worker, "session {session} turn {turn} followed its cache");
        // Everything turn k computed is cached: its prompt and all but the last output token.
        let cached = 16 * ((u64::from(prev.prompt_tokens + prev.output_tokens) - 1) / 16);
        assert_eq!(r.hit_tokens[0], cached, "session {session} turn {turn}");
    }
}

#[test]
fn rate_stage_lengths_follow_the_configured_distribution() {
    let out = Spec::empty()
        .stage(
            "UniformReqRate",
            toml! {
                total_requests = 4000
                request_rate = 1000
                prompt_size = { dist = "normal", mean = 600, std = 100, min = 300, max = 900 }
                output_tokens = 5
            },
        )
        .tiers(&[])
        .run();
    let p: Vec<f64> = out.requests.iter().map(|r| f64::from(r.prompt_tokens)).collect();
    let mean = p.iter().sum::<f64>() / p.len() as f64;
    let sd = (p.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (p.len() - 1) as f64).sqrt();
    // Standard error of the mean 100/√4000 ≈ 1.6: 5 is more than three of them.
    assert!((mean - 600.0).abs() < 5.0, "mean {mean}");
    assert!((sd - 100.0).abs() < 5.0, "sd {sd}");
    assert!(p.iter().all(|&x| (300.0..=900.0).contains(&x)));
    assert!(out.requests.iter().all(|r| r.output_tokens == 5));
}

#[test]
fn empirical_lengths_come_from_the_trace_file() {
    let dir = crate::temp_dir("empirical");
    std::fs::write(
        dir.join("t.jsonl"),
        "{\"timestamp\": 0, \"input_length\": 111, \"output_length\": 7}\n{\"timestamp\": 1, \"input_length\": 222, \"output_length\": 9}\n",
    )
    .unwrap();
    let text = r#"
        [[workload.stages]]
        type = "ExponentialReqRate"
        [workload.stages.workload_params]
        total_requests = 200
        request_rate = 100
        prompt_size = { dist = "empirical", trace_file = "t.jsonl" }
        output_tokens = { dist = "empirical", trace_file = "t.jsonl", field = "output_length" }
        "#;
    let file = opal::config::parse_spec(text, "s.toml").unwrap();
    let s = opal::config::resolve(&file, "s.toml", &dir).unwrap();
    let out = run(&s);
    let prompts: std::collections::BTreeSet<u32> = out.requests.iter().map(|r| r.prompt_tokens).collect();
    let outputs: std::collections::BTreeSet<u32> = out.requests.iter().map(|r| r.output_tokens).collect();
    assert_eq!(prompts.into_iter().collect::<Vec<_>>(), vec![111, 222]);
    assert_eq!(outputs.into_iter().collect::<Vec<_>>(), vec![7, 9]);
}

#[test]
fn bad_distributions_and_stage_parameters_name_their_key() {
    let err = |params: &str, ty: &str| {
        let text = format!("[[workload.stages]]\ntype = \"{ty}\"\n[workload.stages.workload_params]\n{params}\n");
        let file = opal::config::parse_spec(&text, "s.toml").unwrap();
        opal::config::resolve(&file, "s.toml", std::path::Path::new(".")).unwrap_err()
    };
    let e = err("prompt_size = { dist = \"lognorm\", mean = 5 }", "UniformReqRate");
    assert_eq!(e.key.as_deref(), Some("workload.stages.0.workload_params.prompt_size.dist"), "{e}");
    assert!(e.hint.as_deref().unwrap().contains("did you mean `lognormal`"), "{e}");
    let e = err("prompt_size = { dist = \"normal\", mean = 5, sd = 1 }", "UniformReqRate");
    assert_eq!(e.key.as_deref(), Some("workload.stages.0.workload_params.prompt_size.sd"), "{e}");
    let e = err("prompt_size = 100\nprompt_size_max = 200", "UniformReqRate");
    assert!(e.message.contains("both set"), "{e}");
    let e = err("docs_per_request = 5\nnum_documents = 3", "RAGWorkload");
    assert_eq!(e.key.as_deref(), Some("workload.stages.0.workload_params.docs_per_request"), "{e}");
    let e = err("think_time_sec = { dist = \"exponential\" }", "Sessions");
    assert_eq!(e.key.as_deref(), Some("workload.stages.0.workload_params.think_time_sec.mean"), "{e}");
    let e = err("prompt_sizes = []", "SC25Workload");
    assert_eq!(e.key.as_deref(), Some("workload.stages.0.workload_params.prompt_sizes"), "{e}");
    let e = err("", "Sesions");
    assert!(e.hint.as_deref().unwrap().contains("did you mean `Sessions`"), "{e}");
}

#[test]
fn trace_tokens_beyond_the_hash_ids_are_unique_to_each_request() {
    // Two requests of 600 tokens with the same single hash id (512 tokens):
    // the second hits exactly those 512, not the 88 that follow (block 16
    // would let a shared tail add 80 more).
    let dir = crate::temp_dir("trace-unique-tail");
    let row = |t: u32| format!(r#"{{"timestamp": {t}, "input_length": 600, "output_length": 4, "hash_ids": [7]}}"#);
    std::fs::write(dir.join("t.jsonl"), format!("{}\n{}\n", row(0), row(5000))).unwrap();
    let out = Spec::empty()
        .tiers(&[])
        .stage("Trace", toml! { trace_file = (dir.join("t.jsonl").display().to_string()) })
        .run();
    assert_eq!(out.requests.len(), 2);
    assert_eq!(out.requests[0].hit_tokens[0], 0);
    assert_eq!(out.requests[1].hit_tokens[0], 512);
}

#[test]
fn a_closed_loop_stage_stops_at_its_time_limit_and_the_next_stage_follows_its_last_request() {
    let out = Spec::empty()
        .stage(
            "Sessions",
            toml! {
                total_sessions = 1000
                session_rate = 4.0
                turns = 20
                think_time_sec = { dist = "fixed", value = 0.5 }
                time_duration_sec = 5.0
            },
        )
        .stage("UniformReqRate", toml! { total_requests = 10 request_rate = 10.0 })
        .run();
    let first: Vec<_> = out.requests.iter().filter(|r| r.stage == 0).collect();
    let second: Vec<_> = out.requests.iter().filter(|r| r.stage == 1).collect();
    assert!(first.len() > 20, "sessions ran: {}", first.len());
    assert!(first.iter().all(|r| r.arrival_s < 5.0), "nothing of stage 0 is sent at or after its 5 s limit");
    assert!(first.iter().all(|r| r.completed), "turns in flight at the limit finish");
    let last = first.iter().map(|r| r.arrival_s + r.e2e_s.unwrap()).fold(0.0, f64::max);
    assert!(last > 5.0, "some turn was still running at the limit");
    let start = second.iter().map(|r| r.arrival_s).fold(f64::INFINITY, f64::min);
    assert!((start - last).abs() < 1e-9, "stage 1 starts when stage 0's last request completes: {start} vs {last}");
    assert_eq!(second.len(), 10);
}

#[test]
fn a_token_distribution_may_have_a_standard_deviation_below_one_token() {
    let resolve = |dist: &str| {
        let text = format!(
            "[[workload.stages]]\ntype = \"UniformReqRate\"\n[workload.stages.workload_params]\nprompt_size = {dist}\n"
        );
        let file = opal::config::parse_spec(&text, "s.toml").unwrap();
        opal::config::resolve(&file, "s.toml", std::path::Path::new("."))
    };
    assert!(resolve("{ dist = \"normal\", mean = 500, std = 0.5 }").is_ok());
    assert!(resolve("{ dist = \"lognormal\", mean = 500, std = 0 }").is_ok());
    let e = resolve("{ dist = \"normal\", mean = 500, std = -1 }").unwrap_err();
    assert_eq!(e.key.as_deref(), Some("workload.stages.0.workload_params.prompt_size.std"), "{e}");
    let e = resolve("{ dist = \"normal\", mean = 0.5, std = 1 }").unwrap_err();
    assert_eq!(e.key.as_deref(), Some("workload.stages.0.workload_params.prompt_size.mean"), "a length is ≥ 1: {e}");
}

#[test]
fn sc25_rows_pair_cold_and_warm_within_each_stage_even_when_one_is_cut_short() {
    // Stage 0 is cut at 3 s: both cold requests (2 s apart) go out, then the
    // first warm one; the second warm one is never sent. Stage 1 runs whole.
    let out = sc25(toml! { prompt_sizes = [4092, 8184] gap_sec = 1.0 time_duration_sec = 3.0 })
        .stage("SC25Workload", toml! { prompt_sizes = [16368] })
        .run();
    let rows: Vec<(u32, bool)> = out.sc25.iter().map(|r| (r.prompt_tokens, r.warm_ttft_ms.is_some())).collect();
    assert_eq!(rows, [(4092, true), (8184, false), (16368, true)]);
    for r in out.sc25.iter().filter(|r| r.warm_ttft_ms.is_some()) {
        assert!(r.warm_ttft_ms < r.cold_ttft_ms, "{r:?}");
    }
}

#[test]
fn sessions_that_outgrow_max_context_tokens_end_early_and_are_counted() {
    // Turn k's prompt = 100 (system) + k·100 (inputs) + (k − 1)·100 (answers);
    // with its 100-token answer it needs 200k + 100 tokens: turns 1 and 2 fit
    // in 650, turn 3 (700) does not, so each of the 5 sessions stops after 2.
    let out = Spec::empty()
        .stage(
            "Sessions",
            toml! {
                total_sessions = 5
                turns = 10
                system_prompt_size = 100
                input_tokens = 100
                output_tokens = 100
                max_context_tokens = 650
            },
        )
        .run();
    assert_eq!(out.summary.requests_completed, 10);
    assert_eq!(out.summary.sessions_truncated, 5);
    let col = out.summary.columns().into_iter().find(|(n, _)| n == "sessions_truncated");
    assert!(col.is_some(), "the runs table has the column");
}

#[test]
fn zero_and_minus_one_mean_no_limit_in_every_stage() {
    let resolve = |params: &str, ty: &str| {
        let text = format!(
            "[simulation]\nsimulation_time = 100\n[[workload.stages]]\ntype = \"{ty}\"\n[workload.stages.workload_params]\n{params}\n"
        );
        let file = opal::config::parse_spec(&text, "s.toml").unwrap();
        opal::config::resolve(&file, "s.toml", std::path::Path::new("."))
    };
    use opal::workload::StageKind;
    for total in [0, -1] {
        let trace =
            resolve(&format!("trace_file = \"traces/conversation_trace.jsonl\"\ntotal_requests = {total}"), "Trace");
        let StageKind::Trace(t) = &trace.unwrap().stages[0].kind else { panic!() };
        assert_eq!(t.total, None, "a trace with total_requests = {total} replays the whole file");
        let rate = resolve(&format!("total_requests = {total}"), "UniformReqRate").unwrap();
        let StageKind::Rate(r) = &rate.stages[0].kind else { panic!() };
        assert_eq!(r.total, None);
        let rag = resolve(&format!("total_requests = {total}"), "RAGWorkload").unwrap();
        let StageKind::Rag(r) = &rag.stages[0].kind else { panic!() };
        assert_eq!(r.total, None);
    }
    for ty in ["Trace", "UniformReqRate", "RAGWorkload"] {
        let e = resolve("trace_file = \"traces/conversation_trace.jsonl\"\ntotal_requests = -2", ty);
        let e = match (ty, e) {
            ("Trace", Err(e)) => e,
            (_, _) => resolve("total_requests = -2", ty).unwrap_err(),
        };
        assert_eq!(e.key.as_deref(), Some("workload.stages.0.workload_params.total_requests"), "{ty}: {e}");
        assert!(e.to_string().contains("-1 or 0 (no limit)"), "{e}");
    }
}

#[test]
fn a_burst_arrives_at_once_and_is_prefilled_in_one_step() {
    // request_rate = inf: four 300-token prompts at t = 0, one output token
    // each; one worker, synthetic 10 ms steps. All four fit the 8,192-token
    // budget, so the first step prefills them together: every TTFT is one step.
    let burst = Spec::empty()
        .set("worker.inference_params.model", "synthetic")
        .set("worker.inference_params.mean_latency_secs", 0.01)
        .stage(
            "UniformReqRate",
            toml! {
                request_rate = inf
                total_requests = 4
                prompt_size_min = 300
                prompt_size_max = 300
                output_tokens_min = 1
                output_tokens_max = 1
            },
        );
    let out = burst.run();
    assert_eq!(out.requests.len(), 4);
    for r in &out.requests {
        assert_eq!((r.arrival_s, r.ttft_s), (0.0, Some(0.01)), "{r:?}");
    }
    // With a cap of two in flight, the burst goes out two at a time.
    let capped = burst.set("workload.stages.0.workload_params.max_outstanding_requests", 2).run();
    let mut arrivals: Vec<f64> = capped.requests.iter().map(|r| r.arrival_s).collect();
    arrivals.sort_by(f64::total_cmp);
    assert_eq!(arrivals, [0.0, 0.0, 0.01, 0.01]);
}

#[test]
fn a_burst_needs_a_bounded_count() {
    let err = |params: &str| {
        let text = format!(
            "[[workload.stages]]\ntype = \"UniformReqRate\"\n[workload.stages.workload_params]\nrequest_rate = inf\n{params}\n"
        );
        let file = opal::config::parse_spec(&text, "s.toml").unwrap();
        opal::config::resolve(&file, "s.toml", std::path::Path::new(".")).unwrap_err()
    };
    let e = err("total_requests = -1\n[simulation]\nsimulation_time = 10");
    assert_eq!(e.key.as_deref(), Some("workload.stages.0.workload_params.request_rate"), "{e}");
    assert!(e.hint.as_deref().unwrap().contains("total_requests"), "{e}");
    let e = err("total_requests = 2000000");
    assert!(e.message.contains("at most 1000000"), "{e}");
}

const CONVERSATION: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/traces/conversation_trace.jsonl");

/// The Kolmogorov–Smirnov statistic of `gaps` against the exponential of rate `rate`.
fn ks_exponential(gaps: &mut [f64], rate: f64) -> f64 {
    gaps.sort_by(f64::total_cmp);
    let n = gaps.len() as f64;
    gaps.iter()
        .enumerate()
        .map(|(i, &x)| {
            let f = 1.0 - (-rate * x).exp();
            (f - i as f64 / n).abs().max((f - (i + 1) as f64 / n).abs())
        })
        .fold(0.0, f64::max)
}

/// A trace re-timed at 8 req/s: the gaps pass a Kolmogorov–Smirnov test
/// against Exp(8) at the 1 % level (D < 1.628/√n), the requests keep their
/// order and content (`prompt_hash`, lengths) and only their times change;
/// gamma gaps have the coefficient of variation asked for.
#[test]
fn a_trace_replayed_at_a_chosen_rate_has_poisson_gaps_and_keeps_its_requests() {
    let trace = |extra: toml::Table| {
        let mut params = toml! { trace_file = CONVERSATION total_requests = 3000 };
        params.extend(extra);
        // One large-budget worker with no tiers: only the arrivals matter here.
        Spec::empty()
            .tiers(&[])
            .set("worker.inference_params.model", "synthetic")
            .set("worker.inference_params.mean_latency_secs", 0.001)
            .stage("Trace", params)
            .run()
    };
    let recorded = trace(toml::Table::new());
    let poisson = trace(toml! { request_rate = 8.0 });
    assert_eq!(poisson.requests.len(), 3000);
    let key = |r: &opal::metrics::RequestRecord| (r.prompt_hash, r.prompt_tokens, r.output_tokens);
    assert_eq!(
        poisson.requests.iter().map(key).collect::<Vec<_>>(),
        recorded.requests.iter().map(key).collect::<Vec<_>>(),
        "order and content kept"
    );
    let arrivals: Vec<f64> = poisson.requests.iter().map(|r| r.arrival_s).collect();
    assert_eq!(arrivals[0], 0.0);
    assert!(arrivals.windows(2).all(|w| w[0] <= w[1]), "in order");
    let mut gaps: Vec<f64> = arrivals.windows(2).map(|w| w[1] - w[0]).collect();
    let d = ks_exponential(&mut gaps, 8.0);
    assert!(d < 1.628 / (gaps.len() as f64).sqrt(), "KS D = {d}");
    // Not the recorded times: those have bursts of up to 23 at one timestamp.
    assert!(recorded.requests.windows(2).filter(|w| w[0].arrival_s == w[1].arrival_s).count() > 500);
    // And a wrong rate is rejected by the same test.
    assert!(ks_exponential(&mut gaps, 10.0) > 1.628 / (gaps.len() as f64).sqrt());
    // Gamma gaps: sample coefficient of variation ≈ 2, mean ≈ 1/8 s.
    let gamma = trace(toml! { request_rate = 8.0 arrival = "gamma" arrival_cv = 2.0 });
    let g: Vec<f64> = gamma.requests.windows(2).map(|w| w[1].arrival_s - w[0].arrival_s).collect();
    let mean = g.iter().sum::<f64>() / g.len() as f64;
    let cv = (g.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (g.len() - 1) as f64).sqrt() / mean;
    assert!((mean - 0.125).abs() < 0.125 * 0.1 && (cv - 2.0).abs() < 0.2, "mean {mean}, cv {cv}");
}

#[test]
fn a_bursty_trace_replayed_at_its_own_times_warns_and_re_timing_options_are_checked() {
    let dir = crate::temp_dir("trace-bursts");
    let spec = |params: &str| {
        format!(
            "[sweep]\nname = \"b\"\ntables = [\"runs\"]\n[[workload.stages]]\ntype = \"Trace\"\n[workload.stages.workload_params]\ntrace_file = \"{CONVERSATION}\"\ntotal_requests = 50\n{params}\n"
        )
    };
    let run = |params: &str| {
        std::fs::write(dir.join("spec.toml"), spec(params)).unwrap();
        crate::sweep::opal_sweep(&["spec.toml", "--dry-run"], &dir)
    };
    let bursty = run("");
    assert!(bursty.status.success());
    let err = String::from_utf8_lossy(&bursty.stderr);
    assert!(err.contains("shared by 5 or more requests") && err.contains("set request_rate"), "{err}");
    let retimed = run("request_rate = 5.0");
    assert!(retimed.status.success() && !String::from_utf8_lossy(&retimed.stderr).contains("request_rate"));
    for (bad, key) in [
        ("request_rate = 5.0\ntime_scale = 0.5", "time_scale"),
        ("request_rate = -3.0", "request_rate"),
        ("arrival = \"gamma\"", "arrival"),
        ("request_rate = 5.0\narrival = \"weibull\"", "arrival"),
        ("request_rate = 5.0\narrival_cv = 2.0", "arrival_cv"),
        ("request_rate = 5.0\narrival = \"gamma\"\narrival_cv = 0.0", "arrival_cv"),
    ] {
        let o = run(bad);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains(&format!("workload.stages.0.workload_params.{key}")), "{bad}: {err}");
    }
}

const SPLITWISE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/traces/splitwise_conv_2k.jsonl");

/// The shipped Splitwise run replays as its README describes it: 2,000
/// requests, 2,192,649 prompt and 529,807 output tokens (the sums of the
/// file as Vidur's generator made it), none longer than Vidur's 4,096 tokens,
/// the last arriving at 424.259 s.
#[test]
fn the_splitwise_trace_replays_the_requests_its_readme_counts() {
    let out = Spec::empty()
        .tiers(&[])
        .set("worker.inference_params.model", "synthetic")
        .set("worker.inference_params.mean_latency_secs", 0.001)
        .stage("Trace", toml! { trace_file = SPLITWISE })
        .run();
    assert_eq!(out.requests.len(), 2000);
    assert_eq!(out.requests.iter().map(|r| u64::from(r.prompt_tokens)).sum::<u64>(), 2_192_649);
    assert_eq!(out.requests.iter().map(|r| u64::from(r.output_tokens)).sum::<u64>(), 529_807);
    assert_eq!(out.requests.iter().map(|r| r.prompt_tokens + r.output_tokens).max(), Some(4096));
    let last = out.requests.iter().map(|r| r.arrival_s).fold(0.0, f64::max);
    assert!((last - 424.259).abs() < 1e-9, "{last}");
}
