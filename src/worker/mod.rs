//! A vLLM v1-style worker: continuous batching with a token budget,
//! chunked prefill, a paged KV block pool and preemption by recompute.
//!
//! Each scheduler step is **one event**. Planning a step (vLLM's
//! `schedule()`): all decoding sequences get one token each; then running
//! requests still prefilling get a chunk, in admission order, while the token
//! budget lasts; then requests from the waiting (ready) queue are admitted in
//! FIFO order while sequences, budget and blocks last (a request whose blocks
//! do not fit blocks the queue, as in vLLM). When blocks run out for a running
//! request, the running request with the least work done (fewest computed
//! tokens; ties: the latest admitted) among those not yet scheduled in this
//! step is preempted: its blocks are freed, it loses its computed tokens and
//! re-enters the front of the queue to recompute its prompt and the tokens it
//! has generated.
//!
//! Decoding sequences are not touched one by one per step: the
//! [`DecodeGroup`] advances them arithmetically from the worker's step counter,
//! so a decode step costs O(1) plus O(log n) per completion.
//!
//! Slots (Opal's I/O and GPU slots): a request needs an I/O slot to move from
//! the worker's intake queue to the ready queue (its KV fetch happens under
//! that slot). In `pipelined` mode it returns the slot when the fetch ends; in
//! `single_stage` mode it keeps it until it finishes, so at most
//! `min(io_slots, gpu_slots)` requests are in processing.

pub mod perf;
pub mod presets;

use crate::engine::Version;
use crate::ids::{RequestId, WorkerId};
use crate::request::Request;
use crate::time::{SimDuration, SimTime};
use perf::{PerfModel, PrefillChunk, StepWork};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// How I/O slots are held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotMode {
    /// Held only while the request's KV fetch runs.
    Pipelined,
    /// Held from the start of the fetch until the request finishes.
    SingleStage,
}

/// Resolved worker settings (identical for every worker of a run).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerConfig {
    /// Most sequences in the running batch (min of `max_num_seqs` and `gpu_slots`).
    pub max_running: u32,
    /// Token budget per step (with chunked prefill off: `max_model_len × max_num_seqs`, as Opal).
    pub token_budget: u64,
    /// Split prefills across steps.
    pub chunked_prefill: bool,
    /// Tokens per KV block.
    pub block_size: u64,
    /// KV blocks in the GPU pool.
    pub total_blocks: u64,
    /// I/O slots.
    pub io_slots: u32,
    /// How I/O slots are held.
    pub slot_mode: SlotMode,
    /// Longest sequence (prompt + output) a request may have.
    pub max_model_len: u64,
    /// Step-time model.
    pub perf: PerfModel,
}

impl WorkerConfig {
    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: u64) -> u64 {
        tokens.div_ceil(self.block_size)
    }
}

/// What a finished step produced (filled by [`Worker::finish_step`]).
#[derive(Debug, Default)]
pub struct StepOutcome {
    /// How long the step took.
    pub duration: SimDuration,
    /// Sequences that decoded one token in it (each contributes one inter-token gap of `duration`).
    pub decodes: u64,
    /// Requests whose first token came out of this step.
    pub first_tokens: Vec<RequestId>,
    /// Inter-token gaps of recomputed (previously preempted) requests that produced a token.
    pub resumed_gaps: Vec<SimDuration>,
    /// Requests that produced their last token.
    pub completed: Vec<RequestId>,
    /// Prompt tokens computed (prefill work, including recomputation).
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
}

impl StepOutcome {
    fn clear(&mut self) {
        self.duration = SimDuration::ZERO;
        self.decodes = 0;
        self.first_tokens.clear();
        self.resumed_gaps.clear();
        self.completed.clear();
        self.prompt_tokens = 0;
        self.generated_tokens = 0;
    }
}

/// A step that was planned and has not ended yet.
#[derive(Debug)]
struct Step {
    start: SimTime,
    end: SimTime,
    decodes: u64,
}

