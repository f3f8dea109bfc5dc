"""The c=1 leg and the stall sweep of scripts/bench.sh: metronome beside nginx the way the
onthebench.ai gateway board's stream suite measures a gateway.

A mock upstream writes a role chunk, then 64 content deltas 20 ms apart (the first at once), then
the finish; one client (scripts/lib/streambench.rs, the same program for every path) timestamps
each content frame when the read that completes it returns. Paths: direct (client -> mock),
metronome (the defaults: metering, live flush, native histograms and exemplars, the batch
detector), nginx (`proxy_buffering off`, a keep-alive upstream pool), and on request passthrough
(metering off), haproxy and metronome-before (--baseline).

c=1 leg: every proxy runs at once; the client holds one keep-alive connection to each path for
the whole leg and runs rounds of one stream per path, the order changed every round so that a
slow minute of the shared machine falls on every path alike and each path runs right after each
other equally often (a Williams design: a path's stream starts while the one before may still be
finishing its last). Warm-up rounds come first and are not
counted. The mock counts the connections it accepted: one per path, or a proxy reopened its
upstream connection, which the report says.

Per path, as the board defines them: TTFT (request written -> first content frame) and the gap
between consecutive content frames, pooled over every stream; percentiles by the board's rule
(the sorted sample at index floor(n * q)); added = through the proxy minus direct, percentile by
percentile.

Sweep: at each level N (1, 2, 4 ... 1,024), per path in an order rotated every level, N
connections are opened and warmed with a one-event stream, then started together, each running
streams back to back for --sweep-duration seconds. Per path and level: TTFT p50 and the streams
that stayed stall-free (every content frame, `[DONE]`, no gap above --stall-threshold); the board's
figure is the highest level at which every stream did. Beside them, the proxy's CPU per 1,000
content frames and its peak RSS.
"""

import json
import math
import os
import subprocess
import time
from pathlib import Path

import bench

ROOT = Path(__file__).resolve().parent.parent
TOOL_SOURCE = ROOT / "scripts" / "lib" / "streambench.rs"
TOOL = ROOT / "target" / "streambench"
BOARD_PATHS = ["direct", "metronome", "nginx"]
# Paths these legs can run beside the default three.
EXTRA_PATHS = ["passthrough", "haproxy", bench.BASELINE]
MARK_BEGIN = "<!-- scripts/bench.sh stream legs: begin -->"
MARK_END = "<!-- scripts/bench.sh stream legs: end -->"


def build_tool():
    """Compiles scripts/lib/streambench.rs (std only, a few seconds) unless the binary is newer."""
    if TOOL.exists() and TOOL.stat().st_mtime >= TOOL_SOURCE.stat().st_mtime:
        return TOOL
    TOOL.parent.mkdir(parents=True, exist_ok=True)
    bench.log(f"compiling {TOOL_SOURCE.relative_to(ROOT)}")
    subprocess.run(["rustc", "--edition", "2021", "-O", str(TOOL_SOURCE), "-o", str(TOOL)], check=True)
    return TOOL


