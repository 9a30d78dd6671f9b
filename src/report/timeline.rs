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
//! at most `max_steps` steps (the earliest), the cut said in its metadata;
//! and so is the memory it takes to make it (it streams).

use super::ReportError;
use crate::metrics::rows::col;
use crate::output::f64_column;
use arrow_array::cast::AsArray;
use arrow_array::types::UInt32Type;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::statistics::Statistics;
use serde_json::{Value, json};
use std::collections::BTreeSet;
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
struct Step<'a> {
    worker: u32,
    start_s: f64,
    duration_s: f64,
    kind: &'a str,
    /// The step's nonzero numbers among [`ARGS`].
    numbers: Vec<(&'static str, f64)>,
}

/// Columns copied into each step event's `args` when not zero (those
/// present: tables written before a column existed lack it).
const ARGS: [&str; 12] = col::STEP_NUMBERS;

/// Rows read at a time.
const BATCH_ROWS: usize = 8192;

fn input(path: &Path, what: impl std::fmt::Display) -> ReportError {
    ReportError::Input(format!("{}: {what}", path.display()))
}

/// The smallest and largest run id of each row group of `meta` (from the
/// column statistics the final tables carry; `None` where a group has none).
fn run_ranges(meta: &ParquetMetaData, column: usize) -> Vec<Option<(u32, u32)>> {
    meta.row_groups()
        .iter()
        .map(|g| match g.column(column).statistics() {
            Some(Statistics::Int32(s)) => Some((*s.min_opt()? as u32, *s.max_opt()? as u32)),
            _ => None,
        })
        .collect()
}

/// A reader of `columns` of `path`'s row groups `groups`.
fn reader(
    path: &Path,
    columns: &[usize],
    groups: Vec<usize>,
) -> Result<parquet::arrow::arrow_reader::ParquetRecordBatchReader, ReportError> {
    let file = std::fs::File::open(path).map_err(|e| input(path, format!("cannot open: {e}")))?;
    let b =
        ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| input(path, format!("not a Parquet file: {e}")))?;
    let mask = ProjectionMask::roots(b.parquet_schema(), columns.iter().copied());
    b.with_projection(mask)
        .with_row_groups(groups)
        .with_batch_size(BATCH_ROWS)
        .build()
        .map_err(|e| input(path, format!("cannot read: {e}")))
}

/// Microseconds of simulated time (the format's unit), to the nanosecond.
fn us(s: f64) -> f64 {
    (s * 1e9).round() / 1e3
}

/// Writes trace events as the elements of a JSON array, counting them.
struct Events<W: Write> {
    w: W,
    count: usize,
}

impl<W: Write> Events<W> {
    fn push(&mut self, e: &Value) -> std::io::Result<()> {
        if self.count > 0 {
            self.w.write_all(b",")?;
        }
        self.count += 1;
        serde_json::to_writer(&mut self.w, e).map_err(std::io::Error::other)
    }

