//! `opal-sweep`: the command-line front end. It parses flags, calls the
//! library and maps errors to exit codes; everything else lives in `opal`.

use clap::{Args, Parser, Subcommand};
use opal::sweep::runner::{RunnerOptions, Shard, SweepReport, merge_dir, run_sweep};
use opal::sweep::{SweepPlan, plan};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

/// Simulate an LLM inference platform (router + vLLM-like workers) for every
/// point of a sweep and write the results as Parquet tables.
///
/// A spec is TOML (an Opal JSON configuration also runs as it is; see
/// `opal-sweep convert`): the scenario sections ([simulation], [model.model_params],
/// [router.router_params], [[workload.stages]], [worker.*]) plus optional
/// [sweep] settings (name, output, replicates, base_seed, tables,
/// time_series_interval_sec, base, report), [grid] axes ("dotted.path" = [values],
/// Cartesian product) and [[zip]] groups (paths varied together). A spec
/// without axes is a single run. Replicate r of every point runs with seed
/// base_seed + r.
///
/// Results go to results/<name>/ (or [sweep] output, or -o): runs.parquet,
/// histograms.parquet (HDR V2), timeseries.parquet, workers.parquet,
/// stages.parquet, sc25.parquet (with an SC25Workload stage),
/// search.parquet (with a [search]), requests.parquet and steps.parquet (if
/// listed in tables) and manifest.json.
///
/// Exit codes: 0 every run succeeded, 1 a run failed or the sweep was
/// interrupted, 2 invalid input (the message names the file, line, key and fix).
#[derive(Parser, Debug)]
#[command(
    name = "opal-sweep",
    version,
    about,
    long_about,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_help = "Examples:\n  opal-sweep sweeps/quickstart.toml\n  opal-sweep sweeps/policy-rate.toml -j 8 --dry-run\n  opal-sweep sweeps/policy-rate.toml --shard 0/4 -o /scratch/pr && opal-sweep merge /scratch/pr\n  opal-sweep slurm sweeps/policy-rate.toml --tasks 16 > job.sh && sbatch job.sh\n  opal-sweep report results/policy-rate\n  opal-sweep convert examples/opal/exponential-12rps.json"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a spec (the default when no subcommand is given).
    Run(RunArgs),
    /// Merge the part files of a sharded sweep into its tables.
    Merge {
        /// The sweep's output directory.
        dir: PathBuf,
    },
    /// Print an sbatch script that runs a spec as a Slurm job array.
    Slurm(SlurmArgs),
    /// Draw a sweep's results as an HTML page with figures (PNG and SVG).
    ///
    /// Reads only the results directory (manifest.json and the Parquet
    /// tables): a summary table per grid point, TTFT CDFs, throughput,
    /// percentiles vs the sweep's axes, cache hits and storage traffic,
    /// utilisation over time and, for SC25 stages, cold vs warm TTFT.
    /// Failed runs are left out and listed.
    Report {
        /// The sweep's results directory.
        dir: PathBuf,
        /// Where to write the report (default: <dir>/report).
        #[arg(short, long, value_name = "DIR")]
        output: Option<PathBuf>,
        /// Also write each figure as PNG (for slides and papers); the page
        /// then shows the PNGs. Rasterising takes most of a report's time,
        /// and needs a build with `--features png`.
        #[arg(long)]
        png: bool,
    },
    /// Write one run's scheduler steps as a trace-event JSON file to open in
    /// Perfetto (ui.perfetto.dev) or chrome://tracing.
    ///
    /// Reads the run's rows of steps.parquet (a sweep with "steps" in
    /// [sweep] tables): per worker, each step with its batch (prefill chunks
    /// and tokens, decodes, context), the requests it preempted, and the KV
    /// it loaded from and saved to the tiers.
    Timeline {
        /// The sweep's results directory.
        dir: PathBuf,
        /// The run (a runs-table run_id; default: the first with steps).
        #[arg(long)]
        run: Option<u32>,
        /// The file to write (default: <dir>/timeline-run<N>.json).
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Steps written at most (the earliest; about 300 bytes each).
        #[arg(long, value_name = "N", default_value_t = opal::report::timeline::DEFAULT_MAX_STEPS)]
        max_steps: usize,
    },
    /// Print the effective configuration: every key of a spec's scenario,
    /// defaults filled in, each with a comment — TOML that runs to the same
    /// results.
    ///
    /// With --point N, grid point N's scenario alone; with --defaults, the
    /// scenario of an empty spec.
    Config {
        /// The spec (TOML or Opal JSON).
        #[arg(required_unless_present = "defaults")]
        spec: Option<PathBuf>,
        /// Print grid point N (as --dry-run numbers them) instead of the axes and base scenario.
        #[arg(long, value_name = "N", conflicts_with = "defaults")]
        point: Option<usize>,
        /// Print the default scenario.
        #[arg(long, conflicts_with = "spec")]
        defaults: bool,
    },
    /// List the model and GPU presets with their key numbers.
    Presets,
    /// Print what the simulator derives from a model, and how it fits on a GPU.
    ///
    /// The model is a preset name (or a Hugging Face id of one) or a path to
    /// a Hugging Face config.json. Prints the family, layers, total and
    /// active parameters, weight bytes and KV bytes per token and, with
    /// --gpu, the KV pool in blocks and tokens and the most sequences of
    /// --context tokens it holds at once.
    Model(ModelArgs),
    /// Fit the step model's constants to measured latencies (and power).
    ///
    /// The CSV has columns phase,batch_size,tokens,latency_ms and optionally
    /// tp, output_tokens, power_w (the `table` step model's format): a
    /// prefill row is batch_size prompts of `tokens` tokens arriving together,
    /// timed until the last first token; a decode row is batch_size
    /// sequences of `tokens` context generating output_tokens (default 2)
    /// tokens each, timed by their mean TPOT. Every row is run through the
    /// simulator as a user would time it; the `operators` model's compute,
    /// memory and all-reduce scales and per-step and per-sequence overheads
    /// are fitted jointly (rows may mix TP degrees), and the power model
    /// from power_w. Prints each row's measured, default, fitted and
    /// held-out value (leave-one-out; 10-fold above 50 rows) (stderr) and the
    /// TOML to use (stdout, or -o). At most 5,000 rows, each of at most
    /// 4,096 sequences, 2^20 tokens and 2^16 output tokens.
    Calibrate(CalibrateArgs),
    /// Run the shipped measurement sets through the simulator and print the
    /// error of the default and of the calibrated step model on each.
    ///
    /// Sets: aiconfigurator's vLLM H100 predictions (Llama-3.1-8B TP1,
    /// 70B TP4), SplitwiseSim's measured Llama-2-70B on A100 and H100 at TP
    /// 2/4/8 (with board power on A100), Vidur's Llama-2-7B A100 predictions
    /// (priced from Vidur's own profile), and the SC25 prefill measurements
    /// (measurements/README.md names every source).
    Validate,
    /// Convert an Opal JSON configuration into an equivalent TOML scenario.
    ///
    /// Keys are mapped one to one; renamed keys, Opal defaults that differ
    /// from ours and keys with no counterpart are listed in the output's
    /// header comments and on stderr.
    Convert {
        /// The Opal configuration (JSON).
        config: PathBuf,
        /// Where to write the TOML (default: next to the JSON, with a .toml
        /// extension; `-` for stdout).
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Replace an existing output file.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Args, Debug)]
struct ModelArgs {
    /// A preset (e.g. deepseek-v3, meta-llama/Llama-3.1-8B) or a config.json.
    model: String,
    /// A GPU preset (A100-40G, A100-80G, H100, H100-PCIe, H200, B200, MI300X, L40S).
    #[arg(long)]
    gpu: Option<String>,
    /// GPUs per worker (tensor parallelism).
    #[arg(long, default_value_t = 1)]
    tp: u32,
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

#[derive(Args, Debug)]
struct CalibrateArgs {
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

#[derive(Args, Debug)]
struct RunArgs {
    /// The spec to run: TOML, or an Opal JSON configuration (imported unchanged).
    #[arg(required = true)]
    spec: Option<PathBuf>,
    /// Output directory (default: [sweep] output, else results/<name>/).
    #[arg(short, long, value_name = "DIR")]
    output: Option<PathBuf>,
    /// Runs in parallel (default and 0: all cores; never more than the runs
    /// to do nor 32 per core; above 4 × cores a warning, as runs then only compete).
    #[arg(short, long, value_name = "N")]
    jobs: Option<usize>,
    /// Run only shard i of N (runs with id % N == i); defaults from
    /// SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT. Merge with `opal-sweep merge`.
    #[arg(long, value_name = "i/N")]
    shard: Option<String>,
    /// Skip runs already in the output directory.
    #[arg(long)]
    resume: bool,
    /// Delete earlier results in the output directory first.
    #[arg(long, conflicts_with = "resume")]
    overwrite: bool,
    /// List the expanded runs (id, point, replicate, seed, overrides) and exit.
    #[arg(long)]
    dry_run: bool,
    /// No progress output.
    #[arg(short, long)]
    quiet: bool,
}

#[derive(Args, Debug)]
struct SlurmArgs {
    /// The spec to run.
    spec: PathBuf,
    /// Array tasks, at least 1 (default: the number of runs, at most 32;
    /// more tasks than runs are cut to the number of runs).
    #[arg(value_parser = clap::value_parser!(u32).range(1..), long)]
    tasks: Option<u32>,
    /// CPUs per task (each task runs its share of runs in parallel), at least 1.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    cpus_per_task: u32,
    /// Time limit per task (Slurm format, e.g. 01:00:00).
    #[arg(long)]
    time: Option<String>,
    /// Partition.
    #[arg(long)]
    partition: Option<String>,
    /// Output directory (default: as for a run).
    #[arg(short, long, value_name = "DIR")]
    output: Option<PathBuf>,
}

enum Failure {
    Input(String),
    Run(String),
}

impl From<opal::sweep::runner::SweepError> for Failure {
    /// An output directory that holds other results (another spec, a busy
    /// lock, results without `--overwrite`) is the user's to fix: exit 2,
    /// like any bad input; everything else happened while running.
    fn from(e: opal::sweep::runner::SweepError) -> Failure {
        match e {
            opal::sweep::runner::SweepError::Directory(_) => Failure::Input(e.to_string()),
            e => Failure::Run(e.to_string()),
        }
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Run(args)) => run(&args),
        Some(Command::Merge { dir }) => merge(&dir),
        Some(Command::Slurm(args)) => slurm(&args),
        Some(Command::Convert { config, output, force }) => convert(&config, output.as_deref(), force),
        Some(Command::Report { dir, output, png }) => report(&dir, output.as_deref(), png),
        Some(Command::Timeline { dir, run, output, max_steps }) => timeline(&dir, run, output.as_deref(), max_steps),
        Some(Command::Model(args)) => model(&args),
        Some(Command::Config { spec, point, defaults }) => config(spec.as_deref(), point, defaults),
        Some(Command::Presets) => presets(),
        Some(Command::Calibrate(args)) => calibrate(&args),
        Some(Command::Validate) => validate(),
        None => run(&cli.run),
    };
    match result {
        Ok(code) => code,
        Err(Failure::Input(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(2)
        }
        Err(Failure::Run(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(1)
        }
    }
}

/// Writes to stdout, ignoring a closed pipe (`| head`).
fn out(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

/// Loads and expands a spec. If no point can run, that is an input error
/// (for a spec without axes: its one scenario is invalid).
fn load_plan(spec: &std::path::Path) -> Result<SweepPlan, Failure> {
    let spec = opal::config::load_spec(spec).map_err(|e| Failure::Input(e.to_string()))?;
    let plan = plan(&spec).map_err(|e| Failure::Input(e.to_string()))?;
    for n in &plan.notes {
        eprintln!("warning: {n}");
    }
    if let Some(Err(e)) = plan.points.iter().all(|p| p.scenario.is_err()).then(|| plan.points[0].scenario.clone()) {
        let also = match plan.points.len() {
            1 => String::new(),
            n => format!("\n(and every other of the {n} grid points is invalid too)"),
        };
        return Err(Failure::Input(format!("{e}{also}")));
    }
    Ok(plan)
}

fn run(args: &RunArgs) -> Result<ExitCode, Failure> {
    let spec_path = args.spec.as_ref().expect("clap requires the spec");
    let plan = load_plan(spec_path)?;
    if args.dry_run {
        let spec = opal::config::load_spec(spec_path).map_err(|e| Failure::Input(e.to_string()))?;
        if let Some(s) = opal::sweep::search::search_spec(&spec).map_err(|e| Failure::Input(e.to_string()))? {
            out(&format!(
                "a search: per grid point below, the {} {} in [{}, {}] meeting {}; its probes ({} to {} run(s) each, the seeds below on) are chosen as it runs\n",
                if s.maximize { "largest" } else { "smallest" },
                s.parameter,
                s.min,
                s.max,
                s.slo.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                s.replicates,
                s.max_replicates
            ));
        }
        if let Some(s) = opal::sweep::pareto::pareto_spec(&spec).map_err(|e| Failure::Input(e.to_string()))? {
            out(&format!(
                "a Pareto search: per grid point below, the frontier of {} over {} lattice points of {}{}; at most {} are evaluated ({} run(s) each), chosen as it runs\n",
                s.objectives.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                s.lattice_size(),
                s.parameters.iter().map(|(p, _, _)| p.as_str()).collect::<Vec<_>>().join(" × "),
                if s.slo.is_empty() {
                    String::new()
                } else {
                    format!(" meeting {}", s.slo.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))
                },
                s.max_points,
                plan.replicates
            ));
        }
        out(&opal::report::text::dry_run(&plan));
        return Ok(ExitCode::SUCCESS);
    }
    let shard = match (&args.shard, Shard::from_slurm_env()) {
        (Some(s), _) => Some(Shard::parse(s).map_err(|e| Failure::Input(e.0))?),
        (None, Some(env)) => Some(env.map_err(|e| Failure::Input(e.0))?),
        (None, None) => None,
    };
    let output = args.output.clone().unwrap_or_else(|| plan.default_output.clone());
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    if let Some(j) = args.jobs.filter(|&j| j > 4 * cores) {
        eprintln!(
            "warning: -j {j} is more than 4 × the {cores} cores here; runs share the cores, so more threads only add overhead (at most one thread per run to do, and 32 per core, are started)"
        );
    }
    let opts = RunnerOptions {
        output: output.clone(),
        jobs: args.jobs,
        shard,
        resume: args.resume,
        overwrite: args.overwrite,
        progress: !args.quiet,
    };
    let _lock = opal::sweep::lock::DirLock::acquire(&output, shard, opal::sweep::lock::Purpose::Run)
        .map_err(|e| Failure::Input(e.to_string()))?;
    let _ = ctrlc::set_handler(|| {
        if STOP.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!(
            "stopping: runs in flight stop within a second and are recorded as interrupted; finished runs are saved (Ctrl-C again to abort)"
        );
    });
    let started = std::time::Instant::now();
    let spec = opal::config::load_spec(spec_path).map_err(|e| Failure::Input(e.to_string()))?;
    if args.resume && spec.file.search.is_some() && Shard::from_slurm_env().is_none() {
        // A Slurm array task always passes --resume; by hand it is a request this cannot honour.
        eprintln!(
            "warning: a search cannot resume (each probe depends on the results before it): it starts over in {}",
            output.display()
        );
    }
    if let Some(pareto) = opal::sweep::pareto::pareto_spec(&spec).map_err(|e| Failure::Input(e.to_string()))? {
        let report = opal::sweep::pareto::run_pareto(&spec, &plan, &pareto, &opts, &STOP)?;
        if !args.quiet {
            out(&opal::report::text::pareto_table(&report));
        }
        let place = if report.runs.merged.is_some() {
            format!("results: {}", output.display())
        } else {
            format!("parts in {} (opal-sweep merge when every shard is done)", output.display())
        };
        let evaluated: usize = report.points.iter().map(|(_, _, p)| p.evaluated.len()).sum();
        out(&format!(
            "{evaluated} of {} lattice points evaluated ({} runs, {} failed) in {:.2} s\n{place}\n",
            pareto.lattice_size() * report.points.len(),
            report.runs.executed,
            report.runs.failures.len(),
            started.elapsed().as_secs_f64()
        ));
        if plan.report && report.runs.merged.is_some() {
            auto_report(&output);
        }
        return Ok(if STOP.load(Ordering::SeqCst) { ExitCode::from(1) } else { ExitCode::SUCCESS });
    }
    if let Some(search) = opal::sweep::search::search_spec(&spec).map_err(|e| Failure::Input(e.to_string()))? {
        let report = opal::sweep::search::run_search(&spec, &plan, &search, &opts, &STOP)?;
        if !args.quiet {
            out(&opal::report::text::search_table(&report));
        }
        let place = if report.runs.merged.is_some() {
            format!("results: {}", output.display())
        } else {
            format!("parts in {} (opal-sweep merge when every shard is done)", output.display())
        };
        out(&format!(
            "{} probes ({} runs, {} failed) in {:.2} s\n{place}\n",
            report.probes(),
            report.runs.executed,
            report.runs.failures.len(),
            started.elapsed().as_secs_f64()
        ));
        if plan.report && report.runs.merged.is_some() {
            auto_report(&output);
        }
        return Ok(if STOP.load(Ordering::SeqCst) { ExitCode::from(1) } else { ExitCode::SUCCESS });
    }
    let report = run_sweep(&plan, &opts, &STOP)?;
    let wall = started.elapsed().as_secs_f64();
    if !report.dropped.is_empty() {
        eprintln!(
            "warning: the spec changed: kept the {} earlier runs it still holds, dropped {} it no longer does:",
            report.skipped,
            report.dropped.len()
        );
        for d in report.dropped.iter().take(10) {
            eprintln!("  {d}");
        }
        if report.dropped.len() > 10 {
            eprintln!("  … and {} more", report.dropped.len() - 10);
        }
    }
    out(&summarize(&plan, &report, &output, wall, args.quiet));
    if args.quiet {
        // Without -q the progress display has already said why each run failed.
        for (id, msg) in report.failures.iter().take(10) {
            eprintln!("run {id} failed: {msg}");
        }
        if report.failures.len() > 10 {
            eprintln!("… and {} more failed runs (see the error column of runs.parquet)", report.failures.len() - 10);
        }
    }
    if plan.report && report.merged.is_some() && report.executed > 0 {
        auto_report(&output);
    }
    if report.interrupted {
        return Err(Failure::Run(format!(
            "interrupted after {} of {} runs ({} stopped in flight, recorded as interrupted); finished runs are saved — rerun with --resume to complete",
            report.executed as usize - report.interrupted_runs.len(),
            report.selected - report.skipped,
            report.interrupted_runs.len()
        )));
    }
    Ok(if report.failures.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn config(spec: Option<&std::path::Path>, point: Option<usize>, defaults: bool) -> Result<ExitCode, Failure> {
    let text = match spec.filter(|_| !defaults) {
        Some(path) => {
            let spec = opal::config::load_spec(path).map_err(|e| Failure::Input(e.to_string()))?;
            opal::sweep::effective_config(&spec, point)
        }
        None => opal::sweep::default_config(),
    };
    out(&text.map_err(|e| Failure::Input(e.located().to_string()))?);
    Ok(ExitCode::SUCCESS)
}

fn timeline(
    dir: &std::path::Path,
    run: Option<u32>,
    output: Option<&std::path::Path>,
    max_steps: usize,
) -> Result<ExitCode, Failure> {
    let t = opal::report::timeline::write_timeline(dir, run, output, max_steps).map_err(|e| match e {
        opal::report::ReportError::Input(m) => Failure::Input(m),
        opal::report::ReportError::Output(m) => Failure::Run(m),
    })?;
    let cut = if t.steps < t.total_steps {
        format!(" (the first {} of {}: --max-steps)", t.steps, t.total_steps)
    } else {
        String::new()
    };
    out(&format!(
        "timeline: {} (run {}, {} steps{cut} on {} worker{}, {} events; open in ui.perfetto.dev)
",
        t.path.display(),
        t.run_id,
        t.steps,
        t.workers,
        if t.workers == 1 { "" } else { "s" },
        t.events
    ));
    Ok(ExitCode::SUCCESS)
}

fn presets() -> Result<ExitCode, Failure> {
    out(&opal::report::text::presets_table());
    Ok(ExitCode::SUCCESS)
}

fn report(dir: &std::path::Path, output: Option<&std::path::Path>, png: bool) -> Result<ExitCode, Failure> {
    if png && !opal::report::figures::PNG_SUPPORTED {
        return Err(Failure::Input(opal::report::figures::NO_PNG.into()));
    }
    let target = output.map_or_else(|| opal::report::default_dir(dir), std::path::Path::to_path_buf);
    let started = std::time::Instant::now();
    let r = opal::report::write_report(dir, &target, png).map_err(|e| match e {
        opal::report::ReportError::Input(m) => Failure::Input(m),
        opal::report::ReportError::Output(m) => Failure::Run(m),
    })?;
    out(&report_line(&r, started.elapsed().as_secs_f64()));
    Ok(ExitCode::SUCCESS)
}

/// The report a spec asked for with `[sweep] report = true` (SVG figures:
/// `opal-sweep report --png` adds PNGs); a failure only warns (the results
/// themselves are complete).
fn auto_report(dir: &std::path::Path) {
    let started = std::time::Instant::now();
    match opal::report::write_report(dir, &opal::report::default_dir(dir), false) {
        Ok(r) => out(&report_line(&r, started.elapsed().as_secs_f64())),
        Err(e) => eprintln!("warning: the report could not be made: {e}"),
    }
}

fn report_line(r: &opal::report::ReportSummary, wall: f64) -> String {
    let mut text = format!(
        "report: {} ({} figures from {} runs{}, {wall:.2} s)\n",
        r.index.display(),
        r.figures,
        r.runs,
        if r.failed > 0 { format!("; {} failed runs left out", r.failed) } else { String::new() }
    );
    for s in &r.skipped {
        text.push_str(&format!("  {s}\n"));
    }
    text
}

fn convert(config: &std::path::Path, output: Option<&std::path::Path>, force: bool) -> Result<ExitCode, Failure> {
    let text = std::fs::read_to_string(config)
        .map_err(|e| Failure::Input(format!("{}: cannot read the configuration: {e}", config.display())))?;
    let (spec, imported) =
        opal::config::Spec::from_opal_json(&text, config).map_err(|e| Failure::Input(e.to_string()))?;
    for n in &spec.notes {
        eprintln!("warning: {n}");
    }
    let target = output.map_or_else(|| config.with_extension("toml"), std::path::Path::to_path_buf);
    if target.as_os_str() == "-" {
        out(&opal::config::opal_json::to_toml(&imported, config, spec.base_dir()));
        return Ok(ExitCode::SUCCESS);
    }
    if target.exists() && !force {
        return Err(Failure::Input(format!("{} exists; pass --force to replace it", target.display())));
    }
    let dir = target.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let toml = opal::config::opal_json::to_toml(&imported, config, dir);
    std::fs::write(&target, toml).map_err(|e| Failure::Run(format!("{}: cannot write: {e}", target.display())))?;
    eprintln!("wrote {}", target.display());
    Ok(ExitCode::SUCCESS)
}

/// What a finished sweep prints: the summary (a run's numbers or one line
/// per point), what a changed spec kept and dropped, the counts and where
/// the results are. With `quiet`, only the last line, counts included.
fn summarize(plan: &SweepPlan, report: &SweepReport, output: &std::path::Path, wall: f64, quiet: bool) -> String {
    let mut text = String::new();
    if quiet {
        // Only the closing line below.
    } else if plan.total_runs() == 1
        && let Some((summary, sc25, stages)) = &report.first
    {
        text.push_str(&format!("{} — seed {}\n", plan.name, plan.base_seed));
        text.push_str(&opal::report::text::summary_table(summary));
        if stages.len() > 1 {
            text.push_str(&opal::report::text::stage_table(stages));
        }
        if !sc25.is_empty() {
            text.push_str(&opal::report::text::sc25_table(sc25));
        }
    } else if report.executed > 0 {
        let width = terminal_size::terminal_size().map_or(120, |(w, _)| usize::from(w.0)).max(60);
        text.push_str(&opal::report::text::sweep_table(plan, &report.points, width));
    }
    if report.executed == 0 && report.skipped == report.selected && report.selected > 0 {
        text.push_str(&format!(
            "all {} runs are already in {} — nothing to do (--overwrite runs them again)\n",
            report.selected,
            output.display()
        ));
        return text;
    }
    let ok = report.executed as usize - report.failures.len() - report.interrupted_runs.len();
    let place = match &report.merged {
        Some(_) => format!("results: {}", output.display()),
        None => {
            format!("parts: {} (merge with: opal-sweep merge {})", output.join("parts").display(), output.display())
        }
    };
    if quiet {
        text.push_str(&place);
        text.push_str(" — ");
    }
    let runs = |n: usize| if n == 1 { "1 run".to_string() } else { format!("{n} runs") };
    text.push_str(&format!(
        "{} ok, {} failed, {}{} skipped (already done) of {} in {wall:.2} s",
        runs(ok),
        report.failures.len(),
        match report.interrupted_runs.len() {
            0 => String::new(),
            n => format!("{n} interrupted, "),
        },
        report.skipped,
        report.selected
    ));
    if report.selected < report.total {
        text.push_str(&format!(" (this shard; {} runs in the sweep)", report.total));
    }
    text.push('\n');
    if !quiet {
        text.push_str(&place);
        text.push('\n');
    }
    text
}

fn merge(dir: &std::path::Path) -> Result<ExitCode, Failure> {
    if !dir.is_dir() {
        return Err(Failure::Input(format!(
            "{}: no such directory\n  fix: give the output directory of a sharded sweep",
            dir.display()
        )));
    }
    let _lock = opal::sweep::lock::DirLock::acquire(dir, None, opal::sweep::lock::Purpose::Merge)
        .map_err(|e| Failure::Input(e.to_string()))?;
    // A gap (shards not yet run) is incomplete results, like a failed run: exit 1.
    let report = merge_dir(dir).map_err(|e| Failure::Run(e.to_string()))?;
    out(&format!("merged {} parts: {} runs in {}\n", report.parts, report.runs, dir.display()));
    if opal::sweep::runner::report_requested(dir) {
        auto_report(dir);
    }
    Ok(ExitCode::SUCCESS)
}

/// Refuses what would not survive an `#SBATCH` line: sbatch reads each
/// directive as one line split at whitespace, so a newline in a value would
/// start a shell line of the script and a space would split the option.
fn sbatch_value(flag: &str, value: &str, ok: impl Fn(char) -> bool, what: &str) -> Result<(), Failure> {
    if !value.is_empty() && value.chars().all(ok) {
        return Ok(());
    }
    Err(Failure::Input(format!("{flag} {value:?}: not a valid value for an #SBATCH line\n  fix: {what}")))
}

/// Slurm's time formats: `minutes`, `minutes:seconds`, `hours:minutes:seconds`,
/// `days-hours`, `days-hours:minutes`, `days-hours:minutes:seconds`, or
/// `UNLIMITED`/`INFINITE` (`sbatch --time`).
fn slurm_time(t: &str) -> bool {
    if t.eq_ignore_ascii_case("unlimited") || t.eq_ignore_ascii_case("infinite") {
        return true;
    }
    let num = |x: &str| !x.is_empty() && x.len() <= 9 && x.bytes().all(|b| b.is_ascii_digit());
    let (days, rest) = match t.split_once('-') {
        Some((d, r)) => (Some(d), r),
        None => (None, t),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    days.is_none_or(num) && parts.iter().all(|p| num(p)) && (1..=3).contains(&parts.len())
}

fn slurm(args: &SlurmArgs) -> Result<ExitCode, Failure> {
    if let Some(p) = &args.partition {
        let name = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ',');
        sbatch_value("--partition", p, name, "a partition name (letters, digits, _ - ., commas between several)")?;
    }
    if let Some(t) = &args.time {
        let fix = "Slurm's format: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]], or UNLIMITED (e.g. 01:00:00)";
        sbatch_value("--time", t, |c| c.is_ascii_alphanumeric() || matches!(c, ':' | '-'), fix)?;
        if !slurm_time(t) {
            return Err(Failure::Input(format!("--time {t:?}: not a Slurm time limit\n  fix: {fix}")));
        }
    }
    let plan = load_plan(&args.spec)?;
    let abs = |p: &std::path::Path| std::path::absolute(p).map_err(|e| Failure::Input(format!("{}: {e}", p.display())));
    let spec = abs(&args.spec)?;
    let output = abs(&args.output.clone().unwrap_or_else(|| plan.default_output.clone()))?;
    let shown = output.display().to_string();
    sbatch_value(
        "-o",
        &shown,
        |c| !c.is_whitespace() && !c.is_control(),
        "an output directory whose path has no spaces or line breaks (the task logs' #SBATCH --output line cannot quote it)",
    )?;
    // Slurm opens the task logs (in the output directory) before the script runs.
    std::fs::create_dir_all(&output).map_err(|e| Failure::Run(format!("{}: cannot create: {e}", output.display())))?;
    let exe = std::env::current_exe().map_err(|e| Failure::Run(format!("cannot locate opal-sweep: {e}")))?;
    let runs = plan.total_runs().max(1);
    if let Some(t) = args.tasks.filter(|&t| t > runs) {
        eprintln!("warning: --tasks {t} is more than the {runs} runs; the array has {runs} tasks");
    }
    let tasks = args.tasks.unwrap_or_else(|| runs.min(32)).clamp(1, runs);
    out(&opal::report::text::slurm_script(&opal::report::text::SlurmJob {
        name: &plan.name,
        exe: &exe,
        spec: &spec,
        output: &output,
        tasks,
        cpus_per_task: args.cpus_per_task,
        time: args.time.as_deref(),
        partition: args.partition.as_deref(),
        workdir: &abs(std::path::Path::new("."))?,
    }));
    Ok(ExitCode::SUCCESS)
}

/// A model named on the command line: a preset, or a config.json.
fn load_model(name: &str) -> Result<opal::worker::model::ModelArch, Failure> {
    use opal::worker::model::ModelArch;
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
fn load_gpu(name: &str) -> Result<opal::worker::presets::GpuSpec, Failure> {
    use opal::worker::presets::GpuSpec;
    GpuSpec::preset(name)
        .ok_or_else(|| Failure::Input(format!("unknown GPU {name:?}\n  fix: use a preset: {}", GpuSpec::preset_list())))
}

fn model(args: &ModelArgs) -> Result<ExitCode, Failure> {
    use opal::worker::model::ModelReport;
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
    let gpu = args.gpu.as_deref().map(load_gpu).transpose()?;
    let fit = gpu
        .as_ref()
        .map(|g| (g.name.as_str(), g.memory_gb, args.tp, args.gpu_memory_utilization, args.block_size, args.context));
    let report = ModelReport::new(&model, fit);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report).expect("a report serializes"));
    } else {
        print!("{}", opal::report::text::model_text(&report));
    }
    Ok(ExitCode::SUCCESS)
}

fn calibrate(args: &CalibrateArgs) -> Result<ExitCode, Failure> {
    use opal::calibrate::{FitOptions, ModelRef, ProfileChoice, Setup};
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
        opal::worker::perf::read_measured(path).map_err(|e| Failure::Input(format!("{e}{CSV_FIX}")))
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
    let setup = Setup { model, gpu: gpu.name.clone(), tp: args.tp, profile };
    let file = args.measurements.display().to_string();
    let fit = opal::calibrate::calibrate(&setup, &rows, &opts)
        .map_err(|e| Failure::Input(format!("{file}: {e}{CSV_FIX}")))?;
    eprint!("{}", opal::report::text::calibration_table(&fit));
    if let (Some(path), Some(other)) = (&args.predict, other) {
        let (predicted, warnings) = opal::calibrate::fit::predict(&setup, fit.constants, &rows, &other)
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
                100.0 * opal::calibrate::fit::residual(*s, r.latency_s)
            );
        }
        if let Some((median, max)) = opal::calibrate::fit::median_max(
            predicted.iter().map(|(r, _, s)| opal::calibrate::fit::residual(*s, r.latency_s)),
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

fn validate() -> Result<ExitCode, Failure> {
    let mut reports = Vec::new();
    for set in opal::calibrate::sets::sets() {
        eprintln!("{} ({}): {}", set.name, set.file, set.source);
        reports.push(set.validate().map_err(Failure::Run)?);
    }
    out(&opal::calibrate::sets::table(&reports));
    Ok(ExitCode::SUCCESS)
}
