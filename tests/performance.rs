//! Work and memory per request, pinned without timing anything: events per
//! request on the shipped trace, step prices per request against its
//! output length, and the request arena's high-water mark on a long run.

use crate::fixtures::Spec;
use toml::toml;

const TRACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/traces/conversation_trace.jsonl");

#[test]
fn the_conversation_trace_on_16_workers_takes_fewer_than_50_events_per_request() {
    // The core benchmark's `trace` row: decode steps run in batches of
    // sub-steps, so events do not grow with output length (one event per
    // decode step was 274 per request).
    let s = Spec::llama8b()
        .set("simulation.seed", 1)
        .set("simulation.num_workers", 16)
        .set("router.router_params.policy", "MaxPrefix")
        .set("worker.vllm_params.max_model_len", 131072)
        .tiers(&["CPUMemory", "LocalNVMe", "DistributedFS"])
        .stage("Trace", toml! { trace_file = TRACE })
        .scenario();
    let out =
        opal::simulate_with(&s, &opal::RunOptions { request_records: false, ..opal::RunOptions::default() }).unwrap();
    let s = &out.summary;
    assert_eq!(s.requests_completed, 12_031, "the whole trace ran");
    let per_request = s.events as f64 / s.requests_completed as f64;
    assert!(per_request < 50.0, "{per_request:.1} events per request");
    // Every decode step still happens (merged into events, not skipped): one
    // inter-token gap per output token after the first, counted from the file.
    let gaps: u64 = std::fs::read_to_string(TRACE)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["output_length"].as_u64().unwrap().max(1) - 1
        })
        .sum();
    assert_eq!(out.latencies.get(opal::metrics::LatencyMetric::Itl).count(), gaps);
    assert!(gaps > 5 * s.events, "{gaps} decode gaps in {} events", s.events);
}

/// The reference scenario's shape (16 workers, Poisson arrivals, uniform
/// lengths, CPU tier) with `requests` requests; prompts and outputs are
/// short so that a million requests run quickly in a debug build.
fn reference_family(requests: u64) -> opal::RunOutput {
    let s = Spec::llama8b()
        .set("simulation.seed", 1)
        .set("simulation.num_workers", 16)
        .set("router.router_params.policy", "LeastLoaded")
        .stage(
            "ExponentialReqRate",
            toml! {
                request_rate = 2000.0
                total_requests = requests
                prompt_size_min = 16
                prompt_size_max = 64
                output_tokens_min = 1
                output_tokens_max = 8
            },
        )
        .scenario();
    opal::simulate_with(&s, &opal::RunOptions { request_records: false, ..opal::RunOptions::default() }).unwrap()
}

#[test]
fn a_million_request_run_without_the_request_table_keeps_no_per_request_state() {
    let small = reference_family(10_000);
    let big = reference_family(1_000_000);
    assert_eq!(big.summary.requests_completed, 1_000_000);
    assert!(big.requests.is_empty(), "no per-request records were asked for");
    // Finished requests give their arena slot back: the arena holds the
    // requests in flight (a few hundred at this load), not the run's million.
    assert!(big.peak_live_requests < 1_000, "arena high-water mark {}", big.peak_live_requests);
    assert!(
        big.peak_live_requests < 2 * small.peak_live_requests.max(50),
        "100× the requests, about the same high-water mark: {} vs {}",
        big.peak_live_requests,
        small.peak_live_requests
    );
}

/// Step prices per request for one request alone on one worker: a
/// `prompt`-token prompt, then `output` tokens decoded in one run.
fn priced_per_request(prompt: i64, output: i64) -> (u64, u64) {
    let out = Spec::llama8b()
        .set("worker.vllm_params.max_model_len", 131072)
        .stage(
            "UniformReqRate",
            toml! {
                request_rate = 1.0
                total_requests = 1
                prompt_size_min = prompt
                prompt_size_max = prompt
                output_tokens_min = output
                output_tokens_max = output
            },
        )
        .run();
    let itl = out.latencies.get(opal::metrics::LatencyMetric::Itl).count();
    assert_eq!(itl, output as u64 - 1, "every decode step happened");
    (out.priced_steps, out.summary.events)
}

#[test]
fn step_prices_and_events_per_request_do_not_grow_with_its_output() {
    // One price per prefill step (a token budget of 8,192: one step for 1k,
    // four for 32k), then the decode run priced at the two ends of each
    // piece: a piece ends where the keys per sequence (context + 1) cross a
    // knot of the attention grid (two per octave: 1,536, 2,048, 3,072, …),
    // whatever the number of sub-steps between.
    // 1k prompt: 10 tokens (keys 1,026 … 1,034) one piece; 1,000 (… 2,024)
    // cross 1,536; 20,000 (… 21,024) cross 1,536, 2,048, 3,072, 4,096,
    // 6,144, 8,192, 12,288 and 16,384.
    assert_eq!(priced_per_request(1024, 10), (1 + 2, 5));
    assert_eq!(priced_per_request(1024, 1_000), (1 + 2 * 2, 5));
    assert_eq!(priced_per_request(1024, 20_000).0, 1 + 2 * 9);
    // 32k prompt: 10 and 1,000 tokens (keys 32,770 … 33,768) cross no knot;
    // 20,000 (… 52,768) cross 49,152.
    assert_eq!(priced_per_request(32 * 1024, 10), (4 + 2, 14));
    assert_eq!(priced_per_request(32 * 1024, 1_000), (4 + 2, 14));
    assert_eq!(priced_per_request(32 * 1024, 20_000).0, 4 + 2 * 2);
}
