//! The XDP program that steers this sled's Geneve traffic into AF_XDP sockets, and
//! the tc program that sends the underlay tunnel tap's frames out of the underlay.
//!
//! The programs are C (`src/*.bpf.c`), compiled by clang in `build.rs`, and
//! embedded here as ELF objects that `dpio::xdp` and `dpio::tunnel_tx` load with aya. The map and
//! program names below are the contract between the C source and the loader.

/// 8-byte alignment for the embedded object: the ELF parser aya uses reads
/// headers in place and rejects a misaligned buffer, and `include_bytes!`
/// alone guarantees no alignment.
#[repr(C, align(8))]
struct Aligned<B: ?Sized> {
    bytes: B,
}

static STEER_ALIGNED: &Aligned<[u8]> = &Aligned {
    bytes: *include_bytes!(concat!(env!("OUT_DIR"), "/steer.bpf.o")),
};

/// The compiled BPF ELF object (`steer.bpf.o`), 8-byte aligned.
pub static STEER_OBJECT: &[u8] = &STEER_ALIGNED.bytes;

static TUNNEL_REDIRECT_ALIGNED: &Aligned<[u8]> = &Aligned {
    bytes: *include_bytes!(concat!(env!("OUT_DIR"), "/tunnel_redirect.bpf.o")),
};

/// The compiled tc program of the underlay tunnel tap (`tunnel_redirect.bpf.o`,
/// from `src/tunnel_redirect.bpf.c`), 8-byte aligned: it redirects every frame
/// written to the tap to the underlay interface's egress.
pub static TUNNEL_REDIRECT_OBJECT: &[u8] = &TUNNEL_REDIRECT_ALIGNED.bytes;
/// Name of its program function (section `classifier`).
pub const TUNNEL_REDIRECT_PROGRAM: &str = "tunnel_redirect";
/// `BPF_MAP_TYPE_ARRAY` of one `u32`: the ifindex to redirect to.
pub const REDIRECT_TO_MAP: &str = "redirect_to";
/// `BPF_MAP_TYPE_PERCPU_ARRAY` of one `u64`: frames dropped because no target was set.
pub const REDIRECT_DROPS_MAP: &str = "redirect_drops";

/// Name of the XDP program function (section `xdp.frags`).
pub const PROGRAM_NAME: &str = "steer";
/// `BPF_MAP_TYPE_XSKMAP`, key = rx queue index, value = AF_XDP socket fd.
pub const XSKS_MAP: &str = "xsks";
/// Capacity of [`XSKS_MAP`]: the highest queue index we can steer is one less.
pub const XSKS_MAX_ENTRIES: u32 = 64;
/// `BPF_MAP_TYPE_HASH`, key = 16-byte IPv6 address, value = `u8` (unused, 1).
pub const UNDERLAY_ADDRS_MAP: &str = "underlay_addrs";
/// Capacity of [`UNDERLAY_ADDRS_MAP`].
pub const UNDERLAY_ADDRS_MAX_ENTRIES: u32 = 16;
/// `BPF_MAP_TYPE_PERCPU_ARRAY` of `u64`, indexed by [`Counter`].
pub const COUNTERS_MAP: &str = "counters";

/// What the program did with a frame; the index into [`COUNTERS_MAP`].
///
/// The discriminants are the `enum counter` values in `steer.bpf.c`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Counter {
    /// Geneve for one of our underlay addresses, redirected to an AF_XDP socket.
    Redirected = 0,
    /// Geneve for us, but no socket is bound on the receiving queue: passed to the kernel.
    RedirectFailed = 1,
    /// Shorter than the headers being parsed.
    PassedTruncated = 2,
    /// Not IPv6: ARP, IPv4, LLDP, ...
    PassedNotIpv6 = 3,
    /// IPv6 whose next header is not UDP (NDP, ICMPv6, TCP, extension headers).
    PassedNotUdp = 4,
    /// UDP to a port other than 6081.
    PassedNotGeneve = 5,
    /// Geneve to an address that is not one of this sled's underlay addresses.
    PassedNotOurs = 6,
    /// 802.1Q or 802.1ad tagged: the engine parses untagged underlay frames only,
    /// so tagged ones are the kernel's (a VLAN interface may take them).
    PassedVlanTagged = 7,
}

impl Counter {
    /// Every counter, in map index order.
    pub const ALL: [Counter; 8] = [
        Counter::Redirected,
        Counter::RedirectFailed,
        Counter::PassedTruncated,
        Counter::PassedNotIpv6,
        Counter::PassedNotUdp,
        Counter::PassedNotGeneve,
        Counter::PassedNotOurs,
        Counter::PassedVlanTagged,
    ];

    /// The counter's name as used in stats output and docs.
    pub fn name(self) -> &'static str {
        match self {
            Counter::Redirected => "redirected",
            Counter::RedirectFailed => "redirect_failed",
            Counter::PassedTruncated => "passed_truncated",
            Counter::PassedNotIpv6 => "passed_not_ipv6",
            Counter::PassedNotUdp => "passed_not_udp",
            Counter::PassedNotGeneve => "passed_not_geneve",
            Counter::PassedNotOurs => "passed_not_ours",
            Counter::PassedVlanTagged => "passed_vlan_tagged",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The object is a 64-bit little-endian ELF for the BPF machine (EM_BPF = 247).
    #[test]
    fn object_is_bpf_elf() {
        assert_eq!(&STEER_OBJECT[..4], b"\x7fELF");
        assert_eq!(STEER_OBJECT[4], 2, "ELFCLASS64");
        assert_eq!(STEER_OBJECT[5], 1, "little endian");
        assert_eq!(
            u16::from_le_bytes([STEER_OBJECT[18], STEER_OBJECT[19]]),
            247
        );
    }

    #[test]
    fn object_is_aligned_for_the_elf_parser() {
        assert_eq!(STEER_OBJECT.as_ptr() as usize % 8, 0);
    }

    /// The names the loader looks up are present in the object's string tables.
    #[test]
    fn object_names_program_and_maps() {
        for name in [
            "xdp.frags",
            PROGRAM_NAME,
            XSKS_MAP,
            UNDERLAY_ADDRS_MAP,
            COUNTERS_MAP,
        ] {
            assert!(
                STEER_OBJECT
                    .windows(name.len())
                    .any(|w| w == name.as_bytes()),
                "{name} missing from the object"
            );
        }
    }

    #[test]
    fn counter_indices_are_dense() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "{}", c.name());
        }
    }
}
