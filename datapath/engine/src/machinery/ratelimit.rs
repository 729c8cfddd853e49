//! Per-port rate limits (`set-port-limits`): token buckets on what a guest sends
//! (egress) and what is delivered to it (ingress), in bits per second and,
//! optionally, packets per second, so that one guest cannot take a sled's whole
//! underlay or another guest's share of a worker.
//!
//! Egress is *shaped* by back-pressure, as a NIC's per-VF limit is: a port whose
//! tokens are spent is not read from (`Engine::egress_wait` says for how long),
//! so the guest's frames wait in its own queues and its TCP slows down by itself,
//! losing nothing (its small-queue limit keeps a connection's backlog in the tap
//! small; a flood that overflows the tap's queue is dropped there and counted by
//! the tap). A frame taken is charged whole, even when it overdraws the bucket
//! (a 64 KiB TSO buffer against a nearly empty bucket): the debt is paid by
//! waiting longer before the next one, so the rate holds on average and no
//! buffer is ever too big to pass.
//!
//! Ingress is shaped too, by the caller: frames from the underlay cannot be held
//! back at their source, so a frame for a port whose tokens are spent
//! (`Engine::ingress_take`) waits in a bounded queue of the worker's and is
//! delivered when they are back; only a frame that finds the queue full is
//! dropped (`rate_limited`). TCP then sees a longer round trip rather than
//! losses: policing (dropping whatever finds no token) let a TCP connection reach
//! 12% of a 100 Mbit/s limit in the end-to-end test, shaping 99%.
//!
//! The engine has no clock: buckets refill from the `now` (ns) each call passes
//! in.

use serde::{Deserialize, Serialize};

/// The smallest default burst: four 64 KiB TSO buffers.
pub const DEFAULT_BURST_MIN: u64 = 4 * 64 * 1024;

/// The default burst covers this long at the limit (when that is more than
/// [`DEFAULT_BURST_MIN`]): enough for TCP to keep a window in flight at the rate.
pub const DEFAULT_BURST_NS: u64 = 20_000_000;

/// A port's limits as configured; `None` is unlimited. `burst_kib` applies to both
/// byte buckets (default: [`DEFAULT_BURST_NS`] at the rate, at least
/// [`DEFAULT_BURST_MIN`]); `pps` limits each direction separately, with a burst of
/// the rate's 20 ms (at least 64 packets).
///
/// Taken as given: the API refuses zeros and values above what a sled needs, and
/// here every value is harmless: the arithmetic cannot overflow (`u32` rates and
/// bursts are far inside an `i128` of nano-tokens), and a zero rate or burst is
/// clamped to one token (see `Bucket::new`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_mbps: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_mbps: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_kib: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pps: Option<u32>,
}

impl PortLimits {
    /// Whether no limit is set.
    pub fn is_unlimited(&self) -> bool {
        self.egress_mbps.is_none() && self.ingress_mbps.is_none() && self.pps.is_none()
    }
}

/// One token bucket. Tokens are kept in units of 1/10^9 of a byte (or packet), so
/// that a refill is one multiplication (`elapsed_ns * rate`, the rate in bytes or
/// packets per second); signed, so a shaped frame can overdraw the bucket.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    /// Per second, in bytes or packets.
    rate: u64,
    /// The most tokens held, scaled.
    cap: i128,
    tokens: i128,
    last_ns: u64,
}

const SCALE: i128 = 1_000_000_000;

impl Bucket {
    /// A full bucket. A rate or burst of zero is taken as one (a byte or a packet;
    /// per second for the rate) rather than kept: a bucket that can never hold a
    /// token would answer every `wait` with 1 ns, and the caller, told to retry at
    /// once, would spin. One byte a second lets, in effect, nothing pass, which is
    /// what a zero limit asks for, and keeps every wait finite and every division
    /// by a rate of at least one.
    fn new(rate: u64, burst: u64, now: u64) -> Bucket {
        let rate = rate.max(1);
        let cap = i128::from(burst.max(1)) * SCALE;
        Bucket {
            rate,
            cap,
            tokens: cap,
            last_ns: now,
        }
    }

