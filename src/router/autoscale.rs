//! Autoscaling as in Opal: every simulated second the router looks at the
//! workers' outstanding requests; if any exceeds `max_queue_threshold`
//! (strictly) and fewer than `max_workers` exist, it provisions one worker,
//! which joins after `scale_latency` with cold caches. One scale-up is in
//! flight at a time, and the next check comes one second after it joins.
//! There is no scale-down.

use crate::time::{SimDuration, SimTime};

/// Resolved autoscaling settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutoscaleConfig {
    /// Outstanding requests on one worker above which a worker is added.
    pub max_queue_threshold: u32,
    /// Time from the decision to the worker accepting requests.
    pub scale_latency: SimDuration,
    /// Most workers.
    pub max_workers: u32,
}

/// What the autoscaler wants next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleAction {
    /// Check again at this time.
    CheckAt(SimTime),
    /// Add a worker at this time (then check one second later).
    AddAt(SimTime),
}

/// The autoscaler's decisions (passive).
#[derive(Clone, Copy, Debug)]
pub struct Autoscaler {
    cfg: AutoscaleConfig,
}

impl Autoscaler {
    /// An autoscaler per `cfg`.
    pub fn new(cfg: AutoscaleConfig) -> Autoscaler {
        Autoscaler { cfg }
    }

    /// The first check.
    pub fn first_check() -> SimTime {
        SimTime::ZERO + SimDuration::from_secs(1)
    }

    /// A check at `now` with the largest outstanding count and the number of workers.
    pub fn check(&self, now: SimTime, max_outstanding: u32, workers: u32) -> ScaleAction {
        if max_outstanding > self.cfg.max_queue_threshold && workers < self.cfg.max_workers {
            ScaleAction::AddAt(now + self.cfg.scale_latency)
        } else {
            ScaleAction::CheckAt(now + SimDuration::from_secs(1))
        }
    }

    /// A worker joined at `now`: the next check.
    pub fn joined(&self, now: SimTime) -> SimTime {
        now + SimDuration::from_secs(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_only_above_the_threshold_and_below_the_cap() {
        let a = Autoscaler::new(AutoscaleConfig {
            max_queue_threshold: 4,
            scale_latency: SimDuration::from_secs(40),
            max_workers: 3,
        });
        let t = SimTime(5_000_000_000);
        assert_eq!(a.check(t, 4, 1), ScaleAction::CheckAt(SimTime(6_000_000_000)), "4 is not above 4");
        assert_eq!(a.check(t, 5, 2), ScaleAction::AddAt(SimTime(45_000_000_000)));
        assert_eq!(a.check(t, 50, 3), ScaleAction::CheckAt(SimTime(6_000_000_000)), "at the cap");
        assert_eq!(a.joined(SimTime(45_000_000_000)), SimTime(46_000_000_000));
    }
}
