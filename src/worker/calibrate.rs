//! Fitting the roofline to measured latencies (`opal-sweep calibrate`).
//!
//! The roofline is linear in its four constants, so each part is a small
//! least-squares problem:
//!
//! - **prefill** rows (a prompt of `n` tokens from an empty cache, seconds):
//!   `t = a·X₁(n) + b·X₂(n)`, where `X₁` is the attention term and `X₂` the
//!   dense term of [`Roofline::prefill_secs`] with a unit coefficient — the
//!   Python Opal's `offline_calc_a_b.py` fits the same two terms;
//! - **decode** rows (one step over a batch of `B` sequences of `c` context
//!   tokens each, seconds): `t = overhead + X₃(B, c) / efficiency`, where
//!   `X₃` is the weights and KV the step reads over the peak bandwidth.
//!
//! Both minimise the squared *relative* residuals (so a 4k-token row counts
//! as much as a 131k-token one), with the constants kept physical: `a, b ≥
//! 0`, `overhead ≥ 0`, `0 < efficiency ≤ 1` (a fit outside is re-solved on
//! the boundary, and said so). A part without rows keeps its defaults.

use super::model::ModelArch;
use super::perf::{Coefficients, LatencyRows, Roofline};
use super::presets::GpuSpec;

/// One measured row and what the fitted model gives for it.
#[derive(Clone, Debug, PartialEq)]
pub struct FitRow {
    /// `prefill` or `decode`.
    pub phase: &'static str,
    /// Batch size (decode rows).
    pub batch: u64,
    /// Prompt tokens (prefill) or context tokens per sequence (decode).
    pub tokens: u64,
    /// Measured seconds.
    pub measured_s: f64,
    /// Fitted seconds.
    pub fitted_s: f64,
}

impl FitRow {
    /// (fitted − measured) / measured.
    pub fn residual(&self) -> f64 {
        (self.fitted_s - self.measured_s) / self.measured_s
    }
}

/// The fitted constants and how well they fit.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    /// The constants (defaults for a part without rows).
    pub coefficients: Coefficients,
    /// Every row, prefill first.
    pub rows: Vec<FitRow>,
    /// What was constrained or left at its default.
    pub notes: Vec<String>,
}

impl Calibration {
    /// The row with the largest relative residual.
    pub fn worst(&self) -> Option<&FitRow> {
        self.rows.iter().max_by(|x, y| x.residual().abs().total_cmp(&y.residual().abs()))
    }

    /// The `[worker.inference_params]` block that uses the fit.
    pub fn toml(&self) -> String {
        let c = &self.coefficients;
        format!(
            "[worker.inference_params]\nmodel = \"roofline\"\na = {:?}\nb = {:?}\ndecode_bw_efficiency = {:?}\nstep_overhead_secs = {:?}\n",
            c.a, c.b, c.decode_bw_efficiency, c.step_overhead_secs
        )
    }
}

/// Least squares of `Σ (x·p − 1)²` over rows `x` of two regressors (each
/// already divided by the measurement): the normal equations, or `None`
/// when they are singular.
fn solve2(rows: &[(f64, f64)]) -> Option<(f64, f64)> {
    let (mut s11, mut s12, mut s22, mut r1, mut r2) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(u, v) in rows {
        s11 += u * u;
        s12 += u * v;
        s22 += v * v;
        r1 += u;
        r2 += v;
    }
    let det = s11 * s22 - s12 * s12;
    if det.abs() <= 1e-12 * s11 * s22 {
        return None;
    }
    Some(((r1 * s22 - r2 * s12) / det, (s11 * r2 - s12 * r1) / det))
}

/// Least squares of `Σ (u·p − 1)²`: one regressor.
fn solve1(rows: impl Iterator<Item = f64> + Clone) -> f64 {
    rows.clone().sum::<f64>() / rows.map(|u| u * u).sum::<f64>()
}

