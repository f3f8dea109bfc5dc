#!/usr/bin/env python3
"""The proxy benchmark: what metronome costs next to the proxies operators already run.

One sim upstream at a steady cadence; `metronome probe` as an open-loop client; five paths side by
side, interleaved in every repeat so that the machine's load falls on all of them alike:

  direct       probe -> sim
  metronome    probe -> metronome (metering on, the defaults) -> sim
  nginx        probe -> nginx (proxy_buffering off, keep-alive upstream) -> sim
  haproxy      probe -> HAProxy (mode http, http-no-delay) -> sim
  passthrough  probe -> metronome with metering.enabled = false -> sim

and on request (--paths): shared, metronome with server.threading = "shared" (one work-stealing
pool instead of an event loop per core); nobatch, metronome with [batch] enabled = false (the
batch detector's cost beside the defaults); otlp, metronome exporting OTLP metrics every second
and a span per stream to scripts/otlp_receiver.py (whose CPU is not counted).

Per path and level: client ITL p50 / p99 / p99.9 and TTFT p50 / p99 inflation against direct (per
repeat, then the median), CPU seconds of the proxy's processes per million token events (from
/proc), the ratio to nginx, resident memory per open stream (steady-state RSS minus the idle RSS,
over the streams in flight), errors; for metronome also its own proxy delay (egress - ingress)
from its histogram. Then the saturation figure: metronome on one core (taskset, so one worker) and
nginx alike, sim and probe on the other, the event rate raised until p99 inflation reaches 1 ms.

Two more legs measure as the onthebench.ai gateway board's stream suite does (scripts/bench_stream.py):
c1, metronome and nginx beside direct at one stream at a time (added TTFT and added gap, p50 and
p99), and sweep, TTFT p50 and stall-free streams from 1 to 1,024 streams at once. A run with no
option that shapes the legs above runs all five legs; `--only c1,sweep` (or any subset of
levels, hold, saturation, c1, sweep) runs those alone.

Every process is started in its own session and killed on exit. Everything is on 127.0.0.1.
Run through scripts/bench.sh, which builds the release binary (or takes METRONOME_BIN) and installs
nginx and HAProxy.
"""

import argparse
import json
import math
import os
import platform
import re
import resource
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.request
from pathlib import Path

import hiccups

ROOT = Path(__file__).resolve().parent.parent
# METRONOME_BIN: a binary built elsewhere (scripts/bench.sh then builds nothing).
BIN = Path(os.environ.get("METRONOME_BIN") or ROOT / "target" / "release" / "metronome")
PATHS = ["direct", "metronome", "nginx", "haproxy", "passthrough"]
# With --baseline BIN: metronome as another build (say, before a change), metering on.
BASELINE = "metronome-before"
# Only with --paths: metronome on one work-stealing pool (server.threading = "shared").
SHARED = "shared"
# Only with --paths: metronome without the batch detector ([batch] enabled = false), so the
# detector's cost is read beside the defaults in one run.
NOBATCH = "nobatch"
# Only with --paths: metronome exporting OTLP metrics every second and one span per stream to
# scripts/otlp_receiver.py (its CPU is not the proxy's and is not counted).
OTLP = "otlp"
VARIANTS = [SHARED, NOBATCH, OTLP]
# Every path that is a metronome process, with its admin endpoint.
METRONOMES = ["metronome", "passthrough", BASELINE] + VARIANTS
# With --pin: the proxy under test on one CPU, the sim and the probe on the other.
PROXY_CPU, GENERATOR_CPU = "0", "1"
PROXIES = [p for p in PATHS if p != "direct"]
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
# The legs of a run; c1 and sweep are scripts/bench_stream.py's.
LEGS = ["levels", "hold", "saturation", "c1", "sweep"]
# Options that shape the first three legs: a run given one leaves c1 and sweep out.
CLASSIC_SHAPERS = {"--levels", "--repeats", "--large-repeats", "--duration", "--no-saturation",
                   "--saturation-only", "--hold", "--sat-rates", "--pin"}
# The paths of the c1 and sweep legs by default, and the others they can run.
BOARD_PATHS = ["direct", "metronome", "nginx"]
BOARD_EXTRA = ["passthrough", "haproxy", BASELINE]
MARK_BEGIN = "<!-- scripts/bench.sh: begin -->"
MARK_END = "<!-- scripts/bench.sh: end -->"


def log(message):
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def loadavg():
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


# --- processes ---------------------------------------------------------------------------------


class Processes:
    """Every process the benchmark starts, each in its own session, so that one kill ends it and
    its children (nginx workers). Nothing else is ever signalled."""

    def __init__(self, work):
        self.work = work
        self.running = []

    def start(self, name, argv, env=None, cpus=None):
        if cpus is not None:
            argv = ["taskset", "-c", cpus] + list(argv)
        out = open(self.work / f"{name}.log", "ab")
        full_env = dict(os.environ)
        full_env.update(env or {})
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
        )
        out.close()
        proc.bench_name = name
        self.running.append(proc)
        return proc

    def stop(self, proc, timeout=10):
        if proc not in self.running:
            return
        self.running.remove(proc)
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        else:
            # The leader exited; children of its session may live on.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def stop_all(self):
        for proc in list(reversed(self.running)):
            self.stop(proc, timeout=5)


def wait_port(port, proc, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.bench_name} exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{proc.bench_name}: nothing listens on 127.0.0.1:{port}")


