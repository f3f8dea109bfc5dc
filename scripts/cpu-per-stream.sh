#!/usr/bin/env bash
# What a stream costs the proxy's CPU from its request to its end, metronome with metering on and
# off beside nginx: the cost that sets the first token's time when many streams start at once.
#
# In the bench's stall sweep every connection runs streams back to back, so at a few hundred
# streams they end and start again in waves, and a new stream's first token waits for the proxy
# to finish the requests and first frames of the wave on two shared cores: its TTFT follows the
# CPU each stream costs far more than per-frame costs or queueing order. This measures that cost
# alone: one worker per proxy, the bench's mock and client (scripts/lib/streambench.rs) running
# short streams (one content event, the role, finish, usage and [DONE] chunks; the mock answers
# at once) on C warm connections back to back for D seconds per turn, the paths taking turns for
# ROUNDS rounds; CPU is the proxy process's user + system time over its turn (from
# /proc/PID/stat, so it includes the kernel's share of its sockets), divided by the streams the
# client completed. Prints each round and the medians.
#
#   bash scripts/cpu-per-stream.sh [BIN]     # default: the release build of this tree (built first)
#   C=64 D=8 ROUNDS=3 bash scripts/cpu-per-stream.sh BIN    # the defaults
#   EVENTS=16 bash scripts/cpu-per-stream.sh BIN            # content events per stream
#
# The proxy is saturated (its one worker near a full core), so compare paths within one run.
# Everything on 127.0.0.1; every process it starts is stopped on exit. Installs nginx (Debian's)
# with apt-get when it is missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx >/dev/null
fi
nginx=$(command -v nginx || echo /usr/sbin/nginx)
source "$root/scripts/lib/loopback.sh"
if [ $# -gt 0 ]; then
  bin=$1
else
  (cd "$root" && cargo build --quiet --release --bin metronome)
  bin=$root/target/release/metronome
fi
conns=${C:-64} seconds=${D:-8} rounds=${ROUNDS:-3} events=${EVENTS:-1}
rustc -O --edition 2021 "$root/scripts/lib/streambench.rs" -o "$work/streambench"

mock_port=$(free_port)
"$work/streambench" mock --listen "127.0.0.1:$mock_port" >"$work/mock.log" 2>&1 &
pids+=($!)
wait_port "$mock_port"
paths=() procs=() ports=()
for metering in true false; do
  port=$(free_port) admin=$(free_port)
  # The mock never closes an idle connection; keep the pooled ones as nginx keeps its own.
  PROXY_TOML=$'[timeouts]\nupstream_idle = "300s"' proxy_config "$port" "$admin" "$mock_port" "$metering"
  sed -i 's/^threading = .*/threading = "per_core"\nworkers = 1/' "$work/m.toml"
  mv "$work/m.toml" "$work/m-$metering.toml"
  "$bin" serve --config "$work/m-$metering.toml" >"$work/m-$metering.log" 2>&1 &
  pids+=($!)
  procs+=($!)
  wait_port "$port"
  ports+=("$port")
done
paths+=(metronome passthrough)
nginx_port=$(free_port)
nginx_config "$nginx_port" "$mock_port" 1
"$nginx" -c "$work/nginx.conf" -p "$work" >"$work/nginx.log" 2>&1 &
pids+=($!)
procs+=($!)
wait_port "$nginx_port"
ports+=("$nginx_port")
paths+=(nginx)

# User + system clock ticks of process $1.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

echo "C=$conns connections, $seconds s per turn, $rounds rounds, $events content event(s) per stream" >&2
for round in $(seq 1 "$rounds"); do
  for i in 0 1 2; do
    # The order turns every round, so a slow minute falls on every path alike.
    k=$(((i + round) % 3))
    before=$(ticks "${procs[$k]}")
    "$work/streambench" sweep --target "${paths[$k]}=127.0.0.1:${ports[$k]}" \
      --concurrency "$conns" --events "$events" --duration-s "$seconds" \
      --out "$work/turn.jsonl" 2>>"$work/client.log"
    after=$(ticks "${procs[$k]}")
    python3 - "${paths[$k]}" "$round" "$before" "$after" "$(getconf CLK_TCK)" "$seconds" \
      "$work/turn.jsonl" >>"$work/rows.jsonl" <<'EOF'
import json, sys
path, round_, before, after, hz, seconds, out = sys.argv[1:]
rows = [json.loads(line) for line in open(out) if '"status"' in line]
ok = [r for r in rows if r.get("status") == 200 and r.get("done")]
ttft = sorted(r["ttft_ns"] for r in ok if r.get("ttft_ns"))
cpu_us = (int(after) - int(before)) * 1e6 / int(hz)
print(json.dumps({
    "path": path, "round": int(round_), "streams": len(rows), "failed": len(rows) - len(ok),
    "cpu_us_per_stream": cpu_us / max(len(rows), 1),
    "streams_per_s": len(rows) / float(seconds),
    "ttft_p50_us": ttft[len(ttft) // 2] / 1e3 if ttft else None,
}))
EOF
  done
done
python3 - "$work/rows.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
paths = list(dict.fromkeys(r["path"] for r in rows))
print("| path | CPU µs per stream, each round | median | streams per second (median) | client TTFT p50 (median) | failed streams |")
print("|---|---|---|---|---|---|")
for p in paths:
    mine = [r for r in rows if r["path"] == p]
    cpu = [r["cpu_us_per_stream"] for r in mine]
    print(f"| {p} | {' / '.join(f'{c:.1f}' for c in cpu)} | {statistics.median(cpu):.1f} "
          f"| {statistics.median(r['streams_per_s'] for r in mine):,.0f} "
          f"| {statistics.median(r['ttft_p50_us'] or 0 for r in mine):,.0f} µs "
          f"| {sum(r['failed'] for r in mine)} |")
EOF
