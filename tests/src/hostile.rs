//! The catalogue of hostile frames: for a sled under attack from the underlay and for
//! a port under attack from its own guest, one or more frames of every class of bad
//! input, each with the counter that must count it; and seeded random corruptions of
//! plausible frames. Every frame with room for it carries a [`frames::MARKER`]
//! payload naming its class, so a capture on a guest can tell a leak from legitimate
//! traffic.
//!
//! The expected counter is the specification, not what the code happens to do: a
//! parser that accepts a lie, or a check that is missing, shows up as a counter that
//! did not move (and usually as a marker on a guest).

use crate::frames::{self, Host, Outer, Rng, L3, L4};
use crate::guest::Guest;
use crate::inject::parse_mac;
use crate::{Error, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One hostile frame and the counter (an XDP program counter, an underlay, datapath
/// or port drop reason) that must count it.
#[derive(Clone, Debug)]
pub struct Hostile {
    pub class: &'static str,
    pub frame: Vec<u8>,
    pub expect: &'static str,
}

/// A guest as the frames see it: its MAC and addresses.
#[derive(Clone, Copy, Debug)]
pub struct Party {
    pub mac: [u8; 6],
    pub v4: Option<Ipv4Addr>,
    pub v6: Option<Ipv6Addr>,
}

impl Party {
    pub fn of(g: &Guest) -> Result<Party> {
        Ok(Party {
            mac: parse_mac(&g.spec.mac)?,
            v4: g.spec.ipv4,
            v6: g.spec.ipv6,
        })
    }

    /// As a [`Host`] of IPv4 if it has IPv4, else of IPv6.
    pub fn first_host(&self) -> Result<Host> {
        self.host(self.v4.is_none())
    }

    /// As a [`Host`] of IPv4 (or IPv6 when `v6`).
    pub fn host(&self, v6: bool) -> Result<Host> {
        let ip = if v6 {
            self.v6.map(IpAddr::V6)
        } else {
            self.v4.map(IpAddr::V4)
        };
        ip.map(|ip| Host { mac: self.mac, ip }).ok_or_else(|| {
            Error::new(format!(
                "guest {:02x?} has no IPv{}",
                self.mac,
                if v6 { 6 } else { 4 }
            ))
        })
    }
}

/// A sled under attack from the underlay, and who is who around it.
#[derive(Clone, Copy, Debug)]
pub struct UnderlayTarget {
    pub sled_mac: [u8; 6],
    pub sled_addr: Ipv6Addr,
    /// The MAC the attacker sends from and the underlay address it claims.
    pub rogue_mac: [u8; 6],
    pub rogue_addr: Ipv6Addr,
    /// The VPC of the victim, and another VPC present in the rack.
    pub vni: u32,
    pub foreign_vni: u32,
    /// A dual-stack guest on the sled.
    pub victim: Party,
    /// Another guest of the VPC on the sled (either family).
    pub neighbour: Party,
    /// A dual-stack guest of the same VPC on another sled, and that sled's address:
    /// the identity an attacker would like to borrow.
    pub peer: Party,
    pub peer_sled_addr: Ipv6Addr,
    /// A guest of the other VPC (on either sled).
    pub foreign: Party,
}

/// Payload bytes of every hostile frame (marker included).
const PAYLOAD: usize = 48;
/// An address outside every VPC subnet: traffic from it is denied inbound.
const OUTSIDER_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 66);
const OUTSIDER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x66);
/// A VPC address that no guest has and no V2P entry maps.
const UNMAPPED_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 250);
/// A MAC no port has.
const NOBODY_MAC: [u8; 6] = [0x02, 0xde, 0xad, 0x00, 0x00, 0x01];

fn udp() -> L4 {
    L4::Udp {
        sport: 40000,
        dport: 7777,
    }
}

fn tcp(flags: u8) -> L4 {
    L4::Tcp {
        sport: 40001,
        dport: 7778,
        seq: 0x1000_0000,
        ack: 1,
        flags,
    }
}

/// Collects classes, numbering each frame's marker.
struct Catalogue(Vec<Hostile>);

impl Catalogue {
    fn add(&mut self, class: &'static str, expect: &'static str, frame: Vec<u8>) {
        self.0.push(Hostile {
            class,
            frame,
            expect,
        });
    }

    fn payload(&self, class: &str) -> Vec<u8> {
        frames::marker_payload(class, self.0.len() as u32, PAYLOAD)
    }
}

impl UnderlayTarget {
    fn outer(&self, src: Ipv6Addr, vni: u32) -> Outer {
        Outer {
            src_mac: self.rogue_mac,
            dst_mac: self.sled_mac,
            src,
            dst: self.sled_addr,
            vni,
        }
    }