/// One vLLM-like engine instance.
#[derive(Debug)]
pub struct Worker {
    id: WorkerId,
    /// Arrived, waiting for an I/O slot.
    intake: VecDeque<RequestId>,
    /// KV ready, waiting for the scheduler (vLLM's waiting queue).
    ready: VecDeque<RequestId>,
    /// Running requests still prefilling, in admission order.
    prefilling: Vec<RequestId>,
    decode: DecodeGroup,
    io_in_use: u32,
    free_blocks: u64,
    step: Option<Step>,
    version: Version,
    step_index: u64,
    admit_counter: u64,
    chunks: Vec<(RequestId, PrefillChunk)>,
    perf_chunks: Vec<PrefillChunk>,
    busy: SimDuration,
    steps: u64,
    preemptions: u64,
}

impl Worker {
    /// An idle worker with an empty block pool.
    pub fn new(id: WorkerId, cfg: &WorkerConfig) -> Worker {
        Worker {
            id,
            intake: VecDeque::new(),
            ready: VecDeque::new(),
            prefilling: Vec::new(),
            decode: DecodeGroup::new(cfg.block_size),
            io_in_use: 0,
            free_blocks: cfg.total_blocks,
            step: None,
            version: Version::default(),
            step_index: 0,
            admit_counter: 0,
            chunks: Vec::new(),
            perf_chunks: Vec::new(),
            busy: SimDuration::ZERO,
            steps: 0,
            preemptions: 0,
        }
    }

    /// Its id.
    pub fn id(&self) -> WorkerId {
        self.id
    }

    /// Requests waiting (intake and ready queues), not yet running.
    pub fn waiting(&self) -> usize {
        self.intake.len() + self.ready.len()
    }

    /// Requests in the running batch.
    pub fn running(&self) -> usize {
        self.prefilling.len() + self.decode.len()
    }

    /// KV blocks in use.
    pub fn used_blocks(&self, cfg: &WorkerConfig) -> u64 {
        cfg.total_blocks - self.free_blocks
    }

    /// Start of the step in flight, if any.
    pub fn step_start(&self) -> Option<SimTime> {
        self.step.as_ref().map(|s| s.start)
    }

    /// Total time spent computing finished steps.
    pub fn busy_time(&self) -> SimDuration {
        self.busy
    }

    /// Steps run.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Preemptions so far.
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Accepts a routed request. Returns the end time and version stamp of a
    /// newly planned step if the worker was idle and can start one.
    pub fn enqueue(
        &mut self,
        now: SimTime,
        id: RequestId,
        reqs: &mut [Request],
        cfg: &WorkerConfig,
    ) -> Option<(SimTime, u32)> {
        self.intake.push_back(id);
        self.pump_io_slots(reqs, cfg);
        if self.step.is_none() { self.plan_step(now, reqs, cfg) } else { None }
    }

    /// Moves requests from intake to ready while I/O slots are free. (The KV
    /// fetch that happens under the slot is instantaneous until tiers exist.)
    fn pump_io_slots(&mut self, reqs: &mut [Request], cfg: &WorkerConfig) {
        while self.io_in_use < cfg.io_slots {
            let Some(id) = self.intake.pop_front() else { break };
            match cfg.slot_mode {
                SlotMode::Pipelined => {}
                SlotMode::SingleStage => {
                    self.io_in_use += 1;
                    reqs[id.index()].seq.holds_io_slot = true;
                }
            }
            self.ready.push_back(id);
        }
    }

