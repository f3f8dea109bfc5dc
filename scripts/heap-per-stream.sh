#!/usr/bin/env bash
# Where an open stream's memory goes: the proxy runs under valgrind's DHAT while STREAMS (default
# 300) streams are open through it, and the heap at its peak is split by allocation site, per
# stream. Complements scripts/rss-per-stream.sh, which measures the total (RSS counts only the
# pages an allocation touched, so the two differ: a buffer reserved but mostly unwritten is here
# in full).
#
#   scripts/heap-per-stream.sh [BIN]      # default: target/profiling/metronome (built)
#   STREAMS=500 scripts/heap-per-stream.sh
#   TLS=1 scripts/heap-per-stream.sh      # the listener terminates TLS (the probe agrees to
#                                         # http/1.1 in ALPN); a CA and a leaf made with openssl
#   DEPTH=6 scripts/heap-per-stream.sh    # show 6 frames of each site (default 2)
#   MIN_BYTES=10 scripts/heap-per-stream.sh  # list sites down to 10 bytes per stream (default 100)
#
# The sim streams 3,000-token streams at a 50 ms gap (none ends during the run); the probe opens
# the streams over 6 s; the proxy is stopped 16 s in, and DHAT's peak (t-gmax) is read. Prints the
# sites holding at least 100 bytes per stream, with the first frames of metronome's or hyper's
# code that allocated them. Everything is on 127.0.0.1; every process it starts is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/valgrind.sh
streams=${STREAMS:-300}
bin=${1:-}
[ -n "$bin" ] || { cargo build --profile profiling --quiet --bin metronome; bin=target/profiling/metronome; }

. scripts/lib/loopback.sh

sim_port=$(free_port); port=$(free_port); admin=$(free_port)
proxy_config "$port" "$admin" "$sim_port" true
url="http://127.0.0.1:$port"
tls_args=()
if [ "${TLS:-0}" = 1 ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=bench-ca \
    -keyout "$work/ca.key" -out "$work/ca.pem" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=localhost \
    -keyout "$work/leaf.key" -out "$work/leaf.csr" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' >"$work/leaf.ext"
  openssl x509 -req -in "$work/leaf.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" -CAcreateserial \
    -days 1 -extfile "$work/leaf.ext" -out "$work/leaf.pem" 2>/dev/null
  printf '\n[tls]\ncert = "%s"\nkey = "%s"\n' "$work/leaf.pem" "$work/leaf.key" >>"$work/m.toml"
  url="https://localhost:$port"
  tls_args=(--cacert "$work/ca.pem")
fi
"$bin" sim --listen "127.0.0.1:$sim_port" --gap 50ms --max-tokens-cap 10000 >"$work/sim.log" 2>&1 &
pids+=($!)
wait_port "$sim_port"
TOKIO_WORKER_THREADS=2 valgrind --tool=dhat --dhat-out-file="$work/dhat.out" \
  "$bin" serve --config "$work/m.toml" >"$work/proxy.log" 2>&1 &
proxy=$!
wait_port "$port"
"$bin" probe --url "$url" "${tls_args[@]}" --rate $((streams / 6 + 1)) --concurrency "$streams" \
  --duration 6s --max-tokens 3000 --timeout 300s --json "$work/probe.json" >"$work/probe.log" 2>&1 &
probe=$!
pids+=("$probe")
sleep 16
kill "$probe" 2>/dev/null || true
wait "$probe" 2>/dev/null || true
sleep 2
kill -TERM "$proxy"
wait "$proxy" || true

python3 - "$work/dhat.out" "$streams" "${DEPTH:-2}" "${MIN_BYTES:-100}" <<'PY'
import json, re, sys
path, streams, depth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
min_bytes = float(sys.argv[4])
d = json.load(open(path))
ftbl, pps = d["ftbl"], d["pps"]
total = sum(p.get("gb", 0) for p in pps)
skip = re.compile(r"alloc/src|__rust|malloc|memalign|raw_vec|hashbrown|bytes_mut|bytes-1|core/src"
                  r"|vg_replace|std/src/sys|/alloc\.rs|boxed|UnknownInlinedFun")
def site(p):
    frames = [re.sub(r"^0x[0-9A-Fa-f]+: ", "", ftbl[i]) for i in p["fs"]]
    frames = [f for f in frames if not skip.search(f)]
    frames = [re.sub(r"/root/\.cargo/registry/src/[^/]*/", "", f) for f in frames]
    frames = [re.sub(r"<[^()]*>", "<…>", f) for f in frames]
    return " ← ".join(f[:90] for f in frames[:depth]) or "?"
if not any(p.get("gb", 0) for p in pps):
    sys.exit("DHAT saw no heap: did the proxy start? (see the script's proxy.log)")
print(f"Heap at its peak with {streams} streams open: {total / 1024:.0f} KiB, "
      f"{total / streams / 1024:.1f} KiB per stream (DHAT t-gmax).\n")
print("| bytes per stream | blocks per stream | allocated at |")
print("|---|---|---|")
rest = 0
for p in sorted(pps, key=lambda p: -p.get("gb", 0)):
    per = p.get("gb", 0) / streams
    if per < min_bytes:
        rest += p.get("gb", 0)
        continue
    print(f"| {per:,.0f} | {p.get('gbk', 0) / streams:.2f} | {site(p)} |")
print(f"| {rest / streams:,.0f} | | every smaller site |")
PY
