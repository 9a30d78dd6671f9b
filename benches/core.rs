//! Core benchmark: single runs on one thread, each row in a child process of
//! its own (so its peak RSS is its own). For every row: simulated requests
//! per CPU second (user + system; the median of the row's repeats), events
//! per request, ns per event, peak RSS and the most requests held in the
//! arena at once. Run with `cargo bench --bench core`, or name rows:
//! `cargo bench --bench core -- trace memory-1m`. With `--instructions`
//! (and valgrind installed) each row also gets instructions per request,
//! the noise-free figure: cachegrind's count for a child that builds the
//! scenario and simulates once, less that of one that does the same with
//! one request, over the requests less one (for a process row, one whole
//! process). With `--misses` each row also gets cachegrind's simulated
//! level-2 data misses per event (a 48 KiB 12-way L1, a 2 MiB 16-way L2,
//! 64-byte lines: the per-core caches of the Intel host these figures were
//! first taken on, fixed so that the count means the same on any host),
//! counted the same way, over the row's events: the noise-free figure
//! behind ns per event where memory, not instructions, sets the pace (the
//! 1,024-worker row).
//!
//! Rows (targets from the performance issue, round three; "–" where the row
//! measures memory only):
//! - `reference`: `benches/reference.toml` (16 workers, Llama-3.1-8B on H100,
//!   LeastLoaded, CPU tier, Poisson at ~70 % of capacity, 100k requests);
//! - `no-cache`: the same without tiers and without prefix caching (nothing
//!   reads block hashes, so none are computed);
//! - `maxprefix`: the same with the MaxPrefix router;
//! - `workers-1024`: the same load per worker on 1,024 workers (when it
//!   runs with `reference`, a last line gives its ns per event as a
//!   multiple of the reference's, against the 1.5× target, and the next one
//!   this host's latency of a dependent load within 512 KiB, 8 MiB and
//!   64 MiB — what a cold line costs here, which sets that multiple);
//! - `trace`: the shipped Mooncake conversation trace as recorded, 16
//!   workers, MaxPrefix, CPU + NVMe + DFS tiers;
//! - `trace-20x`: the same with arrivals 20× compressed (overloaded);
//! - `memory-10k`, `memory-1m`, `memory-10m`: the reference family with 10k,
//!   1M and 10M requests and no per-request table (peak RSS must stay flat);
//! - `opal-1w`, `opal-4w`, `opal-16w`: `examples/opal/exponential-12rps.json`
//!   (the original Opal's ExponentialReqRate study, its prompt-content model,
//!   12 req/s per worker) on 1, 4 and 16 workers, 100k requests; the Python
//!   Opal does 105–145 requests per CPU second on it, the target is 2,000×
//!   its best (290k);
//! - `one-request`: `benches/reference.toml` with one request, as a process:
//!   the fixed cost of any run (targets: 40M instructions, 20 MiB);
//! - `opal-1k`: that example at 1,000 requests as a researcher runs it — the
//!   `opal-sweep` binary in a process of its own, spec import, tables and
//!   manifest written included — in CPU milliseconds per run (the target:
//!   5 ms, 2,000× the Python Opal's ≈ 7 s on it);
//! - `vidur-2k`: the run Vidur was timed on (2,000 requests of the Splitwise
//!   conversation trace, Llama-2-7B on one A100), also a whole process (the
//!   target: 500× less CPU than Vidur's).

mod common;

use common::{cpu_timed, peak_rss_mib};
use opal::RunOptions;
use opal::config::{Scenario, resolve, spec_from_table};
use std::path::Path;
use std::process::Command;

/// One benchmark row.
struct Row {
    name: &'static str,
    /// Target in simulated requests per CPU second, if the row has one.
    target: Option<f64>,
    /// Runs measured (the median CPU time is reported).
    repeats: usize,
    /// Builds the row's scenario.
    build: fn() -> Scenario,
}

