//! A run's per-row tables (requests, steps) written as the run goes, so
//! that neither the run nor the writer holds more than a bounded number of
//! rows whatever the run's length.
//!
//! The run hands its rows over in chunks, each sorted by the table's order
//! ([`RowSink`]); [`RunSpill`] writes every chunk as one row group of a
//! spill file in the parts directory (`<table>.run<id>.spill.tmp-<pid>`:
//! a killed process's spill is removed as any of its temporaries). The
//! chunks' key ranges overlap (a long step ends after shorter ones that
//! started later), so when the run's rows go into a part file they are
//! merged back into one order ([`merged`]): a k-way merge of the row groups,
//! reading a few hundred rows of each at a time — in passes, through
//! intermediate spill files, when a run has more than [`FAN_IN`] chunks.

use super::{Layout, OutputError, TableKind, TableSet, oerr, push_rows};
use crate::metrics::rows::{Row, col};
use crate::metrics::table::{Cell, ColType, TableBuilder};
use crate::metrics::{RequestRecord, RowSink, SinkError, StepRow};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, UInt32Type};
use arrow_array::{Array, RecordBatch};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::basic::Compression;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Most sorted inputs one merge pass reads at once (open files, and a batch
/// of each in memory).
pub const FAN_IN: usize = 64;
/// Rows a merge holds of all its inputs together (the batch size of each).
const MERGE_ROWS: usize = 65_536;
/// Rows per batch a merge writes.
const OUT_ROWS: usize = 8_192;

/// One table of a run being spilled.
struct Spill {
    kind: TableKind,
    columns: Vec<(String, ColType)>,
    path: PathBuf,
    writer: Option<ArrowWriter<File>>,
}

/// The spill files of a run being written (see the module docs).
pub struct RunSpill {
    run_id: u32,
    dir: PathBuf,
    tables: Vec<Spill>,
}

/// A finished run's spill files, by table (a table the run wrote no row of has none).
#[derive(Clone, Debug, Default)]
pub struct Spilled {
    files: Vec<(TableKind, PathBuf)>,
}

impl Spilled {
    /// The spill file of `kind`, if the run wrote rows of it.
    pub fn file(&self, kind: TableKind) -> Option<&Path> {
        self.files.iter().find(|(k, _)| *k == kind).map(|(_, p)| p.as_path())
    }

    /// Removes the files (their rows are in a part, or the run failed).
    pub fn remove(&self) {
        for (_, p) in &self.files {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn props() -> WriterProperties {
    // Read once, by the merge: plain, with no statistics, a row group per
    // chunk, and small pages — a reader holds a page (and, compressed, a
    // decoder) of every column of every input it merges. (Compressed, the
    // 1M-request run took 36 % more CPU and twice the memory; plain, a
    // spill takes about 150 bytes per step row on disk while its run lasts.)
    WriterProperties::builder()
        .set_compression(Compression::UNCOMPRESSED)
        .set_statistics_enabled(EnabledStatistics::None)
        .set_dictionary_enabled(false)
        .set_max_row_group_row_count(Some(65_536))
        .set_data_page_row_count_limit(1024)
        .set_write_batch_size(1024)
        .build()
}

impl RunSpill {
    /// A spill for run `run_id`'s per-row tables among `set` (none asked: nothing to do).
    pub fn new(layout: &Layout, set: &TableSet, run_id: u32) -> RunSpill {
        let dir = layout.parts_dir();
        let tables = [TableKind::Requests, TableKind::Steps]
            .into_iter()
            .filter(|k| set.tables.contains(k))
            .map(|kind| Spill {
                kind,
                columns: set.columns(kind),
                path: dir.join(format!("{}.run{run_id}.spill.tmp-{}", kind.name(), std::process::id())),
                writer: None,
            })
            .collect();
        RunSpill { run_id, dir, tables }
    }

    /// Whether the run has any table to spill.
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    fn write<R: Row>(&mut self, kind: TableKind, rows: &[R]) -> Result<(), OutputError> {
        let Some(t) = self.tables.iter_mut().find(|t| t.kind == kind) else { return Ok(()) };
        if rows.is_empty() {
            return Ok(());
        }
        let mut b = TableBuilder::new(&t.columns);
        push_rows(&mut b, Cell::U32(self.run_id), rows);
        let batch = b.finish();
        if t.writer.is_none() {
            std::fs::create_dir_all(&self.dir).map_err(|e| oerr(&self.dir, "cannot create", e))?;
            let file = File::create(&t.path).map_err(|e| oerr(&t.path, "cannot create", e))?;
            let w = ArrowWriter::try_new(file, b.schema(), Some(props()))
                .map_err(|e| oerr(&t.path, "cannot start Parquet", e))?;
            t.writer = Some(w);
        }
        let w = t.writer.as_mut().expect("opened above");
        w.write(&batch).map_err(|e| oerr(&t.path, "cannot write", e))?;
        // One row group per chunk: each is sorted, and the merge reads them apart.
        w.flush().map_err(|e| oerr(&t.path, "cannot write", e))
    }

    /// Closes the files: the run's rows, ready for a part.
    pub fn finish(self) -> Result<Spilled, OutputError> {
        let mut files = Vec::new();
        for t in self.tables {
            if let Some(w) = t.writer {
                w.close().map_err(|e| oerr(&t.path, "cannot finish Parquet", e))?;
                files.push((t.kind, t.path));
            }
        }
        Ok(Spilled { files })
    }

    /// Removes what was written (the run failed).
    pub fn discard(self) {
        for t in self.tables {
            drop(t.writer);
            let _ = std::fs::remove_file(&t.path);
        }
    }
}

impl RowSink for RunSpill {
    fn requests(&mut self, rows: &[RequestRecord]) -> Result<(), SinkError> {
        Ok(self.write(TableKind::Requests, rows)?)
    }

    fn steps(&mut self, rows: &[StepRow]) -> Result<(), SinkError> {
        Ok(self.write(TableKind::Steps, rows)?)
    }
}

/// A sorted input of a merge: row groups `groups` of `path`, read in order.
#[derive(Clone, Debug)]
struct Source {
    path: PathBuf,
    groups: Vec<usize>,
}

/// A row's place in a table's order: requests by id; steps by start, then
/// worker (a start is never negative, so its bits order as its value).
type Key = (u64, u32);

/// Reads the key of every row of a batch of `kind`.
fn keys(kind: TableKind, b: &RecordBatch, path: &Path) -> Result<Vec<Key>, OutputError> {
    let u32s = |name: &str| {
        b.column_by_name(name)
            .and_then(|c| c.as_primitive_opt::<UInt32Type>())
            .ok_or_else(|| OutputError::file(path, format!("a spilled {} batch lacks `{name}`", kind.name())))
    };
    match kind {
        TableKind::Steps => {
            let workers = u32s(col::WORKER)?;
            let starts = b
                .column_by_name(col::START_S)
                .and_then(|c| c.as_primitive_opt::<Float64Type>())
                .ok_or_else(|| OutputError::file(path, format!("a spilled steps batch lacks `{}`", col::START_S)))?;
            Ok((0..b.num_rows()).map(|i| (starts.value(i).to_bits(), workers.value(i))).collect())
        }
        _ => {
            let ids = u32s(col::REQUEST_ID)?;
            Ok((0..b.num_rows()).map(|i| (u64::from(ids.value(i)), 0)).collect())
        }
    }
}

/// One input being read: its reader, the batch in hand (its index in the
/// merge's list of batches), its keys and the next row.
struct Input {
    reader: ParquetRecordBatchReader,
    path: PathBuf,
    batch: usize,
    keys: Vec<Key>,
    pos: usize,
}

/// A k-way merge of at most [`FAN_IN`] sorted sources, as an iterator of batches.
pub struct Merge {
    kind: TableKind,
    schema: arrow_schema::SchemaRef,
    inputs: Vec<Input>,
    /// Batches the rows to emit come from (each input's current one and
    /// older ones not yet emitted).
    batches: Vec<RecordBatch>,
    heap: BinaryHeap<Reverse<(Key, usize)>>,
    out: Vec<(usize, usize)>,
    done: bool,
}

impl Merge {
    fn new(kind: TableKind, sources: &[Source]) -> Result<Merge, OutputError> {
        let rows = (MERGE_ROWS / sources.len().max(1)).max(64);
        let mut inputs = Vec::new();
        let mut metas: Vec<(PathBuf, ArrowReaderMetadata)> = Vec::new();
        let mut schema = None;
        for s in sources {
            let file = File::open(&s.path).map_err(|e| oerr(&s.path, "cannot open", e))?;
            // Every source of a file shares its metadata (read once).
            let meta = match metas.iter().find(|(p, _)| *p == s.path) {
                Some((_, m)) => m.clone(),
                None => {
                    let m = ArrowReaderMetadata::load(&file, Default::default())
                        .map_err(|e| oerr(&s.path, "not a readable Parquet file", e))?;
                    metas.push((s.path.clone(), m.clone()));
                    m
                }
            };
            schema.get_or_insert_with(|| meta.schema().clone());
            let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta)
                .with_row_groups(s.groups.clone())
                .with_batch_size(rows)
                .build()
                .map_err(|e| oerr(&s.path, "cannot read", e))?;
            inputs.push(Input { reader, path: s.path.clone(), batch: 0, keys: Vec::new(), pos: 0 });
        }
        let schema = schema.ok_or_else(|| OutputError::file(Path::new("."), "a merge of nothing"))?;
        let mut m =
            Merge { kind, schema, inputs, batches: Vec::new(), heap: BinaryHeap::new(), out: Vec::new(), done: false };
        for i in 0..m.inputs.len() {
            m.load(i)?;
        }
        Ok(m)
    }

    /// Loads input `i`'s next batch (if any) and queues its first row.
    fn load(&mut self, i: usize) -> Result<(), OutputError> {
        let input = &mut self.inputs[i];
        loop {
            match input.reader.next() {
                None => return Ok(()),
                Some(b) => {
                    let b = b.map_err(|e| oerr(&input.path, "cannot read", e))?;
                    if b.num_rows() == 0 {
                        continue;
                    }
                    input.keys = keys(self.kind, &b, &input.path)?;
                    input.pos = 0;
                    input.batch = self.batches.len();
                    self.batches.push(b);
                    self.heap.push(Reverse((input.keys[0], i)));
                    return Ok(());
                }
            }
        }
    }

    /// The rows gathered so far as one batch; only the inputs' current batches are kept.
    fn emit(&mut self) -> Result<RecordBatch, OutputError> {
        let columns = (0..self.schema.fields().len())
            .map(|c| {
                let arrays: Vec<&dyn Array> = self.batches.iter().map(|b| b.column(c).as_ref()).collect();
                arrow_select::interleave::interleave(&arrays, &self.out).map_err(OutputError::Arrow)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let batch = RecordBatch::try_new(self.schema.clone(), columns).map_err(OutputError::Arrow)?;
        self.out.clear();
        // Keep the batches still being read, renumbered.
        let mut kept = Vec::new();
        for input in &mut self.inputs {
            if input.pos < input.keys.len() {
                kept.push(self.batches[input.batch].clone());
                input.batch = kept.len() - 1;
            }
        }
        self.batches = kept;
        Ok(batch)
    }

    fn next_batch(&mut self) -> Result<Option<RecordBatch>, OutputError> {
        if self.done {
            return Ok(None);
        }
        while self.out.len() < OUT_ROWS {
            let Some(Reverse((_, i))) = self.heap.pop() else {
                self.done = true;
                break;
            };
            let input = &mut self.inputs[i];
            self.out.push((input.batch, input.pos));
            input.pos += 1;
            if input.pos < input.keys.len() {
                self.heap.push(Reverse((input.keys[input.pos], i)));
            } else {
                self.load(i)?;
            }
        }
        if self.out.is_empty() { Ok(None) } else { self.emit().map(Some) }
    }
}

impl Iterator for Merge {
    type Item = Result<RecordBatch, OutputError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_batch() {
            Ok(b) => b.map(Ok),
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// The rows of spill file `path` (of table `kind`) in the table's order, as
/// batches: its row groups merged, through intermediate files next to it
/// (removed as they are consumed) when there are more than [`FAN_IN`].
pub fn merged(kind: TableKind, path: &Path) -> Result<Merge, OutputError> {
    let file = File::open(path).map_err(|e| oerr(path, "cannot open", e))?;
    let meta = ArrowReaderMetadata::load(&file, Default::default())
        .map_err(|e| oerr(path, "not a readable Parquet file", e))?;
    let groups = meta.metadata().num_row_groups();
    let mut sources: Vec<Source> = (0..groups).map(|g| Source { path: path.to_path_buf(), groups: vec![g] }).collect();
    let mut pass = 0;
    while sources.len() > FAN_IN {
        pass += 1;
        let mut next = Vec::new();
        for (n, group) in sources.chunks(FAN_IN).enumerate() {
            let out = path.with_extension(format!("merge{pass}-{n}"));
            write_sorted(&out, Merge::new(kind, group)?)?;
            next.push(Source { path: out.clone(), groups: Vec::new() });
        }
        // The intermediate files of the pass before are consumed.
        for s in &sources {
            if s.path != path {
                let _ = std::fs::remove_file(&s.path);
            }
        }
        for s in &mut next {
            let f = File::open(&s.path).map_err(|e| oerr(&s.path, "cannot open", e))?;
            let m = ArrowReaderMetadata::load(&f, Default::default())
                .map_err(|e| oerr(&s.path, "not a readable Parquet file", e))?;
            s.groups = (0..m.metadata().num_row_groups()).collect();
        }
        sources = next;
    }
    let merge = Merge::new(kind, &sources)?;
    let leftovers: Vec<PathBuf> = sources.iter().map(|s| s.path.clone()).filter(|p| p != path).collect();
    // Intermediate files go once their rows have been read (open files stay readable).
    for p in &leftovers {
        let _ = std::fs::remove_file(p);
    }
    Ok(merge)
}

/// Writes a merge's batches to `path` (an intermediate file, read once).
fn write_sorted(path: &Path, merge: Merge) -> Result<(), OutputError> {
    let file = File::create(path).map_err(|e| oerr(path, "cannot create", e))?;
    let mut w = ArrowWriter::try_new(file, merge.schema.clone(), Some(props()))
        .map_err(|e| oerr(path, "cannot start Parquet", e))?;
    for b in merge {
        w.write(&b?).map_err(|e| oerr(path, "cannot write", e))?;
    }
    w.close().map_err(|e| oerr(path, "cannot finish Parquet", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::ColType;
    use std::collections::BTreeSet;

    fn set(tables: &[TableKind]) -> TableSet {
        let axis: Vec<(String, ColType)> = Vec::new();
        TableSet { tables: tables.iter().copied().collect::<BTreeSet<_>>(), axis_columns: axis }
    }

    /// The (start, worker) of every row of the merged steps of `path`.
    fn merged_steps(path: &Path) -> Vec<(f64, u32)> {
        let mut out = Vec::new();
        for b in merged(TableKind::Steps, path).unwrap() {
            let b = b.unwrap();
            let starts = b.column_by_name(col::START_S).unwrap().as_primitive::<Float64Type>();
            let workers = b.column_by_name(col::WORKER).unwrap().as_primitive::<UInt32Type>();
            out.extend((0..b.num_rows()).map(|i| (starts.value(i), workers.value(i))));
        }
        out
    }

    #[test]
    fn overlapping_sorted_chunks_come_back_in_one_order_through_intermediate_passes() {
        let dir = std::env::temp_dir().join(format!("opal-spill-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let layout = Layout { dir: dir.clone() };
        let mut spill = RunSpill::new(&layout, &set(&[TableKind::Runs, TableKind::Steps]), 7);
        // FAN_IN × 2 + 3 chunks of 50 rows (two merge passes), each sorted,
        // their ranges overlapping: chunk c holds starts c, c + 1.5, c + 3, ….
        let chunks = 2 * FAN_IN + 3;
        let mut all = Vec::new();
        for c in 0..chunks {
            let rows: Vec<StepRow> = (0..50)
                .map(|i| StepRow { worker: (i % 3) as u32, start_s: c as f64 + 1.5 * i as f64, ..Default::default() })
                .collect();
            all.extend(rows.iter().map(|r| (r.start_s, r.worker)));
            spill.steps(&rows).unwrap();
        }
        // Nothing of the requests table was asked for: no file for it.
        spill.requests(&[RequestRecord::default()]).unwrap();
        let spilled = spill.finish().unwrap();
        assert!(spilled.file(TableKind::Requests).is_none());
        let path = spilled.file(TableKind::Steps).unwrap().to_path_buf();
        let got = merged_steps(&path);
        all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        assert_eq!(got.len(), chunks * 50);
        assert_eq!(got, all);
        // The intermediate files are gone; the spill itself goes with `remove`.
        let left = || std::fs::read_dir(layout.parts_dir()).unwrap().count();
        assert_eq!(left(), 1);
        spilled.remove();
        assert_eq!(left(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
