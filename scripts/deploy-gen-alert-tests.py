#!/usr/bin/env python3
# Writes deploy/prometheus/tests/metronome_test.yml: promtool unit tests, one firing and one silent
# case (at least) per alert. The input series and expected values (400ms, 2%, ...) are worked out
# here by hand; the annotation texts are taken from the alerts file. Run from the repository root;
# scripts/check-deploy.sh checks that the committed file matches what this writes.
# Every series carries the deployment's identity as the Prometheus Operator gives it (namespace, and
# job "<namespace>/<monitor>", and pod); the rules keep the first two, so the alerts do too, and
# each alert's description names the worst pod, which its `query` template finds in these series.
ID = {"namespace": "team-a", "job": "team-a/vllm"}

def with_id(labels):
    return labels if "namespace" in labels or "route" not in labels else {**ID, **labels}

def seg(per_min, steps, start=0):
    return f"{start}+{per_min}x{steps}"

def two(per_min_a, steps_a, per_min_b, steps_b):
    end = per_min_a * steps_a
    return f"{seg(per_min_a, steps_a)} {end + per_min_b}+{per_min_b}x{steps_b - 1}"

def hist(name, labels, buckets, count, steps, change=None):
    """buckets: {le: per_min}; count per_min; change: (at_step, {le: per_min}, count) ."""
    out = []
    lab = ",".join(f'{k}="{v}"' for k, v in with_id(labels).items())
    for le, v in list(buckets.items()) + [("+Inf", count)]:
        if change:
            at, nb, nc = change
            v2 = nc if le == "+Inf" else nb[le]
            values = two(v, at, v2, steps - at)
        else:
            values = seg(v, steps)
        out.append((f'{name}_bucket{{{lab},le="{le}"}}', values))
    if change:
        out.append((f"{name}_count{{{lab}}}", two(count, change[0], change[2], steps - change[0])))
    else:
        out.append((f"{name}_count{{{lab}}}", seg(count, steps)))
    return out

def series_yaml(series):
    return "".join(f"      - series: '{s}'\n        values: '{v}'\n" for s, v in series)

ITL = "metronome_inter_token_latency_seconds"
def itl(model, point, buckets, count, steps, route="chat", change=None, instance="10.0.0.1:9464", namespace="team-a", pod="vllm-a-0", phase=None):
    labels = {"namespace": namespace, "job": f"{namespace}/vllm", "pod": pod, "instance": instance, "route": route, "model": model, "point": point}
    if phase:
        labels["phase"] = phase
    return hist(ITL, labels, buckets, count, steps, change)

good = {"0.05": 1200, "0.2": 1200, "0.3": 1200, "0.5": 1200}
old = {"0.05": 1160, "0.2": 1200, "0.3": 1200, "0.5": 1200}     # p99 155ms
bad = {"0.05": 1120, "0.2": 1140, "0.3": 1160, "0.5": 1200}     # p99 440ms
tests = []

def test(comment, series, alerts, interval="1m"):
    body = f"  # {comment}\n  - interval: {interval}\n    input_series:\n" + series_yaml(series)
    body += "    alert_rule_test:\n"
    for (name, at, exp) in alerts:
        body += f"      - alertname: {name}\n        eval_time: {at}\n"
        if not exp:
            body += "        exp_alerts: []\n"
        else:
            body += "        exp_alerts:\n"
            for labels, ann in exp:
                body += "          - exp_labels:\n"
                for k, v in with_id(labels).items():
                    body += f"              {k}: {v}\n"
                body += "            exp_annotations:\n"
                for k, v in ann.items():
                    body += f"              {k}: {repr_yaml(v)}\n"
    tests.append(body)

def repr_yaml(v):
    return '"' + v.replace('\\', '\\\\').replace('"', '\\"') + '"'

