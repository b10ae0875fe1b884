use super::*;
use serde_json::json;

/// An answer as the agent sends it (docs/troubleshooting.md).
fn answer() -> DebugPods {
    serde_json::from_value(json!({
        "version": 1,
        "host_rules": {"at_unix_ms": 1_000_000, "result": "in_place"},
        "pods": [
            {"uid": "u1", "namespace": "shop", "name": "cart-0",
             "netns": {"path": "/host/var/run/netns/cni-1", "inode": 4026532890u64},
             "ips": ["10.244.1.7", "fd00::7"],
             "last_verified": {"at_unix_ms": 995_000, "result": "repaired", "what": "nat chain ISTIO_OUTPUT"},
             "zds": {"connection": 3, "request": "add", "state": "acked", "at_unix_ms": 990_000}},
            {"uid": "u2", "namespace": "shop", "name": "cart-1", "netns": null, "ips": [],
             "last_verified": null,
             "zds": {"connection": 3, "request": "keep", "state": "nacked", "message": "port taken", "at_unix_ms": 1}}
        ],
        "not_enrolled": [
            {"uid": "u3", "namespace": "web", "name": "front", "mode": "sidecar", "ips": ["10.244.1.8"],
             "reason_code": "sidecar", "reason": "sidecar-injected (sidecar.istio.io/status; never ambient)",
             "sidecar": {"redirected": true}},
            {"uid": "u4", "namespace": "web", "name": "gw", "mode": "sidecar", "ips": [],
             "reason_code": "not_selected", "reason": "not selected",
             "sidecar": {"redirected": false, "skipped": "istio-proxy is not a sidecar (e.g. a gateway)"}},
            {"uid": "u5", "namespace": "web", "name": "plain", "mode": "none", "ips": ["10.244.1.9"],
             "reason_code": "not_selected", "reason": "not selected by AMBIENT_ENABLEMENT_SELECTOR"}
        ]
    }))
    .unwrap()
}

fn row<'a>(text: &'a str, id: &str) -> Vec<&'a str> {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{id} ")))
        .unwrap_or_else(|| panic!("no row {id} in\n{text}"));
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

#[test]
fn every_pod_gets_a_row_with_its_columns() {
    let text = render(&answer(), 1_000_000);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "host probe rules: in_place 0s ago");
    assert!(
        lines[1].starts_with("NAMESPACE/NAME") && lines[1].ends_with("ZDS"),
        "{text}"
    );
    assert_eq!(
        row(&text, "shop/cart-0"),
        [
            "shop/cart-0",
            "ambient",
            "yes",
            "-",
            "4026532890",
            "10.244.1.7,fd00::7",
            "repaired 5s ago",
            "add acked (conn 3)"
        ]
    );
    assert_eq!(
        row(&text, "shop/cart-1"),
        [
            "shop/cart-1",
            "ambient",
            "yes",
            "-",
            "not found",
            "-",
            "-",
            "keep nacked (conn 3)"
        ]
    );
    assert_eq!(
        row(&text, "web/front"),
        [
            "web/front",
            "sidecar",
            "no",
            "sidecar: redirected by the plugin at ADD",
            "-",
            "10.244.1.8",
            "-",
            "-"
        ]
    );
    assert_eq!(
        row(&text, "web/gw")[3],
        "sidecar not redirected: istio-proxy is not a sidecar (e.g. a gateway)"
    );
    assert_eq!(
        row(&text, "web/plain")[1..4],
        ["none", "no", "not selected by AMBIENT_ENABLEMENT_SELECTOR"]
    );
    // The texts that do not fit a cell come after the table.
    assert!(
        text.contains("shop/cart-0: last verification repaired: nat chain ISTIO_OUTPUT\n"),
        "{text}"
    );
    assert!(
        text.contains("shop/cart-1: ztunnel rejected it: port taken\n"),
        "{text}"
    );
}

#[test]
fn columns_line_up() {
    let text = render(&answer(), 1_000_000);
    let table: Vec<&str> = text.lines().skip(1).take(6).collect();
    let start = |l: &str, n: usize| l.char_indices().filter(|(_, c)| *c != ' ').count() > n;
    let zds_at = table[0].find("ZDS").unwrap();
    for l in &table[1..] {
        assert!(start(l, 0));
        let cell = &l[zds_at..];
        assert!(
            !cell.starts_with(' '),
            "ZDS column misaligned in {l:?}\n{text}"
        );
    }
}

#[test]
fn an_empty_node_and_a_failed_host_check_say_so() {
    let d: DebugPods = serde_json::from_value(json!({
        "version": 1,
        "host_rules": {"at_unix_ms": 0, "result": "failed", "error": "ipset: not found"},
        "pods": []
    }))
    .unwrap();
    let text = render(&d, 7_200_000);
    assert_eq!(
        text,
        "host probe rules: failed 2h ago\nno pods on this node\nhost probe rules: failed: ipset: not found\n"
    );
    let d: DebugPods =
        serde_json::from_value(json!({"version": 1, "host_rules": null, "pods": []})).unwrap();
    assert!(render(&d, 0).starts_with("host probe rules: not verified yet\n"));
}

#[test]
fn json_passes_the_answer_through_and_a_bad_answer_is_named() {
    let addr: SocketAddr = "127.0.0.1:8000".parse().unwrap();
    let body = r#"{"version":1,"host_rules":null,"pods":[],"future_field":true}"#;
    let text = output(body, true, addr).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["future_field"], true);
    let e = output("not json", false, addr).unwrap_err().to_string();
    assert!(
        e.contains("127.0.0.1:8000") && e.contains("unexpected answer"),
        "{e}"
    );
}

#[test]
fn no_agent_is_a_clear_error() {
    // A port nothing listens on: bind one, learn it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let e = rt
        .block_on(fetch(addr, Duration::from_secs(2)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("the install-cni agent is not running at {addr}")),
        "{e}"
    );
}
