//! Step-time models: how long one scheduler step (one forward pass over the
//! batch) takes.
//!
//! A step has a prefill part (chunks of prompt tokens, each with the number of
//! tokens already in the KV cache) and a decode part (one token for each
//! decoding sequence, reading its KV context). The models:
//!
//! * `operators` (the default) — the step priced like the forward pass it
//!   is, operator by operator, from measured operator tables where the GPU
//!   has them (see [`operators`] and [`profile`]). Mixed batches are priced
//!   by construction.
//! * `roofline` — Opal's analytic model, kept bit for bit for imported Opal
//!   configurations and generalised to today's model families (see
//!   [`Roofline`]). Its prefill and decode parts combine by [`MixRule`]:
//!   `max` (Opal's rule) or `sum`.
//! * `synthetic` — every step takes the same fixed time.
//! * `table` — measured step latencies, interpolated (see [`LatencyTable`]);
//!   its fixed cost is charged once per step.

pub mod operators;
pub mod profile;
mod roofline;
mod table;

pub use roofline::{Coefficients, MixRule, PrefillBatch, Roofline, WeightTraffic};
pub use table::{COLUMNS, LatencyRows, LatencyTable, Measured, Phase, parse_measured, read_measured};

use crate::time::{Ramp, SimDuration};

/// One prefill chunk in a step: the sequence goes from `cached` to `end` computed tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillChunk {
    /// Tokens already in the KV cache before the chunk (p).
    pub cached: u64,
    /// Tokens in the KV cache after the chunk (n).
    pub end: u64,
}

/// The work of one step.
#[derive(Clone, Copy, Debug)]
pub struct StepWork<'a> {
    /// Prefill chunks.
    pub prefill: &'a [PrefillChunk],
    /// Decoding sequences (one new token each).
    pub decodes: u64,
    /// Draft tokens verified beside those tokens (speculative decoding: k
    /// per decoding sequence; 0 without). The forward runs on them too, each
    /// attending to its sequence's context, and each has its logits.
    pub drafts: u64,
    /// Σ over decoding sequences of the tokens already in their KV cache.
    pub decode_context_tokens: u64,
    /// The same with each sequence's context capped at the model's sliding
    /// window (equal to `decode_context_tokens` without one).
    pub decode_window_tokens: u64,
    /// Sequences that sample a token (the decoding ones and the prefill
    /// chunks that finish their prompt), and the drafts: the LM head's rows.
    pub samples: u64,
}

impl StepWork<'_> {
    /// Tokens the forward runs: the prefill chunks', one per decoding
    /// sequence, and the drafts.
    pub fn tokens(&self) -> u64 {
        self.decodes + self.drafts + self.prefill.iter().map(|c| c.end - c.cached).sum::<u64>()
    }

    /// A decode-only step: `decodes` sequences holding `context` tokens in
    /// all (`window` capped at the sliding window), each sampling.
    pub fn decode(decodes: u64, context: u64, window: u64) -> StepWork<'static> {
        StepWork {
            prefill: &[],
            decodes,
            drafts: 0,
            decode_context_tokens: context,
            decode_window_tokens: window,
            samples: decodes,
        }
    }
}

/// A resolved step-time model.
#[derive(Clone, Debug, PartialEq)]
pub enum StepModel {
    /// The forward pass, operator by operator.
    Operators(operators::Operators),
    /// Opal's analytic roofline, and how its prefill and decode parts combine.
    Roofline(Roofline, MixRule),
    /// A fixed time per step.
    Synthetic(SimDuration),
    /// Measured step latencies, and how a mixed step combines them.
    Table(LatencyTable, MixRule),
}

impl StepModel {
    /// Duration of one step (at least 1 ns; rounding per [`SimDuration::from_secs_f64`]).
    pub fn step_time(&self, work: &StepWork<'_>) -> SimDuration {
        match self {
            StepModel::Synthetic(d) => *d,
            _ => SimDuration::from_secs_f64(self.secs(work)).max(SimDuration(1)),
        }
    }

    /// Seconds of one step (a synthetic step's fixed time, in seconds).
    fn secs(&self, work: &StepWork<'_>) -> f64 {
        match self {
            StepModel::Synthetic(d) => d.as_secs_f64(),
            StepModel::Operators(o) => o.secs(work),
            StepModel::Roofline(r, mix) => {
                let prefill = r.prefill_batch_secs(work.prefill.iter().map(|c| (c.cached, c.end)));
                let tokens = work.tokens();
                let mut decode = r.decode_secs(tokens, work.decode_context_tokens, work.decode_window_tokens);
                if work.drafts > 0 {
                    // Verifying drafts multiplies the tokens of a step that
                    // reads the weights once: it is compute-bound at a large
                    // enough batch (Opal's decode is memory-bound alone).
                    decode = decode.max(r.linear_secs(work.decodes + work.drafts));
                }
                mix.combine(prefill, decode)
            }
            StepModel::Table(t, mix) => t.step_secs(work, *mix),
        }
    }

