#!/usr/bin/env bash
# The side-by-side benchmark: on a Debian machine (as root), installs what is
# missing (the test dependencies, iperf3, sockperf, Open vSwitch), builds the
# workspace in release mode, then runs the `bench-e2e` binary of the e2e crate,
# which builds the same two-sled job several ways in network namespaces -- this
# datapath, kernel VXLAN over IPv6 (also cut to the underlay MTU at the sled's
# edge), OVS's userspace datapath with Geneve over IPv6, a plain veth pair,
# measured with iperf3 (throughput) and sockperf (round-trip latency); this
# datapath and OVS with DPDK with DPDK's testpmd as the guests on vhost-user ports
# -- and measures each in alternation. Options go to the binary:
#
#   bash scripts/bench-e2e.sh                     # 3 rounds of 5 s runs, all tests
#   bash scripts/bench-e2e.sh --smoke             # about 90 s: is the harness fine?
#   bash scripts/bench-e2e.sh --variant ours1w= --variant ours2w='--cores 0,1'
#   bash scripts/bench-e2e.sh --vm               # also VM rows (QEMU; slow under TCG)
#   bash scripts/bench-e2e.sh --help
#
# See docs/benchmarks.md ("Side by side"). The binary removes everything it built
# when it exits, also on Ctrl-C; the EXIT trap below also covers a killed run. No
# system-wide OVS service is used or touched: each sled runs its own OVS daemons.
# DPDK runs without hugepages (testpmd and OVS get --no-huge), so none are reserved;
# its runtime directories (/var/run/dpdk/PREFIX) carry the run's prefix.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "bench-e2e.sh needs root (network namespaces, tap devices, XDP)" >&2
    exit 1
fi

# Every namespace and temporary directory of this run starts with this prefix (the
# binary reads BENCH_E2E_PREFIX), so the trap removes this run's and no one else's.
export BENCH_E2E_PREFIX="bx$$-"

# shellcheck source=lib/namespaces.sh
. scripts/lib/namespaces.sh

# The benchmark's own guards remove what it built when it stops (on SIGINT and
# SIGTERM too), so it is asked to stop and given time for that first; whatever is
# still there afterwards (it was killed outright) is removed by prefix.
bench_pid=
cleanup() {
    if [ -n "$bench_pid" ] && kill -0 "$bench_pid" 2>/dev/null; then
        kill -TERM "$bench_pid" 2>/dev/null || true
        for _ in $(seq 60); do
            kill -0 "$bench_pid" 2>/dev/null || break
            sleep 0.5
        done
    fi
    remove_namespaces "^${BENCH_E2E_PREFIX}"
    rm -rf "${TMPDIR:-/tmp}/${BENCH_E2E_PREFIX}"* /var/run/dpdk/"${BENCH_E2E_PREFIX}"*
}
trap cleanup EXIT

# Leftovers of earlier runs of this script that were killed outright (kill -9):
# their prefix carries the script's pid, which no longer runs.
for prefix in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -oE '^bx[0-9]+-' | sort -u || true); do
    pid=${prefix#bx}
    pid=${pid%-}
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "removing namespaces of an earlier run: ${prefix}*"
        remove_namespaces "^${prefix}"
        rm -rf "${TMPDIR:-/tmp}/${prefix}"* /var/run/dpdk/"${prefix}"*
    fi
done

bash scripts/install-deps.sh

command -v cargo >/dev/null || { echo "bench-e2e.sh needs a Rust toolchain (cargo) on PATH" >&2; exit 1; }
echo "building (release)..."
cargo build --release --quiet --workspace --bins

target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
export OVERLAYD_BIN="$target_dir/release/overlayd"
export XDEADM_BIN="$target_dir/release/xdeadm"
# In the background with `wait`, so a signal to this script runs the trap at once
# (the benchmark installs its own SIGINT handler, so Ctrl-C still reaches it).
"$target_dir/release/bench-e2e" "$@" &
bench_pid=$!
wait "$bench_pid"
