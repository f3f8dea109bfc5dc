#!/usr/bin/env python3
"""Writes deploy/grafana/metronome.json, the Grafana dashboard (classic JSON model).

    scripts/deploy-gen-dashboard.py [OUT]

The panels are listed below once; this script lays them out. Edit here, run it, commit both:
scripts/check-deploy.sh fails when the committed JSON differs from what this writes.
"""

import json
import sys

# Every query keeps to the chosen deployment (namespace, job, pod: the labels the Prometheus
# Operator puts on each target) as well as the route and model.
WHO = 'namespace=~"$namespace", job=~"$job", pod=~"$pod"'
SEL = WHO + ', route=~"$route", model=~"$model"'
ROUTE = WHO + ', route=~"$route"'
# vLLM's own series: the same pods (the PodMonitor scrapes both ports of the pod), model_name
# where metronome says model.
VLLM = 'namespace=~"$namespace", pod=~"$pod", model_name=~"$model"'
RI = "$__rate_interval"
ITL = "metronome_inter_token_latency_seconds"

panels = []
layout = {"x": 0, "y": 0, "row_h": 0}


def place(w, h):
    if layout["x"] + w > 24:
        layout["x"] = 0
        layout["y"] += layout["row_h"]
        layout["row_h"] = 0
    pos = {"x": layout["x"], "y": layout["y"], "w": w, "h": h}
    layout["x"] += w
    layout["row_h"] = max(layout["row_h"], h)
    return pos


def row(title):
    layout["y"] += layout["row_h"]
    layout["x"] = 0
    layout["row_h"] = 0
    panels.append({"type": "row", "title": title, "collapsed": False, "panels": [],
                   "gridPos": {"x": 0, "y": layout["y"], "w": 24, "h": 1}})
    layout["y"] += 1


# Exemplars: metronome puts a stream ID on its latency buckets and its hitch and episode counters
# (OpenMetrics or protobuf scrapes, Prometheus with --enable-feature=exemplar-storage). Every
# query on those asks Grafana to show them: a point on the panel links to /streams/{id}.
EXEMPLAR_METRICS = ("_seconds_bucket", "metronome_hitches_total", "metronome_batch_episodes_total")


def target(expr, legend, ref, fmt=None):
    t = {"datasource": {"type": "prometheus", "uid": "${datasource}"}, "expr": expr,
         "legendFormat": legend, "refId": ref, "range": True}
    if fmt:
        t["format"] = fmt
    if "metronome_" in expr and any(m in expr for m in EXEMPLAR_METRICS) and fmt != "heatmap":
        t["exemplar"] = True
    return t


def timeseries(title, desc, targets, unit, w=12, h=8, log=False, stack=False, thresholds=None):
    defaults = {"unit": unit, "custom": {"lineWidth": 1, "fillOpacity": 10 if not stack else 60,
                                         "showPoints": "never", "spanNulls": False,
                                         "stacking": {"mode": "normal" if stack else "none"}}}
    if log:
        defaults["custom"]["scaleDistribution"] = {"type": "log", "log": 10}
    if thresholds:
        defaults["custom"]["thresholdsStyle"] = {"mode": "dashed"}
        defaults["thresholds"] = {"mode": "absolute", "steps": [{"color": "green", "value": None}] +
                                  [{"color": c, "value": v} for v, c in thresholds]}
    panels.append({
        "type": "timeseries", "title": title, "description": desc,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": place(w, h),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "targets": [target(e, l, chr(ord("A") + i)) for i, (e, l) in enumerate(targets)],
    })


def heatmap(title, desc, expr, unit, w=8, h=9):
    panels.append({
        "type": "heatmap", "title": title, "description": desc,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": place(w, h),
        "fieldConfig": {"defaults": {"custom": {"scaleDistribution": {"type": "linear"}}}, "overrides": []},
        "options": {
            "calculate": False,
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential", "exponent": 0.5, "fill": "dark-orange"},
            "yAxis": {"axisPlacement": "left", "unit": unit},
            "rowsFrame": {"layout": "le"},
            "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": False},
            "legend": {"show": True},
            "filterValues": {"le": 1e-9},
        },
        "targets": [target(expr, "{{le}}", "A", fmt="heatmap")],
    })


