//! The AWS branch-ENI probe workaround end to end (`AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE`, on by
//! default): the real install-cni with the agent in a node netns laid out as aws-vpc-cni lays out
//! "security groups for pods" (the pods' host routes only in an ENI table chosen by an `iif` rule,
//! `net.ipv4.tcp_early_demux=0`). An agent started on such a node adds the probe routing rules
//! for an already-enrolled pod (learnt again at startup) and for a new ADD, and removes each pod's
//! rules when it leaves the mesh. On the real kube-apiserver (`Node::start_real`): the pods leave
//! by their deletion there, which the agent learns through its node-scoped pod watch.

#[path = "support/ambient_node.rs"]
mod ambient_node;
mod install_support;
mod support;

use std::time::Duration;

use ambient_node::{Backend, Node, PodNs, result_ip};
use serde_json::json;

fn rules(node: &Node) -> String {
    String::from_utf8_lossy(&node.ns.exec("ip", &["rule", "show"]).stdout).into_owned()
}

fn add_running(node: &Node, pod: &PodNs, name: &str) -> String {
    node.pod("amb", name, json!({}));
    let result = node
        .add(pod, "amb", name)
        .unwrap_or_else(|e| panic!("ADD {name}: {e}\n{}", node.agent.output()));
    let ip = result_ip(&result);
    node.set_running("amb", name, &ip);
    ip
}

#[test]
fn branch_eni_pods_get_probe_routing_rules_that_leave_with_them() {
    let mut node = Node::start_real(Backend::Iptables);
    node.namespace("amb", json!({"istio.io/dataplane-mode": "ambient"}));
    let one = PodNs::new("eni1");
    let ip1 = add_running(&node, &one, "one");
    // An ordinary node so far: no rule for the pod.
    assert!(!rules(&node).contains(&ip1), "{}", rules(&node));

    // The node becomes a branch-ENI node: early demux off, the pod subnet's first addresses
    // routed only through the ENI's table, chosen by aws-vpc-cni's iif rule.
    node.ns
        .exec("sysctl", &["-q", "-w", "net.ipv4.tcp_early_demux=0"]);
    node.ns.exec(
        "ip",
        &[
            "link",
            "add",
            "vlan-eni",
            "type",
            "veth",
            "peer",
            "name",
            "vlan-enip",
        ],
    );
    node.ns.exec("ip", &["link", "set", "vlan-eni", "up"]);
    node.ns.exec("ip", &["link", "set", "vlan-enip", "up"]);
    for i in 2..=40 {
        let dst = format!("10.244.0.{i}/32");
        node.ns.exec(
            "ip",
            &["route", "add", &dst, "dev", "vlan-eni", "table", "197"],
        );
    }
    node.ns.exec(
        "ip",
        &[
            "rule", "add", "iif", "vlan-eni", "lookup", "197", "pref", "10",
        ],
    );
    // The data plane reads the sysctl once, at start.
    node.restart_agent_killed();
    let forward1 = format!("512:\tfrom all to {ip1} lookup 197");
    let back = "9:\tfrom all iif vlan-eni lookup local";
    node.wait_until(Duration::from_secs(10), "rules of the enrolled pod", || {
        let r = rules(&node);
        r.contains(&forward1) && r.contains(back)
    });

    // A pod enrolled by ADD on this node gets its rules with the ADD.
    let two = PodNs::new("eni2");
    let ip2 = add_running(&node, &two, "two");
    let forward2 = format!("512:\tfrom all to {ip2} lookup 197");
    assert!(rules(&node).contains(&forward2), "{}", rules(&node));

    // The first pod leaves: its forward rule goes, the second pod's stays, and so does the
    // return rule the second pod still needs (here both share one interface).
    node.del(&one, "amb", "one").expect("DEL one");
    node.delete_pod("amb", "one");
    node.wait_until(
        Duration::from_secs(10),
        "the first pod's rule removed",
        || !rules(&node).contains(&forward1),
    );
    let left = rules(&node);
    assert!(left.contains(&forward2) && left.contains(back), "{left}");

    node.del(&two, "amb", "two").expect("DEL two");
    node.delete_pod("amb", "two");
    node.wait_until(
        Duration::from_secs(10),
        "every rule of ours removed",
        || {
            let r = rules(&node);
            !r.contains(&forward2) && !r.contains(back)
        },
    );
    // What told the agent: its watch of this node's pods on the real server.
    let node_name = node.cluster().node(ambient_node::NODE);
    let watched = node.cluster().requests().into_iter().any(|(verb, uri)| {
        verb == "watch" && uri.starts_with("/api/v1/pods?") && uri.contains(&node_name)
    });
    assert!(watched, "{:#?}", node.cluster().requests());
}