    /// A frame that is right in every respect but its outer source (the rogue's
    /// address): peer -> victim over IPv4 UDP.
    fn plausible(&self, c: &Catalogue, class: &str, opts: &[u8]) -> Result<Vec<u8>> {
        let inner = frames::inner(
            self.peer.host(false)?,
            self.victim.host(false)?,
            udp(),
            &c.payload(class),
        );
        Ok(frames::geneve(
            &self.outer(self.rogue_addr, self.vni),
            opts,
            &inner,
        ))
    }

    /// Like [`UnderlayTarget::plausible`] with the peer's sled as outer source: right
    /// in every respect, the inner frame aside (`inner` names it).
    fn via_peer_sled(&self, inner: &[u8]) -> Vec<u8> {
        frames::geneve(&self.outer(self.peer_sled_addr, self.vni), &[], inner)
    }

    /// Every deterministic class of hostile underlay frame.
    pub fn classes(&self) -> Result<Vec<Hostile>> {
        let mut c = Catalogue(Vec::new());
        self.truncations(&mut c)?;
        self.lying_outer_lengths(&mut c)?;
        self.geneve_header_and_options(&mut c)?;
        self.outer_ip_layer(&mut c)?;
        self.dispatch(&mut c)?;
        self.lying_inner_lengths(&mut c)?;
        self.spoofing(&mut c)?;
        Ok(c.0)
    }

    /// Frames cut inside or right after each header. "Cut" keeps the length fields
    /// of the whole frame (what a truncation on the wire looks like); "short" ones
    /// have consistent outer lengths around a too-short inner frame.
    fn truncations(&self, c: &mut Catalogue) -> Result<()> {
        let whole = self.plausible(c, "cut", &[])?;
        for (class, len, expect) in [
            ("cut_after_ethernet", 14, "passed_truncated"),
            ("cut_in_outer_ipv6", 34, "passed_truncated"),
            ("cut_in_outer_udp", 58, "passed_truncated"),
            ("cut_after_outer_udp", 62, "truncated"),
            ("cut_in_geneve", 66, "truncated"),
            ("cut_after_geneve", 70, "bad_ipv6_length"),
            ("cut_in_inner_ethernet", 77, "bad_ipv6_length"),
            ("cut_in_payload", whole.len() - 10, "bad_ipv6_length"),
        ] {
            c.add(class, expect, whole[..len].to_vec());
        }
        let inner = frames::inner(
            self.peer.host(false)?,
            self.victim.host(false)?,
            tcp(frames::TCP_ACK),
            &c.payload("short"),
        );
        let outer = self.outer(self.rogue_addr, self.vni);
        for (class, len, expect) in [
            ("short_no_inner_frame", 0, "inner_truncated"),
            ("short_inner_ethernet", 7, "inner_truncated"),
            ("short_inner_ipv4", L3 + 10, "inner_parse_error"),
            ("short_inner_tcp", L3 + 20 + 10, "inner_parse_error"),
        ] {
            c.add(class, expect, frames::geneve(&outer, &[], &inner[..len]));
        }
        Ok(())
    }

    fn lying_outer_lengths(&self, c: &mut Catalogue) -> Result<()> {
        let lie = |c: &mut Catalogue, class, expect, edit: &dyn Fn(&mut Vec<u8>)| -> Result<()> {
            let mut f = self.plausible(c, class, &[])?;
            edit(&mut f);
            c.add(class, expect, f);
            Ok(())
        };
        lie(c, "ipv6_payload_length_long", "bad_ipv6_length", &|f| {
            frames::add16(f, 18, 100);
        })?;
        lie(c, "ipv6_payload_length_short", "bad_udp_length", &|f| {
            frames::add16(f, 18, -4);
        })?;
        lie(c, "udp_length_long", "bad_udp_length", &|f| {
            frames::add16(f, 58, 4);
        })?;
        lie(c, "udp_length_short", "bad_udp_length", &|f| {
            frames::add16(f, 58, -4);
        })?;
        lie(c, "udp_length_header_only", "truncated", &|f| {
            frames::set16(f, 18, 8);
            frames::set16(f, 58, 8);
        })?;
        // Option length 63 words: the options would end past the datagram.
        lie(c, "geneve_options_past_udp", "bad_option_length", &|f| {
            f[frames::GENEVE] |= 0x3f;
        })
    }

