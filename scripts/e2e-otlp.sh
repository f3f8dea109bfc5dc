#!/usr/bin/env bash
# End to end, on 127.0.0.1 only: metronome sim -> metronome serve (with [otlp]) -> metronome
# probe, with a real OTLP/HTTP receiver (scripts/otlp_receiver.py, decoding with PyPI's
# opentelemetry-proto, the official protobufs). Checks that:
#   1. the exported exponential histograms (scale 4) have the same count and sum as the
#      Prometheus histograms of /metrics for the same series, and their buckets add up;
#   2. with metrics.names = "both" and OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental,
#      the GenAI histograms come under their latest semconv names with exactly the semconv
#      attributes (and on /metrics in Prometheus's translation, compared by check 1);
#   3. the resource carries service.name, service.instance.id and the downward API's pod name;
#   4. with [otlp] traces = true, a stream whose upstream stalls once has one server span that
#      continues the client's traceparent, with one stall event per point whose length is the
#      stall's, and metronome's span reached the upstream as its parent; the tail decision keeps
#      an unsampled trace that stalled and drops one that did not;
#   5. with the receiver down, metronome keeps proxying and counts the failed exports
#      (metronome_otlp_exports_total{signal="metrics",result="failed"}) and the spans dropped;
#   6. (run before 5) a second instance with otlp.protocol = "grpc" exports the same over the
#      collector's gRPC services (grpcio with opentelemetry-proto's servicers): histogram counts
#      equal its /metrics, its stalled stream's span, the configured header as gRPC metadata.
#
#   scripts/e2e-otlp.sh            # METRONOME_BIN=path to skip the release build
#
# Bounded: every wait has a deadline, and a watchdog stops the run after 180 s (plus the build).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

