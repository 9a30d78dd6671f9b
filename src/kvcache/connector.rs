//! The KV connector: what vLLM v1's `KVConnectorBase_V1` does with LMCache
//! behind it (`vllm/distributed/kv_transfer/kv_connector/v1/base.py`,
//! `lmcache/integration/vllm/vllm_v1_adapter.py`), over the tiers below the
//! GPU — per-worker CPU memory and NVMe, and one distributed file system for
//! the cluster.
//!
//! Scheduler side: [`KvConnector::lookup`] is `get_num_new_matched_tokens`
//! — side-effect free, it says how many tokens beyond a request's GPU
//! prefix the tiers hold, walking the request's chunks in order and taking
//! each from the fastest tier holding it. When the prompt is held whole, the
//! last token is left to compute (LMCache: "in the full-prompt-hit case we
//! need to recompute the last token"), so a prompt of exactly `n ×
//! block_size` tokens loses one token, not a block or a chunk. The worker's
//! scheduler allocates GPU blocks for the loaded tokens and then calls
//! [`KvConnector::load`] (`update_state_after_alloc` + `start_load_kv`): the
//! chunks are pinned against eviction and read from their tiers' devices;
//! when the last read finishes a [`LoadDone`] comes out and the request is
//! schedulable with those tokens computed (vLLM's `WAITING_FOR_REMOTE_KVS`
//! ends).
//!
//! Worker side: [`KvConnector::save`] writes a request's chunks to the
//! tiers (write-through to every tier, or to the first with spill-down of
//! what it evicts) — its **prompt** KV only unless `save_decode_cache` is
//! set, as LMCache does by default — and only the chunks beyond what the
//! tiers held when the request was scheduled ([`KvConnector::admitted`]);
//! a chunk a tier already holds is neither rewritten nor refreshed. By default (`kvc.save_timing = "on_compute"`)
//! the cluster calls it at the end of every step that completed chunks of a
//! prompt, as LMCache's connector saves each layer's KV during the forward
//! pass (`save_kv_layer`) and waits for it at the end of the step
//! (`wait_for_save`): a chunk is visible to every lookup once its write
//! completes, while the prompt is still being computed; and again when the
//! request finishes (the output's chunks with `save_decode_cache`).
//! `"on_finish"` saves only then. In `sync` write mode a finished request's
//! response waits for its writes still in flight ([`KvConnector::finish_saves`]).
//!
//! A chunk a worker reads from a slower tier (its NVMe, the shared DFS) is
//! then written into its faster per-worker tiers (`KvConnector::write_back`'s
//! rule: LMCache's `StorageManager.get` keeps a disk or remote hit in its CPU
//! cache), unless `kvc.write_back_hits = false`.
//!
//! Eviction order: the lookup as a request is scheduled refreshes its held
//! prefix, and a write inserts new chunks, **last chunk first**, so the
//! root of what is refreshed or written is the most recent (vLLM's block
//! pool frees a finished request's blocks tail first for the same reason).
//! New chunks go to the recent end, as LMCache's puts do, so a cold
//! prefix's root can be evicted before its newest descendants, which are
//! then unreachable until the root is written again — LMCache's own
//! behaviour; a save no longer re-touches the whole prefix to prevent it.
//!
//! Disaggregated prefill (issue: P/D): a decode worker pulls the KV a
//! prefill worker computed over its own link, as vLLM's NixlConnector does
//! (the decode side's `get_num_new_matched_tokens` reports the remote
//! prompt; the scheduler allocates the blocks, then the transfer runs):
//! [`KvConnector::offer_remote`] marks a request's prompt as held remotely,
//! and its next lookup on the decode worker reports every prompt token
//! beyond the GPU prefix, loaded through that worker's link device (shared
//! fairly by its transfers, like a tier's device).
//!
//! Like every component it is passive: calls take `now` and append their
//! effects — device timers to schedule, loads and synchronous saves that
//! finished, KV events for the router, bytes moved — to a
//! [`ConnectorOutput`] for the cluster to turn into events.

use super::{
    BlockHash, ChunkKey, ChunkStore, ChunkedSeq, EventChunks, KvEvent, KvEventKind, KvcConfig, Run, Tier, WriteMode,
    WritePolicy,
};
use crate::ids::{RequestId, WorkerId};
use crate::storage::{Device, DeviceOutput, DeviceStats, DeviceTimer, OpId, OpKind};
use crate::time::SimTime;
use nohash_hasher::IntMap;

/// What the tiers hold beyond a request's GPU prefix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExternalHit {
    /// Tokens to load (at most `num_tokens − 1` minus the GPU prefix).
    pub tokens: u64,
    /// Of those, how many come from each tier (indexed by [`Tier::index`]; the GPU's is 0).
    pub per_tier: [u64; 4],
}

/// A load whose last read finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadDone {
    /// The request.
    pub request: RequestId,
    /// Its worker.
    pub worker: WorkerId,
    /// When the load started.
    pub started: SimTime,
    /// Bytes read from each tier.
    pub bytes: [u64; 4],
    /// Bytes pulled over the worker's link (a remote prefill's KV).
    pub link_bytes: u64,
}

/// Effects of a connector call, for the cluster to apply (and then clear).
#[derive(Debug, Default)]
pub struct ConnectorOutput {
    /// Device timers to schedule: `(when, tier instance, timer)`.
    pub timers: Vec<(SimTime, u32, DeviceTimer)>,
    /// Loads that finished.
    pub loaded: Vec<LoadDone>,
    /// Requests whose synchronous save finished.
    pub saved: Vec<RequestId>,
    /// KV events for the router (a chunk stored in, or evicted from, a tier).
    pub events: Vec<(WorkerId, KvEvent)>,
    /// Bytes moved by each finished device operation, by tier.
    pub moved: Vec<(Tier, u64)>,
}

impl ConnectorOutput {
    /// Nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.timers.is_empty()
            && self.loaded.is_empty()
            && self.saved.is_empty()
            && self.events.is_empty()
            && self.moved.is_empty()
    }

    /// Empties every list (keeping their allocations).
    pub fn clear(&mut self) {
        self.timers.clear();
        self.loaded.clear();
        self.saved.clear();
        self.events.clear();
        self.moved.clear();
    }
}

/// A tier instance at the end of a run.
#[derive(Clone, Copy, Debug)]
pub struct InstanceReport {
    /// Its tier.
    pub tier: Tier,
    /// Its device's counters.
    pub stats: DeviceStats,
    /// Most bytes it held.
    pub peak_bytes: u64,
    /// Its capacity.
    pub capacity_bytes: u64,
    /// The work its store did.
    pub ops: super::StoreOps,
}

/// One tier's store and device (per worker for CPU and NVMe, one for the DFS).
struct TierInstance {
    tier: Tier,
    store: ChunkStore,
    device: Device,
}

enum Purpose {
    /// A read of a load: the runs of chunks read, with each chunk's whole size in bytes.
    Load {
        request: RequestId,
        keys: Vec<(Run, u64)>,
    },
    Save {
        keys: Vec<Run>,
        waiters: Vec<RequestId>,
        worker: WorkerId,
    },
}

/// Each worker's tier instances in lookup order, one run of `per_worker`
/// after another (every worker has the same tiers): one small array that
/// stays in cache, not a list per worker behind a pointer of its own.
struct WorkerTiers {
    flat: Vec<u32>,
    per_worker: usize,
}

impl WorkerTiers {
    fn of(&self, w: WorkerId) -> &[u32] {
        &self.flat[w.index() * self.per_worker..(w.index() + 1) * self.per_worker]
    }
}

