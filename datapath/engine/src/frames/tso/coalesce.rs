//! Receive-side coalescing: in-order TCP segments of one flow that arrive in the same
//! batch become one frame for the guest, handed over as a GSO frame when its payload
//! exceeds the sender's MSS (the Oxide Mss option).
//!
//! Why: the sending sled cut the guest's 64 KiB buffer into ~8870-byte underlay
//! segments. Each of those is larger than the receiving guest's MTU-derived MSS, so it
//! must reach the guest as GSO anyway; merging them first means the guest's stack sees
//! one 64 KiB buffer, as if the two guests shared a host.
//!
//! The merge rules follow Linux GRO (`tcp_gro_receive`, `inet_gro_receive`): same
//! flow, contiguous sequence numbers, identical ACK, window and TCP options (so equal
//! timestamps), flags those of the first segment (ACK, ECE, CWR) with CWR only on
//! the first and PSH or FIN ending the frame, never SYN/RST/URG,
//! all segments but the last of equal size, IPv4 without options and with the ID
//! either incrementing by one or (with DF) fixed, IPv6 without extension headers and
//! with the same traffic class, flow label and hop limit. Each segment's TCP checksum
//! is verified (a read of its payload where it was received); a segment that fails is
//! passed on with no offload flags, so the guest's own stack drops it.
//!
//! Nothing is copied but headers: a held frame is the first segment's headers (kept
//! here, completed when the frame is flushed) and a reference to each merged
//! segment's payload in the receive buffers ([`InputRef`]); the batch hands the guest
//! that list, gathered by one `writev`.

use super::{
    check_offsets, pseudo_header, MAX_SEGMENTS, PROTO_TCP, TCP_CSUM_OFFSET, TCP_CWR, TCP_FIN,
    TCP_MIN_HEADER, TCP_PSH,
};
use crate::frames::ecn;
use crate::frames::input::{InputRef, RxFrame};
use crate::frames::output::{TxBatch, TxDest};
use crate::frames::rewrite::{End, Rewrite};
use crate::ids::PortId;
use crate::machinery::counters::summed_across_workers;
use serde::Serialize;
use wire::checksum;
use wire::meta::{InnerMeta, L3};
use wire::vnet::{VnetHdr, F_DATA_VALID, F_NEEDS_CSUM, GSO_ECN, GSO_TCPV4, GSO_TCPV6};
use wire::MacAddr;

/// Flows (over all ports) with a frame being built; the oldest is flushed when a new
/// flow needs a slot. A batch rarely interleaves more flows than this.
const MAX_PENDING: usize = 16;
/// Largest IP packet a merged frame may become: the 16-bit IPv4 total length, or
/// the fixed IPv6 header plus the 16-bit payload length.
const MAX_IPV4_LEN: usize = 65535;
const MAX_IPV6_LEN: usize = 40 + 65535;
/// Largest L2 header accepted for merging (Ethernet with two VLAN tags).
const MAX_L2_LEN: usize = 22;
/// Largest headers of a frame that may start a merge: the L2 header, a plain IPv6
/// header (no extension headers) and a TCP header with the most options.
const MAX_HDR_LEN: usize = MAX_L2_LEN + 40 + 60;
/// Segments a held frame makes room for up front; more grow its list once.
pub(super) const REFS_RESERVED: usize = 64;

const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;
const TCP_URG: u8 = 0x20;
const TCP_ECE: u8 = 0x40;
/// Flags a frame may start with: CWR only on the first segment (as GSO emits it, the
/// frame then goes out with the ECN GSO bit).
const START_FLAGS: u8 = TCP_ACK | TCP_ECE | TCP_CWR;
/// Flags that end a frame: the segment carrying them is the last one merged.
const END_FLAGS: u8 = TCP_PSH | TCP_FIN;
const IPV4_DF: u8 = 0x40;

/// Counters of the coalescer (exported with the engine's stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CoalesceStats {
    /// Frames handed to [`Coalescer::push`].
    pub frames_in: u64,
    /// Frames written to the output.
    pub frames_out: u64,
    /// Segments appended to an earlier segment's frame (`frames_in - frames_out` once
    /// flushed).
    pub merged: u64,
    /// Output frames handed over as GSO (payload larger than `gso_size`).
    pub gso_frames_out: u64,
}

