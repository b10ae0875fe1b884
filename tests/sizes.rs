//! Functions a reader can hold: no function in `src/` (outside `#[cfg(test)]` modules and test
//! files) runs over `MAX_FN_LINES` lines, counted from its `fn` line to its closing brace. The
//! scanner blanks comments, strings and char literals, then matches braces.

use std::path::Path;

#[path = "support/code_scan.rs"]
mod code_scan;
use code_scan::{blank_non_code, is_ident, matching_brace, source_files};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const MAX_FN_LINES: usize = 120;
/// Functions still over the limit, by `file fn name`; each is split along its steps, then leaves.
const NOT_YET_SPLIT: &[&str] = &[];

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