const ROWS: &[Row] = &[
    Row { name: "reference", target: Some(400e3), repeats: 3, build: || reference(&[]) },
    Row {
        name: "no-cache",
        target: Some(1e6),
        repeats: 3,
        build: || {
            reference(&[
                ("kvc.kvc_tiers", toml::Value::Array(Vec::new())),
                ("worker.vllm_params.enable_prefix_caching", false.into()),
            ])
        },
    },
    Row {
        name: "maxprefix",
        target: Some(250e3),
        repeats: 3,
        build: || reference(&[("router.router_params.policy", "MaxPrefix".into())]),
    },
    Row {
        name: "workers-1024",
        target: Some(200e3),
        repeats: 3,
        build: || {
            reference(&[
                ("simulation.num_workers", 1024.into()),
                ("workload.stages.0.workload_params.request_rate", (90.0 * 64.0).into()),
            ])
        },
    },
    Row { name: "trace", target: Some(100e3), repeats: 3, build: || trace(1.0) },
    Row { name: "trace-20x", target: Some(60e3), repeats: 3, build: || trace(0.05) },
    Row { name: "memory-10k", target: None, repeats: 1, build: || requests(10_000) },
    Row { name: "memory-1m", target: None, repeats: 1, build: || requests(1_000_000) },
    Row { name: "memory-10m", target: None, repeats: 1, build: || requests(10_000_000) },
    Row { name: "opal-1w", target: Some(290e3), repeats: 3, build: || opal(1) },
    Row { name: "opal-4w", target: Some(290e3), repeats: 3, build: || opal(4) },
    Row { name: "opal-16w", target: Some(290e3), repeats: 3, build: || opal(16) },
];

/// A row measured as `opal-sweep` processes (spec import, tables and
/// manifest included), in CPU milliseconds per run, and with `valgrind`
/// in instructions for the whole process.
struct ProcessRow {
    name: &'static str,
    /// Requests a run simulates.
    requests: u64,
    /// Target, CPU ms per run, if the row has one.
    target_ms: Option<f64>,
    /// Target, instructions of the whole process (the performance issue's, round four).
    target_instructions: f64,
    /// Target, peak resident memory of the process, MiB.
    target_rss_mib: Option<f64>,
    /// Writes the row's spec into the directory and returns its path.
    spec: fn(&Path) -> std::path::PathBuf,
}

const PROCESS_ROWS: &[ProcessRow] = &[
    ProcessRow {
        name: "one-request",
        requests: 1,
        target_ms: None,
        target_instructions: 40e6,
        target_rss_mib: Some(20.0),
        spec: one_request,
    },
    ProcessRow {
        name: "opal-1k",
        requests: 1000,
        target_ms: Some(5.0),
        target_instructions: 50e6,
        target_rss_mib: None,
        spec: opal_1k,
    },
    ProcessRow {
        name: "vidur-2k",
        requests: 2000,
        target_ms: Some(VIDUR_CPU_MS / 500.0),
        target_instructions: 80e6,
        target_rss_mib: None,
        spec: vidur_2k,
    },
];

/// Vidur's CPU time on the `vidur-2k` run (see [`vidur_2k`]): user +
/// system, process start included, best of 3 on this project's 2-core
/// machine (2026-12-02: 20.39, 19.53, 17.84 s), with its predictors already trained and cached and
/// its plots off (`--no-metrics_config_store_plots`: Opal draws none; with
/// them Vidur's Python process takes 20.4–22.8 s and the Chromium that
/// kaleido starts to render them about 22 s more). Vidur's first run also
/// trains its random forests, about 4,000 s of CPU. The target is 500× less.
const VIDUR_CPU_MS: f64 = 17_840.0;

const ROW_ENV: &str = "OPAL_BENCH_CORE_ROW";
/// Set in a row's child process measured by cachegrind: `once` builds the
/// scenario and simulates it once; `one` does the same with the row's
/// workload cut to one request (the performance issue's baseline: "whole
/// process less a 1-request run of the same spec", so the fixed cost of a
/// run — tables priced on first use, the summary — is not counted per
/// request); `setup` only builds the scenario.
const MODE_ENV: &str = "OPAL_BENCH_CORE_MODE";

