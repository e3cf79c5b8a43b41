#!/bin/bash
cd /work/main
export CARGO_TARGET_DIR=/var/tmp/rangeway-target
mkdir -p /tmp/exp5
for point in "131072 10" " 10"; do
  set -- $point
  if [[ $# == 2 ]]; then sys=$1; conc=$2; else sys=""; conc=$1; fi
  for v in head rcvlowat; do
    name=${v}-${sys:-default}-$conc
    lw=""; bin=/tmp/rangeway-head; [[ $v == rcvlowat ]] && { lw=65536; bin=/tmp/rangeway-rcvlowat; }
    RW_RCVLOWAT=$lw SYSTEM_NOTSENT_LOWAT=$sys RANGEWAY_BIN=$bin PROXIES='rangeway nginx-buffered' WORKLOADS=large LARGE_MIB=10 LARGE_CONC=$conc DURATION=8 REPS=3 WARMUP=2 RESUME_MIB=1 PRESET=full OUT=/tmp/exp5/$name bash benches/load/run.sh > /tmp/exp5/$name.log 2>&1
    echo "$name rc=$? $(date +%T)"
  done
done
