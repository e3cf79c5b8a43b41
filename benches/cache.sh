#!/usr/bin/env bash
# The slice cache beside nginx's (proxy_cache with the slice module and proxy_cache_lock), both in
# front of one nginx origin, one core each:
#
#  1. hits: a warm SIZE_MIB object downloaded whole by HIT_CONC connections for DURATION seconds,
#     REPS times each, alternating: MB/s delivered, p99, the proxy's CPU seconds per GB, and the
#     whole machine's (proxy, wrk and the idle origin: see machine_seconds in lib.sh for why);
#     beside them the floor of any cache hit, a bare sendfile server (nginx serving the object
#     from its folder, on the proxies' core): rangeway's CPU per GB as a multiple of its;
#  2. origin egress: COLD_CLIENTS clients at once, each asking three random ranges (up to 4 MiB)
#     of a cold COLD_MIB object, through an empty cache: the bytes the origin sent, as a multiple
#     of the object's size;
#  3. (printed before 2) the warm object through rangeway's routes with stages — gzip level 6,
#     checksum + aes128gcm — whose output the cache keeps, beside its passthrough route: MB/s
#     and the share of passthrough's.
#
#   bash benches/cache.sh                      (SIZE_MIB=10 HIT_CONC=100 DURATION=10 REPS=3
#                                               COLD_MIB=1024 COLD_CLIENTS=100 PARTS="1 3 2")
#
# SERVER_B='client_notsent_lowat = 0' adds a second rangeway to the hits, with that line in its
# [server] section: an A/B of a setting in the same run. BEFORE_BIN=PATH adds the rangeway binary
# at PATH (the build before a change), with the same config: an A/B of a change in the same run.
# SYSTEM_NOTSENT_LOWAT=131072 (root) sets net.ipv4.tcp_notsent_lowat on the whole machine for the
# run: every server's sockets then bound their unsent bytes as rangeway's client sockets do
# (`client_notsent_lowat`), the sendfile floor's and nginx's included.
#
# Every answer is checked before anything is timed: a whole download through each cache, and the
# cold clients' ranges, against the object's bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MIB=${SIZE_MIB:-10}
HIT_CONC=${HIT_CONC:-100}
DURATION=${DURATION:-10}
REPS=${REPS:-3}
COLD_MIB=${COLD_MIB:-1024}
COLD_CLIENTS=${COLD_CLIENTS:-100}
PROXY_CPU=${PROXY_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
PARTS=${PARTS:-1 3 2}
SYSTEM_NOTSENT_LOWAT=${SYSTEM_NOTSENT_LOWAT:-}
source benches/lib.sh
bench_setup rangeway-cache-bench
[[ -z $SYSTEM_NOTSENT_LOWAT ]] || system_notsent_lowat "$SYSTEM_NOTSENT_LOWAT"

mkdir -p "$work/root" "$work/origin"
fill_object "$work/root/hot.bin" $((SIZE_MIB << 20))
fill_object "$work/root/cold.bin" $((COLD_MIB << 20))
# Modified ten days ago: fresh for a day by RFC 9111's heuristic (rangeway) and cached for an hour
# by proxy_cache_valid (nginx), so hits are hits on both.
touch -d '10 days ago' "$work/root/hot.bin" "$work/root/cold.bin"

# The origin logs each request's body bytes, so that what each cache fetched can be counted.
origin_port=$(free_port)
mkdir -p "$work/origin/tmp"
cat > "$work/origin/nginx.conf" <<CONF
master_process off;
$(nginx_common "$work/origin")
worker_rlimit_nofile $(ulimit -n);
events { worker_connections 4096; }
http {
  client_body_temp_path $work/origin/tmp; proxy_temp_path $work/origin/tmp;
  fastcgi_temp_path $work/origin/tmp; uwsgi_temp_path $work/origin/tmp; scgi_temp_path $work/origin/tmp;
  log_format bytes '\$body_bytes_sent \$request_method \$uri';
  access_log $work/origin/access.log bytes;
  sendfile on;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$origin_port backlog=4096; root $work/root; location / { } }
}
CONF
start_nginx "$work/origin" taskset -c "$CLIENT_CPU"
wait_port "$origin_port"

