//! The decode-run fast path: while only decodes run and nothing else can
//! change, a worker plans a run of decode steps (until a member finishes)
//! as one event. Within the run the step time is affine in the batch's
//! context between the attention grid's knots, so the run is priced as a
//! few [`Piece`]s — the sub-steps at each piece's ends priced exactly, those
//! between on the straight line (within 1 ns of their own price) — and its
//! sub-steps are brought about in bulk when their state is read: their
//! time, busy span, tokens, energy and inter-token gaps are sums over a
//! [`crate::time::Ramp`], whatever the number of sub-steps. [`DecodeGroup`]
//! advances the decoding sequences arithmetically from the worker's step
//! counter, so a decode step costs O(1) plus O(log n) per completion.

use super::{Worker, WorkerConfig};
use crate::ids::RequestId;
use crate::metrics::{PeakSeconds, StepSpan};
use crate::request::{Request, RequestStatus};
use crate::time::{Ramp, SimDuration, SimTime};
use crate::worker::perf::{Piece, RunGrowth, StepWork};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A run of decode sub-steps in flight: sub-step 0 is the step as first
/// planned, sub-step `last` ends the step.
#[derive(Debug, Default)]
pub(super) struct Run {
    /// The sub-steps' durations, in order.
    pieces: Vec<Piece>,
    /// The piece holding the sub-step in flight.
    at: usize,
    /// The sub-step in flight.
    next: u64,
    /// The last sub-step.
    last: u64,
    /// The current piece's durations summed up to the sub-step in flight.
    done: u128,
    /// How the sub-steps' contexts grow (for their step rows).
    growth: RunGrowth,
    /// Sub-step `j` asks `peak.0 + j × peak.1` of the GPU (decode work grows
    /// linearly with the context).
    peak: (PeakSeconds, PeakSeconds),
    /// Scratch for the pieces' breaks.
    breaks: Vec<u64>,
}

impl Worker {
    /// Brings a run of decode steps up to `until`: the sub-steps that ended
    /// by then (at `until` too if `inclusive`) happen — their tokens, their
    /// blocks for the next sub-step — as separate steps would have, in one
    /// go. Their spans wait in [`Self::substeps_mut`].
    ///
    /// A run is planned only when nothing but decoding can happen until its
    /// end — the waiting queue is empty, no member finishes or crosses the
    /// sliding window before the last sub-step, and the blocks the sub-steps
    /// need can be had without preemption (and without evictions others
    /// would be told about) — so doing its sub-steps late, when someone
    /// looks, changes nothing: callers materialise before they read the
    /// worker's state, and a new request cuts the run (`cut`).
    ///
    /// (Most calls find no run in flight: that is checked here, inlined.)
    #[inline]
    pub fn materialize(&mut self, until: SimTime, inclusive: bool, cfg: &WorkerConfig) {
        if self.in_run() {
            self.materialize_run(until, inclusive, cfg);
        }
    }

    fn materialize_run(&mut self, until: SimTime, inclusive: bool, cfg: &WorkerConfig) {
        while self.run.next < self.run.last {
            let start = self.step.as_ref().expect("a run is a step in flight").start;
            let piece = self.run.pieces[self.run.at];
            let k = self.run.next - piece.first;
            // The last sub-step ends the step: `finish_step` does it.
            let to = piece.ramp.len.min(self.run.last - piece.first);
            let Some(budget) = until.0.checked_sub(start.0 + u64::from(!inclusive)) else { break };
            if budget < piece.ramp.at(k) {
                break; // the sub-step in flight ends later
            }
            // Σ durations up to `to`: the piece's total, less the run's last sub-step in its last piece.
            let upto = match piece.ramp.len - to {
                0 => u128::from(piece.total.0),
                1 => u128::from(piece.total.0 - piece.ramp.at(to)),
                _ => piece.ramp.prefix(to),
            };
            let (kk, done) = if upto - self.run.done <= u128::from(budget) {
                (to, upto)
            } else {
                piece.ramp.fit_from(k, self.run.done, to, SimDuration(budget))
            };
            if kk == k {
                break;
            }
            let duration = SimDuration((done - self.run.done) as u64);
            self.do_substeps(start, piece.ramp, k, kk, duration, cfg);
            self.run.done = done;
            if kk == piece.ramp.len {
                self.run.at += 1;
                self.run.done = 0;
            }
        }
    }

