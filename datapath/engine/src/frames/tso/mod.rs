//! Tunneled TSO: cutting guest GSO buffers into underlay-sized, encapsulated TCP
//! segments ([`segment`]), and on the receiving sled merging those segments back into
//! one GSO frame for the guest ([`Coalescer`]).
//!
//! Why: guests hand the datapath TCP buffers of up to 64 KiB (virtio TSO). Inside the
//! VPC the segment size is chosen from the 9000-byte underlay, not from the guest's
//! MTU ([`internal_segment_size`]), so one 64 KiB buffer costs ~8 underlay packets
//! instead of ~45 at 1448 bytes. The guest's own MSS travels in the Oxide Mss Geneve
//! option, and the receiver hands its guest a GSO frame with that `gso_size` (a Linux
//! guest refuses segments larger than its MTU allows unless they come as GSO).
//!
//! Every byte of payload is copied exactly once, and checksummed in the same pass
//! ([`wire::checksum::copy_and_sum`]). See docs/mtu-and-tso.md for the MTU budget and worked examples.

mod coalesce;
mod guest;
mod tunnel;

pub use coalesce::{CoalesceStats, Coalescer};
pub use guest::{fit_guest, GuestFit, GuestOffloads};
pub use tunnel::{super_frames, SuperFrames};

use crate::drop::DropReason;
use crate::frames::encap::OuterTemplate;
use crate::frames::output::{TxBatch, TxDest};
use crate::frames::rewrite::SrcNat;
use std::net::IpAddr;
use wire::checksum;
use wire::geneve::ENCAP_LEN_WITH_MSS;
use wire::meta::{InnerMeta, L3};
use wire::vnet::{VnetHdr, GSO_TCPV4, GSO_TCPV6};
use wire::MacAddr;

/// Upper bound on the segments one GSO buffer may stand for, counted both at our
/// segment size and at the guest's `gso_size`.
///
/// A Linux sender never exceeds it: a TCP GSO buffer is at most 65535 bytes and Linux's
/// smallest MSS is 48 (`TCP_MIN_SND_MSS`), i.e. 1366 segments. A lying `gso_size` of 1
/// on a 64 KiB buffer would stand for 65535 segments, which the receiving guest's
/// kernel would be asked to honour; such buffers are refused as
/// [`TsoDrop::TooManySegments`].
pub const MAX_SEGMENTS: usize = 2048;

/// IP protocol number of TCP.
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
/// Offset of the checksum in the TCP and UDP headers (what `csum_offset` must say).
const TCP_CSUM_OFFSET: usize = 16;
const UDP_CSUM_OFFSET: usize = 6;
const TCP_MIN_HEADER: usize = 20;

const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;

/// Why a guest buffer was not sent. Each converts into a [`DropReason`], whose
/// name (also this type's `Display`) is the counter name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TsoDrop {
    /// `gso_type` is neither TCPV4 nor TCPV6 (UFO and unknown types are refused).
    BadGsoType,
    /// `gso_type` TCPV4 on an IPv6 frame, or TCPV6 on an IPv4 frame.
    GsoIpMismatch,
    /// A GSO buffer whose IP payload is not TCP.
    GsoNotTcp,
    /// A GSO buffer that is an IP fragment.
    GsoFragment,
    /// `hdr_len` points beyond the end of the frame.
    HdrLenMismatch,
    /// `NEEDS_CSUM` with `csum_start` not at the TCP/UDP header.
    CsumStartMismatch,
    /// `NEEDS_CSUM` with `csum_offset` not at the TCP/UDP checksum, or beyond the frame.
    CsumOffsetOutOfRange,
    /// A GSO buffer with `gso_size` 0.
    GsoSizeZero,
    /// The buffer would become more than [`MAX_SEGMENTS`] segments.
    TooManySegments,
    /// The packet metadata does not fit the frame (offsets out of order or past the end).
    Truncated,
    /// A frame or segment too long for the outer IPv6 payload length.
    TooBig,
    /// The caller's segment size leaves no room for payload (underlay MTU too small
    /// for the headers).
    SegmentSizeZero,
}

