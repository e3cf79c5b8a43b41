#!/usr/bin/env bash
# What shaped downloads cost: CLIENTS connections (wrk) downloading a SIZE_MIB object from a
# route paced to RATE per response, beside the same clients on the unshaped passthrough route,
# in front of one nginx origin, DURATION seconds each: MB/s delivered, rangeway's CPU seconds per
# GB, and its peak resident memory (VmHWM) after each, for each count in CLIENTS (space-separated).
#
#   bash benches/shaped.sh     (CLIENTS="500 1000" RATE=1MiB SIZE_MIB=64 DURATION=15)
#
# The shaped route's delivery should be CLIENTS × RATE (the clients ask faster than that); its
# CPU per GB is the figure to hold against the passthrough route's.
set -euo pipefail
cd "$(dirname "$0")/.."
CLIENTS=${CLIENTS:-500 1000}
RATE=${RATE:-1MiB}
SIZE_MIB=${SIZE_MIB:-64}
DURATION=${DURATION:-15}
source benches/lib.sh
bench_setup rangeway-shaped-bench

mkdir -p "$work/root" "$work/origin"
fill_object "$work/root/obj.bin" $((SIZE_MIB << 20))
start_origin 1 8192

printf '%-8s %-12s %10s %12s %14s\n' clients route "MB/s" "CPU s/GB" "peak RSS MiB"
for clients in $CLIENTS; do
    for route in shaped passthrough; do
        # A fresh rangeway for each, so that its peak memory is this run's.
        port=$(free_port)
        { rangeway_conf "$port" "$origin_port"
          printf '[[routes]]\npath_prefix = "/shaped/"\nupstream = "origin"\nstrip_prefix = true\n'
          printf '[routes.rate_limit]\nrate = "%s"\n' "$RATE"; } > "$work/rangeway.toml"
        ulimit -n "$(ulimit -Hn)"
        RUST_LOG=warn start_bg taskset -c 0 "$bin" serve --config "$work/rangeway.toml" >"$work/rangeway.log" 2>&1
        pid=$last_pid
        wait_port "$port"
        path=/obj.bin
        [[ $route == shaped ]] && path=/shaped/obj.bin
        before=$(cpu_seconds "$pid")
        wrk_download "$clients" "$DURATION" "http://127.0.0.1:$port$path"
        after=$(cpu_seconds "$pid")
        mbs=$(awk -v b="$bytes" -v u="$us" 'BEGIN { printf "%.0f", b / u }')
        cpu=$(awk -v a="$after" -v b="$before" -v n="$bytes" 'BEGIN { printf "%.3f", (a - b) / (n / 1e9) }')
        rss=$(awk -v k="$(proc_kib "$pid" VmHWM)" 'BEGIN { printf "%.0f", k / 1024 }')
        printf '%-8s %-12s %10s %12s %14s\n' "$clients" "$route" "$mbs" "$cpu" "$rss"
        kill "$pid"; wait "$pid" 2>/dev/null || true
    done
done
