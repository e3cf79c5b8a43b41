#!/usr/bin/env bash
# Installs the system tools rangeway needs, as much as the caller needs:
#
#   scripts/deps.sh           building it (scripts/run): cmake (pingora's libz-ng-sys), a C/C++
#                             toolchain, pkg-config, CA certificates
#   scripts/deps.sh --test    and testing it (scripts/test): the real servers and clients the
#                             integration tests drive (nginx, redis-server, curl, wget, aria2c,
#                             openssl, gzip, python3, node and npm (the HTTP WG cache
#                             suite), chromium and a font for it to draw with,
#                             haproxy to check deploy/balancer and run in front of rangeway,
#                             h2load for many HTTP/2
#                             streams on one connection), the
#                             Python modules tests call (PyYAML; http_ece, the independent RFC 8188
#                             implementation the aes128gcm interop test runs; Playwright, which
#                             drives chromium in tests/ui.rs; boto3 and the AWS CLI;
#                             opentelemetry-proto, which decodes the traces rangeway exports in
#                             tests/traces.rs; aioquic, the HTTP/3 client of tests/h3.rs), and
#                             s3s-fs,
#                             the S3-compatible server tests/s3.rs runs
#   scripts/deps.sh --bench   and the benchmarks: wrk, valgrind, caddy
#
# Idempotent: every tool is checked with `command -v` first, so a machine that has them all does
# nothing (not even `apt-get update`). Prints one line per package it installs.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive

SUDO=()
if [[ "$(id -u)" -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo -n)
    else
        echo "deps: not root and no sudo; cannot install packages" >&2
        exit 1
    fi
fi

# nginx and redis-server live in /usr/sbin on Debian, which is not on a normal user's PATH.
have() {
    command -v "$1" >/dev/null 2>&1 || [[ -x "/usr/sbin/$1" ]]
}

missing=()
need() {
    local package=$1
    shift
    local tool
    for tool in "$@"; do
        if ! have "$tool"; then
            missing+=("$package")
            return
        fi
    done
}

mode=${1:-}
case "$mode" in
    "" | --test | --bench) ;;
    *)
        echo "deps: unknown option $mode (use --test or --bench, or nothing)" >&2
        exit 2
        ;;
esac
testing=false
[[ $mode == --test || $mode == --bench ]] && testing=true

need cmake cmake
need build-essential cc c++ make
need pkg-config pkg-config
if [[ ! -s /etc/ssl/certs/ca-certificates.crt ]]; then
    missing+=(ca-certificates)
fi
if [[ $testing == true ]]; then
    need nginx nginx
    need redis-server redis-server
    need redis-tools redis-cli
    need curl curl
    need procps kill
    need wget wget
    need aria2 aria2c
    need openssl openssl
    need gzip gzip
    need python3 python3
    # tests/cache_suite.rs runs the HTTP WG cache suite (npm http-cache-tests) and its origin.
    need nodejs node
    need npm npm
    need chromium chromium
    # tests/deploy.rs checks deploy/balancer/haproxy.cfg with haproxy itself; tests/behind_balancer.rs
    # runs it in front of rangeway, sending the PROXY protocol.
    need haproxy haproxy
    # tests/get.rs: a real forward proxy (CONNECT tunnels) for rangeway get's https_proxy.
    need tinyproxy tinyproxy
    # tests/tls.rs: h2load opens many HTTP/2 streams on one TLS connection.
    need nghttp2-client h2load
    # Without a font, chromium draws the live downloads page's text as empty boxes in screenshots.
    if [[ ! -s /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]]; then
        missing+=(fonts-dejavu-core)
    fi
fi
if [[ $mode == --bench ]]; then
    need wrk wrk
    need valgrind valgrind
    # benches/h3.sh measures Caddy's HTTP/3 beside rangeway's.
    need caddy caddy
fi

