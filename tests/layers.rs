//! Dependencies between the crate's top-level modules go one way, as `docs/architecture.md`
//! lists them: a module uses only those before it. This reads every file under `src/` (test
//! modules left out) and finds each path into the crate: `crate::x` paths in `use` lines and
//! inline, grouped `use crate::{a, b}`, names re-exported at the root (`crate::Snapshot`),
//! `super::` chains that leave a top-level module, and `crate::config::X` / `crate::stats::X`
//! by the module each re-exports from.

use std::collections::HashMap;
use std::path::Path;

/// The layers, in order; modules of one layer may not use each other (except the leaves).
const LAYERS: &[&[&str]] = &[
    &["units", "sync", "intern"],
    &["error"],
    &["backend"],
    &["record"],
    &["frames"],
    &["model"],
    &["alloc"],
    &["device"],
    &["snapshot"],
    &["report", "replay"],
    &["observe"],
    &["ledger"],
    &["testing"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The text with comments, string and char literals blanked, and `#[cfg(test)]` modules cut.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod ") {
        Some(i) => &text[..i],
        None => text,
    };
    let b = text.as_bytes();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' {
            // A raw string's hashes are not tracked: the crate's raw strings hold no quotes
            // that matter here.
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            i += 3;
        } else if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') {
            while i < b.len() && !(b[i] == b'\'' && i > 0 && b[i - 1] != b'\\' && out.ends_with('x')) {
                i += 1;
                if b.get(i) == Some(&b'\'') {
                    i += 1;
                    break;
                }
            }
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