impl TsoDrop {
    pub const ALL: &'static [TsoDrop] = &[
        TsoDrop::BadGsoType,
        TsoDrop::GsoIpMismatch,
        TsoDrop::GsoNotTcp,
        TsoDrop::GsoFragment,
        TsoDrop::HdrLenMismatch,
        TsoDrop::CsumStartMismatch,
        TsoDrop::CsumOffsetOutOfRange,
        TsoDrop::GsoSizeZero,
        TsoDrop::TooManySegments,
        TsoDrop::Truncated,
        TsoDrop::TooBig,
        TsoDrop::SegmentSizeZero,
    ];
}

/// The counter name, from the one vocabulary ([`DropReason`]).
impl core::fmt::Display for TsoDrop {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(DropReason::from(*self).name())
    }
}

/// Each reason's place in the one vocabulary; kept here, with the reasons, so that
/// `drop` imports nothing above it.
impl From<TsoDrop> for DropReason {
    fn from(d: TsoDrop) -> Self {
        match d {
            TsoDrop::BadGsoType => DropReason::TsoBadGsoType,
            TsoDrop::GsoIpMismatch => DropReason::TsoGsoIpMismatch,
            TsoDrop::GsoNotTcp => DropReason::TsoGsoNotTcp,
            TsoDrop::GsoFragment => DropReason::TsoGsoFragment,
            TsoDrop::HdrLenMismatch => DropReason::TsoHdrLenMismatch,
            TsoDrop::CsumStartMismatch => DropReason::TsoCsumStartMismatch,
            TsoDrop::CsumOffsetOutOfRange => DropReason::TsoCsumOffsetOutOfRange,
            TsoDrop::GsoSizeZero => DropReason::TsoGsoSizeZero,
            TsoDrop::TooManySegments => DropReason::TsoTooManySegments,
            TsoDrop::Truncated => DropReason::TsoTruncated,
            TsoDrop::TooBig => DropReason::TsoTooBig,
            TsoDrop::SegmentSizeZero => DropReason::TsoSegmentSizeZero,
        }
    }
}

/// Payload bytes per underlay segment for VPC-internal TCP: what is left of the
/// underlay MTU after outer IPv6 40 + UDP 8 + Geneve 8 + Mss option 8 + the inner
/// Ethernet header + the inner IP and TCP headers (options and extension headers
/// included). The outer Ethernet header is not part of the MTU.
///
/// Written as `mtu - 64 - payload_off` rather than `mtu - 78 - (payload_off - l3_off)`
/// so that a VLAN-tagged inner frame (18-byte Ethernet header) still fits; the two
/// agree for untagged frames. Example: IPv4 + TCP with timestamps (52 bytes) at 9000
/// gives 8870. Saturates at 0 (callers then get [`TsoDrop::SegmentSizeZero`]).
/// Assumes no External option (sleds never set it on guest traffic).
pub fn internal_segment_size(underlay_mtu: u16, meta: &InnerMeta) -> usize {
    // 78 counts the inner Ethernet header (14); `payload_off` counts it too.
    const OUTER_IN_MTU: usize = ENCAP_LEN_WITH_MSS - 14;
    usize::from(underlay_mtu)
        .saturating_sub(OUTER_IN_MTU)
        .saturating_sub(meta.payload_off)
}

/// Checks that the metadata's offsets are ordered and inside a frame of `len` bytes,
/// so that every later slice is in bounds.
fn check_offsets(len: usize, meta: &InnerMeta) -> Result<(), TsoDrop> {
    let ordered = meta.l3_off <= meta.l4_off
        && meta.l4_off <= meta.payload_off
        && meta.payload_off <= meta.ip_end
        && meta.ip_end <= len
        && meta.l3_off >= 14;
    if ordered {
        Ok(())
    } else {
        Err(TsoDrop::Truncated)
    }
}

fn is_ip(meta: &InnerMeta) -> bool {
    matches!(meta.l3, L3::Ipv4 | L3::Ipv6)
}

/// The unfolded pseudo-header sum of the inner packet for an L4 length.
fn pseudo_header(meta: &InnerMeta, proto: u8, l4_len: usize) -> u64 {
    match (meta.src_ip, meta.dst_ip) {
        (IpAddr::V4(s), IpAddr::V4(d)) => checksum::pseudo_header_v4(s, d, proto, l4_len as u32),
        (IpAddr::V6(s), IpAddr::V6(d)) => checksum::pseudo_header_v6(s, d, proto, l4_len as u32),
        // The parser never mixes families; a mixed pair cannot verify anywhere, so the
        // resulting checksum is as wrong as the metadata (never a panic).
        (s, d) => {
            let a = match s {
                IpAddr::V4(a) => checksum::sum(&a.octets(), 0),
                IpAddr::V6(a) => checksum::sum(&a.octets(), 0),
            };
            let b = match d {
                IpAddr::V4(b) => checksum::sum(&b.octets(), a),
                IpAddr::V6(b) => checksum::sum(&b.octets(), a),
            };
            b + u64::from(proto) + l4_len as u64
        }
    }
}

