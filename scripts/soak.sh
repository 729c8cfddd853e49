#!/usr/bin/env bash
# The soak: the standard two-sled rack (four guests) in network namespaces under
# mixed traffic -- checked bulk TCP, small UDP, ping, a churn of short TCP
# connections (100,000 in the default 600 s) -- while each daemon's resident memory
# and counters are sampled every 2 s. Fails when memory grows 1% or more after the
# warm-up, a table holds more than its timeouts allow, a counter goes back or the
# layers' counters disagree, or the traffic itself suffers (see docs/reliability.md).
#
#   bash scripts/soak.sh                 # 600 s (not in CI)
#   bash scripts/soak.sh --seconds 60    # what scripts/test.sh runs
#   bash scripts/soak.sh --help
#
# Results go to $CARGO_TARGET_DIR/soak/results.json (target/soak/ by default).
# Everything the run built is removed when it ends, also on Ctrl-C or kill.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "soak.sh needs root (network namespaces, tap devices, XDP)" >&2
    exit 1
fi

# shellcheck source=lib/namespaces.sh
. scripts/lib/namespaces.sh

# The rack's namespaces start with "sk" and carry the soak's pid (e2e::netns), so a
# run killed outright is cleaned up by the next one; the trap covers this one.
soak_pid=
cleanup() {
    if [ -n "$soak_pid" ] && kill -0 "$soak_pid" 2>/dev/null; then
        kill -TERM "$soak_pid" 2>/dev/null || true
        for _ in $(seq 60); do
            kill -0 "$soak_pid" 2>/dev/null || break
            sleep 0.5
        done
    fi
    if [ -n "$soak_pid" ]; then
        remove_namespaces "^sk$(printf '%x' "$soak_pid")x"
    fi
}
trap cleanup EXIT

command -v cargo >/dev/null || { echo "soak.sh needs a Rust toolchain (cargo) on PATH" >&2; exit 1; }
cargo build --release --quiet -p overlayd -p xdeadm -p e2e --bins

target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
mkdir -p "$target_dir/soak"
export OVERLAYD_BIN="$target_dir/release/overlayd"
# The daemons inherit this: glibc creates another malloc arena whenever threads
# first allocate at the same moment (API connections, the resolver), each a one-time
# step of about 450 KiB in resident memory at a random time: 1% of the daemon, which
# a 60 s run would take for growth. With the arenas capped a leak still shows.
export MALLOC_ARENA_MAX=2
export XDEADM_BIN="$target_dir/release/xdeadm"
# In the background with `wait`, so a signal to this script runs the trap at once.
"$target_dir/release/soak" --out "$target_dir/soak/results.json" "$@" &
soak_pid=$!
wait "$soak_pid"
