#!/usr/bin/env bash
# Installs the system tools that building and testing rangeway needs: cmake (pingora's libz-ng-sys),
# a C/C++ toolchain, the real servers and clients the integration tests drive (nginx,
# redis-server, curl, wget, aria2c, openssl, gzip, python3), and the Python modules tests call
# (PyYAML; http_ece, the independent RFC 8188 implementation the aes128gcm interop test runs).
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

need cmake cmake
need build-essential cc c++ make
need pkg-config pkg-config
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
if [[ "${1:-}" == "--bench" ]]; then
    need haproxy haproxy
    need wrk wrk
fi
if [[ ! -s /etc/ssl/certs/ca-certificates.crt ]]; then
    missing+=(ca-certificates)
fi

# tests/deploy.rs parses deploy/*.yaml with PyYAML in whichever python3 is first on PATH (a
# pyenv one, say, which Debian's python3-yaml would not reach): pip for that python, else apt.
pyyaml() {
    python3 -c 'import yaml' >/dev/null 2>&1 && return
    echo "deps: installing PyYAML"
    python3 -m pip install --quiet pyyaml >/dev/null 2>&1 && return
    "${SUDO[@]}" apt-get install -y -qq --no-install-recommends python3-yaml >/dev/null
}

# middleware/tests/aes128gcm_interop.rs decrypts rangeway's output with Python's http_ece (and
# has it encrypt what rangeway's Decryptor reads): an RFC 8188 implementation nobody here wrote.
# Same python3 as above, so pip first; Debian's package, where it has one, as the fallback.
http_ece() {
    python3 -c 'import http_ece' >/dev/null 2>&1 && return
    echo "deps: installing http_ece"
    python3 -m pip install --quiet http-ece >/dev/null 2>&1 && return
    "${SUDO[@]}" apt-get install -y -qq --no-install-recommends python3-http-ece >/dev/null
}

python_modules() {
    pyyaml
    http_ece
}

if [[ ${#missing[@]} -eq 0 ]]; then
    python_modules
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
for package in "${missing[@]}"; do
    echo "deps: installing $package"
done
apt_get install -y -qq --no-install-recommends "${missing[@]}"

# Debian's packages start nginx, redis-server and haproxy as system services on install. The tests
# and benches start their own instances on free ports, so a system instance only costs memory and,
# for nginx, holds port 80: stop it and keep it from starting at boot.
for service in nginx redis-server haproxy; do
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

python_modules
