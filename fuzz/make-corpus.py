#!/usr/bin/env python3
"""Writes the seed corpora in fuzz/corpus/<target>/: small valid (and a few near-valid) inputs
taken from the repo's testdata and test fixtures, so every target starts at real shapes. Re-run
after changing it; the output is committed (a few KB per target)."""
import json, os, shutil, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TD = os.path.join(ROOT, "tests", "testdata")


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    elif not isinstance(data, bytes):
        data = json.dumps(data, separators=(",", ":")).encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def testdata(rel):
    with open(os.path.join(TD, rel), "rb") as f:
        return f.read()


shutil.rmtree(os.path.join(HERE, "corpus"), ignore_errors=True)

# --- cni_netconf: the configs of tests/cni_driver, with prevResults of each layout.
prev_new = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/x"}],
            "ips": [{"address": "10.0.0.2/24", "gateway": "10.0.0.1", "interface": 0},
                    {"address": "fd00::2/64"}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1"}], "dns": {"nameservers": ["10.96.0.10"]}}
prev_040 = dict(prev_new, cniVersion="0.4.0")
prev_030 = {"cniVersion": "0.3.1", "ips": [{"version": "4", "address": "10.0.0.2/24", "interface": 0}],
            "interfaces": [{"name": "eth0"}]}
prev_020 = {"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/24", "gateway": "10.0.0.1"},
            "ip6": {"ip": "fd00::2/64"}, "dns": {}}
