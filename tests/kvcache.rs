//! The KV-cache hierarchy seen from outside: hits against an independent
//! reading of the trace, the load-versus-recompute trade-off, exact write
//! timing, and conservation of bytes and capacity.

use crate::fixtures::Spec;
use crate::run;
use std::collections::HashMap;
use toml::toml;

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

/// The shipped trace's rows: `(input_length, hash_ids)`.
fn trace_rows() -> Vec<(u64, Vec<u64>)> {
    std::fs::read_to_string(TRACE)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let ids = v["hash_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
            (v["input_length"].as_u64().unwrap(), ids)
        })
        .collect()
}

/// Replays the whole shipped trace into one worker (Llama-3.1-8B, a fixed
/// 1 ms step: the step model is irrelevant here) one request at a time —
/// each is sent when the previous one has responded — with the extra
/// settings `extra` adds; checks that every request found exactly the
/// `expected` tokens cached at its first admission and returns the run's
/// prefix-hit ratio and the reference's (hit tokens over prompt tokens).
fn replay_serially(extra: impl FnOnce(Spec) -> Spec, rows: &[(u64, Vec<u64>)], expected: &[u64]) -> (f64, f64) {
    let spec = Spec::llama8b()
        .set("worker.inference_params.model", "synthetic")
        .set("worker.inference_params.mean_latency_secs", 0.001)
        .stage("Trace", toml! { trace_file = TRACE max_outstanding_requests = 1 });
    let out = extra(spec).run();
    assert_eq!(out.requests.len(), rows.len());
    let got: Vec<u64> = out.requests.iter().map(|r| r.hit_tokens.iter().sum()).collect();
    let first_diff = got.iter().zip(expected).position(|(a, b)| a != b);
    assert_eq!(
        first_diff,
        None,
        "request {first_diff:?}: simulated {:?} vs expected {:?}",
        first_diff.map(|i| got[i]),
        first_diff.map(|i| expected[i])
    );
    let prompt: u64 = rows.iter().map(|r| r.0).sum();
    (out.summary.tiers.prefix_hit_ratio(), expected.iter().sum::<u64>() as f64 / prompt as f64)
}

#[test]
fn trace_replay_into_one_unbounded_gpu_hits_exactly_what_the_hash_ids_predict() {
    let rows = trace_rows();
    // A GPU that holds the whole trace, no tier below it.
    let extra = |s: Spec| s.set("worker.hw.memory_gb", 20000).tiers(&[]);
    let (got, want) = replay_serially(extra, &rows, &sequential_hits(&rows, 512, 16));
    assert_eq!(got, want);
    assert!(want > 0.3, "the conversation trace reuses a lot of context ({want})");
}

/// 40 requests, one every 2 s, of 2,100 tokens sharing a 2,048-token prefix;
/// prefix caching off so every hit comes from the tier below the GPU, whose
/// `[kvc]` settings are `kvc`.
fn dfs_run(kvc: toml::Table) -> opal::RunOutput {
    Spec::llama8b()
        .set("worker.vllm_params.enable_prefix_caching", false)
        .table("kvc", kvc)
        .stage(
            "UniformReqRate",
            toml! {
                request_rate = 0.5
                total_requests = 40
                prompt_size_min = 2100
                prompt_size_max = 2100
                default_prefix_length = 2048
                output_tokens_min = 8
                output_tokens_max = 8
            },
        )
        .run()
}

