#!/usr/bin/env bash
# `rangeway get` beside aria2c and curl: one SIZE_MIB download from an nginx origin over loopback
# (nginx on CPU $ORIGIN_CPU, each client on CPU $CLIENT_CPU), REPS runs alternating:
#
#   rangeway get -x CONNS           no digest published: nothing to verify
#   rangeway get -x CONNS --sha256  the same, verified against a known SHA-256 while it downloads
#   aria2c -x CONNS -s CONNS        as many connections, pieces of its own size
#   curl                            one connection
#
# Wall time (MB/s) and the client's CPU seconds (user + system) for the download, medians, and
# each as a ratio of aria2c's. Every client's file is checked against the object first.
#
#   bash benches/get.sh        (SIZE_MIB=1024 CONNS=8 REPS=5)
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MIB=${SIZE_MIB:-1024}
CONNS=${CONNS:-8}
REPS=${REPS:-5}
ORIGIN_CPU=${ORIGIN_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
source benches/lib.sh
bench_setup rangeway-get-bench

mkdir -p "$work/root" "$work/origin" "$work/out"
head -c $((SIZE_MIB << 20)) /dev/urandom > "$work/root/obj.bin"
sha=$(sha256sum "$work/root/obj.bin" | cut -d' ' -f1)
start_origin "$ORIGIN_CPU"
url="http://127.0.0.1:$origin_port/obj.bin"

declare -A clients=(
    [get]="$bin get -q -x $CONNS -o $work/out/get.bin $url"
    [get-sha256]="$bin get -q -x $CONNS --sha256 $sha -o $work/out/get-sha256.bin $url"
    [aria2c]="aria2c -q -x $CONNS -s $CONNS --allow-overwrite=true --auto-file-renaming=false -d $work/out -o aria2c.bin $url"
    [curl]="curl -sS -o $work/out/curl.bin $url"
)
order=(get get-sha256 aria2c curl)

# run NAME: one download by client NAME into a fresh file, appending "seconds cpu" to its list.
run() {
    rm -f "$work/out/$1.bin"*
    sync
    local TIMEFORMAT='%R %U %S' timing
    # shellcheck disable=SC2086 # the client's command line is meant to split
    timing=$( { time taskset -c "$CLIENT_CPU" ${clients[$1]} >/dev/null 2>&1; } 2>&1 )
    read -r wall user sys <<<"$timing"
    echo "$wall $user $sys" | awk '{ print $1, $2 + $3 }' >> "$work/$1.times"
}

for name in "${order[@]}"; do
    run "$name"
    [[ $(sha256sum "$work/out/$name.bin" | cut -d' ' -f1) == "$sha" ]] \
        || { echo "$name: the file is not the object" >&2; exit 1; }
    rm -f "$work/$name.times"
done
for _ in $(seq "$REPS"); do
    for name in "${order[@]}"; do run "$name"; done
done

printf '%s MiB over loopback from nginx, %s connections, median of %s runs\n' "$SIZE_MIB" "$CONNS" "$REPS"
printf '%-12s %10s %10s %12s %12s\n' client MB/s CPU-s "MB/s÷aria2c" "CPU÷aria2c"
ref_wall=$(cut -d' ' -f1 "$work/aria2c.times" | median)
ref_cpu=$(cut -d' ' -f2 "$work/aria2c.times" | median)
for name in "${order[@]}"; do
    wall=$(cut -d' ' -f1 "$work/$name.times" | median)
    cpu=$(cut -d' ' -f2 "$work/$name.times" | median)
    awk -v n="$name" -v mib="$SIZE_MIB" -v w="$wall" -v c="$cpu" -v rw="$ref_wall" -v rc="$ref_cpu" \
        'BEGIN { printf "%-12s %10.0f %10.3f %12.2f %12.2f\n", n, mib * 1.048576 / w, c, rw / w, c / rc }'
done
