//! # Opal — a discrete-event simulator of LLM inference platforms
//!
//! Opal models a request router in front of vLLM-like workers and answers
//! capacity questions (TTFT/TPOT percentiles, throughput, utilisation) for
//! a scenario, fast enough to sweep thousands of seeded runs.
//!
//! ```text
//!  spec.toml ──config──▶ Scenario ──cluster──▶ engine loop ──▶ metrics ──▶ RunOutput
//!                                      │
//!            workload ──▶ router ──▶ workers (scheduler, KV blocks, step-time model)
//! ```
//!
//! Data flows one way. [`config`] turns a TOML spec into a validated
//! [`config::Scenario`]; [`cluster::Cluster`] owns every component of one run
//! and is the only place that knows the event enum; [`engine`] pops events in
//! `(time, seq)` order; components ([`workload`], [`router`], [`worker`]) are
//! passive and return effects; [`metrics`] records histograms, the time
//! series and per-request records.
//!
//! Module map: [`time`], [`ids`], [`rng`] (foundations) · [`engine`] ·
//! [`config`] · [`workload`] · [`router`] · [`worker`] · [`kvcache`] ·
//! [`storage`] · [`request`] ·
//! [`cluster`] · [`metrics`] · [`output`] (Parquet) · [`sweep`] · [`report`] (terminal
//! summaries and the HTML sweep report).

#![warn(missing_docs)]

pub mod calibrate;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod engine;
pub mod ids;
pub mod kvcache;
pub mod metrics;
pub mod output;
pub mod report;
pub mod request;
pub mod rng;
pub mod router;
pub mod stats;
pub mod storage;
pub mod sweep;
pub mod time;
pub mod worker;
pub mod workload;

pub use cluster::RunOutput;
pub use config::Scenario;

/// What a run should keep beyond the summary, histograms and time series,
/// and when to give up.
#[derive(Clone, Copy, Debug)]
pub struct RunOptions<'a> {
    /// Build one record per request (memory grows with the request count).
    pub request_records: bool,
    /// Build one record per scheduler step (the `steps` table; memory grows with the steps).
    pub step_records: bool,
    /// Measure the wall time spent routing and maintaining the router's KV
    /// index (for benchmarks; it never influences the simulation).
    pub profile_routing: bool,
    /// Stop the run when this becomes true (checked every few thousand
    /// events, so within milliseconds); the run then fails with
    /// [`RunError::Interrupted`].
    pub stop: Option<&'a std::sync::atomic::AtomicBool>,
    /// Keep this up to date with the simulated time and the requests
    /// completed (every few thousand events), for a progress display.
    pub progress: Option<&'a engine::Progress>,
}

impl Default for RunOptions<'_> {
    fn default() -> Self {
        RunOptions { request_records: true, step_records: false, profile_routing: false, stop: None, progress: None }
    }
}

