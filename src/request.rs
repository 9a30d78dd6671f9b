//! A request's state as it moves through the platform: what was asked for,
//! where it is in the worker's scheduler, and the timestamps its metrics are
//! computed from. Requests in flight live in one arena (`Vec<Request>`)
//! indexed by [`RequestId`]; components refer to them by id. A finished
//! request's slot is reused, so the arena holds as many requests as were
//! ever in flight at once, not as many as were simulated.

use crate::ids::{RequestId, StageId, WorkerId};
use crate::kvcache::{BlockHash, ChainSpan, ChunkedSeq, Content, chains_of, exact_key};
use crate::time::{SimDuration, SimTime};
use crate::workload::{Label, NewRequest};

/// The requests in flight: an arena whose slots finished requests give back.
#[derive(Default)]
pub struct Arena {
    /// The requests, by slot ([`RequestId`]).
    pub requests: Vec<Request>,
    /// Slots of `requests` free for reuse.
    pub free_slots: Vec<u32>,
    /// Requests generated so far (the next one's serial).
    pub generated: u32,
}

impl Arena {
    /// Puts a new request in a free slot (or a new one).
    pub fn admit(&mut self, now: SimTime, new: NewRequest) -> RequestId {
        let serial = self.generated;
        self.generated += 1;
        match self.free_slots.pop() {
            Some(slot) => {
                let id = RequestId(slot);
                self.requests[id.index()] = Request::new(id, serial, now, new);
                id
            }
            None => {
                let id = RequestId(self.requests.len() as u32);
                self.requests.push(Request::new(id, serial, now, new));
                id
            }
        }
    }

    /// Gives the request's slot back; its content and chains go now.
    pub fn free(&mut self, id: RequestId) {
        let r = &mut self.requests[id.index()];
        r.chains = Default::default();
        r.content = crate::kvcache::Content::default();
        self.free_slots.push(id.0);
    }

    /// The requests still in the arena.
    pub fn live(&self) -> impl Iterator<Item = &Request> {
        let mut live = vec![true; self.requests.len()];
        for &slot in &self.free_slots {
            live[slot as usize] = false;
        }
        self.requests.iter().zip(live).filter(|(_, live)| *live).map(|(r, _)| r)
    }
}

/// One inference request.
#[derive(Clone, Debug)]
pub struct Request {
    /// Its slot in the arena of requests in flight (reused once it is done).
    pub id: RequestId,
    /// Its number in generation order (unique in the run; the requests table's `request_id`).
    pub serial: u32,
    /// The workload stage that generated it.
    pub stage: StageId,
    /// When it was generated (arrived at the router).
    pub arrival: SimTime,
    /// Prompt length, tokens.
    pub prompt_tokens: u32,
    /// Tokens to generate (≥ 1).
    pub output_tokens: u32,
    /// The prompt's token content.
    pub content: Content,
    /// Content identity of its output (a later turn of a conversation includes it).
    pub output_id: u64,
    /// What the workload says it is.
    pub label: Label,
    /// The chains the full blocks of prompt + output lie on (computed when
    /// it reaches a worker, dropped when it finishes; a few, so inline):
    /// block `k`'s hash is its chain's and `k`'s ([`crate::kvcache::block_hash`]).
    pub chains: smallvec::SmallVec<[ChainSpan; 4]>,
    /// [`exact_key`] of its prompt, when the prompt ends inside a block
    /// (computed with `chains`, when `tails`).
    pub prompt_tail: Option<BlockHash>,
    /// Whether its runs that end inside a block are keyed (see [`Self::find_chains`]).
    pub tails: bool,
    /// The worker the router chose.
    pub worker: Option<WorkerId>,
    /// Scheduler state on that worker.
    pub seq: SeqState,
    /// Start of the first step that computed any of its tokens.
    pub first_scheduled: Option<SimTime>,
    /// End of the step that produced its first token.
    pub first_token: Option<SimTime>,
    /// End of the step that produced its last token.
    pub finished: Option<SimTime>,
    /// When its response left the platform (after its KV writes, if synchronous).
    pub responded: Option<SimTime>,
    /// Prompt (and recomputed) tokens prefilled, over all attempts.
    pub prefill_tokens_computed: u64,
    /// Times it was preempted.
    pub preemptions: u32,
    /// Tokens found cached at its first admission, per tier (indexed by
    /// `Tier::index`): what the prefix-hit ratio counts.
    pub hit_tokens: [u64; 4],
    /// Tokens found cached over all its admissions (a preempted request is
    /// admitted again and looks its prefix up again), every tier.
    pub hit_tokens_total: u64,
    /// Bytes loaded from each tier, over all its loads.
    pub read_bytes: [u64; 4],
    /// How long its first KV load took.
    pub fetch_time: Option<SimDuration>,
    /// Prompt tokens the router expected to find cached on the worker it chose.
    pub predicted_hit_tokens: Option<u64>,
    /// Its part in disaggregated serving.
    pub pd: PdPhase,
}

