//! Reads a sweep's result directory back for the report: the manifest, the
//! runs table and the tables the figures need, grouped by grid point. Only
//! the Parquet tables and the manifest are used, so a report can be made on
//! any machine the results were copied to.

use super::ReportError;
use crate::metrics::rows::col;
use crate::output::{AxisValue, TableKind, deserialize_hdr, f64_column, read_table};
use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use hdrhistogram::Histogram;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A grid axis as the report shows it. Columns that always change together
/// (a `[[zip]]` group) form one axis.
#[derive(Clone, Debug)]
pub struct Axis {
    /// Dotted path(s), as in the spec and the runs table's column names (" / " between zipped ones).
    pub path: String,
    /// Short name for labels (the path's last component, or more if that is ambiguous).
    pub label: String,
    /// True when the (first) column is an integer or float.
    pub numeric: bool,
    /// The axis's values as shown, in order: numerically for numeric axes,
    /// else by first appearance.
    pub values: Vec<String>,
    /// For a numeric axis, the number of each value (NaN otherwise).
    pub numbers: Vec<f64>,
}

impl Axis {
    /// The axis's label with its unit, for an axis description
    /// (`request_rate (req/s)`); the label alone when the unit is unknown
    /// or the axis is not numeric.
    pub fn desc(&self) -> String {
        let last = self.path.split(" / ").next().unwrap_or_default().rsplit('.').next().unwrap_or_default();
        match unit_of(last).filter(|_| self.numeric) {
            Some(u) => format!("{} ({u})", self.label),
            None => self.label.clone(),
        }
    }
}

/// The unit of a scenario key, by its last component.
fn unit_of(key: &str) -> Option<&'static str> {
    Some(match key {
        "request_rate" => "req/s",
        "num_workers" | "max_workers" | "count" => "workers",
        "tp" => "GPUs per worker",
        "capacity_GB" | "memory_gb" => "GiB",
        "bandwidth_GBps" | "link_bandwidth_GBps" | "client_bandwidth_GBps" | "link_GBps" => "GB/s",
        "mem_bw_TBps" => "TB/s",
        "latency_nsec" => "ns",
        "link_latency_usec" => "µs",
        "tflops" | "tflops_fp8" => "TFLOP/s",
        "chunk_size"
        | "block_size"
        | "max_num_batched_tokens"
        | "max_model_len"
        | "default_prefix_length"
        | "prompt_size"
        | "prompt_size_min"
        | "prompt_size_max"
        | "output_tokens"
        | "output_tokens_min"
        | "output_tokens_max"
        | "max_local_prefill_length" => "tokens",
        "max_num_seqs" => "sequences",
        "total_requests" | "max_outstanding_requests" | "max_prefill_queue_size" => "requests",
        "periodic_infra_update_time"
        | "periodic_infra_update_collection_time"
        | "kvcevent_coalesce_time"
        | "event_batch_time"
        | "scale_latency"
        | "simulation_time"
        | "time_duration_sec"
        | "gap_sec" => "s",
        "usd_per_gpu_hour" => "$ per GPU-hour",
        "usd_per_gb_hour" => "$ per GiB-hour",
        "max_watts" | "idle_watts" | "active_watts" => "W",
        "gpu_memory_utilization" => "fraction",
        _ => return None,
    })
}

/// One run's numbers from the runs table (every numeric column, by name).
#[derive(Clone, Debug)]
pub struct RunRow {
    /// Run id.
    pub run_id: u32,
    /// Replicate.
    pub replicate: u32,
    /// Numeric summary columns by name (nulls left out).
    pub metrics: BTreeMap<String, f64>,
    /// Its queue kept growing (`stability` = `unstable`; tables older than the column: false).
    pub unstable: bool,
    /// It reached a steady state (`stability` = `stable`; tables older than the column: true).
    pub stable: bool,
}

/// A grid point: its axis values and its successful runs.
#[derive(Clone, Debug)]
pub struct Point {
    /// Point id.
    pub id: u32,
    /// Index of the point's value in each axis's `values`, in axis order.
    pub at: Vec<usize>,
    /// Successful runs (replicates), by replicate.
    pub runs: Vec<RunRow>,
    /// Runs of this point in the table, successful or not.
    pub total_runs: usize,
}

impl Point {
    /// The values of `metric` over the successful replicates.
    pub fn samples(&self, metric: &str) -> Vec<f64> {
        self.runs.iter().filter_map(|r| r.metrics.get(metric).copied()).filter(|v| v.is_finite()).collect()
    }
}

