#!/usr/bin/env python3
"""Known-answer vectors for the `wire` crate, built with scapy (an independent
implementation of every header involved).

Writes vectors.txt next to this file: one vector per line, space-separated
`key=value` tokens. `kind` is `inner` (a guest frame for parse_inner), `underlay`
(a valid Geneve frame for parse_underlay) or `drop` (an underlay frame parse_underlay
must refuse with reason `drop`). `frame` is the frame in hex; the other keys are the
expected parse results, computed here from scapy's own layer lengths.

Run: python3 gen_vectors.py   (scapy 2.5+; the output is checked in)
"""

import os
import struct

from scapy.all import (ARP, ICMP, IP, UDP, TCP, Dot1Q, Ether, IPv6, IPOption_NOP,
                       IPOption_RR, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment,
                       IPv6ExtHdrHopByHop, IPv6ExtHdrRouting, ICMPv6EchoRequest,
                       Padding, Raw)
from scapy.contrib.geneve import GENEVE, GeneveOptions

GUEST_A = "a8:40:25:00:00:01"
GUEST_B = "a8:40:25:00:00:02"
SLED_1 = "02:00:00:00:01:01"
SLED_2 = "02:00:00:00:01:02"
OXIDE = 0x0129


def off(pkt, layer):
    """Offset of `layer` in the built frame."""
    return len(bytes(pkt)) - len(bytes(pkt[layer]))


def inner_expect(pkt):
    """The InnerMeta fields of a guest frame, from scapy's layers."""
    e = {}
    l3 = IP if IP in pkt else IPv6
    e["l3_off"] = off(pkt, l3)
    ip = pkt[l3]
    if l3 is IP:
        e["l3"] = "ipv4"
        e["ip_end"] = e["l3_off"] + ip.len
        e["proto"] = ip.proto
        e["hop_limit"] = ip.ttl
        e["df"] = int(bool(ip.flags.DF))
        e["fragment"] = int(bool(ip.flags.MF) or ip.frag != 0)
        e["l4_off"] = e["l3_off"] + ip.ihl * 4
        non_first = ip.frag != 0
    else:
        e["l3"] = "ipv6"
        e["ip_end"] = e["l3_off"] + 40 + ip.plen
        e["hop_limit"] = ip.hlim
        e["df"] = 0
        frag = pkt[IPv6ExtHdrFragment] if IPv6ExtHdrFragment in pkt else None
        e["fragment"] = int(frag is not None)
        non_first = frag is not None and frag.offset != 0
        # The final next header: the nh of the last IPv6 header or extension header.
        last = ip
        layer = ip.payload
        while isinstance(layer, (IPv6ExtHdrHopByHop, IPv6ExtHdrRouting,
                                 IPv6ExtHdrDestOpt, IPv6ExtHdrFragment)):
            last = layer
            if isinstance(layer, IPv6ExtHdrFragment) and layer.offset != 0:
                layer = layer.payload
                break
            layer = layer.payload
        e["proto"] = last.nh
        e["l4_off"] = off(pkt, layer.__class__) if not isinstance(layer, Raw) else off(pkt, Raw)
    e["src_ip"] = ip.src
    e["dst_ip"] = ip.dst
    e["src_port"] = e["dst_port"] = e["tcp_flags"] = e["icmp_type"] = e["icmp_code"] = 0
    e["payload_off"] = e["l4_off"]
    if not non_first:
        if TCP in pkt:
            t = pkt[TCP]
            e["src_port"], e["dst_port"], e["tcp_flags"] = t.sport, t.dport, int(t.flags)
            e["payload_off"] = e["l4_off"] + t.dataofs * 4
        elif UDP in pkt:
            u = pkt[UDP]
            e["src_port"], e["dst_port"] = u.sport, u.dport
            e["payload_off"] = e["l4_off"] + 8
        elif ICMP in pkt:
            c = pkt[ICMP]
            e["icmp_type"], e["icmp_code"] = c.type, c.code
            if c.type in (0, 8):
                e["src_port"] = c.id
            e["payload_off"] = e["l4_off"] + 8
        elif ICMPv6EchoRequest in pkt:
            c = pkt[ICMPv6EchoRequest]
            e["icmp_type"], e["icmp_code"], e["src_port"] = c.type, c.code, c.id
            e["payload_off"] = e["l4_off"] + 8
    return e