    fn geneve_header_and_options(&self, c: &mut Catalogue) -> Result<()> {
        let g = frames::GENEVE;
        for (class, expect, at, bits) in [
            ("geneve_version_1", "bad_geneve_version", g, 0x40u8),
            ("geneve_oam", "geneve_oam", g + 1, 0x80),
        ] {
            let mut f = self.plausible(c, class, &[])?;
            f[at] |= bits;
            c.add(class, expect, f);
        }
        let mut f = self.plausible(c, "geneve_protocol_ipv4", &[])?;
        frames::set16(&mut f, g + 2, frames::ETHERTYPE_IPV4);
        c.add("geneve_protocol_ipv4", "not_ethernet_payload", f);
        let unknown_critical = frames::geneve_option(0x0101, 0x80, &[0; 4]);
        let mut f = self.plausible(c, "unknown_critical_option", &unknown_critical)?;
        f[g + 1] |= 0x40; // C: critical options present
        c.add("unknown_critical_option", "unknown_critical_option", f);
        let oxide_critical = frames::geneve_option(frames::OXIDE_CLASS, 0xff, &[]);
        let f = self.plausible(c, "oxide_unknown_critical_type", &oxide_critical)?;
        c.add("oxide_unknown_critical_type", "unknown_critical_option", f);
        // An option header whose length (3 words) runs past the 1-word options area.
        let mut overrun = frames::geneve_option(0x0101, 0x01, &[]);
        overrun[3] = 3;
        let f = self.plausible(c, "option_past_options_area", &overrun)?;
        c.add("option_past_options_area", "bad_option_length", f);
        let mss_8_bytes = frames::geneve_option(
            frames::OXIDE_CLASS,
            frames::OXIDE_MSS,
            &[0, 0, 0, 0, 0, 0, 5, 0xb4],
        );
        let f = self.plausible(c, "oxide_mss_8_byte_body", &mss_8_bytes)?;
        c.add("oxide_mss_8_byte_body", "bad_option_length", f);
        let external_body =
            frames::geneve_option(frames::OXIDE_CLASS, frames::OXIDE_EXTERNAL, &[0; 4]);
        let f = self.plausible(c, "oxide_external_with_body", &external_body)?;
        c.add("oxide_external_with_body", "bad_option_length", f);
        let replication_3 = frames::geneve_option(
            frames::OXIDE_CLASS,
            frames::OXIDE_MULTICAST,
            &[0xc0, 0, 0, 0],
        );
        let f = self.plausible(c, "multicast_replication_3", &replication_3)?;
        c.add("multicast_replication_3", "bad_multicast_replication", f);
        for (class, mss) in [("mss_0", 0), ("mss_above_65535", 70_000)] {
            let f = self.plausible(c, class, &frames::mss_option(mss))?;
            c.add(class, "bad_mss_value", f);
        }
        // Mss 1 parses; what stops it is the forged source.
        let f = self.plausible(c, "mss_1", &frames::mss_option(1))?;
        c.add("mss_1", "underlay_src_mismatch", f);
        // An unknown non-critical option is skipped: the frame then fails dispatch
        // (its inner destination is no port), not the option walk.
        let noncritical = frames::geneve_option(0x0101, 0x01, &[0; 4]);
        let inner = frames::inner(
            self.peer.host(false)?,
            Host {
                mac: NOBODY_MAC,
                ip: self.victim.host(false)?.ip,
            },
            udp(),
            &c.payload("x"),
        );
        let f = frames::geneve(&self.outer(self.rogue_addr, self.vni), &noncritical, &inner);
        c.add("unknown_noncritical_option", "no_port_for_vni_mac", f);
        Ok(())
    }

