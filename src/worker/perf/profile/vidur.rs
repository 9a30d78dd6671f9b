//! Vidur's operator profiles (microsoft/vidur, MIT): per-layer operator
//! times of one model at one tensor-parallel degree, measured by its
//! profiler and stored as `data/profiling/compute/<gpu>/<model>/mlp.csv`
//! (and `attention.csv`). Times are milliseconds, in columns
//! `time_stats.<operator>.median`, one row per (`num_tokens`,
//! `num_tensor_parallel_workers`) with the model's shape (`n_head`,
//! `n_kv_head`, `n_embd`, `n_expanded_embd`, `vocab_size`).
//!
//! Vidur fits a random forest per operator on these rows; here an
//! operator's time is interpolated linearly in the token count between
//! measured rows and held at the end rows' per-token rate beyond them
//! (Vidur's own predictions on the profiled range are compared in
//! `opal-sweep validate`).

use super::grid::{Grid, Node};
use super::{Elementwise, Role};
use std::path::Path;

/// One operator's measured curve: (tokens, seconds), increasing tokens.
type OpCurve = Vec<(f64, f64)>;

/// The operators of `mlp.csv` Opal uses, by Vidur's names.
const OPS: [&str; 10] = [
    "attn_pre_proj",
    "attn_post_proj",
    "mlp_up_proj",
    "mlp_down_proj",
    "mlp_act",
    "attn_rope",
    "input_layernorm",
    "post_attention_layernorm",
    "add",
    "emb",
];

/// A Vidur profile of one model at one TP degree.
#[derive(Clone, Debug)]
pub struct VidurProfile {
    /// Where it was read from.
    pub path: String,
    /// Curves in [`OPS`] order.
    ops: Vec<OpCurve>,
    /// Prefill attention per layer: (chunk, cached tokens) → seconds.
    prefill: Option<Grid>,
    /// Decode attention per layer: (batch, cached tokens) → seconds.
    decode: Option<Grid>,
}

/// The attention grids of an `attention.csv` (its rows of `shape`).
fn attention_grids(text: &str, what: &str, shape: VidurShape) -> Result<(Option<Grid>, Option<Grid>), String> {
    let mut csv = Csv::new(text, what)?;
    let prefill_flag = csv
        .index("is_prefill")
        .ok_or_else(|| format!("{what}: no column `is_prefill` (a Vidur attention.csv has it)"))?;
    let [q_heads, kv_heads, hidden, tp, kv, chunk, prefill_ms, batch, decode_ms] = [
        "n_q_head",
        "n_kv_head",
        "n_embd",
        "num_tensor_parallel_workers",
        "kv_cache_size",
        "prefill_chunk_size",
        "time_stats.attn_prefill.median",
        "batch_size",
        "time_stats.attn_decode.median",
    ]
    .map(|name| csv.column(name));
    let (mut prefill, mut decode) = (Node::default(), Node::default());
    let (mut any_p, mut any_d) = (false, false);
    while csv.next()? {
        let row =
            (csv.num(&q_heads)? as u64, csv.num(&kv_heads)? as u64, csv.num(&hidden)? as u64, csv.num(&tp)? as u32);
        if row != (shape.heads, shape.kv_heads, shape.hidden, shape.tp) {
            continue;
        }
        let kv = csv.num(&kv)? as i64;
        if csv.cell(prefill_flag).eq_ignore_ascii_case("true") {
            prefill.insert(&[csv.num(&chunk)? as i64, kv], csv.num(&prefill_ms)? / 1e3);
            any_p = true;
        } else {
            decode.insert(&[csv.num(&batch)? as i64, kv], csv.num(&decode_ms)? / 1e3);
            any_d = true;
        }
    }
    Ok((any_p.then(|| Grid::new(prefill)), any_d.then(|| Grid::new(decode))))
}

/// The shape a profile must have been measured on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VidurShape {
    /// Query heads.
    pub heads: u64,
    /// KV heads.
    pub kv_heads: u64,
    /// Hidden size.
    pub hidden: u64,
    /// MLP width.
    pub intermediate: u64,
    /// Tensor-parallel degree.
    pub tp: u32,
}

