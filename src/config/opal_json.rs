//! Import of the Python Opal's JSON configurations (`configs/defaults.json`
//! and files of its shape), unchanged.
//!
//! The JSON has the same sections and key names as a TOML scenario, so the
//! import is a translation plus these adjustments, each reported:
//!
//! - **Renamed keys**: `enable_gpu_apc` (Opal's switch for GPU prefix
//!   caching, under `worker.vllm_params` or `worker.worker_params`) becomes
//!   `worker.vllm_params.enable_prefix_caching`.
//! - **The model `hf_url` names** (a Hugging Face id such as
//!   `meta-llama/Llama-3.1-70B`, or its URL; Opal downloads its
//!   `config.json`): a preset of that name, else the `config.json` in the
//!   local Hugging Face cache, else an error that says how to provide it —
//!   never the default model.
//! - **Opal's defaults where ours differ**: a key the JSON does not set gets
//!   the value Opal would use — GPU prefix caching off and the whole of
//!   `memory_gb` for vLLM (`gpu_memory_utilization = 1`), trace timestamps in
//!   seconds (`multiplier_to_sec = 1`, where our default reads Mooncake's
//!   milliseconds), and Opal's prompts for its synthetic stages (every prompt
//!   of n tokens is `list(range(n))`: `prompt_content = "single_sequence"`)
//!   — so the imported scenario means what it meant to Opal.
//! - **The original's KV and batch rules**, where the JSON leaves them out:
//!   KV stored when a request completes (`kvc.save_timing = "on_finish"`:
//!   `opal/vllm_worker.py`'s only `kvc_manager.store` call is in
//!   `_handle_completed_requests`), a hit read from the tier holding it and
//!   copied nowhere (`kvc.write_back_hits = false`: its `retrieve` reads
//!   and `batched_put` only stores), and a roofline batch's prefill priced
//!   as its longest request's (`worker.inference_params.prefill_batch =
//!   "max"`, its `_calculate_batch_time`). Native scenarios keep vLLM's and
//!   LMCache's rules (KV saved as computed, hits written back to CPU
//!   memory, a batch's prefill work summed).
//! - **Opal keys with no counterpart** ([`OPAL_ONLY_KEYS`]: progress bars,
//!   wall-clock caps, knobs of Opal engines not modelled here) are removed
//!   and listed by name; nothing is dropped silently. Any other unknown key
//!   is a mistake (a typo such as `request_rte`) and an error that names the
//!   closest valid key. `null` values mean "the default".
//!
//! Relative paths are resolved against the JSON file's directory, or —
//! Opal's convention, where paths are relative to the directory it runs
//! from — against the current directory when only that one exists.

use super::error::{ConfigError, line_of};
use std::path::{Path, PathBuf};

/// An Opal JSON configuration translated into a scenario table.
#[derive(Clone, Debug, Default)]
pub struct Imported {
    /// The scenario, as a TOML table with our key names.
    pub table: toml::Table,
    /// Dotted keys that have no counterpart here and were left out.
    pub ignored: Vec<String>,
    /// Renamed keys, Opal defaults applied, paths re-anchored.
    pub notes: Vec<String>,
}

/// A key whose default differs here, and Opal's value for it.
struct OpalDefault {
    section: &'static str,
    key: &'static str,
    value: fn() -> toml::Value,
    why: &'static str,
}

/// Set when the JSON leaves them out.
const OPAL_DEFAULTS: [OpalDefault; 6] = [
    OpalDefault {
        section: "worker.inference_params",
        key: "model",
        value: || toml::Value::String("roofline".into()),
        why: "Opal prices steps with its a/b roofline",
    },
    OpalDefault {
        section: "worker.vllm_params",
        key: "enable_prefix_caching",
        value: || toml::Value::Boolean(false),
        why: "Opal's GPU prefix caching is off unless enabled",
    },
    OpalDefault {
        section: "worker.vllm_params",
        key: "gpu_memory_utilization",
        value: || toml::Value::Float(1.0),
        why: "Opal gives vLLM all of memory_gb",
    },
    OpalDefault {
        section: "worker.worker_params",
        key: "periodic_infra_update_time",
        value: || toml::Value::Float(30.0),
        why: "Opal's configs/defaults.json reports load every 30 s",
    },
    OpalDefault {
        section: "kvc",
        key: "save_timing",
        value: || toml::Value::String("on_finish".into()),
        why: "Opal stores a request's KV when it completes: its only kvc_manager.store call is in _handle_completed_requests",
    },
    OpalDefault {
        section: "kvc",
        key: "write_back_hits",
        value: || toml::Value::Boolean(false),
        why: "Opal's retrieve reads a chunk from the tier holding it and copies it nowhere",
    },
];

