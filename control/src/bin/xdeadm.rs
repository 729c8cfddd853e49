//! xdeadm: the admin tool. Talks to overlayd over its API socket, except for
//! `ra listen`, which runs on its own inside a guest.
//!
//! Exit codes (docs/operating.md, "Exit codes"): 0 ok, 1 refused by the daemon (or
//! a check that failed: `doctor`, `path-check`, `ra listen`), 2 usage error, 3
//! daemon unreachable. Output cut short by the reader (`xdeadm dump-v2p | head -1`)
//! ends the tool quietly.

use control::cli::{render_as, render_for, reply_fails, Action, Cli};
use control::client::{Client, ClientError};
use control::ra_listen;
use std::io::{ErrorKind, Write};
use std::process::ExitCode;
use std::time::Duration;

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
            ClientError::Unreachable(e) => Failure::Unreachable(e),
            ClientError::Refused(e) => Failure::Refused(e),
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
