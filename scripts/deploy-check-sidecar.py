#!/usr/bin/env python3
"""Checks the kustomize Component on the sample vLLM Deployment; exits 1 on any problem.

    kubectl kustomize deploy/kubernetes/examples/existing-vllm | deploy-check-sidecar.py -

metronome must come out as a native sidecar (an init container with restartPolicy: Always), its
ports http 8080 and admin 9464, probes /healthz and /readyz on admin, the admin address set to
0.0.0.0:9464 explicitly, its config volume pointing at the generated ConfigMap, and the vLLM
container exactly as deploy/kubernetes/examples/existing-vllm/vllm.yaml wrote it. The Component
must also render a PodMonitor that scrapes the admin port of those pods (kube-prometheus-stack
ignores prometheus.io/* annotations), the Service must lead to metronome's port with its port
number unchanged, and the example's NetworkPolicy must keep the admin port to Prometheus.
"""
import sys
import yaml

docs = [d for d in yaml.safe_load_all(open(sys.argv[1]) if sys.argv[1] != "-" else sys.stdin) if d]
original = yaml.safe_load(open("deploy/kubernetes/examples/existing-vllm/vllm.yaml"))
problems = []
deployments = [d for d in docs if d["kind"] == "Deployment"]
maps = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
if len(deployments) != 1:
    problems.append(f"{len(deployments)} Deployments rendered, want 1")
pod = deployments[0]["spec"]["template"]["spec"]
inits = pod.get("initContainers", [])
side = [c for c in inits if c["name"] == "metronome"]
if len(side) != 1:
    problems.append("no metronome init container")
else:
    m = side[0]
    if m.get("restartPolicy") != "Always":
        problems.append("metronome is not a native sidecar (restartPolicy: Always)")
    ports = {p["name"]: p["containerPort"] for p in m.get("ports", [])}
    if ports != {"http": 8080, "admin": 9464}:
        problems.append(f"ports {ports}")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        got = m.get(probe, {}).get("httpGet", {})
        if (got.get("path"), got.get("port")) != (path, "admin"):
            problems.append(f"{probe} is {got}, want {path} on admin")
    if "0.0.0.0:9464" not in " ".join(m.get("args", [])):
        problems.append("the admin address is not set explicitly (the default is 127.0.0.1:9464)")
    sc = m.get("securityContext", {})
    if not (sc.get("runAsNonRoot") and sc.get("readOnlyRootFilesystem")):
        problems.append("metronome must run as non-root with a read-only root filesystem")
vols = {v["name"]: v for v in pod.get("volumes", [])}
cm = vols.get("metronome-config", {}).get("configMap", {}).get("name")
if cm not in maps:
    problems.append(f"the config volume names ConfigMap {cm}, rendered are {sorted(maps)}")
want = original["spec"]["template"]["spec"]["containers"]
if pod["containers"] != want:
    problems.append("the vLLM container changed:\n" + yaml.safe_dump(pod["containers"]))
pod_labels = deployments[0]["spec"]["template"]["metadata"].get("labels", {})


def selects(selector):
    return bool(selector) and set(selector.items()) <= set(pod_labels.items())


monitors = [d for d in docs if d["kind"] == "PodMonitor"]
if not monitors:
    problems.append("no PodMonitor: kube-prometheus-stack would scrape nothing")
for m in monitors:
    if not selects(m["spec"]["selector"].get("matchLabels", {})):
        problems.append(f"PodMonitor {m['metadata']['name']} does not select the vLLM pods")
    if "admin" not in [e.get("port") for e in m["spec"].get("podMetricsEndpoints", [])]:
        problems.append(f"PodMonitor {m['metadata']['name']} does not scrape the admin port")
original_svc = yaml.safe_load(open("deploy/kubernetes/examples/existing-vllm/service.yaml"))
for svc in [d for d in docs if d["kind"] == "Service"]:
    ports = svc["spec"]["ports"]
    if ports[0].get("targetPort") not in ("http", 8080):
        problems.append(f"Service {svc['metadata']['name']} still leads to {ports[0].get('targetPort')}, not metronome's http port")
    if [p["port"] for p in ports] != [p["port"] for p in original_svc["spec"]["ports"]]:
        problems.append("the Service's port numbers changed: clients would need a new address")
for np in [d for d in docs if d["kind"] == "NetworkPolicy"]:
    if not selects(np["spec"]["podSelector"].get("matchLabels", {})):
        problems.append("the NetworkPolicy does not select the vLLM pods")
    for rule in np["spec"].get("ingress", []):
        if any(p.get("port") in ("admin", 9464) for p in rule.get("ports", [])) and not rule.get("from"):
            problems.append("the NetworkPolicy opens the admin port to every pod")
for p in problems:
    print("FAIL", p)
if not problems:
    print(f"ok: native sidecar, ports, probes, admin 0.0.0.0:9464, ConfigMap {cm}, vLLM container untouched,"
          f" PodMonitor on admin, Service to metronome's port, admin port kept to Prometheus")
sys.exit(1 if problems else 0)
