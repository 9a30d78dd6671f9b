//! Configuration errors: every message names the file, the key path and what
//! would be accepted.

use std::fmt;

/// Whether an error is about the shape of the input or one value in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ErrorKind {
    /// Syntax, an unknown key or a value of the wrong type: the spec itself
    /// is wrong, whatever the grid point.
    Schema,
    /// A well-typed value that is not allowed (out of range, does not fit):
    /// in a sweep, only the grid points with that value fail.
    #[default]
    Value,
}

/// A problem with user input (a spec, scenario, trace or table file).
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigError {
    /// Schema or value problem.
    pub kind: ErrorKind,
    /// The file the problem is in.
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// Dotted key path (`worker.vllm_params.block_size`), when the problem is one key.
    pub key: Option<String>,
    /// What is wrong.
    pub message: String,
    /// How to fix it (what is allowed, or the closest valid key).
    pub hint: Option<String>,
    /// The problem is a key the schema does not know (always a schema error).
    pub unknown_key: bool,
}

impl ConfigError {
    /// An error about the file as a whole.
    pub fn file(file: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            kind: ErrorKind::Value,
            file: file.into(),
            line: None,
            key: None,
            message: message.into(),
            hint: None,
            unknown_key: false,
        }
    }

    /// An error about one key.
    pub fn key(file: impl Into<String>, key: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError { key: Some(key.into()), ..ConfigError::file(file, message) }
    }

    /// Adds a fix suggestion.
    pub fn hint(mut self, hint: impl Into<String>) -> ConfigError {
        self.hint = Some(hint.into());
        self
    }

    /// Marks it as an unknown key (a schema error).
    pub fn unknown_key(mut self) -> ConfigError {
        self.unknown_key = true;
        self.schema()
    }

    /// Marks it as a schema error.
    pub fn schema(mut self) -> ConfigError {
        self.kind = ErrorKind::Schema;
        self
    }

    /// Adds a line number.
    pub fn at_line(mut self, line: usize) -> ConfigError {
        self.line = Some(line);
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        write!(f, ": ")?;
        if let Some(key) = &self.key {
            write!(f, "`{key}`: ")?;
        }
        write!(f, "{}", shorten(&compact_numbers(&self.message)))?;
        if let Some(hint) = &self.hint {
            write!(f, "\n  fix: {}", shorten(&compact_numbers(hint)))?;
        }
        Ok(())
    }
}

/// Cuts every word (a run without whitespace) of more than 160 characters
/// in `text` to its first 100 and last 20, saying how much is left out: a
/// value of megabytes (a spec may hold 16 MiB) is echoed in a line, not whole.
pub fn shorten(text: &str) -> std::borrow::Cow<'_, str> {
    const LONGEST: usize = 160;
    if !text.split_whitespace().any(|w| w.len() > LONGEST) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len().min(4096));
    let mut rest = text;
    while !rest.is_empty() {
        let start = rest.find(|c: char| !c.is_whitespace()).unwrap_or(rest.len());
        out.push_str(&rest[..start]);
        rest = &rest[start..];
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let word = &rest[..end];
        if word.len() > LONGEST {
            let head = word.char_indices().nth(100).map_or(word.len(), |(i, _)| i);
            let tail = word.char_indices().rev().nth(19).map_or(0, |(i, _)| i).max(head);
            let left = word[head..tail].chars().count();
            out.push_str(&format!("{}…[{left} characters]…{}", &word[..head], &word[tail..]));
        } else {
            out.push_str(word);
        }
        rest = &rest[end..];
    }
    std::borrow::Cow::Owned(out)
}

/// Rewrites every decimal numeral of more than 20 characters in `text` in
/// scientific notation: Rust prints an `f64` such as 1e300 as a 301-digit
/// integer (and 1e-300 as 302 characters), which buries the message.
pub fn compact_numbers(text: &str) -> std::borrow::Cow<'_, str> {
    const LONGEST: usize = 20;
    let is_num = |c: char| c.is_ascii_digit() || c == '.';
    let mut out = String::new();
    let mut last = 0;
    let mut i = 0;
    let bytes = text.as_bytes();
    while i < bytes.len() {
        if !is_num(bytes[i] as char) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && is_num(bytes[i] as char) {
            i += 1;
        }
        if i - start > LONGEST
            && let Ok(v) = text[start..i].parse::<f64>()
        {
            out.push_str(&text[last..start]);
            out.push_str(&format!("{v:e}"));
            last = i;
        }
    }
    if last == 0 {
        return std::borrow::Cow::Borrowed(text);
    }
    out.push_str(&text[last..]);
    std::borrow::Cow::Owned(out)
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    /// Adds the line of its key in its file, when it names a key but no
    /// line and the file is TOML: the key's own line, or — for a scenario
    /// key that a `[grid]` or `[[zip]]` axis sets — the axis's line (the
    /// value came from there), or else the line of the nearest enclosing
    /// table that is written out (for a missing key).
    pub fn located(mut self) -> ConfigError {
        if self.line.is_some() || super::is_json(std::path::Path::new(&self.file)) {
            return self;
        }
        let Some(key) = &self.key else { return self };
        let Ok(text) = std::fs::read_to_string(&self.file) else { return self };
        self.line = key_line(&text, key);
        self
    }
}

