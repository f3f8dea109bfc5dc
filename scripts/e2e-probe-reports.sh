#!/usr/bin/env bash
# End-to-end for `metronome probe` as a CI gate: its reports, read by the consumers CI systems
# use, agree with its exit code on every exit path.
#  1. a failed gate (exit 1), metronome in front of `metronome sim` at a steady cadence with a
#     stall, 6 streams: the JUnit file read by Python's junitparser (what GitLab- and
#     Jenkins-style tooling reads) has a test case per gate, the failing one a failure, and the
#     headline FAIL as a property; the JSON has every gate's expression, value and result and the
#     headline FAIL; the Markdown renders (Python-Markdown, tables) to a table of gates; the HTML
#     is opened in headless Chromium (Debian package): its DOM has the FAIL badge (never SMOOTH),
#     the gate table, the run metadata, the plots and every stream's ID linked to the admin's
#     /streams/{id}; a screenshot of the failed run is taken and is not blank;
#  2. a pass (exit 0): the headline is the verdict and no test case failed;
#  3. every stream failed (exit 3, a port nothing listens on): JUnit's <error> names the kind and
#     says why, with and without --assert;
#  4. model discovery failed (exit 3): a server that answers 401 and one that is down; every report
#     is still written, JUnit's <error> carries the status and the body, the HTML renders ERROR.
# Talks only to 127.0.0.1; a watchdog stops it after $E2E_PROBE_TIMEOUT seconds (default 300).
#
#   bash scripts/e2e-probe-reports.sh
#   KEEP_WORK=1 bash scripts/e2e-probe-reports.sh   # keep the reports and the screenshot
set -euo pipefail
cd "$(dirname "$0")/.."

TIMEOUT=${E2E_PROBE_TIMEOUT:-300}
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; exit 1; }

[ -x /usr/bin/chromium ] || {
  echo "installing chromium (Debian package)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
}
python3 -c 'import junitparser, markdown' 2>/dev/null \
  || python3 -m pip install -q junitparser markdown 2>/dev/null \
  || python3 -m pip install -q --break-system-packages junitparser markdown

# METRONOME_BIN runs another build (a debug one while working on the script).
if [ -z "${METRONOME_BIN:-}" ]; then cargo build --release --quiet; fi
BIN=${METRONOME_BIN:-$PWD/target/release/metronome}
. scripts/lib/loopback.sh
WORK=$work
if [ -n "${KEEP_WORK:-}" ]; then
  trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; echo "work directory kept: $WORK"' EXIT
fi
# The watchdog's sleep writes nowhere, so once the watchdog is killed nothing holds this script's
# stdout open (a CI runner reading it through a pipe would otherwise wait out the sleep).
( sleep "$TIMEOUT" >/dev/null 2>&1; echo "FAIL e2e-probe-reports: still running after ${TIMEOUT}s"; kill -TERM $$ ) 2>/dev/null &
pids+=($!)

CHROME=(/usr/bin/chromium --headless --no-sandbox --disable-gpu --no-first-run
  --disable-background-networking --disable-component-update --disable-sync
  --user-data-dir="$WORK/profile")

# The report flags of run $1: every report into $WORK/$1.*.
reports() { echo "--json $WORK/$1.json --junit $WORK/$1.xml --markdown $WORK/$1.md --html $WORK/$1.html"; }

# Runs the probe with the rest of the arguments, logging to $WORK/$1.{txt,err}; sets `code`.
run_probe() {
  local name=$1
  shift
  set +e
  "$BIN" probe "$@" >"$WORK/$name.txt" 2>"$WORK/$name.err"
  code=$?
  set -e
}

# Checks run $1's JUnit (junitparser) and JSON: headline $2, exit code $3, the failed gates $4
# (comma-separated, or -), the run's <error> type $5 (or -) and a text its message holds $6.
cat >"$WORK/check_reports.py" <<'PY'
import json, sys
from junitparser import JUnitXml, Error, Failure, Skipped
base, headline, exit_code, failed_gates, error_type, error_text = sys.argv[1:7]
failed_gates = [] if failed_gates == "-" else failed_gates.split(",")
xml = JUnitXml.fromfile(base + ".xml")
suites = list(xml)
assert len(suites) == 1, suites
suite = suites[0]
props = {p.name: p.value for p in suite.properties()}
assert props["headline"] == headline, props
assert props["exit_code"] == exit_code, props
cases = list(suite)
failed = [c.name for c in cases if any(isinstance(r, Failure) for r in c.result)]
assert failed == failed_gates, (failed, failed_gates)
errors = [r for c in cases for r in c.result if isinstance(r, Error)]
if error_type == "-":
    assert not errors, [(e.type, e.message) for e in errors]
else:
    assert len(errors) == 1 and errors[0].type == error_type, [(e.type, e.message) for e in errors]
    assert error_text in errors[0].message and error_text in errors[0].text, (errors[0].message, errors[0].text)
