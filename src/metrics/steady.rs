//! Steady state: where a run's warm-up ends, its latencies after it, and
//! whether the run reached a steady state at all.
//!
//! **Warm-up truncation: MSER-5** (White, "An effective truncation
//! heuristic for bias reduction in simulation output", *Simulation* 69(6),
//! 1997; White, Cobb & Spratt, "A comparison of five steady-state
//! truncation heuristics", WSC 2000; the most reliable of the rules Hoad,
//! Robinson & Davies compared, JORS 61, 2010). The series is the TTFT of
//! the requests in arrival order, in batches of 5 consecutive requests with
//! means Z₁ … Z_k. The truncation point d* minimises
//!
//! ```text
//! MSER(d) = Σ_{j>d} (Z_j − Z̄(d))² / (k − d)²,   d = 0 … k − 5
//! ```
//!
//! (Z̄(d) the mean of the batches after d; the last five batches are never
//! all that is kept). If d* falls in the second half of the series the run
//! is too short to tell where its warm-up ends (White et al.'s rule).
//! Memory stays bounded: beyond [`MAX_BATCHES`] batches adjacent batches
//! merge and the batch size doubles (MSER-10, -20, …: the same statistic on
//! coarser batches).
//!
//! **Warm-up end: MSER, capped at the first crossing of the mean.** MSER
//! cuts where the variance of the mean after the cut is smallest, so it
//! also cuts a large excursion anywhere in the first half — and a queue's
//! excursions are upward (busy periods), so its cut keeps the calm part of
//! the runs that had one. Measured on M/D/1 at ρ = 0.9, 2,000 requests, 1,000
//! runs: MSER alone left the `stable` runs' steady mean wait 16 % below
//! Pollaczek–Khinchine. The cut is therefore capped at the first batch on
//! the other side of the mean after MSER's cut from where the series
//! started (the crossing-of-the-mean rule, Fishman 1973; in Hoad, Robinson
//! & Davies' review): a warm-up ends when the series first reaches its
//! steady level, from below (a queue filling from empty) or above (cold
//! caches). A cut past the middle still means the run is too short.
//!
//! **Stability** (`stable` / `unstable` / `too_short`): over the second half
//! of the run (by arrival), the queue wait of the requests and the number
//! of requests each arrival found in the system are each regrouped into
//! [`TREND_GROUPS`] consecutive groups of batches, and a least-squares line
//! is fitted to the group means. A series *rises* when its slope's t
//! statistic exceeds [`TREND_T`] **and** the fitted rise across the half
//! exceeds a quarter of the half's mean level. (The group means of a queue
//! near saturation are autocorrelated, so Student's 1 % point for 8 degrees
//! of freedom, 2.896, called a stable M/D/1 queue at ρ = 0.9 unstable in
//! 4–6 % of 2,000-request runs; [`TREND_T`] is the null distribution's 99th
//! percentile, simulated.) A run is `unstable` when both rise (a
//! queue that keeps growing: offered load above capacity); `too_short`
//! when one rises without the other (still filling up: requests that stay
//! long accumulate before a queue forms, or waits still climbing), when
//! fewer than [`MIN_BATCHES`] batches of requests got a first token, the
//! warm-up cut falls in the second half, or the second half holds fewer
//! than [`REGENERATIONS`] regenerations; else `stable`.
//!
//! **Regenerations** (the regenerative method's cycles: Crane & Iglehart,
//! 1974): a worker's queue *drains* when an arrival finds its worker's
//! waiting queue empty after the worker's previous arrival found it not
//! empty. Each drain ends a busy episode, and the episodes are close to
//! independent, so their number is the run's effective sample size: a run
//! whose second half holds fewer than [`REGENERATIONS`] of them (and where
//! fewer than half the arrivals found an empty queue — at light load nearly
//! every arrival does, and nothing needs to drain) is shorter than a few of
//! its own correlation times, as a queue near or above capacity is. Unlike
//! a check on the latencies' own autocorrelation (used before, and calling
//! the runs with a long excursion `too_short`: the `stable` runs' steady
//! mean wait was 20 % below Pollaczek–Khinchine at ρ = 0.9), the count is
//! far from its threshold in nearly every run of a stable queue, so the
//! verdict does not select the calm runs: M/D/1 at ρ = 0.9, 2,000 requests,
//! holds 22 or more drains in 99 % of runs, and at ρ = 1.05 none in 98 %.
//!
//! The steady latencies (TTFT, TPOT, E2E, queue wait) are those of the
//! requests that arrived after the truncation point. They come from
//! per-segment histograms of consecutive arrivals (at most
//! [`MAX_SEGMENTS`] segments, merged in pairs as the run grows; the first
//! segment kept is the first that starts at or after d*) kept to two
//! significant digits (1 %), and are given only for `stable` runs (null
//! otherwise: there is no steady state to describe).