    /// The metadata events of worker `w`'s process.
    fn worker(&mut self, w: u32, run_id: u32) -> std::io::Result<()> {
        let pid = w + 1;
        self.push(&json!({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
            "args": {"name": format!("worker {w} (run {run_id})")}}))?;
        self.push(&json!({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": w}}))?;
        self.push(&json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": 1, "args": {"name": "steps"}}))?;
        self.push(&json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": 2, "args": {"name": "KV"}}))
    }

    /// The events of one step.
    fn step(&mut self, s: &Step<'_>) -> std::io::Result<()> {
        let (pid, ts, end) = (s.worker + 1, us(s.start_s), us(s.start_s + s.duration_s));
        let get = |c: &str| s.numbers.iter().find(|(n, _)| *n == c).map_or(0.0, |(_, v)| *v);
        let args: serde_json::Map<String, Value> =
            s.numbers.iter().map(|(c, v)| ((*c).to_string(), json!(v))).collect();
        self.push(&json!({"name": s.kind, "ph": "X", "ts": ts, "dur": end - ts, "pid": pid, "tid": 1, "args": args}))?;
        self.push(&json!({"name": "batch", "ph": "C", "ts": ts, "pid": pid,
            "args": {col::DECODES: get(col::DECODES), col::PREFILL_TOKENS: get(col::PREFILL_TOKENS)}}))?;
        let preempted = get(col::PREEMPTED);
        if preempted > 0.0 {
            self.push(&json!({"name": "preempt", "cat": "scheduler", "ph": "i", "s": "t", "ts": ts,
                "pid": pid, "tid": 1, "args": {"requests": preempted}}))?;
        }
        let loads = get(col::KV_LOADS);
        if loads > 0.0 {
            self.push(&json!({"name": "KV load", "cat": "kv", "ph": "i", "s": "t", "ts": ts, "pid": pid, "tid": 2,
                "args": {"loads": loads, "tokens": get(col::KV_LOAD_TOKENS)}}))?;
        }
        let saved = get(col::KV_SAVED_TOKENS);
        if saved > 0.0 {
            self.push(&json!({"name": "KV save", "cat": "kv", "ph": "i", "s": "t", "ts": end, "pid": pid, "tid": 2,
                "args": {"tokens": saved}}))?;
        }
        Ok(())
    }
}

/// Writes run `run`'s steps (the first run when `None`) from results
/// directory `dir` as trace-event JSON to `out` (default
/// `<dir>/timeline-run<N>.json`): at most `max_steps` steps, the earliest.
/// It streams: only the row groups that may hold the run are read (by
/// their run-id statistics), a batch of 8,192 rows at a time, and the
/// events are written as they are made — memory stays within a few
/// megabytes whatever the table's size or `max_steps`.
pub fn write_timeline(
    dir: &Path,
    run: Option<u32>,
    out: Option<&Path>,
    max_steps: usize,
) -> Result<TimelineSummary, ReportError> {
    let path = dir.join("steps.parquet");
    if !path.exists() {
        return Err(ReportError::Input(format!(
            "{}: no steps table\n  fix: add \"steps\" to the spec's [sweep] tables (e.g. tables = [\"runs\", \"steps\"]) and run it again",
            path.display()
        )));
    }
    let file = std::fs::File::open(&path).map_err(|e| input(&path, format!("cannot open: {e}")))?;
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| input(&path, format!("not a Parquet file: {e}")))?;
    let schema = builder.schema().clone();
    let index = |c: &str| schema.index_of(c).ok();
    let missing = |c: &str| input(&path, format!("has no `{c}` column — was it written by opal-sweep?"));
    let run_col = index(col::RUN_ID).ok_or_else(|| missing(col::RUN_ID))?;
    let mut columns = vec![run_col];
    for c in [col::WORKER, col::START_S, col::DURATION_S, col::KIND] {
        columns.push(index(c).ok_or_else(|| missing(c))?);
    }
    columns.extend(ARGS.iter().filter_map(|&c| index(c)));
    let ranges = run_ranges(builder.metadata(), run_col);
    let all: Vec<usize> = (0..ranges.len()).collect();
    // Rows are sorted by run id: with none asked, the first row's run.
    let run_id = match run {
        Some(r) => r,
        None => first_run(&path, run_col)?.ok_or_else(|| input(&path, "holds no steps"))?,
    };
    let groups: Vec<usize> =
        all.iter().copied().filter(|&g| ranges[g].is_none_or(|(lo, hi)| (lo..=hi).contains(&run_id))).collect();
    let out_path = out.map_or_else(|| dir.join(format!("timeline-run{run_id}.json")), Path::to_path_buf);
    let mut tmp = out_path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = (|| -> Result<(usize, usize, Option<f64>, usize, usize), ReportError> {
        let io = |e: std::io::Error| ReportError::Output(format!("{}: cannot write: {e}", out_path.display()));
        let file = std::fs::File::create(&tmp).map_err(io)?;
        let mut ev = Events { w: std::io::BufWriter::new(file), count: 0 };
        ev.w.write_all(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[").map_err(io)?;
        let (mut steps, mut total, mut cut_at) = (0, 0, None);
        let mut workers: BTreeSet<u32> = BTreeSet::new();
        for b in reader(&path, &columns, groups)? {
            let b = b.map_err(|e| input(&path, format!("cannot read: {e}")))?;
            let runs = b.column_by_name(col::RUN_ID).and_then(|c| c.as_primitive_opt::<UInt32Type>());
            let runs = runs.ok_or_else(|| missing(col::RUN_ID))?;
            let number = |c: &str| f64_column(&b, c).ok_or_else(|| missing(c));
            let (worker, start, duration) = (number(col::WORKER)?, number(col::START_S)?, number(col::DURATION_S)?);
            let kind =
                b.column_by_name(col::KIND).and_then(|c| c.as_string_opt::<i32>()).ok_or_else(|| missing(col::KIND))?;
            let args: Vec<(&'static str, Vec<Option<f64>>)> =
                ARGS.iter().filter_map(|&c| f64_column(&b, c).map(|v| (c, v))).collect();
            for i in (0..b.num_rows()).filter(|&i| runs.value(i) == run_id) {
                total += 1;
                if steps == max_steps {
                    cut_at.get_or_insert(start[i].unwrap_or(0.0));
                    continue;
                }
                let step = Step {
                    worker: worker[i].unwrap_or(0.0) as u32,
                    start_s: start[i].unwrap_or(0.0),
                    duration_s: duration[i].unwrap_or(0.0),
                    kind: kind.value(i),
                    numbers: args.iter().filter_map(|(c, v)| v[i].filter(|&x| x != 0.0).map(|x| (*c, x))).collect(),
                };
                if workers.insert(step.worker) {
                    ev.worker(step.worker, run_id).map_err(io)?;
                }
                ev.step(&step).map_err(io)?;
                steps += 1;
            }
        }
        if total == 0 {
            return Err(no_run(&path, run_col, run_id));
        }
        if let Some(t) = cut_at {
            ev.push(
                &json!({"name": "timeline cut", "cat": "opal", "ph": "i", "s": "g", "ts": us(t), "pid": 0, "tid": 0,
                "args": {"why": "the step limit (--max-steps) was reached here"}}),
            )
            .map_err(io)?;
        }
        let mut other = serde_json::Map::new();
        other.insert(col::RUN_ID.into(), json!(run_id));
        other.insert("steps".into(), json!(steps));
        other.insert("total_steps".into(), json!(total));
        other.insert("source".into(), json!(path.display().to_string()));
        other.insert("made_by".into(), json!(format!("opal-sweep {}", env!("CARGO_PKG_VERSION"))));
        if let Some(t) = cut_at {
            other.insert("cut_at_s".into(), json!(t));
        }
        ev.w.write_all(b"],\"otherData\":").map_err(io)?;
        serde_json::to_writer(&mut ev.w, &Value::Object(other)).map_err(|e| io(std::io::Error::other(e)))?;
        ev.w.write_all(b"}").map_err(io)?;
        ev.w.flush().map_err(io)?;
        Ok((steps, total, cut_at, workers.len(), ev.count))
    })();
    let (steps, total_steps, _, workers, events) = match written {
        Ok(w) => w,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    std::fs::rename(&tmp, &out_path)
        .map_err(|e| ReportError::Output(format!("{}: cannot write: {e}", out_path.display())))?;
    Ok(TimelineSummary { path: out_path, run_id, steps, total_steps, workers, events })
}

/// The run id of the table's first row.
fn first_run(path: &Path, run_col: usize) -> Result<Option<u32>, ReportError> {
    let mut r = reader(path, &[run_col], vec![0])?;
    match r.next() {
        Some(b) => {
            let b = b.map_err(|e| input(path, format!("cannot read: {e}")))?;
            Ok(b.column(0).as_primitive_opt::<UInt32Type>().and_then(|a| (!a.is_empty()).then(|| a.value(0))))
        }
        None => Ok(None),
    }
}

/// The error for a run the table has no steps of, naming some it has (read
/// from the run-id column alone, a batch at a time).
fn no_run(path: &Path, run_col: usize, run_id: u32) -> ReportError {
    let mut known: BTreeSet<u32> = BTreeSet::new();
    if let Ok(r) = reader(path, &[run_col], (0..row_groups(path)).collect()) {
        for b in r.flatten() {
            if let Some(a) = b.column(0).as_primitive_opt::<UInt32Type>() {
                known.extend(a.values().iter().copied());
            }
            if known.len() > 10 {
                break;
            }
        }
    }
    let shown: Vec<String> = known.iter().take(10).map(u32::to_string).collect();
    input(
        path,
        format!(
            "run {run_id} has no steps\n  fix: pick a run the table holds: {}{}",
            shown.join(", "),
            if known.len() > 10 { ", …" } else { "" }
        ),
    )
}

/// Row groups of the Parquet file at `path` (0 if it cannot be read).
fn row_groups(path: &Path) -> usize {
    std::fs::File::open(path)
        .ok()
        .and_then(|f| ParquetRecordBatchReaderBuilder::try_new(f).ok())
        .map_or(0, |b| b.metadata().num_row_groups())
}
