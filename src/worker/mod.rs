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
//! KV blocks come from a [`PrefixCache`]: with automatic prefix caching a
//! request admitted without fetched KV first takes the longest resident
//! prefix of its block hashes (at most `(T − 1) / block_size` blocks, since
//! the last token is always computed); computed full blocks are registered as
//! soon as their prefill chunk ends, output blocks when the request finishes;
//! a finished or preempted request's blocks stay cached and evictable.
//!
//! KV fetches (run by the cluster) start only for requests within the first
//! `io_slots` places of the waiting queue, each under an I/O slot (Opal's
//! I/O slots / `max_kvc_ready_requests`): loading the next requests overlaps
//! computing the current ones, and the GPU memory that loaded-but-waiting
//! requests hold stays bounded. A request being fetched is skipped by
//! admission; once loaded it holds its blocks until admitted. In `pipelined`
//! mode the slot is returned when the fetch ends; in `single_stage` mode
//! every request takes a slot (at its fetch, or at admission) and keeps it
//! until it finishes, so at most `min(io_slots, gpu_slots)` requests are in
//! processing.
//!
//! Liveness: when nothing is running the cache's TTL protection yields, and
//! a request holding loaded blocks may go ahead of a head that does not fit,
//! so a worker never stalls on memory it could free.

pub mod perf;
pub mod presets;

use crate::engine::Version;
use crate::ids::{RequestId, WorkerId};
use crate::kvcache::{PrefixCache, Tier};
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
    /// Automatic prefix caching on the GPU.
    pub prefix_caching: bool,
    /// Time a cached block stays unevictable after its last use.
    pub apc_ttl: SimDuration,
    /// KV events (and eviction reports) are made for blocks ending a chunk of this many blocks.
    pub event_stride: u32,
    /// Report evicted chunk-ending blocks (for write-back to the tiers).
    pub report_evictions: bool,
    /// Publish KV events (for a KV-aware router).
    pub publish_events: bool,
    /// Step-time model.
    pub perf: PerfModel,
}

impl WorkerConfig {
    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: u64) -> u64 {
        tokens.div_ceil(self.block_size)
    }

    /// Most leading blocks of a `num_tokens`-token sequence that may come
    /// from a cache (its last token is always computed).
    pub fn max_hit_blocks(&self, num_tokens: u64) -> usize {
        (num_tokens.saturating_sub(1) / self.block_size) as usize
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
    /// Requests that produced their last token (their blocks are released;
    /// `computed` still says how many tokens they held).
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
    /// Waiting for the scheduler (vLLM's waiting queue), FIFO.
    ready: VecDeque<RequestId>,
    /// Running requests still prefilling, in admission order.
    prefilling: Vec<RequestId>,
    decode: DecodeGroup,
    io_in_use: u32,
    cache: PrefixCache,
    step: Option<Step>,
    version: Version,
    step_index: u64,
    admit_counter: u64,
    chunks: Vec<(RequestId, PrefillChunk)>,
    perf_chunks: Vec<PrefillChunk>,
    busy: SimDuration,
    steps: u64,
    preemptions: u64,
    /// The ready head that did not fit, and the cache epoch then: it is not
    /// retried until memory was freed.
    blocked_head: Option<(RequestId, u64)>,
}

impl Worker {
    /// An idle worker with an empty block pool.
    pub fn new(id: WorkerId, cfg: &WorkerConfig) -> Worker {
        let mut cache = PrefixCache::new(cfg.total_blocks, cfg.prefix_caching, cfg.apc_ttl);
        cache.record(cfg.publish_events, cfg.report_evictions, cfg.event_stride);
        Worker {
            id,
            ready: VecDeque::new(),
            prefilling: Vec::new(),
            decode: DecodeGroup::new(cfg.block_size),
            io_in_use: 0,
            cache,
            step: None,
            version: Version::default(),
            step_index: 0,
            admit_counter: 0,
            chunks: Vec::new(),
            perf_chunks: Vec::new(),
            busy: SimDuration::ZERO,
            steps: 0,
            preemptions: 0,
            blocked_head: None,
        }
    }