/// Why a run produced no output.
#[derive(Clone, Debug, PartialEq)]
pub enum RunError {
    /// Input met during the run was unusable (a malformed trace line, a
    /// size beyond a guard), as the workload's message naming it.
    Workload(String),
    /// The next arrival would come after the latest time a run may reach.
    Horizon {
        /// When it would come, simulated seconds.
        at_s: f64,
    },
    /// The run went on so long that its time series would hold too many intervals.
    TimeSeries {
        /// Simulated time reached, seconds.
        at_s: f64,
        /// The interval width, seconds.
        interval_s: f64,
        /// Requests in the system then.
        in_system: u64,
        /// When the last response left, simulated seconds.
        last_response_s: Option<f64>,
    },
    /// Nothing was left to happen while requests were still in the system:
    /// no worker could move any of them (a defect of the simulator's
    /// scheduling rules, reported rather than ended as a short run).
    Stalled {
        /// When the last event happened, simulated seconds.
        at_s: f64,
        /// What the workers holding requests held then.
        workers: String,
    },
    /// The run's grid point has an invalid scenario.
    Config(config::ConfigError),
    /// The simulation broke an invariant (a bug), with the panic's message.
    Panic(String),
    /// The run's rows could not be written as it went (see [`metrics::RowSink`]).
    Rows(String),
    /// [`RunOptions::stop`] was raised; the run had simulated this many seconds.
    Interrupted {
        /// Simulated time reached, seconds.
        sim_time_s: f64,
    },
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Panic(m) => write!(f, "panic: {m}"),
            RunError::Workload(m) => f.write_str(m),
            RunError::Horizon { at_s } => write!(
                f,
                "the next arrival is at {at_s:.3e} simulated seconds, beyond the {:.0e} s a run may reach\n  fix: check the request rates (a rate near 0 spaces arrivals by ages) and the trace timestamps (epoch times need shift_to_first = true, and Mooncake's milliseconds multiplier_to_sec = 0.001)",
                time::HORIZON.as_secs_f64()
            ),
            RunError::TimeSeries { at_s, interval_s, in_system, last_response_s } => {
                write!(
                    f,
                    "the run reached {at_s:.0} simulated seconds: at simulation.time_series_interval_sec = {interval_s} the time series would need more than {} intervals",
                    metrics::MAX_INTERVALS,
                )?;
                let last = last_response_s.map_or("none yet".to_string(), |t| format!("the last at {t:.3} s"));
                write!(f, " ({in_system} requests in the system; responses: {last})")?;
                if *in_system > 0 && last_response_s.is_none_or(|t| t < at_s / 2.0) {
                    write!(
                        f,
                        "\n  the platform had stopped answering: check that the load is one it can serve (a shorter run's queue and preemption columns tell)"
                    )?;
                }
                write!(
                    f,
                    "\n  fix: raise time_series_interval_sec (in [simulation] or [sweep]) to at least {:.3}, or set simulation.simulation_time",
                    at_s / metrics::MAX_INTERVALS as f64
                )
            }
            RunError::Stalled { at_s, workers } => write!(
                f,
                "the run stopped at {at_s:.3} simulated seconds with requests in the system and nothing left to happen: {workers}\n  fix: this is a defect of the simulator's scheduler (please report it with the spec); more KV blocks per worker (gpu_memory_utilization) or fewer sequences (max_num_seqs) may avoid it"
            ),
            RunError::Config(e) => write!(f, "{e}"),
            RunError::Rows(m) => write!(f, "could not write the run's rows: {m}"),
            RunError::Interrupted { sim_time_s } => {
                write!(f, "interrupted by a signal after {sim_time_s:.3} simulated seconds")
            }
        }
    }
}

impl RunError {
    /// Whether the run failed (rather than being interrupted).
    pub fn is_failure(&self) -> bool {
        !matches!(self, RunError::Interrupted { .. })
    }
}

impl std::error::Error for RunError {}

/// Runs one scenario to completion (deterministic: same scenario, same
/// output). Fails only on input met during the run (a malformed trace line).
pub fn simulate(scenario: &Scenario) -> Result<RunOutput, RunError> {
    simulate_with(scenario, &RunOptions::default())
}

/// [`simulate`] with options.
pub fn simulate_with(scenario: &Scenario, opts: &RunOptions<'_>) -> Result<RunOutput, RunError> {
    cluster::Cluster::new(scenario).run(opts, None)
}

/// [`simulate_with`], the per-row tables the options ask for handed to
/// `sink` as the run goes (the output's `requests` and `steps` stay empty):
/// memory bounded whatever the run's length.
pub fn simulate_into(
    scenario: &Scenario,
    opts: &RunOptions<'_>,
    sink: &mut dyn metrics::RowSink,
) -> Result<RunOutput, RunError> {
    cluster::Cluster::new(scenario).run(opts, Some(sink))
}

#[cfg(test)]
mod tests {
    use super::RunError;

    #[test]
    fn a_run_too_long_for_its_time_series_says_whether_the_platform_had_stopped_answering() {
        let e = |in_system, last_response_s| {
            RunError::TimeSeries { at_s: 400_000.0, interval_s: 1.0, in_system, last_response_s }.to_string()
        };
        // Requests waiting and no response for most of the run: the real cause is named.
        let stuck = e(16, Some(12.2));
        assert!(stuck.contains("16 requests in the system; responses: the last at 12.200 s"), "{stuck}");
        assert!(stuck.contains("the platform had stopped answering"), "{stuck}");
        assert!(stuck.contains("fix: raise time_series_interval_sec"), "{stuck}");
        // A long run that kept answering (or had nothing in flight) is only too long.
        assert!(!e(3, Some(399_990.0)).contains("stopped answering"));
        assert!(!e(0, Some(5.0)).contains("stopped answering"));
        assert!(e(2, None).contains("responses: none yet"));
    }
}
