#!/usr/bin/env bash
# The large workload swept over concurrency and object size: benches/load/run.sh once per point,
# each with its own objects and fresh servers, then one table of every point (sweep.py): MB/s,
# CPU seconds per GB and p99 for rangeway, pingora alone and each peer, and rangeway beside the
# best peer at that point.
#
#   bash benches/load/sweep.sh       (CONCS="10 50 100 200" SIZES_MIB="1 10 100" DURATION=10 REPS=2)
#   BEFORE_BIN=/path/to/old/rangeway bash benches/load/sweep.sh   (adds the build before, and the
#                                    change's ratios; PROXIES narrows the peers, as for run.sh)
#
# DURATION grows with the point's bytes in flight, so that every connection finishes a few
# downloads: at least DURATION, and 3 s per GiB the connections hold at once.
# Writes one summary, benches/results/sweep-<date>.md: the tables, then each point's report. Each
# point's raw captures and log go under RAW_DIR (a new directory under $TMPDIR or /tmp by
# default), outside the repository; its path is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
CONCS=${CONCS:-10 50 100 200}
SIZES_MIB=${SIZES_MIB:-1 10 100}
DURATION=${DURATION:-10}
REPS=${REPS:-2}
OUT=${OUT:-benches/results}
stamp=$(date -u +%Y-%m-%d-%H%M)
points=${RAW_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/rangeway-sweep-$stamp.XXXXXX")}
mkdir -p "$points" "$OUT"
for size in $SIZES_MIB; do
    for conc in $CONCS; do
        duration=$(( DURATION > size * conc * 3 / 1024 ? DURATION : size * conc * 3 / 1024 ))
        echo "== $size MiB x $conc connections, $REPS x $duration s"
        PRESET=full WORKLOADS=large LARGE_MIB=$size LARGE_CONC=$conc DURATION=$duration RESUME_MIB=1 \
            REPS=$REPS WARMUP=2 OUT="$points/$size-$conc" RAW_DIR="$points/$size-$conc" \
            bash benches/load/run.sh \
            > "$points/$size-$conc.log" 2>&1 || { tail -20 "$points/$size-$conc.log" >&2; exit 1; }
        grep -E '^  large ' "$points/$size-$conc.log" || true
    done
done
python3 benches/load/sweep.py "$points" > "$OUT/sweep-$stamp.md"
cat "$OUT/sweep-$stamp.md"
echo "summary written: $OUT/sweep-$stamp.md"
echo "raw captures (outside the repository): $points/ (each point's .tsv, .meta, .svg, report and log)"
