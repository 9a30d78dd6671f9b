//! Sweep planning (pure): a spec becomes axes, grid points and an ordered
//! list of runs, every point's scenario validated before anything runs.
//!
//! **Order.** Axes are the `[grid]` entries in file order, then each
//! `[[zip]]` group (one axis whose paths vary together). Points enumerate
//! the Cartesian product with the last axis varying fastest; point ids count
//! from 0 in that order. Each point runs `replicates` times:
//! `run_id = point_id × replicates + replicate`.
//!
//! **Seeds** (stable across versions): replicate `r` runs with seed
//! `base_seed + r` (wrapping), whatever the point — every point of a
//! replicate sees the same request stream (common random numbers).
//!
//! **Errors.** A path or value that does not fit the schema (unknown key,
//! wrong type, unknown policy name…) stops the sweep before any run. A
//! well-typed value that a point cannot use (a model that does not fit, a
//! negative rate) makes only that point's runs fail.

pub mod lock;
pub mod pareto;
mod path;
pub mod runner;
pub mod search;

pub use path::set_path;

use crate::config::{ConfigError, ErrorKind, Scenario, Spec, SpecFile, closest, resolve, spec_from_table};
use crate::engine::Fnv64;
use crate::metrics::table::ColType;
use crate::output::{AxisValue, RunMeta, TableKind, TableSet};
use std::collections::BTreeSet;
use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Most grid points a sweep may have (each is validated and kept while the
/// sweep runs).
pub const MAX_POINTS: usize = 100_000;

/// Most runs (points × replicates) a sweep may have.
pub const MAX_RUNS: u64 = 1_000_000;

/// `table` with every table's keys in sorted order, so that key order in a
/// spec does not change what a point is.
fn sorted(table: &toml::Table) -> toml::Table {
    fn value(v: &toml::Value) -> toml::Value {
        match v {
            toml::Value::Table(t) => toml::Value::Table(sorted(t)),
            toml::Value::Array(a) => toml::Value::Array(a.iter().map(value).collect()),
            other => other.clone(),
        }
    }
    let mut keys: Vec<&String> = table.keys().collect();
    keys.sort();
    keys.into_iter().map(|k| (k.clone(), value(&table[k]))).collect()
}

/// The identity of a run of the point with key `point_key` and seed `seed`.
pub fn run_key(point_key: u64, seed: u64) -> u64 {
    let mut h = Fnv64::default();
    h.write_u64(point_key);
    h.write_u64(seed);
    h.finish()
}

/// The seed of replicate `replicate`.
pub fn seed_for(base_seed: u64, replicate: u32) -> u64 {
    base_seed.wrapping_add(u64::from(replicate))
}

/// One grid point.
#[derive(Clone, Debug)]
pub struct Point {
    /// Point id.
    pub id: u32,
    /// `(dotted path, value)` overrides of the base scenario.
    pub overrides: Vec<(String, toml::Value)>,
    /// The axis-column values.
    pub axis_values: Vec<AxisValue>,
    /// The point's scenario, or why it cannot run (a value error).
    pub scenario: Result<Arc<Scenario>, ConfigError>,
    /// Hash of what the point runs (its effective scenario, the tool version
    /// and the tables written); with the seed, a run's identity.
    pub key: u64,
}

impl Point {
    /// `path=value, …` for messages.
    pub fn describe(&self) -> String {
        if self.overrides.is_empty() {
            return "(base scenario)".into();
        }
        self.overrides.iter().map(|(p, v)| format!("{p}={v}")).collect::<Vec<_>>().join(", ")
    }
}

/// A run to execute.
#[derive(Clone, Copy, Debug)]
pub struct RunPlan<'a> {
    /// Identity.
    pub meta: RunMeta,
    /// Its grid point.
    pub point: &'a Point,
}

