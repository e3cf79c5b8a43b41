#!/usr/bin/env bash
# Load harness: rangeway beside the proxies people would pick instead, in front of one origin,
# under concurrent load. See benches/load/README.md for what it measures and how to read it.
#
#   bash benches/load/run.sh                   quick run (~5 min): small objects, short runs
#   PRESET=full bash benches/load/run.sh       the documented full run (~50 min)
#
# Any parameter below can be set in the environment (it overrides the preset), e.g.
#   WORKLOADS="large resume" PROXIES="rangeway haproxy" REPS=3 bash benches/load/run.sh
#
# What it does: installs nginx, HAProxy and wrk if missing (scripts/deps.sh --bench), builds
# rangeway (release), writes the objects, starts one origin (nginx, static files, sendfile), then
# in front of it rangeway (threads = 1), nginx as a streaming proxy (proxy_buffering off, 64 KiB
# buffer), nginx as a buffering proxy (in memory: proxy_max_temp_file_size 0) and HAProxy
# (nbthread 1), and pingora's proxy alone (no hooks: the floor of any proxy on pingora, not a peer),
# and two relays that only move bytes (benches/load/floor_relay.c, built here with cc): the floors
# of any relay, splicing (splice-floor) and copying through a buffer (copy-floor).
# The proxy under test runs on core PROXY_CPU; origin and wrk on CLIENT_CPU. Each
# workload runs every target once per repetition, the order rotated each repetition and
# reversed every other one. Results:
# the one summary, benches/results/load-<date>.md (the tables, the machine, the versions, the
# command), also printed; the raw captures (every run's row in .tsv, the .meta the report is drawn
# from, the .svg chart, a profile) go to a directory outside the repository, printed at the end.
#
# Everything listens on 127.0.0.1 ports chosen at run time and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

# ---- parameters -------------------------------------------------------------------------------
PRESET=${PRESET:-quick}
case $PRESET in
    quick) d_duration=3 d_reps=2 d_large_mib=1 d_resume_mib=64 d_warmup=1 d_count=3 ;;
    full) d_duration=20 d_reps=5 d_large_mib=10 d_resume_mib=1024 d_warmup=3 d_count=5 ;;
    *) echo "PRESET is quick or full, not '$PRESET'" >&2; exit 2 ;;
esac
DURATION=${DURATION:-$d_duration}          # seconds per measured wrk run
REPS=${REPS:-$d_reps}                      # repetitions of every (workload, target)
WARMUP=${WARMUP:-$d_warmup}                # seconds of unrecorded load per target before a workload
LARGE_MIB=${LARGE_MIB:-$d_large_mib}       # large (and chain): object size, MiB
LARGE_CONC=${LARGE_CONC:-100}              #   connections
SMALL_BYTES=${SMALL_BYTES:-16}             # small: object size, bytes
SMALL_CONC=${SMALL_CONC:-500}              #   connections
BESIDE_CONC=${BESIDE_CONC:-10}             # beside: connections of small requests, measured while
                                           #   LARGE_CONC large downloads run through the same proxy
RESUME_MIB=${RESUME_MIB:-$d_resume_mib}    # resume: object size, MiB (random ranges inside it)
RESUME_RANGE_KIB=${RESUME_RANGE_KIB:-1024} #   bytes per range, KiB
RESUME_CONC=${RESUME_CONC:-64}             #   connections
WORKLOADS=${WORKLOADS:-large small resume chain}  # and beside (not by default)
PROXIES=${PROXIES:-rangeway pingora nginx-stream nginx-buffered haproxy splice-floor copy-floor}
                                           # besides direct, which always runs
FLOOR_PIPE_KIB=${FLOOR_PIPE_KIB:-1024}     # splice-floor: its pipe a connection (F_SETPIPE_SZ)
FLOOR_COPY_KIB=${FLOOR_COPY_KIB:-1024}     # copy-floor: its buffer a connection
COUNT_SECONDS=${COUNT_SECONDS:-$d_count}   # a counting run per proxy and workload after the timed
                                           #   ones: its system calls (perf stat); 0: none
STEAL_MAX=${STEAL_MAX:-2}                  # %: the report leaves out runs with more steal
FRESH=${FRESH:-1}                          # 1: rangeway (and the build before) restarted before
                                           #   every repetition after the first; 0: one process
NGINX_BUFFERS=${NGINX_BUFFERS:-16 64k}     # nginx-buffered: proxy_buffers (per connection)
HAPROXY_SPLICE=${HAPROXY_SPLICE:-0}        # 1: haproxy with option splice-auto (kernel splicing)
PROXY_CPU=${PROXY_CPU:-0}                  # core of the proxy under test
CLIENT_CPU=${CLIENT_CPU:-1}                # core of the origin and of wrk
WRK_THREADS=${WRK_THREADS:-1}              # wrk threads (all on CLIENT_CPU)
WRK_TIMEOUT=${WRK_TIMEOUT:-60}             # seconds: wrk counts slower requests as timeouts and
                                           # leaves them out of its latency histogram, so this
                                           # must exceed the slowest expected response (a 10 MiB
                                           # gzip body among 100 is ~13 s here)
OUT=${OUT:-benches/results}                # where the summary (.md) goes (relative to the repo)
RAW_DIR=${RAW_DIR:-}                       # where the raw captures go; a new directory under
                                           # $TMPDIR (or /tmp) by default, printed at the end
RANGEWAY_BIN=${RANGEWAY_BIN:-}             # another rangeway binary to run (an A/B of a change)
BEFORE_BIN=${BEFORE_BIN:-}                 # a rangeway binary of the build before a change: run
                                           #   beside this one as target `rangeway-before`, so the
                                           #   report's "rangeway ÷ this" is the change's ratio
RANGEWAY_SERVER=${RANGEWAY_SERVER:-}       # a line for rangeway's [server] (an A/B of a setting,
                                           # e.g. 'client_notsent_lowat = 0')
