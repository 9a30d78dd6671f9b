//! Pipeline parallelism: a worker of `pp` stages, each a tensor-parallel
//! group of GPUs holding a contiguous run of the model's layers and their
//! KV cache, with up to `pp` micro-batches in flight.
//!
//! What vLLM does (v1 at `9aaf83ef5`; the notes in
//! `../shared/notes/vllm-pipeline-parallel.md`):
//! - **Layers** — `get_pp_indices` (`vllm/distributed/utils.py`): each
//!   stage gets `⌊L / pp⌋` decoder layers and the `L mod pp` left over go
//!   one each to the stages `pp − 2, pp − 3, …` (never the last). Stage 0
//!   holds the token embedding, the last the final norm and the LM head (a
//!   copy of the embedding when they are tied: `LlamaModel.__init__`).
//! - **KV** — every rank sizes its blocks from its own layers and the engine
//!   takes the minimum over ranks (`get_kv_cache_configs`,
//!   `vllm/v1/core/kv_cache_utils.py`): one block pool, one scheduler.
//! - **Batches in flight** — the engine keeps a queue of `pp` scheduled
//!   batches (`EngineCore.step_with_batch_queue`, `max_concurrent_batches =
//!   pp`); a request in flight is not scheduled again until its token is
//!   back, so the running requests cycle through the pipeline in up to `pp`
//!   disjoint micro-batches. `max_num_batched_tokens` applies to each
//!   `schedule()` call (a micro-batch), `max_num_seqs` to the engine.
//! - **Between stages** — `IntermediateTensors` (hidden states and the
//!   residual, `2 × hidden × dtype` bytes a token); each TP rank sends its
//!   `1 / tp` slice to its peer and the receiving stage all-gathers it over
//!   its TP link (`GroupCoordinator.isend_tensor_dict`, `parallel_state.py`).
//!
//! The model: the worker's step is one **round** of the pipeline, in which
//! every running request advances once. The round's work is split into
//! micro-batches ([`Pipeline::split`]): the decoding sequences evenly over
//! `min(pp, decodes)` of them (as vLLM v0 kept its virtual engines, each new
//! request going to the one with the fewest, and as v1's queue settles
//! under a stream of arrivals), then the prefill chunks filling each in turn
//! up to the token budget (v1 schedules a prompt's next chunk into the next
//! micro-batch). Micro-batch `m` takes `t_m` on the whole model (the step
//! model's price), `t_m × layers_s / L` on stage `s`, and `h_m` per hop
//! (link latency + its slice over the inter-stage link + the all-gather).
//! In the steady state of the cycle (a marked graph: each micro-batch
//! loops through the stages and back to the scheduler, each stage serves
//! the micro-batches in turn) a round lasts
//!
//! `max( max_m (t_m + (pp − 1) h_m + latency),  share_max × Σ_m t_m )`:
//!
//! the longest micro-batch's trip through every stage and back, or the
//! busiest stage's work (`share_max` the largest stage's fraction of the
//! layers), whichever is longer. Every request in the round sees at least
//! the full pipeline latency; the pipeline's bubble is the first term's
//! excess over `Σ_m t_m / pp`. Transfers add latency, not stage time
//! (vLLM's sends are non-blocking). The LM head and step overheads are
//! spread with the layers.

use super::perf::{PrefillChunk, Roofline, StepModel, StepWork};
use crate::metrics::PeakSeconds;
use crate::time::SimDuration;

/// How a worker's model is split into pipeline stages, and what a hop costs.
#[derive(Clone, Debug, PartialEq)]
pub struct Pipeline {
    /// Decoder layers on each stage ([`crate::worker::model::partition`]).
    pub layers: Vec<u64>,
    /// Token budget of one micro-batch (`max_num_batched_tokens`).
    pub micro_budget: u64,
    /// Whether a prompt may be split over micro-batches (chunked prefill).
    pub chunked_prefill: bool,
    /// Bytes a token sends between stages over all TP ranks: hidden states
    /// and residual, `2 × hidden × dtype`.
    pub bytes_per_token: f64,
    /// Tensor-parallel GPUs per stage.
    pub tp: u32,
    /// Inter-stage link per GPU and direction, bytes/s.
    pub link_bytes_per_s: f64,
    /// Tensor-parallel link per GPU and direction, bytes/s (the all-gather).
    pub tp_link_bytes_per_s: f64,
    /// Latency of one hop, seconds (also the sampled tokens' way back to stage 0).
    pub hop_latency_s: f64,
}

/// One micro-batch of a round.
#[derive(Debug, Default)]
struct MicroBatch {
    decodes: u64,
    context: u64,
    window: u64,
    samples: u64,
    prefill: Vec<PrefillChunk>,
    tokens: u64,
}