fn interp(curve: &OpCurve, x: f64) -> f64 {
    // The curve's token counts are increasing and distinct.
    let i = curve.partition_point(|p| p.0 < x);
    if let Some(&(_, v)) = curve.get(i).filter(|p| p.0 == x) {
        return v;
    }
    let n = curve.len();
    if n == 1 {
        return curve[0].1 * x / curve[0].0;
    }
    if i == 0 {
        // Below the first row: the first row's time (small operators do not get faster).
        return curve[0].1;
    }
    if i == n {
        let (x1, y1) = curve[n - 1];
        return y1 * x / x1;
    }
    let (x0, y0) = curve[i - 1];
    let (x1, y1) = curve[i];
    y0 + (y1 - y0) * (x - x0) / (x1 - x0)
}

/// A Vidur CSV read row by row: its columns are looked up by name once,
/// and only the cells read are trimmed and parsed (trimming every cell of
/// every row, and finding each column by name in each row, cost 30 M
/// instructions on a 1,750-row profile: most of a Vidur-profile run).
/// A file without quotes or carriage returns (as Vidur's profiler writes
/// them, through pandas) is split on its commas and newlines directly;
/// any other goes through the `csv` crate (its parser, 16 instructions a
/// byte, took 5 M of the 1,750 rows).
struct Csv<'a> {
    rows: Rows<'a>,
    headers: Vec<String>,
    /// The current row's cells (plain files).
    cells: Vec<&'a str>,
    /// The current row's line number (plain files).
    line: u64,
    what: &'a str,
}

/// Where a [`Csv`]'s rows come from.
enum Rows<'a> {
    /// A plain file's text after the current row, and the lines read.
    Plain(&'a str, u64),
    /// The `csv` crate's reader, and its current record.
    Quoted(Box<csv::Reader<&'a [u8]>>, csv::StringRecord),
}

/// A column of a [`Csv`] by name: its index, or the error its absence gives
/// when a row needs it.
struct Column<'n> {
    name: &'n str,
    index: Option<usize>,
}

