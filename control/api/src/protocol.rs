//! The line protocol: one JSON object per line over a Unix stream socket, both ways.
//!
//! A request is `{"version":1,"op":"set-v2p",...}`; its answer
//! `{"version":1,"ok":{...}}`, or `{"version":1,"error":"...","code":"not-found"}`
//! for a refusal. The version is checked before anything else is decoded, so a
//! client built for another protocol gets a clear refusal instead of a confusing
//! field error. A refusal's `code` is stable ([`ErrorCode`]): clients and tests
//! match on it, never on the text, which is for people and may be reworded.

use crate::{Reply, Request};
use serde::{Deserialize, Serialize};

/// The protocol version this build speaks.
pub const API_VERSION: u32 = 1;

/// Where the daemon listens unless told otherwise.
pub const DEFAULT_API_SOCKET: &str = "/run/overlayd/api.sock";

/// Requests are refused above this size: no legitimate request comes close (a full
/// firewall rule set is a few hundred KiB at most), and an unbounded line would let a
/// client make the daemon allocate without limit.
pub const MAX_LINE: usize = 4 << 20;

/// Success with a typed reply, or a refusal. A refused request has changed nothing.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Ok(Reply),
    Error(Refusal),
}

/// Why the daemon refused a request: a stable code and a message naming the bad
/// value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
}

impl Refusal {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
        }
    }
}

/// What kind of refusal it is; the words on the wire are stable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorCode {
    /// The request could not be read: not JSON, another protocol version, an
    /// unknown verb or field.
    BadRequest,
    /// A value is out of range or inconsistent.
    Invalid,
    /// The port, mapping, route or rule named does not exist.
    NotFound,
    /// It exists already, or collides with something that does (a name, a MAC in
    /// the VPC, an address, a SNAT range).
    Conflict,
    /// The port is saved but not in the dataplane (it is retried; `delete-xde`
    /// removes it).
    NotApplied,
    /// This daemon cannot do it (it runs without I/O, or the host lacks what it
    /// needs).
    Unsupported,
    /// The dataplane could not apply it: a tap, namespace, interface or socket
    /// could not be opened, or a worker did not answer.
    Dataplane,
    /// The change could not be saved, and was undone.
    NotSaved,
    /// The daemon is busy: too many clients, or stopping.
    Busy,
    /// A code this build does not know (a newer daemon's).
    #[serde(other)]
    Other,
}

impl ErrorCode {
    /// The word on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad-request",
            ErrorCode::Invalid => "invalid",
            ErrorCode::NotFound => "not-found",
            ErrorCode::Conflict => "conflict",
            ErrorCode::NotApplied => "not-applied",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::Dataplane => "dataplane",
            ErrorCode::NotSaved => "not-saved",
            ErrorCode::Busy => "busy",
            ErrorCode::Other => "other",
        }
    }
}

impl core::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One request on the wire.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct RequestEnvelope {
    version: u32,
    #[serde(flatten)]
    request: Request,
}

/// One response on the wire: `ok`, or `error` with its `code` (absent from
/// daemons older than codes: read as [`ErrorCode::Other`]).
#[derive(Serialize, Deserialize)]
struct ResponseEnvelope {
    version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ok: Option<Reply>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    code: Option<ErrorCode>,
}

