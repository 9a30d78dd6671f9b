//! The `table` step model: measured step latencies from a CSV, and the
//! latency CSV format `opal-sweep calibrate` and `validate` read.

/// What a measured row times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Prefill: `batch` prompts of `tokens` tokens arriving together; the
    /// latency runs until the last of them has its first token.
    Prefill,
    /// Decode: `batch` sequences with `tokens` context tokens each; the
    /// latency is the mean time per output token (TPOT) while each
    /// generates `output_tokens` tokens (2, the default: one decode step).
    Decode,
}

/// One row of a latency CSV.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    /// What it times.
    pub phase: Phase,
    /// Prompts (prefill) or sequences (decode) together; default 1.
    pub batch: u64,
    /// Prompt tokens (prefill) or context tokens per sequence (decode).
    pub tokens: u64,
    /// Tokens each decoding sequence generates (decode rows; default 2).
    pub output_tokens: u64,
    /// Tensor-parallel degree the row was measured at (`None`: the command's).
    pub tp: Option<u32>,
    /// Measured seconds.
    pub latency_s: f64,
    /// Measured mean board power per GPU over the row's run, W.
    pub power_w: Option<f64>,
    /// Line in the file (for messages).
    pub line: u64,
}

/// The columns a latency CSV may have.
pub const COLUMNS: [&str; 7] = ["phase", "batch_size", "tokens", "latency_ms", "tp", "output_tokens", "power_w"];

/// Reads a latency CSV: header `phase,batch_size,tokens,latency_ms` and
/// optionally `tp`, `output_tokens`, `power_w` (lines starting with `#` are
/// comments; empty cells take their defaults). Errors name the file, line
/// and column; every number must be finite.
pub fn read_measured(path: &std::path::Path) -> Result<Vec<Measured>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_measured(&text, &path.display().to_string())
}

/// [`read_measured`] of text, `what` naming it in messages.
pub fn parse_measured(text: &str, what: &str) -> Result<Vec<Measured>, String> {
    let mut reader = csv::ReaderBuilder::new().trim(csv::Trim::All).comment(Some(b'#')).from_reader(text.as_bytes());
    let headers = reader.headers().map_err(|e| format!("{what}: {e}"))?.clone();
    if let Some(h) = headers.iter().find(|h| !COLUMNS.contains(h)) {
        return Err(format!("{what}: unknown column `{h}` (the columns are {})", COLUMNS.join(", ")));
    }
    for required in &COLUMNS[..4] {
        if !headers.iter().any(|h| h == *required) {
            return Err(format!(
                "{what}: no column `{required}` (expected at least phase,batch_size,tokens,latency_ms)"
            ));
        }
    }
    let mut rows = Vec::new();
    for record in reader.records() {
        let record = record.map_err(|e| format!("{what}:{}: {e}", e.position().map_or(0, |p| p.line())))?;
        let line = record.position().map_or(0, |p| p.line());
        let at = |col: &str| format!("{what}:{line}: column `{col}`");
        let cell = |col: &str| headers.iter().position(|h| h == col).and_then(|i| record.get(i)).unwrap_or("");
        let number = |col: &str| -> Result<Option<f64>, String> {
            let c = cell(col);
            if c.is_empty() {
                return Ok(None);
            }
            match c.parse::<f64>() {
                Ok(v) if v.is_finite() && v >= 0.0 => Ok(Some(v)),
                _ => Err(format!("{}: {c:?} is not a finite number ≥ 0", at(col))),
            }
        };
        let whole = |col: &str, least: f64| -> Result<Option<u64>, String> {
            match number(col)? {
                None => Ok(None),
                Some(v) if v.fract() == 0.0 && v >= least && v <= 1e12 => Ok(Some(v as u64)),
                Some(v) => Err(format!("{}: {v} is not a whole number ≥ {least}", at(col))),
            }
        };
        let phase = match cell("phase").to_ascii_lowercase().as_str() {
            "prefill" => Phase::Prefill,
            "decode" => Phase::Decode,
            other => return Err(format!("{}: {other:?} is neither `prefill` nor `decode`", at("phase"))),
        };
        let batch = whole("batch_size", 1.0)?;
        if phase == Phase::Decode && batch.is_none() {
            return Err(format!("{}: a decode row needs a batch size", at("batch_size")));
        }
        let tokens = whole("tokens", if phase == Phase::Prefill { 1.0 } else { 0.0 })?
            .ok_or_else(|| format!("{}: every row needs a token count", at("tokens")))?;
        let latency_ms =
            number("latency_ms")?.ok_or_else(|| format!("{}: every row needs a latency", at("latency_ms")))?;
        let tp = match whole("tp", 1.0)? {
            Some(t) if t <= 1024 => Some(t as u32),
            Some(t) => return Err(format!("{}: {t} GPUs per worker; at most 1024", at("tp"))),
            None => None,
        };
        let output_tokens = whole("output_tokens", 2.0)?.unwrap_or(2);
        rows.push(Measured {
            phase,
            batch: batch.unwrap_or(1),
            tokens,
            output_tokens,
            tp,
            latency_s: latency_ms / 1e3,
            power_w: number("power_w")?,
            line,
        });
    }
    Ok(rows)
}