SYSTEM_NOTSENT_LOWAT=${SYSTEM_NOTSENT_LOWAT:-} # bytes: net.ipv4.tcp_notsent_lowat for every socket
                                           # of the machine during the run (restored after; root).
                                           # On loopback a sender's queued bytes go out in the
                                           # context of the receiver's ACKs, so the origin's TCP
                                           # work lands on the proxy's core; with a low mark each
                                           # sender sends its own, as across a network
PROFILE=${PROFILE:-}                       # perf: sample rangeway during its first run of each
                                           # workload; callgrind: run rangeway under valgrind
                                           # (slow: figures meaningless); counts: system calls
                                           # by name (and their EAGAINs) and context switches
                                           # per GB of every proxy in its first run (perf stat
                                           # of each call's tracepoint: that run's CPU is a
                                           # little inflated, the medians of REPS >= 3 are not); kernel: the proxy
                                           # core sampled (kernel and user functions) during every
                                           # proxy's first run; client: the same of the client
                                           # core (origin and wrk), by process; profile with the raw captures

# The counting runs need perf's tracepoints (root, or kernel.perf_event_paranoid <= -1).
if ((COUNT_SECONDS > 0)) && ! { command -v perf && perf stat -e raw_syscalls:sys_enter -- true; } >/dev/null 2>&1; then
    echo "perf cannot count system calls here (apt-get install linux-perf; root): no counting runs" >&2
    COUNT_SECONDS=0
fi

command_line="PRESET=$PRESET DURATION=$DURATION REPS=$REPS WARMUP=$WARMUP LARGE_MIB=$LARGE_MIB"
command_line+=" LARGE_CONC=$LARGE_CONC SMALL_BYTES=$SMALL_BYTES SMALL_CONC=$SMALL_CONC BESIDE_CONC=$BESIDE_CONC"
command_line+=" RESUME_MIB=$RESUME_MIB RESUME_RANGE_KIB=$RESUME_RANGE_KIB RESUME_CONC=$RESUME_CONC"
command_line+=" WORKLOADS='$WORKLOADS' PROXIES='$PROXIES' NGINX_BUFFERS='$NGINX_BUFFERS'"
command_line+=" HAPROXY_SPLICE=$HAPROXY_SPLICE PROXY_CPU=$PROXY_CPU CLIENT_CPU=$CLIENT_CPU"
command_line+=" WRK_THREADS=$WRK_THREADS WRK_TIMEOUT=$WRK_TIMEOUT${PROFILE:+ PROFILE=$PROFILE}"
command_line+="${RANGEWAY_BIN:+ RANGEWAY_BIN=$RANGEWAY_BIN}${RANGEWAY_SERVER:+ RANGEWAY_SERVER='$RANGEWAY_SERVER'}"
command_line+="${SYSTEM_NOTSENT_LOWAT:+ SYSTEM_NOTSENT_LOWAT=$SYSTEM_NOTSENT_LOWAT}"
command_line+="${BEFORE_BIN:+ BEFORE_BIN=$BEFORE_BIN}"
command_line+=" FLOOR_PIPE_KIB=$FLOOR_PIPE_KIB FLOOR_COPY_KIB=$FLOOR_COPY_KIB COUNT_SECONDS=$COUNT_SECONDS STEAL_MAX=$STEAL_MAX FRESH=$FRESH"
command_line+=" bash benches/load/run.sh"

# ---- tools, build -----------------------------------------------------------------------------
bash scripts/deps.sh --bench
echo "building rangeway and the pingora floor (release)..."
cargo build --release --bin rangeway --example pingora-floor >/dev/null
source benches/lib.sh
release=$(release_dir)
bin=${RANGEWAY_BIN:-"$release/rangeway"}
bench_init rangeway-load --no-summary
# The floors: one C source, two modes, built with the system's compiler for this run.
command -v cc >/dev/null || { echo "the floors need a C compiler: apt-get install gcc" >&2; exit 2; }
cc -O2 -Wall -Wextra -Werror -o "$work/floor-relay" benches/load/floor_relay.c
[[ -z $SYSTEM_NOTSENT_LOWAT ]] || system_notsent_lowat "$SYSTEM_NOTSENT_LOWAT"
case $PROFILE in
    '') ;;
    perf | counts | kernel | client) command -v perf >/dev/null || { echo "PROFILE=$PROFILE: no perf (apt-get install linux-perf)" >&2; exit 2; } ;;
    callgrind) command -v valgrind >/dev/null || { echo "PROFILE=callgrind: no valgrind (apt-get install valgrind)" >&2; exit 2; } ;;
    *) echo "PROFILE is perf, counts, kernel, client or callgrind, not '$PROFILE'" >&2; exit 2 ;;
esac
# 500 clients plus 500 upstream connections per proxy: well above the default 1024 descriptors.
# Raise the soft limit as far as the hard one allows (containers often cap it); the servers are
# told the same figure, as they fail when asked for more than they may have.
nofile=$(ulimit -Hn)
[[ $nofile == unlimited || $nofile -gt 65536 ]] && nofile=65536
ulimit -n "$nofile"

# With fewer than two cores there is nothing to pin apart; run unpinned rather than fail.
if [[ $(nproc) -ge 2 ]]; then
    on_proxy_cpu=(taskset -c "$PROXY_CPU")
    on_client_cpu=(taskset -c "$CLIENT_CPU")
else
    on_proxy_cpu=()
    on_client_cpu=()
fi

# ---- objects ----------------------------------------------------------------------------------
echo "writing objects: large ${LARGE_MIB} MiB, small ${SMALL_BYTES} B, resume ${RESUME_MIB} MiB..."
mkdir -p "$work/root"
fill_object "$work/root/large.bin" $((LARGE_MIB * 1024 * 1024))
head -c "$SMALL_BYTES" /dev/urandom > "$work/root/small.bin"
fill_object "$work/root/resume.bin" $((RESUME_MIB * 1024 * 1024))
# Read once so every target starts from the page cache.
cat "$work/root/"*.bin > /dev/null

