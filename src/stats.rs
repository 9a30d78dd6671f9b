//! Statistics shared by the search and the report: the mean of replicates
//! with its 95 % confidence interval, and the SLO constraint both read. It
//! sits below `sweep` and `report` so that neither reaches into the other.

/// `metric <= value` or `metric >= value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Constraint {
    /// A numeric column of the runs table.
    pub metric: String,
    /// `<=` (true) or `>=`.
    pub at_most: bool,
    /// The threshold.
    pub value: f64,
}

/// `Ok` when `metric` is a numeric column of the runs table; else why not,
/// with the closest column's name.
pub(crate) fn numeric_column(metric: &str) -> Result<(), String> {
    let known = crate::metrics::RunSummary::default().columns();
    let numeric = known.iter().any(|(n, v)| n == metric && !matches!(v, crate::metrics::SummaryValue::Label(_)));
    if numeric {
        return Ok(());
    }
    let names: Vec<&str> = known.iter().map(|(n, _)| n.as_str()).collect();
    let hint = crate::config::closest(metric, names.iter().copied())
        .map_or_else(String::new, |c| format!(" (did you mean `{c}`?)"));
    Err(format!("`{metric}` is not a numeric column of the runs table{hint}"))
}

/// The threshold's text of a constraint (after its operator).
fn value_text(text: &str) -> &str {
    text.split_once("<=").or_else(|| text.split_once(">=")).map_or(text, |(_, v)| v.trim())
}

impl Constraint {
    /// Parses `ttft_p99_ms <= 2000`.
    pub(crate) fn parse(text: &str) -> Result<Constraint, String> {
        let (at_most, (metric, value)) = match (text.split_once("<="), text.split_once(">=")) {
            (Some(p), None) => (true, p),
            (None, Some(p)) => (false, p),
            _ => return Err(format!("{text:?} is not `metric <= value` or `metric >= value`")),
        };
        let metric = metric.trim().to_string();
        let value: f64 = value.trim().parse().map_err(|_| format!("{:?} is not a number", value.trim()))?;
        if !value.is_finite() {
            // Nothing is ≤ NaN, and a bound of ±inf holds or fails for every run alike.
            return Err(format!("{:?} is not a finite threshold", value_text(text)));
        }
        numeric_column(&metric)?;
        Ok(Constraint { metric, at_most, value })
    }

    /// Whether replicates' `samples` meet it with 95 % confidence.
    pub fn holds(&self, samples: &[f64]) -> bool {
        self.verdict(samples) == Verdict::Pass
    }

    /// What replicates' `samples` say of it: met or missed with 95 %
    /// confidence (the whole Student-t interval of their mean on one side
    /// of the threshold), or unclear. A missing or non-finite sample fails.
    pub fn verdict(&self, samples: &[f64]) -> Verdict {
        if samples.is_empty() || samples.iter().any(|v| !v.is_finite()) {
            return Verdict::Fail;
        }
        let Some((mean, half)) = mean_ci(samples) else { return Verdict::Fail };
        let (lo, hi) = (mean - half, mean + half);
        let (meets, misses) =
            if self.at_most { (hi <= self.value, lo > self.value) } else { (lo >= self.value, hi < self.value) };
        if meets {
            Verdict::Pass
        } else if misses {
            Verdict::Fail
        } else {
            Verdict::Unclear
        }
    }
}

impl Constraint {
    /// Whether the metric is a tail statistic (a 95th or higher percentile,
    /// or a maximum): a few runs' tails are heavy-tailed and barely paired
    /// by common random numbers, so they need more replicates than a mean.
    pub fn is_tail(&self) -> bool {
        ["_p95_", "_p99_", "_p999_", "_max_"].iter().any(|t| self.metric.contains(t))
    }

    /// The runs an unclear verdict would need for its 95 % interval to clear
    /// the threshold, if the mean and spread of `samples` held: n × (half-width
    /// / distance from the threshold)², rounded up (conservative: Student's
    /// t shrinks too). `None` when the mean sits on the threshold or there
    /// is no interval yet.
    pub fn replicates_for(&self, samples: &[f64]) -> Option<u32> {
        let n = samples.iter().filter(|v| v.is_finite()).count();
        let (mean, half) = mean_ci(samples).filter(|_| n >= 2)?;
        let distance = (mean - self.value).abs();
        if distance == 0.0 {
            return None;
        }
        let needed = (n as f64 * (half / distance).powi(2)).ceil();
        Some(needed.min(f64::from(u32::MAX)) as u32)
    }
}