assert suite.tests == len(cases), (suite.tests, len(cases))
report = json.load(open(base + ".json"))
result = report["result"]
assert result["headline"] == headline and result["exit_code"] == int(exit_code), result
json_failed = [g["gate"] for g in report["gates"] if g["result"] == "fail"]
assert json_failed == failed_gates, (json_failed, failed_gates)
for gate in report["gates"]:
    assert set(gate) == {"gate", "metric", "op", "bound", "baseline", "value", "unit", "result"}, gate
if error_type != "-":
    assert result["failure"]["kind"] == error_type, result
    assert any(error_text in c for c in result["failure"]["causes"]) or error_text in result["failure"]["message"], result
md = open(base + ".md", encoding="utf-8").read()
assert md.startswith(f"## metronome probe: {headline}\n"), md[:200]
skipped = sum(1 for c in cases for r in c.result if isinstance(r, Skipped))
print(f"ok   {base.rsplit('/', 1)[-1]}: junitparser read {len(cases)} test cases (failed {failed}, "
      f"errors {[e.type for e in errors]}, skipped {skipped}); JSON and Markdown headline {headline}")
PY
check_reports() { python3 "$WORK/check_reports.py" "$WORK/$1" "${@:2}" || fail "the reports of '$1' disagree"; }

# Renders run $1's HTML in Chromium, its DOM to $WORK/$1.dom.
render_html() {
  timeout 60 "${CHROME[@]}" --dump-dom "file://$WORK/$1.html" >"$WORK/$1.dom" 2>>"$WORK/chromium.log" \
    || { tail -5 "$WORK/chromium.log"; fail "Chromium did not render the HTML report of '$1'"; }
}

SIM=$(free_port) PROXY=$(free_port) ADMIN=$(free_port)
"$BIN" sim --listen "127.0.0.1:$SIM" --gap 20ms --ttft 40ms --tokens 30 --stall-at 12 --stall 300ms \
  >"$WORK/sim.log" 2>&1 & pids+=($!)
"$BIN" serve --listen "127.0.0.1:$PROXY" --admin "127.0.0.1:$ADMIN" --upstream "http://127.0.0.1:$SIM" \
  >"$WORK/serve.log" 2>&1 & pids+=($!)
wait_port "$SIM" && wait_port "$PROXY" && wait_port "$ADMIN"

# 1. A failed gate.
# shellcheck disable=SC2046
run_probe gate --url "http://127.0.0.1:$PROXY" -n 6 --concurrency 3 --join "http://127.0.0.1:$ADMIN" \
  --slo 'ttft<2s,stalls==0' --assert 'errors==0,itl_p99<1s,goodput>=0.9' $(reports gate)
[ "$code" = 1 ] || { cat "$WORK/gate.txt" "$WORK/gate.err"; fail "a failed goodput gate exits 1 (got $code)"; }
pass "every stream stalled once, so goodput>=0.9 failed: exit code 1"
grep -q '^result         FAIL   (1 of 3 gates failed: goodput>=0.9; the verdict alone is JANKY)$' "$WORK/gate.txt" \
  || { cat "$WORK/gate.txt"; fail "the text report's result line is not FAIL"; }
check_reports gate FAIL 1 "goodput>=0.9" - -

python3 - "$WORK/gate.md" <<'PY' || fail "the markdown summary does not render as a table of gates"
import sys, markdown
html = markdown.markdown(open(sys.argv[1], encoding="utf-8").read(), extensions=["tables"])
assert "<table>" in html, html
rows = html.count("<tr>")
assert "goodput&gt;=0.9" in html and "FAIL" in html, html
print(f"ok   markdown renders: {html.count('<table>')} table(s), {rows} rows")
PY

render_html gate
timeout 60 "${CHROME[@]}" --window-size=1280,2400 --screenshot="$WORK/gate.png" "file://$WORK/gate.html" \
  >>"$WORK/chromium.log" 2>&1 || { tail -5 "$WORK/chromium.log"; fail "Chromium took no screenshot"; }
python3 - "$WORK/gate.dom" "$WORK/gate.png" "$WORK/gate.json" "$ADMIN" <<'PY' || fail "the rendered report lacks a part"
import json, re, struct, sys, zlib
dom, png, report, admin = open(sys.argv[1]).read(), sys.argv[2], json.load(open(sys.argv[3])), sys.argv[4]
assert '<span class="v FAIL">FAIL</span>' in dom, "no FAIL badge"
assert 'class="v SMOOTH"' not in dom and 'class="v JANKY"' not in dom, "a verdict badge on a failed gate"
assert "<title>metronome probe: FAIL</title>" in dom
for heading in ["Result", "Run", "Time to first token", "Gaps between token events", "Cadence per stream",
                "Where the gaps come from"]:
    assert f"<h2>{heading}</h2>" in dom, heading
gates = re.findall(r'<tr class="(pass|fail|not_measured)"><td><code>([^<]*(?:&[lg]t;[^<]*)*)</code></td><td>([^<]*)</td><td class="r">(\w+)</td></tr>', dom)
assert [(c, g, r) for c, g, _, r in gates] == [
    ("pass", "errors==0", "PASS"), ("pass", "itl_p99&lt;1s", "PASS"), ("fail", "goodput&gt;=0.9", "FAIL")], gates