    /// Outer layers the XDP program leaves to the kernel, and outer IPv6 lies it
    /// steers to the engine.
    fn outer_ip_layer(&self, c: &mut Catalogue) -> Result<()> {
        let whole = self.plausible(c, "outer_fragment", &[])?;
        let (first, last) = fragments(&whole);
        c.add("outer_fragment_first", "passed_not_udp", first);
        c.add("outer_fragment_last", "passed_not_udp", last);
        c.add(
            "outer_hop_by_hop",
            "passed_not_udp",
            with_hop_by_hop(&self.plausible(c, "outer_hop_by_hop", &[])?),
        );
        let mut f = self.plausible(c, "outer_ethertype_ipv4", &[])?;
        frames::set16(&mut f, 12, frames::ETHERTYPE_IPV4);
        c.add("outer_ethertype_ipv4", "passed_not_ipv6", f);
        let f = self.plausible(c, "outer_vlan_tagged", &[])?;
        let mut tagged = f[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        tagged.extend_from_slice(&f[12..]);
        c.add("outer_vlan_tagged", "passed_vlan_tagged", tagged);
        let mut f = self.plausible(c, "outer_ipv6_version_4", &[])?;
        f[frames::OUTER_IP] = 0x40;
        c.add("outer_ipv6_version_4", "bad_ipv6_version", f);
        let mut f = self.plausible(c, "outer_udp_port_4789", &[])?;
        frames::set16(&mut f, frames::OUTER_UDP + 2, 4789);
        c.add("outer_udp_port_4789", "passed_not_geneve", f);
        let mut f = self.plausible(c, "outer_dst_other_sled", &[])?;
        f[frames::OUTER_IP + 24..frames::OUTER_IP + 40]
            .copy_from_slice(&self.peer_sled_addr.octets());
        c.add("outer_dst_other_sled", "passed_not_ours", f);
        Ok(())
    }

    /// Frames that parse but name no port, or a port that must refuse them.
    fn dispatch(&self, c: &mut Catalogue) -> Result<()> {
        let (peer, victim) = (self.peer.host(false)?, self.victim.host(false)?);
        let to = |mac: [u8; 6]| Host { mac, ip: victim.ip };
        let inner = |c: &Catalogue, class: &str, dst: Host| {
            frames::inner(peer, dst, udp(), &c.payload(class))
        };
        let f = frames::geneve(
            &self.outer(self.rogue_addr, self.vni + 1),
            &[],
            &inner(c, "wrong_vni", victim),
        );
        c.add("wrong_vni", "no_port_for_vni_mac", f);
        let f = frames::geneve(
            &self.outer(self.rogue_addr, self.foreign_vni),
            &[],
            &inner(c, "victim_mac_in_other_vni", victim),
        );
        c.add("victim_mac_in_other_vni", "no_port_for_vni_mac", f);
        let f = frames::geneve(
            &self.outer(self.rogue_addr, self.vni),
            &[],
            &inner(c, "other_vni_mac_in_our_vni", to(self.foreign.mac)),
        );
        c.add("other_vni_mac_in_our_vni", "no_port_for_vni_mac", f);
        let f = frames::geneve(
            &self.outer(self.rogue_addr, self.vni),
            &[],
            &inner(c, "inner_broadcast", to([0xff; 6])),
        );
        c.add("inner_broadcast", "inner_multicast", f);
        let f = frames::geneve(
            &self.outer(self.rogue_addr, self.vni),
            &[],
            &inner(c, "inner_multicast", to([0x33, 0x33, 0, 0, 0, 1])),
        );
        c.add("inner_multicast", "inner_multicast", f);
        let mut arp = frames::ethernet(self.victim.mac, peer.mac, frames::ETHERTYPE_ARP);
        arp.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 2]);
        arp.extend(c.payload("inner_arp"));
        c.add(
            "inner_arp",
            "inbound_not_ip",
            frames::geneve(&self.outer(self.rogue_addr, self.vni), &[], &arp),
        );
        let neighbour = self.neighbour.first_host()?;
        let v6 = neighbour.ip.is_ipv6();
        let to_neighbour_ip = Host {
            mac: victim.mac,
            ip: neighbour.ip,
        };
        let inner = frames::inner(
            self.peer.host(v6)?,
            to_neighbour_ip,
            udp(),
            &c.payload("inner_dst_not_victim"),
        );
        let f = frames::geneve(&self.outer(self.rogue_addr, self.vni), &[], &inner);
        c.add("inner_dst_not_victim", "inbound_dst_not_guest", f);
        Ok(())
    }

    /// Inner IP and transport headers whose lengths lie; the outer lengths are right.
    fn lying_inner_lengths(&self, c: &mut Catalogue) -> Result<()> {
        for (class, edit) in inner_lies() {
            let v6 = class.starts_with("inner_ipv6");
            let l4 = if class.contains("udp") {
                udp()
            } else {
                tcp(frames::TCP_ACK)
            };
            let mut inner = frames::inner(
                self.peer.host(v6)?,
                self.victim.host(v6)?,
                l4,
                &c.payload(class),
            );
            edit(&mut inner);
            let f = frames::geneve(&self.outer(self.rogue_addr, self.vni), &[], &inner);
            c.add(class, "inner_parse_error", f);
        }
        Ok(())
    }

    /// Frames that are right in every respect but who sent them: the outer source is
    /// not the sled V2P names for the inner source, or the inner source MAC is not
    /// that guest's. (An attacker that forges both the right sled's address and the
    /// right guest is indistinguishable from it without underlay authentication.)
    fn spoofing(&self, c: &mut Catalogue) -> Result<()> {
        for v6 in [false, true] {
            let (peer, victim) = (self.peer.host(v6)?, self.victim.host(v6)?);
            for (class, src) in [
                (
                    if v6 {
                        "outer_src_rogue_v6"
                    } else {
                        "outer_src_rogue"
                    },
                    self.rogue_addr,
                ),
                (
                    if v6 {
                        "outer_src_victim_sled_v6"
                    } else {
                        "outer_src_victim_sled"
                    },
                    self.sled_addr,
                ),
            ] {
                let inner = frames::inner(peer, victim, udp(), &c.payload(class));
                c.add(
                    class,
                    "underlay_src_mismatch",
                    frames::geneve(&self.outer(src, self.vni), &[], &inner),
                );
            }
        }
        let peer = self.peer.host(false)?;
        let wrong_mac = Host {
            mac: self.neighbour.mac,
            ip: peer.ip,
        };
        let neighbour = self.neighbour.first_host()?;
        let unmapped = Host {
            mac: peer.mac,
            ip: IpAddr::V4(UNMAPPED_V4),
        };
        for (class, src) in [
            ("inner_src_mac_not_the_guests", wrong_mac),
            ("inner_src_guest_of_this_sled", neighbour),
            ("inner_src_unmapped", unmapped),
        ] {
            let victim = self.victim.host(src.ip.is_ipv6())?;
            let inner = frames::inner(src, victim, udp(), &c.payload(class));
            c.add(class, "underlay_src_mismatch", self.via_peer_sled(&inner));
        }
        Ok(())
    }

    /// Segments for a live connection peer:`sport` -> victim:`dport` that only the
    /// sequence numbers betray: sent as the peer's own sled would (outer source, VNI,
    /// the peer's MAC and address all right), a blind attacker's guess of where the
    /// stream is. `seq` and `ack` are the connection's current values: the segments
    /// use the half of the sequence space opposite `seq`, so no window can hold
    /// them, and keep the valid `ack`.
    pub fn blind_injection(
        &self,
        sport: u16,
        dport: u16,
        seq: u32,
        ack: u32,
    ) -> Result<Vec<Hostile>> {
        let mut c = Catalogue(Vec::new());
        let (peer, victim) = (self.peer.host(false)?, self.victim.host(false)?);
        let far = seq.wrapping_add(1 << 31);
        for (class, flags) in [
            (
                "blind_data_out_of_window",
                frames::TCP_ACK | frames::TCP_PSH,
            ),
            ("blind_rst_out_of_window", frames::TCP_RST | frames::TCP_ACK),
            ("blind_fin_out_of_window", frames::TCP_FIN | frames::TCP_ACK),
        ] {
            let l4 = L4::Tcp {
                sport,
                dport,
                seq: far,
                ack,
                flags,
            };
            let inner = frames::inner(peer, victim, l4, &c.payload(class));
            c.add(class, "tcp_out_of_window", self.via_peer_sled(&inner));
        }
        Ok(c.0)
    }

    /// Plausible frames (outer and inner right, from a source outside the VPC, so
    /// the victim's firewall refuses them even whole) for [`random_corruptions`].
    /// Returns each with the offset where its payload marker starts.
    pub fn random_bases(&self) -> Result<Vec<(Vec<u8>, usize)>> {
        let victim4 = self.victim.host(false)?;
        let victim6 = self.victim.host(true)?;
        let out4 = Host {
            mac: self.peer.mac,
            ip: IpAddr::V4(OUTSIDER_V4),
        };
        let out6 = Host {
            mac: self.peer.mac,
            ip: IpAddr::V6(OUTSIDER_V6),
        };
        let mut opts = frames::mss_option(1448);
        opts.extend(frames::geneve_option(
            frames::OXIDE_CLASS,
            frames::OXIDE_EXTERNAL,
            &[],
        ));
        opts.extend(frames::geneve_option(
            frames::OXIDE_CLASS,
            frames::OXIDE_MULTICAST,
            &[0x40, 0, 0, 0],
        ));
        let payload = frames::marker_payload("random", 0, PAYLOAD);
        let outer = self.outer(self.rogue_addr, self.vni);
        let mut bases = Vec::new();
        for (src, dst, l4, options) in [
            (out4, victim4, udp(), &[][..]),
            (out4, victim4, tcp(frames::TCP_SYN), &opts[..]),
            (
                out6,
                victim6,
                tcp(frames::TCP_ACK | frames::TCP_PSH),
                &opts[..8],
            ),
            (out6, victim6, L4::Echo { id: 1, seq: 1 }, &[][..]),
        ] {
            let f = frames::geneve(&outer, options, &frames::inner(src, dst, l4, &payload));
            bases.push((f.clone(), f.len() - PAYLOAD));
        }
        Ok(bases)
    }
}

