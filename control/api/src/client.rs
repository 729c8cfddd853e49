//! The client side of the protocol, used by `xdeadm` and by tests.

use crate::protocol::{self, Outcome, Refusal, MAX_LINE};
use crate::{Reply, Request};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
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
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to overlayd at {}: {error} (is the daemon running? see --socket)", socket.display())]
    Connect {
        socket: PathBuf,
        error: std::io::Error,
    },
    #[error("{what}: {error}")]
    Io {
        what: &'static str,
        error: std::io::Error,
    },
    #[error("overlayd closed the connection without answering")]
    Closed,
    #[error(transparent)]
    Garbled(#[from] protocol::DecodeError),
    #[error(transparent)]
    Refused(Refusal),
}

impl Client {
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let s = UnixStream::connect(path).map_err(|error| ClientError::Connect {
            socket: path.to_path_buf(),
            error,
        })?;
        let writer = s.try_clone().map_err(|error| ClientError::Io {
            what: "cannot use the connection",
            error,
        })?;
        Ok(Client {
            reader: BufReader::new(s),
            writer,
        })
    }

    /// Sends one request and waits for its answer. A refusal comes back as
    /// [`ClientError::Refused`], with the daemon's code and message.
    pub fn call(&mut self, request: &Request) -> Result<Reply, ClientError> {
        // A capture answers when it ends.
        let wait = match request {
            Request::Capture(c) => TIMEOUT + c.duration(),
            _ => TIMEOUT,
        };
        let io = |what| move |error| ClientError::Io { what, error };
        self.reader
            .get_ref()
            .set_read_timeout(Some(wait))
            .map_err(io("cannot set a timeout"))?;
        self.writer
            .write_all(&protocol::encode_request(request))
            .map_err(io("cannot send request"))?;
        let mut line = Vec::new();
        (&mut self.reader)
            .take(MAX_LINE as u64 * 4)
            .read_until(b'\n', &mut line)
            .map_err(io("no answer from overlayd"))?;
        if line.is_empty() {
            return Err(ClientError::Closed);
        }
        match protocol::decode_response(&line)? {
            Outcome::Ok(r) => Ok(r),
            Outcome::Error(e) => Err(ClientError::Refused(e)),
        }
    }
}
