//! Executing a sweep: runs in parallel on a rayon pool, each isolated (an
//! error or panic becomes a failed row), results streamed to part files as
//! they finish, then merged into the final tables.
//!
//! Durability: finished runs are flushed to a part at least every second
//! (and every 256 runs, or sooner when request rows pile up), and on
//! Ctrl-C / SIGTERM everything finished is flushed and merged before exit,
//! so an interrupted sweep loses at most the last second's runs to a
//! SIGKILL — and `--resume` re-runs exactly the runs missing.

use super::{RunPlan, SweepPlan, run_scenario};
use crate::metrics::RunSummary;
use crate::metrics::rows::col;
use crate::output::TableSet;
use crate::output::spill::RunSpill;
use crate::output::{
    Layout, MergeReport, OutputError, PartBuffer, RunResult, TableKind, completed_runs, merge, rebase, stored_runs,
};
use crate::{RunError, RunOptions};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rayon::prelude::*;
use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A deterministic subset of a sweep: runs with `run_id % count == index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// This shard, from 0.
    pub index: u32,
    /// Number of shards.
    pub count: u32,
}

/// A `--shard` value or Slurm array variables that name no shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardError(pub String);

impl std::fmt::Display for ShardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ShardError {}

/// A run that panicked (a broken invariant), with the panic's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Panic(pub String);

impl std::fmt::Display for Panic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "panic: {}", self.0)
    }
}

impl Shard {
    /// Parses `i/N`.
    pub fn parse(s: &str) -> Result<Shard, ShardError> {
        let err = || ShardError(format!("--shard takes i/N with 0 ≤ i < N (e.g. 0/4), got {s:?}"));
        let (i, n) = s.split_once('/').ok_or_else(err)?;
        let (index, count) = (i.trim().parse().map_err(|_| err())?, n.trim().parse().map_err(|_| err())?);
        if count == 0 || index >= count {
            return Err(err());
        }
        Ok(Shard { index, count })
    }

    /// The shard of a Slurm array task (`SLURM_ARRAY_TASK_ID − SLURM_ARRAY_TASK_MIN`
    /// of `SLURM_ARRAY_TASK_COUNT`), if those variables are set.
    pub fn from_slurm_env() -> Option<Result<Shard, ShardError>> {
        let var = |k: &str| std::env::var(k).ok();
        let (id, count) = (var("SLURM_ARRAY_TASK_ID")?, var("SLURM_ARRAY_TASK_COUNT")?);
        let min = var("SLURM_ARRAY_TASK_MIN").unwrap_or_else(|| "0".into());
        let parse =
            |v: &str, k: &str| v.trim().parse::<u32>().map_err(|_| ShardError(format!("{k}={v:?} is not a number")));
        Some((|| {
            let (id, count, min) = (
                parse(&id, "SLURM_ARRAY_TASK_ID")?,
                parse(&count, "SLURM_ARRAY_TASK_COUNT")?,
                parse(&min, "SLURM_ARRAY_TASK_MIN")?,
            );
            let index = id
                .checked_sub(min)
                .ok_or_else(|| ShardError("SLURM_ARRAY_TASK_ID is below SLURM_ARRAY_TASK_MIN".into()))?;
            Shard::parse(&format!("{index}/{count}"))
        })())
    }

    /// Whether run `id` belongs to this shard.
    pub fn contains(&self, id: u32) -> bool {
        id % self.count == self.index
    }
}

/// How to run a sweep.
#[derive(Clone, Debug)]
pub struct RunnerOptions {
    /// Output directory.
    pub output: PathBuf,
    /// Worker threads (default: all cores).
    pub jobs: Option<usize>,
    /// Run only this shard (its parts are left for `opal-sweep merge`).
    pub shard: Option<Shard>,
    /// Skip runs already in the output directory.
    pub resume: bool,
    /// Delete earlier results in the output directory first.
    pub overwrite: bool,
    /// Show a progress bar (on a terminal) or log lines.
    pub progress: bool,
}

/// What a sweep invocation did.
#[derive(Clone, Debug, Default)]
pub struct SweepReport {
    /// Runs in the whole sweep.
    pub total: u32,
    /// Runs this invocation was responsible for (its shard).
    pub selected: u32,
    /// Of those, already present and skipped (`--resume`).
    pub skipped: u32,
    /// Runs executed now (failed and interrupted ones included).
    pub executed: u32,
    /// What the runs executed now gave, per grid point (memory bounded by
    /// the grid, not by the runs).
    pub points: std::collections::BTreeMap<u32, PointTally>,
    /// The summary of run 0 and its SC25 rows, when it was executed now and
    /// succeeded (what a one-run spec prints).
    pub first: Option<(RunSummary, Vec<crate::metrics::Sc25Row>, Vec<crate::metrics::StageRow>)>,
    /// Failed runs executed now: (run id, message).
    pub failures: Vec<(u32, String)>,
    /// Stopped early by a signal.
    pub interrupted: bool,
    /// Runs stopped in flight by the signal (recorded as `interrupted`; `--resume` runs them again).
    pub interrupted_runs: Vec<u32>,
    /// With `--resume` after the spec changed: earlier runs the spec no
    /// longer holds, removed from the results (described).
    pub dropped: Vec<String>,
    /// The merge, if this invocation merged.
    pub merged: Option<MergeReport>,
    /// Wall seconds spent writing parts and merging (the Parquet share of the sweep).
    pub write_secs: f64,
}

/// Means over a grid point's successful runs of the numbers the terminal
/// shows, kept as sums.
#[derive(Clone, Debug, Default)]
pub struct PointTally {
    /// Runs executed.
    pub runs: u32,
    /// Of those, successful.
    pub ok: u32,
    /// Successful runs whose queue kept growing (see [`crate::metrics::steady`]).
    pub unstable: u32,
    /// Successful runs too short to tell whether they reached a steady state.
    pub too_short: u32,
    /// Requests generated and rejected (longer than `max_model_len`) over its successful runs.
    pub generated: u64,
    /// See `generated`.
    pub rejected: u64,
    sums: [f64; 6],
}

impl PointTally {
    fn add(&mut self, s: Option<&RunSummary>) {
        self.runs += 1;
        if let Some(s) = s {
            self.ok += 1;
            self.generated += s.requests_generated;
            self.rejected += s.requests_rejected;
            match s.steady.stability {
                crate::metrics::steady::Stability::Unstable => self.unstable += 1,
                crate::metrics::steady::Stability::TooShort => self.too_short += 1,
                crate::metrics::steady::Stability::Stable => {}
            }
            let values = [
                s.ttft_ms.p50,
                s.ttft_ms.p99,
                s.tpot_ms.p50,
                s.requests_per_s,
                s.gpu_busy_fraction,
                s.tiers.prefix_hit_ratio(),
            ];
            for (acc, v) in self.sums.iter_mut().zip(values) {
                *acc += v;
            }
        }
    }

    /// Means over the successful runs of TTFT p50 and p99, TPOT p50 (ms),
    /// requests/s, GPU utilisation and prefix-hit ratio (NaN without one).
    pub fn means(&self) -> [f64; 6] {
        self.sums.map(|v| if self.ok == 0 { f64::NAN } else { v / f64::from(self.ok) })
    }
}

/// A problem that stops a sweep (not a failed run).
#[derive(Debug)]
pub enum SweepError {
    /// Reading or writing the result tables.
    Output(OutputError),
    /// A file or directory of the sweep could not be read, written or created.
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done (empty: the system's error says it).
        what: &'static str,
        /// The system's error.
        cause: std::io::Error,
    },
    /// A manifest that is not one opal-sweep wrote.
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// Why it cannot be read.
        problem: String,
    },
    /// The output directory holds results this invocation must not mix with,
    /// overwrite or merge as they are; the message says which and the fix.
    Directory(String),
    /// A search round's plan is invalid.
    Plan(crate::config::ConfigError),
    /// Arrow could not assemble the search table.
    Arrow(arrow_schema::ArrowError),
    /// The thread pool could not start.
    Threads(rayon::ThreadPoolBuildError),
}

impl SweepError {
    pub(crate) fn io(path: &Path, what: &'static str, cause: std::io::Error) -> SweepError {
        SweepError::Io { path: path.to_path_buf(), what, cause }
    }
}

impl std::fmt::Display for SweepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SweepError::Output(e) => write!(f, "{e}"),
            SweepError::Io { path, what: "", cause } => write!(f, "{}: {cause}", path.display()),
            SweepError::Io { path, what, cause } => write!(f, "{}: {what}: {cause}", path.display()),
            SweepError::Manifest { path, problem } => write!(f, "{}: {problem}", path.display()),
            SweepError::Directory(message) => f.write_str(message),
            SweepError::Plan(e) => write!(f, "{e}"),
            SweepError::Arrow(e) => write!(f, "{e}"),
            SweepError::Threads(e) => write!(f, "cannot start the thread pool: {e}"),
        }
    }
}

impl std::error::Error for SweepError {}

impl From<OutputError> for SweepError {
    fn from(e: OutputError) -> Self {
        SweepError::Output(e)
    }
}

/// Runs `f`, turning a panic into an error.
pub fn isolate<T>(f: impl FnOnce() -> T) -> Result<T, Panic> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Panic(msg)
    })
}

/// Runs `run`; its per-row tables (those of `tables` it asks for) are
/// written as it goes into spill files under `layout` (see
/// [`crate::output::spill`]), so its memory does not grow with its length.
pub(crate) fn execute(run: RunPlan<'_>, opts: &RunOptions<'_>, layout: &Layout, tables: &TableSet) -> RunResult {
    let started = Instant::now();
    let mut spill = Some(RunSpill::new(layout, tables, run.meta.run_id)).filter(|s| !s.is_empty());
    let outcome = run_scenario(&run).map_err(RunError::Config).and_then(|s| {
        isolate(|| match spill.as_mut() {
            Some(sink) => crate::simulate_into(&s, opts, sink),
            None => crate::simulate_with(&s, opts),
        })
        .map_err(|p| RunError::Panic(p.0))?
    });
    let (outcome, spilled) = match (outcome, spill) {
        (Ok(out), Some(sp)) => match sp.finish() {
            Ok(files) => (Ok(out), Some(files)),
            Err(e) => (Err(RunError::Rows(e.to_string())), None),
        },
        (outcome, Some(sp)) => {
            sp.discard();
            (outcome, None)
        }
        (outcome, None) => (outcome, None),
    };
    let mut r = RunResult::new(run.meta, run.point.axis_values.clone(), outcome, started.elapsed().as_secs_f64());
    r.spilled = spilled;
    r
}

/// Worker threads for `todo` runs: `jobs` (all cores when unset or 0),
/// never more than there are runs to do nor [`MAX_THREADS_PER_CORE`] per
/// core, at least one.
pub fn threads_for(jobs: Option<usize>, todo: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    jobs.filter(|&j| j > 0).unwrap_or(cores).min(todo).min(MAX_THREADS_PER_CORE * cores).max(1)
}

/// Most worker threads per core `-j` may start (runs are CPU-bound: more
/// threads only compete).
pub const MAX_THREADS_PER_CORE: usize = 32;

/// The manifest written next to the tables.
pub fn manifest(plan: &SweepPlan, shard: Option<Shard>) -> serde_json::Value {
    serde_json::json!({
        "tool": "opal",
        "version": env!("CARGO_PKG_VERSION"),
        "name": plan.name,
        "spec_file": plan.source,
        "spec_digest": format!("{:016x}", plan.digest),
        "runs": plan.total_runs(),
        "points": plan.points.len(),
        "replicates": plan.replicates,
        "base_seed": plan.base_seed,
        "seed_rule": "seed = base_seed + replicate",
        "tables": plan.tables.tables.iter().map(|t| t.name()).collect::<Vec<_>>(),
        "report": plan.report,
        "axes": plan.tables.axis_columns.iter().map(|(p, _)| p).collect::<Vec<_>>(),
        "grid": plan.points.iter().map(|p| serde_json::json!({
            col::POINT_ID: p.id,
            "overrides": p.overrides.iter().map(|(k, v)| (k.clone(), serde_json::to_value(v).unwrap_or_default())).collect::<serde_json::Map<_, _>>(),
        })).collect::<Vec<_>>(),
        "shard": shard.map(|s| serde_json::json!({"index": s.index, "count": s.count})),
        "resolved_spec": plan.canonical,
        "scenario_with_defaults": plan.scenario_with_defaults,
    })
}

fn write_json_atomic(path: &Path, value: &serde_json::Value) -> Result<(), SweepError> {
    let tmp = path.with_extension(format!("json.tmp-{}", std::process::id()));
    let text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    std::fs::write(&tmp, text)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|e| SweepError::io(path, "cannot write", e))
}

/// True when the sweep in `dir` asked for the HTML report (`[sweep] report
/// = true`, recorded in its manifest).
pub fn report_requested(dir: &Path) -> bool {
    manifests(dir)
        .ok()
        .and_then(|m| m.first().and_then(|(_, v)| v.get("report").and_then(serde_json::Value::as_bool)))
        .unwrap_or(false)
}

