#!/usr/bin/env bash
# End to end, on 127.0.0.1 only: what a real Prometheus reads from metronome's native histograms
# is what metronome measured. Three `metronome sim`s with different cadences (log-normal gaps of
# 8 ms sigma 0.3, 50 ms and 15 ms sigma 0.15; a 300 ms stall before 0.4 % of token events; a TTFT
# of 20, 100 or 60 ms plus 0.1 ms per prompt token, prompts of about 60 tokens, log-normal), each
# behind its own metronome (release binary), all scraped every second by Debian's Prometheus with
# native histograms on (protobuf), metronome A also by a second Prometheus with exemplar storage
# on (OpenMetrics). Checks that:
#   1. one stream at a time (200 streams of 64 tokens in sequence, metronome A):
#      histogram_quantile(0.5 and 0.99) over the native ITL and TTFT histograms are within 2 % of
#      the exact quantiles of the same gaps, read from the admin's /streams/{id} (Prometheus'
#      histogram_count must first equal the number of gaps read there, exactly). TTFT p99 of 200
#      streams has two TTFTs above it and its bucket holds one to a few: there the bound is the
#      bucket (4.4 %), see BOUNDS in scripts/e2e-native.py;
#   2. the same at 1,000 streams (60 tokens, 3 s each, started at 500 a second: all 1,000 are in
#      flight together), metronome B;
#   3. the exemplar Prometheus returns, through /api/v1/query_exemplars, exemplars on stall
#      buckets whose stream_id resolves at metronome A's /streams/{id}, to a stream that had an
#      ingress gap of exactly the exemplar's value, and exemplars on
#      metronome_hitches_total{scope="stream"} (value 1, the increment) whose stream resolves
#      with a hitch of that scope;
#   4. fleet: the three instances under load together: histogram_quantile(0.99,
#      sum(rate(ITL[window]))) over the native histograms is within 2 % of the pooled exact p99
#      of the gaps of the streams in the window, the bound alone (rate() extrapolates each
#      instance by its own scrape phase, so the pooled value may cross a bucket edge; the pooled
#      p50 falls where the 8 and 15 ms cadences overlap, on the sim's 1 ms steps, see below);
#   5. every native-histogram query of the Grafana dashboard returns a number for both points.
# "Exact" is the nearest rank (the ceil(q*n)-th smallest), the rank histogram_quantile looks for.
# The sim sleeps on tokio's 1 ms timer, so its gaps come in 1 ms steps; at 8 ms a schema-4 bucket
# (4.4 %) is narrower than a step, and where a step falls in its bucket moves the interpolated
# quantile (ITL p99 of metronome A has read 0.2 to 1.8 % high): the largest error of this run.
# Counts reach /metrics when a stream ends (or, with metrics.flush_interval, while it runs): each
# check waits until Prometheus holds every gap. Prints the errors and what each format weighs.
#
#   scripts/e2e-native.sh            # METRONOME_BIN=path to skip the release build
#
# Bounded: every wait has a deadline, and the whole run stops itself after 4 minutes (plus the
# build). Only what this script started is stopped, by process ID, on exit.
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
# shellcheck source=lib/metrics.sh
source "$ROOT/scripts/lib/metrics.sh"

checks=0
say() { printf '%s\n' "$*"; }
ok() { checks=$((checks + 1)); printf 'PASS  %s\n' "$*"; }
die() {
    printf 'FAIL  %s\n' "$*"
    for log in "$TMP"/*.log; do
        [[ -f $log ]] && { printf -- '--- %s (last lines)\n' "$(basename "$log")"; tail -n 15 "$log"; }
    done
    printf 'e2e-native: %d passed, 1 failed\n' "$checks"
    exit 1
}

# --- tools -----------------------------------------------------------------------------------
if ! command -v prometheus >/dev/null; then
    say "installing Debian prometheus"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    systemctl stop prometheus >/dev/null 2>&1 || true
fi
command -v curl >/dev/null || { apt-get update -qq && apt-get install -y -qq curl >/dev/null; }
# scripts/deploy-check-promql.py (the dashboard's queries) reads YAML.
python3 -c 'import yaml' 2>/dev/null || python3 -m pip install -q pyyaml
PROM_VERSION=$(prometheus --version 2>&1 | head -1 | sed -E 's/^prometheus, version ([0-9]+\.[0-9]+).*/\1/')
say "$(prometheus --version 2>&1 | head -1)"

BIN=${METRONOME_BIN:-}
if [[ -z $BIN ]]; then
    say "building metronome (release)"
    cargo build --release --quiet --bin metronome
    BIN=$ROOT/target/release/metronome
fi
# The whole run, not counting the build, stops itself after this long.
DEADLINE=$((SECONDS + 240))

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }
wait_for() { # description, seconds, command...
    local what=$1 limit=$((SECONDS + $2))
    shift 2
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < limit && SECONDS < DEADLINE)) || die "timed out waiting for $what"
        sleep 0.3
    done
}
CHECK="python3 $ROOT/scripts/e2e-native.py"
ITL_NAME=metronome_inter_token_latency_seconds

