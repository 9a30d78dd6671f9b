//! Simulated time: integer nanoseconds, never floats in an event key.
//!
//! Floats appear only at the edges (configuration, roofline and bandwidth
//! arithmetic). Each direction has exactly one conversion function:
//!
//! * seconds → [`SimDuration`]: [`SimDuration::from_secs_f64`] rounds **up** to
//!   the next nanosecond, so modelled work never finishes early, and any
//!   strictly positive duration lasts at least 1 ns;
//! * [`SimTime`]/[`SimDuration`] → seconds: [`SimTime::as_secs_f64`] and
//!   [`SimDuration::as_secs_f64`] divide by 10⁹ (exact for values below 2⁵³ ns,
//!   about 104 days).

use std::fmt;
use std::ops::{Add, AddAssign, Sub};

/// Nanoseconds per second.
pub const NANOS_PER_SEC: u64 = 1_000_000_000;

/// The latest simulated time a run may reach: 10⁹ s (31.7 years). A run
/// whose next event lies beyond it fails, naming the likely cause (epoch
/// timestamps, a vanishing request rate), rather than creating structures
/// sized by an absurd time.
pub const HORIZON: SimTime = SimTime(1_000_000_000 * NANOS_PER_SEC);

/// A point in simulated time, in nanoseconds since the start of the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SimTime(pub u64);

/// A span of simulated time in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SimDuration(pub u64);

impl SimTime {
    /// The start of every run.
    pub const ZERO: SimTime = SimTime(0);
    /// A time later than any event (used for "never").
    pub const MAX: SimTime = SimTime(u64::MAX);

    /// Seconds since the start of the run.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / NANOS_PER_SEC as f64
    }

    /// Time elapsed since `earlier`; zero if `earlier` is later (never negative).
    pub fn saturating_since(self, earlier: SimTime) -> SimDuration {
        SimDuration(self.0.saturating_sub(earlier.0))
    }
}

impl SimDuration {
    /// No time at all.
    pub const ZERO: SimDuration = SimDuration(0);

    /// Converts seconds to a duration, rounding **up** to whole nanoseconds.
    ///
    /// Non-finite, zero or negative inputs give zero; a positive input gives at
    /// least 1 ns. Values beyond `u64::MAX` ns (≈ 584 years) saturate.
    pub fn from_secs_f64(secs: f64) -> SimDuration {
        if secs.is_nan() || secs <= 0.0 || secs.is_infinite() {
            return SimDuration::ZERO;
        }
        let ns = (secs * NANOS_PER_SEC as f64).ceil();
        if ns >= u64::MAX as f64 { SimDuration(u64::MAX) } else { SimDuration((ns as u64).max(1)) }
    }

    /// Whole seconds as a duration (exact).
    pub const fn from_secs(secs: u64) -> SimDuration {
        SimDuration(secs * NANOS_PER_SEC)
    }

    /// The duration in seconds.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / NANOS_PER_SEC as f64
    }

    /// The duration in whole microseconds, rounded up (the unit of the HDR
    /// histograms, so a 1 ns wait is never recorded as zero).
    pub fn as_micros_ceil(self) -> u64 {
        self.0.div_ceil(1_000)
    }
}

impl Add<SimDuration> for SimTime {
    type Output = SimTime;
    fn add(self, d: SimDuration) -> SimTime {
        SimTime(self.0.saturating_add(d.0))
    }
}

impl AddAssign<SimDuration> for SimTime {
    fn add_assign(&mut self, d: SimDuration) {
        *self = *self + d;
    }
}

impl Sub<SimTime> for SimTime {
    type Output = SimDuration;
    /// Panics in debug builds if `rhs` is later than `self` (a broken causality invariant).
    fn sub(self, rhs: SimTime) -> SimDuration {
        debug_assert!(rhs <= self, "time went backwards: {rhs:?} > {self:?}");
        SimDuration(self.0 - rhs.0)
    }
}

impl Sub<SimDuration> for SimTime {
    type Output = SimTime;
    /// Panics in debug builds if the result would be before time zero.
    fn sub(self, d: SimDuration) -> SimTime {
        debug_assert!(d.0 <= self.0, "time before zero: {self:?} - {d:?}");
        SimTime(self.0 - d.0)
    }
}

impl Add for SimDuration {
    type Output = SimDuration;
    fn add(self, d: SimDuration) -> SimDuration {
        SimDuration(self.0.saturating_add(d.0))
    }
}

impl AddAssign for SimDuration {
    fn add_assign(&mut self, d: SimDuration) {
        *self = *self + d;
    }
}

impl fmt::Display for SimTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.9}s", self.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up_to_the_next_nanosecond() {
        // 1.5 ns → 2 ns; 1e-12 s (a picosecond) → 1 ns, never 0.
        assert_eq!(SimDuration::from_secs_f64(1.5e-9), SimDuration(2));
        assert_eq!(SimDuration::from_secs_f64(1e-12), SimDuration(1));
        // Exactly representable values stay exact.
        assert_eq!(SimDuration::from_secs_f64(0.25), SimDuration(250_000_000));
        assert_eq!(SimDuration::from_secs_f64(2.0), SimDuration::from_secs(2));
        // 0.1 × 1e9 rounds to exactly 1e8 in f64, so nothing is added.
        assert_eq!(SimDuration::from_secs_f64(0.1), SimDuration(100_000_000));
        // 1/3 s = 333333333.33… ns → 333333334 ns.
        assert_eq!(SimDuration::from_secs_f64(1.0 / 3.0), SimDuration(333_333_334));
    }

    #[test]
    fn non_positive_and_non_finite_seconds_give_zero() {
        assert_eq!(SimDuration::from_secs_f64(0.0), SimDuration::ZERO);
        assert_eq!(SimDuration::from_secs_f64(-3.0), SimDuration::ZERO);
        assert_eq!(SimDuration::from_secs_f64(f64::NAN), SimDuration::ZERO);
        assert_eq!(SimDuration::from_secs_f64(f64::INFINITY), SimDuration::ZERO);
    }

    #[test]
    fn huge_durations_saturate_instead_of_wrapping() {
        assert_eq!(SimDuration::from_secs_f64(1e30), SimDuration(u64::MAX));
        assert_eq!(SimTime(u64::MAX - 1) + SimDuration(5), SimTime::MAX);
    }

    #[test]
    fn conversion_back_to_seconds_divides_by_one_billion() {
        assert_eq!(SimTime(1_500_000_000).as_secs_f64(), 1.5);
        assert_eq!(SimDuration(1).as_micros_ceil(), 1);
        assert_eq!(SimDuration(1_000).as_micros_ceil(), 1);
        assert_eq!(SimDuration(1_001).as_micros_ceil(), 2);
    }
}
