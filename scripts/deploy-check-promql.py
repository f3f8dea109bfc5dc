#!/usr/bin/env python3
"""Checks the Grafana dashboard and the Prometheus rules against metronome's metric contract.

    deploy-check-promql.py check          # exits 1 on any problem
    deploy-check-promql.py dashboard-exprs   # prints each dashboard query, variables filled in,
                                             # as "panel title<TAB>expr" (for the end-to-end script)

`check` verifies:
  - deploy/grafana/metronome.json is valid JSON in the classic dashboard model, with a
    `datasource` variable (Prometheus) and `route` and `model` query variables, every panel and
    query on `${datasource}`, and every rate()/increase() window `$__rate_interval`;
  - every dashboard query parses as PromQL: each one, with its variables filled in, becomes a
    recording rule in a throwaway file that `promtool check rules` must accept;
  - `namespace`, `job` and `pod` query variables too, and every query keeping to $namespace and
    $pod (and $route, but for those on vLLM's own metrics, which have no route);
  - every latency quantile of metronome's asks for exemplars (a point links to /streams/{id});
  - every vllm: metric is one vLLM 0.11 exports (VLLM_METRICS below), and each vLLM query copies
    model_name into model with label_replace;
  - every metronome_* metric named by the dashboard or by deploy/prometheus/rules/*.yml is one
    the metric tables document (docs/metrics.md, README, docs/batch.md) or src/ registers
    (histograms with _bucket, _sum or _count), and every `le` selector names a default bucket
    bound of that histogram.
"""

import json
import pathlib
import re
import subprocess
import sys
import tempfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "metronome.json"
RULES = sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.yml"))
METRICS_RS = ROOT / "src" / "metrics" / "mod.rs"

problems = []

# The vLLM 0.11 metrics the dashboard may use (vllm/v1/metrics/loggers.py), with the histograms.
VLLM_METRICS = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
}
VLLM_HISTOGRAMS = {
    "vllm:inter_token_latency_seconds", "vllm:time_to_first_token_seconds",
    "vllm:request_queue_time_seconds", "vllm:e2e_request_latency_seconds",
    "vllm:time_per_output_token_seconds",
}


def check_vllm(where, expr):
    for name in re.findall(r"(vllm:[a-z_]+)", expr):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if name not in VLLM_METRICS and base not in VLLM_HISTOGRAMS:
            problems.append(f"{where}: {name} is not a metric vLLM 0.11 exports")
    if "vllm:" in expr and 'label_replace(' not in expr:
        problems.append(f"{where}: a vLLM query that does not copy model_name into model")


# Where the metric names come from. The documented tables are the contract: docs/metrics.md
# (every family, with its type) when the tree has it, README's table and docs/batch.md's; the
# registrations in src/ add what a table may lag. A name documented but not yet registered here
# (another branch's family) passes this check; tests/it/docs.rs holds the tables to the binary.
DOC_TABLES = [ROOT / "docs" / "metrics.md", ROOT / "README.md", ROOT / "docs" / "batch.md"]
REGISTRATIONS = [METRICS_RS, ROOT / "src" / "batch" / "live.rs"]
# Families without a route label (the queries on them cannot keep to $route).
NO_ROUTE = {"metronome_batch_episodes_total", "metronome_build_info", "metronome_config_reload_failures_total",
            "metronome_beacons_total"}


def documented():
    """metronome_* names in the documentation's metric tables, and those a table types histogram."""
    names, histograms = set(), set()
    for path in DOC_TABLES:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            if not line.startswith("|"):
                continue
            cells = [c.strip() for c in line.strip("|").split("|")]
            for name in re.findall(r"`(?:metronome_)?([a-z_]+)(?:\{[^`]*\})?`", cells[0]):
                full = "metronome_" + name
                if name.startswith(("otlp_", "gen_ai")) and not full.startswith("metronome_otlp"):
                    continue
                names.add(full)
                if any("histogram" in c for c in cells[1:2]) or re.search(r"_(seconds|ratio)$", name):
                    histograms.add(full)
    return names, histograms


def contract():
    """Metric names: the documented tables', and those src/ registers; which are histograms."""
    names, histograms = documented()
    for path in REGISTRATIONS:
        text = path.read_text()
        names |= set(re.findall(r'"(metronome_[a-z_]+)"', text))
        histograms |= set(re.findall(r'(?:hist|rich)\(\s*"(metronome_[a-z_]+)"', text))
    # Count histograms (tokens per event, events per frame, request tokens, episode sizes).
    histograms |= {n for n in names if n.endswith(("_per_event", "_per_frame", "_request_tokens",
                                                   "_episode_streams", "_episode_arrivals"))}
    return names, histograms


def default_bounds():
    """The default `le` values of each bucket family, from config/metronome.toml's [buckets]."""
    import tomllib
    buckets = tomllib.loads((ROOT / "config" / "metronome.toml").read_text())["buckets"]
    return {k: {fmt(v) for v in vs} | {"+Inf"} for k, vs in buckets.items()}


def fmt(v):
    """As metronome writes a bound in `le` (Rust's Display of an f64: 0.00001, 2560)."""
    return ("%.12f" % float(v)).rstrip("0").rstrip(".")


