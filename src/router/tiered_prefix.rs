//! TieredPrefix: MaxPrefix with each matched chunk weighted by the fastest
//! tier holding it on the worker (`router.router_params.tier_weights`; by
//! default GPU 1, CPU memory 0.8, local NVMe 0.5, distributed FS 0.3), so a
//! prefix resident in HBM beats the same prefix on the shared file system.

use super::{Needs, Policy, RouteContext, best_with_random_ties};
use crate::ids::WorkerId;
use crate::rng::StreamRng;

/// Highest tier-weighted prefix, random among ties.
#[derive(Clone, Copy, Debug, Default)]
pub struct TieredPrefix;

impl Policy for TieredPrefix {
    const NEEDS: Needs = Needs { loads: false, kv_index: true, load_reports: false, tier_weights: true };

    fn choose(&mut self, ctx: &RouteContext<'_>, rng: &mut StreamRng) -> WorkerId {
        best_with_random_ties(ctx.workers, |i| ctx.prefix.get(i).map_or(0.0, |m| m.weighted), rng)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Match, ctx, loads};
    use super::*;
    use crate::rng::SeedTree;

    #[test]
    fn a_shorter_prefix_in_a_faster_tier_can_win() {
        let mut rng = SeedTree::new(1).stream("router");
        let w = loads(&[0, 0]);
        // Worker 0: 4 chunks on the DFS (4 × 0.3 = 1.2); worker 1: 2 chunks in GPU (2 × 1 = 2).
        let prefix = [Match { chunks: 4, weighted: 1.2 }, Match { chunks: 2, weighted: 2.0 }];
        assert_eq!(TieredPrefix.choose(&ctx(&w, &prefix, 4), &mut rng), WorkerId(1));
    }
}
