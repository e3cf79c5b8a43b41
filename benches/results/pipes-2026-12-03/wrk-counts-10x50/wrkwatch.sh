#!/bin/bash
# For each wrk that starts, after 2 s count its wake-ups and reads for 4 s; name the listener it targets.
OUT=${OUT:-/tmp/exp/wrkwatch.log}
seen=""
while true; do
  for pid in $(pgrep -x wrk); do
    case " $seen " in *" $pid "*) continue;; esac
    seen="$seen $pid"
    (
      sleep 2
      url=$(tr '\0' ' ' < /proc/$pid/cmdline | grep -o 'http://[^ ]*')
      port=$(echo "$url" | sed -E 's#http://[^:]+:([0-9]+)/.*#\1#')
      who=$(ss -ltnpH "sport = :$port" | grep -o 'users:(("[^"]*"' | head -1)
      res=$(perf stat -x, -e 'sched:sched_switch,syscalls:sys_enter_read,syscalls:sys_enter_epoll_wait,task-clock' -p $pid -- sleep 4 2>&1)
      echo "== $(date +%T) pid=$pid port=$port who=$who"
      echo "$res"
    ) >> $OUT 2>&1 &
  done
  sleep 0.5
done
