//! The rooms' "may call" table is a contract: `src/lib.rs` states it, `docs/architecture.md`
//! repeats it, and this test reads the table from both and fails when they disagree or when a
//! room's source names a room it may not call (`crate::<room>`). The rule engine must also stay
//! pure: no processes, files, sockets, threads, environment or kernel interfaces in `rules`.

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
