#!/usr/bin/env bash
# System calls per token event of a proxy in steady state, counted by the kernel's tracepoints
# (perf stat): how many reads, writes, epoll waits and futex calls one forwarded frame costs.
#
#   scripts/syscalls-per-event.sh [PATH ...]   # paths: per_core shared passthrough hyper nginx
#                                              # (default: per_core shared nginx; hyper is per_core
#                                              # with server.upstream_client = "hyper")
#   BIN=/tmp/other-build scripts/syscalls-per-event.sh per_core   # another binary, not rebuilt
#
# For each path: the sim at a 50 ms gap (20 events/s per stream), the probe opening 99 streams
# of 200 events (10.1 s each) per second for 25 s, so that from about 10 s on 1,000 are open;
# 13 s in, `perf stat` counts the proxy's system calls for 10 s, a window of about 1,000 streams
# x 20 events/s x 10 s = 200,000 events (within a few per cent). Needs perf and nginx (installed with apt-get if missing).
# Everything is on 127.0.0.1; every process it starts is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v perf >/dev/null 2>&1 || missing+=(linux-perf)
command -v nginx >/dev/null 2>&1 || missing+=(nginx)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ -n "${BIN:-}" ] || cargo build --release --quiet
bin=${BIN:-target/release/metronome}
[ $# -gt 0 ] || set -- per_core shared nginx

. scripts/lib/loopback.sh
ulimit -n "$(ulimit -Hn)"

# Starts the proxy of path $1 in front of the sim on $2, listening on $3; prints its PIDs.
start_proxy() {
  local path=$1 sim_port=$2 port=$3 admin
  admin=$(free_port)
  case $path in
    nginx)
      nginx_config "$port" "$sim_port"
      nginx -c "$work/nginx.conf" -p "$work" >"$work/proxy.log" 2>&1 &
      ;;
    *)
      local threading=$path metering=true client=default
      [ "$path" = passthrough ] && { threading=per_core; metering=false; }
      [ "$path" = hyper ] && { threading=per_core; client=hyper; }
      proxy_config "$port" "$admin" "$sim_port" "$metering" "$threading" "$client"
      "$bin" serve --config "$work/m.toml" >"$work/proxy.log" 2>&1 &
      ;;
  esac
  local proxy=$!
  wait_port "$port"
  echo "$proxy $(pgrep -P "$proxy" | tr '\n' ' ')"
}

events=200000
printf '| path | recvfrom | writev | epoll_wait | futex | all four, per event |\n'
printf '|---|---|---|---|---|---|\n'
for path in "$@"; do
  start_sim "$bin" --gap 50ms --ttft 100ms
  port=$(free_port)
  read -r -a proxy < <(start_proxy "$path" "$sim_port" "$port")
  pids+=("${proxy[@]}")
  "$bin" probe --url "http://127.0.0.1:$port" --rate 99 --duration 25s --concurrency 1100 \
    --max-tokens 200 --timeout 60s >"$work/probe.log" 2>&1 &
  probe=$!
  pids+=("$probe")
  sleep 13
  perf stat -x, -e 'syscalls:sys_enter_recvfrom,syscalls:sys_enter_writev,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex' \
    -p "$(IFS=,; echo "${proxy[*]}")" -- sleep 10 2>"$work/stat.csv" >/dev/null
  python3 - "$path" "$events" "$work/stat.csv" <<'EOF'
import sys
path, events, csv = sys.argv[1], int(sys.argv[2]), sys.argv[3]
counts = {}
for line in open(csv):
    fields = line.strip().split(",")
    if len(fields) > 2 and fields[2].startswith("syscalls:"):
        counts[fields[2].split("sys_enter_")[1]] = int(fields[0]) if fields[0].isdigit() else 0
names = ["recvfrom", "writev", "epoll_wait", "futex"]
per = [counts.get(n, 0) / events for n in names]
print(f"| {path} | " + " | ".join(f"{p:.3f}" for p in per) + f" | {sum(per):.2f} |")
EOF
  kill "$probe" "${proxy[@]}" "$sim" 2>/dev/null || true
  wait "$probe" "${proxy[@]}" "$sim" 2>/dev/null || true
done
