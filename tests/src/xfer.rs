//! Checked TCP transfers between guests with the `e2e-xfer` binary (see its docs):
//! the receiver compares every byte with the sender's seeded stream.

use crate::guest::Guest;
use crate::netns::Netns;
use crate::{Context, Error, Result};
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// What one side printed: `bytes=N fnv64=HEX secs=S mbit_per_s=R`.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub bytes: u64,
    pub fnv64: String,
    pub secs: f64,
    pub mbit_per_s: f64,
}

impl Report {
    pub fn parse(line: &str) -> Result<Report> {
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
                .ok_or_else(|| Error::new(format!("no {key}= in e2e-xfer output {line:?}")))
        };
        let num = |key: &str| -> Result<f64> {
            let v = field(key)?;
            v.parse()
                .map_err(|_| Error::new(format!("{key}={v} is not a number in {line:?}")))
        };
        let bytes = field("bytes")?;
        Ok(Report {
            bytes: bytes
                .parse()
                .map_err(|_| Error::new(format!("bytes={bytes} in {line:?}")))?,
            fnv64: field("fnv64")?.to_string(),
            secs: num("secs")?,
            mbit_per_s: num("mbit_per_s")?,
        })
    }
}

/// Sends `bytes` from `from` to `to` at `to_ip:port` over TCP, requires that the
/// receiver got exactly the sent stream and that both hashes agree; returns the
/// receiver's report.
pub fn transfer(
    xfer_bin: &Path,
    from: &Guest,
    to: &Guest,
    to_ip: IpAddr,
    port: u16,
    bytes: u64,
    timeout: Duration,
) -> Result<Report> {
    transfer_between(xfer_bin, &from.ns, &to.ns, to_ip, port, bytes, timeout)
}

/// [`transfer`] between any two namespaces (a guest's, the internet server's, ...):
/// the receiver listens in `to` on every address of `to_ip`'s family, the sender
/// in `from` connects to `to_ip:port` (an address that reaches `to`, NAT or not).
pub fn transfer_between(
    xfer_bin: &Path,
    from: &Netns,
    to: &Netns,
    to_ip: IpAddr,
    port: u16,
    bytes: u64,
    timeout: Duration,
) -> Result<Report> {
    start(xfer_bin, from, to, to_ip, port, bytes, timeout)?.finish()
}

/// A [`transfer_between`] under way, the namespaces no longer borrowed (a test
/// may rebuild the rack around it); [`Transfer::finish`] waits for it and checks
/// it.
pub struct Transfer {
    receiver: Child,
    recv_what: String,
    /// The sender's standard output, or why it failed.
    sender: std::thread::JoinHandle<Result<String>>,
    bytes: u64,
}

/// Starts a [`transfer_between`]: the receiver, then the sender in a thread of its
/// own.
pub fn start(
    xfer_bin: &Path,
    from: &Netns,
    to: &Netns,
    to_ip: IpAddr,
    port: u16,
    bytes: u64,
    timeout: Duration,
) -> Result<Transfer> {
    let addr = SocketAddr::new(to_ip, port).to_string();
    let any = any_addr(to_ip, port).to_string();
    let bin = xfer_bin.display().to_string();
    let seed = u64::from(std::process::id()) ^ bytes;
    let recv_cmd = to
        .cmd(&bin)
        .args(["recv", &any, &bytes.to_string(), &seed.to_string()]);
    let receiver = recv_cmd.spawn_with(Stdio::piped(), Stdio::piped())?;
    let send_cmd = from
        .cmd(&bin)
        .args(["send", &addr, &bytes.to_string(), &seed.to_string()])
        .timeout(timeout);
    Ok(Transfer {
        receiver,
        recv_what: recv_cmd.display(),
        sender: std::thread::spawn(move || send_cmd.run()),
        bytes,
    })
}

impl Transfer {
    /// Waits for both ends; requires that the receiver got exactly the sent stream
    /// and that both hashes agree; returns the receiver's report.
    pub fn finish(self) -> Result<Report> {
        let Transfer {
            mut receiver,
            recv_what,
            sender,
            bytes,
        } = self;
        let sent = sender
            .join()
            .map_err(|_| Error::new("the sender's thread panicked"))?;
        let started = Instant::now();
        // The receiver ends right after the sender (it read everything) or fails on
        // its own; give it a short grace and kill it otherwise.
        while receiver.try_wait()?.is_none() && started.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if receiver.try_wait()?.is_none() {
            receiver.kill()?;
        }
        let out = receiver.wait_with_output()?;
        let recv_stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let recv_stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            return Err(Error::new(format!(
                "receiver `{recv_what}` failed ({}): {}{}",
                out.status,
                recv_stderr.trim(),
                match &sent {
                    Err(e) => format!("; sender: {e}"),
                    Ok(_) => String::new(),
                }
            )));
        }
        let sent = Report::parse(sent.context("sender")?.trim())?;
        let got = Report::parse(recv_stdout.trim())?;
        if sent.bytes != bytes || got.bytes != bytes || sent.fnv64 != got.fnv64 {
            return Err(Error::new(format!(
                "sent {sent:?} but received {got:?} (expected {bytes} bytes)"
            )));
        }
        Ok(got)
    }
}

