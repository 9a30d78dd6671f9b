//! A measured `vllm bench serve` run in (the `VllmBench` stage), vLLM's
//! result format out (`vllm-result`) and the two held against each other
//! (`compare`), on a result file written here from known numbers.

use crate::sweep::opal_sweep;
use arrow_array::Array;
use std::path::Path;

/// 200 successful requests and one failed one, as `vllm bench serve
/// --save-result --save-detailed` writes them: request i has 100 + 10·(i mod 5)
/// prompt tokens (24,000 in all) and 10·(1 + i mod 4) output tokens (5,000),
/// was sent at 5000.25 + i s, and measured TTFT 12 ms and every ITL 8 ms, so
/// its latency is 12 + 8·(output − 1) ms: 84, 164, 244 or 324 ms, 50 each.
/// The summary records duration, completed, failed, request_throughput and
/// TTFT; TPOT, ITL and E2EL are left to the per-request detail.
fn measured(start_times: bool, rate: &str, max_concurrency: &str) -> String {
    let n = 200;
    let list = |f: &dyn Fn(usize) -> String, failed: &str| {
        let mut v: Vec<String> = (0..n).map(f).collect();
        v.push(failed.to_string());
        v.join(", ")
    };
    let out = |i: usize| 10 * (1 + i % 4);
    let timing = if start_times {
        format!(r#""start_times": [{}],"#, list(&|i| format!("{}", 5000.25 + i as f64), "5200.25"))
    } else {
        String::new()
    };
    format!(
        r#"{{"date": "20261205-101500", "backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B-Instruct",
  "num_prompts": 201, "request_rate": {rate}, "burstiness": Infinity_placeholder, "max_concurrency": {max_concurrency},
  "duration": 200.4, "completed": 200, "failed": 1, "total_input_tokens": 24000, "total_output_tokens": 5000,
  "request_throughput": 0.998003992015968,
  "input_lens": [{}], "output_lens": [{}], "ttfts": [{}], "itls": [{}], {timing}
  "errors": [{}], "generated_texts": [{}],
  "mean_ttft_ms": 12.0, "median_ttft_ms": 12.0, "std_ttft_ms": 0.0, "p99_ttft_ms": 12.0}}"#,
        list(&|i| format!("{}", 100 + 10 * (i % 5)), "100"),
        list(&|i| format!("{}", out(i)), "0"),
        list(&|_| "0.012".into(), "0.0"),
        list(&|i| format!("[{}]", vec!["0.008"; out(i) - 1].join(", ")), "[]"),
        list(&|_| "\"\"".into(), "\"Timeout\""),
        list(&|_| "\"text\"".into(), "\"\""),
    )
    .replace("Infinity_placeholder", if start_times { "1.0" } else { "\"inf\"" })
}

/// A spec replaying `file` on one worker whose every step takes 10 ms: no
/// request waits (they are 1 s apart), so TTFT = TPOT = ITL = 10 ms and E2E
/// = 10 ms × output tokens.
fn spec(file: &Path, extra: &str) -> String {
    format!(
        r#"
[simulation]
seed = 1
[worker.inference_params]
model = "synthetic"
mean_latency_secs = 0.010
[kvc]
kvc_tiers = []
[[workload.stages]]
type = "VllmBench"
[workload.stages.workload_params]
result_file = "{}"
{extra}
"#,
        file.display()
    )
}

