//! The API's Unix socket: accepts connections, reads one request per line, hands each
//! to whoever owns the controller, and writes back the answer.
//!
//! The server never touches the controller itself. Requests travel over a channel to
//! the thread that owns it (the datapath worker, which applies them between batches,
//! or a plain loop when the daemon runs without I/O), so the fast path takes no lock
//! and sees configuration change only between batches.
//!
//! Clients are trusted (the socket is root-only) but not assumed well-behaved: their
//! number and the time each may take per request are bounded ([`ApiLimits`]), and
//! every refusal is counted ([`ApiCounters`]). Idle or slow clients cannot lock an
//! operator out: when every place is taken, a new client takes the place of the
//! connection idle longest ([`ApiLimits::max_clients`] says why this design).

use crate::fleet::channel::FleetBatch;
use api::protocol::{self, MAX_LINE};
use api::{ErrorCode, Outcome, Refusal, Request};
use serde::Serialize;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::Shutdown;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// Why the API socket could not be set up: each names the path or directory.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("API socket path {} is not absolute", .0.display())]
    Relative(PathBuf),
    #[error("API socket path {} names no file", .0.display())]
    NoFileName(PathBuf),
    #[error("API socket {} is in use by a running daemon", .0.display())]
    InUse(PathBuf),
    #[error("cannot remove stale socket {}: {error}", path.display())]
    RemoveStale { path: PathBuf, error: io::Error },
    #[error("cannot create API socket directory {}: {error}", dir.display())]
    CreateDir { dir: PathBuf, error: io::Error },
    #[error("cannot stat API socket directory {}: {error}", dir.display())]
    StatDir { dir: PathBuf, error: io::Error },
    #[error("cannot list API socket directory {}: {error}", dir.display())]
    ListDir { dir: PathBuf, error: io::Error },
    #[error(
        "API socket directory {} {why}: give the socket a directory of its own, \
         e.g. /run/overlayd (created by the daemon when missing)",
        dir.display()
    )]
    Dir { dir: PathBuf, why: DirUnfit },
    #[error("cannot bind API socket {}: {error}", path.display())]
    Bind { path: PathBuf, error: io::Error },
    #[error("cannot set up API socket {}: {error}", path.display())]
    Place { path: PathBuf, error: io::Error },
    #[error("cannot start API thread: {0}")]
    Thread(io::Error),
}

/// What makes an existing directory unfit for the socket ([`prepare_socket_dir`]).
#[derive(Debug, thiserror::Error)]
pub enum DirUnfit {
    #[error("is not a directory")]
    NotADirectory,
    #[error("is owned by uid {0}, not root")]
    Owner(u32),
    #[error("is writable by group or others (mode {0:o})")]
    Writable(u32),
    #[error("also holds {0:?}")]
    Holds(OsString),
}

/// What the server itself refuses, before a request reaches the controller (or
/// when its answer cannot come).
#[derive(Debug, thiserror::Error)]
pub enum ServerRefusal {
    #[error("too many API clients ({0} connected, each waiting for an answer): try again later")]
    TooManyClients(usize),
    #[error(
        "connection closed after {} ms idle: {max} clients were connected and a new one \
         took the place of the one idle longest; connect again",
        idle.as_millis()
    )]
    Evicted { max: usize, idle: Duration },
    #[error("no whole request within {0:?}: connection closed")]
    Timeout(Duration),
    #[error("request longer than {MAX_LINE} bytes refused")]
    TooLong,
    #[error("request not terminated by a newline")]
    Unterminated,
    #[error("the daemon is shutting down")]
    ShuttingDown,
    #[error("cannot start a thread for the request: {0}")]
    NoThread(io::Error),
    /// The server could not keep a second handle on the connection (to close it
    /// when it is evicted), as when the daemon is out of file descriptors.
    #[error("cannot take the connection: {0}")]
    NoHandle(io::Error),
}

impl ServerRefusal {
    /// The API's code for this refusal.
    pub fn code(&self) -> ErrorCode {
        match self {
            ServerRefusal::TooManyClients(_)
            | ServerRefusal::Evicted { .. }
            | ServerRefusal::ShuttingDown
            | ServerRefusal::NoThread(_)
            | ServerRefusal::NoHandle(_) => ErrorCode::Busy,
            ServerRefusal::Timeout(_) | ServerRefusal::TooLong | ServerRefusal::Unterminated => {
                ErrorCode::BadRequest
            }
        }
    }
}

impl From<ServerRefusal> for Refusal {
    fn from(r: ServerRefusal) -> Refusal {
        Refusal::new(r.code(), r.to_string())
    }
}

