//! Signals, locks and threads: what happens around a sweep rather than in it.

use crate::sweep::{opal_sweep, read, setup};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One run of the reference family with short prompts, long enough on any
/// machine (a few seconds in the test build) that a signal sent a moment
/// after it starts lands while it runs.
pub const LONG: &str = r#"
[sweep]
name = "long"

[simulation]
num_workers = 16

[model.model_params]
name = "llama-3.1-8b"

[router.router_params]
policy = "LeastLoaded"

[[workload.stages]]
type = "ExponentialReqRate"
[workload.stages.workload_params]
request_rate = 2000.0
total_requests = 2000000
prompt_size_min = 16
prompt_size_max = 64
output_tokens_min = 1
output_tokens_max = 8
"#;

fn spawn(dir: &Path, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_opal-sweep"))
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary runs")
}

/// Waits until the run in `out` holds its lock (its record is written).
fn wait_until_running(out: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(out.join(".lock")).is_ok_and(|s| s.contains("running since")) {
        assert!(Instant::now() < deadline, "the sweep never started");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn status_column(dir: &Path) -> Vec<String> {
    let runs = read(&dir.join("runs.parquet"));
    let col = runs.column_by_name("status").unwrap();
    let col = col.as_any().downcast_ref::<arrow_array::StringArray>().unwrap();
    col.iter().map(|s| s.unwrap().to_string()).collect()
}

#[test]
fn sigterm_stops_a_run_in_flight_within_two_seconds_and_resume_completes_it() {
    let dir = setup("sigterm", LONG);
    let mut child = spawn(&dir, &["spec.toml", "-o", "out", "-q"]);
    wait_until_running(&dir.join("out"));
    // A moment for the run to start (it then runs for seconds): the signal
    // lands in flight however fast the machine.
    std::thread::sleep(Duration::from_millis(100));
    let sent = Instant::now();
    let kill = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(sent.elapsed() < Duration::from_secs(2), "still running 2 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.code(), Some(1), "an interrupted sweep exits 1\n{stderr}");
    assert!(stderr.contains("interrupted") && stderr.contains("--resume"), "{stderr}");
    assert_eq!(status_column(&dir.join("out")), ["interrupted"], "the run is recorded as interrupted, not ok");

    let resumed = opal_sweep(&["spec.toml", "-o", "out", "--resume", "-q"], &dir);
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    assert_eq!(status_column(&dir.join("out")), ["ok"]);
    let clean = opal_sweep(&["spec.toml", "-o", "clean", "-q"], &dir);
    assert!(clean.status.success());
    for t in ["runs", "histograms", "timeseries", "workers"] {
        let (mut a, mut b) =
            (read(&dir.join(format!("out/{t}.parquet"))), read(&dir.join(format!("clean/{t}.parquet"))));
        if let Ok(i) = a.schema().index_of("wall_s") {
            a.remove_column(i);
            b.remove_column(i);
        }
        assert_eq!(a, b, "{t}: the resumed run equals an uninterrupted one");
    }
}

#[test]
fn a_second_sweep_into_a_busy_directory_exits_2_naming_the_holder() {
    let dir = setup("lock", LONG);
    let mut first = spawn(&dir, &["spec.toml", "-o", "out", "-q"]);
    wait_until_running(&dir.join("out"));
    let second = opal_sweep(&["spec.toml", "-o", "out", "--overwrite", "-q"], &dir);
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("pid {}", first.id())) && stderr.contains(".lock"), "{stderr}");
    assert!(stderr.contains("fix:"), "{stderr}");
    let merge = opal_sweep(&["merge", "out"], &dir);
    assert_eq!(merge.status.code(), Some(2), "a merge waits for the run too");
    first.kill().unwrap();
    first.wait().unwrap();
    // The lock dies with its holder, however it ended.
    let after = opal_sweep(&["spec.toml", "-o", "out", "--overwrite", "-q", "--dry-run"], &dir);
    assert!(after.status.success());
}

/// Threads of process `pid` (Linux).
fn threads(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Threads:")).and_then(|v| v.trim().parse().ok())
}

#[test]
fn j_1000_on_a_one_run_spec_starts_one_worker_thread() {
    let dir = setup("threads", LONG);
    let mut child = spawn(&dir, &["spec.toml", "-o", "out", "-q", "-j", "1000"]);
    wait_until_running(&dir.join("out"));
    let mut most = 0;
    for _ in 0..20 {
        if let Some(n) = threads(child.id()) {
            most = most.max(n);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    // The main thread, the signal handler's, the one feeding the pool, and one worker.
    assert!((1..=4).contains(&most), "{most} threads");
    assert!(String::from_utf8_lossy(&out.stderr).contains("-j 1000 is more than 4 ×"), "warned");
}
