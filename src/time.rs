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

/// 2^63 as an f64: below it a non-negative f64 converts to an i64.
const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;

impl SimDuration {
    /// No time at all.
    pub const ZERO: SimDuration = SimDuration(0);

    /// Converts seconds to a duration, rounding **up** to whole nanoseconds.
    ///
    /// Non-finite, zero or negative inputs give zero; a positive input gives at
    /// least 1 ns. Values beyond `u64::MAX` ns (≈ 584 years) saturate.
    pub fn from_secs_f64(secs: f64) -> SimDuration {
        let ns = secs * NANOS_PER_SEC as f64;
        // ⌈ns⌉ without a call to libm's `ceil` (the baseline x86-64 target
        // has no rounding instruction): the truncation is exact, and one
        // more when it lies below `ns`; from 2^53 on `ns` is whole already.
        // Below 2^63 the conversions are signed (one instruction each
        // there; unsigned ones take several) — the common case.
        if ns > 0.0 && ns < TWO_POW_63 {
            let whole = ns as i64;
            return SimDuration((whole as u64 + u64::from((whole as f64) < ns)).max(1));
        }
        if secs.is_nan() || secs <= 0.0 || secs == f64::INFINITY {
            return SimDuration::ZERO;
        }
        if ns >= u64::MAX as f64 {
            return SimDuration(u64::MAX);
        }
        // At least 2^63: whole.
        SimDuration(ns as u64)
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

/// The durations of consecutive steps whose time is affine in their index
/// (a decode run's sub-steps, whose context grows by the same number of
/// tokens each step): step `k` of `0..len` takes
/// `first + ⌊(last − first)·k / (len − 1)⌋` ns — `first` and `last` at the
/// ends, the straight line between them rounded down in between. Sums,
/// and how many steps fit in a time, take O(log) (a floor sum), whatever
/// the number of steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ramp {
    /// The first step's duration, ns.
    pub first: u64,
    /// The last step's duration, ns.
    pub last: u64,
    /// Steps.
    pub len: u64,
}

impl Ramp {
    /// `len` steps of the same duration.
    pub fn flat(d: u64, len: u64) -> Ramp {
        Ramp { first: d, last: d, len }
    }

    fn span(&self) -> u64 {
        self.len.max(2) - 1
    }

    /// Step `k`'s duration, ns.
    pub fn at(&self, k: u64) -> u64 {
        let m = self.span();
        let (rising, a) =
            if self.last >= self.first { (true, self.last - self.first) } else { (false, self.first - self.last) };
        // In 64 bits while the product fits (always, for steps of a run), else in 128.
        let step = match a.checked_mul(k) {
            Some(ak) if rising => ak / m,
            Some(ak) => ak.div_ceil(m),
            None if rising => (u128::from(a) * u128::from(k) / u128::from(m)) as u64,
            None => (u128::from(a) * u128::from(k)).div_ceil(u128::from(m)) as u64,
        };
        if rising { self.first + step } else { self.first - step }
    }

    /// Σ of the durations of steps `0..n`, ns.
    pub fn prefix(&self, n: u64) -> u128 {
        let m = self.span();
        let base = u128::from(self.first) * u128::from(n);
        if self.last >= self.first {
            base + u128::from(floor_sum(n, m, self.last - self.first, 0))
        } else {
            // ⌊−a·k/m⌋ = −⌊(a·k + m − 1)/m⌋
            base - u128::from(floor_sum(n, m, self.first - self.last, m - 1))
        }
    }

    /// Σ of the durations of steps `k0..k1`, ns.
    pub fn sum(&self, k0: u64, k1: u64) -> SimDuration {
        SimDuration((self.prefix(k1) - self.prefix(k0)) as u64)
    }

    /// The most steps from `k0` on (ending at most at `k1`) that take at
    /// most `budget` together: the largest `k` in `k0..=k1` with
    /// `sum(k0, k) ≤ budget`.
    pub fn fit(&self, k0: u64, k1: u64, budget: SimDuration) -> u64 {
        self.fit_from(k0, self.prefix(k0), k1, budget).0
    }