/// A request on its way to the controller, with where to send the answer.
pub struct Pending {
    pub request: Request,
    pub reply: mpsc::Sender<Outcome>,
}

/// What reaches the controller's owner: an API request (from the socket or the
/// metrics endpoint), or a batch of the fleet store's changes from its watcher.
/// One channel for both, so that the fleet's changes are applied between
/// requests, in one order with them, by the one thread that owns the controller.
pub enum Work {
    Request(Pending),
    Fleet(FleetBatch),
}

/// The sending side the server, the metrics endpoint and the fleet's watcher use;
/// the receiving side belongs to the controller's owner, which calls
/// [`serve_pending`] or [`serve_next`].
pub type WorkTx = mpsc::SyncSender<Work>;
pub type WorkRx = mpsc::Receiver<Work>;

/// How much work may wait for the controller; beyond it, senders block (there is
/// no reason for an admin client to queue more, and a watcher that outruns the
/// controller should wait for it).
const QUEUE: usize = 64;

pub fn work_channel() -> (WorkTx, WorkRx) {
    mpsc::sync_channel(QUEUE)
}

/// Answers every request waiting in `rx` with `handle` and applies every fleet
/// batch with `apply`, both given `ctx` (the controller), without blocking.
/// Returns how much was done, so a worker knows it did work this round.
pub fn serve_pending<C>(
    rx: &WorkRx,
    ctx: &mut C,
    mut handle: impl FnMut(&mut C, Request) -> Outcome,
    mut apply: impl FnMut(&mut C, FleetBatch),
) -> usize {
    let mut n = 0;
    while let Ok(w) = rx.try_recv() {
        match w {
            // The client may have gone away; its answer is then simply dropped.
            Work::Request(p) => {
                let _ = p.reply.send(handle(ctx, p.request));
            }
            Work::Fleet(batch) => apply(ctx, batch),
        }
        n += 1;
    }
    n
}

/// How the controller's owner answers a request: at once, or later, on a thread
/// of its own, for a request that takes seconds (`path-check` waits for probe
/// replies) and must not hold up the requests behind it or the main loop.
pub enum Answer {
    Now(Outcome),
    Later(Box<dyn FnOnce() -> Outcome + Send>),
}

impl From<Outcome> for Answer {
    fn from(o: Outcome) -> Answer {
        Answer::Now(o)
    }
}

/// Waits up to `timeout` for one piece of work: answers a request with `handle`,
/// applies a fleet batch with `apply`, both given `ctx`; for a thread whose only
/// job is the controller. Returns false once every sender is gone (the server
/// stopped).
pub fn serve_next<C>(
    rx: &WorkRx,
    timeout: Duration,
    ctx: &mut C,
    handle: impl FnOnce(&mut C, Request) -> Answer,
    apply: impl FnOnce(&mut C, FleetBatch),
) -> bool {
    let p = match rx.recv_timeout(timeout) {
        Ok(Work::Request(p)) => p,
        Ok(Work::Fleet(batch)) => {
            apply(ctx, batch);
            return true;
        }
        Err(mpsc::RecvTimeoutError::Timeout) => return true,
        Err(mpsc::RecvTimeoutError::Disconnected) => return false,
    };
    match handle(ctx, p.request) {
        Answer::Now(o) => {
            let _ = p.reply.send(o);
        }
        Answer::Later(work) => {
            let reply = p.reply.clone();
            let spawned = thread::Builder::new()
                .name("api-slow".into())
                .spawn(move || {
                    let _ = reply.send(work());
                });
            if let Err(e) = spawned {
                let _ = p.reply.send(refusal(ServerRefusal::NoThread(e)));
            }
        }
    }
    true
}

/// Bounds on API clients. Each connection is served by a thread of its own, so
/// without them a client that connects and says nothing, or many clients at once,
/// would pile up threads in the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiLimits {
    /// Connections served at once. When all are taken, a new client takes the
    /// place of the connection idle longest: one waiting for a request (silent,
    /// or trickling one in) since the earliest moment, which is told why and
    /// closed (counted `clients_evicted`). Only when every connection is waiting
    /// for the controller's answer (a capture, a path check) is the new client
    /// refused with an error and closed (counted `clients_refused`).
    ///
    /// Why eviction rather than the alternatives: a refusal when full let 16 idle
    /// clients (a stuck script, a leaking orchestrator, a hostile local process)
    /// lock every admin action out for as long as the request timeout, renewed
    /// for ever by a client that sends a cheap request now and then. A shorter
    /// deadline for the first request only shortens the lock-out and does nothing
    /// against clients that did send one; a reserved place would be taken by the
    /// next idle client like any other, since every client is root and looks
    /// alike. Evicting the longest idle always makes room for a client that has
    /// something to ask, costs a well-behaved client at most a reconnection (an
    /// idle connection could already be closed by the timeout), and never
    /// interrupts a request being answered.
    pub max_clients: usize,
    /// How long a client may take to send one whole request (and to read its
    /// answer) before its connection is closed (counted `read_timeouts`). A
    /// deadline per request, not per read, so trickling bytes does not extend it.
    pub request_timeout: Duration,
}

