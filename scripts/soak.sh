#!/usr/bin/env bash
# A soak: N minutes (default 30) of `metronome sim` load through `metronome serve` with churn,
# checking that nothing leaks and that every error is an injected one.
#
#   scripts/soak.sh [MINUTES]     (CONCURRENCY=32 SAMPLE_EVERY=5 IDLE_WAIT=200 by default)
#   WEBSOCKET=1 scripts/soak.sh 60   the mixed soak: WebSocket clients too (see below)
#
# The churn, from 32 concurrent clients (scripts/soak.py), each request on a new connection:
#   55% read a whole stream; 20% cancel after 2 to 20 events (half with FIN, half with RST);
#   15% read slowly (4 KiB receive buffer, 256 bytes every 50 ms, slower than the sim writes);
#   10% go to route `reset`, whose upstream (soak.py reset-upstream) aborts every stream with a
#   TCP RST after 3 to 20 events: the injected upstream fault.
# The sim streams 40 tokens, 20 ms apart with jitter and rare stalls.
# Beside them: a quarter of the whole streams' clients send a beacon (with the stream's
# x-metronome-beacon-key when the response carries one; BEACONS=0 turns them off), /metrics is
# scraped every SCRAPE_EVERY=1 s (text, OpenMetrics and protobuf in turn), and every
# RELOAD_EVERY=60 s the file is rewritten (a spare route added or taken away) and the proxy
# sent SIGHUP. With WEBSOCKET=1, WS_CLIENTS=4 clients also speak the Responses API's WebSocket
# mode to the sim through the proxy's tunnel (route `ws`), 1 to 3 responses a socket, one socket
# in five left mid-response; when the proxy answers the upgrade with anything but 101 they stop
# and their checks are skipped. Before the clock starts, PRIME=4096 two-token streams fill the
# proxy's bounded registries (the beacon window, the /streams ring), so even a short run
# (scripts/soak.sh 2) measures the steady state.
#
# Every SAMPLE_EVERY seconds the proxy's resident set (/proc/PID/statm), open descriptors
# (/proc/PID/fd) and stream gauge are printed. At the end it checks: resident set and descriptors
# flat within BOUND=0.10 (the mean of the first steady-state minute against the last minute;
# steady state starts after a fifth of the run, at most a minute, and once 4096 streams are
# recorded, which fills the proxy's bounded registries), streams_active back to 0, upstream errors only of the injected kind and
# exactly one per injected reset, no 4xx/5xx, streams_total adding up to the requests sent with
# each outcome matching what the clients did, every beacon answered 204 and counted accepted,
# every WebSocket response recorded once, every scrape answered, every SIGHUP applied and none
# refused, and no panic in the proxy's log. Then, with the load
# stopped, it waits (up to IDLE_WAIT=200 s) for the pooled upstream connections to pass their
# idle timeout: the descriptors must return to their count before the first request. Exits 1 when
# a check fails. Everything listens on 127.0.0.1. METRONOME_BIN=path skips the build.
# EXTRA_TOML='...' is appended to the proxy's configuration (after its routes: start it with a
# table header), to soak a setting, or to rule a structure in or out of the resident set.
set -euo pipefail

MINUTES=${1:-30}
CONCURRENCY=${CONCURRENCY:-32}
SAMPLE_EVERY=${SAMPLE_EVERY:-5}
IDLE_WAIT=${IDLE_WAIT:-200}
BOUND=${BOUND:-0.10}
PRIME=${PRIME:-4096}
BEACONS=${BEACONS:-1}
WEBSOCKET=${WEBSOCKET:-0}
WS_CLIENTS=${WS_CLIENTS:-4}
SCRAPE_EVERY=${SCRAPE_EVERY:-1}
RELOAD_EVERY=${RELOAD_EVERY:-60}

cd "$(dirname "$0")/.."
if [[ -n ${METRONOME_BIN:-} ]]; then
    BIN=$METRONOME_BIN
