//! TCP connection tracking: the state machine (on the flags, from the guest's point of
//! view, which chooses the idle timeout) and the sequence-space check (which refuses
//! segments no endpoint of the connection could have sent).
//!
//! Why the sequence check: without it, anyone who can reach the underlay and knows a
//! connection's addresses and ports can reset it or inject data into it. Each side's
//! acknowledgement and window say which sequence numbers it accepts; a segment outside
//! them is dropped (`tcp_out_of_window`) before it reaches the guest or changes any
//! state, so a blind attacker has to guess a window in 2^32 instead of nothing.
//!
//! What is tracked per side (as in Linux conntrack and OPTE's `tcp_state`, with our
//! own choices): what it acknowledged last (`ack`), the right edge of the window it
//! offered (`right`, never moving back), the largest window it offered (`max_win`),
//! and the end of its SYN. A segment from S to R is acceptable when
//!
//! - its sequence range overlaps `[R.ack - R.max_win, R.right]`: data below lies more
//!   than a whole window in the past (a retransmission of data already acknowledged
//!   passes, so that a lost ACK can be repeated), data above was never offered room.
//!   A zero-length segment (a pure ACK, a window probe at the right edge) must lie in
//!   that range;
//! - an RST's sequence number lies in `[R.ack, R.right]`, the receiver's current window
//!   (RFC 793; an endpoint that lost its state answers with the sequence number the
//!   other side acknowledged, which is the left edge);
//! - a SYN|ACK acknowledges R's SYN (within a window of its end), so that a blind
//!   SYN|ACK cannot complete the guest's handshake or set the numbers.
//!
//! Only segments found acceptable move the numbers, so a forged segment cannot shift
//! the window the real ones are checked against. Acknowledgement numbers are otherwise
//! not checked: the per-packet cost stays a few compares, and a segment that passes
//! the sequence check already knew the window.
//!
//! A side whose numbers are not known yet (it has sent no ACK) does not restrict the
//! other: a connection picked up mid-stream starts unchecked and becomes checked as
//! soon as both sides have spoken. SYNs carry a fresh initial sequence number, so
//! their sequence number is not checked; a SYN that reopens a closed connection (port
//! reuse after TIME-WAIT) starts the tracking over. Windows are scaled by the shift
//! each side announced in its SYN when both announced one (RFC 7323); for a
//! connection whose SYNs were not seen the largest shift (14) is assumed, which keeps
//! legitimate traffic flowing at the price of a wider window.

use crate::drop::DropReason;

use crate::machinery::rule::Direction;
use serde::{Deserialize, Serialize};
use wire::meta::InnerMeta;

pub(crate) const FIN: u8 = 0x01;
pub(crate) const SYN: u8 = 0x02;
pub(crate) const RST: u8 = 0x04;
pub(crate) const ACK: u8 = 0x10;

/// TCP option kinds read from SYNs.
const OPT_END: u8 = 0;
const OPT_NOP: u8 = 1;
const OPT_WSCALE: u8 = 3;
/// Largest window shift RFC 7323 allows; larger announcements are taken as 14.
const MAX_WSCALE: u8 = 14;
/// The largest window a side can offer: a 16-bit field shifted by the largest
/// scale. A larger one, which no segment could have set, would let every sequence
/// number through.
const MAX_WINDOW: u32 = 0xffff << MAX_WSCALE;
/// Smallest lag an acknowledgement may have behind what it acknowledges, whatever
/// window the acknowledging side offered (an unscaled 16-bit window).
const MIN_ACK_LAG: u32 = 65535;
/// [`Side::ws`] of a side whose SYN carried no window-scale option.
const WS_NONE: u8 = 0xfe;
/// [`Side::ws`] of a side whose SYN was not seen.
const WS_UNSEEN: u8 = 0xff;

/// What tracking reads from a TCP segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpSegment {
    pub flags: u8,
    pub seq: u32,
    pub ack: u32,
    /// The window field as sent (before scaling).
    pub win: u16,
    /// Sequence space the segment occupies: its payload, plus one each for SYN and FIN.
    pub len: u32,
    /// A SYN's window-scale option.
    pub wscale: Option<u8>,
}

