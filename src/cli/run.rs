//! Running a spec: a sweep, a search or a Pareto search, and what it prints.

use super::{Failure, STOP, out};
use crate::config::Spec;
use crate::report::text::count;
use crate::sweep::runner::{RunnerOptions, Shard, SweepReport, run_sweep};
use crate::sweep::{SweepPlan, plan};
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

/// `opal-sweep [run]`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The spec to run: TOML, or an Opal JSON configuration (imported unchanged).
    #[arg(required = true)]
    spec: Option<PathBuf>,
    /// Output directory (default: [sweep] output, else results/<name>/).
    #[arg(short, long, value_name = "DIR")]
    output: Option<PathBuf>,
    /// Runs in parallel (default and 0: all cores; never more than the runs
    /// to do nor 32 per core; above 4 × cores a warning, as runs then only compete).
    #[arg(short, long, value_name = "N")]
    jobs: Option<usize>,
    /// Run only shard i of N (runs with id % N == i); defaults from
    /// SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT. Merge with `opal-sweep merge`.
    #[arg(long, value_name = "i/N")]
    shard: Option<String>,
    /// Skip runs already in the output directory.
    #[arg(long)]
    resume: bool,
    /// Delete earlier results in the output directory first.
    #[arg(long, conflicts_with = "resume")]
    overwrite: bool,
    /// List the expanded runs (id, point, replicate, seed, overrides) and exit.
    #[arg(long)]
    dry_run: bool,
    /// No progress output.
    #[arg(short, long)]
    quiet: bool,
}

/// Loads and expands a spec (parsed once, here). If no point can run, that
/// is an input error (for a spec without axes: its one scenario is invalid).
pub(super) fn load_plan(spec: &std::path::Path) -> Result<(Spec, SweepPlan), Failure> {
    let spec = crate::config::load_spec(spec).map_err(input)?;
    let plan = plan(&spec).map_err(input)?;
    for n in &plan.notes {
        eprintln!("warning: {n}");
    }
    if let Some(Err(e)) = plan.points.iter().all(|p| p.scenario.is_err()).then(|| plan.points[0].scenario.clone()) {
        let also = match plan.points.len() {
            1 => String::new(),
            n => format!("\n(and every other of the {n} grid points is invalid too)"),
        };
        return Err(Failure::Input(format!("{e}{also}")));
    }
    Ok((spec, plan))
}

fn input(e: impl ToString) -> Failure {
    Failure::Input(e.to_string())
}