impl std::fmt::Display for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.metric, if self.at_most { "<=" } else { ">=" }, self.value)
    }
}

/// What a probe's runs said of one constraint, or of the probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Met with 95 % confidence.
    Pass,
    /// Missed with 95 % confidence (or a run failed, or its queue kept growing).
    Fail,
    /// The interval straddles the threshold: more replicates may settle it.
    Unclear,
}

/// Two-sided 95 % Student-t quantiles t(0.975, df) for df = 1…30 (standard table values).
const T975: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120,
    2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
];

/// Mean of `samples` and the half-width of its 95 % confidence interval
/// (Student t with n − 1 degrees of freedom; 0 for a single sample).
/// Non-finite samples are left out.
pub fn mean_ci(samples: &[f64]) -> Option<(f64, f64)> {
    let finite: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
    let n = finite.len();
    if n == 0 {
        return None;
    }
    let mean = finite.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return Some((mean, 0.0));
    }
    let var = finite.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    Some((mean, t975(n - 1) * (var / n as f64).sqrt()))
}

/// t(0.975, df): the table up to 30 degrees of freedom, then the
/// Cornish–Fisher expansion z + (z³ + z)/4ν + (5z⁵ + 16z³ + 3z)/96ν²
/// (within 10⁻³ of the exact value from 31 on).
fn t975(df: usize) -> f64 {
    if let Some(&t) = T975.get(df.wrapping_sub(1)) {
        return t;
    }
    let (z, v) = (1.959_964_f64, df as f64);
    z + (z.powi(3) + z) / (4.0 * v) + (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / (96.0 * v * v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_is_a_high_percentile_or_a_maximum_and_the_spread_says_how_many_runs() {
        let c = |m: &str| Constraint::parse(&format!("{m} <= 100")).unwrap();
        assert!(c("ttft_p99_ms").is_tail() && c("e2e_p95_ms").is_tail() && c("tpot_max_ms").is_tail());
        assert!(c("ttft_p999_ms").is_tail() && c("ttft_steady_p99_ms").is_tail());
        assert!(!c("ttft_p50_ms").is_tail() && !c("queue_wait_mean_ms").is_tail() && !c("ttft_p90_ms").is_tail());
        // 80 and 90: mean 85, half-width 12.706 × 5 = 63.5, 15 from 100:
        // 2 × (63.53/15)² = 35.9 → 36 runs.
        assert_eq!(c("ttft_p99_ms").replicates_for(&[80.0, 90.0]), Some(36));
        assert_eq!(c("ttft_p99_ms").replicates_for(&[100.0, 100.0]), None, "on the threshold");
        assert_eq!(c("ttft_p99_ms").replicates_for(&[80.0]), None, "no interval");
    }

    #[test]
    fn the_confidence_interval_is_the_student_t_one() {
        assert_eq!(mean_ci(&[]), None);
        assert_eq!(mean_ci(&[4.0]), Some((4.0, 0.0)));
        // 1, 2, 3: mean 2, s = 1, n = 3 → 4.303 · 1/√3 = 2.4843.
        let (m, h) = mean_ci(&[1.0, 2.0, 3.0]).unwrap();
        assert_eq!(m, 2.0);
        assert!((h - 4.303 / 3f64.sqrt()).abs() < 1e-12, "{h}");
    }

    #[test]
    fn t_quantiles_continue_smoothly_past_the_table() {
        assert_eq!(t975(1), 12.706);
        assert_eq!(t975(30), 2.042);
        // Exact values: t(0.975, 31) = 2.0395, t(0.975, 60) = 2.0003, t(0.975, 120) = 1.9799.
        for (df, exact) in [(31, 2.0395), (60, 2.0003), (120, 1.9799)] {
            assert!((t975(df) - exact).abs() < 1e-3, "df {df}: {}", t975(df));
        }
    }
}
