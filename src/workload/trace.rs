//! Mooncake-style JSONL trace replay, streamed line by line.
//!
//! Each line is `{"timestamp", "input_length", "output_length", "hash_ids"}`;
//! every hash id stands for `chunk_size` tokens and, as in the Mooncake
//! traces, for everything before them. A request is sent at
//! `stage start + start_offset + timestamp × multiplier_to_sec × time_scale`
//! (timestamps are relative to the stage start, so a trace can follow
//! another stage; rows out of order are sent at once, and counted). Traces
//! with absolute (epoch) timestamps are refused unless `shift_to_first`
//! makes every timestamp relative to the first line's.
//!
//! Content: hash id `h` is the segment `("trace", h)` of `chunk_size` tokens
//! (the last one as long as the prompt leaves); tokens beyond what the hash
//! ids cover get request-unique content, and hash ids beyond `input_length`
//! are refused (more ids than the prompt has chunks means a wrong
//! `chunk_size`). Output lengths of 0 are sent as 1 (an engine produces at
//! least one token), and counted. A UTF-8 byte-order mark is ignored.

use super::{Due, Emit, Generator, Label};
use crate::kvcache::{Content, content_id};
use crate::time::{SimDuration, SimTime};
use serde::Deserialize;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;

/// A resolved trace stage.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceStage {
    /// The JSONL file.
    pub path: PathBuf,
    /// Tokens per hash id.
    pub chunk_size: u32,
    /// Timestamp units → seconds.
    pub multiplier_to_sec: f64,
    /// Factor on every arrival time (0.5 = twice as fast).
    pub time_scale: f64,
    /// Seconds added to every arrival time.
    pub start_offset: f64,
    /// Requests to replay (`None` = the whole file).
    pub total: Option<u64>,
    /// Skip malformed lines (counted) instead of failing.
    pub skip_bad_lines: bool,
    /// Make timestamps relative to the first line's (for epoch timestamps).
    pub shift_to_first: bool,
    /// Re-time the requests as arrivals of this process at this rate
    /// (requests/s), keeping their order and content (`None`: the trace's
    /// timestamps).
    pub retime: Option<(super::arrivals::ArrivalProcess, f64)>,
}

/// A first arrival later than this many seconds after the stage start
/// (3.2 years) means the timestamps are absolute, not relative.
const ABSOLUTE_TIMESTAMP_SECS: f64 = 1e8;

impl TraceStage {
    /// The whole of `path`, as Mooncake traces are written (512 tokens per
    /// hash id, millisecond timestamps), at recorded speed, failing on a bad line.
    pub fn whole_file(path: PathBuf) -> TraceStage {
        TraceStage {
            path,
            chunk_size: 512,
            multiplier_to_sec: 0.001,
            time_scale: 1.0,
            start_offset: 0.0,
            total: None,
            skip_bad_lines: false,
            shift_to_first: false,
            retime: None,
        }
    }
}

/// Only a row's time (what a burst scan reads: serde skips the rest
/// without building it).
#[derive(Deserialize)]
struct Time {
    timestamp: f64,
}

#[derive(Deserialize)]
struct Row {
    timestamp: f64,
    input_length: u64,
    output_length: u64,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// One replayed request.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRequest {
    /// Seconds after the stage start.
    pub offset: SimDuration,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens.
    pub output_tokens: u32,
    /// Prompt content.
    pub content: Content,
}

/// Streams a trace file: one reused line buffer, one row at a time.
#[derive(Debug)]
pub struct TraceReader {
    cfg: TraceStage,
    /// The open file; `None` once the replay is over.
    file: Option<BufReader<File>>,
    line: String,
    line_no: u64,
    sent: u64,
    /// The first row's timestamp (what `shift_to_first` subtracts).
    first: Option<f64>,
    /// The previous row's timestamp.
    last: f64,
    /// Lines counted as they were read.
    pub counts: TraceCounts,
}

/// What a replay adjusted or left out, line by line (reported per run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceCounts {
    /// Malformed lines skipped (`skip_bad_lines`).
    pub skipped: u64,
    /// Lines with a timestamp earlier than the line before (sent at once).
    pub reordered: u64,
    /// Lines with `output_length` 0 (sent with 1).
    pub outputs_raised: u64,
}

impl std::ops::AddAssign for TraceCounts {
    fn add_assign(&mut self, o: TraceCounts) {
        self.skipped += o.skipped;
        self.reordered += o.reordered;
        self.outputs_raised += o.outputs_raised;
    }
}

