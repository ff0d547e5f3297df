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
//!
//! Files stay small enough to hold in one's head (issue 49): no source file outside tests is over
//! 800 lines (`no_source_file_outside_tests_is_over_800_lines`), and the files of one folder
//! under `server/src` refer to each other without a circle
//! (`no_import_circle_among_the_files_of_a_folder`, which says what counts as a reference).
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
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

/// The workspace's root, above `server/`.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

/// The longest a source file may grow (issue 49: a file a person can hold in their head).
const MAX_LINES: usize = 800;

/// Files over [`MAX_LINES`] for now, each while its split is under way: the test fails once
/// one of them is back under the limit (or gone), so that the split removes its entry here.
const OVER_THE_LIMIT_FOR_NOW: [&str; 0] = [];

/// Whether `rel` (a path under the workspace) is a test file: `tests.rs`, `*_tests.rs`, or any
/// file under a `tests/` folder of a source tree. Tests are split by subject, not held to a size.
fn is_test_file(rel: &Path) -> bool {
    let name = rel.file_name().unwrap().to_string_lossy();
    name == "tests.rs"
        || name.ends_with("_tests.rs")
        || rel.parent().is_some_and(|dir| dir.components().skip(2).any(|c| c.as_os_str() == "tests"))
}

/// No source file of `server/src`, `client/src` or `tests/src` outside tests is longer than
/// [`MAX_LINES`] lines, but those of [`OVER_THE_LIMIT_FOR_NOW`]. A file that grows past it is
/// split into modules with one job each, named for that job.
#[test]
fn no_source_file_outside_tests_is_over_800_lines() {
    let root = workspace();
    let mut problems = String::new();
    let mut scanned = 0;
    for tree in ["server/src", "client/src", "tests/src"] {
        let mut files = Vec::new();
        rust_files(&root.join(tree), &mut files);
        for path in files {
            let rel = path.strip_prefix(&root).unwrap();
            let shown = rel.display().to_string();
            if is_test_file(rel) {
                continue;
            }
            scanned += 1;
            let lines = std::fs::read_to_string(&path).unwrap().lines().count();
            let allowed = OVER_THE_LIMIT_FOR_NOW.contains(&shown.as_str());
            if lines > MAX_LINES && !allowed {
                writeln!(problems, "{shown}: {lines} lines, over {MAX_LINES}: split it into modules with one job each")
                    .unwrap();
            } else if lines <= MAX_LINES && allowed {
                writeln!(problems, "{shown}: {lines} lines now: remove it from OVER_THE_LIMIT_FOR_NOW").unwrap();
            }
        }
    }
    for allowed in OVER_THE_LIMIT_FOR_NOW {
        if !root.join(allowed).exists() {
            writeln!(problems, "{allowed} is gone: remove it from OVER_THE_LIMIT_FOR_NOW").unwrap();
        }
    }
    assert!(scanned > 60, "only {scanned} files scanned");
    assert!(problems.is_empty(), "{problems}");
}

#[test]
fn test_files_are_told_apart_by_name_or_folder() {
    assert!(is_test_file(Path::new("server/src/store/tests.rs")));
    assert!(is_test_file(Path::new("server/src/store/driver_tests.rs")));
    assert!(is_test_file(Path::new("server/src/grpc/tests/auth.rs")));
    assert!(!is_test_file(Path::new("server/src/grpc/auth.rs")));
    assert!(!is_test_file(Path::new("server/src/grpc/contests.rs")));
    assert!(!is_test_file(Path::new("tests/src/bin/outbox-bench/main.rs")));
}

/// A path as written (`super::a::{b, c::D}` gives `super::a::b` and `super::a::c::D`), with the
/// position (in chars) where it is written.
type WrittenPath = (usize, Vec<String>);

/// The paths of `code` (comments and strings blanked) that start at `crate::`, `$crate::`,
/// `self::` or `super::`, each group expanded into its paths.
fn rooted_paths(code: &str) -> Vec<WrittenPath> {
    let chars: Vec<char> = code.chars().collect();
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = (i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == ':'))
            && ["crate", "self", "super"].iter().any(|root| {
                let n = root.len();
                chars[i..].starts_with(&root.chars().collect::<Vec<_>>())
                    && chars.get(i + n).is_none_or(|c| !is_ident(*c))
                    && chars[skip_ws(&chars, i + n)..].starts_with(&[':', ':'])
            });
        if !starts {
            i += 1;
            continue;
        }
        let mut paths = Vec::new();
        i = path_tree(&chars, i, &[], &mut paths);
        out.extend(paths.into_iter().map(|p| (p.0, p.1)));
    }
    out
}

