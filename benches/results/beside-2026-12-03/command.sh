#!/bin/bash
# 2026-12-03: small requests beside 50 large (10 MiB) downloads, two builds side by side:
#   head = dfd1008 (a spliced body yields to its thread's other tasks after each pipe-full moved
#          without waiting: 1 MiB while <= 64 bodies are spliced)
#   y256 = dfd1008 yielding after every 256 KiB moved, whatever the pipe's size
# Directories: <build>-<BESIDE_CONC>-r<round>.
cd "$(dirname "$0")/../../.."
run() { # build beside-conc workloads
  RANGEWAY_BIN=/tmp/rangeway-$1 PROXIES=rangeway WORKLOADS="$3" BESIDE_CONC=$2 \
    LARGE_MIB=10 LARGE_CONC=50 DURATION=8 REPS=3 WARMUP=2 RESUME_MIB=1 PRESET=full \
    OUT=benches/results/beside-2026-12-03/$1-$2-r$round bash benches/load/run.sh
}
for round in 1 2; do
  for b in head y256; do run $b 10 "beside large"; run $b 1 beside; done
done
# These reports' beside MB/s and CPU s/GB are wrong (the large downloads' bytes were printed with
# awk's %d, which stops at 2^31 - 1: hence 213 MB/s in every beside row; %.0f since). The small
# requests' req/s and latency, and the large workload's rows, are right.
