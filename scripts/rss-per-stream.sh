#!/usr/bin/env bash
# Resident memory per open stream of metronome's proxy process, metering on and off: a quicker,
# quieter measure than scripts/bench.sh's (no other proxy, no repeats), for before/after a change.
#
#   scripts/rss-per-stream.sh [BIN ...]            # default: target/release/metronome
#   STREAMS=1000 RATE=100 scripts/rss-per-stream.sh /tmp/metronome-before target/release/metronome
#   PROXY_TOML=$'[timeline]\nmax_frames = 0' scripts/rss-per-stream.sh   # without the configured
#                                                       # per-stream timeline buffer
#
# For each binary and metering setting: the sim streams 3,000-token streams at a 50 ms gap (so none
# ends during the run); after one warm-up stream the proxy's VmRSS is read (idle); the probe then
# starts STREAMS streams evenly over STREAMS/RATE seconds (their ages spread as in a steady state),
# and VmRSS is read three times once the last has started. Per stream = (median - idle) / STREAMS.
# Prints a table. Everything is on 127.0.0.1; every process it starts is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

streams=${STREAMS:-1000}
rate=${RATE:-100}
[ $# -gt 0 ] || { cargo build --release --quiet; set -- target/release/metronome; }

. scripts/lib/loopback.sh

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

# Prints "<idle KiB> <median KiB with the streams open>".
measure() {
  local bin=$1 metering=$2 sim_port=$3
  local port admin proxy probe seconds samples=()
  port=$(free_port)
  admin=$(free_port)
  proxy_config "$port" "$admin" "$sim_port" "$metering"
  "$bin" serve --config "$work/m.toml" >"$work/proxy.log" 2>&1 &
  proxy=$!
  pids+=("$proxy")
  wait_port "$port"
  timeout 20 "$bin" probe --url "http://127.0.0.1:$port" --concurrency 1 --requests 1 \
    --max-tokens 5 >/dev/null 2>&1
  sleep 0.5
  local idle
  idle=$(rss_kib "$proxy")
  seconds=$(( (streams + rate - 1) / rate ))
  timeout $((seconds + 60)) "$bin" probe --url "http://127.0.0.1:$port" --rate "$rate" \
    --concurrency "$streams" --duration "${seconds}s" --max-tokens 3000 --timeout 300s \
    >"$work/probe.log" 2>&1 &
  probe=$!
  pids+=("$probe")
  sleep $((seconds + 1))
  for _ in 1 2 3; do
    samples+=("$(rss_kib "$proxy")")
    sleep 1
  done
  kill "$probe" 2>/dev/null || true
  wait "$probe" 2>/dev/null || true
  kill -TERM "$proxy" 2>/dev/null || true
  wait "$proxy" 2>/dev/null || true
  printf '%s\n' "${samples[@]}" | sort -n | sed -n 2p | sed "s/^/$idle /"
}

printf '| binary | metering | streams | idle RSS | RSS per open stream |\n'
printf '|---|---|---|---|---|\n'
for bin in "$@"; do
  start_sim "$bin" --gap 50ms --max-tokens-cap 10000
  for metering in true false; do
    read -r idle open < <(measure "$bin" "$metering" "$sim_port")
    python3 - "$bin" "$metering" "$streams" "$idle" "$open" <<'EOF'
import sys
bin_, metering, streams, idle, open_ = sys.argv[1:]
per = (int(open_) - int(idle)) / int(streams)
print(f"| {bin_} | {'on' if metering == 'true' else 'off'} | {int(streams):,} | "
      f"{int(idle) / 1024:.1f} MiB | {per:.1f} KiB |")
EOF
  done
  stop_sim
done
