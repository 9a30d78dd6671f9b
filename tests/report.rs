//! `opal-sweep report`: the page and its figures from a results directory,
//! failed runs, and bad input.

use crate::sweep::{opal_sweep, read, setup};
use arrow_array::cast::AsArray;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Output;

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// 2 policies × 2 rates × 2 replicates of 40 requests; the report is made
/// at the end of the sweep.
const SPEC: &str = r#"
[sweep]
name = "r"
replicates = 2
base_seed = 3
report = true

[grid]
"router.router_params.policy" = ["RoundRobin", "MaxPrefix"]
"workload.stages.0.workload_params.request_rate" = [4.0, 8.0]

[simulation]
num_workers = 2

[model.model_params]
name = "llama-3.1-8b"

[[workload.stages]]
type = "ExponentialReqRate"
[workload.stages.workload_params]
total_requests = 40
prompt_size_min = 100
prompt_size_max = 2000
output_tokens_min = 10
output_tokens_max = 60
"#;

/// Every `src="…"` and `href="…"` target of the page.
fn referenced(html: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for attr in ["src=\"", "href=\""] {
        let mut rest = html;
        while let Some(i) = rest.find(attr) {
            rest = &rest[i + attr.len()..];
            let end = rest.find('"').expect("closed attribute");
            out.insert(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    out
}

/// Files in the report directory other than the page, after checking each
/// is a non-empty PNG or SVG.
fn figure_files(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if name == "index.html" {
            continue;
        }
        let bytes = std::fs::read(dir.join(&name)).unwrap();
        if name.ends_with(".png") {
            assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{name} is not a PNG");
            assert!(bytes.len() > 5_000, "{name} is nearly empty ({} bytes)", bytes.len());
        } else if name.ends_with(".svg") {
            let s = String::from_utf8(bytes).unwrap();
            assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"), "{name} is not an SVG");
            assert!(
                s.contains("<text") && (s.contains("<polyline") || s.matches("<rect").count() > 1),
                "{name} draws nothing"
            );
        } else {
            panic!("unexpected file {name} in the report");
        }
        out.insert(name);
    }
    out
}

#[test]
fn a_sweep_with_report_true_writes_every_figure_and_the_page_references_exactly_them() {
    let dir = setup("report-small", SPEC);
    let o = opal_sweep(&["spec.toml", "-o", "out", "-q"], &dir);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("report: out/report/index.html (6 figures"), "{}", text(&o));
    let report = dir.join("out/report");
    let files = figure_files(&report);
    let expected: BTreeSet<String> =
        ["fig1-ttft-cdf", "fig2-throughput", "fig3-percentiles", "fig4-cache", "fig5-utilisation", "fig7-e2e-wait-cdf"]
            .iter()
            .map(|s| format!("{s}.svg"))
            .collect();
    assert_eq!(files, expected, "SVG only unless PNGs are asked for");
    let html = std::fs::read_to_string(report.join("index.html")).unwrap();
    assert_eq!(referenced(&html), files, "the page links exactly the figure files");
    assert!(
        html.contains("Figure 6 (SC25 cold vs warm): only for sweeps with an SC25Workload stage"),
        "says why figure 6 is missing"
    );
    // The axes vary load (a rate): a cost "frontier" over it only shows idle power amortised.
    assert!(html.contains("Figure 8 (cost vs TTFT p99): only when every axis is a platform choice"), "{html}");
    assert!(!html.contains("http://") && !html.contains("https://"), "the page needs no network");

    // The summary table's TTFT p99 of point 0 is the mean of its two runs' p99s.
    let runs = read(&dir.join("out/runs.parquet"));
    let p99 = opal::output::f64_column(&runs, "ttft_p99_ms").unwrap();
    let point = runs.column_by_name("point_id").unwrap().as_primitive::<arrow_array::types::UInt32Type>();
    let zero: Vec<f64> = (0..runs.num_rows()).filter(|&i| point.value(i) == 0).map(|i| p99[i].unwrap()).collect();
    assert_eq!(zero.len(), 2);
    let (mean, half) = opal::stats::mean_ci(&zero).unwrap();
    // Two samples: t(0.975, 1) = 12.706, half-width 12.706 · |a − b| / 2.
    assert!((half - 12.706 * (zero[0] - zero[1]).abs() / 2.0).abs() < 1e-9);
    let row0 = html.split("<tr><td>0</td>").nth(1).expect("row of point 0");
    let row0 = &row0[..row0.find("</tr>").unwrap()];
    use opal::report::figures::{si, sig};
    let cell = if half > 0.0 {
        format!("<td>{} <small>± {}</small></td>", si(mean), sig(half, 2))
    } else {
        format!("<td>{}</td>", si(mean))
    };
    assert!(row0.contains(&cell), "row 0 {row0} lacks {cell}");

    // Determinism: the same tables give the same bytes, page and pictures.
    let o = opal_sweep(&["report", "out", "-o", "again"], &dir);
    assert!(o.status.success(), "{}", text(&o));
    for f in files.iter().chain(std::iter::once(&"index.html".to_string())) {
        let (a, b) = (std::fs::read(report.join(f)).unwrap(), std::fs::read(dir.join("again").join(f)).unwrap());
        assert!(a == b, "{f} differs between two reports of the same tables");
    }

    // The CDF of a point merges its replicates' histograms: every completed request counted once.
    let data = opal::report::data::SweepData::load(&dir.join("out")).unwrap();
    let done = opal::output::f64_column(&runs, "requests_completed").unwrap();
    for p in &data.points {
        let expected: f64 = (0..runs.num_rows()).filter(|&i| point.value(i) == p.id).map(|i| done[i].unwrap()).sum();
        assert_eq!(data.latency.as_ref().unwrap()["ttft"][&p.id].len() as f64, expected, "point {}", p.id);
    }
}

#[test]
fn a_report_leaves_failed_runs_out_and_says_so() {
    let spec = SPEC.replace(
        "\"router.router_params.policy\" = [\"RoundRobin\", \"MaxPrefix\"]",
        "\"model.model_params.name\" = [\"llama-3.1-8b\", \"llama-3.1-70b\"]",
    );
    let dir = setup("report-failed", &spec);
    let o = opal_sweep(&["spec.toml", "-o", "out", "-q"], &dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let o = opal_sweep(&["report", "out", "-o", "pictures"], &dir);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("4 failed runs left out"), "{}", text(&o));
    let html = std::fs::read_to_string(dir.join("pictures/index.html")).unwrap();
    assert!(html.contains("4 failed runs are left out"), "the page says runs failed");
    for run in 4..8 {
        assert!(html.contains(&format!("<tr><td>{run}</td>")), "failed run {run} is listed");
    }
    assert!(html.contains("does not fit in GPU memory"), "with the reason");
    assert!(html.contains("<td>0/2</td>"), "the failed points show no successful runs");
    assert_eq!(referenced(&html), figure_files(&dir.join("pictures")));
}

#[test]
fn a_sweep_where_every_run_failed_still_gets_a_page_that_says_so() {
    // Every run meets a malformed trace line (the spec itself is valid).
    let dir = setup(
        "report-all-failed",
        r#"
        [sweep]
        name = "f"
        replicates = 2
        report = true
        [grid]
        "router.router_params.policy" = ["RoundRobin", "MaxPrefix"]
        "simulation.num_workers" = [1, 2]
        [model.model_params]
        name = "llama-3.1-8b"
        [[workload.stages]]
        type = "Trace"
        [workload.stages.workload_params]
        trace_file = "bad.jsonl"
        "#,
    );
    let good = r#"{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]}"#;
    std::fs::write(dir.join("bad.jsonl"), format!("{good}\n{{\"timestamp\": 5, \"input_length\": \"x\"}}\n")).unwrap();
    let o = opal_sweep(&["spec.toml", "-o", "out", "-q"], &dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let html = std::fs::read_to_string(dir.join("out/report/index.html")).unwrap();
    assert!(html.contains("8 failed runs are left out") && html.contains("No figures: no run succeeded."));
    assert!(figure_files(&dir.join("out/report")).is_empty());
    assert!(referenced(&html).is_empty());
}

#[test]
fn zipped_axes_are_one_axis_of_the_report() {
    let spec = SPEC.replace(
        "\"workload.stages.0.workload_params.request_rate\" = [4.0, 8.0]",
        "[[zip]]\n\"workload.stages.0.workload_params.prompt_size_min\" = [100, 1000]\n\"workload.stages.0.workload_params.prompt_size_max\" = [500, 4000]",
    );
    let dir = setup("report-zip", &spec);
    let o = opal_sweep(&["spec.toml", "-o", "out", "-q"], &dir);
    assert!(o.status.success(), "{}", text(&o));
    let data = opal::report::data::SweepData::load(&dir.join("out")).unwrap();
    let labels: Vec<&str> = data.axes.iter().map(|a| a.label.as_str()).collect();
    assert_eq!(labels, ["policy", "prompt_size_min / prompt_size_max"]);
    assert_eq!(data.axes[1].values, ["100 / 500", "1000 / 4000"]);
    let svg = std::fs::read_to_string(dir.join("out/report/fig3-percentiles.svg")).unwrap();
    assert!(svg.contains("vs prompt_size_min / prompt_size_max"), "the zipped pair is the x axis");
}

#[test]
fn an_sc25_sweep_gets_the_cold_vs_warm_figure() {
    let dir = setup(
        "report-sc25",
        r#"
        [sweep]
        name = "s"
        [model.model_params]
        name = "llama-3.1-8b"
        [[workload.stages]]
        type = "SC25Workload"
        "#,
    );
    let o = opal_sweep(&["spec.toml", "-o", "out", "-q"], &dir);
    assert!(o.status.success(), "{}", text(&o));
    let o = opal_sweep(&["report", "out"], &dir);
    assert!(o.status.success(), "{}", text(&o));
    let files = figure_files(&dir.join("out/report"));
    assert!(files.contains("fig6-sc25.svg"), "{files:?}");
    let o = opal_sweep(&["report", "out", "--png"], &dir);
    if opal::report::figures::PNG_SUPPORTED {
        assert!(o.status.success(), "{}", text(&o));
        let files = figure_files(&dir.join("out/report"));
        assert!(files.contains("fig6-sc25.png") && files.contains("fig6-sc25.svg"), "{files:?}");
        let html = std::fs::read_to_string(dir.join("out/report/index.html")).unwrap();
        assert_eq!(referenced(&html), files, "with --png the page shows the PNGs and links the SVGs");
    } else {
        assert_eq!(o.status.code(), Some(2), "a lean build says it cannot: {}", text(&o));
        assert!(text(&o).contains("--features png"), "{}", text(&o));
    }
    let svg = std::fs::read_to_string(dir.join("out/report/fig6-sc25.svg")).unwrap();
    assert!(svg.contains("prompt size (tokens)") && svg.contains("cold pass") && svg.contains("warm pass"));
}

#[test]
fn missing_or_corrupt_tables_are_clear_errors() {
    let dir = setup("report-bad", SPEC.replace("report = true", "report = false").as_str());
    let o = opal_sweep(&["spec.toml", "-o", "out", "-q"], &dir);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!dir.join("out/report").exists(), "no report unless asked for");

    let o = opal_sweep(&["report", "."], &dir);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("manifest.json") && err.contains("results directory"), "{err}");

    std::fs::write(dir.join("out/histograms.parquet"), b"not parquet at all").unwrap();
    let o = opal_sweep(&["report", "out"], &dir);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("histograms.parquet") && err.contains("not a readable Parquet file"), "{err}");

    std::fs::remove_file(dir.join("out/histograms.parquet")).unwrap();
    let o = opal_sweep(&["report", "out"], &dir);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("histograms.parquet") && err.contains("missing"), "{err}");

    std::fs::remove_file(dir.join("out/runs.parquet")).unwrap();
    let o = opal_sweep(&["report", "out"], &dir);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("runs.parquet") && err.contains("missing"), "{err}");
}

