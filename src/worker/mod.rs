//! A vLLM v1-style worker: continuous batching with a token budget,
//! chunked prefill, a paged KV block pool, preemption by recompute, and a KV
//! connector for the tiers below the GPU.
//!
//! Each scheduler step is **one event**. Planning a step (vLLM's
//! `Scheduler.schedule()` in `vllm/v1/core/sched/scheduler.py`): all decoding
//! sequences get one token each; then running requests still prefilling get
//! a chunk, in admission order, while the token budget lasts; then the
//! waiting queue is walked in FIFO order (below). When blocks run out for a
//! running request, the running request with the least work done (fewest
//! computed tokens; ties: the latest admitted) among those not yet scheduled
//! in this step is preempted: its blocks are freed, it loses its computed
//! tokens and re-enters the front of the queue to recompute its prompt and
//! the tokens it has generated. A step that had to preempt leaves the
//! waiting queue alone.
//!
//! The waiting queue, as vLLM walks it with a KV connector
//! (`../shared/notes/vllm-kv-connector.md`). For each request in order:
//!
//! - **Loading** (vLLM's `WAITING_FOR_REMOTE_KVS`): skipped; later requests
//!   may go ahead.
//! - **Loaded** (it holds the blocks its load filled): admitted if its next
//!   prefill chunk fits; if not, it keeps its blocks and its place, and the
//!   new requests behind it wait.
//! - **New, or preempted** (it holds nothing): what it already has is looked
//!   up — the longest GPU prefix-cache hit (at most `(T − 1) / block_size`
//!   blocks, since the last token is always computed), then
//!   [`KvConnector::lookup`] for the tokens beyond it that the tiers hold.
//!   With tier hits it needs to be within the first `io_slots` places of
//!   the queue, fewer than `io_slots` waiting requests holding KV, an I/O
//!   slot, and GPU blocks for the hit tokens (vLLM's
//!   `allocate_slots(num_external_computed_tokens)`); it then starts loading
//!   and stays in the queue. Without, it is admitted with its GPU hit if its
//!   first chunk fits. Either way, if what it needs is not there it **stays
//!   waiting and every new request behind it waits too** (vLLM `break`s): it
//!   is never admitted to recompute a prefix a tier holds. Requests holding
//!   loaded KV behind it may still go ahead — they need least and free most.
//!
//! Loads also start between step ends (when a request arrives or a load
//! finishes): Opal's I/O stage runs beside the GPU, so loading the next
//! requests overlaps computing the current ones. Such a pass admits nobody.
//!
//! **I/O slots** (Opal's I/O slots and `max_kvc_ready_requests`): loads start
//! only for requests within the first `io_slots` places of the waiting queue
//! and while fewer than `io_slots` waiting requests hold loading or loaded
//! KV — the GPU memory they hold stays bounded — and each load takes an I/O
//! slot. In
//! `pipelined` mode the slot is returned when the load finishes. In
//! `single_stage` mode every request takes one (at its load, or at
//! admission) and keeps it until it finishes, so at most `min(io_slots,
//! gpu_slots)` requests are in processing.
//!
//! A load starts only when the blocks of its first chunk would fit too,
//! beside those the KV-holding requests ahead of it will need for theirs
//! (vLLM allocates the loaded tokens' and the first chunk's blocks in one
//! `allocate_slots` call), and a loaded request waiting for blocks holds
//! back the new requests behind it (vLLM `break`s there).
//!
//! Progress under KV pressure — rules vLLM lacks, without which a worker
//! with a tier can preempt and reload one request forever, or stop with work
//! queued (see `Worker::room`): when a running request needs blocks,
//! waiting requests holding loaded KV give theirs up (the last first, each
//! counted as a preemption) before any running request is preempted; the
//! only running request is not preempted for blocks that loads in flight
//! hold (the worker waits for them); a plan whose preemptions leave nothing
//! running starts over, as vLLM's next `schedule()` would; when nothing is
//! running the cache's TTL protection yields; and when nothing runs or loads
//! while requests holding loaded KV cannot start (each needs blocks another
//! holds), the last of them gives its blocks up. A run in which nothing is
//! left to happen while requests wait ends with [`crate::RunError::Stalled`].
//!
//! Decoding sequences are not touched one by one per step: the
//! [`DecodeGroup`] advances them arithmetically from the worker's step
//! counter, so a decode step costs O(1) plus O(log n) per completion.
//!
//! KV blocks come from a [`PrefixCache`]: computed full blocks are
//! registered as soon as their prefill chunk ends, loaded ones when their
//! load finishes, output blocks when the request finishes; a finished or
//! preempted request's blocks stay cached and evictable (tail first).

mod accounting;
pub mod data_parallel;
mod decode_run;
pub mod model;
pub mod perf;
pub mod pipeline;
pub mod power;
pub mod presets;
mod scheduler;
pub mod speculative;

use accounting::{StepCounts, StepLog};
pub use decode_run::DecodeGroup;
use scheduler::{Room, WaitingQueue};

use crate::engine::Version;
use crate::ids::{RequestId, WorkerId};
use crate::kvcache::{ConnectorOutput, KvConnector, PrefixCache};
use crate::metrics::{PeakSeconds, StepSpan};
use crate::request::{PdPhase, Request, RequestStatus};
use crate::time::{SimDuration, SimTime};
use data_parallel::DataParallel;
use perf::{PrefillChunk, Roofline, StepModel, StepWork};
use pipeline::Pipeline;
use power::PowerModel;
use speculative::Speculative;

/// How I/O slots are held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotMode {
    /// While the request's KV load runs.
    Pipelined,
    /// From the start of its load (or its admission) until it finishes.
    SingleStage,
}

/// Which vLLM scheduler a worker runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheduler {
    /// vLLM v1 (`vllm/v1/core/sched/scheduler.py`): every step gives each
    /// decoding sequence a token, then prefill chunks share the token budget.
    V1,
    /// vLLM v0 (`vllm/core/scheduler.py`). With chunked prefill off,
    /// `_schedule_default`: prefills first (the waiting queue in FIFO order,
    /// whole prompts within the token budget) and "don't schedule decodes if
    /// prefills are scheduled": a step is prefill-only or decode-only. With
    /// it on, `_schedule_chunked_prefill`: the decodes, then the running
    /// prefills' chunks, then new prefills, in one step. Prompts are
    /// admitted while the free blocks stay above a 1 % watermark
    /// (`BlockSpaceManager.can_allocate`), and preemption (by recompute)
    /// takes the last of the running queue (`running_queue.pop()`).
    V0,
}

/// Resolved worker settings (identical for every worker of a run).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerConfig {
    /// Most sequences in the running batch (min of `max_num_seqs` and `gpu_slots`).
    pub max_running: u32,
    /// The scheduler.
    pub scheduler: Scheduler,
    /// Blocks a new prompt's admission must leave free (v0's watermark; 0 for v1).
    pub admission_watermark: u64,
    /// Token budget per step (`max_num_batched_tokens`, with chunked prefill on or off).
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
    pub perf: StepModel,
    /// The model on this GPU as the roofline counts it, for what steps ask
    /// of the GPU ([`Roofline::peak_seconds`]) whatever `perf` is.
    pub usage: Roofline,
    /// The model's sliding window, tokens (windowed layers read at most this much KV).
    pub sliding_window: Option<u64>,
    /// The GPU's power model (energy per step).
    pub power: PowerModel,
    /// Pipeline stages (`None`: one; then a step is priced by `perf` alone).
    pub pipeline: Option<Pipeline>,
    /// Speculative decoding (`None`: off).
    pub speculative: Option<Speculative>,
    /// Data-parallel attention (`None`: off): the worker is one rank of a
    /// group stepping together, and the group prices its steps.
    pub data_parallel: Option<DataParallel>,
}

impl WorkerConfig {
    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: u64) -> u64 {
        tokens.div_ceil(self.block_size)
    }

    /// Pipeline stages (1 without pipeline parallelism).
    pub fn stages(&self) -> u32 {
        self.pipeline.as_ref().map_or(1, |p| p.stages() as u32)
    }

    /// A step's duration and what it asks of each GPU: `perf`'s price, or
    /// with pipeline stages a round's ([`Pipeline::price`]). `finishing(i)`:
    /// whether prefill chunk `i` ends its sequence's context.
    /// With speculative decoding, the drafter's passes over the sequences
    /// that sample are added ([`Speculative::draft`]).
    pub fn price(&self, work: &StepWork<'_>, finishing: impl Fn(usize) -> bool) -> (SimDuration, PeakSeconds) {
        let (t, peak) = match &self.pipeline {
            None => (self.perf.step_time(work), self.usage.peak_seconds(work)),
            Some(p) => p.price(&self.perf, &self.usage, work, finishing),
        };
        match &self.speculative {
            None => (t, peak),
            Some(sp) => with_drafter(sp, work, t, peak),
        }
    }

    /// Most leading blocks of a `num_tokens`-token sequence that may come
    /// from a cache (its last token is always computed).
    pub fn max_hit_blocks(&self, num_tokens: u64) -> usize {
        (num_tokens.saturating_sub(1) / self.block_size) as usize
    }
}

/// A step's price with the drafter's passes added (out of the way of the
/// steps without speculation).
#[cold]
#[inline(never)]
fn with_drafter(
    sp: &Speculative,
    work: &StepWork<'_>,
    t: SimDuration,
    mut peak: PeakSeconds,
) -> (SimDuration, PeakSeconds) {
    let (dt, dp) = sp.draft(work);
    peak += dp;
    (t + dt, peak)
}

