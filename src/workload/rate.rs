//! `UniformReqRate` and `ExponentialReqRate`: open-loop arrivals with prompt
//! and output lengths from distributions (uniform in Opal's `[min, max]` by
//! default). Prompt content: a leading prefix shared by the stage
//! (`default_prefix_length`) and then tokens unique to the request, or — the
//! Python Opal's model, where a prompt of n tokens is `list(range(n))` — the
//! first n tokens of one sequence shared by every stage.

use super::arrivals::{ArrivalProcess, Arrivals, OpenLoop};
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
    prompts: StreamRng,
    outputs: StreamRng,
    clock: OpenLoop,
}

impl RateSource {
    /// Each quantity has its own stream, drawn in request order: gaps from
    /// `workload.stage<i>.arrivals`, prompt lengths from `….prompt_lengths`,
    /// output lengths from `….output_lengths`. So the request stream is the
    /// same whatever the router, the workers or the tiers do (common random
    /// numbers across grid points), changing one distribution leaves the
    /// others' draws alone, and exponential gaps are `mean × Exp(1)` draws,
    /// so changing the rate rescales arrival times without changing sizes.
    pub fn new(cfg: &RateStage, stage: usize, seeds: &SeedTree) -> RateSource {
        let stream = |what: &str| seeds.stream(&format!("workload.stage{stage}.{what}"));
        RateSource {
            cfg: cfg.clone(),
            prompts: stream("prompt_lengths"),
            outputs: stream("output_lengths"),
            clock: OpenLoop::new(Arrivals::new(cfg.arrival, cfg.rate, stream("arrivals")), cfg.total),
        }
    }
}

impl Generator for RateSource {
    fn start(&mut self, now: SimTime) -> Result<Due, String> {
        Ok(self.clock.start(now))
    }

    fn emit(&mut self, now: SimTime, room: u64, out: &mut Emit<'_>) -> Result<Due, String> {
        if !self.clock.ready(now, room) {
            return Ok(self.clock.next());
        }
        let prompt = self.cfg.prompt.sample_tokens(&mut self.prompts);
        let output = self.cfg.output.sample_tokens(&mut self.outputs);
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
        Ok(self.clock.sent(now))
    }
}
