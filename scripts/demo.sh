#!/usr/bin/env bash
# The demo: on a fresh Debian machine (as root), installs what is missing, builds the
# workspace in release mode, then runs the `demo` binary of the e2e crate, which
# builds the test rack (2 sleds on a 9000-byte IPv6 underlay, 2 guests per sled at
# MTU 8500), shows `xdeadm mtu`, `xdeadm ra` and `xdeadm ra listen` from a guest,
# pings and runs iperf3 across sleds, prints `xdeadm stats`, then shows a guest
# reaching an internet server through the boundary switch (V2B, SNAT and a floating
# IP: `dump-v2b`, `list-ports`, ping, checked TCP both ways, `dump-uft`, the NAT
# counters), and tears down.
#
# The topology code is the e2e test harness itself (tests/src), so the demo shows
# exactly what the tests check. The demo removes everything it built when it exits;
# the EXIT trap below also covers an interrupted run (Ctrl-C, kill).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "demo.sh needs root (network namespaces, tap devices, XDP)" >&2
    exit 1
fi

# Every namespace the demo creates starts with this prefix (tests/src/bin/demo.rs
# reads DEMO_PREFIX), so the trap removes this run's namespaces and no one else's.
export DEMO_PREFIX="demo$$-"

# shellcheck source=lib/namespaces.sh
. scripts/lib/namespaces.sh
cleanup() {
    # Only our own namespaces, and the processes inside: the demo's daemons and tools.
    remove_namespaces "^${DEMO_PREFIX}"
}
trap cleanup EXIT

bash scripts/install-deps.sh
command -v cargo >/dev/null || { echo "demo.sh needs a Rust toolchain (cargo) on PATH" >&2; exit 1; }
echo "building (release)..."
cargo build --release --quiet --workspace --bins

target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
export OVERLAYD_BIN="$target_dir/release/overlayd"
export XDEADM_BIN="$target_dir/release/xdeadm"
"$target_dir/release/demo"