import re, yaml
rules = yaml.safe_load(open("deploy/prometheus/rules/metronome.alerts.yml"))
ALERTS = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
# A `{{ with query ... }}...{{ else }}...{{ end }}` block (the worst pod, or the targets gone).
QUERY_BLOCK = re.compile(r"\{\{ with (?:printf |query )?`[^`]*`[^}]*\}\}.*?\{\{ else \}\}.*?\{\{ end \}\}", re.S)
def ann(alert, value, worst=None, **labels):
    """The alert's annotations as promtool must render them; worst: the text the query block gives,
    for example "vllm-a-0 (440ms)" (the pod and its own figure, worked out by hand)."""
    labels = with_id(labels)
    out = {}
    for k, v in ALERTS[alert]["annotations"].items():
        if QUERY_BLOCK.search(v):
            assert worst is not None, f"{alert}.{k} names a pod by query: give worst="
            v = QUERY_BLOCK.sub(lambda m: worst, v)
        v = re.sub(r"\{\{ or \$labels\.(\w+) \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1)) or labels[m.group(2)], v)
        v = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], v)
        v = re.sub(r"\{\{ \$value \| \w+ \}\}", value, v)
        out[k] = v
    return out

# 1. p99 high: llama's two pods, one at 440ms and one at 49.5ms, make 380ms at 40 gaps/s: it
# fires and names the slow pod; small is fast; rare is slow but quiet.
p99_400 = {"0.05": 1100, "0.2": 1170, "0.3": 1176, "0.5": 1200}
s = itl("llama", "egress", bad, 1200, 20) + itl("llama", "egress", good, 1200, 20, pod="vllm-a-1", instance="10.0.0.2:9464") \
    + itl("small", "egress", good, 1200, 20) \
    + itl("rare", "egress", {"0.05": 250, "0.2": 280, "0.3": 290, "0.5": 300}, 300, 20)
test("MetronomeITLP99High: pending before 10m, then firing for the slow model with traffic only, naming its slow pod", s, [
    ("MetronomeITLP99High", "5m", []),
    ("MetronomeITLP99High", "15m", [({"severity": "critical", "route": "chat", "model": "llama", "point": "egress"},
                                     ann("MetronomeITLP99High", "380ms", "vllm-a-0 (440ms)", route="chat", model="llama"))]),
])

# 1b. Phases: the page reads the answer (phase content). A stuttering answer under steady
# reasoning pages, naming the phase; stuttering reasoning under a steady answer does not.
s = itl("llama", "egress", bad, 1200, 20, phase="content") + itl("llama", "egress", good, 1200, 20, phase="reasoning")
test("MetronomeITLP99High by phase: a 440ms p99 in the answer pages while the reasoning flows", s, [
    ("MetronomeITLP99High", "15m", [({"severity": "critical", "route": "chat", "model": "llama", "point": "egress", "phase": "content"},
                                     ann("MetronomeITLP99High", "440ms", "vllm-a-0 (440ms)", route="chat", model="llama"))]),
])
s = itl("llama", "egress", good, 1200, 20, phase="content") + itl("llama", "egress", bad, 1200, 20, phase="reasoning") \
    + itl("llama", "egress", bad, 1200, 20, phase="tool_call")
test("MetronomeITLP99High by phase: 440ms p99 in the reasoning and the tool-call arguments, a steady answer: no page", s, [
    ("MetronomeITLP99High", "15m", []),
])