impl Pipeline {
    /// Stages.
    pub fn stages(&self) -> usize {
        self.layers.len()
    }

    /// The largest stage's share of the layers.
    pub fn heaviest_share(&self) -> f64 {
        let total: u64 = self.layers.iter().sum();
        *self.layers.iter().max().unwrap_or(&0) as f64 / total.max(1) as f64
    }

    /// Seconds of one hop of a micro-batch of `tokens` tokens: the latency,
    /// each rank's `1 / tp` slice over the inter-stage link, and the
    /// receiving stage's all-gather (`(tp − 1) / tp` of the tensors over
    /// each GPU's TP link).
    pub fn hop_secs(&self, tokens: u64) -> f64 {
        let bytes = tokens as f64 * self.bytes_per_token;
        let tp = f64::from(self.tp.max(1));
        let gather = if self.tp > 1 { bytes * (tp - 1.0) / tp / self.tp_link_bytes_per_s } else { 0.0 };
        self.hop_latency_s + bytes / tp / self.link_bytes_per_s + gather
    }

    /// Splits a round's work into micro-batches (see the module docs); `finishing[i]`
    /// says whether chunk `i` completes its sequence's context (and samples).
    fn split(&self, work: &StepWork<'_>, finishing: impl Fn(usize) -> bool) -> Vec<MicroBatch> {
        let pp = self.stages() as u64;
        let mut mbs: Vec<MicroBatch> = (0..pp).map(|_| MicroBatch::default()).collect();
        // Decoders evenly over min(pp, decodes) micro-batches; context in proportion.
        let k = work.decodes.min(pp);
        let (mut context, mut window) = (work.decode_context_tokens, work.decode_window_tokens);
        for (m, mb) in mbs.iter_mut().enumerate().take(k as usize) {
            let n = work.decodes / k + u64::from((m as u64) < work.decodes % k);
            let last = m as u64 == k - 1;
            let share = |total: u64| (u128::from(total) * u128::from(n) / u128::from(work.decodes)) as u64;
            let (c, w) = if last {
                (context, window)
            } else {
                (share(work.decode_context_tokens), share(work.decode_window_tokens))
            };
            context -= c;
            window -= w;
            *mb = MicroBatch { decodes: n, context: c, window: w, samples: n, prefill: Vec::new(), tokens: n };
        }
        // Prefill chunks fill the micro-batches in turn up to the budget.
        let mut m = 0;
        for (i, c) in work.prefill.iter().enumerate() {
            let mut start = c.cached;
            while start < c.end {
                let room = self.micro_budget.saturating_sub(mbs[m].tokens);
                let left = c.end - start;
                let take = if !self.chunked_prefill {
                    // A whole prompt in one micro-batch: the first with room, else the least full.
                    if room < left {
                        if let Some(j) =
                            (m..mbs.len()).find(|&j| self.micro_budget.saturating_sub(mbs[j].tokens) >= left)
                        {
                            m = j;
                        } else {
                            m = (0..mbs.len()).min_by_key(|&j| mbs[j].tokens).expect("pp ≥ 1");
                        }
                    }
                    left
                } else if room == 0 && m + 1 < mbs.len() {
                    m += 1;
                    continue;
                } else if m + 1 == mbs.len() {
                    left // the plan kept the round within pp × budget; whatever is left goes last
                } else {
                    left.min(room)
                };
                let mb = &mut mbs[m];
                mb.prefill.push(PrefillChunk { cached: start, end: start + take });
                mb.tokens += take;
                start += take;
                if start == c.end && finishing(i) {
                    mb.samples += 1;
                }
            }
        }
        mbs.retain(|mb| mb.tokens > 0);
        mbs
    }

