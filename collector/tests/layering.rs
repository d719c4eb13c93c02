//! The collector's floors: no module imports one above it, and no two files
//! import each other. Every `crate::`, `super::` and `self::` path in every file
//! the module tree reaches from lib.rs (use trees and inline paths, tests
//! included) is resolved to the file that defines its module.
//!
//! Floors, bottom to top: `duration` (a leaf anything may use), ingest, protocol,
//! gpu (libcuda calls -> steps), stitch (requests, and the GPU steps joined to them),
//! analyze, diagnose, pipeline (the one entry point that runs them), export, then
//! the live side: `probes` (the only
//! code that touches aya; it imports ingest's model and nothing above) and
//! `record` (drives probes and the decoder). Putting the live side on top keeps aya
//! out of everything `report` and `export` run.
//!
//! There is no allowlist: every violation fails.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

const FLOORS: &[&str] = &[
    "duration", "ingest", "protocol", "gpu", "stitch", "analyze", "diagnose", "pipeline", "export",
    "probes", "record",
];

#[test]
fn no_module_imports_one_above_it_and_no_two_files_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let tree = ModuleTree::read(&src);
    let edges = tree.edges();
    assert!(
        edges.len() > 100,
        "only {} imports found: the scanner is broken",
        edges.len()
    );
    let floor = |file: &str| -> usize {
        let top = file.split(['/', '.']).next().unwrap_or(file);
        FLOORS
            .iter()
            .position(|&f| f == top)
            .unwrap_or_else(|| panic!("{file}: top-level module '{top}' has no floor in FLOORS"))
    };

    // Each violation with the lines that make it.
    let mut found: BTreeMap<(&str, &str, bool), Vec<String>> = BTreeMap::new();
    let mut pairs: HashMap<(&str, &str), Vec<String>> = HashMap::new();
    for e in &edges {
        if e.from == "lib.rs" || e.to == "lib.rs" {
            continue;
        }
        let at = format!("{}:{}: {}", e.from, e.line, e.path);
        if floor(&e.to) > floor(&e.from) {
            found
                .entry((&e.from, &e.to, false))
                .or_default()
                .push(at.clone());
        }
        pairs.entry((&e.from, &e.to)).or_default().push(at);
    }
    for (&(a, b), lines) in &pairs {
        if a < b {
            if let Some(back) = pairs.get(&(b, a)) {
                let both = lines.iter().chain(back).cloned().collect();
                found.insert((a, b, true), both);
            }
        }
    }

    let failures: Vec<String> = found
        .iter()
        .map(|(&(a, b, mutual), lines)| {
            let what = if mutual {
                format!("{a} and {b} import each other")
            } else {
                format!(
                    "{a} ({}) imports {b} ({}), a floor above it",
                    floor(a),
                    floor(b)
                )
            };
            format!("{what}:\n    {}", lines.join("\n    "))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "the collector's layering (floors: {}) is broken:\n{}",
        FLOORS.join(" < "),
        failures.join("\n")
    );
}

#[test]
fn the_scanner_resolves_grouped_relative_and_inline_paths_and_skips_literals() {
    let text = r##"
        use crate::{ingest::model::Event, stitch::{self, Request}};
        use super::sibling::Thing;
        // use crate::export::Commented;
        const S: &str = "crate::export::InAString";
        const R: &str = r#"crate::diagnose::Raw"#;
        const C: char = '"';
        const Q: char = '\'';
        fn f<'a>(x: &'a str) -> usize { crate::analyze::stats(x) }
        #[cfg(test)]
        mod tests {
            use super::*;
            use super::super::up::Other;
        }
    "##;
    let mut found: Vec<(usize, Vec<String>)> = Vec::new();
    let module = ["gpu".to_string(), "steps".to_string()];
    scan(
        text,
        &module,
        &mut |line, path| found.push((line, path)),
        &mut |_, _| {},
    );
    let paths: Vec<String> = found.iter().map(|(_, p)| p.join("::")).collect();
    assert_eq!(
        paths,
        [
            "ingest::model::Event",
            "stitch",
            "stitch::Request",
            "gpu::sibling::Thing",
            "analyze::stats",
            "gpu::steps",
            "gpu::up::Other",
        ],
        "paths resolved against module gpu::steps"
    );
    assert_eq!(found[4].0, 9, "line numbers survive stripped literals");
}

struct Edge {
    from: String,
    to: String,
    line: usize,
    path: String,
}

/// Every file of the crate with its module path, found by following `mod` items.
struct ModuleTree {
    /// Module path -> file (relative to src); inline modules map to their file.
    modules: HashMap<Vec<String>, String>,
    /// File -> its text and module path.
    files: BTreeMap<String, (String, Vec<String>)>,
}

impl ModuleTree {
    fn read(src: &Path) -> ModuleTree {
        let mut tree = ModuleTree {
            modules: HashMap::new(),
            files: BTreeMap::new(),
        };
        tree.add(src, PathBuf::from("lib.rs"), Vec::new());
        tree
    }