impl<'a> Csv<'a> {
    /// The CSV `text` (`what` names it in errors), positioned before its first row.
    fn new(text: &'a str, what: &'a str) -> Result<Csv<'a>, String> {
        let quoted = memchr::memchr2(b'"', b'\r', text.as_bytes()).is_some();
        if quoted { Csv::quoted(text, what) } else { Csv::plain(text, what) }
    }

    /// [`Self::new`] through the `csv` crate.
    fn quoted(text: &'a str, what: &'a str) -> Result<Csv<'a>, String> {
        let mut reader = csv::ReaderBuilder::new().trim(csv::Trim::Headers).from_reader(text.as_bytes());
        let headers = reader.headers().map_err(|e| format!("{what}: {e}"))?.iter().map(String::from).collect();
        let rows = Rows::Quoted(Box::new(reader), csv::StringRecord::new());
        Ok(Csv { rows, headers, cells: Vec::new(), line: 0, what })
    }

    /// [`Self::new`] for a file without quotes or carriage returns: as the
    /// `csv` crate reads one (a byte-order mark dropped, blank lines skipped,
    /// headers trimmed, every row as many cells as the header).
    fn plain(text: &'a str, what: &'a str) -> Result<Csv<'a>, String> {
        let rows = Rows::Plain(text.strip_prefix('\u{feff}').unwrap_or(text), 0);
        let mut csv = Csv { rows, headers: Vec::new(), cells: Vec::new(), line: 0, what };
        if csv.next_plain() {
            csv.headers = csv.cells.iter().map(|h| h.trim().to_string()).collect();
        }
        Ok(csv)
    }

    /// A plain file's next non-blank line into `cells` (`false` at the end).
    fn next_plain(&mut self) -> bool {
        let Rows::Plain(rest, lines) = &mut self.rows else { unreachable!("a plain file") };
        loop {
            if rest.is_empty() {
                return false;
            }
            let end = memchr::memchr(b'\n', rest.as_bytes()).unwrap_or(rest.len());
            let line = &rest[..end];
            *rest = rest.get(end + 1..).unwrap_or("");
            *lines += 1;
            if line.is_empty() {
                continue;
            }
            self.line = *lines;
            self.cells.clear();
            // (`str::split` cost 130 instructions a cell, most of the reading.)
            let mut start = 0;
            for i in memchr::memchr_iter(b',', line.as_bytes()) {
                self.cells.push(&line[start..i]);
                start = i + 1;
            }
            self.cells.push(&line[start..]);
            return true;
        }
    }

    /// The index of the column `name`.
    fn index(&self, name: &str) -> Option<usize> {
        self.headers.iter().position(|h| h == name)
    }

    /// The column `name` (an error only when a row reads it).
    fn column<'n>(&self, name: &'n str) -> Column<'n> {
        Column { name, index: self.index(name) }
    }

    /// Moves to the next row (`false` at the end).
    fn next(&mut self) -> Result<bool, String> {
        let what = self.what;
        match &mut self.rows {
            Rows::Quoted(reader, record) => reader.read_record(record).map_err(|e| format!("{what}: {e}")),
            Rows::Plain(..) => {
                if !self.next_plain() {
                    return Ok(false);
                }
                if self.cells.len() != self.headers.len() {
                    let (n, h) = (self.cells.len(), self.headers.len());
                    return Err(format!("{what}:{}: {n} fields, but the header has {h}", self.line));
                }
                Ok(true)
            }
        }
    }

    /// The current row's cell `i`, trimmed (empty if the row is short).
    fn cell(&self, i: usize) -> &str {
        let cell = match &self.rows {
            Rows::Quoted(_, record) => record.get(i),
            Rows::Plain(..) => self.cells.get(i).copied(),
        };
        let cell = cell.unwrap_or("");
        // Trimmed only when it has to be (`trim` costs more than the parse of a short number).
        match (cell.as_bytes().first(), cell.as_bytes().last()) {
            (Some(a), Some(b)) if a.is_ascii_graphic() && b.is_ascii_graphic() => cell,
            _ => cell.trim(),
        }
    }

    /// The current row's line number.
    fn line(&self) -> u64 {
        match &self.rows {
            Rows::Quoted(_, record) => record.position().map_or(0, |p| p.line()),
            Rows::Plain(..) => self.line,
        }
    }

    /// The current row's value of `column` as a number (`what:line` in errors).
    fn num(&self, column: &Column) -> Result<f64, String> {
        let (what, name) = (self.what, column.name);
        let i = column.index.ok_or_else(|| format!("{what}: no column `{name}` (Vidur's profiles have it)"))?;
        let cell = self.cell(i);
        // Most cells are whole numbers: read as such (exact below 2⁵³, and
        // rounded as the float parse rounds above), the rest as floats.
        match cell.parse::<u64>().map(|v| v as f64).or_else(|_| cell.parse::<f64>()) {
            Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
            _ => Err(format!("{what}:{}: column `{name}`: {cell:?} is not a finite number ≥ 0", self.line())),
        }
    }
}

impl VidurProfile {
    /// Reads `dir/mlp.csv` (and `dir/attention.csv` when present), keeping the rows of `shape`.
    pub fn from_dir(dir: &Path, shape: VidurShape) -> Result<VidurProfile, String> {
        let read = |name: &str| -> Result<Option<(String, String)>, String> {
            let path = dir.join(name);
            if !path.is_file() {
                return Ok(None);
            }
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(Some((path.display().to_string(), text)))
        };
        let (mlp_what, mlp) = read("mlp.csv")?.ok_or_else(|| format!("{}: no mlp.csv", dir.display()))?;
        let attention = read("attention.csv")?;
        VidurProfile::from_text(&mlp, &mlp_what, attention.as_ref().map(|(w, t)| (t.as_str(), w.as_str())), shape)
    }

