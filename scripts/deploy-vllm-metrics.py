#!/usr/bin/env python3
"""Serves a vLLM-shaped /metrics on 127.0.0.1 for the end-to-end checks; stops by itself.

    deploy-vllm-metrics.py PORT [FIXTURE] [LIFETIME_SECONDS]

FIXTURE (default deploy/prometheus/tests/fixtures/vllm-0.11-metrics.txt) holds vLLM 0.11's
families with per-second values: each counter, bucket, sum and count is multiplied by the seconds
since start, gauges are served as written, so rate() over the dashboard's queries sees traffic.
"""
import http.server
import re
import sys
import threading
import time

PORT = int(sys.argv[1])
FIXTURE = sys.argv[2] if len(sys.argv) > 2 else "deploy/prometheus/tests/fixtures/vllm-0.11-metrics.txt"
LIFETIME = float(sys.argv[3]) if len(sys.argv) > 3 else 300
TEXT = open(FIXTURE).read()
START = time.monotonic()
RISING = re.compile(r"^(\S+?(?:_bucket|_sum|_count|_total)(?:\{[^}]*\})?) (\S+)$", re.M)


def body():
    up = time.monotonic() - START + 1
    return RISING.sub(lambda m: f"{m.group(1)} {float(m.group(2)) * up:.6f}", TEXT).encode()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404)
            return
        data = body()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
threading.Timer(LIFETIME, server.shutdown).start()
server.serve_forever()
