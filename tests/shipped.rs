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

/// `text` with one replicate and small stages.
fn cut_down(text: &str) -> String {
    let mut t: toml::Table = text.parse().unwrap();
    let sweep = t.entry("sweep").or_insert(toml::Value::Table(toml::Table::new())).as_table_mut().unwrap();
    sweep.insert("replicates".into(), toml::Value::Integer(1));
    sweep.insert("report".into(), toml::Value::Boolean(false));
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
        let text = cut_down(&std::fs::read_to_string(path).unwrap());
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
            if t.name() != "runs" {
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
