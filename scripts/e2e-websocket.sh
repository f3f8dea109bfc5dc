#!/usr/bin/env bash
# End-to-end for the tools' WebSocket: `metronome sim` serving the Responses API's WebSocket
# mode and the Realtime API, driven by clients that are not metronome's own and by
# `metronome probe --websocket`.
#  1. Python's `websockets` client (scripts/ws_crosscheck.py): two responses on one Responses
#     socket, a text and a spoken response on one Realtime socket, exact delta counts, the
#     completed output equal to the deltas, usage; with permessage-deflate offered, and not;
#  2. a sim that fragments every message over 256 bytes and closes each socket with 4000 after
#     two responses: the same counts, and the close code and reason as chosen;
#  3. the openai SDK's Realtime client and its Responses WebSocket client, offline against the
#     sim's base URL;
#  4. `metronome probe --websocket` for both APIs, 2 responses per socket, its JSON report: no
#     error, the token events of every phase exactly as the sim's flags say.
#  5. the tunnel, on both HTTP/1.1 servers (`server.http1_server`): Python's `websockets` client
#     and server (scripts/ws_tunnel_check.py) directly and through `metronome serve`, with
#     permessage-deflate negotiated and not: the transcripts (every message, the 1 MiB one by
#     its SHA-256, fragments, ping and pong, the server's close code and reason, the
#     negotiated extension and subprotocol) are identical both ways;
#  6. checks 1 and 3 again with metronome in front of the sim (the same counts through the
#     tunnel), and the probe through it: metronome's streams by format and outcome.
# Installs the pip packages `websockets` and `openai` when missing. Talks only to 127.0.0.1.
#
#   bash scripts/e2e-websocket.sh
set -euo pipefail
cd "$(dirname "$0")/.."

pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; exit 1; }

python3 -c 'import websockets, openai' 2>/dev/null \
  || python3 -m pip install -q websockets openai 2>/dev/null \
  || python3 -m pip install -q --break-system-packages websockets openai

# METRONOME_BIN runs another build (a debug one while working on the script).
if [ -z "${METRONOME_BIN:-}" ]; then cargo build --release --quiet; fi
BIN=${METRONOME_BIN:-$PWD/target/release/metronome}
. scripts/lib/loopback.sh

TOKENS=12
start_sim "$BIN" --gap 2ms --ttft 5ms --tokens "$TOKENS"
python3 scripts/ws_crosscheck.py "http://127.0.0.1:$sim_port" "$TOKENS" --sdk \
  || fail "Python's websockets and the openai SDK against the sim"
pass "websockets and the openai SDK: responses and realtime, deflate off"
python3 scripts/ws_crosscheck.py "http://127.0.0.1:$sim_port" "$TOKENS" --deflate \
  || fail "Python's websockets with permessage-deflate"
pass "websockets: responses and realtime, permessage-deflate"
kill "$sim"

start_sim "$BIN" --gap 2ms --ttft 5ms --tokens "$TOKENS" --ws-fragment 256 \
  --ws-close "4000:two is enough" --ws-close-after 2
python3 scripts/ws_crosscheck.py "http://127.0.0.1:$sim_port" "$TOKENS" --deflate \
  --close "4000:two is enough" || fail "fragmented messages and the server's close"
pass "websockets: fragmented messages reassembled, the server's close code and reason"
kill "$sim"

# The probe: R reasoning, C answer and one tool call of 3 argument tokens per response.
R=4 C=10 A=3
start_sim "$BIN" --gap 2ms --ttft 5ms --tokens "$C" --reasoning-tokens "$R" \
  --responses-reasoning text --tool-calls 1 --tool-call-tokens "$A"
cat >"$work/body.json" <<JSON
{"model": "sim-model", "messages": [{"role": "user", "content": "Hi"}]}
JSON
for api in responses realtime; do
  "$BIN" probe --url "ws://127.0.0.1:$sim_port/v1/$api" --body "$work/body.json" -n 4 -c 2 \
    --responses-per-socket 2 --realtime-output text --json "$work/$api.json" \
    --progress-interval 0s >"$work/$api.txt" || fail "probe --websocket $api: $(cat "$work/$api.txt")"
  reasoning=$R
  [ "$api" = realtime ] && reasoning=0 # the Realtime API streams no reasoning
  python3 - "$work/$api.json" "$reasoning" "$C" "$A" <<'PY' || fail "probe --websocket $api: the JSON report"
import json, sys
report = json.load(open(sys.argv[1]))
r, c, a = (int(x) for x in sys.argv[2:])
assert report["requests"] == 4 and report["errors"] == 0, report
phases = report["phases"]
expected = {"content": 4 * c, "tool_call": 4 * a}
if r:
    expected["reasoning"] = 4 * r
got = {phase: figures["token_events"] for phase, figures in phases.items()}
assert got == expected, (got, expected)
assert report["ttft_ms"]["p50"] is not None
PY
  pass "probe --websocket $api: 4 streams, 2 per socket, every phase's token events exact"
