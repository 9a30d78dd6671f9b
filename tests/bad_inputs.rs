//! The bad-input catalogue (`tests/bad_inputs/`): one bad spec or trace per
//! file, its expectations in its header. Every case must exit with the
//! expected code and say, on standard error, the file and line, the key
//! (where the problem is one key) and a fix.

use std::path::Path;
use std::process::Command;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/bad_inputs");

struct Case {
    name: String,
    exit: i32,
    run: bool,
    file: String,
    line: Option<usize>,
    key: Option<String>,
    /// Text standard error must hold, and text it must not.
    text: Option<String>,
    absent: Option<String>,
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(DIR).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_none_or(|x| x != "toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let header = |k: &str| text.lines().find_map(|l| l.strip_prefix(&format!("# {k}: ")).map(str::to_string));
        let Some(exit) = header("expect-exit") else { continue }; // a helper file (a base)
        out.push(Case {
            name: path.file_name().unwrap().to_string_lossy().into_owned(),
            exit: exit.parse().unwrap(),
            run: header("run").is_some(),
            file: header("expect-file").unwrap(),
            line: header("expect-line").and_then(|l| l.parse().ok()),
            key: header("expect-key"),
            text: header("expect-text"),
            absent: header("expect-absent"),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

#[test]
fn every_bad_input_names_its_file_line_key_and_fix() {
    let cases = cases();
    assert!(cases.len() >= 60, "the catalogue holds {} cases", cases.len());
    let out = std::env::temp_dir().join(format!("opal-bad-inputs-{}", std::process::id()));
    let mut problems = Vec::new();
    for c in &cases {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_opal-sweep"));
        cmd.current_dir(Path::new(DIR)).arg(&c.name);
        if c.run {
            cmd.args(["-q", "--overwrite", "-o"]).arg(out.join(&c.name));
        } else {
            cmd.arg("--dry-run");
        }
        let o = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        let mut wrong = Vec::new();
        if o.status.code() != Some(c.exit) {
            wrong.push(format!("exit {:?}, expected {}", o.status.code(), c.exit));
        }
        let at = match c.line {
            Some(l) => format!("{}:{l}:", c.file),
            None => format!("{}:", c.file),
        };
        if !err.contains(&at) {
            wrong.push(format!("does not name {at}"));
        }
        if let Some(k) = &c.key
            && !err.contains(&format!("`{k}`"))
        {
            wrong.push(format!("does not name `{k}`"));
        }
        if let Some(t) = &c.text
            && !err.contains(t.as_str())
        {
            wrong.push(format!("does not say {t:?}"));
        }
        if let Some(t) = &c.absent
            && err.contains(t.as_str())
        {
            wrong.push(format!("says {t:?}"));
        }
        if !err.contains("fix:") {
            wrong.push("gives no fix".into());
        }
        if !wrong.is_empty() {
            problems.push(format!("{}: {}\n{err}", c.name, wrong.join("; ")));
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    assert!(problems.is_empty(), "{} of {} cases fail:\n\n{}", problems.len(), cases.len(), problems.join("\n"));
}
