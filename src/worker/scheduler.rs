//! The worker's scheduler proper: the waiting queue as vLLM walks it with a
//! KV connector (lookups, loads and their I/O slots, admission), and
//! preemption by recompute (see the module above for the rules).

use super::{Pass, Scheduler, SlotMode, Worker, WorkerConfig};
use crate::ids::RequestId;
use crate::kvcache::{ConnectorOutput, ExternalHit, Hit, KvConnector, LoadDone, Tier};
use crate::request::{Request, RequestStatus, SeqState};
use crate::time::SimTime;
use crate::worker::perf::PrefillChunk;
use std::cmp::Reverse;
use std::collections::VecDeque;

/// What [`Worker::admit`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Admission {
    /// Admitted with its first chunk.
    Admitted,
    /// Its first chunk's blocks (beside those kept) cannot be had; nothing
    /// was touched.
    NoBlocks,
    /// Refused otherwise: no I/O slot in single-stage mode, or a whole
    /// prompt over the budget without chunked prefill.
    Refused,
}

/// What [`Worker::room`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Room {
    /// The blocks are allocated.
    Got,
    /// A waiting request's loaded KV was given up: ask again.
    Freed,
    /// Only loads in flight hold what is missing: plan nothing until one finishes.
    Wait,
    /// A running request must be preempted.
    Short,
}

/// The scheduler's own state: vLLM's waiting queue, and the KV loads and
/// I/O slots of the requests in it.
#[derive(Debug, Default)]
pub(super) struct WaitingQueue {
    /// Waiting for the scheduler, FIFO.
    pub(super) queue: VecDeque<RequestId>,
    /// I/O slots held.
    pub(super) io_in_use: u32,
    /// Waiting requests that are loading KV or hold loaded KV.
    pub(super) kv_waiting: u32,
    /// Loads in flight.
    pub(super) loading: u32,
    /// Admissions so far (a running request's admission order).
    pub(super) admit_counter: u64,
    /// The new request whose load last could not start for lack of blocks
    /// or an I/O slot, and what it saw: until that changes it cannot start,
    /// so it is not looked up again.
    pub(super) blocked: Option<BlockedLoad>,
    /// The new request whose admission last did not fit in the blocks, and
    /// what it saw (see [`BlockedAdmit`]).
    pub(super) blocked_admit: Option<BlockedAdmit>,
    /// Times [`Self::blocked_admit`] spared a look-up (tests).
    #[cfg(test)]
    pub(super) admit_memo_hits: u64,
    /// After a pass between step ends that stopped before the end of the
    /// queue: what it saw. Until that changes (or a step ends), such a pass
    /// would find nothing new to load.
    pub(super) load_pass: Option<SlotView>,
}

/// What decides whether a load can start, besides the request: the GPU
/// prefix cache (its epoch changes whenever blocks are freed or cached)
/// and the I/O slots in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SlotView {
    /// [`PrefixCache::epoch`].
    pub(super) cache_epoch: u64,
    /// I/O slots in use.
    pub(super) io_in_use: u32,
}

/// A new request whose load could not start, and what it saw then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BlockedLoad {
    /// The request's serial number.
    pub(super) serial: u32,
    /// The cache and I/O slots then.
    pub(super) view: SlotView,
    /// Waiting requests holding KV then.
    pub(super) kv_holders: u32,
}

/// A new request, found in no tier, whose admission did not fit in the
/// blocks (nothing was touched): the cache's epoch, the token budget and
/// the blocks promised ahead then. While the epoch stays, nothing was
/// freed, made evictable or cached — its GPU hit can only have shrunk, and
/// what can be allocated too — so with at least that budget (a chunk as
/// large) and that many blocks promised, neither its admission nor a load
/// (the loaded blocks and the chunk after them are at least the chunk's,
/// when admission keeps no watermark) can fit: it is not looked up again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BlockedAdmit {
    serial: u32,
    cache_epoch: u64,
    budget: u64,
    promised: u64,
}

impl Worker {
    /// What the next load's chance depends on now (see [`SlotView`]).
    pub(super) fn slot_view(&self) -> SlotView {
        SlotView { cache_epoch: self.cache.epoch(), io_in_use: self.waiting.io_in_use }
    }