# Python modules the tests import, in whichever python3 is first on PATH (a pyenv one, say, which
# Debian's python3-* packages would not reach): that python's pip first; else Debian's package,
# where there is one; else pip installed from apt and allowed beside Debian's own packages
# (PEP 668: Debian's python refuses pip installs without it). Fails when the module still does not
# import, rather than letting a test find out.
apt_updated=false
py_module() {
    local module=$1 package=$2 debian=${3:-}
    python3 -c "import $module" >/dev/null 2>&1 && return
    echo "deps: installing $package"
    export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
    python3 -m pip install --quiet "$package" >/dev/null 2>&1 && return
    if [[ $apt_updated == false ]]; then
        "${SUDO[@]}" apt-get update -qq >/dev/null 2>&1 || true
        apt_updated=true
    fi
    if [[ -n $debian ]] &&
        "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "$debian" >/dev/null 2>&1 &&
        python3 -c "import $module" >/dev/null 2>&1; then
        return
    fi
    if ! python3 -m pip --version >/dev/null 2>&1; then
        "${SUDO[@]}" apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
    fi
    python3 -m pip install --quiet "$package" >/dev/null 2>&1 ||
        python3 -m pip install --quiet --break-system-packages "$package" >/dev/null
    python3 -c "import $module"
}

python_modules() {
    # tests/deploy.rs parses deploy/*.yaml with PyYAML.
    py_module yaml pyyaml python3-yaml
    # middleware/tests/aes128gcm_interop.rs and tests/encryption.rs decrypt rangeway's output with
    # http_ece: an RFC 8188 implementation nobody here wrote.
    py_module http_ece http-ece python3-http-ece
    # tests/ui.rs drives Debian's chromium (above) through Playwright for Python. Only the Python
    # package: it launches the system chromium by path, so Playwright's own browser downloads
    # (`playwright install`) are never needed. Debian has no package of it.
    py_module playwright.sync_api playwright
    # tests/s3.rs downloads through rangeway's S3 routes with the clients S3 users have: boto3
    # and the AWS CLI (run as `python3 -m awscli`, so no PATH or pyenv shim is involved).
    py_module boto3 boto3 python3-boto3
    py_module awscli awscli awscli
    # tests/traces.rs receives rangeway's OTLP export and decodes it with the OpenTelemetry
    # project's own protobuf classes (Debian packages no collector).
    py_module opentelemetry.proto.collector.trace.v1.trace_service_pb2 opentelemetry-proto
    # tests/h3.rs downloads over HTTP/3 with aioquic (tests/h3_client.py): a QUIC and HTTP/3
    # stack nobody here wrote.
    py_module aioquic aioquic python3-aioquic
}

# tests/s3.rs runs a real S3-compatible server: s3s-fs (SigV4-checking, file-backed), built once
# with cargo into ~/.cargo/bin.
s3_server() {
    local cargo_bin=${CARGO_HOME:-$HOME/.cargo}/bin
    command -v s3s-fs >/dev/null 2>&1 || [[ -x $cargo_bin/s3s-fs ]] && return
    echo "deps: installing s3s-fs (cargo install, a few minutes)"
    cargo install --quiet --locked s3s-fs --version 0.14.1 --features binary
}

# What the tests need beyond the system packages.
test_tools() {
    if [[ $testing == true ]]; then
        python_modules
        s3_server
    fi
}

if [[ ${#missing[@]} -eq 0 ]]; then
    test_tools
    exit 0
fi

# apt's chatter (debconf notes, progress) goes to a log that is shown only when a step fails.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
apt_get() {
    if ! "${SUDO[@]}" apt-get "$@" >"$log" 2>&1; then
        cat "$log" >&2
        echo "deps: apt-get $* failed" >&2
        exit 1
    fi
}

apt_get update -qq
apt_updated=true
for package in "${missing[@]}"; do
    echo "deps: installing $package"
done
apt_get install -y -qq --no-install-recommends "${missing[@]}"

# Debian's packages start nginx, redis-server, haproxy and caddy as system services on install. The
# tests and benches start their own instances on free ports, so a system instance only costs memory
# and, for nginx and caddy, holds port 80: stop it and keep it from starting at boot.
for service in nginx redis-server haproxy caddy; do
    case " ${missing[*]} " in
        *" $service "*) ;;
        *) continue ;;
    esac
    if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
        "${SUDO[@]}" systemctl disable --now "$service.service" >/dev/null 2>&1 || true
    elif [[ -x "/etc/init.d/$service" ]]; then
        "${SUDO[@]}" "/etc/init.d/$service" stop >/dev/null 2>&1 || true
        if command -v update-rc.d >/dev/null 2>&1; then
            "${SUDO[@]}" update-rc.d "$service" disable >/dev/null 2>&1 || true
        fi
    fi
done

test_tools