/// An expanded, validated sweep.
#[derive(Clone, Debug)]
pub struct SweepPlan {
    /// Study name.
    pub name: String,
    /// The spec file.
    pub source: String,
    /// Runs per point.
    pub replicates: u32,
    /// Seed of replicate 0.
    pub base_seed: u64,
    /// Output tables and axis columns.
    pub tables: TableSet,
    /// Grid points in order.
    pub points: Vec<Point>,
    /// The resolved spec (base scenario, axes, sweep settings) as TOML, for the manifest.
    pub canonical: String,
    /// The base scenario with every default written out (values derived
    /// from presets stay implicit, so each point is this plus its
    /// overrides), as TOML, for the manifest.
    pub scenario_with_defaults: String,
    /// FNV-1a of `canonical`: results from another spec are never mixed in.
    pub digest: u64,
    /// Default output directory.
    pub default_output: PathBuf,
    /// Warnings from importing Opal JSON (the spec or its base).
    pub notes: Vec<String>,
    /// Write the HTML report when the sweep finishes.
    pub report: bool,
}

impl SweepPlan {
    /// Number of runs.
    pub fn total_runs(&self) -> u32 {
        self.points.len() as u32 * self.replicates
    }

    /// Run `run_id`.
    pub fn run(&self, run_id: u32) -> RunPlan<'_> {
        let point = &self.points[(run_id / self.replicates) as usize];
        let replicate = run_id % self.replicates;
        let seed = seed_for(self.base_seed, replicate);
        RunPlan {
            meta: RunMeta { run_id, point_id: point.id, replicate, seed, run_key: run_key(point.key, seed) },
            point,
        }
    }

    /// Every run in id order.
    pub fn runs(&self) -> impl Iterator<Item = RunPlan<'_>> {
        (0..self.total_runs()).map(|id| self.run(id))
    }
}

const SWEEP_KEYS: [&str; 4] = ["sweep", "grid", "zip", "search"];

pub(crate) fn axis_type(path: &str, values: &[toml::Value], source: &str) -> Result<ColType, ConfigError> {
    use toml::Value as V;
    let all = |f: fn(&V) -> bool| values.iter().all(f);
    if all(|v| matches!(v, V::Integer(_))) {
        Ok(ColType::I64)
    } else if all(|v| matches!(v, V::Integer(_) | V::Float(_))) {
        Ok(ColType::F64)
    } else if all(|v| matches!(v, V::String(_))) {
        Ok(ColType::Str)
    } else if all(|v| matches!(v, V::Boolean(_))) {
        Ok(ColType::Bool)
    } else if all(|v| matches!(v, V::Array(_) | V::Table(_))) {
        Ok(ColType::Str)
    } else {
        Err(ConfigError::key(
            source,
            path,
            "the values of an axis must all have one type (numbers, strings, booleans or lists)",
        )
        .hint("write every value the same way, e.g. 1.0 and 2.0 rather than 1.0 and \"2\"")
        .schema())
    }
}

pub(crate) fn axis_value(v: &toml::Value, ty: ColType) -> AxisValue {
    match (v, ty) {
        (toml::Value::Integer(i), ColType::I64) => AxisValue::Int(*i),
        (toml::Value::Integer(i), ColType::F64) => AxisValue::Float(*i as f64),
        (toml::Value::Float(f), _) => AxisValue::Float(*f),
        (toml::Value::String(s), _) => AxisValue::Str(s.clone()),
        (toml::Value::Boolean(b), _) => AxisValue::Bool(*b),
        (other, _) => AxisValue::Str(other.to_string()),
    }
}

/// An axis: paths that vary together and their value lists (`values[path][i]`).
struct Axis {
    paths: Vec<String>,
    values: Vec<Vec<toml::Value>>,
}

impl Axis {
    fn len(&self) -> usize {
        self.values[0].len()
    }
}

