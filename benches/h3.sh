#!/usr/bin/env bash
# HTTP/3 to clients: rangeway's QUIC listener beside its HTTP/2 over TLS, and beside Caddy's
# HTTP/3 (Debian's caddy, as a reverse proxy), all in front of one nginx origin, one core each,
# the same ECDSA P-256 certificate:
#
#  1. SIZE_MIB downloads by CONC connections, REQUESTS_PER_CONN each, REPS runs alternating:
#     rangeway over HTTP/3 and over HTTP/2 (h2load, one stream a connection), Caddy over HTTP/3:
#     downloads/s, the proxy's CPU seconds per GB, the machine's (see machine_seconds in lib.sh),
#     p99 of a download;
#  2. one BIG_MIB download, REPS runs: rangeway over HTTP/3 and over HTTP/2, Caddy over HTTP/3:
#     MB/s;
#  3. one LOSS_MIB download through a UDP relay that drops 1 % and 5 % of the datagrams each way
#     and reorders as many: MB/s over HTTP/3, rangeway and Caddy. HTTP/2 under the same loss
#     would need dropping TCP segments (tc netem, or a TUN relay): this machine has no sch_netem,
#     so HTTP/3 alone.
#  4. cache hits: SIZE_MIB downloads by CONC connections over HTTP/3 of an object rangeway's
#     slice cache holds (warmed first), REPS runs: downloads/s and the proxy's CPU seconds per
#     GB; BEFORE_BIN=PATH runs that rangeway binary beside it, alternating.
#
#   bash benches/h3.sh        (SIZE_MIB=10 CONC=100 REQUESTS_PER_CONN=3 REPS=3 BIG_MIB=1024
#                              LOSS_MIB=64 PARTS="1 2 3 4" BEFORE_BIN=)
#
# HTTP/3 load comes from benches/load/h3_load.rs (h2load and curl speak no HTTP/3 as Debian
# builds them). Every server's answer is checked against the object's bytes before anything is
# timed.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MIB=${SIZE_MIB:-10}
CONC=${CONC:-100}
REQUESTS_PER_CONN=${REQUESTS_PER_CONN:-3}
REPS=${REPS:-3}
BIG_MIB=${BIG_MIB:-1024}
LOSS_MIB=${LOSS_MIB:-64}
PROXY_CPU=${PROXY_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
PARTS=${PARTS:-1 2 3 4}
source benches/lib.sh
bench_setup rangeway-h3-bench
cargo build --release --example h3-load >/dev/null
load="$(release_dir)/examples/h3-load"

mkdir -p "$work/root" "$work/origin"
fill_object "$work/root/obj.bin" $((SIZE_MIB << 20))
fill_object "$work/root/big.bin" $((BIG_MIB << 20))
fill_object "$work/root/lossy.bin" $((LOSS_MIB << 20))
start_origin "$CLIENT_CPU" 4096

# Not a CA (openssl's default for -x509): the load client checks it as rustls does, which refuses
# a CA certificate as a server's.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=localhost \
    -addext subjectAltName=DNS:localhost -addext basicConstraints=critical,CA:FALSE \
    -addext extendedKeyUsage=serverAuth -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null

declare -A ports procs
# start_rangeway [NAME BIN EXTRA]: rangeway (NAME, default rangeway) from BIN (default this
# build's), EXTRA appended to its config.
start_rangeway() {
    local name=${1:-rangeway} binary=${2:-$bin} extra=${3:-} port plain
    port=$(free_port)
    plain=$(free_port)
    { rangeway_conf "$plain" "$origin_port"
      printf '%s\n' "$extra"
      printf '[tls]\nlisten = "127.0.0.1:%s"\n' "$port"
      printf '[[tls.certificates]]\ncert_file = "%s"\nkey_file = "%s"\n' \
          "$work/cert.pem" "$work/key.pem"
      # Every connection comes from one address here: the per-address bound and the Retry
      # threshold, there for many clients, would refuse or delay the load's own connections.
      printf '[tls.h3]\nmax_connections_per_client = %s\nretry_above_handshakes = %s\n' \
          $((CONC + 16)) $((CONC + 16)); } > "$work/$name.toml"
    RUST_LOG=warn start_bg taskset -c "$PROXY_CPU" "$binary" serve --config "$work/$name.toml" \
        >"$work/$name.log" 2>&1
    ports[$name]=$port; procs[$name]=$last_pid
    wait_port "$port"
}
start_caddy() {
    local port
    port=$(free_port)
    cat > "$work/Caddyfile" <<CONF
{
  admin off
  auto_https off
  servers {
    protocols h1 h2 h3
  }
}
https://localhost:$port {
  tls $work/cert.pem $work/key.pem
  reverse_proxy 127.0.0.1:$origin_port
}
CONF
    GOMAXPROCS=1 XDG_DATA_HOME="$work/caddy" XDG_CONFIG_HOME="$work/caddy" \
        start_bg taskset -c "$PROXY_CPU" caddy run --adapter caddyfile --config "$work/Caddyfile" \
        >"$work/caddy.log" 2>&1
    ports[caddy]=$port; procs[caddy]=$last_pid
    wait_port "$port"
}
start_rangeway
start_caddy

