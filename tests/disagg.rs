//! Disaggregated prefill and decode, by hand: one request through a
//! prefill and a decode worker, transfers sharing a link, a decode worker
//! out of blocks, conditional disaggregation, and the TPOT it buys.

use crate::fixtures::Spec;
use opal::metrics::RequestRecord;
use opal::time::SimDuration;
use toml::toml;

/// Seconds → ns, rounded up, as the simulator converts step times.
fn ns(secs: f64) -> u64 {
    SimDuration::from_secs_f64(secs).0
}

/// Llama-3.1-8B on one H100 as the roofline (Opal's a = 4, b = 24) sees it
/// (the tests that price steps by hand choose `model = "roofline"`).
struct Llama8bH100 {
    flops: f64,
    bw: f64,
    weights: f64,
    kv: f64,
}

impl Llama8bH100 {
    fn new() -> Self {
        let h100 = opal::worker::presets::GpuSpec::preset("H100").unwrap();
        let model = opal::worker::model::ModelArch::preset("llama-3.1-8b").unwrap();
        Llama8bH100 {
            flops: h100.tflops * 1e12,
            bw: h100.mem_bw_tbps * 1e12,
            weights: model.weight_bytes() as f64,
            kv: model.kv_bytes_per_token() as f64,
        }
    }

    /// Prefill of tokens `p..n` (32 layers, d = 4,096): Opal's a·n(n+1)·d
    /// attention (from p: the difference) and b·d² per token.
    fn prefill(&self, p: f64, n: f64) -> f64 {
        let pairs = n * (n + 1.0) - p * (p + 1.0);
        32.0 * (4.0 * 4096.0 * pairs + 24.0 * 4096.0 * 4096.0 * (n - p)) / self.flops
    }

    /// A decode step over `context` tokens of KV (weights read once).
    fn decode(&self, context: f64) -> f64 {
        (self.weights + self.kv * context) / self.bw
    }
}

/// `spec` with one prefill and one decode worker, every prompt prefilled
/// remotely, and the `[disaggregation]` keys in `extra`.
fn one_prefill_one_decode(spec: Spec, extra: toml::Table) -> Spec {
    let mut pools = toml! {
        max_local_prefill_length = 0
        [prefill]
        count = 1
        [decode]
        count = 1
    };
    pools.extend(extra);
    spec.table("disaggregation", pools)
}

/// One 1,000-token request with 4 output tokens through one prefill and one
/// decode worker whose link carries `link_GBps`.
fn one_pd_request(link_gbps: f64) -> opal::RunOutput {
    let spec = Spec::llama8b().set("worker.inference_params.model", "roofline").tiers(&[]);
    one_prefill_one_decode(spec, toml! { link_bandwidth_GBps = link_gbps link_latency_usec = 20 })
        .stage("UniformReqRate", toml! { total_requests = 1 prompt_size = 1000 output_tokens = 4 })
        .run()
}

#[test]
fn one_request_through_a_prefill_and_a_decode_worker_adds_up_by_hand() {
    let out = one_pd_request(10.0);
    let m = Llama8bH100::new();
    let r = &out.requests[0];
    // The prefill worker: one step over the prompt yields token 1 (its own TTFT).
    let prefill = ns(m.prefill(0.0, 1000.0).max(m.weights / m.bw));
    let p = &out.summary.pd.ttft_prefill_ms;
    assert!((p.max * 1e6 - prefill as f64).abs() < 2.0, "prefill worker's token {} ms vs {prefill} ns", p.max);
    // The decode worker pulls the prompt's KV: latency + bytes / bandwidth.
    let transfer = ns(20e-6 + 1000.0 * m.kv / 10e9);
    let t = &out.summary.pd.kv_transfer_ms;
    assert!((t.max - transfer as f64 / 1e6).abs() < 2e-6, "transfer {} ms vs {}", t.max, transfer as f64 / 1e6);
    // Its first step computes token 1's KV — one token over 1,000 cached,
    // priced as the decode step it is — and yields token 2: the client's
    // first token (vLLM's P/D proxy and Dynamo stream from the decode
    // worker), so TTFT is prefill + transfer + that step.
    let first = ns(m.decode(1000.0));
    let ttft = SimDuration::from_secs_f64(r.ttft_s.unwrap()).0;
    assert!(ttft.abs_diff(prefill + transfer + first) <= 2, "TTFT {ttft} ns vs {} ns", prefill + transfer + first);
    // Then tokens 3 and 4 decode over 1,001 and 1,002 tokens.
    let decodes = ns(m.decode(1001.0)) + ns(m.decode(1002.0));
    let e2e = prefill + transfer + first + decodes;
    let got = (r.e2e_s.unwrap() * 1e9).round() as u64;
    assert!(got.abs_diff(e2e) <= 2, "E2E {got} ns vs {e2e} ns by hand");
    // TPOT = (E2E − TTFT) / (4 − 1): the decode steps only, whatever the link.
    let tpot = r.tpot_s.unwrap() * 1e9;
    assert!((tpot - decodes as f64 / 3.0).abs() < 2.0, "TPOT {tpot} ns vs {} ns", decodes as f64 / 3.0);
    let slow = one_pd_request(1.0);
    assert!(slow.requests[0].ttft_s.unwrap() > r.ttft_s.unwrap() + 0.1, "a 10× slower link adds to TTFT");
    assert!((slow.requests[0].tpot_s.unwrap() * 1e9 - tpot).abs() < 2.0, "and leaves TPOT alone");
    let fd = &out.summary.pd.first_decode_ms;
    assert!((fd.max * 1e6 - (transfer + first) as f64).abs() < 2.0, "time to first decode step");
    // Where it ran, and what moved.
    assert_eq!((out.summary.pd.remote_prefills, out.summary.pd.local_prefills), (1, 0));
    assert_eq!(out.summary.pd.link_bytes, 1000 * m.kv as u64);
    let roles: Vec<&str> = out.workers.iter().map(|w| w.role).collect();
    assert_eq!(roles, ["prefill", "decode"]);
    assert_eq!(out.workers[1].link_bytes, 1000 * m.kv as u64);
    assert_eq!((out.workers[0].requests_completed, out.workers[1].requests_completed), (1, 1));
}