/// Measured latencies as the `table` step model takes them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatencyRows {
    /// Prefill rows: (prompt tokens from an empty cache, seconds).
    pub prefill: Vec<(f64, f64)>,
    /// Decode rows: (batch size, context tokens per sequence, seconds per step).
    pub decode: Vec<(f64, f64, f64)>,
}

impl LatencyRows {
    /// Reads a latency CSV ([`read_measured`]) as the table model takes it:
    /// prefill rows of one prompt, decode rows of one step.
    pub fn from_csv(path: &std::path::Path) -> Result<LatencyRows, String> {
        let mut rows = LatencyRows::default();
        for r in read_measured(path)? {
            let at = format!("{}:{}", path.display(), r.line);
            match r.phase {
                Phase::Prefill if r.batch != 1 => {
                    return Err(format!("{at}: the table model takes prefill rows of one prompt (batch_size 1)"));
                }
                Phase::Prefill => rows.prefill.push((r.tokens as f64, r.latency_s)),
                Phase::Decode if r.output_tokens != 2 => {
                    return Err(format!("{at}: the table model takes decode rows of one step (output_tokens 2)"));
                }
                Phase::Decode => rows.decode.push((r.batch as f64, r.tokens as f64, r.latency_s)),
            }
        }
        Ok(rows)
    }
}

/// Measured step latencies.
///
/// Prefill rows give the latency `T(n)` of prefilling `n` tokens from an
/// empty cache, linear between rows and along the last segment above the
/// last; below the first row `T` runs to the step's fixed cost `f` at 0 (the
/// first two rows' line at 0, within `[0, T(first)]`; 0 with one row).
/// Decode rows give the latency of one decode step for a batch of
/// `batch_size` sequences with `tokens` context tokens *per sequence*; they
/// must form a full grid and are interpolated bilinearly (linearly
/// extrapolated outside it).
///
/// A step's fixed cost is paid once, whatever it holds: its prefill chunks
/// cost `T(N)` for their `N` tokens together, plus for a chunk `p → n`
/// after cached tokens the attention it adds over a prompt of its length,
/// `T(n) − T(p) − (T(n − p) − f)` (when positive); a mixed step with the
/// `sum` rule adds its decode part less the fixed cost the two share
/// (`min(f, decode)`), with `max` the longer part.
#[derive(Clone, Debug, PartialEq)]
pub struct LatencyTable {
    /// (tokens, seconds), strictly increasing tokens.
    pub prefill: Vec<(f64, f64)>,
    /// Batch sizes of the decode grid, strictly increasing.
    pub decode_batches: Vec<f64>,
    /// Per-sequence context sizes of the decode grid, strictly increasing.
    pub decode_contexts: Vec<f64>,
    /// Seconds, row-major: `decode_secs[i * contexts + j]` is (batch i, context j).
    pub decode_secs: Vec<f64>,
}