#[test]
fn a_one_run_sweep_gets_no_degenerate_figure_and_says_why() {
    // One point, one replicate, one worker, GPU cache only, light load:
    // no percentile figure (four lone dots), no constant active-worker line,
    // no storage-traffic panel, no queue-wait CDF when nothing waits.
    let dir = setup(
        "report-one-run",
        r#"
        [sweep]
        name = "one"
        [kvc]
        kvc_tiers = []
        [model.model_params]
        name = "llama-3.1-8b"
        [[workload.stages]]
        type = "UniformReqRate"
        [workload.stages.workload_params]
        request_rate = 0.5
        total_requests = 30
        prompt_size_min = 500
        prompt_size_max = 2000
        output_tokens_min = 20
        output_tokens_max = 100
        [[workload.stages]]
        type = "UniformReqRate"
        [workload.stages.workload_params]
        request_rate = 1.0
        total_requests = 20
        prompt_size_min = 500
        prompt_size_max = 500
        output_tokens_min = 20
        output_tokens_max = 20
        "#,
    );
    let o = opal_sweep(&["spec.toml", "-o", "out", "-q"], &dir);
    assert!(o.status.success(), "{}", text(&o));
    let o = opal_sweep(&["report", "out"], &dir);
    assert!(o.status.success(), "{}", text(&o));
    let report = dir.join("out/report");
    let html = std::fs::read_to_string(report.join("index.html")).unwrap();
    let files = figure_files(&report);
    assert!(!files.contains("fig3-percentiles.svg"), "{files:?}");
    assert!(html.contains("Figure 3 (percentiles): one grid point"), "says why figure 3 is missing");
    let util = std::fs::read_to_string(report.join("fig5-utilisation.svg")).unwrap();
    assert!(util.contains("GPU busy (% of time)") && util.contains("compute used (% of peak FLOP/s)"));
    assert!(!util.contains(">active workers<"), "a constant worker count is not drawn");
    assert!(html.contains("Not drawn: active workers, 1 throughout."), "and the caption says why");
    let cache = std::fs::read_to_string(report.join("fig4-cache.svg")).unwrap();
    assert!(!cache.contains("KV traffic"), "no storage tier, no traffic panel");
    assert!(html.contains("No storage-tier traffic is drawn"));
    let cdf = std::fs::read_to_string(report.join("fig7-e2e-wait-cdf.svg")).unwrap();
    assert!(cdf.contains("E2E latency (ms), log scale"));
    // The per-stage table: two stages, 30 and 20 requests completed.
    let stages = html.split("Summary per workload stage").nth(1).expect("a per-stage table");
    assert!(stages.contains("<td>0</td><td class=\"l\">UniformReqRate</td><td>30</td>"), "{stages}");
    assert!(stages.contains("<td>1</td><td class=\"l\">UniformReqRate</td><td>20</td>"), "{stages}");
    assert!(!html.contains("single point per line"), "no figure is left with lone dots");
}

