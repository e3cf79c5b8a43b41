#!/usr/bin/env bash
# Heap allocations per small request: rangeway against pingora alone, under valgrind's DHAT.
#
#   bash benches/load/allocations.sh                  (~5 min; SHORT (3), LONG (12), CONC (50), TOP (20))
#
# Each proxy (rangeway's passthrough route, then pingora-floor) runs twice under
# `valgrind --tool=dhat` in front of the same origin (nginx, a 16-byte object), once for SHORT and
# once for LONG seconds of wrk at CONC connections. Allocations per request are the difference of
# the two runs' totals over the difference of their requests, so that start-up and shutdown
# allocations drop out. Prints both, and rangeway's allocation sites per request (the first
# frame in rangeway's code).
set -euo pipefail
cd "$(dirname "$0")/../.."
SHORT=${SHORT:-3}
LONG=${LONG:-12}
CONC=${CONC:-50}
TOP=${TOP:-20}

source benches/lib.sh
small_request_setup rangeway-allocations

# run NAME SECONDS PORT CMD...: CMD under DHAT for SECONDS of load; prints "requests" and leaves
# its profile in $work/NAME.json.
run() {
    local name=$1 seconds=$2 port=$3
    shift 3
    RUST_LOG=warn start_bg valgrind --tool=dhat -q --dhat-out-file="$work/$name.json" "$@" \
        >"$work/$name.log" 2>&1
    local pid=$last_pid
    wait_port "$port" 180
    wrk -t1 -c "$CONC" -d "${seconds}s" --timeout 30s -s benches/load/wrk.lua \
        "http://127.0.0.1:$port/small.bin" | sed -n 's/^WRK requests=\([0-9]*\).*/\1/p'
    kill -INT "$pid"
    # DHAT writes its profile as the process exits; pingora drains its connections first.
    for _ in $(seq 120); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

declare -A requests
for target in rangeway pingora; do
    for length in short long; do
        seconds=$SHORT
        [[ $length == long ]] && seconds=$LONG
        echo "$target under DHAT, ${seconds} s at $CONC connections..."
        if [[ $target == rangeway ]]; then
            requests[$target-$length]=$(run "$target-$length" "$seconds" "$rangeway_port" \
                "$release/rangeway" serve --config "$work/rangeway.toml")
        else
            requests[$target-$length]=$(run "$target-$length" "$seconds" "$pingora_port" \
                "$release/examples/pingora-floor" "127.0.0.1:$pingora_port" "127.0.0.1:$origin_port")
        fi
    done
done

echo
python3 - "$work" "${requests[rangeway-short]}" "${requests[rangeway-long]}" \
    "${requests[pingora-short]}" "${requests[pingora-long]}" "$TOP" "$CONC" <<'PY'
import collections, json, re, sys
work, rs, rl, ps, pl, top, conc = sys.argv[1], *map(int, sys.argv[2:])

def sites(path):
    """Allocations and bytes by the first frame in rangeway's own code (or the first named one)."""
    profile = json.load(open(path))
    frames = profile["ftbl"]
    blocks, size = collections.Counter(), collections.Counter()
    for point in profile["pps"]:
        names = [re.sub(r"^0x[0-9A-Fa-f]+: ", "", frames[i]) for i in point["fs"]]
        own = [n for n in names if re.search(r"rangeway(_middleware)?::", n)
               and not re.match(r"(alloc|core|std)::", n)]
        key = own[0] if own else "(not rangeway's) " + (names[1] if len(names) > 1 else names[0])
        blocks[key] += point["tbk"]
        size[key] += point["tb"]
    return blocks, size

def per_request(name, short, long):
    (b1, s1), (b2, s2) = sites(f"{work}/{name}-short.json"), sites(f"{work}/{name}-long.json")
    n = long - short
    blocks = {k: (b2[k] - b1.get(k, 0)) / n for k in b2}
    size = {k: (s2[k] - s1.get(k, 0)) / n for k in s2}
    return blocks, size, n

rb, rsz, rn = per_request("rangeway", rs, rl)
pb, psz, pn = per_request("pingora", ps, pl)
print(f"heap allocations per 16-byte GET (DHAT, {conc} connections):")
print(f"  rangeway        {sum(rb.values()):6.1f}  ({sum(rsz.values()) / 1024:.1f} KiB)   (over {rn} requests)")
print(f"  pingora alone   {sum(pb.values()):6.1f}  ({sum(psz.values()) / 1024:.1f} KiB)   (over {pn} requests)")
print()
print("rangeway's allocation sites, per request (allocations, bytes):")
for key, count in sorted(rb.items(), key=lambda kv: -kv[1])[:top]:
    print(f"{count:7.1f} {rsz[key]:9.0f}  {key[:120]}")
PY