    /// Its id.
    pub fn id(&self) -> WorkerId {
        self.id
    }

    /// Requests waiting (including those being fetched), not yet running.
    pub fn waiting(&self) -> usize {
        self.ready.len()
    }

    /// Requests in the running batch.
    pub fn running(&self) -> usize {
        self.prefilling.len() + self.decode.len()
    }

    /// KV blocks in use (neither free nor cached-evictable).
    pub fn used_blocks(&self) -> u64 {
        self.cache.used()
    }

    /// The GPU prefix cache (the cluster allocates fetch targets in it and drains its events).
    pub fn cache_mut(&mut self) -> &mut PrefixCache {
        &mut self.cache
    }

    /// Start of the step in flight, if any.
    pub fn step_start(&self) -> Option<SimTime> {
        self.step.as_ref().map(|s| s.start)
    }

    /// Total time spent computing finished steps.
    pub fn busy_time(&self) -> SimDuration {
        self.busy
    }

    /// Time spent computing up to `now`, the step in flight included.
    pub fn busy_at(&self, now: SimTime) -> SimDuration {
        self.busy + self.step_start().map_or(SimDuration(0), |s| now.saturating_since(s))
    }

    /// Steps run.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Preemptions so far.
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Accepts a routed request into the waiting queue.
    pub fn enqueue(&mut self, id: RequestId) {
        self.ready.push_back(id);
    }

    /// Waiting requests whose prefix should be searched in the tiers now:
    /// within the first `io_slots` places of the queue, not searched yet,
    /// holding no blocks — and none at all when every I/O slot is taken.
    pub fn fetch_candidates(&self, reqs: &[Request], cfg: &WorkerConfig) -> Vec<RequestId> {
        if self.io_in_use >= cfg.io_slots {
            return Vec::new();
        }
        self.ready
            .iter()
            .take(cfg.io_slots as usize)
            .copied()
            .filter(|id| {
                let seq = &reqs[id.index()].seq;
                !seq.tiers_checked && !seq.fetching && seq.computed == 0
            })
            .collect()
    }

    /// A fetch starts for waiting request `id` (its blocks already allocated
    /// and `computed` set): it takes an I/O slot.
    pub fn begin_fetch(&mut self, id: RequestId, reqs: &mut [Request]) {
        let seq = &mut reqs[id.index()].seq;
        seq.fetching = true;
        if !seq.holds_io_slot {
            seq.holds_io_slot = true;
            self.io_in_use += 1;
        }
    }

    /// Whether another fetch may start.
    pub fn io_slot_free(&self, cfg: &WorkerConfig) -> bool {
        self.io_in_use < cfg.io_slots
    }

    /// The request's KV fetch finished: the loaded blocks join the prefix
    /// cache (still held by the request, which stays in the waiting queue
    /// until admitted); in pipelined mode it returns its I/O slot.
    pub fn fetched(&mut self, id: RequestId, now: SimTime, reqs: &mut [Request], cfg: &WorkerConfig) {
        reqs[id.index()].seq.fetching = false;
        self.register_blocks(id, now, reqs, cfg);
        if cfg.slot_mode == SlotMode::Pipelined {
            self.release_io_slot(id, reqs);
        }
    }

    fn release_io_slot(&mut self, id: RequestId, reqs: &mut [Request]) {
        let seq = &mut reqs[id.index()].seq;
        if seq.holds_io_slot {
            seq.holds_io_slot = false;
            self.io_in_use -= 1;
        }
    }

    /// Plans a step at `now` if the worker is idle and has work; returns its end and stamp.
    pub fn try_start(&mut self, now: SimTime, reqs: &mut [Request], cfg: &WorkerConfig) -> Option<(SimTime, u32)> {
        if self.step.is_some() { None } else { self.plan_step(now, reqs, cfg) }
    }

    /// Ends the step stamped `version` at `now` and fills `out` with what it
    /// produced. The worker is then idle: the caller starts KV fetches for
    /// the head of the queue and then plans the next step ([`Self::try_start`]).
    pub fn finish_step(
        &mut self,
        now: SimTime,
        version: u32,
        reqs: &mut [Request],
        cfg: &WorkerConfig,
        out: &mut StepOutcome,
    ) -> Result<(), StaleStep> {
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
            self.complete(now, id, reqs, cfg, out);
        }