assert all(v.startswith("measured ") for _, _, v, _ in gates), gates
assert dom.count("<svg") >= 3, dom.count("<svg")
import urllib.request
links = sorted(set(re.findall(rf'href="(http://127\.0\.0\.1:{admin}/streams/[^"]+)"', dom)))
assert len(links) == report["requests"] == 6, (links, report["requests"])
for link in links:  # each links to a timeline the admin still holds
    with urllib.request.urlopen(link, timeout=5) as answer:
        assert answer.status == 200 and json.load(answer), link
# The screenshot: a PNG whose decoded rows are not all one colour.
data = open(png, "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
w, h = struct.unpack(">II", data[16:24])
chunks, at = b"", 8
while at < len(data):
    n, kind = struct.unpack(">I4s", data[at:at + 8])
    if kind == b"IDAT":
        chunks += data[at + 8:at + 8 + n]
    at += 12 + n
raw = zlib.decompress(chunks)
distinct = len(set(raw[i:i + 64] for i in range(0, len(raw), 4096)))
assert distinct > 10, f"the screenshot looks blank ({distinct} distinct samples)"
print(f"ok   Chromium rendered the failed run: FAIL badge, {len(gates)} gates, {dom.count('<svg')} plots, "
      f"{len(links)} stream links; screenshot {w}x{h}, {len(data)} bytes")
PY

# 2. A pass: the headline is the verdict.
# shellcheck disable=SC2046
run_probe pass --url "http://127.0.0.1:$PROXY" -n 2 --assert 'errors==0,itl_p99<1s' $(reports pass)
[ "$code" = 0 ] || { cat "$WORK/pass.txt" "$WORK/pass.err"; fail "passing gates exit 0 (got $code)"; }
verdict=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["verdict"])' "$WORK/pass.json")
check_reports pass "$verdict" 0 - - -
pass "passing gates: exit code 0, headline $verdict"

# 3. Every stream failed: a port nothing listens on, with and without gates.
DEAD=$(free_port)
for gates in "" "--assert errors<1"; do
  # shellcheck disable=SC2046,SC2086
  run_probe dead --url "http://127.0.0.1:$DEAD" -n 2 --model m $gates $(reports dead)
  [ "$code" = 3 ] || { cat "$WORK/dead.txt" "$WORK/dead.err"; fail "a refused port exits 3 (got $code, gates '$gates')"; }
  failed="-"; [ -n "$gates" ] && failed="errors<1"
  check_reports dead ERROR 3 "$failed" no_stream_completed "Connection refused"
done
pass "a refused port: exit code 3, with and without --assert, the cause in JUnit's <error>"

# 4. Model discovery failed: a server answering 401 (echoing the key, which must not show), and
# a server that is down.
REFUSING=$(free_port)
python3 - "$REFUSING" >"$WORK/refusing.log" 2>&1 <<'PY' &
import http.server, json, sys
class Refuse(http.server.BaseHTTPRequestHandler):
    def answer(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.dumps({"error": {"message": "Incorrect API key provided: " +
                                     self.headers.get("authorization", "")}}).encode()
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = answer
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Refuse).serve_forever()
PY
pids+=($!)
wait_port "$REFUSING"
# shellcheck disable=SC2046
OPENAI_API_KEY=sk-e2e-secret run_probe unauthorized --url "http://127.0.0.1:$REFUSING" -n 2 \
  --assert 'errors==0' $(reports unauthorized)
[ "$code" = 3 ] || { cat "$WORK/unauthorized.txt" "$WORK/unauthorized.err"; fail "a 401 model list exits 3 (got $code)"; }
check_reports unauthorized ERROR 3 - discovery "answered 401: "
if grep -l "sk-e2e-secret" "$WORK"/unauthorized.*; then fail "the API key shows in a report or the output"; fi
pass "the API key the server echoed shows in no report and no output"
render_html unauthorized
grep -q '<span class="v ERROR">ERROR</span>' "$WORK/unauthorized.dom" || fail "the 401 run's HTML is not ERROR"
grep -q 'The run failed (discovery):' "$WORK/unauthorized.dom" || fail "the 401 run's HTML lacks the failure"
grep -q 'answered 401: ' "$WORK/unauthorized.dom" || fail "the 401 run's HTML lacks the status"
pass "Chromium rendered the 401 run: ERROR badge, the failure and its status"

# shellcheck disable=SC2046
run_probe down --url "http://127.0.0.1:$DEAD" -n 2 --assert 'errors==0' $(reports down)
[ "$code" = 3 ] || { cat "$WORK/down.txt" "$WORK/down.err"; fail "a server that is down exits 3 (got $code)"; }
check_reports down ERROR 3 - discovery "/v1/models failed"
pass "model discovery failed (401, and a server that is down): exit code 3, every report written"
echo "e2e-probe-reports: all checks passed"