/// Every address of `like`'s family, port `port`: where a receiver listens for
/// connections to `like`.
pub fn any_addr(like: IpAddr, port: u16) -> SocketAddr {
    let ip = if like.is_ipv4() {
        IpAddr::from([0u8; 4])
    } else {
        IpAddr::from([0u16; 8])
    };
    SocketAddr::new(ip, port)
}

/// Accepts one connection on `listener` within `wait` (the listener is made
/// non-blocking; the connection is blocking).
pub fn accept_within(listener: &TcpListener, wait: Duration) -> Result<TcpStream> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + wait;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(Error::new(format!(
                        "no connection to {} in {wait:?}",
                        listener.local_addr()?
                    )));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Opens a TCP connection from namespace `ns` to `to`, trying for `within`; reads
/// time out after 20 s.
pub fn connect(ns: &Netns, to: SocketAddr, within: Duration) -> Result<TcpStream> {
    ns.within(|| {
        let s = TcpStream::connect_timeout(&to, within)?;
        s.set_read_timeout(Some(Duration::from_secs(20)))?;
        Ok(s)
    })
}

/// Byte `i` of [`stream`]: a position-dependent pattern, so a lost, repeated or
/// reordered segment shows.
pub fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8
}

/// Sends `bytes` of [`pattern`] from `from` and closes its sending side; requires
/// that `to` reads exactly them. Neither side waits more than 20 s for the other.
pub fn stream(mut from: TcpStream, mut to: TcpStream, bytes: u64) -> Result<()> {
    from.set_write_timeout(Some(Duration::from_secs(20)))?;
    to.set_read_timeout(Some(Duration::from_secs(20)))?;
    std::thread::scope(|s| {
        let sender = s.spawn(move || -> std::io::Result<()> {
            let data: Vec<u8> = (0..bytes).map(pattern).collect();
            from.write_all(&data)?;
            from.shutdown(Shutdown::Write)
        });
        let mut got = Vec::new();
        let read = to.read_to_end(&mut got);
        let sent = sender
            .join()
            .map_err(|_| Error::new("the sending thread panicked"))?;
        sent.map_err(|e| Error::new(format!("sending: {e}")))?;
        read.map_err(|e| Error::new(format!("receiving, after {} bytes: {e}", got.len())))?;
        if let Some(bad) = (0..bytes).zip(&got).position(|(i, b)| pattern(i) != *b) {
            return Err(Error::new(format!("byte {bad} of the stream differs")));
        }
        if got.len() as u64 != bytes {
            return Err(Error::new(format!(
                "received {} of {bytes} bytes",
                got.len()
            )));
        }
        Ok(())
    })
}

/// A checked download: a client in `client` connects to `server_ip:port` (an
/// address that reaches namespace `server`, through NAT or not), where a listener
/// in `server` accepts it and sends `bytes` that the client checks ([`stream`]).
pub fn fetch(
    client: &Netns,
    server: &Netns,
    server_ip: IpAddr,
    port: u16,
    bytes: u64,
) -> Result<()> {
    let listener = server.within(|| Ok(TcpListener::bind(any_addr(server_ip, port))?))?;
    // The first SYN may wait for neighbours on the way: a generous connect.
    let inside = connect(
        client,
        SocketAddr::new(server_ip, port),
        Duration::from_secs(20),
    )
    .map_err(|e| e.context(format!("connecting to {server_ip} port {port}")))?;
    // Connected: the connection waits in the backlog, accept returns at once.
    let (outside, _) = listener.accept()?;
    stream(outside, inside, bytes)
        .map_err(|e| e.context(format!("{bytes} bytes from {server_ip} port {port}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_report_line() {
        let r = Report::parse("bytes=10 fnv64=00ff secs=1.500 mbit_per_s=0.1").unwrap();
        assert_eq!(r.bytes, 10);
        assert_eq!(r.fnv64, "00ff");
        assert!((r.secs - 1.5).abs() < 1e-9);
        assert!(Report::parse("bytes=x fnv64=0 secs=1 mbit_per_s=1").is_err());
        assert!(Report::parse("fnv64=0").is_err());
    }
}
