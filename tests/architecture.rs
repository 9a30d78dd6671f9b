//! Architecture checks on the library's own source, read as text from `src/` (no build step, no dependencies).
//!
//! - **No import cycles between files.** A file depends on another when its code (a `use` line or an inline path
//!   such as `crate::kvcache::BlockHasher::default()`) names an item *defined* in the other file; `pub use`
//!   re-exports are followed to the defining file and are not dependencies themselves. A module naming its own
//!   submodules is structure, not a dependency; `#[cfg(test)]` code, comments and strings are ignored. Each
//!   strongly connected group of files is reported as a cycle with, for each edge, the path and line creating it.
//! - **No `Result<_, String>` returned** outside the leaf helpers in [`RESULT_STRING_ALLOWED`]: callers need
//!   typed errors to tell failures apart.
//!
//! The project asks that there be no import circles and that this be checked reproducibly: the scan is a plain,
//! deterministic reading of the sources, so the same sources always give the same verdict.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// Files (as `src/...`) allowed to return `Result<_, String>`: leaf helpers whose callers wrap the message.
/// Each is a parser of one kind of input (a data file, a CLI value, a dotted
/// path, a constraint), a generator of the workload, or a figure builder; its
/// caller names the file, key or run the message concerns.
const RESULT_STRING_ALLOWED: &[&str] = &[
    // Parsers of data files: callers wrap the message into a ConfigError naming the key.
    "src/worker/perf/profile/aic.rs",
    "src/worker/perf/profile/aic_rows.rs",
    "src/worker/perf/profile/vidur.rs",
    "src/worker/perf/table.rs",
    "src/worker/model/config.rs",
    "src/worker/model.rs",
    "src/worker/presets.rs",
    "src/workload/trace.rs",
    // The workload's generators: their message becomes the run's RunError.
    "src/workload/mod.rs",
    "src/workload/rag.rs",
    "src/workload/rate.rs",
    "src/workload/sc25.rs",
    "src/workload/sessions.rs",
    "src/workload/vllm_bench.rs",
    // The calibration command's readers and fits: main prints the message as an input error.
    "src/calibrate/fit.rs",
    "src/calibrate/bench.rs",
    "src/calibrate/sets.rs",
    // vLLM's --percentile-metrics and --metric-percentiles: the command prints the message as an input error.
    "src/output/vllm.rs",
    // A dotted path, a constraint, the effective configuration's typed round trip: wrapped into ConfigErrors.
    "src/sweep/path.rs",
    "src/stats.rs",
    "src/config/effective.rs",
    // Figure builders: a figure that cannot be drawn says why in the report.
    "src/report/figures.rs",
];

/// (file, literal) pairs where a word that names an output column means something else.
const NOT_A_COLUMN: &[(&str, &str)] = &[
    // Table names.
    ("src/output/mod.rs", "workers"),
    ("src/sweep/mod.rs", "workers"),
    // Units and axis descriptions; spec keys that name an axis.
    ("src/report/data.rs", "workers"),
    ("src/report/data.rs", "count"),
    ("src/report/data.rs", "output_tokens"),
    ("src/report/figures.rs", "workers"),
    // Keys of the sweep manifest's JSON (a search's kind, its objectives' and constraints' metric, a shard's count).
    ("src/report/data.rs", "kind"),
    ("src/report/data.rs", "metric"),
    ("src/sweep/search.rs", "kind"),
    ("src/sweep/search.rs", "metric"),
    ("src/sweep/pareto.rs", "kind"),
    ("src/sweep/pareto.rs", "metric"),
    ("src/sweep/runner.rs", "count"),
    // search.parquet's own column (a search's status, not a run's).
    ("src/sweep/search.rs", "status"),
    // vLLM's field names (`vllm bench serve --save-result`) and the comparison's header.
    ("src/output/vllm.rs", "completed"),
    ("src/output/vllm.rs", "error"),
    // Table headers and words on the terminal and in the report.
    ("src/report/html.rs", "completed"),
    ("src/report/text.rs", "stage"),
    ("src/report/text.rs", "completed"),
    ("src/report/text.rs", "status"),
    ("src/report/text.rs", "replicate"),
    ("src/report/text.rs", "seed"),
    ("src/sweep/lock.rs", "running"),
];

