#!/usr/bin/env python3
"""Lints and renders deploy/helm/metronome with Helm's own Go SDK; exits 1 on a lint error.

    deploy-helm.py lint [-f VALUES.yaml]... [KEY=VALUE]...
    deploy-helm.py template OUT.yaml [-f VALUES.yaml]... [KEY=VALUE]...

No helm binary can be installed here, so this goes through PyPI's helm-python-sdk, a ctypes
binding to Helm's Go SDK (v4): the same chart loader, template engine (Go templates, sprig) and
linter that `helm lint` and `helm template` use. `-f FILE` merges a values file, KEY=VALUE sets a
value like `helm --set` (parsed by Helm's own strvals parser), in the order given.
"""
import os
import sys

import helm_python as helm
import yaml

# HELM_CHART: another copy of the chart (check-deploy renders broken copies with it).
CHART = os.environ.get("HELM_CHART", "deploy/helm/metronome")


def values(pairs):
    merged = {}
    pairs = list(pairs)
    while pairs:
        pair = pairs.pop(0)
        if pair == "-f":
            parsed = yaml.safe_load(open(pairs.pop(0))) or {}
        else:
            parsed = helm.parse_set_string(pair)
        stack = [(merged, parsed)]
        while stack:
            into, new = stack.pop()
            for k, v in new.items():
                if isinstance(v, dict) and isinstance(into.get(k), dict):
                    stack.append((into[k], v))
                else:
                    into[k] = v
    return merged


def lint(pairs):
    report = helm.lint(CHART, values(pairs), strict=True, kube_version="v1.29.0")
    for m in report.get("messages", []):
        print(f"  [{ {0: 'UNKNOWN', 1: 'INFO', 2: 'WARNING', 3: 'ERROR'}.get(m['severity'])}] {m['path']}: {m['error']}")
    errors = [m for m in report.get("messages", []) if m["severity"] >= 2] + report.get("errors", [])
    print(f"helm lint (Helm SDK {helm.helm_sdk_version()}): {report.get('total_charts_linted')} chart(s), {len(errors)} error(s) or warning(s)")
    return 1 if errors else 0


def template(out, pairs):
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values(pairs), name="demo", namespace="team-a", is_install=True)
    with open(out, "w") as f:
        for path in sorted(rendered):
            text = rendered[path].strip()
            if path.endswith(".yaml") and text:
                f.write(f"---\n# Source: {path}\n{text}\n")
    print(f"helm template (Helm SDK {helm.helm_sdk_version()}): {len(rendered)} templates -> {out}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["lint"]:
        sys.exit(lint(sys.argv[2:]))
    if sys.argv[1:2] == ["template"] and len(sys.argv) >= 3:
        sys.exit(template(sys.argv[2], sys.argv[3:]))
    sys.exit(__doc__)
