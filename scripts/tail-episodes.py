#!/usr/bin/env python3
"""Whether a run's late frames were late one by one or all together, from `probe --gaps-csv`.

A frame that waits behind the others of its burst makes one late gap; a machine that stops the
path (another task on the proxy's CPU, a stalled virtual CPU) makes the gaps of many streams late
within the same few milliseconds. This groups the gaps whose ingress part (`generation_us`, the
gap as metronome read it) is more than `--late-ms` above the run's median ingress gap, by the
time their later token event reached the client, into episodes: late gaps no more than
`--within-ms` apart. An episode that touches at least `--min-streams` streams is counted.

  scripts/tail-episodes.py gaps.csv                 # what scripts/tail-split.sh prints
  scripts/tail-episodes.py gaps.csv --late-ms 1 --min-streams 10

Standard library only; the CSV is the probe's (header included).
"""

import argparse
import csv
import sys

from accuracy import nearest_rank  # the nearest-rank percentile (the probe's definition)


def load(path):
    """(client_at_us, stream, generation_us) of every row, in file order."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        need = {"stream", "client_at_us", "generation_us"}
        if not need <= set(reader.fieldnames or []):
            raise ValueError(f"{path}: not a probe --gaps-csv file (needs columns {sorted(need)})")
        return [(int(r["client_at_us"]), int(r["stream"]), int(r["generation_us"])) for r in reader]


def episodes(rows, late_us, within_us, min_streams):
    """The episodes: dicts with start and end (µs), streams touched, late gaps and the largest
    lateness (µs above the median ingress gap). Also returns the median and the late gaps."""
    base = nearest_rank(sorted(g for _, _, g in rows), 0.5)
    late = sorted((at, stream, g - base) for at, stream, g in rows if g - base > late_us)
    found, current = [], None
    for at, stream, over in late:
        if current and at - current["end"] <= within_us:
            current["end"] = at
            current["streams"].add(stream)
            current["gaps"] += 1
            current["worst"] = max(current["worst"], over)
        else:
            current = {"start": at, "end": at, "streams": {stream}, "gaps": 1, "worst": over}
            found.append(current)
    kept = [e for e in found if len(e["streams"]) >= min_streams]
    return base, late, kept


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="the file `probe --join ... --gaps-csv FILE` wrote")
    ap.add_argument("--late-ms", type=float, default=2.0,
                    help="a gap is late when its ingress part exceeds the median by this much")
    ap.add_argument("--within-ms", type=float, default=5.0,
                    help="late gaps this close together (at the client) are one episode")
    ap.add_argument("--min-streams", type=int, default=20,
                    help="an episode counts when it touches this many streams")
    args = ap.parse_args(argv)
    try:
        rows = load(args.csv)
    except (OSError, ValueError) as e:
        print(f"tail-episodes.py: {e}", file=sys.stderr)
        return 2
    if not rows:
        print("no gaps")
        return 0
    base, late, kept = episodes(rows, args.late_ms * 1000, args.within_ms * 1000, args.min_streams)
    span_s = (max(at for at, _, _ in rows) - min(at for at, _, _ in rows)) / 1e6
    print(f"gaps {len(rows):,}, median ingress gap {base / 1000:.2f} ms, {len(late):,} more than "
          f"{args.late_ms:g} ms above it")
    if not kept:
        print(f"episodes       none touching {args.min_streams}+ streams within {args.within_ms:g} ms")
        return 0
    sizes = [len(e["streams"]) for e in kept]
    worst = [e["worst"] / 1000 for e in kept]
    in_episodes = sum(e["gaps"] for e in kept)
    print(f"episodes       {len(kept)} in {span_s:.0f} s touching {min(sizes)}-{max(sizes)} streams each "
          f"(late gaps within {args.within_ms:g} ms of each other), up to {min(worst):.1f}-{max(worst):.1f} ms late; "
          f"{in_episodes:,} of the {len(late):,} late gaps")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