def inner_frames():
    syn_opts = [("MSS", 1460), ("SAckOK", b""), ("Timestamp", (0x01020304, 0)),
                ("NOP", None), ("WScale", 7)]
    yield "ipv4_tcp_syn", (Ether(src=GUEST_A, dst=GUEST_B) /
                           IP(src="172.30.0.5", dst="172.30.0.6", id=0x1234, flags="DF", ttl=64) /
                           TCP(sport=40000, dport=80, seq=1000, flags="S", window=64240,
                               options=syn_opts))
    yield "ipv4_tcp_data_padded", (Ether(src=GUEST_A, dst=GUEST_B) /
                                   IP(src="172.30.0.5", dst="172.30.0.6", flags="DF") /
                                   TCP(sport=40000, dport=80, seq=1, ack=2, flags="PA",
                                       options=[("NOP", None), ("NOP", None),
                                                ("Timestamp", (5, 6))]) /
                                   Raw(b"hi") / Padding(b"\x00" * 4))
    yield "ipv4_options_udp", (Ether(src=GUEST_A, dst=GUEST_B) /
                               IP(src="10.0.0.1", dst="10.0.0.2",
                                  options=[IPOption_RR(routers=["1.2.3.4"]), IPOption_NOP()]) /
                               UDP(sport=5353, dport=53) / Raw(b"query"))
    yield "ipv4_icmp_echo", (Ether(src=GUEST_A, dst=GUEST_B) /
                             IP(src="10.0.0.1", dst="10.0.0.2", ttl=3) /
                             ICMP(type=8, id=0x4242, seq=1) / Raw(b"ping"))
    yield "ipv4_first_fragment", (Ether(src=GUEST_A, dst=GUEST_B) /
                                  IP(src="10.0.0.1", dst="10.0.0.2", flags="MF", id=7) /
                                  UDP(sport=1000, dport=2000, len=1008) / Raw(b"x" * 16))
    yield "ipv4_later_fragment", (Ether(src=GUEST_A, dst=GUEST_B) /
                                  IP(src="10.0.0.1", dst="10.0.0.2", frag=185, id=7, proto=17) /
                                  Raw(b"y" * 24))
    yield "vlan_ipv4_udp", (Ether(src=GUEST_A, dst=GUEST_B) / Dot1Q(vlan=5) /
                            IP(src="10.0.0.1", dst="10.0.0.2") /
                            UDP(sport=68, dport=67) / Raw(b"dhcp"))
    yield "ipv6_udp", (Ether(src=GUEST_A, dst=GUEST_B) /
                       IPv6(src="fd00:1122::5", dst="fd00:1122::6", hlim=64, fl=0x12345) /
                       UDP(sport=12345, dport=53) / Raw(b"payload"))
    yield "ipv6_ext_headers_tcp", (Ether(src=GUEST_A, dst=GUEST_B) /
                                   IPv6(src="fd00::5", dst="fd00::6") /
                                   IPv6ExtHdrHopByHop() /
                                   IPv6ExtHdrRouting(addresses=["fd00::9"]) /
                                   IPv6ExtHdrDestOpt() /
                                   IPv6ExtHdrFragment(offset=0, m=1, id=0xdeadbeef) /
                                   TCP(sport=443, dport=50000, flags="A") / Raw(b"z" * 8))
    yield "ipv6_later_fragment", (Ether(src=GUEST_A, dst=GUEST_B) /
                                  IPv6(src="fd00::5", dst="fd00::6") /
                                  IPv6ExtHdrFragment(offset=181, m=0, id=9, nh=17) /
                                  Raw(b"w" * 32))
    yield "ipv6_icmpv6_echo", (Ether(src=GUEST_A, dst=GUEST_B) /
                               IPv6(src="fd00::5", dst="fd00::6", hlim=255) /
                               ICMPv6EchoRequest(id=0x777, seq=3, data=b"abcd"))