/// What a finished step produced (filled by [`Worker::finish_step`]).
#[derive(Debug, Default)]
pub struct StepOutcome {
    /// How long the step took.
    pub duration: SimDuration,
    /// Sequences that decoded one token in it.
    pub decodes: u64,
    /// Of those, the ones whose inter-token gap is the step's `duration`
    /// (all of them, unless the decoders sat out a pause before it).
    pub gaps_of_duration: u64,
    /// Of those, after a pause (vLLM v0's prefill-only steps, during which
    /// the decoders wait), the ones that waited the whole pause: their gap
    /// is [`Self::pause_gap`] (one HDR record of that many, not one each).
    pub gaps_of_pause: u64,
    /// The gap of a decoder that waited through the whole pause: from the
    /// pause's start to the step's end.
    pub pause_gap: SimDuration,
    /// Requests whose first token came out of this step.
    pub first_tokens: Vec<RequestId>,
    /// Every other inter-token gap a token of this step closed: those of
    /// recomputed (previously preempted) requests, and after a pause each
    /// decoder's that joined during it, from its last token (as `vllm bench
    /// serve` measures ITL).
    pub gaps: Vec<SimDuration>,
    /// Requests prefilled elsewhere whose decode worker produced its first
    /// token in this step (the client's first token), with the time since
    /// the prefill worker's token. Not inter-token gaps: the client's tokens
    /// start here.
    pub first_decodes: Vec<(RequestId, SimDuration)>,
    /// Requests that produced their last token (their blocks are released;
    /// `computed` still says how many tokens they held).
    pub completed: Vec<RequestId>,
    /// Requests that computed a prefill chunk in this step, with the tokens
    /// they then have computed (in step order).
    pub prefilled: Vec<(RequestId, u64)>,
    /// Prompt tokens computed (prefill work, including recomputation).
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// What the step asked of the GPU.
    pub peak: PeakSeconds,
}

impl StepOutcome {
    fn clear(&mut self) {
        self.duration = SimDuration::ZERO;
        self.decodes = 0;
        self.gaps_of_duration = 0;
        self.gaps_of_pause = 0;
        self.first_tokens.clear();
        self.gaps.clear();
        self.first_decodes.clear();
        self.completed.clear();
        self.prefilled.clear();
        self.prompt_tokens = 0;
        self.generated_tokens = 0;
        self.peak = PeakSeconds::default();
    }
}

/// A step that was planned and has not ended yet: one step, or a run of
/// decode-only sub-steps (see [`Worker::materialize`]) of which the one in
/// progress started at `start` and the last ends at `end`.
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
    /// The waiting queue and its loads (the scheduler's own state).
    waiting: WaitingQueue,
    /// Running requests still prefilling, in admission order.
    prefilling: Vec<RequestId>,
    decode: DecodeGroup,
    cache: PrefixCache,
    step: Option<Step>,
    version: Version,
    step_index: u64,
    chunks: Vec<(RequestId, PrefillChunk)>,
    perf_chunks: Vec<PrefillChunk>,
    /// Whether each of `perf_chunks` ends its sequence's context (samples).
    perf_finishing: Vec<bool>,
    busy: SimDuration,
    steps: u64,
    /// Step prices computed (see [`Self::priced_steps`]).
    priced: u64,
    /// Preemptions and KV loads so far (for the step log and the workers table).
    counts: StepCounts,
    /// The run of decode sub-steps in flight, if the step is one.
    run: decode_run::Run,
    /// Spans of sub-steps materialised since the caller last took them.
    substeps: Vec<StepSpan>,
    /// What the step (or sub-step) in flight asks of the GPU.
    step_peak: PeakSeconds,
    /// What the steps done so far asked of the GPU.
    peak_total: PeakSeconds,
    /// Joules per GPU of the steps done so far ([`PowerModel::step_joules`]).
    step_j: f64,
    /// The GPU's power model.
    power: PowerModel,
    /// The steps done so far and those planned (when a `steps` table is
    /// kept; boxed, so a worker without one stays small).
    log: Option<Box<StepLog>>,
    /// The start of the first step since the last decoding one that left
    /// the decoders out (v0's prefill-only steps): their last token came then.
    paused_since: Option<SimTime>,
    /// The run's seed (names speculative decoding's acceptance draws).
    seed: u64,
    /// Speculative decoding so far: sequence verifies, and drafts accepted in them.
    spec: (u64, u64),
    /// Scratch: the decoding sequences a verify goes through.
    verified: Vec<RequestId>,
    /// With data-parallel attention, the step planned and not priced yet
    /// (its prefill chunks are `perf_chunks`): the group prices it.
    unpriced: Option<Unpriced>,
}

/// A planned step's work but its prefill chunks (see [`Worker::planned_work`]).
#[derive(Clone, Copy, Debug)]
struct Unpriced {
    decodes: u64,
    drafts: u64,
    context: u64,
    window: u64,
    samples: u64,
}

/// Which part of the waiting-queue walk a pass runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    /// At a step boundary: admit into the running batch, and start loads.
    Admit,
    /// Only start loads (between step ends, or in a step that had to preempt).
    LoadOnly,
}

impl Worker {
    /// An idle worker with an empty block pool.
    pub fn new(id: WorkerId, cfg: &WorkerConfig) -> Worker {
        let mut cache = PrefixCache::new(cfg.total_blocks, cfg.prefix_caching, cfg.apc_ttl);
        cache.record(cfg.publish_events, cfg.report_evictions, cfg.event_stride);
        Worker {
            id,
            waiting: WaitingQueue::default(),
            prefilling: Vec::new(),
            decode: DecodeGroup::new(cfg.block_size, cfg.sliding_window),
            cache,
            step: None,
            version: Version::default(),
            step_index: 0,
            chunks: Vec::new(),
            perf_chunks: Vec::new(),
            perf_finishing: Vec::new(),
            busy: SimDuration::ZERO,
            steps: 0,
            priced: 0,
            counts: StepCounts::default(),
            run: decode_run::Run::default(),
            substeps: Vec::new(),
            step_peak: PeakSeconds::default(),
            peak_total: PeakSeconds::default(),
            step_j: 0.0,
            power: cfg.power,
            log: None,
            paused_since: None,
            seed: 0,
            spec: (0, 0),
            verified: Vec::new(),
            unpriced: None,
        }
    }

    /// The worker of a run seeded `seed` (its speculative decoding's
    /// acceptance draws are named by it).
    pub fn seeded(mut self, seed: u64) -> Worker {
        self.seed = seed;
        self
    }

    /// Speculative decoding so far: sequence verifies, and the drafts
    /// accepted in them (vLLM's `num_drafts` and `num_accepted_tokens`).
    pub fn speculation(&self) -> (u64, u64) {
        self.spec
    }

    /// Its id.
    pub fn id(&self) -> WorkerId {
        self.id
    }

    /// Requests waiting (including those loading KV), not yet running.
    pub fn waiting(&self) -> usize {
        self.waiting.queue.len()
    }

    /// Requests in the running batch.
    pub fn running(&self) -> usize {
        self.prefilling.len() + self.decode.len()
    }

    /// KV blocks in use (neither free nor cached-evictable).
    pub fn used_blocks(&self) -> u64 {
        self.cache.used()
    }

    /// The GPU prefix cache (the cluster drains its events).
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

    /// Step prices computed: one per step priced alone, and for a decode
    /// run the sub-steps its pieces were priced at (work that does not
    /// grow with the run's length).
    pub fn priced_steps(&self) -> u64 {
        self.priced
    }

    /// Preemptions so far (running requests, and loaded ones that had to give their KV up).
    pub fn preemptions(&self) -> u64 {
        self.counts.preemptions
    }

    /// What the worker holds, if it holds any request: for a run that
    /// stopped with requests in the system ([`crate::RunError::Stalled`]).
    pub fn describe_held(&self) -> Option<String> {
        if self.waiting.queue.is_empty() && self.running() == 0 {
            return None;
        }
        Some(format!(
            "worker {} holds {} waiting requests ({} of them holding KV, {} loading) and {} running, {} of {} KV blocks in use",
            self.id.0,
            self.waiting.queue.len(),
            self.waiting.kv_waiting,
            self.waiting.loading,
            self.running(),
            self.cache.used(),
            self.cache.total(),
        ))
    }

    /// Accepts a routed request into the waiting queue.
    pub fn enqueue(&mut self, id: RequestId) {
        self.waiting.queue.push_back(id);
    }

    /// Something changed (a request arrived, a load finished, the worker
    /// went idle): while a step runs, starts the loads that can start; when
    /// idle, plans the next step and returns its end and stamp. Loads it
    /// starts go through `conn`, their effects to `out`.
    #[inline(always)]
    pub fn poll(
        &mut self,
        now: SimTime,
        reqs: &mut [Request],
        cfg: &WorkerConfig,
        conn: &mut KvConnector,
        out: &mut ConnectorOutput,
    ) -> Option<(SimTime, u32)> {
        if self.step.is_none() {
            self.waiting.load_pass = None;
            return self.plan_step(now, reqs, cfg, conn, out);
        }
        // A run of decode steps stops at the next step end when there is
        // something to admit there.
        self.materialize(now, true, cfg);
        let next = if self.waiting.queue.is_empty() { None } else { self.cut() };
        self.start_loads(now, reqs, cfg, conn, out);
        next
    }

    /// Starts the loads that can start, admitting nobody (what [`Self::poll`]
    /// does while a step runs; with data-parallel attention, also what an
    /// idle rank does while its group's step runs).
    #[inline]
    pub fn start_loads(
        &mut self,
        now: SimTime,
        reqs: &mut [Request],
        cfg: &WorkerConfig,
        conn: &mut KvConnector,
        out: &mut ConnectorOutput,
    ) {
        if !conn.has_tiers(self.id) || self.waiting.load_pass == Some(self.slot_view()) {
            return;
        }
        let stopped_early = self.schedule_waiting(now, Pass::LoadOnly, &mut 0, reqs, cfg, conn, out);
        self.waiting.load_pass = stopped_early.then(|| self.slot_view());
    }

