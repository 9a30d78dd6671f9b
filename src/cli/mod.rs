//! The `opal-sweep` commands: clap's argument types and one function per
//! command, each handing parsed arguments to the library. The binary
//! (`src/main.rs`) only parses the command line and maps a [`Failure`] to
//! its exit code.

mod models;
mod results;
mod run;
mod spec;

use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

pub use models::{CalibrateArgs, ModelArgs};
pub use results::{CompareArgs, VllmResultArgs};
pub use run::RunArgs;
pub use spec::SlurmArgs;

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
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a spec (the default when no subcommand is given).
    Run(RunArgs),
    /// Merge the part files of a sharded sweep into its tables.
    Merge {
        /// The sweep's output directory.
        dir: PathBuf,
    },
    /// Print an sbatch script that runs a spec as a Slurm job array.
    Slurm(SlurmArgs),
    /// Draw a sweep's results as an HTML page with SVG figures (and PNGs, in a build with `--features png`).
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
        #[arg(long, value_name = "N", default_value_t = crate::report::timeline::DEFAULT_MAX_STEPS)]
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
    /// Write runs' results as `vllm bench serve --save-result` files.
    ///
    /// One JSON file per ok run (or the run of --run), with vLLM's field
    /// names: duration, completed, failed, total_input_tokens,
    /// total_output_tokens, request_throughput, output_throughput,
    /// total_token_throughput, and mean/median/std/p<P> of each metric
    /// (e.g. p99_ttft_ms) — from the runs table and the HDR histograms.
    VllmResult(VllmResultArgs),
    /// Hold a measured `vllm bench serve` result against a simulated run.
    ///
    /// The measured file is what `vllm bench serve --save-result
    /// --save-detailed` wrote (replay its requests with a `VllmBench`
    /// workload stage). Prints each field measured, simulated and the error
    /// (100 × (simulated − measured) / measured), fields the file does not
    /// record computed from its per-request detail as vLLM computes them,
    /// and writes the comparison as a Parquet table.
    Compare(CompareArgs),
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

/// Why a command failed, which decides the exit code.
#[derive(Debug)]
pub enum Failure {
    /// The user's input is wrong (exit 2): the message names the file, line, key and fix.
    Input(String),
    /// Something failed while running (exit 1).
    Run(String),
}

impl Failure {
    /// Prints the message and gives the exit code.
    pub fn exit(self) -> ExitCode {
        let (msg, code) = match self {
            Failure::Input(m) => (m, 2),
            Failure::Run(m) => (m, 1),
        };
        eprintln!("error: {msg}");
        ExitCode::from(code)
    }
}

impl From<crate::sweep::runner::SweepError> for Failure {
    /// An output directory that holds other results (another spec, a busy
    /// lock, results without `--overwrite`) is the user's to fix: exit 2,
    /// like any bad input; everything else happened while running.
    fn from(e: crate::sweep::runner::SweepError) -> Failure {
        match e {
            crate::sweep::runner::SweepError::Directory(_) => Failure::Input(e.to_string()),
            e => Failure::Run(e.to_string()),
        }
    }
}

/// Set by Ctrl-C (SIGINT/SIGTERM): runs in flight stop and are recorded as interrupted.
static STOP: AtomicBool = AtomicBool::new(false);

/// Runs the command `cli` names.
pub fn execute(cli: Cli) -> Result<ExitCode, Failure> {
    match cli.command {
        Some(Command::Run(args)) => run::run(&args),
        Some(Command::Merge { dir }) => results::merge(&dir),
        Some(Command::Slurm(args)) => spec::slurm(&args),
        Some(Command::Convert { config, output, force }) => spec::convert(&config, output.as_deref(), force),
        Some(Command::Report { dir, output, png }) => results::report(&dir, output.as_deref(), png),
        Some(Command::Timeline { dir, run, output, max_steps }) => {
            results::timeline(&dir, run, output.as_deref(), max_steps)
        }
        Some(Command::Model(args)) => models::model(&args),
        Some(Command::Config { spec, point, defaults }) => spec::config(spec.as_deref(), point, defaults),
        Some(Command::Presets) => models::presets(),
        Some(Command::Calibrate(args)) => models::calibrate(&args),
        Some(Command::Validate) => models::validate(),
        Some(Command::VllmResult(args)) => results::vllm_result(&args),
        Some(Command::Compare(args)) => results::compare(&args),
        None => run::run(&cli.run),
    }
}

/// Writes to stdout, ignoring a closed pipe (`| head`).
pub(crate) fn out(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}