fn skip_ws(chars: &[char], mut k: usize) -> usize {
    while k < chars.len() && chars[k].is_whitespace() {
        k += 1;
    }
    k
}

/// Reads the path (or tree of paths, `a::{b, c::{d}}`) at `k` below `prefix` into `out`, each
/// with its position and its `as` name if any; returns where it ends.
#[allow(clippy::type_complexity)]
fn path_tree(
    chars: &[char],
    mut k: usize,
    prefix: &[String],
    out: &mut Vec<(usize, Vec<String>, Option<String>)>,
) -> usize {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let start = k;
    let mut segments = prefix.to_vec();
    loop {
        k = skip_ws(chars, k);
        if chars.get(k) == Some(&'{') {
            k += 1;
            loop {
                k = skip_ws(chars, k);
                match chars.get(k) {
                    None => return k,
                    Some('}') => return k + 1,
                    Some(',') => k += 1,
                    Some(_) => {
                        let end = path_tree(chars, k, &segments, out);
                        k = if end == k { k + 1 } else { end };
                    }
                }
            }
        }
        let mut end = k;
        while end < chars.len() && is_ident(chars[end]) {
            end += 1;
        }
        if end == k {
            // `*`, or the end of a path that ends in `::`.
            if segments.len() > prefix.len() {
                out.push((start, segments, None));
            }
            return k;
        }
        segments.push(chars[k..end].iter().collect());
        k = skip_ws(chars, end);
        if chars[k..].starts_with(&[':', ':']) {
            k += 2;
            continue;
        }
        // `name as alias`
        let mut alias = None;
        if chars[k..].starts_with(&['a', 's']) && chars.get(k + 2).is_some_and(|c| c.is_whitespace()) {
            let a = skip_ws(chars, k + 2);
            let mut e = a;
            while e < chars.len() && is_ident(chars[e]) {
                e += 1;
            }
            alias = Some(chars[a..e].iter().collect());
            k = e;
        }
        out.push((start, segments, alias));
        return k;
    }
}

/// The module path of a file under `server/src`: `grpc/auth/layer.rs` is `grpc::auth::layer`,
/// `grpc/mod.rs` is `grpc`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut out: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    let last = out.pop().unwrap();
    if last != "mod.rs" {
        out.push(last.strip_suffix(".rs").unwrap_or(&last).to_owned());
    }
    out
}

