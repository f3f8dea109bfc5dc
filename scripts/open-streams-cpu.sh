#!/usr/bin/env bash
# CPU of metronome serve holding many open streams, with the batch detector on and off
# (docs/batch.md, "How it is measured").
#
#   STREAMS=5000 SECONDS_MEASURED=20 bash scripts/open-streams-cpu.sh BIN [BIN...]
#
# For each binary, each cadence (silent: the sim sends no token for an hour; 1/s: one token
# event a second after a 100 ms TTFT) and each detector setting ([batch] enabled = true/false):
# starts `BIN sim` and `BIN serve`, opens STREAMS streams through the proxy, waits WARMUP
# seconds, and prints the proxy's CPU (user + system from /proc, % of one core) over
# SECONDS_MEASURED seconds. Release builds give the figures worth comparing.
set -euo pipefail

STREAMS=${STREAMS:-5000}
WARMUP=${WARMUP:-5}
SECONDS_MEASURED=${SECONDS_MEASURED:-20}
[ $# -ge 1 ] || { echo "usage: $0 BIN [BIN...]" >&2; exit 2; }
ulimit -n 65536 2>/dev/null || true
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]:-}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

measure() { # BIN CADENCE ENABLED
    local bin=$1 cadence=$2 enabled=$3 sim_port proxy_port admin_port
    sim_port=$(port); proxy_port=$(port); admin_port=$(port)
    local sim_args=(--ttft 1h)
    [ "$cadence" = "1/s" ] && sim_args=(--ttft 100ms --gap 1s --tokens 100000 --max-tokens-cap 100000)
    "$bin" sim --listen "127.0.0.1:$sim_port" "${sim_args[@]}" >/dev/null 2>&1 &
    local sim=$!; pids+=("$sim")
    cat >"$tmp/m.toml" <<EOF
[server]
listen = "127.0.0.1:$proxy_port"
admin = "127.0.0.1:$admin_port"
upstream = "http://127.0.0.1:$sim_port"
[limits]
max_connections = $((STREAMS + 100))
max_requests = $((STREAMS + 100))
[batch]
enabled = $enabled
EOF
    "$bin" serve --config "$tmp/m.toml" >/dev/null 2>&1 &
    local proxy=$!; pids+=("$proxy")
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$admin_port/healthz" >/dev/null && break; sleep 0.1; done
    python3 - "$proxy_port" "$STREAMS" "$((WARMUP + SECONDS_MEASURED + 5))" <<'PY' &
import asyncio, sys
port, n, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
body = b'{"model":"m","stream":true,"max_tokens":100000}'
head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n").encode() + body
async def one():
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(head)
    await w.drain()
    try:
        await asyncio.wait_for(drain(r), hold)
    except asyncio.TimeoutError:
        pass
    w.close()
async def drain(r):
    while await r.read(65536):
        pass
async def main():
    await asyncio.gather(*(one() for _ in range(n)))
asyncio.run(main())
PY
    local clients=$!; pids+=("$clients")
    sleep "$WARMUP"
    local hz t0 t1
    hz=$(getconf CLK_TCK)
    t0=$(cpu_ticks "$proxy"); sleep "$SECONDS_MEASURED"; t1=$(cpu_ticks "$proxy")
    local open
    open=$(curl -s "http://127.0.0.1:$admin_port/metrics" | awk '/^metronome_streams_active/ {s += $2} END {print s + 0}')
    awk -v a="$t0" -v b="$t1" -v hz="$hz" -v s="$SECONDS_MEASURED" -v bin="$bin" -v c="$cadence" \
        -v e="$enabled" -v o="$open" \
        'BEGIN { printf "%s\tcadence=%s\tdetector=%s\topen=%d\tcpu=%.2f%% of a core\n", bin, c, e, o, (b - a) / hz / s * 100 }'
    kill "$clients" "$proxy" "$sim" 2>/dev/null || true
    wait "$clients" "$proxy" "$sim" 2>/dev/null || true
}

for bin in "$@"; do
    for cadence in silent 1/s; do
        for enabled in true false; do
            measure "$bin" "$cadence" "$enabled"
        done
    done
done
