//! Random: each request to a worker chosen uniformly from the `router` stream.

use super::{Needs, Policy, RouteContext};
use crate::ids::WorkerId;
use crate::rng::StreamRng;
use rand::RngExt;

/// Uniform random choice.
#[derive(Clone, Copy, Debug, Default)]
pub struct Random;

impl Policy for Random {
    const NEEDS: Needs = Needs { loads: false, kv_index: false, load_reports: false, tier_weights: false };

    fn choose(&mut self, ctx: &RouteContext<'_>, rng: &mut StreamRng) -> WorkerId {
        ctx.workers[rng.random_range(0..ctx.workers.len())].id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SeedTree;

    #[test]
    fn spreads_evenly_and_repeats_with_the_same_seed() {
        let workers = super::super::loads(&[0; 4]);
        let draw = |seed| {
            let mut rng = SeedTree::new(seed).stream("router");
            (0..40_000)
                .map(|_| Random.choose(&super::super::ctx(&workers, &[], 0), &mut rng).index())
                .collect::<Vec<_>>()
        };
        let a = draw(5);
        assert_eq!(a, draw(5));
        assert_ne!(a, draw(6));
        let mut counts = [0u32; 4];
        a.iter().for_each(|&i| counts[i] += 1);
        // Each count is Binomial(40000, 1/4): sd ≈ 87, so ±500 is > 5 sd.
        assert!(counts.iter().all(|&c| (9_500..=10_500).contains(&c)), "{counts:?}");
    }
}