# --- three sims, three metronomes ------------------------------------------------------------
declare -A GAP=([a]=8ms [b]=50ms [c]=15ms) JITTER=([a]=0.3 [b]=0.15 [c]=0.15) TTFT=([a]=20ms [b]=100ms [c]=60ms) SEED=([a]=1 [b]=2 [c]=3)
declare -A PROXY ADMIN
for m in a b c; do
    sim=$(free_port)
    PROXY[$m]=$(free_port)
    ADMIN[$m]=$(free_port)
    "$BIN" sim --listen "127.0.0.1:$sim" --gap "${GAP[$m]}" --jitter "${JITTER[$m]}" --stall-prob 0.004 \
        --stall 300ms --ttft "${TTFT[$m]}" --ttft-per-prompt-token 100us --seed "${SEED[$m]}" \
        >"$TMP/sim-$m.log" 2>&1 &
    PIDS+=($!)
    cat >"$TMP/metronome-$m.toml" <<EOF
[server]
listen = "127.0.0.1:${PROXY[$m]}"
admin = "127.0.0.1:${ADMIN[$m]}"
upstream = "http://127.0.0.1:$sim"
drain_grace = "1s"
[limits]
max_connections = 4096
[readiness]
check_upstream = false
[timeline]
# Every stream of the run stays resolvable at /streams/{id}.
max_streams = 5000
[[routes]]
name = "chat"
path = "/v1/chat/completions"
match = "exact"
EOF
    "$BIN" check-config "$TMP/metronome-$m.toml" >/dev/null || die "check-config refused metronome-$m.toml"
    "$BIN" serve --config "$TMP/metronome-$m.toml" >"$TMP/metronome-$m.log" 2>&1 &
    PIDS+=($!)
done
for m in a b c; do
    wait_for "metronome $m /readyz" 20 curl -fsS "http://127.0.0.1:${ADMIN[$m]}/readyz"
done
ok "three metronomes (admins ${ADMIN[a]}, ${ADMIN[b]}, ${ADMIN[c]}) in front of sims at 8, 50 and 15 ms"

# Prompt lengths for the sim's TTFT (0.1 ms per prompt token): log-normal, median 60 tokens,
# sigma 0.5, stratified (the n lengths at the quantiles (i + 0.5) / n, shuffled), so that a run's
# TTFTs fill their distribution evenly and the check measures the histogram, not sampling luck.
# One file per phase, as the probe sends a file's lines in order (cycling).
python3 - "$TMP" <<'EOF'
import random, statistics, sys
rng = random.Random(27)
for n in (300, 1000):
    dist = statistics.NormalDist(mu=0, sigma=0.5)
    tokens = [max(1, round(60 * 2.718281828459045 ** dist.inv_cdf((i + 0.5) / n))) for i in range(n)]
    rng.shuffle(tokens)
    with open(f"{sys.argv[1]}/prompts-{n}.txt", "w") as f:
        f.writelines(("word " * t).strip()[: 4 * t - 1] + "\n" for t in tokens)
EOF

# --- two Prometheus servers ------------------------------------------------------------------
# Native histograms: 2.40 to 3.7 by feature flag (which also makes the scrape ask for protobuf
# first), 3.8 and later by scrape_native_histograms (and protobuf first by scrape_protocols).
NATIVE_FLAGS=(--enable-feature=native-histograms)
NATIVE_YAML=""
if [[ $(printf '%s\n3.8\n' "$PROM_VERSION" | sort -V | head -1) == 3.8 ]]; then
    NATIVE_FLAGS=()
    NATIVE_YAML=$'  scrape_native_histograms: true\n  scrape_protocols: [PrometheusProto, OpenMetricsText1.0.0, PrometheusText0.0.4]'