def quantile(q, metric, sel, by):
    return f"histogram_quantile({q}, sum by ({by}le) (rate({metric}_bucket{{{sel}}}[{RI}])))"


# --- Cadence ---------------------------------------------------------------------------------
row("Cadence: inter-token gaps (ingress = as the model sent them, egress = as they reached the client socket, client = as a client reported them)")
timeseries("Inter-token gap p50 and p99 by point",
           "Per token event. Egress above ingress: the delivery path adds pauses. Both high: the model server.",
           [(quantile(0.99, ITL, SEL, "point, "), "p99 {{point}}"),
            (quantile(0.5, ITL, SEL, "point, "), "p50 {{point}}")],
           "s", w=12, log=True, thresholds=[(0.2, "red")])
timeseries("Jank ratio (p99 / p50 gap) by point",
           "p99 gap over the median gap (at least 1 ms). Steady streaming stays near 1-3; stalls and clumps push it up.",
           [(f"{quantile(0.99, ITL, SEL, 'point, ')} / clamp_min({quantile(0.5, ITL, SEL, 'point, ')}, 0.001)", "{{point}}")],
           "none", w=12, thresholds=[(4, "orange")])
for point in ("ingress", "egress", "client"):
    heatmap(f"Inter-token gaps at {point}",
            f"Gaps between token events at {point}, per interval. A band at 0 is clumping (events in one frame)."
            + (" Client points come from clients that report them; empty otherwise." if point == "client" else ""),
            f'sum by (le) (increase({ITL}_bucket{{{SEL}, point="{point}"}}[{RI}]))', "s")
timeseries("Gaps without a stall at egress (the SLO)",
           "Share of inter-token gaps reaching clients that are not stalls (not longer than metering.stall_threshold, "
           "200 ms by default); the SLO alerts burn on 99%.",
           [(f'1 - sum by (route) (rate(metronome_stalls_total{{{SEL}, point="egress"}}[{RI}])) / sum by (route) (rate({ITL}_count{{{SEL}, point="egress"}}[{RI}]))', "{{route}}")],
           "percentunit", w=12, thresholds=[(0.99, "green")])
timeseries("Per-stream jank ratio p50 and p90 by point",
           "One sample per stream with at least 8 gaps: how many streams are janky, not only how many gaps.",
           [(quantile(0.9, "metronome_stream_jank_ratio", SEL, "point, "), "p90 {{point}}"),
            (quantile(0.5, "metronome_stream_jank_ratio", SEL, "point, "), "p50 {{point}}")],
           "none", w=12)

# --- vLLM beside metronome ------------------------------------------------------------------
row("vLLM's own view beside metronome's (vLLM 0.11 or later; model_name joined to model with label_replace)")


def as_model(expr):
    """vLLM's model_name copied into model, so its series line up with metronome's."""
    return f'label_replace({expr}, "model", "$1", "model_name", "(.*)")'


def vllm_quantile(q, metric):
    return (f"histogram_quantile({q}, sum by (model, le) ({as_model(f'rate({metric}_bucket{{{VLLM}}}[{RI}])')}))")


timeseries("Inter-token gap p99: vLLM's own, metronome ingress and egress",
           "vLLM's vllm:inter_token_latency_seconds (engine side) beside metronome's ingress (as the bytes "
           "left vLLM's HTTP server) and egress (as they reached the client). vLLM low and ingress high: "
           "vLLM's API server or detokenizer; ingress low and egress high: the path to the client.",
           [(vllm_quantile(0.99, "vllm:inter_token_latency_seconds"), "vLLM {{model}}"),
            (quantile(0.99, ITL, SEL + ', point=~"ingress|egress"', "model, point, "), "metronome {{point}} {{model}}")],
           "s", w=12, log=True, thresholds=[(0.2, "red")])
timeseries("Time to first token p95: vLLM's own, metronome ingress and egress",
           "vllm:time_to_first_token_seconds beside metronome's; the difference is time spent before vLLM "
           "started the request (queue) or on the way out.",
           [(vllm_quantile(0.95, "vllm:time_to_first_token_seconds"), "vLLM {{model}}"),
            (quantile(0.95, "metronome_time_to_first_token_seconds", SEL + ', point=~"ingress|egress"', "model, point, "), "metronome {{point}} {{model}}")],
           "s", w=12, log=True)
