#!/usr/bin/env python3
"""The soak's moving parts (scripts/soak.sh runs them): an upstream that resets its streams, and
the driver that loads metronome with churn while sampling its memory and file descriptors.

  soak.py reset-upstream --listen 127.0.0.1:PORT
      An OpenAI-shaped SSE server that aborts every stream with a TCP RST after 3 to 20 token
      events: the injected upstream fault.

  soak.py drive --proxy HOST:PORT --admin HOST:PORT --pid PID --seconds N [--concurrency C]
      Runs N seconds of load through the proxy: whole streams, clients that cancel mid-stream,
      clients that read slowly through a small receive buffer, and streams on the resetting
      route; beacons for a share of the whole streams (with the stream's beacon key when the
      proxy gives one); with --websocket, Responses-over-WebSocket clients through the proxy's
      tunnel (skipped when the proxy answers the upgrade with anything but 101); a scrape of
      /metrics every --scrape-every seconds (text, OpenMetrics and protobuf in turn) and a SIGHUP
      reload every --reload-every seconds (the file alternately with and without a spare route).
      Before the clock starts, --prime short streams fill the proxy's bounded registries.
      Samples the proxy's resident set (/proc/PID/statm) and open descriptors (/proc/PID/fd)
      every few seconds, then checks that nothing leaked and that every error is an injected
      one. Prints a table; exits 1 when a check fails.

Standard library only; everything talks to 127.0.0.1.
"""

import argparse
import asyncio
import base64
import json
import os
import random
import signal
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

# The proxy's beacon path (config: timeline.beacon_path), and the response fields it reads.
BEACON_PATH = "/.well-known/metronome/beacon"
STREAM_ID_HEADER = b"x-metronome-stream-id"
BEACON_KEY_HEADER = b"x-metronome-beacon-key"


class Tally:
    def __init__(self):
        self.started = {a: 0 for a, _ in ACTIONS}
        self.results = {}
        self.statuses = {}
        self.primed = 0
        self.beacons = {}
        self.keyed = 0
        self.ws = {"sockets": 0, "responses": 0, "completed": 0, "cut": 0, "refused": None,
                   "errors": 0}
        self.scrapes = {"ok": 0, "failed": 0}
        self.reloads = 0

    def result(self, action, outcome):
        key = f"{action}:{outcome}"
        self.results[key] = self.results.get(key, 0) + 1

    def beacon(self, status):
        self.beacons[status] = self.beacons.get(status, 0) + 1


def head_field(head, name):
    """The value of a response head's field `name` (lowercase bytes), or None."""
    for line in head.split(b"\r\n")[1:]:
        field, _, value = line.partition(b":")
        if field.strip().lower() == name:
            return value.strip().decode("latin-1")
    return None


async def http_exchange(addr, raw):
    """Sends one request on a new connection and reads the answer to its close: (status, body)."""
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(raw)
        answer = await reader.read(-1)
    finally:
        writer.close()
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
    return status, answer.partition(b"\r\n\r\n")[2]