/// Two requests at t = 0 with distinct content, one per prefill worker,
/// both handed to the one decode worker at the same instant.
fn trace(dir: &std::path::Path, prompt: u32, output: u32, n: usize) -> String {
    crate::fixtures::trace_at_zero(dir, &vec![(prompt, output); n])
}

#[test]
fn two_transfers_on_one_link_share_its_bandwidth_exactly() {
    let dir = crate::temp_dir("pd-share");
    let file = trace(&dir, 2000, 5, 2);
    let out = Spec::llama8b()
        .set("router.router_params.policy", "RoundRobin")
        .tiers(&[])
        .table(
            "disaggregation",
            toml! {
                max_local_prefill_length = 0
                link_bandwidth_GBps = 10
                link_latency_usec = 20
                [prefill]
                count = 2
                [decode]
                count = 1
            },
        )
        .stage("Trace", toml! { trace_file = file chunk_size = 2048 })
        .run();
    let m = Llama8bH100::new();
    // Each moves 2,000 tokens of KV; together they take twice as long as one alone.
    let bytes = 2000.0 * m.kv;
    let shared = 20e-6 + 2.0 * bytes / 10e9;
    let t = &out.summary.pd.kv_transfer_ms;
    assert_eq!(out.summary.pd.remote_prefills, 2);
    for v in [t.p50, t.max] {
        assert!((v / 1e3 - shared).abs() < 2e-9, "{v} ms vs {} ms shared", shared * 1e3);
    }
}

#[test]
fn a_decode_worker_without_free_blocks_makes_the_transfer_wait() {
    // 17 GiB GPUs at 90 %: 17 × 2³⁰ × 0.9 − 16.06 GB of weights leaves room
    // for about 2,800 tokens of KV: one 1,500-token request, not two.
    let dir = crate::temp_dir("pd-blocks");
    let file = trace(&dir, 1500, 20, 2);
    let out = Spec::llama8b()
        .set("router.router_params.policy", "RoundRobin")
        .set("worker.hw.memory_gb", 17)
        .set("worker.vllm_params.max_model_len", 2048)
        .tiers(&[])
        .table(
            "disaggregation",
            toml! {
                max_local_prefill_length = 0
                link_bandwidth_GBps = 10
                link_latency_usec = 20
                [prefill]
                count = 2
                [decode]
                count = 1
            },
        )
        .stage("Trace", toml! { trace_file = file chunk_size = 2048 })
        .run();
    let m = Llama8bH100::new();
    let alone = 20e-6 + 1500.0 * m.kv / 10e9;
    // Neither transfer shared the link: the second waited for blocks.
    let t = &out.summary.pd.kv_transfer_ms;
    assert_eq!(out.summary.pd.remote_prefills, 2);
    for v in [t.p50, t.max] {
        assert!((v / 1e3 - alone).abs() < 2e-9, "{v} ms vs {} ms alone", alone * 1e3);
    }
    // The second request's decode began only when the first had finished:
    // its first decode step came after the first request's response.
    let mut rs: Vec<&RequestRecord> = out.requests.iter().collect();
    rs.sort_by(|a, b| a.e2e_s.partial_cmp(&b.e2e_s).unwrap());
    let first_done = rs[0].arrival_s + rs[0].e2e_s.unwrap();
    let fd = &out.summary.pd.first_decode_ms;
    let second_first_decode = rs[1].arrival_s + rs[1].ttft_s.unwrap() + fd.max / 1e3;
    assert!(second_first_decode > first_done + alone, "{second_first_decode} vs {first_done}");
}

