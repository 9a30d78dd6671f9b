//! Balanced (Opal left it unimplemented): cache affinity traded against load.
//!
//! Two parts, after SGLang's cache-aware router and Dynamo's KV router:
//!
//! 1. **Imbalance fallback.** With `o` the router's outstanding counts, if
//!    `max(o) − min(o) > abs_threshold` and `max(o) > rel_threshold · min(o)`,
//!    the request goes to the least loaded worker (lowest id on ties) —
//!    affinity must not pile work onto one worker.
//! 2. **Score.** Otherwise each worker scores
//!    `prefix_weight · p_w − load_weight · (o_w / max(1, max(o)) + u_w)`,
//!    where `p_w` is the fraction of the request's chunks cached there (per
//!    the KV index) and `u_w` its GPU KV usage from its last system event; the
//!    best score wins, ties at random.
//!
//! Defaults: `prefix_weight` 1, `load_weight` 0.5, `abs_threshold` 32,
//! `rel_threshold` 1.5 — a worker with the whole prefix cached is preferred
//! to an idle one until it has about twice the others' queue.

use super::{Needs, Policy, RouteContext, best_with_random_ties};
use crate::ids::WorkerId;
use crate::rng::StreamRng;

/// Balanced's weights and thresholds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BalancedParams {
    /// Weight of the cached-prefix fraction.
    pub prefix_weight: f64,
    /// Weight of the load term.
    pub load_weight: f64,
    /// Absolute outstanding-request gap that triggers the fallback.
    pub abs_threshold: f64,
    /// Relative gap (max > rel · min) that must also hold.
    pub rel_threshold: f64,
}

impl Default for BalancedParams {
    fn default() -> Self {
        BalancedParams { prefix_weight: 1.0, load_weight: 0.5, abs_threshold: 32.0, rel_threshold: 1.5 }
    }
}

/// Prefix affinity minus load, with an imbalance fallback.
#[derive(Clone, Copy, Debug, Default)]
pub struct Balanced {
    /// Weights and thresholds.
    pub params: BalancedParams,
}

impl Policy for Balanced {
    const NEEDS: Needs = Needs { loads: true, kv_index: true, load_reports: true, tier_weights: false };

    fn choose(&mut self, ctx: &RouteContext<'_>, rng: &mut StreamRng) -> WorkerId {
        let p = &self.params;
        // Loads in requests of the most capable workers (outstanding requests with equal workers).
        let unit = ctx.workers.iter().map(|w| w.scale.weight).min().unwrap_or(1).max(1) as f64;
        let load = |w: &super::WorkerLoad| w.load() as f64 / unit;
        let max = ctx.workers.iter().map(load).fold(0.0, f64::max);
        let min = ctx.workers.iter().map(load).fold(f64::INFINITY, f64::min).min(max);
        if max - min > p.abs_threshold && max > p.rel_threshold * min {
            return ctx.fewest.expect("the router keeps the least loaded for a policy that reads loads");
        }
        let norm = max.max(1.0);
        best_with_random_ties(
            ctx.workers,
            |i| {
                let w = &ctx.workers[i];
                p.prefix_weight * ctx.prefix_fraction(i) - p.load_weight * (load(w) / norm + w.system.kv_usage)
            },
            rng,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Match, ctx, loads};
    use super::*;
    use crate::rng::SeedTree;

    fn m(chunks: u32) -> Match {
        Match { chunks, weighted: 0.0 }
    }

    #[test]
    fn prefers_the_cached_worker_until_its_queue_is_much_longer() {
        let mut rng = SeedTree::new(1).stream("router");
        let mut b = Balanced::default();
        // Worker 0 holds all 4 chunks with 10 outstanding, worker 1 nothing with 2:
        // scores 1 − 0.5·(10/10) = 0.5 and 0 − 0.5·(2/10) = −0.1 → worker 0.
        let w = loads(&[10, 2]);
        assert_eq!(b.choose(&ctx(&w, &[m(4), m(0)], 4), &mut rng), WorkerId(0));
        // Gap 40 > 32 and 42 > 1.5 · 2: the fallback sends it to worker 1.
        let w = loads(&[42, 2]);
        assert_eq!(b.choose(&ctx(&w, &[m(4), m(0)], 4), &mut rng), WorkerId(1));
        // A large gap that is small relative to the load (100 vs 70) keeps affinity.
        let w = loads(&[100, 70]);
        assert_eq!(b.choose(&ctx(&w, &[m(4), m(0)], 4), &mut rng), WorkerId(0));
    }

    #[test]
    fn reported_kv_usage_counts_as_load() {
        let mut rng = SeedTree::new(1).stream("router");
        let mut b = Balanced::default();
        let mut w = loads(&[1, 1]);
        w[0].system.kv_usage = 0.9;
        // No prefix anywhere: worker 1 (usage 0) scores −0.25, worker 0 −0.7.
        assert_eq!(b.choose(&ctx(&w, &[], 0), &mut rng), WorkerId(1));
    }
}
