#!/usr/bin/env bash
# The large workload swept over points (object size × connections) and both TCP settings:
# benches/load/run.sh once per point and setting, each with its own objects and fresh servers, then
# one summary (sweep.py): issue 46's ratio table — rangeway against nginx buffered, the splice
# floor and the direct run — and, per target, MB/s, CPU s/GB, p99, the machine's CPU s/GB above
# the direct run, system calls and context switches per MiB.
#
#   bash benches/load/sweep.sh       (POINTS="10x50 10x100 10x200 1x100 100x10" LOWATS="default 131072"
#                                     DURATION=10 REPS=3 PROXIES="rangeway nginx-buffered splice-floor copy-floor")
#   SIZES_MIB="1 10" CONCS="10 100" bash benches/load/sweep.sh   (every size at every concurrency)
#   BEFORE_BIN=/path/to/old/rangeway bash benches/load/sweep.sh   (adds the build before, and the
#                                    change's ratios; PROXIES narrows or widens the targets, as for run.sh)
#
# POINTS: SIZE_MIBxCONNECTIONS. LOWATS: each point runs once per entry, "default" with the
# system's TCP settings, a number with net.ipv4.tcp_notsent_lowat set to it on the whole machine
# for that run (run.sh's SYSTEM_NOTSENT_LOWAT; root). DURATION grows with the point's bytes in
# flight, so that every connection finishes a few downloads: at least DURATION, and 3 s per GiB
# the connections hold at once. Each run.sh alternates its targets REPS times and counts each
# proxy's system calls in a run of COUNT_SECONDS after.
# Writes one summary, benches/results/sweep-<date>.md: the tables, then each run's report. Each
# run's raw captures and log go under RAW_DIR (a new directory under $TMPDIR or /tmp by default),
# outside the repository; its path is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -n ${SIZES_MIB:-} || -n ${CONCS:-} ]]; then
    POINTS=
    for size in ${SIZES_MIB:-1 10 100}; do
        for conc in ${CONCS:-10 50 100 200}; do POINTS+=" ${size}x$conc"; done
    done
fi
POINTS=${POINTS:-10x50 10x100 10x200 1x100 100x10}
LOWATS=${LOWATS:-default 131072}
DURATION=${DURATION:-10}
REPS=${REPS:-3}
COUNT_SECONDS=${COUNT_SECONDS:-5}
export PROXIES=${PROXIES:-rangeway nginx-buffered splice-floor copy-floor}
OUT=${OUT:-benches/results}
for lowat in $LOWATS; do
    [[ $lowat == default || $lowat =~ ^[0-9]+$ ]] || { echo "LOWATS: 'default' or bytes, not '$lowat'" >&2; exit 2; }
    [[ $lowat == default || $(id -u) == 0 ]] || { echo "LOWATS=$lowat sets a sysctl: run as root" >&2; exit 2; }
done
stamp=$(date -u +%Y-%m-%d-%H%M)
points=${RAW_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/rangeway-sweep-$stamp.XXXXXX")}
mkdir -p "$points" "$OUT"
for point in $POINTS; do
    size=${point%x*} conc=${point#*x}
    [[ $size =~ ^[0-9]+$ && $conc =~ ^[0-9]+$ ]] || { echo "POINTS: SIZE_MIBxCONNECTIONS, not '$point'" >&2; exit 2; }
    duration=$(( DURATION > size * conc * 3 / 1024 ? DURATION : size * conc * 3 / 1024 ))
    for lowat in $LOWATS; do
        run=$size-$conc-$lowat
        echo "== $size MiB x $conc connections, notsent_lowat $lowat: $REPS x $duration s"
        PRESET=full WORKLOADS=large LARGE_MIB=$size LARGE_CONC=$conc DURATION=$duration RESUME_MIB=1 \
            REPS=$REPS WARMUP=2 COUNT_SECONDS=$COUNT_SECONDS OUT="$points/$run" RAW_DIR="$points/$run" \
            SYSTEM_NOTSENT_LOWAT=$([[ $lowat == default ]] || echo "$lowat") \
            bash benches/load/run.sh \
            > "$points/$run.log" 2>&1 || { tail -20 "$points/$run.log" >&2; exit 1; }
        grep -E '^  large ' "$points/$run.log" || true
    done
done
python3 benches/load/sweep.py "$points" > "$OUT/sweep-$stamp.md"
cat "$OUT/sweep-$stamp.md"
echo "summary written: $OUT/sweep-$stamp.md"
echo "raw captures (outside the repository): $points/ (each point's .tsv, .meta, .svg, report and log)"
