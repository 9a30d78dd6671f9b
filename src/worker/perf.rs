//! Step-time models: how long one scheduler step (one forward pass over the
//! batch) takes.
//!
//! A step has a prefill part (chunks of prompt tokens, each with the number of
//! tokens already in the KV cache) and a decode part (one token for each
//! decoding sequence, reading its KV context). The models:
//!
//! * `roofline` — Opal's analytic model. A prefill chunk taking a sequence
//!   from `p` to `n` computed tokens costs
//!   `L·(a·(n(n+1) − p(p+1))·d + b·(n−p)·d²) / (tflops·tp·10¹²)` seconds; the
//!   decode part costs `(weight_bytes + Σ kv_bytes(context)) / (tp·mem_bw)`,
//!   charged on every step because every forward pass streams the weights
//!   (as Opal does). Chunks of one step add up (their FLOPs add; Opal takes
//!   the max over requests, which under-charges batched prefill — a deliberate
//!   difference).
//! * `synthetic` — every step takes the same fixed time.
//! * `table` — measured latencies, linearly interpolated (see [`LatencyTable`]).
//!
//! Prefill and decode parts combine by [`MixRule`]: `max` (Opal's rule) or `sum`.

use crate::time::SimDuration;

/// One prefill chunk in a step: the sequence goes from `cached` to `end` computed tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillChunk {
    /// Tokens already in the KV cache before the chunk (p).
    pub cached: u64,
    /// Tokens in the KV cache after the chunk (n).
    pub end: u64,
}

/// The work of one step.
#[derive(Clone, Copy, Debug)]
pub struct StepWork<'a> {
    /// Prefill chunks.
    pub prefill: &'a [PrefillChunk],
    /// Decoding sequences (one new token each).
    pub decodes: u64,
    /// Σ over decoding sequences of the tokens already in their KV cache.
    pub decode_context_tokens: u64,
}

/// How a step's prefill and decode parts combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixRule {
    /// The step takes the longer of the two parts (Opal).
    Max,
    /// The step takes both parts back to back.
    Sum,
}

impl MixRule {
    fn combine(self, prefill: f64, decode: f64) -> f64 {
        match self {
            MixRule::Max => prefill.max(decode),
            MixRule::Sum => prefill + decode,
        }
    }
}

/// Opal's analytic roofline, with every constant resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Roofline {
    /// Layers L.
    pub layers: f64,
    /// Hidden size d.
    pub hidden: f64,
    /// Attention coefficient a.
    pub a: f64,
    /// Dense coefficient b.
    pub b: f64,
    /// Aggregate FLOP/s of the worker (tflops · tp · 10¹²).
    pub flops_per_sec: f64,
    /// Aggregate HBM bytes/s of the worker (mem_bw_TBps · tp · 10¹²).
    pub mem_bytes_per_sec: f64,
    /// Weight bytes read per forward pass.
    pub weight_bytes: f64,
    /// KV bytes per token.
    pub kv_bytes_per_token: f64,
}

impl Roofline {
    /// Seconds to prefill from `p` to `n` computed tokens.
    pub fn prefill_secs(&self, p: u64, n: u64) -> f64 {
        debug_assert!(n >= p, "prefill chunk ends before it starts");
        let (p, n) = (p as f64, n as f64);
        self.layers
            * (self.a * (n * (n + 1.0) - p * (p + 1.0)) * self.hidden + self.b * (n - p) * self.hidden * self.hidden)
            / self.flops_per_sec
    }

    /// Seconds of the decode part (weights plus KV context streamed from HBM).
    pub fn decode_secs(&self, context_tokens: u64) -> f64 {
        (self.weight_bytes + self.kv_bytes_per_token * context_tokens as f64) / self.mem_bytes_per_sec
    }
}