impl Default for ApiLimits {
    /// An admin tool sends its request at once and waits for one answer; an
    /// orchestrator may keep a few connections open. Sixteen clients and 30 s
    /// leave room for both.
    fn default() -> Self {
        ApiLimits {
            max_clients: 16,
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// What the API server counts; `stats` shows it under `control.api`.
#[derive(Debug, Default, Serialize)]
pub struct ApiCounters {
    /// Connections being served now.
    pub clients: AtomicUsize,
    /// Connections accepted and served since start.
    pub connections: AtomicU64,
    /// Connections refused because `max_clients` were being served, every one of
    /// them waiting for an answer.
    pub clients_refused: AtomicU64,
    /// Idle connections closed to make room for a new client when `max_clients`
    /// were connected.
    pub clients_evicted: AtomicU64,
    /// Connections closed because a request did not arrive whole in time.
    pub read_timeouts: AtomicU64,
    /// Requests longer than the protocol allows (the connection is closed).
    pub requests_too_long: AtomicU64,
}

/// A connection being served, as [`Places`] knows it.
struct Connection {
    id: u64,
    /// The connection itself, to shut its reading side when it is evicted.
    stream: UnixStream,
    /// Since when it waits for a request; `None` while one is being answered.
    idle_since: Option<Instant>,
    evicted: Arc<AtomicBool>,
}

/// The connections being served (at most `max_clients`, a handful), so that a new
/// client can take the place of the one idle longest.
#[derive(Default)]
struct Places {
    next_id: u64,
    connections: Vec<Connection>,
}

type SharedPlaces = Arc<Mutex<Places>>;

fn lock(places: &SharedPlaces) -> std::sync::MutexGuard<'_, Places> {
    // Nothing panics while holding the lock; if something did, the list is still
    // consistent (every change is one push, remove or assignment).
    places.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One connection's place, given back when the connection ends.
struct Place {
    id: u64,
    places: SharedPlaces,
    counters: Arc<ApiCounters>,
    evicted: Arc<AtomicBool>,
}

impl Place {
    /// A place for `stream`: a free one, or that of the connection idle longest,
    /// which is shut for reading (its thread finds the end of its input, tells its
    /// client why and ends). `None` when all are taken by connections waiting for
    /// an answer.
    fn take(
        stream: &UnixStream,
        max: usize,
        places: &SharedPlaces,
        counters: &Arc<ApiCounters>,
    ) -> io::Result<Option<Place>> {
        let shut = stream.try_clone()?;
        let mut p = lock(places);
        if p.connections.len() >= max {
            let longest = p
                .connections
                .iter()
                .enumerate()
                .filter_map(|(i, c)| Some((c.idle_since?, i)))
                .min();
            let Some((since, i)) = longest else {
                return Ok(None);
            };
            let victim = p.connections.swap_remove(i);
            victim.evicted.store(true, Ordering::Relaxed);
            // Already gone if this fails: its thread ends by itself.
            let _ = victim.stream.shutdown(Shutdown::Read);
            let evicted = counters.clients_evicted.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::info!(
                idle_ms = since.elapsed().as_millis(),
                max_clients = max,
                evicted,
                "API client idle longest closed to serve a new one"
            );
        }
        let id = p.next_id;
        p.next_id += 1;
        let evicted = Arc::new(AtomicBool::new(false));
        p.connections.push(Connection {
            id,
            stream: shut,
            idle_since: Some(Instant::now()),
            evicted: evicted.clone(),
        });
        counters
            .clients
            .store(p.connections.len(), Ordering::Relaxed);
        Ok(Some(Place {
            id,
            places: places.clone(),
            counters: counters.clone(),
            evicted,
        }))
    }

    /// Marks the connection waiting for a request (`true`: from now on, unless it
    /// already was) or having one answered (`false`: not to be evicted meanwhile).
    fn set_idle(&self, idle: bool) {
        let mut p = lock(&self.places);
        if let Some(c) = p.connections.iter_mut().find(|c| c.id == self.id) {
            if !idle {
                c.idle_since = None;
            } else if c.idle_since.is_none() {
                c.idle_since = Some(Instant::now());
            }
        }
    }

    /// Whether the connection was evicted (its reading side is shut).
    fn evicted(&self) -> bool {
        self.evicted.load(Ordering::Relaxed)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut p = lock(&self.places);
        p.connections.retain(|c| c.id != self.id);
        self.counters
            .clients
            .store(p.connections.len(), Ordering::Relaxed);
    }
}

/// The listening socket; removed from the filesystem when dropped.
pub struct ApiServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    accept: Option<thread::JoinHandle<()>>,
    counters: Arc<ApiCounters>,
}

impl ApiServer {
    /// Binds `path` and starts accepting. The API is root-only: the path must be
    /// absolute and its directory the daemon's alone ([`prepare_socket_dir`]); the
    /// socket is bound under a temporary name, made 0600 and only then renamed into
    /// place, so no other user can connect at any moment. A stale socket from a
    /// previous run is replaced; a live one (another daemon answering) is an error.
    pub fn start(
        path: &Path,
        requests: WorkTx,
        limits: ApiLimits,
    ) -> Result<ApiServer, ServerError> {
        let (dir, name) = split_socket_path(path)?;
        prepare_socket_dir(dir, name)?;
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(ServerError::InUse(path.to_path_buf()));
            }
            fs::remove_file(path).map_err(|error| ServerError::RemoveStale {
                path: path.to_path_buf(),
                error,
            })?;
        }
        // Accept blocks: an idle daemon's API thread takes no wake-ups. Dropping the
        // server wakes it with a connection of its own.
        let listener = bind_private(path, name)?;
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(ApiCounters::default());
        let (stop2, counters2) = (stop.clone(), counters.clone());
        let accept = thread::Builder::new()
            .name("api-accept".into())
            .spawn(move || accept_loop(listener, requests, stop2, limits, counters2))
            .map_err(ServerError::Thread)?;
        Ok(ApiServer {
            path: path.to_path_buf(),
            stop,
            accept: Some(accept),
            counters,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn counters(&self) -> Arc<ApiCounters> {
        self.counters.clone()
    }
}

impl Drop for ApiServer {
    /// Stops the accepting thread (woken by a connection it recognises as the
    /// stop, after `stop` is set) and removes the socket. If the socket cannot be
    /// reached (removed by hand), the thread is left blocked in `accept`, to end
    /// with the process, rather than hang the shutdown.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let woken = UnixStream::connect(&self.path).is_ok();
        if let Some(t) = self.accept.take() {
            if woken {
                let _ = t.join();
            } else {
                tracing::warn!(socket = %self.path.display(), "API socket unreachable at shutdown");
            }
        }
        let _ = fs::remove_file(&self.path);
    }
}

/// The socket's directory and file name. The path must be absolute: a relative one
/// would put the socket wherever the daemon happened to be started (`api.sock` made
/// the current directory the socket's directory).
fn split_socket_path(path: &Path) -> Result<(&Path, &OsStr), ServerError> {
    if !path.is_absolute() {
        return Err(ServerError::Relative(path.to_path_buf()));
    }
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => Ok((dir, name)),
        _ => Err(ServerError::NoFileName(path.to_path_buf())),
    }
}

/// The name the socket is bound under before it is renamed into place.
fn temporary_name(name: &OsStr) -> OsString {
    let mut t = OsString::from(".");
    t.push(name);
    t.push(".new");
    t
}

/// Makes sure the socket's directory is the daemon's alone, without ever changing
/// an existing directory. A missing one is created 0700 (with missing parents). An
/// existing one must be a directory owned by root, writable by nobody else, and hold
/// nothing but this socket (a stale one, or its temporary name left by a crash):
/// anything else would mean sharing it with files a chmod would break (`/run`, the
/// current directory) or with users who could replace the socket.
fn prepare_socket_dir(dir: &Path, name: &OsStr) -> Result<(), ServerError> {
    let meta = match fs::metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|error| ServerError::CreateDir {
                    dir: dir.to_path_buf(),
                    error,
                });
        }
        Err(error) => {
            return Err(ServerError::StatDir {
                dir: dir.to_path_buf(),
                error,
            })
        }
    };
    let refuse = |why| {
        Err(ServerError::Dir {
            dir: dir.to_path_buf(),
            why,
        })
    };
    if !meta.is_dir() {
        return refuse(DirUnfit::NotADirectory);
    }
    if meta.uid() != 0 {
        return refuse(DirUnfit::Owner(meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return refuse(DirUnfit::Writable(meta.mode() & 0o7777));
    }
    let ours = [name.to_os_string(), temporary_name(name)];
    let unlisted = |error| ServerError::ListDir {
        dir: dir.to_path_buf(),
        error,
    };
    for entry in fs::read_dir(dir).map_err(unlisted)? {
        let entry = entry.map_err(unlisted)?;
        if !ours.contains(&entry.file_name()) {
            return refuse(DirUnfit::Holds(entry.file_name()));
        }
    }
    Ok(())
}

/// Binds the socket under a temporary name, restricts it to its owner and renames
/// it into place: the mode bind gives a socket depends on the umask, and the
/// directory may be readable by others.
fn bind_private(path: &Path, name: &OsStr) -> Result<UnixListener, ServerError> {
    let tmp = path.with_file_name(temporary_name(name));
    // Left by a daemon that died between bind and rename.
    let _ = fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(|error| ServerError::Bind {
        path: tmp.clone(),
        error,
    })?;
    let placed = fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600))
        .and_then(|()| fs::rename(&tmp, path));
    if let Err(error) = placed {
        let _ = fs::remove_file(&tmp);
        return Err(ServerError::Place {
            path: path.to_path_buf(),
            error,
        });
    }
    Ok(listener)
}

