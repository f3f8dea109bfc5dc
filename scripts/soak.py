#!/usr/bin/env python3
"""The soak's moving parts (scripts/soak.sh runs them): an upstream that resets its streams, and
the driver that loads metronome with churn while sampling its memory and file descriptors.

  soak.py reset-upstream --listen 127.0.0.1:PORT
      An OpenAI-shaped SSE server that aborts every stream with a TCP RST after 3 to 20 token
      events: the injected upstream fault.

  soak.py drive --proxy HOST:PORT --admin HOST:PORT --pid PID --seconds N [--concurrency C]
      Runs N seconds of load through the proxy: whole streams, clients that cancel mid-stream,
      clients that read slowly through a small receive buffer, and streams on the resetting
      route. Samples the proxy's resident set (/proc/PID/statm) and open descriptors
      (/proc/PID/fd) every few seconds, then checks that nothing leaked and that every error is
      an injected one. Prints a table; exits 1 when a check fails.

Standard library only; everything talks to 127.0.0.1.
"""

import argparse
import asyncio
import json
import os
import random
import socket
import struct
import sys
import time
import urllib.request

# === the resetting upstream ===


def sse_chunk(i):
    body = json.dumps(
        {
            "id": "chatcmpl-reset",
            "object": "chat.completion.chunk",
            "model": "reset-model",
            "choices": [{"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}],
        },
        separators=(",", ":"),
    )
    data = f"data: {body}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(data), data)


async def read_request(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.decode("latin-1").split("\r\n"):
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if length:
        await reader.readexactly(length)


async def reset_connection(reader, writer):
    try:
        while True:
            await read_request(reader)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            for i in range(random.randint(3, 20)):
                writer.write(sse_chunk(i))
                await writer.drain()
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.02)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.transport.abort()


async def reset_upstream(listen):
    host, port = listen.rsplit(":", 1)
    server = await asyncio.start_server(reset_connection, host, int(port), backlog=1024)
    bound = server.sockets[0].getsockname()
    print(f"reset upstream listening on {bound[0]}:{bound[1]}", flush=True)
    async with server:
        await server.serve_forever()


# === the load ===

REQUEST = json.dumps(
    {"model": "sim-model", "stream": True, "max_tokens": 40,
     "messages": [{"role": "user", "content": "soak"}]}
).encode()

# What each client does, and how often.
ACTIONS = [("complete", 55), ("cancel", 20), ("slow", 15), ("reset", 10)]


class Tally:
    def __init__(self):
        self.started = {a: 0 for a, _ in ACTIONS}
        self.results = {}
        self.statuses = {}

    def result(self, action, outcome):
        key = f"{action}:{outcome}"
        self.results[key] = self.results.get(key, 0) + 1


async def one_request(proxy, action, tally):
    host, port = proxy.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    if action == "slow":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, (host, int(port)))
    except OSError:
        sock.close()
        tally.result(action, "connect_failed")
        return
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
    path = "/reset/v1/chat/completions" if action == "reset" else "/v1/chat/completions"
    writer.write(
        f"POST {path} HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\n"
        f"content-length: {len(REQUEST)}\r\nconnection: close\r\n\r\n".encode() + REQUEST
    )
    tally.started[action] += 1
    outcome = "?"
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        tally.statuses[status] = tally.statuses.get(status, 0) + 1
        if status != 200:
            outcome = f"status_{status}"
            return
        if action == "cancel":
            # Read a few events, then go away: politely (FIN) or abruptly (RST).
            want = random.randint(2, 20)
            seen = 0
            while seen < want:
                chunk = await reader.read(4096)
                if not chunk:
                    break
                seen += chunk.count(b"data:")
            if random.random() < 0.5:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            outcome = "cancelled"
            return
        body = bytearray()
        while True:
            chunk = await reader.read(256 if action == "slow" else 65536)
            if not chunk:
                break
            body += chunk
            if action == "slow":
                # About 5 KB/s: slower than the sim writes, so frames wait in the proxy.
                await asyncio.sleep(0.05)
        if body.endswith(b"0\r\n\r\n") and b"data: [DONE]" in body:
            outcome = "whole"
        else:
            outcome = "cut"
    except (asyncio.IncompleteReadError, ConnectionError, ValueError, IndexError):
        outcome = "error"
    finally:
        tally.result(action, outcome)
        if outcome == "cancelled":
            writer.transport.abort()
        else:
            writer.close()


async def worker(proxy, deadline, tally, rng):
    choices, weights = zip(*ACTIONS)
    while time.monotonic() < deadline:
        action = rng.choices(choices, weights)[0]
        await one_request(proxy, action, tally)


# === sampling ===


def rss_bytes(pid):
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def scrape(admin):
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=5) as r:
        text = r.read().decode()
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.partition("{")
        pairs = {}
        for part in labels.rstrip("}").split('",'):
            if "=" in part:
                k, v = part.split("=", 1)
                pairs[k.strip(",")] = v.strip('"')
        samples.append((name, pairs, float(value)))
    return samples


