//! The KV cache: block hashing, the GPU prefix cache (vLLM automatic prefix
//! caching) and the chunk stores of the slower tiers (LMCache-style CPU
//! memory, local NVMe, and one distributed file system shared by the cluster).
//!
//! Simplifications: a block's identity is a chained 64-bit hash of the token
//! content it holds (collisions are ignored); tiers keep whole chunks of
//! `kvc.chunk_size` tokens, keyed by the hash of the chunk's last block,
//! which identifies the whole prefix up to it.

pub mod connector;
mod hash;
mod lru;
mod prefix;
pub mod saving;
mod store;

pub use connector::{ConnectorOutput, ExternalHit, KvConnector, LoadDone};
pub use hash::{
    BlockHash, ChainSpan, ChunkKey, Content, Segment, block_hash, block_hashes, chains_of, content_id, exact_key,
};
pub use prefix::{Hit, Path, PrefixCache};
pub(crate) use store::Lane;
pub use store::{ChunkStore, EvictionPolicy, Run, StoreOps};

/// A cache tier, fastest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// GPU HBM (the prefix cache).
    Gpu,
    /// Host DRAM of the worker (`CPUMemory`).
    Cpu,
    /// Local NVMe of the worker (`LocalNVMe`).
    Nvme,
    /// The cluster-wide distributed file system (`DistributedFS`).
    Dfs,
}

impl Tier {
    /// Every tier, fastest first.
    pub const ALL: [Tier; 4] = [Tier::Gpu, Tier::Cpu, Tier::Nvme, Tier::Dfs];

    /// Short name used in column names.
    pub fn short(self) -> &'static str {
        match self {
            Tier::Gpu => "gpu",
            Tier::Cpu => "cpu",
            Tier::Nvme => "nvme",
            Tier::Dfs => "dfs",
        }
    }

    /// Opal's configuration name (`kvc.kvc_tiers` entries).
    pub fn opal_name(self) -> &'static str {
        match self {
            Tier::Gpu => "GPU",
            Tier::Cpu => "CPUMemory",
            Tier::Nvme => "LocalNVMe",
            Tier::Dfs => "DistributedFS",
        }
    }

    /// Parses an Opal tier name (case-insensitive).
    pub fn from_opal_name(name: &str) -> Option<Tier> {
        [Tier::Cpu, Tier::Nvme, Tier::Dfs].into_iter().find(|t| t.opal_name().eq_ignore_ascii_case(name))
    }

    /// Index into per-tier arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// What a KV event reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvEventKind {
    /// The block (or chunk) is now held.
    Stored,
    /// The block (or chunk) is gone.
    Removed,
}

/// A change to a worker's cache contents, as reported to the router: like
/// vLLM's `BlockStored` and `BlockRemoved` (`vllm/distributed/kv_events.py`),
/// which carry a list of block hashes, one event may name many chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvEvent {
    /// Tier.
    pub tier: Tier,
    /// The chunks it is about.
    pub chunks: EventChunks,
    /// Stored or removed.
    pub kind: KvEventKind,
}

/// Which chunks a [`KvEvent`] is about, in the order they changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventChunks {
    /// A run of a chain's chunks, last chunk first (the tiers' events).
    Run(Run),
    /// A run of a chain's chunks, first chunk first (the GPU's events).
    RunUp(Run),
}

impl EventChunks {
    /// The run named.
    pub fn run(&self) -> Run {
        match *self {
            EventChunks::Run(r) | EventChunks::RunUp(r) => r,
        }
    }

    /// Chunks named.
    pub fn len(&self) -> u64 {
        self.run().n
    }

    /// Names no chunk.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes the first `k` chunks (fewer than it names) off the front,
    /// for chunks of `stride` blocks.
    pub fn split_front(&mut self, k: u64, stride: u64) -> EventChunks {
        match self {
            EventChunks::Run(r) => {
                debug_assert!(k < r.n);
                // Last chunk first: the front is the highest chunks.
                let front = r.skip(r.n - k, stride);
                *r = r.first(r.n - k);
                EventChunks::Run(front)
            }
            EventChunks::RunUp(r) => {
                debug_assert!(k < r.n);
                let front = r.first(k);
                *r = r.skip(k, stride);
                EventChunks::RunUp(front)
            }
        }
    }

    /// The chunks' keys as hashes, in order, for chunks of `stride` blocks.
    pub fn hashes(&self, stride: u64) -> impl Iterator<Item = BlockHash> + '_ {
        let n = self.len();
        (0..n).map(move |i| match self {
            EventChunks::Run(r) => r.key(n - 1 - i, stride).hash(),
            EventChunks::RunUp(r) => r.key(i, stride).hash(),
        })
    }
}

