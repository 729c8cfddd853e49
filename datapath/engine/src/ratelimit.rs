//! Per-port rate limits (`set-port-limits`): token buckets that police what a guest
//! sends (egress) and what is delivered to it (ingress), in bits per second and,
//! optionally, packets per second, so that one guest cannot take a sled's whole
//! underlay or another guest's share of a worker.
//!
//! Policing, not shaping: a frame that finds too few tokens is dropped and counted
//! (`rate_limited`); nothing is queued, so a limited port costs no memory and
//! adds no latency, and TCP settles at the rate by its own congestion control.
//! A guest's TSO buffer (up to 64 KiB) is charged whole when it arrives, so the
//! default burst holds several of them ([`DEFAULT_BURST_MIN`]): a bucket smaller
//! than a buffer would drop every one. The engine has no clock: buckets refill
//! from the `now` (ns) each call passes in.

use serde::{Deserialize, Serialize};

/// The smallest default burst: four 64 KiB TSO buffers.
pub const DEFAULT_BURST_MIN: u64 = 4 * 64 * 1024;

/// The default burst covers this long at the limit (when that is more than
/// [`DEFAULT_BURST_MIN`]): enough for TCP to keep a window in flight at the rate.
pub const DEFAULT_BURST_NS: u64 = 20_000_000;

/// The largest limit accepted: 400 Gbit/s, beyond any NIC a sled has.
pub const MAX_MBPS: u32 = 400_000;

/// The largest burst accepted (1 GiB).
pub const MAX_BURST_KIB: u32 = 1 << 20;

/// The largest packet rate accepted.
pub const MAX_PPS: u32 = 1_000_000_000;

/// A port's limits as configured; `None` is unlimited. `burst_kib` applies to both
/// byte buckets (default: [`DEFAULT_BURST_NS`] at the rate, at least
/// [`DEFAULT_BURST_MIN`]); `pps` limits each direction separately, with a burst of
/// the rate's 20 ms (at least 64 packets).
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

    /// Checks the values; errors name the bad one.
    pub fn validate(&self) -> Result<(), String> {
        for (what, v) in [("egress", self.egress_mbps), ("ingress", self.ingress_mbps)] {
            if let Some(m) = v {
                if m == 0 || m > MAX_MBPS {
                    return Err(format!(
                        "{what} limit {m} Mbit/s is outside 1-{MAX_MBPS} Mbit/s"
                    ));
                }
            }
        }
        if let Some(b) = self.burst_kib {
            if b == 0 || b > MAX_BURST_KIB {
                return Err(format!("burst {b} KiB is outside 1-{MAX_BURST_KIB} KiB"));
            }
            if self.egress_mbps.is_none() && self.ingress_mbps.is_none() {
                return Err(format!(
                    "burst {b} KiB given without an egress or ingress limit to apply to"
                ));
            }
        }
        if let Some(p) = self.pps {
            if p == 0 || p > MAX_PPS {
                return Err(format!("packet rate {p} pps is outside 1-{MAX_PPS} pps"));
            }
        }
        Ok(())
    }

    /// `egress 100 Mbit/s, ingress 1000 Mbit/s, burst 512 KiB, 10000 pps`, or `-`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(m) = self.egress_mbps {
            parts.push(format!("egress {m} Mbit/s"));
        }
        if let Some(m) = self.ingress_mbps {
            parts.push(format!("ingress {m} Mbit/s"));
        }
        if let Some(b) = self.burst_kib {
            parts.push(format!("burst {b} KiB"));
        }
        if let Some(p) = self.pps {
            parts.push(format!("{p} pps"));
        }
        if parts.is_empty() {
            "-".into()
        } else {
            parts.join(", ")
        }
    }
}

