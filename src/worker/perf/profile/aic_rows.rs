//! The rows of aiconfigurator's tables: read from Parquet, checked, and
//! grouped by what a lookup asks for (a GEMM shape, an attention key, an
//! all-reduce GPU count) — and packed, so that the shipped tables are
//! read once at build time and the binary holds them grouped.
//!
//! The build script includes this file as a module of its own
//! (`build.rs`: it decodes the shipped Parquet tables and writes
//! [`pack`]'s bytes to `$OUT_DIR`), and the crate reads a user's tables
//! with the same functions, so both take the same rows. It uses nothing of
//! the crate.

use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{Array, ArrowPrimitiveType, LargeStringArray, PrimitiveArray, RecordBatch, StringArray};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

/// The table files, by aiconfigurator's names.
pub const GEMM_FILE: &str = "gemm_perf.parquet";
/// Prefill attention.
pub const CTX_FILE: &str = "context_attention_perf.parquet";
/// Decode attention.
pub const GEN_FILE: &str = "generation_attention_perf.parquet";
/// All-reduce.
pub const ALLREDUCE_FILE: &str = "custom_allreduce_perf.parquet";
/// Routed experts: vLLM's fused MoE kernel (gate/up GEMM, activation, down GEMM).
pub const MOE_FILE: &str = "moe_perf.parquet";
/// Multi-head latent attention as one module (vLLM's `DeepseekV2MLAAttention.forward`
/// for DeepSeek-V3's shape: projections, norms, RoPE, the cache write, attention and
/// the output projection), prefill.
pub const MLA_CTX_FILE: &str = "mla_context_module_perf.parquet";
/// The MLA module, decode.
pub const MLA_GEN_FILE: &str = "mla_generation_module_perf.parquet";
/// Tables a GPU's directory may lack (aiconfigurator measured the MLA module on few GPUs).
pub const OPTIONAL_FILES: [&str; 2] = [MLA_CTX_FILE, MLA_GEN_FILE];

/// One measured configuration of the MLA module tables: (prefill
/// attention dtype — 0 in the decode table, which aiconfigurator does not
/// key by it —, KV-cache dtype, projection GEMM dtype), as [`dtype_code`]
/// and [`gemm_code`] code them.
pub type MlaKey = (u8, u8, u8);

/// One measured configuration of the MoE table. Sizes are the model's
/// (`inter`: one expert's full intermediate size), `tp` × `ep` the GPUs
/// the experts are split over (each expert's width over `tp`, the experts
/// over `ep`); latencies are of one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MoeKey {
    /// 1 BF16, 2 FP8 (per tensor), 3 FP8 with block scales.
    pub dtype: u8,
    /// How tokens spread over the experts: 0 `balanced`, 1 `power_law_1.01`, 2 `power_law_1.2`.
    pub routing: u8,
    /// Experts a token uses.
    pub topk: u32,
    /// Routed experts.
    pub experts: u32,
    /// Model width.
    pub hidden: u32,
    /// One expert's intermediate size.
    pub inter: u32,
    /// Tensor-parallel split of each expert.
    pub tp: u32,
    /// Expert-parallel split of the experts.
    pub ep: u32,
}

/// The routing distributions the MoE tables measure, by code.
pub const ROUTINGS: [&str; 3] = ["balanced", "power_law_1.01", "power_law_1.2"];

/// The attention of one (KV dtype code, KV heads — 0 for multi-head
/// attention —, head dim, window).
pub type AttnKey = (u8, i64, i64, i64);

/// One measured (precision, n, k) of the GEMM table.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmSite {
    /// 1 BF16/FP16, 2 FP8, 3 FP8 with block scales.
    pub dtype: u8,
    /// Output columns.
    pub n: u64,
    /// Inner dimension.
    pub k: u64,
    /// (m, seconds), in file order.
    pub rows: Vec<(f64, f64)>,
}

impl GemmSite {
    /// The least and most m measured.
    pub fn m_range(&self) -> (f64, f64) {
        self.rows.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), r| (a.min(r.0), b.max(r.0)))
    }
}