fn list<T: ToString>(items: &[T]) -> String {
    items.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

pub(super) fn run(args: &RunArgs) -> Result<ExitCode, Failure> {
    let (spec, plan) = load_plan(args.spec.as_ref().expect("clap requires the spec"))?;
    let search = crate::sweep::search::search_spec(&spec).map_err(input)?;
    let pareto = crate::sweep::pareto::pareto_spec(&spec).map_err(input)?;
    if args.dry_run {
        if let Some(s) = &search {
            out(&format!(
                "a search: per grid point below, the {} {} in [{}, {}] meeting {}; its probes ({} each, the seeds below on) are chosen as it runs\n",
                if s.maximize { "largest" } else { "smallest" },
                s.parameter,
                s.min,
                s.max,
                list(&s.slo),
                if s.replicates == s.max_replicates {
                    count(s.replicates, "run")
                } else {
                    format!("{} to {} runs", s.replicates, s.max_replicates)
                }
            ));
        }
        if let Some(s) = &pareto {
            out(&format!(
                "a Pareto search: per grid point below, the frontier of {} over {} lattice points of {}{}; at most {} are evaluated ({}), chosen as it runs\n",
                list(&s.objectives),
                s.lattice_size(),
                s.parameters.iter().map(|(p, _, _)| p.as_str()).collect::<Vec<_>>().join(" × "),
                if s.slo.is_empty() { String::new() } else { format!(" meeting {}", list(&s.slo)) },
                s.max_points,
                count(plan.replicates, "run") + " each"
            ));
        }
        out(&crate::report::text::dry_run(&plan));
        return Ok(ExitCode::SUCCESS);
    }
    let shard = match (&args.shard, Shard::from_slurm_env()) {
        (Some(s), _) => Some(Shard::parse(s).map_err(|e| Failure::Input(e.0))?),
        (None, Some(env)) => Some(env.map_err(|e| Failure::Input(e.0))?),
        (None, None) => None,
    };
    let output = args.output.clone().unwrap_or_else(|| plan.default_output.clone());
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    if let Some(j) = args.jobs.filter(|&j| j > 4 * cores) {
        eprintln!(
            "warning: -j {j} is more than 4 × the {cores} cores here; runs share the cores, so more threads only add overhead (at most one thread per run to do, and 32 per core, are started)"
        );
    }
    let opts = RunnerOptions {
        output: output.clone(),
        jobs: args.jobs,
        shard,
        resume: args.resume,
        overwrite: args.overwrite,
        progress: !args.quiet,
    };
    let _lock =
        crate::sweep::lock::DirLock::acquire(&output, shard, crate::sweep::lock::Purpose::Run).map_err(input)?;
    let _ = ctrlc::set_handler(|| {
        if STOP.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!(
            "stopping: runs in flight stop within a second and are recorded as interrupted; finished runs are saved (Ctrl-C again to abort)"
        );
    });
    let started = std::time::Instant::now();
    if args.resume && search.is_some() && Shard::from_slurm_env().is_none() {
        // A Slurm array task always passes --resume; by hand it is a request this cannot honour.
        eprintln!(
            "warning: a search cannot resume (each probe depends on the results before it): it starts over in {}",
            output.display()
        );
    }
    if let Some(pareto) = pareto {
        let report = crate::sweep::pareto::run_pareto(&spec, &plan, &pareto, &opts, &STOP)?;
        if !args.quiet {
            out(&crate::report::text::pareto_table(&report));
        }
        let evaluated: usize = report.points.iter().map(|(_, _, p)| p.evaluated.len()).sum();
        let what = format!("{evaluated} of {} lattice points evaluated", pareto.lattice_size() * report.points.len());
        return Ok(close_search(&what, &report.runs, &output, plan.report, started));
    }
    if let Some(search) = search {
        let report = crate::sweep::search::run_search(&spec, &plan, &search, &opts, &STOP)?;
        if !args.quiet {
            out(&crate::report::text::search_table(&report));
        }
        let probes = report.probes();
        let what = if probes == 1 { "1 probe".to_string() } else { format!("{probes} probes") };
        return Ok(close_search(&what, &report.runs, &output, plan.report, started));
    }
    let report = run_sweep(&plan, &opts, &STOP)?;
    let wall = started.elapsed().as_secs_f64();
    if !report.dropped.is_empty() {
        eprintln!(
            "warning: the spec changed: kept the {} earlier runs it still holds, dropped {} it no longer does:",
            report.skipped,
            report.dropped.len()
        );
        for d in report.dropped.iter().take(10) {
            eprintln!("  {d}");
        }
        if report.dropped.len() > 10 {
            eprintln!("  … and {} more", report.dropped.len() - 10);
        }
    }
    out(&summarize(&plan, &report, &output, wall, args.quiet));
    if args.quiet {
        // Without -q the progress display has already said why each run failed.
        for (id, msg) in report.failures.iter().take(10) {
            eprintln!("run {id} failed: {msg}");
        }
        if report.failures.len() > 10 {
            eprintln!("… and {} more failed runs (see the error column of runs.parquet)", report.failures.len() - 10);
        }
    }
    if plan.report && report.merged.is_some() && report.executed > 0 {
        super::results::auto_report(&output);
    }
    if report.interrupted {
        return Err(Failure::Run(format!(
            "interrupted after {} of {} runs ({} stopped in flight, recorded as interrupted); finished runs are saved — rerun with --resume to complete",
            report.executed as usize - report.interrupted_runs.len(),
            report.selected - report.skipped,
            report.interrupted_runs.len()
        )));
    }
    Ok(if report.failures.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The close of a search or a Pareto search: what it did, its runs, where
/// the results are, the report; exit 1 if it was interrupted.
fn close_search(
    what: &str,
    runs_done: &SweepReport,
    output: &std::path::Path,
    report: bool,
    started: std::time::Instant,
) -> ExitCode {
    let place = if runs_done.merged.is_some() {
        format!("results: {}", output.display())
    } else {
        format!("parts in {} (opal-sweep merge when every shard is done)", output.display())
    };
    out(&format!(
        "{what} ({}, {} failed) in {:.2} s\n{place}\n",
        count(runs_done.executed, "run"),
        runs_done.failures.len(),
        started.elapsed().as_secs_f64()
    ));
    if report && runs_done.merged.is_some() {
        super::results::auto_report(output);
    }
    if STOP.load(Ordering::SeqCst) { ExitCode::from(1) } else { ExitCode::SUCCESS }
}

/// What a finished sweep prints: the summary (a run's numbers or one line
/// per point), what a changed spec kept and dropped, the counts and where
/// the results are. With `quiet`, only the last line, counts included.
fn summarize(plan: &SweepPlan, report: &SweepReport, output: &std::path::Path, wall: f64, quiet: bool) -> String {
    let mut text = String::new();
    if quiet {
        // Only the closing line below.
    } else if plan.total_runs() == 1
        && let Some((summary, sc25, stages)) = &report.first
    {
        text.push_str(&format!("{} — seed {}\n", plan.name, plan.base_seed));
        text.push_str(&crate::report::text::summary_table(summary));
        if stages.len() > 1 {
            text.push_str(&crate::report::text::stage_table(stages));
        }
        if !sc25.is_empty() {
            text.push_str(&crate::report::text::sc25_table(sc25));
        }
    } else if report.executed > 0 {
        let width = terminal_size::terminal_size().map_or(120, |(w, _)| usize::from(w.0)).max(60);
        text.push_str(&crate::report::text::sweep_table(plan, &report.points, width));
    }
    if report.executed == 0 && report.skipped == report.selected && report.selected > 0 {
        text.push_str(&format!(
            "all {} runs are already in {} — nothing to do (--overwrite runs them again)\n",
            report.selected,
            output.display()
        ));
        return text;
    }
    let ok = report.executed as usize - report.failures.len() - report.interrupted_runs.len();
    let place = match &report.merged {
        Some(_) => format!("results: {}", output.display()),
        None => {
            format!("parts: {} (merge with: opal-sweep merge {})", output.join("parts").display(), output.display())
        }
    };
    if quiet {
        text.push_str(&place);
        text.push_str(" — ");
    }
    text.push_str(&format!(
        "{} ok, {} failed, {}{} skipped (already done) of {} in {wall:.2} s",
        count(ok as u64, "run"),
        report.failures.len(),
        match report.interrupted_runs.len() {
            0 => String::new(),
            n => format!("{n} interrupted, "),
        },
        report.skipped,
        report.selected
    ));
    if report.selected < report.total {
        text.push_str(&format!(" (this shard; {} runs in the sweep)", report.total));
    }
    text.push('\n');
    if !quiet {
        text.push_str(&place);
        text.push('\n');
    }
    text
}