    /// [`Self::fit`] given `prefix(k0)`; also returns `prefix(k)`. Solves
    /// the sum's quadratic for a first guess (the rounding makes it at most
    /// a step off), then steps to the exact answer.
    pub fn fit_from(&self, k0: u64, at_k0: u128, k1: u64, budget: SimDuration) -> (u64, u128) {
        let goal = at_k0 + u128::from(budget.0);
        let guess = if self.last >= self.first {
            // Σ_{k<n} (first + a·k) = first·n + a·n(n − 1)/2 with a = Δ/m, ≈ goal.
            let (a, f, g) = ((self.last - self.first) as f64 / self.span() as f64, self.first as f64, goal as f64);
            let n = if a == 0.0 {
                g / f.max(1.0)
            } else {
                let b = f - a / 2.0;
                (-b + (b * b + 2.0 * a * g).sqrt()) / a
            };
            if n.is_finite() { (n.max(0.0) as u64).clamp(k0, k1) } else { k1 }
        } else {
            k0 + (k1 - k0) / 2
        };
        let (mut k, mut at) = (guess, self.prefix(guess));
        if at > goal {
            while at > goal {
                k -= 1;
                at = self.prefix(k);
            }
        } else {
            while k < k1 {
                let next = self.prefix(k + 1);
                if next > goal {
                    break;
                }
                (k, at) = (k + 1, next);
            }
        }
        (k, at)
    }

