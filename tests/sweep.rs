//! Sweeps end to end: Parquet tables, parallel and sharded determinism,
//! resume, failures, Slurm.

use crate::temp_dir;
use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Reads a whole table into one batch.
pub fn read(path: &Path) -> RecordBatch {
    let batches = opal::output::read_table(path).unwrap_or_else(|e| panic!("{e}"));
    let schema = batches[0].schema();
    arrow_select::concat::concat_batches(&schema, &batches).unwrap()
}

/// A table without its wall-clock column (the only one that may differ between equal sweeps).
fn content(path: &Path) -> RecordBatch {
    let b = read(path);
    match b.schema().index_of("wall_s") {
        Ok(i) => {
            let mut b = b;
            b.remove_column(i);
            b
        }
        Err(_) => b,
    }
}

pub fn opal_sweep(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_opal-sweep")).args(args).current_dir(cwd).output().expect("binary runs")
}

/// 3 policies × 2 rates × 2 replicates = 12 small runs; one point cannot run.
const SPEC: &str = r#"
[sweep]
name = "t"
replicates = 2
base_seed = 7
tables = ["runs", "histograms", "timeseries", "workers", "requests", "steps"]

[grid]
"router.router_params.policy" = ["RoundRobin", "Random", "LeastLoaded"]
"workload.stages.0.workload_params.request_rate" = [5.0, 10.0]

[simulation]
num_workers = 2

[model.model_params]
name = "llama-3.1-8b"

[[workload.stages]]
type = "ExponentialReqRate"
[workload.stages.workload_params]
total_requests = 60
prompt_size_min = 100
prompt_size_max = 2000
output_tokens_min = 10
output_tokens_max = 100
"#;

pub fn setup(name: &str, spec: &str) -> PathBuf {
    let dir = temp_dir(name);
    std::fs::write(dir.join("spec.toml"), spec).unwrap();
    dir
}

fn ok(o: &Output) {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

const TABLES: [&str; 6] = ["runs", "histograms", "timeseries", "workers", "requests", "steps"];

fn assert_same_tables(a: &Path, b: &Path) {
    for t in TABLES {
        let (x, y) = (content(&a.join(format!("{t}.parquet"))), content(&b.join(format!("{t}.parquet"))));
        assert_eq!(x.num_rows(), y.num_rows(), "{t}: row counts differ");
        assert_eq!(x, y, "{t}: contents differ");
    }
}

#[test]
fn parquet_tables_have_the_expected_rows_columns_and_types() {
    let dir = setup("tables", SPEC);
    ok(&opal_sweep(&["spec.toml", "-o", "out", "-q"], &dir));
    let out = dir.join("out");
    let runs = read(&out.join("runs.parquet"));
    assert_eq!(runs.num_rows(), 12);
    let schema = runs.schema();
    use arrow_schema::DataType as D;
    for (name, ty) in [
        ("run_id", D::UInt32),
        ("point_id", D::UInt32),
        ("replicate", D::UInt32),
        ("seed", D::UInt64),
        ("router.router_params.policy", D::Utf8),
        ("workload.stages.0.workload_params.request_rate", D::Float64),
        ("status", D::Utf8),
        ("error", D::Utf8),
        ("wall_s", D::Float64),
        ("events", D::UInt64),
        ("sim_time_s", D::Float64),
        ("ttft_p99_ms", D::Float64),
        ("tpot_p999_ms", D::Float64),
        ("queue_wait_max_ms", D::Float64),
        ("input_tokens_per_s", D::Float64),
        ("gpu_busy_fraction", D::Float64),
        ("gpu_compute_fraction", D::Float64),
        ("gpu_hbm_fraction", D::Float64),
        ("preemptions", D::UInt64),
    ] {
        assert_eq!(
            schema.field_with_name(name).unwrap_or_else(|_| panic!("no column {name}")).data_type(),
            &ty,
            "{name}"
        );
    }
    let ids: Vec<u32> = runs.column(0).as_primitive::<arrow_array::types::UInt32Type>().values().to_vec();
    assert_eq!(ids, (0..12).collect::<Vec<_>>(), "rows sorted by run id");
    let seeds = opal::output::f64_column(&runs, "seed").unwrap();
    assert_eq!(seeds[..4], [Some(7.0), Some(8.0), Some(7.0), Some(8.0)], "seed = base_seed + replicate");
    // Ten histograms per run; 60 requests per run; two workers per run; the time series covers each run.
    assert_eq!(read(&out.join("histograms.parquet")).num_rows(), 12 * 10, "ten latency metrics per run");
    let workers = read(&out.join("workers.parquet"));
    assert_eq!(workers.num_rows(), 12 * 2);
    let routed = opal::output::f64_column(&workers, "requests_routed").unwrap();
    assert_eq!(routed.iter().map(|v| v.unwrap()).sum::<f64>(), 12.0 * 60.0, "every request is routed once");
    assert_eq!(read(&out.join("requests.parquet")).num_rows(), 12 * 60);
    // Every step of every worker: their durations add up to the workers' busy time.
    let steps = read(&out.join("steps.parquet"));
    let busy: f64 = opal::output::f64_column(&workers, "busy_s").unwrap().iter().map(|v| v.unwrap()).sum();
    let durations: f64 = opal::output::f64_column(&steps, "duration_s").unwrap().iter().map(|v| v.unwrap()).sum();
    assert!(steps.num_rows() > 12 * 60 && (busy - durations).abs() < 1e-6 * busy, "{busy} vs {durations}");
    assert!(read(&out.join("timeseries.parquet")).num_rows() >= 12);
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["runs"], 12);
    assert_eq!(manifest["axes"][1], "workload.stages.0.workload_params.request_rate");
    assert!(!out.join("parts").exists(), "parts are merged away");
}