# h3_load TARGET ARGS...: the HTTP/3 load client against TARGET, on the client's core.
h3_load() {
    local target=$1
    shift
    taskset -c "$CLIENT_CPU" "$load" --connect "127.0.0.1:${ports[$target]}" --ca "$work/cert.pem" "$@"
}

for object in obj big lossy; do
    want=$(sha256sum < "$work/root/$object.bin" | cut -d' ' -f1)
    for t in rangeway caddy; do
        got=$(h3_load "$t" --path "/$object.bin" --sha256)
        [[ $got == "$want" ]] || { echo "$t served wrong bytes of $object.bin over h3" >&2; exit 1; }
    done
    got=$(curl -sk --http2 "https://localhost:${ports[rangeway]}/$object.bin" | sha256sum | cut -d' ' -f1)
    [[ $got == "$want" ]] || { echo "rangeway served wrong bytes of $object.bin over h2" >&2; exit 1; }
done

part() { [[ " $PARTS " == *" $1 "* ]]; }
# field LINE NAME: NAME's value in an `H3 name=value ...` line.
field() { sed "s/.*$2=\([0-9.]*\).*/\1/" <<<"$1"; }

if part 1; then
requests=$((CONC * REQUESTS_PER_CONN))
echo "1. ${SIZE_MIB} MiB downloads, $CONC connections, $requests downloads a run, $REPS runs"
declare -A rates cpus machine p99s
kinds=("rangeway h3" "rangeway h2" "caddy h3")
for rep in $(seq "$REPS"); do
    line="run $rep:"
    for kind in "${kinds[@]}"; do
        read -r t protocol <<<"$kind"
        before=$(cpu_seconds "${procs[$t]}"); machine_before=$(machine_seconds)
        if [[ $protocol == h3 ]]; then
            out=$(h3_load "$t" --path /obj.bin --connections "$CONC" --requests "$requests")
            [[ $(field "$out" requests) == "$requests" && $(field "$out" failed) == 0 ]] ||
                { echo "$kind: $out" >&2; exit 1; }
            secs=$(field "$out" seconds)
            p99=$(field "$out" p99_ms)
        else
            out=$(taskset -c "$CLIENT_CPU" h2load -c "$CONC" -m 1 -n "$requests" -t 1 \
                --log-file="$work/h2load.log" "https://localhost:${ports[$t]}/obj.bin")
            grep -q "requests: $requests total, $requests started, $requests done, $requests succeeded" <<<"$out" ||
                { echo "$kind: $out" >&2; exit 1; }
            # h2load says "finished in 812.35ms," for a short run, "finished in 3.02s," else.
            secs=$(awk '/^finished in/ { v = $3; sub(/,$/, "", v)
                if (v ~ /ms$/) { sub(/ms$/, "", v); v /= 1000 } else sub(/s$/, "", v); print v }' <<<"$out")
            p99=$(awk '{ print $3 / 1000 }' "$work/h2load.log" | sort -g |
                awk '{ a[NR] = $1 } END { printf "%.0f", a[int(NR * 0.99)] }')
        fi
        after=$(cpu_seconds "${procs[$t]}"); machine_after=$(machine_seconds)
        rate=$(awk -v n="$requests" -v s="$secs" 'BEGIN { printf "%.1f", n / s }')
        gb=$(awk -v n="$requests" -v m="$SIZE_MIB" 'BEGIN { print n * m * 1048576 / 1e9 }')
        rates[$kind]+="$rate "; p99s[$kind]+="$p99 "
        cpus[$kind]+="$(awk -v a="$after" -v b="$before" -v g="$gb" 'BEGIN { printf "%.3f", (a - b) / g }') "
        machine[$kind]+="$(awk -v a="$machine_after" -v b="$machine_before" -v g="$gb" 'BEGIN { printf "%.3f", (a - b) / g }') "
        line+=" $kind $rate/s"
    done
    echo "$line"
done
printf '%-9s %-5s %12s %12s %14s %10s\n' proxy proto "downloads/s" "CPU s/GB" "machine s/GB" "p99 ms"
for kind in "${kinds[@]}"; do
    read -r t protocol <<<"$kind"
    printf '%-9s %-5s %12s %12s %14s %10s\n' "$t" "$protocol" \
        "$(tr ' ' '\n' <<<"${rates[$kind]}" | grep . | median)" \
        "$(tr ' ' '\n' <<<"${cpus[$kind]}" | grep . | median)" \
        "$(tr ' ' '\n' <<<"${machine[$kind]}" | grep . | median)" \
        "$(tr ' ' '\n' <<<"${p99s[$kind]}" | grep . | median)"
done
fi

