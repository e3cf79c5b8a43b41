#!/usr/bin/env bash
# Instructions per small request: rangeway against pingora alone, under callgrind.
#
#   bash benches/load/instructions.sh                 (~6 min: valgrind starts slowly)
#   BEFORE_BIN=/path/to/rangeway bash benches/load/instructions.sh   (also the build before a change)
#
# CPU time on a shared 2-core machine moves by 10 % from run to run; instruction counts move by
# about 1 %. So this is the measure for a change to rangeway's per-request work. Each proxy
# (rangeway's passthrough route, then pingora-floor) runs under `valgrind --tool=callgrind` in front
# of the same origin (nginx, a 16-byte object); after a warm-up its counters are zeroed, wrk runs
# DURATION seconds at CONC connections, the counters are dumped and divided by the requests wrk
# completed. Prints both counts, their difference (rangeway's own instructions per request) and
# rangeway's functions by inclusive instructions per request. memcpy's `rep movsb` counts one
# instruction per byte here, so copies weigh more than they cost on the CPU.
#
#   OBJECT_MIB=10 CONC=4 bash benches/load/instructions.sh   (~8 min)
#   CACHE_SIM=1 bash benches/load/instructions.sh              (~8 min)
#
# counts per MiB relayed instead, of an OBJECT_MIB object: rangeway splicing it (a route with
# `cache = false`), rangeway answering it from its slice cache (a warm hit, sent with sendfile),
# and pingora alone copying it. The kernel's part of a splice or a sendfile is not counted: these
# are rangeway's own instructions, what a change to its body path moves.
#
# CACHE_SIM=1 runs valgrind's cache model too (`--cache-sim=yes`) and prints each small request's
# first-level misses, instruction and data: where a request's CPU time goes beyond its
# instruction count (a machine without hardware counters, as a VM often is, has no other).
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${DURATION:-15}
CONC=${CONC:-50}
TOP=${TOP:-25}
BEFORE_BIN=${BEFORE_BIN:-}   # a rangeway binary of the build before a change, counted the same way
OBJECT_MIB=${OBJECT_MIB:-}   # per MiB of a large object instead (above)
CACHE_SIM=${CACHE_SIM:-0}    # 1: first-level cache misses a small request too (above)

source benches/lib.sh
small_request_setup rangeway-instructions
if [[ -n $OBJECT_MIB ]]; then
    fill_object "$work/root/large.bin" $((OBJECT_MIB << 20))
    # Fresh by RFC 9111's heuristic for a day: every download after the first is a hit.
    touch -d '10 days ago' "$work/root/large.bin"
    # The route rangeway_conf ends with ("/") splices; /cached/ answers from the slice cache.
    { printf 'cache = false\n[[routes]]\npath_prefix = "/cached/"\nupstream = "origin"\nstrip_prefix = true\n'
      printf '[cache]\ndir = "%s"\nmax_size = "%dMiB"\n' "$work/slices" $((4 * OBJECT_MIB + 64)); } \
        >> "$work/rangeway.toml"
fi

# count NAME PORT PATHS CMD...: prints "requests bytes instructions" for CMD under callgrind, for
# each of PATHS (space-separated) in turn, its counters zeroed after a warm-up of each; with
# CACHE_SIM=1, then its first-level instruction and data cache misses.
count() {
    local name=$1 port=$2 paths=$3 sim=()
    shift 3
    ((CACHE_SIM)) && sim=(--cache-sim=yes)
    RUST_LOG=warn start_bg valgrind --tool=callgrind "${sim[@]}" -q \
        --callgrind-out-file="$work/$name.out" "$@" >"$work/$name.log" 2>&1
    local pid=$last_pid dump=0
    wait_port "$port" 180
    for path in $paths; do
        wrk -t1 -c "$CONC" -d 5s "http://127.0.0.1:$port$path" >/dev/null
        callgrind_control -z "$pid" >/dev/null
        local result
        result=$(wrk -t1 -c "$CONC" -d "${DURATION}s" --timeout 60s -s benches/load/wrk.lua \
            "http://127.0.0.1:$port$path" | sed -n 's/^WRK requests=\([0-9]*\) bytes=\([0-9]*\).*/\1 \2/p')
        callgrind_control -d "$pid" >/dev/null
        dump=$((dump + 1))
        # The totals' columns with the cache model: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw, each
        # followed by its share.
        echo "$result $(callgrind_annotate "$work/$name.out.$dump" | awk '/PROGRAM TOTALS/ {
            gsub(",", ""); if (NF > 4) print $1, $7, $9 + $11; else print $1 }')"
    done
    kill "$pid"
    wait "$pid" 2>/dev/null || true
}

