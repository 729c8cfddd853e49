//! The engine's output: the frames one batch produced, each with where it goes.
//!
//! The engine never owns a socket or a tap. It writes frames into memory it is handed
//! and says where each goes ([`TxDest`]); the worker moves them. A frame's bytes live
//! in one of three places, chosen so that no payload byte is copied twice:
//!
//! - **lent**: space the I/O layer lends for underlay frames ([`FrameSpace`]) — the
//!   AF_XDP UMEM chunks the kernel transmits from. Encapsulation and tunneled TSO write
//!   each frame there directly, and the worker only submits it.
//! - **gathered**: a few bytes the engine synthesized (a rewritten Ethernet header, a
//!   merged TCP/IP header) followed by references ([`InputRef`]) to bytes of frames it
//!   received this batch. Decapsulated frames and coalesced GSO frames reach the tap
//!   by one `writev` straight from the receive buffers; the worker keeps those buffers
//!   until the batch is drained.
//! - **own**: the batch's own arena, for everything else (gateway replies, same-sled
//!   delivery, and any frame when no space is lent, as in tests).
//!
//! Capacity is kept across [`TxBatch::clear`], so once warm the fast path does not
//! allocate.

use crate::frames::input::{InputRef, RxFrame};
use crate::ids::{PortId, Vni};

/// Received frames up to this long are copied rather than referred to
/// ([`TxBatch::push_received`]).
const COPY_MAX: usize = 256;

use core::ops::Range;
use wire::vnet::{TunnelVnetHdr, VnetHdr};

/// Where a frame goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxDest {
    /// Out of the underlay interface with this index (outer headers are in the frame).
    Underlay { ifindex: u32 },
    /// Out of the underlay interface with this index as one UDP-tunnel GSO
    /// super-frame, which the kernel cuts into wire frames (`tso::super_frames`);
    /// only when the engine is configured for it (`EngineConfig::underlay_tunnel_gso`).
    UnderlayGso { ifindex: u32, gso: TunnelGso },
    /// To a guest port, with the offload metadata to hand the guest.
    Port { port: PortId, vnet: VnetHdr },
    /// To another worker of this sled, which owns the port the frame is for.
    Sibling { worker: u16, frame: SiblingFrame },
}

/// The offload metadata of an underlay super-frame: the fields of its
/// `virtio_net_hdr_v1_hash_tunnel` that vary, in 10 bytes so that [`TxDest`] stays
/// as small as its guest variant. The outer UDP header is always at 54 (Ethernet and
/// IPv6 without extension headers) and the inner checksum is TCP's, at 16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TunnelGso {
    pub flags: u8,
    pub gso_type: u8,
    /// Every header, outer and inner.
    pub hdr_len: u16,
    /// Payload bytes per wire frame (the inner MSS).
    pub gso_size: u16,
    /// Offset of the inner TCP header.
    pub csum_start: u16,
    /// Offset of the inner IP header.
    pub inner_nh: u16,
}

impl TunnelGso {
    /// Offset of the outer UDP header: outer Ethernet + IPv6.
    pub const OUTER_TH: u16 = 54;

    /// The header the kernel takes in front of the frame.
    pub fn header(&self) -> TunnelVnetHdr {
        TunnelVnetHdr {
            vnet: VnetHdr {
                flags: self.flags,
                gso_type: self.gso_type,
                hdr_len: self.hdr_len,
                gso_size: self.gso_size,
                csum_start: self.csum_start,
                csum_offset: 16,
            },
            outer_th: Self::OUTER_TH,
            inner_nh: self.inner_nh,
        }
    }
}

/// What a frame handed to another worker is, so the owner knows how to take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SiblingFrame {
    /// A guest frame from a port of this worker to a port of the owner in VPC `vni`
    /// (`Engine::process_sibling`); `vnet` is the sending guest's offload metadata.
    Guest { vni: Vni, vnet: VnetHdr },
    /// An underlay frame received here for a port of the owner
    /// (`Engine::process_underlay` on the owner).
    Underlay,
}

