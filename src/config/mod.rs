//! Scenario configuration: the TOML schema ([`schema`]), loading with
//! precise errors, and validation into the resolved [`Scenario`] a run uses.

mod context;
pub mod disagg;
pub mod effective;
mod error;
pub mod groups;
pub mod opal_json;
mod resolve;
pub mod schema;
mod stages;
mod worker;

pub use error::{ConfigError, ErrorKind, closest, line_of};
pub use resolve::{RequestSlo, Scenario, resolve};
pub use schema::SpecFile;

use std::path::{Path, PathBuf};

/// A spec file as read from disk.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Where it was read from.
    pub path: PathBuf,
    /// The parsed file.
    pub file: SpecFile,
    /// The file as a TOML table (what sweep overrides are applied to).
    pub table: toml::Table,
    /// Warnings from importing an Opal JSON configuration (keys renamed,
    /// defaulted or ignored); empty for TOML.
    pub notes: Vec<String>,
}

impl Spec {
    /// The study name: `[sweep] name`, or the file stem.
    pub fn name(&self) -> String {
        self.file.sweep.name.clone().unwrap_or_else(|| {
            self.path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "spec".into())
        })
    }

    /// The file name used in messages.
    pub fn source(&self) -> String {
        self.path.display().to_string()
    }

    /// Directory that relative paths inside the spec are resolved against.
    pub fn base_dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// Validates the scenario the spec describes.
    pub fn scenario(&self) -> Result<Scenario, ConfigError> {
        resolve(&self.file, &self.source(), self.base_dir())
    }
}

/// Reads and parses a spec file: TOML, or an Opal JSON configuration (by
/// its `.json` extension), imported as [`opal_json`] describes.
pub fn load_spec(path: &Path) -> Result<Spec, ConfigError> {
    let source = path.display().to_string();
    let text = read_spec_file(path, &source)?;
    if is_json(path) { Spec::from_opal_json(&text, path).map(|(spec, _)| spec) } else { Spec::from_text(&text, path) }
}

/// Largest spec file read, bytes (the largest shipped spec is a few KiB).
pub const MAX_SPEC_BYTES: u64 = 16 << 20;

/// Reads a spec file: a regular file (a FIFO would block, a device never
/// end) of at most [`MAX_SPEC_BYTES`].
fn read_spec_file(path: &Path, source: &str) -> Result<String, ConfigError> {
    use std::io::Read;
    let err = |m: String| {
        ConfigError::file(source, m)
            .hint("check the path; specs are TOML files such as sweeps/quickstart.toml, or Opal JSON configurations")
    };
    let unreadable = |e: std::io::Error| err(format!("cannot read the spec file: {e}"));
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    if !meta.is_file() {
        return Err(err("cannot read the spec file: it is not a regular file (a directory, device or FIFO)".into()));
    }
    let too_big =
        || err(format!("the spec file is larger than {} MiB; a spec is a few KiB of TOML", MAX_SPEC_BYTES >> 20));
    if meta.len() > MAX_SPEC_BYTES {
        return Err(too_big());
    }
    let mut text = String::new();
    std::fs::File::open(path).and_then(|f| f.take(MAX_SPEC_BYTES + 1).read_to_string(&mut text)).map_err(unreadable)?;
    if text.len() as u64 > MAX_SPEC_BYTES {
        return Err(too_big());
    }
    Ok(text)
}

/// True for a path with a `.json` extension.
pub fn is_json(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

impl Spec {
    /// Parses spec text as if read from `path` (which names it and anchors relative paths).
    pub fn from_text(text: &str, path: &Path) -> Result<Spec, ConfigError> {
        let source = path.display().to_string();
        let file = parse_spec(text, &source)?;
        let table = text.parse::<toml::Table>().map_err(|e| toml_error(&e, text, &source, None))?;
        Ok(Spec { path: path.to_path_buf(), file, table, notes: Vec::new() })
    }

    /// Imports an Opal JSON configuration as if read from `path`; also
    /// returns the import's details (for `convert`).
    pub fn from_opal_json(text: &str, path: &Path) -> Result<(Spec, opal_json::Imported), ConfigError> {
        let source = path.display().to_string();
        let base_dir = path.parent().unwrap_or(Path::new("."));
        let imported = opal_json::import(text, path, |table| {
            let file = spec_from_table(table, &source)?;
            resolve(&file, &source, base_dir).map(|_| ())
        })?;
        let file = spec_from_table(&imported.table, &source)?;
        let mut notes: Vec<String> = imported.notes.iter().map(|n| format!("{source}: {n}")).collect();
        notes
            .extend(imported.ignored.iter().map(|k| format!("{source}: ignored `{k}` (no counterpart in opal-sweep)")));
        let spec = Spec { path: path.to_path_buf(), file, table: imported.table.clone(), notes };
        Ok((spec, imported))
    }
}

/// Parses spec text; `source` names it in errors.
pub fn parse_spec(text: &str, source: &str) -> Result<SpecFile, ConfigError> {
    let de = toml::de::Deserializer::parse(text).map_err(|e| toml_error(&e, text, source, None))?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        toml_error(e.inner(), text, source, Some(path))
    })
}