    /// The tokens at `now` (a clock that goes back refills nothing).
    #[inline]
    fn at(&self, now: u64) -> i128 {
        let elapsed = i128::from(now.saturating_sub(self.last_ns));
        (self.tokens + elapsed * i128::from(self.rate)).min(self.cap)
    }

    #[inline]
    fn refill(&mut self, now: u64) {
        if now > self.last_ns {
            self.tokens = self.at(now);
            self.last_ns = now;
        }
    }

    /// Takes `n` whatever the bucket holds. The debt is bounded by one
    /// burst (a caller that does not wait cannot run it up without end).
    #[inline]
    fn charge(&mut self, n: u64, now: u64) {
        self.refill(now);
        self.tokens = (self.tokens - i128::from(n) * SCALE).max(-self.cap);
    }

    /// Whole tokens held at `now` (negative: owed), as a port's export carries
    /// them.
    fn level(&self, now: u64) -> i64 {
        let t = self.at(now) / SCALE;
        i64::try_from(t).unwrap_or(if t < 0 { i64::MIN } else { i64::MAX })
    }

    /// Holds `tokens` from `now` on, within what the bucket may hold or owe.
    fn set_level(&mut self, tokens: i64, now: u64) {
        self.tokens = (i128::from(tokens) * SCALE).clamp(-self.cap, self.cap);
        self.last_ns = now;
    }