summed_across_workers!(CoalesceStats {
    frames_in,
    frames_out,
    merged,
    gso_frames_out
});

/// How the IPv4 IDs of a merged run behave, known from the second segment on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IdMode {
    Unknown,
    Incrementing,
    /// Only with DF set (Linux senders with DF may keep the ID fixed).
    Fixed,
}

/// A frame being built: the first segment's headers and the payload of every merged
/// segment, by reference.
pub(super) struct Pending {
    in_use: bool,
    port: PortId,
    /// Metadata of the first segment (offsets and flow key of the whole frame).
    meta: InnerMeta,
    /// The first segment's headers (`meta.payload_off` bytes) with the gateway's MAC
    /// as source; lengths, flags and checksums are completed when flushed.
    hdr: [u8; MAX_HDR_LEN],
    /// Each merged segment's payload, in order.
    pub(super) refs: Vec<InputRef>,
    /// Length of the whole frame: headers and every merged payload.
    len: usize,
    next_seq: u32,
    /// Payload length of the first segment; later ones may not be longer.
    seg_len: usize,
    segs: u32,
    /// A shorter, PSH or FIN segment was appended: nothing more may follow.
    closed: bool,
    /// PSH/FIN of the last segment, set on the merged header.
    end_flags: u8,
    /// The Mss option the segments came with (all must agree).
    mss: Option<u32>,
    /// The frame's `gso_size`: the Mss option, else the first segment's payload.
    gso_size: usize,
    /// The longest the frame may grow (`len`): an IP packet of at most
    /// [`max_ip_len`] and a payload of at most [`MAX_SEGMENTS`] of `gso_size`. Fixed
    /// by the first segment, so merging checks one bound (no division per segment).
    max_len: usize,
    id_mode: IdMode,
    first_id: u16,
    /// Unfolded sum of the first segment's IPv4 header without its total length and
    /// checksum (the only fields merging changes); 0 for IPv6.
    ip_sum: u64,
    /// [`tcp_pseudo`] of the flow (all merged segments have its addresses).
    pseudo: u64,
    /// The same of the frame the guest gets: `pseudo`, or the translated flow's.
    out_pseudo: u64,
    /// Insertion order, to pick the oldest slot to evict.
    age: u64,
}

/// What a first segment brings to [`Pending::begin`] besides its headers.
struct Start {
    port: PortId,
    /// Its payload, where it was received.
    payload: InputRef,
    mss: Option<u32>,
    gateway_mac: MacAddr,
    age: u64,
    /// [`tcp_pseudo`] of the segment as received.
    pseudo: u64,
}

impl Pending {
    fn new() -> Pending {
        Pending {
            in_use: false,
            port: PortId(0),
            meta: placeholder_meta(),
            hdr: [0; MAX_HDR_LEN],
            refs: Vec::with_capacity(REFS_RESERVED),
            len: 0,
            next_seq: 0,
            seg_len: 0,
            segs: 0,
            closed: false,
            end_flags: 0,
            mss: None,
            gso_size: 1,
            max_len: 0,
            id_mode: IdMode::Unknown,
            first_id: 0,
            ip_sum: 0,
            pseudo: 0,
            out_pseudo: 0,
            age: 0,
        }
    }

    fn same_flow(&self, port: PortId, m: &InnerMeta) -> bool {
        self.in_use
            && self.port == port
            && self.meta.src_ip == m.src_ip
            && self.meta.dst_ip == m.dst_ip
            && self.meta.src_port == m.src_port
            && self.meta.dst_port == m.dst_port
    }

