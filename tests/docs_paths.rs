//! The paths the README names exist: the tree of its Layout section, every backquoted path
//! of the repository (`src/...`, `docs/...`, ...) and every relative link, in `README.md`
//! and `docs/commctl.md`. A file moved or renamed fails here with the path the docs still
//! name, until the docs follow.

use std::fs;
use std::path::{Path, PathBuf};

/// Where a backquoted path of the repository starts.
const TOP: &[&str] = &[
    "src/",
    "ffi/",
    "tools/",
    "docs/",
    "examples/",
    "tests/",
    "benches/",
    "fuzz/",
    ".ci/",
];

/// Extensions that make a bare name in the Layout tree a file name.
const EXTENSIONS: &[&str] = &[".rs", ".md", ".toml", ".h", ".c", ".py"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(doc: &str) -> String {
    fs::read_to_string(root().join(doc)).unwrap_or_else(|e| panic!("{doc}: {e}"))
}

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The text of each `code span` in `lines` that is one path of the repository.
fn backquoted_paths(lines: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for line in lines {
        for (i, span) in line.split('`').enumerate() {
            let is_path = i % 2 == 1
                && !span.contains(char::is_whitespace)
                && TOP.iter().any(|top| span.starts_with(top));
            if is_path {
                out.push(span.to_owned());
            }
        }
    }
    out
}

/// Relative link targets (`](path)`, `](path#anchor)`) in `lines`, without the anchor.
fn link_targets(lines: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for line in lines {
        for piece in line.split("](").skip(1) {
            let target = piece.split(')').next().unwrap_or("");
            let path = target.split('#').next().unwrap_or("");
            if !path.is_empty() && !path.contains("://") {
                out.push(path.to_owned());
            }
        }
    }
    out
}

/// Words of `text` that name a file or a folder: `a/b/`, `name.rs`, `src/a/b` (but not
/// `I/O` or `accept/connect`).
fn path_words(text: &str) -> Vec<String> {
    let is_path_char = |c: char| c.is_ascii_alphanumeric() || "_-./".contains(c);
    text.replace('`', " ")
        .split(|c: char| !is_path_char(c))
        .map(|w| w.trim_end_matches('.'))
        .filter(|w| {
            let named = w.ends_with('/')
                || EXTENSIONS.iter().any(|e| w.ends_with(e))
                || TOP.iter().any(|t| w.starts_with(t));
            named && !w.starts_with('.') && w.chars().any(|c| c.is_ascii_alphabetic())
        })
        .map(str::to_owned)
        .collect()
}

/// The paths the Layout section's tree names. A name at the start of a line is a top-level
/// entry (`src/`, `Cargo.toml`); a name two spaces in is an entry of the folder above it
/// (`wire/` in `src/`); other names on a line are in the folder of its entry, unless they
/// start from the repository's root (`docs/tuning.md`).
fn layout_paths(readme: &str) -> Vec<String> {
    let section = readme
        .split("\n## Layout\n")
        .nth(1)
        .expect("README.md has a Layout section");
    let tree = section
        .split("```text\n")
        .nth(1)
        .and_then(|s| s.split("\n```").next())
        .expect("the Layout section starts with a ```text block");
    let (mut top, mut folder) = (String::new(), String::new());
    let mut out = Vec::new();
    for line in tree.lines() {
        let indent = line.len() - line.trim_start().len();
        let first = path_words(line.split("  ").find(|s| !s.is_empty()).unwrap_or(""));
        match (indent, first.first()) {
            (0, Some(name)) => {
                top = if name.ends_with('/') {
                    name.clone()
                } else {
                    String::new()
                };
                folder = top.clone();
            }
            (2, Some(name)) if name.ends_with('/') => folder = format!("{top}{name}"),
            (2, Some(_)) => folder = top.clone(),
            _ => {}
        }
        for word in path_words(line) {
            let from_root = TOP.iter().any(|t| word.starts_with(t)) || word == top;
            out.push(if from_root {
                word
            } else if indent == 2 && folder.ends_with(&word) {
                folder.clone()
            } else {
                format!("{folder}{word}")
            });
        }
    }
    out
}

fn missing(paths: &[String], base: &Path) -> Vec<String> {
    let mut gone: Vec<String> = paths
        .iter()
        .filter(|p| !base.join(p.as_str()).exists())
        .cloned()
        .collect();
    gone.dedup();
    gone
}

#[test]
fn the_layout_tree_names_only_paths_that_exist() {
    let paths = layout_paths(&read("README.md"));
    assert!(
        paths.len() > 30,
        "the Layout tree gave only {} paths: {paths:?}",
        paths.len()
    );
    for expected in [
        "src/session/",
        "src/session/mod.rs",
        "src/rows/",
        "ffi/python/",
    ] {
        assert!(
            paths.iter().any(|p| p == expected),
            "{expected} not found in {paths:?}"
        );
    }
    let gone = missing(&paths, &root());
    assert!(
        gone.is_empty(),
        "README.md's Layout names paths that do not exist: {gone:?}"
    );
}

#[test]
fn backquoted_paths_and_links_exist() {
    for doc in ["README.md", "docs/commctl.md"] {
        let text = read(doc);
        let lines = prose(&text);
        let quoted = backquoted_paths(&lines);
        let gone = missing(&quoted, &root());
        assert!(
            gone.is_empty(),
            "{doc} names paths that do not exist: {gone:?}"
        );
        let links = link_targets(&lines);
        let base = root().join(doc).parent().unwrap().to_path_buf();
        let gone = missing(&links, &base);
        assert!(
            gone.is_empty(),
            "{doc} links to paths that do not exist: {gone:?}"
        );
    }
    assert!(backquoted_paths(&prose(&read("README.md"))).len() > 10);
}

#[test]
fn a_missing_path_is_found() {
    let readme = "x\n## Layout\n\n```text\nsrc/\n  wire/        frames\n  nothing.rs   gone\n```\n";
    let paths = layout_paths(readme);
    assert_eq!(paths, ["src/", "src/wire/", "src/nothing.rs"]);
    assert_eq!(missing(&paths, &root()), ["src/nothing.rs"]);
    let lines = ["see `src/not_here.rs` and `cargo test`, [x](docs/none.md#a)"];
    assert_eq!(backquoted_paths(&lines), ["src/not_here.rs"]);
    assert_eq!(link_targets(&lines), ["docs/none.md"]);
}
