//! KV-aware routing seen from outside: staleness, policy trade-offs, autoscaling.

use crate::fixtures::Spec;
use toml::toml;

const TRACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/traces/conversation_trace.jsonl");

/// The first 1,500 conversation requests on 4 workers, GPU prefix cache only,
/// so a follow-up turn hits only where its conversation ran before. The
/// router collects KV events every `delay` s, and the workers send them in
/// windows of `delay` s.
fn conversation(policy: &str, delay: i32) -> opal::RunOutput {
    Spec::llama8b()
        .set("simulation.num_workers", 4)
        .set("router.router_params.policy", policy)
        .set("router.router_params.periodic_infra_update_collection_time", delay)
        .set("worker.worker_params.kvcevent_coalesce_time", delay)
        .tiers(&[])
        .stage("Trace", toml! { trace_file = TRACE total_requests = 1500 })
        .run()
}

fn hit(o: &opal::RunOutput) -> f64 {
    o.summary.tiers.prefix_hit_ratio()
}

#[test]
fn fresh_kv_events_route_follow_ups_to_their_cache_better_than_stale_ones() {
    let fresh = conversation("MaxPrefix", 0);
    let stale = conversation("MaxPrefix", 30);
    assert_eq!(fresh.summary.requests_completed + fresh.summary.requests_rejected, 1500);
    assert_eq!(stale.summary.requests_completed + stale.summary.requests_rejected, 1500);
    assert!(hit(&fresh) > hit(&stale), "fresh {} vs stale {}", hit(&fresh), hit(&stale));
    // Staleness is what the knobs say: ~0 with no delays, tens of seconds with 30 s windows.
    assert_eq!(fresh.summary.kv_staleness_ms.max, 0.0);
    assert!(stale.summary.kv_staleness_ms.mean > 10_000.0, "{}", stale.summary.kv_staleness_ms.mean);
    assert!(stale.summary.routing_mispredictions > fresh.summary.routing_mispredictions);
}

#[test]
fn max_prefix_finds_more_cached_context_than_load_based_policies() {
    let fresh = 0;
    let max = conversation("MaxPrefix", fresh);
    let rr = conversation("RoundRobin", fresh);
    let ll = conversation("LeastLoaded", fresh);
    assert!(
        hit(&max) > hit(&rr) && hit(&max) > hit(&ll),
        "MaxPrefix {} RoundRobin {} LeastLoaded {}",
        hit(&max),
        hit(&rr),
        hit(&ll)
    );
}

/// One hot prefix: a first request at t = 0 puts a 3,584-token context
/// (7 chunks of 512) on one worker; from t = 1 s, 2,000 requests that share it
/// arrive at 40/s, faster than one worker can serve them.
fn hot_prefix(policy: &str) -> opal::RunOutput {
    let dir = crate::temp_dir(&format!("hot-{policy}"));
    let mut lines = vec![
        r#"{"timestamp": 0, "input_length": 4000, "output_length": 100, "hash_ids": [1, 2, 3, 4, 5, 6, 7, 8]}"#
            .to_string(),
    ];
    for i in 0..2000u64 {
        lines.push(format!(
            r#"{{"timestamp": {}, "input_length": 4000, "output_length": 100, "hash_ids": [1, 2, 3, 4, 5, 6, 7, {}]}}"#,
            1000 + i * 25,
            100 + i
        ));
    }
    let trace = dir.join("hot.jsonl");
    std::fs::write(&trace, lines.join("\n")).unwrap();
    Spec::llama8b()
        .set("simulation.num_workers", 4)
        .set("router.router_params.policy", policy)
        .set("router.router_params.periodic_infra_update_collection_time", 0)
        .set("worker.worker_params.kvcevent_coalesce_time", 0)
        .tiers(&[])
        .stage("Trace", toml! { trace_file = (trace.display().to_string()) })
        .run()
}

#[test]
fn balanced_keeps_the_hit_ratio_of_max_prefix_and_cuts_its_queueing_on_a_hot_prefix() {
    let (max, bal) = (hot_prefix("MaxPrefix"), hot_prefix("Balanced"));
    // MaxPrefix follows the prefix to the one worker that has it: it takes nearly everything.
    let busiest = |o: &opal::RunOutput| o.workers.iter().map(|w| w.requests_routed).max().unwrap();
    assert!(busiest(&max) > 1900, "MaxPrefix sent {} of 2001 to one worker", busiest(&max));
    assert!(busiest(&bal) < 1000, "Balanced spreads the load ({})", busiest(&bal));
    // Each other worker recomputes the prefix once, so the hit ratio barely moves…
    assert!(hit(&bal) > 0.95 * hit(&max), "Balanced {} vs MaxPrefix {}", hit(&bal), hit(&max));
    // …while the queue wait of the unlucky requests collapses.
    assert!(
        bal.summary.queue_wait_ms.p99 < max.summary.queue_wait_ms.p99 / 2.0,
        "{} vs {}",
        bal.summary.queue_wait_ms.p99,
        max.summary.queue_wait_ms.p99
    );
}

#[test]
fn autoscaling_adds_workers_exactly_scale_latency_after_deciding_and_stops_at_the_cap() {
    let out = Spec::llama8b()
        .set("simulation.num_workers", 1)
        .table(
            "router.router_params",
            toml! {
                policy = "LeastLoaded"
                enable_scaling = true
                max_queue_threshold = 4
                scale_latency = 10
                max_workers = 3
            },
        )
        .stage(
            "UniformReqRate",
            toml! {
                request_rate = 50.0
                total_requests = 3000
                prompt_size_min = 2000
                prompt_size_max = 2000
                output_tokens_min = 100
                output_tokens_max = 100
            },
        )
        .run();
    // The first check (t = 1 s) finds a long queue: the worker joins at 1 + 10 = 11 s;
    // the next check is at 12 s and the next worker joins at 22 s; then the cap holds.
    let started: Vec<f64> = out.workers.iter().map(|w| w.started_s).collect();
    assert_eq!(started, vec![0.0, 11.0, 22.0]);
    assert_eq!(out.summary.workers, 3);
    // New workers take requests from when they join, and the time series shows them.
    assert!(out.workers[2].requests_routed > 0);
    assert_eq!(out.series[10].active_workers, 1);
    assert_eq!(out.series[11].active_workers, 2);
    assert_eq!(out.series[22].active_workers, 3);
    assert_eq!(out.series.iter().map(|r| r.active_workers).max(), Some(3));
}
