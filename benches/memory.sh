#!/usr/bin/env bash
# What CLIENTS concurrent downloads hold in memory, per route: a fresh rangeway for each route
# (passthrough, checksum+aes128gcm), CLIENTS wrk connections downloading a SIZE_MIB object for
# DURATION seconds, in front of one nginx origin. Prints rangeway's resident memory idle (after
# one download), its peak under load (VmHWM), what that is per download, MB/s, and CPU s/GB —
# rangeway's, and the whole machine's (see machine_seconds in lib.sh).
#
#   bash benches/memory.sh     (CLIENTS=100 SIZE_MIB=10 DURATION=10 REPS=1)
#
# An A/B in one run: BIN_B=PATH (another build) and/or SERVER_B='LINE' (a line for its [server]
# section) add a rangeway "b", measured after each "a" run.
set -euo pipefail
cd "$(dirname "$0")/.."
CLIENTS=${CLIENTS:-100}
SIZE_MIB=${SIZE_MIB:-10}
DURATION=${DURATION:-10}
REPS=${REPS:-1}
source benches/lib.sh
bench_setup rangeway-memory-bench

mkdir -p "$work/root" "$work/origin"
fill_object "$work/root/obj.bin" $((SIZE_MIB << 20))
start_origin 1 8192
"$bin" keygen > "$work/key"

variants=(a)
[[ -n ${BIN_B:-}${SERVER_B:-} ]] && variants+=(b)
printf '%-20s %8s %10s %14s %10s %10s %12s\n' route "idle MiB" "peak MiB" "KiB/download" "MB/s" "CPU s/GB" "machine s/GB"
for _ in $(seq "$REPS"); do
for variant in "${variants[@]}"; do
for route in passthrough checksum+aes128gcm; do
    port=$(free_port)
    run_bin=$bin extra=
    [[ $variant == b ]] && run_bin=${BIN_B:-$bin} extra=${SERVER_B:-}
    { rangeway_conf "$port" "$origin_port" "$extra"
      printf '[[routes]]\npath_prefix = "/aes/"\nupstream = "origin"\nstrip_prefix = true\n'
      printf '  [[routes.middleware]]\n  kind = "checksum"\n  [[routes.middleware]]\n  kind = "aes128gcm"\n'
      printf '  key_file = "%s"\n' "$work/key"; } > "$work/rangeway.toml"
    ulimit -n "$(ulimit -Hn)"
    RUST_LOG=warn start_bg taskset -c 0 "$run_bin" serve --config "$work/rangeway.toml" >"$work/rangeway.log" 2>&1
    pid=$last_pid
    wait_port "$port"
    path=/obj.bin
    [[ $route == passthrough ]] || path=/aes/obj.bin
    curl -sf -o /dev/null "http://127.0.0.1:$port$path"
    idle=$(proc_kib "$pid" VmRSS)
    before=$(cpu_seconds "$pid"); machine_before=$(machine_seconds)
    wrk_download "$CLIENTS" "$DURATION" "http://127.0.0.1:$port$path"
    after=$(cpu_seconds "$pid"); machine_after=$(machine_seconds)
    peak=$(proc_kib "$pid" VmHWM)
    label=$route
    [[ ${#variants[@]} == 1 ]] || label="$variant $route"
    awk -v r="$label" -v i="$idle" -v p="$peak" -v c="$CLIENTS" -v b="$bytes" -v u="$us" \
        -v cpu="$(awk -v a="$after" -v b="$before" 'BEGIN { print a - b }')" \
        -v all="$(awk -v a="$machine_after" -v b="$machine_before" 'BEGIN { print a - b }')" \
        'BEGIN { printf "%-20s %8.1f %10.1f %14.0f %10.0f %10.3f %12.3f\n", r, i / 1024, p / 1024, (p - i) / c, b / u, cpu / (b / 1e9), all / (b / 1e9) }'
    kill "$pid"; wait "$pid" 2>/dev/null || true
done
done
done
