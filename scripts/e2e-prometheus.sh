#!/usr/bin/env bash
# End to end, on 127.0.0.1 only: metronome sim (with stalls) -> metronome serve -> metronome probe,
# scraped every second by a real Prometheus server loaded with the shipped scrape config and
# rules. Checks that:
#   1. the level:metric:operations ITL p99 series exist for route, model and point;
#   2. every recording rule returns data;
#   3. every dashboard query returns data (but the client-point heatmap and unparsed events,
#      which nothing in this run produces);
#   4. Prometheus' ingress ITL p99 (histogram_quantile) agrees with the probe's client p99 within
#      the bucket resolution;
#   5. the stall alert, driven true by the sim's stall profile, reaches the firing state, and so
#      does the upstream-errors alert, driven by a route whose upstream is down;
#   6. two metronome instances whose targets carry different `namespace` labels (team-a, team-b,
#      as the Prometheus Operator would give two deployments of the same model) stay apart in the
#      recording rules, and the upstream-errors alert fires for team-a (which has the broken
#      route) only, and the fired alerts' annotations name their own namespace and pod (the
#      targets carry a `pod` label, as the Operator's would: metronome-a-0, metronome-b-0);
#   7. the dashboard's vLLM panels have data from a vLLM-shaped /metrics (a fixture of vLLM 0.11's
#      families, scripts/deploy-vllm-metrics.py) scraped beside metronome.
# Deviations from the shipped files, all made on copies: scrape and evaluation every 1s, the
# Kubernetes job left out (Debian's Prometheus lacks Kubernetes discovery), the target is this
# run's admin port, and every alert's `for` is cut to 5s so that firing takes seconds.
#
#   scripts/e2e-prometheus.sh            # METRONOME_BIN=path to skip the release build
#
# Bounded: every wait has a deadline, and the whole run stops itself after 4 minutes (plus the
# build). Everything started here is stopped on exit.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
TMP=$(mktemp -d)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT
# The whole run, not counting the build, stops itself after this long.
DEADLINE=$((SECONDS + 240))

