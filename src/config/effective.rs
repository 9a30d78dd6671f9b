//! The effective scenario: what a spec runs, with every key written out —
//! defaults filled in, the GPU preset's numbers, the sizes derived from the
//! model (context length, slots) and each tier's device — as TOML that runs
//! to the same results, each key commented with its documentation (taken
//! from the schema's doc comments at build time, see `build.rs`).

use super::Scenario;
use super::schema::{
    RagParams, RateParams, Sc25Params, SessionsParams, SpecFile, TierParams, TraceParams, VllmBenchParams,
};
use crate::kvcache::Tier;
use std::fmt::Write;
use std::path::Path;

include!(concat!(env!("OUT_DIR"), "/schema_docs.rs"));

/// Every key of the spec schema, as `(struct, key)`.
pub fn schema_keys() -> impl Iterator<Item = (&'static str, &'static str)> {
    SCHEMA_DOCS.iter().map(|&(s, k, _, _)| (s, k))
}

/// The documentation and type of `key` of schema struct `strukt`.
fn doc(strukt: &str, key: &str) -> Option<(&'static str, &'static str)> {
    SCHEMA_DOCS.iter().find(|(s, k, _, _)| *s == strukt && *k == key).map(|&(_, _, ty, d)| (ty, d))
}

/// The struct a field's type names (`Option<X>`, `Vec<X>` → `X`).
fn inner(ty: &str) -> &str {
    let mut t = ty;
    for wrapper in ["Option<", "Vec<"] {
        if let Some(rest) = t.strip_prefix(wrapper) {
            t = rest.strip_suffix('>').unwrap_or(rest);
        }
    }
    t
}

