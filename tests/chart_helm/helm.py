"""Renders and lints the chart with real Helm (the helm-python-sdk wheel embeds Helm's Go SDK as a
shared library; no cluster, no helm binary). Driven by tests/chart_helm.rs: reads a JSON request on
stdin, writes a JSON answer on stdout; all checking is done on the Rust side.

Request:  {"chart": dir, "release": name, "namespace": ns,
           "cases": [{"name": str, "values": {...}, "lint": bool}]}
Answer:   {"helm": Helm SDK version, "sdk": wheel version,
           "cases": [{"name", "error": str|null, "objects": [{"template", "object"}],
                      "sha256": {template: hex sha256 of its rendered text},
                      "lint": {"messages": [...], "errors": [...]}|null}]}
"""

import hashlib
import json
import re
import sys

import helm_python as helm

# Helm's own manifest splitter (releaseutil.SplitManifests) splits on this.
SEPARATOR = re.compile(r"(?:^|\s*\n)---\s*")


def objects(manifests):
    out = []
    for template, text in sorted(manifests.items()):
        # NOTES.txt is shown to the user, never applied; helpers render to nothing.
        if not template.endswith((".yaml", ".yml")):
            continue
        for doc in SEPARATOR.split(text):
            if not doc.strip():
                continue
            # Helm's YAML reader (sigs.k8s.io/yaml, as kubectl and the API server use).
            obj = helm.values_from_yaml(doc)
            if obj:
                out.append({"template": template, "object": obj})
    return out


def run(req, chart, case):
    answer = {"name": case["name"], "error": None, "objects": [], "sha256": {}, "lint": None}
    try:
        manifests = chart.render(
            values=case["values"],
            name=req["release"],
            namespace=req["namespace"],
            is_install=True,
        )
        answer["objects"] = objects(manifests)
        answer["sha256"] = {
            t: hashlib.sha256(text.encode()).hexdigest() for t, text in manifests.items()
        }
    except helm.HelmError as e:
        answer["error"] = str(e)
        return answer
    if case.get("lint"):
        report = helm.lint(
            req["chart"], case["values"], strict=True, namespace=req["namespace"]
        )
        answer["lint"] = {"messages": report["messages"], "errors": report["errors"]}
    return answer


def main():
    req = json.load(sys.stdin)
    with helm.Chart.load(req["chart"]) as chart:
        cases = [run(req, chart, c) for c in req["cases"]]
    json.dump(
        {"helm": helm.helm_sdk_version(), "sdk": helm.__version__, "cases": cases},
        sys.stdout,
    )


if __name__ == "__main__":
    main()
