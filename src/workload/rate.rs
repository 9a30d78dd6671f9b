//! `UniformReqRate` and `ExponentialReqRate`: open-loop arrivals with prompt
//! and output lengths from distributions (uniform in Opal's
//! `[min, max]` by default) and a shared leading prefix
//! (`default_prefix_length`).

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
    /// Leading tokens shared by every request of the stage (capped at the prompt).
    pub shared_prefix: u32,
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
        let shared = self.cfg.shared_prefix.min(prompt);
        let mut content = Content::default();
        content.push(content_id("prefix", out.stage_index()), shared);
        content.push(content_id("unique", out.key()), prompt - shared);
        out.push(prompt, output, content, Label::None);
        self.sent += 1;
        if self.cfg.total.is_some_and(|total| self.sent >= total) {
            Ok(Due::Done)
        } else {
            Ok(Due::At(self.arrivals.advance(now)))
        }
    }
}