# rangeway_cache NAME [SERVER_LINE [BINARY]]: a rangeway with a slice cache of its own in $work/NAME, and
# routes with stages (/gzip6/: gzip level 6; /aes/: checksum and aes128gcm); sets $port, $pid.
"$bin" keygen > "$work/key"
rangeway_cache() {
    port=$(free_port)
    mkdir -p "$work/$1"
    { rangeway_conf "$port" "$origin_port" "${2:-}"
      printf '[[routes]]\npath_prefix = "/gzip6/"\nupstream = "origin"\nstrip_prefix = true\n'
      printf '  [[routes.middleware]]\n  kind = "gzip"\n  level = 6\n'
      printf '[[routes]]\npath_prefix = "/aes/"\nupstream = "origin"\nstrip_prefix = true\n'
      printf '  [[routes.middleware]]\n  kind = "checksum"\n'
      printf '  [[routes.middleware]]\n  kind = "aes128gcm"\n  key_file = "%s"\n' "$work/key"
      printf '[cache]\ndir = "%s"\nmax_size = "%dMiB"\nslice_size = "4MiB"\n' \
          "$work/$1/slices" $((2 * COLD_MIB + 1024)); } > "$work/$1/rangeway.toml"
    RUST_LOG=warn start_bg taskset -c "$PROXY_CPU" "${3:-$bin}" serve \
        --config "$work/$1/rangeway.toml" >"$work/$1.log" 2>&1
    pid=$last_pid
    wait_port "$port"
}

# proxy_nginx NAME HTTP_LINES: an nginx on the proxies' core, its http block the lines every one
# here has and then HTTP_LINES (which may name $port: the caller chooses it first); sets $pid.
proxy_nginx() {
    mkdir -p "$work/$1/tmp"
    cat > "$work/$1/nginx.conf" <<CONF
master_process off;
$(nginx_common "$work/$1")
worker_rlimit_nofile $(ulimit -n);
events { worker_connections 4096; }
http {
$(nginx_http_common "$work/$1")
  sendfile on;
  keepalive_requests 1000000;
$2
}
CONF
    start_nginx "$work/$1" taskset -c "$PROXY_CPU"
    pid=$last_pid
    wait_port "$port"
}

# nginx_cache NAME: nginx with proxy_cache, the slice module and the cache lock, as nginx's
# documentation sets a range-aware cache up; sets $port, $pid.
nginx_cache() {
    port=$(free_port)
    mkdir -p "$work/$1/cache"
    proxy_nginx "$1" "$(cat <<LINES
  proxy_cache_path $work/$1/cache levels=1:2 keys_zone=slices:16m max_size=$((2 * COLD_MIB + 1024))m inactive=1h use_temp_path=off;
  upstream origin { server 127.0.0.1:$origin_port; keepalive 64; }
  server {
    listen 127.0.0.1:$port backlog=4096;
    location / {
      slice 4m;
      proxy_cache slices;
      proxy_cache_key \$uri\$is_args\$args\$slice_range;
      proxy_set_header Range \$slice_range;
      proxy_cache_valid 200 206 1h;
      proxy_cache_lock on;
      proxy_cache_lock_timeout 60s;
      proxy_cache_lock_age 60s;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_pass http://origin;
    }
  }
LINES
)"
}

# nginx_files NAME: nginx serving the objects' folder itself with sendfile, as the origin does but
# on the proxies' core: what serving a hit costs at the least; sets $port, $pid.
nginx_files() {
    port=$(free_port)
    proxy_nginx "$1" "  server { listen 127.0.0.1:$port backlog=4096; root $work/root; location / { } }"
}

# The origin's body bytes sent so far (the caches are asked one after the other).
origin_bytes() {
    awk '{ s += $1 } END { print s + 0 }' "$work/origin/access.log"
}