fn accept_loop(
    listener: UnixListener,
    requests: WorkTx,
    stop: Arc<AtomicBool>,
    limits: ApiLimits,
    counters: Arc<ApiCounters>,
) {
    let places = SharedPlaces::default();
    loop {
        let accepted = listener.accept();
        if stop.load(Ordering::Relaxed) {
            return; // the connection, if any, is the one that wakes us to stop
        }
        match accepted {
            Ok((stream, _)) => admit(stream, &requests, limits, &counters, &places),
            Err(e) => {
                tracing::warn!(error = %e, "API accept failed");
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Serves a new connection on a thread of its own, in a free place or that of the
/// connection idle longest; or, when every connection is waiting for an answer,
/// tells the client so and closes it.
fn admit(
    stream: UnixStream,
    requests: &WorkTx,
    limits: ApiLimits,
    counters: &Arc<ApiCounters>,
    places: &SharedPlaces,
) {
    let refused = match Place::take(&stream, limits.max_clients, places, counters) {
        Ok(Some(place)) => {
            counters.connections.fetch_add(1, Ordering::Relaxed);
            let tx = requests.clone();
            let spawned = thread::Builder::new()
                .name("api-conn".into())
                .spawn(move || {
                    if let Err(e) = serve_connection(stream, &tx, limits, &place) {
                        tracing::debug!(error = %e, "API connection ended");
                    }
                });
            // On failure the closure, and the place with it, is dropped.
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start API connection thread");
            }
            return;
        }
        Ok(None) => {
            let refused = counters.clients_refused.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::warn!(
                max_clients = limits.max_clients,
                refused,
                "API client refused: every connection is waiting for an answer"
            );
            ServerRefusal::TooManyClients(limits.max_clients)
        }
        Err(e) => ServerRefusal::NoHandle(e),
    };
    // A fresh socket's buffer takes one line; the timeout only guards the accept
    // thread against the unexpected. The client reads it even when it finds the
    // connection closed as it writes its request (`api::Client::call`).
    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = (&stream).write_all(&protocol::encode_response(refusal(refused)));
}

/// Reads from a connection until a deadline, whatever the number of reads: a client
/// trickling a request byte by byte keeps its place no longer than a silent one.
struct DeadlineReader {
    stream: UnixStream,
    deadline: Instant,
}

impl Read for DeadlineReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

/// Serves requests on one connection until the client closes it, sends a request
/// that is too long or unterminated, takes longer than the request timeout for
/// one, or the connection is evicted while idle (then the client is told why).
fn serve_connection(
    stream: UnixStream,
    requests: &WorkTx,
    limits: ApiLimits,
    place: &Place,
) -> io::Result<()> {
    let (timeout, counters) = (limits.request_timeout, &place.counters);
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(timeout))?;
    let mut out = stream.try_clone()?;
    let mut reader = BufReader::new(DeadlineReader {
        stream,
        deadline: Instant::now(),
    });
    let mut line = Vec::new();
    // Idle from its admission, and again from each answer on.
    loop {
        line.clear();
        let since = Instant::now();
        reader.get_mut().deadline = since + timeout;
        // One byte over the limit tells an over-long line from one exactly at it.
        let read = (&mut reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line);
        let n = match read {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                counters.read_timeouts.fetch_add(1, Ordering::Relaxed);
                tracing::info!(?timeout, "API client sent no whole request in time: closed");
                let late = refusal(ServerRefusal::Timeout(timeout));
                return out.write_all(&protocol::encode_response(late));
            }
            Err(e) => return Err(e),
        };
        if place.evicted() && line.last() != Some(&b'\n') {
            let evicted = ServerRefusal::Evicted {
                max: limits.max_clients,
                idle: since.elapsed(),
            };
            return out.write_all(&protocol::encode_response(refusal(evicted)));
        }
        if n == 0 {
            return Ok(());
        }
        place.set_idle(false);
        if line.last() != Some(&b'\n') {
            let why = if line.len() > MAX_LINE {
                counters.requests_too_long.fetch_add(1, Ordering::Relaxed);
                ServerRefusal::TooLong
            } else {
                ServerRefusal::Unterminated
            };
            return out.write_all(&protocol::encode_response(refusal(why)));
        }
        let outcome = match protocol::decode_request(&line) {
            Ok(request) => submit(requests, request),
            Err(e) => Outcome::Error(e.into()),
        };
        // Idle before the answer is written: a client that has its answer must
        // find its connection evictable (an eviction shuts only the reading side,
        // so the answer is written whole either way).
        place.set_idle(true);
        out.write_all(&protocol::encode_response(outcome))?;
    }
}

fn submit(requests: &WorkTx, request: Request) -> Outcome {
    let stopping = || refusal(ServerRefusal::ShuttingDown);
    let (tx, rx) = mpsc::channel();
    if requests
        .send(Work::Request(Pending { request, reply: tx }))
        .is_err()
    {
        return stopping();
    }
    rx.recv().unwrap_or_else(|_| stopping())
}

/// A refusal that the server itself gives.
fn refusal(why: ServerRefusal) -> Outcome {
    Outcome::Error(why.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::Reply;
    use std::os::unix::fs::FileTypeExt;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().mode() & 0o7777
    }

    fn start(path: &Path) -> Result<ApiServer, ServerError> {
        let (tx, _rx) = work_channel();
        ApiServer::start(path, tx, ApiLimits::default())
    }

    /// An existing private directory is used as it is (never chmod-ed, even when
    /// others may enter it), and the socket is 0600 from the start.
    #[test]
    fn existing_dir_is_left_alone_and_socket_is_0600() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        let sock = dir.join("api.sock");
        let server = start(&sock).unwrap();
        assert_eq!(mode(&dir), 0o755);
        let meta = fs::symlink_metadata(&sock).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.mode() & 0o7777, 0o600);
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["api.sock"], "no temporary name left");
        drop(server);
        assert!(!sock.exists(), "socket removed on drop");
    }

    /// A missing directory (and its parents) is created 0700; a stale socket and a
    /// temporary one left by a crashed daemon do not make a directory foreign.
    #[test]
    fn missing_dir_is_created_private_and_leftovers_are_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        let sock = dir.join("api.sock");
        drop(start(&sock).unwrap());
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&tmp.path().join("a")), 0o700);
        // Leftovers of a daemon killed without cleaning up.
        let stale = UnixListener::bind(&sock).unwrap();
        drop(stale);
        let _left = UnixListener::bind(dir.join(".api.sock.new")).unwrap();
        let server = start(&sock).unwrap();
        assert!(UnixStream::connect(server.path()).is_ok());
    }

    /// A relative path is refused by name before anything is touched.
    #[test]
    fn relative_path_is_refused() {
        for p in ["api.sock", "run/api.sock"] {
            let e = start(Path::new(p)).err().unwrap();
            assert!(
                matches!(&e, ServerError::Relative(path) if path == Path::new(p)),
                "{e}"
            );
            let e = e.to_string();
            assert!(e.contains(p) && e.contains("not absolute"), "{e}");
        }
        assert!(!Path::new("run").exists());
    }

    /// A directory owned by another user, one others may write to (like /tmp),
    /// and one holding other files (like /run) are refused by name and left as
    /// they were.
    #[test]
    fn foreign_shared_or_busy_dir_is_refused_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let foreign = tmp.path().join("foreign");
        fs::create_dir(&foreign).unwrap();
        fs::set_permissions(&foreign, fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&foreign, Some(65534), None).unwrap();
        let e = start(&foreign.join("api.sock")).err().unwrap().to_string();
        assert!(e.contains(&foreign.display().to_string()), "{e}");
        assert!(e.contains("owned by uid 65534, not root"), "{e}");
        assert_eq!(mode(&foreign), 0o700);

        let shared = tmp.path().join("shared");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
        let e = start(&shared.join("api.sock")).err().unwrap().to_string();
        assert!(e.contains("writable by group or others (mode 1777)"), "{e}");
        assert_eq!(mode(&shared), 0o1777);
        assert!(!shared.join("api.sock").exists());

        let busy = tmp.path().join("busy");
        fs::create_dir(&busy).unwrap();
        fs::set_permissions(&busy, fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(busy.join("other.pid"), b"1").unwrap();
        let e = start(&busy.join("api.sock")).err().unwrap().to_string();
        assert!(
            e.contains(&busy.display().to_string()) && e.contains("other.pid"),
            "{e}"
        );
        assert_eq!(mode(&busy), 0o755);
        assert!(!busy.join("api.sock").exists());
    }

    /// A server whose requests are all answered `done` by a thread of its own.
    fn answering(limits: ApiLimits) -> (tempfile::TempDir, ApiServer) {
        let tmp = tempfile::tempdir().unwrap();
        let (tx, rx) = work_channel();
        let server = ApiServer::start(&tmp.path().join("api.sock"), tx, limits).unwrap();
        thread::spawn(move || {
            while serve_next(
                &rx,
                Duration::from_secs(1),
                &mut (),
                |(), _| Outcome::Ok(Reply::Done).into(),
                |(), _| {},
            ) {}
        });
        (tmp, server)
    }

    /// Sends a list-ports request and reads the answer line.
    fn ask(s: &UnixStream) -> String {
        (&*s)
            .write_all(b"{\"version\":1,\"op\":\"list-ports\"}\n")
            .unwrap();
        read_line(s)
    }

    fn read_line(s: &UnixStream) -> String {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        line
    }

    fn count(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// Waits until `max` clients or fewer are being served.
    fn settle(counters: &ApiCounters, max: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while counters.clients.load(Ordering::Relaxed) > max {
            assert!(Instant::now() < deadline, "places not given back");
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Beyond `max_clients` a new client takes the place of the one idle
    /// longest, which is told why and closed; counted; the others are still
    /// served.
    #[test]
    fn the_longest_idle_client_makes_way_for_a_new_one() {
        let (_tmp, server) = answering(ApiLimits {
            max_clients: 2,
            ..ApiLimits::default()
        });
        let a = UnixStream::connect(server.path()).unwrap();
        let b = UnixStream::connect(server.path()).unwrap();
        assert!(ask(&a).contains("done"));
        assert!(ask(&b).contains("done"));
        let c = UnixStream::connect(server.path()).unwrap();
        assert!(ask(&c).contains("done"), "the new client is served");
        let line = read_line(&a);
        assert!(line.contains("ms idle: 2 clients were connected"), "{line}");
        assert!(line.contains(r#""code":"busy""#), "{line}");
        assert_eq!(read_line(&a), "", "closed after the notice");
        assert!(ask(&b).contains("done"), "the other client still served");
        let counters = server.counters();
        assert_eq!(count(&counters.clients_evicted), 1);
        assert_eq!(count(&counters.clients_refused), 0);
        assert_eq!(count(&counters.connections), 3);
        settle(&counters, 2);
    }

    /// A server whose requests the test answers, returning the receiving side.
    fn held(limits: ApiLimits) -> (tempfile::TempDir, ApiServer, WorkRx) {
        let tmp = tempfile::tempdir().unwrap();
        let (tx, rx) = work_channel();
        let server = ApiServer::start(&tmp.path().join("api.sock"), tx, limits).unwrap();
        (tmp, server, rx)
    }

    fn next_request(rx: &WorkRx) -> Pending {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Work::Request(p)) => p,
            _ => panic!("no request"),
        }
    }

    /// A connection waiting for its answer is never evicted: an idle one is,
    /// and when there is none the new client is refused with an error naming the
    /// limit; counted.
    #[test]
    fn clients_waiting_for_an_answer_keep_their_place() {
        let (_tmp, server, rx) = held(ApiLimits {
            max_clients: 2,
            ..ApiLimits::default()
        });
        let counters = server.counters();
        let busy = UnixStream::connect(server.path()).unwrap();
        (&busy)
            .write_all(b"{\"version\":1,\"op\":\"list-ports\"}\n")
            .unwrap();
        let pending = next_request(&rx);
        let idle = UnixStream::connect(server.path()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while counters.clients.load(Ordering::Relaxed) < 2 {
            assert!(Instant::now() < deadline, "second client not admitted");
            thread::sleep(Duration::from_millis(10));
        }
        // Full: the idle one makes way, the busy one keeps its place.
        let newer = UnixStream::connect(server.path()).unwrap();
        assert!(read_line(&idle).contains("idle"), "the idle one is evicted");
        pending.reply.send(Outcome::Ok(Reply::Done)).unwrap();
        assert!(
            read_line(&busy).contains("done"),
            "the busy one is answered"
        );
        assert_eq!(count(&counters.clients_evicted), 1);
        drop((busy, newer));
        settle(&counters, 0);

        // Every place waiting for an answer: refused.
        let (_tmp, server, rx) = held(ApiLimits {
            max_clients: 1,
            ..ApiLimits::default()
        });
        let busy = UnixStream::connect(server.path()).unwrap();
        (&busy)
            .write_all(b"{\"version\":1,\"op\":\"list-ports\"}\n")
            .unwrap();
        let pending = next_request(&rx);
        let late = UnixStream::connect(server.path()).unwrap();
        let line = read_line(&late);
        assert!(
            line.contains("too many API clients (1 connected, each waiting for an answer)"),
            "{line}"
        );
        assert!(line.contains(r#""code":"busy""#), "{line}");
        assert_eq!(read_line(&late), "", "closed after the refusal");
        pending.reply.send(Outcome::Ok(Reply::Done)).unwrap();
        assert!(read_line(&busy).contains("done"));
        let counters = server.counters();
        assert_eq!(count(&counters.clients_refused), 1);
        assert_eq!(count(&counters.clients_evicted), 0);
    }

    /// The issue's lock-out: 20 clients hold the socket open, half silent, half
    /// trickling a request byte by byte, and an operator's request through the
    /// client `xdeadm` uses is still answered at once (it was refused for up to
    /// the 30 s request timeout).
    #[test]
    fn idle_and_slow_clients_cannot_lock_the_operator_out() {
        let (_tmp, server) = answering(ApiLimits::default());
        let mut crowd = Vec::new();
        for i in 0..20 {
            let s = UnixStream::connect(server.path()).unwrap();
            if i % 2 == 1 {
                let w = s.try_clone().unwrap();
                thread::spawn(move || {
                    for _ in 0..100 {
                        if (&w).write_all(b" ").is_err() {
                            break;
                        }
                        thread::sleep(Duration::from_millis(50));
                    }
                });
            }
            crowd.push(s);
        }
        let counters = server.counters();
        let deadline = Instant::now() + Duration::from_secs(5);
        while count(&counters.connections) < 20 {
            assert!(Instant::now() < deadline, "the crowd not admitted");
            thread::sleep(Duration::from_millis(10));
        }
        let t0 = Instant::now();
        let reply =
            api::Client::connect(server.path()).and_then(|mut c| c.call(&Request::ListPorts));
        let took = t0.elapsed();
        assert!(matches!(reply, Ok(Reply::Done)), "{reply:?}");
        assert!(took < Duration::from_secs(5), "answered after {took:?}");
        assert_eq!(count(&counters.clients_refused), 0);
        // 16 places: the 17th to 20th and the operator each evicted one.
        assert_eq!(count(&counters.clients_evicted), 5);
        // The five connected first, idle longest, were told.
        for s in &crowd[..5] {
            let line = read_line(s);
            assert!(line.contains("a new one took the place"), "{line}");
        }
    }

    /// A client that sends nothing, or trickles a request byte by byte, is told
    /// and closed once the request timeout has passed; counted.
    #[test]
    fn silent_and_trickling_clients_time_out() {
        let timeout = Duration::from_millis(300);
        let (_tmp, server) = answering(ApiLimits {
            request_timeout: timeout,
            ..ApiLimits::default()
        });
        let silent = UnixStream::connect(server.path()).unwrap();
        assert!(ask(&silent).contains("done"), "served while it talks");
        let t0 = Instant::now();
        let line = read_line(&silent);
        assert!(line.contains("no whole request within 300ms"), "{line}");
        assert!(line.contains(r#""code":"bad-request""#), "{line}");
        assert!(t0.elapsed() >= timeout);
        assert_eq!(read_line(&silent), "");

        // A byte every 50 ms for up to 3 s: each read well within the timeout,
        // the request as a whole far beyond it.
        let trickle = UnixStream::connect(server.path()).unwrap();
        let writer = trickle.try_clone().unwrap();
        let t0 = Instant::now();
        thread::spawn(move || {
            for _ in 0..60 {
                if (&writer).write_all(b" ").is_err() {
                    break;
                }
                thread::sleep(Duration::from_millis(50));
            }
        });
        let line = read_line(&trickle);
        let after = t0.elapsed();
        assert!(line.contains("no whole request"), "{line}");
        assert!(
            after < Duration::from_millis(1500),
            "closed after {after:?}"
        );
        let counters = server.counters();
        assert_eq!(count(&counters.read_timeouts), 2);
        let deadline = Instant::now() + Duration::from_secs(5);
        while counters.clients.load(Ordering::Relaxed) > 0 {
            assert!(Instant::now() < deadline, "slots not given back");
            thread::sleep(Duration::from_millis(10));
        }
    }
}