checks=0
say() { printf '%s\n' "$*"; }
ok() { checks=$((checks + 1)); printf 'PASS  %s\n' "$*"; }
die() {
    printf 'FAIL  %s\n' "$*"
    for log in "$TMP"/*.log; do
        [[ -f $log ]] && { printf -- '--- %s (last lines)\n' "$(basename "$log")"; tail -n 15 "$log"; }
    done
    printf 'e2e-prometheus: %d passed, 1 failed\n' "$checks"
    exit 1
}

# --- tools -----------------------------------------------------------------------------------
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    say "installing Debian prometheus"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    systemctl stop prometheus >/dev/null 2>&1 || true
fi
python3 -c 'import yaml' 2>/dev/null || python3 -m pip install -q pyyaml
command -v curl >/dev/null || { apt-get update -qq && apt-get install -y -qq curl >/dev/null; }
prometheus --version 2>&1 | head -1

BIN=${METRONOME_BIN:-}
if [[ -z $BIN ]]; then
    say "building metronome (release)"
    cargo build --release --quiet --bin metronome
    BIN=$ROOT/target/release/metronome
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }
SIM=$(free_port); PROXY=$(free_port); ADMIN=$(free_port); PROM=$(free_port); DOWN=$(free_port)
PROXY_B=$(free_port); ADMIN_B=$(free_port); VLLM=$(free_port)
say "ports: sim $SIM, proxy $PROXY, admin $ADMIN, prometheus $PROM, a closed one $DOWN, team-b proxy $PROXY_B admin $ADMIN_B, vLLM-shaped metrics $VLLM"

wait_for() { # description, seconds, command...
    local what=$1 limit=$((SECONDS + $2))
    shift 2
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < limit && SECONDS < DEADLINE)) || die "timed out waiting for $what"
        sleep 0.5
    done
}

# --- sim and metronome -----------------------------------------------------------------------
# 20 ms between tokens, and before 5% of token events a 400 ms stall.
"$BIN" sim --listen 127.0.0.1:$SIM --model sim-model --gap 20ms --stall-prob 0.05 --stall 400ms \
    --tokens 64 --seed 7 >"$TMP/sim.log" 2>&1 &
PIDS+=($!)
cat >"$TMP/metronome.toml" <<EOF
[server]
listen = "127.0.0.1:$PROXY"
admin = "127.0.0.1:$ADMIN"
upstream = "http://127.0.0.1:$SIM"
drain_grace = "5s"
[readiness]
path = "/health"
interval = "1s"
timeout = "500ms"
[[routes]]
name = "chat"
path = "/v1/chat/completions"
match = "exact"
[[routes]]
name = "broken"
path = "/broken"
upstream = "http://127.0.0.1:$DOWN"
EOF
"$BIN" check-config "$TMP/metronome.toml" >/dev/null || die "check-config refused the e2e config"
"$BIN" serve --config "$TMP/metronome.toml" >"$TMP/metronome.log" 2>&1 &
PIDS+=($!)
# team-b: a second deployment of the same model, without the broken route.
sed -e "s/127.0.0.1:$PROXY\"/127.0.0.1:$PROXY_B\"/" -e "s/127.0.0.1:$ADMIN\"/127.0.0.1:$ADMIN_B\"/" \
    "$TMP/metronome.toml" | head -n -4 >"$TMP/metronome-b.toml"
grep -q broken "$TMP/metronome-b.toml" && die "team-b's config still has the broken route"
"$BIN" check-config "$TMP/metronome-b.toml" >/dev/null || die "check-config refused team-b's config"
"$BIN" serve --config "$TMP/metronome-b.toml" >"$TMP/metronome-b.log" 2>&1 &
PIDS+=($!)
python3 scripts/deploy-vllm-metrics.py "$VLLM" deploy/prometheus/tests/fixtures/vllm-0.11-metrics.txt 300 >"$TMP/vllm.log" 2>&1 &
PIDS+=($!)
wait_for "metronome /readyz" 20 curl -fsS "http://127.0.0.1:$ADMIN/readyz"
wait_for "team-b metronome /readyz" 20 curl -fsS "http://127.0.0.1:$ADMIN_B/readyz"
wait_for "the vLLM-shaped /metrics" 20 curl -fsS "http://127.0.0.1:$VLLM/metrics"
ok "two metronomes are ready in front of the sim (/readyz 200: the sim answers GET /health), and a vLLM-shaped /metrics answers"

# --- Prometheus, with the shipped config and rules -------------------------------------------
mkdir -p "$TMP/prom/rules" "$TMP/prom/targets"
python3 - "$TMP/prom" "$ADMIN" "$ADMIN_B" "$VLLM" <<'EOF'
import json, re, sys, yaml, pathlib
out, admin, admin_b, vllm = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
c = yaml.safe_load(open("deploy/prometheus/prometheus.yml"))
c["global"]["scrape_interval"] = "1s"
c["global"]["evaluation_interval"] = "1s"
c["scrape_configs"] = [j for j in c["scrape_configs"] if "kubernetes_sd_configs" not in j]
for j in c["scrape_configs"]:
    j["scrape_timeout"] = "1s"
yaml.safe_dump(c, open(out / "prometheus.yml", "w"))
# The namespace and pod labels as the Operator would set them; team-a's vLLM beside its metronome.
(out / "targets" / "e2e.json").write_text(json.dumps([
    {"targets": [f"127.0.0.1:{admin}"], "labels": {"env": "e2e", "namespace": "team-a", "pod": "metronome-a-0"}},
    {"targets": [f"127.0.0.1:{vllm}"], "labels": {"env": "e2e", "namespace": "team-a", "pod": "vllm-a-0"}},
    {"targets": [f"127.0.0.1:{admin_b}"], "labels": {"env": "e2e", "namespace": "team-b", "pod": "metronome-b-0"}},
]))
for rules in c["rule_files"]:
    text = open(f"deploy/prometheus/{rules}").read()
    (out / rules).write_text(re.sub(r"^(\s+)for: \S+$", r"\1for: 5s", text, flags=re.M))
EOF
prometheus --config.file="$TMP/prom/prometheus.yml" --storage.tsdb.path="$TMP/prom/data" \
    --web.listen-address=127.0.0.1:$PROM --log.level=warn >"$TMP/prometheus.log" 2>&1 &
PIDS+=($!)
API=http://127.0.0.1:$PROM/api/v1
wait_for "Prometheus to start" 30 curl -fsS "http://127.0.0.1:$PROM/-/ready"
ok "Prometheus $PROM is up with deploy/prometheus/prometheus.yml and its rules"

# --- load ------------------------------------------------------------------------------------
"$BIN" probe --url "http://127.0.0.1:$PROXY" --model sim-model -c 4 --duration 45s --max-tokens 64 \
    --json "$TMP/probe.json" >"$TMP/probe.log" 2>&1 &
PROBE=$!
PIDS+=($PROBE)
"$BIN" probe --url "http://127.0.0.1:$PROXY_B" --model sim-model -c 2 --duration 45s --max-tokens 64 \
    --json "$TMP/probe-b.json" >"$TMP/probe-b.log" 2>&1 &
PIDS+=($!)
# One request a second to the route whose upstream is down, for at most 90 s (a counter must
# rise between scrapes for rate() to see it).
(for _ in $(seq 90); do
    curl -s -o /dev/null -X POST "http://127.0.0.1:$PROXY/broken" -d '{}' || true
    sleep 1
done) &
PIDS+=($!)

query() { # PromQL -> number of series with a value
    curl -fsS --get "$API/query" --data-urlencode "query=$1" |
        python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(len(r))'
}
has_data() { [[ $(query "$1") -gt 0 ]]; }

# 1. The ITL p99 recording rule per route, model and point.
P99=route_model_point:metronome_inter_token_latency_seconds:p99_5m
for point in ingress egress; do
    wait_for "$P99 at $point" 90 has_data "$P99{route=\"chat\", model=\"sim-model\", point=\"$point\"}"
    ok "$P99{route=\"chat\", model=\"sim-model\", point=\"$point\"} = $(curl -fsS --get "$API/query" \
        --data-urlencode "query=$P99{route=\"chat\",point=\"$point\"}" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["data"]["result"][0]["value"][1])')"
done

# 5. Alerts: the stall profile makes the stall rate 5% (> 1%), the broken route fails requests.
alert_state() { # name -> prints firing / pending / nothing
    curl -fsS "$API/alerts" | python3 -c '
import json, sys
states = {a["state"] for a in json.load(sys.stdin)["data"]["alerts"] if a["labels"]["alertname"] == sys.argv[1]}
print("firing" if "firing" in states else "pending" if "pending" in states else "inactive")' "$1"
}
firing() { [[ $(alert_state "$1") == firing ]]; }
for alert in MetronomeStallRateHigh MetronomeUpstreamErrors; do
    wait_for "$alert to fire" 90 firing "$alert"
    ok "$alert is firing"
done

# 6. Two deployments of the same model stay apart; the alert names team-a only.
for ns in team-a team-b; do
    wait_for "$P99 for $ns" 60 has_data "$P99{namespace=\"$ns\", model=\"sim-model\", point=\"ingress\"}"
done
[[ $(query "$P99{model=\"sim-model\", point=\"ingress\", route=\"chat\"}") -eq 2 ]] ||
    die "$P99 for model sim-model should be one series per namespace (2)"
ok "the recording rules keep team-a and team-b apart: 2 series of $P99 for the one model"
team_b_alerts=$(curl -fsS "$API/alerts" | python3 -c '
import json, sys
print(sum(1 for a in json.load(sys.stdin)["data"]["alerts"] if a["labels"]["alertname"] == "MetronomeUpstreamErrors" and a["labels"].get("namespace") != "team-a"))')
[[ $team_b_alerts -eq 0 ]] || die "MetronomeUpstreamErrors fired for a namespace other than team-a"
[[ $(curl -fsS "$API/alerts" | python3 -c '
import json, sys
print(sum(1 for a in json.load(sys.stdin)["data"]["alerts"] if a["labels"]["alertname"] == "MetronomeUpstreamErrors" and a["labels"].get("namespace") == "team-a" and a["state"] == "firing"))') -eq 1 ]] ||
    die "MetronomeUpstreamErrors is not firing once for team-a"
ok "MetronomeUpstreamErrors fires for namespace team-a only"

# The fired alerts name their namespace (summary) and their deployment's worst pod (description,
# by the alert's `query` template): MetronomeUpstreamErrors and MetronomeStallRateHigh team-a's pod,
# and MetronomeGapSLOSlowBurn, which both namespaces' stalls drive, each namespace's own (team-b's
# 2 streams stay under the stall alert's traffic floor of 10 gaps/s over 5m).
names_pod() { # alert, namespace, pod -> true when a firing alert of that namespace names both
    curl -fsS "$API/alerts" | python3 -c '
import json, re, sys
alert, ns, pod = sys.argv[1:]
hits = [a for a in json.load(sys.stdin)["data"]["alerts"] if a["labels"]["alertname"] == alert
        and a["labels"].get("namespace") == ns and a["state"] == "firing"]
ok = [a for a in hits if f"namespace {ns} " in a["annotations"]["summary"]
      and (m := re.search(r"Worst pod[^:]*: (\S+) \(", a["annotations"]["description"])) and m[1] == pod]
for a in hits:
    print(a["annotations"]["summary"], "| Worst pod" + a["annotations"]["description"].split("Worst pod")[-1], file=sys.stderr)
sys.exit(0 if len(hits) == 1 and ok else 1)' "$@"
}
for case in "MetronomeUpstreamErrors team-a metronome-a-0" "MetronomeStallRateHigh team-a metronome-a-0" \
    "MetronomeGapSLOSlowBurn team-a metronome-a-0" "MetronomeGapSLOSlowBurn team-b metronome-b-0"; do
    read -r alert ns pod <<<"$case"
    limit=$((SECONDS + 60))
    until names_pod "$alert" "$ns" "$pod" 2>/dev/null; do
        if ((SECONDS >= limit || SECONDS >= DEADLINE)); then
            names_pod "$alert" "$ns" "$pod" || true
            die "$alert for $ns does not name namespace $ns and pod $pod (above: what it says)"
        fi
        sleep 0.5
    done
    ok "$alert for $ns names namespace $ns and pod $pod: $(names_pod "$alert" "$ns" "$pod" 2>&1 | tail -1)"
done

# Let the probe finish its streams, then compare it with Prometheus.
while kill -0 $PROBE 2>/dev/null; do
    ((SECONDS < DEADLINE)) || die "the probe did not finish"
    sleep 1
done
wait $PROBE || say "(probe exited non-zero: its streams are still counted)"
sleep 3

# 2. Every recording rule has data.
empty=()
rules=0
while read -r record; do
    rules=$((rules + 1))
    has_data "$record" || empty+=("$record")
done < <(python3 -c '
import yaml
for f in ("metronome.rules.yml", "metronome.alerts.yml"):
    for g in yaml.safe_load(open(f"deploy/prometheus/rules/{f}"))["groups"]:
        for r in g["rules"]:
            if "record" in r: print(r["record"])')
((${#empty[@]} == 0)) || die "recording rules without data: ${empty[*]}"
ok "all $rules recording rules return data"

# 3. Every dashboard query has data, but what this run cannot produce.
no_data=()
expected_empty=0
queries=0
while IFS=$'\t' read -r title expr; do
    queries=$((queries + 1))
    if ! has_data "$expr"; then
        case $title in
        "Inter-token gaps at client" | "Events metronome could not inspect" | *"(native histogram)") expected_empty=$((expected_empty + 1)) ;;
        # What this run's traffic has none of: no batch engine (episodes, batch hitches), no
        # request with llm-d objectives (goodput), no reasoning (TTFO and the reasoning panels,
        # and the phase families until the phases work is merged), no WebSocket tunnel.
        "Batch episodes per second by upstream" | "Share of hitches shared with the batch" | \
            "Goodput by objective" | "Streams meeting and missing all objectives per second" | \
            "Phase: "* | "WebSocket: "*) expected_empty=$((expected_empty + 1)) ;;
        *) no_data+=("$title") ;;
        esac
    fi
done < <(python3 scripts/deploy-check-promql.py dashboard-exprs)
((${#no_data[@]} == 0)) || die "dashboard queries without data: ${no_data[*]}"
ok "$((queries - expected_empty)) of $queries dashboard queries return data, the vLLM panels included (no data, as expected: the client-point heatmap, as no client reports here, unparsed events, as the sim sends none, the native-histogram panels, as this scrape is classic, and the batch-episode, goodput, phase and WebSocket panels this traffic has nothing for)"

# 4. Prometheus' ingress p99 against the probe's client p99: within one bucket of each other.
PROM_P99=$(curl -fsS --get "$API/query" --data-urlencode \
    "query=histogram_quantile(0.99, sum by (le) (increase(metronome_inter_token_latency_seconds_bucket{route=\"chat\", point=\"ingress\"}[10m])))" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["data"]["result"][0]["value"][1])')
python3 - "$TMP/probe.json" "$PROM_P99" <<'EOF' || die "Prometheus and the probe disagree on p99"
import json, sys, tomllib, bisect
client = json.load(open(sys.argv[1]))["itl_ms"]["p99"] / 1000
prom = float(sys.argv[2])
bounds = tomllib.load(open("config/metronome.toml", "rb"))["buckets"]["itl"]
b_client, b_prom = bisect.bisect_left(bounds, client), bisect.bisect_left(bounds, prom)
print(f"      ITL p99: probe (client, exact) {client * 1000:.1f} ms; Prometheus (ingress, histogram_quantile) {prom * 1000:.1f} ms")
print(f"      buckets: client in (.., {bounds[b_client] if b_client < len(bounds) else 'inf'}], Prometheus in (.., {bounds[b_prom] if b_prom < len(bounds) else 'inf'}]")
sys.exit(0 if abs(b_client - b_prom) <= 1 else 1)
EOF
ok "Prometheus' ingress ITL p99 agrees with the probe's client p99 within one ITL bucket"

# Summary of what the alerts say now.
curl -fsS "$API/alerts" >"$TMP/alerts.json"
python3 - "$TMP/alerts.json" <<'EOF'
import json, sys
for a in sorted(json.load(open(sys.argv[1]))["data"]["alerts"], key=lambda a: a["labels"]["alertname"]):
    labels = " ".join(f"{k}={v}" for k, v in sorted(a["labels"].items()) if k != "alertname")
    print(f"      {a['state']:8s} {a['labels']['alertname']:36s} {labels}")
EOF
say "e2e-prometheus: $checks passed, 0 failed"
