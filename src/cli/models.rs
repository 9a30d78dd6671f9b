//! Commands on models and GPUs: presets, a model's sizes, calibration of
//! the step model and validation against the shipped measurements.

use super::{Failure, out};
use crate::worker::perf::profile::Routing;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

/// `opal-sweep model`.
#[derive(Args, Debug)]
pub struct ModelArgs {
    /// A preset (e.g. deepseek-v3, meta-llama/Llama-3.1-8B) or a config.json.
    model: String,
    /// A GPU preset (A100-40G, A100-80G, H100, H100-PCIe, H200, B200, MI300X, L40S).
    #[arg(long)]
    gpu: Option<String>,
    /// GPUs per worker (tensor parallelism; per stage with --pp).
    #[arg(long, default_value_t = 1)]
    tp: u32,
    /// Pipeline stages per worker, each --tp GPUs.
    #[arg(long, default_value_t = 1)]
    pp: u32,
    /// Fraction of GPU memory vLLM may use.
    #[arg(long, default_value_t = 0.9)]
    gpu_memory_utilization: f64,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    block_size: u64,
    /// Sequence length for the "sequences that fit" figure, tokens.
    #[arg(long, default_value_t = 8192)]
    context: u64,
    /// KV-cache element type: auto (the weights' dtype) or fp8.
    #[arg(long, default_value = "auto")]
    kv_cache_dtype: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// `opal-sweep calibrate`.
#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// The measurements (CSV).
    measurements: PathBuf,
    /// The model measured: a preset or a config.json.
    #[arg(long)]
    model: String,
    /// The GPU measured: a preset.
    #[arg(long)]
    gpu: String,
    /// GPUs per worker of rows without a tp column.
    #[arg(long, default_value_t = 1)]
    tp: u32,
    /// Operator prices: auto (the GPU's shipped tables, else analytic),
    /// analytic, or a directory of aiconfigurator tables or a Vidur profile.
    #[arg(long, default_value = "auto")]
    profile: String,
    /// A mixture of experts' routing, which picks the measured MoE rows:
    /// balanced, power_law_1.01 or power_law_1.2 (as `expert_routing`).
    #[arg(long, default_value = "balanced")]
    expert_routing: String,
    /// The routed experts were sharded over each row's TP GPUs (vLLM's
    /// --enable-expert-parallel; `ep = tp`).
    #[arg(long)]
    ep: bool,
    /// The constants to fit (comma-separated; the others keep their
    /// defaults): compute_scale, memory_scale, comm_scale,
    /// step_overhead_secs, seq_overhead_secs.
    #[arg(long, value_name = "LIST")]
    fit: Option<String>,
    /// Rows to predict with the fit (e.g. another TP degree): their errors,
    /// and a warning for each outside the fitted rows' batch, token and TP ranges.
    #[arg(long, value_name = "CSV")]
    predict: Option<PathBuf>,
    /// Write the TOML block to this file instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
}

pub(super) fn presets() -> Result<ExitCode, Failure> {
    out(&crate::report::text::presets_table());
    Ok(ExitCode::SUCCESS)
}

/// A model named on the command line: a preset, or a config.json.
fn load_model(name: &str) -> Result<crate::worker::model::ModelArch, Failure> {
    use crate::worker::model::ModelArch;
    let path = PathBuf::from(name);
    if path.is_file() || name.ends_with(".json") {
        return ModelArch::from_hf_config(&path).map_err(|e| {
            let fix = if e.contains("\n  fix:") {
                ""
            } else {
                "\n  fix: give a Hugging Face config.json (the model repository's, unchanged), or a preset name"
            };
            Failure::Input(format!("{e}{fix}"))
        });
    }
    ModelArch::preset(name).ok_or_else(|| {
        Failure::Input(format!(
            "unknown model {name:?}\n  fix: use a preset ({}) or a path to a config.json",
            ModelArch::preset_list()
        ))
    })
}

/// A GPU preset named on the command line.
fn load_gpu(name: &str) -> Result<crate::worker::presets::GpuSpec, Failure> {
    use crate::worker::presets::GpuSpec;
    GpuSpec::preset(name)
        .ok_or_else(|| Failure::Input(format!("unknown GPU {name:?}\n  fix: use a preset: {}", GpuSpec::preset_list())))
}