    /// Takes a first segment (checksum verified) as a new frame: `head` holds its
    /// headers, `start.payload` refers to the rest; `edit` changes the headers the
    /// guest gets.
    fn begin(&mut self, start: Start, head: &[u8], m: &InnerMeta, edit: Edit<'_>) {
        let (hdrs, end) = (m.payload_off, m.ip_end);
        self.in_use = true;
        self.port = start.port;
        self.meta = *m;
        // `can_start` bounded the headers by MAX_HDR_LEN and `is_tcp_segment` put
        // them in `head`.
        self.hdr[..hdrs].copy_from_slice(&head[..hdrs]);
        self.hdr[6..12].copy_from_slice(start.gateway_mac.as_bytes());
        self.out_pseudo = edit.apply(&mut self.hdr[..hdrs], m, start.pseudo);
        self.refs.clear();
        self.refs.push(start.payload);
        self.len = end;
        self.next_seq = seq_of(head, m.l4_off).wrapping_add((end - hdrs) as u32);
        self.seg_len = end - hdrs;
        self.segs = 1;
        self.closed = false;
        self.end_flags = 0;
        self.mss = start.mss;
        self.gso_size = start.mss.map_or(self.seg_len, |m| m as usize).max(1);
        // `can_start` checked that the first segment is within this bound already.
        self.max_len = (m.l3_off + max_ip_len(m.l3)).min(hdrs + MAX_SEGMENTS * self.gso_size);
        self.id_mode = IdMode::Unknown;
        self.first_id = u16::from_be_bytes([head[m.l3_off + 4], head[m.l3_off + 5]]);
        self.ip_sum = match m.l3 {
            // `can_start` checked the 20-byte header; summed as the guest gets it.
            L3::Ipv4 => ipv4_fixed_sum(&self.hdr[m.l3_off..m.l3_off + 20]),
            _ => 0,
        };
        self.pseudo = start.pseudo;
        self.age = start.age;
    }

    /// Takes a following segment (checksum verified): `head` holds its headers,
    /// `payload` refers to the rest.
    fn advance(&mut self, head: &[u8], m: &InnerMeta, payload: InputRef) {
        let n = m.ip_end - m.payload_off;
        if self.id_mode == IdMode::Unknown && m.l3 == L3::Ipv4 {
            let id = u16::from_be_bytes([head[m.l3_off + 4], head[m.l3_off + 5]]);
            self.id_mode = if id == self.first_id {
                IdMode::Fixed
            } else {
                IdMode::Incrementing
            };
        }
        self.refs.push(payload);
        self.len += n;
        self.next_seq = self.next_seq.wrapping_add(n as u32);
        self.segs += 1;
        self.end_flags = head[m.l4_off + 13] & END_FLAGS;
        self.closed = self.end_flags != 0 || n < self.seg_len;
    }

