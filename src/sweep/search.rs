//! `[search]`: the capacity question answered directly — per grid point,
//! the largest value of one parameter (a request rate, a bandwidth) or the
//! smallest (a worker count) whose runs meet every SLO constraint.
//!
//! The search assumes the SLO holds on one side of the answer and fails on
//! the other (a monotone capacity curve). Per grid point it probes the
//! bound on the good side (`min` when maximising, `max` when minimising;
//! if that fails there is no answer), then brackets by doubling towards the
//! other bound (halving when minimising) until a probe fails or the bound
//! is reached (the answer is then the bound), then bisects the bracket
//! until it is narrower than `tolerance` × the value (whole numbers: until
//! the two ends are neighbours). The answer is the last passing value.
//!
//! A probe runs `sweep.replicates` runs, seeds `base_seed + replicate` —
//! the same seeds at every probe, so probes are compared on the same
//! request streams (common random numbers). Its verdict: for each
//! constraint `metric <= v`, the upper end of the 95 % Student-t interval
//! of the replicates' mean must be ≤ v (for `>=`, the lower end ≥ v): a
//! probe passes only when the SLO holds with 95 % confidence, so noise
//! makes the answer conservative, never optimistic. A failed run fails its
//! probe. With one replicate the interval is the value itself.
//!
//! Every probe's runs go into the usual tables, with columns for the
//! searched value, `probe` (its number within its grid point) and
//! `search_step` (`bound`, `bracket`, `bisect`); `search.parquet` has one
//! row per grid point. The probes of all grid points in one round run in
//! parallel; the probes a search makes depend only on the spec and the
//! runs' results, so the same spec gives the same probes and answers at any
//! `-j` and shard split (shards split the grid points).

use super::{RunPlan, Spec, SweepPlan, plan, runner};
use crate::config::ConfigError;
use crate::metrics::rows::col;
use crate::metrics::table::{Cell, ColType};
use crate::output::{AxisValue, RunMeta, RunResult};
pub use crate::stats::{Constraint, Verdict};

/// Most probes a grid point may have: run ids leave room for this many.
pub const MAX_PROBES: u32 = 64;
/// Most replicates a probe may have.
pub const MAX_REPLICATES: u32 = 64;
/// Replicates a probe may grow to unless `search.max_replicates` says otherwise.
pub const DEFAULT_MAX_REPLICATES: u32 = 8;

/// A resolved `[search]`.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchSpec {
    /// The dotted path searched.
    pub parameter: String,
    /// Bounds.
    pub min: f64,
    /// Bounds.
    pub max: f64,
    /// Largest passing value (else smallest).
    pub maximize: bool,
    /// Whole numbers.
    pub integer: bool,
    /// Relative step of the geometric grid the probes lie on (and so the
    /// answer's precision); whole numbers step by one.
    pub tolerance: f64,
    /// Probe budget per grid point.
    pub max_probes: u32,
    /// Replicates a probe starts with (`sweep.replicates`).
    pub replicates: u32,
    /// Most replicates a probe may grow to while its verdict is unclear.
    pub max_replicates: u32,
    /// All must hold.
    pub slo: Vec<Constraint>,
}

impl SearchSpec {
    /// ln(1 + tolerance): the geometric grid's step.
    /// Runs a pass needs: `max_replicates` when any constraint is on a tail
    /// statistic (p95 and above, or a maximum: heavy-tailed, barely paired
    /// by common random numbers — measured variance ratios 1.0–1.8 on TTFT
    /// p99 against 6.2 on E2E means — so a few close low samples can make a
    /// clear-looking interval far from the mean), else 4 (or `max_replicates`
    /// if fewer): a mean's interval is trusted once it is clear over 4 runs.
    pub fn pass_runs(&self) -> u32 {
        if self.slo.iter().any(Constraint::is_tail) { self.max_replicates } else { self.max_replicates.min(4) }
    }

    /// The replicates an unsettled probe grows to: at least double its runs;
    /// as many as its spread says its unclear constraints need
    /// ([`Constraint::replicates_for`]); when every constraint is already
    /// clear, the runs a pass needs — never more than `max_replicates`.
    pub fn more_replicates(&self, p: &Probe) -> u32 {
        let verdicts: Vec<Verdict> = self.slo.iter().zip(&p.samples).map(|(c, x)| c.verdict(x)).collect();
        let spread = self
            .slo
            .iter()
            .zip(&p.samples)
            .zip(&verdicts)
            .filter(|(_, v)| **v == Verdict::Unclear)
            .filter_map(|((c, x), _)| c.replicates_for(x))
            .max()
            .unwrap_or(0);
        let clear = p.runs >= 2 && verdicts.iter().all(|v| *v == Verdict::Pass);
        let pass = if clear { self.pass_runs() } else { 0 };
        (2 * p.runs.max(1)).max(spread).max(pass).min(self.max_replicates)
    }

    fn step(&self) -> f64 {
        self.tolerance.ln_1p()
    }

    /// The grid's `i`-th value: (1 + tolerance)^i, or `i` for whole numbers.
    fn at(&self, i: i64) -> f64 {
        if self.integer { i as f64 } else { (i as f64 * self.step()).exp() }
    }

    /// `v`'s position on the grid, and whether it is a grid value.
    fn index(&self, v: f64) -> (f64, bool) {
        let x = if self.integer { v } else { v.ln() / self.step() };
        (x, (x - x.round()).abs() < 1e-9)
    }

    /// The grid indices strictly between `a` and `b` (either order), as an
    /// inclusive range, or `None` when no grid value lies between.
    fn between(&self, a: f64, b: f64) -> Option<(i64, i64)> {
        let ((a, a_on), (b, b_on)) = (self.index(a.min(b)), self.index(a.max(b)));
        let lo = if a_on { a.round() as i64 + 1 } else { a.ceil() as i64 };
        let hi = if b_on { b.round() as i64 - 1 } else { b.floor() as i64 };
        (lo <= hi).then_some((lo, hi))
    }