#[test]
fn the_terminal_table_has_units_unique_headers_and_fits_the_width_and_quiet_prints_one_line() {
    let spec = SPEC.replace(
        "\"router.router_params.policy\" = [\"RoundRobin\", \"Random\", \"LeastLoaded\"]",
        "\"model.model_params.name\" = [\"llama-3.1-8b\", \"llama-3.1-70b\"]",
    );
    let dir = setup("table", &spec);
    let o = opal_sweep(&["spec.toml", "-o", "out"], &dir);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    let header = lines[0];
    for h in ["TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "req/s", "busy %", "hit %", "axis values"] {
        assert_eq!(header.matches(h).count(), 1, "{header}");
    }
    assert_eq!(header.matches("point").count(), 1, "one column named point: {header}");
    // Not a terminal: 120 columns.
    assert!(lines.iter().all(|l| l.chars().count() <= 120), "{stdout}");
    // The failed points (llama-3.1-70b does not fit) show one notation for missing numbers.
    let failed: Vec<&&str> = lines.iter().filter(|l| l.contains("0/2")).collect();
    assert_eq!(failed.len(), 2, "{stdout}");
    assert!(failed.iter().all(|l| l.contains('–') && !l.contains("NaN") && !l.contains(" - ")), "{stdout}");

    let quiet = opal_sweep(&["spec.toml", "-o", "out2", "-q"], &dir);
    let stdout = String::from_utf8_lossy(&quiet.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.starts_with("results: out2 — 4 runs ok, 4 failed"), "{stdout}");
}

