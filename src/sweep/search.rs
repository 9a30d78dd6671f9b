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
use crate::output::table::{Cell, ColType};
use crate::output::{AxisValue, RunMeta, RunResult};
pub use crate::stats::Constraint;

/// Most probes a grid point may have: run ids leave room for this many.
pub const MAX_PROBES: u32 = 64;

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
    /// Relative bracket width at which bisection stops.
    pub tolerance: f64,
    /// Probe budget per grid point.
    pub max_probes: u32,
    /// All must hold.
    pub slo: Vec<Constraint>,
}

/// The spec's `[search]`, checked (`None` without one).
pub fn search_spec(spec: &Spec) -> Result<Option<SearchSpec>, ConfigError> {
    let Some(s) = &spec.file.search else { return Ok(None) };
    let source = spec.source();
    let err = |k: &str, msg: String, hint: &str| {
        Err(ConfigError::key(&source, format!("search.{k}"), msg).hint(hint.to_string()).located())
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
    if !(s.min.is_finite() && s.max.is_finite() && s.min > 0.0 && s.min < s.max) {
        return err("min", format!("bounds [{}, {}] are not 0 < min < max", s.min, s.max), "e.g. min = 1, max = 64");
    }
    if !(s.tolerance.is_finite() && s.tolerance > 0.0 && s.tolerance < 1.0) {
        return err("tolerance", format!("must be in (0, 1), got {}", s.tolerance), "e.g. 0.01 (1 % of the value)");
    }
    if s.max_probes < 2 || s.max_probes > MAX_PROBES {
        return err("max_probes", format!("must be 2 to {MAX_PROBES}, got {}", s.max_probes), "the default is 40");
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
    if spec.file.grid.contains_key(&s.parameter) || spec.file.zip.iter().any(|z| z.contains_key(&s.parameter)) {
        return err(
            "parameter",
            format!("`{}` is also a grid axis", s.parameter),
            "search a parameter the grid does not vary",
        );
    }
    // Whole numbers when the scenario has an integer there (a worker count),
    // written in the spec or, when it is not, as the schema's default is.
    let at = |table: toml::Table| {
        s.parameter.split('.').try_fold(toml::Value::Table(table), |v, seg| match v {
            toml::Value::Table(mut t) => t.remove(seg),
            toml::Value::Array(mut a) => seg.parse::<usize>().ok().filter(|&i| i < a.len()).map(|i| a.swap_remove(i)),
            _ => None,
        })
    };
    let current = at(spec.table.clone())
        .or_else(|| crate::config::effective::effective_table(&spec.file, None, spec.base_dir()).ok().and_then(at));
    let integer = s.integer.unwrap_or(matches!(current, Some(toml::Value::Integer(_))));
    if integer && (s.min.fract() != 0.0 || s.max.fract() != 0.0) {
        return err(
            "min",
            format!("an integer search needs whole bounds, got [{}, {}]", s.min, s.max),
            "round the bounds",
        );
    }
    Ok(Some(SearchSpec {
        parameter: s.parameter.clone(),
        min: s.min,
        max: s.max,
        maximize,
        integer,
        tolerance: s.tolerance,
        max_probes: s.max_probes,
        slo,
    }))
}

/// How a grid point's search ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The bracket narrowed to the tolerance.
    Found,
    /// The far bound passes: the answer is at least (at most) it.
    AtBound,
    /// Even the good bound fails: no value meets the SLO.
    Infeasible,
    /// The probe budget ran out (the answer is the last passing value).
    ProbeLimit,
}

impl Status {
    /// The name in `search.parquet`.
    pub fn name(self) -> &'static str {
        match self {
            Status::Found => "found",
            Status::AtBound => "at_bound",
            Status::Infeasible => "infeasible",
            Status::ProbeLimit => "probe_limit",
        }
    }
}

