//! xdeadm: the admin tool. Talks to overlayd over its API socket, except for
//! `ra listen`, which runs on its own inside a guest.
//!
//! Exit codes (docs/operating.md, "Exit codes"): 0 ok, 1 refused by the daemon (or
//! a check that failed: `doctor`, `path-check`, `ra listen`), 2 usage error, 3
//! daemon unreachable. Output cut short by the reader (`xdeadm dump-v2p | head -1`)
//! ends the tool quietly.

use api::{Client, ClientError, Request};
use xdeadm::cli::grammar::{CaptureArgs, Cli};
use xdeadm::cli::render::{render, render_as, render_for, reply_fails};
use xdeadm::cli::requests::Action;

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use xdeadm::ra_listen;

/// How a run ended, each with its exit code.
enum Failure {
    /// The daemon refused the request, or reported a failed check. Exit 1.
    Refused(String),
    /// A check failed; its report is already printed. Exit 1.
    ChecksFailed,
    /// The command line asks for something impossible. Exit 2 (as clap's own
    /// usage errors).
    Usage(String),
    /// No daemon at the socket, or it stopped answering. Exit 3.
    Unreachable(String),
    /// Whoever reads our output went away: nothing more to say. Exit 0.
    ReaderGone,
    /// Writing the output failed otherwise. Exit 1.
    Output(String),
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Failure {
        match e {
            ClientError::Refused(r) => Failure::Refused(r.message),
            e => Failure::Unreachable(e.to_string()),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse_line(std::env::args_os()).unwrap_or_else(|e| e.exit());
    let (code, message) = match run(cli) {
        Ok(()) | Err(Failure::ReaderGone) => (0, None),
        Err(Failure::ChecksFailed) => (1, None),
        Err(Failure::Refused(e) | Failure::Output(e)) => (1, Some(e)),
        Err(Failure::Usage(e)) => (2, Some(e)),
        Err(Failure::Unreachable(e)) => (3, Some(e)),
    };
    if let Some(e) = message {
        eprintln!("xdeadm: {e}");
    }
    ExitCode::from(code)
}

fn run(cli: Cli) -> Result<(), Failure> {
    let json = cli.json;
    match cli.command.action().map_err(Failure::Usage)? {
        Action::Call(request) => {
            let reply = Client::connect(&cli.socket)?.call(&request)?;
            if json {
                emit(&format!("{}\n", to_json(&reply)?))?;
            } else {
                emit(&render_for(&request, &reply))?;
            }
            if reply_fails(&reply) {
                return Err(Failure::ChecksFailed);
            }
        }
        Action::Show(request, show) => {
            let reply = Client::connect(&cli.socket)?.call(&request)?;
            emit(&render_as(show, &reply, json).map_err(Failure::Usage)?)?;
        }
        Action::RaListen { iface, timeout_s } => {
            let report = ra_listen::listen(&iface, Duration::from_secs(timeout_s))
                .map_err(Failure::Refused)?;
            if json {
                emit(&format!("{}\n", to_json(&report)?))?;
            } else {
                emit(&report.to_string())?;
            }
        }
        Action::CaptureToStdout(args) => {
            let path = own_capture_file(&cli.socket)?;
            let result = capture_to_stdout(&cli.socket, &args, &path, json);
            if let Err(e) = std::fs::remove_file(&path) {
                eprintln!("xdeadm: capture file {} not removed: {e}", path.display());
            }
            result?;
        }
    }
    Ok(())
}

/// Creates the empty file (mode 0600) overlayd writes a capture into for us: in
/// the API socket's directory, which overlayd can write even when systemd gives it
/// a private /tmp and a read-only file system elsewhere.
fn own_capture_file(socket: &Path) -> Result<PathBuf, Failure> {
    let socket = std::path::absolute(socket)
        .map_err(|e| Failure::Usage(format!("socket path {:?}: {e}", socket.display())))?;
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
        .map_err(|e| {
            Failure::Refused(format!(
                "cannot create a capture file in {}: {e} (or give -w FILE)",
                dir.display()
            ))
        })?;
    Ok(path)
}

/// `capture` without `-w`: the daemon writes `path`, which is then copied to
/// standard output; the summary goes to standard error.
fn capture_to_stdout(
    socket: &Path,
    args: &CaptureArgs,
    path: &Path,
    json: bool,
) -> Result<(), Failure> {
    let request = Request::Capture(args.spec(path.to_path_buf()));
    let reply = Client::connect(socket)?.call(&request)?;
    let mut file = File::open(path)
        .map_err(|e| Failure::Output(format!("capture file {}: {e}", path.display())))?;
    let mut out = std::io::stdout().lock();
    match std::io::copy(&mut file, &mut out).and_then(|_| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::BrokenPipe => return Err(Failure::ReaderGone),
        Err(e) => return Err(Failure::Output(format!("cannot write the capture: {e}"))),
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
        Err(e) => Err(Failure::Output(format!("cannot write the output: {e}"))),
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<String, Failure> {
    serde_json::to_string_pretty(v).map_err(|e| Failure::Output(format!("cannot print JSON: {e}")))
}
