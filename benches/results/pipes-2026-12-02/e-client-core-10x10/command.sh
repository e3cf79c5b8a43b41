#!/bin/bash
# perf on the client core (origin + wrk) during rangeway's and nginx buffered's runs at 10 MiB x 10
cd /work/main
export CARGO_TARGET_DIR=/var/tmp/rangeway-target
mkdir -p /tmp/exp4
perf record -k CLOCK_MONOTONIC -F 999 -C 1 -g -o /tmp/exp4/client-core.data -- sleep 150 > /tmp/exp4/perf.log 2>&1 &
sleep 1
SYSTEM_NOTSENT_LOWAT=131072 PROXIES='rangeway nginx-buffered' WORKLOADS=large LARGE_MIB=10 LARGE_CONC=10 DURATION=20 REPS=1 WARMUP=2 RESUME_MIB=1 PRESET=full OUT=/tmp/exp4/run bash benches/load/run.sh 2>&1 | python3 -u -c '
import sys,time
for l in sys.stdin: print(f"{time.monotonic():.3f} {l}", end="", flush=True)' > /tmp/exp4/run.log
wait
echo done
