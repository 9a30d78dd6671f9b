//! `opal-sweep timeline`: one run's scheduler steps as a trace-event JSON
//! file (the Chrome / Perfetto "Trace Event Format": open it at
//! <https://ui.perfetto.dev> or `chrome://tracing`), made from the run's
//! rows of `steps.parquet` alone.
//!
//! Each worker is a process (`pid` = worker + 1) with two tracks: `steps`,
//! one complete event (`ph: "X"`) per scheduler step, named by its kind
//! (`prefill`, `decode`, `mixed`) with its batch composition in `args`, and
//! an instant event where a step's scheduling preempted requests; and `KV`,
//! an instant event where a step started KV loads from the tiers (or a P/D
//! link) and where KV went to the tiers when it ended. A counter per worker
//! (`ph: "C"`) follows the batch: decoding sequences and prompt tokens per
//! step. Timestamps are microseconds of simulated time. The file is bounded:
//! at most `max_steps` steps (the earliest), the cut said in its metadata.

use super::ReportError;
use crate::metrics::rows::col;
use crate::output::{f64_column, read_table};
use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Steps written by default (about 30 MB of JSON).
pub const DEFAULT_MAX_STEPS: usize = 100_000;

/// What [`write_timeline`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct TimelineSummary {
    /// The file.
    pub path: PathBuf,
    /// The run.
    pub run_id: u32,
    /// Steps written, and the run's steps in all.
    pub steps: usize,
    /// See `steps`.
    pub total_steps: usize,
    /// Workers with steps.
    pub workers: usize,
    /// Trace events written.
    pub events: usize,
}