        // Prefill chunks.
        let mut chunks = std::mem::take(&mut self.chunks);
        for &(id, chunk) in &chunks {
            let r = &mut reqs[id.index()];
            let n = chunk.end - chunk.cached;
            r.seq.computed = chunk.end;
            r.prefill_tokens_computed += n;
            out.prompt_tokens += n;
            self.register_blocks(id, now, reqs, cfg);
            let r = &mut reqs[id.index()];
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
                self.complete(now, id, reqs, cfg, out);
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
        Ok(())
    }

    /// Registers the request's newly computed full blocks in the prefix cache.
    fn register_blocks(&mut self, id: RequestId, now: SimTime, reqs: &mut [Request], cfg: &WorkerConfig) {
        let r = &mut reqs[id.index()];
        let full = ((r.seq.computed / cfg.block_size) as usize).min(r.blocks.len());
        let from = r.seq.registered as usize;
        if from < full && self.cache.enabled() {
            r.seq.path = self.cache.extend(r.seq.path, &r.blocks[from..full], from as u32, now);
            r.seq.registered = full as u64;
        }
    }

    /// Returns every block the request holds to the pool (cached ones stay evictable).
    fn release_blocks(&mut self, id: RequestId, now: SimTime, reqs: &mut [Request], cfg: &WorkerConfig) {
        let r = &mut reqs[id.index()];
        self.cache.release(r.seq.path, now);
        self.cache.free_private(cfg.blocks_for(r.seq.computed) - r.seq.registered);
        r.seq.path = crate::kvcache::Path::NONE;
        r.seq.registered = 0;
    }

