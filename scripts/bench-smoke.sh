#!/usr/bin/env bash
# CI smoke of the proxy benchmark: 50 streams for 10 s through direct and metronome; checks that the
# harness works and that no stream fails. The figures are not checked (too noisy for CI).
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash scripts/bench.sh --smoke "$@"
