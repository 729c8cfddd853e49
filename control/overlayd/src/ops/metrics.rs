//! The daemon's metrics endpoint: [`MetricsServer`] serves the `stats` document as
//! OpenMetrics text ([`api::openmetrics`]) over HTTP for Prometheus
//! (`overlayd --metrics-listen ADDR:PORT`), each scrape asked of the workers like
//! `xdeadm stats`, answered between their rounds.

use crate::server::{Pending, Work, WorkTx};
use api::openmetrics::{render, CONTENT_TYPE};
use api::{Outcome, Refusal, Reply, Request};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

/// How long a scrape waits for the stats; Prometheus's default scrape timeout is
/// 10 s.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a client may take to send its request or read the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest request head read (a scrape's is a few hundred bytes).
const MAX_REQUEST: usize = 8192;

/// How often the accept loop looks at its stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(100);

/// Why the endpoint did not start, or a scrape has no exposition (the scraper is
/// told why in a 503's body).
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("metrics listen address {addr}: {error}")]
    Listen { addr: SocketAddr, error: io::Error },
    #[error("cannot start the metrics thread: {0}")]
    Thread(io::Error),
    #[error("the daemon is busy or shutting down")]
    Busy,
    #[error("unexpected stats reply {0:?}")]
    Unexpected(Box<Reply>),
    #[error("{}", .0.message)]
    Refused(Refusal),
    #[error("no stats within {} s", SCRAPE_TIMEOUT.as_secs())]
    Timeout,
    /// The API's renderer refused the stats document.
    #[error("{0}")]
    Render(#[from] api::openmetrics::RenderError),
}

/// The HTTP endpoint: one thread, one connection at a time (a scraper asks every
/// few seconds), stopped and joined on drop.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr`; stats are asked for through `requests`, as the API server
    /// asks (the controller answers between its other requests).
    pub fn start(addr: SocketAddr, requests: WorkTx) -> Result<MetricsServer, MetricsError> {
        let refused = |error| MetricsError::Listen { addr, error };
        let listener = TcpListener::bind(addr).map_err(refused)?;
        let addr = listener.local_addr().map_err(refused)?;
        listener
            .set_nonblocking(true)
            .map_err(|error| MetricsError::Listen { addr, error })?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((s, _)) => {
                            if let Err(e) = serve(s, &requests) {
                                tracing::debug!(error = %e, "metrics client");
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            thread::sleep(ACCEPT_POLL);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "metrics accept");
                            thread::sleep(ACCEPT_POLL);
                        }
                    }
                }
            })
            .map_err(MetricsError::Thread)?;
        tracing::info!(%addr, "metrics listening");
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address bound (with the port the kernel chose for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Answers one HTTP/1.x request: `GET /metrics` (or `/`) with the exposition.
fn serve(mut s: TcpStream, requests: &WorkTx) -> io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    s.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_REQUEST {
            return respond(
                &mut s,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request too long\n",
            );
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" {
        let body = format!("method {method:?} is not allowed: GET /metrics\n");
        return respond(&mut s, "405 Method Not Allowed", "text/plain", &body);
    }
    if !matches!(path.split('?').next(), Some("/metrics" | "/")) {
        let body = format!("no page {path:?}: GET /metrics\n");
        return respond(&mut s, "404 Not Found", "text/plain", &body);
    }
    match scrape(requests) {
        Ok(text) => respond(&mut s, "200 OK", CONTENT_TYPE, &text),
        Err(e) => respond(
            &mut s,
            "503 Service Unavailable",
            "text/plain",
            &format!("{e}\n"),
        ),
    }
}

/// The exposition of the daemon's current stats, or why there is none.
fn scrape(requests: &WorkTx) -> Result<String, MetricsError> {
    let (tx, rx) = mpsc::channel();
    let pending = Pending {
        request: Request::Stats { port: None },
        reply: tx,
    };
    requests
        .try_send(Work::Request(pending))
        .map_err(|_| MetricsError::Busy)?;
    match rx.recv_timeout(SCRAPE_TIMEOUT) {
        Ok(Outcome::Ok(Reply::Inspect(v))) => Ok(render(&v)?),
        Ok(Outcome::Ok(other)) => Err(MetricsError::Unexpected(Box::new(other))),
        Ok(Outcome::Error(e)) => Err(MetricsError::Refused(e)),
        Err(_) => Err(MetricsError::Timeout),
    }
}

fn respond(s: &mut TcpStream, status: &str, ctype: &str, body: &str) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body.as_bytes())?;
    s.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::work_channel;

    fn http(addr: SocketAddr, req: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    /// The server answers a scrape from the stats the controller returns, and
    /// refuses other methods and paths by name.
    #[test]
    fn serves_the_exposition_over_http() {
        let (tx, rx) = work_channel();
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), tx).unwrap();
        let answer = thread::spawn(move || {
            let Ok(Work::Request(p)) = rx.recv() else {
                panic!("expected a request");
            };
            assert_eq!(p.request, Request::Stats { port: None });
            p.reply
                .send(Outcome::Ok(Reply::Inspect(
                    serde_json::json!({"version": 2}),
                )))
                .unwrap();
            rx
        });
        let r = http(server.addr(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains(CONTENT_TYPE), "{r}");
        let body = r.split_once("\r\n\r\n").unwrap().1;
        assert!(body.ends_with("# EOF\n"), "{body}");
        let _rx = answer.join().unwrap();
        let r = http(server.addr(), "POST /metrics HTTP/1.1\r\n\r\n");
        assert!(
            r.starts_with("HTTP/1.1 405") && r.contains("\"POST\""),
            "{r}"
        );
        let r = http(server.addr(), "GET /nope HTTP/1.1\r\n\r\n");
        assert!(
            r.starts_with("HTTP/1.1 404") && r.contains("\"/nope\""),
            "{r}"
        );
    }
}