#[test]
fn rejected_requests_are_in_the_terminal_table_and_on_the_page() {
    // A trace of 40 requests, every fourth longer than the 1,024-token context (rejected, as vLLM does).
    let trace: String = (0..40)
        .map(|i| {
            let input = if i % 4 == 0 { 1500 } else { 300 };
            format!(
                "{{\"timestamp\": {}, \"input_length\": {input}, \"output_length\": 20, \"hash_ids\": [{i}]}}\n",
                i * 100
            )
        })
        .collect();
    let spec = |limit: u32| {
        format!(
            "[sweep]\nname = \"rej\"\nreport = true\n[grid]\n\"simulation.num_workers\" = [1, 2]\n\
             [model.model_params]\nname = \"llama-3.1-8b\"\n[worker.vllm_params]\nmax_model_len = {limit}\n\
             [[workload.stages]]\ntype = \"Trace\"\n[workload.stages.workload_params]\ntrace_file = \"t.jsonl\"\n"
        )
    };
    let dir = setup("report-rejected", &spec(1024));
    std::fs::write(dir.join("t.jsonl"), &trace).unwrap();
    let o = opal_sweep(&["spec.toml", "-o", "out"], &dir);
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let line = stdout.lines().find(|l| l.starts_with("rejected: ")).unwrap_or_else(|| panic!("{}", text(&o)));
    assert_eq!(
        line,
        "rejected: 20 requests (25.0 %) over max_model_len, in no latency; at points 0: 25.0 %, 1: 25.0 %"
    );
    let html = std::fs::read_to_string(dir.join("out/report/index.html")).unwrap();
    assert!(html.contains("rejected (%)</th>"), "the summary table has a rejected column");
    assert!(html.contains("<td>25</td>"), "with each point's share");
    assert!(
        html.contains("were rejected (as vLLM does) at grid points 0 (25 %), 1 (25 %)"),
        "and a warning names the points"
    );
    // Without rejections, neither.
    let dir = setup("report-not-rejected", &spec(4096));
    std::fs::write(dir.join("t.jsonl"), &trace).unwrap();
    let o = opal_sweep(&["spec.toml", "-o", "out"], &dir);
    assert!(o.status.success() && !String::from_utf8_lossy(&o.stdout).contains("rejected"), "{}", text(&o));
    let html = std::fs::read_to_string(dir.join("out/report/index.html")).unwrap();
    assert!(!html.contains("rejected"), "no rejected column or warning without rejections");
}

