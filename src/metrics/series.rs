//! The per-interval time series (default 1 s of simulated time).
//!
//! Counters (requests completed, tokens, busy time) are added to the interval
//! in which they happen; busy time of a step that spans a boundary is split
//! across intervals (it is reported when the step ends, or at the end of the
//! run for steps still in flight, so busy fractions are computed at the end). Gauges (queue depth, running requests, workers, KV
//! usage) are sampled at the end of each interval. TTFT percentiles are over
//! the requests whose first token came out in the interval.

use crate::time::{Ramp, SimDuration, SimTime};
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

/// Consecutive steps of one worker, back to back, as the time series and
/// the inter-token histogram count them: the steps `k0..k1` of a [`Ramp`]
/// (a decode run's sub-steps, whose duration and work grow linearly),
/// each generating `decodes` tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepSpan {
    /// When step `k0` started.
    pub start: SimTime,
    /// The durations.
    pub ramp: Ramp,
    /// The first step (of the ramp's).
    pub k0: u64,
    /// One past the last.
    pub k1: u64,
    /// Their total duration (`ramp.sum(k0, k1)`).
    pub duration: SimDuration,
    /// Tokens each step generated.
    pub decodes: u64,
    /// What step `k0` asked of the GPU, and what each later one asks more.
    pub peak: (PeakSeconds, PeakSeconds),
}

impl StepSpan {
    /// Steps.
    pub fn steps(&self) -> u64 {
        self.k1 - self.k0
    }

    /// When the last step ended.
    pub fn end(&self) -> SimTime {
        self.start + self.duration
    }

    /// What steps `k0 + from .. k0 + to` asked of the GPU in all.
    pub fn peak_of(&self, from: u64, to: u64) -> PeakSeconds {
        let (p, dp) = self.peak;
        // Σ_{i = from}^{to − 1} (p + i·dp)
        let (n, i) = ((to - from) as f64, (from + to - 1) as f64 * (to - from) as f64 / 2.0);
        PeakSeconds { compute: n * p.compute + i * dp.compute, memory: n * p.memory + i * dp.memory }
    }
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