#[test]
fn histograms_deserialize_and_their_p99_equals_the_runs_table() {
    let dir = setup("hist", SPEC);
    ok(&opal_sweep(&["spec.toml", "-o", "out", "-q"], &dir));
    let runs = read(&dir.join("out/runs.parquet"));
    let p99 = opal::output::f64_column(&runs, "ttft_p99_ms").unwrap();
    let max = opal::output::f64_column(&runs, "ttft_max_ms").unwrap();
    let hist = read(&dir.join("out/histograms.parquet"));
    let run_ids = hist.column(0).as_primitive::<arrow_array::types::UInt32Type>();
    let metrics = hist.column(1).as_string::<i32>();
    let blobs = hist.column(3).as_binary::<i32>();
    let mut checked = 0;
    for i in 0..hist.num_rows() {
        if metrics.value(i) == "ttft" {
            let h = opal::output::deserialize_hdr(blobs.value(i)).unwrap();
            // The histogram's answer, clamped to the exact maximum (a bucket's top can lie above it).
            let run = run_ids.value(i) as usize;
            let from_hist = (h.value_at_quantile(0.99) as f64 / 1e3).min(max[run].unwrap());
            assert_eq!(Some(from_hist), p99[run], "run {run}");
            assert_eq!(h.len(), 60);
            checked += 1;
        }
    }
    assert_eq!(checked, 12);
}

#[test]
fn one_and_two_threads_give_identical_tables() {
    let dir = setup("jobs", SPEC);
    ok(&opal_sweep(&["spec.toml", "-o", "j1", "-j", "1", "-q"], &dir));
    ok(&opal_sweep(&["spec.toml", "-o", "j2", "-j", "2", "-q"], &dir));
    assert_same_tables(&dir.join("j1"), &dir.join("j2"));
}

#[test]
fn two_shards_merged_equal_the_unsharded_sweep() {
    let dir = setup("shards", SPEC);
    ok(&opal_sweep(&["spec.toml", "-o", "whole", "-q"], &dir));
    let s0 = opal_sweep(&["spec.toml", "-o", "sharded", "--shard", "0/2", "-q"], &dir);
    ok(&s0);
    assert!(String::from_utf8_lossy(&s0.stdout).contains("opal-sweep merge"), "a shard says how to merge");
    assert!(!dir.join("sharded/runs.parquet").exists(), "a shard leaves parts only");
    ok(&opal_sweep(&["spec.toml", "-o", "sharded", "--shard", "1/2", "-q"], &dir));
    ok(&opal_sweep(&["merge", "sharded"], &dir));
    assert_same_tables(&dir.join("whole"), &dir.join("sharded"));
    assert!(!dir.join("sharded/parts").exists());
}

#[test]
fn merging_with_a_shard_missing_reports_the_gap() {
    let dir = setup("gap", SPEC);
    ok(&opal_sweep(&["spec.toml", "-o", "out", "--shard", "0/3", "-q"], &dir));
    let o = opal_sweep(&["merge", "out"], &dir);
    assert_eq!(o.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("merged 4 of 12 runs"), "{stderr}");
    // Shard 0 of 3 ran 0, 3, 6 and 9.
    assert!(stderr.contains("missing run ids 1–2, 4–5, 7–8, 10–11 (shards 1/3, 2/3)"), "{stderr}");
}

#[test]
fn resume_after_a_killed_sweep_runs_only_the_missing_runs_and_matches_a_clean_run() {
    // 30 runs of about 0.25 s each (the test build, this machine) on one thread: parts
    // are flushed every second, so the first lands long before the last run ends
    // even on a machine several times faster.
    const RUNS: usize = 30;
    let spec = SPEC
        .replace("replicates = 2", "replicates = 5")
        .replace("total_requests = 60", "total_requests = 6000")
        .replace(
            "tables = [\"runs\", \"histograms\", \"timeseries\", \"requests\"]",
            "tables = [\"runs\", \"histograms\", \"timeseries\", \"requests\"]\n",
        );
    let dir = setup("resume", &spec);
    let mut child = Command::new(env!("CARGO_BIN_EXE_opal-sweep"))
        .args(["spec.toml", "-o", "out", "-j", "1", "-q"])
        .current_dir(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill it (SIGKILL: no chance to clean up) once the first part is on disk.
    let parts = dir.join("out/parts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !std::fs::read_dir(&parts).is_ok_and(|d| {
        d.filter_map(Result::ok).any(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("runs.") && name.ends_with(".parquet")
        })
    }) {
        assert!(std::time::Instant::now() < deadline, "no part appeared");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let layout = opal::output::Layout { dir: dir.join("out") };
    let done = opal::output::completed_runs(&layout).unwrap().len();
    assert!(done > 0 && done < RUNS, "the kill should land mid-sweep ({done} runs done)");

    let again = opal_sweep(&["spec.toml", "-o", "out", "-q"], &dir);
    assert_eq!(
        again.status.code(),
        Some(2),
        "without --resume the existing results are protected (the user's to fix: exit 2)"
    );
    assert!(String::from_utf8_lossy(&again.stderr).contains("--resume"));

    let resumed = opal_sweep(&["spec.toml", "-o", "out", "--resume", "-q"], &dir);
    ok(&resumed);
    let stdout = String::from_utf8_lossy(&resumed.stdout);
    assert!(stdout.contains(&format!("{} runs ok, 0 failed, {done} skipped", RUNS - done)), "{stdout}");
    ok(&opal_sweep(&["spec.toml", "-o", "clean", "-q"], &dir));
    assert_same_tables(&dir.join("out"), &dir.join("clean"));
    assert!(!dir.join("out/parts").exists(), "parts (and the killed run's temporary files) are cleaned up");
}