    /// The round's duration and what it asks of each GPU, for `work` priced
    /// by `perf` on the whole model (see the module docs). `finishing[i]`:
    /// whether prefill chunk `i` ends its sequence's context.
    pub fn price(
        &self,
        perf: &StepModel,
        usage: &Roofline,
        work: &StepWork<'_>,
        finishing: impl Fn(usize) -> bool,
    ) -> (SimDuration, PeakSeconds) {
        let mbs = self.split(work, finishing);
        let hops = (self.stages() - 1) as f64;
        let (mut trip, mut total) = (0.0f64, 0.0);
        let mut peak = PeakSeconds::default();
        for mb in &mbs {
            let w = StepWork {
                prefill: &mb.prefill,
                decodes: mb.decodes,
                drafts: 0,
                decode_context_tokens: mb.context,
                decode_window_tokens: mb.window,
                samples: mb.samples,
            };
            let t = perf.step_time(&w).as_secs_f64();
            total += t;
            trip = trip.max(t + hops * self.hop_secs(mb.tokens) + self.hop_latency_s);
            peak += usage.peak_seconds(&w);
        }
        // Each GPU holds 1 / pp of the layers: it does that share of the work.
        let pp = self.stages() as f64;
        let per_gpu = PeakSeconds { compute: peak.compute / pp, memory: peak.memory / pp };
        let round = trip.max(self.heaviest_share() * total);
        (SimDuration::from_secs_f64(round).max(SimDuration(1)), per_gpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::model::partition;

    fn pipe(layers: &[u64]) -> Pipeline {
        Pipeline {
            layers: layers.to_vec(),
            micro_budget: 100,
            chunked_prefill: true,
            bytes_per_token: 2.0 * 4096.0 * 2.0,
            tp: 2,
            link_bytes_per_s: 50e9,
            tp_link_bytes_per_s: 300e9,
            hop_latency_s: 10e-6,
        }
    }

    #[test]
    fn decoders_spread_evenly_and_chunks_fill_each_micro_batch_up_to_the_budget() {
        let p = pipe(&[16, 16, 16]);
        let chunks = [PrefillChunk { cached: 0, end: 150 }, PrefillChunk { cached: 40, end: 60 }];
        let work = StepWork {
            prefill: &chunks,
            decodes: 7,
            drafts: 0,
            decode_context_tokens: 700,
            decode_window_tokens: 700,
            samples: 8,
        };
        let mbs = p.split(&work, |i| i == 1);
        // 7 decoders over 3: 3, 2, 2 (contexts 300, 200, 200); then the
        // 150-token chunk fills the first to 100 (97) and the second to 53;
        // the 20-token chunk goes on in the second (73), and samples there.
        type Shape = (u64, u64, u64, Vec<(u64, u64)>);
        let shape: Vec<Shape> = mbs
            .iter()
            .map(|m| (m.decodes, m.context, m.samples, m.prefill.iter().map(|c| (c.cached, c.end)).collect()))
            .collect();
        assert_eq!(shape, [(3, 300, 3, vec![(0, 97)]), (2, 200, 3, vec![(97, 150), (40, 60)]), (2, 200, 2, vec![]),]);
        assert_eq!(mbs.iter().map(|m| m.tokens).collect::<Vec<_>>(), [100, 75, 2]);
    }

    #[test]
    fn a_hop_is_its_latency_the_slice_over_the_link_and_the_all_gather() {
        let p = pipe(&[16, 16]);
        // 1,000 tokens × 16,384 B = 16.384 MB; each of 2 ranks sends 8.192 MB
        // at 50 GB/s (163.84 µs), the receiver all-gathers half of 16.384 MB
        // at 300 GB/s (27.307 µs), plus 10 µs.
        let want = 10e-6 + 8.192e6 / 50e9 + 8.192e6 / 300e9;
        assert!((p.hop_secs(1000) - want).abs() < 1e-12, "{} vs {want}", p.hop_secs(1000));
    }

    #[test]
    fn a_round_is_the_longest_trip_or_the_busiest_stage_and_never_more_than_pp_batches_are_in_flight() {
        // A synthetic step: every micro-batch takes 10 ms on the whole model, whatever it holds.
        let perf = StepModel::Synthetic(SimDuration::from_secs_f64(0.010));
        let usage = Roofline::new(
            &crate::worker::model::ModelArch::preset("llama-3.1-8b").expect("preset"),
            &crate::worker::presets::GpuSpec::preset("H100").expect("preset"),
            1,
            crate::worker::perf::Coefficients::OPAL,
        );
        let decode = |n| StepWork::decode(n, 100 * n, 100 * n);
        // Two balanced stages. One sequence: one micro-batch, its trip
        // 10 ms + one hop of 1 token + the way back.
        let p = pipe(&[16, 16]);
        let trip = |tokens| 10e-3 + p.hop_secs(tokens) + 10e-6;
        let (t, _) = p.price(&perf, &usage, &decode(1), |_| false);
        assert_eq!(t, SimDuration::from_secs_f64(trip(1)));
        // Five: two micro-batches (3 and 2), in flight together: the trip
        // of the larger one (the busiest stage's 2 × 5 ms = 10 ms is less).
        let (t, _) = p.price(&perf, &usage, &decode(5), |_| false);
        assert_eq!(t, SimDuration::from_secs_f64(trip(3)));
        // Had all five been in flight at once, the busiest stage would hold
        // them 5 × 5 ms = 25 ms. Unbalanced stages (2 layers and 1, as
        // `partition(3, 2)`): the first stage's 2/3 × 20 ms = 13.3 ms sets the pace.
        let p = pipe(&partition(3, 2));
        let (t, _) = p.price(&perf, &usage, &decode(5), |_| false);
        assert_eq!(t, SimDuration::from_secs_f64(2.0 / 3.0 * 20e-3));
    }
}