fn main() {
    if let Ok(name) = std::env::var(ROW_ENV) {
        let row = ROWS.iter().find(|r| r.name == name).expect("a known row");
        match std::env::var(MODE_ENV).as_deref() {
            Ok("setup") => drop(std::hint::black_box((row.build)())),
            Ok("once" | "one") => simulate_once(row),
            _ => measure(row),
        }
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let instructions = args.iter().any(|a| a == "--instructions");
    let misses = args.iter().any(|a| a == "--misses");
    let wanted: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let known = |w: &str| ROWS.iter().any(|r| r.name == w) || PROCESS_ROWS.iter().any(|r| r.name == w);
    if let Some(unknown) = wanted.iter().find(|w| !known(w)) {
        let names: Vec<&str> = ROWS.iter().map(|r| r.name).chain(PROCESS_ROWS.iter().map(|r| r.name)).collect();
        eprintln!("unknown row `{unknown}`; rows: {}", names.join(", "));
        std::process::exit(2);
    }
    let chosen = |name: &str| wanted.is_empty() || wanted.iter().any(|w| *w == name);
    let valgrind = (instructions || misses) && cachegrind(Command::new("true"), false).is_some();
    if (instructions || misses) && !valgrind {
        println!("(instructions and misses need valgrind's cachegrind, which is not installed here)");
    }
    println!(
        "{:<13} {:>10} {:>11} {:>8} {:>9} {:>12} {:>8} {:>9} {:>10} {:>10}  target",
        "row", "requests", "events", "ev/req", "CPU s", "req/CPU s", "ns/ev", "RSS MiB", "peak live", "instr/req"
    );
    let exe = std::env::current_exe().expect("own path");
    // ns and simulated L2 misses per event of the rows run, for the 1,024-worker ratio.
    let mut ns_per_event = std::collections::BTreeMap::new();
    let mut misses_per_event = std::collections::BTreeMap::new();
    for row in ROWS.iter().filter(|r| chosen(r.name)) {
        let child = |mode: Option<&str>| {
            let mut c = Command::new(&exe);
            c.env(ROW_ENV, row.name);
            if let Some(m) = mode {
                c.env(MODE_ENV, m);
            }
            c
        };
        let out = child(None).output().expect("run a row");
        assert!(out.status.success(), "row {} failed: {}", row.name, String::from_utf8_lossy(&out.stderr));
        let line = String::from_utf8(out.stdout).expect("a UTF-8 line");
        let fields: Vec<&str> = line.trim_end().split('\t').collect();
        let [head, target, requests] = fields[..] else { panic!("row {}: unexpected line {line:?}", row.name) };
        // One cachegrind run of each child gives both counts asked for.
        let counts = valgrind.then(|| {
            let one = cachegrind(child(Some("one")), misses).expect("cachegrind ran");
            let once = cachegrind(child(Some("once")), misses).expect("cachegrind ran");
            (one, once)
        });
        let per_request = counts.filter(|_| instructions).map(|(one, once)| {
            (once.instructions - one.instructions) as f64 / (requests.parse::<f64>().expect("a count") - 1.0)
        });
        println!("{head} {:>10}  {target}", per_request.map_or("–".to_string(), |i| format!("{:.1}k", i / 1e3)));
        if let Some(ns) = head.split_whitespace().nth(6).and_then(|x| x.parse::<f64>().ok()) {
            ns_per_event.insert(row.name, ns);
        }
        if let Some((one, once)) = counts.filter(|_| misses) {
            let (one, once) = (one.l2_misses.expect("simulated"), once.l2_misses.expect("simulated"));
            let events: f64 = head.split_whitespace().nth(2).and_then(|x| x.parse().ok()).expect("an event count");
            let per_event = once.saturating_sub(one) as f64 / events;
            println!("{:<13} simulated L2 data misses per event: {per_event:.2}", row.name);
            misses_per_event.insert(row.name, per_event);
        }
    }
    if let (Some(many), Some(few)) = (misses_per_event.get("workers-1024"), misses_per_event.get("reference")) {
        println!("workers-1024 / reference simulated L2 data misses per event: {many:.2} / {few:.2}");
    }
    if let (Some(many), Some(few)) = (ns_per_event.get("workers-1024"), ns_per_event.get("reference")) {
        let ratio = many / few;
        let verdict = if ratio <= WORKERS_RATIO_TARGET { "met" } else { "NOT met" };
        println!(
            "workers-1024 / reference ns per event: {ratio:.2}x (target ≤ {WORKERS_RATIO_TARGET}x: {verdict}; CPU time, one invocation)"
        );
        // What the ratio is made of on this host: the 16-worker row's state
        // stays in the caches, the 1,024-worker row's (≈ 48 MiB more RSS)
        // does not, so its cold lines cost what the largest figure says.
        let probe: Vec<String> = [512 << 10, 8 << 20, 64 << 20]
            .into_iter()
            .map(|bytes| format!("{:.0} ns in {} MiB", dependent_load_ns(bytes), bytes as f64 / (1 << 20) as f64))
            .collect();
        println!("host memory, one dependent load: {}", probe.join(", "));
    }
    let release = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/opal-sweep");
    for row in PROCESS_ROWS.iter().filter(|r| chosen(r.name)) {
        process_row(row, &release, valgrind && instructions);
    }
}

/// The CPU time of one load that depends on the one before, chasing a
/// cycle through `bytes` of memory a cache line at a time, the lines in a
/// random order (one cycle, so no line is visited twice in a lap): about
/// the level-2 latency while `bytes` fits the core's level-2 cache, the
/// last-level cache's while that holds it, and main memory's beyond — the
/// latency a cold line of simulator state costs when nothing overlaps it.
fn dependent_load_ns(bytes: usize) -> f64 {
    let lines = bytes / 64;
    let mut next: Vec<[u32; 16]> = vec![[0; 16]; lines];
    let mut order: Vec<u32> = (0..lines as u32).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    for i in (1..lines).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    for (k, &at) in order.iter().enumerate() {
        next[at as usize][0] = order[(k + 1) % lines];
    }
    let chase = |loads: usize| {
        let mut at = 0u32;
        for _ in 0..loads {
            at = next[at as usize][0];
        }
        std::hint::black_box(at)
    };
    chase(lines); // a lap to bring in what fits
    let loads = 4_000_000;
    let (_, cpu) = cpu_timed(|| chase(loads));
    cpu / loads as f64 * 1e9
}

/// The performance issue's target for the 1,024-worker row: its ns per
/// event at most this many times the reference's, in one invocation.
const WORKERS_RATIO_TARGET: f64 = 1.5;

/// What cachegrind counted for a process.
#[derive(Clone, Copy)]
struct Counts {
    /// Instructions executed (`I refs`).
    instructions: u64,
    /// Level-2 data misses, reads and writes (`LLd misses`), when the
    /// caches were simulated (the `--misses` caches).
    l2_misses: Option<u64>,
}

/// Runs `cmd` under cachegrind, simulating the caches if `caches`; its
/// counts, or `None` if valgrind is not there.
fn cachegrind(cmd: Command, caches: bool) -> Option<Counts> {
    let options: &[&str] =
        if caches { &["--cache-sim=yes", "--D1=49152,12,64", "--LL=2097152,16,64"] } else { &["--cache-sim=no"] };
    let mut vg = Command::new("valgrind");
    vg.args(["--tool=cachegrind", "--cachegrind-out-file=/dev/null"]).args(options);
    vg.arg(cmd.get_program()).args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            vg.env(k, v);
        }
    }
    if let Some(d) = cmd.get_current_dir() {
        vg.current_dir(d);
    }
    let out = vg.stdout(std::process::Stdio::null()).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let err = String::from_utf8_lossy(&out.stderr);
    // The first count on the summary line that starts with `label`.
    let count = |label: &str| -> Option<u64> {
        let n = err.lines().find_map(|l| l.split_once(label).and_then(|(_, n)| n.split_whitespace().next()))?;
        n.replace(',', "").parse().ok()
    };
    Some(Counts {
        instructions: count("I   refs:")?,
        l2_misses: if caches { Some(count("LLd misses:")?) } else { None },
    })
}

