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
    /// Segments in order.
    pub segments: Vec<Segment>,
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
pub fn block_hashes<'a>(
    content: impl IntoIterator<Item = &'a Segment>,
    block_size: u32,
    max_blocks: usize,
    out: &mut Vec<BlockHash>,
) {
    chain(CHAIN_ROOT, 0, content, u64::from(block_size), max_blocks, out);
}

/// The chain's starting value ("opalkvc1").
const CHAIN_ROOT: u64 = 0x6f70_616c_6b76_6331;

/// The hashing loop of [`block_hashes`], started with chain value `h` at
/// token `skip` of the first segment (a block boundary).
fn chain<'a>(
    mut h: u64,
    skip: u64,
    content: impl IntoIterator<Item = &'a Segment>,
    b: u64,
    max_blocks: usize,
    out: &mut Vec<BlockHash>,
) {
    // Each piece of a segment that falls in one block is mixed into the
    // chain as (segment id, offset in the segment, length); a block's hash
    // is the chain after its last piece.
    let mut filled = 0u64; // tokens in the current block so far
    let mut skip = skip;
    for seg in content {
        let len = u64::from(seg.tokens);
        let mut offset = std::mem::take(&mut skip);
        if filled > 0 && len > 0 {
            // Complete the block an earlier segment began.
            if out.len() >= max_blocks {
                return;
            }
            let take = (b - filled).min(len);
            h = piece(h, seg.id, 0, take);
            filled += take;
            offset = take;
            if filled == b {
                out.push(BlockHash(h));
                filled = 0;
            }
        }
        // Whole blocks inside the segment, in one tight loop.
        let whole = (((len - offset) / b) as usize).min(max_blocks.saturating_sub(out.len()));
        out.extend((0..whole as u64).map(|k| {
            h = piece(h, seg.id, offset + k * b, b);
            BlockHash(h)
        }));
        offset += whole as u64 * b;
        if offset < len {
            // The start of a block the next segment completes.
            if out.len() >= max_blocks {
                return;
            }
            let take = len - offset;
            h = piece(h, seg.id, offset, take);
            filled += take;
        }
    }
}

/// One piece of a segment inside one block, mixed into the chain.
fn piece(h: u64, id: u64, offset: u64, take: u64) -> u64 {
    mix(h, id ^ offset.wrapping_mul(0xd6e8_feb8_6659_fd93) ^ take.wrapping_mul(0xa076_1d64_78bd_642f))
}

