//! The request router (an llm-d / Dynamo-style gateway): picks a worker for
//! each request the moment it arrives.
//!
//! Policies follow the house pattern: the [`Policy`] trait is the contract,
//! [`RoutingPolicy`] the closed enum the router dispatches on, one file per
//! policy. Names are case-insensitive, as in Opal. KV-aware policies see the
//! router's [`KvIndex`], which workers feed with stored/removed events:
//! workers coalesce events for `kvcevent_coalesce_time`; the router collects
//! them every `periodic_infra_update_collection_time` (immediately when 0),
//! in batches of at most `max_event_batch_size`, each taking
//! `event_batch_time` — so the index is stale in a controlled way.

pub mod autoscale;
mod balanced;
mod gateway;
mod index;
mod least_loaded;
mod max_prefix;
pub mod pd;
mod power_of_two;
mod random;
mod round_robin;
mod tiered_prefix;

pub use autoscale::{AutoscaleConfig, Autoscaler};
pub use balanced::{Balanced, BalancedParams};
pub use gateway::{RequestView, Routed, Router};
pub use index::{KvIndex, Match};
pub(crate) use least_loaded::INDEX_BITS;
pub use least_loaded::LeastLoaded;
pub use max_prefix::MaxPrefix;
pub use power_of_two::PowerOfTwo;
pub use random::Random;
pub use round_robin::RoundRobin;
pub use tiered_prefix::TieredPrefix;

use crate::ids::WorkerId;
use crate::rng::StreamRng;
use crate::time::SimDuration;
use rand::RngExt;

/// A worker's periodic report to the router (Opal's `SystemEvent`), sent
/// every `periodic_infra_update_time` and seen by the router when it next
/// collects its queue.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SystemEvent {
    /// Requests in the running batch.
    pub running: u32,
    /// Requests waiting for admission (queue occupancy).
    pub waiting: u32,
    /// Fraction of the GPU KV blocks in use (memory use).
    pub kv_usage: f64,
    /// Fraction of the time since the previous report spent computing.
    pub gpu_utilization: f64,
}

/// What a policy may know about a worker.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WorkerLoad {
    /// The worker.
    pub id: WorkerId,
    /// Requests routed to it that have not completed (the router's own count).
    pub outstanding: u32,
    /// How its outstanding requests count against those of other workers.
    pub scale: LoadScale,
    /// Its last system event (all zero before the first).
    pub system: SystemEvent,
}

/// How a worker's outstanding requests count when loads are compared: in
/// a fleet of equal workers each request counts 1; in a fleet of worker
/// groups a request weighs the inverse of its worker's capacity, and a
/// worker whose slots are all taken ranks after every worker with a free one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadScale {
    /// What one of its requests weighs: 1 in a fleet of equal workers; with
    /// worker groups [`LOAD_UNIT`] × the most capable group's capacity /
    /// its group's.
    pub weight: u32,
    /// Requests it runs at once (`u32::MAX`, no limit, in a fleet of equal
    /// workers): a request routed to it while it has as many outstanding waits.
    pub slots: u32,
}

impl LoadScale {
    /// Every request counts 1 and no worker is ever full.
    pub const EQUAL: LoadScale = LoadScale { weight: 1, slots: u32::MAX };
}

impl Default for LoadScale {
    fn default() -> Self {
        LoadScale::EQUAL
    }
}

/// The weight of a request on the most capable workers of a fleet of worker groups.
pub const LOAD_UNIT: u32 = 1024;

/// The most a weight may be ([`LOAD_UNIT`] × 16: capacities further apart count as 16× apart).
pub const MAX_LOAD_WEIGHT: u32 = 16 * LOAD_UNIT;

/// Where the ranks of workers without a free slot begin: above every
/// weighted load (at most 2³² × [`MAX_LOAD_WEIGHT`] = 2⁴⁶).
const FULL: u64 = 1 << 46;

/// Above the highest rank, [`FULL`] + 2³² × [`MAX_LOAD_WEIGHT`] (so a rank
/// and a worker's index share a u64).
pub(crate) const MAX_RANK: u64 = 1 << 47;

impl WorkerLoad {
    /// Its load: outstanding requests × their weight, so unequal workers
    /// compare by load relative to capacity (1 × outstanding with equal ones).
    pub fn load(&self) -> u64 {
        u64::from(self.outstanding) * u64::from(self.scale.weight)
    }