/// A line that is not a message of this protocol.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{what} is not valid JSON: {error}")]
    Json { what: &'static str, error: String },
    #[error("message has no \"version\" field (this side speaks version {API_VERSION})")]
    NoVersion,
    #[error("unsupported API version {0} (this side speaks version {API_VERSION})")]
    Version(String),
    #[error("invalid {what}: {error}")]
    Invalid { what: &'static str, error: String },
}

impl From<DecodeError> for Refusal {
    fn from(e: DecodeError) -> Refusal {
        Refusal::new(ErrorCode::BadRequest, e.to_string())
    }
}

/// Decodes one request line, refusing other protocol versions before looking at the
/// rest.
pub fn decode_request(line: &[u8]) -> Result<Request, DecodeError> {
    let env: RequestEnvelope = decode(line, "request")?;
    Ok(env.request)
}

/// Decodes one response line, refusing other protocol versions.
pub fn decode_response(line: &[u8]) -> Result<Outcome, DecodeError> {
    let env: ResponseEnvelope = decode(line, "response")?;
    match (env.ok, env.error) {
        (Some(reply), None) => Ok(Outcome::Ok(reply)),
        (None, Some(message)) => Ok(Outcome::Error(Refusal {
            code: env.code.unwrap_or(ErrorCode::Other),
            message,
        })),
        _ => Err(DecodeError::Invalid {
            what: "response",
            error: "expected exactly one of \"ok\" and \"error\"".into(),
        }),
    }
}

fn decode<T: serde::de::DeserializeOwned>(
    line: &[u8],
    what: &'static str,
) -> Result<T, DecodeError> {
    let value: serde_json::Value = serde_json::from_slice(line).map_err(|e| DecodeError::Json {
        what,
        error: e.to_string(),
    })?;
    match value.get("version") {
        None => return Err(DecodeError::NoVersion),
        Some(v) if v.as_u64() == Some(u64::from(API_VERSION)) => {}
        Some(v) => return Err(DecodeError::Version(v.to_string())),
    }
    serde_json::from_value(value).map_err(|e| DecodeError::Invalid {
        what,
        error: e.to_string(),
    })
}

/// Encodes a request as one line (with the trailing newline).
pub fn encode_request(request: &Request) -> Vec<u8> {
    encode_line(&RequestEnvelope {
        version: API_VERSION,
        request: request.clone(),
    })
}

/// Encodes a response as one line (with the trailing newline).
pub fn encode_response(outcome: Outcome) -> Vec<u8> {
    let (ok, error, code) = match outcome {
        Outcome::Ok(r) => (Some(r), None, None),
        Outcome::Error(r) => (None, Some(r.message), Some(r.code)),
    };
    encode_line(&ResponseEnvelope {
        version: API_VERSION,
        ok,
        error,
        code,
    })
}

fn encode_line<T: Serialize>(v: &T) -> Vec<u8> {
    // Serialising these types cannot fail: no maps with non-string keys, no
    // non-finite floats. Should that ever change, the peer gets an error line rather
    // than the daemon panicking.
    let mut out = serde_json::to_vec(v).unwrap_or_else(|e| {
        format!(
            "{{\"version\":{API_VERSION},\"error\":\"cannot encode message: {}\",\"code\":\"other\"}}",
            e.to_string().replace('"', "'")
        )
        .into_bytes()
    });
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::sample_port;
    use crate::*;

    fn all_requests() -> Vec<Request> {
        let filters = FwFilters {
            host: FwHost::Subnet("10.0.0.0/8".parse().unwrap()),
            proto: FwProto::Tcp,
            ports: vec![
                FwPorts::One(22),
                FwPorts::Range {
                    start: 8000,
                    end: 8080,
                },
            ],
            icmp: None,
        };
        let rule = FwRule {
            id: 0,
            direction: Direction::In,
            priority: 100,
            action: FwAction::Allow,
            filters: filters.clone(),
        };
        vec![
            Request::CreatePort(Box::new(PortInfo {
                config: sample_port("opte0", 5),
                netns: Some("guest0".into()),
                vhost_user: None,
                attach: None,
            })),
            Request::CreatePort(Box::new(PortInfo {
                config: sample_port("vm0", 6),
                netns: None,
                attach: Some("vnet0".into()),
                vhost_user: None,
            })),
            Request::CreatePort(Box::new(PortInfo {
                config: sample_port("vm1", 7),
                netns: None,
                attach: None,
                vhost_user: Some(VhostUser {
                    socket: "/run/overlayd/vm1.sock".into(),
                    mode: VhostUserMode::Client,
                }),
            })),
            Request::DeletePort {
                name: "opte0".into(),
                forward_to: None,
            },
            Request::DeletePort {
                name: "opte0".into(),
                forward_to: Some("fd00:99::3".parse().unwrap()),
            },
            Request::ListPorts,
            Request::set_v2p(V2pEntry {
                vpc_ip: "172.30.0.6".parse().unwrap(),
                vpc_mac: "a8:40:25:ff:00:06".parse().unwrap(),
                underlay_ip: "fd00:99::2".parse().unwrap(),
                vni: Vni::new(1701).unwrap(),
            }),
            Request::ClearV2p {
                vpc_ip: "fd00:1122:3344:100::6".parse().unwrap(),
                vni: Vni::new(1701).unwrap(),
                expect: None,
            },
            Request::ClearV2p {
                vpc_ip: "172.30.0.6".parse().unwrap(),
                vni: Vni::new(1701).unwrap(),
                expect: Some(V2pTarget {
                    vpc_mac: "a8:40:25:ff:00:06".parse().unwrap(),
                    underlay_ip: "fd00:99::2".parse().unwrap(),
                }),
            },
            Request::DumpV2p,
            Request::SetV2b {
                prefix: "0.0.0.0/0".parse().unwrap(),
                endpoints: vec![
                    "fd00:99::b1".parse().unwrap(),
                    "fd00:99::b2".parse().unwrap(),
                ],
            },
            Request::ClearV2b {
                prefix: "::/0".parse().unwrap(),
                endpoints: vec!["fd00:99::b1".parse().unwrap()],
            },
            Request::DumpV2b,
            Request::AddRouterEntry {
                port: "opte0".into(),
                entry: RouteEntry {
                    class: Default::default(),
                    dest: "0.0.0.0/0".parse().unwrap(),
                    target: RouteTarget::Igw,
                    mtu: Some(1500),
                },
            },
            Request::DelRouterEntry {
                class: Default::default(),
                port: "opte0".into(),
                dest: "::/0".parse().unwrap(),
            },
            Request::DumpRoutes {
                port: "opte0".into(),
            },
            Request::AddFwRule {
                port: "opte0".into(),
                rule: rule.clone(),
            },
            Request::RmFwRule {
                port: "opte0".into(),
                direction: Direction::In,
                priority: 100,
                filters,
            },
            Request::SetFwRules {
                port: "opte0".into(),
                rules: vec![rule],
            },
            Request::DumpLayer {
                port: "opte0".into(),
                layer: "firewall".into(),
            },
            Request::ListLayers {
                port: "opte0".into(),
            },
            Request::DumpTcpFlows {
                port: "opte0".into(),
            },
            Request::RmFwRuleId {
                port: "opte0".into(),
                direction: Some(Direction::Out),
                id: 2,
            },
            Request::RmFwRuleId {
                port: "opte0".into(),
                direction: None,
                id: 7,
            },
            Request::ListFwRules {
                port: "opte0".into(),
            },
            Request::PausePort {
                port: "opte0".into(),
            },
            Request::ResumePort {
                port: "opte0".into(),
            },
            Request::SetFwRules {
                port: "opte0".into(),
                rules: vec![FwRule {
                    id: 4,
                    direction: Direction::In,
                    priority: 10,
                    action: FwAction::Deny,
                    filters: FwFilters {
                        host: FwHost::Vni(Vni::new(10).unwrap()),
                        proto: FwProto::Icmp6,
                        ports: vec![],
                        icmp: Some(IcmpMatch {
                            icmp_type: 128,
                            code: Some(0),
                        }),
                    },
                }],
            },
            Request::DumpUft {
                port: "opte0".into(),
                cursor: None,
                limit: None,
            },
            Request::DumpUft {
                port: "opte0".into(),
                cursor: Some(1 << 32),
                limit: Some(100),
            },
            Request::ClearUft {
                port: "opte0".into(),
            },
            Request::ClearLft {
                port: "opte0".into(),
                layer: "firewall".into(),
            },
            Request::CheckSled(crate::SledExpect {
                underlay_addr: Some("fd00:99::1".parse().unwrap()),
                boundary_services: None,
                boundary_vni: Some(Vni::new(99).unwrap()),
                underlay_links: Some(vec!["eth1".into(), "eth2".into()]),
            }),
            Request::SetExternalIps {
                port: "opte0".into(),
                external: ExternalIps {
                    snat: Some(crate::SnatRange {
                        ip: "198.51.100.1".parse().unwrap(),
                        start: 1024,
                        end: 2047,
                    }),
                    ephemeral: None,
                    floating: vec!["192.0.2.5".parse().unwrap()],
                    gateways: Default::default(),
                },
            },
            Request::SetPortLimits {
                port: "opte0".into(),
                limits: PortLimits {
                    egress_mbps: Some(100),
                    ingress_mbps: None,
                    burst_kib: Some(512),
                    pps: Some(10_000),
                },
            },
            Request::AllowCidr {
                port: "opte0".into(),
                prefix: "192.168.50.0/24".parse().unwrap(),
                dir: CidrDir::Both,
                external: true,
            },
            Request::RemoveCidr {
                port: "opte0".into(),
                prefix: "fd00:50::/64".parse().unwrap(),
                dir: CidrDir::Out,
            },
            Request::AddRouterEntry {
                port: "opte0".into(),
                entry: RouteEntry {
                    dest: "192.168.50.0/24".parse().unwrap(),
                    target: RouteTarget::Ip("172.30.0.6".parse().unwrap()),
                    mtu: None,
                    class: RouteClass::Custom,
                },
            },
            Request::Stats { port: None },
            Request::Stats {
                port: Some("opte0".into()),
            },
            Request::Mtu {
                port: "opte0".into(),
            },
            Request::Ra {
                port: "opte0".into(),
            },
            Request::Doctor,
            Request::PathCheck { peer: None },
            Request::PathCheck {
                peer: Some("fd00:99::2".parse().unwrap()),
            },
            Request::Workers,
            Request::Capture(CaptureSpec {
                port: "opte0".into(),
                underlay: false,
                count: Some(10),
                seconds: None,
                file: "/run/overlayd/c.pcapng".into(),
            }),
        ]
    }

    #[test]
    fn every_request_round_trips() {
        for req in all_requests() {
            let line = encode_request(&req);
            assert_eq!(line.last(), Some(&b'\n'));
            assert_eq!(
                line.iter().filter(|&&b| b == b'\n').count(),
                1,
                "one line per request"
            );
            assert_eq!(decode_request(&line).unwrap(), req);
        }
    }

    #[test]
    fn wire_form_is_versioned_and_tagged() {
        let line = encode_request(&Request::Mtu { port: "p".into() });
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["version"], 1);
        assert_eq!(v["op"], "mtu");
        assert_eq!(v["port"], "p");
    }

    #[test]
    fn every_reply_round_trips() {
        let replies = vec![
            Outcome::Ok(Reply::Done),
            Outcome::Ok(Reply::Cleared { flows: 3 }),
            Outcome::Ok(Reply::Ports(vec![
                PortStatus {
                    port: PortInfo {
                        config: sample_port("opte1", 7),
                        netns: None,
                        vhost_user: None,
                        attach: None,
                    },
                    not_applied: None,
                    link: Some(PortLink::Down {
                        since_unix_ms: 1_700_000_000_000,
                        reason: "read: File descriptor in bad state".into(),
                    }),
                    state: Some(PortState::Running),
                    vhost_negotiated: Some(crate::VhostNegotiation {
                        features: vec!["VERSION_1".into(), "MRG_RXBUF".into()],
                        refused: 2,
                    }),
                },
                PortStatus {
                    port: PortInfo {
                        config: sample_port("opte2", 8),
                        netns: Some("guest2".into()),
                        vhost_user: None,
                        attach: None,
                    },
                    not_applied: Some(NotApplied {
                        reason: "network namespace \"guest2\" not found".into(),
                        attempts: 3,
                        retry_in_ms: 4000,
                    }),
                    link: None,
                    state: None,
                    vhost_negotiated: None,
                },
            ])),
            Outcome::Ok(Reply::Inspect(serde_json::json!({"drops": {"bad_vni": 3}}))),
            Outcome::Ok(Reply::Doctor(vec![Check {
                name: "underlay-mtu".into(),
                status: CheckStatus::Fail,
                detail: "ul0 MTU 1500".into(),
                fix: Some("ip link set ul0 mtu 9000".into()),
            }])),
            Outcome::Ok(Reply::PathCheck(vec![PeerPath {
                peer: "fd00:99::3".parse().unwrap(),
                wanted: 9000,
                largest: Some(1500),
                probes: 15,
                error: None,
            }])),
            Outcome::Ok(Reply::Capture(CaptureReport {
                port: "opte0".into(),
                file: "/run/overlayd/c.pcapng".into(),
                frames: 10,
                dropped: 2,
                ended: CaptureEnd::Count,
            })),
            Outcome::Error(Refusal::new(
                ErrorCode::Invalid,
                "invalid MAC address \"zz\"",
            )),
        ];
        for r in replies {
            assert_eq!(decode_response(&encode_response(r.clone())).unwrap(), r);
        }
    }

    #[test]
    fn other_versions_are_refused_by_name() {
        let e = decode_request(br#"{"version":2,"op":"list-ports"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unsupported API version 2"), "{e}");
        let e = decode_request(br#"{"op":"list-ports"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("version"), "{e}");
        let e = decode_response(br#"{"version":"1","ok":{"kind":"done"}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"1\""), "{e}");
    }

    #[test]
    fn bad_values_are_named() {
        let e = decode_request(
            br#"{"version":1,"op":"set-v2p","vpc_ip":"10.0.0.1","vpc_mac":"zz:00:00:00:00:00","underlay_ip":"fd00::1","vni":5}"#,
        )
        .unwrap_err().to_string();
        assert!(e.contains("zz:00:00:00:00:00"), "{e}");
        let e =
            decode_request(br#"{"version":1,"op":"clear-v2p","vpc_ip":"10.0.0.1","vni":16777216}"#)
                .unwrap_err()
                .to_string();
        assert!(e.contains("16777216"), "{e}");
        let e = decode_request(br#"{"version":1,"op":"frobnicate"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("frobnicate"), "{e}");
    }
}
