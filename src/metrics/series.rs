//! The per-interval time series (default 1 s of simulated time).
//!
//! Counters (requests completed, tokens, busy time) are added to the interval
//! in which they happen; busy time of a step that spans a boundary is split
//! across intervals (it is reported when the step ends, or at the end of the
//! run for steps still in flight, so busy fractions are computed at the end). Gauges (queue depth, running requests, workers, KV
//! usage) are sampled at the end of each interval. TTFT percentiles are over
//! the requests whose first token came out in the interval.

use crate::time::{SimDuration, SimTime};
use serde::Serialize;

/// One interval of the time series.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct IntervalRow {
    /// Interval start, seconds.
    pub start_s: f64,
    /// Requests that completed in it.
    pub requests_completed: u64,
    /// Prompt tokens computed (prefill work).
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Median TTFT of the requests whose first token came out in it, ms (NaN if none).
    pub ttft_p50_ms: f64,
    /// 99th-percentile TTFT of those requests, ms (NaN if none).
    pub ttft_p99_ms: f64,
    /// Requests waiting (not yet running) at the interval end, all workers.
    pub queue_depth: u64,
    /// Of those, waiting on the prefill pool (0 without disaggregation).
    pub queue_depth_prefill: u64,
    /// Requests in running batches at the interval end.
    pub running: u64,
    /// Workers at the interval end.
    pub active_workers: u32,
    /// Busy fraction of the workers over the interval (0–1): time spent in steps.
    pub gpu_busy_fraction: f64,
    /// Fraction of the workers' peak FLOP/s the interval's steps used (0–1).
    pub gpu_compute_fraction: f64,
    /// Fraction of the workers' peak HBM bandwidth the interval's steps used (0–1).
    pub gpu_hbm_fraction: f64,
    /// Fraction of GPU KV blocks in use at the interval end, over all workers.
    pub gpu_kv_usage: f64,
    /// Prompt tokens served from each cache tier (gpu, cpu, nvme, dfs), by
    /// the requests whose first token came out in the interval.
    pub hit_tokens: [u64; 4],
    /// Bytes moved (read + written) by each tier's devices, counted when an operation completes.
    pub tier_bytes: [u64; 4],
}

/// Gauges sampled at an interval boundary.
#[derive(Clone, Copy, Debug, Default)]
pub struct Gauges {
    /// Waiting requests.
    pub queue_depth: u64,
    /// Of those, waiting on the prefill pool.
    pub queue_depth_prefill: u64,
    /// Running requests.
    pub running: u64,
    /// Workers.
    pub active_workers: u32,
    /// KV blocks in use.
    pub used_blocks: u64,
    /// KV blocks in all pools.
    pub total_blocks: u64,
}

/// Most intervals a run's time series may have: a run that would need more
/// fails (naming `time_series_interval_sec`) instead of growing without
/// bound. At the default 1 s interval that is 4.6 simulated days; the rows
/// then take about 70 MB.
pub const MAX_INTERVALS: u64 = 400_000;

/// The shortest time-series interval, seconds.
pub const MIN_INTERVAL_SECS: f64 = 1e-3;

/// What steps ask of a GPU, as seconds of its datasheet peaks: `compute`
/// is the steps' FLOPs at the peak FLOP/s, `memory` the bytes they move
/// through HBM at the peak bandwidth. Summed over a run and divided by the
/// workers' time, they are the fractions of the GPUs' compute and bandwidth
/// the run used — unlike busy time, which is 100 % for a GPU that steps a
/// batch of one without pause.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PeakSeconds {
    /// FLOPs ÷ peak FLOP/s.
    pub compute: f64,
    /// HBM bytes ÷ peak bytes/s.
    pub memory: f64,
}

impl std::ops::AddAssign for PeakSeconds {
    fn add_assign(&mut self, o: PeakSeconds) {
        self.compute += o.compute;
        self.memory += o.memory;
    }
}

/// A step of one worker, as the time series counts it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepRecord {
    /// When it ended.
    pub end: SimTime,
    /// How long it took.
    pub duration: SimDuration,
    /// Tokens it generated.
    pub decodes: u64,
    /// What it asked of the GPU.
    pub peak: PeakSeconds,
}

/// Builds the time series as the run advances.
#[derive(Clone, Debug)]
pub struct TimeSeries {
    width: SimDuration,
    rows: Vec<IntervalRow>,
    busy_ns: Vec<u64>,
    /// Peak seconds of the steps that ended in each interval.
    peak: Vec<PeakSeconds>,
    /// Intervals before this one are closed.
    open: usize,
    ttft_ms: Vec<f64>,
}

impl TimeSeries {
    /// An empty series of intervals `width` wide.
    pub fn new(width: SimDuration) -> TimeSeries {
        assert!(width.0 > 0, "interval width must be positive");
        TimeSeries { width, rows: Vec::new(), busy_ns: Vec::new(), peak: Vec::new(), open: 0, ttft_ms: Vec::new() }
    }

    fn index(&self, t: SimTime) -> usize {
        (t.0 / self.width.0) as usize
    }

