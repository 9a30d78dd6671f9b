//! Board power: what a GPU draws as a function of what its steps do.
//!
//! With no step running a GPU draws `idle` watts. While a step runs it
//! draws `active + compute · u_c + memory · u_m`, at most `max`, where
//! `u_c` is the share of its peak tensor FLOP/s and `u_m` the share of its
//! peak HBM bandwidth the step achieves (its FLOPs and bytes at the peaks
//! divided by its duration). So a step of duration `d` asking `C` seconds of
//! compute and `M` of memory at the peaks takes
//! `min(max · d, active · d + compute · C + memory · M)` joules — low-batch
//! decode (little compute, bandwidth well below its peak) draws far less
//! than a large prefill, which reaches the board limit.
//!
//! Defaults are fitted to public measurements (per GPU, vLLM serving):
//!
//! - **H100 SXM** (700 W): idle 70 W (nvidia-smi idle readings published by
//!   DigitalOcean's `do-dcgm-exporter` docs, 73 W, and Nebius's reference
//!   architecture, 69–72 W); active 190 W, memory 450 W, compute 900 W — a
//!   least-squares fit to the ML.ENERGY Leaderboard's measured average GPU
//!   power (v2 and V3 data, github.com/ml-energy/leaderboard{,-v2}, Zeus/NVML;
//!   Llama-3.1-8B/70B/405B, Qwen3 at batch 8–900; RMSE 48 W) with the
//!   compute-bound plateau its diffusion runs show (670–690 W).
//! - **A100 SXM** (400 W): idle 60 W (59–62 W measured, and SplitwiseSim's
//!   63 W); active 100 W, memory 310 W, compute 450 W — fitted to the
//!   measured average power of SplitwiseSim's Llama-2-70B rows
//!   (`data/perf_model.csv` of Mutinifni/splitwise-sim, MIT; RMSE 13–17 W).
//! - Other GPUs: the H100's shares of the board maximum (idle 10 %, active
//!   27 %, memory 64 %, compute 129 %), until measurements say otherwise.
//!
//! `opal-sweep calibrate` fits `active`, `compute` and `memory` to measured
//! power columns.

use crate::metrics::{PeakSeconds, StepSpan};

/// A GPU's power model, watts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PowerModel {
    /// Drawn with no step running.
    pub idle_w: f64,
    /// Drawn while a step runs, before what it does.
    pub active_w: f64,
    /// Added at full use of the tensor cores (× the share of peak FLOP/s).
    pub compute_w: f64,
    /// Added at full use of HBM bandwidth (× the share of peak bandwidth).
    pub memory_w: f64,
    /// The board limit.
    pub max_w: f64,
}

/// Shares of the board maximum for a GPU without measurements (the H100's).
pub const SHARES: PowerShares =
    PowerShares { idle: 0.1, active: 190.0 / 700.0, compute: 900.0 / 700.0, memory: 450.0 / 700.0 };

/// A power model as shares of the board maximum.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PowerShares {
    /// Idle.
    pub idle: f64,
    /// Active floor.
    pub active: f64,
    /// At full compute.
    pub compute: f64,
    /// At full bandwidth.
    pub memory: f64,
}

impl PowerModel {
    /// A board of `max_w` watts with the shares `s`.
    pub fn from_shares(max_w: f64, s: PowerShares) -> PowerModel {
        PowerModel {
            idle_w: s.idle * max_w,
            active_w: s.active * max_w,
            compute_w: s.compute * max_w,
            memory_w: s.memory * max_w,
            max_w,
        }
    }

    /// Joules one GPU takes for a step of `duration_s` seconds that asks
    /// `peak` of it (its FLOPs and bytes at the peaks, seconds).
    pub fn step_joules(&self, duration_s: f64, peak: PeakSeconds) -> f64 {
        (self.active_w * duration_s + self.compute_w * peak.compute + self.memory_w * peak.memory)
            .min(self.max_w * duration_s)
    }

    /// Σ [`Self::step_joules`] over the steps of `span` (a step that would
    /// draw more than the board's limit draws the limit: the steps on
    /// either side of where that starts are summed apart).
    pub fn span_joules(&self, span: &StepSpan) -> f64 {
        let (r, k0) = (&span.ramp, span.k0);
        let secs = |k: u64| r.at(k) as f64 / 1e9;
        let capped = |k: u64| {
            let p = span.peak_of(k - k0, k - k0 + 1);
            self.active_w * secs(k) + self.compute_w * p.compute + self.memory_w * p.memory > self.max_w * secs(k)
        };
        let sum = |a: u64, b: u64, cap: bool| {
            if a >= b {
                return 0.0;
            }
            let d = if (a, b) == (k0, span.k1) { span.duration } else { r.sum(a, b) }.as_secs_f64();
            if cap {
                return self.max_w * d;
            }
            let p = span.peak_of(a - k0, b - k0);
            self.active_w * d + self.compute_w * p.compute + self.memory_w * p.memory
        };
        let (first, last) = (capped(k0), capped(span.k1 - 1));
        if first == last {
            return sum(k0, span.k1, first);
        }
        // The first step on the other side of the limit (the excess is affine in the step).
        let (mut lo, mut hi) = (k0 + 1, span.k1 - 1);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if capped(mid) == last { hi = mid } else { lo = mid + 1 }
        }
        sum(k0, lo, first) + sum(lo, span.k1, last)
    }

    /// Joules `tp` GPUs take over `alive_s` seconds, `busy_s` of them in
    /// steps that took `step_j` joules per GPU.
    pub fn energy_j(&self, tp: u32, alive_s: f64, busy_s: f64, step_j: f64) -> f64 {
        f64::from(tp) * (self.idle_w * (alive_s - busy_s).max(0.0) + step_j)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_batch_decode_draws_less_than_a_prefill_that_reaches_the_board_limit() {
        let h100 = PowerModel { idle_w: 70.0, active_w: 190.0, compute_w: 900.0, memory_w: 450.0, max_w: 700.0 };
        // A 6 ms decode step reading 16 GB at 3.35 TB/s (4.78 ms at the peak: u_m = 0.797) and
        // computing 1.6e10 FLOPs (16 µs at 989.5 TFLOP/s):
        // 190·0.006 + 900·16e-6 + 450·0.00478 = 1.14 + 0.0144 + 2.151 = 3.3054 J → 551 W.
        let decode = h100.step_joules(0.006, PeakSeconds { compute: 16e-6, memory: 0.00478 });
        assert!((decode - 3.3054).abs() < 1e-9, "{decode}");
        // A 200 ms prefill at 80 % of peak FLOPs: 190·0.2 + 900·0.16 = 182 J > 700·0.2 = 140 J: capped.
        let prefill = h100.step_joules(0.2, PeakSeconds { compute: 0.16, memory: 0.01 });
        assert_eq!(prefill, 140.0);
        // Two GPUs alive 10 s, busy 1 s in steps of 150 J each: 2·(70·9 + 150) = 1,560 J.
        assert_eq!(h100.energy_j(2, 10.0, 1.0, 150.0), 1560.0);
    }
}