/// Checks `doc` against the Trace Event Format (the Chrome / Perfetto JSON
/// trace format, "JSON Object Format"): the events this file writes — `X`
/// complete events with a non-negative `dur`, `i` instant events with a
/// scope `s`, `C` counters with numeric `args`, `M` metadata naming
/// processes and threads — each with its required fields and types, and no
/// two complete events on one track overlapping (Perfetto draws a track's
/// slices as a nested stack). Returns the events.
fn trace_events(doc: &serde_json::Value) -> &Vec<serde_json::Value> {
    let top = doc.as_object().expect("a JSON object");
    assert!(top.get("displayTimeUnit").is_none_or(|u| u == "ms" || u == "ns"));
    let events = top["traceEvents"].as_array().expect("traceEvents is an array");
    let mut slices: std::collections::BTreeMap<(u64, u64), Vec<(f64, f64)>> = Default::default();
    for e in events {
        let name = e["name"].as_str().unwrap_or_else(|| panic!("name: {e}"));
        let ph = e["ph"].as_str().unwrap_or_else(|| panic!("ph: {e}"));
        let pid = e["pid"].as_u64().unwrap_or_else(|| panic!("pid: {e}"));
        match ph {
            "M" => {
                assert!(
                    ["process_name", "thread_name", "process_sort_index", "thread_sort_index"].contains(&name),
                    "{e}"
                );
                assert!(e["args"].is_object() && e["tid"].is_u64(), "{e}");
                continue;
            }
            "X" | "i" | "C" => {}
            other => panic!("phase {other} is not written: {e}"),
        }
        let ts = e["ts"].as_f64().unwrap_or_else(|| panic!("ts: {e}"));
        assert!(ts >= 0.0, "{e}");
        match ph {
            "X" => {
                let dur = e["dur"].as_f64().unwrap_or_else(|| panic!("dur: {e}"));
                assert!(dur >= 0.0 && e["tid"].is_u64(), "{e}");
                slices.entry((pid, e["tid"].as_u64().unwrap())).or_default().push((ts, ts + dur));
            }
            "i" => assert!(["g", "p", "t"].contains(&e["s"].as_str().unwrap_or("t")), "{e}"),
            _ => assert!(e["args"].as_object().unwrap().values().all(serde_json::Value::is_number), "{e}"),
        }
    }
    for (track, mut s) in slices {
        s.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert!(s.windows(2).all(|w| w[0].1 <= w[1].0 + 1e-3), "slices overlap on track {track:?}");
    }
    events
}

