//! Workload generation: stages run in sequence, each an arrival process that
//! emits requests to the router.
//!
//! A stage stops generating when its `total_requests` are out, when its
//! `time_duration_sec` has passed since it started (requests are sent only
//! strictly before that instant), or — through the engine's time limit — when
//! the global `simulation_time` passes. It ends when generation has stopped
//! and its last outstanding request has completed; the next stage starts at
//! that instant. `max_outstanding_requests` caps the stage's in-flight
//! requests: an arrival due while the cap is reached goes out at the first
//! completion that frees a place (the next gap counts from then).
//!
//! Randomness: each stage draws lengths from its own stream
//! (`workload.stage<i>.lengths`) and gaps from another
//! (`workload.stage<i>.arrivals`), and exponential gaps are `mean × Exp(1)`
//! draws, so changing the rate rescales arrival times without changing the
//! request sizes (common random numbers across grid points).

mod trace;

pub use trace::{TraceReader, TraceRequest, TraceStage};

use crate::ids::StageId;
use crate::kvcache::{Content, content_id};
use crate::rng::{SeedTree, StreamRng};
use crate::time::{SimDuration, SimTime};
use rand::RngExt;
use rand_distr::{Distribution, Exp1};

/// How gaps between arrivals are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ArrivalProcess {
    /// Every gap is exactly `1 / rate` (Opal's `UniformReqRate`).
    Uniform,
    /// Gap = `mean·(1 − jitter) + mean·Exp(1)·jitter` (Opal's `ExponentialReqRate`; jitter 1 = Poisson).
    Exponential {
        /// Blend between fixed (0) and exponential (1) gaps.
        jitter: f64,
    },
}

/// A synthetic stage with a request rate and uniform length ranges.
#[derive(Clone, Debug, PartialEq)]
pub struct RateStage {
    /// Arrival process.
    pub arrival: ArrivalProcess,
    /// Mean requests per second.
    pub rate: f64,
    /// Requests to generate (`None` = until a time limit).
    pub total: Option<u64>,
    /// Inclusive prompt-length range, tokens.
    pub prompt: (u32, u32),
    /// Inclusive output-length range, tokens.
    pub output: (u32, u32),
    /// Leading tokens shared by every request of the stage (capped at the prompt).
    pub shared_prefix: u32,
}

/// What generates a stage's requests.
#[derive(Clone, Debug, PartialEq)]
pub enum StageKind {
    /// `UniformReqRate` or `ExponentialReqRate`.
    Rate(RateStage),
    /// `Trace`.
    Trace(TraceStage),
}

/// A resolved workload stage.
#[derive(Clone, Debug, PartialEq)]
pub struct StageConfig {
    /// The generator.
    pub kind: StageKind,
    /// Stage time limit from its start.
    pub time_limit: Option<SimDuration>,
    /// In-flight cap.
    pub max_outstanding: Option<u64>,
}

impl StageConfig {
    /// The longest sequence (prompt + output) the stage can produce, if known in advance.
    pub fn max_sequence_tokens(&self) -> Option<u64> {
        match &self.kind {
            StageKind::Rate(s) => Some(u64::from(s.prompt.1) + u64::from(s.output.1)),
            StageKind::Trace(_) => None,
        }
    }
}

/// A request the workload wants sent now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewRequest {
    /// Generating stage.
    pub stage: StageId,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens.
    pub output_tokens: u32,
    /// Prompt content.
    pub content: Content,
}

/// A stage's generator state (one per stage, so variant sizes do not matter).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
enum Source {
    Rate {
        lengths: StreamRng,
        arrivals: StreamRng,
        /// Seconds since the stage start of the next arrival (f64, so fixed gaps never accumulate rounding).
        next_offset_secs: f64,
    },
    Trace {
        reader: Option<TraceReader>,
        pending: Option<TraceRequest>,
    },
}

#[derive(Debug)]
struct StageState {
    start: SimTime,
    generated: u64,
    outstanding: u64,
    generation_done: bool,
    blocked: bool,
    source: Source,
}

/// The stages of a run and where generation stands.
#[derive(Debug)]
pub struct Workload {
    stages: Vec<StageConfig>,
    state: Vec<StageState>,
    current: usize,
    done: bool,
}

/// A workload step: the next arrival to schedule, or a fatal input error.
pub type Step = Result<Option<(StageId, SimTime)>, String>;