/// A problem with a trace file: where, what, and how to fix it.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceError {
    /// The file.
    pub path: String,
    /// 1-based line, when the problem is one line.
    pub line: Option<u64>,
    /// What is wrong (naming the field, for a field).
    pub message: String,
    /// How to fix it.
    pub hint: String,
}

impl std::fmt::Display for TraceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.path)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        write!(f, ": {}\n  fix: {}", self.message, self.hint)
    }
}

impl std::error::Error for TraceError {}

/// The fix for a malformed line.
const LINE_FIX: &str = "each line must be {\"timestamp\": number, \"input_length\": integer ≥ 1, \"output_length\": integer, \"hash_ids\": [integers]}, or set skip_bad_lines = true";

impl TraceReader {
    /// Opens the trace.
    pub fn open(cfg: &TraceStage) -> Result<TraceReader, TraceError> {
        let err = |message: String, hint: &str| TraceError {
            path: cfg.path.display().to_string(),
            line: None,
            message,
            hint: hint.into(),
        };
        if cfg.path.is_dir() {
            return Err(err("is a directory, not a trace file".into(), "name the JSONL file in trace_file"));
        }
        let file = File::open(&cfg.path)
            .map_err(|e| err(format!("cannot open the trace: {e}"), "check the path (relative to the spec file)"))?;
        Ok(TraceReader {
            cfg: cfg.clone(),
            file: Some(BufReader::new(file)),
            line: String::new(),
            line_no: 0,
            sent: 0,
            first: None,
            last: f64::NEG_INFINITY,
            counts: TraceCounts::default(),
        })
    }

    /// The next request, `Ok(None)` at the end (or after `total`), or an
    /// error naming the file, line and problem. Its request-unique content
    /// (the tokens its hash ids do not cover) is keyed by `unique_key`.
    pub fn next_request(&mut self, unique_key: u64) -> Result<Option<TraceRequest>, TraceError> {
        self.next_with(|r| r.parse(unique_key))
    }

    /// The next request's offset from the stage start alone (`Ok(None)` at
    /// the end): its line's other fields are skipped, not built.
    pub fn next_offset(&mut self) -> Result<Option<SimDuration>, TraceError> {
        self.next_with(|r| {
            if !r.line.trim_start().starts_with('{') {
                return Err(Bad::Line("not a JSON object".into()));
            }
            let t = match plain_timestamp(&r.line) {
                Some(t) => t,
                None => serde_json::from_str::<Time>(&r.line).map_err(|e| Bad::Line(e.to_string()))?.timestamp,
            };
            r.offset(t).map(SimDuration::from_secs_f64)
        })
    }

    /// The next line `parse` accepts, with [`Self::next_request`]'s handling of
    /// blank lines, the byte-order mark, `total` and bad lines.
    fn next_with<T>(&mut self, mut parse: impl FnMut(&mut Self) -> Result<T, Bad>) -> Result<Option<T>, TraceError> {
        if self.cfg.total.is_some_and(|t| self.sent >= t) {
            self.file = None;
        }
        loop {
            let Some(file) = self.file.as_mut() else { return Ok(None) };
            self.line.clear();
            self.line_no += 1;
            let read = file.read_line(&mut self.line);
            let line = Some(self.line_no);
            // The path is written out only for an error.
            let err = |path: &std::path::Path, message: String, hint: &str| TraceError {
                path: path.display().to_string(),
                line,
                message,
                hint: hint.into(),
            };
            match read {
                Ok(0) => {
                    self.file = None;
                    return Ok(None);
                }
                Ok(_) => {}
                Err(e) => {
                    return Err(err(
                        &self.cfg.path,
                        format!("cannot read: {e}"),
                        "a trace is UTF-8 text, one JSON object per line",
                    ));
                }
            }
            if self.line_no == 1 && self.line.starts_with('\u{feff}') {
                self.line.drain(..'\u{feff}'.len_utf8());
            }
            if self.line.trim().is_empty() {
                continue;
            }
            match parse(self) {
                Ok(r) => {
                    self.sent += 1;
                    return Ok(Some(r));
                }
                Err(Bad::Absolute(e)) => {
                    let hint = "set shift_to_first = true to replay from the first line's time (and check multiplier_to_sec: Mooncake timestamps are milliseconds, 0.001)";
                    return Err(TraceError { hint: hint.into(), ..err(&self.cfg.path, e, "") });
                }
                Err(_) if self.cfg.skip_bad_lines => self.counts.skipped += 1,
                Err(Bad::Line(e)) => return Err(TraceError { hint: LINE_FIX.into(), ..err(&self.cfg.path, e, "") }),
                Err(Bad::Late(e)) => {
                    let hint = "check multiplier_to_sec (Mooncake timestamps are milliseconds, 0.001) and time_scale, or set skip_bad_lines = true";
                    return Err(TraceError { hint: hint.into(), ..err(&self.cfg.path, e, "") });
                }
            }
        }
    }