/// The segments of a dotted key path; `"quoted.parts"` stay whole.
fn segments(key: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in key.chars() {
        match c {
            '"' => quoted = !quoted,
            '.' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// 1-based line where `key` (a dotted path, as errors name keys) is
/// written in the TOML `text`; see [`ConfigError::located`].
pub fn key_line(text: &str, key: &str) -> Option<usize> {
    use toml::de::{DeTable, DeValue};
    let doc = DeTable::parse(text).ok()?;
    let segs = segments(key);
    let line = |span: std::ops::Range<usize>| line_of(text, span.start);
    // An axis that sets this key (or a table above it).
    let axis = |table: &DeTable<'_>| {
        table.iter().find_map(|(k, v)| {
            let path = k.get_ref().as_ref();
            (key == path || key.starts_with(&format!("{path}."))).then(|| line(v.span()))
        })
    };
    if let Some(DeValue::Table(grid)) = doc.get_ref().get("grid").map(|v| v.get_ref())
        && let Some(l) = axis(grid)
    {
        return Some(l);
    }
    if let Some(DeValue::Array(zips)) = doc.get_ref().get("zip").map(|v| v.get_ref()) {
        for z in zips.iter() {
            if let DeValue::Table(t) = z.get_ref()
                && let Some(l) = axis(t)
            {
                return Some(l);
            }
        }
    }
    // The key itself, or the deepest part of its path that is written.
    let mut best = None;
    let mut cur: Option<&DeValue<'_>> = None;
    let mut table = doc.get_ref();
    for seg in &segs {
        let next = match cur {
            None => table.iter().find(|(k, _)| k.get_ref().as_ref() == seg.as_str()).map(|(k, v)| (k.span(), v)),
            Some(DeValue::Table(t)) => {
                t.iter().find(|(k, _)| k.get_ref().as_ref() == seg.as_str()).map(|(k, v)| (k.span(), v))
            }
            Some(DeValue::Array(items)) => seg.parse::<usize>().ok().and_then(|i| items.get(i)).map(|v| (v.span(), v)),
            Some(_) => None,
        };
        let Some((span, v)) = next else { break };
        best = Some(line(span));
        cur = Some(v.get_ref());
        if let DeValue::Table(t) = v.get_ref() {
            table = t;
        }
    }
    best
}

/// 1-based line of byte `offset` in `text`.
pub fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

/// The candidate closest to `word` by normalized Levenshtein similarity, if
/// it is similar enough to be a plausible typo.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::normalized_levenshtein(&word.to_ascii_lowercase(), &c.to_ascii_lowercase()), c))
        .filter(|(score, _)| *score >= 0.5)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_of_megabytes_is_echoed_in_a_line_not_whole() {
        let name = "x".repeat(16 << 20);
        let e = ConfigError::key("s.toml", "model.model_params.name", format!("unknown model {name:?}"))
            .hint(format!("did you mean {name:?}?"));
        let text = e.to_string();
        assert!(text.len() < 600, "{} bytes", text.len());
        assert!(
            text.contains(&format!("unknown model \"{}…[16777098 characters]…{}\"", "x".repeat(99), "x".repeat(19))),
            "{text}"
        );
        // Ordinary messages are untouched.
        assert_eq!(shorten("must be ≥ 0, got -1"), "must be ≥ 0, got -1");
    }

    #[test]
    fn huge_and_tiny_numbers_are_written_in_scientific_notation() {
        let msg = format!("got {}, and {} s; keep 123456789 and 0.25", 1e300, 1e-300);
        assert_eq!(compact_numbers(&msg), "got 1e300, and 1e-300 s; keep 123456789 and 0.25");
        let e = ConfigError::key("s.toml", "simulation.simulation_time", format!("got {}", 1e300)).hint("use -1");
        assert_eq!(e.to_string(), "s.toml: `simulation.simulation_time`: got 1e300\n  fix: use -1");
    }

    #[test]
    fn closest_finds_typos_and_rejects_unrelated_words() {
        let keys = ["max_num_seqs", "max_num_batched_tokens", "block_size"];
        assert_eq!(closest("max_num_seq", keys), Some("max_num_seqs"));
        assert_eq!(closest("blocksize", keys), Some("block_size"));
        assert_eq!(closest("banana", keys), None);
    }

    #[test]
    fn a_key_is_found_on_its_line_or_on_the_axis_that_sets_it() {
        let text = "[sweep]\nname = \"x\"\n\n[grid]\n\"workload.stages.0.workload_params.request_rate\" = [1.0, 2.0]\n\n[worker.vllm_params]\nblock_size = 16\n\n[[workload.stages]]\ntype = \"ExponentialReqRate\"\n[workload.stages.workload_params]\nprompt_size_min = 5\n\n[[zip]]\n\"router.router_params.policy\" = [\"RoundRobin\"]\n";
        assert_eq!(key_line(text, "worker.vllm_params.block_size"), Some(8));
        assert_eq!(key_line(text, "sweep.name"), Some(2));
        // Set by an axis: the axis's line.
        assert_eq!(key_line(text, "workload.stages.0.workload_params.request_rate"), Some(5));
        assert_eq!(key_line(text, "router.router_params.policy"), Some(16));
        // In an array of tables, by index.
        assert_eq!(key_line(text, "workload.stages.0.workload_params.prompt_size_min"), Some(13));
        assert_eq!(key_line(text, "workload.stages.0.type"), Some(11));
        // Missing: the nearest written table.
        assert_eq!(key_line(text, "worker.vllm_params.max_num_seqs"), Some(7));
        assert_eq!(key_line(text, "grid.\"workload.stages.0.workload_params.request_rate\""), Some(5));
        assert_eq!(key_line(text, "model.model_params.name"), None);
    }

    #[test]
    fn display_names_file_line_key_and_fix() {
        let e = ConfigError::key("a.toml", "worker.hw.tp", "must be at least 1").at_line(7).hint("set tp = 1");
        assert_eq!(e.to_string(), "a.toml:7: `worker.hw.tp`: must be at least 1\n  fix: set tp = 1");
        assert_eq!(line_of("a\nb\nc", 4), 3);
    }
}
