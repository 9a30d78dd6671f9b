//! Core benchmark: the reference scenario of `benches/reference.toml`
//! (16 workers, Llama-3.1-8B on H100, Poisson arrivals at ~70 % of capacity,
//! 100k requests, prompts 512–8192, outputs 32–512) on one thread, in three
//! KV-tier set-ups: none, Opal's default (CPU memory), and CPU memory plus a
//! shared distributed file system. Reports simulated requests per wall
//! second, events per second and peak RSS. Run with `cargo bench --bench core`.

use opal::config::{Spec, resolve, spec_from_table};
use std::path::Path;
use std::time::Instant;

fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn main() {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/reference.toml"));
    let spec: Spec = opal::config::load_spec(path).expect("reference spec");
    let variants: [(&str, &[&str]); 3] = [
        ("no tiers", &[]),
        ("CPUMemory (Opal default)", &["CPUMemory"]),
        ("CPUMemory + DistributedFS", &["CPUMemory", "DistributedFS"]),
    ];
    let mut rates = Vec::new();
    for (label, tiers) in variants {
        let mut table = spec.table.clone();
        let list = toml::Value::Array(tiers.iter().map(|t| toml::Value::String(t.to_string())).collect());
        opal::sweep::set_path(&mut table, "kvc.kvc_tiers", list).expect("kvc is a table");
        let file = spec_from_table(&table, "reference").expect("reference spec");
        let scenario = resolve(&file, "reference", path.parent().unwrap()).expect("reference scenario");
        let runs = 3;
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
        println!("{label}:");
        println!(
            "  {} requests, {} events, {:.0} simulated s, prefix hit ratio {:.3}",
            s.requests_completed,
            s.events,
            s.sim_time_s,
            s.tiers.prefix_hit_ratio()
        );
        println!(
            "  wall per run: median {median:.3} s (min {:.3}, max {:.3}) over {runs} runs",
            walls[0],
            walls[runs - 1]
        );
        println!(
            "  simulated requests per wall second: {:.0}; events per wall second: {:.0}",
            s.requests_completed as f64 / median,
            s.events as f64 / median
        );
        rates.push(s.requests_completed as f64 / median);
        drop(out);
        // The high-water mark only grows: after the first variant it is that variant's peak.
        match peak_rss_mib() {
            Some(mib) => println!("  peak RSS of the process so far: {mib:.1} MiB"),
            None => println!("  peak RSS: unavailable (no /proc/self/status)"),
        }
    }
    println!("cost of CPU + DFS tiers: {:.2}x the wall time without tiers", rates[0] / rates[2]);
}