BUCKET_FAMILY = {
    "metronome_inter_token_latency_seconds": "itl",
    "metronome_time_per_output_token_seconds": "itl",
    "metronome_time_to_first_token_seconds": "ttft",
    "metronome_time_to_first_byte_seconds": "ttft",
    "metronome_request_duration_seconds": "ttft",
    "metronome_proxy_delay_seconds": "proxy_delay",
    "metronome_stall_duration_seconds": "stall_duration",
    "metronome_stream_jank_ratio": "jank_ratio",
    "metronome_tokens_per_event": "tokens_per_event",
    "metronome_events_per_frame": "events_per_frame",
}


def check_metrics(where, expr, names, histograms, bounds):
    for m in re.finditer(r"(?<![:\w])(metronome_[a-z_]+)(\{[^}]*\})?", expr):
        name, selector = m.group(1), m.group(2) or ""
        base = name
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and name[: -len(suffix)] in histograms:
                base = name[: -len(suffix)]
        if base not in names:
            problems.append(f"{where}: {name} is not a metric metronome exports")
            continue
        for le in re.findall(r'le="([^"]*)"', selector):
            family = BUCKET_FAMILY.get(base)
            if family and le not in bounds[family]:
                problems.append(f"{where}: le=\"{le}\" is not a default bound of {base}")


def fill(expr):
    return (expr.replace("$__rate_interval", "1m").replace("${datasource}", "")
            .replace("$route", ".*").replace("$model", ".*").replace("$namespace", ".*")
            .replace("$job", ".*").replace("$pod", ".*"))


def dashboard_targets(d):
    for panel in d.get("panels", []):
        for t in panel.get("targets", []):
            yield panel, t


def check_dashboard(names, histograms, bounds):
    try:
        d = json.loads(DASHBOARD.read_text())
    except (OSError, json.JSONDecodeError) as e:
        problems.append(f"{DASHBOARD}: not valid JSON: {e}")
        return []
    for key in ("title", "uid", "panels", "templating", "schemaVersion"):
        if key not in d:
            problems.append(f"dashboard: no `{key}`")
    variables = {v.get("name"): v for v in d.get("templating", {}).get("list", [])}
    ds = variables.get("datasource", {})
    if ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problems.append("dashboard: no `datasource` variable of type datasource for prometheus")
    for name in ("namespace", "job", "pod", "route", "model"):
        v = variables.get(name, {})
        if v.get("type") != "query" or v.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(f"dashboard: no `{name}` query variable on ${{datasource}}")
        else:
            check_metrics(f"dashboard variable {name}", v.get("definition", ""), names, histograms, bounds)
    exprs = []
    for panel in d.get("panels", []):
        if panel.get("type") == "row":
            continue
        title = panel.get("title", "?")
        if panel.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(f"panel {title!r}: datasource is not ${{datasource}}")
        if not panel.get("targets"):
            problems.append(f"panel {title!r}: no query")
        for t in panel.get("targets", []):
            expr = t.get("expr", "")
            if t.get("datasource", {}).get("uid") != "${datasource}":
                problems.append(f"panel {title!r} query {t.get('refId')}: datasource is not ${{datasource}}")
            for window in re.findall(r"\b(?:rate|increase|irate)\([^()]*\[([^\]]+)\]", expr):
                if window != "$__rate_interval":
                    problems.append(f"panel {title!r}: window [{window}] instead of [$__rate_interval]")
            vllm_only = "vllm:" in expr and "metronome_" not in expr
            no_route = set(re.findall(r"metronome_[a-z_]+", expr)) <= NO_ROUTE
            for var in ("$namespace", "$pod") + (() if vllm_only or no_route else ("$route",)):
                if var not in expr:
                    problems.append(f"panel {title!r}: the query ignores {var}")
            if panel.get("type") == "timeseries" and "histogram_quantile" in expr and "metronome_" in expr \
                    and "_seconds_bucket" in expr and not t.get("exemplar"):
                problems.append(f"panel {title!r}: a latency query without exemplars on (they link to /streams/{{id}})")
            check_vllm(f"panel {title!r}", expr)
            check_metrics(f"panel {title!r}", expr, names, histograms, bounds)
            exprs.append((title, fill(expr)))
    # Every expression must parse: promtool checks them as recording rules.
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}:check", "expr": e} for i, (_, e) in enumerate(exprs)]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump(rules, f)
    out = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True, text=True)
    pathlib.Path(f.name).unlink()
    if out.returncode != 0:
        problems.append(f"dashboard: promtool rejects a query:\n{out.stdout}{out.stderr}")
    else:
        print(f"  ok    dashboard: {len(exprs)} queries parse (promtool check rules)")
    return exprs


def check_rules(names, histograms, bounds):
    count = 0
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                name = rule.get("record") or rule.get("alert")
                check_metrics(f"{path.name} {name}", rule["expr"], names, histograms, bounds)
                count += 1
    if not problems:
        print(f"  ok    rules: {count} rules name only exported metrics and default bucket bounds")


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "check"
    names, histograms = contract()
    bounds = default_bounds()
    if what == "dashboard-exprs":
        d = json.loads(DASHBOARD.read_text())
        for panel, t in dashboard_targets(d):
            print(f"{panel['title']}\t{fill(t['expr'])}")
        return 0
    exprs = check_dashboard(names, histograms, bounds)
    check_rules(names, histograms, bounds)
    for p in problems:
        print(f"  FAIL  {p}")
    if problems:
        return 1
    print(f"  ok    dashboard: {len(exprs)} queries name only exported metrics")
    return 0


if __name__ == "__main__":
    sys.exit(main())