/// One token bucket. Tokens are kept in units of 1/10^9 of a byte (or packet), so
/// that a refill is one multiplication: `elapsed_ns * rate` with the rate in bytes
/// (packets) per second.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    /// Per second, in bytes or packets.
    rate: u64,
    /// The most tokens held, scaled.
    cap: u128,
    tokens: u128,
    last_ns: u64,
}

const SCALE: u128 = 1_000_000_000;

impl Bucket {
    fn new(rate: u64, burst: u64, now: u64) -> Bucket {
        let cap = u128::from(burst) * SCALE;
        Bucket {
            rate,
            cap,
            tokens: cap,
            last_ns: now,
        }
    }

    /// Takes `n` (bytes or packets) if the bucket holds them.
    #[inline]
    fn take(&mut self, n: u64, now: u64) -> bool {
        if now > self.last_ns {
            let add = u128::from(now - self.last_ns) * u128::from(self.rate);
            self.tokens = (self.tokens + add).min(self.cap);
            self.last_ns = now;
        }
        let want = u128::from(n) * SCALE;
        if self.tokens >= want {
            self.tokens -= want;
            true
        } else {
            false
        }
    }
}

/// One direction's buckets.
#[derive(Clone, Copy, Debug, Default)]
struct Policer {
    bytes: Option<Bucket>,
    packets: Option<Bucket>,
}

impl Policer {
    fn new(mbps: Option<u32>, burst_kib: Option<u32>, pps: Option<u32>, now: u64) -> Policer {
        let bytes = mbps.map(|m| {
            let rate = u64::from(m) * 1_000_000 / 8;
            let burst = match burst_kib {
                Some(k) => u64::from(k) * 1024,
                None => (rate * DEFAULT_BURST_NS / 1_000_000_000).max(DEFAULT_BURST_MIN),
            };
            Bucket::new(rate, burst, now)
        });
        let packets = pps.map(|p| {
            let p = u64::from(p);
            Bucket::new(p, (p / 50).max(64), now)
        });
        Policer { bytes, packets }
    }

    /// Whether a frame of `len` bytes may pass (taking its tokens if so). A frame
    /// refused by the packet bucket takes no bytes, and the reverse.
    #[inline]
    fn admit(&mut self, len: u64, now: u64) -> bool {
        if let Some(p) = &mut self.packets {
            if !p.take(1, now) {
                return false;
            }
        }
        match &mut self.bytes {
            Some(b) => b.take(len, now),
            None => true,
        }
    }
}

/// A port's policers; `None` for an unlimited port, which then pays one branch
/// per frame.
#[derive(Clone, Debug, Default)]
pub struct PortPolicer {
    dirs: Option<Box<[Policer; 2]>>,
}

impl PortPolicer {
    /// The policers for `limits`, full (a new limit starts with its burst).
    pub fn new(limits: &PortLimits, now: u64) -> PortPolicer {
        if limits.is_unlimited() {
            return PortPolicer { dirs: None };
        }
        let (b, p) = (limits.burst_kib, limits.pps);
        PortPolicer {
            dirs: Some(Box::new([
                Policer::new(limits.egress_mbps, b, p, now),
                Policer::new(limits.ingress_mbps, b, p, now),
            ])),
        }
    }

    /// Whether the guest may send a frame of `len` bytes now.
    #[inline]
    pub fn egress(&mut self, len: usize, now: u64) -> bool {
        match &mut self.dirs {
            None => true,
            Some(d) => d[0].admit(len as u64, now),
        }
    }