    /// A profile from the text of an `mlp.csv` (`what` names it) and, optionally, an `attention.csv`.
    pub fn from_text(
        mlp: &str,
        what: &str,
        attention: Option<(&str, &str)>,
        shape: VidurShape,
    ) -> Result<VidurProfile, String> {
        let mut csv = Csv::new(mlp, what)?;
        let [heads, kv_heads, hidden, intermediate, tp, tokens] =
            ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "num_tensor_parallel_workers", "num_tokens"]
                .map(|name| csv.column(name));
        let names = OPS.map(|op| format!("time_stats.{op}.median"));
        let medians = names.each_ref().map(|name| csv.column(name));
        let mut ops: Vec<OpCurve> = vec![Vec::new(); OPS.len()];
        let mut seen = std::collections::BTreeSet::new();
        let mut token_counts = std::collections::HashSet::new();
        while csv.next()? {
            let row = VidurShape {
                heads: csv.num(&heads)? as u64,
                kv_heads: csv.num(&kv_heads)? as u64,
                hidden: csv.num(&hidden)? as u64,
                intermediate: csv.num(&intermediate)? as u64,
                tp: csv.num(&tp)? as u32,
            };
            seen.insert((row.heads, row.kv_heads, row.hidden, row.intermediate, row.tp));
            if row != shape {
                continue;
            }
            let tokens = csv.num(&tokens)?;
            let mut times = [0.0; OPS.len()];
            for (ms, median) in times.iter_mut().zip(&medians) {
                *ms = csv.num(median)?;
            }
            // The first row of a token count wins, for every operator alike
            // (`+ 0.0` makes −0 and 0 one count).
            if token_counts.insert((tokens + 0.0).to_bits()) {
                for (curve, ms) in ops.iter_mut().zip(times) {
                    curve.push((tokens, ms / 1e3));
                }
            }
        }
        if ops[0].is_empty() {
            return Err(format!(
                "{what}: no row for this model at tp {} (heads {}, KV heads {}, hidden {}, MLP {}); it holds (heads, KV heads, hidden, MLP, tp) = {seen:?}",
                shape.tp, shape.heads, shape.kv_heads, shape.hidden, shape.intermediate
            ));
        }
        for c in &mut ops {
            c.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        let (prefill, decode) = match attention {
            Some((text, what_a)) => attention_grids(text, what_a, shape)?,
            None => (None, None),
        };
        let path = match attention {
            Some((_, a)) => format!("{what} and {a}"),
            None => what.to_string(),
        };
        Ok(VidurProfile { path, ops, prefill, decode })
    }

    fn op(&self, name: &str, m: f64) -> f64 {
        let i = OPS.iter().position(|&o| o == name).expect("a known Vidur operator");
        interp(&self.ops[i], m)
    }

    /// A GEMM of this layer at `m` tokens (`None`: Vidur has no such operator).
    pub fn gemm(&self, role: Role, m: f64) -> Option<f64> {
        let name = match role {
            Role::Qkv => "attn_pre_proj",
            Role::AttnOut => "attn_post_proj",
            Role::GateUp => "mlp_up_proj",
            Role::Down => "mlp_down_proj",
            Role::Router | Role::LmHead => return None,
        };
        Some(self.op(name, m))
    }

    /// An element-wise operator at `m` tokens: a layer's two norms with
    /// their residual adds, the activation, RoPE, the embedding.
    pub fn elementwise(&self, op: Elementwise, m: f64) -> Option<f64> {
        Some(match op {
            // As Vidur sums a layer: both norms and one residual add (its profiler times the second).
            Elementwise::Norm => {
                self.op("input_layernorm", m) + self.op("post_attention_layernorm", m) + self.op("add", m)
            }
            Elementwise::Activation => self.op("mlp_act", m),
            Elementwise::Rope => self.op("attn_rope", m),
            Elementwise::Embedding => self.op("emb", m),
            Elementwise::FinalNorm | Elementwise::KvWrite => return None,
        })
    }

    /// All-reduce (not in `mlp.csv`).
    pub fn allreduce(&self, _tp: u32, _elements: f64) -> Option<f64> {
        None
    }

    /// Prefill attention of a chunk of `s − prefix` tokens after `prefix`
    /// cached ones (`None` without an `attention.csv`). Outside the measured
    /// grid the utilisation is held against the chunk's attention pairs.
    pub fn ctx_attention(&self, s: f64, prefix: f64) -> Option<f64> {
        let g = self.prefill.as_ref()?;
        let pairs = |q: &[f64]| q[0] * (q[0] + 2.0 * q[1]).max(1.0);
        Some(g.query(&[s - prefix, prefix], &pairs, Some(0)))
    }

