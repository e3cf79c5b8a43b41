#!/usr/bin/env bash
# Two rangeway binaries side by side on the passthrough route, in front of one nginx origin:
# SIZE_MIB downloads, RUNS alternating rounds; MB/s and rangeway's CPU seconds per GB for each,
# and B's ratios to A. For "what did this change cost an unlimited route": build the commit
# before into one binary, the change into another.
#
#   bash benches/ab.sh BIN_A BIN_B [SIZE_MIB] [RUNS]      (defaults: 512 MiB, 5 rounds)
#
# Each rangeway runs as the benches run it (benches/lib.sh: one thread, the memory store).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 2 ]] || { echo "usage: bash benches/ab.sh BIN_A BIN_B [SIZE_MIB] [RUNS]" >&2; exit 2; }
bins=("$1" "$2")
size_mib=${3:-512}
runs=${4:-5}
source benches/lib.sh
bench_init rangeway-ab

mkdir -p "$work/root" "$work/nginx"
fill_object "$work/root/big.bin" $((size_mib << 20))
nginx_port=$(free_port)
origin_nginx_conf "$work/nginx" "$nginx_port" "$work/root"
start_nginx "$work/nginx" taskset -c 1
wait_port "$nginx_port"

ports=() procs=()
for i in 0 1; do
    port=$(free_port)
    rangeway_conf "$port" "$nginx_port" > "$work/$i.toml"
    RUST_LOG=warn start_bg taskset -c 0 "${bins[$i]}" serve --config "$work/$i.toml" >"$work/$i.log" 2>&1
    ports+=("$port"); procs+=("$last_pid")
    wait_port "$port"
done

declare -a speeds=("" "") cpus=("" "") names=(A B)
for run in $(seq "$runs"); do
    line="round $run:"
    for i in 0 1; do
        before=$(cpu_seconds "${procs[$i]}")
        speed=$(taskset -c 1 curl -s -o /dev/null -w '%{speed_download}' "http://127.0.0.1:${ports[$i]}/big.bin")
        after=$(cpu_seconds "${procs[$i]}")
        mbs=$(awk -v s="$speed" 'BEGIN { printf "%.0f", s / 1e6 }')
        cpu=$(awk -v a="$after" -v b="$before" -v m="$size_mib" 'BEGIN { printf "%.3f", (a - b) / (m * 1048576 / 1e9) }')
        speeds[$i]+="$mbs "; cpus[$i]+="$cpu "
        line+=" ${names[$i]} $mbs MB/s $cpu s/GB;"
    done
    echo "$line"
done
for i in 0 1; do
    m[$i]=$(tr ' ' '\n' <<<"${speeds[$i]}" | grep . | median)
    c[$i]=$(tr ' ' '\n' <<<"${cpus[$i]}" | grep . | median)
done
echo "A ${bins[0]}: ${m[0]} MB/s, ${c[0]} CPU s/GB (medians)"
echo "B ${bins[1]}: ${m[1]} MB/s, ${c[1]} CPU s/GB (medians)"
awk -v a="${m[0]}" -v b="${m[1]}" -v ca="${c[0]}" -v cb="${c[1]}" \
    'BEGIN { printf "B/A: %.2fx MB/s, %.2fx CPU per GB\n", b / a, cb / ca }'
