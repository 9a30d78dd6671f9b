//! Distributions of request lengths and think times for the synthetic
//! generators.
//!
//! In a scenario a distribution is a number (fixed) or a table with `dist`:
//!
//! | `dist` | keys | sample |
//! |---|---|---|
//! | `fixed` | `value` | `value` |
//! | `uniform` | `min`, `max` | integers in `[min, max]` for lengths (Opal's rule), reals for times |
//! | `normal` | `mean`, `std`, optional `min`, `max` | clamped to `[min, max]` |
//! | `lognormal` | `mean`, `std` (of the value itself), optional `min`, `max` | clamped |
//! | `exponential` | `mean`, optional `min`, `max` | clamped |
//! | `empirical` | `trace_file`, `field` (`input_length` or `output_length`) | a uniformly drawn value of that field in the trace (read by the trace reader: an `output_length` of 0 counts as 1) |
//!
//! Lengths are rounded to the nearest integer and are at least 1; `min`
//! defaults to 1 for lengths and 0 for times. A log-normal with mean `m` and
//! standard deviation `s` has `σ² = ln(1 + s²/m²)` and `μ = ln m − σ²/2`.

use crate::rng::StreamRng;
use rand::RngExt;
use rand_distr::{Distribution, Exp1, StandardNormal};
use std::sync::Arc;

/// A distribution of non-negative values.
#[derive(Clone, Debug, PartialEq)]
pub enum Dist {
    /// Always this value.
    Fixed(f64),
    /// Uniform over `[min, max]` (inclusive integers when sampled as a length).
    Uniform {
        /// Smallest value.
        min: f64,
        /// Largest value.
        max: f64,
    },
    /// Normal, clamped to `[min, max]`.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
        /// Lower clamp.
        min: f64,
        /// Upper clamp.
        max: f64,
    },
    /// Log-normal with parameters `mu`, `sigma` of the underlying normal, clamped.
    LogNormal {
        /// Mean of ln X.
        mu: f64,
        /// Standard deviation of ln X.
        sigma: f64,
        /// Lower clamp.
        min: f64,
        /// Upper clamp.
        max: f64,
    },
    /// Exponential with this mean, clamped.
    Exponential {
        /// Mean.
        mean: f64,
        /// Lower clamp.
        min: f64,
        /// Upper clamp.
        max: f64,
    },
    /// Values drawn uniformly from a list (e.g. a trace's lengths).
    Empirical(Arc<[f64]>),
}

impl Dist {
    /// A log-normal with the given mean and standard deviation of the value itself.
    pub fn lognormal(mean: f64, std: f64, min: f64, max: f64) -> Dist {
        let sigma2 = (1.0 + (std * std) / (mean * mean)).ln();
        Dist::LogNormal { mu: mean.ln() - sigma2 / 2.0, sigma: sigma2.sqrt(), min, max }
    }

    /// One real-valued draw.
    pub fn sample(&self, rng: &mut StreamRng) -> f64 {
        match self {
            Dist::Fixed(v) => *v,
            Dist::Uniform { min, max } => {
                if max > min {
                    rng.random_range(*min..*max)
                } else {
                    *min
                }
            }
            Dist::Normal { mean, std, min, max } => {
                let z: f64 = StandardNormal.sample(rng);
                (mean + std * z).clamp(*min, *max)
            }
            Dist::LogNormal { mu, sigma, min, max } => {
                let z: f64 = StandardNormal.sample(rng);
                (mu + sigma * z).exp().clamp(*min, *max)
            }
            Dist::Exponential { mean, min, max } => {
                let e: f64 = Exp1.sample(rng);
                (mean * e).clamp(*min, *max)
            }
            Dist::Empirical(values) => values[rng.random_range(0..values.len())],
        }
    }

