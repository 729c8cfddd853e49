// SPDX-License-Identifier: MIT OR Apache-2.0
//
// Sends every frame written to an underlay tunnel tap (dpio::tunnel_tx) out of
// the underlay interface it stands for. The datapath writes complete frames
// (outer Ethernet with the next hop's MAC, IPv6, UDP, Geneve) with a UDP-tunnel
// GSO vnet header to the tap; the kernel receives them on the tap, and this
// program, on the tap's ingress (tcx), redirects them to the underlay
// interface's egress, where they are segmented as late as possible (software
// GSO in validate_xmit_skb, or the NIC). No route, bridge or address is needed.
//
// The target's ifindex is the only entry of `redirect_to`, written by the loader
// before the program is attached. A frame arriving while it is 0 (never, short
// of a loader bug) is dropped and counted in `redirect_drops`.

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} redirect_to SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} redirect_drops SEC(".maps");

SEC("classifier")
int tunnel_redirect(struct __sk_buff *skb)
{
	__u32 zero = 0;
	__u32 *ifindex = bpf_map_lookup_elem(&redirect_to, &zero);

	if (ifindex && *ifindex)
		return bpf_redirect(*ifindex, 0);
	__u64 *drops = bpf_map_lookup_elem(&redirect_drops, &zero);
	if (drops)
		*drops += 1;
	return TC_ACT_SHOT;
}

char _license[] SEC("license") = "Dual MIT/GPL";
