//! Least loaded: the worker with the fewest outstanding requests (routed and
//! not yet completed, as the router counts them); ties go to the lowest id.

use super::{Needs, Policy, RouteContext};
use crate::ids::WorkerId;
use crate::rng::StreamRng;

/// Fewest outstanding requests, lowest id on ties.
#[derive(Clone, Copy, Debug, Default)]
pub struct LeastLoaded;

impl Policy for LeastLoaded {
    const NEEDS: Needs = Needs { loads: true, kv_index: false, load_reports: false };

    fn choose(&mut self, ctx: &RouteContext<'_>, _rng: &mut StreamRng) -> WorkerId {
        ctx.workers.iter().min_by_key(|w| (w.outstanding, w.id)).expect("at least one worker").id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SeedTree;

    #[test]
    fn picks_fewest_outstanding_and_lowest_id_on_ties() {
        let mut rng = SeedTree::new(1).stream("router");
        let pick = |o: &[u32], rng: &mut StreamRng| {
            LeastLoaded.choose(&super::super::ctx(&super::super::loads(o), &[], 0), rng)
        };
        assert_eq!(pick(&[3, 1, 2], &mut rng), WorkerId(1));
        assert_eq!(pick(&[2, 1, 1], &mut rng), WorkerId(1));
        assert_eq!(pick(&[0, 0], &mut rng), WorkerId(0));
    }
}