    /// The grid value between `a` and `b` at the coarsest dyadic level:
    /// the index with the most trailing zero bits (the midpoint of an
    /// aligned power-of-two interval). So bisection visits the same grid
    /// values whatever end it starts from — the answer does not depend on
    /// `min` — in as many steps as halving would take.
    fn midway(&self, a: f64, b: f64) -> Option<f64> {
        self.between(a, b).map(|(lo, hi)| {
            // Offset so that negative indices (values below 1) order alike.
            let level = |i: i64| (i + (1 << 40)).trailing_zeros();
            let best = (lo..=hi).max_by_key(|&i| (level(i), std::cmp::Reverse((2 * i - lo - hi).abs())));
            self.at(best.expect("a non-empty range"))
        })
    }

    /// The grid value halfway by index between `a` and `b`, if any lies between.
    fn halfway(&self, a: f64, b: f64) -> Option<f64> {
        self.between(a, b).map(|(lo, hi)| self.at(lo + (hi - lo) / 2))
    }

    /// Grid steps in one doubling: ⌈ln 2 / ln(1 + tolerance)⌉ (integers: none; they double by value).
    fn doubling(&self) -> i64 {
        (std::f64::consts::LN_2 / self.step()).ceil() as i64
    }

    /// One bracketing step from `f` towards `far`: the next grid value
    /// whose index is a multiple of a doubling (so the bracket points are
    /// the same whatever `min` is; whole numbers: the next power of two),
    /// or `far` itself when that is as far or farther.
    fn bracket_from(&self, f: f64, far: f64) -> f64 {
        let next = if self.integer {
            let p = (f.max(1.0)).log2();
            let k = if self.maximize { p.floor() + 1.0 } else { p.ceil() - 1.0 };
            if self.maximize { 2f64.powf(k) } else { 2f64.powf(k.max(0.0)).min(f - 1.0).max(1.0) }
        } else {
            let d = self.doubling();
            let (i, _) = self.index(f);
            let i = i.round() as i64;
            let k = if self.maximize { i.div_euclid(d) + 1 } else { (i - 1).div_euclid(d) };
            self.at(k * d)
        };
        if self.maximize { next.min(far) } else { next.max(far) }
    }
}

/// Whether a search can set `parameter` to `value` in the spec's base
/// scenario: a path the scenario does not have (a typo), a value of the
/// wrong type there, or one the key refuses (out of its range), is an input
/// error before any run — not a failed first probe. The error is (what is
/// wrong, the fix).
pub(super) fn settable(spec: &Spec, parameter: &str, value: toml::Value) -> Result<(), (String, String)> {
    let shown = value.clone();
    let source = spec.source();
    let Ok((mut table, base_dir, scenario_source, _)) = super::base_scenario(spec, &source) else {
        return Ok(()); // the base's own error comes out when the sweep is planned
    };
    if let Err(m) = super::set_path(&mut table, parameter, value) {
        return Err((format!("`{parameter}` cannot be set: {m}"), "name a key of the scenario".into()));
    }
    // (A stage's keys are known only once its type is: resolve, too.)
    let checked = crate::config::spec_from_table(&table, &scenario_source)
        .and_then(|f| crate::config::resolve(&f, &scenario_source, &base_dir).map(|_| ()));
    match checked {
        Err(e) if e.kind == crate::config::ErrorKind::Schema => Err((
            format!("`{parameter}` is not a key a search can set: {}", e.message),
            e.hint.unwrap_or_else(|| "name a key of the scenario".into()),
        )),
        // The key itself refuses the value (out of its range): not a probe's failure.
        Err(e) if e.key.as_deref() == Some(parameter) => Err((
            format!("`{parameter}` cannot be {}: {}", value_text(&shown), e.message),
            e.hint.unwrap_or_else(|| "offer values the key accepts".into()),
        )),
        _ => Ok(()),
    }
}

/// A TOML value as the spec would write it.
fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => format!("{s:?}"),
        v => v.to_string(),
    }
}

/// The spec's `[search]`, checked (`None` without one).
pub fn search_spec(spec: &Spec) -> Result<Option<SearchSpec>, ConfigError> {
    let Some(s) = &spec.file.search else { return Ok(None) };
    let source = spec.source();
    let err = |k: &str, msg: String, hint: &str| {
        Err(ConfigError::key(&source, format!("search.{k}"), msg).hint(hint.to_string()).located())
    };
    match s.kind.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("capacity") => {}
        Some("pareto") => return Ok(None),
        Some(k) => {
            return err(
                "kind",
                format!("unknown search kind {k:?}"),
                "use \"capacity\" (one parameter's largest or smallest value meeting the SLO) or \"pareto\"",
            );
        }
    }
    for (key, set) in [
        ("parameters", !s.parameters.is_empty()),
        ("objectives", !s.objectives.is_empty()),
        ("max_points", s.max_points.is_some()),
    ] {
        if set {
            return err(key, format!("`{key}` belongs to a Pareto search"), "set kind = \"pareto\", or remove it");
        }
    }
    let (Some(parameter), Some(min), Some(max)) = (s.parameter.clone(), s.min, s.max) else {
        let missing = [("parameter", s.parameter.is_none()), ("min", s.min.is_none()), ("max", s.max.is_none())];
        let (key, _) = missing.iter().find(|(_, m)| *m).expect("one is missing");
        return err(
            key,
            format!("a capacity search needs `parameter`, `min` and `max`; `{key}` is missing"),
            "e.g. parameter = \"workload.stages.0.workload_params.request_rate\", min = 1, max = 256",
        );
    };
    let maximize = match s.direction.to_ascii_lowercase().as_str() {
        "maximize" | "maximise" | "max" => true,
        "minimize" | "minimise" | "min" => false,
        d => {
            return err(
                "direction",
                format!("unknown direction {d:?}"),
                "use \"maximize\" (a rate) or \"minimize\" (a count)",
            );
        }
    };
    if !(min.is_finite() && max.is_finite() && min > 0.0 && min < max) {
        return err("min", format!("bounds [{min}, {max}] are not 0 < min < max"), "e.g. min = 1, max = 64");
    }
    if !(s.tolerance.is_finite() && s.tolerance >= 1e-4 && s.tolerance < 1.0) {
        return err(
            "tolerance",
            format!("must be in [0.0001, 1), got {}", s.tolerance),
            "e.g. 0.01 (1 % of the value)",
        );
    }
    if s.max_probes < 2 || s.max_probes > MAX_PROBES {
        return err("max_probes", format!("must be 2 to {MAX_PROBES}, got {}", s.max_probes), "the default is 40");
    }
    let replicates = spec.file.sweep.replicates.unwrap_or(1).max(1);
    let max_replicates = s.max_replicates.unwrap_or(DEFAULT_MAX_REPLICATES.max(replicates));
    if max_replicates < replicates || max_replicates > MAX_REPLICATES {
        return err(
            "max_replicates",
            format!("must be sweep.replicates ({replicates}) to {MAX_REPLICATES}, got {max_replicates}"),
            "the default is 8 (or sweep.replicates when that is more)",
        );
    }
    if s.slo.is_empty() {
        return err("slo", "no constraints".into(), "e.g. slo = [\"ttft_p99_ms <= 2000\"]");
    }
    let mut slo = Vec::new();
    for (i, c) in s.slo.iter().enumerate() {
        match Constraint::parse(c) {
            Ok(c) => slo.push(c),
            Err(m) => return err(&format!("slo.{i}"), m, "write e.g. \"tpot_p99_ms <= 50\" (a runs-table column)"),
        }
    }
    if spec.file.grid.contains_key(&parameter) || spec.file.zip.iter().any(|z| z.contains_key(&parameter)) {
        return err(
            "parameter",
            format!("`{parameter}` is also a grid axis"),
            "search a parameter the grid does not vary",
        );
    }
    // Whole numbers when the scenario has an integer there (a worker count),
    // written in the spec or, when it is not, as the schema's default is.
    let at = |table: toml::Table| {
        parameter.split('.').try_fold(toml::Value::Table(table), |v, seg| match v {
            toml::Value::Table(mut t) => t.remove(seg),
            toml::Value::Array(mut a) => seg.parse::<usize>().ok().filter(|&i| i < a.len()).map(|i| a.swap_remove(i)),
            _ => None,
        })
    };
    let current = at(spec.table.clone())
        .or_else(|| crate::config::effective::effective_table(&spec.file, None, spec.base_dir()).ok().and_then(at));
    let integer = s.integer.unwrap_or(matches!(current, Some(toml::Value::Integer(_))));
    if integer && (min.fract() != 0.0 || max.fract() != 0.0) {
        return err("min", format!("an integer search needs whole bounds, got [{min}, {max}]"), "round the bounds");
    }
    let v = if integer { toml::Value::Integer(min as i64) } else { toml::Value::Float(min) };
    if let Err((msg, hint)) = settable(spec, &parameter, v) {
        return err("parameter", msg, &hint);
    }
    Ok(Some(SearchSpec {
        parameter,
        min,
        max,
        maximize,
        integer,
        tolerance: s.tolerance,
        max_probes: s.max_probes,
        replicates,
        max_replicates,
        slo,
    }))
}