impl Workload {
    /// The workload of a run, with streams from `seeds`.
    pub fn new(stages: Vec<StageConfig>, seeds: &SeedTree) -> Workload {
        let state = stages
            .iter()
            .enumerate()
            .map(|(i, st)| StageState {
                start: SimTime::ZERO,
                generated: 0,
                outstanding: 0,
                generation_done: false,
                blocked: false,
                source: match st.kind {
                    StageKind::Rate(_) => Source::Rate {
                        lengths: seeds.stream(&format!("workload.stage{i}.lengths")),
                        arrivals: seeds.stream(&format!("workload.stage{i}.arrivals")),
                        next_offset_secs: 0.0,
                    },
                    StageKind::Trace(_) => Source::Trace { reader: None, pending: None },
                },
            })
            .collect();
        Workload { done: stages.is_empty(), stages, state, current: 0 }
    }

    /// True once every stage has ended.
    pub fn finished(&self) -> bool {
        self.done
    }

    /// Malformed trace lines skipped so far.
    pub fn skipped_lines(&self) -> u64 {
        self.state
            .iter()
            .map(|s| match &s.source {
                Source::Trace { reader: Some(r), .. } => r.skipped,
                _ => 0,
            })
            .sum()
    }

    /// Starts the first stage at `now`; returns its first arrival.
    pub fn start(&mut self, now: SimTime) -> Step {
        if self.done {
            return Ok(None);
        }
        self.start_stage(0, now)
    }

    fn start_stage(&mut self, i: usize, now: SimTime) -> Step {
        self.current = i;
        let st = &mut self.state[i];
        st.start = now;
        match (&self.stages[i].kind, &mut st.source) {
            (StageKind::Rate(_), Source::Rate { .. }) => Ok(Some((StageId(i as u32), now))),
            (StageKind::Trace(cfg), Source::Trace { reader, pending }) => {
                let mut r = TraceReader::open(cfg)?;
                *pending = r.next_request(unique_key(i, 0))?;
                *reader = Some(r);
                match pending.as_ref().map(|p| trace::due(now, p)) {
                    Some(due) => Ok(Some((StageId(i as u32), self.clip(i, now, due)))),
                    None => {
                        self.state[i].generation_done = true;
                        Ok(self.maybe_end_stage(now)?)
                    }
                }
            }
            _ => unreachable!("stage state matches its kind"),
        }
    }

    /// The next arrival time, cut at the stage's time limit.
    fn clip(&self, i: usize, now: SimTime, next: SimTime) -> SimTime {
        let limit = self.stages[i].time_limit.map_or(SimTime::MAX, |l| self.state[i].start + l);
        next.min(limit).max(now)
    }

    /// An arrival of `stage` is due at `now`. Pushes the request to send (if
    /// any) to `out` and returns the next arrival event to schedule.
    pub fn on_arrival(&mut self, now: SimTime, stage: StageId, out: &mut Vec<NewRequest>) -> Step {
        let i = stage.index();
        debug_assert_eq!(i, self.current, "arrival for a stage that is not running");
        let cfg = &self.stages[i];
        let st = &mut self.state[i];
        if st.generation_done {
            return Ok(None);
        }
        if cfg.time_limit.is_some_and(|limit| now >= st.start + limit) {
            st.generation_done = true;
            return self.maybe_end_stage(now);
        }
        if cfg.max_outstanding.is_some_and(|cap| st.outstanding >= cap) {
            st.blocked = true;
            return Ok(None);
        }
        let key = unique_key(i, st.generated);
        let next = match (&cfg.kind, &mut st.source) {
            (StageKind::Rate(rate), Source::Rate { lengths, arrivals, next_offset_secs }) => {
                let prompt = lengths.random_range(rate.prompt.0..=rate.prompt.1);
                let output = lengths.random_range(rate.output.0..=rate.output.1);
                let shared = rate.shared_prefix.min(prompt);
                let mut content = Content::default();
                content.push(content_id("prefix", i as u64), shared);
                content.push(content_id("unique", key), prompt - shared);
                out.push(NewRequest { stage, prompt_tokens: prompt, output_tokens: output, content });
                st.generated += 1;
                st.outstanding += 1;
                if rate.total.is_some_and(|total| st.generated >= total) {
                    None
                } else {
                    let mean = 1.0 / rate.rate;
                    let gap = match rate.arrival {
                        ArrivalProcess::Uniform => mean,
                        ArrivalProcess::Exponential { jitter } => {
                            let e: f64 = Exp1.sample(arrivals);
                            mean * (1.0 - jitter) + mean * e * jitter
                        }
                    };
                    *next_offset_secs += gap;
                    Some(st.start + SimDuration::from_secs_f64(*next_offset_secs))
                }
            }
            (StageKind::Trace(_), Source::Trace { reader, pending }) => {
                let r = pending.take().expect("a trace arrival has a pending request");
                out.push(NewRequest {
                    stage,
                    prompt_tokens: r.prompt_tokens,
                    output_tokens: r.output_tokens,
                    content: r.content,
                });
                st.generated += 1;
                st.outstanding += 1;
                let reader = reader.as_mut().expect("the trace is open while its stage runs");
                *pending = reader.next_request(unique_key(i, st.generated))?;
                pending.as_ref().map(|p| trace::due(st.start, p))
            }
            _ => unreachable!("stage state matches its kind"),
        };
        match next {
            Some(t) => Ok(Some((stage, self.clip(i, now, t)))),
            None => {
                self.state[i].generation_done = true;
                self.maybe_end_stage(now)
            }
        }
    }

