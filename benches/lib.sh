# Shared by the bench scripts (sourced, not run): a scratch directory and a list of started
# processes that are both cleaned up on exit, free ports, waiting for a listener, medians, test
# objects, and the nginx origin every bench proxies to.
#
#   source benches/lib.sh; bench_init rangeway-bench   # sets $work, $pids and the EXIT trap

# bench_setup NAME: what a bench of the release build does first — the bench tools installed,
# rangeway built, $bin set to it — then bench_init NAME. Run from the repository's root.
bench_setup() {
    bash scripts/deps.sh --bench >/dev/null
    cargo build --release --bin rangeway >/dev/null
    # RANGEWAY_BIN: another build to measure (an A/B of a change).
    bin=${RANGEWAY_BIN:-"$(release_dir)/rangeway"}
    bench_init "$1"
}

# Every process a bench starts goes into $pids; the trap stops them (and their children: nginx
# masters take their workers down on SIGTERM) and removes the scratch directory.
#
# bench_init NAME [--no-summary]: the scratch directory ($work, under $TMPDIR) holds the objects,
# configs, logs and raw captures; it is removed on exit unless KEEP_RAW=1 (then its path is
# printed at the end). Unless --no-summary (the load harness writes its own report), what the run
# prints also goes into its one summary file, benches/results/NAME-<date>-<time>.md (RESULTS=DIR
# for another directory, RESULTS= for none): the command, its parameters, the commit and the
# machine, then the output as printed. A run that fails leaves no summary.
bench_init() {
    work=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
    pids=()
    summary=
    if [[ ${2:-} != --no-summary ]]; then
        local name=${1#rangeway-}
        bench_summary "${name%-bench}"
    fi
    trap bench_cleanup EXIT
    trap 'exit 130' INT TERM
}
# bench_summary NAME: starts the run's summary file (see bench_init); stdout is copied into it.
bench_summary() {
    local dir=${RESULTS-benches/results} name params=
    [[ -n $dir ]] || return 0
    # The script's parameters as this run has them: every upper-case variable it reads that is set.
    [[ -f $0 ]] && for name in $(grep -oE '\$\{[A-Z][A-Z0-9_]*' "$0" | cut -c3- | sort -u); do
        [[ -v $name ]] && params+=" $name=${!name}"
    done
    mkdir -p "$dir"
    summary="$dir/$1-$(date -u +%Y-%m-%d-%H%M%S).md"
    {
        echo "# $1 ($(date -u +%Y-%m-%d))"
        echo
        echo "- command: \`$(tr '\0' ' ' < /proc/$$/cmdline | sed 's/ $//')\`"
        echo "- parameters:${params:- (none)}"
        echo "- rangeway: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src middleware Cargo.toml Cargo.lock || echo ' (modified)')"
        echo "- machine: $(nproc) CPUs, $(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo), $(uname -sr)"
        echo "- taken: $(date -Is); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
        echo "- raw captures: not kept (the scratch directory under \$TMPDIR; KEEP_RAW=1 keeps it)"
        echo
        echo "What the run printed:"
        echo
        echo '```'
    } > "$summary"
    exec 3>&1
    exec > >(tee -a "$summary")
    summary_tee=$!
}
# system_notsent_lowat BYTES: net.ipv4.tcp_notsent_lowat set to BYTES on the whole machine (root)
# for the rest of the bench, on every socket of every process; the system's value is restored on
# exit, before the servers are stopped (bench_cleanup still sees the run's exit status).
system_notsent_lowat() {
    system_lowat=$(sysctl -n net.ipv4.tcp_notsent_lowat)
    sysctl -qw net.ipv4.tcp_notsent_lowat="$1"
    trap 'status=$?; sysctl -qw net.ipv4.tcp_notsent_lowat="$system_lowat"; (exit $status); bench_cleanup' EXIT
}
bench_cleanup() {
    local status=$? p f
    # On failure, the servers' own words are the quickest diagnosis: show their logs' tails.
    if [[ $status -ne 0 ]]; then
        for f in "$work"/*.log "$work"/*/error.log; do
            [[ -s $f ]] && { echo "== ${f#"$work"/}"; tail -5 "$f"; } >&2
        done
    fi
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    if [[ -n ${summary:-} ]]; then
        exec >&3 3>&-
        wait "$summary_tee" 2>/dev/null || true
        if [[ $status -eq 0 ]]; then
            echo '```' >> "$summary"
            echo "summary written: $summary"
        else
            rm -f "$summary"
        fi
    fi
    if [[ ${KEEP_RAW:-0} == 1 ]]; then
        echo "raw captures and scratch files kept: $work"
    else
        rm -rf "$work"
    fi
}

# A port nobody listens on now: the kernel picks it, python releases it, the caller binds it.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_port PORT [SECONDS]: waits (10 s by default) for something to accept on 127.0.0.1:PORT;
# fails the bench otherwise.
wait_port() {
    local _
    for _ in $(seq $((${2:-10} * 10))); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing listens on 127.0.0.1:$1 after ${2:-10} s" >&2
    return 1
}

# cpu_seconds PID: the CPU seconds (user + system) process PID has used so far.
cpu_seconds() {
    awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"
}

# machine_seconds: the CPU seconds every core has spent busy (user, nice, system, irq, softirq)
# since boot. On loopback the kernel's TCP work for a byte (segmenting, delivering, waking the
# reader, freeing) runs in whichever process's context pushes it — the sender's system call, or
# the receiver's when its ACK releases more — so a proxy's own CPU time can rise or fall with
# when its client reads; the machine's total, with the same client and origin, cannot.
machine_seconds() {
    awk -v hz="$(getconf CLK_TCK)" '$1 == "cpu" { print ($2 + $3 + $4 + $7 + $8) / hz }' /proc/stat
}

# wrk_download CONNECTIONS SECONDS URL: wrk (one thread, on $CLIENT_CPU or CPU 1) downloading URL
# over CONNECTIONS for SECONDS with benches/load/wrk.lua; sets $requests, $bytes (headers
# included), $us (the run's length) and $p99 (µs), and fails the bench if any request failed.
wrk_download() {
    local out errors
    out=$(taskset -c "${CLIENT_CPU:-1}" wrk -t1 -c"$1" -d"${2}s" --timeout 120s \
        -s benches/load/wrk.lua "$3" | grep '^WRK')
    requests=$(sed 's/.*requests=\([0-9]*\).*/\1/' <<<"$out")
    bytes=$(sed 's/.*bytes=\([0-9]*\).*/\1/' <<<"$out")
    us=$(sed 's/.*duration_us=\([0-9]*\).*/\1/' <<<"$out")
    p99=$(sed 's/.*p99_us=\([0-9]*\).*/\1/' <<<"$out")
    errors=$(grep -o '_errors=[0-9]*\|timeouts=[0-9]*' <<<"$out" | cut -d= -f2 | awk '{ s += $1 } END { print s + 0 }')
    [[ $errors == 0 ]] || { echo "$3: $out" >&2; return 1; }
}

# proc_kib PID FIELD: a kB field of /proc/PID/status (VmRSS, VmHWM), in KiB.
proc_kib() {
    awk -v field="$2:" '$1 == field { print $2 }' "/proc/$1/status"
}

# Median of the numbers on stdin, one per line.
median() {
    sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

# fill_object PATH BYTES: half random, half repeated text, so neither the best nor the worst
# case for gzip. (`yes` dies of SIGPIPE when head is done; `|| true` keeps pipefail quiet.)
fill_object() {
    local half=$(($2 / 2))
    head -c "$half" /dev/urandom > "$1"
    { yes "rangeway resumes every download at any byte, through every stage of its chain." || true; } |
        head -c $(($2 - half)) >> "$1"
}

# nginx_common DIR: the lines every nginx a bench starts shares: its own pid file, logs and temp
# paths under DIR (so several instances coexist and nothing touches /var), root's user when root.
nginx_common() {
    [ "$(id -u)" = 0 ] && echo "user root;"
    cat <<CONF
pid $1/nginx.pid;
error_log $1/error.log;
CONF
}
nginx_http_common() {
    cat <<CONF
  access_log off;
  client_body_temp_path $1/tmp; proxy_temp_path $1/tmp;
  fastcgi_temp_path $1/tmp; uwsgi_temp_path $1/tmp; scgi_temp_path $1/tmp;
CONF
}

# origin_nginx_conf DIR PORT ROOT [WORKER_CONNECTIONS]: nginx serving ROOT statically with
# sendfile, single process (master_process off), keep-alive connections never recycled.
origin_nginx_conf() {
    mkdir -p "$1/tmp"
    cat > "$1/nginx.conf" <<CONF
master_process off;
$(nginx_common "$1")
worker_rlimit_nofile $(ulimit -n);
events { worker_connections ${4:-1024}; }
http {
$(nginx_http_common "$1")
  sendfile on;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$2 backlog=4096; root $3; location / { } }
}
CONF
}

# start_origin CPU [WORKER_CONNECTIONS]: the nginx origin a bench proxies to, serving $work/root
# (configured in $work/origin) on a free port, set in $origin_port, pinned to CPU; it accepts
# connections once this returns.
start_origin() {
    origin_port=$(free_port)
    origin_nginx_conf "$work/origin" "$origin_port" "$work/root" "${2:-1024}"
    start_nginx "$work/origin" taskset -c "$1"
    wait_port "$origin_port"
}

# release_dir: where cargo puts release builds, as an absolute path (CARGO_TARGET_DIR may be
# either; the benches run from the repository's root).
release_dir() {
    local dir=${CARGO_TARGET_DIR:-target}
    [[ $dir == /* ]] || dir="$PWD/$dir"
    echo "$dir/release"
}

# rangeway_conf PORT ORIGIN_PORT [SERVER_LINE]: a rangeway as the benches run it — one worker
# thread, the memory state store — with the passthrough route "/" to the origin; a bench appends
# its other routes. SERVER_LINE goes into [server] (an A/B's setting).
rangeway_conf() {
    cat <<CONF
[server]
${3:-}
listen = "127.0.0.1:$1"
admin_listen = "127.0.0.1:$(free_port)"
threads = 1
grace_period = "1s"
[state]
backend = "memory"
[upstreams.origin]
url = "http://127.0.0.1:$2"
[[routes]]
path_prefix = "/"
upstream = "origin"
CONF
}

# small_request_setup NAME: what the per-request counts (load/instructions.sh,
# load/allocations.sh) run on — the bench tools installed, rangeway and pingora-floor built, an
# nginx origin serving a 16-byte small.bin; sets $release, $origin_port, $rangeway_port (its
# config in $work/rangeway.toml) and $pingora_port.
small_request_setup() {
    bash scripts/deps.sh --bench
    echo "building rangeway and the pingora floor (release)..."
    cargo build --release --bin rangeway --example pingora-floor >/dev/null
    release=$(release_dir)
    bench_init "$1"
    ulimit -n "$(ulimit -Hn)"
    mkdir -p "$work/root"
    head -c 16 /dev/urandom > "$work/root/small.bin"
    origin_port=$(free_port)
    origin_nginx_conf "$work/origin" "$origin_port" "$work/root" 1024
    start_nginx "$work/origin"
    wait_port "$origin_port"
    rangeway_port=$(free_port)
    rangeway_conf "$rangeway_port" "$origin_port" > "$work/rangeway.toml"
    pingora_port=$(free_port)
}

# start_bg CMD...: CMD in the background as a direct child of this shell (so the pid recorded is
# the server's own, not a subshell's that would leave the server running when killed); sets
# $last_pid and adds it to $pids. Redirections on the call apply to CMD.
start_bg() {
    "$@" &
    last_pid=$!
    pids+=("$last_pid")
}

# start_nginx DIR [PREFIX...]: the nginx configured in DIR/nginx.conf, in the foreground of its
# own process (daemon off), started through PREFIX (e.g. taskset -c 1) if given.
start_nginx() {
    local dir=$1
    shift
    start_bg "$@" nginx -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" -g 'daemon off;'
}
