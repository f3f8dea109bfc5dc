#!/usr/bin/env bash
# The proxy benchmark: direct, metronome, nginx, HAProxy and metronome with metering off,
# side by side against one sim, at 100, 1,000 and 10,000 concurrent streams of 20 events/s, then
# the one-core saturation figure. Prints the table and writes it into BENCHMARKS.md.
#
#   scripts/bench.sh                         # the full run (about 40 minutes on 2 cores)
#   scripts/bench.sh --levels 1000 --repeats 1 --no-saturation
#   scripts/bench.sh --smoke                 # CI: 50 streams for 10 s, a tiny c1 and sweep,
#                                            # direct and metronome only
#
# Two more legs measure metronome beside nginx the way the onthebench.ai gateway board does
# (scripts/bench_stream.py): c1, 500 streams per path one at a time on warm keep-alive
# connections, paths alternated stream by stream (added TTFT and added gap, p50 and p99); sweep,
# 1 to 1,024 streams at once (TTFT p50 and stall-free streams). A run without options runs every
# leg; an option shaping the first legs (--levels, --no-saturation, ...) leaves these two out.
#
#   scripts/bench.sh --only c1,sweep                        # both, full size (about 40 minutes)
#   scripts/bench.sh --only c1 --c1-streams 50              # about 4 minutes
#   scripts/bench.sh --only sweep --sweep-levels 1,16,256 --sweep-duration 3
#
# METRONOME_BIN=PATH uses that binary and builds nothing. Everything runs on 127.0.0.1; every
# process it starts is killed on exit. See scripts/bench.py --help for every option.
set -euo pipefail
cd "$(dirname "$0")/.."

smoke=false
for arg in "$@"; do [ "$arg" = "--smoke" ] && smoke=true; done

# A release build is fat-LTO and slow: METRONOME_BIN names one built before.
[ -n "${METRONOME_BIN:-}" ] || cargo build --release --quiet

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