/// The least and most query heads among attention `points`.
pub fn heads_range(points: &Points) -> (i64, i64) {
    points.iter().fold((i64::MAX, i64::MIN), |(a, b), p| (a.min(p.0[0]), b.max(p.0[0])))
}

/// Measured attention points: (coordinates, seconds), in file order —
/// prefill `[heads, sequence, batch]`, decode `[heads, batch, keys]` (keys
/// = `isl + step`).
pub type Points = Vec<([i64; 3], f64)>;

/// MoE curves: configuration → (tokens, seconds), increasing tokens.
pub type MoeCurves = Vec<(MoeKey, Vec<(f64, f64)>)>;

/// All-reduce curves: GPUs → (elements, seconds), increasing elements; by GPUs.
pub type Curves = Vec<(u32, Vec<(f64, f64)>)>;

/// The tables of one GPU, grouped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Grouped {
    /// GEMM shapes in the order the file first names them.
    pub gemm: Vec<GemmSite>,
    /// Prefill attention by key, in the order the file first names them.
    pub ctx: Vec<(AttnKey, Points)>,
    /// Decode attention by key.
    pub decode: Vec<(AttnKey, Points)>,
    /// All-reduce curves.
    pub allreduce: Curves,
    /// Routed experts by configuration, in the order the file first names
    /// them: (tokens, seconds), increasing tokens (the first of repeated
    /// measurements standing).
    pub moe: MoeCurves,
    /// The MLA module's prefill by key: `[heads, sequence, batch]`.
    pub mla_ctx: Vec<(MlaKey, Points)>,
    /// Its decode by key: `[heads, batch, keys]` (keys = `isl + step`).
    pub mla_gen: Vec<(MlaKey, Points)>,
}

impl Grouped {
    /// Reads the tables present among `files` (name → Parquet bytes).
    pub fn read(files: &[(&str, bytes::Bytes)]) -> Result<Grouped, String> {
        let mut g = Grouped::default();
        for (file, bytes) in files {
            match *file {
                GEMM_FILE => {
                    g.gemm = gemm_sites(
                        &Columns::read(bytes.clone(), file, &["gemm_dtype", "m", "n", "k", "latency"])?,
                        file,
                    )?
                }
                CTX_FILE | GEN_FILE => {
                    let wanted = [
                        "batch_size",
                        "isl",
                        "step",
                        "num_heads",
                        "num_key_value_heads",
                        "head_dim",
                        "kv_cache_dtype",
                        "attn_dtype",
                        "window_size",
                        "latency",
                    ];
                    let cols = Columns::read(bytes.clone(), file, &wanted)?;
                    let decode = *file == GEN_FILE;
                    let keys = attention_keys(&cols, file, decode)?;
                    if decode {
                        g.decode = keys;
                    } else {
                        g.ctx = keys;
                    }
                }
                ALLREDUCE_FILE => {
                    let wanted = ["num_gpus", "message_size", "latency", "kernel_source", "backend"];
                    g.allreduce = allreduce_curves(&Columns::read(bytes.clone(), file, &wanted)?, file)?
                }
                MOE_FILE => {
                    let wanted = [
                        "moe_dtype",
                        "num_tokens",
                        "hidden_size",
                        "inter_size",
                        "topk",
                        "num_experts",
                        "moe_tp_size",
                        "moe_ep_size",
                        "distribution",
                        "latency",
                    ];
                    g.moe = moe_curves(&Columns::read(bytes.clone(), file, &wanted)?, file)?
                }
                MLA_CTX_FILE | MLA_GEN_FILE => {
                    let wanted = [
                        "mla_dtype",
                        "kv_cache_dtype",
                        "gemm_type",
                        "num_heads",
                        "batch_size",
                        "isl",
                        "step",
                        "latency",
                    ];
                    let cols = Columns::read(bytes.clone(), file, &wanted)?;
                    if *file == MLA_GEN_FILE {
                        g.mla_gen = mla_keys(&cols, file, true)?;
                    } else {
                        g.mla_ctx = mla_keys(&cols, file, false)?;
                    }
                }
                _ => {}
            }
        }
        Ok(g)
    }
}

