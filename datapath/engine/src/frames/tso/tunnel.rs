//! Tunneled TSO handed to the kernel: a guest GSO buffer becomes one encapsulated
//! UDP-tunnel GSO super-frame ([`super_frames`]) that the kernel cuts into wire frames
//! as late as it can (software GSO at the first device without UDP-tunnel TSO, or the
//! NIC), instead of [`super::segment_with`] cutting it here.
//!
//! Why: cutting in user space costs a checksummed copy of every payload byte and one
//! skb per ~8.9 KB frame on the AF_XDP copy-mode path; the kernel's late segmentation
//! costs 2-3x less kernel CPU per wire frame (docs/tunnel-gso.md, docs/io.md).
//!
//! The kernel's segmentation of a super-frame must equal what [`super::segment_with`]
//! sends, byte for byte, and does when the super-frame says:
//!
//! - outer Ethernet/IPv6/UDP/Geneve as the first segment's today (same template, same
//!   options, the Mss option included), with the super-frame's lengths;
//! - the inner headers as the guest's with today's edits (destination MAC, NAT
//!   source), the inner IPv4 total length and header checksum valid for the
//!   super-frame, and its IP ID that of the first segment it stands for (the kernel
//!   adds one per segment);
//! - the TCP sequence number of its first byte, CWR only on the first super-frame,
//!   FIN and PSH only on the last (the kernel keeps CWR on its first segment only and
//!   FIN/PSH on its last only);
//! - the TCP checksum field holding the folded, not complemented pseudo-header sum
//!   with the super-frame's TCP length, computed here from the (rewritten) headers:
//!   the guest's value is never trusted. The kernel adjusts it per segment;
//! - the outer UDP checksum as the template wants it: the IPv6 pseudo-header seed
//!   with `F_UDP_TUNNEL_CSUM` when checksums are on, zero otherwise (copied as is);
//! - `gso_size` = the segment size [`super::segment_with`] would use.
//!
//! A buffer whose outer IPv6 payload would pass 65535 bytes (routers and
//! br_netfilter drop those) becomes two or more super-frames, split at segment
//! boundaries with the segments spread evenly. A super-frame always holds two
//! segments or more: a buffer of one segment is not made one, the caller sends it
//! as today (a GSO skb no longer than its `gso_size` is not segmented, and its
//! checksums would stay partial).

use super::{cut_flags, gso_payload, InnerEdit, TsoDrop, PROTO_TCP};
use crate::frames::encap::OuterTemplate;
use crate::frames::output::{TunnelGso, TxBatch, TxDest};
use wire::checksum;
use wire::meta::{InnerMeta, L3};
use wire::vnet::{
    VnetHdr, F_NEEDS_CSUM, F_UDP_TUNNEL_CSUM, GSO_ECN, GSO_TCPV4, GSO_TCPV6, GSO_UDP_TUNNEL_IPV6,
};

/// What [`super_frames`] appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuperFrames {
    /// Super-frames appended to the batch.
    pub frames: usize,
    /// Wire frames the kernel will cut them into.
    pub segments: usize,
}

