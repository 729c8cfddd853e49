//! The MTU inspection verbs as an operator reads them: `mtu PORT` as the
//! arithmetic it is (underlay MTU − encapsulation = what a guest packet may use,
//! the port MTU, the headroom left), and `ra PORT` as the advertisement a guest
//! receives, with times in milliseconds ago rather than the engine's clock. The
//! replies are the engine's JSON as it is (what `--json` prints); a reply of
//! another shape (a daemon of another version) is printed as plain `key: value`
//! lines instead.

use super::layout::render_value;
use api::{Reply, Request};
use serde::Deserialize;
use std::fmt::Write as _;
use std::net::Ipv6Addr;
use wire::ndp::RaSummary;

/// The text for `request`'s reply if it is `mtu` or `ra`, else `None`.
pub(super) fn render(request: &Request, reply: &Reply) -> Option<String> {
    let Reply::Inspect(v) = reply else {
        return None;
    };
    let text = match request {
        Request::Mtu { port } => serde_json::from_value(v.clone())
            .ok()
            .map(|b: MtuBudget| b.render(port)),
        Request::Ra { port } => serde_json::from_value(v.clone())
            .ok()
            .map(|r: RaInfo| r.render(port)),
        _ => return None,
    };
    Some(text.unwrap_or_else(|| {
        let mut out = String::new();
        render_value(&mut out, v, 0);
        out
    }))
}