    /// A request of `stage` completed at `now`; returns an arrival to schedule
    /// (a blocked one released, or the next stage's first).
    pub fn on_completion(&mut self, now: SimTime, stage: StageId) -> Step {
        let st = &mut self.state[stage.index()];
        st.outstanding -= 1;
        if st.blocked {
            // The held arrival goes out now and the next gap counts from now.
            st.blocked = false;
            if let Source::Rate { next_offset_secs, .. } = &mut st.source {
                *next_offset_secs = (now - st.start).as_secs_f64();
            }
            return Ok(Some((stage, now)));
        }
        if stage.index() == self.current { self.maybe_end_stage(now) } else { Ok(None) }
    }

    fn maybe_end_stage(&mut self, now: SimTime) -> Step {
        let st = &self.state[self.current];
        if !(st.generation_done && st.outstanding == 0) {
            return Ok(None);
        }
        if let Source::Trace { reader, .. } = &mut self.state[self.current].source {
            // Keep the skip count, drop the file handle.
            if let Some(r) = reader.as_mut() {
                r.close();
            }
        }
        if self.current + 1 < self.stages.len() {
            self.start_stage(self.current + 1, now)
        } else {
            self.done = true;
            Ok(None)
        }
    }
}

/// A key unique to the `n`-th request of stage `stage` (for request-unique content).
fn unique_key(stage: usize, n: u64) -> u64 {
    ((stage as u64) << 40) | n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(arrival: ArrivalProcess, total: Option<u64>) -> RateStage {
        RateStage { arrival, rate: 4.0, total, prompt: (10, 20), output: (1, 3), shared_prefix: 15 }
    }

    fn stage(r: RateStage) -> StageConfig {
        StageConfig { kind: StageKind::Rate(r), time_limit: None, max_outstanding: None }
    }

    /// Drives arrivals only (no completions) and returns the send times in ns.
    fn send_times(w: &mut Workload, max_events: usize) -> Vec<u64> {
        let mut out = Vec::new();
        let mut times = Vec::new();
        let mut next = w.start(SimTime::ZERO).unwrap();
        while let Some((s, t)) = next {
            if times.len() >= max_events {
                break;
            }
            let before = out.len();
            next = w.on_arrival(t, s, &mut out).unwrap();
            if out.len() > before {
                times.push(t.0);
            }
        }
        times
    }

    #[test]
    fn uniform_sends_at_stage_start_then_every_1_over_rate() {
        let mut w = Workload::new(vec![stage(rate(ArrivalProcess::Uniform, Some(4)))], &SeedTree::new(1));
        assert_eq!(send_times(&mut w, 10), vec![0, 250_000_000, 500_000_000, 750_000_000]);
    }

    #[test]
    fn exponential_gaps_scale_with_the_rate_and_sizes_do_not_change() {
        let mut slow = rate(ArrivalProcess::Exponential { jitter: 1.0 }, Some(50));
        slow.rate = 1.0;
        let mut fast = slow.clone();
        fast.rate = 2.0;
        let seeds = SeedTree::new(9);
        let run = |s: RateStage| {
            let mut w = Workload::new(vec![stage(s)], &seeds);
            let mut out = Vec::new();
            let mut times = Vec::new();
            let mut next = w.start(SimTime::ZERO).unwrap();
            while let Some((st, t)) = next {
                times.push(t.0 as f64);
                next = w.on_arrival(t, st, &mut out).unwrap();
            }
            (times, out)
        };
        let (t1, r1) = run(slow);
        let (t2, r2) = run(fast);
        assert_eq!(r1, r2, "request sizes must not depend on the rate");
        for (a, b) in t1.iter().zip(&t2) {
            assert!((a / 2.0 - b).abs() <= 1.0, "{a} vs {b}: arrival times must halve (±1 ns rounding)");
        }
        assert!(r1.iter().all(|r| (10..=20).contains(&r.prompt_tokens) && (1..=3).contains(&r.output_tokens)));
        // The first min(15, prompt) tokens are the stage's shared prefix, the rest unique.
        let prefix = content_id("prefix", 0);
        for r in &r1 {
            assert_eq!(r.content.segments[0].id, prefix);
            assert_eq!(r.content.segments[0].tokens, r.prompt_tokens.min(15));
            assert_eq!(r.content.tokens(), u64::from(r.prompt_tokens));
        }
    }

    #[test]
    fn time_limit_sends_only_strictly_before_the_limit() {
        let mut s = stage(rate(ArrivalProcess::Uniform, None));
        s.time_limit = Some(SimDuration::from_secs(1));
        let mut w = Workload::new(vec![s], &SeedTree::new(1));
        // 0, 0.25, 0.5, 0.75 are sent; the arrival at exactly 1.0 s stops generation.
        assert_eq!(send_times(&mut w, 10).len(), 4);
        assert!(!w.finished(), "four requests are still outstanding");
        for _ in 0..4 {
            assert_eq!(w.on_completion(SimTime(2_000_000_000), StageId(0)).unwrap(), None);
        }
        assert!(w.finished(), "the last completion ends the only stage");
    }

    #[test]
    fn stages_run_in_sequence_and_the_next_starts_when_the_last_request_completes() {
        let a = stage(rate(ArrivalProcess::Uniform, Some(2)));
        let b = stage(rate(ArrivalProcess::Uniform, Some(1)));
        let mut w = Workload::new(vec![a, b], &SeedTree::new(1));
        let mut out = Vec::new();
        let (s0, t0) = w.start(SimTime::ZERO).unwrap().unwrap();
        let (s0b, t1) = w.on_arrival(t0, s0, &mut out).unwrap().unwrap();
        assert_eq!(w.on_arrival(t1, s0b, &mut out).unwrap(), None, "count reached");
        assert_eq!(w.on_completion(SimTime(7_000_000_000), StageId(0)).unwrap(), None, "one still outstanding");
        let next = w.on_completion(SimTime(9_000_000_000), StageId(0)).unwrap();
        assert_eq!(next, Some((StageId(1), SimTime(9_000_000_000))));
        assert_eq!(w.on_arrival(SimTime(9_000_000_000), StageId(1), &mut out).unwrap(), None);
        assert!(!w.finished());
        assert_eq!(w.on_completion(SimTime(10_000_000_000), StageId(1)).unwrap(), None);
        assert!(w.finished());
    }

    #[test]
    fn max_outstanding_holds_an_arrival_until_a_completion() {
        let mut s = stage(rate(ArrivalProcess::Uniform, Some(3)));
        s.max_outstanding = Some(1);
        let mut w = Workload::new(vec![s], &SeedTree::new(1));
        let mut out = Vec::new();
        let (st, t0) = w.start(SimTime::ZERO).unwrap().unwrap();
        let (_, t1) = w.on_arrival(t0, st, &mut out).unwrap().unwrap();
        assert_eq!(w.on_arrival(t1, st, &mut out).unwrap(), None, "blocked at 0.25 s");
        assert_eq!(out.len(), 1);
        // Completion at 2 s releases it immediately; the next gap counts from 2 s.
        let (_, t2) = w.on_completion(SimTime(2_000_000_000), st).unwrap().unwrap();
        assert_eq!(t2, SimTime(2_000_000_000));
        let (_, t3) = w.on_arrival(t2, st, &mut out).unwrap().unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(t3, SimTime(2_250_000_000));
    }
}
