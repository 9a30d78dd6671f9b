//! Parquet output: table schemas, crash-safe part files, and the merge that
//! turns parts into the final tables. This module is the only one that knows
//! the storage format (arrow-rs `parquet`, zstd).
//!
//! Layout of a sweep directory:
//!
//! ```text
//! manifest.json        resolved spec, tool version, axes, shard
//! runs.parquet         one row per run
//! histograms.parquet   run_id, metric, count, hdr (HDR histogram, compressed V2 encoding, µs)
//! timeseries.parquet   one row per run and interval
//! workers.parquet      one row per run and worker
//! stages.parquet       one row per run and workload stage
//! sc25.parquet         cold and warm TTFT per prompt size (with an SC25Workload stage)
//! requests.parquet     one row per request (only when asked for)
//! steps.parquet        one row per scheduler step (only when asked for)
//! parts/               part files of runs finished but not yet merged
//! ```
//!
//! Every file is sorted by `run_id` (its first column). A part holds whole
//! runs and is written atomically (temporary name, then rename), the `runs`
//! part last, so a run listed in a `runs` part or table has its rows in every
//! other table. Merging is a k-way merge by `run_id` that streams one run at
//! a time, so memory stays bounded whatever the table size.

pub mod spill;
pub mod vllm;

use crate::RunError;
use crate::cluster::RunOutput;
use crate::metrics::rows::{Row, cells_of, col, columns_of};
use crate::metrics::table::{Cell, ColType, TableBuilder};
use crate::metrics::{
    IntervalRow, LatencyMetric, RequestRecord, RunSummary, Sc25Row, StageRow, StepRow, SummaryValue, WorkerRow,
};
use arrow_array::{Array, RecordBatch, RecordBatchReader, UInt32Array};
use parquet::arrow::ArrowWriter;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::fs::File;
use std::path::{Path, PathBuf};

/// The tables a sweep can write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TableKind {
    /// One row per run.
    Runs,
    /// Latency histograms per run.
    Histograms,
    /// Time series per run.
    Timeseries,
    /// One row per request.
    Requests,
    /// One row per worker.
    Workers,
    /// Cold and warm TTFT per prompt size of `SC25Workload` stages.
    Sc25,
    /// One row per run and workload stage.
    Stages,
    /// One row per scheduler step (only when asked for).
    Steps,
}

impl TableKind {
    /// Every table, in write order (runs last, so it marks a part complete).
    pub const WRITE_ORDER: [TableKind; 8] = [
        TableKind::Histograms,
        TableKind::Timeseries,
        TableKind::Workers,
        TableKind::Stages,
        TableKind::Sc25,
        TableKind::Requests,
        TableKind::Steps,
        TableKind::Runs,
    ];

    /// The table's name.
    pub fn name(self) -> &'static str {
        match self {
            TableKind::Runs => "runs",
            TableKind::Histograms => "histograms",
            TableKind::Timeseries => "timeseries",
            TableKind::Requests => "requests",
            TableKind::Workers => "workers",
            TableKind::Sc25 => "sc25",
            TableKind::Stages => "stages",
            TableKind::Steps => "steps",
        }
    }

    /// Parses a table name.
    pub fn from_name(name: &str) -> Option<TableKind> {
        TableKind::WRITE_ORDER.into_iter().find(|t| t.name() == name)
    }

    /// The final file name.
    pub fn file_name(self) -> String {
        format!("{}.parquet", self.name())
    }
}

/// A typed grid-axis value for the runs table.
#[derive(Clone, Debug, PartialEq)]
pub enum AxisValue {
    /// Integer axis.
    Int(i64),
    /// Float axis.
    Float(f64),
    /// String axis (also lists and tables, in TOML inline form).
    Str(String),
    /// Boolean axis.
    Bool(bool),
}

impl AxisValue {
    /// The value as a table cell.
    pub fn cell_of(&self) -> Cell<'_> {
        self.cell()
    }

    fn cell(&self) -> Cell<'_> {
        match self {
            AxisValue::Int(v) => Cell::I64(*v),
            AxisValue::Float(v) => Cell::F64(*v),
            AxisValue::Str(v) => Cell::Str(v),
            AxisValue::Bool(v) => Cell::Bool(*v),
        }
    }
}

/// Identity of a run within its sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunMeta {
    /// Run id (position in the expanded sweep).
    pub run_id: u32,
    /// Grid point.
    pub point_id: u32,
    /// Replicate.
    pub replicate: u32,
    /// Seed used.
    pub seed: u64,
    /// The run's identity: a hash of its resolved scenario, seed, tool
    /// version and tables. `--resume` keeps a finished run whose key the
    /// current plan still holds, whatever its id now.
    pub run_key: u64,
}

/// A finished (or failed) run, ready to be written.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// Which run.
    pub meta: RunMeta,
    /// Its axis values, in axis-column order.
    pub axes: Vec<AxisValue>,
    /// The output, or why there is none.
    pub outcome: Result<RunOutput, RunError>,
    /// Wall-clock seconds it took.
    pub wall_s: f64,
    /// Serialized histograms `(metric, samples, bytes)`, prepared on the
    /// run's own thread so the writer does no compression work.
    pub histograms: Vec<(LatencyMetric, u64, Vec<u8>)>,
    /// Its per-row tables, written as it ran (see [`spill`]); else they are in `outcome`.
    pub spilled: Option<spill::Spilled>,
}