use super::{LatencyHistogram, LatencyStats};
use crate::time::{SimDuration, SimTime};
use serde::Serialize;

/// Requests per MSER batch at the start (MSER-5).
pub const BATCH: u64 = 5;
/// Most batches kept; beyond, adjacent batches merge.
pub const MAX_BATCHES: usize = 8192;
/// Fewest batches of requests with a first token for a verdict.
pub const MIN_BATCHES: usize = 20;
/// Fewest queue drains in the second half of a run for a verdict of
/// `stable` (see the module docs): M/D/1 at 2,000 requests falls short in
/// 1 % of runs at ρ = 0.9 and reaches it in none of 400 at ρ = 1.05.
pub const REGENERATIONS: f64 = 20.0;
/// Groups the second half of a series is fitted over.
pub const TREND_GROUPS: usize = 10;
/// The trend test's critical value: the largest 99th percentile of its
/// statistic (the smaller of the two series' t, when both rise materially)
/// over stable M/D/1 queues at ρ = 0.5–0.9 and 1,000–10,000 requests, 3,000
/// simulated runs per cell (`scripts/steady-threshold.py`: 4.93 at ρ = 0.9,
/// 1,000 requests; 3.76 at 2,000; 2.89 at 10,000), rounded up. A stable
/// queue is called unstable in at most 1 % of runs of any length from
/// 1,000 requests up to ρ = 0.9.
pub const TREND_T: f64 = 5.0;
/// The fitted rise across the second half, as a share of its mean, beyond which a rise matters.
const MATERIAL_RISE: f64 = 0.25;
/// Most histogram segments kept; beyond, adjacent segments merge.
pub const MAX_SEGMENTS: usize = 16;
/// Requests per histogram segment at the start.
const SEGMENT: u64 = 16 * BATCH;
/// Significant digits of the segments' histograms.
const SEGMENT_DIGITS: u8 = 2;

/// Whether a run reached a steady state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Stability {
    /// Its warm-up ended in the first half and its queue does not keep growing.
    Stable,
    /// Its queue keeps growing: the offered load is above what it serves.
    Unstable,
    /// Too few requests, or a warm-up that lasts past the middle, to tell.
    TooShort,
}

impl Stability {
    /// The name in `runs.parquet`.
    pub fn name(self) -> &'static str {
        match self {
            Stability::Stable => "stable",
            Stability::Unstable => "unstable",
            Stability::TooShort => "too_short",
        }
    }
}

/// Sums of consecutive observations, indexed by arrival, in batches: `N`
/// series observed together (each arrival gives one value of each), so
/// they share their batches and counts.
#[derive(Clone, Debug)]
struct Batches<const N: usize> {
    /// Observations per batch.
    size: u64,
    sum: Vec<[f64; N]>,
    count: Vec<u32>,
}

impl<const N: usize> Batches<N> {
    fn new() -> Batches<N> {
        Batches { size: BATCH, sum: Vec::new(), count: Vec::new() }
    }

