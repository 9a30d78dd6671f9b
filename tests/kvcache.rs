//! The KV-cache hierarchy seen from outside: hits against an independent
//! reading of the trace, the load-versus-recompute trade-off, exact write
//! timing, and conservation of bytes and capacity.

use crate::{run, scenario};
use std::collections::HashMap;

const TRACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/traces/conversation_trace.jsonl");

/// Independent reference: trace rows `(input_length, hash_ids)` replayed one
/// after another into an unbounded prefix cache with `block`-token blocks.
/// A chunk of a later request matches as many tokens as the longest earlier
/// occurrence of the same hash id at the same position had; only full blocks
/// count, and the last prompt token is always computed.
fn sequential_hits(rows: &[(u64, Vec<u64>)], chunk: u64, block: u64) -> Vec<u64> {
    let mut seen: HashMap<(usize, u64), u64> = HashMap::new();
    rows.iter()
        .map(|(input, ids)| {
            let len_of = |j: usize| chunk.min(input.saturating_sub(j as u64 * chunk));
            let mut matched = 0;
            for (j, h) in ids.iter().enumerate() {
                let (len, prev) = (len_of(j), seen.get(&(j, *h)).copied().unwrap_or(0));
                if len == 0 {
                    break;
                }
                matched += len.min(prev);
                if prev < len {
                    break;
                }
            }
            for (j, h) in ids.iter().enumerate() {
                let len = len_of(j);
                if len > 0 {
                    let e = seen.entry((j, *h)).or_insert(0);
                    *e = (*e).max(len);
                }
            }
            (matched / block).min((input - 1) / block) * block
        })
        .collect()
}

#[test]
fn the_reference_hit_function_follows_the_prefix_property() {
    let rows = vec![(1100, vec![1, 2, 3]), (1024, vec![1, 2]), (700, vec![1, 9]), (600, vec![1, 2])];
    // 1: nothing seen. 2: chunks 1, 2 seen (512 each), capped at T − 1 = 1023 → 63 blocks = 1008.
    // 3: chunk 1 (512), then 9 unseen → 512. 4: chunk 1 (512) + chunk 2 (88 of 512) = 600,
    //    capped at 599 → 37 blocks = 592.
    assert_eq!(sequential_hits(&rows, 512, 16), vec![0, 1008, 512, 592]);
}

#[test]
fn trace_replay_into_one_unbounded_worker_hits_exactly_what_the_hash_ids_predict() {
    let rows: Vec<(u64, Vec<u64>)> = std::fs::read_to_string(TRACE)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let ids = v["hash_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
            (v["input_length"].as_u64().unwrap(), ids)
        })
        .collect();
    let expected = sequential_hits(&rows, 512, 16);
    // One worker with memory for the whole trace, requests one at a time so
    // each sees every earlier one cached; the step model is irrelevant here.
    let out = run(&scenario(&format!(
        r#"
        [model.model_params]
        name = "llama-3.1-8b"
        [worker.hw]
        memory_gb = 10000
        [kvc]
        kvc_tiers = ["CPUMemory"]
        [kvc.CPUMemory]
        capacity_GB = 1000000
        [worker.inference_params]
        model = "synthetic"
        mean_latency_secs = 0.001
        [[workload.stages]]
        type = "Trace"
        [workload.stages.workload_params]
        trace_file = "{TRACE}"
        max_outstanding_requests = 1
        "#
    )));
    assert_eq!(out.requests.len(), rows.len());
    let got: Vec<u64> = out.requests.iter().map(|r| r.hit_tokens.iter().sum()).collect();
    let first_diff = got.iter().zip(&expected).position(|(a, b)| a != b);
    assert_eq!(
        first_diff,
        None,
        "request {first_diff:?}: simulated {:?} vs expected {:?}",
        first_diff.map(|i| got[i]),
        first_diff.map(|i| expected[i])
    );
    let prompt: u64 = rows.iter().map(|r| r.0).sum();
    let ratio = expected.iter().sum::<u64>() as f64 / prompt as f64;
    assert_eq!(out.summary.tiers.prefix_hit_ratio(), ratio);
    assert!(ratio > 0.3, "the conversation trace reuses a lot of context ({ratio})");
}

/// 40 requests, one every 2 s, of 2,100 tokens sharing a 2,048-token prefix;
/// prefix caching off so every hit comes from the tier below the GPU.
fn dfs_run(tier: &str) -> opal::RunOutput {
    run(&scenario(&format!(
        r#"
        [model.model_params]
        name = "llama-3.1-8b"
        [worker.vllm_params]
        enable_prefix_caching = false
        {tier}
        [[workload.stages]]
        type = "UniformReqRate"
        [workload.stages.workload_params]
        request_rate = 0.5
        total_requests = 40
        prompt_size_min = 2100
        prompt_size_max = 2100
        default_prefix_length = 2048
        output_tokens_min = 8
        output_tokens_max = 8
        "#
    )))
}