    /// A request's KV load finished (`d`): its bytes read per tier and (for
    /// a tier load) its fetch time are the request's, the loaded blocks join
    /// the prefix cache (still held by the request, which stays in the
    /// waiting queue until admitted); in pipelined mode it returns its I/O slot.
    pub fn fetched(&mut self, d: &LoadDone, now: SimTime, reqs: &mut [Request], cfg: &WorkerConfig) {
        let (id, r) = (d.request, &mut reqs[d.request.index()]);
        for (acc, b) in r.read_bytes.iter_mut().zip(d.bytes) {
            *acc += b;
        }
        if d.link_bytes == 0 {
            r.fetch_time.get_or_insert(now - d.started);
        }
        r.seq.status = RequestStatus::Loaded;
        self.waiting.loading -= 1;
        self.register_blocks(id, now, reqs, cfg);
        if cfg.slot_mode == SlotMode::Pipelined {
            self.release_io_slot(id, reqs);
        }
    }

    pub(super) fn take_io_slot(&mut self, id: RequestId, reqs: &mut [Request]) {
        let seq = &mut reqs[id.index()].seq;
        if !seq.holds_io_slot {
            seq.holds_io_slot = true;
            self.waiting.io_in_use += 1;
        }
    }

    pub(super) fn release_io_slot(&mut self, id: RequestId, reqs: &mut [Request]) {
        let seq = &mut reqs[id.index()].seq;
        if seq.holds_io_slot {
            seq.holds_io_slot = false;
            self.waiting.io_in_use -= 1;
        }
    }

    pub(super) fn has_room(&self, budget: u64, cfg: &WorkerConfig) -> bool {
        self.running() < cfg.max_running as usize && budget > 0
    }

    /// Walks the waiting queue in FIFO order (see the module docs): admits
    /// (with [`Pass::Admit`]) and starts loads. Returns true if it stopped
    /// before the end of the queue because nothing behind could move.
    /// (Most calls find the queue empty: that is checked here, inlined.)
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn schedule_waiting(
        &mut self,
        now: SimTime,
        pass: Pass,
        budget: &mut u64,
        reqs: &mut [Request],
        cfg: &WorkerConfig,
        conn: &mut KvConnector,
        out: &mut ConnectorOutput,
    ) -> bool {
        !self.waiting.queue.is_empty() && self.walk_waiting(now, pass, budget, reqs, cfg, conn, out)
    }

