//! What every generated-input differential suite shares: loading its allowlist (each entry says
//! what differs, why, and cites a docs line that must exist) and shrinking a failing case before
//! it is shown. What a case is, how it gets smaller and what counts as still failing stay with
//! each suite.

use std::path::Path;

use serde_json::Value;

/// The entries of the allowlist `tests/differential/<file>`, each checked to have an id, a
/// behaviour and a why, and to cite a docs line its docs file contains: (id, the entry).
pub fn allowlist(file: &str) -> Vec<(String, Value)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = format!("tests/differential/{file}");
    let text = std::fs::read_to_string(root.join(&path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    let list: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    let list = list
        .as_array()
        .unwrap_or_else(|| panic!("{path} is not a list"));
    let mut entries = Vec::with_capacity(list.len());
    for e in list {
        let id = e["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{path}: an entry without an id"))
            .to_string();
        for key in ["behaviour", "why"] {
            let s = e[key].as_str().unwrap_or_default();
            assert!(!s.trim().is_empty(), "{file} entry {id}: no {key}");
        }
        let docs = e["docs"]["file"].as_str();
        let docs = docs.unwrap_or_else(|| panic!("{file} entry {id}: no docs.file"));
        let line = e["docs"]["line"].as_str();
        let line = line.unwrap_or_else(|| panic!("{file} entry {id}: no docs.line"));
        let doc = std::fs::read_to_string(root.join(docs))
            .unwrap_or_else(|err| panic!("{file} entry {id}: docs file {docs}: {err}"));
        assert!(
            !line.trim().is_empty() && doc.contains(line),
            "{file} entry {id}: {docs} does not contain the cited line {line:?}"
        );
        entries.push((id, e.clone()));
    }
    entries
}

/// The smallest case found that still fails, and what it showed. `failing` shows what `case`
/// did; `smaller` lists a case's smaller variants, plainest first; `fails` re-runs one and says
/// what it showed when it still fails the same way. Each variant is tried in turn; one that
/// still fails is taken and its own variants are tried from the same place on, wrapping around,
/// until a whole round takes none or `budget` re-runs are spent.
pub fn shrink<C, F>(
    mut case: C,
    mut failing: F,
    budget: usize,
    smaller: impl Fn(&C) -> Vec<C>,
    mut fails: impl FnMut(&C) -> Option<F>,
) -> (C, F) {
    let (mut at, mut idle) = (0, 0);
    for _ in 0..budget {
        let mut variants = smaller(&case);
        if idle >= variants.len() {
            break;
        }
        at %= variants.len();
        match fails(&variants[at]) {
            Some(f) => {
                (case, failing, idle) = (variants.swap_remove(at), f, 0);
            }
            None => (at, idle) = (at + 1, idle + 1),
        }
    }
    (case, failing)
}
