//! The report's figures: each is first computed into a plain description
//! (panels of lines, or stacked bars) from [`SweepData`], then drawn with
//! `plotters` as SVG, which the page shows. On request the SVG is also
//! rasterised to PNG (for slides and papers) with resvg and DejaVu Sans
//! embedded in the binary, so those pictures look the same on every
//! machine. Rasterising took about 80 % of a report's CPU time, which is why
//! it is not the default.
//!
//! Replicates are merged exactly where the data allows it (TTFT histograms
//! are added) and otherwise averaged, with the spread shown: a min–max band
//! for time series, a 95 % Student-t interval for percentiles.

use super::ReportError;
use super::data::{Interval, Point, SweepData};
use crate::kvcache::Tier;
use crate::metrics::rows::col;
use crate::stats::mean_ci;
use plotters::coord::Shift;
use plotters::coord::combinators::{LogCoord, WithKeyPoints};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

type Fallible<T> = Result<T, Box<dyn std::error::Error>>;
type DrawResult = Fallible<()>;

const FONT: &str = "sans-serif";

/// Qualitative colours (Tableau 10) for up to ten lines.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Colour `i` of `n` lines: the qualitative palette, or viridis for more than ten.
fn color(i: usize, n: usize) -> RGBColor {
    if n <= PALETTE.len() { PALETTE[i] } else { ViridisRGB.get_color(i as f32 / (n - 1) as f32 * 0.92) }
}

/// Tier colours for the stacked bars.
fn tier_color(t: Tier) -> RGBColor {
    match t {
        Tier::Gpu => RGBColor(44, 160, 44),
        Tier::Cpu => RGBColor(31, 119, 180),
        Tier::Nvme => RGBColor(255, 127, 14),
        Tier::Dfs => RGBColor(148, 103, 189),
    }
}

fn register_fonts() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let ok = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
            && plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold()).is_ok();
        assert!(ok, "the embedded DejaVu Sans fonts parse");
    });
}

/// A number for a tick label or a table: at most three significant digits,
/// with k/M/G for large values.
pub fn si(v: f64) -> String {
    sig(v, 3)
}

