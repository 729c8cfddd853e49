#!/usr/bin/env python3
"""verify.py PCAP [BASESEQ]: check Geneve/IPv6 frames built by gso_tx: lengths,
outer UDP csum, inner IPv4 hdr csum, inner TCP csum, seq continuity, payload pattern."""
import struct, sys

def csum(data, s=0):
    if len(data) % 2:
        data += b'\0'
    s += sum(struct.unpack('!%dH' % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    return s

def main():
    path = sys.argv[1]
    base = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    d = open(path, 'rb').read()
    magic = struct.unpack('<I', d[:4])[0]
    assert magic in (0xa1b2c3d4, 0xa1b23c4d), hex(magic)
    off = 24
    n = ok = 0
    for_summary = []
    while off + 16 <= len(d):
        _, _, incl, orig = struct.unpack('<IIII', d[off:off + 16])
        off += 16
        f = d[off:off + incl]
        off += incl
        n += 1
        errs = []
        if incl != orig:
            errs.append('truncated capture %d/%d' % (incl, orig))
        if struct.unpack('!H', f[12:14])[0] != 0x86dd:
            continue
        ip6 = f[14:54]
        plen = struct.unpack('!H', ip6[4:6])[0]
        if ip6[6] != 17:
            continue
        if plen != len(f) - 54:
            errs.append('ipv6 payload_len %d != %d' % (plen, len(f) - 54))
        udp = f[54:62]
        sport, dport, ulen, uck = struct.unpack('!HHHH', udp)
        if dport != 6081:
            continue
        if ulen != len(f) - 54:
            errs.append('udp len %d != %d' % (ulen, len(f) - 54))
        if uck:
            ps = csum(ip6[8:40]) + (len(f) - 54) + 17
            if csum(f[54:], ps) != 0xffff:
                errs.append('BAD outer udp csum 0x%04x' % uck)
        g = f[62:70]
        if g[0] != 0 or struct.unpack('!H', g[2:4])[0] != 0x6558:
            errs.append('geneve hdr %s' % g.hex())
        ie = f[70:84]
        if ie[12:14] == b'\x86\xdd':
            ip = f[84:124]
            tot = struct.unpack('!H', ip[4:6])[0] + 40
            ipid = -1
            tcp = f[124:]
            ps = csum(ip[8:40]) + 6 + len(tcp)
        else:
            ip = f[84:104]
            if csum(ip) != 0xffff:
                errs.append('BAD inner ip csum')
            tot = struct.unpack('!H', ip[2:4])[0]
            ipid = struct.unpack('!H', ip[4:6])[0]
            tcp = f[104:]
            ps = csum(ip[12:20]) + 6 + len(tcp)
        if tot != len(f) - 84:
            errs.append('inner ip len %d != %d' % (tot, len(f) - 84))
        tcp_ok = csum(tcp, ps) == 0xffff
        if not tcp_ok:
            errs.append('BAD inner tcp csum 0x%04x' % struct.unpack('!H', tcp[16:18])[0])
        seq = struct.unpack('!I', tcp[4:8])[0]
        flags = tcp[13]
        pay = tcp[20:]
        o = seq - base
        exp = bytes(((o + i) * 7 + 3) & 0xff for i in range(len(pay)))
        if pay != exp:
            errs.append('payload mismatch')
        line = 'frame %d: wire %d B, ipv6 plen %d, udp len %d csum %s, inner ip id %d tot %d, tcp seq %d len %d flags 0x%02x, tcp csum %s' % (
            n, len(f), plen, ulen, ('0x%04x' % uck) if uck else 'none', ipid, tot, seq, len(pay), flags,
            'ok' if tcp_ok else 'BAD')
        print(line + ('' if not errs else '  ERR: ' + '; '.join(errs)))
        if not errs:
            ok += 1
    print('summary: %d geneve frames checked OK out of %d captured' % (ok, n))

main()
