//! What people read: terminal summaries ([`text`]) and the sweep report
//! (`opal-sweep report`): an `index.html` with a summary table and figures
//! drawn with `plotters` as SVG (and PNG on request), made from a results directory's
//! Parquet tables and manifest alone ([`data`]).

pub mod data;
pub mod figures;
mod html;
pub mod text;
pub mod timeline;

use std::path::{Path, PathBuf};

/// Why a report could not be made.
#[derive(Debug)]
pub enum ReportError {
    /// The results directory is missing, incomplete or unreadable.
    Input(String),
    /// Writing the report failed.
    Output(String),
}

impl std::fmt::Display for ReportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReportError::Input(m) | ReportError::Output(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ReportError {}

/// What a report contains.
#[derive(Clone, Debug)]
pub struct ReportSummary {
    /// The page.
    pub index: PathBuf,
    /// Figures drawn.
    pub figures: usize,
    /// Figure files written (SVG, and PNG if asked for), in page order.
    pub files: Vec<PathBuf>,
    /// Successful runs drawn.
    pub runs: usize,
    /// Failed runs left out.
    pub failed: usize,
    /// Figures left out, with the reason.
    pub skipped: Vec<String>,
}

/// Writes `bytes` to `path` through a temporary file and a rename, so a
/// reader never sees half a file.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    std::fs::write(&tmp, bytes)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|e| ReportError::Output(format!("{}: cannot write: {e}", path.display())))
}

/// The default report directory of a results directory.
pub fn default_dir(results: &Path) -> PathBuf {
    results.join("report")
}

/// Reads the results in `results` and writes the report into `out`
/// (created if needed; an earlier report there is replaced, figures it had
/// that this one lacks are removed). Figures are SVG; `png` adds a PNG of
/// each, which the page then shows (linking to the SVG).
pub fn write_report(results: &Path, out: &Path, png: bool) -> Result<ReportSummary, ReportError> {
    let data = data::SweepData::load(results)?;
    std::fs::create_dir_all(out).map_err(|e| ReportError::Output(format!("{}: cannot create: {e}", out.display())))?;
    let drawn = figures::draw_all(&data, out, png)?;
    let index = out.join("index.html");
    write_atomic(&index, html::page(&data, &drawn).as_bytes())?;
    Ok(ReportSummary {
        index,
        figures: drawn.figures.len(),
        files: drawn.figures.iter().flat_map(|f| f.png.iter().chain([&f.svg]).map(|name| out.join(name))).collect(),
        runs: data.ok_runs(),
        failed: data.failed.len(),
        skipped: drawn.skipped.clone(),
    })
}
