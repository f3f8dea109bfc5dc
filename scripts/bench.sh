#!/usr/bin/env bash
# The proxy benchmark: direct, metronome, nginx, HAProxy and metronome with metering off,
# side by side against one sim, at 100, 1,000 and 10,000 concurrent streams of 20 events/s, then
# the one-core saturation figure. Prints the table and writes it into BENCHMARKS.md.
#
#   scripts/bench.sh                         # the full run (about 40 minutes on 2 cores)
#   scripts/bench.sh --levels 1000 --repeats 1 --no-saturation
#   scripts/bench.sh --smoke                 # CI: 50 streams for 10 s, direct and metronome only
#
# Everything runs on 127.0.0.1; every process it starts is killed on exit. See scripts/bench.py
# --help for every option.
set -euo pipefail
cd "$(dirname "$0")/.."

smoke=false
for arg in "$@"; do [ "$arg" = "--smoke" ] && smoke=true; done

cargo build --release --quiet

if ! $smoke; then
  missing=()
  command -v nginx >/dev/null 2>&1 || missing+=(nginx)
  command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
  command -v taskset >/dev/null 2>&1 || missing+=(util-linux)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  # Debian's packages may start their own services; the benchmark runs its own instances on its
  # own ports, so a running service costs CPU but does not interfere.
fi

# Thousands of streams need thousands of sockets: raise the soft open-file limit to the hard one.
ulimit -n "$(ulimit -Hn)"

# The benchmark kills what it starts (each process in its own session) on exit and on signals.
exec python3 scripts/bench.py "$@"
