#!/usr/bin/env bash
# Throughput of one large passthrough download: curl from nginx directly, then the same file
# through rangeway (release build) in front of that nginx, each repeated; prints MB/s per run,
# the medians, and rangeway's CPU seconds (user+system, all threads) per GB moved.
#
#   bash benches/passthrough.sh [SIZE_MIB] [RUNS]      (defaults: 1024 MiB, 5 runs)
#
# Everything listens on 127.0.0.1 ports chosen at run time and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
size_mib=${1:-1024}
runs=${2:-5}
bash scripts/deps.sh
cargo build --release --bin rangeway >/dev/null
bin="${CARGO_TARGET_DIR:-target}/release/rangeway"

work=$(mktemp -d /tmp/rangeway-bench.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
mkdir -p "$work/root" "$work/nginx"
head -c $((size_mib * 1024 * 1024)) /dev/urandom > "$work/root/big.bin"

nginx_port=$(free_port)
cat > "$work/nginx/nginx.conf" <<CONF
master_process off;
$( [ "$(id -u)" = 0 ] && echo "user root;" )
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $work/nginx/tmp; proxy_temp_path $work/nginx/tmp;
  fastcgi_temp_path $work/nginx/tmp; uwsgi_temp_path $work/nginx/tmp; scgi_temp_path $work/nginx/tmp;
  sendfile on;
  server { listen 127.0.0.1:$nginx_port; root $work/root; location / { } }
}
CONF
nginx -p "$work/nginx" -e "$work/nginx/error.log" -c "$work/nginx/nginx.conf" -g 'daemon off;' &
pids+=($!)

proxy_port=$(free_port); admin_port=$(free_port)
cat > "$work/rangeway.toml" <<CONF
[server]
listen = "127.0.0.1:$proxy_port"
admin_listen = "127.0.0.1:$admin_port"
threads = 1
[upstreams.origin]
url = "http://127.0.0.1:$nginx_port"
[[routes]]
path_prefix = "/"
upstream = "origin"
CONF
RUST_LOG=warn "$bin" serve --config "$work/rangeway.toml" >/dev/null &
rangeway_pid=$!
pids+=($rangeway_pid)
for port in "$nginx_port" "$proxy_port"; do
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
done

cpu_seconds() { awk '{ print ($14 + $15) / 100 }' "/proc/$rangeway_pid/stat"; }
speed() { curl -s -o /dev/null -w '%{speed_download}' "$1" | awk '{ printf "%.0f", $1 / 1e6 }'; }
median() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

direct=(); proxied=()
cpu_before=$(cpu_seconds)
for i in $(seq "$runs"); do
  direct+=("$(speed "http://127.0.0.1:$nginx_port/big.bin")")
  proxied+=("$(speed "http://127.0.0.1:$proxy_port/big.bin")")
  echo "run $i: direct ${direct[-1]} MB/s, through rangeway ${proxied[-1]} MB/s"
done
cpu_after=$(cpu_seconds)
d=$(printf '%s\n' "${direct[@]}" | median)
p=$(printf '%s\n' "${proxied[@]}" | median)
gb=$(awk -v m="$size_mib" -v r="$runs" 'BEGIN { print m * 1048576 * r / 1e9 }')
echo "object ${size_mib} MiB, ${runs} runs, rangeway on 1 thread"
echo "median: direct ${d} MB/s, through rangeway ${p} MB/s ($(awk -v p="$p" -v d="$d" 'BEGIN { printf "%.0f", 100 * p / d }')% of direct)"
echo "rangeway CPU: $(awk -v a="$cpu_after" -v b="$cpu_before" -v g="$gb" 'BEGIN { printf "%.3f", (a - b) / g }') s per GB"