fn axes_of(spec: &Spec, source: &str) -> Result<Vec<Axis>, ConfigError> {
    let list = |at: &str, path: &str, v: &toml::Value| -> Result<Vec<toml::Value>, ConfigError> {
        match v {
            toml::Value::Array(items) if !items.is_empty() => Ok(items.clone()),
            _ => Err(ConfigError::key(source, format!("{at}.\"{path}\""), "an axis needs a non-empty list of values")
                .hint(format!("write \"{path}\" = [value1, value2, ...]"))
                .schema()),
        }
    };
    let mut axes = Vec::new();
    for (path, v) in &spec.file.grid {
        axes.push(Axis { paths: vec![path.clone()], values: vec![list("grid", path, v)?] });
    }
    for (i, group) in spec.file.zip.iter().enumerate() {
        if group.is_empty() {
            return Err(ConfigError::key(source, format!("zip.{i}"), "an empty [[zip]] group")
                .hint("give it two or more paths with equally long lists")
                .schema());
        }
        let mut axis = Axis { paths: Vec::new(), values: Vec::new() };
        for (path, v) in group {
            axis.paths.push(path.clone());
            axis.values.push(list(&format!("zip.{i}"), path, v)?);
        }
        let n = axis.values[0].len();
        if let Some((p, vals)) = axis.paths.iter().zip(&axis.values).find(|(_, v)| v.len() != n) {
            return Err(ConfigError::key(
                source,
                format!("zip.{i}.\"{p}\""),
                format!("has {} values but `{}` has {n}", vals.len(), axis.paths[0]),
            )
            .hint("lists in one [[zip]] group vary together, so they must be equally long")
            .schema());
        }
        axes.push(axis);
    }
    let mut seen = BTreeSet::new();
    for p in axes.iter().flat_map(|a| &a.paths) {
        if !seen.insert(p.as_str()) {
            return Err(ConfigError::key(source, p.as_str(), "this path is varied by two axes")
                .hint("vary each path in one place only")
                .schema());
        }
        if SWEEP_KEYS.contains(&p.split('.').next().unwrap_or("")) {
            return Err(ConfigError::key(source, p.as_str(), "sweep settings cannot be varied")
                .hint("axes vary scenario keys")
                .schema());
        }
    }
    Ok(axes)
}

fn tables_of(spec: &Spec, scenario: &SpecFile, source: &str) -> Result<BTreeSet<TableKind>, ConfigError> {
    let names = spec.file.sweep.tables.clone().unwrap_or_else(|| {
        let mut names = ["runs", "histograms", "timeseries", "workers", "stages"].map(String::from).to_vec();
        if scenario.workload.stages.iter().any(|s| s.kind.eq_ignore_ascii_case("SC25Workload")) {
            names.push("sc25".into());
        }
        names
    });
    let mut set = BTreeSet::from([TableKind::Runs]);
    for n in &names {
        let kind = TableKind::from_name(n).ok_or_else(|| {
            let all: Vec<&str> = TableKind::WRITE_ORDER.iter().map(|t| t.name()).collect();
            let hint = match closest(n, all.iter().copied()) {
                Some(c) => format!("did you mean `{c}`? tables: {}", all.join(", ")),
                None => format!("tables: {}", all.join(", ")),
            };
            ConfigError::key(source, "sweep.tables", format!("unknown table {n:?}")).hint(hint).schema()
        })?;
        set.insert(kind);
    }
    Ok(set)
}

