//! What every resolver needs: the spec's source for messages, and the
//! checks of single values that name their key.

use super::error::ConfigError;
use crate::time::SimDuration;

/// Most workers a run may have (simulation.num_workers, the P/D pools
/// together, autoscaling's max_workers): each costs its scheduler, caches
/// and counters, about 1.6 KB before it holds any KV state.
pub const MAX_WORKERS: u32 = 100_000;

// The router's least-loaded tree keeps a worker's index in its keys' low bits.
const _: () = assert!(MAX_WORKERS < 1 << crate::router::INDEX_BITS);

/// The resolution context: the spec's source, named in every error.
pub(crate) struct Ctx<'a> {
    pub(super) source: &'a str,
}

impl Ctx<'_> {
    pub(super) fn err(&self, key: &str, message: impl Into<String>, hint: impl Into<String>) -> ConfigError {
        ConfigError::key(self.source, key, message).hint(hint)
    }

    pub(super) fn positive(&self, key: &str, v: f64) -> Result<f64, ConfigError> {
        if v.is_finite() && v > 0.0 {
            Ok(v)
        } else {
            Err(self.err(key, format!("must be a positive number, got {v}"), "use a value greater than 0"))
        }
    }

    /// `-1` means "off"; otherwise a positive number of seconds, at most
    /// the horizon a run may reach.
    pub(super) fn optional_secs(&self, key: &str, v: f64) -> Result<Option<SimDuration>, ConfigError> {
        if v == -1.0 {
            Ok(None)
        } else if v.is_finite() && v > 0.0 && v <= crate::time::HORIZON.as_secs_f64() {
            Ok(Some(SimDuration::from_secs_f64(v)))
        } else {
            Err(self.err(
                key,
                format!("must be -1 (no limit) or a positive number of seconds up to 1e9, got {v}"),
                "use -1 for no limit, or a duration in seconds greater than 0",
            ))
        }
    }

    /// A worker count at most [`MAX_WORKERS`].
    pub(super) fn workers(&self, key: &str, n: u32) -> Result<u32, ConfigError> {
        if n <= MAX_WORKERS {
            return Ok(n);
        }
        Err(self.err(
            key,
            format!("{n} workers is more than the {MAX_WORKERS} a run may have"),
            format!("use at most {MAX_WORKERS} workers"),
        ))
    }

    pub(super) fn at_least(&self, key: &str, v: i64, min: i64) -> Result<u32, ConfigError> {
        if v >= min && v <= i64::from(u32::MAX) {
            Ok(v as u32)
        } else {
            Err(self.err(key, format!("must be an integer ≥ {min}, got {v}"), format!("use a value of at least {min}")))
        }
    }
}
