//! The GPU prefix cache: vLLM's automatic prefix caching over a paged block
//! pool, stored as a radix tree of block runs (as SGLang's RadixCache).
//!
//! Blocks are *free* (no content), *private* (allocated to one request, not
//! yet hashed: being computed, or a partial last block), or *cached* (full,
//! hashed, reference-counted). Cached blocks live in tree nodes; a node holds
//! a run of consecutive blocks of one prefix, kept as the chains they lie
//! on (a block's hash is its chain's and its position's, [`ChunkKey`], so
//! two blocks at one position are equal exactly when their chains are, and
//! no per-block hash is kept or computed), and every block of a node has
//! the same reference count, so a request
//! holds a *path* of whole nodes from the root (nodes are split where
//! holders diverge). Work per request is proportional to the segments it
//! shares, not to its blocks.
//!
//! Unreferenced blocks stay resident and are evicted least recently used
//! first, from the tail of leaf nodes — as vLLM v1 frees a request's blocks
//! tail first. An optional TTL keeps a node from being evicted until `ttl`
//! after its last use.
//!
//! Stored/removed events (for the router) and evicted-block reports (for
//! write-back to the tiers) are made for blocks that end a `stride`-block
//! chunk only: the router's view and the tiers both work in chunks, and this
//! keeps the event volume 1/stride of the block traffic.

use super::lru::{Lru, Stamps};
use super::{BlockHash, ChainSpan, ChunkKey, EventChunks, KvEvent, KvEventKind, Run, Tier};
use crate::time::{SimDuration, SimTime};
use nohash_hasher::IntMap;
use smallvec::SmallVec;

/// A request's hold on the cache: the last node of its path (`NONE`: nothing held).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Path(u32);

impl Path {
    /// Holding nothing.
    pub const NONE: Path = Path(u32::MAX);
}

/// A resident prefix [`PrefixCache::lookup`] found, which
/// [`PrefixCache::acquire`] takes without walking the tree again — as long
/// as the cache has not changed in between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    blocks: u64,
    /// The cache's [`PrefixCache::changes`] when it was found.
    changes: u64,
    /// The last node matched whole.
    end: u32,
    /// The node matched in part, and how far.
    partial: Option<(u32, u64)>,
}

impl Hit {
    /// Nothing resident.
    pub const NONE: Hit = Hit { blocks: 0, changes: 0, end: ROOT, partial: None };

    /// Blocks resident.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }
}

impl Default for Path {
    fn default() -> Self {
        Path::NONE
    }
}

const ROOT: u32 = 0;

/// The chains of a node's blocks: `(chain, end)` with absolute block
/// positions, the last ending where the node does (two inline: a request's
/// own node often holds its prompt's last chain and its output's).
type Spans = SmallVec<[ChainSpan; 2]>;

/// A run of blocks in the tree. `repr(C)` so that what a release or a walk
/// reads and writes — parent, references, children, LRU stamp, last use,
/// position and length, the first 32 bytes — lies in one cache line for
/// three nodes in four (80-byte nodes start at every 16th byte of a line);
/// in the compiler's order they spread over two.
#[derive(Clone, Debug, Default)]
#[repr(C)]
struct Node {
    parent: u32,
    refs: u32,
    children: u32,
    /// Its stamp in the LRU set (0 when it is not in it; see [`Stamps`]).
    stamp: u32,
    last_used: SimTime,
    /// Sequence position of the first block.
    first_pos: u32,
    /// Blocks.
    len: u32,
    /// The hash it is registered under in its parent (its first block's,
    /// kept while blocks are evicted from its tail).
    key: BlockHash,
    /// The chains they lie on.
    spans: Spans,
}

impl Stamps for Vec<Node> {
    fn stamp(&self, i: u32) -> u32 {
        self[i as usize].stamp
    }

    fn set_stamp(&mut self, i: u32, stamp: u32) {
        self[i as usize].stamp = stamp;
    }
}

impl Node {
    /// One past its last block's position.
    fn end(&self) -> u64 {
        u64::from(self.first_pos) + u64::from(self.len)
    }
}

/// Appends to `out` the chains of blocks `from..to` of `chains`, merging
/// with `out`'s last span where it goes on.
fn push_spans(out: &mut Spans, chains: &[ChainSpan], from: u64, to: u64) {
    let mut i = chains.partition_point(|s| s.end <= from);
    while from < to && i < chains.len() {
        let span = ChainSpan { chain: chains[i].chain, end: chains[i].end.min(to) };
        match out.last_mut() {
            Some(l) if l.chain == span.chain => l.end = span.end,
            _ => out.push(span),
        }
        if chains[i].end >= to {
            break;
        }
        i += 1;
    }
}

/// The GPU KV block pool of one worker.
#[derive(Debug)]
#[cfg_attr(test, derive(Clone))]
pub struct PrefixCache {
    enabled: bool,
    ttl: SimDuration,
    total: u64,
    free: u64,
    evictable: u64,
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    /// (parent node, first block hash) → child node.
    children: IntMap<u64, u32>,
    /// Root chain → the node holding its last resident block, for every
    /// resident chain whose first block is a sequence's first (only a
    /// node's first span can be such a chain). A chain's blocks lie on one
    /// path from the root and are resident from its first on (blocks go
    /// from the tails of leaves), so a lookup reads the blocks of a
    /// sequence's first chain off this map at once instead of visiting
    /// the nodes they are split into (where shorter prompts sharing them
    /// end), and walks on from there. Only first chains are kept: a
    /// sequence's later chains (one per 512-token hash id in a Mooncake
    /// trace) would cost more to keep than their few long nodes do to walk.
    roots: IntMap<u64, u32>,
    /// The unreferenced leaves, least recently used first.
    lru: Lru,
    /// Stored/removed events since the last drain (when `events_on`).
    pub events: Vec<KvEvent>,
    /// Chunks whose last block was evicted since the last drain (when `evicted_on`).
    pub evicted: Vec<ChunkKey>,
    events_on: bool,
    evicted_on: bool,
    stride: u32,
    /// Bumped whenever blocks become free, evictable or cached.
    epoch: u64,
    /// Bumped by every change of the tree (what a [`Hit`] points into):
    /// an acquire takes a hit only from the cache it was found on.
    changes: u64,
}

