//! Fitting the `operators` model's constants (and the power model) to
//! measured rows: bounded least squares on relative residuals, and
//! leave-one-out cross-validation.
//!
//! A row's latency is `max(G·c_gpu, C·c_cpu)` (its steps' GPU work against
//! their CPU work, [`crate::worker::perf::operators::StepCost::secs`]; a
//! burst's steps are alike, so a row is in one regime). The fit alternates:
//! given which rows are GPU-bound it solves a linear bounded least-squares
//! problem, then reassigns each row to the larger part, until nothing
//! changes (from three starting assignments; the best wins). The three
//! scales also get a weak pull towards 1 — the measured tables' prices — with
//! the weight of one row's squared relative error: rows at one TP degree
//! cannot tell a slower all-reduce from slower GEMMs or bandwidth from a
//! fixed overhead, and without it the fit would pick among equals at
//! random and predict other TP degrees badly. The overheads get a weaker
//! pull towards 0 (a tenth, in units of a typical row's latency), and a
//! CPU-bound regime must explain at least three rows.

use super::bench::{Bench, Setup};
use crate::worker::perf::Measured;
use crate::worker::perf::operators::OperatorConstants;
use crate::worker::power::PowerModel;

/// The constants, by name, in [`OperatorConstants::as_array`] order.
pub const CONSTANTS: [&str; 6] =
    ["compute_scale", "memory_scale", "comm_scale", "step_overhead_secs", "seq_overhead_secs", "prefill_overhead_secs"];

/// Bounds of the constants: the scales within a factor of 10 of the
/// profile's prices, the overheads between 0 and 1 s.
const BOUNDS: [(f64, f64); 6] = [(0.1, 10.0), (0.1, 10.0), (0.1, 10.0), (0.0, 1.0), (0.0, 1.0), (0.0, 1.0)];

/// Weight of the pull of each scale towards 1 (that of one row's squared relative error).
const PRIOR_WEIGHT: f64 = 1.0;
/// Weight of the pull of each overhead towards 0.
const OVERHEAD_PRIOR_WEIGHT: f64 = 0.1;
/// Fewest rows a CPU-bound (launch-bound) regime must explain: one row's
/// residual is not evidence of a regime.
const MIN_CPU_BOUND_ROWS: usize = 3;

/// What to fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FitOptions {
    /// Which constants are free (in [`CONSTANTS`] order); the others keep their defaults.
    pub free: [bool; 6],
}

impl Default for FitOptions {
    fn default() -> Self {
        FitOptions { free: [true; 6] }
    }
}

impl FitOptions {
    /// Parses `--fit compute_scale,step_overhead_secs,…` (short names
    /// `compute`, `memory`, `comm`, `step`, `seq`, `prefill` too).
    pub fn parse(list: &str) -> Result<FitOptions, String> {
        let mut free = [false; 6];
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let i =
                CONSTANTS.iter().position(|c| *c == name || c.split('_').next() == Some(name)).ok_or_else(|| {
                    format!("--fit: unknown constant {name:?}; the constants are {}", CONSTANTS.join(", "))
                })?;
            free[i] = true;
        }
        if !free.contains(&true) {
            // Nothing to fit: the defaults would be printed as a fit.
            return Err(format!("--fit names no constant; the constants are {}", CONSTANTS.join(", ")));
        }
        Ok(FitOptions { free })
    }
}

/// One row, measured and simulated.
#[derive(Clone, Debug, PartialEq)]
pub struct FitRow {
    /// The row.
    pub row: Measured,
    /// Its tensor-parallel degree.
    pub tp: u32,
    /// Simulated with the default constants, seconds.
    pub default_s: f64,
    /// Simulated with the fitted constants, seconds.
    pub fitted_s: f64,
    /// Predicted by a fit without this row, seconds (`None`: too few rows).
    pub held_out_s: Option<f64>,
    /// Measured mean power per GPU, and simulated at the fitted timing with
    /// the GPU's default power model and with the fitted one, W.
    pub power_w: Option<(f64, f64, f64)>,
}

