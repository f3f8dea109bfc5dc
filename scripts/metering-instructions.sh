#!/usr/bin/env bash
# Instructions the metering path executes per frame, counted by valgrind's callgrind: the loop of
# benches/metering.rs (scan and classify a vLLM chat frame, update the ingress ledger, stamp the
# egress ledger; 1,000 frames of one event each), run once. No network, no threads: the count is
# the same from run to run, so a change to the metering code can be judged to a few instructions.
#
#   scripts/metering-instructions.sh            # the working tree
#   scripts/metering-instructions.sh REV ...    # these revisions (git worktrees, built in turn)
#
# Prints a table. For the whole proxy per token event, see scripts/instructions-per-event.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/valgrind.sh
FRAMES=1000 # common::vllm_chat_events(1_000) in benches/metering.rs
work=$(mktemp -d)
trap 'rm -rf "$work"; git worktree prune' EXIT

# Builds the metering bench in $1 and prints the instructions per frame of its measured loop.
measure() {
  local tree=$1 bench
  # The profiling profile keeps line tables (release ships none); an older tree without it
  # builds with its release settings, which then still had debug info.
  local profile=()
  grep -q '^\[profile.profiling\]' "$tree/Cargo.toml" && profile=(--profile profiling)
  bench=$(cd "$tree" && cargo bench "${profile[@]}" --bench metering --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "metering" and m.get("executable"):
        print(m["executable"])')
  valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" "$bench" --bench --test >/dev/null 2>&1
  callgrind_annotate --inclusive=yes --auto=no --threshold=100 "$work/cg.out" \
    | awk -v frames=$FRAMES '/criterion::bencher::Bencher<M>::iter \[/ { gsub(",", "", $1); printf "%.0f\n", $1 / frames; exit }'
}

printf '| tree | instructions per frame |\n|---|---|\n'
if [ $# -eq 0 ]; then
  printf '| working tree (%s) | %s |\n' "$(git rev-parse --short HEAD)" "$(measure .)"
fi
for rev in "$@"; do
  git worktree add -q --detach "$work/$rev" "$rev"
  # Share the build cache's dependencies: only metronome itself is rebuilt per revision.
  printf '| %s | %s |\n' "$rev" "$(CARGO_TARGET_DIR="$PWD/target" measure "$work/$rev")"
  git worktree remove --force "$work/$rev"
done
