//! The report page: one self-contained `index.html` (inline style, no
//! scripts, nothing fetched from the network) with the summary table, the
//! figures (SVG, or PNG linking to the SVG) and what was left out.

use super::data::SweepData;
use super::figures::{Drawn, si, sig};
use crate::metrics::rows::col;
use crate::stats::mean_ci;
use std::fmt::Write;

/// Escapes text for HTML element content and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2rem auto;max-width:1500px;\
padding:0 1rem;color:#222}h1{margin-bottom:.2rem}.meta{color:#555;margin-top:0}\
table{border-collapse:collapse;font-size:.9rem;margin:1rem 0}th,td{border-bottom:1px solid #ddd;padding:.3rem .6rem;\
text-align:right;white-space:nowrap}th{background:#f4f4f4;position:sticky;top:0}td.l,th.l{text-align:left}\
figure{margin:2.5rem 0}figure img{max-width:100%;height:auto;border:1px solid #eee}\
figcaption{color:#444;max-width:70rem;margin-top:.4rem}.warn{background:#fff4e5;border-left:4px solid #f0a030;\
padding:.6rem 1rem}td.err{text-align:left;white-space:normal;max-width:60rem}.scroll{overflow-x:auto}\
td small{color:#777}";

/// Columns of the summary table: header, runs-table column, scale.
const COLUMNS: [(&str, &str, f64); 13] = [
    ("req/s", col::REQUESTS_PER_S, 1.0),
    ("prompt tok/s", col::INPUT_TOKENS_PER_S, 1.0),
    ("output tok/s", col::OUTPUT_TOKENS_PER_S, 1.0),
    ("TTFT p50 (ms)", col::TTFT_P50_MS, 1.0),
    ("TTFT p99 (ms)", col::TTFT_P99_MS, 1.0),
    ("TPOT p50 (ms)", col::TPOT_P50_MS, 1.0),
    ("TPOT p99 (ms)", col::TPOT_P99_MS, 1.0),
    ("E2E p99 (ms)", col::E2E_P99_MS, 1.0),
    ("prefix hit", col::PREFIX_HIT_RATIO, 1.0),
    ("GPU busy (%)", col::GPU_BUSY_FRACTION, 100.0),
    ("compute (% of peak)", col::GPU_COMPUTE_FRACTION, 100.0),
    ("HBM bw (% of peak)", col::GPU_HBM_FRACTION, 100.0),
    (col::PREEMPTIONS, col::PREEMPTIONS, 1.0),
];

/// Each run's share of requests rejected (longer than `max_model_len`), %.
fn rejected_pct(r: &super::data::RunRow) -> Option<f64> {
    let (rejected, generated) = (r.metrics.get(col::REQUESTS_REJECTED)?, r.metrics.get(col::REQUESTS_GENERATED)?);
    (*generated > 0.0).then(|| 100.0 * rejected / generated)
}

/// Whether any run rejected requests.
fn any_rejected(data: &SweepData) -> bool {
    data.points.iter().flat_map(|p| &p.runs).any(|r| rejected_pct(r).is_some_and(|v| v > 0.0))
}

/// A warning naming the points that rejected requests: those requests are
/// in no latency figure (an empty string when none did).
fn rejected_warning(data: &SweepData) -> String {
    let hit: Vec<String> = data
        .points
        .iter()
        .filter_map(|p| {
            let v: Vec<f64> = p.runs.iter().filter_map(rejected_pct).collect();
            let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
            (mean > 0.0).then(|| format!("{} ({})", p.id, sig(mean, 2) + " %"))
        })
        .collect();
    if hit.is_empty() {
        return String::new();
    }
    format!(
        "<p class=\"warn\">Requests longer than <code>max_model_len</code> were rejected (as vLLM does) at grid point{} {}: they are counted in <code>requests_rejected</code> and in no latency figure, so those points' latencies describe only the requests that fit.</p>\n",
        if hit.len() == 1 { "" } else { "s" },
        esc(&hit.join(", "))
    )
}

/// A capacity search's answers (`search.parquet`), one row per grid point.
fn answers_table(data: &SweepData, out: &mut String) {
    let Some(a) = &data.answers else { return };
    out.push_str("<h2>Answers</h2>\n<p class=\"meta\">One row per grid point, as <code>search.parquet</code> has it: the answer (<code>found</code>), how the search ended (<code>status</code>), the bracket, the probes and runs it took, and each SLO metric at the answer (mean over its replicates).</p>\n<div class=\"scroll\"><table>\n<tr>");
    for c in &a.columns {
        let _ = write!(out, "<th>{}</th>", esc(c));
    }
    out.push_str("</tr>\n");
    for row in &a.rows {
        out.push_str("<tr>");
        for c in row {
            let shown = match c {
                None => "–".to_string(),
                Some(super::data::AnswerCell::Text(t)) => t.clone(),
                Some(super::data::AnswerCell::Number(v)) => sig(*v, 4),
            };
            let _ = write!(out, "<td>{}</td>", esc(&shown));
        }
        out.push_str("</tr>\n");
    }
    if a.rows.is_empty() {
        let _ = writeln!(out, "<tr><td colspan=\"{}\">no grid point was searched</td></tr>", a.columns.len().max(1));
    }
    out.push_str("</table></div>\n");
}

fn summary_table(data: &SweepData, out: &mut String) {
    let rejected = any_rejected(data);
    out.push_str("<div class=\"scroll\"><table>\n<tr><th>point</th>");
    for a in &data.axes {
        let _ = write!(out, "<th class=\"l\" title=\"{}\">{}</th>", esc(&a.path), esc(&a.label));
    }
    out.push_str("<th>runs ok</th>");
    if rejected {
        out.push_str("<th title=\"longer than max_model_len\">rejected (%)</th>");
    }
    for (h, _, _) in COLUMNS {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr>\n");
    for p in &data.points {
        let _ = write!(out, "<tr><td>{}</td>", p.id);
        for (a, &v) in data.axes.iter().zip(&p.at) {
            let _ = write!(out, "<td class=\"l\">{}</td>", esc(&a.values[v]));
        }
        let _ = write!(out, "<td>{}/{}</td>", p.runs.len(), p.total_runs);
        if rejected {
            let v: Vec<f64> = p.runs.iter().filter_map(rejected_pct).collect();
            let cell = mean_ci(&v).map_or_else(|| "—".to_string(), |(m, _)| esc(&sig(m, 2)));
            let _ = write!(out, "<td>{cell}</td>");
        }
        for (_, col, scale) in COLUMNS {
            let cell = match mean_ci(&p.samples(col)) {
                None => "—".to_string(),
                Some((m, h)) if h > 0.0 => {
                    format!("{} <small>± {}</small>", esc(&si(m * scale)), esc(&sig(h * scale, 2)))
                }
                Some((m, _)) => esc(&si(m * scale)),
            };
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table></div>\n");
}

/// Columns of the per-stage table: header, stages-table column.
const STAGE_COLUMNS: [(&str, &str); 10] = [
    ("completed", col::REQUESTS_COMPLETED),
    ("req/s", col::REQUESTS_PER_S),
    ("TTFT p50 (ms)", col::TTFT_P50_MS),
    ("TTFT p99 (ms)", col::TTFT_P99_MS),
    ("TPOT p50 (ms)", col::TPOT_P50_MS),
    ("TPOT p99 (ms)", col::TPOT_P99_MS),
    ("E2E p50 (ms)", col::E2E_P50_MS),
    ("E2E p99 (ms)", col::E2E_P99_MS),
    ("queue wait p99 (ms)", col::QUEUE_WAIT_P99_MS),
    ("prefix hit", col::PREFIX_HIT_RATIO),
];

/// One row per grid point and workload stage (as the Python Opal summarises
/// each stage), when some run has more than one stage; `false` otherwise.
fn stage_table(data: &SweepData, out: &mut String) -> bool {
    let Some(stages) = &data.stages else { return false };
    if !stages.values().any(|v| v.len() > 1) {
        return false;
    }
    out.push_str("<h2>Summary per workload stage</h2>\n<p class=\"meta\">Each stage over its own span (first arrival to last response); means over successful replicates.</p>\n");
    out.push_str("<div class=\"scroll\"><table>\n<tr><th>point</th>");
    for a in &data.axes {
        let _ = write!(out, "<th class=\"l\" title=\"{}\">{}</th>", esc(&a.path), esc(&a.label));
    }
    out.push_str("<th>stage</th><th class=\"l\">type</th>");
    for (h, _) in STAGE_COLUMNS {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr>\n");
    for p in &data.points {
        // The stages of this point's runs, by index.
        let mut by_stage: std::collections::BTreeMap<u32, Vec<&super::data::StageRun>> = Default::default();
        for run in &p.runs {
            for st in stages.get(&run.run_id).into_iter().flatten() {
                by_stage.entry(st.stage).or_default().push(st);
            }
        }
        for (stage, rows) in by_stage {
            let _ = write!(out, "<tr><td>{}</td>", p.id);
            for (a, &v) in data.axes.iter().zip(&p.at) {
                let _ = write!(out, "<td class=\"l\">{}</td>", esc(&a.values[v]));
            }
            let _ = write!(out, "<td>{stage}</td><td class=\"l\">{}</td>", esc(&rows[0].kind));
            for (_, col) in STAGE_COLUMNS {
                let samples: Vec<f64> =
                    rows.iter().filter_map(|r| r.metrics.get(col).copied()).filter(|v| v.is_finite()).collect();
                let cell = mean_ci(&samples).map_or_else(|| "—".to_string(), |(m, _)| esc(&si(m)));
                let _ = write!(out, "<td>{cell}</td>");
            }
            out.push_str("</tr>\n");
        }
    }
    out.push_str("</table></div>\n");
    true
}

fn failures(data: &SweepData, out: &mut String) {
    if data.failed.is_empty() {
        return;
    }
    let _ = write!(
        out,
        "<div class=\"warn\"><p><strong>{} failed run{} {} left out</strong> of every figure and of the table's means:</p>\n\
         <table><tr><th>run</th><th>point</th><th>replicate</th><th class=\"l\">error</th></tr>\n",
        data.failed.len(),
        if data.failed.len() == 1 { "" } else { "s" },
        if data.failed.len() == 1 { "is" } else { "are" },
    );
    for f in &data.failed {
        let label = data.points.iter().find(|p| p.id == f.point_id).map(|p| data.point_label(p)).unwrap_or_default();
        let mut msg: String = f.error.lines().next().unwrap_or("").chars().take(400).collect();
        if msg.len() < f.error.len() {
            msg.push_str(" …");
        }
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td class=\"l\">{} ({})</td><td>{}</td><td class=\"err\">{}</td></tr>",
            f.run_id,
            f.point_id,
            esc(&label),
            f.replicate,
            esc(&msg)
        );
    }
    out.push_str("</table></div>\n");
}

/// The page for `data` with the figures in `drawn`.
pub fn page(data: &SweepData, drawn: &Drawn) -> String {
    let mut out = String::new();
    let title =
        if data.name.is_empty() { "sweep report".to_string() } else { format!("{} — sweep report", data.name) };
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{}</h1>\n",
        esc(&title),
        esc(&title)
    );
    let axes = if data.axes.is_empty() {
        "no axes".to_string()
    } else {
        data.axes.iter().map(|a| a.path.as_str()).collect::<Vec<_>>().join(" × ")
    };
    let _ = writeln!(
        out,
        "<p class=\"meta\">{} grid point{}, {} replicate{} each (seed = {} + replicate) — {} run{} succeeded, {} failed. \
         Axes: {}. Spec: <code>{}</code>. Made by opal {} from the tables in <code>{}</code>.</p>",
        data.points.len(),
        if data.points.len() == 1 { "" } else { "s" },
        data.replicates,
        if data.replicates == 1 { "" } else { "s" },
        data.base_seed,
        data.ok_runs(),
        if data.ok_runs() == 1 { "" } else { "s" },
        data.failed.len(),
        esc(&axes),
        esc(&data.spec_file),
        env!("CARGO_PKG_VERSION"),
        esc(&data.dir.display().to_string()),
    );
    failures(data, &mut out);
    out.push_str("<h2>Summary per grid point</h2>\n<p class=\"meta\">Means over successful replicates, ± the half-width of a 95 % Student-t interval when there are several.</p>\n");
    answers_table(data, &mut out);
    out.push_str(&rejected_warning(data));
    summary_table(data, &mut out);
    stage_table(data, &mut out);
    for f in &drawn.figures {
        // The PNG, when there is one, is shown and links to the SVG.
        let shown = f.png.as_ref().unwrap_or(&f.svg);
        let _ = write!(
            out,
            "<figure id=\"fig{}\">\n<h2>Figure {}. {}</h2>\n<a href=\"{}\"><img src=\"{}\" alt=\"{}\"></a>\n<figcaption>{} (Click for the SVG.)</figcaption>\n</figure>\n",
            f.number,
            f.number,
            esc(&f.title),
            esc(&f.svg),
            esc(shown),
            esc(&f.title),
            esc(&f.caption)
        );
    }
    if !drawn.skipped.is_empty() || !drawn.not_applicable.is_empty() {
        out.push_str("<h2>Not shown</h2>\n<ul>\n");
        for s in drawn.skipped.iter().chain(&drawn.not_applicable) {
            let _ = writeln!(out, "<li>{}</li>", esc(s));
        }
        out.push_str("</ul>\n");
    }
    out.push_str("</body>\n</html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_for_html() {
        assert_eq!(esc(r#"<a href="x">&'"#), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
    }
}