/// How many of blocks `from..to` of `chains` node `n` holds from its
/// first block on (`from` being its first block's position): blocks at one
/// position are equal exactly when their chains are, and a chain covers
/// everything before it, so the first block whose chains differ ends the
/// match — found by stepping over the spans of either, not the blocks.
///
/// `i` is the index of the span of `chains` holding `from` (or one before
/// it), moved on to the one holding the first block not matched.
fn common_prefix(n: &Node, chains: &[ChainSpan], i: &mut usize, from: u64, to: u64) -> u64 {
    let to = to.min(n.end());
    let mut p = from;
    while chains[*i].end <= p {
        *i += 1;
    }
    for s in &n.spans {
        while p < s.end.min(to) {
            if chains[*i].chain != s.chain {
                return p - from;
            }
            p = s.end.min(chains[*i].end).min(to);
            if p == chains[*i].end && *i + 1 < chains.len() {
                *i += 1;
            }
        }
    }
    p - from
}

fn child_key(parent: u32, first: BlockHash) -> u64 {
    first.0 ^ u64::from(parent).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The runs of chunk-ending blocks (every `stride`-th position) among
/// blocks `from..to` of a sequence whose blocks lie on `chains` (spans
/// with absolute ends, the first holding `from`): one per chain, in order.
fn reported_runs(chains: &[ChainSpan], from: u64, to: u64, stride: u32) -> impl Iterator<Item = Run> + '_ {
    let i = chains.partition_point(|s| s.end <= from);
    let mut a = from;
    chains[i..].iter().take_while(move |_| a < to).filter_map(move |s| {
        let b = s.end.min(to);
        let f = a + first_reported(a, stride) as u64;
        a = b;
        (f < b).then(|| Run { chain: s.chain, block: f, n: (b - 1 - f) / u64::from(stride) + 1 })
    })
}

/// Pushes a `kind` GPU event per run of [`reported_runs`], first chunk first.
fn push_runs(events: &mut Vec<KvEvent>, chains: &[ChainSpan], from: u64, to: u64, stride: u32, kind: KvEventKind) {
    let runs = reported_runs(chains, from, to, stride);
    events.extend(runs.map(|r| KvEvent { tier: Tier::Gpu, chunks: EventChunks::RunUp(r), kind }));
}

/// The first `k` whose block (at position `first + k`) ends a chunk of
/// `stride` blocks: `(first + k + 1) ≡ 0 (mod stride)`.
fn first_reported(first: u64, stride: u32) -> usize {
    let s = u64::from(stride);
    ((s - (first + 1) % s) % s) as usize
}

impl PrefixCache {
    /// A pool of `total` free blocks; with `enabled` false nothing is ever
    /// cached (every block stays private).
    pub fn new(total: u64, enabled: bool, ttl: SimDuration) -> PrefixCache {
        PrefixCache {
            enabled,
            ttl,
            total,
            free: total,
            evictable: 0,
            nodes: vec![Node { parent: ROOT, ..Node::default() }],
            free_nodes: Vec::new(),
            children: IntMap::default(),
            roots: IntMap::default(),
            lru: Lru::default(),
            events: Vec::new(),
            evicted: Vec::new(),
            events_on: true,
            evicted_on: false,
            stride: 1,
            epoch: 0,
            changes: 0,
        }
    }

    /// Changes whenever blocks are freed, become evictable or are cached:
    /// an allocation that failed cannot succeed before it changes (or time
    /// passes a TTL) — newly cached blocks can lengthen a request's hit and
    /// so shrink what it needs.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Chooses what is reported: events (on by default), evicted blocks
    /// (off by default), for blocks ending a chunk of `stride` blocks (1 by default).
    pub fn record(&mut self, events: bool, evicted: bool, stride: u32) {
        self.events_on = events;
        self.evicted_on = evicted;
        self.stride = stride.max(1);
    }

    /// Whether prefix caching is on.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Blocks in the pool.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Blocks in use (private or referenced): neither free nor evictable.
    pub fn used(&self) -> u64 {
        self.total - self.free - self.evictable
    }

    /// Cached blocks nobody references.
    pub fn evictable(&self) -> u64 {
        self.evictable
    }

    /// Evictable blocks [`Self::allocate`] can take, least recently used
    /// first, before it takes one it tells of (a KV event or an evicted-block
    /// report, see [`Self::record`]): all of them when it tells of none.
    /// Counted from the least recently used leaf's tail on, leaf by leaf,
    /// up to the first told-of block or the first leaf whose removal may put
    /// its parent in the LRU set (which may then come next): a lower bound
    /// there, exact otherwise. A run of decode steps allocates within it, so
    /// that whatever it evicts is invisible and may happen late.
    pub fn quietly_evictable(&self) -> u64 {
        if !(self.events_on || self.evicted_on) {
            return self.evictable;
        }
        let s = self.stride as usize;
        let mut quiet = 0;
        for (_, i) in self.lru.iter(&self.nodes) {
            let node = &self.nodes[i as usize];
            let len = node.len as usize;
            // Blocks go from the tail; the last told-of one stops the count.
            let k0 = first_reported(u64::from(node.first_pos), self.stride);
            if k0 < len {
                return quiet + ((len - 1 - k0) % s) as u64;
            }
            quiet += len as u64;
            let parent = &self.nodes[node.parent as usize];
            if node.parent != ROOT && parent.refs == 0 && parent.children == 1 {
                break;
            }
        }
        quiet
    }

    /// Blocks with no content.
    pub fn free(&self) -> u64 {
        self.free
    }

    fn child(&self, parent: u32, first: BlockHash) -> Option<u32> {
        self.children.get(&child_key(parent, first)).copied()
    }

    /// Walks the longest resident prefix of the first `n` blocks of a
    /// sequence whose blocks lie on `chains`, node by node from the root
    /// (what [`Self::find`] finds; debug builds check it).
    #[cfg(debug_assertions)]
    fn walk(&self, chains: &[ChainSpan], n: u64) -> Hit {
        self.walk_below(ROOT, 0, 0, chains, n)
    }

    /// The walk of [`Self::walk`] on from the end of `node`, where the
    /// sequence's first `pos` blocks are matched (`i`: the index of the
    /// span of `chains` holding block `pos`, or one before it).
    fn walk_below(&self, mut node: u32, mut pos: u64, mut i: usize, chains: &[ChainSpan], n: u64) -> Hit {
        while pos < n {
            while chains[i].end <= pos {
                i += 1;
            }
            let Some(c) = self.child(node, ChunkKey::new(chains[i].chain, pos).hash()) else { break };
            let run = &self.nodes[c as usize];
            // Most nodes lie on one chain, the one the sequence is on here.
            let whole = n.min(run.end());
            let l = if run.spans.len() == 1 && run.spans[0].chain == chains[i].chain && chains[i].end >= whole {
                whole - pos
            } else {
                common_prefix(run, chains, &mut i, pos, n)
            };
            pos += l;
            if l < u64::from(run.len) {
                return Hit { blocks: pos, changes: self.changes, end: node, partial: Some((c, l)) };
            }
            node = c;
        }
        Hit { blocks: pos, changes: self.changes, end: node, partial: None }
    }