/// Keys of the Python Opal's configuration that have no counterpart here
/// (dotted, `*` for any list index), from its `configs/defaults.json`,
/// `configs/defaults_apc.json` and its wiki's configuration reference:
/// removed with a warning.
pub const OPAL_ONLY_KEYS: [&str; 18] = [
    "simulation.save_simulation_data",
    "simulation.show_progress",
    "simulation.max_wall_time_sec",
    "worker.worker_params.worker_local_queue_capacity",
    "worker.vllm_params.lookahead_reqs",
    "worker.vllm_params.apc_eviction_policy",
    "worker.vllm_params.hbm_eviction_threshold",
    "worker.vllm_params.apc_eviction_check_interval_sec",
    "worker.hw.tflops_fp16",
    "worker.hw.tflops_fp32",
    "worker.hw.tflops_fp4",
    "worker.hw.num_gpus",
    "worker.inference_params.compute_efficiency",
    "worker.inference_params.memory_efficiency",
    "workload.stages.*.workload_params.a_override",
    "workload.stages.*.workload_params.b_override",
    // IBM/opal-sim's later `configs/defaults.json` (its latency-window router knobs).
    "router.router_params.latency_percentile",
    "router.router_params.latency_window",
];

/// Whether dotted `key` matches `pattern` (`*` matches any list index).
fn matches(pattern: &str, key: &str) -> bool {
    let (p, k): (Vec<&str>, Vec<&str>) = (pattern.split('.').collect(), key.split('.').collect());
    p.len() == k.len() && p.iter().zip(&k).all(|(p, k)| p == k || (*p == "*" && k.parse::<usize>().is_ok()))
}

/// Keys that hold file paths (dotted, `*` for any list index).
const PATH_KEYS: [&str; 4] = [
    "model.model_params.config_dir",
    "model.model_params.config_path",
    "worker.inference_params.table_path",
    "workload.stages.*.workload_params.trace_file",
];

/// Translates the JSON `text` of the file at `path`; `validate` checks a
/// candidate table and returns the first problem (used to find keys with no
/// counterpart, which are removed one by one).
pub fn import(
    text: &str,
    path: &Path,
    validate: impl Fn(&toml::Table) -> Result<(), ConfigError>,
) -> Result<Imported, ConfigError> {
    let source = path.display().to_string();
    let json: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        let at = offset_of(text, e.line(), e.column());
        let value = text[at.min(text.len())..].trim_start();
        let hint = if ["NaN", "Infinity", "-Infinity"].iter().any(|w| value.starts_with(w))
            || ["NaN", "Infinity"].iter().any(|w| text[..at.min(text.len())].trim_end().ends_with(w))
        {
            "JSON has no NaN or Infinity: give a number"
        } else if e.to_string().starts_with("number out of range") {
            "give a number a 64-bit float holds (up to about 1.8e308)"
        } else {
            "fix the syntax at that line (keys and strings need double quotes, no trailing commas)"
        };
        let mut err = ConfigError::file(&source, format!("invalid JSON: {e}")).hint(hint).schema();
        err.line = Some(e.line());
        err.key = json_path_at(text, at).filter(|k| !k.is_empty());
        err
    })?;
    if let Some((key, line)) = duplicate_key(text) {
        let mut err = ConfigError::key(&source, &key, "is set twice in the same object (JSON keeps only the last)")
            .hint("set it once: remove one of the two")
            .schema();
        err.line = Some(line);
        return Err(err);
    }
    let serde_json::Value::Object(map) = json else {
        return Err(ConfigError::file(&source, "an Opal configuration is a JSON object")
            .hint("wrap the sections in { … }")
            .schema());
    };
    let mut out = Imported::default();
    out.table = to_table(map, "", &mut out.notes);
    rename_gpu_apc(&mut out);
    for OpalDefault { section, key, value, why } in OPAL_DEFAULTS {
        let t = table_at(&mut out.table, section);
        if !t.contains_key(key) {
            t.insert(key.to_string(), value());
            out.notes.push(format!("{section}.{key} = {} ({why})", t[key]));
        }
    }
    other_models_keys(&mut out);
    opal_batch_pricing(&mut out);
    trace_seconds(&mut out);
    opal_prompts(&mut out);
    renamed_stage_keys(&mut out);
    let in_json = |mut e: ConfigError| {
        e.file = source.clone();
        if let Some(k) = &e.key {
            e.line = json_line(text, k);
        }
        e
    };
    model_from_hf_url(&mut out).map_err(in_json)?;
    anchor_paths(&mut out, path.parent().unwrap_or(Path::new(".")));
    // Remove Opal's keys the schema does not know, one at a time, until it
    // validates or fails for another reason (a real error in the file).
    for _ in 0..1000 {
        match validate(&out.table) {
            Ok(()) => break,
            Err(e) if e.unknown_key => {
                let key = e.key.clone().unwrap_or_default();
                if !OPAL_ONLY_KEYS.iter().any(|p| matches(p, &key)) || !remove_path(&mut out.table, &key) {
                    let mut e = in_json(e);
                    e.message.push_str(" (not a key of the Python Opal either)");
                    return Err(e);
                }
                out.ignored.push(key);
            }
            Err(e) => return Err(in_json(e)),
        }
    }
    Ok(out)
}

