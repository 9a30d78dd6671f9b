//! Holding the step model against measurements: each measured row is run
//! through the simulator as a user would time it (black box), and the
//! `operators` model's five constants are fitted so the runs reproduce the
//! measurements (`opal-sweep calibrate`), with the error of the default
//! and the fitted model on the shipped measurement sets
//! (`opal-sweep validate`, [`sets`]).
//!
//! **A row as a run** ([`bench`](mod@bench)): a prefill row is `batch` prompts of
//! `tokens` tokens arriving together (`request_rate = inf`), timed until
//! the last first token; a decode row is `batch` prompts of `tokens`
//! tokens generating `output_tokens` tokens each, timed by their mean
//! TPOT. One worker with room for every sequence (the KV pool is not what
//! is measured), a token budget that prefills the whole batch in one step,
//! prefix caching off.
//!
//! **Why the fit is exact** ([`fit`]): a step's time is linear in the
//! constants ([`crate::worker::perf::operators::StepCost::secs`]), and a
//! burst's schedule does not depend on how long its steps take (nothing
//! arrives while it runs), so every row's timing is linear in the constants
//! too: `latency = F · c`. Running the row once with each constant set to 1
//! and the others to 0 gives `F`; the fit minimises the squared relative
//! residuals `Σ (F·c / measured − 1)²` within bounds; the residuals it
//! prints are from runs with the fitted constants. Leave-one-out
//! cross-validation refits without each row in turn and predicts it.
//! Rows with measured power fit the power model's `active`, `compute` and
//! `memory` watts the same way (mean power over a run is linear in them).

pub mod bench;
pub mod fit;
pub mod sets;

pub use bench::{ModelRef, ProfileChoice, RowRun, Setup};
pub use fit::{Calibration, FitOptions, calibrate};
