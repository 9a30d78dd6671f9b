//! The decode-run fast path: while only decodes run and nothing else can
//! change, a worker plans a run of up to [`MAX_RUN`] decode steps as one
//! event and materialises its sub-steps only when their state is read
//! (their time, busy span and inter-token gaps are recorded as their own
//! step ends would be). [`DecodeGroup`] advances the decoding sequences
//! arithmetically from the worker's step counter, so a decode step costs
//! O(1) plus O(log n) per completion.

use super::{FIRST_RUN, Worker, WorkerConfig};
use crate::ids::RequestId;
use crate::metrics::{PeakSeconds, StepRecord};
use crate::request::{Request, RequestStatus};
use crate::time::SimTime;
use crate::worker::perf::StepWork;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

impl Worker {
    /// Brings a run of decode steps up to `until`: the sub-steps that ended
    /// by then (at `until` too if `inclusive`) happen — their tokens, their
    /// blocks for the next sub-step — as separate steps would have. Their
    /// `(end, duration, decodes)` wait in [`Self::take_substeps`].
    ///
    /// A run is planned only when nothing but decoding can happen until its
    /// end — the waiting queue is empty, no member finishes or crosses the
    /// sliding window before the last sub-step, and the blocks the sub-steps
    /// need can be had without preemption (and without evictions others
    /// would be told about) — so doing its sub-steps late, when someone
    /// looks, changes nothing: callers materialise before they read the
    /// worker's state, and a new request cuts the run (`cut`).
    pub fn materialize(&mut self, until: SimTime, inclusive: bool) {
        while let Some(&t) = self.run.front() {
            if t > until || (t == until && !inclusive) {
                break;
            }
            self.run.pop_front();
            let step = self.step.as_mut().expect("a run is a step in flight");
            let d = t - step.start;
            step.start = t;
            self.busy += d;
            self.steps += 1;
            self.substeps.push(StepRecord { end: t, duration: d, decodes: step.decodes, peak: self.step_peak });
            self.log_end(t, d);
            self.peak_total += self.step_peak;
            self.step_j += self.power.step_joules(d.as_secs_f64(), self.step_peak);
            self.run_sub += 1.0;
            let (p0, dp) = self.run_peak;
            self.step_peak = PeakSeconds {
                compute: p0.compute + self.run_sub * dp.compute,
                memory: p0.memory + self.run_sub * dp.memory,
            };
            self.decode.advance();
            self.step_index += 1;
            let need = self.decode.blocks_needed(self.step_index);
            debug_assert!(self.cache.can_allocate(need, t, false), "a run's blocks were counted when it was planned");
            self.cache.allocate(need, t, false);
        }
    }

    /// Whether a run of decode steps is in flight with sub-steps to come.
    pub fn in_run(&self) -> bool {
        !self.run.is_empty()
    }

    /// Moves the sub-steps materialised so far to `out`.
    pub fn take_substeps(&mut self, out: &mut Vec<StepRecord>) {
        out.append(&mut self.substeps);
    }

    /// Ends the run in flight at the end of its current sub-step (after
    /// [`Self::materialize`]); returns the new end and stamp.
    pub(super) fn cut(&mut self) -> Option<(SimTime, u32)> {
        let end = self.run.pop_front()?;
        self.run.clear();
        if let Some(log) = &mut self.log {
            // The sub-step in flight is the run's last now.
            log.pending.clear();
        }
        self.run_limit = FIRST_RUN;
        self.in_planned_run = false;
        self.step.as_mut().expect("a run is a step in flight").end = end;
        Some((end, self.version.bump()))
    }