    /// The largest `k` in `k0..k1` whose duration is at most `d`, where the
    /// durations of `k0..k1` do not decrease and step `k0`'s is at most `d`.
    pub fn last_at_most(&self, k0: u64, k1: u64, d: u64) -> u64 {
        debug_assert!(self.last >= self.first && self.at(k0) <= d);
        if self.last == self.first {
            return k1 - 1;
        }
        // first + ⌊a·k/m⌋ ≤ d  ⇔  a·k < (d − first + 1)·m
        let (a, m) = (self.last - self.first, self.span());
        match (d - self.first + 1).checked_mul(m) {
            Some(x) => (x.div_ceil(a) - 1).min(k1 - 1),
            None => {
                let k = ((u128::from(d - self.first) + 1) * u128::from(m)).div_ceil(u128::from(a)) - 1;
                k.min(u128::from(k1 - 1)) as u64
            }
        }
    }
}

impl Ramp {
    /// The largest `k` in `k0..k1` whose duration is at least `d`, where the
    /// durations of `k0..k1` do not increase and step `k0`'s is at least `d`.
    pub fn last_at_least(&self, k0: u64, k1: u64, d: u64) -> u64 {
        debug_assert!(self.last <= self.first && self.at(k0) >= d);
        if self.last == self.first {
            return k1 - 1;
        }
        // first − ⌈a·k/m⌉ ≥ d  ⇔  a·k ≤ (first − d)·m
        let (a, m) = (self.first - self.last, self.span());
        match (self.first - d).checked_mul(m) {
            Some(x) => (x / a).min(k1 - 1),
            None => (u128::from(self.first - d) * u128::from(m) / u128::from(a)).min(u128::from(k1 - 1)) as u64,
        }
    }
}

/// Σ_{i < n} ⌊(a·i + b) / m⌋ for `b < m` (the AtCoder Library's
/// `floor_sum_unsigned`, a Euclid-like recursion in O(log m)), in 64-bit
/// arithmetic while the terms allow (a ramp's sums are at most `n·a`), else in 128.
fn floor_sum(n: u64, m: u64, a: u64, b: u64) -> u64 {
    if u128::from(n) * u128::from(a.max(m)) < 1 << 62 {
        floor_sum_in::<u64>(n, m, a, b)
    } else {
        floor_sum_in::<u128>(n.into(), m.into(), a.into(), b.into()) as u64
    }
}

fn floor_sum_in<T>(mut n: T, mut m: T, mut a: T, mut b: T) -> T
where
    T: Copy
        + PartialOrd
        + From<u8>
        + std::ops::Add<Output = T>
        + std::ops::Sub<Output = T>
        + std::ops::Mul<Output = T>
        + std::ops::Div<Output = T>
        + std::ops::Rem<Output = T>,
{
    let (zero, one, two) = (T::from(0), T::from(1), T::from(2));
    let mut sum = zero;
    loop {
        if n == zero {
            return sum;
        }
        if a >= m {
            sum = sum + n * (n - one) / two * (a / m);
            a = a % m;
        }
        if b >= m {
            sum = sum + n * (b / m);
            b = b % m;
        }
        let y = a * n + b;
        if y < m {
            return sum;
        }
        (n, b) = (y / m, y % m);
        std::mem::swap(&mut m, &mut a);
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
    fn the_rounding_up_is_libm_ceil_at_every_magnitude() {
        // What the conversion was: `ceil` of the nanoseconds, saturating.
        let by_ceil = |secs: f64| {
            let ns = (secs * NANOS_PER_SEC as f64).ceil();
            if ns >= u64::MAX as f64 { u64::MAX } else { (ns as u64).max(1) }
        };
        let mut bits = 0x3ff0_0000_0000_0001_u64;
        let mut next = || {
            bits = bits.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            bits
        };
        for _ in 0..200_000 {
            // Any positive finite f64 (subnormals to beyond 2^64 ns),
            // whole and half nanoseconds around 2^53.
            let secs = f64::from_bits(next() >> 1);
            let near = ((1u64 << 53) as f64 + (next() % 64) as f64 * 0.5) / 1e9;
            // And around 2^63 ns, where the conversion changes sign rules.
            let top = f64::from_bits(TWO_POW_63.to_bits() - 64 + next() % 128) / 1e9;
            for x in [secs, near, top, secs.fract() * 1e3] {
                if x > 0.0 && x.is_finite() {
                    assert_eq!(SimDuration::from_secs_f64(x).0, by_ceil(x), "{x:e} s");
                }
            }
        }
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
    #[test]
    fn a_ramps_sums_and_fits_are_those_of_its_steps_one_by_one() {
        for (first, last, len) in
            [(5, 5, 1), (7, 9, 2), (1_000, 1_337, 50), (900, 200, 37), (3, 10_000, 7), (50, 49, 400)]
        {
            let r = Ramp { first, last, len };
            let d: Vec<u64> = (0..len).map(|k| r.at(k)).collect();
            assert_eq!((d[0], d[len as usize - 1]), (first, last));
            for (k, &dk) in d.iter().enumerate() {
                // The straight line, rounded down.
                let exact = first as f64 + (last as f64 - first as f64) * k as f64 / (len.max(2) - 1) as f64;
                assert_eq!(dk, exact.floor() as u64, "{r:?} step {k}");
            }
            for k0 in 0..len {
                for k1 in k0..=len {
                    let sum: u64 = d[k0 as usize..k1 as usize].iter().sum();
                    assert_eq!(r.sum(k0, k1), SimDuration(sum));
                    let fit = r.fit(k0, len, SimDuration(sum));
                    // The most steps from k0 within that sum: k1, and any zero-length ones after it (none here).
                    assert_eq!(fit, k1, "{r:?} {k0}..{k1}");
                    if sum > 0 {
                        assert_eq!(r.fit(k0, len, SimDuration(sum - 1)), k1 - 1);
                    }
                }
                if last >= first {
                    for x in d[k0 as usize]..d[len as usize - 1] + 2 {
                        let want = (k0..len).filter(|&k| d[k as usize] <= x).max().unwrap();
                        assert_eq!(r.last_at_most(k0, len, x), want, "{r:?} from {k0} at most {x}");
                    }
                }
                if last <= first {
                    for x in d[len as usize - 1].saturating_sub(1)..=d[k0 as usize] {
                        let want = (k0..len).filter(|&k| d[k as usize] >= x).max().unwrap();
                        assert_eq!(r.last_at_least(k0, len, x), want, "{r:?} from {k0} at least {x}");
                    }
                }
            }
        }
    }
}
