#!/usr/bin/env bash
# CI smoke of the proxy benchmark: 50 streams for 10 s through direct and metronome; checks that the
# harness works (the machine's wake-up lateness measured before each run included) and that no
# stream fails. Then a short scripts/tail-split.sh run, which must join every stream with its
# timeline, print the gaps at each point and count the episodes of late gaps from the gap CSV. The figures are not checked (too noisy for CI).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bench.sh --smoke "$@"

out=$(mktemp)
trap 'rm -f "$out"' EXIT
bash scripts/tail-split.sh --streams 50 --tokens 20 --gap 50ms --duration 3 > "$out" 2>&1 || {
  cat "$out"; echo "tail-split smoke FAILED: the script failed"; exit 1; }
joined=$(grep -E '^attribution +[0-9]+ of [0-9]+ streams joined' "$out" || true)
read -r n total < <(sed -E 's/^attribution +([0-9]+) of ([0-9]+).*/\1 \2/' <<<"$joined")
if [ -z "$joined" ] || [ "$n" != "$total" ] || [ "$n" -eq 0 ] \
  || ! grep -q '^  gaps alone   p50 / p99 / p99.9 at ingress' "$out" \
  || ! grep -q '^episodes ' "$out" \
  || [ "$(grep -c '^| cpu[0-9]* | 2,000 |' "$out")" -lt 2 ]; then
  cat "$out"
  echo "tail-split smoke FAILED: expected every stream joined, the gaps at each point, the episodes and the wake-up table"
  exit 1
fi
echo "tail-split smoke passed: $joined"