timeseries("vLLM queue time p95", "vllm:request_queue_time_seconds: how long requests waited before vLLM scheduled them.",
           [(vllm_quantile(0.95, "vllm:request_queue_time_seconds"), "{{model}}")], "s", w=6, log=True)
timeseries("vLLM requests running and waiting", "vllm:num_requests_running and vllm:num_requests_waiting: a queue that grows explains TTFT.",
           [(f"sum by (model) ({as_model(f'vllm:num_requests_running{{{VLLM}}}')})", "running {{model}}"),
            (f"sum by (model) ({as_model(f'vllm:num_requests_waiting{{{VLLM}}}')})", "waiting {{model}}")],
           "none", w=6)
timeseries("vLLM KV-cache usage", "vllm:kv_cache_usage_perc (0 to 1): near 1, vLLM preempts requests, which stalls their streams.",
           [(f"max by (model) ({as_model(f'vllm:kv_cache_usage_perc{{{VLLM}}}')})", "{{model}}")],
           "percentunit", w=6, thresholds=[(0.9, "orange")])
timeseries("vLLM preemptions per second", "vllm:num_preemptions_total: a preempted request pauses, seen by metronome as a stall at ingress.",
           [(f"sum by (model) ({as_model(f'rate(vllm:num_preemptions_total{{{VLLM}}}[{RI}])')})", "{{model}}")],
           "ops", w=6)

# --- Native histograms -----------------------------------------------------------------------
row("Native histograms (when metronome exports them and Prometheus scrapes them: deploy/prometheus/README.md)")


def native_quantile(q, metric, sel, by):
    """A native histogram is one series: queried by its name, without _bucket and without le."""
    return f"histogram_quantile({q}, sum by ({by}) (rate({metric}{{{sel}}}[{RI}])))"


timeseries("Inter-token gap p50 and p99 by point (native histogram)",
           "The same gaps at the native histogram's resolution (a few percent everywhere, not the classic "
           "buckets' steps). Empty when native histograms are off on either side; the classic panels above still work.",
           [(native_quantile(0.99, ITL, SEL, "point"), "p99 {{point}}"),
            (native_quantile(0.5, ITL, SEL, "point"), "p50 {{point}}")],
           "s", w=12, log=True, thresholds=[(0.2, "red")])
timeseries("Time to first token p95 by point (native histogram)",
           "TTFT at the native histogram's resolution; empty when native histograms are off.",
           [(native_quantile(0.95, "metronome_time_to_first_token_seconds", SEL, "point"), "p95 {{point}}")],
           "s", w=12, log=True)

# --- Stalls ----------------------------------------------------------------------------------
row("Stalls: gaps above the stall threshold")
timeseries("Stalls per second by point", "Gaps longer than the stall threshold (default 200 ms).",
           [(f"sum by (point) (rate(metronome_stalls_total{{{SEL}}}[{RI}]))", "{{point}}")], "ops", w=8)
timeseries("Share of gaps that are stalls by point", "Stalls per inter-token gap.",
           [(f"sum by (point) (rate(metronome_stalls_total{{{SEL}}}[{RI}])) / sum by (point) (rate({ITL}_count{{{SEL}}}[{RI}]))", "{{point}}")],
           "percentunit", w=8, thresholds=[(0.01, "red")])
timeseries("Stall length p50 and p99 by point", "How long each stall lasted.",
           [(quantile(0.99, "metronome_stall_duration_seconds", SEL, "point, "), "p99 {{point}}"),
            (quantile(0.5, "metronome_stall_duration_seconds", SEL, "point, "), "p50 {{point}}")],
           "s", w=8)

# --- Batch -----------------------------------------------------------------------------------
row("Batch: hitches shared by the engine's streams (scope batch) or one stream's own (scope stream); /episodes names them")
timeseries("Hitches per second by scope",
           "Hitches at ingress. scope=batch: much of the engine's batch was held at once (a prefill joining it); "
           "scope=stream: this stream alone. An exemplar names a stream: /streams/{id} on the admin port.",
           [(f"sum by (scope) (rate(metronome_hitches_total{{{SEL}}}[{RI}]))", "{{scope}}")], "ops", w=8, stack=True)
