//! The client side of the API, used by `xdeadm` and by tests.

use crate::api::{self, Outcome, Reply, Request, MAX_LINE};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// One connection to the daemon; several requests may be sent over it in turn.
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

/// How long a client waits for an answer: the worker applies requests between
/// batches, which takes milliseconds; a minute means the daemon is stuck.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Why a call got no reply: the daemon could not be reached (or stopped
/// answering), or it answered with a refusal. `xdeadm` exits with a different code
/// for each (docs/operating.md, "Exit codes").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientError {
    Unreachable(String),
    Refused(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Unreachable(e) | ClientError::Refused(e) => f.write_str(e),
        }
    }
}

impl From<ClientError> for String {
    fn from(e: ClientError) -> String {
        e.to_string()
    }
}

impl Client {
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let unreachable =
            |e: std::io::Error| ClientError::Unreachable(format!("{}: {e}", path.display()));
        let s = UnixStream::connect(path).map_err(|e| {
            ClientError::Unreachable(format!(
                "cannot connect to overlayd at {}: {e} (is the daemon running? see --socket)",
                path.display()
            ))
        })?;
        let writer = s.try_clone().map_err(unreachable)?;
        Ok(Client {
            reader: BufReader::new(s),
            writer,
        })
    }

    /// Sends one request and waits for its answer. A refusal comes back as `Err`
    /// with the daemon's message ([`ClientError::Refused`]).
    pub fn call(&mut self, request: &Request) -> Result<Reply, ClientError> {
        // A capture answers when it ends.
        let wait = match request {
            Request::Capture(c) => TIMEOUT + c.duration(),
            _ => TIMEOUT,
        };
        self.reader
            .get_ref()
            .set_read_timeout(Some(wait))
            .map_err(|e| ClientError::Unreachable(format!("cannot set a timeout: {e}")))?;
        self.writer
            .write_all(&api::encode_request(request))
            .map_err(|e| ClientError::Unreachable(format!("cannot send request: {e}")))?;
        let mut line = Vec::new();
        (&mut self.reader)
            .take(MAX_LINE as u64 * 4)
            .read_until(b'\n', &mut line)
            .map_err(|e| ClientError::Unreachable(format!("no answer from overlayd: {e}")))?;
        if line.is_empty() {
            return Err(ClientError::Unreachable(
                "overlayd closed the connection without answering".into(),
            ));
        }
        match api::decode_response(&line).map_err(ClientError::Unreachable)? {
            Outcome::Ok(r) => Ok(r),
            Outcome::Error(e) => Err(ClientError::Refused(e)),
        }
    }
}
