//! The save rules: what a worker's finished step and a finished request
//! write to the tiers, from which token on, and whether what follows waits
//! for the writes — the decisions vLLM's scheduler leaves to its KV
//! connector (`build_connector_meta`, `request_finished` in
//! `vllm/distributed/kv_transfer/kv_connector/v1/base.py`) and LMCache
//! takes (`lmcache/integration/vllm/vllm_v1_adapter.py`). The rules decide;
//! the [`KvConnector`] carries the writes out; the caller is told what
//! follows ([`AfterSave`]) and how many tokens went to the tiers (for the
//! step's row).
//!
//! - **On compute** (`kvc.save_timing = "on_compute"`, LMCache's rule): at
//!   the end of each step, the prompt chunks the step completed — full
//!   chunks while the prompt is prefilled, and its last, partial one when
//!   it is done — as one write per tier ([`KvConnector::begin_batch`]),
//!   as LMCache saves each layer's KV during the forward pass and waits for
//!   it once per step (`save_kv_layer`, `wait_for_save`).
//! - **At the finish**: the request's prompt (and, with `save_decode_cache`,
//!   its output's KV) beyond what was saved — with `"on_finish"`, the
//!   original Opal's rule, everything from the first chunk (its
//!   `OpalKVCacheEngine.store` offers every chunk, those held skipped).
//!   A P/D prefill job's prompt goes to the tiers as any finished
//!   request's would (LMCache on the prefill worker).
//! - **Where a save starts**: on compute, LMCache's `num_saved_tokens` —
//!   what its lookup found the tiers holding when the request was
//!   scheduled, or what its earlier saves stored (`vllm_v1_adapter.py`).
//! - **Waiting**: in `sync` write mode (or while a P/D hand-over through the
//!   store holds the request's writes) a finished request's next move
//!   waits for its writes still in flight ([`KvConnector::finish_saves`]).
//!
//! (With `store_on_gpu_eviction`, the chunks whose last blocks the GPU
//! evicts go to the first tier: [`KvConnector::save_evicted`].)

use super::{ConnectorOutput, KvConnector, KvcConfig, SaveTiming};
use crate::ids::{RequestId, WorkerId};
use crate::request::{PdPhase, Request};
use crate::time::SimTime;

/// What follows a request's last token, as far as its writes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterSave {
    /// Go on now (respond, or hand over).
    Proceed,
    /// Wait for its writes: its id comes out in [`ConnectorOutput::saved`]
    /// when the last completes.
    AwaitWrites,
}

/// The save rules of a run (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct SaveRules {
    timing: SaveTiming,
    save_decode_cache: bool,
    chunk_tokens: u64,
    block_size: u64,
}

impl SaveRules {
    /// The rules of `kvc`, with engine blocks of `block_size` tokens.
    pub fn new(kvc: &KvcConfig, block_size: u64) -> SaveRules {
        SaveRules {
            timing: kvc.save_timing,
            save_decode_cache: kvc.save_decode_cache,
            chunk_tokens: kvc.chunk_blocks * block_size,
            block_size,
        }
    }

    /// Where request `r`'s next save starts (the connector skips the chunks below it).
    fn from(&self, r: &Request) -> u64 {
        match self.timing {
            SaveTiming::OnCompute => r.seq.saved.max(r.seq.tier_prefix),
            SaveTiming::OnFinish => 0,
        }
    }

    /// A step of worker `w` ended at `now`, in which the requests of
    /// `prefilled` computed prefill chunks (with the tokens each then has
    /// computed, in step order): on compute, the prompt chunks completed
    /// since each one's last save go to the tiers, as one write per tier.
    /// Returns the tokens offered.
    pub fn after_step(
        &self,
        now: SimTime,
        w: WorkerId,
        prefilled: &[(RequestId, u64)],
        reqs: &mut [Request],
        conn: &mut KvConnector,
        out: &mut ConnectorOutput,
    ) -> u64 {
        if self.timing != SaveTiming::OnCompute {
            return 0;
        }
        let mut offered = 0;
        conn.begin_batch();
        for &(id, computed) in prefilled {
            let r = &mut reqs[id.index()];
            let prompt = u64::from(r.prompt_tokens);
            let upto = if computed >= prompt { prompt } else { computed / self.chunk_tokens * self.chunk_tokens };
            if upto > r.seq.saved {
                offered += upto - r.seq.saved;
                let from = self.from(r);
                r.seq.saved = upto;
                conn.save(now, w, id, &r.chunked(upto, self.block_size), from, out);
            }
        }
        conn.end_batch(now, w, out);
        offered
    }