    /// Observations `v` (one per series) of arrival number `index`.
    fn add(&mut self, index: u64, v: [f64; N]) {
        while index / self.size >= MAX_BATCHES as u64 {
            self.coarsen();
        }
        let j = (index / self.size) as usize;
        if j >= self.sum.len() {
            self.sum.resize(j + 1, [0.0; N]);
            self.count.resize(j + 1, 0);
        }
        for (s, v) in self.sum[j].iter_mut().zip(v) {
            *s += v;
        }
        self.count[j] += 1;
    }

    /// Merges adjacent batches (the batch size doubles).
    fn coarsen(&mut self) {
        let pairs = self.sum.len().div_ceil(2);
        for i in 0..pairs {
            let (a, b) = (2 * i, 2 * i + 1);
            let next = self.sum.get(b).copied().unwrap_or([0.0; N]);
            self.sum[i] = std::array::from_fn(|k| self.sum[a][k] + next[k]);
            self.count[i] = self.count[a] + self.count.get(b).copied().unwrap_or(0);
        }
        self.sum.truncate(pairs);
        self.count.truncate(pairs);
        self.size *= 2;
    }

    /// Arrivals up to the last with an observation.
    fn arrivals(&self) -> u64 {
        let last = self.count.iter().rposition(|&c| c > 0);
        last.map_or(0, |j| j as u64 * self.size + self.size)
    }

    /// Series `k`'s sum and the number of observations in the second half of the batches.
    fn second_half(&self, k: usize) -> (f64, f64) {
        let h = self.sum.len() / 2;
        (self.sum[h..].iter().map(|s| s[k]).sum(), self.count[h..].iter().map(|&c| f64::from(c)).sum())
    }

    /// Series `k`'s means of the batches with observations, and the arrival index each starts at.
    fn means(&self, k: usize) -> (Vec<f64>, Vec<u64>) {
        let kept = (0..self.sum.len()).filter(|&j| self.count[j] > 0);
        kept.map(|j| (self.sum[j][k] / f64::from(self.count[j]), j as u64 * self.size)).unzip()
    }
}

/// The MSER truncation point of batch means `z`: the number of leading
/// batches to drop (`None` for fewer than 5 batches).
///
/// A constant tail has a statistic of 0, so MSER alone would cut
/// everything before it: a queue whose waits are all zero from some point
/// on (light load, a deterministic service: every TTFT the same) would be
/// cut there, past the middle, and called too short. When the minimum is 0
/// and past the middle, the cut is the minimum over the first half instead.
pub fn mser(z: &[f64]) -> Option<usize> {
    let d = mser_upto(z, z.len())?;
    let tail = &z[d..];
    let constant = tail.iter().all(|&x| x == tail[0]);
    if constant && d > z.len() / 2 { mser_upto(z, z.len() / 2) } else { Some(d) }
}

/// [`mser`]'s minimum over cuts of at most `limit` batches.
fn mser_upto(z: &[f64], limit: usize) -> Option<usize> {
    let k = z.len();
    if k < 5 {
        return None;
    }
    // Centred on the overall mean, so the suffix sums lose no precision.
    let centre = z.iter().sum::<f64>() / k as f64;
    let (mut s1, mut s2) = (0.0, 0.0);
    let mut best = (f64::INFINITY, 0);
    // d = k − 5 down to 0, suffix sums growing; ties go to the smaller d.
    for (i, &x) in z.iter().enumerate().rev() {
        let y = x - centre;
        s1 += y;
        s2 += y * y;
        let n = (k - i) as f64;
        if k - i < 5 {
            continue;
        }
        let stat = (s2 - s1 * s1 / n).max(0.0) / (n * n);
        if stat <= best.0 && i <= limit {
            best = (stat, i);
        }
    }
    Some(best.1)
}