    /// How long until the bucket holds tokens again (`None`: it does now).
    #[inline]
    fn wait(&self, now: u64) -> Option<u64> {
        let t = self.at(now);
        if t > 0 {
            return None;
        }
        let ns = (-t) / i128::from(self.rate) + 1;
        Some(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

/// One direction's buckets.
#[derive(Clone, Copy, Debug, Default)]
struct Buckets {
    bytes: Option<Bucket>,
    packets: Option<Bucket>,
}

impl Buckets {
    fn new(mbps: Option<u32>, burst_kib: Option<u32>, pps: Option<u32>, now: u64) -> Buckets {
        let bytes = mbps.map(|m| {
            // At most 2^32 Mbit/s, 2^49 bytes a second: the default burst's
            // product is taken in 128 bits (it would overflow 64 above ~7 Tbit/s).
            let rate = u64::from(m) * 1_000_000 / 8;
            let burst = match burst_kib {
                Some(k) => u64::from(k) * 1024,
                None => {
                    let b = u128::from(rate) * u128::from(DEFAULT_BURST_NS) / 1_000_000_000;
                    u64::try_from(b).unwrap_or(u64::MAX).max(DEFAULT_BURST_MIN)
                }
            };
            Bucket::new(rate, burst, now)
        });
        let packets = pps.map(|p| {
            let p = u64::from(p);
            Bucket::new(p, (p / 50).max(64), now)
        });
        Buckets { bytes, packets }
    }

    #[inline]
    fn charge(&mut self, len: u64, now: u64) {
        if let Some(p) = &mut self.packets {
            p.charge(1, now);
        }
        if let Some(b) = &mut self.bytes {
            b.charge(len, now);
        }
    }

    #[inline]
    fn wait(&self, now: u64) -> Option<u64> {
        let p = self.packets.as_ref().and_then(|b| b.wait(now));
        let b = self.bytes.as_ref().and_then(|b| b.wait(now));
        p.max(b)
    }
}

/// How full a port's buckets are, as a port's export carries them: whole tokens
/// (bytes or packets; negative: owed) of each bucket the port has. A port that
/// moves keeps its guest to the rate it was held to, rather than granting it a
/// fresh burst.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketLevels {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_bytes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_packets: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_bytes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_packets: Option<i64>,
}

/// A port's buckets; `None` for an unlimited port, which then pays one branch per
/// frame.
#[derive(Clone, Debug, Default)]
pub struct PortPolicer {
    /// Egress, ingress.
    dirs: Option<Box<[Buckets; 2]>>,
}

impl PortPolicer {
    /// The buckets for `limits`, full (a new limit starts with its burst).
    pub fn new(limits: &PortLimits, now: u64) -> PortPolicer {
        if limits.is_unlimited() {
            return PortPolicer { dirs: None };
        }
        let (b, p) = (limits.burst_kib, limits.pps);
        PortPolicer {
            dirs: Some(Box::new([
                Buckets::new(limits.egress_mbps, b, p, now),
                Buckets::new(limits.ingress_mbps, b, p, now),
            ])),
        }
    }

    /// How full the buckets are at `now`.
    pub fn levels(&self, now: u64) -> BucketLevels {
        let Some(d) = &self.dirs else {
            return BucketLevels::default();
        };
        let level = |b: &Option<Bucket>| b.as_ref().map(|b| b.level(now));
        BucketLevels {
            egress_bytes: level(&d[0].bytes),
            egress_packets: level(&d[0].packets),
            ingress_bytes: level(&d[1].bytes),
            ingress_packets: level(&d[1].packets),
        }
    }

    /// Fills the buckets as `levels` says from `now` on, each within what it may
    /// hold or owe. A level of a bucket this port does not have is left aside:
    /// the limits are the port's, the levels only how much of them is spent.
    pub fn set_levels(&mut self, levels: &BucketLevels, now: u64) {
        let Some(d) = &mut self.dirs else {
            return;
        };
        let [egress, ingress] = &mut **d;
        for (bucket, level) in [
            (&mut egress.bytes, levels.egress_bytes),
            (&mut egress.packets, levels.egress_packets),
            (&mut ingress.bytes, levels.ingress_bytes),
            (&mut ingress.packets, levels.ingress_packets),
        ] {
            if let (Some(b), Some(l)) = (bucket.as_mut(), level) {
                b.set_level(l, now);
            }
        }
    }

    /// How long the guest must wait before its next frame is taken (`None`: it
    /// may send now).
    #[inline]
    pub fn egress_wait(&self, now: u64) -> Option<u64> {
        self.dirs.as_ref().and_then(|d| d[0].wait(now))
    }

    /// Charges a frame of `len` bytes the guest sent.
    #[inline]
    pub fn egress(&mut self, len: usize, now: u64) {
        if let Some(d) = &mut self.dirs {
            d[0].charge(len as u64, now);
        }
    }

    /// How long a frame for the guest must wait before it is delivered (`None`:
    /// deliver it now).
    #[inline]
    pub fn ingress_wait(&self, now: u64) -> Option<u64> {
        self.dirs.as_ref().and_then(|d| d[1].wait(now))
    }

    /// Charges a frame of `len` bytes delivered to the guest.
    #[inline]
    pub fn ingress(&mut self, len: usize, now: u64) {
        if let Some(d) = &mut self.dirs {
            d[1].charge(len as u64, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn limits(egress: Option<u32>, ingress: Option<u32>) -> PortLimits {
        PortLimits {
            egress_mbps: egress,
            ingress_mbps: ingress,
            ..PortLimits::default()
        }
    }

    /// Which way a test sends.
    #[derive(Clone, Copy)]
    enum Way {
        Egress,
        Ingress,
    }

    fn wait(p: &PortPolicer, way: Way, now: u64) -> Option<u64> {
        match way {
            Way::Egress => p.egress_wait(now),
            Way::Ingress => p.ingress_wait(now),
        }
    }

    fn charge(p: &mut PortPolicer, way: Way, len: usize, now: u64) {
        match way {
            Way::Egress => p.egress(len, now),
            Way::Ingress => p.ingress(len, now),
        }
    }

    /// A sender that sends `len`-byte frames whenever it is let (as the worker
    /// does, both ways) for 10 s passes the limit plus one burst, whatever the
    /// frame size: a 64 KiB buffer overdraws the bucket and waits for it. The
    /// other direction stays unlimited.
    #[test]
    fn shaping_holds_the_rate_with_any_frame_size() {
        for (way, l) in [
            (Way::Egress, limits(Some(100), None)),
            (Way::Ingress, limits(None, Some(100))),
        ] {
            for len in [64usize, 1500, 65536] {
                let mut p = PortPolicer::new(&l, 0);
                let (mut now, mut sent) = (0u64, 0u64);
                while now < 10_000 * MS {
                    match wait(&p, way, now) {
                        Some(w) => now += w,
                        None => {
                            charge(&mut p, way, len, now);
                            sent += len as u64;
                        }
                    }
                }
                let want = 100_000_000 / 8 * 10;
                let most = want + DEFAULT_BURST_MIN + len as u64;
                assert!(
                    (want..=most).contains(&sent),
                    "{len}-byte frames: {sent} bytes in 10 s, want {want}-{most}"
                );
                let other = match way {
                    Way::Egress => Way::Ingress,
                    Way::Ingress => Way::Egress,
                };
                assert_eq!(wait(&p, other, now), None, "the other way is unlimited");
            }
        }
    }

    /// The packet rate has a bucket per direction: 64 frames empty one, and from
    /// then on a frame waits 1 ms.
    #[test]
    fn packet_rate_limits_each_direction() {
        let l = PortLimits {
            pps: Some(1000),
            ..PortLimits::default()
        };
        for way in [Way::Egress, Way::Ingress] {
            let mut p = PortPolicer::new(&l, 0);
            for _ in 0..64 {
                assert_eq!(wait(&p, way, 0), None);
                charge(&mut p, way, 64, 0);
            }
            assert_eq!(wait(&p, way, 0), Some(1), "empty: any refill will do");
            charge(&mut p, way, 64, 1);
            let w = wait(&p, way, 1).unwrap();
            assert!((999_000..=1_000_000).contains(&w), "{w}");
        }
    }

    #[test]
    fn unlimited_never_waits() {
        let mut p = PortPolicer::new(&PortLimits::default(), 0);
        for i in 0..1000 {
            assert_eq!((p.egress_wait(i), p.ingress_wait(i)), (None, None));
            p.egress(65536, i);
            p.ingress(65536, i);
        }
    }

    /// A clock that goes back (a caller's `now` is per worker) refills nothing; a
    /// sender that ignores the waits runs up a debt of one burst at most.
    #[test]
    fn time_going_back_and_ignored_waits_are_bounded() {
        let l = PortLimits {
            egress_mbps: Some(8),
            burst_kib: Some(1),
            ..PortLimits::default()
        };
        let mut p = PortPolicer::new(&l, 10 * MS);
        p.egress(1024, 10 * MS);
        assert_eq!(p.egress_wait(5 * MS), Some(1), "no refill from the past");
        for _ in 0..1000 {
            p.egress(65536, 10 * MS);
        }
        // 1 KiB of debt at 1 MB/s: about 1 ms.
        let w = p.egress_wait(10 * MS).unwrap();
        assert!((1_000_000..=1_100_000).contains(&w), "{w}");
    }

    /// Values the API refuses (zeros, the largest `u32`s) and clocks at either end
    /// neither panic nor leave a bucket that never holds a token: a zero limit
    /// lets a frame through now and then (one byte a second) and asks the caller
    /// to wait, never to spin.
    #[test]
    fn unchecked_values_are_harmless() {
        let zero = PortLimits {
            egress_mbps: Some(0),
            ingress_mbps: Some(0),
            burst_kib: Some(0),
            pps: Some(0),
        };
        let max = PortLimits {
            egress_mbps: Some(u32::MAX),
            ingress_mbps: Some(u32::MAX),
            burst_kib: None,
            pps: Some(u32::MAX),
        };
        for l in [
            zero,
            max,
            PortLimits {
                burst_kib: Some(u32::MAX),
                ..max
            },
        ] {
            for now in [0, 1, u64::MAX / 2, u64::MAX] {
                let mut p = PortPolicer::new(&l, now);
                for t in [now, now.saturating_add(1), u64::MAX, 0] {
                    p.egress(usize::MAX, t);
                    p.ingress(65536, t);
                    let _ = (p.egress_wait(t), p.ingress_wait(t));
                }
            }
        }
        let mut p = PortPolicer::new(&zero, 0);
        p.egress(1500, 0);
        let w = p.egress_wait(0).expect("over a zero limit");
        assert!(w >= 1_000_000_000, "a zero limit waits seconds, not {w} ns");
        // The default burst of the largest rate: 20 ms of it, not an overflow.
        let mut p = PortPolicer::new(&max, 0);
        p.ingress(1 << 40, 0);
        assert_eq!(p.ingress_wait(0), None, "within 20 ms of 2^32 Mbit/s");
    }
}
