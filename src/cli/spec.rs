//! Commands on a spec that do not run it: the effective configuration,
//! an Opal JSON conversion, a Slurm script.

use super::{Failure, out};
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

/// `opal-sweep slurm`.
#[derive(Args, Debug)]
pub struct SlurmArgs {
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

pub(super) fn config(
    spec: Option<&std::path::Path>,
    point: Option<usize>,
    defaults: bool,
) -> Result<ExitCode, Failure> {
    let text = match spec.filter(|_| !defaults) {
        Some(path) => {
            let spec = crate::config::load_spec(path).map_err(|e| Failure::Input(e.to_string()))?;
            crate::sweep::effective_config(&spec, point)
        }
        None => crate::sweep::default_config(),
    };
    out(&text.map_err(|e| Failure::Input(e.located().to_string()))?);
    Ok(ExitCode::SUCCESS)
}

pub(super) fn convert(
    config: &std::path::Path,
    output: Option<&std::path::Path>,
    force: bool,
) -> Result<ExitCode, Failure> {
    let text = std::fs::read_to_string(config)
        .map_err(|e| Failure::Input(format!("{}: cannot read the configuration: {e}", config.display())))?;
    let (spec, imported) =
        crate::config::Spec::from_opal_json(&text, config).map_err(|e| Failure::Input(e.to_string()))?;
    for n in &spec.notes {
        eprintln!("warning: {n}");
    }
    let target = output.map_or_else(|| config.with_extension("toml"), std::path::Path::to_path_buf);
    if target.as_os_str() == "-" {
        out(&crate::config::opal_json::to_toml(&imported, config, spec.base_dir()));
        return Ok(ExitCode::SUCCESS);
    }
    if target.exists() && !force {
        return Err(Failure::Input(format!("{} exists; pass --force to replace it", target.display())));
    }
    let dir = target.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let toml = crate::config::opal_json::to_toml(&imported, config, dir);
    std::fs::write(&target, toml).map_err(|e| Failure::Run(format!("{}: cannot write: {e}", target.display())))?;
    eprintln!("wrote {}", target.display());
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

pub(super) fn slurm(args: &SlurmArgs) -> Result<ExitCode, Failure> {
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
    let (_, plan) = super::run::load_plan(&args.spec)?;
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
    out(&crate::report::text::slurm_script(&crate::report::text::SlurmJob {
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
