//! The measurement sets shipped with Opal (`measurements/`, whose README
//! names every source and license) and `opal-sweep validate`: each set's
//! rows run black-box with the default model and with constants fitted to
//! the set, and the errors of both.

use super::bench::{ModelRef, ProfileChoice, Setup};
use super::fit::{FitOptions, Prepared, median_max, residual};
use crate::worker::perf::profile::Routing;
use crate::worker::perf::{Measured, parse_measured};

/// A shipped measurement set.
#[derive(Clone, Debug)]
pub struct MeasurementSet {
    /// Its name in the report.
    pub name: &'static str,
    /// Where its rows come from.
    pub source: &'static str,
    /// The CSV, in the repository.
    pub file: &'static str,
    /// Its text.
    pub csv: &'static str,
    /// The model preset measured.
    pub model: &'static str,
    /// The GPU preset.
    pub gpu: &'static str,
    /// TP of rows without their own.
    pub tp: u32,
    /// The profile its rows are priced with.
    pub profile: ProfileChoice,
    /// Also fit to the rows of this TP degree alone and predict the others.
    pub cross_tp: Option<u32>,
    /// How the model's routed experts share the tokens (a MoE set: as its source assumed).
    pub routing: Routing,
    /// Its routed experts sharded over the TP GPUs (`ep = tp`).
    pub expert_parallel: bool,
}

macro_rules! set {
    ($name:literal, $source:literal, $file:literal, $model:literal, $gpu:literal, $tp:literal, $profile:expr, $cross:expr) => {
        MeasurementSet {
            name: $name,
            source: $source,
            file: $file,
            csv: include_str!(concat!("../../", $file)),
            model: $model,
            gpu: $gpu,
            tp: $tp,
            profile: $profile,
            cross_tp: $cross,
            routing: Routing::Balanced,
            expert_parallel: false,
        }
    };
}

/// Vidur's Llama-2-7B A100 profile, as shipped.
const VIDUR_LLAMA2_7B: ProfileChoice = ProfileChoice::VidurText(
    "profiles/vidur/a100/llama-2-7b",
    include_str!("../../profiles/vidur/a100/llama-2-7b/mlp.csv"),
    Some(include_str!("../../profiles/vidur/a100/llama-2-7b/attention.csv")),
);

/// Every shipped set. The MoE sets route tokens as aiconfigurator did
/// when it made them (its `workload_distribution` default, `power_law`, at
/// the α its model classes set: 1.2 in `sdk/models/moe.py`, 1.01 in
/// `sdk/models/deepseek.py`).
pub fn sets() -> Vec<MeasurementSet> {
    vec![
        set!(
            "aiconfigurator H100 Llama-3.1-8B TP1",
            "aiconfigurator-core 0.12.0, vLLM 0.24.0 tables",
            "measurements/aiconfigurator/llama-3.1-8b-h100-tp1.csv",
            "llama-3.1-8b",
            "H100",
            1,
            ProfileChoice::Auto,
            None
        ),
        set!(
            "aiconfigurator H100 Llama-3.1-70B TP4",
            "aiconfigurator-core 0.12.0, vLLM 0.24.0 tables",
            "measurements/aiconfigurator/llama-3.1-70b-h100-tp4.csv",
            "llama-3.1-70b",
            "H100",
            4,
            ProfileChoice::Auto,
            None
        ),
        MeasurementSet {
            routing: Routing::PowerLaw12,
            ..set!(
                "aiconfigurator H100 Qwen3-30B-A3B TP1 (MoE)",
                "aiconfigurator-core 0.12.0, vLLM 0.24.0 tables",
                "measurements/aiconfigurator/qwen3-30b-a3b-h100-tp1.csv",
                "qwen3-30b-a3b",
                "H100",
                1,
                ProfileChoice::Auto,
                None
            )
        },
        MeasurementSet {
            routing: Routing::PowerLaw12,
            ..set!(
                "aiconfigurator H100 Qwen3-30B-A3B TP2 (MoE)",
                "aiconfigurator-core 0.12.0, vLLM 0.24.0 tables",
                "measurements/aiconfigurator/qwen3-30b-a3b-h100-tp2.csv",
                "qwen3-30b-a3b",
                "H100",
                2,
                ProfileChoice::Auto,
                None
            )
        },
        MeasurementSet {
            routing: Routing::PowerLaw12,
            ..set!(
                "aiconfigurator H100 Mixtral-8x7B TP2 (MoE)",
                "aiconfigurator-core 0.12.0, vLLM 0.24.0 tables",
                "measurements/aiconfigurator/mixtral-8x7b-h100-tp2.csv",
                "mixtral-8x7b",
                "H100",
                2,
                ProfileChoice::Auto,
                None
            )
        },
        MeasurementSet {
            routing: Routing::PowerLaw101,
            expert_parallel: true,
            ..set!(
                "aiconfigurator H200 DeepSeek-V3 TP8, experts EP8 (MoE)",
                "aiconfigurator-core 0.12.0, vLLM 0.24.0 tables, FP8 weights",
                "measurements/aiconfigurator/deepseek-v3-h200-ep8.csv",
                "deepseek-v3",
                "H200",
                8,
                ProfileChoice::Auto,
                None
            )
        },
        set!(
            "SplitwiseSim A100 Llama-2-70B TP2/4/8",
            "measured, vLLM of 2023 (splitwise-sim data/perf_model.csv)",
            "measurements/splitwise/llama-2-70b-a100.csv",
            "llama-2-70b",
            "A100-80G",
            4,
            ProfileChoice::Auto,
            Some(4)
        ),
        set!(
            "SplitwiseSim H100 Llama-2-70B TP2/4/8",
            "measured, vLLM of 2023 (splitwise-sim data/perf_model.csv)",
            "measurements/splitwise/llama-2-70b-h100.csv",
            "llama-2-70b",
            "H100",
            4,
            ProfileChoice::Auto,
            Some(4)
        ),
        set!(
            "Vidur A100 Llama-2-7B TP1 (Vidur's profile)",
            "Vidur's own predictions; priced from its shipped profile",
            "measurements/vidur/llama-2-7b-a100.csv",
            "llama-2-7b",
            "A100-80G",
            1,
            VIDUR_LLAMA2_7B,
            None
        ),
        set!(
            "SC25 H100 Llama-3.1-70B TP4 (prefill)",
            "measured by IBM Research (the Python Opal's SC25 study)",
            "examples/calibration/sc25-llama-3.1-70b-h100-tp4.csv",
            "llama-3.1-70b",
            "H100",
            4,
            ProfileChoice::Auto,
            None
        ),
    ]
}