/// The columns of a Parquet table, by name (only those asked for are decoded).
pub struct Columns {
    batches: Vec<RecordBatch>,
}

impl Columns {
    /// Reads the columns `wanted` of the table (those it lacks are skipped).
    pub fn read(bytes: bytes::Bytes, what: &str, wanted: &[&str]) -> Result<Columns, String> {
        let builder = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .map_err(|e| format!("{what}: not a readable Parquet file: {e}"))?;
        let fields = builder.parquet_schema().root_schema().get_fields();
        let roots: Vec<usize> =
            fields.iter().enumerate().filter(|(_, f)| wanted.contains(&f.name())).map(|(i, _)| i).collect();
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
        let reader = builder
            .with_projection(mask)
            .with_batch_size(65536)
            .build()
            .map_err(|e| format!("{what}: not a readable Parquet file: {e}"))?;
        let batches = reader.collect::<Result<Vec<_>, _>>().map_err(|e| format!("{what}: {e}"))?;
        Ok(Columns { batches })
    }

    fn has(&self, name: &str) -> bool {
        self.batches.first().is_some_and(|b| b.schema().column_with_name(name).is_some())
    }

    fn column<'a>(b: &'a RecordBatch, name: &str, what: &str) -> Result<&'a dyn Array, String> {
        b.column_by_name(name).map(|c| c.as_ref()).ok_or_else(|| format!("{what}: no column `{name}`"))
    }

    fn ints(&self, name: &str, what: &str) -> Result<Vec<i64>, String> {
        self.values::<Int64Type>(name, what, "int64", i64::MIN)
    }

    fn floats(&self, name: &str, what: &str) -> Result<Vec<f64>, String> {
        self.values::<Float64Type>(name, what, "float64", f64::NAN)
    }

    /// Column `name` of every batch as `T`'s values, a null read as `null`.
    fn values<T: ArrowPrimitiveType>(
        &self,
        name: &str,
        what: &str,
        kind: &str,
        null: T::Native,
    ) -> Result<Vec<T::Native>, String> {
        let mut out = Vec::new();
        for b in &self.batches {
            let c = Self::column(b, name, what)?;
            let c = c
                .as_any()
                .downcast_ref::<PrimitiveArray<T>>()
                .ok_or_else(|| format!("{what}: column `{name}` is not {kind}"))?;
            match c.nulls() {
                None => out.extend_from_slice(c.values()),
                Some(_) => out.extend(c.iter().map(|v| v.unwrap_or(null))),
            }
        }
        Ok(out)
    }

    /// A string column as `code(value)` per row (no string is copied).
    fn codes(&self, name: &str, what: &str, code: impl Fn(&str) -> u8) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        for b in &self.batches {
            let c = Self::column(b, name, what)?.as_any();
            // pandas writes `string`, pyarrow's `large_string` (aiconfigurator's MoE table) is as good.
            if let Some(c) = c.downcast_ref::<StringArray>() {
                out.extend((0..c.len()).map(|i| code(c.value(i))));
            } else if let Some(c) = c.downcast_ref::<LargeStringArray>() {
                out.extend((0..c.len()).map(|i| code(c.value(i))));
            } else {
                return Err(format!("{what}: column `{name}` is not a string column"));
            }
        }
        Ok(out)
    }
}

/// A dtype name as a code: 1 BF16/FP16, 2 FP8, 0 anything else.
fn dtype_code(name: &str) -> u8 {
    match name {
        "bfloat16" | "float16" => 1,
        "fp8" => 2,
        _ => 0,
    }
}

/// A GEMM dtype name as a code: 1 BF16, 3 FP8 with block scales, 0 anything else.
fn gemm_code(name: &str) -> u8 {
    match name {
        "bfloat16" => 1,
        "fp8_block" => 3,
        _ => 0,
    }
}

/// 1 for an eager-mode kernel source or backend (skipped), else 0.
fn eager_code(name: &str) -> u8 {
    u8::from(name.ends_with("_eager"))
}

