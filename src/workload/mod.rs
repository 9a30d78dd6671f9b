//! Workload generation: stages run in sequence, each a generator that emits
//! requests to the router.
//!
//! A stage stops generating when its request or session count is out, when
//! its `time_duration_sec` has passed since it started (requests are sent
//! only strictly before that instant), or — through the engine's time limit —
//! when the global `simulation_time` passes. It ends when generation has
//! stopped and its last outstanding request has completed; the next stage
//! starts at that instant. `max_outstanding_requests` caps the stage's
//! in-flight requests: a request due while the cap is reached goes out at
//! the first completion that frees a place.
//!
//! Generators (one file each) are open-loop (`UniformReqRate`,
//! `ExponentialReqRate`, `Trace`, `RAGWorkload`, `VllmBench`: arrivals at given times) or
//! closed-loop (`SC25Workload`, `Sessions`: completions make the next
//! request due). This module only sequences stages, applies limits and
//! makes sure an arrival event is scheduled for whatever is due next.

mod arrivals;
pub mod dist;
mod rag;
mod rate;
mod sc25;
mod sessions;
mod trace;
mod vllm_bench;

pub use arrivals::ArrivalProcess;
pub use dist::Dist;
pub use rag::RagStage;
pub use rate::{PromptContent, RateStage};
pub use sc25::{SC25_PROMPT_SIZES, Sc25Stage};
pub use sessions::SessionsStage;
pub use trace::{TraceCounts, TraceError, TraceReader, TraceRequest, TraceStage, bursts as trace_bursts};
pub use vllm_bench::{BENCH_COMMAND, BenchError, BenchFile, BenchRequest, BenchTiming, RampUp, VllmBenchStage};

use crate::ids::StageId;
use crate::kvcache::{Content, content_id};
use crate::rng::SeedTree;
use crate::time::{SimDuration, SimTime};
use std::collections::BTreeSet;

/// What generates a stage's requests.
#[derive(Clone, Debug, PartialEq)]
pub enum StageKind {
    /// `UniformReqRate` or `ExponentialReqRate`.
    Rate(RateStage),
    /// `Trace`.
    Trace(TraceStage),
    /// `SC25Workload`.
    Sc25(Sc25Stage),
    /// `RAGWorkload`.
    Rag(RagStage),
    /// `Sessions`.
    Sessions(SessionsStage),
    /// `VllmBench`.
    VllmBench(VllmBenchStage),
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
    /// The stage's `type`, as a spec names it.
    pub fn type_name(&self) -> &'static str {
        match &self.kind {
            StageKind::Rate(s) if s.arrival == ArrivalProcess::Uniform => "UniformReqRate",
            StageKind::Rate(_) => "ExponentialReqRate",
            StageKind::Trace(_) => "Trace",
            StageKind::Sc25(_) => "SC25Workload",
            StageKind::Rag(_) => "RAGWorkload",
            StageKind::Sessions(_) => "Sessions",
            StageKind::VllmBench(_) => "VllmBench",
        }
    }

    /// Requests the stage will send, when its configuration says (a
    /// session's turns and a whole trace file are not counted ahead).
    pub fn expected_requests(&self) -> Option<u64> {
        match &self.kind {
            StageKind::Rate(s) => s.total,
            StageKind::Trace(s) => s.total,
            StageKind::Sc25(s) => Some(2 * s.prompt_sizes.len() as u64),
            StageKind::Rag(s) => s.total,
            StageKind::Sessions(_) => None,
            StageKind::VllmBench(s) => Some(s.requests.len() as u64),
        }
    }

    /// The longest sequence (prompt + output) the stage can produce, if known in advance.
    pub fn max_sequence_tokens(&self) -> Option<u64> {
        match &self.kind {
            StageKind::Rate(s) => Some(s.prompt.upper_bound()? as u64 + s.output.upper_bound()? as u64),
            StageKind::Sc25(s) => Some(u64::from(*s.prompt_sizes.iter().max()?) + u64::from(s.output_tokens)),
            StageKind::Rag(s) => Some(s.prompt_tokens() + s.output_tokens.upper_bound()? as u64),
            StageKind::VllmBench(s) => {
                s.requests.iter().map(|r| u64::from(r.prompt_tokens) + u64::from(r.output_tokens)).max()
            }
            // Long traces and conversations are rejected per request, as vLLM does.
            StageKind::Trace(_) | StageKind::Sessions(_) => None,
        }
    }
}