/// An edit that makes a frame lie.
pub type Lie = fn(&mut Vec<u8>);

/// The inner-header lies, by class: each edits a whole inner frame (IPv4 unless the
/// class says IPv6) so that exactly one length field is wrong, the IPv4 header
/// checksum being recomputed so that it is not what gets the frame refused.
pub fn inner_lies() -> Vec<(&'static str, Lie)> {
    fn v4(f: &mut [u8], edit: impl Fn(&mut [u8])) {
        edit(f);
        frames::fill_ipv4_checksum(f, L3);
    }
    vec![
        ("inner_ipv4_total_length_long", |f| {
            v4(f, |f| frames::add16(f, L3 + 2, 40));
        }),
        ("inner_ipv4_total_length_below_header", |f| {
            v4(f, |f| frames::set16(f, L3 + 2, 19));
        }),
        ("inner_ipv4_ihl_4", |f| v4(f, |f| f[L3] = 0x44)),
        ("inner_ipv4_ihl_15", |f| v4(f, |f| f[L3] = 0x4f)),
        ("inner_ipv4_bad_header_checksum", |f| f[L3 + 10] ^= 0x55),
        ("inner_ipv4_version_6", |f| v4(f, |f| f[L3] = 0x65)),
        ("inner_tcp_data_offset_4", |f| f[L3 + 20 + 12] = 0x40),
        // 60 bytes of TCP header in a 28-byte segment (the rest of the frame is
        // Ethernet padding as far as the IP length goes).
        ("inner_tcp_data_offset_15", |f| {
            v4(f, |f| {
                f[L3 + 20 + 12] = 0xf0;
                frames::set16(f, L3 + 2, 20 + 28);
            });
        }),
        ("inner_udp_length_long", |f| {
            frames::add16(f, L3 + 20 + 4, 40);
        }),
        ("inner_udp_length_7", |f| frames::set16(f, L3 + 20 + 4, 7)),
        ("inner_ipv6_payload_length_long", |f| {
            frames::add16(f, L3 + 4, 40);
        }),
        ("inner_ipv6_cut_tcp_header", |f| {
            frames::set16(f, L3 + 4, 10);
            f.truncate(L3 + 40 + 10);
        }),
    ]
}