want_hot=$(sha256sum < "$work/root/hot.bin" | cut -d' ' -f1)
declare -A ports procs
rangeway_cache rangeway; ports[rangeway]=$port; procs[rangeway]=$pid
nginx_cache nginx-cache; ports[nginx-cache]=$port; procs[nginx-cache]=$pid
nginx_files sendfile-floor; ports[sendfile-floor]=$port; procs[sendfile-floor]=$pid
targets=(rangeway nginx-cache)
if [[ -n ${SERVER_B:-} ]]; then
    rangeway_cache rangeway-b "$SERVER_B"; ports[rangeway-b]=$port; procs[rangeway-b]=$pid
    targets+=(rangeway-b)
    echo "rangeway-b: [server] $SERVER_B"
fi
if [[ -n ${BEFORE_BIN:-} ]]; then
    rangeway_cache rangeway-before "" "$BEFORE_BIN"
    ports[rangeway-before]=$port; procs[rangeway-before]=$pid
    targets+=(rangeway-before)
    echo "rangeway-before: $BEFORE_BIN"
fi

part() { [[ " $PARTS " == *" $1 "* ]]; }

if part 1; then
echo "1. hits: a warm ${SIZE_MIB} MiB object, $HIT_CONC connections, ${DURATION} s, $REPS runs each"
# The floor is not a cache: only the hits are asked of it.
hit_targets=("${targets[@]}" sendfile-floor)
for t in "${hit_targets[@]}"; do
    for _ in 1 2; do   # the second download is the hit
        got=$(curl -s "http://127.0.0.1:${ports[$t]}/hot.bin" | sha256sum | cut -d' ' -f1)
    done
    [[ $got == "$want_hot" ]] || { echo "$t served wrong bytes" >&2; exit 1; }
done
declare -A speeds p99s cpus machine
for rep in $(seq "$REPS"); do
    line="run $rep:"
    for t in "${hit_targets[@]}"; do
        before=$(cpu_seconds "${procs[$t]}"); machine_before=$(machine_seconds)
        wrk_download "$HIT_CONC" "$DURATION" "http://127.0.0.1:${ports[$t]}/hot.bin"
        after=$(cpu_seconds "${procs[$t]}"); machine_after=$(machine_seconds)
        mbs=$(awk -v b="$bytes" -v u="$us" 'BEGIN { printf "%.0f", b / u }')
        cpu=$(awk -v a="$after" -v b="$before" -v n="$bytes" 'BEGIN { printf "%.3f", (a - b) / (n / 1e9) }')
        all=$(awk -v a="$machine_after" -v b="$machine_before" -v n="$bytes" 'BEGIN { printf "%.3f", (a - b) / (n / 1e9) }')
        speeds[$t]+="$mbs "; p99s[$t]+="$((p99 / 1000)) "; cpus[$t]+="$cpu "; machine[$t]+="$all "
        line+=" $t $mbs MB/s"
    done
    echo "$line"
done
printf '%-14s %10s %12s %14s %18s\n' cache "MB/s" "p99 ms" "CPU s/GB" "machine CPU s/GB"
for t in "${hit_targets[@]}"; do
    printf '%-14s %10s %12s %14s %18s\n' "$t" \
        "$(tr ' ' '\n' <<<"${speeds[$t]}" | grep . | median)" \
        "$(tr ' ' '\n' <<<"${p99s[$t]}" | grep . | median)" \
        "$(tr ' ' '\n' <<<"${cpus[$t]}" | grep . | median)" \
        "$(tr ' ' '\n' <<<"${machine[$t]}" | grep . | median)"
done
floor_cpu=$(tr ' ' '\n' <<<"${cpus[sendfile-floor]}" | grep . | median)
rangeway_cpu=$(tr ' ' '\n' <<<"${cpus[rangeway]}" | grep . | median)
echo "rangeway's CPU per GB of hits: $(awk -v r="$rangeway_cpu" -v f="$floor_cpu" 'BEGIN { printf "%.2f", r / f }')× the bare sendfile server's"
fi

