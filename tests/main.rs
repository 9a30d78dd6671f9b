//! Integration tests: behaviour seen from outside the library and the CLI.

mod architecture;
mod bad_inputs;
mod calibration;
mod claims;
mod cli;
mod crn;
mod data_parallel;
mod disagg;
mod experts;
mod fixtures;
mod golden;
mod groups;
mod kvcache;
mod performance;
mod pipeline;
mod queueing;
mod readme;
mod report;
mod router;
mod scenarios;
mod search;
mod shipped;
mod signals;
mod speculative;
mod sweep;
mod vllm_bench;
mod workloads;

use std::path::PathBuf;

/// Parses and resolves a scenario from TOML text.
pub fn scenario(text: &str) -> opal::Scenario {
    let file = opal::config::parse_spec(text, "test.toml").unwrap_or_else(|e| panic!("{e}"));
    opal::config::resolve(&file, "test.toml", std::path::Path::new(".")).unwrap_or_else(|e| panic!("{e}"))
}

/// The error a scenario's TOML text resolves to (it must not resolve).
pub fn scenario_err(text: &str) -> opal::config::ConfigError {
    let file = opal::config::parse_spec(text, "test.toml").unwrap_or_else(|e| panic!("{e}"));
    match opal::config::resolve(&file, "test.toml", std::path::Path::new(".")) {
        Ok(_) => panic!("resolved, but an error was expected:\n{text}"),
        Err(e) => e,
    }
}

/// A fresh temporary directory named after the test.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("opal-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs a scenario that must not fail.
pub fn run(scenario: &opal::Scenario) -> opal::RunOutput {
    opal::simulate(scenario).unwrap_or_else(|e| panic!("{e}"))
}