/// The key of the exact token run `[0, n)` of `content` when `n` ends
/// inside a block (`n % block_size != 0`): the chain after the pieces of
/// the block `n` falls in, up to token `n`, from the hash of the last full
/// block before it (`blocks`, the content's full-block hashes). Equal only
/// for equal runs of equal length — LMCache's key of a last, partial chunk
/// (the hash of its exact tokens in their prefix). `None` when `n` is a
/// block boundary (the block's own hash is the key).
pub fn exact_key<'a>(
    content: impl IntoIterator<Item = &'a Segment>,
    n: u64,
    block_size: u64,
    blocks: &[BlockHash],
) -> Option<BlockHash> {
    if n.is_multiple_of(block_size) {
        return None;
    }
    let k = n / block_size;
    let start = k * block_size;
    let mut h = if k == 0 { CHAIN_ROOT } else { blocks[k as usize - 1].0 };
    let mut pos = 0u64;
    for seg in content {
        let end = pos + u64::from(seg.tokens);
        if end > start && pos < n {
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

/// [`block_hashes`] with a memory: the hashes of the blocks inside the
/// leading segment it last saw. A block inside a content's first segment
/// hashes the same whatever follows, so requests that open with the same
/// segment — a shared system prompt, the original Opal's single sequence,
/// a trace's first hash id — copy those hashes instead of recomputing them
/// (for long shared prompts, most of the work). It holds at most one
/// segment's blocks.
#[derive(Debug, Default)]
pub struct BlockHasher {
    /// (segment id, block size) the memory is for.
    key: Option<(u64, u64)>,
    blocks: Vec<BlockHash>,
}

impl BlockHasher {
    /// Appends to `out` the hashes of every full block of `content`, exactly
    /// as [`block_hashes`] does.
    pub fn hash(&mut self, content: &[Segment], tail: Option<&Segment>, block_size: u32, out: &mut Vec<BlockHash>) {
        let b = u64::from(block_size);
        let segments = content.iter().chain(tail);
        let Some(first) = content.first().or(tail) else { return };
        let inside = (u64::from(first.tokens) / b) as usize;
        if self.key != Some((first.id, b)) {
            self.key = Some((first.id, b));
            self.blocks.clear();
        }
        let known = inside.min(self.blocks.len());
        let start = out.len();
        out.extend_from_slice(&self.blocks[..known]);
        let h = if known == 0 { CHAIN_ROOT } else { self.blocks[known - 1].0 };
        chain(h, known as u64 * b, segments, b, usize::MAX, out);
        if inside > known {
            self.blocks.extend_from_slice(&out[start + known..start + inside]);
        }
    }
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

    /// Block hashes token piece by token piece, the plain way: the tight
    /// loop of [`block_hashes`] must give exactly these.
    fn piecewise(segs: &[Segment], b: u64, max_blocks: usize) -> Vec<BlockHash> {
        let mut out = Vec::new();
        let mut h = 0x6f70_616c_6b76_6331_u64;
        let mut filled = 0u64;
        for seg in segs {
            let mut offset = 0u64;
            let len = u64::from(seg.tokens);
            while offset < len {
                if out.len() >= max_blocks {
                    return out;
                }
                let take = (b - filled).min(len - offset);
                h = mix(
                    h,
                    seg.id ^ offset.wrapping_mul(0xd6e8_feb8_6659_fd93) ^ take.wrapping_mul(0xa076_1d64_78bd_642f),
                );
                filled += take;
                offset += take;
                if filled == b {
                    out.push(BlockHash(h));
                    filled = 0;
                }
            }
        }
        out
    }

    #[test]
    fn the_tight_loop_gives_the_piecewise_hashes() {
        let mut state = 12345u64;
        let mut next = |m: u64| {
            state = mix(state, 1);
            state % m
        };
        for case in 0..500 {
            let segs: Vec<Segment> =
                (0..1 + next(6)).map(|i| Segment { id: 1000 * case + i, tokens: next(100) as u32 }).collect();
            let b = [1, 3, 16, 32][next(4) as usize];
            let max = if next(3) == 0 { next(20) as usize } else { usize::MAX };
            let mut got = Vec::new();
            block_hashes(&segs, b as u32, max, &mut got);
            assert_eq!(got, piecewise(&segs, b, max), "{segs:?} block {b} max {max}");
        }
    }

    #[test]
    fn the_hasher_with_memory_gives_the_plain_hashes_request_after_request() {
        let mut state = 777u64;
        let mut next = |m: u64| {
            state = mix(state, 2);
            state % m
        };
        let mut hasher = BlockHasher::default();
        let mut copied = 0;
        for case in 0..2000u64 {
            // Leading segments drawn from three ids, so the memory is hit, extended and replaced.
            let mut segs = vec![Segment { id: next(3), tokens: next(200) as u32 }];
            segs.extend((0..next(3)).map(|i| Segment { id: 100 + 10 * case + i, tokens: next(60) as u32 }));
            let tail = Segment { id: 5_000 + case, tokens: next(40) as u32 };
            let b = [1, 16, 32][next(3) as usize];
            let mut plain = Vec::new();
            block_hashes(segs.iter().chain([&tail]), b, usize::MAX, &mut plain);
            let mut got = vec![BlockHash(42)]; // appends after what is there
            let known = hasher.blocks.len().min((segs[0].tokens / b) as usize);
            if hasher.key == Some((segs[0].id, u64::from(b))) {
                copied += known;
            }
            hasher.hash(&segs, Some(&tail), b, &mut got);
            assert_eq!(got[1..], plain[..], "case {case}: {segs:?} + {tail:?}, block {b}");
        }
        assert!(copied > 1_000, "the memory was used ({copied} blocks copied)");
        // Empty content: only the tail.
        let mut got = Vec::new();
        hasher.hash(&[], Some(&Segment { id: 9, tokens: 40 }), 16, &mut got);
        assert_eq!(got, hashes(&[(9, 40)], 16));
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
            let mut blocks = Vec::new();
            block_hashes(segs, 16, usize::MAX, &mut blocks);
            exact_key(segs, n, 16, &blocks)
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