if [[ -n $OBJECT_MIB ]]; then
    # per_mib "REQUESTS BYTES TOTAL": instructions per MiB received.
    per_mib() { awk '{ printf "%.0f", $3 / ($2 / 1048576) }' <<<"$1"; }
    echo "counting per MiB of a ${OBJECT_MIB} MiB object, ${DURATION} s at $CONC connections each..."
    { read -r spliced; read -r hit; } < <(count rangeway "$rangeway_port" "/large.bin /cached/large.bin" \
        "$release/rangeway" serve --config "$work/rangeway.toml")
    if [[ -n $BEFORE_BIN ]]; then
        rm -rf "$work/slices"
        { read -r before_spliced; read -r before_hit; } < <(count rangeway-before "$rangeway_port" \
            "/large.bin /cached/large.bin" "$BEFORE_BIN" serve --config "$work/rangeway.toml")
    fi
    read -r copied < <(count pingora "$pingora_port" /large.bin \
        "$release/examples/pingora-floor" "127.0.0.1:$pingora_port" "127.0.0.1:$origin_port")
    echo
    echo "instructions per MiB delivered (callgrind, $CONC connections; the kernel's part not counted):"
    echo "  rangeway, spliced          $(per_mib "$spliced")"
    echo "  rangeway, a cache hit      $(per_mib "$hit")"
    if [[ -n $BEFORE_BIN ]]; then
        echo "  the build before, spliced  $(per_mib "$before_spliced")"
        echo "  the build before, a hit    $(per_mib "$before_hit")"
    fi
    echo "  pingora alone, copied      $(per_mib "$copied")"
    exit 0
fi

echo "rangeway under callgrind: ${DURATION} s at $CONC connections..."
read -r rangeway_requests _ rangeway_total rangeway_i1 rangeway_d1 < <(count rangeway "$rangeway_port" /small.bin \
    "$release/rangeway" serve --config "$work/rangeway.toml")
if [[ -n $BEFORE_BIN ]]; then
    echo "the build before under callgrind: ${DURATION} s at $CONC connections..."
    read -r before_requests _ before_total before_i1 before_d1 < <(count rangeway-before "$rangeway_port" /small.bin \
        "$BEFORE_BIN" serve --config "$work/rangeway.toml")
fi
echo "pingora alone under callgrind: ${DURATION} s at $CONC connections..."
read -r pingora_requests _ pingora_total pingora_i1 pingora_d1 < <(count pingora "$pingora_port" /small.bin \
    "$release/examples/pingora-floor" "127.0.0.1:$pingora_port" "127.0.0.1:$origin_port")

rangeway_per=$((rangeway_total / rangeway_requests))
pingora_per=$((pingora_total / pingora_requests))
echo
echo "instructions per 16-byte GET (callgrind, $CONC connections):"
echo "  rangeway        $rangeway_per   ($rangeway_requests requests)"
echo "  pingora alone   $pingora_per   ($pingora_requests requests)"
echo "  rangeway's own  $((rangeway_per - pingora_per))"
if [[ -n $BEFORE_BIN ]]; then
    before_per=$((before_total / before_requests))
    echo "  the build before $before_per   ($before_requests requests; its own $((before_per - pingora_per)))"
fi
if ((CACHE_SIM)); then
    echo
    echo "first-level cache misses per request (valgrind's cache model), instruction and data:"
    echo "  rangeway        $((rangeway_i1 / rangeway_requests))  $((rangeway_d1 / rangeway_requests))"
    echo "  pingora alone   $((pingora_i1 / pingora_requests))  $((pingora_d1 / pingora_requests))"
    if [[ -n $BEFORE_BIN ]]; then
        echo "  the build before $((before_i1 / before_requests))  $((before_d1 / before_requests))"
    fi
fi
echo
echo "rangeway's functions, inclusive instructions per request:"
callgrind_annotate --inclusive=yes --threshold=100 --auto=no "$work/rangeway.out.1" |
    python3 -c '
import re, sys
from collections import Counter
requests, top = int(sys.argv[1]), int(sys.argv[2])
# callgrind lists a function once as a whole and once per source file inlined into it: the
# largest figure is the whole.
inclusive = Counter()
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(.*?)(\s+\[\S+\])?\s*$", line)
    if not m:
        continue
    name = re.sub(r"^.*?\.(rs|c|S):", "", m.group(2))
    if re.search(r"rangeway(_middleware)?::", name):
        inclusive[name] = max(inclusive[name], int(m.group(1).replace(",", "")))
for name, count in inclusive.most_common(top):
    print(f"{count // requests:>9}  {name[-110:]}")
' "$rangeway_requests" "$TOP"