/// One probe: the value, why it was probed, its verdict and its metric means.
#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    /// The parameter's value.
    pub value: f64,
    /// `bound`, `bracket` or `bisect`.
    pub step: &'static str,
    /// Every constraint held (95 % confidence).
    pub pass: bool,
    /// Mean of each SLO metric over the replicates (NaN if none).
    pub means: Vec<f64>,
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
    /// The last passing value and the nearest failing one beyond it.
    pub fn bracket(&self, s: &SearchSpec) -> (Option<f64>, Option<f64>) {
        let better = |a: f64, b: f64| if s.maximize { a > b } else { a < b };
        let pass =
            self.probes.iter().filter(|p| p.pass).map(|p| p.value).reduce(|a, b| if better(a, b) { a } else { b });
        let fail = self
            .probes
            .iter()
            .filter(|p| !p.pass && pass.is_none_or(|f| better(p.value, f)))
            .map(|p| p.value)
            .reduce(|a, b| if better(a, b) { b } else { a });
        (pass, fail)
    }

    /// The next value to probe (and why), or `None` when the search is over
    /// (then `status` is set).
    pub fn next(&mut self, s: &SearchSpec) -> Option<(f64, &'static str)> {
        if self.status.is_some() {
            return None;
        }
        let (good, far) = if s.maximize { (s.min, s.max) } else { (s.max, s.min) };
        let Some(first) = self.probes.first() else { return Some((good, "bound")) };
        if !first.pass {
            self.status = Some(Status::Infeasible);
            return None;
        }
        if self.probes.len() as u32 >= s.max_probes {
            self.status = Some(Status::ProbeLimit);
            return None;
        }
        let (pass, fail) = self.bracket(s);
        let f = pass.expect("the first probe passed");
        let Some(u) = fail else {
            if f == far {
                self.status = Some(Status::AtBound);
                return None;
            }
            // Bracket: double (halve) towards the far bound.
            let next = if s.maximize { (2.0 * f).min(far) } else { (f / 2.0).max(far) };
            let next = if s.integer { if s.maximize { next.ceil() } else { next.floor() } } else { next };
            return Some((next, "bracket"));
        };
        let done = if s.integer { (u - f).abs() <= 1.0 } else { (u - f).abs() <= s.tolerance * f.abs() };
        if done {
            self.status = Some(Status::Found);
            return None;
        }
        let mid = (f + u) / 2.0;
        // Whole numbers: strictly between f and u (they are ≥ 2 apart).
        let mid = if s.integer { if s.maximize { mid.floor() } else { mid.ceil() } } else { mid };
        Some((mid, "bisect"))
    }

    /// The answer: the last passing value.
    pub fn answer(&self, s: &SearchSpec) -> Option<f64> {
        self.bracket(s).0
    }
}

