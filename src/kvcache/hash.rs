//! Block hashing. A prompt (and the output that follows it) is a sequence of
//! content segments; token `i` of a segment is the same token wherever the
//! segment appears. Engine block `k` covers tokens `[k·B, (k+1)·B)` and its
//! hash chains the previous block's hash with the runs of segment content it
//! covers, so equal hashes mean equal prefixes, at any block size. No
//! per-token data is ever stored.

use std::hash::{Hash, Hasher};

/// A chained block hash: identifies a block's content and everything before it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlockHash(pub u64);

impl Hash for BlockHash {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0);
    }
}

impl nohash_hasher::IsEnabled for BlockHash {}

/// A run of content: `tokens` tokens of the content called `id`, from its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Segment {
    /// Content identity (see [`content_id`]).
    pub id: u64,
    /// Tokens.
    pub tokens: u32,
}

/// The token content of a sequence, as segments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Content {
    /// Segments in order (most prompts have one or two — a shared prefix
    /// and their own tokens — kept inline, without an allocation).
    pub segments: smallvec::SmallVec<[Segment; 2]>,
}

impl Content {
    /// Total tokens.
    pub fn tokens(&self) -> u64 {
        self.segments.iter().map(|s| u64::from(s.tokens)).sum()
    }

    /// A digest of the content (segment identities and lengths): equal
    /// prompts have equal digests (reported as `prompt_hash`).
    pub fn digest(&self) -> u64 {
        self.segments.iter().fold(0x9e37_79b9_7f4a_7c15, |h, s| mix(mix(h, s.id), u64::from(s.tokens)))
    }

    /// Appends a segment (empty ones are skipped).
    pub fn push(&mut self, id: u64, tokens: u32) {
        if tokens > 0 {
            self.segments.push(Segment { id, tokens });
        }
    }
}

/// SplitMix64's finalizer over `h` combined with `x`: a fast, well-mixed step.
fn mix(h: u64, x: u64) -> u64 {
    let mut z = h ^ x.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(31);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A content identity in namespace `ns` (e.g. "trace", "prefix", "output")
/// for key `key`: distinct namespaces never collide by construction of the
/// mix (up to 64-bit hash collisions).
pub fn content_id(ns: &str, key: u64) -> u64 {
    let ns_hash =
        ns.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
    mix(ns_hash, key)
}

/// Appends to `out` the hashes of the full blocks of `content` (blocks of
/// `block_size` tokens), at most `max_blocks` of them.
///
/// A block belongs to the segment its last token is in, and its hash is
/// position-addressed there: a hash of (chain, `k`) for absolute block index `k`,
/// where the segment's *chain* key mixes everything before the segment (the
/// ids and lengths of the segments before it) with its id. Token `i` of a
/// segment is the same token wherever the segment appears, so two contents
/// agree on blocks `0..=k` exactly when they agree on its tokens — the
/// prefix property, at any block size — and a block's hash is computed
/// from its chain in O(1), without the blocks before it. A stored prefix
/// inside one segment is then a run `[i, j)` of one chain.
pub fn block_hashes<'a>(
    content: impl IntoIterator<Item = &'a Segment>,
    block_size: u32,
    max_blocks: usize,
    out: &mut Vec<BlockHash>,
) {
    let mut spans = Vec::new();
    chains_of(content, block_size, &mut spans);
    let (mut k, mut left) = (0, max_blocks as u64);
    for s in spans {
        let end = s.end.min(k + left);
        out.extend((k..end).map(|k| ChunkKey::new(s.chain, k).hash()));
        left -= end - k;
        k = s.end;
    }
}

/// The chains the full blocks of `content` (blocks of `block_size` tokens)
/// lie on: `spans`, one per chain holding at least one of them, in order —
/// all a sequence's block hashes follow from them ([`block_hash`]), so
/// they are found in O(segments), whatever the number of blocks.
pub fn chains_of<'a>(
    content: impl IntoIterator<Item = &'a Segment>,
    block_size: u32,
    spans: &mut impl Extend<ChainSpan>,
) {
    let b = u64::from(block_size);
    let mut anchor = CHAIN_ROOT;
    let mut pos = 0u64;
    for seg in content.into_iter().filter(|s| s.tokens > 0) {
        let end = pos + u64::from(seg.tokens);
        let c = chain_key(anchor, seg.id);
        // Blocks k with (k + 1)·b in (pos, end].
        if end / b > pos / b {
            spans.extend([ChainSpan { chain: c, end: end / b }]);
        }
        anchor = next_anchor(c, seg.tokens);
        pos = end;
    }
}