    /// Extends a decode-only step ending at `first_end` into a run of
    /// sub-steps (see [`Self::materialize`]); returns the run's end.
    pub(super) fn plan_run(
        &mut self,
        first_end: SimTime,
        decodes: u64,
        context: u64,
        window: u64,
        cfg: &WorkerConfig,
    ) -> SimTime {
        let s = self.step_index;
        // The last sub-step may see members finish or cross the window; none before.
        let last = self.decode.next_finish().min(self.decode.next_cross().saturating_sub(1)).max(s);
        let steps = (last - s).saturating_add(1).min(self.run_limit);
        // Blocks for the later sub-steps, without preemption; evictions only
        // where nobody is told about them.
        let mut allowance = self.cache.free();
        if !(cfg.publish_events || cfg.report_evictions) {
            allowance += self.cache.evictable();
        }
        let below = self.decode.below();
        let next = StepWork {
            prefill: &[],
            decodes,
            decode_context_tokens: context + decodes,
            decode_window_tokens: window + below,
            samples: decodes,
        };
        let p1 = cfg.usage.peak_seconds(&next);
        let p0 = self.step_peak;
        self.run_peak = (p0, PeakSeconds { compute: p1.compute - p0.compute, memory: p1.memory - p0.memory });
        self.run_sub = 0.0;
        let mut end = first_end;
        let price = cfg.perf.decode_run(decodes);
        for j in 1..steps {
            let need = self.decode.blocks_needed(s + j);
            if need > allowance {
                break;
            }
            allowance -= need;
            self.run.push_back(end);
            let work = StepWork {
                prefill: &[],
                decodes,
                decode_context_tokens: context + j * decodes,
                decode_window_tokens: window + j * below,
                samples: decodes,
            };
            end += price.step_time(work.decode_context_tokens, work.decode_window_tokens);
            if let Some(log) = &mut self.log {
                log.pending.push_back(Self::row_of(self.id, &work, cfg));
            }
        }
        self.in_planned_run = !self.run.is_empty();
        end
    }
}

/// The decoding sequences of one worker, advanced arithmetically.
///
/// A member that joined at step `j` with `c` computed and `g` generated
/// tokens has, before step `s ≥ j`, `c + (s − j)` computed and `g + (s − j)`
/// generated tokens; it writes KV position `c + (s − j)` in step `s` and so
/// needs a new block exactly when `s ≡ j − c (mod block_size)` — the group
/// keeps one counter per residue class. It finishes after step
/// `j + (output − g) − 1`, kept in a min-heap.
///
/// With a sliding window `W`, `Σ min(context, W)` is kept the same way: the
/// members still below the window (and the sum of their contexts) grow by
/// one token per step, and a member crosses the window at step `j + W − c`
/// (another min-heap).
#[derive(Debug)]
pub struct DecodeGroup {
    block_size: u64,
    members: Vec<RequestId>,
    /// Σ computed tokens of the members before the next step.
    context: u64,
    residue: Vec<u32>,
    finish: BinaryHeap<Reverse<(u64, u64, RequestId, u32)>>,
    /// The sliding window (`u64::MAX`: none, and nothing below is kept).
    window: u64,
    /// Members whose context is below the window, and the sum of their contexts.
    below: u64,
    below_context: u64,
    /// `(step at which the context reaches the window, member, epoch)`.
    cross: BinaryHeap<Reverse<(u64, RequestId, u32)>>,
    /// Joins so far (the next member's epoch).
    joins: u32,
}

impl DecodeGroup {
    /// The members, in no particular order.
    pub(super) fn members(&self) -> &[RequestId] {
        &self.members
    }

    pub(super) fn new(block_size: u64, window: Option<u64>) -> DecodeGroup {
        DecodeGroup {
            block_size,
            members: Vec::new(),
            context: 0,
            residue: vec![0; block_size as usize],
            finish: BinaryHeap::new(),
            window: window.unwrap_or(u64::MAX),
            below: 0,
            below_context: 0,
            cross: BinaryHeap::new(),
            joins: 0,
        }
    }

    pub(super) fn windowed(&self) -> bool {
        self.window != u64::MAX
    }

