//! The MTU budget of a port: how the port MTU, the underlay MTU and Geneve
//! encapsulation fit together, and the path MTU toward the internet gateway.

use crate::vpc::port::PortConfig;

/// Bytes the overlay adds on top of the guest's IP packet inside the underlay MTU:
/// [`wire::geneve::ENCAP_LEN_WITH_MSS`] (78), as a `u16` for MTU arithmetic. The
/// underlay MTU limits the outer IP packet: outer IPv6 40 + UDP 8 + Geneve 8 + Mss
/// option 8 + the inner Ethernet header 14, which is the same 78 as the outer
/// Ethernet header plus the rest, since both Ethernet headers are 14 bytes.
pub(crate) const ENCAP_BUDGET: u16 = wire::geneve::ENCAP_LEN_WITH_MSS as u16;

const IPV4_HDR: u16 = 20;
const IPV6_HDR: u16 = 40;
const TCP_HDR: u16 = 20;
/// The TCP timestamps option as Linux sends it (NOP NOP TS = 12 bytes).
const TCP_TIMESTAMPS: u16 = 12;
/// The path MTU of traffic leaving the rack unless both jumbo flags are set.
pub const EXTERNAL_DEFAULT_MTU: u16 = 1500;

/// How a port's MTU fits the underlay; every number in bytes.
#[derive(serde::Serialize, Clone, Debug, PartialEq, Eq)]
pub struct MtuBudget {
    pub underlay_mtu: u16,
    /// [`ENCAP_BUDGET`]: outer IPv6 40 + UDP 8 + Geneve 8 + Mss option 8 + inner
    /// Ethernet 14.
    pub encap_overhead: u16,
    pub port_mtu: u16,
    /// The link MTU a VM's virtio-net device must advertise (QEMU
    /// `virtio-net-pci,host_mtu=N`): the port MTU. Linux never raises a link MTU
    /// from an RA, so a device that advertises less keeps the VM's IPv6 below the
    /// port's MTU whatever the RA says.
    pub virtio_host_mtu: u16,
    /// underlay_mtu - encap_overhead - port_mtu; negative means a full-size guest
    /// packet cannot cross the underlay.
    pub headroom: i32,
    /// Largest TCP payload of one tunneled-TSO segment inside the VPC with an inner
    /// IPv4 header of 20 and a TCP header of 20 (no options): underlay - 78 - 40.
    /// Each byte of TCP options (12 for timestamps) comes off this.
    pub max_internal_tcp_segment_v4: i32,
    /// The same with timestamps (inner IPv4 20 + TCP 32): underlay - 78 - 52.
    pub max_internal_tcp_segment_v4_timestamps: i32,
    /// Inner IPv6 40 + TCP 20, no options: underlay - 78 - 60.
    pub max_internal_tcp_segment_v6: i32,
    /// Path MTU toward the internet gateway (see [`external_path_mtu`]).
    pub external_path_mtu: u16,
    pub sled_external_jumbo: bool,
    pub port_external_jumbo: bool,
    pub warnings: Vec<String>,
}

/// Path MTU toward the internet gateway: 1500 unless both the sled-wide and the
/// port's external jumbo flags are set, then the port MTU (external networks are not
/// known to carry more than 1500 unless the operator says so for both ends).
pub fn external_path_mtu(cfg: &PortConfig, sled_external_jumbo: bool) -> u16 {
    if sled_external_jumbo && cfg.external_jumbo {
        cfg.mtu
    } else {
        EXTERNAL_DEFAULT_MTU.min(cfg.mtu)
    }
}

/// The budget of `cfg` over an underlay of `underlay_mtu`, with warnings for
/// configurations that will drop or fragment traffic.
pub fn mtu_budget(cfg: &PortConfig, underlay_mtu: u16, sled_external_jumbo: bool) -> MtuBudget {
    let u = i32::from(underlay_mtu);
    let enc = i32::from(ENCAP_BUDGET);
    let headroom = u - enc - i32::from(cfg.mtu);
    let mut warnings = Vec::new();
    if headroom < 0 {
        warnings.push(format!(
            "port MTU {} + encapsulation {} = {} exceeds underlay MTU {}: full-size guest packets cannot cross the underlay; lower the port MTU to at most {}",
            cfg.mtu,
            ENCAP_BUDGET,
            i32::from(cfg.mtu) + enc,
            underlay_mtu,
            u - enc
        ));
    }
    let ext = external_path_mtu(cfg, sled_external_jumbo);
    if cfg.external_jumbo && !sled_external_jumbo {
        warnings.push(format!(
            "port asks for external jumbo frames but the sled flag is off: external path MTU stays {ext}"
        ));
    }
    if ext < cfg.mtu {
        warnings.push(format!(
            "external path MTU {ext} is below the port MTU {}: large packets to the internet get ICMP packet-too-big / fragmentation-needed from the gateway",
            cfg.mtu
        ));
    }
    MtuBudget {
        underlay_mtu,
        encap_overhead: ENCAP_BUDGET,
        port_mtu: cfg.mtu,
        virtio_host_mtu: cfg.mtu,
        headroom,
        max_internal_tcp_segment_v4: u - enc - i32::from(IPV4_HDR + TCP_HDR),
        max_internal_tcp_segment_v4_timestamps: u
            - enc
            - i32::from(IPV4_HDR + TCP_HDR + TCP_TIMESTAMPS),
        max_internal_tcp_segment_v6: u - enc - i32::from(IPV6_HDR + TCP_HDR),
        external_path_mtu: ext,
        sled_external_jumbo,
        port_external_jumbo: cfg.external_jumbo,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::sample;
    use super::*;

    #[test]
    fn reference_numbers_for_9000_underlay() {
        let cfg = sample();
        let b = mtu_budget(&cfg, 9000, false);
        assert_eq!(b.headroom, 9000 - 78 - 8500);
        // The facts file's example: IPv4 + TCP with timestamps -> 8870.
        assert_eq!(b.max_internal_tcp_segment_v4_timestamps, 8870);
        assert_eq!(b.max_internal_tcp_segment_v4, 8882);
        assert_eq!(b.max_internal_tcp_segment_v6, 8862);
        assert_eq!(b.external_path_mtu, 1500);
        assert_eq!(b.warnings.len(), 1, "{:?}", b.warnings);
        assert!(b.warnings[0].contains("1500"));
    }

    #[test]
    fn too_large_port_mtu_warns_with_numbers() {
        let mut cfg = sample();
        cfg.mtu = 9000;
        let b = mtu_budget(&cfg, 9000, true);
        assert_eq!(b.headroom, -78);
        assert!(
            b.warnings
                .iter()
                .any(|w| w.contains("9078") && w.contains("8922")),
            "{:?}",
            b.warnings
        );
    }

    #[test]
    fn external_jumbo_needs_both_flags() {
        let mut cfg = sample();
        assert_eq!(external_path_mtu(&cfg, true), 1500);
        cfg.external_jumbo = true;
        assert_eq!(external_path_mtu(&cfg, false), 1500);
        assert_eq!(external_path_mtu(&cfg, true), 8500);
        let b = mtu_budget(&cfg, 9000, true);
        assert!(b.warnings.is_empty(), "{:?}", b.warnings);
        let b = mtu_budget(&cfg, 9000, false);
        assert!(b.warnings.iter().any(|w| w.contains("sled flag is off")));
    }
}
