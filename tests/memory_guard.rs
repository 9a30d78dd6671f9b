//! No input value makes memory grow without bound: inputs that imply an
//! absurd size (epoch timestamps, a vanishing rate, a nanosecond time-series
//! interval, arrivals ages apart) end with an error naming the value while
//! the heap stays small. A test binary of its own, so that its counting
//! allocator sees only these tests (run one at a time).

#[path = "common/alloc.rs"]
mod alloc;

use crate::alloc::{LIVE, PEAK};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::Ordering::Relaxed;

/// One test at a time: the peak is process-wide.
static SERIAL: Mutex<()> = Mutex::new(());

/// The acceptance bound on memory for a refused input.
const LIMIT: usize = 200 << 20;

/// Plans and runs `spec` (TOML text, with `trace` written next to it);
/// returns the first error (plan or run) and the heap's peak above the start.
fn attempt(name: &str, spec: &str, trace: Option<&str>) -> (String, usize) {
    let dir = std::env::temp_dir().join(format!("opal-guard-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    if let Some(t) = trace {
        std::fs::write(dir.join("t.jsonl"), t).unwrap();
    }
    let path: PathBuf = dir.join("spec.toml");
    std::fs::write(&path, spec).unwrap();
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let error = run(&path);
    let peak = PEAK.load(Relaxed) - base;
    std::fs::remove_dir_all(&dir).unwrap();
    (error, peak)
}

fn run(path: &Path) -> String {
    let spec = match opal::config::load_spec(path) {
        Ok(s) => s,
        Err(e) => return format!("spec: {e}"),
    };
    let plan = match opal::sweep::plan(&spec) {
        Ok(p) => p,
        Err(e) => return format!("spec: {e}"),
    };
    let scenario = match &plan.points[0].scenario {
        Ok(s) => s.clone(),
        Err(e) => return format!("spec: {e}"),
    };
    match opal::simulate(&scenario) {
        Ok(_) => "no error".into(),
        Err(e) => format!("run: {e}"),
    }
}

fn trace_spec(extra: &str) -> String {
    format!(
        r#"
        [simulation]
        num_workers = 1
        {extra}
        [model.model_params]
        name = "llama-3.1-8b"
        [[workload.stages]]
        type = "Trace"
        [workload.stages.workload_params]
        trace_file = "t.jsonl"
        "#
    )
}

fn line(ms: f64) -> String {
    format!("{{\"timestamp\": {ms}, \"input_length\": 100, \"output_length\": 2, \"hash_ids\": [1]}}\n")
}

fn check(name: &str, spec: &str, trace: Option<&str>, expect: &[&str]) {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (error, peak) = attempt(name, spec, trace);
    for e in expect {
        assert!(error.contains(e), "{name}: expected {e:?} in\n{error}");
    }
    assert!(error.contains("fix:"), "{name}: no fix in\n{error}");
    assert!(peak < LIMIT, "{name}: {peak} bytes at the peak");
    eprintln!("{name}: peak heap {} KiB", peak >> 10);
}

#[test]
fn an_epoch_millisecond_trace_is_refused_before_any_run() {
    let trace = line(1.7e12) + &line(1.7e12 + 1500.0);
    check("epoch", &trace_spec(""), Some(&trace), &["spec: ", "t.jsonl:1:", "look absolute", "shift_to_first = true"]);
}

#[test]
fn a_nanosecond_time_series_interval_is_refused_before_any_run() {
    check(
        "interval",
        &trace_spec("time_series_interval_sec = 1e-9"),
        Some(&line(0.0)),
        &["spec: ", "simulation.time_series_interval_sec", "at least 0.001"],
    );
}

#[test]
fn a_vanishing_request_rate_is_refused_before_any_run() {
    let spec = r#"
        [model.model_params]
        name = "llama-3.1-8b"
        [[workload.stages]]
        type = "ExponentialReqRate"
        [workload.stages.workload_params]
        request_rate = 1e-300
        "#;
    check("rate", spec, None, &["spec: ", "workload.stages.0.workload_params.request_rate"]);
}

#[test]
fn a_run_that_would_need_more_intervals_than_the_limit_fails_naming_the_interval() {
    // Relative timestamps, but the second request comes 2·10⁶ s after the
    // first: at 1 ms per interval, 2·10⁹ intervals.
    let trace = line(0.0) + &line(2e9);
    check(
        "intervals",
        &trace_spec("time_series_interval_sec = 0.001"),
        Some(&trace),
        &["run: ", "time_series_interval_sec = 0.001", "more than 400000 intervals"],
    );
}

#[test]
fn a_run_whose_next_event_lies_beyond_the_horizon_fails_naming_the_likely_causes() {
    // 10¹³ ms = 10¹⁰ s after the first request: the trace line says so.
    let trace = line(0.0) + &line(1e13);
    check(
        "horizon",
        &trace_spec(""),
        Some(&trace),
        &["run: ", "t.jsonl:2: field `timestamp`", "1.000e10 s after the stage start", "multiplier_to_sec"],
    );
}

/// The heap's peak above the start while a sweep of one run of `requests`
/// requests writes every per-row table, and the steps it wrote.
fn tables_run(requests: u32) -> (usize, usize) {
    let (peak, steps, dir) = tables_kept(requests);
    std::fs::remove_dir_all(&dir).unwrap();
    (peak, steps)
}

/// [`tables_run`], its results directory kept.
fn tables_kept(requests: u32) -> (usize, usize, PathBuf) {
    use opal::sweep::runner::{RunnerOptions, run_sweep};
    let dir = std::env::temp_dir().join(format!("opal-guard-tables-{requests}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let spec = format!(
        r#"
        [sweep]
        name = "tables"
        tables = ["runs", "requests", "steps"]
        [simulation]
        num_workers = 4
        [model.model_params]
        name = "llama-3.1-8b"
        [[workload.stages]]
        type = "ExponentialReqRate"
        [workload.stages.workload_params]
        request_rate = 30.0
        total_requests = {requests}
        prompt_size_min = 256
        prompt_size_max = 2048
        output_tokens_min = 16
        output_tokens_max = 256
        "#
    );
    let spec = opal::config::Spec::from_text(&spec, &dir.join("spec.toml")).unwrap();
    let plan = opal::sweep::plan(&spec).unwrap();
    let opts = RunnerOptions {
        output: dir.clone(),
        jobs: Some(1),
        shard: None,
        resume: false,
        overwrite: true,
        progress: false,
    };
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    run_sweep(&plan, &opts, &std::sync::atomic::AtomicBool::new(false)).unwrap();
    let peak = PEAK.load(Relaxed) - base;
    let steps = opal::output::read_table(&dir.join("steps.parquet")).unwrap().iter().map(|b| b.num_rows()).sum();
    (peak, steps, dir)
}

#[test]
fn a_runs_per_row_tables_do_not_grow_its_memory_with_its_length() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // Steps and requests go to spill files as the run goes (in chunks of
    // 32,768 rows) and are merged into the tables a batch at a time: four
    // times the run, much the same peak (measured: 30 and 44 MiB). Held in
    // memory to the end, the 750,000 step rows of the long run alone took
    // over 100 MiB.
    let (short, short_steps) = tables_run(10_000);
    let (long, long_steps) = tables_run(40_000);
    eprintln!("peak heap: {} KiB for {short_steps} steps, {} KiB for {long_steps}", short >> 10, long >> 10);
    assert!(long_steps > 3 * short_steps);
    assert!(long < 2 * short && long < 80 << 20, "{long} bytes at the peak for 40,000 requests, {short} for 10,000");
}

#[test]
fn a_timeline_of_a_whole_long_run_streams_in_little_memory() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (_, steps, dir) = tables_kept(40_000);
    // Every one of the run's 750,000 steps (no limit that binds): read a
    // batch at a time and written as made, where the whole table was read
    // and held (over 100 MiB of steps for this run).
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let t = opal::report::timeline::write_timeline(&dir, None, Some(&dir.join("t.json")), 1_000_000_000).unwrap();
    let peak = PEAK.load(Relaxed) - base;
    eprintln!("timeline: {} steps, peak heap {} KiB", t.steps, peak >> 10);
    assert_eq!((t.steps, t.total_steps), (steps, steps));
    assert!(peak < 16 << 20, "{peak} bytes at the peak");
    std::fs::remove_dir_all(&dir).unwrap();
}