/// A frame the I/O layer lent space for; the number means something to it only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LentFrame(pub u32);

/// Space lent by the I/O layer for frames it will transmit itself, so that the engine
/// writes them where they leave from. The engine stays pure: it only writes into the
/// memory it is handed.
pub trait FrameSpace {
    /// Space for one frame of `len` bytes to `dest` — a slice of at least `len`
    /// bytes, which the batch relies on — or `None` when this destination has no lent
    /// space or none is free (the batch then builds the frame in its own arena, and
    /// the worker copies it).
    fn lend(&mut self, dest: &TxDest, len: usize) -> Option<(LentFrame, &mut [u8])>;
    /// Takes back space lent for a frame that was not finished.
    fn give_back(&mut self, frame: LentFrame);
}

/// A range of the arena or of the reference list, in 32 bits: a batch holds far
/// less than 4 GiB, and the smaller frame records are cheaper to push.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    start: u32,
    end: u32,
}

impl Span {
    fn new(r: Range<usize>) -> Span {
        Span {
            start: r.start as u32,
            end: r.end as u32,
        }
    }

    fn range(self) -> Range<usize> {
        self.start as usize..self.end as usize
    }
}

/// Where one frame's bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Body {
    Own(Span),
    Lent { frame: LentFrame, len: u32 },
    Gather { head: Span, refs: Span },
}

/// One frame of a batch, as the worker drains it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameBytes<'b> {
    /// All bytes in the batch's arena.
    Own(&'b [u8]),
    /// In lent space: the frame's first `len` bytes.
    Lent { frame: LentFrame, len: usize },
    /// `head` followed by the referenced input bytes, in order.
    Gather {
        head: &'b [u8],
        refs: &'b [InputRef],
    },
}

impl FrameBytes<'_> {
    /// The frame's length in bytes.
    pub fn len(&self) -> usize {
        match self {
            FrameBytes::Own(b) => b.len(),
            FrameBytes::Lent { len, .. } => *len,
            FrameBytes::Gather { head, refs } => {
                head.len() + refs.iter().map(|r| r.len as usize).sum::<usize>()
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `len` bytes at the end of the arena `buf`, whose first `used` bytes are taken.
#[inline]
fn alloc(buf: &mut Vec<u8>, used: &mut usize, len: usize) -> Range<usize> {
    let start = *used;
    let end = start + len;
    if buf.len() < end {
        buf.resize(end, 0);
    }
    *used = end;
    start..end
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct TxFrame {
    dest: TxDest,
    body: Body,
}

/// Frames produced by one or more `process_*` calls.
///
/// `buf` only grows: `clear` resets `used`, so the bytes of earlier batches stay
/// initialized and [`TxBatch::push_unzeroed`] can hand them out without a memset (the
/// TSO path writes every byte of its frames, and zeroing 64 KiB first would be a third
/// pass over the data).
///
/// `'s` is the borrow of the lent [`FrameSpace`] (`Send`, so that a worker's state
/// can move to its thread); a batch without one is
/// `TxBatch<'static>`. A worker moves its reusable batch in and out of a lending
/// one with [`TxBatch::lending`] and [`TxBatch::unlend`], which move the buffers
/// without copying them.
#[derive(Default)]
pub struct TxBatch<'s> {
    buf: Vec<u8>,
    used: usize,
    frames: Vec<TxFrame>,
    refs: Vec<InputRef>,
    space: Option<&'s mut (dyn FrameSpace + Send)>,
}

impl core::fmt::Debug for TxBatch<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TxBatch")
            .field("frames", &self.frames)
            .field("lending", &self.space.is_some())
            .finish()
    }
}

impl TxBatch<'static> {
    pub fn new() -> Self {
        Self::default()
    }
}