def total(samples, name, **labels):
    return sum(v for n, l, v in samples if n == name and all(l.get(k) == w for k, w in labels.items()))


async def sampler(pid, admin, start, deadline, every, rows):
    while True:
        now = time.monotonic()
        try:
            m = await asyncio.to_thread(scrape, admin)
            active = total(m, "metronome_streams_active")
            streams = total(m, "metronome_streams_total")
        except OSError:
            active = streams = float("nan")
        rows.append((now - start, rss_bytes(pid), fd_count(pid), active, streams))
        t, rss, fds, act, st = rows[-1]
        print(f"{t:8.0f}s  rss {rss / 2**20:7.1f} MB  fds {fds:5d}  active {act:4.0f}  streams {st:9.0f}",
              flush=True)
        if now >= deadline:
            return
        await asyncio.sleep(every)


# Stream IDs the proxy keeps for beacons (timeline.rs: max(timeline.max_streams, 4096)).
BEACON_WINDOW = 4096


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


async def drive(args):
    rng = random.Random(args.seed)
    random.seed(args.seed)
    tally = Tally()
    start = time.monotonic()
    deadline = start + args.seconds
    rows = []
    idle_before = (rss_bytes(args.pid), fd_count(args.pid))
    sampling = asyncio.create_task(sampler(args.pid, args.admin, start, deadline, args.every, rows))
    workers = [asyncio.create_task(worker(args.proxy, deadline, tally, random.Random(rng.random())))
               for _ in range(args.concurrency)]
    await asyncio.gather(*workers)
    await sampling

    # Let the last streams be recorded, then read the final figures.
    settle = time.monotonic() + 15
    while True:
        m = scrape(args.admin)
        if total(m, "metronome_streams_active") == 0 or time.monotonic() > settle:
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(1)
    m = scrape(args.admin)
    idle_after = (rss_bytes(args.pid), fd_count(args.pid))
    # Idle upstream connections are closed after the pool's idle timeout (90 s, checked every
    # 90 s): then the descriptors must be back to where they were before any request.
    idle_since = time.monotonic()
    idle_wait = None
    if args.idle_wait > 0:
        print(f"waiting up to {args.idle_wait:.0f} s for idle connections to close...", flush=True)
        while time.monotonic() - idle_since < args.idle_wait:
            if fd_count(args.pid) <= idle_before[1]:
                idle_wait = time.monotonic() - idle_since
                break
            await asyncio.sleep(1)
    idle_final = (rss_bytes(args.pid), fd_count(args.pid))
    return check(args, tally, rows, m, idle_before, idle_after, idle_final, idle_wait)


