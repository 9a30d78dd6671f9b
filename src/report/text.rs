//! Human-readable summaries for the terminal.

use crate::metrics::RunSummary;
use std::fmt::Write;

/// `n` and `noun`, plural unless `n` is 1 (`1 run`, `3 runs`, `2 points`).
pub fn count(n: impl Into<u64>, noun: &str) -> String {
    match n.into() {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}

/// A summary table of one run.
pub fn summary_table(s: &RunSummary) -> String {
    let mut out = String::new();
    // Rejected requests (longer than max_model_len) are shown whenever there are any.
    let rejected = match s.requests_rejected {
        0 => String::new(),
        n => format!(
            ", {n} rejected ({:.1} %: longer than max_model_len)",
            100.0 * n as f64 / s.requests_generated.max(1) as f64
        ),
    };
    let _ = writeln!(
        out,
        "requests: {} generated, {} completed{rejected}, {} incomplete   simulated {:.1} s ({} events, stop: {:?})",
        s.requests_generated, s.requests_completed, s.requests_incomplete, s.sim_time_s, s.events, s.stop_reason
    );
    let _ = writeln!(
        out,
        "throughput: {:.1} req/s, {:.0} prompt tok/s, {:.0} output tok/s   preemptions {}   workers {}",
        s.requests_per_s, s.input_tokens_per_s, s.output_tokens_per_s, s.preemptions, s.workers
    );
    let _ = writeln!(
        out,
        "GPUs: busy {:.1} % of the time; the steps used {:.1} % of their peak compute and {:.1} % of their peak HBM bandwidth",
        100.0 * s.gpu_busy_fraction,
        100.0 * s.gpu_compute_fraction,
        100.0 * s.gpu_hbm_fraction
    );
    out.push_str(&cost_line(s));
    let pd = &s.pd;
    if pd.remote_prefills + pd.local_prefills > 0 {
        let _ = writeln!(
            out,
            "disaggregated: {} prefilled on the prefill pool, {} on their decode worker; KV transfer p50 {} / p99 {} ms, {:.2} GB over links ({:.1} % busy); first token to first decode step p50 {} / p99 {} ms; busy: prefill pool {:.1} %, decode pool {:.1} %",
            pd.remote_prefills,
            pd.local_prefills,
            format_ms(pd.kv_transfer_ms.p50),
            format_ms(pd.kv_transfer_ms.p99),
            pd.link_bytes as f64 / 1e9,
            100.0 * pd.link_utilization,
            format_ms(pd.first_decode_ms.p50),
            format_ms(pd.first_decode_ms.p99),
            100.0 * pd.prefill_busy_fraction,
            100.0 * pd.decode_busy_fraction
        );
    }
    out.push_str(&cache_line(&s.tiers));
    if s.trace_lines_skipped + s.trace_lines_reordered + s.trace_outputs_raised > 0 {
        let _ = writeln!(
            out,
            "trace: {} malformed lines skipped, {} lines earlier than the line before (sent at once), {} with output_length 0 (sent with 1 token)",
            s.trace_lines_skipped, s.trace_lines_reordered, s.trace_outputs_raised
        );
    }
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
    out.push_str(&steady_line(&s.steady));
    out
}

/// Whether the run reached a steady state, and its latencies after the warm-up.
fn steady_line(st: &crate::metrics::steady::SteadySummary) -> String {
    use crate::metrics::steady::Stability;
    match st.stability {
        Stability::Stable => format!(
            "steady state: stable; warm-up {} requests ({:.1} s, MSER-5), then TTFT p50 {} / p99 {} ms, TPOT p99 {} ms over {} requests\n",
            st.warmup_requests,
            st.warmup_s,
            format_ms(st.ttft_ms.p50),
            format_ms(st.ttft_ms.p99),
            format_ms(st.tpot_ms.p99),
            st.steady_requests
        ),
        Stability::Unstable => {
            "steady state: UNSTABLE: the queue kept growing through the run's second half (offered load above capacity); its latencies grow with the run's length\n".into()
        }
        Stability::TooShort => {
            "steady state: too short to tell (fewer than 100 requests, or a warm-up past the middle of the run): run more requests before trusting the percentiles\n".into()
        }
    }
}

/// The cost line of a run summary: GPU-hours, energy, dollars.
fn cost_line(s: &RunSummary) -> String {
    let k = &s.cost;
    let output = s.output_tokens_per_s * s.sim_time_s;
    let mut line = format!("cost: {:.3} GPU-hours", k.gpu_hours);
    if k.energy_j.is_finite() {
        let _ = write!(
            line,
            ", {:.3} kWh (mean {:.0} W per GPU, {:.3} J per output token)",
            k.energy_j / 3.6e6,
            s.gpu_power_w(),
            k.energy_j / output
        );
    }
    if k.usd.is_finite() {
        let input = s.input_tokens_per_s * s.sim_time_s;
        let tiers =
            if s.tier_cost.usd > 0.0 { format!(", ${:.2} of it KV tiers", s.tier_cost.usd) } else { String::new() };
        let _ = write!(
            line,
            ", ${:.2} (${:.3} per million input tokens, ${:.3} per million output tokens{tiers})",
            k.usd,
            k.usd / input * 1e6,
            k.usd / output * 1e6
        );
    } else {
        line.push_str("; set worker.hw.usd_per_gpu_hour for dollars");
    }
    line.push('\n');
    line
}

/// The KV-cache line of a run summary: the prefix-hit ratio, its split by
/// tier (GPU always; a storage tier when it served hits or moved bytes) and
/// the bytes each storage tier read and wrote.
fn cache_line(t: &crate::metrics::TierSummary) -> String {
    use crate::kvcache::Tier;
    let used = |tier: Tier| {
        let i = tier.index();
        tier == Tier::Gpu || t.hit_tokens[i] > 0 || t.bytes_read[i] > 0 || t.bytes_written[i] > 0
    };
    let split: Vec<String> = Tier::ALL
        .iter()
        .filter(|&&tier| used(tier))
        .map(|&tier| format!("{} {:.1} %", tier.opal_name(), 100.0 * t.hit_ratio(tier)))
        .collect();
    let mut line =
        format!("KV cache: prefix hit {:.1} % of prompt tokens ({})", 100.0 * t.prefix_hit_ratio(), split.join(", "));
    for &tier in &Tier::ALL[1..] {
        if used(tier) {
            let i = tier.index();
            let gb = |b: u64| b as f64 / 1e9;
            let _ = write!(
                line,
                "   {} read {:.2} GB, wrote {:.2} GB",
                tier.opal_name(),
                gb(t.bytes_read[i]),
                gb(t.bytes_written[i])
            );
        }
    }
    line.push('\n');
    line
}

/// One line per workload stage of a run (as the Python Opal summarises
/// each stage): requests, throughput over the stage's span, latencies.
pub fn stage_table(rows: &[crate::metrics::StageRow]) -> String {
    let mut out = format!(
        "{:<24}{:>10}{:>9}{:>11}{:>11}{:>11}{:>11}{:>11}{:>8}\n",
        "stage", "completed", "req/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "E2E p99", "hit %"
    );
    for r in rows {
        let rate = if r.requests_per_s.is_nan() { MISSING.into() } else { format!("{:.2}", r.requests_per_s) };
        let hit =
            if r.prefix_hit_ratio.is_nan() { MISSING.into() } else { format!("{:.1}", 100.0 * r.prefix_hit_ratio) };
        let _ = writeln!(
            out,
            "{:<24}{:>10}{:>9}{:>11}{:>11}{:>11}{:>11}{:>11}{:>8}",
            format!("{} {}", r.stage, r.kind),
            r.requests_completed,
            rate,
            format_ms(r.ttft_ms.p50),
            format_ms(r.ttft_ms.p99),
            format_ms(r.tpot_ms.p50),
            format_ms(r.tpot_ms.p99),
            format_ms(r.e2e_ms.p99),
            hit
        );
    }
    out.push_str("(latencies in ms; rates over each stage's span, first arrival to last response)\n");
    out
}

/// A search's answers, one line per grid point.
pub fn search_table(r: &crate::sweep::search::SearchReport) -> String {
    let s = &r.spec;
    let what = if s.maximize { "largest" } else { "smallest" };
    let slo = s.slo.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    let mut out = format!("{what} {} meeting {slo}:\n", s.parameter);
    let _ =
        write!(out, "{:>6}  {:>12}  {:<12}{:>8}  {:>6}  {:>9}", "point", "found", "status", "probes", "GPUs", "$/h");
    for c in &s.slo {
        let _ = write!(out, "  {:>14}", c.metric);
    }
    out.push_str("  axis values\n");
    for (id, desc, st) in &r.points {
        let found = st.answer(s);
        let _ = write!(
            out,
            "{id:>6}  {:>12}  {:<12}{:>8}",
            found.map_or(MISSING.to_string(), |v| format!("{v:.4}")
                .trim_end_matches('0')
                .trim_end_matches('.')
                .to_string()),
            st.status.map_or("interrupted", crate::sweep::search::Status::name),
            st.probes.len()
        );
        // An infeasible point shows what its good bound reached, so the
        // reader sees how far from the SLO it is.
        let at = match found {
            Some(v) => st.probes.iter().find(|p| p.pass && p.value == v),
            None => st.probes.first(),
        };
        // What the answer costs: GPUs (tp × workers, every pool) and dollars per hour.
        let (gpus, usd) = at.map_or((f64::NAN, f64::NAN), |p| (p.mean_gpus(), p.mean_usd_per_hour()));
        let shown = |v: f64, f: &dyn Fn(f64) -> String| if v.is_finite() { f(v) } else { MISSING.to_string() };
        let _ = write!(
            out,
            "  {:>6}  {:>9}",
            shown(gpus, &|v| if (v - v.round()).abs() < 1e-9 { format!("{v:.0}") } else { format!("{v:.1}") }),
            shown(usd, &|v| format!("{v:.2}"))
        );
        for i in 0..s.slo.len() {
            let v = at.map_or(f64::NAN, |p| p.means[i]);
            let _ = write!(out, "  {:>14}", if v.is_nan() { MISSING.to_string() } else { format!("{v:.2}") });
        }
        let _ = writeln!(out, "  {desc}");
    }
    let points = |pick: &dyn Fn(&crate::sweep::search::PointSearch) -> bool| {
        r.points.iter().filter(|(_, _, st)| pick(st)).map(|(id, _, _)| id.to_string()).collect::<Vec<_>>()
    };
    let odd = points(&|st| st.status == Some(crate::sweep::search::Status::NonMonotone));
    if !odd.is_empty() {
        let _ = writeln!(
            out,
            "non-monotone at {} {}: a value beyond the first failing one passed (noise, or a metric not monotone in the parameter); the answer is the best value short of the first failure (the probes are in runs.parquet)",
            if odd.len() == 1 { "point" } else { "points" },
            odd.join(", ")
        );
    }
    let infeasible = points(&|st| st.status == Some(crate::sweep::search::Status::Infeasible));
    if !infeasible.is_empty() {
        let bound = if s.maximize { s.min } else { s.max };
        let _ = writeln!(
            out,
            "infeasible at {} {}: even {} = {bound} misses the SLO (the metrics shown are that probe's means)",
            if infeasible.len() == 1 { "point" } else { "points" },
            infeasible.join(", "),
            s.parameter
        );
    }
    let short: Vec<String> = r
        .points
        .iter()
        .filter(|(_, _, st)| st.status == Some(crate::sweep::search::Status::TooShort))
        .map(|(id, _, st)| format!("point {id}: runs of ≈ {} requests", st.requests_needed(s)))
        .collect();
    if !short.is_empty() {
        let _ = writeln!(
            out,
            "too short: a probe beyond the answer failed because most of its runs ended before a steady state, so the answer may still move with the run's length ({}: an estimate from those runs' warm-up and queue drains — set the stage's total_requests; if runs that long are too short too, the search says so again)",
            short.join("; ")
        );
    }
    let unstable: u32 = r.points.iter().map(|(_, _, st)| st.unstable()).sum();
    if unstable > 0 {
        let _ = writeln!(
            out,
            "{} unstable (their queue kept growing); a probe where most were failed",
            if unstable == 1 { "1 run was".to_string() } else { format!("{unstable} runs were") }
        );
    }
    // Too-short runs where they matter: at the answer and the first failing value beyond it.
    let mut at_answer = Vec::new();
    for (id, _, st) in &r.points {
        let (pass, fail) = st.bracket(s);
        let probes = st.probes.iter().filter(|p| Some(p.value) == pass || Some(p.value) == fail);
        let (short, runs) = probes.fold((0, 0), |(a, b), p| (a + p.too_short, b + p.runs));
        if short > 0 {
            at_answer.push(format!("point {id}: {short} of {runs}"));
        }
    }
    if !at_answer.is_empty() {
        let _ = writeln!(
            out,
            "warning: runs at the answer and the first failing value were too short to tell whether they reached a steady state ({}): the answer may still move with the run's length — run more requests per probe",
            at_answer.join("; ")
        );
    } else if r.points.iter().any(|(_, _, st)| st.too_short() > 0) {
        out.push_str("note: some probes far from the answers had runs too short to judge (the stability column of runs.parquet)\n");
    }
    if s.max_replicates == 1 {
        out.push_str("warning: one replicate per probe (max_replicates = 1) gives no confidence interval: the answer may be optimistic by the run-to-run noise\n");
    }
    out
}

/// A Pareto search's frontiers: per grid point, its frontier points by the first objective.
pub fn pareto_table(r: &crate::sweep::pareto::ParetoReport) -> String {
    let s = &r.spec;
    let objectives = s.objectives.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    let mut out = format!("Pareto frontier of {objectives}:\n");
    let _ = write!(out, "{:>6}", "point");
    for (p, _, _) in &s.parameters {
        let _ = write!(out, "  {:>14}", p.rsplit('.').next().unwrap_or(p));
    }
    for o in &s.objectives {
        let _ = write!(out, "  {:>16}", o.metric);
    }
    out.push_str("  axis values\n");
    for (id, desc, st) in &r.points {
        let mut frontier = st.frontier(s);
        frontier.sort_by(|&a, &b| st.evaluated[a].objectives[0].total_cmp(&st.evaluated[b].objectives[0]));
        if frontier.is_empty() {
            let _ = writeln!(out, "{id:>6}  no evaluated point is feasible  {desc}");
        }
        for i in frontier {
            let e = &st.evaluated[i];
            let _ = write!(out, "{id:>6}");
            for ((_, values, _), k) in s.parameters.iter().zip(s.position(e.index)) {
                let v = values[k].to_string();
                let _ = write!(out, "  {:>14}", v.trim_matches('"'));
            }
            for v in &e.objectives {
                let _ = write!(out, "  {:>16}", format!("{v:.4}"));
            }
            let _ = writeln!(out, "  {desc}");
        }
    }
    out
}

/// Cold vs warm TTFT per prompt size of an `SC25Workload` stage.
pub fn sc25_table(rows: &[crate::metrics::Sc25Row]) -> String {
    let mut out = format!(
        "{:>14}{:>14}{:>14}{:>10}{:>16}{:>14}\n",
        "SC25 prompt", "cold TTFT ms", "warm TTFT ms", "speed-up", "warm computed", "warm fetch ms"
    );
    for r in rows {
        let ms = |v: Option<f64>| v.map_or("-".into(), format_ms);
        let speedup = match (r.cold_ttft_ms, r.warm_ttft_ms) {
            (Some(c), Some(w)) if w > 0.0 => format!("{:.1}×", c / w),
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "{:>14}{:>14}{:>14}{:>10}{:>16}{:>14}",
            r.prompt_tokens,
            ms(r.cold_ttft_ms),
            ms(r.warm_ttft_ms),
            speedup,
            r.warm_prefill_tokens,
            ms(r.warm_kv_fetch_ms)
        );
    }
    out
}

/// How a missing number is shown in every terminal table.
pub const MISSING: &str = "–";

fn format_ms(v: f64) -> String {
    if v.is_nan() {
        MISSING.into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// The expanded runs of a sweep, one line each.
pub fn dry_run(plan: &crate::sweep::SweepPlan) -> String {
    let mut out = format!(
        "{}: {} × {} = {} (base_seed {})\n{:>6} {:>6} {:>4} {:>20}  overrides\n",
        plan.name,
        count(plan.points.len() as u64, "point"),
        count(plan.replicates, "replicate"),
        count(plan.total_runs(), "run"),
        plan.base_seed,
        "run",
        "point",
        "rep",
        "seed"
    );
    for run in plan.runs() {
        let m = run.meta;
        let status = match &run.point.scenario {
            Ok(_) => String::new(),
            Err(e) => format!("  [will fail: {}]", e.message),
        };
        let _ = writeln!(
            out,
            "{:>6} {:>6} {:>4} {:>20}  {}{status}",
            m.run_id,
            m.point_id,
            m.replicate,
            m.seed,
            run.point.describe()
        );
    }
    out
}

/// One line per grid point: replicate means of key metrics (TTFT and
/// TPOT in ms, requests/s, GPU busy time, prefix-hit ratio), then the
/// point's axis values, cut to `width` characters (a terminal's width).
pub fn sweep_table(
    plan: &crate::sweep::SweepPlan,
    points: &std::collections::BTreeMap<u32, crate::sweep::runner::PointTally>,
    width: usize,
) -> String {
    let fixed = |cells: [&str; 8]| {
        format!(
            "{:>5} {:>5} {:>12} {:>12} {:>12} {:>8} {:>7} {:>6}",
            cells[0], cells[1], cells[2], cells[3], cells[4], cells[5], cells[6], cells[7]
        )
    };
    let head = fixed(["point", "ok", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "req/s", "busy %", "hit %"]);
    // Axis values, abbreviated: each path to its last distinct component,
    // strings unquoted. If `label=value` pairs do not fit beside the
    // numbers, the header names the axes once and rows give values only;
    // what still does not fit wraps onto continuation lines — the column
    // that tells rows apart is never cut.
    let room = width.saturating_sub(head.chars().count() + 2).max(20);
    let paths: Vec<String> =
        plan.points.first().map_or_else(Vec::new, |p| p.overrides.iter().map(|(k, _)| k.clone()).collect());
    let labels = crate::report::data::short_labels(&paths);
    let value = |v: &toml::Value| match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string().replace('"', ""),
    };
    let cells = |id: u32| -> Vec<String> { plan.points[id as usize].overrides.iter().map(|(_, v)| value(v)).collect() };
    let pairs = |id: u32| labels.iter().zip(cells(id)).map(|(l, v)| format!("{l}={v}")).collect::<Vec<_>>();
    let widest = points.keys().map(|&id| pairs(id).join(", ").chars().count()).max().unwrap_or(0);
    let named = widest <= room;
    let mut out = String::new();
    if !named && !paths.is_empty() {
        let _ = writeln!(out, "axis values, in this order: {}", labels.join(" · "));
    }
    out.push_str(&head);
    out.push_str("  axis values\n");
    let number = |v: f64, digits: usize| if v.is_nan() { MISSING.to_string() } else { format!("{v:.digits$}") };
    let indent = " ".repeat(width.saturating_sub(room).min(200));
    for (&id, t) in points {
        let [ttft50, ttft99, tpot50, rps, busy, hit] = t.means();
        let mut line = fixed([
            &id.to_string(),
            &format!("{}/{}", t.ok, t.runs),
            &format_ms(ttft50),
            &format_ms(ttft99),
            &format_ms(tpot50),
            &number(rps, 2),
            &number(100.0 * busy, 1),
            &number(100.0 * hit, 1),
        ]);
        line.push_str("  ");
        let parts = if paths.is_empty() {
            vec!["(base scenario)".to_string()]
        } else if named {
            pairs(id)
        } else {
            cells(id)
        };
        let sep = if named { ", " } else { " · " };
        // Greedy wrap at separators.
        let mut current = String::new();
        let mut wrapped = Vec::new();
        for part in parts {
            let add =
                if current.is_empty() { part.chars().count() } else { sep.chars().count() + part.chars().count() };
            if !current.is_empty() && current.chars().count() + add > room {
                wrapped.push(std::mem::take(&mut current));
            }
            if !current.is_empty() {
                current.push_str(sep);
            }
            current.push_str(&part);
        }
        wrapped.push(current);
        line.push_str(&wrapped[0]);
        out.push_str(&line);
        out.push('\n');
        for more in &wrapped[1..] {
            out.push_str(&indent);
            out.push_str(more);
            out.push('\n');
        }
    }
    out.push_str(&steady_note(points));
    out
}

/// The points whose runs did not all reach a steady state, if any (each
/// note within 120 columns).
fn steady_note(points: &std::collections::BTreeMap<u32, crate::sweep::runner::PointTally>) -> String {
    let list = |pick: fn(&crate::sweep::runner::PointTally) -> u32| {
        let hit: Vec<String> = points.iter().filter(|(_, t)| pick(t) > 0).map(|(id, _)| id.to_string()).collect();
        let runs: u32 = points.values().map(pick).sum();
        let shown =
            if hit.len() > 6 { format!("{} … {} points", hit[..4].join(", "), hit.len()) } else { hit.join(", ") };
        (runs, shown)
    };
    let mut out = String::new();
    let (n, at) = list(|t| t.unstable);
    if n > 0 {
        let _ = writeln!(
            out,
            "steady state: {} UNSTABLE (points {at}): queue kept growing, load above capacity",
            count(n, "run")
        );
    }
    let (n, at) = list(|t| t.too_short);
    if n > 0 {
        let _ = writeln!(out, "steady state: {} too short to judge (points {at}): run more requests", count(n, "run"));
    }
    out.push_str(&rejected_note(points));
    out
}

/// The points that rejected requests (longer than `max_model_len`), with
/// the share at each: those requests are in no latency column (within 120
/// columns; the most-rejecting points first when many).
fn rejected_note(points: &std::collections::BTreeMap<u32, crate::sweep::runner::PointTally>) -> String {
    let mut hit: Vec<(u32, f64)> = points
        .iter()
        .filter(|(_, t)| t.rejected > 0)
        .map(|(&id, t)| (id, 100.0 * t.rejected as f64 / t.generated.max(1) as f64))
        .collect();
    if hit.is_empty() {
        return String::new();
    }
    let total: u64 = points.values().map(|t| t.rejected).sum();
    let generated: u64 = points.values().map(|t| t.generated).sum();
    let n = hit.len();
    if n > 4 {
        hit.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    }
    let shown: Vec<String> =
        hit.iter().take(if n > 4 { 3 } else { 4 }).map(|(id, pct)| format!("{id}: {pct:.1} %")).collect();
    let more = if n > 4 { format!(" … ({n} points)") } else { String::new() };
    format!(
        "rejected: {total} request{} ({:.1} %) over max_model_len, in no latency; at points {}{more}\n",
        if total == 1 { "" } else { "s" },
        100.0 * total as f64 / generated.max(1) as f64,
        shown.join(", ")
    )
}

/// What goes into a Slurm job-array script.
pub struct SlurmJob<'a> {
    /// Study name.
    pub name: &'a str,
    /// The opal-sweep binary.
    pub exe: &'a std::path::Path,
    /// The spec (absolute).
    pub spec: &'a std::path::Path,
    /// Output directory (absolute).
    pub output: &'a std::path::Path,
    /// Array tasks.
    pub tasks: u32,
    /// CPUs per task.
    pub cpus_per_task: u32,
    /// Time limit.
    pub time: Option<&'a str>,
    /// Partition.
    pub partition: Option<&'a str>,
    /// Working directory (relative paths in the spec resolve against the spec file anyway).
    pub workdir: &'a std::path::Path,
}

/// An sbatch script running a sweep as a job array; each task runs its
/// shard (taken from the Slurm environment) with `--resume`, so a failed
/// task can simply be resubmitted.
pub fn slurm_script(job: &SlurmJob<'_>) -> String {
    let q = |p: &std::path::Path| format!("'{}'", p.display().to_string().replace('\'', r"'\''"));
    let mut s = String::from("#!/bin/bash\n");
    // The study's name, kept to what a job name and an #SBATCH line can hold.
    let name: String = job
        .name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') { c } else { '_' })
        .collect();
    let _ = writeln!(s, "#SBATCH --job-name=opal-{name}");
    let _ = writeln!(s, "#SBATCH --array=0-{}", job.tasks.saturating_sub(1));
    let _ = writeln!(s, "#SBATCH --cpus-per-task={}", job.cpus_per_task);
    let _ = writeln!(s, "#SBATCH --output={}/slurm-%A_%a.log", job.output.display());
    if let Some(t) = job.time {
        let _ = writeln!(s, "#SBATCH --time={t}");
    }
    if let Some(p) = job.partition {
        let _ = writeln!(s, "#SBATCH --partition={p}");
    }
    let _ = writeln!(s, "#\n# Submit:  sbatch this-script.sh");
    let _ = writeln!(s, "# Then, when every task has finished, combine the shards:");
    let _ = writeln!(s, "#   {} merge {}", q(job.exe), q(job.output));
    let _ = writeln!(
        s,
        "# (or: sbatch --dependency=afterok:<jobid> --wrap \"{} merge {}\")",
        job.exe.display(),
        job.output.display()
    );
    s.push_str("set -euo pipefail\n");
    let _ = writeln!(s, "mkdir -p {}", q(job.output));
    let _ = writeln!(s, "cd {}", q(job.workdir));
    let _ = writeln!(
        s,
        "exec {} {} --output {} --jobs \"${{SLURM_CPUS_PER_TASK:-1}}\" --resume",
        q(job.exe),
        q(job.spec),
        q(job.output)
    );
    s
}

/// `opal-sweep model`'s text: what the simulator derives from a model, and how it fits.
pub fn model_text(m: &crate::worker::model::ModelReport) -> String {
    let gib = |b: f64| b / (1u64 << 30) as f64;
    let billions = |n: u64| n as f64 / 1e9;
    let mut out = format!(
        "{} ({}: {}, {} attention)\n  layers {}, hidden {}, context {} tokens\n  parameters: {:.2} B total, {:.2} B active per token\n",
        m.name,
        m.model_type,
        m.family,
        m.attention,
        m.layers,
        m.hidden_size,
        m.max_model_len,
        billions(m.params),
        billions(m.active_params)
    );
    if let (Some(e), Some(k), Some(l)) = (m.experts, m.experts_per_token, m.moe_layers) {
        out.push_str(&format!("  experts: {e} routed, {k} per token, in {l} of {} layers\n", m.layers));
    }
    let dtype = match &m.quantization {
        Some(q) => format!("{q}-quantised, {} bytes per weight elsewhere", m.weight_dtype_bytes),
        None => format!("{} bytes per weight", m.weight_dtype_bytes),
    };
    out.push_str(&format!("  weights: {:.2} GiB ({dtype})\n", gib(m.weight_bytes as f64)));
    out.push_str(&format!("  KV cache: {} B per token ({} B per element)", m.kv_bytes_per_token, m.kv_dtype_bytes));
    match m.sliding_window {
        Some(w) => out.push_str(&format!(
            "; {} of {} layers slide over {w} tokens: {} B per token beyond the window\n",
            m.windowed_layers, m.layers, m.kv_bytes_per_token_full
        )),
        None => out.push('\n'),
    }
    if let Some(f) = &m.fit {
        if f.pp > 1 {
            let list = |v: Vec<String>| v.join(" + ");
            out.push_str(&format!(
                "on {} stages of {} × {} (gpu_memory_utilization {}): {:.1} GiB for vLLM a stage\n  layers {}; weights per GPU {} GiB\n",
                f.pp,
                f.tp,
                f.gpu,
                f.gpu_memory_utilization,
                gib(f.memory_bytes),
                list(f.stage_layers.iter().map(u64::to_string).collect()),
                list(f.stage_weight_bytes_per_gpu.iter().map(|&b| format!("{:.2}", gib(b as f64))).collect()),
            ));
        } else {
            out.push_str(&format!(
                "on {} × {} (gpu_memory_utilization {}): {:.1} GiB for vLLM\n",
                f.tp,
                f.gpu,
                f.gpu_memory_utilization,
                gib(f.memory_bytes)
            ));
        }
        if f.fits {
            out.push_str(&format!(
                "  KV cache: {:.1} GiB = {} blocks of {} = {} tokens\n  sequences of {} tokens that fit at once: {}\n",
                gib(f.kv_pool_bytes),
                f.kv_pool_blocks,
                f.block_size,
                f.kv_pool_tokens,
                f.context,
                f.max_batch_at_context
            ));
        } else {
            out.push_str(&format!(
                "  does not fit: the weights need {:.1} GiB, {:.1} GiB is available; use more GPUs (--tp, --pp) or a larger GPU\n",
                gib(m.weight_bytes as f64),
                gib(f.memory_bytes)
            ));
        }
    }
    out
}

/// `opal-sweep calibrate`'s table: each row's measured latency, the default
/// and the fitted model's (as runs simulate them) and the leave-one-out
/// prediction, then the errors, the constants and what was constrained.
pub fn calibration_table(fit: &crate::calibrate::Calibration) -> String {
    use crate::worker::perf::Phase;
    let mut out = String::from(
        "line phase    tp  batch   tokens  out   measured ms   default ms    fitted ms  held out ms  residual\n",
    );
    let ms = |s: f64| format!("{:>12.2}", s * 1e3);
    for r in &fit.rows {
        let m = &r.row;
        out.push_str(&format!(
            "{:<4} {:<8} {:>2} {:>6} {:>8} {:>4} {} {} {} {} {:>8.2} %\n",
            m.line,
            if m.phase == Phase::Prefill { "prefill" } else { "decode" },
            r.tp,
            m.batch,
            m.tokens,
            if m.phase == Phase::Prefill { "–".to_string() } else { m.output_tokens.to_string() },
            ms(m.latency_s),
            ms(r.default_s),
            ms(r.fitted_s),
            r.held_out_s.map_or("           –".into(), ms),
            100.0 * r.residual()
        ));
    }
    let pct = |e: Option<(f64, f64)>| {
        e.map_or("–".into(), |(m, x)| format!("median {:.1} %, max {:.1} %", 100.0 * m, 100.0 * x))
    };
    out.push_str(&format!("default model:       {}\n", pct(fit.default_error())));
    out.push_str(&format!("fitted:              {}\n", pct(fit.fit_error())));
    let how = if fit.rows.len() > crate::calibrate::fit::LEAVE_ONE_OUT_ROWS {
        "each row predicted by a fit without its tenth of the rows"
    } else {
        "each row predicted by a fit without it"
    };
    out.push_str(&format!("held out ({how}): {}\n", pct(fit.cv_error())));
    if fit.rows.iter().any(|r| r.power_w.is_some()) {
        out.push_str(&format!("power, fitted:       {}\n", pct(fit.power_error())));
    }
    let c = &fit.constants;
    out.push_str(&format!(
        "constants: compute_scale = {:.4}, memory_scale = {:.4}, comm_scale = {:.4}, step_overhead_secs = {:.6}, seq_overhead_secs = {:.6}, prefill_overhead_secs = {:.6}\n",
        c.compute_scale, c.memory_scale, c.comm_scale, c.step_overhead_s, c.seq_overhead_s, c.prefill_overhead_s
    ));
    if let Some(p) = &fit.power {
        out.push_str(&format!(
            "power: active {:.1} W, compute {:.1} W, memory {:.1} W (idle {:.1} W, at most {:.1} W)\n",
            p.active_w, p.compute_w, p.memory_w, p.idle_w, p.max_w
        ));
    }
    for n in &fit.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

/// `opal-sweep presets`: the model presets (parameters, active parameters,
/// weights, KV bytes per token, context) and the GPU presets (memory,
/// dense BF16/FP8 peaks, bandwidth, power).
pub fn presets_table() -> String {
    use crate::worker::model::ModelArch;
    use crate::worker::presets::GpuSpec;
    let gib = |b: f64| b / (1u64 << 30) as f64;
    let mut out = format!(
        "models ([model.model_params] name; Hugging Face ids accepted)\n{:<44} {:>9} {:>9} {:>10} {:>11} {:>9}\n",
        "name", "params B", "active B", "weights GiB", "KV B/token", "context"
    );
    for name in ModelArch::presets() {
        let m = ModelArch::preset(name).expect("a listed preset");
        let _ = writeln!(
            out,
            "{name:<44} {:>9.2} {:>9.2} {:>10.1} {:>11} {:>9}",
            m.parameter_count() as f64 / 1e9,
            m.active_parameter_count() as f64 / 1e9,
            gib(m.weight_bytes() as f64),
            m.kv_bytes_per_token(),
            m.max_model_len
        );
    }
    let _ = writeln!(
        out,
        "\nGPUs ([worker.hw] gpu)\n{:<10} {:>10} {:>12} {:>11} {:>9} {:>8} {:>8}  step times",
        "name", "memory GiB", "BF16 TFLOP/s", "FP8 TFLOP/s", "HBM TB/s", "link GB/s", "power W"
    );
    let measured: Vec<&str> = crate::worker::perf::profile::shipped::gpus().collect();
    for name in GpuSpec::presets() {
        let g = GpuSpec::preset(name).expect("a listed preset");
        let fp8 = g.fp8_tflops.map_or(MISSING.to_string(), |v| format!("{v:.0}"));
        let source = if measured.contains(&name) { "measured tables" } else { "analytic" };
        let _ = writeln!(
            out,
            "{name:<10} {:>10.0} {:>12.0} {fp8:>11} {:>9.2} {:>9.0} {:>8.0}  {source}",
            g.memory_gb, g.tflops, g.mem_bw_tbps, g.link_gbps, g.power.max_w
        );
    }
    let aliases: Vec<String> = GpuSpec::presets()
        .filter(|n| !GpuSpec::aliases(n).is_empty())
        .map(|n| format!("{} = {n}", GpuSpec::aliases(n).join(", ")))
        .collect();
    let _ = writeln!(out, "(also: {}; case is ignored)", aliases.join("; "));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::TierSummary;

    #[test]
    fn rejected_requests_are_shown_when_there_are_any() {
        let mut s = RunSummary { requests_generated: 1000, requests_completed: 914, ..RunSummary::default() };
        assert!(!summary_table(&s).contains("rejected"));
        s.requests_rejected = 86;
        assert!(summary_table(&s).contains("914 completed, 86 rejected (8.6 %: longer than max_model_len)"));
    }

    #[test]
    fn the_sweep_table_says_which_points_rejected_requests() {
        use crate::sweep::runner::PointTally;
        let tally = |generated, rejected| {
            let mut t = PointTally::default();
            (t.runs, t.ok, t.generated, t.rejected) = (1, 1, generated, rejected);
            t
        };
        let mut points: std::collections::BTreeMap<u32, PointTally> =
            [(0, tally(1000, 0)), (1, tally(1000, 86)), (2, tally(2000, 10))].into_iter().collect();
        assert_eq!(
            rejected_note(&points),
            "rejected: 96 requests (2.4 %) over max_model_len, in no latency; at points 1: 8.6 %, 2: 0.5 %\n"
        );
        // Many points: the most-rejecting first, and a count.
        for id in 3..10 {
            points.insert(id, tally(100, u64::from(id)));
        }
        let note = rejected_note(&points);
        assert!(note.ends_with("at points 9: 9.0 %, 1: 8.6 %, 8: 8.0 % … (9 points)\n"), "{note}");
        assert!(note.chars().count() <= 120, "{note}");
        points.values_mut().for_each(|t| t.rejected = 0);
        assert_eq!(rejected_note(&points), "");
    }

    #[test]
    fn the_cache_line_splits_hits_by_tier_and_names_storage_traffic() {
        let t = TierSummary {
            prompt_tokens: 1000,
            hit_tokens: [250, 0, 0, 125],
            bytes_read: [0, 0, 0, 3_000_000_000],
            bytes_written: [0, 500_000_000, 0, 1_250_000_000],
            ..TierSummary::default()
        };
        // 375 of 1,000 tokens hit: 250 on the GPU, 125 from the DFS; the CPU
        // tier served nothing but was written to, NVMe is unused.
        assert_eq!(
            cache_line(&t),
            "KV cache: prefix hit 37.5 % of prompt tokens (GPU 25.0 %, CPUMemory 0.0 %, DistributedFS 12.5 %)   \
             CPUMemory read 0.00 GB, wrote 0.50 GB   DistributedFS read 3.00 GB, wrote 1.25 GB\n"
        );
    }
}