    /// One draw as a token count (≥ 1). Uniform lengths are integers drawn
    /// in `[min, max]` as Opal draws them; the rest are rounded.
    pub fn sample_tokens(&self, rng: &mut StreamRng) -> u32 {
        match self {
            Dist::Uniform { min, max } => rng.random_range(*min as u32..=*max as u32),
            d => d.sample(rng).round().clamp(1.0, f64::from(u32::MAX)) as u32,
        }
    }

    /// The largest value a draw can take, if bounded.
    pub fn upper_bound(&self) -> Option<f64> {
        let bound = match self {
            Dist::Fixed(v) => *v,
            Dist::Uniform { max, .. }
            | Dist::Normal { max, .. }
            | Dist::LogNormal { max, .. }
            | Dist::Exponential { max, .. } => *max,
            Dist::Empirical(values) => values.iter().copied().fold(0.0, f64::max),
        };
        bound.is_finite().then_some(bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SeedTree;

    fn moments(d: &Dist, n: usize) -> (f64, f64) {
        let mut rng = SeedTree::new(3).stream("dist");
        let xs: Vec<f64> = (0..n).map(|_| d.sample(&mut rng)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        (mean, var.sqrt())
    }

    #[test]
    fn lognormal_has_the_requested_mean_and_std() {
        // mean 1000, std 500: σ² = ln 1.25, μ = ln 1000 − σ²/2.
        let d = Dist::lognormal(1000.0, 500.0, 0.0, f64::INFINITY);
        let Dist::LogNormal { mu, sigma, .. } = d else { unreachable!() };
        assert!((sigma * sigma - 1.25f64.ln()).abs() < 1e-12);
        assert!((mu - (1000f64.ln() - 1.25f64.ln() / 2.0)).abs() < 1e-12);
        let (m, s) = moments(&d, 200_000);
        assert!((m - 1000.0).abs() < 5.0, "mean {m}");
        assert!((s - 500.0).abs() < 10.0, "std {s}");
    }

    #[test]
    fn normal_and_exponential_match_their_moments_and_clamps_hold() {
        let (m, s) = moments(&Dist::Normal { mean: 50.0, std: 10.0, min: 0.0, max: f64::INFINITY }, 200_000);
        assert!((m - 50.0).abs() < 0.1 && (s - 10.0).abs() < 0.1, "{m} {s}");
        let (m, s) = moments(&Dist::Exponential { mean: 4.0, min: 0.0, max: f64::INFINITY }, 200_000);
        assert!((m - 4.0).abs() < 0.05 && (s - 4.0).abs() < 0.1, "{m} {s}");
        let mut rng = SeedTree::new(1).stream("clamp");
        let d = Dist::Normal { mean: 100.0, std: 1000.0, min: 10.0, max: 120.0 };
        assert!((0..10_000).map(|_| d.sample_tokens(&mut rng)).all(|x| (10..=120).contains(&x)));
    }

    #[test]
    fn uniform_lengths_are_inclusive_integers_and_empirical_draws_from_its_values() {
        let mut rng = SeedTree::new(1).stream("u");
        let d = Dist::Uniform { min: 3.0, max: 5.0 };
        let mut seen = [0u32; 6];
        for _ in 0..3000 {
            seen[d.sample_tokens(&mut rng) as usize] += 1;
        }
        assert_eq!(seen[..3], [0, 0, 0]);
        assert!(seen[3..].iter().all(|&n| n > 900), "{seen:?}");
        let e = Dist::Empirical(Arc::from(vec![7.0, 7.0, 9.0]));
        let draws: Vec<u32> = (0..3000).map(|_| e.sample_tokens(&mut rng)).collect();
        let sevens = draws.iter().filter(|&&x| x == 7).count();
        assert!(draws.iter().all(|&x| x == 7 || x == 9));
        assert!((1850..2150).contains(&sevens), "two thirds are 7: {sevens}");
        assert_eq!(e.upper_bound(), Some(9.0));
        assert_eq!(Dist::Fixed(3.0).sample_tokens(&mut rng), 3);
        assert_eq!(Dist::Exponential { mean: 1.0, min: 0.0, max: f64::INFINITY }.upper_bound(), None);
    }
}