/// Whether series `z` rises over its second half (see the module docs).
pub fn rises(z: &[f64]) -> bool {
    let half = &z[z.len() / 2..];
    if half.len() < TREND_GROUPS {
        return false;
    }
    let g = TREND_GROUPS as f64;
    let group = |i: usize| {
        let (a, b) = (i * half.len() / TREND_GROUPS, (i + 1) * half.len() / TREND_GROUPS);
        half[a..b].iter().sum::<f64>() / (b - a) as f64
    };
    let y: Vec<f64> = (0..TREND_GROUPS).map(group).collect();
    let (xm, ym) = ((g - 1.0) / 2.0, y.iter().sum::<f64>() / g);
    let sxx: f64 = (0..TREND_GROUPS).map(|i| (i as f64 - xm).powi(2)).sum();
    let slope = y.iter().enumerate().map(|(i, v)| (i as f64 - xm) * (v - ym)).sum::<f64>() / sxx;
    let ssr: f64 = y.iter().enumerate().map(|(i, v)| (v - ym - slope * (i as f64 - xm)).powi(2)).sum();
    let se = (ssr / (g - 2.0) / sxx).sqrt();
    let significant = if se > 0.0 { slope / se > TREND_T } else { slope > 0.0 };
    significant && slope * (g - 1.0) > MATERIAL_RISE * ym.abs()
}

/// Where the warm-up of batch means `z` ends: [`mser`]'s cut, capped at
/// the first batch on the other side of the mean after it from where `z`
/// starts (see the module docs; `None` for fewer than 5 batches).
pub fn warmup_cut(z: &[f64]) -> Option<usize> {
    let d = mser(z)?;
    let mean = z[d..].iter().sum::<f64>() / (z.len() - d) as f64;
    let below = z[0] < mean;
    let crossing = z.iter().position(|&x| if below { x >= mean } else { x <= mean });
    Some(crossing.map_or(d, |c| c.min(d)))
}

/// The latencies of one segment of consecutive arrivals.
#[derive(Clone, Debug)]
struct Segment {
    hist: [LatencyHistogram; 4],
    /// The earliest arrival among its requests.
    first_arrival: Option<SimTime>,
}

impl Segment {
    fn new() -> Segment {
        Segment { hist: std::array::from_fn(|_| LatencyHistogram::with_digits(SEGMENT_DIGITS)), first_arrival: None }
    }