/// Guest GSO buffer -> UDP-tunnel GSO super-frames in `out`, each to
/// [`TxDest::UnderlayGso`] on `ifindex`, built in the batch's own arena (the guest's
/// frame is read once per batch from a reused buffer, so it cannot be referred to).
///
/// Returns `Ok(None)`, appending nothing, for a frame that is not a GSO buffer or
/// whose payload fits one segment of `seg_payload`: the caller sends those as today.
/// The checks are [`super::segment_with`]'s, and metadata that disagrees with the
/// frame is the same [`TsoDrop`]; nothing is appended then.
#[allow(clippy::too_many_arguments)]
pub fn super_frames(
    frame: &[u8],
    vnet: &VnetHdr,
    meta: &InnerMeta,
    seg_payload: usize,
    guest_mss: u32,
    outer: &OuterTemplate,
    edit: &InnerEdit,
    ifindex: u32,
    out: &mut TxBatch,
) -> Result<Option<SuperFrames>, TsoDrop> {
    if !vnet.is_gso() {
        return Ok(None);
    }
    let (payload, nseg) = gso_payload(frame, vnet, meta, seg_payload)?;
    if nseg == 1 {
        return Ok(None);
    }
    let hdrs = meta.payload_off;
    let (l3, l4) = (meta.l3_off, meta.l4_off);
    let hlen = outer.header_len(true);
    // Whole segments per super-frame, at most as many as the outer IPv6 payload
    // length allows (which also keeps the inner IP lengths within 16 bits), spread
    // evenly over the super-frames needed: each must hold two segments or more,
    // since the kernel does not take a frame of one segment as GSO (it would leave
    // with a seed for its outer UDP checksum). Where no spread gives that (a
    // segment over a third of 64 KiB), the buffer is segmented as without tunnel
    // GSO.
    let room = outer.max_inner_len(true).saturating_sub(hdrs);
    let max_per = room / seg_payload;
    if max_per == 0 {
        return Err(TsoDrop::TooBig);
    }
    let nframes = nseg.div_ceil(max_per);
    let per = nseg.div_ceil(nframes);
    if nseg - (nframes - 1) * per < 2 {
        return Ok(None);
    }
    let per_frame = per * seg_payload;
    let (Ok(gso_size), Ok(hdr_len), Ok(csum_start), Ok(inner_nh)) = (
        u16::try_from(seg_payload),
        u16::try_from(hlen + hdrs),
        u16::try_from(hlen + l4),
        u16::try_from(hlen + l3),
    ) else {
        return Err(TsoDrop::TooBig);
    };
    let inner_kind = if meta.l3 == L3::Ipv4 {
        GSO_TCPV4
    } else {
        GSO_TCPV6
    };
    let outer_csum = if outer.udp_checksum() {
        F_UDP_TUNNEL_CSUM
    } else {
        0
    };
    let dest = TxDest::UnderlayGso {
        ifindex,
        gso: TunnelGso {
            flags: F_NEEDS_CSUM | outer_csum,
            gso_type: inner_kind | GSO_UDP_TUNNEL_IPV6 | (vnet.gso_type & GSO_ECN),
            hdr_len,
            gso_size,
            csum_start,
            inner_nh,
        },
    };
    let base_id = u16::from_be_bytes([frame[l3 + 4], frame[l3 + 5]]);
    let base_seq = u32::from_be_bytes([frame[l4 + 4], frame[l4 + 5], frame[l4 + 6], frame[l4 + 7]]);
    let base_flags = frame[l4 + 13];
    let mut start = 0;
    for i in 0..nframes {
        let end = (start + per_frame).min(payload.len());
        let inner_len = hdrs + end - start;
        let buf = out.push_unzeroed(dest, hlen + inner_len);
        let (head, inner) = buf.split_at_mut(hlen);
        inner[..hdrs].copy_from_slice(&frame[..hdrs]);
        inner[hdrs..].copy_from_slice(&payload[start..end]);
        inner[0..6].copy_from_slice(edit.dst_mac.as_bytes());
        let th = &mut inner[l4..hdrs];
        th[4..8].copy_from_slice(&base_seq.wrapping_add(start as u32).to_be_bytes());
        th[13] = cut_flags(base_flags, i == 0, i + 1 == nframes);
        // Lengths before NAT (which adjusts the checksums it touches), checksums
        // after it, from the rewritten headers.
        let ip_len = inner_len - l3;
        if meta.l3 == L3::Ipv4 {
            let id = base_id.wrapping_add((start / seg_payload) as u16);
            let h = &mut inner[l3..l4];
            h[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
            h[4..6].copy_from_slice(&id.to_be_bytes());
        } else {
            inner[l3 + 4..l3 + 6].copy_from_slice(&((ip_len - 40) as u16).to_be_bytes());
        }
        edit.apply_nat(inner, meta);
        if meta.l3 == L3::Ipv4 {
            let h = &mut inner[l3..l4];
            h[10..12].fill(0);
            let c = !checksum::fold(checksum::sum(h, 0));
            h[10..12].copy_from_slice(&c.to_be_bytes());
        }
        let seed = tcp_seed(inner, meta, inner_len - l4);
        inner[l4 + 16..l4 + 18].copy_from_slice(&seed.to_be_bytes());
        outer.write_gso_header(head, inner, Some(guest_mss));
        start = end;
    }
    Ok(Some(SuperFrames {
        frames: nframes,
        segments: nseg,
    }))
}

/// The folded, not complemented, pseudo-header sum of a TCP segment of `tcp_len`
/// bytes, with the addresses as they are in `inner` now (after any NAT rewrite).
/// `meta.l3` is IPv4 or IPv6 (`check_gso` made sure).
fn tcp_seed(inner: &[u8], meta: &InnerMeta, tcp_len: usize) -> u16 {
    let l3 = meta.l3_off;
    let addrs = if meta.l3 == L3::Ipv4 {
        l3 + 12..l3 + 20
    } else {
        l3 + 8..l3 + 40
    };
    let fixed = u64::from(PROTO_TCP) + tcp_len as u64;
    checksum::fold(checksum::sum(inner.get(addrs).unwrap_or(&[]), fixed))
}
