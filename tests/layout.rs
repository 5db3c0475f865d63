//! The layout of `src/` stays as `README.md` describes it: modules import one way (wire <-
//! proto <- session <- event_loop -> sys, with the client layer on top), no module imports
//! one that imports it back, and no file grows past about a thousand lines.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Longest file allowed in `src/`, in lines.
const MAX_LINES: usize = 1_000;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The top-level module a file belongs to (`src/session/conn.rs` -> `session`).
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(src()).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// The code of a file without comments and without its unit tests (`mod tests` and files
/// named `tests.rs` or under a `tests/` folder import freely).
fn code(path: &Path) -> Option<String> {
    let rel = path
        .strip_prefix(src())
        .unwrap()
        .to_string_lossy()
        .to_string();
    if rel.ends_with("/tests.rs") || rel.contains("/tests/") {
        return None;
    }
    let text = fs::read_to_string(path).unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect();
    Some(lines.join("\n"))
}

/// Which top-level modules each module names through `crate::`.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let from = module_of(&file);
        if from == "lib" {
            continue;
        }
        let Some(code) = code(&file) else { continue };
        let entry = graph.entry(from.clone()).or_default();
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let is_module = src().join(format!("{name}.rs")).exists() || src().join(&name).is_dir();
            if name != from && is_module {
                entry.insert(name);
            }
        }
    }
    graph
}

/// A cycle through `start`, if any.
fn cycle_from(
    graph: &BTreeMap<String, BTreeSet<String>>,
    start: &str,
    at: &str,
    path: &mut Vec<String>,
) -> Option<Vec<String>> {
    for next in graph.get(at).into_iter().flatten() {
        if next == start {
            let mut c = path.clone();
            c.push(next.clone());
            return Some(c);
        }
        if path.contains(next) {
            continue;
        }
        path.push(next.clone());
        if let Some(c) = cycle_from(graph, start, next, path) {
            return Some(c);
        }
        path.pop();
    }
    None
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graph = imports();
    assert!(graph.contains_key("session") && graph.contains_key("event_loop"));
    for module in graph.keys() {
        let mut path = vec![module.clone()];
        if let Some(cycle) = cycle_from(&graph, module, module, &mut path) {
            panic!("import cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_layers_import_downwards_only() {
    let graph = imports();
    let below: &[(&str, &[&str])] = &[("wire", &[]), ("proto", &["wire"]), ("sys", &[])];
    for (module, allowed) in below {
        let got = graph.get(*module).cloned().unwrap_or_default();
        let extra: Vec<_> = got
            .iter()
            .filter(|m| !allowed.contains(&m.as_str()))
            .collect();
        assert!(extra.is_empty(), "{module} imports {extra:?}");
    }
    // The protocol state never reaches for I/O, the loop, or the client layer above it.
    let above_session = ["event_loop", "sys", "runtime", "client"];
    let session = graph.get("session").cloned().unwrap_or_default();
    for m in above_session {
        assert!(!session.contains(m), "session imports {m}");
    }
    let event_loop = graph.get("event_loop").cloned().unwrap_or_default();
    for m in ["runtime", "client"] {
        assert!(!event_loop.contains(m), "event_loop imports {m}");
    }
}

#[test]
fn no_file_in_src_is_over_a_thousand_lines() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut long: Vec<String> = files
        .iter()
        .map(|f| (f, fs::read_to_string(f).unwrap().lines().count()))
        .filter(|(_, n)| *n > MAX_LINES)
        .map(|(f, n)| format!("{} ({n} lines)", f.display()))
        .collect();
    long.sort();
    assert!(long.is_empty(), "split these files: {long:?}");
}
