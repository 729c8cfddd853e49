//! The soak's workloads that run inside guests, as subcommands of the `soak` binary
//! (started with `ip netns exec GUEST soak SUBCOMMAND ...`): a churn of short TCP
//! connections and a stream of small UDP datagrams, each end printing one line of
//! `key=value` counts for the orchestrator.
//!
//! - `churn-server LISTEN SECONDS CLOSE`: answers each connection's [`REQUEST_LEN`]
//!   bytes; prints `served=N`.
//! - `churn-client DEST RATE SECONDS CLOSE`: opens RATE connections a second, each
//!   sending a request and reading the answer; prints `opened=N failed=M`.
//!
//!   CLOSE is how a connection ends ([`Close`]): `fin`, the server closes first
//!   (the TIME_WAIT state is then the server's, which has no port to run out of),
//!   or `rst`, the client resets it.
//! - `udp-sink LISTEN SECONDS`: counts datagrams; prints `received=N`.
//! - `udp-source DEST PPS SECONDS`: sends [`DATAGRAM_LEN`]-byte datagrams at PPS a
//!   second; prints `sent=N`.

use crate::{Error, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bytes each way on a churn connection.
pub const REQUEST_LEN: usize = 32;
/// Payload of each UDP datagram.
pub const DATAGRAM_LEN: usize = 64;
/// Threads opening churn connections: a slow connection does not hold up the rate.
const CHURN_THREADS: u64 = 8;
/// How long one connection may take, connect to close (SYN retries included).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// How a churn connection ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Close {
    /// The server closes after answering, the client then: FIN both ways, and
    /// the connection is in TIME_WAIT (120 s in the datapath's firewall).
    Fin,
    /// The client resets the connection once it has the answer: the firewall's
    /// entry is closed at once (5 s).
    Rst,
}

impl Close {
    pub fn parse(s: &str) -> Result<Close> {
        match s {
            "fin" => Ok(Close::Fin),
            "rst" => Ok(Close::Rst),
            _ => Err(Error::new(format!(
                "connection close {s:?} is neither fin nor rst"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Close::Fin => "fin",
            Close::Rst => "rst",
        }
    }
}

/// Runs subcommand `args[0]` with its arguments; the line to print.
pub fn run(args: &[String]) -> Result<String> {
    let arg = |i: usize, what: &str| -> Result<&str> {
        args.get(i)
            .map(String::as_str)
            .ok_or_else(|| Error::new(format!("{}: missing {what}", args[0])))
    };
    let seconds = |i| -> Result<Duration> { Ok(Duration::from_secs(number(arg(i, "SECONDS")?)?)) };
    let addr = |i, what| -> Result<SocketAddr> {
        let a = arg(i, what)?;
        a.parse()
            .map_err(|_| Error::new(format!("{}: {what} {a:?} is not ADDRESS:PORT", args[0])))
    };
    match args.first().map(String::as_str) {
        Some("churn-server") => {
            let close = Close::parse(arg(3, "CLOSE")?)?;
            churn_server(addr(1, "LISTEN")?, seconds(2)?, close)
        }
        Some("churn-client") => {
            let (rate, close) = (number(arg(2, "RATE")?)?, Close::parse(arg(4, "CLOSE")?)?);
            churn_client(addr(1, "DEST")?, rate, seconds(3)?, close)
        }
        Some("udp-sink") => udp_sink(addr(1, "LISTEN")?, seconds(2)?),
        Some("udp-source") => udp_source(addr(1, "DEST")?, number(arg(2, "PPS")?)?, seconds(3)?),
        other => Err(Error::new(format!("unknown workload {other:?}"))),
    }
}

fn number(s: &str) -> Result<u64> {
    s.parse()
        .map_err(|_| Error::new(format!("{s:?} is not a whole number")))
}

fn churn_server(listen: SocketAddr, seconds: Duration, close: Close) -> Result<String> {
    let listener =
        TcpListener::bind(listen).map_err(|e| Error::new(format!("bind {listen}: {e}")))?;
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + seconds;
    let mut served = 0u64;
    while Instant::now() < deadline {
        match listener.accept() {
            Ok((conn, _)) => served += u64::from(serve(conn, close).is_ok()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(Error::new(format!("accept on {listen}: {e}"))),
        }
    }
    Ok(format!("served={served}"))
}

/// Reads one request and answers it. With [`Close::Fin`] it then closes first;
/// with [`Close::Rst`] it sends one byte more than the client reads (so the
/// client's close is a reset: it leaves data unread) and waits for that reset.
fn serve(mut conn: TcpStream, close: Close) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(CONNECTION_TIMEOUT))?;
    let mut req = [0u8; REQUEST_LEN + 1];
    conn.read_exact(&mut req[..REQUEST_LEN])?;
    match close {
        Close::Fin => conn.write_all(&req[..REQUEST_LEN]),
        Close::Rst => {
            conn.write_all(&req)?;
            // Ends with the client's reset (an error) or, rarely, its FIN.
            let _ = conn.read(&mut req);
            Ok(())
        }
    }
}

fn churn_client(dest: SocketAddr, rate: u64, seconds: Duration, close: Close) -> Result<String> {
    let (opened, failed) = (AtomicU64::new(0), AtomicU64::new(0));
    let start = Instant::now();
    let per_thread = Duration::from_secs_f64(CHURN_THREADS as f64 / rate.max(1) as f64);
    std::thread::scope(|s| {
        for t in 0..CHURN_THREADS {
            let (opened, failed) = (&opened, &failed);
            s.spawn(move || {
                // Threads start staggered, so connections are spread evenly.
                let mut next = start + per_thread.mul_f64(t as f64 / CHURN_THREADS as f64);
                while next < start + seconds {
                    if let Some(wait) = next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let counter = if connect_once(dest, close).is_ok() {
                        opened
                    } else {
                        failed
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    next += per_thread;
                }
            });
        }
    });
    Ok(format!(
        "opened={} failed={}",
        opened.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    ))
}

/// One short connection: request out, the same bytes back, then the server's
/// close ([`Close::Fin`]) or ours with the extra byte unread ([`Close::Rst`]).
fn connect_once(dest: SocketAddr, close: Close) -> std::io::Result<()> {
    let mut conn = TcpStream::connect_timeout(&dest, CONNECTION_TIMEOUT)?;
    conn.set_read_timeout(Some(CONNECTION_TIMEOUT))?;
    let req = [0x5a; REQUEST_LEN];
    conn.write_all(&req)?;
    let mut answer = vec![0u8; REQUEST_LEN];
    match close {
        Close::Fin => {
            answer.clear();
            conn.read_to_end(&mut answer)?;
        }
        Close::Rst => conn.read_exact(&mut answer)?,
    }
    if answer == req {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "{} bytes came back",
            answer.len()
        )))
    }
}