def board_pct(values, q):
    """The board's percentile: the sorted sample at index floor(n * q), the last if past it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(int(len(ordered) * q), len(ordered) - 1)]


def read_lines(path):
    """The streams, the per-path connection counts and any other figures (keyed by name) of a
    streambench output file."""
    streams, connects, other = [], {}, {}
    for line in Path(path).read_text().splitlines():
        record = json.loads(line)
        if "connects" in record:
            connects[record["path"]] = record["connects"]
        elif "status" in record:
            streams.append(record)
        else:
            other.update(record)
    return streams, connects, other


def stream_ok(s, events):
    """A stream that did what the board asks of it: a 200, every content frame, `[DONE]`."""
    return s["status"] == 200 and s["content"] == events and s["done"] and "error" not in s


def c1_summary(streams, paths, events):
    """Per path: streams, failures, TTFT and gap p50/p99 (µs) pooled; then added over direct."""
    rows = {}
    for path in paths:
        mine = [s for s in streams if s["path"] == path]
        good = [s for s in mine if stream_ok(s, events)]
        ttfts = [s["ttft_ns"] / 1000 for s in good]
        gaps = [g / 1000 for s in good for g in s["gaps_ns"]]
        rows[path] = {"path": path, "streams": len(mine), "failed": len(mine) - len(good),
                      "gaps": len(gaps),
                      "ttft_p50": board_pct(ttfts, 0.50), "ttft_p99": board_pct(ttfts, 0.99),
                      "gap_p50": board_pct(gaps, 0.50), "gap_p99": board_pct(gaps, 0.99)}
    direct = rows.get("direct")
    for row in rows.values():
        for key in ("ttft_p50", "ttft_p99", "gap_p50", "gap_p99"):
            if direct and row["path"] != "direct" and row[key] is not None and direct[key] is not None:
                row[f"added_{key}"] = row[key] - direct[key]
    return [rows[p] for p in paths]


def sweep_cell(streams, events, stall_us):
    """One path at one level: stall-free streams and TTFT p50 over every stream run."""
    good = [s for s in streams if stream_ok(s, events)]
    stall_free = [s for s in good if s["max_gap_ns"] / 1000 <= stall_us]
    return {"streams": len(streams), "failed": len(streams) - len(good),
            "stall_free": len(stall_free),
            "ttft_p50_us": board_pct([s["ttft_ns"] / 1000 for s in good], 0.50),
            "content": sum(s["content"] for s in streams)}


def highest_clean_level(cells):
    """The board's stall-free figure: the highest level at which every stream was stall-free (in
    every turn, when a level ran more than once)."""
    dirty = {c["level"] for c in cells if not c["streams"] or c["stall_free"] < c["streams"]}
    return max((c["level"] for c in cells if c["level"] not in dirty), default=0)


class StreamLegs:
    """Starts the mock and the paths, runs the legs, and writes what they measured."""

    def __init__(self, b):
        self.b = b
        self.args = b.args
        self.ports = b.ports
        self.tool = str(build_tool())
        self.mock = None

    # --- processes ---

    def start_mock(self):
        port = self.ports.stream_mock
        self.mock = self.b.procs.start(
            "stream-mock", [self.tool, "mock", "--listen", f"127.0.0.1:{port}",
                            "--events", str(self.args.stream_events),
                            "--gap-ms", str(self.args.stream_gap_s * 1000)])
        bench.wait_port(port, self.mock)

    def start_path(self, path):
        """Starts one path in front of the mock; returns (process or None, port)."""
        p, upstream = self.ports, self.ports.stream_mock
        if path == "direct":
            return None, upstream
        if path in ("metronome", "passthrough", bench.BASELINE):
            listen, admin = p.stream_of(path)
            # The kept connections' timeout and each --metronome-toml (bench.board_toml).
            config = bench.metronome_config(self.b.work, f"stream-{path}", listen, admin, upstream,
                                            path != "passthrough",
                                            extra=self.args.metronome_toml)
            binary = self.args.baseline if path == bench.BASELINE else str(bench.BIN)
            proc = self.b.procs.start(f"stream-{path}", [binary, "serve", "--config", str(config)],
                                      env=self.args.metronome_env)
            bench.wait_port(listen, proc)
            return proc, listen
        if path == "nginx":
            config = bench.nginx_config(self.b.work, p.stream_nginx, upstream, self.b.nofile,
                                        name="stream-nginx")
            proc = self.b.procs.start("stream-nginx",
                                      ["nginx", "-c", str(config), "-p", str(self.b.work)])
            bench.wait_port(p.stream_nginx, proc)
            return proc, p.stream_nginx
        if path == "haproxy":
            maxconn = max(1000, (self.b.nofile - 200) // 2)
            config = bench.haproxy_config(self.b.work, p.stream_haproxy, upstream, maxconn)
            proc = self.b.procs.start("stream-haproxy", ["haproxy", "-db", "-f", str(config)])
            bench.wait_port(p.stream_haproxy, proc)
            return proc, p.stream_haproxy
        raise ValueError(path)

    def run_tool(self, name, argv, streams):
        """Runs streambench; `streams` one after another on a connection bound its time."""
        out = self.b.work / f"{name}.jsonl"
        timeout = 60 + streams * (self.args.stream_events * self.args.stream_gap_s + 2)
        with open(self.b.work / f"{name}.log", "wb") as log:
            subprocess.run([self.tool] + argv + ["--out", str(out)], check=True, stderr=log,
                           timeout=timeout)
        return read_lines(out)

    # --- the c=1 leg ---

    def c1(self):
        a = self.args
        paths = a.board_paths
        self.start_mock()
        started = {path: self.start_path(path) for path in paths}
        time.sleep(0.5)
        targets = [arg for path in paths for arg in ("--target", f"{path}=127.0.0.1:{started[path][1]}")]
        load_start = bench.loadavg()
        bench.log(f"c=1: {a.c1_streams} streams per path ({', '.join(paths)}), "
                  f"{a.c1_warmup} warm-up rounds, load {load_start}")
        t0 = time.monotonic()
        streams, connects, other = self.run_tool(
            "c1", ["c1", *targets, "--streams", str(a.c1_streams), "--warmup", str(a.c1_warmup),
                   "--events", str(a.stream_events), "--progress",
                   "--mock", f"127.0.0.1:{self.ports.stream_mock}"],
            (a.c1_streams + a.c1_warmup) * len(paths))
        result = {"paths": paths, "streams_per_path": a.c1_streams, "warmup": a.c1_warmup,
                  "wall_s": time.monotonic() - t0, "load_start": load_start,
                  "load_end": bench.loadavg(), "client_connects": connects,
                  # 0: no proxy opened an upstream connection during the counted rounds.
                  "mock_connections": other.get("mock_connections_after_warmup"),
                  "rows": c1_summary(streams, paths, a.stream_events)}
        for proc, _ in started.values():
            if proc:
                self.b.procs.stop(proc)
        self.b.procs.stop(self.mock)
        (self.b.work / "c1.json").write_text(json.dumps(result, indent=1))
        for row in result["rows"]:
            bench.log(f"  {row['path']}: TTFT p50 {row['ttft_p50']:.0f} µs p99 {row['ttft_p99']:.0f} µs, "
                      f"gap p50 {row['gap_p50']:.0f} p99 {row['gap_p99']:.0f} µs, "
                      f"{row['failed']} of {row['streams']} failed")
        return result

    # --- the sweep ---

    def sweep(self):
        a = self.args
        paths = a.board_paths
        self.start_mock()
        cells = []
        try:
            for i, level in enumerate(a.sweep_levels):
                shift = i % len(paths)
                for path in paths[shift:] + paths[:shift]:
                    # The row it belongs to: a level given twice (turns) has a row per turn.
                    cells.append(dict(self.sweep_one(path, level), row=i))
        finally:
            self.b.procs.stop(self.mock)
        result = {"paths": paths, "levels": a.sweep_levels, "duration_s": a.sweep_duration,
                  "stall_us": a.stall_threshold_s * 1e6, "cells": cells}
        (self.b.work / "sweep.json").write_text(json.dumps(result, indent=1))
        return result

    def sweep_one(self, path, level):
        a = self.args
        proc, port = self.start_path(path)
        pids = bench.tree(proc.pid) if proc else []
        time.sleep(0.3)
        load = bench.loadavg()
        cpu0 = bench.cpu_seconds(pids)
        sampler = bench.Sampler(pids, time.monotonic()) if pids else None
        if sampler:
            sampler.start()
        streams, connects, _ = self.run_tool(
            f"sweep-{level}-{path}",
            ["sweep", "--target", f"{path}=127.0.0.1:{port}", "--concurrency", str(level),
             "--duration-s", str(a.sweep_duration), "--events", str(a.stream_events)],
            2 + a.sweep_duration / (a.stream_events * a.stream_gap_s))
        cell = {"path": path, "level": level, "load": load, "client_connects": connects.get(path)}
        cell.update(sweep_cell(streams, a.stream_events, a.stall_threshold_s * 1e6))
        if proc:
            cpu = bench.cpu_seconds(pids) - cpu0
            sampler.halt.set()
            sampler.join()
            cell["cpu_ms_per_1000"] = cpu * 1e6 / cell["content"] if cell["content"] else None
            cell["peak_rss_mib"] = max((r for _, r in sampler.samples), default=0) / 1024
            self.b.procs.stop(proc)
        bench.log(f"sweep {level} {path}: {cell['stall_free']} of {cell['streams']} stall-free, "
                  f"TTFT p50 {fmt(cell['ttft_p50_us'])} µs, load {load}")
        return cell


# --- the report --------------------------------------------------------------------------------


def fmt(v, signed=False):
    if v is None:
        return "-"
    return f"{v:+,.0f}" if signed else f"{v:,.0f}"


def c1_table(result):
    lines = ["| path | streams (failed) | TTFT p50 / p99 | gap p50 / p99 | added TTFT p50 / p99 "
             "| added gap p50 / p99 |", "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        added = lambda k: fmt(r.get(f"added_{k}"), signed=True)
        lines.append(
            f"| {r['path']} | {r['streams']:,} ({r['failed']}) | {fmt(r['ttft_p50'])} / "
            f"{fmt(r['ttft_p99'])} µs | {fmt(r['gap_p50'])} / {fmt(r['gap_p99'])} µs | "
            + ("-" if r["path"] == "direct" else f"{added('ttft_p50')} / {added('ttft_p99')} µs")
            + " | "
            + ("-" if r["path"] == "direct" else f"{added('gap_p50')} / {added('gap_p99')} µs")
            + " |")
    return "\n".join(lines)


def sweep_table(result):
    paths = result["paths"]
    # By row (the level's place in --sweep-levels), so each turn of a repeated level is a row.
    by = {(c["row"], c["path"]): c for c in result["cells"]}
    head = "| streams at once | " + " | ".join(paths) + " | load average |"
    lines = ["TTFT p50 and stall-free streams (of those run) per level; for proxies also CPU per "
             "1,000 content frames and peak RSS:", "", head, "|---|" + "---|" * (len(paths) + 1)]
    for row, level in enumerate(result["levels"]):
        cells = []
        for path in paths:
            c = by.get((row, path))
            if not c:
                cells.append("-")
                continue
            text = f"{fmt(c['ttft_p50_us'])} µs, {c['stall_free']:,} of {c['streams']:,}"
            if c.get("cpu_ms_per_1000") is not None:
                text += f", {c['cpu_ms_per_1000']:.1f} ms, {c['peak_rss_mib']:.1f} MiB"
            cells.append(text)
        loads = sorted({by[(row, p)]["load"] for p in paths if (row, p) in by})
        lines.append(f"| {level:,} | " + " | ".join(cells) + f" | {'; '.join(loads)} |")
    lines.append("")
    lines.append("Highest level with every stream stall-free: " + ", ".join(
        f"{p} **{highest_clean_level([c for c in result['cells'] if c['path'] == p]):,}**"
        for p in paths) + ".")
    return "\n".join(lines)


def report(c1, sweep, args):
    out = []
    if c1:
        connects = ", ".join(f"{p} {n}" for p, n in c1["client_connects"].items())
        out += [f"c=1 leg: {c1['streams_per_path']:,} streams per path after {c1['warmup']} warm-up "
                f"rounds, paths alternated stream by stream ({c1['wall_s']:.0f} s; load average "
                f"{c1['load_start']} at the start, {c1['load_end']} at the end). Each stream: "
                f"{args.stream_events} content frames {args.stream_gap_s * 1000:g} ms apart. "
                f"Connections the client opened: {connects}; the mock accepted "
                f"{fmt(c1['mock_connections'])} during the counted rounds (0: every proxy kept its "
                "upstream connection).", "", c1_table(c1)]
    if sweep:
        out += ["" if out else None,
                f"Stall sweep: per level, every path in turn, each stream {args.stream_events} "
                f"content frames {args.stream_gap_s * 1000:g} ms apart, streams back to back on each "
                f"connection for {sweep['duration_s']:g} s; a stall is a gap over "
                f"{sweep['stall_us'] / 1000:g} ms.", "", sweep_table(sweep)]
    return "\n".join(line for line in out if line is not None)


def write_benchmarks(section):
    """Replaces the legs' block in BENCHMARKS.md (after the section heading it sits under)."""
    bench.write_benchmarks(section, MARK_BEGIN, MARK_END)


