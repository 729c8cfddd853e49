//! The API server in-process on a temporary socket, with a real engine and no I/O,
//! driven by the same client code `xdeadm` uses.

use api::protocol::API_VERSION;
use api::{Client, ClientError, ErrorCode, Refusal, Reply, Request};
use clap::Parser;
use engine::EngineConfig;
use overlayd::daemon::headless::Headless;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use xdeadm::cli::grammar::Cli;
use xdeadm::cli::requests::Action;

fn engine_cfg() -> EngineConfig {
    EngineConfig::new("fd00:99::1".parse().unwrap())
}

/// Parses an xdeadm command line into its request, as the tool does.
fn req(args: &[&str]) -> Request {
    let cli = Cli::try_parse_from(std::iter::once("xdeadm").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    match cli.command.action().unwrap() {
        Action::Call(r) => r,
        other => panic!("{other:?}"),
    }
}

const CREATE: &[&str] = &[
    "create-xde",
    "opte0",
    "--guest-mac",
    "a8:40:25:ff:00:01",
    "--private-ip",
    "172.30.0.5",
    "--private-ip",
    "fd00:1122:3344:100::5",
    "--vpc-subnet",
    "172.30.0.0/22",
    "--vpc-subnet",
    "fd00:1122:3344:100::/64",
    "--gateway-mac",
    "a8:40:25:00:00:01",
    "--gateway-ip",
    "172.30.0.1",
    "--vpc-vni",
    "1701",
    "--mtu",
    "8500",
];

fn call(sock: &Path, r: Request) -> Result<Reply, ClientError> {
    Client::connect(sock)?.call(&r)
}

/// The daemon's refusal in a failed call.
fn refusal(e: ClientError) -> Refusal {
    match e {
        ClientError::Refused(r) => r,
        e => panic!("not a refusal: {e}"),
    }
}

#[test]
fn create_inspect_persist_restore() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("run/api.sock");
    let state = dir.path().join("state");
    let d = Headless::start(engine_cfg(), &sock, Some(&state)).unwrap();
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "socket must be root-only");

    assert_eq!(call(&sock, req(CREATE)).unwrap(), Reply::Done);
    call(
        &sock,
        req(&[
            "set-v2p",
            "172.30.0.6",
            "a8:40:25:ff:00:06",
            "fd00:99::2",
            "1701",
        ]),
    )
    .unwrap();
    call(
        &sock,
        req(&["add-router-entry", "opte0", "10.9.0.0/16", "drop"]),
    )
    .unwrap();

    // mtu: the engine's budget for a 9000-byte underlay and an 8500 port.
    let Reply::Inspect(mtu) = call(&sock, req(&["mtu", "opte0"])).unwrap() else {
        panic!()
    };
    assert_eq!(mtu["underlay_mtu"], 9000);
    assert_eq!(mtu["port_mtu"], 8500);

    // ra: the RA carries the port MTU.
    let Reply::Inspect(ra) = call(&sock, req(&["ra", "opte0"])).unwrap() else {
        panic!()
    };
    assert_eq!(ra["mtu"], 8500);
    assert_eq!(ra["router_lifetime_s"], 9000);

    let Reply::Inspect(stats) = call(&sock, req(&["stats"])).unwrap() else {
        panic!()
    };
    assert_eq!(stats["engine"]["ports"][0]["name"], "opte0");
    assert!(stats["underlay"].is_null(), "no I/O in this test");
    call(&sock, req(&["stats", "opte0"])).unwrap();
    call(&sock, req(&["dump-uft", "opte0"])).unwrap();
    call(&sock, req(&["dump-layer", "opte0", "router"])).unwrap();

    // Refusals name the bad value and change nothing.
    let before = call(&sock, req(&["list-ports"])).unwrap();
    let e = refusal(call(&sock, req(CREATE)).unwrap_err());
    assert_eq!(e.code, ErrorCode::Conflict);
    assert!(e.message.contains("opte0"), "{e}");
    let e = refusal(call(&sock, req(&["mtu", "nope"])).unwrap_err());
    assert_eq!(e.code, ErrorCode::NotFound);
    assert!(e.message.contains("nope"), "{e}");
    let e = refusal(call(&sock, req(&["dump-layer", "opte0", "nat"])).unwrap_err());
    assert!(e.message.contains("nat"), "{e}");
    assert_eq!(call(&sock, req(&["list-ports"])).unwrap(), before);

    let Reply::Routes(routes) = call(&sock, req(&["dump-routes", "opte0"])).unwrap() else {
        panic!()
    };
    assert!(routes.iter().any(|r| r.dest.to_string() == "10.9.0.0/16"));
    let routes_before = routes.clone();
    drop(d);

    // A new daemon on the same state directory comes back with the same config.
    let d = Headless::start(engine_cfg(), &sock, Some(&state)).unwrap();
    assert_eq!(call(&sock, req(&["list-ports"])).unwrap(), before);
    assert_eq!(
        call(&sock, req(&["dump-routes", "opte0"])).unwrap(),
        Reply::Routes(routes_before)
    );
    let Reply::V2p(v2p) = call(&sock, req(&["dump-v2p"])).unwrap() else {
        panic!()
    };
    assert_eq!(v2p.len(), 1);
    call(&sock, req(&["delete-xde", "opte0"])).unwrap();
    assert_eq!(
        call(&sock, req(&["list-ports"])).unwrap(),
        Reply::Ports(vec![])
    );
    let ctl = d.stop().unwrap();
    assert!(ctl.dataplane().engine().list_ports().is_empty());
}

#[test]
fn raw_protocol_versions_and_garbage() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("api.sock");
    let _d = Headless::start(engine_cfg(), &sock, None).unwrap();
    let s = UnixStream::connect(&sock).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut ask = |line: &str| {
        w.write_all(line.as_bytes()).unwrap();
        w.write_all(b"\n").unwrap();
        let mut out = String::new();
        r.read_line(&mut out).unwrap();
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let v = ask(r#"{"version":9,"op":"list-ports"}"#);
    assert_eq!(v["version"], API_VERSION);
    assert!(v["error"].as_str().unwrap().contains("version 9"), "{v}");
    let v = ask("not json");
    assert!(v["error"].as_str().unwrap().contains("JSON"), "{v}");
    // The same connection keeps working after refusals.
    let v = ask(r#"{"version":1,"op":"list-ports"}"#);
    assert_eq!(v["ok"]["kind"], "ports");
}

#[test]
fn second_daemon_on_a_live_socket_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("api.sock");
    let _d = Headless::start(engine_cfg(), &sock, None).unwrap();
    let e = Headless::start(engine_cfg(), &sock, None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("in use"), "{e}");
}
