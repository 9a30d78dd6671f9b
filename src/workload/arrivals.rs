//! Open-loop arrival times: fixed gaps (`UniformReqRate`) or Opal's jittered
//! exponential gaps, counted from the stage start in `f64` seconds so fixed
//! gaps never accumulate rounding.

use crate::rng::StreamRng;
use crate::time::{SimDuration, SimTime};
use rand_distr::{Distribution, Exp1};

/// How gaps between arrivals are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ArrivalProcess {
    /// Every gap is exactly `1 / rate` (Opal's `UniformReqRate`).
    Uniform,
    /// Gap = `mean·(1 − jitter) + mean·Exp(1)·jitter` (Opal's `ExponentialReqRate`; jitter 1 = Poisson).
    Exponential {
        /// Blend between fixed (0) and exponential (1) gaps.
        jitter: f64,
    },
}

/// The arrival clock of one stage.
#[derive(Debug)]
pub(crate) struct Arrivals {
    process: ArrivalProcess,
    rate: f64,
    rng: StreamRng,
    start: SimTime,
    next_offset_secs: f64,
}

impl Arrivals {
    /// Arrivals at `rate` per second drawn from `rng`.
    pub fn new(process: ArrivalProcess, rate: f64, rng: StreamRng) -> Arrivals {
        Arrivals { process, rate, rng, start: SimTime::ZERO, next_offset_secs: 0.0 }
    }

    /// Starts the clock: the first arrival is at `start`.
    pub fn start(&mut self, start: SimTime) -> SimTime {
        self.start = start;
        self.next_offset_secs = 0.0;
        start
    }

    /// When the next arrival is due.
    pub fn due(&self) -> SimTime {
        self.start + SimDuration::from_secs_f64(self.next_offset_secs)
    }

    /// The due arrival went out at `now`; returns when the next one is due.
    /// If it went out late (held by `max_outstanding_requests`), the next gap
    /// counts from `now`.
    pub fn advance(&mut self, now: SimTime) -> SimTime {
        if now > self.due() {
            self.next_offset_secs = (now - self.start).as_secs_f64();
        }
        let mean = 1.0 / self.rate;
        self.next_offset_secs += match self.process {
            ArrivalProcess::Uniform => mean,
            ArrivalProcess::Exponential { jitter } => {
                let e: f64 = Exp1.sample(&mut self.rng);
                mean * (1.0 - jitter) + mean * e * jitter
            }
        };
        self.due()
    }
}
