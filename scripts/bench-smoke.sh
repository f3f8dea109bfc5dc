#!/usr/bin/env bash
# CI smoke of the proxy benchmark: 50 streams for 10 s through direct and metronome; checks that the
# harness works (the machine's wake-up lateness measured before each run included) and that no
# stream fails. Then a short scripts/tail-split.sh run, which must join every stream with its
# timeline, print the gaps at each point and count the episodes of late gaps from the gap CSV. The figures are not checked (too noisy for CI).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bench.sh --smoke "$@"

# The two scripts the benchmark's noise figures rest on, on inputs with known answers.
python3 - <<'PY'
import csv, io, subprocess, sys, tempfile
sys.path.insert(0, "scripts")
import hiccups
s = hiccups.summary([float(v) for v in range(1, 1001)])  # 1..1000 µs late
assert (s["sleeps"], s["p50"], s["p90"], s["p99"], s["p999"], s["max"], s["over_1ms"]) == \
    (1000, 500, 900, 990, 999, 1000, 0), s
# 40 streams 50 ms apart; at 2 s all 40 are 8 ms late at ingress (an episode), and five lone
# gaps are 3 ms late at other times (late, but in no episode).
rows = []
for stream in range(40):
    for event in range(1, 60):
        at = 1_000_000 + event * 50_000 + stream * 10
        generation = 58_000 if event == 20 else 50_000
        lone = stream < 5 and event == 30 + stream * 5
        rows.append((stream, event, at, 53_000 if lone else generation))
with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
    w = csv.writer(f)
    w.writerow(["stream", "event", "client_at_us", "client_us", "generation_us", "metronome_us",
                "after_metronome_us"])
    for stream, event, at, g in rows:
        w.writerow([stream, event, at, g, g, 0, 0])
out = subprocess.run([sys.executable, "scripts/tail-episodes.py", f.name], capture_output=True,
                     text=True, check=True).stdout
assert "45 more than 2 ms above it" in out, out
assert "episodes       1 in 3 s touching 40-40 streams each" in out, out
assert "up to 8.0-8.0 ms late; 40 of the 45 late gaps" in out, out
print("hiccups.summary and tail-episodes.py give the known answers")
PY

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
