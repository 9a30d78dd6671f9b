//! Human-readable summaries for the terminal.

use crate::metrics::RunSummary;
use std::fmt::Write;

/// A summary table of one run.
pub fn summary_table(s: &RunSummary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "requests: {} generated, {} completed, {} incomplete   simulated {:.1} s ({} events, stop: {:?})",
        s.requests_generated, s.requests_completed, s.requests_incomplete, s.sim_time_s, s.events, s.stop_reason
    );
    let _ = writeln!(
        out,
        "throughput: {:.1} req/s, {:.0} prompt tok/s, {:.0} output tok/s   GPU util {:.1} %   preemptions {}   workers {}",
        s.requests_per_s,
        s.input_tokens_per_s,
        s.output_tokens_per_s,
        100.0 * s.gpu_utilization,
        s.preemptions,
        s.workers
    );
    let _ = writeln!(
        out,
        "{:<12}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
        "latency ms", "p50", "p90", "p95", "p99", "p99.9", "mean", "max"
    );
    for (name, st) in [
        ("TTFT", &s.ttft_ms),
        ("TPOT", &s.tpot_ms),
        ("ITL", &s.itl_ms),
        ("E2E", &s.e2e_ms),
        ("queue wait", &s.queue_wait_ms),
    ] {
        let _ = write!(out, "{name:<12}");
        for (_, v) in st.fields() {
            let _ = write!(out, "{:>10}", format_ms(v));
        }
        out.push('\n');
    }
    out
}

fn format_ms(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}