# ---- origin -----------------------------------------------------------------------------------
origin_port=$(free_port)
origin_nginx_conf "$work/origin" "$origin_port" "$work/root" 8192
start_nginx "$work/origin" "${on_client_cpu[@]}"
origin_pid=$last_pid

# ---- rangeway ---------------------------------------------------------------------------------
# One worker thread; "/" passthrough (large, small, resume), and the chain workload's two routes.
"$bin" keygen > "$work/key"
rangeway_toml() { # PORT
    rangeway_conf "$1" "$origin_port" "$RANGEWAY_SERVER"
    cat <<CONF
[[routes]]
path_prefix = "/aes/"
upstream = "origin"
strip_prefix = true
  [[routes.middleware]]
  kind = "checksum"
  algorithms = ["sha256", "crc32"]
  [[routes.middleware]]
  kind = "aes128gcm"
  key_file = "$work/key"
[[routes]]
path_prefix = "/gzip1/"
upstream = "origin"
strip_prefix = true
  [[routes.middleware]]
  kind = "gzip"
  level = 1
CONF
}
rangeway_port=$(free_port)
rangeway_toml "$rangeway_port" > "$work/rangeway.toml"
"$bin" check --config "$work/rangeway.toml" >/dev/null
# Under callgrind, valgrind runs rangeway in its own process (same pid): it writes the profile
# when rangeway exits, which the report step arranges.
rangeway_wrapper=()
[[ $PROFILE == callgrind ]] && rangeway_wrapper=(valgrind --tool=callgrind -q --callgrind-out-file="$work/callgrind.out")
# start_rangeway NAME BIN [WRAPPER...]: BIN serving NAME.toml, pinned with the proxies, logging
# to NAME.log, run through WRAPPER if given; its pid in $last_pid.
start_rangeway() {
    local name=$1 binary=$2
    shift 2
    RUST_LOG=warn start_bg "${on_proxy_cpu[@]}" "$@" "$binary" serve \
        --config "$work/$name.toml" >>"$work/$name.log" 2>&1
}
start_rangeway rangeway "$bin" "${rangeway_wrapper[@]}"
rangeway_pid=$last_pid

# ---- the build before a change, beside it ------------------------------------------------------
before_port="" before_pid=""
if [[ -n $BEFORE_BIN ]]; then
    before_port=$(free_port)
    rangeway_toml "$before_port" > "$work/rangeway-before.toml"
    "$BEFORE_BIN" check --config "$work/rangeway-before.toml" >/dev/null
    start_rangeway rangeway-before "$BEFORE_BIN"
    before_pid=$last_pid
    PROXIES="rangeway-before $PROXIES"
fi

# ---- pingora without rangeway -----------------------------------------------------------------
# Not a peer: the floor under any proxy built on pingora 0.9 (benches/load/pingora_floor.rs), so
# that the report shows what of rangeway's cost is its own.
pingora_port=$(free_port)
start_bg "${on_proxy_cpu[@]}" "$release/examples/pingora-floor" "127.0.0.1:$pingora_port" \
    "127.0.0.1:$origin_port" >"$work/pingora.log" 2>&1
pingora_pid=$last_pid

# ---- the floors: relays that only move bytes ---------------------------------------------------
# Not peers: what relaying an HTTP/1.1 response costs at the least on this machine, one thread,
# epoll, a kept-alive origin connection per client connection (benches/load/floor_relay.c).
# splice-floor moves the body origin -> pipe -> client with splice(2) through a pipe of
# FLOOR_PIPE_KIB; copy-floor with read(2) and write(2) through a buffer of FLOOR_COPY_KIB.
splice_floor_port=$(free_port)
start_bg "${on_proxy_cpu[@]}" "$work/floor-relay" splice "$splice_floor_port" "$origin_port" \
    "$FLOOR_PIPE_KIB" >"$work/splice-floor.log" 2>&1
splice_floor_pid=$last_pid
copy_floor_port=$(free_port)
start_bg "${on_proxy_cpu[@]}" "$work/floor-relay" copy "$copy_floor_port" "$origin_port" \
    "$FLOOR_COPY_KIB" >"$work/copy-floor.log" 2>&1
copy_floor_pid=$last_pid

# ---- nginx as a proxy, two ways ---------------------------------------------------------------
# As its users tune it for downloads: one worker, HTTP/1.1 keep-alive to the origin with a pool
# as large as the client concurrency, clients' keep-alive never recycled. Then either streaming
# (proxy_buffering off: each read of up to proxy_buffer_size is written straight to the client)
# or buffering in memory only (proxy_buffers per connection, nothing spooled to disk).
nginx_proxy_conf() { # DIR PORT MODE-LINES
    mkdir -p "$1/tmp"
    cat > "$1/nginx.conf" <<CONF
master_process on;
worker_processes 1;
$(nginx_common "$1")
worker_rlimit_nofile $nofile;
events { worker_connections 8192; }
http {
$(nginx_http_common "$1")
  keepalive_requests 1000000;
  upstream origin { server 127.0.0.1:$origin_port; keepalive 512; keepalive_requests 1000000; }
  server {
    listen 127.0.0.1:$2 backlog=4096;
    location / {
      proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
$3
    }
  }
}
CONF
}
nginx_stream_port=$(free_port)
# (proxy_buffers is unused without buffering, but nginx checks the busy size it implies.)
nginx_proxy_conf "$work/nginx-stream" "$nginx_stream_port" "      proxy_buffering off;
      proxy_buffer_size 64k;
      proxy_buffers 4 64k;"
nginx_buffered_port=$(free_port)
nginx_proxy_conf "$work/nginx-buffered" "$nginx_buffered_port" "      proxy_buffering on;
      proxy_buffer_size 64k;
      proxy_buffers $NGINX_BUFFERS;
      proxy_busy_buffers_size 128k;
      proxy_max_temp_file_size 0;"
start_nginx "$work/nginx-stream" "${on_proxy_cpu[@]}"
master_nginx_stream=$last_pid
start_nginx "$work/nginx-buffered" "${on_proxy_cpu[@]}"
master_nginx_buffered=$last_pid