timeseries("Share of hitches shared with the batch",
           "Above one half for long: continuous batching, not single streams (the MetronomeBatchHitches info alert).",
           [(f'sum by (route) (rate(metronome_hitches_total{{{SEL}, scope="batch"}}[{RI}])) / sum by (route) (rate(metronome_hitches_total{{{SEL}}}[{RI}]))', "{{route}}")],
           "percentunit", w=8, thresholds=[(0.5, "orange")])
timeseries("Batch episodes per second by upstream",
           "Episodes in which much of an upstream's batch stalled together; /episodes lists each with the requests "
           "that arrived just before it.",
           [(f"sum by (upstream) (rate(metronome_batch_episodes_total{{{WHO}}}[{RI}]))", "{{upstream}}")], "ops", w=8)

# --- Goodput ---------------------------------------------------------------------------------
row("Goodput: streams meeting the objectives their requests carried (x-llm-d-slo-ttft-ms, x-llm-d-slo-tpot-ms)")
timeseries("Goodput by objective",
           "Share of streams with objectives that met them, judged at egress (all: every objective of the request).",
           [(f'sum by (objective) (rate(metronome_slo_streams_total{{{SEL}, result="met"}}[{RI}])) / sum by (objective) (rate(metronome_slo_streams_total{{{SEL}}}[{RI}]))', "{{objective}}")],
           "percentunit", w=12, thresholds=[(0.99, "green")])
timeseries("Streams meeting and missing all objectives per second",
           "Good streams per second (met), beside the ones that missed (a stream that did not complete misses).",
           [(f'sum by (result) (rate(metronome_slo_streams_total{{{SEL}, objective="all"}}[{RI}]))', "{{result}}")],
           "ops", w=12, stack=True)

# --- Phases ----------------------------------------------------------------------------------
row("Phases: reasoning, content (the answer) and tool_call; TTFO is the first answer token")
TTFO = "metronome_time_to_first_output_token_seconds"
timeseries("Phase: time to first output token beside time to first token (p50, p95, egress)",
           "TTFT is the first token of any phase; TTFO the first of the answer (content). The gap between them is the "
           "model thinking.",
           [(quantile(0.95, TTFO, SEL + ', point="egress"', ""), "TTFO p95"),
            (quantile(0.5, TTFO, SEL + ', point="egress"', ""), "TTFO p50"),
            (quantile(0.95, "metronome_time_to_first_token_seconds", SEL + ', point="egress"', ""), "TTFT p95"),
            (quantile(0.5, "metronome_time_to_first_token_seconds", SEL + ', point="egress"', ""), "TTFT p50")],
           "s", w=12, log=True)
timeseries("Phase: inter-token gap p50 and p99 by phase (egress)",
           "The answer's cadence (content) is what a reader sees and what the ITL page watches; reasoning and "
           "tool-call arguments may pause without anyone waiting on each token.",
           [(quantile(0.99, ITL, SEL + ', point="egress"', "phase, "), "p99 {{phase}}"),
            (quantile(0.5, ITL, SEL + ', point="egress"', "phase, "), "p50 {{phase}}")],
           "s", w=12, log=True, thresholds=[(0.3, "red")])
timeseries("Phase: stalls per second by phase",
           "Gaps over the stall threshold, by the phase of the event that ended them.",
           [(f"sum by (phase, point) (rate(metronome_stalls_total{{{SEL}}}[{RI}]))", "{{phase}} {{point}}")],
           "ops", w=8)
timeseries("Phase: reasoning duration p50 and p95",
           "Per stream that reasoned: from its first reasoning token to its first answer token.",
           [(quantile(0.95, "metronome_reasoning_duration_seconds", SEL + ', point="egress"', ""), "p95"),
            (quantile(0.5, "metronome_reasoning_duration_seconds", SEL + ', point="egress"', ""), "p50")],
           "s", w=8, log=True)
timeseries("Phase: reasoning tokens per second by model",
           "From the usage's reasoning-token counts (completion_tokens_details.reasoning_tokens and the like).",
           [(f"sum by (model) (rate(metronome_reasoning_tokens_total{{{SEL}}}[{RI}]))", "{{model}}")],
           "short", w=8)

