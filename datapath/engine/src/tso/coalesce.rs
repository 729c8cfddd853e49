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
//!
//! Where a frame is built: copying each segment once is what keeps coalescing near
//! memory speed, so the first flow to start a frame builds it directly in the output
//! batch, as its last frame, and grows it in place while nothing else is pushed after
//! it ([`Place::Batch`]). That frame is kept complete (lengths, checksums, offload
//! metadata) after every segment, so it is valid whatever the caller does with the
//! batch; once something else follows it, it is simply done. Frames of other flows
//! held at the same time are built in the slot's own buffer and copied to the batch
//! when flushed ([`Place::Buffer`]), which costs a second copy.

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

/// Where a held frame is being built (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// In the slot's buffer; finished and copied to the output when flushed.
    Buffer,
    /// In the output batch as frame `index`, complete after every segment, and grown
    /// in place while it is the batch's last frame.
    Batch { index: usize },
}

/// A frame being built: the first segment's headers followed by the merged payload
/// (in `buf`, or in the output batch with only the headers, as last written, in
/// `buf`).
pub(super) struct Pending {
    in_use: bool,
    place: Place,
    /// Destination and offload metadata of the frame as it stands in the batch.
    dest: TxDest,
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
    /// Insertion order, to pick the oldest slot to evict.
    age: u64,
}