/// Median and largest |relative error|.
pub type Errors = Option<(f64, f64)>;

/// What `validate` found for one set.
#[derive(Clone, Debug)]
pub struct SetReport {
    /// The set.
    pub name: &'static str,
    /// Rows run.
    pub rows: usize,
    /// The default model (no calibration).
    pub default: Errors,
    /// Fitted to the set, each row predicted by a fit without it (leave one out).
    pub held_out: Errors,
    /// Fitted to the set's rows of one TP degree, the other degrees predicted: (TP, errors).
    pub cross_tp: Option<(u32, Errors)>,
    /// Mean board power with the GPU's default power model (at the calibrated timing).
    pub power_default: Errors,
    /// Mean board power with the power model fitted to the set.
    pub power_fitted: Errors,
}

impl MeasurementSet {
    /// The set's setup and rows.
    pub fn load(&self) -> Result<(Setup, Vec<Measured>), String> {
        let setup = Setup {
            model: ModelRef::Preset(self.model.to_string()),
            gpu: self.gpu.to_string(),
            tp: self.tp,
            profile: self.profile.clone(),
            routing: self.routing,
            expert_parallel: self.expert_parallel,
        };
        Ok((setup, parse_measured(self.csv, self.file)?))
    }

    /// Runs the set (see [`SetReport`]).
    pub fn validate(&self) -> Result<SetReport, String> {
        let (setup, rows) = self.load()?;
        let at = |e: String| format!("{}: {e}", self.file);
        let mut p = Prepared::new(&setup, &rows).map_err(at)?;
        let all: Vec<usize> = (0..rows.len()).collect();
        let fit = p.calibrate(&setup, &all, &FitOptions::default()).map_err(at)?;
        let cross_tp = match self.cross_tp {
            Some(tp) => {
                let (train, test): (Vec<usize>, Vec<usize>) =
                    all.iter().partition(|&&i| rows[i].tp.unwrap_or(self.tp) == tp);
                let (c, _) = p.fit(&train, &FitOptions::default()).map_err(at)?;
                let runs = p.run(&test, c, None).map_err(at)?;
                Some((tp, median_max(test.iter().zip(&runs).map(|(&i, r)| residual(r.latency_s, rows[i].latency_s)))))
            }
            None => None,
        };
        let power = |pick: fn(&(f64, f64, f64)) -> f64| {
            median_max(fit.rows.iter().filter_map(|r| r.power_w.as_ref().map(|p| residual(pick(p), p.0))))
        };
        Ok(SetReport {
            name: self.name,
            rows: rows.len(),
            default: fit.default_error(),
            held_out: fit.cv_error(),
            cross_tp,
            power_default: power(|p| p.1),
            power_fitted: power(|p| p.2),
        })
    }
}

/// The report as a Markdown table (what the README shows).
pub fn table(reports: &[SetReport]) -> String {
    let pct = |e: Errors| match e {
        Some((median, max)) => format!("{:.1} % / {:.1} %", 100.0 * median, 100.0 * max),
        None => "–".into(),
    };
    let mut s = String::from(
        "| set | rows | default model | calibrated, each row held out | calibrated on one TP, others predicted | power: default model | power: fitted |\n|---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        let cross = match r.cross_tp {
            Some((tp, e)) => format!("TP{tp}: {}", pct(e)),
            None => "–".into(),
        };
        s += &format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            r.name,
            r.rows,
            pct(r.default),
            pct(r.held_out),
            cross,
            pct(r.power_default),
            pct(r.power_fitted)
        );
    }
    s
}