# --- WebSocket -------------------------------------------------------------------------------
row("WebSocket: tunnels of the Responses API's WebSocket mode and the Realtime API")
timeseries("WebSocket: tunnels open by route", "WebSocket connections metronome tunnels now.",
           [(f"sum by (route) (metronome_websocket_connections_active{{{ROUTE}}})", "{{route}}")], "none", w=12)
timeseries("WebSocket: tunnels closed per second by outcome",
           "completed, client_closed, upstream_closed, idle_timeout, drained, upstream_refused, error.",
           [(f"sum by (outcome) (rate(metronome_websocket_connections_total{{{ROUTE}}}[{RI}]))", "{{outcome}}")],
           "ops", w=12, stack=True)

# --- Latency ---------------------------------------------------------------------------------
row("Latency: first token, per output token, and metronome's own delay")
timeseries("Time to first token p50 and p95 by point", "From the request reaching metronome to the first token event.",
           [(quantile(0.95, "metronome_time_to_first_token_seconds", SEL, "point, "), "p95 {{point}}"),
            (quantile(0.5, "metronome_time_to_first_token_seconds", SEL, "point, "), "p50 {{point}}")],
           "s", w=8, log=True)
timeseries("Time per output token p50 and p99", "Per stream: (last token event - first token event) / (output tokens - 1).",
           [(quantile(0.99, "metronome_time_per_output_token_seconds", SEL, ""), "p99"),
            (quantile(0.5, "metronome_time_per_output_token_seconds", SEL, ""), "p50")],
           "s", w=8)
timeseries("Proxy delay p50 and p99 (egress - ingress, per frame)",
           "How long metronome held each frame, including time waiting for a slow client's socket.",
           [(quantile(0.99, "metronome_proxy_delay_seconds", ROUTE, "route, "), "p99 {{route}}"),
            (quantile(0.5, "metronome_proxy_delay_seconds", ROUTE, "route, "), "p50 {{route}}")],
           "s", w=8, log=True, thresholds=[(0.025, "orange")])
timeseries("Time to first byte p50 and p95 by point", "From the request reaching metronome to the first response body byte.",
           [(quantile(0.95, "metronome_time_to_first_byte_seconds", ROUTE, "point, "), "p95 {{point}}"),
            (quantile(0.5, "metronome_time_to_first_byte_seconds", ROUTE, "point, "), "p50 {{point}}")],
           "s", w=12, log=True)
timeseries("Request duration p50 and p99 by route", "Every proxied request, streaming or not, to the end of its body.",
           [(quantile(0.99, "metronome_request_duration_seconds", ROUTE, "route, "), "p99 {{route}}"),
            (quantile(0.5, "metronome_request_duration_seconds", ROUTE, "route, "), "p50 {{route}}")],
           "s", w=12, log=True)

# --- Framing ---------------------------------------------------------------------------------
row("Framing: speculative decoding, batching and re-chunking")
timeseries("Tokens per token event (mean and p99)",
           "Above 1: the server sends several tokens per event (speculative decoding, server-side batching).",
           [(f"sum(rate(metronome_tokens_per_event_sum{{{SEL}}}[{RI}])) / sum(rate(metronome_tokens_per_event_count{{{SEL}}}[{RI}]))", "mean"),
            (quantile(0.99, "metronome_tokens_per_event", SEL, ""), "p99")],
           "none", w=12)
timeseries("Events per frame by point (mean and p99)",
           "Above 1 at ingress: the server coalesces events; above ingress at egress: they were clumped on the way out.",
           [(f"sum by (point) (rate(metronome_events_per_frame_sum{{{ROUTE}}}[{RI}])) / sum by (point) (rate(metronome_events_per_frame_count{{{ROUTE}}}[{RI}]))", "mean {{point}}"),
            (quantile(0.99, "metronome_events_per_frame", ROUTE, "point, "), "p99 {{point}}")],
           "none", w=12)

# --- Traffic ---------------------------------------------------------------------------------
row("Traffic: streams, tokens, requests and errors")
timeseries("Streams by outcome", "How metered streams ended, per second.",
           [(f"sum by (outcome) (rate(metronome_streams_total{{{SEL}}}[{RI}]))", "{{outcome}}")], "ops", w=8, stack=True)
timeseries("Active streams by route", "Metered streams open now.",
           [(f"sum by (route) (metronome_streams_active{{{ROUTE}}})", "{{route}}")], "none", w=8)
