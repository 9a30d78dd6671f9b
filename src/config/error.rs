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
        write!(f, "{}", self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "\n  fix: {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

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
    fn closest_finds_typos_and_rejects_unrelated_words() {
        let keys = ["max_num_seqs", "max_num_batched_tokens", "block_size"];
        assert_eq!(closest("max_num_seq", keys), Some("max_num_seqs"));
        assert_eq!(closest("blocksize", keys), Some("block_size"));
        assert_eq!(closest("banana", keys), None);
    }

    #[test]
    fn display_names_file_line_key_and_fix() {
        let e = ConfigError::key("a.toml", "worker.hw.tp", "must be at least 1").at_line(7).hint("set tp = 1");
        assert_eq!(e.to_string(), "a.toml:7: `worker.hw.tp`: must be at least 1\n  fix: set tp = 1");
        assert_eq!(line_of("a\nb\nc", 4), 3);
    }
}