/// `file`'s scenario sections (not `[sweep]` or the axes) with every key
/// written out, as a TOML table; `base_dir` is the directory its relative
/// paths resolve against (they are written absolute). With `scenario`
/// (`file` resolved) the values derived from presets and the model are
/// written too — the GPU's numbers, the context length, the slots — which
/// then no longer follow a change of GPU or model; without, those keys keep
/// their defaults' meaning (an axis may vary the GPU).
pub fn effective_table(file: &SpecFile, scenario: Option<&Scenario>, base_dir: &Path) -> Result<toml::Table, String> {
    let mut f = file.clone();
    f.sweep = Default::default();
    f.grid = toml::Table::new();
    f.zip = Vec::new();
    if let Some(scenario) = scenario {
        let hw = &mut f.worker.hw;
        // A preset under another of its names (`H100-SXM`) is written as the preset it is.
        if crate::worker::presets::GpuSpec::preset(&hw.gpu).is_some() {
            hw.gpu.clone_from(&scenario.gpu.name);
        }
        hw.memory_gb.get_or_insert(scenario.gpu.memory_gb);
        hw.tflops.get_or_insert(scenario.gpu.tflops);
        if hw.tflops_fp8.is_none() {
            hw.tflops_fp8 = scenario.gpu.fp8_tflops;
        }
        hw.mem_bw_TBps.get_or_insert(scenario.gpu.mem_bw_tbps);
        // The board-power model the energy figures use (none when unknown).
        let power = &scenario.gpu.power;
        if power.max_w > 0.0 {
            hw.max_watts.get_or_insert(power.max_w);
            hw.idle_watts.get_or_insert(power.idle_w);
            hw.active_watts.get_or_insert(power.active_w);
            hw.compute_watts.get_or_insert(power.compute_w);
            hw.memory_watts.get_or_insert(power.memory_w);
        }
        f.worker.vllm_params.max_model_len.get_or_insert(scenario.worker.max_model_len);
        f.worker.slots.io_slots.get_or_insert(scenario.worker.io_slots);
        f.worker.slots.gpu_slots.get_or_insert(f.worker.vllm_params.max_num_seqs);
    }
    let absolute = |p: &str| base_dir.join(p).display().to_string();
    for (tier, p) in
        [(Tier::Cpu, &mut f.kvc.CPUMemory), (Tier::Nvme, &mut f.kvc.LocalNVMe), (Tier::Dfs, &mut f.kvc.DistributedFS)]
    {
        let (bw, lat, conc, cap) = super::resolve::tier_defaults(tier);
        let TierParams { bandwidth_GBps, latency_nsec, concurrency, capacity_GB, eviction_policy, .. } = p;
        bandwidth_GBps.get_or_insert(bw);
        latency_nsec.get_or_insert(lat);
        concurrency.get_or_insert(conc);
        capacity_GB.get_or_insert(cap);
        eviction_policy.get_or_insert_with(|| "lru".into());
    }
    if let Some(p) = &mut f.model.model_params.config_path {
        *p = absolute(p);
    }
    if let Some(p) = &mut f.model.model_params.config_dir {
        *p = absolute(p);
    }
    if let Some(p) = &mut f.worker.inference_params.table_path {
        *p = absolute(p);
    }
    // (Not when an axis varies the step model's keys: each point's model takes its own.)
    let varies_step_model = file
        .grid
        .keys()
        .chain(file.zip.iter().flat_map(|z| z.keys()))
        .any(|k| k.starts_with("worker.inference_params."));
    if !varies_step_model {
        fill_step_model_defaults(&mut f.worker.inference_params, &absolute);
    } else if let Some(p) = &mut f.worker.inference_params.profile
        && p != "auto"
        && p != "analytic"
    {
        *p = absolute(p);
    }
    let mut table = toml::Table::try_from(&f).map_err(|e| e.to_string())?;
    for key in ["sweep", "grid", "zip", "search"] {
        table.remove(key);
    }
    // Each stage's parameters with their type's defaults.
    let stages = table
        .get_mut("workload")
        .and_then(|w| w.get_mut("stages"))
        .and_then(toml::Value::as_array_mut)
        .ok_or("the workload has no stages")?;
    for (st, section) in stages.iter_mut().zip(&f.workload.stages) {
        let params = &section.workload_params;
        let full = match section.kind.to_ascii_lowercase().as_str() {
            "uniformreqrate" | "exponentialreqrate" => typed::<RateParams>(params)?,
            "trace" => {
                let mut t = typed::<TraceParams>(params)?;
                if let Some(toml::Value::String(p)) = t.get_mut("trace_file") {
                    *p = absolute(p);
                }
                t
            }
            "sc25workload" => typed::<Sc25Params>(params)?,
            "ragworkload" => typed::<RagParams>(params)?,
            "sessions" => typed::<SessionsParams>(params)?,
            "vllmbench" => {
                let mut t = typed::<VllmBenchParams>(params)?;
                if let Some(toml::Value::String(p)) = t.get_mut("result_file") {
                    *p = absolute(p);
                }
                t
            }
            other => return Err(format!("unknown workload type {other:?}")),
        };
        st.as_table_mut().ok_or("a stage is a table")?.insert("workload_params".into(), toml::Value::Table(full));
    }
    Ok(table)
}

/// The keys of the chosen step model, with their defaults where unset (a
/// profile directory made absolute); other models' keys stay unset.
fn fill_step_model_defaults(ip: &mut super::schema::InferenceParams, absolute: &dyn Fn(&str) -> String) {
    use super::schema::NumberOrString;
    match ip.model.to_ascii_lowercase().as_str() {
        "operators" => {
            match &mut ip.profile {
                Some(p) if p != "auto" && p != "analytic" => *p = absolute(p),
                Some(_) => {}
                None => ip.profile = Some("auto".into()),
            }
            ip.compute_scale.get_or_insert(1.0);
            ip.memory_scale.get_or_insert(1.0);
            ip.comm_scale.get_or_insert(1.0);
            ip.step_overhead_secs.get_or_insert(0.0);
            ip.seq_overhead_secs.get_or_insert(0.0);
            ip.prefill_overhead_secs.get_or_insert(0.0);
        }
        "roofline" => {
            ip.a.get_or_insert(NumberOrString::Number(4.0));
            ip.b.get_or_insert(NumberOrString::Number(24.0));
            ip.decode_bw_efficiency.get_or_insert(1.0);
            ip.step_overhead_secs.get_or_insert(0.0);
            ip.mixed_step.get_or_insert_with(|| "max".into());
            ip.prefill_batch.get_or_insert_with(|| "sum".into());
        }
        "synthetic" => {
            ip.mean_latency_secs.get_or_insert(1.0);
        }
        "table" => {
            ip.mixed_step.get_or_insert_with(|| "sum".into());
        }
        _ => {}
    }
}

fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(params: &toml::Table) -> Result<toml::Table, String> {
    let t: T = toml::Value::Table(params.clone()).try_into().map_err(|e: toml::de::Error| e.to_string())?;
    toml::Table::try_from(&t).map_err(|e| e.to_string())
}

/// The stage-parameter struct of a `type`.
fn stage_struct(kind: &str) -> &'static str {
    match kind.to_ascii_lowercase().as_str() {
        "trace" => "TraceParams",
        "sc25workload" => "Sc25Params",
        "ragworkload" => "RagParams",
        "sessions" => "SessionsParams",
        "vllmbench" => "VllmBenchParams",
        _ => "RateParams",
    }
}

/// `table` (an effective scenario, or any part of a spec) as TOML text with
/// every key and section commented with its documentation.
pub fn commented(table: &toml::Table) -> String {
    let mut out = String::new();
    section(&mut out, "", table, "SpecFile", false);
    out
}

/// The default scenario `table` as [`commented`] writes it, and then every
/// other key of the schema commented out: unset optional keys (`(unset)`;
/// each key's documentation says what that means), the study sections
/// (`[sweep]`, `[grid]`, `[[zip]]`, `[search]`, `[disaggregation]`) and the
/// other workload types' parameters, each with its default — a reference
/// that still runs to the default scenario.
pub fn reference(table: &toml::Table) -> String {
    let mut out = String::new();
    section(&mut out, "", table, "SpecFile", true);
    out.push_str("\n# The other workload types, each with its defaults:\n");
    for (kind, params) in [
        ("ExponentialReqRate", typed::<RateParams>(&toml::Table::new())),
        ("Trace", typed::<TraceParams>(&toml::Table::new())),
        ("SC25Workload", typed::<Sc25Params>(&toml::Table::new())),
        ("RAGWorkload", typed::<RagParams>(&toml::Table::new())),
        ("Sessions", typed::<SessionsParams>(&toml::Table::new())),
        ("VllmBench", typed::<VllmBenchParams>(&toml::Table::new())),
    ] {
        let params = params.expect("every stage type's defaults serialize");
        let mut block = format!("\n[[workload.stages]]\ntype = \"{kind}\"\n[workload.stages.workload_params]\n");
        section(&mut block, "workload.stages.workload_params", &params, stage_struct(kind), true);
        out.push_str(&commented_out(&block));
    }
    out
}

/// `text` with every line commented out (blank lines kept).
fn commented_out(text: &str) -> String {
    text.lines()
        .map(|l| if l.is_empty() || l.starts_with('#') { format!("{l}\n") } else { format!("# {l}\n") })
        .collect()
}

/// Whether a schema type is one of the schema's structs (a section).
fn is_struct(ty: &str) -> bool {
    let t = inner(ty);
    SCHEMA_DOCS.iter().any(|(s, _, _, _)| *s == t)
}

/// The serde defaults of an optional section's struct (none for a struct
/// with a required key).
fn section_defaults(strukt: &str) -> toml::Table {
    use super::schema::{DisaggregationSection, SearchSection, SweepSection};
    let t = match strukt {
        "SearchSection" => typed::<SearchSection>(&toml::Table::new()),
        "DisaggregationSection" => typed::<DisaggregationSection>(&toml::Table::new()),
        "SweepSection" => typed::<SweepSection>(&toml::Table::new()),
        _ => Ok(toml::Table::new()),
    };
    t.unwrap_or_default()
}

fn comment(out: &mut String, text: &str) {
    if !text.is_empty() {
        let _ = writeln!(out, "# {text}");
    }
}

