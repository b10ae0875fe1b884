//! Statements the docs once made that the code contradicts: each test fails if the wrong one comes
//! back (and checks the right one is said instead).

fn doc(name: &str) -> String {
    let path = format!("{}/docs/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Collapses line breaks so a statement is found however the paragraph is wrapped.
fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn troubleshooting_md_uses_no_tool_the_image_lacks() {
    let text = doc("troubleshooting.md");
    for line in text.lines().filter(|l| l.contains("kubectl exec")) {
        for missing in ["curl", "wget", " sh ", "bash"] {
            assert!(
                !line.contains(missing),
                "the image has no {missing}: {line}"
            );
        }
    }
    assert!(text.contains("install-cni status --json"));
}

#[test]
fn istio_iptables_md_does_not_say_every_role_skips_empty_items() {
    let text = flat(&doc("istio-iptables.md"));
    assert!(
        !text.contains("skipped (`80,,443,` is `80,443`), as in every role"),
        "the plugin refuses empty items (plugin.md)"
    );
    assert!(text.contains("annotation validator refuses an empty item"));
    // plugin.md still says what the plugin does.
    assert!(
        flat(&doc("plugin.md")).contains("An empty item (`80,,90`, a trailing comma) is refused")
    );
}

#[test]
fn zds_md_says_a_file_at_the_socket_path_is_kept() {
    let text = flat(&doc("zds.md"));
    assert!(
        !text.contains("a file left at the path (a previous agent's socket) is removed first"),
        "only a socket or a dangling symlink is replaced"
    );
    assert!(text.contains("stops start-up with an error naming the path, and is kept as it is"));
}

#[test]
fn plugin_md_tells_an_agent_s_answer_from_not_reaching_it() {
    let text = flat(&doc("plugin.md"));
    assert!(!text.contains(
        "any other status or a transport error fails ADD with \"istio-cni cmdAdd failed to contact"
    ));
    assert!(text.contains("the node Istio CNI agent answered status N"));
}
