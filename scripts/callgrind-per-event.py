#!/usr/bin/env python3
"""Per-function cost of one token event, read from the callgrind outputs that
scripts/instructions-per-event.sh and scripts/cache-misses-per-event.sh keep with KEEP=DIR.

Each of those scripts runs the proxy twice, a small and a large load, with metering on and off.
A function's cost per event is (large run - small run) / token events, so start-up and shut-down
cancel out; metering's own cost is that figure with metering on minus the same with it off.

  scripts/callgrind-per-event.py ON_SMALL ON_LARGE OFF_SMALL OFF_LARGE --events N
      [--show Ir|misses] [--inclusive] [--top K]
  scripts/callgrind-per-event.py --per-call FILE FUNCTION...

N is the difference in token events between the two runs (both scripts print it). `--show
misses` reads the simulated last-level misses (DLmr + DLmw) of cache-misses-per-event.sh's
outputs. `--per-call` prints each named function's inclusive instructions per call in FILE (a
substring of callgrind_annotate's `file:function` name), with the inclusive total, for
per-stream costs. An async function's future is "called" once per poll: divide its total by the
requests of the run (instructions-per-event.sh's large run: 120) for its cost per request.
"""
import argparse
import collections
import re
import subprocess
import sys

ROW = re.compile(r"^\s*([\d,.]+)\s+(?:\([ \d.]+%\)\s+)?(?:([\d,.]+)\s+(?:\([ \d.]+%\)\s+)?)?(\S.*)$")


def number(text):
    return 0 if text in (None, ".") else int(text.replace(",", ""))


def costs(path, show, inclusive):
    """Cost per `file:function` in one callgrind output."""
    events = ["--show=Ir"] if show == "Ir" else ["--show=DLmr,DLmw", "--sort=DLmr"]
    out = subprocess.run(
        ["callgrind_annotate", *events, f"--inclusive={'yes' if inclusive else 'no'}",
         "--auto=no", "--threshold=100", path],
        capture_output=True, text=True, check=True).stdout
    total = collections.Counter()
    for line in out.splitlines():
        m = ROW.match(line)
        if not m or "PROGRAM TOTALS" in line or ":" not in m.group(3):
            continue
        name = re.sub(r"\s*\[[^\]]*\]\s*$", "", m.group(3))
        total[name] += number(m.group(1)) + number(m.group(2))
    return total


def per_call(path, functions):
    out = subprocess.run(["callgrind_annotate", "--tree=caller", "--inclusive=yes",
                          "--threshold=100", path], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    print("| function | calls | instructions, inclusive | per call |\n|---|---|---|---|")
    for function in functions:
        calls = 0
        for i, line in enumerate(out):
            if "*  " not in line or function not in line:
                continue
            inclusive = number(line.split()[0])
            j = i - 1
            while j >= 0 and "<" in out[j]:
                m = re.search(r"\((\d+)x\)", out[j])
                calls += int(m.group(1)) if m else 0
                j -= 1
            if calls:
                print(f"| {function} | {calls:,} | {inclusive:,} | {inclusive / calls:,.0f} |")
            break
        else:
            print(f"| {function} | not found | - | - |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--events", type=float)
    ap.add_argument("--show", choices=["Ir", "misses"], default="Ir")
    ap.add_argument("--inclusive", action="store_true")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--per-call", metavar="FILE")
    a = ap.parse_args()
    if a.per_call:
        per_call(a.per_call, a.files)
        return
    if len(a.files) != 4 or not a.events:
        sys.exit("give ON_SMALL ON_LARGE OFF_SMALL OFF_LARGE and --events N (see --help)")
    on_s, on_l, off_s, off_l = (costs(f, a.show, a.inclusive) for f in a.files)
    names = set(on_s) | set(on_l) | set(off_s) | set(off_l)
    on = {n: (on_l[n] - on_s[n]) / a.events for n in names}
    off = {n: (off_l[n] - off_s[n]) / a.events for n in names}
    metering = {n: on[n] - off[n] for n in names}
    if not a.inclusive:
        print(f"per token event, {a.show}: metering on {sum(on.values()):,.1f}, "
              f"off {sum(off.values()):,.1f}, metering's own {sum(metering.values()):,.1f}")
    print(f"| metering on | off | metering's own | function ({'inclusive' if a.inclusive else 'exclusive'}) |")
    print("|---|---|---|---|")
    for n in sorted(names, key=lambda n: -abs(metering[n]))[:a.top]:
        print(f"| {on[n]:,.1f} | {off[n]:,.1f} | {metering[n]:,.1f} | {n[-120:]} |")


if __name__ == "__main__":
    main()
