#!/usr/bin/env python3
"""Expected gateway frames, built independently with scapy.

Writes `name hex` lines to stdout; the Rust tests (gateway/vectors.rs) read the
checked-in output:  python3 gen_vectors.py > vectors.txt

The port mirrors `crate::port::tests::sample()`: guest a8:40:25:ff:00:01 /
172.30.0.5 / fd00:1122:3344:100::5, gateway a8:40:25:00:00:01 / 172.30.0.1 /
fe80::aa40:25ff:fe00:1, MTU 8500. Requests (`*_req`) are frames a Linux guest sends;
replies are what the gateway must answer, field by field per docs/gateway.md.
"""
from scapy.all import (ARP, BOOTP, DHCP, ICMP, IP, UDP, Ether, IPv6, Raw,
                       ICMPv6EchoReply, ICMPv6EchoRequest, ICMPv6ND_NA,
                       ICMPv6ND_NS, ICMPv6ND_RA, ICMPv6ND_RS,
                       ICMPv6NDOptDstLLAddr, ICMPv6NDOptMTU,
                       ICMPv6NDOptSrcLLAddr, ICMPv6PacketTooBig, conf)
from scapy.layers.dhcp6 import (DHCP6_Advertise, DHCP6_Reply, DHCP6_Request,
                                DHCP6_Solicit, DHCP6OptClientId,
                                DHCP6OptDNSDomains, DHCP6OptDNSServers,
                                DHCP6OptIA_NA, DHCP6OptIAAddress,
                                DHCP6OptRapidCommit, DHCP6OptServerId,
                                DUID_LL)

conf.verb = 0
GUEST_MAC = "a8:40:25:ff:00:01"
GW_MAC = "a8:40:25:00:00:01"
GUEST4 = "172.30.0.5"
GW4 = "172.30.0.1"
GUEST6 = "fd00:1122:3344:100::5"
GUEST_LL = "fe80::aa40:25ff:feff:1"
GW_LL = "fe80::aa40:25ff:fe00:1"
ALL_NODES_MAC = "33:33:00:00:00:01"
# DHCP-related configuration used by the DHCP tests.
DNS4 = ["45.55.68.2", "8.8.8.8"]
DNS6 = ["2001:4860:4860::8888"]
HOSTNAME = "db01"
DOMAIN = "oxide.internal"
# The search list (option 119, DHCPv6 option 24): several names.
SEARCH = ["eng.oxide.internal", "oxide.internal"]

out = []


def emit(name, pkt):
    out.append(f"{name} {bytes(pkt).hex()}")


def ra(dst_mac, dst_ip, mtu):
    return (Ether(dst=dst_mac, src=GW_MAC) /
            IPv6(src=GW_LL, dst=dst_ip, hlim=255, tc=0, fl=0) /
            ICMPv6ND_RA(chlim=255, M=1, O=0, H=0, prf=0, P=0,
                        routerlifetime=9000, reachabletime=0, retranstimer=0) /
            ICMPv6NDOptSrcLLAddr(lladdr=GW_MAC) / ICMPv6NDOptMTU(mtu=mtu))


# Router Advertisements.
for mtu in (1500, 8500, 8922):
    emit(f"ra_unsolicited_{mtu}", ra(ALL_NODES_MAC, "ff02::1", mtu))
emit("rs_req", Ether(dst="33:33:00:00:00:02", src=GUEST_MAC) /
     IPv6(src=GUEST_LL, dst="ff02::2", hlim=255) /
     ICMPv6ND_RS() / ICMPv6NDOptSrcLLAddr(lladdr=GUEST_MAC))
emit("ra_solicited_8500", ra(GUEST_MAC, GUEST_LL, 8500))
emit("rs_unspec_req", Ether(dst="33:33:00:00:00:02", src=GUEST_MAC) /
     IPv6(src="::", dst="ff02::2", hlim=255) / ICMPv6ND_RS())
emit("ra_to_all_nodes_8500", ra(ALL_NODES_MAC, "ff02::1", 8500))

# Neighbor Solicitation for the gateway -> Neighbor Advertisement.
emit("ns_req", Ether(dst="33:33:ff:00:00:01", src=GUEST_MAC) /
     IPv6(src=GUEST_LL, dst="ff02::1:ff00:1", hlim=255) /
     ICMPv6ND_NS(tgt=GW_LL) / ICMPv6NDOptSrcLLAddr(lladdr=GUEST_MAC))
emit("na", Ether(dst=GUEST_MAC, src=GW_MAC) /
     IPv6(src=GW_LL, dst=GUEST_LL, hlim=255) /
     ICMPv6ND_NA(R=1, S=1, O=1, tgt=GW_LL) / ICMPv6NDOptDstLLAddr(lladdr=GW_MAC))
