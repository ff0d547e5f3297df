//! The layers of `server/src` hold (ADR 0058): a module uses only the modules listed before it
//! in the layout map of `lib.rs` (its `//! # Layout` list, lowest first), the one place the
//! order is written.
//!
//! Every `.rs` file under `server/src` belongs to the top-level module whose file or directory
//! holds it. Each is scanned for paths that start with `crate::` (or `$crate::` in a macro):
//! `use crate::x::…;`, `use crate::{x, y::…};` and paths in code (`crate::x::f()`, types,
//! trait impls), over several lines too. A path that names a module listed after the file's own
//! fails the test, with the file, the line and the edge. Nothing is exempt: `#[cfg(test)]`
//! modules and the `testing` module obey the order like the rest. Comments and string literals
//! are skipped (a doc link to a higher module documents, it does not depend), and paths through
//! `super::` are not followed (none leaves its top-level module). `main.rs` is the binary, above
//! every module (it sees the library as `outbox_server::`), and `lib.rs` only declares modules.
//!
//! The test also fails when the map and the modules disagree: a module missing from the map or
//! listed twice, an entry that is no module, a file or directory under `server/src` that is no
//! module of the map.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The module names of `lib.rs`'s `//! # Layout` list, in order: each line `//! - [`name`]: …`
/// or `//! - `name`: …` (unlinked, for a module that rustdoc may not see).
fn layers(lib: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_layout = false;
    for line in lib.lines() {
        let Some(doc) = line.strip_prefix("//!") else {
            if in_layout {
                break;
            }
            continue;
        };
        if doc.trim().starts_with('#') {
            in_layout = doc.trim() == "# Layout";
            continue;
        }
        if !in_layout {
            continue;
        }
        // An item of the list itself, not of a list nested in an item's text.
        let Some(entry) = doc.strip_prefix(" - ") else { continue };
        let entry = entry.strip_prefix('[').unwrap_or(entry);
        let Some(entry) = entry.strip_prefix('`') else { continue };
        if let Some((name, _)) = entry.split_once('`') {
            out.push(name.to_owned());
        }
    }
    out
}

/// The modules `lib.rs` declares (`mod x;`, `pub mod x;`, whatever their `cfg`).
fn declared(lib: &str) -> Vec<String> {
    lib.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("pub(crate) ").or_else(|| l.strip_prefix("pub ")).unwrap_or(l);
            let name = l.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.trim().to_owned())
        })
        .collect()
}