/// What a request is, for generators that need to know and for the outputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub enum Label {
    /// Nothing particular.
    #[default]
    None,
    /// An `SC25Workload` request of the cold or the warm pass.
    Sc25 {
        /// The warm pass.
        warm: bool,
    },
    /// Turn `turn` (from 1) of session `session` of a `Sessions` stage.
    Session {
        /// Session number within the stage, from 0.
        session: u32,
        /// Turn number, from 1.
        turn: u32,
    },
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
    /// Content identity of its output (a later request may include it).
    pub output_id: u64,
    /// What it is.
    pub label: Label,
}

/// What a generator expects next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Due {
    /// Something is due at this time (at or before now: held by the cap).
    At(SimTime),
    /// Nothing is due until a request completes.
    Waiting,
    /// Generation is over.
    Done,
}

/// Where a generator puts its requests; hands out request-unique keys.
pub(crate) struct Emit<'a> {
    stage: StageId,
    sent: u64,
    out: &'a mut Vec<NewRequest>,
}

impl Emit<'_> {
    /// The stage's index.
    pub fn stage_index(&self) -> u64 {
        u64::from(self.stage.0)
    }

    /// A key unique to the request about to be pushed (for unique content).
    pub fn key(&self) -> u64 {
        unique_key(self.stage.index(), self.sent)
    }

    /// Sends a request keyed by its place in the stage's sending order
    /// ([`Self::key`]); returns the content identity of its output.
    pub fn push(&mut self, prompt_tokens: u32, output_tokens: u32, content: Content, label: Label) -> u64 {
        self.push_keyed(self.key(), prompt_tokens, output_tokens, content, label)
    }

    /// Sends a request whose output identity derives from `key` (for
    /// generators whose sending order depends on the simulation, which key
    /// a request by what it is); returns that identity.
    pub fn push_keyed(
        &mut self,
        key: u64,
        prompt_tokens: u32,
        output_tokens: u32,
        content: Content,
        label: Label,
    ) -> u64 {
        let output_id = content_id("output", key);
        self.out.push(NewRequest { stage: self.stage, prompt_tokens, output_tokens, content, output_id, label });
        self.sent += 1;
        output_id
    }
}