/// A failed run, as the runs table records it.
#[derive(Clone, Debug)]
pub struct FailedRun {
    /// Run id.
    pub run_id: u32,
    /// Grid point.
    pub point_id: u32,
    /// Replicate.
    pub replicate: u32,
    /// Why it failed.
    pub error: String,
}

/// One interval of a run's time series.
#[derive(Clone, Copy, Debug, Default)]
pub struct Interval {
    /// Interval start, simulated seconds.
    pub start_s: f64,
    /// Requests completed in the interval.
    pub requests_completed: f64,
    /// Prompt tokens computed (prefill work) in the interval.
    pub prompt_tokens: f64,
    /// Output tokens generated in the interval.
    pub generated_tokens: f64,
    /// Requests waiting at the interval's end.
    pub queue_depth: f64,
    /// Active workers at the interval's end.
    pub active_workers: f64,
    /// Mean fraction of the interval the GPUs were busy.
    pub gpu_busy_fraction: f64,
    /// Share of the GPUs' peak compute the interval's steps used.
    pub gpu_compute_fraction: f64,
    /// Share of their peak HBM bandwidth.
    pub gpu_hbm_fraction: f64,
}

/// One workload stage of one run (from the stages table).
#[derive(Clone, Debug)]
pub struct StageRun {
    /// Stage index.
    pub stage: u32,
    /// Its type.
    pub kind: String,
    /// Numeric columns by name (nulls left out).
    pub metrics: BTreeMap<String, f64>,
}

/// The latency distributions the report draws as CDFs (histograms-table metric names).
pub const CDF_METRICS: [&str; 3] = ["ttft", "e2e", "queue_wait"];

/// One prompt size of an SC25 stage in one run.
#[derive(Clone, Copy, Debug)]
pub struct Sc25Size {
    /// Prompt tokens.
    pub prompt_tokens: f64,
    /// Cold-pass TTFT, ms.
    pub cold_ttft_ms: Option<f64>,
    /// Warm-pass TTFT, ms.
    pub warm_ttft_ms: Option<f64>,
}

/// Everything the report draws, read from a results directory.
#[derive(Debug)]
pub struct SweepData {
    /// The results directory.
    pub dir: PathBuf,
    /// Sweep name.
    pub name: String,
    /// The spec the sweep ran from.
    pub spec_file: String,
    /// Replicates per point.
    pub replicates: u32,
    /// Seed of replicate 0.
    pub base_seed: u64,
    /// Grid axes, in the spec's order.
    pub axes: Vec<Axis>,
    /// Grid points with at least one run in the table, by id.
    pub points: Vec<Point>,
    /// Failed runs (left out of every figure).
    pub failed: Vec<FailedRun>,
    /// Merged histograms (µs) of each of [`CDF_METRICS`] per point id, when
    /// the histograms table was written.
    pub latency: Option<BTreeMap<&'static str, BTreeMap<u32, Histogram<u64>>>>,
    /// Time series per run id, when the timeseries table was written.
    pub series: Option<BTreeMap<u32, Vec<Interval>>>,
    /// SC25 rows per run id, when the sc25 table was written.
    pub sc25: Option<BTreeMap<u32, Vec<Sc25Size>>>,
    /// Stage rows per run id, when the stages table was written.
    pub stages: Option<BTreeMap<u32, Vec<StageRun>>>,
    /// For a search: the SLO (the searched parameter is the last axis).
    pub search: Option<Vec<crate::stats::Constraint>>,
    /// For a search: it minimises.
    pub search_min: bool,
    /// For a Pareto search: its evaluated points (`pareto.parquet`).
    pub pareto: Option<ParetoData>,
    /// For a capacity search: its answers (`search.parquet`).
    pub answers: Option<Answers>,
}

/// A capacity search's answers, one row per grid point, as `search.parquet`
/// has them: every column.
#[derive(Clone, Debug, Default)]
pub struct Answers {
    /// Column names.
    pub columns: Vec<String>,
    /// Cells, row by row (`None`: null).
    pub rows: Vec<Vec<Option<AnswerCell>>>,
}

/// One cell of [`Answers`].
#[derive(Clone, Debug, PartialEq)]
pub enum AnswerCell {
    /// A text column's value.
    Text(String),
    /// A numeric column's value.
    Number(f64),
}