    /// Before step `s`: members that have reached the window leave the below set.
    pub(super) fn settle_window(&mut self, s: u64, reqs: &[Request]) {
        while let Some(&Reverse((step, id, epoch))) = self.cross.peek() {
            if step > s {
                break;
            }
            self.cross.pop();
            let d = reqs[id.index()].seq.decode;
            if d.active && d.epoch == epoch {
                self.below -= 1;
                self.below_context -= d.computed_at_join + (s - d.join_step);
            }
        }
    }

    /// The earliest step a member finishes in (`u64::MAX` without members).
    pub(super) fn next_finish(&self) -> u64 {
        self.finish.peek().map_or(u64::MAX, |Reverse((step, ..))| *step)
    }

    /// The earliest step a member's context reaches the window.
    pub(super) fn next_cross(&self) -> u64 {
        self.cross.peek().map_or(u64::MAX, |Reverse((step, ..))| *step)
    }

    /// Members whose context is below the window (each adds a token to the windowed sum per step).
    pub(super) fn below(&self) -> u64 {
        if self.windowed() { self.below } else { self.members.len() as u64 }
    }

    /// Σ over members of `min(context, window)` before step `s`.
    pub fn window_tokens(&mut self, s: u64, reqs: &[Request]) -> u64 {
        if !self.windowed() {
            return self.context;
        }
        self.settle_window(s, reqs);
        self.below_context + self.window * (self.members.len() as u64 - self.below)
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

    pub(super) fn residue_of(&self, join: u64, computed: u64) -> usize {
        ((join % self.block_size + self.block_size - computed % self.block_size) % self.block_size) as usize
    }

    /// New blocks the members need to run step `s`.
    pub fn blocks_needed(&self, s: u64) -> u64 {
        u64::from(self.residue[(s % self.block_size) as usize])
    }

    /// Computed tokens of member `id` before step `s`.
    pub(super) fn computed(&self, id: RequestId, s: u64, reqs: &[Request]) -> u64 {
        let d = reqs[id.index()].seq.decode;
        d.computed_at_join + (s - d.join_step)
    }

    /// Adds `id` (whose `seq` is current) to decode from step `join` on.
    pub(super) fn join(&mut self, id: RequestId, join: u64, reqs: &mut [Request]) {
        let r = &mut reqs[id.index()];
        let (computed, generated) = (r.seq.computed, r.seq.generated);
        let d = &mut r.seq.decode;
        d.join_step = join;
        d.computed_at_join = computed;
        d.generated_at_join = generated;
        d.pos = self.members.len() as u32;
        // Unique over the group's life: a stale heap entry never matches a
        // later member, even one in a reused request slot.
        self.joins += 1;
        d.epoch = self.joins;
        d.active = true;
        r.seq.status = RequestStatus::Decoding;
        let finish_step = join + (u64::from(r.output_tokens) - generated) - 1;
        self.finish.push(Reverse((finish_step, r.seq.admit_seq, id, d.epoch)));
        if self.windowed() && computed < self.window {
            self.below += 1;
            self.below_context += computed;
            self.cross.push(Reverse((join + (self.window - computed), id, d.epoch)));
        }
        self.members.push(id);
        self.context += computed;
        let res = self.residue_of(join, computed);
        self.residue[res] += 1;
    }

    /// Removes `id` before step `s`; returns its (computed, generated) tokens then.
    pub(super) fn leave(&mut self, id: RequestId, s: u64, reqs: &mut [Request]) -> (u64, u64) {
        if self.windowed() {
            self.settle_window(s, reqs);
        }
        let d = reqs[id.index()].seq.decode;
        let computed = d.computed_at_join + (s - d.join_step);
        if self.windowed() && computed < self.window {
            self.below -= 1;
            self.below_context -= computed;
        }
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
    pub(super) fn advance(&mut self) {
        self.context += self.members.len() as u64;
        self.below_context += self.below;
    }

    /// After [`Self::advance`] for step `s`: the next member that finished in
    /// it, removed from the group with its `seq` brought up to date.
    pub(super) fn pop_finished(&mut self, s: u64, reqs: &mut [Request]) -> Option<RequestId> {
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
