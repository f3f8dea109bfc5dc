#!/usr/bin/env python3
"""Checks the kustomize Component on the sample vLLM Deployment; exits 1 on any problem.

    kubectl kustomize deploy/kubernetes/examples/existing-vllm | deploy-check-sidecar.py -

metronome must come out as a native sidecar (an init container with restartPolicy: Always), its
ports http 8080 and admin 9464, probes /healthz and /readyz on admin, the admin address set to
0.0.0.0:9464 explicitly, its config volume pointing at the generated ConfigMap, and the vLLM
container exactly as deploy/kubernetes/examples/existing-vllm/vllm.yaml wrote it.
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
for p in problems:
    print("FAIL", p)
if not problems:
    print(f"ok: native sidecar, ports, probes, admin 0.0.0.0:9464, ConfigMap {cm}, vLLM container untouched")
sys.exit(1 if problems else 0)