struct IoOp {
    instance: u32,
    purpose: Purpose,
}

struct Load {
    worker: WorkerId,
    started: SimTime,
    reads_left: u32,
    bytes: [u64; 4],
    link_bytes: u64,
}

/// Instance ids at and above this are workers' links (the worker's index below it).
const LINK: u32 = 1 << 31;

/// A run of chunks of a lookup: the instance holding them, the run, the
/// tokens `[from, to)` of it beyond the GPU prefix, and each chunk's whole
/// size in bytes.
#[derive(Clone, Copy, Debug)]
struct Found {
    instance: u32,
    run: Run,
    from: u64,
    to: u64,
    bytes: u64,
}

/// A step's writes to one tier instance, gathered: the chunks reserved, their bytes, who waits.
type BatchedWrite = (Vec<Run>, u64, Vec<RequestId>);

/// The KV connector of a cluster (every worker's tiers and the shared DFS).
pub struct KvConnector {
    kvc: KvcConfig,
    block_size: u64,
    instances: Vec<TierInstance>,
    /// Per worker: its tier instances in lookup order.
    worker_tiers: WorkerTiers,
    ops: Vec<Option<IoOp>>,
    free_ops: Vec<u32>,
    dev_out: DeviceOutput,
    loads: IntMap<u32, Load>,
    /// Synchronous saves per request: writes still in flight, and whether
    /// the request has finished (its response waits for the last of them).
    saves: IntMap<u32, (u32, bool)>,
    /// Whether a step's saves are being gathered ([`KvConnector::begin_batch`]).
    batching: bool,
    /// While they are: per
    /// tier instance, the chunks reserved, their bytes and their waiters.
    batch: Vec<(u32, BatchedWrite)>,
    /// The lists of finished writes, kept for the next batches (a write's
    /// runs and waiters live as long as the write).
    spare_runs: Vec<Vec<Run>>,
    spare_waiters: Vec<Vec<RequestId>>,
    /// Requests whose writes are waited for whatever the write mode (a P/D
    /// prefill whose KV goes to its decode worker through the shared store).
    held: IntMap<u32, ()>,
    found: Vec<Found>,
    /// Scratch of [`KvConnector::admitted`]: the held chunks, root first.
    admitted_scratch: Vec<(u32, Run)>,
    /// Scratch for [`Self::save`] and [`Self::write_chunks`]: the chunks to
    /// write, the keys reserved, and what the reservations evicted.
    chunks_scratch: Vec<(Run, u64)>,
    keys_scratch: Vec<Run>,
    spill_scratch: Vec<(Run, u64)>,
    /// Scratch of a finished write: the runs it made readable.
    done_scratch: Vec<Run>,
    /// Each worker's link, when prefill is disaggregated.
    links: Vec<Device>,
    link: Option<(crate::storage::DeviceConfig, u64)>,
    /// Requests whose prompt KV is held by a prefill worker, to be pulled.
    remote: nohash_hasher::IntSet<u32>,
    /// Bumped whenever what the stores hold may change (a write reserved,
    /// a chunk evicted or made readable).
    version: u64,
    /// The walk of the last [`KvConnector::load`], whose chunks are in
    /// `found`: the [`KvConnector::admitted`] that follows it reuses them
    /// instead of walking them again (once; any change to the stores voids it).
    walked: Option<WalkKey>,
    /// A [`KvConnector::lookup_to_admit`] that found no tier holding the
    /// chunk at the GPU prefix's end: the [`KvConnector::admitted`] that
    /// follows it stops its walk from the root there without asking again
    /// (once; any change to the stores voids it).
    unheld: Option<UnheldKey>,
}

/// What [`KvConnector::unheld`] depends on besides the sequence, which the
/// request and its length name while the stores stay as they were.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct UnheldKey {
    worker: u32,
    request: u32,
    tokens: u64,
    local: u64,
    version: u64,
}

/// What a walk beyond a GPU prefix depends on: the worker, the request, its
/// tokens and their content (the chained hash of its last full block, which
/// names every block before it, and its partial chunk's key), its GPU
/// prefix, and the stores' version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WalkKey {
    worker: u32,
    request: u32,
    tokens: u64,
    last_block: Option<ChunkKey>,
    tail: Option<BlockHash>,
    local: u64,
    version: u64,
}

impl KvConnector {
    /// A connector with no workers yet, for tiers `kvc` and engine blocks of `block_size` tokens.
    pub fn new(kvc: &KvcConfig, block_size: u64) -> KvConnector {
        KvConnector {
            kvc: kvc.clone(),
            block_size,
            instances: Vec::new(),
            worker_tiers: WorkerTiers { flat: Vec::new(), per_worker: kvc.tiers.len() },
            ops: Vec::new(),
            free_ops: Vec::new(),
            dev_out: DeviceOutput::default(),
            loads: IntMap::default(),
            saves: IntMap::default(),
            held: IntMap::default(),
            batching: false,
            batch: Vec::new(),
            spare_runs: Vec::new(),
            spare_waiters: Vec::new(),
            found: Vec::new(),
            admitted_scratch: Vec::new(),
            chunks_scratch: Vec::new(),
            keys_scratch: Vec::new(),
            spill_scratch: Vec::new(),
            done_scratch: Vec::new(),
            links: Vec::new(),
            link: None,
            remote: Default::default(),
            version: 0,
            walked: None,
            unheld: None,
        }
    }

    fn walk_key(&self, w: WorkerId, request: RequestId, seq: &ChunkedSeq<'_>, local: u64) -> WalkKey {
        let full = (seq.tokens / self.block_size).min(seq.blocks());
        WalkKey {
            worker: w.0,
            request: request.0,
            tokens: seq.tokens,
            last_block: full.checked_sub(1).map(|k| seq.key(k)),
            tail: seq.tail,
            local,
            version: self.version,
        }
    }

    /// Gives every worker (those added from now on) a link with `cfg`, over
    /// which remote prefills of `kv_bytes_per_token` bytes per token are pulled.
    pub fn set_link(&mut self, cfg: crate::storage::DeviceConfig, kv_bytes_per_token: u64) {
        self.link = Some((cfg, kv_bytes_per_token));
    }

    /// The prompt KV of `request` is held by a prefill worker: its next
    /// lookup reports all of it (beyond the GPU prefix), pulled over the
    /// link of the worker that loads it.
    pub fn offer_remote(&mut self, request: RequestId) {
        self.remote.insert(request.0);
    }