def geneve(vni, opts, **kw):
    return GENEVE(vni=vni, proto=0x6558, options=opts, **kw)


def outer(inner_bytes, g, dport=6081, **ip6kw):
    kw = dict(src="fd00:99::1", dst="fd00:99::2", hlim=128, tc=0, fl=0)
    kw.update(ip6kw)
    return (Ether(src=SLED_1, dst=SLED_2) / IPv6(**kw) /
            UDP(sport=51234, dport=dport, chksum=0) / g / Raw(inner_bytes))


def mss_opt(v, **kw):
    return GeneveOptions(classid=OXIDE, type=0x02, data=struct.pack("!I", v), **kw)


def underlay_frames(inner):
    """(name, frame, expected dict) for frames parse_underlay must accept."""
    tcp4 = bytes(dict(inner)["ipv4_tcp_syn"])
    udp6 = bytes(dict(inner)["ipv6_udp"])
    yield "mss_inner_ipv4_tcp", outer(tcp4, geneve(0x123456, [mss_opt(8870)])), \
        dict(vni=0x123456, mss=8870, external=0, multicast="-", inner=tcp4)
    yield "plain_inner_ipv6_udp", outer(udp6, geneve(77, [])), \
        dict(vni=77, mss="-", external=0, multicast="-", inner=udp6)
    yield "external_multicast_unknown_noncritical", outer(udp6, geneve(0xffffff, [
        GeneveOptions(classid=OXIDE, type=0x00),
        GeneveOptions(classid=OXIDE, type=0x01, data=struct.pack("!I", 2 << 30)),
        GeneveOptions(classid=0x0101, type=0x05, data=b"\x01\x02\x03\x04"),
        GeneveOptions(classid=OXIDE, type=0x7f, data=b""),
    ])), dict(vni=0xffffff, mss="-", external=1, multicast="both", inner=udp6)


