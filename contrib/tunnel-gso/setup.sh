#!/bin/bash
# topology: ns tgso-n1: tap tgso-t0 + veth tgso-a, bridged by tgso-br ; ns tgso-n2: veth tgso-b (underlay far side)
set -e
ip netns add tgso-n1
ip netns add tgso-n2
ip -n tgso-n1 link set lo up; ip -n tgso-n2 link set lo up
ip link add tgso-a netns tgso-n1 type veth peer name tgso-b netns tgso-n2
ip -n tgso-n1 link set tgso-a address 02:00:00:00:0a:01 mtu 9000
ip -n tgso-n2 link set tgso-b address 02:00:00:00:0b:01 mtu 9000
ip -n tgso-n1 tuntap add dev tgso-t0 mode tap
ip -n tgso-n1 link set tgso-t0 mtu 9000
ip netns exec tgso-n1 sysctl -qw net.bridge.bridge-nf-call-ip6tables=0 net.bridge.bridge-nf-call-iptables=0 2>/dev/null || true
ip -n tgso-n1 link add tgso-br type bridge stp_state 0 forward_delay 0
ip -n tgso-n1 link set tgso-br mtu 9000
ip -n tgso-n1 link set tgso-t0 master tgso-br
ip -n tgso-n1 link set tgso-a master tgso-br
ip netns exec tgso-n2 sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
ip -n tgso-n2 addr add fd00:77::2/64 dev tgso-b nodad
for l in tgso-t0 tgso-a tgso-br; do ip -n tgso-n1 link set $l up; done
ip -n tgso-n2 link set tgso-b up
