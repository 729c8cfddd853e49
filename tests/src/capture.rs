//! Underlay captures on the switch's bridge ports: the bridge sees every frame between
//! sleds, independently of the XDP program and AF_XDP sockets under test (a capture
//! on the sled's own interface misses frames redirected to AF_XDP).
//!
//! `tcpdump` records (it is lighter than dumpcap on a busy machine); `tshark` decodes
//! afterwards, since it knows Geneve and its options.

use crate::cmd::Cmd;
use crate::netns::Netns;
use crate::{Context, Error, Result};
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The Oxide Geneve option class.
pub const OXIDE_OPTION_CLASS: u16 = 0x0129;
/// Oxide option type carrying the guest's original TCP MSS.
pub const OXIDE_OPTION_MSS: u8 = 0x02;

/// Bytes kept per frame: enough for every header up to the inner L4 with options,
/// small enough that a 200 MB transfer makes a small file. `frame.len` still reports
/// the full on-wire length.
const SNAPLEN: &str = "512";

/// A running capture.
#[derive(Debug)]
pub struct Capture {
    child: Option<Child>,
    file: PathBuf,
    iface: String,
}

/// One captured frame, as tshark decoded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// On-wire length, Ethernet header included.
    pub len: u32,
    /// Every IPv6 source address in the frame, outermost first.
    pub ipv6_src: Vec<Ipv6Addr>,
    pub ipv6_dst: Vec<Ipv6Addr>,
    /// Every IPv4 source and destination address in the frame, outermost first.
    pub ipv4_src: Vec<Ipv4Addr>,
    pub ipv4_dst: Vec<Ipv4Addr>,
    /// The Geneve VNI (outermost), if the frame is Geneve.
    pub vni: Option<u32>,
    /// Geneve options as (class, type), in order.
    pub options: Vec<(u16, u8)>,
    /// Every IPv6 traffic class in the frame, outermost first (DSCP × 4 + ECN).
    pub ipv6_tclass: Vec<u8>,
    /// Every IPv4 DS field (TOS) in the frame, outermost first.
    pub ipv4_tos: Vec<u8>,
}

impl Frame {
    pub fn is_geneve(&self) -> bool {
        self.vni.is_some()
    }

    /// Whether `ip` is a source address at any depth of the frame.
    pub fn has_src(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => self.ipv4_src.contains(&a),
            IpAddr::V6(a) => self.ipv6_src.contains(&a),
        }
    }

    pub fn has_option(&self, class: u16, typ: u8) -> bool {
        self.options.contains(&(class, typ))
    }
}

/// The tshark fields [`parse_fields_line`] expects, in order.
pub const FIELDS: [&str; 10] = [
    "frame.len",
    "ipv6.src",
    "ipv6.dst",
    "ip.src",
    "ip.dst",
    "geneve.vni",
    "geneve.option.class",
    "geneve.option.type",
    "ipv6.tclass",
    "ip.dsfield",
];

impl Capture {
    /// Starts `tcpdump` on `iface` in `ns` writing to `file`, with an optional BPF
    /// `filter`, and returns once tcpdump says it is listening (so no frame sent
    /// after this returns is missed).
    pub fn start(ns: &Netns, iface: &str, file: &Path, filter: &str) -> Result<Capture> {
        let mut cmd = ns.cmd("tcpdump").args([
            "-i",
            iface,
            // Without it libpcap hands frames over a block at a time (TPACKET_V3),
            // and the frames of the block still open when tcpdump is stopped are
            // never written: the last second or so before `stop` went missing.
            "--immediate-mode",
            "-U",
            "-n",
            "-s",
            SNAPLEN,
            "-w",
            &file.display().to_string(),
        ]);
        if !filter.is_empty() {
            cmd = cmd.arg(filter);
        }
        let mut child = cmd.spawn_with(Stdio::null(), Stdio::piped())?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| Error::new("tcpdump's stderr was not captured"))?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr)
                .lines()
                .map_while(std::result::Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut capture = Capture {
            child: Some(child),
            file: file.to_path_buf(),
            iface: iface.to_string(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut said = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains("listening on") => return Ok(capture),
                Ok(line) => {
                    said.push_str(&line);
                    said.push('\n');
                }
                Err(_) => {
                    let _ = capture.kill();
                    return Err(Error::new(format!(
                        "`{}` did not start listening: {said}",
                        cmd.display()
                    )));
                }
            }
        }
    }

    fn kill(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            let pid = libc::pid_t::try_from(c.id())
                .map_err(|_| Error::new(format!("pid {} out of range", c.id())))?;
            // SAFETY: kill(2) on our own unreaped child's pid, which cannot have been
            // reused. SIGINT makes tcpdump flush and close the file cleanly.
            unsafe { libc::kill(pid, libc::SIGINT) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while c.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    c.kill()?;
                    c.wait()?;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// Decodes what was captured so far, leaving the capture running (for polling
    /// until an expected frame shows up).
    pub fn frames_so_far(&self) -> Result<Vec<Frame>> {
        decode(&self.file).with_context(|| format!("capture on {}", self.iface))
    }

    /// Polls until `want` holds for the frames captured so far, at most `timeout`.
    pub fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        want: impl Fn(&[Frame]) -> bool,
    ) -> Result<()> {
        crate::poll::poll_until(what, timeout, || {
            let frames = self.frames_so_far()?;
            if want(&frames) {
                Ok(())
            } else {
                Err(Error::new(format!("{} frames captured", frames.len())))
            }
        })
    }

    /// Stops the capture and decodes every frame.
    pub fn stop(mut self) -> Result<Vec<Frame>> {
        self.kill()?;
        decode(&self.file).with_context(|| format!("capture on {}", self.iface))
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if let Err(e) = self.kill() {
            eprintln!("e2e cleanup: stopping tcpdump on {}: {e}", self.iface);
        }
    }
}