/// `text` with comments and the contents of string and character literals blanked out (line
/// breaks kept, so that positions keep their line numbers).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        // A line comment, doc comments included.
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                blank(&mut out, chars[i]);
                i += 1;
            }
            continue;
        }
        // A block comment; they nest.
        if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
            continue;
        }
        let ident_before = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        // A raw string: r"…", r#"…"#, br"…", cr#"…"# (not the end of an identifier like `bar`).
        if !ident_before {
            let mut j = i;
            if matches!(chars[j], 'b' | 'c') && chars.get(j + 1) == Some(&'r') {
                j += 1;
            }
            if chars[j] == 'r' {
                let mut k = j + 1;
                while chars.get(k) == Some(&'#') {
                    k += 1;
                }
                if chars.get(k) == Some(&'"') {
                    let hashes = k - j - 1;
                    for &c in &chars[i..=k] {
                        out.push(c);
                    }
                    i = k + 1;
                    while i < chars.len() {
                        if chars[i] == '"' && (0..hashes).all(|h| chars.get(i + 1 + h) == Some(&'#')) {
                            out.push('"');
                            out.extend(std::iter::repeat_n('#', hashes));
                            i += 1 + hashes;
                            break;
                        }
                        blank(&mut out, chars[i]);
                        i += 1;
                    }
                    continue;
                }
            }
        }
        // A string ("…", b"…", c"…": the prefix is passed as code).
        if c == '"' {
            out.push('"');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
                if i < chars.len() {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
            out.push('"');
            i += 1;
            continue;
        }
        // A character literal ('a', '\n', '\''), not a lifetime ('a, 'static).
        if c == '\'' {
            let literal_end = match next {
                Some('\\') => (i + 3..chars.len()).find(|&k| chars[k] == '\''),
                Some(_) if chars.get(i + 2) == Some(&'\'') => Some(i + 2),
                _ => None,
            };
            if let Some(end) = literal_end {
                out.push('\'');
                for &c in &chars[i + 1..end] {
                    blank(&mut out, c);
                }
                out.push('\'');
                i = end + 1;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

/// Each module that a `crate::` path of `code` names first, with its line (1-based): the `x` of
/// `crate::x::…`, and each top-level name of a group `crate::{x, y::{…}}`.
fn crate_paths(code: &str) -> Vec<(usize, String)> {
    let chars: Vec<char> = code.chars().collect();
    let line_at = |pos: usize| 1 + chars[..pos].iter().filter(|c| **c == '\n').count();
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let skip_ws = |mut k: usize| {
        while k < chars.len() && chars[k].is_whitespace() {
            k += 1;
        }
        k
    };
    let ident_at = |k: usize| -> (String, usize) {
        let mut end = k;
        while end < chars.len() && is_ident(chars[end]) {
            end += 1;
        }
        (chars[k..end].iter().collect(), end)
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts_path = chars[i..].starts_with(&['c', 'r', 'a', 't', 'e'])
            && (i == 0 || !is_ident(chars[i - 1]))
            && chars.get(i + 5).is_some_and(|c| !is_ident(*c));
        if !starts_path {
            i += 1;
            continue;
        }
        let k = skip_ws(i + 5);
        if !chars[k..].starts_with(&[':', ':']) {
            i += 5;
            continue;
        }
        let k = skip_ws(k + 2);
        if chars.get(k) == Some(&'{') {
            // A group: the first name of each item at its top level.
            let (mut depth, mut k, mut item_start) = (1, k + 1, true);
            while k < chars.len() && depth > 0 {
                match chars[k] {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => item_start = true,
                    c if item_start && depth == 1 && is_ident(c) => {
                        let (name, end) = ident_at(k);
                        out.push((line_at(k), name));
                        item_start = false;
                        k = end;
                        continue;
                    }
                    c if !c.is_whitespace() => item_start = false,
                    _ => {}
                }
                k += 1;
            }
            i = k;
        } else {
            let (name, end) = ident_at(k);
            if !name.is_empty() {
                out.push((line_at(k), name));
            }
            i = end.max(k + 1);
        }
    }
    out.retain(|(_, name)| name != "self");
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> =
        std::fs::read_dir(dir).expect("server/src is readable").map(|e| e.unwrap().path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_module_uses_one_listed_after_it_in_the_layout_map() {
    let src = src();
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs is readable");
    let order = layers(&lib);
    let mut problems = String::new();

    // The map and the modules agree.
    let declared = declared(&lib);
    let mut seen = BTreeSet::new();
    for name in &order {
        if !seen.insert(name) {
            writeln!(problems, "lib.rs: `{name}` is listed twice in the layout map").unwrap();
        }
        if !declared.contains(name) {
            writeln!(problems, "lib.rs: the layout map lists `{name}`, which lib.rs does not declare").unwrap();
        }
    }
    for name in &declared {
        if !order.contains(name) {
            writeln!(problems, "lib.rs: module `{name}` is missing from the layout map (`//! # Layout`)").unwrap();
        }
    }
    let rank: HashMap<&str, usize> = order.iter().enumerate().map(|(i, m)| (m.as_str(), i)).collect();

    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut scanned = 0;
    for path in &files {
        let rel = path.strip_prefix(&src).unwrap();
        let shown = format!("server/src/{}", rel.display());
        let first = rel.components().next().unwrap().as_os_str().to_string_lossy();
        let module = first.strip_suffix(".rs").unwrap_or(&first);
        if module == "lib" || module == "main" {
            continue;
        }
        let Some(&own) = rank.get(module) else {
            writeln!(problems, "{shown}: `{module}` is not a module of the layout map").unwrap();
            continue;
        };
        scanned += 1;
        let text = std::fs::read_to_string(path).unwrap();
        for (line, used) in crate_paths(&code_only(&text)) {
            match rank.get(used.as_str()) {
                Some(&theirs) if theirs > own => writeln!(
                    problems,
                    "{shown}:{line}: `{module}` uses `crate::{used}`, which the layout map lists after it \
                     ({module} is layer {}, {used} layer {})",
                    own + 1,
                    theirs + 1
                )
                .unwrap(),
                Some(_) => {}
                None => {
                    writeln!(problems, "{shown}:{line}: `crate::{used}` is not a module of the layout map").unwrap()
                }
            }
        }
    }
    assert!(scanned > 50, "only {scanned} files scanned under {}", src.display());
    assert!(
        problems.is_empty(),
        "the layers of server/src do not hold (order, lowest first: {}):\n{problems}",
        order.join(", ")
    );
}

/// Only the store knows which database it runs on (issue 30 found `app.rs` choosing the relay's
/// batch by the backend's name): code outside `store` and `testing`, test files aside
/// (`*tests.rs`, which check each backend's own figures), never compares `backend()` with a
/// name, in code (comments and strings aside). A backend's own needs are
/// what it says of itself (`Store::relay_defaults`).
#[test]
fn only_the_store_branches_on_which_backend_it_is() {
    let src = src();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut problems = String::new();
    for path in &files {
        let rel = path.strip_prefix(&src).unwrap();
        let first = rel.components().next().unwrap().as_os_str().to_string_lossy().to_string();
        let file = rel.file_name().unwrap().to_string_lossy();
        if first == "store" || first == "testing" || first == "testing.rs" || file.ends_with("tests.rs") {
            continue;
        }
        let code = code_only(&std::fs::read_to_string(path).unwrap());
        for (i, line) in code.lines().enumerate() {
            let compact: String = line.split_whitespace().collect();
            if compact.contains("backend()==") || compact.contains("backend()!=") || compact.contains(".backend(){") {
                writeln!(problems, "server/src/{}:{}: branches on the backend's name", rel.display(), i + 1).unwrap();
            }
        }
    }
    assert!(problems.is_empty(), "{problems}");
}

#[test]
fn the_scanner_finds_paths_in_uses_groups_and_code_but_not_in_comments_or_strings() {
    let text = r####"
use crate::a::X;
use crate::{b, c::{D, E}, self};
use crate::{
    f,
    g::H,
};
/// See [`crate::not_in_doc`]. // crate::nor_this
fn x<'a>(s: &'a str) -> crate::i::T {
    let _ = "crate::not_in_string \" crate::nor_here";
    let _ = r#"crate::not_in_raw "string""#;
    let _ = ('"', '\'', 'x', b'"', '\u{1F600}', "\\");
    /* crate::not /* nested crate::no */ crate::no */
    pub(crate) fn y() {}
    crate :: j::f();
    $crate::k::m!();
    notcrate::l::z();
}
"####;
    let found: Vec<(usize, String)> = crate_paths(&code_only(text));
    let names: Vec<(usize, &str)> = found.iter().map(|(l, n)| (*l, n.as_str())).collect();
    assert_eq!(names, [(2, "a"), (3, "b"), (3, "c"), (5, "f"), (6, "g"), (9, "i"), (15, "j"), (16, "k")]);
}

#[test]
fn the_map_is_read_in_order_from_the_layout_section_only() {
    let lib = "//! Intro.\n//!\n//! - [`not_a_layer`]: before the section.\n//! # Layout\n//!\n//! Prose.\n//!\n\
               //! - [`low`]: the lowest.\n//!   continued, - [`not_an_entry`].\n//!   - [`nested`]: not one either.\n//! - `unlinked`: also a layer.\n\
               //! - [`high`]: the highest.\n//!\n//! # Later\n//! - [`not_either`]\n#![forbid(unsafe_code)]\n\
               pub mod high;\nmod low;\n#[cfg(test)]\npub(crate) mod unlinked;\n";
    assert_eq!(layers(lib), ["low", "unlinked", "high"]);
    assert_eq!(declared(lib), ["high", "low", "unlinked"]);
}
