//! The docs and the chart say what the code does: they name no setting or build flag the code
//! does not have, they speak of no build that leaves a feature out (there is none: every feature
//! is in every build), and no setting the code implements is called "not implemented".

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Names in backticks that are other programs' settings or system constants, not ours.
const OTHERS: [(&str, &str); 5] = [
    ("AF_UNIX", "the kernel's socket family"),
    ("INPOD_UDS", "ztunnel's setting for the ZDS socket path"),
    ("MIMALLOC_PURGE_DELAY", "mimalloc's own environment option"),
    ("MIMALLOC_SHOW_STATS", "mimalloc's own environment option"),
    (
        "MI_PRIM_HAS_PROCESS_ATTACH",
        "a define of mimalloc's C build",
    ),
];

/// Phrases that describe a build leaving a feature out. `benchmarks.md` is exempt: it reports
/// measured runs of other builds (the baseline) side by side.
const NO_SUCH_BUILD: [&str; 5] = [
    "not part of this build",
    "a build without",
    "in this build:",
    "not implemented in this build",
    "agent is built",
];

fn files_under(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files_under(&p, exts, out);
        } else if exts.iter().any(|x| p.to_string_lossy().ends_with(x)) {
            out.push(p);
        }
    }
}

/// The docs and the chart, as (path, text).
fn docs() -> Vec<(PathBuf, String)> {
    let root = Path::new(ROOT);
    let mut files = vec![root.join("README.md")];
    files_under(&root.join("docs"), &[".md"], &mut files);
    files_under(&root.join("deploy"), &[".md", ".yaml", ".json"], &mut files);
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read doc");
            (p, text)
        })
        .collect()
}

/// Everything the code is made of (sources, tests, scripts, chart templates, build config).
fn code() -> String {
    let root = Path::new(ROOT);
    let mut files = Vec::new();
    for dir in ["src", "testing/src", "tests", "scripts", "tools"] {
        files_under(&root.join(dir), &[".rs", ".py", ".sh", ""], &mut files);
    }
    files_under(&root.join("deploy/charts"), &[".tpl", ".yaml"], &mut files);
    for f in [
        "Containerfile",
        "justfile",
        ".cargo/config.toml",
        "Cargo.toml",
    ] {
        files.push(root.join(f));
    }
    let this = root.join("tests/docs_truth.rs");
    files
        .iter()
        .filter(|p| **p != this && !p.starts_with(root.join("deploy/charts/istio-cni/values.yaml")))
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .collect::<Vec<_>>()
        .join("\n")
}

/// `NAME_WITH_UNDERSCORES` in backticks.
fn env_like_names(text: &str) -> Vec<&str> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.contains('_')
                && s.starts_with(|c: char| c.is_ascii_uppercase())
                && s.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .collect()
}