/// File-to-file edges, each with one example path and its line.
type Edges = BTreeMap<(usize, usize), (String, usize)>;

/// Keywords that introduce a named item of a module.
const ITEM_KEYWORDS: &[&str] = &["struct", "enum", "fn", "trait", "type", "const", "static", "union"];

struct Tok {
    text: String,
    line: usize,
}

#[derive(Clone, Copy, PartialEq)]
enum RefKind {
    Code,
    Use,
    Glob,
    PubUse,
}

/// A path named in a file: `segs` is relative to the module `ctx`.
struct Ref {
    ctx: Vec<String>,
    segs: Vec<String>,
    line: usize,
    kind: RefKind,
}

/// One module (a file, or an inline `mod name { .. }` of that file).
struct Module {
    file: usize,
    items: BTreeSet<String>,
    children: BTreeSet<String>,
    uses: BTreeMap<String, Vec<String>>,
    globs: Vec<Vec<String>>,
}

struct SourceFile {
    name: String,
    module: Vec<String>,
    toks: Vec<Tok>,
    refs: Vec<Ref>,
}

struct Crate {
    files: Vec<SourceFile>,
    mods: BTreeMap<Vec<String>, Module>,
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn is_ident(s: &str) -> bool {
    s.starts_with(|c: char| c.is_alphabetic() || c == '_' || c == '$')
}

/// The source with comments and string and character literals replaced by spaces (newlines kept).
fn blank_comments_and_literals(src: &str) -> Vec<char> {
    blank_and_strings(src).0
}

/// [`blank_comments_and_literals`], and the contents of the string literals (as written, escapes kept), each with
/// its line.
fn blank_and_strings(src: &str) -> (Vec<char>, Vec<(usize, String)>) {
    let c: Vec<char> = src.chars().collect();
    let mut strings = Vec::new();
    let newlines_before: Vec<usize> = std::iter::once(0)
        .chain(c.iter().scan(0, |n, &ch| {
            *n += usize::from(ch == '\n');
            Some(*n)
        }))
        .collect();
    let line_of = |k: usize| 1 + newlines_before[k];
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    let mut out = c.clone();
    let mut i = 0;
    while i < c.len() {
        let start = i;
        let ident_before = |k: usize| k > 0 && is_ident_char(c[k - 1]);
        let raw_hashes = (c[i] == 'r' && (!ident_before(i) || ("bc".contains(at(i - 1)) && !ident_before(i - 1))))
            .then(|| c[i + 1..].iter().take_while(|&&h| h == '#').count())
            .filter(|&n| at(i + 1 + n) == '"');
        if c[i] == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if let Some(n) = raw_hashes {
            i += n + 2;
            while i < c.len() && !(c[i] == '"' && (1..=n).all(|k| at(i + k) == '#')) {
                i += 1;
            }
            strings.push((line_of(start), c[start + n + 2..i.min(c.len())].iter().collect()));
            i += n + 1;
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            strings.push((line_of(start), c[start + 1..i.min(c.len())].iter().collect()));
            i += 1;
        } else if c[i] == '\'' && (at(i + 1) == '\\' || at(i + 2) == '\'') {
            i += if at(i + 1) == '\\' { 3 } else { 2 };
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            i += 1;
        } else {
            i += 1;
            continue;
        }
        for ch in &mut out[start..i.min(c.len())] {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
    }
    (out, strings)
}

/// Identifiers (with `$crate` and lifetimes as one token), `::`, `->`, `=>` and single punctuation characters.
fn tokenize(c: &[char]) -> Vec<Tok> {
    let (mut toks, mut i, mut line) = (Vec::new(), 0, 1);
    while i < c.len() {
        let mut start = i;
        let next_is_ident = c.get(i + 1).is_some_and(|&n| is_ident_char(n));
        if c[i] == '\n' {
            line += 1;
            i += 1;
            continue;
        } else if c[i].is_whitespace() {
            i += 1;
            continue;
        } else if is_ident_char(c[i]) || ((c[i] == '$' || c[i] == '\'') && next_is_ident) {
            if c[i] == 'r' && c.get(i + 1) == Some(&'#') && c.get(i + 2).is_some_and(|&n| is_ident_char(n)) {
                start += 2; // raw identifier `r#name`
                i += 2;
            }
            i += 1;
            while i < c.len() && is_ident_char(c[i]) {
                i += 1;
            }
        } else {
            let two: String = c[i..(i + 2).min(c.len())].iter().collect();
            i += if matches!(two.as_str(), "::" | "->" | "=>") { 2 } else { 1 };
        }
        toks.push(Tok { text: c[start..i].iter().collect(), line });
    }
    toks
}

/// The tokens without the items marked `#[cfg(test)]` (up to their `;` or matching `}`).
fn strip_cfg_test(toks: Vec<Tok>) -> Vec<Tok> {
    const ATTR: [&str; 7] = ["#", "[", "cfg", "(", "test", ")", "]"];
    let (mut out, mut skipping, mut depth) = (Vec::<Tok>::new(), false, 0i32);
    for tok in toks {
        if !skipping && out.len() >= 7 && out[out.len() - 7..].iter().zip(ATTR).all(|(t, a)| t.text == a) {
            out.truncate(out.len() - 7);
            (skipping, depth) = (true, 0);
        }
        if !skipping {
            out.push(tok);
            continue;
        }
        match tok.text.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" if depth == 0 => {
                skipping = false; // a field or arm at the end of its list: the closer is not ours
                out.push(tok);
            }
            ")" | "]" => depth -= 1,
            "}" if depth == 1 => skipping = false,
            "}" => depth -= 1,
            ";" | "," if depth == 0 => skipping = false,
            _ => {}
        }
    }
    out
}