/// `v` with at most `digits` significant digits after scaling to k/M/G
/// (from 10⁴, 10⁶, 10⁹); trailing zeros dropped.
pub fn sig(v: f64, digits: i32) -> String {
    let a = v.abs();
    let (x, suffix) = match a {
        _ if a >= 1e9 => (v / 1e9, "G"),
        _ if a >= 1e6 => (v / 1e6, "M"),
        _ if a >= 1e4 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    let ax = x.abs();
    let decimals =
        if ax == 0.0 || !ax.is_finite() { 0 } else { (digits - 1 - ax.log10().floor() as i32).clamp(0, 8) as usize };
    let mut s = format!("{x:.decimals$}");
    if s.contains('.') {
        s = s.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    if s == "-0" {
        s = "0".into();
    }
    s + suffix
}

// ---------------------------------------------------------------- descriptions

/// Line style.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stroke {
    Solid,
    Dashed,
    Dotted,
    /// Markers only (values at unordered categories are not joined).
    None,
}

impl Stroke {
    /// The style of line `i` of a figure: solid, dashed, dotted in turn, so
    /// that lines lying on each other stay apart (colours alone do not).
    fn nth(i: usize) -> Stroke {
        [Stroke::Solid, Stroke::Dashed, Stroke::Dotted][i % 3]
    }

    /// The opacity a patterned line is drawn with, which marks its polyline
    /// in the SVG for [`Stroke::dash_patterns`] (no other element uses it).
    fn tag_alpha(self) -> f64 {
        match self {
            Stroke::Dashed => DASHED_TAG,
            _ => DOTTED_TAG,
        }
    }

    /// `svg` with each tagged polyline drawn opaque with its dash pattern:
    /// one element per line, where plotters' dashed series writes one per dash.
    fn dash_patterns(svg: &str) -> String {
        svg.replace(&format!(r#"opacity="{DASHED_TAG}""#), r#"opacity="1" stroke-dasharray="8,5""#)
            .replace(&format!(r#"opacity="{DOTTED_TAG}""#), r#"opacity="1" stroke-dasharray="2,4""#)
    }
}

/// `svg` with every polyline's points cut to what its pixels show: of a run
/// of points in one pixel column only the first, the lowest, the highest
/// and the last (the column's vertical extent, in drawing order), and no
/// point between two on one row or one column. A time series of thousands
/// of intervals drawn a few hundred pixels wide keeps a few points per
/// column; the drawing is the same.
fn thin_polylines(svg: &str) -> String {
    const OPEN: &str = "<polyline";
    const POINTS: &str = r#"points=""#;
    let mut out = String::with_capacity(svg.len());
    let mut rest = svg;
    while let Some(i) = rest.find(OPEN) {
        let Some(j) = rest[i..].find(POINTS).map(|j| i + j + POINTS.len()) else { break };
        let Some(end) = rest[j..].find('"').map(|e| j + e) else { break };
        out.push_str(&rest[..j]);
        let parsed: Option<Vec<(i64, i64)>> = rest[j..end]
            .split_whitespace()
            .map(|p| p.split_once(',').and_then(|(x, y)| Some((x.parse().ok()?, y.parse().ok()?))))
            .collect();
        match parsed {
            Some(points) => {
                for (x, y) in thin(&points) {
                    let _ = std::fmt::Write::write_fmt(&mut out, format_args!("{x},{y} "));
                }
            }
            None => out.push_str(&rest[j..end]),
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The points of a polyline in pixels, thinned as [`thin_polylines`] says.
fn thin(points: &[(i64, i64)]) -> Vec<(i64, i64)> {
    let mut kept: Vec<(i64, i64)> = Vec::with_capacity(points.len());
    let mut column = 0;
    while column < points.len() {
        let x = points[column].0;
        let end = column + points[column..].iter().take_while(|p| p.0 == x).count();
        let run = &points[column..end];
        let lowest = (0..run.len()).min_by_key(|&k| (run[k].1, k)).expect("a run has a point");
        let highest = (0..run.len()).max_by_key(|&k| (run[k].1, std::cmp::Reverse(k))).expect("a run has a point");
        let mut picks = [0, lowest, highest, run.len() - 1];
        picks.sort_unstable();
        for k in picks {
            if kept.last() != Some(&run[k]) {
                kept.push(run[k]);
            }
        }
        column = end;
    }
    // A point between two on its row or its column adds nothing.
    let mut out: Vec<(i64, i64)> = Vec::with_capacity(kept.len());
    for p in kept {
        if let [.., a, b] = out[..]
            && ((a.1 == b.1 && b.1 == p.1) || (a.0 == b.0 && b.0 == p.0))
        {
            out.pop();
        }
        out.push(p);
    }
    out
}

/// Opacities that tag dashed and dotted lines in the SVG plotters writes.
const DASHED_TAG: f64 = 0.9921875;
const DOTTED_TAG: f64 = 0.984375;

/// Marker shape: line `i` gets shape `i` in turn, so markers at the same
/// place stay visible (a circle around a triangle around a square).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Marker {
    Circle,
    Triangle,
    Square,
    Cross,
}

impl Marker {
    fn nth(i: usize) -> Marker {
        [Marker::Circle, Marker::Triangle, Marker::Square, Marker::Cross][i % 4]
    }
}

/// One line of a panel.
#[derive(Clone, Debug)]
struct Line {
    color: RGBColor,
    stroke: Stroke,
    /// (x, y), sorted by x.
    points: Vec<(f64, f64)>,
    /// Min–max band around the line, (x, low, high).
    band: Vec<(f64, f64, f64)>,
    /// Interval per point, (x, low, mean, high).
    errors: Vec<(f64, f64, f64, f64)>,
    marker: Option<Marker>,
}

/// One chart of a figure. Axis descriptions carry the unit; ", log scale"
/// is added when the axis is logarithmic.
#[derive(Clone, Debug)]
struct Panel {
    title: String,
    x_desc: String,
    y_desc: String,
    x_log: bool,
    y_log: bool,
    /// Panels of a figure showing the same quantity (same number) share
    /// their x limits and their y scale (see [`harmonise`]).
    quantity: usize,
    /// Fixed x range (else from the data).
    x_range: Option<(f64, f64)>,
    /// Fixed y range (else from the data).
    y_range: Option<(f64, f64)>,
    /// Names of x positions 0, 1, … (a categorical x axis).
    x_categories: Option<Vec<String>>,
    lines: Vec<Line>,
    /// Shown in the panel when it has no data.
    empty_note: &'static str,
}

/// A legend entry.
#[derive(Clone, Debug)]
struct Key {
    label: String,
    color: RGBColor,
    stroke: Stroke,
    marker: Option<Marker>,
}

/// A figure of line panels in a grid.
#[derive(Clone, Debug)]
struct LineFigure {
    legend_title: String,
    legend: Vec<Key>,
    panels: Vec<Panel>,
    columns: usize,
    panel_size: (u32, u32),
}

/// A horizontal stacked bar chart: one bar per point, one segment per tier.
#[derive(Clone, Debug)]
struct BarPanel {
    title: String,
    x_desc: String,
    /// Bar labels, top to bottom.
    bars: Vec<String>,
    /// Segments per bar: (tier, value).
    segments: Vec<Vec<(Tier, f64)>>,
    x_max: Option<f64>,
}

#[derive(Clone, Debug)]
struct BarFigure {
    tiers: Vec<Tier>,
    panels: Vec<BarPanel>,
}

#[derive(Clone, Debug)]
enum Body {
    Lines(LineFigure),
    Bars(BarFigure),
}

/// A figure ready to draw.
#[derive(Clone, Debug)]
struct Figure {
    stem: &'static str,
    title: String,
    caption: String,
    body: Body,
}

/// A figure as written.
#[derive(Clone, Debug)]
pub struct FigureFile {
    /// Its number (1–6, as the page and the issue list them).
    pub number: u32,
    /// Title shown above it.
    pub title: String,
    /// What it shows and how replicates are combined.
    pub caption: String,
    /// PNG file name (in the report directory), when PNGs were asked for.
    pub png: Option<String>,
    /// SVG file name.
    pub svg: String,
}

/// What [`draw_all`] wrote.
#[derive(Clone, Debug)]
pub struct Drawn {
    /// The figures, in page order.
    pub figures: Vec<FigureFile>,
    /// Figures left out, with the reason.
    pub skipped: Vec<String>,
    /// Figures that do not apply to this sweep (the SC25 figure without an SC25 stage).
    pub not_applicable: Vec<String>,
}

// ---------------------------------------------------------------- grouping

/// The points of a panel: (line index, point index).
type Members = Vec<(usize, usize)>;

/// Points split into lines (by the first axis) and panels (by the others).
struct Facets {
    /// Line labels (values of the first axis), in order.
    lines: Vec<String>,
    /// Panels: title and, per point in it, (line index, point index);
    /// at most [`MAX_PANELS`].
    panels: Vec<(String, Members)>,
    /// Panels before the cap.
    total_panels: usize,
}

fn facets(data: &SweepData) -> Facets {
    if data.axes.is_empty() {
        let all = data.points.iter().enumerate().map(|(i, _)| (0, i)).collect();
        return Facets { lines: vec!["all runs".into()], panels: vec![(String::new(), all)], total_panels: 1 };
    }
    let others: Vec<usize> = (1..data.axes.len()).collect();
    let mut panels: Vec<(Vec<usize>, String, Members)> = Vec::new();
    for (i, p) in data.points.iter().enumerate() {
        let key: Vec<usize> = others.iter().map(|&a| p.at[a]).collect();
        match panels.iter_mut().find(|(k, _, _)| *k == key) {
            Some((_, _, members)) => members.push((p.at[0], i)),
            None => panels.push((key, data.label(p, &others), vec![(p.at[0], i)])),
        }
    }
    panels.sort_by(|a, b| a.0.cmp(&b.0));
    let total_panels = panels.len();
    let panels = panels
        .into_iter()
        .take(MAX_PANELS)
        .map(|(_, title, mut members)| {
            members.sort();
            (title, members)
        })
        .collect();
    Facets { lines: data.axes[0].values.clone(), panels, total_panels }
}

/// At most this many panels in a small-multiples figure (the rest are named as left out).
const MAX_PANELS: usize = 24;

/// A legend label, marked when every run of its line failed (so the line is missing).
fn no_data_note(label: String, has_data: bool) -> String {
    if has_data { label } else { format!("{label} (every run failed)") }
}

fn line_keys(data: &SweepData, f: &Facets) -> Vec<Key> {
    let n = f.lines.len();
    f.lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let has_data =
                f.panels.iter().flat_map(|(_, m)| m).any(|&(line, pi)| line == i && !data.points[pi].runs.is_empty());
            Key { label: no_data_note(l.clone(), has_data), color: color(i, n), stroke: Stroke::nth(i), marker: None }
        })
        .collect()
}

fn legend_title(data: &SweepData) -> String {
    data.axes.first().map(|a| a.label.clone()).unwrap_or_default()
}

fn grid_columns(panels: usize, max: usize) -> usize {
    panels.clamp(1, max)
}

// ---------------------------------------------------------------- figure 1

/// The CDF of a histogram in µs as (ms, fraction ≤) points, starting at
/// (min, 0). Thinned for drawing: a point is kept when it is 0.5 % further
/// in x or 0.1 % higher than the last kept one; the last is always kept.
fn cdf_points(h: &hdrhistogram::Histogram<u64>) -> Vec<(f64, f64)> {
    let total = h.len() as f64;
    let mut points: Vec<(f64, f64)> = Vec::new();
    let mut pending = None;
    let mut seen = 0u64;
    for v in h.iter_recorded() {
        seen += v.count_at_value();
        let q = (h.highest_equivalent(v.value_iterated_to()) as f64 / 1e3, seen as f64 / total);
        match points.last() {
            None => points.extend([(q.0, 0.0), q]),
            Some(&(px, py)) if q.0 < px * 1.005 && q.1 - py < 0.001 => pending = Some(q),
            Some(_) => {
                points.push(q);
                pending = None;
            }
        }
    }
    points.extend(pending);
    points
}

/// A latency whose CDF is drawn: its histograms-table name, what panels
/// call it, and what to say when no request has a positive value.
struct CdfMetric {
    key: &'static str,
    name: &'static str,
    none_positive: &'static str,
}

/// CDFs of `metrics` (columns) per facet (rows), on a log x axis shared by
/// the panels of each metric. A metric whose every sample is 0 (no request
/// waited) is not drawn; the caption says so.
fn cdf_figure(
    data: &SweepData,
    stem: &'static str,
    title: &str,
    caption: &str,
    metrics: &[CdfMetric],
) -> Result<Figure, String> {
    let Some(hists) = &data.latency else { return Err("histograms table not written".into()) };
    let f = facets(data);
    let mut caption = caption.to_string();
    let mut kept = Vec::new();
    for m in metrics {
        let h = hists.get(m.key).filter(|h| !h.is_empty());
        match h {
            None => caption.push_str(&format!(" No {} samples.", m.name)),
            Some(h) if h.values().all(|h| h.max() == 0) => caption.push_str(&format!(" {}.", m.none_positive)),
            Some(h) => kept.push((m, h)),
        }
    }
    if kept.is_empty() {
        return Err(caption.trim().trim_end_matches('.').to_string());
    }
    let mut panels = Vec::new();
    for (facet, members) in &f.panels {
        for (q, (m, h)) in kept.iter().enumerate() {
            let lines = members
                .iter()
                .filter_map(|&(line, pi)| {
                    // A log axis has no 0: zero samples show as the curve
                    // starting above 0 at the smallest positive value.
                    let points: Vec<(f64, f64)> =
                        cdf_points(h.get(&data.points[pi].id)?).into_iter().filter(|p| p.0 > 0.0).collect();
                    (!points.is_empty()).then(|| Line {
                        color: color(line, f.lines.len()),
                        stroke: Stroke::nth(line),
                        points,
                        band: Vec::new(),
                        errors: Vec::new(),
                        marker: None,
                    })
                })
                .collect();
            let name = m.name;
            panels.push(Panel {
                title: if facet.is_empty() { String::new() } else { facet.clone() },
                x_desc: format!("{name} (ms)"),
                y_desc: format!("fraction of requests ≤ {name}"),
                x_log: true,
                y_log: false,
                quantity: q,
                x_range: None,
                y_range: Some((0.0, 1.0)),
                x_categories: None,
                lines,
                empty_note: "no completed requests",
            });
        }
    }
    let columns = if kept.len() > 1 { kept.len() } else { grid_columns(panels.len(), 3) };
    let mut lf = LineFigure {
        legend_title: legend_title(data),
        legend: line_keys(data, &f),
        panels,
        columns,
        panel_size: (560, 400),
    };
    harmonise(&mut lf);
    Ok(Figure { stem, title: title.into(), caption, body: Body::Lines(lf) })
}

fn ttft_cdf(data: &SweepData) -> Result<Figure, String> {
    cdf_figure(
        data,
        "fig1-ttft-cdf",
        "TTFT distribution per grid point",
        "Cumulative distribution of time to first token; each line merges the HDR histograms of all successful \
         replicates of a point (exact, not an average of percentiles).",
        &[CdfMetric { key: "ttft", name: "TTFT", none_positive: "no TTFT samples" }],
    )
}

fn e2e_and_wait_cdf(data: &SweepData) -> Result<Figure, String> {
    cdf_figure(
        data,
        "fig7-e2e-wait-cdf",
        "End-to-end latency and queue wait per grid point",
        "Cumulative distributions of end-to-end latency (arrival to response) and of queue wait (arrival to first \
         scheduling), merged over successful replicates as in figure 1. Requests that did not wait make the \
         queue-wait curve start above 0.",
        &[
            CdfMetric { key: "e2e", name: "E2E latency", none_positive: "no E2E samples" },
            CdfMetric {
                key: "queue_wait",
                name: "queue wait",
                none_positive: "Queue wait is not drawn: no request waited",
            },
        ],
    )
}

/// Gives the panels of a figure that show the same quantity one x range
/// (that of all their data) and one y scale: logarithmic when all their
/// values are positive and span more than two decades, else linear — for
/// every such panel alike, so that panels read against each other.
fn harmonise(f: &mut LineFigure) {
    let quantities: std::collections::BTreeSet<usize> = f.panels.iter().map(|p| p.quantity).collect();
    for q in quantities {
        let same = || f.panels.iter().filter(move |p| p.quantity == q);
        let categorical = same().any(|p| p.x_categories.is_some());
        let x_log = same().any(|p| p.x_log);
        let xs = same().flat_map(|p| p.lines.iter().flat_map(|l| l.points.iter().map(|q| q.0)));
        let x_range = (!categorical).then(|| data_range(xs, x_log));
        let fixed_y = same().any(|p| p.y_range.is_some());
        // The scale follows the values drawn, not their intervals: with two
        // replicates an interval's lower end is often clamped to 0, which
        // would force a linear axis over decades (its bar is drawn clipped).
        let ys: Vec<f64> = same()
            .flat_map(|p| p.lines.iter().flat_map(|l| l.points.iter().map(|q| q.1)))
            .filter(|v| v.is_finite())
            .collect();
        let (lo, hi) = ys.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
        let y_log = !fixed_y && lo > 0.0 && hi / lo > 100.0;
        for p in f.panels.iter_mut().filter(|p| p.quantity == q) {
            p.x_range = x_range;
            if !fixed_y {
                p.y_log = y_log;
            }
        }
    }
}

// ---------------------------------------------------------------- figures 2 and 5

/// A time-series metric.
#[derive(Clone, Copy)]
struct SeriesMetric {
    /// Panel title, with the unit.
    title: &'static str,
    /// Axis description, with the unit.
    y_desc: &'static str,
    /// The value of an interval `dt` seconds long.
    value: fn(&Interval, f64) -> f64,
    /// A rate over the interval (else a gauge sampled at its end).
    rate: bool,
    /// Fixed y range (percentages).
    y_range: Option<(f64, f64)>,
}

/// Mean and min–max per interval index over the replicates of a point:
/// (interval start, mean, min, max). Near the end only the replicates
/// still running contribute. A rate is not shown for a final interval
/// shorter than half the others (it would be mostly noise); non-finite
/// values are left out.
fn replicate_series(data: &SweepData, point: &Point, m: SeriesMetric) -> Vec<(f64, f64, f64, f64)> {
    let Some(series) = &data.series else { return Vec::new() };
    let mut acc: BTreeMap<usize, (f64, f64, f64, f64, usize)> = BTreeMap::new();
    for run in &point.runs {
        let Some(rows) = series.get(&run.run_id) else { continue };
        let end = run.metrics.get(col::SIM_TIME_S).copied().unwrap_or(f64::NAN);
        let width = rows.get(1).map_or(end, |r| r.start_s - rows[0].start_s);
        for (k, row) in rows.iter().enumerate() {
            let next = rows.get(k + 1).map_or(end, |r| r.start_s);
            let dt = if next.is_finite() && next > row.start_s { next - row.start_s } else { width };
            let y = (m.value)(row, dt);
            if (m.rate && dt < 0.5 * width) || !y.is_finite() {
                continue;
            }
            let e = acc.entry(k).or_insert((row.start_s, 0.0, f64::INFINITY, f64::NEG_INFINITY, 0));
            e.1 += y;
            e.2 = e.2.min(y);
            e.3 = e.3.max(y);
            e.4 += 1;
        }
    }
    acc.into_values().map(|(x, sum, lo, hi, n)| (x, sum / n as f64, lo, hi)).collect()
}

/// Time-series panels: one column per metric, one row per facet. A metric
/// that is the same number in every interval of every run (active workers
/// without autoscaling, a queue that never forms) is not drawn; the
/// caption says so and why.
fn time_figure(
    data: &SweepData,
    stem: &'static str,
    title: &str,
    caption: &str,
    metrics: &[SeriesMetric],
) -> Result<Figure, String> {
    let Some(series) = &data.series else { return Err("timeseries table not written".into()) };
    if series.is_empty() {
        return Err("no time-series rows".into());
    }
    let f = facets(data);
    let mut caption = caption.to_string();
    let base_len = caption.len();
    let mut kept = Vec::new();
    for &m in metrics {
        let values =
            f.panels.iter().flat_map(|(_, members)| members).flat_map(|&(_, pi)| {
                replicate_series(data, &data.points[pi], m).into_iter().flat_map(|r| [r.1, r.2, r.3])
            });
        let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
        if lo == hi {
            caption.push_str(&format!(" Not drawn: {}, {} throughout.", m.title, si(lo)));
        } else if lo.is_finite() {
            kept.push(m);
        }
    }
    if kept.is_empty() {
        return Err(format!("every metric is the same number throughout —{}", &caption[base_len..]));
    }
    let mut panels = Vec::new();
    for (facet, members) in &f.panels {
        for (q, &m) in kept.iter().enumerate() {
            let lines = members
                .iter()
                .map(|&(line, pi)| {
                    let rows = replicate_series(data, &data.points[pi], m);
                    Line {
                        color: color(line, f.lines.len()),
                        stroke: Stroke::nth(line),
                        points: rows.iter().map(|r| (r.0, r.1)).collect(),
                        band: if data.points[pi].runs.len() > 1 {
                            rows.iter().map(|r| (r.0, r.2, r.3)).collect()
                        } else {
                            Vec::new()
                        },
                        errors: Vec::new(),
                        marker: None,
                    }
                })
                .filter(|l| !l.points.is_empty())
                .collect();
            panels.push(Panel {
                title: if facet.is_empty() { m.title.to_string() } else { format!("{} — {facet}", m.title) },
                x_desc: "simulated time (s)".into(),
                y_desc: m.y_desc.into(),
                x_log: false,
                y_log: false,
                quantity: q,
                x_range: None,
                y_range: m.y_range,
                x_categories: None,
                lines,
                empty_note: "no intervals",
            });
        }
    }
    let columns = kept.len();
    let mut lf = LineFigure {
        legend_title: legend_title(data),
        legend: line_keys(data, &f),
        panels,
        columns,
        panel_size: if columns > 3 { (430, 320) } else { (500, 330) },
    };
    harmonise(&mut lf);
    // Every panel of a time figure spans the same simulated time.
    let all = lf
        .panels
        .iter()
        .filter_map(|p| p.x_range)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |a, r| (a.0.min(r.0), a.1.max(r.1)));
    if all.0.is_finite() {
        lf.panels.iter_mut().for_each(|p| p.x_range = Some(all));
    }
    Ok(Figure { stem, title: title.into(), caption, body: Body::Lines(lf) })
}

fn throughput(data: &SweepData) -> Result<Figure, String> {
    time_figure(
        data,
        "fig2-throughput",
        "Throughput over simulated time",
        "Prompt tokens computed, tokens generated and requests completed per second of simulated time, per \
         interval of the time series. Lines are the mean over a point's successful replicates (near the end, \
         over those still running); the shaded band spans their minimum to maximum.",
        &[
            SeriesMetric {
                title: "prompt tokens computed (tokens/s)",
                y_desc: "prompt tokens / s",
                value: |r, dt| r.prompt_tokens / dt,
                rate: true,
                y_range: None,
            },
            SeriesMetric {
                title: "tokens generated (tokens/s)",
                y_desc: "generated tokens / s",
                value: |r, dt| r.generated_tokens / dt,
                rate: true,
                y_range: None,
            },
            SeriesMetric {
                title: "requests completed (requests/s)",
                y_desc: "requests / s",
                value: |r, dt| r.requests_completed / dt,
                rate: true,
                y_range: None,
            },
        ],
    )
}

fn utilisation(data: &SweepData) -> Result<Figure, String> {
    const PERCENT: Option<(f64, f64)> = Some((0.0, 100.0));
    time_figure(
        data,
        "fig5-utilisation",
        "GPU use, queue depth and active workers over time",
        "GPU busy: the share of each interval the GPUs were running a step (mean over workers). Compute and HBM \
         bandwidth: the share of the GPUs' peak FLOP/s and bytes/s the steps' work needs (the step model's \
         roofline terms over the interval) — a GPU can be busy all the time at a small share of either. Requests \
         waiting and workers active at each interval's end (autoscaling shows as steps). Mean over replicates, \
         min–max band.",
        &[
            SeriesMetric {
                title: "GPU busy (% of time)",
                y_desc: "busy (%)",
                value: |r, _| 100.0 * r.gpu_busy_fraction,
                rate: false,
                y_range: PERCENT,
            },
            SeriesMetric {
                title: "compute used (% of peak FLOP/s)",
                y_desc: "compute (% of peak)",
                value: |r, _| 100.0 * r.gpu_compute_fraction,
                rate: false,
                y_range: PERCENT,
            },
            SeriesMetric {
                title: "HBM bandwidth used (% of peak)",
                y_desc: "HBM bandwidth (% of peak)",
                value: |r, _| 100.0 * r.gpu_hbm_fraction,
                rate: false,
                y_range: PERCENT,
            },
            SeriesMetric {
                title: "queue depth (requests waiting)",
                y_desc: "requests waiting",
                value: |r, _| r.queue_depth,
                rate: false,
                y_range: None,
            },
            SeriesMetric {
                title: "active workers",
                y_desc: "workers",
                value: |r, _| r.active_workers,
                rate: false,
                y_range: None,
            },
        ],
    )
}

// ---------------------------------------------------------------- figure 3

fn percentiles(data: &SweepData) -> Result<Figure, String> {
    if data.points.iter().filter(|p| !p.runs.is_empty()).count() < 2 {
        return Err("one grid point — its percentiles are in the summary table".into());
    }
    // x: the numeric axis with the most values (the first of equals), else
    // the first axis as categories, else one category.
    let most = data.axes.iter().filter(|a| a.numeric).map(|a| a.values.len()).max();
    let x_axis = (0..data.axes.len())
        .find(|&a| data.axes[a].numeric && Some(data.axes[a].values.len()) == most)
        .or(if data.axes.is_empty() { None } else { Some(0) });
    let numeric_x = x_axis.is_some_and(|a| data.axes[a].numeric);
    let x_of = |p: &Point| -> f64 {
        match x_axis {
            None => 0.0,
            Some(a) if numeric_x => data.axes[a].numbers[p.at[a]],
            Some(a) => p.at[a] as f64,
        }
    };
    // Lines: one per combination of the other axes' values.
    let others: Vec<usize> = (0..data.axes.len()).filter(|&a| Some(a) != x_axis).collect();
    let mut lines_of: Vec<(Vec<usize>, Vec<usize>)> = Vec::new();
    for (i, p) in data.points.iter().enumerate() {
        let key: Vec<usize> = others.iter().map(|&a| p.at[a]).collect();
        match lines_of.iter_mut().find(|(k, _)| *k == key) {
            Some((_, m)) => m.push(i),
            None => lines_of.push((key, vec![i])),
        }
    }
    lines_of.sort_by(|a, b| a.0.cmp(&b.0));
    let line_labels: Vec<String> = lines_of
        .iter()
        .map(|(key, _)| {
            key.iter().zip(&others).map(|(&v, &a)| data.axes[a].values[v].as_str()).collect::<Vec<_>>().join(", ")
        })
        .collect();
    let members: Vec<Vec<usize>> = lines_of.into_iter().map(|(_, m)| m).collect();
    let n = line_labels.len();
    // A numeric axis spanning two decades or more (bandwidths, capacities) reads best on a log scale.
    let xs: Vec<f64> = data.points.iter().map(x_of).collect();
    let (x_lo, x_hi) = xs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
    let x_log = numeric_x && x_lo > 0.0 && x_hi / x_lo >= 50.0;
    let metrics = [
        ("TTFT p50 (ms)", col::TTFT_P50_MS, "TTFT p50 (ms)"),
        ("TTFT p99 (ms)", col::TTFT_P99_MS, "TTFT p99 (ms)"),
        ("TPOT p50 (ms)", col::TPOT_P50_MS, "TPOT p50 (ms)"),
        ("TPOT p99 (ms)", col::TPOT_P99_MS, "TPOT p99 (ms)"),
    ];
    let panels = metrics
        .iter()
        .map(|&(title, column, y_desc)| {
            let lines: Vec<Line> = members
                .iter()
                .enumerate()
                .map(|(k, pts)| {
                    let mut rows: Vec<(f64, f64, f64, f64)> = pts
                        .iter()
                        .filter_map(|&i| {
                            let p = &data.points[i];
                            let (m, half) = mean_ci(&p.samples(column))?;
                            // Percentiles are never negative; neither is the interval shown.
                            // Side by side at a category, so intervals do not hide each other.
                            let dodge =
                                if numeric_x { 0.0 } else { (k as f64 - (n as f64 - 1.0) / 2.0) * 0.5 / n as f64 };
                            Some((x_of(p) + dodge, m, (m - half).max(0.0), m + half))
                        })
                        .filter(|r| r.0.is_finite())
                        .collect();
                    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
                    Line {
                        color: color(k, n),
                        stroke: if numeric_x { Stroke::nth(k) } else { Stroke::None },
                        points: rows.iter().map(|r| (r.0, r.1)).collect(),
                        band: Vec::new(),
                        errors: rows.iter().filter(|r| r.3 > r.2).map(|r| (r.0, r.2, r.1, r.3)).collect(),
                        marker: Some(Marker::nth(k)),
                    }
                })
                .filter(|l| !l.points.is_empty())
                .collect();
            Panel {
                title: title.into(),
                x_desc: match x_axis {
                    Some(a) => data.axes[a].desc(),
                    None => "(the sweep has no axes)".into(),
                },
                y_desc: y_desc.into(),
                x_log,
                y_log: false,
                quantity: 0,
                x_range: None,
                y_range: None,
                x_categories: (!numeric_x)
                    .then(|| x_axis.map_or_else(|| vec!["all runs".to_string()], |a| data.axes[a].values.clone())),
                lines,
                empty_note: "no successful runs",
            }
        })
        .collect();
    let legend_title = others.iter().map(|&a| data.axes[a].label.as_str()).collect::<Vec<_>>().join(", ");
    let legend = line_labels
        .iter()
        .zip(&members)
        .enumerate()
        .map(|(k, (l, pts))| {
            let label = if l.is_empty() { "mean over replicates (bars: 95 % interval)".into() } else { l.clone() };
            Key {
                label: no_data_note(label, pts.iter().any(|&i| !data.points[i].runs.is_empty())),
                color: color(k, n),
                stroke: if numeric_x { Stroke::nth(k) } else { Stroke::None },
                marker: Some(Marker::nth(k)),
            }
        })
        .collect();
    let mut body = LineFigure { legend_title, legend, panels, columns: 2, panel_size: (600, 380) };
    harmonise(&mut body);
    Ok(Figure {
        stem: "fig3-percentiles",
        title: match x_axis {
            Some(a) if numeric_x => format!("TTFT and TPOT percentiles vs {}", data.axes[a].label),
            Some(a) => format!("TTFT and TPOT percentiles per {}", data.axes[a].label),
            None => "TTFT and TPOT percentiles".into(),
        },
        caption: "Each marker is the mean over a point's successful replicates of that run's percentile; error \
                  bars are 95 % Student-t confidence intervals across replicates (none with a single replicate). \
                  All four panels share one y scale: logarithmic when their values span more than two decades."
            .into(),
        body: Body::Lines(body),
    })
}

// ---------------------------------------------------------------- figure 4

/// The points in the order figure 4 draws them: a search's probes by grid
/// point and then by the searched value (the last axis), not in the order
/// they were probed; a sweep's in grid order.
fn bar_order(data: &SweepData) -> Vec<&Point> {
    let mut points: Vec<&Point> = data.points.iter().collect();
    if data.search.is_some()
        && let Some(x) = data.axes.len().checked_sub(1)
    {
        let value = |p: &Point| data.axes[x].numbers.get(p.at[x]).copied().unwrap_or(f64::NAN);
        points.sort_by(|a, b| a.at[..x].cmp(&b.at[..x]).then(value(a).total_cmp(&value(b))));
    }
    points
}

fn cache_bars(data: &SweepData) -> Result<Figure, String> {
    let mean = |p: &Point, col: &str| mean_ci(&p.samples(col)).map_or(0.0, |m| m.0);
    let points = bar_order(data);
    let labels: Vec<String> = points.iter().map(|p| data.point_label(p)).collect();
    let hits = points
        .iter()
        .map(|p| Tier::ALL.iter().map(|&t| (t, mean(p, &format!("hit_ratio_{}", t.short())))).collect())
        .collect();
    let bytes = points
        .iter()
        .map(|p| {
            Tier::ALL[1..]
                .iter()
                .map(|&t| {
                    let s = t.short();
                    (t, (mean(p, &format!("bytes_read_{s}")) + mean(p, &format!("bytes_written_{s}"))) / 1e9)
                })
                .collect()
        })
        .collect();
    let any = |segs: &Vec<Vec<(Tier, f64)>>| segs.iter().flatten().any(|&(_, v)| v > 0.0);
    let (any_hit, any_bytes) = (any(&hits), any(&bytes));
    if !any_hit && !any_bytes {
        return Err("no prefix hits in any tier and no storage-tier traffic".into());
    }
    let mut caption = String::new();
    let mut panels = Vec::new();
    if any_hit {
        caption.push_str(
            "Prefix-hit ratio: the fraction of prompt tokens served from each KV-cache tier (GPU, CPU, NVMe, DFS; \
             the bar's length is the total prefix-hit ratio). ",
        );
        panels.push(BarPanel {
            title: "prefix-hit ratio by tier (fraction of prompt tokens)".into(),
            x_desc: "fraction of prompt tokens served from the tier".into(),
            bars: labels.clone(),
            segments: hits,
            x_max: Some(1.0),
        });
    } else {
        caption.push_str("No prompt token was found in any tier, so no hit ratios are drawn. ");
    }
    if any_bytes {
        caption.push_str("KV traffic: bytes read plus written by each storage tier's devices (CPU, NVMe, DFS). ");
        panels.push(BarPanel {
            title: "KV traffic by storage tier (GB)".into(),
            x_desc: "GB read + written by the tier (10⁹ bytes)".into(),
            bars: labels,
            segments: bytes,
            x_max: None,
        });
    } else {
        caption.push_str("No storage-tier traffic is drawn: no CPU, NVMe or DFS tier moved a byte. ");
    }
    caption.push_str("Means over successful replicates.");
    Ok(Figure {
        stem: "fig4-cache",
        title: "Prefix-cache hits and storage traffic per grid point".into(),
        caption,
        body: Body::Bars(BarFigure { tiers: tiers_drawn(&panels), panels }),
    })
}

/// The tiers a bar figure's legend lists: those with a segment to draw
/// (a tier the sweep does not configure has none).
fn tiers_drawn(panels: &[BarPanel]) -> Vec<Tier> {
    Tier::ALL
        .iter()
        .copied()
        .filter(|&t| panels.iter().flat_map(|p| p.segments.iter().flatten()).any(|&(s, v)| s == t && v > 0.0))
        .collect()
}

// ---------------------------------------------------------------- figure 6

const NOT_APPLICABLE: &str = "only for sweeps with an SC25Workload stage";
/// Why figure 8 is not drawn for a sweep or search over load.
const PLATFORM_ONLY: &str = "only when every axis is a platform choice (GPU, TP, workers, tiers, policy): \
    across loads a cost frontier only shows idle power being amortised";

fn sc25(data: &SweepData) -> Result<Figure, String> {
    let Some(rows) = &data.sc25 else { return Err(NOT_APPLICABLE.into()) };
    if rows.is_empty() {
        return Err("the sc25 table has no rows".into());
    }
    let n = data.points.len();
    let mut lines = Vec::new();
    let mut legend = Vec::new();
    for (i, p) in data.points.iter().enumerate() {
        let mut by_size: BTreeMap<u64, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
        for run in &p.runs {
            for s in rows.get(&run.run_id).into_iter().flatten() {
                let e = by_size.entry(s.prompt_tokens as u64).or_default();
                e.0.extend(s.cold_ttft_ms);
                e.1.extend(s.warm_ttft_ms);
            }
        }
        if by_size.is_empty() {
            continue;
        }
        let (c, marker) = (color(i, n), Some(Marker::nth(i)));
        for (stroke, pick) in [(Stroke::Dashed, 0), (Stroke::Solid, 1)] {
            let points: Vec<(f64, f64)> = by_size
                .iter()
                .filter_map(|(&size, v)| {
                    let v = if pick == 0 { &v.0 } else { &v.1 };
                    mean_ci(v).map(|m| (size as f64, m.0))
                })
                .collect();
            lines.push(Line { color: c, stroke, points, band: Vec::new(), errors: Vec::new(), marker });
        }
        if n > 1 {
            legend.push(Key { label: data.point_label(p), color: c, stroke: Stroke::None, marker });
        }
    }
    let style_color = if n == 1 { color(0, 1) } else { BLACK };
    legend.push(Key { label: "cold pass".into(), color: style_color, stroke: Stroke::Dashed, marker: None });
    legend.push(Key { label: "warm pass".into(), color: style_color, stroke: Stroke::Solid, marker: None });
    Ok(Figure {
        stem: "fig6-sc25",
        title: "SC25 benchmark: cold vs warm TTFT by prompt size".into(),
        caption: "Cold pass: each prompt computed from scratch. Warm pass: the same prompts again, their KV blocks \
                  found in the cache tiers. Means over successful replicates; log-scale TTFT. Points differing only \
                  in their cache tiers share the cold line: each point has its own marker shape, so markers on \
                  top of each other stay visible."
            .into(),
        body: Body::Lines(LineFigure {
            legend_title: String::new(),
            legend,
            panels: vec![Panel {
                title: String::new(),
                x_desc: "prompt size (tokens)".into(),
                y_desc: "TTFT (ms)".into(),
                x_log: false,
                y_log: true,
                quantity: 0,
                x_range: None,
                y_range: None,
                x_categories: None,
                lines,
                empty_note: "no SC25 requests completed",
            }],
            columns: 1,
            panel_size: (900, 520),
        }),
    })
}

// ---------------------------------------------------------------- figure 8

/// The points no other point beats on both coordinates (lower is better),
/// by increasing x: scanning by cost, a point is on the frontier when it is
/// faster than every cheaper one.
fn pareto(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut sorted = points.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let mut frontier: Vec<(f64, f64)> = Vec::new();
    for q in sorted {
        if frontier.last().is_none_or(|l| q.1 < l.1) {
            frontier.push(q);
        }
    }
    frontier
}

/// Cost (dollars per million output tokens, or joules per output token
/// without prices) against TTFT p99, one marker per grid point (mean over
/// replicates), coloured by the first axis, with the Pareto frontier: the
/// points no other point beats on both.
fn cost_frontier(data: &SweepData) -> Result<Figure, String> {
    // A frontier compares platforms serving the same load. Over load (a
    // rate axis, a search's probes) it only shows idle power amortised.
    let load = |a: &super::data::Axis| a.path.split(" / ").all(|p| p.starts_with("workload."));
    if data.search.is_some() || data.pareto.is_some() || data.axes.is_empty() || data.axes.iter().any(load) {
        return Err(PLATFORM_ONLY.into());
    }
    let pick = |col: &str| -> Vec<Option<(f64, f64)>> {
        data.points
            .iter()
            .map(|p| {
                let x = mean_ci(&p.samples(col))?.0;
                let y = mean_ci(&p.samples(col::TTFT_P99_MS))?.0;
                (x.is_finite() && y.is_finite() && x > 0.0 && y > 0.0).then_some((x, y))
            })
            .collect()
    };
    let dollars = pick(col::USD_PER_M_OUTPUT_TOKENS);
    let (xy, x_desc, what) = if dollars.iter().flatten().count() >= 2 {
        (
            dollars,
            "dollars per million output tokens",
            "dollars per million output tokens (at the spec's usd_per_gpu_hour)",
        )
    } else {
        (
            pick(col::JOULES_PER_OUTPUT_TOKEN),
            "joules per output token",
            "joules per output token (no usd_per_gpu_hour given)",
        )
    };
    let known: Vec<(f64, f64)> = xy.iter().flatten().copied().collect();
    if known.len() < 2 {
        return Err("fewer than two grid points with a cost and a TTFT p99".into());
    }
    let f = facets(data);
    let n = f.lines.len();
    let mut lines: Vec<Line> = (0..n)
        .map(|i| Line {
            color: color(i, n),
            stroke: Stroke::None,
            points: Vec::new(),
            band: Vec::new(),
            errors: Vec::new(),
            marker: Some(Marker::nth(i)),
        })
        .collect();
    for (pi, p) in data.points.iter().enumerate() {
        if let Some(q) = xy[pi] {
            let line = if data.axes.is_empty() { 0 } else { p.at[0] };
            lines[line].points.push(q);
        }
    }
    let frontier = pareto(&known);
    let mut legend = line_keys(data, &f);
    for (k, key) in legend.iter_mut().enumerate() {
        (key.stroke, key.marker) = (Stroke::None, Some(Marker::nth(k)));
    }
    legend.push(Key { label: "Pareto frontier".into(), color: BLACK, stroke: Stroke::Dashed, marker: None });
    lines.retain(|l| !l.points.is_empty());
    lines.push(Line {
        color: BLACK,
        stroke: Stroke::Dashed,
        points: frontier,
        band: Vec::new(),
        errors: Vec::new(),
        marker: None,
    });
    let (lo, hi) = known.iter().fold((f64::INFINITY, 0.0f64), |(a, b), q| (a.min(q.0), b.max(q.0)));
    let mut lf = LineFigure {
        legend_title: legend_title(data),
        legend,
        panels: vec![Panel {
            title: String::new(),
            x_desc: x_desc.into(),
            y_desc: "TTFT p99 (ms)".into(),
            x_log: hi / lo > 100.0,
            y_log: false,
            quantity: 0,
            x_range: None,
            y_range: None,
            x_categories: None,
            lines,
            empty_note: "no grid point has both numbers",
        }],
        columns: 1,
        panel_size: (900, 560),
    };
    harmonise(&mut lf);
    Ok(Figure {
        stem: "fig8-cost-frontier",
        title: "What TTFT p99 costs".into(),
        caption: format!(
            "Each marker is a grid point: mean over its successful replicates of {what} against TTFT p99. The \
             dashed line joins the Pareto frontier — the points that no other point beats on both cost and \
             TTFT p99; everything above and right of it costs more for a slower tail."
        ),
        body: Body::Lines(lf),
    })
}

// ---------------------------------------------------------------- figure 10

/// A Pareto search: every evaluated lattice point by its first two
/// objectives (means over replicates), feasible and infeasible apart, with
/// the frontier `pareto.parquet` marks joined by a dashed line.
fn pareto_figure(data: &SweepData) -> Result<Figure, String> {
    let Some(p) = &data.pareto else { return Err("only for searches with kind = \"pareto\"".into()) };
    let mut feasible = Vec::new();
    let mut infeasible = Vec::new();
    let mut frontier = Vec::new();
    for &(x, y, ok, on) in &p.points {
        let (Some(x), Some(y)) = (x, y) else { continue };
        if !(x.is_finite() && y.is_finite()) {
            continue;
        }
        if ok {
            feasible.push((x, y))
        } else {
            infeasible.push((x, y))
        }
        if on {
            frontier.push((x, y));
        }
    }
    if feasible.len() + infeasible.len() < 2 {
        return Err("fewer than two evaluated points with both objectives".into());
    }
    frontier.sort_by(|a, b| a.0.total_cmp(&b.0));
    let line =
        |color, stroke, points, marker| Line { color, stroke, points, band: Vec::new(), errors: Vec::new(), marker };
    let desc = |(name, min): &(String, bool)| format!("{name} ({} is better)", if *min { "lower" } else { "higher" });
    let all: Vec<f64> = feasible.iter().chain(&infeasible).map(|q| q.0).collect();
    let (lo, hi) = all.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
    let mut lf = LineFigure {
        legend_title: "evaluated points".into(),
        legend: vec![
            Key { label: "feasible".into(), color: color(0, 2), stroke: Stroke::None, marker: Some(Marker::nth(0)) },
            Key {
                label: "infeasible (SLO, failed or unstable)".into(),
                color: RGBColor(150, 150, 150),
                stroke: Stroke::None,
                marker: Some(Marker::nth(1)),
            },
            Key { label: "Pareto frontier".into(), color: BLACK, stroke: Stroke::Dashed, marker: None },
        ],
        panels: vec![Panel {
            title: String::new(),
            x_desc: desc(&p.objectives[0]),
            y_desc: desc(&p.objectives[1]),
            x_log: lo > 0.0 && hi / lo > 100.0,
            y_log: false,
            quantity: 0,
            x_range: None,
            y_range: None,
            x_categories: None,
            lines: [
                line(color(0, 2), Stroke::None, feasible, Some(Marker::nth(0))),
                line(RGBColor(150, 150, 150), Stroke::None, infeasible, Some(Marker::nth(1))),
                line(BLACK, Stroke::Dashed, frontier, None),
            ]
            .into_iter()
            .filter(|l| !l.points.is_empty())
            .collect(),
            empty_note: "no point has both objectives",
        }],
        columns: 1,
        panel_size: (900, 560),
    };
    harmonise(&mut lf);
    Ok(Figure {
        stem: "fig10-pareto",
        title: "The Pareto frontier the search found".into(),
        caption: format!(
            "Each marker is a lattice point the Pareto search evaluated: the mean over its replicates of {} against {}. \
             Grey markers are infeasible (an SLO missed, a run failed or unstable). The dashed line joins the frontier \
             (on_frontier in pareto.parquet): the feasible points no other beats on every objective.",
            p.objectives[0].0, p.objectives[1].0
        ),
        body: Body::Lines(lf),
    })
}

// ---------------------------------------------------------------- figure 9

/// A search: each SLO metric against the searched value (the last axis),
/// one line per grid point through its probes (means over replicates), the
/// SLO threshold dashed (across the probed range, or around the one value
/// probed), and each grid point's answer — its best probe that met every
/// constraint with 95 % confidence, at least half of whose runs reached a
/// steady state and at most half kept growing, as the search judges — marked.
fn search_figure(data: &SweepData) -> Result<Figure, String> {
    const NOT_A_SEARCH: &str = "only for searches ([search] in the spec)";
    let Some(slo) = &data.search else { return Err(NOT_A_SEARCH.into()) };
    let Some(x_axis) = data.axes.len().checked_sub(1) else { return Err(NOT_A_SEARCH.into()) };
    // Grid points: the values of the other axes.
    let mut groups: Vec<(Vec<usize>, Vec<usize>)> = Vec::new();
    for (i, p) in data.points.iter().enumerate() {
        let key = p.at[..x_axis].to_vec();
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, m)) => m.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    let n = groups.len();
    let x_of = |p: &Point| data.axes[x_axis].numbers[p.at[x_axis]];
    let passes = |i: usize| {
        let p = &data.points[i];
        let count = |f: fn(&crate::report::data::RunRow) -> bool| p.runs.iter().filter(|r| f(r)).count();
        !p.runs.is_empty()
            && p.runs.len() == p.total_runs
            && 2 * count(|r| r.unstable) <= p.runs.len()
            && 2 * count(|r| r.stable) >= p.runs.len()
            && slo.iter().all(|c| c.holds(&p.samples(&c.metric)))
    };
    let found: Vec<Option<usize>> = groups
        .iter()
        .map(|(_, members)| {
            let by_x = |a: &usize, b: &usize| x_of(&data.points[*a]).total_cmp(&x_of(&data.points[*b]));
            let passing = members.iter().copied().filter(|&i| passes(i));
            if data.search_min { passing.min_by(by_x) } else { passing.max_by(by_x) }
        })
        .collect();
    let xs: Vec<f64> = data.points.iter().map(x_of).collect();
    let (lo, hi) = xs.iter().fold((f64::INFINITY, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
    // Every probe at one value (a search that stopped at its bound): the
    // threshold still needs a length to be seen, so the axis spans ±10 %.
    let (lo, hi) = if hi > lo {
        (lo, hi)
    } else if lo > 0.0 {
        (0.9 * lo, 1.1 * hi)
    } else {
        (lo - 1.0, hi + 1.0)
    };
    let mut panels = Vec::new();
    let mut capped = false;
    for c in slo {
        let mut lines: Vec<Line> = groups
            .iter()
            .enumerate()
            .map(|(g, (_, members))| {
                let mut pts: Vec<(f64, f64)> = members
                    .iter()
                    .filter_map(|&i| {
                        let p = &data.points[i];
                        Some((x_of(p), mean_ci(&p.samples(&c.metric))?.0))
                    })
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                Line {
                    color: color(g, n),
                    stroke: Stroke::nth(g),
                    points: pts,
                    band: Vec::new(),
                    errors: Vec::new(),
                    marker: Some(Marker::Circle),
                }
            })
            .collect();
        for (g, f) in found.iter().enumerate() {
            if let Some(i) = *f
                && let Some((m, _)) = mean_ci(&data.points[i].samples(&c.metric))
            {
                lines.push(Line {
                    color: color(g, n),
                    stroke: Stroke::None,
                    points: vec![(x_of(&data.points[i]), m)],
                    band: Vec::new(),
                    errors: Vec::new(),
                    marker: Some(Marker::Cross),
                });
            }
        }
        lines.push(Line {
            color: BLACK,
            stroke: Stroke::Dashed,
            points: vec![(lo, c.value), (hi, c.value)],
            band: Vec::new(),
            errors: Vec::new(),
            marker: None,
        });
        // An overloaded probe can sit orders of magnitude above the
        // threshold and squash the answers against the axis: an upper
        // bound stops the axis at 4 × the threshold (or the highest
        // answer), and probes above it are drawn on the top edge.
        let answers_top =
            lines.iter().filter(|l| l.marker == Some(Marker::Cross)).flat_map(|l| l.points.iter().map(|q| q.1));
        let cap = 4.0 * answers_top.fold(c.value, f64::max);
        let top = lines.iter().flat_map(|l| l.points.iter().map(|q| q.1)).filter(|v| v.is_finite()).fold(0.0, f64::max);
        let y_range = (c.at_most && c.value > 0.0 && top > cap).then_some((0.0, cap));
        capped |= y_range.is_some();
        panels.push(Panel {
            title: c.to_string(),
            x_desc: data.axes[x_axis].desc(),
            y_desc: c.metric.clone(),
            x_log: lo > 0.0 && hi / lo > 100.0,
            y_log: false,
            // Each constraint is its own quantity.
            quantity: panels.len(),
            x_range: None,
            y_range,
            x_categories: None,
            lines,
            empty_note: "no probe succeeded",
        });
    }
    let others: Vec<usize> = (0..x_axis).collect();
    let mut legend: Vec<Key> = groups
        .iter()
        .enumerate()
        .map(|(g, (_, members))| Key {
            label: if others.is_empty() { "probes".into() } else { data.label(&data.points[members[0]], &others) },
            color: color(g, n),
            stroke: Stroke::nth(g),
            marker: Some(Marker::Circle),
        })
        .collect();
    legend.push(Key { label: "answer".into(), color: BLACK, stroke: Stroke::None, marker: Some(Marker::Cross) });
    legend.push(Key { label: "SLO".into(), color: BLACK, stroke: Stroke::Dashed, marker: None });
    let columns = panels.len().min(2);
    let mut lf = LineFigure { legend_title: String::new(), legend, panels, columns, panel_size: (640, 420) };
    harmonise(&mut lf);
    Ok(Figure {
        stem: "fig9-search",
        title: format!("Search: the SLO against {}", data.axes[x_axis].label),
        caption: format!(
            "Each line is a grid point's probes (means over replicates), in the order of the searched value; \
             the dashed line is the SLO threshold; the cross is the grid point's answer — its best probe that \
             met every constraint with 95 % confidence (so it can sit below a threshold the mean alone \
             would cross). The answers are also listed in the table above.{}",
            if capped {
                " Where probes lie far above a threshold, that panel's axis stops at 4 × the threshold (or the highest answer) and they are drawn on its top edge."
            } else {
                ""
            }
        ),
        body: Body::Lines(lf),
    })
}

// ---------------------------------------------------------------- drawing

const TITLE_H: u32 = 44;

fn text_style(size: u32) -> TextStyle<'static> {
    TextStyle::from((FONT, size).into_font()).color(&BLACK)
}

fn title_style() -> TextStyle<'static> {
    TextStyle::from((FONT, 22).into_font().style(FontStyle::Bold)).color(&BLACK)
}

/// Lays legend entries out in rows; returns the height needed and the
/// position of each entry.
fn legend_layout<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    keys: &[Key],
) -> Fallible<(u32, Vec<(i32, i32)>)>
where
    DB::ErrorType: 'static,
{
    let style = text_style(15);
    let width = area.dim_in_pixel().0 as i32 - 20;
    let title_w =
        if title.is_empty() { 0 } else { area.estimate_text_size(&format!("{title}:"), &style)?.0 as i32 + 14 };
    let (mut x, mut y) = (10 + title_w, 0);
    let mut at = Vec::new();
    for k in keys {
        let w = 30 + area.estimate_text_size(&k.label, &style)?.0 as i32 + 20;
        if x + w > width && x > 10 + title_w {
            x = 10 + title_w;
            y += 22;
        }
        at.push((x, y));
        x += w;
    }
    Ok(((y + 30) as u32, at))
}

fn draw_legend<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, title: &str, keys: &[Key]) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let (_, at) = legend_layout(area, title, keys)?;
    let style = text_style(15).pos(Pos::new(HPos::Left, VPos::Center));
    if !title.is_empty() {
        area.draw_text(&format!("{title}:"), &style, (10, 12))?;
    }
    for (k, &(x, y)) in keys.iter().zip(&at) {
        let y = y + 12;
        let line = k.color.stroke_width(3);
        match k.stroke {
            Stroke::Solid => area.draw(&PathElement::new(vec![(x, y), (x + 24, y)], line))?,
            Stroke::Dashed | Stroke::Dotted => {
                let tagged = k.color.mix(k.stroke.tag_alpha()).stroke_width(3);
                area.draw(&PathElement::new(vec![(x, y), (x + 24, y)], tagged))?
            }
            Stroke::None if k.marker.is_none() => area.draw(&Circle::new((x + 12, y), 4, k.color.filled()))?,
            Stroke::None => {}
        }
        if let Some(m) = k.marker {
            let c = k.color.stroke_width(2);
            let (cx, cy) = (x + 12, y);
            match m {
                Marker::Circle => area.draw(&Circle::new((cx, cy), 5, c))?,
                Marker::Triangle => area
                    .draw(&PathElement::new(vec![(cx, cy - 6), (cx + 5, cy + 4), (cx - 5, cy + 4), (cx, cy - 6)], c))?,
                Marker::Square => area.draw(&Rectangle::new([(cx - 4, cy - 4), (cx + 4, cy + 4)], c))?,
                Marker::Cross => {
                    area.draw(&PathElement::new(vec![(cx - 5, cy - 5), (cx + 5, cy + 5)], c))?;
                    area.draw(&PathElement::new(vec![(cx - 5, cy + 5), (cx + 5, cy - 5)], c))?;
                }
            }
        }
        area.draw_text(&k.label, &style, (x + 30, y))?;
    }
    Ok(())
}