impl TcpSegment {
    /// The segment of a parsed frame whose L4 header lies in `head` (the parser
    /// guarantees that for every TCP packet but non-first fragments). `None` for
    /// other protocols and for TCP without a header (a non-first fragment): such a
    /// packet carries no sequence numbers to check. For a GSO buffer, `len` covers the
    /// whole buffer, which is what the guest sent.
    #[inline]
    pub fn read(m: &InnerMeta, head: &[u8]) -> Option<TcpSegment> {
        if m.proto != crate::machinery::flow::PROTO_TCP || m.payload_off < m.l4_off + 20 {
            return None;
        }
        let h = head.get(m.l4_off..m.l4_off + 20)?;
        let word = |i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let flags = h[13];
        let data = m.ip_end.saturating_sub(m.payload_off) as u32;
        let wscale = if flags & SYN != 0 {
            head.get(m.l4_off + 20..m.payload_off)
                .and_then(window_scale)
        } else {
            None
        };
        Some(TcpSegment {
            flags,
            seq: word(4),
            ack: word(8),
            win: u16::from_be_bytes([h[14], h[15]]),
            len: data + u32::from(flags & SYN != 0) + u32::from(flags & FIN != 0),
            wscale,
        })
    }

    fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

/// The window-scale option among a SYN's TCP options, if there is one.
fn window_scale(mut opts: &[u8]) -> Option<u8> {
    while let Some((&kind, rest)) = opts.split_first() {
        match kind {
            OPT_END => return None,
            OPT_NOP => opts = rest,
            _ => {
                let len = usize::from(*rest.first()?);
                if kind == OPT_WSCALE && len == 3 {
                    return rest.get(1).map(|&s| s.min(MAX_WSCALE));
                }
                opts = opts.get(len.max(2)..)?;
            }
        }
    }
    None
}

/// `a` comes before `b` in sequence space (modulo 2^32, RFC 1982).
fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// `x` lies in `[lo, hi]` in sequence space.
fn within(x: u32, lo: u32, hi: u32) -> bool {
    x.wrapping_sub(lo) <= hi.wrapping_sub(lo)
}

/// TCP connection state, seen from the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TcpState {
    Closed,
    /// The guest sent a SYN.
    SynSent,
    /// The guest received a SYN.
    SynRcvd,
    /// ...and answered it with SYN|ACK; the peer's ACK completes the handshake.
    SynAckSent,
    Established,
    /// The guest sent the first FIN.
    FinWait1,
    /// ...and the peer acknowledged something after it.
    FinWait2,
    /// The peer sent the first FIN.
    CloseWait,
    /// ...and the guest sent its FIN.
    LastAck,
    /// Both sides sent FIN.
    TimeWait,
}

impl TcpState {
    /// The state after a segment with `flags` going `dir`. Inlined with
    /// `ConnTable::track_handle`: called out of line, it made every hit save
    /// registers for a branch that data segments never take.
    #[inline(always)]
    pub fn next(self, dir: Direction, flags: u8) -> TcpState {
        use Direction::{In, Out};
        use TcpState::*;
        let syn = flags & SYN != 0;
        let ack = flags & ACK != 0;
        let fin = flags & FIN != 0;
        if flags & RST != 0 {
            return Closed;
        }
        match (self, dir) {
            (Closed | TimeWait, Out) if syn && !ack => SynSent,
            (Closed | TimeWait, In) if syn && !ack => SynRcvd,
            (SynSent, In) if syn && ack => Established,
            // Simultaneous open.
            (SynSent, In) if syn => SynRcvd,
            // Only the side that did not send the SYN (the guest) moves a passive
            // open on, and only the peer's ACK of that completes it: a remote peer
            // cannot establish a connection with its own ACK.
            (SynRcvd, Out) if ack => SynAckSent,
            (SynAckSent, In) if ack => Established,
            (Established, Out) if fin => FinWait1,
            (Established, In) if fin => CloseWait,
            (FinWait1 | FinWait2, In) if fin => TimeWait,
            (FinWait1, In) if ack => FinWait2,
            (CloseWait, Out) if fin => LastAck,
            (LastAck, In) if ack => Closed,
            (s, _) => s,
        }
    }

    /// Half-open: the first to go when the table is full.
    pub(super) fn incipient(self) -> bool {
        matches!(
            self,
            TcpState::SynSent | TcpState::SynRcvd | TcpState::SynAckSent
        )
    }