    fn merge(&mut self, o: &Segment) {
        for (a, b) in self.hist.iter_mut().zip(&o.hist) {
            a.merge(b);
        }
        self.first_arrival = match (self.first_arrival, o.first_arrival) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

/// Which steady latency.
#[derive(Clone, Copy, Debug)]
pub enum Steady {
    /// Arrival → first token.
    Ttft = 0,
    /// Time per output token.
    Tpot = 1,
    /// Arrival → last token.
    E2e = 2,
    /// Arrival → first scheduled step.
    QueueWait = 3,
}

/// What a run's steady state was.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SteadySummary {
    /// The verdict.
    pub stability: Stability,
    /// Arrival time of the first request after the warm-up, s (NaN unless stable).
    pub warmup_s: f64,
    /// Requests (by arrival) in the warm-up (0 unless stable).
    pub warmup_requests: u64,
    /// Requests after it with a first token (0 unless stable).
    pub steady_requests: u64,
    /// TTFT after the warm-up, ms (NaN unless stable).
    pub ttft_ms: LatencyStats,
    /// TPOT after the warm-up, ms.
    pub tpot_ms: LatencyStats,
    /// End-to-end latency after the warm-up, ms.
    pub e2e_ms: LatencyStats,
    /// Queue wait after the warm-up, ms.
    pub queue_wait_ms: LatencyStats,
    /// For a `too_short` run, the run length (requests) its own warm-up
    /// and correlation suggest would be long enough ([`requests_needed`]);
    /// 0 otherwise.
    pub requests_needed: u64,
}

impl Default for SteadySummary {
    fn default() -> Self {
        let none = LatencyHistogram::default().stats();
        SteadySummary {
            stability: Stability::TooShort,
            warmup_s: f64::NAN,
            warmup_requests: 0,
            steady_requests: 0,
            ttft_ms: none,
            tpot_ms: none,
            e2e_ms: none,
            queue_wait_ms: none,
            requests_needed: 0,
        }
    }
}

/// The run length a `too_short` run of `arrivals` requests suggests, from
/// what made it too short (rounded up to 2 significant digits):
///
/// - (in [`SteadyState::finish`]) the number in system or the waits still
///   rising over the second half, without both rising: 8 × the run;
/// - fewer than [`MIN_BATCHES`] batches with a first token (`got`
///   requests): as many more as give [`MIN_BATCHES`] × [`BATCH`];
/// - the warm-up cut ([`warmup_cut`]) past the middle, at request `cut`: 2.5 × `cut`, so that the
///   cut falls in the first 40 %;
/// - fewer than [`REGENERATIONS`] queue drains in the second half (`drains`
///   of them): a run `k` = [`REGENERATIONS`] / `drains` times longer (drains
///   grow with the length), at least 2, at most 64 (none at all: 20).
///
/// An estimate from one run: the search takes the largest over a probe's runs.
pub fn requests_needed(arrivals: u64, got: u64, cut: Option<u64>, drains: Option<f64>) -> u64 {
    let need = if got < MIN_BATCHES as u64 * BATCH {
        arrivals as f64 * (MIN_BATCHES as u64 * BATCH) as f64 / got.max(1) as f64
    } else if let Some(cut) = cut {
        2.5 * cut as f64
    } else {
        let k = (REGENERATIONS / drains.unwrap_or(0.0).max(1.0)).clamp(2.0, 64.0);
        arrivals as f64 * k
    };
    round_up_2_digits(need.max(arrivals as f64 + 1.0))
}

/// `x` rounded up to two significant digits.
fn round_up_2_digits(x: f64) -> u64 {
    let unit = 10f64.powi((x.log10().floor() as i32 - 1).max(0));
    ((x / unit).ceil() * unit) as u64
}

/// The per-arrival series of a run, bounded in memory.
#[derive(Clone, Debug)]
pub struct SteadyState {
    /// Per arrival with a first token, its TTFT and its queue wait (s).
    first_token: Batches<2>,
    in_system: Batches<1>,
    /// Per arrival, 1 when it found its worker's waiting queue empty, and 1
    /// when it found it empty after the worker's previous arrival had
    /// found it not (a drain).
    queueing: Batches<2>,
    /// Per worker, whether its last arrival found a queue.
    queued: Vec<bool>,
    segment_size: u64,
    segments: Vec<Segment>,
}

impl Default for SteadyState {
    fn default() -> Self {
        SteadyState {
            first_token: Batches::new(),
            in_system: Batches::new(),
            queueing: Batches::new(),
            queued: Vec::new(),
            segment_size: SEGMENT,
            segments: Vec::new(),
        }
    }
}

impl SteadyState {
    /// Arrival number `serial` found `in_system` requests in the system.
    pub fn on_admitted(&mut self, serial: u32, in_system: u64) {
        self.in_system.add(u64::from(serial), [in_system as f64]);
    }

    /// Arrival number `serial` was queued at worker number `worker`, whose
    /// waiting queue held `waiting` requests.
    pub fn on_queued(&mut self, serial: u32, worker: usize, waiting: usize) {
        if self.queued.len() <= worker {
            self.queued.resize(worker + 1, false);
        }
        let (i, free) = (u64::from(serial), waiting == 0);
        let drained = std::mem::replace(&mut self.queued[worker], !free) && free;
        self.queueing.add(i, [f64::from(u8::from(free)), f64::from(u8::from(drained))]);
    }

