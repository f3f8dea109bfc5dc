#!/usr/bin/env bash
# What a request head begun and never finished costs the proxy: the resident set of
# `metronome serve` with N connections each holding a partial head of SIZE bytes, less the
# resident set with none, divided by N. Each size runs on a fresh proxy.
#
#   scripts/rss-per-partial-head.sh [BIN]     (N=1000 SIZES="57 8192 61440" SERVER=native)
#
# BIN defaults to target/release/metronome (built when missing). timeouts.client_head is set to
# 120 s so no head is cut while it is measured; limits.max_header_bytes stays at its 64 KiB
# default, so a 60 KiB head is still partial, not refused. SERVER=hyper measures hyper's
# HTTP/1 server instead. Prints one line per size: KiB per head, and the head's own size.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-1000}
SIZES=${SIZES:-"57 8192 61440"}
SERVER=${SERVER:-native}
BIN=${1:-target/release/metronome}
if [[ ! -x $BIN ]]; then
    cargo build --release --bin metronome 2>&1 | tail -1 >&2
fi
ulimit -n "$((N * 2 + 256))"
WORK=$(mktemp -d -t metronome-partial.XXXXXX)
pid=""
cleanup() {
    if [[ -n $pid ]]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
}
trap cleanup EXIT

cat >"$WORK/metronome.toml" <<TOML
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
upstream = "http://127.0.0.1:9"
http1_server = "$SERVER"
[timeouts]
client_head = "120s"
client_idle = "120s"
sniff = "120s"
TOML

for size in $SIZES; do
    RUST_LOG=warn,metronome=info "$BIN" serve --config "$WORK/metronome.toml" >"$WORK/serve.log" 2>&1 &
    pid=$!
    proxy=""
    for _ in $(seq 100); do
        proxy=$(sed 's/\x1b\[[0-9;]*m//g' "$WORK/serve.log" | grep "metronome serving" | grep -oE '127\.0\.0\.1:[0-9]+' | head -1 || true)
        [[ -n $proxy ]] && break
        sleep 0.1
    done
    [[ -n $proxy ]] || { echo "FAIL: the proxy did not start" >&2; cat "$WORK/serve.log" >&2; exit 1; }
    python3 - "$proxy" "$pid" "$N" "$size" <<'PY'
import os, socket, sys, time
proxy, pid, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
host, port = proxy.rsplit(":", 1)
def rss():
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
prefix = b"POST /v1/chat/completions HTTP/1.1\r\nhost: metronome.test\r\n"
head = prefix + b"x-pad: " + b"a" * max(0, size - len(prefix) - 7) if size > len(prefix) else prefix[:size]
time.sleep(1)
before = rss()
held = []
for _ in range(n):
    s = socket.create_connection((host, int(port)))
    s.sendall(head)
    held.append(s)
time.sleep(3)
after = rss()
alive = 0
for s in held:
    s.setblocking(False)
    try:
        s.recv(1)  # an answer or the close: not held
    except BlockingIOError:
        alive += 1
    except OSError:
        pass
per = (after - before) / n
print(f"{len(head):6d}-byte partial head: {per / 1024:7.1f} KiB each "
      f"({before / 2**20:.1f} -> {after / 2**20:.1f} MB for {n}; {alive} of {n} still open)")
if alive != n:
    sys.exit(f"FAIL: {n - alive} partial heads were closed or answered while measured")
for s in held:
    s.close()
PY
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
done