fn data_range(values: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite() && (!log || *v > 0.0))
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    if !lo.is_finite() {
        return if log { (0.1, 10.0) } else { (0.0, 1.0) };
    }
    if log {
        (lo / 1.3, hi * 1.3)
    } else if lo == hi {
        if lo == 0.0 { (0.0, 1.0) } else { (lo - lo.abs() * 0.1, hi + hi.abs() * 0.1) }
    } else {
        let pad = (hi - lo) * 0.04;
        (if lo >= 0.0 { (lo - pad).max(0.0) } else { lo - pad }, hi + pad)
    }
}

/// A panel's y limits from its data. On a log axis, lower ends of bands and
/// intervals more than a decade below the smallest value do not stretch
/// the axis (they are drawn clipped at its bottom).
fn y_extent(p: &Panel) -> (f64, f64) {
    let values = || p.lines.iter().flat_map(|l| l.points.iter().map(|q| q.1));
    let floor = if p.y_log {
        values().filter(|v| v.is_finite() && *v > 0.0).fold(f64::INFINITY, f64::min) / 10.0
    } else {
        f64::NEG_INFINITY
    };
    let ys = p.lines.iter().flat_map(|l| {
        l.points
            .iter()
            .map(|q| q.1)
            .chain(l.band.iter().flat_map(|b| [b.2, b.1].into_iter().filter(|v| *v >= floor)))
            .chain(l.errors.iter().flat_map(|e| [e.3, e.1].into_iter().filter(|v| *v >= floor)))
    });
    let (lo, hi) = data_range(ys, p.y_log);
    if p.y_log { (lo, hi) } else { (lo.min(0.0), hi) }
}