# mb_per_s TARGET PATH MIB [--loss P]: one download over HTTP/3, in MB/s.
mb_per_s() {
    local target=$1 path=$2 mib=$3 out
    shift 3
    out=$(h3_load "$target" --path "$path" "$@")
    [[ $(field "$out" failed) == 0 ]] || { echo "$target $path: $out" >&2; return 1; }
    awk -v m="$mib" -v s="$(field "$out" seconds)" 'BEGIN { printf "%.0f", m * 1048576 / 1e6 / s }'
}

if part 2; then
echo "2. one ${BIG_MIB} MiB download, $REPS runs"
declare -A big
for rep in $(seq "$REPS"); do
    h3=$(mb_per_s rangeway /big.bin "$BIG_MIB")
    speed=$(taskset -c "$CLIENT_CPU" curl -sk --http2 -o /dev/null -w '%{speed_download}' \
        "https://localhost:${ports[rangeway]}/big.bin")
    h2=$(awk -v s="$speed" 'BEGIN { printf "%.0f", s / 1e6 }')
    caddy=$(mb_per_s caddy /big.bin "$BIG_MIB")
    big[h3]+="$h3 "; big[h2]+="$h2 "; big[caddy]+="$caddy "
    echo "run $rep: rangeway h3 $h3 MB/s, rangeway h2 $h2 MB/s, caddy h3 $caddy MB/s"
done
echo "median: rangeway h3 $(tr ' ' '\n' <<<"${big[h3]}" | grep . | median) MB/s," \
    "rangeway h2 $(tr ' ' '\n' <<<"${big[h2]}" | grep . | median) MB/s," \
    "caddy h3 $(tr ' ' '\n' <<<"${big[caddy]}" | grep . | median) MB/s"
fi

if part 3; then
echo "3. one ${LOSS_MIB} MiB download over HTTP/3 through a relay losing and reordering datagrams, $REPS runs (HTTP/2: no sch_netem here)"
for loss in 0.01 0.05; do
    declare -A lossy=()
    for rep in $(seq "$REPS"); do
        for t in rangeway caddy; do
            lossy[$t]+="$(mb_per_s "$t" /lossy.bin "$LOSS_MIB" --loss "$loss") "
        done
    done
    echo "loss $loss: rangeway $(tr ' ' '\n' <<<"${lossy[rangeway]}" | grep . | median) MB/s," \
        "caddy $(tr ' ' '\n' <<<"${lossy[caddy]}" | grep . | median) MB/s (medians)"
done
fi

if part 4; then
requests=$((CONC * REQUESTS_PER_CONN))
echo "4. cache hits over HTTP/3: ${SIZE_MIB} MiB downloads, $CONC connections, $requests a run, $REPS runs"
cached=(rangeway-cache)
start_rangeway rangeway-cache "$bin" "$(printf '[cache]\ndir = "%s"' "$work/cache")"
if [[ -n ${BEFORE_BIN:-} ]]; then
    start_rangeway rangeway-cache-before "$BEFORE_BIN" \
        "$(printf '[cache]\ndir = "%s"' "$work/cache-before")"
    cached+=(rangeway-cache-before)
    echo "rangeway-cache-before: $BEFORE_BIN"
fi
want=$(sha256sum < "$work/root/obj.bin" | cut -d' ' -f1)
for t in "${cached[@]}"; do
    # The first download fills the cache; the second is a hit, checked byte for byte.
    h3_load "$t" --path /obj.bin --sha256 >/dev/null
    sleep 1
    [[ $(h3_load "$t" --path /obj.bin --sha256) == "$want" ]] ||
        { echo "$t served wrong bytes of obj.bin from its cache" >&2; exit 1; }
done
declare -A hit_rates hit_cpus
for rep in $(seq "$REPS"); do
    line="run $rep:"
    for t in "${cached[@]}"; do
        before=$(cpu_seconds "${procs[$t]}")
        out=$(h3_load "$t" --path /obj.bin --connections "$CONC" --requests "$requests")
        [[ $(field "$out" requests) == "$requests" && $(field "$out" failed) == 0 ]] ||
            { echo "$t: $out" >&2; exit 1; }
        after=$(cpu_seconds "${procs[$t]}")
        rate=$(awk -v n="$requests" -v s="$(field "$out" seconds)" 'BEGIN { printf "%.1f", n / s }')
        gb=$(awk -v n="$requests" -v m="$SIZE_MIB" 'BEGIN { print n * m * 1048576 / 1e9 }')
        hit_rates[$t]+="$rate "
        hit_cpus[$t]+="$(awk -v a="$after" -v b="$before" -v g="$gb" 'BEGIN { printf "%.3f", (a - b) / g }') "
        line+=" $t $rate/s"
    done
    echo "$line"
done
printf '%-22s %12s %12s\n' proxy "downloads/s" "CPU s/GB"
for t in "${cached[@]}"; do
    printf '%-22s %12s %12s\n' "$t" \
        "$(tr ' ' '\n' <<<"${hit_rates[$t]}" | grep . | median)" \
        "$(tr ' ' '\n' <<<"${hit_cpus[$t]}" | grep . | median)"
done
fi