    /// The same model without its per-step CPU overheads (a speculative
    /// drafter's passes run inside the target's step, which counts them).
    pub fn without_overheads(self) -> StepModel {
        match self {
            StepModel::Operators(mut o) => {
                o.constants.step_overhead_s = 0.0;
                o.constants.seq_overhead_s = 0.0;
                o.constants.prefill_overhead_s = 0.0;
                StepModel::Operators(o)
            }
            StepModel::Roofline(mut r, mix) => {
                r.step_overhead_secs = 0.0;
                StepModel::Roofline(r, mix)
            }
            other => other,
        }
    }

    /// Prices the sub-steps of a decode run: decode-only steps of `decodes`
    /// sequences, each sampling, whose contexts alone change. The durations
    /// are [`Self::step_time`]'s exactly; the `operators` model prices what
    /// stays fixed over the run once.
    pub fn decode_run(&self, decodes: u64) -> DecodeSteps<'_> {
        match self {
            StepModel::Operators(o) => DecodeSteps::Operators(o.decode_run(decodes)),
            _ => DecodeSteps::Any(self, decodes),
        }
    }

    /// The model's name as `worker.inference_params.model` spells it.
    pub fn name(&self) -> &'static str {
        match self {
            StepModel::Operators(_) => "operators",
            StepModel::Roofline(..) => "roofline",
            StepModel::Synthetic(_) => "synthetic",
            StepModel::Table(..) => "table",
        }
    }
}

/// A decode run's step prices (see [`StepModel::decode_run`]).
#[derive(Clone, Copy, Debug)]
pub enum DecodeSteps<'a> {
    /// The operator model's, with the run's fixed part priced once.
    Operators(operators::DecodeRun<'a>),
    /// Any other model: each step priced whole, for this many decodes.
    Any(&'a StepModel, u64),
}

impl DecodeSteps<'_> {
    /// Duration of a sub-step whose sequences hold `context` tokens in all
    /// (`window`: capped at the sliding window), as [`StepModel::step_time`] gives it.
    pub fn step_time(&self, context: u64, window: u64) -> SimDuration {
        match *self {
            DecodeSteps::Any(StepModel::Synthetic(d), _) => *d,
            _ => seconds(self.parts(context, window)),
        }
    }

    /// The step's seconds as `max(part, floor)`: between two breaks
    /// ([`Self::breaks`]) `part` is affine in the context and `floor` constant
    /// (the operator model's GPU and CPU seconds; no floor otherwise).
    fn parts(&self, context: u64, window: u64) -> (f64, f64) {
        match *self {
            DecodeSteps::Operators(run) => run.parts(context, window),
            DecodeSteps::Any(model, decodes) => {
                let work = StepWork::decode(decodes, context, window);
                (model.secs(&work), f64::NEG_INFINITY)
            }
        }
    }

    /// Pushes the sub-steps in `a + 1 ..= b` of run `g` at which the price
    /// may change its slope (each starts a new piece): where the context
    /// per sequence enters a new segment of the attention grid (operators)
    /// or of the measured contexts (table). The roofline and synthetic
    /// prices are affine throughout.
    fn breaks(&self, g: &RunGrowth, a: u64, b: u64, out: &mut Vec<u64>) {
        match *self {
            DecodeSteps::Operators(run) => run.breaks(g, a, b, out),
            DecodeSteps::Any(StepModel::Table(t, _), decodes) => {
                let per_seq = |j: u64| g.at(j).0 as f64 / decodes as f64;
                for &knot in &t.decode_contexts {
                    if per_seq(a) <= knot && knot < per_seq(b) {
                        out.push(first_beyond(a, b, |j| per_seq(j) > knot));
                    }
                }
            }
            DecodeSteps::Any(..) => {}
        }
    }

    /// Prices sub-steps `a..=b` of run `g` (see [`Piece`]): the sub-steps
    /// at each piece's ends exactly, those between on the straight line
    /// between them, which [`Self::step_time`] follows within 1 ns there
    /// (rounding); a piece ends wherever the price changes slope. Prices
    /// 2 sub-steps per piece (and a few to find where the CPU floor takes
    /// over); pieces come from the grid segments the context crosses, not
    /// from the number of sub-steps. Returns the sub-steps it priced.
    pub fn pieces(&self, g: &RunGrowth, a: u64, b: u64, scratch: &mut Vec<u64>, out: &mut Vec<Piece>) -> u64 {
        scratch.clear();
        self.breaks(g, a, b, scratch);
        scratch.sort_unstable();
        scratch.dedup();
        let priced = std::cell::Cell::new(0);
        let parts = |j: u64| {
            priced.set(priced.get() + 1);
            let (c, w) = g.at(j);
            self.parts(c, w)
        };
        if let DecodeSteps::Any(StepModel::Synthetic(d), _) = *self {
            out.push(Piece::new(a, Ramp::flat(d.0, b - a + 1)));
            return 1;
        }
        let ns = |p: (f64, f64)| seconds(p).0;
        let mut push = |from: u64, to: u64, p0: (f64, f64), p1: (f64, f64)| {
            out.push(Piece::new(from, Ramp { first: ns(p0), last: ns(p1), len: to - from + 1 }));
        };
        if a == b {
            let p = parts(a);
            push(a, a, p, p);
            return priced.get();
        }
        let mut from = a;
        for i in 0..=scratch.len() {
            let to = scratch.get(i).map_or(b, |&next| next - 1);
            let (p0, p1) = (parts(from), parts(to));
            // Where the floor takes over (or lets go), another piece starts.
            let above = |p: (f64, f64)| p.0 > p.1;
            if above(p0) != above(p1) {
                let split = first_beyond(from, to, |j| above(parts(j)) != above(p0));
                push(from, split - 1, p0, parts(split - 1));
                push(split, to, parts(split), p1);
            } else {
                push(from, to, p0, p1);
            }
            from = to + 1;
        }
        priced.get()
    }
}

