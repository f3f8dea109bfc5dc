#!/usr/bin/env bash
# What idle WebSocket tunnels cost: N tunnels opened through `metronome serve` to an upstream that
# answers the upgrade and then says nothing, for IDLE seconds. Prints metronome's resident memory
# per tunnel (RSS with the tunnels open minus RSS before, over N) and the CPU time metronome took
# while they were idle (user + system, from /proc, 10 ms resolution).
#
#   N=1000 IDLE=10 bash scripts/idle-tunnels.sh [BIN]     (BIN: target/release/metronome)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-$PWD/target/release/metronome}
N=${N:-1000}
IDLE=${IDLE:-10}
. scripts/lib/loopback.sh
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

cat >"$work/peers.py" <<'PY'
import asyncio, base64, hashlib, sys

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

async def upstream(port):
    held = []
    async def serve(reader, writer):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return  # a port probe
        key = next(l.split(b":", 1)[1].strip() for l in head.split(b"\r\n")
                   if l.lower().startswith(b"sec-websocket-key:"))
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        await writer.drain()
        held.append(writer)
        await reader.read()  # until the tunnel closes
    server = await asyncio.start_server(serve, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()

async def clients(port, n):
    held = []
    async def one():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /socket HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     b"Sec-WebSocket-Version: 13\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        held.append((reader, writer))
    for start in range(0, n, 100):
        await asyncio.gather(*(one() for _ in range(start, min(n, start + 100))))
    print("open", len(held), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

mode, port = sys.argv[1], int(sys.argv[2])
asyncio.run(upstream(port) if mode == "upstream" else clients(port, int(sys.argv[3])))
PY

upstream_port=$(free_port)
python3 "$work/peers.py" upstream "$upstream_port" &
pids+=("$!")
wait_port "$upstream_port"
proxy_port=$(free_port)
admin_port=$(free_port)
cat >"$work/serve.toml" <<TOML
[server]
listen = "127.0.0.1:$proxy_port"
admin = "127.0.0.1:$admin_port"
upstream = "http://127.0.0.1:$upstream_port"
[readiness]
check_upstream = false
[limits]
max_connections = $((N + 100))
TOML
"$BIN" serve --config "$work/serve.toml" >"$work/serve.log" 2>&1 &
serve=$!
pids+=("$serve")
wait_port "$proxy_port"
sleep 1

rss() { awk '/^VmRSS/ {print $2 * 1024}' "/proc/$serve/status"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$serve/stat"; }
ticks_per_s=$(getconf CLK_TCK)

before=$(rss)
mkfifo "$work/hold"
python3 "$work/peers.py" clients "$proxy_port" "$N" <"$work/hold" >"$work/clients.out" &
client=$!
pids+=("$client")
exec 3>"$work/hold"
for _ in $(seq 1 600); do
  grep -q '^open' "$work/clients.out" 2>/dev/null && break
  sleep 0.1
done
grep -q "^open $N$" "$work/clients.out" || { echo "the tunnels did not open: $(cat "$work/clients.out")"; exit 1; }
sleep 2
after=$(rss)
cpu0=$(cpu_ticks)
sleep "$IDLE"
cpu1=$(cpu_ticks)
active=$(curl -fs "http://127.0.0.1:$admin_port/metrics" | awk '/^metronome_websocket_connections_active/ {s += $2} END {print s + 0}')
exec 3>&-
echo "tunnels open: $active (of $N)"
echo "RSS: $((before / 1024)) KiB before, $((after / 1024)) KiB with the tunnels: $(((after - before) / N)) bytes per tunnel"
echo "CPU while idle for ${IDLE} s: $(((cpu1 - cpu0) * 1000 / ticks_per_s)) ms"