fn draw_panel<DB: DrawingBackend>(p: &Panel, area: &DrawingArea<DB, Shift>) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let xs = p.lines.iter().flat_map(|l| l.points.iter().map(|q| q.0));
    let (mut x0, mut x1) = p.x_range.unwrap_or_else(|| data_range(xs, p.x_log));
    if let Some(c) = &p.x_categories {
        (x0, x1) = (-0.5, c.len() as f64 - 0.5);
    }
    let (y0, y1) = p.y_range.unwrap_or_else(|| y_extent(p));
    match (p.x_log, p.y_log) {
        (false, false) => panel_in(p, area, x0..x1, y0..y1),
        (true, false) => panel_in(p, area, log_axis(x0, x1), y0..y1),
        (false, true) => panel_in(p, area, x0..x1, log_axis(y0, y1)),
        (true, true) => panel_in(p, area, log_axis(x0, x1), log_axis(y0, y1)),
    }
}

/// Tick values for a log axis over [lo, hi]: labelled ticks on a 1-2-5
/// (or sparser, or denser) sequence so that 3 to 8 are labelled, and grid
/// lines at every 1…9 × 10^k.
fn log_ticks(lo: f64, hi: f64) -> (Vec<f64>, Vec<f64>) {
    let within = |mantissas: &[f64]| -> Vec<f64> {
        let mut out = Vec::new();
        let mut decade = 10f64.powf(lo.log10().floor());
        while decade <= hi {
            for m in mantissas {
                let v = m * decade;
                if v >= lo && v <= hi {
                    out.push(v);
                }
            }
            decade *= 10.0;
        }
        out
    };
    let mut bold = within(&[1.0, 2.0, 5.0]);
    if bold.len() < 3 {
        bold = within(&[1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.0]);
    } else {
        for sparser in [&[1.0, 3.0][..], &[1.0][..]] {
            if bold.len() > 8 {
                bold = within(sparser);
            }
        }
    }
    (bold, within(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]))
}