timeseries("Output tokens per second by model", "From the server's usage where it reports one, counted otherwise.",
           [(f"sum by (model) (rate(metronome_output_tokens_total{{{SEL}}}[{RI}]))", "{{model}}")], "short", w=8)
timeseries("Requests by status class", "Every proxied request.",
           [(f"sum by (status_class) (rate(metronome_requests_total{{{ROUTE}}}[{RI}]))", "{{status_class}}")], "reqps", w=8, stack=True)
timeseries("Upstream errors by kind", "connect, timeout, reset, protocol: before or during a response.",
           [(f"sum by (kind) (rate(metronome_upstream_errors_total{{{ROUTE}}}[{RI}]))", "{{kind}}")], "ops", w=8)
timeseries("Events metronome could not inspect", "Forwarded untouched, but not counted as tokens: invalid or oversize.",
           [(f"sum by (reason) (rate(metronome_unparsed_events_total{{{ROUTE}}}[{RI}]))", "{{reason}}")], "ops", w=8)
timeseries("Streams by finish reason", "Why the server ended each stream (stop, length, tool_calls, content_filter, other, none); a client gone is abort, an upstream failure error.",
           [(f"sum by (finish_reason) (rate(metronome_streams_total{{{SEL}}}[{RI}]))", "{{finish_reason}}")], "ops", w=12, stack=True)
timeseries("Tokens per request (p50 and p99) by type", "Per stream: input tokens as the usage reports them, output tokens as the usage or the count says.",
           [(quantile(0.5, "metronome_request_tokens", SEL, "type, "), "p50 {{type}}"),
            (quantile(0.99, "metronome_request_tokens", SEL, "type, "), "p99 {{type}}")],
           "short", w=12)

dashboard = {
    "__inputs": [],
    "annotations": {"list": [{
        "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
        "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"}]},
    "description": "metronome: the inter-token cadence of streamed LLM output, at ingress, egress and client. Metric contract: docs/metrics.md.",
    "editable": True,
    "graphTooltip": 1,
    "id": None,
    "links": [],
    "panels": panels,
    "refresh": "30s",
    "schemaVersion": 39,
    "tags": ["metronome", "llm", "streaming"],
    "templating": {"list": [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []},
        ] + [
        {"name": name, "label": label, "type": "query",
         "datasource": {"type": "prometheus", "uid": "${datasource}"},
         "query": {"query": q, "refId": name}, "definition": q,
         "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "hide": 0, "refresh": 2,
         "regex": "", "sort": 1, "options": []}
        for name, label, q in (
            ("namespace", "Namespace", "label_values(metronome_build_info, namespace)"),
            ("job", "Job", 'label_values(metronome_build_info{namespace=~"$namespace"}, job)'),
            ("pod", "Pod", 'label_values(metronome_build_info{namespace=~"$namespace", job=~"$job"}, pod)'),
        )] + [
        {"name": "route", "label": "Route", "type": "query",
         "datasource": {"type": "prometheus", "uid": "${datasource}"},
         "query": {"query": 'label_values(metronome_requests_total{namespace=~"$namespace", job=~"$job"}, route)', "refId": "route"},
         "definition": 'label_values(metronome_requests_total{namespace=~"$namespace", job=~"$job"}, route)',
         "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "hide": 0, "refresh": 2,
         "regex": "", "sort": 1, "options": []},
        {"name": "model", "label": "Model", "type": "query",
         "datasource": {"type": "prometheus", "uid": "${datasource}"},
         "query": {"query": 'label_values(metronome_streams_total{namespace=~"$namespace", job=~"$job", route=~"$route"}, model)', "refId": "model"},
         "definition": 'label_values(metronome_streams_total{namespace=~"$namespace", job=~"$job", route=~"$route"}, model)',
         "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "hide": 0, "refresh": 2,
         "regex": "", "sort": 1, "options": []},
    ]},
    "time": {"from": "now-3h", "to": "now"},
    "timepicker": {},
    "timezone": "",
    "title": "metronome: streaming cadence",
    "uid": "metronome-cadence",
    "version": 1,
}

out = sys.argv[1] if len(sys.argv) > 1 else "deploy/grafana/metronome.json"
with open(out, "w") as f:
    json.dump(dashboard, f, indent=2)
    f.write("\n")
