#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ for a set time and prints executions and coverage.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]      (default 60)
#   TARGETS="sse_scanner beacon" scripts/fuzz.sh 30
#
# Installs cargo-fuzz from crates.io when it is missing. cargo-fuzz passes rustc flags that only
# nightly accepts (-Zsanitizer=address and the sanitizer-coverage passes); the toolchain here is
# stable, so RUSTC_BOOTSTRAP=1 lets stable rustc take them. The targets are built in release
# with debug assertions and AddressSanitizer.
#
# Each target starts from fuzz/seeds/TARGET (hand-written) and from the stream fixtures in
# tests/fixtures (scanners and accountants; config/metronome.toml for the config target; the
# recorded WebSocket sessions of tests/fixtures/websocket for the frame reader); what it
# finds accumulates in fuzz/corpus/TARGET. Unbounded growth is a failure too: libFuzzer stops at
# a resident set over -rss_limit_mb or a single allocation over -malloc_limit_mb, and a run
# slower than -timeout seconds is a hang. Crashes land in fuzz/artifacts/TARGET; logs in
# fuzz/logs. Exits non-zero when any target failed.
set -euo pipefail

SECONDS_PER_TARGET=${1:-60}
TARGETS=${TARGETS:-"sse_scanner ndjson_scanner accounting realtime_accounting config beacon chunked_decoder request_head request_body response_head framing_differential traceparent websocket_reader whole_response"}
RSS_LIMIT_MB=${RSS_LIMIT_MB:-1024}
MALLOC_LIMIT_MB=${MALLOC_LIMIT_MB:-64}
MAX_LEN=${MAX_LEN:-65536}

cd "$(dirname "$0")/.."
ROOT=$PWD

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz is missing: installing it from crates.io" >&2
    cargo install cargo-fuzz --locked
fi
export RUSTC_BOOTSTRAP=1

# Seeds from the fixtures: scanner inputs carry a 9-byte header (bound 65536, a cut seed), the
# accountant inputs 2 bytes (which accountant, which framing), one seed per accountant index.
seed_fixtures() {
    local target=$1 corpus=$ROOT/fuzz/corpus/$1
    mkdir -p "$corpus"
    shopt -s nullglob
    local f name
    case $target in
    sse_scanner | ndjson_scanner)
        local ext=sse
        [[ $target == ndjson_scanner ]] && ext=ndjson
        for f in "$ROOT"/tests/fixtures/*."$ext"; do
            name=$(basename "$f")
            { printf '\xff\x2a\x00\x00\x00\x00\x00\x00\x00'; cat "$f"; } >"$corpus/fixture-$name"
            { printf '\x0f\x99\x51\x00\x00\x00\x00\x00\x00'; cat "$f"; } >"$corpus/fixture-small-$name"
        done
        ;;
    accounting)
        for f in "$ROOT"/tests/fixtures/*.sse "$ROOT"/tests/fixtures/*.ndjson; do
            name=$(basename "$f")
            local mode='\x00'
            [[ $f == *.ndjson ]] && mode='\x01'
            for i in $(seq 0 31); do
                { printf "\\x$(printf %02x "$i")$mode"; cat "$f"; } >"$corpus/fixture-$i-$name"
            done
        done
        ;;
    config)
        cp "$ROOT/config/metronome.toml" "$corpus/fixture-metronome.toml"
        ;;
    websocket_reader)
        # 1 byte of settings (bit 0 client to server, bit 1 deflate, bit 2 no context takeover),
        # then the bound and the cut seed, then one direction of a recorded session.
        for f in "$ROOT"/tests/fixtures/websocket/*.c2s "$ROOT"/tests/fixtures/websocket/*.s2c; do
            name=$(basename "$f")
            local settings=0
            [[ $name == *.c2s ]] && settings=$((settings | 1))
            [[ $name == deflate* ]] && settings=$((settings | 2))
            [[ $name == *no_takeover* ]] && settings=$((settings | 4))
            { printf "\\x$(printf %02x "$settings")"'\xff\x2a\x00\x00\x00\x00\x00\x00\x00'; cat "$f"; } >"$corpus/fixture-$name"
        done
        ;;
    esac
    shopt -u nullglob
}

mkdir -p fuzz/logs
echo "building the fuzz targets (release, debug assertions, AddressSanitizer)..." >&2
cargo fuzz build -O >fuzz/logs/build.log 2>&1 || { tail -30 fuzz/logs/build.log; exit 1; }

failed=()
rows=()
for target in $TARGETS; do
    seed_fixtures "$target"
    mkdir -p "fuzz/corpus/$target" "fuzz/artifacts/$target"
    log=fuzz/logs/$target.log
    echo "fuzzing $target for ${SECONDS_PER_TARGET}s..." >&2
    status=ok
    if ! cargo fuzz run -O "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
        -max_total_time="$SECONDS_PER_TARGET" -timeout=10 \
        -rss_limit_mb="$RSS_LIMIT_MB" -malloc_limit_mb="$MALLOC_LIMIT_MB" \
        -max_len="$MAX_LEN" -print_final_stats=1 >"$log" 2>&1; then
        status=FAILED
        failed+=("$target")
        grep -E "ERROR|panicked|SUMMARY|Test unit written" "$log" | head -5 >&2 || true
    fi
    execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
    rate=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
    rss=$(grep -oE 'stat::peak_rss_mb: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    cov=$(grep -oE 'cov: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)
    ft=$(grep -oE 'ft: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)
    corp=$(grep -oE 'corp: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)
    rows+=("$(printf '%-16s %14s %10s %8s %9s %8s %9s  %s' "$target" "${execs:-?}" "${rate:-?}" \
        "${cov:-?}" "${ft:-?}" "${corp:-?}" "${rss:-?}" "$status")")
done

echo
echo "fuzzing: ${SECONDS_PER_TARGET}s per target, -rss_limit_mb=$RSS_LIMIT_MB -malloc_limit_mb=$MALLOC_LIMIT_MB -timeout=10 -max_len=$MAX_LEN"
printf '%-16s %14s %10s %8s %9s %8s %9s  %s\n' target executions exec/s "cov" features corpus peak_MB result
for row in "${rows[@]}"; do
    echo "$row"
done
if ((${#failed[@]})); then
    echo "FAILED: ${failed[*]} (see fuzz/logs and fuzz/artifacts)" >&2
    exit 1
fi
