//! Speculative decoding, as vLLM v1 runs it (`vllm/v1/spec_decode/`,
//! `vllm/v1/sample/rejection_sampler.py`, `vllm/v1/core/sched/scheduler.py`).
//!
//! Every decode step a drafter proposes `k` tokens per decoding sequence;
//! the target model's forward verifies them beside the sequence's own token
//! (`1 + k` scheduled tokens, which count against the token budget), and
//! the rejection sampler keeps the drafts up to the first rejection plus
//! one token of its own (the correction, or the bonus token when all `k`
//! were accepted): a sequence emits `1 + accepted` tokens, at most what it
//! has left. The scheduler allocates KV slots for the `1 + k` tokens and,
//! for a drafter with its own KV (EAGLE, MTP, a draft model), `k`
//! lookahead slots more (`num_lookahead_tokens`); the rejected tokens' slots
//! are rolled back (`num_computed_tokens -= num_rejected`).
//!
//! Acceptance is an input, as vLLM's `spec_decode` metrics report it:
//! `at_least[j]`, the share of drafts whose first `j + 1` tokens were all
//! accepted (`num_accepted_tokens_per_pos[j] / num_drafts`), or one rate α
//! per position given the ones before (`at_least[j] = α^(j+1)`). A step's
//! acceptance for a sequence is drawn from a counter-based stream keyed by
//! the run seed, the request and its position in its output
//! ([`acceptance_draw`]), so every grid point of a replicate sees the same
//! acceptances (common random numbers), whatever its timing.

use super::perf::{Roofline, StepModel, StepWork};
use crate::metrics::PeakSeconds;
use crate::time::SimDuration;

/// How drafts are proposed (vLLM's `speculative_config.method`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Prompt lookup (`ngram`): drafts come from the context, at no GPU cost.
    Ngram,
    /// An EAGLE head: one decoder layer over the target's hidden states.
    Eagle,
    /// The model's multi-token-prediction layer (DeepSeek-V3's `mtp`).
    Mtp,
    /// A smaller model of the same vocabulary.
    DraftModel,
}

impl Method {
    /// The method named as vLLM names it.
    pub fn parse(name: &str) -> Option<Method> {
        match name.to_ascii_lowercase().as_str() {
            "ngram" => Some(Method::Ngram),
            "eagle" | "eagle3" => Some(Method::Eagle),
            "mtp" | "deepseek_mtp" => Some(Method::Mtp),
            "draft_model" => Some(Method::DraftModel),
            _ => None,
        }
    }

    /// Extra KV slots the scheduler reserves per sequence and step for the
    /// drafter's own forward passes: vLLM sets `num_lookahead_tokens = k`
    /// when `use_eagle()` (EAGLE, MTP) or `uses_draft_model()`, 0 for ngram.
    pub fn lookahead(self, k: u64) -> u64 {
        match self {
            Method::Ngram => 0,
            _ => k,
        }
    }
}

/// The drafter's forward, priced like the target's: one decode step of its
/// own architecture per proposed token.
#[derive(Clone, Debug, PartialEq)]
pub struct Drafter {
    /// Its step time (the target's kind of model, without per-step CPU overheads).
    pub perf: StepModel,
    /// What its steps ask of the GPU.
    pub usage: Roofline,
}

/// Resolved `[worker.speculative]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Speculative {
    /// How drafts are proposed.
    pub method: Method,
    /// Drafts per sequence and step.
    pub k: u64,
    /// `at_least[j]`: the chance the first `j + 1` drafts are all accepted (non-increasing, `k` values).
    pub at_least: Vec<f64>,
    /// The drafter's cost (`None`: free, as ngram's).
    pub drafter: Option<Drafter>,
}

impl Speculative {
    /// Drafts accepted when the step's draw is `u` ∈ [0, 1): the longest
    /// run of leading positions `j` with `u < at_least[j]`, so that
    /// P(accepted ≥ j + 1) = `at_least[j]`.
    pub fn accepted(&self, u: f64) -> u64 {
        self.at_least.iter().take_while(|&&p| u < p).count() as u64
    }

    /// Expected tokens a verify emits per sequence (vLLM's mean acceptance
    /// length): `1 + Σ at_least`; with one rate α, `(1 − α^(k+1)) / (1 − α)`.
    pub fn mean_emitted(&self) -> f64 {
        1.0 + self.at_least.iter().sum::<f64>()
    }