/// What a use tree imports: the path, the name it binds (`None` for a glob) and the line.
type Imports = Vec<(Vec<String>, Option<String>, usize)>;

/// Parses the use tree at `*i` into `out`, leaving `*i` after it.
fn use_tree(t: &[Tok], i: &mut usize, mut prefix: Vec<String>, out: &mut Imports) {
    let text = |k: usize| t.get(k).map_or("", |t| t.text.as_str());
    loop {
        match text(*i) {
            "::" => *i += 1,
            "*" => {
                out.push((prefix, None, t[*i].line));
                *i += 1;
                return;
            }
            "{" => {
                *i += 1;
                while !matches!(text(*i), "}" | ";" | "") {
                    use_tree(t, i, prefix.clone(), out);
                    if text(*i) == "," {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            s if is_ident(s) => {
                prefix.push(s.to_string());
                *i += 1;
                if text(*i) == "::" {
                    continue;
                }
                if prefix.last().is_some_and(|s| s == "self") {
                    prefix.pop();
                }
                let name = if text(*i) == "as" {
                    *i += 2;
                    text(*i - 1).to_string()
                } else {
                    prefix.last().cloned().unwrap_or_default()
                };
                out.push((prefix, Some(name), t[*i - 1].line));
                return;
            }
            _ => return,
        }
    }
}

impl Crate {
    /// Reads `src/lib.rs` and every module file it declares, recursively.
    fn load(src: &Path) -> Crate {
        let mut krate = Crate { files: Vec::new(), mods: BTreeMap::new() };
        let mut queue = VecDeque::from([(src.join("lib.rs"), Vec::new())]);
        while let Some((path, module)) = queue.pop_front() {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let toks = strip_cfg_test(tokenize(&blank_comments_and_literals(&text)));
            let file = krate.files.len();
            let (refs, decls) = krate.scan(file, &module, &toks);
            let name = path.strip_prefix(src).unwrap().to_string_lossy().replace('\\', "/");
            krate.files.push(SourceFile { name: format!("src/{name}"), module: module.clone(), toks, refs });
            let owns_dir = matches!(path.file_name().and_then(|n| n.to_str()), Some("lib.rs" | "mod.rs"));
            let dir = if owns_dir { path.parent().unwrap().to_path_buf() } else { path.with_extension("") };
            for (inline, child) in decls {
                let base = inline.iter().fold(dir.clone(), |d, m| d.join(m));
                let candidates = [base.join(format!("{child}.rs")), base.join(&child).join("mod.rs")];
                let Some(found) = candidates.into_iter().find(|p| p.is_file()) else {
                    eprintln!("note: no file for `mod {child};` declared in {}", path.display());
                    continue;
                };
                queue.push_back((found, [module.clone(), inline, vec![child]].concat()));
            }
        }
        krate
    }

    /// Records the items, submodules and imports of `file` (module path `module`); returns the paths it names
    /// and its `mod name;` declarations (with the inline modules around them).
    fn scan(&mut self, file: usize, module: &[String], toks: &[Tok]) -> (Vec<Ref>, Vec<(Vec<String>, String)>) {
        let t = |k: usize| toks.get(k).map_or("", |t| t.text.as_str());
        let name_at =
            |k: usize| Some(t(k)).filter(|s| is_ident(s) && !["fn", "unsafe", "async", "extern", "_"].contains(s));
        let (mut refs, mut decls, mut inline) = (Vec::new(), Vec::new(), Vec::<(String, i32)>::new());
        let (mut i, mut depth) = (0, 0i32);
        while i < toks.len() {
            let ctx: Vec<String> = module.iter().cloned().chain(inline.iter().map(|m| m.0.clone())).collect();
            let at_module_level = depth == inline.last().map_or(0, |m| m.1 + 1);
            let new = || Module { file, items: [].into(), children: [].into(), uses: [].into(), globs: Vec::new() };
            let m = self.mods.entry(ctx.clone()).or_insert_with(new);
            match t(i) {
                "{" => depth += 1,
                "}" => {
                    depth -= 1;
                    if inline.last().is_some_and(|m| m.1 == depth) {
                        inline.pop();
                    }
                }
                "use" => {
                    let mut k = i.wrapping_sub(1);
                    if t(k) == ")" {
                        while k > 0 && t(k) != "(" {
                            k -= 1;
                        }
                        k = k.wrapping_sub(1);
                    }
                    let public = t(k) == "pub";
                    let (mut tree, mut j) = (Vec::new(), i + 1);
                    use_tree(toks, &mut j, Vec::new(), &mut tree);
                    for (segs, name, line) in tree {
                        let kind = match (&name, public) {
                            (_, true) => RefKind::PubUse,
                            (None, false) => RefKind::Glob,
                            (Some(_), false) => RefKind::Use,
                        };
                        match name {
                            Some(name) => {
                                m.uses.entry(name).or_insert_with(|| segs.clone());
                            }
                            None => m.globs.push(segs.clone()),
                        }
                        refs.push(Ref { ctx: ctx.clone(), segs, line, kind });
                    }
                    i = j;
                    continue;
                }
                "mod" if is_ident(t(i + 1)) => {
                    m.children.insert(t(i + 1).to_string());
                    match t(i + 2) {
                        ";" => decls.push((inline.iter().map(|m| m.0.clone()).collect(), t(i + 1).to_string())),
                        "{" => inline.push((t(i + 1).to_string(), depth)),
                        _ => {}
                    }
                    i += 2;
                    continue;
                }
                "macro_rules" if t(i + 1) == "!" && at_module_level => {
                    m.items.insert(t(i + 2).to_string());
                }
                mac if is_ident(mac) && t(i + 1) == "!" && at_module_level => {
                    // Items a macro call may define (`id_type!(RequestId, ..)`): every name in its arguments.
                    let mut inner = 0;
                    for tok in &toks[i + 2..] {
                        match tok.text.as_str() {
                            "(" | "[" | "{" => inner += 1,
                            ")" | "]" | "}" => inner -= 1,
                            name if is_ident(name) => {
                                m.items.insert(name.to_string());
                            }
                            _ => {}
                        }
                        if inner == 0 {
                            break;
                        }
                    }
                }
                kw if ITEM_KEYWORDS.contains(&kw) && at_module_level => {
                    let k = if t(i + 1) == "mut" { i + 2 } else { i + 1 };
                    if let Some(name) = name_at(k) {
                        m.items.insert(name.to_string());
                    }
                }
                first if is_ident(first) && t(i + 1) == "::" && t(i.wrapping_sub(1)) != "::" => {
                    let (mut segs, mut j) = (vec![first.to_string()], i + 1);
                    while t(j) == "::" && is_ident(t(j + 1)) {
                        segs.push(t(j + 1).to_string());
                        j += 2;
                    }
                    if segs.len() > 1 {
                        refs.push(Ref { ctx, segs, line: toks[i].line, kind: RefKind::Code });
                    }
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        (refs, decls)
    }

    /// `segs` named in module `ctx` as an absolute module path, or `None` if it starts outside the crate.
    fn absolute(&self, ctx: &[String], segs: &[String]) -> Option<Vec<String>> {
        let mut out = ctx.to_vec();
        let mut rest = segs;
        match segs.first()?.as_str() {
            "crate" | "$crate" => (out, rest) = (Vec::new(), &segs[1..]),
            "self" => rest = &segs[1..],
            "super" => {
                while rest.first().is_some_and(|s| s == "super") {
                    out.pop()?;
                    rest = &rest[1..];
                }
            }
            first => {
                let m = self.mods.get(ctx)?;
                if !m.children.contains(first) && !m.items.contains(first) && !m.uses.contains_key(first) {
                    return None;
                }
            }
        }
        out.extend(rest.iter().cloned());
        Some(out)
    }

    /// The file defining what the absolute path `path` names, following imports, and whether it is a module.
    fn resolve(&self, path: &[String], hops: usize) -> Option<(usize, bool)> {
        let mut cur = Vec::new();
        for (k, seg) in path.iter().enumerate() {
            let m = self.mods.get(&cur)?;
            let last = k + 1 == path.len();
            if m.children.contains(seg) && !(last && (m.items.contains(seg) || m.uses.contains_key(seg))) {
                cur.push(seg.clone());
                continue;
            }
            if m.items.contains(seg) {
                return Some((m.file, false));
            }
            if hops > 32 {
                return None;
            }
            let rest = &path[k + 1..];
            if let Some(target) = m.uses.get(seg) {
                let full = [self.absolute(&cur, target)?, rest.to_vec()].concat();
                return self.resolve(&full, hops + 1);
            }
            return m.globs.iter().find_map(|g| {
                let full = [self.absolute(&cur, g)?, vec![seg.clone()], rest.to_vec()].concat();
                self.resolve(&full, hops + 1)
            });
        }
        Some((self.mods.get(&cur)?.file, true))
    }

    /// Dependencies between files, each with the first path (as text) and line creating it, and the paths from
    /// `crate`, `super` or `self` that lead nowhere (a blind spot of the scan, or code that does not build).
    fn edges(&self) -> (Edges, Vec<String>) {
        let (mut edges, mut unresolved) = (BTreeMap::new(), Vec::new());
        for (f, file) in self.files.iter().enumerate() {
            for r in &file.refs {
                let text = match r.kind {
                    RefKind::Code => r.segs.join("::"),
                    RefKind::Glob => format!("use {}::*", r.segs.join("::")),
                    _ => format!("use {}", r.segs.join("::")),
                };
                let anchored = matches!(r.segs[0].as_str(), "crate" | "$crate" | "super" | "self");
                let Some((g, is_module)) = self.absolute(&r.ctx, &r.segs).and_then(|p| self.resolve(&p, 0)) else {
                    if anchored {
                        unresolved.push(format!("{}:{}: `{text}`", file.name, r.line));
                    }
                    continue;
                };
                let (from, to) = (&file.module, &self.files[g].module);
                let descendant = to.len() > from.len() && to.starts_with(from);
                if r.kind == RefKind::PubUse || (is_module && r.kind != RefKind::Glob) || g == f || descendant {
                    continue;
                }
                edges.entry((f, g)).or_insert((text, r.line));
            }
        }
        (edges, unresolved)
    }
}

fn src_dir() -> PathBuf {
    let root = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    let root = root.or_else(|| option_env!("CARGO_MANIFEST_DIR").map(PathBuf::from));
    root.expect("CARGO_MANIFEST_DIR names the crate root").join("src")
}

/// Strongly connected components of the graph (Tarjan).
fn components(adj: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        adj: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        visited: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State, v: usize) {
        (s.index[v], s.low[v], s.on_stack[v]) = (Some(s.visited), s.visited, true);
        s.visited += 1;
        s.stack.push(v);
        let adj = s.adj;
        for &w in &adj[v] {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(comp);
        }
    }
    let n = adj.len();
    let mut s = State {
        adj,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: vec![],
        visited: 0,
        out: vec![],
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

/// The shortest cycle from `start` back to it inside `comp` (breadth first), as its nodes from `start`.
fn shortest_cycle(adj: &[Vec<usize>], comp: &BTreeSet<usize>, start: usize) -> Vec<usize> {
    let mut parent = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &w in adj[v].iter().filter(|w| comp.contains(w)) {
            if w == start {
                let mut cycle = vec![v];
                while let Some(&p) = parent.get(cycle.last().unwrap()) {
                    cycle.push(p);
                }
                cycle.reverse();
                return cycle;
            }
            if w != start && !parent.contains_key(&w) {
                parent.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    unreachable!("{start} lies on a cycle of its component")
}

#[test]
fn no_import_cycles_between_files() {
    let krate = Crate::load(&src_dir());
    let (edges, unresolved) = krate.edges();
    for u in &unresolved {
        eprintln!("note: unresolved path {u}");
    }
    let mut adj = vec![Vec::new(); krate.files.len()];
    for &(f, g) in edges.keys() {
        adj[f].push(g);
    }
    let name = |f: usize| krate.files[f].name.as_str();
    let mut report = String::new();
    let mut groups: Vec<BTreeSet<usize>> =
        components(&adj).into_iter().filter(|c| c.len() > 1).map(|c| c.into_iter().collect()).collect();
    groups.sort_by_key(|c| c.iter().map(|&f| name(f)).min().map(str::to_string));
    for comp in &groups {
        let mut members: Vec<&str> = comp.iter().map(|&f| name(f)).collect();
        members.sort_unstable();
        report += &format!("\n{} files import each other: {}\n", comp.len(), members.join(", "));
        let mut cycles = BTreeSet::new();
        for &start in comp {
            let mut cycle = shortest_cycle(&adj, comp, start);
            let min = (0..cycle.len()).min_by_key(|&k| name(cycle[k])).unwrap();
            cycle.rotate_left(min);
            cycles.insert(cycle);
        }
        for cycle in cycles {
            let names: Vec<&str> = cycle.iter().chain(&cycle[..1]).map(|&f| name(f)).collect();
            report += &format!("  cycle: {}\n", names.join(" -> "));
            for (k, &f) in cycle.iter().enumerate() {
                let g = cycle[(k + 1) % cycle.len()];
                let (text, line) = &edges[&(f, g)];
                report += &format!("    {} -> {}: `{text}` at {}:{line}\n", name(f), name(g), name(f));
            }
        }
    }
    assert!(groups.is_empty(), "import cycles between files, {} group(s):\n{report}", groups.len());
}

/// The return types (as text, with their line) after `->` that contain `Result<_, String>` (not of closures).
fn result_string_returns(toks: &[Tok]) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if toks[i].text != "->" || (i > 0 && toks[i - 1].text == "|") {
            i += 1;
            continue;
        }
        let (start, mut depth) = (i + 1, 0i32);
        i += 1;
        while let Some(tok) = toks.get(i) {
            match tok.text.as_str() {
                "<" | "(" | "[" => depth += 1,
                ">" | ")" | "]" if depth == 0 => break,
                ">" | ")" | "]" => depth -= 1,
                "{" | ";" | "," | "=" | "where" if depth == 0 => break,
                _ => {}
            }
            i += 1;
        }
        let ty = &toks[start..i];
        let returns_string = (0..ty.len()).any(|k| {
            if ty[k].text != "Result" || ty.get(k + 1).is_none_or(|t| t.text != "<") {
                return false;
            }
            let (mut args, mut depth) = (vec![String::new()], 0);
            for t in &ty[k + 1..] {
                match t.text.as_str() {
                    "<" | "(" | "[" => depth += 1,
                    ">" | ")" | "]" => depth -= 1,
                    "," if depth == 1 => args.push(String::new()),
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
                if !(depth == 1 && matches!(t.text.as_str(), "<" | ",")) {
                    args.last_mut().unwrap().push_str(&t.text);
                }
            }
            args.len() == 2 && matches!(args[1].as_str(), "String" | "std::string::String" | "alloc::string::String")
        });
        if returns_string {
            let mut text = String::new();
            for (k, t) in ty.iter().enumerate() {
                let word = |t: &Tok| t.text.starts_with(|c: char| is_ident_char(c) || c == '\'');
                if k > 0 && (word(&ty[k - 1]) && word(t) || ty[k - 1].text == ",") {
                    text.push(' ');
                }
                text.push_str(&t.text);
            }
            found.push((toks[start - 1].line, text));
        }
    }
    found
}

#[test]
fn no_string_errors_outside_leaf_helpers() {
    let krate = Crate::load(&src_dir());
    let (mut report, mut counts) = (String::new(), Vec::new());
    let mut files: Vec<&SourceFile> = krate.files.iter().collect();
    files.sort_by_key(|f| &f.name);
    for file in files.into_iter().filter(|f| !RESULT_STRING_ALLOWED.contains(&f.name.as_str())) {
        let found = result_string_returns(&file.toks);
        for (line, ty) in &found {
            report += &format!("  {}:{line}: -> {ty}\n", file.name);
        }
        if !found.is_empty() {
            counts.push(format!("  {}: {}", file.name, found.len()));
        }
    }
    assert!(
        counts.is_empty(),
        "`Result<_, String>` returned outside the leaf helpers (return a typed error, or add the file to \
         RESULT_STRING_ALLOWED):\n{report}per file:\n{}",
        counts.join("\n")
    );
}

/// The tables whose columns only `metrics/` may name by a literal: every table but the axis columns, which are
/// the user's dotted paths.
fn column_names() -> BTreeSet<String> {
    use opal::output::{TableKind, TableSet};
    let set = TableSet { tables: TableKind::WRITE_ORDER.into_iter().collect(), axis_columns: Vec::new() };
    TableKind::WRITE_ORDER.into_iter().flat_map(|kind| set.columns(kind)).map(|(name, _)| name).collect()
}

/// DESIGN §11: a column is named once, in its row's declaration in `metrics/` (the readers use
/// `metrics::rows::col`), so a renamed column is a build error, not a report that shows "—". This test fails on a
/// string literal in the code that writes or reads the tables (output, report, sweep, cli, the recorder and the
/// cluster; not in `#[cfg(test)]` code) that is exactly the name of a column of any output table, except where the
/// same word is something else ([`NOT_A_COLUMN`]). (The configuration's readers are not scanned: `type`, `count`
/// and `worker` are spec keys there.)
#[test]
fn no_column_is_named_by_a_string_literal_outside_metrics() {
    let columns = column_names();
    assert!(columns.contains("ttft_p99_ms") && columns.contains("interval_start_s"), "{columns:?}");
    let krate = Crate::load(&src_dir());
    let mut found = Vec::new();
    let readers = ["src/output/", "src/report/", "src/sweep/", "src/cli/", "src/recorder.rs", "src/cluster.rs"];
    for file in krate.files.iter().filter(|f| readers.iter().any(|r| f.name.starts_with(r))) {
        let text = std::fs::read_to_string(src_dir().join(file.name.strip_prefix("src/").unwrap())).unwrap();
        let (blank, strings) = blank_and_strings(&text);
        let all: BTreeSet<usize> = tokenize(&blank).iter().map(|t| t.line).collect();
        let kept: BTreeSet<usize> = file.toks.iter().map(|t| t.line).collect();
        for (line, s) in strings {
            let in_test = all.contains(&line) && !kept.contains(&line);
            if columns.contains(&s) && !in_test && !NOT_A_COLUMN.contains(&(file.name.as_str(), s.as_str())) {
                found.push(format!("{}:{line}: \"{s}\"", file.name));
            }
        }
    }
    assert!(found.is_empty(), "column names as string literals (use metrics::rows::col):\n{}", found.join("\n"));
}

/// The top-level modules, lowest first: a module may use those below it. `lib.rs` only declares the modules and
/// re-exports; it is not a layer.
const LAYERS: &[&str] = &[
    "time",
    "ids",
    "rng",
    "engine",
    "storage",
    "kvcache",
    "workload",
    "request",
    "metrics",
    "worker",
    "router",
    "config",
    "stats",
    "recorder",
    "cluster",
    "output",
    "calibrate",
    "sweep",
    "report",
    "cli",
];

/// The arrows that run back up [`LAYERS`], each with why it stays.
const BACK_ARROWS: &[(&str, &str, &str)] = &[(
    "kvcache",
    "request",
    "kvcache::saving decides what a finished step saves from the request's own state (what it has saved, its P/D \
     phase), while a request is made of kvcache's types (block hashes, chunked sequences, its radix path): the \
     save rules are the KV connector's (LMCache's), and moving them above the request would split the KV layer",
)];

/// The module graph (file edges, as [`no_import_cycles_between_files`] finds them, between top-level modules)
/// runs downwards through [`LAYERS`] but for [`BACK_ARROWS`]; a new module must be given its layer.
#[test]
fn the_module_graph_runs_down_its_layers_but_for_the_arrows_named() {
    let krate = Crate::load(&src_dir());
    let (edges, _) = krate.edges();
    let top = |f: usize| {
        let rest = krate.files[f].name.strip_prefix("src/").unwrap();
        rest.split(['/', '.']).next().unwrap().to_string()
    };
    let layer = |m: &str| LAYERS.iter().position(|&l| l == m);
    let mut problems = Vec::new();
    let mut back = BTreeMap::new();
    for (&(f, g), (text, line)) in &edges {
        let (from, to) = (top(f), top(g));
        if from == to {
            continue;
        }
        let (Some(a), Some(b)) = (layer(&from), layer(&to)) else {
            problems.push(format!("{from} -> {to}: give each module its place in LAYERS"));
            continue;
        };
        if a < b {
            back.entry((from, to)).or_insert_with(|| format!("`{text}` at {}:{line}", krate.files[f].name));
        }
    }
    for ((from, to), at) in &back {
        if !BACK_ARROWS.iter().any(|&(a, b, _)| (a, b) == (from.as_str(), to.as_str())) {
            problems.push(format!("{from} -> {to} runs back up ({at})"));
        }
    }
    for &(a, b, _) in BACK_ARROWS {
        if !back.contains_key(&(a.to_string(), b.to_string())) {
            problems.push(format!("{a} -> {b} is listed in BACK_ARROWS but no longer exists: remove it"));
        }
    }
    assert!(BACK_ARROWS.len() <= 2, "at most two arrows may run back up");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
