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

impl Client {
    pub fn connect(path: &Path) -> Result<Client, String> {
        let s = UnixStream::connect(path).map_err(|e| {
            format!(
                "cannot connect to overlayd at {}: {e} (is the daemon running? see --socket)",
                path.display()
            )
        })?;
        s.set_read_timeout(Some(TIMEOUT))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let writer = s
            .try_clone()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Client {
            reader: BufReader::new(s),
            writer,
        })
    }

    /// Sends one request and waits for its answer. A refusal comes back as `Err`
    /// with the daemon's message.
    pub fn call(&mut self, request: &Request) -> Result<Reply, String> {
        self.writer
            .write_all(&api::encode_request(request))
            .map_err(|e| format!("cannot send request: {e}"))?;
        let mut line = Vec::new();
        (&mut self.reader)
            .take(MAX_LINE as u64 * 4)
            .read_until(b'\n', &mut line)
            .map_err(|e| format!("no answer from overlayd: {e}"))?;
        if line.is_empty() {
            return Err("overlayd closed the connection without answering".into());
        }
        match api::decode_response(&line)? {
            Outcome::Ok(r) => Ok(r),
            Outcome::Error(e) => Err(e),
        }
    }
}