    /// The stamp of the step in flight (with data-parallel attention, the
    /// group ends every rank's step at its first rank's event).
    pub fn stamp(&self) -> u32 {
        self.version.current()
    }

    /// With data-parallel attention, the work of the step planned and not
    /// priced yet — none for a rank with nothing planned (it runs a dummy
    /// batch: its rows are the group's padding).
    pub fn planned_work(&self) -> StepWork<'_> {
        match self.unpriced {
            Some(u) => StepWork {
                prefill: &self.perf_chunks,
                decodes: u.decodes,
                drafts: u.drafts,
                decode_context_tokens: u.context,
                decode_window_tokens: u.window,
                samples: u.samples,
            },
            None => StepWork::decode(0, 0, 0),
        }
    }

    /// With data-parallel attention, the group has priced its step: this
    /// rank's ends at `end` — the one it planned, or with nothing planned a
    /// dummy batch, as vLLM's idle ranks run `execute_dummy_batch` while
    /// their group has work. Returns the step's stamp.
    pub fn begin_lockstep(&mut self, now: SimTime, end: SimTime, cfg: &WorkerConfig) -> u32 {
        if let Some(step) = &mut self.step {
            debug_assert!(self.unpriced.is_some() && step.start == now);
            step.end = end;
            self.unpriced = None;
            return self.version.current();
        }
        let idle = StepWork::decode(0, 0, 0);
        self.step_peak = cfg.usage.peak_seconds(&idle);
        self.priced += 1;
        if self.log.is_some() {
            self.log_start(Self::row_of(self.id, &idle, cfg));
        }
        self.perf_chunks.clear();
        self.step = Some(Step { start: now, end, decodes: 0 });
        self.version.bump()
    }

    /// Ends the step stamped `version` at `now` and fills `out` with what it
    /// produced. The worker is then idle: the caller saves the completed
    /// requests' KV and then has it plan the next step ([`Self::poll`]).
    #[inline(always)]
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
        self.materialize(now, false, cfg);
        self.end_run();
        let step = self.step.take().expect("checked above");
        out.clear();
        out.peak = self.step_peak;
        self.peak_total += self.step_peak;
        out.duration = step.end - step.start;
        self.step_j += self.power.step_joules(out.duration.as_secs_f64(), self.step_peak);
        self.log_end(now, out.duration);
        self.busy += out.duration;
        self.steps += 1;
        let s = self.step_index;
        // The decode group's steps are counted by the step index: a v0
        // prefill-only step is not one of them (its decoders wait).
        let decode_step = cfg.scheduler == Scheduler::V1 || step.decodes > 0;

        // Decoders: every member produced one token. Its gap since the last
        // is the step's duration, unless the decoders sat out a pause (v0's
        // prefill-only steps): then each one's own, from its last token.
        out.decodes = step.decodes;
        out.generated_tokens += step.decodes;
        if step.decodes > 0 {
            match self.paused_since.take() {
                None => out.gaps_of_duration = step.decodes,
                Some(p) => {
                    out.pause_gap = now - p;
                    for id in self.decode.members() {
                        match reqs[id.index()].seq.last_token_at {
                            last if last <= p => out.gaps_of_pause += 1,
                            last => out.gaps.push(now - last),
                        }
                    }
                }
            }
        } else if !self.decode.is_empty() {
            // A step without the decoders: they wait from here (or from an earlier such step).
            self.paused_since.get_or_insert(step.start);
        }
        if decode_step {
            self.decode.advance();
            if let Some(sp) = &cfg.speculative {
                out.generated_tokens += self.verify(s, sp, reqs, cfg);
            }
            while let Some(id) = self.decode.pop_finished(s, reqs) {
                self.complete(now, id, reqs, cfg, out);
            }
        }

        // Prefill chunks.
        let mut chunks = std::mem::take(&mut self.chunks);
        for &(id, chunk) in &chunks {
            let r = &mut reqs[id.index()];
            let n = chunk.end - chunk.cached;
            r.seq.computed = chunk.end;
            r.prefill_tokens_computed += n;
            out.prompt_tokens += n;
            out.prefilled.push((id, chunk.end));
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
            } else if let PdPhase::Decode { awaiting_first_step: first @ true } = &mut r.pd {
                *first = false;
                out.first_decodes.push((id, now - r.seq.last_token_at));
                // The client's first token: TTFT and TPOT count from here.
                r.first_token = Some(now);
            } else {
                out.gaps.push(now - r.seq.last_token_at);
            }
            r.seq.last_token_at = now;
            if r.seq.generated >= u64::from(r.output_tokens) {
                self.complete(now, id, reqs, cfg, out);
            } else {
                self.decode.join(id, s + u64::from(decode_step), reqs);
            }
        }
        self.prefilling.retain(|id| reqs[id.index()].seq.status == RequestStatus::Prefilling);
        chunks.clear();
        self.chunks = chunks;
        self.step_index += u64::from(decode_step);
        Ok(())
    }

    /// The verify of step `s` (after every decoder's own token): each
    /// decoder keeps the drafts accepted up to the first rejection — drawn
    /// for it at its position in its output ([`speculative::acceptance_draw`])
    /// — at most all but one of the tokens it has left, and the KV slots
    /// reserved beyond what it keeps are given back (vLLM rolls
    /// `num_computed_tokens` back over the rejected ones). Returns the extra
    /// tokens emitted.
    #[inline(never)]
    fn verify(&mut self, s: u64, sp: &Speculative, reqs: &mut [Request], cfg: &WorkerConfig) -> u64 {
        let mut members = std::mem::take(&mut self.verified);
        members.extend_from_slice(self.decode.members());
        let (mut surplus, mut extra_tokens) = (0, 0);
        for &id in &members {
            // Before step s it had computed `c` and generated `g` tokens.
            let c = self.decode.computed(id, s, reqs);
            let r = &reqs[id.index()];
            let d = r.seq.decode;
            let g = d.generated_at_join + (s - d.join_step);
            let accepted = sp.accepted(speculative::acceptance_draw(self.seed, r.serial, g));
            let extra = accepted.min(u64::from(r.output_tokens) - g - 1);
            self.spec.0 += 1;
            self.spec.1 += accepted;
            surplus += cfg.blocks_for(Self::reserved(c, sp, cfg)) - cfg.blocks_for(c + 1 + extra);
            if extra > 0 {
                let (computed, generated) = self.decode.leave(id, s + 1, reqs);
                let seq = &mut reqs[id.index()].seq;
                seq.computed = computed + extra;
                seq.generated = generated + extra;
                self.decode.join(id, s + 1, reqs);
                extra_tokens += extra;
            }
        }
        self.cache.free_private(surplus);
        members.clear();
        self.verified = members;
        extra_tokens
    }

    /// Tokens a decoder at `c` computed tokens holds slots for in a verify:
    /// its token, the drafts and the drafter's lookahead, at most
    /// `max_model_len` (vLLM's `allocate_slots` caps `num_tokens_need_slot`
    /// there).
    fn reserved(c: u64, sp: &Speculative, cfg: &WorkerConfig) -> u64 {
        (c + sp.reach()).min(cfg.max_model_len.max(c + 1))
    }

    /// New blocks the decoders need for the verify of step `s`.
    #[inline(never)]
    fn verify_blocks(&self, s: u64, sp: &Speculative, reqs: &[Request], cfg: &WorkerConfig) -> u64 {
        let members = self.decode.members().iter();
        members
            .map(|&id| {
                let c = self.decode.computed(id, s, reqs);
                cfg.blocks_for(Self::reserved(c, sp, cfg)) - cfg.blocks_for(c)
            })
            .sum()
    }

    /// Registers the request's newly computed full blocks in the prefix cache.
    fn register_blocks(&mut self, id: RequestId, now: SimTime, reqs: &mut [Request], cfg: &WorkerConfig) {
        let r = &mut reqs[id.index()];
        let full = (r.seq.computed / cfg.block_size).min(r.full_blocks());
        let from = r.seq.registered;
        if from < full && self.cache.enabled() {
            r.seq.path = self.cache.extend(r.seq.path, &r.chains, from, full, now);
            r.seq.registered = full;
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
        let r = &mut reqs[id.index()];
        r.finished = Some(now);
        r.seq.status = RequestStatus::Finished;
        self.register_blocks(id, now, reqs, cfg);
        self.release_blocks(id, now, reqs, cfg);
        self.release_io_slot(id, reqs);
        out.completed.push(id);
    }

    /// Builds the next step at `now` if there is work; returns its end and
    /// stamp. vLLM v1's `Scheduler.schedule`, and v0's
    /// `_schedule_chunked_prefill` (`vllm/core/scheduler.py`, v0.8.5
    /// L1325–1438), which take the same order — the decoding sequences, then
    /// the running prefills' next chunks, then new prefills, in one step
    /// under one token budget — and differ in the victim of a preemption
    /// ([`Self::victim`]), v0's free-block watermark on admission, and v1's
    /// leaving the waiting queue alone in a step that preempted.
    #[inline(always)]
    fn plan_step(
        &mut self,
        now: SimTime,
        reqs: &mut [Request],
        cfg: &WorkerConfig,
        conn: &mut KvConnector,
        out: &mut ConnectorOutput,
    ) -> Option<(SimTime, u32)> {
        debug_assert!(self.step.is_none() && self.chunks.is_empty());
        if cfg.scheduler == Scheduler::V0 && !cfg.chunked_prefill {
            return self.plan_step_v0(now, reqs, cfg, conn, out);
        }
        let s = self.step_index;
        let mut budget = cfg.token_budget;
        let mut preempted = false;

        // 1. Decoding sequences: one token each (and their drafts); blocks
        //    for those crossing a block boundary.
        loop {
            let need = match &cfg.speculative {
                None => self.decode.blocks_needed(s),
                Some(sp) => self.verify_blocks(s, sp, reqs, cfg),
            };
            match self.room(need, now, reqs, cfg) {
                Room::Got => break,
                Room::Freed => {}
                Room::Wait => return self.wait_for_loads(now),
                Room::Short => {
                    let victim = self.victim(0, s, reqs, true, cfg).expect("blocks are short with nothing running");
                    self.preempt(now, victim, s, reqs, cfg);
                    preempted = true;
                }
            }
        }
        let decodes = self.decode.len() as u64;
        // A verify schedules the sequence's token and its k drafts (vLLM's
        // `num_tokens_with_spec − num_computed_tokens`).
        let per = cfg.speculative.as_ref().map_or(1, |sp| 1 + sp.k);
        budget -= (decodes * per).min(budget);

        // 2. Running requests still prefilling, in admission order.
        let mut i = 0;
        while i < self.prefilling.len() && budget > 0 {
            let id = self.prefilling[i];
            let seq = reqs[id.index()].seq;
            let chunk = (seq.num_tokens - seq.computed).min(budget);
            let need = cfg.blocks_for(seq.computed + chunk) - cfg.blocks_for(seq.computed);
            match self.room(need, now, reqs, cfg) {
                Room::Got => {}
                Room::Freed => continue,
                Room::Wait => return self.wait_for_loads(now),
                Room::Short => {
                    let victim = self.victim(i, s, reqs, false, cfg).expect("the requester itself is a candidate");
                    self.preempt(now, victim, s, reqs, cfg);
                    preempted = true;
                    continue; // re-examine position i (the requester, or whoever moved there)
                }
            }
            self.chunks.push((id, PrefillChunk { cached: seq.computed, end: seq.computed + chunk }));
            budget -= chunk;
            i += 1;
        }

        // 3. The waiting queue. vLLM v1 leaves it alone in a step that had
        //    to preempt (`if not preempted_reqs:`; its victim would take back
        //    the blocks just freed); v0 does not. A step left empty by
        //    preemption admits, or the worker would idle with work queued.
        if preempted && cfg.scheduler == Scheduler::V1 && (decodes > 0 || !self.chunks.is_empty()) {
            return self.start_step(now, decodes, reqs, cfg);
        }
        self.admit_waiting(now, &mut budget, reqs, cfg, conn, out);
        if decodes == 0 && self.chunks.is_empty() {
            return None;
        }
        self.start_step(now, decodes, reqs, cfg)
    }

    /// [`Self::plan_step`] under vLLM v0's `_schedule_default` (chunked
    /// prefill off): a prefill-only step if any prompt can be admitted (whole,
    /// within the token budget), else a decode-only step; when that step's
    /// preemptions leave nothing running, the plan starts over — vLLM's next
    /// `schedule()` — with the victims at the front of the queue.
    fn plan_step_v0(
        &mut self,
        now: SimTime,
        reqs: &mut [Request],
        cfg: &WorkerConfig,
        conn: &mut KvConnector,
        out: &mut ConnectorOutput,
    ) -> Option<(SimTime, u32)> {
        // Without chunking a prompt is prefilled in the step that admits it.
        debug_assert!(self.prefilling.is_empty());
        let s = self.step_index;
        loop {
            let mut budget = cfg.token_budget;
            self.admit_waiting(now, &mut budget, reqs, cfg, conn, out);
            if !self.chunks.is_empty() {
                return self.start_step(now, 0, reqs, cfg);
            }
            // Decode-only: one token each; preempt the latest admitted while blocks are short.
            let mut preempted = false;
            loop {
                match self.room(self.decode.blocks_needed(s), now, reqs, cfg) {
                    Room::Got => break,
                    Room::Freed => {}
                    Room::Wait => return self.wait_for_loads(now),
                    Room::Short => {
                        let victim = self.latest_admitted_victim(reqs);
                        self.preempt(now, victim, s, reqs, cfg);
                        preempted = true;
                    }
                }
            }
            let decodes = self.decode.len() as u64;
            if decodes > 0 {
                return self.start_step(now, decodes, reqs, cfg);
            }
            if !preempted {
                return None;
            }
        }
    }

    /// Walks the waiting queue at a step boundary ([`Pass::Admit`]) within
    /// `budget`; if then nothing runs or loads while waiting requests hold
    /// loaded KV that none of them can use (each needs blocks another
    /// holds), the last of them gives its up and the walk is repeated.
    fn admit_waiting(
        &mut self,
        now: SimTime,
        budget: &mut u64,
        reqs: &mut [Request],
        cfg: &WorkerConfig,
        conn: &mut KvConnector,
        out: &mut ConnectorOutput,
    ) {
        loop {
            self.schedule_waiting(now, Pass::Admit, budget, reqs, cfg, conn, out);
            if !self.chunks.is_empty() || self.running() > 0 || self.waiting.loading > 0 || self.waiting.kv_waiting == 0
            {
                return;
            }
            let last = self.waiting.queue.iter().rev().copied().find(|id| reqs[id.index()].seq.computed > 0);
            self.drop_loaded(now, last.expect("kv_waiting counts a loaded request"), reqs, cfg);
        }
    }

    /// Starts the planned step (its prefill chunks in `self.chunks`) — as a
    /// run of decode steps when nothing else can happen before they end.
    fn start_step(
        &mut self,
        now: SimTime,
        decodes: u64,
        reqs: &[Request],
        cfg: &WorkerConfig,
    ) -> Option<(SimTime, u32)> {
        self.perf_chunks.clear();
        self.perf_finishing.clear();
        // The first step of a handed-over P/D request computes the one token
        // its prefill worker sampled, on top of the pulled prompt KV: a decode
        // with that context, priced as one (SplitwiseSim's token machines do
        // the same), not a prompt iteration.
        let (mut first_decodes, mut first_context, mut first_window) = (0, 0, 0);
        for &(id, c) in &self.chunks {
            if c.end - c.cached == 1 && matches!(reqs[id.index()].pd, PdPhase::Decode { awaiting_first_step: true }) {
                first_decodes += 1;
                first_context += c.cached;
                first_window += cfg.sliding_window.map_or(c.cached, |w| c.cached.min(w));
            } else {
                self.perf_chunks.push(c);
                self.perf_finishing.push(c.end >= reqs[id.index()].seq.num_tokens);
            }
        }
        // (A v0 prefill-only step leaves the decoding sequences alone.)
        let (context, window) = match decodes {
            0 => (first_context, first_window),
            _ => (
                self.decode.context_tokens() + first_context,
                self.decode.window_tokens(self.step_index, reqs) + first_window,
            ),
        };
        // The chunks that finish their (re)computed context sample a token.
        let finishing = self.chunks.iter().filter(|&&(id, c)| c.end >= reqs[id.index()].seq.num_tokens).count();
        let drafts = cfg.speculative.as_ref().map_or(0, |sp| sp.k * decodes);
        let work = StepWork {
            prefill: &self.perf_chunks,
            decodes: decodes + first_decodes,
            drafts,
            decode_context_tokens: context,
            decode_window_tokens: window,
            samples: decodes + drafts + finishing as u64,
        };
        // A decode-only step becomes a run when nothing else can happen (its
        // price is the run's); a pipeline's rounds are priced one by one,
        // and a data-parallel group's steps by the group.
        let run = self.chunks.is_empty()
            && decodes > 0
            && self.waiting.queue.is_empty()
            && cfg.apc_ttl.0 == 0
            && self.paused_since.is_none()
            && cfg.pipeline.is_none()
            && cfg.speculative.is_none()
            && cfg.data_parallel.is_none();
        let single = if run {
            self.step_peak = cfg.usage.peak_seconds(&work);
            None
        } else if cfg.data_parallel.is_some() {
            self.step_peak = cfg.usage.peak_seconds(&work);
            self.unpriced = Some(Unpriced {
                decodes: work.decodes,
                drafts: work.drafts,
                context: work.decode_context_tokens,
                window: work.decode_window_tokens,
                samples: work.samples,
            });
            // The group sets the end ([`Self::begin_lockstep`]).
            Some(SimTime::MAX)
        } else {
            let finishing = &self.perf_finishing;
            let (t, peak) = cfg.price(&work, |i| finishing[i]);
            self.step_peak = peak;
            Some(now + t)
        };
        self.priced += u64::from(!run);
        if self.log.is_some() {
            self.log_start(Self::row_of(self.id, &work, cfg));
        }
        debug_assert!(!self.in_run());
        let end = single.unwrap_or_else(|| self.plan_run(now, decodes, context, window, cfg));
        self.step = Some(Step { start: now, end, decodes });
        Some((end, self.version.bump()))
    }
}