    /// Closed: the next to go.
    pub(super) fn closed(self) -> bool {
        matches!(self, TcpState::Closed | TcpState::TimeWait)
    }
}

/// One side's position in sequence space (see the module doc). Carried whole when
/// a port moves to another sled (`ConnRecord`), so the new sled checks the next
/// segment against the same window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Side {
    /// End of its SYN (sequence number + length), valid once `syn_seen`: what a
    /// SYN|ACK answering it must acknowledge.
    syn_end: u32,
    /// What it acknowledged last, valid once `acked`.
    ack: u32,
    /// Right edge of the window it offered: the largest `ack + window` seen.
    right: u32,
    /// Largest window it offered (scaled).
    max_win: u32,
    /// Window-scale option of its SYN, [`WS_NONE`] or [`WS_UNSEEN`].
    ws: u8,
    /// Shift applied to the window field of its segments other than SYNs.
    shift: u8,
    syn_seen: bool,
    acked: bool,
}

impl Default for Side {
    fn default() -> Self {
        Side {
            syn_end: 0,
            ack: 0,
            right: 0,
            max_win: 0,
            ws: WS_UNSEEN,
            shift: MAX_WSCALE,
            syn_seen: false,
            acked: false,
        }
    }
}

impl Side {
    /// Whether a segment `s` sent to this side falls in its window (inlined with
    /// `ConnTable::track_handle`).
    #[inline(always)]
    fn accepts_seq(&self, s: &TcpSegment) -> bool {
        if !self.acked {
            return true;
        }
        if s.has(RST) {
            return within(s.seq, self.ack, self.right);
        }
        let lo = self.ack.wrapping_sub(self.max_win);
        !before(self.right, s.seq) && !before(s.seq.wrapping_add(s.len), lo)
    }

    /// Whether a SYN|ACK `s` sent to this side acknowledges this side's SYN, at most
    /// a window behind its end (its data, with TCP Fast Open, may go unacknowledged).
    fn acks_syn(&self, sender: &Side, s: &TcpSegment) -> bool {
        if !self.syn_seen || !s.has(ACK) {
            return true;
        }
        let lag = sender.max_win.max(MIN_ACK_LAG);
        within(s.ack, self.syn_end.wrapping_sub(lag), self.syn_end)
    }

    /// Takes in the acknowledgement and window of a segment this side sent (already
    /// found acceptable; inlined with `ConnTable::track_handle`).
    #[inline(always)]
    fn sent(&mut self, s: &TcpSegment) {
        if !s.has(ACK) {
            return;
        }
        // The window field of a SYN is never scaled.
        let shift = if s.has(SYN) { 0 } else { self.shift };
        let win = u32::from(s.win) << shift;
        let right = s.ack.wrapping_add(win);
        if !self.acked || before(self.ack, s.ack) {
            self.ack = s.ack;
        }
        if !self.acked || before(self.right, right) {
            self.right = right;
        }
        self.max_win = self.max_win.max(win);
        self.acked = true;
    }
}

/// The shift that applies to the windows of a side that announced `own` when the
/// other announced `other` (RFC 7323: scaling is on only if both SYNs carry the
/// option; unknown when a SYN was not seen, then the largest).
fn shift(own: u8, other: u8) -> u8 {
    match (own, other) {
        (WS_UNSEEN, _) | (_, WS_UNSEEN) => MAX_WSCALE,
        (WS_NONE, _) | (_, WS_NONE) => 0,
        (s, _) => s,
    }
}

/// A tracked TCP connection: its state and both sides' sequence numbers. In a
/// port's export it reads as [`TcpRecord`] (the sides named), and a record is
/// checked on the way in: a window shift or scale no SYN could have set is
/// refused, so an imported connection is one tracking could have reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "TcpRecord", into = "TcpRecord")]
pub struct TcpConn {
    pub(super) state: TcpState,
    /// Indexed by the direction the side sends in: the guest is `Out`, the peer `In`.
    sides: [Side; 2],
}

fn idx(dir: Direction) -> usize {
    match dir {
        Direction::Out => 0,
        Direction::In => 1,
    }
}

/// [`TcpConn`] as a port's export writes it.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TcpRecord {
    state: TcpState,
    /// The guest's side (what it sent, acknowledged and offered).
    guest: Side,
    /// The remote peer's side.
    peer: Side,
}

