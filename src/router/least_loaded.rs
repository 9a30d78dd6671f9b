//! Least loaded: the worker with the fewest outstanding requests (routed and
//! not yet completed, as the router counts them); ties go to the lowest id.

use super::{Needs, Policy, RouteContext, WorkerLoad};
use crate::ids::WorkerId;
use crate::rng::StreamRng;

/// Fewest outstanding requests, lowest id on ties.
#[derive(Clone, Copy, Debug, Default)]
pub struct LeastLoaded;

impl Policy for LeastLoaded {
    const NEEDS: Needs = Needs { loads: true, kv_index: false, load_reports: false, tier_weights: false };

    fn choose(&mut self, ctx: &RouteContext<'_>, _rng: &mut StreamRng) -> WorkerId {
        ctx.fewest.expect("the router keeps the least loaded for a policy that reads loads")
    }
}

/// The worker with the fewest outstanding requests (lowest id on ties)
/// among `workers`, by a scan (what the tree must agree with).
#[cfg(test)]
pub(crate) fn fewest_by_scan(workers: &[WorkerLoad]) -> WorkerId {
    workers.iter().min_by_key(|w| (w.rank(), w.id)).expect("at least one worker").id
}

/// A tournament tree over the workers' outstanding counts: the least loaded
/// worker of any range of ids in O(log W), and O(log W) per change — so
/// routing by load does not scan 1,024 workers per request. Each place
/// holds its winner's key, `rank << INDEX_BITS | index` (see
/// [`WorkerLoad::rank`]), so a match is one integer comparison (least
/// loaded first, then the lowest index).
#[derive(Clone, Debug, Default)]
pub(crate) struct Fewest {
    /// Leaves from `size` on (a worker's key, or [`Self::NONE`] for none);
    /// each inner place the lesser of its two children's.
    tree: Vec<u64>,
    size: usize,
}

/// Bits of a key that hold the worker's index (more than a run's most
/// workers need: the configuration checks it); the rank above them is at
/// most [`super::MAX_RANK`] = 2⁴⁷.
pub(crate) const INDEX_BITS: u32 = 17;
const _: () = assert!(super::MAX_RANK <= 1 << (64 - INDEX_BITS));

impl Fewest {
    /// No worker: above every worker's key.
    const NONE: u64 = u64::MAX;

    fn key(loads: &[WorkerLoad], i: usize) -> u64 {
        loads[i].rank() << INDEX_BITS | i as u64
    }

    /// Worker `i`'s count changed (or it was added: `loads` holds it).
    pub(crate) fn update(&mut self, loads: &[WorkerLoad], i: usize) {
        if loads.len() > self.size {
            // Grow to the next power of two and rebuild (amortised O(1) per worker).
            self.size = loads.len().next_power_of_two();
            self.tree = vec![Self::NONE; 2 * self.size];
            for j in 0..loads.len() {
                self.tree[self.size + j] = Self::key(loads, j);
            }
            for n in (1..self.size).rev() {
                self.tree[n] = self.tree[2 * n].min(self.tree[2 * n + 1]);
            }
            return;
        }
        let mut n = self.size + i;
        self.tree[n] = Self::key(loads, i);
        while n > 1 {
            n /= 2;
            self.tree[n] = self.tree[2 * n].min(self.tree[2 * n + 1]);
        }
    }

    /// The least loaded worker with an index in `range` (non-empty).
    pub(crate) fn among(&self, loads: &[WorkerLoad], range: std::ops::Range<usize>) -> WorkerId {
        let (mut lo, mut hi) = (range.start + self.size, range.end + self.size);
        let mut best = Self::NONE;
        while lo < hi {
            if lo % 2 == 1 {
                best = best.min(self.tree[lo]);
                lo += 1;
            }
            if hi % 2 == 1 {
                hi -= 1;
                best = best.min(self.tree[hi]);
            }
            lo /= 2;
            hi /= 2;
        }
        assert_ne!(best, Self::NONE, "at least one worker");
        loads[(best & ((1 << INDEX_BITS) - 1)) as usize].id
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

    #[test]
    fn the_tree_finds_what_a_scan_finds_in_every_range_as_counts_change() {
        let mut loads = Vec::new();
        let mut tree = Fewest::default();
        let mut next = crate::rng::lcg_below(7u64);
        for step in 0..3_000 {
            if loads.len() < 37 && step % 50 == 0 {
                loads.push(super::super::loads(&[next(4) as u32]).remove(0));
                let i = loads.len() - 1;
                loads[i].id = WorkerId(i as u32);
                tree.update(&loads, i);
            } else {
                let i = next(loads.len() as u64) as usize;
                loads[i].outstanding = next(6) as u32;
                tree.update(&loads, i);
            }
            let a = next(loads.len() as u64) as usize;
            let b = a + 1 + next((loads.len() - a) as u64) as usize;
            assert_eq!(tree.among(&loads, a..b), fewest_by_scan(&loads[a..b]), "step {step}, {a}..{b}");
        }
    }
}
