//! Every shipped sweep, cut down (one replicate, a few hundred requests per
//! run), run end to end: no table holds a NaN (missing values are null),
//! and no percentile exceeds the maximum of its own histogram.

use crate::sweep::read;
use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_array::types::Float64Type;
use opal::sweep::runner::{RunnerOptions, run_sweep};
use std::path::Path;
use std::sync::atomic::AtomicBool;

/// The spec at `path` as one table: with `sweep.base`, the base scenario
/// (relative to the spec) with the spec's own sections over it, as
/// `opal-sweep` reads it.
pub fn spec_table(path: &Path) -> toml::Table {
    let mut t: toml::Table = std::fs::read_to_string(path).unwrap().parse().unwrap();
    let base = t.get_mut("sweep").and_then(|s| s.as_table_mut()).and_then(|s| s.remove("base"));
    let Some(base) = base else { return t };
    let base_path = path.parent().unwrap().join(base.as_str().unwrap());
    let mut merged: toml::Table = std::fs::read_to_string(base_path).unwrap().parse().unwrap();
    merged.extend(t);
    merged
}

/// The spec at `path` with one replicate and small stages.
fn cut_down(path: &Path) -> String {
    cut_down_table(spec_table(path))
}

pub fn cut_down_table(mut t: toml::Table) -> String {
    let sweep = t.entry("sweep").or_insert(toml::Value::Table(toml::Table::new())).as_table_mut().unwrap();
    sweep.insert("replicates".into(), toml::Value::Integer(1));
    sweep.insert("report".into(), toml::Value::Boolean(false));
    // A grid over run lengths (the run-length and steady-state studies): as
    // many short lengths, 150, 200, …
    if let Some(grid) = t.get_mut("grid").and_then(|g| g.as_table_mut()) {
        for (key, values) in grid.iter_mut() {
            if let (true, Some(list)) = (key.ends_with(".total_requests"), values.as_array_mut()) {
                for (i, v) in list.iter_mut().enumerate() {
                    *v = toml::Value::Integer(150 + 50 * i as i64);
                }
            }
        }
    }
    let stages = t.get_mut("workload").and_then(|w| w.get_mut("stages")).and_then(|s| s.as_array_mut()).unwrap();
    for st in stages {
        let kind = st["type"].as_str().unwrap().to_string();
        let p = st.as_table_mut().unwrap().entry("workload_params").or_insert(toml::Value::Table(toml::Table::new()));
        let p = p.as_table_mut().unwrap();
        match kind.as_str() {
            "Sessions" => drop(p.insert("total_sessions".into(), toml::Value::Integer(20))),
            "SC25Workload" => drop(p.insert(
                "prompt_sizes".into(),
                toml::Value::Array(vec![toml::Value::Integer(4092), toml::Value::Integer(8184)]),
            )),
            _ => drop(p.insert("total_requests".into(), toml::Value::Integer(150))),
        }
    }
    toml::to_string(&t).unwrap()
}

