#!/usr/bin/env bash
# Installs what building and testing the datapath needs on a fresh Debian machine:
# clang/llvm/libbpf-dev build the XDP program; iproute2 builds test topologies;
# tshark, ndisc6 and scapy are the independent decoders the tests check against;
# iperf3 measures throughput in the demo. Idempotent and quiet.
set -euo pipefail

need_apt=()
for pkg in clang llvm libbpf-dev iproute2 tshark tcpdump iperf3 ethtool ndisc6 python3; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "installing: ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

python3 -c 'import scapy' 2>/dev/null || python3 -m pip install -q scapy

if command -v rustup >/dev/null; then
    rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
    rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
fi