/// A step of `max(part, floor)` seconds, as [`StepModel::step_time`] rounds it.
fn seconds((part, floor): (f64, f64)) -> SimDuration {
    SimDuration::from_secs_f64(part.max(floor)).max(SimDuration(1))
}

/// How the sub-steps of a decode run grow: before sub-step `j` its
/// sequences hold `context + j·decodes` tokens (`window + j·below` capped
/// at the sliding window).
#[derive(Clone, Copy, Debug, Default)]
pub struct RunGrowth {
    /// Σ context at sub-step 0.
    pub context: u64,
    /// Σ windowed context at sub-step 0.
    pub window: u64,
    /// Sequences (each adds a token per sub-step).
    pub decodes: u64,
    /// Sequences below the window (each adds a token to the windowed sum).
    pub below: u64,
}

impl RunGrowth {
    /// Σ context and Σ windowed context at sub-step `j`.
    pub fn at(&self, j: u64) -> (u64, u64) {
        (self.context + j * self.decodes, self.window + j * self.below)
    }
}

/// Sub-steps `first .. first + ramp.len` of a decode run: their durations
/// are `ramp`'s ([`DecodeSteps::pieces`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The first sub-step.
    pub first: u64,
    /// Their durations.
    pub ramp: Ramp,
    /// Their total duration.
    pub total: SimDuration,
}

impl Piece {
    /// Sub-steps from `first` on, of durations `ramp`.
    pub fn new(first: u64, ramp: Ramp) -> Piece {
        Piece { first, ramp, total: ramp.sum(0, ramp.len) }
    }

    /// One past the last sub-step.
    pub fn end(&self) -> u64 {
        self.first + self.ramp.len
    }
}

/// The first `j` in `a + 1 ..= b` where `beyond` holds, given that it holds
/// at `b` and, once it holds, holds from there on.
fn first_beyond(a: u64, b: u64, beyond: impl Fn(u64) -> bool) -> u64 {
    let (mut lo, mut hi) = (a + 1, b);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if beyond(mid) { hi = mid } else { lo = mid + 1 }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_steps_take_the_fixed_time_whatever_the_work() {
        let m = StepModel::Synthetic(SimDuration(5));
        let chunks = [PrefillChunk { cached: 0, end: 1000 }];
        let work = StepWork {
            prefill: &chunks,
            decodes: 9,
            drafts: 0,
            decode_context_tokens: 99,
            decode_window_tokens: 99,
            samples: 10,
        };
        assert_eq!(m.step_time(&work), SimDuration(5));
    }

    #[test]
    fn a_decode_runs_prices_are_step_times_bit_for_bit() {
        // The operator model with full attention (Granite 3.3 8B on H100),
        // with sliding-window layers (Gemma 2 9B), and the roofline.
        let specs =
            ["", "[model.model_params]\nname = \"gemma-2-9b\"", "[worker.inference_params]\nmodel = \"roofline\""];
        let mut next = crate::rng::lcg_below(0x9e37_79b9_7f4a_7c15_u64);
        for text in specs {
            let stage = "[[workload.stages]]\ntype = \"ExponentialReqRate\"\n[workload.stages.workload_params]\nprompt_size_max = 4096\noutput_tokens_max = 256";
            let text = format!("{text}\n{stage}");
            let file = crate::config::parse_spec(&text, "t.toml").unwrap();
            let model = crate::config::resolve(&file, "t.toml", std::path::Path::new(".")).unwrap().worker.perf;
            for decodes in [1, 2, 7, 64, 255, 1000] {
                let run = model.decode_run(decodes);
                for _ in 0..200 {
                    let context = decodes * (1 + next(200_000));
                    let window = context.min(decodes * (1 + next(5_000)));
                    let work = StepWork::decode(decodes, context, window);
                    assert_eq!(
                        run.step_time(context, window),
                        model.step_time(&work),
                        "{text:?}: {decodes} × {context}"
                    );
                }
            }
        }
    }
}