# ---- HAProxy ----------------------------------------------------------------------------------
# One thread, HTTP mode, keep-alive both sides with server connections reused (http-reuse safe,
# the default). Kernel splicing (HAPROXY_SPLICE=1) is off by default, as in HAProxy: tried here it
# did not help (see benches/load/README.md).
haproxy_port=$(free_port)
cat > "$work/haproxy.cfg" <<CONF
global
  nbthread 1
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  timeout http-keep-alive 60s
  option http-keep-alive
  http-reuse safe
  $( [[ $HAPROXY_SPLICE == 1 ]] && echo "option splice-auto" )
frontend fe
  bind 127.0.0.1:$haproxy_port
  default_backend be
backend be
  server origin 127.0.0.1:$origin_port
CONF
haproxy -c -q -f "$work/haproxy.cfg"
# -db: foreground, no master: the one process is the worker.
start_bg "${on_proxy_cpu[@]}" haproxy -db -f "$work/haproxy.cfg" >"$work/haproxy.log" 2>&1
haproxy_pid=$last_pid

for port in "$origin_port" "$pingora_port" "$nginx_stream_port" "$nginx_buffered_port" "$haproxy_port" \
    "$splice_floor_port" "$copy_floor_port"; do
    wait_port "$port"
done
wait_port "$rangeway_port" "$( [[ $PROFILE == callgrind ]] && echo 180 || echo 10 )"
[[ -z $before_port ]] || wait_port "$before_port" 10

# The process whose CPU and memory count: nginx's worker, not its master (which only waits).
worker_of() {
    local _
    for _ in $(seq 50); do pgrep -P "$1" && return 0; sleep 0.1; done
    echo "nginx $1 has no worker" >&2
    return 1
}
nginx_stream_worker=$(worker_of "$master_nginx_stream")
nginx_buffered_worker=$(worker_of "$master_nginx_buffered")
declare -A port_of=(
    [direct]=$origin_port [rangeway]=$rangeway_port [rangeway-aes]=$rangeway_port
    [rangeway-gzip1]=$rangeway_port [pingora]=$pingora_port [nginx-stream]=$nginx_stream_port
    [nginx-buffered]=$nginx_buffered_port [haproxy]=$haproxy_port [rangeway-before]=$before_port
    [splice-floor]=$splice_floor_port [copy-floor]=$copy_floor_port
)
declare -A pid_of=(
    [direct]="" [rangeway]=$rangeway_pid [rangeway-aes]=$rangeway_pid [rangeway-gzip1]=$rangeway_pid
    [pingora]=$pingora_pid
    [nginx-stream]=$nginx_stream_worker [nginx-buffered]=$nginx_buffered_worker [haproxy]=$haproxy_pid
    [rangeway-before]=$before_pid [splice-floor]=$splice_floor_pid [copy-floor]=$copy_floor_pid
)
# What each target puts before the object's path.
declare -A prefix_of=([rangeway-aes]=/aes [rangeway-gzip1]=/gzip1)
url_of() { echo "http://127.0.0.1:${port_of[$1]}${prefix_of[$1]:-}/$2"; }

# ---- correctness first: every target serves the origin's bytes --------------------------------
# A bench of a proxy that answers wrongly measures nothing. Whole large object and one range of
# the resume object through each plain proxy; the chain routes decoded back to the origin's bytes
# (that first gzip pass also builds the block index, so measured gzip responses have a length).
check_same() { # WHAT EXPECTED-FILE ACTUAL-FILE
    cmp -s "$2" "$3" || { echo "$1: wrong bytes" >&2; exit 1; }
}
range_a=$((RESUME_MIB * 1024 * 1024 / 3))
range_b=$((range_a + RESUME_RANGE_KIB * 1024 - 1))
tail -c +$((range_a + 1)) "$work/root/resume.bin" | head -c $((RESUME_RANGE_KIB * 1024)) > "$work/expected-range" || true
for target in direct $PROXIES; do
    curl -sf -o "$work/got" "$(url_of "$target" large.bin)"
    check_same "$target large" "$work/root/large.bin" "$work/got"
    curl -sf -o "$work/got" -H "Range: bytes=$range_a-$range_b" "$(url_of "$target" resume.bin)"
    check_same "$target range" "$work/expected-range" "$work/got"
done
curl -sf "$(url_of rangeway-aes large.bin)" | "$bin" decrypt --key-file "$work/key" > "$work/got"
check_same "checksum+aes128gcm" "$work/root/large.bin" "$work/got"
curl -sf "$(url_of rangeway-gzip1 large.bin)" | gzip -dc > "$work/got"
check_same "gzip1" "$work/root/large.bin" "$work/got"
rm -f "$work/got" "$work/expected-range"
echo "all targets serve the origin's bytes"

