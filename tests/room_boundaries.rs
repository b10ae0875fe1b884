//! The rooms' "may call" table is a contract: `src/lib.rs` states it, `docs/architecture.md`
//! repeats it, and this test reads the table from both and fails when they disagree or when a
//! room's source names a room it may not call (`crate::<room>`). The rule engine must also stay
//! pure: no processes, files, sockets, threads, environment or kernel interfaces in `rules`. Inside
//! a room, files import downward only: no two files import each other, directly or round a loop.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Table = BTreeMap<String, BTreeSet<String>>;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Backticked names in a table cell (`` `cli`, `rules` (message type only) `` → cli, rules).
fn backticked(cell: &str) -> BTreeSet<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(|s| s.trim_matches(|c| c == '[' || c == ']').to_string())
        .collect()
}

/// Rows `| room | owns | may call |` of the first table whose header has a "may call" column.
fn parse_table(text: &str, line_prefix: &str) -> Table {
    let mut table = Table::new();
    let mut in_table = false;
    for line in text.lines() {
        let Some(row) = line.trim_start().strip_prefix(line_prefix) else {
            if in_table {
                break;
            }
            continue;
        };
        let row = row.trim();
        if !row.starts_with('|') {
            if in_table {
                break;
            }
            continue;
        }
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        if cells.last() == Some(&"may call") {
            in_table = true;
            continue;
        }
        if !in_table || cells.iter().all(|c| c.chars().all(|ch| ch == '-')) {
            continue;
        }
        let room = backticked(cells[0]);
        let room = room
            .iter()
            .next()
            .unwrap_or_else(|| panic!("no room in {row}"));
        table.insert(room.clone(), backticked(cells[cells.len() - 1]));
    }
    assert!(!table.is_empty(), "no 'may call' table found");
    table
}

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every `.rs` file of a room: `src/<room>.rs` and everything below `src/<room>/`.
fn room_files(room: &str) -> Vec<PathBuf> {
    let src = Path::new(ROOT).join("src");
    let mut files = Vec::new();
    let single = src.join(format!("{room}.rs"));
    if single.exists() {
        files.push(single);
    }
    let mut dirs = vec![src.join(room)];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("read_dir entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Source lines without `//` comments (doc links may name other rooms).
fn code_lines(path: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(path).expect("read source");
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            let code = match line.find("//") {
                // Keep `//` inside a string literal such as "http://unix/log".
                Some(at) if !line[..at].contains('"') => &line[..at],
                _ => line,
            };
            (i + 1, code.to_string())
        })
        .filter(|(_, code)| !code.trim().is_empty())
        .collect()
}