/// Runs of `dir/out` by their identity: run_key → (status, ttft_p99_ms).
fn by_key(dir: &Path) -> std::collections::BTreeMap<u64, (String, Option<f64>)> {
    let runs = read(&dir.join("runs.parquet"));
    let keys = runs.column_by_name("run_key").unwrap().as_primitive::<arrow_array::types::UInt64Type>().clone();
    let status = runs.column_by_name("status").unwrap().as_string::<i32>().clone();
    let p99 = opal::output::f64_column(&runs, "ttft_p99_ms").unwrap();
    (0..runs.num_rows()).map(|i| (keys.value(i), (status.value(i).to_string(), p99[i]))).collect()
}

#[test]
fn resume_after_adding_a_grid_value_and_a_replicate_runs_only_the_new_runs() {
    let dir = setup("incremental", SPEC);
    ok(&opal_sweep(&["spec.toml", "-o", "out", "-q"], &dir));
    let before = by_key(&dir.join("out"));
    assert_eq!(before.len(), 12);
    // One more rate in the middle of its axis, and a third replicate: run ids move.
    let grown = SPEC
        .replace("request_rate\" = [5.0, 10.0]", "request_rate\" = [5.0, 7.5, 10.0]")
        .replace("replicates = 2", "replicates = 3");
    std::fs::write(dir.join("spec.toml"), &grown).unwrap();
    let plain = opal_sweep(&["spec.toml", "-o", "out", "-q"], &dir);
    assert_eq!(plain.status.code(), Some(2), "without --resume a changed spec is refused (exit 2)");
    assert!(String::from_utf8_lossy(&plain.stderr).contains("--resume"));
    let resumed = opal_sweep(&["spec.toml", "-o", "out", "--resume", "-q"], &dir);
    ok(&resumed);
    let stdout = String::from_utf8_lossy(&resumed.stdout);
    // 3 policies × 3 rates × 3 replicates = 27 runs, 12 of them kept.
    assert!(stdout.contains("15 runs ok, 0 failed, 12 skipped (already done) of 27"), "{stdout}");
    let after = by_key(&dir.join("out"));
    for (k, v) in &before {
        assert_eq!(after.get(k), Some(v), "a kept run is unchanged");
    }
    // Equal, but for wall time, to the new spec run from scratch.
    ok(&opal_sweep(&["spec.toml", "-o", "fresh", "-q"], &dir));
    assert_same_tables(&dir.join("out"), &dir.join("fresh"));
    assert!(!dir.join("out/parts").exists());

    // Dropping a policy drops its runs, and says so.
    let fewer = grown.replace("[\"RoundRobin\", \"Random\", \"LeastLoaded\"]", "[\"RoundRobin\", \"LeastLoaded\"]");
    std::fs::write(dir.join("spec.toml"), &fewer).unwrap();
    let resumed = opal_sweep(&["spec.toml", "-o", "out", "--resume", "-q"], &dir);
    ok(&resumed);
    let stdout = String::from_utf8_lossy(&resumed.stdout);
    assert!(stdout.contains("all 18 runs are already in out"), "{stdout}");
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert!(stderr.contains("dropped 9 it no longer does") && stderr.contains("policy=\"Random\""), "{stderr}");
    ok(&opal_sweep(&["spec.toml", "-o", "fresh2", "-q"], &dir));
    assert_same_tables(&dir.join("out"), &dir.join("fresh2"));
}