    /// A request produced its last token: its output blocks are cached and
    /// all its blocks and its slot released.
    fn complete(
        &mut self,
        now: SimTime,
        id: RequestId,
        reqs: &mut [Request],
        cfg: &WorkerConfig,
        out: &mut StepOutcome,
    ) {
        reqs[id.index()].finished = Some(now);
        self.register_blocks(id, now, reqs, cfg);
        self.release_blocks(id, now, reqs, cfg);
        self.release_io_slot(id, reqs);
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
            if self.cache.can_allocate(need, now, false) {
                self.cache.allocate(need, now, false);
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
            if !self.cache.can_allocate(need, now, false) {
                let victim = self.least_work_victim(i, s, reqs, false).expect("the requester itself is a candidate");
                self.preempt(now, victim, s, reqs, cfg);
                continue; // re-examine position i (the requester, or whoever moved there)
            }
            self.cache.allocate(need, now, false);
            self.chunks.push((id, PrefillChunk { cached: seq.computed, end: seq.computed + chunk }));
            budget -= chunk;
            i += 1;
        }

        // 3. Admit waiting requests in FIFO order — unless this step preempted
        //    someone and still has work (vLLM v1 does not admit in a step that
        //    had to preempt; a step left empty by preemption admits, or the
        //    worker would idle with work queued).
        if self.preemptions == preempted_before || (decodes == 0 && self.chunks.is_empty()) {
            self.admit(now, &mut budget, reqs, cfg);
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

    /// Admits ready requests in FIFO order while sequences, budget and
    /// blocks last. A request first takes its longest cached prefix; at its
    /// first admission those hits are attributed to the tiers its fetch read
    /// them from (what was fetched but evicted since is recomputed, and not
    /// counted as a hit).
    fn admit(&mut self, now: SimTime, budget: &mut u64, reqs: &mut [Request], cfg: &WorkerConfig) {
        // When nothing runs, the TTL yields so the worker cannot stall.
        let idle = self.running() == 0;
        if !idle
            && let (Some(&head), Some((blocked, epoch))) = (self.ready.front(), self.blocked_head)
            && head == blocked
            && epoch == self.cache.epoch()
            && cfg.apc_ttl.0 == 0
        {
            return; // nothing was freed since the head last failed to fit
        }
        let mut pos = 0;
        while self.running() < cfg.max_running as usize && *budget > 0 && pos < self.ready.len() {
            let id = self.ready[pos];
            let r = &mut reqs[id.index()];
            if r.seq.fetching {
                pos += 1; // not loaded yet; later requests may go ahead
                continue;
            }
            if cfg.slot_mode == SlotMode::SingleStage && !r.seq.holds_io_slot {
                if self.io_in_use >= cfg.io_slots {
                    break;
                }
                r.seq.holds_io_slot = true;
                self.io_in_use += 1;
            }
            // A request holding loaded blocks brings them.
            let holding = r.seq.computed > 0;
            let hit = if holding {
                (r.seq.computed / cfg.block_size) as usize
            } else {
                let max = cfg.max_hit_blocks(r.seq.num_tokens).min(r.blocks.len());
                self.cache.lookup(&r.blocks[..max])
            };
            let c = if holding { r.seq.computed } else { hit as u64 * cfg.block_size };
            let remaining = r.seq.num_tokens - c;
            let chunk = remaining.min(*budget);
            let need = cfg.blocks_for(c + chunk) - cfg.blocks_for(c);
            // Taking the hit blocks can only shrink what is allocatable, so a
            // request that does not fit now is not worth taking them for.
            let mut fits = (cfg.chunked_prefill || chunk == remaining) && self.cache.can_allocate(need, now, idle);
            if fits && !holding {
                r.seq.path = self.cache.acquire(&r.blocks, hit, now);
                r.seq.registered = hit as u64;
                r.seq.computed = c;
                fits = self.cache.can_allocate(need, now, idle);
                if !fits {
                    self.release_blocks(id, now, reqs, cfg);
                    reqs[id.index()].seq.computed = 0;
                }
            }
            if !fits {
                if cfg.slot_mode == SlotMode::SingleStage && !holding {
                    self.release_io_slot(id, reqs);
                }
                if pos == 0 {
                    self.blocked_head = Some((id, self.cache.epoch()));
                }
                // Requests that hold loaded blocks may go ahead of a request
                // that does not fit: they need least and free most.
                pos += 1;
                while pos < self.ready.len() && reqs[self.ready[pos].index()].seq.computed == 0 {
                    pos += 1;
                }
                continue;
            }
            self.ready.remove(pos);
            self.cache.allocate(need, now, idle);
            let r = &mut reqs[id.index()];
            r.seq.admit_seq = self.admit_counter;
            self.admit_counter += 1;
            if r.first_scheduled.is_none() {
                r.first_scheduled = Some(now);
                attribute_hits(r, hit as u64, cfg.block_size);
            }
            self.prefilling.push(id);
            self.chunks.push((id, PrefillChunk { cached: c, end: c + chunk }));
            *budget -= chunk;
        }
    }

    /// The running request with the least work done (fewest computed tokens;
    /// ties: the latest admitted) among the prefilling requests from position
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
        if reqs[id.index()].seq.decode.active {
            let (computed, generated) = self.decode.leave(id, s, reqs);
            let seq = &mut reqs[id.index()].seq;
            seq.computed = computed;
            seq.generated = generated;
            seq.num_tokens = computed + 1;
            seq.last_token_at = now;
        } else {
            let pos = self.prefilling.iter().position(|&p| p == id).expect("victim is running");
            self.prefilling.remove(pos);
        }
        self.release_blocks(id, now, reqs, cfg);
        let r = &mut reqs[id.index()];
        r.seq.computed = 0;
        r.seq.tiers_checked = false;
        r.preemptions += 1;
        self.preemptions += 1;
        self.ready.push_front(id);
    }
}

/// Credits a request's first `hit` cached blocks to tiers: blocks before its
/// fetch's start were already in the GPU; the fetched ones to the tiers they
/// came from, in order; any beyond (computed meanwhile by others) to the GPU.
fn attribute_hits(r: &mut Request, hit: u64, block_size: u64) {
    let mut left = hit;
    let (start, runs) = match &r.fetched {
        Some((start, runs)) => (*start, runs.as_slice()),
        None => (hit, &[][..]),
    };
    let gpu_before = left.min(start);
    r.hit_tokens[Tier::Gpu.index()] += gpu_before * block_size;
    left -= gpu_before;
    for &(tier, n) in runs {
        let k = left.min(n);
        r.hit_tokens[tier.index()] += k * block_size;
        left -= k;
    }
    r.hit_tokens[Tier::Gpu.index()] += left * block_size;
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
    use crate::kvcache::{Content, block_hashes, content_id};
    use crate::workload::{Label, NewRequest};

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
            prefix_caching: true,
            apc_ttl: SimDuration::ZERO,
            event_stride: 16,
            report_evictions: false,
            publish_events: false,
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

    /// Requests `(prompt, output)` with unique content (content key `key + i`), hashed.
    fn arena_keyed(specs: &[(u32, u32)], key: impl Fn(usize) -> u64) -> Vec<Request> {
        specs
            .iter()
            .enumerate()
            .map(|(i, &(p, o))| {
                let mut content = Content::default();
                content.push(content_id("test", key(i)), p);
                let new = NewRequest {
                    stage: StageId(0),
                    prompt_tokens: p,
                    output_tokens: o,
                    content,
                    output_id: content_id("output", i as u64),
                    label: Label::None,
                };
                let mut r = Request::new(RequestId(i as u32), SimTime::ZERO, new);
                block_hashes(&r.full_content(), 16, usize::MAX, &mut r.blocks);
                r
            })
            .collect()
    }

    fn arena(specs: &[(u32, u32)]) -> Vec<Request> {
        arena_keyed(specs, |i| i as u64)
    }

    /// What the cluster does without tiers: enqueue, then plan if idle.
    fn submit(
        w: &mut Worker,
        now: SimTime,
        id: u32,
        reqs: &mut [Request],
        cfg: &WorkerConfig,
    ) -> Option<(SimTime, u32)> {
        w.enqueue(RequestId(id));
        w.try_start(now, reqs, cfg)
    }

    /// Runs the worker's steps to completion; returns (end time, decodes) per step.
    fn drain(
        w: &mut Worker,
        mut next: Option<(SimTime, u32)>,
        reqs: &mut [Request],
        cfg: &WorkerConfig,
    ) -> Vec<(SimTime, u64)> {
        let mut out = StepOutcome::default();
        let mut log = Vec::new();
        while let Some((t, v)) = next {
            w.finish_step(t, v, reqs, cfg, &mut out).expect("current step");
            log.push((t, out.decodes));
            next = w.try_start(t, reqs, cfg);
        }
        log
    }

    #[test]
    fn batch_of_decodes_takes_the_hand_computed_step_time() {
        let cfg = toy(1000, 8);
        let mut reqs = arena(&[(20, 3), (30, 3), (50, 3)]);
        let mut w = Worker::new(WorkerId(0), &cfg);
        let first = submit(&mut w, SimTime::ZERO, 0, &mut reqs, &cfg);
        // Step 0 prefills request 0 alone (it is the only one queued when the worker was idle):
        // prefill 20 × 100 µs = 2 ms; decode part = 1 ms weights; max → 2 ms.
        assert_eq!(first.unwrap().0, SimTime(2_000_000));
        assert!(submit(&mut w, SimTime::ZERO, 1, &mut reqs, &cfg).is_none());
        assert!(submit(&mut w, SimTime::ZERO, 2, &mut reqs, &cfg).is_none());
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
        assert_eq!(w.used_blocks(), 0, "every block is returned (cached ones stay evictable)");
    }

    #[test]
    fn chunked_prefill_splits_a_long_prompt_by_the_token_budget() {
        let mut cfg = toy(1000, 8);
        cfg.token_budget = 400;
        let mut reqs = arena(&[(1000, 1)]);
        let mut w = Worker::new(WorkerId(0), &cfg);
        let first = submit(&mut w, SimTime::ZERO, 0, &mut reqs, &cfg);
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
        let mut cfg = toy(5, 8);
        cfg.prefix_caching = false;
        let mut reqs = arena(&[(16, 40), (16, 40)]);
        let mut w = Worker::new(WorkerId(0), &cfg);
        let first = submit(&mut w, SimTime::ZERO, 0, &mut reqs, &cfg);
        assert!(submit(&mut w, SimTime::ZERO, 1, &mut reqs, &cfg).is_none());
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
        assert_eq!(w.used_blocks(), 0);
    }

    #[test]
    fn a_second_request_with_the_same_prompt_prefills_only_past_the_cached_prefix() {
        // Both prompts are 100 tokens of the same content: 6 full blocks (96 tokens).
        let cfg = toy(1000, 8);
        let mut reqs = arena_keyed(&[(100, 2), (100, 2)], |_| 7);
        let mut w = Worker::new(WorkerId(0), &cfg);
        let first = submit(&mut w, SimTime::ZERO, 0, &mut reqs, &cfg);
        drain(&mut w, first, &mut reqs, &cfg);
        let t = reqs[0].finished.unwrap();
        let second = submit(&mut w, t, 1, &mut reqs, &cfg);
        drain(&mut w, second, &mut reqs, &cfg);
        // The first computed all 100 prompt tokens; the second reuses 6 blocks and computes 4.
        assert_eq!(reqs[0].prefill_tokens_computed, 100);
        assert_eq!(reqs[1].prefill_tokens_computed, 4);
        assert_eq!(reqs[1].hit_tokens[Tier::Gpu.index()], 96);
        assert_eq!(reqs[1].hit_tokens.iter().sum::<u64>(), 96);
        // Its prefill step: 4 tokens × 100 µs = 0.4 ms < 1 ms of weights → 1 ms.
        assert_eq!(reqs[1].first_token.unwrap() - t, SimDuration(1_000_000));
    }

    #[test]
    fn a_fully_cached_prompt_still_computes_its_last_token() {
        let cfg = toy(1000, 8);
        // 64-token prompts: 4 full blocks, but at most (64 − 1) / 16 = 3 may hit.
        let mut reqs = arena_keyed(&[(64, 1), (64, 1)], |_| 9);
        let mut w = Worker::new(WorkerId(0), &cfg);
        let first = submit(&mut w, SimTime::ZERO, 0, &mut reqs, &cfg);
        drain(&mut w, first, &mut reqs, &cfg);
        let second = submit(&mut w, reqs[0].finished.unwrap(), 1, &mut reqs, &cfg);
        drain(&mut w, second, &mut reqs, &cfg);
        assert_eq!(reqs[1].hit_tokens[Tier::Gpu.index()], 48);
        assert_eq!(reqs[1].prefill_tokens_computed, 16);
    }

    #[test]
    fn hits_are_credited_to_the_tier_each_block_was_fetched_from() {
        let mut r = arena(&[(1000, 1)]).remove(0);
        // 10 blocks were already in the GPU; the fetch read 5 from CPU memory and 3 from the DFS.
        r.fetched = Some((10, vec![(Tier::Cpu, 5), (Tier::Dfs, 3)]));
        attribute_hits(&mut r, 16, 16);
        // 16 hit blocks: 10 GPU, 5 CPU, 1 DFS (two DFS blocks were evicted before admission).
        assert_eq!(r.hit_tokens, [160, 80, 0, 16]);
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
        let first = submit(&mut w, SimTime::ZERO, 0, &mut reqs, &cfg);
        for i in 1..4 {
            submit(&mut w, SimTime::ZERO, i, &mut reqs, &cfg);
        }
        // After the first step both slot holders run; the others wait for a slot.
        let mut out = StepOutcome::default();
        let (t, v) = first.unwrap();
        w.finish_step(t, v, &mut reqs, &cfg, &mut out).unwrap();
        let next = w.try_start(t, &mut reqs, &cfg);
        assert_eq!((w.running(), w.waiting()), (2, 2));
        drain(&mut w, next, &mut reqs, &cfg);
        // Requests 2 and 3 start only after 0 and 1 finish.
        assert!(reqs[2].first_scheduled.unwrap() >= reqs[0].finished.unwrap());
        assert!(reqs.iter().all(|r| r.finished.is_some()));
    }
}