/// `(simulated − measured) / measured`.
pub fn residual(simulated: f64, measured: f64) -> f64 {
    (simulated - measured) / measured
}

impl FitRow {
    /// The fitted model's residual.
    pub fn residual(&self) -> f64 {
        residual(self.fitted_s, self.row.latency_s)
    }
}

/// The fitted constants and how well they fit and predict.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    /// The constants (defaults for those not fitted).
    pub constants: OperatorConstants,
    /// The power model (the GPU's, with `active`, `compute` and `memory` fitted when rows carry power).
    pub power: Option<PowerModel>,
    /// Every row.
    pub rows: Vec<FitRow>,
    /// What was held at a bound or not fitted, and why.
    pub notes: Vec<String>,
    /// The profile line of the TOML block.
    pub profile_toml: String,
}

/// Median and largest of `|x|`.
pub fn median_max(xs: impl IntoIterator<Item = f64>) -> Option<(f64, f64)> {
    let mut v: Vec<f64> = xs.into_iter().map(f64::abs).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    Some((median, v[n - 1]))
}

impl Calibration {
    /// Median and largest |residual| of the fitted model.
    pub fn fit_error(&self) -> Option<(f64, f64)> {
        median_max(self.rows.iter().map(FitRow::residual))
    }

    /// Median and largest |residual| of the default model.
    pub fn default_error(&self) -> Option<(f64, f64)> {
        median_max(self.rows.iter().map(|r| residual(r.default_s, r.row.latency_s)))
    }

    /// Median and largest |error| of the leave-one-out predictions.
    pub fn cv_error(&self) -> Option<(f64, f64)> {
        median_max(self.rows.iter().filter_map(|r| r.held_out_s.map(|p| residual(p, r.row.latency_s))))
    }

    /// Median and largest |error| of the fitted power model.
    pub fn power_error(&self) -> Option<(f64, f64)> {
        median_max(self.rows.iter().filter_map(|r| r.power_w.map(|(m, _, f)| residual(f, m))))
    }

    /// The row with the largest |residual|.
    pub fn worst(&self) -> Option<&FitRow> {
        self.rows.iter().max_by(|x, y| x.residual().abs().total_cmp(&y.residual().abs()))
    }

    /// The TOML that uses the fit.
    pub fn toml(&self) -> String {
        let c = &self.constants;
        let mut s = format!(
            "[worker.inference_params]\nmodel = \"operators\"\nprofile = {}\ncompute_scale = {:?}\nmemory_scale = {:?}\ncomm_scale = {:?}\nstep_overhead_secs = {:?}\nseq_overhead_secs = {:?}\nprefill_overhead_secs = {:?}\n",
            self.profile_toml,
            c.compute_scale,
            c.memory_scale,
            c.comm_scale,
            c.step_overhead_s,
            c.seq_overhead_s,
            c.prefill_overhead_s
        );
        if let Some(p) = &self.power {
            s += &format!(
                "\n[worker.hw]\nactive_watts = {:?}\ncompute_watts = {:?}\nmemory_watts = {:?}\n",
                p.active_w, p.compute_w, p.memory_w
            );
        }
        s
    }
}