    fn add(&mut self, src: &Path, file: PathBuf, module: Vec<String>) {
        let text = std::fs::read_to_string(src.join(&file))
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let name = file.to_string_lossy().into_owned();
        self.modules.insert(module.clone(), name.clone());
        // Children of lib.rs and mod.rs live beside them; of x.rs, in x/.
        let stem = file.file_stem().expect("a .rs file").to_string_lossy();
        let dir = file.parent().unwrap_or(Path::new("")).to_path_buf();
        let child_dir = if stem == "lib" || stem == "mod" {
            dir.clone()
        } else {
            dir.join(&*stem)
        };
        let mut children = Vec::new();
        let mut inline = Vec::new();
        scan(
            &text,
            &module,
            &mut |_, _| {},
            &mut |decl, path_attr| match decl {
                ModDecl::File(child) => children.push((child, path_attr)),
                ModDecl::Inline(path) => inline.push(path),
            },
        );
        for path in inline {
            self.modules.insert(path, name.clone());
        }
        self.files.insert(name, (text, module.clone()));
        for (child, path_attr) in children {
            let child_file = match path_attr {
                Some(p) => dir.join(p),
                None if src.join(child_dir.join(format!("{child}.rs"))).exists() => {
                    child_dir.join(format!("{child}.rs"))
                }
                None => child_dir.join(&child).join("mod.rs"),
            };
            let mut child_module = module.clone();
            child_module.push(child);
            self.add(src, child_file, child_module);
        }
    }

    /// The file defining the longest module prefix of `path`.
    fn file_of(&self, path: &[String]) -> Option<&String> {
        (0..=path.len())
            .rev()
            .find_map(|n| self.modules.get(&path[..n]))
    }

    fn edges(&self) -> Vec<Edge> {
        let mut edges = Vec::new();
        for (from, (text, module)) in &self.files {
            scan(
                text,
                module,
                &mut |line, path| {
                    let to = self.file_of(&path).unwrap_or_else(|| {
                        panic!("{from}:{line}: {} resolves to no file", path.join("::"))
                    });
                    if to != from {
                        edges.push(Edge {
                            from: from.clone(),
                            to: to.clone(),
                            line,
                            path: path.join("::"),
                        });
                    }
                },
                &mut |_, _| {},
            );
        }
        edges
    }
}

enum ModDecl {
    /// `mod name;`: a file.
    File(String),
    /// `mod name { ... }`: the module path of an inline module.
    Inline(Vec<String>),
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    /// `::`
    PathSep,
    Punct(char),
}

