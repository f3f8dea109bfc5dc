#!/usr/bin/env bash
# Heap allocations metronome's proxy process makes per request, and where, counted by valgrind's
# DHAT: every malloc, calloc and realloc of the whole process (both runtimes, the metering, the
# logs), so the per-request work can be set beside nginx's pools (docs/perf-first-token.md).
#
#   scripts/allocations-per-request.sh [BIN ...]   # default: target/profiling/metronome
#   TOKENS=3 TOP=25 scripts/allocations-per-request.sh BIN
#
# For each binary: the sim (native, not measured) streams TOKENS token events per request; the
# proxy runs under DHAT; the probe (native) sends 20 and then 120 requests one at a time on
# keep-alive connections; the difference between the two runs' counts divided by 100 is the
# per-request figure, so start-up and shut-down cancel out. Prints the allocations per request
# and the TOP call sites, each named by its innermost metronome function (or, where no metronome
# frame is on the stack, its innermost frame outside the allocator and the standard library).
# A profiling build (`cargo build --profile profiling`) keeps the symbols the sites need.
# Everything is on 127.0.0.1; every process it starts is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/valgrind.sh
[ $# -gt 0 ] || { cargo build --profile profiling --quiet --bin metronome; set -- target/profiling/metronome; }

. scripts/lib/loopback.sh

# One proxy under DHAT, `requests` streams of TOKENS token events through it, one at a time.
# Leaves its DHAT output in $work/dhat.$requests.json.
measure() {
  local bin=$1 requests=$2 port admin
  port=$(free_port)
  admin=$(free_port)
  proxy_config "$port" "$admin" "$sim_port" true per_core
  TOKIO_WORKER_THREADS=2 valgrind --tool=dhat --dhat-out-file="$work/dhat.$requests.json" \
    "$bin" serve --config "$work/m.toml" >"$work/proxy.log" 2>&1 &
  local proxy=$!
  wait_port "$port"
  "$bin" probe --url "http://127.0.0.1:$port" --concurrency 1 --requests "$requests" \
    --max-tokens "${TOKENS:-3}" --timeout 60s --detail "$work/probe.json" >/dev/null 2>&1 || true
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["errors"] == 0, d' "$work/probe.json"
  kill -TERM "$proxy"
  wait "$proxy" || true
}

for bin in "$@"; do
  start_sim "$bin" --gap 2ms --ttft 5ms --tokens "${TOKENS:-3}"
  measure "$bin" 20
  measure "$bin" 120
  stop_sim
  python3 - "$bin" "$work/dhat.20.json" "$work/dhat.120.json" "${TOP:-25}" <<'EOF'
import collections, json, re, sys

bin_, small, large, top = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
OUTSIDE = re.compile(r"^(alloc::|core::|std::|<alloc::|<core::|<std::|hashbrown::|<hashbrown::|"
                     r"bytes::|<bytes::|malloc|calloc|realloc|__rust|_int_|\?\?\?|0x)")

def site(frames):
    names = [re.sub(r"^0x[0-9A-F]+: ", "", f) for f in frames]
    names = [re.sub(r" \(.*\)$", "", n) for n in names]
    for n in names:
        if "metronome::" in n:
            return n
    for n in names[1:]:
        if not OUTSIDE.match(n):
            return n
    return names[1] if len(names) > 1 else "?"

def load(path):
    d = json.load(open(path))
    table = d["ftbl"]
    blocks, bytes_ = collections.Counter(), collections.Counter()
    for pp in d["pps"]:
        key = site([table[i] for i in pp["fs"]])
        blocks[key] += pp["tbk"]
        bytes_[key] += pp["tb"]
    return blocks, bytes_

b_s, y_s = load(small)
b_l, y_l = load(large)
per = {k: (b_l[k] - b_s.get(k, 0)) / 100 for k in b_l}
per_bytes = {k: (y_l[k] - y_s.get(k, 0)) / 100 for k in y_l}
print(f"## {bin_}: {sum(per.values()):.1f} allocations, {sum(per_bytes.values()):,.0f} bytes per request")
print("| allocations per request | bytes per request | innermost metronome function (or frame) |")
print("|---|---|---|")
for k in sorted(per, key=lambda k: -per[k])[:top]:
    if per[k] < 0.05:
        break
    print(f"| {per[k]:.2f} | {per_bytes[k]:,.0f} | `{k[:140]}` |")
EOF
done