impl LatencyTable {
    /// Reads a CSV with header `phase,batch_size,tokens,latency_ms`
    /// (`batch_size` is ignored on prefill rows and may be empty).
    pub fn from_csv(path: &std::path::Path) -> Result<LatencyTable, String> {
        let rows = LatencyRows::from_csv(path)?;
        Self::from_rows(rows.prefill, rows.decode).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Builds the table from prefill (tokens, s) and decode (batch, context, s) rows.
    pub fn from_rows(mut prefill: Vec<(f64, f64)>, decode: Vec<(f64, f64, f64)>) -> Result<LatencyTable, String> {
        if prefill.is_empty() || decode.is_empty() {
            return Err("the table needs at least one prefill row and one decode row".into());
        }
        prefill.sort_by(|x, y| x.0.total_cmp(&y.0));
        if prefill.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err("two prefill rows have the same token count".into());
        }
        let mut batches: Vec<f64> = decode.iter().map(|r| r.0).collect();
        let mut contexts: Vec<f64> = decode.iter().map(|r| r.1).collect();
        for v in [&mut batches, &mut contexts] {
            v.sort_by(f64::total_cmp);
            v.dedup();
        }
        if batches.len() * contexts.len() != decode.len() {
            return Err(format!(
                "decode rows must form a full grid: {} batch sizes × {} contexts needs {} rows, found {}",
                batches.len(),
                contexts.len(),
                batches.len() * contexts.len(),
                decode.len()
            ));
        }
        let mut grid = vec![f64::NAN; decode.len()];
        for (b, c, s) in decode {
            let i = batches.iter().position(|&x| x == b).expect("batch value came from the rows");
            let j = contexts.iter().position(|&x| x == c).expect("context value came from the rows");
            grid[i * contexts.len() + j] = s;
        }
        if grid.iter().any(|s| s.is_nan()) {
            return Err("a (batch_size, tokens) pair appears twice in the decode rows".into());
        }
        Ok(LatencyTable { prefill, decode_batches: batches, decode_contexts: contexts, decode_secs: grid })
    }

    /// The prefill curve's value at 0 tokens: the fixed cost of a step.
    pub fn fixed_secs(&self) -> f64 {
        match self.prefill[..] {
            [(x0, y0), (x1, y1), ..] => lerp(x0, y0, x1, y1, 0.0).clamp(0.0, y0),
            _ => 0.0,
        }
    }

    fn prefill_cumulative(&self, tokens: f64) -> f64 {
        let pts = &self.prefill;
        let (x0, y0, x1, y1) = match pts.iter().position(|&(x, _)| x >= tokens) {
            Some(0) => (0.0, self.fixed_secs(), pts[0].0, pts[0].1),
            Some(i) => (pts[i - 1].0, pts[i - 1].1, pts[i].0, pts[i].1),
            None if pts.len() == 1 => (0.0, 0.0, pts[0].0, pts[0].1),
            None => {
                let n = pts.len();
                (pts[n - 2].0, pts[n - 2].1, pts[n - 1].0, pts[n - 1].1)
            }
        };
        lerp(x0, y0, x1, y1, tokens)
    }

    /// Seconds of a step's prefill chunks together (see the type's docs).
    pub fn prefill_secs(&self, chunks: &[super::PrefillChunk]) -> f64 {
        if chunks.is_empty() {
            return 0.0;
        }
        let t = |x: u64| self.prefill_cumulative(x as f64);
        let f = self.fixed_secs();
        let tokens: u64 = chunks.iter().map(|c| c.end - c.cached).sum();
        let attention: f64 = chunks
            .iter()
            .filter(|c| c.cached > 0)
            .map(|c| (t(c.end) - t(c.cached) - (t(c.end - c.cached) - f)).max(0.0))
            .sum();
        t(tokens) + attention
    }

    /// Seconds of a step: its prefill chunks and decoding sequences combined by `mix`.
    pub fn step_secs(&self, work: &super::StepWork<'_>, mix: super::MixRule) -> f64 {
        let prefill = self.prefill_secs(work.prefill);
        let decode = if work.decodes > 0 { self.decode_secs(work.decodes, work.decode_context_tokens) } else { 0.0 };
        match mix {
            super::MixRule::Max => prefill.max(decode),
            super::MixRule::Sum if prefill > 0.0 && decode > 0.0 => prefill + decode - self.fixed_secs().min(decode),
            super::MixRule::Sum => prefill + decode,
        }
    }