/// `search.parquet` of a capacity search's directory (`None` for anything else).
fn read_answers(dir: &Path) -> Result<Option<Answers>, ReportError> {
    let path = dir.join("search.parquet");
    if !path.exists() {
        return Ok(None);
    }
    let Some(b) = table(&path)? else { return Ok(Some(Answers::default())) };
    let columns: Vec<String> = b.schema().fields().iter().map(|f| f.name().clone()).collect();
    let cells: Vec<Vec<Option<AnswerCell>>> = columns
        .iter()
        .map(|name| {
            if column(&b, &path, name)?.as_string_opt::<i32>().is_some() {
                return Ok(strings(&b, &path, name)?.into_iter().map(|v| v.map(AnswerCell::Text)).collect());
            }
            let v = f64_column(&b, name)
                .ok_or_else(|| rerr(&path, format!("column `{name}` is neither text nor a number")))?;
            Ok(v.into_iter().map(|x| x.map(AnswerCell::Number)).collect())
        })
        .collect::<Result<_, ReportError>>()?;
    let rows = (0..b.num_rows()).map(|i| cells.iter().map(|c| c[i].clone()).collect()).collect();
    Ok(Some(Answers { columns, rows }))
}

/// What a Pareto search evaluated, for figure 10.
#[derive(Clone, Debug, Default)]
pub struct ParetoData {
    /// The first two objectives: (column, minimised).
    pub objectives: Vec<(String, bool)>,
    /// Per evaluated point: the two objectives' means (None if missing), feasible, on the frontier.
    pub points: Vec<(Option<f64>, Option<f64>, bool, bool)>,
}

/// `pareto.parquet` of a Pareto search's directory (`None` for anything else).
fn pareto_data(dir: &Path, manifest: &serde_json::Value) -> Result<Option<ParetoData>, ReportError> {
    let Some(search) = manifest.get("search").filter(|s| s.get("kind").and_then(|k| k.as_str()) == Some("pareto"))
    else {
        return Ok(None);
    };
    let objectives: Vec<(String, bool)> = search
        .get("objectives")
        .and_then(|o| o.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|o| Some((o.get("metric")?.as_str()?.to_string(), o.get("minimize")?.as_bool()?)))
                .take(2)
                .collect()
        })
        .unwrap_or_default();
    let path = dir.join("pareto.parquet");
    let Some(batch) = table(&path)? else { return Ok(Some(ParetoData { objectives, points: Vec::new() })) };
    if objectives.len() < 2 {
        return Err(rerr(&path, "the manifest names fewer than two objectives"));
    }
    let flag = |name: &str| -> Result<Vec<bool>, ReportError> {
        let col = column(&batch, &path, name)?;
        let b = col.as_boolean_opt().ok_or_else(|| rerr(&path, format!("column `{name}` is not boolean")))?;
        Ok((0..b.len()).map(|i| !b.is_null(i) && b.value(i)).collect())
    };
    let (x, y) = (numbers(&batch, &path, &objectives[0].0)?, numbers(&batch, &path, &objectives[1].0)?);
    let (feasible, frontier) = (flag("feasible")?, flag("on_frontier")?);
    let points = (0..batch.num_rows()).map(|i| (x[i], y[i], feasible[i], frontier[i])).collect();
    Ok(Some(ParetoData { objectives, points }))
}

fn rerr(path: &Path, msg: impl std::fmt::Display) -> ReportError {
    ReportError::Input(format!("{}: {msg}", path.display()))
}

/// Reads `name` into one batch (empty tables give `None`).
fn table(path: &Path) -> Result<Option<RecordBatch>, ReportError> {
    let batches = read_table(path).map_err(|e| ReportError::Input(e.to_string()))?;
    let Some(first) = batches.first() else { return Ok(None) };
    let batch = arrow_select::concat::concat_batches(&first.schema(), &batches).map_err(|e| rerr(path, e))?;
    Ok((batch.num_rows() > 0).then_some(batch))
}

fn column<'a>(batch: &'a RecordBatch, path: &Path, name: &str) -> Result<&'a arrow_array::ArrayRef, ReportError> {
    batch.column_by_name(name).ok_or_else(|| {
        rerr(path, format!("has no `{name}` column — was it written by opal-sweep (this version or newer)?"))
    })
}

fn numbers(batch: &RecordBatch, path: &Path, name: &str) -> Result<Vec<Option<f64>>, ReportError> {
    let col = column(batch, path, name)?;
    let t = col.data_type();
    match f64_column(batch, name) {
        Some(v) if t.is_numeric() => Ok(v),
        _ => Err(rerr(path, format!("column `{name}` is {t}, not a number"))),
    }
}

