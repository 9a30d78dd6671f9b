//! Least loaded: the worker with the fewest outstanding requests (routed and
//! not yet completed, as the router counts them); ties go to the lowest id.

use super::{Policy, WorkerLoad};
use crate::ids::WorkerId;
use crate::rng::StreamRng;

/// Fewest outstanding requests, lowest id on ties.
#[derive(Clone, Copy, Debug, Default)]
pub struct LeastLoaded;

impl Policy for LeastLoaded {
    fn choose(&mut self, workers: &[WorkerLoad], _rng: &mut StreamRng) -> WorkerId {
        workers.iter().min_by_key(|w| (w.outstanding, w.id)).expect("at least one worker").id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SeedTree;

    #[test]
    fn picks_fewest_outstanding_and_lowest_id_on_ties() {
        let mut rng = SeedTree::new(1).stream("router");
        assert_eq!(LeastLoaded.choose(&super::super::loads(&[3, 1, 2]), &mut rng), WorkerId(1));
        assert_eq!(LeastLoaded.choose(&super::super::loads(&[2, 1, 1]), &mut rng), WorkerId(1));
        assert_eq!(LeastLoaded.choose(&super::super::loads(&[0, 0]), &mut rng), WorkerId(0));
    }
}