# ---- measuring --------------------------------------------------------------------------------
ticks=$(getconf CLK_TCK)
cpu_ticks() { [[ -n $1 ]] && awk '{ print $14 + $15 }' "/proc/$1/stat" || echo 0; }
# busy_ticks [CPU]: busy time of one core (cpu0, cpu1...) or by default of the whole machine
# ("cpu"), to tell how much CPU others took during a run and when the proxies' core is idle.
busy_ticks() { awk -v cpu="${1:-cpu}" '$1 == cpu { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
# stat_ticks: the whole machine's time from /proc/stat's "cpu" line (every core), three numbers:
# busy (user, nice, system, irq, softirq; guest time is inside user and nice), steal (time the
# hypervisor gave to others while this machine wanted to run), and all of it (busy, idle, iowait,
# steal): a run's steal % is the second's delta over the third's.
stat_ticks() { awk '$1 == "cpu" { busy = $2 + $3 + $4 + $7 + $8; print busy, $9, busy + $5 + $6 + $9; exit }' /proc/stat; }
# thread_switches PID: "TID COUNT" a line, every thread's context switches so far, voluntary and
# involuntary (the process's own status counts only its first thread; rangeway's workers are
# others). A task's status names its thread in its Pid line.
thread_switches() {
    [[ -n $1 ]] || return 0
    { cat "/proc/$1/task/"*/status 2>/dev/null || true; } |
        awk '$1 == "Pid:" { t = $2 } /^(non)?voluntary_ctxt_switches:/ { n[t] += $2 } END { for (t in n) print t, n[t] }'
}
# switches_since FILE PID: the switches of PID's threads since thread_switches wrote FILE, thread
# by thread (a thread started since counts from 0; one that ended since is lost: its counts went
# with it, and the process keeps no total of its threads).
switches_since() {
    thread_switches "$2" | awk 'NR == FNR { was[$1] = $2; next } { s += $2 - ($1 in was ? was[$1] : 0) } END { print s + 0 }' "$1" -
}
# CPU of this shell's reaped children (wrk, once it has exited and been waited for).
children_ticks() { awk '{ print $16 + $17 }' "/proc/$$/stat"; }
peak_rss_kb() { [[ -n $1 ]] && proc_kib "$1" VmHWM || echo 0; }
# Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0): a peak per run.
reset_peak_rss() { [[ -z $1 ]] || echo 5 2>/dev/null > "/proc/$1/clear_refs" || true; }

workload_path() { case $1 in large | chain) echo large.bin ;; small | beside) echo small.bin ;; resume) echo resume.bin ;; esac; }
workload_conc() { case $1 in large | chain) echo "$LARGE_CONC" ;; small) echo "$SMALL_CONC" ;; beside) echo "$BESIDE_CONC" ;; resume) echo "$RESUME_CONC" ;; esac; }
workload_targets() {
    case $1 in
        chain) echo "rangeway rangeway-aes rangeway-gzip1" ;;
        *) echo "direct $PROXIES" ;;
    esac
}

# wrk_run WORKLOAD TARGET SECONDS: prints wrk's WRK line (see wrk.lua), then the bytes and
# microseconds of the large downloads run beside it (beside: measured are the small requests).
wrk_run() {
    local env=() bulk_pid="" beside="beside_bytes=0 beside_duration_us=0"
    if [[ $1 == resume ]]; then
        env=(RANGE_OBJECT_BYTES=$((RESUME_MIB * 1024 * 1024)) RANGE_SPAN_BYTES=$((RESUME_RANGE_KIB * 1024)))
    fi
    if [[ $1 == beside ]]; then
        # The large downloads start a second before the measured requests and end a second after.
        "${on_client_cpu[@]}" wrk -t "$WRK_THREADS" -c "$LARGE_CONC" -d "$(($3 + 2))s" --timeout "${WRK_TIMEOUT}s" \
            -s benches/load/wrk.lua "$(url_of "$2" large.bin)" > "$work/beside.out" 2>&1 &
        bulk_pid=$!
        sleep 1
    fi
    local out line
    # counting: a counting run's perf stat, around the measured wrk (see measure).
    out=$(env "${env[@]}" "${counting[@]}" "${on_client_cpu[@]}" wrk -t "$WRK_THREADS" -c "$(workload_conc "$1")" \
        -d "${3}s" --timeout "${WRK_TIMEOUT}s" -s benches/load/wrk.lua "$(url_of "$2" "$(workload_path "$1")")" 2>&1) || true
    # A wrk that could not run at all still gives a row, with -1 connect errors to flag it.
    line=$(grep '^WRK ' <<< "$out") ||
        line="WRK requests=0 bytes=0 duration_us=1 p50_us=0 p99_us=0 max_us=0 status_errors=0 connect_errors=-1 read_errors=0 write_errors=0 timeouts=0"
    if [[ -n $bulk_pid ]]; then
        wait "$bulk_pid" || true
        beside=$(awk '/^WRK / { for (i = 2; i <= NF; i++) { split($i, f, "="); v[f[1]] = f[2] }
            printf "beside_bytes=%.0f beside_duration_us=%.0f", v["bytes"], v["duration_us"] }' "$work/beside.out")
        [[ -n $beside ]] || beside="beside_bytes=0 beside_duration_us=1"
    fi
    echo "$line $beside"
}

raw="$work/raw.tsv"
printf 'workload\ttarget\trep\tload1\tproxy_cpu_s\tproxy_peak_rss_kb\torigin_cpu_s\twrk_cpu_s\tother_cpu_s\twall_s\t%s\n' \
    "requests bytes duration_us p50_us p99_us max_us status_errors connect_errors read_errors write_errors timeouts beside_bytes beside_duration_us machine_cpu_s steal_s all_cpu_s proxy_switches syscalls" |
    sed 's/ /\t/g' > "$raw"

# Waits (up to 10 s) until the proxies' core is idle: what a run leaves in flight — a gzip
# route's last blocks, 100 responses' worth — is not counted against the next target.
proxy_core="cpu${PROXY_CPU%%[,-]*}" # the first, if PROXY_CPU names several
settle() {
    local _ a b idle=$((ticks / 40)) # 5 % of a core over half a second
    for _ in $(seq 20); do
        a=$(busy_ticks "$proxy_core"); sleep 0.5; b=$(busy_ticks "$proxy_core")
        ((b - a <= idle)) && return 0
    done
    echo "  (the proxies' core was still busy after 10 s)"
}

