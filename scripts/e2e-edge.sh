#!/usr/bin/env bash
# End-to-end with a real edge: nginx (Debian package) in front of metronome, in front of
# `metronome sim` at a steady cadence. Shows, with real software, what the beacon and the
# stream timelines promise (docs/beacon.md):
#  1. through nginx with `proxy_buffering on` and small buffers, `metronome probe --join`
#     attributes the clumps and the added gaps to the edge ("after metronome"), and the client's
#     ITL p50 falls while its TTFT and ITL p99 rise (the signature of a buffering proxy);
#  2. through nginx with `proxy_buffering off`, the edge's share is near zero;
#  3. headless Chromium (Debian package) loads a page from nginx that streams through nginx and
#     metronome with assets/metronome-beacon.js: metronome's
#     metronome_inter_token_latency_seconds{point="client"} shows the clumping (gaps under 1 ms)
#     that the ingress curve does not.
# Asserts directions and rough sizes, never exact times. Talks only to 127.0.0.1, bounded in
# streams and time (a watchdog stops it after $E2E_EDGE_TIMEOUT seconds, default 600).
# Installs nginx, chromium and nodejs with apt-get when missing. Needs metronome's /streams and
# beacon endpoint; says so and fails when they are not there.
#
#   bash scripts/e2e-edge.sh            # run the checks
#   KEEP_WORK=1 bash scripts/e2e-edge.sh   # keep the work directory (configs, logs, reports)
#   REPORT=FILE bash scripts/e2e-edge.sh   # also write the example's output as markdown to FILE
set -euo pipefail
cd "$(dirname "$0")/.."

TIMEOUT=${E2E_EDGE_TIMEOUT:-600}
STREAMS=${E2E_EDGE_STREAMS:-8}  # probe streams per run
TOKENS=${E2E_EDGE_TOKENS:-60}   # tokens per stream
GAP_MS=30                       # the sim's steady cadence
PAGE_STREAMS=4                  # streams the browser page runs

pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; exit 1; }
. scripts/lib/metrics.sh
need() { command -v "$1" >/dev/null 2>&1; }

missing=()
need nginx || [ -x /usr/sbin/nginx ] || missing+=(nginx)
[ -x /usr/bin/chromium ] || missing+=(chromium)
need node || missing+=(nodejs)
need curl || missing+=(curl)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]} (Debian packages)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
NODE_WS=(node)
node -e 'typeof WebSocket === "function" || process.exit(1)' 2>/dev/null \
  || NODE_WS=(node --experimental-websocket)
"${NODE_WS[@]}" -e 'typeof WebSocket === "function" || process.exit(1)' 2>/dev/null \
  || fail "node has no WebSocket (needs node 20 with --experimental-websocket, or 22+)"

cargo build --release --quiet
BIN=$PWD/target/release/metronome
WORK=$(mktemp -d)
chmod 755 "$WORK"
PIDS=()
cleanup() {
  local status=$?
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  # Chromium's helper processes are not in PIDS; they name the work directory in their command
  # line (--user-data-dir) and may still be writing there for a moment.
  pkill -f -- "$WORK" 2>/dev/null || true
  wait 2>/dev/null || true
  if [ -n "${KEEP_WORK:-}" ]; then
    echo "work directory kept: $WORK"
  else
    rm -rf "$WORK" 2>/dev/null || { sleep 1; rm -rf "$WORK" 2>/dev/null || true; }
  fi
  # The checks decide the exit status, never the clean-up.
  exit "$status"
}
trap cleanup EXIT
( sleep "$TIMEOUT"; echo "FAIL e2e-edge: still running after ${TIMEOUT}s"; kill -TERM $$ ) 2>/dev/null &
PIDS+=($!)