#[test]
fn resume_never_deletes_another_study_or_a_study_it_would_keep_nothing_of() {
    let dir = setup("no-silent-deletion", SPEC);
    ok(&opal_sweep(&["spec.toml", "-o", "out", "-q"], &dir));
    let before = by_key(&dir.join("out"));
    // Another study (another name) into the same directory, with --resume: refused, nothing touched.
    std::fs::write(dir.join("other.toml"), SPEC.replace("name = \"t\"", "name = \"other\"")).unwrap();
    let o = opal_sweep(&["other.toml", "-o", "out", "--resume", "-q"], &dir);
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("another study, \"t\"") && err.contains("nothing was changed"), "{err}");
    assert!(err.contains("fix: choose another output with -o"), "the safe fix first: {err}");
    assert_eq!(by_key(&dir.join("out")), before);
    // The same study, changed so that none of its runs remain: refused too.
    let none_kept = SPEC.replace("base_seed = 7", "base_seed = 99");
    std::fs::write(dir.join("spec.toml"), none_kept).unwrap();
    let o = opal_sweep(&["spec.toml", "-o", "out", "--resume", "-q"], &dir);
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("keeps none of them"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(by_key(&dir.join("out")), before);
    // And without --resume, the safe fix comes first.
    let o = opal_sweep(&["spec.toml", "-o", "out", "-q"], &dir);
    assert!(String::from_utf8_lossy(&o.stderr).contains("fix: choose another output with -o, pass --resume"));
}

#[test]
fn a_failing_grid_point_gives_failed_rows_and_the_others_succeed() {
    let spec = SPEC.replace(
        "\"router.router_params.policy\" = [\"RoundRobin\", \"Random\", \"LeastLoaded\"]",
        "\"model.model_params.name\" = [\"llama-3.1-8b\", \"llama-3.1-70b\"]",
    );
    let dir = setup("failing", &spec);
    let o = opal_sweep(&["spec.toml", "-o", "out", "-q"], &dir);
    assert_eq!(o.status.code(), Some(1), "a failed run makes the exit code 1");
    // Why, on standard error, also with -q.
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("failed: ") && stderr.contains("does not fit in GPU memory"), "{stderr}");
    assert!(!String::from_utf8_lossy(&o.stdout).contains("does not fit"), "not on standard output");
    let runs = read(&dir.join("out/runs.parquet"));
    assert_eq!(runs.num_rows(), 8);
    let status = runs.column_by_name("status").unwrap().as_string::<i32>();
    let error = runs.column_by_name("error").unwrap().as_string::<i32>();
    let model = runs.column_by_name("model.model_params.name").unwrap().as_string::<i32>();
    for i in 0..8 {
        if model.value(i) == "llama-3.1-70b" {
            assert_eq!(status.value(i), "failed");
            assert!(error.value(i).contains("does not fit in GPU memory"), "{}", error.value(i));
        } else {
            assert_eq!(status.value(i), "ok");
        }
    }
    assert_eq!(read(&dir.join("out/histograms.parquet")).num_rows(), 4 * 10, "only successful runs have histograms");
}

#[test]
fn a_bad_axis_is_rejected_before_any_run_starts() {
    let spec = SPEC.replace("\"router.router_params.policy\"", "\"router.router_params.polcy\"");
    let dir = setup("badaxis", &spec);
    let o = opal_sweep(&["spec.toml", "-o", "out"], &dir);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("router.router_params.polcy"));
    assert!(!dir.join("out").exists(), "nothing was written");
}