# measure WORKLOAD TARGET REP: one run of DURATION seconds, a row of the raw captures. REP
# "count" is a counting run instead (COUNT_SECONDS, after the timed ones, not among them): perf
# stat counts the proxy's system calls (every thread: the raw_syscalls:sys_enter tracepoint,
# counted in the kernel, no event copied out) over exactly wrk's run.
counting=()
measure() {
    local pid=${pid_of[$2]} load1 p0 o0 w0 m0 s0 a0 t0 line p1 o1 w1 m1 s1 a1 cs t1 seconds=$DURATION
    settle
    reset_peak_rss "$pid"
    load1=$(cut -d' ' -f1 /proc/loadavg)
    if [[ $3 == count ]]; then
        seconds=$COUNT_SECONDS
        rm -f "$work/count.csv"
        counting=(perf stat -x, -o "$work/count.csv" -e raw_syscalls:sys_enter -p "$pid" --)
    fi
    thread_switches "$pid" > "$work/switches.before"
    p0=$(cpu_ticks "$pid"); o0=$(cpu_ticks "$origin_pid"); w0=$(children_ticks)
    read -r m0 s0 a0 <<< "$(stat_ticks)"
    t0=$(date +%s.%N)
    # perf samples rangeway (all threads) for the whole first run of each of its targets.
    local perf_pid=""
    if [[ $PROFILE == perf && $2 == rangeway* && $3 == 1 ]]; then
        perf record -q -F 999 --call-graph dwarf,16384 -p "$pid" -o "$work/perf-$1-$2.data" \
            -- sleep "$DURATION" 2>/dev/null &
        perf_pid=$!
    fi
    # Every proxy's system calls by name (all its threads; counted in the kernel, each call's
    # tracepoint, as the counting run counts them all: perf trace copies every call out and loses
    # some under load), those that would block, and context switches over its first run.
    if [[ $PROFILE == counts && -n $pid && $3 == 1 ]]; then
        local eagain=()
        for call in splice recvfrom read sendfile64 sendfile sendto write writev readv; do
            # Only the tracepoints this kernel has (sendfile is sendfile64 on 64-bit x86).
            [[ -e /sys/kernel/tracing/events/syscalls/sys_exit_$call ]] &&
                eagain+=(-e "syscalls:sys_exit_$call" --filter 'ret == -11')
        done
        { perf stat -x, -e sched:sched_switch -p "$pid" -o "$work/switches-$1-$2.csv" -- sleep "$DURATION" &
          perf stat -x, -e 'syscalls:sys_enter_*' "${eagain[@]}" -p "$pid" \
              -o "$work/syscalls-$1-$2.csv" -- sleep "$DURATION"; wait; } 2>/dev/null &
        perf_pid=$!
    fi
    # The proxy's core, whoever runs there (the proxy alone, pinned): where its time goes in the
    # kernel as well as in its own code, the same way for every proxy.
    if [[ $PROFILE == kernel && -n $pid && $3 == 1 ]]; then
        perf record -q -F 999 -g -C "$PROXY_CPU" -o "$work/kernel-$1-$2.data" \
            -- sleep "$DURATION" 2>/dev/null &
        perf_pid=$!
    fi
    # The other core, where the origin and wrk run: what each target costs its client (direct
    # included), by process and by function.
    if [[ $PROFILE == client && $3 == 1 ]]; then
        perf record -q -F 999 -g -C "$CLIENT_CPU" -o "$work/client-$1-$2.data" \
            -- sleep "$DURATION" 2>/dev/null &
        perf_pid=$!
    fi
    line=$(wrk_run "$1" "$2" "$seconds")
    counting=()
    [[ -z $perf_pid ]] || wait "$perf_pid" || true
    t1=$(date +%s.%N)
    p1=$(cpu_ticks "$pid"); o1=$(cpu_ticks "$origin_pid"); w1=$(children_ticks)
    cs=$(switches_since "$work/switches.before" "$pid")
    read -r m1 s1 a1 <<< "$(stat_ticks)"
    local calls=nan
    if [[ $3 == count ]]; then
        calls=$(awk -F, '$3 ~ /raw_syscalls:sys_enter/ && $1 ~ /^[0-9]+$/ { print $1 }' "$work/count.csv" 2>/dev/null)
        [[ -n $calls ]] || calls=nan
    fi
    # wrk ran in a subshell of $(...), reaped there, then added to ours when the subshell was.
    awk -v w="$1" -v t="$2" -v r="$3" -v l="$load1" -v hz="$ticks" -v p=$((p1 - p0)) -v o=$((o1 - o0)) \
        -v k=$((w1 - w0)) -v m=$((m1 - m0)) -v st=$((s1 - s0)) -v all=$((a1 - a0)) -v cs="$cs" \
        -v calls="$calls" -v t0="$t0" -v t1="$t1" -v rss="$(peak_rss_kb "$pid")" -v line="$line" '
        BEGIN {
            n = split(line, kv, " "); out = ""
            for (i = 2; i <= n; i++) { split(kv[i], f, "="); out = out "\t" f[2] }
            other = (m - p - o - k) / hz; if (other < 0) other = 0
            printf "%s\t%s\t%s\t%s\t%.2f\t%s\t%.2f\t%.2f\t%.2f\t%.2f%s\t%.2f\t%.2f\t%.2f\t%d\t%s\n",
                w, t, r, l, p / hz, rss, o / hz, k / hz, other, t1 - t0, out, m / hz, st / hz, all / hz, cs, calls
        }' >> "$raw"
    tail -1 "$raw" | awk -F'\t' '{ mib = $12 / 1048576; if (mib < 1e-9) mib = 1e-9
        printf "  %-7s %-15s %-5s %9.0f req/s %8.1f MB/s  p99 %7.2f ms  proxy CPU %5.2f s  load %s  steal %.1f %%",
            $1, $2, "rep " $3, $11 / ($13 / 1e6), $12 / ($13 / 1e6) / 1e6, $15 / 1000, $5, $4, 100 * $25 / ($26 > 0 ? $26 : 1)
        if ($3 == "count") printf "  %.1f syscalls/MiB", $28 / mib
        printf "\n" }'
}