/// The longest latency a table row may give one operator, ms (a minute:
/// no kernel of a forward pass takes that long; a larger one is a unit or
/// a typing mistake, which would otherwise surface as a run in the far future).
const MAX_LATENCY_MS: f64 = 60_000.0;

/// Checks a shape column's value of row `row`: a positive count (`min` 1),
/// or at least 0 (`min` 0). Missing (null) values are refused too.
fn shape(v: i64, min: i64, column: &str, what: &str, row: usize) -> Result<i64, String> {
    if v == i64::MIN {
        return Err(format!("{what}: row {}: `{column}` is missing (null); every row needs one", row + 1));
    }
    if v < min {
        return Err(format!("{what}: row {}: `{column}` is {v}, not a size (at least {min})", row + 1));
    }
    Ok(v)
}

/// Latency in ms as a table gives it → seconds, refusing what no measurement is.
fn seconds(ms: f64, what: &str, row: usize) -> Result<f64, String> {
    if ms.is_finite() && ms > MAX_LATENCY_MS {
        return Err(format!(
            "{what}: row {}: `latency` is {ms:.3e} ms, more than the {MAX_LATENCY_MS} ms one operator could take (the column is milliseconds)",
            row + 1
        ));
    }
    if ms.is_finite() && ms > 0.0 {
        Ok(ms / 1e3)
    } else {
        Err(format!("{what}: row {}: latency {ms} is not a positive number of milliseconds", row + 1))
    }
}

/// Sorts a curve's points by x and keeps, of points measured at the same x,
/// the one the file gives first (the sort is stable): a row repeating a
/// measured x is ignored, the first measurement standing.
pub fn sort_first_of_each(curve: &mut Vec<(f64, f64)>) {
    curve.sort_by(|a, b| a.0.total_cmp(&b.0));
    curve.dedup_by(|later, first| later.0 == first.0);
}

/// The BF16, FP8 and FP8-block GEMM rows by shape (rows of other dtypes skipped).
fn gemm_sites(c: &Columns, what: &str) -> Result<Vec<GemmSite>, String> {
    let (dtype, m, n, k, lat) = (
        c.codes("gemm_dtype", what, |name| match name {
            "fp8_block" => 3,
            other => dtype_code(other),
        })?,
        c.ints("m", what)?,
        c.ints("n", what)?,
        c.ints("k", what)?,
        c.floats("latency", what)?,
    );
    let mut sites: Vec<GemmSite> = Vec::new();
    let mut index: std::collections::HashMap<(u8, u64, u64), usize> = Default::default();
    for i in 0..m.len() {
        if dtype[i] == 0 {
            continue;
        }
        if m[i] < 1 || !(1..=i64::from(u32::MAX)).contains(&n[i]) || !(1..=i64::from(u32::MAX)).contains(&k[i]) {
            return Err(format!("{what}: row {}: m, n and k must be at least 1 (n and k below 2³²)", i + 1));
        }
        let secs = seconds(lat[i], what, i)?;
        let key = (dtype[i], n[i] as u64, k[i] as u64);
        let at = *index.entry(key).or_insert_with(|| {
            sites.push(GemmSite { dtype: key.0, n: key.1, k: key.2, rows: Vec::new() });
            sites.len() - 1
        });
        sites[at].rows.push((m[i] as f64, secs));
    }
    Ok(sites)
}

