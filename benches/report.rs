//! Report benchmark: `opal-sweep report` on a 200-run sweep (4 policies ×
//! 5 request rates × 10 replicates, 200 requests each). The sweep is run
//! once as set-up; the report (reading the tables, merging histograms,
//! drawing the figures as SVG, writing the page) is timed five times in CPU
//! seconds, then again with `--png`. Run with `cargo bench --bench report`.

mod common;

use common::{cpu_timed, peak_rss_mib};
use opal::sweep::runner::{RunnerOptions, run_sweep};
use std::sync::atomic::AtomicBool;

const SPEC: &str = r#"
[sweep]
name = "report-bench"
replicates = 10

[grid]
"router.router_params.policy" = ["RoundRobin", "LeastLoaded", "MaxPrefix", "Balanced"]
"workload.stages.0.workload_params.request_rate" = [5.0, 10.0, 20.0, 30.0, 40.0]

[simulation]
num_workers = 4

[model.model_params]
name = "llama-3.1-8b"

[[workload.stages]]
type = "ExponentialReqRate"
[workload.stages.workload_params]
total_requests = 200
prompt_size_min = 100
prompt_size_max = 4000
output_tokens_min = 10
output_tokens_max = 200
"#;

fn main() {
    let dir = std::env::temp_dir().join(format!("opal-bench-report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let spec_path = dir.join("spec.toml");
    std::fs::write(&spec_path, SPEC).expect("spec");
    let spec = opal::config::load_spec(&spec_path).expect("spec");
    let plan = opal::sweep::plan(&spec).expect("plan");
    let out = dir.join("results");
    let opts =
        RunnerOptions { output: out.clone(), jobs: None, shard: None, resume: false, overwrite: true, progress: false };
    let report = run_sweep(&plan, &opts, &AtomicBool::new(false)).expect("sweep");
    assert!(report.failures.is_empty());
    for png in [false, true].into_iter().filter(|&p| !p || opal::report::figures::PNG_SUPPORTED) {
        let mut cpus = Vec::new();
        let mut summary = None;
        for _ in 0..5 {
            let (s, cpu) = cpu_timed(|| opal::report::write_report(&out, &dir.join("report"), png).expect("report"));
            cpus.push(cpu);
            summary = Some(s);
        }
        cpus.sort_by(f64::total_cmp);
        let s = summary.expect("ran");
        let bytes: u64 = s.files.iter().map(|f| std::fs::metadata(f).map_or(0, |m| m.len())).sum();
        println!(
            "report of {} runs ({} points){}: {} files, {:.1} MiB; CPU s min {:.3}, median {:.3}, max {:.3}",
            s.runs,
            plan.points.len(),
            if png { " with --png" } else { "" },
            s.files.len() + 1,
            bytes as f64 / (1 << 20) as f64,
            cpus[0],
            cpus[2],
            cpus[4]
        );
    }
    println!("peak RSS: {}", peak_rss_mib().map_or_else(|| "unavailable".into(), |m| format!("{m:.0} MiB")));
    let _ = std::fs::remove_dir_all(&dir);
}