/// The scenario sections (and the directory their relative paths resolve against).
fn base_scenario(spec: &Spec, source: &str) -> Result<(toml::Table, PathBuf, String, Vec<String>), ConfigError> {
    let strip = |t: &toml::Table| -> toml::Table {
        t.iter().filter(|(k, _)| !SWEEP_KEYS.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    let Some(base) = &spec.file.sweep.base else {
        return Ok((strip(&spec.table), spec.base_dir().to_path_buf(), source.to_string(), spec.notes.clone()));
    };
    let own = strip(&spec.table);
    if let Some(k) = own.keys().next() {
        return Err(ConfigError::key(
            source,
            k.as_str(),
            "a spec with `[sweep] base` must not also define scenario sections",
        )
        .hint("move the section into the base file, or vary it with [grid]")
        .schema());
    }
    let path = spec.base_dir().join(base);
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same(&path, &spec.path) {
        return Err(ConfigError::key(source, "sweep.base", format!("{base:?} is this spec itself"))
            .hint("point base at the file that holds the scenario sections")
            .schema());
    }
    let base_spec = crate::config::load_spec(&path)?;
    if let Some(next) = &base_spec.file.sweep.base {
        return Err(ConfigError::key(
            base_spec.source(),
            "sweep.base",
            format!("the base file has a base of its own ({next:?}); bases do not chain"),
        )
        .hint("point the spec's base at the file that holds the scenario sections")
        .schema());
    }
    Ok((strip(&base_spec.table), base_spec.base_dir().to_path_buf(), base_spec.source(), base_spec.notes))
}

/// Expands and validates `spec`. Errors name the line of their key (see
/// [`ConfigError::located`]).
pub fn plan(spec: &Spec) -> Result<SweepPlan, ConfigError> {
    expand(spec).map_err(ConfigError::located)
}

fn expand(spec: &Spec) -> Result<SweepPlan, ConfigError> {
    let source = spec.source();
    let sweep = &spec.file.sweep;
    if let Some(name) = &sweep.name
        && (name.is_empty() || name.contains(['/', '\\']) || name == "." || name == ".." || name.contains('\0'))
    {
        return Err(ConfigError::key(&source, "sweep.name", format!("{name:?} is not a plain name"))
            .hint("a name is one path component (results go to results/<name>/); set [sweep] output to write elsewhere")
            .schema());
    }
    let (scenario_table, base_dir, scenario_source, notes) = base_scenario(spec, &source)?;
    let base_file = spec_from_table(&scenario_table, &scenario_source)?;
    let axes = axes_of(spec, &source)?;
    let tables = tables_of(spec, &base_file, &source)?;
    let replicates = sweep.replicates.unwrap_or(1);
    if replicates == 0 {
        return Err(ConfigError::key(&source, "sweep.replicates", "must be at least 1")
            .hint("use replicates = 1 for one run per point"));
    }
    let interval = match sweep.time_series_interval_sec {
        Some(v) if !(v.is_finite() && v >= crate::metrics::MIN_INTERVAL_SECS) => {
            return Err(ConfigError::key(
                &source,
                "sweep.time_series_interval_sec",
                format!("must be at least {} s, got {v}", crate::metrics::MIN_INTERVAL_SECS),
            )
            .hint("use e.g. 1.0 (seconds per row of timeseries.parquet)"));
        }
        v => v,
    };
    let base_seed = sweep.base_seed.unwrap_or(base_file.simulation.seed);

    let mut axis_columns = Vec::new();
    for a in &axes {
        for (p, vals) in a.paths.iter().zip(&a.values) {
            axis_columns.push((p.clone(), axis_type(p, vals, &source)?));
        }
    }

    let count = axes.iter().try_fold(1usize, |n, a| n.checked_mul(a.len())).unwrap_or(usize::MAX);
    if count > MAX_POINTS {
        let sizes = axes.iter().map(|a| a.len().to_string()).collect::<Vec<_>>().join(" × ");
        return Err(ConfigError::key(
            &source,
            "grid",
            format!("{sizes} = {count} grid points, more than the {MAX_POINTS} a sweep may have"),
        )
        .hint("split the study into several specs, or vary fewer values together")
        .schema());
    }
    if count as u64 * u64::from(replicates) > MAX_RUNS {
        return Err(ConfigError::key(
            &source,
            "sweep.replicates",
            format!("{count} points × {replicates} replicates is more than the {MAX_RUNS} runs a sweep may have"),
        )
        .hint("use fewer replicates, or split the study"));
    }
    let mut points = Vec::with_capacity(count);
    for id in 0..count {
        // Mixed-radix digits, last axis fastest.
        let mut rest = id;
        let mut digits = vec![0; axes.len()];
        for (d, a) in digits.iter_mut().zip(&axes).rev() {
            *d = rest % a.len();
            rest /= a.len();
        }
        let mut overrides = Vec::new();
        for (a, &d) in axes.iter().zip(&digits) {
            for (p, vals) in a.paths.iter().zip(&a.values) {
                overrides.push((p.clone(), vals[d].clone()));
            }
        }
        let axis_values = overrides.iter().zip(&axis_columns).map(|((_, v), (_, ty))| axis_value(v, *ty)).collect();
        let mut table = scenario_table.clone();
        for (p, v) in &overrides {
            set_path(&mut table, p, v.clone()).map_err(|e| {
                ConfigError::key(&source, p.as_str(), e).hint("check the path against the scenario sections").schema()
            })?;
        }
        if let Some(v) = interval {
            set_path(&mut table, "simulation.time_series_interval_sec", toml::Value::Float(v))
                .expect("simulation is a table");
        }
        let point_desc = overrides.iter().map(|(p, v)| format!("{p} = {v}")).collect::<Vec<_>>().join(", ");
        let in_point = |mut e: ConfigError| {
            if !point_desc.is_empty() {
                e.message = format!("{} (grid point {id}: {point_desc})", e.message);
            }
            // A line in the spec no longer applies once a point's values are
            // set; a line in another file (a trace) does.
            if e.file == source {
                e.line = None;
            }
            e
        };
        let file = spec_from_table(&table, &source).map_err(in_point)?;
        // What the point runs, as text: the resolved scenario's table (paths
        // inside it resolve against base_dir, which is part of it too).
        let scenario = match resolve(&file, &scenario_source, &base_dir) {
            Ok(s) => Ok(Arc::new(s)),
            Err(e) if e.kind == ErrorKind::Schema => return Err(in_point(e)),
            Err(e) => Err(in_point(e).located()),
        };
        // What the point runs: its effective scenario (every key written
        // out, paths absolute), so that writing a default out, reordering
        // keys or moving the spec does not change it; for a point that
        // cannot run, its table as written.
        let what = match &scenario {
            Ok(s) => {
                crate::config::effective::effective_table(&file, Some(s), &base_dir).unwrap_or_else(|_| table.clone())
            }
            Err(_) => table.clone(),
        };
        let mut h = Fnv64::default();
        h.write(env!("CARGO_PKG_VERSION").as_bytes());
        h.write(format!("{tables:?}").as_bytes());
        h.write(toml::to_string(&sorted(&what)).unwrap_or_default().as_bytes());
        let key = h.finish();
        points.push(Point { id: id as u32, overrides, axis_values, scenario, key });
    }

    let mut canonical = String::new();
    canonical.push_str(&format!(
        "# opal sweep {:?}: {} points × {} replicates, base_seed {}\n",
        spec.name(),
        points.len(),
        replicates,
        base_seed
    ));
    canonical.push_str(&format!("tables = {:?}\n", tables.iter().map(|t| t.name()).collect::<Vec<_>>()));
    if let Some(v) = interval {
        canonical.push_str(&format!("time_series_interval_sec = {v}\n"));
    }
    for a in &axes {
        for (p, vals) in a.paths.iter().zip(&a.values) {
            canonical.push_str(&format!("axis {p} = {}\n", toml::Value::Array(vals.clone())));
        }
    }
    if let Some(s) = &spec.file.search {
        canonical.push_str(&format!("search = {}\n", toml::to_string(s).unwrap_or_default().replace('\n', "; ")));
    }
    canonical.push_str(&toml::to_string(&scenario_table).unwrap_or_default());
    let mut notes = notes;
    notes.extend(trace_burst_notes(&points));
    notes.extend(pricing_notes(&points));
    let scenario_with_defaults = crate::config::effective::effective_table(&base_file, None, &base_dir)
        .map(|t| toml::to_string(&t).unwrap_or_default())
        .unwrap_or_default();
    let mut h = Fnv64::default();
    h.write(canonical.as_bytes());
    // `[sweep] output` is relative to the spec, as every path a spec names.
    let default_output =
        sweep.output.as_ref().map_or_else(|| Path::new("results").join(spec.name()), |o| spec.base_dir().join(o));
    Ok(SweepPlan {
        name: spec.name(),
        source,
        replicates,
        base_seed,
        tables: TableSet { tables, axis_columns },
        points,
        canonical,
        scenario_with_defaults,
        digest: h.finish(),
        default_output,
        notes,
        report: sweep.report.unwrap_or(false),
    })
}

/// Requests of a replayed trace scanned for bursts.
const BURST_SCAN_LINES: usize = 10_000;

/// A warning per trace the points replay at its own times whose first
/// [`BURST_SCAN_LINES`] requests hold bursts (5 or more with one
/// timestamp): a time scale cannot spread them, `request_rate` can.
fn trace_burst_notes(points: &[Point]) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut notes = Vec::new();
    let stages = points.iter().filter_map(|p| p.scenario.as_ref().ok()).flat_map(|s| s.stages.iter());
    for stage in stages {
        let crate::workload::StageKind::Trace(t) = &stage.kind else { continue };
        if t.retime.is_some() || !seen.insert(t.path.clone()) {
            continue;
        }
        if let Some((most, groups, read)) = crate::workload::trace_bursts(t, BURST_SCAN_LINES)
            && most >= 5
        {
            notes.push(format!(
                "{}: {groups} timestamps are shared by 5 or more requests (up to {most}) in the {read} requests scanned (the first {BURST_SCAN_LINES} at most); time_scale keeps such bursts — set request_rate (with arrival = \"poisson\" or \"gamma\") to re-time the requests at a chosen rate",
                t.path.display()
            ));
        }
    }
    notes
}

/// The step models' notes on their prices (routed experts the measured
/// tables lack), each once.
fn pricing_notes(points: &[Point]) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    for s in points.iter().filter_map(|p| p.scenario.as_ref().ok()) {
        let workers = std::iter::once(&s.worker).chain(s.groups.iter().map(|g| &g.pool.worker));
        let pools = s.disagg.iter().filter_map(|d| d.pools.as_deref()).flat_map(|(a, b)| [&a.worker, &b.worker]);
        for w in workers.chain(pools) {
            if let crate::worker::perf::StepModel::Operators(o) = &w.perf {
                seen.extend(o.curves.notes.iter().cloned());
            }
        }
    }
    seen.into_iter().collect()
}