    /// Each worker's link counters at `end` (empty without disaggregation).
    pub fn link_report(&self, end: SimTime) -> impl Iterator<Item = DeviceStats> + '_ {
        self.links.iter().map(move |d| d.stats_at(end))
    }

    fn device_mut(&mut self, inst: u32) -> &mut Device {
        if inst >= LINK { &mut self.links[(inst - LINK) as usize] } else { &mut self.instances[inst as usize].device }
    }

    /// Adds the next worker's tiers (a per-worker instance of CPU memory and
    /// NVMe; the one distributed file system, created with the first worker).
    pub fn add_worker(&mut self) {
        for t in &self.kvc.tiers {
            let shared =
                if t.tier == Tier::Dfs { self.instances.iter().position(|i| i.tier == Tier::Dfs) } else { None };
            self.worker_tiers.flat.push(match shared {
                Some(i) => i as u32,
                None => {
                    self.instances.push(TierInstance {
                        tier: t.tier,
                        store: ChunkStore::new(t.capacity_bytes, t.eviction, self.kvc.chunk_blocks),
                        device: Device::new(t.device),
                    });
                    (self.instances.len() - 1) as u32
                }
            });
        }
        if let Some((cfg, _)) = self.link {
            self.links.push(Device::new(cfg));
        }
    }

    /// Whether worker `w` can load KV from anywhere (a tier below the GPU, or a link).
    pub fn has_tiers(&self, w: WorkerId) -> bool {
        !self.worker_tiers.of(w).is_empty() || w.index() < self.links.len()
    }

    /// No device operation (load or save) is in flight.
    pub fn idle(&self) -> bool {
        self.free_ops.len() == self.ops.len()
    }

    /// Every tier instance's counters at `end`.
    pub fn report(&self, end: SimTime) -> impl Iterator<Item = InstanceReport> + '_ {
        self.instances.iter().map(move |i| InstanceReport {
            tier: i.tier,
            stats: i.device.stats_at(end),
            peak_bytes: i.store.peak(),
            capacity_bytes: i.store.capacity(),
            ops: super::StoreOps { io_ops: i.device.stats_at(end).ops, ..i.store.ops() },
        })
    }

    /// Walks the chunks of sequence `seq` from its GPU prefix of `local`
    /// blocks on, while worker `w`'s tiers hold them; returns how many tokens
    /// that is and, per tier, how many of them each tier holds, and fills
    /// `found` (if given; token ranges).
    fn walk(
        &self,
        w: WorkerId,
        request: RequestId,
        seq: &ChunkedSeq<'_>,
        local: u64,
        found: Option<&mut Vec<Found>>,
    ) -> ExternalHit {
        self.walk_telling(w, request, seq, local, found).0
    }

    /// [`Self::walk`], and whether no tier holds its first chunk (the one
    /// holding block `local`), or there is none.
    fn walk_telling(
        &self,
        w: WorkerId,
        request: RequestId,
        seq: &ChunkedSeq<'_>,
        local: u64,
        mut found: Option<&mut Vec<Found>>,
    ) -> (ExternalHit, bool) {
        let num_tokens = seq.tokens;
        let mut hit = ExternalHit::default();
        if self.remote.contains(&request.0) {
            // A remote prefill: every computed token beyond the GPU prefix
            // (`num_tokens` counts the first output token, whose KV the
            // decode worker computes).
            hit.tokens = num_tokens.saturating_sub(1).saturating_sub(local * self.block_size);
            return (hit, false);
        }
        let tiers = self.worker_tiers.of(w);
        if tiers.is_empty() {
            return (hit, true);
        }
        let mut first = true;
        // The last token is always computed.
        let cap = num_tokens.saturating_sub(1);
        let mut next = local * self.block_size;
        let ct = self.kvc.chunk_tokens();
        'runs: for (run, start, end) in self.kvc.runs(seq, local / self.kvc.chunk_blocks) {
            let mut i = 0;
            while i < run.n {
                let Some((instance, take)) = self.holder(tiers, run.skip(i, self.kvc.chunk_blocks)) else {
                    return (hit, first);
                };
                first = false;
                // Chunk c's tokens are [start + c·ct, min(start + (c + 1)·ct, end)); a
                // chunk with no token below `cap` beyond `next` ends the walk.
                let chunk_end = |c: u64| (start + (c + 1) * ct).min(end);
                if chunk_end(i).min(cap) <= next {
                    break 'runs;
                }
                // After the first, a chunk counts while it starts below `cap`.
                let take = take.min((cap.saturating_sub(start + i * ct)).div_ceil(ct).max(1));
                let to = chunk_end(i + take - 1);
                let tokens = to.min(cap) - next;
                hit.tokens += tokens;
                hit.per_tier[self.instances[instance as usize].tier.index()] += tokens;
                if let Some(f) = found.as_deref_mut() {
                    let bytes = (chunk_end(i) - (start + i * ct)) * self.kvc.token_bytes();
                    f.push(Found {
                        instance,
                        run: run.skip(i, self.kvc.chunk_blocks).first(take),
                        from: next,
                        to,
                        bytes,
                    });
                }
                next = to;
                i += take;
            }
        }
        (hit, first)
    }

    /// The tier instance (of `tiers`, in lookup order) that a lookup takes
    /// run `r`'s first chunk from — the first holding it readable — and how
    /// many of the chunks from there on it gives before one that an earlier
    /// tier holds, or one it does not hold.
    fn holder(&self, tiers: &[u32], r: Run) -> Option<(u32, u64)> {
        let mut limit = r.n;
        for &inst in tiers {
            let (held, gap) = self.instances[inst as usize].store.readable(r);
            if held > 0 {
                return Some((inst, held.min(limit)));
            }
            limit = limit.min(gap);
        }
        None
    }

    /// vLLM's `get_num_new_matched_tokens`: the tokens beyond the first
    /// `local` blocks (the GPU prefix hit) of a `num_tokens`-token sequence
    /// that worker `w`'s tiers hold and could load. Changes nothing.
    pub fn lookup(&self, w: WorkerId, request: RequestId, seq: &ChunkedSeq<'_>, local: u64) -> ExternalHit {
        self.walk(w, request, seq, local, None)
    }

    /// [`Self::lookup`] for a request admitted at once if nothing is found:
    /// when no tier holds the chunk holding block `local`, the
    /// [`Self::admitted`] that follows stops its walk from the root there.
    pub fn lookup_to_admit(
        &mut self,
        w: WorkerId,
        request: RequestId,
        seq: &ChunkedSeq<'_>,
        local: u64,
    ) -> ExternalHit {
        let (hit, unheld) = self.walk_telling(w, request, seq, local, None);
        self.unheld = unheld.then(|| self.unheld_key(w, request, seq, local));
        hit
    }

    fn unheld_key(&self, w: WorkerId, request: RequestId, seq: &ChunkedSeq<'_>, local: u64) -> UnheldKey {
        UnheldKey { worker: w.0, request: request.0, tokens: seq.tokens, local, version: self.version }
    }

    /// LMCache's lookup as a request is scheduled (`LMCacheEngine.lookup`
    /// through the storage manager's `contains`, `lmcache/v1/cache_engine.py`):
    /// how many tokens of `seq` worker `w`'s tiers hold **from its first
    /// token on** — chunk by chunk while some tier holds the chunk, each
    /// taken from the first tier holding it — and that tier's recency of
    /// each of those chunks is refreshed, last chunk first (so the root ends
    /// most recent). The count is LMCache's `lmcache_cached_tokens`, with
    /// which the request's `num_saved_tokens` starts
    /// (`vllm_v1_adapter.py`): its saves skip the chunks below it (see
    /// [`Self::save`]). Called once per admission (and for a load, after
    /// [`Self::load`], which refreshes nothing itself); a chunk beyond a gap
    /// the GPU prefix covers is loaded but not refreshed, as LMCache's
    /// lookup from the root would not reach it.
    pub fn admitted(&mut self, w: WorkerId, request: RequestId, seq: &ChunkedSeq<'_>, local: u64) -> u64 {
        if self.worker_tiers.of(w).is_empty() {
            return 0;
        }
        // The chunks from the one holding block `local` on, as the walk
        // beyond the GPU prefix found them, if that walk was this request's
        // and nothing changed since (each chunk there from the first tier
        // holding it, as below).
        let beyond = match self.walked.take() {
            Some(k) if k == self.walk_key(w, request, seq, local) => Some(std::mem::take(&mut self.found)),
            _ => None,
        };
        // No tier holds chunk j0 (just asked, and nothing changed since):
        // the walk stops there.
        let unheld = self.unheld.take();
        let stop = beyond.is_none() && unheld == Some(self.unheld_key(w, request, seq, local));
        // (Debug builds check what the fact stands for: no tier holds that chunk now.)
        debug_assert!(!stop || self.walk_telling(w, request, seq, local, None).1, "chunk j0 is held by no tier");
        let j0 = local / self.kvc.chunk_blocks;
        let mut held = std::mem::take(&mut self.admitted_scratch);
        held.clear();
        let tiers = self.worker_tiers.of(w);
        let ct = self.kvc.chunk_tokens();
        let skip = beyond.as_ref().is_some_and(|f| !f.is_empty());
        let mut end = 0;
        let mut runs = self.kvc.runs(seq, 0);
        let mut j = 0;
        'walk: loop {
            if skip
                && j == j0
                && let Some(found) = &beyond
                && let Some(last) = found.last()
            {
                held.extend(found.iter().map(|f| (f.instance, f.run)));
                end = last.to;
                j += found.iter().map(|f| f.run.n).sum::<u64>();
                runs = self.kvc.runs(seq, j);
            }
            if stop && j >= j0 {
                break;
            }
            let Some((mut run, start, run_end)) = runs.next() else { break };
            // A run reaching past chunk j0 stops there, where the walk's chunks take over.
            let clipped = (skip || stop) && j < j0 && j + run.n > j0;
            if clipped {
                run.n = j0 - j;
            }
            let mut i = 0;
            while i < run.n {
                let Some((instance, take)) = self.holder(tiers, run.skip(i, self.kvc.chunk_blocks)) else {
                    break 'walk;
                };
                held.push((instance, run.skip(i, self.kvc.chunk_blocks).first(take)));
                i += take;
                end = (start + i * ct).min(run_end);
            }
            j += run.n;
            if clipped {
                if stop {
                    break;
                }
                runs = self.kvc.runs(seq, j);
            }
        }
        // Last chunk first, in each tier instance (a run last chunk first).
        for (n, &inst) in tiers.iter().enumerate() {
            if !tiers[..n].contains(&inst) {
                let store = &mut self.instances[inst as usize].store;
                held.iter().rev().filter(|h| h.0 == inst).for_each(|h| store.touch(h.1));
            }
        }
        self.admitted_scratch = held;
        if let Some(found) = beyond {
            self.found = found;
        }
        end
    }

    /// Starts loading what [`Self::lookup`] found for `request` on worker `w`
    /// (its GPU blocks are allocated): the chunks are pinned (their recency
    /// is refreshed by [`Self::admitted`], called next), and each run of
    /// consecutive chunks in one tier instance is read in one device operation. A [`LoadDone`] comes out
    /// when the last read finishes. Returns what is loaded.
    pub fn load(
        &mut self,
        now: SimTime,
        w: WorkerId,
        request: RequestId,
        seq: &ChunkedSeq<'_>,
        local: u64,
        out: &mut ConnectorOutput,
    ) -> ExternalHit {
        if self.remote.contains(&request.0) {
            let hit = self.walk(w, request, seq, local, None);
            self.remote.remove(&request.0);
            let bytes = hit.tokens * self.link.expect("a remote prefill needs a link").1;
            let load = Load { worker: w, started: now, reads_left: 1, bytes: [0; 4], link_bytes: 0 };
            self.loads.insert(request.0, load);
            let purpose = Purpose::Load { request, keys: Vec::new() };
            self.submit(now, LINK + w.0, OpKind::Read, bytes, w, purpose, out);
            return hit;
        }
        let mut found = std::mem::take(&mut self.found);
        found.clear();
        let hit = self.walk(w, request, seq, local, Some(&mut found));
        // Kept for the `admitted` that follows.
        self.walked = Some(self.walk_key(w, request, seq, local));
        if hit.tokens == 0 {
            self.found = found;
            return hit;
        }
        // (Recency is refreshed by `admitted`, which the scheduler calls next.)
        // One read per run of consecutive chunks in one instance.
        let runs = 1 + found.windows(2).filter(|p| p[0].instance != p[1].instance).count() as u32;
        self.loads.insert(request.0, Load { worker: w, started: now, reads_left: runs, bytes: [0; 4], link_bytes: 0 });
        for run in found.chunk_by(|a, b| a.instance == b.instance) {
            let instance = run[0].instance;
            let keys: Vec<(Run, u64)> = run.iter().map(|f| (f.run, f.bytes)).collect();
            let store = &mut self.instances[instance as usize].store;
            keys.iter().for_each(|&(r, _)| store.pin(r));
            let bytes = run.iter().map(|f| f.to - f.from).sum::<u64>() * self.kvc.token_bytes();
            self.submit(now, instance, OpKind::Read, bytes, w, Purpose::Load { request, keys }, out);
        }
        self.found = found;
        hit
    }

    /// Writes the chunks of sequence `seq` (`request`'s first `seq.tokens`
    /// tokens) from the one holding token `from` on, that worker `w`'s tiers
    /// do not hold or receive yet. `from` is LMCache's `num_saved_tokens`:
    /// what [`Self::admitted`] found held, or what earlier saves of the
    /// request stored, whichever is more. LMCache masks the tokens below it
    /// (rounded down to a chunk) and stores the rest (`vllm_v1_adapter.py`,
    /// `save_kv_layer`'s `skip_leading_tokens`); a chunk a tier already holds
    /// is neither rewritten nor refreshed (`LocalCPUBackend`'s put of an
    /// existing key). So a request's saves cost its new chunks, not its
    /// whole prefix. Called as a prompt's chunks are computed and again when
    /// the request finishes (see [`SaveTiming`](super::SaveTiming)); in
    /// `sync` write mode the writes are counted for [`Self::finish_saves`].
    pub fn save(
        &mut self,
        now: SimTime,
        w: WorkerId,
        request: RequestId,
        seq: &ChunkedSeq<'_>,
        from: u64,
        out: &mut ConnectorOutput,
    ) {
        let tiers = self.worker_tiers.of(w);
        if tiers.is_empty() {
            return;
        }
        let first = from / self.kvc.chunk_tokens();
        let mut chunks = std::mem::take(&mut self.chunks_scratch);
        chunks.clear();
        let token_bytes = self.kvc.token_bytes();
        // Each run's chunks are of one size (a partial chunk is a run of its own).
        let ct = self.kvc.chunk_tokens();
        chunks.extend(self.kvc.runs(seq, first).map(|(run, start, end)| (run, (end - start).min(ct) * token_bytes)));
        let waiter = (self.kvc.write_mode == WriteMode::Sync || self.held.contains_key(&request.0)).then_some(request);
        let targets = match self.kvc.write_policy {
            WritePolicy::WriteThrough => tiers.len(),
            WritePolicy::Spill => 1,
        };
        for i in 0..targets {
            let inst = self.worker_tiers.of(w)[i];
            self.write_chunks(now, w, inst, &chunks, waiter, out);
        }
        self.chunks_scratch = chunks;
    }

    /// Gathers the saves that follow, until [`Self::end_batch`], into one
    /// write per tier instance: the chunks a step computed go to each tier
    /// as one batch, as LMCache stores a step's KV (`wait_for_save` once per
    /// step) — and a step costs one device operation per tier, not one per
    /// request.
    pub fn begin_batch(&mut self) {
        self.batching = true;
    }

    /// Submits the writes gathered since [`Self::begin_batch`] (in tier-instance order).
    pub fn end_batch(&mut self, now: SimTime, w: WorkerId, out: &mut ConnectorOutput) {
        if !std::mem::replace(&mut self.batching, false) {
            return;
        }
        let mut writes = std::mem::take(&mut self.batch);
        writes.sort_unstable_by_key(|&(inst, _)| inst);
        for (inst, (keys, bytes, waiters)) in writes.drain(..) {
            for id in &waiters {
                self.saves.entry(id.0).or_insert((0, false)).0 += 1;
            }
            self.submit(now, inst, OpKind::Write, bytes, w, Purpose::Save { keys, waiters, worker: w }, out);
        }
        self.batch = writes;
    }

    /// Counts `request`'s writes for [`Self::finish_saves`] whatever the
    /// write mode, until [`Self::release`].
    pub fn hold(&mut self, request: RequestId) {
        self.held.insert(request.0, ());
    }

    /// Ends [`Self::hold`].
    pub fn release(&mut self, request: RequestId) {
        self.held.remove(&request.0);
    }

    /// `request` has finished: whether its response must wait for its
    /// synchronous writes still in flight (its id then comes out in
    /// [`ConnectorOutput::saved`] when the last one completes).
    pub fn finish_saves(&mut self, request: RequestId) -> bool {
        match self.saves.get_mut(&request.0) {
            Some((left, finished)) if *left > 0 => {
                *finished = true;
                true
            }
            Some(_) => {
                self.saves.remove(&request.0);
                false
            }
            None => false,
        }
    }

    /// Writes the chunks whose last blocks the GPU of worker `w` evicted
    /// (`store_on_gpu_eviction`) to its first tier.
    pub fn save_evicted(
        &mut self,
        now: SimTime,
        w: WorkerId,
        evicted: impl Iterator<Item = ChunkKey>,
        out: &mut ConnectorOutput,
    ) {
        let Some(&first) = self.worker_tiers.of(w).first() else { return };
        let bytes = self.kvc.chunk_blocks * self.kvc.block_bytes;
        let chunks: Vec<(Run, u64)> = evicted.map(|k| (Run::one(k), bytes)).collect();
        self.write_chunks(now, w, first, &chunks, None, out);
    }

    /// Reserves and writes `chunks` (runs of a prefix's chunks with their
    /// bytes per chunk, root first) to instance `inst`; with the spill
    /// policy what it evicts goes on to the next tier. Returns the write
    /// operations issued.
    fn write_chunks(
        &mut self,
        now: SimTime,
        w: WorkerId,
        inst: u32,
        chunks: &[(Run, u64)],
        waiter: Option<RequestId>,
        out: &mut ConnectorOutput,
    ) -> u32 {
        self.version += 1;
        let tier = self.instances[inst as usize].tier;
        let store = &mut self.instances[inst as usize].store;
        // Last chunk first, so that the root of what is new ends up the most
        // recent; a chunk the store holds is left as it is.
        let mut keys = std::mem::take(&mut self.keys_scratch);
        keys.clear();
        let mut spilled = std::mem::take(&mut self.spill_scratch);
        spilled.clear();
        let mut bytes = 0;
        for &(r, b) in chunks.iter().rev() {
            let before = keys.len();
            store.reserve(r, b, &mut spilled, &mut keys);
            bytes += keys[before..].iter().map(|k| k.n).sum::<u64>() * b;
        }
        if self.kvc.publish_events {
            for &(v, _) in &spilled {
                out.events.push((w, KvEvent { tier, chunks: EventChunks::Run(v), kind: KvEventKind::Removed }));
            }
        }
        let mut ops = 0;
        if !keys.is_empty() {
            if self.batching {
                // One write per tier instance for the whole step (see `begin_batch`).
                let at = match self.batch.iter().position(|&(i, _)| i == inst) {
                    Some(at) => at,
                    None => {
                        let (runs, waiters) = self.write_lists();
                        self.batch.push((inst, (runs, 0, waiters)));
                        self.batch.len() - 1
                    }
                };
                let (k, b, waiters) = &mut self.batch[at].1;
                k.extend_from_slice(&keys);
                *b += bytes;
                waiters.extend(waiter.filter(|id| !waiters.contains(id)));
            } else {
                let (mut runs, mut waiters) = self.write_lists();
                waiters.extend(waiter);
                for id in &waiters {
                    self.saves.entry(id.0).or_insert((0, false)).0 += 1;
                }
                runs.extend_from_slice(&keys);
                self.submit(now, inst, OpKind::Write, bytes, w, Purpose::Save { keys: runs, waiters, worker: w }, out);
                ops += 1;
            }
        }
        if self.kvc.write_policy == WritePolicy::Spill && !spilled.is_empty() {
            let tiers = self.worker_tiers.of(w);
            if let Some(pos) = tiers.iter().position(|&i| i == inst)
                && let Some(&next) = tiers.get(pos + 1)
            {
                // Evicted least recent first — descendants before roots —
                // while the write below takes roots first.
                spilled.reverse();
                ops += self.write_chunks(now, w, next, &spilled, waiter, out);
            }
        }
        self.keys_scratch = keys;
        self.spill_scratch = spilled;
        ops
    }

    /// The chunks `keys` worker `w` has read from tier instance `from` are
    /// written into its faster per-worker tiers — those before `from` in its
    /// lookup order (with the spill policy, the first, whose evictions
    /// move down): LMCache's `StorageManager.get` and `batched_get`
    /// (`lmcache/v1/storage_backend/storage_manager.py`) write a hit from
    /// any backend but the CPU's back into `LocalCPUBackend` ("auto-write
    /// remote data to local CPU cache"), so a prefix read from the shared
    /// DFS or a local disk is found in the worker's memory next time. The
    /// writes take their devices' bandwidth and their stores' room as any
    /// write does (asynchronous: nothing waits for them).
    fn write_back(&mut self, now: SimTime, w: WorkerId, from: u32, keys: &[(Run, u64)], out: &mut ConnectorOutput) {
        let tiers = self.worker_tiers.of(w);
        let Some(pos) = tiers.iter().position(|&i| i == from) else { return };
        let targets = match self.kvc.write_policy {
            WritePolicy::WriteThrough => pos,
            WritePolicy::Spill => pos.min(1),
        };
        // A step's batch of saves is not this read's (it may be another worker's).
        let batching = std::mem::replace(&mut self.batching, false);
        for i in 0..targets {
            let inst = self.worker_tiers.of(w)[i];
            if self.instances[inst as usize].tier != Tier::Dfs {
                self.write_chunks(now, w, inst, keys, None, out);
            }
        }
        self.batching = batching;
    }

    /// Empty lists for a write's runs and waiters (those of a finished write, if any).
    fn write_lists(&mut self) -> (Vec<Run>, Vec<RequestId>) {
        (self.spare_runs.pop().unwrap_or_default(), self.spare_waiters.pop().unwrap_or_default())
    }

    #[allow(clippy::too_many_arguments)]
    fn submit(
        &mut self,
        now: SimTime,
        inst: u32,
        kind: OpKind,
        bytes: u64,
        w: WorkerId,
        purpose: Purpose,
        out: &mut ConnectorOutput,
    ) {
        let op = IoOp { instance: inst, purpose };
        let id = match self.free_ops.pop() {
            Some(i) => {
                self.ops[i as usize] = Some(op);
                i
            }
            None => {
                self.ops.push(Some(op));
                (self.ops.len() - 1) as u32
            }
        };
        let mut dev = std::mem::take(&mut self.dev_out);
        self.device_mut(inst).submit(now, OpId(id), kind, bytes, w.0, &mut dev);
        self.apply_device(now, inst, &mut dev, out);
        self.dev_out = dev;
    }

    /// Handles a device timer of tier instance `instance`.
    pub fn on_timer(&mut self, now: SimTime, instance: u32, timer: DeviceTimer, out: &mut ConnectorOutput) {
        let mut dev = std::mem::take(&mut self.dev_out);
        self.device_mut(instance).on_timer(now, timer, &mut dev);
        self.apply_device(now, instance, &mut dev, out);
        self.dev_out = dev;
    }

    fn apply_device(&mut self, now: SimTime, inst: u32, dev: &mut DeviceOutput, out: &mut ConnectorOutput) {
        out.timers.extend(dev.timers.iter().map(|&(t, timer)| (t, inst, timer)));
        for c in &dev.completed {
            let op = self.ops[c.op.0 as usize].take().expect("completed op is live");
            self.free_ops.push(c.op.0);
            self.op_done(now, op, c.bytes, out);
        }
        dev.clear();
    }

    fn op_done(&mut self, now: SimTime, op: IoOp, bytes: u64, out: &mut ConnectorOutput) {
        if op.instance >= LINK {
            let Purpose::Load { request, .. } = op.purpose else { unreachable!("links only load") };
            let load = self.loads.remove(&request.0).expect("a transfer belongs to a live load");
            out.loaded.push(LoadDone {
                request,
                worker: load.worker,
                started: load.started,
                bytes: load.bytes,
                link_bytes: bytes,
            });
            return;
        }
        let instance = &mut self.instances[op.instance as usize];
        let tier = instance.tier;
        out.moved.push((tier, bytes));
        match op.purpose {
            Purpose::Load { request, keys } => {
                keys.iter().for_each(|&(r, _)| instance.store.unpin(r));
                let load = self.loads.get_mut(&request.0).expect("a read belongs to a live load");
                load.bytes[tier.index()] += bytes;
                load.reads_left -= 1;
                let w = load.worker;
                if self.kvc.write_back_hits {
                    self.write_back(now, w, op.instance, &keys, out);
                }
                let load = self.loads.get_mut(&request.0).expect("checked above");
                if load.reads_left == 0 {
                    let load = self.loads.remove(&request.0).expect("a read belongs to a live load");
                    out.loaded.push(LoadDone {
                        request,
                        worker: load.worker,
                        started: load.started,
                        bytes: load.bytes,
                        link_bytes: load.link_bytes,
                    });
                }
            }
            Purpose::Save { mut keys, mut waiters, worker } => {
                self.version += 1;
                let mut done = std::mem::take(&mut self.done_scratch);
                done.clear();
                for &r in &keys {
                    instance.store.complete(r, &mut done);
                }
                if self.kvc.publish_events {
                    for &d in &done {
                        out.events
                            .push((worker, KvEvent { tier, chunks: EventChunks::Run(d), kind: KvEventKind::Stored }));
                    }
                }
                self.done_scratch = done;
                for &id in &waiters {
                    let (left, finished) = self.saves.get_mut(&id.0).expect("a synchronous save is tracked");
                    *left -= 1;
                    if *left == 0 && *finished {
                        self.saves.remove(&id.0);
                        out.saved.push(id);
                    }
                }
                // The lists go back for the next writes.
                keys.clear();
                waiters.clear();
                self.spare_runs.push(keys);
                self.spare_waiters.push(waiters);
            }
        }
    }
}