    /// Ends the step stamped `version` at `now`, fills `out` with what it
    /// produced, and plans the next step. Returns `None` in `Ok` position
    /// when the event is stale; otherwise the next step's end and stamp, if any.
    pub fn finish_step(
        &mut self,
        now: SimTime,
        version: u32,
        reqs: &mut [Request],
        cfg: &WorkerConfig,
        out: &mut StepOutcome,
    ) -> Result<Option<(SimTime, u32)>, StaleStep> {
        if !self.version.is_current(version) || self.step.as_ref().is_none_or(|s| s.end != now) {
            return Err(StaleStep);
        }
        let step = self.step.take().expect("checked above");
        out.clear();
        out.duration = step.end - step.start;
        self.busy += out.duration;
        self.steps += 1;
        let s = self.step_index;

        // Decoders: every member produced one token.
        out.decodes = step.decodes;
        out.generated_tokens += step.decodes;
        self.decode.advance();
        while let Some(id) = self.decode.pop_finished(s, reqs) {
            let r = &mut reqs[id.index()];
            let computed = r.seq.computed;
            self.complete(now, id, computed, reqs, cfg, out);
        }

        // Prefill chunks.
        let mut chunks = std::mem::take(&mut self.chunks);
        for &(id, chunk) in &chunks {
            let r = &mut reqs[id.index()];
            let n = chunk.end - chunk.cached;
            r.seq.computed = chunk.end;
            r.prefill_tokens_computed += n;
            out.prompt_tokens += n;
            if r.seq.computed < r.seq.num_tokens {
                continue;
            }
            // The step that completes the (re)computed context samples a token.
            r.seq.generated += 1;
            r.seq.num_tokens += 1;
            out.generated_tokens += 1;
            if r.first_token.is_none() {
                r.first_token = Some(now);
                out.first_tokens.push(id);
            } else {
                out.resumed_gaps.push(now - r.seq.last_token_at);
            }
            r.seq.last_token_at = now;
            if r.seq.generated >= u64::from(r.output_tokens) {
                let computed = r.seq.computed;
                self.complete(now, id, computed, reqs, cfg, out);
            } else {
                self.decode.join(id, s + 1, reqs);
            }
        }
        self.prefilling.retain(|id| {
            let r = &reqs[id.index()];
            !r.seq.decode.active && r.finished.is_none()
        });
        chunks.clear();
        self.chunks = chunks;
        self.step_index += 1;
        self.pump_io_slots(reqs, cfg);
        Ok(self.plan_step(now, reqs, cfg))
    }

    /// Frees a finished request's blocks and slot.
    fn complete(
        &mut self,
        now: SimTime,
        id: RequestId,
        computed: u64,
        reqs: &mut [Request],
        cfg: &WorkerConfig,
        out: &mut StepOutcome,
    ) {
        let r = &mut reqs[id.index()];
        r.finished = Some(now);
        self.free_blocks += cfg.blocks_for(computed);
        if r.seq.holds_io_slot {
            r.seq.holds_io_slot = false;
            self.io_in_use -= 1;
        }
        out.completed.push(id);
    }

    /// Builds the next step at `now` if there is work; returns its end and stamp.
    fn plan_step(&mut self, now: SimTime, reqs: &mut [Request], cfg: &WorkerConfig) -> Option<(SimTime, u32)> {
        debug_assert!(self.step.is_none() && self.chunks.is_empty());
        let s = self.step_index;
        let mut budget = cfg.token_budget;
        let preempted_before = self.preemptions;

        // 1. Decoding sequences: one token each; blocks for those crossing a block boundary.
        loop {
            let need = self.decode.blocks_needed(s);
            if need <= self.free_blocks {
                self.free_blocks -= need;
                break;
            }
            let victim =
                self.least_work_victim(0, s, reqs, true).expect("blocks are short but nothing is running to preempt");
            self.preempt(now, victim, s, reqs, cfg);
        }
        let decodes = self.decode.len() as u64;
        budget -= decodes.min(budget);

        // 2. Running requests still prefilling, in admission order.
        let mut i = 0;
        while i < self.prefilling.len() && budget > 0 {
            let id = self.prefilling[i];
            let seq = reqs[id.index()].seq;
            let chunk = (seq.num_tokens - seq.computed).min(budget);
            let need = cfg.blocks_for(seq.computed + chunk) - cfg.blocks_for(seq.computed);
            if need > self.free_blocks {
                let victim = self.least_work_victim(i, s, reqs, false).expect("the requester itself is a candidate");
                self.preempt(now, victim, s, reqs, cfg);
                continue; // re-examine position i (the requester, or whoever moved there)
            }
            self.free_blocks -= need;
            self.chunks.push((id, PrefillChunk { cached: seq.computed, end: seq.computed + chunk }));
            budget -= chunk;
            i += 1;
        }

        // 3. Admit waiting requests in FIFO order — unless this step preempted
        //    someone (vLLM v1 does not admit in a step that had to preempt).
        let admit = self.preemptions == preempted_before;
        while admit && self.running() < cfg.max_running as usize && budget > 0 {
            let Some(&id) = self.ready.front() else { break };
            let seq = reqs[id.index()].seq;
            let remaining = seq.num_tokens - seq.computed;
            let chunk = remaining.min(budget);
            if !cfg.chunked_prefill && chunk < remaining {
                break;
            }
            let need = cfg.blocks_for(seq.computed + chunk) - cfg.blocks_for(seq.computed);
            if need > self.free_blocks {
                break;
            }
            self.ready.pop_front();
            self.free_blocks -= need;
            let r = &mut reqs[id.index()];
            r.seq.admit_seq = self.admit_counter;
            self.admit_counter += 1;
            r.first_scheduled.get_or_insert(now);
            self.prefilling.push(id);
            self.chunks.push((id, PrefillChunk { cached: seq.computed, end: seq.computed + chunk }));
            budget -= chunk;
        }

        if decodes == 0 && self.chunks.is_empty() {
            return None;
        }
        self.perf_chunks.clear();
        self.perf_chunks.extend(self.chunks.iter().map(|&(_, c)| c));
        let work =
            StepWork { prefill: &self.perf_chunks, decodes, decode_context_tokens: self.decode.context_tokens() };
        let end = now + cfg.perf.step_time(&work);
        self.step = Some(Step { start: now, end, decodes });
        Some((end, self.version.bump()))
    }

