#!/usr/bin/env python3
"""A small OTLP/HTTP receiver for scripts/e2e-otlp.sh, decoding with the official protobufs
(PyPI's opentelemetry-proto), plus the checks the script runs against what it received.

  otlp_receiver.py serve PORT [GRPC_PORT]   # POST /v1/metrics, /v1/traces; GET /dump/metrics|traces;
                                            # with GRPC_PORT also the gRPC services there,
                                            # dumped at /dump/grpc/metrics|traces
  otlp_receiver.py upstream PORT         # an OpenAI-shaped SSE upstream with one 600 ms stall,
                                         # recording each request's traceparent (GET /dump/upstream)
  otlp_receiver.py check-metrics PROM URL   # exponential histograms vs a /metrics text scrape
"""
import json
import re
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

import base64

LOCK = threading.Lock()
UPSTREAM_TRACEPARENTS = []
STALL_AFTER, STALL_S, TOKENS = 4, 0.6, 10


class Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        data = json.dumps({"traceparents": UPSTREAM_TRACEPARENTS}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        with LOCK:
            UPSTREAM_TRACEPARENTS.append(self.headers.get("traceparent"))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

        def chunk(data):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        for i in range(TOKENS):
            event = {"id": "c1", "object": "chat.completion.chunk", "model": "fixture-model",
                     "choices": [{"index": 0, "delta": {"content": f"t{i} "}}]}
            chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
            time.sleep(STALL_S if i == STALL_AFTER else 0.01)
        chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def serve_grpc(port):
    """The collector's two gRPC services on 127.0.0.1:`port` (grpcio, with the servicers
    opentelemetry-proto generates), recording into STATES["grpc"]."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    def metadata(context):
        return {k.lower(): v for k, v in context.invocation_metadata()}

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request, context):
            record_metrics("grpc", request, metadata(context))
            return metrics_service_pb2.ExportMetricsServiceResponse()

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            record_traces("grpc", request, metadata(context))
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


def b64hex(text):
    return base64.b64decode(text).hex() if text else ""

def fresh_state():
    return {"metrics": None, "metrics_at": 0.0, "metrics_posts": 0, "spans": [], "trace_posts": 0,
            "headers": {}}


# What each transport received: "http" (OTLP/HTTP, POST /v1/...) and "grpc" (the collector
# services' Export calls), dumped at /dump/... and /dump/grpc/... .
STATES = {"http": fresh_state(), "grpc": fresh_state()}


def record_metrics(via, req, headers):
    with LOCK:
        state = STATES[via]
        state["metrics"] = MessageToDict(req)
        state["metrics_at"] = time.time()
        state["metrics_posts"] += 1
        state["headers"] = headers


def record_traces(via, req, headers):
    with LOCK:
        state = STATES[via]
        for rs in MessageToDict(req).get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                state["spans"].extend(ss.get("spans", []))
        state["trace_posts"] += 1
        state["headers"] = headers


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.headers.get("content-type") != "application/x-protobuf":
            self.send_response(415)
            self.end_headers()
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        if self.path == "/v1/metrics":
            req = metrics_service_pb2.ExportMetricsServiceRequest()
            req.ParseFromString(body)
            record_metrics("http", req, headers)
            reply = metrics_service_pb2.ExportMetricsServiceResponse()
        elif self.path == "/v1/traces":
            req = trace_service_pb2.ExportTraceServiceRequest()
            req.ParseFromString(body)
            record_traces("http", req, headers)
            reply = trace_service_pb2.ExportTraceServiceResponse()
        else:
            self.send_response(404)
            self.end_headers()
            return
        out = reply.SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self):
        via, path = ("grpc", self.path[len("/dump/grpc"):]) if self.path.startswith("/dump/grpc/") \
            else ("http", self.path[len("/dump"):])
        with LOCK:
            state = STATES[via]
            if path == "/metrics":
                out = {k: state[k] for k in ("metrics", "metrics_at", "metrics_posts", "headers")}
            elif path == "/traces":
                out = {"spans": state["spans"], "trace_posts": state["trace_posts"], "headers": state["headers"]}
            else:
                self.send_response(404)
                self.end_headers()
                return
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def attrs(kvs):
    """Attribute values as strings (an int as its decimal digits), as Prometheus shows them."""
    out = {}
    for kv in kvs or []:
        v = kv["value"]
        out[kv["key"]] = v["stringValue"] if "stringValue" in v else str(v.get("intValue"))
    return out


def prom_name(name, unit):
    """OpenTelemetry's Prometheus translation: dots to underscores, `_seconds` for unit s."""
    if name.startswith("metronome_"):
        return name
    base = name.replace(".", "_")
    return base + "_seconds" if unit == "s" and not base.endswith("_seconds") else base


def prom_counts(text):
    """{(family, frozenset(labels)): (count, sum)} from the `_count` / `_sum` lines."""
    out = {}
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)_(count|sum)(?:\{(.*)\})? (\S+)$')
    for line in text.splitlines():
        m = line_re.match(line)
        if not m:
            continue
        labels = frozenset(re.findall(r'([a-zA-Z_]+)="([^"]*)"', m.group(3) or ""))
        key = (m.group(1), labels)
        count, total = out.get(key, (None, None))
        if m.group(2) == "count":
            count = float(m.group(4))
        else:
            total = float(m.group(4))
        out[key] = (count, total)
    return out