/// A stage's request generator.
pub(crate) trait Generator {
    /// The stage starts at `now`.
    fn start(&mut self, now: SimTime) -> Result<Due, String>;
    /// Sends what is due at `now`, at most `room` requests.
    fn emit(&mut self, now: SimTime, room: u64, out: &mut Emit<'_>) -> Result<Due, String>;
    /// A request of the stage completed at `now` (`served` = false: rejected).
    /// Open-loop generators do not care.
    fn completed(&mut self, now: SimTime, label: Label, served: bool) -> Due {
        let _ = (now, label, served);
        Due::Waiting
    }
}

#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
enum Source {
    Rate(rate::RateSource),
    Trace(trace::TraceSource),
    Sc25(sc25::Sc25Source),
    Rag(rag::RagSource),
    Sessions(sessions::SessionSource),
    VllmBench(vllm_bench::VllmBenchSource),
}

impl Source {
    fn generator(&mut self) -> &mut dyn Generator {
        match self {
            Source::Rate(g) => g,
            Source::Trace(g) => g,
            Source::Sc25(g) => g,
            Source::Rag(g) => g,
            Source::Sessions(g) => g,
            Source::VllmBench(g) => g,
        }
    }
}

#[derive(Debug)]
struct StageState {
    start: SimTime,
    generated: u64,
    outstanding: u64,
    generation_done: bool,
    /// An emit was cut short by the cap; the next completion resumes it.
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
    /// Times at which an arrival event of the current stage is scheduled.
    armed: BTreeSet<SimTime>,
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
                source: match &st.kind {
                    StageKind::Rate(c) => Source::Rate(rate::RateSource::new(c, i, seeds)),
                    StageKind::Trace(c) => Source::Trace(trace::TraceSource::new(c, i, seeds)),
                    StageKind::Sc25(c) => Source::Sc25(sc25::Sc25Source::new(c, i)),
                    StageKind::Rag(c) => Source::Rag(rag::RagSource::new(c, i, seeds)),
                    StageKind::Sessions(c) => Source::Sessions(sessions::SessionSource::new(c, i, seeds)),
                    StageKind::VllmBench(c) => Source::VllmBench(vllm_bench::VllmBenchSource::new(c, i, seeds)),
                },
            })
            .collect();
        Workload { done: stages.is_empty(), stages, state, current: 0, armed: BTreeSet::new() }
    }

    /// True once every stage has ended.
    pub fn finished(&self) -> bool {
        self.done
    }

    /// What trace replays adjusted or left out so far, over every stage.
    pub fn trace_counts(&self) -> TraceCounts {
        let mut all = TraceCounts::default();
        for s in &self.state {
            if let Source::Trace(t) = &s.source {
                all += t.counts();
            }
        }
        all
    }

    /// Sessions ended early because the next turn would exceed `max_context_tokens`.
    pub fn sessions_truncated(&self) -> u64 {
        self.state
            .iter()
            .map(|s| match &s.source {
                Source::Sessions(g) => g.truncated,
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
        self.armed.clear();
        self.state[i].start = now;
        let due = self.state[i].source.generator().start(now)?;
        self.follow(i, now, due)
    }

    /// Acts on what the generator of stage `i` expects next.
    fn follow(&mut self, i: usize, now: SimTime, due: Due) -> Step {
        match due {
            Due::At(t) if t <= now && self.at_cap(i) => {
                self.state[i].blocked = true;
                Ok(None)
            }
            Due::At(t) => Ok(self.arm(i, now, t)),
            Due::Waiting => Ok(None),
            Due::Done => {
                self.state[i].generation_done = true;
                self.maybe_end_stage(now)
            }
        }
    }

    fn at_cap(&self, i: usize) -> bool {
        self.stages[i].max_outstanding.is_some_and(|cap| self.state[i].outstanding >= cap)
    }

    /// Schedules an arrival at `t` (cut at the stage's time limit) unless
    /// one at or before it is already scheduled (which will look again).
    fn arm(&mut self, i: usize, now: SimTime, t: SimTime) -> Option<(StageId, SimTime)> {
        let limit = self.stages[i].time_limit.map_or(SimTime::MAX, |l| self.state[i].start + l);
        let t = t.min(limit).max(now);
        if self.armed.first().is_some_and(|&first| first <= t) {
            return None;
        }
        self.armed.insert(t);
        Some((StageId(i as u32), t))
    }

    /// An arrival of `stage` is due at `now`. Pushes the requests to send (if
    /// any) to `out` and returns the next arrival event to schedule.
    pub fn on_arrival(&mut self, now: SimTime, stage: StageId, out: &mut Vec<NewRequest>) -> Step {
        let i = stage.index();
        if i != self.current || !self.armed.remove(&now) {
            return Ok(None); // left over from a stage that has ended
        }
        let cfg = &self.stages[i];
        let st = &mut self.state[i];
        if st.generation_done {
            return Ok(None);
        }
        if cfg.time_limit.is_some_and(|limit| now >= st.start + limit) {
            st.generation_done = true;
            return self.maybe_end_stage(now);
        }
        // Every request due at this instant goes out now (a burst — a rate
        // of `inf`, or a trace's equal timestamps — reaches the workers
        // together, as requests that reach vLLM's engine before it plans a
        // step are all in its waiting queue).
        let due = loop {
            let room = cfg.max_outstanding.map_or(u64::MAX, |cap| cap.saturating_sub(st.outstanding));
            let mut emit = Emit { stage, sent: st.generated, out: &mut *out };
            let due = st.source.generator().emit(now, room, &mut emit)?;
            let sent = emit.sent - st.generated;
            st.generated += sent;
            st.outstanding += sent;
            if sent == 0 || due != Due::At(now) {
                break due;
            }
        };
        self.follow(i, now, due)
    }

    /// A request of `stage` with `label` completed (`served` = false: it was
    /// rejected) at `now`; returns an arrival to schedule (a held one
    /// released, a closed loop's next request, or the next stage's first).
    pub fn on_completion(&mut self, now: SimTime, stage: StageId, label: Label, served: bool) -> Step {
        let i = stage.index();
        let st = &mut self.state[i];
        st.outstanding -= 1;
        if i != self.current {
            return Ok(None);
        }
        let due = st.source.generator().completed(now, label, served);
        if st.generation_done {
            return self.maybe_end_stage(now);
        }
        if std::mem::take(&mut st.blocked) {
            // The held request goes out now.
            return Ok(self.arm(i, now, now));
        }
        self.follow(i, now, due)
    }

    fn maybe_end_stage(&mut self, now: SimTime) -> Step {
        let st = &self.state[self.current];
        if !(st.generation_done && st.outstanding == 0) {
            return Ok(None);
        }
        if self.current + 1 < self.stages.len() {
            self.start_stage(self.current + 1, now)
        } else {
            self.done = true;
            self.armed.clear();
            Ok(None)
        }
    }
}

/// A key unique to the `n`-th request of stage `stage` (for request-unique content).
pub(crate) fn unique_key(stage: usize, n: u64) -> u64 {
    ((stage as u64) << 40) | n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(arrival: ArrivalProcess, total: Option<u64>) -> RateStage {
        RateStage {
            arrival,
            rate: 4.0,
            total,
            prompt: Dist::Uniform { min: 10.0, max: 20.0 },
            output: Dist::Uniform { min: 1.0, max: 3.0 },
            content: PromptContent::SharedPrefix(15),
        }
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
    fn single_sequence_prompts_are_prefixes_of_one_sequence_across_stages() {
        let mut a = rate(ArrivalProcess::Uniform, Some(5));
        a.content = PromptContent::SingleSequence;
        let mut w = Workload::new(vec![stage(a.clone()), stage(a)], &SeedTree::new(3));
        let mut out = Vec::new();
        let mut next = w.start(SimTime::ZERO).unwrap();
        while let Some((st, t)) = next {
            next = w.on_arrival(t, st, &mut out).unwrap();
            if next.is_none() && out.len() == 5 {
                for _ in 0..5 {
                    next = next.or(w.on_completion(t, StageId(0), Label::None, true).unwrap());
                }
            }
        }
        assert_eq!(out.len(), 10, "both stages ran");
        let hashes = |r: &NewRequest| {
            let mut h = Vec::new();
            crate::kvcache::block_hashes(&r.content.segments, 1, usize::MAX, &mut h);
            h
        };
        // Token i of every prompt is the same token: of any two prompts, the
        // shorter's block hashes are a prefix of the longer's.
        for x in &out {
            for y in &out {
                let (hx, hy) = (hashes(x), hashes(y));
                let n = hx.len().min(hy.len());
                assert_eq!(hx[..n], hy[..n]);
            }
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
            assert_eq!(w.on_completion(SimTime(2_000_000_000), StageId(0), Label::None, true).unwrap(), None);
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
        assert_eq!(
            w.on_completion(SimTime(7_000_000_000), StageId(0), Label::None, true).unwrap(),
            None,
            "one still outstanding"
        );
        let next = w.on_completion(SimTime(9_000_000_000), StageId(0), Label::None, true).unwrap();
        assert_eq!(next, Some((StageId(1), SimTime(9_000_000_000))));
        assert_eq!(w.on_arrival(SimTime(9_000_000_000), StageId(1), &mut out).unwrap(), None);
        assert!(!w.finished());
        assert_eq!(w.on_completion(SimTime(10_000_000_000), StageId(1), Label::None, true).unwrap(), None);
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
        let (_, t2) = w.on_completion(SimTime(2_000_000_000), st, Label::None, true).unwrap().unwrap();
        assert_eq!(t2, SimTime(2_000_000_000));
        let (_, t3) = w.on_arrival(t2, st, &mut out).unwrap().unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(t3, SimTime(2_250_000_000));
    }
}