    /// Completes the held headers for the frame as it stands (lengths, IPv4 header
    /// checksum, PSH/FIN of the last segment, the pseudo-header sum for
    /// `NEEDS_CSUM`) and returns its offload metadata. A single segment no larger
    /// than the `gso_size` stays as it arrived, checksum verified.
    fn finish(&mut self) -> VnetHdr {
        let (l3, l4, hdrs) = (self.meta.l3_off, self.meta.l4_off, self.meta.payload_off);
        let payload = self.len - hdrs;
        if self.segs == 1 && payload <= self.gso_size {
            return VnetHdr {
                flags: F_DATA_VALID,
                ..VnetHdr::default()
            };
        }
        let h = &mut self.hdr[..hdrs];
        // `can_start`/`can_merge` kept these within their 16-bit fields.
        let ip_len = self.len - l3;
        if self.meta.l3 == L3::Ipv4 {
            // From the sum kept since the first segment, without summing the header.
            let c = !checksum::fold(self.ip_sum + ip_len as u64);
            h[l3 + 2..l3 + 4].copy_from_slice(&(ip_len as u16).to_be_bytes());
            h[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
        } else {
            h[l3 + 4..l3 + 6].copy_from_slice(&((ip_len - 40) as u16).to_be_bytes());
        }
        h[l4 + 13] |= self.end_flags;
        partial_checksum(h, l4, self.out_pseudo, self.len - l4);
        gso_vnet(self.meta.l3, l4, hdrs, h[l4 + 13], payload, self.gso_size)
    }
}

fn placeholder_meta() -> InnerMeta {
    use std::net::{IpAddr, Ipv4Addr};
    InnerMeta {
        dst_mac: MacAddr::ZERO,
        src_mac: MacAddr::ZERO,
        l3: L3::Other(0),
        l3_off: 0,
        l4_off: 0,
        payload_off: 0,
        ip_end: 0,
        src_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        dst_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        proto: 0,
        src_port: 0,
        dst_port: 0,
        tcp_flags: 0,
        icmp_type: 0,
        icmp_code: 0,
        fragment: false,
        dont_fragment: false,
        hop_limit: 0,
    }
}

fn max_ip_len(l3: L3) -> usize {
    match l3 {
        L3::Ipv4 => MAX_IPV4_LEN,
        _ => MAX_IPV6_LEN,
    }
}

/// A TCP segment whose metadata fits the frame (`len` bytes) and whose headers are
/// whole and in `head`.
fn is_tcp_segment(head: &[u8], len: usize, m: &InnerMeta) -> bool {
    matches!(m.l3, L3::Ipv4 | L3::Ipv6)
        && m.proto == PROTO_TCP
        && !m.fragment
        && check_offsets(len, m).is_ok()
        && m.payload_off >= m.l4_off + TCP_MIN_HEADER
        && m.payload_off <= head.len()
}

/// Whether `payload` bytes cut at `gso_size` stand for at most [`MAX_SEGMENTS`]
/// segments: the most a guest is ever asked to honour in one GSO frame (an Mss option
/// of 1 under an 8870-byte segment would otherwise stand for 8870).
fn within_segment_bound(payload: usize, gso_size: usize) -> bool {
    // Multiplied rather than divided: this runs for every segment that starts a frame.
    payload <= MAX_SEGMENTS.saturating_mul(gso_size)
}

/// A segment that may begin a merged frame: data, ACK with at most ECE/CWR besides, no
/// PSH or FIN (they end a frame, so alone such a segment is sent at once), no IPv4
/// options or IPv6 extension headers, and no more than [`MAX_SEGMENTS`] of the
/// sender's MSS `mss` on its own.
fn can_start(head: &[u8], m: &InnerMeta, mss: Option<u32>) -> bool {
    let flags = head[m.l4_off + 13];
    let ip_hdr = m.l4_off - m.l3_off;
    let plain_ip = match m.l3 {
        L3::Ipv4 => ip_hdr == 20,
        _ => ip_hdr == 40,
    };
    plain_ip
        && m.l3_off <= MAX_L2_LEN
        && m.payload_off <= MAX_HDR_LEN
        && m.ip_end - m.l3_off <= max_ip_len(m.l3)
        && m.ip_end > m.payload_off
        && flags & !START_FLAGS == 0
        && flags & TCP_ACK != 0
        // Without an Mss option the first segment is the gso_size: one segment.
        && mss.is_none_or(|mss| within_segment_bound(m.ip_end - m.payload_off, mss as usize))
}

#[inline]
fn seq_of(head: &[u8], l4: usize) -> u32 {
    // One bounds check for the four bytes.
    let b = &head[l4 + 4..l4 + 8];
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// The TCP pseudo-header sum of a segment's addresses, without the length (added per
/// use: the sum is linear in it). Kept per held frame, so merging a segment does not
/// sum the addresses again.
fn tcp_pseudo(m: &InnerMeta) -> u64 {
    pseudo_header(m, PROTO_TCP, 0)
}

/// Whether the TCP segment `frame` (headers in `head`) carries a valid checksum:
/// pseudo-header + TCP header + payload folds to all ones. The payload is read where
/// it was received, in as many pieces as it arrived in.
fn tcp_segment_ok(frame: &RxFrame<'_>, head: &[u8], m: &InnerMeta, pseudo: u64) -> bool {
    let (l4, hdrs, end) = (m.l4_off, m.payload_off, m.ip_end);
    let acc = pseudo + (end - l4) as u64;
    checksum::fold(frame.sum(hdrs..end, header_sum(&head[l4..hdrs], acc))) == 0xffff
}

/// Unfolded sum of the first 20 bytes of `h`, an IPv4 header without options, less
/// its total length and checksum (what `Pending::ip_sum` keeps): its five 32-bit
/// words minus those two 16-bit fields, which the words contain, so the difference
/// cannot underflow. A fixed-length slice needs one bounds check, where picking the
/// eight other 16-bit words one by one took ~45 instructions per frame.
fn ipv4_fixed_sum(h: &[u8]) -> u64 {
    let h = &h[..20];
    let total_len = u16::from_be_bytes([h[2], h[3]]);
    let csum = u16::from_be_bytes([h[10], h[11]]);
    header_sum(h, 0) - u64::from(total_len) - u64::from(csum)
}

/// [`checksum::sum`] of a TCP header (20 to 60 bytes, whole 32-bit words): the words
/// added directly, without the set-up `checksum::sum` does for long inputs (~120
/// instructions for a 32-byte header, about a third of that here). A big-endian
/// 32-bit word is congruent to the sum of its two 16-bit halves modulo 0xffff, so
/// the result folds to the same checksum.
fn header_sum(header: &[u8], acc: u64) -> u64 {
    let words = header.chunks_exact(4);
    let rest = words.remainder();
    let acc = words.fold(acc, |a, w| {
        a + u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
    });
    if rest.is_empty() {
        acc
    } else {
        checksum::sum(rest, acc)
    }
}

/// Merges in-order TCP segments per port and flow; see the module documentation.
/// Slots and their lists are allocated on first use and kept, so the steady state
/// allocates nothing.
pub struct Coalescer {
    pub(super) slots: Vec<Pending>,
    next_age: u64,
    stats: CoalesceStats,
}

impl Default for Coalescer {
    fn default() -> Self {
        Self::new()
    }
}

impl Coalescer {
    pub fn new() -> Self {
        Coalescer {
            slots: Vec::with_capacity(MAX_PENDING),
            next_age: 0,
            stats: CoalesceStats::default(),
        }
    }

    pub fn stats(&self) -> CoalesceStats {
        self.stats
    }

    /// Takes one decapsulated guest-bound frame (`meta` parsed from it, `ecn` the
    /// inner ECN field to set if decapsulation changes it, `mss` from its Geneve Mss
    /// option). TCP data is held for merging until [`Self::flush`] or until a
    /// segment that cannot follow it arrives; everything else goes to `out` at once,
    /// after this port's held frames. Every frame's source MAC becomes `gateway_mac`.
    ///
    /// Held frames refer to `frame`'s input: the caller keeps its inputs until the
    /// batch they end up in is drained, and flushes before that.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn push(
        &mut self,
        port: PortId,
        frame: RxFrame<'_>,
        meta: &InnerMeta,
        ecn: Option<u8>,
        mss: Option<u32>,
        gateway_mac: MacAddr,
        out: &mut TxBatch<'_>,
    ) {
        let edit = Edit { nat: None, ecn };
        self.push_with(port, &frame, meta, edit, mss, gateway_mac, out);
    }

    /// [`Self::push`] for a frame the NAT layer translates (`dst`, the rewrite of
    /// its destination): `frame` and `meta` as received. Only headers change, so
    /// the payload is still referred to where it arrived, and a merged frame is
    /// translated once.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn push_translated(
        &mut self,
        port: PortId,
        frame: &RxFrame<'_>,
        meta: &InnerMeta,
        dst: &Rewrite,
        ecn: Option<u8>,
        mss: Option<u32>,
        gateway_mac: MacAddr,
        out: &mut TxBatch<'_>,
    ) {
        let edit = Edit {
            nat: Some(dst),
            ecn,
        };
        self.push_with(port, frame, meta, edit, mss, gateway_mac, out);
    }

