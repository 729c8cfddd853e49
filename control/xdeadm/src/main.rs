//! xdeadm: the admin tool. Talks to overlayd over its API socket, except for
//! `ra listen`, which runs on its own inside a guest.
//!
//! Exit codes (docs/operating.md, "Exit codes"): 0 ok, 1 refused by the daemon (or
//! a check that failed: `doctor`, `path-check`, `ra listen`), 2 usage error, 3
//! daemon unreachable; the writer verbs of `fleet`, which talk to the fleet's store
//! instead, the same for the store. Output cut short by the reader (`xdeadm dump-v2p | head -1`)
//! ends the tool quietly.

#![forbid(unsafe_code)]

use api::{Client, ClientError, PortConfig, PortExport, Refusal, Reply, Request, V2pEntry};
use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind, Write};
use std::net::{IpAddr, Ipv6Addr};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use xdeadm::cli::fleet::{self, WriteError};
use xdeadm::cli::grammar::{CaptureArgs, Cli};
use xdeadm::cli::render::{
    render, render_as, render_fleet_write, render_for, reply_fails, to_json, JsonError, RenderError,
};
use xdeadm::cli::requests::{Action, CommandError};
use xdeadm::ra_listen::{self, RaListenError};

/// How a run ended short of success; [`Failure::exit_code`] says with which code.
#[derive(Debug, thiserror::Error)]
enum Failure {
    /// The daemon refused the request: its message is printed.
    #[error(transparent)]
    Refused(Refusal),
    /// A check failed; its report is already printed.
    #[error("a check failed")]
    ChecksFailed,
    /// `ra listen` heard no Router Advertisement.
    #[error(transparent)]
    RaListen(#[from] RaListenError),
    /// No file for the daemon to write a capture into.
    #[error("cannot create a capture file in {}: {error} (or give -w FILE)", dir.display())]
    NoCaptureFile { dir: PathBuf, error: io::Error },
    /// The capture the daemon wrote cannot be read back.
    #[error("capture file {}: {error}", file.display())]
    CaptureUnread { file: PathBuf, error: io::Error },
    /// Writing the output failed, other than by its reader going away.
    #[error("cannot write {what}: {error}")]
    Output {
        what: &'static str,
        error: io::Error,
    },
    #[error(transparent)]
    Json(#[from] JsonError),
    /// The command line asks for something impossible.
    #[error(transparent)]
    Usage(#[from] CommandError),
    /// The reply cannot be printed in the form the command line asks for.
    #[error(transparent)]
    Render(#[from] RenderError),
    #[error("socket path {:?}: {error}", socket.display())]
    SocketPath { socket: PathBuf, error: io::Error },
    /// No daemon at the socket, or it stopped answering.
    #[error(transparent)]
    Unreachable(ClientError),
    /// Whoever reads our output went away: nothing more to say.
    #[error("the reader of the output went away")]
    ReaderGone,
    /// A writer verb of `fleet` failed, or a delete of it lost a race.
    #[error(transparent)]
    Fleet(#[from] WriteError),
    /// `export-port` could not write its file (the port is left paused).
    #[error("cannot write the export to {}: {error} (the port stays paused, and is not deleted)", file.display())]
    ExportFile { file: PathBuf, error: io::Error },
    /// The export is more than an import request may carry (so many connections).
    #[error("the export is {bytes} bytes, more than import-port can carry ({limit}): the port is left paused, not deleted")]
    ExportTooLarge { bytes: usize, limit: usize },
    /// The daemon answered `export-port` with something else.
    #[error("the daemon answered export-port with {0:?}")]
    NotAnExport(Box<Reply>),
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Failure {
        match e {
            ClientError::Refused(r) => Failure::Refused(r),
            e => Failure::Unreachable(e),
        }
    }
}

impl Failure {
    /// The exit code, as the module doc lists them; usage errors exit 2 as clap's
    /// own do.
    fn exit_code(&self) -> u8 {
        match self {
            Failure::ReaderGone => 0,
            Failure::Refused(_)
            | Failure::ChecksFailed
            | Failure::RaListen(_)
            | Failure::NoCaptureFile { .. }
            | Failure::CaptureUnread { .. }
            | Failure::Output { .. }
            | Failure::ExportFile { .. }
            | Failure::ExportTooLarge { .. }
            | Failure::NotAnExport(_)
            | Failure::Json(_) => 1,
            Failure::Usage(_) | Failure::Render(_) | Failure::SocketPath { .. } => 2,
            Failure::Unreachable(_) => 3,
            Failure::Fleet(e) => e.exit_code(),
        }
    }

    /// Whether to print the message: a failed check's report and a reader that
    /// went away need no more words.
    fn is_told(&self) -> bool {
        !matches!(self, Failure::ChecksFailed | Failure::ReaderGone)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse_line(std::env::args_os()).unwrap_or_else(|e| e.exit());
    let Err(failure) = run(cli) else {
        return ExitCode::SUCCESS;
    };
    if failure.is_told() {
        eprintln!("xdeadm: {failure}");
    }
    ExitCode::from(failure.exit_code())
}

fn run(cli: Cli) -> Result<(), Failure> {
    let json = cli.json;
    match cli.command.action()? {
        Action::Call(request) => call(Client::connect(&cli.socket)?, &request, json)?,
        Action::CheckThenCall { check, then } => {
            let mut client = Client::connect(&cli.socket)?;
            client.call(&check)?;
            call(client, &then, json)?;
        }
        Action::Show(request, show) => {
            let reply = Client::connect(&cli.socket)?.call(&request)?;
            emit(&render_as(show, &reply, json)?)?;
        }
        Action::RaListen { iface, timeout_s } => {
            let report = ra_listen::listen(&iface, Duration::from_secs(timeout_s))?;
            if json {
                emit(&format!("{}\n", to_json(&report)?))?;
            } else {
                emit(&report.to_string())?;
            }
        }
        Action::CaptureToStdout(args) => {
            // Connected first: no daemon is "unreachable" (exit 3), whether or not
            // the socket's directory, where the capture file goes, exists.
            let client = Client::connect(&cli.socket)?;
            let path = own_capture_file(&cli.socket)?;
            let result = capture_to_stdout(client, &args, &path, json);
            if let Err(e) = std::fs::remove_file(&path) {
                eprintln!("xdeadm: capture file {} not removed: {e}", path.display());
            }
            result?;
        }
        Action::ExportPort {
            port,
            output,
            delete,
            to,
        } => {
            let mut client = Client::connect(&cli.socket)?;
            let reply = client.call(&Request::ExportPort { port: port.clone() })?;
            let export = reply_export(reply)?;
            let text = format!("{}\n", to_json(&export)?);
            match output {
                Some(file) => write_export(&file, &text)?,
                None => emit(&text)?,
            }
            if delete {
                importable(&export)?;
                client.call(&Request::DeletePort {
                    name: port,
                    forward_to: to,
                })?;
            }
            for entry in to
                .map(|to| moved_v2p(&export.port.config, to))
                .unwrap_or_default()
            {
                client.call(&Request::set_v2p(entry))?;
            }
        }
        Action::FleetWrite(write) => {
            let report = fleet::run(&write)?;
            if json {
                emit(&format!("{}\n", to_json(&report)?))?;
            } else {
                emit(&render_fleet_write(&report))?;
            }
            if !report.skipped.is_empty() {
                return Err(WriteError::Skipped(report.skipped).into());
            }
        }
    }
    Ok(())
}

/// Asks the daemon and prints its answer; a reply that reports a failed check
/// (`doctor`, `path-check`) fails the run.
fn call(mut client: Client, request: &Request, json: bool) -> Result<(), Failure> {
    let reply = client.call(request)?;
    if json {
        emit(&format!("{}\n", to_json(&reply)?))?;
    } else {
        emit(&render_for(request, &reply))?;
    }
    match reply_fails(&reply) {
        true => Err(Failure::ChecksFailed),
        false => Ok(()),
    }
}

/// The export in an `export-port` reply.
fn reply_export(reply: Reply) -> Result<PortExport, Failure> {
    match reply {
        Reply::PortExport(export) => Ok(*export),
        other => Err(Failure::NotAnExport(Box::new(other))),
    }
}

/// The V2P mappings of a moved port's guest: each of its addresses on sled `to`.
fn moved_v2p(cfg: &PortConfig, to: Ipv6Addr) -> Vec<V2pEntry> {
    let ips = [cfg.ipv4.map(IpAddr::V4), cfg.ipv6.map(IpAddr::V6)];
    ips.into_iter()
        .flatten()
        .map(|vpc_ip| V2pEntry {
            vpc_ip,
            vpc_mac: cfg.guest_mac,
            underlay_ip: to,
            vni: cfg.vni,
        })
        .collect()
}

/// Writes an export to `file` (mode 0600: it describes a tenant's network) so
/// that it is on disk, whole, before the port may be deleted: into a new file
/// beside it, flushed, renamed over `file`, and the directory flushed.
fn write_export(file: &Path, text: &str) -> Result<(), Failure> {
    let failed = |error| Failure::ExportFile {
        file: file.to_path_buf(),
        error,
    };
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = file.file_name().unwrap_or_default().to_string_lossy();
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)
        .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&temp, file))
        .and_then(|()| File::open(dir)?.sync_all());
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written.map_err(failed)
}

/// Refuses to let the port go when its export is more than one `import-port`
/// request may carry: it could never be imported.
fn importable(export: &PortExport) -> Result<(), Failure> {
    let request = Request::ImportPort(Box::new(api::PortImport {
        export: export.clone(),
        netns: None,
        attach: None,
        vhost_user: None,
    }));
    let bytes = api::protocol::encode_request(&request).len();
    // Room for the attachment the import may name.
    let limit = api::protocol::MAX_LINE - 8192;
    match bytes > limit {
        true => Err(Failure::ExportTooLarge { bytes, limit }),
        false => Ok(()),
    }
}

/// Creates the empty file (mode 0600) overlayd writes a capture into for us: in
/// the API socket's directory, which overlayd can write even when systemd gives it
/// a private /tmp and a read-only file system elsewhere.
fn own_capture_file(socket: &Path) -> Result<PathBuf, Failure> {
    let socket = std::path::absolute(socket).map_err(|error| Failure::SocketPath {
        socket: socket.to_path_buf(),
        error,
    })?;
    let dir = socket.parent().unwrap_or(Path::new("/"));
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let path = dir.join(format!(
        "xdeadm-capture-{}-{nanos}.pcapng",
        std::process::id()
    ));
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|error| Failure::NoCaptureFile {
            dir: dir.to_path_buf(),
            error,
        })?;
    Ok(path)
}

/// `capture` without `-w`: the daemon writes `path`, which is then copied to
/// standard output; the summary goes to standard error.
fn capture_to_stdout(
    mut client: Client,
    args: &CaptureArgs,
    path: &Path,
    json: bool,
) -> Result<(), Failure> {
    let request = Request::Capture(args.spec(path.to_path_buf()));
    let reply = client.call(&request)?;
    let mut file = File::open(path).map_err(|error| Failure::CaptureUnread {
        file: path.to_path_buf(),
        error,
    })?;
    let mut out = std::io::stdout().lock();
    match std::io::copy(&mut file, &mut out).and_then(|_| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::BrokenPipe => return Err(Failure::ReaderGone),
        Err(error) => {
            return Err(Failure::Output {
                what: "the capture",
                error,
            })
        }
    }
    if json {
        eprintln!("{}", to_json(&reply)?);
    } else {
        eprint!("{}", render(&reply));
    }
    Ok(())
}

/// Writes to stdout; a reader that closed the pipe is not an error (`print!`
/// would panic).
fn emit(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Err(Failure::ReaderGone),
        Err(error) => Err(Failure::Output {
            what: "the output",
            error,
        }),
    }
}