    /// KV positions a decoding sequence reserves in a step: its token, the
    /// drafts and the drafter's lookahead slots.
    pub fn reach(&self) -> u64 {
        1 + self.k + self.method.lookahead(self.k)
    }

    /// The drafter's time and GPU use in a step of `work`, as vLLM's
    /// proposer runs it (`SpecDecodeBaseProposer.propose`,
    /// `vllm/v1/spec_decode/`): one forward over the tokens the target just
    /// ran (its KV for them; the first draft of each sequence that samples),
    /// then `k − 1` forwards of one token per such sequence.
    pub fn draft(&self, work: &StepWork<'_>) -> (SimDuration, PeakSeconds) {
        let Some(d) = &self.drafter else { return (SimDuration::ZERO, PeakSeconds::default()) };
        let seqs = work.samples - work.drafts;
        let first = StepWork { samples: seqs, ..*work };
        let (mut t, mut peak) = (d.perf.step_time(&first), d.usage.peak_seconds(&first));
        if seqs > 0 && self.k > 1 {
            let next = StepWork::decode(seqs, work.decode_context_tokens, work.decode_window_tokens);
            let (tn, pn) = (d.perf.step_time(&next), d.usage.peak_seconds(&next));
            let n = self.k - 1;
            t += SimDuration(tn.0 * n);
            peak += PeakSeconds { compute: pn.compute * n as f64, memory: pn.memory * n as f64 };
        }
        (t, peak)
    }
}

/// A uniform draw in [0, 1) for the verify of request `serial` after it has
/// generated `generated` tokens, in the run seeded `seed`: SplitMix64's
/// finaliser (Steele, Lea and Flood 2014) over the three, so a draw depends
/// on nothing but what names it (a counter-based stream).
pub fn acceptance_draw(seed: u64, serial: u32, generated: u64) -> f64 {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;
    let key = crate::rng::stream_id("speculative");
    let z = mix(mix(mix(seed ^ key).wrapping_add(u64::from(serial).wrapping_mul(GOLDEN))).wrapping_add(generated));
    (z >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(at_least: Vec<f64>) -> Speculative {
        Speculative { method: Method::Ngram, k: at_least.len() as u64, at_least, drafter: None }
    }

    #[test]
    fn accepted_drafts_stop_at_the_first_position_the_draw_misses() {
        let s = spec(vec![0.8, 0.5, 0.2]);
        // u < 0.2: all three; 0.2 ≤ u < 0.5: two; 0.5 ≤ u < 0.8: one; else none.
        for (u, want) in [(0.0, 3), (0.19, 3), (0.2, 2), (0.49, 2), (0.5, 1), (0.79, 1), (0.8, 0), (0.999, 0)] {
            assert_eq!(s.accepted(u), want, "u = {u}");
        }
        assert!((s.mean_emitted() - 2.5).abs() < 1e-15);
        assert_eq!(s.reach(), 4);
        assert_eq!(Speculative { method: Method::Eagle, ..s }.reach(), 7);
    }

    #[test]
    fn draws_are_uniform_and_named_by_request_and_position_alone() {
        assert_eq!(acceptance_draw(7, 3, 10), acceptance_draw(7, 3, 10));
        assert_ne!(acceptance_draw(7, 3, 10), acceptance_draw(7, 3, 11));
        assert_ne!(acceptance_draw(7, 3, 10), acceptance_draw(7, 4, 10));
        assert_ne!(acceptance_draw(7, 3, 10), acceptance_draw(8, 3, 10));
        // 100,000 draws: mean 1/2 and a tenth in each decile, within 5 σ.
        let n = 100_000;
        let mut deciles = [0u32; 10];
        let mut sum = 0.0;
        for i in 0..n {
            let u = acceptance_draw(1, i % 1000, u64::from(i / 1000));
            assert!((0.0..1.0).contains(&u));
            sum += u;
            deciles[(u * 10.0) as usize] += 1;
        }
        let mean_sigma = (1.0 / 12.0 / f64::from(n)).sqrt();
        assert!((sum / f64::from(n) - 0.5).abs() < 5.0 * mean_sigma);
        let sigma = (f64::from(n) * 0.1 * 0.9).sqrt();
        for d in deciles {
            assert!((f64::from(d) - f64::from(n) / 10.0).abs() < 5.0 * sigma, "{deciles:?}");
        }
    }
}