emit("ns_dad_req", Ether(dst="33:33:ff:00:00:01", src=GUEST_MAC) /
     IPv6(src="::", dst="ff02::1:ff00:1", hlim=255) / ICMPv6ND_NS(tgt=GW_LL))
emit("na_dad", Ether(dst=ALL_NODES_MAC, src=GW_MAC) /
     IPv6(src=GW_LL, dst="ff02::1", hlim=255) /
     ICMPv6ND_NA(R=1, S=0, O=1, tgt=GW_LL) / ICMPv6NDOptDstLLAddr(lladdr=GW_MAC))

# ARP.
emit("arp_req", Ether(dst="ff:ff:ff:ff:ff:ff", src=GUEST_MAC) /
     ARP(op=1, hwsrc=GUEST_MAC, psrc=GUEST4, hwdst="00:00:00:00:00:00", pdst=GW4))
emit("arp_reply", Ether(dst=GUEST_MAC, src=GW_MAC) /
     ARP(op=2, hwsrc=GW_MAC, psrc=GW4, hwdst=GUEST_MAC, pdst=GUEST4))

# Echo.
data = bytes(range(56))
emit("echo4_req", Ether(dst=GW_MAC, src=GUEST_MAC) /
     IP(src=GUEST4, dst=GW4, ttl=64, id=0x1c46, flags="DF") /
     ICMP(type=8, id=0x77, seq=3) / Raw(data))
emit("echo4_reply", Ether(dst=GUEST_MAC, src=GW_MAC) /
     IP(src=GW4, dst=GUEST4, ttl=64, id=0, flags=0) /
     ICMP(type=0, id=0x77, seq=3) / Raw(data))
emit("echo6_req", Ether(dst=GW_MAC, src=GUEST_MAC) /
     IPv6(src=GUEST6, dst=GW_LL, hlim=64) /
     ICMPv6EchoRequest(id=0x77, seq=3, data=data))
emit("echo6_reply", Ether(dst=GUEST_MAC, src=GW_MAC) /
     IPv6(src=GW_LL, dst=GUEST6, hlim=64) /
     ICMPv6EchoReply(id=0x77, seq=3, data=data))

# Packet Too Big / Fragmentation Needed for an 8000-byte packet toward the
# internet (path MTU 1500).
big6 = (IPv6(src=GUEST6, dst="2001:db8::1", hlim=64) /
        UDP(sport=5000, dport=6000) / Raw(bytes(7952)))
emit("big6_req", Ether(dst=GW_MAC, src=GUEST_MAC) / big6)
emit("ptb6", Ether(dst=GUEST_MAC, src=GW_MAC) /
     IPv6(src=GW_LL, dst=GUEST6, hlim=64) /
     ICMPv6PacketTooBig(mtu=1500) / Raw(bytes(big6)[:1280 - 48]))
big4 = (IP(src=GUEST4, dst="192.0.2.1", ttl=64, id=0x1234, flags="DF") /
        UDP(sport=5000, dport=6000) / Raw(bytes(7972)))
emit("big4_req", Ether(dst=GW_MAC, src=GUEST_MAC) / big4)
emit("fragneeded4", Ether(dst=GUEST_MAC, src=GW_MAC) /
     IP(src=GW4, dst=GUEST4, ttl=64, id=0, flags=0) /
     ICMP(type=3, code=4, nexthopmtu=1500) / Raw(bytes(big4)[:576 - 28]))

# DHCPv4: DISCOVER -> OFFER, REQUEST -> ACK (with interface MTU, option 26).
XID = 0x3903F326
chaddr = bytes.fromhex(GUEST_MAC.replace(":", "")) + bytes(10)
prl = [1, 3, 6, 12, 15, 26, 28, 119, 121]
emit("dhcp4_discover_req", Ether(dst="ff:ff:ff:ff:ff:ff", src=GUEST_MAC) /
     IP(src="0.0.0.0", dst="255.255.255.255", ttl=64) /
     UDP(sport=68, dport=67) /
     BOOTP(op=1, xid=XID, chaddr=chaddr) /
     DHCP(options=[("message-type", "discover"), ("param_req_list", prl), "end"]))
emit("dhcp4_request_req", Ether(dst="ff:ff:ff:ff:ff:ff", src=GUEST_MAC) /
     IP(src="0.0.0.0", dst="255.255.255.255", ttl=64) /
     UDP(sport=68, dport=67) /
     BOOTP(op=1, xid=XID, chaddr=chaddr) /
     DHCP(options=[("message-type", "request"), ("server_id", GW4),
                   ("requested_addr", GUEST4), ("param_req_list", prl), "end"]))
