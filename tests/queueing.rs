//! Agreement with queueing theory.

use crate::fixtures::Spec;
use toml::toml;

/// One worker, one sequence at a time, each request one fixed 10 ms step
/// (prompt 16, one output token): an M/D/1 queue with D = 10 ms.
fn md1(rho: f64, requests: u64, seed: u64) -> opal::RunOutput {
    let rate = rho / 0.010;
    Spec::empty()
        .set("simulation.seed", seed as i64)
        .set("worker.vllm_params.max_num_seqs", 1)
        .tiers(&[])
        .set("worker.inference_params.model", "synthetic")
        .set("worker.inference_params.mean_latency_secs", 0.010)
        .stage(
            "ExponentialReqRate",
            toml! {
                request_rate = rate
                jitter = 1.0
                total_requests = requests
                prompt_size_min = 16
                prompt_size_max = 16
                output_tokens_min = 1
                output_tokens_max = 1
            },
        )
        .run()
}

/// The sample mean of M/D/1 waits is strongly autocorrelated near saturation;
/// across seeds its spread is about 1 % at ρ = 0.8 with a million requests.
fn check_md1(rho: f64, requests: u64) {
    let out = md1(rho, requests, 1);
    // Pollaczek–Khinchine for deterministic service: Wq = ρ·D / (2(1 − ρ)).
    let expected_ms = rho * 10.0 / (2.0 * (1.0 - rho));
    let mean_ms = out.summary.queue_wait_ms.mean;
    let err = (mean_ms - expected_ms).abs() / expected_ms;
    assert!(err < 0.03, "ρ = {rho}: mean wait {mean_ms:.3} ms vs M/D/1 {expected_ms:.3} ms ({:.1} %)", err * 100.0);
    // Little's law: time-average number in system = arrival rate × mean time in system.
    // The run starts and ends empty, so the two accountings must agree exactly.
    let n = out.summary.requests_completed as f64;
    let lambda = n / out.summary.sim_time_s;
    let w = out.summary.e2e_ms.mean / 1e3;
    let l = out.summary.mean_requests_in_system;
    assert!((l - lambda * w).abs() / l < 1e-9, "L = {l}, λW = {}", lambda * w);
    // And the utilisation equals ρ (service time × throughput).
    assert!((out.summary.gpu_busy_fraction - 0.010 * lambda).abs() < 1e-9);
}

#[test]
fn md1_mean_queue_wait_matches_pollaczek_khinchine_at_rho_0_5() {
    check_md1(0.5, 300_000);
}

#[test]
fn md1_mean_queue_wait_matches_pollaczek_khinchine_at_rho_0_8() {
    check_md1(0.8, 1_000_000);
}

/// Steady-state verdicts (issue 25): an M/D/1 queue at ρ = 1.2 keeps
/// growing (`unstable`); at ρ = 0.7 it is `stable`, its warm-up is cut in
/// the run's first half and its steady mean wait is Pollaczek–Khinchine's
/// within the 2-digit segment histograms' and the sample's spread; 60
/// requests are `too_short` to judge. Several seeds each.
#[test]
fn md1_is_unstable_above_capacity_stable_below_and_too_short_when_brief() {
    for seed in 1..=5 {
        let over = md1(1.2, 4000, seed).summary;
        assert_eq!(over.steady.stability.name(), "unstable", "ρ = 1.2, seed {seed}");
        assert!(over.steady.ttft_ms.p99.is_nan() && over.steady.warmup_s.is_nan());
        let under = md1(0.7, 20_000, seed).summary;
        let st = &under.steady;
        assert_eq!(st.stability.name(), "stable", "ρ = 0.7, seed {seed}");
        assert!(st.warmup_requests <= 10_000 && st.steady_requests + st.warmup_requests == 20_000, "{st:?}");
        // Wq = ρ·D / (2(1 − ρ)) = 11.67 ms.
        let expected = 0.7 * 10.0 / (2.0 * 0.3);
        assert!((st.queue_wait_ms.mean - expected).abs() / expected < 0.1, "seed {seed}: {st:?}");
        assert!(st.warmup_s >= 0.0 && st.warmup_s < under.sim_time_s / 2.0);
        let brief = md1(0.7, 60, seed).summary;
        assert_eq!(brief.steady.stability.name(), "too_short", "60 requests, seed {seed}");
    }
}

/// Poisson arrivals of fixed-size operations at one storage device with no
/// latency and unlimited concurrency: an M/D/1 processor-sharing queue, whose
/// mean sojourn time is E[S] / (1 − ρ) whatever the service distribution.
mod processor_sharing {
    use opal::engine::{EventQueue, Model, Scheduler, run};
    use opal::rng::{SeedTree, StreamRng};
    use opal::storage::{Device, DeviceConfig, DeviceOutput, DeviceTimer, OpId, OpKind};
    use opal::time::{SimDuration, SimTime};
    use rand_distr::{Distribution, Exp1};

    #[derive(Clone, Copy, Hash)]
    enum Ev {
        Arrival,
        Device(DeviceTimer),
    }

    struct Bench {
        device: Device,
        rng: StreamRng,
        mean_gap_ns: f64,
        bytes: u64,
        submitted: Vec<SimTime>,
        sojourn_ns: u128,
        done: u64,
        target: u64,
        out: DeviceOutput,
    }