/// The inline modules of `code` (`mod tests { … }`): each with its name and the span of its body.
fn inline_modules(code: &str) -> Vec<(String, std::ops::Range<usize>)> {
    let chars: Vec<char> = code.chars().collect();
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for i in 0..chars.len() {
        if !(chars[i..].starts_with(&['m', 'o', 'd']) && (i == 0 || !is_ident(chars[i - 1])))
            || !chars.get(i + 3).is_some_and(|c| c.is_whitespace())
        {
            continue;
        }
        let a = skip_ws(&chars, i + 3);
        let mut e = a;
        while e < chars.len() && is_ident(chars[e]) {
            e += 1;
        }
        let open = skip_ws(&chars, e);
        if e == a || chars.get(open) != Some(&'{') {
            continue;
        }
        let mut depth = 0;
        let mut k = open;
        while k < chars.len() {
            match chars[k] {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            k += 1;
        }
        out.push((chars[a..e].iter().collect(), open..k));
    }
    out
}

/// The module a written path names, from the crate's root: `crate::` starts at the root,
/// `self::` at `here`, each `super::` one module above. `None` for a path above the crate.
fn resolve(here: &[String], written: &[String]) -> Option<Vec<String>> {
    let mut segments = written.iter();
    let mut at = match segments.next()?.as_str() {
        "crate" => Vec::new(),
        "self" => here.to_vec(),
        "super" => here.get(..here.len().checked_sub(1)?)?.to_vec(),
        _ => return None,
    };
    let mut leading = true;
    for s in segments {
        match s.as_str() {
            "super" if leading => {
                at.pop()?;
            }
            "self" => {}
            _ => {
                leading = false;
                at.push(s.clone());
            }
        }
    }
    Some(at)
}

/// Where one file of a folder refers to a sibling: its path and line, and what it wrote.
type Reference = (String, usize, String);

/// The import circles among the files of each folder under `server/src`.
///
/// The nodes of a folder's graph are its modules: each `x.rs` and each subfolder `x/` (with all
/// the files beneath it, which are part of `x`). Its `mod.rs` is the folder's own module, their
/// parent, and no node: it declares the modules and re-exports their items, and the modules
/// may use what it defines. A module refers to a sibling `y` when one of its files writes a
/// path to it, in a `use` or in code, tests included: `super::y::…` (`super::super::y` from an
/// inline `mod tests`), `crate::folder::y::…`, or an item that the folder's `mod.rs` imports
/// from `y` and the module reaches through it (`super::Item` where `mod.rs` has
/// `pub use y::Item`). Glob imports of the parent (`use super::*`) are not followed, and the
/// top level is the layer map's (see `no_module_uses_one_listed_after_it_in_the_layout_map`).
///
/// A circle means neither module can be read, tested or moved without the other: what both
/// need belongs in the lower one or in a module of its own.
fn folder_circles(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let rel = |p: &PathBuf| p.strip_prefix(src).unwrap().to_owned();
    let mut folders: Vec<PathBuf> = files.iter().filter_map(|f| rel(f).parent().map(Path::to_owned)).collect();
    folders.sort();
    folders.dedup();
    let mut found = Vec::new();
    for folder in folders.iter().filter(|f| !f.as_os_str().is_empty()) {
        let parent_of_folder = module_path(&folder.join("mod.rs"));
        let depth = parent_of_folder.len();
        let parent_file =
            [src.join(folder).join("mod.rs"), src.join(folder).with_extension("rs")].into_iter().find(|p| p.exists());
        // The folder's modules.
        let mut children = BTreeSet::new();
        for f in &files {
            let r = rel(f);
            if r.starts_with(folder) && Some(f) != parent_file.as_ref() {
                children.insert(module_path(&r)[depth].clone());
            }
        }
        // The items the parent imports from its modules: `name` → module.
        let mut imported = HashMap::new();
        if let Some(parent) = &parent_file {
            let code: Vec<char> = code_only(&std::fs::read_to_string(parent).unwrap()).chars().collect();
            let text: String = code.iter().collect();
            for (at, _) in text.match_indices("use ") {
                let before = text[..at].chars().last();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let start = text[..at + 4].chars().count();
                let mut paths = Vec::new();
                path_tree(&code, start, &[], &mut paths);
                for (_, segments, alias) in paths {
                    let segments: Vec<&String> = segments.iter().filter(|s| *s != "self").collect();
                    if segments.len() >= 2 && children.contains(segments[0].as_str()) {
                        let name = alias.unwrap_or_else(|| segments.last().unwrap().to_string());
                        imported.insert(name, segments[0].clone());
                    }
                }
            }
        }
        // Who refers to whom, with the first place each does.
        let mut edges: BTreeMap<(String, String), Reference> = BTreeMap::new();
        for f in &files {
            let r = rel(f);
            if !r.starts_with(folder) || Some(f) == parent_file.as_ref() {
                continue;
            }
            let own = module_path(&r);
            let from = own[depth].clone();
            let code = code_only(&std::fs::read_to_string(f).unwrap());
            let chars: Vec<char> = code.chars().collect();
            let inline = inline_modules(&code);
            for (pos, written) in rooted_paths(&code) {
                let mut here = own.clone();
                here.extend(inline.iter().filter(|(_, span)| span.contains(&pos)).map(|(n, _)| n.clone()));
                let Some(target) = resolve(&here, &written) else { continue };
                if target.len() <= depth || target[..depth] != parent_of_folder[..] {
                    continue;
                }
                let head = &target[depth];
                let to = if children.contains(head) {
                    head.clone()
                } else if let Some(m) = imported.get(head) {
                    m.clone()
                } else {
                    continue;
                };
                if to != from {
                    let line = 1 + chars[..pos].iter().filter(|c| **c == '\n').count();
                    edges.entry((from.clone(), to)).or_insert_with(|| {
                        let shown: Vec<&str> = written.iter().map(String::as_str).filter(|s| *s != "self").collect();
                        (format!("server/src/{}", r.display()), line, shown.join("::"))
                    });
                }
            }
        }
        // The circles: the strongly connected components of more than one module.
        let names: Vec<&String> = children.iter().collect();
        let reaches = |a: &String, b: &String| {
            let mut seen = BTreeSet::from([a.clone()]);
            let mut todo = vec![a.clone()];
            while let Some(n) = todo.pop() {
                for (x, y) in edges.keys() {
                    if *x == n && seen.insert(y.clone()) {
                        todo.push(y.clone());
                    }
                }
            }
            seen.contains(b)
        };
        let mut done = BTreeSet::new();
        for a in &names {
            if done.contains(*a) {
                continue;
            }
            let circle: Vec<&String> =
                names.iter().copied().filter(|b| b != a && reaches(a, b) && reaches(b, a)).collect();
            if circle.is_empty() {
                continue;
            }
            let members: BTreeSet<&String> = circle.iter().copied().chain([*a]).collect();
            let mut text = format!(
                "server/src/{}: {} refer to each other:",
                folder.display(),
                members.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(", ")
            );
            for ((x, y), (file, line, written)) in &edges {
                if members.contains(x) && members.contains(y) {
                    write!(text, "\n  {x} → {y}: {file}:{line} `{written}`").unwrap();
                }
            }
            done.extend(members.into_iter().cloned());
            found.push(text);
        }
    }
    found
}

#[test]
fn no_import_circle_among_the_files_of_a_folder() {
    let circles = folder_circles(&src());
    assert!(circles.is_empty(), "import circles inside folders of server/src:\n{}", circles.join("\n"));
}

#[test]
fn paths_are_read_with_their_groups_and_resolved_from_the_module_that_writes_them() {
    let code = code_only(
        "use super::{a::X, b::{self, c::Y as Z}};\nuse crate::grpc::auth;\nfn f() { self::g(); x::super_y(); }\n\
         mod tests {\n    use super::super::d::W;\n}\n",
    );
    let paths: Vec<String> = rooted_paths(&code).into_iter().map(|(_, p)| p.join("::")).collect();
    assert_eq!(
        paths,
        ["super::a::X", "super::b::self", "super::b::c::Y", "crate::grpc::auth", "self::g", "super::super::d::W"]
    );
    let inline = inline_modules(&code);
    assert_eq!(inline.len(), 1);
    assert_eq!(inline[0].0, "tests");
    let here: Vec<String> = ["grpc", "stream"].map(String::from).to_vec();
    let path = |p: &str| p.split("::").map(String::from).collect::<Vec<_>>();
    assert_eq!(resolve(&here, &path("super::convert::f")), Some(path("grpc::convert::f")));
    assert_eq!(resolve(&here, &path("crate::grpc::convert")), Some(path("grpc::convert")));
    let in_tests: Vec<String> = ["grpc", "stream", "tests"].map(String::from).to_vec();
    assert_eq!(resolve(&in_tests, &path("super::super::convert")), Some(path("grpc::convert")));
    assert_eq!(resolve(&in_tests, &path("super::f")), Some(path("grpc::stream::f")));
    assert_eq!(resolve(&here, &path("super::super::super::x")), None);
}

#[test]
fn a_circle_is_found_through_the_parents_imports_and_from_inline_test_modules() {
    let root = std::env::temp_dir().join(format!("outboxd-architecture-{}", std::process::id()));
    let files = [
        ("f/mod.rs", "mod a;\nmod b;\nmod c;\nmod d;\npub use a::{Alpha, Beta as B};\n"),
        // b reaches a through the item the parent imports from it.
        ("f/a.rs", "pub struct Alpha;\npub struct Beta;\nfn g() { super::b::f(); }\n"),
        ("f/b.rs", "pub fn f() -> super::B { todo!() }\n"),
        ("f/c.rs", "#[cfg(test)]\nmod tests {\n    use super::super::d::D;\n}\n"),
        ("f/d.rs", "use crate::f::c;\n// super::a::Alpha in a comment is no reference\n"),
        ("g/mod.rs", "mod x;\nmod y;\n"),
        ("g/x.rs", "use super::y::Y;\n"),
        ("g/y/mod.rs", "mod z;\n"),
        ("g/y/z.rs", "use crate::g::x;\n"),
    ];
    for (path, text) in files {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let circles = folder_circles(&root);
    std::fs::remove_dir_all(&root).unwrap();
    assert_eq!(circles.len(), 3, "{circles:#?}");
    assert!(circles[0].starts_with("server/src/f: a, b refer to each other"), "{}", circles[0]);
    assert!(circles[0].contains("b → a: server/src/f/b.rs:1 `super::B`"), "{}", circles[0]);
    assert!(circles[1].starts_with("server/src/f: c, d refer to each other"), "{}", circles[1]);
    assert!(circles[2].starts_with("server/src/g: x, y refer to each other"), "{}", circles[2]);
}
