#!/bin/bash
# For each wrk that starts, after 2 s record core 1 (origin + wrk) for 4 s with call graphs.
OUTD=${OUTD:-/tmp/exp/core}
mkdir -p $OUTD
seen=""
while true; do
  for pid in $(pgrep -x wrk); do
    case " $seen " in *" $pid "*) continue;; esac
    seen="$seen $pid"
    (
      sleep 2
      url=$(tr '\0' ' ' < /proc/$pid/cmdline 2>/dev/null | grep -o 'http://[^ ]*')
      port=$(echo "$url" | sed -E 's#http://[^:]+:([0-9]+)/.*#\1#')
      [ -z "$port" ] && exit 0
      who=$(ss -ltnpH "sport = :$port" | grep -o 'users:(("[^"]*"' | head -1 | grep -o '[a-z-]*"$' | tr -d '"')
      perf record -q -C 1 -g -o $OUTD/$who-$pid.data -- sleep 4 > /dev/null 2>&1
      echo "$(date +%T) $pid $port $who" >> $OUTD/index
    ) &
  done
  sleep 0.5
done