emit("dhcp4_request_wrong_req", Ether(dst="ff:ff:ff:ff:ff:ff", src=GUEST_MAC) /
     IP(src="0.0.0.0", dst="255.255.255.255", ttl=64) /
     UDP(sport=68, dport=67) /
     BOOTP(op=1, xid=XID, chaddr=chaddr) /
     DHCP(options=[("message-type", "request"), ("requested_addr", "172.30.0.9"), "end"]))


def dns_name(d):
    return b"".join(bytes([len(l)]) + l.encode() for l in d.split(".")) + b"\x00"


def dhcp4_reply(kind, mtu=8500):
    opts = [("message-type", kind), ("server_id", GW4)]
    yiaddr = GUEST4
    if kind == "nak":
        yiaddr = "0.0.0.0"
    else:
        routes = bytes([32, 172, 30, 0, 1, 0, 0, 0, 0, 0, 172, 30, 0, 1])
        opts += [("lease_time", 86400), ("subnet_mask", "255.255.255.255"),
                 ("router", GW4), (121, routes), ("interface-mtu", mtu),
                 ("name_server", *DNS4), ("hostname", HOSTNAME),
                 ("domain", DOMAIN), (119, b"".join(dns_name(d) for d in SEARCH))]
    opts.append("end")
    # Client without an address and without the broadcast flag: unicast to yiaddr
    # (RFC 2131 §4.1); a NAK is always broadcast.
    dst_mac, dst_ip = (GUEST_MAC, GUEST4) if kind != "nak" else ("ff:ff:ff:ff:ff:ff", "255.255.255.255")
    return (Ether(dst=dst_mac, src=GW_MAC) /
            IP(src=GW4, dst=dst_ip, ttl=64, id=0, flags=0) /
            UDP(sport=67, dport=68) /
            BOOTP(op=2, xid=XID, yiaddr=yiaddr, siaddr="0.0.0.0", chaddr=chaddr) /
            DHCP(options=opts))


# scapy encodes numeric option codes with raw bytes values as given.
emit("dhcp4_offer", dhcp4_reply("offer"))
emit("dhcp4_ack", dhcp4_reply("ack"))
emit("dhcp4_nak", dhcp4_reply("nak"))

# DHCPv6: Solicit with rapid commit -> Reply; Solicit without -> Advertise.
DUID_CLIENT = DUID_LL(lladdr=GUEST_MAC)
DUID_SERVER = DUID_LL(lladdr=GW_MAC)
XID6 = 0x5a1b2c
IAID = 0x0c0ffee0


def solicit(rapid):
    opts = DHCP6OptClientId(duid=DUID_CLIENT)
    if rapid:
        opts = opts / DHCP6OptRapidCommit()
    return (Ether(dst="33:33:00:01:00:02", src=GUEST_MAC) /
            IPv6(src=GUEST_LL, dst="ff02::1:2", hlim=1) /
            UDP(sport=546, dport=547) /
            DHCP6_Solicit(trid=XID6) / opts /
            DHCP6OptIA_NA(iaid=IAID, T1=0, T2=0))


def reply6(cls, rapid):
    body = (cls(trid=XID6) /
            DHCP6OptClientId(duid=DUID_CLIENT) /
            DHCP6OptServerId(duid=DUID_SERVER) /
            DHCP6OptIA_NA(iaid=IAID, T1=0xffffffff, T2=0xffffffff,
                          ianaopts=[DHCP6OptIAAddress(addr=GUEST6,
                                                      preflft=0xffffffff,
                                                      validlft=0xffffffff)]))
    if rapid:
        body = body / DHCP6OptRapidCommit()
    body = (body / DHCP6OptDNSServers(dnsservers=DNS6) /
            DHCP6OptDNSDomains(dnsdomains=[d + "." for d in SEARCH]))
    return (Ether(dst=GUEST_MAC, src=GW_MAC) /
            IPv6(src=GW_LL, dst=GUEST_LL, hlim=64) /
            UDP(sport=547, dport=546) / body)


emit("dhcp6_solicit_rapid_req", solicit(True))
emit("dhcp6_reply_rapid", reply6(DHCP6_Reply, True))
emit("dhcp6_solicit_req", solicit(False))
emit("dhcp6_advertise", reply6(DHCP6_Advertise, False))
emit("dhcp6_request_req",
     Ether(dst="33:33:00:01:00:02", src=GUEST_MAC) /
     IPv6(src=GUEST_LL, dst="ff02::1:2", hlim=1) /
     UDP(sport=546, dport=547) /
     DHCP6_Request(trid=XID6) / DHCP6OptClientId(duid=DUID_CLIENT) /
     DHCP6OptServerId(duid=DUID_SERVER) / DHCP6OptIA_NA(iaid=IAID, T1=0, T2=0))
emit("dhcp6_reply", reply6(DHCP6_Reply, False))

print("\n".join(out))