/// Where a request is in disaggregated prefill/decode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PdPhase {
    /// Served whole by one worker (mixed, or prefilled locally by a decode worker).
    #[default]
    Whole,
    /// On a prefill worker, asked for one token (`output_tokens` is 1 meanwhile).
    Prefill {
        /// The decode worker that will continue it.
        decode: WorkerId,
        /// The tokens it really asks for.
        output_tokens: u32,
        /// The prefill work it added to its prefill worker's pending work, tokens.
        pending: u64,
    },
    /// On its decode worker after the prefill, its prompt's KV pulled there.
    Decode {
        /// No token has been decoded on the decode worker yet.
        awaiting_first_step: bool,
    },
}

impl Request {
    /// Request number `serial`, just generated at `arrival`, in slot `id`.
    pub fn new(id: RequestId, serial: u32, arrival: SimTime, new: NewRequest) -> Request {
        let NewRequest { stage, prompt_tokens, output_tokens, content, output_id, label } = new;
        debug_assert!(prompt_tokens >= 1 && output_tokens >= 1);
        debug_assert_eq!(content.tokens(), u64::from(prompt_tokens), "content covers the prompt");
        Request {
            id,
            serial,
            stage,
            arrival,
            prompt_tokens,
            output_tokens,
            content,
            output_id,
            label,
            chains: Default::default(),
            prompt_tail: None,
            tails: false,
            worker: None,
            seq: SeqState { num_tokens: u64::from(prompt_tokens), ..SeqState::default() },
            first_scheduled: None,
            first_token: None,
            finished: None,
            responded: None,
            prefill_tokens_computed: 0,
            preemptions: 0,
            hit_tokens: [0; 4],
            hit_tokens_total: 0,
            read_bytes: [0; 4],
            fetch_time: None,
            predicted_hit_tokens: None,
            pd: PdPhase::Whole,
        }
    }

    /// Finds the chains of the full blocks of its prompt and output
    /// (`block_size` tokens each), which name their hashes; with `tails`
    /// (the tiers keep partial chunks: `save_unfull_chunk`), the keys of
    /// its runs that end inside a block too — else nothing reads them.
    pub fn find_chains(&mut self, block_size: u32, tails: bool) {
        let output = crate::kvcache::Segment { id: self.output_id, tokens: self.output_tokens };
        self.chains.clear();
        chains_of(self.content.segments.iter().chain(Some(&output)), block_size, &mut self.chains);
        self.tails = tails;
        self.prompt_tail =
            if tails { self.exact_key(u64::from(self.prompt_tokens), u64::from(block_size)) } else { None };
    }

    /// Full blocks of prompt + output.
    pub fn full_blocks(&self) -> u64 {
        self.chains.last().map_or(0, |s| s.end)
    }

    fn exact_key(&self, n: u64, block_size: u64) -> Option<BlockHash> {
        let output = crate::kvcache::Segment { id: self.output_id, tokens: self.output_tokens };
        exact_key(self.content.segments.iter().chain(Some(&output)), n, block_size, &self.chains)
    }