impl<'s> TxBatch<'s> {
    /// This batch's buffers, now writing underlay frames into `space`.
    pub fn lending<'t>(self, space: &'t mut (dyn FrameSpace + Send)) -> TxBatch<'t> {
        TxBatch {
            buf: self.buf,
            used: self.used,
            frames: self.frames,
            refs: self.refs,
            space: Some(space),
        }
    }

    /// The batch without its lender, frames kept: lent frames stay recorded by their
    /// [`LentFrame`], and the worker must submit or give back every one of them.
    pub fn unlend(self) -> TxBatch<'static> {
        TxBatch {
            buf: self.buf,
            used: self.used,
            frames: self.frames,
            refs: self.refs,
            space: None,
        }
    }

    /// Forgets all frames, keeping the capacity. Lent frames must have been submitted
    /// or given back by the worker (see [`TxBatch::unlend`]).
    pub fn clear(&mut self) {
        self.used = 0;
        self.frames.clear();
        self.refs.clear();
    }

    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Appends a zeroed frame of `len` bytes and returns it for the caller to fill.
    pub fn push(&mut self, dest: TxDest, len: usize) -> &mut [u8] {
        let frame = self.push_unzeroed(dest, len);
        frame.fill(0);
        frame
    }

    /// Appends a frame of `len` bytes whose contents are unspecified (left over from
    /// earlier frames): for emitters that write every byte. Underlay frames go to
    /// lent space when there is any.
    #[inline]
    pub fn push_unzeroed(&mut self, dest: TxDest, len: usize) -> &mut [u8] {
        if let Some(space) = self.space.as_deref_mut() {
            if let Some((frame, bytes)) = space.lend(&dest, len) {
                self.frames.push(TxFrame {
                    dest,
                    body: Body::Lent {
                        frame,
                        len: len as u32,
                    },
                });
                // `lend` hands out at least `len` bytes (its contract).
                return &mut bytes[..len];
            }
        }
        // By field rather than through a `&mut self` method: the lent branch above
        // returns a borrow of `space` alone, which leaves these fields free.
        let range = alloc(&mut self.buf, &mut self.used, len);
        self.frames.push(TxFrame {
            dest,
            body: Body::Own(Span::new(range.clone())),
        });
        &mut self.buf[range]
    }

    /// Appends received frame `frame`: its first `head_len` bytes (which must lie
    /// in its head) copied and returned for the caller to rewrite, the rest
    /// referred to — or, for a short frame in one piece or one whose input is not
    /// kept ([`RxFrame::TRANSIENT`]), all of it copied (a copy of an ACK costs less
    /// than a reference, and the guest gets it in one piece).
    pub fn push_received(
        &mut self,
        dest: TxDest,
        frame: &RxFrame<'_>,
        head_len: usize,
    ) -> &mut [u8] {
        let len = frame.len();
        let copy =
            (len <= COPY_MAX && frame.is_contiguous()) || frame.input() == RxFrame::TRANSIENT;
        if copy {
            let buf = self.push_unzeroed(dest, len);
            frame.copy_into(buf);
            return &mut buf[..head_len];
        }
        let h = self.push_gather_head(dest, head_len, &[frame.input_ref(head_len..len)]);
        h.copy_from_slice(&frame.head()[..head_len]);
        h
    }

    /// Appends a frame made of `head` (copied) followed by the referenced input bytes.
    pub fn push_gather(&mut self, dest: TxDest, head: &[u8], refs: &[InputRef]) {
        self.push_gather_head(dest, head.len(), refs)
            .copy_from_slice(head);
    }

    /// Appends a frame made of `head_len` bytes, returned for the caller to write
    /// (unspecified until then), followed by the referenced input bytes.
    #[inline]
    pub fn push_gather_head(
        &mut self,
        dest: TxDest,
        head_len: usize,
        refs: &[InputRef],
    ) -> &mut [u8] {
        let head = alloc(&mut self.buf, &mut self.used, head_len);
        let first = self.refs.len();
        // Most frames refer to one piece of input: a push, not a slice copy.
        match refs {
            [one] => self.refs.push(*one),
            _ => self.refs.extend_from_slice(refs),
        }
        self.frames.push(TxFrame {
            dest,
            body: Body::Gather {
                head: Span::new(head.clone()),
                refs: Span::new(first..self.refs.len()),
            },
        });
        &mut self.buf[head]
    }

    /// Removes the most recently pushed frame (an emitter that found it cannot
    /// finish); lent space goes back to the lender.
    pub fn pop(&mut self) {
        let Some(f) = self.frames.pop() else {
            return;
        };
        match f.body {
            Body::Own(r) => self.used = r.start as usize,
            Body::Gather { head, refs } => {
                self.used = head.start as usize;
                self.refs.truncate(refs.start as usize);
            }
            Body::Lent { frame, .. } => {
                if let Some(space) = self.space.as_deref_mut() {
                    space.give_back(frame);
                }
            }
        }
    }

    /// Every frame in order, with where it goes.
    pub fn iter(&self) -> impl Iterator<Item = (TxDest, FrameBytes<'_>)> + use<'_, 's> {
        self.frames.iter().map(|f| (f.dest, self.bytes(&f.body)))
    }

    fn bytes(&self, body: &Body) -> FrameBytes<'_> {
        match body {
            Body::Own(r) => FrameBytes::Own(&self.buf[r.range()]),
            Body::Lent { frame, len } => FrameBytes::Lent {
                frame: *frame,
                len: *len as usize,
            },
            Body::Gather { head, refs } => FrameBytes::Gather {
                head: &self.buf[head.range()],
                refs: &self.refs[refs.range()],
            },
        }
    }

    /// Frame `i` when its bytes are in the batch's arena (always so without lent
    /// space and without gathered input).
    pub fn frame(&self, i: usize) -> Option<(TxDest, &[u8])> {
        let f = self.frames.get(i)?;
        match self.bytes(&f.body) {
            FrameBytes::Own(b) => Some((f.dest, b)),
            _ => None,
        }
    }

    /// Frame `i` as one buffer, gathered input resolved by `input` (which gives the
    /// bytes of input `n` as one slice); `None` for lent frames and references
    /// outside their input. For tests, inspection and the rare path that must copy.
    pub fn frame_bytes<'i>(
        &self,
        i: usize,
        input: impl Fn(u32) -> Option<&'i [u8]>,
    ) -> Option<(TxDest, Vec<u8>)> {
        let f = self.frames.get(i)?;
        let bytes = match self.bytes(&f.body) {
            FrameBytes::Own(b) => b.to_vec(),
            FrameBytes::Lent { .. } => return None,
            FrameBytes::Gather { head, refs } => {
                let mut v = head.to_vec();
                for r in refs {
                    let start = r.start as usize;
                    v.extend_from_slice(input(r.input)?.get(start..start + r.len as usize)?);
                }
                v
            }
        };
        Some((f.dest, bytes))
    }
}

