//! Numbers that stay true: every shipped sweep run in full (release builds
//! only: `.ci/run` runs this module with `--release`), its report at most
//! 2 MB, and every result the README and the sweep headers quote —
//! listed in `tests/claims.toml`, each with the text that quotes it and
//! how to compute it from the runs table — checked against the fresh run
//! to the precision it is quoted with.

use arrow_array::Array;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The largest report a shipped sweep may write (every file of it).
const MAX_REPORT_BYTES: u64 = 2_000_000;

#[derive(serde::Deserialize)]
struct Claims {
    claim: Vec<Claim>,
}

/// One quoted result.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Claim {
    /// Where it is quoted (relative to the repository).
    file: String,
    /// The quoting text, verbatim (line breaks as spaces); every number's `quoted` is in it.
    text: String,
    /// The shipped sweep that gives it (a stem of `sweeps/`).
    sweep: String,
    /// The table its numbers come from: `runs` (default), or another table
    /// (`search`, `sc25`), whose rows carry their run's axes.
    #[serde(default = "runs_table")]
    table: String,
    /// The rows it is about: column → value, or a list of values any of
    /// which matches (all rows if empty).
    #[serde(default)]
    point: toml::Table,
    /// The numbers, each computed from the runs table.
    numbers: Vec<Number>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Number {
    /// As the text writes it (`7.8`, `2,000`, `-27`); its decimals are the precision checked.
    quoted: String,
    /// A runs-table column.
    column: String,
    /// Factor on the column (0.001: ms → s; -1 for a quoted fall).
    #[serde(default = "one")]
    scale: f64,
    /// More columns the runs of this number must match (added to the claim's `point`).
    #[serde(default)]
    point: toml::Table,
    /// Instead of the value, its change in percent from the point with these axis values changed.
    #[serde(default)]
    change_from: Option<toml::Table>,
    /// Over the matching runs: `mean` (default), `min` or `max` of the points' means,
    /// `run_min` or `run_max` over single runs, `sum` of the points' means, `count` of the runs.
    #[serde(default)]
    agg: Option<String>,
}

fn one() -> f64 {
    1.0
}

fn runs_table() -> String {
    "runs".into()
}

/// A runs table: each ok run's axis values and numbers.
struct Runs {
    rows: Vec<BTreeMap<String, Value>>,
}

#[derive(Clone, Debug, PartialEq)]
enum Value {
    Num(f64),
    Str(String),
}

impl Value {
    fn matches(&self, v: &toml::Value) -> bool {
        match (self, v) {
            (Value::Num(a), toml::Value::Integer(b)) => *a == *b as f64,
            (Value::Num(a), toml::Value::Float(b)) => (a - b).abs() <= 1e-9 * b.abs(),
            (Value::Str(a), toml::Value::String(b)) => a == b,
            (_, toml::Value::Array(any)) => any.iter().any(|v| self.matches(v)),
            _ => false,
        }
    }
}