impl Pending {
    fn new() -> Pending {
        Pending {
            in_use: false,
            place: Place::Buffer,
            dest: TxDest::Port {
                port: PortId(0),
                vnet: VnetHdr::default(),
            },
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
            gso_size: 1,
            max_len: 0,
            id_mode: IdMode::Unknown,
            first_id: 0,
            ip_sum: 0,
            pseudo: 0,
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

    /// Takes a first segment (already copied, checksum verified) as a new frame.
    #[allow(clippy::too_many_arguments)]
    fn begin(
        &mut self,
        port: PortId,
        frame: &[u8],
        m: &InnerMeta,
        mss: Option<u32>,
        age: u64,
        place: Place,
        pseudo: u64,
    ) {
        let (hdrs, end) = (m.payload_off, m.ip_end);
        self.in_use = true;
        self.place = place;
        self.dest = TxDest::Port {
            port,
            vnet: VnetHdr::default(),
        };
        self.port = port;
        self.meta = *m;
        self.len = end;
        self.next_seq = seq_of(frame, m.l4_off).wrapping_add((end - hdrs) as u32);
        self.seg_len = end - hdrs;
        self.segs = 1;
        self.closed = false;
        self.end_flags = 0;
        self.mss = mss;
        self.gso_size = mss.map_or(self.seg_len, |m| m as usize).max(1);
        self.max_len = (m.l3_off + max_ip_len(m.l3)).min(hdrs + MAX_SEGMENTS * self.gso_size);
        self.id_mode = IdMode::Unknown;
        self.first_id = u16::from_be_bytes([frame[m.l3_off + 4], frame[m.l3_off + 5]]);
        self.ip_sum = match m.l3 {
            // `can_start` checked the 20-byte header.
            L3::Ipv4 => ipv4_fixed_sum(&frame[m.l3_off..m.l3_off + 20]),
            _ => 0,
        };
        self.pseudo = pseudo;
        self.age = age;
    }

    /// Takes a following segment (already appended, checksum verified).
    fn advance(&mut self, frame: &[u8], m: &InnerMeta) {
        let n = m.ip_end - m.payload_off;
        if self.id_mode == IdMode::Unknown && m.l3 == L3::Ipv4 {
            let id = u16::from_be_bytes([frame[m.l3_off + 4], frame[m.l3_off + 5]]);
            self.id_mode = if id == self.first_id {
                IdMode::Fixed
            } else {
                IdMode::Incrementing
            };
        }
        self.len += n;
        self.next_seq = self.next_seq.wrapping_add(n as u32);
        self.segs += 1;
        self.end_flags = frame[m.l4_off + 13] & END_FLAGS;
        self.closed = self.end_flags != 0 || n < self.seg_len;
    }

    /// What finishing the frame needs, copied out so the frame itself may be
    /// borrowed from `buf`.
    fn finish(&self) -> Finish {
        Finish {
            l3: self.meta.l3,
            l3_off: self.meta.l3_off,
            l4_off: self.meta.l4_off,
            payload_off: self.meta.payload_off,
            len: self.len,
            segs: self.segs,
            end_flags: self.end_flags,
            gso_size: self.gso_size,
            ip_sum: self.ip_sum,
            pseudo: self.pseudo,
        }
    }

    /// After a segment was added to the frame built in the batch (`frame`, the
    /// batch's last): completes its headers and returns its destination with the
    /// offload metadata.
    fn finish_in_batch(&mut self, frame: &mut [u8]) -> TxDest {
        let vnet = self.finish().apply(frame);
        let dest = TxDest::Port {
            port: self.port,
            vnet,
        };
        self.dest = dest;
        dest
    }
}

/// The state [`Finish::apply`] completes a frame from.
struct Finish {
    l3: L3,
    l3_off: usize,
    l4_off: usize,
    payload_off: usize,
    len: usize,
    segs: u32,
    end_flags: u8,
    gso_size: usize,
    /// Unfolded sum of the IPv4 header without its total length and checksum.
    ip_sum: u64,
    /// [`tcp_pseudo`] of the flow.
    pseudo: u64,
}

impl Finish {
    /// Brings the headers of `frame` (`len` bytes) up to date with its segments
    /// (lengths, IPv4 header checksum, PSH/FIN of the last segment, the pseudo-header
    /// sum for `NEEDS_CSUM`) and returns its offload metadata. A single segment no
    /// larger than the `gso_size` stays as it arrived, checksum verified.
    fn apply(&self, frame: &mut [u8]) -> VnetHdr {
        let (l3, l4, hdrs) = (self.l3_off, self.l4_off, self.payload_off);
        let payload = self.len - hdrs;
        if self.segs == 1 && payload <= self.gso_size {
            return VnetHdr {
                flags: F_DATA_VALID,
                ..VnetHdr::default()
            };
        }
        // `can_start`/`can_merge` kept these within their 16-bit fields.
        let ip_len = self.len - l3;
        if self.l3 == L3::Ipv4 {
            // From the sum kept since the first segment: summing the header just
            // written would re-read bytes stored in pieces (a store-forwarding stall).
            let c = !checksum::fold(self.ip_sum + ip_len as u64);
            frame[l3 + 2..l3 + 4].copy_from_slice(&(ip_len as u16).to_be_bytes());
            frame[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
        } else {
            frame[l3 + 4..l3 + 6].copy_from_slice(&((ip_len - 40) as u16).to_be_bytes());
        }
        frame[l4 + 13] |= self.end_flags;
        partial_checksum(frame, l4, self.pseudo, self.len - l4);
        gso_vnet(self.l3, l4, hdrs, frame[l4 + 13], payload, self.gso_size)
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

#[inline]
fn seq_of(frame: &[u8], l4: usize) -> u32 {
    // One bounds check for the four bytes.
    let b = &frame[l4 + 4..l4 + 8];
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Whether `frame` has the header bytes of `buf` (the flow `m` describes), except
/// those finishing a merged frame rewrites: the IPv4 total length and checksum or the
/// IPv6 payload length (with the neighbouring bytes, for one rule for both families),
/// and the TCP flags and checksum.
///
/// Those bytes are first copied from `frame` into `buf`, so one comparison of the
/// whole header does the check: ~140 instructions per merged segment for the whole
/// check, where a comparison per unchanged range took ~240. Merging reads none of
/// them from `buf` except the TCP flags, which after the copy are the first
/// segment's plus the PSH/FIN that closed the frame (no more merging) if it is ours,
/// and do not matter if it is not (the slot is then released).
fn same_fixed_headers(frame: &[u8], buf: &mut [u8], m: &InnerMeta) -> bool {
    let (l3, l4, hdrs) = (m.l3_off, m.l4_off, m.payload_off);
    let (Some(f), Some(b)) = (frame.get(..hdrs), buf.get_mut(..hdrs)) else {
        return false;
    };
    // `is_tcp_segment` and `can_start` put a 20-byte TCP header after a 20- or
    // 40-byte IP header, so these are within `hdrs`.
    b[l3 + 2..l3 + 6].copy_from_slice(&f[l3 + 2..l3 + 6]);
    b[l3 + 10..l3 + 12].copy_from_slice(&f[l3 + 10..l3 + 12]);
    b[l4 + 13] = f[l4 + 13];
    b[l4 + 16..l4 + 18].copy_from_slice(&f[l4 + 16..l4 + 18]);
    f == &*b
}

/// The TCP pseudo-header sum of a segment's addresses, without the length (added per
/// use: the sum is linear in it). Kept per held frame, so merging a segment does not
/// sum the addresses again.
fn tcp_pseudo(m: &InnerMeta) -> u64 {
    pseudo_header(m, PROTO_TCP, 0)
}

/// Copies a first segment into `f` (its length), rewriting the source MAC to
/// `gateway_mac`, and verifies its TCP checksum during the copy.
///
/// The TCP header goes through the checksumming copy with the payload: one pass sums
/// exactly what the checksum covers, which saves summing the header on its own and a
/// second, variable-length `memcpy` call (~40 instructions per segment).
fn copy_first(
    f: &mut [u8],
    frame: &[u8],
    m: &InnerMeta,
    pseudo: u64,
    gateway_mac: MacAddr,
) -> bool {
    let (l4, end) = (m.l4_off, m.ip_end);
    f[..l4].copy_from_slice(&frame[..l4]);
    f[6..12].copy_from_slice(gateway_mac.as_bytes());
    let tcp_sum = checksum::copy_and_sum(&mut f[l4..end], &frame[l4..end], 0);
    checksum::fold(pseudo + (end - l4) as u64 + tcp_sum) == 0xffff
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

/// One's-complement check of a TCP segment: pseudo-header + header (with its checksum
/// field) + payload sum folds to all ones.
/// `pseudo` is the pseudo-header sum without the length (`tcp_pseudo`).
fn tcp_sum_ok(pseudo: u64, header: &[u8], payload_sum: u64, payload_len: usize) -> bool {
    let acc = pseudo + (header.len() + payload_len) as u64;
    checksum::fold(header_sum(header, acc) + payload_sum) == 0xffff
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
    ///
    /// One held frame may already be in `out` (its last frame, complete at every
    /// moment): pass the same batch until [`Self::flush`], and flush before clearing
    /// it. Frames others push to `out` in between are fine; that frame is then done.
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
        self.release_if_not_last(out);
        // Only an MSS that can be a gso_size is used; 0 or > 65535 is treated as absent.
        let mss = mss.filter(|&m| m >= 1 && m <= u32::from(u16::MAX));
        if !is_tcp_segment(frame, meta) {
            self.flush_port(port, out);
            self.emit_raw(port, frame, gateway_mac, out);
            return;
        }
        if let Some(i) = self.slots.iter().position(|p| p.same_flow(port, meta)) {
            if self.can_merge(i, frame, meta, mss) {
                if self.append(i, frame, meta, out) {
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
            if self.start(i, port, frame, meta, mss, gateway_mac, out) {
                return;
            }
            self.emit_raw(port, frame, gateway_mac, out);
            return;
        }
        self.emit_single(port, frame, meta, mss, gateway_mac, out);
    }

    /// Writes every held frame to `out` (end of a batch).
    pub fn flush(&mut self, out: &mut TxBatch) {
        // No `release_if_not_last` first: `flush_slot` releases the frame built in
        // the batch whether or not it is still the last one, and the check compares
        // its headers (~290 instructions per batch).
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

    /// The slot whose frame is being built in the output batch, if any.
    fn in_batch(&self) -> Option<usize> {
        self.slots
            .iter()
            .position(|p| p.in_use && matches!(p.place, Place::Batch { .. }))
    }

    /// Ends the frame built in the batch if it is no longer the batch's last frame
    /// (something else was pushed after it): it is complete as it stands.
    ///
    /// Identified by position, length, destination and the header bytes merging does
    /// not change, so a batch that was cleared and refilled by others is not mistaken
    /// for it.
    ///
    /// Inlined up to the check that there is such a frame, which is all a segment
    /// arriving alone pays (twice per `push`: a call each cost ~25 instructions).
    #[inline]
    fn release_if_not_last(&mut self, out: &TxBatch) {
        if let Some(i) = self.in_batch() {
            self.release_slot_if_not_last(i, out);
        }
    }

    /// [`Self::release_if_not_last`] for slot `i`, the one built in the batch.
    #[inline(never)]
    fn release_slot_if_not_last(&mut self, i: usize, out: &TxBatch) {
        let p = &mut self.slots[i];
        let Place::Batch { index } = p.place else {
            return;
        };
        let still_last = out.len() == index + 1
            && out.frame(index).is_some_and(|(dest, f)| {
                dest == p.dest && f.len() == p.len && same_fixed_headers(f, &mut p.buf, &p.meta)
            });
        if !still_last {
            self.release(i);
        }
    }

    /// Copies the first segment into slot `i` (in the batch if no other frame is being
    /// built there, else in the slot's buffer), verifying its checksum on the way.
    /// Returns false (slot left free, nothing added to `out`) if the checksum is wrong.
    #[allow(clippy::too_many_arguments)]
    fn start(
        &mut self,
        i: usize,
        port: PortId,
        frame: &[u8],
        m: &InnerMeta,
        mss: Option<u32>,
        gateway_mac: MacAddr,
        out: &mut TxBatch,
    ) -> bool {
        self.release_if_not_last(out);
        let in_batch = self.in_batch().is_none();
        let age = self.next_age;
        // Computed once for the copy's checksum check and the frame's later ones.
        let pseudo = tcp_pseudo(m);
        let p = &mut self.slots[i];
        let end = m.ip_end;
        if in_batch {
            let index = out.len();
            let dest = TxDest::Port {
                port,
                vnet: VnetHdr::default(),
            };
            let f = out.push_unzeroed(dest, end);
            if !copy_first(f, frame, m, pseudo, gateway_mac) {
                out.pop();
                return false;
            }
            p.begin(port, frame, m, mss, age, Place::Batch { index }, pseudo);
            // The identifying copy of the headers, as `copy_first` wrote them.
            let hdrs = m.payload_off;
            p.buf[..hdrs].copy_from_slice(&frame[..hdrs]);
            p.buf[6..12].copy_from_slice(gateway_mac.as_bytes());
            let dest = p.finish_in_batch(f);
            out.set_last_dest(dest);
        } else {
            if !copy_first(&mut p.buf[..end], frame, m, pseudo, gateway_mac) {
                return false;
            }
            p.begin(port, frame, m, mss, age, Place::Buffer, pseudo);
        }
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
        if p.len + n > p.max_len {
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
    /// copy; on a bad checksum the slot (and `out`) is left as it was and false is
    /// returned.
    fn append(&mut self, i: usize, frame: &[u8], m: &InnerMeta, out: &mut TxBatch) -> bool {
        let p = &mut self.slots[i];
        let (hdrs, end) = (m.payload_off, m.ip_end);
        let (old, new) = (p.len, p.len + end - hdrs);
        let payload = &frame[hdrs..end];
        match p.place {
            Place::Batch { .. } => {
                // Still the batch's last frame (checked on entry to `push`).
                let Some(f) = out.extend_last(new - old) else {
                    return false;
                };
                let psum = checksum::copy_and_sum(&mut f[old..new], payload, 0);
                if !tcp_sum_ok(p.pseudo, &frame[m.l4_off..hdrs], psum, payload.len()) {
                    out.truncate_last(old);
                    return false;
                }
                p.advance(frame, m);
                let dest = p.finish_in_batch(f);
                out.set_last_dest(dest);
            }
            Place::Buffer => {
                let psum = checksum::copy_and_sum(&mut p.buf[old..new], payload, 0);
                if !tcp_sum_ok(p.pseudo, &frame[m.l4_off..hdrs], psum, payload.len()) {
                    return false;
                }
                p.advance(frame, m);
            }
        }
        self.stats.merged += 1;
        true
    }

    /// Ends slot `i`'s frame: one built in the batch is already there and complete;
    /// one built in the buffer is finished and copied to `out`.
    fn flush_slot(&mut self, i: usize, out: &mut TxBatch) {
        let p = &mut self.slots[i];
        if p.place == Place::Buffer {
            let vnet = p.finish().apply(&mut p.buf[..p.len]);
            p.dest = TxDest::Port { port: p.port, vnet };
            out.push_unzeroed(p.dest, p.len)
                .copy_from_slice(&p.buf[..p.len]);
        }
        self.release(i);
    }

    /// Frees slot `i`, whose frame is in the output, and counts that frame.
    fn release(&mut self, i: usize) {
        let p = &mut self.slots[i];
        p.in_use = false;
        if let TxDest::Port { vnet, .. } = p.dest {
            if vnet.is_gso() {
                self.stats.gso_frames_out += 1;
            }
        }
        self.stats.frames_out += 1;
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
        let pseudo = tcp_pseudo(m);
        let vnet = if !tcp_sum_ok(pseudo, &frame[l4..hdrs], psum, payload) {
            VnetHdr::default()
        } else {
            match mss {
                Some(gso)
                    if payload > gso as usize
                        && payload.div_ceil(gso as usize) <= MAX_SEGMENTS
                        && flags & (TCP_SYN | TCP_RST | TCP_URG) == 0 =>
                {
                    partial_checksum(buf, l4, pseudo, end - l4);
                    gso_vnet(m.l3, l4, hdrs, flags, payload, gso as usize)
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
