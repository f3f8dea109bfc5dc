#!/usr/bin/env python3
"""The checks of scripts/e2e-native.sh: what a real Prometheus reads from metronome's native
histograms against the exact quantiles of the very gaps metronome measured.

The exact gaps come from the admin's /streams/{id} (docs/timelines.md): each frame's ingress
stamp, in microseconds since the request arrived. A stream's TTFT is its first token frame's
stamp; its ITL gaps are the differences between consecutive token frames' stamps (the sim writes
one token event per frame, which is checked). Before comparing, the number of gaps Prometheus
holds (histogram_count) must equal the number read from /streams exactly, so the two sides count
the same gaps.

    e2e-native.py ids ADMIN...                     retained stream IDs, one a line
    e2e-native.py settle --prom URL --admin ADMIN... --select SEL
                                                   waits until Prometheus counts every gap
    e2e-native.py quantiles --prom URL --admin ADMIN... --select SEL [--exclude FILE]
                            [--rate-since UNIX] [--metrics ITL TTFT] [--quantiles Q...]
                            --label NAME
    e2e-native.py exemplar --prom URL --admin ADMIN --select SEL --since UNIX
    e2e-native.py hitch-exemplar --prom URL --admin ADMIN --select SEL --since UNIX

Exit status 1 when a check fails (the reason on stdout), 0 otherwise. Standard library only.
"""
import argparse
import json
import math
import sys
import time
import urllib.parse
import urllib.request

ITL = "metronome_inter_token_latency_seconds"
TTFT = "metronome_time_to_first_token_seconds"
STALL = "metronome_stall_duration_seconds"
HITCHES = "metronome_hitches_total"
QUANTILES = (0.5, 0.99)
# The bound on |native - exact| / exact where the quantile's bucket is well filled (ITL p50 and
# p99: thousands of gaps; TTFT p50): histogram_quantile interpolates linearly inside a bucket,
# and schema 4's buckets are 2^(1/16) apart (4.4 %).
MAX_ERROR = 0.02
# TTFT p99 over a few hundred streams has a handful of TTFTs above it, so its bucket holds one to
# a few: histogram_quantile then returns a point between the bucket's bounds by rank alone (the
# upper bound when the ranked TTFT is the bucket's last), wherever inside the bucket the TTFT
# really is. No histogram of 4.4 % buckets does better there; the bound is the bucket.
# The same holds for any quantile whose bucket is sparse (an ITL p99 in a tail that the sim's 1 ms
# timer steps leave with a few gaps per bucket: 8 of 12,600 was seen): under SPARSE samples in
# the quantile's bucket, the bound is the bucket's width, not 2 %.
BUCKET_WIDTH = 2 ** (1 / 16) - 1
BOUNDS = {("TTFT", 0.99): BUCKET_WIDTH}
SPARSE = 50
# Stream timelines carry microseconds; metronome's observations nanoseconds.
STAMP_TOLERANCE = 5e-6