/// Measured step latencies.
///
/// Prefill rows give the latency of prefilling `tokens` tokens from an empty
/// cache; a chunk from `p` to `n` costs `T(n) − T(p)` with `T` linear between
/// rows, through (0, 0) below the first row and along the last segment above
/// the last. Decode rows give the latency of one decode step for a batch of
/// `batch_size` sequences with `tokens` context tokens *per sequence*; they
/// must form a full grid and are interpolated bilinearly (linearly
/// extrapolated outside it).
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
        #[derive(serde::Deserialize)]
        struct Row {
            phase: String,
            batch_size: Option<f64>,
            tokens: f64,
            latency_ms: f64,
        }
        let where_ =
            |line: Option<u64>| format!("{}{}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default());
        let mut reader = csv::ReaderBuilder::new()
            .trim(csv::Trim::All)
            .from_path(path)
            .map_err(|e| format!("{}: {e}", where_(None)))?;
        let mut prefill = Vec::new();
        let mut decode = Vec::new();
        for row in reader.deserialize::<Row>() {
            let row = row.map_err(|e| {
                let line = e.position().map(|p| p.line());
                format!("{}: {e} (expected columns phase,batch_size,tokens,latency_ms)", where_(line))
            })?;
            if !(row.latency_ms >= 0.0 && row.tokens >= 0.0) {
                return Err(format!("{}: tokens and latency_ms must be non-negative numbers", where_(None)));
            }
            match row.phase.to_ascii_lowercase().as_str() {
                "prefill" => prefill.push((row.tokens, row.latency_ms / 1e3)),
                "decode" => {
                    let b = row.batch_size.ok_or_else(|| format!("{}: a decode row needs batch_size", where_(None)))?;
                    decode.push((b, row.tokens, row.latency_ms / 1e3));
                }
                other => return Err(format!("{}: phase {other:?} is neither `prefill` nor `decode`", where_(None))),
            }
        }
        Self::from_rows(prefill, decode).map_err(|e| format!("{}: {e}", where_(None)))
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

    fn prefill_cumulative(&self, tokens: f64) -> f64 {
        let pts = &self.prefill;
        let (x0, y0, x1, y1) = match pts.iter().position(|&(x, _)| x >= tokens) {
            Some(0) => (0.0, 0.0, pts[0].0, pts[0].1),
            Some(i) => (pts[i - 1].0, pts[i - 1].1, pts[i].0, pts[i].1),
            None if pts.len() == 1 => (0.0, 0.0, pts[0].0, pts[0].1),
            None => {
                let n = pts.len();
                (pts[n - 2].0, pts[n - 2].1, pts[n - 1].0, pts[n - 1].1)
            }
        };
        lerp(x0, y0, x1, y1, tokens)
    }

    /// Seconds to prefill from `p` to `n` computed tokens.
    pub fn prefill_secs(&self, p: u64, n: u64) -> f64 {
        (self.prefill_cumulative(n as f64) - self.prefill_cumulative(p as f64)).max(0.0)
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

/// A resolved step-time model.
#[derive(Clone, Debug, PartialEq)]
pub enum StepModel {
    /// Opal's analytic roofline.
    Roofline(Roofline),
    /// A fixed time per step.
    Synthetic(SimDuration),
    /// Measured latencies.
    Table(LatencyTable),
}

/// A step-time model with its mix rule.
#[derive(Clone, Debug, PartialEq)]
pub struct PerfModel {
    /// The model.
    pub model: StepModel,
    /// How prefill and decode parts combine.
    pub mix: MixRule,
}

impl PerfModel {
    /// Duration of one step (at least 1 ns; rounding per [`SimDuration::from_secs_f64`]).
    pub fn step_time(&self, work: &StepWork<'_>) -> SimDuration {
        let secs = match &self.model {
            StepModel::Synthetic(d) => return *d,
            StepModel::Roofline(r) => {
                let prefill: f64 = work.prefill.iter().map(|c| r.prefill_secs(c.cached, c.end)).sum();
                self.mix.combine(prefill, r.decode_secs(work.decode_context_tokens))
            }
            StepModel::Table(t) => {
                let prefill: f64 = work.prefill.iter().map(|c| t.prefill_secs(c.cached, c.end)).sum();
                let decode =
                    if work.decodes > 0 { t.decode_secs(work.decodes, work.decode_context_tokens) } else { 0.0 };
                self.mix.combine(prefill, decode)
            }
        };
        SimDuration::from_secs_f64(secs).max(SimDuration(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy_roofline() -> Roofline {
        // L = 2, d = 10, a = 4, b = 24, 1e6 FLOP/s, 1e3 B/s, 500 B weights, 10 B/token.
        Roofline {
            layers: 2.0,
            hidden: 10.0,
            a: 4.0,
            b: 24.0,
            flops_per_sec: 1e6,
            mem_bytes_per_sec: 1e3,
            weight_bytes: 500.0,
            kv_bytes_per_token: 10.0,
        }
    }

    #[test]
    fn roofline_prefill_matches_opal_formula_by_hand() {
        let r = toy_roofline();
        // p = 0, n = 10: 2·(4·110·10 + 24·10·100)/1e6 = 2·(4400 + 24000)/1e6 = 0.0568 s.
        assert!((r.prefill_secs(0, 10) - 0.0568).abs() < 1e-15);
        // p = 10, n = 20: 2·(4·(420 − 110)·10 + 24·10·100)/1e6 = 2·(12400 + 24000)/1e6 = 0.0728 s.
        assert!((r.prefill_secs(10, 20) - 0.0728).abs() < 1e-15);
    }

    #[test]
    fn mixed_step_takes_max_or_sum_of_prefill_sum_and_decode() {
        let r = toy_roofline();
        let chunks = [PrefillChunk { cached: 0, end: 10 }, PrefillChunk { cached: 10, end: 20 }];
        let work = StepWork { prefill: &chunks, decodes: 3, decode_context_tokens: 30 };
        // prefill = 0.0568 + 0.0728 = 0.1296 s; decode = (500 + 10·30)/1e3 = 0.8 s.
        let max = PerfModel { model: StepModel::Roofline(r.clone()), mix: MixRule::Max };
        assert_eq!(max.step_time(&work), SimDuration(800_000_000));
        let sum = PerfModel { model: StepModel::Roofline(r), mix: MixRule::Sum };
        assert_eq!(sum.step_time(&work), SimDuration(929_600_000));
    }

    #[test]
    fn synthetic_steps_take_the_fixed_time_whatever_the_work() {
        let m = PerfModel { model: StepModel::Synthetic(SimDuration(5)), mix: MixRule::Max };
        let chunks = [PrefillChunk { cached: 0, end: 1000 }];
        assert_eq!(m.step_time(&StepWork { prefill: &chunks, decodes: 9, decode_context_tokens: 99 }), SimDuration(5));
    }

    #[test]
    fn table_interpolates_prefill_differences_and_decode_bilinearly() {
        let t = LatencyTable::from_rows(
            vec![(1000.0, 0.010), (2000.0, 0.030)],
            vec![(1.0, 100.0, 0.001), (1.0, 200.0, 0.002), (3.0, 100.0, 0.003), (3.0, 200.0, 0.005)],
        )
        .unwrap();
        // T(500) = 0.005 (through the origin), T(1500) = 0.020, T(3000) = 0.050 (last slope).
        assert!((t.prefill_secs(500, 1500) - 0.015).abs() < 1e-12);
        assert!((t.prefill_secs(2000, 3000) - 0.020).abs() < 1e-12);
        // Batch 2 at 150 tokens/seq: row b=1 → 0.0015, row b=3 → 0.004, midpoint → 0.00275.
        assert!((t.decode_secs(2, 300) - 0.00275).abs() < 1e-12);
        assert!(
            LatencyTable::from_rows(vec![(1.0, 1.0)], vec![(1.0, 1.0, 1.0), (2.0, 2.0, 1.0)])
                .unwrap_err()
                .contains("full grid")
        );
    }
}
