#!/usr/bin/env bash
# CI smoke of the proxy benchmark: 50 streams for 10 s through direct and metronome; checks that the
# harness works (the machine's wake-up lateness measured before each run included) and that no
# stream fails. The same run takes a tiny c1 leg (10 streams of 16 frames per path) and sweep (1 and
# 8 streams at once, 1 s), which must complete every stream on kept connections (about 25 s with
# compiling scripts/lib/streambench.rs), with a --metronome-toml that must reach their metronome's
# configuration; that program's unit tests and the legs' arithmetic are checked on known inputs
# below. Then a short scripts/tail-split.sh run, which must join every stream with its timeline,
# print the gaps at each point and count the episodes of late gaps from the gap CSV. Last, a
# one-second turn per path of scripts/cpu-per-stream.sh.
# The figures are not checked (too noisy for CI); the scripts' arithmetic is, on known inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
# With a --metronome-toml that changes nothing (the batch detector is on by default): the c1 and
# sweep legs' metronome must run with that text at the end of its configuration.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
added=$'[batch]\nenabled = true'
bash scripts/bench.sh --smoke --work "$work" --metronome-toml "$added" "$@"
if [ "$(tail -n 2 "$work/stream-metronome.toml")" != "$added" ]; then
  cat "$work/stream-metronome.toml"
  echo "bench smoke FAILED: --metronome-toml did not reach the end of stream-metronome.toml"
  exit 1
fi
echo "bench smoke: --metronome-toml reached the legs' metronome configuration"

# The two scripts the benchmark's noise figures rest on, on inputs with known answers.
python3 - <<'PY'
import csv, os, subprocess, sys, tempfile
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
os.remove(f.name)
print("hiccups.summary and tail-episodes.py give the known answers")

# The benchmark's own arithmetic: the user/system split, the client's sleeps and the wake-up IPIs
# per event, from three repeats whose medians are known; then a result of an older bench.py
# (--combine), which has none of them.
import bench
assert bench.parse_wake_ipis(
    "           CPU0       CPU1\n"
    "  0:         44          0   IO-APIC   2-edge      timer\n"
    "RES:         10         20   Rescheduling interrupts\n"
    "CAL:          1          2   Function call interrupts\n"
    "TLB:          5          5   TLB shootdowns\n") == {"cpu0": 11, "cpu1": 22}
def result(path, repeat, **extra):
    r = {"level": 10, "path": path, "repeat": repeat, "streams": 10, "errors": 0, "requests": 5,
         "token_events": 1_000_000, "load_before": "0 0 0", "wake_late_us": {},
         "itl_us": {"p50": 50_000, "p99": 51_000, "p999": 52_000},
         "ttft_us": {"p50": 100_000, "p99": 101_000}, "sim_cpu_s": 9.0, "probe_cpu_s": 8.0}
    r.update(extra)
    return r
runs = [result("direct", k) for k in range(3)] + [
    result("metronome", k, cpu_s=cpu, cpu_user_s=user, rss0_kib=1000, rss_steady_kib=1100,
           probe_sleeps=sleeps, wake_ipis={"cpu0": ipi0, "cpu1": ipi1})
    for k, (cpu, user, sleeps, ipi0, ipi1) in enumerate(
        [(10, 3, 100_000, 1000, 50_000), (12, 5, 130_000, 2000, 70_000),
         (11, 4, 120_000, 3000, 60_000)])]
row = bench.summarize(runs, ["direct", "metronome"])[1]
assert (row["cpu_per_m"], row["cpu_user_per_m"], row["cpu_system_per_m"]) == (11.0, 4.0, 7.0), row
assert row["probe_sleeps_per_event"] == 0.12 and row["ipis_per_event"] == {"cpu0": 0.002, "cpu1": 0.06}, row
assert "| 11.00 (4.00 + 7.00) |" in bench.table([row]), bench.table([row])
assert "| 0.120 | 0.002 / 0.060 |" in bench.generators_table([row]), bench.generators_table([row])
old = bench.summarize([result("metronome", 0, cpu_s=11, rss0_kib=1000, rss_steady_kib=1100)],
                      ["metronome"])[0]
assert old["cpu_user_per_m"] is None and old["probe_sleeps_per_event"] is None, old
assert old["ipis_per_event"] == {} and "| 11.00 |" in bench.table([old]), bench.table([old])
print("bench.py's CPU split, sleeps and IPIs per event give the known answers")

# The c1 and sweep legs' arithmetic (scripts/bench_stream.py): the board's percentile rule, added
# latency per percentile against direct, and stall-free streams.
import bench_stream as bs
assert bs.board_pct(list(range(1, 101)), 0.5) == 51 and bs.board_pct(list(range(1, 101)), 0.99) == 100
assert bs.board_pct([7], 0.99) == 7 and bs.board_pct([], 0.5) is None
def stream(path, ttft_us, gaps_us, **extra):
    s = {"path": path, "status": 200, "content": len(gaps_us) + 1, "done": True,
         "ttft_ns": ttft_us * 1000, "gaps_ns": [g * 1000 for g in gaps_us],
         "max_gap_ns": max(gaps_us, default=0) * 1000}
    s.update(extra)
    return s