    /// Decode attention of `batch` sequences whose queries see `s` keys
    /// (`None` without an `attention.csv`); outside the grid the utilisation
    /// is held against the keys read.
    pub fn gen_attention(&self, batch: f64, s: f64) -> Option<f64> {
        let g = self.decode.as_ref()?;
        let keys = |q: &[f64]| q[0] * q[1].max(1.0);
        Some(g.query(&[batch, (s - 1.0).max(0.0)], &keys, None))
    }

    /// What it is.
    pub fn describe(&self) -> String {
        format!("Vidur profile {}", self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/profiles/vidur/a100/llama-2-7b");
    const LLAMA2_7B: VidurShape = VidurShape { heads: 32, kv_heads: 32, hidden: 4096, intermediate: 11008, tp: 1 };

    #[test]
    fn a_vidur_profile_gives_its_medians_and_interpolates_between_token_counts() {
        let v = VidurProfile::from_dir(Path::new(DIR), LLAMA2_7B).unwrap();
        // attn_pre_proj: 0.0745 ms at 128 tokens, 0.132 ms at 136.
        assert!((v.gemm(Role::Qkv, 128.0).unwrap() - 0.0745e-3).abs() < 1e-12);
        assert!((v.gemm(Role::Qkv, 132.0).unwrap() - (0.0745e-3 + 0.132e-3) / 2.0).abs() < 1e-12);
        // No LM head in Vidur's profile: the next source prices it.
        assert_eq!(v.gemm(Role::LmHead, 8.0), None);
        assert!(v.ctx_attention(512.0, 0.0).is_some() && v.gen_attention(8.0, 1025.0).is_some());
    }

    /// A CSV's headers and its rows as (line, cells).
    type Read = (Vec<String>, Vec<(u64, Vec<String>)>);

    /// Every cell of every row of `text` — or the error — read one way.
    fn read_all(mut csv: Csv) -> Result<Read, String> {
        let mut rows = Vec::new();
        while csv.next()? {
            rows.push((csv.line(), (0..csv.headers.len()).map(|i| csv.cell(i).to_string()).collect()));
        }
        Ok((csv.headers.clone(), rows))
    }

    #[test]
    fn a_plain_file_is_split_as_the_csv_crate_reads_it() {
        let shipped = ["mlp.csv", "attention.csv"].map(|f| std::fs::read_to_string(Path::new(DIR).join(f)).unwrap());
        let made_up =
            ["a, b ,c\n1,2,3\n\n 4 ,5.5,\n", "\u{feff}a,b\n1,2\n", "a,b\n1,2\n3\n", "a,b\n1,2,3\n", "", "\n\na\n7\n"];
        for text in shipped.iter().map(String::as_str).chain(made_up) {
            let plain = read_all(Csv::plain(text, "t").unwrap());
            let quoted = read_all(Csv::quoted(text, "t").unwrap());
            match (plain, quoted) {
                // (After a blank line the crate counts lines one short; the plain reader does not.)
                (Ok(p), Ok(q)) if text.contains("\n\n") => {
                    let cells = |t: (Vec<String>, Vec<(u64, Vec<String>)>)| {
                        (t.0, t.1.into_iter().map(|r| r.1).collect::<Vec<_>>())
                    };
                    assert_eq!(cells(p), cells(q), "{text:?}")
                }
                (Ok(p), Ok(q)) => assert_eq!(p, q, "{text:?}"),
                (Err(p), Err(q)) => assert!(p.starts_with("t:") && q.starts_with("t:"), "{p} / {q}"),
                (p, q) => panic!("{text:?}: {p:?} vs {q:?}"),
            }
        }
        assert!(!shipped[0].contains(['"', '\r']), "the shipped profile takes the plain path");
    }

    #[test]
    fn a_profile_of_another_shape_is_refused_naming_the_shapes_it_holds() {
        let e = VidurProfile::from_dir(Path::new(DIR), VidurShape { tp: 2, ..LLAMA2_7B }).unwrap_err();
        assert!(e.contains("no row for this model at tp 2") && e.contains("(32, 32, 4096, 11008, 1)"), "{e}");
    }
}