    /// [`Self::schedule_waiting`] of a queue with requests in it.
    #[allow(clippy::too_many_arguments)]
    fn walk_waiting(
        &mut self,
        now: SimTime,
        pass: Pass,
        budget: &mut u64,
        reqs: &mut [Request],
        cfg: &WorkerConfig,
        conn: &mut KvConnector,
        out: &mut ConnectorOutput,
    ) -> bool {
        let idle = self.running() == 0;
        let window = cfg.io_slots as usize;
        let mut blocked = false;
        // Blocks the KV-holding requests passed will need for their next
        // chunks: what is left for those behind them (vLLM serves its
        // waiting queue in order).
        let mut promised = 0;
        // Requests holding KV not yet passed (they may go ahead of a blocked head).
        let mut holders = self.waiting.kv_waiting;
        let mut pos = 0;
        while pos < self.waiting.queue.len() {
            // A new request can load only within the window, and be admitted only with room.
            let new_may_move = !blocked && (pos < window || (pass == Pass::Admit && self.has_room(*budget, cfg)));
            if !new_may_move && holders == 0 {
                return true;
            }
            let id = self.waiting.queue[pos];
            let (seq, seq_serial) = (reqs[id.index()].seq, reqs[id.index()].serial);
            if seq.status == RequestStatus::WaitingForRemoteKvs {
                holders -= 1;
                promised += next_chunk_blocks(&seq, cfg);
                pos += 1;
                continue;
            }
            if seq.computed > 0 {
                holders -= 1;
                if pass == Pass::Admit
                    && self.has_room(*budget, cfg)
                    && self.admit(now, pos, Hit::NONE, promised, budget, reqs, cfg, conn, idle) == Admission::Admitted
                {
                    continue;
                }
                // Its load done, it waits for blocks for its next chunk: vLLM
                // `break`s there (`allocate_slots` returned None), so new
                // requests behind it wait too — or they would take the blocks
                // it needs, again and again.
                let next = next_chunk_blocks(&seq, cfg);
                if !self.cache.can_allocate(next + promised, now, idle) {
                    blocked = true;
                }
                promised += next;
                pos += 1;
                continue;
            }
            if !new_may_move {
                pos += 1;
                continue;
            }
            let memo = BlockedLoad { serial: seq_serial, view: self.slot_view(), kv_holders: self.waiting.kv_waiting };
            if self.waiting.blocked == Some(memo) && cfg.apc_ttl.0 == 0 {
                blocked = true;
                pos += 1;
                continue;
            }
            let admit_blocked = self.waiting.blocked_admit.is_some_and(|m| {
                m.serial == seq_serial
                    && m.cache_epoch == self.cache.epoch()
                    && *budget >= m.budget
                    && promised >= m.promised
                    && cfg.apc_ttl.0 == 0
                    && cfg.admission_watermark == 0
            });
            if admit_blocked && pass == Pass::Admit && self.has_room(*budget, cfg) {
                // (Debug builds check what the memo stands for: the chunk still does not fit.)
                #[cfg(debug_assertions)]
                {
                    let r = &reqs[id.index()];
                    let max = cfg.max_hit_blocks(r.seq.num_tokens).min(r.full_blocks() as usize);
                    let local = self.cache.lookup(&r.chains, max as u64);
                    let c = local.blocks() * cfg.block_size;
                    let need = cfg.blocks_for(c + (r.seq.num_tokens - c).min(*budget)) - cfg.blocks_for(c);
                    debug_assert!(
                        !self.cache.can_allocate_with(local, need + promised, now, idle),
                        "a memo that holds"
                    );
                }
                #[cfg(test)]
                {
                    self.waiting.admit_memo_hits += 1;
                }
                blocked = true;
                pos += 1;
                continue;
            }
            // What it already has: the GPU prefix, then what the tiers hold beyond it.
            let r = &reqs[id.index()];
            let max = cfg.max_hit_blocks(r.seq.num_tokens).min(r.full_blocks() as usize);
            let local = self.cache.lookup(&r.chains, max as u64);
            let seq = r.chunked(r.seq.num_tokens, cfg.block_size);
            // Found nothing, it is admitted at once if there is room.
            let external = if pass == Pass::Admit && self.has_room(*budget, cfg) {
                conn.lookup_to_admit(self.id, id, &seq, local.blocks())
            } else {
                conn.lookup(self.id, id, &seq, local.blocks())
            };
            if external.tokens > 0 {
                // At most io_slots waiting requests hold KV, and only the first
                // io_slots places of the queue load.
                if pos < window && self.waiting.kv_waiting < cfg.io_slots {
                    if self.start_load(now, id, local, external, promised, reqs, cfg, conn, out, idle) {
                        promised += next_chunk_blocks(&reqs[id.index()].seq, cfg);
                        pos += 1;
                        continue;
                    }
                    self.waiting.blocked = Some(memo);
                }
            } else if pass == Pass::Admit && self.has_room(*budget, cfg) {
                match self.admit(now, pos, local, promised, budget, reqs, cfg, conn, idle) {
                    Admission::Admitted => continue,
                    Admission::NoBlocks => {
                        let cache_epoch = self.cache.epoch();
                        self.waiting.blocked_admit =
                            Some(BlockedAdmit { serial: seq_serial, cache_epoch, budget: *budget, promised });
                    }
                    Admission::Refused => {}
                }
            } else {
                // It waits for room in the batch, not for memory: later
                // requests may still start their loads.
                pos += 1;
                continue;
            }
            // It stays waiting, and every new request behind it waits too.
            blocked = true;
            pos += 1;
        }
        false
    }