#[test]
fn conditional_disaggregation_prefills_short_prompts_on_the_decode_worker() {
    let run_with = |prompt: u32| {
        Spec::llama8b()
            .tiers(&[])
            .table(
                "disaggregation",
                toml! {
                    max_local_prefill_length = 1000
                    [prefill]
                    count = 1
                    [decode]
                    count = 1
                },
            )
            .stage("UniformReqRate", toml! { total_requests = 3 prompt_size = prompt output_tokens = 4 })
            .run()
    };
    // 1,000 uncached tokens is not more than the threshold: local.
    let short = run_with(1000);
    assert_eq!((short.summary.pd.remote_prefills, short.summary.pd.local_prefills), (0, 3));
    assert_eq!(short.workers[0].requests_routed, 0, "the prefill worker saw nothing");
    assert_eq!(short.summary.pd.link_bytes, 0);
    // 1,001 is: remote.
    let long = run_with(1001);
    assert_eq!((long.summary.pd.remote_prefills, long.summary.pd.local_prefills), (3, 0));
    assert_eq!(long.workers[0].requests_completed, 3);
}

#[test]
fn decode_steps_without_prefill_chunks_lower_tpot_against_the_same_gpus_mixed() {
    // 4,000-token prompts every 75 ms, 40 tokens out, on two GPUs: mixed
    // (round-robin, so each worker starts a prefill every 150 ms) or one
    // prefill and one decode worker.
    let stage = toml! {
        request_rate = 13.333333333333334
        total_requests = 120
        prompt_size = 4000
        output_tokens = 40
        default_prefix_length = 0
    };
    let base = Spec::llama8b()
        .set("router.router_params.policy", "RoundRobin")
        .tiers(&[])
        .set("worker.inference_params.model", "roofline");
    let mixed = base.clone().set("simulation.num_workers", 2).stage("UniformReqRate", stage.clone()).run();
    let pd = base
        .table(
            "disaggregation",
            toml! {
                max_local_prefill_length = 0
                link_bandwidth_GBps = 200
                link_latency_usec = 20
                [prefill]
                count = 1
                [decode]
                count = 1
            },
        )
        .stage("UniformReqRate", stage)
        .run();
    let m = Llama8bH100::new();
    // Mixed: a request decodes for ≥ 39 × 4.95 ms ≈ 190 ms while its worker
    // starts the next prefill every 150 ms, so every request sits through at
    // least one step carrying a whole 4,000-token prefill (nothing shared, so
    // nothing cached; the longer of the two parts: ≈ 60 ms). Its TPOT is at least:
    let stalled = (38.0 * m.decode(4000.0) + m.prefill(0.0, 4000.0)) / 39.0;
    // Disaggregated: the decode worker gets a request every 75 ms and keeps
    // it ≤ 8 ms of transfer + 39 steps of ≤ 5.3 ms ≈ 215 ms: at most 3 at a
    // time, so a step is at most a decode over 3 × 4,040 tokens, and the
    // first decode step waits at most for 3 transfers sharing the link.
    let step = m.decode(3.0 * 4040.0);
    let first = 20e-6 + 3.0 * 4000.0 * m.kv / 200e9 + step;
    let bound = (first + 38.0 * step) / 39.0;
    assert!(bound < stalled, "the bounds leave room: {bound} vs {stalled}");
    let (tpot_mixed, tpot_pd) = (mixed.summary.tpot_ms.p99 / 1e3, pd.summary.tpot_ms.p99 / 1e3);
    assert!(tpot_mixed >= stalled * (1.0 - 1e-3), "mixed TPOT p99 {tpot_mixed} < {stalled}");
    assert!(tpot_pd <= bound, "disaggregated TPOT p99 {tpot_pd} > {bound}");
    assert_eq!(pd.summary.pd.remote_prefills, 120);
}

#[test]
fn no_prefill_workers_means_the_decode_pool_is_mixed() {
    let base = Spec::llama8b().stage("ExponentialReqRate", toml! { request_rate = 20.0 total_requests = 200 });
    let mixed = base.clone().set("simulation.num_workers", 3).run();
    let zero = base
        .set("simulation.num_workers", 99)
        .set("disaggregation.prefill.count", 0)
        .set("disaggregation.decode.count", 3)
        .run();
    assert_eq!(zero.event_digest, mixed.event_digest, "the same run as three mixed workers");
    assert!(zero.workers.iter().all(|w| w.role == "mixed"));
    assert_eq!(zero.summary.pd.remote_prefills + zero.summary.pd.local_prefills, 0);
}

