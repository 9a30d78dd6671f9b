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
//! [`cluster`] · [`recorder`] · [`metrics`] · [`output`] (Parquet) · [`sweep`] · [`report`] (terminal
//! summaries and the HTML sweep report).

#![warn(missing_docs)]

pub mod calibrate;
// The command-line documentation is clap's `--help` text, written for the
// terminal (`<dir>`, `[sweep]`), not for rustdoc.
#[allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]
pub mod cli;
pub mod cluster;
pub mod config;
pub mod engine;
pub mod ids;
pub mod kvcache;
pub mod metrics;
pub mod output;
pub mod recorder;
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

pub use cluster::{RunError, RunOptions, RunOutput, simulate, simulate_into, simulate_with};
pub use config::Scenario;