    /// [`Self::push`] and [`Self::push_translated`] (`edit`: what changes in the
    /// headers). The frame by reference: the callers' copy is used where it
    /// is, not copied again for the call.
    #[allow(clippy::too_many_arguments)]
    fn push_with(
        &mut self,
        port: PortId,
        frame: &RxFrame<'_>,
        meta: &InnerMeta,
        edit: Edit<'_>,
        mss: Option<u32>,
        gateway_mac: MacAddr,
        out: &mut TxBatch<'_>,
    ) {
        self.stats.frames_in += 1;
        // Only an MSS that can be a gso_size is used; 0 or > 65535 is treated as absent.
        let mss = mss.filter(|&m| m >= 1 && m <= u32::from(u16::MAX));
        let head = frame.head();
        if !is_tcp_segment(head, frame.len(), meta) {
            self.flush_port(port, out);
            self.emit_raw(port, frame, meta, edit, gateway_mac, out);
            return;
        }
        if let Some(i) = self.slots.iter().position(|p| p.same_flow(port, meta)) {
            // A frame whose ECN field changes starts a frame of its own, as GRO
            // keeps a CE-marked segment apart.
            if edit.ecn.is_none() && self.can_merge(i, head, meta, mss) {
                if self.append(i, frame, head, meta) {
                    return;
                }
                // Bad checksum: keep order, let the guest drop it.
                self.flush_slot(i, out);
                self.emit_raw(port, frame, meta, edit, gateway_mac, out);
                return;
            }
            self.flush_slot(i, out);
        }
        if can_start(head, meta, mss) {
            let pseudo = tcp_pseudo(meta);
            if !tcp_segment_ok(frame, head, meta, pseudo) {
                self.emit_raw(port, frame, meta, edit, gateway_mac, out);
                return;
            }
            let i = self.free_slot(out);
            let payload = frame.input_ref(meta.payload_off..meta.ip_end);
            let age = self.next_age;
            self.next_age += 1;
            let start = Start {
                port,
                payload,
                mss,
                gateway_mac,
                age,
                pseudo,
            };
            self.slots[i].begin(start, head, meta, edit);
            return;
        }
        self.emit_single(port, frame, meta, edit, mss, gateway_mac, out);
    }

