//! `xdeadm stats --format prometheus|openmetrics` against a headless daemon with a
//! port: the built tool's output read by the reference tools, as node_exporter's
//! textfile collector (classic format) and Prometheus (OpenMetrics) would.

mod common;

use api::openmetrics::Format;
use api::testing::exposition::{assert_promtool_passes, python_parse};
use api::testing::sample_port;
use api::{Client, PortInfo, Request};

#[test]
fn both_stats_formats_pass_the_reference_parsers() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("run/api.sock");
    let _d = common::headless(&sock);
    let port = PortInfo {
        config: sample_port("opte0", 5),
        netns: None,
        vhost_user: None,
        attach: None,
    };
    Client::connect(&sock)
        .unwrap()
        .call(&Request::CreatePort(Box::new(port)))
        .unwrap();
    let stats = |format: &str| {
        let o = common::xdeadm(&sock, &["stats", "--format", format]);
        assert!(o.status.success(), "{}", common::stderr(&o));
        String::from_utf8(o.stdout).unwrap()
    };

    let classic = stats("prometheus");
    assert!(
        classic.contains("# TYPE overlayd_port_packets_total counter\n"),
        "{classic}"
    );
    assert_promtool_passes(&classic);
    let open = stats("openmetrics");
    assert!(open.ends_with("# EOF\n"), "{open}");
    for (format, text) in [(Format::Prometheus, &classic), (Format::OpenMetrics, &open)] {
        let families = python_parse(text, format).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let packets = families
            .iter()
            .find(|f| f.name == "overlayd_port_packets")
            .unwrap_or_else(|| panic!("{families:?}"));
        assert_eq!(packets.kind, "counter", "{format:?}");
        assert_eq!(packets.samples.len(), 2, "{packets:?}");
        assert!(
            families
                .iter()
                .all(|f| matches!(f.kind.as_str(), "counter" | "gauge")),
            "{format:?}: {families:?}"
        );
    }
}