    /// The running request with the least work done (fewest computed tokens;
    /// ties: latest admitted) among the prefilling requests from position
    /// `from` on and, if `with_decoders`, every decoding request.
    fn least_work_victim(&self, from: usize, s: u64, reqs: &[Request], with_decoders: bool) -> Option<RequestId> {
        let key = |id: RequestId, computed: u64| (computed, Reverse(reqs[id.index()].seq.admit_seq));
        let prefill = self.prefilling[from..].iter().map(|&id| (key(id, reqs[id.index()].seq.computed), id));
        let decoders = self
            .decode
            .members
            .iter()
            .filter(|_| with_decoders)
            .map(|&id| (key(id, self.decode.computed(id, s, reqs)), id));
        prefill.chain(decoders).min_by_key(|&(k, _)| k).map(|(_, id)| id)
    }

    /// Preempts `id` by recompute before step `s`.
    fn preempt(&mut self, now: SimTime, id: RequestId, s: u64, reqs: &mut [Request], cfg: &WorkerConfig) {
        let computed = if reqs[id.index()].seq.decode.active {
            let (computed, generated) = self.decode.leave(id, s, reqs);
            let seq = &mut reqs[id.index()].seq;
            seq.generated = generated;
            seq.num_tokens = computed + 1;
            seq.last_token_at = now;
            computed
        } else {
            let pos = self.prefilling.iter().position(|&p| p == id).expect("victim is running");
            self.prefilling.remove(pos);
            reqs[id.index()].seq.computed
        };
        self.free_blocks += cfg.blocks_for(computed);
        let r = &mut reqs[id.index()];
        r.seq.computed = 0;
        r.preemptions += 1;
        self.preemptions += 1;
        self.ready.push_front(id);
    }
}

/// Returned by [`Worker::finish_step`] for a step event superseded by a re-plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StaleStep;

/// The decoding sequences of one worker, advanced arithmetically.
///
/// A member that joined at step `j` with `c` computed and `g` generated
/// tokens has, before step `s ≥ j`, `c + (s − j)` computed and `g + (s − j)`
/// generated tokens; it writes KV position `c + (s − j)` in step `s` and so
/// needs a new block exactly when `s ≡ j − c (mod block_size)` — the group
/// keeps one counter per residue class. It finishes after step
/// `j + (output − g) − 1`, kept in a min-heap.
#[derive(Debug)]
pub struct DecodeGroup {
    block_size: u64,
    members: Vec<RequestId>,
    /// Σ computed tokens of the members before the next step.
    context: u64,
    residue: Vec<u32>,
    finish: BinaryHeap<Reverse<(u64, u64, RequestId, u32)>>,
}