/// Opal's configurations carry every step model's keys (`mean_latency_secs`
/// beside a roofline's `a` and `b`); here a key of another model is an
/// error, so those the chosen model does not use are left out, and noted.
fn other_models_keys(out: &mut Imported) {
    let t = table_at(&mut out.table, "worker.inference_params");
    let model = t.get("model").and_then(toml::Value::as_str).unwrap_or("roofline").to_string();
    for (key, _) in super::schema::foreign_keys(t, &model) {
        t.remove(key);
        out.notes.push(format!("worker.inference_params.{key} left out (the {model} step model does not use it)"));
    }
}

/// Opal's roofline prices a batch's prefill as its longest request's
/// (`_calculate_batch_time`): an imported roofline does the same.
fn opal_batch_pricing(out: &mut Imported) {
    let t = table_at(&mut out.table, "worker.inference_params");
    let roofline = t.get("model").and_then(toml::Value::as_str).is_some_and(|m| m.eq_ignore_ascii_case("roofline"));
    if roofline && !t.contains_key("prefill_batch") {
        t.insert("prefill_batch".into(), toml::Value::String("max".into()));
        out.notes.push(
            "worker.inference_params.prefill_batch = \"max\" (Opal's _calculate_batch_time prices a batch's prefill as its longest request's)".into(),
        );
    }
}

/// The TOML text of an import of the JSON file `from`, headed by what was
/// renamed, defaulted and left out, to be written in directory `out_dir`
/// (relative paths are rewritten to stay valid from there).
pub fn to_toml(imported: &Imported, from: &Path, out_dir: &Path) -> String {
    let json_dir = from.parent().unwrap_or(Path::new("."));
    let mut table = imported.table.clone();
    visit_paths(&mut table, &PATH_KEYS, |_, value| {
        if let Some(p) = value.as_str().map(Path::new).filter(|p| p.is_relative()) {
            *value = toml::Value::String(rebase(&json_dir.join(p), out_dir).display().to_string());
        }
    });
    let mut head = format!("# Converted from the Opal configuration {} by opal-sweep convert.\n", from.display());
    for n in &imported.notes {
        head.push_str(&format!("# note: {n}\n"));
    }
    for k in &imported.ignored {
        head.push_str(&format!("# ignored (no counterpart here): {k}\n"));
    }
    head.push('\n');
    head + &toml::to_string_pretty(&table).expect("a table always serializes")
}

/// `target` as a path relative to directory `dir` (absolute if they share
/// nothing below the file-system root).
fn rebase(target: &Path, dir: &Path) -> PathBuf {
    let (Ok(t), Ok(d)) = (std::path::absolute(target), std::path::absolute(dir)) else { return target.to_path_buf() };
    let (t, d): (Vec<_>, Vec<_>) = (t.components().collect(), d.components().collect());
    let common = t.iter().zip(&d).take_while(|(a, b)| a == b).count();
    if common <= 1 {
        return t.iter().collect();
    }
    let mut out = PathBuf::new();
    for _ in common..d.len() {
        out.push("..");
    }
    out.extend(&t[common..]);
    out
}

fn to_table(map: serde_json::Map<String, serde_json::Value>, at: &str, notes: &mut Vec<String>) -> toml::Table {
    let mut t = toml::Table::new();
    for (k, v) in map {
        let here = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
        if let Some(v) = to_value(v, &here, notes) {
            t.insert(k, v);
        }
    }
    t
}