    fn parse(&mut self, unique_key: u64) -> Result<TraceRequest, Bad> {
        // serde reads a JSON list into the fields by position: a line must name them.
        if !self.line.trim_start().starts_with('{') {
            return Err(Bad::Line(
                "a line is a JSON object naming its fields, not a list or a bare value (a list would be read by position)"
                    .into(),
            ));
        }
        // The plain parser first; only a line it refuses is parsed again
        // with the path-tracking wrapper, to name the field (the wrapper
        // costs more than the parse on every good line).
        let row: Row = match plain_row(&self.line).map_or_else(|| serde_json::from_str(&self.line), Ok) {
            Ok(row) => row,
            Err(_) => {
                let mut de = serde_json::Deserializer::from_str(&self.line);
                serde_path_to_error::deserialize(&mut de).map_err(|e| {
                    let field = e.path().to_string();
                    let msg = e.into_inner().to_string();
                    let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
                    // A missing field names itself; a wrong value is named by its path.
                    Bad::Line(if field == "." { msg } else { format!("field `{field}`: {msg}") })
                })?
            }
        };
        valid_timestamp(row.timestamp)?;
        if row.input_length == 0 || row.input_length > u64::from(u32::MAX) {
            return Err(Bad::Line(format!(
                "field `input_length`: must be between 1 and {}, got {}",
                u32::MAX,
                row.input_length
            )));
        }
        let chunks = row.input_length.div_ceil(u64::from(self.cfg.chunk_size));
        if row.hash_ids.len() as u64 > chunks {
            return Err(Bad::Line(format!(
                "field `hash_ids`: {} ids for {} tokens, which at chunk_size = {} need at most {chunks} — is chunk_size the trace's tokens per hash id?",
                row.hash_ids.len(),
                row.input_length,
                self.cfg.chunk_size
            )));
        }
        let secs = self.offset(row.timestamp)?;
        if row.output_length == 0 {
            self.counts.outputs_raised += 1;
        }
        let prompt = row.input_length as u32;
        let mut content = Content::default();
        // Hash ids that count up by one are one segment, named by its first id:
        // token `t` of it is token `t % chunk_size` of id `first + t / chunk_size`,
        // so the tokens are those of one segment per id — and a request that
        // extends a conversation (its new ids numbered on from the old) is a
        // few long runs, each one chain of the stores.
        let mut left = prompt;
        let mut run: Option<(u64, u64, u32)> = None; // (first id, last id, tokens)
        for &h in &row.hash_ids {
            if left == 0 {
                break;
            }
            let n = left.min(self.cfg.chunk_size);
            run = match run {
                Some((first, last, tokens)) if last.checked_add(1) == Some(h) => Some((first, h, tokens + n)),
                Some((first, _, tokens)) => {
                    content.push(content_id("trace", first), tokens);
                    Some((h, h, n))
                }
                None => Some((h, h, n)),
            };
            left -= n;
        }
        if let Some((first, _, tokens)) = run {
            content.push(content_id("trace", first), tokens);
        }
        content.push(content_id("trace-unique", unique_key), left);
        Ok(TraceRequest {
            offset: SimDuration::from_secs_f64(secs),
            prompt_tokens: prompt,
            output_tokens: row.output_length.clamp(1, u64::from(u32::MAX)) as u32,
            content,
        })
    }

    /// A row's offset from the stage start, s, from its `timestamp`
    /// (checked; the reordered rows counted).
    fn offset(&mut self, timestamp: f64) -> Result<f64, Bad> {
        valid_timestamp(timestamp)?;
        let first = *self.first.get_or_insert(timestamp);
        let relative = if self.cfg.shift_to_first { (timestamp - first).max(0.0) } else { timestamp };
        let secs = self.cfg.start_offset + relative * self.cfg.multiplier_to_sec * self.cfg.time_scale;
        if self.sent == 0 && !self.cfg.shift_to_first && secs > ABSOLUTE_TIMESTAMP_SECS {
            return Err(Bad::Absolute(format!(
                "field `timestamp`: {} puts the first request {secs:.3e} s after the stage start — the timestamps look absolute (epoch)",
                shown(timestamp)
            )));
        }
        let horizon = crate::time::HORIZON.as_secs_f64();
        if secs > horizon {
            return Err(Bad::Late(format!(
                "field `timestamp`: {} puts this request {secs:.3e} s after the stage start, beyond the {horizon:.0e} s a run may reach",
                shown(timestamp)
            )));
        }
        if timestamp < self.last {
            self.counts.reordered += 1;
        }
        self.last = timestamp;
        Ok(secs)
    }
}

