//! `Sessions`: multi-turn (chat or agentic) conversations. Sessions arrive
//! open-loop at `session_rate` (Opal's jittered exponential gaps); each has
//! a number of turns drawn from `turns`. Turn 1's prompt is the stage's
//! shared system prompt plus new input; turn k+1's prompt is turn k's prompt,
//! turn k's output and new input — the whole conversation so far, so a
//! worker that still holds turn k's blocks serves all of it from cache.
//! Within a session the loop is closed: turn k+1 is sent `think_time_sec`
//! after turn k completes. A session ends after its last turn, when the
//! next turn would exceed `max_context_tokens`, or when a turn is rejected.
//!
//! Draws are keyed by what is drawn, not by when: session starts come from
//! stream `workload.stage<i>.arrivals`; session `s` draws its turn count,
//! its per-turn input and output lengths and its think times from streams
//! of its own (`workload.stage<i>.session<s>.turns`, `….input_lengths`,
//! `….output_lengths`, `….think_times`), and its turns' content is keyed by
//! (stage, session, turn). So a session is the same conversation whatever
//! the router, the workers or the tiers do to the timing of its turns, and
//! changing one distribution leaves the others' draws alone.

use super::arrivals::{ArrivalProcess, Arrivals, OpenLoop};
use super::dist::Dist;
use super::{Due, Emit, Generator, Label};
use crate::kvcache::{Content, content_id};
use crate::rng::{SeedTree, StreamRng};
use crate::time::{SimDuration, SimTime};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// A resolved `Sessions` stage.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionsStage {
    /// Sessions started per second.
    pub session_rate: f64,
    /// 0 = fixed gaps, 1 = Poisson.
    pub jitter: f64,
    /// Sessions to start (`None` = until a time limit).
    pub total_sessions: Option<u64>,
    /// Turns per session.
    pub turns: Dist,
    /// Tokens of the system prompt every session starts with.
    pub system_prompt_size: u32,
    /// New input tokens per turn.
    pub input_tokens: Dist,
    /// Output tokens per turn.
    pub output_tokens: Dist,
    /// Seconds between a turn's completion and the next turn.
    pub think_time: Dist,
    /// Longest prompt + output a session may reach (`None` = unlimited).
    pub max_context_tokens: Option<u64>,
}

#[derive(Debug)]
struct Session {
    turn: u32,
    turns: u32,
    context: Content,
    inputs: StreamRng,
    outputs: StreamRng,
    thinks: StreamRng,
}

/// The generator.
#[derive(Debug)]
pub(crate) struct SessionSource {
    cfg: SessionsStage,
    seeds: SeedTree,
    clock: OpenLoop,
    /// When the next session starts (`None`: no more sessions).
    next_session: Option<SimTime>,
    active: HashMap<u32, Session>,
    /// Turns waiting for their think time to pass: (due, session).
    due: BinaryHeap<Reverse<(SimTime, u32)>>,
    in_flight: u32,
    stage: u64,
    /// Sessions cut short by `max_context_tokens`.
    pub truncated: u64,
}

impl SessionSource {
    /// Stage `stage`'s sessions.
    pub fn new(cfg: &SessionsStage, stage: usize, seeds: &SeedTree) -> SessionSource {
        let process = ArrivalProcess::Exponential { jitter: cfg.jitter };
        let arrivals =
            Arrivals::new(process, cfg.session_rate, seeds.stream(&format!("workload.stage{stage}.arrivals")));
        SessionSource {
            cfg: cfg.clone(),
            seeds: *seeds,
            clock: OpenLoop::new(arrivals, cfg.total_sessions),
            next_session: None,
            active: HashMap::new(),
            due: BinaryHeap::new(),
            in_flight: 0,
            stage: stage as u64,
            truncated: 0,
        }
    }

    /// Session `s` begins: its own streams, its turn count, its system prompt.
    fn open(&mut self, s: u32) {
        let stream = |what: &str| self.seeds.stream(&format!("workload.stage{}.session{s}.{what}", self.stage));
        let turns = self.cfg.turns.sample_tokens(&mut stream("turns"));
        let mut context = Content::default();
        context.push(content_id("session-system", self.stage), self.cfg.system_prompt_size);
        let session = Session {
            turn: 0,
            turns,
            context,
            inputs: stream("input_lengths"),
            outputs: stream("output_lengths"),
            thinks: stream("think_times"),
        };
        self.active.insert(s, session);
    }

    /// The earliest thing due, turns before new sessions at equal times.
    fn earliest(&self) -> Option<(SimTime, Option<u32>)> {
        let turn = self.due.peek().map(|Reverse((t, s))| (*t, Some(*s)));
        let session = self.next_session.map(|t| (t, None));
        match (turn, session) {
            (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    fn status(&self) -> Due {
        match self.earliest() {
            Some((t, _)) => Due::At(t),
            None if self.in_flight > 0 => Due::Waiting,
            None => Due::Done,
        }
    }

    /// Sends session `s`'s next turn, or ends the session if it would not fit.
    fn send_turn(&mut self, s: u32, out: &mut Emit<'_>) {
        let session = self.active.get_mut(&s).expect("a due turn belongs to an active session");
        let input = self.cfg.input_tokens.sample_tokens(&mut session.inputs);
        let output = self.cfg.output_tokens.sample_tokens(&mut session.outputs);
        let prompt = session.context.tokens() + u64::from(input);
        let limit = self.cfg.max_context_tokens.unwrap_or(u64::MAX).min(u64::from(u32::MAX));
        if prompt + u64::from(output) > limit {
            self.active.remove(&s);
            self.truncated += 1;
            return;
        }
        let turn = session.turn + 1;
        let key = content_id("session-turn", u64::from(turn))
            ^ content_id("session-of-stage", (self.stage << 32) | u64::from(s));
        let session = self.active.get_mut(&s).expect("still active");
        session.context.push(content_id("session-input", key), input);
        session.turn = turn;
        let label = Label::Session { session: s, turn };
        let output_id = out.push_keyed(key, prompt as u32, output, session.context.clone(), label);
        // The answer becomes part of the conversation the next turn sends.
        session.context.push(output_id, output);
        self.in_flight += 1;
    }
}

impl Generator for SessionSource {
    fn start(&mut self, now: SimTime) -> Result<Due, String> {
        self.next_session = match self.clock.start(now) {
            Due::At(t) => Some(t),
            _ => None,
        };
        Ok(self.status())
    }

    fn emit(&mut self, now: SimTime, room: u64, out: &mut Emit<'_>) -> Result<Due, String> {
        let mut room = room;
        while room > 0 {
            let Some((t, which)) = self.earliest() else { break };
            if t > now {
                break;
            }
            let s = match which {
                Some(s) => {
                    self.due.pop();
                    s
                }
                None => {
                    let s = self.clock.count() as u32;
                    self.open(s);
                    self.next_session = match self.clock.sent(now) {
                        Due::At(t) => Some(t),
                        _ => None,
                    };
                    s
                }
            };
            let before = self.in_flight;
            self.send_turn(s, out);
            room -= u64::from(self.in_flight - before);
        }
        Ok(self.status())
    }

    fn completed(&mut self, now: SimTime, label: Label, served: bool) -> Due {
        if let Label::Session { session, .. } = label {
            self.in_flight -= 1;
            match self.active.get_mut(&session) {
                Some(s) if served && s.turn < s.turns => {
                    let think = self.cfg.think_time.sample(&mut s.thinks);
                    self.due.push(Reverse((now + SimDuration::from_secs_f64(think), session)));
                }
                _ => {
                    self.active.remove(&session);
                }
            }
        }
        self.status()
    }
}
