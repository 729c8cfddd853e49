#!/usr/bin/env python3
# rx_vnet.py IFNAME SECONDS: AF_PACKET + PACKET_VNET_HDR receiver; prints vnet hdr of each Geneve frame
import socket, struct, sys, time
ETH_P_ALL = 3
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
s.setsockopt(263, 15, 1)          # SOL_PACKET, PACKET_VNET_HDR
try:
    s.setsockopt(263, 24, 24); print('PACKET_VNET_HDR_SZ=24 accepted')
except OSError as e:
    print('PACKET_VNET_HDR_SZ=24:', e)
s.bind((sys.argv[1], ETH_P_ALL))
s.settimeout(0.5)
end = time.time() + float(sys.argv[2])
n = 0
while time.time() < end:
    try:
        b = s.recv(262144)
    except socket.timeout:
        continue
    flags, gtype, hlen, gsz, cst, cof = struct.unpack('<BBHHHH', b[:10])
    f = b[10:]
    if len(f) < 62 or f[12:14] != b'\x86\xdd' or f[20] != 17 or struct.unpack('!H', f[56:58])[0] != 6081:
        continue
    n += 1
    print('rx frame %d: %d bytes, vnet flags=0x%x gso_type=0x%x hdr_len=%d gso_size=%d csum_start=%d csum_off=%d, ipv6 plen=%d udp len=%d'
          % (n, len(f), flags, gtype, hlen, gsz, cst, cof, struct.unpack('!H', f[18:20])[0], struct.unpack('!H', f[58:60])[0]))