fn to_value(v: serde_json::Value, at: &str, notes: &mut Vec<String>) -> Option<toml::Value> {
    use serde_json::Value as J;
    Some(match v {
        J::Null => {
            notes.push(format!("{at} is null: the default applies"));
            return None;
        }
        J::Bool(b) => toml::Value::Boolean(b),
        J::Number(n) => match n.as_i64() {
            Some(i) => toml::Value::Integer(i),
            None => toml::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        J::String(s) => toml::Value::String(s),
        J::Array(items) => toml::Value::Array(
            items.into_iter().enumerate().filter_map(|(i, x)| to_value(x, &format!("{at}.{i}"), notes)).collect(),
        ),
        J::Object(m) => toml::Value::Table(to_table(m, at, notes)),
    })
}

fn table_at<'a>(root: &'a mut toml::Table, dotted: &str) -> &'a mut toml::Table {
    dotted.split('.').fold(root, |t, seg| {
        let slot = t.entry(seg.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !slot.is_table() {
            *slot = toml::Value::Table(toml::Table::new());
        }
        slot.as_table_mut().expect("made a table above")
    })
}

/// Opal's `multiplier_to_sec` defaults to 1 (ours to 0.001, for Mooncake's
/// milliseconds): a `Trace` stage of the JSON that leaves it out gets 1.
fn trace_seconds(out: &mut Imported) {
    let Some(stages) = out.table.get_mut("workload").and_then(|w| w.get_mut("stages")).and_then(|s| s.as_array_mut())
    else {
        return;
    };
    for (i, stage) in stages.iter_mut().enumerate() {
        let Some(stage) = stage
            .as_table_mut()
            .filter(|s| s.get("type").and_then(|t| t.as_str()).is_some_and(|t| t.eq_ignore_ascii_case("trace")))
        else {
            continue;
        };
        let params = stage.entry("workload_params").or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let Some(p) = params.as_table_mut().filter(|p| !p.contains_key("multiplier_to_sec")) {
            p.insert("multiplier_to_sec".into(), toml::Value::Float(1.0));
            out.notes.push(format!(
                "workload.stages.{i}.workload_params.multiplier_to_sec = 1.0 (Opal reads trace timestamps as seconds unless told)"
            ));
        }
    }
}

/// Opal's stage keys that have another name here (its RAG stage's
/// `max_concurrent_requests` is every stage's `max_outstanding_requests`).
fn renamed_stage_keys(out: &mut Imported) {
    let Some(stages) = out.table.get_mut("workload").and_then(|w| w.get_mut("stages")).and_then(|s| s.as_array_mut())
    else {
        return;
    };
    for (i, stage) in stages.iter_mut().enumerate() {
        let Some(p) = stage.get_mut("workload_params").and_then(toml::Value::as_table_mut) else { continue };
        for (old, new) in super::RENAMED {
            if let Some(v) = p.remove(old) {
                p.insert(new.into(), v);
                out.notes.push(format!("workload.stages.{i}.workload_params.{old} → {new}"));
            }
        }
    }
}

/// Opal's `UniformReqRate` and `ExponentialReqRate` prompts are
/// `list(range(n))`: every prompt is the start of one sequence. A stage of
/// the JSON that does not say otherwise gets that content model.
fn opal_prompts(out: &mut Imported) {
    let Some(stages) = out.table.get_mut("workload").and_then(|w| w.get_mut("stages")).and_then(|s| s.as_array_mut())
    else {
        return;
    };
    for (i, stage) in stages.iter_mut().enumerate() {
        let kind = stage.get("type").and_then(|t| t.as_str()).map(str::to_ascii_lowercase);
        let Some(stage) =
            stage.as_table_mut().filter(|_| matches!(kind.as_deref(), Some("uniformreqrate" | "exponentialreqrate")))
        else {
            continue;
        };
        let params = stage.entry("workload_params").or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let Some(p) = params.as_table_mut().filter(|p| !p.contains_key("prompt_content")) {
            p.insert("prompt_content".into(), toml::Value::String("single_sequence".into()));
            out.notes.push(format!(
                "workload.stages.{i}.workload_params.prompt_content = \"single_sequence\" (Opal's prompts are list(range(n)): each is the start of one sequence; default_prefix_length does not apply)"
            ));
        }
    }
}