/// How a grid point's search ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The bracket closed on neighbouring grid values.
    Found,
    /// The far bound passes: the answer is at least (at most) it.
    AtBound,
    /// Even the good bound fails: no value meets the SLO.
    Infeasible,
    /// The probe budget ran out (the answer is the last passing value).
    ProbeLimit,
    /// The bracket closed, but a value beyond the first failing one passed
    /// (a check above it, or an earlier answer a failing check undercut):
    /// verdicts are not monotone in the parameter; the answer is the best
    /// value short of the first failure.
    NonMonotone,
    /// The first failing value (or the good bound) failed because fewer
    /// than half its runs reached a steady state: the runs are too short to
    /// tell where the answer is. The answer, if any, is a passing value,
    /// but a longer run may pass beyond it.
    TooShort,
}

impl Status {
    /// The name in `search.parquet`.
    pub fn name(self) -> &'static str {
        match self {
            Status::Found => "found",
            Status::AtBound => "at_bound",
            Status::Infeasible => "infeasible",
            Status::ProbeLimit => "probe_limit",
            Status::NonMonotone => "non_monotone",
            Status::TooShort => "too_short",
        }
    }
}

/// One probe: the value, why it was probed, its runs' figures and its verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    /// The parameter's value.
    pub value: f64,
    /// `bound`, `bracket`, `bisect` or `check`.
    pub step: &'static str,
    /// Every constraint held (95 % confidence); meaningful once `settled`.
    pub pass: bool,
    /// The verdict is final: clear, or unclear at `max_replicates` (then a fail).
    pub settled: bool,
    /// Mean of each SLO metric over the replicates (NaN if none).
    pub means: Vec<f64>,
    /// Each SLO metric's value in each successful run, in replicate order.
    pub samples: Vec<Vec<f64>>,
    /// Runs so far.
    pub runs: u32,
    /// Of those, failed.
    pub failed: u32,
    /// Of those, whose queue kept growing (a majority fails the probe).
    pub unstable: u32,
    /// Of those, too short to tell whether they reached a steady state.
    pub too_short: u32,
    /// Of those, stable (a pass needs at least half).
    pub stable: u32,
    /// It failed because fewer than half its runs were stable (and not
    /// because its SLO metrics failed or its queue kept growing).
    pub short: bool,
    /// The largest run length its too-short runs suggest (0 if none).
    pub requests_needed: u64,
    /// GPUs of each successful run (GPU-hours over the run's hours: the
    /// deployment's GPUs, `tp` × workers over every pool, averaged over the
    /// run when autoscaling changes them).
    pub gpus: Vec<f64>,
    /// Dollars per hour of each successful run (GPUs and KV tiers at their
    /// prices; empty without a GPU price).
    pub usd_per_hour: Vec<f64>,
}

impl Probe {
    /// A probe of `value` with no runs yet.
    pub fn new(value: f64, step: &'static str, constraints: usize) -> Probe {
        Probe {
            value,
            step,
            pass: false,
            settled: false,
            means: vec![f64::NAN; constraints],
            samples: vec![Vec::new(); constraints],
            runs: 0,
            failed: 0,
            unstable: 0,
            too_short: 0,
            stable: 0,
            short: false,
            requests_needed: 0,
            gpus: Vec::new(),
            usd_per_hour: Vec::new(),
        }
    }

    /// Mean GPUs of its runs (NaN if none succeeded).
    pub fn mean_gpus(&self) -> f64 {
        crate::stats::mean_ci(&self.gpus).map_or(f64::NAN, |m| m.0)
    }

    /// Mean dollars per hour of its runs (NaN without prices).
    pub fn mean_usd_per_hour(&self) -> f64 {
        crate::stats::mean_ci(&self.usd_per_hour).map_or(f64::NAN, |m| m.0)
    }