else
    echo "building metronome (release)..." >&2
    cargo build --release --bin metronome 2>&1 | tail -1 >&2
    BIN=$PWD/target/release/metronome
fi
WORK=$(mktemp -d -t metronome-soak.XXXXXX)

pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
}
trap cleanup EXIT

# Each process binds port 0 and logs where it listens: picking free ports first races with
# other processes' outgoing connections, which take ports from the same ephemeral range.
# wait_for_addr LOG PATTERN PID: the first 127.0.0.1:PORT on a log line matching PATTERN.
wait_for_addr() {
    local log=$1 pattern=$2 pid=$3 addr
    for _ in $(seq 100); do
        addr=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E "$pattern" | grep -oE '127\.0\.0\.1:[0-9]+' | head -1 || true)
        if [[ -n $addr ]]; then
            echo "$addr"
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "FAIL $log: the process exited:" >&2
            tail -5 "$log" >&2
            return 1
        fi
        sleep 0.1
    done
    echo "FAIL $log: no address logged" >&2
    return 1
}

"$BIN" sim --listen 127.0.0.1:0 --gap 20ms --jitter 0.3 --ttft 50ms \
    --stall-prob 0.005 --stall 250ms >"$WORK/sim.log" 2>&1 &
pids+=($!)
SIM=$(wait_for_addr "$WORK/sim.log" "listening on" "${pids[-1]}")
python3 scripts/soak.py reset-upstream --listen 127.0.0.1:0 >"$WORK/reset.log" 2>&1 &
pids+=($!)
RESET=$(wait_for_addr "$WORK/reset.log" "listening on" "${pids[-1]}")

cat >"$WORK/metronome.toml" <<TOML
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
upstream = "http://$SIM"
drain_grace = "5s"
[timeouts]
idle = "10s"
[[routes]]
name = "chat"
path = "/v1/chat/completions"
match = "exact"
[[routes]]
name = "reset"
path = "/reset"
upstream = "http://$RESET"
[[routes]]
name = "ws"
path = "/v1/responses"
match = "exact"
${EXTRA_TOML:-}
TOML
RUST_LOG=info "$BIN" serve --config "$WORK/metronome.toml" >"$WORK/serve.log" 2>&1 &
SERVE_PID=$!
pids+=("$SERVE_PID")
PROXY=$(wait_for_addr "$WORK/serve.log" "metronome serving" "$SERVE_PID")
ADMIN=$(sed 's/\x1b\[[0-9;]*m//g' "$WORK/serve.log" | grep "metronome serving" | grep -oE 'admin=127\.0\.0\.1:[0-9]+' | cut -d= -f2)

echo "soak: $MINUTES min, $CONCURRENCY clients, proxy pid $SERVE_PID, logs in $WORK" >&2
extra=()
if [[ $WEBSOCKET == 1 ]]; then
    extra+=(--websocket --ws-clients "$WS_CLIENTS")
fi
if [[ $BEACONS == 0 ]]; then
    extra+=(--beacon-share 0)
fi
rc=0
python3 scripts/soak.py drive --proxy "$PROXY" --admin "$ADMIN" \
    --pid "$SERVE_PID" --seconds "$((MINUTES * 60))" --concurrency "$CONCURRENCY" \
    --every "$SAMPLE_EVERY" --idle-wait "$IDLE_WAIT" --rows "$WORK/samples.csv" \
    --bound "$BOUND" --prime "$PRIME" --scrape-every "$SCRAPE_EVERY" \
    --reload-every "$RELOAD_EVERY" --config "$WORK/metronome.toml" \
    --serve-log "$WORK/serve.log" "${extra[@]}" || rc=$?
if grep -q "panicked" "$WORK/serve.log"; then
    echo "FAIL the proxy's log shows a panic:" >&2
    grep -m3 "panicked" "$WORK/serve.log" >&2
    rc=1
fi
if ! kill -0 "$SERVE_PID" 2>/dev/null; then
    echo "FAIL the proxy is no longer running" >&2
    rc=1
fi
echo "samples: $WORK/samples.csv" >&2
exit "$rc"
