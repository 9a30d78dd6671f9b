//! MaxPrefix (Opal's default): the worker whose cache, per the router's KV
//! index, holds the longest prefix of the request (as a fraction of its
//! chunks); ties at random; when nobody holds any of it, a random worker.
//! In a fleet of worker groups (unequal workers) ties and misses go to the
//! least loaded relative to capacity instead: a random pick would load a
//! slow worker as much as a fast one.

use super::{LoadScale, Needs, Policy, RouteContext, best_then_least_loaded, best_with_random_ties};
use crate::ids::WorkerId;
use crate::rng::StreamRng;

/// Longest cached prefix, random among ties.
#[derive(Clone, Copy, Debug, Default)]
pub struct MaxPrefix;

impl Policy for MaxPrefix {
    const NEEDS: Needs = Needs { loads: false, kv_index: true, load_reports: false, tier_weights: false };

    fn choose(&mut self, ctx: &RouteContext<'_>, rng: &mut StreamRng) -> WorkerId {
        // The chunks held order (and tie) workers as their fractions of the
        // request's do: one denominator, and counts below 2³² stay apart in f64.
        let held = |i: usize| if ctx.chunks == 0 { 0 } else { ctx.prefix.get(i).map_or(0, |m| m.chunks) };
        if ctx.workers.first().is_some_and(|w| w.scale != LoadScale::EQUAL) {
            return best_then_least_loaded(ctx.workers, held);
        }
        best_with_random_ties(ctx.workers, held, rng)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Match, ctx, loads};
    use super::*;
    use crate::rng::SeedTree;

    fn m(chunks: u32) -> Match {
        Match { chunks, weighted: f64::from(chunks) }
    }

    #[test]
    fn picks_the_longest_prefix() {
        let mut rng = SeedTree::new(1).stream("router");
        let w = loads(&[0, 0, 9]);
        assert_eq!(MaxPrefix.choose(&ctx(&w, &[m(1), m(3), m(2)], 4), &mut rng), WorkerId(1));
    }

    #[test]
    fn ties_and_misses_are_broken_by_the_router_stream() {
        let w = loads(&[0; 4]);
        let picks = |seed: u64, prefix: &[Match]| {
            let mut rng = SeedTree::new(seed).stream("router");
            (0..200).map(|_| MaxPrefix.choose(&ctx(&w, prefix, 4), &mut rng).0).collect::<Vec<_>>()
        };
        // Workers 1 and 3 tie: only they are chosen, both of them, the same way per seed.
        let tie = [m(0), m(2), m(1), m(2)];
        let a = picks(7, &tie);
        assert!(a.iter().all(|&x| x == 1 || x == 3) && a.contains(&1) && a.contains(&3));
        assert_eq!(a, picks(7, &tie));
        assert_ne!(a, picks(8, &tie));
        // Nobody holds anything: every worker can be chosen.
        let none = picks(7, &[]);
        assert!((0..4).all(|w| none.contains(&w)));
    }

    #[test]
    fn with_unequal_workers_ties_and_misses_go_to_the_least_loaded_for_its_capacity() {
        let mut rng = SeedTree::new(1).stream("router");
        // Worker 0 three times as slow as 1 and 3 (weight 3,072 against 1,024), 2 as fast.
        let mut w = loads(&[1, 2, 4, 3]);
        for (l, weight) in w.iter_mut().zip([3072, 1024, 1024, 1024]) {
            l.scale = LoadScale { weight, slots: 256 };
        }
        // Nobody holds anything: ranks 3,072, 2,048, 4,096, 3,072 → worker 1.
        assert_eq!(MaxPrefix.choose(&ctx(&w, &[], 4), &mut rng), WorkerId(1));
        // 0 and 3 tie on the prefix, at equal ranks: the lower id.
        let tie = [m(2), m(1), m(0), m(2)];
        assert_eq!(MaxPrefix.choose(&ctx(&w, &tie, 4), &mut rng), WorkerId(0));
        // 1 and 2 tie: 2 holds twice 1's requests.
        assert_eq!(MaxPrefix.choose(&ctx(&w, &[m(0), m(3), m(3), m(1)], 4), &mut rng), WorkerId(1));
        // The longest prefix still wins, however loaded.
        assert_eq!(MaxPrefix.choose(&ctx(&w, &[m(0), m(1), m(4), m(1)], 4), &mut rng), WorkerId(2));
    }
}
