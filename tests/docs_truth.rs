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

/// Where the product reads its process environment other than through a settings declaration,
/// and why what it reads there is no setting: (file, what the line reads, why).
const ENV_READS_NOT_SETTINGS: &[(&str, &str, &str)] = &[
    (
        "src/cli/mod.rs",
        "std::env::var(name)",
        "the env seam itself (`ProcessEnv`), which every declaration is read through",
    ),
    (
        "src/cli/settings.rs",
        "\"UPDATE_DOCS\"",
        "test builds only: rewrites a generated docs block",
    ),
    (
        "src/apply/iptables.rs",
        "\"PATH\"",
        "the process's search path, where the iptables binaries are found",
    ),
    (
        "src/kube/config.rs",
        "\"KUBECONFIG\"",
        "the Kubernetes client's own convention, not one of Istio's settings",
    ),
    (
        "src/install/upgrade.rs",
        "\"KUBECONFIG\"",
        "the same, to say why no API client could be built",
    ),
    (
        "src/install/ambient.rs",
        "FAKE_DATAPLANE_ENV",
        "test-hooks builds only",
    ),
    (
        "src/install/fsutil.rs",
        "\"ISTIO_CNI_RS_TEST_KILL_AT_STEP\"",
        "test-hooks builds only",
    ),
    (
        "src/plugin/mod.rs",
        "\"ISTIO_CNI_RS_TEST_PANIC\"",
        "test-hooks builds only",
    ),
    (
        "src/plugin/cni.rs",
        "var(\"CNI_",
        "the CNI protocol's invocation variables (the spec's, read per call as argv is)",
    ),
    (
        "src/plugin/program.rs",
        "\"ISTIO_CNI_RS_TEST_PAUSE_AFTER_NETNS_OPEN_MS\"",
        "test-hooks builds only",
    ),
];

/// Calls that read the process environment directly.
const ENV_READERS: &[&str] = &[
    "env::var(",
    "env::var_os(",
    "env::vars(",
    "env::vars_os(",
    "try_from_env(",
    "EnvFilter::from_env(",
    "from_default_env(",
];

/// A read by a literal name (`env.get("NAME")`, `get("NAME")` through a closure, `var("NAME")`,
/// `lookup.env_raw("NAME")`): the name is written there instead of taken from its declaration.
fn reads_a_literal_name(line: &str) -> bool {
    const GETTERS: [&str; 4] = ["get", "var", "var_os", "env_raw"];
    line.match_indices("(\"").any(|(at, _)| {
        let callee: String = line[..at]
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let name: String = line[at + 2..].chars().take_while(|c| *c != '"').collect();
        GETTERS.contains(&callee.as_str())
            && line[at + 2 + name.len()..].starts_with("\")")
            && name.contains('_')
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    })
}

/// A read through the env seam (`env.get(name)`) outside the settings engine in `src/cli/`, which
/// is where a declared setting is read.
fn reads_the_seam_directly(path: &str, line: &str) -> bool {
    !path.starts_with("src/cli/")
        && line
            .match_indices("env.get(")
            .any(|(at, _)| !line[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_'))
}

/// Lines of `files` ((path, text)) that read the environment past the settings declarations and
/// are not in [`ENV_READS_NOT_SETTINGS`], and the entries of that list nothing matches any more.
fn undeclared_env_reads(files: &[(String, String)]) -> (Vec<String>, Vec<&'static str>) {
    let mut found = Vec::new();
    let mut used = vec![false; ENV_READS_NOT_SETTINGS.len()];
    for (path, text) in files {
        for (no, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            let direct = ENV_READERS.iter().any(|r| line.contains(r));
            if !direct && !reads_a_literal_name(line) && !reads_the_seam_directly(path, line) {
                continue;
            }
            let allowed = ENV_READS_NOT_SETTINGS
                .iter()
                .position(|(file, what, _)| path == file && line.contains(what));
            match allowed {
                Some(i) => used[i] = true,
                None => found.push(format!("{path}:{}: {}", no + 1, line.trim())),
            }
        }
    }
    let stale = ENV_READS_NOT_SETTINGS
        .iter()
        .zip(used)
        .filter(|(_, used)| !used)
        .map(|((file, _, _), _)| *file)
        .collect();
    (found, stale)
}

/// The product's sources without their test modules (a test may set up any environment it
/// likes): files of their own left out, an inline one cut off (they come last in a file).
fn product_sources() -> Vec<(String, String)> {
    let root = Path::new(ROOT);
    let mut files = Vec::new();
    files_under(&root.join("src"), &[".rs"], &mut files);
    files
        .into_iter()
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            !name.is_some_and(|n| n == "tests.rs" || n.ends_with("_tests.rs"))
        })
        .map(|p| {
            let mut text = std::fs::read_to_string(&p).expect("read source");
            for module in ["#[cfg(test)]\nmod ", "#[cfg(test)]\npub(crate) mod "] {
                if let Some(at) = text.find(module) {
                    text.truncate(at);
                }
            }
            let rel = p.strip_prefix(root).expect("under the root");
            (rel.to_string_lossy().into_owned(), text)
        })
        .collect()
}

