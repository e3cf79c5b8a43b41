#!/usr/bin/env bash
# TLS termination beside nginx's and HAProxy's, all three in front of one nginx origin, one core
# each, with the same ECDSA P-256 certificate and the same cipher (TLS 1.3, AES-128-GCM: the one
# h2load offers first; HAProxy would pick AES-256 by its own preference, so it is the only one
# offered):
#
#  1. SIZE_MIB downloads by CONC connections over TLS, on HTTP/1.1 and on HTTP/2 (one stream a
#     connection, so only the protocol differs), REQUESTS_PER_CONN each, REPS runs alternating:
#     downloads/s, the proxy's CPU seconds per GB, the machine's (see machine_seconds in
#     lib.sh), p99 of a download;
#  2. one BIG_MIB download over one HTTP/2 stream beside one HTTP/1.1 connection, through
#     rangeway, REPS runs alternating: MB/s, and h2's share of HTTP/1.1's.
#
#   bash benches/tls.sh        (SIZE_MIB=10 CONC=100 REQUESTS_PER_CONN=3 REPS=3 BIG_MIB=1024
#                               PARTS="1 2")
#
# Every proxy's answer is checked against the object's bytes before anything is timed.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MIB=${SIZE_MIB:-10}
CONC=${CONC:-100}
REQUESTS_PER_CONN=${REQUESTS_PER_CONN:-3}
REPS=${REPS:-3}
BIG_MIB=${BIG_MIB:-1024}
PROXY_CPU=${PROXY_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
PARTS=${PARTS:-1 2}
source benches/lib.sh
bench_setup rangeway-tls-bench

mkdir -p "$work/root" "$work/origin"
fill_object "$work/root/obj.bin" $((SIZE_MIB << 20))
fill_object "$work/root/big.bin" $((BIG_MIB << 20))
start_origin "$CLIENT_CPU" 4096

# One certificate for all three: ECDSA P-256, for localhost.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=localhost \
    -addext subjectAltName=DNS:localhost -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
cat "$work/cert.pem" "$work/key.pem" > "$work/haproxy.pem"

declare -A ports procs
start_rangeway() {
    local port plain
    port=$(free_port)
    plain=$(free_port)
    { rangeway_conf "$plain" "$origin_port"
      printf '[tls]\nlisten = "127.0.0.1:%s"\n' "$port"
      printf '[[tls.certificates]]\ncert_file = "%s"\nkey_file = "%s"\n' \
          "$work/cert.pem" "$work/key.pem"; } > "$work/rangeway.toml"
    RUST_LOG=warn start_bg taskset -c "$PROXY_CPU" "$bin" serve --config "$work/rangeway.toml" \
        >"$work/rangeway.log" 2>&1
    ports[rangeway]=$port; procs[rangeway]=$last_pid
    wait_port "$port"
}
start_nginx_tls() {
    local port dir=$work/nginx
    port=$(free_port)
    mkdir -p "$dir/tmp"
    cat > "$dir/nginx.conf" <<CONF
master_process off;
$(nginx_common "$dir")
worker_rlimit_nofile $(ulimit -n);
events { worker_connections 4096; }
http {
$(nginx_http_common "$dir")
  keepalive_requests 1000000;
  upstream origin { server 127.0.0.1:$origin_port; keepalive 128; }
  server {
    listen 127.0.0.1:$port ssl http2 backlog=4096;
    ssl_certificate $work/cert.pem;
    ssl_certificate_key $work/key.pem;
    ssl_protocols TLSv1.2 TLSv1.3;
    location / {
      # Bodies pass through memory buffers only, as in the other two (nginx would otherwise
      # spill 10 MiB answers to temporary files when clients read slower than the origin sends).
      proxy_max_temp_file_size 0;
      proxy_buffers 16 64k;
      proxy_buffer_size 64k;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_pass http://origin;
    }
  }
}
CONF
    start_nginx "$dir" taskset -c "$PROXY_CPU"
    ports[nginx]=$port; procs[nginx]=$last_pid
    wait_port "$port"
}
start_haproxy() {
    local port
    port=$(free_port)
    cat > "$work/haproxy.cfg" <<CONF
global
  nbthread 1
  maxconn 4096
  ssl-default-bind-options ssl-min-ver TLSv1.2
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  http-reuse always
frontend tls
  bind 127.0.0.1:$port ssl crt $work/haproxy.pem alpn h2,http/1.1
  default_backend origin
backend origin
  server origin 127.0.0.1:$origin_port
CONF
    start_bg taskset -c "$PROXY_CPU" haproxy -db -f "$work/haproxy.cfg" >"$work/haproxy.log" 2>&1
    ports[haproxy]=$port; procs[haproxy]=$last_pid
    wait_port "$port"
}
start_rangeway
start_nginx_tls
start_haproxy
targets=(rangeway nginx haproxy)

want=$(sha256sum < "$work/root/obj.bin" | cut -d' ' -f1)
for t in "${targets[@]}"; do
    for protocol in --http1.1 --http2; do
        got=$(curl -sk "$protocol" "https://localhost:${ports[$t]}/obj.bin" | sha256sum | cut -d' ' -f1)
        [[ $got == "$want" ]] || { echo "$t served wrong bytes over $protocol" >&2; exit 1; }
    done
done

part() { [[ " $PARTS " == *" $1 "* ]]; }

if part 1; then
requests=$((CONC * REQUESTS_PER_CONN))
echo "1. ${SIZE_MIB} MiB downloads over TLS, $CONC connections, $requests downloads a run, $REPS runs"
declare -A rates cpus machine p99s ciphers
for rep in $(seq "$REPS"); do
    for protocol in h1 h2; do
        line="run $rep $protocol:"
        for t in "${targets[@]}"; do
            flags=(-c "$CONC" -m 1 -n "$requests" -t 1 --log-file="$work/h2load.log"
                --tls13-ciphers=TLS_AES_128_GCM_SHA256)
            [[ $protocol == h1 ]] && flags+=(--h1)
            before=$(cpu_seconds "${procs[$t]}"); machine_before=$(machine_seconds)
            out=$(taskset -c "$CLIENT_CPU" h2load "${flags[@]}" "https://localhost:${ports[$t]}/obj.bin")
            after=$(cpu_seconds "${procs[$t]}"); machine_after=$(machine_seconds)
            grep -q "requests: $requests total, $requests started, $requests done, $requests succeeded" <<<"$out" ||
                { echo "$t $protocol: $out" >&2; exit 1; }
            ciphers[$t $protocol]=$(awk '/^Cipher:/ { print $2 } /^Application protocol:/ { print $3 }' <<<"$out" | paste -sd' ')
            secs=$(awk '/^finished in/ { sub(/s,$/, "", $3); print $3 }' <<<"$out")
            rate=$(awk -v n="$requests" -v s="$secs" 'BEGIN { printf "%.1f", n / s }')
            cpu=$(awk -v a="$after" -v b="$before" -v n="$requests" -v m="$SIZE_MIB" \
                'BEGIN { printf "%.3f", (a - b) / (n * m * 1048576 / 1e9) }')
            p99=$(awk '{ print $3 / 1000 }' "$work/h2load.log" | sort -g |
                awk '{ a[NR] = $1 } END { printf "%.0f", a[int(NR * 0.99)] }')
            all=$(awk -v a="$machine_after" -v b="$machine_before" -v n="$requests" -v m="$SIZE_MIB" \
                'BEGIN { printf "%.3f", (a - b) / (n * m * 1048576 / 1e9) }')
            rates[$t $protocol]+="$rate "; cpus[$t $protocol]+="$cpu "; p99s[$t $protocol]+="$p99 "
            machine[$t $protocol]+="$all "
            line+=" $t $rate/s"
        done
        echo "$line"
    done
done
printf '%-9s %-5s %-28s %12s %12s %14s %10s\n' proxy proto "cipher, ALPN" "downloads/s" "CPU s/GB" \
    "machine s/GB" "p99 ms"
for protocol in h1 h2; do
    for t in "${targets[@]}"; do
        printf '%-9s %-5s %-28s %12s %12s %14s %10s\n' "$t" "$protocol" "${ciphers[$t $protocol]}" \
            "$(tr ' ' '\n' <<<"${rates[$t $protocol]}" | grep . | median)" \
            "$(tr ' ' '\n' <<<"${cpus[$t $protocol]}" | grep . | median)" \
            "$(tr ' ' '\n' <<<"${machine[$t $protocol]}" | grep . | median)" \
            "$(tr ' ' '\n' <<<"${p99s[$t $protocol]}" | grep . | median)"
    done
done

fi

if part 2; then
echo "2. one ${BIG_MIB} MiB download through rangeway: one HTTP/2 stream beside one HTTP/1.1 connection"
want_big=$(sha256sum < "$work/root/big.bin" | cut -d' ' -f1)
got=$(curl -sk --http2 "https://localhost:${ports[rangeway]}/big.bin" | sha256sum | cut -d' ' -f1)
[[ $got == "$want_big" ]] || { echo "rangeway served wrong bytes over h2" >&2; exit 1; }
declare -A big
for rep in $(seq "$REPS"); do
    line="run $rep:"
    for protocol in http1.1 http2; do
        speed=$(taskset -c "$CLIENT_CPU" curl -sk "--$protocol" -o /dev/null -w '%{speed_download}' \
            "https://localhost:${ports[rangeway]}/big.bin")
        mbs=$(awk -v s="$speed" 'BEGIN { printf "%.0f", s / 1e6 }')
        big[$protocol]+="$mbs "
        line+=" $protocol $mbs MB/s"
    done
    echo "$line"
done
h1=$(tr ' ' '\n' <<<"${big[http1.1]}" | grep . | median)
h2=$(tr ' ' '\n' <<<"${big[http2]}" | grep . | median)
echo "median: HTTP/1.1 $h1 MB/s, HTTP/2 $h2 MB/s: h2 $(awk -v a="$h2" -v b="$h1" 'BEGIN { printf "%.2f", a / b }')x HTTP/1.1"
fi