#[test]
fn a_slow_dfs_loses_to_recompute_and_a_fast_one_wins() {
    let dfs =
        |gbps: f64| format!("[kvc]\nkvc_tiers = [\"DistributedFS\"]\n[kvc.DistributedFS]\nbandwidth_GBps = {gbps}\n");
    let none = dfs_run("[kvc]\nkvc_tiers = []");
    let slow = dfs_run(&dfs(1.0));
    let fast = dfs_run(&dfs(100.0));
    // 2,048 prefix tokens are 256 MiB of KV: 268 ms at 1 GB/s, 2.7 ms at 100 GB/s,
    // against about 29 ms to recompute them.
    let ttft = |o: &opal::RunOutput| o.summary.ttft_ms.mean;
    assert!(ttft(&slow) > ttft(&none), "slow DFS {} ms vs recompute {} ms", ttft(&slow), ttft(&none));
    assert!(ttft(&fast) < ttft(&none), "fast DFS {} ms vs recompute {} ms", ttft(&fast), ttft(&none));
    for o in [&slow, &fast] {
        // All but the first request load the 2,048-token prefix (128 blocks) from the DFS.
        assert_eq!(o.summary.tiers.hit_tokens[3], 39 * 2048);
        assert!(!o.summary.kv_fetch_ms.p50.is_nan(), "fetch times are recorded");
    }
    assert_eq!(none.summary.tiers.prefix_hit_ratio(), 0.0);
}

fn one_request(mode: &str) -> opal::RunOutput {
    run(&scenario(&format!(
        r#"
        [model.model_params]
        name = "llama-3.1-8b"
        [kvc]
        kvc_tiers = ["CPUMemory"]
        write_mode = "{mode}"
        [[workload.stages]]
        type = "UniformReqRate"
        [workload.stages.workload_params]
        total_requests = 1
        prompt_size_min = 512
        prompt_size_max = 512
        output_tokens_min = 1
        output_tokens_max = 1
        "#
    )))
}

#[test]
fn a_synchronous_write_delays_the_response_by_exactly_the_write_time() {
    let (a, s) = (one_request("async"), one_request("sync"));
    let e2e_ns = |o: &opal::RunOutput| (o.requests[0].e2e_s.unwrap() * 1e9).round() as u64;
    // 512 computed tokens = 32 blocks = 2 chunks of 256 tokens, 2 × 16 × 2 MiB =
    // 67,108,864 B written to CPU memory: 200 ns latency + 67,108,864 / 50 B/ns
    // = 1,342,177.28 → 1,342,178 ns.
    assert_eq!(e2e_ns(&s) - e2e_ns(&a), 200 + 1_342_178);
    assert_eq!(a.summary.tiers.bytes_written[1], 67_108_864);
    assert_eq!(s.requests[0].ttft_s, a.requests[0].ttft_s, "the write does not touch the first token");
}

#[test]
fn bytes_hits_and_capacity_are_conserved_with_a_small_cpu_tier() {
    // Two workers replay 800 conversation requests; their GPUs hold about
    // 2,580 blocks (41,000 tokens), so earlier turns are evicted and reloaded
    // from a 64 GiB CPU tier (2,048 chunks of 32 MiB) or the shared DFS. Requests
    // longer than 32,768 tokens are rejected, as vLLM would.
    let out = run(&scenario(&format!(
        r#"
        [simulation]
        num_workers = 2
        [model.model_params]
        name = "llama-3.1-8b"
        [worker.vllm_params]
        gpu_memory_utilization = 0.25
        max_model_len = 32768
        [kvc]
        kvc_tiers = ["CPUMemory", "DistributedFS"]
        [kvc.CPUMemory]
        capacity_GB = 64
        [[workload.stages]]
        type = "Trace"
        [workload.stages.workload_params]
        trace_file = "{TRACE}"
        total_requests = 800
        "#
    )));
    let s = &out.summary;
    assert_eq!(s.requests_completed + s.requests_rejected, 800, "every request completes or is rejected");
    let too_long = std::fs::read_to_string(TRACE)
        .unwrap()
        .lines()
        .take(800)
        .filter(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["input_length"].as_u64().unwrap() + v["output_length"].as_u64().unwrap() > 32768
        })
        .count() as u64;
    assert_eq!(s.requests_rejected, too_long, "exactly the requests longer than max_model_len are rejected");
    for r in &out.requests {
        assert!(
            r.hit_tokens.iter().sum::<u64>() < u64::from(r.prompt_tokens),
            "hits never reach the last prompt token"
        );
    }
    // Bytes read by fetches are the bytes the tiers' devices moved out.
    for t in 1..4 {
        let fetched: u64 = out.requests.iter().map(|r| r.read_bytes[t]).sum();
        assert_eq!(fetched, s.tiers.bytes_read[t], "tier {t}");
    }
    // The time series saw every completed operation's bytes.
    let series: u64 = out.series.iter().map(|r| r.tier_bytes.iter().sum::<u64>()).sum();
    assert_eq!(series, s.tiers.bytes_read.iter().sum::<u64>() + s.tiers.bytes_written.iter().sum::<u64>());
    assert!(
        s.tiers.hit_tokens[1] > 0 && s.tiers.hit_tokens[3] > 0,
        "the CPU and DFS tiers served hits: {:?}",
        s.tiers.hit_tokens
    );
    assert!(
        s.tiers.occupancy_peak[1] <= 1.0 && s.tiers.occupancy_peak[1] > 0.9,
        "the CPU tier filled up to, not past, its capacity"
    );
}

