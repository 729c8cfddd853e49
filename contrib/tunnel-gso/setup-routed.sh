#!/bin/bash
# routed variant: ns tgso-n3: tap tgso-t1 (fd00:1::1/64) --ipv6 forwarding--> veth tgso-c (fd00:78::1/64) ; ns tgso-n4: tgso-d fd00:78::2
set -e
ip netns add tgso-n3; ip netns add tgso-n4
ip -n tgso-n3 link set lo up; ip -n tgso-n4 link set lo up
ip link add tgso-c netns tgso-n3 type veth peer name tgso-d netns tgso-n4
ip -n tgso-n3 link set tgso-c address 02:00:00:00:0c:0c mtu 9000
ip -n tgso-n4 link set tgso-d address 02:00:00:00:0d:0d mtu 9000
ip -n tgso-n3 tuntap add dev tgso-t1 mode tap
ip -n tgso-n3 link set tgso-t1 address 02:00:00:00:01:01 mtu 9000
for n in tgso-n3 tgso-n4; do ip netns exec $n sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0; done
ip netns exec tgso-n3 sysctl -qw net.ipv6.conf.all.forwarding=1
ip -n tgso-n3 addr add fd00:1::1/64 dev tgso-t1 nodad
ip -n tgso-n3 addr add fd00:78::1/64 dev tgso-c nodad
ip -n tgso-n4 addr add fd00:78::2/64 dev tgso-d nodad
ip -n tgso-n3 link set tgso-t1 up; ip -n tgso-n3 link set tgso-c up; ip -n tgso-n4 link set tgso-d up
ip -n tgso-n3 -6 neigh replace fd00:78::2 lladdr 02:00:00:00:0d:0d dev tgso-c nud permanent
ip -n tgso-n3 -6 neigh replace fd00:1::2 lladdr 02:00:00:00:0e:0e dev tgso-t1 nud permanent
ip netns exec tgso-n3 ethtool -K tgso-c tx-udp_tnl-segmentation off tx-udp_tnl-csum-segmentation off tx off >/dev/null
