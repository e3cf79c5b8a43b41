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
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${DURATION:-15}
CONC=${CONC:-50}
TOP=${TOP:-25}
BEFORE_BIN=${BEFORE_BIN:-}   # a rangeway binary of the build before a change, counted the same way

source benches/lib.sh
small_request_setup rangeway-instructions

# count NAME PORT CMD...: prints "requests instructions" for CMD under callgrind.
count() {
    local name=$1 port=$2
    shift 2
    RUST_LOG=warn start_bg valgrind --tool=callgrind -q --callgrind-out-file="$work/$name.out" "$@" \
        >"$work/$name.log" 2>&1
    local pid=$last_pid
    wait_port "$port" 180
    wrk -t1 -c "$CONC" -d 5s "http://127.0.0.1:$port/small.bin" >/dev/null
    callgrind_control -z "$pid" >/dev/null
    local requests
    requests=$(wrk -t1 -c "$CONC" -d "${DURATION}s" --timeout 30s -s benches/load/wrk.lua \
        "http://127.0.0.1:$port/small.bin" | sed -n 's/^WRK requests=\([0-9]*\).*/\1/p')
    callgrind_control -d "$pid" >/dev/null
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    local total
    total=$(callgrind_annotate "$work/$name.out.1" | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
    echo "$requests $total"
}

echo "rangeway under callgrind: ${DURATION} s at $CONC connections..."
read -r rangeway_requests rangeway_total < <(count rangeway "$rangeway_port" \
    "$release/rangeway" serve --config "$work/rangeway.toml")
if [[ -n $BEFORE_BIN ]]; then
    echo "the build before under callgrind: ${DURATION} s at $CONC connections..."
    read -r before_requests before_total < <(count rangeway-before "$rangeway_port" \
        "$BEFORE_BIN" serve --config "$work/rangeway.toml")
fi
echo "pingora alone under callgrind: ${DURATION} s at $CONC connections..."
read -r pingora_requests pingora_total < <(count pingora "$pingora_port" \
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