/// Every setting a role reads is declared once (`cli::settings::declare_settings!`, or
/// `cli::settings::shared` for one two roles read) and read through its declaration: no role
/// reads an env var by name anywhere else.
#[test]
fn no_role_reads_the_environment_past_its_settings_declarations() {
    let (found, stale) = undeclared_env_reads(&product_sources());
    assert!(
        found.is_empty(),
        "env vars read outside the settings declarations (declare the setting and read it \
         through cli::settings::Lookup, or say in ENV_READS_NOT_SETTINGS why it is no setting):\n{}",
        found.join("\n")
    );
    assert!(
        stale.is_empty(),
        "ENV_READS_NOT_SETTINGS entries matching nothing: {stale:?}"
    );
}

#[test]
fn the_env_read_check_sees_a_bypass() {
    // What `istio-iptables ambient` and the plugin's engine env did before they were declared.
    let file = |text: &str| vec![("src/iptables_cmd/ambient.rs".to_string(), text.to_string())];
    for bypass in [
        "    match env.get(\"AMBIENT_IPV6\") {",
        "        let get = |k: &str| env.get(k); get(\"DRY_RUN_FILE_PATH\")",
        "    let filter = EnvFilter::try_from_env(\"ISTIO_IPTABLES_LOG\")",
        "    let v = std::env::var(\"HOST_PROBE_SNAT_IP\");",
        "    let (source, raw) = match (value, env.get(env_name)) {",
    ] {
        let (found, _) = undeclared_env_reads(&file(bypass));
        assert_eq!(found.len(), 1, "{bypass}");
    }
    let declared = "    let get = |s: &Setting| lookup.raw(s, None).map(|raw| raw.value);";
    assert!(undeclared_env_reads(&file(declared)).0.is_empty());
    // An allowed read is allowed only in its own file.
    let moved = vec![(
        "src/agent/mod.rs".to_string(),
        "std::env::var_os(\"KUBECONFIG\")".to_string(),
    )];
    assert_eq!(undeclared_env_reads(&moved).0.len(), 1);
}

/// A setting two roles read (the node agent in install-cni, and `istio-iptables ambient`, which
/// prints what that agent programs) has one env name and one default in both declarations, and
/// the defaults the rule model and the agent's data plane start from are the declared ones.
#[test]
fn a_setting_two_roles_read_has_the_same_name_and_default_in_both() {
    use istio_cni::install::config::decl as install;
    use istio_cni::iptables_cmd::ambient_flags::decl as ambient;
    let mut shared = 0;
    for s in ambient::ALL {
        for env in s.env.iter().chain(s.also_env) {
            let i = install::ALL
                .iter()
                .find(|i| i.env == Some(env))
                .unwrap_or_else(|| {
                    panic!(
                        "{env}: istio-iptables ambient reads it, install-cni does not declare it"
                    )
                });
            assert_eq!(
                i.default, s.default,
                "{env}: the two roles' defaults differ"
            );
            shared += 1;
        }
    }
    assert_eq!(shared, 5, "the ambient command's env fallbacks");
    // Any env var two declaration lists name: one default (istio-iptables' own and install-cni's
    // agent both read NATIVE_NFTABLES and FORCE_IPTABLES_BINARY).
    use istio_cni::iptables_cmd::flags::decl as iptables;
    for s in iptables::ALL {
        let Some(env) = s.env else { continue };
        let Some(i) = install::ALL.iter().find(|i| i.env == Some(env)) else {
            continue;
        };
        match env {
            // install-cni: no default (detect); istio-iptables: empty, which its parser reads as
            // detect too.
            "FORCE_IPTABLES_BINARY" => assert_eq!((i.default, s.default), (None, Some(""))),
            _ => assert_eq!(
                i.default, s.default,
                "{env}: the two roles' defaults differ"
            ),
        }
    }
    assert_eq!(ambient::host_proc.default, install::host_proc_dir.default);
    let model = istio_cni::rules::ambient::AmbientConfig::default();
    assert_eq!(
        Some(model.probe_snat_v4.as_str()),
        install::host_probe_snat_ip.default
    );
    assert_eq!(
        Some(model.probe_snat_v6.as_str()),
        install::host_probe_snat_ipv6.default
    );
    let dataplane = istio_cni::agent::dataplane::DataplaneSettings::default();
    assert_eq!(
        Some(dataplane.host_proc.to_string_lossy().as_ref()),
        install::host_proc_dir.default
    );
}
