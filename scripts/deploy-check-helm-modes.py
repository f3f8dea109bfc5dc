#!/usr/bin/env python3
"""Checks a render of deploy/helm/metronome in one mode against the values it was rendered with;
exits 1 on any problem.

    deploy-check-helm-modes.py VALUES.yaml RENDERED.yaml [COMBINED_OUT.yaml]

For every mode: each value of VALUES (imagePullSecrets, extraEnv, resources, and where the chart
creates the pod nodeSelector, tolerations and affinity) reaches the pod metronome runs in; metronome
forwards to the right upstream; the Service and monitor select that pod; the NetworkPolicy (when
enabled) lets only Prometheus reach the admin port; every alert's runbook_url starts with
monitoring.runbookBaseURL.

mode sidecar: the patch the chart renders is applied, as an operator would (`kubectl patch
--local --type strategic`), to deploy/kubernetes/examples/existing-vllm/vllm.yaml, the stand-in
for "the vLLM you run": metronome must come out as a native sidecar, the vLLM container exactly as
it was. COMBINED_OUT gets the render with the patched Deployment, for deploy-validate-k8s.py to
check selectors, named ports and the grace period together.
"""
import subprocess
import sys
import tempfile

import yaml

EXISTING = "deploy/kubernetes/examples/existing-vllm/vllm.yaml"

values = yaml.safe_load(open(sys.argv[1]))
docs = [d for d in yaml.safe_load_all(open(sys.argv[2])) if d]
combined_out = sys.argv[3] if len(sys.argv) > 3 else None
mode = values.get("mode", "all-in-one")
problems = []


def by_kind(kind):
    return [d for d in docs if d["kind"] == kind]


def config_toml():
    for cm in by_kind("ConfigMap"):
        if "metronome.toml" in cm.get("data", {}):
            return cm["data"]["metronome.toml"]
    problems.append("no ConfigMap with metronome.toml")
    return ""


def the_pod():
    """The Deployment metronome runs in, after the patch in sidecar mode, and metronome's container."""
    if mode == "sidecar":
        patches = [cm for cm in by_kind("ConfigMap") if "patch.yaml" in cm.get("data", {})]
        if len(patches) != 1:
            problems.append(f"{len(patches)} patch ConfigMaps rendered, want 1")
            return None, None
        if by_kind("Deployment"):
            problems.append("mode sidecar rendered a Deployment: it must only patch yours")
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            f.write(patches[0]["data"]["patch.yaml"])
            f.flush()
            out = subprocess.run(["kubectl", "patch", "--local", "-f", EXISTING, "--type", "strategic",
                                  "--patch-file", f.name, "-o", "yaml"], capture_output=True, text=True)
        if out.returncode != 0:
            problems.append(f"kubectl patch --local failed: {out.stderr.strip()}")
            return None, None
        deployment = yaml.safe_load(out.stdout)
        original = yaml.safe_load(open(EXISTING))
        if deployment["spec"]["template"]["spec"]["containers"] != original["spec"]["template"]["spec"]["containers"]:
            problems.append("the patch changed the vLLM container")
        docs.append(deployment)
        containers = deployment["spec"]["template"]["spec"].get("initContainers", [])
    else:
        deployments = by_kind("Deployment")
        if len(deployments) != 1:
            problems.append(f"{len(deployments)} Deployments rendered, want 1")
            return None, None
        deployment = deployments[0]
        pod = deployment["spec"]["template"]["spec"]
        containers = pod.get("containers", []) if mode == "service" else pod.get("initContainers", [])
        if mode == "service" and [c["name"] for c in pod["containers"]] != ["metronome"]:
            problems.append(f"mode service runs {[c['name'] for c in pod['containers']]}, want metronome alone")
    side = [c for c in containers if c["name"] == "metronome"]
    if not side:
        problems.append("no metronome container where the mode puts it")
        return deployment, None
    native = side[0].get("restartPolicy") == "Always"
    if native != (mode != "service"):
        problems.append(f"metronome restartPolicy {side[0].get('restartPolicy')} in mode {mode}")
    return deployment, side[0]


deployment, metronome = the_pod()
if deployment is not None and metronome is not None:
    pod = deployment["spec"]["template"]["spec"]
    if values.get("imagePullSecrets") and pod.get("imagePullSecrets") != values["imagePullSecrets"]:
        problems.append(f"imagePullSecrets {pod.get('imagePullSecrets')}, want {values['imagePullSecrets']}")
    for key in ("nodeSelector", "tolerations", "affinity"):
        if values.get(key) and mode != "sidecar" and pod.get(key) != values[key]:
            problems.append(f"{key} {pod.get(key)}, want {values[key]}")
    for e in values.get("extraEnv", []):
        if e not in metronome.get("env", []):
            problems.append(f"metronome's env lacks {e}")
    if values.get("resources") and metronome.get("resources") != values["resources"]:
        problems.append(f"metronome's resources {metronome.get('resources')}, want {values['resources']}")
    vllm = values.get("vllm", {})
    if mode == "all-in-one":
        v = [c for c in pod["containers"] if c["name"] == "vllm"][0]
        for e in vllm.get("extraEnv", []):
            if e not in v.get("env", []):
                problems.append(f"vLLM's env lacks {e}")
        claim = vllm.get("modelCache", {}).get("existingClaim")
        if claim and not any(vol.get("persistentVolumeClaim", {}).get("claimName") == claim for vol in pod["volumes"]):
            problems.append(f"no volume from the model cache claim {claim}")
    labels = deployment["spec"]["template"]["metadata"].get("labels", {})
    for svc in by_kind("Service"):
        if not set(svc["spec"]["selector"].items()) <= set(labels.items()):
            problems.append(f"Service {svc['metadata']['name']} does not select the pod metronome runs in")
    for np in by_kind("NetworkPolicy"):
        if not set(np["spec"]["podSelector"]["matchLabels"].items()) <= set(labels.items()):
            problems.append("the NetworkPolicy does not select the pod metronome runs in")
        admin_rules = [r for r in np["spec"]["ingress"] if any(p.get("port") == "admin" for p in r.get("ports", []))]
        if not admin_rules or any("from" not in r for r in admin_rules):
            problems.append("the NetworkPolicy lets anyone reach the admin port")

existing = values.get("existing", {})
want_upstream = {"service": f'http://{existing.get("service")}:{existing.get("port", 8000)}',
                 "sidecar": f'http://127.0.0.1:{existing.get("port", 8000)}',
                 "all-in-one": f'http://127.0.0.1:{values.get("vllm", {}).get("port", 8000)}'}[mode]
if f'upstream = "{want_upstream}"' not in config_toml():
    problems.append(f"the config does not forward to {want_upstream}")
if values.get("networkPolicy", {}).get("enabled") and not by_kind("NetworkPolicy"):
    problems.append("networkPolicy.enabled rendered no NetworkPolicy")

base = values.get("monitoring", {}).get("runbookBaseURL")
for rule in by_kind("PrometheusRule"):
    for g in rule["spec"]["groups"]:
        for r in g["rules"]:
            url = r.get("annotations", {}).get("runbook_url")
            if "alert" in r and base and not (url or "").startswith(base + "#"):
                problems.append(f"{r['alert']} runbook_url {url}, want {base}#...")

if combined_out:
    with open(combined_out, "w") as f:
        yaml.safe_dump_all(docs, f)
for p in problems:
    print("FAIL", p)
if not problems:
    print(f"ok: mode {mode}: metronome {'a native sidecar' if mode != 'service' else 'alone'} forwarding to "
          f"{want_upstream}, every value on the pod, Service and monitor select it")
sys.exit(1 if problems else 0)
