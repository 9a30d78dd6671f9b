//! Sweep benchmark: the 24-run `sweeps/policy-rate.toml` with one thread and
//! with every core. Reports runs per second for each, the speed-up, and the
//! share of wall time spent writing Parquet. Run with `cargo bench --bench sweep`.

use opal::sweep::runner::{RunnerOptions, run_sweep};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

fn main() {
    let spec = opal::config::load_spec(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/sweeps/policy-rate.toml")))
        .expect("spec");
    let plan = opal::sweep::plan(&spec).expect("plan");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let stop = AtomicBool::new(false);
    let out = std::env::temp_dir().join(format!("opal-bench-sweep-{}", std::process::id()));
    let mut rates = Vec::new();
    for jobs in [1, cores] {
        let mut best = f64::INFINITY;
        let mut write_share = 0.0;
        for _ in 0..5 {
            let opts = RunnerOptions {
                output: out.clone(),
                jobs: Some(jobs),
                shard: None,
                resume: false,
                overwrite: true,
                progress: false,
            };
            let t = Instant::now();
            let report = run_sweep(&plan, &opts, &stop).expect("sweep");
            let wall = t.elapsed().as_secs_f64();
            assert!(report.failures.is_empty());
            if wall < best {
                best = wall;
                write_share = report.write_secs / wall;
            }
        }
        let rate = f64::from(plan.total_runs()) / best;
        println!(
            "-j{jobs}: {} runs in {best:.3} s = {rate:.1} runs/s (Parquet writing {:.1} % of wall time)",
            plan.total_runs(),
            100.0 * write_share
        );
        rates.push(rate);
    }
    println!("speed-up with {cores} threads: {:.2}x", rates[1] / rates[0]);
    let _ = std::fs::remove_dir_all(&out);
}