def port_free(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


# --- /proc -------------------------------------------------------------------------------------


def stat_fields(pid):
    """The fields of /proc/PID/stat after the command name (which may hold spaces and parentheses),
    so that field 0 is the state; None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def tree(pid):
    """pid and its descendants (nginx: master and workers)."""
    children = {}
    for entry in os.listdir("/proc"):
        fields = stat_fields(entry) if entry.isdigit() else None
        if fields:
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_split(pids):
    """(utime, stime) of the processes (every thread, living or exited), in seconds: the proxy's
    own code against the kernel's work on its behalf (its system calls and the loopback TCP
    processing charged to them), which tells a user-space cost from a kernel one."""
    user = system = 0
    for fields in filter(None, map(stat_fields, pids)):
        user += int(fields[11])
        system += int(fields[12])
    return user / CLK_TCK, system / CLK_TCK


def cpu_seconds(pids):
    """utime + stime of the processes (every thread, living or exited), in seconds."""
    return sum(cpu_split(pids))


def parse_wake_ipis(text):
    """Per CPU (`cpu0`, ...), the `RES` + `CAL` counts of a /proc/interrupts text."""
    lines = text.splitlines()
    cpus = [cpu.lower() for cpu in lines[0].split()] if lines else []
    counts = dict.fromkeys(cpus, 0)
    for line in lines[1:]:
        fields = line.split()
        if fields and fields[0] in ("RES:", "CAL:"):
            for cpu, v in zip(cpus, fields[1:1 + len(cpus)]):
                counts[cpu] += int(v)
    return counts


def wake_ipis():
    """Inter-processor interrupts each CPU has taken so far that wake a task or run work for
    another CPU (/proc/interrupts `RES` and `CAL`): waking a sleeping reader on another CPU sends
    one, and on a VM each costs the sender an exit to the hypervisor. Empty if unreadable."""
    try:
        with open("/proc/interrupts") as f:
            return parse_wake_ipis(f.read())
    except (OSError, ValueError):
        return {}


def rss_kib(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * PAGE_KIB
        except (OSError, IndexError):
            pass
    return total


def open_fds(pids):
    total = 0
    for pid in pids:
        try:
            total += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            pass
    return total


class Sampler(threading.Thread):
    """Samples the RSS of a process tree every `interval` seconds, with the time since `t0`."""

    def __init__(self, pids, t0, interval=0.5):
        super().__init__(daemon=True)
        self.pids, self.t0, self.interval = pids, t0, interval
        self.samples = []
        self.peak_fds = 0
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            self.samples.append((time.monotonic() - self.t0, rss_kib(self.pids)))
            self.peak_fds = max(self.peak_fds, open_fds(self.pids))
            self.halt.wait(self.interval)

    def between(self, start, end):
        return [rss for t, rss in self.samples if start <= t <= end]


# --- the paths ---------------------------------------------------------------------------------


class Ports:
    def __init__(self, base):
        self.sim = base
        self.metronome, self.metronome_admin = base + 1, base + 2
        self.nginx = base + 3
        self.haproxy = base + 4
        self.passthrough, self.passthrough_admin = base + 5, base + 6
        self.sat_sim, self.sat_metronome, self.sat_admin = base + 7, base + 8, base + 9
        self.baseline, self.baseline_admin = base + 10, base + 11
        self.hold_sim, self.hold_metronome, self.hold_admin = base + 12, base + 13, base + 14
        self.shared, self.shared_admin = base + 15, base + 16
        self.sat_nginx = base + 17
        self.nobatch, self.nobatch_admin = base + 18, base + 19
        self.otlp, self.otlp_admin, self.otlp_receiver = base + 20, base + 21, base + 22
        # The c1 and sweep legs (scripts/bench_stream.py): their mock and their paths.
        self.stream_mock, self.stream_nginx, self.stream_haproxy = base + 23, base + 24, base + 25
        self.stream_metronome, self.stream_metronome_admin = base + 26, base + 27
        self.stream_passthrough, self.stream_passthrough_admin = base + 28, base + 29
        self.stream_baseline, self.stream_baseline_admin = base + 30, base + 31

    def all(self):
        return list(range(self.sim, self.stream_baseline_admin + 1))

    def stream_of(self, path):
        """(listen, admin) of a metronome path of the c1 and sweep legs."""
        return {
            "metronome": (self.stream_metronome, self.stream_metronome_admin),
            "passthrough": (self.stream_passthrough, self.stream_passthrough_admin),
            BASELINE: (self.stream_baseline, self.stream_baseline_admin),
        }[path]

    def of(self, path):
        """(listen, admin) of a metronome path."""
        return {
            "metronome": (self.metronome, self.metronome_admin),
            "passthrough": (self.passthrough, self.passthrough_admin),
            BASELINE: (self.baseline, self.baseline_admin),
            SHARED: (self.shared, self.shared_admin),
            NOBATCH: (self.nobatch, self.nobatch_admin),
            OTLP: (self.otlp, self.otlp_admin),
        }[path]


def shell_command(words):
    """`words` as one bash command line that gives them back, for the report's record of its run:
    an argument with a space or a quote is quoted, and one with a newline or a tab (a
    `--metronome-toml` table) is written in bash's `$'...'` form, so the line stays one line."""
    def quote(word):
        if any(c in word for c in "\n\t\r"):
            escaped = word.replace("\\", "\\\\").replace("'", "\\'")
            escaped = escaped.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
            return f"$'{escaped}'"
        return shlex.quote(word)
    return " ".join(quote(w) for w in words)


def board_toml(parts, error):
    """The TOML the c1 and sweep legs give their metronome paths, then each `--metronome-toml`.
    `upstream_idle = "300s"`: the mock never closes an idle connection, and metronome's default
    (4 s, under uvicorn's 5 s) would close its pooled connection between c1 streams when four
    paths take turns, where nginx's pool here keeps its connections for 300 s. Checked here, so
    a mistake stops the bench before anything starts, naming the problem."""
    text = '\n[timeouts]\nupstream_idle = "300s"\n' + "".join(f"\n{p}\n" for p in parts)
    try:
        tomllib.loads(metronome_config_text(1, 2, 3, True, extra=text))
    except tomllib.TOMLDecodeError as e:
        error(f"--metronome-toml: {e} (in the TOML the c1 and sweep legs add:\n{text})")
    return text


def metronome_config(work, name, listen, admin, upstream, metering, threading="per_core", extra=""):
    path = work / f"{name}.toml"
    path.write_text(metronome_config_text(listen, admin, upstream, metering, threading, extra))
    return path


def metronome_config_text(listen, admin, upstream, metering, threading="per_core", extra=""):
    """A metronome configuration for the bench: its ports, its upstream, metering on or off, and
    `extra` TOML after it."""
    return (
        f"""[server]
listen = "127.0.0.1:{listen}"
admin = "127.0.0.1:{admin}"
upstream = "http://127.0.0.1:{upstream}"
drain_grace = "1s"
threading = "{threading}"

[readiness]
check_upstream = false

[metering]
enabled = {"true" if metering else "false"}
{extra}"""
    )


def variant_toml(path, ports):
    """The sections a variant path adds to metronome's defaults."""
    if path == NOBATCH:
        return "\n[batch]\nenabled = false\n"
    if path == OTLP:
        return (f'\n[otlp]\nendpoint = "http://127.0.0.1:{ports.otlp_receiver}"\n'
                'interval = "1s"\ntimeout = "2s"\ntraces = true\n')
    return ""


