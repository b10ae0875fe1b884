//! Reading `src/` as code for the source checks (tests/sizes.rs, tests/pub_uses.rs): comments
//! and literals blanked, braces matched, test-only code told apart. A textual scan, not a parser:
//! enough for this crate's formatting (rustfmt), checked by the tests that use it.
#![allow(dead_code)] // each check uses a different part

use std::path::{Path, PathBuf};

/// Every `.rs` file below `dir`, test files (`tests.rs`, `*_tests.rs`) left out.
pub fn source_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("read_dir entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() {
                dirs.push(path);
            } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The text with comments, string literals and char literals replaced by spaces; newlines kept,
/// so byte offsets and line numbers still match the file.
pub fn blank_non_code(text: &str) -> Vec<u8> {
    let src = text.as_bytes();
    let mut out = src.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for b in &mut out[from..to] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
    };
    let mut i = 0;
    while i < src.len() {
        let rest = &src[i..];
        if rest.starts_with(b"//") {
            let end = rest
                .iter()
                .position(|&b| b == b'\n')
                .map_or(src.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut j) = (0usize, i);
            while j < src.len() {
                if src[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if src[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if let Some(end) = raw_string_end(src, i) {
            blank(&mut out, i, end);
            i = end;
        } else if src[i] == b'"' {
            let mut j = i + 1;
            while j < src.len() && src[j] != b'"' {
                j += if src[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if src[i] == b'\'' {
            // A char literal closes within a few bytes; a lifetime does not.
            let close = match rest.get(1) {
                Some(b'\\') => rest.iter().skip(2).position(|&b| b == b'\'').map(|p| p + 2),
                _ => {
                    let ch_len = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                    (rest.get(1 + ch_len) == Some(&b'\'')).then_some(1 + ch_len)
                }
            };
            match close {
                Some(c) if c <= 12 => {
                    blank(&mut out, i, i + c + 1);
                    i += c + 1;
                }
                _ => i += 1,
            }
        } else {
            i += 1;
        }
    }
    out
}

/// End (exclusive) of a raw string `r"…"`, `r#"…"#`, `br"…"` starting at `i`.
fn raw_string_end(src: &[u8], i: usize) -> Option<usize> {
    if i > 0 && (src[i - 1].is_ascii_alphanumeric() || src[i - 1] == b'_') {
        return None;
    }
    let mut j = i;
    if src.get(j) == Some(&b'b') {
        j += 1;
    }
    if src.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let hashes = src[j..].iter().take_while(|&&b| b == b'#').count();
    j += hashes;
    if src.get(j) != Some(&b'"') {
        return None;
    }
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    let at = src[j + 1..].windows(close.len()).position(|w| w == close)?;
    Some(j + 1 + at + close.len())
}

/// Index just past the brace that closes the one at `open`.
pub fn matching_brace(code: &[u8], open: usize) -> usize {
    let mut depth = 0i64;
    for (k, &b) in code.iter().enumerate().skip(open) {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return k + 1;
                }
            }
            _ => {}
        }
    }
    code.len()
}

pub fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Attributes that keep an item out of the shipped build.
const TEST_ONLY_ATTRS: &[&str] = &[
    "#[cfg(test)]",
    "#[cfg(feature = \"test-hooks\")]",
    "#[cfg(any(test, feature = \"test-hooks\"))]",
];

/// A file's code with its test-only items blanked too, and the names of the file modules it
/// declares test-only (`#[cfg(test)] mod name;`). `text` is the file, `code` its
/// [`blank_non_code`] (the attributes are matched in `text`, whose strings `code` has lost).
pub fn without_test_only(text: &str, code: &[u8]) -> (Vec<u8>, Vec<String>) {
    let mut live = code.to_vec();
    let mut test_mods = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let attr = TEST_ONLY_ATTRS
            .iter()
            .find(|a| code[i..].starts_with(b"#[cfg(") && text[i..].starts_with(**a));
        let Some(attr) = attr else {
            i += 1;
            continue;
        };
        // The item ends at the first `;` or block outside brackets and parentheses (further
        // attributes, e.g. `#[path = ...]`, are bracketed and passed over).
        let mut depth = 0i64;
        let mut end = code.len();
        for (k, &b) in code.iter().enumerate().skip(i + attr.len()) {
            match b {
                b'(' | b'[' => depth += 1,
                b')' | b']' => depth -= 1,
                b';' if depth == 0 => {
                    end = k + 1;
                    break;
                }
                b'{' if depth == 0 => {
                    end = matching_brace(code, k);
                    break;
                }
                _ => {}
            }
        }
        let item = String::from_utf8_lossy(&code[i + attr.len()..end]);
        let words: Vec<&str> = item
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .filter(|w| !w.is_empty())
            .collect();
        if item.trim_end().ends_with(';')
            && let Some(at) = words.iter().position(|w| *w == "mod")
            && let Some(name) = words.get(at + 1)
        {
            test_mods.push(name.to_string());
        }
        for b in &mut live[i..end] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
        i = end;
    }
    (live, test_mods)
}

/// The shipped code of every file in `src/`: test files, test-only items and the files of
/// test-only modules left out. `(path, text, live code)` per file.
pub fn shipped_sources(src: &Path) -> Vec<(PathBuf, String, Vec<u8>)> {
    let mut files = Vec::new();
    let mut test_only_files = Vec::new();
    for path in source_files(src) {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        let code = blank_non_code(&text);
        let (live, test_mods) = without_test_only(&text, &code);
        // `a/b.rs` declares its modules in `a/b/`, `a/mod.rs` and `lib.rs` in `a/`.
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let dir = path.parent().unwrap_or(src);
        let base = if stem == "mod" || stem == "lib" || stem == "main" {
            dir.to_path_buf()
        } else {
            dir.join(stem)
        };
        for name in test_mods {
            test_only_files.push(base.join(format!("{name}.rs")));
            test_only_files.push(base.join(&name));
        }
        files.push((path, text, live));
    }
    files.retain(|(path, _, _)| !test_only_files.iter().any(|t| path.starts_with(t)));
    files
}