/// A process row: `opal-sweep` on the row's spec, each run a process of
/// its own; the mean CPU time of 50 runs (children's time from
/// `/proc/self/stat`, counted in 10 ms ticks, so summed over the runs
/// before dividing), and with `valgrind` one run's instructions.
fn process_row(row: &ProcessRow, exe: &Path, valgrind: bool) {
    if !exe.exists() {
        println!("{:<13} (build the binary first: cargo build --release)", row.name);
        return;
    }
    let dir = std::env::temp_dir().join(format!("opal-bench-{}-{}", row.name, std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let spec = (row.spec)(&dir);
    let run = |i: usize| {
        let mut c = Command::new(exe);
        c.arg(&spec).arg("-o").arg(dir.join(format!("out-{i}"))).args(["-j", "1", "--quiet"]);
        c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
        c
    };
    const RUNS: usize = 50;
    let before = common::children_cpu_seconds().unwrap_or(f64::NAN);
    let mut rss: f64 = 0.0;
    for i in 0..RUNS {
        let (ok, peak) = common::run_with_peak_rss(&mut run(i));
        assert!(ok, "opal-sweep failed on row {}", row.name);
        rss = rss.max(peak);
    }
    let ms = (common::children_cpu_seconds().unwrap_or(f64::NAN) - before) * 1e3 / RUNS as f64;
    let instr = valgrind.then(|| cachegrind(run(RUNS), false).expect("cachegrind ran").instructions as f64);
    std::fs::remove_dir_all(&dir).ok();
    let met = |yes: bool| if yes { "met" } else { "NOT met" };
    let mut verdict: Vec<String> = row.target_ms.iter().map(|&t| format!("≤ {t} ms {}", met(ms <= t))).collect();
    if let Some(i) = instr {
        let t = row.target_instructions;
        verdict.push(format!("≤ {:.0}M instr {}", t / 1e6, met(i <= t)));
    }
    if let Some(t) = row.target_rss_mib {
        verdict.push(format!("≤ {t} MiB {}", met(rss <= t)));
    }
    let verdict = verdict.join("; ");
    println!(
        "{:<13} {:>10} {:>12.1} ms CPU per run, {:>6.1} MiB, {:>8} instr (process, tables included) {:>10}  {verdict}",
        row.name,
        row.requests,
        ms,
        rss,
        instr.map_or("–".to_string(), |i| format!("{:.1}M", i / 1e6)),
        instr.map_or("–".to_string(), |i| format!("{:.1}k", i / 1e3 / row.requests as f64)),
    );
}

/// The `one-request` row's spec: `benches/reference.toml` with one request
/// (the fixed cost of any `opal-sweep` process).
fn one_request(dir: &Path) -> std::path::PathBuf {
    cut_spec(dir, "benches/reference.toml", "total_requests = 100000", "total_requests = 1", "one-request.toml")
}

/// The `opal-1k` row's spec: `examples/opal/exponential-12rps.json` cut to
/// 1,000 requests.
fn opal_1k(dir: &Path) -> std::path::PathBuf {
    let (from, to) = ("\"total_requests\": 3000", "\"total_requests\": 1000");
    cut_spec(dir, "examples/opal/exponential-12rps.json", from, to, "opal-1k.json")
}

/// A shipped spec (`shipped`, relative to the crate) with its request
/// count `from` replaced by `to`, written to `dir/name`.
fn cut_spec(dir: &Path, shipped: &str, from: &str, to: &str, name: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(manifest(shipped)).expect("a shipped spec");
    let cut = text.replace(from, to);
    assert_ne!(cut, text, "{shipped}: the request count is where the row expects it");
    let spec = dir.join(name);
    std::fs::write(&spec, cut).expect("write the spec");
    spec
}

/// The `vidur-2k` row's spec: the run Vidur was timed on — the first 2,000
/// requests of the Splitwise conversation trace as Vidur replays it
/// (`traces/splitwise_conv_2k.jsonl`), Llama-2-7B on one A100, priced by
/// Vidur's own operator profile, vLLM's v0 scheduler with Vidur's vLLM
/// limits (128 sequences, 4,096 tokens a step and a sequence), no prefix
/// caching and no KV tiers. Vidur (github.com/microsoft/vidur @ 7d47513):
/// `python -m vidur.main --replica_config_device a100
/// --replica_config_model_name meta-llama/Llama-2-7b-hf
/// --request_generator_config_type trace_replay
/// --trace_request_generator_config_trace_file <those 2,000 rows>
/// --replica_scheduler_config_type vllm`, one replica, TP 1.
fn vidur_2k(dir: &Path) -> std::path::PathBuf {
    let spec = dir.join("vidur-2k.toml");
    let text = format!(
        r#"
        [simulation]
        seed = 1
        num_workers = 1
        [model.model_params]
        name = "llama-2-7b"
        [worker.hw]
        gpu = "A100"
        [worker.inference_params]
        profile = "{}"
        [worker.vllm_params]
        scheduler = "v0"
        chunked_prefill = false
        max_num_seqs = 128
        max_num_batched_tokens = 4096
        max_model_len = 4096
        enable_prefix_caching = false
        [kvc]
        kvc_tiers = []
        [[workload.stages]]
        type = "Trace"
        [workload.stages.workload_params]
        trace_file = "{}"
        "#,
        manifest("profiles/vidur/a100/llama-2-7b").display(),
        manifest("traces/splitwise_conv_2k.jsonl").display()
    );
    std::fs::write(&spec, text).expect("write the spec");
    spec
}

/// Builds `row`'s scenario and simulates it once (measured by cachegrind).
fn simulate_once(row: &Row) {
    let scenario = (row.build)();
    let opts = RunOptions { request_records: false, ..RunOptions::default() };
    std::hint::black_box(opal::simulate_with(&scenario, &opts).expect("the row runs"));
}

/// Runs `row` in this process and prints its line: the columns up to the
/// instructions, its target and the count of requests simulated, separated
/// by tabs (the parent adds the instructions).
fn measure(row: &Row) {
    let scenario = (row.build)();
    let opts = RunOptions { request_records: false, ..RunOptions::default() };
    let mut cpus = Vec::new();
    let mut last = None;
    for _ in 0..row.repeats {
        let (out, cpu) = cpu_timed(|| opal::simulate_with(&scenario, &opts).expect("the row runs"));
        cpus.push(cpu);
        last = Some(out);
    }
    cpus.sort_by(f64::total_cmp);
    let cpu = cpus[cpus.len() / 2];
    let out = last.expect("at least one run");
    let s = &out.summary;
    let requests = s.requests_completed as f64;
    let rate = requests / cpu;
    let target = row.target.map_or_else(
        || "–".to_string(),
        |t| format!("≥ {:.0}k {}", t / 1e3, if rate >= t { "met" } else { "NOT met" }),
    );
    println!(
        "{:<13} {:>10} {:>11} {:>8.1} {:>9.2} {:>12.0} {:>8.0} {:>9.1} {:>10}\t{target}\t{}",
        row.name,
        s.requests_completed,
        s.events,
        s.events as f64 / requests,
        cpu,
        rate,
        cpu * 1e9 / s.events as f64,
        peak_rss_mib().unwrap_or(f64::NAN),
        out.peak_live_requests,
        s.requests_completed,
    );
}

fn manifest(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `table` with `overrides` applied, resolved as a scenario read from `path`.
fn scenario(mut table: toml::Table, path: &Path, overrides: &[(&str, toml::Value)]) -> Scenario {
    for (key, value) in overrides {
        opal::sweep::set_path(&mut table, key, value.clone()).expect("an override path");
    }
    if std::env::var(MODE_ENV).as_deref() == Ok("one") {
        let key = "workload.stages.0.workload_params.total_requests";
        opal::sweep::set_path(&mut table, key, 1.into()).expect("an override path");
    }
    let source = path.display().to_string();
    let file = spec_from_table(&table, &source).expect("a valid spec");
    resolve(&file, &source, path.parent().expect("a directory")).expect("a valid scenario")
}

fn reference(overrides: &[(&str, toml::Value)]) -> Scenario {
    let path = manifest("benches/reference.toml");
    let spec = opal::config::load_spec(&path).expect("reference spec");
    scenario(spec.table, &path, overrides)
}

fn requests(n: i64) -> Scenario {
    reference(&[("workload.stages.0.workload_params.total_requests", n.into())])
}

fn trace(time_scale: f64) -> Scenario {
    let path = manifest("benches/reference.toml");
    let text = format!(
        r#"
        [simulation]
        seed = 1
        num_workers = 16
        [model.model_params]
        name = "llama-3.1-8b"
        [router.router_params]
        policy = "MaxPrefix"
        [worker.vllm_params]
        max_model_len = 131072
        [kvc]
        kvc_tiers = ["CPUMemory", "LocalNVMe", "DistributedFS"]
        [[workload.stages]]
        type = "Trace"
        [workload.stages.workload_params]
        trace_file = "{}"
        time_scale = {time_scale}
        "#,
        manifest("traces/conversation_trace.jsonl").display()
    );
    scenario(text.parse().expect("trace spec"), &path, &[])
}

fn opal(workers: i64) -> Scenario {
    let path = manifest("examples/opal/exponential-12rps.json");
    let spec = opal::config::load_spec(&path).expect("the Opal example imports");
    scenario(
        spec.table,
        &path,
        &[
            ("simulation.num_workers", workers.into()),
            ("workload.stages.0.workload_params.request_rate", (12.0 * workers as f64).into()),
            ("workload.stages.0.workload_params.total_requests", 100_000.into()),
        ],
    )
}