    /// Writes port `port`'s held frames to `out`: the caller is about to write a
    /// frame for it that is not coalesced (one the NAT layer translates into the
    /// batch), which must come after them.
    pub fn flush_for(&mut self, port: PortId, out: &mut TxBatch<'_>) {
        self.flush_port(port, out);
    }

    /// Counts a frame the caller wrote past the coalescer (after
    /// [`Coalescer::flush_for`]).
    pub fn count_passed(&mut self) {
        self.stats.frames_in += 1;
        self.stats.frames_out += 1;
    }

    /// Writes every held frame to `out` (end of a batch).
    pub fn flush(&mut self, out: &mut TxBatch<'_>) {
        for i in 0..self.slots.len() {
            if self.slots[i].in_use {
                self.flush_slot(i, out);
            }
        }
    }

    fn flush_port(&mut self, port: PortId, out: &mut TxBatch<'_>) {
        for i in 0..self.slots.len() {
            if self.slots[i].in_use && self.slots[i].port == port {
                self.flush_slot(i, out);
            }
        }
    }

    /// An unused slot, allocating one up to [`MAX_PENDING`], else the oldest flushed.
    fn free_slot(&mut self, out: &mut TxBatch<'_>) -> usize {
        if let Some(i) = self.slots.iter().position(|p| !p.in_use) {
            return i;
        }
        if self.slots.len() < MAX_PENDING {
            self.slots.push(Pending::new());
            return self.slots.len() - 1;
        }
        let oldest = (0..self.slots.len())
            .min_by_key(|&i| self.slots[i].age)
            .unwrap_or(0);
        self.flush_slot(oldest, out);
        oldest
    }

    /// Whether the segment with headers `head` may be appended to slot `i` (same flow
    /// already established).
    fn can_merge(&self, i: usize, head: &[u8], m: &InnerMeta, mss: Option<u32>) -> bool {
        let p = &self.slots[i];
        let pm = &p.meta;
        let (l3, l4, hdrs) = (m.l3_off, m.l4_off, m.payload_off);
        if p.closed
            || p.mss != mss
            || l3 != pm.l3_off
            || l4 != pm.l4_off
            || hdrs != pm.payload_off
            || m.l3 != pm.l3
        {
            return false;
        }
        let n = m.ip_end - hdrs;
        if n == 0 || n > p.seg_len || seq_of(head, l4) != p.next_seq {
            return false;
        }
        if p.len + n > p.max_len {
            return false;
        }
        let b = &p.hdr;
        // TCP: ACK number, data offset, window, urgent pointer and options identical;
        // flags those of the first segment, minus CWR, plus PSH/FIN.
        let flags = head[l4 + 13];
        if flags & !END_FLAGS != b[l4 + 13] & !TCP_CWR
            || head[l4 + 8..l4 + 13] != b[l4 + 8..l4 + 13]
            || head[l4 + 14..l4 + 16] != b[l4 + 14..l4 + 16]
            || head[l4 + 18..hdrs] != b[l4 + 18..hdrs]
        {
            return false;
        }
        match m.l3 {
            L3::Ipv4 => {
                // Version/IHL/TOS, flags/fragment offset, TTL and protocol identical.
                if head[l3..l3 + 2] != b[l3..l3 + 2] || head[l3 + 6..l3 + 10] != b[l3 + 6..l3 + 10]
                {
                    return false;
                }
                let id = u16::from_be_bytes([head[l3 + 4], head[l3 + 5]]);
                let next = p.first_id.wrapping_add(p.segs as u16);
                let df = head[l3 + 6] & IPV4_DF != 0;
                match p.id_mode {
                    IdMode::Unknown => id == next || (df && id == p.first_id),
                    IdMode::Incrementing => id == next,
                    IdMode::Fixed => id == p.first_id,
                }
            }
            // Version, traffic class, flow label, next header and hop limit identical.
            _ => head[l3..l3 + 4] == b[l3..l3 + 4] && head[l3 + 6..l3 + 8] == b[l3 + 6..l3 + 8],
        }
    }

