/* gso_tx.c - experiment: hand the kernel ONE Geneve/IPv6 UDP-tunnel GSO
 * super-frame (virtio_net_hdr_v1_hash_tunnel, Linux >= 6.17) through a tap fd,
 * or try the same through AF_PACKET, or send user-space-segmented frames.
 *
 * usage: gso_tx MODE IFNAME SRCMAC DSTMAC SRC6 DST6 PAYLOAD MSS COUNT [CSUM]
 *   MODE: tap-super   one write() of a tunnel-GSO super-frame per iteration
 *         tap-split   user-space segmented frames (inner csum offloaded, outer via LCO)
 *         pkt-probe   AF_PACKET: probe PACKET_VNET_HDR_SZ / tunnel gso_type, exit
 *         pkt-split   AF_PACKET + PACKET_VNET_HDR: user-space segmented frames
 *         tap-probe   tap: probe TUNSETVNETHDRSZ / TUNSETOFFLOAD, exit
 *   PAYLOAD: inner TCP payload bytes per super-frame; MSS: inner TCP payload per wire frame
 *   CSUM: 1 (default) = VIRTIO_NET_HDR_F_UDP_TUNNEL_CSUM (outer UDP csum), 0 = outer csum 0
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netinet/in.h>
#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#include <time.h>
#include <unistd.h>

#ifndef PACKET_VNET_HDR_SZ
#define PACKET_VNET_HDR_SZ 24
#endif
#define TUN_F_USO4 0x20
#define TUN_F_USO6 0x40
#define TUN_F_UDP_TUNNEL_GSO 0x080
#define TUN_F_UDP_TUNNEL_GSO_CSUM 0x100

#define VNET_F_NEEDS_CSUM 1
#define VNET_F_UDP_TUNNEL_CSUM 8
#define VNET_GSO_NONE 0
#define VNET_GSO_TCPV4 1
#define VNET_GSO_UDP_TUNNEL_IPV4 0x20
#define VNET_GSO_UDP_TUNNEL_IPV6 0x40

/* struct virtio_net_hdr_v1_hash_tunnel (include/uapi/linux/virtio_net.h, 6.17+), all LE */
struct vnet_tnl_hdr {
	uint8_t flags;
	uint8_t gso_type;
	uint16_t hdr_len;
	uint16_t gso_size;
	uint16_t csum_start;
	uint16_t csum_offset;
	uint16_t num_buffers;     /* end of virtio_net_hdr_v1 (12 bytes) */
	uint16_t hash_value_lo;
	uint16_t hash_value_hi;
	uint16_t hash_report;
	uint16_t padding;         /* end of virtio_net_hdr_v1_hash (20 bytes) */
	uint16_t outer_th_offset;
	uint16_t inner_nh_offset; /* 24 bytes */
} __attribute__((packed));

enum { O_ETH = 0, O_IP6 = 14, O_UDP = 54, O_GNV = 62, O_IETH = 70, O_IIP = 84 };
static int inner6, O_TCP = 104, HDRS = 124; /* inner IPv6: 124 / 144 */
static struct in6_addr is6, id6;

static uint8_t smac[6], dmac[6], imac_s[6] = {2, 0, 0, 0, 0xaa, 1}, imac_d[6] = {2, 0, 0, 0, 0xaa, 2};
static struct in6_addr s6, d6;
static uint32_t isrc, idst;

static uint32_t sum16(const void *p, size_t n, uint32_t s)
{
	const uint8_t *b = p;
	while (n > 1) { s += (b[0] << 8) | b[1]; b += 2; n -= 2; }
	if (n) s += b[0] << 8;
	return s;
}
static uint16_t fold(uint32_t s) { while (s >> 16) s = (s & 0xffff) + (s >> 16); return s; }
static void put16(uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = v; }
static void put32(uint8_t *p, uint32_t v) { p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v; }

static uint32_t pseudo6(uint32_t len, uint8_t nh)
{
	uint32_t s = sum16(&s6, 16, 0);
	s = sum16(&d6, 16, s);
	s += (len >> 16) + (len & 0xffff) + nh;
	return s;
}
static uint32_t pseudo4(uint32_t len, uint8_t proto)
{
	if (inner6) {
		uint32_t s = sum16(&is6, 16, 0);
		s = sum16(&id6, 16, s);
		return s + (len >> 16) + (len & 0xffff) + proto;
	}
	uint8_t a[8];
	memcpy(a, &isrc, 4); memcpy(a + 4, &idst, 4);
	return sum16(a, 8, 0) + len + proto;
}