    /// What the least-loaded choice minimises: [`Self::load`] while the
    /// worker has a free slot; once it has none, above every worker that
    /// has one, by the requests that would wait ahead of and with the new
    /// one × their weight (the wait for a slot, in units of its capacity).
    /// So a mixed fleet fills its free slots first — the most capable
    /// workers' first, by weighted load, which keeps the slower workers'
    /// batches, and their TPOT, smaller — and queues only when every worker
    /// is full, where the queue is shortest for its speed; every worker
    /// then saturates together and each serves its capacity's share (as
    /// llm-d's queue scorer prefers an engine with no waiting requests).
    /// With equal workers it is the outstanding count.
    pub fn rank(&self) -> u64 {
        let n = u64::from(self.outstanding);
        let LoadScale { weight, slots } = self.scale;
        if n < u64::from(slots) || slots == u32::MAX {
            n * u64::from(weight)
        } else {
            FULL + (n - u64::from(slots) + 1) * u64::from(weight)
        }
    }
}

/// Everything a policy decides on.
#[derive(Clone, Copy, Debug)]
pub struct RouteContext<'a> {
    /// Workers accepting requests, in creation order.
    pub workers: &'a [WorkerLoad],
    /// Per worker (by index), what the KV index says it could serve of this
    /// request (empty for policies that do not read the index).
    pub prefix: &'a [Match],
    /// Chunks of this request the index could match.
    pub chunks: u32,
    /// The least loaded of `workers` (fewest outstanding, lowest id on ties),
    /// kept by the router's tournament tree — for a policy that reads the
    /// loads ([`Needs::loads`]); None for the others.
    pub fewest: Option<WorkerId>,
}

impl RouteContext<'_> {
    /// Fraction of the request's chunks worker `i` could serve.
    pub fn prefix_fraction(&self, i: usize) -> f64 {
        if self.chunks == 0 {
            0.0
        } else {
            f64::from(self.prefix.get(i).map_or(0, |m| m.chunks)) / f64::from(self.chunks)
        }
    }
}

/// What a policy reads besides the router's own count of outstanding
/// requests. Every policy declares it, so the compiler sees that a new
/// policy says whether workers must publish KV events for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// The workers' loads (the router's count of outstanding requests; for
    /// the P/D prefill pool, their pending prefill tokens).
    pub loads: bool,
    /// The KV index (workers publish their KV events; requests are scored against it).
    pub kv_index: bool,
    /// Workers' periodic load reports (system events).
    pub load_reports: bool,
    /// The KV index's matches weighed by the tier holding each chunk.
    pub tier_weights: bool,
}

/// A routing policy.
pub trait Policy {
    /// What the policy reads.
    const NEEDS: Needs;

    /// Chooses one of `ctx.workers` (never empty). Random choices draw from
    /// `rng` (the run's `router` stream).
    fn choose(&mut self, ctx: &RouteContext<'_>, rng: &mut StreamRng) -> WorkerId;
}

/// The worker with the highest score; ties broken uniformly at random
/// (a draw only when there is a tie).
/// The worker with the best score; among ties the least loaded relative to
/// its capacity ([`WorkerLoad::rank`]), the lowest id on equal ranks.
pub(crate) fn best_then_least_loaded<S: PartialOrd + Copy>(
    workers: &[WorkerLoad],
    score: impl Fn(usize) -> S,
) -> WorkerId {
    let (mut best, mut pick) = (score(0), 0);
    for i in 1..workers.len() {
        let s = score(i);
        if s > best || (s == best && workers[i].rank() < workers[pick].rank()) {
            (best, pick) = (s, i);
        }
    }
    workers[pick].id
}

pub(crate) fn best_with_random_ties<S: PartialOrd + Copy>(
    workers: &[WorkerLoad],
    score: impl Fn(usize) -> S,
    rng: &mut StreamRng,
) -> WorkerId {
    let (mut best, mut first, mut ties) = (score(0), 0, 1usize);
    for i in 1..workers.len() {
        let s = score(i);
        if s > best {
            (best, first, ties) = (s, i, 1);
        } else if s == best {
            ties += 1;
        }
    }
    if ties == 1 {
        return workers[first].id;
    }
    let mut k = rng.random_range(0..ties);
    for (i, w) in workers.iter().enumerate().skip(first) {
        if score(i) == best {
            if k == 0 {
                return w.id;
            }
            k -= 1;
        }
    }
    unreachable!("the best score is among the workers")
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
    /// Longest cached prefix per the KV index; ties and no hit at random.
    MaxPrefix,
    /// MaxPrefix with each chunk weighted by the tier holding it.
    TieredPrefix,
    /// Prefix score minus load, with an imbalance fallback to the least loaded.
    Balanced,
    /// The less loaded of two workers drawn at random.
    PowerOfTwo,
}

impl PolicyKind {
    /// Every policy name, as written in configs.
    pub const NAMES: &'static [&'static str] =
        &["RoundRobin", "Random", "LeastLoaded", "MaxPrefix", "TieredPrefix", "Balanced", "PowerOfTwo"];

