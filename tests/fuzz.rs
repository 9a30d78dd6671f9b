//! A bounded mutation fuzzer for the spec and trace parsers, run by
//! `cargo test` (a fixed number of cases from a fixed seed, so it is
//! deterministic and takes seconds). The seeds are every shipped spec, the
//! bad-input catalogue and `tests/fuzz_seeds/` (TOML: specs that set the
//! keys the others do not — a Pareto search, a re-timed trace, priced
//! tiers, the save rules, vLLM v0, P/D through the store), the Opal JSON
//! example, and lines of the
//! shipped trace; each case mutates one of them (bytes flipped, cut,
//! repeated; values swapped for extreme ones) and feeds it to the parser
//! and planner (specs) or the trace reader (traces). No case may panic, and
//! none may make the heap grow past 256 MB — the memory guard refuses
//! absurd sizes before allocating.
//!
//! A hand-written mutator rather than `cargo fuzz` or proptest: CI runs it
//! on stable Rust within the test suite, and mutating real specs reaches
//! the planner's checks that random strings never get past the parser to.

#[path = "common/alloc.rs"]
mod alloc;

use crate::alloc::{LIVE, PEAK};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const CASES_PER_KIND: usize = 1500;
const HEAP_LIMIT: usize = 256 << 20;

/// Values that stress the checks, swapped in for numbers and strings.
const EXTREMES: &[&str] = &[
    "0",
    "-1",
    "-5",
    "1e300",
    "-1e300",
    "1e-300",
    "1e-9",
    "nan",
    "inf",
    "-inf",
    "4294967296",
    "18446744073709551615",
    "9223372036854775807",
    "-9223372036854775808",
    "\"\"",
    "\"../../x\"",
    "\"/\"",
    "[]",
    "{}",
    "true",
    "1.7e12",
    "[1e300]",
    "{ dist = \"normal\", mean = -1, std = 1e300 }",
];

fn seeds(ext: &str, dirs: &[&str]) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(Path::new(ROOT).join(d)) else { continue };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for p in paths.into_iter().filter(|p| p.extension().is_some_and(|e| e == ext)) {
            out.push((p.clone(), std::fs::read_to_string(&p).unwrap()));
        }
    }
    assert!(!out.is_empty(), "no {ext} seeds");
    out
}

/// One random mutation of `text`.
fn mutate(text: &str, rng: &mut ChaCha8Rng) -> String {
    let mut b = text.as_bytes().to_vec();
    for _ in 0..rng.random_range(1..4) {
        if b.is_empty() {
            b.extend_from_slice(b"x");
        }
        let i = rng.random_range(0..b.len());
        let j = (i + rng.random_range(1..64)).min(b.len());
        match rng.random_range(0..6) {
            0 => b[i] ^= 1 << rng.random_range(0..8),
            1 => {
                b.drain(i..j);
            }
            2 => {
                let piece = b[i..j].to_vec();
                b.splice(i..i, piece);
            }
            3 => {
                let bytes = b"=[]{}\"\n.,#-e9";
                b.insert(i, bytes[rng.random_range(0..bytes.len())]);
            }
            _ => {
                // Replace the value after the next '=' or ':' with an extreme one.
                if let Some(k) = b[i..].iter().position(|&c| c == b'=' || c == b':') {
                    let start = i + k + 1;
                    let end = b[start..].iter().position(|&c| c == b'\n' || c == b',').map_or(b.len(), |e| start + e);
                    let v = format!(" {}", EXTREMES[rng.random_range(0..EXTREMES.len())]);
                    b.splice(start..end, v.into_bytes());
                }
            }
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

/// Runs `f` on a fresh heap peak; panics and peaks over the limit are reported.
fn check(what: &str, input: &str, f: impl FnOnce()) -> Option<String> {
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    let peak = PEAK.load(Relaxed).saturating_sub(base);
    match outcome {
        Err(_) => Some(format!("{what} panicked on:\n{input}")),
        Ok(()) if peak > HEAP_LIMIT => Some(format!("{what} used {peak} bytes of heap on:\n{input}")),
        Ok(()) => None,
    }
}

#[test]
fn mutated_specs_and_traces_never_panic_nor_exhaust_memory() {
    std::panic::set_hook(Box::new(|_| {})); // the failures are collected below
    let dir = std::env::temp_dir().join(format!("opal-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Files the specs refer to, so that mutations get past "no such file".
    std::fs::copy(Path::new(ROOT).join("traces/conversation_trace.jsonl"), dir.join("trace.jsonl")).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(2026);
    let mut failures = Vec::new();

    // How far the cases got, so that a mutator that never reaches the
    // planner or the reader shows up as a failure rather than a pass.
    let (mut planned, mut refused, mut requests) = (0, 0, 0u64);
    let mut specs = seeds("toml", &["sweeps", "tests/bad_inputs", "tests/fuzz_seeds", "benches"]);
    specs.extend(seeds("json", &["examples/opal"]));
    // The seeds reach every kind of key (tests/fuzz_seeds holds what the rest lack).
    for key in [
        "kind = \"pareto\"",
        "arrival_cv",
        "usd_per_gb_hour",
        "save_timing",
        "write_back_hits",
        "scheduler = \"v0\"",
        "prefill_batch",
        "kv_path",
    ] {
        assert!(specs.iter().any(|(_, t)| t.contains(key)), "no fuzzer seed sets {key}");
    }
    for n in 0..CASES_PER_KIND {
        let (path, text) = &specs[n % specs.len()];
        let text = mutate(text, &mut rng)
            .replace("../../traces/conversation_trace.jsonl", "trace.jsonl")
            .replace("../traces/conversation_trace.jsonl", "trace.jsonl");
        let file = dir.join(format!("case.{}", path.extension().unwrap().to_string_lossy()));
        std::fs::write(&file, &text).unwrap();
        let failure = check("the spec parser and planner", &text, || {
            match opal::config::load_spec(&file).and_then(|spec| opal::sweep::plan(&spec)) {
                Ok(plan) => {
                    planned += 1;
                    let _ = opal::report::text::dry_run(&plan).len();
                }
                Err(e) => {
                    refused += 1;
                    assert!(!e.to_string().is_empty());
                }
            }
        });
        failures.extend(failure);
    }

    let lines: Vec<String> =
        std::fs::read_to_string(dir.join("trace.jsonl")).unwrap().lines().take(200).map(str::to_string).collect();
    let trace = dir.join("case.jsonl");
    for _ in 0..CASES_PER_KIND {
        let start = rng.random_range(0..lines.len() - 20);
        let text = mutate(&lines[start..start + 20].join("\n"), &mut rng);
        std::fs::write(&trace, &text).unwrap();
        let mut cfg = opal::workload::TraceStage::whole_file(trace.clone());
        cfg.skip_bad_lines = rng.random_range(0..2) == 0;
        cfg.shift_to_first = rng.random_range(0..2) == 0;
        let failure = check("the trace reader", &text, || {
            if let Ok(mut r) = opal::workload::TraceReader::open(&cfg) {
                let mut n = 0;
                while let Ok(Some(_)) = r.next_request(n) {
                    n += 1;
                }
                requests += n;
            }
        });
        failures.extend(failure);
    }
    let _ = std::panic::take_hook();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{} failures; the first:\n{}", failures.len(), failures[0]);
    eprintln!("specs: {planned} planned, {refused} refused; traces: {requests} requests read");
    assert!(planned > CASES_PER_KIND / 10 && refused > CASES_PER_KIND / 10, "{planned} planned, {refused} refused");
    assert!(requests > CASES_PER_KIND as u64, "{requests} trace requests read");
}
