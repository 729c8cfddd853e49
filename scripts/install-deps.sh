#!/usr/bin/env bash
# Installs what building and testing the datapath needs on a fresh Debian machine:
# clang/llvm/libbpf-dev build the XDP program; iproute2, iputils-ping and procps
# (sysctl) build and probe the test topologies; tshark, tcpdump, ndisc6 (rdisc6) and
# scapy are the independent decoders the tests check against; iperf3 measures
# throughput in the demo and the benchmark (and sockperf the benchmark's round-trip
# latency, UDP ping-pong), which also runs Open vSwitch's userspace
# datapath for comparison (openvswitch-switch; its system service is not used), and
# OVS with DPDK (openvswitch-switch-dpdk: its ovs-vswitchd-dpdk is run by path; the
# system's ovs-vswitchd alternative is left as it is).
# prometheus scrapes the daemon's metrics endpoint in tests/tests/metrics.rs (run as
# a child process; its system service is not used), asked with curl; its promtool
# checks both exposition formats in the unit tests.
# protobuf-compiler (protoc) is run by etcd-client's build script to compile etcd's
# gRPC API for control/fleet. etcd-server and etcd-client (etcd and etcdctl 3.4) are
# the fleet's store: control/fleet's tests start members of their own, the e2e
# harness a cluster in namespaces (tests/src/etcd.rs); the package's own service is
# disabled below so the tests stay in charge of ports and data. nftables cuts a sled
# off etcd's client port in those tests. dpdk-dev provides dpdk-testpmd, the DPDK
# guest of tests/tests/testpmd.rs (a virtio-user device on a vhost-user port).
# busybox-static (udhcpc) and dhcpcd-base (dhcpcd) are the stock DHCPv4 and DHCPv6
# clients that read the gateway's DNS options in tests/tests/opteadm.rs.
# Idempotent and quiet: it installs only what is missing, and shows what apt and pip
# said only when they fail.
set -euo pipefail

# Runs a command with its output (progress, debconf and update-alternatives chatter
# on both streams) kept aside, and shows it only if the command fails.
quietly() {
    local log status=0
    log=$(mktemp)
    "$@" >"$log" 2>&1 || status=$?
    if [ "$status" -ne 0 ]; then
        echo "failed ($status): $*" >&2
        cat "$log" >&2
    fi
    rm -f "$log"
    return "$status"
}

need_apt=()
for pkg in clang llvm libbpf-dev iproute2 iputils-ping procps tshark tcpdump iperf3 \
    sockperf ethtool ndisc6 python3 openvswitch-switch prometheus curl \
    protobuf-compiler etcd-server etcd-client nftables dpdk-dev \
    openvswitch-switch-dpdk busybox-static dhcpcd-base; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "installing: ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    quietly apt-get update
    quietly apt-get install -y "${need_apt[@]}"
fi

# Installing etcd-server enables and starts its service (a member on 2379 with data
# in /var/lib/etcd): stop and disable it, under systemd or, where a policy let its
# init script start it, under sysvinit (its pid file says so). Nothing to do in a
# container where neither ran.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
    systemctl disable --now etcd >/dev/null 2>&1 || true
elif [ -f /var/run/etcd.pid ] && [ -x /etc/init.d/etcd ]; then
    /etc/init.d/etcd stop >/dev/null 2>&1 || true
    update-rc.d etcd disable >/dev/null 2>&1 || true
fi

# QEMU runs the virtual machine of tests/tests/vm.rs. Without its recommends (display
# front ends, UEFI firmware, block drivers): the tests boot a kernel directly. The
# guest's own packages (linux-image-cloud-amd64, busybox-static) are downloaded by
# tests/vm/build-guest.sh, not installed.
if ! dpkg-query -W -f='${Status}' qemu-system-x86 2>/dev/null | grep -q "install ok installed"; then
    echo "installing: qemu-system-x86"
    export DEBIAN_FRONTEND=noninteractive
    quietly apt-get update
    quietly apt-get install -y --no-install-recommends qemu-system-x86
fi

# A python module for whichever python3 is first on PATH (the tests run `python3`):
# pip where that python allows it, else Debian's package (for the system python).
# ensure_py MODULE PIP_NAME DEBIAN_PACKAGE
ensure_py() {
    if ! python3 -c "import $1" 2>/dev/null; then
        python3 -m pip install -q "$2" >/dev/null 2>&1 ||
            { export DEBIAN_FRONTEND=noninteractive; quietly apt-get install -y "$3"; }
        python3 -c "import $1" || { echo "$2 is not importable by $(command -v python3)" >&2; exit 1; }
    fi
}

# prometheus_client: its parsers of both exposition formats check the metrics
# (control/api/src/openmetrics.rs, control/overlayd/src/ops/metrics.rs), beside the
# prometheus package's promtool.
ensure_py prometheus_client.openmetrics.parser prometheus_client python3-prometheus-client
# scapy: an independent decoder of captured frames.
ensure_py scapy scapy python3-scapy

if command -v rustup >/dev/null; then
    rustup component list --installed 2>/dev/null | grep -q '^clippy' || quietly rustup component add clippy
    rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || quietly rustup component add rustfmt
fi