    /// Parses a policy name, case-insensitively.
    pub fn from_name(name: &str) -> Option<PolicyKind> {
        Some(match name.to_ascii_lowercase().as_str() {
            "roundrobin" => PolicyKind::RoundRobin,
            "random" => PolicyKind::Random,
            "leastloaded" => PolicyKind::LeastLoaded,
            "maxprefix" => PolicyKind::MaxPrefix,
            "tieredprefix" => PolicyKind::TieredPrefix,
            "balanced" => PolicyKind::Balanced,
            "poweroftwo" => PolicyKind::PowerOfTwo,
            _ => return None,
        })
    }

    /// What the policy reads (each policy's own [`Policy::NEEDS`]).
    pub fn needs(self) -> Needs {
        match self {
            PolicyKind::RoundRobin => RoundRobin::NEEDS,
            PolicyKind::Random => Random::NEEDS,
            PolicyKind::LeastLoaded => LeastLoaded::NEEDS,
            PolicyKind::MaxPrefix => MaxPrefix::NEEDS,
            PolicyKind::TieredPrefix => TieredPrefix::NEEDS,
            PolicyKind::Balanced => Balanced::NEEDS,
            PolicyKind::PowerOfTwo => PowerOfTwo::NEEDS,
        }
    }
}

/// Resolved router settings.
#[derive(Clone, Debug, PartialEq)]
pub struct RouterConfig {
    /// The policy.
    pub policy: PolicyKind,
    /// How often the router collects events when its queue is empty (zero: as they arrive).
    pub collection_interval: SimDuration,
    /// Most events applied per batch (an event of n chunks counting n), when a batch takes time.
    pub max_event_batch: u32,
    /// Time one batch takes to apply.
    pub batch_time: SimDuration,
    /// How often workers report load (system events).
    pub system_interval: SimDuration,
    /// Weight of a chunk found in each tier (gpu, cpu, nvme, dfs) for TieredPrefix.
    pub tier_weights: [f64; 4],
    /// Balanced's parameters.
    pub balanced: BalancedParams,
    /// Autoscaling, if enabled.
    pub autoscale: Option<AutoscaleConfig>,
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
    /// See [`MaxPrefix`].
    MaxPrefix(MaxPrefix),
    /// See [`TieredPrefix`].
    TieredPrefix(TieredPrefix),
    /// See [`Balanced`].
    Balanced(Balanced),
    /// See [`PowerOfTwo`].
    PowerOfTwo(PowerOfTwo),
}

impl RoutingPolicy {
    /// A fresh instance per `cfg`.
    pub fn from_config(cfg: &RouterConfig) -> RoutingPolicy {
        match cfg.policy {
            PolicyKind::RoundRobin => RoutingPolicy::RoundRobin(RoundRobin::default()),
            PolicyKind::Random => RoutingPolicy::Random(Random),
            PolicyKind::LeastLoaded => RoutingPolicy::LeastLoaded(LeastLoaded),
            PolicyKind::MaxPrefix => RoutingPolicy::MaxPrefix(MaxPrefix),
            PolicyKind::TieredPrefix => RoutingPolicy::TieredPrefix(TieredPrefix),
            PolicyKind::Balanced => RoutingPolicy::Balanced(Balanced { params: cfg.balanced }),
            PolicyKind::PowerOfTwo => RoutingPolicy::PowerOfTwo(PowerOfTwo),
        }
    }
}

