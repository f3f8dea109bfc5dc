#!/usr/bin/env python3
"""How late this machine wakes a sleeping thread: the floor under any latency a benchmark reads.

On each CPU at once, a thread pinned to it sleeps `--period` at a time, `--count` times, and
records how much later than asked each sleep ended. On a quiet machine that is the timer slack
and the wake-up (tens of µs). On a virtual machine it also holds the time the hypervisor takes to
run a halted virtual CPU again, and every stall of the host: a few ms now and then, p99s of
several hundred µs in a noisy minute. Every hop of a benchmark's path is a wake-up like these, so
a tail measured in a minute when these figures are high is the machine's before it is any
proxy's; the benchmark (scripts/bench.py) measures them before every run to show which runs those
are.

The threads run at real-time priority (SCHED_FIFO 50) where the kernel allows it, so that the
figure is the machine's and not the other processes' share of the CPU; elsewhere they run at
normal priority and say so (`"policy": "other"`). The figures include the interpreter's own time
per loop (about 10 µs): compare them with other runs of this script, not with C measurements.

  scripts/hiccups.py                      # 2,000 sleeps of 1 ms on every CPU, a table
  scripts/hiccups.py --count 5000 --json out.json
  python3 -c 'import hiccups; print(hiccups.measure(count=500))'   # from scripts/ (bench.py)

Nothing but sleeping and reading the clock; it exits within count x (period + the worst stall).
"""

import argparse
import json
import os
import subprocess
import sys
import time

from accuracy import nearest_rank  # the nearest-rank percentile (the probe's definition)

PRIORITY = 50
SCRIPT = os.path.abspath(__file__)


def summary(late_us):
    """Figures of one CPU's lateness samples, in µs."""
    s = sorted(late_us)
    return {
        "sleeps": len(s),
        "p50": nearest_rank(s, 0.50),
        "p90": nearest_rank(s, 0.90),
        "p99": nearest_rank(s, 0.99),
        "p999": nearest_rank(s, 0.999),
        "max": s[-1] if s else None,
        "over_1ms": sum(1 for v in s if v > 1000),
    }


def worker(cpu, count, period_s):
    """Runs in a child process: pins itself, raises its priority if it may, sleeps `count` times
    and prints {"policy": ..., "late_us": [...]} as one JSON line."""
    os.sched_setaffinity(0, {cpu})
    policy = "other"
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(PRIORITY))
        policy = "fifo"
    except (PermissionError, OSError):
        pass
    period_ns = int(period_s * 1e9)
    late = []
    clock = time.monotonic_ns
    for _ in range(count):
        start = clock()
        time.sleep(period_s)
        late.append((clock() - start - period_ns) / 1000)
    print(json.dumps({"policy": policy, "late_us": late}))


def measure(cpus=None, count=2000, period_s=0.001):
    """Sleeps `count` times on every CPU in `cpus` (default: every CPU this process may use), all
    at once, and returns {"cpuN": summary + {"policy": ...}}. Raises RuntimeError if a worker
    fails or reports a different number of sleeps than asked."""
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else list(cpus)
    procs = {
        cpu: subprocess.Popen(
            [sys.executable, SCRIPT, "--worker", str(cpu), "--count", str(count),
             "--period", str(period_s)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for cpu in cpus
    }
    out = {}
    for cpu, proc in procs.items():
        stdout, stderr = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"hiccups worker on CPU {cpu} failed ({proc.returncode}): {stderr.strip()}")
        report = json.loads(stdout)
        if len(report["late_us"]) != count:
            raise RuntimeError(f"hiccups worker on CPU {cpu} reported {len(report['late_us'])} "
                               f"sleeps, not {count}")
        out[f"cpu{cpu}"] = dict(summary(report["late_us"]), policy=report["policy"])
    return out


def table(result, period_s):
    lines = [f"| CPU | sleeps of {period_s * 1e3:g} ms | late p50 / p90 / p99 / p99.9 | max | over 1 ms | priority |",
             "|---|---|---|---|---|---|"]
    for cpu, r in result.items():
        figures = " / ".join(f"{r[k]:.0f}" for k in ("p50", "p90", "p99", "p999"))
        lines.append(f"| {cpu} | {r['sleeps']:,} | {figures} µs | {r['max']:.0f} µs | {r['over_1ms']} | "
                     f"{'SCHED_FIFO ' + str(PRIORITY) if r['policy'] == 'fifo' else 'normal'} |")
    return "\n".join(lines)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=2000, help="sleeps per CPU")
    ap.add_argument("--period", type=float, default=0.001, help="seconds per sleep")
    ap.add_argument("--cpus", default=None, help="comma-separated CPUs (default: every CPU allowed)")
    ap.add_argument("--json", default=None, help="also write the figures as JSON to this file")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.count < 1 or not 0 < args.period <= 1:
        ap.error("--count must be at least 1 and --period in (0, 1] seconds")
    if args.worker is not None:
        worker(args.worker, args.count, args.period)
        return 0
    cpus = None if args.cpus is None else [int(c) for c in args.cpus.split(",")]
    result = measure(cpus, args.count, args.period)
    print(table(result, args.period))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