/// The value stored in a checksum field: the complement of the folded sum, with a
/// computed zero sent as 0xffff (as Linux does: for UDP zero means "no checksum", for
/// TCP both encodings verify).
fn finish(acc: u64) -> u16 {
    match !checksum::fold(acc) {
        0 => 0xffff,
        c => c,
    }
}

/// Where `csum_offset` must point for the inner protocol, if it has an L4 checksum
/// that `NEEDS_CSUM` may ask for.
fn l4_csum_offset(proto: u8) -> Option<usize> {
    match proto {
        PROTO_TCP => Some(TCP_CSUM_OFFSET),
        PROTO_UDP => Some(UDP_CSUM_OFFSET),
        _ => None,
    }
}

/// Checks `csum_start`/`csum_offset` of a `NEEDS_CSUM` header against the parsed frame:
/// they must name the TCP/UDP checksum field of this packet.
fn check_csum_fields(vnet: &VnetHdr, meta: &InnerMeta) -> Result<(), TsoDrop> {
    if !is_ip(meta) || meta.fragment || usize::from(vnet.csum_start) != meta.l4_off {
        return Err(TsoDrop::CsumStartMismatch);
    }
    match l4_csum_offset(meta.proto) {
        Some(off)
            if usize::from(vnet.csum_offset) == off && meta.l4_off + off + 2 <= meta.ip_end =>
        {
            Ok(())
        }
        _ => Err(TsoDrop::CsumOffsetOutOfRange),
    }
}

/// Completes a `NEEDS_CSUM` checksum in place (same-sled delivery, no encapsulation):
/// sums from `csum_start` to the end of the frame onto the pseudo-header sum the guest
/// left in the field, and stores the result at `csum_start + csum_offset`. A frame
/// without `NEEDS_CSUM` is left alone. The caller then hands the frame on with
/// `DATA_VALID` instead of `NEEDS_CSUM`.
pub fn complete_checksum(frame: &mut [u8], vnet: &VnetHdr) -> Result<(), TsoDrop> {
    if !vnet.needs_csum() {
        return Ok(());
    }
    let start = usize::from(vnet.csum_start);
    let field = start + usize::from(vnet.csum_offset);
    if start > frame.len() {
        return Err(TsoDrop::CsumStartMismatch);
    }
    if field + 2 > frame.len() {
        return Err(TsoDrop::CsumOffsetOutOfRange);
    }
    let c = finish(checksum::sum(&frame[start..], 0));
    frame[field..field + 2].copy_from_slice(&c.to_be_bytes());
    Ok(())
}

/// Checks a guest's `virtio_net_hdr` against the frame (`frame_len` bytes, `meta`
/// parsed from it) the way [`segment`] does: a GSO buffer must be TCP of the IP
/// version its `gso_type` names, not a fragment, with a `gso_size`, a `hdr_len`
/// inside the frame, at most [`MAX_SEGMENTS`] segments of `gso_size`, and (as any
/// `NEEDS_CSUM` frame) `csum_start`/`csum_offset` at its L4 checksum.
///
/// Same-sled delivery hands the header to the receiving guest's kernel as it is, so it
/// must pass the checks a buffer that leaves the sled passes.
pub fn check_vnet(frame_len: usize, vnet: &VnetHdr, meta: &InnerMeta) -> Result<(), TsoDrop> {
    if vnet.is_gso() {
        check_gso(frame_len, vnet, meta)
    } else if vnet.needs_csum() {
        check_csum_fields(vnet, meta)
    } else {
        Ok(())
    }
}