/* build headers for a frame whose inner TCP payload is `pl` bytes at seq `seq`.
 * Inner TCP checksum field gets the pseudo-header seed (CHECKSUM_PARTIAL convention).
 * Outer UDP checksum: seed (tunnel GSO, csum) / 0 (no csum) / LCO-computed (split). */
enum { OCS_ZERO, OCS_SEED, OCS_LCO };
static void build(uint8_t *f, uint32_t pl, uint32_t seq, int last, int ocs, uint16_t ipid)
{
	uint32_t tcplen = 20 + pl, iplen = (inner6 ? 40 : 20) + tcplen, udplen = 8 + 8 + 14 + iplen;
	memcpy(f + O_ETH, dmac, 6); memcpy(f + O_ETH + 6, smac, 6); put16(f + 12, ETH_P_IPV6);
	uint8_t *ip6 = f + O_IP6;
	put32(ip6, 0x60000000 | 0x12345); put16(ip6 + 4, udplen > 65535 ? 0 : udplen); ip6[6] = 17; ip6[7] = 64;
	memcpy(ip6 + 8, &s6, 16); memcpy(ip6 + 24, &d6, 16);
	uint8_t *udp = f + O_UDP;
	put16(udp, 49152 + 77); put16(udp + 2, 6081); put16(udp + 4, udplen); put16(udp + 6, 0);
	uint8_t *g = f + O_GNV;
	g[0] = 0; g[1] = 0; put16(g + 2, 0x6558); put32(g + 4, 0x00123400); /* VNI 0x1234 */
	uint8_t *ie = f + O_IETH;
	memcpy(ie, imac_d, 6); memcpy(ie + 6, imac_s, 6); put16(ie + 12, inner6 ? ETH_P_IPV6 : ETH_P_IP);
	uint8_t *ip = f + O_IIP;
	if (inner6) {
		put32(ip, 0x60000000 | 0x777); put16(ip + 4, tcplen); ip[6] = 6; ip[7] = 64;
		memcpy(ip + 8, &is6, 16); memcpy(ip + 24, &id6, 16);
	} else {
	ip[0] = 0x45; ip[1] = 0; put16(ip + 2, iplen); put16(ip + 4, ipid); put16(ip + 6, 0x4000);
	ip[8] = 64; ip[9] = 6; put16(ip + 10, 0); memcpy(ip + 12, &isrc, 4); memcpy(ip + 16, &idst, 4);
	put16(ip + 10, ~fold(sum16(ip, 20, 0)));
	}
	uint8_t *t = f + O_TCP;
	put16(t, 40000); put16(t + 2, 5201); put32(t + 4, seq); put32(t + 8, 0x1000);
	t[12] = 5 << 4; t[13] = last ? 0x18 : 0x10; put16(t + 14, 65000); put16(t + 18, 0);
	put16(t + 16, fold(pseudo4(tcplen, 6))); /* seed, not complemented */
	if (ocs == OCS_SEED) {
		put16(udp + 6, fold(pseudo6(udplen, 17)));
	} else if (ocs == OCS_LCO) {
		/* local checksum offload: outer = ~fold(pseudo + hdrs(udp..csum_start) + ~inner_seed) */
		uint32_t s = pseudo6(udplen, 17);
		s = sum16(udp, O_TCP - O_UDP, s);
		s += (uint16_t)~fold(pseudo4(tcplen, 6));
		uint16_t c = ~fold(s);
		put16(udp + 6, c ? c : 0xffff);
	}
}

static int open_tap(const char *name)
{
	int fd;
	if (getenv("MACVTAP")) { /* macvtap char dev: flags via TUNSETIFF too (IFF_VNET_HDR) */
		fd = open(getenv("MACVTAP"), O_RDWR);
		if (fd < 0) { perror("open macvtap"); exit(1); }
		struct ifreq ifr = {0};
		ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
		if (ioctl(fd, TUNSETIFF, &ifr) < 0) { perror("TUNSETIFF(macvtap)"); exit(1); }
	} else {
	fd = open("/dev/net/tun", O_RDWR);
	if (fd < 0) { perror("open tun"); exit(1); }
	struct ifreq ifr = {0};
	snprintf(ifr.ifr_name, IFNAMSIZ, "%s", name);
	ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
	if (ioctl(fd, TUNSETIFF, &ifr) < 0) { perror("TUNSETIFF"); exit(1); }
	}
	int sz = getenv("VNETSZ") ? atoi(getenv("VNETSZ")) : (int)sizeof(struct vnet_tnl_hdr);
	if (ioctl(fd, TUNSETVNETHDRSZ, &sz) < 0) { perror("TUNSETVNETHDRSZ 24"); exit(1); }
	usleep(1500000); /* carrier up -> let the bridge port reach forwarding */
	return fd;
}