#[test]
fn a_measured_run_replays_and_compare_prints_errors_that_hand_arithmetic_gives() {
    let dir = crate::temp_dir("vllm-compare");
    let file = dir.join("measured.json");
    std::fs::write(&file, measured(true, "1.0", "null")).unwrap();
    std::fs::write(dir.join("spec.toml"), spec(&file, "")).unwrap();
    let run = opal_sweep(&["spec.toml", "-o", "out", "-q"], &dir);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let cmp = opal_sweep(&["compare", "measured.json", "out"], &dir);
    let text = String::from_utf8_lossy(&cmp.stdout);
    assert!(cmp.status.success(), "{text}{}", String::from_utf8_lossy(&cmp.stderr));
    // The printed table names each field with its error.
    assert!(text.contains("mean_ttft_ms") && text.contains("-16.7 %"), "{text}");

    let table = opal::output::read_table(&dir.join("out/compare-run0.parquet")).unwrap();
    let b = &table[0];
    let fields: Vec<String> = b
        .column_by_name("field")
        .map(|c| {
            let s = c.as_any().downcast_ref::<arrow_array::StringArray>().unwrap();
            (0..s.len()).map(|i| s.value(i).to_string()).collect()
        })
        .unwrap();
    let num = |name: &str| opal::output::f64_column(b, name).unwrap();
    let (meas, sim, err) = (num("measured"), num("simulated"), num("error_pct"));
    let row = |f: &str| {
        let i = fields.iter().position(|x| x == f).unwrap_or_else(|| panic!("no row {f}: {fields:?}"));
        (meas[i].unwrap(), sim[i].unwrap(), err[i].unwrap_or(f64::NAN))
    };
    let close = |a: f64, b: f64, tol: f64| (a - b).abs() <= tol;
    // The replay: the 200 successful requests, the failed one left out, each
    // sent at its recorded time less the first's (0 … 199 s): the last, of 40
    // tokens, ends at 199 + 0.4 s.
    assert_eq!(row("completed"), (200.0, 200.0, 0.0));
    assert_eq!(row("total_input_tokens"), (24_000.0, 24_000.0, 0.0));
    assert_eq!(row("total_output_tokens"), (5_000.0, 5_000.0, 0.0));
    let (m, s, e) = row("duration");
    assert!(m == 200.4 && close(s, 199.4, 1e-9) && close(e, 100.0 * (199.4 - 200.4) / 200.4, 1e-9));
    let (m, s, e) = row("failed");
    assert!(m == 1.0 && s == 0.0 && e == -100.0);
    // Recorded TTFT 12 ms against the simulated 10: −16.67 %.
    let (m, s, e) = row("mean_ttft_ms");
    assert!(m == 12.0 && close(s, 10.0, 1e-9) && close(e, -100.0 / 6.0, 1e-9), "{m} {s} {e}");
    assert!(row("p99_ttft_ms").2 < -16.0);
    // From the detail: TPOT (latency − TTFT) / (output − 1) = 8 ms, every ITL 8 ms; simulated 10: +25 %.
    for f in ["mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms"] {
        let (m, s, e) = row(f);
        assert!(close(m, 8.0, 1e-9) && close(s, 10.0, 1e-9) && close(e, 25.0, 1e-6), "{f}: {m} {s} {e}");
    }
    // E2EL measured: mean of 84, 164, 244, 324 = 204 ms; simulated 10 ms ×
    // (10, 20, 30, 40) tokens, mean 250: +22.55 %. numpy's p99 of the
    // measured lies between two 324s; simulated p99 400 ms: +23.46 %.
    let (m, s, e) = row("mean_e2el_ms");
    assert!(close(m, 204.0, 1e-9) && close(s, 250.0, 1e-9) && close(e, 100.0 * 46.0 / 204.0, 1e-9), "{m} {s} {e}");
    let (m, s, e) = row("p99_e2el_ms");
    assert!(close(m, 324.0, 1e-9) && close(s, 400.0, 1e-9) && close(e, 100.0 * 76.0 / 324.0, 1e-9), "{m} {s} {e}");
    // numpy's median interpolates: (164 + 244) / 2; std is the population's:
    // deviations ±40, ±120 → √8000 = 89.44; simulated √12500 = 111.80 (HDR, 3 digits).
    assert!(close(row("median_e2el_ms").0, 204.0, 1e-9));
    let (m, s, _) = row("std_e2el_ms");
    assert!(close(m, 8000f64.sqrt(), 1e-9) && close(s, 12_500f64.sqrt(), 0.2), "{m} {s}");
    assert!(row("std_ttft_ms").2.is_nan(), "a measured 0 has no relative error (null in the table)");

    // The exported result: JSON with vLLM's field names.
    let exp = opal_sweep(&["vllm-result", "out", "--metric-percentiles", "50,99.9"], &dir);
    assert!(exp.status.success(), "{}", String::from_utf8_lossy(&exp.stderr));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("out/vllm/run-0.json")).unwrap()).unwrap();
    for key in [
        "completed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "mean_ttft_ms",
        "median_tpot_ms",
        "std_itl_ms",
        "p99.9_e2el_ms",
        "p50_ttft_ms",
        "duration",
    ] {
        assert!(json.get(key).is_some_and(|v| v.is_number()), "{key} missing from {json}");
    }
    assert_eq!(json["completed"], 200);
    assert_eq!(json["total_output_tokens"], 5000);
    assert!(close(json["output_throughput"].as_f64().unwrap(), 5000.0 / 199.4, 1e-9));
}

