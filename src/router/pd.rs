//! The P/D decision: whether a request's prompt is prefilled on the
//! prefill pool or by its decode worker, as Dynamo's disaggregated router
//! decides it (`components/planner`/`disagg_router`: `prefill_remote =
//! prefill_length − prefix_hit_length > max_local_prefill_length and
//! queue_size < max_prefill_queue_size`): the prompt's part not cached on
//! the decode worker against `max_local_prefill_length`, and the prefill
//! queue — Dynamo's one work queue the whole prefill pool pulls from; here
//! the requests waiting on every prefill worker — against
//! `max_prefill_queue_size`.

/// The rule, resolved from `[disaggregation]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PdRule {
    /// Workers `0..prefill_workers` form the prefill pool; the rest decode.
    pub prefill_workers: usize,
    /// Prefill remotely only when more than this many prompt tokens are not cached on the decode worker.
    pub max_local_prefill_length: u64,
    /// Prefill locally when the prefill pool has this many requests waiting (`None`: never for this reason).
    pub max_prefill_queue_size: Option<u64>,
}

impl PdRule {
    /// Whether a prompt with `uncached` tokens not cached on its decode
    /// worker goes to the prefill pool, whose queue holds `prefill_queue` requests.
    pub fn remote(&self, uncached: u64, prefill_queue: usize) -> bool {
        let queue_ok = self.max_prefill_queue_size.is_none_or(|q| (prefill_queue as u64) < q);
        uncached > self.max_local_prefill_length && queue_ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: PdRule = PdRule { prefill_workers: 2, max_local_prefill_length: 1000, max_prefill_queue_size: Some(4) };

    #[test]
    fn a_prompt_goes_remote_only_beyond_the_local_length_and_below_the_queue_limit() {
        assert!(!RULE.remote(1000, 0), "exactly the local length stays local");
        assert!(RULE.remote(1001, 0));
        assert!(RULE.remote(1001, 3), "3 queued < 4");
        assert!(!RULE.remote(1001, 4), "4 queued: the prefill queue is full");
        let unbounded = PdRule { max_prefill_queue_size: None, ..RULE };
        assert!(unbounded.remote(5000, 1_000_000));
        assert!(!unbounded.remote(0, 0));
    }
}
