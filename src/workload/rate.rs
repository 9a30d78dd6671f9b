//! `UniformReqRate` and `ExponentialReqRate`: open-loop arrivals with prompt
//! and output lengths from distributions (uniform in Opal's `[min, max]` by
//! default). Prompt content: a leading prefix shared by the stage
//! (`default_prefix_length`) and then tokens unique to the request, or — the
//! Python Opal's model, where a prompt of n tokens is `list(range(n))` — the
//! first n tokens of one sequence shared by every stage.

use super::arrivals::{ArrivalProcess, Arrivals};
use super::dist::Dist;
use super::{Due, Emit, Generator, Label};
use crate::kvcache::{Content, content_id};
use crate::rng::{SeedTree, StreamRng};
use crate::time::SimTime;

/// A synthetic stage with a request rate and length distributions.
#[derive(Clone, Debug, PartialEq)]
pub struct RateStage {
    /// Arrival process.
    pub arrival: ArrivalProcess,
    /// Mean requests per second.
    pub rate: f64,
    /// Requests to generate (`None` = until a time limit).
    pub total: Option<u64>,
    /// Prompt length, tokens.
    pub prompt: Dist,
    /// Output length, tokens.
    pub output: Dist,
    /// What prompts contain.
    pub content: PromptContent,
}

/// The token content of a rate stage's prompts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptContent {
    /// This many leading tokens (capped at the prompt) are shared by every
    /// request of the stage; the rest are unique to the request.
    SharedPrefix(u32),
    /// Every prompt of n tokens is the first n tokens of one sequence, the
    /// same for every stage (the Python Opal's `list(range(n))`).
    SingleSequence,
}

/// The generator of a rate stage.
#[derive(Debug)]
pub(crate) struct RateSource {
    cfg: RateStage,
    lengths: StreamRng,
    arrivals: Arrivals,
    sent: u64,
}

impl RateSource {
    /// Lengths come from stream `workload.stage<i>.lengths`, gaps from
    /// `workload.stage<i>.arrivals` (exponential gaps are `mean × Exp(1)`
    /// draws, so changing the rate rescales arrival times without changing
    /// the request sizes: common random numbers across grid points).
    pub fn new(cfg: &RateStage, stage: usize, seeds: &SeedTree) -> RateSource {
        RateSource {
            cfg: cfg.clone(),
            lengths: seeds.stream(&format!("workload.stage{stage}.lengths")),
            arrivals: Arrivals::new(cfg.arrival, cfg.rate, seeds.stream(&format!("workload.stage{stage}.arrivals"))),
            sent: 0,
        }
    }
}

impl Generator for RateSource {
    fn start(&mut self, now: SimTime) -> Result<Due, String> {
        Ok(Due::At(self.arrivals.start(now)))
    }

    fn emit(&mut self, now: SimTime, room: u64, out: &mut Emit<'_>) -> Result<Due, String> {
        if room == 0 || self.arrivals.due() > now {
            return Ok(Due::At(self.arrivals.due()));
        }
        let prompt = self.cfg.prompt.sample_tokens(&mut self.lengths);
        let output = self.cfg.output.sample_tokens(&mut self.lengths);
        let mut content = Content::default();
        match self.cfg.content {
            PromptContent::SharedPrefix(shared) => {
                let shared = shared.min(prompt);
                content.push(content_id("prefix", out.stage_index()), shared);
                content.push(content_id("unique", out.key()), prompt - shared);
            }
            PromptContent::SingleSequence => content.push(content_id("sequence", 0), prompt),
        }
        out.push(prompt, output, content, Label::None);
        self.sent += 1;
        if self.cfg.total.is_some_and(|total| self.sent >= total) {
            Ok(Due::Done)
        } else {
            Ok(Due::At(self.arrivals.advance(now)))
        }
    }
}