static double now(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec + ts.tv_nsec / 1e9; }

int main(int argc, char **argv)
{
	if (argc < 10) { fprintf(stderr, "see source\n"); return 2; }
	const char *mode = argv[1], *ifn = argv[2];
	sscanf(argv[3], "%hhx:%hhx:%hhx:%hhx:%hhx:%hhx", &smac[0], &smac[1], &smac[2], &smac[3], &smac[4], &smac[5]);
	sscanf(argv[4], "%hhx:%hhx:%hhx:%hhx:%hhx:%hhx", &dmac[0], &dmac[1], &dmac[2], &dmac[3], &dmac[4], &dmac[5]);
	inet_pton(AF_INET6, argv[5], &s6); inet_pton(AF_INET6, argv[6], &d6);
	inet_pton(AF_INET, "10.77.0.1", &isrc); inet_pton(AF_INET, "10.77.0.2", &idst);
	inet_pton(AF_INET6, "fd00:aaaa::1", &is6); inet_pton(AF_INET6, "fd00:aaaa::2", &id6);
	if (getenv("INNER6")) { inner6 = 1; O_TCP = 124; HDRS = 144; }
	uint32_t payload = atoi(argv[7]), mss = atoi(argv[8]);
	long count = atol(argv[9]);
	int csum = argc > 10 ? atoi(argv[10]) : 1;
	size_t flen = HDRS + payload;
	uint8_t *buf = calloc(1, sizeof(struct vnet_tnl_hdr) + flen + 64);
	struct vnet_tnl_hdr *vh = (void *)buf;
	uint8_t *f = buf + sizeof(*vh);
	for (uint32_t i = 0; i < payload; i++) f[HDRS + i] = (uint8_t)(i * 7 + 3);

	if (!strcmp(mode, "tap-probe")) {
		int fd = open_tap(ifn);
		printf("TUNSETVNETHDRSZ(24): ok\n");
		unsigned offs[] = {TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_UDP_TUNNEL_GSO | TUN_F_UDP_TUNNEL_GSO_CSUM,
				   TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_USO4 | TUN_F_USO6 | TUN_F_UDP_TUNNEL_GSO | TUN_F_UDP_TUNNEL_GSO_CSUM,
				   TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | 0x200};
		for (int i = 0; i < 3; i++)
			printf("TUNSETOFFLOAD(0x%x): %s\n", offs[i], ioctl(fd, TUNSETOFFLOAD, offs[i]) < 0 ? strerror(errno) : "ok");
		ioctl(fd, TUNSETOFFLOAD, offs[0]);
		printf("(left TUNSETOFFLOAD 0x%x set; check ethtool -k)\n", offs[0]);
		sleep(atoi(argv[9]));
		return 0;
	}
	if (!strcmp(mode, "pkt-probe")) {
		int s = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
		if (s < 0) { perror("socket"); return 1; }
		int v;
		int szs[] = {10, 12, 20, 24};
		for (int i = 0; i < 4; i++) {
			v = szs[i];
			printf("setsockopt(PACKET_VNET_HDR_SZ, %d): %s\n", v,
			       setsockopt(s, SOL_PACKET, PACKET_VNET_HDR_SZ, &v, sizeof(v)) < 0 ? strerror(errno) : "ok");
		}
		v = 1;
		printf("setsockopt(PACKET_VNET_HDR, 1): %s\n", setsockopt(s, SOL_PACKET, PACKET_VNET_HDR, &v, sizeof(v)) < 0 ? strerror(errno) : "ok");
		struct sockaddr_ll sll = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_IPV6), .sll_ifindex = if_nametoindex(ifn)};
		build(f, payload, 1000, 1, OCS_SEED, 1);
		/* try tunnel gso_type through the 10-byte header */
		uint8_t h10[10] = {0};
		uint16_t t;
		h10[0] = VNET_F_NEEDS_CSUM | VNET_F_UDP_TUNNEL_CSUM; h10[1] = VNET_GSO_TCPV4 | VNET_GSO_UDP_TUNNEL_IPV6;
		t = HDRS; memcpy(h10 + 2, &t, 2); t = mss; memcpy(h10 + 4, &t, 2);
		t = O_TCP; memcpy(h10 + 6, &t, 2); t = 16; memcpy(h10 + 8, &t, 2);
		struct iovec iov[2] = {{h10, 10}, {f, flen}};
		struct msghdr mh = {.msg_name = &sll, .msg_namelen = sizeof(sll), .msg_iov = iov, .msg_iovlen = 2};
		ssize_t r = sendmsg(s, &mh, 0);
		printf("sendmsg(gso_type=TCPV4|UDP_TUNNEL_IPV6, len %zu): %s\n", flen, r < 0 ? strerror(errno) : "sent");
		/* plain TCPV4 gso over the encapsulated frame */
		h10[0] = VNET_F_NEEDS_CSUM; h10[1] = VNET_GSO_TCPV4;
		r = sendmsg(s, &mh, 0);
		printf("sendmsg(gso_type=TCPV4 on encapsulated frame, len %zu): %s\n", flen, r < 0 ? strerror(errno) : "sent (kernel accepted; see capture)");
		return 0;
	}

	if (!strcmp(mode, "udp-gso")) {
		/* fallback without tunnel GSO: UDP socket + UDP_SEGMENT; each gso_size chunk is a
		 * complete Geneve datagram (Geneve + inner Eth/IP/TCP headers built here, inner TCP
		 * checksum computed here); the kernel replicates only the outer IPv6/UDP header. */
		int s = socket(AF_INET6, SOCK_DGRAM, 0);
		struct sockaddr_in6 src = {.sin6_family = AF_INET6, .sin6_port = htons(49152 + 77), .sin6_addr = s6};
		struct sockaddr_in6 dst = {.sin6_family = AF_INET6, .sin6_port = htons(6081), .sin6_addr = d6};
		if (bind(s, (void *)&src, sizeof(src))) { perror("bind"); return 1; }
		if (connect(s, (void *)&dst, sizeof(dst))) { perror("connect"); return 1; }
		int sndbuf = 4 << 20; setsockopt(s, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
		uint16_t gsz = HDRS - O_GNV + mss;
		int nseg = (payload + mss - 1) / mss;
		uint8_t (*hd)[160] = calloc(nseg, 160);
		struct iovec *iv = calloc(2 * nseg, sizeof(*iv));
		uint8_t tmp[200];
		long frames = 0; uint64_t bytes = 0; uint32_t seq = 1000; uint16_t ipid = 1;
		double t0 = now();
		for (long it = 0; it < count; it++) {
			for (int k = 0; k < nseg; k++) {
				uint32_t off = k * mss, pl = payload - off < mss ? payload - off : mss;
				build(tmp, pl, seq + off, k == nseg - 1, OCS_ZERO, ipid++);
				memcpy(hd[k], tmp + O_GNV, HDRS - O_GNV);
				uint8_t *th = hd[k] + (O_TCP - O_GNV);
				uint32_t cs = pseudo4(20 + pl, 6);
				put16(th + 16, 0);
				cs = sum16(th, 20, cs);
				cs = sum16(f + HDRS + off, pl, cs); /* payload chunks have even length here */
				put16(th + 16, ~fold(cs));
				iv[2 * k] = (struct iovec){hd[k], HDRS - O_GNV};
				iv[2 * k + 1] = (struct iovec){f + HDRS + off, pl};
			}
			char cbuf[CMSG_SPACE(sizeof(uint16_t))] = {0};
			struct msghdr m = {.msg_iov = iv, .msg_iovlen = 2 * nseg, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
			struct cmsghdr *c = CMSG_FIRSTHDR(&m);
			c->cmsg_level = SOL_UDP; c->cmsg_type = 103 /* UDP_SEGMENT */; c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
			memcpy(CMSG_DATA(c), &gsz, sizeof(gsz));
			if (sendmsg(s, &m, 0) < 0) { if (errno == ENOBUFS || errno == EAGAIN) { it--; continue; } perror("sendmsg UDP_SEGMENT"); return 1; }
			frames++; bytes += payload; seq += payload;
		}
		double dt = now() - t0;
		printf("%s: sendmsg calls=%ld payload=%.3f GB in %.2f s -> %.2f Gbit/s payload (gso_size %u)\n", mode, frames, bytes / 1e9, dt, bytes * 8 / dt / 1e9, gsz);
		return 0;
	}
	int tap = !strncmp(mode, "tap", 3), split = strstr(mode, "split") != NULL;
	int fd;
	struct sockaddr_ll sll = {0};
	if (tap) {
		fd = open_tap(ifn);
	} else {
		fd = socket(AF_PACKET, SOCK_RAW, 0);
		int v = 1;
		if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &v, sizeof(v))) { perror("PACKET_VNET_HDR"); return 1; }
		v = 1;
		setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &v, sizeof(v));
		sll.sll_family = AF_PACKET; sll.sll_protocol = htons(ETH_P_IPV6); sll.sll_ifindex = if_nametoindex(ifn);
	}
	size_t vhl = tap ? sizeof(struct vnet_tnl_hdr) : 10;
	long frames = 0;
	uint64_t bytes = 0;
	double t0 = now();
	uint32_t seq = 1000;
	uint16_t ipid = 1;
	for (long it = 0; it < count; it++) {
		if (!split) {
			memset(vh, 0, sizeof(*vh));
			build(f, payload, seq, 1, csum ? OCS_SEED : OCS_ZERO, ipid);
			vh->flags = VNET_F_NEEDS_CSUM | (csum ? VNET_F_UDP_TUNNEL_CSUM : 0);
			vh->gso_type = (inner6 ? 4 /* TCPV6 */ : VNET_GSO_TCPV4) | VNET_GSO_UDP_TUNNEL_IPV6;
			vh->hdr_len = HDRS; vh->gso_size = mss;
			vh->csum_start = O_TCP; vh->csum_offset = 16;
			vh->outer_th_offset = O_UDP; vh->inner_nh_offset = O_IIP;
			ssize_t r;
			if (getenv("VNETSZ") && atoi(getenv("VNETSZ")) < 24) {
				struct iovec iv[2] = {{vh, atoi(getenv("VNETSZ"))}, {f, flen}};
				r = writev(fd, iv, 2);
			} else
				r = write(fd, buf, sizeof(*vh) + flen);
			if (r < 0) { fprintf(stderr, "write super-frame: %s\n", strerror(errno)); return 1; }
			frames++; bytes += payload; seq += payload; ipid += (payload + mss - 1) / mss;
		} else {
			for (uint32_t off = 0; off < payload; off += mss) {
				uint32_t pl = payload - off < mss ? payload - off : mss;
				uint8_t *fr = f + off; /* headers written just before this chunk's payload */
				uint8_t save[144 + sizeof(*vh)];
				uint8_t *hp = fr - 0; /* header start = f + off; payload at f+off+HDRS = original payload + off */
				(void)hp;
				memcpy(save, fr - sizeof(*vh), HDRS + sizeof(*vh)); /* preserve payload bytes we overwrite */
				build(fr, pl, seq, off + pl >= payload, OCS_LCO, ipid++);
				struct vnet_tnl_hdr *h = (void *)(fr - sizeof(*vh));
				memset(h, 0, sizeof(*h));
				h->flags = VNET_F_NEEDS_CSUM; h->gso_type = VNET_GSO_NONE; h->hdr_len = HDRS;
				h->csum_start = O_TCP; h->csum_offset = 16;
				ssize_t r;
				if (tap)
					r = write(fd, h, sizeof(*h) + HDRS + pl);
				else {
					struct iovec iv[2] = {{h, 10}, {fr, HDRS + pl}};
					struct msghdr m = {.msg_name = &sll, .msg_namelen = sizeof(sll), .msg_iov = iv, .msg_iovlen = 2};
					r = sendmsg(fd, &m, 0);
				}
				memcpy(fr - sizeof(*vh), save, HDRS + sizeof(*vh));
				if (r < 0) { if (errno == ENOBUFS) { off -= mss; continue; } fprintf(stderr, "write frame: %s\n", strerror(errno)); return 1; }
				frames++; bytes += pl; seq += pl;
			}
		}
	}
	double dt = now() - t0;
	(void)vhl;
	printf("%s: %ld syscalls-worth frames=%ld payload=%.3f GB in %.2f s -> %.2f Gbit/s payload\n", mode, count, frames, bytes / 1e9, dt, bytes * 8 / dt / 1e9);
	return 0;
}