#[test]
fn dry_run_lists_every_run_with_its_seed_and_overrides() {
    let dir = setup("dry", SPEC);
    let o = opal_sweep(&["spec.toml", "--dry-run"], &dir);
    ok(&o);
    let text = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("t: 6 points × 2 replicates = 12 runs (base_seed 7)"), "{text}");
    assert_eq!(lines.len(), 2 + 12);
    let cols: Vec<&str> = lines[2 + 3].split_whitespace().collect();
    assert_eq!(&cols[..4], ["3", "1", "1", "8"], "run 3 = point 1, replicate 1, seed 8");
    assert!(
        lines[2 + 3].contains(
            "router.router_params.policy=\"RoundRobin\", workload.stages.0.workload_params.request_rate=10.0"
        )
    );
    assert!(!dir.join("results").exists(), "a dry run writes nothing");
}

#[test]
fn slurm_refuses_zero_tasks() {
    let dir = setup("slurm-zero", SPEC);
    let o = opal_sweep(&["slurm", "spec.toml", "--tasks", "0"], &dir);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--tasks"), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn slurm_refuses_values_that_would_break_out_of_an_sbatch_line() {
    let dir = setup("slurm-escape", SPEC);
    for args in [
        &["--partition", "x\nrm -rf /tmp/victim"][..],
        &["--partition", "gpu a"],
        &["--time", "banana"],
        &["--time", "1:00\necho pwned"],
        &["--time", "1:2:3:4"],
        &["--cpus-per-task", "0"],
        &["-o", "out dir"],
        &["-o", "out\ndir"],
    ] {
        let o = opal_sweep(&[&["slurm", "spec.toml"][..], args].concat(), &dir);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?}: no script is printed");
        assert!(err.contains(args[0]), "{args:?}: {err}");
    }
    // Slurm's own formats pass.
    for t in ["90", "1:30", "01:00:00", "2-12", "2-12:30", "2-12:30:00", "UNLIMITED"] {
        let o = opal_sweep(&["slurm", "spec.toml", "--time", t, "--partition", "gpu,gpu-long", "-o", "out"], &dir);
        ok(&o);
        assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("#SBATCH --time={t}\n")), "{t}");
    }
}

#[test]
fn the_slurm_subcommand_prints_a_job_array_script() {
    let dir = setup("slurmscript", SPEC);
    let o = opal_sweep(&["slurm", "spec.toml", "--tasks", "3", "-o", "out"], &dir);
    ok(&o);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.starts_with("#!/bin/bash\n"));
    assert!(s.contains("#SBATCH --array=0-2"), "{s}");
    assert!(s.contains("--resume"));
    assert!(s.contains(" merge "));
    assert!(dir.join("out").is_dir(), "the log directory exists before submission");
}