/// Returned by [`Worker::finish_step`] for a step event superseded by a re-plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StaleStep;

#[cfg(test)]
mod tests {
    use super::perf::{MixRule, Roofline, StepModel};
    use super::*;
    use crate::ids::StageId;
    use crate::kvcache::connector::testing;
    use crate::kvcache::{Content, Tier, content_id};
    use crate::storage::DeviceTimer;
    use crate::workload::{Label, NewRequest};
    use std::collections::BTreeMap;

    /// Toy roofline: L = 1, d = 10, a = 0, b = 1, 1e6 FLOP/s → prefill of k new
    /// tokens = k·100/1e6 s = 100 µs per token; decode = (1000 B weights +
    /// 10 B/token × context) / 1e6 B/s = 1 ms + 10 µs per context token.
    fn toy(total_blocks: u64, max_running: u32) -> WorkerConfig {
        WorkerConfig {
            max_running,
            scheduler: Scheduler::V1,
            admission_watermark: 0,
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
            perf: StepModel::Roofline(Roofline::toy(1.0, 10.0, 0.0, 1.0, 1e6, 1e6, 1000.0, 10.0), MixRule::Max),
            usage: Roofline::toy(1.0, 10.0, 4.0, 24.0, 1e6, 1e6, 1000.0, 10.0),
            sliding_window: None,
            power: crate::worker::presets::GpuSpec::preset("H100").unwrap().power,
            pipeline: None,
            speculative: None,
            data_parallel: None,
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
                let mut r = Request::new(RequestId(i as u32), i as u32, SimTime::ZERO, new);
                r.find_chains(16, true);
                r
            })
            .collect()
    }

    fn arena(specs: &[(u32, u32)]) -> Vec<Request> {
        arena_keyed(specs, |i| i as u64)
    }

    /// A connector for one worker without tiers.
    fn no_tiers() -> KvConnector {
        let mut c = KvConnector::new(&testing::kvc(Vec::new(), 1), 16);
        c.add_worker();
        c
    }

    /// Plans a step if idle (no tiers).
    fn poll(w: &mut Worker, now: SimTime, reqs: &mut [Request], cfg: &WorkerConfig) -> Option<(SimTime, u32)> {
        w.poll(now, reqs, cfg, &mut no_tiers(), &mut ConnectorOutput::default())
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
        poll(w, now, reqs, cfg)
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
            next = poll(w, t, reqs, cfg);
        }
        log
    }

    /// A worker with a CPU tier, driven by hand: arrivals, step ends and the
    /// connector's device timers in time order, as the cluster would.
    struct Harness {
        cfg: WorkerConfig,
        w: Worker,
        conn: KvConnector,
        reqs: Vec<Request>,
        out: ConnectorOutput,
        events: BTreeMap<(SimTime, u64), Ev>,
        seq: u64,
        /// Each request's statuses after each event, repeats left out.
        trail: BTreeMap<u32, Vec<RequestStatus>>,
    }

    #[derive(Clone, Copy, Debug)]
    enum Ev {
        Arrive(u32),
        Step(u32),
        Device(u32, DeviceTimer),
    }

    impl Harness {
        /// The tier: CPU memory at 1e6 B/s, no latency, chunks of
        /// `chunk_blocks` blocks (160 B each).
        fn new(cfg: WorkerConfig, chunk_blocks: u64, reqs: Vec<Request>) -> Harness {
            let kvc = testing::kvc(vec![testing::cpu_tier(1 << 30)], chunk_blocks);
            let mut conn = KvConnector::new(&kvc, cfg.block_size);
            conn.add_worker();
            let w = Worker::new(WorkerId(0), &cfg);
            Harness {
                cfg,
                w,
                conn,
                reqs,
                out: ConnectorOutput::default(),
                events: BTreeMap::new(),
                seq: 0,
                trail: BTreeMap::new(),
            }
        }

        fn at(&mut self, t: SimTime, e: Ev) {
            self.events.insert((t, self.seq), e);
            self.seq += 1;
        }

        /// Writes the prompt of request `id` to the tier at time zero.
        fn seed(&mut self, id: u32) {
            let r = &self.reqs[id as usize];
            let seq = r.chunked(u64::from(r.prompt_tokens), self.cfg.block_size);
            self.conn.save(SimTime::ZERO, WorkerId(0), r.id, &seq, 0, &mut self.out);
            self.apply(SimTime::ZERO);
        }

        /// Runs arrivals `(time, request)` and everything that follows.
        fn run(&mut self, arrivals: &[(SimTime, u32)]) {
            for &(t, id) in arrivals {
                self.at(t, Ev::Arrive(id));
            }
            while let Some(((t, _), e)) = self.events.pop_first() {
                match e {
                    Ev::Arrive(id) => {
                        self.reqs[id as usize].arrival = t;
                        self.w.enqueue(RequestId(id));
                        self.poll(t);
                    }
                    Ev::Step(v) => {
                        let mut done = StepOutcome::default();
                        if self.w.finish_step(t, v, &mut self.reqs, &self.cfg, &mut done).is_ok() {
                            self.poll(t);
                        }
                    }
                    Ev::Device(i, timer) => self.conn.on_timer(t, i, timer, &mut self.out),
                }
                self.apply(t);
                for &(_, id) in arrivals {
                    let trail = self.trail.entry(id).or_default();
                    let now = self.reqs[id as usize].seq.status;
                    if trail.last() != Some(&now) {
                        trail.push(now);
                    }
                }
            }
        }

        fn poll(&mut self, t: SimTime) {
            if let Some((end, v)) = self.w.poll(t, &mut self.reqs, &self.cfg, &mut self.conn, &mut self.out) {
                self.at(end, Ev::Step(v));
            }
        }

        fn apply(&mut self, t: SimTime) {
            while !self.out.is_empty() {
                let out = std::mem::take(&mut self.out);
                for &(at, i, timer) in &out.timers {
                    self.at(at, Ev::Device(i, timer));
                }
                for d in &out.loaded {
                    self.w.fetched(d, t, &mut self.reqs, &self.cfg);
                    self.poll(t);
                }
            }
        }
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn a_request_whose_load_does_not_fit_waits_and_holds_back_the_queue() {
        // 10 blocks. The tier holds 96 tokens of content 7 (6 one-block chunks,
        // written 0 → 0.96 ms). A (unique, 128 + 2) runs first and holds 8
        // blocks; B (100 tokens of content 7) then needs 6 blocks for its load
        // and C (unique, 16 + 1) 1 block for its prompt.
        let cfg = toy(10, 8);
        let reqs =
            arena_keyed(&[(96, 1), (128, 2), (100, 1), (16, 1)], |i| if i % 2 == 0 { 7 } else { 100 + i as u64 });
        let mut h = Harness::new(cfg, 1, reqs);
        h.seed(0);
        h.run(&[(SimTime(MS), 1), (SimTime(2 * MS), 2), (SimTime(3 * MS), 3)]);
        let (b, c) = (&h.reqs[2], &h.reqs[3]);
        // 1 ms: A prefills 128 tokens (12.8 ms) → 13.8 ms; it decodes once
        //   (1 ms + 128 × 10 µs = 2.28 ms) → 16.08 ms and is done.
        // 2 ms: B's 96 tokens are in the tier but 2 blocks are free: it waits.
        // 3 ms: C would fit, but waits behind B (FIFO).
        // 16.08 ms: A's blocks are freed: B starts loading (6 × 160 B at
        //   1e6 B/s = 0.96 ms → 17.04 ms) and C is admitted (16 tokens: 1.6 ms → 17.68 ms).
        // 17.68 ms: B is admitted with 96 tokens loaded and computes 4 (max(0.4 ms, 1 ms)) → 18.68 ms.
        assert_eq!(c.first_scheduled, Some(SimTime(16_080_000)));
        assert_eq!(b.first_scheduled, Some(SimTime(17_680_000)));
        assert_eq!(b.first_token, Some(SimTime(18_680_000)));
        assert_eq!(b.hit_tokens, [0, 96, 0, 0], "never admitted to recompute what the tier holds");
        assert_eq!((b.hit_tokens_total, b.prefill_tokens_computed, b.read_bytes[1]), (96, 4, 960));
        assert_eq!(h.w.used_blocks(), 0);
    }

    #[test]
    fn a_blocked_load_is_looked_at_again_when_blocks_it_would_hit_are_cached() {
        // 10 blocks. The tier is given 96 tokens of content 7 at 0 (6 chunks
        // of one block, readable from 0.96 ms). A (96 tokens of content 7,
        // 20 out) arrives at 0, before they are readable, and computes them
        // in one step of 96 × 100 µs → 9.6 ms, holding 6 blocks. B (100
        // tokens of content 7, 1 out) arrives at 2 ms: it would load 6
        // blocks and compute 4 tokens in a 7th, with 4 free, so it waits.
        // At 9.6 ms A's blocks are cached (nothing freed): B now finds the
        // 96 tokens in the GPU and needs 1 block for its last 4 (A's first
        // decode takes 1 of the 4 free): it is admitted there, not when A
        // finishes and frees its blocks.
        let reqs = arena_keyed(&[(96, 1), (96, 20), (100, 1)], |_| 7);
        let mut h = Harness::new(toy(10, 8), 1, reqs);
        h.seed(0);
        h.run(&[(SimTime::ZERO, 1), (SimTime(2 * MS), 2)]);
        let (a, b) = (&h.reqs[1], &h.reqs[2]);
        assert_eq!(a.hit_tokens, [0, 0, 0, 0], "A computed its prompt");
        assert_eq!(b.first_scheduled, Some(SimTime(9_600_000)), "A finished at {:?}", a.finished);
        assert_eq!(b.hit_tokens, [96, 0, 0, 0], "B hit A's blocks, not the tier");
    }

    #[test]
    fn a_head_that_does_not_fit_waits_for_a_free_without_being_looked_up_each_step() {
        // 10 blocks, no tier content. A (128 tokens, 30 out) takes 8 blocks
        // at 0 and decodes, growing to 10. B (64 tokens, 4 blocks) arrives
        // at 2 ms with 2 free: it does not fit, and nothing A does frees a
        // block until A finishes, so B is admitted then. Between the steps
        // where A caches a block (every 16 tokens), B is not looked up again
        // (debug builds check, each time, that it still would not fit).
        let reqs = arena(&[(128, 30), (64, 1)]);
        let mut h = Harness::new(toy(10, 8), 1, reqs);
        h.run(&[(SimTime::ZERO, 0), (SimTime(2 * MS), 1)]);
        let (a, b) = (&h.reqs[0], &h.reqs[1]);
        assert!(a.finished.is_some() && a.preemptions == 0);
        assert_eq!(b.first_scheduled, a.finished, "admitted as A's blocks are freed");
        assert!(h.w.waiting.admit_memo_hits > 10, "{} look-ups spared", h.w.waiting.admit_memo_hits);
    }

    #[test]
    fn a_request_that_does_not_fit_leaves_its_cached_prefix_to_age() {
        // 10 blocks, no tiers. A (content P, 32 tokens) and C (content Q,
        // 32 tokens) finish at 3.2 and 7.2 ms: P's 2 blocks and Q's are
        // cached and evictable, P the older. D (80 tokens, 40 out) arrives at
        // 8 ms and takes 5 blocks; B (100 tokens of P) arrives at 9 ms and
        // would need 5 blocks beside its 2 of P: with P taken, 1 free + 2 of
        // Q's do not do. D's decodes grow it to 8 blocks — 1 free, then 2
        // evicted least recently used first. vLLM's allocate_slots touches a
        // hit only once the allocation fits, so B's failed tries leave P the
        // older: P is evicted, and B, admitted as D finishes, hits nothing.
        // (Touched at each try, P would outlive Q and B would hit 32 tokens.)
        let reqs = arena_keyed(&[(32, 1), (32, 1), (80, 40), (100, 1)], |i| [7, 8, 9, 7][i]);
        let mut h = Harness::new(toy(10, 8), 1, reqs);
        h.run(&[(SimTime::ZERO, 0), (SimTime(4 * MS), 1), (SimTime(8 * MS), 2), (SimTime(9 * MS), 3)]);
        let (d, b) = (&h.reqs[2], &h.reqs[3]);
        assert_eq!(h.reqs[1].finished, Some(SimTime(7_200_000)));
        assert_eq!(b.first_scheduled, d.finished, "B waited for D's blocks");
        assert_eq!(b.hit_tokens, [0, 0, 0, 0], "P aged out while B waited");
    }

    #[test]
    fn a_requests_status_follows_vllms_from_waiting_through_its_load_to_finished() {
        use RequestStatus::*;
        // The tier holds 32 tokens of content 7; the request (48 tokens of it, 3 out) loads them.
        let reqs = arena_keyed(&[(32, 1), (48, 3)], |_| 7);
        let mut h = Harness::new(toy(100, 8), 1, reqs);
        h.seed(0);
        h.run(&[(SimTime(MS), 1)]);
        // (Its load ends and it is admitted at the same instant: `Loaded` lasts no time here.)
        assert_eq!(h.trail[&1], [Waiting, WaitingForRemoteKvs, Prefilling, Decoding, Finished]);
        // A one-token answer never decodes.
        let mut h = Harness::new(toy(100, 8), 1, arena(&[(40, 1)]));
        h.run(&[(SimTime(MS), 0)]);
        assert_eq!(h.trail[&0], [Prefilling, Finished], "admitted as it arrives");
    }

    #[test]
    fn a_preempted_request_loads_its_prefix_again_and_those_hits_count() {
        // 10 blocks, GPU prefix caching off. The tier holds 32 tokens of content
        // 7. X (unique, 64 + 40) runs first; A (48 tokens of content 7, + 60)
        // loads 32 and computes 16. Decoding both needs 7 + 7 > 10 blocks: A
        // has done less work and is preempted, and reloads the same 32 tokens.
        let mut cfg = toy(10, 8);
        cfg.prefix_caching = false;
        let reqs = arena_keyed(&[(32, 1), (64, 40), (48, 60)], |i| if i == 1 { 99 } else { 7 });
        let mut h = Harness::new(cfg, 1, reqs);
        h.seed(0);
        h.run(&[(SimTime(MS), 1), (SimTime(2 * MS), 2)]);
        let a = &h.reqs[2];
        assert!(a.preemptions >= 1 && h.reqs[1].preemptions == 0);
        assert!(a.finished.is_some() && h.reqs[1].finished.is_some());
        let admissions = 1 + u64::from(a.preemptions);
        assert_eq!(a.hit_tokens, [0, 32, 0, 0], "first admission");
        assert_eq!(a.hit_tokens_total, 32 * admissions, "every admission loaded the 32 tokens");
        assert_eq!(a.read_bytes[1], 2 * 160 * admissions);
        // Preempted while running, it waits again and loads again.
        use RequestStatus::*;
        let trail = &h.trail[&2];
        assert_eq!(trail[..2], [Waiting, WaitingForRemoteKvs]);
        assert_eq!(trail.last(), Some(&Finished));
        let back =
            trail.windows(2).filter(|w| matches!(w, [Prefilling | Decoding, Waiting | WaitingForRemoteKvs])).count();
        assert_eq!(back as u32, a.preemptions, "{trail:?}");
    }

    #[test]
    fn a_prompt_of_whole_blocks_recomputes_one_token_not_a_block() {
        // The tier holds a 64-token prompt (4 blocks, chunks of 2 blocks).
        let cfg = toy(100, 8);
        let reqs = arena_keyed(&[(64, 1), (64, 1), (64, 1)], |_| 7);
        let mut h = Harness::new(cfg, 2, reqs);
        h.seed(0);
        // Request 1 finds nothing in the GPU: it loads all 4 blocks for 63
        // tokens and computes the last one.
        h.run(&[(SimTime(MS), 1)]);
        let r = &h.reqs[1];
        assert_eq!((r.hit_tokens, r.prefill_tokens_computed, r.read_bytes[1]), ([0, 63, 0, 0], 1, 640));
        // Request 2 finds 3 blocks in the GPU (at most (64 − 1) / 16) and
        // loads the other 15 tokens of block 4 from the tier.
        let t = r.finished.unwrap() + SimDuration(MS);
        h.run(&[(t, 2)]);
        let r = &h.reqs[2];
        assert_eq!((r.hit_tokens, r.prefill_tokens_computed, r.read_bytes[1]), ([48, 15, 0, 0], 1, 160));
    }

    #[test]
    fn a_load_starts_only_when_the_chunk_after_it_fits_beside_the_loads_ahead() {
        // 10 blocks, caching off. The tier holds 64 tokens of content 7 and of
        // content 8 (written by 1.28 ms). R1 and R2 (112 tokens each, of
        // content 7 and 8) arrive together at 2 ms. Each would load 4 blocks
        // and then compute 48 tokens in 3 more: R1 loads (7 of 10 blocks are
        // free); R2 would need 7 beside the 3 promised to R1, with 6 free: it
        // waits, rather than load and then block R1 (vLLM allocates a load's
        // blocks with its first chunk's). R1: 640 B at 10⁶ B/s → 2.64 ms,
        // 48 tokens × 100 µs → 7.44 ms. R2 then: → 8.08 ms → 12.88 ms.
        let mut cfg = toy(10, 8);
        cfg.prefix_caching = false;
        let reqs = arena_keyed(&[(64, 1), (64, 1), (112, 1), (112, 1)], |i| 7 + (i as u64 % 2));
        let mut h = Harness::new(cfg, 1, reqs);
        h.seed(0);
        h.seed(1);
        h.run(&[(SimTime(2 * MS), 2), (SimTime(2 * MS), 3)]);
        let (r1, r2) = (&h.reqs[2], &h.reqs[3]);
        assert_eq!((r1.finished, r2.finished), (Some(SimTime(7_440_000)), Some(SimTime(12_880_000))));
        assert_eq!((r1.preemptions, r2.preemptions), (0, 0));
        assert_eq!((r1.read_bytes[1], r2.read_bytes[1]), (640, 640), "each loaded once");
        assert_eq!((r1.prefill_tokens_computed, r2.prefill_tokens_computed), (48, 48));
    }

    #[test]
    fn loaded_kv_gives_way_to_a_running_request_that_needs_its_blocks() {
        // 12 blocks, one sequence at a time, caching off. A (unique, 16 +
        // 150: 11 blocks at the end) runs from 1 ms. B (content 7, 112
        // tokens, 64 in the tier) arrives at 2 ms and loads its 4 blocks (7
        // with its first chunk's 3 are free) but waits for A's slot. A grows
        // a block per 16 tokens; at its 9th, 12 − 4 − 8 = 0 are free: B's
        // loaded KV gives way (B's one preemption), never A's progress. B
        // reloads (640 B again) once A is done and runs.
        let mut cfg = toy(12, 1);
        cfg.prefix_caching = false;
        let reqs = arena_keyed(&[(64, 1), (16, 150), (112, 1)], |i| if i == 1 { 99 } else { 7 });
        let mut h = Harness::new(cfg, 1, reqs);
        h.seed(0);
        h.run(&[(SimTime(MS), 1), (SimTime(2 * MS), 2)]);
        let (a, b) = (&h.reqs[1], &h.reqs[2]);
        assert_eq!((a.preemptions, b.preemptions), (0, 1));
        assert_eq!(b.read_bytes[1], 2 * 640, "loaded twice");
        assert!(b.first_scheduled.unwrap() >= a.finished.unwrap());
        assert_eq!((b.hit_tokens_total, b.prefill_tokens_computed), (64, 48));
        assert_eq!(h.w.used_blocks(), 0);
    }

    /// A (10 tokens, 200 out) prefills, then B (30 tokens, 5 out) arrives
    /// halfway through A's run of decode steps (which stops at the end of
    /// the sub-step then in flight): `(prefill tokens, decodes)` of every
    /// step (the runs' sub-steps included), and the index of the first step
    /// after B came.
    fn steps_with_a_late_arrival(scheduler: Scheduler, chunked_prefill: bool) -> (Vec<(u64, u64)>, usize) {
        let cfg = WorkerConfig { scheduler, chunked_prefill, admission_watermark: 1, ..toy(100, 8) };
        let mut reqs = arena(&[(10, 200), (30, 5)]);
        let mut w = Worker::new(WorkerId(0), &cfg);
        let mut next = submit(&mut w, SimTime::ZERO, 0, &mut reqs, &cfg);
        let (mut out, mut log, mut arrived, mut prev) = (StepOutcome::default(), Vec::new(), 0, SimTime::ZERO);
        let take = |w: &mut Worker, log: &mut Vec<(u64, u64)>| {
            for s in w.substeps_mut().drain(..) {
                log.extend((0..s.steps()).map(|_| (0, s.decodes)));
            }
        };
        while let Some((t, v)) = next {
            if arrived == 0 && !log.is_empty() {
                let at = SimTime((prev.0 + t.0) / 2);
                let (end, version) = submit(&mut w, at, 1, &mut reqs, &cfg).expect("the run stops early");
                assert!(end < t, "cut");
                take(&mut w, &mut log);
                assert!(log.len() > 2, "sub-steps before B came");
                // The sub-step in flight, then B's.
                arrived = log.len() + 1;
                next = Some((end, version));
                continue;
            }
            w.finish_step(t, v, &mut reqs, &cfg, &mut out).expect("current step");
            take(&mut w, &mut log);
            log.push((out.prompt_tokens, out.decodes));
            prev = t;
            next = poll(&mut w, t, &mut reqs, &cfg);
        }
        assert!(reqs.iter().all(|r| r.seq.status == RequestStatus::Finished));
        (log, arrived)
    }

    #[test]
    fn the_v0_scheduler_never_mixes_prefill_and_decode_and_prefers_prefills() {
        let (v0, at) = steps_with_a_late_arrival(Scheduler::V0, false);
        assert!(v0.iter().all(|&(p, d)| p == 0 || d == 0), "{v0:?}");
        // B's prompt takes the step after it arrives, alone: A's decode waits.
        assert_eq!(v0[at], (30, 0), "{v0:?}");
        assert_eq!(v0[at + 1].0, 0);
        // Every token is produced: A's 200 (1 at its prefill) and B's 5.
        assert_eq!(v0.iter().map(|s| s.1).sum::<u64>(), 199 + 4, "{v0:?}");
        // vLLM v1 runs B's prompt beside A's decode, and so does v0 with
        // chunked prefill (`_schedule_chunked_prefill`: decodes first, then
        // prefill chunks, in one step).
        for (scheduler, chunked) in [(Scheduler::V1, true), (Scheduler::V0, true)] {
            let (steps, at) = steps_with_a_late_arrival(scheduler, chunked);
            assert_eq!(steps[at], (30, 1), "{scheduler:?}: {steps:?}");
        }
    }

    #[test]
    fn a_decoders_inter_token_gap_spans_the_prefill_only_steps_it_sat_out() {
        // vLLM v0 without chunked prefill. A (10 tokens, 3 out) prefills in
        // 1 ms (10 × 100 µs, the weights' 1 ms alike) and has its first token
        // at 1 ms; B (30 tokens, 2 out) then arrives and takes a
        // prefill-only step: 30 × 100 µs = 3 ms, to 4 ms. The next step
        // decodes both over 10 + 30 context tokens: 1 ms + 40 × 10 µs =
        // 1.4 ms, to 5.4 ms. A's gap is 5.4 − 1 = 4.4 ms (`vllm bench
        // serve`'s ITL counts the pause), B's 1.4 ms; then one more for A.
        let cfg = WorkerConfig { scheduler: Scheduler::V0, chunked_prefill: false, ..toy(100, 8) };
        let mut reqs = arena(&[(10, 3), (30, 2)]);
        let mut w = Worker::new(WorkerId(0), &cfg);
        let mut out = StepOutcome::default();
        let (t, v) = submit(&mut w, SimTime::ZERO, 0, &mut reqs, &cfg).unwrap();
        assert_eq!(t, SimTime(MS));
        w.finish_step(t, v, &mut reqs, &cfg, &mut out).unwrap();
        let (t, v) = submit(&mut w, t, 1, &mut reqs, &cfg).unwrap();
        assert_eq!(t, SimTime(4 * MS));
        w.finish_step(t, v, &mut reqs, &cfg, &mut out).unwrap();
        assert_eq!((out.decodes, out.gaps_of_duration), (0, 0), "A sat it out");
        let (t, v) = poll(&mut w, t, &mut reqs, &cfg).unwrap();
        assert_eq!(t, SimTime(5_400_000));
        w.finish_step(t, v, &mut reqs, &cfg, &mut out).unwrap();
        assert_eq!((out.decodes, out.gaps_of_duration), (2, 0));
        assert_eq!((out.gaps_of_pause, out.pause_gap), (1, SimDuration(4_400_000)), "A waited it all");
        assert_eq!(out.gaps, [SimDuration(1_400_000)], "B joined in it");
        // Back to back again: A's last gap is its step's duration.
        let (t2, v) = poll(&mut w, t, &mut reqs, &cfg).unwrap();
        w.finish_step(t2, v, &mut reqs, &cfg, &mut out).unwrap();
        assert_eq!((out.decodes, out.gaps_of_duration, out.gaps.len()), (1, 1, 0));
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

    /// `toy` with ngram speculative decoding of `at_least` (k = its length).
    fn speculating(at_least: Vec<f64>, method: speculative::Method) -> WorkerConfig {
        let k = at_least.len() as u64;
        WorkerConfig { speculative: Some(Speculative { method, k, at_least, drafter: None }), ..toy(1000, 8) }
    }

    #[test]
    fn a_verify_emits_the_accepted_drafts_and_one_token_and_gives_back_the_rest_of_its_slots() {
        // k = 3 with the first two positions always accepted and the third
        // never: every verify emits 1 + 2 tokens (the per-position form, exact).
        let cfg = speculating(vec![1.0, 1.0, 0.0], speculative::Method::Ngram);
        let mut reqs = arena(&[(20, 10), (20, 9)]);
        let mut w = Worker::new(WorkerId(0), &cfg);
        let first = submit(&mut w, SimTime::ZERO, 0, &mut reqs, &cfg);
        // Prefill 20 × 100 µs = 2 ms: the first token. Then verifies over
        // contexts 20, 23, 26 (the drafts' 400 µs of FLOPs stay below the
        // 1 ms + 10 µs per context token of reading the weights and KV):
        // 1.2, 1.23 and 1.26 ms, emitting 3 + 3 + 3 = the 9 tokens left.
        assert_eq!(first.unwrap().0, SimTime(2_000_000));
        let mut out = StepOutcome::default();
        let (mut next, mut ends) = (first, Vec::new());
        while let Some((t, v)) = next {
            w.finish_step(t, v, &mut reqs, &cfg, &mut out).expect("current step");
            ends.push((t, out.generated_tokens));
            if t == SimTime(3_200_000) {
                // Computed 23 tokens: 2 blocks of 16 held; the slots reserved
                // for positions 23..=23 + 3 gave back none (all in block 2).
                assert_eq!(w.used_blocks(), 2);
            }
            next = poll(&mut w, t, &mut reqs, &cfg);
        }
        assert_eq!(
            ends,
            vec![(SimTime(2_000_000), 1), (SimTime(3_200_000), 3), (SimTime(4_430_000), 3), (SimTime(5_690_000), 3)]
        );
        assert_eq!(reqs[0].finished, Some(SimTime(5_690_000)));
        assert_eq!(w.speculation(), (3, 6));
        assert_eq!(w.used_blocks(), 0);
        // 8 tokens left after the first: 3 + 3, then the last two (one draft
        // kept of the two accepted): the cap at what is left.
        let mut w = Worker::new(WorkerId(0), &cfg);
        let first = submit(&mut w, SimTime::ZERO, 1, &mut reqs, &cfg);
        let log = drain(&mut w, first, &mut reqs, &cfg);
        assert_eq!(log.len(), 4);
        assert_eq!(reqs[1].seq.generated, 9);
        assert_eq!(w.speculation(), (3, 6), "the last verify accepted two drafts, of which one was kept");
    }

    #[test]
    fn lookahead_slots_are_reserved_for_the_step_and_the_unkept_ones_given_back() {
        // EAGLE with k = 3 reserves 1 + 3 + 3 lookahead = 7 slots per step:
        // a sequence at 13 computed tokens writes positions 13..=19, crossing
        // into block 2, and keeps 13 + 1 (nothing accepted) = 14 → 1 block after.
        let cfg = WorkerConfig { total_blocks: 2, ..speculating(vec![0.0, 0.0, 0.0], speculative::Method::Eagle) };
        let mut reqs = arena(&[(13, 3)]);
        let mut w = Worker::new(WorkerId(0), &cfg);
        let first = submit(&mut w, SimTime::ZERO, 0, &mut reqs, &cfg);
        let mut out = StepOutcome::default();
        let (t, v) = first.unwrap();
        w.finish_step(t, v, &mut reqs, &cfg, &mut out).unwrap();
        assert_eq!(w.used_blocks(), 1);
        let (t, v) = poll(&mut w, t, &mut reqs, &cfg).unwrap();
        assert_eq!(w.used_blocks(), 2, "the verify's slots reach block 2");
        w.finish_step(t, v, &mut reqs, &cfg, &mut out).unwrap();
        assert_eq!(w.used_blocks(), 1, "position 14 is the last kept: block 2 given back");
        assert_eq!(out.generated_tokens, 1);
    }

    #[test]
    fn a_verify_reserves_no_slot_past_the_longest_sequence() {
        // Two blocks of 16 hold one 32-token sequence, the longest allowed.
        // Its last verifies (EAGLE, k = 3: 7 slots) would reach past 32
        // tokens into a third block the pool does not have; capped at
        // max_model_len, as vLLM's allocate_slots caps them, it finishes.
        let cfg = WorkerConfig {
            total_blocks: 2,
            max_model_len: 32,
            ..speculating(vec![0.5, 0.0, 0.0], speculative::Method::Eagle)
        };
        let mut reqs = arena(&[(20, 12)]);
        let mut w = Worker::new(WorkerId(0), &cfg);
        let first = submit(&mut w, SimTime::ZERO, 0, &mut reqs, &cfg);
        drain(&mut w, first, &mut reqs, &cfg);
        assert_eq!(reqs[0].seq.generated, 12);
        assert_eq!(w.preemptions(), 0);
        assert_eq!(w.used_blocks(), 0);
    }

    #[test]
    fn the_mean_tokens_a_verify_emits_is_one_plus_the_geometric_sum_of_alpha() {
        // α = 0.6, k = 3: E = (1 − 0.6⁴) / (1 − 0.6) = 2.176; the emitted
        // count's variance from P(A = j) = α^j (1 − α) for j < 3, α³ for 3.
        let (alpha, k) = (0.6f64, 3);
        let at_least: Vec<f64> = (1..=k).map(|j| alpha.powi(j)).collect();
        let cfg = speculating(at_least, speculative::Method::Ngram);
        let mut reqs = arena(&[(16, 3000); 8]);
        let mut w = Worker::new(WorkerId(0), &cfg).seeded(11);
        let mut next = None;
        for i in 0..8 {
            next = submit(&mut w, SimTime::ZERO, i, &mut reqs, &cfg).or(next);
        }
        drain(&mut w, next, &mut reqs, &cfg);
        let (verifies, accepted) = w.speculation();
        let mean = 1.0 + accepted as f64 / verifies as f64;
        let want = (1.0 - alpha.powi(k + 1)) / (1.0 - alpha);
        let p = |j: i32| if j < k { alpha.powi(j) * (1.0 - alpha) } else { alpha.powi(k) };
        let var: f64 = (0..=k).map(|j| p(j) * (1.0 + f64::from(j) - want).powi(2)).sum();
        let se = (var / verifies as f64).sqrt();
        assert!(verifies > 10_000, "{verifies}");
        assert!((mean - want).abs() < 4.0 * se, "{mean} vs {want} ± {se}");
        assert!(reqs.iter().all(|r| r.seq.generated == 3000));
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
    fn without_chunked_prefill_the_token_budget_still_binds() {
        // Three 300-token prompts arrive together with a 400-token budget and
        // chunked prefill off: each is prefilled whole in a step of its own
        // (30 ms; vLLM breaks at the first prompt that does not fit what is
        // left of the budget), the first with nothing else to decode.
        for scheduler in [Scheduler::V1, Scheduler::V0] {
            let mut cfg = toy(1000, 8);
            (cfg.token_budget, cfg.chunked_prefill, cfg.scheduler) = (400, false, scheduler);
            let mut reqs = arena(&[(300, 1), (300, 1), (300, 1)]);
            let mut w = Worker::new(WorkerId(0), &cfg);
            for i in 0..3 {
                w.enqueue(RequestId(i));
            }
            let first = poll(&mut w, SimTime::ZERO, &mut reqs, &cfg);
            let log = drain(&mut w, first, &mut reqs, &cfg);
            // One output token each: every request finishes with its prefill.
            assert_eq!(log.iter().map(|l| l.0.0).collect::<Vec<_>>(), vec![30_000_000, 60_000_000, 90_000_000]);
            assert!(reqs.iter().all(|r| r.seq.generated == 1));
        }
    }

    #[test]
    fn a_handed_over_request_s_first_step_is_priced_as_a_decode() {
        // Request 0 caches its 96-token prompt (6 blocks). Request 1 is the
        // same prompt handed over from a prefill worker: 97 tokens (the
        // prompt and the prefill worker's token), 96 of them resident. Its
        // first step computes one token over a 96-token context: a decode,
        // 1 ms + 96 × 10 µs = 1.96 ms on the toy roofline — not a prompt
        // iteration of one token with an empty decode batch (1 ms).
        let cfg = toy(1000, 8);
        let mut reqs = arena_keyed(&[(96, 2), (96, 2)], |_| 7);
        let mut w = Worker::new(WorkerId(0), &cfg);
        let first = submit(&mut w, SimTime::ZERO, 0, &mut reqs, &cfg);
        drain(&mut w, first, &mut reqs, &cfg);
        let t = reqs[0].finished.unwrap();
        let r = &mut reqs[1];
        r.pd = PdPhase::Decode { awaiting_first_step: true };
        r.first_token = Some(t);
        r.seq.num_tokens = 97;
        r.seq.generated = 1;
        r.seq.last_token_at = t;
        let second = submit(&mut w, t, 1, &mut reqs, &cfg);
        let log = drain(&mut w, second, &mut reqs, &cfg);
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].0 - t, SimDuration(1_960_000));
        assert_eq!(reqs[1].prefill_tokens_computed, 1);
        assert_eq!(reqs[1].finished, Some(t + SimDuration(1_960_000)));
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
    fn decode_group_needs_a_block_exactly_at_block_boundaries() {
        let cfg = toy(1000, 8);
        // Prompt 15: after prefill 15 tokens computed (1 block). The first decode step
        // writes position 15 (same block); the second writes 16 (new block).
        let mut reqs = arena(&[(15, 5)]);
        let mut g = DecodeGroup::new(cfg.block_size, None);
        reqs[0].seq.computed = 15;
        reqs[0].seq.generated = 1;
        g.join(RequestId(0), 7, &mut reqs);
        assert_eq!((g.blocks_needed(7), g.blocks_needed(8)), (0, 1));
        assert_eq!(g.blocks_needed(8 + 16), 1);
        assert_eq!(g.context_tokens(), 15);
    }

    #[test]
    fn a_member_that_leaves_and_joins_every_step_leaves_no_trail_in_the_heaps() {
        // A verify that accepts a draft (speculative decoding) takes its
        // member out and puts it back with one more token, every step: each
        // join pushes a finish entry (and, below a window, a crossing one)
        // and leaves the last one stale, due only later.
        let cfg = toy(1000, 8);
        let mut reqs = arena(&[(15, 20_000), (15, 50_000)]);
        let mut g = DecodeGroup::new(cfg.block_size, Some(1 << 20));
        for i in 0..2 {
            reqs[i].seq.computed = 15;
            reqs[i].seq.generated = 1;
            g.join(RequestId(i as u32), 0, &mut reqs);
        }
        let bound = 2 * 2 + 64;
        for s in 0..5_000u64 {
            g.advance_by(1); // step s
            let (computed, generated) = g.leave(RequestId(0), s + 1, &mut reqs);
            reqs[0].seq.computed = computed + 1;
            reqs[0].seq.generated = generated + 1;
            g.join(RequestId(0), s + 1, &mut reqs);
            let (finish, cross) = g.heap_entries();
            assert!(finish <= bound && cross <= bound, "step {s}: {finish} and {cross} entries for 2 members");
        }
        // Member 0 joined last at step 5,000 with 1 + 2 × 5,000 tokens of
        // its 20,000: it finishes after step 5,000 + 9,999 − 1; member 1
        // (joined at 0 with 1 of 50,000) after step 49,998.
        assert_eq!(reqs[0].seq.generated, 10_001);
        assert_eq!(g.next_finish(), 14_998);
        g.advance_by(14_998 - 4_999); // steps 5,000 to 14,998
        assert_eq!(g.pop_finished(14_997, &mut reqs), None);
        assert_eq!(g.pop_finished(14_998, &mut reqs), Some(RequestId(0)));
        assert_eq!((reqs[0].seq.generated, g.len()), (20_000, 1));
        g.advance_by(49_998 - 14_998);
        assert_eq!(g.pop_finished(49_997, &mut reqs), None, "no stale entry of member 0 comes out");
        assert_eq!(g.pop_finished(49_998, &mut reqs), Some(RequestId(1)));
    }

    #[test]
    fn blocks_over_a_range_are_the_steps_blocks_summed() {
        // Members in several residue classes (two in one); ranges that start
        // anywhere in the cycle, wrap round it, and span whole cycles.
        let cfg = toy(1000, 8);
        let mut reqs = arena(&[(15, 500), (20, 500), (33, 500), (47, 500), (3, 500)]);
        let mut g = DecodeGroup::new(cfg.block_size, None);
        let members = [(15, 7), (20, 7), (33, 9), (47, 9), (3, 26)];
        for (i, (computed, join)) in members.into_iter().enumerate() {
            reqs[i].seq.computed = computed;
            reqs[i].seq.generated = 1;
            g.join(RequestId(i as u32), join, &mut reqs);
        }
        // Independently of the group's counters: in step `s` a member that
        // joined at `j` with `c` computed tokens writes KV position
        // `c + (s − j)`, and needs a new block when that starts one.
        let starts =
            |s: u64| members.iter().filter(|&&(c, j)| (c + s - j).is_multiple_of(cfg.block_size)).count() as u64;
        for from in 26..26 + 16 {
            for n in 0..70 {
                let each: u64 = (from..from + n).map(|s| g.blocks_needed(s)).sum();
                assert_eq!(each, (from..from + n).map(starts).sum::<u64>(), "steps {from}..{}", from + n);
                assert_eq!(g.blocks_over(from, n), each, "steps {from}..{}", from + n);
                for allowance in [0, 1, 3, each] {
                    let most = g.steps_within(from, n, allowance);
                    let fits = |k: u64| (from..from + k).map(|s| g.blocks_needed(s)).sum::<u64>() <= allowance;
                    assert!(
                        fits(most) && (most == n || !fits(most + 1)),
                        "{allowance} blocks from {from}: {most} steps"
                    );
                }
            }
        }
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
        let next = poll(&mut w, t, &mut reqs, &cfg);
        assert_eq!((w.running(), w.waiting()), (2, 2));
        drain(&mut w, next, &mut reqs, &cfg);
        // Requests 2 and 3 start only after 0 and 1 finish.
        assert!(reqs[2].first_scheduled.unwrap() >= reqs[0].finished.unwrap());
        assert!(reqs.iter().all(|r| r.finished.is_some()));
    }
}
