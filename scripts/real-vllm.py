#!/usr/bin/env python3
"""metronome in front of a real vLLM (../shared/real-vllm/: CPU build, tiny random model).

Two checks that only a real engine settles, each against its own vLLM:

  phases  A model whose output starts inside <think>, served with `--reasoning-parser deepseek_r1`:
          `metronome probe` streams through the proxy with a per-request `thinking_token_budget`,
          and the probe's TTFT, TTFO and per-phase gap counts are set beside the proxy's (its
          egress TTFO of each stream from `/streams/{id}`, its ITL counts by phase from /metrics).
  batch   Six streams decoding; two requests with long prompts arrive mid-decode. Continuous
          batching stalls all six at once while the prompts' prefill runs: `/episodes` must hold
          exactly one episode, with all six streams and both long prompts among its arrivals.
          The default tiny model's prefill is too short to stall the batch: use the larger one
          below (docs/real-vllm.md).

    ../shared/real-vllm/setup.sh
    $REAL_UPSTREAM_DIR/venv/bin/python ../shared/real-vllm/make_tiny_model.py --hf /tmp/real-upstream/tiny-think --think
    MODEL_DIR=/tmp/real-upstream/tiny-think ../shared/real-vllm/serve.sh 8001 --reasoning-parser deepseek_r1
    python3 scripts/real-vllm.py phases --bin target/release/metronome --upstream http://127.0.0.1:8001
    $REAL_UPSTREAM_DIR/venv/bin/python ../shared/real-vllm/make_tiny_model.py --hf /tmp/real-upstream/tiny-512 \\
        --hidden 512 --layers 4 --ffn 1536
    MODEL_DIR=/tmp/real-upstream/tiny-512 ../shared/real-vllm/serve.sh 8000
    python3 scripts/real-vllm.py batch --bin target/release/metronome --upstream http://127.0.0.1:8000

Exits 1 when a check fails. Everything talks to 127.0.0.1 only; the proxy it starts is stopped.
"""

import argparse
import json
import socket
import statistics
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


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_for(url, limit=20.0):
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            get(url, timeout=1)
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} never answered")


class Proxy:
    """`metronome serve` in front of the upstream, with its admin listener."""

    def __init__(self, binary, upstream, extra=""):
        self.port, self.admin_port = free_port(), free_port()
        self.cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
        self.cfg.write(f'[server]\nlisten = "127.0.0.1:{self.port}"\n'
                       f'admin = "127.0.0.1:{self.admin_port}"\nupstream = "{upstream}"\n{extra}')
        self.cfg.close()
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.process = subprocess.Popen([binary, "serve", "--config", self.cfg.name],
                                        stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin = f"http://127.0.0.1:{self.admin_port}"
        wait_for(self.admin + "/healthz")

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)