/// Decodes a pcap file with tshark into [`Frame`]s.
pub fn decode(file: &Path) -> Result<Vec<Frame>> {
    let mut cmd = Cmd::new("tshark")
        .args(["-n", "-r", &file.display().to_string(), "-T", "fields"])
        .args([
            "-E",
            "separator=/t",
            "-E",
            "occurrence=a",
            "-E",
            "aggregator=,",
        ]);
    for f in FIELDS {
        cmd = cmd.args(["-e", f]);
    }
    cmd.run()?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(parse_fields_line)
        .collect()
}

/// Parses one line of `tshark -T fields` output for [`FIELDS`].
pub fn parse_fields_line(line: &str) -> Result<Frame> {
    let cols: Vec<&str> = line.split('\t').collect();
    let [len, src, dst, src4, dst4, vni, classes, types, tclass, tos] = cols[..] else {
        return Err(Error::new(format!(
            "tshark line {line:?} has {} fields, expected {}",
            cols.len(),
            FIELDS.len()
        )));
    };
    let list = |s: &str| -> Vec<String> {
        s.split(',')
            .filter(|x| !x.is_empty())
            .map(str::to_string)
            .collect()
    };
    fn addrs<A: std::str::FromStr>(s: &str, line: &str) -> Result<Vec<A>> {
        s.split(',')
            .filter(|x| !x.is_empty())
            .map(|a| {
                a.parse()
                    .map_err(|_| Error::new(format!("bad address {a:?} in {line:?}")))
            })
            .collect()
    }
    let num = |s: &str| -> Result<u64> {
        let parsed = match s.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => s.parse(),
        };
        parsed.map_err(|_| Error::new(format!("bad number {s:?} in {line:?}")))
    };
    let classes = list(classes);
    let types = list(types);
    if classes.len() != types.len() {
        return Err(Error::new(format!(
            "{} option classes but {} types in {line:?}",
            classes.len(),
            types.len()
        )));
    }
    let options = classes
        .iter()
        .zip(&types)
        .map(|(c, t)| {
            let c = u16::try_from(num(c)?).map_err(|_| Error::new(format!("class {c}")))?;
            let t = u8::try_from(num(t)?).map_err(|_| Error::new(format!("type {t}")))?;
            Ok((c, t))
        })
        .collect::<Result<Vec<_>>>()?;
    let vni = match list(vni).first() {
        Some(v) => {
            Some(u32::try_from(num(v)?).map_err(|_| Error::new(format!("VNI {v} in {line:?}")))?)
        }
        None => None,
    };
    let bytes = |s: &str| -> Result<Vec<u8>> {
        list(s)
            .iter()
            .map(|b| u8::try_from(num(b)?).map_err(|_| Error::new(format!("class {b}"))))
            .collect()
    };
    Ok(Frame {
        ipv6_tclass: bytes(tclass)?,
        ipv4_tos: bytes(tos)?,
        len: u32::try_from(num(len)?).map_err(|_| Error::new(format!("length {len}")))?,
        ipv6_src: addrs(src, line)?,
        ipv6_dst: addrs(dst, line)?,
        ipv4_src: addrs(src4, line)?,
        ipv4_dst: addrs(dst4, line)?,
        vni,
        options,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_geneve_line_with_oxide_mss_option() {
        let f = parse_fields_line(
            "9014\tfd00:99::1\tfd00:99::2\t10.0.0.11\t10.0.0.12\t10\t0x0129\t0x02\t0x000000ba\t0xba",
        )
        .unwrap();
        assert_eq!(f.len, 9014);
        assert_eq!(f.vni, Some(10));
        assert_eq!(f.ipv6_src[0], "fd00:99::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(f.ipv6_dst.len(), 1);
        assert!(f.has_src("10.0.0.11".parse().unwrap()));
        assert!(!f.has_src("10.0.0.12".parse().unwrap()));
        assert!(f.has_option(OXIDE_OPTION_CLASS, OXIDE_OPTION_MSS));
        assert_eq!((f.ipv6_tclass, f.ipv4_tos), (vec![0xba], vec![0xba]));
    }

    #[test]
    fn parses_plain_frame_and_rejects_garbage() {
        let f = parse_fields_line("86\tfe80::1\tff02::1\t\t\t\t\t\t0x00000000\t").unwrap();
        assert!(!f.is_geneve());
        assert!(f.options.is_empty());
        assert!(parse_fields_line("86\tfe80::1").is_err());
        assert!(parse_fields_line("x\t\t\t\t\t\t\t\t\t").is_err());
        assert!(parse_fields_line("60\t\t\t\t\t10\t0x0129,0x0129\t0x02\t\t").is_err());
        assert!(parse_fields_line("60\t\t\t\t\t\t\t\t0x100\t").is_err());
    }
}