/// Deserializes `value` (a sub-table of a spec, such as a stage's
/// `workload_params`) into `T`, naming `prefix` in errors.
pub fn from_table<T: serde::de::DeserializeOwned>(
    table: &toml::Table,
    source: &str,
    prefix: &str,
) -> Result<T, ConfigError> {
    let value = toml::Value::Table(table.clone());
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let key = if path == "." || path.is_empty() { prefix.to_string() } else { format!("{prefix}.{path}") };
        describe_serde(e.inner().to_string(), source, key)
    })
}

/// Deserializes a whole spec from a table (a spec with overrides applied),
/// naming `source` in errors.
pub fn spec_from_table(table: &toml::Table, source: &str) -> Result<SpecFile, ConfigError> {
    serde_path_to_error::deserialize(toml::Value::Table(table.clone()))
        .map_err(|e| describe_serde(e.inner().to_string(), source, e.path().to_string()))
}

fn toml_error(e: &toml::de::Error, text: &str, source: &str, path: Option<String>) -> ConfigError {
    let line = e.span().map(|s| line_of(text, s.start));
    let mut err = match path {
        Some(p) if p != "." && !p.is_empty() => describe_serde(e.message().to_string(), source, p),
        Some(_) => describe_serde(e.message().to_string(), source, String::new()),
        None => match e.span().map(|s| text.get(s).unwrap_or_default().trim().trim_matches(['"', '\''])) {
            // The toml crate says only "duplicate key": name it.
            Some(key) if e.message().trim() == "duplicate key" && !key.is_empty() => {
                let at = e.span().map_or(0, |s| s.start);
                let header = text[..at].rsplit('\n').next().is_some_and(|l| l.trim_start().starts_with('['));
                let (what, fix) = if header {
                    (format!("table [{key}] is written twice"), format!("merge the two [{key}] tables into one"))
                } else {
                    (
                        format!("duplicate key `{key}` (set twice in the same table)"),
                        format!("set `{key}` once: remove one of the two lines"),
                    )
                };
                ConfigError::file(source, format!("invalid TOML: {what}")).hint(fix).schema()
            }
            // A number beyond TOML's 64-bit integers: name the key of its line.
            Some(_) if e.message().contains("too large") || e.message().contains("too small") => {
                let at = e.span().map_or(0, |s| s.start);
                let mut err = ConfigError::file(
                    source,
                    format!("invalid TOML: {} (a TOML integer is from −2⁶³ to 2⁶³ − 1)", e.message().trim()),
                )
                .hint("use a smaller number (a seed, for one, from 0 to 9223372036854775807)")
                .schema();
                err.key = key_at(text, at);
                err
            }
            _ if e.message().contains("recursion limit") => {
                let deep = text.lines().position(|l| l.chars().filter(|c| matches!(c, '.' | '[' | '{')).count() > 64);
                let mut err = ConfigError::file(
                    source,
                    "invalid TOML: it nests tables or values deeper than the parser allows (recursion limit)",
                )
                .hint("a spec nests a few levels (e.g. [worker.vllm_params]): check that line")
                .schema();
                err.line = deep.map(|l| l + 1);
                return err;
            }
            _ => ConfigError::file(source, format!("invalid TOML: {}", e.message().trim()))
                .hint("fix the syntax at that line (strings need quotes, tables need [brackets])")
                .schema(),
        },
    };
    err.line = line;
    if err.key.as_deref() == Some("") {
        err.key = None;
    }
    err
}

/// The dotted key set on the line holding byte `at` of `text` (`key = …`
/// under the nearest table header above it, with the index of an array of
/// tables' element), if that line sets one.
fn key_at(text: &str, at: usize) -> Option<String> {
    let start = text[..at.min(text.len())].rfind('\n').map_or(0, |i| i + 1);
    let line = text[start..].lines().next()?;
    let (key, _) = line.split_once('=')?;
    let key = key.trim().trim_matches(['"', '\'']);
    let above: Vec<&str> = text[..start].lines().map(str::trim).filter(|l| l.starts_with('[')).collect();
    let Some(header) = above.last() else { return Some(key.to_string()) };
    let name = |h: &str| h.trim_start_matches('[').split(']').next().unwrap_or("").trim().to_string();
    // An array of tables' element: its index among the [[…]] headers of that name.
    let index =
        |array: &str| above.iter().filter(|l| l.starts_with("[[") && name(l) == array).count().saturating_sub(1);
    let h = name(header);
    let table = if header.starts_with("[[") {
        format!("{h}.{}", index(&h))
    } else {
        let array = above
            .iter()
            .rev()
            .filter(|l| l.starts_with("[["))
            .map(|l| name(l))
            .find(|a| h.starts_with(&format!("{a}.")));
        match array {
            Some(a) => format!("{a}.{}{}", index(&a), &h[a.len()..]),
            None => h,
        }
    };
    Some(if table.is_empty() { key.to_string() } else { format!("{table}.{key}") })
}

/// Keys that were renamed: (old, new). An old name is refused with the new
/// one as the fix (an Opal JSON file's are renamed on import).
pub const RENAMED: [(&str, &str); 1] = [("max_concurrent_requests", "max_outstanding_requests")];