    /// The walk's hit from the sequence's first chain's tail ([`Self::roots`]):
    /// its blocks on that chain are resident up to where the chain's are,
    /// and the walk goes on from the node holding the last of them.
    fn find(&self, chains: &[ChainSpan], n: u64) -> Hit {
        let first = chains[0];
        let Some(&tail) = self.roots.get(&first.chain) else {
            // Its first block is not resident.
            return Hit { changes: self.changes, ..Hit::NONE };
        };
        let t = &self.nodes[tail as usize];
        debug_assert_eq!(t.spans[0].chain, first.chain, "a root chain is its tail node's first span");
        let mut pos = t.spans[0].end.min(first.end).min(n);
        // The node holding block pos - 1: the tail or an ancestor.
        let mut c = tail;
        while u64::from(self.nodes[c as usize].first_pos) >= pos {
            c = self.nodes[c as usize].parent;
        }
        // On inside it, as the walk goes on inside a node it entered.
        let node = &self.nodes[c as usize];
        let mut i = 0;
        if pos < node.end() {
            if pos < n {
                pos += common_prefix(node, chains, &mut i, pos, n);
            }
            if pos < node.end() {
                let l = pos - u64::from(node.first_pos);
                return Hit { blocks: pos, changes: self.changes, end: node.parent, partial: Some((c, l)) };
            }
        }
        self.walk_below(c, pos, i, chains, n)
    }

    /// The resident prefix of the first `n` blocks of a sequence whose
    /// blocks lie on `chains`.
    pub fn lookup(&self, chains: &[ChainSpan], n: u64) -> Hit {
        if !self.enabled || n == 0 {
            return Hit::NONE;
        }
        let hit = self.find(chains, n);
        #[cfg(debug_assertions)]
        assert_eq!(hit, self.walk(chains, n), "the first chain's tail gives the walk's hit");
        hit
    }

    /// Takes a reference on the blocks of `hit` (found by [`Self::lookup`]
    /// on the cache as it is) and returns the holder's path.
    pub fn acquire(&mut self, hit: Hit, now: SimTime) -> Path {
        if hit.blocks == 0 {
            return Path::NONE;
        }
        debug_assert_eq!(hit.changes, self.changes, "a hit is taken from the cache it was found on");
        self.changes += 1;
        let mut end = hit.end;
        if let Some((c, l)) = hit.partial {
            end = self.split(c, l);
        }
        let mut i = end;
        while i != ROOT {
            let node = &mut self.nodes[i as usize];
            if node.refs == 0 {
                self.evictable -= u64::from(node.len);
                self.lru.remove(i, &mut self.nodes);
            }
            let node = &mut self.nodes[i as usize];
            node.refs += 1;
            node.last_used = now;
            i = node.parent;
        }
        Path(end)
    }

    /// Splits node `c` after its first `l` blocks by inserting a new head
    /// node between `c` and its parent; `c` keeps the tail, its children and
    /// its LRU entry, so paths ending at or below `c` stay valid. Returns the
    /// head.
    fn split(&mut self, c: u32, l: u64) -> u32 {
        let old = &mut self.nodes[c as usize];
        debug_assert!(l > 0 && l < u64::from(old.len));
        let cut = u64::from(old.first_pos) + l;
        // A root chain ending before the cut ends in the head now.
        let first = (old.spans[0].end <= cut).then_some(old.spans[0].chain);
        // The head's chains up to the cut, the tail's from it.
        let mut head_spans = Spans::new();
        push_spans(&mut head_spans, &old.spans, u64::from(old.first_pos), cut);
        let at = old.spans.partition_point(|s| s.end <= cut);
        old.spans.drain(..at);
        let head = Node {
            parent: old.parent,
            key: old.key,
            first_pos: old.first_pos,
            len: l as u32,
            spans: head_spans,
            refs: old.refs,
            children: 1,
            stamp: 0,
            last_used: old.last_used,
        };
        let h = self.new_node(head);
        let parent = self.nodes[h as usize].parent;
        let key = self.nodes[h as usize].key;
        self.children.insert(child_key(parent, key), h);
        let tail = &mut self.nodes[c as usize];
        tail.parent = h;
        tail.first_pos = cut as u32;
        tail.len -= l as u32;
        tail.key = ChunkKey::new(tail.spans[0].chain, cut).hash();
        let tail_key = tail.key;
        self.children.insert(child_key(h, tail_key), c);
        if let Some(x) = first.and_then(|chain| self.roots.get_mut(&chain))
            && *x == c
        {
            *x = h;
        }
        h
    }

