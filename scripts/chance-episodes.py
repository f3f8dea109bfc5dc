#!/usr/bin/env python3
"""Independent stalls must not read as batch episodes (docs/batch.md, "Episodes that would not
happen by chance").

For each stream count (2, 4, 12 and 64 by default), runs `metronome sim --gap 30ms --jitter 0.3
--stall-prob 0.01 --stall 300ms --seed N` behind `metronome serve`, keeps that many streams open
back to back for --seconds (600: the issue's 10 minutes), and prints the episodes the proxy found
(`metronome_batch_episodes_total`, `/episodes`) beside the streams' own hitches.

    python3 scripts/chance-episodes.py --bin target/release/metronome
    python3 scripts/chance-episodes.py --bin target/debug/metronome --seconds 20 --streams 2 4

Exits 1 when the runs together have more than --max-episodes episodes (1 by default).
"""

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url, limit=20.0):
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} never answered")


def metric(text, name, label=None):
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, value = line.rsplit(" ", 1)
        if series.split("{")[0] != name or (label and label not in series):
            continue
        total += float(value)
    return total


def keep_streams(proxy, until, tokens):
    body = json.dumps({"model": "m", "stream": True, "max_tokens": tokens,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    while time.time() < until:
        req = urllib.request.Request(f"http://{proxy}/v1/chat/completions", data=body,
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                while r.read(65536):
                    pass
        except OSError as e:
            print(f"  stream failed: {e}", file=sys.stderr)
            time.sleep(0.1)


def run(binary, streams, seconds, seed):
    sim_port, proxy_port, admin_port = free_port(), free_port(), free_port()
    sim = subprocess.Popen([binary, "sim", "--listen", f"127.0.0.1:{sim_port}", "--seed", str(seed),
                            "--gap", "30ms", "--jitter", "0.3", "--stall-prob", "0.01",
                            "--stall", "300ms"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as cfg:
        cfg.write(f'[server]\nlisten = "127.0.0.1:{proxy_port}"\nadmin = "127.0.0.1:{admin_port}"\n'
                  f'upstream = "http://127.0.0.1:{sim_port}"\n')
    proxy = subprocess.Popen([binary, "serve", "--config", cfg.name],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(f"http://127.0.0.1:{admin_port}/healthz")
        until = time.time() + seconds
        workers = [threading.Thread(target=keep_streams,
                                    args=(f"127.0.0.1:{proxy_port}", until, 400))
                   for _ in range(streams)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        time.sleep(0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics") as r:
            text = r.read().decode()
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/episodes") as r:
            listed = len(json.load(r)["episodes"])
        return {
            "streams": streams,
            "seconds": seconds,
            "episodes": metric(text, "metronome_batch_episodes_total"),
            "listed": listed,
            "own_hitches": metric(text, "metronome_hitches_total", 'scope="stream"'),
            "batch_hitches": metric(text, "metronome_hitches_total", 'scope="batch"'),
            "finished_streams": metric(text, "metronome_streams_total"),
        }
    finally:
        for p in (proxy, sim):
            p.terminate()
            p.wait(timeout=15)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/metronome")
    ap.add_argument("--streams", type=int, nargs="+", default=[2, 4, 12, 64])
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-episodes", type=int, default=1)
    args = ap.parse_args()
    total = 0
    for n in args.streams:
        result = run(args.bin, n, args.seconds, args.seed + n)
        print(json.dumps(result))
        total += int(result["episodes"])
    print(f"episodes across the runs: {total} (at most {args.max_episodes} wanted)")
    sys.exit(0 if total <= args.max_episodes else 1)


if __name__ == "__main__":
    main()