/// Solves `A x = b` (square) by Gaussian elimination with partial pivoting.
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Option<Vec<f64>> {
    let n = b.len();
    for col in 0..n {
        let pivot = (col..n).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        let scale = a.iter().map(|r| r[col].abs()).fold(0.0, f64::max);
        if a[pivot][col].abs() <= 1e-12 * scale.max(f64::MIN_POSITIVE) {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        let (top, below) = a.split_at_mut(col + 1);
        let pivot_row = &top[col];
        for (r, row) in below.iter_mut().enumerate() {
            let f = row[col] / pivot_row[col];
            for (x, p) in row[col..n].iter_mut().zip(&pivot_row[col..n]) {
                *x -= f * p;
            }
            b[col + 1 + r] -= f * b[col];
        }
    }
    let mut x = vec![0.0; n];
    for i in (0..n).rev() {
        let s: f64 = (i + 1..n).map(|k| a[i][k] * x[k]).sum();
        x[i] = (b[i] - s) / a[i][i];
    }
    Some(x)
}

/// Minimises `Σ_r (a_r · x − b_r)²` over `x` within `bounds`, the variables
/// not in `free` held at `x0`: every assignment of each free variable to
/// its lower bound, its upper bound or the interior is solved and the best
/// feasible one kept — exact for these few variables. `None` when no
/// assignment is feasible and non-singular.
pub fn bounded_least_squares(
    a: &[Vec<f64>],
    b: &[f64],
    free: &[usize],
    bounds: &[(f64, f64)],
    x0: &[f64],
) -> Option<Vec<f64>> {
    let k = free.len();
    let objective = |x: &[f64]| -> f64 {
        a.iter().zip(b).map(|(r, t)| (r.iter().zip(x).map(|(u, v)| u * v).sum::<f64>() - t).powi(2)).sum()
    };
    let mut best: Option<(f64, Vec<f64>)> = None;
    for code in 0..3usize.pow(k as u32) {
        let mut x = x0.to_vec();
        let mut interior = Vec::new();
        let mut c = code;
        for &v in free {
            match c % 3 {
                0 => interior.push(v),
                1 => x[v] = bounds[v].0,
                _ => x[v] = bounds[v].1,
            }
            c /= 3;
        }
        if !interior.is_empty() {
            // Normal equations for the interior variables, the rest fixed.
            let n = interior.len();
            let mut m = vec![vec![0.0; n]; n];
            let mut rhs = vec![0.0; n];
            for (r, t) in a.iter().zip(b) {
                let fixed: f64 = (0..x.len()).filter(|i| !interior.contains(i)).map(|i| r[i] * x[i]).sum();
                for (p, &i) in interior.iter().enumerate() {
                    rhs[p] += r[i] * (t - fixed);
                    for (q, &j) in interior.iter().enumerate() {
                        m[p][q] += r[i] * r[j];
                    }
                }
            }
            let Some(sol) = solve(m, rhs) else { continue };
            if interior.iter().zip(&sol).any(|(&i, &v)| !(bounds[i].0..=bounds[i].1).contains(&v)) {
                continue;
            }
            for (&i, &v) in interior.iter().zip(&sol) {
                x[i] = v;
            }
        }
        let obj = objective(&x);
        if best.as_ref().is_none_or(|b| obj < b.0) {
            best = Some((obj, x));
        }
    }
    best.map(|b| b.1)
}

/// A row's latency under `c` from its features: the longer of its GPU and CPU parts.
pub fn latency(f: &[f64; 6], c: &[f64; 6]) -> f64 {
    use crate::worker::perf::operators::GPU_CONSTANTS;
    let dot = |r: std::ops::Range<usize>| r.map(|i| f[i] * c[i]).sum::<f64>();
    dot(0..GPU_CONSTANTS).max(dot(GPU_CONSTANTS..6))
}

/// Fits the constants to rows `use_rows` (see the module docs): `None` when
/// no assignment gives a non-singular problem.
fn fit_max(features: &[[f64; 6]], y: &[f64], use_rows: &[usize], free: &[usize], x0: &[f64; 6]) -> Option<[f64; 6]> {
    use crate::worker::perf::operators::GPU_CONSTANTS;
    // The pulls: each scale towards 1; each overhead towards 0, in units of
    // the value that alone would explain a typical row it applies to.
    let typical: Vec<f64> = (GPU_CONSTANTS..6)
        .map(|i| {
            let mut v: Vec<f64> =
                use_rows.iter().filter(|&&r| features[r][i] > 0.0).map(|&r| y[r] / features[r][i]).collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(1.0)
        })
        .collect();
    let priors: Vec<(Vec<f64>, f64)> = (0..6)
        .map(|i| {
            let mut row = vec![0.0; 6];
            if i < GPU_CONSTANTS {
                row[i] = PRIOR_WEIGHT.sqrt();
                (row, PRIOR_WEIGHT.sqrt())
            } else {
                row[i] = (OVERHEAD_PRIOR_WEIGHT).sqrt() / typical[i - GPU_CONSTANTS];
                (row, 0.0)
            }
        })
        .collect();
    let objective = |c: &[f64; 6]| -> f64 {
        use_rows.iter().map(|&r| (latency(&features[r], c) / y[r] - 1.0).powi(2)).sum::<f64>()
            + priors
                .iter()
                .map(|(row, t)| (row.iter().zip(c).map(|(u, v)| u * v).sum::<f64>() - t).powi(2))
                .sum::<f64>()
    };
    // One linear problem: each row keeps its GPU or its CPU features.
    let solve_for = |gpu_bound: &[bool]| -> Option<[f64; 6]> {
        let mut a: Vec<Vec<f64>> = use_rows
            .iter()
            .zip(gpu_bound)
            .map(|(&r, &g)| {
                (0..6).map(|i| if (i < GPU_CONSTANTS) == g { features[r][i] / y[r] } else { 0.0 }).collect()
            })
            .collect();
        let mut b = vec![1.0; a.len()];
        for (row, t) in &priors {
            a.push(row.clone());
            b.push(*t);
        }
        bounded_least_squares(&a, &b, free, &BOUNDS, x0).map(|v| v.try_into().expect("six constants"))
    };
    // Starts: every row GPU-bound, every row CPU-bound, and GPU-bound where
    // the profile's GPU work is at least a share of the measured time.
    let mut starts = vec![vec![true; use_rows.len()], vec![false; use_rows.len()]];
    for share in [0.5, 0.7, 0.9] {
        starts
            .push(use_rows.iter().map(|&r| features[r][..GPU_CONSTANTS].iter().sum::<f64>() >= share * y[r]).collect());
    }
    let mut best: Option<(f64, [f64; 6])> = None;
    for start in starts {
        let mut assign = start;
        for _ in 0..50 {
            let Some(c) = solve_for(&assign) else { break };
            let next: Vec<bool> = use_rows
                .iter()
                .map(|&r| {
                    let f = &features[r];
                    let gpu: f64 = (0..GPU_CONSTANTS).map(|i| f[i] * c[i]).sum();
                    let cpu: f64 = (GPU_CONSTANTS..6).map(|i| f[i] * c[i]).sum();
                    gpu >= cpu
                })
                .collect();
            let cpu_bound = next.iter().filter(|g| !**g).count();
            let obj = if (1..MIN_CPU_BOUND_ROWS).contains(&cpu_bound) { f64::INFINITY } else { objective(&c) };
            if obj.is_finite() && best.as_ref().is_none_or(|b| obj < b.0) {
                best = Some((obj, c));
            }
            if next == assign {
                break;
            }
            assign = next;
        }
    }
    best.map(|b| b.1)
}

/// Most rows a calibration takes (each is simulated seven times).
pub const MAX_ROWS: usize = 5_000;
/// Most sequences in one row.
pub const MAX_ROW_BATCH: u64 = 4_096;
/// Most tokens (prompt, or context) of one sequence of a row.
pub const MAX_ROW_TOKENS: u64 = 1 << 20;
/// Most tokens one decoding sequence of a row generates.
pub const MAX_ROW_OUTPUT: u64 = 1 << 16;
/// Most tokens all of a row's sequences hold together (its simulated work).
pub const MAX_ROW_WORK: u64 = 1 << 26;
/// Most tokens all rows hold together: about two minutes of fitting (5,000
/// rows of 250 million tokens in all took 6.7 CPU-s).
pub const MAX_TOTAL_WORK: u64 = 1 << 32;
/// Above this many rows, the held-out predictions are 10-fold (each row
/// predicted by a fit without its tenth of the rows), not leave-one-out,
/// whose n fits of n rows each grow as n².
pub const LEAVE_ONE_OUT_ROWS: usize = 50;

/// Refuses rows (or a set of them) too large to simulate in reasonable
/// time, naming the line and the limit.
fn check_sizes(rows: &[Measured]) -> Result<(), String> {
    if rows.len() > MAX_ROWS {
        return Err(format!("{} rows; a calibration takes at most {MAX_ROWS} (fit a sample of them)", rows.len()));
    }
    for r in rows {
        let limits = [
            (r.batch, MAX_ROW_BATCH, "batch_size"),
            (r.tokens, MAX_ROW_TOKENS, "tokens"),
            (r.output_tokens, MAX_ROW_OUTPUT, "output_tokens"),
        ];
        for (v, max, col) in limits {
            if v > max {
                return Err(format!("line {}: {col} {v} is more than the {max} a calibration row may have", r.line));
            }
        }
        let work = r.batch * (r.tokens + r.output_tokens);
        if work > MAX_ROW_WORK {
            return Err(format!(
                "line {}: batch_size × (tokens + output_tokens) = {work} tokens, more than the {MAX_ROW_WORK} one row may simulate",
                r.line
            ));
        }
    }
    let total: u64 = rows.iter().map(|r| r.batch * (r.tokens + r.output_tokens)).sum();
    if total > MAX_TOTAL_WORK {
        return Err(format!(
            "the rows hold {total} tokens in all (batch_size × (tokens + output_tokens)), more than the {MAX_TOTAL_WORK} a calibration simulates (about two minutes): fit a sample of them"
        ));
    }
    Ok(())
}

/// How many of the columns `free` of `features` (over rows `subset`) the
/// rows tell apart: the numerical rank of that design, each column scaled
/// to unit length (Gram–Schmidt, relative tolerance 10⁻⁹).
fn identifiable(features: &[[f64; 6]], subset: &[usize], free: &[usize]) -> usize {
    let mut basis: Vec<Vec<f64>> = Vec::new();
    for &c in free {
        let mut v: Vec<f64> = subset.iter().map(|&r| features[r][c]).collect();
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if norm == 0.0 {
            continue;
        }
        v.iter_mut().for_each(|x| *x /= norm);
        for b in &basis {
            let dot: f64 = v.iter().zip(b).map(|(x, y)| x * y).sum();
            v.iter_mut().zip(b).for_each(|(x, y)| *x -= dot * y);
        }
        let left = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if left > 1e-9 {
            v.iter_mut().for_each(|x| *x /= left);
            basis.push(v);
        }
    }
    basis.len()
}

/// Rows run once with each constant alone (their features) and with the
/// defaults, ready to be fitted on any subset.
pub struct Prepared {
    benches: Vec<Bench>,
    rows: Vec<Measured>,
    features: Vec<[f64; 6]>,
    defaults: Vec<super::bench::RowRun>,
}

impl Prepared {
    /// Prepares and runs every row of `rows` (in parallel; results in row order).
    pub fn new(setup: &Setup, rows: &[Measured]) -> Result<Prepared, String> {
        use rayon::prelude::*;
        if rows.is_empty() {
            return Err("no measurements: the CSV needs prefill or decode rows".into());
        }
        if let Some(r) = rows.iter().find(|r| r.latency_s <= 0.0) {
            return Err(format!("line {}: a latency must be positive", r.line));
        }
        check_sizes(rows)?;
        let runs: Vec<(Bench, [f64; 6], super::bench::RowRun)> = rows
            .par_iter()
            .map(|r| {
                let at = |e: String| format!("line {}: {e}", r.line);
                let mut b = Bench::new(setup, r).map_err(at)?;
                let f = b.features().map_err(at)?;
                let d = b.run(OperatorConstants::DEFAULT, None).map_err(at)?;
                Ok((b, f, d))
            })
            .collect::<Result<_, String>>()?;
        let mut p = Prepared { benches: Vec::new(), rows: rows.to_vec(), features: Vec::new(), defaults: Vec::new() };
        for (b, f, d) in runs {
            p.benches.push(b);
            p.features.push(f);
            p.defaults.push(d);
        }
        Ok(p)
    }

    /// The rows.
    pub fn rows(&self) -> &[Measured] {
        &self.rows
    }

    /// Fits the constants to the rows `subset` (indices), with what was held or left out.
    pub fn fit(&self, subset: &[usize], opts: &FitOptions) -> Result<(OperatorConstants, Vec<String>), String> {
        let mut notes = Vec::new();
        let x0 = OperatorConstants::DEFAULT.as_array();
        let largest = |i: usize| subset.iter().map(|&r| self.features[r][i]).fold(0.0, f64::max);
        let free: Vec<usize> = (0..6)
            .filter(|&i| {
                let used = largest(i) > 0.0;
                if opts.free[i] && !used {
                    notes.push(format!("{}: no row depends on it (kept at {})", CONSTANTS[i], x0[i]));
                }
                opts.free[i] && used
            })
            .collect();
        let rank = identifiable(&self.features, subset, &free);
        if rank < free.len() {
            let names: Vec<&str> = free.iter().map(|&i| CONSTANTS[i]).collect();
            notes.push(format!(
                "the rows tell only {rank} of the {} constants fitted apart ({}): their values are one fit of many, not measurements; rows of other batch sizes and token counts (prefill and decode) pin them, or --fit fewer",
                free.len(),
                names.join(", ")
            ));
        }
        let y: Vec<f64> = self.rows.iter().map(|r| r.latency_s).collect();
        let x = fit_max(&self.features, &y, subset, &free, &x0)
            .ok_or("the fit is singular: the rows do not tell the constants apart (vary batch and tokens)")?;
        for &i in &free {
            if x[i] == BOUNDS[i].0 || x[i] == BOUNDS[i].1 {
                notes.push(format!("{}: held at its bound {}", CONSTANTS[i], x[i]));
            }
        }
        Ok((OperatorConstants::from_array(x), notes))
    }

    /// Each row of `subset` predicted by a fit without it: leave one out,
    /// or above [`LEAVE_ONE_OUT_ROWS`] rows, without its tenth of them (row
    /// k of the subset in fold k mod 10), so that the cost grows with the
    /// rows, not their square.
    fn held_out(&self, subset: &[usize], opts: &FitOptions) -> Vec<Option<f64>> {
        use rayon::prelude::*;
        if subset.len() <= 2 {
            return vec![None; subset.len()];
        }
        let folds = if subset.len() > LEAVE_ONE_OUT_ROWS { 10 } else { subset.len() };
        let predicted: Vec<Vec<(usize, Option<f64>)>> = (0..folds)
            .into_par_iter()
            .map(|f| {
                let others: Vec<usize> = (0..subset.len()).filter(|k| k % folds != f).map(|k| subset[k]).collect();
                let fit = self.fit(&others, opts).ok();
                (0..subset.len())
                    .filter(|k| k % folds == f)
                    .map(|k| (k, fit.as_ref().map(|(c, _)| latency(&self.features[subset[k]], &c.as_array()))))
                    .collect()
            })
            .collect();
        let mut out = vec![None; subset.len()];
        for (k, p) in predicted.into_iter().flatten() {
            out[k] = p;
        }
        out
    }

    /// Runs the rows `subset` with `constants` (and `power`), in parallel.
    pub fn run(
        &mut self,
        subset: &[usize],
        constants: OperatorConstants,
        power: Option<PowerModel>,
    ) -> Result<Vec<super::bench::RowRun>, String> {
        use rayon::prelude::*;
        let mut picked: Vec<(usize, &mut Bench)> =
            self.benches.iter_mut().enumerate().filter(|(i, _)| subset.contains(i)).collect();
        picked.par_iter_mut().map(|(_, b)| b.run(constants, power)).collect()
    }

    /// Calibrates on the rows `subset` (see [`calibrate`]).
    pub fn calibrate(&mut self, setup: &Setup, subset: &[usize], opts: &FitOptions) -> Result<Calibration, String> {
        let (constants, mut notes) = self.fit(subset, opts)?;
        let held_out = self.held_out(subset, opts);
        let fitted = self.run(subset, constants, None)?;
        // Power: mean power over a run is linear in (active, compute, memory) watts.
        let power_rows: Vec<usize> = (0..subset.len()).filter(|&k| self.rows[subset[k]].power_w.is_some()).collect();
        let mut power = None;
        if !power_rows.is_empty() {
            let gpu = self.benches[subset[power_rows[0]]].power();
            let pa: Vec<Vec<f64>> = power_rows
                .iter()
                .map(|&k| {
                    let (run, measured) = (&fitted[k], self.rows[subset[k]].power_w.expect("a power row"));
                    let left = measured - run.idle_w;
                    run.power_features.iter().map(|v| v / left).collect()
                })
                .collect();
            let bounds =
                [(0.0, gpu.max_w.max(1.0)), (0.0, 10.0 * gpu.max_w.max(1.0)), (0.0, 10.0 * gpu.max_w.max(1.0))];
            let p0 = [gpu.active_w, gpu.compute_w, gpu.memory_w];
            match bounded_least_squares(&pa, &vec![1.0; pa.len()], &[0, 1, 2], &bounds, &p0) {
                Some(w) => power = Some(PowerModel { active_w: w[0], compute_w: w[1], memory_w: w[2], ..gpu }),
                None => notes.push("power: the rows do not tell the three power terms apart; not fitted".into()),
            }
        }
        let powered: Vec<usize> = power_rows.iter().map(|&k| subset[k]).collect();
        let with_power = match power {
            Some(p) => self.run(&powered, constants, Some(p))?,
            None => Vec::new(),
        };
        let mut out = Vec::with_capacity(subset.len());
        for (k, &i) in subset.iter().enumerate() {
            let row = &self.rows[i];
            // Power at the fitted timing: the GPU's default power model, and the fitted one.
            let power_w = row.power_w.map(|m| {
                let fitted_power =
                    powered.iter().position(|&j| j == i).map_or(fitted[k].power_w, |q| with_power[q].power_w);
                (m, fitted[k].power_w, fitted_power)
            });
            out.push(FitRow {
                row: row.clone(),
                tp: self.benches[i].tp(),
                default_s: self.defaults[i].latency_s,
                fitted_s: fitted[k].latency_s,
                held_out_s: held_out[k],
                power_w,
            });
        }
        Ok(Calibration { constants, power, rows: out, notes, profile_toml: setup.profile_toml() })
    }
}

/// Fits the constants of `setup`'s model to `rows` (see [`crate::calibrate`]).
pub fn calibrate(setup: &Setup, rows: &[Measured], opts: &FitOptions) -> Result<Calibration, String> {
    let mut p = Prepared::new(setup, rows)?;
    let all: Vec<usize> = (0..rows.len()).collect();
    p.calibrate(setup, &all, opts)
}

/// Predicted rows: (row, its TP degree, simulated seconds).
pub type Predicted = Vec<(Measured, u32, f64)>;

/// Predicts `rows` with `constants`: (row, simulated seconds), and warnings
/// for rows outside the ranges of the rows the constants were fitted to.
pub fn predict(
    setup: &Setup,
    constants: OperatorConstants,
    fitted_to: &[Measured],
    rows: &[Measured],
) -> Result<(Predicted, Vec<String>), String> {
    let range = |f: &dyn Fn(&Measured) -> u64| {
        let v: Vec<u64> = fitted_to.iter().map(f).collect();
        (v.iter().copied().min().unwrap_or(0), v.iter().copied().max().unwrap_or(0))
    };
    let (batch, tokens) = (range(&|r| r.batch), range(&|r| r.tokens));
    let tps = range(&|r| u64::from(r.tp.unwrap_or(setup.tp)));
    let mut warnings = Vec::new();
    let mut out = Vec::new();
    for r in rows {
        let mut b = Bench::new(setup, r).map_err(|e| format!("line {}: {e}", r.line))?;
        let tp = u64::from(b.tp());
        for (what, v, (lo, hi)) in [("batch", r.batch, batch), ("tokens", r.tokens, tokens), ("tp", tp, tps)] {
            if v < lo || v > hi {
                warnings.push(format!(
                    "line {}: {what} {v} is outside the fitted rows' {lo}–{hi}: an extrapolation",
                    r.line
                ));
            }
        }
        out.push((r.clone(), b.tp(), b.run(constants, None)?.latency_s));
    }
    Ok((out, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_least_squares_recovers_an_exact_fit_and_respects_bounds() {
        // Rows a = f / y with y = 2·f₀ + 3·f₁: the fit recovers (2, 3).
        let f = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0]];
        let a: Vec<Vec<f64>> = f
            .iter()
            .map(|r| {
                let y = 2.0 * r[0] + 3.0 * r[1];
                vec![r[0] / y, r[1] / y]
            })
            .collect();
        let ones = vec![1.0; a.len()];
        let x = bounded_least_squares(&a, &ones, &[0, 1], &[(0.0, 10.0), (0.0, 10.0)], &[1.0, 1.0]).unwrap();
        assert!((x[0] - 2.0).abs() < 1e-9 && (x[1] - 3.0).abs() < 1e-9, "{x:?}");
        // With the second held below 2.5, it sits at the bound and the first takes up the rest.
        let x = bounded_least_squares(&a, &ones, &[0, 1], &[(0.0, 10.0), (0.0, 2.5)], &[1.0, 1.0]).unwrap();
        assert_eq!(x[1], 2.5);
        assert!(x[0] > 2.0, "{x:?}");
        // A variable not free keeps its value.
        let x = bounded_least_squares(&a, &ones, &[0], &[(0.0, 10.0), (0.0, 10.0)], &[1.0, 3.0]).unwrap();
        assert_eq!(x[1], 3.0);
        assert!((x[0] - 2.0).abs() < 1e-9, "{x:?}");
    }

    #[test]
    fn rows_too_large_to_simulate_are_refused_by_line_and_limit() {
        let row = |line, batch, tokens, output_tokens| Measured {
            phase: crate::worker::perf::Phase::Decode,
            batch,
            tokens,
            output_tokens,
            tp: None,
            latency_s: 0.01,
            power_w: None,
            line,
        };
        assert!(check_sizes(&[row(2, 8, 4096, 2)]).is_ok());
        let e = check_sizes(&[row(2, 1, 1_000_000_000, 2)]).unwrap_err();
        assert!(e.contains("line 2: tokens 1000000000 is more than the 1048576"), "{e}");
        let e = check_sizes(&[row(3, 1, 512, 1_000_000_000)]).unwrap_err();
        assert!(e.starts_with("line 3: output_tokens"), "{e}");
        let e = check_sizes(&[row(4, 4096, 1 << 20, 2)]).unwrap_err();
        assert!(e.starts_with("line 4: batch_size × (tokens + output_tokens)"), "{e}");
        let many: Vec<Measured> = (0..MAX_ROWS as u64 + 1).map(|i| row(i + 2, 1, 128, 2)).collect();
        assert!(check_sizes(&many).unwrap_err().contains("at most 5000"));
    }

    #[test]
    fn identical_rows_tell_one_constant_apart_and_varied_ones_more() {
        // Three rows with the same features: rank 1 whatever is free.
        let f = [[1.0, 2.0, 0.0, 1.0, 1.0, 1.0]; 3];
        assert_eq!(identifiable(&f, &[0, 1, 2], &[0, 1, 3, 4, 5]), 1);
        // Rows told apart by batch (the per-sequence overhead) and by tokens (compute).
        let g = [[1.0, 1.0, 0.0, 1.0, 1.0, 0.0], [2.0, 1.0, 0.0, 1.0, 4.0, 0.0], [3.0, 2.0, 0.0, 1.0, 2.0, 0.0]];
        assert_eq!(identifiable(&g, &[0, 1, 2], &[0, 1, 3, 4]), 3);
        assert_eq!(identifiable(&g, &[0, 1, 2], &[0, 4]), 2);
    }

    #[test]
    fn an_empty_fit_list_is_refused() {
        assert!(FitOptions::parse("").unwrap_err().contains("names no constant"));
        assert!(FitOptions::parse(" , ").is_err());
    }

    #[test]
    fn fit_options_take_full_and_short_names() {
        assert_eq!(FitOptions::parse("step,compute_scale").unwrap().free, [true, false, false, true, false, false]);
        assert!(FitOptions::parse("speed").unwrap_err().contains("unknown constant"));
    }
}