impl RunResult {
    /// A result with its histograms serialized.
    pub fn new(meta: RunMeta, axes: Vec<AxisValue>, outcome: Result<RunOutput, RunError>, wall_s: f64) -> RunResult {
        let histograms = match &outcome {
            Ok(out) => LatencyMetric::ALL
                .iter()
                .map(|&m| {
                    let h = out.latencies.get(m);
                    let mut plain = Vec::new();
                    h.write_v2(&mut plain);
                    (m, h.count(), serialize_hdr(&plain))
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        RunResult { meta, axes, outcome, wall_s, histograms, spilled: None }
    }
}

/// The shape of a sweep's tables (the axis columns vary by sweep).
#[derive(Clone, Debug)]
pub struct TableSet {
    /// Tables to write (always includes runs).
    pub tables: BTreeSet<TableKind>,
    /// Axis columns of the runs table: (dotted path, type).
    pub axis_columns: Vec<(String, ColType)>,
}

impl TableSet {
    /// The columns of table `kind`, in order, with their types.
    pub fn columns(&self, kind: TableKind) -> Vec<(String, ColType)> {
        let c = |n: &str, t| (n.to_string(), t);
        match kind {
            TableKind::Runs => {
                let mut cols = vec![
                    c(col::RUN_ID, ColType::U32),
                    c(col::POINT_ID, ColType::U32),
                    c(col::REPLICATE, ColType::U32),
                    c(col::SEED, ColType::U64),
                    c(col::RUN_KEY, ColType::U64),
                ];
                cols.extend(self.axis_columns.iter().cloned());
                cols.extend([c(col::STATUS, ColType::Str), c(col::ERROR, ColType::Str), c(col::WALL_S, ColType::F64)]);
                cols.extend(RunSummary::default().columns().into_iter().map(|(n, v)| {
                    let t = match v {
                        SummaryValue::Count(_) => ColType::U64,
                        SummaryValue::Real(_) => ColType::F64,
                        SummaryValue::Label(_) => ColType::Str,
                    };
                    (n, t)
                }));
                cols
            }
            TableKind::Histograms => vec![
                c(col::RUN_ID, ColType::U32),
                c(col::METRIC, ColType::Str),
                c(col::COUNT, ColType::U64),
                c(col::HDR, ColType::Bin),
            ],
            TableKind::Timeseries => run_id_and(columns_of::<IntervalRow>()),
            TableKind::Workers => run_id_and(columns_of::<WorkerRow>()),
            TableKind::Stages => run_id_and(columns_of::<StageRow>()),
            TableKind::Requests => run_id_and(columns_of::<RequestRecord>()),
            TableKind::Steps => run_id_and(columns_of::<StepRow>()),
            TableKind::Sc25 => run_id_and(columns_of::<Sc25Row>()),
        }
    }

    fn push(&self, kind: TableKind, b: &mut TableBuilder, r: &RunResult) {
        let id = Cell::U32(r.meta.run_id);
        match kind {
            TableKind::Runs => {
                let m = &r.meta;
                let mut row =
                    vec![id, Cell::U32(m.point_id), Cell::U32(m.replicate), Cell::U64(m.seed), Cell::U64(m.run_key)];
                row.extend(r.axes.iter().map(AxisValue::cell));
                let summary = r.outcome.as_ref().ok().map(|o| o.summary.columns());
                let message = r.outcome.as_ref().err().map(ToString::to_string);
                row.push(Cell::Str(status_of(&r.outcome)));
                row.push(message.as_deref().map_or(Cell::Null, Cell::Str));
                row.push(Cell::F64(r.wall_s));
                match &summary {
                    Some(cols) => row.extend(cols.iter().map(|(_, v)| match *v {
                        SummaryValue::Count(x) => Cell::U64(x),
                        SummaryValue::Real(x) => Cell::F64(x),
                        SummaryValue::Label(x) => Cell::Str(x),
                    })),
                    None => row.extend(std::iter::repeat_n(Cell::Null, RunSummary::default().columns().len())),
                }
                b.push(&row);
            }
            TableKind::Histograms => {
                for (m, count, bytes) in &r.histograms {
                    b.push(&[id, Cell::Str(m.name()), Cell::U64(*count), Cell::Bin(bytes)]);
                }
            }
            TableKind::Timeseries => push_rows(b, id, r.outcome.as_ref().map_or(&[][..], |o| &o.series)),
            TableKind::Workers => push_rows(b, id, r.outcome.as_ref().map_or(&[][..], |o| &o.workers)),
            TableKind::Stages => push_rows(b, id, r.outcome.as_ref().map_or(&[][..], |o| &o.stages)),
            TableKind::Requests => push_rows(b, id, r.outcome.as_ref().map_or(&[][..], |o| &o.requests)),
            TableKind::Steps => push_rows(b, id, r.outcome.as_ref().map_or(&[][..], |o| &o.steps)),
            TableKind::Sc25 => push_rows(b, id, r.outcome.as_ref().map_or(&[][..], |o| &o.sc25)),
        }
    }
}

/// `run_id` and then a row type's columns.
fn run_id_and(columns: Vec<(String, ColType)>) -> Vec<(String, ColType)> {
    std::iter::once((col::RUN_ID.to_string(), ColType::U32)).chain(columns).collect()
}

/// Writes `rows` of one run, each after its run id.
fn push_rows<R: Row>(b: &mut TableBuilder, id: Cell<'_>, rows: &[R]) {
    let mut cells = Vec::new();
    for row in rows {
        cells.clear();
        cells.push(id);
        cells_of(row, &mut cells);
        b.push(&cells);
    }
}

/// An HDR histogram in the standard compressed V2 encoding (HdrHistogram's
/// `encodeIntoCompressedByteBuffer`, cookie 0x1c849314), from its plain V2
/// encoding `plain` (see [`crate::metrics::LatencyHistogram::write_v2`]):
/// what the Java, Python (`hdrh`) and Rust libraries decode directly.
///
/// The bytes are `hdrhistogram`'s `V2DeflateSerializer`'s — the cookie,
/// the length, then the V2 encoding zlib-compressed at the default level —
/// but one compressor per thread is reused: setting up a fresh compressor
/// (as that serializer does for every histogram) costs more than
/// compressing a histogram. The bytes of the last few encodings are kept
/// and reused when the same one comes again: resetting the compressor
/// alone is 100 k instructions, half of a run's histograms are usually
/// empty, and a one-stage run's stage histograms are its own.
pub fn serialize_hdr(plain: &[u8]) -> Vec<u8> {
    use flate2::{Compress, Compression, FlushCompress, Status};
    /// `V2_COMPRESSED_COOKIE` of `hdrhistogram::serialization` (not exported).
    const COOKIE: u32 = 0x1c84_9304 | 0x10;
    /// The last this many encodings are kept.
    const KEPT: usize = 16;
    type Kept = Vec<(Vec<u8>, Vec<u8>)>;
    thread_local! {
        static CODEC: std::cell::RefCell<(Compress, Kept)> =
            std::cell::RefCell::new((Compress::new(Compression::default(), true), Vec::new()));
    }
    CODEC.with_borrow_mut(|(z, kept)| {
        if let Some((_, bytes)) = kept.iter().find(|(p, _)| p == plain) {
            return bytes.clone();
        }
        let mut out = Vec::with_capacity(8 + plain.len() + 64);
        out.extend_from_slice(&COOKIE.to_be_bytes());
        out.extend_from_slice(&[0; 4]);
        z.reset();
        loop {
            let read = z.total_in() as usize;
            match z.compress_vec(&plain[read..], &mut out, FlushCompress::Finish) {
                Ok(Status::StreamEnd) => break,
                Ok(_) => out.reserve(out.capacity().max(64)),
                Err(e) => unreachable!("compressing into memory cannot fail: {e}"),
            }
        }
        let len = (out.len() - 8) as u32;
        out[4..8].copy_from_slice(&len.to_be_bytes());
        if kept.len() == KEPT {
            kept.remove(0);
        }
        kept.push((plain.to_vec(), out.clone()));
        out
    })
}

/// Reads an HDR histogram from its V2 (or V2 deflate) encoding.
pub fn deserialize_hdr(
    bytes: &[u8],
) -> Result<hdrhistogram::Histogram<u64>, hdrhistogram::serialization::DeserializeError> {
    hdrhistogram::serialization::Deserializer::new().deserialize(&mut &bytes[..])
}

/// An I/O or format problem with result files.
#[derive(Debug)]
pub enum OutputError {
    /// A file of the results, and what is wrong with it or what failed on it.
    File {
        /// The file (or directory).
        path: PathBuf,
        /// What is wrong, with the fix where there is one.
        problem: String,
    },
    /// Arrow could not assemble a batch from tables that should fit together.
    Arrow(arrow_schema::ArrowError),
}

impl OutputError {
    fn file(path: &Path, problem: impl Into<String>) -> OutputError {
        OutputError::File { path: path.to_path_buf(), problem: problem.into() }
    }
}

impl std::fmt::Display for OutputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OutputError::File { path, problem } => write!(f, "{}: {problem}", path.display()),
            OutputError::Arrow(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for OutputError {}

fn oerr(path: &Path, what: &str, e: impl std::fmt::Display) -> OutputError {
    OutputError::file(path, format!("{what}: {e}"))
}

/// zstd at level 1: a few times smaller than plain for a few per cent of the writing.
fn zstd1() -> Compression {
    Compression::ZSTD(ZstdLevel::try_new(1).expect("zstd level 1 is valid"))
}

/// Final tables are zstd-compressed, with dictionaries for text columns
/// only (numeric columns gain little from one under zstd, and setting one
/// up per column chunk was a fifth of a short run's table writing); part
/// files are temporary (nothing but the merge reads them), with no
/// dictionaries and no statistics, but compressed alike: written plain
/// they took about five times the disk of the tables they merge into.
/// A small final table (one batch of fewer than [`SMALL_TABLE_VALUES`]
/// values: a short sweep's runs, stages and workers) is written plain,
/// without statistics or a page index: a zstd frame, statistics and page
/// indexes on a handful of values are larger than the values (a reader
/// reads the whole table anyway), and they cost 4.7 M instructions of
/// every one-run process (a zstd context per column chunk 3 M).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileKind {
    Final,
    Small,
    Part,
}

/// Below this many values (rows × columns) in one batch a final table is [`FileKind::Small`].
const SMALL_TABLE_VALUES: usize = 4096;

fn writer_props(kind: FileKind, schema: &arrow_schema::Schema) -> WriterProperties {
    let b = WriterProperties::builder().set_max_row_group_row_count(Some(65_536)).set_dictionary_enabled(false);
    match kind {
        FileKind::Final => schema
            .fields()
            .iter()
            .filter(|f| f.data_type() == &arrow_schema::DataType::Utf8)
            .fold(b, |b, f| b.set_column_dictionary_enabled(ColumnPath::from(f.name().as_str()), true))
            .set_compression(zstd1()),
        FileKind::Small => b
            .set_compression(Compression::UNCOMPRESSED)
            .set_statistics_enabled(EnabledStatistics::None)
            .set_offset_index_disabled(true),
        FileKind::Part => b.set_compression(zstd1()).set_statistics_enabled(EnabledStatistics::None),
    }
    .build()
}

/// Writes one batch to `path` atomically (a final table).
pub fn write_batch(path: &Path, batch: RecordBatch) -> Result<(), OutputError> {
    write_atomic(path, FileKind::Final, batch.schema(), std::iter::once(Ok(batch)))
}

/// Writes a small table (`rows` of `columns`) to `path` atomically.
pub fn write_rows(path: &Path, columns: &[(String, ColType)], rows: &[Vec<Cell<'_>>]) -> Result<(), OutputError> {
    let mut b = TableBuilder::new(columns);
    for r in rows {
        b.push(r);
    }
    let batch = b.finish();
    write_atomic(path, FileKind::Final, batch.schema(), std::iter::once(Ok(batch)))
}

/// Writes `batches` to `path` atomically (temporary file, then rename).
fn write_atomic(
    path: &Path,
    kind: FileKind,
    schema: arrow_schema::SchemaRef,
    batches: impl IntoIterator<Item = Result<RecordBatch, OutputError>>,
) -> Result<(), OutputError> {
    let mut batches = batches.into_iter();
    let head = batches.by_ref().take(2).collect::<Result<Vec<_>, _>>()?;
    let values: usize = head.iter().map(|b| b.num_rows() * b.num_columns()).sum();
    let kind = match kind {
        FileKind::Final if head.len() < 2 && values < SMALL_TABLE_VALUES => FileKind::Small,
        kind => kind,
    };
    let tmp = path.with_extension(format!("parquet.tmp-{}", std::process::id()));
    let file = File::create(&tmp).map_err(|e| oerr(&tmp, "cannot create", e))?;
    let props = writer_props(kind, &schema);
    let mut w = ArrowWriter::try_new(file, schema, Some(props)).map_err(|e| oerr(&tmp, "cannot start Parquet", e))?;
    for b in head.into_iter().map(Ok).chain(batches) {
        w.write(&b?).map_err(|e| oerr(&tmp, "cannot write", e))?;
    }
    let file = w.into_inner().map_err(|e| oerr(&tmp, "cannot finish Parquet", e))?;
    file.sync_all().map_err(|e| oerr(&tmp, "cannot sync", e))?;
    std::fs::rename(&tmp, path).map_err(|e| oerr(path, "cannot rename into place", e))
}

/// Where a sweep's files live.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The sweep directory.
    pub dir: PathBuf,
}

impl Layout {
    /// The final file of `kind`.
    pub fn table(&self, kind: TableKind) -> PathBuf {
        self.dir.join(kind.file_name())
    }

    /// The directory of part files.
    pub fn parts_dir(&self) -> PathBuf {
        self.dir.join("parts")
    }

    /// Part files of `kind`, in name order.
    pub fn parts(&self, kind: TableKind) -> Result<Vec<PathBuf>, OutputError> {
        let dir = self.parts_dir();
        let prefix = format!("{}.", kind.name());
        let mut out = Vec::new();
        match std::fs::read_dir(&dir) {
            Ok(entries) => {
                for e in entries {
                    let p = e.map_err(|e| oerr(&dir, "cannot list", e))?.path();
                    let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                    if name.starts_with(&prefix) && name.ends_with(".parquet") {
                        out.push(p);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(oerr(&dir, "cannot list", e)),
        }
        out.sort();
        Ok(out)
    }
}

/// Removes temporary files (`*.tmp-PID`) left in the sweep directory and
/// its parts directory by processes that no longer exist (a sweep killed
/// while writing a part, or during the final merge); files of live
/// processes are kept.
pub fn remove_stale_temporaries(layout: &Layout) {
    let entries = [layout.parts_dir(), layout.dir.clone()].into_iter().filter_map(|d| std::fs::read_dir(d).ok());
    for e in entries.flatten().filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((_, pid)) = name.rsplit_once(".tmp-") else { continue };
        let alive = pid
            .parse::<u32>()
            .is_ok_and(|pid| pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists());
        if !alive {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Finished runs waiting to be written as one part.
pub struct PartBuffer {
    set: TableSet,
    runs: Vec<RunResult>,
    request_rows: usize,
}

impl PartBuffer {
    /// An empty buffer for tables of shape `set`.
    pub fn new(set: TableSet) -> PartBuffer {
        PartBuffer { set, runs: Vec::new(), request_rows: 0 }
    }

    /// Adds a finished run.
    pub fn add(&mut self, r: RunResult) {
        self.request_rows += r.outcome.as_ref().map_or(0, |o| o.requests.len());
        self.runs.push(r);
    }

    /// Runs buffered.
    pub fn len(&self) -> usize {
        self.runs.len()
    }

    /// True with nothing buffered.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Request rows buffered (the memory that matters).
    pub fn request_rows(&self) -> usize {
        self.request_rows
    }

    /// Writes the buffered runs as part files named `<table>.<tag>.parquet`
    /// and empties the buffer.
    pub fn flush(&mut self, layout: &Layout, tag: &str) -> Result<(), OutputError> {
        if self.runs.is_empty() {
            return Ok(());
        }
        let dir = layout.parts_dir();
        std::fs::create_dir_all(&dir).map_err(|e| oerr(&dir, "cannot create", e))?;
        self.write(FileKind::Part, |kind| dir.join(format!("{}.{tag}.parquet", kind.name())))
    }

    /// Writes the buffered runs directly as the final tables (when they are
    /// the whole result: no parts and no earlier tables exist) and empties
    /// the buffer.
    pub fn write_final(&mut self, layout: &Layout) -> Result<MergeReport, OutputError> {
        let runs = self.runs.len();
        self.write(FileKind::Final, |kind| layout.table(kind))?;
        // The runs' spill files were there (nothing else runs now).
        let _ = std::fs::remove_dir(layout.parts_dir());
        Ok(MergeReport { runs, parts: 0, duplicates: 0 })
    }

    fn write(&mut self, file: FileKind, path: impl Fn(TableKind) -> PathBuf) -> Result<(), OutputError> {
        self.runs.sort_by_key(|r| r.meta.run_id);
        for kind in TableKind::WRITE_ORDER {
            if !self.set.tables.contains(&kind) {
                continue;
            }
            fn spilled(r: &RunResult, kind: TableKind) -> Option<&Path> {
                r.spilled.as_ref().filter(|_| r.outcome.is_ok()).and_then(|s| s.file(kind))
            }
            if self.runs.iter().any(|r| spilled(r, kind).is_some()) {
                // Rows written as the runs went: each run's merged back into
                // the table's order, a batch at a time.
                let schema = TableBuilder::new(&self.set.columns(kind)).schema();
                let batches = self.runs.iter().flat_map(|r| -> Box<dyn Iterator<Item = _>> {
                    match spilled(r, kind) {
                        Some(p) => match spill::merged(kind, p) {
                            Ok(m) => Box::new(m),
                            Err(e) => Box::new(std::iter::once(Err(e))),
                        },
                        None => {
                            let mut b = TableBuilder::new(&self.set.columns(kind));
                            self.set.push(kind, &mut b, r);
                            Box::new(std::iter::once(Ok(b.finish())))
                        }
                    }
                });
                write_atomic(&path(kind), file, schema, batches)?;
                continue;
            }
            let mut b = TableBuilder::new(&self.set.columns(kind));
            for r in &self.runs {
                self.set.push(kind, &mut b, r);
            }
            let batch = b.finish();
            write_atomic(&path(kind), file, b.schema(), [Ok(batch)])?;
        }
        for r in &self.runs {
            if let Some(s) = &r.spilled {
                s.remove();
            }
        }
        self.runs.clear();
        self.request_rows = 0;
        Ok(())
    }
}

/// Opens a Parquet file for reading.
fn open(path: &Path) -> Result<ParquetRecordBatchReaderBuilder<File>, OutputError> {
    let f = File::open(path).map_err(|e| oerr(path, "cannot open", e))?;
    ParquetRecordBatchReaderBuilder::try_new(f).map_err(|e| oerr(path, "not a readable Parquet file", e))
}

/// Reads a whole Parquet file (for tests, reports and small tables).
pub fn read_table(path: &Path) -> Result<Vec<RecordBatch>, OutputError> {
    let reader = open(path)?.build().map_err(|e| oerr(path, "cannot read", e))?;
    reader.map(|b| b.map_err(|e| oerr(path, "cannot read", e))).collect()
}

fn run_ids(batch: &RecordBatch, path: &Path) -> Result<UInt32Array, OutputError> {
    batch
        .column(0)
        .as_any()
        .downcast_ref::<UInt32Array>()
        .cloned()
        .ok_or_else(|| OutputError::file(path, "the first column is not a u32 run_id"))
}

/// Run ids present in the runs table and runs parts of `layout`.
pub fn completed_runs(layout: &Layout) -> Result<BTreeSet<u32>, OutputError> {
    let mut files = layout.parts(TableKind::Runs)?;
    let final_runs = layout.table(TableKind::Runs);
    if final_runs.exists() {
        files.push(final_runs);
    }
    let mut ids = BTreeSet::new();
    for path in files {
        let b = open(&path)?;
        let status = b.schema().index_of(col::STATUS).map_err(|e| oerr(&path, "has no status column", e))?;
        let mask = ProjectionMask::roots(b.parquet_schema(), [0, status]);
        for batch in b.with_projection(mask).build().map_err(|e| oerr(&path, "cannot read", e))? {
            let batch = batch.map_err(|e| oerr(&path, "cannot read", e))?;
            let statuses = batch
                .column_by_name(col::STATUS)
                .and_then(|c| c.as_any().downcast_ref::<arrow_array::StringArray>())
                .ok_or_else(|| OutputError::file(&path, "its status column is not text"))?;
            let run_ids = run_ids(&batch, &path)?;
            ids.extend(
                run_ids
                    .values()
                    .iter()
                    .zip(statuses.iter())
                    .filter(|(_, st)| *st != Some(STATUS_INTERRUPTED))
                    .map(|(&id, _)| id),
            );
        }
    }
    Ok(ids)
}

/// A run already in a sweep directory (from its runs table and parts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredRun {
    /// Its run id when it was written.
    pub run_id: u32,
    /// Its grid point when it was written.
    pub point_id: u32,
    /// Its identity (absent in tables written before run keys existed).
    pub run_key: Option<u64>,
    /// Stopped by a signal (not complete).
    pub interrupted: bool,
}

/// Every run row in the directory's runs table and runs parts.
pub fn stored_runs(layout: &Layout) -> Result<Vec<StoredRun>, OutputError> {
    let mut files = layout.parts(TableKind::Runs)?;
    let final_runs = layout.table(TableKind::Runs);
    if final_runs.exists() {
        files.push(final_runs);
    }
    let mut out = Vec::new();
    for path in files {
        for batch in read_table(&path)? {
            let ids = run_ids(&batch, &path)?;
            let column = |name: &str| batch.column_by_name(name);
            let points = column(col::POINT_ID).and_then(|c| c.as_any().downcast_ref::<UInt32Array>().cloned());
            let keys =
                column(col::RUN_KEY).and_then(|c| c.as_any().downcast_ref::<arrow_array::UInt64Array>().cloned());
            let status =
                column(col::STATUS).and_then(|c| c.as_any().downcast_ref::<arrow_array::StringArray>().cloned());
            let (Some(points), Some(status)) = (points, status) else {
                return Err(OutputError::file(&path, "not a runs table of opal-sweep"));
            };
            for i in 0..batch.num_rows() {
                out.push(StoredRun {
                    run_id: ids.value(i),
                    point_id: points.value(i),
                    run_key: keys.as_ref().map(|k| k.value(i)),
                    interrupted: status.value(i) == STATUS_INTERRUPTED,
                });
            }
        }
    }
    Ok(out)
}

/// Rewrites the directory's tables (final and parts) for a changed spec:
/// the rows of each run in `keep` (by its old run id) take its new identity
/// — and, in the runs table, its new point id and axis columns, shaped as
/// `set` says — and every other run's rows are dropped. Each table becomes
/// one part (sorted by the new ids), and the old files are removed; a merge
/// then makes the final tables. Returns the rows dropped.
pub fn rebase(
    layout: &Layout,
    set: &TableSet,
    keep: &std::collections::BTreeMap<u32, (RunMeta, Vec<AxisValue>)>,
) -> Result<u64, OutputError> {
    remove_stale_temporaries(layout);
    let dir = layout.parts_dir();
    std::fs::create_dir_all(&dir).map_err(|e| oerr(&dir, "cannot create", e))?;
    let mut dropped = 0;
    let mut old_files = Vec::new();
    for kind in TableKind::WRITE_ORDER {
        let mut files = layout.parts(kind)?;
        let final_path = layout.table(kind);
        if final_path.exists() {
            files.push(final_path);
        }
        if files.is_empty() {
            continue;
        }
        old_files.extend(files.iter().cloned());
        if !set.tables.contains(&kind) {
            continue; // the spec no longer writes this table
        }
        // Slices of kept runs, each with its new id; sorted by it, stably.
        let mut slices: Vec<(u32, RecordBatch)> = Vec::new();
        for path in &files {
            for batch in read_table(path)? {
                let ids = run_ids(&batch, path)?;
                let mut start = 0;
                while start < batch.num_rows() {
                    let id = ids.value(start);
                    let mut end = start;
                    while end < batch.num_rows() && ids.value(end) == id {
                        end += 1;
                    }
                    match keep.get(&id) {
                        Some((meta, axes)) => {
                            let rows = batch.slice(start, end - start);
                            let rows = if kind == TableKind::Runs {
                                restamp_runs(&rows, set, meta, axes, path)?
                            } else {
                                with_run_id(&rows, meta.run_id)?
                            };
                            slices.push((meta.run_id, rows));
                        }
                        None => dropped += (end - start) as u64,
                    }
                    start = end;
                }
            }
        }
        slices.sort_by_key(|(id, _)| *id);
        let Some(schema) = slices.first().map(|(_, b)| b.schema()) else { continue };
        let part = dir.join(format!("{}.rebase.{}.parquet", kind.name(), std::process::id()));
        write_atomic(&part, FileKind::Part, schema, slices.into_iter().map(|(_, b)| Ok(b)))?;
    }
    for f in old_files {
        std::fs::remove_file(&f).map_err(|e| oerr(&f, "cannot remove", e))?;
    }
    Ok(dropped)
}

/// `rows` (one run's) with run id `id`.
fn with_run_id(rows: &RecordBatch, id: u32) -> Result<RecordBatch, OutputError> {
    let mut columns = rows.columns().to_vec();
    columns[0] = std::sync::Arc::new(UInt32Array::from(vec![id; rows.num_rows()]));
    RecordBatch::try_new(rows.schema(), columns).map_err(OutputError::Arrow)
}

/// One run's runs-table row with its new identity and axis columns, in the
/// columns of `set`; every other column is carried over by name.
fn restamp_runs(
    rows: &RecordBatch,
    set: &TableSet,
    meta: &RunMeta,
    axes: &[AxisValue],
    path: &Path,
) -> Result<RecordBatch, OutputError> {
    let cols = set.columns(TableKind::Runs);
    let mut fresh = TableBuilder::new(&cols);
    let fixed: Vec<Cell<'_>> = [
        Cell::U32(meta.run_id),
        Cell::U32(meta.point_id),
        Cell::U32(meta.replicate),
        Cell::U64(meta.seed),
        Cell::U64(meta.run_key),
    ]
    .into_iter()
    .chain(axes.iter().map(AxisValue::cell))
    .collect();
    let n_fixed = fixed.len();
    // The new identity and axis cells; the rest is taken from `rows`.
    let mut row = fixed;
    row.extend(std::iter::repeat_n(Cell::Null, cols.len() - n_fixed));
    for _ in 0..rows.num_rows() {
        fresh.push(&row);
    }
    let stamped = fresh.finish();
    let mut columns = stamped.columns()[..n_fixed].to_vec();
    for (name, _) in &cols[n_fixed..] {
        let c = rows.column_by_name(name).ok_or_else(|| {
            OutputError::file(
                path,
                format!(
                    "has no column `{name}` — written by another version of opal-sweep?\n  fix: rerun with --overwrite"
                ),
            )
        })?;
        columns.push(c.clone());
    }
    RecordBatch::try_new(stamped.schema(), columns).map_err(|e| {
        OutputError::file(path, format!("its columns do not match this version's ({e})\n  fix: rerun with --overwrite"))
    })
}

/// The runs table's `status` of an outcome: `ok`, `failed`, or
/// `interrupted` (stopped by a signal: not complete, so `--resume` runs it
/// again and the new row replaces this one).
pub fn status_of(outcome: &Result<RunOutput, RunError>) -> &'static str {
    match outcome {
        Ok(_) => STATUS_OK,
        Err(RunError::Interrupted { .. }) => STATUS_INTERRUPTED,
        Err(_) => "failed",
    }
}

const STATUS_OK: &str = "ok";
const STATUS_INTERRUPTED: &str = "interrupted";

/// Whether the runs-table rows in `batches` (one run's) record an interrupted run.
fn interrupted(batches: &[RecordBatch]) -> bool {
    batches.iter().any(|b| {
        b.column_by_name(col::STATUS)
            .and_then(|c| c.as_any().downcast_ref::<arrow_array::StringArray>())
            .is_some_and(|s| s.iter().any(|v| v == Some(STATUS_INTERRUPTED)))
    })
}

/// One input of a merge: a reader positioned at the start of a run.
struct RunStream {
    path: PathBuf,
    reader: ParquetRecordBatchReader,
    batch: Option<(RecordBatch, UInt32Array)>,
    pos: usize,
}

impl RunStream {
    fn new(path: PathBuf) -> Result<RunStream, OutputError> {
        let reader = open(&path)?.build().map_err(|e| oerr(&path, "cannot read", e))?;
        Ok(RunStream { path, reader, batch: None, pos: 0 })
    }

    fn schema(&self) -> arrow_schema::SchemaRef {
        self.reader.schema()
    }

    /// The run id at the current position, loading batches as needed.
    fn peek(&mut self) -> Result<Option<u32>, OutputError> {
        loop {
            if let Some((b, ids)) = &self.batch
                && self.pos < b.num_rows()
            {
                return Ok(Some(ids.value(self.pos)));
            }
            match self.reader.next() {
                None => {
                    self.batch = None;
                    return Ok(None);
                }
                Some(b) => {
                    let b = b.map_err(|e| oerr(&self.path, "cannot read", e))?;
                    let ids = run_ids(&b, &self.path)?;
                    self.batch = Some((b, ids));
                    self.pos = 0;
                }
            }
        }
    }

    /// The next rows of run `id` in the batch at hand (`None` once the run's rows are all taken).
    fn take_slice(&mut self, id: u32) -> Result<Option<RecordBatch>, OutputError> {
        if self.peek()? != Some(id) {
            return Ok(None);
        }
        let (b, ids) = self.batch.as_ref().expect("peek loaded a batch");
        let start = self.pos;
        let mut end = start;
        while end < b.num_rows() && ids.value(end) == id {
            end += 1;
        }
        self.pos = end;
        Ok(Some(b.slice(start, end - start)))
    }

    /// Moves the rows of run `id` (which must be current) into `out` (or drops them).
    fn take_run(&mut self, id: u32, mut out: Option<&mut Vec<RecordBatch>>) -> Result<(), OutputError> {
        while let Some(slice) = self.take_slice(id)? {
            if let Some(out) = out.as_deref_mut() {
                out.push(slice);
            }
        }
        Ok(())
    }
}

/// Rows per batch a merge writes (several runs' rows together).
const MERGE_BATCH_ROWS: usize = 8192;

/// What a merge did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MergeReport {
    /// Runs in the merged runs table.
    pub runs: usize,
    /// Part files consumed.
    pub parts: usize,
    /// Runs found more than once (the first complete copy was kept).
    pub duplicates: usize,
}

/// Run `id` is copied from input `first`: its copies in the other inputs
/// are dropped (counted in `dups`), and every input it held is queued at its
/// next run. With `kept` (the runs table, whose first copy is held whole),
/// a later copy replaces a kept one that records an interrupted run (a
/// resumed run replaces its interruption).
fn finish_run(
    inputs: &mut [RunStream],
    heap: &mut BinaryHeap<Reverse<(u32, usize)>>,
    id: u32,
    first: usize,
    dups: &mut usize,
    mut kept: Option<&mut Vec<RecordBatch>>,
) -> Result<(), OutputError> {
    if let Some(next) = inputs[first].peek()? {
        heap.push(Reverse((next, first)));
    }
    while let Some(&Reverse((dup, i))) = heap.peek() {
        if dup != id {
            break;
        }
        heap.pop();
        match kept.as_deref_mut() {
            Some(kept) if interrupted(kept) => {
                kept.clear();
                inputs[i].take_run(id, Some(kept))?;
            }
            _ => inputs[i].take_run(id, None)?,
        }
        *dups += 1;
        if let Some(next) = inputs[i].peek()? {
            heap.push(Reverse((next, i)));
        }
    }
    Ok(())
}

/// Merges the parts of every table in `tables` (and any existing final
/// tables) into the final tables, sorted by run id, then removes the parts.
pub fn merge(layout: &Layout, tables: &BTreeSet<TableKind>) -> Result<MergeReport, OutputError> {
    remove_stale_temporaries(layout);
    let mut report = MergeReport::default();
    let mut consumed = Vec::new();
    // Runs last: until it is replaced, the old runs table still describes what is complete.
    for kind in TableKind::WRITE_ORDER {
        let parts = layout.parts(kind)?;
        let final_path = layout.table(kind);
        if parts.is_empty() {
            if kind == TableKind::Runs && final_path.exists() {
                report.runs = completed_runs(layout)?.len();
            }
            continue;
        }
        if !tables.contains(&kind) {
            return Err(OutputError::file(
                &layout.parts_dir(),
                format!("parts of the {} table exist but the spec does not ask for it", kind.name()),
            ));
        }
        let mut inputs = Vec::new();
        if final_path.exists() {
            inputs.push(RunStream::new(final_path.clone())?);
        }
        for p in &parts {
            inputs.push(RunStream::new(p.clone())?);
        }
        let schema = inputs[0].schema();
        if let Some(other) = inputs.iter().find(|s| s.schema().fields() != schema.fields()) {
            return Err(OutputError::file(
                &other.path,
                format!(
                    "its columns differ from {} — were these results written by different specs?",
                    inputs[0].path.display()
                ),
            ));
        }
        // A k-way merge: a heap of each input's next run id, so a merge costs
        // O(rows + runs · log inputs); runs go out in batches of ≥ 8,192 rows.
        let mut heap: BinaryHeap<Reverse<(u32, usize)>> = BinaryHeap::new();
        for (i, s) in inputs.iter_mut().enumerate() {
            if let Some(id) = s.peek()? {
                heap.push(Reverse((id, i)));
            }
        }
        let mut runs = 0;
        let mut dups = 0;
        let out_schema = schema.clone();
        // A run being copied from an input a slice at a time (every table
        // but runs: a run's rows may be millions, and only the runs table's
        // first copy can be replaced by a later one).
        let mut copying: Option<(u32, usize)> = None;
        let merged = std::iter::from_fn(|| -> Option<Result<RecordBatch, OutputError>> {
            let step = (|| -> Result<Option<RecordBatch>, OutputError> {
                let mut slices: Vec<RecordBatch> = Vec::new();
                let mut rows = 0;
                while rows < MERGE_BATCH_ROWS {
                    if let Some((id, i)) = copying {
                        match inputs[i].take_slice(id)? {
                            Some(slice) => {
                                rows += slice.num_rows();
                                slices.push(slice);
                                continue;
                            }
                            None => {
                                copying = None;
                                finish_run(&mut inputs, &mut heap, id, i, &mut dups, None)?;
                                continue;
                            }
                        }
                    }
                    let Some(Reverse((id, first))) = heap.pop() else { break };
                    runs += 1;
                    if kind != TableKind::Runs {
                        copying = Some((id, first));
                        continue;
                    }
                    let mut kept = Vec::new();
                    inputs[first].take_run(id, Some(&mut kept))?;
                    finish_run(&mut inputs, &mut heap, id, first, &mut dups, Some(&mut kept))?;
                    rows += kept.iter().map(RecordBatch::num_rows).sum::<usize>();
                    slices.append(&mut kept);
                }
                if slices.is_empty() {
                    return Ok(None);
                }
                Ok(Some(arrow_select::concat::concat_batches(&out_schema, &slices).map_err(OutputError::Arrow)?))
            })();
            step.transpose()
        });
        write_atomic(&final_path, FileKind::Final, schema.clone(), merged)?;
        if kind == TableKind::Runs {
            report.runs = runs;
            report.duplicates = dups;
        }
        report.parts += parts.len();
        consumed.extend(parts);
    }
    for p in consumed {
        std::fs::remove_file(&p).map_err(|e| oerr(&p, "cannot remove merged part", e))?;
    }
    let _ = std::fs::remove_dir(layout.parts_dir()); // only if empty
    Ok(report)
}

/// A column of a batch as `f64`s (integers converted), for reading results back.
pub fn f64_column(batch: &RecordBatch, name: &str) -> Option<Vec<Option<f64>>> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, Int64Type, UInt32Type, UInt64Type};
    let col = batch.column_by_name(name)?;
    let get = |i: usize| -> Option<f64> {
        if col.is_null(i) {
            return None;
        }
        match col.data_type() {
            arrow_schema::DataType::Float64 => Some(col.as_primitive::<Float64Type>().value(i)),
            arrow_schema::DataType::UInt64 => Some(col.as_primitive::<UInt64Type>().value(i) as f64),
            arrow_schema::DataType::UInt32 => Some(f64::from(col.as_primitive::<UInt32Type>().value(i))),
            arrow_schema::DataType::Int64 => Some(col.as_primitive::<Int64Type>().value(i) as f64),
            _ => None,
        }
    };
    Some((0..batch.num_rows()).map(get).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporaries_of_dead_processes_are_removed_from_the_directory_and_its_parts() {
        let dir = std::env::temp_dir().join(format!("opal-stale-{}", std::process::id()));
        let layout = Layout { dir: dir.clone() };
        std::fs::create_dir_all(layout.parts_dir()).unwrap();
        // No process has id u32::MAX; this one is alive.
        let dead = [dir.join("runs.parquet.tmp-4294967295"), dir.join("manifest.json.tmp-4294967295")];
        let dead_part = layout.parts_dir().join("runs-0001.parquet.tmp-4294967295");
        let live = dir.join(format!("requests.parquet.tmp-{}", std::process::id()));
        let kept = dir.join("runs.parquet");
        for f in dead.iter().chain([&dead_part, &live, &kept]) {
            std::fs::write(f, b"x").unwrap();
        }
        remove_stale_temporaries(&layout);
        for f in dead.iter().chain([&dead_part]) {
            assert!(!f.exists(), "{} left behind", f.display());
        }
        assert!(live.exists() && kept.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn final_tables_have_dictionaries_for_text_only_and_parts_are_compressed_without_them() {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let dir = std::env::temp_dir().join(format!("opal-props-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let columns = [("name".to_string(), ColType::Str), ("x".to_string(), ColType::F64)];
        // 2,100 rows of 2 columns: above SMALL_TABLE_VALUES.
        let rows: Vec<Vec<Cell>> = (0..2100).map(|i| vec![Cell::Str("a"), Cell::F64(f64::from(i % 3))]).collect();
        let fin = dir.join("final.parquet");
        write_rows(&fin, &columns, &rows).unwrap();
        let small = dir.join("small.parquet");
        write_rows(&small, &columns, &rows[..2047]).unwrap();
        let part = dir.join("part.parquet");
        let batch = {
            let mut b = TableBuilder::new(&columns);
            rows.iter().for_each(|r| b.push(r));
            b.finish()
        };
        write_atomic(&part, FileKind::Part, batch.schema(), [Ok(batch)]).unwrap();
        // (dictionary page?, compression, statistics?) of each column chunk.
        let chunks = |path: &Path| {
            let reader = SerializedFileReader::new(File::open(path).unwrap()).unwrap();
            let group = reader.metadata().row_group(0);
            group
                .columns()
                .iter()
                .map(|c| (c.dictionary_page_offset().is_some(), c.compression(), c.statistics().is_some()))
                .collect::<Vec<_>>()
        };
        let zstd = Compression::ZSTD(ZstdLevel::try_new(1).unwrap());
        assert_eq!(chunks(&fin), [(true, zstd, true), (false, zstd, true)]);
        // A small table: plain, no statistics, no page index.
        let plain = (false, Compression::UNCOMPRESSED, false);
        assert_eq!(chunks(&small), [plain, plain]);
        let index = |path: &Path| {
            let reader = SerializedFileReader::new(File::open(path).unwrap()).unwrap();
            let columns = reader.metadata().row_group(0).columns().to_vec();
            columns.iter().any(|c| c.column_index_offset().is_some() || c.offset_index_offset().is_some())
        };
        assert!(index(&fin) && !index(&small), "a page index for the large table only");
        let back = read_table(&small).unwrap();
        assert_eq!(back.iter().map(RecordBatch::num_rows).sum::<usize>(), 2047, "read back whole");
        // Parts: no dictionaries, no statistics, but zstd (plain, they took
        // about five times the disk of the tables they merge into).
        let part_chunk = (false, zstd, false);
        assert_eq!(chunks(&part), [part_chunk, part_chunk]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hdr_v2_round_trip_keeps_every_count() {
        let mut l = crate::metrics::LatencyHistogram::default();
        for us in [1u64, 10, 100, 1000, 123_456] {
            l.record_n(crate::time::SimDuration(us * 1_000), us);
        }
        let mut plain = Vec::new();
        l.write_v2(&mut plain);
        let (back, h) = (deserialize_hdr(&serialize_hdr(&plain)).unwrap(), l.histogram());
        assert_eq!(back, h);
        assert_eq!(back.value_at_quantile(0.99), h.value_at_quantile(0.99));
        assert_eq!(h.count_at(123_456), 123_456);
    }

    #[test]
    fn hdr_bytes_are_the_crates_compressed_v2_with_one_compressor_reused() {
        // Histograms empty, small and wide (several compressor calls), one
        // after another on one thread, then some again (their kept bytes),
        // then 20 others (the first ones no longer kept) and the first again:
        // the bytes V2DeflateSerializer writes.
        use hdrhistogram::serialization::{Serializer, V2DeflateSerializer, V2Serializer};
        let mut x = 0x9e37_79b9_u64;
        let mut made = |n: u64| {
            let mut h = hdrhistogram::Histogram::<u64>::new(3).unwrap();
            for _ in 0..n {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                h.record_n((x >> 20) % 3_600_000_000, 1 + (x >> 60)).unwrap();
            }
            h
        };
        let first: Vec<_> = [0u64, 1, 5, 300, 20_000].into_iter().map(&mut made).collect();
        let others: Vec<_> = (0..20).map(|n| made(n + 2)).collect();
        let order = first.iter().chain(first.iter().rev()).chain(&others).chain(&first);
        for h in order {
            let mut theirs = Vec::new();
            V2DeflateSerializer::new().serialize(h, &mut theirs).unwrap();
            let mut plain = Vec::new();
            V2Serializer::new().serialize(h, &mut plain).unwrap();
            assert_eq!(serialize_hdr(&plain), theirs, "{} values", h.len());
        }
    }
}
