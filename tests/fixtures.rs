//! Scenario specs built in code rather than written out as TOML text: a
//! base ([`Spec::llama8b`] or [`Spec::empty`]), keys set by their dotted
//! paths, and workload stages appended in order.
//!
//! ```ignore
//! let out = Spec::llama8b()
//!     .set("simulation.num_workers", 2)
//!     .tiers(&[])
//!     .stage("UniformReqRate", toml! { total_requests = 10 prompt_size = 1000 output_tokens = 4 })
//!     .run();
//! ```
//!
//! The spec is a [`toml::Table`], and the scenario comes from its TOML text
//! through the same parser a spec file goes through ([`crate::scenario`]).
//! Values keep their Rust types: `4` is a TOML integer and `4.0` a float (a
//! count refuses a float), `"x"` a string, `false` a boolean; a `u64` has no
//! conversion (cast it, or write it in `toml!`). Stage parameters and other
//! tables are easiest written with [`toml::toml!`], which takes TOML syntax
//! (`inf` and inline tables included) with Rust variables or parenthesised
//! expressions as values. A `[header]` in `toml!` makes a new, empty table
//! (replacing one of that name), so `[a]` goes before `[a.b]`.

use toml::{Table, Value};

/// A scenario spec under construction.
#[derive(Clone, Debug)]
pub struct Spec(Table);

impl Spec {
    /// A spec with no keys: every section at its defaults.
    pub fn empty() -> Spec {
        Spec(Table::new())
    }

    /// Llama-3.1-8B (`[model.model_params] name = "llama-3.1-8b"`), the
    /// model most tests serve; everything else at its defaults.
    pub fn llama8b() -> Spec {
        Spec::empty().set("model.model_params.name", "llama-3.1-8b")
    }

    /// Sets the key at the dotted `path` to `value`, creating the tables on
    /// the way and replacing what was there. A numeric segment indexes a
    /// list: `workload.stages.1.workload_params.request_rate` is a key of
    /// the second stage.
    pub fn set(mut self, path: &str, value: impl Into<Value>) -> Spec {
        opal::sweep::set_path(&mut self.0, path, value.into()).unwrap_or_else(|e| panic!("{path}: {e}"));
        self
    }

    /// Sets every key of `entries` in the table at the dotted `path`, as
    /// [`Spec::set`] would one by one: the table's other keys stay, and a
    /// table in `entries` replaces the one at its key.
    pub fn table(self, path: &str, entries: Table) -> Spec {
        entries.into_iter().fold(self, |spec, (key, value)| spec.set(&format!("{path}.{key}"), value))
    }

    /// The KV-cache tiers below the GPU (`[kvc] kvc_tiers`); `&[]` for the
    /// GPU's own prefix cache alone.
    pub fn tiers(self, tiers: &[&str]) -> Spec {
        self.set("kvc.kvc_tiers", tiers.to_vec())
    }

    /// Appends a workload stage: a `[[workload.stages]]` entry of type
    /// `kind` with `params` as its `[workload.stages.workload_params]`
    /// (left out when `params` is empty, as for a stage that takes its
    /// defaults).
    pub fn stage(mut self, kind: &str, params: Table) -> Spec {
        let mut stage = Table::new();
        stage.insert("type".into(), kind.into());
        if !params.is_empty() {
            stage.insert("workload_params".into(), Value::Table(params));
        }
        let workload = self.0.entry("workload").or_insert_with(|| Value::Table(Table::new()));
        let stages = workload
            .as_table_mut()
            .expect("`workload` is a table")
            .entry("stages")
            .or_insert_with(|| Value::Array(Vec::new()));
        stages.as_array_mut().expect("`workload.stages` is a list").push(Value::Table(stage));
        self
    }

    /// Appends a worker group: a `[[worker_groups]]` entry named `name`
    /// with `count` workers and the group's other keys in `keys`.
    pub fn group(mut self, name: &str, count: i64, keys: Table) -> Spec {
        let mut group = keys;
        group.insert("name".into(), name.into());
        group.insert("count".into(), count.into());
        let groups = self.0.entry("worker_groups").or_insert_with(|| Value::Array(Vec::new()));
        groups.as_array_mut().expect("`worker_groups` is a list").push(Value::Table(group));
        self
    }

    /// The spec as TOML text, as a spec file would hold it.
    pub fn toml(&self) -> String {
        toml::to_string(&self.0).expect("a table always serializes")
    }

    /// The resolved scenario, as [`crate::scenario`] makes it from the text.
    pub fn scenario(&self) -> opal::Scenario {
        crate::scenario(&self.toml())
    }

    /// Runs the scenario, which must not fail ([`crate::run`]).
    pub fn run(&self) -> opal::RunOutput {
        crate::run(&self.scenario())
    }
}

/// A Mooncake trace in `dir` of requests all sent at time 0, one per
/// (prompt, output) pair, each with a hash id of its own; returns its path.
pub fn trace_at_zero(dir: &std::path::Path, requests: &[(u32, u32)]) -> String {
    let lines: String = requests
        .iter()
        .enumerate()
        .map(|(i, (p, o))| {
            format!(
                "{{\"timestamp\": 0, \"input_length\": {p}, \"output_length\": {o}, \"hash_ids\": [{}]}}\n",
                1000 + i
            )
        })
        .collect();
    let path = dir.join("requests.jsonl");
    std::fs::write(&path, lines).unwrap();
    path.display().to_string()
}
