//! The end of a round: every frame of the engine's batch goes where the engine said
//! (an underlay queue, the underlay's tunnel tap, a guest, another worker), each
//! outcome counted.

use super::capture::{self, Dir, Point};
use super::fit::{Guest, Unfit};
use super::guests::{PortTap, TapLink};
use super::io::{Held, WorkerIo};
use super::shaper::Offer;
use super::stats::WorkerStats;
use crate::underlay::queues::{SendError, SuperError};
use dpio::guest::{GuestFault, GuestPort};
use dpio::tap::MAX_GATHER;
use dpio::xsk::TxError;
use engine::frames::tso::GuestFit;
use engine::{Engine, FrameBytes, TunnelGso, TxBatch, TxDest, VnetHdr};
use std::io::IoSlice;
use std::time::Instant;

/// Sends every frame of the batch where the engine said.
/// Frames for a port over its ingress limit are held (`shaper.rs`) rather than
/// written; `clock` is now as an instant and as the engine's nanoseconds.
pub(super) fn drain(
    out: &TxBatch,
    io: &mut WorkerIo,
    taps: &[Option<PortTap>],
    st: &mut WorkerStats,
    engine: &mut Engine,
    clock: (Instant, u64),
) {
    for (index, (dest, frame)) in out.iter().enumerate() {
        match dest {
            TxDest::Underlay { ifindex } => {
                if !io.captures.is_empty() {
                    capture_underlay_out(io, index, frame, st);
                }
                to_underlay(io, ifindex, frame, st);
            }
            TxDest::UnderlayGso { ifindex, gso } => {
                if !io.captures.is_empty() {
                    capture_underlay_out(io, index, frame, st);
                }
                to_tunnel(io, ifindex, &gso, frame, st);
            }
            TxDest::Port { port, vnet } => {
                let (tap, mtu) = match taps.get(port.0 as usize).and_then(Option::as_ref) {
                    Some(PortTap {
                        link: TapLink::Up(tap),
                        info,
                        ..
                    }) => (tap, info.config.mtu),
                    Some(_) => {
                        st.tap_tx_port_down += 1;
                        continue;
                    }
                    None => {
                        st.tap_tx_no_port += 1;
                        continue;
                    }
                };
                let held = &io.held;
                let fill = |v: &mut Vec<u8>| {
                    held.for_each_part(frame, |p| v.extend_from_slice(p));
                };
                let offer = io
                    .shaper
                    .offer(engine, port, vnet, frame.len(), fill, clock);
                let dropped = match offer {
                    // Captured as offered: written later, or dropped (counted).
                    Offer::Held => None,
                    Offer::Full => Some("rate_limited"),
                    Offer::Now => {
                        let guest = Guest { tap, port, mtu };
                        match to_guest(&guest, &vnet, frame, io, st) {
                            Ok(linearized) => {
                                st.tap_tx_frames += 1;
                                st.tap_tx_linearized += u64::from(linearized);
                                None
                            }
                            Err(e) if Unfit::is(&e) => {
                                st.vhost_tx_unfit += 1;
                                tracing::debug!(tap = tap.name(), error = %e, "frame dropped");
                                Some("vhost_tx_unfit")
                            }
                            Err(e) => match GuestFault::of(&e) {
                                GuestFault::LinkDown => {
                                    st.tap_tx_link_down += 1;
                                    Some("tap_tx_link_down")
                                }
                                GuestFault::Gone => {
                                    st.tap_tx_port_down += 1;
                                    io.gone.push((u64::from(port.0), format!("write: {e}")));
                                    Some("tap_tx_port_down")
                                }
                                GuestFault::Frame => {
                                    st.tap_tx_errors += 1;
                                    tracing::debug!(tap = tap.name(), error = %e, "tap write failed");
                                    Some("tap_tx_errors")
                                }
                            },
                        }
                    }
                };
                if !io.captures.is_empty() {
                    let held = &io.held;
                    let fill = |v: &mut Vec<u8>| {
                        held.for_each_part(frame, |p| capture::append(v, p));
                    };
                    let at = Point {
                        port,
                        dir: Dir::In,
                        underlay: false,
                    };
                    io.captures.offer(at, frame.len(), fill, dropped, st);
                }
            }
            TxDest::Sibling {
                worker,
                frame: kind,
            } => {
                let held = &io.held;
                let mut whole = true;
                io.mesh.push(
                    usize::from(worker),
                    kind,
                    frame.len(),
                    |buf| {
                        let mut at = 0;
                        whole = held.for_each_part(frame, |p| {
                            if let Some(dst) = buf.get_mut(at..at + p.len()) {
                                dst.copy_from_slice(p);
                            }
                            at += p.len();
                        });
                    },
                    st,
                );
                if !whole {
                    tracing::warn!(worker, "a frame for another worker did not resolve");
                }
            }
        }
    }
    io.captures.end_of_batch();
}

/// Copies frame number `index` of the batch, on its way to the underlay, to the
/// captures of the port whose guest frame it was made of, if any (see
/// [`crate::capture::Watch::done`]); a lent frame is read from its transmit slot.
fn capture_underlay_out(
    io: &mut WorkerIo,
    index: usize,
    frame: FrameBytes<'_>,
    st: &mut WorkerStats,
) {
    let Some(port) = io.captures.made_by(index) else {
        return;
    };
    let bytes = match frame {
        FrameBytes::Own(b) => Some(b),
        FrameBytes::Lent { frame, len } => io.queues.lent_bytes(&io.lent, frame, len),
        FrameBytes::Gather { .. } => None,
    };
    if let Some(b) = bytes {
        let at = Point {
            port,
            dir: Dir::Out,
            underlay: true,
        };
        io.captures
            .offer(at, b.len(), |v| capture::append(v, b), None, st);
    }
}