/// The rooms a line names as `crate::<room>`.
fn rooms_named(code: &str) -> Vec<String> {
    code.match_indices("crate::")
        .map(|(at, m)| {
            code[at + m.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

#[test]
fn lib_rs_and_architecture_md_state_the_same_table() {
    let lib = parse_table(&read("src/lib.rs"), "//!");
    let docs = parse_table(&read("docs/architecture.md"), "");
    assert_eq!(
        lib, docs,
        "src/lib.rs and docs/architecture.md disagree on who may call whom"
    );
    for (room, allowed) in &lib {
        assert!(
            !room_files(room).is_empty(),
            "the table names a room `{room}` that has no source"
        );
        for callee in allowed {
            assert!(
                lib.contains_key(callee),
                "`{room}` may call `{callee}`, which is not a room"
            );
        }
    }
}

#[test]
fn rooms_call_only_what_the_table_allows() {
    let table = parse_table(&read("src/lib.rs"), "//!");
    let mut violations = Vec::new();
    for (room, allowed) in &table {
        for file in room_files(room) {
            for (line_no, code) in code_lines(&file) {
                for named in rooms_named(&code) {
                    if named != *room && table.contains_key(&named) && !allowed.contains(&named) {
                        violations.push(format!(
                            "{}:{line_no}: `{room}` names `crate::{named}`, not in its 'may call' list",
                            file.strip_prefix(ROOT).unwrap_or(&file).display()
                        ));
                    }
                }
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_rule_engine_has_no_effects() {
    // Value types such as std::net::IpAddr are fine; anything that acts on the world is not.
    const EFFECTS: &[&str] = &[
        "std::process",
        "std::fs",
        "std::thread",
        "std::env",
        "std::net::Tcp",
        "std::net::Udp",
        "std::os::",
        "tokio",
        "nix::",
        "libc::",
        "netlink_sys",
        "kube::",
    ];
    let mut violations = Vec::new();
    for file in room_files("rules") {
        for (line_no, code) in code_lines(&file) {
            for effect in EFFECTS {
                if code.contains(effect) {
                    violations.push(format!(
                        "{}:{line_no}: `rules` uses {effect}",
                        file.strip_prefix(ROOT).unwrap_or(&file).display()
                    ));
                }
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_checker_sees_a_forbidden_call() {
    // The scanner itself: a line naming another room is found, a comment is not.
    assert_eq!(rooms_named("use crate::kube::Client;"), vec!["kube"]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.rs");
    std::fs::write(
        &file,
        "// crate::kube in a comment\nlet u = \"http://x\"; crate::apply::f();\n",
    )
    .unwrap();
    let named: Vec<String> = code_lines(&file)
        .iter()
        .flat_map(|(_, c)| rooms_named(c))
        .collect();
    assert_eq!(named, vec!["apply"]);
}

/// Issue 24: the test API server and the ZDS test peer live in the test-only `testing/` crate.
/// The product's src/ must not grow them back, nor its manifest a feature or dependency for them
/// (the test-hooks feature stays: its triggers are inside the roles by nature).
#[test]
fn the_product_crate_holds_no_test_server() {
    let manifest = read("Cargo.toml");
    let (normal, dev) = manifest
        .split_once("[dev-dependencies]")
        .expect("Cargo.toml has [dev-dependencies]");
    for test_only in ["rcgen", "istio-cni-testing", "testserver"] {
        assert!(
            !normal.contains(test_only),
            "Cargo.toml names {test_only} outside [dev-dependencies]: test-only code belongs in testing/"
        );
    }
    assert!(
        dev.contains("istio-cni-testing"),
        "no dev-dependency on testing/"
    );
    let mut dirs = vec![Path::new(ROOT).join("src")];
    let mut found = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("read_dir entry").path();
            let text = path.to_string_lossy().to_string();
            if text.contains("testserver")
                || text.contains("test_apiserver")
                || text.contains("zds_peer")
            {
                found.push(text.clone());
            }
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                && std::fs::read_to_string(&path).is_ok_and(|s| s.contains("istio_cni_testing"))
            {
                found.push(format!("{text} uses istio_cni_testing"));
            }
        }
    }
    assert!(found.is_empty(), "test-only code under src/: {found:?}");
}

/// A module of the crate as the circle check reads it: its code without comments and without its
/// test modules (`*_tests.rs`, `tests.rs` and inline `#[cfg(test)] mod … { }` are left out: a
/// test may import anything).
type Modules = BTreeMap<Vec<String>, String>;

/// Every module of `src/` but the crate roots, by its path in the crate (`apply::sidecar`), with
/// `#[path]` modules placed where they are declared.
fn crate_modules() -> Modules {
    let src = Path::new(ROOT).join("src");
    let mut by_file: BTreeMap<PathBuf, Vec<String>> = BTreeMap::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("read_dir entry").path();
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            if path.is_dir() {
                dirs.push(path);
            } else if name.ends_with(".rs")
                && !name.ends_with("_tests.rs")
                && !["tests.rs", "lib.rs", "main.rs"].contains(&name.as_str())
            {
                let rel = path
                    .strip_prefix(&src)
                    .expect("under src")
                    .with_extension("");
                let mut segs: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().to_string())
                    .collect();
                if segs.last().is_some_and(|s| s == "mod") {
                    segs.pop();
                }
                by_file.insert(path, segs);
            }
        }
    }
    let code: BTreeMap<PathBuf, String> = by_file
        .keys()
        .map(|f| {
            (
                f.clone(),
                rust_code(&std::fs::read_to_string(f).expect("read source")),
            )
        })
        .collect();
    // `#[path = "file.rs"] mod name;` makes file.rs the module `<declarer>::name`.
    for (file, text) in &code {
        for (at, _) in text.match_indices("#[path = \"") {
            let rest = &text[at + 10..];
            let (target, rest) = rest.split_once('"').expect("closed #[path]");
            let Some(name) = rest
                .split_once("mod ")
                .and_then(|(_, r)| r.split(';').next())
                .map(|n| n.trim().to_string())
            else {
                continue;
            };
            let target = file.parent().expect("in a folder").join(target);
            if let (Some(declarer), true) =
                (by_file.get(file).cloned(), by_file.contains_key(&target))
            {
                by_file.insert(target, [declarer, vec![name]].concat());
            }
        }
    }
    by_file
        .into_iter()
        .map(|(file, segs)| (segs, code[&file].clone()))
        .collect()
}

/// Source without comments and without inline `#[cfg(test)]` modules.
fn rust_code(text: &str) -> String {
    let mut code: String = text
        .lines()
        .map(|line| match line.find("//") {
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    while let Some(at) = code.find("#[cfg(test)]") {
        let after = &code[at..];
        let module = after.find("mod ").filter(|m| {
            after[*m..]
                .find(['{', ';'])
                .is_some_and(|e| after[*m + e..].starts_with('{'))
                && after[12..*m].trim().chars().all(|c| c != ';' && c != '{')
        });
        let Some(m) = module else {
            code.replace_range(at..at + 12, "");
            continue;
        };
        let open = at + m + after[m..].find('{').expect("a body");
        let mut depth = 0;
        let mut end = code.len();
        for (i, c) in code[open..].char_indices() {
            depth += match c {
                '{' => 1,
                '}' => -1,
                _ => 0,
            };
            if depth == 0 {
                end = open + i + 1;
                break;
            }
        }
        code.replace_range(at..end, "");
    }
    code
}

/// The paths a module's code names: each `use` tree expanded (`a::{b, c::d}` → `a::b`, `a::c::d`)
/// and each `x::y` path elsewhere. A `pub use` only hands names on (a folder's face): it is
/// followed to the module it names, but is no import of its own unless `reexports`.
fn named_paths(code: &str, reexports: bool) -> Vec<Vec<String>> {
    fn expand(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
        let tree = tree.trim();
        let Some(open) = tree.find('{') else {
            let path = tree.split(" as ").next().unwrap_or(tree);
            let mut full = prefix.to_vec();
            full.extend(
                path.split("::")
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty()),
            );
            if !full.is_empty() {
                out.push(full);
            }
            return;
        };
        let mut head = prefix.to_vec();
        head.extend(
            tree[..open]
                .split("::")
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty()),
        );
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let (mut depth, mut start) = (0, 0);
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&head, &inner[start..i], out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        if !inner[start..].trim().is_empty() {
            expand(&head, &inner[start..], out);
        }
    }
    let mut out = Vec::new();
    let mut rest = String::new();
    let mut text = code;
    while let Some(at) = text.find("use ") {
        let starts_item = text[..at]
            .chars()
            .next_back()
            .is_none_or(|c| c.is_whitespace() || c == ')' || c == ';' || c == '{');
        rest.push_str(&text[..at]);
        let end = text[at..].find(';').map_or(text.len(), |e| at + e);
        let before = text[..at].trim_end();
        let public = before.ends_with("pub")
            || before
                .rfind("pub(")
                .is_some_and(|p| before[p..].ends_with(')') && !before[p..].contains('\n'));
        if starts_item {
            if reexports || !public {
                expand(&[], &text[at + 4..end], &mut out);
            }
        } else {
            rest.push_str(&text[at..end]);
        }
        text = &text[end..];
    }
    rest.push_str(text);
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let bytes: Vec<char> = rest.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        if !ident(bytes[i]) || (i > 0 && (ident(bytes[i - 1]) || bytes[i - 1] == ':')) {
            i += 1;
            continue;
        }
        let mut path = Vec::new();
        let mut j = i;
        loop {
            let start = j;
            while j < bytes.len() && ident(bytes[j]) {
                j += 1;
            }
            path.push(bytes[start..j].iter().collect::<String>());
            if bytes.get(j) == Some(&':')
                && bytes.get(j + 1) == Some(&':')
                && bytes.get(j + 2).is_some_and(|c| ident(*c))
            {
                j += 2;
            } else {
                break;
            }
        }
        if path.len() > 1 {
            out.push(path);
        }
        i = j.max(i + 1);
    }
    out
}

/// The module a path names, from the module `from`: the deepest module on it, or, where it names
/// an item another module only re-exports (`pub use x::Item`), the module that defines it.
fn resolve(
    modules: &Modules,
    from: &[String],
    path: &[String],
    depth: usize,
) -> Option<Vec<String>> {
    let mut segs = path;
    let mut cur: Vec<String> = match path.first().map(String::as_str) {
        Some("crate") => {
            segs = &path[1..];
            Vec::new()
        }
        Some("self") => {
            segs = &path[1..];
            from.to_vec()
        }
        Some("super") => from.to_vec(),
        Some(first) if modules.contains_key(&[from, &[first.to_string()]].concat()) => {
            from.to_vec()
        }
        _ => return None,
    };
    while segs.first().is_some_and(|s| s == "super") {
        cur.pop();
        segs = &segs[1..];
    }
    for seg in segs {
        let child = [cur.clone(), vec![seg.clone()]].concat();
        if modules.contains_key(&child) {
            cur = child;
            continue;
        }
        if depth < 4 && seg != "*" && seg != "self" {
            let again = modules.get(&cur).and_then(|code| {
                named_paths(code, true)
                    .into_iter()
                    .filter(|p| p.last() == Some(seg) && p.len() > 1)
                    .find_map(|p| resolve(modules, &cur, &p, depth + 1))
            });
            if again.is_some() {
                return again;
            }
        }
        break;
    }
    modules.contains_key(&cur).then_some(cur)
}

/// Import arrows between two files of one room (`a::x` → `a::y`). A module contains the modules
/// declared in it, so a file naming its own folder's root (`super::Item` from `a/x.rs` to
/// `a/mod.rs`) draws no arrow: that is the folder's shared vocabulary, not a file beside it.
fn room_arrows(modules: &Modules) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut arrows: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, code) in modules {
        let to = arrows.entry(module.clone()).or_default();
        for path in named_paths(code, false) {
            if let Some(target) = resolve(modules, module, &path, 0)
                && !module.starts_with(&target)
                && target.first() == module.first()
            {
                to.insert(target);
            }
        }
    }
    arrows
}

/// Groups of two files or more that import each other in a loop (strongly connected components).
fn circles(arrows: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    let reaches = |from: &Vec<String>| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for next in arrows.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&Vec<String>, BTreeSet<Vec<String>>> =
        arrows.keys().map(|m| (m, reaches(m))).collect();
    let mut found: Vec<Vec<Vec<String>>> = Vec::new();
    for (m, r) in &reach {
        if !r.contains(*m) || found.iter().any(|c| c.contains(m)) {
            continue;
        }
        found.push(
            reach
                .iter()
                .filter(|(o, or)| r.contains(**o) && or.contains(*m))
                .map(|(o, _)| (*o).clone())
                .collect(),
        );
    }
    found
}

#[test]
fn no_file_of_a_room_imports_in_a_circle() {
    // Inside a room, files import downward only: a circle means two files that cannot be read,
    // changed or tested one without the other. Shared types go to a file both import.
    let modules = crate_modules();
    let arrows = room_arrows(&modules);
    let found: Vec<String> = circles(&arrows)
        .iter()
        .map(|circle| {
            let ties: Vec<String> = circle
                .iter()
                .flat_map(|a| {
                    arrows[a]
                        .iter()
                        .filter(|b| circle.contains(b))
                        .map(move |b| format!("{} -> {}", a.join("::"), b.join("::")))
                })
                .collect();
            ties.join(", ")
        })
        .collect();
    assert!(
        found.is_empty(),
        "files import each other in a circle:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_circle_check_sees_a_circle() {
    let module = |path: &str, code: &str| {
        (
            path.split("::").map(str::to_string).collect::<Vec<_>>(),
            rust_code(code),
        )
    };
    let modules: Modules = [
        module("a", "mod x; mod y; mod z; pub use x::f;"),
        module("a::x", "use super::y::{self, T};\npub fn f() {}"),
        module("a::y", "pub struct T;\nfn g() { super::x::f() }"),
        // Through the folder's re-export, to the file that defines the item.
        module(
            "a::z",
            "use super::f;\n#[cfg(test)]\nmod tests { use super::super::y::T; }",
        ),
        module("b", "// crate::a::x\nuse crate::a::y::T;"),
    ]
    .into();
    let arrows = room_arrows(&modules);
    let names = |m: &str| m.split("::").map(str::to_string).collect::<Vec<_>>();
    assert_eq!(arrows[&names("a::z")], BTreeSet::from([names("a::x")]));
    assert!(
        arrows[&names("b")].is_empty(),
        "another room is not this check's"
    );
    assert_eq!(circles(&arrows), vec![vec![names("a::x"), names("a::y")]]);
}

/// Functions other rooms may call (`pub`, `pub(crate)`) that fail with a bare `String` — an error
/// nobody can match on, whose cause is lost. Each room has its own error type instead. Empty:
/// an entry needs a reason no room's error type can carry.
const STRING_ERRORS_ALLOWED: &[&str] = &[];

/// The `fn`s in `code` visible outside their room whose return type is `Result<_, String>`.
fn string_error_fns(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    for (at, _) in code.match_indices("fn ") {
        if code[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        // The visibility before `fn`, past any qualifiers.
        let mut before = code[..at].trim_end();
        for qualifier in ["async", "const", "unsafe"] {
            before = before.strip_suffix(qualifier).unwrap_or(before).trim_end();
        }
        if !(before.ends_with(" pub")
            || before.ends_with("\npub")
            || before.ends_with("pub(crate)"))
            && before != "pub"
        {
            continue;
        }
        let sig = &code[at + 3..];
        let name: String = sig.chars().take_while(|c| is_ident(*c)).collect();
        // The signature ends at its body or `;`, outside any brackets (`->` is no bracket).
        let (mut depth, mut end, mut arrow) = (0i32, sig.len(), None);
        let chars: Vec<(usize, char)> = sig.char_indices().collect();
        for (k, &(i, c)) in chars.iter().enumerate() {
            match c {
                '(' | '[' | '<' => depth += 1,
                ')' | ']' => depth -= 1,
                '>' if k > 0 && chars[k - 1].1 == '-' => {
                    arrow = arrow.or((depth == 0).then_some(i + 1));
                }
                '>' => depth -= 1,
                '{' | ';' if depth == 0 => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        let Some(arrow) = arrow else { continue };
        let ret: String = sig[arrow..end]
            .split_whitespace()
            .take_while(|t| *t != "where")
            .collect();
        let Some(args) = ret
            .rfind("Result<")
            .filter(|r| *r == 0 || ret[..*r].ends_with("::"))
            .map(|r| &ret[r + 7..ret.len() - 1])
        else {
            continue;
        };
        // The last argument at the top level is the error.
        let (mut depth, mut last) = (0, 0);
        for (i, c) in args.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' => depth -= 1,
                ',' if depth == 0 => last = i + 1,
                _ => {}
            }
        }
        if &args[last..] == "String" {
            found.push(name);
        }
    }
    found
}

#[test]
fn no_function_other_rooms_call_fails_with_a_bare_string() {
    let mut found = Vec::new();
    for (module, code) in crate_modules() {
        for name in string_error_fns(&code) {
            let path = format!("{}::{name}", module.join("::"));
            if !STRING_ERRORS_ALLOWED.contains(&path.as_str()) {
                found.push(path);
            }
        }
    }
    assert!(
        found.is_empty(),
        "Result<_, String> on a function other rooms may call (give it its room's error type, \
         with the cause as its source):\n{}",
        found.join("\n")
    );
    // The allowlist only shrinks: an entry whose function is typed (or gone) is removed.
    let modules = crate_modules();
    for allowed in STRING_ERRORS_ALLOWED {
        let (module, name) = allowed.rsplit_once("::").expect("module::fn");
        let key: Vec<String> = module.split("::").map(str::to_string).collect();
        assert!(
            modules
                .get(&key)
                .is_some_and(|code| string_error_fns(code).iter().any(|f| f == name)),
            "{allowed} no longer fails with a String: remove it from STRING_ERRORS_ALLOWED"
        );
    }
}

#[test]
fn the_string_error_check_sees_one() {
    let code = rust_code(
        "pub fn a() -> Result<(), String> {}\n\
         pub(crate) async fn b(x: Vec<u8>)\n    -> std::result::Result<HashMap<String, u8>, String>\nwhere T: X {}\n\
         pub(super) fn c() -> Result<(), String> {}\n\
         fn d() -> Result<(), String> {}\n\
         pub fn e() -> Result<String, Error> {}\n\
         pub fn f(g: impl Fn() -> u8) -> Result<u8, String>;\n\
         #[cfg(test)]\nmod tests { pub fn t() -> Result<(), String> {} }",
    );
    assert_eq!(string_error_fns(&code), vec!["a", "b", "f"]);
}

/// The rule room and the netlink transport may not import each other, so the few nf_tables
/// numbers both write stand in both rooms' `nf_kernel`; they must stay the kernel's one number.
#[test]
fn the_nf_tables_numbers_both_rooms_declare_agree() {
    use istio_cni::netlink::nf_kernel as transport;
    use istio_cni::rules::nf_kernel as rules;
    for (name, ours, theirs) in [
        (
            "NFT_MSG_DELTABLE",
            rules::NFT_MSG_DELTABLE,
            transport::NFT_MSG_DELTABLE,
        ),
        (
            "NFT_MSG_DELCHAIN",
            rules::NFT_MSG_DELCHAIN,
            transport::NFT_MSG_DELCHAIN,
        ),
        (
            "NFT_MSG_GETSETELEM",
            rules::NFT_MSG_GETSETELEM,
            transport::NFT_MSG_GETSETELEM,
        ),
        (
            "NFTA_TABLE_NAME",
            rules::NFTA_TABLE_NAME,
            transport::NFTA_TABLE_NAME,
        ),
        (
            "NFTA_CHAIN_TABLE",
            rules::NFTA_CHAIN_TABLE,
            transport::NFTA_CHAIN_TABLE,
        ),
        (
            "NFTA_CHAIN_NAME",
            rules::NFTA_CHAIN_NAME,
            transport::NFTA_CHAIN_NAME,
        ),
        (
            "NFTA_RULE_TABLE",
            rules::NFTA_RULE_TABLE,
            transport::NFTA_RULE_TABLE,
        ),
    ] {
        assert_eq!(ours, theirs, "{name}: rules and netlink disagree");
    }
}
