#!/bin/bash
name=$1; pl=$2; mss=$3
ip netns exec tgso-n2 tcpdump -i tgso-b -s 0 -w ${TGSO_DIR:-/tmp/tgso}/$name.pcap -U udp port 6081 2>${TGSO_DIR:-/tmp/tgso}/$name.tcpdump.log &
tp=$!
sleep 1.5
ip netns exec tgso-n1 ${TGSO_DIR:-/tmp/tgso}/gso_tx udp-gso x 0:0:0:0:0:0 0:0:0:0:0:0 fd00:77::1 fd00:77::2 $pl $mss 1
sleep 1
kill $tp; wait $tp 2>/dev/null
python3 ${TGSO_DIR:-/tmp/tgso}/verify.py ${TGSO_DIR:-/tmp/tgso}/$name.pcap