    /// Sub-steps `k..kk` of the run's current piece (of durations `ramp`) happen.
    fn do_substeps(&mut self, start: SimTime, ramp: Ramp, k: u64, kk: u64, duration: SimDuration, cfg: &WorkerConfig) {
        let (n, j) = (kk - k, self.run.next);
        let decodes = self.step.as_ref().expect("a run is a step in flight").decodes;
        let (p0, dp) = self.run.peak;
        let at = |j: u64| PeakSeconds {
            compute: p0.compute + j as f64 * dp.compute,
            memory: p0.memory + j as f64 * dp.memory,
        };
        let span = StepSpan { start, ramp, k0: k, k1: kk, duration, decodes, peak: (at(j), dp) };
        let end = span.end();
        self.busy += end - start;
        self.steps += n;
        self.peak_total += span.peak_of(0, n);
        self.step_j += self.power.span_joules(&span);
        if self.log.is_some() {
            let mut t = start;
            for i in 0..n {
                let d = SimDuration(ramp.at(k + i));
                t += d;
                self.log_end(t, d);
                if j + i < self.run.last {
                    let (c, w) = self.run.growth.at(j + i + 1);
                    let work = StepWork::decode(decodes, c, w);
                    let row = Self::row_of(self.id, &work, cfg);
                    self.log.as_mut().expect("checked above").current = Some(row);
                }
            }
        }
        self.substeps.push(span);
        self.decode.advance_by(n);
        let need = self.decode.blocks_over(self.step_index + 1, n);
        self.step_index += n;
        debug_assert!(self.cache.can_allocate(need, end, false), "a run's blocks were counted when it was planned");
        self.cache.allocate(need, end, false);
        self.run.next += n;
        self.step_peak = at(self.run.next);
        self.step.as_mut().expect("a run is a step in flight").start = end;
    }

    /// Whether a run of decode steps is in flight with sub-steps to come.
    pub fn in_run(&self) -> bool {
        self.run.next < self.run.last
    }

    /// The spans of sub-steps materialised and not yet told of (the
    /// caller reads and clears them).
    pub fn substeps_mut(&mut self) -> &mut Vec<StepSpan> {
        &mut self.substeps
    }

    /// Ends the run in flight at the end of its current sub-step (after
    /// [`Self::materialize`]); returns the new end and stamp.
    pub(super) fn cut(&mut self) -> Option<(SimTime, u32)> {
        if !self.in_run() {
            return None;
        }
        let piece = self.run.pieces[self.run.at];
        let step = self.step.as_mut().expect("a run is a step in flight");
        step.end = step.start + SimDuration(piece.ramp.at(self.run.next - piece.first));
        self.run.last = self.run.next;
        Some((step.end, self.version.bump()))
    }

    /// The run ended with its step.
    pub(super) fn end_run(&mut self) {
        debug_assert!(!self.in_run(), "every sub-step of a run ends before the run");
        self.run.pieces.clear();
        (self.run.at, self.run.next, self.run.last, self.run.done) = (0, 0, 0, 0);
    }

    /// Plans a decode-only step of `decodes` sequences holding `context`
    /// tokens (`window` windowed) from `now` as a run of sub-steps (see
    /// [`Self::materialize`]), as long as nothing else can happen; returns
    /// the run's end. Sub-step 0 is the step itself, priced exactly.
    pub(super) fn plan_run(
        &mut self,
        now: SimTime,
        decodes: u64,
        context: u64,
        window: u64,
        cfg: &WorkerConfig,
    ) -> SimTime {
        let s = self.step_index;
        // The last sub-step may see members finish or cross the window; none before.
        let last = self.decode.next_finish().min(self.decode.next_cross().saturating_sub(1)).max(s);
        // Blocks for the later sub-steps, without preemption; evictions only
        // where nobody is told about them.
        let allowance = self.cache.free() + self.cache.quietly_evictable();
        let n = self.decode.steps_within(s + 1, last - s, allowance);
        let run = &mut self.run;
        run.pieces.clear();
        (run.at, run.next, run.last, run.done) = (0, 0, n, 0);
        run.growth = RunGrowth { context, window, decodes, below: self.decode.below() };
        let price = cfg.perf.decode_run(decodes);
        self.priced += price.pieces(&run.growth, 0, n, &mut run.breaks, &mut run.pieces);
        if n > 0 {
            let (c1, w1) = run.growth.at(1);
            let next = StepWork::decode(decodes, c1, w1);
            let (p0, p1) = (self.step_peak, cfg.usage.peak_seconds(&next));
            run.peak = (p0, PeakSeconds { compute: p1.compute - p0.compute, memory: p1.memory - p0.memory });
        }
        if cfg!(debug_assertions) {
            for p in &run.pieces {
                for k in 0..p.ramp.len {
                    let (c, w) = run.growth.at(p.first + k);
                    let (own, said) = (price.step_time(c, w).0, p.ramp.at(k));
                    let exact = k == 0 || k + 1 == p.ramp.len;
                    debug_assert!(
                        if exact { own == said } else { own.abs_diff(said) <= 1 },
                        "sub-step {} priced {own} ns, its piece says {said}",
                        p.first + k
                    );
                }
            }
        }
        now + run.pieces.iter().fold(SimDuration::ZERO, |a, p| a + p.total)
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

/// Whether a heap entry for `id` pushed at its join of `epoch` is still its
/// (see [`DecodeGroup::holds`]), in a group of these `members`.
fn holds(members: &[RequestId], id: RequestId, epoch: u32, reqs: &[Request]) -> bool {
    let d = reqs[id.index()].seq.decode;
    d.active && d.epoch == epoch && members.get(d.pos as usize) == Some(&id)
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
            if self.holds(id, epoch, reqs) {
                let d = reqs[id.index()].seq.decode;
                self.below -= 1;
                self.below_context -= d.computed_at_join + (s - d.join_step);
            }
        }
    }