def metrics_of(dump):
    for rm in dump["resourceMetrics"]:
        for sm in rm["scopeMetrics"]:
            yield from sm["metrics"]


def check_metrics(prom_file, url):
    prom = prom_counts(open(prom_file).read())
    dump = json.load(urllib.request.urlopen(url))["metrics"]
    resource = attrs(dump["resourceMetrics"][0]["resource"]["attributes"])
    for key in ("service.name", "service.instance.id"):
        assert resource.get(key), f"resource lacks {key}: {resource}"
    compared = 0
    for metric in metrics_of(dump):
        eh = metric.get("exponentialHistogram")
        if not eh:
            continue
        assert eh["aggregationTemporality"] == "AGGREGATION_TEMPORALITY_CUMULATIVE", metric["name"]
        for point in eh.get("dataPoints", []):
            labels = frozenset((k.replace(".", "_"), v) for k, v in attrs(point.get("attributes")).items())
            count = int(point.get("count", 0))
            buckets = sum(int(c) for c in point.get("positive", {}).get("bucketCounts", []))
            zero = int(point.get("zeroCount", 0))
            assert buckets + zero == count, f"{metric['name']} {labels}: buckets {buckets}+{zero} != {count}"
            assert int(point.get("scale", 0)) == 4, f"{metric['name']}: scale {point.get('scale')}"
            want = prom.get((prom_name(metric["name"], metric.get("unit")), labels))
            assert want is not None, f"{metric['name']} {sorted(labels)} not on /metrics"
            assert want[0] == count, f"{metric['name']} {sorted(labels)}: OTLP count {count}, Prometheus {want[0]}"
            assert abs(want[1] - point.get("sum", 0.0)) <= 1e-6 * max(1.0, abs(want[1])), metric["name"]
            compared += 1
    assert compared > 0, "no exponential histogram data point to compare"
    print(f"{compared} exponential histogram series: counts equal the Prometheus ones")


SEMCONV_LATEST = [
    "gen_ai.server.time_to_first_token",
    "gen_ai.server.time_per_output_token",
    "gen_ai.server.request.duration",
    "gen_ai.client.inference.time_to_first_chunk",
    "gen_ai.client.inference.time_per_output_chunk",
]


def check_semconv(url, sim_port, model):
    """The GenAI histograms under their latest names, with exactly the semconv attributes."""
    dump = json.load(urllib.request.urlopen(url))["metrics"]
    by_name = {m["name"]: m for m in metrics_of(dump)}
    for old in ("gen_ai.client.operation.time_to_first_chunk", "gen_ai.client.operation.time_per_output_chunk"):
        assert old not in by_name, f"{old} emitted although gen_ai_latest_experimental was asked for"
    for name in SEMCONV_LATEST:
        metric = by_name.get(name)
        assert metric, f"no {name}; names: {sorted(by_name)}"
        assert metric.get("unit") == "s", f"{name}: unit {metric.get('unit')}"
        points = metric["exponentialHistogram"]["dataPoints"]
        want = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "server.address": "127.0.0.1",
            "server.port": str(sim_port),
            "metronome.route": "chat",
        }
        if name != "gen_ai.server.request.duration":
            want["gen_ai.request.model"] = model
            want["gen_ai.response.model"] = model
        if name == "gen_ai.client.inference.time_per_output_chunk":
            # The gap histogram keeps metronome's `phase` label (docs/metrics.md); the sim's
            # stream here is answer text only.
            want["metronome.phase"] = "content"
        chat = [p for p in points if attrs(p.get("attributes")).get("metronome.route") == "chat"]
        assert len(chat) == 1, f"{name}: {len(chat)} chat series"
        got = attrs(chat[0]["attributes"])
        assert got == want, f"{name}: attributes {got}, want {want}"
        port = [kv for kv in chat[0]["attributes"] if kv["key"] == "server.port"][0]
        assert "intValue" in port["value"], f"server.port is not an int: {port}"
    assert "metronome.stall_duration" not in by_name or by_name["metronome.stall_duration"].get("unit") == "s"
    usage = by_name.get("gen_ai.client.token.usage")
    assert usage, f"no gen_ai.client.token.usage; names: {sorted(by_name)}"
    assert usage.get("unit") == "{token}", f"gen_ai.client.token.usage: unit {usage.get('unit')}"
    chat = [attrs(p.get("attributes")) for p in usage["exponentialHistogram"]["dataPoints"]]
    chat = [a for a in chat if a.get("metronome.route") == "chat"]
    types = sorted(a.get("gen_ai.token.type") for a in chat)
    assert "output" in types and set(types) <= {"input", "output"}, f"token types {types}"
    for got in chat:
        want = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": model,
            "gen_ai.response.model": model,
            "gen_ai.token.type": got.get("gen_ai.token.type"),
            "server.address": "127.0.0.1",
            "server.port": str(sim_port),
            "metronome.route": "chat",
        }
        assert got == want, f"gen_ai.client.token.usage: attributes {got}, want {want}"
    print(f"{len(SEMCONV_LATEST)} GenAI semconv histograms with exact names, units and attributes, "
          f"and gen_ai.client.token.usage by {types}")