#[test]
fn the_time_series_tells_the_prefill_pools_queue_from_the_rest() {
    let dir = crate::temp_dir("pd-queue");
    let file = trace(&dir, 2000, 30, 20);
    let out = Spec::llama8b()
        .set("simulation.time_series_interval_sec", 0.01)
        .tiers(&[])
        .table(
            "disaggregation",
            toml! {
                max_local_prefill_length = 0
                [prefill]
                count = 1
                [decode]
                count = 1
            },
        )
        .stage("Trace", toml! { trace_file = file chunk_size = 2048 })
        .run();
    // 20 prompts at t = 0 on one prefill worker: at 10 ms most still wait
    // there, and nothing waits on the decode worker yet.
    let first = &out.series[0];
    assert!(first.queue_depth_prefill > 10, "{first:?}");
    assert_eq!(first.queue_depth_prefill, first.queue_depth);
    assert!(out.series.iter().all(|r| r.queue_depth_prefill <= r.queue_depth));
    // Later, prompts wait for the decode worker's blocks or batch instead.
    assert!(out.series.iter().any(|r| r.queue_depth > r.queue_depth_prefill));
}

#[test]
fn through_the_shared_store_the_hand_over_waits_for_the_writes_and_the_decode_worker_loads_them() {
    // One 1,000-token request, its prompt written to the DFS (100 GB/s,
    // 100 µs) as it is computed; kv_path = "store": nothing crosses the link.
    let run = |kv_path: &str| {
        let spec = Spec::llama8b().set("worker.inference_params.model", "roofline").tiers(&["DistributedFS"]);
        one_prefill_one_decode(spec, toml! { kv_path = kv_path })
            .stage("UniformReqRate", toml! { total_requests = 1 prompt_size = 1000 output_tokens = 4 })
            .run()
    };
    let (store, link) = (run("store"), run("link"));
    let m = Llama8bH100::new();
    let pd = &store.summary.pd;
    assert_eq!((pd.remote_prefills, pd.link_bytes), (1, 0));
    // The prefill worker's token, then its prompt's write (100 µs + 1,000 ×
    // 128 KiB / 100 GB/s) before the hand-over.
    let prefill = pd.ttft_prefill_ms.max / 1e3;
    let write = 100e-6 + 1000.0 * m.kv / 100e9;
    let fd = pd.first_decode_ms.max / 1e3;
    assert!(fd > write, "first decode {fd} s after the prefill's token, the write alone takes {write} s");
    // The decode worker loads the prompt's full chunks from the DFS (a fetch, not a transfer).
    let r = &store.requests[0];
    assert_eq!(r.read_bytes[3], 768 * m.kv as u64, "chunks [0, 768): the partial one is keyed with token 1");
    assert!(r.kv_fetch_s.is_some() && store.summary.pd.kv_transfer_ms.max.is_nan());
    assert!((r.ttft_s.unwrap() - (prefill + fd)).abs() < 1e-9);
    // Over the link (50 GB/s), the same request: no tier traffic to wait for.
    assert!(link.summary.pd.link_bytes > 0 && link.requests[0].read_bytes[3] == 0);
}

/// One 16,384-token prompt, 128 output tokens, Llama-3.1-8B on one prefill
/// and one decode H100 (the default step model) behind a `link_gbps` link.
fn one_long_pd_request(link_gbps: f64) -> RequestRecord {
    let out = one_prefill_one_decode(Spec::llama8b().tiers(&[]), toml! { link_bandwidth_GBps = link_gbps })
        .stage("UniformReqRate", toml! { total_requests = 1 prompt_size = 16384 output_tokens = 128 })
        .run();
    out.requests[0].clone()
}

/// The README's example of the P/D TTFT rule ("One 16,384-token prompt …"),
/// checked against the text to the precision it is written with, so the
/// README cannot keep a number the model no longer gives.
#[test]
fn the_readmes_long_prompt_example_gives_the_numbers_it_quotes() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let flat = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    let quoted = "TTFT 891 ms at 5 GB/s and 483 ms at 100 GB/s, TPOT 7.09 ms at both";
    assert!(flat.contains(quoted), "the README no longer says {quoted:?}: change it and this test together");
    let (slow, fast) = (one_long_pd_request(5.0), one_long_pd_request(100.0));
    let ms = |s: Option<f64>| s.unwrap() * 1e3;
    assert_eq!(format!("{:.0}", ms(slow.ttft_s)), "891");
    assert_eq!(format!("{:.0}", ms(fast.ttft_s)), "483");
    assert_eq!(format!("{:.2} {:.2}", ms(slow.tpot_s), ms(fast.tpot_s)), "7.09 7.09");
}
