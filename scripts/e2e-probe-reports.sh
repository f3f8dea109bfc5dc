#!/usr/bin/env bash
# End-to-end for `metronome probe` as a CI gate (issue 30), read by the consumers CI systems use:
#  1. the JUnit file is parsed by Python's junitparser (what GitLab- and Jenkins-style tooling
#     reads), one test case per gate, the failing gate a failure with its message;
#  2. the markdown summary renders to HTML with Python-Markdown's tables extension: a table with
#     a row per gate;
#  3. the HTML report is opened in headless Chromium (Debian package): the DOM it renders has the
#     run metadata, the TTFT distribution, the tail plot, the cadence per stream and every
#     stream's ID linked to the admin's /streams/{id}; a screenshot is taken and is not blank;
#  4. the exit code is 1 for a failed gate and 0 when every gate passes, and 3 when the server
#     refuses every request, whether or not --assert is given.
# The run is metronome in front of `metronome sim` at a steady cadence with a stall, 6 streams.
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
( sleep "$TIMEOUT"; echo "FAIL e2e-probe-reports: still running after ${TIMEOUT}s"; kill -TERM $$ ) 2>/dev/null &
pids+=($!)

SIM=$(free_port) PROXY=$(free_port) ADMIN=$(free_port)
"$BIN" sim --listen "127.0.0.1:$SIM" --gap 20ms --ttft 40ms --tokens 30 --stall-at 12 --stall 300ms \
  >"$WORK/sim.log" 2>&1 & pids+=($!)
"$BIN" serve --listen "127.0.0.1:$PROXY" --admin "127.0.0.1:$ADMIN" --upstream "http://127.0.0.1:$SIM" \
  >"$WORK/serve.log" 2>&1 & pids+=($!)
wait_port "$SIM" && wait_port "$PROXY" && wait_port "$ADMIN"

set +e
"$BIN" probe --url "http://127.0.0.1:$PROXY" -n 6 --concurrency 3 --join "http://127.0.0.1:$ADMIN" \
  --slo 'ttft<2s,stalls==0' --assert 'errors<1,itl_p99<1s,goodput>=0.9' \
  --json "$WORK/run.json" --junit "$WORK/run.xml" --markdown "$WORK/run.md" --html "$WORK/run.html" \
  >"$WORK/probe.txt" 2>"$WORK/probe.err"
code=$?
set -e
[ "$code" = 1 ] || { cat "$WORK/probe.txt" "$WORK/probe.err"; fail "a failed goodput gate exits 1 (got $code)"; }
pass "every stream stalled once, so goodput>=0.9 failed: exit code 1"

# 1. JUnit, by junitparser.
python3 - "$WORK/run.xml" <<'PY' || fail "junitparser read the JUnit file differently"
import sys
from junitparser import JUnitXml, Failure
xml = JUnitXml.fromfile(sys.argv[1])
cases = [case for suite in xml for case in suite]
names = [case.name for case in cases]
failed = [case.name for case in cases if any(isinstance(r, Failure) for r in case.result)]
assert "errors<1" in names and "itl_p99<1s" in names and "goodput>=0.9" in names, names
assert failed == ["goodput>=0.9"], failed
total = sum(suite.tests for suite in xml)
assert total == len(cases), (total, len(cases))
print(f"ok   junitparser: {len(cases)} test cases, failed: {failed}")
PY

# 2. Markdown, rendered.
python3 - "$WORK/run.md" <<'PY' || fail "the markdown summary does not render as a table of gates"
import sys, markdown
html = markdown.markdown(open(sys.argv[1], encoding="utf-8").read(), extensions=["tables"])
assert "<table>" in html, html
rows = html.count("<tr>")
assert "goodput&gt;=0.9" in html and "FAIL" in html, html
print(f"ok   markdown renders: {html.count('<table>')} table(s), {rows} rows")
PY

# 3. HTML, in Chromium.
CHROME=(/usr/bin/chromium --headless --no-sandbox --disable-gpu --no-first-run
  --disable-background-networking --disable-component-update --disable-sync
  --user-data-dir="$WORK/profile")
timeout 60 "${CHROME[@]}" --dump-dom "file://$WORK/run.html" >"$WORK/dom.html" 2>"$WORK/chromium.log" \
  || { tail -5 "$WORK/chromium.log"; fail "Chromium did not render the HTML report"; }
timeout 60 "${CHROME[@]}" --window-size=1280,2400 --screenshot="$WORK/run.png" "file://$WORK/run.html" \
  >>"$WORK/chromium.log" 2>&1 || { tail -5 "$WORK/chromium.log"; fail "Chromium took no screenshot"; }
python3 - "$WORK/dom.html" "$WORK/run.png" "$WORK/run.json" "$ADMIN" <<'PY' || fail "the rendered report lacks a part"
import json, re, struct, sys, zlib
dom, png, report, admin = open(sys.argv[1]).read(), sys.argv[2], json.load(open(sys.argv[3])), sys.argv[4]
for heading in ["Run", "Time to first token", "Gaps between token events", "Cadence per stream",
                "Where the gaps come from"]:
    assert f"<h2>{heading}</h2>" in dom, heading
assert dom.count("<svg") >= 3, dom.count("<svg")
import urllib.request
links = sorted(set(re.findall(rf'href="(http://127\.0\.0\.1:{admin}/streams/[^"]+)"', dom)))
assert len(links) == report["requests"] == 6, (links, report["requests"])
for link in links:  # each links to a timeline the admin still holds
    with urllib.request.urlopen(link, timeout=5) as answer:
        assert answer.status == 200 and json.load(answer), link
ids = links
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
print(f"ok   Chromium rendered the report: {dom.count('<svg')} plots, {len(ids)} stream links; "
      f"screenshot {w}x{h}, {len(data)} bytes")
PY

# 4. Exit codes: every gate passing is 0; a refused port is 3 with or without --assert.
"$BIN" probe --url "http://127.0.0.1:$PROXY" -n 2 --assert 'errors<1,itl_p99<1s' >/dev/null 2>&1 \
  || fail "passing gates exit 0"
pass "passing gates: exit code 0"
DEAD=$(free_port)
for gates in "" "--assert errors<1"; do
  set +e
  # shellcheck disable=SC2086
  "$BIN" probe --url "http://127.0.0.1:$DEAD" -n 2 --model m $gates >"$WORK/dead.txt" 2>&1
  code=$?
  set -e
  [ "$code" = 3 ] || { cat "$WORK/dead.txt"; fail "a refused port exits 3 (got $code, gates '$gates')"; }
done
pass "a refused port: exit code 3, with and without --assert"
echo "e2e-probe-reports: all checks passed"