/// The `timestamp` of a flat JSON line, read without parsing the rest
/// (a Mooncake line's `hash_ids` are most of it): the number after the one
/// `"timestamp":` key; `None` (parse it all) for anything less plain — the
/// key twice, escaped, or not followed by a number.
fn plain_timestamp(line: &str) -> Option<f64> {
    const KEY: &str = "\"timestamp\"";
    let at = find_quoted(line, KEY)?;
    if find_quoted(&line[at + KEY.len()..], KEY).is_some() || line[..at].ends_with('\\') {
        return None;
    }
    let rest = line[at + KEY.len()..].trim_start().strip_prefix(':')?.trim_start();
    let end = rest.find([',', '}', ' ', '\t', '\r', '\n']).unwrap_or(rest.len());
    let number = &rest[..end];
    // A whole number below 2⁵³ (most traces' timestamps): exact as a float,
    // without the float parse.
    if number.starts_with(|c: char| c.is_ascii_digit())
        && let Ok(t) = number.parse::<u64>()
        && t < 1 << 53
    {
        return Some(t as f64);
    }
    // JSON numbers only (no `inf`, `NaN`, `+1`, `.5`).
    let json = number.bytes().all(|b| b.is_ascii_digit() || b"-.eE+".contains(&b))
        && number.trim_start_matches('-').starts_with(|c: char| c.is_ascii_digit());
    json.then(|| number.parse().ok()).flatten()
}

/// Where `key` (a quoted name) first occurs in `hay`, found by scanning
/// for its opening quote (`str::find` builds a two-way searcher per call:
/// 1,000 instructions a line, more than the rest of the line's reading).
fn find_quoted(hay: &str, key: &str) -> Option<usize> {
    let (hay, key) = (hay.as_bytes(), key.as_bytes());
    memchr::memchr_iter(key[0], hay).find(|&at| hay[at..].starts_with(key))
}

/// A row written the plain way — an object of `timestamp`, `input_length`,
/// `output_length` and `hash_ids` in any order, with whole numbers and
/// nothing else — read without serde (two thirds of a trace's parsing
/// cost went to serde_json). Anything else (a fraction, an escape, another
/// key, a repeated key, a leading zero, a malformed line) gives `None`, and
/// serde reads the line as before, errors and all: the values are those
/// serde gives (a whole timestamp is exact in either).
fn plain_row(line: &str) -> Option<Row> {
    let mut p = Plain { b: line.as_bytes(), i: 0 };
    p.eat(b'{')?;
    let (mut timestamp, mut input, mut output, mut hash_ids) = (None, None, None, None);
    loop {
        p.eat(b'"')?;
        let start = p.i;
        while *p.b.get(p.i)? != b'"' {
            p.i += 1;
        }
        let key = &p.b[start..p.i];
        p.i += 1;
        p.eat(b':')?;
        let fresh = match key {
            // Below 2⁵³, exact as a float.
            b"timestamp" => timestamp.replace(p.whole().filter(|&t| t < 1 << 53)? as f64).is_none(),
            b"input_length" => input.replace(p.whole()?).is_none(),
            b"output_length" => output.replace(p.whole()?).is_none(),
            b"hash_ids" => {
                // At most one id per comma left on the line, and one more: sized once.
                let mut ids = Vec::with_capacity(memchr::memchr_iter(b',', &p.b[p.i..]).count() + 1);
                p.eat(b'[')?;
                if p.peek() == Some(b']') {
                    p.i += 1;
                } else {
                    loop {
                        ids.push(p.whole()?);
                        match p.next()? {
                            b',' => {}
                            b']' => break,
                            _ => return None,
                        }
                    }
                }
                hash_ids.replace(ids).is_none()
            }
            _ => false,
        };
        if !fresh {
            return None;
        }
        match p.next()? {
            b',' => {}
            b'}' => break,
            _ => return None,
        }
    }
    p.skip();
    (p.i == p.b.len()).then_some(())?;
    Some(Row {
        timestamp: timestamp?,
        input_length: input?,
        output_length: output?,
        hash_ids: hash_ids.unwrap_or_default(),
    })
}

/// A cursor over a plain row's bytes (see [`plain_row`]).
struct Plain<'a> {
    b: &'a [u8],
    i: usize,
}

