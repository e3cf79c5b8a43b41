#!/usr/bin/env bash
# Throughput of one large download: curl from nginx directly, then the same file through rangeway
# (release build, one thread) in front of that nginx, on a passthrough route (which continues
# broken bodies: `upstream_resume` is on by default), on one with `upstream_resume = false` (what
# the default costs), and on routes with
# middleware (checksum, aes128gcm, gzip level 1 and 6), each repeated; prints MB/s delivered per
# run, the medians, each route's share of passthrough, and rangeway's CPU seconds (user+system,
# all threads) per GB of origin bytes. Then the latency of small passthrough requests, alone and
# while two gzip level-6 downloads run (compression must not stall the event loop).
#
#   bash benches/routes.sh [SIZE_MIB] [RUNS]      (defaults: 1024 MiB, 5 runs)
#
# Everything listens on 127.0.0.1 ports chosen at run time and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
size_mib=${1:-1024}
runs=${2:-5}
bash scripts/deps.sh --bench
cargo build --release --bin rangeway >/dev/null
source benches/lib.sh
bin="$(release_dir)/rangeway"
bench_init rangeway-routes-bench

mkdir -p "$work/root" "$work/nginx"
fill_object "$work/root/big.bin" $((size_mib * 1024 * 1024))
printf 'sixteen bytes..\n' > "$work/root/small.bin"
"$bin" keygen > "$work/key"   # base64url: plain base64 may hold + or /, which rangeway refuses

nginx_port=$(free_port)
origin_nginx_conf "$work/nginx" "$nginx_port" "$work/root"
start_nginx "$work/nginx"

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
[[routes]]
path_prefix = "/no-resume/"
upstream = "origin"
strip_prefix = true
upstream_resume = false
[[routes]]
path_prefix = "/checksum/"
upstream = "origin"
strip_prefix = true
  [[routes.middleware]]
  kind = "checksum"
  algorithms = ["sha256", "crc32"]
[[routes]]
path_prefix = "/aes128gcm/"
upstream = "origin"
strip_prefix = true
  [[routes.middleware]]
  kind = "aes128gcm"
  key_file = "$work/key"
[[routes]]
path_prefix = "/gzip1/"
upstream = "origin"
strip_prefix = true
  [[routes.middleware]]
  kind = "gzip"
  level = 1
[[routes]]
path_prefix = "/gzip6/"
upstream = "origin"
strip_prefix = true
  [[routes.middleware]]
  kind = "gzip"
  level = 6
CONF
RUST_LOG=warn start_bg "$bin" serve --config "$work/rangeway.toml" >/dev/null
rangeway_pid=$last_pid
wait_port "$nginx_port"
wait_port "$proxy_port"

speed() { curl -s -o /dev/null -w '%{speed_download}' "$1" | awk '{ printf "%.0f", $1 / 1e6 }'; }

# One pass per gzip route first: it builds the block index (the first response streams chunked).
for level in 1 6; do curl -s -o /dev/null "http://127.0.0.1:$proxy_port/gzip$level/big.bin"; done

routes=(direct passthrough no-resume checksum aes128gcm gzip1 gzip6)
url_of() {
  case $1 in
    direct) echo "http://127.0.0.1:$nginx_port/big.bin" ;;
    passthrough) echo "http://127.0.0.1:$proxy_port/big.bin" ;;
    *) echo "http://127.0.0.1:$proxy_port/$1/big.bin" ;;
  esac
}
declare -A speeds cpu
for route in "${routes[@]}"; do cpu[$route]=0; done
for i in $(seq "$runs"); do
  line="run $i:"
  for route in "${routes[@]}"; do
    before=$(cpu_seconds "$rangeway_pid")
    s=$(speed "$(url_of "$route")")
    cpu[$route]=$(awk -v a="$(cpu_seconds "$rangeway_pid")" -v b="$before" -v c="${cpu[$route]}" 'BEGIN { print c + a - b }')
    speeds[$route]="${speeds[$route]:-} $s"
    line="$line $route $s"
  done
  echo "$line (MB/s delivered)"
done
gb=$(awk -v m="$size_mib" -v r="$runs" 'BEGIN { print m * 1048576 * r / 1e9 }')
echo "object ${size_mib} MiB (half random, half text), ${runs} runs, rangeway on 1 thread"
pass=$(printf '%s\n' ${speeds[passthrough]} | median)
printf '%-12s %10s %14s %16s\n' route "MB/s" "of passthrough" "CPU s/GB origin"
for route in "${routes[@]}"; do
  m=$(printf '%s\n' ${speeds[$route]} | median)
  share=$(awk -v m="$m" -v p="$pass" 'BEGIN { printf "%.0f%%", 100 * m / p }')
  per_gb=$( [ "$route" = direct ] && echo "-" || awk -v c="${cpu[$route]}" -v g="$gb" 'BEGIN { printf "%.3f", c / g }')
  printf '%-12s %10s %14s %16s\n' "$route" "$m" "$share" "$per_gb"
done

# Latency of small passthrough requests, alone and beside two gzip level-6 downloads.
latencies() {
  for _ in $(seq 300); do
    curl -s -o /dev/null -w '%{time_total}\n' "http://127.0.0.1:$proxy_port/small.bin"
  done | sort -n | awk '{ a[NR] = $1 * 1000 } END { printf "p50 %.2f ms, p99 %.2f ms", a[int(NR * 0.5)], a[int(NR * 0.99)] }'
}
echo "small requests alone: $(latencies)"
for _ in 1 2; do
  ( for _ in $(seq 3); do curl -s -o /dev/null "http://127.0.0.1:$proxy_port/gzip6/big.bin"; done ) &
  pids+=($!)
done
sleep 0.5
echo "small requests beside two gzip level-6 downloads: $(latencies)"