impl From<TcpConn> for TcpRecord {
    fn from(c: TcpConn) -> TcpRecord {
        TcpRecord {
            state: c.state,
            guest: c.sides[idx(Direction::Out)],
            peer: c.sides[idx(Direction::In)],
        }
    }
}

impl TryFrom<TcpRecord> for TcpConn {
    type Error = String;

    fn try_from(r: TcpRecord) -> Result<TcpConn, String> {
        for (name, side) in [("guest", &r.guest), ("peer", &r.peer)] {
            if side.shift > MAX_WSCALE {
                return Err(format!(
                    "{name} side's window shift {} is above {MAX_WSCALE}",
                    side.shift
                ));
            }
            if side.max_win > MAX_WINDOW {
                return Err(format!(
                    "{name} side's window {} is above the largest a TCP header can offer ({MAX_WINDOW})",
                    side.max_win
                ));
            }
            if side.ws > MAX_WSCALE && side.ws != WS_NONE && side.ws != WS_UNSEEN {
                return Err(format!(
                    "{name} side's window scale {} is neither 0..={MAX_WSCALE}, {WS_NONE} (none) nor {WS_UNSEEN} (unseen)",
                    side.ws
                ));
            }
        }
        Ok(TcpConn {
            state: r.state,
            sides: [r.guest, r.peer],
        })
    }
}

impl TcpConn {
    /// The connection a first segment `s` going `dir` opens: from `Closed` with a SYN;
    /// a segment without one (a flow already under way, e.g. after a daemon restart)
    /// is picked up as established, as is a packet without a TCP header.
    pub(super) fn open(dir: Direction, s: Option<TcpSegment>) -> TcpConn {
        let syn = s.is_some_and(|s| s.has(SYN));
        let mut c = TcpConn {
            state: if syn {
                TcpState::Closed
            } else {
                TcpState::Established
            },
            sides: [Side::default(); 2],
        };
        if let Some(s) = s {
            c.take(dir, &s);
        }
        c
    }

    /// Whether `s` opens this closed connection again: a SYN (not a SYN-ACK) on
    /// the same addresses and ports, as a client reusing its port after TIME-WAIT
    /// sends. The connection then starts over in place.
    pub(super) fn reopened_by(&self, s: &TcpSegment) -> bool {
        s.has(SYN) && !s.has(ACK) && self.state.closed()
    }

    /// Tracks segment `s` going `dir`; refuses it (`tcp_out_of_window`), changing
    /// nothing, if it lies outside what the receiving side accepts (see the module
    /// doc).
    ///
    /// `s` is taken by value: a reference would make the caller keep the segment in
    /// memory, which cost a dozen stores and loads per packet. Inlined with
    /// `ConnTable::track_handle`.
    #[inline(always)]
    pub(super) fn track(&mut self, dir: Direction, s: TcpSegment) -> Result<(), DropReason> {
        if s.has(SYN) {
            return self.track_syn(dir, &s);
        }
        let (tx, rx) = (idx(dir), 1 - idx(dir));
        if !self.sides[rx].accepts_seq(&s) {
            return Err(DropReason::TcpOutOfWindow);
        }
        // Data and ACKs of an established connection leave its state as it is.
        if self.state != TcpState::Established || s.has(FIN | RST) {
            self.state = self.state.next(dir, s.flags);
        }
        self.sides[tx].sent(&s);
        Ok(())
    }

    /// [`TcpConn::track`] of a SYN, which carries a fresh initial sequence number (so
    /// only its acknowledgement is checked) and the sender's window scaling. A SYN
    /// that reopens a closed connection starts its numbers over.
    #[cold]
    fn track_syn(&mut self, dir: Direction, s: &TcpSegment) -> Result<(), DropReason> {
        if self.reopened_by(s) {
            self.sides = [Side::default(); 2];
        }
        let (tx, rx) = (idx(dir), 1 - idx(dir));
        if !self.sides[rx].acks_syn(&self.sides[tx], s) {
            return Err(DropReason::TcpOutOfWindow);
        }
        self.take(dir, s);
        Ok(())
    }