    /// Adds runs' results and re-judges: a failed run, or a majority of
    /// unstable ones, fails the probe; otherwise each constraint's 95 %
    /// interval decides, a pass needs at least half the runs `stable`, and an
    /// unclear verdict (or a single replicate, which has no interval) waits
    /// for more replicates until `max_replicates` are in (then it fails).
    pub fn add(&mut self, s: &SearchSpec, results: &[&RunResult]) {
        for r in results {
            self.runs += 1;
            let Ok(o) = &r.outcome else {
                self.failed += 1;
                continue;
            };
            match o.summary.steady.stability {
                crate::metrics::steady::Stability::Unstable => self.unstable += 1,
                crate::metrics::steady::Stability::TooShort => {
                    self.too_short += 1;
                    self.requests_needed = self.requests_needed.max(o.summary.steady.requests_needed);
                }
                crate::metrics::steady::Stability::Stable => self.stable += 1,
            }
            let hours = o.summary.sim_time_s / 3600.0;
            self.gpus.push(o.summary.cost.gpu_hours / hours);
            // Without a GPU price there is nothing to add up (and NaN would
            // make equal probes unequal).
            let usd = (o.summary.cost.usd + o.summary.tier_cost.usd) / hours;
            if usd.is_finite() {
                self.usd_per_hour.push(usd);
            }
            let columns = o.summary.columns();
            for (c, samples) in s.slo.iter().zip(&mut self.samples) {
                let v = columns.iter().find(|(n, _)| *n == c.metric).map_or(f64::NAN, |(_, v)| match *v {
                    crate::metrics::SummaryValue::Count(x) => x as f64,
                    crate::metrics::SummaryValue::Real(x) => x,
                    crate::metrics::SummaryValue::Label(_) => f64::NAN,
                });
                samples.push(v);
            }
        }
        self.judge(s);
    }

    /// The verdict from the samples so far.
    fn judge(&mut self, s: &SearchSpec) {
        self.means = self.samples.iter().map(|x| crate::stats::mean_ci(x).map_or(f64::NAN, |m| m.0)).collect();
        let verdicts: Vec<Verdict> = s.slo.iter().zip(&self.samples).map(|(c, x)| c.verdict(x)).collect();
        // One run has no interval: unless it failed outright, a second
        // decides. A failure may settle early, a pass needs all
        // `max_replicates` runs: tail percentiles near saturation are
        // heavy-tailed, and a few close low samples make a clear-looking
        // interval far from the mean (with 4 runs, five base seeds'
        // answers spread over two grid steps; with 8, over one).
        // A failed run fails the probe; so does a majority of unstable runs
        // (one unstable run among stable ones is the trend test's false
        // alarm rate at work). A pass needs steady evidence: at least half
        // the runs `stable` — a short run near capacity ends before its
        // queue builds up, and its tail latencies pass an SLO the steady
        // state misses (measured: 1,500-request runs answered 27 % above
        // 64,000-request ones, none of the runs at the answer stable). It is
        // judged on all `max_replicates` runs, as a pass is (the verdicts of
        // runs near capacity are noisy: two runs can both be too short where
        // six of eight are stable), and a probe that fails it is `short`.
        self.short = false;
        let verdict = if self.failed > 0 || 2 * self.unstable > self.runs {
            Verdict::Fail
        } else if self.runs < 2 && s.max_replicates >= 2 {
            Verdict::Unclear
        } else if verdicts.contains(&Verdict::Fail) {
            Verdict::Fail
        } else if verdicts.contains(&Verdict::Unclear) || self.runs < s.pass_runs() {
            Verdict::Unclear
        } else if 2 * self.stable < self.runs {
            self.short = true;
            Verdict::Fail
        } else {
            Verdict::Pass
        };
        self.pass = verdict == Verdict::Pass;
        self.settled = verdict != Verdict::Unclear || self.runs >= s.max_replicates;
    }
}

/// What a grid point runs next.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Next {
    /// A new probe of this value.
    Probe(f64, &'static str),
    /// More replicates of the last probe: `count` of them from replicate `from`.
    Replicates {
        /// The first new replicate.
        from: u32,
        /// How many.
        count: u32,
    },
}

/// A grid point's search.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PointSearch {
    /// Probes so far, in order.
    pub probes: Vec<Probe>,
    /// How it ended (`None`: still going).
    pub status: Option<Status>,
}

impl PointSearch {
    /// The nearest failing value to the good bound, and the best passing
    /// value short of it (settled probes): so the answer is a value every
    /// probe up to which passed — conservative when noise or the metric
    /// makes verdicts non-monotone.
    pub fn bracket(&self, s: &SearchSpec) -> (Option<f64>, Option<f64>) {
        let better = |a: f64, b: f64| if s.maximize { a > b } else { a < b };
        let settled = || self.probes.iter().filter(|p| p.settled);
        let fail = settled().filter(|p| !p.pass).map(|p| p.value).reduce(|a, b| if better(a, b) { b } else { a });
        let pass = settled()
            .filter(|p| p.pass && fail.is_none_or(|u| better(u, p.value)))
            .map(|p| p.value)
            .reduce(|a, b| if better(a, b) { a } else { b });
        (pass, fail)
    }