/// Fits the roofline of `model` on `tp` × `gpu` to `rows`.
pub fn calibrate(model: &ModelArch, gpu: &GpuSpec, tp: u32, rows: &LatencyRows) -> Result<Calibration, String> {
    if rows.prefill.is_empty() && rows.decode.is_empty() {
        return Err("no measurements: the CSV needs prefill or decode rows".into());
    }
    if let Some(r) = rows.prefill.iter().find(|r| r.0 < 1.0 || r.1 <= 0.0) {
        return Err(format!("prefill row ({} tokens, {} ms): tokens and latency must be positive", r.0, r.1 * 1e3));
    }
    if let Some(r) = rows.decode.iter().find(|r| r.0 < 1.0 || r.2 <= 0.0) {
        return Err(format!("decode row (batch {}, {} ms): batch and latency must be positive", r.0, r.2 * 1e3));
    }
    let mut notes = Vec::new();
    let mut c = Coefficients::OPAL;
    let unit = |a: f64, b: f64| Roofline::new(model, gpu, tp, Coefficients { a, b, ..Coefficients::OPAL });
    let (attn, dense) = (unit(1.0, 0.0), unit(0.0, 1.0));

    // Prefill: t = a·X₁ + b·X₂.
    let x: Vec<(f64, f64, f64)> = rows
        .prefill
        .iter()
        .map(|&(n, t)| (attn.prefill_secs(0, n as u64) / t, dense.prefill_secs(0, n as u64) / t, t))
        .collect();
    match x.len() {
        0 => notes.push("no prefill rows: a and b keep Opal's 4 and 24".into()),
        1 => {
            c.b = ((1.0 - c.a * x[0].0) / x[0].1).max(0.0);
            notes.push("one prefill row: only b is fitted (a keeps Opal's 4)".into());
        }
        _ => {
            let pairs: Vec<(f64, f64)> = x.iter().map(|&(u, v, _)| (u, v)).collect();
            match solve2(&pairs) {
                Some((a, b)) if a >= 0.0 && b >= 0.0 => (c.a, c.b) = (a, b),
                _ => {
                    // On the boundary: the better of a = 0 and b = 0.
                    let b_only = solve1(pairs.iter().map(|p| p.1));
                    let a_only = solve1(pairs.iter().map(|p| p.0));
                    let err = |a: f64, b: f64| pairs.iter().map(|&(u, v)| (a * u + b * v - 1.0).powi(2)).sum::<f64>();
                    (c.a, c.b) = if err(0.0, b_only) <= err(a_only, 0.0) { (0.0, b_only) } else { (a_only, 0.0) };
                    notes.push("the unconstrained prefill fit was negative: one coefficient is held at 0".into());
                }
            }
        }
    }

    // Decode: t = overhead + X₃ / efficiency.
    let bare = Roofline::new(model, gpu, tp, Coefficients { decode_bw_efficiency: 1.0, step_overhead_secs: 0.0, ..c });
    let window = bare.shape.window;
    let x3 = |b: f64, ctx: f64| {
        let (b, ctx) = (b as u64, ctx as u64);
        bare.decode_secs(b, b * ctx, b * ctx.min(window))
    };
    let d: Vec<(f64, f64)> = rows.decode.iter().map(|&(b, ctx, t)| (1.0 / t, x3(b, ctx) / t)).collect();
    let (mut overhead, mut slope) = match d.len() {
        0 => {
            notes.push("no decode rows: decode_bw_efficiency 1, step_overhead_secs 0".into());
            (0.0, 1.0)
        }
        1 => {
            notes.push("one decode row: only the efficiency is fitted (no overhead)".into());
            (0.0, solve1(d.iter().map(|p| p.1)))
        }
        _ => solve2(&d).unwrap_or((0.0, solve1(d.iter().map(|p| p.1)))),
    };
    if overhead < 0.0 {
        overhead = 0.0;
        slope = solve1(d.iter().map(|p| p.1));
        notes.push("the fitted overhead was negative: held at 0".into());
    }
    if slope < 1.0 {
        // Faster than the datasheet bandwidth: hold the efficiency at 1, refit the overhead.
        slope = 1.0;
        let num: f64 = d.iter().map(|&(u, v)| u * (1.0 - v)).sum();
        overhead = (num / d.iter().map(|&(u, _)| u * u).sum::<f64>()).max(0.0);
        notes.push(
            "the measured decode steps are faster than the datasheet bandwidth allows: efficiency held at 1".into(),
        );
    }
    c.decode_bw_efficiency = 1.0 / slope;
    c.step_overhead_secs = overhead;

    let fitted = Roofline::new(model, gpu, tp, c);
    let mut out: Vec<FitRow> = rows
        .prefill
        .iter()
        .map(|&(n, t)| FitRow {
            phase: "prefill",
            batch: 1,
            tokens: n as u64,
            measured_s: t,
            fitted_s: fitted.prefill_secs(0, n as u64),
        })
        .collect();
    out.extend(rows.decode.iter().map(|&(b, ctx, t)| {
        let (b, ctx) = (b as u64, ctx as u64);
        FitRow {
            phase: "decode",
            batch: b,
            tokens: ctx,
            measured_s: t,
            fitted_s: fitted.decode_secs(b, b * ctx, b * ctx.min(window)),
        }
    }));
    Ok(Calibration { coefficients: c, rows: out, notes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (ModelArch, GpuSpec) {
        (ModelArch::preset("llama-3.1-8b").unwrap(), GpuSpec::preset("H100").unwrap())
    }

    #[test]
    fn known_coefficients_are_recovered_from_the_latencies_they_produce() {
        let (model, gpu) = setup();
        let truth = Coefficients { a: 3.0, b: 40.0, decode_bw_efficiency: 0.8, step_overhead_secs: 0.002 };
        let r = Roofline::new(&model, &gpu, 1, truth);
        let rows = LatencyRows {
            prefill: [512u64, 2048, 8192, 32768].iter().map(|&n| (n as f64, r.prefill_secs(0, n))).collect(),
            decode: [(1u64, 1024u64), (8, 1024), (32, 4096), (128, 2048)]
                .iter()
                .map(|&(b, c)| (b as f64, c as f64, r.decode_secs(b, b * c, b * c)))
                .collect(),
        };
        let fit = calibrate(&model, &gpu, 1, &rows).unwrap();
        let c = fit.coefficients;
        let close = |x: f64, want: f64| ((x - want) / want).abs() < 0.01;
        assert!(close(c.a, 3.0) && close(c.b, 40.0), "{c:?}");
        assert!(close(c.decode_bw_efficiency, 0.8) && close(c.step_overhead_secs, 0.002), "{c:?}");
        assert!(fit.worst().unwrap().residual().abs() < 1e-9);
        assert!(fit.notes.is_empty(), "{:?}", fit.notes);
    }

    #[test]
    fn decode_faster_than_the_datasheet_holds_the_efficiency_at_one() {
        let (model, gpu) = setup();
        let r = Roofline::new(&model, &gpu, 1, Coefficients::OPAL);
        // Half the time the peak bandwidth allows.
        let rows = LatencyRows {
            prefill: Vec::new(),
            decode: vec![
                (1.0, 100.0, r.decode_secs(1, 100, 100) / 2.0),
                (4.0, 100.0, r.decode_secs(4, 400, 400) / 2.0),
            ],
        };
        let fit = calibrate(&model, &gpu, 1, &rows).unwrap();
        assert_eq!(fit.coefficients.decode_bw_efficiency, 1.0);
        assert_eq!(fit.coefficients.step_overhead_secs, 0.0);
        assert!(fit.notes.iter().any(|n| n.contains("faster than the datasheet")), "{:?}", fit.notes);
        assert_eq!((fit.coefficients.a, fit.coefficients.b), (4.0, 24.0), "no prefill rows: Opal's");
    }

    #[test]
    fn the_toml_block_runs_as_a_scenario() {
        let fit = Calibration {
            coefficients: Coefficients { a: 3.5, b: 50.25, decode_bw_efficiency: 0.75, step_overhead_secs: 0.001 },
            rows: Vec::new(),
            notes: Vec::new(),
        };
        let file = crate::config::parse_spec(&fit.toml(), "calibration.toml").unwrap();
        let s = crate::config::resolve(&file, "calibration.toml", std::path::Path::new(".")).unwrap();
        let crate::worker::perf::StepModel::Roofline(r) = &s.worker.perf.model else { panic!("roofline expected") };
        assert_eq!((r.a, r.b, r.decode_bw_efficiency, r.step_overhead_secs), (3.5, 50.25, 0.75, 0.001));
    }
}