    /// Applies an accepted segment: state, the sender's numbers, and window scaling
    /// once a SYN announced it.
    fn take(&mut self, dir: Direction, s: &TcpSegment) {
        self.state = self.state.next(dir, s.flags);
        let (tx, rx) = (idx(dir), 1 - idx(dir));
        if s.has(SYN) {
            self.sides[tx].syn_end = s.seq.wrapping_add(s.len);
            self.sides[tx].syn_seen = true;
            self.sides[tx].ws = s.wscale.unwrap_or(WS_NONE);
            let (a, b) = (self.sides[tx].ws, self.sides[rx].ws);
            self.sides[tx].shift = shift(a, b);
            self.sides[rx].shift = shift(b, a);
        }
        self.sides[tx].sent(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Direction::{In, Out};
    use TcpState::*;

    fn seg(flags: u8, seq: u32, ack: u32, win: u16, len: u32) -> TcpSegment {
        TcpSegment {
            flags,
            seq,
            ack,
            win,
            len: len + u32::from(flags & SYN != 0) + u32::from(flags & FIN != 0),
            wscale: None,
        }
    }

    /// Tracks `s` going `dir` on a copy of `c` (the original is left alone).
    fn track_copy(mut c: TcpConn, dir: Direction, s: TcpSegment) -> Result<(), DropReason> {
        c.track(dir, s)
    }

    /// A connection the guest opened, both SYNs without window scaling: the guest's
    /// ISN 1000, the peer's 5000, both offering 10000 bytes.
    fn established() -> TcpConn {
        let mut c = TcpConn::open(Out, Some(seg(SYN, 1000, 0, 10000, 0)));
        c.track(In, seg(SYN | ACK, 5000, 1001, 10000, 0)).unwrap();
        c.track(Out, seg(ACK, 1001, 5001, 10000, 0)).unwrap();
        assert_eq!(c.state, Established);
        c
    }

    #[test]
    fn client_handshake_and_close() {
        let seq = [
            (Closed, Out, SYN, SynSent),
            (SynSent, In, SYN | ACK, Established),
            (Established, Out, ACK, Established),
            (Established, Out, FIN | ACK, FinWait1),
            (FinWait1, In, ACK, FinWait2),
            (FinWait2, In, FIN | ACK, TimeWait),
            (TimeWait, Out, SYN, SynSent),
        ];
        for (from, dir, flags, to) in seq {
            assert_eq!(from.next(dir, flags), to, "{from:?} {dir} {flags:#x}");
        }
    }

    #[test]
    fn server_handshake_passive_close_and_reset() {
        let seq = [
            (Closed, In, SYN, SynRcvd),
            (SynRcvd, Out, SYN | ACK, SynAckSent),
            (SynAckSent, In, ACK, Established),
            (Established, In, FIN | ACK, CloseWait),
            (CloseWait, Out, FIN | ACK, LastAck),
            (LastAck, In, ACK, Closed),
            (Established, In, RST, Closed),
            (SynSent, In, SYN, SynRcvd),
            (FinWait1, In, FIN | ACK, TimeWait),
        ];
        for (from, dir, flags, to) in seq {
            assert_eq!(from.next(dir, flags), to, "{from:?} {dir} {flags:#x}");
        }
    }

    #[test]
    fn a_remote_peer_cannot_complete_its_own_handshake() {
        // Peer SYN then peer ACK, without the guest's SYN|ACK: still half-open.
        assert_eq!(Closed.next(In, SYN), SynRcvd);
        assert_eq!(SynRcvd.next(In, ACK), SynRcvd);
        assert_eq!(SynRcvd.next(In, SYN | ACK), SynRcvd);
        // The guest's SYN|ACK alone does not establish either: the peer must answer.
        assert_eq!(SynRcvd.next(Out, SYN | ACK), SynAckSent);
        assert_eq!(SynAckSent.next(Out, ACK), SynAckSent);
        assert_eq!(SynAckSent.next(In, ACK), Established);
    }

    #[test]
    fn data_inside_the_window_passes_and_outside_is_refused() {
        let mut c = established();
        // The guest acknowledged 5001 with a 10000-byte window: 5001..15001 is open.
        for (seq, len) in [(5001, 1000), (14001, 1000), (15001, 0), (4000, 1001)] {
            assert!(
                track_copy(c, In, seg(ACK, seq, 1001, 100, len)).is_ok(),
                "{seq}+{len}"
            );
        }
        // A whole window in the past (still acceptable: a retransmission), and beyond.
        assert!(track_copy(c, In, seg(ACK, 5001u32.wrapping_sub(10000), 1001, 100, 10)).is_ok());
        for (seq, len) in [
            (15002, 1),
            (5001u32.wrapping_sub(10100), 99),
            (5001 + (1 << 31), 1),
        ] {
            assert!(
                track_copy(c, In, seg(ACK, seq, 1001, 100, len)).is_err(),
                "{seq}+{len}"
            );
        }
        // A refused segment changes nothing: not the state (a FIN), not the numbers.
        let before = c;
        assert!(c.track(In, seg(FIN | ACK, 90000, 1001, 65535, 0)).is_err());
        assert_eq!(c.state, Established);
        assert_eq!(c.sides[1].right, before.sides[1].right);
        // Sequence numbers wrap.
        let mut w = TcpConn::open(Out, Some(seg(SYN, u32::MAX - 10, 0, 10000, 0)));
        w.track(In, seg(SYN | ACK, u32::MAX - 100, u32::MAX - 9, 10000, 0))
            .unwrap();
        w.track(Out, seg(ACK, u32::MAX - 9, u32::MAX - 99, 10000, 0))
            .unwrap();
        assert!(w
            .track(In, seg(ACK, u32::MAX - 99, u32::MAX - 9, 10000, 2000))
            .is_ok());
        assert!(w
            .track(In, seg(ACK, 20000, u32::MAX - 9, 10000, 1))
            .is_err());
    }

    #[test]
    fn resets_must_hit_the_receivers_window() {
        let c = established();
        for seq in [5001, 10000, 15001] {
            let mut d = c;
            assert!(d.track(In, seg(RST, seq, 0, 0, 0)).is_ok(), "{seq}");
            assert_eq!(d.state, Closed);
        }
        for seq in [5000, 15002, 0, 5001 + (1 << 31)] {
            let mut d = c;
            assert!(d.track(In, seg(RST, seq, 0, 0, 0)).is_err(), "{seq}");
            assert_eq!(d.state, Established);
        }
        // The guest's own resets are held to the peer's window the same way.
        let mut d = c;
        assert!(d.track(Out, seg(RST | ACK, 777, 5001, 0, 0)).is_err());
        assert!(d.track(Out, seg(RST | ACK, 1001, 5001, 0, 0)).is_ok());
    }

    #[test]
    fn a_syn_ack_must_acknowledge_the_syn() {
        // A blind SYN|ACK during the guest's handshake must acknowledge its SYN.
        let mut h = TcpConn::open(Out, Some(seg(SYN, 1000, 0, 10000, 0)));
        assert!(h.track(In, seg(SYN | ACK, 1, 999_999, 100, 0)).is_err());
        assert_eq!(h.state, SynSent);
        assert!(h.track(In, seg(SYN | ACK, 1, 1001, 100, 0)).is_ok());
        assert_eq!(h.state, Established);
        // The same holds for the guest's answer to a peer's SYN.
        let mut p = TcpConn::open(In, Some(seg(SYN, 7000, 0, 10000, 0)));
        assert!(p.track(Out, seg(SYN | ACK, 1, 7002, 100, 0)).is_err());
        assert!(p.track(Out, seg(SYN | ACK, 1, 7001, 100, 0)).is_ok());
        assert_eq!(p.state, SynAckSent);
    }

    #[test]
    fn windows_are_scaled_as_the_syns_announced() {
        let syn = |flags, seq, ack, ws| TcpSegment {
            wscale: ws,
            ..seg(flags, seq, ack, 65535, 0)
        };
        // Both announce: the peer's shift 7 scales its windows (and the guest's 2).
        let mut c = TcpConn::open(Out, Some(syn(SYN, 1000, 0, Some(2))));
        c.track(In, syn(SYN | ACK, 5000, 1001, Some(7))).unwrap();
        c.track(Out, seg(ACK, 1001, 5001, 1000, 0)).unwrap();
        c.track(In, seg(ACK, 5001, 1001, 1000, 0)).unwrap();
        // The peer offered 1000 << 7: the guest may send 128000 bytes.
        assert!(track_copy(c, Out, seg(ACK, 1001 + 127_000, 5001, 1000, 1000)).is_ok());
        assert!(track_copy(c, Out, seg(ACK, 1001 + 128_001, 5001, 1000, 1)).is_err());
        // The guest offered 1000 << 2.
        assert!(track_copy(c, In, seg(ACK, 5001 + 4000, 1001, 1000, 1)).is_ok());
        assert!(track_copy(c, In, seg(ACK, 5001 + 4001, 1001, 1000, 1)).is_err());
        // One side without the option: no scaling at all.
        let mut d = TcpConn::open(Out, Some(syn(SYN, 1000, 0, Some(2))));
        d.track(In, syn(SYN | ACK, 5000, 1001, None)).unwrap();
        d.track(Out, seg(ACK, 1001, 5001, 1000, 0)).unwrap();
        assert!(track_copy(d, In, seg(ACK, 5001 + 1001, 1001, 1000, 1)).is_err());
        // Options are found among others, and a malformed list is no option.
        assert_eq!(window_scale(&[1, 2, 4, 5, 0xb4, 1, 3, 3, 9]), Some(9));
        assert_eq!(window_scale(&[3, 3, 20]), Some(MAX_WSCALE));
        assert_eq!(window_scale(&[2, 0, 3, 3, 7]), Some(7));
        assert_eq!(window_scale(&[0, 3, 3, 7]), None);
        assert_eq!(window_scale(&[8, 10, 3, 3]), None);
        assert_eq!(window_scale(&[3]), None);
    }

    #[test]
    fn unknown_sides_restrict_nothing_until_they_speak() {
        // Picked up mid-stream from the guest's side: the peer has not spoken, so
        // the guest's segments are not held to anything yet.
        let mut c = TcpConn::open(Out, Some(seg(ACK, 1000, 9000, 100, 500)));
        assert_eq!(c.state, Established);
        assert!(track_copy(c, Out, seg(ACK, 77, 123, 100, 10)).is_ok());
        // The peer's are held to the window the guest offered, scaled by the largest
        // shift (the SYNs were not seen): 9000..=9000 + (100 << 14).
        assert!(track_copy(c, In, seg(ACK, 9001 + (100 << 14), 1500, 100, 1)).is_err());
        assert!(c
            .track(In, seg(ACK, 9000 + (100 << 14), 1500, 100, 1))
            .is_ok());
        // Once the peer has spoken, so are the guest's.
        assert!(track_copy(c, Out, seg(ACK, 1500 + (1 << 31), 123, 100, 10)).is_err());
        assert!(track_copy(c, Out, seg(ACK, 1500, 123, 100, 10)).is_ok());
        // A SYN restarting a closed connection starts over with new numbers.
        let mut r = established();
        r.track(In, seg(RST, 5001, 0, 0, 0)).unwrap();
        assert!(r.track(Out, seg(SYN, 777_777, 0, 100, 0)).is_ok());
        assert_eq!(r.state, SynSent);
        assert!(r.track(In, seg(SYN | ACK, 3, 777_778, 100, 0)).is_ok());
    }

    #[test]
    fn segments_are_read_from_frames() {
        let mut f = Vec::new();
        etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
            .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .tcp(1, 2, 0xdead_beef, 512)
            .syn()
            .ack(0x0102_0304)
            .options(&[
                etherparse::TcpOptionElement::Noop,
                etherparse::TcpOptionElement::WindowScale(6),
            ])
            .unwrap()
            .write(&mut f, &[9; 10])
            .unwrap();
        let m = wire::meta::parse_inner(&f).unwrap();
        let s = TcpSegment::read(&m, &f);
        assert_eq!(
            s,
            Some(TcpSegment {
                flags: SYN | ACK,
                seq: 0xdead_beef,
                ack: 0x0102_0304,
                win: 512,
                len: 11,
                wscale: Some(6),
            })
        );
        // Headers not in `head`, a fragment without a header, other protocols.
        assert_eq!(TcpSegment::read(&m, &f[..40]), None);
        let mut frag = m;
        frag.payload_off = frag.l4_off;
        assert_eq!(TcpSegment::read(&frag, &f), None);
        let mut udp = m;
        udp.proto = crate::machinery::flow::PROTO_UDP;
        assert_eq!(TcpSegment::read(&udp, &f), None);
    }
}