/// The checks of [`check_vnet`] for a GSO buffer.
fn check_gso(frame_len: usize, vnet: &VnetHdr, meta: &InnerMeta) -> Result<(), TsoDrop> {
    check_offsets(frame_len, meta)?;
    match (vnet.gso_kind(), meta.l3) {
        (GSO_TCPV4, L3::Ipv4) | (GSO_TCPV6, L3::Ipv6) => {}
        (GSO_TCPV4 | GSO_TCPV6, _) => return Err(TsoDrop::GsoIpMismatch),
        _ => return Err(TsoDrop::BadGsoType),
    }
    if meta.proto != PROTO_TCP {
        return Err(TsoDrop::GsoNotTcp);
    }
    if meta.fragment {
        return Err(TsoDrop::GsoFragment);
    }
    let min_ip_hdr = if meta.l3 == L3::Ipv6 { 40 } else { 20 };
    if meta.payload_off < meta.l4_off + TCP_MIN_HEADER || meta.l4_off < meta.l3_off + min_ip_hdr {
        return Err(TsoDrop::Truncated);
    }
    if vnet.gso_size == 0 {
        return Err(TsoDrop::GsoSizeZero);
    }
    if usize::from(vnet.hdr_len) > frame_len {
        return Err(TsoDrop::HdrLenMismatch);
    }
    if vnet.needs_csum() {
        check_csum_fields(vnet, meta)?;
    }
    let payload = meta.ip_end - meta.payload_off;
    if payload.div_ceil(usize::from(vnet.gso_size)) > MAX_SEGMENTS {
        return Err(TsoDrop::TooManySegments);
    }
    Ok(())
}

/// The payload of GSO buffer `frame` and how many segments of `seg_payload` bytes it
/// makes (at least one), once [`check_gso`] passed and the count is within
/// [`MAX_SEGMENTS`].
fn gso_payload<'f>(
    frame: &'f [u8],
    vnet: &VnetHdr,
    meta: &InnerMeta,
    seg_payload: usize,
) -> Result<(&'f [u8], usize), TsoDrop> {
    check_gso(frame.len(), vnet, meta)?;
    if seg_payload == 0 {
        return Err(TsoDrop::SegmentSizeZero);
    }
    let payload = &frame[meta.payload_off..meta.ip_end];
    let nseg = payload.len().div_ceil(seg_payload).max(1);
    if nseg > MAX_SEGMENTS {
        return Err(TsoDrop::TooManySegments);
    }
    Ok((payload, nseg))
}

/// Guest buffer -> encapsulated underlay frames in `out`; returns the number of frames.
///
/// GSO TCP buffers are cut into segments of at most `seg_payload` payload bytes (see
/// [`internal_segment_size`]), each carrying the Oxide Mss option = `guest_mss`. Per
/// segment: IPv4 total length, ID (+1 per segment, as Linux's GSO does) and header
/// checksum; IPv6 payload length; TCP sequence number; CWR only on the first segment,
/// FIN and PSH only on the last; the TCP checksum computed from scratch during the
/// payload copy (the guest's partial checksum is not trusted). A buffer whose payload
/// fits one segment becomes one packet. Non-GSO frames are encapsulated as they are,
/// with a `NEEDS_CSUM` checksum completed. The inner destination MAC becomes
/// `inner_dst_mac`.
///
/// `hdr_len` is only checked to lie within the frame: Linux taps report the length of
/// the skb's linear part there, which may include payload, so it is a hint, not the
/// header length. Metadata that disagrees with the frame is a [`TsoDrop`]; nothing is
/// appended to `out` then.
#[allow(clippy::too_many_arguments)]
pub fn segment(
    frame: &[u8],
    vnet: &VnetHdr,
    meta: &InnerMeta,
    seg_payload: usize,
    guest_mss: u32,
    outer: &OuterTemplate,
    inner_dst_mac: MacAddr,
    dest: TxDest,
    out: &mut TxBatch,
) -> Result<usize, TsoDrop> {
    let edit = InnerEdit {
        dst_mac: inner_dst_mac,
        nat: None,
    };
    segment_with(
        frame,
        vnet,
        meta,
        seg_payload,
        guest_mss,
        outer,
        edit,
        dest,
        out,
    )
}

/// What changes in the inner frame on its way out: its destination MAC (the remote
/// guest's) and, for a flow through NAT, its source (`crate::vpc::nat`). The source is
/// rewritten in each frame as it is built, once its checksums are complete, so a
/// NATed flow costs no extra copy of the guest's frame.
///
/// The NAT rewrite is referred to where the flow keeps it: by value it was 48
/// bytes copied per packet (and per fragment), NATed or not.
#[derive(Clone, Copy, Debug)]
pub struct InnerEdit<'a> {
    pub dst_mac: MacAddr,
    pub nat: Option<&'a SrcNat>,
}