    /// Starts loading the `external` tokens the tiers hold for new request
    /// `id` beyond its `local` GPU prefix (as just looked up), if it can have an I/O slot
    /// and the GPU blocks for them; false (and nothing held) if not.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_load(
        &mut self,
        now: SimTime,
        id: RequestId,
        local: Hit,
        external: ExternalHit,
        promised: u64,
        reqs: &mut [Request],
        cfg: &WorkerConfig,
        conn: &mut KvConnector,
        out: &mut ConnectorOutput,
        idle: bool,
    ) -> bool {
        let r = &mut reqs[id.index()];
        if !r.seq.holds_io_slot && self.waiting.io_in_use >= cfg.io_slots {
            return false;
        }
        let g = local.blocks();
        let computed = g * cfg.block_size + external.tokens;
        let need = cfg.blocks_for(computed) - g;
        // vLLM allocates the loaded tokens' blocks and the first chunk's in
        // one call (`allocate_slots(request, num_new_tokens +
        // num_external_computed_tokens)`; LMCache loads synchronously): a
        // load starts only when the chunk that follows it would fit too,
        // beside what the requests ahead were promised.
        let loaded = SeqState { computed, ..r.seq };
        let with_chunk = need + next_chunk_blocks(&loaded, cfg) + promised;
        // With the GPU prefix taken, weighed before it is taken (see `admit`).
        if !self.cache.can_allocate_with(local, with_chunk, now, idle) {
            return false;
        }
        let path = self.cache.acquire(local, now);
        self.cache.allocate(need, now, idle);
        let loaded = conn.load(now, self.id, id, &r.chunked(r.seq.num_tokens, cfg.block_size), g, out);
        debug_assert_eq!(loaded, external, "lookup and load walk the same chunks");
        let tier_prefix = conn.admitted(self.id, id, &r.chunked(r.seq.num_tokens, cfg.block_size), g);
        let seq = &mut r.seq;
        seq.tier_prefix = tier_prefix;
        seq.path = path;
        seq.registered = g;
        seq.computed = computed;
        seq.status = RequestStatus::WaitingForRemoteKvs;
        seq.hit = external.per_tier;
        seq.hit[Tier::Gpu.index()] = g * cfg.block_size;
        self.take_io_slot(id, reqs);
        self.waiting.kv_waiting += 1;
        self.waiting.loading += 1;
        self.counts.kv_loads += 1;
        self.counts.kv_load_tokens += external.tokens;
        debug_assert!(
            self.waiting.kv_waiting <= cfg.io_slots,
            "KV-holding waiting requests are within the first io_slots places"
        );
        true
    }

    /// Admits the waiting request at `pos` into the running batch with its
    /// first prefill chunk, if the chunk fits: a loaded request brings what
    /// it loaded, a new one takes its `local` GPU prefix (as just looked up). Its hits are
    /// credited (first admission and total). If it is not admitted nothing
    /// changed, and the answer says whether the blocks were what was missing.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn admit(
        &mut self,
        now: SimTime,
        pos: usize,
        local: Hit,
        promised: u64,
        budget: &mut u64,
        reqs: &mut [Request],
        cfg: &WorkerConfig,
        conn: &mut KvConnector,
        idle: bool,
    ) -> Admission {
        let id = self.waiting.queue[pos];
        let r = &mut reqs[id.index()];
        if cfg.slot_mode == SlotMode::SingleStage && !r.seq.holds_io_slot && self.waiting.io_in_use >= cfg.io_slots {
            return Admission::Refused;
        }
        let holding = r.seq.computed > 0;
        let c = if holding { r.seq.computed } else { local.blocks() * cfg.block_size };
        let remaining = r.seq.num_tokens - c;
        let chunk = remaining.min(*budget);
        // Blocks left free at admission: those promised to the KV holders
        // ahead, and v0's watermark (while anything runs, so that a lone
        // request is never refused).
        let keep = promised + if self.running() > 0 { cfg.admission_watermark } else { 0 };
        let need = cfg.blocks_for(c + chunk) - cfg.blocks_for(c);
        if !(cfg.chunked_prefill || chunk == remaining) {
            return Admission::Refused;
        }
        // With a new request's hit taken (its unreferenced blocks no longer
        // evictable), weighed before it is taken: a request that does not
        // fit leaves the hit untouched, as in vLLM. (A holder's is Hit::NONE.)
        if !self.cache.can_allocate_with(local, need + keep, now, idle) {
            return Admission::NoBlocks;
        }
        if !holding {
            r.seq.path = self.cache.acquire(local, now);
            r.seq.registered = local.blocks();
            r.seq.computed = c;
            r.seq.tier_prefix =
                conn.admitted(self.id, id, &r.chunked(r.seq.num_tokens, cfg.block_size), local.blocks());
            r.seq.hit = [0; 4];
            r.seq.hit[Tier::Gpu.index()] = c;
        }
        self.waiting.queue.remove(pos);
        self.cache.allocate(need, now, idle);
        if holding {
            self.waiting.kv_waiting -= 1;
        } else if cfg.slot_mode == SlotMode::SingleStage {
            self.take_io_slot(id, reqs);
        }
        let r = &mut reqs[id.index()];
        r.seq.status = RequestStatus::Prefilling;
        r.seq.admit_seq = self.waiting.admit_counter;
        self.waiting.admit_counter += 1;
        if r.first_scheduled.is_none() {
            r.first_scheduled = Some(now);
            r.hit_tokens = r.seq.hit;
        }
        r.hit_tokens_total += r.seq.hit.iter().sum::<u64>();
        self.prefilling.push(id);
        self.chunks.push((id, PrefillChunk { cached: c, end: c + chunk }));
        *budget -= chunk;
        Admission::Admitted
    }

    /// A waiting request holding loaded KV gives its blocks (and slot) up;
    /// it keeps its place and will look its prefix up again.
    pub(super) fn drop_loaded(&mut self, now: SimTime, id: RequestId, reqs: &mut [Request], cfg: &WorkerConfig) {
        self.release_blocks(id, now, reqs, cfg);
        self.release_io_slot(id, reqs);
        let r = &mut reqs[id.index()];
        r.seq.computed = 0;
        r.seq.hit = [0; 4];
        r.seq.status = RequestStatus::Waiting;
        r.preemptions += 1;
        self.waiting.kv_waiting -= 1;
        self.counts.preemptions += 1;
    }

    /// Blocks for the running batch, as vLLM's `allocate_slots` for a
    /// running request, with two rules of progress vLLM lacks (without them a
    /// worker under KV pressure with a tier can preempt and reload one request
    /// forever, or stop with work queued): waiting requests holding loaded KV
    /// give it up before a running request is preempted (running requests are
    /// scheduled first in both vLLM schedulers; loaded KV is reloaded from its
    /// tier for the cost of a read, where a preemption loses computed work),
    /// and the only running request is not preempted for blocks that loads
    /// in flight hold: the worker waits for the loads to finish, and their
    /// KV then gives way.
    pub(super) fn room(&mut self, need: u64, now: SimTime, reqs: &mut [Request], cfg: &WorkerConfig) -> Room {
        if self.cache.can_allocate(need, now, false) {
            self.cache.allocate(need, now, false);
            return Room::Got;
        }
        if self.waiting.kv_waiting > self.waiting.loading {
            let last = self
                .waiting
                .queue
                .iter()
                .rev()
                .copied()
                .find(|id| reqs[id.index()].seq.status == RequestStatus::Loaded);
            self.drop_loaded(now, last.expect("kv_waiting counts loaded requests"), reqs, cfg);
            return Room::Freed;
        }
        if self.running() <= 1 && self.waiting.loading > 0 {
            return Room::Wait;
        }
        Room::Short
    }

    /// Plans nothing until a load finishes ([`Room::Wait`]); decoders wait from now.
    pub(super) fn wait_for_loads(&mut self, now: SimTime) -> Option<(SimTime, u32)> {
        debug_assert!(self.chunks.is_empty() && self.waiting.loading > 0);
        if !self.decode.is_empty() {
            self.paused_since.get_or_insert(now);
        }
        None
    }

    /// The running request to preempt when blocks are short: under v1 the
    /// one with the least work done ([`Self::least_work_victim`]); under v0
    /// (`_schedule_running`'s `running_queue.pop()`, the queue ordered
    /// decodes first, then prefills in admission order) the last prefilling
    /// request not yet scheduled — after position `from`, or from it with
    /// `with_decoders` — else the latest admitted decoder (`with_decoders`),
    /// else the requester at `from` itself.
    pub(super) fn victim(
        &self,
        from: usize,
        s: u64,
        reqs: &[Request],
        with_decoders: bool,
        cfg: &WorkerConfig,
    ) -> Option<RequestId> {
        match cfg.scheduler {
            Scheduler::V1 => self.least_work_victim(from, s, reqs, with_decoders),
            Scheduler::V0 if with_decoders => self.prefilling[from..]
                .last()
                .copied()
                .or_else(|| self.decode.members().iter().copied().max_by_key(|id| reqs[id.index()].seq.admit_seq)),
            Scheduler::V0 => self.prefilling[from + 1..].last().or(self.prefilling.get(from)).copied(),
        }
    }

    /// The running request with the least work done (fewest computed tokens;
    /// ties: the latest admitted) among the prefilling requests from position
    /// `from` on and, if `with_decoders`, every decoding request.
    pub(super) fn least_work_victim(
        &self,
        from: usize,
        s: u64,
        reqs: &[Request],
        with_decoders: bool,
    ) -> Option<RequestId> {
        let key = |id: RequestId, computed: u64| (computed, Reverse(reqs[id.index()].seq.admit_seq));
        let prefill = self.prefilling[from..].iter().map(|&id| (key(id, reqs[id.index()].seq.computed), id));
        let decoders = self
            .decode
            .members()
            .iter()
            .filter(|_| with_decoders)
            .map(|&id| (key(id, self.decode.computed(id, s, reqs)), id));
        prefill.chain(decoders).min_by_key(|&(k, _)| k).map(|(_, id)| id)
    }

    /// vLLM v0's victim: the running request admitted last (`self.running.pop()`).
    pub(super) fn latest_admitted_victim(&self, reqs: &[Request]) -> RequestId {
        let decoders = self.decode.members().iter();
        let running = self.prefilling.iter().chain(decoders);
        *running.max_by_key(|id| reqs[id.index()].seq.admit_seq).expect("blocks are short but nothing is running")
    }

    /// Preempts `id` by recompute before step `s`: it frees its blocks and
    /// goes back to the front of the waiting queue, where it will look its
    /// prefix up again (GPU, then tiers).
    pub(super) fn preempt(&mut self, now: SimTime, id: RequestId, s: u64, reqs: &mut [Request], cfg: &WorkerConfig) {
        if reqs[id.index()].seq.status == RequestStatus::Decoding {
            let (computed, generated) = self.decode.leave(id, s, reqs);
            let seq = &mut reqs[id.index()].seq;
            seq.computed = computed;
            seq.generated = generated;
            seq.num_tokens = computed + 1;
            // Its last token came at the last step's end, or before a pause.
            seq.last_token_at = self.paused_since.map_or(now, |p| p.max(seq.last_token_at));
        } else {
            let pos = self.prefilling.iter().position(|&p| p == id).expect("victim is running");
            self.prefilling.remove(pos);
        }
        self.release_blocks(id, now, reqs, cfg);
        let r = &mut reqs[id.index()];
        r.seq.computed = 0;
        r.seq.hit = [0; 4];
        r.seq.status = RequestStatus::Waiting;
        r.preemptions += 1;
        self.counts.preemptions += 1;
        self.waiting.queue.push_front(id);
    }
}

/// Blocks the next prefill chunk of `seq` needs beyond those of its
/// computed tokens (a chunk of at most the token budget, or, without
/// chunked prefill, the rest).
fn next_chunk_blocks(seq: &SeqState, cfg: &WorkerConfig) -> u64 {
    let rest = seq.num_tokens - seq.computed;
    let chunk = if cfg.chunked_prefill { rest.min(cfg.token_budget) } else { rest };
    cfg.blocks_for(seq.computed + chunk) - cfg.blocks_for(seq.computed)
}