pub(super) fn model(args: &ModelArgs) -> Result<ExitCode, Failure> {
    use crate::worker::model::ModelReport;
    let mut model = load_model(&args.model)?;
    model.set_kv_cache_dtype(&args.kv_cache_dtype).map_err(|e| Failure::Input(format!("--kv-cache-dtype: {e}")))?;
    if !(args.gpu_memory_utilization > 0.0 && args.gpu_memory_utilization <= 1.0) {
        return Err(Failure::Input(format!(
            "--gpu-memory-utilization must be in (0, 1], got {}\n  fix: vLLM's default is 0.9",
            args.gpu_memory_utilization
        )));
    }
    if args.block_size == 0 {
        return Err(Failure::Input("--block-size must be at least 1\n  fix: vLLM's default is 16".into()));
    }
    if args.context == 0 {
        return Err(Failure::Input("--context must be at least 1 token\n  fix: the default is 8192".into()));
    }
    if let Some(why) = model.tp_problem(u64::from(args.tp)) {
        return Err(Failure::Input(format!(
            "--tp {}: {why}\n  fix: use a degree that divides the head count",
            args.tp
        )));
    }
    if args.pp == 0 || u64::from(args.pp) > model.num_layers {
        return Err(Failure::Input(format!(
            "--pp {}: {} has {} layers, and each stage needs at least one
  fix: use 1 to {} stages",
            args.pp, model.name, model.num_layers, model.num_layers
        )));
    }
    let gpu = args.gpu.as_deref().map(load_gpu).transpose()?;
    let fit = gpu.as_ref().map(|g| crate::worker::model::FitInput {
        gpu: g.name.as_str(),
        memory_gb: g.memory_gb,
        tp: args.tp,
        pp: args.pp,
        utilization: args.gpu_memory_utilization,
        block_size: args.block_size,
        context: args.context,
    });
    let report = ModelReport::new(&model, fit);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report).expect("a report serializes"));
    } else {
        print!("{}", crate::report::text::model_text(&report));
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) fn calibrate(args: &CalibrateArgs) -> Result<ExitCode, Failure> {
    use crate::calibrate::{FitOptions, ModelRef, ProfileChoice, Setup};
    let gpu = load_gpu(&args.gpu)?;
    if args.tp == 0 {
        return Err(Failure::Input(
            "--tp must be at least 1\n  fix: give the GPUs per worker the rows were measured on (e.g. --tp 2), or a tp column".into(),
        ));
    }
    const CSV_FIX: &str = "\n  fix: rows are phase,batch_size,tokens,latency_ms[,tp,output_tokens,power_w], e.g. prefill,1,512,30.5 (see opal-sweep calibrate --help)";
    let read = |path: &std::path::Path| {
        if !path.is_file() {
            return Err(Failure::Input(format!("{}: no such file\n  fix: check the path", path.display())));
        }
        crate::worker::perf::read_measured(path).map_err(|e| Failure::Input(format!("{e}{CSV_FIX}")))
    };
    // Both files are read before the fit, so a bad --predict path costs nothing.
    let rows = read(&args.measurements)?;
    let other = args.predict.as_deref().map(read).transpose()?;
    let model_path = PathBuf::from(&args.model);
    let model = if model_path.is_file() || args.model.ends_with(".json") {
        ModelRef::Path(std::fs::canonicalize(&model_path).unwrap_or(model_path))
    } else {
        load_model(&args.model)?;
        ModelRef::Preset(args.model.clone())
    };
    let profile = match args.profile.as_str() {
        "auto" => ProfileChoice::Auto,
        "analytic" => ProfileChoice::Analytic,
        dir => ProfileChoice::Dir(std::fs::canonicalize(dir).map_err(|e| {
            Failure::Input(format!(
                "--profile {dir}: {e}\n  fix: use auto, analytic, or a directory of aiconfigurator or Vidur tables"
            ))
        })?),
    };
    let opts = match &args.fit {
        Some(list) => FitOptions::parse(list).map_err(|e| {
            Failure::Input(format!(
                "{e}\n  fix: name constants from that list, comma-separated (e.g. --fit compute_scale,memory_scale)"
            ))
        })?,
        None => FitOptions::default(),
    };
    let routing = Routing::parse(&args.expert_routing).ok_or_else(|| {
        Failure::Input(format!(
            "--expert-routing {}: unknown routing\n  fix: use balanced, power_law_1.01 or power_law_1.2",
            args.expert_routing
        ))
    })?;
    let setup = Setup { model, gpu: gpu.name.clone(), tp: args.tp, profile, routing, expert_parallel: args.ep };
    let file = args.measurements.display().to_string();
    let fit = crate::calibrate::calibrate(&setup, &rows, &opts)
        .map_err(|e| Failure::Input(format!("{file}: {e}{CSV_FIX}")))?;
    eprint!("{}", crate::report::text::calibration_table(&fit));
    if let (Some(path), Some(other)) = (&args.predict, other) {
        let (predicted, warnings) = crate::calibrate::fit::predict(&setup, fit.constants, &rows, &other)
            .map_err(|e| Failure::Input(format!("{}: {e}{CSV_FIX}", path.display())))?;
        eprintln!("predicted ({}):", path.display());
        for (r, tp, s) in &predicted {
            eprintln!(
                "  line {:<4} tp {:>2} batch {:>5} tokens {:>7}: measured {:.2} ms, predicted {:.2} ms ({:+.1} %)",
                r.line,
                tp,
                r.batch,
                r.tokens,
                r.latency_s * 1e3,
                s * 1e3,
                100.0 * crate::calibrate::fit::residual(*s, r.latency_s)
            );
        }
        if let Some((median, max)) = crate::calibrate::fit::median_max(
            predicted.iter().map(|(r, _, s)| crate::calibrate::fit::residual(*s, r.latency_s)),
        ) {
            eprintln!("  error: median {:.1} %, max {:.1} %", 100.0 * median, 100.0 * max);
        }
        for w in warnings {
            eprintln!("warning: {w}");
        }
    }
    let header = format!(
        "# opal-sweep calibrate {} --model {} --gpu {} --tp {} --profile {}\n",
        args.measurements.display(),
        args.model,
        gpu.name,
        args.tp,
        args.profile
    );
    let text = header + &fit.toml();
    match &args.output {
        Some(path) => {
            std::fs::write(path, text).map_err(|e| Failure::Run(format!("{}: cannot write: {e}", path.display())))?;
            eprintln!("wrote {}", path.display());
        }
        None => out(&text),
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) fn validate() -> Result<ExitCode, Failure> {
    let mut reports = Vec::new();
    for set in crate::calibrate::sets::sets() {
        eprintln!("{} ({}): {}", set.name, set.file, set.source);
        reports.push(set.validate().map_err(Failure::Run)?);
    }
    out(&crate::calibrate::sets::table(&reports));
    Ok(ExitCode::SUCCESS)
}
