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
echo "e2e-websocket: all checks passed"