    /// Until when (excluded) nothing is due: the next boundary, or where
    /// the series can no longer reach ([`Self::can_reach`]) if earlier.
    pub fn quiet_until(&self) -> SimTime {
        SimTime(self.next_boundary().0.min(self.width.0.saturating_mul(MAX_INTERVALS)))
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

    /// A step over [start, end) computed `prompt` prompt tokens, generated
    /// `generated` tokens and asked `peak` of its GPU: busy time to the
    /// intervals it spans, the rest to the one it ends in.
    pub fn on_step(&mut self, start: SimTime, end: SimTime, prompt: u64, generated: u64, peak: PeakSeconds) {
        let i = self.index(end);
        if self.index(start) == i {
            // Within one interval (most steps): its row found once.
            let row = self.row(i);
            row.prompt_tokens += prompt;
            row.generated_tokens += generated;
            self.busy_ns[i] += (end - start).0;
        } else {
            self.on_busy(start, end);
            let row = self.row(i);
            row.prompt_tokens += prompt;
            row.generated_tokens += generated;
        }
        self.peak[i] += peak;
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

    /// Steps of one worker, in order, as [`Self::on_step`] would take them
    /// one by one: each span is one busy span, and the steps ending in one
    /// interval are found by the ramp's sums and added up at once.
    pub fn on_steps(&mut self, spans: &[StepSpan]) {
        for s in spans {
            let end = s.end();
            let i = self.index(end);
            if self.index(s.start) == i {
                // Within one interval (most spans): its row found once.
                self.row(i).generated_tokens += s.decodes * s.steps();
                self.busy_ns[i] += (end - s.start).0;
                self.peak[i] += s.peak_of(0, s.steps());
                continue;
            }
            self.on_busy(s.start, end);
            if self.index(s.start + SimDuration(s.ramp.at(s.k0))) == i {
                // All in one interval (as a worker brought up to each boundary hands them over).
                self.row(i).generated_tokens += s.decodes * s.steps();
                self.peak[i] += s.peak_of(0, s.steps());
                continue;
            }
            let (mut k, mut t) = (s.k0, s.start);
            while k < s.k1 {
                let i = self.index(t + SimDuration(s.ramp.at(k)));
                // The steps that end before the interval's boundary.
                let boundary = SimTime((i as u64 + 1) * self.width.0);
                let kk = s.ramp.fit(k, s.k1, SimDuration(boundary.0 - 1 - t.0));
                self.row(i).generated_tokens += s.decodes * (kk - k);
                self.peak[i] += s.peak_of(k - s.k0, kk - s.k0);
                t += s.ramp.sum(k, kk);
                k = kk;
            }
        }
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
    // The nearest-rank values, each selected in linear time rather than
    // by sorting: the 99th first, then the median among those below it.
    let at = |q: f64| ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    let (i50, i99) = (at(0.5), at(0.99));
    let p99 = *v.select_nth_unstable_by(i99, f64::total_cmp).1;
    let p50 = if i50 < i99 { *v[..i99].select_nth_unstable_by(i50, f64::total_cmp).1 } else { p99 };
    (p50, p99)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_percentiles_are_the_nearest_ranks_of_the_sorted_samples() {
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for n in 1..300 {
            let v: Vec<f64> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % 50) as f64 * 0.25 // ties too
                })
                .collect();
            let mut sorted = v.clone();
            sorted.sort_by(f64::total_cmp);
            let rank = |q: f64| sorted[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
            assert_eq!(percentiles(&mut v.clone()), (rank(0.5), rank(0.99)), "{n} samples");
        }
    }

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
    fn spans_of_steps_count_as_steps_one_by_one() {
        // A ramp of 40 ms → 60 ms steps across a boundary, a gap, then one more step.
        let ms = |x: u64| SimTime(x * 1_000_000);
        let p = |c: f64| PeakSeconds { compute: c, memory: 2.0 * c };
        let spans = [
            StepSpan {
                start: ms(700),
                ramp: Ramp { first: 40_000_000, last: 60_000_000, len: 11 },
                k0: 2,
                k1: 11,
                duration: SimDuration(468_000_000),
                decodes: 3,
                peak: (p(0.01), p(0.001)),
            },
            StepSpan {
                start: ms(1_700),
                ramp: Ramp::flat(100_000_000, 1),
                k0: 0,
                k1: 1,
                duration: SimDuration(100_000_000),
                decodes: 2,
                peak: (p(0.03), p(0.0)),
            },
        ];
        let g = Gauges { active_workers: 1, ..Gauges::default() };
        let mut at_once = TimeSeries::new(SimDuration::from_secs(1));
        at_once.on_steps(&spans);
        let mut one_by_one = TimeSeries::new(SimDuration::from_secs(1));
        for s in &spans {
            let mut t = s.start;
            for k in s.k0..s.k1 {
                let end = t + SimDuration(s.ramp.at(k));
                one_by_one.on_step(t, end, 0, s.decodes, s.peak_of(k - s.k0, k - s.k0 + 1));
                t = end;
            }
        }
        let (a, b) = (at_once.finish(ms(2_000), g), one_by_one.finish(ms(2_000), g));
        assert_eq!(a.len(), 2);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!((x.generated_tokens, x.gpu_busy_fraction), (y.generated_tokens, y.gpu_busy_fraction));
            assert!((x.gpu_compute_fraction - y.gpu_compute_fraction).abs() < 1e-12);
        }
        // By hand: steps of 44, 46, …, 60 ms from 0.7 s end at 0.744, 0.790, 0.838, 0.888, 0.940,
        // 0.994 (6 in the first second: 18 tokens), then 1.050, 1.108, 1.168 s (9 tokens) and
        // 1.8 s (2 tokens); busy 0.3 s, then 0.468 s.
        assert_eq!((a[0].generated_tokens, a[1].generated_tokens), (18, 11));
        assert!((a[0].gpu_busy_fraction - 0.3).abs() < 1e-12 && (a[1].gpu_busy_fraction - 0.268).abs() < 1e-12);
        // Peak compute: steps k = 2..8 ask 0.01 + 0.001·(0..6) → 0.075 s; then 0.016 + 0.017 + 0.018 and 0.03 s.
        assert!((a[0].gpu_compute_fraction - 0.075).abs() < 1e-12, "{}", a[0].gpu_compute_fraction);
        assert!((a[1].gpu_compute_fraction - 0.081).abs() < 1e-12);
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
