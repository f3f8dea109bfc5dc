"""Reads the marks scripts/first-token-marks.sh collects (scripts/lib/first-token-marks.patch):
two files per metronome process, one line per stream of 20 figures each, the nanoseconds from
the start of its side of the path to a mark (0 where the path did not pass it): `req-PID.txt`
from the read that brought the request's head to the upstream write, `marks-PID.txt` from the
response head's read to the first write to the client. Prints, per process, the median time
between consecutive marks along each side, over the streams after the first SKIP (the first
streams pay page faults on tables touched for the first time), then the client's TTFT per path
from the c1 run's output.

    python3 scripts/lib/first_token_marks.py C1_JSONL MARKS_DIR [--skip N]
"""
import glob
import os
import json
import statistics
import sys

# The request's side: (mark, what happened up to it), in the order the path passes them.
REQUEST = [
    (0, "request head parsed (from its read's return)"),
    (1, "request built, handed to the handler"),
    (2, "handler entered (beacon route checked)"),
    (3, "route found"),
    (4, "form and WebSocket checks"),
    (5, "place among the requests in flight"),
    (6, "what the request asked read (trace, request ID, log line, SLO)"),
    (7, "upstream request rewritten"),
    (8, "span and the request's timer"),
    (9, "upstream client entered"),
    (10, "pooled connection checked out"),
    (11, "request encoding begins"),
    (12, "upstream write begins"),
]

# The response's side, likewise.
PATH = [
    (0, "head checked: hop-by-hop fields, requests counter, framing"),
    (18, "opening kept (ID, key, slot, header values)"),
    (1, "stream info, ID header"),
    (9, "batch: the upstream's tracker found"),
    (10, "batch: stream started in the tracker"),
    (19, "batch: sweep spawned or woken"),
    (2, "batch: probe made"),
    (3, "ledger opened"),
    (4, "key header inserted"),
    (12, "ingress meter made"),
    (13, "stream's shared state made"),
    (14, "registered for the live flush"),
    (5, "registered with the egress clock"),
    (6, "probe attached"),
    (7, "server has the response"),
    (11, "response head encoded"),
    (15, "first frame read from the upstream"),
    (16, "frame handed to the egress clock"),
    (17, "body polled again: nothing more"),
    (8, "first write to the client socket begins"),
]


def segments(rows, path, last):
    present = [m for m, _ in path if sum(1 for r in rows if r[m]) > len(rows) // 2]
    out = []
    for m, name in path:
        if m not in present:
            continue
        before = present[: present.index(m)]
        spans = [(r[m] - (r[before[-1]] if before else 0)) / 1000 for r in rows if r[m]]
        out.append((name, statistics.median(spans)))
    total = statistics.median(r[last] / 1000 for r in rows)
    return out, total


def rows_of(path, last, skip):
    if not os.path.exists(path):
        return []
    rows = [list(map(int, line.split())) for line in open(path) if line.strip()]
    return [r for r in rows if r[last]][skip:]


def show(title, rows, path, last, skip):
    spans, total = segments(rows, path, last)
    print(f"{title}: {len(rows)} streams (after the first {skip}), medians in µs")
    for name, median in spans:
        print(f"  {median:6.1f}  {name}")
    print(f"  {total:6.1f}  in all (median of the sums)")


def main():
    args = sys.argv[1:]
    skip = 100
    if "--skip" in args:
        i = args.index("--skip")
        skip = int(args[i + 1])
        del args[i : i + 2]
    c1, marks = args[0], args[1]
    for path in sorted(glob.glob(os.path.join(marks, "marks-*.txt"))):
        rows = rows_of(path, 8, skip)
        if not rows:
            continue
        metering = "on" if sum(1 for r in rows if r[18]) > len(rows) // 2 else "off"
        requests = rows_of(path.replace("marks-", "req-"), 12, skip)
        if requests:
            show(f"metering {metering}, request side", requests, REQUEST, 12, skip)
        show(f"metering {metering}, response side", rows, PATH, 8, skip)
    ttft = {}
    for line in open(c1):
        row = json.loads(line)
        if row.get("ttft_ns"):
            ttft.setdefault(row["path"], []).append(row["ttft_ns"] / 1000)
    for name, values in ttft.items():
        print(f"client TTFT {name}: p50 {statistics.median(values):.0f} µs over {len(values)} streams")


if __name__ == "__main__":
    main()
