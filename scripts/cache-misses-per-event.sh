#!/usr/bin/env bash
# Cache misses metronome's proxy causes per token event with many streams open at once, simulated
# by valgrind's callgrind (`--cache-sim=yes`): a check of where the CPU goes that this machine's
# `perf` cannot make (its hardware counters read `<not supported>`). Deterministic for a given
# interleaving, so builds can be compared on a noisy machine.
#
#   scripts/cache-misses-per-event.sh [BIN ...]     # default: target/profiling/metronome (built)
#   STREAMS=1000 scripts/cache-misses-per-event.sh  # streams open at once (default 500)
#   LL=2097152,16,64 scripts/cache-misses-per-event.sh
#   KEEP=DIR scripts/cache-misses-per-event.sh      # keep the callgrind outputs in DIR, for
#                                                   # `callgrind_annotate --show=DLmr,DLmw ...`
#   NGINX=1 scripts/cache-misses-per-event.sh       # also nginx (one process, proxy_buffering
#                                                   # off, keep-alive upstream) under callgrind
#
# The simulated caches are the first-level data cache (D1, 32 KiB, 8-way) and a last level (LL)
# that defaults to this machine's per-core L2 (1 MiB, 8-way) rather than its shared L3: with
# STREAMS streams interleaved, what matters is whether a stream's state is still near the core
# when its next frame comes. The kernel's share (socket buffers, TCP) is not simulated, so the
# real misses are more, not fewer.
#
# For each binary and metering on/off: the sim (native) streams at a 1 s gap, so every stream is
# open for the whole run and consecutive frames belong to different streams; the proxy runs under
# callgrind; the probe (native) opens STREAMS streams at once, of 4 token events in one run and 12
# in another, and the difference between the runs' counts over the difference in token events is
# the per-event figure (connection set-up and start-up cancel out). Prints a table. Everything is
# on 127.0.0.1; every process it starts is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/valgrind.sh
[ $# -gt 0 ] || { cargo build --profile profiling --quiet --bin metronome; set -- target/profiling/metronome; }
streams=${STREAMS:-500}
d1=${D1:-32768,8,64}
ll=${LL:-1048576,8,64}

. scripts/lib/loopback.sh
ulimit -n "$(ulimit -Hn)"

# One proxy under callgrind with the cache simulation, `streams` streams of `tokens` token events
# through it at once. `kind` is true or false (metronome with metering on or off) or nginx.
# Prints "<Ir> <D1 misses> <LL misses> <token events>".
measure() {
  local bin=$1 kind=$2 tokens=$3 sim_port=$4
  local port admin out command
  port=$(free_port)
  admin=$(free_port)
  if [ "$kind" = nginx ]; then
    nginx_config "$port" "$sim_port" 1 # one process, so that callgrind sees it all
    command=(nginx -c "$work/nginx.conf" -p "$work")
  else
    proxy_config "$port" "$admin" "$sim_port" "$kind"
    command=("$bin" serve --config "$work/m.toml")
  fi
  out="$work/callgrind.$kind.$tokens.out"
  TOKIO_WORKER_THREADS=2 valgrind --tool=callgrind --cache-sim=yes --D1="$d1" --LL="$ll" \
    --callgrind-out-file="$out" "${command[@]}" >"$work/proxy.log" 2>&1 &
  local proxy=$!
  wait_port "$port"
  "$bin" probe --url "http://127.0.0.1:$port" --concurrency "$streams" --requests "$streams" \
    --max-tokens "$tokens" --timeout 300s --detail "$work/probe.json" >/dev/null 2>&1 || true
  kill -TERM "$proxy"
  wait "$proxy" || true
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP"
    cp "$out" "$KEEP/callgrind.$(basename "$bin").$kind.$tokens.out"
  fi
  python3 - "$out" "$work/probe.json" <<'EOF'
import json, sys
out, probe = sys.argv[1:]
events = summary = None
for line in open(out):
    if line.startswith("events:"):
        events = line.split()[1:]
    elif line.startswith("summary:"):
        summary = [int(x) for x in line.split()[1:]]
c = dict(zip(events, summary))
d = json.load(open(probe))
assert d["errors"] == 0, d
print(c["Ir"], c["D1mr"] + c["D1mw"], c["DLmr"] + c["DLmw"], d["token_events"])
EOF
}

kinds="true false"
if [ "${NGINX:-0}" = 1 ]; then
  command -v nginx >/dev/null 2>&1 || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null
  }
  kinds="true false nginx"
fi
printf 'Streams open at once: %s; D1 %s, LL %s (size, ways, line).\n\n' "$streams" "$d1" "$ll"
printf '| proxy | metering | instructions per token event | D1 misses per event | LL misses per event | token events (large - small run) |\n'
printf '|---|---|---|---|---|---|\n'
for bin in "$@"; do
  start_sim "$bin" --gap 1s --ttft 100ms --max-tokens-cap 100
  for kind in $kinds; do
    read -r ir_s d1_s ll_s ev_s < <(measure "$bin" "$kind" 4 "$sim_port")
    read -r ir_l d1_l ll_l ev_l < <(measure "$bin" "$kind" 12 "$sim_port")
    python3 - "$bin" "$kind" "$ir_s" "$d1_s" "$ll_s" "$ev_s" "$ir_l" "$d1_l" "$ll_l" "$ev_l" <<'EOF'
import sys
bin_, kind = sys.argv[1:3]
ir_s, d1_s, ll_s, ev_s, ir_l, d1_l, ll_l, ev_l = map(int, sys.argv[3:])
d_ev = ev_l - ev_s
per = lambda large, small: (large - small) / d_ev if d_ev else float("nan")
proxy, metering = ("nginx", "-") if kind == "nginx" else (bin_, "on" if kind == "true" else "off")
print(f"| {proxy} | {metering} | {per(ir_l, ir_s):,.0f} | "
      f"{per(d1_l, d1_s):,.1f} | {per(ll_l, ll_s):,.1f} | {d_ev:,} |")
EOF
  done
  stop_sim
done