    fn row(&mut self, i: usize) -> &mut IntervalRow {
        if self.rows.len() <= i {
            let width = self.width;
            self.rows.extend((self.rows.len()..=i).map(|k| IntervalRow {
                start_s: SimTime(k as u64 * width.0).as_secs_f64(),
                ttft_p50_ms: f64::NAN,
                ttft_p99_ms: f64::NAN,
                ..IntervalRow::default()
            }));
            self.busy_ns.resize(i + 1, 0);
            self.peak.resize(i + 1, PeakSeconds::default());
        }
        &mut self.rows[i]
    }

    /// Whether the series can reach `t` within [`MAX_INTERVALS`].
    pub fn can_reach(&self, t: SimTime) -> bool {
        t.0 / self.width.0 < MAX_INTERVALS
    }

    /// The interval width.
    pub fn width(&self) -> SimDuration {
        self.width
    }

    /// The start of the next interval to close.
    pub fn next_boundary(&self) -> SimTime {
        SimTime((self.open as u64 + 1) * self.width.0)
    }

    /// Closes the open interval with gauges sampled at its end.
    pub fn close_interval(&mut self, g: Gauges) {
        self.close_covering(g, self.width.0);
    }

    /// Closes the open interval, of which `covered_ns` were simulated.
    fn close_covering(&mut self, g: Gauges, covered_ns: u64) {
        let i = self.open;
        let (p50, p99) = percentiles(&mut self.ttft_ms);
        let row = self.row(i);
        row.queue_depth = g.queue_depth;
        row.queue_depth_prefill = g.queue_depth_prefill;
        row.running = g.running;
        row.active_workers = g.active_workers;
        // Worker-time of the interval for now; divided into the busy time in `finish`.
        row.gpu_busy_fraction = covered_ns as f64 * f64::from(g.active_workers.max(1));
        row.gpu_kv_usage = if g.total_blocks > 0 { g.used_blocks as f64 / g.total_blocks as f64 } else { 0.0 };
        row.ttft_p50_ms = p50;
        row.ttft_p99_ms = p99;
        self.ttft_ms.clear();
        self.open += 1;
    }

    /// Closes the final, possibly partial, interval at `end` and returns the
    /// rows. All busy time up to `end` must have been reported.
    pub fn finish(mut self, end: SimTime, g: Gauges) -> Vec<IntervalRow> {
        while self.next_boundary() <= end {
            self.close_interval(g);
        }
        let covered = end.0 - self.open as u64 * self.width.0;
        if covered > 0 {
            self.close_covering(g, covered);
        }
        self.rows.truncate(self.open);
        for ((row, busy), peak) in self.rows.iter_mut().zip(&self.busy_ns).zip(&self.peak) {
            // gpu_busy_fraction holds the interval's worker-nanoseconds until here.
            let worker_ns = row.gpu_busy_fraction;
            row.gpu_busy_fraction = *busy as f64 / worker_ns;
            row.gpu_compute_fraction = peak.compute * 1e9 / worker_ns;
            row.gpu_hbm_fraction = peak.memory * 1e9 / worker_ns;
        }
        self.rows
    }

    /// A request completed at `t`.
    pub fn on_completion(&mut self, t: SimTime) {
        let i = self.index(t);
        self.row(i).requests_completed += 1;
    }

    /// A step ending at `t` computed `prompt` prompt tokens and generated `generated` tokens.
    pub fn on_tokens(&mut self, t: SimTime, prompt: u64, generated: u64) {
        let i = self.index(t);
        let row = self.row(i);
        row.prompt_tokens += prompt;
        row.generated_tokens += generated;
    }

    /// A first token came out at `t` (in the open interval) with this TTFT,
    /// for a request that found `hits` prompt tokens cached per tier.
    pub fn on_first_token(&mut self, t: SimTime, ttft: SimDuration, hits: &[u64; 4]) {
        debug_assert_eq!(self.index(t), self.open, "first token outside the open interval");
        self.ttft_ms.push(ttft.0 as f64 / 1e6);
        let i = self.index(t);
        let row = self.row(i);
        for (acc, h) in row.hit_tokens.iter_mut().zip(hits) {
            *acc += h;
        }
    }

    /// A device of `tier` finished moving `bytes` at `t`.
    pub fn on_tier_bytes(&mut self, t: SimTime, tier: crate::kvcache::Tier, bytes: u64) {
        let i = self.index(t);
        self.row(i).tier_bytes[tier.index()] += bytes;
    }

    /// A step ending at `t` asked `peak` of its GPU.
    pub fn on_peak(&mut self, t: SimTime, peak: PeakSeconds) {
        let i = self.index(t);
        self.row(i);
        self.peak[i] += peak;
    }