impl InnerEdit<'_> {
    /// Rewrites the source of `inner` (a frame laid out as `meta` says) through NAT.
    #[inline]
    fn apply_nat(&self, inner: &mut [u8], meta: &InnerMeta) {
        if let Some(n) = self.nat {
            n.apply(inner, meta);
        }
    }
}

/// [`segment`] with the inner frame's changes given as an [`InnerEdit`].
#[allow(clippy::too_many_arguments)]
pub fn segment_with(
    frame: &[u8],
    vnet: &VnetHdr,
    meta: &InnerMeta,
    seg_payload: usize,
    guest_mss: u32,
    outer: &OuterTemplate,
    edit: InnerEdit<'_>,
    dest: TxDest,
    out: &mut TxBatch,
) -> Result<usize, TsoDrop> {
    if !vnet.is_gso() {
        return encapsulate_one(frame, vnet, meta, outer, edit, dest, out);
    }
    let hlen = outer.header_len(true);
    cut(
        frame,
        vnet,
        meta,
        seg_payload,
        (hlen, outer.max_inner_len(true)),
        dest,
        out,
        |buf, inner_len| {
            buf[hlen..hlen + 6].copy_from_slice(edit.dst_mac.as_bytes());
            edit.apply_nat(&mut buf[hlen..], meta);
            outer.write_header(buf, inner_len, Some(guest_mss));
        },
    )
}

