#!/usr/bin/env python3
"""Checks what deploy/helm/metronome renders, beyond the schemas; exits 1 on any problem.

    deploy-check-helm.py RENDERED.yaml RELEASE [TOML_OUT]

The PodMonitor or ServiceMonitor, the PrometheusRule and the dashboard ConfigMap carry
release: RELEASE; the dashboard ConfigMap is labelled grafana_dashboard: "1"; metronome is a
native sidecar whose admin address is 0.0.0.0 (explicit, in args and config); the PrometheusRule
holds every rule and alert of deploy/prometheus/rules, annotation templates unchanged (runbook_url
on the default runbookBaseURL). Writes the rendered metronome.toml to
TOML_OUT for `metronome check-config`.
"""
import sys
import yaml

docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
release = sys.argv[2]
problems = []
by_kind = {}
for d in docs:
    by_kind.setdefault(d["kind"], []).append(d)
monitors = by_kind.get("PodMonitor", []) + by_kind.get("ServiceMonitor", [])
dash = [d for d in by_kind.get("ConfigMap", []) if "metronome.json" in d.get("data", {})]
for d in monitors + by_kind.get("PrometheusRule", []) + dash:
    labels = d["metadata"].get("labels", {})
    if labels.get("release") != release:
        problems.append(f"{d['kind']}/{d['metadata']['name']} has release={labels.get('release')}, want {release}")
if len(monitors) != 1:
    problems.append(f"{len(monitors)} monitors rendered")
if not dash or dash[0]["metadata"]["labels"].get("grafana_dashboard") != "1":
    problems.append("no dashboard ConfigMap labelled grafana_dashboard: \"1\"")
groups = by_kind["PrometheusRule"][0]["spec"]["groups"] if by_kind.get("PrometheusRule") else []
rules = sum(len(g["rules"]) for g in groups)
want_groups = [g for f in ("metronome.rules.yml", "metronome.alerts.yml")
               for g in yaml.safe_load(open(f"deploy/prometheus/rules/{f}"))["groups"]]
# The chart points runbook_url at monitoring.runbookBaseURL (values.yaml), keeping the anchor.
base = yaml.safe_load(open("deploy/helm/metronome/values.yaml"))["monitoring"]["runbookBaseURL"]
for g in want_groups:
    for r in g["rules"]:
        if "runbook_url" in r.get("annotations", {}):
            r["annotations"]["runbook_url"] = base + "#" + r["annotations"]["runbook_url"].split("#")[-1]
want = sum(len(g["rules"]) for g in want_groups)
if rules != want:
    problems.append(f"the PrometheusRule has {rules} rules, deploy/prometheus/rules has {want}")
elif groups != want_groups:
    # The alerts' annotations are Go templates ({{ $labels.namespace }}, the worst-pod `query`):
    # Helm must pass them through untouched, not template them.
    problems.append("the PrometheusRule's rules differ from deploy/prometheus/rules (a template Helm rewrote?)")
pod = by_kind["Deployment"][0]["spec"]["template"]["spec"]
side = [c for c in pod.get("initContainers", []) if c["name"] == "metronome"]
if not side or side[0].get("restartPolicy") != "Always":
    problems.append("metronome is not a native sidecar")
elif not any(a.startswith("0.0.0.0:") for a in side[0]["args"]):
    problems.append("the sidecar's args do not set the admin address")
toml = [d["data"]["metronome.toml"] for d in by_kind["ConfigMap"] if "metronome.toml" in d.get("data", {})]
if not toml or 'admin = "0.0.0.0:' not in toml[0]:
    problems.append("the config does not set admin = 0.0.0.0:PORT")
elif len(sys.argv) > 3:
    open(sys.argv[3], "w").write(toml[0])
for p in problems:
    print("FAIL", p)
if not problems:
    print(f"ok: {len(docs)} objects; release={release} on {len(monitors)} {monitors[0]['kind']}, the rules ({rules}) and the dashboard; native sidecar; admin 0.0.0.0")
sys.exit(1 if problems else 0)