/// The attention rows by key (rows of other attention dtypes, and of an
/// unknown KV dtype, skipped).
fn attention_keys(c: &Columns, what: &str, decode: bool) -> Result<Vec<(AttnKey, Points)>, String> {
    let (batch, isl, heads, kv_heads, head_dim, kv, lat) = (
        c.ints("batch_size", what)?,
        c.ints("isl", what)?,
        c.ints("num_heads", what)?,
        c.ints("num_key_value_heads", what)?,
        c.ints("head_dim", what)?,
        c.codes("kv_cache_dtype", what, dtype_code)?,
        c.floats("latency", what)?,
    );
    let step = if decode { c.ints("step", what)? } else { vec![0; batch.len()] };
    let window = if c.has("window_size") { c.ints("window_size", what)? } else { vec![0; batch.len()] };
    let attn = if !decode && c.has("attn_dtype") { Some(c.codes("attn_dtype", what, dtype_code)?) } else { None };
    let mut keys: Vec<(AttnKey, Points)> = Vec::new();
    let mut index: std::collections::HashMap<AttnKey, usize> = Default::default();
    for i in 0..batch.len() {
        if attn.as_ref().is_some_and(|a| a[i] != 1) || kv[i] == 0 {
            continue;
        }
        for (v, min, col) in [
            (batch[i], 1, "batch_size"),
            (isl[i], 1, "isl"),
            (heads[i], 1, "num_heads"),
            (kv_heads[i], 1, "num_key_value_heads"),
            (head_dim[i], 1, "head_dim"),
            (step[i], 0, "step"),
            (window[i], 0, "window_size"),
        ] {
            shape(v, min, col, what, i)?;
        }
        let secs = seconds(lat[i], what, i)?;
        let nk = if heads[i] == kv_heads[i] { 0 } else { kv_heads[i] };
        let key = (kv[i], nk, head_dim[i], window[i]);
        let q = if decode { [heads[i], batch[i], isl[i] + step[i]] } else { [heads[i], isl[i], batch[i]] };
        push_point(&mut keys, &mut index, key, q, secs);
    }
    Ok(keys)
}

/// Appends point `q` to the points of `key` (a key's first point gives it
/// its place in `keys`, in file order).
fn push_point<K: Copy + Eq + std::hash::Hash>(
    keys: &mut Vec<(K, Points)>,
    index: &mut std::collections::HashMap<K, usize>,
    key: K,
    q: [i64; 3],
    secs: f64,
) {
    let at = *index.entry(key).or_insert_with(|| {
        keys.push((key, Vec::new()));
        keys.len() - 1
    });
    keys[at].1.push((q, secs));
}

/// The MLA module rows by key (rows of other dtypes skipped; prefill rows
/// after a cached prefix too: aiconfigurator prices a prefix from the
/// full sequence's row, and its tables measure none).
fn mla_keys(c: &Columns, what: &str, decode: bool) -> Result<Vec<(MlaKey, Points)>, String> {
    let (fmha, kv, gemm) = (
        c.codes("mla_dtype", what, dtype_code)?,
        c.codes("kv_cache_dtype", what, dtype_code)?,
        c.codes("gemm_type", what, gemm_code)?,
    );
    let (heads, batch, isl, step, lat) = (
        c.ints("num_heads", what)?,
        c.ints("batch_size", what)?,
        c.ints("isl", what)?,
        c.ints("step", what)?,
        c.floats("latency", what)?,
    );
    let mut keys: Vec<(MlaKey, Points)> = Vec::new();
    let mut index: std::collections::HashMap<MlaKey, usize> = Default::default();
    for i in 0..batch.len() {
        if kv[i] == 0 || gemm[i] == 0 || (!decode && (fmha[i] == 0 || step[i] != 0)) {
            continue;
        }
        for (v, min, col) in
            [(batch[i], 1, "batch_size"), (isl[i], 1, "isl"), (heads[i], 1, "num_heads"), (step[i], 0, "step")]
        {
            shape(v, min, col, what, i)?;
        }
        let secs = seconds(lat[i], what, i)?;
        let key = (if decode { 0 } else { fmha[i] }, kv[i], gemm[i]);
        let q = if decode { [heads[i], batch[i], isl[i] + step[i]] } else { [heads[i], isl[i], batch[i]] };
        push_point(&mut keys, &mut index, key, q, secs);
    }
    Ok(keys)
}

