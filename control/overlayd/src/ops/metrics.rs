//! The daemon's metrics endpoint: [`MetricsServer`] serves the `stats` document as
//! an exposition ([`api::openmetrics`]) over HTTP for Prometheus (`overlayd
//! --metrics-listen ADDR:PORT`), each scrape asked of the workers like `xdeadm
//! stats`, answered between their rounds. The format is the one the client's
//! `Accept` header asks for ([`Format::negotiate`]): OpenMetrics for Prometheus,
//! the classic text format for a client that asks for it or for nothing in
//! particular (curl, a script).

use crate::server::{Pending, Work, WorkTx};
use api::openmetrics::{render, Format};
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
    let head = String::from_utf8_lossy(&head);
    let line = head.split("\r\n").next().unwrap_or_default();
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
    let format = Format::negotiate(accept(&head).as_deref());
    match scrape(requests, format) {
        Ok(text) => respond(&mut s, "200 OK", format.content_type(), &text),
        Err(e) => respond(
            &mut s,
            "503 Service Unavailable",
            "text/plain",
            &format!("{e}\n"),
        ),
    }
}

/// The request's `Accept` header: its values joined by commas, as HTTP says
/// several headers of one name combine (`None` without one).
fn accept(head: &str) -> Option<String> {
    let values: Vec<&str> = head
        .split("\r\n")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .filter(|(name, _)| name.trim().eq_ignore_ascii_case("accept"))
        .map(|(_, value)| value.trim())
        .collect();
    (!values.is_empty()).then(|| values.join(","))
}

/// The exposition of the daemon's current stats, or why there is none.
fn scrape(requests: &WorkTx, format: Format) -> Result<String, MetricsError> {
    let (tx, rx) = mpsc::channel();
    let pending = Pending {
        request: Request::Stats { port: None },
        reply: tx,
    };
    requests
        .try_send(Work::Request(pending))
        .map_err(|_| MetricsError::Busy)?;
    match rx.recv_timeout(SCRAPE_TIMEOUT) {
        Ok(Outcome::Ok(Reply::Inspect(v))) => Ok(render(&v, format)),
        Ok(Outcome::Ok(other)) => Err(MetricsError::Unexpected(Box::new(other))),
        Ok(Outcome::Error(e)) => Err(MetricsError::Refused(e)),
        Err(_) => Err(MetricsError::Timeout),
    }
}

fn respond(s: &mut TcpStream, status: &str, ctype: &str, body: &str) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nVary: Accept\r\nConnection: close\r\n\r\n",
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
        let r = http(
            server.addr(),
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text\r\n\r\n",
        );
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains(Format::OpenMetrics.content_type()), "{r}");
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

    /// The text and content type of a scrape answered by a real controller
    /// (without I/O, two ports), asked with `accept` (`None`: no header).
    fn scrape_with(accept: Option<&str>) -> (String, String) {
        use crate::controller::Controller;
        use crate::worker::Datapath;
        let engine =
            engine::Engine::new(engine::EngineConfig::new("fd00:99::1".parse().unwrap())).unwrap();
        let mut ctl = Controller::new(Datapath::without_io(engine), None);
        for (name, last) in [("opte0", 5), ("opte1", 6)] {
            let port = api::PortInfo {
                config: api::testing::sample_port(name, last),
                netns: None,
                vhost_user: None,
                attach: None,
            };
            let done = ctl.handle(Request::CreatePort(Box::new(port)));
            assert!(matches!(done, Outcome::Ok(Reply::Done)), "{done:?}");
        }
        let (tx, rx) = work_channel();
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), tx).unwrap();
        let answer = thread::spawn(move || {
            let Ok(Work::Request(p)) = rx.recv() else {
                panic!("expected a request");
            };
            p.reply.send(ctl.handle(p.request)).unwrap();
        });
        let header = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
        let r = http(
            server.addr(),
            &format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{header}\r\n"),
        );
        answer.join().unwrap();
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        let ctype = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Type: "))
            .unwrap_or_else(|| panic!("no content type: {head}"));
        (ctype.to_string(), body.to_string())
    }

    /// Over HTTP, from a real controller's stats: Prometheus's Accept header gets
    /// OpenMetrics, which its Python parser reads; a request for the classic
    /// format, curl's `*/*` and no header at all get the classic text, which
    /// `promtool check metrics` passes without a problem.
    #[test]
    fn the_scraper_gets_the_format_it_asks_for() {
        use api::testing::exposition::{assert_promtool_passes, python_parse};
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        let (ctype, body) = scrape_with(Some(prometheus));
        assert_eq!(ctype, Format::OpenMetrics.content_type());
        assert!(
            body.contains("# TYPE overlayd_port_packets counter\n"),
            "{body}"
        );
        let families = python_parse(&body, Format::OpenMetrics).unwrap_or_else(|e| panic!("{e}"));
        assert!(families.iter().any(|f| f.name == "overlayd_port_packets"
            && f.kind == "counter"
            && f.samples.len() == 4));
        for accept in [Some("text/plain;version=0.0.4"), Some("*/*"), None] {
            let (ctype, body) = scrape_with(accept);
            assert_eq!(ctype, Format::Prometheus.content_type(), "{accept:?}");
            assert!(
                body.contains("# TYPE overlayd_port_packets_total counter\n"),
                "{body}"
            );
            assert_promtool_passes(&body);
            let families =
                python_parse(&body, Format::Prometheus).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                families
                    .iter()
                    .all(|f| matches!(f.kind.as_str(), "counter" | "gauge")),
                "{families:?}"
            );
        }
    }

    #[test]
    fn accept_headers_are_found_by_name_and_joined() {
        let head = "GET /metrics HTTP/1.1\r\nHost: x\r\naccept: text/plain\r\nACCEPT:  */*;q=0.1 \r\n\r\nAccept: ignored";
        assert_eq!(accept(head).as_deref(), Some("text/plain,*/*;q=0.1"));
        assert_eq!(accept("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), None);
    }
}
