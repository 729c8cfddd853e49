//! `xdeadm`'s exit codes, as scripts see them: 0 ok, 1 refused by the daemon, 2
//! usage error, 3 daemon unreachable; and a reader that closes the pipe early
//! (`xdeadm dump-v2p | head -1`) ends it quietly. Run against the headless daemon
//! on a temporary socket; a refusal written before the daemon closes the
//! connection against a stand-in daemon; 20 idle clients that must not lock the
//! operator out.

mod common;

use common::{stderr, xdeadm};

use api::{Client, Request, V2pEntry, Vni};

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn exit_codes_say_what_went_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("run/api.sock");

    let o = xdeadm(&sock, &["list-ports"]);
    assert_eq!(o.status.code(), Some(3), "no daemon: {}", stderr(&o));
    assert!(stderr(&o).contains("cannot connect"), "{}", stderr(&o));

    let _d = common::headless(&sock);
    let o = xdeadm(&sock, &["list-ports"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    let o = xdeadm(&sock, &["delete-xde", "nosuch"]);
    assert_eq!(o.status.code(), Some(1), "refused: {}", stderr(&o));
    assert!(stderr(&o).contains("nosuch"), "{}", stderr(&o));

    // Usage errors: clap's own, and the ones found after parsing.
    for args in [&["set-v2p", "10.0.0.1"][..], &["frobnicate"], &["ra"]] {
        let o = xdeadm(&sock, args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
}

/// Output larger than the pipe holds, read one line of: xdeadm gets EPIPE on
/// its next write and must neither panic nor complain.
#[test]
fn a_closed_pipe_ends_xdeadm_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("run/api.sock");
    let _d = common::headless(&sock);
    let mut c = Client::connect(&sock).unwrap();
    for i in 0..4000u32 {
        let [_, _, hi, lo] = i.to_be_bytes();
        c.call(&Request::set_v2p(V2pEntry {
            vpc_ip: format!("10.1.{hi}.{lo}").parse().unwrap(),
            vpc_mac: format!("a8:40:25:ff:{hi:02x}:{lo:02x}").parse().unwrap(),
            underlay_ip: "fd00:99::2".parse().unwrap(),
            vni: Vni::new(10).unwrap(),
        }))
        .unwrap();
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_xdeadm"))
        .arg("--socket")
        .arg(&sock)
        .arg("dump-v2p")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("VNI"), "{first}");
    // The reader is dropped here: the pipe's read end is closed.
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stderr(&o), "", "nothing said about the closed pipe");
}

/// `capture` to standard output makes its file next to the socket; with no daemon
/// (and no socket directory) that is still "unreachable", exit 3, as documented,
/// and no file is left behind.
#[test]
fn capture_without_a_daemon_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    for sock in [dir.path().join("run/api.sock"), dir.path().join("api.sock")] {
        let o = xdeadm(&sock, &["capture", "a1", "-c", "1"]);
        assert_eq!(
            o.status.code(),
            Some(3),
            "{}: {}",
            sock.display(),
            stderr(&o)
        );
        assert!(stderr(&o).contains("cannot connect"), "{}", stderr(&o));
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A daemon that turns a client away writes why and closes the connection,
/// perhaps before `xdeadm` has written its request: `xdeadm` says why and exits
/// 1 (refused), not 3 with "cannot send request: Broken pipe" (unreachable).
#[test]
fn a_refusal_before_the_request_is_a_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("api.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let busy = api::protocol::encode_response(api::Outcome::Error(api::Refusal::new(
        api::ErrorCode::Busy,
        "too many API clients (16 connected, each waiting for an answer): try again later",
    )));
    let daemon = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(&busy).unwrap();
    });
    let o = xdeadm(&sock, &["list-ports"]);
    daemon.join().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("too many API clients (16 connected"),
        "{}",
        stderr(&o)
    );
}

/// The lock-out: with 20 clients connected and silent, `xdeadm
/// list-ports` is answered at once (it was refused for up to 30 s).
#[test]
fn idle_clients_do_not_lock_the_operator_out() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("run/api.sock");
    let _d = common::headless(&sock);
    let _idle: Vec<UnixStream> = (0..20)
        .map(|_| UnixStream::connect(&sock).unwrap())
        .collect();
    let t0 = Instant::now();
    let o = xdeadm(&sock, &["list-ports"]);
    let took = t0.elapsed();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
}