    /// Seconds of a decode step over `batch` sequences with `context_tokens` in total.
    pub fn decode_secs(&self, batch: u64, context_tokens: u64) -> f64 {
        let per_seq = context_tokens as f64 / batch as f64;
        let (i0, i1) = bracket(&self.decode_batches, batch as f64);
        let (j0, j1) = bracket(&self.decode_contexts, per_seq);
        let nc = self.decode_contexts.len();
        let at = |i: usize, j: usize| self.decode_secs[i * nc + j];
        let (c0, c1) = (self.decode_contexts[j0], self.decode_contexts[j1]);
        let row = |i: usize| lerp(c0, at(i, j0), c1, at(i, j1), per_seq);
        let (b0, b1) = (self.decode_batches[i0], self.decode_batches[i1]);
        lerp(b0, row(i0), b1, row(i1), batch as f64).max(0.0)
    }
}

/// Indices of the grid points bracketing `x` (the edge segment outside the grid).
fn bracket(grid: &[f64], x: f64) -> (usize, usize) {
    if grid.len() == 1 {
        return (0, 0);
    }
    let i = grid.iter().position(|&g| g >= x).unwrap_or(grid.len() - 1).max(1);
    (i - 1, i)
}

fn lerp(x0: f64, y0: f64, x1: f64, y1: f64, x: f64) -> f64 {
    if x1 == x0 { y0 } else { y0 + (y1 - y0) * (x - x0) / (x1 - x0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_interpolates_prefill_differences_and_decode_bilinearly() {
        let t = LatencyTable::from_rows(
            vec![(1000.0, 0.010), (2000.0, 0.030)],
            vec![(1.0, 100.0, 0.001), (1.0, 200.0, 0.002), (3.0, 100.0, 0.003), (3.0, 200.0, 0.005)],
        )
        .unwrap();
        // The first two rows' line meets 0 tokens at −0.010 s: the fixed cost is held at 0.
        assert_eq!(t.fixed_secs(), 0.0);
        // T(500) = 0.005 (through the origin), T(1000) = 0.010, T(1500) = 0.020, T(3000) = 0.050 (last slope).
        // A chunk 500 → 1500 costs T(1000) plus what its prefix adds: 0.020 − 0.005 − (0.010 − 0) = 0.005.
        let chunk = |cached, end| crate::worker::perf::PrefillChunk { cached, end };
        assert!((t.prefill_secs(&[chunk(500, 1500)]) - 0.015).abs() < 1e-12);
        assert!((t.prefill_secs(&[chunk(2000, 3000)]) - (0.010 + 0.050 - 0.030 - 0.010)).abs() < 1e-12);
        // Batch 2 at 150 tokens/seq: row b=1 → 0.0015, row b=3 → 0.004, midpoint → 0.00275.
        assert!((t.decode_secs(2, 300) - 0.00275).abs() < 1e-12);
        assert!(
            LatencyTable::from_rows(vec![(1.0, 1.0)], vec![(1.0, 1.0, 1.0), (2.0, 2.0, 1.0)])
                .unwrap_err()
                .contains("full grid")
        );
    }

    #[test]
    fn a_tables_fixed_cost_is_charged_once_per_step() {
        // Prefill 48 ms at 100 tokens and 52 ms at 300 (a flat curve: 46 ms fixed), 87 ms at 1,200.
        let t = LatencyTable::from_rows(
            vec![(100.0, 0.048), (300.0, 0.052), (1200.0, 0.087)],
            vec![(1.0, 100.0, 0.020), (8.0, 100.0, 0.030)],
        )
        .unwrap();
        assert!((t.fixed_secs() - 0.046).abs() < 1e-12);
        let chunk = |cached, end| crate::worker::perf::PrefillChunk { cached, end };
        // Four 300-token prompts in one step cost T(1200) = 87 ms, not 4 × 52 ms.
        let four = [chunk(0, 300); 4];
        assert!((t.prefill_secs(&four) - 0.087).abs() < 1e-12);
        // A mixed step with the sum rule pays the 46 ms once: 87 + 20 − 20 (the decode part is below f).
        let work = crate::worker::perf::StepWork {
            prefill: &four,
            decodes: 1,
            drafts: 0,
            decode_context_tokens: 100,
            decode_window_tokens: 100,
            samples: 5,
        };
        assert!((t.step_secs(&work, crate::worker::perf::MixRule::Sum) - 0.087).abs() < 1e-12);
        assert!((t.step_secs(&work, crate::worker::perf::MixRule::Max) - 0.087).abs() < 1e-12);
    }
}
