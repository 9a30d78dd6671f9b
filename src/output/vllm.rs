//! `vllm bench serve`'s result format, out and in: a stored run's numbers
//! under the field names `--save-result` writes, and a measured result held
//! against a simulated run, field by field.
//!
//! vLLM's definitions (`vllm/benchmarks/serve.py`, `calculate_metrics` and
//! `benchmark`): `request_throughput` = completed / duration,
//! `output_throughput` = output tokens / duration, `total_token_throughput`
//! = (input + output tokens) / duration; per metric `mean_*_ms`,
//! `median_*_ms`, `std_*_ms` (numpy's population deviation) and `p{P}_*_ms`
//! for each `--metric-percentiles` P (numpy's linear interpolation; `P`
//! written without a fraction when it is whole). TPOT is (latency − TTFT) /
//! (output − 1) over requests with more than one output token; ITL is every
//! gap between consecutive output chunks; E2EL is send to last token.
//!
//! The simulated side comes from the runs table and the HDR histograms the
//! run wrote: means and maxima exact, the runs table's own percentiles
//! (p50, p90, p95, p99, p99.9) as written, other percentiles and the
//! deviation from the histogram (3 significant digits). Our TTFT counts from
//! the request's arrival at the router and has no HTTP, tokenizer or
//! detokenizer time; `duration` is the run's simulated time.

use super::{OutputError, f64_column, read_table, write_rows};
use crate::metrics::LatencyMetric;
use crate::metrics::rows::col;
use crate::metrics::table::{Cell, ColType};
use crate::workload::BenchFile;
use arrow_array::cast::AsArray;
use std::collections::BTreeMap;
use std::path::Path;

/// The latency metrics `vllm bench serve` reports, with its names.
pub const METRICS: [(LatencyMetric, &str); 4] = [
    (LatencyMetric::Ttft, "ttft"),
    (LatencyMetric::Tpot, "tpot"),
    (LatencyMetric::Itl, "itl"),
    (LatencyMetric::E2e, "e2el"),
];

/// The counts and throughputs of a result, in vLLM's order.
pub const TOTALS: [&str; 8] = [
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
];

/// Which metrics and percentiles a result carries (vLLM's
/// `--percentile-metrics` and `--metric-percentiles`).
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    /// Latency metrics, as vLLM names them.
    pub metrics: Vec<&'static str>,
    /// Percentiles, 0 to 100.
    pub percentiles: Vec<f64>,
}

