#!/usr/bin/env bash
# Where the first token's time goes inside metronome, step by step, from the upstream's response
# head to the first write to the client, with metering on and off, beside nginx.
#
# At one stream at a time, with other processes taking the caches between streams (the c=1 leg
# alternates paths), that time follows the memory a step touches far more than the instructions
# it runs, so callgrind's counts do not rank the steps: clock readings on the path do. This
# applies scripts/lib/first-token-marks.patch (marks at each step, rows dumped by a thread) to a
# scratch worktree of HEAD, builds it (profiling profile without fat LTO, so a few per cent slower
# than release), and runs the bench's mock and client (scripts/lib/streambench.rs) over three
# paths taking turns: metronome with metering on, metronome with metering off, nginx. Prints each
# step's median and the client's TTFT per path (scripts/lib/first_token_marks.py).
#
#   bash scripts/first-token-marks.sh [STREAMS]     # streams per path (default 300)
#
# Everything on 127.0.0.1; every process it starts is stopped on exit. Needs nginx. The patch
# follows the code it marks: when the code moves, `git apply` names the hunk that no longer fits.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/lib/loopback.sh"
streams=${1:-300}
tree="$work/tree"
git -C "$root" worktree add --quiet --detach "$tree" HEAD
remove_tree() { git -C "$root" worktree remove --force "$tree" 2>/dev/null || true; cleanup; }
trap remove_tree EXIT
git -C "$tree" apply "$root/scripts/lib/first-token-marks.patch"
echo "building the marked binary (profiling profile, no fat LTO)..." >&2
(cd "$tree" && CARGO_PROFILE_PROFILING_LTO=false CARGO_TARGET_DIR="$root/target/marks" \
  cargo build --quiet --profile profiling --bin metronome)
bin="$root/target/marks/profiling/metronome"
rustc -O --edition 2021 "$root/scripts/lib/streambench.rs" -o "$work/streambench"

mock_port=$(free_port)
"$work/streambench" mock --listen "127.0.0.1:$mock_port" --events 4 --gap-ms 20 >"$work/mock.log" 2>&1 &
pids+=($!)
wait_port "$mock_port"
mkdir -p "$work/marks"
targets=()
for metering in true false; do
  port=$(free_port) admin=$(free_port)
  # The mock never closes an idle connection; keep the pooled one as nginx keeps its own.
  PROXY_TOML=$'[timeouts]\nupstream_idle = "300s"' proxy_config "$port" "$admin" "$mock_port" "$metering"
  mv "$work/m.toml" "$work/m-$metering.toml"
  sed -i 's/^threading = .*/threading = "per_core"\nworkers = 1/' "$work/m-$metering.toml"
  METRONOME_MARKS_DIR="$work/marks" "$bin" serve --config "$work/m-$metering.toml" >"$work/m-$metering.log" 2>&1 &
  pids+=($!)
  wait_port "$port"
  targets+=(--target "metering-$metering=127.0.0.1:$port")
done
nginx_port=$(free_port)
nginx_config "$nginx_port" "$mock_port" 1
nginx -c "$work/nginx.conf" -p "$work" >"$work/nginx.log" 2>&1 &
pids+=($!)
wait_port "$nginx_port"
targets+=(--target "nginx=127.0.0.1:$nginx_port")

echo "c=1: $streams streams per path, paths taking turns..." >&2
"$work/streambench" c1 "${targets[@]}" --streams "$streams" --warmup 10 --events 4 \
  --out "$work/c1.jsonl" 2>"$work/c1.log"
sleep 3 # the marks' last dump
python3 "$root/scripts/lib/first_token_marks.py" "$work/c1.jsonl" "$work/marks"