def check(args, tally, rows, m, idle_before, idle_after, idle_final, idle_wait):
    failures = []

    def expect(ok, what):
        print(f"  {'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            failures.append(what)

    # The first steady-state minute against the last minute. Steady state: a minute in, and
    # every bounded registry full, i.e. at least BEACON_WINDOW streams recorded (the beacon
    # slots keep the last 4096 stream IDs; the /streams ring 256 streams). Until then memory
    # climbs by design. Short runs fall back to a fifth of the run.
    full = next((r[0] for r in rows if r[4] >= BEACON_WINDOW), None)
    warmup = max(min(60.0, args.seconds / 5), full if full is not None else 0.0)
    if warmup > args.seconds / 2:
        warmup = args.seconds / 5
    window = min(60.0, (args.seconds - warmup) / 3)
    first = [r for r in rows if warmup <= r[0] < warmup + window]
    last = [r for r in rows if args.seconds - window <= r[0] <= args.seconds + args.every]
    rss_first, rss_last = mean([r[1] for r in first]), mean([r[1] for r in last])
    fd_first, fd_last = mean([r[2] for r in first]), mean([r[2] for r in last])

    started = sum(tally.started.values())
    print()
    print(f"soak: {args.seconds:.0f} s, {args.concurrency} concurrent clients, {started} requests "
          f"({', '.join(f'{a} {n}' for a, n in tally.started.items())})")
    print(f"client results: {json.dumps(dict(sorted(tally.results.items())))}")
    print(f"statuses: {json.dumps(tally.statuses)}")
    print()
    print(f"{'':24}{'first minute':>14}{'last minute':>14}{'change':>9}")
    print(f"{'resident set (MB)':24}{rss_first / 2**20:14.1f}{rss_last / 2**20:14.1f}"
          f"{(rss_last - rss_first) / rss_first:+9.1%}")
    print(f"{'open descriptors':24}{fd_first:14.1f}{fd_last:14.1f}{(fd_last - fd_first) / fd_first:+9.1%}")
    print(f"{'':24}{'before load':>14}{'just after':>14}{'idle':>9}")
    print(f"{'open descriptors':24}{idle_before[1]:14d}{idle_after[1]:14d}{idle_final[1]:9d}")
    print(f"{'resident set (MB)':24}{idle_before[0] / 2**20:14.1f}{idle_after[0] / 2**20:14.1f}"
          f"{idle_final[0] / 2**20:9.1f}")
    print(f"  windows: first {warmup:.0f}-{warmup + window:.0f} s ({len(first)} samples), "
          f"last {args.seconds - window:.0f}-{args.seconds:.0f} s ({len(last)} samples)")

    streams = {}
    for n, l, v in m:
        if n == "metronome_streams_total":
            key = (l["route"], l["outcome"])
            streams[key] = streams.get(key, 0) + v
    errors = {(l["route"], l["kind"]): v for n, l, v in m if n == "metronome_upstream_errors_total"}
    requests = {(l["route"], l["status_class"]): v for n, l, v in m if n == "metronome_requests_total"}
    print(f"streams_total: {json.dumps({f'{r}/{o}': v for (r, o), v in sorted(streams.items())})}")
    print(f"upstream_errors_total: {json.dumps({f'{r}/{k}': v for (r, k), v in sorted(errors.items())})}")
    print(f"requests_total: {json.dumps({f'{r}/{c}': v for (r, c), v in sorted(requests.items())})}")
    print()

    r = tally.results
    expect(abs(rss_last - rss_first) <= 0.10 * rss_first, "resident set flat within 10%")
    expect(abs(fd_last - fd_first) <= 0.10 * fd_first, "open descriptors flat within 10%")
    expect(total(m, "metronome_streams_active") == 0, "streams_active back to 0")
    if args.idle_wait > 0:
        expect(idle_wait is not None,
               f"descriptors back to {idle_before[1]} once idle connections expire "
               f"({'after %.0f s' % idle_wait if idle_wait is not None else 'not within %.0f s' % args.idle_wait})")
    expect(set(errors) <= {("reset", "reset")}, "upstream errors only of the injected kind (route reset, kind reset)")
    expect(errors.get(("reset", "reset"), 0) == tally.started["reset"],
           f"one reset counted per injected reset ({tally.started['reset']})")
    expect(set(tally.statuses) == {200}, "every response was a 200 (no 502/504 from the proxy)")
    expect(sum(v for (rt, c), v in requests.items() if c != "2xx") == 0, "requests_total has no 4xx/5xx")
    expect(sum(requests.values()) == started, f"requests_total adds up to the {started} requests sent")
    expect(sum(streams.values()) == started, "streams_total adds up to the requests sent (each recorded once)")
    chat_ok = r.get("complete:whole", 0) + r.get("slow:whole", 0)
    expect(streams.get(("chat", "complete"), 0) == chat_ok,
           f"chat complete = whole and slow clients that read it all ({chat_ok})")
    expect(streams.get(("chat", "client_cancelled"), 0) == r.get("cancel:cancelled", 0),
           f"chat client_cancelled = clients that cancelled ({r.get('cancel:cancelled', 0)})")
    expect(streams.get(("reset", "upstream_error"), 0) == tally.started["reset"],
           "reset upstream_error = streams on the resetting route")
    expect(r.get("reset:cut", 0) == tally.started["reset"],
           "every reset reached its client as a cut response, never as a complete one")
    unexpected = {k: v for k, v in r.items()
                  if k not in ("complete:whole", "slow:whole", "cancel:cancelled", "reset:cut")}
    expect(not unexpected, f"no other client result ({json.dumps(unexpected)})")
    if args.rows:
        with open(args.rows, "w") as f:
            f.write("seconds,rss_bytes,fds,streams_active,streams_total\n")
            for row in rows:
                f.write(",".join(str(x) for x in row) + "\n")
    print()
    print("SOAK PASSED" if not failures else f"SOAK FAILED: {len(failures)} check(s)")
    return 0 if not failures else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("reset-upstream")
    up.add_argument("--listen", required=True)
    d = sub.add_parser("drive")
    d.add_argument("--proxy", required=True)
    d.add_argument("--admin", required=True)
    d.add_argument("--pid", type=int, required=True)
    d.add_argument("--seconds", type=float, required=True)
    d.add_argument("--concurrency", type=int, default=32)
    d.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--rows", help="write the samples as CSV here")
    d.add_argument("--idle-wait", type=float, default=200.0,
                   help="after the load, wait this long for descriptors to return to their idle count (0: skip)")
    args = parser.parse_args()
    if args.command == "reset-upstream":
        asyncio.run(reset_upstream(args.listen))
    else:
        sys.exit(asyncio.run(drive(args)))


if __name__ == "__main__":
    main()
