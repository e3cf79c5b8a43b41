#!/bin/bash
# 2026-12-03: the pipe's share among more than 64 spliced bodies, default TCP settings, three
# builds side by side (rangeway and nginx buffered in each run):
#   head = fbec533: 1 MiB pipes while <= 64 bodies are spliced, 256 KiB among more, 64 MiB in all
#   B    = head with PIPE_AMONG_MANY_BYTES = 1 MiB: an equal share of 64 MiB, at most 1 MiB
#          (512 KiB among 65-128 bodies, 256 KiB among 129-256)
#   C    = B with PIPES_MAX_BYTES = 128 MiB: 1 MiB among up to 128, 512 KiB up to 256 (the
#          harness runs rangeway as root, exempt from the user's pipe quota); landed as the
#          commit after fbec533 that removes PIPE_AMONG_MANY_BYTES
# Directories: <build>-<MiB>x<connections>-<tag>; r1/r2: rounds (round 2 in the reverse order),
# marks: every socket's unsent mark at 128 KiB (SYSTEM_NOTSENT_LOWAT=131072), counts:
# PROFILE=counts (system calls and context switches per GB in the first run).
cd "$(dirname "$0")/../../.."
out=benches/results/pipes-many-2026-12-03
run() { # build MiB connections tag duration [env...]
  local b=$1 s=$2 c=$3 tag=$4 d=$5; shift 5
  env "$@" RANGEWAY_BIN=/tmp/rangeway-$b PROXIES="rangeway nginx-buffered" WORKLOADS=large \
    LARGE_MIB=$s LARGE_CONC=$c DURATION=$d REPS=3 WARMUP=2 RESUME_MIB=1 PRESET=full \
    OUT=$out/$b-${s}x$c-$tag bash benches/load/run.sh
}
for p in "10 100" "10 200"; do for b in head B C; do run $b $p r1 8; done; done
for p in "10 100" "10 200"; do for b in C B head; do run $b $p r2 8; done; done
for b in head C; do run $b 100 200 r1 20; done
for p in "10 100" "10 200"; do for b in head C; do run $b $p marks 8 SYSTEM_NOTSENT_LOWAT=131072; done; done
for b in head C; do run $b 10 200 counts 8 PROFILE=counts; done
for b in C head; do run $b 1 200 r1 8; done
for b in C head; do run $b 100 100 r1 29; done
