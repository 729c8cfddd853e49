//! e2e-xfer: a TCP sender/receiver that proves every byte arrived intact.
//!
//! iperf3 measures throughput but never checks the data. Here the sender writes a
//! pseudo-random stream derived from a seed, and the receiver regenerates the same
//! stream and compares byte for byte, so a corrupted, lost, duplicated or reordered
//! segment (a broken checksum offload, a bad TSO split or coalesce) fails the run and
//! names the first bad offset. Both sides print the FNV-1a 64 hash of what they sent
//! or received, for the test to compare as well.
//!
//!   e2e-xfer recv LISTEN_ADDR:PORT BYTES SEED
//!   e2e-xfer send DEST_ADDR:PORT BYTES SEED
//!
//! Output (one line): `bytes=N fnv64=HEX secs=S mbit_per_s=R`.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// A stalled connection fails the run instead of hanging the test.
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the sender retries while the receiver is not listening yet.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const CHUNK: usize = 256 * 1024;

/// xorshift64*: fast, deterministic, and good enough that a shifted or repeated
/// segment never matches by chance. A byte stream: how it is cut into calls of
/// `fill` does not change the bytes (reads arrive in arbitrary sizes).
struct Stream {
    state: u64,
    word: [u8; 8],
    /// Bytes of `word` already handed out.
    used: usize,
}

impl Stream {
    fn new(seed: u64) -> Stream {
        Stream {
            // A zero state would stay zero forever.
            state: seed ^ 0x9e37_79b9_7f4a_7c15,
            word: [0; 8],
            used: 8,
        }
    }

    fn next_word(&mut self) -> [u8; 8] {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes()
    }

    fn fill(&mut self, buf: &mut [u8]) {
        let mut out = 0;
        while out < buf.len() {
            if self.used == 8 {
                self.word = self.next_word();
                self.used = 0;
            }
            let n = (8 - self.used).min(buf.len() - out);
            buf[out..out + n].copy_from_slice(&self.word[self.used..self.used + n]);
            self.used += n;
            out += n;
        }
    }
}

struct Fnv64(u64);

impl Fnv64 {
    fn new() -> Fnv64 {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
    fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

fn report(bytes: u64, hash: &Fnv64, started: Instant) {
    let secs = started.elapsed().as_secs_f64();
    // Precision loss is irrelevant for a printed rate.
    #[allow(clippy::cast_precision_loss)]
    let rate = bytes as f64 * 8.0 / secs.max(1e-9) / 1e6;
    println!(
        "bytes={bytes} fnv64={:016x} secs={secs:.3} mbit_per_s={rate:.1}",
        hash.0
    );
}

fn send(dest: SocketAddr, total: u64, seed: u64) -> Result<(), String> {
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    let mut sock = loop {
        match TcpStream::connect_timeout(&dest, Duration::from_secs(5)) {
            Ok(s) => break s,
            Err(e)
                if Instant::now() < deadline
                    && matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::TimedOut) =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(format!("connecting to {dest}: {e}")),
        }
    };
    sock.set_write_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut stream = Stream::new(seed);
    let mut hash = Fnv64::new();
    let mut buf = vec![0u8; CHUNK];
    let mut sent = 0u64;
    while sent < total {
        let n = usize::try_from((total - sent).min(CHUNK as u64)).unwrap_or(CHUNK);
        let part = &mut buf[..n];
        stream.fill(part);
        hash.update(part);
        sock.write_all(part)
            .map_err(|e| format!("sending to {dest} at offset {sent}: {e}"))?;
        sent += n as u64;
    }
    sock.shutdown(std::net::Shutdown::Write)
        .map_err(|e| format!("closing the send side to {dest}: {e}"))?;
    // Wait for the receiver to close: it has then read (and checked) everything.
    let mut tail = [0u8; 1];
    let _ = sock.read(&mut tail);
    report(sent, &hash, started);
    Ok(())
}

fn recv(listen: SocketAddr, total: u64, seed: u64) -> Result<(), String> {
    let listener = TcpListener::bind(listen).map_err(|e| format!("binding {listen}: {e}"))?;
    let (mut sock, peer) = listener
        .accept()
        .map_err(|e| format!("accepting on {listen}: {e}"))?;
    sock.set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut expected = Stream::new(seed);
    let mut hash = Fnv64::new();
    let mut buf = vec![0u8; CHUNK];
    let mut want = vec![0u8; CHUNK];
    let mut got = 0u64;
    loop {
        let n = sock
            .read(&mut buf)
            .map_err(|e| format!("receiving from {peer} after {got} bytes: {e}"))?;
        if n == 0 {
            break;
        }
        if got + n as u64 > total {
            return Err(format!(
                "received more than the {total} bytes expected from {peer}"
            ));
        }
        let data = &buf[..n];
        let expect = &mut want[..n];
        expected.fill(expect);
        if let Some(i) = data.iter().zip(expect.iter()).position(|(a, b)| a != b) {
            return Err(format!(
                "byte {} from {peer} is {:#04x}, expected {:#04x}",
                got + i as u64,
                data[i],
                expect[i]
            ));
        }
        hash.update(data);
        got += n as u64;
    }
    if got != total {
        return Err(format!(
            "connection from {peer} closed after {got} of {total} bytes"
        ));
    }
    report(got, &hash, started);
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let parsed = match args.as_slice() {
        [_, mode, addr, bytes, seed] => addr
            .parse::<SocketAddr>()
            .map_err(|e| format!("address {addr:?}: {e}"))
            .and_then(|a| {
                let b = bytes
                    .parse::<u64>()
                    .map_err(|e| format!("byte count {bytes:?}: {e}"))?;
                let s = seed
                    .parse::<u64>()
                    .map_err(|e| format!("seed {seed:?}: {e}"))?;
                Ok((mode.clone(), a, b, s))
            }),
        _ => Err("usage: e2e-xfer send|recv ADDR:PORT BYTES SEED".to_string()),
    };
    let result = parsed.and_then(|(mode, addr, bytes, seed)| match mode.as_str() {
        "send" => send(addr, bytes, seed),
        "recv" => recv(addr, bytes, seed),
        other => Err(format!("unknown mode {other:?}: expected send or recv")),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("e2e-xfer: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_bytes_do_not_depend_on_how_they_are_read() {
        let mut whole = vec![0u8; 1000];
        Stream::new(7).fill(&mut whole);
        let mut pieces = vec![0u8; 1000];
        let mut s = Stream::new(7);
        let mut at = 0;
        for len in [1, 3, 8, 13, 64, 911] {
            s.fill(&mut pieces[at..at + len]);
            at += len;
        }
        assert_eq!(whole, pieces);
        let mut other = vec![0u8; 1000];
        Stream::new(8).fill(&mut other);
        assert_ne!(whole, other);
    }

    #[test]
    fn fnv64_matches_reference_vector() {
        // FNV-1a 64 of "a" (from the FNV reference test suite).
        let mut h = Fnv64::new();
        h.update(b"a");
        assert_eq!(h.0, 0xaf63_dc4c_8601_ec8c);
    }
}