/// The verdict of a probe from its runs' results.
fn judge(s: &SearchSpec, results: &[&RunResult]) -> (bool, Vec<f64>) {
    let mut pass = results.iter().all(|r| r.outcome.is_ok());
    let mut means = Vec::new();
    for c in &s.slo {
        let samples: Vec<f64> = results
            .iter()
            .filter_map(|r| r.outcome.as_ref().ok())
            .filter_map(|o| {
                o.summary.columns().into_iter().find(|(n, _)| *n == c.metric).map(|(_, v)| match v {
                    crate::metrics::SummaryValue::Count(x) => x as f64,
                    crate::metrics::SummaryValue::Real(x) => x,
                    crate::metrics::SummaryValue::Label(_) => f64::NAN,
                })
            })
            .collect();
        pass &= c.holds(&samples);
        means.push(crate::stats::mean_ci(&samples).map_or(f64::NAN, |m| m.0));
    }
    (pass, means)
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
    let reps = base.replicates;
    loop {
        let mut probes: Vec<(usize, f64, &'static str, u32)> = Vec::new();
        for (p, st) in &mut states {
            if let Some((v, step)) = st.next(s) {
                probes.push((*p, v, step, st.probes.len() as u32));
            }
        }
        if probes.is_empty() || stop.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        let round = round_spec(spec, base, s, &probes.iter().map(|&(p, v, _, _)| (p, v)).collect::<Vec<_>>());
        let round_plan = plan(&round).map_err(runner::SweepError::Plan)?;
        let runs: Vec<(RunPlan<'_>, Vec<AxisValue>)> = probes
            .iter()
            .enumerate()
            .flat_map(|(i, &(p, v, step, k))| {
                let point = &round_plan.points[i];
                let mut axes = base.points[p].axis_values.clone();
                axes.push(if s.integer { AxisValue::Int(v as i64) } else { AxisValue::Float(v) });
                axes.push(AxisValue::Int(i64::from(k)));
                axes.push(AxisValue::Str(step.into()));
                (0..reps).map(move |r| {
                    let seed = super::seed_for(base.base_seed, r);
                    let point_id = base.points[p].id * MAX_PROBES + k;
                    let meta = RunMeta {
                        run_id: point_id * reps + r,
                        point_id,
                        replicate: r,
                        seed,
                        run_key: super::run_key(point.key, seed),
                    };
                    (RunPlan { meta, point }, axes.clone())
                })
            })
            .collect();
        let results = writer.execute(&runs, stop)?;
        for (i, &(p, v, step, _)) in probes.iter().enumerate() {
            let mine: Vec<&RunResult> = results[i * reps as usize..(i + 1) * reps as usize].iter().collect();
            let (pass, means) = judge(s, &mine);
            let st = &mut states.iter_mut().find(|(q, _)| *q == p).expect("probed points are searched").1;
            st.probes.push(Probe { value: v, step, pass, means });
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
    let mut columns: Vec<(String, ColType)> = vec![("point_id".into(), ColType::U32)];
    columns.extend(base.tables.axis_columns.iter().cloned());
    columns.extend([
        ("parameter".into(), ColType::Str),
        ("found".into(), ColType::F64),
        ("status".into(), ColType::Str),
        ("bracket_pass".into(), ColType::F64),
        ("bracket_fail".into(), ColType::F64),
        ("probes".into(), ColType::U32),
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
            slo: vec![],
        }
    }

    /// Runs the search against "passes iff value ≤ limit" (maximise) or "≥ limit" (minimise).
    fn search(s: &SearchSpec, limit: f64) -> (PointSearch, Vec<(f64, &'static str)>) {
        let mut st = PointSearch::default();
        let mut seen = Vec::new();
        while let Some((v, step)) = st.next(s) {
            seen.push((v, step));
            let pass = if s.maximize { v <= limit } else { v >= limit };
            st.probes.push(Probe { value: v, step, pass, means: vec![] });
        }
        (st, seen)
    }

    #[test]
    fn maximising_brackets_by_doubling_then_bisects_to_the_tolerance() {
        let s = spec(true, false);
        let (st, seen) = search(&s, 10.0);
        // 1, 2, 4, 8 pass; 16 fails; then bisection between 8 and 16.
        assert_eq!(
            &seen[..5],
            &[(1.0, "bound"), (2.0, "bracket"), (4.0, "bracket"), (8.0, "bracket"), (16.0, "bracket")]
        );
        assert!(seen[5..].iter().all(|(_, s)| *s == "bisect"));
        let found = st.answer(&s).unwrap();
        let (_, fail) = st.bracket(&s);
        assert!(found <= 10.0 && fail.unwrap() > 10.0 && (fail.unwrap() - found) <= 0.01 * found, "{found} {fail:?}");
        assert_eq!(st.status, Some(Status::Found));
    }

    #[test]
    fn whole_numbers_end_on_neighbours_and_bounds_are_reported() {
        // Minimise a count: passes from 11 up. 64, 32, 16 pass; 8 fails; 12, 10, 11.
        let s = spec(false, true);
        let (st, seen) = search(&s, 11.0);
        assert_eq!(seen.iter().map(|p| p.0).collect::<Vec<_>>(), [64.0, 32.0, 16.0, 8.0, 12.0, 10.0, 11.0]);
        assert_eq!((st.answer(&s), st.status), (Some(11.0), Some(Status::Found)));
        // Everything passes: the far bound is the answer.
        let (st, _) = search(&spec(true, true), 1000.0);
        assert_eq!((st.answer(&spec(true, true)), st.status), (Some(64.0), Some(Status::AtBound)));
        // Nothing passes.
        let (st, seen) = search(&spec(true, false), 0.5);
        assert_eq!((seen.len(), st.answer(&spec(true, false)), st.status), (1, None, Some(Status::Infeasible)));
    }

    #[test]
    fn a_verdict_needs_the_confidence_interval_on_the_right_side() {
        let c = Constraint::parse("ttft_p99_ms <= 100").unwrap();
        assert!(c.holds(&[90.0]));
        // Mean 95, s = 5, n = 2: half-width 12.706 · 5/√2 ≈ 44.9 — not sure enough.
        assert!(!c.holds(&[90.0, 100.0]));
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