/// The outer IPv6 packet of `frame` in two fragments (RFC 8200 fragment header, the
/// first carrying 48 bytes of the UDP datagram).
fn fragments(frame: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let udp = &frame[frames::OUTER_UDP..];
    let split = 48.min(udp.len());
    let frag = |offset: usize, more: bool, body: &[u8]| {
        let mut f = frame[..frames::OUTER_UDP].to_vec();
        f[frames::OUTER_IP + 6] = frames::PROTO_FRAGMENT;
        frames::set16(&mut f, 18, (8 + body.len()) as u16);
        f.extend_from_slice(&[frames::PROTO_UDP, 0]);
        f.extend_from_slice(&(((offset / 8) << 3) as u16 | u16::from(more)).to_be_bytes());
        f.extend_from_slice(&0x4242_4242u32.to_be_bytes());
        f.extend_from_slice(body);
        f
    };
    (
        frag(0, true, &udp[..split]),
        frag(split, false, &udp[split..]),
    )
}

/// `frame` with an 8-byte hop-by-hop options header (one PadN) before its UDP header.
fn with_hop_by_hop(frame: &[u8]) -> Vec<u8> {
    let mut f = frame[..frames::OUTER_UDP].to_vec();
    f[frames::OUTER_IP + 6] = frames::PROTO_HOP_BY_HOP;
    frames::set16(&mut f, 18, frames::be16(frame, 18) + 8);
    f.extend_from_slice(&[frames::PROTO_UDP, 0, 1, 4, 0, 0, 0, 0]);
    f.extend_from_slice(&frame[frames::OUTER_UDP..]);
    f
}

/// `n` frames: the bases in turn, each with a few header bytes (after the Ethernet
/// addresses, before the payload marker) overwritten and sometimes cut short, from
/// generator `seed` (the same seed gives the same frames).
pub fn random_corruptions(bases: &[(Vec<u8>, usize)], seed: u64, n: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|i| {
            let (base, marker) = &bases[i % bases.len()];
            frames::corrupt(base, &mut rng, 12, *marker)
        })
        .collect()
}

/// A port under attack from its own guest, and who is who around it.
#[derive(Clone, Copy, Debug)]
pub struct GuestTarget {
    /// The hostile guest (dual-stack port; its own kernel is mute).
    pub me: Party,
    pub gateway_mac: [u8; 6],
    /// A guest on the same sled, one on the other sled, one of another VPC.
    pub local: Party,
    pub remote: Party,
    pub foreign: Party,
}

impl GuestTarget {
    /// Every deterministic class of hostile guest frame.
    pub fn classes(&self) -> Result<Vec<Hostile>> {
        let mut c = Catalogue(Vec::new());
        self.guest_truncations(&mut c)?;
        self.guest_lies(&mut c)?;
        self.guest_spoofing(&mut c)?;
        self.guest_gateway_abuse(&mut c)?;
        Ok(c.0)
    }

    /// Own MAC and address, through the gateway, to `dst`'s address.
    fn own(&self, c: &Catalogue, class: &str, dst: &Party, v6: bool, l4: L4) -> Result<Vec<u8>> {
        let src = self.me.host(v6)?;
        let dst = Host {
            mac: self.gateway_mac,
            ip: dst.host(v6)?.ip,
        };
        Ok(frames::inner(src, dst, l4, &c.payload(class)))
    }

    fn guest_truncations(&self, c: &mut Catalogue) -> Result<()> {
        let whole = self.own(c, "guest_cut", &self.remote, false, tcp(frames::TCP_SYN))?;
        c.add(
            "guest_cut_after_ethernet",
            "guest_parse_error",
            whole[..14].to_vec(),
        );
        c.add(
            "guest_cut_in_ipv4",
            "guest_parse_error",
            whole[..L3 + 10].to_vec(),
        );
        c.add(
            "guest_cut_in_tcp",
            "guest_parse_error",
            whole[..L3 + 30].to_vec(),
        );
        let whole6 = self.own(c, "guest_cut6", &self.remote, true, udp())?;
        c.add(
            "guest_cut_in_ipv6",
            "guest_parse_error",
            whole6[..L3 + 30].to_vec(),
        );
        c.add(
            "guest_cut_in_udp6",
            "guest_parse_error",
            whole6[..L3 + 44].to_vec(),
        );
        Ok(())
    }