    /// Appends the payload of `frame` to slot `i` after verifying its checksum;
    /// returns false (slot unchanged) on a bad checksum.
    fn append(&mut self, i: usize, frame: &RxFrame<'_>, head: &[u8], m: &InnerMeta) -> bool {
        let p = &mut self.slots[i];
        if !tcp_segment_ok(frame, head, m, p.pseudo) {
            return false;
        }
        p.advance(head, m, frame.input_ref(m.payload_off..m.ip_end));
        self.stats.merged += 1;
        true
    }

    /// Ends slot `i`'s frame: its completed headers and payload references go to `out`.
    fn flush_slot(&mut self, i: usize, out: &mut TxBatch<'_>) {
        let p = &mut self.slots[i];
        let vnet = p.finish();
        let dest = TxDest::Port { port: p.port, vnet };
        out.push_gather(dest, &p.hdr[..p.meta.payload_off], &p.refs);
        p.in_use = false;
        self.count_out(&vnet);
    }

    fn count_out(&mut self, vnet: &VnetHdr) {
        if vnet.is_gso() {
            self.stats.gso_frames_out += 1;
        }
        self.stats.frames_out += 1;
    }

    /// A TCP segment that is not held: its checksum verified, and handed over as GSO
    /// if its payload exceeds the sender's MSS.
    #[allow(clippy::too_many_arguments)]
    fn emit_single(
        &mut self,
        port: PortId,
        frame: &RxFrame<'_>,
        m: &InnerMeta,
        edit: Edit<'_>,
        mss: Option<u32>,
        gateway_mac: MacAddr,
        out: &mut TxBatch<'_>,
    ) {
        let (l4, hdrs, end) = (m.l4_off, m.payload_off, m.ip_end);
        let payload = end - hdrs;
        let head = frame.head();
        let flags = head[l4 + 13];
        let pseudo = tcp_pseudo(m);
        let gso = if !tcp_segment_ok(frame, head, m, pseudo) {
            self.emit_raw(port, frame, m, edit, gateway_mac, out);
            return;
        } else {
            mss.filter(|&gso| {
                payload > gso as usize
                    && within_segment_bound(payload, gso as usize)
                    && flags & (TCP_SYN | TCP_RST | TCP_URG) == 0
            })
        };
        let vnet = match gso {
            Some(gso) => gso_vnet(m.l3, l4, hdrs, flags, payload, gso as usize),
            None => VnetHdr {
                flags: F_DATA_VALID,
                ..VnetHdr::default()
            },
        };
        let h = out.push_received(TxDest::Port { port, vnet }, frame, hdrs);
        h[6..12].copy_from_slice(gateway_mac.as_bytes());
        let pseudo = edit.apply(h, m, pseudo);
        if gso.is_some() {
            partial_checksum(h, l4, pseudo, end - l4);
        }
        self.count_out(&vnet);
    }

    /// A frame passed on as is (its headers changed by `edit`), bar the source MAC,
    /// with no offload claims.
    fn emit_raw(
        &mut self,
        port: PortId,
        frame: &RxFrame<'_>,
        m: &InnerMeta,
        edit: Edit<'_>,
        gateway_mac: MacAddr,
        out: &mut TxBatch<'_>,
    ) {
        let dest = TxDest::Port {
            port,
            vnet: VnetHdr::default(),
        };
        // The parser saw a whole Ethernet header (14 bytes), so the MACs are there,
        // and the headers an edit changes, in the frame's head.
        let h = if edit.is_none() {
            out.push_received(dest, frame, 12)
        } else {
            let h = out.push_received(dest, frame, m.payload_off);
            edit.apply(h, m, 0);
            h
        };
        h[..6].copy_from_slice(m.dst_mac.as_bytes());
        h[6..12].copy_from_slice(gateway_mac.as_bytes());
        self.stats.frames_out += 1;
    }
}