#[test]
fn spill_moves_what_the_first_tier_evicts_down_instead_of_writing_everything_twice() {
    let run_with = |policy: &str| {
        run(&scenario(&format!(
            r#"
            [model.model_params]
            name = "llama-3.1-8b"
            [kvc]
            kvc_tiers = ["CPUMemory", "LocalNVMe"]
            write_policy = "{policy}"
            [kvc.CPUMemory]
            capacity_GB = 1
            [[workload.stages]]
            type = "UniformReqRate"
            [workload.stages.workload_params]
            request_rate = 1.0
            total_requests = 60
            prompt_size_min = 2000
            prompt_size_max = 4000
            default_prefix_length = 0
            output_tokens_min = 4
            output_tokens_max = 4
            "#
        )))
    };
    let (through, spill) = (run_with("write_through"), run_with("spill"));
    let w = |o: &opal::RunOutput, t: usize| o.summary.tiers.bytes_written[t];
    // Write-through sends every chunk to both tiers; spill only what CPU memory evicts.
    assert_eq!(w(&through, 1), w(&through, 2));
    assert_eq!(w(&spill, 1), w(&through, 1));
    assert!(w(&spill, 2) > 0 && w(&spill, 2) < w(&through, 2), "{} vs {}", w(&spill, 2), w(&through, 2));
    // Everything written to CPU memory beyond what it still holds (at most its
    // 1 GiB) was evicted and written one tier down.
    let still_in_cpu = w(&spill, 1) - w(&spill, 2);
    assert!(still_in_cpu <= 1 << 30 && still_in_cpu > (1 << 30) * 9 / 10, "{still_in_cpu} bytes left in CPU memory");
}

/// Requests that each bring a new 1,600-token context to one worker whose GPU
/// holds about 2,580 blocks, so earlier contexts are evicted from the GPU.
fn churn(extra: &str) -> opal::Scenario {
    scenario(&format!(
        r#"
        [model.model_params]
        name = "llama-3.1-8b"
        [worker.vllm_params]
        gpu_memory_utilization = 0.25
        max_model_len = 32768
        [kvc]
        kvc_tiers = ["CPUMemory"]
        {extra}
        [[workload.stages]]
        type = "UniformReqRate"
        [workload.stages.workload_params]
        request_rate = 2.0
        total_requests = 100
        prompt_size_min = 1600
        prompt_size_max = 1600
        default_prefix_length = 0
        output_tokens_min = 2
        output_tokens_max = 2
        "#
    ))
}

#[test]
fn gpu_evictions_are_written_back_to_the_first_tier_when_asked() {
    let written = |extra: &str| run(&churn(extra)).summary.tiers.bytes_written[1];
    // A CPU tier big enough to keep every chunk already holds what the GPU evicts:
    // writing it back adds nothing.
    let big = "[kvc.CPUMemory]\ncapacity_GB = 1000";
    assert_eq!(written(&format!("store_on_gpu_eviction = true\n{big}")), written(big));
    // An 8 GiB tier has dropped many of them by then: they are written again.
    assert!(written("store_on_gpu_eviction = true") > written(""));
}

#[test]
fn kv_events_are_coalesced_per_worker_window() {
    let with = |coalesce_s: u64| {
        let mut s = churn("");
        s.kvc.publish_events = true;
        s.worker.publish_events = true;
        s.kvc.event_coalesce = opal::time::SimDuration::from_secs(coalesce_s);
        run(&s)
    };
    let (often, rarely) = (with(0), with(10));
    // The same events are published; the window only batches them.
    assert!(often.summary.kv_events > 0);
    assert_eq!(often.summary.kv_events, rarely.summary.kv_events);
    // With a 10 s window one worker sends at most one batch per 10 s of activity.
    let windows = (rarely.summary.sim_time_s / 10.0).ceil() as u64 + 1;
    assert!(
        rarely.summary.kv_event_batches <= windows,
        "{} batches in {} s",
        rarely.summary.kv_event_batches,
        rarely.summary.sim_time_s
    );
    assert!(often.summary.kv_event_batches > 10 * rarely.summary.kv_event_batches);
}