fn sim_time(file: &Path, extra: &str) -> f64 {
    crate::run(&crate::scenario(&spec(file, extra))).summary.sim_time_s
}

#[test]
fn without_start_times_requests_go_out_as_vllm_schedules_them() {
    let dir = crate::temp_dir("vllm-timing");
    let file = dir.join("rate.json");
    // A rate with fixed gaps (burstiness inf): vLLM spreads the 201 listed
    // requests at 0.5 s gaps rescaled to end at 201 / 2 s, so request i goes
    // out at (i + 1) / 2 s; the last successful one (i = 199, 40 tokens) at 100 s.
    std::fs::write(&file, measured(false, "2.0", "null")).unwrap();
    assert!((sim_time(&file, "") - 100.4).abs() < 1e-9);
    // The stage's own rate replaces the file's: 2.2 requests/s (gaps longer
    // than the longest request's 0.4 s) → the last at 200 / 2.2 s.
    let t = sim_time(&file, "request_rate = 2.2\nburstiness = inf");
    assert!((t - (200.0 / 2.2 + 0.4)).abs() < 1e-6, "{t}");
    // All at once, one in flight (vLLM's --max-concurrency 1): one after
    // another, Σ 10 ms × output = 50 s.
    std::fs::write(&file, measured(false, "\"inf\"", "1")).unwrap();
    assert!((sim_time(&file, "") - 50.0).abs() < 1e-9);
    // … unless the stage lifts the cap: every request at 0, served in one batch.
    assert!(sim_time(&file, "max_outstanding_requests = -1") < 1.0);
    // Poisson gaps (burstiness 1) are drawn from the run's seed and rescaled
    // so that the last listed request (the failed one) goes out at 100.5 s:
    // the last replayed one goes out before it.
    let poisson = measured(false, "2.0", "null").replace("\"burstiness\": \"inf\"", "\"burstiness\": 1.0");
    std::fs::write(&file, poisson).unwrap();
    let t = sim_time(&file, "");
    assert!(t > 90.0 && t < 100.9, "{t}");
    assert_eq!(t, sim_time(&file, ""), "the same seed draws the same gaps");
}

#[test]
fn a_result_without_detail_or_with_uneven_lists_is_refused_with_the_fix() {
    let dir = crate::temp_dir("vllm-bad");
    let file = dir.join("bad.json");
    let refuse = |text: &str, needle: &str| {
        std::fs::write(&file, text).unwrap();
        let parsed = opal::config::parse_spec(&spec(&file, ""), "t.toml").unwrap();
        let e = opal::config::resolve(&parsed, "t.toml", Path::new(".")).unwrap_err().to_string();
        assert!(e.contains("bad.json") && e.contains(needle), "{e}");
    };
    refuse(r#"{"completed": 3, "mean_ttft_ms": 10.0}"#, "--save-detailed");
    refuse(r#"{"input_lens": [1, 2], "output_lens": [3]}"#, "output_lens has 1 entries but input_lens has 2");
    refuse(r#"{"input_lens": [1], "output_lens": [0], "errors": ["boom"]}"#, "no successful request");
    refuse("[1, 2", "not a vllm bench serve result");
    refuse(r#"{"input_lens": [1], "output_lens": [2], "request_rate": -3}"#, "not a positive rate");
}
