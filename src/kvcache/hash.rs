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
    let b = u64::from(block_size);
    let mut h = 0x6f70_616c_6b76_6331_u64; // chain root ("opalkvc1")
    let mut filled = 0u64; // tokens in the current block so far
    for seg in content {
        let mut offset = 0u64;
        let len = u64::from(seg.tokens);
        while offset < len {
            if out.len() >= max_blocks {
                return;
            }
            let take = (b - filled).min(len - offset);
            // One mixing step per run of content in the block.
            h = mix(h, seg.id ^ offset.wrapping_mul(0xd6e8_feb8_6659_fd93) ^ take.wrapping_mul(0xa076_1d64_78bd_642f));
            filled += take;
            offset += take;
            if filled == b {
                out.push(BlockHash(h));
                filled = 0;
            }
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
    fn namespaces_separate_content_ids() {
        assert_ne!(content_id("trace", 5), content_id("prefix", 5));
        assert_eq!(content_id("trace", 5), content_id("trace", 5));
    }
}
