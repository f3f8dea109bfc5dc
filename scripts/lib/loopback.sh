# Shared by the measurement scripts (instructions-, syscalls- and rss-per-...): a scratch
# directory and a list of processes, both cleaned up on exit; loopback port helpers.
# Source it; it sets `work` and `pids` and installs the EXIT trap.

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# A free TCP port on 127.0.0.1.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits up to 20 s until something listens on 127.0.0.1:$1.
wait_port() {
  for _ in $(seq 1 400); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "nothing listens on 127.0.0.1:$1" >&2
  return 1
}

# Writes a metronome configuration to $work/m.toml: proxy on 127.0.0.1:$1, admin on :$2, the
# upstream on :$3, metering $4 (true/false), server.threading $5 (default per_core),
# server.upstream_client $6 (default: the key is not written, for binaries older than it).
# PROXY_TOML, when set, is appended (more tables: `PROXY_TOML=$'[timeline]\nmax_frames = 0'`).
proxy_config() {
  local client_line=""
  [ "${6:-default}" = default ] || client_line="upstream_client = \"$6\""
  cat >"$work/m.toml" <<TOML
[server]
listen = "127.0.0.1:$1"
admin = "127.0.0.1:$2"
upstream = "http://127.0.0.1:$3"
drain_grace = "1s"
threading = "${5:-per_core}"
$client_line

[readiness]
check_upstream = false

[metering]
enabled = $4
${PROXY_TOML:-}
TOML
}

# Starts `$1 sim` on a free port with the rest of the arguments, logging to $work/sim.log; sets
# `sim` (its pid, also in `pids`) and `sim_port`, and returns once it listens.
start_sim() {
  local bin=$1
  shift
  sim_port=$(free_port)
  "$bin" sim --listen "127.0.0.1:$sim_port" "$@" >"$work/sim.log" 2>&1 &
  sim=$!
  pids+=("$sim")
  wait_port "$sim_port"
}

# Stops the sim `start_sim` started.
stop_sim() {
  kill "$sim" 2>/dev/null || true
  wait "$sim" 2>/dev/null || true
}
