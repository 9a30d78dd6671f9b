//! Commands on a results directory: merge, report, timeline, and
//! `vllm bench serve`'s result format out and in.

use super::{Failure, out};
use crate::report::text::count;
use crate::sweep::runner::merge_dir;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

pub(super) fn merge(dir: &std::path::Path) -> Result<ExitCode, Failure> {
    if !dir.is_dir() {
        return Err(Failure::Input(format!(
            "{}: no such directory\n  fix: give the output directory of a sharded sweep",
            dir.display()
        )));
    }
    let _lock = crate::sweep::lock::DirLock::acquire(dir, None, crate::sweep::lock::Purpose::Merge)
        .map_err(|e| Failure::Input(e.to_string()))?;
    // A gap (shards not yet run) is incomplete results, like a failed run: exit 1.
    let report = merge_dir(dir).map_err(|e| Failure::Run(e.to_string()))?;
    out(&format!(
        "merged {}: {} in {}\n",
        count(report.parts as u64, "part"),
        count(report.runs as u64, "run"),
        dir.display()
    ));
    if crate::sweep::runner::report_requested(dir) {
        auto_report(dir);
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) fn report(dir: &std::path::Path, output: Option<&std::path::Path>, png: bool) -> Result<ExitCode, Failure> {
    if png && !crate::report::figures::PNG_SUPPORTED {
        return Err(Failure::Input(crate::report::figures::NO_PNG.into()));
    }
    let target = output.map_or_else(|| crate::report::default_dir(dir), std::path::Path::to_path_buf);
    let started = std::time::Instant::now();
    let r = crate::report::write_report(dir, &target, png).map_err(|e| match e {
        crate::report::ReportError::Input(m) => Failure::Input(m),
        crate::report::ReportError::Output(m) => Failure::Run(m),
    })?;
    out(&report_line(&r, started.elapsed().as_secs_f64()));
    Ok(ExitCode::SUCCESS)
}

/// The report a spec asked for with `[sweep] report = true` (SVG figures:
/// `opal-sweep report --png` adds PNGs); a failure only warns (the results
/// themselves are complete).
pub(super) fn auto_report(dir: &std::path::Path) {
    let started = std::time::Instant::now();
    match crate::report::write_report(dir, &crate::report::default_dir(dir), false) {
        Ok(r) => out(&report_line(&r, started.elapsed().as_secs_f64())),
        Err(e) => eprintln!("warning: the report could not be made: {e}"),
    }
}

fn report_line(r: &crate::report::ReportSummary, wall: f64) -> String {
    let mut text = format!(
        "report: {} ({} from {}{}, {wall:.2} s)\n",
        r.index.display(),
        count(r.figures as u64, "figure"),
        count(r.runs as u64, "run"),
        match r.failed {
            0 => String::new(),
            n => format!("; {} left out", count(n as u64, "failed run")),
        }
    );
    for s in &r.skipped {
        text.push_str(&format!("  {s}\n"));
    }
    text
}

pub(super) fn timeline(
    dir: &std::path::Path,
    run: Option<u32>,
    output: Option<&std::path::Path>,
    max_steps: usize,
) -> Result<ExitCode, Failure> {
    let t = crate::report::timeline::write_timeline(dir, run, output, max_steps).map_err(|e| match e {
        crate::report::ReportError::Input(m) => Failure::Input(m),
        crate::report::ReportError::Output(m) => Failure::Run(m),
    })?;
    let cut = if t.steps < t.total_steps {
        format!(" (the first {} of {}: --max-steps)", t.steps, t.total_steps)
    } else {
        String::new()
    };
    out(&format!(
        "timeline: {} (run {}, {} steps{cut} on {} worker{}, {} events; open in ui.perfetto.dev)
",
        t.path.display(),
        t.run_id,
        t.steps,
        t.workers,
        if t.workers == 1 { "" } else { "s" },
        t.events
    ));
    Ok(ExitCode::SUCCESS)
}

/// `opal-sweep vllm-result`.
#[derive(Args, Debug)]
pub struct VllmResultArgs {
    /// The sweep's results directory.
    dir: PathBuf,
    /// Only this run (a runs-table run_id).
    #[arg(long)]
    run: Option<u32>,
    /// Where to write (default: <dir>/vllm/run-<N>.json; with --run, a file,
    /// `-` for stdout).
    #[arg(short, long, value_name = "PATH")]
    output: Option<PathBuf>,
    /// vLLM's --percentile-metrics: the metrics to report.
    #[arg(long, default_value = "ttft,tpot,itl,e2el")]
    percentile_metrics: String,
    /// vLLM's --metric-percentiles: the percentiles to report.
    #[arg(long, default_value = "50,90,99")]
    metric_percentiles: String,
}

/// The runs `dir` holds, under vLLM's names (`run`: one of them), or why not.
fn simulated(
    dir: &std::path::Path,
    run: Option<u32>,
    sel: &crate::output::vllm::Selection,
) -> Result<Vec<crate::output::vllm::VllmResult>, Failure> {
    let results = crate::output::vllm::simulated(dir, run, sel).map_err(|e| Failure::Input(e.to_string()))?;
    if results.is_empty() {
        let which = run.map_or("no ok run".to_string(), |r| format!("no ok run {r}"));
        return Err(Failure::Input(format!(
            "{}: {which} in the runs table\n  fix: give a results directory (and a run_id whose status is ok)",
            dir.display()
        )));
    }
    Ok(results)
}

pub(super) fn vllm_result(args: &VllmResultArgs) -> Result<ExitCode, Failure> {
    let sel = crate::output::vllm::Selection::parse(&args.percentile_metrics, &args.metric_percentiles)
        .map_err(|e| Failure::Input(format!("{e}\n  fix: use vLLM's spelling, e.g. --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99")))?;
    if args.output.is_some() && args.run.is_none() {
        return Err(Failure::Input("-o names one file: pick its run with --run N".into()));
    }
    let results = simulated(&args.dir, args.run, &sel)?;
    let write = |path: &std::path::Path, text: &str| {
        std::fs::write(path, text).map_err(|e| Failure::Run(format!("{}: cannot write: {e}", path.display())))
    };
    match &args.output {
        Some(p) if p.as_os_str() == "-" => out(&(results[0].to_json() + "\n")),
        Some(p) => {
            write(p, &results[0].to_json())?;
            out(&format!("wrote {}\n", p.display()));
        }
        None => {
            let dir = args.dir.join("vllm");
            std::fs::create_dir_all(&dir)
                .map_err(|e| Failure::Run(format!("{}: cannot create: {e}", dir.display())))?;
            for r in &results {
                write(&dir.join(format!("run-{}.json", r.run_id)), &r.to_json())?;
            }
            let n = results.len();
            out(&format!("wrote {n} vllm bench serve result{} in {}\n", if n == 1 { "" } else { "s" }, dir.display()));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `opal-sweep compare`.
#[derive(Args, Debug)]
pub struct CompareArgs {
    /// The measured result (`vllm bench serve --save-result --save-detailed`).
    measured: PathBuf,
    /// The results directory of the simulated replay.
    dir: PathBuf,
    /// The simulated run (default: the directory's only ok run).
    #[arg(long)]
    run: Option<u32>,
    /// The comparison table to write (default: <dir>/compare-run<N>.parquet).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
}

pub(super) fn compare(args: &CompareArgs) -> Result<ExitCode, Failure> {
    use crate::output::vllm;
    let measured = crate::workload::BenchFile::read(&args.measured, true).map_err(|e| Failure::Input(e.to_string()))?;
    let sel = vllm::Selection {
        metrics: vllm::METRICS.iter().map(|&(_, n)| n).collect(),
        percentiles: vllm::percentiles_of(&measured),
    };
    let runs = simulated(&args.dir, args.run, &sel)?;
    if runs.len() > 1 {
        let ids: Vec<String> = runs.iter().take(10).map(|r| r.run_id.to_string()).collect();
        return Err(Failure::Input(format!(
            "{}: {} ok runs (run_id {}{}); compare holds one against the measurement\n  fix: pick one with --run N",
            args.dir.display(),
            runs.len(),
            ids.join(", "),
            if runs.len() > 10 { ", …" } else { "" }
        )));
    }
    let rows = vllm::compare(&measured, &runs[0]);
    out(&format!(
        "{} (measured) against run {} of {} (simulated)\n",
        args.measured.display(),
        runs[0].run_id,
        args.dir.display()
    ));
    out(&vllm::format_compare(&rows));
    let path = args.output.clone().unwrap_or_else(|| args.dir.join(format!("compare-run{}.parquet", runs[0].run_id)));
    vllm::write_compare(&path, &rows).map_err(|e| Failure::Run(e.to_string()))?;
    out(&format!("table: {}\n", path.display()));
    Ok(ExitCode::SUCCESS)
}