/// One frame to the underlay: a lent one is submitted, one the engine built in
/// the batch's arena is copied into a transmit slot.
fn to_underlay(io: &mut WorkerIo, ifindex: u32, frame: FrameBytes<'_>, st: &mut WorkerStats) {
    let r = match frame {
        FrameBytes::Lent { frame, len } => io.queues.submit(&mut io.lent, frame, len),
        FrameBytes::Own(bytes) => {
            st.underlay_tx_copied += 1;
            io.queues.send(ifindex, bytes)
        }
        // The engine gathers only toward guests and other workers.
        FrameBytes::Gather { .. } => Err(SendError::NotLent),
    };
    match r {
        Ok(()) => {
            st.underlay_tx_frames += 1;
            io.underlay_tx.link(ifindex).tx_frames += 1;
        }
        Err(SendError::NoSuchLink) => st.underlay_tx_no_link += 1,
        Err(SendError::Tx(TxError::Full)) => st.underlay_tx_full += 1,
        Err(SendError::Tx(_) | SendError::NotLent) => st.underlay_tx_invalid += 1,
    }
}

/// One super-frame to the underlay link's tunnel tap (`--underlay-gso`), behind
/// its tunnel vnet header. A refused write is a counted drop, never a wait: TCP
/// sends the data again.
fn to_tunnel(
    io: &mut WorkerIo,
    ifindex: u32,
    gso: &TunnelGso,
    frame: FrameBytes<'_>,
    st: &mut WorkerStats,
) {
    // The engine builds super-frames in the batch's arena.
    let FrameBytes::Own(bytes) = frame else {
        st.underlay_tx_invalid += 1;
        return;
    };
    match io
        .queues
        .send_super(ifindex, &gso.header().to_bytes(), bytes)
    {
        Ok(()) => {
            st.underlay_gso_tx_frames += 1;
            io.underlay_tx.link(ifindex).tx_super_frames += 1;
        }
        Err(SuperError::NoSuchLink) => st.underlay_tx_no_link += 1,
        Err(SuperError::Write(e)) => {
            st.underlay_gso_tx_errors += 1;
            tracing::debug!(ifindex, error = %e, "tunnel tap write failed");
        }
    }
}

/// One frame to a guest: as it is ([`to_tap`]), under a header the guest takes,
/// or made into frames it takes ([`Guest::write`]) from one copy of its pieces.
/// Returns whether the frame was copied into one buffer to be written whole.
fn to_guest(
    guest: &Guest<'_>,
    vnet: &VnetHdr,
    frame: FrameBytes<'_>,
    io: &mut WorkerIo,
    st: &mut WorkerStats,
) -> std::io::Result<bool> {
    let header = match guest.fit(vnet) {
        GuestFit::AsIs => *vnet,
        GuestFit::Header(h) => h,
        GuestFit::Remake => {
            let bytes = match frame {
                FrameBytes::Own(b) => b,
                _ => {
                    io.linear.clear();
                    if !io
                        .held
                        .for_each_part(frame, |p| io.linear.extend_from_slice(p))
                    {
                        return Err(unresolved());
                    }
                    &io.linear
                }
            };
            return guest.write(vnet, bytes, &mut io.remade, st).map(|()| false);
        }
    };
    to_tap(
        guest.tap,
        &header.to_bytes(),
        frame,
        &io.held,
        &mut io.linear,
    )
}

/// Parts one gathered tap write starts with room for; a frame of more pieces (a
/// coalesced frame of many segments) takes the [`MAX_GATHER`] path.
const FEW_PARTS: usize = 16;

/// One frame to a tap, its vnet header first: one gathering `writev` of its
/// pieces, or of one copy of them when there are more than a `writev` takes.
/// Returns whether the frame was copied.
fn to_tap(
    tap: &GuestPort,
    hdr: &[u8],
    frame: FrameBytes<'_>,
    held: &Held,
    linear: &mut Vec<u8>,
) -> std::io::Result<bool> {
    if let Some(r) = write_gathered::<FEW_PARTS>(tap, hdr, frame, held) {
        return r.map(|()| false);
    }
    if let Some(r) = write_gathered::<MAX_GATHER>(tap, hdr, frame, held) {
        return r.map(|()| false);
    }
    linear.clear();
    if !held.for_each_part(frame, |p| linear.extend_from_slice(p)) {
        return Err(unresolved());
    }
    tap.write_gather(&[IoSlice::new(hdr), IoSlice::new(linear)])
        .map(|()| true)
}

/// [`GuestPort::write_gather`] of the header and the frame's pieces, or `None` when
/// they are more than `N` (so the array stays small for the common frame).
fn write_gathered<const N: usize>(
    tap: &GuestPort,
    hdr: &[u8],
    frame: FrameBytes<'_>,
    held: &Held,
) -> Option<std::io::Result<()>> {
    let mut iov = [IoSlice::new(&[]); N];
    iov[0] = IoSlice::new(hdr);
    let mut n = 1;
    let whole = held.for_each_part(frame, |p| {
        if let Some(slot) = iov.get_mut(n) {
            *slot = IoSlice::new(p);
        }
        n += 1;
    });
    if !whole {
        return Some(Err(unresolved()));
    }
    (n <= N).then(|| tap.write_gather(&iov[..n]))
}

fn unresolved() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        "a frame refers to bytes outside its input",
    )
}