#[test]
fn shipped_sweeps_write_no_nan_and_no_percentile_above_its_max() {
    let dir = crate::temp_dir("shipped");
    let mut specs: Vec<_> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/sweeps"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    specs.sort();
    assert!(specs.len() >= 8);
    let mut checked = 0;
    for path in &specs {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let text = cut_down(path);
        // As if read from its own place, so that relative paths hold.
        let spec = opal::config::Spec::from_text(&text, path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let plan = opal::sweep::plan(&spec).unwrap_or_else(|e| panic!("{name}: {e}"));
        let out = dir.join(&name);
        let opts = RunnerOptions {
            output: out.clone(),
            jobs: None,
            shard: None,
            resume: false,
            overwrite: true,
            progress: false,
        };
        let report = run_sweep(&plan, &opts, &AtomicBool::new(false)).unwrap();
        assert!(report.failures.is_empty(), "{name}: {:?}", report.failures);
        for t in plan.tables.tables.iter() {
            let b = read(&out.join(t.file_name()));
            for (field, col) in b.schema().fields().iter().zip(b.columns()) {
                if let Some(f) = col.as_primitive_opt::<Float64Type>() {
                    let nan = f.iter().flatten().filter(|v| v.is_nan()).count();
                    assert_eq!(nan, 0, "{name}: {}.{} holds {nan} NaN", t.name(), field.name());
                }
            }
            if t.name() != "runs" && t.name() != "stages" {
                continue;
            }
            for field in b.schema().fields() {
                let Some(metric) = field.name().strip_suffix("_max_ms") else { continue };
                let max = b.column_by_name(field.name()).unwrap().as_primitive::<Float64Type>().clone();
                for q in ["p50", "p90", "p95", "p99", "p999"] {
                    let p =
                        b.column_by_name(&format!("{metric}_{q}_ms")).unwrap().as_primitive::<Float64Type>().clone();
                    for i in 0..b.num_rows() {
                        if p.is_valid(i) && max.is_valid(i) {
                            assert!(
                                p.value(i) <= max.value(i),
                                "{name}: {metric} {q} {} > max {}",
                                p.value(i),
                                max.value(i)
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 500, "{checked} percentiles compared with their max");
    let _ = std::fs::remove_dir_all(Path::new(&dir));
}

/// The runs table of `plan` run into `out`, without its wall-clock column.
fn runs_of(plan: &opal::sweep::SweepPlan, out: &Path) -> arrow_array::RecordBatch {
    let opts = RunnerOptions {
        output: out.to_path_buf(),
        jobs: None,
        shard: None,
        resume: false,
        overwrite: true,
        progress: false,
    };
    run_sweep(plan, &opts, &AtomicBool::new(false)).unwrap();
    let mut b = read(&out.join("runs.parquet"));
    b.remove_column(b.schema().index_of("wall_s").unwrap());
    b
}

#[test]
fn the_effective_configuration_runs_to_the_same_results() {
    let dir = crate::temp_dir("effective");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cases: Vec<(std::path::PathBuf, String)> =
        ["policy-rate", "dfs-bandwidth", "sessions", "sc25-tiers", "rag"]
            .iter()
            .map(|n| {
                let p = root.join(format!("sweeps/{n}.toml"));
                let text = cut_down(&p);
                (p, text)
            })
            .collect();
    // The Opal JSON example, imported.
    let json = root.join("examples/opal/exponential-12rps.json");
    let imported = opal::config::load_spec(&json).unwrap();
    cases.push((json.with_extension("toml"), cut_down_table(imported.table)));
    for (i, (path, text)) in cases.iter().enumerate() {
        let spec = opal::config::Spec::from_text(text, path).unwrap();
        let effective = opal::sweep::effective_config(&spec, None).unwrap();
        // Written out where nothing relative would resolve: every path in it is absolute.
        let elsewhere = dir.join(format!("effective-{i}.toml"));
        std::fs::write(&elsewhere, &effective).unwrap();
        let again = opal::config::load_spec(&elsewhere).unwrap_or_else(|e| panic!("{e}\n{effective}"));
        let (a, b) = (opal::sweep::plan(&spec).unwrap(), opal::sweep::plan(&again).unwrap());
        assert_eq!(
            runs_of(&a, &dir.join(format!("a-{i}"))),
            runs_of(&b, &dir.join(format!("b-{i}"))),
            "{}: the effective configuration runs differently (run keys included)",
            path.display()
        );
        // Every key commented.
        let keys = effective.lines().filter(|l| l.contains(" = ") && !l.starts_with('#') && !l.starts_with('"'));
        assert!(keys.clone().count() > 60, "{effective}");
        for line in keys {
            assert!(line.contains("  # "), "{}: uncommented key: {line}", path.display());
        }
    }
    // One grid point alone equals that point of the sweep.
    let (path, text) = &cases[0];
    let spec = opal::config::Spec::from_text(text, path).unwrap();
    let point = opal::sweep::effective_config(&spec, Some(5)).unwrap();
    assert!(!point.contains("[grid]"));
    let point_spec = opal::config::Spec::from_text(&point, &dir.join("point.toml")).unwrap();
    let alone = runs_of(&opal::sweep::plan(&point_spec).unwrap(), &dir.join("point"));
    let all = runs_of(&opal::sweep::plan(&spec).unwrap(), &dir.join("all"));
    let key = |b: &arrow_array::RecordBatch, i: usize| {
        b.column_by_name("run_key").unwrap().as_primitive::<arrow_array::types::UInt64Type>().value(i)
    };
    assert_eq!(key(&alone, 0), key(&all, 5), "the point's run has the same identity alone");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every shipped study's terminal table, piped (120 columns): no line is
/// wider, and every row's axis values (continuation lines included) tell
/// it apart from the others (issue 27: paths were printed whole and cut).
#[test]
fn every_shipped_studys_sweep_table_fits_120_columns_and_tells_its_rows_apart() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut specs: Vec<_> = std::fs::read_dir(root.join("sweeps")).unwrap().map(|e| e.unwrap().path()).collect();
    specs.retain(|p| p.extension().is_some_and(|e| e == "toml"));
    specs.sort();
    assert!(specs.len() >= 10);
    for path in specs {
        let spec = opal::config::load_spec(&path).unwrap_or_else(|e| panic!("{e}"));
        let plan = opal::sweep::plan(&spec).unwrap_or_else(|e| panic!("{e}"));
        let points = (0..plan.points.len() as u32).map(|id| (id, Default::default())).collect();
        let table = opal::report::text::sweep_table(&plan, &points, 120);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines.iter().all(|l| l.chars().count() <= 120), "{}:\n{table}", path.display());
        // Rows: a line starting with its point id; continuation lines start with blanks.
        let header = lines.iter().find(|l| l.starts_with("point")).expect("a header");
        let at = header.find("axis values").expect("an axis column");
        let mut rows: Vec<String> = Vec::new();
        for l in &lines {
            if l.starts_with("steady state") || l.starts_with("axis values, in this order") || l.starts_with("point") {
                continue;
            }
            if l.split_whitespace().next().is_some_and(|w| w.parse::<u32>().is_ok()) && !l.starts_with("      ") {
                rows.push(l.chars().skip(at).collect());
            } else {
                rows.last_mut().expect("a continuation follows a row").push_str(l.trim());
            }
        }
        assert_eq!(rows.len(), plan.points.len(), "{}:\n{table}", path.display());
        let distinct: std::collections::BTreeSet<&String> = rows.iter().collect();
        if plan.points.len() > 1 {
            assert_eq!(distinct.len(), rows.len(), "{}:\n{table}", path.display());
        }
    }
}
