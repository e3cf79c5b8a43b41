#!/usr/bin/env bash
# Runs the HTTP WG cache test suite (npm `http-cache-tests`, the suite behind cache-tests.fyi)
# through rangeway, and writes its results JSON; scripts/cache-tests/summary.mjs reads them
# (docs/cache-tests.md).
#
#   scripts/cache-tests.sh                 the cache on: results in
#                                          ${CARGO_TARGET_DIR:-target}/cache-tests/cache-on.json
#   CACHE=off scripts/cache-tests.sh       the cache off (cache-off.json)
#   CACHE_TESTS_ID=freshness-max-age scripts/cache-tests.sh
#                                          one test, its requests and responses printed
#
# Environment:
#   CACHE             on (default) or off
#   RANGEWAY_BIN      the rangeway to run (default ${CARGO_TARGET_DIR:-target}/debug/rangeway;
#                     nothing is built)
#   RESULTS           where the results JSON goes (default above)
#   CACHE_TESTS_HOME  where the suite is installed, outside the repository (default
#                     ${XDG_CACHE_HOME:-~/.cache}/rangeway/http-cache-tests-VERSION)
#   CACHE_TESTS_ID    run only this test, printing what it sent and got
#   PASSED            also write there the ids of the required tests passed, one per line
#                     (scripts/cache-tests/summary.mjs --passed; tests/cache_suite.rs reads it)
# Relative paths are taken from the repository's root.
#
# Beside the results, named as RESULTS without .json: .origin-requests.json, what the origin
# received in each test (scripts/cache-tests/run.mjs), and .rangeway.log and .origin.log.
#
# The suite is installed from the npm registry when missing. Its own origin server is the
# upstream, and rangeway sits in front of it with a generated config: the route "/" to that
# origin, letting the methods the suite sends through, the memory store, and with CACHE=on a
# [cache] in a temporary folder. Every process
# started here is stopped on exit, failure included.
set -euo pipefail
cd "$(dirname "$0")/.."

suite_version=0.4.5
cache_mode=${CACHE:-on}
case $cache_mode in
    on | off) ;;
    *) echo "cache-tests: CACHE must be on or off, not '$cache_mode'" >&2; exit 2 ;;
esac
target_dir=${CARGO_TARGET_DIR:-target}
rangeway_bin=${RANGEWAY_BIN:-$target_dir/debug/rangeway}
results=${RESULTS:-$target_dir/cache-tests/cache-$cache_mode.json}
suite_home=${CACHE_TESTS_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/rangeway/http-cache-tests-$suite_version}
package_dir=$suite_home/node_modules/http-cache-tests

for tool in node npm python3 curl; do
    command -v "$tool" >/dev/null || { echo "cache-tests: $tool is missing" >&2; exit 1; }
done
[[ -x $rangeway_bin ]] || {
    echo "cache-tests: no rangeway at $rangeway_bin (build it, or set RANGEWAY_BIN)" >&2
    exit 1
}

installed_version() {
    node -p "require('$package_dir/package.json').version" 2>/dev/null || true
}

# Installed beside, then moved into place, so that an interrupted install is never taken for one.
if [[ $(installed_version) != "$suite_version" ]]; then
    echo "cache-tests: installing http-cache-tests@$suite_version into $suite_home" >&2
    mkdir -p "$(dirname "$suite_home")"
    staging=$(mktemp -d "$suite_home.XXXXXX")
    npm install --prefix "$staging" --no-audit --no-fund --loglevel=error \
        "http-cache-tests@$suite_version" >&2
    rm -rf "$suite_home"
    mv "$staging" "$suite_home"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/rangeway-cache-tests.XXXXXX")
pids=()
stop_all() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [[ -n ${results_stem:-} ]]; then
        cp "$work/rangeway.log" "$results_stem.rangeway.log" 2>/dev/null || true
        cp "$work/origin.log" "$results_stem.origin.log" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_for URL NAME PID LOG: until URL answers, or the process ends, or 30 s pass.
wait_for() {
    local url=$1 name=$2 pid=$3 log=$4 tries
    for ((tries = 0; tries < 300; tries++)); do
        curl -s -o /dev/null --max-time 1 "$url" && return 0
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "cache-tests: $name exited before answering; its log:" >&2
            tail -n 40 "$log" >&2
            exit 1
        fi
        sleep 0.1
    done
    echo "cache-tests: $name did not answer $url within 30 s; its log:" >&2
    tail -n 40 "$log" >&2
    exit 1
}

origin_port=$(free_port)
# The suite's origin (its `npm run server`) takes its settings from npm's config variables.
(
    cd "$work"
    exec env npm_config_protocol=http npm_config_port="$origin_port" \
        npm_config_pidfile="$work/origin.pid" node "$package_dir/server/server.mjs"
) >"$work/origin.log" 2>&1 &
pids+=("$!")
wait_for "http://127.0.0.1:$origin_port/" "the suite's origin" "${pids[-1]}" "$work/origin.log"

proxy_port=$(free_port)
admin_port=$(free_port)
config=$work/rangeway.toml
cat >"$config" <<EOF
[server]
listen = "127.0.0.1:$proxy_port"
admin_listen = "127.0.0.1:$admin_port"
upgrade_socket = "$work/upgrade.sock"
grace_period = "1s"

[state]
backend = "memory"

[upstreams.suite]
url = "http://127.0.0.1:$origin_port"

[[routes]]
path_prefix = "/"
upstream = "suite"
# The methods the suite sends: its set-up PUT, and its invalidation tests' unsafe requests.
methods = ["POST", "PUT", "DELETE", "M-SEARCH"]
EOF
if [[ $cache_mode == on ]]; then
    cat >>"$config" <<EOF
cache = true

[cache]
dir = "$work/cache"
max_size = "64MiB"
EOF
fi

"$rangeway_bin" check --config "$config" >&2
"$rangeway_bin" serve --config "$config" >"$work/rangeway.log" 2>&1 &
pids+=("$!")
wait_for "http://127.0.0.1:$admin_port/healthz" rangeway "${pids[-1]}" "$work/rangeway.log"

runner=(node scripts/cache-tests/run.mjs "$package_dir" "http://127.0.0.1:$proxy_port"
    "http://127.0.0.1:$origin_port")
# run_in_background COMMAND...: runs it as a process stop_all ends, and waits for it; `wait`,
# unlike a command in the foreground, lets the INT and TERM traps run at once.
run_in_background() {
    "$@" &
    pids+=("$!")
    wait "${pids[-1]}"
}
if [[ -n ${CACHE_TESTS_ID:-} ]]; then
    run_in_background "${runner[@]}" --id "$CACHE_TESTS_ID"
    exit 0
fi

echo "cache-tests: running the suite through rangeway ($rangeway_bin), cache $cache_mode" >&2
mkdir -p "$(dirname "$results")"
# What the origin received and the servers' logs are kept beside the results, to look into a
# failure with.
results_stem=${results%.json}
run_in_background "${runner[@]}" --origin-requests "$work/origin-requests.json" \
    >"$work/results.json"
mv "$work/origin-requests.json" "$results_stem.origin-requests.json"
mv "$work/results.json" "$results"
echo "cache-tests: results in $results" >&2
if [[ -n ${PASSED:-} ]]; then
    node scripts/cache-tests/summary.mjs "$package_dir" --passed "$results" >"$PASSED"
    echo "cache-tests: $(wc -l <"$PASSED") required tests passed, listed in $PASSED" >&2
fi