fn ids(batch: &RecordBatch, path: &Path, name: &str) -> Result<Vec<u32>, ReportError> {
    let col = column(batch, path, name)?;
    let ids = col
        .as_primitive_opt::<arrow_array::types::UInt32Type>()
        .ok_or_else(|| rerr(path, format!("column `{name}` is not u32")))?;
    Ok(ids.values().to_vec())
}

fn strings(batch: &RecordBatch, path: &Path, name: &str) -> Result<Vec<Option<String>>, ReportError> {
    let col = column(batch, path, name)?;
    let s = col.as_string_opt::<i32>().ok_or_else(|| rerr(path, format!("column `{name}` is not a string")))?;
    Ok((0..s.len()).map(|i| (!s.is_null(i)).then(|| s.value(i).to_string())).collect())
}

/// Short labels for dotted paths: the last component, or as many trailing
/// components as make the labels distinct.
pub(crate) fn short_labels(paths: &[String]) -> Vec<String> {
    // A tier's or a P/D pool's key keeps its section: `capacity_GB` alone
    // does not say which tier.
    let sectioned = |p: &str| {
        ["kvc.CPUMemory.", "kvc.LocalNVMe.", "kvc.DistributedFS.", "disaggregation.prefill.", "disaggregation.decode."]
            .iter()
            .any(|s| p.starts_with(s))
    };
    let tail = |p: &str, n: usize| -> String {
        let parts: Vec<&str> = p.split('.').collect();
        let n = if sectioned(p) { n.max(2) } else { n };
        parts[parts.len().saturating_sub(n)..].join(".")
    };
    let mut n = 1;
    loop {
        let labels: Vec<String> = paths.iter().map(|p| tail(p, n)).collect();
        let distinct: BTreeSet<&String> = labels.iter().collect();
        if distinct.len() == labels.len() || n > 8 {
            return labels;
        }
        n += 1;
    }
}

fn axis_values(batch: &RecordBatch, path: &Path, name: &str) -> Result<(bool, Vec<AxisValue>), ReportError> {
    let col = column(batch, path, name)?;
    let n = batch.num_rows();
    let values = match col.data_type() {
        DataType::Int64 => {
            let a = col.as_primitive::<arrow_array::types::Int64Type>();
            (true, (0..n).map(|i| AxisValue::Int(a.value(i))).collect())
        }
        DataType::Float64 => {
            let a = col.as_primitive::<arrow_array::types::Float64Type>();
            (true, (0..n).map(|i| AxisValue::Float(a.value(i))).collect())
        }
        DataType::Boolean => {
            let a = col.as_boolean();
            (false, (0..n).map(|i| AxisValue::Bool(a.value(i))).collect())
        }
        DataType::Utf8 => {
            let a = col.as_string::<i32>();
            (false, (0..n).map(|i| AxisValue::Str(a.value(i).to_string())).collect())
        }
        other => return Err(rerr(path, format!("axis column `{name}` has an unexpected type {other}"))),
    };
    Ok(values)
}

impl SweepData {
    /// Reads the results directory `dir`. The manifest and the runs table
    /// must exist; the other tables are read when the manifest lists them
    /// (and then they must exist too).
    pub fn load(dir: &Path) -> Result<SweepData, ReportError> {
        let manifest_path = dir.join("manifest.json");
        let text = std::fs::read_to_string(&manifest_path).map_err(|e| {
            let hint = if dir.join("parts").is_dir() {
                " — the sweep was sharded and not merged yet: run `opal-sweep merge` on it first"
            } else {
                " — is this a sweep's results directory?"
            };
            rerr(&manifest_path, format!("cannot read: {e}{hint}"))
        })?;
        let manifest: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| rerr(&manifest_path, format!("not a valid manifest: {e}")))?;
        let get_str = |k: &str| manifest.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
        let tables: BTreeSet<String> = manifest
            .get("tables")
            .and_then(|t| t.as_array())
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        let axis_paths: Vec<String> = manifest
            .get("axes")
            .and_then(|t| t.as_array())
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            .unwrap_or_default();

