# Shared by the end-to-end scripts: a scrape of /metrics that holds every stream whole.
# Source it; it only defines functions.

# Scrapes http://$1/metrics into $2 once no stream is in flight (every
# `metronome_streams_active` series is 0), waiting up to 20 s. A scrape gathers the metric
# families one at a time, in no fixed order, while the last stream may still be being recorded;
# the ledger takes the gauge down shortly before it counts the stream in `metronome_streams_total`
# and `metronome_stream_format_total`, its last steps. So the scrape written to $2 is a new one,
# taken 0.2 s after the gauge was seen at 0.
metrics_when_idle() {
  local admin=$1 out=$2
  for _ in $(seq 1 200); do
    if curl -fs "http://$admin/metrics" >"$out" \
      && grep -q '^metronome_streams_total' "$out" \
      && ! grep -E '^metronome_streams_active\{[^}]*\} ' "$out" | grep -vqE ' 0$'; then
      sleep 0.2
      curl -fs "http://$admin/metrics" >"$out"
      return 0
    fi
    sleep 0.1
  done
  echo "streams were still in flight after 20 s: $(grep '^metronome_streams_active' "$out")" >&2
  return 1
}