/// What changes in the headers of a frame on its way to the guest.
#[derive(Clone, Copy, Debug, Default)]
struct Edit<'a> {
    /// The NAT rewrite of its destination.
    nat: Option<&'a Rewrite>,
    /// The inner ECN field to set (RFC 6040 decapsulation: `frames::ecn`).
    ecn: Option<u8>,
}

impl Edit<'_> {
    fn is_none(&self) -> bool {
        self.nat.is_none() && self.ecn.is_none()
    }

    /// Applies the edit to `h` (the headers of the packet `m` describes) and
    /// returns `pseudo`, the packet's pseudo-header sum, as it is after the edit.
    #[inline]
    fn apply(&self, h: &mut [u8], m: &InnerMeta, pseudo: u64) -> u64 {
        if let Some(e) = self.ecn {
            ecn::set_inner_ecn(h, m, e);
        }
        match self.nat {
            Some(r) => {
                r.apply(h, m, End::Dst);
                pseudo + r.pseudo_delta()
            }
            None => pseudo,
        }
    }
}

/// Puts the folded pseudo-header sum in the TCP checksum field, as `NEEDS_CSUM`
/// expects (the receiver sums from `csum_start` on top of it).
fn partial_checksum(frame: &mut [u8], l4: usize, pseudo: u64, tcp_len: usize) {
    let field = l4 + TCP_CSUM_OFFSET;
    let c = checksum::fold(pseudo + tcp_len as u64);
    frame[field..field + 2].copy_from_slice(&c.to_be_bytes());
}

/// Offload metadata of a frame whose TCP checksum field holds the pseudo-header sum:
/// `NEEDS_CSUM`, plus GSO when the payload exceeds `gso_size`.
fn gso_vnet(
    l3: L3,
    l4_off: usize,
    payload_off: usize,
    tcp_flags: u8,
    payload: usize,
    gso_size: usize,
) -> VnetHdr {
    let mut v = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: 0,
        hdr_len: payload_off as u16,
        gso_size: 0,
        csum_start: l4_off as u16,
        csum_offset: TCP_CSUM_OFFSET as u16,
    };
    if payload > gso_size {
        v.gso_type = if l3 == L3::Ipv4 { GSO_TCPV4 } else { GSO_TCPV6 };
        if tcp_flags & TCP_CWR != 0 {
            v.gso_type |= GSO_ECN;
        }
        v.gso_size = gso_size as u16;
    }
    v
}

#[cfg(test)]
mod header_sum_tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn header_sum_folds_like_checksum_sum(
            h in proptest::collection::vec(any::<u8>(), 0..64),
            acc in 0u64..(1 << 40),
        ) {
            prop_assert_eq!(
                checksum::fold(header_sum(&h, acc)),
                checksum::fold(checksum::sum(&h, acc))
            );
        }

        /// A header completed from the kept sum, as `Finish::apply` does, verifies,
        /// and the sum does not depend on the two fields it leaves out.
        #[test]
        fn ipv4_fixed_sum_completes_a_valid_header(
            mut h in proptest::collection::vec(any::<u8>(), 20),
            total_len in any::<u16>(),
            old_len in any::<u16>(),
            old_csum in any::<u16>(),
        ) {
            h[0] = 0x45;
            h[2..4].copy_from_slice(&old_len.to_be_bytes());
            h[10..12].copy_from_slice(&old_csum.to_be_bytes());
            let kept = ipv4_fixed_sum(&h);
            let mut zeroed = h.clone();
            zeroed[2..4].fill(0);
            zeroed[10..12].fill(0);
            prop_assert_eq!(checksum::fold(kept), checksum::fold(checksum::sum(&zeroed, 0)));
            let c = !checksum::fold(kept + u64::from(total_len));
            h[2..4].copy_from_slice(&total_len.to_be_bytes());
            h[10..12].copy_from_slice(&c.to_be_bytes());
            prop_assert_eq!(checksum::fold(checksum::sum(&h, 0)), 0xffff);
        }
    }
}