/// The Hugging Face id in Opal's `hf_url` (an id such as
/// `meta-llama/Llama-3.1-70B`, or a `huggingface.co` URL of the model or
/// of a file in it).
fn hf_id(url: &str) -> &str {
    let id = url.trim().trim_end_matches('/');
    let id = id.strip_prefix("https://").or_else(|| id.strip_prefix("http://")).unwrap_or(id);
    let id = id.strip_prefix("huggingface.co/").or_else(|| id.strip_prefix("hf.co/")).unwrap_or(id);
    ["/resolve/", "/blob/", "/tree/"].iter().fold(id, |id, cut| id.split(cut).next().unwrap_or(id))
}

/// The `config.json` of Hugging Face model `id` in the local Hugging Face
/// cache (`$HF_HUB_CACHE`, `$HF_HOME/hub` or `~/.cache/huggingface/hub`),
/// where Opal's `AutoConfig.from_pretrained` leaves it.
fn hf_cached_config(id: &str) -> Option<PathBuf> {
    let hub = std::env::var_os("HF_HUB_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HF_HOME").map(|h| PathBuf::from(h).join("hub")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface/hub")))?;
    let repo = hub.join(format!("models--{}", id.replace('/', "--")));
    // The snapshot `refs/main` names, as `transformers` resolves it; else the only (or last) one.
    if let Ok(main) = std::fs::read_to_string(repo.join("refs/main")) {
        let path = repo.join("snapshots").join(main.trim()).join("config.json");
        if path.is_file() {
            return Some(path);
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(repo.join("snapshots"))
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("config.json")))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found.pop()
}

/// Maps `model.model_params.hf_url` to the model it names: a preset, or the
/// cached `config.json`; an error (saying how to provide one) otherwise.
fn model_from_hf_url(out: &mut Imported) -> Result<(), ConfigError> {
    let params = table_at(&mut out.table, "model.model_params");
    let Some(url) = params.remove("hf_url") else { return Ok(()) };
    let key = "model.model_params.hf_url";
    let Some(url) = url.as_str().map(str::to_string) else {
        return Err(ConfigError::key("", key, "must be a string")
            .hint("a Hugging Face id such as \"ibm-granite/granite-3.3-8b-instruct\"")
            .schema());
    };
    if let Some(other) = ["config_dir", "config_path"].into_iter().find(|k| params.contains_key(*k)) {
        return Err(ConfigError::key(
            "",
            key,
            format!("hf_url and {other} are both set (Opal refuses hf_url with config_dir too)"),
        )
        .hint(format!("keep one: hf_url for a Hugging Face model, or {other} for a local config.json"))
        .schema());
    }
    let id = hf_id(&url).to_string();
    let name = id.rsplit('/').next().unwrap_or(&id).to_string();
    let (value_key, value, what) = if crate::worker::model::ModelArch::preset(&id).is_some() {
        ("name", id.clone(), format!("the preset {name}"))
    } else if let Some(path) = hf_cached_config(&id) {
        let shown = path.display().to_string();
        ("config_path", shown.clone(), format!("the cached {shown}"))
    } else {
        return Err(ConfigError::key("", key, format!("{url:?} names {id}, which is neither a preset here nor in the local Hugging Face cache (opal-sweep does not download)"))
            .hint(format!(
                "download https://huggingface.co/{id}/blob/main/config.json and set model.model_params.config_path to it (and remove hf_url), or use a preset: {}",
                crate::worker::model::ModelArch::preset_list()
            ))
            .schema());
    };
    if let Some(old) = params.insert(value_key.into(), toml::Value::String(value)).filter(|_| value_key == "name") {
        out.notes.push(format!("model.model_params.name = {old} is replaced by the model hf_url names"));
    }
    out.notes.push(format!("{key} = {url:?} → {what}"));
    Ok(())
}

fn rename_gpu_apc(out: &mut Imported) {
    for section in ["worker.vllm_params", "worker.worker_params"] {
        let t = table_at(&mut out.table, section);
        if let Some(v) = t.remove("enable_gpu_apc") {
            table_at(&mut out.table, "worker.vllm_params").insert("enable_prefix_caching".into(), v);
            out.notes.push(format!("{section}.enable_gpu_apc → worker.vllm_params.enable_prefix_caching"));
        }
    }
    // `table_at` creates what it walks; an empty worker_params is harmless.
}

/// Resolves relative paths against the JSON's directory, or the current
/// directory when only that one has the file (noted).
fn anchor_paths(out: &mut Imported, json_dir: &Path) {
    let mut notes = Vec::new();
    visit_paths(&mut out.table, &PATH_KEYS, |key, value| {
        let Some(p) = value.as_str().map(PathBuf::from) else { return };
        if p.is_absolute() || json_dir.join(&p).exists() {
            return;
        }
        if let Ok(cwd) = std::env::current_dir()
            && cwd.join(&p).exists()
        {
            let abs = cwd.join(&p);
            notes.push(format!(
                "{key} = {:?} found relative to the current directory (Opal's convention): {}",
                p.display().to_string(),
                abs.display()
            ));
            *value = toml::Value::String(abs.display().to_string());
        }
    });
    out.notes.extend(notes);
}

fn visit_paths(table: &mut toml::Table, patterns: &[&str], mut f: impl FnMut(&str, &mut toml::Value)) {
    fn walk(v: &mut toml::Value, segs: &[&str], at: String, f: &mut dyn FnMut(&str, &mut toml::Value)) {
        let Some((seg, rest)) = segs.split_first() else {
            f(&at, v);
            return;
        };
        match v {
            toml::Value::Table(t) => {
                if let Some(x) = t.get_mut(*seg) {
                    walk(x, rest, format!("{at}.{seg}"), f);
                }
            }
            toml::Value::Array(items) if *seg == "*" => {
                for (i, x) in items.iter_mut().enumerate() {
                    walk(x, rest, format!("{at}.{i}"), f);
                }
            }
            _ => {}
        }
    }
    for p in patterns {
        let segs: Vec<&str> = p.split('.').collect();
        if let Some(x) = table.get_mut(segs[0]) {
            walk(x, &segs[1..], segs[0].to_string(), &mut f);
        }
    }
}

/// Removes the value at a dotted path (list items by index); false if absent.
fn remove_path(table: &mut toml::Table, dotted: &str) -> bool {
    let segs: Vec<&str> = dotted.split('.').collect();
    let Some((last, parents)) = segs.split_last() else { return false };
    let mut cur: &mut toml::Table = table;
    let mut i = 0;
    while i < parents.len() {
        let Some(next) = cur.get_mut(parents[i]) else { return false };
        match next {
            toml::Value::Table(t) => cur = t,
            toml::Value::Array(items) => {
                let Some(idx) = parents.get(i + 1).and_then(|s| s.parse::<usize>().ok()) else { return false };
                let Some(toml::Value::Table(t)) = items.get_mut(idx) else { return false };
                cur = t;
                i += 1;
            }
            _ => return false,
        }
        i += 1;
    }
    cur.remove(*last).is_some()
}

/// The line of the JSON text where the last segment of `key` appears as a key.
/// The byte offset of 1-based `line` and `column` in `text`.
fn offset_of(text: &str, line: usize, column: usize) -> usize {
    let start: usize = text.split_inclusive('\n').take(line.saturating_sub(1)).map(str::len).sum();
    (start + column.saturating_sub(1)).min(text.len())
}

/// The dotted path of the key whose value is being read at byte `at` of
/// the JSON `text` (the innermost object key, list indices included) — for
/// a message about a value the JSON parser refused, which names only a line.
fn json_path_at(text: &str, at: usize) -> Option<String> {
    // Per open container: the key (or index) under which the value being read sits.
    let mut stack: Vec<Option<String>> = Vec::new();
    let mut key: Option<String> = None;
    let (mut in_str, mut escaped, mut current) = (false, false, String::new());
    for c in text[..at.min(text.len())].chars() {
        if in_str {
            match c {
                _ if escaped => {
                    escaped = false;
                    current.push(c);
                }
                '\\' => escaped = true,
                '"' => in_str = false,
                _ => current.push(c),
            }
            continue;
        }
        match c {
            '"' => {
                in_str = true;
                current.clear();
            }
            ':' => key = Some(current.clone()),
            '{' => stack.push(key.take()),
            '[' => stack.push(Some(format!("{}\u{0}0", key.take().unwrap_or_default()))),
            ',' => {
                key = None;
                if let Some(Some(last)) = stack.last_mut()
                    && let Some((k, i)) = last.split_once('\u{0}')
                {
                    *last = format!("{k}\u{0}{}", i.parse::<usize>().unwrap_or(0) + 1);
                }
            }
            '}' | ']' => {
                stack.pop();
                key = None;
            }
            _ => {}
        }
    }
    let mut parts: Vec<String> = Vec::new();
    for k in stack.iter().flatten() {
        match k.split_once('\u{0}') {
            Some((k, i)) => {
                if !k.is_empty() {
                    parts.push(k.to_string());
                }
                parts.push(i.to_string());
            }
            None if !k.is_empty() => parts.push(k.clone()),
            None => {}
        }
    }
    parts.extend(key);
    Some(parts.join("."))
}

/// The first key set twice in one JSON object of `text` (serde keeps the
/// last silently), as a dotted path, and its second line.
fn duplicate_key(text: &str) -> Option<(String, usize)> {
    use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
    /// Walks a JSON value, failing at a repeated key with its path.
    struct Walk(String);
    impl<'de> DeserializeSeed<'de> for Walk {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Walk {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<(), A::Error> {
            let mut seen = std::collections::BTreeSet::new();
            while let Some(k) = m.next_key::<String>()? {
                let path = if self.0.is_empty() { k.clone() } else { format!("{}.{k}", self.0) };
                if !seen.insert(k) {
                    return Err(serde::de::Error::custom(format!("\u{0}{path}")));
                }
                m.next_value_seed(Walk(path))?;
            }
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<(), A::Error> {
            let mut i = 0;
            while s.next_element_seed(Walk(format!("{}.{i}", self.0)))?.is_some() {
                i += 1;
            }
            Ok(())
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let e = Walk(String::new()).deserialize(&mut de).err()?;
    let msg = e.to_string();
    let path = msg.split('\u{0}').nth(1)?.split(" at line ").next()?.to_string();
    Some((path, e.line()))
}

fn json_line(text: &str, key: &str) -> Option<usize> {
    let last = key.rsplit('.').find(|s| s.parse::<usize>().is_err())?;
    text.find(&format!("\"{last}\"")).map(|at| line_of(text, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remove_path_walks_tables_and_list_indices() {
        let mut t: toml::Table = "[[a]]\nx = 1\ny = 2\n[b]\nc = 3\n".parse().unwrap();
        assert!(remove_path(&mut t, "a.0.x"));
        assert!(remove_path(&mut t, "b.c"));
        assert!(!remove_path(&mut t, "b.c"));
        assert!(!remove_path(&mut t, "a.3.y"));
        assert_eq!(t.to_string(), "[[a]]\ny = 2\n\n[b]\n");
    }

    #[test]
    fn nulls_renames_and_opal_defaults_are_reported() {
        let json = r#"{"simulation": {"seed": null}, "worker": {"worker_params": {"enable_gpu_apc": true}}}"#;
        let out = import(json, Path::new("c.json"), |_| Ok(())).unwrap();
        assert!(out.table["simulation"].as_table().unwrap().is_empty());
        let vllm = out.table["worker"]["vllm_params"].as_table().unwrap();
        assert_eq!(
            vllm["enable_prefix_caching"].as_bool(),
            Some(true),
            "renamed, and not overridden by Opal's default"
        );
        assert_eq!(vllm["gpu_memory_utilization"].as_float(), Some(1.0));
        let notes = out.notes.join("\n");
        assert!(notes.contains("simulation.seed is null"), "{notes}");
        assert!(notes.contains("enable_gpu_apc → worker.vllm_params.enable_prefix_caching"), "{notes}");
        assert!(notes.contains("gpu_memory_utilization = 1.0"), "{notes}");
        // The original's defaults.json reports load every 30 s (ours: 5).
        assert_eq!(out.table["worker"]["worker_params"]["periodic_infra_update_time"].as_float(), Some(30.0));
        assert!(notes.contains("periodic_infra_update_time = 30.0"), "{notes}");
        // The original's KV and batch rules: stored at completion, hits
        // copied nowhere, a batch's prefill its longest request's.
        let kvc = out.table["kvc"].as_table().unwrap();
        assert_eq!((kvc["save_timing"].as_str(), kvc["write_back_hits"].as_bool()), (Some("on_finish"), Some(false)));
        let ip = out.table["worker"]["inference_params"].as_table().unwrap();
        assert_eq!((ip["model"].as_str(), ip["prefill_batch"].as_str()), (Some("roofline"), Some("max")));
        assert!(notes.contains("_handle_completed_requests") && notes.contains("_calculate_batch_time"), "{notes}");
        // A JSON that says otherwise keeps what it says; another step model gets no roofline key.
        let json = r#"{"kvc": {"save_timing": "on_compute"}, "worker": {"inference_params": {"model": "synthetic"}}}"#;
        let out = import(json, Path::new("c.json"), |_| Ok(())).unwrap();
        assert_eq!(out.table["kvc"]["save_timing"].as_str(), Some("on_compute"));
        assert!(!out.table["worker"]["inference_params"].as_table().unwrap().contains_key("prefill_batch"));
    }

    #[test]
    fn ibm_opal_router_keys_are_listed_and_left_out() {
        let json = r#"{"router": {"router_params": {"policy": "MaxPrefix", "latency_percentile": "p95", "latency_window": 50}}}"#;
        let (_, out) = crate::config::Spec::from_opal_json(json, Path::new("c.json")).unwrap();
        let router = out.table["router"]["router_params"].as_table().unwrap();
        assert_eq!(router.keys().collect::<Vec<_>>(), ["policy"]);
        let mut ignored = out.ignored.clone();
        ignored.sort();
        assert_eq!(ignored, ["router.router_params.latency_percentile", "router.router_params.latency_window"]);
    }

    #[test]
    fn a_trace_stage_without_multiplier_to_sec_reads_seconds_as_opal_does() {
        let json = r#"{"workload": {"stages": [
            {"type": "Trace", "workload_params": {"trace_file": "t.jsonl"}},
            {"type": "Trace", "workload_params": {"trace_file": "t.jsonl", "multiplier_to_sec": 0.001}},
            {"type": "UniformReqRate", "workload_params": {}},
            {"type": "trace", "workload_params": {"trace_file": "t.jsonl"}}]}}"#;
        let out = import(json, Path::new("c.json"), |_| Ok(())).unwrap();
        let stages = out.table["workload"]["stages"].as_array().unwrap();
        let m = |i: usize| stages[i]["workload_params"].get("multiplier_to_sec").and_then(|v| v.as_float());
        // Stage 3 is written as Opal's own defaults.json writes it ("trace").
        assert_eq!((m(0), m(1), m(2), m(3)), (Some(1.0), Some(0.001), None, Some(1.0)));
        assert!(out.notes.iter().any(|n| n.starts_with("workload.stages.0.workload_params.multiplier_to_sec = 1.0")));
    }

    #[test]
    fn a_rag_stages_max_concurrent_requests_becomes_max_outstanding_requests() {
        let json = r#"{"workload": {"stages": [
            {"type": "RAGWorkload", "workload_params": {"max_concurrent_requests": 3}}]}}"#;
        let out = import(json, Path::new("c.json"), |_| Ok(())).unwrap();
        let p = out.table["workload"]["stages"][0]["workload_params"].as_table().unwrap();
        assert_eq!(
            (p.get("max_outstanding_requests").and_then(|v| v.as_integer()), p.get("max_concurrent_requests")),
            (Some(3), None)
        );
        assert!(
            out.notes
                .iter()
                .any(|n| n == "workload.stages.0.workload_params.max_concurrent_requests → max_outstanding_requests")
        );
        // In a TOML spec the old name is refused with the new one as the fix.
        let e = crate::config::parse_spec(
            "[[workload.stages]]\ntype = \"RAGWorkload\"\n[workload.stages.workload_params]\nmax_concurrent_requests = 3\n",
            "s.toml",
        )
        .and_then(|f| crate::config::resolve(&f, "s.toml", Path::new(".")).map(|_| ()))
        .unwrap_err();
        assert!(e.hint.as_deref().unwrap_or("").contains("now called `max_outstanding_requests`"), "{e}");
    }

    #[test]
    fn rebase_makes_paths_relative_to_the_new_directory() {
        assert_eq!(rebase(Path::new("/a/b/traces/t.jsonl"), Path::new("/a/b")), PathBuf::from("traces/t.jsonl"));
        assert_eq!(
            rebase(Path::new("/a/b/traces/t.jsonl"), Path::new("/a/c/d")),
            PathBuf::from("../../b/traces/t.jsonl")
        );
        assert_eq!(rebase(Path::new("/a/b/t.jsonl"), Path::new("/tmp/x")), PathBuf::from("/a/b/t.jsonl"));
    }

    #[test]
    fn invalid_json_names_the_line() {
        let e = import("{\n\"simulation\": {\n\"seed\": 1,\n}\n}", Path::new("c.json"), |_| Ok(())).unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.message.starts_with("invalid JSON"), "{e}");
    }
}