/// A key as TOML writes it: bare when it can be, quoted otherwise.
fn key_text(k: &str) -> String {
    if !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        k.to_string()
    } else {
        toml::Value::String(k.to_string()).to_string()
    }
}

/// Writes `table` (of schema struct `strukt`) under `path`; with
/// `every_key`, the struct's keys the table leaves out too, commented out.
fn section(out: &mut String, path: &str, table: &toml::Table, strukt: &str, every_key: bool) {
    let join = |k: &str| if path.is_empty() { key_text(k) } else { format!("{path}.{}", key_text(k)) };
    // A table is a section unless the schema takes the key as a free value
    // (a length distribution, written inline).
    let inline = |k: &str| doc(strukt, k).is_some_and(|(ty, _)| ty.contains("toml::Value"));
    let is_section = |k: &str, v: &toml::Value| match v {
        toml::Value::Table(_) => !inline(k),
        toml::Value::Array(a) => !a.is_empty() && a.iter().all(toml::Value::is_table) && !inline(k),
        _ => false,
    };
    // Plain keys first (TOML requires them before sub-tables), then sections.
    for (k, v) in table.iter().filter(|(k, v)| !is_section(k, v)) {
        let d = doc(strukt, k).map_or("", |(_, d)| d);
        let _ = write!(out, "{} = {v}", key_text(k));
        if !d.is_empty() {
            let _ = write!(out, "  # {d}");
        }
        out.push('\n');
    }
    let absent: Vec<(&str, &str, &str)> = if every_key {
        SCHEMA_DOCS
            .iter()
            .filter(|(s, k, _, _)| *s == strukt && !table.contains_key(*k) && *k != "workload_params")
            .map(|&(_, k, ty, d)| (k, ty, d))
            .collect()
    } else {
        Vec::new()
    };
    let is_table = |ty: &str| is_struct(ty) || ty.ends_with("toml::Table>") || ty == "toml::Table";
    for &(k, _, d) in absent.iter().filter(|(_, ty, _)| !is_table(ty)) {
        let _ = write!(out, "# {} = (unset)", key_text(k));
        if !d.is_empty() {
            let _ = write!(out, "  # {d}");
        }
        out.push('\n');
    }
    for (k, v) in table.iter().filter(|(k, v)| is_section(k, v)) {
        let (ty, d) = doc(strukt, k).unwrap_or(("", ""));
        match v {
            toml::Value::Table(t) => {
                out.push('\n');
                comment(out, d);
                let _ = writeln!(out, "[{}]", join(k));
                section(out, &join(k), t, inner(ty), every_key);
            }
            toml::Value::Array(items) => {
                for item in items {
                    let t = item.as_table().expect("checked by is_section");
                    out.push('\n');
                    comment(out, d);
                    let _ = writeln!(out, "[[{}]]", join(k));
                    let kind = t.get("type").and_then(toml::Value::as_str).unwrap_or("");
                    let mut head = t.clone();
                    let params = head.remove("workload_params").filter(|_| !kind.is_empty());
                    section(out, &join(k), &head, inner(ty), every_key);
                    if let Some(toml::Value::Table(p)) = params {
                        let _ = writeln!(out, "[{}.workload_params]", join(k));
                        section(out, &format!("{}.workload_params", join(k)), &p, stage_struct(kind), every_key);
                    }
                }
            }
            _ => unreachable!("is_section admits tables and arrays of tables"),
        }
    }
    // Sections the table leaves out (a study's, or an optional one): commented out, with their defaults.
    for &(k, ty, d) in absent.iter().filter(|(_, ty, _)| is_table(ty)) {
        let mut block = String::from("\n");
        comment(&mut block, d);
        if ty.starts_with("Vec<") {
            let _ = writeln!(block, "[[{}]]", join(k));
        } else {
            let _ = writeln!(block, "[{}]", join(k));
        }
        if is_struct(ty) {
            section(&mut block, &join(k), &section_defaults(inner(ty)), inner(ty), true);
        }
        out.push_str(&commented_out(&block));
    }
}