fi
start_prometheus() { # name, native|plain, targets (JSON list), extra flags...
    local name=$1 mode=$2 targets=$3
    shift 3
    local port yaml=""
    [[ $mode == native ]] && yaml=$NATIVE_YAML
    port=$(free_port)
    mkdir -p "$TMP/$name"
    cat >"$TMP/$name/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
- job_name: fleet
$yaml
  static_configs:
  - targets: $targets
EOF
    prometheus --config.file="$TMP/$name/prometheus.yml" --storage.tsdb.path="$TMP/$name/data" \
        --web.listen-address="127.0.0.1:$port" --log.level=warn "$@" >"$TMP/$name.log" 2>&1 &
    PIDS+=($!)
    wait_for "Prometheus $name to start" 30 curl -fsS "http://127.0.0.1:$port/-/ready"
    eval "${name^^}=http://127.0.0.1:$port"
}
start_prometheus native native "[\"127.0.0.1:${ADMIN[a]}\", \"127.0.0.1:${ADMIN[b]}\", \"127.0.0.1:${ADMIN[c]}\"]" \
    "${NATIVE_FLAGS[@]}"
# The exemplar server gets no native-histogram setting: it scrapes OpenMetrics, its default.
start_prometheus exemplars plain "[\"127.0.0.1:${ADMIN[a]}\"]" --enable-feature=exemplar-storage
ok "Prometheus $NATIVE (native histograms: ${NATIVE_FLAGS[*]:-scrape_native_histograms}) and $EXEMPLARS (exemplar storage, OpenMetrics)"
wait_for "the native Prometheus to scrape metronome a" 20 \
    sh -c "curl -fsS '$NATIVE/api/v1/query?query=up' | grep -q '\"1\"'"
STARTED=$(date +%s)

probe() { # metronome, log name, prompts (300 or 1000), probe arguments...
    local m=$1 log=$2 prompts=$3
    shift 3
    ((SECONDS < DEADLINE)) || die "out of time before the $log run"
    timeout $((DEADLINE - SECONDS)) "$BIN" probe --url "http://127.0.0.1:${PROXY[$m]}" --model sim-model --dataset "$TMP/prompts-$prompts.txt" \
        --progress-interval 600s "$@" >"$TMP/$log.log" 2>&1
}
selector() { printf 'instance="127.0.0.1:%s",route="chat",point="ingress"' "${ADMIN[$1]}"; }

# --- 1. one stream at a time -----------------------------------------------------------------
probe a probe-one 300 -c 1 -n 200 --max-tokens 64 || die "the one-at-a-time probe failed"
metrics_when_idle "127.0.0.1:${ADMIN[a]}" "$TMP/a.prom" || die "metronome a still has streams in flight"
((SECONDS < DEADLINE)) || die "out of time"
$CHECK quantiles --prom "$NATIVE" --admin "127.0.0.1:${ADMIN[a]}" --select "$(selector a)" \
    --label "one stream at a time" || die "native quantiles, one stream at a time"
ok "one stream at a time: native ITL p50, p99 and TTFT p50 within 2 % of the exact ones (a quantile in a bucket of under 50 samples, and TTFT p99, within its bucket)"

# --- 3. exemplars (metronome a's stalls) -----------------------------------------------------
wait_for "exemplars on stall buckets" 20 $CHECK exemplar --prom "$EXEMPLARS" \
    --admin "127.0.0.1:${ADMIN[a]}" --select "$(selector a)" --since "$STARTED"
$CHECK exemplar --prom "$EXEMPLARS" --admin "127.0.0.1:${ADMIN[a]}" --select "$(selector a)" \
    --since "$STARTED" || die "exemplars"
ok "query_exemplars: stall-bucket exemplars whose stream_id resolves at /streams/{id}"
# One stream at a time: every hitch (the stalls) is the stream's own.
HITCH_SELECT="instance=\"127.0.0.1:${ADMIN[a]}\",route=\"chat\",scope=\"stream\""
wait_for "an exemplar on metronome_hitches_total" 20 $CHECK hitch-exemplar --prom "$EXEMPLARS" \
    --admin "127.0.0.1:${ADMIN[a]}" --select "$HITCH_SELECT" --since "$STARTED"
$CHECK hitch-exemplar --prom "$EXEMPLARS" --admin "127.0.0.1:${ADMIN[a]}" \
    --select "$HITCH_SELECT" --since "$STARTED" || die "hitch exemplars"
ok "query_exemplars: metronome_hitches_total{scope=\"stream\"} exemplars whose stream_id resolves at /streams/{id} with a stream hitch"