    fn guest_lies(&self, c: &mut Catalogue) -> Result<()> {
        for (class, edit) in inner_lies() {
            let v6 = class.starts_with("inner_ipv6");
            let l4 = if class.contains("udp") {
                udp()
            } else {
                tcp(frames::TCP_SYN)
            };
            let mut f = self.own(c, class, &self.remote, v6, l4)?;
            edit(&mut f);
            c.add(class, "guest_parse_error", f);
        }
        Ok(())
    }

    fn guest_spoofing(&self, c: &mut Catalogue) -> Result<()> {
        let remote = self.remote.host(false)?;
        let to_remote = Host {
            mac: self.gateway_mac,
            ip: remote.ip,
        };
        let me = self.me.host(false)?;
        let spoof = |c: &Catalogue, class: &str, src: Host, dst: Host| {
            frames::inner(src, dst, udp(), &c.payload(class))
        };
        let f = spoof(
            c,
            "guest_src_mac_of_neighbour",
            Host {
                mac: self.local.mac,
                ip: me.ip,
            },
            to_remote,
        );
        c.add("guest_src_mac_of_neighbour", "spoofed_src_mac", f);
        let f = spoof(
            c,
            "guest_src_ip_of_neighbour",
            Host {
                mac: me.mac,
                ip: self.local.host(false)?.ip,
            },
            to_remote,
        );
        c.add("guest_src_ip_of_neighbour", "spoofed_src_ip", f);
        let f = spoof(
            c,
            "guest_src_ip_unmapped",
            Host {
                mac: me.mac,
                ip: IpAddr::V4(UNMAPPED_V4),
            },
            to_remote,
        );
        c.add("guest_src_ip_unmapped", "spoofed_src_ip", f);
        let f = spoof(
            c,
            "guest_dst_mac_of_peer",
            me,
            Host {
                mac: remote.mac,
                ip: remote.ip,
            },
        );
        c.add("guest_dst_mac_of_peer", "dst_mac_not_gateway", f);
        let f = spoof(
            c,
            "guest_dst_mac_other_vni",
            me,
            Host {
                mac: self.foreign.mac,
                ip: remote.ip,
            },
        );
        c.add("guest_dst_mac_other_vni", "dst_mac_not_gateway", f);
        let f = self.own(c, "guest_dst_ip_other_vni", &self.foreign, false, udp())?;
        c.add("guest_dst_ip_other_vni", "no_v2p", f);
        Ok(())
    }