def nearest_rank(values, q):
    """The probe's percentile: nearest rank on the exact samples."""
    ordered = sorted(values)
    return ordered[max(0, -(-len(ordered) * q // 100) - 1)]


def series(text, name, **labels):
    """The sum of a metric family's samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, value = line.rsplit(" ", 1)
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def phases(opts):
    proxy = Proxy(opts.bin, opts.upstream)
    ok = True
    try:
        body = {"messages": [{"role": "user", "content": "Think first, then answer."}],
                "max_tokens": opts.max_tokens, "ignore_eos": True,
                "thinking_token_budget": opts.budget}
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as dataset:
            dataset.write(json.dumps(body) + "\n")
        report = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
        probe = subprocess.run([opts.bin, "probe", "--url", proxy.url, "--model", opts.model,
                                "--dataset", dataset.name, "--concurrency", "1",
                                "--requests", str(opts.streams), "--json", report],
                               capture_output=True, text=True, timeout=600)
        print(probe.stdout)
        run = json.load(open(report))
        print("probe JSON:", json.dumps({k: run.get(k) for k in ("ttft_ms", "ttfo_ms", "phases")}))
        listed = json.loads(get(proxy.admin + f"/streams?limit={opts.streams}"))["streams"]
        ttfo, ttft = [], []
        for entry in listed:
            ttfo.append(entry["ttfo_us"]["egress"] / 1e3)
            ttft.append(entry["ttft_us"]["egress"] / 1e3)
        metrics = get(proxy.admin + "/metrics")
        proxy_gaps = {p: int(series(metrics, "metronome_inter_token_latency_seconds_count",
                                    point="egress", phase=p))
                      for p in ("reasoning", "content", "tool_call")}
        print(f"{'figure':<26}{'probe (client)':>16}{'metronome (egress)':>20}")
        rows = [("TTFT p50 ms", run["ttft_ms"]["p50"], nearest_rank(ttft, 50)),
                ("TTFT max ms", run["ttft_ms"]["max"], max(ttft)),
                ("TTFO p50 ms", run["ttfo_ms"]["p50"], nearest_rank(ttfo, 50)),
                ("TTFO p95 ms", run["ttfo_ms"]["p95"], nearest_rank(ttfo, 95)),
                ("TTFO max ms", run["ttfo_ms"]["max"], max(ttfo))]
        for name, client, server in rows:
            print(f"{name:<26}{client:>16.1f}{server:>20.1f}")
            # The client's clock starts before the request is written and stops after the frame
            # is read: a few milliseconds on loopback, never less than the proxy's figure.
            if not -1.0 <= client - server <= opts.margin_ms:
                print(f"FAIL: {name}: the probe's {client:.1f} ms and the proxy's {server:.1f} ms"
                      f" differ by more than {opts.margin_ms} ms")
                ok = False
        # The probe reports token events per phase. Every stream here opens in its reasoning (the
        # model's turn starts inside <think>), so its first event ends no gap: reasoning gaps are
        # the reasoning events less one per stream, and every answer event ends an answer gap.
        for phase in ("reasoning", "content", "tool_call"):
            events = (run.get("phases") or {}).get(phase, {}).get("token_events")
            client = None if events is None else events - (len(listed) if phase == "reasoning" else 0)
            print(f"{phase + ' gaps':<26}{str(client):>16}{proxy_gaps[phase]:>20}")
            if client is not None and client != proxy_gaps[phase]:
                print(f"FAIL: {phase} gaps: the probe counted {client}, the proxy {proxy_gaps[phase]}")
                ok = False
        if proxy_gaps["reasoning"] == 0 or proxy_gaps["content"] == 0:
            print("FAIL: the streams did not reason and then answer (is the reasoning parser on?)")
            ok = False
        streams = int(series(metrics, "metronome_reasoning_duration_seconds_count", point="egress"))
        print(f"streams that reasoned (reasoning_duration count at egress): {streams} of {len(listed)}")
        ok &= streams == len(listed)
    finally:
        proxy.stop()
    return ok


def stream(url, body, out, started):
    """One streamed request; records each SSE data event's arrival."""
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    arrivals = []
    out["arrivals"] = arrivals
    started.append(time.time())
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            out["id"] = r.headers.get("x-metronome-stream-id")
            for line in r:
                if line.startswith(b"data: {"):
                    arrivals.append(time.time())
    except urllib.error.HTTPError as e:
        out["error"] = f"{e.code}: {e.read()[:300]!r}"


def batch(opts):
    proxy = Proxy(opts.bin, opts.upstream)
    ok = True
    try:
        decode = {"model": opts.model, "stream": True, "max_tokens": 400, "ignore_eos": True,
                  "messages": [{"role": "user", "content": "hi"}]}
        # About 1,600 prompt tokens (two per word with the tiny model's tokenizer; its window is
        # 2,048).
        words = " ".join(f"w{i % 97}" for i in range(800))
        long_prompt = {"model": opts.model, "stream": True, "max_tokens": 4, "ignore_eos": True,
                       "messages": [{"role": "user", "content": words}]}
        results = [dict() for _ in range(8)]
        started = []
        threads = [threading.Thread(target=stream, args=(proxy.url, decode, results[i], started))
                   for i in range(6)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        late = [threading.Thread(target=stream, args=(proxy.url, long_prompt, results[6 + i], started))
                for i in range(2)]
        for t in late:
            t.start()
        for t in threads + late:
            t.join(timeout=180)
        for i, r in enumerate(results[:6]):
            gaps = [b - a for a, b in zip(r["arrivals"], r["arrivals"][1:])]
            print(f"decoder {i} ({r['id']}): {len(r['arrivals'])} events, gap p50 "
                  f"{statistics.median(gaps) * 1e3:.1f} ms, max {max(gaps) * 1e3:.1f} ms")
        episodes = json.loads(get(proxy.admin + "/episodes"))["episodes"]
        print(json.dumps(episodes, indent=1))
        metrics = get(proxy.admin + "/metrics")
        print("hitches: batch", series(metrics, "metronome_hitches_total", scope="batch"),
              "stream", series(metrics, "metronome_hitches_total", scope="stream"))
        failed = [r["error"] for r in results if "error" in r]
        if failed:
            print("FAIL: requests failed:", failed)
            return False
        decoders = {r["id"] for r in results[:6]}
        prompts = {r["id"] for r in results[6:]}
        if len(episodes) != 1:
            print(f"FAIL: {len(episodes)} episodes, not one")
            return False
        episode = episodes[0]
        caught = set(episode["stream_ids"])
        arrived = {a["stream_id"] for a in episode["arrived"]}
        if not decoders <= caught:
            print(f"FAIL: the episode caught {sorted(caught)}, not every decoder {sorted(decoders)}")
            ok = False
        if not prompts <= arrived:
            print(f"FAIL: the episode's arrivals {sorted(arrived)} lack the long prompts {sorted(prompts)}")
            ok = False
        print(f"one episode: {episode['streams']} streams, {episode['arrivals']} arrivals, "
              f"{episode['duration_ms']:.0f} ms")
    finally:
        proxy.stop()
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("check", choices=["phases", "batch"])
    ap.add_argument("--bin", default="target/release/metronome")
    ap.add_argument("--upstream", default="http://127.0.0.1:8001")
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--streams", type=int, default=20, help="phases: streams, one at a time")
    ap.add_argument("--budget", type=int, default=12, help="phases: thinking_token_budget")
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--margin-ms", type=float, default=15.0,
                    help="phases: how far the probe's figure may exceed the proxy's")
    opts = ap.parse_args()
    ok = phases(opts) if opts.check == "phases" else batch(opts)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
