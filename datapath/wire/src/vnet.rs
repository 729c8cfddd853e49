//! `struct virtio_net_hdr`: the offload metadata a tap opened with `IFF_VNET_HDR`
//! (and a virtio NIC) puts in front of every frame.
//!
//! It says whether the L4 checksum still has to be completed (`NEEDS_CSUM` with
//! `csum_start`/`csum_offset`) or is already known good (`DATA_VALID`), and whether the
//! frame is a GSO buffer to be cut into `gso_size`-byte TCP segments. The fields are
//! little-endian: Linux taps use the guest's byte order, which on x86 is little-endian
//! (`TUNSETVNETLE` is not needed there).

/// Size of the header on the wire (the legacy layout without `num_buffers`).
pub const VNET_HDR_LEN: usize = 10;

/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the L4 checksum is partial; complete it by summing
/// from `csum_start` to the end and storing at `csum_start + csum_offset`.
pub const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: the checksums are known good.
pub const F_DATA_VALID: u8 = 2;

/// `VIRTIO_NET_HDR_GSO_NONE`
pub const GSO_NONE: u8 = 0;
/// `VIRTIO_NET_HDR_GSO_TCPV4`
pub const GSO_TCPV4: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_UDP` (UFO; refused by this datapath)
pub const GSO_UDP: u8 = 3;
/// `VIRTIO_NET_HDR_GSO_TCPV6`
pub const GSO_TCPV6: u8 = 4;
/// `VIRTIO_NET_HDR_GSO_ECN`: the buffer's TCP header has CWR set; only the first
/// segment keeps it.
pub const GSO_ECN: u8 = 0x80;
/// `VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6` (Linux 6.17+): the buffer is encapsulated in
/// UDP over IPv6 and the inner packet is what `gso_type`'s low bits say.
pub const GSO_UDP_TUNNEL_IPV6: u8 = 0x40;
/// `VIRTIO_NET_HDR_F_UDP_TUNNEL_CSUM` (Linux 6.17+): the outer UDP checksum field holds
/// the pseudo-header seed and is completed per segment.
pub const F_UDP_TUNNEL_CSUM: u8 = 8;
/// Size of `struct virtio_net_hdr_v1_hash_tunnel`: the header a tap configured with
/// `TUNSETVNETHDRSZ` 24 takes in front of every frame.
pub const TUNNEL_VNET_HDR_LEN: usize = 24;

/// The decoded header. Values are host order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    /// Decodes the first [`VNET_HDR_LEN`] bytes; `None` if fewer are present.
    pub fn from_bytes(b: &[u8]) -> Option<VnetHdr> {
        let b: &[u8; VNET_HDR_LEN] = b.get(..VNET_HDR_LEN)?.try_into().ok()?;
        let u16le = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16le(2),
            gso_size: u16le(4),
            csum_start: u16le(6),
            csum_offset: u16le(8),
        })
    }

    pub fn to_bytes(&self) -> [u8; VNET_HDR_LEN] {
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        b
    }

    /// The GSO type without the ECN bit.
    pub fn gso_kind(&self) -> u8 {
        self.gso_type & !GSO_ECN
    }

    pub fn is_gso(&self) -> bool {
        self.gso_kind() != GSO_NONE
    }

    pub fn needs_csum(&self) -> bool {
        self.flags & F_NEEDS_CSUM != 0
    }
}

/// `struct virtio_net_hdr_v1_hash_tunnel` (Linux 6.17+): a [`VnetHdr`] for a
/// UDP-encapsulated GSO buffer, plus where the outer transport header and the inner
/// network header start. Written in front of a super-frame on a tap whose header
/// size is [`TUNNEL_VNET_HDR_LEN`], it has the kernel cut the buffer late (software
/// GSO at the first device without UDP-tunnel TSO, or the NIC), replicating
/// everything between `outer_th` and `inner_nh` verbatim (docs/tunnel-gso.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TunnelVnetHdr {
    /// `flags`, `gso_type`, `hdr_len`, `gso_size`, `csum_start` (the inner L4
    /// header) and `csum_offset`; `num_buffers` and the hash fields are zero.
    pub vnet: VnetHdr,
    /// Offset of the outer UDP header.
    pub outer_th: u16,
    /// Offset of the inner IP header.
    pub inner_nh: u16,
}

impl TunnelVnetHdr {
    pub fn to_bytes(&self) -> [u8; TUNNEL_VNET_HDR_LEN] {
        let mut b = [0u8; TUNNEL_VNET_HDR_LEN];
        b[..VNET_HDR_LEN].copy_from_slice(&self.vnet.to_bytes());
        // 10..12 num_buffers, 12..20 hash value, report and padding: zero.
        b[20..22].copy_from_slice(&self.outer_th.to_le_bytes());
        b[22..24].copy_from_slice(&self.inner_nh.to_le_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tunnel_header_layout_is_the_kernels() {
        // The docs/tunnel-gso.md example: Geneve without options, inner IPv4,
        // gso_size 8800, outer UDP checksum seeded.
        let h = TunnelVnetHdr {
            vnet: VnetHdr {
                flags: F_NEEDS_CSUM | F_UDP_TUNNEL_CSUM,
                gso_type: GSO_TCPV4 | GSO_UDP_TUNNEL_IPV6,
                hdr_len: 124,
                gso_size: 8800,
                csum_start: 104,
                csum_offset: 16,
            },
            outer_th: 54,
            inner_nh: 84,
        };
        let want = [
            9u8, 0x41, 124, 0, 0x60, 0x22, 104, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 54, 0, 84,
            0,
        ];
        assert_eq!(h.to_bytes(), want);
    }

    #[test]
    fn round_trip_as_seen_from_a_linux_tap() {
        // NEEDS_CSUM, GSO_TCPV4, hdr_len 66, gso_size 1448, csum_start 34, csum_offset 16.
        let bytes = [1u8, 1, 66, 0, 0xa8, 0x05, 34, 0, 16, 0];
        let h = VnetHdr::from_bytes(&bytes).unwrap();
        assert_eq!(h.gso_size, 1448);
        assert_eq!(h.hdr_len, 66);
        assert!(h.needs_csum() && h.is_gso());
        assert_eq!(h.to_bytes(), bytes);
        assert_eq!(VnetHdr::from_bytes(&bytes[..9]), None);
    }
}
