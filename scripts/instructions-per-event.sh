#!/usr/bin/env bash
# Instructions metronome's proxy process executes per token event, counted by valgrind's callgrind:
# a figure that moves far less with the machine's load than CPU seconds do, so a change can be
# judged on a noisy machine. It still moves with timing (how many frames each poll finds under
# valgrind): three runs of one binary gave 5,942 / 6,746 / 7,125 with metering on (docs/perf-history.md,
# eleventh round), so compare builds within one run of this script, with every binary given to it,
# and take the per-frame metering path from scripts/metering-instructions.sh, which is exact.
# User space only (the kernel's share of a frame, the loopback TCP work, is the same for every
# proxy and is not counted).
#
#   scripts/instructions-per-event.sh [BIN ...]        # default: target/profiling/metronome
#   THREADING="per_core shared" scripts/instructions-per-event.sh   # server.threading values to
#                                                                   # measure (default: per_core)
#   CLIENTS="native hyper" scripts/instructions-per-event.sh        # server.upstream_client values
#                                                                   # (default: the binary's own)
#   GAP=20ms scripts/instructions-per-event.sh A B   # the sim's cadence (default 2ms); at 20 ms
#                                                  # each frame is read on its own under valgrind,
#                                                  # so runs vary less than at 2 ms, where frames
#                                                  # coalesce by chance
#   KEEP=DIR scripts/instructions-per-event.sh     # keep the callgrind outputs in DIR, for
#                                                  # callgrind_annotate (one per run, named by it)
#   TTFT=100ms scripts/instructions-per-event.sh A B   # the sim's time to first token (default
#                                                  # 5ms, under one batch-sweep interval)
#   CONCURRENCY=1 TOKENS=2 scripts/instructions-per-event.sh A B   # what a request costs: one
#                                                  # stream at a time of two token events (defaults
#                                                  # 20 and 100); read the per-request column
#   RATE=2 CONCURRENCY=1 TOKENS=2 scripts/instructions-per-event.sh A B   # sparse traffic: at
#                                                  # most RATE streams a second (the probe's
#                                                  # --rate; default: back to back), so the
#                                                  # proxy idles between streams (a 120-stream run
#                                                  # then takes 120 / RATE seconds)
#
# For each binary: the sim (native, not measured) streams at a 2 ms cadence; the proxy runs under
# callgrind; the probe (native) runs two loads of different sizes through it, and the difference
# between the two runs' instruction counts divided by the difference in token events is the
# per-event cost, so start-up and shut-down cancel out. Metering on (the defaults) and off.
# Prints a table. Everything is on 127.0.0.1; every process it starts is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/valgrind.sh
[ $# -gt 0 ] || { cargo build --profile profiling --quiet --bin metronome; set -- target/profiling/metronome; }

. scripts/lib/loopback.sh

# One proxy under callgrind, `requests` streams of $TOKENS token events through it, $CONCURRENCY
# at a time.
# Prints "<instructions> <token events>".
measure() {
  local bin=$1 metering=$2 requests=$3 sim_port=$4 threading=$5 client=$6
  local port admin out
  port=$(free_port)
  admin=$(free_port)
  proxy_config "$port" "$admin" "$sim_port" "$metering" "$threading" "$client"
  out="$work/callgrind.$metering.$requests.out"
  TOKIO_WORKER_THREADS=2 valgrind --tool=callgrind --callgrind-out-file="$out" \
    "$bin" serve --config "$work/m.toml" >"$work/proxy.log" 2>&1 &
  local proxy=$!
  wait_port "$port"
  "$bin" probe --url "http://127.0.0.1:$port" --concurrency "${CONCURRENCY:-20}" \
    --requests "$requests" --max-tokens "${TOKENS:-100}" --timeout 120s ${RATE:+--rate "$RATE"} \
    --detail "$work/probe.json" >/dev/null 2>&1 || true
  kill -TERM "$proxy"
  wait "$proxy" || true
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP"
    cp "$out" "$KEEP/callgrind.$(basename "$bin").$threading.$client.$metering.$requests.out"
  fi
  local ir events
  ir=$(grep -m1 '^summary:' "$out" | awk '{print $2}')
  events=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["errors"] == 0, d; print(d["token_events"])' "$work/probe.json")
  echo "$ir $events"
}

# The two runs' sizes, in requests: their difference is what the figures are per.
SMALL=20
LARGE=120

printf '| binary | threading | upstream client | metering | instructions per token event | instructions per request | token events (large - small run) |\n'
printf '|---|---|---|---|---|---|---|\n'
for bin in "$@"; do
  start_sim "$bin" --gap "${GAP:-2ms}" --ttft "${TTFT:-5ms}"
  for threading in ${THREADING:-per_core}; do
   for client in ${CLIENTS:-default}; do
    for metering in true false; do
      read -r ir_small ev_small < <(measure "$bin" "$metering" "$SMALL" "$sim_port" "$threading" "$client")
      read -r ir_large ev_large < <(measure "$bin" "$metering" "$LARGE" "$sim_port" "$threading" "$client")
      python3 - "$bin" "$threading" "$client" "$metering" "$ir_small" "$ev_small" "$ir_large" "$ev_large" "$((LARGE - SMALL))" <<'EOF'
import sys
bin_, threading, client, metering, ir_s, ev_s, ir_l, ev_l, requests = sys.argv[1:]
d_ir, d_ev = int(ir_l) - int(ir_s), int(ev_l) - int(ev_s)
per = d_ir / d_ev if d_ev else float("nan")
per_request = d_ir / int(requests)
print(f"| {bin_} | {threading} | {client} | {'on' if metering == 'true' else 'off'} | {per:,.0f} | {per_request:,.0f} | {d_ev:,} |")
EOF
    done
   done
  done
  stop_sim
done