/// Settings for tests of the connector and of its users.
#[cfg(test)]
pub(crate) mod testing {
    use crate::kvcache::{
        EvictionPolicy, KvcConfig, PartialChunks, SaveTiming, Tier, TierConfig, WriteMode, WritePolicy,
    };
    use crate::storage::DeviceConfig;
    use crate::time::SimDuration;

    /// Tiers `tiers` with chunks of `chunk_blocks` blocks of a toy model
    /// (16 tokens × 10 B = 160 B per block), written through, asynchronously.
    pub fn kvc(tiers: Vec<TierConfig>, chunk_blocks: u64) -> KvcConfig {
        KvcConfig {
            tiers,
            chunk_blocks,
            save_unfull_chunk: true,
            partial_chunks: PartialChunks::ExactTokens,
            block_size: 16,
            save_decode_cache: false,
            write_policy: WritePolicy::WriteThrough,
            write_mode: WriteMode::Async,
            save_timing: SaveTiming::OnCompute,
            store_on_gpu_eviction: false,
            write_back_hits: false,
            block_bytes: 160,
            event_coalesce: SimDuration::ZERO,
            publish_events: false,
        }
    }

    /// CPU memory of `capacity` bytes at 10⁶ B/s, without latency, LRU.
    pub fn cpu_tier(capacity: u64) -> TierConfig {
        TierConfig {
            tier: Tier::Cpu,
            device: DeviceConfig {
                bandwidth_bps: 1e6,
                latency: SimDuration::ZERO,
                concurrency: 1000,
                client_bandwidth_bps: None,
            },
            capacity_bytes: capacity,
            eviction: EvictionPolicy::Lru,
            usd_per_gib_hour: 0.0,
            watts_per_gib: 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvcache::{ChainSpan, PartialChunks, TierConfig, chains_of, content_id};
    use crate::time::SimDuration;

    const W: WorkerId = WorkerId(0);

    /// One worker with a CPU tier of `capacity` bytes (10⁶ B/s, no latency),
    /// chunks of `chunk_blocks` blocks of 160 B.
    fn connector(capacity: u64, chunk_blocks: u64) -> KvConnector {
        let mut c = KvConnector::new(&testing::kvc(vec![testing::cpu_tier(capacity)], chunk_blocks), 16);
        c.add_worker();
        c
    }

    /// The chains of the full blocks of `tokens` tokens of content `key`.
    fn blocks(key: u64, tokens: u32) -> Vec<ChainSpan> {
        exact(key, tokens).0
    }

    /// The first `tokens` tokens of a sequence on chains `b`, its last
    /// partial chunk (if any) keyed by its full blocks.
    fn seq(b: &[ChainSpan], tokens: u64) -> ChunkedSeq<'_> {
        ChunkedSeq { chains: b, tokens, tail: None }
    }

    /// Runs the device timers out in time order from `now`; returns the time of the last.
    fn settle(c: &mut KvConnector, mut now: SimTime, out: &mut ConnectorOutput) -> SimTime {
        while let Some(i) = (0..out.timers.len()).min_by_key(|&i| out.timers[i].0) {
            let (t, inst, timer) = out.timers.remove(i);
            now = t;
            c.on_timer(t, inst, timer, out);
        }
        now
    }

    /// Saves the first `tokens` tokens of `b` at `now` and waits for the
    /// writes; returns when they finished.
    fn save(c: &mut KvConnector, now: SimTime, b: &[ChainSpan], tokens: u64) -> SimTime {
        let mut out = ConnectorOutput::default();
        c.save(now, W, RequestId(0), &seq(b, tokens), 0, &mut out);
        settle(c, now, &mut out)
    }

    #[test]
    fn lookup_covers_held_chunks_beyond_the_gpu_prefix_and_leaves_the_last_token() {
        let mut c = connector(1 << 20, 2);
        let p = blocks(1, 100); // 6 full blocks (96 tokens) and 4 more tokens
        save(&mut c, SimTime::ZERO, &p, 100);
        // Chunks [0, 2), [2, 4), [4, 6) are held: 96 tokens, all from CPU memory.
        let hit = c.lookup(W, RequestId(0), &seq(&p, 100), 0);
        assert_eq!(hit, ExternalHit { tokens: 96, per_tier: [0, 96, 0, 0] });
        // Beyond a GPU prefix of 3 blocks: 96 − 48 = 48 tokens.
        assert_eq!(c.lookup(W, RequestId(0), &seq(&p, 100), 3).tokens, 48);
        // A 64-token prompt of the same content (4 whole blocks, chunks [0, 2),
        // [2, 4) held): everything but its last token, 63.
        assert_eq!(c.lookup(W, RequestId(0), &seq(&blocks(1, 64), 64), 0).tokens, 63);
        // A 40-token prompt ends inside chunk [2, 4) (2 full blocks, then
        // [2, 2) is empty): 32 tokens.
        assert_eq!(c.lookup(W, RequestId(0), &seq(&blocks(1, 40), 40), 0).tokens, 32);
        // Other content: nothing.
        assert_eq!(c.lookup(W, RequestId(0), &seq(&blocks(2, 100), 100), 0), ExternalHit::default());
    }

    /// `tokens` tokens of content `key`: the chains of its full blocks and the key of their exact run.
    fn exact(key: u64, tokens: u32) -> (Vec<ChainSpan>, Option<BlockHash>) {
        let segs = [crate::kvcache::Segment { id: content_id("test", key), tokens }];
        let mut chains = Vec::new();
        chains_of(&segs, 16, &mut chains);
        let tail = crate::kvcache::exact_key(&segs, u64::from(tokens), 16, &chains);
        (chains, tail)
    }

    #[test]
    fn a_partial_chunk_is_hit_only_by_the_identical_token_run_unless_keyed_by_its_blocks() {
        // Chunks of 2 blocks (32 tokens). A: 56 tokens, chunk [0, 32) and the
        // partial chunk [32, 56) (one full block and 8 tokens).
        let (a, a_tail) = exact(1, 56);
        for (partial, same, c_hit) in [(PartialChunks::ExactTokens, 55, 32), (PartialChunks::FullBlocks, 48, 48)] {
            let mut kvc = testing::kvc(vec![testing::cpu_tier(1 << 20)], 2);
            kvc.partial_chunks = partial;
            let mut c = KvConnector::new(&kvc, 16);
            c.add_worker();
            let mut out = ConnectorOutput::default();
            c.save(SimTime::ZERO, W, RequestId(0), &ChunkedSeq { chains: &a, tokens: 56, tail: a_tail }, 0, &mut out);
            settle(&mut c, SimTime::ZERO, &mut out);
            let look = |(b, tail): (Vec<ChainSpan>, Option<BlockHash>), n: u64| {
                c.lookup(W, RequestId(1), &ChunkedSeq { chains: &b, tokens: n, tail }, 0).tokens
            };
            // The same 56 tokens: all but the last, or (block keys) its full blocks.
            assert_eq!(look(exact(1, 56), 56), same, "{partial:?}");
            // The same content, 50 tokens (the same full block 3, 2 tokens
            // in block 4): exact keys miss the partial chunk; block keys hit
            // its full block.
            assert_eq!(look(exact(1, 50), 50), c_hit, "{partial:?}");
            // Other content: nothing.
            assert_eq!(look(exact(2, 56), 56), 0);
        }
    }

    #[test]
    fn a_load_reads_exactly_the_blocks_found_and_reports_when_done() {
        let mut c = connector(1 << 20, 2);
        let p = blocks(1, 64);
        let t = save(&mut c, SimTime::ZERO, &p, 64);
        let mut out = ConnectorOutput::default();
        // GPU prefix of 1 block: blocks [1, 4) are read (480 B at 1e6 B/s = 480 µs)
        // for 63 − 16 = 47 tokens.
        let hit = c.load(t, W, RequestId(7), &seq(&p, 64), 1, &mut out);
        assert_eq!(hit.tokens, 47);
        assert!(!c.idle());
        let end = settle(&mut c, t, &mut out);
        assert_eq!(end - t, SimDuration(480_000));
        assert_eq!(
            out.loaded,
            vec![LoadDone { request: RequestId(7), worker: W, started: t, bytes: [0, 480, 0, 0], link_bytes: 0 }]
        );
        assert!(c.idle());
    }

    #[test]
    fn a_hit_read_from_the_dfs_is_written_back_into_the_loading_workers_cpu_memory() {
        // Two workers, each with CPU memory (10⁶ B/s), and one DFS (10⁶ B/s,
        // no latency); chunks of 2 blocks (320 B). Worker 1 saves 64 tokens
        // (two chunks) to its CPU memory and the DFS.
        for write_back in [true, false] {
            let dfs = TierConfig { tier: Tier::Dfs, ..testing::cpu_tier(1 << 20) };
            let mut kvc = testing::kvc(vec![testing::cpu_tier(1 << 20), dfs], 2);
            kvc.write_back_hits = write_back;
            let mut c = KvConnector::new(&kvc, 16);
            c.add_worker();
            c.add_worker();
            let p = blocks(1, 64);
            let mut out = ConnectorOutput::default();
            c.save(SimTime::ZERO, WorkerId(1), RequestId(0), &seq(&p, 64), 0, &mut out);
            // Two writes of 640 B, one per device: both done at 0.64 ms.
            let t = settle(&mut c, SimTime::ZERO, &mut out);
            assert_eq!(t, SimTime(640_000));
            // Worker 0 finds 63 tokens in the DFS and reads them: 640 B → 1.28 ms.
            let hit = c.load(t, W, RequestId(1), &seq(&p, 64), 0, &mut out);
            assert_eq!(hit.per_tier, [0, 0, 0, 63]);
            let loaded = settle(&mut c, t, &mut out);
            let cpu0 = c.report(loaded).next().unwrap().stats;
            if write_back {
                // LMCache keeps the hit in worker 0's CPU memory: a write of
                // both chunks (640 B at 10⁶ B/s) from 1.28 ms to 1.92 ms, after
                // which worker 0's next lookup finds them there.
                assert_eq!(loaded, SimTime(1_920_000));
                assert_eq!((cpu0.ops, cpu0.bytes_written), (1, 640));
                assert_eq!(c.lookup(W, RequestId(2), &seq(&p, 64), 0).per_tier, [0, 63, 0, 0]);
            } else {
                assert_eq!(loaded, SimTime(1_280_000));
                assert_eq!((cpu0.ops, cpu0.bytes_written), (0, 0));
                assert_eq!(c.lookup(W, RequestId(2), &seq(&p, 64), 0).per_tier, [0, 0, 0, 63]);
            }
            assert_eq!(out.loaded.len(), 1);
            assert_eq!(out.loaded[0].bytes, [0, 0, 0, 640]);
        }
    }

    #[test]
    fn only_the_prompt_is_saved_and_held_chunks_are_not_written_again() {
        let mut c = connector(1 << 20, 2);
        let p = blocks(1, 100);
        let mut out = ConnectorOutput::default();
        // The first 70 tokens: 4 full blocks (the rest of block 5 is not
        // full) in chunks [0, 2), [2, 4): 640 B.
        c.save(SimTime::ZERO, W, RequestId(0), &seq(&p, 70), 0, &mut out);
        let t = settle(&mut c, SimTime::ZERO, &mut out);
        // All 100: 6 full blocks; chunks [0, 2), [2, 4) are held, [4, 6) is new: 320 B.
        c.save(t, W, RequestId(1), &seq(&p, 100), 0, &mut out);
        let t = settle(&mut c, t, &mut out);
        let written: u64 = c.report(t).map(|i| i.stats.bytes_written).sum();
        assert_eq!(written, 640 + 320);
    }

    #[test]
    fn a_steps_saves_are_one_write_per_tier_and_take_its_time_once() {
        // Two requests' 64 tokens each (4 blocks of 160 B: 640 B) in one step:
        // one write of 1,280 B at 10⁶ B/s, 1.28 ms; apart, two writes.
        let (a, b) = (blocks(1, 64), blocks(2, 64));
        let mut c = connector(1 << 20, 2);
        let mut out = ConnectorOutput::default();
        c.begin_batch();
        c.save(SimTime::ZERO, W, RequestId(0), &seq(&a, 64), 0, &mut out);
        c.save(SimTime::ZERO, W, RequestId(1), &seq(&b, 64), 0, &mut out);
        assert!(out.timers.is_empty(), "nothing is written before the batch ends");
        c.end_batch(SimTime::ZERO, W, &mut out);
        let end = settle(&mut c, SimTime::ZERO, &mut out);
        assert_eq!(end, SimTime(1_280_000));
        let stats = c.report(end).next().unwrap().stats;
        assert_eq!((stats.ops, stats.bytes_written), (1, 1280));
        assert_eq!(c.lookup(W, RequestId(2), &seq(&b, 64), 0).tokens, 63);
        let mut apart = connector(1 << 20, 2);
        let t = save(&mut apart, SimTime::ZERO, &a, 64);
        let t = save(&mut apart, t, &b, 64);
        assert_eq!(apart.report(t).next().unwrap().stats.ops, 2);
    }

    #[test]
    fn lru_keeps_the_root_of_a_prefix_when_its_descendants_go() {
        // Room for four one-block chunks (160 B each).
        let mut c = connector(640, 1);
        let p = blocks(1, 48); // chunks p1 (root), p2, p3
        let t = save(&mut c, SimTime::ZERO, &p, 48);
        let t = save(&mut c, t, &blocks(2, 16), 16); // q1: the store is full
        // Two more chunks evict the two least recently used. The prefix was
        // written last chunk first, so its recency is p3 < p2 < p1 < q1:
        // p3 and p2 go and the root stays (root first, p1 would have gone
        // and p2, p3 been unreachable).
        save(&mut c, t, &blocks(3, 32), 32);
        assert_eq!(c.lookup(W, RequestId(0), &seq(&p, 48), 0).tokens, 16);

        // A hit refreshes last chunk first too.
        let mut c = connector(640, 1);
        let t = save(&mut c, SimTime::ZERO, &p, 48);
        let t = save(&mut c, t, &blocks(2, 16), 16);
        let mut out = ConnectorOutput::default();
        c.load(t, W, RequestId(0), &seq(&p, 48), 0, &mut out);
        assert_eq!(c.admitted(W, RequestId(0), &seq(&p, 48), 0), 48);
        let t = settle(&mut c, t, &mut out);
        // Recency is now q1 < p3 < p2 < p1: q1 and p3 go.
        save(&mut c, t, &blocks(3, 32), 32);
        assert_eq!(c.lookup(W, RequestId(0), &seq(&p, 48), 0).tokens, 32);
        assert_eq!(c.lookup(W, RequestId(0), &seq(&blocks(2, 16), 16), 0).tokens, 0);
    }

    #[test]
    fn a_save_stores_only_the_chunks_beyond_what_was_held_and_a_held_chunk_keeps_its_recency() {
        // Room for four one-block chunks (160 B each).
        let mut c = connector(640, 1);
        let p = blocks(1, 64); // chunks p1 … p4
        let t = save(&mut c, SimTime::ZERO, &p, 32); // p1, p2
        let t = save(&mut c, t, &blocks(2, 16), 16); // q1
        // Admission finds p1, p2 held (32 tokens) and refreshes them: q1 < p2 < p1.
        assert_eq!(c.admitted(W, RequestId(1), &seq(&p, 64), 0), 32);
        // The request's save from token 32 writes p3, p4 only: 320 B, one
        // eviction (q1, the least recent).
        let before: u64 = c.report(t).map(|i| i.stats.bytes_written).sum();
        let mut out = ConnectorOutput::default();
        c.save(t, W, RequestId(1), &seq(&p, 64), 32, &mut out);
        let t = settle(&mut c, t, &mut out);
        let written: u64 = c.report(t).map(|i| i.stats.bytes_written).sum::<u64>() - before;
        assert_eq!(written, 320);
        assert_eq!(c.lookup(W, RequestId(2), &seq(&blocks(2, 16), 16), 0).tokens, 0, "q1 went");
        // New chunks go to the recent end, as LMCache's puts do: recency is
        // p2 < p1 < p4 < p3. A save from 0 of what is held writes nothing
        // and refreshes nothing, so one new chunk evicts p2 and the prefix
        // now ends after p1 (a save that refreshed the held chunks would
        // have made p4 the victim, and the lookup 48 tokens).
        let before: u64 = c.report(t).map(|i| i.stats.bytes_written).sum();
        c.save(t, W, RequestId(3), &seq(&p, 64), 0, &mut out);
        assert!(out.timers.is_empty(), "nothing to write");
        assert_eq!(c.report(t).map(|i| i.stats.bytes_written).sum::<u64>(), before);
        save(&mut c, t, &blocks(3, 16), 16);
        assert_eq!(c.lookup(W, RequestId(4), &seq(&p, 64), 0).tokens, 16);
    }

    #[test]
    fn an_admission_after_a_lookup_that_found_nothing_stops_where_the_lookup_did() {
        // Chunks of 2 blocks (32 tokens); the tier holds the first only.
        let mut c = connector(1 << 20, 2);
        let p = blocks(1, 64);
        let t = save(&mut c, SimTime::ZERO, &p, 32);
        // A GPU prefix of 2 blocks: the lookup from chunk 1 finds nothing,
        // and the admission counts chunk 0 — as without the lookup.
        assert_eq!(c.lookup_to_admit(W, RequestId(0), &seq(&p, 64), 2).tokens, 0);
        assert_eq!(c.admitted(W, RequestId(0), &seq(&p, 64), 2), 32);
        assert_eq!(c.admitted(W, RequestId(0), &seq(&p, 64), 2), 32);
        // Chunk 1 written after the lookup: the admission walks on to it.
        c.lookup_to_admit(W, RequestId(0), &seq(&p, 64), 2);
        save(&mut c, t, &p, 64);
        assert_eq!(c.admitted(W, RequestId(0), &seq(&p, 64), 2), 64);
        // Nor does another request's lookup stop it.
        c.lookup_to_admit(W, RequestId(1), &seq(&blocks(2, 64), 64), 2);
        assert_eq!(c.admitted(W, RequestId(0), &seq(&p, 64), 2), 64);
    }

    #[test]
    fn an_admission_after_a_load_counts_the_held_prefix_from_the_loads_walk() {
        let mut c = connector(1 << 20, 2);
        let p = blocks(1, 64);
        let t = save(&mut c, SimTime::ZERO, &p, 64);
        let mut out = ConnectorOutput::default();
        assert_eq!(c.load(t, W, RequestId(0), &seq(&p, 64), 0, &mut out).tokens, 63);
        // Another request's content under the same id and length: walked anew.
        let q = blocks(2, 64);
        assert_eq!(c.admitted(W, RequestId(0), &seq(&q, 64), 0), 0);
        // The kept walk serves its own admission: the whole prompt is held
        // (the load's 63 tokens are its 4 blocks but the last token).
        c.load(t, W, RequestId(0), &seq(&p, 64), 0, &mut out);
        assert_eq!(c.admitted(W, RequestId(0), &seq(&p, 64), 0), 64);
        // With a GPU prefix of 2 blocks (chunk 1 on): the same 64.
        c.load(t, W, RequestId(0), &seq(&p, 64), 2, &mut out);
        assert_eq!(c.admitted(W, RequestId(0), &seq(&p, 64), 2), 64);
    }
}
