//! Per-port limits on what the gateway sends, so that a guest flooding its gateway
//! with requests costs the datapath a bounded number of small frames per second and
//! cannot starve one protocol's answers with another's requests.
//!
//! Each kind of reply (ARP, Neighbor Advertisement, echo, DHCP) and the ICMP errors
//! about oversized packets have a token bucket of their own per port. Solicited
//! Router Advertisements follow RFC 4861 §6.2.6 instead: at most one RA per
//! `MIN_DELAY_BETWEEN_RAS` (see `ra::RaTimer::may_answer_rs`).

const NS_PER_S: u64 = 1_000_000_000;

/// A sustained rate and the burst allowed above it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Rate {
    pub(super) per_s: u64,
    pub(super) burst: u64,
}

impl Rate {
    fn ns_per_token(self) -> u64 {
        NS_PER_S / self.per_s.max(1)
    }
}

/// ICMP errors about packets above their path MTU (RFC 4443 §2.4(f) requires a
/// limit): a guest blasting oversized packets gets 100 errors a second, which is
/// plenty for a path-MTU search and costs under 0.1% of a core.
pub(super) const PTB: Rate = Rate {
    per_s: 100,
    burst: 20,
};

/// Each kind of reply to the guest (ARP, NA, echo, DHCP): the PTB limit. A guest
/// asks these a few times a minute (ARP and NDP refreshes, DHCP at boot and renewal,
/// a ping a second); 100 a second with a burst of 20 leaves `ping -i 0.01` and a
/// booting guest's DHCPv4 + DHCPv6 exchanges untouched, and bounds a flood to 100
/// built frames and tap writes a second per kind.
pub(super) const REPLY: Rate = PTB;

/// One port's buckets, one per kind of frame the gateway sends on request.
#[derive(Clone, Debug)]
pub(super) struct Buckets {
    pub(super) ptb: TokenBucket,
    pub(super) arp: TokenBucket,
    pub(super) na: TokenBucket,
    pub(super) echo: TokenBucket,
    /// DHCPv4 and DHCPv6 together: a guest runs both at boot, well within a burst.
    pub(super) dhcp: TokenBucket,
}

impl Buckets {
    /// Full buckets at `now`.
    pub(super) fn new(now: u64) -> Self {
        Buckets {
            ptb: TokenBucket::new(PTB, now),
            arp: TokenBucket::new(REPLY, now),
            na: TokenBucket::new(REPLY, now),
            echo: TokenBucket::new(REPLY, now),
            dhcp: TokenBucket::new(REPLY, now),
        }
    }
}

/// A token bucket refilled continuously from the caller's clock.
#[derive(Clone, Debug)]
pub(super) struct TokenBucket {
    tokens: u64,
    /// Time up to which refills have been credited.
    credited_ns: u64,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub(super) fn new(rate: Rate, now: u64) -> Self {
        TokenBucket {
            tokens: rate.burst,
            credited_ns: now,
        }
    }

    /// Takes one token if there is one.
    pub(super) fn take(&mut self, rate: Rate, now: u64) -> bool {
        let per = rate.ns_per_token();
        let earned = now.saturating_sub(self.credited_ns) / per;
        if earned > 0 {
            self.tokens = self.tokens.saturating_add(earned).min(rate.burst);
            // Keep the fractional remainder unless the bucket is full.
            self.credited_ns = if self.tokens == rate.burst {
                now
            } else {
                self.credited_ns + earned * per
            };
        }
        if self.tokens > 0 {
            self.tokens -= 1;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_burst_then_rate() {
        let mut b = TokenBucket::new(PTB, 0);
        let sent = (0..100).filter(|_| b.take(PTB, 0)).count() as u64;
        assert_eq!(sent, PTB.burst);
        // One second later: 100 tokens earned, capped at the burst.
        let sent = (0..100).filter(|_| b.take(PTB, NS_PER_S)).count() as u64;
        assert_eq!(sent, PTB.burst);
        // 25 ms later: two tokens (10 ms each), the half token is kept.
        let t = 1_025_000_000;
        assert!(b.take(PTB, t) && b.take(PTB, t) && !b.take(PTB, t));
        assert!(b.take(PTB, 1_030_000_000));
    }

    #[test]
    fn a_clock_that_goes_back_earns_nothing() {
        let mut b = TokenBucket::new(Rate { per_s: 1, burst: 1 }, 5 * NS_PER_S);
        assert!(b.take(Rate { per_s: 1, burst: 1 }, 5 * NS_PER_S));
        assert!(!b.take(Rate { per_s: 1, burst: 1 }, 0));
        assert!(b.take(Rate { per_s: 1, burst: 1 }, 6 * NS_PER_S));
    }
}
