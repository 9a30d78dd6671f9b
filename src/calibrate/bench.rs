//! A measured row run through the simulator as a user would time it.

use crate::Scenario;
use crate::worker::model::{ModelArch, Sharding};
use crate::worker::perf::operators::{OperatorConstants, OperatorCurves, Operators};
use crate::worker::perf::profile::{Profile, Routing, analytic::Analytic, shipped, vidur};
use crate::worker::perf::{Measured, Phase, StepModel};
use crate::worker::power::PowerModel;
use crate::worker::presets::GpuSpec;
use std::path::PathBuf;
use std::sync::Arc;

/// The model measured.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelRef {
    /// A preset.
    Preset(String),
    /// A Hugging Face `config.json`.
    Path(PathBuf),
}

/// Where the operator prices come from.
#[derive(Clone, Debug, PartialEq)]
pub enum ProfileChoice {
    /// The GPU preset's shipped tables, else analytic (`profile = "auto"`).
    Auto,
    /// Analytic only.
    Analytic,
    /// A directory of aiconfigurator tables or a Vidur profile.
    Dir(PathBuf),
    /// A Vidur profile as text (the shipped sets): what it is, its
    /// `mlp.csv` and its `attention.csv`.
    VidurText(&'static str, &'static str, Option<&'static str>),
}

/// What was measured: a model on a GPU, and the profile to price it with.
#[derive(Clone, Debug)]
pub struct Setup {
    /// The model.
    pub model: ModelRef,
    /// The GPU preset.
    pub gpu: String,
    /// Tensor-parallel degree of rows without their own.
    pub tp: u32,
    /// Where operator prices come from.
    pub profile: ProfileChoice,
    /// How routed experts share the tokens (MoE models).
    pub routing: Routing,
    /// Routed experts sharded over each row's TP GPUs (`ep = tp`; MoE models).
    pub expert_parallel: bool,
}

impl Setup {
    /// The expert-parallel degree of a row at `tp`.
    fn ep(&self, tp: u32) -> u32 {
        if self.expert_parallel { tp } else { 1 }
    }
}

/// What one run of a row gave.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowRun {
    /// The row's latency as the run times it, seconds.
    pub latency_s: f64,
    /// Mean board power per GPU over the run, W.
    pub power_w: f64,
    /// For the power fit: the run's busy share, and its compute and memory
    /// seconds at the peaks per second of run (`u_c`, `u_m` over the run).
    pub power_features: [f64; 3],
    /// The idle share of the run's power (fixed, not fitted), W.
    pub idle_w: f64,
}

impl Setup {
    /// The resolved model.
    pub fn model_arch(&self) -> Result<ModelArch, String> {
        match &self.model {
            ModelRef::Preset(name) => ModelArch::preset(name).ok_or_else(|| {
                format!("unknown model {name:?}; use a preset ({}) or a config.json", ModelArch::preset_list())
            }),
            ModelRef::Path(p) => ModelArch::from_hf_config(p),
        }
    }

    /// The profile for `tp` GPUs of this model.
    pub fn profile(&self, model: &ModelArch, gpu: &GpuSpec, tp: u32) -> Result<Profile, String> {
        let (analytic, routing) = (Analytic { peaks: gpu.peaks() }, self.routing);
        let tables = || shipped::tables(&gpu.name, gpu.peaks());
        let vidur_shape = || match model.attention {
            crate::worker::model::Attention::Gqa { heads, kv_heads, .. } => Ok(vidur::VidurShape {
                heads,
                kv_heads,
                hidden: model.hidden_size,
                intermediate: model.intermediate_size,
                tp,
            }),
            _ => Err("a Vidur profile prices only grouped-query attention models".to_string()),
        };
        Ok(match &self.profile {
            ProfileChoice::Auto => Profile { vidur: None, tables: tables(), analytic, routing },
            ProfileChoice::Analytic => Profile { vidur: None, tables: None, analytic, routing },
            ProfileChoice::VidurText(what, mlp, attention) => Profile {
                vidur: Some(Arc::new(vidur::VidurProfile::from_text(
                    mlp,
                    what,
                    attention.map(|a| (a, *what)),
                    vidur_shape()?,
                )?)),
                tables: tables(),
                analytic,
                routing,
            },
            ProfileChoice::Dir(dir) if dir.join("mlp.csv").is_file() => Profile {
                vidur: Some(Arc::new(vidur::VidurProfile::from_dir(dir, vidur_shape()?)?)),
                tables: tables(),
                analytic,
                routing,
            },
            ProfileChoice::Dir(dir) => Profile {
                vidur: None,
                tables: Some(Arc::new(crate::worker::perf::profile::aic::AicTables::from_dir(dir, gpu.peaks())?)),
                analytic,
                routing,
            },
        })
    }

    /// The `profile = …` line of a scenario using this profile.
    pub fn profile_toml(&self) -> String {
        match &self.profile {
            ProfileChoice::Auto | ProfileChoice::VidurText(..) => "\"auto\"".into(),
            ProfileChoice::Analytic => "\"analytic\"".into(),
            ProfileChoice::Dir(d) => format!("{:?}", d.display().to_string()),
        }
    }
}

/// A prepared row: its scenario (with the curves of its TP degree), ready
/// to run with any constants.
pub struct Bench {
    /// The scenario (its step model is replaced at every run).
    scenario: Scenario,
    curves: Arc<OperatorCurves>,
    row: Measured,
}