/// vLLM's (and Opal's) names for settings this simulator keeps elsewhere:
/// (their key, where it lives here).
pub const ELSEWHERE: [(&str, &str); 6] = [
    ("tensor_parallel_size", "worker.hw.tp"),
    ("tp", "worker.hw.tp"),
    ("pipeline_parallel_size", "worker.hw.pp"),
    ("pp", "worker.hw.pp"),
    ("enable_chunked_prefill", "worker.vllm_params.chunked_prefill"),
    ("num_gpus", "worker.hw.tp (GPUs per worker) or simulation.num_workers (workers)"),
];

/// Turns a serde message into a ConfigError; unknown keys get the closest valid key.
fn describe_serde(message: String, source: &str, key: String) -> ConfigError {
    let ticks: Vec<&str> = message.split('`').skip(1).step_by(2).collect();
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let unknown = ticks.first().copied().unwrap_or(rest);
        let valid = &ticks[1.min(ticks.len())..];
        // serde_path_to_error's path already ends with the unknown key.
        let mut err = ConfigError::key(source, key, format!("unknown key `{unknown}`"));
        let renamed = RENAMED.iter().find(|(old, new)| *old == unknown && valid.contains(new));
        let elsewhere = ELSEWHERE.iter().find(|(name, _)| *name == unknown);
        err.hint = Some(match closest(unknown, valid.iter().copied()) {
            _ if let Some((_, new)) = renamed => format!("this key is now called `{new}` (one name in every stage)"),
            _ if let Some((_, here)) = elsewhere => format!("here that is {here}"),
            Some(c) => format!("did you mean `{c}`? valid keys here: {}", valid.join(", ")),
            None if valid.is_empty() => "remove it; this table takes no keys".into(),
            None => format!("valid keys here: {}", valid.join(", ")),
        });
        return err.unknown_key();
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let valid = &ticks[1.min(ticks.len())..];
        return ConfigError::key(source, key, format!("unknown value {rest}"))
            .hint(format!("one of: {}", valid.join(", ")))
            .schema();
    }
    if message.contains(" as i128") {
        // Beyond TOML's integers (the parser keeps it as a 128-bit number).
        let value = ticks.first().copied().unwrap_or("it");
        return ConfigError::key(source, key, format!("{value} is beyond a TOML integer (at most 2⁶³ − 1)"))
            .hint("use a smaller number")
            .schema();
    }
    if message.starts_with("invalid type: sequence") {
        return ConfigError::key(source, key, "a list where one value goes".to_string())
            .hint(format!(
                "{} (in [grid], a key's list holds its values: [1, 2, 3], not [[1, 2], [3]])",
                expected_hint(&message)
            ))
            .schema();
    }
    let hint = expected_hint(&message);
    ConfigError::key(source, key, message.trim().to_string()).hint(hint).schema()
}

/// What to write instead, from serde's "expected …" (the type the key takes).
fn expected_hint(message: &str) -> String {
    let expected = message.rsplit_once("expected ").map_or("", |(_, e)| e.lines().next().unwrap_or("").trim());
    match expected {
        "u32" => format!("give a whole number from 0 to {}", u32::MAX),
        "u64" => format!("give a whole number from 0 to {}", i64::MAX),
        "i64" => "give a whole number".into(),
        "f64" => "give a number, e.g. 1.0".into(),
        "a boolean" => "give true or false".into(),
        "a string" => "give a quoted string".into(),
        "" => "see the key's description in the README's configuration reference".into(),
        other => format!("give {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_key_names_line_path_and_the_closest_valid_key() {
        let text = "[simulation]\nseed = 1\n\n[worker.vllm_params]\nmax_num_seq = 4\n";
        let e = parse_spec(text, "s.toml").unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert_eq!(e.key.as_deref(), Some("worker.vllm_params.max_num_seq"), "{e}");
        assert!(e.hint.as_deref().unwrap().starts_with("did you mean `max_num_seqs`?"), "{e}");
    }

    #[test]
    fn invalid_toml_names_the_line() {
        let e = parse_spec("[simulation]\nseed = \n", "s.toml").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.starts_with("invalid TOML"), "{e}");
    }

    #[test]
    fn wrong_type_names_the_key() {
        let e = parse_spec("[simulation]\nnum_workers = \"four\"\n", "s.toml").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("simulation.num_workers"), "{e}");
        assert_eq!(e.line, Some(2));
    }

    #[test]
    fn stage_params_errors_carry_the_stage_path() {
        let mut t = toml::Table::new();
        t.insert("request_rat".into(), toml::Value::Float(1.0));
        let e = from_table::<schema::RateParams>(&t, "s.toml", "workload.stages.0.workload_params").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("workload.stages.0.workload_params.request_rat"), "{e}");
        assert!(e.hint.unwrap().contains("did you mean `request_rate`"));
        let e = parse_spec("[worker.vllm_params]\ntensor_parallel_size = 4\n", "s.toml").unwrap_err();
        assert!(e.hint.unwrap().contains("worker.hw.tp"));
    }
}