        let runs_path = dir.join(TableKind::Runs.file_name());
        if !runs_path.exists() {
            let hint = if dir.join("parts").is_dir() {
                "; its part files are in parts/ — run `opal-sweep merge` first"
            } else {
                ""
            };
            return Err(rerr(&runs_path, format!("missing: the runs table is required{hint}")));
        }
        let runs = table(&runs_path)?.ok_or_else(|| rerr(&runs_path, "has no rows: the sweep ran nothing"))?;
        let run_ids = ids(&runs, &runs_path, col::RUN_ID)?;
        let point_ids = ids(&runs, &runs_path, col::POINT_ID)?;
        let replicates = ids(&runs, &runs_path, col::REPLICATE)?;
        let status = strings(&runs, &runs_path, col::STATUS)?;
        let errors = strings(&runs, &runs_path, col::ERROR)?;
        let stability = strings(&runs, &runs_path, col::STABILITY).ok();
        let mut columns = Vec::new();
        for p in &axis_paths {
            columns.push(axis_values(&runs, &runs_path, p)?);
        }
        let (axes, point_at) = group_axes(runs.num_rows(), &axis_paths, &columns);
        let mut metric_cols = Vec::new();
        for f in runs.schema().fields() {
            let name = f.name();
            if f.data_type().is_numeric()
                && !axis_paths.contains(name)
                && ![col::RUN_ID, col::POINT_ID].contains(&&**name)
            {
                metric_cols.push((name.clone(), numbers(&runs, &runs_path, name)?));
            }
        }

        let mut points: BTreeMap<u32, Point> = BTreeMap::new();
        let mut failed = Vec::new();
        let mut point_of_run = BTreeMap::new();
        for i in 0..runs.num_rows() {
            let point = points.entry(point_ids[i]).or_insert_with(|| Point {
                id: point_ids[i],
                at: point_at[i].clone(),
                runs: Vec::new(),
                total_runs: 0,
            });
            point.total_runs += 1;
            if status[i].as_deref() == Some("ok") {
                let metrics = metric_cols.iter().filter_map(|(n, c)| c[i].map(|v| (n.clone(), v))).collect();
                let verdict = stability.as_ref().map(|s| s[i].as_deref());
                let unstable = verdict.is_some_and(|v| v == Some("unstable"));
                let stable = verdict.is_none_or(|v| v == Some("stable"));
                point.runs.push(RunRow { run_id: run_ids[i], replicate: replicates[i], metrics, unstable, stable });
                point_of_run.insert(run_ids[i], point_ids[i]);
            } else {
                failed.push(FailedRun {
                    run_id: run_ids[i],
                    point_id: point_ids[i],
                    replicate: replicates[i],
                    error: errors[i].clone().unwrap_or_default(),
                });
            }
        }
        for p in points.values_mut() {
            p.runs.sort_by_key(|r| r.replicate);
        }

        let wanted =
            |kind: TableKind| -> Option<PathBuf> { tables.contains(kind.name()).then(|| dir.join(kind.file_name())) };
        let latency = wanted(TableKind::Histograms).map(|p| read_histograms(&p, &point_of_run)).transpose()?;
        let series = wanted(TableKind::Timeseries).map(|p| read_series(&p, &point_of_run)).transpose()?;
        let sc25 = wanted(TableKind::Sc25).map(|p| read_sc25(&p, &point_of_run)).transpose()?;
        let stages = wanted(TableKind::Stages).map(|p| read_stages(&p, &point_of_run)).transpose()?;
        Ok(SweepData {
            dir: dir.to_path_buf(),
            name: get_str("name"),
            spec_file: get_str("spec_file"),
            replicates: manifest.get("replicates").and_then(|v| v.as_u64()).unwrap_or(1) as u32,
            base_seed: manifest.get("base_seed").and_then(|v| v.as_u64()).unwrap_or(0),
            axes,
            points: points.into_values().collect(),
            failed,
            latency,
            series,
            sc25,
            stages,
            search_min: manifest.get("search").and_then(|s| s.get("maximize")).and_then(|v| v.as_bool()) == Some(false),
            pareto: pareto_data(dir, &manifest)?,
            answers: read_answers(dir)?,
            // A Pareto search's points are drawn as a sweep's (its parameters are axes).
            search: manifest
                .get("search")
                .filter(|s| s.get("kind").is_none())
                .and_then(|s| s.get("slo"))
                .and_then(|v| v.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|c| {
                            Some(crate::stats::Constraint {
                                metric: c.get("metric")?.as_str()?.to_string(),
                                at_most: c.get("at_most")?.as_bool()?,
                                value: c.get("value")?.as_f64()?,
                            })
                        })
                        .collect()
                }),
        })
    }

    /// Successful runs in all.
    pub fn ok_runs(&self) -> usize {
        self.points.iter().map(|p| p.runs.len()).sum()
    }

    /// A point's label over `axes` ("policy=MaxPrefix, request_rate=20").
    pub fn label(&self, point: &Point, axes: &[usize]) -> String {
        axes.iter()
            .map(|&a| format!("{}={}", self.axes[a].label, self.axes[a].values[point.at[a]]))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A point's label over every axis (or "all runs" for a sweep without axes).
    pub fn point_label(&self, point: &Point) -> String {
        if self.axes.is_empty() {
            return "all runs".into();
        }
        self.label(point, &(0..self.axes.len()).collect::<Vec<_>>())
    }
}