/// Manifests found in a sweep directory (the final one and the shards').
pub fn manifests(dir: &Path) -> Result<Vec<(PathBuf, serde_json::Value)>, SweepError> {
    let mut paths = vec![dir.join("manifest.json")];
    if let Ok(entries) = std::fs::read_dir(dir.join("parts")) {
        let mut more: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("manifest.")))
            .collect();
        more.sort();
        paths.extend(more);
    }
    let mut out = Vec::new();
    for p in paths {
        match std::fs::read_to_string(&p) {
            Ok(text) => out.push((
                p.clone(),
                serde_json::from_str(&text).map_err(|e| SweepError::Manifest {
                    path: p.clone(),
                    problem: format!("not a valid manifest: {e}"),
                })?,
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(SweepError::io(&p, "cannot read", e)),
        }
    }
    Ok(out)
}

/// Makes the output directory ready. Returns the manifest of a different
/// spec whose runs `--resume` may reuse (see [`rebase_changed_spec`]).
fn prepare_dir(
    plan: &SweepPlan,
    opts: &RunnerOptions,
    layout: &Layout,
) -> Result<Option<serde_json::Value>, SweepError> {
    let dir = &layout.dir;
    std::fs::create_dir_all(dir).map_err(|e| SweepError::io(dir, "cannot create the output directory", e))?;
    if opts.overwrite {
        for k in TableKind::WRITE_ORDER {
            let _ = std::fs::remove_file(layout.table(k));
        }
        let _ = std::fs::remove_dir_all(layout.parts_dir());
        let _ = std::fs::remove_file(dir.join("manifest.json"));
        return Ok(None);
    }
    let digest = format!("{:016x}", plan.digest);
    let mut changed = None;
    for (path, m) in manifests(dir)? {
        if m["spec_digest"].as_str() == Some(digest.as_str()) {
            continue;
        }
        let sharded = opts.shard.is_some_and(|s| s.count > 1) || m["shard"].is_object();
        let other_study = m["name"].as_str().filter(|&n| n != plan.name);
        if let Some(name) = other_study {
            // --resume continues a study; it never replaces another one.
            return Err(SweepError::Directory(format!(
                "{} holds the results of another study, \"{name}\" ({}), and this spec is \"{}\"; nothing was changed\n  fix: choose another output with -o (or sweep.output), or pass --overwrite to delete \"{name}\"'s results",
                dir.display(),
                path.display(),
                plan.name
            )));
        }
        if !opts.resume || sharded {
            let fix = if sharded {
                "fix: choose another output with -o, resume a changed spec without shards (opal-sweep SPEC --resume merges and reuses what it can), or pass --overwrite to delete them"
            } else {
                "fix: choose another output with -o, pass --resume to keep the runs the spec still contains and run the rest (it drops the others), or pass --overwrite to delete them"
            };
            return Err(SweepError::Directory(format!(
                "{} holds results of a different spec ({}); refusing to mix them\n  {fix}",
                dir.display(),
                path.display()
            )));
        }
        changed = Some(m);
    }
    Ok(changed)
}

/// For `--resume` after the spec changed: keeps every finished run of the
/// old results whose identity (resolved scenario and seed, see
/// [`crate::output::RunMeta::run_key`]) the plan still holds, under its new
/// run id, and drops the others. Returns the old runs dropped, described
/// with the old manifest's grid.
fn rebase_changed_spec(plan: &SweepPlan, layout: &Layout, old: &serde_json::Value) -> Result<Vec<String>, SweepError> {
    let stored = stored_runs(layout)?;
    if stored.iter().any(|r| r.run_key.is_none()) {
        return Err(SweepError::Directory(format!(
            "{}: these results predate run identities, so runs of a changed spec cannot be matched\n  fix: pass --overwrite to start over, or choose another output with -o",
            layout.dir.display()
        )));
    }
    let new: std::collections::HashMap<u64, RunPlan<'_>> = plan.runs().map(|r| (r.meta.run_key, r)).collect();
    let mut keep = std::collections::BTreeMap::new();
    let mut dropped = Vec::new();
    let describe = |point: u32| {
        old["grid"]
            .as_array()
            .and_then(|g| g.iter().find(|p| p[col::POINT_ID] == point))
            .and_then(|p| p["overrides"].as_object())
            .map(|o| o.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", "))
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| "the base scenario".into())
    };
    for r in &stored {
        match r.run_key.and_then(|k| new.get(&k)).filter(|_| !r.interrupted) {
            Some(run) => {
                keep.insert(r.run_id, (run.meta, run.point.axis_values.clone()));
            }
            None if r.interrupted => {} // run again if the plan still has it
            None => dropped.push(format!("run {} (point {}: {})", r.run_id, r.point_id, describe(r.point_id))),
        }
    }
    if keep.is_empty() && !dropped.is_empty() {
        // Nothing to resume: this would only delete the other results.
        return Err(SweepError::Directory(format!(
            "{} holds {} finished runs of a different spec and this spec keeps none of them; nothing was changed\n  fix: choose another output with -o (or sweep.output), or pass --overwrite to delete them",
            layout.dir.display(),
            dropped.len()
        )));
    }
    rebase(layout, &plan.tables, &keep)?;
    Ok(dropped)
}