#[test]
fn a_runs_steps_become_a_trace_event_timeline_perfetto_opens() {
    // Two workers, prompts up to 8k tokens at a rate that preempts, a CPU tier.
    let spec = r#"
[sweep]
name = "tl"
tables = ["runs", "steps", "workers"]
replicates = 2
[simulation]
num_workers = 2
[model.model_params]
name = "llama-3.1-8b"
[kvc]
kvc_tiers = ["CPUMemory"]
[[workload.stages]]
type = "ExponentialReqRate"
[workload.stages.workload_params]
request_rate = 30.0
total_requests = 400
prompt_size_min = 512
prompt_size_max = 8192
output_tokens_min = 32
output_tokens_max = 256
"#;
    let dir = setup("timeline", spec);
    assert!(opal_sweep(&["spec.toml", "-o", "out", "-q"], &dir).status.success());
    let o = opal_sweep(&["timeline", "out", "-o", "t.json"], &dir);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("timeline: t.json (run 0, "), "{}", text(&o));
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("t.json")).unwrap()).unwrap();
    let events = trace_events(&doc);
    // One complete event per step of run 0, whose durations add up to each worker's busy time.
    let steps = read(&dir.join("out/steps.parquet"));
    let run_ids = opal::output::f64_column(&steps, "run_id").unwrap();
    let of_run = |r: f64| run_ids.iter().filter(|&&x| x == Some(r)).count();
    let slices: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(slices.len(), of_run(0.0));
    let workers = read(&dir.join("out/workers.parquet"));
    let busy = opal::output::f64_column(&workers, "busy_s").unwrap();
    for (w, busy) in busy.iter().take(2).enumerate() {
        let sum: f64 =
            slices.iter().filter(|e| e["pid"] == w as u64 + 1).map(|e| e["dur"].as_f64().unwrap()).sum::<f64>() / 1e6;
        assert!((sum - busy.unwrap()).abs() < 1e-6, "worker {w}: {sum} s of steps, {busy:?} s busy");
    }
    // The preemptions marked are the run's, and KV saves are marked (a CPU tier, saved as computed).
    let runs = read(&dir.join("out/runs.parquet"));
    let preemptions = opal::output::f64_column(&runs, "preemptions").unwrap()[0].unwrap();
    // Run 1's steps, found by the row groups' run-id statistics, with no limit that matters.
    let o = opal_sweep(&["timeline", "out", "--run", "1", "-o", "r1.json", "--max-steps", "1000000000"], &dir);
    assert!(o.status.success(), "{}", text(&o));
    let r1: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("r1.json")).unwrap()).unwrap();
    assert_eq!(trace_events(&r1).iter().filter(|e| e["ph"] == "X").count(), of_run(1.0));
    assert_eq!(r1["otherData"]["run_id"], 1);
    let marked: f64 =
        events.iter().filter(|e| e["name"] == "preempt").map(|e| e["args"]["requests"].as_f64().unwrap()).sum();
    assert!(preemptions > 0.0, "the scenario preempts");
    assert_eq!(marked, preemptions);
    assert!(events.iter().any(|e| e["name"] == "KV save"));
    // Bounded: --max-steps keeps the earliest steps and says where it cut.
    let o = opal_sweep(&["timeline", "out", "-o", "cut.json", "--max-steps", "10"], &dir);
    assert!(String::from_utf8_lossy(&o.stdout).contains("(the first 10 of "), "{}", text(&o));
    let cut: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("cut.json")).unwrap()).unwrap();
    assert_eq!(trace_events(&cut).iter().filter(|e| e["ph"] == "X").count(), 10);
    assert!(cut["otherData"]["cut_at_s"].is_number());
    // Without a steps table: exit 2 with the fix.
    let o = opal_sweep(&["timeline", "out", "--run", "5"], &dir);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("run 5 has no steps"), "{}", text(&o));
    std::fs::remove_file(dir.join("out/steps.parquet")).unwrap();
    let o = opal_sweep(&["timeline", "out"], &dir);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("fix: add \"steps\""), "{}", text(&o));
}