def get_json(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def prom_query(prom, expr):
    """An instant PromQL query at now: a list of (labels, float) (NaN kept)."""
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    body = get_json(url)
    if body.get("status") != "success":
        raise SystemExit(f"FAIL  Prometheus refused {expr}: {body}")
    return [(r["metric"], float(r["value"][1])) for r in body["data"]["result"]]


def one_value(prom, expr):
    result = prom_query(prom, expr)
    return result[0][1] if len(result) == 1 else None


def streams(admin, exclude=frozenset()):
    """Every retained stream on ADMIN (host:port) but the excluded IDs, with its frames."""
    out = []
    for summary in get_json(f"http://{admin}/streams")["streams"]:
        if summary["id"] in exclude:
            continue
        out.append(get_json(f"http://{admin}/streams/{summary['id']}"))
    return out


def exact_samples(all_streams):
    """(ITL gaps, TTFTs) in seconds; dies on a stream this comparison cannot use."""
    gaps, ttfts = [], []
    for s in all_streams:
        if s["outcome"] != "complete" or s["frames_dropped"] != 0:
            raise SystemExit(f"FAIL  stream {s['id']}: outcome {s['outcome']}, "
                             f"{s['frames_dropped']} frames dropped (expected complete, 0)")
        token_frames = [f for f in s["frames"] if f["token_events"] > 0]
        if any(f["token_events"] != 1 for f in token_frames):
            raise SystemExit(f"FAIL  stream {s['id']} has a frame with several token events")
        if not token_frames:
            continue
        stamps = [f["ingress_us"] / 1e6 for f in token_frames]
        ttfts.append(stamps[0])
        gaps.extend(b - a for a, b in zip(stamps, stamps[1:]))
    return gaps, ttfts


def bucket_of(value, schema=4):
    """The native bucket (lower, upper] holding a value, and its index (None: the zero bucket,
    where two frames read at once put a gap of 0)."""
    if value <= 0:
        return None, 0.0, 0.0
    index = math.ceil(math.log2(value) * 2**schema)
    return index, 2 ** ((index - 1) / 2**schema), 2 ** (index / 2**schema)


def nearest_rank(values, q):
    """The exact q-quantile: the ceil(q*n)-th smallest value, as histogram_quantile ranks."""
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def wait_for_counts(prom, select, want, deadline_s=40):
    """Waits until Prometheus holds exactly `want[metric]` observations of each metric."""
    end = time.time() + deadline_s
    while True:
        have = {m: one_value(prom, f"sum(histogram_count({m}{{{select}}}))") for m in want}
        if all(have[m] is not None and round(have[m]) == n for m, n in want.items()):
            return have
        if time.time() > end:
            raise SystemExit(f"FAIL  Prometheus' histogram_count never reached the exact counts "
                             f"within {deadline_s}s: have {have}, want {want}")
        time.sleep(0.5)


def cmd_ids(args):
    for admin in args.admin:
        for summary in get_json(f"http://{admin}/streams")["streams"]:
            print(summary["id"])


def cmd_settle(args):
    every = [s for admin in args.admin for s in streams(admin)]
    gaps, ttfts = exact_samples(every)
    wait_for_counts(args.prom, args.select, {ITL: len(gaps), TTFT: len(ttfts)})


def cmd_quantiles(args):
    exclude = frozenset()
    if args.exclude:
        exclude = frozenset(open(args.exclude).read().split())
    # Prometheus' cumulative count covers every stream, the excluded ones too.
    every = [s for admin in args.admin for s in streams(admin)]
    all_gaps, all_ttfts = exact_samples(every)
    wait_for_counts(args.prom, args.select, {ITL: len(all_gaps), TTFT: len(all_ttfts)})
    gaps, ttfts = exact_samples([s for s in every if s["id"] not in exclude])
    if args.rate_since:
        time.sleep(1.5)  # one more scrape, so the window's last sample holds every count
        window = math.ceil(time.time() - args.rate_since)
        shape = lambda m: f"sum(rate({m}{{{args.select}}}[{window}s]))"  # noqa: E731
    else:
        shape = lambda m: f"sum({m}{{{args.select}}})"  # noqa: E731
    n_streams = len(every) - len(exclude & {s["id"] for s in every})
    print(f"      {args.label}: {n_streams} streams, {len(gaps)} ITL gaps, {len(ttfts)} TTFTs "
          f"(exact, from /streams); Prometheus holds the same counts")
    worst = 0.0
    failed = []
    for metric, values, short in ((ITL, gaps, "ITL"), (TTFT, ttfts, "TTFT")):
        if short not in args.metrics:
            continue
        for q in args.quantiles:
            expr = f"histogram_quantile({q}, {shape(metric)})"
            native = one_value(args.prom, expr)
            exact = nearest_rank(values, q)
            if native is None or math.isnan(native):
                failed.append(f"{expr} returned no number")
                continue
            err = (native - exact) / exact
            worst = max(worst, abs(err))
            index, lower, upper = bucket_of(exact)
            k = sum(1 for v in values if bucket_of(v)[0] == index)
            bound = BUCKET_WIDTH if k < SPARSE else BOUNDS.get((short, q), MAX_ERROR)
            print(f"      {short:4s} p{q * 100:g}: native {native * 1000:9.3f} ms, exact "
                  f"{exact * 1000:9.3f} ms, error {err * 100:+.2f} % (bound {bound * 100:.1f} %)  (bucket "
                  f"({lower * 1000:.3f}, {upper * 1000:.3f}] ms holds {k} of {len(values)})")
            # Over a rate window the pooled quantile may cross into the next bucket while within
            # the bound: rate() extrapolates each instance's series to the window's edges by its
            # own scrape phase, so the instances weigh a few per cent apart (a fleet read +1.09 %,
            # 0.6 ms past its bucket's edge). The bound alone judges it; a plain sum is exact.
            outside = bucket_of(native)[0] != index and native != upper
            if abs(err) > bound or (outside and not args.rate_since):
                failed.append(f"{short} p{q * 100:g} off by {err * 100:+.2f} % (bound "
                              f"{bound * 100:.1f} %, or outside the exact value's bucket): {expr}")
    if args.rate_since:
        print(f"      (query: histogram_quantile(q, sum(rate(...[{window}s]))))")
    if failed:
        print("FAIL  " + "; ".join(failed))
        return 1
    print(f"      worst error {worst * 100:.2f} %")
    return 0


def cmd_exemplar(args):
    """An exemplar on a stall-duration bucket names a stream that /streams/{id} returns, and
    that stream had an ingress gap equal to the exemplar's value."""
    params = {"query": f"{STALL}_bucket{{{args.select}}}", "start": f"{args.since:.3f}",
              "end": f"{time.time() + 1:.3f}"}
    body = get_json(f"{args.prom}/api/v1/query_exemplars?" + urllib.parse.urlencode(params))
    found = [(series["seriesLabels"], e) for series in body.get("data", [])
             for e in series["exemplars"]]
    if not found:
        print(f"FAIL  no exemplar on {STALL}_bucket{{{args.select}}}")
        return 1
    for labels, e in found:
        sid = e["labels"].get("stream_id")
        value = float(e["value"])
        le = float(labels["le"])
        if sid is None or not value <= le:
            print(f"FAIL  exemplar {e} on bucket le={labels['le']}: no stream_id, or above le")
            return 1
        try:
            stream = get_json(f"http://{args.admin}/streams/{sid}")
        except urllib.error.HTTPError as err:
            print(f"FAIL  the exemplar's stream_id {sid} does not resolve: HTTP {err.code}")
            return 1
        gaps, _ = exact_samples([stream])
        nearest = min(gaps, key=lambda g: abs(g - value))
        if abs(nearest - value) > STAMP_TOLERANCE:
            print(f"FAIL  stream {sid} has no ingress gap of {value * 1000:.3f} ms "
                  f"(nearest {nearest * 1000:.3f} ms)")
            return 1
    labels, e = found[0]
    print(f"      {len(found)} exemplars on stall buckets; e.g. le={labels['le']}: stream_id "
          f"{e['labels']['stream_id']} value {float(e['value']) * 1000:.3f} ms; each resolves at "
          f"/streams/{{id}} to a stream with that very ingress gap")
    return 0


def cmd_hitch_exemplar(args):
    """An exemplar on metronome_hitches_total (a counter: on its _total sample, its value the
    increment, 1) names a stream that /streams/{id} returns with a hitch of the series' scope."""
    params = {"query": f"{HITCHES}{{{args.select}}}", "start": f"{args.since:.3f}",
              "end": f"{time.time() + 1:.3f}"}
    body = get_json(f"{args.prom}/api/v1/query_exemplars?" + urllib.parse.urlencode(params))
    found = [(series["seriesLabels"], e) for series in body.get("data", [])
             for e in series["exemplars"]]
    if not found:
        print(f"FAIL  no exemplar on {HITCHES}{{{args.select}}}")
        return 1
    for labels, e in found:
        sid = e["labels"].get("stream_id")
        if sid is None or float(e["value"]) != 1.0:
            print(f"FAIL  exemplar {e} on {labels}: no stream_id, or a value other than 1")
            return 1
        try:
            stream = get_json(f"http://{args.admin}/streams/{sid}")
        except urllib.error.HTTPError as err:
            print(f"FAIL  the hitch exemplar's stream_id {sid} does not resolve: HTTP {err.code}")
            return 1
        scopes = {h["scope"] for h in stream.get("hitches", [])}
        if labels["scope"] not in scopes:
            print(f"FAIL  stream {sid} has no hitch of scope {labels['scope']} (has {scopes})")
            return 1
    labels, e = found[0]
    print(f"      {len(found)} exemplars on {HITCHES}; e.g. scope={labels['scope']}: stream_id "
          f"{e['labels']['stream_id']}; each resolves at /streams/{{id}} to a stream with a "
          f"hitch of that scope")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    ids = sub.add_parser("ids")
    ids.add_argument("admin", nargs="+")
    settle = sub.add_parser("settle")
    settle.add_argument("--prom", required=True)
    settle.add_argument("--admin", nargs="+", required=True)
    settle.add_argument("--select", required=True)
    q = sub.add_parser("quantiles")
    q.add_argument("--prom", required=True)
    q.add_argument("--admin", nargs="+", required=True)
    q.add_argument("--select", required=True, help="PromQL label matchers, without braces")
    q.add_argument("--exclude", help="file of stream IDs left out of the exact side")
    q.add_argument("--rate-since", type=float, help="unix time: query sum(rate()) since then")
    q.add_argument("--label", required=True)
    q.add_argument("--metrics", nargs="+", choices=("ITL", "TTFT"), default=("ITL", "TTFT"))
    q.add_argument("--quantiles", nargs="+", type=float, default=QUANTILES)
    x = sub.add_parser("exemplar")
    x.add_argument("--prom", required=True)
    x.add_argument("--admin", required=True)
    x.add_argument("--select", required=True)
    x.add_argument("--since", type=float, required=True)
    h = sub.add_parser("hitch-exemplar")
    h.add_argument("--prom", required=True)
    h.add_argument("--admin", required=True)
    h.add_argument("--select", required=True)
    h.add_argument("--since", type=float, required=True)
    args = p.parse_args()
    commands = {"ids": cmd_ids, "settle": cmd_settle, "quantiles": cmd_quantiles,
                "exemplar": cmd_exemplar, "hitch-exemplar": cmd_hitch_exemplar}
    return commands[args.cmd](args) or 0


if __name__ == "__main__":
    sys.exit(main())
