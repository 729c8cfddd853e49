//! Fixtures the tests of the API's users share (feature `testing`): a port as the
//! end-to-end tests create it, the default a help text states, and the reference
//! tools that check an exposition.

use crate::migrate::{PortExport, PORT_EXPORT_FORMAT, PORT_EXPORT_KIND};
use crate::{PortConfig, PortInfo, Vni};
use wire::MacAddr;

/// The default a help text states, as both programs' help texts state one and
/// docs/operating.md repeats it: "(default 16384)", "(default 10, at most 3600)"
/// give `16384` and `10`.
pub fn stated_default(help: &str) -> Option<&str> {
    let at = help.find("(default ")? + "(default ".len();
    let rest = &help[at..];
    let end = rest.find([',', ')', ';']).unwrap_or(rest.len());
    Some(rest[..end].trim())
}

/// A dual-stack port in VNI 1701, its addresses ending in `last`.
pub fn sample_port(name: &str, last: u8) -> PortConfig {
    PortConfig {
        name: name.into(),
        guest_mac: MacAddr([0xa8, 0x40, 0x25, 0xff, 0x00, last]),
        gateway_mac: MacAddr([0xa8, 0x40, 0x25, 0x00, 0x00, 0x01]),
        ipv4: Some(format!("172.30.0.{last}").parse().unwrap()),
        ipv6: Some(format!("fd00:1122:3344:100::{last}").parse().unwrap()),
        vpc_subnet4: Some("172.30.0.0/22".parse().unwrap()),
        vpc_subnet6: Some("fd00:1122:3344:100::/64".parse().unwrap()),
        gateway_ipv4: Some("172.30.0.1".parse().unwrap()),
        vni: Vni::new(1701).unwrap(),
        mtu: 8500,
        external_jumbo: false,
        dns_servers4: vec!["1.1.1.1".parse().unwrap()],
        dns_servers6: vec![],
        hostname: Some("web".into()),
        domain: None,
        domain_search: vec![],
        external: Default::default(),
        limits: Default::default(),
        cidrs: Default::default(),
    }
}

/// An export of [`sample_port`] `name` in namespace `netns`, without tables or
/// connections.
pub fn sample_export(name: &str, last: u8, netns: &str) -> PortExport {
    PortExport {
        kind: PORT_EXPORT_KIND.into(),
        format: PORT_EXPORT_FORMAT,
        port: PortInfo {
            config: sample_port(name, last),
            netns: Some(netns.into()),
            vhost_user: None,
            attach: None,
        },
        routes: vec![],
        fw_rules: vec![],
        fw_next_id: 1,
        live: serde_json::json!({"connections": []}),
    }
}

/// What the reference tools make of an exposition: `promtool check metrics`
/// (Debian's `prometheus` package) and the Python `prometheus_client` parsers
/// (scripts/install-deps.sh installs both). A missing tool fails the test that
/// asks, naming it: a check skipped is a check that cannot fail.
pub mod exposition {
    use crate::openmetrics::Format;
    use std::io::Write;
    use std::process::{Command, Output, Stdio};

    fn run(program: &str, args: &[&str], input: &str) -> Output {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run {program}: {e} (bash scripts/install-deps.sh installs it)")
            });
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin
            .write_all(input.as_bytes())
            .expect("write to the tool");
        drop(stdin);
        child.wait_with_output().expect("the tool ends")
    }

    /// `promtool check metrics` on `text`: its exit code and its problems (one a
    /// line; none when the text passes).
    pub fn promtool_check(text: &str) -> (Option<i32>, String) {
        let out = run("promtool", &["check", "metrics"], text);
        let said = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), said)
    }

    /// Asserts that `promtool check metrics` passes `text` without a word.
    pub fn assert_promtool_passes(text: &str) {
        assert_eq!(promtool_check(text), (Some(0), String::new()), "{text}");
    }

    /// A family as `prometheus_client`'s parser reads it (from the script's
    /// `[name, type, [sample names]]`).
    #[derive(Debug, PartialEq, Eq, serde::Deserialize)]
    pub struct ParsedFamily {
        pub name: String,
        pub kind: String,
        pub samples: Vec<String>,
    }

    /// Parses `text` with `prometheus_client`'s parser for `format`
    /// (`text_string_to_metric_families` of `prometheus_client.parser` for the
    /// classic format, of `prometheus_client.openmetrics.parser` for OpenMetrics):
    /// the families, or the parser's error.
    pub fn python_parse(text: &str, format: Format) -> Result<Vec<ParsedFamily>, String> {
        let module = match format {
            Format::Prometheus => "prometheus_client.parser",
            Format::OpenMetrics => "prometheus_client.openmetrics.parser",
        };
        let script = format!(
            "import json, sys\n\
             from {module} import text_string_to_metric_families as parse\n\
             print(json.dumps([[f.name, f.type, [s.name for s in f.samples]]\n\
                               for f in parse(sys.stdin.read())]))\n"
        );
        let out = run("python3", &["-c", &script], text);
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
    }
}