checks=0
pass() { checks=$((checks + 1)); echo "PASS  $*"; }
fail() {
  echo "FAIL  $*"
  for log in "$WORK"/*.log; do [[ -f $log ]] && { echo "--- $(basename "$log")"; tail -n 15 "$log"; }; done
  echo "e2e-otlp: $checks passed, 1 failed"
  exit 1
}
python3 -c 'import opentelemetry.proto.collector.metrics.v1.metrics_service_pb2' 2>/dev/null \
  || python3 -m pip install -q opentelemetry-proto
python3 -c 'import grpc' 2>/dev/null || python3 -m pip install -q grpcio 2>/dev/null \
  || python3 -m pip install -q --break-system-packages grpcio

if [[ -z ${METRONOME_BIN:-} ]]; then
  cargo build --release --quiet
  METRONOME_BIN=$ROOT/target/release/metronome
fi
BIN=$METRONOME_BIN
WORK=$(mktemp -d)
PIDS=()
RECEIVER_PID=
cleanup() {
  local status=$?
  for pid in "${PIDS[@]}" $RECEIVER_PID; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
  exit "$status"
}
trap cleanup EXIT
( sleep 180; echo "FAIL  e2e-otlp: still running after 180s"; kill -TERM $$ ) 2>/dev/null &
PIDS+=($!)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { # URL
  for _ in $(seq 1 100); do curl -fs -o /dev/null "$1" && return 0; sleep 0.1; done
  fail "nothing answers $1"
}
# The value of one sample line of a /metrics scrape (0 when absent).
sample() { # FILE LINE-PREFIX
  awk -v p="$2" 'index($0, p) == 1 { print $NF; found = 1 } END { if (!found) print 0 }' "$1"
}
. scripts/lib/metrics.sh
# Waits up to 5 s for a metrics export that DUMP (the receiver's /dump or /dump/grpc) received
# after the Unix time SINCE and, with TRACE, for that trace's one span; fails with WHAT.
export_after() { # DUMP SINCE WHAT [TRACE]
  local at spans=1
  for _ in $(seq 1 50); do
    at=$(curl -fs "$1/metrics" | python3 -c 'import json,sys; print(json.load(sys.stdin)["metrics_at"])')
    [[ -n ${4:-} ]] && spans=$(python3 scripts/otlp_receiver.py count-spans "$1" "$4")
    python3 -c "import sys; sys.exit(0 if $at > $2 and $spans == 1 else 1)" && return 0
    sleep 0.1
  done
  fail "$3"
}

FIXTURE_PORT=$(free_port); SIM_PORT=$(free_port); PROXY_PORT=$(free_port); ADMIN_PORT=$(free_port); OTLP_PORT=$(free_port)
GRPC_PORT=$(free_port); GRPC_PROXY_PORT=$(free_port); GRPC_ADMIN_PORT=$(free_port)
ADMIN=127.0.0.1:$ADMIN_PORT
RECEIVER=http://127.0.0.1:$OTLP_PORT

python3 scripts/otlp_receiver.py serve "$OTLP_PORT" "$GRPC_PORT" >"$WORK/receiver.log" 2>&1 &
RECEIVER_PID=$!
python3 scripts/otlp_receiver.py upstream "$FIXTURE_PORT" >"$WORK/fixture.log" 2>&1 &
PIDS+=($!)
"$BIN" sim --listen "127.0.0.1:$SIM_PORT" --gap 5ms --tokens 40 --ttft 20ms >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
cat >"$WORK/metronome.toml" <<TOML
[server]
listen = "127.0.0.1:$PROXY_PORT"
admin = "$ADMIN"
upstream = "http://127.0.0.1:$SIM_PORT"
drain_grace = "1s"
[metrics]
names = "both"
[otlp]
endpoint = "$RECEIVER"
interval = "500ms"
timeout = "1s"
headers = { "x-e2e" = "otlp" }
traces = true
[[routes]]
name = "chat"
path = "/v1/chat/completions"
match = "exact"
[[routes]]
name = "traced"
path = "/v1/traced"
match = "exact"
upstream = "http://127.0.0.1:$FIXTURE_PORT"
TOML
OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental POD_NAME=metronome-e2e-0 POD_NAMESPACE=e2e \
  "$BIN" serve --config "$WORK/metronome.toml" >"$WORK/serve.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$SIM_PORT/health"
wait_http "http://$ADMIN/healthz"
wait_http "$RECEIVER/dump/metrics"

probe() { # NAME REQUESTS
  "$BIN" probe --url "http://127.0.0.1:$PROXY_PORT/v1/chat/completions" --requests "$2" \
    --concurrency 4 >"$WORK/$1.txt" 2>&1 || { cat "$WORK/$1.txt"; fail "probe $1 failed"; }
}

# 1 to 3: streams, then a scrape once they are all recorded, then an export made after it.
probe first 12
metrics_when_idle "$ADMIN" "$WORK/scrape1.txt" || fail "streams still in flight"
export_after "$RECEIVER/dump" "$(date +%s.%N)" "no OTLP export within 5 s of the scrape"
out=$(python3 scripts/otlp_receiver.py check-metrics "$WORK/scrape1.txt" "$RECEIVER/dump/metrics") \
  || fail "exponential histograms differ from /metrics: $out"
pass "$out"
grep -q '^gen_ai_server_time_to_first_token_seconds_count{' "$WORK/scrape1.txt" \
  || fail "/metrics lacks gen_ai_server_time_to_first_token_seconds"
out=$(python3 scripts/otlp_receiver.py check-semconv "$RECEIVER/dump/metrics" "$SIM_PORT" sim-model) \
  || fail "semconv names: $out"
pass "$out"
curl -fs "$RECEIVER/dump/metrics" | python3 -c '
import json, sys
rm = json.load(sys.stdin)["metrics"]["resourceMetrics"][0]
a = {kv["key"]: kv["value"]["stringValue"] for kv in rm["resource"]["attributes"]}
assert a["service.name"] == "metronome", a
assert a["service.instance.id"] == "metronome-e2e-0", a
assert a["k8s.pod.name"] == "metronome-e2e-0" and a["k8s.namespace.name"] == "e2e", a
' || fail "resource attributes"
pass "resource: service.name, service.instance.id and k8s attributes from the downward API"

# 4: spans. A sampled trace through the stalling upstream, then two unsampled ones.
stream() { # PATH TRACEPARENT
  curl -fsN -X POST -H 'content-type: application/json' -H "traceparent: $2" \
    -d '{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}' \
    "http://127.0.0.1:$PROXY_PORT$1" >/dev/null || fail "stream $1 failed"
}
PARENT=00f067aa0ba902b7
SAMPLED=4bf92f3577b34da6a3ce929d0e0e4736
UNSAMPLED_PLAIN=5bf92f3577b34da6a3ce929d0e0e4736
UNSAMPLED_STALLED=6bf92f3577b34da6a3ce929d0e0e4736
stream /v1/traced "00-$SAMPLED-$PARENT-01"
stream /v1/chat/completions "00-$UNSAMPLED_PLAIN-$PARENT-00"
stream /v1/traced "00-$UNSAMPLED_STALLED-$PARENT-00"
for _ in $(seq 1 50); do
  [[ $(python3 scripts/otlp_receiver.py count-spans "$RECEIVER/dump" "$UNSAMPLED_STALLED") == 1 ]] && break
  sleep 0.1
done
out=$(python3 scripts/otlp_receiver.py check-trace "$RECEIVER/dump" "http://127.0.0.1:$FIXTURE_PORT" "$SAMPLED" "$PARENT") \
  || fail "span: $out"
pass "$out"
kept=$(python3 scripts/otlp_receiver.py count-spans "$RECEIVER/dump" "$UNSAMPLED_STALLED")
plain=$(python3 scripts/otlp_receiver.py count-spans "$RECEIVER/dump" "$UNSAMPLED_PLAIN")
[[ $kept == 1 && $plain == 0 ]] || fail "tail decision: unsampled+stalled $kept span(s) (want 1), unsampled $plain (want 0)"
pass "tail decision: an unsampled trace is kept when it stalled, dropped when it did not"

# 6 (before the receiver goes down): the same exports over gRPC, from a second instance.
sed -e "s|^listen = .*|listen = \"127.0.0.1:$GRPC_PROXY_PORT\"|" -e "s|^admin = .*|admin = \"127.0.0.1:$GRPC_ADMIN_PORT\"|" \
  -e "s|^endpoint = .*|endpoint = \"http://127.0.0.1:$GRPC_PORT\"\nprotocol = \"grpc\"|" \
  "$WORK/metronome.toml" >"$WORK/metronome-grpc.toml"
OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental POD_NAME=metronome-e2e-1 POD_NAMESPACE=e2e \
  "$BIN" serve --config "$WORK/metronome-grpc.toml" >"$WORK/serve-grpc.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$GRPC_ADMIN_PORT/healthz"
"$BIN" probe --url "http://127.0.0.1:$GRPC_PROXY_PORT/v1/chat/completions" --requests 6 \
  --concurrency 3 >"$WORK/grpc.txt" 2>&1 || { cat "$WORK/grpc.txt"; fail "probe over the gRPC instance failed"; }
GRPC_TRACE=7bf92f3577b34da6a3ce929d0e0e4736
curl -fsN -X POST -H 'content-type: application/json' -H "traceparent: 00-$GRPC_TRACE-$PARENT-01" \
  -d '{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}' \
  "http://127.0.0.1:$GRPC_PROXY_PORT/v1/traced" >/dev/null || fail "traced stream over the gRPC instance failed"
metrics_when_idle "127.0.0.1:$GRPC_ADMIN_PORT" "$WORK/scrape-grpc.txt" || fail "gRPC instance: streams still in flight"
export_after "$RECEIVER/dump/grpc" "$(date +%s.%N)" \
  "no OTLP/gRPC metrics export and span within 5 s of the scrape" "$GRPC_TRACE"
out=$(python3 scripts/otlp_receiver.py check-metrics "$WORK/scrape-grpc.txt" "$RECEIVER/dump/grpc/metrics") \
  || fail "over gRPC, exponential histograms differ from /metrics: $out"
out_trace=$(python3 scripts/otlp_receiver.py check-trace "$RECEIVER/dump/grpc" "http://127.0.0.1:$FIXTURE_PORT" "$GRPC_TRACE" "$PARENT") \
  || fail "span over gRPC: $out_trace"
curl -fs "$RECEIVER/dump/grpc/metrics" | python3 -c '
import json, sys
h = json.load(sys.stdin)["headers"]
assert h.get("x-e2e") == "otlp", h
assert h.get("user-agent", "").startswith("metronome/") or any(v.startswith("metronome/") for v in h.values()), h
' || fail "gRPC metadata: the configured header did not arrive"
exported=$(sample "$WORK/scrape-grpc.txt" 'metronome_otlp_exports_total{result="ok",signal="metrics"}')
python3 -c "import sys; sys.exit(0 if $exported >= 1 else 1)" || fail "gRPC instance counted $exported ok exports"
pass "over gRPC: $out; $out_trace; the configured header arrived as metadata"

# 5: the receiver goes away; the proxy goes on and counts the failed exports.
kill "$RECEIVER_PID"; wait "$RECEIVER_PID" 2>/dev/null || true; RECEIVER_PID=
curl -fs "http://$ADMIN/metrics" >"$WORK/before.txt"
failed_before=$(sample "$WORK/before.txt" 'metronome_otlp_exports_total{result="failed",signal="metrics"}')
spans_before=$(sample "$WORK/before.txt" 'metronome_otlp_spans_dropped_total{reason="export_failed"}')
probe down 6
metrics_when_idle "$ADMIN" "$WORK/scrape2.txt" || fail "streams still in flight with the receiver down"
sleep 1.5
curl -fs "http://$ADMIN/metrics" >"$WORK/scrape3.txt"
# Summed over finish_reason: the sim ends a stream by its request's max_tokens or its own length.
complete=$(awk '/^metronome_streams_total[{]/ && /model="sim-model"/ && /outcome="complete"/ && /route="chat"/ { s += $NF } END { print s + 0 }' "$WORK/scrape3.txt")
[[ $complete == 19 ]] || fail "expected 19 complete streams with the receiver down, saw $complete"
failed=$(sample "$WORK/scrape3.txt" 'metronome_otlp_exports_total{result="failed",signal="metrics"}')
python3 -c "import sys; sys.exit(0 if $failed >= $failed_before + 2 else 1)" \
  || fail "failed exports went from $failed_before to $failed, expected at least 2 more"
spans_lost=$(sample "$WORK/scrape3.txt" 'metronome_otlp_spans_dropped_total{reason="export_failed"}')
python3 -c "import sys; sys.exit(0 if $spans_lost >= $spans_before + 6 else 1)" \
  || fail "spans dropped for failed exports went from $spans_before to $spans_lost, expected 6 more"
pass "receiver down: all 19 chat streams complete, failed exports counted ($failed_before -> $failed), spans dropped counted ($spans_before -> $spans_lost)"

echo "e2e-otlp: $checks passed, 0 failed"
