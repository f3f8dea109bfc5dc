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

# Writes $work/nginx.conf: nginx as the benchmark runs it (scripts/bench.py), on 127.0.0.1:$1 in
# front of the upstream on :$2, `proxy_buffering off`, keep-alive upstream connections, as many
# connections as the open-file limit allows. $3 worker processes (default auto); with 1, the
# master process does the work itself (`master_process off`), so that a tool following one
# process (valgrind) sees all of it. Start it with `nginx -c "$work/nginx.conf" -p "$work"`.
nginx_config() {
  local workers=${3:-auto} master="" files
  [ "$workers" = 1 ] && master="master_process off;"
  files=$(ulimit -n)
  mkdir -p "$work/nginx"
  cat >"$work/nginx.conf" <<CONF
worker_processes $workers;
$master
daemon off;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
worker_rlimit_nofile $files;
events { worker_connections $files; multi_accept on; }
http {
    access_log off;
    client_body_temp_path $work/nginx;
    proxy_temp_path $work/nginx;
    keepalive_timeout 300s;
    # Kept connections stay kept (nginx's default closes them after 1,000 requests).
    keepalive_requests 1000000;
    upstream sim { server 127.0.0.1:$2; keepalive 4096; keepalive_requests 1000000; }
    server {
        listen 127.0.0.1:$1 backlog=4096;
        location / {
            proxy_pass http://sim;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 300s;
        }
    }
}
CONF
}
