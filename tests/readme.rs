//! The README's examples run: every TOML block as a spec, every shell line
//! (but `cargo` and `sbatch`) in order, in a temporary copy of the shipped
//! files whose studies are cut to a few hundred requests. The README
//! cannot drift from the tool.

use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Fenced blocks of `lang` in `text`, in order.
fn blocks<'a>(text: &'a str, lang: &str) -> Vec<&'a str> {
    let fence = format!("```{lang}\n");
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(&fence) {
        let body = &rest[i + fence.len()..];
        let end = body.find("```").expect("closed fence");
        out.push(&body[..end]);
        rest = &body[end..];
    }
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let dest = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &dest);
        } else if p.extension().is_some_and(|x| x == "toml") {
            // Cut studies down: a few hundred requests, two replicates.
            let text: String = std::fs::read_to_string(&p)
                .unwrap()
                .lines()
                .map(|l| match l.split_once('=').map(|(k, _)| k.trim()) {
                    Some("total_requests") => "total_requests = 150".to_string(),
                    Some("total_sessions") => "total_sessions = 10".to_string(),
                    Some("replicates") => "replicates = 2".to_string(),
                    _ => l.to_string(),
                })
                .collect::<Vec<_>>()
                .join("\n");
            std::fs::write(dest, text).unwrap();
        } else {
            std::fs::copy(&p, dest).unwrap();
        }
    }
}

#[test]
fn every_toml_and_shell_example_in_the_readme_runs() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let dir = crate::temp_dir("readme");
    for d in ["sweeps", "traces", "examples", "models"] {
        copy_dir(&Path::new(ROOT).join(d), &dir.join(d));
    }
    let bin = Path::new(env!("CARGO_BIN_EXE_opal-sweep")).parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut failures = Vec::new();
    let mut ran = 0;

    for (i, spec) in blocks(&readme, "toml").iter().enumerate() {
        let file = format!("readme-{i}.toml");
        std::fs::write(dir.join(&file), spec).unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_opal-sweep"))
            .args([&file, "-q", "-o", &format!("readme-out-{i}")])
            .current_dir(&dir)
            .output()
            .unwrap();
        ran += 1;
        if !o.status.success() {
            failures.push(format!("TOML block {i}:\n{spec}\n{}", String::from_utf8_lossy(&o.stderr)));
        }
    }

    let tmp = dir.display().to_string();
    for block in blocks(&readme, "sh") {
        for line in block.replace("\\\n", " ").lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with("cargo ") || line.starts_with("sbatch ") {
                continue;
            }
            if line.contains("--png") && !opal::report::figures::PNG_SUPPORTED {
                continue;
            }
            // Paths outside the working directory go into the temporary one.
            let command =
                line.replace(" /scratch/", &format!(" {tmp}/scratch/")).replace(" ~/", &format!(" {tmp}/home/"));
            let o = Command::new("sh").args(["-c", &command]).env("PATH", &path).current_dir(&dir).output().unwrap();
            ran += 1;
            if !o.status.success() {
                failures.push(format!(
                    "`{line}` exited {:?}:\n{}",
                    o.status.code(),
                    String::from_utf8_lossy(&o.stderr)
                ));
            }
        }
    }
    assert!(ran >= 12, "only {ran} examples found");
    assert!(failures.is_empty(), "{} README examples fail:\n\n{}", failures.len(), failures.join("\n\n"));
    let _ = std::fs::remove_dir_all(&dir);
}