fn log_axis(lo: f64, hi: f64) -> WithKeyPoints<LogCoord<f64>> {
    let (bold, light) = log_ticks(lo, hi);
    LogCoord::from((lo..hi).log_scale()).with_key_points(bold).with_light_points(light)
}

fn panel_in<DB, X, Y>(p: &Panel, area: &DrawingArea<DB, Shift>, x: X, y: Y) -> DrawResult
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut builder = ChartBuilder::on(area);
    builder.margin(8).margin_right(18).x_label_area_size(46).y_label_area_size(66);
    if !p.title.is_empty() {
        builder.caption(&p.title, text_style(16));
    }
    let mut chart = builder.build_cartesian_2d(x, y)?;
    let cats = p.x_categories.clone();
    let x_fmt = move |v: &f64| match &cats {
        Some(c) => category(c, *v),
        None => si(*v),
    };
    let x_labels = p.x_categories.as_ref().map_or(6, |c| c.len().max(1));
    let log = |desc: &str, log: bool| if log { format!("{desc}, log scale") } else { desc.to_string() };
    chart
        .configure_mesh()
        .x_desc(log(&p.x_desc, p.x_log))
        .y_desc(log(&p.y_desc, p.y_log))
        .x_labels(x_labels)
        .y_labels(6)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&|v| si(*v))
        .label_style(text_style(13))
        .axis_desc_style(text_style(14))
        .light_line_style(RGBColor(238, 238, 238))
        .max_light_lines(4)
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()?;
    let (ylo, yhi) = {
        let r = chart.y_range();
        (r.start, r.end)
    };
    let clamp = |v: f64| v.clamp(ylo, yhi);
    // Overlapping bands add up: the more lines, the fainter each band.
    let band_alpha = (0.3 / p.lines.len().max(1) as f64).clamp(0.06, 0.16);
    for l in &p.lines {
        if l.band.len() > 1 {
            let upper = l.band.iter().map(|b| (b.0, clamp(b.2)));
            let lower = l.band.iter().rev().map(|b| (b.0, clamp(b.1)));
            chart.draw_series(std::iter::once(Polygon::new(
                upper.chain(lower).collect::<Vec<_>>(),
                l.color.mix(band_alpha).filled(),
            )))?;
        }
    }
    for l in &p.lines {
        let style = l.color.stroke_width(2);
        let pts: Vec<(f64, f64)> = l.points.iter().map(|&(x, y)| (x, clamp(y))).collect();
        match l.stroke {
            Stroke::Solid => {
                chart.draw_series(LineSeries::new(pts.clone(), style))?;
            }
            // One polyline each, its pattern added as `stroke-dasharray`
            // after drawing (plotters would write one polyline per dash).
            Stroke::Dashed | Stroke::Dotted => {
                let tagged = l.color.mix(l.stroke.tag_alpha()).stroke_width(2);
                chart.draw_series(LineSeries::new(pts.clone(), tagged))?;
            }
            Stroke::None => {}
        }
        // Hollow markers, so that one drawn on another leaves it visible.
        let pen = l.color.stroke_width(2);
        match l.marker {
            None => {}
            Some(Marker::Circle) => {
                chart.draw_series(pts.iter().map(|&q| Circle::new(q, 5, pen)))?;
            }
            Some(Marker::Triangle) => {
                chart.draw_series(pts.iter().map(|&q| TriangleMarker::new(q, 6, pen)))?;
            }
            Some(Marker::Square) => {
                chart
                    .draw_series(pts.iter().map(|&q| EmptyElement::at(q) + Rectangle::new([(-4, -4), (4, 4)], pen)))?;
            }
            Some(Marker::Cross) => {
                chart.draw_series(pts.iter().map(|&q| Cross::new(q, 5, pen)))?;
            }
        }
        chart.draw_series(l.errors.iter().map(|&(x, lo, mean, hi)| {
            ErrorBar::new_vertical(x, clamp(lo), clamp(mean), clamp(hi), l.color.stroke_width(1), 8)
        }))?;
    }
    if p.lines.iter().all(|l| l.points.is_empty()) {
        note_in_plot(area, chart.plotting_area(), p.empty_note)?;
    }
    Ok(())
}

