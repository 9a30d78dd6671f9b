//! The request router (an llm-d / Dynamo-style gateway): picks a worker for
//! each request the moment it arrives.
//!
//! Policies follow the house pattern: the [`Policy`] trait is the contract,
//! [`RoutingPolicy`] the closed enum the router dispatches on, one file per
//! policy. Names are case-insensitive, as in Opal.

mod least_loaded;
mod random;
mod round_robin;

pub use least_loaded::LeastLoaded;
pub use random::Random;
pub use round_robin::RoundRobin;

use crate::ids::WorkerId;
use crate::rng::StreamRng;

/// What a policy may look at: the workers that accept requests, in creation order.
#[derive(Clone, Copy, Debug)]
pub struct WorkerLoad {
    /// The worker.
    pub id: WorkerId,
    /// Requests routed to it that have not completed.
    pub outstanding: u32,
}

/// A routing policy.
pub trait Policy {
    /// Chooses one of `workers` (never empty). Random choices draw from `rng`
    /// (the run's `router` stream).
    fn choose(&mut self, workers: &[WorkerLoad], rng: &mut StreamRng) -> WorkerId;
}

/// Which policy a scenario uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    /// Cycle through the workers.
    RoundRobin,
    /// Uniformly at random.
    Random,
    /// Fewest outstanding requests; ties to the lowest id.
    LeastLoaded,
}

impl PolicyKind {
    /// Every policy name, as written in configs.
    pub const NAMES: &'static [&'static str] = &["RoundRobin", "Random", "LeastLoaded"];

    /// Whether the policy reads the KV index (so workers must publish KV events).
    pub fn reads_kv_events(self) -> bool {
        match self {
            PolicyKind::RoundRobin | PolicyKind::Random | PolicyKind::LeastLoaded => false,
        }
    }

    /// Parses a policy name, case-insensitively.
    pub fn from_name(name: &str) -> Option<PolicyKind> {
        Some(match name.to_ascii_lowercase().as_str() {
            "roundrobin" => PolicyKind::RoundRobin,
            "random" => PolicyKind::Random,
            "leastloaded" => PolicyKind::LeastLoaded,
            _ => return None,
        })
    }
}

/// A policy instance with its state.
#[derive(Clone, Debug)]
pub enum RoutingPolicy {
    /// See [`RoundRobin`].
    RoundRobin(RoundRobin),
    /// See [`Random`].
    Random(Random),
    /// See [`LeastLoaded`].
    LeastLoaded(LeastLoaded),
}

impl RoutingPolicy {
    /// A fresh instance of `kind`.
    pub fn from_config(kind: PolicyKind) -> RoutingPolicy {
        match kind {
            PolicyKind::RoundRobin => RoutingPolicy::RoundRobin(RoundRobin::default()),
            PolicyKind::Random => RoutingPolicy::Random(Random),
            PolicyKind::LeastLoaded => RoutingPolicy::LeastLoaded(LeastLoaded),
        }
    }
}

impl Policy for RoutingPolicy {
    fn choose(&mut self, workers: &[WorkerLoad], rng: &mut StreamRng) -> WorkerId {
        match self {
            RoutingPolicy::RoundRobin(p) => p.choose(workers, rng),
            RoutingPolicy::Random(p) => p.choose(workers, rng),
            RoutingPolicy::LeastLoaded(p) => p.choose(workers, rng),
        }
    }
}

#[cfg(test)]
pub(crate) fn loads(outstanding: &[u32]) -> Vec<WorkerLoad> {
    outstanding.iter().enumerate().map(|(i, &o)| WorkerLoad { id: WorkerId(i as u32), outstanding: o }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_are_case_insensitive() {
        assert_eq!(PolicyKind::from_name("roundrobin"), Some(PolicyKind::RoundRobin));
        assert_eq!(PolicyKind::from_name("LEASTLOADED"), Some(PolicyKind::LeastLoaded));
        assert_eq!(PolicyKind::from_name("Random"), Some(PolicyKind::Random));
        assert_eq!(PolicyKind::from_name("Fastest"), None);
    }
}