    /// Whether a frame of `len` bytes may be delivered to the guest now.
    #[inline]
    pub fn ingress(&mut self, len: usize, now: u64) -> bool {
        match &mut self.dirs {
            None => true,
            Some(d) => d[1].admit(len as u64, now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Bytes a policer passes in `secs` seconds offered `offer` frames of `len`
    /// bytes evenly.
    fn passed(p: &mut PortPolicer, len: usize, frames_per_s: u64, secs: u64) -> u64 {
        let step = 1_000_000_000 / frames_per_s;
        let mut sent = 0;
        for i in 0..frames_per_s * secs {
            if p.egress(len, i * step) {
                sent += len as u64;
            }
        }
        sent
    }

    /// Offered twice the limit for 10 s, a port passes the limit (plus the burst
    /// once); offered less, everything.
    #[test]
    fn passes_the_rate_and_no_more() {
        let limits = PortLimits {
            egress_mbps: Some(100),
            ..PortLimits::default()
        };
        let mut p = PortPolicer::new(&limits, 0);
        // 200 Mbit/s of 1500-byte frames.
        let sent = passed(&mut p, 1500, 200_000_000 / 8 / 1500, 10);
        let want = 100_000_000 / 8 * 10;
        let burst = DEFAULT_BURST_MIN;
        assert!(sent <= want + burst + 1500, "{sent} > {want} + burst");
        assert!(sent >= want - 1500, "{sent} < {want}");
        let mut p = PortPolicer::new(&limits, 0);
        let offered = 50_000_000 / 8 / 1500 * 1500 * 10;
        assert_eq!(passed(&mut p, 1500, 50_000_000 / 8 / 1500, 10), offered);
    }

    /// A TSO buffer bigger than the remaining tokens waits for them; the default
    /// burst takes several at once.
    #[test]
    fn default_burst_holds_tso_buffers() {
        let limits = PortLimits {
            egress_mbps: Some(10),
            ..PortLimits::default()
        };
        let mut p = PortPolicer::new(&limits, 0);
        for _ in 0..4 {
            assert!(p.egress(65536, 0));
        }
        assert!(!p.egress(65536, 0), "the burst is spent");
        // 10 Mbit/s refills 64 KiB in ~52 ms.
        assert!(!p.egress(65536, 50 * MS));
        assert!(p.egress(65536, 53 * MS));
    }

    #[test]
    fn packet_rate_limits_each_direction() {
        let limits = PortLimits {
            pps: Some(1000),
            ..PortLimits::default()
        };
        let mut p = PortPolicer::new(&limits, 0);
        let passed = (0..10_000).filter(|i| p.egress(64, i * 100_000)).count();
        // 1 s at 1000 pps, plus the burst of 64.
        assert!((1000..=1064 + 1).contains(&passed), "{passed}");
        assert!(p.ingress(64, 0), "ingress has its own bucket");
    }

    #[test]
    fn unlimited_passes_everything() {
        let mut p = PortPolicer::new(&PortLimits::default(), 0);
        assert!((0..1000).all(|i| p.egress(65536, i) && p.ingress(65536, i)));
    }

    /// A clock that goes back (a caller's `now` is per worker) refills nothing and
    /// breaks nothing.
    #[test]
    fn time_going_back_refills_nothing() {
        let limits = PortLimits {
            egress_mbps: Some(1),
            burst_kib: Some(1),
            ..PortLimits::default()
        };
        let mut p = PortPolicer::new(&limits, 10 * MS);
        assert!(p.egress(1024, 10 * MS));
        assert!(!p.egress(1, 5 * MS));
    }

    #[test]
    fn bad_values_are_named() {
        let bad = |l: PortLimits, want: &str| {
            let e = l.validate().unwrap_err();
            assert!(e.contains(want), "{e}");
        };
        let l = PortLimits::default();
        bad(
            PortLimits {
                egress_mbps: Some(0),
                ..l
            },
            "egress limit 0",
        );
        bad(
            PortLimits {
                ingress_mbps: Some(500_000),
                ..l
            },
            "ingress limit 500000",
        );
        bad(
            PortLimits {
                burst_kib: Some(64),
                ..l
            },
            "burst 64 KiB given without",
        );
        bad(PortLimits { pps: Some(0), ..l }, "packet rate 0");
        assert!(PortLimits {
            egress_mbps: Some(100),
            burst_kib: Some(512),
            ..l
        }
        .validate()
        .is_ok());
    }
}