/// Runs the sweep per `opts`; `stop` is set by a signal handler to stop early.
pub fn run_sweep(plan: &SweepPlan, opts: &RunnerOptions, stop: &AtomicBool) -> Result<SweepReport, SweepError> {
    let layout = Layout { dir: opts.output.clone() };
    let changed = prepare_dir(plan, opts, &layout)?;
    let dropped = match &changed {
        Some(old) => rebase_changed_spec(plan, &layout, old)?,
        None => Vec::new(),
    };
    let sharded = opts.shard.is_some_and(|s| s.count > 1);
    match opts.shard.filter(|_| sharded) {
        Some(s) => {
            std::fs::create_dir_all(layout.parts_dir()).map_err(|e| SweepError::io(&layout.parts_dir(), "", e))?;
            write_json_atomic(
                &layout.parts_dir().join(format!("manifest.shard-{}-of-{}.json", s.index, s.count)),
                &manifest(plan, Some(s)),
            )?;
        }
        None => write_json_atomic(&layout.dir.join("manifest.json"), &manifest(plan, None))?,
    }
    let done = completed_runs(&layout)?;
    let mut report = SweepReport { total: plan.total_runs(), dropped, ..SweepReport::default() };
    let mut todo = Vec::new();
    for run in plan.runs() {
        if opts.shard.is_some_and(|s| !s.contains(run.meta.run_id)) {
            continue;
        }
        report.selected += 1;
        if done.contains(&run.meta.run_id) {
            report.skipped += 1;
        } else {
            todo.push(run);
        }
    }
    if report.skipped > 0 && report.skipped < report.selected && !opts.resume {
        return Err(SweepError::Directory(format!(
            "{} already holds {} of the runs this invocation would do\n  fix: pass --resume to run only the missing runs, or --overwrite to start over",
            layout.dir.display(),
            report.skipped
        )));
    }

    let run_opts = RunOptions {
        request_records: plan.tables.tables.contains(&TableKind::Requests),
        step_records: plan.tables.tables.contains(&TableKind::Steps),
        profile_routing: false,
        stop: Some(stop),
        progress: None,
    };
    let shard_tag =
        opts.shard.filter(|_| sharded).map_or_else(|| "all".to_string(), |s| format!("s{}of{}", s.index, s.count));
    let pid = std::process::id();
    let progress = Progress::new(todo.len() as u64, opts.progress);
    let threads = threads_for(opts.jobs, todo.len());
    // With no more runs than threads, each run shows its own progress (a
    // long run would otherwise show nothing until it ends).
    let watch: Vec<Watched> = if opts.progress && todo.len() <= threads {
        todo.iter().map(|r| Watched::new(r.point.scenario.as_deref().ok())).collect()
    } else {
        Vec::new()
    };
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().map_err(SweepError::Threads)?;
    let (tx, rx) = mpsc::channel::<RunResult>();
    let mut buffer = PartBuffer::new(plan.tables.clone());
    let mut seq = 0u32;
    let mut write_error = None;
    let mut write_secs = 0.0;
    std::thread::scope(|scope| {
        let todo = &todo;
        let run_opts = &run_opts;
        let watch = &watch;
        let (layout, tables) = (&layout, &plan.tables);
        scope.spawn(move || {
            pool.install(|| {
                todo.par_iter().enumerate().with_max_len(1).for_each_with(tx, |tx, (i, run)| {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let opts = RunOptions { progress: watch.get(i).map(|w| &w.progress), ..*run_opts };
                    let _ = tx.send(execute(*run, &opts, layout, tables));
                });
            });
        });
        let mut last_flush = Instant::now();
        let flush = |buffer: &mut PartBuffer, seq: &mut u32| -> Result<(), OutputError> {
            *seq += 1;
            buffer.flush(layout, &format!("{shard_tag}.{pid}-{seq:05}"))
        };
        loop {
            let result = match rx.recv_timeout(Duration::from_millis(250)) {
                Ok(r) => r,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    progress.running(todo, watch);
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
            progress.finished(&result);
            report.executed += 1;
            let summary = result.outcome.as_ref().ok().map(|o| &o.summary);
            report.points.entry(result.meta.point_id).or_default().add(summary);
            if result.meta.run_id == 0
                && let Ok(o) = &result.outcome
            {
                report.first = Some((o.summary.clone(), o.sc25.clone(), o.stages.clone()));
            }
            match &result.outcome {
                Err(RunError::Interrupted { .. }) => report.interrupted_runs.push(result.meta.run_id),
                Err(e) => report.failures.push((result.meta.run_id, e.to_string())),
                Ok(_) => {}
            }
            buffer.add(result);
            let due = last_flush.elapsed() >= Duration::from_secs(1)
                || buffer.len() >= 256
                || buffer.request_rows() >= 1_000_000;
            if due && write_error.is_none() {
                let t = Instant::now();
                write_error = flush(&mut buffer, &mut seq).err();
                write_secs += t.elapsed().as_secs_f64();
                last_flush = Instant::now();
            }
        }
        // The rest is flushed as a part — unless it is the whole result, which
        // then goes straight into the final tables.
        let whole = seq == 0 && !sharded && done.is_empty();
        if write_error.is_none() && !whole {
            let t = Instant::now();
            write_error = flush(&mut buffer, &mut seq).err();
            write_secs += t.elapsed().as_secs_f64();
        }
    });
    progress.done();
    if let Some(e) = write_error {
        return Err(e.into());
    }
    report.interrupted = stop.load(Ordering::Relaxed)
        && ((report.executed as usize) < todo.len() || !report.interrupted_runs.is_empty());
    if !sharded {
        let t = Instant::now();
        report.merged =
            Some(if buffer.is_empty() { merge(&layout, &plan.tables.tables)? } else { buffer.write_final(&layout)? });
        write_secs += t.elapsed().as_secs_f64();
    }
    report.write_secs = write_secs;
    report.failures.sort_by_key(|(id, _)| *id);
    Ok(report)
}

/// Executes and writes the runs of a search, round by round (see
/// [`crate::sweep::search`]): the same directory handling, part files and
/// merge as a sweep.
pub struct SearchWriter {
    layout: Layout,
    buffer: PartBuffer,
    tables: crate::output::TableSet,
    sharded: bool,
    shard_tag: String,
    seq: u32,
    pool: rayon::ThreadPool,
    run_opts: (bool, bool),
    report: SweepReport,
    progress: RoundProgress,
}

/// A search's progress: on a terminal, a bar over each round's runs whose
/// message says what the round probes; otherwise a line per round.
struct RoundProgress {
    bar: Option<ProgressBar>,
    enabled: bool,
    rounds: u32,
}

impl RoundProgress {
    fn new(enabled: bool) -> RoundProgress {
        let bar = (enabled && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{bar:30} {pos}/{len} runs of round {prefix}  {msg}  elapsed {elapsed}")
                    .expect("valid progress template"),
            );
            bar
        });
        RoundProgress { bar, enabled, rounds: 0 }
    }

    fn round(&mut self, what: &str, runs: usize) {
        self.rounds += 1;
        match &self.bar {
            Some(bar) => {
                bar.set_length(runs as u64);
                bar.set_position(0);
                bar.set_prefix(self.rounds.to_string());
                bar.set_message(what.to_string());
            }
            None if self.enabled => {
                eprintln!("search round {}: {what} ({runs} run{})", self.rounds, if runs == 1 { "" } else { "s" })
            }
            None => {}
        }
    }
}