    /// Its first `n` tokens (prompt, then output) as the tiers see them.
    pub fn chunked(&self, n: u64, block_size: u64) -> ChunkedSeq<'_> {
        let tail = if !self.tails {
            None // no partial chunk is saved: nothing reads its key
        } else if n == u64::from(self.prompt_tokens) {
            self.prompt_tail
        } else if n / block_size > self.full_blocks() {
            None // not hashed: nothing reads its keys
        } else {
            self.exact_key(n, block_size)
        };
        ChunkedSeq { chains: &self.chains, tokens: n, tail }
    }
}

/// Where a request stands in the vLLM-style token accounting.
///
/// `num_tokens` (T) is prompt plus generated tokens; `computed` (C) is how
/// many of them have KV in the cache. A step schedules `T − C` tokens (or a
/// chunk of them); when C reaches T a token is sampled and T grows by one, so
/// a decoding sequence always has `T − C = 1`. While a request sits in the
/// worker's decode group its `computed`/`generated` fields are frozen at
/// their values on joining and advance arithmetically with the worker's step
/// counter (see `worker::DecodeGroup`).
#[derive(Clone, Copy, Debug, Default)]
pub struct SeqState {
    /// T: prompt + generated tokens.
    pub num_tokens: u64,
    /// C: tokens whose KV is computed.
    pub computed: u64,
    /// Tokens generated so far.
    pub generated: u64,
    /// Leading blocks it holds as references in the GPU prefix cache (the
    /// rest of its `ceil(computed / block_size)` blocks are private).
    pub registered: u64,
    /// Its hold on the prefix cache (the path of those blocks).
    pub path: crate::kvcache::Path,
    /// Order of admission to the running batch on its worker (for tie-breaks).
    pub admit_seq: u64,
    /// Whether it holds one of the worker's I/O slots.
    pub holds_io_slot: bool,
    /// Where it is in its worker's scheduler.
    pub status: RequestStatus,
    /// Prompt tokens whose chunks were offered to this worker's tiers as
    /// they were computed (`kvc.save_timing = "on_compute"`).
    pub saved: u64,
    /// Tokens of its prefix the tiers held, from its first token on, when
    /// it was last admitted or started loading (LMCache's
    /// `lmcache_cached_tokens`): its saves skip the chunks below it.
    pub tier_prefix: u64,
    /// What the current admission attempt starts with, per tier: the GPU
    /// prefix it holds and the tokens it loads (or loaded) from each tier.
    /// Credited as hits when it is admitted.
    pub hit: [u64; 4],
    /// When its latest token was produced (for the inter-token gap after a preemption).
    pub last_token_at: SimTime,
    /// Decode-group bookkeeping; valid while it is decoding.
    pub decode: DecodeSlot,
}

/// Where a request is in its worker's scheduler, after vLLM's
/// `RequestStatus` (`vllm/v1/request.py`): waiting, waiting for its KV to
/// arrive from an external store (`WAITING_FOR_REMOTE_KVS`), running
/// (prefilling or decoding), finished. A preempted request is `Waiting`
/// again (vLLM's `PREEMPTED` re-enters the waiting queue the same way).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RequestStatus {
    /// In the waiting queue, holding no KV (new, or preempted).
    #[default]
    Waiting,
    /// In the waiting queue while its KV loads from the tiers or over the P/D link.
    WaitingForRemoteKvs,
    /// In the waiting queue holding the KV its load brought, until admitted.
    Loaded,
    /// In the running batch, prefilling its prompt (or recomputing) chunk by chunk.
    Prefilling,
    /// In the running batch, in the worker's decode group.
    Decoding,
    /// Its last token is out (its KV may still be saving).
    Finished,
}

/// A decoding request's position in its worker's decode group.
#[derive(Clone, Copy, Debug, Default)]
pub struct DecodeSlot {
    /// Worker step index of its first decode step.
    pub join_step: u64,
    /// `computed` at joining.
    pub computed_at_join: u64,
    /// `generated` at joining.
    pub generated_at_join: u64,
    /// Index in the group's member list.
    pub pos: u32,
    /// Bumped on every join so stale finish entries can be recognised.
    pub epoch: u32,
    /// Whether it is in the group now.
    pub active: bool,
}