    /// ARP and NDP the gateway must refuse, and a packet above the path MTU.
    fn guest_gateway_abuse(&self, c: &mut Catalogue) -> Result<()> {
        let me = self.me.host(false)?;
        let local_ip = self.local.v4.map_or([0; 4], |a| a.octets());
        let my_ip = self.me.v4.map_or([0; 4], |a| a.octets());
        // A gratuitous reply claiming the neighbour's address, and a request for it.
        for (class, op, sender) in [
            ("guest_gratuitous_arp_for_neighbour", 2u8, local_ip),
            ("guest_arp_for_neighbour", 1, my_ip),
        ] {
            let mut f = frames::ethernet([0xff; 6], me.mac, frames::ETHERTYPE_ARP);
            f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, op]);
            f.extend_from_slice(&me.mac);
            f.extend_from_slice(&sender);
            f.extend_from_slice(&[0; 6]);
            f.extend_from_slice(&local_ip);
            f.extend(c.payload(class));
            c.add(class, "denied_arp", f);
        }
        // A Router Advertisement from the guest (type 134 to all-nodes).
        let all_nodes = Host {
            mac: [0x33, 0x33, 0, 0, 0, 1],
            ip: "ff02::1".parse().map_err(|e| Error::new(format!("{e}")))?,
        };
        let ll = Host {
            mac: me.mac,
            ip: "fe80::66".parse().map_err(|e| Error::new(format!("{e}")))?,
        };
        let mut ra = frames::inner(
            ll,
            all_nodes,
            L4::Echo { id: 0, seq: 0 },
            &c.payload("guest_router_advertisement"),
        );
        ra[L3 + 40] = 134;
        frames::fill_l4_checksum(&mut ra, L3);
        c.add("guest_router_advertisement", "denied_ndp", ra);
        // 8600 bytes of IPv4 with DF set: above the 8500-byte port MTU.
        let src = self.me.host(false)?;
        let dst = Host {
            mac: self.gateway_mac,
            ip: self.remote.host(false)?.ip,
        };
        let f = frames::inner(
            src,
            dst,
            udp(),
            &frames::marker_payload("guest_above_port_mtu", c.0.len() as u32, 8600 - 28),
        );
        c.add("guest_above_port_mtu", "packet_too_big", f);
        Ok(())
    }

    /// Plausible frames from the guest itself to a VPC address nobody has (refused
    /// as `no_v2p` even whole), for [`random_corruptions`]; each with its payload
    /// marker's offset.
    pub fn random_bases(&self) -> Result<Vec<(Vec<u8>, usize)>> {
        let me = self.me.host(false)?;
        let nobody = Host {
            mac: self.gateway_mac,
            ip: IpAddr::V4(UNMAPPED_V4),
        };
        let payload = frames::marker_payload("guest_random", 0, PAYLOAD);
        Ok([udp(), tcp(frames::TCP_SYN), L4::Echo { id: 7, seq: 1 }]
            .into_iter()
            .map(|l4| {
                let f = frames::inner(me, nobody, l4, &payload);
                let marker = f.len() - PAYLOAD;
                (f, marker)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn party(n: u8, v6: bool) -> Party {
        Party {
            mac: [0xa8, 0x40, 0x25, 0xf0, 0, n],
            v4: Some(Ipv4Addr::new(10, 0, 0, 10 + n)),
            v6: v6.then(|| Ipv6Addr::new(0xfd00, 1, 0, 0, 0, 0, 0, 10 + u16::from(n))),
        }
    }

    fn underlay() -> UnderlayTarget {
        UnderlayTarget {
            sled_mac: [2, 0, 0, 0, 0, 1],
            sled_addr: "fd00:99::1".parse().unwrap(),
            rogue_mac: crate::inject::ROGUE_MAC,
            rogue_addr: crate::inject::ROGUE_ADDR,
            vni: 10,
            foreign_vni: 20,
            victim: party(1, true),
            neighbour: party(2, false),
            peer: party(3, true),
            peer_sled_addr: "fd00:99::2".parse().unwrap(),
            foreign: party(10, true),
        }
    }

    fn guest() -> GuestTarget {
        GuestTarget {
            me: party(5, true),
            gateway_mac: [0xa8, 0x40, 0x25, 0xff, 0x77, 0x77],
            local: party(1, true),
            remote: party(3, true),
            foreign: party(10, true),
        }
    }

    /// The catalogue agrees with the XDP model: a class expected to be passed to the
    /// kernel is, under that counter, and every other class reaches the engine.
    #[test]
    fn underlay_classes_reach_the_layer_that_must_count_them() {
        let t = underlay();
        let classes = t.classes().unwrap();
        assert!(classes.len() > 50, "{} classes", classes.len());
        for h in &classes {
            let verdict = frames::xdp_verdict(&h.frame, &[t.sled_addr]);
            if h.expect.starts_with("passed_") {
                assert_eq!(verdict, h.expect, "{}", h.class);
            } else {
                assert_eq!(verdict, "redirected", "{}", h.class);
            }
            assert!(
                (14..=9014).contains(&h.frame.len()),
                "{}: {} bytes",
                h.class,
                h.frame.len()
            );
            assert_eq!(
                &h.frame[6..12],
                &t.rogue_mac,
                "{}: sent from the rogue",
                h.class
            );
            assert_eq!(&h.frame[..6], &t.sled_mac, "{}: sent to the sled", h.class);
        }
    }

    #[test]
    fn class_names_are_unique_and_marked_frames_name_their_class() {
        for classes in [underlay().classes().unwrap(), guest().classes().unwrap()] {
            let mut seen = HashSet::new();
            for h in &classes {
                assert!(seen.insert(h.class), "{} twice", h.class);
                if let Some(m) = frames::find_marker(&h.frame) {
                    assert!(
                        m.starts_with(h.class) || m.contains('#'),
                        "{}: {m}",
                        h.class
                    );
                }
            }
        }
    }

    #[test]
    fn guest_classes_are_sent_from_the_guest() {
        let t = guest();
        for h in t.classes().unwrap() {
            assert!(h.frame.len() >= 14, "{}", h.class);
            let from_me = h.frame[6..12] == t.me.mac;
            assert_eq!(from_me, h.expect != "spoofed_src_mac", "{}", h.class);
        }
    }

    /// The bases pass every check but the last (the firewall or V2P), and random
    /// corruption keeps the addresses and the marker.
    #[test]
    fn random_bases_are_whole_and_corruptions_keep_addresses_and_markers() {
        let t = underlay();
        let bases = t.random_bases().unwrap();
        for (b, marker) in &bases {
            assert_eq!(frames::xdp_verdict(b, &[t.sled_addr]), "redirected");
            assert_eq!(
                frames::find_marker(&b[*marker..]).as_deref(),
                Some("random#0")
            );
        }
        let frames = random_corruptions(&bases, 7, 1000);
        assert_eq!(frames, random_corruptions(&bases, 7, 1000));
        assert_ne!(frames, random_corruptions(&bases, 8, 1000));
        let marked = frames
            .iter()
            .filter(|f| frames::find_marker(f).is_some())
            .count();
        assert!(marked > 800, "{marked} of 1000 keep their marker");
        assert!(frames.iter().all(|f| f[..12] == bases[0].0[..12]));
        assert!(!guest().random_bases().unwrap().is_empty());
    }
}