/// Writes `note` (if any) in the middle of a chart's plotting area `plot`, which lies in `area`.
fn note_in_plot<DB: DrawingBackend, CT: CoordTranslate>(
    area: &DrawingArea<DB, Shift>,
    plot: &DrawingArea<DB, CT>,
    note: &str,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    if note.is_empty() {
        return Ok(());
    }
    let (w, h) = plot.dim_in_pixel();
    let (ox, oy) = plot.get_base_pixel();
    let (bx, by) = area.get_base_pixel();
    let centre = (ox - bx + w as i32 / 2, oy - by + h as i32 / 2);
    area.draw_text(note, &text_style(14).pos(Pos::new(HPos::Center, VPos::Center)), centre)?;
    Ok(())
}

/// The name of category `v` of `names` (empty between categories).
fn category(names: &[String], v: f64) -> String {
    let i = v.round();
    if (v - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < names.len() {
        names[i as usize].clone()
    } else {
        String::new()
    }
}

fn draw_lines<DB: DrawingBackend>(title: &str, f: &LineFigure, root: &DrawingArea<DB, Shift>) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let body = root.titled(title, title_style())?;
    let (legend_h, _) = legend_layout(&body, &f.legend_title, &f.legend)?;
    let (legend, charts) = body.split_vertically(legend_h);
    draw_legend(&legend, &f.legend_title, &f.legend)?;
    let rows = f.panels.len().div_ceil(f.columns);
    for (p, area) in f.panels.iter().zip(charts.split_evenly((rows, f.columns))) {
        draw_panel(p, &area)?;
    }
    Ok(())
}

fn bars_label_width<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, f: &BarFigure) -> Fallible<u32>
where
    DB::ErrorType: 'static,
{
    let style = text_style(13);
    let mut w = 40;
    for label in f.panels.iter().flat_map(|p| &p.bars) {
        w = w.max(area.estimate_text_size(label, &style)?.0 + 16);
    }
    Ok(w)
}

fn draw_bars<DB: DrawingBackend>(title: &str, f: &BarFigure, root: &DrawingArea<DB, Shift>) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let body = root.titled(title, title_style())?;
    let keys: Vec<Key> = f
        .tiers
        .iter()
        .map(|&t| Key { label: t.opal_name().into(), color: tier_color(t), stroke: Stroke::Solid, marker: None })
        .collect();
    let (legend_h, _) = legend_layout(&body, "tier", &keys)?;
    let (legend, charts) = body.split_vertically(legend_h);
    draw_legend(&legend, "tier", &keys)?;
    let label_w = bars_label_width(&charts, f)?;
    for (p, area) in f.panels.iter().zip(charts.split_evenly((1, f.panels.len()))) {
        let k = p.bars.len();
        let total = |s: &Vec<(Tier, f64)>| s.iter().map(|x| x.1).sum::<f64>();
        let max = p.segments.iter().map(total).fold(0.0, f64::max);
        let x1 = p.x_max.unwrap_or(if max > 0.0 { max * 1.05 } else { 1.0 });
        let mut chart = ChartBuilder::on(&area)
            .margin(8)
            .margin_right(22)
            .caption(&p.title, text_style(16))
            .x_label_area_size(46)
            .y_label_area_size(label_w)
            .build_cartesian_2d(0.0..x1, -0.5..(k as f64 - 0.5))?;
        // Bar i is drawn at y = k − 1 − i, so the first bar is on top.
        let bars: Vec<String> = p.bars.iter().rev().cloned().collect();
        chart
            .configure_mesh()
            .x_desc(&p.x_desc)
            .x_labels(6)
            .y_labels(k.max(1))
            .x_label_formatter(&|v| si(*v))
            .y_label_formatter(&|v| category(&bars, *v))
            .disable_y_mesh()
            .label_style(text_style(13))
            .axis_desc_style(text_style(14))
            .light_line_style(RGBColor(238, 238, 238))
            .max_light_lines(4)
            .max_light_lines(4)
            .bold_line_style(RGBColor(215, 215, 215))
            .draw()?;
        for (i, segs) in p.segments.iter().enumerate() {
            let y = (k - 1 - i) as f64;
            let mut x = 0.0;
            for &(tier, v) in segs {
                // (Nothing of a segment beyond a fixed axis end is drawn.)
                if v > 0.0 && x < x1 {
                    chart.draw_series(std::iter::once(Rectangle::new(
                        [(x, y - 0.36), ((x + v).min(x1), y + 0.36)],
                        tier_color(tier).filled(),
                    )))?;
                }
                x += v;
            }
        }
    }
    Ok(())
}

fn figure_size(f: &Figure) -> (u32, u32) {
    match &f.body {
        Body::Lines(l) => {
            let rows = l.panels.len().div_ceil(l.columns) as u32;
            let legend_rows = (l.legend.len() as u32).div_ceil(6).max(1);
            // At least wide enough for the title and a legend row.
            let width = (l.panel_size.0 * l.columns as u32).max(820);
            (width, TITLE_H + 10 + 22 * legend_rows + l.panel_size.1 * rows)
        }
        Body::Bars(b) => {
            let k = b.panels.first().map_or(1, |p| p.bars.len()) as u32;
            (700 * b.panels.len().max(1) as u32, TITLE_H + 40 + 100 + 28 * k.max(3))
        }
    }
}

fn draw<DB: DrawingBackend>(f: &Figure, root: DrawingArea<DB, Shift>) -> DrawResult
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    match &f.body {
        Body::Lines(l) => draw_lines(&f.title, l, &root)?,
        Body::Bars(b) => draw_bars(&f.title, b, &root)?,
    }
    root.present()?;
    Ok(())
}

/// Font families for the SVG's text: the layout was measured with DejaVu
/// Sans; Verdana (which DejaVu's Bitstream Vera ancestor matches in width)
/// stands in where it is not installed.
const SVG_FONTS: &str = r#"font-family="'DejaVu Sans',Verdana,sans-serif""#;