impl TxBatch<'_> {
    /// Every frame as one buffer, gathered input resolved against `inputs` (input `n`
    /// is `inputs[n]`); `None` if a frame is in lent space or refers outside its
    /// input. For tests and inspection.
    pub fn to_vecs(&self, inputs: &[&[u8]]) -> Option<Vec<(TxDest, Vec<u8>)>> {
        (0..self.len())
            .map(|i| self.frame_bytes(i, |n| inputs.get(n as usize).copied()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UL: TxDest = TxDest::Underlay { ifindex: 3 };

    /// The super-frame variant makes no destination larger than a sibling's
    /// guest frame (worker, VNI and virtio-net header) already is.
    #[test]
    fn a_super_frame_destination_is_no_larger_than_a_siblings() {
        let sibling = core::mem::size_of::<(u16, Vni, VnetHdr)>();
        assert_eq!(core::mem::size_of::<TunnelGso>(), 10);
        assert!(core::mem::size_of::<TxDest>() <= sibling + 4, "{sibling}");
    }

    #[test]
    fn push_and_pop() {
        let mut b = TxBatch::new();
        b.push(UL, 10).copy_from_slice(&[7; 10]);
        b.push(UL, 4).copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(b.frame(1).unwrap().1, &[1, 2, 3, 4]);
        b.pop();
        assert_eq!(b.len(), 1);
        assert_eq!(b.frame(0).unwrap().1, &[7; 10]);
        b.clear();
        assert!(b.is_empty());
    }

    #[test]
    fn reuse_after_clear_zeroes_only_when_asked() {
        let mut b = TxBatch::new();
        b.push(UL, 8).copy_from_slice(&[9; 8]);
        b.clear();
        assert_eq!(b.push_unzeroed(UL, 4), &[9; 4]);
        assert_eq!(b.push(UL, 4), &[0; 4]);
        assert_eq!(b.push(UL, 16), &[0; 16]);
        assert_eq!(b.len(), 3);
    }

    #[test]
    fn gathered_frames_resolve_against_their_inputs() {
        let inputs: [&[u8]; 2] = [b"abcdefgh", b"0123456789"];
        let port = TxDest::Port {
            port: PortId(1),
            vnet: VnetHdr::default(),
        };
        let mut b = TxBatch::new();
        let refs = [
            InputRef {
                input: 1,
                start: 2,
                len: 3,
            },
            InputRef {
                input: 0,
                start: 6,
                len: 2,
            },
        ];
        b.push_gather(port, b"HD", &refs);
        assert!(b.frame(0).is_none(), "not contiguous");
        let (dest, bytes) = b
            .frame_bytes(0, |i| inputs.get(i as usize).copied())
            .unwrap();
        assert_eq!((dest, &bytes[..]), (port, &b"HD234gh"[..]));
        let (_, f) = b.iter().next().unwrap();
        assert_eq!(f.len(), 7);
        // A reference beyond its input does not resolve.
        b.push_gather(
            port,
            b"",
            &[InputRef {
                input: 0,
                start: 7,
                len: 2,
            }],
        );
        assert!(b
            .frame_bytes(1, |i| inputs.get(i as usize).copied())
            .is_none());
        b.pop();
        b.pop();
        assert!(b.is_empty());
        assert!(b.refs.is_empty() && b.used == 0);
    }

    /// A lender with two 16-byte slots, recording what comes back.
    #[derive(Default)]
    struct Slots {
        mem: [[u8; 16]; 2],
        free: Vec<u32>,
        given_back: Vec<u32>,
    }

    impl FrameSpace for Slots {
        fn lend(&mut self, dest: &TxDest, len: usize) -> Option<(LentFrame, &mut [u8])> {
            if !matches!(dest, TxDest::Underlay { .. }) || len > 16 {
                return None;
            }
            let i = self.free.pop()?;
            Some((LentFrame(i), &mut self.mem[i as usize][..]))
        }
        fn give_back(&mut self, frame: LentFrame) {
            self.given_back.push(frame.0);
            self.free.push(frame.0);
        }
    }

    #[test]
    fn underlay_frames_go_to_lent_space_until_it_runs_out() {
        let mut slots = Slots {
            free: vec![0, 1],
            ..Slots::default()
        };
        let port = TxDest::Port {
            port: PortId(2),
            vnet: VnetHdr::default(),
        };
        {
            let mut b = TxBatch::new().lending(&mut slots);
            b.push_unzeroed(UL, 5).copy_from_slice(b"hello");
            b.push(port, 3).copy_from_slice(b"own");
            b.push(UL, 20); // longer than a slot: own arena
            b.push(UL, 2).copy_from_slice(b"hi");
            b.push(UL, 1); // no slot left
            b.pop(); // own frame: nothing to give back
            let kinds: Vec<_> = b
                .iter()
                .map(|(_, f)| match f {
                    FrameBytes::Own(x) => format!("own{}", x.len()),
                    FrameBytes::Lent { frame, len } => format!("lent{}:{len}", frame.0),
                    FrameBytes::Gather { .. } => "gather".into(),
                })
                .collect();
            assert_eq!(kinds, ["lent1:5", "own3", "own20", "lent0:2"]);
            b.pop(); // lent frame: given back
            let b = b.unlend();
            assert_eq!(b.len(), 3);
        }
        assert_eq!(&slots.mem[1][..5], b"hello");
        assert_eq!(slots.given_back, [0]);
    }
}