    /// What to run next, or `None` when the search is over (then `status` is set).
    pub fn next(&mut self, s: &SearchSpec) -> Option<Next> {
        if self.status.is_some() {
            return None;
        }
        if let Some(last) = self.probes.last().filter(|p| !p.settled) {
            return Some(Next::Replicates { from: last.runs, count: s.more_replicates(last) - last.runs });
        }
        let (good, far) = if s.maximize { (s.min, s.max) } else { (s.max, s.min) };
        let Some(first) = self.probes.first() else { return Some(Next::Probe(good, "bound")) };
        let (pass, fail) = self.bracket(s);
        let Some(f) = pass.filter(|_| first.pass) else {
            self.status = Some(if first.short { Status::TooShort } else { Status::Infeasible });
            return None;
        };
        if self.probes.len() as u32 >= s.max_probes {
            self.status = Some(Status::ProbeLimit);
            return None;
        }
        let Some(u) = fail else {
            if f == far {
                self.status = Some(Status::AtBound);
                return None;
            }
            return Some(Next::Probe(s.bracket_from(f, far), "bracket"));
        };
        if let Some(mid) = s.midway(f, u) {
            return Some(Next::Probe(mid, "bisect"));
        }
        // The bracket is closed: check the grid value just short of the
        // answer, one halfway back to the good bound and one halfway from
        // the failure to the far bound (each once). A failing check below
        // moves the bracket down and the search goes on from there.
        let short_of = s.between(good, f).map(|(lo, hi)| s.at(if s.maximize { hi } else { lo }));
        let wanted = [short_of, s.halfway(good, f), if u == far { None } else { s.halfway(u, far) }];
        let probed = |v: f64| self.probes.iter().any(|p| p.value == v);
        if let Some(v) = wanted.into_iter().flatten().find(|&v| !probed(v)) {
            return Some(Next::Probe(v, "check"));
        }
        // Non-monotone: a value beyond the first failure passed (a check
        // above it, or an earlier answer a check below has undercut).
        let beyond = |v: f64| if s.maximize { v > u } else { v < u };
        let odd = self.probes.iter().any(|p| p.settled && p.pass && beyond(p.value));
        let short = self.probes.iter().any(|p| p.settled && p.short && p.value == u);
        self.status = Some(if short {
            Status::TooShort
        } else if odd {
            Status::NonMonotone
        } else {
            Status::Found
        });
        None
    }

    /// The run length the too-short runs at the first failing value (or,
    /// with no answer, at the good bound) suggest: 0 unless the status is
    /// [`Status::TooShort`].
    pub fn requests_needed(&self, s: &SearchSpec) -> u64 {
        if self.status != Some(Status::TooShort) {
            return 0;
        }
        let at = self.bracket(s).1.or(self.probes.first().map(|p| p.value));
        self.probes.iter().filter(|p| Some(p.value) == at).map(|p| p.requests_needed).max().unwrap_or(0)
    }

    /// The answer: the last passing value.
    pub fn answer(&self, s: &SearchSpec) -> Option<f64> {
        self.bracket(s).0
    }

    /// Runs too short to tell whether they reached a steady state, over every probe.
    pub fn too_short(&self) -> u32 {
        self.probes.iter().map(|p| p.too_short).sum()
    }

    /// Runs whose queue kept growing, over every probe.
    pub fn unstable(&self) -> u32 {
        self.probes.iter().map(|p| p.unstable).sum()
    }
}