fn udp_sink(listen: SocketAddr, seconds: Duration) -> Result<String> {
    let sock = UdpSocket::bind(listen).map_err(|e| Error::new(format!("bind {listen}: {e}")))?;
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    let deadline = Instant::now() + seconds;
    let mut buf = [0u8; 2048];
    let mut received = 0u64;
    while Instant::now() < deadline {
        if let Ok(n) = sock.recv(&mut buf) {
            received += u64::from(n == DATAGRAM_LEN);
        }
    }
    Ok(format!("received={received}"))
}

fn udp_source(dest: SocketAddr, pps: u64, seconds: Duration) -> Result<String> {
    let any: SocketAddr = if dest.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()
    .map_err(|_| Error::new("wildcard address"))?;
    let sock = UdpSocket::bind(any)?;
    let gap = Duration::from_secs_f64(1.0 / pps.max(1) as f64);
    let start = Instant::now();
    let mut sent = 0u64;
    let mut next = start;
    while next < start + seconds {
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        // A full socket buffer is the sender's loss, not the datapath's: not counted.
        if sock.send_to(&[0xa5; DATAGRAM_LEN], dest).is_ok() {
            sent += 1;
        }
        next += gap;
    }
    Ok(format!("sent={sent}"))
}

/// The value of `key=` in a workload's output line.
pub fn field(line: &str, key: &str) -> Result<u64> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .ok_or_else(|| Error::new(format!("no {key}= in {line:?}")))
        .and_then(number)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_and_bad_lines_named() {
        assert_eq!(field("opened=12 failed=0", "failed").unwrap(), 0);
        assert_eq!(field("opened=12 failed=0", "opened").unwrap(), 12);
        assert!(field("opened=12", "failed")
            .unwrap_err()
            .0
            .contains("opened=12"));
        assert!(field("sent=x", "sent").is_err());
    }

    #[test]
    fn bad_command_lines_are_refused() {
        let args = |a: &[&str]| {
            a.iter()
                .map(std::string::ToString::to_string)
                .collect::<Vec<_>>()
        };
        assert!(run(&args(&["nope"])).is_err());
        let e = run(&args(&["churn-server", "127.0.0.1:1", "1", "both"])).unwrap_err();
        assert!(e.0.contains("\"both\""), "{e}");
        assert!(run(&args(&["churn-client", "10.0.0.1:80"]))
            .unwrap_err()
            .0
            .contains("RATE"));
        assert!(run(&args(&["udp-sink", "localhost", "1"]))
            .unwrap_err()
            .0
            .contains("ADDRESS:PORT"));
    }

    /// The workloads against each other on loopback: every connection and
    /// datagram counted on both ends.
    #[test]
    fn churn_and_udp_count_on_loopback() {
        for (port, close) in [(47111, Close::Fin), (47113, Close::Rst)] {
            let at: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let server =
                std::thread::spawn(move || churn_server(at, Duration::from_secs(2), close));
            std::thread::sleep(Duration::from_millis(100));
            let client = churn_client(at, 50, Duration::from_secs(1), close).unwrap();
            assert_eq!(field(&client, "failed").unwrap(), 0, "{close:?}: {client}");
            let opened = field(&client, "opened").unwrap();
            assert!((40..=60).contains(&opened), "{close:?}: {client}");
            let served = server.join().unwrap().unwrap();
            assert_eq!(field(&served, "served").unwrap(), opened, "{close:?}");
        }
        let sink = std::thread::spawn(|| {
            udp_sink(
                "127.0.0.1:47112".parse().unwrap(),
                Duration::from_millis(1500),
            )
        });
        std::thread::sleep(Duration::from_millis(100));
        let sent = udp_source(
            "127.0.0.1:47112".parse().unwrap(),
            200,
            Duration::from_secs(1),
        )
        .unwrap();
        let received = sink.join().unwrap().unwrap();
        assert_eq!(
            field(&sent, "sent").unwrap(),
            field(&received, "received").unwrap()
        );
    }
}
