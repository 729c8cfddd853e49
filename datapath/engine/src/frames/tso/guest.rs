//! Frames for a guest that did not take every offload: a VM whose virtio-net
//! driver negotiated no GUEST_TSO4/6 (a DPDK guest by default, a small OS, a
//! firmware network stack, a guest with offloads turned off) must not be handed
//! GSO frames, nor partial checksums or `DATA_VALID` without GUEST_CSUM (virtio
//! 1.1, 5.1.6.3). What the datapath hands a tap (coalesced GSO frames, a local
//! guest's TSO buffer, partial checksums) is made into frames such a guest
//! takes: GSO buffers cut into segments of at most its MTU by the same cutter
//! that segments them for the underlay ([`super::cut`]), each with complete
//! checksums, and a partial checksum completed, as a tap without offloads has
//! the kernel do.

use super::{check_csum_fields, cut, finish, TsoDrop};
use crate::frames::output::{TxBatch, TxDest};
use crate::ids::PortId;
use wire::checksum;
use wire::meta::parse_inner;
use wire::vnet::{VnetHdr, F_DATA_VALID, GSO_ECN, GSO_TCPV4, GSO_TCPV6};

/// What a guest's driver agreed to take (for a vhost-user port, the features its
/// front end acked; a tap's kernel takes everything).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestOffloads {
    /// Partial checksums and `DATA_VALID` (`GUEST_CSUM`).
    pub csum: bool,
    /// TCP GSO frames over IPv4 and IPv6 (`GUEST_TSO4`, `GUEST_TSO6`).
    pub tso4: bool,
    pub tso6: bool,
    /// GSO frames with the ECN bit (`GUEST_ECN`).
    pub ecn: bool,
}

/// How a frame goes to a guest ([`GuestOffloads::fit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestFit {
    /// As it is, under its header.
    AsIs,
    /// As it is, under this header (a `DATA_VALID` the guest did not take cleared).
    Header(VnetHdr),
    /// Made into other frames first ([`fit_guest`]).
    Remake,
}

impl GuestOffloads {
    /// A guest that takes every offload the datapath hands out.
    pub const ALL: GuestOffloads = GuestOffloads {
        csum: true,
        tso4: true,
        tso6: true,
        ecn: true,
    };

    /// Whether a frame under `vnet` can go to this guest as it is.
    pub fn fit(&self, vnet: &VnetHdr) -> GuestFit {
        if vnet.is_gso() {
            let tso = match vnet.gso_kind() {
                GSO_TCPV4 => self.tso4,
                GSO_TCPV6 => self.tso6,
                _ => false,
            };
            let ecn = vnet.gso_type & GSO_ECN == 0 || self.ecn;
            return match tso && ecn && self.csum {
                true => GuestFit::AsIs,
                false => GuestFit::Remake,
            };
        }
        match (vnet.flags, self.csum) {
            (0, _) | (_, true) => GuestFit::AsIs,
            (F_DATA_VALID, false) => GuestFit::Header(VnetHdr::default()),
            _ => GuestFit::Remake,
        }
    }
}

/// Makes `frame` (under `vnet`, for which [`GuestOffloads::fit`] said `Remake`)
/// into frames `guest` takes, pushed to `out` for `port` with their headers: a
/// GSO buffer cut into segments whose IP packets are at most `mtu` bytes (and
/// whose payload is at most the buffer's `gso_size`), a partial checksum
/// completed. Returns how many frames were pushed; a frame whose header does not
/// match it is refused (nothing pushed).
pub fn fit_guest(
    frame: &[u8],
    vnet: &VnetHdr,
    guest: GuestOffloads,
    mtu: u16,
    port: PortId,
    out: &mut TxBatch,
) -> Result<usize, TsoDrop> {
    // Complete checksums are good: a guest that takes DATA_VALID is told so.
    let plain = VnetHdr {
        flags: if guest.csum { F_DATA_VALID } else { 0 },
        ..VnetHdr::default()
    };
    let dest = TxDest::Port { port, vnet: plain };
    if !vnet.is_gso() && !vnet.needs_csum() {
        out.push_unzeroed(dest, frame.len()).copy_from_slice(frame);
        return Ok(1);
    }
    let meta = parse_inner(frame).map_err(|_| TsoDrop::Truncated)?;
    if vnet.is_gso() {
        let headers = meta.payload_off.saturating_sub(meta.l3_off);
        let seg_payload = usize::from(mtu)
            .saturating_sub(headers)
            .min(usize::from(vnet.gso_size));
        // The guest's own header and frame bound the segments: no outer header.
        return cut(
            frame,
            vnet,
            &meta,
            seg_payload,
            (0, usize::MAX),
            dest,
            out,
            |_, _| {},
        );
    }
    check_csum_fields(vnet, &meta)?;
    let (start, field) = (meta.l4_off, meta.l4_off + usize::from(vnet.csum_offset));
    let end = meta.ip_end;
    let buf = out.push_unzeroed(dest, frame.len());
    buf[..start].copy_from_slice(&frame[..start]);
    // The field holds the sender's pseudo-header sum: summing over it is the
    // NEEDS_CSUM contract. Ethernet padding after the IP packet is not summed.
    let acc = checksum::copy_and_sum(&mut buf[start..end], &frame[start..end], 0);
    buf[end..].copy_from_slice(&frame[end..]);
    buf[field..field + 2].copy_from_slice(&finish(acc).to_be_bytes());
    Ok(1)
}