done
# metronome serve on $1 (native or hyper) in front of 127.0.0.1:$2; sets `proxy_port`,
# `admin_port` and `serve` (its pid, also in `pids`).
start_serve() {
  proxy_port=$(free_port)
  admin_port=$(free_port)
  cat >"$work/serve.toml" <<TOML
[server]
listen = "127.0.0.1:$proxy_port"
admin = "127.0.0.1:$admin_port"
upstream = "http://127.0.0.1:$2"
http1_server = "$1"
drain_grace = "1s"

[readiness]
check_upstream = false
TOML
  "$BIN" serve --config "$work/serve.toml" >"$work/serve.log" 2>&1 &
  serve=$!
  pids+=("$serve")
  wait_port "$proxy_port"
}

stop_serve() {
  kill "$serve" 2>/dev/null || true
  wait "$serve" 2>/dev/null || true
}

ws_port=$(free_port)
python3 scripts/ws_tunnel_check.py serve "$ws_port" >"$work/ws-server.log" 2>&1 &
pids+=("$!")
wait_port "$ws_port"
for server in native hyper; do
  start_serve "$server" "$ws_port"
  for deflate in "" --deflate; do
    python3 scripts/ws_tunnel_check.py client "ws://127.0.0.1:$ws_port/chat" $deflate \
      >"$work/direct.json" || fail "websockets directly ${deflate:-without deflate}"
    python3 scripts/ws_tunnel_check.py client "ws://127.0.0.1:$proxy_port/chat" $deflate \
      >"$work/tunnel.json" || fail "websockets through metronome ($server) ${deflate:-without deflate}: $(tail -5 "$work/serve.log")"
    cmp -s "$work/direct.json" "$work/tunnel.json" \
      || fail "the transcripts differ ($server ${deflate:-no deflate}): $(diff "$work/direct.json" "$work/tunnel.json" | head -c 2000)"
    grep -q '"close": \[4001, "server done"\]' "$work/tunnel.json" || fail "no close code in $(head -c 300 "$work/tunnel.json")"
    pass "websockets through metronome ($server server, ${deflate:-no deflate}): the transcript is the direct one"
  done
  curl -fs "http://127.0.0.1:$admin_port/metrics" >"$work/tunnel-metrics.txt"
  grep -q '^metronome_websocket_connections_total{outcome="completed",route="other"} 2$' "$work/tunnel-metrics.txt" \
    || grep -q '^metronome_websocket_connections_total{route="other",outcome="completed"} 2$' "$work/tunnel-metrics.txt" \
    || fail "two completed tunnels: $(grep websocket "$work/tunnel-metrics.txt")"
  pass "metronome counts both tunnels completed ($server server)"
  stop_serve
done

# The sim behind metronome: the same checks as directly, the probe, and metronome's streams.
start_sim "$BIN" --gap 2ms --ttft 5ms --tokens "$TOKENS"
start_serve native "$sim_port"
python3 scripts/ws_crosscheck.py "http://127.0.0.1:$proxy_port" "$TOKENS" --sdk \
  || fail "Python's websockets and the openai SDK through metronome: $(tail -5 "$work/serve.log")"
pass "websockets and the openai SDK through metronome: responses and realtime"
python3 scripts/ws_crosscheck.py "http://127.0.0.1:$proxy_port" "$TOKENS" --deflate \
  || fail "Python's websockets with permessage-deflate through metronome"
pass "websockets with permessage-deflate through metronome"
for api in responses realtime; do
  "$BIN" probe --url "ws://127.0.0.1:$proxy_port/v1/$api" --body "$work/body.json" -n 4 -c 2 \
    --responses-per-socket 2 --realtime-output text --json "$work/$api-tunnel.json" \
    --progress-interval 0s >"$work/$api-tunnel.txt" || fail "probe --websocket $api through metronome"
done
. scripts/lib/metrics.sh
metrics_when_idle "127.0.0.1:$admin_port" "$work/sim-metrics.txt"
python3 - "$work/sim-metrics.txt" <<'PY' || fail "metronome's streams by format"
import re, sys
text = open(sys.argv[1]).read()
def total(name, **labels):
    n = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        series, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in series for k, v in labels.items()):
            n += float(value)
    return n
# Through metronome: ws_crosscheck twice (2 + 2 Responses, 2 + 2 Realtime), the SDK (2 + 1),
# then the probe (4 of each).
responses = total("metronome_stream_format_total", format="responses_websocket")
realtime = total("metronome_stream_format_total", format="realtime")
assert responses == 2 + 2 + 2 + 4, responses
assert realtime == 2 + 2 + 1 + 4, realtime
assert total("metronome_streams_total", outcome="complete") == responses + realtime, text
print(f"metronome metered {responses:.0f} Responses and {realtime:.0f} Realtime streams, all complete")
PY
pass "metronome meters every response of both APIs through the tunnel"
echo "e2e-websocket: all checks passed"