/// The all-reduce curves by GPU count (CUDA-graph rows; eager ones skipped).
fn allreduce_curves(c: &Columns, what: &str) -> Result<Curves, String> {
    let (gpus, size, lat, kernel) = (
        c.ints("num_gpus", what)?,
        c.ints("message_size", what)?,
        c.floats("latency", what)?,
        c.codes("kernel_source", what, eager_code)?,
    );
    let backend = if c.has("backend") { c.codes("backend", what, eager_code)? } else { vec![0; gpus.len()] };
    let mut curves: Curves = Vec::new();
    for i in 0..gpus.len() {
        if kernel[i] == 1 || backend[i] == 1 {
            continue;
        }
        let secs = seconds(lat[i], what, i)?;
        shape(size[i], 1, "message_size", what, i)?;
        let g = shape(gpus[i], 1, "num_gpus", what, i)?;
        let g = u32::try_from(g).map_err(|_| format!("{what}: row {}: `num_gpus` is {g}, not a GPU count", i + 1))?;
        let at = match curves.iter().position(|c| c.0 == g) {
            Some(at) => at,
            None => {
                curves.push((g, Vec::new()));
                curves.len() - 1
            }
        };
        curves[at].1.push((size[i] as f64, secs));
    }
    for c in &mut curves {
        sort_first_of_each(&mut c.1);
    }
    curves.sort_by_key(|c| c.0);
    Ok(curves)
}

/// The MoE rows by configuration (rows of other dtypes and distributions skipped).
fn moe_curves(c: &Columns, what: &str) -> Result<MoeCurves, String> {
    let dtype = c.codes("moe_dtype", what, |n| match n {
        "fp8_block" => 3,
        other => dtype_code(other),
    })?;
    let routing =
        c.codes("distribution", what, |n| ROUTINGS.iter().position(|r| *r == n).map_or(u8::MAX, |i| i as u8))?;
    let tokens = c.ints("num_tokens", what)?;
    let sizes = ["topk", "num_experts", "hidden_size", "inter_size", "moe_tp_size", "moe_ep_size"]
        .map(|col| c.ints(col, what).map(|v| (col, v)));
    let mut cols = Vec::new();
    for s in sizes {
        cols.push(s?);
    }
    let lat = c.floats("latency", what)?;
    let mut curves: MoeCurves = Vec::new();
    let mut index: std::collections::HashMap<MoeKey, usize> = Default::default();
    for i in 0..tokens.len() {
        if dtype[i] == 0 || routing[i] == u8::MAX {
            continue;
        }
        shape(tokens[i], 1, "num_tokens", what, i)?;
        let mut v = [0u32; 6];
        for (slot, (col, values)) in v.iter_mut().zip(&cols) {
            let x = shape(values[i], 1, col, what, i)?;
            *slot = u32::try_from(x).map_err(|_| format!("{what}: row {}: `{col}` is {x}, above 2³²", i + 1))?;
        }
        let secs = seconds(lat[i], what, i)?;
        let [topk, experts, hidden, inter, tp, ep] = v;
        let key = MoeKey { dtype: dtype[i], routing: routing[i], topk, experts, hidden, inter, tp, ep };
        let at = *index.entry(key).or_insert_with(|| {
            curves.push((key, Vec::new()));
            curves.len() - 1
        });
        curves[at].1.push((tokens[i] as f64, secs));
    }
    for c in &mut curves {
        sort_first_of_each(&mut c.1);
    }
    Ok(curves)
}

/// The first bytes of packed tables.
pub const MAGIC: &[u8; 8] = b"OPALAIC3";

