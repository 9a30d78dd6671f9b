//! Routing benchmark: the Mooncake conversation trace (12,031 requests,
//! at its recorded rate) on 256 workers with MaxPrefix and fresh KV events —
//! the worst case for the router's index — without and with tiers below the GPU. Reports the wall time of the run,
//! the part spent routing and applying KV events, and the routing cost per
//! request. Run with `cargo bench --bench routing`.

use std::time::Instant;

fn main() {
    for (label, tiers) in
        [("GPU prefix cache only", "[]"), ("GPU + CPU memory + shared DFS", r#"["CPUMemory", "DistributedFS"]"#)]
    {
        bench(label, tiers);
    }
}

fn bench(label: &str, tiers: &str) {
    let text = format!(
        r#"
        [simulation]
        num_workers = 256
        [model.model_params]
        name = "llama-3.1-8b"
        [router.router_params]
        policy = "MaxPrefix"
        periodic_infra_update_collection_time = 0
        [worker.worker_params]
        kvcevent_coalesce_time = 0
        [kvc]
        kvc_tiers = {{TIERS}}
        [[workload.stages]]
        type = "Trace"
        [workload.stages.workload_params]
        trace_file = "{}/traces/conversation_trace.jsonl"
        time_scale = 1.0
        "#,
        env!("CARGO_MANIFEST_DIR")
    )
    .replace("{TIERS}", tiers);
    let file = opal::config::parse_spec(&text, "routing-bench").expect("spec");
    let scenario = opal::config::resolve(&file, "routing-bench", std::path::Path::new(".")).expect("scenario");
    let opts = opal::RunOptions { request_records: false, profile_routing: true, ..opal::RunOptions::default() };
    let mut best: Option<(f64, f64, opal::RunOutput)> = None;
    for _ in 0..3 {
        let t = Instant::now();
        let out = opal::simulate_with(&scenario, &opts).expect("run");
        let wall = t.elapsed().as_secs_f64();
        let routing = out.routing_wall_s.expect("profiled");
        if best.as_ref().is_none_or(|b| wall < b.0) {
            best = Some((wall, routing, out));
        }
    }
    let (wall, routing, out) = best.expect("three runs");
    let s = &out.summary;
    let n = s.requests_generated as f64;
    println!(
        "{label} — 256 workers, MaxPrefix, conversation trace: {} requests, {} KV events, prefix hit ratio {:.3}",
        s.requests_generated,
        s.kv_events,
        s.tiers.prefix_hit_ratio()
    );
    println!("wall time {wall:.3} s; routing + KV index {routing:.3} s = {:.1} % of the run", 100.0 * routing / wall);
    println!("routing cost per request: {:.1} µs", 1e6 * routing / n);
}