async def send_beacon(proxy, stream_id, key, ttft_ms, gaps_ms, tally):
    """What a page's beacon module sends for a stream it read whole: the stream's ID, its key
    when the proxy gave one (in the body, as sendBeacon cannot set fields, and in the field),
    TTFT and the gaps between token events as the client saw them. A beacon sent before the
    proxy has recorded the stream is answered 409; it is sent again a little later."""
    summary = {"v": 1, "id": stream_id, "ttft_ms": ttft_ms, "gaps_ms": gaps_ms}
    extra = ""
    if key is not None:
        summary["key"] = key
        extra = f"x-metronome-beacon-key: {key}\r\n"
        tally.keyed += 1
    body = json.dumps(summary, separators=(",", ":")).encode()
    raw = (f"POST {BEACON_PATH} HTTP/1.1\r\nhost: soak\r\ncontent-type: text/plain\r\n{extra}"
           f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body
    for attempt in range(5):
        try:
            status, _ = await http_exchange(proxy, raw)
        except OSError:
            status = 0
        if status != 409:
            break
        await asyncio.sleep(0.1 * (attempt + 1))
    tally.beacon(status)


def token_events(chunk):
    """Token events in a piece of a chat stream: content deltas that carry text."""
    return chunk.count(b'"content":"') - chunk.count(b'"content":""')


async def one_request(proxy, action, tally, beacon_share, rng, max_tokens=40):
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
    request = REQUEST if max_tokens == 40 else REQUEST.replace(b'"max_tokens": 40', b'"max_tokens": %d' % max_tokens)
    sent = time.monotonic()
    writer.write(
        f"POST {path} HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\n"
        f"content-length: {len(request)}\r\nconnection: close\r\n\r\n".encode() + request
    )
    if action != "prime":
        tally.started[action] += 1
    outcome = "?"
    beacon = None
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
        ttft_ms, gaps_ms, last = None, [], None
        while True:
            chunk = await reader.read(256 if action == "slow" else 65536)
            if not chunk:
                break
            body += chunk
            events = token_events(chunk)
            if events:
                now = time.monotonic()
                if last is None:
                    ttft_ms = (now - sent) * 1000
                    events -= 1
                else:
                    gaps_ms.append((now - last) * 1000)
                    events -= 1
                gaps_ms.extend([0.0] * events)
                last = now
            if action == "slow":
                # About 5 KB/s: slower than the sim writes, so frames wait in the proxy.
                await asyncio.sleep(0.05)
        if body.endswith(b"0\r\n\r\n") and b"data: [DONE]" in body:
            outcome = "whole"
            stream_id = head_field(head, STREAM_ID_HEADER)
            if action == "complete" and stream_id and rng.random() < beacon_share:
                beacon = (stream_id, head_field(head, BEACON_KEY_HEADER), ttft_ms, gaps_ms)
        else:
            outcome = "cut"
    except (asyncio.IncompleteReadError, ConnectionError, ValueError, IndexError):
        outcome = "error"
    finally:
        if action == "prime":
            tally.primed += outcome == "whole"
            if outcome != "whole":
                tally.result(action, outcome)
        else:
            tally.result(action, outcome)
        if outcome == "cancelled":
            writer.transport.abort()
        else:
            writer.close()
    if beacon is not None:
        await send_beacon(proxy, *beacon, tally)


async def worker(proxy, deadline, tally, rng, beacon_share):
    choices, weights = zip(*ACTIONS)
    while time.monotonic() < deadline:
        action = rng.choices(choices, weights)[0]
        await one_request(proxy, action, tally, beacon_share, rng)


async def prime(proxy, admin, count, tally):
    """Short streams (2 tokens), 64 at a time, until `count` are recorded: the proxy's bounded
    registries (the beacon window, the /streams ring) are full before the clock starts, so the
    resident set is in its steady state from the first sample on, even in a short run."""
    if count <= 0:
        return
    left = count

    async def one():
        nonlocal left
        while left > 0:
            left -= 1
            await one_request(proxy, "prime", tally, 0.0, None, max_tokens=2)

    began = time.monotonic()
    await asyncio.gather(*(one() for _ in range(64)))
    while total(await asyncio.to_thread(scrape, admin), "metronome_streams_total") < count:
        await asyncio.sleep(0.2)
    print(f"primed: {tally.primed} short streams in {time.monotonic() - began:.0f} s", flush=True)


# === Responses over WebSocket, through the proxy's tunnel ===

WS_PATH = "/v1/responses"
WS_CREATE = json.dumps({"type": "response.create", "model": "sim-model", "input": "soak",
                        "max_output_tokens": 40}).encode()
WS_ENDS = (b'"response.completed"', b'"response.incomplete"', b'"response.failed"')


class WsRefused(Exception):
    """The proxy answered the upgrade with this status, not 101."""

    def __init__(self, status):
        super().__init__(f"answered {status}")
        self.status = status


def ws_frame(opcode, payload):
    """A client frame: final, masked (RFC 6455 §5.3), one frame per message."""
    mask = os.urandom(4)
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def ws_read_message(reader, writer):
    """The next whole data message (pings answered on the way); None at a close frame."""
    message = bytearray()
    while True:
        b0, b1 = await reader.readexactly(2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", await reader.readexactly(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", await reader.readexactly(8))[0]
        mask = await reader.readexactly(4) if b1 & 0x80 else None
        payload = await reader.readexactly(n)
        if mask:
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        opcode = b0 & 0x0F
        if opcode == 0x8:
            return None
        if opcode == 0x9:
            writer.write(ws_frame(0xA, payload))
            continue
        if opcode == 0xA:
            continue
        message += payload
        if b0 & 0x80:
            return bytes(message)


async def ws_session(proxy, tally, rng):
    """One socket: the upgrade through the proxy, then 1 to 3 responses in turn, each read to its
    end, except that one socket in five goes away mid-response (closing, or with a RST)."""
    host, port = proxy.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            f"GET {WS_PATH} HTTP/1.1\r\nhost: soak\r\nupgrade: websocket\r\nconnection: Upgrade\r\n"
            f"sec-websocket-key: {key}\r\nsec-websocket-version: 13\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status != 101:
            raise WsRefused(status)
        tally.ws["sockets"] += 1
        cut_at = rng.randint(0, 2) if rng.random() < 0.2 else None
        for n in range(rng.randint(1, 3)):
            writer.write(ws_frame(0x1, WS_CREATE))
            tally.ws["responses"] += 1
            deltas = 0
            while True:
                message = await ws_read_message(reader, writer)
                if message is None:
                    raise ConnectionError("closed mid-response")
                deltas += b'"response.output_text.delta"' in message
                if cut_at == n and deltas >= rng.randint(2, 10):
                    tally.ws["cut"] += 1
                    if rng.random() < 0.5:
                        sock = writer.get_extra_info("socket")
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return
                if any(end in message for end in WS_ENDS):
                    tally.ws["completed"] += 1
                    break
        writer.write(ws_frame(0x8, struct.pack("!H", 1000)))
        await writer.drain()
        while await ws_read_message(reader, writer) is not None:
            pass
    except (asyncio.IncompleteReadError, ConnectionError, ValueError, IndexError):
        tally.ws["errors"] += 1
    finally:
        writer.close()


async def ws_worker(proxy, deadline, tally, rng):
    while time.monotonic() < deadline and tally.ws["refused"] is None:
        try:
            await ws_session(proxy, tally, rng)
        except WsRefused as refused:
            tally.ws["refused"] = refused.status
            print(f"websocket: the proxy answered the upgrade {refused.status}, not 101: "
                  "the WebSocket clients are skipped", flush=True)


# === scrapes and reloads ===

SCRAPE_ACCEPTS = [
    "text/plain",
    "application/openmetrics-text;version=1.0.0",
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited",
]


def scrape_raw(admin, accept):
    request = urllib.request.Request(f"http://{admin}/metrics", headers={"accept": accept})
    with urllib.request.urlopen(request, timeout=5) as r:
        return r.status, r.read()


async def scraper(admin, deadline, every, tally):
    """A scrape every `every` seconds, as a Prometheus with a short interval, in each exposition
    format in turn."""
    n = 0
    while time.monotonic() < deadline:
        try:
            status, body = await asyncio.to_thread(scrape_raw, admin, SCRAPE_ACCEPTS[n % 3])
            tally.scrapes["ok" if status == 200 and body else "failed"] += 1
        except OSError:
            tally.scrapes["failed"] += 1
        n += 1
        await asyncio.sleep(every)


SPARE_ROUTE = '\n[[routes]]\nname = "spare"\npath = "/spare"\n'


async def reloader(pid, config, deadline, every, tally):
    """A SIGHUP every `every` seconds, the file alternately with and without a spare route, so
    every reload changes the routing table."""
    if not config or every <= 0:
        return
    with open(config) as f:
        original = f.read()
    try:
        while True:
            await asyncio.sleep(every)
            if time.monotonic() >= deadline:
                return
            tally.reloads += 1
            with open(config, "w") as f:
                f.write(original + (SPARE_ROUTE if tally.reloads % 2 else ""))
            os.kill(pid, signal.SIGHUP)
    finally:
        with open(config, "w") as f:
            f.write(original)


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
    idle_before = (rss_bytes(args.pid), fd_count(args.pid))
    await prime(args.proxy, args.admin, args.prime, tally)
    start = time.monotonic()
    deadline = start + args.seconds
    rows = []
    sampling = asyncio.create_task(sampler(args.pid, args.admin, start, deadline, args.every, rows))
    workers = [asyncio.create_task(worker(args.proxy, deadline, tally, random.Random(rng.random()),
                                          args.beacon_share))
               for _ in range(args.concurrency)]
    if args.websocket:
        workers += [asyncio.create_task(ws_worker(args.proxy, deadline, tally, random.Random(rng.random())))
                    for _ in range(args.ws_clients)]
    workers.append(asyncio.create_task(scraper(args.admin, deadline, args.scrape_every, tally)))
    workers.append(asyncio.create_task(reloader(args.pid, args.config, deadline, args.reload_every, tally)))
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
    beacons = {l["result"]: v for n, l, v in m if n == "metronome_beacons_total"}
    print(f"streams_total: {json.dumps({f'{r}/{o}': v for (r, o), v in sorted(streams.items())})}")
    print(f"upstream_errors_total: {json.dumps({f'{r}/{k}': v for (r, k), v in sorted(errors.items())})}")
    print(f"requests_total: {json.dumps({f'{r}/{c}': v for (r, c), v in sorted(requests.items())})}")
    print(f"beacons: sent {sum(tally.beacons.values())} ({tally.keyed} with a key), answers "
          f"{json.dumps(tally.beacons)}; beacons_total {json.dumps(beacons)}")
    print(f"websocket: {json.dumps(tally.ws)}")
    print(f"scrapes: {json.dumps(tally.scrapes)}; SIGHUP reloads: {tally.reloads}")
    print()

    r = tally.results
    bound = args.bound
    expect(abs(rss_last - rss_first) <= bound * rss_first, f"resident set flat within {bound:.0%}")
    expect(abs(fd_last - fd_first) <= bound * fd_first, f"open descriptors flat within {bound:.0%}")
    expect(total(m, "metronome_streams_active") == 0, "streams_active back to 0")
    if args.idle_wait > 0:
        expect(idle_wait is not None,
               f"descriptors back to {idle_before[1]} once idle connections expire "
               f"({'after %.0f s' % idle_wait if idle_wait is not None else 'not within %.0f s' % args.idle_wait})")
    expect(set(errors) <= {("reset", "reset")}, "upstream errors only of the injected kind (route reset, kind reset)")
    expect(errors.get(("reset", "reset"), 0) == tally.started["reset"],
           f"one reset counted per injected reset ({tally.started['reset']})")
    expect(set(tally.statuses) == {200}, "every response was a 200 (no 502/504 from the proxy)")
    http = {("chat",), ("reset",)}
    sent = started + tally.primed
    expect(sum(v for (rt, c), v in requests.items() if c != "2xx" and (rt,) in http) == 0,
           "requests_total of routes chat and reset has no 4xx/5xx")
    expect(sum(v for (rt, c), v in requests.items() if (rt,) in http) == sent,
           f"requests_total of routes chat and reset adds up to the {sent} requests sent ({tally.primed} priming)")
    expect(sum(v for (rt, o), v in streams.items() if (rt,) in http) == sent,
           "streams_total of routes chat and reset adds up to the requests sent (each recorded once)")
    chat_ok = r.get("complete:whole", 0) + r.get("slow:whole", 0) + tally.primed
    expect(streams.get(("chat", "complete"), 0) == chat_ok,
           f"chat complete = priming, whole and slow clients that read it all ({chat_ok})")
    expect(streams.get(("chat", "client_cancelled"), 0) == r.get("cancel:cancelled", 0),
           f"chat client_cancelled = clients that cancelled ({r.get('cancel:cancelled', 0)})")
    expect(streams.get(("reset", "upstream_error"), 0) == tally.started["reset"],
           "reset upstream_error = streams on the resetting route")
    expect(r.get("reset:cut", 0) == tally.started["reset"],
           "every reset reached its client as a cut response, never as a complete one")
    unexpected = {k: v for k, v in r.items()
                  if k not in ("complete:whole", "slow:whole", "cancel:cancelled", "reset:cut")}
    expect(not unexpected, f"no other client result ({json.dumps(unexpected)})")
    sent_beacons = sum(tally.beacons.values())
    if args.beacon_share > 0:
        expect(sent_beacons > 0 and set(tally.beacons) == {204},
               f"every beacon answered 204 ({json.dumps(tally.beacons)})")
        expect(beacons.get("accepted", 0) == tally.beacons.get(204, 0),
               "beacons_total{result=accepted} = the beacons answered 204")
    if args.websocket and tally.ws["refused"] is None:
        ws = {o: v for (rt, o), v in streams.items() if rt == "ws"}
        expect(tally.ws["sockets"] > 0 and tally.ws["errors"] == 0,
               f"WebSocket sockets opened and closed without error ({json.dumps(tally.ws)})")
        expect(sum(ws.values()) == tally.ws["responses"],
               f"streams_total of route ws = the responses asked for over WebSocket ({tally.ws['responses']})")
        expect(ws.get("complete", 0) == tally.ws["completed"],
               f"ws complete = responses read to their end ({tally.ws['completed']})")
    elif args.websocket:
        print(f"  skip WebSocket checks: the proxy answered the upgrade {tally.ws['refused']}")
    wanted = int(args.seconds / args.scrape_every * 0.5)
    expect(tally.scrapes["failed"] == 0 and tally.scrapes["ok"] >= wanted,
           f"every scrape of /metrics answered ({json.dumps(tally.scrapes)}, at least {wanted})")
    if args.config and args.reload_every > 0:
        expect(total(m, "metronome_config_reload_failures_total") == 0, "no reload refused")
        if args.serve_log:
            with open(args.serve_log, errors="replace") as f:
                applied = f.read().count("configuration reloaded")
            expect(applied == tally.reloads,
                   f"every SIGHUP reloaded the file ({applied} of {tally.reloads})")
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
    d.add_argument("--bound", type=float, default=0.10,
                   help="how far the last minute's resident set and descriptors may be from the first's")
    d.add_argument("--prime", type=int, default=BEACON_WINDOW,
                   help="short streams sent before the clock starts, to fill the bounded registries")
    d.add_argument("--beacon-share", type=float, default=0.25,
                   help="share of whole streams whose client sends a beacon")
    d.add_argument("--websocket", action="store_true",
                   help="also run Responses-over-WebSocket clients through the proxy")
    d.add_argument("--ws-clients", type=int, default=4)
    d.add_argument("--scrape-every", type=float, default=1.0)
    d.add_argument("--reload-every", type=float, default=60.0)
    d.add_argument("--config", help="the proxy's configuration file, rewritten before each SIGHUP")
    d.add_argument("--serve-log", help="the proxy's log, to count the reloads it applied")
    args = parser.parse_args()
    if args.command == "reset-upstream":
        asyncio.run(reset_upstream(args.listen))
    else:
        sys.exit(asyncio.run(drive(args)))


if __name__ == "__main__":
    main()