    /// Whether a heap entry for `id` pushed at its join of `epoch` is still
    /// its: it is this group's member, in that membership. (Epochs count
    /// this group's joins: a request slot reused by a request decoding on
    /// another worker may hold the same epoch, but not this group's member
    /// at its position.)
    fn holds(&self, id: RequestId, epoch: u32, reqs: &[Request]) -> bool {
        holds(&self.members, id, epoch, reqs)
    }

    /// Drops the heaps' stale entries once they outnumber the members: a
    /// member that leaves and joins again — a preemption, or under
    /// speculative decoding a verify that accepted drafts, every step —
    /// leaves its old entries behind, due only at the steps it would have
    /// finished or crossed the window at before (later ones), so without
    /// this a group's heaps grow with its members' output lengths, not with
    /// its members (the prefix cache's LRU drops its stale entries the same
    /// way). The live entries' order is their keys', so nothing pops
    /// in another order.
    fn drop_stale(&mut self, reqs: &[Request]) {
        let live = self.members.len();
        let rebuild = crate::engine::lazy_heap_needs_rebuild;
        if rebuild(self.finish.len(), live) || rebuild(self.cross.len(), live) {
            self.retain_live(reqs);
        }
    }

    /// [`Self::drop_stale`]'s work, kept out of the join it rarely follows.
    #[cold]
    #[inline(never)]
    fn retain_live(&mut self, reqs: &[Request]) {
        let members = &self.members;
        self.finish.retain(|&Reverse((_, _, id, epoch))| holds(members, id, epoch, reqs));
        self.cross.retain(|&Reverse((_, id, epoch))| holds(members, id, epoch, reqs));
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

    /// Entries in the finish and window heaps, live or stale (tests).
    #[cfg(test)]
    pub(super) fn heap_entries(&self) -> (usize, usize) {
        (self.finish.len(), self.cross.len())
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
        self.drop_stale(reqs);
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
        self.advance_by(1);
    }

    /// Every member produced `n` tokens (`n` steps).
    pub(super) fn advance_by(&mut self, n: u64) {
        self.context += n * self.members.len() as u64;
        self.below_context += n * self.below;
    }

    /// New blocks the members need to run steps `from .. from + n`.
    pub fn blocks_over(&self, from: u64, n: u64) -> u64 {
        // Each member needs one block per `block_size` steps: its residue's.
        let bs = self.block_size;
        // The partial cycle: residues `from % bs ..` for `n % bs` steps, wrapping round.
        let (start, r) = ((from % bs) as usize, (n % bs) as usize);
        let sum = |counts: &[u32]| counts.iter().map(|&c| u64::from(c)).sum::<u64>();
        let partial = if start + r <= bs as usize {
            sum(&self.residue[start..start + r])
        } else {
            sum(&self.residue[start..]) + sum(&self.residue[..start + r - bs as usize])
        };
        n / bs * self.members.len() as u64 + partial
    }

    /// The most steps from `from` on (at most `max`) whose new blocks
    /// come to at most `allowance`.
    pub fn steps_within(&self, from: u64, max: u64, allowance: u64) -> u64 {
        let (bs, per_cycle) = (self.block_size, self.members.len() as u64);
        if per_cycle == 0 {
            return max;
        }
        // Whole cycles of `block_size` steps, then step by step (fewer than a cycle).
        let cycles = (allowance / per_cycle).min(max / bs);
        let (mut n, mut left) = (cycles * bs, allowance - cycles * per_cycle);
        while n < max {
            let need = self.blocks_needed(from + n);
            if need > left {
                break;
            }
            left -= need;
            n += 1;
        }
        n
    }

    /// After [`Self::advance`] for step `s`: the next member that finished in
    /// it, removed from the group with its `seq` brought up to date.
    pub(super) fn pop_finished(&mut self, s: u64, reqs: &mut [Request]) -> Option<RequestId> {
        while let Some(&Reverse((step, _, id, epoch))) = self.finish.peek() {
            if step > s {
                return None;
            }
            self.finish.pop();
            if !self.holds(id, epoch, reqs) {
                continue; // it left since this entry was pushed
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