impl RoutingPolicy {
    /// What the instance's policy reads.
    pub fn needs(&self) -> Needs {
        match self {
            RoutingPolicy::RoundRobin(_) => RoundRobin::NEEDS,
            RoutingPolicy::Random(_) => Random::NEEDS,
            RoutingPolicy::LeastLoaded(_) => LeastLoaded::NEEDS,
            RoutingPolicy::MaxPrefix(_) => MaxPrefix::NEEDS,
            RoutingPolicy::TieredPrefix(_) => TieredPrefix::NEEDS,
            RoutingPolicy::Balanced(_) => Balanced::NEEDS,
            RoutingPolicy::PowerOfTwo(_) => PowerOfTwo::NEEDS,
        }
    }

    /// Chooses one of `ctx.workers` with the instance's policy.
    pub fn choose(&mut self, ctx: &RouteContext<'_>, rng: &mut StreamRng) -> WorkerId {
        match self {
            RoutingPolicy::RoundRobin(p) => p.choose(ctx, rng),
            RoutingPolicy::Random(p) => p.choose(ctx, rng),
            RoutingPolicy::LeastLoaded(p) => p.choose(ctx, rng),
            RoutingPolicy::MaxPrefix(p) => p.choose(ctx, rng),
            RoutingPolicy::TieredPrefix(p) => p.choose(ctx, rng),
            RoutingPolicy::Balanced(p) => p.choose(ctx, rng),
            RoutingPolicy::PowerOfTwo(p) => p.choose(ctx, rng),
        }
    }
}

#[cfg(test)]
pub(crate) fn loads(outstanding: &[u32]) -> Vec<WorkerLoad> {
    outstanding
        .iter()
        .enumerate()
        .map(|(i, &o)| WorkerLoad {
            id: WorkerId(i as u32),
            outstanding: o,
            scale: LoadScale::EQUAL,
            system: SystemEvent::default(),
        })
        .collect()
}

#[cfg(test)]
pub(crate) fn ctx<'a>(workers: &'a [WorkerLoad], prefix: &'a [Match], chunks: u32) -> RouteContext<'a> {
    RouteContext { workers, prefix, chunks, fewest: Some(least_loaded::fewest_by_scan(workers)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_are_case_insensitive() {
        assert_eq!(PolicyKind::from_name("roundrobin"), Some(PolicyKind::RoundRobin));
        assert_eq!(PolicyKind::from_name("LEASTLOADED"), Some(PolicyKind::LeastLoaded));
        assert_eq!(PolicyKind::from_name("MaxPrefix"), Some(PolicyKind::MaxPrefix));
        assert_eq!(PolicyKind::from_name("poweroftwo"), Some(PolicyKind::PowerOfTwo));
        assert_eq!(PolicyKind::from_name("Fastest"), None);
        assert!(PolicyKind::Balanced.needs().kv_index && !PolicyKind::LeastLoaded.needs().kv_index);
        assert!(PolicyKind::Balanced.needs().load_reports && !PolicyKind::MaxPrefix.needs().load_reports);
    }

    #[test]
    fn a_full_worker_ranks_after_every_worker_with_a_free_slot_by_its_wait() {
        let w = |outstanding, weight, slots| WorkerLoad {
            outstanding,
            scale: LoadScale { weight, slots },
            ..WorkerLoad::default()
        };
        // A fast worker (weight 1,024, 4 slots) and one 3× as slow (3,072, 4 slots).
        assert_eq!((w(3, 1024, 4).rank(), w(1, 3072, 4).rank()), (3072, 3072));
        // Full: above any free worker's rank, by its wait — the requests
        // ahead of and with the new one, × their weight.
        assert_eq!(w(4, 1024, 4).rank(), FULL + 1024);
        assert!(w(4, 1024, 4).rank() > w(3, 3072, 4).rank());
        // Three to wait on the fast one wait as long as one on the slow one.
        assert_eq!(w(6, 1024, 4).rank(), w(4, 3072, 4).rank());
        assert!(w(7, 1024, 4).rank() > w(4, 3072, 4).rank());
        // Equal workers: the outstanding count, never full.
        assert_eq!(w(u32::MAX, 1, u32::MAX).rank(), u64::from(u32::MAX));
        // The largest rank stays below 2⁴⁷.
        assert_eq!(w(u32::MAX, MAX_LOAD_WEIGHT, 1).rank(), MAX_RANK - u64::from(MAX_LOAD_WEIGHT));
    }
}