/// What a round probes, for the progress line: with one grid point, the
/// value, why, and the bracket so far; with several, how many are done.
fn round_text(
    s: &SearchSpec,
    states: &[(usize, PointSearch)],
    jobs: &[(usize, u32, f64, &'static str, u32, u32)],
) -> String {
    let probes: usize = states.iter().map(|(_, st)| st.probes.len()).sum();
    if let [(_, st)] = states
        && let [(_, k, v, step, from, _)] = jobs
    {
        let (pass, fail) = st.bracket(s);
        let show = |x: Option<f64>| {
            x.map_or("–".to_string(), |x| format!("{x:.4}").trim_end_matches('0').trim_end_matches('.').to_string())
        };
        let what =
            if *from == 0 { format!("probe {} ({step})", k + 1) } else { format!("probe {} (more replicates)", k + 1) };
        return format!(
            "{what}: {} = {}; passes up to {}, fails from {}",
            s.parameter,
            show(Some(*v)),
            show(pass),
            show(fail)
        );
    }
    let done = states.iter().filter(|(_, st)| st.status.is_some()).count();
    format!("{} of {} points answered; {probes} probes so far", done, states.len())
}

/// The spec of one round: the grid replaced by one `[[zip]]` axis whose
/// rows are the probes (each grid point's axis values and the probed value).
fn round_spec(spec: &Spec, base: &SweepPlan, s: &SearchSpec, probes: &[(usize, f64)]) -> Spec {
    let mut round = spec.clone();
    round.file.grid = toml::Table::new();
    let paths: Vec<String> =
        base.points[0].overrides.iter().map(|(p, _)| p.clone()).chain([s.parameter.clone()]).collect();
    let mut zip = toml::Table::new();
    for (k, path) in paths.iter().enumerate() {
        let values = probes
            .iter()
            .map(|&(p, v)| match base.points[p].overrides.get(k) {
                Some((_, value)) => value.clone(),
                None if s.integer => toml::Value::Integer(v as i64),
                None => toml::Value::Float(v),
            })
            .collect();
        zip.insert(path.clone(), toml::Value::Array(values));
    }
    round.file.zip = vec![zip];
    round
}

/// What a search did, per grid point (in this shard).
#[derive(Clone, Debug)]
pub struct SearchReport {
    /// The search.
    pub spec: SearchSpec,
    /// (grid point id, its axis values as text, its search).
    pub points: Vec<(u32, String, PointSearch)>,
    /// The sweep-level report of every probe's runs.
    pub runs: runner::SweepReport,
}

impl SearchReport {
    /// Probes in all.
    pub fn probes(&self) -> usize {
        self.points.iter().map(|(_, _, p)| p.probes.len()).sum()
    }
}

/// The tables of a search: the grid's plus the searched value, `probe` and `search_step`.
pub fn search_tables(base: &SweepPlan, s: &SearchSpec) -> crate::output::TableSet {
    let mut tables = base.tables.clone();
    tables.axis_columns.push((s.parameter.clone(), if s.integer { ColType::I64 } else { ColType::F64 }));
    tables.axis_columns.push(("probe".into(), ColType::I64));
    tables.axis_columns.push(("search_step".into(), ColType::Str));
    tables
}

/// Runs the search of `spec` (grid expanded in `base`) per `opts`.
pub fn run_search(
    spec: &Spec,
    base: &SweepPlan,
    s: &SearchSpec,
    opts: &runner::RunnerOptions,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<SearchReport, runner::SweepError> {
    let mut states: Vec<(usize, PointSearch)> = (0..base.points.len())
        .filter(|&p| opts.shard.is_none_or(|sh| sh.count <= 1 || p as u32 % sh.count == sh.index))
        .map(|p| (p, PointSearch::default()))
        .collect();
    let described = serde_json::json!({
        "parameter": s.parameter,
        "maximize": s.maximize,
        "slo": s.slo.iter().map(|c| serde_json::json!({"metric": c.metric, "at_most": c.at_most, "value": c.value})).collect::<Vec<_>>(),
    });
    let mut writer = runner::SearchWriter::start(base, search_tables(base, s), described, opts)?;
    loop {
        // (state index, probe number, value, step, first replicate, count)
        let mut jobs: Vec<(usize, u32, f64, &'static str, u32, u32)> = Vec::new();
        for (i, (_, st)) in states.iter_mut().enumerate() {
            match st.next(s) {
                Some(Next::Probe(v, step)) => {
                    st.probes.push(Probe::new(v, step, s.slo.len()));
                    jobs.push((i, st.probes.len() as u32 - 1, v, step, 0, s.replicates));
                }
                Some(Next::Replicates { from, count }) => {
                    let last = st.probes.last().expect("replicates of a probe");
                    jobs.push((i, st.probes.len() as u32 - 1, last.value, last.step, from, count));
                }
                None => {}
            }
        }
        if jobs.is_empty() || stop.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        let values: Vec<(usize, f64)> = jobs.iter().map(|&(i, _, v, ..)| (states[i].0, v)).collect();
        let round = round_spec(spec, base, s, &values);
        let round_plan = plan(&round).map_err(runner::SweepError::Plan)?;
        let runs: Vec<(RunPlan<'_>, Vec<AxisValue>)> = jobs
            .iter()
            .enumerate()
            .flat_map(|(j, &(i, k, v, step, from, count))| {
                let p = states[i].0;
                let point = &round_plan.points[j];
                let mut axes = base.points[p].axis_values.clone();
                axes.push(if s.integer { AxisValue::Int(v as i64) } else { AxisValue::Float(v) });
                axes.push(AxisValue::Int(i64::from(k)));
                axes.push(AxisValue::Str(step.into()));
                (from..from + count).map(move |r| {
                    let seed = super::seed_for(base.base_seed, r);
                    let point_id = base.points[p].id * MAX_PROBES + k;
                    let meta = RunMeta {
                        run_id: point_id * s.max_replicates + r,
                        point_id,
                        replicate: r,
                        seed,
                        run_key: super::run_key(point.key, seed),
                    };
                    (RunPlan { meta, point }, axes.clone())
                })
            })
            .collect();
        writer.round(&round_text(s, &states, &jobs), runs.len());
        let results = writer.execute(&runs, stop)?;
        let mut at = 0;
        for &(i, k, .., count) in &jobs {
            let mine: Vec<&RunResult> = results[at..at + count as usize].iter().collect();
            at += count as usize;
            states[i].1.probes[k as usize].add(s, &mine);
        }
        writer.flush(results)?;
    }
    let runs = writer.finish()?;
    let points =
        states.into_iter().map(|(p, st)| (base.points[p].id, base.points[p].describe(), st)).collect::<Vec<_>>();
    let report = SearchReport { spec: s.clone(), points, runs };
    write_search_table(base, &report, opts)?;
    Ok(report)
}

/// `search.parquet` (or, for a shard, its part): one row per grid point.
fn write_search_table(
    base: &SweepPlan,
    r: &SearchReport,
    opts: &runner::RunnerOptions,
) -> Result<(), runner::SweepError> {
    let s = &r.spec;
    let mut columns: Vec<(String, ColType)> = vec![(col::POINT_ID.into(), ColType::U32)];
    columns.extend(base.tables.axis_columns.iter().cloned());
    columns.extend([
        ("parameter".into(), ColType::Str),
        ("found".into(), ColType::F64),
        ("status".into(), ColType::Str),
        ("bracket_pass".into(), ColType::F64),
        ("bracket_fail".into(), ColType::F64),
        ("probes".into(), ColType::U32),
        ("runs".into(), ColType::U32),
        ("replicates_at_found".into(), ColType::U32),
        ("unstable_runs".into(), ColType::U32),
        ("too_short_runs".into(), ColType::U32),
        (col::REQUESTS_NEEDED.into(), ColType::U64),
        ("gpus_at_found".into(), ColType::F64),
        ("usd_per_hour_at_found".into(), ColType::F64),
    ]);
    columns.extend(s.slo.iter().map(|c| (format!("{}_at_found", c.metric), ColType::F64)));
    let mut rows: Vec<Vec<Cell<'_>>> = Vec::new();
    for (id, _, st) in &r.points {
        let point = base.points.iter().find(|p| p.id == *id).expect("a searched point is in the plan");
        let (pass, fail) = st.bracket(s);
        let mut row = vec![Cell::U32(*id)];
        row.extend(point.axis_values.iter().map(AxisValue::cell_of));
        row.push(Cell::Str(&s.parameter));
        row.push(pass.map_or(Cell::Null, Cell::F64));
        row.push(Cell::Str(st.status.map_or("interrupted", Status::name)));
        row.push(pass.map_or(Cell::Null, Cell::F64));
        row.push(fail.map_or(Cell::Null, Cell::F64));
        row.push(Cell::U32(st.probes.len() as u32));
        let at = pass.and_then(|v| st.probes.iter().find(|p| p.pass && p.value == v));
        row.push(Cell::U32(st.probes.iter().map(|p| p.runs).sum()));
        row.push(at.map_or(Cell::Null, |p| Cell::U32(p.runs)));
        row.push(Cell::U32(st.unstable()));
        row.push(Cell::U32(st.too_short()));
        row.push(match st.requests_needed(s) {
            0 => Cell::Null,
            n => Cell::U64(n),
        });
        row.push(at.map_or(Cell::Null, |p| Cell::F64(p.mean_gpus())));
        row.push(at.map(Probe::mean_usd_per_hour).filter(|v| v.is_finite()).map_or(Cell::Null, Cell::F64));
        for i in 0..s.slo.len() {
            row.push(at.map_or(Cell::Null, |p| Cell::F64(p.means[i])));
        }
        rows.push(row);
    }
    let name = match opts.shard.filter(|sh| sh.count > 1) {
        Some(sh) => {
            let dir = opts.output.join("parts");
            std::fs::create_dir_all(&dir).map_err(|e| runner::SweepError::io(&dir, "", e))?;
            dir.join(format!("search.s{}of{}.parquet", sh.index, sh.count))
        }
        None => opts.output.join("search.parquet"),
    };
    crate::output::write_rows(&name, &columns, &rows).map_err(runner::SweepError::Output)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(maximize: bool, integer: bool) -> SearchSpec {
        SearchSpec {
            parameter: "x".into(),
            min: 1.0,
            max: 64.0,
            maximize,
            integer,
            tolerance: 0.01,
            max_probes: 40,
            replicates: 1,
            max_replicates: 1,
            slo: vec![],
        }
    }

    /// Runs the search against `pass(value)`, one settled run per probe.
    fn search_with(s: &SearchSpec, pass: impl Fn(f64) -> bool) -> (PointSearch, Vec<(f64, &'static str)>) {
        let mut st = PointSearch::default();
        let mut seen = Vec::new();
        while let Some(next) = st.next(s) {
            let Next::Probe(v, step) = next else { panic!("one replicate is always settled") };
            seen.push((v, step));
            let mut p = Probe::new(v, step, 0);
            (p.pass, p.settled, p.runs) = (pass(v), true, 1);
            st.probes.push(p);
        }
        (st, seen)
    }

    /// Passes iff value ≤ limit (maximise) or ≥ limit (minimise).
    fn search(s: &SearchSpec, limit: f64) -> (PointSearch, Vec<(f64, &'static str)>) {
        let max = s.maximize;
        search_with(s, move |v| if max { v <= limit } else { v >= limit })
    }

    #[test]
    fn maximising_brackets_by_doubling_then_bisects_on_the_geometric_grid() {
        let s = spec(true, false);
        let (st, seen) = search(&s, 10.0);
        // 1.01^70 = 2.007: doubling is 70 grid steps. 1, then 1.01^70, 1.01^140 … pass to 1.01^210 = 8.07; 1.01^280 = 16.2 fails.
        let bracket: Vec<f64> = seen.iter().take_while(|p| p.1 != "bisect").map(|p| p.0).collect();
        assert_eq!(bracket.len(), 5, "{seen:?}");
        for (k, v) in bracket.iter().enumerate().skip(1) {
            assert!((v - 1.01f64.powi(70 * k as i32)).abs() < 1e-9, "{v}");
        }
        // The answer is the largest grid value ≤ 10: 1.01^231 = 9.96 (1.01^232 = 10.06).
        let found = st.answer(&s).unwrap();
        assert!((found - 1.01f64.powi(231)).abs() < 1e-9, "{found}");
        assert!((st.bracket(&s).1.unwrap() - 1.01f64.powi(232)).abs() < 1e-9);
        assert_eq!(st.status, Some(Status::Found));
        // Two check probes: one below the answer, one between the failure and the bound.
        let checks: Vec<f64> = seen.iter().filter(|p| p.1 == "check").map(|p| p.0).collect();
        assert_eq!(checks.len(), 2);
        assert!(checks[0] < found && checks[1] > 10.0 && checks[1] < 64.0, "{checks:?}");
    }

    #[test]
    fn the_answer_does_not_depend_on_min() {
        // The case: min = 1, 293 or 291 gave 288 / 293 / 295.5.
        let answers: Vec<f64> = [1.0, 291.0, 293.0, 250.0]
            .iter()
            .map(|&min| {
                let s = SearchSpec { min, max: 4096.0, ..spec(true, false) };
                search(&s, 294.0).0.answer(&s).unwrap()
            })
            .collect();
        assert!(answers.iter().all(|&a| a == answers[0]), "{answers:?}");
        assert!(answers[0] <= 294.0 && answers[0] * 1.01 > 294.0, "{answers:?}");
    }

    #[test]
    fn whole_numbers_end_on_neighbours_and_bounds_are_reported() {
        // Minimise a count: passes from 11 up. 64, 32, 16 pass; 8 fails; 12, 10, 11; then checks at 37 (below) and 5 (beyond).
        let s = spec(false, true);
        let (st, seen) = search(&s, 11.0);
        assert_eq!(seen.iter().map(|p| p.0).collect::<Vec<_>>(), [64.0, 32.0, 16.0, 8.0, 12.0, 10.0, 11.0, 37.0, 5.0]);
        assert_eq!((st.answer(&s), st.status), (Some(11.0), Some(Status::Found)));
        // Everything passes: the far bound is the answer.
        let (st, _) = search(&spec(true, true), 1000.0);
        assert_eq!((st.answer(&spec(true, true)), st.status), (Some(64.0), Some(Status::AtBound)));
        // Nothing passes.
        let (st, seen) = search(&spec(true, false), 0.5);
        assert_eq!((seen.len(), st.answer(&spec(true, false)), st.status), (1, None, Some(Status::Infeasible)));
    }

    #[test]
    fn a_metric_that_fails_then_passes_again_is_reported_non_monotone() {
        // Passes up to 10 and again from 30 on (power that rises, then falls with rate).
        let s = spec(true, true);
        let (st, _) = search_with(&s, |v| v <= 10.0 || v >= 30.0);
        assert_eq!(st.status, Some(Status::NonMonotone));
        assert_eq!(st.answer(&s), Some(10.0));
        // A failure below the answer is caught too.
        let (st, _) = search_with(&s, |v| v <= 20.0 && v != 10.0);
        assert_eq!(st.status, Some(Status::NonMonotone), "{:?}", st.probes);
        // And the answer moves below it: every probe up to the answer passed.
        assert_eq!(st.answer(&s), Some(9.0));
    }

    #[test]
    fn a_first_failure_for_lack_of_steady_runs_ends_too_short_with_a_run_length() {
        let s = spec(true, false);
        // Values up to 20 pass; above, the runs are too short (suggesting
        // 9,000 requests) up to 30, and beyond they fail the SLO.
        let mut st = PointSearch::default();
        while let Some(Next::Probe(v, step)) = st.next(&s) {
            let mut p = Probe::new(v, step, 0);
            (p.pass, p.settled, p.runs) = (v <= 20.0, true, 1);
            if v > 20.0 && v <= 30.0 {
                (p.short, p.requests_needed) = (true, 9000);
            }
            st.probes.push(p);
        }
        assert_eq!(st.status, Some(Status::TooShort), "{:?}", st.probes);
        assert!(st.answer(&s).unwrap() <= 20.0);
        assert_eq!(st.requests_needed(&s), 9000);
        // Failing the SLO there instead: found, and no run length to suggest.
        let (st, _) = search(&s, 20.0);
        assert_eq!((st.status, st.requests_needed(&s)), (Some(Status::Found), 0));
        // Too short at the good bound: too short, not infeasible.
        let mut st = PointSearch::default();
        let Some(Next::Probe(v, step)) = st.next(&s) else { panic!() };
        let mut p = Probe::new(v, step, 0);
        (p.settled, p.runs, p.short, p.requests_needed) = (true, 1, true, 4000);
        st.probes.push(p);
        assert_eq!(st.next(&s), None);
        assert_eq!((st.status, st.requests_needed(&s)), (Some(Status::TooShort), 4000));
    }

    #[test]
    fn replicates_follow_the_spread_and_a_mean_passes_on_fewer_than_a_tail() {
        let mean = SearchSpec {
            slo: vec![Constraint::parse("queue_wait_mean_ms <= 100").unwrap()],
            max_replicates: 8,
            ..spec(true, false)
        };
        let tail = SearchSpec { slo: vec![Constraint::parse("ttft_p99_ms <= 100").unwrap()], ..mean.clone() };
        assert_eq!((mean.pass_runs(), tail.pass_runs()), (4, 8));
        // 2 runs, 90 and 96: mean 93, half-width t(1) · s/√2 = 12.706 × 3 =
        // 38.1, 7 from the threshold: 2 × (38.1/7)² = 59.3 runs — capped at 8.
        let mut p = Probe::new(5.0, "bound", 1);
        p.samples[0].extend([90.0, 96.0]);
        p.runs = 2;
        assert_eq!(mean.more_replicates(&p), 8);
        // 2 runs at 50 and 51: clear already; a mean needs 4 to pass, a tail 8.
        p.samples[0] = vec![50.0, 51.0];
        assert_eq!((mean.more_replicates(&p), tail.more_replicates(&p)), (4, 8));
        p.judge(&mean);
        assert!(!p.settled, "2 runs do not pass");
        p.samples[0].extend([50.5, 50.0]);
        (p.runs, p.stable) = (4, 4);
        p.judge(&mean);
        assert!(p.settled && p.pass, "4 clear runs pass a mean");
        p.judge(&tail);
        assert!(!p.settled, "but not a tail");
    }

    #[test]
    fn an_unclear_verdict_doubles_its_replicates_up_to_the_cap_then_fails() {
        let s = SearchSpec {
            slo: vec![Constraint::parse("ttft_p99_ms <= 100").unwrap()],
            max_replicates: 8,
            ..spec(true, false)
        };
        let mut p = Probe::new(5.0, "bound", 1);
        p.samples[0].push(90.0);
        p.runs = 1;
        p.judge(&s);
        assert!(!p.settled, "one replicate has no interval");
        let mut st = PointSearch { probes: vec![p], status: None };
        assert_eq!(st.next(&s), Some(Next::Replicates { from: 1, count: 1 }));
        // 90 and 110: the interval straddles 100.
        let p = &mut st.probes[0];
        p.samples[0].push(110.0);
        p.runs = 2;
        p.judge(&s);
        assert!(!p.settled);
        assert_eq!(st.next(&s), Some(Next::Replicates { from: 2, count: 2 }));
        let p = &mut st.probes[0];
        p.samples[0].extend([95.0, 105.0, 99.0, 101.0, 100.0, 100.0]);
        p.runs = 8;
        p.judge(&s);
        assert!(p.settled && !p.pass, "unclear at the cap fails: never optimistic");
        // A clear pass needs all eight runs; a clear failure settles at two.
        let mut q = Probe::new(5.0, "bound", 1);
        q.samples[0].extend([50.0, 51.0, 50.5, 50.0]);
        q.runs = 4;
        q.judge(&s);
        assert!(!q.settled);
        q.samples[0].extend([50.0, 51.0, 50.5, 50.0]);
        q.runs = 8;
        q.stable = 8;
        q.judge(&s);
        assert!(q.settled && q.pass && !q.short);
        // A pass needs steady evidence: half the runs stable passes, fewer fail as `short`.
        (q.stable, q.too_short) = (4, 4);
        q.judge(&s);
        assert!(q.settled && q.pass);
        (q.stable, q.too_short) = (3, 5);
        q.judge(&s);
        assert!(q.settled && !q.pass && q.short);
        // One unstable run among eight is a false alarm; five are a growing queue.
        (q.stable, q.too_short, q.unstable) = (7, 0, 1);
        q.judge(&s);
        assert!(q.settled && q.pass);
        (q.stable, q.unstable) = (3, 5);
        q.judge(&s);
        assert!(q.settled && !q.pass && !q.short);
        let mut r = Probe::new(5.0, "bound", 1);
        r.samples[0].extend([300.0, 301.0]);
        r.runs = 2;
        r.judge(&s);
        assert!(r.settled && !r.pass);
    }

    #[test]
    fn a_verdict_needs_the_confidence_interval_on_the_right_side() {
        let c = Constraint::parse("ttft_p99_ms <= 100").unwrap();
        assert!(c.holds(&[90.0]));
        // Mean 95, s = 5, n = 2: half-width 12.706 · 5/√2 ≈ 44.9 — not sure enough.
        assert!(!c.holds(&[90.0, 100.0]));
        assert_eq!(c.verdict(&[90.0, 100.0]), Verdict::Unclear);
        assert_eq!(c.verdict(&[140.0, 160.0]), Verdict::Unclear);
        assert_eq!(c.verdict(&[190.0, 200.0]), Verdict::Fail);
        assert_eq!(c.verdict(&[300.0, 301.0]), Verdict::Fail);
        assert!(c.holds(&[90.0, 90.5, 91.0]));
        assert!(!c.holds(&[f64::NAN]));
        let g = Constraint::parse("requests_per_s >= 10").unwrap();
        assert!(g.holds(&[12.0, 12.0]) && !g.holds(&[9.0]));
        assert!(Constraint::parse("ttft_p99 <= 1").unwrap_err().contains("did you mean"));
        assert!(Constraint::parse("ttft_p99_ms < 1").is_err());
        for bad in ["ttft_p99_ms <= nan", "ttft_p99_ms <= inf", "requests_per_s >= -inf"] {
            assert!(Constraint::parse(bad).unwrap_err().contains("finite"), "{bad}");
        }
    }
}