impl Selection {
    /// From vLLM's comma-separated arguments (`ttft,tpot,itl,e2el`, `50,90,99`).
    pub fn parse(metrics: &str, percentiles: &str) -> Result<Selection, String> {
        let metrics = metrics
            .split(',')
            .map(|m| {
                let m = m.trim();
                METRICS.iter().find(|(_, n)| *n == m).map(|&(_, n)| n).ok_or_else(|| {
                    format!("unknown metric {m:?} in --percentile-metrics (vLLM's names: ttft, tpot, itl, e2el)")
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let percentiles = percentiles
            .split(',')
            .map(|p| match p.trim().parse::<f64>() {
                Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
                _ => Err(format!("{p:?} in --metric-percentiles is not a percentile (0 to 100, e.g. 50,90,99)")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Selection { metrics, percentiles })
    }

    /// The field names of a result with this selection, in vLLM's order.
    pub fn fields(&self) -> Vec<String> {
        let mut out: Vec<String> = TOTALS.iter().map(|s| s.to_string()).collect();
        for m in &self.metrics {
            out.extend([format!("mean_{m}_ms"), format!("median_{m}_ms"), format!("std_{m}_ms")]);
            out.extend(self.percentiles.iter().map(|&p| format!("p{}_{m}_ms", percentile_word(p))));
        }
        out
    }
}

/// A percentile as vLLM writes it in a field name: `99`, `99.9`.
pub fn percentile_word(p: f64) -> String {
    if p.fract() == 0.0 { format!("{}", p as u64) } else { format!("{p}") }
}

/// One run's numbers under vLLM's field names.
#[derive(Clone, Debug, PartialEq)]
pub struct VllmResult {
    /// The run.
    pub run_id: u32,
    /// `(field, value)` in vLLM's order (NaN: no sample).
    pub fields: Vec<(String, f64)>,
}

impl VllmResult {
    /// A field's value.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.fields.iter().find(|(k, _)| k == name).map(|&(_, v)| v)
    }

    /// As `--save-result` writes it (counts as integers, no sample as `null`),
    /// with Opal's run id.
    pub fn to_json(&self) -> String {
        let mut m = serde_json::Map::new();
        m.insert("backend".into(), "opal".into());
        m.insert("opal_run_id".into(), self.run_id.into());
        for (k, v) in &self.fields {
            let counted = matches!(k.as_str(), "completed" | "failed" | "total_input_tokens" | "total_output_tokens");
            let value =
                if counted && v.is_finite() { serde_json::Value::from(*v as u64) } else { serde_json::Value::from(*v) };
            m.insert(k.clone(), value);
        }
        serde_json::to_string_pretty(&m).expect("a map of numbers serializes")
    }
}

/// The results of the `ok` runs in `dir` (only `run` if given).
pub fn simulated(dir: &Path, run: Option<u32>, sel: &Selection) -> Result<Vec<VllmResult>, OutputError> {
    let layout = super::Layout { dir: dir.to_path_buf() };
    let runs_path = layout.table(super::TableKind::Runs);
    if !runs_path.exists() {
        return Err(OutputError::file(
            &runs_path,
            "no runs table here (run `opal-sweep merge` on an unmerged directory)",
        ));
    }
    let hist_path = layout.table(super::TableKind::Histograms);
    let histograms = if hist_path.exists() { read_histograms(&hist_path)? } else { BTreeMap::new() };
    let mut out = Vec::new();
    for batch in read_table(&runs_path)? {
        let get = |name: &str| {
            f64_column(&batch, name).ok_or_else(|| OutputError::file(&runs_path, format!("no column {name}")))
        };
        let ids = get(col::RUN_ID)?;
        let status = batch
            .column_by_name(col::STATUS)
            .and_then(|c| c.as_string_opt::<i32>().cloned())
            .ok_or_else(|| OutputError::file(&runs_path, format!("no column {}", col::STATUS)))?;
        let (completed, rejected, incomplete) =
            (get(col::REQUESTS_COMPLETED)?, get(col::REQUESTS_REJECTED)?, get(col::REQUESTS_INCOMPLETE)?);
        let (time, input, output) =
            (get(col::SIM_TIME_S)?, get(col::INPUT_TOKENS_PER_S)?, get(col::OUTPUT_TOKENS_PER_S)?);
        let mut stats = BTreeMap::new();
        for (metric, _) in METRICS {
            for s in ["p50", "p90", "p95", "p99", "p999", "mean", "max"] {
                stats.insert((metric.name(), s), get(&col::latency(metric, s))?);
            }
        }
        for i in 0..batch.num_rows() {
            let id = ids[i].unwrap_or(f64::NAN) as u32;
            if status.value(i) != "ok" || run.is_some_and(|r| r != id) {
                continue;
            }
            let v = |c: &Vec<Option<f64>>| c[i].unwrap_or(f64::NAN);
            let duration = v(&time);
            // The runs table keeps rates; totals are rate × time (exact to rounding).
            let (tin, tout) = ((v(&input) * duration).round(), (v(&output) * duration).round());
            let done = v(&completed);
            let mut fields: Vec<(String, f64)> = vec![
                ("duration".into(), duration),
                ("completed".into(), done),
                ("failed".into(), v(&rejected) + v(&incomplete)),
                ("total_input_tokens".into(), tin),
                ("total_output_tokens".into(), tout),
                ("request_throughput".into(), done / duration),
                ("output_throughput".into(), tout / duration),
                ("total_token_throughput".into(), (tin + tout) / duration),
            ];
            for name in &sel.metrics {
                let metric = METRICS.iter().find(|(_, n)| n == name).expect("a selected metric").0;
                let stat = |s: &str| v(&stats[&(metric.name(), s)]);
                let hist = histograms.get(&(id, metric.name().to_string()));
                let from_hist = |q: f64| -> Result<f64, OutputError> {
                    let h = hist.ok_or_else(|| {
                        OutputError::file(&hist_path, format!("no {} histogram of run {id}", metric.name()))
                    })?;
                    Ok(if h.is_empty() { f64::NAN } else { (h.value_at_quantile(q) as f64 / 1e3).min(stat("max")) })
                };
                fields.push((format!("mean_{name}_ms"), stat("mean")));
                fields.push((format!("median_{name}_ms"), stat("p50")));
                let std = match hist {
                    Some(h) if !h.is_empty() => h.stdev() / 1e3,
                    // No samples, or a directory written without its histograms.
                    _ => f64::NAN,
                };
                fields.push((format!("std_{name}_ms"), std));
                for &p in &sel.percentiles {
                    let written = [(50.0, "p50"), (90.0, "p90"), (95.0, "p95"), (99.0, "p99"), (99.9, "p999")];
                    let value = match written.iter().find(|(q, _)| *q == p) {
                        Some((_, s)) => stat(s),
                        None => from_hist(p / 100.0)?,
                    };
                    fields.push((format!("p{}_{name}_ms", percentile_word(p)), value));
                }
            }
            out.push(VllmResult { run_id: id, fields });
        }
    }
    Ok(out)
}

/// Every histogram of a histograms table, by run and metric.
fn read_histograms(path: &Path) -> Result<BTreeMap<(u32, String), hdrhistogram::Histogram<u64>>, OutputError> {
    let mut out = BTreeMap::new();
    for batch in read_table(path)? {
        let bad = || OutputError::file(path, "not a histograms table of opal-sweep");
        let ids = batch
            .column_by_name(col::RUN_ID)
            .and_then(|c| c.as_primitive_opt::<arrow_array::types::UInt32Type>().cloned())
            .ok_or_else(bad)?;
        let metrics =
            batch.column_by_name(col::METRIC).and_then(|c| c.as_string_opt::<i32>().cloned()).ok_or_else(bad)?;
        let bytes = batch.column_by_name(col::HDR).and_then(|c| c.as_binary_opt::<i32>().cloned()).ok_or_else(bad)?;
        for i in 0..batch.num_rows() {
            let h = super::deserialize_hdr(bytes.value(i))
                .map_err(|e| OutputError::file(path, format!("a histogram does not decode: {e}")))?;
            out.insert((ids.value(i), metrics.value(i).to_string()), h);
        }
    }
    Ok(out)
}

/// One field of a comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct CompareRow {
    /// vLLM's field name.
    pub field: String,
    /// The measured value.
    pub measured: f64,
    /// The simulated value.
    pub simulated: f64,
    /// 100 × (simulated − measured) / measured (NaN when measured is 0).
    pub error_pct: f64,
    /// `recorded` (the file's own summary field) or `computed` (from its per-request detail, as vLLM computes it).
    pub measured_from: &'static str,
}

/// The percentiles a measured file reports (its `p{P}_*_ms` fields; 99, vLLM's default, if none).
pub fn percentiles_of(file: &BenchFile) -> Vec<f64> {
    let mut ps: Vec<f64> = file
        .scalars
        .iter()
        .filter_map(|(k, _)| {
            let rest = k.strip_prefix('p')?.strip_suffix("_ms")?;
            let (p, m) = rest.split_once('_')?;
            METRICS.iter().any(|(_, n)| *n == m).then_some(())?;
            p.parse::<f64>().ok()
        })
        .collect();
    ps.sort_by(f64::total_cmp);
    ps.dedup();
    if ps.is_empty() { vec![99.0] } else { ps }
}

/// `measured` field by field against `simulated`: every field of the
/// simulated result that the file records or its detail gives.
pub fn compare(measured: &BenchFile, simulated: &VllmResult) -> Vec<CompareRow> {
    let detail = Detail::of(measured);
    simulated
        .fields
        .iter()
        .filter_map(|(field, sim)| {
            let sim = *sim;
            let (value, from) = match measured.scalar(field) {
                Some(v) => (v, "recorded"),
                None => (detail.field(field)?, "computed"),
            };
            let error_pct = if value == 0.0 { f64::NAN } else { 100.0 * (sim - value) / value };
            Some(CompareRow { field: field.clone(), measured: value, simulated: sim, error_pct, measured_from: from })
        })
        .collect()
}

/// A measured file's per-request samples of its successful requests, seconds.
struct Detail {
    totals: BTreeMap<&'static str, f64>,
    samples: BTreeMap<&'static str, Vec<f64>>,
}

impl Detail {
    fn of(f: &BenchFile) -> Detail {
        let ok: Vec<usize> = (0..f.len()).filter(|&i| f.succeeded(i)).collect();
        let mut totals = BTreeMap::new();
        let mut samples: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
        let (tin, tout) = (
            ok.iter().map(|&i| f.input_lens[i] as f64).sum::<f64>(),
            ok.iter().map(|&i| f.output_lens[i] as f64).sum::<f64>(),
        );
        totals.insert("completed", ok.len() as f64);
        totals.insert("failed", (f.len() - ok.len()) as f64);
        totals.insert("total_input_tokens", tin);
        totals.insert("total_output_tokens", tout);
        let latency = |i: usize| match f.latencies.get(i) {
            Some(&l) => Some(l),
            None => Some(*f.ttfts.get(i)? + f.itls.get(i)?.iter().sum::<f64>()),
        };
        if !f.start_times.is_empty() {
            let first = ok.iter().map(|&i| f.start_times[i]).fold(f64::INFINITY, f64::min);
            let last =
                ok.iter().filter_map(|&i| Some(f.start_times[i] + latency(i)?)).fold(f64::NEG_INFINITY, f64::max);
            if last.is_finite() && first.is_finite() {
                totals.insert("duration", last - first);
            }
        }
        let duration = f.scalar("duration").or(totals.get("duration").copied());
        if let Some(d) = duration {
            totals.insert("request_throughput", ok.len() as f64 / d);
            totals.insert("output_throughput", tout / d);
            totals.insert("total_token_throughput", (tin + tout) / d);
        }
        if !f.ttfts.is_empty() {
            samples.insert("ttft", ok.iter().map(|&i| f.ttfts[i]).collect());
        }
        let lat: Option<Vec<f64>> = ok.iter().map(|&i| latency(i)).collect();
        if let Some(lat) = lat {
            if !f.ttfts.is_empty() {
                let tpot = ok
                    .iter()
                    .zip(&lat)
                    .filter(|&(&i, _)| f.output_lens[i] > 1)
                    .map(|(&i, l)| (l - f.ttfts[i]) / (f.output_lens[i] - 1) as f64)
                    .collect();
                samples.insert("tpot", tpot);
            }
            samples.insert("e2el", lat);
        }
        if !f.itls.is_empty() {
            samples.insert("itl", ok.iter().flat_map(|&i| f.itls[i].iter().copied()).collect());
        }
        for s in samples.values_mut() {
            s.sort_by(f64::total_cmp);
        }
        Detail { totals, samples }
    }

    /// A field computed as vLLM computes it (ms for latencies).
    fn field(&self, name: &str) -> Option<f64> {
        if let Some(&v) = self.totals.get(name) {
            return Some(v);
        }
        let rest = name.strip_suffix("_ms")?;
        let (stat, metric) = rest.split_once('_')?;
        let s = self.samples.iter().find(|(m, _)| **m == metric)?.1;
        if s.is_empty() {
            return None;
        }
        let n = s.len() as f64;
        let mean = s.iter().sum::<f64>() / n;
        let v = match stat {
            "mean" => mean,
            "median" => quantile(s, 50.0),
            "std" => (s.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt(),
            p => quantile(s, p.strip_prefix('p')?.parse().ok()?),
        };
        Some(v * 1e3)
    }
}

/// numpy's `percentile` (linear interpolation) of sorted `s`.
fn quantile(s: &[f64], p: f64) -> f64 {
    let rank = p / 100.0 * (s.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    s[lo] + (s[hi] - s[lo]) * (rank - lo as f64)
}

/// A comparison as a table: field, measured, simulated, error, where the measured value came from.
pub fn write_compare(path: &Path, rows: &[CompareRow]) -> Result<(), OutputError> {
    let columns: Vec<(String, ColType)> = [
        ("field", ColType::Str),
        ("measured", ColType::F64),
        ("simulated", ColType::F64),
        ("error_pct", ColType::F64),
        ("measured_from", ColType::Str),
    ]
    .iter()
    .map(|&(n, t)| (n.to_string(), t))
    .collect();
    let cells: Vec<Vec<Cell<'_>>> = rows
        .iter()
        .map(|r| {
            vec![
                Cell::Str(&r.field),
                Cell::F64(r.measured),
                Cell::F64(r.simulated),
                Cell::F64(r.error_pct),
                Cell::Str(r.measured_from),
            ]
        })
        .collect();
    write_rows(path, &columns, &cells)
}

/// A comparison as the terminal shows it.
pub fn format_compare(rows: &[CompareRow]) -> String {
    let width = rows.iter().map(|r| r.field.len()).max().unwrap_or(5).max(5);
    let mut out = format!("{:width$}  {:>14}  {:>14}  {:>8}\n", "field", "measured", "simulated", "error");
    for r in rows {
        let err = if r.error_pct.is_finite() { format!("{:+.1} %", r.error_pct) } else { "—".to_string() };
        let mark = if r.measured_from == "computed" { "  (from the per-request detail)" } else { "" };
        out.push_str(&format!(
            "{:width$}  {:>14}  {:>14}  {:>8}{mark}\n",
            r.field,
            number(r.measured),
            number(r.simulated),
            err
        ));
    }
    out
}

fn number(v: f64) -> String {
    if !v.is_finite() {
        "—".to_string()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_as_numpy_does() {
        // numpy.percentile([1, 2, 3, 4], 50) = 2.5; p99 = 3 + 0.97 = 3.97; p0 = 1.
        let s = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&s, 50.0), 2.5);
        assert!((quantile(&s, 99.0) - 3.97).abs() < 1e-12);
        assert_eq!(quantile(&s, 0.0), 1.0);
        assert_eq!(quantile(&[7.0], 99.0), 7.0);
    }

    #[test]
    fn field_names_follow_vllm() {
        let sel = Selection::parse("ttft,e2el", "50,99.9").unwrap();
        let f = sel.fields();
        assert_eq!(&f[..3], ["duration", "completed", "failed"]);
        assert!(f.contains(&"p99.9_e2el_ms".to_string()) && f.contains(&"p50_ttft_ms".to_string()));
        assert!(f.contains(&"std_ttft_ms".to_string()) && !f.iter().any(|x| x.contains("itl")));
        assert!(Selection::parse("e2e", "99").unwrap_err().contains("e2el"));
        assert!(Selection::parse("ttft", "101").is_err());
    }

    #[test]
    fn detail_computes_tpot_and_std_as_vllm() {
        // Two requests: TTFT 10 and 20 ms; outputs 3 and 1 tokens; latencies 30 and 20 ms.
        let f = BenchFile {
            input_lens: vec![5, 6],
            output_lens: vec![3, 1],
            ttfts: vec![0.010, 0.020],
            itls: vec![vec![0.010, 0.010], vec![]],
            errors: vec![String::new(), String::new()],
            burstiness: 1.0,
            ..BenchFile::default()
        };
        let d = Detail::of(&f);
        // TPOT only for the request with more than one token: (30 − 10) / 2 = 10 ms.
        assert!((d.field("mean_tpot_ms").unwrap() - 10.0).abs() < 1e-9);
        // TTFT std (population): mean 15, deviations ±5 → 5 ms.
        assert!((d.field("std_ttft_ms").unwrap() - 5.0).abs() < 1e-9);
        // E2EL from TTFT + gaps: 30 and 20 → median 25.
        assert!((d.field("median_e2el_ms").unwrap() - 25.0).abs() < 1e-9);
        assert_eq!(d.field("total_input_tokens"), Some(11.0));
        assert_eq!(d.field("request_throughput"), None); // no duration, no start times
    }
}