/// Draws `f` as SVG with plotters and, if `png`, rasterises that SVG with
/// resvg for the PNG (plotters' own bitmap text rendering misplaces
/// glyphs); writes the files into `dir`.
fn render(number: u32, f: &Figure, dir: &Path, png: bool) -> Result<FigureFile, ReportError> {
    let size = figure_size(f);
    let file = FigureFile {
        number,
        title: f.title.clone(),
        caption: f.caption.clone(),
        png: png.then(|| format!("{}.png", f.stem)),
        svg: format!("{}.svg", f.stem),
    };
    let fail = |name: &str, e: &dyn std::fmt::Display| {
        ReportError::Output(format!("{}: cannot draw: {e}", dir.join(name).display()))
    };
    let mut svg = String::new();
    draw(f, SVGBackend::with_string(&mut svg, size).into_drawing_area()).map_err(|e| fail(&file.svg, &e))?;
    let svg = thin_polylines(&Stroke::dash_patterns(&svg.replace(r#"font-family="sans-serif""#, SVG_FONTS)));
    super::write_atomic(&dir.join(&file.svg), svg.as_bytes())?;
    let Some(png_name) = &file.png else { return Ok(file) };
    let png = raster::png(&svg, size).map_err(|e| fail(png_name, &e))?;
    super::write_atomic(&dir.join(png_name), &png)?;
    Ok(file)
}

/// Whether this build can write PNGs (the `png` feature: resvg and an
/// encoder, about a third of the dependencies, left out of a lean build).
pub const PNG_SUPPORTED: bool = cfg!(feature = "png");

#[cfg(feature = "png")]
mod raster {
    /// DejaVu Sans for rasterising (the same face the layout was measured with).
    fn font_db() -> std::sync::Arc<resvg::usvg::fontdb::Database> {
        static DB: std::sync::OnceLock<std::sync::Arc<resvg::usvg::fontdb::Database>> = std::sync::OnceLock::new();
        DB.get_or_init(|| {
            let mut db = resvg::usvg::fontdb::Database::new();
            db.load_font_data(dejavu::sans::regular().to_vec());
            db.load_font_data(dejavu::sans::bold().to_vec());
            db.set_sans_serif_family("DejaVu Sans");
            std::sync::Arc::new(db)
        })
        .clone()
    }

    /// `svg` drawn on white at `size` pixels, as PNG bytes.
    pub fn png(svg: &str, size: (u32, u32)) -> Result<Vec<u8>, String> {
        let options = resvg::usvg::Options { fontdb: font_db(), ..resvg::usvg::Options::default() };
        let tree = resvg::usvg::Tree::from_str(svg, &options).map_err(|e| e.to_string())?;
        let mut pixmap = resvg::tiny_skia::Pixmap::new(size.0, size.1)
            .ok_or_else(|| format!("cannot allocate a {}×{} pixel image", size.0, size.1))?;
        pixmap.fill(resvg::tiny_skia::Color::WHITE);
        resvg::render(&tree, resvg::tiny_skia::Transform::default(), &mut pixmap.as_mut());
        encode_opaque_png(&pixmap).map_err(|e| e.to_string())
    }

    /// A figure drawn on white as an RGB PNG with fast compression: the pixels
    /// are opaque, so the alpha channel carries nothing, and deflate's default
    /// level took most of a report's time for files a few per cent smaller.
    fn encode_opaque_png(pixmap: &resvg::tiny_skia::Pixmap) -> Result<Vec<u8>, png::EncodingError> {
        let rgba = pixmap.data();
        debug_assert!(rgba.chunks_exact(4).all(|p| p[3] == 255), "figures are drawn on an opaque background");
        let rgb: Vec<u8> = rgba.chunks_exact(4).flat_map(|p| [p[0], p[1], p[2]]).collect();
        let mut out = Vec::new();
        let mut encoder = png::Encoder::new(&mut out, pixmap.width(), pixmap.height());
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        encoder.set_compression(png::Compression::Fast);
        encoder.write_header()?.write_image_data(&rgb)?;
        Ok(out)
    }
}

#[cfg(not(feature = "png"))]
mod raster {
    /// This build has no rasteriser.
    pub fn png(_svg: &str, _size: (u32, u32)) -> Result<Vec<u8>, String> {
        Err(super::NO_PNG.into())
    }
}

/// Why a lean build writes no PNG, and the fix.
pub const NO_PNG: &str = "this opal-sweep was built without PNG support\n  fix: reinstall with `cargo install --path . --features png` (the SVG figures need nothing)";

/// Drops the panels of a line figure in which no line has two points (a
/// lone dot per line shows nothing a table would not); a figure left with
/// no panel is not drawn, and says why.
fn without_degenerate_panels(mut f: Figure) -> Result<Figure, String> {
    let Body::Lines(lf) = &mut f.body else { return Ok(f) };
    let before = lf.panels.len();
    lf.panels.retain(|p| p.lines.iter().any(|l| l.points.len() > 1));
    match lf.panels.len() {
        0 => Err("every line would be a single point — the numbers are in the summary table".into()),
        n if n < before => {
            lf.columns = lf.columns.min(n);
            f.caption.push_str(&format!(
                " {} panel{} with a single point per line left out.",
                before - n,
                if before - n == 1 { "" } else { "s" }
            ));
            Ok(f)
        }
        _ => Ok(f),
    }
}

/// Computes every figure the data supports and writes each as SVG, and as
/// PNG if `png`, into `dir` (figures are drawn in parallel; the files do not
/// depend on it).
pub fn draw_all(data: &SweepData, dir: &Path, png: bool) -> Result<Drawn, ReportError> {
    register_fonts();
    let mut figures = Vec::new();
    let mut skipped = Vec::new();
    let mut not_applicable = Vec::new();
    if data.ok_runs() == 0 {
        skipped.push("No figures: no run succeeded.".into());
    } else {
        let total_panels = facets(data).total_panels;
        if total_panels > MAX_PANELS && data.search.is_none() {
            skipped.push(format!(
                "Figures 1, 2, 5 and 7 draw the first {MAX_PANELS} of {total_panels} panels (combinations of the axes \
                 after the first); vary fewer axes together, or read the tables, for the rest."
            ));
        }
        // A search's probes are not grid points: per-point distributions
        // and time series over them would be noise (figure 9 draws them).
        let per_point = |f: Result<Figure, String>| match data.search {
            Some(_) => Err("a search's probes are drawn in figure 9".to_string()),
            None => f,
        };
        let candidates = [
            (1, "TTFT CDF", per_point(ttft_cdf(data))),
            (2, "throughput over time", per_point(throughput(data))),
            (3, "percentiles", percentiles(data)),
            (4, "cache hits and storage traffic", cache_bars(data)),
            (5, "utilisation over time", per_point(utilisation(data))),
            (6, "SC25 cold vs warm", sc25(data)),
            (7, "E2E and queue-wait CDFs", per_point(e2e_and_wait_cdf(data))),
            (8, "cost vs TTFT p99", cost_frontier(data)),
            (9, "search", search_figure(data)),
            (10, "Pareto search", pareto_figure(data)),
        ];
        for (n, what, f) in candidates {
            match f.and_then(without_degenerate_panels) {
                Ok(f) => figures.push((n, f)),
                Err(why) if why == NOT_APPLICABLE || why == PLATFORM_ONLY || why.starts_with("only for searches") => {
                    not_applicable.push(format!("Figure {n} ({what}): {why}."))
                }
                Err(why) => skipped.push(format!("Figure {n} ({what}): {why}.")),
            }
        }
    }
    // Rendered in parallel; the first failure in figure order is the one reported.
    let results: Vec<Result<FigureFile, ReportError>> =
        figures.par_iter().map(|(n, f)| render(*n, f, dir, png)).collect();
    let files = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    remove_stale_figures(dir, &files);
    Ok(Drawn { figures: files, skipped, not_applicable })
}

/// Removes figure files of an earlier report in `dir` that this one did not
/// draw, so the directory holds exactly what the page shows.
fn remove_stale_figures(dir: &Path, drawn: &[FigureFile]) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = name.starts_with("fig") && (name.ends_with(".png") || name.ends_with(".svg"));
        if ours && !drawn.iter().any(|f| f.png.as_deref() == Some(name.as_str()) || f.svg == name) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn si_keeps_three_significant_digits_and_scales_large_values() {
        assert_eq!(si(0.0), "0");
        assert_eq!(si(1.0), "1");
        assert_eq!(si(2.5), "2.5");
        assert_eq!(si(12.34), "12.3");
        assert_eq!(si(123.4), "123");
        assert_eq!(si(9999.0), "9999");
        assert_eq!(si(12_345.0), "12.3k");
        assert_eq!(si(2_500_000.0), "2.5M");
        assert_eq!(si(3e9), "3G");
        assert_eq!(si(0.0123), "0.0123");
        assert_eq!(si(-0.5), "-0.5");
        assert_eq!(si(0.58834), "0.588");
        assert_eq!(sig(0.007412, 2), "0.0074");
        assert_eq!(sig(2163.0, 2), "2163");
        assert_eq!(sig(12_345.0, 2), "12k");
    }

    /// A sweep of `points` over `axes`, two replicates each, no other tables.
    fn sweep_data(axes: Vec<super::super::data::Axis>, points: Vec<Point>) -> SweepData {
        SweepData {
            dir: ".".into(),
            name: String::new(),
            spec_file: String::new(),
            replicates: 2,
            base_seed: 0,
            axes,
            points,
            failed: Vec::new(),
            latency: None,
            series: None,
            sc25: None,
            stages: None,
            search: None,
            search_min: false,
            pareto: None,
            answers: None,
        }
    }

    /// Point `id` at value index `id` of one axis, with a run per value of `metric`.
    fn point_of(id: u32, metric: &str, values: &[f64]) -> Point {
        use super::super::data::RunRow;
        let runs = values
            .iter()
            .enumerate()
            .map(|(r, &v)| RunRow {
                run_id: id * 10 + r as u32,
                replicate: r as u32,
                metrics: [(metric.to_string(), v)].into_iter().collect(),
                unstable: false,
                stable: true,
            })
            .collect();
        Point { id, at: vec![id as usize], runs, total_runs: values.len() }
    }

    #[test]
    fn figure_4_draws_a_searchs_probes_by_value_not_in_probe_order() {
        use super::super::data::Axis;
        // Probed in the order 40, 10, 20 req/s (bracket, then bisection).
        let rate = Axis {
            path: "workload.stages.0.workload_params.request_rate".into(),
            label: "request_rate".into(),
            numeric: true,
            values: vec!["40".into(), "10".into(), "20".into()],
            numbers: vec![40.0, 10.0, 20.0],
        };
        let points = (0..3).map(|i| point_of(i, "hit_ratio_gpu", &[0.5])).collect();
        let sweep = sweep_data(vec![rate], points);
        let ids = |d: &SweepData| bar_order(d).iter().map(|p| p.id).collect::<Vec<_>>();
        assert_eq!(ids(&sweep), [0, 1, 2], "a sweep keeps its grid order");
        let slo = crate::stats::Constraint::parse("ttft_p99_ms <= 500").unwrap();
        let search = SweepData { search: Some(vec![slo]), ..sweep };
        assert_eq!(ids(&search), [1, 2, 0], "10, 20, 40 req/s");
    }

    #[test]
    fn a_search_figure_stops_its_axis_near_the_threshold_so_the_answer_stays_visible() {
        use super::super::data::Axis;
        let rate = Axis {
            path: "workload.stages.0.workload_params.request_rate".into(),
            label: "request_rate".into(),
            numeric: true,
            values: vec!["10".into(), "20".into(), "40".into()],
            numbers: vec![10.0, 20.0, 40.0],
        };
        // Probes at 10 and 20 req/s meet TTFT p99 ≤ 500 ms; 40 req/s is overloaded (30 s).
        let points = vec![
            point_of(0, "ttft_p99_ms", &[100.0, 101.0]),
            point_of(1, "ttft_p99_ms", &[300.0, 302.0]),
            point_of(2, "ttft_p99_ms", &[30_000.0, 30_500.0]),
        ];
        let slo = crate::stats::Constraint::parse("ttft_p99_ms <= 500").unwrap();
        let data = SweepData { search: Some(vec![slo]), ..sweep_data(vec![rate], points) };
        let f = search_figure(&data).unwrap();
        let Body::Lines(l) = &f.body else { unreachable!() };
        let p = &l.panels[0];
        let answer = p.lines.iter().find(|l| l.marker == Some(Marker::Cross)).unwrap();
        assert_eq!(answer.points, [(20.0, 301.0)]);
        assert_eq!(p.y_range, Some((0.0, 2000.0)), "4 × the 500 ms threshold");
        assert!(f.caption.contains("drawn on its top edge"), "{}", f.caption);
        // Without an outlier, the axis follows the data.
        let near = vec![point_of(0, "ttft_p99_ms", &[100.0, 101.0]), point_of(1, "ttft_p99_ms", &[300.0, 302.0])];
        let rate = data.axes[0].clone();
        let data = SweepData { search: data.search.clone(), ..sweep_data(vec![rate], near) };
        let Body::Lines(l) = &search_figure(&data).unwrap().body else { unreachable!() };
        assert_eq!(l.panels[0].y_range, None);
        // Every probe at one value (the search stopped at its bound): the
        // threshold is still drawn, across ±10 % of it.
        let one = Axis { values: vec!["16".into()], numbers: vec![16.0], ..data.axes[0].clone() };
        let data = SweepData {
            search: data.search.clone(),
            ..sweep_data(vec![one], vec![point_of(0, "ttft_p99_ms", &[100.0, 101.0])])
        };
        let Body::Lines(l) = &search_figure(&data).unwrap().body else { unreachable!() };
        let threshold = l.panels[0].lines.iter().find(|l| l.stroke == Stroke::Dashed && l.color == BLACK).unwrap();
        assert_eq!(threshold.points, [(14.4, 500.0), (17.6, 500.0)]);
        // A probe whose runs are mostly too short is not an answer (as the search judges).
        let mut short = point_of(0, "ttft_p99_ms", &[100.0, 101.0]);
        short.runs[0].stable = false;
        short.runs[1].stable = false;
        let data = SweepData { search: data.search.clone(), ..sweep_data(vec![data.axes[0].clone()], vec![short]) };
        let Body::Lines(l) = &search_figure(&data).unwrap().body else { unreachable!() };
        assert!(!l.panels[0].lines.iter().any(|l| l.marker == Some(Marker::Cross)));
    }

    #[test]
    fn the_cache_figure_lists_only_the_tiers_it_draws() {
        // A sweep with a CPU tier only: GPU and CPU hits, CPU traffic.
        let point = |id: u32| {
            let mut p = point_of(id, "hit_ratio_gpu", &[0.25]);
            p.runs[0].metrics.extend([
                ("hit_ratio_cpu".to_string(), 0.5),
                ("bytes_read_cpu".to_string(), 2e9),
                ("bytes_written_cpu".to_string(), 1e9),
            ]);
            p
        };
        let f = cache_bars(&sweep_data(Vec::new(), vec![point(0), point(1)])).unwrap();
        let Body::Bars(b) = &f.body else { unreachable!() };
        assert_eq!(b.tiers, [Tier::Gpu, Tier::Cpu]);
        assert_eq!(b.panels[1].segments[0], [(Tier::Cpu, 3.0), (Tier::Nvme, 0.0), (Tier::Dfs, 0.0)]);
    }

    #[test]
    fn percentiles_spanning_three_decades_get_a_log_axis_whatever_their_intervals() {
        use super::super::data::Axis;
        let axis = Axis {
            path: "simulation.num_workers".into(),
            label: "num_workers".into(),
            numeric: true,
            values: vec!["1".into(), "2".into(), "4".into()],
            numbers: vec![1.0, 2.0, 4.0],
        };
        // Means 15.5, 110 and 5500 ms. Point 0's two replicates differ so much
        // that its interval's lower end is clamped to 0.
        let points = vec![
            point_of(0, "ttft_p99_ms", &[1.0, 30.0]),
            point_of(1, "ttft_p99_ms", &[100.0, 120.0]),
            point_of(2, "ttft_p99_ms", &[5000.0, 6000.0]),
        ];
        let f = percentiles(&sweep_data(vec![axis], points)).unwrap();
        let Body::Lines(l) = &f.body else { unreachable!() };
        let p99 = l.panels.iter().find(|p| p.title == "TTFT p99 (ms)").unwrap();
        assert!(l.panels.iter().all(|p| p.y_log), "one log scale for the four panels");
        assert_eq!(p99.lines[0].errors[0].1, 0.0, "the interval's lower end is clamped to 0");
        // The axis spans the values (and the bars' upper ends), not down to the clamped 0.
        let (lo, hi) = y_extent(p99);
        assert!(lo > 1.0 && lo < 15.5 && hi > 6000.0, "{lo}..{hi}");
    }

    fn interval(start_s: f64, generated_tokens: f64) -> Interval {
        Interval { start_s, generated_tokens, ..Interval::default() }
    }

    #[test]
    fn time_series_average_replicates_per_interval_with_a_min_max_band() {
        use super::super::data::RunRow;
        let run = |run_id, sim_time_s: f64| RunRow {
            run_id,
            replicate: run_id,
            metrics: [("sim_time_s".to_string(), sim_time_s)].into_iter().collect(),
            unstable: false,
            stable: true,
        };
        let point = Point { id: 0, at: Vec::new(), runs: vec![run(0, 6.0), run(1, 4.1)], total_runs: 2 };
        let series = [
            // 2 s intervals; run 0 ends at 6 s, run 1 at 4.1 s (a 0.1 s last interval, dropped).
            (0, vec![interval(0.0, 100.0), interval(2.0, 300.0), interval(4.0, 50.0)]),
            (1, vec![interval(0.0, 300.0), interval(2.0, 500.0), interval(4.0, 7.0)]),
        ];
        let data = SweepData { series: Some(series.into_iter().collect()), ..sweep_data(Vec::new(), vec![point]) };
        let rate = SeriesMetric {
            title: "",
            y_desc: "",
            value: |r: &Interval, dt| r.generated_tokens / dt,
            rate: true,
            y_range: None,
        };
        let rows = replicate_series(&data, &data.points[0], rate);
        // Interval 0: 50 and 150 tok/s → mean 100, band 50–150; interval 1: 150 and 250;
        // interval 2: run 0 only (25 tok/s), run 1's 0.1 s remainder is left out.
        assert_eq!(rows, [(0.0, 100.0, 50.0, 150.0), (2.0, 200.0, 150.0, 250.0), (4.0, 25.0, 25.0, 25.0)]);
        // A gauge keeps the short interval: (50 + 7) / 2.
        let gauge = SeriesMetric { value: |r: &Interval, _| r.generated_tokens, rate: false, ..rate };
        assert_eq!(replicate_series(&data, &data.points[0], gauge)[2], (4.0, 28.5, 7.0, 50.0));
    }

    #[test]
    fn the_cdf_rises_from_zero_at_the_minimum_to_one_at_the_maximum() {
        let mut h = hdrhistogram::Histogram::<u64>::new(3).unwrap();
        // Below 2,048 µs a 3-digit histogram is exact (above, x is a bucket's
        // highest equivalent value, as HDR percentiles are).
        h.record(500).unwrap(); // 0.5 ms
        h.record(1_000).unwrap();
        h.record_n(2_000, 2).unwrap();
        assert_eq!(cdf_points(&h), [(0.5, 0.0), (0.5, 0.25), (1.0, 0.5), (2.0, 1.0)]);
        // 100,000 values 1 µs apart: thinned, but the curve still ends at the maximum.
        let mut dense = hdrhistogram::Histogram::<u64>::new(3).unwrap();
        for v in 1_000..101_000 {
            dense.record(v).unwrap();
        }
        let pts = cdf_points(&dense);
        assert!(pts.len() < 2_000, "{} points", pts.len());
        assert_eq!(pts.last().unwrap().1, 1.0);
        assert!(pts.windows(2).all(|w| w[1].1 - w[0].1 <= 0.011), "no step hides more than 1 % of requests");
    }

    fn panel(quantity: usize, points: Vec<(f64, f64)>) -> Panel {
        Panel {
            title: String::new(),
            x_desc: String::new(),
            y_desc: String::new(),
            x_log: false,
            y_log: false,
            quantity,
            x_range: None,
            y_range: None,
            x_categories: None,
            lines: vec![Line {
                color: BLACK,
                stroke: Stroke::Solid,
                points,
                band: Vec::new(),
                errors: Vec::new(),
                marker: None,
            }],
            empty_note: "",
        }
    }

    #[test]
    fn panels_of_one_quantity_share_x_limits_and_one_y_scale() {
        let figure = |panels| LineFigure {
            legend_title: String::new(),
            legend: Vec::new(),
            panels,
            columns: 2,
            panel_size: (1, 1),
        };
        // Quantity 0 spans 2 to 500 over its two panels (> two decades): log
        // for both, though each alone spans less. Quantity 1 has a 0: linear.
        let mut f = figure(vec![
            panel(0, vec![(0.0, 2.0), (10.0, 40.0)]),
            panel(0, vec![(5.0, 30.0), (20.0, 500.0)]),
            panel(1, vec![(0.0, 0.0), (1.0, 1e6)]),
        ]);
        harmonise(&mut f);
        assert_eq!(f.panels.iter().map(|p| p.y_log).collect::<Vec<_>>(), [true, true, false]);
        // x: 0 to 20 padded by 4 % (and not below 0) for both panels of quantity 0.
        assert_eq!(f.panels[0].x_range, Some((0.0, 20.8)));
        assert_eq!(f.panels[1].x_range, f.panels[0].x_range);
        assert_eq!(f.panels[2].x_range, Some((0.0, 1.04)));
        // Exactly two decades is not more than two: linear.
        let mut f = figure(vec![panel(0, vec![(0.0, 1.0), (1.0, 100.0)])]);
        harmonise(&mut f);
        assert!(!f.panels[0].y_log);
    }

    #[test]
    fn a_panel_of_lone_points_is_left_out_and_the_caption_says_so() {
        let lines = LineFigure {
            legend_title: String::new(),
            legend: Vec::new(),
            panels: vec![panel(0, vec![(0.0, 1.0), (1.0, 2.0)]), panel(1, vec![(0.0, 1.0)])],
            columns: 2,
            panel_size: (1, 1),
        };
        let f = Figure { stem: "x", title: String::new(), caption: "C.".into(), body: Body::Lines(lines.clone()) };
        let kept = without_degenerate_panels(f).unwrap();
        let Body::Lines(l) = &kept.body else { unreachable!() };
        assert_eq!((l.panels.len(), l.columns), (1, 1));
        assert_eq!(kept.caption, "C. 1 panel with a single point per line left out.");
        let only_dots = LineFigure { panels: vec![panel(0, vec![(0.0, 1.0)])], ..lines };
        let f = Figure { stem: "x", title: String::new(), caption: String::new(), body: Body::Lines(only_dots) };
        assert!(without_degenerate_panels(f).is_err());
    }

    #[test]
    fn the_pareto_frontier_keeps_what_nothing_beats_on_both() {
        // (cost, p99): (2, 50) beats (3, 60); (1, 100) and (4, 10) are extremes; (2, 80) loses to (2, 50).
        let pts = [(3.0, 60.0), (1.0, 100.0), (2.0, 80.0), (2.0, 50.0), (4.0, 10.0), (5.0, 10.0)];
        assert_eq!(pareto(&pts), [(1.0, 100.0), (2.0, 50.0), (4.0, 10.0)]);
    }

    #[test]
    fn log_ticks_label_three_to_eight_values() {
        assert_eq!(log_ticks(1.5, 70.0).0, [2.0, 5.0, 10.0, 20.0, 50.0]);
        assert_eq!(log_ticks(2.0, 9.0).0, [2.0, 3.0, 4.0, 5.0, 7.0]);
        assert_eq!(log_ticks(0.01, 1e6).0, [0.01, 0.1, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6].map(|v: f64| v));
        let light = log_ticks(1.5, 70.0).1;
        assert_eq!(light.first(), Some(&2.0));
        assert_eq!(light.last(), Some(&70.0));
    }

    #[test]
    fn more_than_ten_lines_take_colours_from_a_gradient() {
        assert_eq!(color(3, 10), PALETTE[3]);
        let a = color(0, 11);
        let b = color(10, 11);
        assert_ne!(a, b);
        assert!(!PALETTE.contains(&b));
    }
}