/// Cuts GSO buffer `frame` into segments of at most `seg_payload` payload bytes,
/// each pushed to `out` behind `room.0` bytes left for the caller's header (an
/// inner frame may be at most `room.1` bytes), its IP and TCP headers and TCP
/// checksum complete; `done(buf, inner_len)` then finishes each (the outer header,
/// MAC, NAT). Returns the number of segments.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn cut(
    frame: &[u8],
    vnet: &VnetHdr,
    meta: &InnerMeta,
    seg_payload: usize,
    room: (usize, usize),
    dest: TxDest,
    out: &mut TxBatch,
    mut done: impl FnMut(&mut [u8], usize),
) -> Result<usize, TsoDrop> {
    let (hlen, max_inner) = room;
    let (payload, nseg) = gso_payload(frame, vnet, meta, seg_payload)?;
    let seg_max = seg_payload.min(payload.len());
    let hdrs = meta.payload_off;
    // The inner IPv4 total length / IPv6 payload length and the outer IPv6 payload
    // length are 16 bits.
    let fixed_v6 = if meta.l3 == L3::Ipv6 { 40 } else { 0 };
    if hdrs - meta.l3_off - fixed_v6 + seg_max > usize::from(u16::MAX) || hdrs + seg_max > max_inner
    {
        return Err(TsoDrop::TooBig);
    }

    let (l3, l4) = (meta.l3_off, meta.l4_off);
    let th_len = hdrs - l4;
    let base_id = u16::from_be_bytes([frame[l3 + 4], frame[l3 + 5]]);
    let base_seq = u32::from_be_bytes([frame[l4 + 4], frame[l4 + 5], frame[l4 + 6], frame[l4 + 7]]);
    let base_flags = frame[l4 + 13];
    // The header sums are taken once per buffer from the guest's frame, leaving out
    // the fields that change per segment (added back from their values below).
    // Summing the headers after writing them would re-read bytes just stored in
    // pieces, which stalls on store forwarding and cost ~15% of the whole segmentation.
    let ip_base = if meta.l3 == L3::Ipv4 {
        let h = &frame[l3..l4];
        // Everything but the total length (2..4), ID (4..6) and checksum (10..12).
        checksum::sum(
            &h[12..],
            checksum::sum(&h[6..10], checksum::sum(&h[..2], 0)),
        )
    } else {
        0
    };
    let th = &frame[l4..hdrs];
    // Everything but the sequence number (4..8), data offset/flags (12..14) and
    // checksum (16..18); plus the pseudo-header without its length.
    let tcp_base = checksum::sum(
        &th[18..],
        checksum::sum(
            &th[14..16],
            checksum::sum(
                &th[8..12],
                checksum::sum(&th[..4], pseudo_header(meta, PROTO_TCP, 0)),
            ),
        ),
    );

    let mut start = 0;
    for i in 0..nseg {
        let end = (start + seg_payload).min(payload.len());
        let seg = &payload[start..end];
        let inner_len = hdrs + seg.len();
        let buf = out.push_unzeroed(dest, hlen + inner_len);
        let inner = &mut buf[hlen..];
        inner[..hdrs].copy_from_slice(&frame[..hdrs]);

        // Checked against the 16-bit fields above.
        let ip_len = inner_len - l3;
        if meta.l3 == L3::Ipv4 {
            let id = base_id.wrapping_add(i as u16);
            let c = !checksum::fold(ip_base + ip_len as u64 + u64::from(id));
            let h = &mut inner[l3..l4];
            h[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
            h[4..6].copy_from_slice(&id.to_be_bytes());
            h[10..12].copy_from_slice(&c.to_be_bytes());
        } else {
            let plen = (ip_len - 40) as u16;
            inner[l3 + 4..l3 + 6].copy_from_slice(&plen.to_be_bytes());
        }

        let seq = base_seq.wrapping_add(start as u32);
        let flags = cut_flags(base_flags, i == 0, i + 1 == nseg);
        let th = &mut inner[l4..hdrs];
        th[4..8].copy_from_slice(&seq.to_be_bytes());
        th[13] = flags;
        let changed = u64::from(seq >> 16)
            + u64::from(seq & 0xffff)
            + u64::from(u16::from_be_bytes([frame[l4 + 12], flags]))
            + (th_len + seg.len()) as u64;
        let acc = checksum::copy_and_sum(&mut inner[hdrs..], seg, tcp_base + changed);
        let c = finish(acc);
        inner[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());

        done(buf, inner_len);
        start = end;
    }
    Ok(nseg)
}

/// The TCP flags of one piece cut from a buffer whose flags are `flags`: CWR only
/// on the first piece, FIN and PSH only on the last (as Linux's GSO cuts them).
#[inline]
fn cut_flags(flags: u8, first: bool, last: bool) -> u8 {
    let mut f = flags;
    if !first {
        f &= !TCP_CWR;
    }
    if !last {
        f &= !(TCP_FIN | TCP_PSH);
    }
    f
}

/// A non-GSO guest frame: one encapsulated frame without the Mss option, with the
/// inner destination MAC (and source, through NAT) rewritten and a `NEEDS_CSUM`
/// checksum completed during the copy.
fn encapsulate_one(
    frame: &[u8],
    vnet: &VnetHdr,
    meta: &InnerMeta,
    outer: &OuterTemplate,
    edit: InnerEdit<'_>,
    dest: TxDest,
    out: &mut TxBatch,
) -> Result<usize, TsoDrop> {
    // IP frames end where their length fields say (dropping any Ethernet padding);
    // other frames are sent whole.
    let inner_len = if is_ip(meta) {
        check_offsets(frame.len(), meta)?;
        meta.ip_end
    } else {
        frame.len()
    };
    if frame.len() < 14 {
        return Err(TsoDrop::Truncated);
    }
    let csum = if vnet.needs_csum() {
        check_csum_fields(vnet, meta)?;
        Some((meta.l4_off, meta.l4_off + usize::from(vnet.csum_offset)))
    } else {
        None
    };
    if inner_len > outer.max_inner_len(false) {
        return Err(TsoDrop::TooBig);
    }
    let hlen = outer.header_len(false);
    let buf = out.push_unzeroed(dest, hlen + inner_len);
    let inner = &mut buf[hlen..];
    match csum {
        Some((start, field)) => {
            inner[..start].copy_from_slice(&frame[..start]);
            // The field holds the guest's pseudo-header sum: summing over it is the
            // NEEDS_CSUM contract.
            let acc = checksum::copy_and_sum(&mut inner[start..], &frame[start..inner_len], 0);
            inner[field..field + 2].copy_from_slice(&finish(acc).to_be_bytes());
        }
        None => inner.copy_from_slice(&frame[..inner_len]),
    }
    inner[0..6].copy_from_slice(edit.dst_mac.as_bytes());
    edit.apply_nat(inner, meta);
    outer.write_header(buf, inner_len, None);
    Ok(1)
}

#[cfg(test)]
mod tests;