# Two processes of one build, in one run, differed as much as the changes being measured, and
# each way in two runs of the same A/A (docs/benchmarks.md, "Known gaps"): something a process
# keeps for its life sets its pace. So rangeway and the build before start afresh for every
# repetition after the first (not under callgrind, whose profile is one process's), warmed up as
# at the start, and a repetition's pair compares two new processes.
fresh_rangeways() { # WORKLOAD
    ((FRESH)) && [[ $PROFILE != callgrind ]] || return 0
    local pid target old=$rangeway_pid
    for pid in "$rangeway_pid" $before_pid; do
        kill -TERM "$pid"
        wait "$pid" 2>/dev/null || true
    done
    start_rangeway rangeway "$bin"
    rangeway_pid=$last_pid
    # Every target served by that process (its routes) is served by the new one.
    for target in "${!pid_of[@]}"; do
        [[ ${pid_of[$target]} != "$old" ]] || pid_of[$target]=$rangeway_pid
    done
    wait_port "$rangeway_port" 10
    if [[ -n $BEFORE_BIN ]]; then
        start_rangeway rangeway-before "$BEFORE_BIN"
        before_pid=$last_pid
        pid_of[rangeway-before]=$before_pid
        wait_port "$before_port" 10
    fi
    for target in "${targets[@]}"; do
        [[ $target == rangeway* ]] && wrk_run "$1" "$target" "$WARMUP" > /dev/null
    done
    return 0
}

start_uptime=$(uptime)
echo "machine before: $start_uptime"
for workload in $WORKLOADS; do
    read -r -a targets <<< "$(workload_targets "$workload")"
    echo "$workload: warm-up (${WARMUP} s per target)"
    for target in "${targets[@]}"; do wrk_run "$workload" "$target" "$WARMUP" > /dev/null; done
    for rep in $(seq "$REPS"); do
        ((rep == 1)) || fresh_rangeways "$workload"
        # Rotate the order each repetition, and run it backwards every other one: rotation alone
        # has each target follow the same neighbour in all but one position (rangeway right
        # after rangeway-before), and in one A/B the build run first of the two moved more in
        # all five repetitions (benches/results/load-2026-12-07-1344.md).
        n=${#targets[@]}
        for i in $(seq 0 $((n - 1))); do
            ((rep % 2)) && at=$i || at=$((n - 1 - i))
            measure "$workload" "${targets[$(((at + rep - 1) % n))]}" "$rep"
        done
    done
    # A counting run of each proxy (beside: the counted window would hold only part of the large
    # downloads' bytes, so none).
    if ((COUNT_SECONDS > 0)) && [[ $workload != beside ]]; then
        for target in "${targets[@]}"; do
            [[ -z ${pid_of[$target]} ]] || measure "$workload" "$target" count
        done
    fi
done
end_uptime=$(uptime)
echo "machine after: $end_uptime"

# ---- report -----------------------------------------------------------------------------------
stamp=$(date +%Y-%m-%d-%H%M)
[[ -n $RAW_DIR ]] || RAW_DIR=$(mktemp -d "${TMPDIR:-/tmp}/rangeway-load-$stamp.XXXXXX")
mkdir -p "$OUT" "$RAW_DIR"
cp "$raw" "$RAW_DIR/load-$stamp.tsv"
{
    printf 'date\t%s\n' "$(date -Is)"
    printf 'command\t%s\n' "$command_line"
    printf 'nproc\t%s\n' "$(nproc)"
    printf 'cpu\t%s\n' "$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
    printf 'kernel\t%s\n' "$(uname -sr)"
    printf 'rangeway\t%s%s\n' "$(git rev-parse --short HEAD)" "$(git diff --quiet HEAD -- src middleware Cargo.toml Cargo.lock || echo ' (modified)')"
    printf 'pingora\t%s\n' "$(awk '/^name = "pingora-proxy"/ { getline; gsub(/"/, "", $3); print $3 }' Cargo.lock)"
    printf 'nginx\t%s\n' "$(nginx -v 2>&1 | sed 's/^nginx version: //')"
    printf 'haproxy\t%s\n' "$(haproxy -v | head -1 | awk '{ print $3 }')"
    printf 'wrk\t%s\n' "$(wrk -v 2>&1 | head -1 | awk '{ print $2 }')"
    printf 'uptime_before\t%s\n' "$start_uptime"
    printf 'uptime_after\t%s\n' "$end_uptime"
    printf 'pinning\t%s\n' "$( [[ ${#on_proxy_cpu[@]} -gt 0 ]] && echo "proxy on CPU $PROXY_CPU, origin and wrk on CPU $CLIENT_CPU" || echo "none (one CPU)")"
    printf 'objects\tlarge %s MiB at %s connections; small %s B at %s (beside the large: at %s); resume: random %s KiB ranges of %s MiB at %s\n' \
        "$LARGE_MIB" "$LARGE_CONC" "$SMALL_BYTES" "$SMALL_CONC" "$BESIDE_CONC" "$RESUME_RANGE_KIB" "$RESUME_MIB" "$RESUME_CONC"
    printf 'runs\t%s repetitions of %s s per target and workload (after %s s of warm-up)\n' "$REPS" "$DURATION" "$WARMUP"
    printf 'floors\tbenches/load/floor_relay.c, %s -O2: splice-floor through a %s KiB pipe, copy-floor through a %s KiB buffer\n' \
        "$(cc --version | head -1)" "$FLOOR_PIPE_KIB" "$FLOOR_COPY_KIB"
    printf 'counting\t%s\n' "$( ((COUNT_SECONDS > 0)) && echo "one run of $COUNT_SECONDS s per proxy and workload after the timed ones, perf stat -e raw_syscalls:sys_enter" || echo "none")"
    printf 'notsent_lowat\t%s\n' "$(sysctl -n net.ipv4.tcp_notsent_lowat)"
    printf 'steal_max\t%s\n' "$STEAL_MAX"
} > "$RAW_DIR/load-$stamp.meta"
python3 benches/load/report.py "$RAW_DIR/load-$stamp.tsv" "$RAW_DIR/load-$stamp.meta" \
    "$OUT/load-$stamp.md" "$RAW_DIR/load-$stamp.svg"
cat "$OUT/load-$stamp.md"
echo
echo "summary written: $OUT/load-$stamp.md"
echo "raw captures (outside the repository): $RAW_DIR/load-$stamp.tsv (every run), .meta (machine,"
echo "versions, command), .svg (chart)${PROFILE:+, -profile.txt}; the summary can be redrawn from"
echo "the first two: python3 benches/load/report.py X.tsv X.meta X.md X.svg"