/// Rust source -> tokens with their line; comments, char literals and lifetimes dropped.
fn tokens(text: &str) -> Vec<(usize, Tok)> {
    let c: Vec<char> = text.chars().collect();
    let (mut i, mut line, mut out) = (0, 1, Vec::new());
    let ident_char = |ch: char| ch.is_alphanumeric() || ch == '_';
    let lines_in = |s: &[char]| s.iter().filter(|&&ch| ch == '\n').count();
    while i < c.len() {
        let start = i;
        let at = |k: usize| c.get(k).copied().unwrap_or('\0');
        match c[i] {
            '\n' => {
                line += 1;
                i += 1;
            }
            ch if ch.is_whitespace() => i += 1,
            '/' if at(i + 1) == '/' => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            '/' if at(i + 1) == '*' => {
                let mut depth = 0;
                loop {
                    if i >= c.len() {
                        break;
                    } else if c[i] == '/' && at(i + 1) == '*' {
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
                line += lines_in(&c[start..i]);
            }
            // Raw strings: r"..", r#".."#, br#".."#.
            'r' | 'b'
                if {
                    let mut k = i + usize::from(c[i] == 'b');
                    at(k) == 'r' && {
                        k += 1;
                        while at(k) == '#' {
                            k += 1;
                        }
                        at(k) == '"'
                    }
                } =>
            {
                let mut k = i + usize::from(c[i] == 'b') + 1;
                let hashes = c[k..].iter().take_while(|&&ch| ch == '#').count();
                k += hashes + 1;
                let body = k;
                while k < c.len()
                    && !(c[k] == '"'
                        && c[k + 1..]
                            .iter()
                            .take(hashes)
                            .filter(|&&h| h == '#')
                            .count()
                            == hashes)
                {
                    k += 1;
                }
                out.push((line, Tok::Str(c[body..k.min(c.len())].iter().collect())));
                i = (k + 1 + hashes).min(c.len());
                line += lines_in(&c[start..i]);
            }
            '"' | 'b' if c[i] == '"' || at(i + 1) == '"' => {
                let mut k = i + if c[i] == 'b' { 2 } else { 1 };
                let body = k;
                while k < c.len() && c[k] != '"' {
                    k += if c[k] == '\\' { 2 } else { 1 };
                }
                out.push((line, Tok::Str(c[body..k.min(c.len())].iter().collect())));
                i = (k + 1).min(c.len());
                line += lines_in(&c[start..i]);
            }
            // Char literal ('x', '\n', b'x') or lifetime ('a).
            '\'' => {
                if at(i + 1) == '\\' {
                    let mut k = i + 3;
                    while k < c.len() && c[k] != '\'' {
                        k += 1;
                    }
                    i = k + 1;
                } else if at(i + 2) == '\'' {
                    i += 3;
                } else {
                    i += 1;
                    while i < c.len() && ident_char(c[i]) {
                        i += 1;
                    }
                }
            }
            ':' if at(i + 1) == ':' => {
                out.push((line, Tok::PathSep));
                i += 2;
            }
            ch if ident_char(ch) => {
                while i < c.len() && ident_char(c[i]) {
                    i += 1;
                }
                out.push((line, Tok::Ident(c[start..i].iter().collect())));
            }
            ch => {
                out.push((line, Tok::Punct(ch)));
                i += 1;
            }
        }
    }
    out
}

/// Calls `path` with every crate-absolute path `crate::`, `super::` and `self::`
/// paths in `text` name (use-tree groups expanded), resolved against the module the
/// file is (`module`) and the inline modules around it; `decl` with every `mod`.
fn scan(
    text: &str,
    module: &[String],
    path: &mut dyn FnMut(usize, Vec<String>),
    decl: &mut dyn FnMut(ModDecl, Option<String>),
) {
    let toks = tokens(text);
    let ident = |k: usize| match toks.get(k) {
        Some((_, Tok::Ident(s))) => Some(s.as_str()),
        _ => None,
    };
    let punct = |k: usize, p: char| matches!(toks.get(k), Some((_, Tok::Punct(q))) if *q == p);
    let sep = |k: usize| matches!(toks.get(k), Some((_, Tok::PathSep)));
    // (inline module name, brace depth inside it)
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut path_attr: Option<String> = None;
    let mut k = 0;
    while k < toks.len() {
        let here: Vec<String> = module
            .iter()
            .cloned()
            .chain(inline.iter().map(|(n, _)| n.clone()))
            .collect();
        match &toks[k].1 {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                if inline.last().is_some_and(|&(_, d)| d == depth) {
                    inline.pop();
                }
                depth -= 1;
            }
            // #[path = "file.rs"] before a `mod`.
            Tok::Ident(s)
                if s == "path"
                    && punct(k + 1, '=')
                    && k >= 2
                    && punct(k - 1, '[')
                    && punct(k - 2, '#') =>
            {
                if let Some((_, Tok::Str(p))) = toks.get(k + 2) {
                    path_attr = Some(p.clone());
                }
            }
            Tok::Ident(s) if s == "mod" => {
                if let Some(name) = ident(k + 1) {
                    if punct(k + 2, ';') {
                        decl(ModDecl::File(name.to_string()), path_attr.take());
                    } else if punct(k + 2, '{') {
                        let mut p = here.clone();
                        p.push(name.to_string());
                        decl(ModDecl::Inline(p), None);
                        inline.push((name.to_string(), depth + 1));
                    }
                }
            }
            Tok::Ident(s)
                if matches!(s.as_str(), "crate" | "super" | "self")
                    && sep(k + 1)
                    && !(k > 0 && sep(k - 1)) =>
            {
                let line = toks[k].0;
                let mut base = if s == "crate" {
                    Vec::new()
                } else {
                    here.clone()
                };
                let mut j = k;
                if s == "super" {
                    base.pop();
                }
                // super::super::...
                while sep(j + 1) && ident(j + 2) == Some("super") {
                    base.pop();
                    j += 2;
                }
                let mut found = Vec::new();
                j = use_tree(&toks, j + 2, base, &mut found);
                for p in found {
                    path(line, p);
                }
                k = j;
                continue;
            }
            _ => {}
        }
        k += 1;
    }
}

/// Parses the rest of a path or use tree from `k` (after a `::`) onto `prefix`;
/// the index after it.
fn use_tree(
    toks: &[(usize, Tok)],
    mut k: usize,
    mut prefix: Vec<String>,
    found: &mut Vec<Vec<String>>,
) -> usize {
    loop {
        match toks.get(k).map(|t| &t.1) {
            Some(Tok::Ident(s)) if s == "self" => {
                found.push(prefix);
                return k + 1;
            }
            Some(Tok::Ident(s)) => {
                prefix.push(s.clone());
                if matches!(toks.get(k + 1), Some((_, Tok::PathSep))) {
                    k += 2;
                } else {
                    found.push(prefix);
                    return k + 1;
                }
            }
            Some(Tok::Punct('{')) => {
                k += 1;
                loop {
                    match toks.get(k).map(|t| &t.1) {
                        Some(Tok::Punct('}')) | None => return k + 1,
                        Some(Tok::Punct(',')) => k += 1,
                        // `as alias`
                        Some(Tok::Ident(s)) if s == "as" => k += 2,
                        _ => k = use_tree(toks, k, prefix.clone(), found),
                    }
                }
            }
            // `*` or a generic `<`: the path so far.
            _ => {
                found.push(prefix);
                return k + 1;
            }
        }
    }
}