/// Groups axis columns into the axes the report shows (a column whose
/// values map one to one onto an earlier column's, row by row, joins it:
/// that is a `[[zip]]` group) and gives each row its value index per axis.
fn group_axes(rows: usize, paths: &[String], columns: &[(bool, Vec<AxisValue>)]) -> (Vec<Axis>, Vec<Vec<usize>>) {
    let shown: Vec<Vec<String>> = columns.iter().map(|(_, c)| c.iter().map(show).collect()).collect();
    let same_partition = |i: usize, j: usize| {
        let mut fwd: BTreeMap<&str, &str> = BTreeMap::new();
        let mut back: BTreeMap<&str, &str> = BTreeMap::new();
        (0..rows).all(|r| {
            let (a, b) = (shown[i][r].as_str(), shown[j][r].as_str());
            *fwd.entry(a).or_insert(b) == b && *back.entry(b).or_insert(a) == a
        })
    };
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for j in 0..columns.len() {
        match groups.iter_mut().find(|g| same_partition(g[0], j)) {
            Some(g) => g.push(j),
            None => groups.push(vec![j]),
        }
    }
    let short = short_labels(paths);
    let mut axes = Vec::new();
    let mut at = vec![Vec::with_capacity(groups.len()); rows];
    for g in &groups {
        let numeric = columns[g[0]].0;
        let row_text = |r: usize| g.iter().map(|&c| shown[c][r].as_str()).collect::<Vec<_>>().join(" / ");
        let number = |r: usize| match &columns[g[0]].1[r] {
            AxisValue::Int(v) => *v as f64,
            AxisValue::Float(v) => *v,
            _ => f64::NAN,
        };
        let mut values: Vec<(String, f64)> = Vec::new();
        for r in 0..rows {
            let t = row_text(r);
            if !values.iter().any(|(v, _)| *v == t) {
                values.push((t, number(r)));
            }
        }
        if numeric {
            values.sort_by(|a, b| a.1.total_cmp(&b.1));
        }
        for (r, row) in at.iter_mut().enumerate() {
            let t = row_text(r);
            row.push(values.iter().position(|(v, _)| *v == t).expect("every row's value is listed"));
        }
        axes.push(Axis {
            path: g.iter().map(|&c| paths[c].as_str()).collect::<Vec<_>>().join(" / "),
            label: g.iter().map(|&c| short[c].as_str()).collect::<Vec<_>>().join(" / "),
            numeric,
            numbers: values.iter().map(|v| v.1).collect(),
            values: values.into_iter().map(|v| v.0).collect(),
        });
    }
    (axes, at)
}

/// An axis value as text (floats without trailing zeros).
fn show(v: &AxisValue) -> String {
    match v {
        AxisValue::Int(x) => x.to_string(),
        AxisValue::Float(x) => format!("{x}"),
        AxisValue::Str(s) => s.clone(),
        AxisValue::Bool(b) => b.to_string(),
    }
}

fn missing_listed(path: &Path) -> Result<(), ReportError> {
    if path.exists() {
        Ok(())
    } else {
        Err(rerr(path, "missing, though the manifest lists this table — was the sweep merged, or the file removed?"))
    }
}

/// Histograms of [`CDF_METRICS`] of successful runs, merged per point.
type Merged = BTreeMap<&'static str, BTreeMap<u32, Histogram<u64>>>;

fn read_histograms(path: &Path, point_of_run: &BTreeMap<u32, u32>) -> Result<Merged, ReportError> {
    missing_listed(path)?;
    let mut out: Merged = CDF_METRICS.iter().map(|&m| (m, BTreeMap::new())).collect();
    let Some(b) = table(path)? else { return Ok(out) };
    let runs = ids(&b, path, col::RUN_ID)?;
    let metric = strings(&b, path, col::METRIC)?;
    let hdr =
        column(&b, path, col::HDR)?.as_binary_opt::<i32>().ok_or_else(|| rerr(path, "column `hdr` is not binary"))?;
    for i in 0..b.num_rows() {
        let Some(&point) = point_of_run.get(&runs[i]) else { continue };
        let Some(acc) = metric[i].as_deref().and_then(|m| out.iter_mut().find(|(k, _)| **k == m)).map(|(_, v)| v)
        else {
            continue;
        };
        let h = deserialize_hdr(hdr.value(i))
            .map_err(|e| rerr(path, format!("run {}: bad HDR histogram: {e:?}", runs[i])))?;
        merge_into(acc.entry(point).or_insert_with(empty_histogram), &h)
            .map_err(|e| rerr(path, format!("run {}: cannot merge: {e}", runs[i])))?;
    }
    Ok(out)
}