# ---- profile ----------------------------------------------------------------------------------
# A flat profile: where rangeway's CPU time went, by shared object and function.
profile="$RAW_DIR/load-$stamp-profile.txt"
# perf's comment lines, blank lines, and the padding and empty columns it ends each line with.
tidy() { grep -v '^#' | grep -v '^$' | sed -E 's/[[:space:]]+-[[:space:]]+-[[:space:]]*$//; s/[[:space:]]+$//'; }
# first_run FILE PREFIX: for a profile file named PREFIX-WORKLOAD-TARGET.EXT, sets $name
# (WORKLOAD-TARGET), $workload, $target and $gb, the GB moved in that target's first run.
first_run() {
    name=$(basename "$1"); name=${name%.*}; name=${name#"$2"-}
    workload=${name%%-*}; target=${name#*-}
    gb=$(awk -F'\t' -v w="$workload" -v t="$target" '$1 == w && $2 == t && $3 == 1 { print $12 / 1e9 }' "$raw")
}
# per_gb: perf's "share% [self%] name" lines as the share and CPU seconds per GB moved in the run
# ($gb, from first_run; 999 samples a second, idle ones included).
per_gb() {
    awk -v gb="$gb" -v secs="$DURATION" '$1 ~ /%$/ {
        share = $1; sub(/%/, "", share); for (i = 1; i <= NF && $i ~ /%$/; i++) $i = ""
        printf "  %6.2f%%  %7.3f  %s\n", share, share / 100 * secs / gb, $0 }'
}
case $PROFILE in
    perf)
        for data in "$work"/perf-*.data; do
            [[ -e $data ]] || continue
            echo "== $(basename "$data" .data): perf, $DURATION s, all rangeway threads, self time"
            perf report -i "$data" --stdio --no-children --sort dso,symbol --percent-limit 0.7 -g none 2>/dev/null |
                tidy | head -40 || true   # head may close the pipe early
            echo
            # Who calls the top entries: rangeway's code has no frame pointers, so the stacks are
            # unwound from DWARF (line tables are in the release build).
            echo "== $(basename "$data" .data): callers of the entries above 5 %"
            perf report -i "$data" --stdio --no-children --sort symbol --percent-limit 5 \
                -g caller,2,callee,function,percent --max-stack 24 2>/dev/null |
                tidy | head -120 || true
            echo
        done > "$profile"
        ;;
    counts)
        # perf stat's CSV: a count per tracepoint; per GB moved in the same run (rep 1's bytes,
        # from the raw rows). An EAGAIN is a try on a descriptor that was not ready after all.
        for counts in "$work"/syscalls-*.csv; do
            [[ -e $counts ]] || continue
            first_run "$counts" syscalls
            switches=$(awk -F, '/sched_switch/ { print $1 }' "$work/switches-$name.csv")
            echo "== $workload, $target: $gb GB in the first run; per GB:"
            awk -F, -v gb="$gb" -v sw="$switches" '$1 ~ /^[0-9]+$/ && $3 ~ /sys_enter_/ { total += $1 }
                END { printf "  %-22s %10.0f\n  %-22s %10.0f\n", "context switches", sw / gb, "system calls", total / gb }' "$counts"
            # mawk (Debian's awk) has no sort: per call, then sort(1).
            awk -F, -v gb="$gb" '$1 ~ /^[0-9]+$/ {
                    if ($3 ~ /sys_enter_/) { sub(/.*sys_enter_/, "", $3); n[$3] = $1 }
                    else if ($3 ~ /sys_exit_/) { sub(/.*sys_exit_/, "", $3); eagain[$3] = $1 } }
                END { for (c in n) if (n[c] > 0)
                    printf "    %-20s %10.0f%s\n", c, n[c] / gb, c in eagain ? sprintf("  (%.0f EAGAIN)", eagain[c] / gb) : "" }' "$counts" |
                sort -k2,2nr | head -16
            echo
        done > "$profile"
        ;;
    kernel)
        # In a VM without a PMU perf samples on a timer, whose interrupt waits while interrupts
        # are off: self time piles up where they are turned back on (`_raw_spin_unlock_irqrestore`,
        # `handle_softirqs`). The inclusive view (each function with all it calls) is the one to
        # read: which paths the time is under.
        for data in "$work"/kernel-*.data; do
            [[ -e $data ]] || continue
            first_run "$data" kernel
            echo "== $workload, $target: the proxy's core, $DURATION s, $gb GB; time under each function"
            echo "   share   CPU s/GB  function"
            perf report -i "$data" --stdio --children --sort sym -g none --percent-limit 2 2>/dev/null |
                tidy | per_gb | head -60 || true
            echo
        done > "$profile"
        ;;
    client)
        # The same view of the client core, first by process (wrk, the origin's nginx, idle as
        # swapper), then under each function of wrk's (shares of all the core's samples).
        for data in "$work"/client-*.data; do
            [[ -e $data ]] || continue
            first_run "$data" client
            echo "== $workload, $target: the client core, $DURATION s, $gb GB; by process"
            echo "   share   CPU s/GB  process"
            perf report -i "$data" --stdio --no-children --sort comm -g none 2>/dev/null | tidy | per_gb || true
            echo "   wrk: time under each function"
            perf report -i "$data" --stdio --children --comms wrk --percentage absolute --sort sym -g none \
                --percent-limit 2 2>/dev/null | tidy | per_gb | head -40 || true
            echo
        done > "$profile"
        ;;
    callgrind)
        # SIGTERM: rangeway shuts down (grace_period 1 s) and valgrind writes its profile.
        kill -TERM "$rangeway_pid"
        wait "$rangeway_pid" || true
        { callgrind_annotate "$work/callgrind.out" 2>/dev/null || true; } | head -60 > "$profile"
        ;;
esac
if [[ -n $PROFILE ]]; then
    cat "$profile"
    echo "written: $profile"
fi
