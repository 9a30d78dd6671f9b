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
    /// Gamma gaps of the given coefficient of variation: shape 1/cv²,
    /// scale mean·cv² (cv 1 is Poisson; vLLM's benchmark `--burstiness`
    /// is 1/cv²).
    Gamma {
        /// Coefficient of variation of the gaps.
        cv: f64,
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
            ArrivalProcess::Gamma { cv } => {
                let shape = 1.0 / (cv * cv);
                let g = rand_distr::Gamma::new(shape, mean / shape).expect("a positive shape and scale");
                g.sample(&mut self.rng)
            }
        };
        self.due()
    }
}

/// The skeleton of an open-loop generator (rate and RAG stages, and the
/// session starts of a `Sessions` stage): the arrival clock and the count.
/// The stage's time limit and outstanding cap are applied by the workload
/// around every generator; a generator asks [`OpenLoop::ready`] whether one
/// is due, builds it, and reports it with [`OpenLoop::sent`].
#[derive(Debug)]
pub(crate) struct OpenLoop {
    arrivals: Arrivals,
    total: Option<u64>,
    sent: u64,
}

impl OpenLoop {
    /// `total` arrivals (`None`: until a time limit) by `arrivals`.
    pub fn new(arrivals: Arrivals, total: Option<u64>) -> OpenLoop {
        OpenLoop { arrivals, total, sent: 0 }
    }

    /// The stage starts at `now`: the first arrival is due then (none if
    /// the count is 0).
    pub fn start(&mut self, now: SimTime) -> super::Due {
        if self.total == Some(0) {
            return super::Due::Done;
        }
        super::Due::At(self.arrivals.start(now))
    }

    /// True when an arrival is due at `now` and there is room for it.
    pub fn ready(&self, now: SimTime, room: u64) -> bool {
        room > 0 && !self.finished() && self.arrivals.due() <= now
    }

    /// Arrivals made so far (the index of the next one).
    pub fn count(&self) -> u64 {
        self.sent
    }

    /// True once the count is out.
    pub fn finished(&self) -> bool {
        self.total.is_some_and(|t| self.sent >= t)
    }

    /// What is due next without sending: the pending arrival, or done.
    pub fn next(&self) -> super::Due {
        if self.finished() { super::Due::Done } else { super::Due::At(self.arrivals.due()) }
    }

    /// The due arrival went out at `now`; returns what is due next.
    pub fn sent(&mut self, now: SimTime) -> super::Due {
        self.sent += 1;
        if self.finished() { super::Due::Done } else { super::Due::At(self.arrivals.advance(now)) }
    }
}