/// An empty histogram that grows to hold whatever is merged into it.
fn empty_histogram() -> Histogram<u64> {
    let mut h = Histogram::new(3).expect("3 significant digits is valid");
    h.auto(true);
    h
}

/// Adds `h` to `acc` (exact: bucket counts add).
fn merge_into(acc: &mut Histogram<u64>, h: &Histogram<u64>) -> Result<(), hdrhistogram::AdditionError> {
    acc.add(h)
}

fn read_series(path: &Path, point_of_run: &BTreeMap<u32, u32>) -> Result<BTreeMap<u32, Vec<Interval>>, ReportError> {
    missing_listed(path)?;
    let mut out: BTreeMap<u32, Vec<Interval>> = BTreeMap::new();
    let Some(b) = table(path)? else { return Ok(out) };
    let runs = ids(&b, path, col::RUN_ID)?;
    let num = |n: &str| numbers(&b, path, n);
    let (start, done, prompt, generated, queue, workers, busy) = (
        num(col::INTERVAL_START_S)?,
        num(col::REQUESTS_COMPLETED)?,
        num(col::PROMPT_TOKENS)?,
        num(col::GENERATED_TOKENS)?,
        num(col::QUEUE_DEPTH)?,
        num(col::ACTIVE_WORKERS)?,
        num(col::GPU_BUSY_FRACTION)?,
    );
    // Written since the compute and HBM fractions exist; older tables lack them.
    let optional =
        |n: &str| if b.column_by_name(n).is_some() { numbers(&b, path, n) } else { Ok(vec![None; b.num_rows()]) };
    let (compute, hbm) = (optional(col::GPU_COMPUTE_FRACTION)?, optional(col::GPU_HBM_FRACTION)?);
    for i in 0..b.num_rows() {
        if !point_of_run.contains_key(&runs[i]) {
            continue;
        }
        let v = |c: &Vec<Option<f64>>| c[i].unwrap_or(0.0);
        out.entry(runs[i]).or_default().push(Interval {
            start_s: v(&start),
            requests_completed: v(&done),
            prompt_tokens: v(&prompt),
            generated_tokens: v(&generated),
            queue_depth: v(&queue),
            active_workers: v(&workers),
            gpu_busy_fraction: v(&busy),
            gpu_compute_fraction: compute[i].unwrap_or(f64::NAN),
            gpu_hbm_fraction: hbm[i].unwrap_or(f64::NAN),
        });
    }
    Ok(out)
}

fn read_sc25(path: &Path, point_of_run: &BTreeMap<u32, u32>) -> Result<BTreeMap<u32, Vec<Sc25Size>>, ReportError> {
    missing_listed(path)?;
    let mut out: BTreeMap<u32, Vec<Sc25Size>> = BTreeMap::new();
    let Some(b) = table(path)? else { return Ok(out) };
    let runs = ids(&b, path, col::RUN_ID)?;
    let (size, cold, warm) = (
        numbers(&b, path, col::PROMPT_TOKENS)?,
        numbers(&b, path, col::COLD_TTFT_MS)?,
        numbers(&b, path, col::WARM_TTFT_MS)?,
    );
    for i in 0..b.num_rows() {
        if !point_of_run.contains_key(&runs[i]) {
            continue;
        }
        out.entry(runs[i]).or_default().push(Sc25Size {
            prompt_tokens: size[i].unwrap_or(0.0),
            cold_ttft_ms: cold[i],
            warm_ttft_ms: warm[i],
        });
    }
    Ok(out)
}

