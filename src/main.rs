//! `opal-sweep`: the command-line front end. It parses the command line
//! and maps a failure to its exit code; the commands live in `opal::cli`.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    opal::cli::execute(opal::cli::Cli::parse()).unwrap_or_else(opal::cli::Failure::exit)
}