wait_port() { # PORT
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
  fail "nothing listens on 127.0.0.1:$1"
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { # URL
  for _ in $(seq 1 100); do curl -fs -o /dev/null "$1" && return 0; sleep 0.1; done
  fail "$1 never answered"
}

SIM_PORT=$(free_port); PROXY_PORT=$(free_port); ADMIN_PORT=$(free_port)
EDGE_BUF=$(free_port); EDGE_BUF11=$(free_port); EDGE_NOBUF=$(free_port); DEVTOOLS=$(free_port)
ADMIN=http://127.0.0.1:$ADMIN_PORT

# The upstream: a steady cadence, one token event per frame.
$BIN sim --listen "127.0.0.1:$SIM_PORT" --gap ${GAP_MS}ms --ttft 100ms >"$WORK/sim.log" 2>&1 & PIDS+=($!)
cat >"$WORK/metronome.toml" <<TOML
[server]
listen = "127.0.0.1:$PROXY_PORT"
admin = "127.0.0.1:$ADMIN_PORT"
upstream = "http://127.0.0.1:$SIM_PORT"
drain_grace = "2s"
[[routes]]
name = "chat"
path = "/v1/chat/completions"
match = "exact"
TOML
$BIN serve --config "$WORK/metronome.toml" >"$WORK/serve.log" 2>&1 & PIDS+=($!)
wait_http "http://127.0.0.1:$SIM_PORT/health"
wait_http "$ADMIN/healthz"

# The server side must be there: /streams on the admin listener, the beacon path on
# the proxy listener.
status=$(curl -s -o /dev/null -w '%{http_code}' "$ADMIN/streams" || true)
[ "$status" = 200 ] || fail "metronome's admin listener has no /streams (got $status): this needs the stream timelines and the beacon endpoint"
status=$(curl -s -o /dev/null -w '%{http_code}' -X POST -d '{"v":1,"id":"00","gaps_ms":[]}' \
  "http://127.0.0.1:$PROXY_PORT/.well-known/metronome/beacon" || true)
[ "$status" = 400 ] || fail "metronome's proxy listener does not answer the beacon path (an unknown ID got $status, not 400): this needs the beacon endpoint"
pass "metronome serves /streams and answers the beacon path"

# The edge: one nginx, three server blocks in front of metronome.
#  - buffered: a stock reverse proxy with small buffers: `proxy_buffering on` (nginx's default),
#    X-Accel-Buffering not disabled, and nginx's default HTTP/1.0 to the upstream. metronome then
#    sends the body close-delimited, and nginx hands a 4 KiB buffer on only when it is full (or the
#    response ends): ~17 SSE events of ~230 bytes leave together. It also serves the test page and
#    the beacon module (same origin as the stream and the beacon path).
#  - buffered, HTTP/1.1: the same with `proxy_http_version 1.1`. Measured with nginx 1.22: the
#    upstream body is chunked and nginx passes each complete chunk on at once, buffering or not.
#  - unbuffered: `proxy_buffering off`, what a streaming-aware edge does.
mkdir -p "$WORK/www" "$WORK/nginx"
cp assets/metronome-beacon.js scripts/e2e-edge/page.html "$WORK/www/"
chmod -R a+rX "$WORK/www"
cat >"$WORK/nginx/nginx.conf" <<NGINX
daemon off;
worker_processes 1;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 256; }
http {
  access_log $WORK/nginx/access.log;
  client_body_temp_path $WORK/nginx/client_body;
  proxy_temp_path $WORK/nginx/proxy;
  fastcgi_temp_path $WORK/nginx/fastcgi;
  uwsgi_temp_path $WORK/nginx/uwsgi;
  scgi_temp_path $WORK/nginx/scgi;
  types { text/html html; application/javascript js; }
  server {
    listen 127.0.0.1:$EDGE_BUF;
    root $WORK/www;
    location = / { try_files /page.html =404; }
    location = /metronome-beacon.js { }
    location / {
      proxy_pass http://127.0.0.1:$PROXY_PORT;
      proxy_buffering on;
      proxy_buffer_size 4k;
      proxy_buffers 8 4k;
      proxy_busy_buffers_size 8k;
    }
  }
  server {
    listen 127.0.0.1:$EDGE_BUF11;
    location / {
      proxy_pass http://127.0.0.1:$PROXY_PORT;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering on;
      proxy_buffer_size 4k;
      proxy_buffers 8 4k;
      proxy_busy_buffers_size 8k;
    }
  }
  server {
    listen 127.0.0.1:$EDGE_NOBUF;
    location / {
      proxy_pass http://127.0.0.1:$PROXY_PORT;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
NGINX
"$NGINX" -t -c "$WORK/nginx/nginx.conf" -p "$WORK/nginx" >"$WORK/nginx/test.log" 2>&1 \
  || { cat "$WORK/nginx/test.log"; fail "nginx refused the configuration"; }
"$NGINX" -c "$WORK/nginx/nginx.conf" -p "$WORK/nginx" & PIDS+=($!)
wait_http "http://127.0.0.1:$EDGE_BUF/metronome-beacon.js"
wait_port "$EDGE_NOBUF"
wait_port "$EDGE_BUF11"
pass "nginx $("$NGINX" -v 2>&1 | sed 's/.*nginx\///') in front of metronome: buffering on :$EDGE_BUF (HTTP/1.0 upstream) and :$EDGE_BUF11 (HTTP/1.1), off :$EDGE_NOBUF"

# 1 and 2: the probe through each edge (and straight to metronome), joined with the timelines.
probe() { # NAME URL
  $BIN probe --url "$2/v1/chat/completions" --requests "$STREAMS" --concurrency 2 \
    --max-tokens "$TOKENS" --timeout 60s --join "$ADMIN" --json "$WORK/$1.json" >"$WORK/$1.txt" \
    || { cat "$WORK/$1.txt"; fail "probe $1 failed"; }
}
probe direct "http://127.0.0.1:$PROXY_PORT"
probe unbuffered "http://127.0.0.1:$EDGE_NOBUF"
probe buffered_http11 "http://127.0.0.1:$EDGE_BUF11"
probe buffered "http://127.0.0.1:$EDGE_BUF"
for run in direct unbuffered buffered_http11 buffered; do echo "--- probe: $run"; cat "$WORK/$run.txt"; done

python3 - "$WORK" "$STREAMS" "$GAP_MS" <<'PY' || fail "attribution through nginx"
import json, sys
work, streams, gap = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
runs = {name: json.load(open(f"{work}/{name}.json"))
        for name in ("direct", "unbuffered", "buffered_http11", "buffered")}
def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        sys.exit(1)
for name, r in runs.items():
    a = r["attribution"]
    check(r["errors"] == 0 and a["streams_joined"] == streams and a["token_count_mismatches"] == 0,
          f"{name}: {streams} streams, no errors, all joined with their timelines, token counts agree")
buf, unbuf = runs["buffered"], runs["unbuffered"]
b, u = buf["attribution"], unbuf["attribution"]
# The signature of a buffering proxy at the client.
check(buf["itl_ms"]["p50"] < 0.5 * unbuf["itl_ms"]["p50"],
      f"client ITL p50 falls: {buf['itl_ms']['p50']} ms buffered vs {unbuf['itl_ms']['p50']} ms unbuffered")
check(buf["itl_ms"]["p99"] > 3 * unbuf["itl_ms"]["p99"],
      f"client ITL p99 rises: {buf['itl_ms']['p99']} ms vs {unbuf['itl_ms']['p99']} ms")
check(buf["ttft_ms"]["p50"] > unbuf["ttft_ms"]["p50"] + 2 * gap,
      f"client TTFT p50 rises: {buf['ttft_ms']['p50']} ms vs {unbuf['ttft_ms']['p50']} ms")
# Attributed to the edge, not to generation or metronome.
p50, p99 = b["gap_ms"]["p50"], b["gap_ms"]["p99"]
check(abs(p50["generation"] - gap) < 0.5 * gap and p50["after_metronome"] < -0.5 * gap,
      f"buffered p50 gap: {p50['client']} ms = {p50['generation']} generation "
      f"{p50['metronome']:+} metronome {p50['after_metronome']:+} after metronome (a clump)")
check(p99["after_metronome"] > 0.7 * p99["client"] and abs(p99["metronome"]) < 5,
      f"buffered p99 gap: {p99['client']} ms, {p99['after_metronome']} ms of it after metronome")
check(b["wait_share"]["after_metronome"] > 0.5 and b["wait_share"]["metronome"] < 0.05,
      f"buffered: {100 * b['wait_share']['after_metronome']:.1f}% of the client's waiting added after "
      f"metronome, {100 * b['wait_share']['metronome']:.2f}% by metronome")
check(b["ttft_ms"]["p50"]["after_metronome"] > 2 * gap,
      f"buffered: the first token was held {b['ttft_ms']['p50']['after_metronome']} ms after metronome")
cb = b["clumping"]
check(cb["events_per_read"]["mean"] > 3 * cb["events_per_frame"]["mean"],
      f"buffered clumping: {cb['events_per_read']['mean']:.2f} events per client read "
      f"(p95 {cb['events_per_read']['p95']}) vs {cb['events_per_frame']['mean']:.2f} per upstream frame")
check(u["wait_share"]["after_metronome"] < 0.1 and abs(u["gap_ms"]["p50"]["after_metronome"]) < 5,
      f"unbuffered: edge share {100 * u['wait_share']['after_metronome']:.2f}%, "
      f"p50 after metronome {u['gap_ms']['p50']['after_metronome']} ms")
cu = u["clumping"]
check(cu["events_per_read"]["mean"] < 1.5,
      f"unbuffered: {cu['events_per_read']['mean']:.2f} events per client read")
PY

# 3. The browser: headless Chromium loads the page through the buffering edge.
metrics_when_idle "127.0.0.1:$ADMIN_PORT" "$WORK/metrics-before.txt" || fail "the probes' streams never ended"
before=$(cat "$WORK/metrics-before.txt")
PROFILE=$(mktemp -d -p "$WORK")
/usr/bin/chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$PROFILE" --remote-debugging-address=127.0.0.1 \
  --remote-debugging-port="$DEVTOOLS" --remote-allow-origins="*" about:blank \
  >"$WORK/chromium.log" 2>&1 & PIDS+=($!)
timeout 150 "${NODE_WS[@]}" scripts/e2e-edge/drive.mjs "$DEVTOOLS" "http://127.0.0.1:$EDGE_BUF/" \
  "$PAGE_STREAMS" "$TOKENS" >"$WORK/page.json" \
  || { tail -20 "$WORK/chromium.log"; fail "the page did not run in Chromium"; }
# The page sends its beacons with sendBeacon, which does not wait for them: wait (up to 20 s) for
# metronome to have taken as many as the page ran streams, then scrape once the streams are done.
beacons_accepted() {
  curl -fs "$ADMIN/metrics" | awk '/^metronome_beacons_total\{.*result="accepted"/ { n += $NF } END { print n + 0 }'
}
beacons_before=$(echo "$before" | awk '/^metronome_beacons_total\{.*result="accepted"/ { n += $NF } END { print n + 0 }')
for _ in $(seq 1 200); do
  [ "$(beacons_accepted)" -ge $((beacons_before + PAGE_STREAMS)) ] && break
  sleep 0.1
done
metrics_when_idle "127.0.0.1:$ADMIN_PORT" "$WORK/metrics.txt" || fail "the page's streams never ended"
echo "$before" >"$WORK/metrics-before.txt"
python3 - "$WORK" "$PAGE_STREAMS" "$TOKENS" <<'PY' || fail "the beacon's client curve"
import json, re, sys
work, n, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        sys.exit(1)
page = json.load(open(f"{work}/page.json"))
check(len(page) == n and all(p["status"] == 200 and p["id"] and p["summary"] for p in page),
      f"Chromium streamed {n} chat completions through nginx and metronome, each with a stream ID and a summary")
check(all(len(p["summary"]["gaps_ms"]) == tokens - 1 for p in page),
      f"the page counted {tokens} token events per stream")
def series(path):
    out = {}
    for line in open(path):
        m = re.match(r'^(metronome_[a-z_]+)\{([^}]*)\} (\S+)$', line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out
before, after = series(f"{work}/metrics-before.txt"), series(f"{work}/metrics.txt")
def delta(name, **labels):
    total = 0.0
    for (metric, text), value in after.items():
        if metric != name:
            continue
        got = dict(kv.split("=", 1) for kv in re.findall(r'(\w+="[^"]*")', text))
        got = {k: v.strip('"') for k, v in got.items()}
        if all(got.get(k) == v for k, v in labels.items()):
            total += value - before.get((metric, text), 0.0)
    return total
accepted = delta("metronome_beacons_total", result="accepted")
check(accepted == n, f"metronome accepted {accepted:.0f} beacons (result=\"accepted\")")
itl = "metronome_inter_token_latency_seconds"
rows = {}
with open(f"{work}/client-curve.txt", "w") as table:
    table.write(f"{itl} during the page's {n} streams (le=\"0.001\" bucket against _count):\n")
    for point in ("ingress", "egress", "client"):
        count = delta(itl + "_count", point=point)
        fast = delta(itl + "_bucket", point=point, le="0.001")
        rows[point] = (fast, count)
        line = f"  point=\"{point}\"{' ' * (8 - len(point))} {fast:4.0f} of {count:4.0f} gaps under 1 ms ({100 * fast / max(count, 1):.0f}%)"
        print("    " + line)
        table.write(line + "\n")
check(rows["client"][1] == n * (tokens - 1), f"the client curve has {n * (tokens - 1)} gaps, one per beacon gap")
check(rows["client"][0] / rows["client"][1] > 0.5 and rows["ingress"][0] / max(rows["ingress"][1], 1) < 0.1,
      "point=\"client\" shows the clumping (most gaps under 1 ms) that point=\"ingress\" does not")
PY

if [ -n "${REPORT:-}" ]; then
  {
    echo "nginx $("$NGINX" -v 2>&1 | sed 's/.*nginx\///'), $STREAMS streams of $TOKENS tokens at a steady ${GAP_MS} ms per run."
    for run in direct unbuffered buffered_http11 buffered; do
      echo; echo "### $run"; echo; echo '```'; cat "$WORK/$run.txt"; echo '```'
    done
    echo; echo "### Chromium through the buffering edge ($PAGE_STREAMS streams, beacon module)"; echo; echo '```'
    cat "$WORK/client-curve.txt"
    grep '^metronome_beacons_total' "$WORK/metrics.txt" || true
    echo '```'
  } >"$REPORT"
  echo "report written to $REPORT"
fi
echo "e2e-edge: all checks passed"