fn read_stages(path: &Path, point_of_run: &BTreeMap<u32, u32>) -> Result<BTreeMap<u32, Vec<StageRun>>, ReportError> {
    missing_listed(path)?;
    let mut out: BTreeMap<u32, Vec<StageRun>> = BTreeMap::new();
    let Some(b) = table(path)? else { return Ok(out) };
    let runs = ids(&b, path, col::RUN_ID)?;
    let stage = ids(&b, path, col::STAGE)?;
    let kind = strings(&b, path, col::TYPE)?;
    let schema = b.schema();
    let numeric: Vec<(String, Vec<Option<f64>>)> = schema
        .fields()
        .iter()
        .filter(|f| f.data_type().is_numeric() && !matches!(f.name().as_str(), col::RUN_ID | col::STAGE))
        .map(|f| Ok((f.name().clone(), numbers(&b, path, f.name())?)))
        .collect::<Result<_, ReportError>>()?;
    for i in 0..b.num_rows() {
        if !point_of_run.contains_key(&runs[i]) {
            continue;
        }
        out.entry(runs[i]).or_default().push(StageRun {
            stage: stage[i],
            kind: kind[i].clone().unwrap_or_default(),
            metrics: numeric.iter().filter_map(|(n, c)| c[i].map(|v| (n.clone(), v))).collect(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_histograms_hold_every_sample_whatever_each_ones_range() {
        let mut small = Histogram::<u64>::new_with_bounds(1, 1_000, 3).unwrap();
        small.record_n(500, 3).unwrap();
        let mut large = Histogram::<u64>::new_with_bounds(1, 10_000_000, 3).unwrap();
        large.record_n(5_000_000, 2).unwrap();
        let mut acc = empty_histogram();
        merge_into(&mut acc, &small).unwrap();
        merge_into(&mut acc, &large).unwrap();
        assert_eq!(acc.len(), 5);
        assert_eq!(acc.value_at_quantile(0.5), 500);
        assert!(acc.equivalent(acc.max(), 5_000_000));
    }

    #[test]
    fn zipped_columns_form_one_axis_and_values_sort_numerically() {
        let paths: Vec<String> = ["a.policy", "b.min", "b.max"].iter().map(|s| s.to_string()).collect();
        let s = |v: &str| AxisValue::Str(v.into());
        let i = AxisValue::Int;
        // policy × (min, max) zipped: 2 × 2 points.
        let columns = vec![
            (false, vec![s("RR"), s("RR"), s("LL"), s("LL")]),
            (true, vec![i(1024), i(128), i(1024), i(128)]),
            (true, vec![i(4096), i(512), i(4096), i(512)]),
        ];
        let (axes, at) = group_axes(4, &paths, &columns);
        assert_eq!(axes.len(), 2);
        assert_eq!(axes[0].values, ["RR", "LL"]);
        assert_eq!(axes[1].label, "min / max");
        assert_eq!(axes[1].values, ["128 / 512", "1024 / 4096"]);
        assert_eq!(axes[1].numbers, [128.0, 1024.0]);
        assert_eq!(at, [[0, 1], [0, 0], [1, 1], [1, 0]]);
        // No axes: every row is at the one point of an empty grid.
        let (axes, at) = group_axes(2, &[], &[]);
        assert!(axes.is_empty());
        assert_eq!(at, [Vec::<usize>::new(), Vec::new()]);
    }

    #[test]
    fn short_labels_use_the_last_component_unless_that_is_ambiguous() {
        let p = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            short_labels(&p(&["router.router_params.policy", "workload.stages.0.workload_params.request_rate"])),
            ["policy", "request_rate"]
        );
        assert_eq!(
            short_labels(&p(&["workload.stages.0.request_rate", "workload.stages.1.request_rate"])),
            ["0.request_rate", "1.request_rate"]
        );
        // A tier's key keeps its tier, even alone.
        assert_eq!(short_labels(&p(&["kvc.CPUMemory.capacity_GB"])), ["CPUMemory.capacity_GB"]);
        assert_eq!(short_labels(&p(&["disaggregation.decode.count"])), ["decode.count"]);
    }

    #[test]
    fn axis_descriptions_carry_the_unit_when_it_is_known() {
        let axis = |path: &str, label: &str, numeric| Axis {
            path: path.into(),
            label: label.into(),
            numeric,
            values: Vec::new(),
            numbers: Vec::new(),
        };
        assert_eq!(
            axis("workload.stages.0.workload_params.request_rate", "request_rate", true).desc(),
            "request_rate (req/s)"
        );
        assert_eq!(
            axis("kvc.CPUMemory.capacity_GB", "CPUMemory.capacity_GB", true).desc(),
            "CPUMemory.capacity_GB (GiB)"
        );
        assert_eq!(axis("router.router_params.policy", "policy", false).desc(), "policy");
        assert_eq!(axis("simulation.seed", "seed", true).desc(), "seed");
    }
}
