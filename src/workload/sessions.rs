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
//! Draws: turn counts, input and output lengths and think times come from
//! stream `workload.stage<i>.sessions` in the order the turns are sent;
//! session gaps from `workload.stage<i>.arrivals`.

use super::arrivals::{ArrivalProcess, Arrivals};
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
}

/// The generator.
#[derive(Debug)]
pub(crate) struct SessionSource {
    cfg: SessionsStage,
    draws: StreamRng,
    arrivals: Arrivals,
    started: u64,
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
        SessionSource {
            cfg: cfg.clone(),
            draws: seeds.stream(&format!("workload.stage{stage}.sessions")),
            arrivals: Arrivals::new(
                process,
                cfg.session_rate,
                seeds.stream(&format!("workload.stage{stage}.arrivals")),
            ),
            started: 0,
            next_session: None,
            active: HashMap::new(),
            due: BinaryHeap::new(),
            in_flight: 0,
            stage: stage as u64,
            truncated: 0,
        }
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
        let input = self.cfg.input_tokens.sample_tokens(&mut self.draws);
        let output = self.cfg.output_tokens.sample_tokens(&mut self.draws);
        let session = self.active.get_mut(&s).expect("a due turn belongs to an active session");
        let prompt = session.context.tokens() + u64::from(input);
        let limit = self.cfg.max_context_tokens.unwrap_or(u64::MAX).min(u64::from(u32::MAX));
        if prompt + u64::from(output) > limit {
            self.active.remove(&s);
            self.truncated += 1;
            return;
        }
        session.context.push(content_id("session-input", out.key()), input);
        session.turn += 1;
        let label = Label::Session { session: s, turn: session.turn };
        let output_id = out.push(prompt as u32, output, session.context.clone(), label);
        // The answer becomes part of the conversation the next turn sends.
        session.context.push(output_id, output);
        self.in_flight += 1;
    }
}

impl Generator for SessionSource {
    fn start(&mut self, now: SimTime) -> Result<Due, String> {
        if self.cfg.total_sessions != Some(0) {
            self.next_session = Some(self.arrivals.start(now));
        }
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
                    let s = self.started as u32;
                    self.started += 1;
                    let turns = self.cfg.turns.sample_tokens(&mut self.draws);
                    let mut context = Content::default();
                    context.push(content_id("session-system", self.stage), self.cfg.system_prompt_size);
                    self.active.insert(s, Session { turn: 0, turns, context });
                    self.next_session = if self.cfg.total_sessions.is_some_and(|n| self.started >= n) {
                        None
                    } else {
                        Some(self.arrivals.advance(now))
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
            let more = self.active.get(&session).is_some_and(|s| s.turn < s.turns);
            if served && more {
                let think = self.cfg.think_time.sample(&mut self.draws);
                self.due.push(Reverse((now + SimDuration::from_secs_f64(think), session)));
            } else {
                self.active.remove(&session);
            }
        }
        self.status()
    }
}