if part 3; then
echo "3. warm representations: the same object through rangeway's routes with stages, $HIT_CONC connections"
# gzip's first pass learns its block index, the second keeps its slices; aes128gcm's first keeps.
for route in gzip6 aes; do
    for _ in 1 2 3; do curl -s -o /dev/null "http://127.0.0.1:${ports[rangeway]}/$route/hot.bin"; done
    hit=$(curl -s -o /dev/null -D - "http://127.0.0.1:${ports[rangeway]}/$route/hot.bin" | tr -d '\r' |
        awk -F': ' 'tolower($1) == "x-rangeway-cache" { print $2 }')
    [[ $hit == hit ]] || { echo "/$route/ is not answered from the cache ($hit)" >&2; exit 1; }
done
declare -A rspeeds rcpus
for rep in $(seq "$REPS"); do
    line="run $rep:"
    for route in passthrough gzip6 aes; do
        path=/hot.bin; [[ $route == passthrough ]] || path=/$route/hot.bin
        before=$(cpu_seconds "${procs[rangeway]}")
        wrk_download "$HIT_CONC" "$DURATION" "http://127.0.0.1:${ports[rangeway]}$path"
        after=$(cpu_seconds "${procs[rangeway]}")
        mbs=$(awk -v b="$bytes" -v u="$us" 'BEGIN { printf "%.0f", b / u }')
        rspeeds[$route]+="$mbs "
        rcpus[$route]+="$(awk -v a="$after" -v b="$before" -v n="$bytes" 'BEGIN { printf "%.3f", (a - b) / (n / 1e9) }') "
        line+=" $route $mbs MB/s"
    done
    echo "$line"
done
pass=$(tr ' ' '\n' <<<"${rspeeds[passthrough]}" | grep . | median)
printf '%-12s %10s %16s %14s\n' route "MB/s" "of passthrough" "CPU s/GB"
for route in passthrough gzip6 aes; do
    m=$(tr ' ' '\n' <<<"${rspeeds[$route]}" | grep . | median)
    printf '%-12s %10s %15.0f%% %14s\n' "$route" "$m" "$(awk -v m="$m" -v p="$pass" 'BEGIN { print 100 * m / p }')" \
        "$(tr ' ' '\n' <<<"${rcpus[$route]}" | grep . | median)"
done

fi

if part 2; then
echo "2. origin egress: $COLD_CLIENTS clients at once, three random ranges each, a cold ${COLD_MIB} MiB object"
cat > "$work/cold.py" <<'PY'
import hashlib, random, sys, threading, urllib.request
url, size, clients, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
wrong = []
def client(seed):
    rng = random.Random(seed)
    with open(path, "rb") as f:
        for _ in range(3):
            first = rng.randrange(size)
            last = min(size - 1, first + rng.randrange(4 << 20))
            req = urllib.request.Request(url, headers={"Range": f"bytes={first}-{last}"})
            body = urllib.request.urlopen(req, timeout=300).read()
            f.seek(first)
            if body != f.read(last - first + 1):
                wrong.append((first, last))
threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
if wrong:
    sys.exit(f"wrong bytes for {len(wrong)} ranges, e.g. {wrong[0]}")
PY
printf '%-12s %16s %14s\n' cache "origin bytes" "of the object"
for t in "${targets[@]}"; do
    before=$(origin_bytes)
    taskset -c "$CLIENT_CPU" python3 "$work/cold.py" "http://127.0.0.1:${ports[$t]}/cold.bin" \
        $((COLD_MIB << 20)) "$COLD_CLIENTS" "$work/root/cold.bin"
    sleep 1
    after=$(origin_bytes)
    sent=$((after - before))
    printf '%-12s %16s %13.2fx\n' "$t" "$sent" "$(awk -v s="$sent" -v o=$((COLD_MIB << 20)) 'BEGIN { print s / o }')"
done
fi
