#!/usr/bin/env python3
"""Accuracy of metronome's measurements against the sim's ground truth.

For each concurrency level: the sim (jittered cadence with occasional stalls) writes the true send
time of every frame (--timeline); metronome serves in front of it; metronome probe streams through
it. Pooled inter-token gaps are compared at p50 and p99:
  truth   from the sim's timeline (exact, per frame, gaps of 0 within a frame);
  probe   the client's arrival times (exact samples, nearest rank);
  ingress / egress   metronome's histograms, read as histogram_quantile reads them (linear within
          a bucket: this is the error a Prometheus user sees, dominated by the bucket width).
Prints a Markdown table. Usage: scripts/accuracy.py [LEVELS...]   (default: 1 100 1000)
Talks only to 127.0.0.1; every process is stopped at the end."""
import json, math, os, re, socket, subprocess, sys, tempfile, time, urllib.request

BIN = os.path.join(os.path.dirname(__file__), "..", "target", "release", "metronome")
SIM_FLAGS = ["--gap", "40ms", "--jitter", "0.2", "--stall-prob", "0.01", "--stall", "300ms", "--ttft", "50ms", "--seed", "3"]

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close(); return port

def wait(url):
    for _ in range(200):
        try:
            urllib.request.urlopen(url, timeout=1).read(); return
        except Exception:
            time.sleep(0.05)
    raise SystemExit(f"{url} never answered")

def nearest_rank(sorted_values, q):
    if not sorted_values: return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]

def truth_gaps(path):
    frames = {}
    for line in open(path):
        rec = json.loads(line)
        if "t_us" in rec and rec.get("events", 0) > 0:
            frames.setdefault(rec["stream"], []).append((rec["t_us"], rec["events"]))
    gaps = []
    for stream in frames.values():
        stream.sort()
        last = None
        for t, events in stream:
            if last is not None: gaps.append((t - last) / 1000.0)
            gaps.extend([0.0] * (events - 1))
            last = t
    return sorted(gaps)

def histogram_quantile(q, buckets):
    # buckets: sorted list of (le, cumulative count), +Inf last
    total = buckets[-1][1]
    if total == 0: return None
    rank = q * total
    prev_le, prev_count = 0.0, 0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le): return prev_le
            return prev_le + (le - prev_le) * (rank - prev_count) / max(count - prev_count, 1)
        prev_le, prev_count = le, count
    return prev_le

def proxy_quantiles(metrics_text, point):
    buckets = []
    for line in metrics_text.splitlines():
        if not line.startswith("metronome_inter_token_latency_seconds_bucket{"):
            continue
        series, value = line.rsplit(" ", 1)
        labels = dict(re.findall(r'(\w+)="([^"]*)"', series))
        if labels.get("point") == point:
            buckets.append((float(labels["le"]), int(float(value))))
    buckets.sort()
    return [None if v is None else v * 1000 for v in (histogram_quantile(0.5, buckets), histogram_quantile(0.99, buckets))]

def run_level(concurrency):
    work = tempfile.mkdtemp()
    sim_port, proxy_port, admin_port = free_port(), free_port(), free_port()
    timeline = os.path.join(work, "timeline.jsonl")
    procs = []
    try:
        procs.append(subprocess.Popen([BIN, "sim", "--listen", f"127.0.0.1:{sim_port}", "--timeline", timeline] + SIM_FLAGS,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen([BIN, "serve", "--listen", f"127.0.0.1:{proxy_port}", "--admin", f"127.0.0.1:{admin_port}",
                                       "--upstream", f"http://127.0.0.1:{sim_port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait(f"http://127.0.0.1:{sim_port}/health"); wait(f"http://127.0.0.1:{admin_port}/healthz")
        requests = 20 if concurrency == 1 else 2 * concurrency
        report = os.path.join(work, "probe.json")
        subprocess.run([BIN, "probe", "--url", f"http://127.0.0.1:{proxy_port}/v1/chat/completions", "--concurrency", str(concurrency),
                        "--requests", str(requests), "--max-tokens", "32", "--json", report], check=True, stdout=subprocess.DEVNULL)
        time.sleep(0.5)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics").read().decode()
        for p in procs: p.terminate()
        for p in procs: p.wait(timeout=30)
        probe = json.load(open(report))
        truth = truth_gaps(timeline)
        return {
            "level": concurrency, "streams": requests, "errors": probe["errors"],
            "truth": (nearest_rank(truth, 0.5), nearest_rank(truth, 0.99)),
            "probe": (probe["itl_ms"]["p50"], probe["itl_ms"]["p99"]),
            "ingress": proxy_quantiles(metrics, "ingress"), "egress": proxy_quantiles(metrics, "egress"),
        }
    finally:
        for p in procs:
            if p.poll() is None: p.kill()

def fmt(v): return "-" if v is None else f"{v:.1f}"
def err(v, t): return "-" if v is None or t is None else f"{v - t:+.1f}"

def main():
    levels = [int(a) for a in sys.argv[1:]] or [1, 100, 1000]
    print("| streams in flight | streams | truth p50 / p99 (ms) | probe p50 / p99 (error) | ingress p50 / p99 (error) | egress p50 / p99 (error) | errors |")
    print("|---|---|---|---|---|---|---|")
    for level in levels:
        r = run_level(level)
        t50, t99 = r["truth"]
        cells = [f"{fmt(t50)} / {fmt(t99)}"]
        for key in ("probe", "ingress", "egress"):
            v50, v99 = r[key]
            cells.append(f"{fmt(v50)} / {fmt(v99)} ({err(v50, t50)} / {err(v99, t99)})")
        print(f"| {level} | {r['streams']} | " + " | ".join(cells) + f" | {r['errors']} |", flush=True)

if __name__ == "__main__":
    main()
