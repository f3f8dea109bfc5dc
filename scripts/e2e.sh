#!/usr/bin/env bash
# End-to-end: the release binary with real clients on loopback.
#  1. curl through metronome gets a stream byte-identical (sha256) to the same stream fetched
#     directly, over HTTP/1.1 and HTTP/2;
#  2. the sim streams through metronome to curl and to `metronome probe` (with a CI gate);
#  3. /metrics passes `promtool check metrics` and shows the streams at ingress and egress;
#  4. check-config accepts the example and names every problem of a bad file (exit 2);
#  5. SIGTERM drains and exits 0.
# Installs curl and promtool (Debian package `prometheus`) when missing. Talks only to 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."

need() { command -v "$1" >/dev/null 2>&1; }
if ! need curl || ! need promtool; then
  echo "installing curl and promtool (Debian package prometheus)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl prometheus >/dev/null
fi

cargo build --release --quiet
BIN=target/release/metronome
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { # URL
  for _ in $(seq 1 100); do curl -fs -o /dev/null "$1" && return 0; sleep 0.1; done
  echo "FAIL: $1 never answered"; exit 1
}
wait_port() { # PORT
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
  echo "FAIL: nothing listens on 127.0.0.1:$1"; exit 1
}
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; exit 1; }
. scripts/lib/metrics.sh

FIX_PORT=$(free_port); SIM_PORT=$(free_port); PROXY_PORT=$(free_port); ADMIN_PORT=$(free_port)
FIXTURE=tests/fixtures/openai_chat_crlf_e2e.sse
python3 scripts/fixture_upstream.py "$FIX_PORT" "$FIXTURE" & PIDS+=($!)
$BIN sim --listen "127.0.0.1:$SIM_PORT" --gap 20ms --ttft 20ms --stall-at 10 --stall 300ms >"$WORK/sim.log" 2>&1 & PIDS+=($!)
cat >"$WORK/metronome.toml" <<TOML
[server]
listen = "127.0.0.1:$PROXY_PORT"
admin = "127.0.0.1:$ADMIN_PORT"
upstream = "http://127.0.0.1:$SIM_PORT"
drain_grace = "5s"
[[routes]]
name = "chat"
path = "/v1/chat/completions"
match = "exact"
[[routes]]
name = "fixture"
path = "/fixture"
upstream = "http://127.0.0.1:$FIX_PORT"
TOML
$BIN check-config "$WORK/metronome.toml" >/dev/null || fail "check-config refused the e2e config"
$BIN serve --config "$WORK/metronome.toml" >"$WORK/serve.log" 2>&1 & SERVE_PID=$!; PIDS+=($SERVE_PID)
wait_http "http://127.0.0.1:$ADMIN_PORT/healthz"
wait_http "http://127.0.0.1:$SIM_PORT/health"
wait_port "$FIX_PORT"

# 1. Byte identity.
direct=$(curl -sN -X POST "http://127.0.0.1:$FIX_PORT/fixture" -d '{}' | sha256sum | cut -d' ' -f1)
expected=$(sha256sum "$FIXTURE" | cut -d' ' -f1)
[ "$direct" = "$expected" ] || fail "the fixture upstream does not serve the fixture"
proxied=$(curl -sN -X POST "http://127.0.0.1:$PROXY_PORT/fixture" -d '{}' | sha256sum | cut -d' ' -f1)
[ "$proxied" = "$direct" ] || fail "HTTP/1.1 through metronome differs: $proxied != $direct"
pass "HTTP/1.1 stream through metronome is byte-identical (sha256 $direct)"
proxied2=$(curl -sN --http2-prior-knowledge -X POST "http://127.0.0.1:$PROXY_PORT/fixture" -d '{}' | sha256sum | cut -d' ' -f1)
[ "$proxied2" = "$direct" ] || fail "HTTP/2 through metronome differs: $proxied2 != $direct"
pass "HTTP/2 stream through metronome is byte-identical"
headers=$(curl -sN -D - -o /dev/null -X POST "http://127.0.0.1:$PROXY_PORT/fixture" -d '{}')
echo "$headers" | grep -qi '^x-metronome-stream-id: [0-9a-f]\{32\}' || fail "no stream ID header: $headers"
pass "metered responses carry x-metronome-stream-id"