    impl Bench {
        fn apply(&mut self, sched: &mut Scheduler<'_, Ev>) {
            for &(t, timer) in &self.out.timers {
                sched.at(t, Ev::Device(timer));
            }
            for c in &self.out.completed {
                self.sojourn_ns += u128::from((sched.now() - self.submitted[c.op.0 as usize]).0);
                self.done += 1;
            }
            self.out.clear();
        }
    }

    impl Model for Bench {
        type Event = Ev;
        fn handle(&mut self, now: SimTime, ev: Ev, sched: &mut Scheduler<'_, Ev>) {
            match ev {
                Ev::Arrival => {
                    let id = OpId(self.submitted.len() as u32);
                    self.submitted.push(now);
                    self.device.submit(now, id, OpKind::Read, self.bytes, 0, &mut self.out);
                    if (self.submitted.len() as u64) < self.target {
                        let gap: f64 = Exp1.sample(&mut self.rng);
                        sched.after(SimDuration((gap * self.mean_gap_ns).round() as u64), Ev::Arrival);
                    }
                }
                Ev::Device(t) => self.device.on_timer(now, t, &mut self.out),
            }
            self.apply(sched);
        }
        fn finished(&self) -> bool {
            self.done == self.target
        }
    }

    fn mean_sojourn_ms(rho: f64, ops: u64) -> f64 {
        // 1 MB at 1 GB/s: E[S] = 1 ms.
        let mut m = Bench {
            device: Device::new(DeviceConfig {
                bandwidth_bps: 1e9,
                latency: SimDuration::ZERO,
                concurrency: u32::MAX,
                client_bandwidth_bps: None,
            }),
            rng: SeedTree::new(3).stream("arrivals"),
            mean_gap_ns: 1e6 / rho,
            bytes: 1_000_000,
            submitted: Vec::new(),
            sojourn_ns: 0,
            done: 0,
            target: ops,
            out: DeviceOutput::default(),
        };
        let mut q = EventQueue::new();
        q.push(SimTime::ZERO, Ev::Arrival);
        run(&mut m, &mut q, None, opal::engine::Watch::default());
        assert_eq!(m.device.stats().bytes_read, ops * 1_000_000, "bytes transferred equal bytes requested");
        m.sojourn_ns as f64 / ops as f64 / 1e6
    }

    #[test]
    fn mean_sojourn_matches_e_s_over_one_minus_rho_at_0_5() {
        let got = mean_sojourn_ms(0.5, 200_000);
        assert!((got - 2.0).abs() / 2.0 < 0.03, "mean sojourn {got:.4} ms vs 2 ms");
    }

    #[test]
    fn mean_sojourn_matches_e_s_over_one_minus_rho_at_0_8() {
        let got = mean_sojourn_ms(0.8, 1_000_000);
        assert!((got - 5.0).abs() / 5.0 < 0.03, "mean sojourn {got:.4} ms vs 5 ms");
    }
}

/// The verdicts' error rates (issue 36): over 100 seeds of 2,000-request
/// M/D/1 runs, a stable queue is called `unstable` at most once at ρ = 0.7
/// and twice at ρ = 0.9 (the trend test's critical value is the 99th
/// percentile of its null distribution: `scripts/steady-threshold.py`), an
/// overloaded one (ρ = 1.05) is never `stable`, and the `stable` runs'
/// steady mean wait at ρ = 0.9 is within 10 % of Pollaczek–Khinchine's
/// 45 ms (before the warm-up cut was capped at the first crossing of the
/// mean and the autocorrelation check gave way to counting queue drains,
/// 35.8 ms: −20 %, the calm runs classed stable).
#[test]
fn md1_verdicts_over_100_seeds_keep_their_error_rates() {
    use rayon::prelude::*;
    let runs =
        |rho: f64| -> Vec<opal::RunOutput> { (1..=100u64).into_par_iter().map(|seed| md1(rho, 2000, seed)).collect() };
    let count = |runs: &[opal::RunOutput], verdict: &str| {
        runs.iter().filter(|o| o.summary.steady.stability.name() == verdict).count()
    };
    let (r07, r09, r105) = (runs(0.7), runs(0.9), runs(1.05));
    let (u07, u09, s105) = (count(&r07, "unstable"), count(&r09, "unstable"), count(&r105, "stable"));
    // (With Student's 1 % point, 2.896, it counted 5 at ρ = 0.9.)
    assert!(u07 <= 1 && u09 <= 2 && s105 == 0, "unstable at 0.7: {u07}, at 0.9: {u09}; stable at 1.05: {s105}");
    let stable: Vec<f64> = r09.iter().map(|o| o.summary.steady.queue_wait_ms.mean).filter(|m| !m.is_nan()).collect();
    let mean = stable.iter().sum::<f64>() / stable.len() as f64;
    let pk = 0.9 * 10.0 / (2.0 * (1.0 - 0.9));
    assert!(
        (mean - pk).abs() / pk <= 0.10,
        "{} stable runs at ρ = 0.9: steady mean wait {mean:.1} ms vs {pk} ms",
        stable.len()
    );
}