# 2. regression against the same hour a day earlier.
steps = 1560
s = itl("llama", "egress", old, 1200, steps, change=(1440, bad, 1200)) \
    + itl("steady", "egress", old, 1200, steps) \
    + itl("quiet", "egress", {k: v // 4 for k, v in old.items()}, 300, steps, change=(1440, {k: v // 4 for k, v in bad.items()}, 300))
test("MetronomeITLP99Regressed: silent while the cadence is yesterday's, firing when p99 rises 155ms -> 440ms with traffic", s, [
    ("MetronomeITLP99Regressed", "1430m", []),
    ("MetronomeITLP99Regressed", "1550m", [({"severity": "warning", "route": "chat", "model": "llama", "point": "egress"},
                                           ann("MetronomeITLP99Regressed", "440ms", "vllm-a-0 (440ms)", route="chat", model="llama"))]),
])

# 3. stall rate at ingress.
def counter(name, labels, per_min, steps):
    lab = ",".join(f'{k}="{v}"' for k, v in with_id(labels).items())
    return [(f"{name}{{{lab}}}", seg(per_min, steps))]
s = itl("llama", "ingress", good, 1200, 20) + itl("steady", "ingress", good, 1200, 20) \
    + itl("quiet", "ingress", {k: v // 4 for k, v in good.items()}, 300, 20) + itl("clean", "ingress", good, 1200, 20) \
    + counter("metronome_stalls_total", {"pod": "vllm-a-0", "instance": "10.0.0.1:9464", "route": "chat", "model": "llama", "point": "ingress"}, 24, 20) \
    + counter("metronome_stalls_total", {"pod": "vllm-a-0", "instance": "10.0.0.1:9464", "route": "chat", "model": "steady", "point": "ingress"}, 6, 20) \
    + counter("metronome_stalls_total", {"pod": "vllm-a-0", "instance": "10.0.0.1:9464", "route": "chat", "model": "quiet", "point": "ingress"}, 30, 20)
test("MetronomeStallRateHigh: 2% stalls fire; 0.5%, none, or 10% of a trickle stay silent", s, [
    ("MetronomeStallRateHigh", "5m", []),
    ("MetronomeStallRateHigh", "15m", [({"severity": "warning", "route": "chat", "model": "llama", "point": "ingress"},
                                        ann("MetronomeStallRateHigh", "2%", "vllm-a-0 (2%)", route="chat", model="llama"))]),
])

# 4. egress diverging from ingress.
s = itl("llama", "ingress", old, 1200, 25) + itl("llama", "egress", bad, 1200, 25) \
    + itl("steady", "ingress", bad, 1200, 25) + itl("steady", "egress", bad, 1200, 25) \
    + itl("llama", "ingress", {k: v // 4 for k, v in old.items()}, 300, 25, namespace="team-b", pod="vllm-b-0", instance="10.0.0.2:9464") \
    + itl("llama", "egress", {k: v // 4 for k, v in bad.items()}, 300, 25, namespace="team-b", pod="vllm-b-0", instance="10.0.0.2:9464")
test("MetronomeEgressDivergesFromIngress: fires when clients get 440ms p99 from a model sending 155ms; silent when both are slow (the model's fault), or for team-b's same divergence at 5 gaps/s (team-a's traffic is not its floor)", s, [
    ("MetronomeEgressDivergesFromIngress", "10m", []),
    ("MetronomeEgressDivergesFromIngress", "20m", [({"severity": "warning", "route": "chat", "model": "llama"},
                                                    ann("MetronomeEgressDivergesFromIngress", "285ms", "vllm-a-0 (285ms)", route="chat", model="llama"))]),
])

# 5. proxy delay, on a host (file discovery: no pod label, so the instance is named).
s = hist("metronome_proxy_delay_seconds", {"instance": "host-a:9464", "route": "chat"}, {"0.01": 570, "0.025": 580, "0.05": 590, "0.1": 600}, 600, 25) \
    + hist("metronome_proxy_delay_seconds", {"instance": "host-a:9464", "route": "completions"}, {"0.01": 600, "0.025": 600, "0.05": 600, "0.1": 600}, 600, 25)
test("MetronomeProxyDelayHigh: a 70ms p99 fires, a sub-10ms one does not; a host is named by its instance", s, [
    ("MetronomeProxyDelayHigh", "10m", []),
    ("MetronomeProxyDelayHigh", "20m", [({"severity": "warning", "route": "chat"},
                                         ann("MetronomeProxyDelayHigh", "70ms", "host-a:9464 (70ms)", route="chat"))]),
])

# 6. TTFT.
TTFT = "metronome_time_to_first_token_seconds"
s = hist(TTFT, {"pod": "vllm-a-0", "instance": "10.0.0.1:9464", "route": "chat", "model": "llama", "point": "egress"}, {"1": 40, "2.5": 50, "5": 54, "10": 60}, 60, 25) \
    + hist(TTFT, {"pod": "vllm-a-0", "instance": "10.0.0.1:9464", "route": "chat", "model": "small", "point": "egress"}, {"1": 60, "2.5": 60, "5": 60, "10": 60}, 60, 25) \
    + hist(TTFT, {"pod": "vllm-a-0", "instance": "10.0.0.1:9464", "route": "chat", "model": "quiet", "point": "egress"}, {"1": 0, "2.5": 0, "5": 0, "10": 2}, 2, 25)
test("MetronomeTTFTHigh: p95 7.5s at one stream a second fires; fast, or slow but rare, stays silent", s, [
    ("MetronomeTTFTHigh", "10m", []),
    ("MetronomeTTFTHigh", "20m", [({"severity": "warning", "route": "chat", "model": "llama", "point": "egress"},
                                   ann("MetronomeTTFTHigh", "7.5s", "vllm-a-0 (7.5s)", route="chat", model="llama"))]),
])

# 7. streams without tokens.
def streams(model, outcome, per_min, steps=20):
    return counter("metronome_streams_total", {"pod": "vllm-a-0", "instance": "10.0.0.1:9464", "route": "chat", "model": model, "outcome": outcome}, per_min, steps)
s = streams("llama", "complete", 100) + streams("llama", "no_token", 10) + streams("small", "complete", 100) + streams("small", "no_token", 1)
test("MetronomeStreamsWithoutTokens: 9% of streams without a token fires, 1% does not", s, [
    ("MetronomeStreamsWithoutTokens", "5m", []),
    ("MetronomeStreamsWithoutTokens", "15m", [({"severity": "warning", "route": "chat", "model": "llama"},
                                               ann("MetronomeStreamsWithoutTokens", "9.091%", "vllm-a-0 (9.091%)", route="chat", model="llama"))]),
])

# 8. upstream errors.
s = counter("metronome_requests_total", {"pod": "vllm-a-0", "instance": "10.0.0.1:9464", "route": "chat", "status_class": "2xx"}, 100, 15) \
    + counter("metronome_requests_total", {"pod": "vllm-a-0", "instance": "10.0.0.1:9464", "route": "chat", "status_class": "5xx"}, 10, 15) \
    + counter("metronome_upstream_errors_total", {"pod": "vllm-a-0", "instance": "10.0.0.1:9464", "route": "chat", "kind": "connect"}, 10, 15) \
    + counter("metronome_requests_total", {"pod": "vllm-a-0", "instance": "10.0.0.1:9464", "route": "completions", "status_class": "2xx"}, 100, 15) \
    + counter("metronome_upstream_errors_total", {"pod": "vllm-a-0", "instance": "10.0.0.1:9464", "route": "completions", "kind": "reset"}, 1, 15) \
    + counter("metronome_requests_total", {"pod": "vllm-a-0", "instance": "10.0.0.1:9464", "route": "embeddings", "status_class": "2xx"}, 100, 15)
test("MetronomeUpstreamErrors: 9% of requests failing upstream pages; 1%, or none at all, does not", s, [
    ("MetronomeUpstreamErrors", "3m", []),
    ("MetronomeUpstreamErrors", "10m", [({"severity": "critical", "route": "chat"},
                                         ann("MetronomeUpstreamErrors", "9.091%", "vllm-a-0 (9.091%)", route="chat"))]),
])

# 9. reload failures, 10. absent.
NO_TARGET = "none (no target seen in the last hour: check the monitors and the scrape configuration)"
tests.append("""  # MetronomeConfigReloadFailed: fires within 15m of a refused reload, then clears.
  - interval: 1m
    input_series:
      - series: 'metronome_config_reload_failures_total{namespace="team-a", job="team-a/vllm", pod="vllm-a-0", instance="10.0.0.1:9464"}'
        values: '0x10 1x40'
      - series: 'metronome_build_info{namespace="team-a", job="team-a/vllm", pod="vllm-a-0", instance="10.0.0.1:9464", version="0.1.0"}'
        values: '1x50'
    alert_rule_test:
      - alertname: MetronomeConfigReloadFailed
        eval_time: 5m
        exp_alerts: []
      - alertname: MetronomeConfigReloadFailed
        eval_time: 15m
        exp_alerts:
          - exp_labels:
              severity: warning
              namespace: team-a
              job: team-a/vllm
              pod: vllm-a-0
              instance: 10.0.0.1:9464
            exp_annotations:
%s
      - alertname: MetronomeConfigReloadFailed
        eval_time: 40m
        exp_alerts: []
      - alertname: MetronomeAbsent
        eval_time: 40m
        exp_alerts: []
""" % "\n".join(f"              {k}: {repr_yaml(v)}" for k, v in ann("MetronomeConfigReloadFailed", "", namespace="team-a", pod="vllm-a-0", instance="10.0.0.1:9464").items()))
tests.append("""  # MetronomeAbsent: nothing from metronome for 15m fires (no target ever exported it: none named).
  - interval: 1m
    input_series:
      - series: 'up{instance="pod-a", job="metronome"}'
        values: '0x30'
    alert_rule_test:
      - alertname: MetronomeAbsent
        eval_time: 10m
        exp_alerts: []
      - alertname: MetronomeAbsent
        eval_time: 20m
        exp_alerts:
          - exp_labels:
              severity: warning
            exp_annotations:
%s
""" % "\n".join(f"              {k}: {repr_yaml(v)}" for k, v in ann("MetronomeAbsent", "", NO_TARGET).items()))
tests.append("""  # MetronomeAbsent: a pod exported metronome_build_info for 5m, then its scrapes fail: the alert
  # names its namespace and pod.
  - interval: 1m
    input_series:
      - series: 'metronome_build_info{namespace="team-a", job="team-a/vllm", pod="vllm-a-0", instance="10.0.0.1:9464", version="0.1.0"}'
        values: '1x5'
      - series: 'up{namespace="team-a", job="team-a/vllm", pod="vllm-a-0", instance="10.0.0.1:9464"}'
        values: '1x5 0x40'
    alert_rule_test:
      - alertname: MetronomeAbsent
        eval_time: 8m
        exp_alerts: []
      - alertname: MetronomeAbsent
        eval_time: 35m
        exp_alerts:
          - exp_labels:
              severity: warning
            exp_annotations:
%s
""" % "\n".join(f"              {k}: {repr_yaml(v)}" for k, v in ann("MetronomeAbsent", "", "namespace team-a pod vllm-a-0").items()))

# 11. SLO burn rates.
p20 = {"0.05": 900, "0.2": 960, "0.3": 1100, "0.5": 1200}    # 20% of gaps over 200 ms
p5 = {"0.05": 1100, "0.2": 1140, "0.3": 1180, "0.5": 1200}   # 5%
p05 = {"0.05": 1150, "0.2": 1194, "0.3": 1200, "0.5": 1200}  # 0.5%
def egress_stalls(route, per_min, steps):
    return counter("metronome_stalls_total", {"pod": "vllm-a-0", "instance": "10.0.0.1:9464", "route": route, "model": "llama", "point": "egress"}, per_min, steps)
# The SLO counts metronome's stalls (gaps over its configured threshold), not a bucket bound.
s = itl("llama", "egress", p20, 1200, 20, route="chat") + egress_stalls("chat", 240, 20) \
    + itl("llama", "egress", p5, 1200, 20, route="completions") + egress_stalls("completions", 60, 20)
test("MetronomeGapSLOFastBurn: 20% of gaps stalled (burn rate 20) pages; 5% (burn rate 5) does not", s, [
    ("MetronomeGapSLOFastBurn", "2m", []),
    ("MetronomeGapSLOFastBurn", "10m", [({"severity": "critical", "route": "chat"},
                                         ann("MetronomeGapSLOFastBurn", "20%", "vllm-a-0 (20%)", route="chat"))]),
])
s = itl("llama", "egress", p5, 1200, 100, route="chat") + egress_stalls("chat", 60, 100) \
    + itl("llama", "egress", p05, 1200, 100, route="completions") + egress_stalls("completions", 6, 100)
test("MetronomeGapSLOSlowBurn: 5% of gaps stalled (burn rate 5) opens a ticket after an hour; 0.5% does not", s, [
    ("MetronomeGapSLOSlowBurn", "30m", []),
    ("MetronomeGapSLOSlowBurn", "90m", [({"severity": "warning", "route": "chat"},
                                         ann("MetronomeGapSLOSlowBurn", "5%", "vllm-a-0 (5%)", route="chat"))]),
    ("MetronomeGapSLOFastBurn", "90m", []),
])

# 11b. Batch hitches (info): most hitches shared with the batch, with hitches enough.
def hitches(model, scope, per_min, steps=50):
    return counter("metronome_hitches_total", {"pod": "vllm-a-0", "instance": "10.0.0.1:9464", "route": "chat", "model": model, "scope": scope}, per_min, steps)
s = hitches("llama", "batch", 24, 50) + hitches("llama", "stream", 6, 50) \
    + hitches("small", "batch", 6, 50) + hitches("small", "stream", 24, 50) \
    + hitches("rare", "batch", 1, 50)
test("MetronomeBatchHitches: 80% of hitches shared with the batch for 30m informs; 20%, or one hitch a minute, does not", s, [
    ("MetronomeBatchHitches", "20m", []),
    ("MetronomeBatchHitches", "48m", [({"severity": "info", "route": "chat", "model": "llama"},
                                       ann("MetronomeBatchHitches", "80%", route="chat", model="llama"))]),
])

# 12. Two deployments serving the same model in two namespaces do not merge: the slow one alerts
# alone, and the recording rules keep one series for each.
s = itl("llama", "egress", p99_400, 1200, 20, namespace="team-a", instance="10.0.0.1:9464", pod="vllm-a-0") \
    + itl("llama", "egress", good, 1200, 20, namespace="team-b", instance="10.0.0.2:9464", pod="vllm-b-0")
test("Two deployments of model llama: team-a's 400ms p99 fires for team-a only; team-b's fast stream is not averaged in", s, [
    ("MetronomeITLP99High", "15m", [({"severity": "critical", "route": "chat", "model": "llama", "point": "egress"},
                                     ann("MetronomeITLP99High", "400ms", "vllm-a-0 (400ms)", route="chat", model="llama"))]),
])
rec = "route_model_point:metronome_inter_token_latency_seconds_count:rate5m"
tests[-1] += f"""    promql_expr_test:
      - expr: {rec}
        eval_time: 15m
        exp_samples:
          - labels: '{rec}{{job="team-a/vllm", model="llama", namespace="team-a", point="egress", route="chat"}}'
            value: 20
          - labels: '{rec}{{job="team-b/vllm", model="llama", namespace="team-b", point="egress", route="chat"}}'
            value: 20
"""

# 13. Both deployments of llama slow: two alerts, each naming its own namespace's pod (team-b's
# pod is the slower, so a query that left out the namespace would name it in both).
s = itl("llama", "egress", p99_400, 1200, 20, namespace="team-a", instance="10.0.0.1:9464", pod="vllm-a-0") \
    + itl("llama", "egress", bad, 1200, 20, namespace="team-b", instance="10.0.0.2:9464", pod="vllm-b-0")
test("Two deployments of model llama, both slow: one alert each, each naming its own pod", s, [
    ("MetronomeITLP99High", "15m", [
        ({"severity": "critical", "route": "chat", "model": "llama", "point": "egress"},
         ann("MetronomeITLP99High", "400ms", "vllm-a-0 (400ms)", route="chat", model="llama")),
        ({"severity": "critical", "namespace": "team-b", "job": "team-b/vllm", "route": "chat", "model": "llama", "point": "egress"},
         ann("MetronomeITLP99High", "440ms", "vllm-b-0 (440ms)", namespace="team-b", job="team-b/vllm", route="chat", model="llama")),
    ]),
])

head = """# promtool test rules deploy/prometheus/tests/metronome_test.yml
# Every alert is shown silent where it should be (before its `for`, below its threshold or its
# traffic floor, or on a healthy series beside the faulty one) and firing where it should be,
# with its exact labels and annotations. Histograms list only some buckets (0.05 0.2 0.3 0.5
# +Inf for gaps): enough for histogram_quantile, and the `le` values are those metronome exports.
rule_files:
  - ../rules/metronome.rules.yml
  - ../rules/metronome.alerts.yml
evaluation_interval: 1m
tests:
"""
import sys
out = sys.argv[1] if len(sys.argv) > 1 else "deploy/prometheus/tests/metronome_test.yml"
open(out, "w").write(head + "\n".join(tests))