//! Core benchmark: the reference scenario of `benches/reference.toml`
//! (16 workers, Llama-3.1-8B on H100, Poisson arrivals at ~70 % of capacity,
//! 100k requests) on one thread. Reports simulated requests per wall second,
//! events per second and peak RSS. Run with `cargo bench --bench core`.

use std::path::Path;
use std::time::Instant;

fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn main() {
    let spec = opal::config::load_spec(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/reference.toml")))
        .expect("reference spec");
    let scenario = spec.scenario().expect("reference scenario");
    let runs = 5;
    let mut walls = Vec::new();
    let mut last = None;
    for _ in 0..runs {
        let t = Instant::now();
        let out = opal::simulate(&scenario).expect("reference run");
        walls.push(t.elapsed().as_secs_f64());
        last = Some(out);
    }
    let out = last.expect("at least one run");
    walls.sort_by(f64::total_cmp);
    let median = walls[runs / 2];
    let s = &out.summary;
    println!(
        "reference scenario: {} requests, {} events, {:.0} simulated s",
        s.requests_completed, s.events, s.sim_time_s
    );
    println!(
        "wall time per run: median {median:.3} s (min {:.3}, max {:.3}) over {runs} runs",
        walls[0],
        walls[runs - 1]
    );
    println!("simulated requests per wall second: {:.0}", s.requests_completed as f64 / median);
    println!("events per wall second: {:.0}", s.events as f64 / median);
    match peak_rss_mib() {
        Some(mib) => println!("peak RSS: {mib:.1} MiB"),
        None => println!("peak RSS: unavailable (no /proc/self/status)"),
    }
}