/// One step of the run, as `steps.parquet` has it.
struct Step {
    worker: u32,
    start_s: f64,
    duration_s: f64,
    kind: String,
    numbers: Vec<(&'static str, Option<f64>)>,
}

/// Columns copied into each step event's `args` (those present: tables
/// written before a column existed lack it).
const ARGS: [&str; 12] = [
    "prefill_chunks",
    "prefill_tokens",
    "prefill_cached_tokens",
    "decodes",
    "decode_context_tokens",
    "preempted",
    "kv_loads",
    "kv_load_tokens",
    "kv_saved_tokens",
    "gpu_compute_s",
    "gpu_memory_s",
    "gpu_comm_s",
];

fn input(path: &Path, what: impl std::fmt::Display) -> ReportError {
    ReportError::Input(format!("{}: {what}", path.display()))
}

/// The steps of run `run` (the first run with steps when `None`) in
/// `steps.parquet` of results directory `dir`, in time order; with the run.
fn read_steps(dir: &Path, run: Option<u32>) -> Result<(u32, Vec<Step>), ReportError> {
    let path = dir.join("steps.parquet");
    if !path.exists() {
        return Err(ReportError::Input(format!(
            "{}: no steps table\n  fix: add \"steps\" to the spec's [sweep] tables (e.g. tables = [\"runs\", \"steps\"]) and run it again",
            path.display()
        )));
    }
    let batches = read_table(&path).map_err(|e| ReportError::Input(e.to_string()))?;
    let ids: Vec<u32> = batches
        .iter()
        .flat_map(|b| {
            b.column_by_name(col::RUN_ID)
                .and_then(|c| c.as_primitive_opt::<arrow_array::types::UInt32Type>().map(|a| a.values().to_vec()))
                .unwrap_or_default()
        })
        .collect();
    let run_id = match run {
        Some(r) if ids.contains(&r) => r,
        Some(r) => {
            let mut known: Vec<u32> = ids.clone();
            known.dedup();
            let shown: Vec<String> = known.iter().take(10).map(u32::to_string).collect();
            return Err(input(
                &path,
                format!(
                    "run {r} has no steps\n  fix: pick a run the table holds: {}{}",
                    shown.join(", "),
                    if known.len() > 10 { ", …" } else { "" }
                ),
            ));
        }
        None => *ids.iter().min().ok_or_else(|| input(&path, "holds no steps"))?,
    };
    let mut steps = Vec::new();
    for b in &batches {
        steps.extend(steps_of(b, &path, run_id)?);
    }
    steps.sort_by(|a, b| a.start_s.total_cmp(&b.start_s).then(a.worker.cmp(&b.worker)));
    Ok((run_id, steps))
}

fn steps_of(b: &RecordBatch, path: &Path, run_id: u32) -> Result<Vec<Step>, ReportError> {
    let missing = |c: &str| input(path, format!("has no `{c}` column — was it written by opal-sweep?"));
    let runs = b.column_by_name(col::RUN_ID).ok_or_else(|| missing(col::RUN_ID))?;
    let runs = runs.as_primitive_opt::<arrow_array::types::UInt32Type>().ok_or_else(|| missing(col::RUN_ID))?;
    let number = |c: &str| f64_column(b, c).ok_or_else(|| missing(c));
    let (worker, start, duration) = (number("worker")?, number("start_s")?, number("duration_s")?);
    let kind = b.column_by_name("kind").and_then(|c| c.as_string_opt::<i32>()).ok_or_else(|| missing("kind"))?;
    let args: Vec<(&'static str, Vec<Option<f64>>)> =
        ARGS.iter().filter_map(|&c| f64_column(b, c).map(|v| (c, v))).collect();
    Ok((0..b.num_rows())
        .filter(|&i| runs.value(i) == run_id)
        .map(|i| Step {
            worker: worker[i].unwrap_or(0.0) as u32,
            start_s: start[i].unwrap_or(0.0),
            duration_s: duration[i].unwrap_or(0.0),
            kind: kind.value(i).to_string(),
            numbers: args.iter().map(|(c, v)| (*c, v[i])).collect(),
        })
        .collect())
}

/// Microseconds of simulated time (the format's unit), to the nanosecond.
fn us(s: f64) -> f64 {
    (s * 1e9).round() / 1e3
}

/// The trace events of `steps` (already cut to the bound).
fn events(run_id: u32, steps: &[Step], cut_at: Option<f64>) -> Vec<Value> {
    let mut workers: Vec<u32> = steps.iter().map(|s| s.worker).collect();
    workers.sort_unstable();
    workers.dedup();
    let mut out = Vec::with_capacity(steps.len() * 2 + 3 * workers.len());
    for &w in &workers {
        let pid = w + 1;
        out.push(json!({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
            "args": {"name": format!("worker {w} (run {run_id})")}}));
        out.push(json!({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": w}}));
        out.push(json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": 1, "args": {"name": "steps"}}));
        out.push(json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": 2, "args": {"name": "KV"}}));
    }
    let get = |s: &Step, c: &str| s.numbers.iter().find(|(n, _)| *n == c).and_then(|(_, v)| *v).unwrap_or(0.0);
    for s in steps {
        let (pid, ts, end) = (s.worker + 1, us(s.start_s), us(s.start_s + s.duration_s));
        let mut args = serde_json::Map::new();
        for (c, v) in &s.numbers {
            if let Some(v) = v {
                args.insert((*c).to_string(), json!(v));
            }
        }
        out.push(json!({"name": s.kind, "cat": "step", "ph": "X", "ts": ts, "dur": end - ts,
            "pid": pid, "tid": 1, "args": args}));
        out.push(json!({"name": "batch", "ph": "C", "ts": ts, "pid": pid,
            "args": {"decodes": get(s, "decodes"), "prefill_tokens": get(s, "prefill_tokens")}}));
        let preempted = get(s, "preempted");
        if preempted > 0.0 {
            out.push(json!({"name": "preempt", "cat": "scheduler", "ph": "i", "s": "t", "ts": ts,
                "pid": pid, "tid": 1, "args": {"requests": preempted}}));
        }
        let loads = get(s, "kv_loads");
        if loads > 0.0 {
            out.push(json!({"name": "KV load", "cat": "kv", "ph": "i", "s": "t", "ts": ts, "pid": pid, "tid": 2,
                "args": {"loads": loads, "tokens": get(s, "kv_load_tokens")}}));
        }
        let saved = get(s, "kv_saved_tokens");
        if saved > 0.0 {
            out.push(json!({"name": "KV save", "cat": "kv", "ph": "i", "s": "t", "ts": end, "pid": pid, "tid": 2,
                "args": {"tokens": saved}}));
        }
    }
    if let Some(t) = cut_at {
        out.push(json!({"name": "timeline cut", "cat": "opal", "ph": "i", "s": "g", "ts": us(t), "pid": 0, "tid": 0,
            "args": {"why": "the step limit (--max-steps) was reached here"}}));
    }
    out
}

/// Writes run `run`'s steps (the first run when `None`) from results
/// directory `dir` as trace-event JSON to `out` (default
/// `<dir>/timeline-run<N>.json`): at most `max_steps` steps, the earliest.
pub fn write_timeline(
    dir: &Path,
    run: Option<u32>,
    out: Option<&Path>,
    max_steps: usize,
) -> Result<TimelineSummary, ReportError> {
    let (run_id, mut steps) = read_steps(dir, run)?;
    let total_steps = steps.len();
    let cut_at = (steps.len() > max_steps).then(|| steps[max_steps].start_s);
    steps.truncate(max_steps);
    let events = events(run_id, &steps, cut_at);
    let path = out.map_or_else(|| dir.join(format!("timeline-run{run_id}.json")), Path::to_path_buf);
    let mut other = serde_json::Map::new();
    other.insert("run_id".into(), json!(run_id));
    other.insert("steps".into(), json!(steps.len()));
    other.insert("total_steps".into(), json!(total_steps));
    other.insert("source".into(), json!(dir.join("steps.parquet").display().to_string()));
    other.insert("made_by".into(), json!(format!("opal-sweep {}", env!("CARGO_PKG_VERSION"))));
    if let Some(t) = cut_at {
        other.insert("cut_at_s".into(), json!(t));
    }
    let doc = json!({"displayTimeUnit": "ms", "otherData": other, "traceEvents": events});
    let write = || -> std::io::Result<()> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".tmp-{}", std::process::id()));
        let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        serde_json::to_writer(&mut w, &doc)?;
        w.flush()?;
        drop(w);
        std::fs::rename(&tmp, &path)
    };
    write().map_err(|e| ReportError::Output(format!("{}: cannot write: {e}", path.display())))?;
    let workers = {
        let mut w: Vec<u32> = steps.iter().map(|s| s.worker).collect();
        w.sort_unstable();
        w.dedup();
        w.len()
    };
    Ok(TimelineSummary { path, run_id, steps: steps.len(), total_steps, workers, events: events.len() })
}
