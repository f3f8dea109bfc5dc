#!/usr/bin/env python3
"""Parses an OpenMetrics text exposition (stdin) with prometheus_client's own parser and prints
what tests/it/exposition.rs checks, as JSON: per family its type and unit, per histogram sample
(name, labels, value) and the exemplars (labels, value) of the buckets that carry one.

The parser raises on anything not OpenMetrics 1.0.0 (a missing `# EOF`, a bad exemplar, buckets
out of order), and then this exits 1 with its message. With `--text` the exposition is read as
the Prometheus text format 0.0.4, by prometheus_client's parser of that format.
Install: pip install prometheus_client
"""
import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families as text_format


def main():
    text_string_to_metric_families = text_format if "--text" in sys.argv[1:] else openmetrics
    text = sys.stdin.read()
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser's ValueError, or anything else it raises
        print(f"not OpenMetrics: {e}", file=sys.stderr)
        return 1
    out = []
    for family in families:
        samples = []
        for s in family.samples:
            exemplar = None
            if s.exemplar is not None:
                exemplar = {"labels": s.exemplar.labels, "value": s.exemplar.value,
                            "timestamp": None if s.exemplar.timestamp is None
                            else float(s.exemplar.timestamp)}
            samples.append({"name": s.name, "labels": s.labels, "value": s.value,
                            "exemplar": exemplar})
        out.append({"name": family.name, "type": family.type, "unit": family.unit,
                    "samples": samples})
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
