//! Round robin: the first request goes to the first worker, then each next one.

use super::{Needs, Policy, RouteContext};
use crate::ids::WorkerId;
use crate::rng::StreamRng;

/// Cycles through the workers in creation order; workers added later join at the end.
#[derive(Clone, Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl Policy for RoundRobin {
    const NEEDS: Needs = Needs { loads: false, kv_index: false, load_reports: false, tier_weights: false };

    fn choose(&mut self, ctx: &RouteContext<'_>, _rng: &mut StreamRng) -> WorkerId {
        let i = self.next % ctx.workers.len();
        self.next = i + 1;
        ctx.workers[i].id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SeedTree;

    #[test]
    fn cycles_from_the_first_worker_and_picks_up_new_ones() {
        let mut rng = SeedTree::new(1).stream("router");
        let mut p = RoundRobin::default();
        let three = super::super::loads(&[9, 0, 0]);
        let picks: Vec<u32> = (0..4).map(|_| p.choose(&super::super::ctx(&three, &[], 0), &mut rng).0).collect();
        assert_eq!(picks, vec![0, 1, 2, 0]);
        let four = super::super::loads(&[0, 0, 0, 0]);
        let picks: Vec<u32> = (0..4).map(|_| p.choose(&super::super::ctx(&four, &[], 0), &mut rng).0).collect();
        assert_eq!(picks, vec![1, 2, 3, 0]);
    }
}