impl Plain<'_> {
    /// Skips JSON whitespace.
    fn skip(&mut self) {
        while matches!(self.b.get(self.i), Some(b' ' | b'\t' | b'\r' | b'\n')) {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip();
        self.b.get(self.i).copied()
    }

    /// The next byte after whitespace.
    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.next()? == c).then_some(())
    }

    /// A whole number as JSON writes it (no sign, fraction, exponent or
    /// leading zero) that fits 64 bits.
    fn whole(&mut self) -> Option<u64> {
        self.skip();
        let start = self.i;
        let mut x = 0u64;
        while let Some(&c @ b'0'..=b'9') = self.b.get(self.i) {
            x = x.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
            self.i += 1;
        }
        let digits = self.i - start;
        let next = self.b.get(self.i).copied();
        let plain = digits > 0 && (digits == 1 || self.b[start] != b'0');
        (plain && !matches!(next, Some(b'.' | b'e' | b'E'))).then_some(x)
    }
}

/// A timestamp is a non-negative number.
fn valid_timestamp(timestamp: f64) -> Result<(), Bad> {
    if timestamp.is_finite() && timestamp >= 0.0 {
        Ok(())
    } else {
        Err(Bad::Line(format!("field `timestamp`: must be a non-negative number, got {}", shown(timestamp))))
    }
}

/// A number as a message shows it: as written for ordinary sizes, in
/// scientific notation beyond (1e300 is not 301 digits).
fn shown(x: f64) -> String {
    if x != 0.0 && !(1e-4..1e12).contains(&x.abs()) { format!("{x:.3e}") } else { format!("{x}") }
}

/// Why a line was not used.
enum Bad {
    /// The line is malformed (skippable with `skip_bad_lines`).
    Line(String),
    /// The timestamps are absolute: every line would be, so never skipped.
    Absolute(String),
    /// The line's request would arrive after the latest time a run may
    /// reach (skippable with `skip_bad_lines`).
    Late(String),
}

/// The generator of a trace stage: the reader and the next request, read
/// one ahead so its arrival can be scheduled.
#[derive(Debug)]
pub(crate) struct TraceSource {
    cfg: TraceStage,
    /// Opened when the stage starts (it closes its file at the end).
    reader: Option<TraceReader>,
    pending: Option<TraceRequest>,
    start: SimTime,
    stage: usize,
    /// With `request_rate`: the arrival clock that re-times the requests
    /// (stream `workload.stage<i>.arrivals`, as a rate stage's).
    clock: Option<super::arrivals::Arrivals>,
}

impl TraceSource {
    /// Stage `stage`'s trace, not yet opened.
    pub fn new(cfg: &TraceStage, stage: usize, seeds: &crate::rng::SeedTree) -> TraceSource {
        let clock = cfg.retime.map(|(process, rate)| {
            super::arrivals::Arrivals::new(process, rate, seeds.stream(&format!("workload.stage{stage}.arrivals")))
        });
        TraceSource { cfg: cfg.clone(), reader: None, pending: None, start: SimTime::ZERO, stage, clock }
    }

    /// What the replay adjusted or left out so far.
    pub fn counts(&self) -> TraceCounts {
        self.reader.as_ref().map_or_else(TraceCounts::default, |r| r.counts)
    }

    /// Reads the next request; re-timed, it arrives when the clock says.
    fn read_next(&mut self, key: u64) -> Result<Due, String> {
        let reader = self.reader.as_mut().expect("the trace is open while its stage runs");
        self.pending = reader.next_request(key).map_err(|e| e.to_string())?;
        if let (Some(p), Some(clock)) = (self.pending.as_mut(), &self.clock) {
            p.offset = clock.due() - self.start;
        }
        Ok(self.pending.as_ref().map_or(Due::Done, |p| Due::At(self.start + p.offset)))
    }
}

impl Generator for TraceSource {
    fn start(&mut self, now: SimTime) -> Result<Due, String> {
        self.start = now;
        if let Some(clock) = &mut self.clock {
            clock.start(now + SimDuration::from_secs_f64(self.cfg.start_offset));
        }
        self.reader = Some(TraceReader::open(&self.cfg).map_err(|e| e.to_string())?);
        self.read_next(super::unique_key(self.stage, 0))
    }

    fn emit(&mut self, now: SimTime, room: u64, out: &mut Emit<'_>) -> Result<Due, String> {
        let Some(p) = self.pending.take_if(|p| room > 0 && self.start + p.offset <= now) else {
            return Ok(self.pending.as_ref().map_or(Due::Done, |p| Due::At(self.start + p.offset)));
        };
        out.push(p.prompt_tokens, p.output_tokens, p.content, Label::None);
        if let Some(clock) = &mut self.clock {
            clock.advance(now);
        }
        self.read_next(out.key())
    }
}