/// Where completed requests' chunks are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WritePolicy {
    /// To every tier.
    WriteThrough,
    /// To the first tier; chunks it evicts are written to the next tier, and so on.
    Spill,
}

/// Whether a request's completion waits for its chunks to be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// Completion does not wait (the writes still use bandwidth).
    Async,
    /// Completion waits for every write of the request.
    Sync,
}

/// When a request's prompt KV goes to the tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveTiming {
    /// As it is computed (LMCache): each step's newly completed full chunks
    /// are written when the step ends, the last partial one when the prompt
    /// is done — LMCache's connector saves each layer's KV during the
    /// forward pass (`save_kv_layer`) and waits for it at the end of the
    /// step (`wait_for_save`, `vllm/distributed/kv_transfer/kv_connector/v1/base.py`).
    OnCompute,
    /// When the request finishes (the earlier rule).
    OnFinish,
}

/// What identifies a sequence's last, partial chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartialChunks {
    /// Its exact tokens in their prefix (LMCache's chunk hash): it is hit
    /// only by a sequence with the identical token run, to the same length.
    ExactTokens,
    /// Its full blocks (the earlier rule): hit by any sequence with the same
    /// full blocks there, whatever tokens follow the last of them.
    FullBlocks,
}

/// A sequence as the tiers see it: the chains its full blocks lie on, its
/// length in tokens, and the key of its exact token run when that ends
/// inside a block ([`exact_key`]).
#[derive(Clone, Copy, Debug)]
pub struct ChunkedSeq<'a> {
    /// Its full blocks' chains (covering at least `tokens / block_size` blocks, or all it has).
    pub chains: &'a [ChainSpan],
    /// Its length, tokens.
    pub tokens: u64,
    /// [`exact_key`] of its tokens, when `tokens` ends inside a block.
    pub tail: Option<BlockHash>,
}

impl ChunkedSeq<'_> {
    /// Full blocks it has keys for.
    pub fn blocks(&self) -> u64 {
        self.chains.last().map_or(0, |s| s.end)
    }

    /// The key of a chunk ending with block `k` (one of its blocks).
    pub fn key(&self, k: u64) -> ChunkKey {
        let i = self.chains.partition_point(|s| s.end <= k);
        ChunkKey::new(self.chains[i].chain, k)
    }
}

/// One configured tier below the GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct TierConfig {
    /// Which tier.
    pub tier: Tier,
    /// Its device.
    pub device: crate::storage::DeviceConfig,
    /// Capacity per instance, bytes.
    pub capacity_bytes: u64,
    /// Eviction order.
    pub eviction: EvictionPolicy,
    /// Dollars per GiB-hour of capacity (0 without a price).
    pub usd_per_gib_hour: f64,
    /// Watts per GiB of capacity (0 without a figure).
    pub watts_per_gib: f64,
}

/// The resolved `[kvc]` section.
#[derive(Clone, Debug, PartialEq)]
pub struct KvcConfig {
    /// Tiers in lookup order.
    pub tiers: Vec<TierConfig>,
    /// Engine blocks per chunk.
    pub chunk_blocks: u64,
    /// Store a request's last, partial chunk too.
    pub save_unfull_chunk: bool,
    /// What identifies a partial chunk.
    pub partial_chunks: PartialChunks,
    /// Tokens per engine block.
    pub block_size: u64,
    /// Store the KV of generated tokens too, not only the prompt's (LMCache's `save_decode_cache`).
    pub save_decode_cache: bool,
    /// Where chunks are written.
    pub write_policy: WritePolicy,
    /// Whether completion waits for writes.
    pub write_mode: WriteMode,
    /// When prompt KV is written.
    pub save_timing: SaveTiming,
    /// Write a chunk when the GPU evicts its last block.
    pub store_on_gpu_eviction: bool,
    /// Write what a worker loads from a slower tier into its faster per-worker tiers.
    pub write_back_hits: bool,
    /// Bytes of one engine block (block_size × KV bytes per token).
    pub block_bytes: u64,
    /// How long a worker gathers KV events before sending them.
    pub event_coalesce: crate::time::SimDuration,
    /// Whether workers publish KV events at all (only a KV-aware router reads them).
    pub publish_events: bool,
}

impl KvcConfig {
    /// Tokens per chunk.
    pub fn chunk_tokens(&self) -> u64 {
        self.chunk_blocks * self.block_size
    }

    /// Bytes of KV per token.
    pub fn token_bytes(&self) -> u64 {
        self.block_bytes / self.block_size
    }