/// Needs a running single-node Slurm (`scripts/slurm-local.sh start`); `.ci/run` runs it.
#[test]
#[ignore = "needs Slurm: run scripts/slurm-local.sh start, then cargo test -- --ignored slurm"]
fn slurm_job_array_of_three_tasks_merges_to_the_local_result() {
    let conf = std::env::var("SLURM_CONF").expect("SLURM_CONF points at the local cluster's slurm.conf");
    assert!(Path::new(&conf).exists());
    let dir = setup("slurm", SPEC);
    ok(&opal_sweep(&["spec.toml", "-o", "local", "-q"], &dir));
    let script = opal_sweep(&["slurm", "spec.toml", "--tasks", "3", "--cpus-per-task", "1", "-o", "array"], &dir);
    ok(&script);
    std::fs::write(dir.join("job.sh"), &script.stdout).unwrap();
    let submit = Command::new("sbatch").args(["--wait", "job.sh"]).current_dir(&dir).output().expect("sbatch runs");
    assert!(submit.status.success(), "sbatch: {}", String::from_utf8_lossy(&submit.stderr));
    // Each task left its shard manifest and parts; no task failed.
    let parts: Vec<String> = std::fs::read_dir(dir.join("array/parts"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for i in 0..3 {
        assert!(
            parts.iter().any(|p| p == &format!("manifest.shard-{i}-of-3.json")),
            "shard {i} manifest missing: {parts:?}"
        );
        assert!(
            parts.iter().any(|p| p.starts_with(&format!("runs.s{i}of3."))),
            "shard {i} wrote no runs part: {parts:?}"
        );
    }
    let logs: Vec<PathBuf> = std::fs::read_dir(dir.join("array"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    assert_eq!(logs.len(), 3, "one log per array task");
    ok(&opal_sweep(&["merge", "array"], &dir));
    assert_same_tables(&dir.join("local"), &dir.join("array"));
    // The node is back to idle (not drained by a failed launch).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let state = Command::new("sinfo").args(["-h", "-N", "-o", "%t"]).output().unwrap();
        let state = String::from_utf8_lossy(&state.stdout).trim().to_string();
        if state == "idle" {
            break;
        }
        assert!(!state.contains("drain"), "node drained: {state}");
        assert!(std::time::Instant::now() < deadline, "node not idle: {state}");
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// Needs a running single-node Slurm, as the test above.
#[test]
#[ignore = "needs Slurm: run scripts/slurm-local.sh start, then cargo test -- --ignored slurm"]
fn slurm_sigterm_to_a_running_array_task_records_the_run_as_interrupted_and_a_resubmission_completes_it() {
    use crate::signals::{LONG, status_column};
    let conf = std::env::var("SLURM_CONF").expect("SLURM_CONF points at the local cluster's slurm.conf");
    assert!(Path::new(&conf).exists());
    let dir = setup("slurm-term", LONG);
    let script = opal_sweep(&["slurm", "spec.toml", "--tasks", "1", "--cpus-per-task", "1", "-o", "array"], &dir);
    ok(&script);
    std::fs::write(dir.join("job.sh"), &script.stdout).unwrap();
    let submit = Command::new("sbatch").args(["--parsable", "job.sh"]).current_dir(&dir).output().unwrap();
    assert!(submit.status.success(), "sbatch: {}", String::from_utf8_lossy(&submit.stderr));
    let job = String::from_utf8_lossy(&submit.stdout).trim().split(';').next().unwrap().to_string();
    // Once the task holds the output directory, send what Slurm sends at the time limit.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !std::fs::read_to_string(dir.join("array/.lock")).is_ok_and(|s| s.contains("running since")) {
        assert!(std::time::Instant::now() < deadline, "the task never started");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    let sent = std::time::Instant::now();
    let cancel = Command::new("scancel").args(["--signal=TERM", "--batch", &job]).output().unwrap();
    assert!(cancel.status.success(), "scancel: {}", String::from_utf8_lossy(&cancel.stderr));
    loop {
        let q = Command::new("squeue").args(["-h", "-j", &job]).output().unwrap();
        if String::from_utf8_lossy(&q.stdout).trim().is_empty() {
            break;
        }
        assert!(sent.elapsed() < std::time::Duration::from_secs(20), "the task outlived SIGTERM");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let log = std::fs::read_dir(dir.join("array"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "log"))
        .expect("the task's log");
    let log = std::fs::read_to_string(log).unwrap();
    assert!(log.contains("interrupted") && log.contains("--resume"), "{log}");
    assert_eq!(status_column(&dir.join("array")), ["interrupted"]);
    // Resubmitted as it is (tasks run with --resume), the run completes.
    let again = Command::new("sbatch").args(["--wait", "job.sh"]).current_dir(&dir).output().unwrap();
    assert!(again.status.success(), "sbatch: {}", String::from_utf8_lossy(&again.stderr));
    assert_eq!(status_column(&dir.join("array")), ["ok"]);
}
