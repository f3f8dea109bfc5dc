#!/usr/bin/env python3
"""Validates Kubernetes manifests offline; exits 1 on any problem.

    deploy-validate-k8s.py [-k VERSION]... FILE...

Every YAML document in the files is checked:
  - core kinds against the Kubernetes OpenAPI schemas that the kubernetes-validate package ships
    (strict: an unknown or misspelt field is an error), for each -k version (default 1.37.0);
  - PodMonitor, ServiceMonitor and PrometheusRule (Prometheus Operator CRDs, not in those schemas) against the JSON
    schemas in deploy/kubernetes/schemas/;
  - any other kind is an error, rather than the warning kubernetes-validate gives.
Then the documents given together are checked against each other, the way they have to fit in a
cluster: Service and monitor selectors match the pod template, named ports exist, the
prometheus.io/port annotation names a declared port, and terminationGracePeriodSeconds covers
the preStop sleep plus metronome's drain_grace (from the ConfigMap's metronome.toml).
"""

import argparse
import json
import pathlib
import re
import sys
import tomllib

import jsonschema
import kubernetes_validate
import yaml

SCHEMAS = pathlib.Path(__file__).resolve().parent.parent / "deploy" / "kubernetes" / "schemas"
CRDS = {
    ("monitoring.coreos.com/v1", "PodMonitor"): SCHEMAS / "podmonitor.schema.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SCHEMAS / "servicemonitor.schema.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): SCHEMAS / "prometheusrule.schema.json",
}

problems = []


def problem(where, text):
    problems.append(f"{where}: {text}")


def name_of(doc):
    return f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


def validate_schema(path, doc, versions):
    key = (doc.get("apiVersion"), doc.get("kind"))
    where = f"{path} {name_of(doc)}"
    if key in CRDS:
        schema = json.loads(CRDS[key].read_text())
        errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=str)
        for e in errors:
            at = ".".join(str(p) for p in e.absolute_path) or "(root)"
            problem(where, f"{at}: {e.message}")
        if not errors:
            print(f"  ok    {where} against {CRDS[key].name}")
        return
    for version in versions:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
            print(f"  ok    {where} against Kubernetes {version} (strict)")
        except kubernetes_validate.SchemaNotFoundError:
            problem(where, f"no schema for apiVersion {key[0]} kind {key[1]} in Kubernetes {version}")
        except kubernetes_validate.ValidationError as e:
            at = ".".join(str(p) for p in e.path) or "(root)"
            problem(where, f"Kubernetes {version}: {at}: {e.message}")