    /// The chunks of sequence `s` from chunk `j` on, in order, while they
    /// exist, each as its key and its token range `[start, end)` (LMCache:
    /// chunk `j` holds tokens `[j·chunk, (j+1)·chunk)`, the last one what is
    /// left). A full chunk's key is the hash of its last
    /// block, which identifies the whole prefix up to it. A chunk cut short
    /// by the sequence's end exists only with `save_unfull_chunk`; its key is
    /// the sequence's exact-run key ([`PartialChunks::ExactTokens`], when
    /// the run ends inside a block) or that of its last full block
    /// ([`PartialChunks::FullBlocks`], and an exact run without a known key),
    /// whose tokens it then covers.
    #[inline]
    pub fn chunks<'s>(&self, s: &ChunkedSeq<'s>, j: u64) -> Chunks<'s> {
        let (b, c) = (self.block_size, self.chunk_tokens());
        let full_end = ((s.tokens / b).min(s.blocks())) * b;
        let exact = self.partial_chunks == PartialChunks::ExactTokens && s.tail.is_some();
        Chunks {
            chains: s.chains,
            // The chain of the first chunk's first block (a chunk's last block is at or after it).
            span: s.chains.partition_point(|x| x.end <= j * self.chunk_blocks),
            tail: s.tail,
            chunk_blocks: self.chunk_blocks,
            block_size: b,
            chunk_tokens: c,
            // Where chunks end: the sequence's end for an exact run, else its last full block.
            end: if exact { s.tokens } else { full_end },
            partial: self.save_unfull_chunk,
            j,
        }
    }
    /// The chunks of sequence `s` from chunk `j` on, as [`Self::chunks`]
    /// gives them, in runs: each run the consecutive full chunks whose last
    /// blocks lie on one chain, with its token range `[start, end)`; a last,
    /// partial chunk is a run of its own.
    #[inline]
    pub fn runs<'s>(&self, s: &ChunkedSeq<'s>, j: u64) -> Runs<'s> {
        let chunks = self.chunks(s, j);
        Runs { chunks }
    }
}

/// The runs of a sequence's chunks ([`KvcConfig::runs`]).
#[derive(Clone, Debug)]
pub struct Runs<'s> {
    chunks: Chunks<'s>,
}

impl Iterator for Runs<'_> {
    type Item = (Run, u64, u64);

    fn next(&mut self) -> Option<(Run, u64, u64)> {
        let c = &mut self.chunks;
        let start = c.j * c.chunk_tokens;
        if start + c.chunk_tokens > c.end {
            // At most a partial chunk is left.
            return c.next().map(|(key, start, end)| (Run::one(key), start, end));
        }
        let whole = (c.end - start) / c.chunk_tokens;
        let k = (c.j + 1) * c.chunk_blocks - 1;
        let key = c.on_chain(k);
        // Full chunks whose last blocks are on this chain: k, k + stride, … < its end.
        let on_chain = (c.chains[c.span].end - 1 - k) / c.chunk_blocks + 1;
        let n = whole.min(on_chain);
        c.j += n;
        Some((Run { chain: key.chain, block: k, n }, start, start + n * c.chunk_tokens))
    }
}

/// The chunks of a sequence from some chunk on ([`KvcConfig::chunks`]):
/// `(key, start, end)` each. A full chunk's key is its last block on that
/// block's chain, found by stepping along the chains; only a last, partial
/// chunk takes the general rule.
#[derive(Clone, Debug)]
pub struct Chunks<'s> {
    chains: &'s [ChainSpan],
    /// The span holding the next chunk's last block (or one before it).
    span: usize,
    tail: Option<BlockHash>,
    chunk_blocks: u64,
    block_size: u64,
    chunk_tokens: u64,
    end: u64,
    partial: bool,
    j: u64,
}

impl Chunks<'_> {
    /// The key of the chunk ending with block `k`, at or after the span cursor.
    fn on_chain(&mut self, k: u64) -> ChunkKey {
        while self.chains[self.span].end <= k {
            self.span += 1;
        }
        ChunkKey::new(self.chains[self.span].chain, k)
    }
}

impl Iterator for Chunks<'_> {
    type Item = (ChunkKey, u64, u64);

    fn next(&mut self) -> Option<(ChunkKey, u64, u64)> {
        let start = self.j * self.chunk_tokens;
        let end = self.end.min(start + self.chunk_tokens);
        if end <= start || (end < start + self.chunk_tokens && !self.partial) {
            return None;
        }
        self.j += 1;
        let key = if end == start + self.chunk_tokens {
            self.on_chain(self.j * self.chunk_blocks - 1)
        } else {
            match (end % self.block_size, self.tail) {
                (0, _) => self.on_chain(end / self.block_size - 1),
                (_, Some(tail)) => ChunkKey::exact(tail),
                (_, None) => unreachable!("a run ending inside a block is exact only with its key"),
            }
        };
        Some((key, start, end))
    }
}
