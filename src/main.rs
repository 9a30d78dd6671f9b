//! `opal-sweep`: the command-line front end. It parses flags, calls the
//! library and maps errors to exit codes; everything else lives in `opal`.

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

/// Simulate an LLM inference platform (router + vLLM-like workers) for the
/// scenario described in a TOML spec and report latency percentiles,
/// throughput and utilisation.
///
/// A spec holds the scenario sections ([simulation], [model.model_params],
/// [router.router_params], [[workload.stages]], [worker.*]) and an optional
/// [sweep] table (name, output). Results are written to results/<name>/
/// (or --output) and a summary table is printed.
///
/// Exit codes: 0 success, 1 a run failed, 2 invalid input (the message names
/// the file, line, key and fix).
#[derive(Parser, Debug)]
#[command(name = "opal-sweep", version, about, long_about, after_help = "Example: opal-sweep sweeps/quickstart.toml")]
struct Cli {
    /// The spec to run (TOML).
    spec: PathBuf,
    /// Output directory (default: results/<spec name>/).
    #[arg(short, long, value_name = "DIR")]
    output: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
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

enum Failure {
    Input(String),
    Run(String),
}

fn run(cli: &Cli) -> Result<(), Failure> {
    let spec = opal::config::load_spec(&cli.spec).map_err(|e| Failure::Input(e.to_string()))?;
    let scenario = spec.scenario().map_err(|e| Failure::Input(e.to_string()))?;
    let out_dir = cli.output.clone().unwrap_or_else(|| {
        spec.file.sweep.output.as_ref().map_or_else(|| PathBuf::from("results").join(spec.name()), PathBuf::from)
    });
    let started = std::time::Instant::now();
    let output = opal::simulate(&scenario);
    let wall = started.elapsed().as_secs_f64();
    std::fs::create_dir_all(&out_dir).map_err(|e| Failure::Run(format!("cannot create {}: {e}", out_dir.display())))?;
    let path = out_dir.join("summary.json");
    let json = serde_json::to_string_pretty(&output.summary).map_err(|e| Failure::Run(e.to_string()))?;
    std::fs::write(&path, json).map_err(|e| Failure::Run(format!("cannot write {}: {e}", path.display())))?;
    let text = format!(
        "{} — seed {}, {} × {} on {} × {}\n{}wall time {wall:.3} s\nresults: {}\n",
        spec.name(),
        scenario.seed,
        scenario.num_workers,
        scenario.model.name,
        scenario.tp,
        scenario.gpu.name,
        opal::report::summary_table(&output.summary),
        out_dir.display()
    );
    // A closed pipe (`| head`) is not an error worth a panic.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    Ok(())
}