    /// Request `id` produced its last token on worker `w` at `now`: what it
    /// still has to save goes to the tiers. Returns the tokens offered and
    /// whether what follows waits for its writes.
    pub fn finished(
        &self,
        now: SimTime,
        w: WorkerId,
        id: RequestId,
        reqs: &[Request],
        conn: &mut KvConnector,
        out: &mut ConnectorOutput,
    ) -> (u64, AfterSave) {
        let r = &reqs[id.index()];
        let prefill_job = matches!(r.pd, PdPhase::Prefill { .. });
        let tokens = if self.save_decode_cache && !prefill_job { r.seq.computed } else { u64::from(r.prompt_tokens) };
        // Saved as computed already (on compute): LMCache stores nothing more at the finish.
        let mut offered = 0;
        if prefill_job || tokens > r.seq.saved || self.timing == SaveTiming::OnFinish {
            conn.save(now, w, id, &r.chunked(tokens, self.block_size), self.from(r), out);
            offered = tokens.saturating_sub(r.seq.saved);
        }
        let after = if conn.finish_saves(id) { AfterSave::AwaitWrites } else { AfterSave::Proceed };
        (offered, after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::StageId;
    use crate::kvcache::connector::testing;
    use crate::kvcache::{Content, WriteMode, content_id};
    use crate::workload::{Label, NewRequest};

    const W: WorkerId = WorkerId(0);

    /// A request of `prompt` tokens of content `key` (and `output` out), hashed in blocks of 16.
    fn request(id: u32, key: u64, prompt: u32, output: u32) -> Request {
        let mut content = Content::default();
        content.push(content_id("test", key), prompt);
        let new = NewRequest {
            stage: StageId(0),
            prompt_tokens: prompt,
            output_tokens: output,
            content,
            output_id: content_id("output", u64::from(id)),
            label: Label::None,
        };
        let mut r = Request::new(RequestId(id), id, SimTime::ZERO, new);
        r.find_chains(16, true);
        r
    }

    /// One worker's CPU tier (10⁶ B/s, 160 B per block, chunks of 2 blocks = 32 tokens), with `kvc` changed by `f`.
    fn setup(f: impl Fn(&mut KvcConfig)) -> (SaveRules, KvConnector) {
        let mut kvc = testing::kvc(vec![testing::cpu_tier(1 << 20)], 2);
        f(&mut kvc);
        let mut conn = KvConnector::new(&kvc, 16);
        conn.add_worker();
        (SaveRules::new(&kvc, 16), conn)
    }

    /// Runs the device timers out; returns the time of the last.
    fn settle(c: &mut KvConnector, mut now: SimTime, out: &mut ConnectorOutput) -> SimTime {
        while let Some(i) = (0..out.timers.len()).min_by_key(|&i| out.timers[i].0) {
            let (t, inst, timer) = out.timers.remove(i);
            now = t;
            c.on_timer(t, inst, timer, out);
        }
        now
    }

    fn written(c: &KvConnector, t: SimTime) -> (u64, u64) {
        let s = c.report(t).next().unwrap().stats;
        (s.ops, s.bytes_written)
    }

    #[test]
    fn on_compute_a_step_saves_the_chunks_it_completed_and_the_finish_saves_nothing_more() {
        let (rules, mut conn) = setup(|_| {});
        let mut reqs = vec![request(0, 1, 100, 3), request(1, 2, 40, 3)];
        let mut out = ConnectorOutput::default();
        // A step computes 70 tokens of request 0 and all 40 of request 1:
        // request 0 completed chunks [0, 32), [32, 64) (64 tokens), request 1
        // its whole prompt (chunk [0, 32) and the partial [32, 40)): 104
        // tokens × 10 B in one write, 1.04 ms at 10⁶ B/s.
        let offered = rules.after_step(
            SimTime::ZERO,
            W,
            &[(RequestId(0), 70), (RequestId(1), 40)],
            &mut reqs,
            &mut conn,
            &mut out,
        );
        assert_eq!(offered, 64 + 40);
        assert_eq!((reqs[0].seq.saved, reqs[1].seq.saved), (64, 40));
        let t = settle(&mut conn, SimTime::ZERO, &mut out);
        assert_eq!((t, written(&conn, t)), (SimTime(1_040_000), (1, 1040)));
        // The next step completes request 0's prompt: chunk [64, 96) and the
        // partial [96, 100), 36 tokens from 64 on.
        assert_eq!(rules.after_step(t, W, &[(RequestId(0), 100)], &mut reqs, &mut conn, &mut out), 36);
        let t = settle(&mut conn, t, &mut out);
        assert_eq!(written(&conn, t), (2, 1040 + 360));
        // A step of no new chunk (70 → 80 within chunk [64, 96)) saves nothing.
        let mut r2 = vec![request(0, 3, 100, 3)];
        r2[0].seq.saved = 64;
        assert_eq!(rules.after_step(t, W, &[(RequestId(0), 80)], &mut r2, &mut conn, &mut out), 0);
        // At the finish (asynchronous writes) nothing is left to save: go on.
        reqs[0].seq.computed = 102;
        assert_eq!(rules.finished(t, W, RequestId(0), &reqs, &mut conn, &mut out), (0, AfterSave::Proceed));
        assert!(out.timers.is_empty());
    }

    #[test]
    fn synchronous_writes_hold_the_finish_until_the_last_completes() {
        let (rules, mut conn) = setup(|k| {
            k.write_mode = WriteMode::Sync;
            k.save_timing = SaveTiming::OnFinish;
        });
        let reqs = vec![request(0, 1, 64, 2)];
        let mut out = ConnectorOutput::default();
        // On finish: the whole 64-token prompt (640 B, 0.64 ms), and the response waits for it.
        assert_eq!(
            rules.finished(SimTime::ZERO, W, RequestId(0), &reqs, &mut conn, &mut out),
            (64, AfterSave::AwaitWrites)
        );
        assert!(out.saved.is_empty());
        let t = settle(&mut conn, SimTime::ZERO, &mut out);
        assert_eq!((t, out.saved.as_slice()), (SimTime(640_000), &[RequestId(0)][..]));
        // The same prompt again: every chunk is held, nothing is written, nothing waited for.
        let again = vec![request(0, 1, 64, 2)];
        out.clear();
        assert_eq!(rules.finished(t, W, RequestId(0), &again, &mut conn, &mut out), (64, AfterSave::Proceed));
        assert_eq!(written(&conn, t), (1, 640));
    }

    #[test]
    fn the_decode_cache_is_saved_only_when_asked_and_never_for_a_prefill_job() {
        let (rules, mut conn) = setup(|k| {
            k.save_decode_cache = true;
            k.save_timing = SaveTiming::OnFinish;
        });
        // 40 prompt tokens and 30 generated: computed 69 (the last token's KV is not).
        let mut reqs = vec![request(0, 1, 40, 30)];
        reqs[0].seq.computed = 69;
        let mut out = ConnectorOutput::default();
        assert_eq!(rules.finished(SimTime::ZERO, W, RequestId(0), &reqs, &mut conn, &mut out).0, 69);
        // Chunks [0, 32), [32, 64) and the partial [64, 69), keyed by its exact run: 690 B.
        let t = settle(&mut conn, SimTime::ZERO, &mut out);
        assert_eq!(written(&conn, t).1, 690);
        // A prefill job saves its prompt only.
        let mut job = vec![request(0, 2, 40, 1)];
        job[0].pd = PdPhase::Prefill { decode: WorkerId(1), output_tokens: 30, pending: 40 };
        job[0].seq.computed = 40;
        assert_eq!(rules.finished(t, W, RequestId(0), &job, &mut conn, &mut out).0, 40);
        let t = settle(&mut conn, t, &mut out);
        assert_eq!(written(&conn, t).1, 690 + 400);
    }
}