    /// Arrival number `serial` (at `arrival`) got its first token after
    /// `ttft`, having waited `wait` for its first step.
    pub fn on_first_token(&mut self, serial: u32, arrival: SimTime, ttft: SimDuration, wait: SimDuration) {
        let i = u64::from(serial);
        self.first_token.add(i, [ttft.as_secs_f64(), wait.as_secs_f64()]);
        let s = self.segment(i);
        s.first_arrival = Some(s.first_arrival.map_or(arrival, |a| a.min(arrival)));
        s.hist[Steady::Ttft as usize].record(ttft);
        s.hist[Steady::QueueWait as usize].record(wait);
    }

    /// Latency `which` of arrival number `serial` is `d`.
    pub fn record(&mut self, serial: u32, which: Steady, d: SimDuration) {
        self.segment(u64::from(serial)).hist[which as usize].record(d);
    }

    fn segment(&mut self, index: u64) -> &mut Segment {
        while index / self.segment_size >= MAX_SEGMENTS as u64 {
            let merged: Vec<Segment> = self
                .segments
                .chunks(2)
                .map(|pair| {
                    let mut s = pair[0].clone();
                    if let Some(b) = pair.get(1) {
                        s.merge(b);
                    }
                    s
                })
                .collect();
            self.segments = merged;
            self.segment_size *= 2;
        }
        let j = (index / self.segment_size) as usize;
        while self.segments.len() <= j {
            self.segments.push(Segment::new());
        }
        &mut self.segments[j]
    }