#[test]
fn a_slow_dfs_loses_to_recompute_and_a_fast_one_wins() {
    let dfs = |gbps: f64| toml! { kvc_tiers = ["DistributedFS"] [DistributedFS] bandwidth_GBps = gbps };
    let none = dfs_run(toml! { kvc_tiers = [] });
    let slow = dfs_run(dfs(1.0));
    let fast = dfs_run(dfs(100.0));
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
    Spec::llama8b()
        .tiers(&["CPUMemory"])
        .set("kvc.write_mode", mode)
        .stage(
            "UniformReqRate",
            toml! {
                total_requests = 1
                prompt_size_min = 512
                prompt_size_max = 512
                output_tokens_min = 1
                output_tokens_max = 1
            },
        )
        .run()
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
    let out = Spec::llama8b()
        .set("simulation.num_workers", 2)
        .set("worker.vllm_params.gpu_memory_utilization", 0.25)
        .set("worker.vllm_params.max_model_len", 32768)
        .tiers(&["CPUMemory", "DistributedFS"])
        .set("kvc.CPUMemory.capacity_GB", 64)
        .stage("Trace", toml! { trace_file = TRACE total_requests = 800 })
        .run();
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
        Spec::llama8b()
            .tiers(&["CPUMemory", "LocalNVMe"])
            .set("kvc.write_policy", policy)
            .set("kvc.CPUMemory.capacity_GB", 1)
            .stage(
                "UniformReqRate",
                toml! {
                    request_rate = 1.0
                    total_requests = 60
                    prompt_size_min = 2000
                    prompt_size_max = 4000
                    default_prefix_length = 0
                    output_tokens_min = 4
                    output_tokens_max = 4
                },
            )
            .run()
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
fn churn() -> Spec {
    Spec::llama8b()
        .set("worker.vllm_params.gpu_memory_utilization", 0.25)
        .set("worker.vllm_params.max_model_len", 32768)
        .tiers(&["CPUMemory"])
        .stage(
            "UniformReqRate",
            toml! {
                request_rate = 2.0
                total_requests = 100
                prompt_size_min = 1600
                prompt_size_max = 1600
                default_prefix_length = 0
                output_tokens_min = 2
                output_tokens_max = 2
            },
        )
}

#[test]
fn gpu_evictions_are_written_back_to_the_first_tier_when_asked() {
    let written = |spec: Spec| spec.run().summary.tiers.bytes_written[1];
    // A CPU tier big enough to keep every chunk already holds what the GPU evicts:
    // writing it back adds nothing.
    let big = churn().set("kvc.CPUMemory.capacity_GB", 1000);
    assert_eq!(written(big.clone().set("kvc.store_on_gpu_eviction", true)), written(big));
    // A 2 GiB tier (room for 10 of the 200 MiB contexts; the GPU keeps about
    // 25) has dropped them by then: they are written again. (An 8 GiB tier,
    // room for 40, still holds what the GPU evicts: a put of a held chunk
    // changes nothing, so its order stays that of the writes.)
    let small = || churn().set("kvc.CPUMemory.capacity_GB", 2);
    assert!(written(small().set("kvc.store_on_gpu_eviction", true)) > written(small()));
    let eight = churn();
    assert_eq!(written(eight.clone().set("kvc.store_on_gpu_eviction", true)), written(eight));
}

#[test]
fn kv_events_are_coalesced_per_worker_window() {
    let with = |coalesce_s: u64| {
        let mut s = churn().scenario();
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

/// One worker serving Llama-3.1-8B on an H100 with GPU prefix caching off,
/// CPU memory and the DFS below it, and a KV pool of `util` × 80 GiB − 15 GiB
/// of weights. Stage 0 writes the first 16,384 tokens of one sequence to the
/// tiers; stage 1 sends 400 Poisson requests at 12 req/s whose prompts (32 –
/// 16,384 tokens) are all prefixes of that sequence, as the Python Opal's are.
fn one_sequence(util: f64) -> opal::RunOutput {
    Spec::llama8b()
        .table(
            "worker.vllm_params",
            toml! { enable_prefix_caching = false gpu_memory_utilization = util max_model_len = 16512 },
        )
        .tiers(&["CPUMemory", "DistributedFS"])
        .set("kvc.write_mode", "sync")
        .stage(
            "UniformReqRate",
            toml! {
                total_requests = 1
                prompt_size = 16384
                output_tokens = 1
                prompt_content = "single_sequence"
            },
        )
        .stage(
            "ExponentialReqRate",
            toml! { request_rate = 12.0 total_requests = 400 prompt_content = "single_sequence" },
        )
        .run()
}

#[test]
fn with_tight_gpu_memory_no_request_recomputes_a_prefix_a_tier_holds() {
    // util 0.25: 20 GiB − 15 GiB of weights = 2,581 blocks, 41,296 tokens —
    // less than the 8 loads of up to 16,384 tokens the I/O slots allow at once.
    let (tight, ample) = (one_sequence(0.25), one_sequence(0.9));
    assert!(tight.summary.tiers.prompt_tokens > 0 && tight.summary.requests_completed == 401);
    for out in [&tight, &ample] {
        // From the start of stage 1 the tiers hold every whole 256-token chunk
        // of the sequence, so a prompt of L tokens finds at least its whole
        // chunks (all but its last token at most).
        for r in out.requests.iter().filter(|r| r.stage == 1) {
            let l = u64::from(r.prompt_tokens);
            let held = (l / 256 * 256).min(l - 1);
            let hit: u64 = r.hit_tokens.iter().sum();
            assert!(hit >= held && hit < l, "request {}: {l} tokens, {hit} hit, {held} held", r.id);
            if r.preemptions == 0 {
                assert_eq!(r.prefill_tokens_computed, l - hit, "request {} computed only what it did not find", r.id);
            }
        }
    }
    let (t, a) = (tight.summary.tiers.prefix_hit_ratio(), ample.summary.tiers.prefix_hit_ratio());
    assert!(t > 0.95 && (t - a).abs() < 0.02, "hit ratio {t} with tight memory vs {a} with ample");
    // Tight memory did bind: requests waited for blocks to load into.
    assert!(
        tight.summary.queue_wait_ms.mean > 2.0 * ample.summary.queue_wait_ms.mean,
        "queue wait {} ms vs {} ms",
        tight.summary.queue_wait_ms.mean,
        ample.summary.queue_wait_ms.mean
    );
}

fn one_request_stored(save_decode_cache: bool) -> opal::RunOutput {
    Spec::llama8b()
        .tiers(&["CPUMemory"])
        .set("kvc.save_decode_cache", save_decode_cache)
        .stage("UniformReqRate", toml! { total_requests = 1 prompt_size = 1000 output_tokens = 100 })
        .run()
}

#[test]
fn only_prompt_kv_is_stored_unless_decode_kv_is_asked_for() {
    // Llama-3.1-8B: 128 KiB per token. The 1,000-token prompt is three chunks
    // of 256 tokens and a partial one of 232 (LMCache keys it by its exact
    // tokens, so all of them are stored).
    let token = 131_072;
    assert_eq!(one_request_stored(false).summary.tiers.bytes_written[1], 1000 * token);
    // With save_decode_cache the 99 generated tokens whose KV was computed
    // (the last one's never is) count too: 1,099 tokens. The prompt's
    // partial chunk [768, 1000) was saved as the prompt was computed; the
    // chunk [768, 1024) that later holds it and 24 output tokens is another
    // chunk, and the output's last, partial one is [1024, 1099): 1,000 + 256 + 75.
    assert_eq!(one_request_stored(true).summary.tiers.bytes_written[1], (1000 + 256 + 75) * token);
}

/// Independent reference for a trace replayed one request at a time into a
/// tier that never evicts, GPU prefix caching off: the tier holds chunks of
/// `chunk` tokens of every earlier prompt, each identified by its hash-id
/// prefix and its length in tokens (a prompt's last chunk may be short;
/// LMCache keys it by its exact tokens, so it matches only a chunk of the
/// same tokens to the same length). A request finds its chunks in order
/// until the first miss; its hit is what they cover, all but its last token
/// at most. Chunks past the prompt's hash ids are unique to it and never match.
fn serial_tier_hits(rows: &[(u64, Vec<u64>)], chunk: u64) -> Vec<u64> {
    let mut held: std::collections::HashSet<(Vec<u64>, u64)> = std::collections::HashSet::new();
    rows.iter()
        .map(|(input, ids)| {
            let chunks: Vec<(Vec<u64>, u64)> = (0..input.div_ceil(chunk).min(ids.len() as u64))
                .map(|j| (ids[..=j as usize].to_vec(), (*input).min((j + 1) * chunk) - j * chunk))
                .collect();
            let matched: u64 = chunks.iter().take_while(|c| held.contains(c)).map(|c| c.1).sum();
            held.extend(chunks);
            matched.min(input - 1)
        })
        .collect()
}

#[test]
fn serial_trace_replay_from_a_cpu_tier_hits_what_the_hash_ids_predict() {
    let rows = trace_rows();
    // GPU prefix caching off, a CPU tier that never evicts, chunks of 512
    // tokens (the trace's), and responses that wait for their KV to be
    // written (sync), so every request sees every earlier one's chunks.
    let extra = |s: Spec| {
        s.set("worker.vllm_params.enable_prefix_caching", false)
            .tiers(&["CPUMemory"])
            .set("kvc.chunk_size", 512)
            .set("kvc.write_mode", "sync")
            .set("kvc.CPUMemory.capacity_GB", 1000000)
    };
    let (got, want) = replay_serially(extra, &rows, &serial_tier_hits(&rows, 512));
    assert!((got - want).abs() < 0.0005, "hit ratio {got} vs {want}");
    assert!(want > 0.3, "the conversation trace reuses a lot of context ({want})");
}

#[test]
fn an_imported_opal_study_at_12_requests_per_second_hits_its_shared_prompts() {
    // The shipped Opal JSON: Opal's defaults (GPU prefix caching off, all of
    // memory_gb for vLLM), one H100, Granite-3.3-8B, CPU + DFS tiers, 3,000
    // Poisson requests at 12 req/s whose prompts are prefixes of one sequence.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/opal/exponential-12rps.json");
    let spec = opal::config::load_spec(&path).unwrap_or_else(|e| panic!("{e}"));
    let plan = opal::sweep::plan(&spec).unwrap();
    let out = run(&opal::sweep::run_scenario(&plan.runs().next().unwrap()).unwrap());
    let s = &out.summary;
    assert_eq!(s.requests_completed, 3000);
    assert!(s.tiers.prefix_hit_ratio() > 0.95, "hit ratio {}", s.tiers.prefix_hit_ratio());
    // It keeps up: completions per second match the rate the requests came at.
    let offered = 3000.0 / out.requests.iter().map(|r| r.arrival_s).fold(0.0, f64::max);
    assert!((s.requests_per_s / offered - 1.0).abs() < 0.02, "{} req/s served of {offered} offered", s.requests_per_s);
}

/// Request A (4,096 tokens, prefilled in two steps of 2,048) on worker 0 and,
/// if `b_at` is given, the same prompt as request B on worker 1 at `b_at`
/// seconds: round robin, GPU prefix caching off, one DFS tier (100 GB/s,
/// 100 µs), KV saved as computed.
fn a_then_b(dir: &std::path::Path, b_at: Option<f64>) -> opal::RunOutput {
    let ids: Vec<u32> = (0..8).collect();
    let mut lines =
        format!("{{\"timestamp\": 0, \"input_length\": 4096, \"output_length\": 4, \"hash_ids\": {ids:?}}}\n");
    if let Some(t) = b_at {
        lines +=
            &format!("{{\"timestamp\": {t}, \"input_length\": 4096, \"output_length\": 4, \"hash_ids\": {ids:?}}}\n");
    }
    let trace = dir.join(format!("ab-{}.jsonl", b_at.map_or(0, f64::to_bits)));
    std::fs::write(&trace, lines).unwrap();
    let s = Spec::llama8b()
        .set("simulation.num_workers", 2)
        .set("router.router_params.policy", "RoundRobin")
        .set("worker.vllm_params.enable_prefix_caching", false)
        .set("worker.vllm_params.max_num_batched_tokens", 2048)
        .tiers(&["DistributedFS"])
        .stage("Trace", toml! { trace_file = (trace.display().to_string()) multiplier_to_sec = 1.0 })
        .scenario();
    let opts = opal::RunOptions { step_records: true, ..opal::RunOptions::default() };
    opal::simulate_with(&s, &opts).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_chunk_saved_as_its_step_ends_is_hit_on_another_worker_once_written_and_not_before() {
    let dir = crate::temp_dir("save-as-computed");
    let alone = a_then_b(&dir, None);
    // A's first step computes tokens 0..2,048 (8 chunks of 256); they are
    // written to the DFS when it ends: 100 µs + 2,048 × 128 KiB / 100 GB/s.
    let first = &alone.steps[0];
    assert_eq!((first.worker, first.prefill_tokens), (0, 2048));
    let step_end = first.start_s + first.duration_s;
    let written = step_end + 100e-6 + 2048.0 * alone.summary.kv_bytes_per_token as f64 / 100e9;
    let a_done = alone.requests[0].e2e_s.unwrap();
    assert!(written + 0.001 < a_done, "A is still prefilling when its first chunks land");
    let dfs_hit = |b_at: f64| a_then_b(&dir, Some(b_at)).requests[1].hit_tokens[3];
    assert_eq!(dfs_hit(written + 1e-6), 2048, "B finds the 8 chunks A's first step computed");
    assert_eq!(dfs_hit(written - 1e-6), 0, "the write is not complete: nothing to find");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_original_opals_workload_warms_up_as_the_original_does() {
    // examples/opal/cold-start.toml: the Python Opal's request sequence (its
    // prompt model, 12 req/s per worker on 16 H100s). The Python Opal: 90 %
    // token-weighted hit over the first 1,000 requests, 98.5 % over
    // requests 5,000-9,999 (measured from outside, issue 24).
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/opal/cold-start.toml");
    let spec = opal::config::load_spec(&path).unwrap_or_else(|e| panic!("{e}"));
    let plan = opal::sweep::plan(&spec).unwrap();
    let out = run(&opal::sweep::run_scenario(&plan.runs().next().unwrap()).unwrap());
    assert_eq!(out.requests.len(), 10_000);
    let hit = |from: u32, to: u32| {
        let rows = out.requests.iter().filter(|r| (from..to).contains(&r.id));
        let (hit, prompt) =
            rows.fold((0, 0), |(h, p), r| (h + r.hit_tokens.iter().sum::<u64>(), p + u64::from(r.prompt_tokens)));
        hit as f64 / prompt as f64
    };
    let (cold, steady) = (hit(0, 1000), hit(5000, 10_000));
    assert!(cold >= 0.85, "first 1,000 requests: {cold}");
    assert!((steady - 0.985).abs() <= 0.01, "requests 5,000-9,999: {steady}");
}

#[test]
fn on_the_original_opals_workload_dfs_hits_stay_local_and_a_faster_gpu_never_slows_the_platform() {
    // examples/opal/cold-start.toml (16 H100s, CPU 8 GiB + DFS). A chunk a
    // worker reads from the DFS is kept in its CPU memory (LMCache's write
    // back), so the DFS serves what no worker holds: a few per cent of the
    // tier hits. Without it (issue 35) the DFS served 31 % and saturated
    // when prefill got 4× cheaper (0.81 → 0.96 busy; 188 → 117 req/s).
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/opal/cold-start.toml");
    let spec = opal::config::load_spec(&path).unwrap_or_else(|e| panic!("{e}"));
    let plan = opal::sweep::plan(&spec).unwrap();
    let base = opal::sweep::run_scenario(&plan.runs().next().unwrap()).unwrap();
    let dfs_share = |out: &opal::RunOutput| {
        let h = &out.summary.tiers.hit_tokens;
        h[3] as f64 / (h[1] + h[2] + h[3]) as f64
    };
    let out = run(&base);
    assert!(dfs_share(&out) <= 0.05, "DFS share of tier hits {}", dfs_share(&out));
    // A 4× cheaper prefill (every compute-bound operator at a quarter).
    let mut faster = base.clone();
    let opal::worker::perf::StepModel::Operators(ops) = &mut faster.worker.perf else {
        panic!("the default step model")
    };
    ops.constants.compute_scale = 0.25;
    let fast = run(&faster);
    assert!(dfs_share(&fast) <= 0.05, "DFS share of tier hits {}", dfs_share(&fast));
    let (slow_s, fast_s) = (&out.summary, &fast.summary);
    assert!(fast_s.requests_per_s >= slow_s.requests_per_s, "{} < {}", fast_s.requests_per_s, slow_s.requests_per_s);
    assert!(fast_s.ttft_ms.p50 <= slow_s.ttft_ms.p50, "TTFT p50 {} > {}", fast_s.ttft_ms.p50, slow_s.ttft_ms.p50);
    // The key off: the DFS serves what the workers read from it again and again.
    let mut off = base;
    off.kvc.write_back_hits = false;
    assert!(dfs_share(&run(&off)) > 0.2);
}

/// Per request after the first 20 (the second 20 of 40 against a run of 20):
/// tier-store writes asked for, device operations, chunks named by the KV
/// events applied to the router's index, recency refreshes, and updates of
/// the index (events applied, each a run) — every prompt a `prefix` shared
/// by the stage and `own` tokens of its own, one worker, CPU memory and NVMe.
fn work_per_request(prefix: i64, own: i64) -> [f64; 5] {
    let run = |n: i64| {
        Spec::llama8b()
            .tiers(&["CPUMemory", "LocalNVMe"])
            .set("router.router_params.policy", "MaxPrefix")
            // The index applies every event as it arrives.
            .set("router.router_params.periodic_infra_update_collection_time", 0.0)
            // Room for the shared prefix and the own tokens of about three
            // prompts on the GPU, four in CPU memory and eight on NVMe (128
            // KiB per token), so that every size evicts alike: each new
            // prompt evicts an old one's own chunks everywhere.
            .set("worker.vllm_params.num_gpu_blocks_override", (prefix + 3 * own) / 16 + 64)
            .set("kvc.CPUMemory.capacity_GB", (prefix + 4 * own) as f64 / 8192.0)
            .set("kvc.LocalNVMe.capacity_GB", (prefix + 8 * own) as f64 / 8192.0)
            .set("worker.vllm_params.max_model_len", prefix + own + 16)
            // One prefill step per prompt: a step's new chunks are saved at its end.
            .set("worker.vllm_params.chunked_prefill", false)
            .set("worker.vllm_params.max_num_batched_tokens", 65536)
            .stage(
                "UniformReqRate",
                toml! {
                    request_rate = 1.0
                    total_requests = n
                    prompt_size_min = (prefix + own)
                    prompt_size_max = (prefix + own)
                    default_prefix_length = prefix
                    output_tokens_min = 2
                    output_tokens_max = 2
                },
            )
            .run()
    };
    let (a, b) = (run(20), run(40));
    let per = |x: u64, y: u64| (y - x) as f64 / 20.0;
    [
        per(a.store_ops.writes, b.store_ops.writes),
        per(a.store_ops.io_ops, b.store_ops.io_ops),
        per(a.summary.kv_events, b.summary.kv_events),
        per(a.store_ops.refreshes, b.store_ops.refreshes),
        per(a.index_updates, b.index_updates),
    ]
}

#[test]
fn a_requests_tier_writes_and_kv_events_do_not_grow_with_its_shared_prefix() {
    let (short, long) = (work_per_request(1024, 512), work_per_request(32 * 1024, 512));
    // The 512 tokens of its own are 2 new chunks of 256 tokens, one run of
    // its own chain: one write to each of the 2 tiers, whatever the prefix
    // (1,024 tokens is 4 chunks, 32,768 is 128, all held already).
    assert_eq!(short[0], 2.0, "writes, 1k prefix");
    assert_eq!(long[0], short[0], "writes, 32k prefix");
    assert_eq!(long[1], short[1], "device operations");
    assert_eq!(long[2], short[2], "KV events");
    // Recency is refreshed once per request (LMCache's lookup) for the
    // prefix's chunks in the tier first holding them: one run of one chain.
    assert_eq!(short[3], 1.0, "recency refreshes, 1k prefix");
    assert_eq!(long[3], short[3], "recency refreshes, 32k prefix");
    // The index applies runs, whatever the prefix (measured: 9.95, 10.3).
    assert!(short[4] <= 12.0 && long[4] <= 12.0, "index updates {} and {}", short[4], long[4]);
}

#[test]
fn a_requests_tier_writes_do_not_grow_with_its_own_prompt() {
    // 1k and 32k tokens of its own (4 and 128 new chunks) after a 1k shared
    // prefix, each prompt computed in one step: one run per tier written
    // either way, the same device operations, one refresh of the held prefix.
    // (With chunked prefill each step's chunks are one write per tier.)
    let (short, long) = (work_per_request(1024, 1024), work_per_request(1024, 32 * 1024));
    assert_eq!(short[0], 2.0, "writes, 1k prompt");
    assert_eq!(long[0], short[0], "writes, 32k prompt");
    assert_eq!(long[1], short[1], "device operations");
    assert_eq!(long[3], short[3], "recency refreshes");
    // The index applies runs: the request's chunks stored in the GPU and
    // each tier, and removed from them, a run each way, 4 or 128 chunks.
    // The index applies runs: the request's own chunks stored in the GPU
    // and each tier and later removed from them, a run each way (a removal
    // taking parts of two prompts' runs at most), 4 or 128 chunks each
    // (measured: 10.05 and 9.65 updates per request for 24 and 768 chunks).
    assert_eq!((short[2], long[2]), (24.0, 768.0), "chunks named: 4 or 128, stored and removed in 3 places");
    assert!(short[4] <= 12.0 && long[4] <= 12.0, "index updates {} and {}", short[4], long[4]);
}

/// One H100 serving `n` identical requests (`prompt` tokens in, `output`
/// out, arriving together) from a pool of `blocks` KV blocks, with or
/// without a CPU tier, under `scheduler` (`"v0-unchunked"`: v0 with chunked
/// prefill off); GPU prefix caching off, so a preempted request finds its
/// prompt only in the tier.
fn pressure(n: u32, blocks: u64, prompt: u32, output: u32, tier: bool, scheduler: &str) -> opal::Scenario {
    let chunked = scheduler != "v0-unchunked";
    // The pool holds one sequence of max_model_len, as vLLM requires.
    let max_len = blocks * 16;
    let scheduler = if chunked { scheduler } else { "v0" };
    let tiers = if tier { "[\"CPUMemory\"]" } else { "[]" };
    let s = crate::scenario(&format!(
        r#"
        [simulation]
        num_workers = 1
        [model.model_params]
        name = "llama-3.1-8b"
        [worker.hw]
        gpu = "H100"
        [worker.vllm_params]
        max_model_len = {max_len}
        enable_prefix_caching = false
        scheduler = "{scheduler}"
        chunked_prefill = {chunked}
        num_gpu_blocks_override = {blocks}
        [kvc]
        kvc_tiers = {tiers}
        [kvc.CPUMemory]
        capacity_GB = 8
        [[workload.stages]]
        type = "UniformReqRate"
        [workload.stages.workload_params]
        request_rate = 1000000.0
        total_requests = {n}
        prompt_size_min = {prompt}
        prompt_size_max = {prompt}
        output_tokens_min = {output}
        output_tokens_max = {output}
        default_prefix_length = {prompt}
        "#
    ));
    assert_eq!(s.worker.total_blocks, blocks);
    s
}

#[test]
fn under_kv_pressure_every_request_completes_with_bounded_preemptions() {
    // The measured stall (issue 35): 2 and 16 requests of 512 + 1,000 tokens
    // (95 blocks each) on 124 blocks, with a CPU tier, under v0 and v1.
    // Two requests by hand: both prefill (32 blocks each) and decode until
    // both need their 63rd block at 992 tokens (124 = 2 × 62); v0 preempts
    // the later admitted, whose reload (32 blocks) and recompute (31) wait
    // until the first finishes: one preemption.
    let two = crate::run(&pressure(2, 124, 512, 1000, true, "v0"));
    assert_eq!((two.summary.requests_completed, two.summary.preemptions), (2, 1));
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = |lo: u64, hi: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        lo + x % (hi - lo + 1)
    };
    // Then 100 seeded variants: 1–64 requests, 64–512 blocks, each request
    // fitting alone, the tier on and off, both schedulers (v0 with chunked
    // prefill on and off).
    let mut cases = vec![(16, 124, 512, 1000, true, "v1"), (2, 124, 512, 1000, true, "v0-unchunked")];
    for i in 0..100 {
        let blocks = next(64, 512);
        let len = next(32, (blocks * 16).min(4096)) as u32;
        let prompt = next(16, u64::from(len) - 16) as u32;
        cases.push((
            next(1, 64) as u32,
            blocks,
            prompt,
            len - prompt,
            i % 2 == 0,
            ["v1", "v1", "v0", "v0-unchunked"][i % 4],
        ));
    }
    for (n, blocks, prompt, output, tier, scheduler) in cases {
        let case = format!("{n} requests of {prompt} + {output} on {blocks} blocks, tier {tier}, {scheduler}");
        let out = crate::run(&pressure(n, blocks, prompt, output, tier, scheduler));
        assert_eq!(out.summary.requests_completed, u64::from(n), "{case}");
        // The bound. Blocks are taken from others (a running request
        // preempted, or a waiting one's loaded KV given up) only when a
        // running request needs blocks none can spare, each one freeing at
        // least one block, so at most as many as it needs. Here every
        // sequence fits in one chunk (≤ 4,096 tokens, a budget of 8,192): a
        // request is admitted, first or again, with its whole context's
        // blocks free — admission takes none from others — so only decode
        // steps need blocks: one per block boundary a decoding sequence
        // crosses, which it crosses once (a recompute re-allocates what it
        // had, at admission). (Loaded KV never blocks other loaded KV here:
        // a load starts only with its next chunk promised.) So at most
        // ⌈(prompt + output)/16⌉ − ⌊prompt/16⌋ per request, n times that in
        // all.
        let crossings = u64::from(prompt + output).div_ceil(16) - u64::from(prompt) / 16;
        let bound = u64::from(n) * crossings;
        assert!(out.summary.preemptions <= bound, "{case}: {} preemptions (bound {bound})", out.summary.preemptions);
    }
}
