#!/bin/bash
# 2026-12-03: three builds side by side, one point at a time, each build's run after the other's.
#   head  = 1bd26ff (256 KiB pipes, no receive mark)
#   mark  = f527fcc (SO_RCVLOWAT 64 KiB on the spliced origin socket; reverted in be743f4)
#   few   = f527fcc with 1 MiB pipes while at most 64 bodies are spliced at once
#   few2  = 1bd26ff with 1 MiB pipes while at most 64 bodies are spliced at once (landed: 248d9bd)
# Directories: <round>-<build>-<SYSTEM_NOTSENT_LOWAT or default>-<MiB>x<connections>.
# ab-head-131072-100x10: a second harness ran for its first ~30 s by mistake (its reps agree).
cd "$(dirname "$0")/../../.."
run() { # round build sys mib conc
  SYSTEM_NOTSENT_LOWAT=$3 RANGEWAY_BIN=/tmp/rangeway-$2 PROXIES='rangeway nginx-buffered' \
    WORKLOADS=large LARGE_MIB=$4 LARGE_CONC=$5 DURATION=8 REPS=3 WARMUP=2 RESUME_MIB=1 PRESET=full \
    OUT=benches/results/pipes-2026-12-03/$1-$2-${3:-default}-$4x$5 bash benches/load/run.sh
}
for p in "131072 10 10" "131072 10 50" "131072 10 100" "'' 10 10" "'' 10 100" "131072 100 10" "131072 100 50"; do
  eval "set -- $p"; for b in head mark few; do run ab $b "$1" "$2" "$3"; done
done
for p in "'' 10 100" "'' 10 50" "131072 10 50"; do
  eval "set -- $p"; for b in mark few; do run ab2 $b "$1" "$2" "$3"; done
done
for p in "'' 10 10" "'' 10 50" "'' 10 100" "131072 10 50" "131072 10 100" "'' 100 10"; do
  eval "set -- $p"; for b in head few2; do run ab3 $b "$1" "$2" "$3"; done
done
# client-core-10x50: the client core (origin + wrk) recorded with `perf record -q -C 1 -g` for 4 s,
# 2 s into each target's run, by a watcher script started beside the harness; run.sh has done the
# same since as PROFILE=client (the whole first run of each target), e.g.
#   PROFILE=client PROXIES='rangeway nginx-buffered' WORKLOADS=large LARGE_MIB=10 LARGE_CONC=50 \
#     SYSTEM_NOTSENT_LOWAT=131072 DURATION=8 REPS=3 PRESET=full bash benches/load/run.sh
# wrk-counts-10x50: wrkwatch.sh beside the harness (perf stat on each wrk's pid).
