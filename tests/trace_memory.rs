//! The trace reader streams: its peak heap does not grow with the file.
//!
//! A test binary of its own, so that its counting allocator sees only this
//! test's allocations.

#[path = "common/alloc.rs"]
mod alloc;

use crate::alloc::{LIVE, PEAK};
use opal::workload::{TraceReader, TraceStage};
use std::io::Write;
use std::sync::atomic::Ordering::Relaxed;

/// Writes a Mooncake-style trace of `lines` requests, 1 to 40 hash ids each.
fn write_trace(path: &std::path::Path, lines: u64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for i in 0..lines {
        let ids: Vec<String> = (0..1 + i % 40).map(|j| (i * 7 + j).to_string()).collect();
        writeln!(
            f,
            "{{\"timestamp\": {}, \"input_length\": {}, \"output_length\": {}, \"hash_ids\": [{}]}}",
            i * 3,
            512 * (1 + i % 40),
            1 + i % 300,
            ids.join(", ")
        )
        .unwrap();
    }
}

/// Reads the whole trace; returns (requests, peak live heap above the start in bytes).
fn read_all(path: &std::path::Path) -> (u64, usize) {
    let cfg = TraceStage::whole_file(path.to_path_buf());
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let mut reader = TraceReader::open(&cfg).unwrap();
    let mut n = 0;
    while let Some(r) = reader.next_request(n).unwrap() {
        assert_eq!(r.content.tokens(), u64::from(r.prompt_tokens));
        n += 1;
    }
    drop(reader);
    (n, PEAK.load(Relaxed) - base)
}

#[test]
fn reading_a_million_line_trace_takes_no_more_memory_than_ten_thousand_lines() {
    let dir = std::env::temp_dir().join(format!("opal-trace-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (small, large) = (dir.join("small.jsonl"), dir.join("large.jsonl"));
    write_trace(&small, 10_000);
    write_trace(&large, 1_000_000);
    let (n_small, peak_small) = read_all(&small);
    let (n_large, peak_large) = read_all(&large);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!((n_small, n_large), (10_000, 1_000_000));
    eprintln!("peak heap while reading: {peak_small} B for 10k lines, {peak_large} B for 1M lines");
    // One line buffer, one parsed row and one request at a time: a few KiB,
    // whatever the length of the file (the large file is ~150 MB).
    assert!(peak_small < 64 << 10, "{peak_small} bytes for 10k lines");
    assert!(peak_large <= peak_small + 4096, "{peak_large} bytes for 1M lines vs {peak_small} for 10k");
}