def full_run(args):
    """Whether the legs ran at their full size (a shortened run does not rewrite BENCHMARKS.md)."""
    return (args.c1_streams >= 500 and args.stream_events == 64
            and args.sweep_levels == [2 ** k for k in range(11)])


def smoke_checks(c1, sweep, args):
    """What a smoke run must show: every stream complete, one kept connection per path."""
    problems = []
    if c1:
        for r in c1["rows"]:
            if r["failed"] or r["streams"] != args.c1_streams or r["ttft_p50"] is None:
                problems.append(f"c1 {r['path']}: {r['failed']} of {r['streams']} failed")
        if any(n != 1 for n in c1["client_connects"].values()) or c1["mock_connections"] != 0:
            problems.append(f"c1: client connections {c1['client_connects']} (one per path "
                            f"expected), upstream connections opened after the warm-up "
                            f"{c1['mock_connections']} (0 expected)")
    if sweep:
        for c in sweep["cells"]:
            if c["failed"] or c["streams"] < c["level"] or not math.isfinite(c["ttft_p50_us"] or math.nan):
                problems.append(f"sweep {c['level']} {c['path']}: {c['failed']} of {c['streams']} failed")
    return problems


def run(b, legs):
    """Runs the legs named (c1, sweep) on the Bench `b`; returns (report text, problems)."""
    s = StreamLegs(b)
    c1 = s.c1() if "c1" in legs else None
    sweep = s.sweep() if "sweep" in legs else None
    text = report(c1, sweep, b.args)
    os.makedirs(b.work, exist_ok=True)
    (b.work / "stream-legs.md").write_text(text + "\n")
    return text, smoke_checks(c1, sweep, b.args)
