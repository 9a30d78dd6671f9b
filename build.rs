//! Two things at build time:
//!
//! - the documentation of every key of the spec schema
//!   (`src/config/schema.rs`: each `pub` field's `///` lines, its type and
//!   its serde name) into `$OUT_DIR/schema_docs.rs`, so that `opal-sweep
//!   config` can comment every key it prints with the same words the code
//!   documents it with — one source for both;
//! - the shipped operator tables (`profiles/aiconfigurator/<system>/`,
//!   Parquet) read, checked and grouped by shape once, into
//!   `$OUT_DIR/aic-<system>.bin`, which the binary holds: a run decodes only
//!   the shapes its model asks for (reading every table at start-up cost
//!   ≈ 175 M instructions, four fifths of a one-request run).

#[path = "src/worker/perf/profile/aic_rows.rs"]
mod aic_rows;

use std::fmt::Write;

/// The systems whose tables ship (`src/worker/perf/profile/shipped.rs` names their presets).
const SYSTEMS: [&str; 4] = ["h100_sxm", "h200_sxm", "b200_sxm", "a100_sxm"];

fn main() {
    schema_docs();
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=src/worker/perf/profile/aic_rows.rs");
    for system in SYSTEMS {
        let dir = std::path::Path::new("profiles/aiconfigurator").join(system);
        let mut files = Vec::new();
        for name in [
            aic_rows::GEMM_FILE,
            aic_rows::CTX_FILE,
            aic_rows::GEN_FILE,
            aic_rows::ALLREDUCE_FILE,
            aic_rows::MOE_FILE,
            aic_rows::MLA_CTX_FILE,
            aic_rows::MLA_GEN_FILE,
        ] {
            let path = dir.join(name);
            println!("cargo:rerun-if-changed={}", path.display());
            // Every system has the first five; the MLA module tables only where measured (not A100).
            if !path.is_file() && aic_rows::OPTIONAL_FILES.contains(&name) {
                continue;
            }
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            files.push((name, bytes::Bytes::from(bytes)));
        }
        let grouped = aic_rows::Grouped::read(&files).unwrap_or_else(|e| panic!("the shipped tables of {system}: {e}"));
        std::fs::write(out.join(format!("aic-{system}.bin")), aic_rows::pack(&grouped))
            .expect("write the packed tables");
    }
}

/// `$OUT_DIR/schema_docs.rs`.
fn schema_docs() {
    let path = "src/config/schema.rs";
    println!("cargo:rerun-if-changed={path}");
    let text = std::fs::read_to_string(path).expect("the schema source");
    let mut out = String::from(
        "/// (struct, key, field type, doc) of every key of the spec schema.\npub const SCHEMA_DOCS: &[(&str, &str, &str, &str)] = &[\n",
    );
    let mut strukt: Option<String> = None;
    let mut doc: Vec<String> = Vec::new();
    let mut rename: Option<String> = None;
    for line in text.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("pub struct ") {
            strukt = rest.split([' ', '{', '(']).next().map(str::to_string);
            doc.clear();
            continue;
        }
        if t == "}" && !line.starts_with(' ') {
            strukt = None;
        }
        if let Some(d) = t.strip_prefix("///") {
            doc.push(d.trim().to_string());
            continue;
        }
        if let Some(r) = t.strip_prefix("#[serde(rename = \"") {
            rename = r.split('"').next().map(str::to_string);
            continue;
        }
        if t.starts_with("#[") {
            continue;
        }
        if let (Some(s), Some(field)) = (&strukt, t.strip_prefix("pub "))
            && let Some((name, ty)) = field.split_once(':')
        {
            let key = rename.take().unwrap_or_else(|| name.trim().to_string());
            let ty = ty.trim().trim_end_matches(',');
            let text = doc.join(" ");
            writeln!(out, "    ({s:?}, {key:?}, {ty:?}, {text:?}),").unwrap();
        }
        doc.clear();
        rename = None;
    }
    out.push_str("];\n");
    let dest = std::path::Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("schema_docs.rs");
    std::fs::write(dest, out).expect("write schema_docs.rs");
}