impl SearchWriter {
    /// Prepares the output directory and writes the manifest. A search
    /// cannot resume (its probes depend on each other): with `--resume` (as
    /// a Slurm task is always started) it starts its part over — a shard
    /// deletes its own part files first, an unsharded search the results.
    pub fn start(
        base: &SweepPlan,
        tables: crate::output::TableSet,
        search: serde_json::Value,
        opts: &RunnerOptions,
    ) -> Result<SearchWriter, SweepError> {
        let layout = Layout { dir: opts.output.clone() };
        let sharded = opts.shard.is_some_and(|s| s.count > 1);
        let over =
            RunnerOptions { overwrite: opts.overwrite || (opts.resume && !sharded), resume: false, ..opts.clone() };
        prepare_dir(base, &over, &layout)?;
        if !over.overwrite && !sharded && layout.table(TableKind::Runs).exists() {
            return Err(SweepError::Directory(format!(
                "{} already holds results\n  fix: pass --overwrite to search again, or choose another output with -o",
                layout.dir.display()
            )));
        }
        if let Some(s) = opts.shard.filter(|_| sharded)
            && let Ok(entries) = std::fs::read_dir(layout.parts_dir())
        {
            let mine = format!(".s{}of{}.", s.index, s.count);
            for e in entries.filter_map(Result::ok) {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.contains(&mine) && name.ends_with(".parquet") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let mut m = manifest(base, opts.shard.filter(|_| sharded));
        m["tables"] = serde_json::json!(tables.tables.iter().map(|t| t.name()).collect::<Vec<_>>());
        // The report's axes: the grid's and the searched value (probe and search_step are columns only).
        let axes: Vec<&String> =
            tables.axis_columns.iter().map(|(p, _)| p).take(tables.axis_columns.len() - 2).collect();
        m["axes"] = serde_json::json!(axes);
        m["runs"] = serde_json::Value::Null;
        m["search"] = search;
        match opts.shard.filter(|_| sharded) {
            Some(s) => {
                std::fs::create_dir_all(layout.parts_dir()).map_err(|e| SweepError::io(&layout.parts_dir(), "", e))?;
                write_json_atomic(
                    &layout.parts_dir().join(format!("manifest.shard-{}-of-{}.json", s.index, s.count)),
                    &m,
                )?;
            }
            None => write_json_atomic(&layout.dir.join("manifest.json"), &m)?,
        }
        let threads = threads_for(opts.jobs, usize::MAX);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().map_err(SweepError::Threads)?;
        Ok(SearchWriter {
            layout,
            buffer: PartBuffer::new(tables.clone()),
            run_opts: (tables.tables.contains(&TableKind::Requests), tables.tables.contains(&TableKind::Steps)),
            tables,
            sharded,
            shard_tag: opts
                .shard
                .filter(|_| sharded)
                .map_or_else(|| "all".into(), |s| format!("s{}of{}", s.index, s.count)),
            seq: 0,
            pool,
            report: SweepReport::default(),
            progress: RoundProgress::new(opts.progress),
        })
    }

    /// Says what the next round probes (`what`) and how many runs it does.
    pub fn round(&mut self, what: &str, runs: usize) {
        self.progress.round(what, runs);
    }

    /// Runs `runs` in parallel (each with its axis values); results in the same order.
    pub fn execute(
        &mut self,
        runs: &[(RunPlan<'_>, Vec<crate::output::AxisValue>)],
        stop: &AtomicBool,
    ) -> Result<Vec<RunResult>, SweepError> {
        let opts = RunOptions {
            request_records: self.run_opts.0,
            step_records: self.run_opts.1,
            profile_routing: false,
            stop: Some(stop),
            progress: None,
        };
        let bar = self.progress.bar.as_ref();
        let results: Vec<RunResult> = self.pool.install(|| {
            runs.par_iter()
                .with_max_len(1)
                .map(|(run, axes)| {
                    let r = RunResult { axes: axes.clone(), ..execute(*run, &opts, &self.layout, &self.tables) };
                    if let Some(bar) = bar {
                        bar.inc(1);
                    }
                    r
                })
                .collect()
        });
        for r in &results {
            self.report.executed += 1;
            match &r.outcome {
                Err(RunError::Interrupted { .. }) => self.report.interrupted_runs.push(r.meta.run_id),
                Err(e) => self.report.failures.push((r.meta.run_id, e.to_string())),
                Ok(_) => {}
            }
        }
        Ok(results)
    }

    /// Writes a round's results as a part file.
    pub fn flush(&mut self, results: Vec<RunResult>) -> Result<(), SweepError> {
        for r in results {
            self.buffer.add(r);
        }
        self.seq += 1;
        let pid = std::process::id();
        self.buffer.flush(&self.layout, &format!("{}.{pid}-{:05}", self.shard_tag, self.seq)).map_err(SweepError::from)
    }

    /// Merges the parts into the tables (unless sharded: `merge` does that).
    pub fn finish(mut self) -> Result<SweepReport, SweepError> {
        if let Some(bar) = &self.progress.bar {
            bar.finish_and_clear();
        }
        if !self.sharded {
            self.report.merged = Some(merge(&self.layout, &self.tables.tables)?);
        }
        self.report.total = self.report.executed;
        Ok(self.report)
    }
}

/// A sharded search's per-shard `search.parquet` (or `pareto.parquet`)
/// parts into one table, sorted by grid point (nothing to do for a sweep).
fn merge_search_parts(layout: &Layout) -> Result<(), SweepError> {
    for table in ["search", "pareto"] {
        merge_parts_of(layout, table)?;
    }
    Ok(())
}

fn merge_parts_of(layout: &Layout, table: &str) -> Result<(), SweepError> {
    let Ok(entries) = std::fs::read_dir(layout.parts_dir()) else { return Ok(()) };
    let prefix = format!("{table}.s");
    let mut parts: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".parquet"))
        })
        .collect();
    if parts.is_empty() {
        return Ok(());
    }
    parts.sort();
    let mut batches = Vec::new();
    for p in &parts {
        batches.extend(crate::output::read_table(p)?);
    }
    let schema = batches[0].schema();
    let all = arrow_select::concat::concat_batches(&schema, &batches).map_err(SweepError::Arrow)?;
    let ids = crate::output::f64_column(&all, col::POINT_ID).unwrap_or_default();
    let mut order: Vec<u32> = (0..all.num_rows() as u32).collect();
    order.sort_by(|&a, &b| ids[a as usize].partial_cmp(&ids[b as usize]).unwrap_or(std::cmp::Ordering::Equal));
    let sorted = arrow_select::take::take_record_batch(&all, &arrow_array::UInt32Array::from(order))
        .map_err(SweepError::Arrow)?;
    crate::output::write_batch(&layout.dir.join(format!("{table}.parquet")), sorted)?;
    for p in &parts {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// Merges the part files of a (sharded) sweep directory into its tables and
/// writes its manifest.
pub fn merge_dir(dir: &Path) -> Result<MergeReport, SweepError> {
    let found = manifests(dir)?;
    let (_, first) = found.first().ok_or_else(|| {
        SweepError::Directory(format!(
            "{} has no manifest.json or shard manifests: is it a sweep output directory?",
            dir.display()
        ))
    })?;
    let digest = first["spec_digest"].clone();
    if let Some((p, _)) = found.iter().find(|(_, m)| m["spec_digest"] != digest) {
        return Err(SweepError::Directory(format!(
            "{} comes from a different spec than the other manifests; refusing to merge",
            p.display()
        )));
    }
    let tables = first["tables"]
        .as_array()
        .map(|a| a.iter().filter_map(|t| t.as_str().and_then(TableKind::from_name)).collect())
        .ok_or_else(|| SweepError::Manifest {
            path: dir.to_path_buf(),
            problem: "manifest lacks its table list".into(),
        })?;
    let layout = Layout { dir: dir.to_path_buf() };
    let report = merge(&layout, &tables)?;
    merge_search_parts(&layout)?;
    let mut m = first.clone();
    m["shard"] = serde_json::Value::Null;
    write_json_atomic(&dir.join("manifest.json"), &m)?;
    for (p, _) in &found {
        if p.parent().is_some_and(|d| d.ends_with("parts")) {
            let _ = std::fs::remove_file(p);
        }
    }
    let _ = std::fs::remove_dir(layout.parts_dir());
    let expected = m["runs"].as_u64().unwrap_or(0) as usize;
    if report.runs < expected {
        let done = completed_runs(&layout)?;
        let missing: Vec<u32> = (0..expected as u32).filter(|id| !done.contains(id)).collect();
        let shards: BTreeSet<String> = found
            .iter()
            .filter_map(|(_, m)| m["shard"]["count"].as_u64())
            .flat_map(|n| missing.iter().map(move |&id| format!("{}/{n}", u64::from(id) % n)))
            .collect();
        let shards = if shards.is_empty() {
            String::new()
        } else {
            format!(" (shards {})", shards.into_iter().collect::<Vec<_>>().join(", "))
        };
        return Err(SweepError::Directory(format!(
            "merged {} of {expected} runs into {}; missing run ids {}{shards}\n  fix: rerun those shards (tasks run with --resume), then merge again",
            report.runs,
            dir.display(),
            id_ranges(&missing)
        )));
    }
    Ok(report)
}

/// `ids` (sorted) as ranges, `0–3, 7, 9–12`, at most 20 of them.
pub fn id_ranges(ids: &[u32]) -> String {
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for &id in ids {
        match ranges.last_mut() {
            Some((_, end)) if *end + 1 == id => *end = id,
            _ => ranges.push((id, id)),
        }
    }
    let shown: Vec<String> =
        ranges.iter().take(20).map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}–{b}") }).collect();
    let more = if ranges.len() > 20 { format!(" and {} more ranges", ranges.len() - 20) } else { String::new() };
    format!("{}{more}", shown.join(", "))
}

/// Progress display: a bar on a terminal, otherwise log lines at most every 2 s.
struct Progress {
    bar: Option<ProgressBar>,
    total: u64,
    /// (runs finished, of which failed, last log line, start).
    state: std::cell::RefCell<(u64, u64, Instant, Instant)>,
}

impl Progress {
    fn new(total: u64, enabled: bool) -> Progress {
        let bar = (enabled && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{bar:40} {pos}/{len} runs  {msg}  elapsed {elapsed}  ETA {eta}")
                    .expect("valid progress template"),
            );
            bar
        });
        Progress {
            bar,
            total: if enabled { total } else { 0 },
            state: std::cell::RefCell::new((0, 0, Instant::now(), Instant::now())),
        }
    }

    fn finished(&self, r: &RunResult) {
        let mut st = self.state.borrow_mut();
        st.0 += 1;
        if let Err(e) = &r.outcome
            && e.is_failure()
        {
            st.1 += 1;
            if self.total > 0 {
                let line = format!("run {} failed: {e}", r.meta.run_id);
                match &self.bar {
                    Some(bar) => bar.println(line),
                    None => eprintln!("{line}"),
                }
            }
        }
        match &self.bar {
            Some(bar) => {
                bar.set_position(st.0);
                bar.set_message(format!("{} failed", st.1));
            }
            None if self.total > 0 && (st.2.elapsed() >= Duration::from_secs(2) || st.0 == self.total) => {
                eprintln!("[{}/{}] runs done, {} failed", st.0, self.total, st.1);
                st.2 = Instant::now();
            }
            None => {}
        }
    }

    /// Shows how far the runs in flight are: on the bar's line, or on a
    /// non-terminal a line every 10 s.
    fn running(&self, todo: &[RunPlan<'_>], watch: &[Watched]) {
        if watch.is_empty() || self.total == 0 {
            return;
        }
        let mut st = self.state.borrow_mut();
        if self.bar.is_none() && st.2.elapsed() < Duration::from_secs(10) {
            return;
        }
        let elapsed = st.3.elapsed().as_secs_f64();
        let parts: Vec<String> =
            todo.iter().zip(watch).filter_map(|(run, w)| w.describe(run.meta.run_id, elapsed)).collect();
        if parts.is_empty() {
            return;
        }
        match &self.bar {
            Some(bar) => bar.set_message(parts.join("; ")),
            None => {
                eprintln!("{}", parts.join("; "));
                st.2 = Instant::now();
            }
        }
    }

    fn done(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}

/// One run in flight, watched: its progress record and what it is going to
/// do (requests, when the stages say; else the simulated time limit).
struct Watched {
    progress: crate::engine::Progress,
    requests: Option<u64>,
    until_secs: Option<f64>,
}

impl Watched {
    fn new(scenario: Option<&crate::config::Scenario>) -> Self {
        Watched {
            progress: Default::default(),
            requests: scenario.and_then(|s| s.expected_requests()).filter(|&n| n > 0),
            until_secs: scenario.and_then(|s| s.time_limit).map(|t| t.as_secs_f64()),
        }
    }

    /// `run 3: 41,000 of 100,000 requests (41 %), 820 s simulated, ETA 2m10s`
    /// (`None` before the run starts). The fraction done is that of the
    /// requests, else that of the simulated time limit; the ETA assumes
    /// the rest goes as fast as what is done (`elapsed` wall seconds).
    fn describe(&self, run_id: u32, elapsed: f64) -> Option<String> {
        use std::sync::atomic::Ordering::Relaxed;
        let sim_ns = self.progress.sim_ns.load(Relaxed);
        if sim_ns == 0 {
            return None;
        }
        let (done, sim) = (self.progress.done.load(Relaxed), sim_ns as f64 / 1e9);
        let (what, fraction) = match (self.requests, self.until_secs) {
            (Some(n), _) => (format!("{done} of {n} requests"), done as f64 / n as f64),
            (None, Some(t)) => (format!("{done} requests, {sim:.0} of {t:.0} s simulated"), sim / t),
            (None, None) => return Some(format!("run {run_id}: {done} requests, {sim:.0} s simulated")),
        };
        let fraction = fraction.min(1.0);
        let eta = if fraction > 0.0 && fraction < 1.0 {
            format!(", ETA {}", clock(elapsed * (1.0 - fraction) / fraction))
        } else {
            String::new()
        };
        let sim = if self.requests.is_some() { format!(", {sim:.0} s simulated") } else { String::new() };
        Some(format!("run {run_id}: {what} ({:.0} %){sim}{eta}", 100.0 * fraction))
    }
}

/// Seconds as `1h02m`, `3m05s` or `12s`.
fn clock(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, _) => format!("{h}h{m:02}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_parse_and_partition_runs() {
        assert_eq!(Shard::parse("1/3"), Ok(Shard { index: 1, count: 3 }));
        assert!(Shard::parse("3/3").is_err());
        assert!(Shard::parse("x").is_err());
        let shards: Vec<Shard> = (0..3).map(|i| Shard { index: i, count: 3 }).collect();
        for id in 0..30 {
            assert_eq!(shards.iter().filter(|s| s.contains(id)).count(), 1);
        }
    }

    #[test]
    fn a_watched_run_says_how_far_it_is() {
        use std::sync::atomic::Ordering::Relaxed;
        let w = Watched { progress: Default::default(), requests: Some(1000), until_secs: None };
        assert_eq!(w.describe(3, 10.0), None, "nothing before the run starts");
        w.progress.sim_ns.store(50_000_000_000, Relaxed);
        w.progress.done.store(250, Relaxed);
        // A quarter done in 10 s: 30 s to go.
        assert_eq!(w.describe(3, 10.0).unwrap(), "run 3: 250 of 1000 requests (25 %), 50 s simulated, ETA 30s");
        let w = Watched { requests: None, until_secs: Some(200.0), ..w };
        assert_eq!(w.describe(4, 10.0).unwrap(), "run 4: 250 requests, 50 of 200 s simulated (25 %), ETA 30s");
    }

    #[test]
    fn clock_times_are_short() {
        assert_eq!((clock(12.4), clock(185.0), clock(3725.0)), ("12s".into(), "3m05s".into(), "1h02m".into()));
    }

    #[test]
    fn missing_ids_are_shown_as_ranges() {
        assert_eq!(id_ranges(&[0, 1, 2, 3, 7, 9, 10, 11, 12]), "0–3, 7, 9–12");
        assert_eq!(id_ranges(&[5]), "5");
        let many: Vec<u32> = (0..50).map(|i| i * 2).collect();
        assert!(id_ranges(&many).ends_with("38 and 30 more ranges"), "{}", id_ranges(&many));
    }

    #[test]
    fn threads_never_outnumber_the_runs_to_do() {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        assert_eq!(threads_for(Some(1000), 1), 1);
        assert_eq!(threads_for(Some(100_000), 3), 3);
        assert_eq!(threads_for(Some(100_000), 1_000_000), MAX_THREADS_PER_CORE * cores);
        assert_eq!(threads_for(Some(2), 10), 2);
        assert_eq!(threads_for(None, 10_000), cores);
        assert_eq!(threads_for(Some(0), 10_000), cores);
        assert_eq!(threads_for(None, 0), 1);
    }

    #[test]
    fn a_panic_becomes_a_failed_outcome_with_its_message() {
        let r: Result<(), Panic> = isolate(|| panic!("broken invariant 42"));
        assert_eq!(r.unwrap_err().to_string(), "panic: broken invariant 42");
        assert_eq!(isolate(|| 7), Ok(7));
    }
}