    /// The verdict and the steady latencies.
    pub fn finish(&self) -> SteadySummary {
        let (z, starts) = self.first_token.means(0);
        let (wait_rises, filling) = (rises(&self.first_token.means(1).0), rises(&self.in_system.means(0).0));
        if wait_rises && filling {
            return SteadySummary { stability: Stability::Unstable, ..SteadySummary::default() };
        }
        let arrivals = self.first_token.arrivals();
        let got = self.first_token.count.iter().map(|&c| u64::from(c)).sum();
        if filling || wait_rises {
            // Still filling up (requests that stay long — long outputs —
            // accumulate before any queue forms), or waits still rising:
            // no steady state yet, and no sign of one within the run. A fill
            // still rising over the whole second half has a time constant
            // of a quarter of the run or more; a run that ends it in its
            // first tenth and then near capacity decorrelates needs about 8
            // times the length (measured: 8 × 1,500 requests brought two
            // capacity searches within 2 % of their 64,000-request answers,
            // 4 × did not).
            let requests_needed = round_up_2_digits(8.0 * arrivals as f64);
            return SteadySummary { requests_needed, ..SteadySummary::default() };
        }
        let (free, drains) = (self.queueing.second_half(0), self.queueing.second_half(1).0);
        let regenerating = drains >= REGENERATIONS || 2.0 * free.0 >= free.1;
        let d = match warmup_cut(&z) {
            Some(d) if z.len() >= MIN_BATCHES && d <= z.len() / 2 && regenerating => d,
            found => {
                let cut = found.filter(|&d| d > z.len() / 2).map(|d| starts[d]);
                let drains = found.is_some().then_some(drains);
                let requests_needed = requests_needed(arrivals, got, cut, drains);
                return SteadySummary { requests_needed, ..SteadySummary::default() };
            }
        };
        let cut = starts[d];
        let first = cut.div_ceil(self.segment_size) as usize;
        let mut kept = Segment::new();
        for s in self.segments.iter().skip(first) {
            kept.merge(s);
        }
        let stats = |w: Steady| kept.hist[w as usize].stats();
        SteadySummary {
            stability: Stability::Stable,
            warmup_s: kept.first_arrival.map_or(f64::NAN, SimTime::as_secs_f64),
            warmup_requests: first as u64 * self.segment_size,
            steady_requests: kept.hist[Steady::Ttft as usize].count(),
            ttft_ms: stats(Steady::Ttft),
            tpot_ms: stats(Steady::Tpot),
            e2e_ms: stats(Steady::E2e),
            queue_wait_ms: stats(Steady::QueueWait),
            requests_needed: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_too_short_run_suggests_a_length_from_what_made_it_too_short() {
        // 60 requests with a first token of 60 arrivals: 100 are needed.
        assert_eq!(requests_needed(60, 60, None, None), 100);
        // A warm-up cut at request 1,230 of 2,000: 2.5 × 1,230 = 3,075 → 3,100.
        assert_eq!(requests_needed(2000, 2000, Some(1230), None), 3100);
        // 4 drains in the second half, 20 wanted: 5 × 2,000 = 10,000.
        assert_eq!(requests_needed(2000, 2000, None, Some(4.0)), 10_000);
        // 15 drains: at least twice as long.
        assert_eq!(requests_needed(1500, 1500, None, Some(15.0)), 3000);
        // None at all (a queue that never drains: at or above capacity): 20 ×.
        assert_eq!(requests_needed(1000, 1000, None, Some(0.0)), 20_000);
    }

    #[test]
    fn mser_cuts_a_known_transient_exactly() {
        // 20 batches at 10, then ±1 alternating (mean 0) for 200 batches:
        // MSER(20) = 200/200² = 0.005; MSER(21) = (199 − 1/199)/199² > 0.005;
        // MSER(19) includes one 10: ≈ 299.5/201² = 0.0074.
        let z: Vec<f64> = (0..220)
            .map(|j| {
                if j < 20 {
                    10.0
                } else if j % 2 == 0 {
                    1.0
                } else {
                    -1.0
                }
            })
            .collect();
        assert_eq!(mser(&z), Some(20));
        // No transient: nothing is cut.
        let flat: Vec<f64> = (0..100).map(|j| if j % 2 == 0 { 1.0 } else { -1.0 }).collect();
        assert_eq!(mser(&flat), Some(0));
        assert_eq!(mser(&[1.0; 4]), None);
        // A constant tail from batch 70 of 100 (light load: every TTFT the
        // same): not cut there, but where the first half's minimum is —
        // here nothing, the first half being flat noise.
        let spiky: Vec<f64> = (0..100).map(|j| if j < 70 && j % 2 == 0 { 2.0 } else { 1.0 }).collect();
        assert!(mser_upto(&spiky, 100).unwrap() >= 69, "MSER alone cuts into the constant tail");
        assert_eq!(mser(&spiky), Some(0));
    }

    #[test]
    fn mser_5_through_the_batches_cuts_the_first_100_requests() {
        // Requests 0..100 wait 10 s, then 1 s and 3 s alternating in pairs
        // (every batch of 5 mixes them: its mean is 1.8 or 2.2).
        let mut b = Batches::new();
        for i in 0..2000u64 {
            b.add(
                i,
                [if i < 100 {
                    10.0
                } else if (i / 2) % 2 == 0 {
                    1.0
                } else {
                    3.0
                }],
            );
        }
        let (z, starts) = b.means(0);
        assert_eq!(z.len(), 400);
        assert_eq!(starts[mser(&z).unwrap()], 100);
    }

    #[test]
    fn batches_coarsen_by_pairs_and_keep_every_observation() {
        let mut b = Batches::new();
        let n = (MAX_BATCHES as u64) * BATCH * 3;
        for i in 0..n {
            b.add(i, [i as f64, 1.0]);
        }
        assert_eq!(b.size, BATCH * 4);
        assert!(b.sum.len() <= MAX_BATCHES);
        assert_eq!(b.count.iter().map(|&c| u64::from(c)).sum::<u64>(), n);
        let total: f64 = b.sum.iter().map(|s| s[0]).sum();
        assert_eq!(total, (n * (n - 1) / 2) as f64);
        let ones: f64 = b.sum.iter().map(|s| s[1]).sum();
        assert_eq!(ones, n as f64, "each series keeps its own sums");
    }

    #[test]
    fn a_trend_needs_significance_and_size() {
        let line: Vec<f64> = (0..200).map(|j| j as f64).collect();
        assert!(rises(&line));
        let flat = vec![3.0; 200];
        assert!(!rises(&flat));
        // A rise of 1 % of the level, however regular, does not matter.
        let slight: Vec<f64> = (0..200).map(|j| 1000.0 + 0.01 * j as f64).collect();
        assert!(!rises(&slight));
        // Noise about a level: no trend.
        let noise: Vec<f64> = (0..200).map(|j| 5.0 + if (j * 7919) % 13 < 6 { 1.0 } else { -1.0 }).collect();
        assert!(!rises(&noise));
        let falling: Vec<f64> = (0..200).map(|j| 200.0 - j as f64).collect();
        assert!(!rises(&falling));
        assert!(!rises(&line[..15]), "too few batches to fit");
    }

    #[test]
    fn the_warm_up_ends_at_the_first_crossing_of_the_mean() {
        // A queue filling from empty: 0, 1, 2, 3, then level 4 with one big
        // excursion (20) at batches 30–39 and noise ±1 after. MSER cuts the
        // excursion (past batch 39); the series first reached its level at
        // batch 4 (≥ the mean after MSER's cut, 4.0), so the cut is 4.
        let z: Vec<f64> = (0..200)
            .map(|j| match j {
                0..4 => j as f64,
                30..40 => 20.0,
                _ => 4.0 + if j % 2 == 0 { 1.0 } else { -1.0 },
            })
            .collect();
        assert!(mser(&z).unwrap() >= 40, "MSER alone cuts the excursion");
        assert_eq!(warmup_cut(&z), Some(4));
        // From above (cold caches): 10, 9, …, 5 then ±1 about 1: MSER's cut
        // (6) comes before the first batch at or below the steady mean
        // (1.0: batch 7), so it stands.
        let cold: Vec<f64> = (0..100)
            .map(|j| {
                if j < 6 {
                    10.0 - j as f64
                } else if j % 2 == 0 {
                    2.0
                } else {
                    0.0
                }
            })
            .collect();
        assert_eq!(mser(&cold), Some(6));
        assert_eq!(warmup_cut(&cold), Some(6));
        assert_eq!(warmup_cut(&[3.0; 50]), Some(0), "constant: nothing to cut");
    }

    #[test]
    fn a_queue_drains_when_an_arrival_finds_it_empty_after_one_found_it_not() {
        let mut s = SteadyState::default();
        // Worker 0: waiting 0, 2, 0, 0, 1, 0 → drains at arrivals 2 and 5;
        // worker 1 (interleaved): 3, 0 → a drain at its second arrival.
        let arrivals = [(0, 0), (0, 2), (1, 3), (0, 0), (0, 0), (1, 0), (0, 1), (0, 0)];
        for (i, &(w, waiting)) in arrivals.iter().enumerate() {
            s.on_queued(i as u32, w, waiting);
        }
        let drains: f64 = s.queueing.sum.iter().map(|b| b[1]).sum();
        let free: f64 = s.queueing.sum.iter().map(|b| b[0]).sum();
        assert_eq!((drains, free), (3.0, 5.0));
        assert_eq!(s.queueing.sum[0][1], 1.0, "arrival 3 (batch 0) drained worker 0");
        assert_eq!(s.queueing.sum[1][1], 2.0, "arrivals 5 and 7 (batch 1)");
    }

    #[test]
    fn segments_merge_in_pairs_and_keep_every_sample() {
        let mut s = SteadyState::default();
        let n = SEGMENT as u32 * MAX_SEGMENTS as u32 * 4;
        for i in 0..n {
            s.on_first_token(i, SimTime(u64::from(i)), SimDuration(1_000_000), SimDuration(0));
        }
        assert_eq!(s.segment_size, SEGMENT * 4);
        assert_eq!(s.segments.len(), MAX_SEGMENTS);
        let kept: u64 = s.segments.iter().map(|g| g.hist[0].count()).sum();
        assert_eq!(kept, u64::from(n));
        assert_eq!(s.segments[1].first_arrival, Some(SimTime(SEGMENT * 4)));
    }
}
