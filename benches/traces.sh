#!/usr/bin/env bash
# What traces cost small requests: one rangeway per setting — traces off, sampling 1 %, sampling
# 100 % — side by side in front of one nginx origin, each exporting to an nginx that takes OTLP
# posts and answers 200 (a collector elsewhere costs rangeway the same). ROUNDS alternating rounds
# of wrk at CONNS connections for SECONDS each on a 16-byte object; requests/s, rangeway's CPU µs
# per request and p99 per setting, and each one's ratios to "off".
#
#   bash benches/traces.sh [ROUNDS] [SECONDS] [CONNS]      (defaults: 5 rounds, 10 s, 50)
#
# rangeway on CPU 0, nginx and wrk on CPU 1 (benches/lib.sh runs rangeway as the benches do).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
seconds=${2:-10}
conns=${3:-50}
source benches/lib.sh
bench_setup rangeway-traces

mkdir -p "$work/root" "$work/sink/tmp"
head -c 16 /dev/urandom > "$work/root/small.bin"
start_origin 1
sink_port=$(free_port)
cat > "$work/sink/nginx.conf" <<CONF
master_process off;
$(nginx_common "$work/sink")
events { worker_connections 1024; }
http {
$(nginx_http_common "$work/sink")
  server { listen 127.0.0.1:$sink_port; location / { return 200; } }
}
CONF
start_nginx "$work/sink" taskset -c 1
wait_port "$sink_port"

names=(off "1%" "100%")
sections=("" "sampling = 0.01" "sampling = 1")
ports=() procs=()
for i in 0 1 2; do
    port=$(free_port)
    {
        rangeway_conf "$port" "$origin_port"
        if [[ -n ${sections[$i]} ]]; then
            printf '[traces]\nendpoint = "http://127.0.0.1:%s/v1/traces"\n%s\n' "$sink_port" "${sections[$i]}"
        fi
    } > "$work/$i.toml"
    RUST_LOG=warn start_bg taskset -c 0 "$bin" serve --config "$work/$i.toml" >"$work/$i.log" 2>&1
    ports+=("$port") procs+=("$last_pid")
    wait_port "$port"
done

declare -a rates=("" "" "") cpus=("" "" "") p99s=("" "" "")
for round in $(seq "$rounds"); do
    line="round $round:"
    # Each round starts with another setting: none is always measured right after another.
    for i in $(( round % 3 )) $(( (round + 1) % 3 )) $(( (round + 2) % 3 )); do
        before=$(cpu_seconds "${procs[$i]}")
        wrk_download "$conns" "$seconds" "http://127.0.0.1:${ports[$i]}/small.bin"
        after=$(cpu_seconds "${procs[$i]}")
        rate=$(awk -v r="$requests" -v us="$us" 'BEGIN { printf "%.0f", r / (us / 1e6) }')
        cpu=$(awk -v a="$after" -v b="$before" -v r="$requests" 'BEGIN { printf "%.1f", (a - b) * 1e6 / r }')
        rates[$i]+="$rate " cpus[$i]+="$cpu " p99s[$i]+="$p99 "
        line+=" ${names[$i]} $rate req/s $cpu µs/req p99 $((p99 / 1000)) ms;"
    done
    echo "$line"
done
for i in 0 1 2; do
    r[$i]=$(tr ' ' '\n' <<<"${rates[$i]}" | grep . | median)
    c[$i]=$(tr ' ' '\n' <<<"${cpus[$i]}" | grep . | median)
    p[$i]=$(tr ' ' '\n' <<<"${p99s[$i]}" | grep . | median)
done
for i in 0 1 2; do
    awk -v n="${names[$i]}" -v r="${r[$i]}" -v c="${c[$i]}" -v p="${p[$i]}" -v r0="${r[0]}" -v c0="${c[0]}" \
        'BEGIN { printf "%-5s %7.0f req/s %6.1f µs/req p99 %5.1f ms  (%.2fx req/s, %.2fx CPU per request of off)\n", n, r, c, p / 1000, r / r0, c / c0 }'
done