/// The scenario of a row: see the module docs of [`crate::calibrate`].
fn row_scenario(setup: &Setup, model: &ModelArch, row: &Measured, tp: u32) -> Result<Scenario, String> {
    let (prompt, output) = match row.phase {
        Phase::Prefill => (row.tokens, 1),
        Phase::Decode => (row.tokens.max(1), row.output_tokens),
    };
    let seq = prompt + output;
    let tokens = row.batch * seq;
    // Memory for the weights and every sequence's KV, with room to spare.
    let bytes = model.weight_bytes() as f64
        + (tokens + 64) as f64 * model.kv_bytes_per_token_of(model.num_layers, u64::from(tp)) as f64;
    let memory_gb = (1.25 * bytes / f64::from(tp) / (1u64 << 30) as f64).ceil() + 1.0;
    let budget = (row.batch * prompt).max(8192).min(u64::from(u32::MAX));
    let model_line = match &setup.model {
        ModelRef::Preset(n) => format!("name = {n:?}"),
        ModelRef::Path(p) => format!("config_path = {:?}", p.display().to_string()),
    };
    let text = format!(
        r#"
[simulation]
num_workers = 1
[model.model_params]
{model_line}
[worker.hw]
gpu = {gpu:?}
tp = {tp}
ep = {ep}
memory_gb = {memory_gb}
[worker.vllm_params]
max_num_seqs = {batch}
max_num_batched_tokens = {budget}
max_model_len = {seq}
allow_long_max_model_len = true
enable_prefix_caching = false
[worker.inference_params]
model = "operators"
profile = {profile}
expert_routing = {routing:?}
[kvc]
kvc_tiers = []
[[workload.stages]]
type = "UniformReqRate"
[workload.stages.workload_params]
request_rate = inf
total_requests = {batch}
prompt_size = {prompt}
output_tokens = {output}
default_prefix_length = 0
"#,
        gpu = setup.gpu,
        batch = row.batch,
        profile = setup.profile_toml(),
        routing = setup.routing.name(),
        ep = setup.ep(tp),
    );
    let file = crate::config::parse_spec(&text, "calibration row").map_err(|e| e.to_string())?;
    crate::config::resolve(&file, "calibration row", std::path::Path::new(".")).map_err(|e| e.to_string())
}

impl Bench {
    /// Prepares `row` of `setup` (`default_tp` for a row without its own).
    pub fn new(setup: &Setup, row: &Measured) -> Result<Bench, String> {
        let model = setup.model_arch()?;
        let tp = row.tp.unwrap_or(setup.tp);
        let scenario = row_scenario(setup, &model, row, tp)?;
        let profile = setup.profile(&model, &scenario.gpu, tp)?;
        let ep = setup.ep(tp);
        let key = format!("calibrate|{}|tp {tp}|ep {ep}|{:?}|{model:?}", profile.describe(), scenario.gpu.peaks());
        let curves = OperatorCurves::cached(key, &model, Sharding { tp, ep, dp: 1 }, &profile);
        Ok(Bench { scenario, curves, row: row.clone() })
    }

    /// The row measured.
    pub fn row(&self) -> &Measured {
        &self.row
    }

    /// Its tensor-parallel degree.
    pub fn tp(&self) -> u32 {
        self.scenario.tp
    }

    /// The GPU's power model.
    pub fn power(&self) -> PowerModel {
        self.scenario.gpu.power
    }

    /// Runs the row with `constants` (and `power`, else the GPU's).
    pub fn run(&mut self, constants: OperatorConstants, power: Option<PowerModel>) -> Result<RowRun, String> {
        self.scenario.worker.perf = StepModel::Operators(Operators { curves: self.curves.clone(), constants });
        if let Some(p) = power {
            self.scenario.gpu.power = p;
            self.scenario.worker.power = p;
        }
        let out = crate::simulate(&self.scenario).map_err(|e| e.to_string())?;
        let r = &out.requests;
        if r.len() as u64 != self.row.batch || r.iter().any(|r| !r.completed) {
            return Err(format!("line {}: not every request of the row completed", self.row.line));
        }
        let latency_s = match self.row.phase {
            Phase::Prefill => r.iter().filter_map(|r| r.ttft_s).fold(0.0, f64::max),
            Phase::Decode => r.iter().filter_map(|r| r.tpot_s).sum::<f64>() / r.len() as f64,
        };
        let w = &out.workers[0];
        let alive = w.busy_s / w.busy_fraction.max(f64::MIN_POSITIVE);
        let tp = f64::from(self.scenario.tp);
        let power_w = w.cost.energy_j / (tp * alive);
        let p = self.scenario.gpu.power;
        Ok(RowRun {
            latency_s,
            power_w,
            power_features: [w.busy_fraction, w.compute_fraction, w.hbm_fraction],
            idle_w: p.idle_w * (1.0 - w.busy_fraction),
        })
    }

    /// The row's latency as a linear function of the constants: its value
    /// with each constant alone set to 1 (see the module docs of [`crate::calibrate`]).
    pub fn features(&mut self) -> Result<[f64; 6], String> {
        let mut f = [0.0; 6];
        for (i, v) in f.iter_mut().enumerate() {
            let mut unit = [0.0; 6];
            unit[i] = 1.0;
            let secs = self.run(OperatorConstants::from_array(unit), None)?.latency_s;
            // A step no constant but this one prices still takes 1 ns (the
            // shortest step): a row that does not depend on it reads a few ns.
            *v = if secs < 1e-8 { 0.0 } else { secs };
        }
        Ok(f)
    }
}
