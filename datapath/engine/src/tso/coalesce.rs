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
//! is verified during its copy; a segment that fails is passed on untouched with no
//! offload flags, so the guest's own stack drops it.

use super::{
    pseudo_header, MAX_SEGMENTS, PROTO_TCP, TCP_CSUM_OFFSET, TCP_CWR, TCP_FIN, TCP_MIN_HEADER,
    TCP_PSH,
};
use crate::output::{TxBatch, TxDest};
use crate::port::PortId;
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
/// Each slot's buffer: one maximal frame, allocated once.
const SLOT_LEN: usize = MAX_L2_LEN + MAX_IPV6_LEN;

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

/// How the IPv4 IDs of a merged run behave, known from the second segment on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IdMode {
    Unknown,
    Incrementing,
    /// Only with DF set (Linux senders with DF may keep the ID fixed).
    Fixed,
}

/// A frame being built: the first segment's headers followed by the merged payload.
pub(super) struct Pending {
    in_use: bool,
    port: PortId,
    /// Metadata of the first segment (offsets and flow key of the whole frame).
    meta: InnerMeta,
    buf: Box<[u8]>,
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
    id_mode: IdMode,
    first_id: u16,
    /// Insertion order, to pick the oldest slot to evict.
    age: u64,
}

impl Pending {
    fn new() -> Pending {
        Pending {
            in_use: false,
            port: PortId(0),
            meta: placeholder_meta(),
            buf: vec![0u8; SLOT_LEN].into_boxed_slice(),
            len: 0,
            next_seq: 0,
            seg_len: 0,
            segs: 0,
            closed: false,
            end_flags: 0,
            mss: None,
            id_mode: IdMode::Unknown,
            first_id: 0,
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

    fn gso_size(&self) -> usize {
        self.mss.map_or(self.seg_len, |m| m as usize).max(1)
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

/// A TCP segment whose metadata fits the frame and whose header is whole.
fn is_tcp_segment(frame: &[u8], m: &InnerMeta) -> bool {
    matches!(m.l3, L3::Ipv4 | L3::Ipv6)
        && m.proto == PROTO_TCP
        && !m.fragment
        && super::check_offsets(frame, m).is_ok()
        && m.payload_off >= m.l4_off + TCP_MIN_HEADER
}

/// A segment that may begin a merged frame: data, ACK with at most ECE/CWR besides, no
/// PSH or FIN (they end a frame, so alone such a segment is sent at once), no IPv4
/// options or IPv6 extension headers.
fn can_start(frame: &[u8], m: &InnerMeta) -> bool {
    let flags = frame[m.l4_off + 13];
    let ip_hdr = m.l4_off - m.l3_off;
    let plain_ip = match m.l3 {
        L3::Ipv4 => ip_hdr == 20,
        _ => ip_hdr == 40,
    };
    plain_ip
        && m.l3_off <= MAX_L2_LEN
        && m.ip_end - m.l3_off <= max_ip_len(m.l3)
        && m.ip_end > m.payload_off
        && flags & !START_FLAGS == 0
        && flags & TCP_ACK != 0
}

fn seq_of(frame: &[u8], l4: usize) -> u32 {
    u32::from_be_bytes([frame[l4 + 4], frame[l4 + 5], frame[l4 + 6], frame[l4 + 7]])
}

/// One's-complement check of a TCP segment: pseudo-header + header (with its checksum
/// field) + payload sum folds to all ones.
fn tcp_sum_ok(m: &InnerMeta, header: &[u8], payload_sum: u64, payload_len: usize) -> bool {
    let acc = pseudo_header(m, PROTO_TCP, header.len() + payload_len);
    checksum::fold(checksum::sum(header, acc) + payload_sum) == 0xffff
}

/// Merges in-order TCP segments per port and flow; see the module documentation.
/// Buffers are allocated on first use and kept, so the steady state allocates nothing.
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

    /// Takes one decapsulated guest-bound frame (`meta` parsed from it, `mss` from its
    /// Geneve Mss option). TCP data is held for merging until [`Self::flush`] or until a
    /// segment that cannot follow it arrives; everything else goes to `out` at once,
    /// after this port's held frames. Every frame's source MAC becomes `gateway_mac`.
    pub fn push(
        &mut self,
        port: PortId,
        frame: &[u8],
        meta: &InnerMeta,
        mss: Option<u32>,
        gateway_mac: MacAddr,
        out: &mut TxBatch,
    ) {
        self.stats.frames_in += 1;
        // Only an MSS that can be a gso_size is used; 0 or > 65535 is treated as absent.
        let mss = mss.filter(|&m| m >= 1 && m <= u32::from(u16::MAX));
        if !is_tcp_segment(frame, meta) {
            self.flush_port(port, out);
            self.emit_raw(port, frame, gateway_mac, out);
            return;
        }
        if let Some(i) = self.slots.iter().position(|p| p.same_flow(port, meta)) {
            if self.can_merge(i, frame, meta, mss) {
                if self.append(i, frame, meta) {
                    return;
                }
                // Bad checksum: keep order, let the guest drop it.
                self.flush_slot(i, out);
                self.emit_raw(port, frame, gateway_mac, out);
                return;
            }
            self.flush_slot(i, out);
        }
        if can_start(frame, meta) {
            let i = self.free_slot(out);
            if self.start(i, port, frame, meta, mss, gateway_mac) {
                return;
            }
            self.emit_raw(port, frame, gateway_mac, out);
            return;
        }
        self.emit_single(port, frame, meta, mss, gateway_mac, out);
    }

    /// Writes every held frame to `out` (end of a batch).
    pub fn flush(&mut self, out: &mut TxBatch) {
        for i in 0..self.slots.len() {
            if self.slots[i].in_use {
                self.flush_slot(i, out);
            }
        }
    }

    fn flush_port(&mut self, port: PortId, out: &mut TxBatch) {
        for i in 0..self.slots.len() {
            if self.slots[i].in_use && self.slots[i].port == port {
                self.flush_slot(i, out);
            }
        }
    }

    /// An unused slot, allocating one up to [`MAX_PENDING`], else the oldest flushed.
    fn free_slot(&mut self, out: &mut TxBatch) -> usize {
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

    /// Copies the first segment into slot `i`, verifying its checksum on the way.
    /// Returns false (slot left free) if the checksum is wrong.
    fn start(
        &mut self,
        i: usize,
        port: PortId,
        frame: &[u8],
        m: &InnerMeta,
        mss: Option<u32>,
        gateway_mac: MacAddr,
    ) -> bool {
        let p = &mut self.slots[i];
        let (hdrs, end) = (m.payload_off, m.ip_end);
        p.buf[..hdrs].copy_from_slice(&frame[..hdrs]);
        p.buf[6..12].copy_from_slice(gateway_mac.as_bytes());
        let psum = checksum::copy_and_sum(&mut p.buf[hdrs..end], &frame[hdrs..end], 0);
        if !tcp_sum_ok(m, &frame[m.l4_off..hdrs], psum, end - hdrs) {
            return false;
        }
        p.in_use = true;
        p.port = port;
        p.meta = *m;
        p.len = end;
        p.next_seq = seq_of(frame, m.l4_off).wrapping_add((end - hdrs) as u32);
        p.seg_len = end - hdrs;
        p.segs = 1;
        p.closed = false;
        p.end_flags = 0;
        p.mss = mss;
        p.id_mode = IdMode::Unknown;
        p.first_id = u16::from_be_bytes([frame[m.l3_off + 4], frame[m.l3_off + 5]]);
        p.age = self.next_age;
        self.next_age += 1;
        true
    }

    /// Whether `frame` may be appended to slot `i` (same flow already established).
    fn can_merge(&self, i: usize, frame: &[u8], m: &InnerMeta, mss: Option<u32>) -> bool {
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
        if n == 0 || n > p.seg_len || seq_of(frame, l4) != p.next_seq {
            return false;
        }
        let merged_payload = p.len - hdrs + n;
        if p.len + n - l3 > max_ip_len(m.l3) || merged_payload.div_ceil(p.gso_size()) > MAX_SEGMENTS
        {
            return false;
        }
        let b = &p.buf;
        // TCP: ACK number, data offset, window, urgent pointer and options identical;
        // flags those of the first segment, minus CWR, plus PSH/FIN.
        let flags = frame[l4 + 13];
        if flags & !END_FLAGS != b[l4 + 13] & !TCP_CWR
            || frame[l4 + 8..l4 + 13] != b[l4 + 8..l4 + 13]
            || frame[l4 + 14..l4 + 16] != b[l4 + 14..l4 + 16]
            || frame[l4 + 18..hdrs] != b[l4 + 18..hdrs]
        {
            return false;
        }
        match m.l3 {
            L3::Ipv4 => {
                // Version/IHL/TOS, flags/fragment offset, TTL and protocol identical.
                if frame[l3..l3 + 2] != b[l3..l3 + 2]
                    || frame[l3 + 6..l3 + 10] != b[l3 + 6..l3 + 10]
                {
                    return false;
                }
                let id = u16::from_be_bytes([frame[l3 + 4], frame[l3 + 5]]);
                let next = p.first_id.wrapping_add(p.segs as u16);
                let df = frame[l3 + 6] & IPV4_DF != 0;
                match p.id_mode {
                    IdMode::Unknown => id == next || (df && id == p.first_id),
                    IdMode::Incrementing => id == next,
                    IdMode::Fixed => id == p.first_id,
                }
            }
            // Version, traffic class, flow label, next header and hop limit identical.
            _ => frame[l3..l3 + 4] == b[l3..l3 + 4] && frame[l3 + 6..l3 + 8] == b[l3 + 6..l3 + 8],
        }
    }

    /// Appends the payload of `frame` to slot `i`, verifying its checksum during the
    /// copy; on a bad checksum the slot is left as it was and false is returned.
    fn append(&mut self, i: usize, frame: &[u8], m: &InnerMeta) -> bool {
        let p = &mut self.slots[i];
        let (hdrs, end) = (m.payload_off, m.ip_end);
        let n = end - hdrs;
        let psum = checksum::copy_and_sum(&mut p.buf[p.len..p.len + n], &frame[hdrs..end], 0);
        if !tcp_sum_ok(m, &frame[m.l4_off..hdrs], psum, n) {
            return false;
        }
        if p.id_mode == IdMode::Unknown && m.l3 == L3::Ipv4 {
            let id = u16::from_be_bytes([frame[m.l3_off + 4], frame[m.l3_off + 5]]);
            p.id_mode = if id == p.first_id {
                IdMode::Fixed
            } else {
                IdMode::Incrementing
            };
        }
        p.len += n;
        p.next_seq = p.next_seq.wrapping_add(n as u32);
        p.segs += 1;
        p.end_flags = frame[m.l4_off + 13] & END_FLAGS;
        p.closed = p.end_flags != 0 || n < p.seg_len;
        self.stats.merged += 1;
        true
    }

    /// Finishes slot `i`'s frame (lengths, IPv4 header checksum, offload metadata) and
    /// writes it to `out`.
    fn flush_slot(&mut self, i: usize, out: &mut TxBatch) {
        let p = &mut self.slots[i];
        p.in_use = false;
        let m = p.meta;
        let (l3, l4, hdrs) = (m.l3_off, m.l4_off, m.payload_off);
        let payload = p.len - hdrs;
        let gso_size = p.gso_size();
        let frame = &mut p.buf[..p.len];
        let vnet = if p.segs == 1 && payload <= gso_size {
            // The segment as it arrived, checksum verified.
            VnetHdr {
                flags: F_DATA_VALID,
                ..VnetHdr::default()
            }
        } else {
            // `can_start`/`can_merge` kept these within their 16-bit fields.
            let ip_len = p.len - l3;
            if m.l3 == L3::Ipv4 {
                frame[l3 + 2..l3 + 4].copy_from_slice(&(ip_len as u16).to_be_bytes());
                frame[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
                let c = checksum::checksum(&frame[l3..l4]);
                frame[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
            } else {
                frame[l3 + 4..l3 + 6].copy_from_slice(&((ip_len - 40) as u16).to_be_bytes());
            }
            frame[l4 + 13] |= p.end_flags;
            partial_checksum(frame, &m, p.len - l4);
            gso_vnet(&m, frame[l4 + 13], payload, gso_size)
        };
        if vnet.is_gso() {
            self.stats.gso_frames_out += 1;
        }
        self.stats.frames_out += 1;
        out.push_unzeroed(TxDest::Port { port: p.port, vnet }, p.len)
            .copy_from_slice(frame);
    }

    /// A TCP segment that is not held: copied with its checksum verified, and handed
    /// over as GSO if its payload exceeds the sender's MSS.
    fn emit_single(
        &mut self,
        port: PortId,
        frame: &[u8],
        m: &InnerMeta,
        mss: Option<u32>,
        gateway_mac: MacAddr,
        out: &mut TxBatch,
    ) {
        let (l4, hdrs, end) = (m.l4_off, m.payload_off, m.ip_end);
        let buf = out.push_unzeroed(
            TxDest::Port {
                port,
                vnet: VnetHdr::default(),
            },
            end,
        );
        buf[..hdrs].copy_from_slice(&frame[..hdrs]);
        buf[6..12].copy_from_slice(gateway_mac.as_bytes());
        let psum = checksum::copy_and_sum(&mut buf[hdrs..end], &frame[hdrs..end], 0);
        let payload = end - hdrs;
        let flags = frame[l4 + 13];
        let vnet = if !tcp_sum_ok(m, &frame[l4..hdrs], psum, payload) {
            VnetHdr::default()
        } else {
            match mss {
                Some(gso)
                    if payload > gso as usize
                        && payload.div_ceil(gso as usize) <= MAX_SEGMENTS
                        && flags & (TCP_SYN | TCP_RST | TCP_URG) == 0 =>
                {
                    partial_checksum(buf, m, end - l4);
                    gso_vnet(m, flags, payload, gso as usize)
                }
                _ => VnetHdr {
                    flags: F_DATA_VALID,
                    ..VnetHdr::default()
                },
            }
        };
        if vnet.is_gso() {
            self.stats.gso_frames_out += 1;
        }
        self.stats.frames_out += 1;
        out.set_last_dest(TxDest::Port { port, vnet });
    }

    /// A frame passed on as is (bar the source MAC), with no offload claims.
    fn emit_raw(&mut self, port: PortId, frame: &[u8], gateway_mac: MacAddr, out: &mut TxBatch) {
        let buf = out.push_unzeroed(
            TxDest::Port {
                port,
                vnet: VnetHdr::default(),
            },
            frame.len(),
        );
        buf.copy_from_slice(frame);
        if let Some(src) = buf.get_mut(6..12) {
            src.copy_from_slice(gateway_mac.as_bytes());
        }
        self.stats.frames_out += 1;
    }
}

/// Puts the folded pseudo-header sum in the TCP checksum field, as `NEEDS_CSUM`
/// expects (the receiver sums from `csum_start` on top of it).
fn partial_checksum(frame: &mut [u8], m: &InnerMeta, tcp_len: usize) {
    let field = m.l4_off + TCP_CSUM_OFFSET;
    let c = checksum::fold(pseudo_header(m, PROTO_TCP, tcp_len));
    frame[field..field + 2].copy_from_slice(&c.to_be_bytes());
}

/// Offload metadata of a frame whose TCP checksum field holds the pseudo-header sum:
/// `NEEDS_CSUM`, plus GSO when the payload exceeds `gso_size`.
fn gso_vnet(m: &InnerMeta, tcp_flags: u8, payload: usize, gso_size: usize) -> VnetHdr {
    let mut v = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: 0,
        hdr_len: m.payload_off as u16,
        gso_size: 0,
        csum_start: m.l4_off as u16,
        csum_offset: TCP_CSUM_OFFSET as u16,
    };
    if payload > gso_size {
        v.gso_type = if m.l3 == L3::Ipv4 {
            GSO_TCPV4
        } else {
            GSO_TCPV6
        };
        if tcp_flags & TCP_CWR != 0 {
            v.gso_type |= GSO_ECN;
        }
        v.gso_size = gso_size as u16;
    }
    v
}
