#!/usr/bin/env bash
# Where the ITL tail is born with metronome on a CPU without the generators: the pinned
# benchmark's setup (metronome on CPU 0 with one worker, the sim and the probe on CPU 1), one path,
# with `probe --join`, so the report's attribution section gives the gaps at ingress, at egress and
# at the client, each ranked on its own (`gaps alone`), and the split of the client's percentile
# gaps. The same load straight to the sim runs first, for reference; then the machine's own
# wake-up lateness (scripts/hiccups.py), which shows whether the run met a noisy minute. Between
# the two, scripts/tail-episodes.py says whether the late frames were late alone or together.
#
#   scripts/tail-split.sh                              # 1,000 streams of 200 tokens 50 ms apart, 20 s
#   scripts/tail-split.sh --streams 200 --gap 10ms --tokens 1000
#   scripts/tail-split.sh --sim-rt                     # the sim at SCHED_FIFO, so its timers are on time
#   scripts/tail-split.sh --gaps-csv gaps.csv          # keep every gap's parts (probe --gaps-csv)
#
# metronome keeps every stream's timeline (timeline.max_streams is raised to the streams the run
# starts), which costs memory but nothing per frame. Everything runs on 127.0.0.1; every process
# started is killed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

streams=1000 tokens=200 gap=50ms duration=20 sim_rt=false gaps_csv=""
while [ $# -gt 0 ]; do
  case "$1" in
    --streams) streams=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --gap) gap=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --sim-rt) sim_rt=true; shift ;;
    --gaps-csv) gaps_csv=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "tail-split.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$gap" in *ms) ;; *) echo "tail-split.sh: --gap takes milliseconds, e.g. 50ms" >&2; exit 2 ;; esac
[ "$(nproc)" -ge 2 ] || { echo "tail-split.sh: needs two CPUs" >&2; exit 2; }

cargo build --release --quiet
bin=target/release/metronome
ulimit -n "$(ulimit -Hn)"
. scripts/lib/loopback.sh
sim_port=$(free_port) proxy_port=$(free_port) admin_port=$(free_port)
# Streams per second so that `streams` are open at once: a stream lasts TTFT (100 ms) + tokens x gap.
read -r rate kept < <(python3 -c "
g = ${gap%ms} / 1000
rate = $streams / (0.1 + $tokens * g)
print(f'{rate:.6g}', min(100000, int(rate * $duration) + 100))")
PROXY_TOML=$'[timeline]\n'"max_streams = $kept" proxy_config "$proxy_port" "$admin_port" "$sim_port" true

sim_prefix=()
$sim_rt && sim_prefix=(chrt -f 10)
"${sim_prefix[@]}" taskset -c 1 "$bin" sim --listen "127.0.0.1:$sim_port" --gap "$gap" --ttft 100ms \
  --drain 1s > "$work/sim.log" 2>&1 &
pids+=($!)
wait_port "$sim_port"
taskset -c 0 "$bin" serve --config "$work/m.toml" > "$work/metronome.log" 2>&1 &
pids+=($!)
wait_port "$proxy_port"
wait_port "$admin_port"

probe() {
  taskset -c 1 "$bin" probe --rate "$rate" --duration "${duration}s" --concurrency $((streams * 2)) \
    --max-tokens "$tokens" --timeout 120s "$@" || true
}
echo "sim$($sim_rt && echo ' (SCHED_FIFO 10)') and probe on CPU 1: $streams streams, $tokens tokens $gap apart, started for ${duration}s"
echo
echo "Direct to the sim, for reference (the ITL line is what the upstream and the client alone make):"
probe --url "http://127.0.0.1:$sim_port" | grep -E '^(streams|ITL) '
echo
echo "Through metronome on CPU 0:"
probe --url "http://127.0.0.1:$proxy_port" --join "http://127.0.0.1:$admin_port" \
  --gaps-csv "${gaps_csv:-$work/gaps.csv}"
echo
echo "Late ingress gaps, alone or together (scripts/tail-episodes.py on the probe's --gaps-csv):"
python3 scripts/tail-episodes.py "${gaps_csv:-$work/gaps.csv}" || true
echo
echo "The machine's wake-up lateness right after the run (scripts/hiccups.py --count 2000):"
python3 scripts/hiccups.py --count 2000