/// The env vars the code declares as settings (`env: "NAME"`).
fn declared(code: &str) -> Vec<String> {
    code.split("env: \"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn docs_and_chart_name_only_settings_and_flags_the_code_has() {
    let code = code();
    let mut unknown = Vec::new();
    for (path, text) in docs() {
        for name in env_like_names(&text) {
            if !code.contains(name) && !OTHERS.iter().any(|(n, _)| *n == name) {
                unknown.push(format!("{}: `{name}`", path.display()));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "named in the docs but nowhere in the code:\n{}",
        unknown.join("\n")
    );
}

#[test]
fn no_doc_speaks_of_a_build_without_a_feature() {
    let mut found = Vec::new();
    for (path, text) in docs() {
        if path.ends_with("docs/benchmarks.md") {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            for phrase in NO_SUCH_BUILD {
                if lower.contains(phrase) {
                    found.push(format!("{}:{}: {line}", path.display(), n + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// A paragraph (a Markdown block or table row, or a YAML comment block with the key after it)
/// that says "not implemented" must not name a setting the code declares.
#[test]
fn no_implemented_setting_is_called_not_implemented() {
    let declared = declared(&code());
    assert!(
        declared.iter().any(|d| d == "AMBIENT_ENABLED"),
        "{declared:?}"
    );
    let mut found = Vec::new();
    for (path, text) in docs() {
        let yaml = path.extension().is_some_and(|e| e == "yaml");
        let mut block = String::new();
        for line in text.lines().chain([""]) {
            let ends = if yaml {
                !line.trim_start().starts_with('#')
            } else {
                line.trim().is_empty() || line.starts_with('|')
            };
            block.push_str(line);
            block.push('\n');
            if !ends {
                continue;
            }
            if block.to_lowercase().contains("not implemented") {
                let named: Vec<&String> = declared
                    .iter()
                    .filter(|d| block.contains(d.as_str()))
                    .collect();
                if !named.is_empty() {
                    found.push(format!("{}: {named:?} in:\n{block}", path.display()));
                }
            }
            block.clear();
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_checks_catch_what_they_are_for() {
    // What the docs said before they were corrected.
    let stale = "refused until the ambient agent is built (`AMBIENT_AGENT_BUILT` in the test).";
    assert_eq!(env_like_names(stale), ["AMBIENT_AGENT_BUILT"]);
    assert!(!code().contains("AMBIENT_AGENT_BUILT"));
    let chart =
        "# [agent] AMBIENT_ENABLED: run the agent. Not implemented in this build: `true` exits";
    assert!(
        chart
            .to_lowercase()
            .contains("not implemented in this build")
    );
    assert!(declared(&code()).iter().any(|d| chart.contains(d.as_str())));
}

/// The build tricks table in docs/benchmarks.md (what each trick was measured to save) says what
/// the build does: a trick marked removed is gone from the build files, one marked kept is there.
#[test]
fn the_build_tricks_table_matches_the_build() {
    let read = |p: &str| std::fs::read_to_string(Path::new(ROOT).join(p)).unwrap();
    let doc = read("docs/benchmarks.md");
    let release = read("Cargo.toml");
    let release = release
        .split("[profile.release]")
        .nth(1)
        .and_then(|r| r.split("\n[").next())
        .unwrap_or_default()
        .to_string();
    // (the trick's key in the table's first column, where it would live, the text that shows it)
    let tricks: [(&str, String, &str); 5] = [
        (
            "symbol-ordering-file",
            read("scripts/static-rustflags"),
            "symbol-ordering-file",
        ),
        ("gcc-ld", read("scripts/static-rustflags"), "gcc-ld"),
        (
            "Debian's lld",
            read("scripts/static-rustflags"),
            "-fuse-ld=lld",
        ),
        (
            "MI_PRIM_HAS_PROCESS_ATTACH",
            read(".cargo/config.toml") + &read("src/role_alloc.rs"),
            "MI_PRIM_HAS_PROCESS_ATTACH",
        ),
        ("strip = false", release, "strip = false"),
    ];
    let mut rows = 0;
    for line in doc.lines().filter(|l| l.starts_with("| ")) {
        let Some((key, place, shows)) = tricks.iter().find(|(k, _, _)| {
            line.split('|')
                .nth(1)
                .is_some_and(|first| first.contains(k))
        }) else {
            continue;
        };
        rows += 1;
        let verdict = line.trim_end().trim_end_matches('|');
        let kept = verdict
            .rsplit('|')
            .next()
            .is_some_and(|v| v.trim().starts_with("kept"));
        assert_eq!(
            place.contains(shows),
            kept,
            "docs/benchmarks.md says the `{key}` trick is {}, the build says otherwise",
            if kept { "kept" } else { "removed" }
        );
    }
    assert_eq!(
        rows,
        tricks.len(),
        "one row per trick in the build tricks table"
    );
    // Private symbols of a dependency are never called, kept or not.
    assert!(!read("src/role_alloc.rs").contains("_mi_"));
}
