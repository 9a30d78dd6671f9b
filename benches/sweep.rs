//! Sweep benchmark. Run with `cargo bench --bench sweep`.
//!
//! 1. The 24-run `sweeps/policy-rate.toml` with one thread and with every
//!    core: runs per CPU second and per wall second, the speed-up, the share
//!    of wall time spent writing Parquet, and the report the spec asks for
//!    (`report = true`) as a share of the sweep's CPU time (target ≤ 10 %).
//! 2. The final merge of a 20,000-run sweep of tiny runs (two shards, then
//!    `merge_dir`, as `opal-sweep merge` does): CPU seconds (target < 10 s).

mod common;

use common::{cpu_timed, peak_rss_mib};
use opal::sweep::runner::{RunnerOptions, Shard, merge_dir, run_sweep};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// 20,000 runs of two requests each: what is measured is the merge.
const TINY: &str = r#"
[sweep]
name = "tiny"
replicates = 20000
[model.model_params]
name = "llama-3.1-8b"
[kvc]
kvc_tiers = []
[worker.inference_params]
model = "synthetic"
mean_latency_secs = 0.001
[[workload.stages]]
type = "UniformReqRate"
[workload.stages.workload_params]
total_requests = 2
prompt_size = 64
output_tokens = 2
"#;

fn main() {
    let scratch = std::env::temp_dir().join(format!("opal-bench-sweep-{}", std::process::id()));
    policy_rate(&scratch.join("policy-rate"));
    merge(&scratch.join("tiny"));
    let _ = std::fs::remove_dir_all(&scratch);
}

fn options(output: &Path, jobs: usize, shard: Option<Shard>) -> RunnerOptions {
    RunnerOptions {
        output: output.to_path_buf(),
        jobs: Some(jobs),
        shard,
        resume: false,
        overwrite: true,
        progress: false,
    }
}

fn policy_rate(out: &Path) {
    let spec = opal::config::load_spec(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/sweeps/policy-rate.toml")))
        .expect("spec");
    let plan = opal::sweep::plan(&spec).expect("plan");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let stop = AtomicBool::new(false);
    let mut walls = Vec::new();
    let mut sweep_cpu = f64::INFINITY;
    for jobs in [1, cores] {
        let mut best = (f64::INFINITY, f64::INFINITY, 0.0);
        for _ in 0..5 {
            let t = Instant::now();
            let (report, cpu) = cpu_timed(|| run_sweep(&plan, &options(out, jobs, None), &stop).expect("sweep"));
            let wall = t.elapsed().as_secs_f64();
            assert!(report.failures.is_empty());
            if cpu < best.0 {
                best = (cpu, wall, report.write_secs / wall);
            }
        }
        let (cpu, wall, write_share) = best;
        let runs = f64::from(plan.total_runs());
        println!(
            "policy-rate -j{jobs}: {runs} runs, {cpu:.2} CPU s ({:.1} runs per CPU s), {wall:.2} wall s ({:.1} runs/s); \
             Parquet writing {:.1} % of wall",
            runs / cpu,
            runs / wall,
            100.0 * write_share
        );
        walls.push(wall);
        sweep_cpu = sweep_cpu.min(cpu);
    }
    println!("  speed-up with {cores} threads: {:.2}x (wall)", walls[0] / walls[1]);
    let report_cpu = (0..5)
        .map(|_| cpu_timed(|| opal::report::write_report(out, &out.join("report"), false).expect("report")).1)
        .fold(f64::INFINITY, f64::min);
    println!(
        "  its report (SVG figures): {report_cpu:.3} CPU s = {:.1} % of the sweep with it (target ≤ 10 %)",
        100.0 * report_cpu / (sweep_cpu + report_cpu)
    );
}

fn merge(dir: &Path) {
    std::fs::create_dir_all(dir).expect("scratch dir");
    let spec_path = dir.join("tiny.toml");
    std::fs::write(&spec_path, TINY).expect("spec");
    let plan = opal::sweep::plan(&opal::config::load_spec(&spec_path).expect("spec")).expect("plan");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let out = dir.join("results");
    let stop = AtomicBool::new(false);
    let t = Instant::now();
    let mut simulate_cpu = 0.0;
    for index in 0..2 {
        let shard = Some(Shard { index, count: 2 });
        // The second shard adds its parts to the first's.
        let opts = RunnerOptions { overwrite: index == 0, ..options(&out, cores, shard) };
        let (report, cpu) = cpu_timed(|| run_sweep(&plan, &opts, &stop).expect("shard"));
        assert!(report.failures.is_empty());
        simulate_cpu += cpu;
    }
    let simulate_wall = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let (merged, cpu) = cpu_timed(|| merge_dir(&out).expect("merge"));
    let wall = t.elapsed().as_secs_f64();
    println!(
        "merge of {} runs from 2 shards: {cpu:.2} CPU s, {wall:.2} wall s (target < 10 s); \
         simulating them took {simulate_cpu:.1} CPU s, {simulate_wall:.1} wall s; peak RSS {}",
        merged.runs,
        peak_rss_mib().map_or_else(|| "unavailable".into(), |m| format!("{m:.0} MiB"))
    );
}