# 2. The sim through metronome, to curl and to the probe with a gate.
body=$(curl -sN "http://127.0.0.1:$PROXY_PORT/v1/chat/completions" -d '{"model":"sim-model","stream":true,"max_tokens":12}')
echo "$body" | grep -q 'data: \[DONE\]' || fail "the sim stream through metronome did not end with [DONE]"
pass "sim -> metronome -> curl streams to [DONE]"
$BIN probe --url "http://127.0.0.1:$PROXY_PORT/v1/chat/completions" --requests 6 --concurrency 3 \
  --max-tokens 20 --json "$WORK/probe.json" --assert 'errors<1,itl_p50<100ms,stall_pct>1' >"$WORK/probe.txt" \
  || { cat "$WORK/probe.txt"; fail "probe gates failed"; }
python3 - "$WORK/probe.json" <<'PY' || fail "probe JSON keys"
import json, sys
report = json.load(open(sys.argv[1]))
keys = {"requests","errors","ttft_ms","ttfo_ms","phases","itl_ms","tokens_per_second","stall_pct","stalled_streams_pct","jank_ratio","stream_jank_ratio","verdict","reading_bands","throughput","meta","gates","result"}
assert set(report) == keys, sorted(report)
assert report["requests"] == 6 and report["errors"] == 0, report
assert [g["result"] for g in report["gates"]] == ["pass"] * 3, report["gates"]
assert report["result"]["exit_code"] == 0 and report["result"]["headline"] == report["verdict"], report["result"]
PY
pass "probe through metronome: 6 streams, gates errors<1 itl_p50<100ms stall_pct>1 hold"
$BIN probe --url "http://127.0.0.1:$PROXY_PORT/v1/chat/completions" --requests 2 --max-tokens 12 \
  --assert 'itl_max<100ms' >/dev/null 2>&1 && fail "a gate that must fail passed" || rc=$?
[ "${rc:-0}" = 1 ] || fail "a failed gate must exit 1, got ${rc:-0}"
pass "a failing gate exits 1"

# 3. The metrics.
metrics_when_idle "127.0.0.1:$ADMIN_PORT" "$WORK/metrics.txt" || fail "streams never ended"
promtool check metrics <"$WORK/metrics.txt" || fail "promtool check metrics"
pass "/metrics passes promtool check metrics"
for point in ingress egress; do
  grep -q "metronome_inter_token_latency_seconds_count{model=\"sim-model\",phase=\"content\",point=\"$point\",route=\"chat\"}" "$WORK/metrics.txt" \
    || fail "no ITL at $point"
  grep -q "metronome_stalls_total{model=\"sim-model\",phase=\"content\",point=\"$point\",route=\"chat\"} 9" "$WORK/metrics.txt" \
    || fail "expected 9 stalls at $point (one per sim stream): $(grep stalls_total "$WORK/metrics.txt")"
done
grep -q 'metronome_streams_total{finish_reason="stop",model="meta-llama/Llama-3.1-8B-Instruct",outcome="complete",route="fixture"} 3' "$WORK/metrics.txt" \
  || fail "fixture streams: $(grep streams_total "$WORK/metrics.txt")"
grep -q 'metronome_output_tokens_total{model="meta-llama/Llama-3.1-8B-Instruct",route="fixture",source="usage"} 120' "$WORK/metrics.txt" \
  || fail "fixture tokens: $(grep output_tokens "$WORK/metrics.txt")"
grep -q 'metronome_streams_active{route="chat"} 0' "$WORK/metrics.txt" || fail "streams still active"
pass "ITL and stalls at ingress and egress, outcomes, usage tokens, gauge back at 0"

# 4. check-config.
$BIN check-config config/metronome.toml >/dev/null || fail "the documented example is refused"
printf '[server]\nlisten = "nowhere"\n[[routes]]\nname = "x"\npath = "nopath"\n' >"$WORK/bad.toml"
set +e; out=$($BIN check-config "$WORK/bad.toml" 2>&1); rc=$?; set -e
[ "$rc" = 2 ] || fail "check-config on a bad file must exit 2, got $rc"
echo "$out" | grep -q 'server.listen: line 2, column 10: ' && echo "$out" | grep -q 'routes\[0\].path: line 5, column 8: ' \
  || fail "check-config: $out"
pass "check-config: example OK, bad file exit 2 naming server.listen and routes[0].path with their lines"

# 5. Drain on SIGTERM.
kill -TERM "$SERVE_PID"
set +e; wait "$SERVE_PID"; rc=$?; set -e
[ "$rc" = 0 ] || fail "serve exited $rc on SIGTERM"
pass "SIGTERM: serve drains and exits 0"
echo "e2e: all checks passed"