/// The hash of block `k` of a sequence whose full blocks lie on `chains`.
pub fn block_hash(chains: &[ChainSpan], k: u64) -> BlockHash {
    ChunkKey::new(chains[chains.partition_point(|s| s.end <= k)].chain, k).hash()
}

/// The blocks of a sequence that lie on one chain: those before `end`
/// and at or after the previous span's end (0 for the first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainSpan {
    /// The chain key.
    pub chain: u64,
    /// One past its last block (absolute block index).
    pub end: u64,
}

/// A chunk as the tiers and the router's index know it: the chain of the
/// block that ends it and that block's index — the block whose hash names
/// the chunk and everything before it — or, for a partial chunk keyed by
/// its exact tokens ([`exact_key`]), that key. Consecutive chunks of one
/// chain differ only in `block`, so a stored prefix inside one chain is a
/// run of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkKey {
    /// Chain key (or the exact key of a partial chunk).
    pub chain: u64,
    /// Index of its last block ([`ChunkKey::EXACT`] for an exact key).
    pub block: u64,
    /// Its hash (see [`ChunkKey::hash`]), computed once.
    hash: BlockHash,
}

impl ChunkKey {
    /// `block` of a chunk keyed by its exact tokens.
    pub const EXACT: u64 = u64::MAX;

    /// The chunk ending with block `block` of chain `chain`.
    pub fn new(chain: u64, block: u64) -> ChunkKey {
        ChunkKey { chain, block, hash: mixed(chain ^ block.wrapping_mul(K1)) }
    }

    /// The key with these `chain` and `block` fields.
    pub fn from_parts(chain: u64, block: u64) -> ChunkKey {
        if block == Self::EXACT { Self::exact(BlockHash(chain)) } else { Self::new(chain, block) }
    }

    /// A partial chunk keyed by its exact tokens.
    pub fn exact(key: BlockHash) -> ChunkKey {
        ChunkKey { chain: key.0, block: Self::EXACT, hash: key }
    }

    /// The key as a hash: its last block's hash (what the GPU's events
    /// name the same chunk by), or the exact key.
    pub fn hash(self) -> BlockHash {
        self.hash
    }
}

/// The odd multiplier that spreads block indices over the chain key.
const K1: u64 = 0x9e37_79b9_7f4a_7c15;

/// `mixed(c ^ k·K1)` is the hash of block `k` on chain `c`: a bijection of
/// `k` for each chain (so the blocks of one segment never share a hash) and
/// of `c` for each `k` (so blocks at one position hash equal exactly when
/// their chains are equal — what lets the GPU cache compare chains instead
/// of hashes), multiplied and folded so that its low bits — where the hash
/// tables index — depend on every bit.
fn mixed(y: u64) -> BlockHash {
    let x = y.wrapping_mul(M);
    BlockHash(x ^ (x >> 29))
}

/// The odd multiplier of [`mixed`].
const M: u64 = 0xbf58_476d_1ce4_e5b9;

/// The starting value of every content's chain of segments ("opalkvc1").
const CHAIN_ROOT: u64 = 0x6f70_616c_6b76_6331;

/// The chain key of a segment with id `id` after the content `anchor`
/// stands for.
fn chain_key(anchor: u64, id: u64) -> u64 {
    mix(anchor, id)
}

/// What the content up to the end of a segment of `tokens` tokens on chain
/// `c` stands for (kept apart from the chain's block hashes by a tag).
fn next_anchor(c: u64, tokens: u32) -> u64 {
    mix(c ^ 0x616e_6368_6f72_2121, u64::from(tokens))
}

/// One piece of a segment inside one block, mixed into the chain.
fn piece(h: u64, id: u64, offset: u64, take: u64) -> u64 {
    mix(h, id ^ offset.wrapping_mul(0xd6e8_feb8_6659_fd93) ^ take.wrapping_mul(0xa076_1d64_78bd_642f))
}