def nginx_config(work, listen, upstream, nofile, name="nginx", workers="auto"):
    root = work / name
    for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    path = work / f"{name}.conf"
    path.write_text(
        f"""# The usual SSE setup: no response buffering, HTTP/1.1 keep-alive to the upstream.
worker_processes {workers};
daemon off;
user root;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
worker_rlimit_nofile {nofile};
events {{
    worker_connections {nofile};
    multi_accept on;
}}
http {{
    access_log off;
    client_body_temp_path {root}/client_body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    keepalive_timeout 300s;
    keepalive_requests 1000000;
    upstream sim {{
        server 127.0.0.1:{upstream};
        keepalive 4096;
        keepalive_requests 1000000;
        keepalive_timeout 300s;
    }}
    server {{
        listen 127.0.0.1:{listen} backlog=4096;
        location / {{
            proxy_pass http://sim;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""
    )
    return path


def haproxy_config(work, listen, upstream, maxconn, threads=None):
    path = work / "haproxy.cfg"
    path.write_text(
        f"""# mode http with keep-alive on both sides; http-no-delay so that no event waits for more data.
global
    maxconn {maxconn}
    nbthread {threads or os.cpu_count() or 1}

defaults
    mode http
    option http-no-delay
    timeout connect 5s
    timeout client 300s
    timeout server 300s
    timeout http-keep-alive 300s
    timeout tunnel 300s
    http-reuse always

frontend fe
    bind 127.0.0.1:{listen} backlog 4096
    maxconn {maxconn}
    default_backend sim

backend sim
    server sim 127.0.0.1:{upstream}
"""
    )
    return path


class Bench:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.procs = Processes(self.work)
        self.ports = Ports(args.base_port)
        self.nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.sim = None
        self.otlp_receiver = None

    # --- lifecycle ---

    def start_sim(self, port, gap, cpus=None, env=None, coalesce=1):
        proc = self.procs.start(
            f"sim-{port}",
            [str(BIN), "sim", "--listen", f"127.0.0.1:{port}", "--gap", gap,
             "--ttft", self.args.ttft, "--drain", "1s", "--coalesce", str(coalesce)],
            env=env,
            cpus=cpus,
        )
        wait_port(port, proc)
        return proc

    def start_otlp_receiver(self):
        """The OTLP receiver of the otlp path, started once and kept for the run."""
        if self.otlp_receiver is None or self.otlp_receiver.poll() is not None:
            port = self.ports.otlp_receiver
            self.otlp_receiver = self.procs.start(
                "otlp-receiver",
                [sys.executable, str(ROOT / "scripts" / "otlp_receiver.py"), "serve", str(port)],
                cpus=GENERATOR_CPU if self.args.pin else None)
            wait_port(port, self.otlp_receiver)

    def proxy_cpus(self):
        """With --pin every proxy runs on CPU 0 alone, the generators on CPU 1."""
        return PROXY_CPU if self.args.pin else None

    def start_proxy(self, path):
        p, a = self.ports, self.args
        if path == "direct":
            return None, p.sim
        if path in METRONOMES:
            listen, admin = p.of(path)
            if path == OTLP:
                self.start_otlp_receiver()
            config = metronome_config(self.work, path, listen, admin, p.sim, path != "passthrough",
                                      "shared" if path == SHARED else "per_core",
                                      variant_toml(path, p))
            binary = self.args.baseline if path == BASELINE else str(BIN)
            proc = self.procs.start(path, [binary, "serve", "--config", str(config)],
                                    env=self.args.metronome_env, cpus=self.proxy_cpus())
            wait_port(listen, proc)
            return proc, listen
        if path == "nginx":
            # Pinned to one CPU, each proxy gets one worker (metronome counts its CPUs itself).
            config = nginx_config(self.work, p.nginx, p.sim, self.nofile,
                                  workers=1 if a.pin else "auto")
            proc = self.procs.start("nginx", ["nginx", "-c", str(config), "-p", str(self.work)],
                                    cpus=self.proxy_cpus())
            wait_port(p.nginx, proc)
            return proc, p.nginx
        if path == "haproxy":
            maxconn = max(1000, (self.nofile - 200) // 2)
            config = haproxy_config(self.work, p.haproxy, p.sim, maxconn, 1 if a.pin else None)
            proc = self.procs.start("haproxy", ["haproxy", "-db", "-f", str(config)],
                                    cpus=self.proxy_cpus())
            wait_port(p.haproxy, proc)
            return proc, p.haproxy
        raise ValueError(path)

    def probe(self, name, port, rate, duration, cap, tokens, cpus=None, env=None, http2=False):
        json_path = self.work / f"{name}.json"
        detail_path = self.work / f"{name}.detail.json"
        argv = [
            str(BIN), "probe", "--url", f"http://127.0.0.1:{port}",
            "--rate", f"{rate:.6g}", "--duration", f"{duration}s", "--concurrency", str(cap),
            "--max-tokens", str(tokens), "--timeout", "120s",
            "--json", str(json_path), "--detail", str(detail_path),
        ] + (["--http2"] if http2 else [])
        if cpus is not None:
            argv = ["taskset", "-c", cpus] + argv
        full_env = dict(os.environ)
        full_env.update(env or {})
        with open(self.work / f"{name}.probe.log", "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=full_env,
                                    start_new_session=True)
            proc.bench_name = name
            self.procs.running.append(proc)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            self.procs.running.remove(proc)
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"probe {name} failed ({proc.returncode}); see {out.name}")
        detail = json.loads(detail_path.read_text())
        detail["probe_cpu_s"] = usage.ru_utime + usage.ru_stime
        # Each voluntary context switch is the probe going to sleep for want of bytes; the next
        # write to it must wake it, at a cost charged to the writer (the proxy, or the sim).
        detail["probe_sleeps"] = usage.ru_nvcsw
        return detail

    # --- one path at one level ---

    def run_path(self, path, level, repeat, streams, cap):
        a = self.args
        stream_s = a.ttft_s + a.tokens * a.gap_s
        rate = streams / stream_s
        name = f"L{level}-r{repeat}-{path}"
        wake = self.machine_wake_lateness()
        proc, port = self.start_proxy(path)
        pids = tree(proc.pid) if proc else []
        time.sleep(0.5)
        load_before = loadavg()
        sim_pids = [self.sim.pid]
        rss0 = rss_kib(pids) if pids else None
        (user0, sys0), sim_cpu0 = cpu_split(pids), cpu_seconds(sim_pids)
        ipis0 = wake_ipis()
        t0 = time.monotonic()
        sampler = Sampler(pids, t0) if pids else None
        if sampler:
            sampler.start()
        detail = self.probe(name, port, rate, a.duration, cap, a.tokens,
                            cpus=GENERATOR_CPU if a.pin else None)
        wall = time.monotonic() - t0
        (user1, sys1), sim_cpu1 = cpu_split(pids), cpu_seconds(sim_pids)
        ipis1 = wake_ipis()
        if sampler:
            sampler.halt.set()
            sampler.join()
        result = {
            "path": path, "level": level, "repeat": repeat, "streams": streams, "rate": rate,
            "load_before": load_before, "load_after": loadavg(), "wall_s": wall,
            "requests": detail["requests"], "errors": detail["errors"],
            "errors_by_kind": detail["errors_by_kind"],
            "error_examples": detail.get("error_examples", {}),
            "token_events": detail["token_events"],
            "itl_us": detail["itl_us"], "ttft_us": detail["ttft_us"],
            "probe_cpu_s": detail["probe_cpu_s"], "sim_cpu_s": sim_cpu1 - sim_cpu0,
            "wake_late_us": wake,
            "probe_sleeps": detail["probe_sleeps"],
            "wake_ipis": {cpu: ipis1[cpu] - ipis0[cpu] for cpu in ipis1 if cpu in ipis0},
        }
        if pids:
            result["cpu_s"] = (user1 + sys1) - (user0 + sys0)
            result["cpu_user_s"] = user1 - user0
            # Steady state: every stream started since one stream length ago is still running.
            steady = sampler.between(stream_s + 1.0, a.duration - 0.5)
            result["rss0_kib"] = rss0
            result["rss_steady_kib"] = statistics.median(steady) if steady else None
            result["rss_max_kib"] = max((r for _, r in sampler.samples), default=None)
            result["peak_fds"] = sampler.peak_fds
        if path in METRONOMES:
            result.update(scrape_metronome(self.ports.of(path)[1]))
        if proc:
            self.procs.stop(proc)
        (self.work / f"{name}.result.json").write_text(json.dumps(result, indent=1))
        return result

    def machine_wake_lateness(self):
        """How late the machine wakes a sleeping thread on each CPU, just before a run (with the
        sim idle and no proxy started): how noisy the machine is at that moment, which changes
        from minute to minute on a shared machine and sets the tail more than any proxy does in
        a noisy one (scripts/hiccups.py). None with --wake-sleeps 0."""
        if not self.args.wake_sleeps:
            return None
        return hiccups.measure(count=self.args.wake_sleeps)

    def run_levels(self):
        a = self.args
        results = []
        # A proxy holds two sockets per stream, plus idle pooled upstream connections while
        # streams come and go; keep a margin under the open-file limit.
        limit = max(1, (self.nofile - 2000) // 2)
        for level in a.levels:
            streams = min(level, limit)
            if streams < level:
                log(f"level {level}: a proxy holds two sockets per stream and the open-file limit "
                    f"is {self.nofile}, so this level runs {streams} streams")
            cap = min(math.ceil(streams * 1.05) + 5, limit + 100)
            repeats = a.repeats if level < 5000 else min(a.repeats, a.large_repeats)
            for repeat in range(repeats):
                # Direct first (the others are compared with it), then the proxies in an order
                # rotated every repeat, so that no proxy always runs first after a quiet spell.
                proxies = [p for p in a.paths if p != "direct"]
                shift = repeat % max(1, len(proxies))
                order = (["direct"] if "direct" in a.paths else []) + proxies[shift:] + proxies[:shift]
                for path in order:
                    log(f"level {level} repeat {repeat + 1}/{repeats}: {path} "
                        f"({streams} streams, load {loadavg()})")
                    r = self.run_path(path, level, repeat, streams, cap)
                    results.append(r)
                    log(f"  {path}: {r['token_events']} token events, errors {r['errors']}, "
                        f"ITL p99 {fmt_us(r['itl_us']['p99'])}, cpu {r.get('cpu_s', 0):.2f}s, "
                        f"rss {r.get('rss_steady_kib')} KiB")
        return results

    # --- holding many streams ---

    def hold(self):
        """`--hold` streams open at once through metronome, at a cadence the machine can generate
        (`--hold-gap`), with the client on HTTP/2: one client connection carries every stream,
        so metronome needs one socket per stream (the upstream's) and the open-file limit allows
        10,000. Direct (also HTTP/2) for reference."""
        a = self.args
        p = self.ports
        gap_s = parse_duration(a.hold_gap)
        stream_s = a.ttft_s + a.hold_tokens * gap_s
        streams = a.hold
        rate = streams / stream_s
        cap = streams + max(10, streams // 50)
        sim = self.start_sim(p.hold_sim, a.hold_gap)
        config = metronome_config(self.work, "hold", p.hold_metronome, p.hold_admin, p.hold_sim, True,
                                  a.hold_threading)
        results = {}
        try:
            for path in ("direct", "metronome"):
                proc, port = None, p.hold_sim
                if path == "metronome":
                    proc = self.procs.start("hold-metronome", [str(BIN), "serve", "--config", str(config)],
                                            env=self.args.metronome_env)
                    wait_port(p.hold_metronome, proc)
                    port = p.hold_metronome
                    time.sleep(0.5)
                pids = tree(proc.pid) if proc else []
                log(f"hold: {path}, {streams} streams at {a.hold_gap} over HTTP/2 (load {loadavg()})")
                load_before = loadavg()
                rss0, cpu0 = rss_kib(pids), cpu_seconds(pids)
                t0 = time.monotonic()
                sampler = Sampler(pids, t0) if pids else None
                if sampler:
                    sampler.start()
                d = self.probe(f"hold-{path}", port, rate, a.hold_duration, cap, a.hold_tokens,
                               http2=True)
                r = {"streams": streams, "load_before": load_before, "requests": d["requests"],
                     "errors": d["errors"], "errors_by_kind": d["errors_by_kind"],
                     "token_events": d["token_events"], "itl_us": d["itl_us"], "ttft_us": d["ttft_us"],
                     "wall_s": time.monotonic() - t0}
                if proc:
                    sampler.halt.set()
                    sampler.join()
                    r["cpu_s"] = cpu_seconds(pids) - cpu0
                    steady = sampler.between(stream_s + 1.0, a.hold_duration - 0.5)
                    r["rss0_kib"] = rss0
                    r["rss_steady_kib"] = statistics.median(steady) if steady else None
                    r["peak_fds"] = sampler.peak_fds
                    r.update(scrape_metronome(p.hold_admin))
                    self.procs.stop(proc)
                results[path] = r
                log(f"  {path}: {r['requests']} streams, errors {r['errors']}, "
                    f"ITL p99 {fmt_us(r['itl_us']['p99'])}")
        finally:
            self.procs.stop(sim)
        (self.work / "hold.json").write_text(json.dumps(results, indent=1))
        return results

    # --- saturation ---

    def saturation(self):
        """metronome on CPU 0 with one tokio worker; sim and probe on CPU 1. The event rate rises
        until metronome's core is saturated, errors appear, or the generators (one core) can no
        longer hold the cadence on the direct path. Each step reports the client-side p99
        inflation over direct (the issue's criterion, see `passes`) and metronome's own p99 proxy
        delay (egress - ingress, from its histogram), which the other core's load does not
        reach."""
        a = self.args
        p = self.ports
        one = {"TOKIO_WORKER_THREADS": "1"}
        gap_s = a.sat_gap_s
        stream_s = a.ttft_s + a.sat_tokens * gap_s
        # The sim's gap is between decode steps, and with --coalesce N it writes every Nth step's
        # events together: frames --sat-gap apart take steps N times closer.
        step_gap = f"{gap_s / a.sat_coalesce * 1e6:.0f}us"
        sim = self.start_sim(p.sat_sim, step_gap, cpus="1", env=one, coalesce=a.sat_coalesce)
        config = metronome_config(self.work, "saturation", p.sat_metronome, p.sat_admin, p.sat_sim, True)
        # nginx alike on the same core, one worker process: what a proxy that parses nothing costs.
        nginx = (nginx_config(self.work, p.sat_nginx, p.sat_sim, self.nofile, "saturation-nginx", 1)
                 if a.sat_nginx else None)
        steps = []
        try:
            for rate in a.sat_rates:
                # Each stream's decode step writes `coalesce` token events in one frame.
                streams = max(1, round(rate * gap_s / a.sat_coalesce))
                if streams > (self.nofile - 300) // 2:
                    break
                cap = math.ceil(streams * 1.05) + 5
                srate = streams / stream_s
                step = {"events_per_s": streams * a.sat_coalesce / gap_s, "streams": streams,
                        "coalesce": a.sat_coalesce, "load_before": loadavg()}
                for path in ("direct", "metronome") + (("nginx",) if nginx else ()):
                    proc = None
                    port = p.sat_sim
                    if path == "metronome":
                        proc = self.procs.start("saturation-metronome",
                                                [str(BIN), "serve", "--config", str(config)],
                                                env=one, cpus="0")
                        wait_port(p.sat_metronome, proc)
                        port = p.sat_metronome
                        time.sleep(0.3)
                    elif path == "nginx":
                        proc = self.procs.start("saturation-nginx",
                                                ["nginx", "-c", str(nginx), "-p", str(self.work)],
                                                cpus="0")
                        wait_port(p.sat_nginx, proc)
                        port = p.sat_nginx
                        time.sleep(0.3)
                    pids = tree(proc.pid) if proc else []
                    cpu0 = cpu_seconds(pids)
                    t0 = time.monotonic()
                    d = self.probe(f"sat-{streams}-{path}", port, srate, a.sat_duration, cap,
                                   a.sat_tokens * a.sat_coalesce, cpus="1", env=one)
                    wall = time.monotonic() - t0
                    step[path] = {"itl_us": d["itl_us"], "errors": d["errors"],
                                  "token_events": d["token_events"], "wall_s": wall,
                                  "probe_cpu_s": d["probe_cpu_s"]}
                    if proc:
                        step[path]["cpu_s"] = cpu_seconds(pids) - cpu0
                        step[path]["core_busy"] = step[path]["cpu_s"] / wall
                        if path == "metronome":
                            step[path].update(scrape_metronome(p.sat_admin))
                        self.procs.stop(proc)
                step["load_after"] = loadavg()
                direct, metro = step["direct"], step["metronome"]
                step["p99_inflation_us"] = metro["itl_us"]["p99"] - direct["itl_us"]["p99"]
                step["delay_p99_us"] = (metro.get("proxy_delay_us") or {}).get("p99")
                # The generators (one core) hold the cadence while the direct p99 gap stays under
                # twice the gap; beyond that every path's figures are the generators'.
                step["generator_ok"] = direct["itl_us"]["p99"] <= gap_s * 1e6 * 2
                steps.append(step)
                log(f"saturation {step['events_per_s']:.0f} events/s ({streams} streams): proxy delay "
                    f"p99 {fmt_us(step['delay_p99_us'])}, client p99 inflation "
                    f"{step['p99_inflation_us']:.0f} µs, metronome core {metro['core_busy'] * 100:.0f}% "
                    f"busy, errors {direct['errors']}/{metro['errors']}, direct p50 "
                    f"{fmt_us(direct['itl_us']['p50'])}, load {step['load_after']}")
                if (metro["errors"] or direct["errors"] or metro["core_busy"] > 0.95
                        or not step["generator_ok"]):
                    break
        finally:
            self.procs.stop(sim)
        return steps


def passes(step):
    """The issue's criterion: client p99 ITL inflation over direct under 1 ms, no errors."""
    return (step["p99_inflation_us"] < 1000 and not step["metronome"]["errors"]
            and not step["direct"]["errors"])


def cpu_per_event_us(step, path="metronome"):
    m = step.get(path)
    if not m or "cpu_s" not in m or not m["token_events"]:
        return None
    return m["cpu_s"] / m["token_events"] * 1e6


def scrape_metronome(admin):
    """metronome's own view: proxy delay quantiles from its histogram, stream outcomes."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError as e:
        return {"scrape_error": str(e)}
    buckets = {}
    outcomes = {}
    for line in text.splitlines():
        m = re.match(r'metronome_proxy_delay_seconds_bucket\{(.*)\} (\S+)', line)
        if m:
            le = re.search(r'le="([^"]+)"', m.group(1)).group(1)
            bound = math.inf if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0) + float(m.group(2))
        m = re.match(r'metronome_streams_total\{(.*)\} (\S+)', line)
        if m:
            outcome = re.search(r'outcome="([^"]+)"', m.group(1)).group(1)
            outcomes[outcome] = outcomes.get(outcome, 0) + float(m.group(2))
    out = {"stream_outcomes": outcomes}
    if buckets:
        bounds = sorted(buckets)
        out["proxy_delay_us"] = {
            q: quantile_from_buckets(bounds, buckets, frac)
            for q, frac in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999))
        }
    return out


def quantile_from_buckets(bounds, cumulative, q):
    """histogram_quantile: linear within the bucket, in µs."""
    total = cumulative[bounds[-1]]
    if total == 0:
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for b in bounds:
        c = cumulative[b]
        if c >= rank:
            if math.isinf(b):
                return prev_bound * 1e6
            width = c - prev_count
            frac = (rank - prev_count) / width if width else 0
            return (prev_bound + (b - prev_bound) * frac) * 1e6
        prev_bound, prev_count = b, c
    return prev_bound * 1e6


# --- summary -----------------------------------------------------------------------------------


def fmt_us(v):
    if v is None:
        return "-"
    return f"{v / 1000:.2f} ms" if abs(v) >= 1000 else f"{v:.0f} µs"


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(results, paths):
    """Per level and path: medians over repeats; inflation is per repeat against that repeat's
    direct run, then the median."""
    by_level = {}
    for r in results:
        by_level.setdefault(r["level"], []).append(r)
    rows = []
    for level, runs in sorted(by_level.items()):
        direct = {r["repeat"]: r for r in runs if r["path"] == "direct"}
        per_path = {}
        for path in paths:
            mine = [r for r in runs if r["path"] == path]
            if not mine:
                continue
            row = {"level": level, "path": path, "streams": mine[0]["streams"],
                   "repeats": len(mine),
                   "errors": sum(r["errors"] for r in mine),
                   "requests": sum(r["requests"] for r in mine),
                   "token_events": med([r["token_events"] for r in mine]),
                   "loads": [r["load_before"] for r in mine],
                   "wakes": [r.get("wake_late_us") for r in mine]}
            for key in ("p50", "p99", "p999"):
                row[f"itl_{key}"] = med([r["itl_us"][key] for r in mine])
            for key in ("p50", "p99"):
                row[f"ttft_{key}"] = med([r["ttft_us"][key] for r in mine])
            if path != "direct" and direct:
                for key in ("p50", "p99", "p999"):
                    row[f"itl_{key}_infl"] = med([r["itl_us"][key] - direct[r["repeat"]]["itl_us"][key]
                                                  for r in mine if r["repeat"] in direct])
                for key in ("p50", "p99"):
                    row[f"ttft_{key}_infl"] = med([r["ttft_us"][key] - direct[r["repeat"]]["ttft_us"][key]
                                                   for r in mine if r["repeat"] in direct])
            def per_event(value, scale=1.0):
                """The median over the repeats of value(run) per token event, times scale; None
                if a run lacks the figure (results of an older bench.py, from --combine)."""
                try:
                    return med([value(r) / r["token_events"] * scale
                                for r in mine if r["token_events"]])
                except KeyError:
                    return None

            if "cpu_s" in mine[0]:
                row["cpu_per_m"] = per_event(lambda r: r["cpu_s"], 1e6)
                row["cpu_user_per_m"] = per_event(lambda r: r["cpu_user_s"], 1e6)
                row["cpu_system_per_m"] = per_event(lambda r: r["cpu_s"] - r["cpu_user_s"], 1e6)
                row["rss_per_stream_kib"] = med([(r["rss_steady_kib"] - r["rss0_kib"]) / r["streams"]
                                                 for r in mine if r.get("rss_steady_kib")])
                row["rss0_kib"] = med([r["rss0_kib"] for r in mine])
            if any("proxy_delay_us" in r for r in mine):
                row["delay_p99"] = med([r["proxy_delay_us"]["p99"] for r in mine if "proxy_delay_us" in r])
                row["delay_p50"] = med([r["proxy_delay_us"]["p50"] for r in mine if "proxy_delay_us" in r])
            row["sim_cpu_per_m"] = per_event(lambda r: r["sim_cpu_s"], 1e6)
            row["probe_cpu_per_m"] = per_event(lambda r: r["probe_cpu_s"], 1e6)
            row["probe_sleeps_per_event"] = per_event(lambda r: r["probe_sleeps"])
            cpus = sorted(set.intersection(*(set(r.get("wake_ipis", {})) for r in mine)),
                          key=lambda c: int(c[3:]))
            row["ipis_per_event"] = {cpu: per_event(lambda r, cpu=cpu: r["wake_ipis"][cpu])
                                     for cpu in cpus}
            per_path[path] = row
        nginx = per_path.get("nginx", {}).get("cpu_per_m")
        for row in per_path.values():
            if row.get("cpu_per_m") is not None and nginx:
                row["cpu_ratio_nginx"] = row["cpu_per_m"] / nginx
            rows.append(row)
    return rows


def signed_us(v):
    if v is None:
        return "-"
    return f"{v:+.0f}"


def table(rows):
    head = ("| level (streams) | path | ITL p50 / p99 / p99.9 | TTFT p50 / p99 | CPU s per M events (user + system) "
            "| vs nginx | RSS per stream | metronome proxy delay p50 / p99 | errors |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        level = f"{r['level']:,}" + (f" ({r['streams']:,})" if r["streams"] != r["level"] else "")
        if r["path"] == "direct":
            itl = " / ".join(f"{r[f'itl_{k}'] / 1000:.2f}" for k in ("p50", "p99", "p999")) + " ms"
            ttft = " / ".join(f"{r[f'ttft_{k}'] / 1000:.1f}" for k in ("p50", "p99")) + " ms"
        else:
            itl = " / ".join(signed_us(r.get(f"itl_{k}_infl")) for k in ("p50", "p99", "p999")) + " µs"
            ttft = " / ".join(signed_us(r.get(f"ttft_{k}_infl")) for k in ("p50", "p99")) + " µs"
        cpu = f"{r['cpu_per_m']:.2f}" if r.get("cpu_per_m") is not None else "-"
        if r.get("cpu_user_per_m") is not None:
            cpu += f" ({r['cpu_user_per_m']:.2f} + {r['cpu_system_per_m']:.2f})"
        ratio = f"{r['cpu_ratio_nginx']:.2f}" if r.get("cpu_ratio_nginx") is not None else "-"
        rss = f"{r['rss_per_stream_kib']:.1f} KiB" if r.get("rss_per_stream_kib") is not None else "-"
        delay = (f"{r['delay_p50']:.0f} / {r['delay_p99']:.0f} µs"
                 if r.get("delay_p99") is not None else "-")
        lines.append(f"| {level} | {r['path']} | {itl} | {ttft} | {cpu} | {ratio} | {rss} | {delay} "
                     f"| {r['errors']} of {r['requests']} |")
    return "\n".join(lines)


def wake_p99s(wake):
    """One run's wake-up lateness p99 per CPU, `CPU 0 / CPU 1` in µs ("-" if not measured)."""
    if not wake:
        return "-"
    return " / ".join(f"{wake[cpu]['p99']:.0f}" for cpu in sorted(wake, key=lambda c: int(c[3:])))


def generators_table(rows):
    lines = ["| level | path | sim CPU s per M events | probe CPU s per M events "
             "| probe sleeps per event | wake-up IPIs per event, per CPU | load average before each run "
             "| wake-up lateness p99 per CPU before each run (µs) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sleeps = (f"{r['probe_sleeps_per_event']:.3f}" if r.get("probe_sleeps_per_event") is not None
                  else "-")
        ipis = " / ".join(f"{v:.3f}" for v in r.get("ipis_per_event", {}).values()) or "-"
        lines.append(f"| {r['level']:,} | {r['path']} | {r['sim_cpu_per_m']:.2f} | "
                     f"{r['probe_cpu_per_m']:.2f} | {sleeps} | {ipis} | {'; '.join(r['loads'])} | "
                     f"{'; '.join(wake_p99s(w) for w in r['wakes'])} |")
    return "\n".join(lines)


def hold_report(held, args):
    d, m = held["direct"], held["metronome"]
    rss = ((m["rss_steady_kib"] - m["rss0_kib"]) / m["streams"]) if m.get("rss_steady_kib") else None
    cpu = m["cpu_s"] / m["token_events"] * 1e6 if m.get("token_events") else None
    outcomes = ", ".join(f"{k} {v:,.0f}" for k, v in sorted(m.get("stream_outcomes", {}).items()))
    lines = [f"Holding {m['streams']:,} streams open at once (client on HTTP/2, so metronome needs one "
             f"socket per stream; {args.hold_tokens} token events {args.hold_gap} apart, a cadence this "
             "machine can generate for that many):",
             "",
             "| path | streams | errors | ITL p50 / p99 / p99.9 | TTFT p50 / p99 | CPU s per M events "
             "| RSS per stream | metronome's outcomes | load average |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in (("direct", d), ("metronome", m)):
        itl = " / ".join(f"{r['itl_us'][k] / 1000:.1f}" for k in ("p50", "p99", "p999")) + " ms"
        ttft = " / ".join(f"{r['ttft_us'][k] / 1000:.1f}" for k in ("p50", "p99")) + " ms"
        lines.append(
            f"| {name} | {r['requests']:,} | {r['errors']} | {itl} | {ttft} | "
            + (f"{cpu:.2f} | {rss:.1f} KiB | {outcomes}" if name == "metronome" else "- | - | -")
            + f" | {r['load_before']} |")
    return "\n".join(lines)


def saturation_table(steps):
    lines = ["| events/s offered | streams | metronome proxy delay p50 / p99 | client ITL p99: direct, "
             "inflation through metronome | metronome core busy | CPU µs per event | nginx on the same "
             "core: CPU µs per event, p99 inflation | errors (direct / metronome) | load average |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in steps:
        d, m = s["direct"], s["metronome"]
        delay = m.get("proxy_delay_us") or {}
        per_event = cpu_per_event_us(s) or 0.0
        nginx_cost = cpu_per_event_us(s, "nginx")
        nginx = (f"{nginx_cost:.1f}, {s['nginx']['itl_us']['p99'] - d['itl_us']['p99']:+.0f} µs"
                 if nginx_cost else "-")
        lines.append(
            f"| {s['events_per_s']:,.0f} | {s['streams']:,} | {fmt_us(delay.get('p50'))} / "
            f"{fmt_us(delay.get('p99'))} | {d['itl_us']['p99'] / 1000:.2f} ms, "
            f"{s['p99_inflation_us']:+.0f} µs | {m['core_busy'] * 100:.0f}% | "
            f"{per_event:.1f} | {nginx} | {d['errors']} / {m['errors']} | {s['load_before']} |")
    return "\n".join(lines)


def saturation_figure(steps):
    """The highest offered rate meeting the criterion, and what one core would forward at the
    CPU cost per event measured at the highest step the generators could hold."""
    passing = [s for s in steps if passes(s) and s["generator_ok"]]
    held = [s for s in steps if s["generator_ok"] and cpu_per_event_us(s)] or steps
    top = max(held, key=lambda s: s["events_per_s"])
    cost = cpu_per_event_us(top)
    nginx_cost = cpu_per_event_us(top, "nginx")
    return {
        "passing": max((s["events_per_s"] for s in passing), default=None),
        "top": top["events_per_s"],
        "cost_us": cost,
        "per_core": 1e6 / cost if cost else None,
        "nginx_cost_us": nginx_cost,
        "nginx_per_core": 1e6 / nginx_cost if nginx_cost else None,
        "generators_gave_out": not steps[-1]["generator_ok"],
    }


def version(command):
    """The first line a tool prints of its version (stdout or stderr), or "" if it is not installed."""
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError:
        return ""
    return (done.stdout or done.stderr).strip().split("\n")[0]


def machine():
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    rustc = version(["rustc", "--version"])
    # The smoke installs neither nginx nor HAProxy; a tool that is absent is named as absent.
    nginx = version(["nginx", "-v"]) or "nginx not installed"
    haproxy = version(["haproxy", "-v"]) or "HAProxy not installed"
    return (f"{os.cpu_count()} vCPU ({cpu}), {mem:.0f} GiB, Linux {platform.release()}, {rustc}, "
            f"{nginx.replace('nginx version: ', '')}, {haproxy.split(' - ')[0]}")


# --- main --------------------------------------------------------------------------------------


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="100,1000,10000", help="concurrent streams per level")
    ap.add_argument("--paths", default=",".join(PATHS),
                    help="subset of " + ",".join(PATHS + VARIANTS))
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats per level (medians)")
    ap.add_argument("--large-repeats", type=int, default=1,
                    help="repeats for levels of 5,000 streams and more (each takes minutes)")
    ap.add_argument("--duration", type=float, default=25, help="seconds the probe starts streams")
    ap.add_argument("--tokens", type=int, default=200, help="token events per stream")
    ap.add_argument("--gap", default="50ms", help="the sim's steady gap (50ms = 20 events/s)")
    ap.add_argument("--ttft", default="100ms", help="the sim's time to first token")
    ap.add_argument("--smoke", action="store_true",
                    help="50 streams for 10 s, direct and metronome only; fails on any error")
    ap.add_argument("--hold-threading", default="per_core", choices=["per_core", "shared"],
                    help="metronome's server.threading in the hold run")
    ap.add_argument("--wake-sleeps", type=int, default=1000,
                    help="sleeps of 1 ms per CPU measuring the machine's wake-up lateness before "
                         "each run (scripts/hiccups.py; 0 skips it)")
    ap.add_argument("--pin", action="store_true",
                    help="levels: every proxy on CPU 0 alone, sim and probe on CPU 1 (so the "
                         "client-side inflation is the proxy's, not the generators' contention)")
    ap.add_argument("--no-saturation", action="store_true", help="skip the one-core saturation run")
    ap.add_argument("--saturation-only", action="store_true",
                    help="only the saturation run (and the hold run unless --hold 0)")
    ap.add_argument("--sat-rates", default="20000,40000,60000,80000,100000,150000,200000,250000",
                    help="events per second offered in the saturation run")
    ap.add_argument("--sat-gap", default="10ms", help="the gap between a saturation stream's frames")
    ap.add_argument("--sat-tokens", type=int, default=500,
                    help="frames per saturation stream (each of --sat-coalesce token events)")
    ap.add_argument("--sat-duration", type=float, default=12, help="seconds per saturation step")
    ap.add_argument("--no-sat-nginx", dest="sat_nginx", action="store_false",
                    help="leave nginx out of the saturation run")
    ap.add_argument("--sat-coalesce", type=int, default=1,
                    help="token events per frame in the saturation run (the sim's --coalesce)")
    ap.add_argument("--hold", type=int, default=10000,
                    help="streams to hold open at once over HTTP/2 (0 skips the hold run)")
    ap.add_argument("--hold-gap", default="500ms", help="the gap of the held streams")
    ap.add_argument("--hold-tokens", type=int, default=60, help="token events per held stream")
    ap.add_argument("--hold-duration", type=float, default=45,
                    help="seconds the probe starts streams in the hold run")
    ap.add_argument("--base-port", type=int, default=None,
                    help="first of ten loopback ports to use (default: the first free range from 27400)")
    ap.add_argument("--work", default=None, help="directory for configs, logs and raw results")
    ap.add_argument("--write", action="store_true",
                    help="write the table into BENCHMARKS.md (default for a full run)")
    ap.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    ap.add_argument("--baseline", default=None, metavar="BIN",
                    help=f"also run another metronome binary (path {BASELINE}), e.g. a build of "
                         "the commit before a change, side by side with this one")
    ap.add_argument("--metronome-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment for the metronome proxies (e.g. RUST_LOG=debug)")
    ap.add_argument("--combine", action="append", default=[], metavar="DIR",
                    help="add the results of an earlier run's work directory (levels not run now, "
                         "and its hold and saturation runs if not run now) to the report")
    ap.add_argument("--only", default=None, metavar="LEGS",
                    help="run these legs alone: any of " + ",".join(LEGS) + " (default: all of "
                         "them, or without c1 and sweep when an option shapes the others)")
    ap.add_argument("--c1-streams", type=int, default=500,
                    help="c1 leg: streams per path, counted after the warm-up")
    ap.add_argument("--c1-warmup", type=int, default=10,
                    help="c1 leg: rounds (one stream per path) run first and not counted")
    ap.add_argument("--sweep-levels", default=",".join(str(2 ** k) for k in range(11)),
                    help="sweep leg: streams at once, one run per level and path")
    ap.add_argument("--sweep-duration", type=float, default=10,
                    help="sweep leg: seconds each connection runs streams back to back")
    ap.add_argument("--stream-events", type=int, default=64,
                    help="c1 and sweep legs: content frames per stream")
    ap.add_argument("--stream-gap", default="20ms", help="c1 and sweep legs: the mock's gap")
    ap.add_argument("--stall-threshold", default="200ms",
                    help="sweep leg: a gap over this is a stall (the board's 10x the gap)")
    ap.add_argument("--board-paths", default=None,
                    help="paths of the c1 and sweep legs (default direct,metronome,nginx, plus "
                         f"{BASELINE} with --baseline; also passthrough, haproxy)")
    ap.add_argument("--metronome-toml", action="append", default=[], metavar="TOML",
                    help="c1 and sweep legs: TOML added to the configuration of the metronome "
                         "paths (e.g. $'[batch]\\nenabled = false'), to measure what one "
                         "feature costs; repeatable")
    ap.add_argument("--command", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.legs = legs_to_run(args, argv)
    if args.smoke:
        args.levels, args.paths, args.repeats = "50", "direct,metronome", 1
        args.duration, args.tokens = 10, 40
        args.no_saturation, args.no_write, args.hold = True, True, 0
        args.wake_sleeps = min(args.wake_sleeps, 200)
        # A tiny c1 and sweep: the harness works and every stream completes on a kept connection.
        args.legs = ["levels", "c1", "sweep"]
        args.c1_streams, args.c1_warmup, args.stream_events = 10, 2, 16
        args.sweep_levels, args.sweep_duration = "1,8", 1
        args.board_paths = "direct,metronome"
    args.metronome_env = dict(kv.split("=", 1) for kv in args.metronome_env)
    args.metronome_toml = board_toml(args.metronome_toml, ap.error)
    args.levels = [int(x) for x in args.levels.split(",") if x]
    args.paths = [p for p in args.paths.split(",") if p]
    for p in args.paths:
        if p not in PATHS + VARIANTS:
            ap.error(f"unknown path {p}")
    if args.baseline:
        if not Path(args.baseline).exists():
            ap.error(f"--baseline {args.baseline} does not exist")
        args.paths.insert(args.paths.index("metronome") + 1 if "metronome" in args.paths
                          else len(args.paths), BASELINE)
    args.sweep_levels = [int(x) for x in str(args.sweep_levels).split(",") if x]
    board = args.board_paths or ",".join(BOARD_PATHS + ([BASELINE] if args.baseline else []))
    args.board_paths = [p for p in board.split(",") if p]
    for p in args.board_paths:
        if p not in BOARD_PATHS + BOARD_EXTRA:
            ap.error(f"unknown --board-paths path {p}")
    if args.baseline is None and BASELINE in args.board_paths:
        ap.error(f"--board-paths {BASELINE} needs --baseline BIN")
    args.stream_gap_s = parse_duration(args.stream_gap)
    args.stall_threshold_s = parse_duration(args.stall_threshold)
    args.sat_rates = [int(x) for x in args.sat_rates.split(",") if x]
    args.gap_s = parse_duration(args.gap)
    args.ttft_s = parse_duration(args.ttft)
    args.sat_gap_s = parse_duration(args.sat_gap)
    if args.work is None:
        args.work = tempfile.mkdtemp(prefix="metronome-bench-")
    return args


def legs_to_run(args, argv):
    """The legs of this run: --only's, else every leg, but only the first three when an option
    shapes them (a run measuring one level should not also take the c1 leg's half hour)."""
    if args.only:
        legs = [leg for leg in args.only.split(",") if leg]
        unknown = [leg for leg in legs if leg not in LEGS]
        if unknown:
            raise SystemExit(f"--only: unknown leg {', '.join(unknown)} (legs: {', '.join(LEGS)})")
        return legs
    targeted = any(a.split("=")[0] in CLASSIC_SHAPERS for a in argv)
    legs = ["levels", "hold", "saturation"] + ([] if targeted else ["c1", "sweep"])
    if args.saturation_only:
        legs = [leg for leg in legs if leg in ("hold", "saturation")]
    if args.no_saturation:
        legs = [leg for leg in legs if leg != "saturation"]
    if not args.hold:
        legs = [leg for leg in legs if leg != "hold"]
    return legs


def parse_duration(text):
    m = re.fullmatch(r"([0-9.]+)(ms|s)", text)
    if not m:
        raise SystemExit(f"bad duration {text}")
    return float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)


def write_benchmarks(section, begin=MARK_BEGIN, end=MARK_END):
    """Replaces the block between the `begin` and `end` markers in BENCHMARKS.md with `section`
    (appended, markers and all, where the markers are not there yet)."""
    path = ROOT / "BENCHMARKS.md"
    text = path.read_text()
    block = f"{begin}\n{section.rstrip()}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def main(argv):
    args = parse_args(argv)
    if not BIN.exists():
        raise SystemExit(f"{BIN} is missing: run cargo build --release (scripts/bench.sh does)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.base_port is None:
        # The first range of ten free loopback ports from 27400 (another run may hold one).
        for base in range(27400, 40000, 100):
            if all(port_free(p) for p in Ports(base).all()):
                args.base_port = base
                break
        else:
            raise SystemExit("no free range of loopback ports between 27400 and 40000")
    bench = Bench(args)
    for port in bench.ports.all():
        if not port_free(port):
            raise SystemExit(f"127.0.0.1:{port} is in use; pick another --base-port")

    def on_signal(signum, _frame):
        bench.procs.stop_all()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    started = time.strftime("%Y-%m-%d %H:%M")
    load_start = loadavg()
    log(f"work directory {bench.work}; open-file limit {bench.nofile}; load {load_start}")
    rows, steps, held = [], [], None
    results = []
    stream_text, stream_problems = None, []
    try:
        if "levels" in args.legs:
            bench.sim = bench.start_sim(bench.ports.sim, args.gap,
                                        cpus=GENERATOR_CPU if args.pin else None)
            results = bench.run_levels()
            bench.procs.stop(bench.sim)
            (bench.work / "results.json").write_text(json.dumps(results, indent=1))
        if "hold" in args.legs:
            held = bench.hold()
        if "saturation" in args.legs:
            steps = bench.saturation()
            (bench.work / "saturation.json").write_text(json.dumps(steps, indent=1))
        if "c1" in args.legs or "sweep" in args.legs:
            import bench_stream  # imports this file as `bench`: only when these legs run
            stream_text, stream_problems = bench_stream.run(bench, args.legs)
    finally:
        bench.procs.stop_all()
    load_end = loadavg()
    for earlier in args.combine:
        earlier = Path(earlier)
        done = {r["level"] for r in results}
        for f in sorted(earlier.glob("L*-r*-*.result.json")):
            r = json.loads(f.read_text())
            if r["level"] not in done:
                results.append(r)
        if held is None and (earlier / "hold.json").exists():
            held = json.loads((earlier / "hold.json").read_text())
        if not steps and (earlier / "saturation.json").exists():
            steps = json.loads((earlier / "saturation.json").read_text())
    if results:
        paths = [p for p in PATHS[:2] + [BASELINE] + VARIANTS + PATHS[2:]
                 if any(r["path"] == p for r in results)]
        rows = summarize(results, paths)

    out = []
    command = args.command or shell_command(["scripts/bench.sh", *argv])
    out.append(f"Run {started}, `{command}`; load average {load_start} at the start, {load_end} at the end.")
    out.append(f"Machine: {machine()}. Open-file limit {bench.nofile}.")
    if args.pin and rows:
        out.append("Pinned (`--pin`): every proxy alone on CPU 0 with one worker (process or "
                   "thread), the sim and the probe on CPU 1.")
    if rows:
        out.append("")
        out.append(table(rows))
        out.append("")
        out.append("Generators, load and the machine's wake-up lateness (the sim and the probe share the "
                   "same two cores; the lateness is `scripts/hiccups.py` with "
                   f"{args.wake_sleeps:,} sleeps of 1 ms per CPU just before each run: how noisy the "
                   "machine was at that moment; the probe's sleeps are its voluntary context switches, "
                   "each of which the next write to it must end, and the IPIs are the machine's "
                   "rescheduling and function-call interrupts during the run, which is how a writer "
                   "wakes a reader on the other CPU; the proxy's system time pays for those it sends):")
        out.append("")
        out.append(generators_table(rows))
    if held:
        out.append("")
        out.append(hold_report(held, args))
    if steps:
        out.append("")
        out.append("Saturation: metronome on CPU 0 (so one worker), then nginx with one worker process "
                   "on CPU 0, sim and probe on CPU 1, "
                   f"each stream's frames {args.sat_gap} apart, {args.sat_coalesce} token event(s) per "
                   "frame; the criterion is the client's p99 ITL inflation over direct under 1 ms "
                   "without errors (metronome's own proxy delay is shown beside it):")
        out.append("")
        out.append(saturation_table(steps))
        fig = saturation_figure(steps)
        out.append("")
        if fig["passing"]:
            out.append(f"Highest offered rate with client p99 inflation under 1 ms: "
                       f"**{fig['passing']:,.0f} events/s**.")
        else:
            out.append("No step kept the client's p99 inflation under 1 ms (on this shared machine "
                       "the other engineers' load runs on both cores, metronome's included).")
        if fig["per_core"]:
            out.append(f"CPU cost at {fig['top']:,.0f} events/s offered: {fig['cost_us']:.1f} µs per "
                       f"event, so one full core forwards about **{fig['per_core']:,.0f} events/s**"
                       + ("; the generators on one core could go no faster."
                          if fig["generators_gave_out"] else "."))
        if fig.get("nginx_per_core"):
            out.append(f"nginx on the same core at the same step: {fig['nginx_cost_us']:.1f} µs per "
                       f"event, about **{fig['nginx_per_core']:,.0f} events/s** per full core.")
    report = "\n".join(out)
    classic = bool(rows or held or steps)
    if classic or not stream_text:
        print(report)
        (bench.work / "report.md").write_text(report + "\n")
    if classic and (args.write or not args.no_write) and not args.smoke:
        write_benchmarks(report)
        log("BENCHMARKS.md updated")
    if stream_text:
        stream_report = "\n".join(out[:2]) + "\n\n" + stream_text
        print(("\n" if classic else "") + stream_report)
        (bench.work / "stream-report.md").write_text(stream_report + "\n")
        # A shortened run prints its figures but leaves BENCHMARKS.md's full-run block alone.
        if not args.smoke and not args.no_write and (args.write or bench_stream.full_run(args)):
            bench_stream.write_benchmarks(stream_report)
            log("BENCHMARKS.md updated (c1 and sweep block)")
    failures = [r for r in rows if r["errors"]]
    for problem in stream_problems:
        log(problem)
    if args.smoke:
        for r in rows:
            log(f"smoke {r['path']}: {r['requests']} streams, {r['token_events']} token events, "
                f"{r['errors']} errors, wake-up lateness p99 {'; '.join(wake_p99s(w) for w in r['wakes'])} µs")
        unmeasured = args.wake_sleeps and any(not w for r in rows for w in r["wakes"])
        # The client's sleeps and the machine's wake-up IPIs must have been counted.
        unmeasured = unmeasured or any(r.get("probe_sleeps_per_event") is None
                                       or not r.get("ipis_per_event") for r in rows)
        # A proxy's CPU must split into user and system time that add up to it.
        unmeasured = unmeasured or any(
            r["path"] != "direct" and not (0 < r.get("cpu_user_per_m", 0) <= r.get("cpu_per_m", 0))
            for r in rows)
        if (failures or not rows or any(r["token_events"] == 0 for r in rows) or unmeasured
                or stream_problems or not stream_text):
            log("smoke FAILED")
            return 1
        log("smoke passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