# --- 2. a thousand streams at once -----------------------------------------------------------
probe b probe-thousand 1000 --rate 500 -n 1000 --max-tokens 60 || die "the 1,000-stream probe failed"
metrics_when_idle "127.0.0.1:${ADMIN[b]}" "$TMP/b.prom" || die "metronome b still has streams in flight"
((SECONDS < DEADLINE)) || die "out of time"
$CHECK quantiles --prom "$NATIVE" --admin "127.0.0.1:${ADMIN[b]}" --select "$(selector b)" \
    --label "1,000 streams" || die "native quantiles, 1,000 streams"
ok "1,000 streams: native ITL p50, p99 and TTFT p50 within 2 % of the exact ones (a quantile in a bucket of under 50 samples, and TTFT p99, within its bucket)"

# --- 4. the fleet ----------------------------------------------------------------------------
# c's series must exist before the window opens (rate needs a sample before the first count).
probe c probe-warmup 300 -n 1 --max-tokens 8 || die "the warm-up probe failed"
FLEET='job="fleet",route="chat",point="ingress"'
ALL=("127.0.0.1:${ADMIN[a]}" "127.0.0.1:${ADMIN[b]}" "127.0.0.1:${ADMIN[c]}")
metrics_when_idle "${ALL[2]}" "$TMP/c.prom" || die "metronome c still has streams in flight"
$CHECK settle --prom "$NATIVE" --admin "${ALL[@]}" --select "$FLEET" || die "before the fleet run"
$CHECK ids "${ALL[@]}" >"$TMP/before-fleet.txt"
WINDOW_START=$(date +%s.%N)
sleep 2.5 # two scrapes inside the window before its first count
fleet=()
for m in a b c; do
    probe $m "probe-fleet-$m" 1000 -c 8 --duration 10s --max-tokens 40 &
    fleet+=($!)
    PIDS+=($!)
done
for pid in "${fleet[@]}"; do wait "$pid" || die "a fleet probe failed"; done
for admin in "${ALL[@]}"; do
    metrics_when_idle "$admin" "$TMP/fleet.prom" || die "$admin still has streams in flight"
done
((SECONDS < DEADLINE)) || die "out of time"
$CHECK quantiles --prom "$NATIVE" --admin "${ALL[@]}" --select "$FLEET" --metrics ITL --quantiles 0.99 \
    --exclude "$TMP/before-fleet.txt" --rate-since "$WINDOW_START" \
    --label "fleet (8, 50 and 15 ms pooled)" || die "native quantiles over the fleet"
ok "fleet: histogram_quantile(0.99, sum(rate(native ITL))) within 2 % of the pooled exact p99"

# --- 5. the dashboard's native-histogram panels ---------------------------------------------
panels=0
while IFS=$'\t' read -r title expr; do
    [[ $title == *"(native histogram)" ]] || continue
    panels=$((panels + 1))
    curl -fsS --get "$NATIVE/api/v1/query" --data-urlencode "query=$expr" | python3 -c '
import json, math, sys
r = json.load(sys.stdin)["data"]["result"]
points = sorted(x["metric"].get("point", "") for x in r if math.isfinite(float(x["value"][1])))
sys.exit(0 if points == ["egress", "ingress"] else 1)' || die "dashboard panel \"$title\" has no number for both points: $expr"
done < <(python3 scripts/deploy-check-promql.py dashboard-exprs)
((panels >= 3)) || die "the dashboard has $panels native-histogram queries, expected at least 3"
ok "the dashboard's $panels native-histogram queries return a number for ingress and egress"

# --- what it cost (figures only) -------------------------------------------------------------
A="127.0.0.1:${ADMIN[a]}"
size() { curl -fsS ${1:+-H "Accept: $1"} "http://$A/metrics" | wc -c; }
series() { # Prometheus, metric prefix -> series of metronome a
    curl -fsS --get "$1/api/v1/query" --data-urlencode "query=count({instance=\"$A\", __name__=~\"$2.*\"})" |
        python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)'
}
say "      metronome a's /metrics: text 0.0.4 $(size '') bytes, OpenMetrics $(size 'application/openmetrics-text; version=1.0.0') bytes, protobuf $(size 'application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited') bytes"
say "      series of $ITL_NAME for metronome a: $(series "$NATIVE" "$ITL_NAME") in the native Prometheus, $(series "$EXEMPLARS" "$ITL_NAME") in the classic one"

say "e2e-native: $checks passed, 0 failed ($((SECONDS)) s)"