impl DecodeGroup {
    fn new(block_size: u64) -> DecodeGroup {
        DecodeGroup {
            block_size,
            members: Vec::new(),
            context: 0,
            residue: vec![0; block_size as usize],
            finish: BinaryHeap::new(),
        }
    }

    /// Members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// True with no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Σ over members of tokens already in their KV cache.
    pub fn context_tokens(&self) -> u64 {
        self.context
    }

    fn residue_of(&self, join: u64, computed: u64) -> usize {
        ((join % self.block_size + self.block_size - computed % self.block_size) % self.block_size) as usize
    }

    /// New blocks the members need to run step `s`.
    pub fn blocks_needed(&self, s: u64) -> u64 {
        u64::from(self.residue[(s % self.block_size) as usize])
    }

    /// Computed tokens of member `id` before step `s`.
    fn computed(&self, id: RequestId, s: u64, reqs: &[Request]) -> u64 {
        let d = reqs[id.index()].seq.decode;
        d.computed_at_join + (s - d.join_step)
    }

    /// Adds `id` (whose `seq` is current) to decode from step `join` on.
    fn join(&mut self, id: RequestId, join: u64, reqs: &mut [Request]) {
        let r = &mut reqs[id.index()];
        let (computed, generated) = (r.seq.computed, r.seq.generated);
        let d = &mut r.seq.decode;
        d.join_step = join;
        d.computed_at_join = computed;
        d.generated_at_join = generated;
        d.pos = self.members.len() as u32;
        d.epoch = d.epoch.wrapping_add(1);
        d.active = true;
        let finish_step = join + (u64::from(r.output_tokens) - generated) - 1;
        self.finish.push(Reverse((finish_step, r.seq.admit_seq, id, d.epoch)));
        self.members.push(id);
        self.context += computed;
        let res = self.residue_of(join, computed);
        self.residue[res] += 1;
    }

    /// Removes `id` before step `s`; returns its (computed, generated) tokens then.
    fn leave(&mut self, id: RequestId, s: u64, reqs: &mut [Request]) -> (u64, u64) {
        let d = reqs[id.index()].seq.decode;
        let computed = d.computed_at_join + (s - d.join_step);
        let generated = d.generated_at_join + (s - d.join_step);
        let res = self.residue_of(d.join_step, d.computed_at_join);
        self.residue[res] -= 1;
        self.context -= computed;
        let pos = d.pos as usize;
        self.members.swap_remove(pos);
        if let Some(&moved) = self.members.get(pos) {
            reqs[moved.index()].seq.decode.pos = pos as u32;
        }
        reqs[id.index()].seq.decode.active = false;
        (computed, generated)
    }

    /// Every member produced one token (end of a step).
    fn advance(&mut self) {
        self.context += self.members.len() as u64;
    }