impl Runs {
    /// The rows of `table` in `dir`: the ok runs, or another table's rows
    /// with their run's columns added.
    fn read(dir: &Path, table: &str) -> Runs {
        let runs = Self::rows(&dir.join("runs.parquet"));
        if table == "runs" {
            let rows = runs.into_iter().filter(|r| r.get("status") == Some(&Value::Str("ok".into()))).collect();
            return Runs { rows };
        }
        let mut rows = Self::rows(&dir.join(format!("{table}.parquet")));
        for row in &mut rows {
            if let Some(run) = row.get("run_id").and_then(|id| runs.iter().find(|r| r.get("run_id") == Some(id))) {
                for (k, v) in run {
                    row.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
        }
        Runs { rows }
    }

    fn rows(path: &Path) -> Vec<BTreeMap<String, Value>> {
        use arrow_array::cast::AsArray;
        let mut rows = Vec::new();
        for b in opal::output::read_table(path).unwrap() {
            let schema = b.schema();
            for i in 0..b.num_rows() {
                let mut row = BTreeMap::new();
                for (f, c) in schema.fields().iter().zip(b.columns()) {
                    let v = if let Some(s) = c.as_string_opt::<i32>() {
                        (!s.is_null(i)).then(|| Value::Str(s.value(i).to_string()))
                    } else {
                        opal::output::f64_column(&b, f.name()).and_then(|col| col[i]).map(Value::Num)
                    };
                    if let Some(v) = v {
                        row.insert(f.name().clone(), v);
                    }
                }
                rows.push(row);
            }
        }
        rows
    }

    /// The runs at `point`, grouped by grid point.
    fn at(&self, point: &toml::Table) -> BTreeMap<u64, Vec<&BTreeMap<String, Value>>> {
        let mut out: BTreeMap<u64, Vec<_>> = BTreeMap::new();
        for r in &self.rows {
            if point.iter().all(|(k, v)| r.get(k).is_some_and(|x| x.matches(v))) {
                // Grouped by grid point; rows without one (a table of the sweep) each their own.
                let id = match r.get("point_id") {
                    Some(Value::Num(id)) => *id as u64,
                    _ => out.len() as u64,
                };
                out.entry(id).or_default().push(r);
            }
        }
        out
    }
}

fn num(r: &BTreeMap<String, Value>, column: &str) -> f64 {
    match r.get(column) {
        Some(Value::Num(v)) => *v,
        other => panic!("column {column}: {other:?}"),
    }
}

fn mean(v: impl IntoIterator<Item = f64>) -> f64 {
    let (s, n) = v.into_iter().fold((0.0, 0), |(s, n), x| (s + x, n + 1));
    s / f64::from(n)
}

/// The value of `n` over the runs at `point`.
fn compute(runs: &Runs, point: &toml::Table, n: &Number) -> Result<f64, String> {
    let mut point = point.clone();
    point.extend(n.point.clone());
    let point = &point;
    let points = runs.at(point);
    if n.agg.as_deref() == Some("count") {
        return Ok(points.values().map(Vec::len).sum::<usize>() as f64);
    }
    if points.is_empty() {
        return Err(format!("no ok run at {point}"));
    }
    // Per run: the value, or its change from the run of the same replicate at the other point.
    let value = |r: &BTreeMap<String, Value>| -> Result<f64, String> {
        let v = num(r, &n.column);
        let Some(from) = &n.change_from else { return Ok(v * n.scale) };
        // This row's own point (every axis, and every column the claim
        // filters on, at this row's value), with the changed values.
        let mut other = toml::Table::new();
        for (k, x) in r {
            if k.contains('.') || point.contains_key(k) {
                let v = match x {
                    Value::Num(f) => toml::Value::Float(*f),
                    Value::Str(s) => toml::Value::String(s.clone()),
                };
                other.insert(k.clone(), v);
            }
        }
        for (k, x) in from {
            other.insert(k.clone(), x.clone());
        }
        let base = runs.at(&other);
        let rep = r.get("replicate");
        let b = base
            .values()
            .flatten()
            .find(|b| b.get("replicate") == rep)
            .ok_or_else(|| format!("no run at {other} to compare with"))?;
        Ok(n.scale * 100.0 * (v / num(b, &n.column) - 1.0))
    };
    let per_point: Vec<Vec<f64>> =
        points.values().map(|rs| rs.iter().map(|r| value(r)).collect::<Result<_, _>>()).collect::<Result<_, _>>()?;
    let v = match n.agg.as_deref().unwrap_or("mean") {
        "mean" => mean(per_point.iter().flatten().copied()),
        "min" => per_point.iter().map(|p| mean(p.iter().copied())).fold(f64::INFINITY, f64::min),
        "max" => per_point.iter().map(|p| mean(p.iter().copied())).fold(f64::NEG_INFINITY, f64::max),
        "run_min" => per_point.iter().flatten().copied().fold(f64::INFINITY, f64::min),
        "run_max" => per_point.iter().flatten().copied().fold(f64::NEG_INFINITY, f64::max),
        "sum" => per_point.iter().map(|p| mean(p.iter().copied())).sum(),
        other => return Err(format!("unknown agg {other:?}")),
    };
    Ok(v)
}

/// Whether `value` rounds to `quoted` at its precision (half a unit of its last digit either way).
fn agrees(quoted: &str, value: f64) -> bool {
    let q: f64 = quoted.replace(',', "").replace('−', "-").parse().expect("a quoted number");
    let decimals = quoted.split_once('.').map_or(0, |(_, d)| d.len()) as i32;
    (value - q).abs() <= 0.5 * 10f64.powi(-decimals) * (1.0 + 1e-9)
}

fn shipped_sweeps() -> Vec<PathBuf> {
    let mut specs: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("sweeps"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    specs.sort();
    specs
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            if p.is_dir() { dir_bytes(&p) } else { p.metadata().unwrap().len() }
        })
        .sum()
}

#[test]
#[cfg_attr(debug_assertions, ignore = "runs every shipped sweep in full: release only (.ci/run)")]
fn every_shipped_sweep_keeps_its_report_small_and_its_quoted_numbers_true() {
    let dir = crate::temp_dir("claims");
    let mut problems = Vec::new();
    let mut runs = BTreeMap::new();
    for spec in shipped_sweeps() {
        let name = spec.file_stem().unwrap().to_string_lossy().into_owned();
        let out = dir.join(&name);
        let o = Command::new(env!("CARGO_BIN_EXE_opal-sweep"))
            .args([spec.to_str().unwrap(), "-q", "-o", out.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
        let r =
            Command::new(env!("CARGO_BIN_EXE_opal-sweep")).args(["report", out.to_str().unwrap()]).output().unwrap();
        assert!(r.status.success(), "{name} report: {}", String::from_utf8_lossy(&r.stderr));
        let bytes = dir_bytes(&out.join("report"));
        if bytes > MAX_REPORT_BYTES {
            problems.push(format!("{name}: report of {bytes} bytes (at most {MAX_REPORT_BYTES})"));
        }
        runs.insert(name, out);
    }
    let claims: Claims = toml::from_str(&std::fs::read_to_string(Path::new(ROOT).join("tests/claims.toml")).unwrap())
        .unwrap_or_else(|e| panic!("tests/claims.toml: {e}"));
    for c in &claims.claim {
        let source = std::fs::read_to_string(Path::new(ROOT).join(&c.file)).unwrap();
        // Compare as running text: comment markers and line breaks are not part of it.
        let flat = |t: &str| {
            t.lines()
                .map(|l| l.trim_start_matches('#').trim())
                .collect::<Vec<_>>()
                .join(" ")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        if !flat(&source).contains(&flat(&c.text)) {
            problems.push(format!("{}: no longer says {:?} (update tests/claims.toml with the text)", c.file, c.text));
            continue;
        }
        let Some(out) = runs.get(&c.sweep) else {
            problems.push(format!("{}: no shipped sweep {}", c.file, c.sweep));
            continue;
        };
        let r = &Runs::read(out, &c.table);
        for n in &c.numbers {
            if !c.text.contains(&n.quoted) {
                problems.push(format!("{}: {:?} is not in {:?}", c.file, n.quoted, c.text));
            }
            match compute(r, &c.point, n) {
                Ok(v) if agrees(&n.quoted, v) => {}
                Ok(v) => problems.push(format!(
                    "{}: {:?} quotes {} for {} but the run gives {v:.4} ({} {:?})",
                    c.file,
                    c.text,
                    n.quoted,
                    n.column,
                    c.sweep,
                    c.point.to_string()
                )),
                Err(e) => problems.push(format!("{}: {:?}: {e}", c.file, c.text)),
            }
        }
    }
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_quoted_number_agrees_to_its_own_precision() {
    assert!(agrees("7.8", 7.84) && agrees("7.8", 7.76) && !agrees("7.8", 7.86) && !agrees("7.8", 7.7));
    assert!(agrees("2,000", 2000.4) && !agrees("2,000", 2000.6));
    assert!(agrees("-27", -26.6) && agrees("−27", -27.4) && agrees("0.98", 0.984) && !agrees("0.98", 0.99));
}