def span_attrs(span):
    out = {}
    for kv in span.get("attributes", []):
        v = kv["value"]
        out[kv["key"]] = next(iter(v.values())) if v else None
    return out


def check_trace(dump, upstream, trace_id, parent_id, stall_s):
    """The stream with `trace_id` has one span continuing `parent_id`, one stall event per point
    whose length is the upstream's stall, and the upstream saw metronome's span as its parent.
    `dump` is the receiver's /dump (OTLP/HTTP) or /dump/grpc URL."""
    spans = [s for s in json.load(urllib.request.urlopen(dump + "/traces"))["spans"]
             if b64hex(s["traceId"]) == trace_id]
    assert len(spans) == 1, f"{len(spans)} spans with trace {trace_id}"
    span = spans[0]
    assert b64hex(span.get("parentSpanId")) == parent_id, f"parent {b64hex(span.get('parentSpanId'))}"
    assert span["kind"] == "SPAN_KIND_SERVER", span["kind"]
    assert span["name"] == "chat fixture-model", span["name"]
    attrs = span_attrs(span)
    assert attrs["gen_ai.request.stream"] is True, attrs
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.response.model"] == "fixture-model", attrs
    assert attrs["metronome.outcome"] == "complete", attrs
    assert int(attrs["gen_ai.usage.output_tokens"]) == TOKENS, attrs
    assert attrs["metronome.stream_id"], attrs
    stalls = [e for e in span.get("events", []) if e["name"] == "metronome.stall"]
    points = sorted(span_attrs(e)["metronome.stall.point"] for e in stalls)
    assert points == ["egress", "ingress"], f"stall events at {points}"
    for e in stalls:
        length = span_attrs(e)["metronome.stall.length"]
        # The upstream sleeps stall_s between two token events; allow a loaded machine's delay.
        assert stall_s <= length < stall_s + 0.4, f"stall length {length}, slept {stall_s}"
    seen = [t for t in json.load(urllib.request.urlopen(upstream + "/dump"))["traceparents"]
            if t and t.split("-")[1] == trace_id]
    assert len(seen) == 1, f"upstream saw {seen}"
    assert seen[0].split("-")[2] == b64hex(span["spanId"]), f"upstream parent {seen[0]}, span {b64hex(span['spanId'])}"
    print(f"span of trace {trace_id[:8]}: continues the client's span, one stall event per point "
          f"({', '.join('%.3f s' % span_attrs(e)['metronome.stall.length'] for e in stalls)}), "
          "its traceparent reached the upstream")


def count_spans(dump, trace_id):
    spans = json.load(urllib.request.urlopen(dump + "/traces"))["spans"]
    print(sum(1 for s in spans if b64hex(s["traceId"]) == trace_id))


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        # Kept referenced: a grpc.Server that is collected stops serving.
        GRPC_SERVER = serve_grpc(int(sys.argv[3])) if len(sys.argv) > 3 else None
        ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), Handler).serve_forever()
    elif sys.argv[1] == "upstream":
        ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), Upstream).serve_forever()
    elif sys.argv[1] == "check-trace":
        check_trace(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], STALL_S)
    elif sys.argv[1] == "count-spans":
        count_spans(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "check-semconv":
        check_semconv(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif sys.argv[1] == "check-metrics":
        check_metrics(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown command {sys.argv[1]}")
