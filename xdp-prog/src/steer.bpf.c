// SPDX-License-Identifier: MIT OR Apache-2.0
//
// Steers this sled's Geneve traffic (untagged Ethernet / IPv6 / UDP dst 6081,
// IPv6 destination one of our underlay addresses) into the AF_XDP socket bound
// to the receiving queue. Everything else goes to the kernel (XDP_PASS): NDP,
// ICMPv6, management traffic, other tunnels, and VLAN-tagged frames: the
// engine's underlay parser takes untagged frames only, so a tagged frame
// steered to AF_XDP would be dropped there, while the kernel (a VLAN
// interface, a bridge) may know what to do with it.
//
// The section is `xdp.frags` so the program accepts multi-buffer frames: veth
// refuses an MTU above ~3.5 KB with a native XDP program that is not
// frags-capable, and the underlay runs at MTU 9000. Only the first buffer is
// parsed; the headers we need are always in it (at least 3 KB).

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define GENEVE_PORT 6081
#define ETH_P_8021Q_ 0x8100
#define ETH_P_8021AD_ 0x88A8
#define ETH_P_IPV6_ 0x86DD

// Counter indices: the order is the `Counter` enum in xdp-prog/src/lib.rs.
enum counter {
	C_REDIRECTED = 0,
	C_REDIRECT_FAILED = 1,
	C_PASSED_TRUNCATED = 2,
	C_PASSED_NOT_IPV6 = 3,
	C_PASSED_NOT_UDP = 4,
	C_PASSED_NOT_GENEVE = 5,
	C_PASSED_NOT_OURS = 6,
	C_PASSED_VLAN_TAGGED = 7,
	C_MAX = 8,
};

struct in6_key {
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, struct in6_key);
	__type(value, __u8);
} underlay_addrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, C_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline int count(enum counter c, int verdict)
{
	__u32 key = c;
	__u64 *v = bpf_map_lookup_elem(&counters, &key);
	if (v)
		*v += 1; // per-CPU slot: no other writer
	return verdict;
}

SEC("xdp.frags")
int steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u64 off = sizeof(*eth);

	if ((void *)(eth + 1) > data_end)
		return count(C_PASSED_TRUNCATED, XDP_PASS);
	__u16 proto = eth->h_proto;
	if (proto == bpf_htons(ETH_P_8021Q_) || proto == bpf_htons(ETH_P_8021AD_))
		return count(C_PASSED_VLAN_TAGGED, XDP_PASS);
	if (proto != bpf_htons(ETH_P_IPV6_))
		return count(C_PASSED_NOT_IPV6, XDP_PASS);

	struct ipv6hdr *ip6 = data + off;
	if ((void *)(ip6 + 1) > data_end)
		return count(C_PASSED_TRUNCATED, XDP_PASS);
	// Geneve from another sled carries no extension headers; anything else
	// is not ours to steer and the kernel may deal with it.
	if (ip6->nexthdr != IPPROTO_UDP)
		return count(C_PASSED_NOT_UDP, XDP_PASS);

	struct udphdr *udp = (void *)(ip6 + 1);
	if ((void *)(udp + 1) > data_end)
		return count(C_PASSED_TRUNCATED, XDP_PASS);
	if (udp->dest != bpf_htons(GENEVE_PORT))
		return count(C_PASSED_NOT_GENEVE, XDP_PASS);

	struct in6_key key;
	__builtin_memcpy(key.addr, &ip6->daddr, sizeof(key.addr));
	if (!bpf_map_lookup_elem(&underlay_addrs, &key))
		return count(C_PASSED_NOT_OURS, XDP_PASS);

	// Falls back to XDP_PASS when no socket is bound to this queue, so a
	// datapath that is not running does not black-hole the traffic.
	int verdict = bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
	if (verdict == XDP_REDIRECT)
		return count(C_REDIRECTED, verdict);
	return count(C_REDIRECT_FAILED, verdict);
}

// "Dual MIT/GPL" is the kernel's spelling for a GPL-compatible licence; the
// program uses no GPL-only helper, the string only states our MIT option.
char _license[] SEC("license") = "Dual MIT/GPL";