    /// Steps of one worker, in order, as [`Self::on_busy`], [`Self::on_tokens`]
    /// and [`Self::on_peak`] would take them one by one: back-to-back steps
    /// are one busy span, and the tokens and work of steps ending in one
    /// interval are added up first.
    pub fn on_steps(&mut self, steps: &[StepRecord]) {
        let Some(first) = steps.first() else { return };
        // The busy span so far: empty, where the first step starts.
        let (mut start, mut end) = (first.end - first.duration, first.end - first.duration);
        let (mut interval, mut tokens, mut peak) = (self.index(first.end), 0, PeakSeconds::default());
        for s in steps {
            if s.end - s.duration != end {
                self.on_busy(start, end);
                start = s.end - s.duration;
            }
            end = s.end;
            if self.index(s.end) != interval {
                self.row(interval).generated_tokens += tokens;
                self.peak[interval] += peak;
                (interval, tokens, peak) = (self.index(s.end), 0, PeakSeconds::default());
            }
            tokens += s.decodes;
            peak += s.peak;
        }
        self.on_busy(start, end);
        self.row(interval).generated_tokens += tokens;
        self.peak[interval] += peak;
    }

    /// A worker was busy over [start, end) (reported once the span is over).
    pub fn on_busy(&mut self, start: SimTime, end: SimTime) {
        let mut t = start;
        while t < end {
            let i = self.index(t);
            let boundary = SimTime((i as u64 + 1) * self.width.0).min(end);
            self.row(i);
            self.busy_ns[i] += (boundary - t).0;
            t = boundary;
        }
    }
}

/// Nearest-rank median and 99th percentile, ms (NaN when empty).
fn percentiles(v: &mut [f64]) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    let rank = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    (rank(0.5), rank(0.99))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_time_splits_across_interval_boundaries() {
        let mut s = TimeSeries::new(SimDuration::from_secs(1));
        // One worker busy 0.5 s → 1.75 s.
        s.on_busy(SimTime(500_000_000), SimTime(1_750_000_000));
        let g = Gauges { active_workers: 1, ..Gauges::default() };
        let rows = s.finish(SimTime(2_000_000_000), g);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].gpu_busy_fraction, 0.5);
        assert_eq!(rows[1].gpu_busy_fraction, 0.75);
    }

    #[test]
    fn steps_at_once_count_as_steps_one_by_one() {
        // Back-to-back steps across a boundary, a gap, then one more step.
        let ms = |x: u64| SimTime(x * 1_000_000);
        let step = |end, d, decodes, compute| StepRecord {
            end,
            duration: SimDuration(d),
            decodes,
            peak: PeakSeconds { compute, memory: 2.0 * compute },
        };
        let steps = [
            step(ms(900), 200_000_000, 3, 0.1),
            step(ms(1_050), 150_000_000, 4, 0.05),
            step(ms(1_100), 50_000_000, 4, 0.02),
            step(ms(1_800), 100_000_000, 2, 0.03),
        ];
        let g = Gauges { active_workers: 1, ..Gauges::default() };
        let mut at_once = TimeSeries::new(SimDuration::from_secs(1));
        at_once.on_steps(&steps);
        let mut one_by_one = TimeSeries::new(SimDuration::from_secs(1));
        for s in &steps {
            one_by_one.on_busy(s.end - s.duration, s.end);
            one_by_one.on_tokens(s.end, 0, s.decodes);
            one_by_one.on_peak(s.end, s.peak);
        }
        let (a, b) = (at_once.finish(ms(2_000), g), one_by_one.finish(ms(2_000), g));
        assert_eq!(format!("{a:?}"), format!("{b:?}"), "equal rows (NaN percentiles included)");
        // By hand: busy 0.7–0.9 and 0.9–1.0 s, then 1.0–1.1 and 1.7–1.8 s; 3 tokens, then 10.
        assert_eq!((a[0].gpu_busy_fraction, a[0].generated_tokens), (0.3, 3));
        assert!((a[1].gpu_busy_fraction - 0.2).abs() < 1e-12);
        assert_eq!(a[1].generated_tokens, 10);
        // Work by the interval the step ended in: 0.1 s of peak compute in 1 s of one worker.
        assert!((a[0].gpu_compute_fraction - 0.1).abs() < 1e-12 && (a[0].gpu_hbm_fraction - 0.2).abs() < 1e-12);
        assert!((a[1].gpu_compute_fraction - 0.1).abs() < 1e-12);
    }

    #[test]
    fn ttft_percentiles_are_per_interval_nearest_rank() {
        let mut s = TimeSeries::new(SimDuration::from_secs(1));
        for ms in 1..=100 {
            s.on_first_token(SimTime(10), SimDuration(ms * 1_000_000), &[ms, 0, 0, 1]);
        }
        s.close_interval(Gauges { active_workers: 1, ..Gauges::default() });
        s.on_completion(SimTime(1_200_000_000));
        let rows = s.finish(SimTime(1_500_000_000), Gauges { active_workers: 1, ..Gauges::default() });
        assert_eq!((rows[0].ttft_p50_ms, rows[0].ttft_p99_ms), (50.0, 99.0));
        assert_eq!(rows[0].hit_tokens, [5050, 0, 0, 100]);
        assert!(rows[1].ttft_p50_ms.is_nan());
        assert_eq!(rows[1].requests_completed, 1);
        assert_eq!(rows[1].start_s, 1.0);
    }
}