/// Bursts in the first `lines` requests a trace stage replays: the most requests that
/// share one timestamp, how many timestamps at least 5 share, and the lines
/// read (`None` if the file cannot be read). A time scale cannot spread such bursts.
/// Lines are read for their timestamps alone ([`TraceReader::next_offset`]:
/// the scan ran the whole parser, content and all, over 10,000 lines — 11 k
/// instructions per request of a 12,000-request trace run), so a line
/// whose other fields are bad counts here and fails (or is skipped) in the run.
pub fn bursts(cfg: &TraceStage, lines: usize) -> Option<(u64, u64, u64)> {
    let total = Some(cfg.total.map_or(lines as u64, |t| t.min(lines as u64)));
    let mut reader = TraceReader::open(&TraceStage { total, skip_bad_lines: true, ..cfg.clone() }).ok()?;
    let (mut run, mut most, mut groups, mut last, mut read) = (0u64, 0u64, 0u64, None, 0u64);
    let mut close = |run: u64| {
        if run >= 5 {
            groups += 1;
        }
    };
    while let Ok(Some(offset)) = reader.next_offset() {
        read += 1;
        if last == Some(offset) {
            run += 1;
        } else {
            close(run);
            run = 1;
            last = Some(offset);
        }
        most = most.max(run);
    }
    close(run);
    Some((most, groups, read))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvcache::BlockHash;

    fn stage(text: &str, name: &str) -> TraceStage {
        let dir = std::env::temp_dir().join(format!("opal-trace-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.jsonl");
        std::fs::write(&path, text).unwrap();
        TraceStage::whole_file(path)
    }

    #[test]
    fn a_quoted_key_is_found_where_str_find_finds_it() {
        let key = "\"timestamp\"";
        for hay in [
            "",
            "\"",
            "\"timestamp\"",
            "{\"a\": 1, \"timestamp\": 2}",
            "{\"time\": 1, \"timestamps\": 3, \"timestamp\": 2}",
            "\"\"\"timestamp",
            "{\"timestam\": 1}",
            "x\"timestamp\"\"timestamp\"",
        ] {
            assert_eq!(find_quoted(hay, key), hay.find(key), "{hay}");
        }
    }

    #[test]
    fn the_plain_row_reader_reads_what_serde_reads_or_leaves_the_line_to_it() {
        let read = |line: &str| plain_row(line).map(|r| (r.timestamp, r.input_length, r.output_length, r.hash_ids));
        let serde = |line: &str| {
            serde_json::from_str::<Row>(line).ok().map(|r| (r.timestamp, r.input_length, r.output_length, r.hash_ids))
        };
        // Plain rows: the same values as serde's.
        for line in [
            r#"{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3]}"#,
            r#"{"hash_ids":[],"output_length":1,"input_length":7,"timestamp":1696}"#,
            " {\t\"timestamp\" :12 , \"input_length\": 9,\"output_length\":3 } \r\n",
            r#"{"timestamp": 9007199254740991, "input_length": 1, "output_length": 0, "hash_ids": [18446744073709551615]}"#,
        ] {
            assert_eq!(read(line), serde(line), "{line}");
            assert!(read(line).is_some(), "{line}");
        }
        // Everything else goes to serde, which reads it or names the fault.
        for line in [
            r#"{"timestamp": 1.5, "input_length": 6, "output_length": 5}"#,
            r#"{"timestamp": 1e3, "input_length": 6, "output_length": 5}"#,
            r#"{"timestamp": -1, "input_length": 6, "output_length": 5}"#,
            r#"{"timestamp": 01, "input_length": 6, "output_length": 5}"#,
            r#"{"timestamp": 1, "input_length": 6, "output_length": 5, "extra": 1}"#,
            r#"{"timestamp": 1, "timestamp": 2, "input_length": 6, "output_length": 5}"#,
            r#"{"timestamp": 1, "input_length": 6}"#,
            r#"{"timestamp": 1, "input_length": 6, "output_length": 5, "hash_ids": [1,]}"#,
            r#"{"timestamp": 1, "input_length": 6, "output_length": 5, "hash_ids": null}"#,
            r#"{"time\u0073tamp": 1, "input_length": 6, "output_length": 5}"#,
            r#"{"timestamp": 1, "input_length": 18446744073709551616, "output_length": 5}"#,
            r#"{"timestamp": 1, "input_length": 6, "output_length": 5} x"#,
            r#"{"timestamp": 1, "input_length": 6, "output_length": 5"#,
            r#"{"timestamp": 9007199254740993, "input_length": 6, "output_length": 5}"#,
        ] {
            assert_eq!(read(line), None, "{line}");
        }
    }

    #[test]
    fn a_burst_scan_reads_the_times_the_run_reads() {
        let row = |t: u32| {
            format!("{{\"timestamp\": {t}, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1, 2]}}\n")
        };
        let mut text: String = (0..6).map(|_| row(1000)).collect();
        text += &row(2000);
        text += "[3000, 5, 5]\n";
        text += &row(2000);
        let cfg = stage(&text, "bursts");
        // 6 at one time (one burst of 5 or more), the list line skipped: 8 read.
        assert_eq!(bursts(&cfg, 100), Some((6, 1, 8)));
        assert_eq!(bursts(&cfg, 3), Some((3, 0, 3)));
        // A plain line's timestamp is read without the rest; anything less
        // plain is left to the parser.
        assert_eq!(plain_timestamp(r#"{"timestamp": 27482, "input_length": 6955}"#), Some(27482.0));
        assert_eq!(plain_timestamp(r#"{"input_length": 1,"timestamp":1.5e3}"#), Some(1500.0));
        // Whole numbers as the float parse reads them, on either side of 2⁵³.
        assert_eq!(plain_timestamp(r#"{"timestamp": 9007199254740991}"#), Some(9_007_199_254_740_991.0));
        assert_eq!(plain_timestamp(r#"{"timestamp": 9007199254740993}"#), Some(9_007_199_254_740_992.0));
        assert_eq!(plain_timestamp(r#"{"timestamp": +5}"#), None);
        // (An escaped quote is not the key's.)
        assert_eq!(plain_timestamp(r#"{"x": "\"timestamp\": 5", "timestamp": 6}"#), Some(6.0));
        for odd in [
            r#"{"timestamp": "5"}"#,
            r#"{"name": "timestamp", "timestamp": 6}"#,
            r#"{"timestamp": 6, "meta": {"timestamp": 7}}"#,
            r#"{"timestamp": NaN}"#,
        ] {
            assert_eq!(plain_timestamp(odd), None, "{odd}");
        }
        // The times alone are the run's times.
        let (mut full, mut times) = (
            TraceReader::open(&cfg).unwrap(),
            TraceReader::open(&TraceStage { skip_bad_lines: true, ..cfg.clone() }).unwrap(),
        );
        for _ in 0..7 {
            assert_eq!(times.next_offset().unwrap(), full.next_request(0).unwrap().map(|r| r.offset));
        }
    }

    #[test]
    fn rows_become_requests_with_scaled_times_and_chunked_content() {
        let mut cfg = stage(
            "{\"timestamp\": 1500, \"input_length\": 1100, \"output_length\": 7, \"hash_ids\": [3, 4, 5]}\n\n{\"timestamp\": 2000, \"input_length\": 600, \"output_length\": 0, \"hash_ids\": [3]}\n{\"timestamp\": 2500, \"input_length\": 2048, \"output_length\": 1, \"hash_ids\": [3, 4, 7, 8]}\n",
            "ok",
        );
        cfg.time_scale = 0.5;
        cfg.start_offset = 1.0;
        let mut r = TraceReader::open(&cfg).unwrap();
        let a = r.next_request(0).unwrap().unwrap();
        // 1 s + 1500 ms × 0.5 = 1.75 s.
        assert_eq!(a.offset, SimDuration(1_750_000_000));
        assert_eq!((a.prompt_tokens, a.output_tokens), (1100, 7));
        // Ids 3, 4, 5 count up: one segment of 512 + 512 + 76 tokens.
        let lens = |r: &TraceRequest| r.content.segments.iter().map(|s| s.tokens).collect::<Vec<_>>();
        assert_eq!(lens(&a), vec![1100]);
        let b = r.next_request(1).unwrap().unwrap();
        // One hash id covers 512 tokens; the other 88 are unique. Output 0 → 1.
        assert_eq!(lens(&b), vec![512, 88]);
        assert_eq!(b.content.segments[0].id, a.content.segments[0].id);
        assert_eq!(b.output_tokens, 1);
        // Ids 3, 4, then 7, 8: two segments, the first as long as a's first two ids.
        let c = r.next_request(2).unwrap().unwrap();
        assert_eq!(lens(&c), vec![1024, 1024]);
        // Blocks agree exactly where the ids do: a and b on id 3, a and c on ids 3 and 4.
        let blocks = |r: &TraceRequest| {
            let mut out = Vec::new();
            crate::kvcache::block_hashes(&r.content.segments, 16, usize::MAX, &mut out);
            out
        };
        let (ha, hb, hc) = (blocks(&a), blocks(&b), blocks(&c));
        let shared = |x: &[BlockHash], y: &[BlockHash]| x.iter().zip(y).take_while(|(p, q)| p == q).count();
        assert_eq!((shared(&ha, &hb), shared(&ha, &hc), shared(&hb, &hc)), (32, 64, 32));
        assert_eq!(r.next_request(3).unwrap(), None);
    }

    #[test]
    fn a_bad_line_names_the_file_line_and_field() {
        let text = "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 1}\n{\"timestamp\": 2, \"input_length\": \"ten\", \"output_length\": 1, \"hash_ids\": []}\n";
        let cfg = stage(text, "bad");
        let mut r = TraceReader::open(&cfg).unwrap();
        assert!(r.next_request(0).unwrap().is_some());
        assert!(r.next_request(1).unwrap().is_some(), "hash_ids may be absent");
        let e = r.next_request(2).unwrap_err().to_string();
        assert!(e.contains("t.jsonl:3:"), "{e}");
        assert!(e.contains("input_length") || e.contains("invalid type"), "{e}");
        assert!(e.contains("field `input_length`: invalid type"), "the field is named: {e}");
        let mut skip = cfg.clone();
        skip.skip_bad_lines = true;
        let mut r = TraceReader::open(&skip).unwrap();
        let n = std::iter::from_fn(|| r.next_request(0).unwrap()).count();
        assert_eq!((n, r.counts.skipped), (2, 1));
    }

    #[test]
    fn a_byte_order_mark_is_ignored_and_adjusted_lines_are_counted() {
        let text = "\u{feff}{\"timestamp\": 5, \"input_length\": 10, \"output_length\": 0}\n{\"timestamp\": 3, \"input_length\": 10, \"output_length\": 2}\n{\"timestamp\": 4, \"input_length\": 10, \"output_length\": 0}\n";
        let mut r = TraceReader::open(&stage(text, "bom")).unwrap();
        let outputs: Vec<u32> = std::iter::from_fn(|| r.next_request(0).unwrap()).map(|q| q.output_tokens).collect();
        assert_eq!(outputs, [1, 2, 1]);
        assert_eq!(r.counts, TraceCounts { skipped: 0, reordered: 1, outputs_raised: 2 });
    }

    #[test]
    fn epoch_timestamps_are_refused_unless_shifted_to_the_first_line() {
        let text = "{\"timestamp\": 1700000000000, \"input_length\": 10, \"output_length\": 1}\n{\"timestamp\": 1700000001500, \"input_length\": 10, \"output_length\": 1}\n";
        let mut cfg = stage(text, "epoch");
        cfg.skip_bad_lines = true; // absolute timestamps are never skipped line by line
        let e = TraceReader::open(&cfg).unwrap().next_request(0).unwrap_err();
        assert_eq!(e.line, Some(1));
        assert!(e.message.contains("look absolute") && e.hint.contains("shift_to_first = true"), "{e}");
        cfg.shift_to_first = true;
        let mut r = TraceReader::open(&cfg).unwrap();
        let offsets: Vec<SimDuration> = std::iter::from_fn(|| r.next_request(0).unwrap()).map(|q| q.offset).collect();
        assert_eq!(offsets, [SimDuration(0), SimDuration(1_500_000_000)]);
    }

    #[test]
    fn more_hash_ids_than_the_prompt_has_chunks_is_a_bad_line() {
        // 1,000 tokens at 512 per id: 2 ids at most.
        let text = "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 1, \"hash_ids\": [1, 2]}\n{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 1, \"hash_ids\": [1, 2, 3]}\n";
        let mut r = TraceReader::open(&stage(text, "ids")).unwrap();
        assert!(r.next_request(0).unwrap().is_some());
        let e = r.next_request(1).unwrap_err();
        assert_eq!(e.line, Some(2));
        assert!(e.message.contains("3 ids for 1000 tokens") && e.message.contains("chunk_size"), "{e}");
    }

    #[test]
    fn a_directory_is_named_as_one() {
        let mut cfg = stage("", "dir");
        cfg.path = cfg.path.parent().unwrap().to_path_buf();
        let e = TraceReader::open(&cfg).unwrap_err();
        assert!(e.message.contains("is a directory") && e.line.is_none(), "{e}");
    }

    #[test]
    fn total_requests_limits_the_replay() {
        let text = "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1}\n".repeat(5);
        let mut cfg = stage(&text, "total");
        cfg.total = Some(3);
        let mut r = TraceReader::open(&cfg).unwrap();
        assert_eq!(std::iter::from_fn(|| r.next_request(0).unwrap()).count(), 3);
    }
}
