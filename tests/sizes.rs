//! Functions a reader can hold: no function in `src/` (outside `#[cfg(test)]` modules and test
//! files) runs over `MAX_FN_LINES` lines, counted from its `fn` line to its closing brace. The
//! scanner blanks comments, strings and char literals, then matches braces.

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const MAX_FN_LINES: usize = 120;
/// Functions still over the limit, by `file fn name`; each is split along its steps, then leaves.
const NOT_YET_SPLIT: &[&str] = &[];

/// Every `.rs` file below `dir`, test files (`tests.rs`, `*_tests.rs`) left out.
fn source_files(dir: &Path) -> Vec<PathBuf> {
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
fn blank_non_code(text: &str) -> Vec<u8> {
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
fn matching_brace(code: &[u8], open: usize) -> usize {
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

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// `(name, first line, line count)` of every function with a body, `#[cfg(test)]` modules skipped.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let code = blank_non_code(text);
    let line_of = |at: usize| code[..at].iter().filter(|&&b| b == b'\n').count() + 1;
    let mut found = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        if rest.starts_with(b"#[cfg(test)]") {
            let after = i + b"#[cfg(test)]".len();
            let next = code[after..]
                .iter()
                .position(|b| !b.is_ascii_whitespace())
                .map_or(code.len(), |p| after + p);
            let item = &code[next..];
            let is_mod = item.starts_with(b"mod ") || item.starts_with(b"pub mod ");
            let open = item.iter().position(|&b| b == b'{' || b == b';');
            if let (true, Some(o)) = (is_mod, open)
                && item[o] == b'{'
            {
                i = matching_brace(&code, next + o);
                continue;
            }
            i = after;
            continue;
        }
        let starts_fn = rest.starts_with(b"fn ")
            && (i == 0 || !is_ident(code[i - 1]))
            && rest.get(3).is_some_and(|&b| is_ident(b));
        if !starts_fn {
            i += 1;
            continue;
        }
        let name_end = rest[3..]
            .iter()
            .position(|&b| !is_ident(b))
            .map_or(rest.len(), |p| p + 3);
        let name = String::from_utf8_lossy(&rest[3..name_end]).into_owned();
        // The body opens at the first `{` outside parentheses and brackets; a `;` first means a
        // declaration without a body.
        let mut depth = 0i64;
        let mut body = None;
        for (k, &b) in code.iter().enumerate().skip(i + name_end) {
            match b {
                b'(' | b'[' => depth += 1,
                b')' | b']' => depth -= 1,
                b';' if depth == 0 => break,
                b'{' if depth == 0 => {
                    body = Some(k);
                    break;
                }
                _ => {}
            }
        }
        match body {
            Some(open) => {
                let end = matching_brace(&code, open);
                let first = line_of(i);
                found.push((name, first, line_of(end.saturating_sub(1)) - first + 1));
                // Nested functions are measured too: carry on inside the body.
                i = open + 1;
            }
            None => i += name_end,
        }
    }
    found
}

/// `path:line fn name (n lines)` for each function in `src/` over the limit.
fn long_functions() -> Vec<String> {
    let src = Path::new(ROOT).join("src");
    let mut long = Vec::new();
    for path in source_files(&src) {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        for (name, line, len) in functions(&text) {
            let rel = path.strip_prefix(ROOT).unwrap_or(&path).display();
            if len > MAX_FN_LINES && !NOT_YET_SPLIT.contains(&format!("{rel} fn {name}").as_str()) {
                long.push(format!("{rel}:{line} fn {name} ({len} lines)"));
            }
        }
    }
    long
}

#[test]
fn no_function_in_src_runs_over_the_limit() {
    let long = long_functions();
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines (split them along their steps):\n{}",
        long.join("\n")
    );
}

#[test]
fn the_size_check_measures_bodies_and_skips_tests() {
    let text = r##"
/// `fn fake() {` in a doc comment is no function.
fn short(x: [u8; 2]) -> u8 {
    let s = "fn not_a_fn() { {";
    let r = r#"}"#;
    let c = '{';
    x[0]
}

trait T {
    fn declared(&self);
}

fn outer<'a>(v: &'a str) -> &'a str {
    fn inner() {}
    inner();
    v
}

#[cfg(test)]
mod tests {
    fn hidden() {}
}
"##;
    let found = functions(text);
    let names: Vec<(&str, usize)> = found.iter().map(|(n, _, len)| (n.as_str(), *len)).collect();
    assert_eq!(names, [("short", 6), ("outer", 5), ("inner", 1)]);
}