def drop_frames(inner):
    """(name, frame, reason) for frames parse_underlay must refuse."""
    tcp4 = bytes(dict(inner)["ipv4_tcp_syn"])
    ok = outer(tcp4, geneve(5, [mss_opt(1448)]))
    yield "truncated", bytes(ok)[:69], "truncated"
    yield "not_ipv6", bytes(Ether(src=SLED_1, dst=SLED_2) / IP() / UDP(dport=6081) /
                            geneve(5, []) / Raw(tcp4)), "not_ipv6"
    yield "vlan_tagged", bytes(Ether(src=SLED_1, dst=SLED_2) / Dot1Q(vlan=9) / IPv6() /
                               UDP(dport=6081, chksum=0) / geneve(5, []) / Raw(tcp4)), "not_ipv6"
    yield "bad_ipv6_version", bytes(outer(tcp4, geneve(5, []), version=4)), "bad_ipv6_version"
    plen_big = outer(tcp4, geneve(5, []))
    plen_big[IPv6].plen = len(bytes(plen_big[UDP])) + 1
    yield "bad_ipv6_length", bytes(plen_big), "bad_ipv6_length"
    yield "ipv6_extension_header", bytes(Ether(src=SLED_1, dst=SLED_2) / IPv6() /
                                         IPv6ExtHdrDestOpt() / UDP(dport=6081, chksum=0) /
                                         geneve(5, []) / Raw(tcp4)), "ipv6_extension_header"
    yield "not_udp", bytes(Ether(src=SLED_1, dst=SLED_2) / IPv6() / TCP(dport=6081) /
                           Raw(b"\x00" * 40)), "not_udp"
    yield "not_geneve_port", bytes(outer(tcp4, geneve(5, []), dport=4789)), "not_geneve_port"
    short_udp = outer(tcp4, geneve(5, []))
    short_udp[UDP].len = len(bytes(short_udp[UDP])) - 2
    yield "bad_udp_length", bytes(short_udp), "bad_udp_length"
    yield "bad_geneve_version", bytes(outer(tcp4, geneve(5, [], version=1))), "bad_geneve_version"
    yield "geneve_oam", bytes(outer(tcp4, geneve(5, [], oam=1))), "geneve_oam"
    yield "not_ethernet_payload", bytes(outer(tcp4, GENEVE(vni=5, proto=0x0800))), \
        "not_ethernet_payload"
    yield "options_past_datagram", bytes(outer(b"", geneve(5, [mss_opt(1448)], optionlen=3))), \
        "bad_option_length"
    yield "oxide_mss_without_body", bytes(outer(tcp4, geneve(5, [
        GeneveOptions(classid=OXIDE, type=0x02, data=b"")]))), "bad_option_length"
    yield "unknown_critical_other_class", bytes(outer(tcp4, geneve(5, [
        GeneveOptions(classid=0x0101, type=0x85, data=b"\x00" * 4)], critical=1))), \
        "unknown_critical_option"
    yield "unknown_critical_oxide_type", bytes(outer(tcp4, geneve(5, [
        GeneveOptions(classid=OXIDE, type=0x83)], critical=1))), "unknown_critical_option"
    yield "multicast_replication_3", bytes(outer(tcp4, geneve(5, [
        GeneveOptions(classid=OXIDE, type=0x01, data=struct.pack("!I", 3 << 30))]))), \
        "bad_multicast_replication"
    yield "mss_zero", bytes(outer(tcp4, geneve(5, [mss_opt(0)]))), "bad_mss_value"
    yield "mss_over_u16", bytes(outer(tcp4, geneve(5, [mss_opt(70000)]))), "bad_mss_value"
    yield "inner_truncated", bytes(outer(tcp4[:13], geneve(5, []))), "inner_truncated"


def line(fields):
    return " ".join(f"{k}={v}" for k, v in fields.items())


def main():
    inner = list(inner_frames())
    out = ["# Generated by gen_vectors.py with scapy; do not edit by hand."]
    # Re-dissect so computed fields (lengths, IHL) are filled in.
    inner = [(name, Ether(bytes(pkt))) for name, pkt in inner]
    for name, pkt in inner:
        e = inner_expect(pkt)
        out.append(line(dict(kind="inner", name=name, dst_mac=pkt[Ether].dst,
                             src_mac=pkt[Ether].src, **e, frame=bytes(pkt).hex())))
    arp = Ether(src=GUEST_A, dst="ff:ff:ff:ff:ff:ff") / ARP(psrc="172.30.0.5", pdst="172.30.0.1")
    out.append(line(dict(kind="inner", name="arp_request", dst_mac=arp.dst, src_mac=arp.src,
                         l3="arp", l3_off=14, frame=bytes(arp).hex())))
    for name, pkt, e in underlay_frames(inner):
        b = bytes(pkt)
        inner_bytes = e.pop("inner")
        inner_off = off(pkt, Raw)
        g = pkt[GENEVE]
        out.append(line(dict(kind="underlay", name=name, outer_src_mac=pkt[Ether].src,
                             outer_dst_mac=pkt[Ether].dst, outer_src=pkt[IPv6].src,
                             outer_dst=pkt[IPv6].dst, udp_src_port=pkt[UDP].sport, **e,
                             geneve_len=len(bytes(g)) - len(inner_bytes),
                             inner_off=inner_off, inner_end=inner_off + len(inner_bytes),
                             frame=b.hex())))
    for name, b, reason in drop_frames(inner):
        out.append(line(dict(kind="drop", name=name, drop=reason, frame=b.hex())))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vectors.txt")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"wrote {len(out) - 1} vectors to {path}")


if __name__ == "__main__":
    main()
