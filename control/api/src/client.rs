//! The client side of the protocol, used by `xdeadm` and by tests.

use crate::protocol::{self, Outcome, Refusal, MAX_LINE};
use crate::{Reply, Request};
use std::io::{self, BufRead, BufReader, Read, Write};
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

/// How long a client whose request could not be sent looks for the line the
/// daemon wrote before closing: it is already in the socket's buffer, or nothing is.
const LAST_WORD: Duration = Duration::from_secs(1);

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
    /// [`ClientError::Refused`], with the daemon's code and message: also one the
    /// daemon wrote before closing the connection, when that made the request's
    /// write fail (a client turned away when the daemon is full or stopping),
    /// which would otherwise be reported as an unreachable daemon.
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
        if let Err(error) = self.writer.write_all(&protocol::encode_request(request)) {
            return Err(self.last_word().unwrap_or(ClientError::Io {
                what: "cannot send request",
                error,
            }));
        }
        let line = self.read_line().map_err(io("no answer from overlayd"))?;
        if line.is_empty() {
            return Err(ClientError::Closed);
        }
        match protocol::decode_response(&line)? {
            Outcome::Ok(r) => Ok(r),
            Outcome::Error(e) => Err(ClientError::Refused(e)),
        }
    }

    fn read_line(&mut self) -> io::Result<Vec<u8>> {
        let mut line = Vec::new();
        (&mut self.reader)
            .take(MAX_LINE as u64 * 4)
            .read_until(b'\n', &mut line)?;
        Ok(line)
    }

    /// Why the daemon closed the connection before the request could be sent:
    /// the refusal it wrote first (too many clients, an idle connection closed,
    /// shutting down), still in the socket's buffer. `None` when it wrote none, or
    /// nothing that reads as a refusal: the write's own error is then the news.
    fn last_word(&mut self) -> Option<ClientError> {
        self.reader
            .get_ref()
            .set_read_timeout(Some(LAST_WORD))
            .ok()?;
        let line = self.read_line().ok()?;
        match protocol::decode_response(&line).ok()? {
            Outcome::Error(e) => Some(ClientError::Refused(e)),
            Outcome::Ok(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;
    use std::os::unix::net::UnixListener;
    use std::thread;

    /// A daemon that accepts one connection, writes `said` and closes it before
    /// the client writes anything; the client then calls.
    fn call_after_close(said: &[u8]) -> ClientError {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let said = said.to_vec();
        let daemon = thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(&said).unwrap();
        });
        let mut client = Client::connect(&path).unwrap();
        daemon.join().unwrap();
        client.call(&Request::ListPorts).unwrap_err()
    }

    /// The case: the daemon refuses a client and closes the connection
    /// before the request is written. The refusal reaches the caller as one,
    /// not as "cannot send request: Broken pipe" (an unreachable daemon).
    #[test]
    fn a_refusal_written_before_closing_is_reported_as_a_refusal() {
        let too_many = Refusal::new(ErrorCode::Busy, "too many API clients (16 connected)");
        let e = call_after_close(&protocol::encode_response(Outcome::Error(too_many.clone())));
        match e {
            ClientError::Refused(r) => assert_eq!(r, too_many),
            e => panic!("not a refusal: {e}"),
        }
    }

    /// A daemon that closes without a word, or with one that is no refusal,
    /// leaves the write's own error as the news.
    #[test]
    fn a_close_without_a_refusal_is_a_send_error() {
        for said in [&b""[..], b"garbage\n"] {
            let e = call_after_close(said);
            assert!(
                matches!(
                    &e,
                    ClientError::Io {
                        what: "cannot send request",
                        ..
                    }
                ),
                "{said:?}: {e}"
            );
        }
    }
}
