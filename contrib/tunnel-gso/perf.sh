#!/bin/bash
# perf.sh MODE COUNT : push COUNT x 61600 B inner payload; frames addressed to a MAC nobody owns (dropped early in ns2)
m=$1; c=$2; dev=tgso-t0; [[ $m == pkt-* ]] && dev=tgso-a
ip netns exec tgso-n1 /usr/bin/time -f "   time: %e s elapsed, %U s user, %S s sys" nice -n 5 ${TGSO_DIR:-/tmp/tgso}/gso_tx $m $dev 02:00:00:00:0c:01 02:00:00:00:0b:99 fd00:77::1 fd00:77::2 61600 8800 $c 1 2>&1