fn ident_at(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

/// Where each name the root re-exports comes from: `Snapshot` -> `snapshot`,
/// `config::AllocatorConfig` -> `alloc`.
fn root_names(lib: &str) -> HashMap<String, String> {
    let code = code_of(lib);
    let mut out = HashMap::new();
    let mut prefix = String::new();
    for part in code.split(';') {
        let part = part.trim();
        for inner in ["stats", "config"] {
            if part.contains(&format!("pub mod {inner} {{")) {
                prefix = format!("{inner}::");
            }
        }
        let Some(at) = part.find("pub use ") else { continue };
        let path = part[at + 8..].trim().trim_start_matches("crate::");
        let module = ident_at(path).to_string();
        let names: Vec<&str> = match (path.find('{'), path.rfind('}')) {
            (Some(a), Some(b)) => path[a + 1..b].split(',').map(str::trim).collect(),
            _ => vec![path.rsplit("::").next().unwrap_or("")],
        };
        for n in names.into_iter().filter(|n| !n.is_empty()) {
            out.insert(format!("{prefix}{n}"), module.clone());
        }
        if part.contains('}') && part.matches('}').count() > part.matches('{').count() {
            prefix.clear();
        }
    }
    out
}

/// The modules the path `rest` (what follows `crate::`) names: one, or one per item of a
/// group.
fn targets(rest: &str, roots: &HashMap<String, String>, out: &mut Vec<String>) {
    let rest = rest.trim_start();
    if let Some(group) = rest.strip_prefix('{') {
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    targets(&group[start..i], roots, out);
                    return;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    targets(&group[start..i], roots, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        return;
    }
    let first = ident_at(rest);
    if first.is_empty() || first == "self" {
        return;
    }
    if layer(first).is_some() {
        out.push(first.to_string());
    } else if first == "stats" || first == "config" {
        let second = rest[first.len()..].trim_start_matches("::");
        let second = if second.starts_with('{') { second } else { ident_at(second) };
        if second.starts_with('{') {
            // `crate::config::{A, B}`
            let mut names = Vec::new();
            for n in second.trim_matches(|c| c == '{' || c == '}').split(',') {
                names.push(format!("{first}::{}", n.trim()));
            }
            out.extend(names.iter().filter_map(|n| roots.get(n).cloned()));
        } else if let Some(m) = roots.get(&format!("{first}::{second}")) {
            out.push(m.clone());
        }
    } else if let Some(m) = roots.get(first) {
        out.push(m.clone());
    }
}

/// The module path of a file under `src/`: `alloc/heap/mod.rs` -> `["alloc", "heap"]`.
fn module_path(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel.trim_end_matches(".rs").split('/').map(str::to_string).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// Every use of a later module (or a sibling of the same layer): `file: module -> module`.
fn violations(files: &[(String, String)], lib: &str) -> Vec<String> {
    let roots = root_names(lib);
    let mut out = Vec::new();
    for (rel, text) in files {
        let path = module_path(rel);
        let Some(own) = path.first().cloned() else { continue };
        let Some(own_layer) = layer(&own) else { continue };
        let code = code_of(text);
        let mut used = Vec::new();
        for (i, _) in code.match_indices("crate::") {
            // `$crate::` in a macro and `vramscope_crate::` are not this crate's paths.
            if i > 0 && code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '$') {
                continue;
            }
            targets(&code[i + 7..], &roots, &mut used);
        }
        for (i, _) in code.match_indices("super::") {
            if i > 0 && code[..i].ends_with("super::") {
                continue; // counted from the first of a chain
            }
            let mut rest = &code[i..];
            let mut ups = 0;
            while let Some(r) = rest.strip_prefix("super::") {
                ups += 1;
                rest = r;
            }
            if ups >= path.len() {
                targets(rest, &roots, &mut used);
            }
        }
        for target in used {
            let t = layer(&target).expect("a known module");
            let sibling = t == own_layer && target != own && own_layer > 0;
            if t > own_layer || sibling {
                out.push(format!("src/{rel}: {own} -> {target}"));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

fn sources() -> (Vec<(String, String)>, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
                if rel != "lib.rs" {
                    files.push((rel, std::fs::read_to_string(&p).unwrap()));
                }
            }
        }
    }
    files.sort();
    (files, std::fs::read_to_string(root.join("lib.rs")).unwrap())
}

#[test]
fn modules_use_only_those_before_them() {
    let (files, lib) = sources();
    assert!(files.len() > 50, "read {} files", files.len());
    let found = violations(&files, &lib);
    assert!(found.is_empty(), "{} uses against docs/architecture.md's layers:\n{}", found.len(), found.join("\n"));
}

/// Each kind of path the check reads, planted in a module that may not use its target.
#[test]
fn a_planted_backward_use_is_caught() {
    let (_, lib) = sources();
    let plant = |rel: &str, text: &str| violations(&[(rel.to_string(), text.to_string())], &lib);
    assert_eq!(plant("alloc/x.rs", "use crate::report::fmt;"), ["src/alloc/x.rs: alloc -> report"]);
    assert_eq!(plant("alloc/x.rs", "fn f() { crate::testing::run() }"), ["src/alloc/x.rs: alloc -> testing"]);
    assert_eq!(plant("error/x.rs", "use crate::{units::a, testing::MAX};"), ["src/error/x.rs: error -> testing"]);
    assert_eq!(plant("frames.rs", "fn f() -> crate::Snapshot { todo!() }"), ["src/frames.rs: frames -> snapshot"]);
    assert_eq!(plant("backend/x.rs", "use crate::config::AllocatorConfig;"), ["src/backend/x.rs: backend -> alloc"]);
    assert_eq!(
        plant("alloc/heap/x.rs", "use super::super::super::device::f;"),
        ["src/alloc/heap/x.rs: alloc -> device"]
    );
    assert_eq!(plant("report/x.rs", "use crate::replay::fit;"), ["src/report/x.rs: report -> replay"]);
    // Inside a module, in comments and strings, and downwards: nothing.
    assert!(plant("alloc/heap/x.rs", "use super::super::stats; // crate::testing\nconst S: &str = \"crate::ledger\";")
        .is_empty());
    assert!(plant("testing/x.rs", "use crate::{alloc::A, report::B, ledger::C};").is_empty());
    assert!(plant("alloc/x.rs", "fn f() {}\n#[cfg(test)]\nmod tests { use crate::testing::MemTest; }").is_empty());
}

/// The top-level modules whose files must not use each other in a cycle.
const ACYCLIC: &[&str] = &["alloc", "model", "record", "snapshot"];

/// The file of module path `path` among `files`: `a/b.rs` or `a/b/mod.rs`.
fn module_file(path: &[String], files: &HashMap<&str, ()>) -> Option<String> {
    let joined = path.join("/");
    [format!("{joined}.rs"), format!("{joined}/mod.rs")].into_iter().find(|f| files.contains_key(f.as_str()))
}

/// The files of the module paths that `rest` names from module `at` (a group gives one per
/// item): the deepest module each path reaches; the rest of a path is an item of that module.
fn path_files(at: &[String], rest: &str, files: &HashMap<&str, ()>, out: &mut Vec<String>) {
    let rest = rest.trim_start();
    if let Some(group) = rest.strip_prefix('{') {
        let (mut depth, mut start) = (0, 0);
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => return path_files(at, &group[start..i], files, out),
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    path_files(at, &group[start..i], files, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        return;
    }
    let first = ident_at(rest);
    let mut inner = at.to_vec();
    inner.push(first.to_string());
    match module_file(&inner, files) {
        Some(file) if !first.is_empty() => {
            let after = rest[first.len()..].trim_start();
            match after.strip_prefix("::") {
                Some(next) => {
                    let before = out.len();
                    path_files(&inner, next, files, out);
                    if out.len() == before {
                        out.push(file);
                    }
                }
                None => out.push(file),
            }
        }
        _ => {}
    }
}

/// Cycles between the files of each module of [`ACYCLIC`] through module paths (`super::x`,
/// `crate::m::x`): one line per cycle found, its files in order. A file using its own module's
/// ancestors (the `mod.rs` files above it) is how a module is built, not an edge.
fn file_cycles(files: &[(String, String)]) -> Vec<String> {
    let known: HashMap<&str, ()> = files.iter().map(|(rel, _)| (rel.as_str(), ())).collect();
    let mut edges: HashMap<String, Vec<String>> = HashMap::new();
    for (rel, text) in files {
        let path = module_path(rel);
        if !path.first().is_some_and(|m| ACYCLIC.contains(&m.as_str())) {
            continue;
        }
        let code = code_of(text);
        let mut used = Vec::new();
        for (i, _) in code.match_indices("crate::") {
            if i > 0 && code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '$') {
                continue;
            }
            if code[i + 7..].starts_with(&format!("{}::", path[0])) {
                path_files(&[], &code[i + 7..], &known, &mut used);
            }
        }
        for (i, _) in code.match_indices("super::") {
            if i > 0 && code[..i].ends_with("super::") {
                continue;
            }
            let mut rest = &code[i..];
            let mut at = path.clone();
            while let Some(r) = rest.strip_prefix("super::") {
                at.pop();
                rest = r;
            }
            if !at.is_empty() {
                path_files(&at, rest, &known, &mut used);
            }
        }
        // The file's own module and the modules above it are not edges.
        let ancestors: Vec<String> = (1..=path.len()).filter_map(|n| module_file(&path[..n], &known)).collect();
        let list = edges.entry(rel.clone()).or_default();
        for u in used {
            if !ancestors.contains(&u) && !list.contains(&u) {
                list.push(u);
            }
        }
    }
    // Depth-first search; a file met again while on the path closes a cycle.
    fn visit(
        f: &str,
        edges: &HashMap<String, Vec<String>>,
        path: &mut Vec<String>,
        done: &mut Vec<String>,
        out: &mut Vec<String>,
    ) {
        if let Some(at) = path.iter().position(|p| p == f) {
            let mut cycle = path[at..].to_vec();
            cycle.push(f.to_string());
            out.push(cycle.join(" -> "));
            return;
        }
        if done.iter().any(|d| d == f) {
            return;
        }
        path.push(f.to_string());
        for next in edges.get(f).into_iter().flatten() {
            visit(next, edges, path, done, out);
        }
        path.pop();
        done.push(f.to_string());
    }
    let mut names: Vec<&String> = edges.keys().collect();
    names.sort();
    let (mut done, mut out) = (Vec::new(), Vec::new());
    for f in names {
        visit(f, &edges, &mut Vec::new(), &mut done, &mut out);
    }
    out
}

#[test]
fn files_of_a_module_use_each_other_one_way() {
    let (files, _) = sources();
    let found = file_cycles(&files);
    assert!(found.is_empty(), "{} cycles between files:\n{}", found.len(), found.join("\n"));
}

/// Cycles through each kind of path, planted; a child using its parent is none.
#[test]
fn a_planted_cycle_between_files_is_caught() {
    let plant = |files: &[(&str, &str)]| {
        let files: Vec<(String, String)> = files.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        file_cycles(&files)
    };
    let cycle = plant(&[
        ("alloc/mod.rs", "mod a; mod b;"),
        ("alloc/a.rs", "use super::b::B;"),
        ("alloc/b.rs", "fn f() { crate::alloc::a::g() }"),
    ]);
    assert_eq!(cycle, ["alloc/a.rs -> alloc/b.rs -> alloc/a.rs"]);
    let grouped = plant(&[
        ("snapshot/mod.rs", ""),
        ("snapshot/x/mod.rs", ""),
        ("snapshot/x/a.rs", "use super::super::{y::Y, z};"),
        ("snapshot/y.rs", "use super::x::a::A;"),
        ("snapshot/z.rs", ""),
    ]);
    assert_eq!(grouped, ["snapshot/x/a.rs -> snapshot/y.rs -> snapshot/x/a.rs"]);
    assert!(plant(&[
        ("record/mod.rs", "use crate::record::a::A;"),
        ("record/a.rs", "use super::*; use super::b::B;"),
        ("record/b.rs", "use super::Item;"),
        ("report/a.rs", "use super::b::B;"),
        ("report/b.rs", "use super::a::A;"),
    ])
    .is_empty());
}
