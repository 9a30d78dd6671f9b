//! Power of two choices: draw two distinct workers at random, send the
//! request to the one with fewer outstanding requests (the first drawn on a tie).

use super::{Needs, Policy, RouteContext};
use crate::ids::WorkerId;
use crate::rng::StreamRng;
use rand::RngExt;

/// The less loaded of two random workers.
#[derive(Clone, Copy, Debug, Default)]
pub struct PowerOfTwo;

impl Policy for PowerOfTwo {
    const NEEDS: Needs = Needs { loads: true, kv_index: false, load_reports: false, tier_weights: false };

    fn choose(&mut self, ctx: &RouteContext<'_>, rng: &mut StreamRng) -> WorkerId {
        let n = ctx.workers.len();
        if n == 1 {
            return ctx.workers[0].id;
        }
        let a = rng.random_range(0..n);
        let b = (a + rng.random_range(1..n)) % n;
        let (wa, wb) = (&ctx.workers[a], &ctx.workers[b]);
        if wb.rank() < wa.rank() { wb.id } else { wa.id }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ctx, loads};
    use super::*;
    use crate::rng::SeedTree;

    #[test]
    fn never_picks_the_busiest_of_three_and_draws_distinct_pairs() {
        let mut rng = SeedTree::new(3).stream("router");
        let w = loads(&[5, 1, 9]);
        let picks: Vec<u32> = (0..300).map(|_| PowerOfTwo.choose(&ctx(&w, &[], 0), &mut rng).0).collect();
        assert!(!picks.contains(&2), "worker 2 loses every pair it is in");
        // Pairs {0,1} and {1,2} give 1, pair {0,2} gives 0: about 2/3 of picks are worker 1.
        let ones = picks.iter().filter(|&&x| x == 1).count();
        assert!((160..240).contains(&ones), "{ones}");
    }
}