/// What `spec` runs, with every key written out (see
/// [`crate::config::effective`]), as commented TOML that runs to the same
/// results: its `[sweep]` settings (a base file's scenario is inlined), and
/// then either its axes and the base scenario, or — for `point` — that grid
/// point's scenario alone.
pub fn effective_config(spec: &Spec, point: Option<usize>) -> Result<String, ConfigError> {
    let source = spec.source();
    let plan = plan(spec)?;
    let (base, base_dir, scenario_source, _) = base_scenario(spec, &source)?;
    let with_point = |n: usize| -> Result<(SpecFile, Scenario), ConfigError> {
        let p = plan.points.get(n).ok_or_else(|| {
            ConfigError::file(
                &source,
                format!("the sweep has {} grid points; there is no point {n}", plan.points.len()),
            )
            .hint("points count from 0; --dry-run lists them")
        })?;
        let mut table = base.clone();
        for (path, v) in &p.overrides {
            set_path(&mut table, path, v.clone()).map_err(|e| ConfigError::key(&source, path.as_str(), e))?;
        }
        let file = spec_from_table(&table, &scenario_source)?;
        let scenario = resolve(&file, &scenario_source, &base_dir)?;
        Ok((file, scenario))
    };
    // A base scenario that only fits once an axis sets a key (a `[[zip]]`
    // of `worker.hw.tp` with a model too big for one GPU) is written with
    // the first grid point that resolves, and says so.
    let mut fallback = None;
    let (file, scenario) = match point {
        Some(n) => with_point(n)?,
        None => {
            let file = spec_from_table(&base, &scenario_source)?;
            match resolve(&file, &scenario_source, &base_dir) {
                Ok(scenario) => (file, scenario),
                Err(e) => match plan.points.iter().position(|p| p.scenario.is_ok()) {
                    Some(n) if !plan.points[n].overrides.is_empty() => {
                        fallback = Some((n, e));
                        with_point(n)?
                    }
                    _ => return Err(e),
                },
            }
        }
    };
    let effective = crate::config::effective::effective_table(&file, Some(&scenario), &base_dir)
        .map_err(|e| ConfigError::file(&source, e))?;
    let mut head = toml::Table::new();
    if let Some(toml::Value::Table(sweep)) = spec.table.get("sweep") {
        let mut sweep = sweep.clone();
        sweep.remove("base");
        if !sweep.is_empty() {
            head.insert("sweep".into(), toml::Value::Table(sweep));
        }
    }
    if point.is_none() {
        for key in ["grid", "zip", "search"] {
            if let Some(v) = spec.table.get(key) {
                head.insert(key.into(), v.clone());
            }
        }
    }
    let what = match point {
        Some(n) => format!("grid point {n} of {source}"),
        None => source.clone(),
    };
    let mut out = format!(
        "# The effective configuration of {what}: every key, defaults filled in\n# (opal-sweep {}). It runs to the same results.\n",
        env!("CARGO_PKG_VERSION")
    );
    if let Some((n, e)) = &fallback {
        let why = e.to_string().lines().next().unwrap_or_default().to_string();
        out.push_str(&format!(
            "# The base scenario alone does not resolve ({why}); the keys below\n# are grid point {n}'s, the first that does (its axis values applied).\n"
        ));
    }
    out.push_str(&crate::config::effective::commented(&head));
    out.push_str(&crate::config::effective::commented(&effective));
    Ok(out)
}

