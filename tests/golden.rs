//! Golden results: every shipped sweep (cut down), the shipped Opal
//! example, the reference benchmark's scenario (cut down) and the cases in
//! `tests/golden/` run with every table written, and each table's content
//! (every column but the wall-clock `wall_s` and the checkout-dependent
//! `run_key`) is digested and compared with
//! `tests/golden/digests.txt` column by column (so a changed number changes
//! one line and a new column adds one), recorded before the code was restructured.
//! A refactoring must leave every digest as it was; a deliberate model
//! change re-records them (`OPAL_BLESS=1 cargo test golden`) and says why in
//! its commit.

use crate::shipped::cut_down_table;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type, UInt32Type, UInt64Type};
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use opal::sweep::runner::{RunnerOptions, run_sweep};
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// FNV-1a, 64 bits: a digest that does not depend on the toolchain.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Feeds every cell of column `col` (nulls marked) to `h`.
fn digest_column(h: &mut Fnv, name: &str, col: &dyn Array) {
    for i in 0..col.len() {
        if col.is_null(i) {
            h.bytes(b"\xffnull");
            continue;
        }
        match col.data_type() {
            DataType::Float64 => h.bytes(&col.as_primitive::<Float64Type>().value(i).to_bits().to_le_bytes()),
            DataType::UInt64 => h.bytes(&col.as_primitive::<UInt64Type>().value(i).to_le_bytes()),
            DataType::UInt32 => h.bytes(&col.as_primitive::<UInt32Type>().value(i).to_le_bytes()),
            DataType::Int64 => h.bytes(&col.as_primitive::<Int64Type>().value(i).to_le_bytes()),
            DataType::Boolean => h.bytes(&[u8::from(col.as_boolean().value(i))]),
            DataType::Utf8 => h.bytes(col.as_string::<i32>().value(i).as_bytes()),
            DataType::Binary => h.bytes(col.as_binary::<i32>().value(i)),
            other => panic!("column {name} has a type the golden digest does not know: {other}"),
        }
    }
}

/// Every case: (name, spec text, the path it is read as).
fn cases() -> Vec<(String, String, PathBuf)> {
    let root = Path::new(ROOT);
    let mut out = Vec::new();
    let mut add_dir = |dir: &Path, prefix: &str, cut: bool| {
        let mut specs: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
            .collect();
        specs.sort();
        for path in specs {
            let name = format!("{prefix}{}", path.file_stem().unwrap().to_string_lossy());
            let table = crate::shipped::spec_table(&path);
            let text = if cut { cut_down_table(table) } else { toml::to_string(&table).unwrap() };
            out.push((name, text, path));
        }
    };
    add_dir(&root.join("sweeps"), "sweeps/", true);
    add_dir(&root.join("tests/golden"), "golden/", false);
    let reference = root.join("benches/reference.toml");
    let table: toml::Table = std::fs::read_to_string(&reference).unwrap().parse().unwrap();
    out.push(("benches/reference".into(), cut_down_table(table), reference));
    let json = root.join("examples/opal/exponential-12rps.json");
    let imported = opal::config::load_spec(&json).unwrap();
    out.push(("examples/opal".into(), cut_down_table(imported.table), json.with_extension("toml")));
    out
}

/// Every column of every table of every case, as `case table.column rows
/// digest` lines: a number that changes changes one line, a new column adds one.
fn record() -> String {
    let dir = crate::temp_dir("golden");
    let mut lines = String::new();
    for (name, text, path) in cases() {
        let mut table: toml::Table = text.parse().unwrap();
        let sweep = table.entry("sweep").or_insert(toml::Value::Table(toml::Table::new())).as_table_mut().unwrap();
        let all = opal::output::TableKind::WRITE_ORDER.iter().map(|t| toml::Value::String(t.name().into())).collect();
        sweep.insert("tables".into(), toml::Value::Array(all));
        sweep.insert("report".into(), toml::Value::Boolean(false));
        let spec = opal::config::Spec::from_text(&toml::to_string(&table).unwrap(), &path)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let plan = opal::sweep::plan(&spec).unwrap_or_else(|e| panic!("{name}: {e}"));
        let out = dir.join(name.replace('/', "-"));
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
        for t in &plan.tables.tables {
            let batches = opal::output::read_table(&out.join(t.file_name())).unwrap_or_else(|e| panic!("{e}"));
            let Some(schema) = batches.first().map(RecordBatch::schema) else { continue };
            // `wall_s` is the clock's; `run_key` hashes the resolved
            // scenario, whose trace paths are absolute, so it differs
            // between checkouts (CI clones elsewhere).
            let columns: Vec<&str> = schema
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .filter(|n| !["wall_s", "run_key"].contains(n))
                .collect();
            let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
            for c in columns {
                let mut h = Fnv::new();
                for b in &batches {
                    digest_column(&mut h, c, b.column_by_name(c).expect("every batch has the schema's columns"));
                }
                writeln!(lines, "{name} {}.{c} {rows} {:016x}", t.name(), h.0).unwrap();
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    lines
}

#[test]
fn every_table_of_every_golden_case_is_as_recorded() {
    let file = Path::new(ROOT).join("tests/golden/digests.txt");
    let now = record();
    if std::env::var_os("OPAL_BLESS").is_some() {
        std::fs::write(&file, &now).unwrap();
        return;
    }
    let recorded = std::fs::read_to_string(&file).unwrap();
    // Keyed by `case table.column`: what changed, what is new, what is gone.
    let keyed = |text: &str| -> std::collections::BTreeMap<String, String> {
        text.lines()
            .filter_map(|l| {
                let mut parts = l.splitn(3, ' ');
                Some((format!("{} {}", parts.next()?, parts.next()?), parts.next()?.to_string()))
            })
            .collect()
    };
    let (was, is) = (keyed(&recorded), keyed(&now));
    let mut report = Vec::new();
    for (k, v) in &is {
        match was.get(k) {
            Some(w) if w == v => {}
            Some(w) => report.push(format!("  changed {k}: {w} -> {v}")),
            None => report.push(format!("  new     {k}: {v}")),
        }
    }
    report.extend(was.keys().filter(|k| !is.contains_key(*k)).map(|k| format!("  gone    {k}")));
    assert!(
        report.is_empty(),
        "{} of {} columns differ from tests/golden/digests.txt (OPAL_BLESS=1 re-records them):\n{}",
        report.len(),
        was.len(),
        report.join("\n")
    );
}