def seconds(text):
    m = re.fullmatch(r"\s*([0-9.]+)\s*(ms|s|m|h)\s*", text)
    if not m:
        raise ValueError(f"cannot read duration {text!r}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def cross_check(path, docs):
    deployments = [d for d in docs if d.get("kind") == "Deployment"]
    services = [d for d in docs if d.get("kind") == "Service"]
    configmaps = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "ConfigMap"}
    for dep in deployments:
        where = f"{path} {name_of(dep)}"
        template = dep["spec"]["template"]
        pod = template["spec"]
        labels = template["metadata"].get("labels", {})
        if not matches(dep["spec"]["selector"].get("matchLabels"), labels):
            problem(where, "spec.selector does not match the pod template's labels")
        containers = pod.get("containers", []) + pod.get("initContainers", [])
        ports = {p["name"]: p["containerPort"] for c in containers for p in c.get("ports", []) if "name" in p}
        numbers = {p["containerPort"] for c in containers for p in c.get("ports", [])}
        for c in containers:
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                port = ((c.get(probe) or {}).get("httpGet") or {}).get("port")
                if isinstance(port, str) and port not in ports:
                    problem(where, f"{c['name']}.{probe} uses port {port!r}, which no container declares")
        annotations = template["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scrape") == "true":
            port = annotations.get("prometheus.io/port")
            if port is None or int(port) not in numbers:
                problem(where, f"prometheus.io/port {port!r} is not a declared containerPort")
        metronome = next((c for c in containers if c["name"] == "metronome"), None)
        if metronome is None:
            problem(where, "no container named metronome")
            continue
        native = metronome in pod.get("initContainers", [])
        if native and metronome.get("restartPolicy") != "Always":
            problem(where, "metronome is an init container without restartPolicy: Always (it would block the pod)")
        if not native and "restartPolicy" in metronome:
            problem(where, "metronome is a regular container but has a container restartPolicy")
        for probe, path_ in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            got = ((metronome.get(probe) or {}).get("httpGet") or {}).get("path")
            if got != path_:
                problem(where, f"metronome {probe} must GET {path_}, not {got!r}")
        # The grace period must cover the longest preStop sleep plus the drain.
        grace = pod.get("terminationGracePeriodSeconds", 30)
        sleeps = []
        for c in containers:
            command = (((c.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command", [])
            if len(command) == 2 and command[0] == "sleep":
                sleeps.append(float(command[1]))
        if not sleeps:
            problem(where, "no container has a preStop sleep")
        volume = next((v for v in pod.get("volumes", []) if "configMap" in v and
                       any(m["name"] == v["name"] for m in metronome.get("volumeMounts", []))), None)
        cm = configmaps.get(volume["configMap"]["name"]) if volume else None
        if cm is None:
            print(f"  note  {where}: metronome's ConfigMap is not among these documents; grace period not checked")
            continue
        config = tomllib.loads(cm["data"]["metronome.toml"])
        drain = seconds(config.get("server", {}).get("drain_grace", "30s"))
        need = max(sleeps, default=0) + drain
        if grace <= need:
            problem(where, f"terminationGracePeriodSeconds {grace} must exceed preStop sleep + drain_grace = {need:g}s")
        else:
            print(f"  ok    {where}: terminationGracePeriodSeconds {grace} > preStop {max(sleeps):g}s + drain_grace {drain:g}s")
        for svc in services:
            swhere = f"{path} {name_of(svc)}"
            if not matches(svc["spec"].get("selector"), labels):
                problem(swhere, f"selector does not match the pods of {name_of(dep)}")
            for p in svc["spec"].get("ports", []):
                target = p.get("targetPort", p["port"])
                if isinstance(target, str) and target not in ports:
                    problem(swhere, f"targetPort {target!r} is not a container port name")
            if not any(p.get("targetPort") in ("http", ports.get("http")) for p in svc["spec"]["ports"]):
                problem(swhere, "no port leads to metronome's http port: clients would bypass it")
        for mon in (d for d in docs if d.get("kind") == "PodMonitor"):
            mwhere = f"{path} {name_of(mon)}"
            if not matches(mon["spec"]["selector"].get("matchLabels"), labels):
                problem(mwhere, f"selector does not match the pods of {name_of(dep)}")
            for e in mon["spec"]["podMetricsEndpoints"]:
                if e["port"] not in ports:
                    problem(mwhere, f"port {e['port']!r} is not a container port name")
    for mon in (d for d in docs if d.get("kind") == "ServiceMonitor"):
        mwhere = f"{path} {name_of(mon)}"
        svcs = [s for s in services if matches(mon["spec"]["selector"].get("matchLabels"), s["metadata"].get("labels", {}))]
        if services and not svcs:
            problem(mwhere, "selector matches no Service")
        for s in svcs:
            names = {p.get("name") for p in s["spec"]["ports"]}
            for e in mon["spec"]["endpoints"]:
                if e["port"] not in names:
                    problem(mwhere, f"port {e['port']!r} is not a port name of {name_of(s)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", "--kubernetes-version", action="append", dest="versions")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    versions = args.versions or ["1.37.0"]
    all_docs = []
    for path in args.files:
        try:
            docs = [d for d in yaml.safe_load_all(open(path)) if d is not None]
        except yaml.YAMLError as e:
            problem(path, f"not YAML: {e}")
            continue
        if not docs:
            problem(path, "no documents")
        for doc in docs:
            if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
                problem(path, "a document without apiVersion and kind")
                continue
            validate_schema(path, doc, versions)
            all_docs.append(doc)
    try:
        cross_check(" + ".join(args.files), all_docs)
    except (KeyError, TypeError, ValueError) as e:
        problem(" + ".join(args.files), f"cannot cross-check: {type(e).__name__} {e}")
    for p in problems:
        print(f"  FAIL  {p}")
    if problems:
        print(f"{len(problems)} problem(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