/// The default scenario (an empty spec's), written out as
/// [`effective_config`] writes a spec's, followed by every other key of the
/// schema commented out with its default (see [`crate::config::effective::reference`]).
pub fn default_config() -> Result<String, ConfigError> {
    let source = "defaults.toml";
    let file = spec_from_table(&toml::Table::new(), source)?;
    let scenario = resolve(&file, source, Path::new("."))?;
    let table = crate::config::effective::effective_table(&file, Some(&scenario), Path::new("."))
        .map_err(|e| ConfigError::file(source, e))?;
    Ok(format!(
        "# The default scenario: every key, defaults filled in (opal-sweep {}); the keys\n# a spec may add (commented out) follow each section. It runs to the same results.\n{}",
        env!("CARGO_PKG_VERSION"),
        crate::config::effective::reference(&table)
    ))
}

/// The scenario of one run: its point's scenario with the replicate's seed.
pub fn run_scenario(run: &RunPlan<'_>) -> Result<Scenario, ConfigError> {
    match &run.point.scenario {
        Ok(s) => {
            let mut s = Scenario::clone(s);
            s.seed = run.meta.seed;
            Ok(s)
        }
        Err(e) => Err(e.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn plan_of(text: &str) -> Result<SweepPlan, ConfigError> {
        plan(&Spec::from_text(text, Path::new("study.toml")).unwrap())
    }

    const BASE: &str = r#"
        [[workload.stages]]
        type = "UniformReqRate"
        [workload.stages.workload_params]
        total_requests = 10
    "#;

    #[test]
    fn the_defaults_show_every_key_of_the_schema() {
        let text = default_config().unwrap();
        let lines: Vec<&str> = text.lines().map(|l| l.trim_start_matches("# ")).collect();
        let mut missing = Vec::new();
        for (strukt, key) in crate::config::effective::schema_keys() {
            let written = lines.iter().any(|l| {
                l.starts_with(&format!("{key} = "))
                    || l.ends_with(&format!(".{key}]"))
                    || l.ends_with(&format!(".{key}]]"))
                    || *l == format!("[{key}]")
                    || *l == format!("[[{key}]]")
            });
            if !written {
                missing.push(format!("{strukt}.{key}"));
            }
        }
        assert!(missing.is_empty(), "config --defaults leaves out {missing:?}");
        // And it still runs as the default scenario: its keys parse as a spec.
        Spec::from_text(&text, Path::new("defaults.toml")).unwrap();
    }

    #[test]
    fn grid_is_cartesian_last_axis_fastest_then_zip_then_replicates() {
        let p = plan_of(&format!(
            r#"
            [sweep]
            replicates = 2
            base_seed = 10
            [grid]
            "router.router_params.policy" = ["RoundRobin", "Random"]
            "simulation.num_workers" = [1, 2, 3]
            [[zip]]
            "workload.stages.0.workload_params.prompt_size_min" = [10, 100]
            "workload.stages.0.workload_params.prompt_size_max" = [20, 200]
            {BASE}"#
        ))
        .unwrap();
        // 2 × 3 × 2 points × 2 replicates.
        assert_eq!(p.points.len(), 12);
        assert_eq!(p.total_runs(), 24);
        let desc: Vec<String> = p
            .points
            .iter()
            .map(|pt| pt.overrides.iter().map(|(_, v)| v.to_string()).collect::<Vec<_>>().join(" "))
            .collect();
        assert_eq!(desc[0], "\"RoundRobin\" 1 10 20");
        assert_eq!(desc[1], "\"RoundRobin\" 1 100 200");
        assert_eq!(desc[2], "\"RoundRobin\" 2 10 20");
        assert_eq!(desc[11], "\"Random\" 3 100 200");
        let r = p.run(7);
        assert_eq!((r.meta.point_id, r.meta.replicate, r.meta.seed), (3, 1, 11));
        assert_eq!(p.run(6).meta.seed, 10, "the seed depends on the replicate only");
        let cols: Vec<(&str, ColType)> = p.tables.axis_columns.iter().map(|(n, t)| (n.as_str(), *t)).collect();
        assert_eq!(cols[0], ("router.router_params.policy", ColType::Str));
        assert_eq!(cols[1], ("simulation.num_workers", ColType::I64));
        let crate::workload::StageKind::Rate(s) = &p.points[1].scenario.as_ref().unwrap().stages[0].kind else {
            panic!()
        };
        assert_eq!(
            s.prompt,
            crate::workload::Dist::Uniform { min: 100.0, max: 200.0 },
            "zip values reach the scenario"
        );
    }

    #[test]
    fn a_spec_without_axes_is_one_run_with_the_simulation_seed() {
        let p = plan_of(&format!("[simulation]\nseed = 5\n{BASE}")).unwrap();
        assert_eq!(p.total_runs(), 1);
        assert_eq!(p.run(0).meta.seed, 5);
    }

    #[test]
    fn unknown_paths_and_mistyped_values_stop_the_sweep_naming_them() {
        let e = plan_of(&format!("[grid]\n\"router.router_params.polcy\" = [\"Random\"]\n{BASE}")).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("router.router_params.polcy"), "{e}");
        assert!(e.hint.unwrap().contains("did you mean `policy`"));
        let e = plan_of(&format!("[grid]\n\"workload.stages.0.workload_params.request_rate\" = [\"fast\"]\n{BASE}"))
            .unwrap_err();
        assert_eq!(e.key.as_deref(), Some("workload.stages.0.workload_params.request_rate"), "{e}");
        let e = plan_of(&format!("[grid]\n\"workload.stages.3.workload_params.request_rate\" = [1.0]\n{BASE}"))
            .unwrap_err();
        assert!(e.message.contains("index 3 is out of range"), "{e}");
        let e = plan_of(&format!("[grid]\n\"router.router_params.policy\" = [\"Random\", \"Smartest\"]\n{BASE}"))
            .unwrap_err();
        assert!(e.message.contains("unknown routing policy"), "{e}");
        let e = plan_of(&format!("[grid]\n\"simulation.num_workers\" = [1, \"2\"]\n{BASE}")).unwrap_err();
        assert!(e.message.contains("one type"), "{e}");
        let e = plan_of(&format!("[[zip]]\n\"simulation.num_workers\" = [1, 2]\n\"simulation.seed\" = [1]\n{BASE}"))
            .unwrap_err();
        assert!(e.message.contains("has 1 values"), "{e}");
    }

    #[test]
    fn a_value_a_point_cannot_use_fails_only_that_point() {
        let p =
            plan_of(&format!("[grid]\n\"model.model_params.name\" = [\"llama-3.1-8b\", \"llama-3.1-70b\"]\n{BASE}"))
                .unwrap();
        assert!(p.points[0].scenario.is_ok());
        let e = p.points[1].scenario.as_ref().unwrap_err();
        assert!(e.message.contains("does not fit") && e.message.contains("grid point 1"), "{e}");
    }

    #[test]
    fn set_path_walks_tables_and_list_indices() {
        let mut t: toml::Table = "[[a]]\nx = 1\n[[a]]\nx = 2\n".parse().unwrap();
        set_path(&mut t, "a.1.x", toml::Value::Integer(5)).unwrap();
        set_path(&mut t, "b.c", toml::Value::Boolean(true)).unwrap();
        assert_eq!(t["a"][1]["x"].as_integer(), Some(5));
        assert_eq!(t["b"]["c"].as_bool(), Some(true));
        assert!(set_path(&mut t, "a.x", toml::Value::Integer(1)).unwrap_err().contains("must be an index"));
        assert!(set_path(&mut t, "b.c.d", toml::Value::Integer(1)).unwrap_err().contains("is a value"));
    }

    #[test]
    fn the_digest_changes_with_the_spec() {
        let a = plan_of(BASE).unwrap();
        let b = plan_of(&BASE.replace("10", "11")).unwrap();
        assert_ne!(a.digest, b.digest);
        assert_eq!(a.digest, plan_of(BASE).unwrap().digest);
    }
}