/// The key of the exact token run `[0, n)` of `content` when `n` ends
/// inside a block (`n % block_size != 0`): the chain after the pieces of
/// the block `n` falls in, up to token `n`, from the hash of the last full
/// block before it (found from `chains`, those of the content's full
/// blocks). Equal only
/// for equal runs of equal length — LMCache's key of a last, partial chunk
/// (the hash of its exact tokens in their prefix). `None` when `n` is a
/// block boundary (the block's own hash is the key).
pub fn exact_key<'a>(
    content: impl IntoIterator<Item = &'a Segment>,
    n: u64,
    block_size: u64,
    chains: &[ChainSpan],
) -> Option<BlockHash> {
    if n.is_multiple_of(block_size) {
        return None;
    }
    let k = n / block_size;
    let start = k * block_size;
    let mut h = if k == 0 { CHAIN_ROOT } else { block_hash(chains, k - 1).0 };
    let mut pos = 0u64;
    for seg in content {
        let end = pos + u64::from(seg.tokens);
        if end > start.max(pos) && pos < n {
            let (from, to) = (start.max(pos) - pos, n.min(end) - pos);
            h = piece(h, seg.id, from, to - from);
        }
        pos = end;
        if pos >= n {
            break;
        }
    }
    // Marked, so that a run ending inside a block never takes a full block's key.
    Some(BlockHash(mix(h, 0x7061_7274_6961_6c21)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(segs: &[(u64, u32)], b: u32) -> Vec<BlockHash> {
        let segs: Vec<Segment> = segs.iter().map(|&(id, tokens)| Segment { id, tokens }).collect();
        let mut out = Vec::new();
        block_hashes(&segs, b, usize::MAX, &mut out);
        out
    }

    /// The tokens of `segs`, each as (segment id, offset in the segment).
    fn tokens(segs: &[Segment]) -> Vec<(u64, u32)> {
        segs.iter().flat_map(|s| (0..s.tokens).map(move |o| (s.id, o))).collect()
    }

    #[test]
    fn a_block_hash_gives_back_its_chain() {
        // `mixed` is a bijection, shown by its inverse: the odd multiplier's
        // inverse modulo 2⁶⁴ (five Newton steps `v ← v·(2 − M·v)`, each
        // doubling the correct low bits from the three an odd number starts
        // with), after `x ^ (x >> 29)` is undone by folding the shifted bits
        // back twice (29 · 3 > 64). So a block's hash names its chain at its
        // position, and equal hashes there mean equal chains.
        let m_inv = (0..5).fold(M, |v: u64, _| v.wrapping_mul(2u64.wrapping_sub(M.wrapping_mul(v))));
        assert_eq!(M.wrapping_mul(m_inv), 1);
        let unmixed = |h: BlockHash| (h.0 ^ (h.0 >> 29) ^ (h.0 >> 58)).wrapping_mul(m_inv);
        let mut x = 0x853c_49e6_748f_ea9b_u64;
        for _ in 0..10_000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let (chain, block) = (x.rotate_left(17), x >> 40);
            let key = ChunkKey::new(chain, block);
            assert_eq!(unmixed(key.hash()) ^ block.wrapping_mul(K1), key.chain);
        }
    }

    #[test]
    fn blocks_hash_equal_exactly_when_their_prefixes_hold_the_same_tokens() {
        // Contents from a few ids and short lengths, so that prefixes are
        // often shared, cut and resumed; checked against the tokens themselves.
        let mut state = 12345u64;
        let mut next = |m: u64| {
            state = mix(state, 1);
            state % m
        };
        let contents: Vec<Vec<Segment>> = (0..300)
            .map(|_| (0..1 + next(4)).map(|_| Segment { id: next(3), tokens: next(40) as u32 }).collect())
            .collect();
        for b in [1u32, 3, 16] {
            let hashed: Vec<_> = contents
                .iter()
                .map(|c| {
                    let mut h = Vec::new();
                    block_hashes(c, b, usize::MAX, &mut h);
                    (h, tokens(c))
                })
                .collect();
            let mut shared = 0;
            for (x, (hx, tx)) in hashed.iter().enumerate() {
                assert_eq!(hx.len(), tx.len() / b as usize, "full blocks only");
                let unique: std::collections::HashSet<_> = hx.iter().collect();
                assert_eq!(unique.len(), hx.len(), "the blocks of one content are distinct");
                for (hy, ty) in &hashed[..x] {
                    for k in 0..hx.len().min(hy.len()) {
                        let end = (k + 1) * b as usize;
                        let same = tx[..end] == ty[..end];
                        assert_eq!(hx[k] == hy[k], same, "block {k} of {b} tokens");
                        shared += usize::from(same);
                    }
                }
            }
            assert!(shared > 1_000, "the contents share prefixes ({shared} blocks)");
        }
    }

    #[test]
    fn a_chunk_key_names_its_last_block_by_the_blocks_hash() {
        let mut state = 99u64;
        let mut next = |m: u64| {
            state = mix(state, 3);
            state % m
        };
        for _ in 0..500 {
            let segs: Vec<Segment> =
                (0..1 + next(5)).map(|_| Segment { id: next(4), tokens: next(70) as u32 }).collect();
            let b = [1, 16, 32][next(3) as usize];
            let mut spans = Vec::new();
            chains_of(&segs, b, &mut spans);
            let mut blocks = Vec::new();
            block_hashes(&segs, b, usize::MAX, &mut blocks);
            assert_eq!(spans.last().map_or(0, |s| s.end), blocks.len() as u64);
            for (k, &h) in blocks.iter().enumerate() {
                let span = spans.iter().find(|s| s.end > k as u64).expect("every block is on a chain");
                assert_eq!(ChunkKey::new(span.chain, k as u64).hash(), h, "{segs:?} block {k}");
                assert_eq!(block_hash(&spans, k as u64), h);
            }
            // One span per chain: a span ends where the next segment's blocks start.
            assert!(spans.windows(2).all(|w| w[0].end < w[1].end && w[0].chain != w[1].chain));
        }
        assert_eq!(ChunkKey::exact(BlockHash(7)).hash(), BlockHash(7));
    }

    #[test]
    fn a_cap_keeps_the_leading_blocks() {
        let segs = [Segment { id: 4, tokens: 50 }, Segment { id: 5, tokens: 70 }];
        let mut all = Vec::new();
        block_hashes(&segs, 16, usize::MAX, &mut all);
        for max in 0..=all.len() + 1 {
            let mut got = vec![BlockHash(42)]; // appends after what is there
            block_hashes(&segs, 16, max, &mut got);
            assert_eq!(got[1..], all[..max.min(all.len())]);
        }
    }

    #[test]
    fn only_full_blocks_are_hashed() {
        assert_eq!(hashes(&[(1, 47)], 16).len(), 2);
        assert_eq!(hashes(&[(1, 48)], 16).len(), 3);
        assert_eq!(hashes(&[(1, 15)], 16).len(), 0);
        let mut capped = Vec::new();
        block_hashes(&[Segment { id: 1, tokens: 100 }], 16, 2, &mut capped);
        assert_eq!(capped.len(), 2);
    }

    #[test]
    fn shared_prefixes_share_hashes_and_diverge_after_the_first_different_block() {
        // Same 40-token prefix (content 7), then different content.
        let a = hashes(&[(7, 40), (100, 60)], 16);
        let b = hashes(&[(7, 40), (200, 60)], 16);
        // Blocks 0, 1 (tokens 0..32) are pure prefix; block 2 mixes prefix and suffix.
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        // Chaining: a later equal block after a difference still differs.
        let c = hashes(&[(8, 32), (9, 32)], 16);
        let d = hashes(&[(7, 32), (9, 32)], 16);
        assert_ne!(c[3], d[3]);
    }

    #[test]
    fn the_prefix_property_holds_at_any_block_size_for_trace_style_chunks() {
        // Two "trace" requests share chunk ids [10, 11] (512 tokens each), then differ.
        let a = [(10, 512), (11, 512), (12, 512)];
        let b = [(10, 512), (11, 512), (13, 600)];
        for bs in [16, 32, 48, 512] {
            let (ha, hb) = (hashes(&a, bs), hashes(&b, bs));
            let shared = 1024 / bs as usize; // full blocks inside the shared 1024 tokens
            assert_eq!(ha[..shared], hb[..shared], "block size {bs}");
            assert_ne!(ha[shared], hb[shared], "block size {bs}");
        }
    }

    #[test]
    fn an_exact_key_is_equal_only_for_the_same_tokens_to_the_same_length() {
        let a = [Segment { id: 1, tokens: 40 }];
        let b = [Segment { id: 1, tokens: 40 }, Segment { id: 2, tokens: 30 }];
        let c = [Segment { id: 3, tokens: 40 }];
        let key = |segs: &[Segment], n| {
            let mut chains = Vec::new();
            chains_of(segs, 16, &mut chains);
            exact_key(segs, n, 16, &chains)
        };
        // Tokens 0..40 of segment 1, whatever follows them.
        assert_eq!(key(&a, 40), key(&b, 40));
        assert!(key(&a, 40).is_some());
        assert_ne!(key(&a, 40), key(&a, 39), "one token shorter");
        assert_ne!(key(&a, 40), key(&c, 40), "other tokens");
        assert_ne!(key(&b, 50), key(&b, 40));
        assert_eq!(key(&a, 32), None, "a block boundary: the block's own hash is the key");
        // Never a full block's hash.
        let mut blocks = Vec::new();
        block_hashes(&b, 16, usize::MAX, &mut blocks);
        assert!(blocks.iter().all(|&h| Some(h) != key(&b, 40) && Some(h) != key(&b, 50)));
    }

    #[test]
    fn namespaces_separate_content_ids() {
        assert_ne!(content_id("trace", 5), content_id("prefix", 5));
        assert_eq!(content_id("trace", 5), content_id("trace", 5));
    }
}