base = {"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "istio-cni",
        "cni_agent_run_dir": "/var/run/istio-cni", "exclude_namespaces": ["kube-system"],
        "pod_namespace": "istio-system", "plugin_log_level": "debug", "ambient_enabled": True,
        "enablement_selectors": [
            {"podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}},
            {"podSelector": {"matchExpressions": [{"key": "istio.io/dataplane-mode", "operator": "NotIn", "values": ["none"]}]},
             "namespaceSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}}],
        "add_timeout_seconds": 5}
for i, (v, prev) in enumerate([("1.0.0", prev_new), ("0.4.0", prev_040), ("0.3.1", prev_030),
                                ("0.2.0", prev_020), ("1.1.0", None)]):
    conf = dict(base, cniVersion=v)
    if prev:
        conf["prevResult"] = prev
    put("cni_netconf", f"conf-{i}.json", conf)
put("cni_netconf", "legacy-keys.json", {
    "cniVersion": "0.3.1", "name": "istio-plugin-sample-test", "type": "sample",
    "capabilities": {"testCapability": False}, "ipam": {"type": "testIPAM"},
    "kubernetes": {"kubeconfig": "k", "exclude_namespaces": ["a"]},
    "prevResult": {"cniversion": "0.3.1", "ips": [{"version": "4", "address": "10.0.0.2/24"}]}})

# --- cni_args: what kubelet/containerd/cri-o set.
for i, a in enumerate([
    "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc123;K8S_POD_UID=0d4a9c2e-1",
    "K8S_POD_NAMESPACE=istio-system;K8S_POD_NAME=ztunnel-x",
    "IgnoreUnknown=true;FOO=bar",
    "",
]):
    put("cni_args", f"args-{i}", a)

# --- sidecar_annotations: pods as tests/cni_driver builds them, and annotation lines.
def pod(ann, env=(), sec=None):
    ann = dict({"sidecar.istio.io/status": "true"}, **ann)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "annotations": ann},
            "spec": {"containers": [{"name": "app"},
                                    {"name": "istio-proxy", "args": ["proxy", "sidecar"],
                                     "env": [{"name": k, "value": v} for k, v in env],
                                     "securityContext": sec or {"runAsUser": 1337, "runAsGroup": 1337}}]}}
put("sidecar_annotations", "pod-default.json", pod({}))
put("sidecar_annotations", "pod-tproxy.json", pod({
    "sidecar.istio.io/interceptionMode": "TPROXY",
    "traffic.sidecar.istio.io/includeOutboundIPRanges": "10.0.0.0/8,fd00::/8",
    "traffic.sidecar.istio.io/excludeInboundPorts": "15020, 9090"}, env=[("ISTIO_META_DNS_CAPTURE", "true")]))
put("sidecar_annotations", "pod-kubevirt.json", pod({
    "traffic.sidecar.istio.io/kubevirtInterfaces": "net1",
    "istio.io/reroute-virtual-interfaces": "net2"}, env=[("ISTIO_DUAL_STACK", "true")], sec={"runAsUser": 0}))
put("sidecar_annotations", "lines-1", "\n".join([
    "sidecar.istio.io/interceptionMode=REDIRECT",
    "traffic.sidecar.istio.io/includeOutboundIPRanges=*",
    "traffic.sidecar.istio.io/excludeOutboundIPRanges=169.254.169.254/32",
    "traffic.sidecar.istio.io/includeInboundPorts=80,443",
    "traffic.sidecar.istio.io/excludeOutboundPorts=5432",
    "traffic.sidecar.istio.io/includeOutboundPorts=8080",
    "traffic.sidecar.istio.io/excludeInterfaces=eth1",
    "env:ISTIO_META_DNS_CAPTURE=true",
    "env:INVALID_DROP=true"]))
put("sidecar_annotations", "lines-none", "sidecar.istio.io/interceptionMode=NONE\n")
put("sidecar_annotations", "lines-inject-false", "sidecar.istio.io/inject=false\n")

# --- conflist: the install testdata; first byte picks the name (0 .conflist, 1 .conf, 2 .json).
for f, pick in [("list.conflist", 0), ("list-with-istio.conflist", 0), ("list-no-istio.conflist", 0),
                ("bridge.conf", 1), ("istio-cni.conf", 1), ("invalid-arr.conflist", 0),
                ("invalid-map.conflist", 0), ("list.conflist", 2)]:
    put("conflist", f"{pick}-{f}", bytes([pick]) + testdata("install/" + f))

# --- kubeconfig: what install-cni writes (testdata) and the test fixtures' plain-HTTP one.
for f in ["kubeconfig-tls", "kubeconfig-skip-tls", "kubeconfig-newhost"]:
    put("kubeconfig", f, testdata("install/" + f))
put("kubeconfig", "plain-http", "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: http://127.0.0.1:6443\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n    namespace: ns\ncurrent-context: test\nusers:\n- name: test\n  user:\n    token: test-token\n")

# --- cmdadd_body: what the plugin sends (Go's field names, base64 masks).
put("cmdadd_body", "v4", {"Netns": "/var/run/netns/cni-1", "PodName": "web-0", "PodNamespace": "default",
                          "IPs": [{"Interface": 0, "Address": {"IP": "10.244.1.5", "Mask": "////AA=="}, "Gateway": "10.244.1.1"}]})
put("cmdadd_body", "dual", {"Netns": "/proc/1/ns/net", "PodName": "a", "PodNamespace": "b",
                            "IPs": [{"Address": {"IP": "fd00::5", "Mask": "/////////////////////w=="}, "Gateway": ""},
                                    {"Address": {"IP": "::ffff:10.0.0.1", "Mask": "////AA=="}}]})
put("cmdadd_body", "null-ips", {"Netns": "", "PodName": "a", "PodNamespace": "b", "IPs": None})

# --- log_records: batches the plugin POSTs to /log.
put("log_records", "batch", [json.dumps({"level": "info", "time": "2026-12-01T17:00:00.000000Z", "msg": "pod added", "scope": "cni", "pod": "default/web-0"}),
                             json.dumps({"level": "warn", "time": "x", "msg": "line\nbreak \u001b[31mred\u009b", "extra": {"a": [1, 2.5]}}),
                             json.dumps({"level": "debug", "msg": "d"}), "not json"])
put("log_records", "empty", "[]")

# --- zds_frames: hello, ack, nack, a truncated nack (bytes as docs/zds.md lists them).
put("zds_frames", "hello", bytes([0x08, 0x01]))
put("zds_frames", "ack", bytes([0x0a, 0x00]))
msg = b"failed to add workload: netns gone"
put("zds_frames", "nack", bytes([0x0a, len(msg) + 2, 0x0a, len(msg)]) + msg)
put("zds_frames", "nack-cut", bytes([0x0a, 0xc8, 0x01, 0x0a, 0xc5, 0x01]) + msg)

# --- iptables_argv: the golden cases' command lines (tests/testdata/istio/cases.json) and env.
with open(os.path.join(TD, "istio", "cases.json")) as f:
    cases = json.load(f)
seen = set()
n = 0
for c in cases:
    words = list(c.get("cli") or []) + [f"@{k}={v}" for k, v in sorted((c.get("env") or {}).items())]
    key = "\0".join(words)
    if not words or key in seen:
        continue
    seen.add(key)
    put("iptables_argv", f"case-{n}", key)
    n += 1
    if n >= 24:
        break
put("iptables_argv", "injector", "\0".join(["-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020", "--log_output_level=default:info"]))
put("iptables_argv", "ambient", "\0".join(["ambient", "--dry-run", "--host", "--nftables"]))

# --- pod_facts: request and answer lines.
put("pod_facts", "request", '{"namespace":"default","name":"web-0","uid":"0d4a","namespaceLabels":true}\n')
put("pod_facts", "answer-pod", json.dumps({"answer": "pod", "pod": pod({}), "namespaceLabels": {"a": "b"}}) + "\n")
put("pod_facts", "answer-notyet", '{"answer":"notYet","reason":"store not live"}\n')
