//! The per-run seed tree: independent, named random streams.
//!
//! Every random decision in a run draws from a stream named after the
//! component that makes it (`workload`, `router`, …). A stream is a
//! [`ChaCha12Rng`] seeded with the run seed and selecting the ChaCha *stream
//! number* [`stream_id`]`(name)`, so streams never overlap and adding a draw to
//! one component never shifts another's sequence (changing a router parameter
//! never changes the request stream).
//!
//! The derivation is part of the output contract and must stay stable across
//! versions: `stream_id` is 64-bit FNV-1a over the UTF-8 bytes of the name.

use rand_chacha::ChaCha12Rng;
use rand_chacha::rand_core::SeedableRng;

/// The random-number generator used for every stream.
pub type StreamRng = ChaCha12Rng;

/// Derives the random streams of one run from its seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeedTree {
    seed: u64,
}

impl SeedTree {
    /// The seed tree of a run with this seed.
    pub fn new(seed: u64) -> SeedTree {
        SeedTree { seed }
    }

    /// The run seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The stream called `name`; the same name always gives the same sequence.
    pub fn stream(&self, name: &str) -> StreamRng {
        let mut rng = ChaCha12Rng::seed_from_u64(self.seed);
        rng.set_stream(stream_id(name));
        rng
    }
}

/// 64-bit FNV-1a of `name`: the ChaCha stream number of a named stream.
pub fn stream_id(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// For tests: numbers below `n` from a small deterministic generator
/// (Knuth's MMIX linear congruential one, the high bits) started at `seed`:
/// the same sequence on every machine, for randomised differential tests.
#[cfg(test)]
pub(crate) fn lcg_below(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut x = seed;
    move |n| {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) % n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngExt;

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        // Reference values of 64-bit FNV-1a (Fowler/Noll/Vo test suite).
        assert_eq!(stream_id(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(stream_id("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(stream_id("foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn same_name_same_sequence_different_names_differ() {
        let tree = SeedTree::new(7);
        let a: Vec<u64> = (0..4).map(|_| 0).scan(tree.stream("workload"), |r, _| Some(r.random())).collect();
        let b: Vec<u64> = (0..4).map(|_| 0).scan(tree.stream("workload"), |r, _| Some(r.random())).collect();
        let c: Vec<u64> = (0..4).map(|_| 0).scan(tree.stream("router"), |r, _| Some(r.random())).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let other_seed: u64 = SeedTree::new(8).stream("workload").random();
        assert_ne!(a[0], other_seed);
    }
}