streams = [stream("direct", 100 + k, [20_000, 20_010]) for k in range(100)] + \
          [stream("nginx", 300 + 2 * k, [20_000, 20_050]) for k in range(100)] + \
          [stream("nginx", 1, [1], status=502)]
rows = {r["path"]: r for r in bs.c1_summary(streams, ["direct", "nginx"], 3)}
assert (rows["direct"]["ttft_p50"], rows["direct"]["ttft_p99"]) == (150, 199), rows
assert (rows["nginx"]["added_ttft_p50"], rows["nginx"]["added_ttft_p99"]) == (250, 299), rows
assert (rows["nginx"]["added_gap_p50"], rows["nginx"]["added_gap_p99"]) == (40, 40), rows
assert (rows["nginx"]["streams"], rows["nginx"]["failed"]) == (101, 1), rows
cell = bs.sweep_cell([stream("m", 10, [20_000, 250_000]), stream("m", 30, [20_000, 20_000]),
                      stream("m", 20, [20_000, 20_000], done=False)], 3, 200_000)
assert (cell["streams"], cell["failed"], cell["stall_free"], cell["ttft_p50_us"]) == (3, 1, 1, 30), cell
assert bs.highest_clean_level([{"level": 1, "streams": 1, "stall_free": 1},
                               {"level": 2, "streams": 2, "stall_free": 2},
                               {"level": 4, "streams": 4, "stall_free": 3}]) == 2
assert bs.highest_clean_level([{"level": 2, "streams": 2, "stall_free": 2},
                               {"level": 4, "streams": 4, "stall_free": 4},
                               {"level": 4, "streams": 4, "stall_free": 3}]) == 2, "every turn"
# A level given twice (two turns) is two rows of the table, each with its own turn's figures.
turns = [dict(row=r, level=512, path=p, load="0 0 0", ttft_p50_us=1000 * (r + 1), stall_free=5,
              streams=5) for r in (0, 1) for p in ("direct", "nginx")]
table = bs.sweep_table({"paths": ["direct", "nginx"], "levels": [512, 512], "cells": turns})
assert "| 512 | 1,000 µs, 5 of 5 | 1,000 µs, 5 of 5 |" in table, table
assert "| 512 | 2,000 µs, 5 of 5 | 2,000 µs, 5 of 5 |" in table, table
print("bench_stream.py's percentiles, added latency and stall-free streams give the known answers")

# --metronome-toml: added after the kept connections' timeout, and refused (before anything
# starts) where it would make the configuration invalid, such as a table the bench writes.
def refuse(message):
    raise ValueError(message)
added = bench.board_toml(["[batch]\nenabled = false"], refuse)
assert 'upstream_idle = "300s"' in added and added.index("upstream_idle") < added.index("[batch]")
assert bench.tomllib.loads(bench.metronome_config_text(1, 2, 3, True, extra=added))["batch"] == \
    {"enabled": False}
for bad in ("[metering]\nenabled = false", "[batch\n"):
    try:
        bench.board_toml([bad], refuse)
        raise AssertionError(f"accepted {bad!r}")
    except ValueError as e:
        assert str(e).startswith("--metronome-toml: "), e
print("--metronome-toml adds valid TOML to the board legs' metronome paths and refuses the rest")
# The run's command as the report records it: one line that bash reads back into the same words.
import json
words = ["scripts/bench.sh", "--metronome-toml", "[batch]\nenabled = false", "it's", "a\\b\tc", "x y", "plain"]
line = bench.shell_command(words)
assert "\n" not in line and line.startswith("scripts/bench.sh --metronome-toml $'[batch]\\nenabled"), line
echo = f"{sys.executable} -c 'import json, sys; print(json.dumps(sys.argv[1:]))' {line}"
back = json.loads(subprocess.run(["bash", "-c", echo], capture_output=True, text=True, check=True).stdout)
assert back == words, (line, back)
print("the report's command line gives its words back in bash, a TOML table's newlines included")
PY

tests=$(mktemp)
rustc --edition 2021 --test scripts/lib/streambench.rs -o "$tests"
"$tests" -q
rm -f "$tests"

out=$(mktemp)
trap 'rm -f "$out"; rm -rf "$work"' EXIT
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

# The CPU-per-stream script (scripts/cpu-per-stream.sh), tiny: one turn of one second per path
# on four connections; every path must complete streams and fail none.
C=4 D=1 ROUNDS=1 bash scripts/cpu-per-stream.sh > "$out" 2>&1 || {
  cat "$out"; echo "cpu-per-stream smoke FAILED: the script failed"; exit 1; }
rows=$(grep -cE '^\| (metronome|passthrough|nginx) \| [0-9.]+ \| [0-9.]+ \| [0-9,]+ \| [0-9,]+ µs \| 0 \|$' "$out" || true)
if [ "$rows" != 3 ]; then
  cat "$out"
  echo "cpu-per-stream smoke FAILED: expected a row for each of the three paths, none failing"
  exit 1
fi
echo "cpu-per-stream smoke passed"