/// The fields of the engine's `MtuBudget` this prints.
#[derive(Debug, Deserialize)]
struct MtuBudget {
    underlay_mtu: u16,
    encap_overhead: u16,
    port_mtu: u16,
    virtio_host_mtu: u16,
    headroom: i32,
    max_internal_tcp_segment_v4: i32,
    max_internal_tcp_segment_v4_timestamps: i32,
    max_internal_tcp_segment_v6: i32,
    external_path_mtu: u16,
    sled_external_jumbo: bool,
    port_external_jumbo: bool,
    #[serde(default)]
    warnings: Vec<String>,
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

impl MtuBudget {
    fn render(&self, port: &str) -> String {
        let mut out = String::new();
        let available = i32::from(self.underlay_mtu) - i32::from(self.encap_overhead);
        let _ = writeln!(
            out,
            "MTU budget of {port}: underlay {} - {} overhead = {available} available, port {}, headroom {}",
            self.underlay_mtu, self.encap_overhead, self.port_mtu, self.headroom
        );
        let rows: [(&str, String, String); 5] = [
            (
                "underlay MTU",
                self.underlay_mtu.to_string(),
                "the smallest MTU of the underlay links".into(),
            ),
            (
                "- overhead",
                self.encap_overhead.to_string(),
                "outer IPv6 40 + UDP 8 + Geneve 8 + Mss option 8 + inner Ethernet 14".into(),
            ),
            (
                "= available",
                available.to_string(),
                "the largest guest IP packet the underlay carries whole".into(),
            ),
            (
                "port MTU",
                self.port_mtu.to_string(),
                format!(
                    "offered to the guest by DHCP and RA; a VM's virtio-net host_mtu={}",
                    self.virtio_host_mtu
                ),
            ),
            (
                "headroom",
                self.headroom.to_string(),
                if self.headroom < 0 {
                    "negative: full-size guest packets cannot cross the underlay".into()
                } else {
                    "available - port MTU".into()
                },
            ),
        ];
        for (name, value, why) in rows {
            let _ = writeln!(out, "  {name:<14}{value:>6}  {why}");
        }
        let _ = writeln!(
            out,
            "largest TCP segment inside the VPC (tunneled TSO): IPv4 {} ({} with timestamps), IPv6 {}",
            self.max_internal_tcp_segment_v4,
            self.max_internal_tcp_segment_v4_timestamps,
            self.max_internal_tcp_segment_v6
        );
        let _ = writeln!(
            out,
            "external path MTU {} (external jumbo: sled {}, port {}; the port MTU only with both on)",
            self.external_path_mtu,
            on_off(self.sled_external_jumbo),
            on_off(self.port_external_jumbo)
        );
        for w in &self.warnings {
            let _ = writeln!(out, "warning: {w}");
        }
        out
    }
}

/// The fields of the engine's `RaInfo` (and the `RaSummary` flattened into it)
/// this prints, with the daemon's `last_sent_ms_ago`.
#[derive(Debug, Deserialize)]
struct RaInfo {
    source: Ipv6Addr,
    source_mac: String,
    unsolicited_destination: Ipv6Addr,
    ip_hop_limit: u8,
    #[serde(flatten)]
    ra: RaSummary,
    last_sent_mtu: Option<u16>,
    last_sent_ms_ago: Option<u64>,
    solicited_sent: u64,
    unsolicited_sent: u64,
    mtu_change_sent: u64,
    min_interval_s: u64,
    max_interval_s: u64,
}

/// A time field of an RA, where 0 means the host keeps its own value.
fn ms_or_unspecified(ms: u32) -> String {
    if ms == 0 {
        "unspecified (the host's own)".into()
    } else {
        format!("{ms} ms")
    }
}

impl RaInfo {
    fn render(&self, port: &str) -> String {
        let ra = &self.ra;
        let mut out = format!(
            "Router Advertisement of {port}, from {} ({})\n",
            self.source, self.source_mac
        );
        let mut row = |name: &str, value: String| {
            let _ = writeln!(out, "  {name:<18}{value}");
        };
        row(
            "MTU",
            ra.mtu.map_or_else(
                || "none (the guest keeps its link's MTU)".into(),
                |m| format!("{m} (the port MTU)"),
            ),
        );
        row(
            "router lifetime",
            if ra.router_lifetime_s == 0 {
                "0 s (not a default router)".into()
            } else {
                format!("{} s", ra.router_lifetime_s)
            },
        );
        row(
            "flags",
            format!(
                "M={} O={} (addresses by DHCPv6: {}; other configuration by DHCPv6: {})",
                u8::from(ra.managed),
                u8::from(ra.other),
                if ra.managed { "yes" } else { "no" },
                if ra.other { "yes" } else { "no" }
            ),
        );
        if let Some(p) = &ra.prefix_info {
            row("prefix", p.to_string());
        }
        row(
            "cur hop limit",
            if ra.cur_hop_limit == 0 {
                "unspecified (the host's own)".into()
            } else {
                format!(
                    "{} (the guest's own IPv6 packets start with this hop limit: \
                     ping -6 shows ttl={} for them)",
                    ra.cur_hop_limit, ra.cur_hop_limit
                )
            },
        );
        row("reachable time", ms_or_unspecified(ra.reachable_time_ms));
        row("retrans timer", ms_or_unspecified(ra.retrans_time_ms));
        row(
            "IPv6 hop limit",
            format!(
                "{} (RFC 4861: a host accepts only an RA sent with 255, one no router forwarded)",
                self.ip_hop_limit
            ),
        );
        row(
            "sent to",
            format!(
                "{} unsolicited, every {}-{} s; solicited ones to the guest that asked",
                self.unsolicited_destination, self.min_interval_s, self.max_interval_s
            ),
        );
        row(
            "last sent",
            match (self.last_sent_ms_ago, self.last_sent_mtu) {
                (Some(ago), Some(mtu)) => format!("{ago} ms ago, with MTU {mtu}"),
                (Some(ago), None) => format!("{ago} ms ago"),
                (None, _) => "never".into(),
            },
        );
        row(
            "sent",
            format!(
                "{} solicited, {} unsolicited, {} after an MTU change",
                self.solicited_sent, self.unsolicited_sent, self.mtu_change_sent
            ),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mtu_reply(underlay: u16, port_mtu: u16, warnings: &[&str]) -> Reply {
        let i = |x: u16| i32::from(x);
        Reply::Inspect(json!({
            "underlay_mtu": underlay,
            "encap_overhead": 78,
            "port_mtu": port_mtu,
            "virtio_host_mtu": port_mtu,
            "headroom": i(underlay) - 78 - i(port_mtu),
            "max_internal_tcp_segment_v4": i(underlay) - 78 - 40,
            "max_internal_tcp_segment_v4_timestamps": i(underlay) - 78 - 52,
            "max_internal_tcp_segment_v6": i(underlay) - 78 - 60,
            "external_path_mtu": 1500,
            "sled_external_jumbo": false,
            "port_external_jumbo": false,
            "warnings": warnings,
        }))
    }

    fn mtu_request() -> Request {
        Request::Mtu { port: "a1".into() }
    }

    /// The arithmetic first, as the operator reads it; then each term with what it
    /// is, and the warnings last.
    #[test]
    fn mtu_reads_as_arithmetic() {
        let s = render(
            &mtu_request(),
            &mtu_reply(
                9000,
                8500,
                &["external path MTU 1500 is below the port MTU 8500: ..."],
            ),
        )
        .unwrap();
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(
            lines[0],
            "MTU budget of a1: underlay 9000 - 78 overhead = 8922 available, port 8500, headroom 422"
        );
        assert!(lines[1].starts_with("  underlay MTU    9000  "), "{s}");
        assert!(
            lines[2].starts_with("  - overhead        78  outer IPv6 40"),
            "{s}"
        );
        assert!(lines[3].starts_with("  = available     8922  "), "{s}");
        assert!(
            lines[4].contains("8500") && lines[4].contains("host_mtu=8500"),
            "{s}"
        );
        assert!(lines[5].starts_with("  headroom         422  "), "{s}");
        assert!(
            s.contains("IPv4 8882 (8870 with timestamps), IPv6 8862"),
            "{s}"
        );
        assert!(
            s.contains("external path MTU 1500 (external jumbo: sled off, port off"),
            "{s}"
        );
        assert!(
            lines
                .last()
                .unwrap()
                .starts_with("warning: external path MTU"),
            "{s}"
        );
        assert!(!s.contains("max_internal"), "no raw field names: {s}");
    }

    #[test]
    fn a_port_too_big_for_the_underlay_says_so() {
        let s = render(&mtu_request(), &mtu_reply(1500, 1500, &[])).unwrap();
        assert!(s.starts_with("MTU budget of a1: underlay 1500 - 78 overhead = 1422 available, port 1500, headroom -78\n"), "{s}");
        assert!(
            s.contains("-78  negative: full-size guest packets cannot cross"),
            "{s}"
        );
    }

    fn ra_value() -> serde_json::Value {
        json!({
            "source_mac": "a8:40:25:00:00:01",
            "source": "fe80::aa40:25ff:fe00:1",
            "unsolicited_destination": "ff02::1",
            "ip_hop_limit": 255,
            "cur_hop_limit": 64,
            "managed": false,
            "other": true,
            "router_lifetime_s": 9000,
            "reachable_time_ms": 0,
            "retrans_time_ms": 0,
            "source_link_layer_addr": "a8:40:25:00:00:01",
            "mtu": 8500,
            "prefix_info": null,
            "last_sent_mtu": 8500,
            "last_sent_ns": 123_456_789_012u64,
            "solicited_sent": 2,
            "unsolicited_sent": 5,
            "mtu_change_sent": 1,
            "next_unsolicited_due_ns": 987_654_321_000u64,
            "min_interval_s": 200,
            "max_interval_s": 600,
            "last_sent_ms_ago": 1234,
        })
    }

    /// MTU, lifetime and flags first, times in ms ago; the engine's raw clock
    /// readings (`*_ns`) are not shown.
    #[test]
    fn ra_shows_what_the_guest_learns() {
        let request = Request::Ra { port: "a1".into() };
        let s = render(&request, &Reply::Inspect(ra_value())).unwrap();
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(
            lines[0],
            "Router Advertisement of a1, from fe80::aa40:25ff:fe00:1 (a8:40:25:00:00:01)"
        );
        assert_eq!(lines[1], "  MTU               8500 (the port MTU)");
        assert_eq!(lines[2], "  router lifetime   9000 s");
        assert!(lines[3].starts_with("  flags             M=0 O=1 "), "{s}");
        assert!(
            s.contains("  last sent         1234 ms ago, with MTU 8500\n"),
            "{s}"
        );
        assert!(s.contains("  IPv6 hop limit    255 (RFC 4861"), "{s}");
        assert!(
            s.contains("2 solicited, 5 unsolicited, 1 after an MTU change"),
            "{s}"
        );
        assert!(s.contains("reachable time    unspecified"), "{s}");
        assert!(s.contains("  cur hop limit     64 (the guest's own IPv6 packets start with this hop limit: ping -6 shows ttl=64 for them)\n"), "{s}");
        assert!(
            !s.contains("123456789012") && !s.contains("987654321000"),
            "{s}"
        );

        let mut never = ra_value();
        never["last_sent_ms_ago"] = serde_json::Value::Null;
        never["last_sent_ns"] = serde_json::Value::Null;
        let s = render(&request, &Reply::Inspect(never)).unwrap();
        assert!(s.contains("  last sent         never\n"), "{s}");
    }

    /// A reply of another shape is still printed, field by field.
    #[test]
    fn an_unknown_shape_falls_back_to_key_values() {
        let request = Request::Ra { port: "a1".into() };
        let s = render(&request, &Reply::Inspect(json!({"mtu": "odd"}))).unwrap();
        assert_eq!(s, "mtu: odd\n");
        assert!(render(&Request::DumpV2p, &Reply::Inspect(json!({}))).is_none());
    }
}
