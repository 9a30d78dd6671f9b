//! `SC25Workload`: the KV-cache tier characterisation benchmark. A cold pass
//! sends one prompt of each size with fresh content (nothing shared with any
//! other prompt), each after the previous one completes (plus `gap_sec`);
//! then a warm pass sends the same prompts again in the same order, so each
//! can be served entirely from cache — from the GPU if it is still resident,
//! otherwise from the fastest tier below that holds it. Cold and warm TTFT
//! per size are reported in the run summary, the `sc25` table and the
//! requests table.

use super::{Due, Emit, Generator, Label};
use crate::kvcache::{Content, content_id};
use crate::time::{SimDuration, SimTime};

/// Opal's prompt sizes: multiples of 4,092 tokens up to 130,944.
pub const SC25_PROMPT_SIZES: [u32; 10] = [4092, 8184, 16368, 32736, 49104, 65472, 81840, 98208, 114576, 130944];

/// A resolved `SC25Workload` stage.
#[derive(Clone, Debug, PartialEq)]
pub struct Sc25Stage {
    /// Prompt sizes, in sending order.
    pub prompt_sizes: Vec<u32>,
    /// Output tokens of every request.
    pub output_tokens: u32,
    /// Pause between a completion and the next request.
    pub gap: SimDuration,
}

/// The generator: request `k` of `2n` (the first `n` cold).
#[derive(Debug)]
pub(crate) struct Sc25Source {
    cfg: Sc25Stage,
    stage: u64,
    next: usize,
    /// When the next request may go (`None` while one is in flight).
    ready_at: Option<SimTime>,
}

impl Sc25Source {
    /// Stage `stage`'s benchmark.
    pub fn new(cfg: &Sc25Stage, stage: usize) -> Sc25Source {
        Sc25Source { cfg: cfg.clone(), stage: stage as u64, next: 0, ready_at: None }
    }

    fn total(&self) -> usize {
        2 * self.cfg.prompt_sizes.len()
    }
}

impl Generator for Sc25Source {
    fn start(&mut self, now: SimTime) -> Result<Due, String> {
        if self.cfg.prompt_sizes.is_empty() {
            return Ok(Due::Done);
        }
        self.ready_at = Some(now);
        Ok(Due::At(now))
    }

    fn emit(&mut self, now: SimTime, room: u64, out: &mut Emit<'_>) -> Result<Due, String> {
        match self.ready_at {
            None => return Ok(Due::Waiting),
            Some(t) if t > now || room == 0 => return Ok(Due::At(t)),
            Some(_) => {}
        }
        let n = self.cfg.prompt_sizes.len();
        let i = self.next % n;
        let size = self.cfg.prompt_sizes[i];
        let mut content = Content::default();
        // The same content in both passes; distinct per size and per stage.
        content.push(content_id("sc25", (self.stage << 32) | i as u64), size);
        out.push(size, self.cfg.output_tokens, content, Label::Sc25 { warm: self.next >= n });
        self.next += 1;
        self.ready_at = None;
        Ok(if self.next == self.total() { Due::Done } else { Due::Waiting })
    }

    fn completed(&mut self, now: SimTime, _label: Label, _served: bool) -> Due {
        if self.next == self.total() {
            return Due::Done;
        }
        let t = now + self.cfg.gap;
        self.ready_at = Some(t);
        Due::At(t)
    }
}