    fn new_node(&mut self, node: Node) -> u32 {
        match self.free_nodes.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    /// Drops the holder's references; unreferenced blocks become evictable
    /// (most recently used).
    pub fn release(&mut self, path: Path, now: SimTime) {
        let mut i = path.0;
        if i == Path::NONE.0 {
            return;
        }
        self.changes += 1;
        while i != ROOT {
            let node = &mut self.nodes[i as usize];
            debug_assert!(node.refs > 0, "released a node nobody holds");
            node.refs -= 1;
            node.last_used = now;
            if node.refs == 0 {
                self.evictable += u64::from(node.len);
                self.epoch += 1;
                if node.children == 0 {
                    self.lru.insert(now, i, &mut self.nodes);
                }
            }
            i = self.nodes[i as usize].parent;
        }
        self.coalesce(path.0);
    }

    /// Merges into node `c` the ancestors that have become the same run as
    /// it: a parent with `c` for its only child, held by exactly `c`'s
    /// holders and last used with it. No path ends at such a parent (every
    /// holder of it holds `c`), so `c` keeps its id, its LRU entry and the
    /// paths that end at or below it; splits that holders made and no
    /// longer need go away, and a walk visits one node per shared run.
    fn coalesce(&mut self, mut c: u32) {
        while c != ROOT {
            let p = self.nodes[c as usize].parent;
            let (pn, cn) = (&self.nodes[p as usize], &self.nodes[c as usize]);
            if p == ROOT || pn.children != 1 || pn.refs != cn.refs || pn.last_used != cn.last_used {
                c = p;
                continue;
            }
            let mut head = std::mem::take(&mut self.nodes[p as usize]);
            self.children.remove(&child_key(p, self.nodes[c as usize].key));
            self.children.insert(child_key(head.parent, head.key), c);
            // A root chain ending in the head ends in the merged node.
            if (head.spans.len() > 1 || self.nodes[c as usize].spans[0].chain != head.spans[0].chain)
                && let Some(x) = self.roots.get_mut(&head.spans[0].chain)
                && *x == p
            {
                *x = c;
            }
            let node = &mut self.nodes[c as usize];
            let end = node.end();
            push_spans(&mut head.spans, &node.spans, u64::from(node.first_pos), end);
            node.spans = head.spans;
            (node.parent, node.key, node.first_pos) = (head.parent, head.key, head.first_pos);
            node.len += head.len;
            self.free_nodes.push(p);
        }
    }

    /// Registers computed blocks `from..to` of a sequence whose blocks lie
    /// on `chains` right after `path` (which must end where they start),
    /// each replacing one of the holder's private blocks. Blocks already
    /// resident are shared instead (the private copy is freed). Returns the
    /// extended path, or the same path when caching is off (the blocks stay
    /// private).
    pub fn extend(&mut self, path: Path, chains: &[ChainSpan], from: u64, to: u64, now: SimTime) -> Path {
        if !self.enabled || from >= to {
            return path;
        }
        self.changes += 1;
        // Newly cached blocks can lengthen a waiting request's hit (and so
        // shrink what it needs): a failed allocation may succeed now.
        self.epoch += 1;
        let mut end = if path == Path::NONE { ROOT } else { path.0 };
        let (mut a, mut i) = (from, chains.partition_point(|s| s.end <= from));
        while a < to {
            // Fast path: the holder alone owns a leaf it is growing.
            let n = &self.nodes[end as usize];
            if end != ROOT && n.refs == 1 && n.children == 0 {
                self.emit_stored(chains, a, to);
                let n = &mut self.nodes[end as usize];
                push_spans(&mut n.spans, chains, a, to);
                n.len += (to - a) as u32;
                n.last_used = now;
                self.set_root(chains[0], a, end);
                break;
            }
            while chains[i].end <= a {
                i += 1;
            }
            let first = ChunkKey::new(chains[i].chain, a).hash();
            match self.child(end, first) {
                Some(c) => {
                    // Resident already: share the matching run.
                    let l = common_prefix(&self.nodes[c as usize], chains, &mut i, a, to);
                    let head = if l < u64::from(self.nodes[c as usize].len) { self.split(c, l) } else { c };
                    let node = &mut self.nodes[head as usize];
                    if node.refs == 0 {
                        self.evictable -= u64::from(node.len);
                        self.lru.remove(head, &mut self.nodes);
                    }
                    let node = &mut self.nodes[head as usize];
                    node.refs += 1;
                    node.last_used = now;
                    self.free += l;
                    self.epoch += 1;
                    end = head;
                    a += l;
                }
                None => {
                    self.emit_stored(chains, a, to);
                    let mut spans = Spans::new();
                    push_spans(&mut spans, chains, a, to);
                    let node = Node {
                        parent: end,
                        key: first,
                        first_pos: a as u32,
                        len: (to - a) as u32,
                        spans,
                        refs: 1,
                        children: 0,
                        stamp: 0,
                        last_used: now,
                    };
                    let c = self.new_node(node);
                    self.set_root(chains[0], a, c);
                    self.children.insert(child_key(end, first), c);
                    self.nodes[end as usize].children += 1;
                    self.lru.remove(end, &mut self.nodes);
                    end = c;
                    break;
                }
            }
        }
        Path(end)
    }

    /// Blocks from `a` on of a sequence whose first chain is `first` joined
    /// node `n`: if some are that chain's, its resident blocks end there.
    fn set_root(&mut self, first: ChainSpan, a: u64, n: u32) {
        if a < first.end {
            self.roots.insert(first.chain, n);
        }
    }

    /// Stored events for the chunk-ending blocks among `from..to` of `chains`.
    fn emit_stored(&mut self, chains: &[ChainSpan], from: u64, to: u64) {
        if self.events_on {
            push_runs(&mut self.events, chains, from, to, self.stride, KvEventKind::Stored);
        }
    }

    /// Returns `n` private blocks to the free pool.
    pub fn free_private(&mut self, n: u64) {
        self.free += n;
        self.epoch += 1;
        debug_assert!(self.free + self.evictable <= self.total, "freed more blocks than exist");
    }

    /// Whether `n` blocks can be allocated at `now` (free plus evictable
    /// blocks past their TTL, or every evictable block with `ignore_ttl`).
    #[inline]
    pub fn can_allocate(&self, n: u64, now: SimTime, ignore_ttl: bool) -> bool {
        n <= self.free || self.can_allocate_with(Hit::NONE, n, now, ignore_ttl)
    }

    /// Whether `n` blocks could be allocated with `hit` (found by
    /// [`Self::lookup`] on the cache as it is) taken — its unreferenced
    /// blocks no longer evictable — without taking it. vLLM's
    /// `allocate_slots` (`vllm/v1/core/kv_cache_manager.py`) counts a hit's
    /// evictable blocks among those to allocate and touches the hit only
    /// once the allocation fits: a request that does not fit leaves the
    /// hit's recency as it was.
    pub fn can_allocate_with(&self, hit: Hit, n: u64, now: SimTime, ignore_ttl: bool) -> bool {
        debug_assert!(hit.blocks == 0 || hit.changes == self.changes, "a hit is weighed on the cache it was found on");
        if n <= self.free {
            return true;
        }
        // The hit's unreferenced blocks: its whole nodes', and the matched
        // part of a node it ends inside.
        let partial = hit.partial.filter(|&(c, _)| self.nodes[c as usize].refs == 0).map_or(0, |(_, l)| l);
        let mut taken = partial;
        let mut i = hit.end;
        while i != ROOT {
            let node = &self.nodes[i as usize];
            if node.refs == 0 {
                taken += u64::from(node.len);
            }
            i = node.parent;
        }
        let need = n - self.free;
        if need + taken > self.evictable {
            return false;
        }
        if ignore_ttl || self.ttl.0 == 0 {
            return true;
        }
        // Expired leaves only (interior unreferenced nodes count once their
        // leaves go), less what taking the hit takes of them: its last
        // whole node, the matched part of the other (the root is no leaf).
        let mut got = 0;
        for (t, i) in self.lru.iter(&self.nodes) {
            if t + self.ttl > now {
                break;
            }
            let len = u64::from(self.nodes[i as usize].len);
            got += match hit.partial {
                _ if i == hit.end => 0,
                Some((c, l)) if c == i => len - l,
                _ => len,
            };
            if got >= need {
                return true;
            }
        }
        false
    }

    /// Allocates `n` private blocks, evicting least-recently-used blocks (from
    /// the tail of leaves) as needed. Call only after [`Self::can_allocate`]
    /// (with the same `ignore_ttl`) said yes.
    /// (Most calls evict nothing: that is done here, inlined.)
    #[inline]
    pub fn allocate(&mut self, n: u64, now: SimTime, ignore_ttl: bool) {
        if self.free >= n {
            self.free -= n;
        } else {
            self.allocate_evicting(n, now, ignore_ttl);
        }
    }

    fn allocate_evicting(&mut self, n: u64, now: SimTime, ignore_ttl: bool) {
        while self.free < n {
            let (t, i) = self.lru.first().expect("allocate without can_allocate");
            assert!(ignore_ttl || self.ttl.0 == 0 || t + self.ttl <= now, "allocate without can_allocate");
            self.changes += 1;
            let node = &mut self.nodes[i as usize];
            let take = (n - self.free).min(u64::from(node.len));
            let (end, keep) = (node.end(), node.end() - take);
            if self.events_on {
                push_runs(&mut self.events, &node.spans, keep, end, self.stride, KvEventKind::Removed);
            }
            if self.evicted_on {
                let stride = u64::from(self.stride);
                for r in reported_runs(&node.spans, keep, end, self.stride) {
                    self.evicted.extend((0..r.n).map(|k| r.key(k, stride)));
                }
            }
            node.len -= take as u32;
            node.spans.truncate(node.spans.partition_point(|s| s.end < keep) + 1);
            if let Some(last) = node.spans.last_mut() {
                last.end = keep;
            }
            let gone = node.len == 0;
            self.evictable -= take;
            self.free += take;
            if gone {
                self.remove_leaf(i);
            }
        }
        self.free -= n;
    }

    fn remove_leaf(&mut self, i: u32) {
        self.lru.remove(i, &mut self.nodes);
        let node = std::mem::take(&mut self.nodes[i as usize]);
        self.children.remove(&child_key(node.parent, node.key));
        self.free_nodes.push(i);
        let p = node.parent;
        // A root chain whose last blocks went here ends in the parent, if
        // it goes on from there, or is no longer resident.
        let first = node.spans[0].chain;
        if self.roots.get(&first) == Some(&i) {
            if p != ROOT && self.nodes[p as usize].spans.last().is_some_and(|s| s.chain == first) {
                self.roots.insert(first, p);
            } else {
                self.roots.remove(&first);
            }
        }
        let parent = &mut self.nodes[p as usize];
        parent.children -= 1;
        if p != ROOT && parent.refs == 0 && parent.children == 0 {
            let t = parent.last_used;
            self.lru.insert(t, p, &mut self.nodes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvcache::ChunkKey;

    /// What [`Node`]'s layout note counts on: 80-byte nodes whose first 32
    /// bytes (parent to length) hold what a release or a walk touches.
    #[cfg(target_pointer_width = "64")]
    #[test]
    fn a_node_is_80_bytes_with_its_hot_fields_in_the_first_32() {
        assert_eq!(std::mem::size_of::<Node>(), 80);
        assert_eq!(std::mem::offset_of!(Node, last_used), 16);
        assert_eq!(std::mem::offset_of!(Node, len), 28);
        assert_eq!(std::mem::offset_of!(Node, key), 32);
    }

    /// A made-up sequence: block `k` on chain `xs[k]` (the tests give a
    /// prefix's blocks the same ids and different prefixes different ones,
    /// as chains are: a chain stands for everything before it).
    fn hs(xs: &[u64]) -> Vec<ChainSpan> {
        let mut out = Spans::new();
        for (k, &x) in xs.iter().enumerate() {
            push_spans(&mut out, &[ChainSpan { chain: x, end: k as u64 + 1 }], k as u64, k as u64 + 1);
        }
        out.to_vec()
    }

    /// Registers blocks `from..` of sequence `xs` after `path`.
    fn ext(c: &mut PrefixCache, path: Path, xs: &[u64], from: u64, now: SimTime) -> Path {
        c.extend(path, &hs(xs), from, xs.len() as u64, now)
    }

    /// Blocks of sequence `xs` resident.
    fn look(c: &PrefixCache, xs: &[u64]) -> u64 {
        c.lookup(&hs(xs), xs.len() as u64).blocks()
    }

    /// Takes a reference on the first `n` blocks of sequence `xs`.
    fn take(c: &mut PrefixCache, xs: &[u64], n: u64, now: SimTime) -> Path {
        let hit = c.lookup(&hs(xs), n);
        assert_eq!(hit.blocks(), n, "acquired blocks are resident");
        c.acquire(hit, now)
    }

    /// The chain a GPU event of one chunk names (a made-up block's id).
    fn one(e: &KvEvent) -> BlockHash {
        assert_eq!(e.chunks.len(), 1);
        BlockHash(e.chunks.run().chain)
    }

    /// `(chain, position)` of each chunk reported evicted.
    fn evicted(c: &PrefixCache) -> Vec<(BlockHash, u64)> {
        c.evicted.iter().map(|k| (BlockHash(k.chain), k.block)).collect()
    }

    #[test]
    fn common_prefix_finds_where_chains_diverge() {
        // A node of blocks 0..8: chain 1 up to 3, chain 2 up to 6, chain 3.
        let spans = [(1, 3), (2, 6), (3, 8)].map(|(chain, end)| ChainSpan { chain, end });
        let node = Node { len: 8, spans: spans.into_iter().collect(), ..Node::default() };
        let common = |xs: &[(u64, u64)], to: u64| {
            let chains: Vec<ChainSpan> = xs.iter().map(|&(chain, end)| ChainSpan { chain, end }).collect();
            common_prefix(&node, &chains, &mut 0, 0, to)
        };
        assert_eq!(common(&[(1, 3), (2, 6), (3, 9)], 9), 8, "the node whole");
        assert_eq!(common(&[(1, 3), (2, 6), (3, 9)], 5), 5, "as far as asked");
        assert_eq!(common(&[(1, 3), (2, 4), (7, 9)], 9), 4, "diverging inside a span");
        assert_eq!(common(&[(1, 2), (5, 9)], 9), 2, "a span ending early");
        assert_eq!(common(&[(4, 9)], 9), 0);
    }

    #[test]
    fn a_lookup_reads_its_first_chain_off_its_tail_through_splits_merges_and_evictions() {
        let mut c = PrefixCache::new(32, true, SimDuration::ZERO);
        // A: chain 7 for blocks 0..8, then its own chain 8.
        let a = [7, 7, 7, 7, 7, 7, 7, 7, 8, 8];
        c.allocate(10, SimTime(1), false);
        let pa = ext(&mut c, Path::NONE, &a, 0, SimTime(1));
        // B shares 3 blocks of chain 7 (its node is split there), then goes on its own.
        let b = [7, 7, 7, 9, 9];
        let pb = take(&mut c, &b, 3, SimTime(2));
        c.allocate(2, SimTime(2), false);
        let pb = ext(&mut c, pb, &b, 3, SimTime(2));
        assert_eq!((look(&c, &a), look(&c, &b)), (10, 5));
        assert_eq!(look(&c, &[7, 7, 7, 7, 7, 7, 5]), 6, "six blocks of chain 7, inside A's node");
        assert_eq!(look(&c, &[7; 9]), 8, "chain 7's resident blocks end at 8");
        assert_eq!(look(&c, &[4, 4]), 0, "a first chain not resident");
        assert_eq!(c.lookup(&hs(&a), 4).blocks(), 4, "as far as asked");
        c.release(pa, SimTime(3));
        c.release(pb, SimTime(4));
        // 20 blocks are free: 2 more go from A's tail (chain 8's), 5 more
        // take the rest of A's node — chain 7's blocks then end in B's
        // parent, at 3 — and 3 more B's node and that parent: none is left.
        c.allocate(22, SimTime(5), false);
        assert_eq!((look(&c, &a), look(&c, &b)), (8, 5));
        c.allocate(5, SimTime(5), false);
        assert_eq!((look(&c, &a), look(&c, &b), look(&c, &[7; 9])), (3, 5, 3));
        c.allocate(5, SimTime(5), false);
        assert_eq!((look(&c, &a), look(&c, &b)), (0, 0));

        // A head ending its first chain, merged into its tail: D's node is
        // split after chain 7 ends (at 4) and one more block, then both
        // holders let go at once and the halves are one node again.
        let mut c = PrefixCache::new(32, true, SimDuration::ZERO);
        let d = [7, 7, 7, 7, 6, 6, 6];
        c.allocate(7, SimTime(1), false);
        let pd = ext(&mut c, Path::NONE, &d, 0, SimTime(1));
        let pe = take(&mut c, &d, 5, SimTime(2));
        assert_eq!(c.nodes.len() - c.free_nodes.len(), 3, "the root, D's head and its tail");
        assert_eq!((look(&c, &d), look(&c, &[7; 6])), (7, 4));
        c.release(pe, SimTime(3));
        c.release(pd, SimTime(3));
        assert_eq!(c.nodes.len() - c.free_nodes.len(), 2, "merged");
        assert_eq!((look(&c, &d), look(&c, &[7; 6]), look(&c, &[7, 7, 7, 7, 6, 5])), (7, 4, 5));
        c.allocate(32, SimTime(4), false);
        assert_eq!(look(&c, &d), 0);
    }

    #[test]
    fn computed_blocks_are_reused_and_stay_after_release() {
        let mut c = PrefixCache::new(4, true, SimDuration::ZERO);
        let t = SimTime(1);
        c.allocate(3, t, false);
        let p = ext(&mut c, Path::NONE, &[1, 2], 0, t);
        assert_eq!(c.used(), 3); // two cached + one private
        c.release(p, t);
        c.free_private(1);
        assert_eq!((c.used(), c.evictable()), (0, 2));
        // A new request finds the 2-block prefix but not a third block.
        assert_eq!(look(&c, &[1, 2, 3]), 2);
        take(&mut c, &[1, 2, 3], 2, t);
        assert_eq!((c.used(), c.evictable()), (2, 0));
    }

    #[test]
    fn eviction_is_least_recently_used_and_reports_removed_blocks() {
        let mut c = PrefixCache::new(3, true, SimDuration::ZERO);
        c.record(true, true, 1);
        c.allocate(3, SimTime(0), false);
        let paths: Vec<Path> = [1, 2, 3].iter().map(|&x| ext(&mut c, Path::NONE, &[x], 0, SimTime(0))).collect();
        // Released in the order 2, 1, 3.
        c.release(paths[1], SimTime(1));
        c.release(paths[0], SimTime(2));
        c.release(paths[2], SimTime(3));
        c.events.clear();
        assert!(c.can_allocate(2, SimTime(4), false));
        c.allocate(2, SimTime(4), false);
        assert_eq!(look(&c, &[3]), 1);
        assert_eq!(look(&c, &[2]) + look(&c, &[1]), 0);
        let removed: Vec<u64> = c.events.iter().map(|e| one(e).0).collect();
        assert_eq!(removed, vec![2, 1]);
        assert!(c.events.iter().all(|e| e.kind == KvEventKind::Removed));
        assert_eq!(evicted(&c), [(BlockHash(2), 0), (BlockHash(1), 0)]);
        assert!(!c.can_allocate(2, SimTime(4), false), "only one evictable block is left");
    }

    #[test]
    fn a_released_sequence_is_evicted_from_its_tail() {
        let mut c = PrefixCache::new(3, true, SimDuration::ZERO);
        c.allocate(3, SimTime(0), false);
        c.record(true, true, 1);
        let seq = [99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 1, 2, 3];
        let p = ext(&mut c, Path::NONE, &seq, 10, SimTime(0));
        c.release(p, SimTime(1));
        c.allocate(1, SimTime(2), false);
        let live: Vec<(u32, u32)> = c.nodes.iter().filter(|n| n.len > 0).map(|n| (n.first_pos, n.len)).collect();
        assert_eq!(live, [(10, 2)], "the prefix survives, the tail block went");
        assert_eq!(evicted(&c), [(BlockHash(3), 12)], "block positions are kept for write-back");
    }

    #[test]
    fn ttl_protects_recently_used_blocks() {
        let mut c = PrefixCache::new(1, true, SimDuration(100));
        c.allocate(1, SimTime(0), false);
        let p = ext(&mut c, Path::NONE, &[9], 0, SimTime(0));
        c.release(p, SimTime(10));
        assert!(!c.can_allocate(1, SimTime(109), false), "used at 10, protected until 110");
        assert!(c.can_allocate(1, SimTime(109), true), "unless the TTL yields");
        assert!(c.can_allocate(1, SimTime(110), false));
    }

    #[test]
    fn a_duplicate_computed_block_shares_the_resident_one() {
        let mut c = PrefixCache::new(4, true, SimDuration::ZERO);
        c.allocate(2, SimTime(0), false);
        let a = ext(&mut c, Path::NONE, &[5], 0, SimTime(0));
        let b = ext(&mut c, Path::NONE, &[5], 0, SimTime(0)); // a second request computed the same block
        assert_eq!(c.used(), 1, "the duplicate's private block went back to the pool");
        c.release(a, SimTime(1));
        assert_eq!(c.evictable(), 0, "still referenced once");
        c.release(b, SimTime(1));
        assert_eq!(c.evictable(), 1);
    }

    #[test]
    fn sharing_part_of_a_run_splits_it_and_keeps_the_shared_part() {
        let mut c = PrefixCache::new(4, true, SimDuration::ZERO);
        c.allocate(4, SimTime(0), false);
        let a = ext(&mut c, Path::NONE, &[1, 2, 3, 4], 0, SimTime(0));
        // B shares the first two blocks, then diverges.
        assert_eq!(look(&c, &[1, 2, 9]), 2);
        let b = take(&mut c, &[1, 2, 9], 2, SimTime(1));
        c.release(a, SimTime(2));
        assert_eq!((c.used(), c.evictable()), (2, 2), "blocks 3, 4 are A's alone");
        c.allocate(2, SimTime(3), false);
        assert_eq!(look(&c, &[1, 2, 3]), 2);
        c.free_private(2);
        // B extends its path with a new block after the split point.
        c.allocate(1, SimTime(3), false);
        let b = ext(&mut c, b, &[1, 2, 7], 2, SimTime(3));
        assert_eq!(look(&c, &[1, 2, 7]), 3);
        c.release(b, SimTime(4));
        assert_eq!((c.used(), c.evictable()), (0, 3));
    }

    #[test]
    fn a_run_split_by_its_holders_is_one_run_again_once_they_hold_it_alike() {
        let live = |c: &PrefixCache| c.nodes.len() - 1 - c.free_nodes.len();
        let mut c = PrefixCache::new(8, true, SimDuration::ZERO);
        c.allocate(8, SimTime(0), false);
        let a = ext(&mut c, Path::NONE, &[1, 2, 3, 4, 5, 6, 7, 8], 0, SimTime(0));
        // B and C hold the first 3 and 5 blocks: three runs.
        let b = take(&mut c, &[1, 2, 3, 9], 3, SimTime(1));
        let d = take(&mut c, &[1, 2, 3, 4, 5, 9], 5, SimTime(1));
        assert_eq!(live(&c), 3);
        // B lets go: [0, 3) and [3, 5) have the same holders (A, C) but not the same last use.
        c.release(b, SimTime(2));
        assert_eq!(live(&c), 3);
        // C, then A, let go at one time: each release merges along its path
        // (upwards from its end), and the 8 blocks are one run again, evicted from its tail.
        c.release(d, SimTime(3));
        assert_eq!(live(&c), 2, "[0, 5) held by A alone, then [5, 8)");
        c.release(a, SimTime(3));
        assert_eq!(live(&c), 1);
        assert_eq!((c.used(), c.evictable(), look(&c, &[1, 2, 3, 4, 5, 6, 7, 8])), (0, 8, 8));
        c.allocate(3, SimTime(4), false);
        assert_eq!(look(&c, &[1, 2, 3, 4, 5, 6, 7, 8]), 5);
        assert_eq!(live(&c), 1);
    }

    #[test]
    fn events_are_reported_for_chunk_ending_blocks_only() {
        let mut c = PrefixCache::new(8, true, SimDuration::ZERO);
        c.record(true, true, 4);
        c.allocate(8, SimTime(0), false);
        let p = ext(&mut c, Path::NONE, &[1, 2, 3, 4, 5, 6, 7, 8], 0, SimTime(0));
        // Positions 3 and 7 end 4-block chunks.
        assert_eq!(c.events.iter().map(|e| one(e).0).collect::<Vec<_>>(), vec![4, 8]);
        c.events.clear();
        c.release(p, SimTime(1));
        // Evicting 4 blocks takes positions 7, 6, 5, 4: one chunk end.
        c.allocate(4, SimTime(2), false);
        assert_eq!(c.events.iter().map(|e| (one(e).0, e.kind)).collect::<Vec<_>>(), vec![(8, KvEventKind::Removed)]);
        assert_eq!(evicted(&c), [(BlockHash(8), 7)]);
    }

    #[test]
    fn stored_and_evicted_chunks_are_one_event_per_chain_read_off_the_hashes() {
        // 2-block chunks ending at positions 1, 3, 5, 7; blocks 0..5 on chain
        // 10, 5..8 on chain 20.
        let chains = [ChainSpan { chain: 10, end: 5 }, ChainSpan { chain: 20, end: 8 }];
        let mut c = PrefixCache::new(8, true, SimDuration::ZERO);
        c.record(true, true, 2);
        c.allocate(8, SimTime(0), false);
        let p = c.extend(Path::NONE, &chains, 0, 8, SimTime(0));
        let run = |chain, block, n| EventChunks::RunUp(Run { chain, block, n });
        let got: Vec<EventChunks> = c.events.iter().map(|e| e.chunks).collect();
        // Positions 1, 3 on chain 10, then 5, 7 on chain 20.
        assert_eq!(got, [run(10, 1, 2), run(20, 5, 2)]);
        // Each names the chunks' hashes, first chunk first, as single events would.
        let hashes: Vec<BlockHash> = got.iter().flat_map(|e| e.hashes(2).collect::<Vec<_>>()).collect();
        let keys = [ChunkKey::new(10, 1), ChunkKey::new(10, 3), ChunkKey::new(20, 5), ChunkKey::new(20, 7)];
        assert_eq!(hashes, keys.map(ChunkKey::hash));
        // Evicted whole: the same runs removed, and each chunk's key for write-back.
        c.events.clear();
        c.release(p, SimTime(1));
        c.allocate(8, SimTime(2), false);
        assert!(c.events.iter().all(|e| e.kind == KvEventKind::Removed));
        assert_eq!(c.events.iter().map(|e| e.chunks).collect::<Vec<_>>(), [run(10, 1, 2), run(20, 5, 2)]);
        let keys = [ChunkKey::new(10, 1), ChunkKey::new(10, 3), ChunkKey::new(20, 5), ChunkKey::new(20, 7)];
        assert_eq!(c.evicted, keys);
    }

    #[test]
    fn quiet_evictions_stop_before_the_first_block_told_of() {
        // Stride 4: positions 3, 7, … end chunks. A holds positions 0, 1 (no
        // chunk end), B positions 0..6 (one, at 3), released after A.
        let mut c = PrefixCache::new(16, true, SimDuration::ZERO);
        c.record(true, false, 4);
        c.allocate(8, SimTime(0), false);
        let a = ext(&mut c, Path::NONE, &[1, 2], 0, SimTime(0));
        let b = ext(&mut c, Path::NONE, &[11, 12, 13, 14, 15, 16], 0, SimTime(0));
        c.release(a, SimTime(1));
        c.release(b, SimTime(2));
        c.events.clear();
        // 8 free, then A's two blocks and B's positions 5, 4 before position 3.
        assert_eq!((c.free(), c.quietly_evictable()), (8, 4));
        c.allocate(12, SimTime(3), false);
        assert!(c.events.is_empty());
        c.allocate(1, SimTime(3), false);
        assert_eq!(c.events.iter().map(|e| one(e).0).collect::<Vec<_>>(), [14]);
        // Telling of nothing, every evictable block is quiet.
        c.record(false, false, 4);
        assert_eq!(c.quietly_evictable(), c.evictable());
    }

    /// A random sequence of blocks: a random prefix of a random one of
    /// `seqs` (or nothing), then `1 + next(new)` blocks of its own,
    /// numbered from `tag`.
    fn random_seq(next: &mut impl FnMut(u64) -> u64, seqs: &[Vec<u64>], new: u64, tag: u64) -> Vec<u64> {
        let mut h = match seqs.get(next(seqs.len() as u64 + 1) as usize) {
            Some(s) => s[..next(s.len() as u64 + 1) as usize].to_vec(),
            None => Vec::new(),
        };
        h.extend((0..1 + next(new)).map(|k| tag + k));
        h
    }

    #[test]
    fn quiet_evictions_are_a_lower_bound_that_tells_of_nothing() {
        // Random caches of sequences sharing prefixes, released in random
        // order: allocating the quiet count block by block makes no event.
        let mut next = crate::rng::lcg_below(0x2545_f491_4f6c_dd1d_u64);
        let mut quiet_cases = 0;
        for case in 0..300 {
            let stride = 1 + next(5) as u32;
            let mut c = PrefixCache::new(400, true, SimDuration::ZERO);
            c.record(true, case % 2 == 0, stride);
            let mut seqs: Vec<Vec<u64>> = Vec::new();
            let mut paths = Vec::new();
            for i in 0..1 + next(8) {
                let h = random_seq(&mut next, &seqs, 12, 1000 * (case + 1) + 100 * i);
                c.allocate(h.len() as u64, SimTime(0), false);
                paths.push(ext(&mut c, Path::NONE, &h, 0, SimTime(0)));
                seqs.push(h);
            }
            let n = paths.len() as u64;
            for t in 0..n {
                let k = next(n) as usize;
                if paths[k] != Path::NONE {
                    c.release(std::mem::replace(&mut paths[k], Path::NONE), SimTime(1 + t));
                }
            }
            let quiet = c.quietly_evictable();
            assert!(quiet <= c.evictable());
            quiet_cases += u32::from(quiet > 0);
            c.allocate(c.free(), SimTime(99), false);
            c.events.clear();
            c.evicted.clear();
            for _ in 0..quiet {
                c.allocate(1, SimTime(99), false);
            }
            assert!(c.events.is_empty() && c.evicted.is_empty(), "case {case}: {quiet} quiet blocks told of one");
        }
        assert!(quiet_cases > 100, "only {quiet_cases} cases had quiet blocks");
    }

    #[test]
    fn a_hit_weighed_without_taking_it_fits_exactly_when_it_would_taken_at_once() {
        // Random caches (with and without a TTL; partly referenced, partly
        // evictable, some leaves expired), random sequences looked up in
        // them: n blocks fit with the hit weighed exactly when they fit with
        // the hit taken — and weighing it changes nothing.
        let mut next = crate::rng::lcg_below(0x9e37_79b9_7f4a_7c15_u64);
        let (mut fits, mut not) = (0, 0);
        for case in 0..300u64 {
            let ttl = SimDuration(if case % 2 == 0 { 0 } else { 10 });
            let mut c = PrefixCache::new(60, true, ttl);
            let mut seqs: Vec<Vec<u64>> = Vec::new();
            let mut paths = Vec::new();
            for i in 0..1 + next(6) {
                let h = random_seq(&mut next, &seqs, 8, 1000 * (case + 1) + 100 * i);
                let new = h.len() as u64 - c.lookup(&hs(&h), h.len() as u64).blocks();
                if !c.can_allocate(new, SimTime(0), true) {
                    break;
                }
                c.allocate(h.len() as u64, SimTime(0), true);
                paths.push(ext(&mut c, Path::NONE, &h, 0, SimTime(0)));
                seqs.push(h);
            }
            // Release some, at times on either side of the TTL.
            for (t, p) in paths.iter_mut().enumerate() {
                if next(3) > 0 {
                    c.release(std::mem::replace(p, Path::NONE), SimTime(t as u64 * 4));
                }
            }
            let now = SimTime(15);
            for _ in 0..20 {
                let base = &seqs[next(seqs.len() as u64) as usize];
                let mut h = base[..1 + next(base.len() as u64) as usize].to_vec();
                h.extend((0..next(3)).map(|k| 7 + k));
                let hit = c.lookup(&hs(&h), h.len() as u64);
                // Around the boundary: what is free, and some of the evictable.
                let n = c.free() + next(c.evictable() + 2);
                for ignore_ttl in [false, true] {
                    let before = (c.free(), c.evictable(), c.changes, c.epoch);
                    let weighed = c.can_allocate_with(hit, n, now, ignore_ttl);
                    assert_eq!(before, (c.free(), c.evictable(), c.changes, c.epoch), "weighing changes nothing");
                    let mut taken = c.clone();
                    taken.acquire(hit, now);
                    assert_eq!(weighed, taken.can_allocate(n, now, ignore_ttl), "case {case}, {n} blocks, {hit:?}");
                    if weighed { fits += 1 } else { not += 1 }
                }
            }
        }
        assert!(fits > 2000 && not > 2000, "{fits} fit, {not} do not");
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "a hit is taken from the cache it was found on")]
    fn a_hit_found_before_the_cache_changed_is_refused() {
        let mut c = PrefixCache::new(8, true, SimDuration::ZERO);
        c.allocate(2, SimTime(0), false);
        let p = ext(&mut c, Path::NONE, &[1, 2], 0, SimTime(0));
        c.release(p, SimTime(1));
        let hit = c.lookup(&hs(&[1, 2]), 2);
        c.allocate(1, SimTime(2), false);
        ext(&mut c, Path::NONE, &[3], 0, SimTime(2));
        c.acquire(hit, SimTime(3));
    }

    #[test]
    fn disabled_caching_never_matches() {
        let mut c = PrefixCache::new(2, false, SimDuration::ZERO);
        c.allocate(1, SimTime(0), false);
        assert_eq!(ext(&mut c, Path::NONE, &[1], 0, SimTime(0)), Path::NONE);
        assert_eq!(look(&c, &[1]), 0);
        c.free_private(1);
        assert_eq!(c.used(), 0);
    }
}