/// Packs `g`: a header of every GEMM shape, attention key, all-reduce
/// curve, MoE configuration and MLA module key with where its rows lie,
/// then the rows, little-endian — so that a reader finds a shape's rows
/// without decoding the others'.
///
/// ```text
/// MAGIC
/// u32 shapes; per shape: u8 dtype, u64 n, u64 k, f64 least m, f64 most m, u32 first row, u32 rows
/// 2 × (u32 keys; per key: u8 dtype, i64 KV heads, i64 head dim, i64 window,
///      i64 least heads, i64 most heads, u32 first row, u32 rows)        — prefill, then decode
/// u32 curves; per curve: u32 GPUs, u32 first row, u32 rows
/// u32 MoE configurations; per one: u8 dtype, u8 routing, u32 topk, experts, hidden, inter, tp, ep, first row, rows
/// 2 × (u32 keys; per key: u8 prefill dtype, u8 KV dtype, u8 GEMM dtype,
///      i64 least heads, i64 most heads, u32 first row, u32 rows)        — MLA prefill, then decode
/// GEMM rows (f64 m, f64 s); prefill rows, then decode rows (3 × i32, f64 s); all-reduce rows (f64, f64 s);
/// MoE rows (f64 tokens, f64 s); MLA prefill rows, then decode rows (3 × i32, f64 s)
/// ```
pub fn pack(g: &Grouped) -> Vec<u8> {
    let mut head = MAGIC.to_vec();
    let (mut gemm_rows, mut attn_rows, mut ar_rows) = (Vec::new(), Vec::new(), Vec::new());
    head.extend(u32_of(g.gemm.len()));
    let mut row = 0;
    for s in &g.gemm {
        let (lo, hi) = s.m_range();
        head.push(s.dtype);
        head.extend(s.n.to_le_bytes());
        head.extend(s.k.to_le_bytes());
        head.extend(lo.to_le_bytes());
        head.extend(hi.to_le_bytes());
        head.extend(u32_of(row));
        head.extend(u32_of(s.rows.len()));
        row += s.rows.len();
        for &(m, secs) in &s.rows {
            gemm_rows.extend(m.to_le_bytes());
            gemm_rows.extend(secs.to_le_bytes());
        }
    }
    let mut row = 0;
    for keys in [&g.ctx, &g.decode] {
        points_section(&mut head, &mut attn_rows, &mut row, keys, |key, out| {
            out.push(key.0);
            for v in [key.1, key.2, key.3] {
                out.extend(v.to_le_bytes());
            }
        });
    }
    head.extend(u32_of(g.allreduce.len()));
    let mut row = 0;
    for (gpus, curve) in &g.allreduce {
        head.extend(gpus.to_le_bytes());
        head.extend(u32_of(row));
        head.extend(u32_of(curve.len()));
        row += curve.len();
        for &(x, secs) in curve {
            ar_rows.extend(x.to_le_bytes());
            ar_rows.extend(secs.to_le_bytes());
        }
    }
    let mut moe_rows = Vec::new();
    head.extend(u32_of(g.moe.len()));
    let mut row = 0;
    for (key, curve) in &g.moe {
        head.push(key.dtype);
        head.push(key.routing);
        for v in [key.topk, key.experts, key.hidden, key.inter, key.tp, key.ep] {
            head.extend(v.to_le_bytes());
        }
        head.extend(u32_of(row));
        head.extend(u32_of(curve.len()));
        row += curve.len();
        for &(x, secs) in curve {
            moe_rows.extend(x.to_le_bytes());
            moe_rows.extend(secs.to_le_bytes());
        }
    }
    let (mut mla_rows, mut row) = (Vec::new(), 0);
    for keys in [&g.mla_ctx, &g.mla_gen] {
        points_section(&mut head, &mut mla_rows, &mut row, keys, |key, out| out.extend([key.0, key.1, key.2]));
    }
    head.extend(gemm_rows);
    head.extend(attn_rows);
    head.extend(ar_rows);
    head.extend(moe_rows);
    head.extend(mla_rows);
    head
}

/// A count as the packed u32.
fn u32_of(n: usize) -> [u8; 4] {
    u32::try_from(n).expect("fewer than 2³² rows").to_le_bytes()
}

/// Packs one section of point tables: the key count, then per key its
/// bytes (`key`), its least and most heads, its first row (counted from
/// `row` on) and its rows; the rows (3 × i32, f64 seconds) go to `rows`.
fn points_section<K>(
    head: &mut Vec<u8>,
    rows: &mut Vec<u8>,
    row: &mut usize,
    keys: &[(K, Points)],
    key: impl Fn(&K, &mut Vec<u8>),
) {
    head.extend(u32_of(keys.len()));
    for (k, points) in keys {
        let (lo, hi) = heads_range(points);
        key(k, head);
        head.extend(lo.to_le_bytes());
        head.extend(hi.to_le_bytes());
        head.extend(u32_of(*row));
        head.extend(u32_of(points.len()));
        *row += points.len();
        for (q, secs) in points {
            for v in q {
                rows.extend(i32::try_from(*v).expect("a table size below 2³¹").to_le_bytes());
            }
            rows.extend(secs.to_le_bytes());
        }
    }
}
