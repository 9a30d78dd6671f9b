//! Agreement with queueing theory.

use crate::scenario;

/// One worker, one sequence at a time, each request one fixed 10 ms step
/// (prompt 16, one output token): an M/D/1 queue with D = 10 ms.
fn md1(rho: f64, requests: u64, seed: u64) -> opal::RunOutput {
    let rate = rho / 0.010;
    opal::simulate(&scenario(&format!(
        r#"
        [simulation]
        seed = {seed}
        [worker.vllm_params]
        max_num_seqs = 1
        [worker.inference_params]
        model = "synthetic"
        mean_latency_secs = 0.010
        [[workload.stages]]
        type = "ExponentialReqRate"
        [workload.stages.workload_params]
        request_rate = {rate}
        jitter = 1.0
        total_requests = {requests}
        prompt_size_min = 16
        prompt_size_max = 16
        output_tokens_min = 1
        output_tokens_max = 1
        "#
    )))
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
    assert!((out.summary.gpu_utilization - 0.010 * lambda).abs() < 1e-9);
}

#[test]
fn md1_mean_queue_wait_matches_pollaczek_khinchine_at_rho_0_5() {
    check_md1(0.5, 300_000);
}

#[test]
fn md1_mean_queue_wait_matches_pollaczek_khinchine_at_rho_0_8() {
    check_md1(0.8, 1_000_000);
}
