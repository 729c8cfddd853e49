#!/bin/bash
name=$1; pl=$2; mss=$3; cs=${4:-1}
ip netns exec tgso-n4 tcpdump -i tgso-d -s 0 -w ${TGSO_DIR:-/tmp/tgso}/$name.pcap -U udp port 6081 2>${TGSO_DIR:-/tmp/tgso}/$name.tcpdump.log &
tp=$!
sleep 1.5
ip netns exec tgso-n3 ${TGSO_DIR:-/tmp/tgso}/gso_tx tap-super tgso-t1 02:00:00:00:0e:0e 02:00:00:00:01:01 fd00:1::2 fd00:78::2 $pl $mss 1 $cs
sleep 1
kill $tp; wait $tp 2>/dev/null
python3 ${TGSO_DIR:-/tmp/tgso}/verify.py ${TGSO_DIR:-/tmp/tgso}/$name.pcap