    /// After [`Self::advance`] for step `s`: the next member that finished in
    /// it, removed from the group with its `seq` brought up to date.
    fn pop_finished(&mut self, s: u64, reqs: &mut [Request]) -> Option<RequestId> {
        while let Some(&Reverse((step, _, id, epoch))) = self.finish.peek() {
            if step > s {
                return None;
            }
            self.finish.pop();
            let d = reqs[id.index()].seq.decode;
            if !d.active || d.epoch != epoch {
                continue; // preempted since this entry was pushed
            }
            debug_assert_eq!(step, s, "a decoder outlived its finish step");
            // `leave` at s + 1 gives the counts after step s.
            let (computed, generated) = self.leave(id, s + 1, reqs);
            let seq = &mut reqs[id.index()].seq;
            seq.computed = computed;
            seq.generated = generated;
            seq.num_tokens = computed + 1;
            return Some(id);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::perf::{MixRule, Roofline, StepModel};
    use super::*;
    use crate::ids::StageId;

    /// Toy roofline: L = 1, d = 10, a = 0, b = 1, 1e6 FLOP/s → prefill of k new
    /// tokens = k·100/1e6 s = 100 µs per token; decode = (1000 B weights +
    /// 10 B/token × context) / 1e6 B/s = 1 ms + 10 µs per context token.
    fn toy(total_blocks: u64, max_running: u32) -> WorkerConfig {
        WorkerConfig {
            max_running,
            token_budget: 1000,
            chunked_prefill: true,
            block_size: 16,
            total_blocks,
            io_slots: 8,
            slot_mode: SlotMode::Pipelined,
            max_model_len: 10_000,
            perf: PerfModel {
                model: StepModel::Roofline(Roofline {
                    layers: 1.0,
                    hidden: 10.0,
                    a: 0.0,
                    b: 1.0,
                    flops_per_sec: 1e6,
                    mem_bytes_per_sec: 1e6,
                    weight_bytes: 1000.0,
                    kv_bytes_per_token: 10.0,
                }),
                mix: MixRule::Max,
            },
        }
    }

    fn arena(specs: &[(u32, u32)]) -> Vec<Request> {
        specs
            .iter()
            .enumerate()
            .map(|(i, &(p, o))| Request::new(RequestId(i as u32), StageId(0), SimTime::ZERO, p, o, 0))
            .collect()
    }

    /// Runs the worker's steps to completion; returns (end time, outcomes' decodes per step).
    fn drain(
        w: &mut Worker,
        mut next: Option<(SimTime, u32)>,
        reqs: &mut [Request],
        cfg: &WorkerConfig,
    ) -> Vec<(SimTime, u64)> {
        let mut out = StepOutcome::default();
        let mut log = Vec::new();
        while let Some((t, v)) = next {
            next = w.finish_step(t, v, reqs, cfg, &mut out).expect("current step");
            log.push((t, out.decodes));
        }
        log
    }

    #[test]
    fn batch_of_decodes_takes_the_hand_computed_step_time() {
        let cfg = toy(1000, 8);
        let mut reqs = arena(&[(20, 3), (30, 3), (50, 3)]);
        let mut w = Worker::new(WorkerId(0), &cfg);
        let first = w.enqueue(SimTime::ZERO, RequestId(0), &mut reqs, &cfg);
        // Step 0 prefills request 0 alone (it is the only one queued when the worker was idle):
        // prefill 20 × 100 µs = 2 ms; decode part = 1 ms weights; max → 2 ms.
        assert_eq!(first.unwrap().0, SimTime(2_000_000));
        assert!(w.enqueue(SimTime::ZERO, RequestId(1), &mut reqs, &cfg).is_none());
        assert!(w.enqueue(SimTime::ZERO, RequestId(2), &mut reqs, &cfg).is_none());
        let log = drain(&mut w, first, &mut reqs, &cfg);
        // Step 1 (from 2 ms): request 0 decodes (context 20) and requests 1, 2 prefill 80 tokens:
        //   prefill 80 × 100 µs = 8 ms; decode 1 ms + 20 × 10 µs = 1.2 ms → 8 ms; ends at 10 ms.
        // Step 2 (from 10 ms): all three decode, contexts 21 + 30 + 50 = 101:
        //   1 ms + 101 × 10 µs = 2.01 ms; ends at 12.01 ms. Request 0 (3 tokens) is done.
        // Step 3: requests 1, 2 decode, contexts 31 + 51 = 82 → 1.82 ms; ends at 13.83 ms; both done.
        assert_eq!(
            log,
            vec![(SimTime(2_000_000), 0), (SimTime(10_000_000), 1), (SimTime(12_010_000), 3), (SimTime(13_830_000), 2)]
        );
        assert_eq!(reqs[0].first_token, Some(SimTime(2_000_000)));
        assert_eq!(reqs[0].finished, Some(SimTime(12_010_000)));
        assert_eq!(reqs[1].first_token, Some(SimTime(10_000_000)));
        assert_eq!(reqs[2].finished, Some(SimTime(13_830_000)));
        assert!(reqs.iter().all(|r| r.seq.generated == u64::from(r.output_tokens)));
        assert_eq!(w.used_blocks(&cfg), 0, "every block is returned");
    }

    #[test]
    fn chunked_prefill_splits_a_long_prompt_by_the_token_budget() {
        let mut cfg = toy(1000, 8);
        cfg.token_budget = 400;
        let mut reqs = arena(&[(1000, 1)]);
        let mut w = Worker::new(WorkerId(0), &cfg);
        let first = w.enqueue(SimTime::ZERO, RequestId(0), &mut reqs, &cfg);
        let log = drain(&mut w, first, &mut reqs, &cfg);
        // Chunks of 400, 400, 200 tokens: 40 ms, 40 ms, 20 ms; the last emits the only token.
        assert_eq!(log.iter().map(|l| l.0.0).collect::<Vec<_>>(), vec![40_000_000, 80_000_000, 100_000_000]);
        assert_eq!(reqs[0].finished, Some(SimTime(100_000_000)));
        assert_eq!(reqs[0].prefill_tokens_computed, 1000);
    }

    #[test]
    fn preemption_by_recompute_when_blocks_run_out_and_both_requests_finish() {
        // 5 blocks of 16 tokens = 80 token slots. Two requests of 16 prompt + 40 output
        // each need 4 blocks at the end (55 KV tokens): 8 > 5, so one must be preempted.
        let cfg = toy(5, 8);
        let mut reqs = arena(&[(16, 40), (16, 40)]);
        let mut w = Worker::new(WorkerId(0), &cfg);
        let first = w.enqueue(SimTime::ZERO, RequestId(0), &mut reqs, &cfg);
        assert!(w.enqueue(SimTime::ZERO, RequestId(1), &mut reqs, &cfg).is_none());
        drain(&mut w, first, &mut reqs, &cfg);
        assert!(w.preemptions() >= 1);
        // Request 1 was admitted later and had less work done, so it is the victim.
        assert_eq!((reqs[0].preemptions, reqs[1].preemptions > 0), (0, true));
        for r in &reqs {
            assert!(r.finished.is_some());
            assert_eq!(r.seq.generated, 40);
        }
        // The victim recomputed its prompt plus the tokens it had generated.
        assert!(reqs[1].prefill_tokens_computed > 16);
        assert_eq!(w.used_blocks(&cfg), 0);
    }

    #[test]
    fn decode_group_needs_a_block_exactly_at_block_boundaries() {
        let cfg = toy(1000, 8);
        // Prompt 15: after prefill 15 tokens computed (1 block). The first decode step
        // writes position 15 (same block); the second writes 16 (new block).
        let mut reqs = arena(&[(15, 5)]);
        let mut g = DecodeGroup::new(cfg.block_size);
        reqs[0].seq.computed = 15;
        reqs[0].seq.generated = 1;
        g.join(RequestId(0), 7, &mut reqs);
        assert_eq!((g.blocks_needed(7), g.blocks_needed(8)), (0, 1));
        assert_eq!(g.blocks_needed(8 + 16), 1);
        assert_eq!(g.context_tokens(), 15);
    }

    #[test]
    fn single_stage_slots_cap_requests_in_processing() {
        let mut cfg = toy(1000, 8);
        cfg.io_slots = 2;
        cfg.slot_mode = SlotMode::SingleStage;
        let mut reqs = arena(&[(10, 50), (10, 50), (10, 50), (10, 50)]);
        let mut w = Worker::new(WorkerId(0), &cfg);
        let first = w.enqueue(SimTime::ZERO, RequestId(0), &mut reqs, &cfg);
        for i in 1..4 {
            w.enqueue(SimTime::ZERO, RequestId(i), &mut reqs, &cfg);
        }
        // After the first step both slot holders run; the others wait in intake.
        let mut out = StepOutcome::default();
        let (t, v) = first.unwrap();
        let next = w.finish_step(t, v, &mut reqs, &cfg, &mut out).unwrap();
        assert_eq!((w.running(), w.waiting()), (2, 2));
        drain(&mut w, next, &mut reqs, &cfg);
        // Requests 2 and 3 start only after 0 and 1 finish.
        assert!(reqs[2].first_scheduled.unwrap() >= reqs[0].finished.unwrap());
        assert!(reqs.iter().all(|r| r.finished.is_some()));
    }
}
