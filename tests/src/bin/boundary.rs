//! boundary: the rack's boundary-services switch, for the end-to-end tests (see
//! `e2e::boundary`).
//!
//!   boundary --listen UNDERLAY_ADDR --tun NAME --stats FILE [--boundary-vni N]
//!            [--ingress IP[:LO-HI]=SLED,VNI,MAC]...
//!
//! Geneve from the sleds (UDP 6081 at UNDERLAY_ADDR) is decapsulated into tun NAME
//! (which must exist); IP packets read from the tun are encapsulated, marked
//! External, toward the sled of the first matching ingress entry. Counters are
//! rewritten to FILE after every packet. Runs until killed.

// The switch's tun device is opened with an ioctl std does not wrap; each `unsafe`
// block carries its `// SAFETY:` line.
#![allow(unsafe_code)]

use e2e::boundary::{destination, Ingress, Switch, SwitchCounters, GENEVE_PORT};
use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::ExitCode;

const BUF: usize = 65536;
/// `linux/udp.h`: accept UDP over IPv6 with a zero checksum, which tunnels send
/// (RFC 6935) and the sleds do by default; Linux drops them otherwise.
const UDP_NO_CHECK6_RX: libc::c_int = 102;

struct Args {
    listen: Ipv6Addr,
    tun: String,
    stats: PathBuf,
    switch: Switch,
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let (mut listen, mut tun, mut stats) = (None, None, None);
    let mut switch = Switch {
        ingress: Vec::new(),
        boundary_vni: 99,
        counters: SwitchCounters::default(),
    };
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => {
                listen = Some(
                    value
                        .parse()
                        .map_err(|_| format!("--listen {value:?}: not an IPv6 address"))?,
                );
            }
            "--tun" => tun = Some(value),
            "--stats" => stats = Some(PathBuf::from(value)),
            "--boundary-vni" => {
                switch.boundary_vni = value
                    .parse()
                    .map_err(|_| format!("--boundary-vni {value:?}: not a number"))?;
            }
            "--ingress" => switch
                .ingress
                .push(Ingress::parse(&value).map_err(|e| e.0)?),
            _ => return Err(format!("unknown argument {flag:?}")),
        }
    }
    Ok(Args {
        listen: listen.ok_or("--listen is required")?,
        tun: tun.ok_or("--tun is required")?,
        stats: stats.ok_or("--stats is required")?,
        switch,
    })
}

/// Attaches to the existing tun device `name` (IFF_TUN, no packet information).
fn open_tun(name: &str) -> Result<File, String> {
    let f = File::options()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(|e| format!("/dev/net/tun: {e}"))?;
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= req.ifr_name.len() {
        return Err(format!("tun name {name:?} is too long"));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads and writes an ifreq, which `req` is, on an open fd.
    if unsafe { libc::ioctl(f.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
        return Err(format!(
            "TUNSETIFF {name}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(f)
}

fn run(mut a: Args) -> Result<(), String> {
    let sock = UdpSocket::bind(SocketAddr::from((a.listen, GENEVE_PORT)))
        .map_err(|e| format!("binding [{}]:{GENEVE_PORT}: {e}", a.listen))?;
    let on: libc::c_int = 1;
    // SAFETY: setsockopt reads an int of the size passed, from a live local.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            UDP_NO_CHECK6_RX,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(format!(
            "UDP_NO_CHECK6_RX: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mut tun = open_tun(&a.tun)?;
    let save = |sw: &Switch| {
        sw.save(&a.stats)
            .map_err(|e| format!("writing {}: {e}", a.stats.display()))
    };
    save(&a.switch)?;
    let mut buf = vec![0u8; BUF];
    loop {
        let mut fds = [
            libc::pollfd {
                fd: sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: tun.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is an array of two pollfd, its length passed with it.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("poll: {e}"));
        }
        if fds[0].revents & libc::POLLIN != 0 {
            let (n, from) = sock
                .recv_from(&mut buf)
                .map_err(|e| format!("receiving: {e}"))?;
            if let Some(ip) = a.switch.from_sled(&buf[..n]) {
                if let Err(e) = tun.write_all(ip) {
                    eprintln!("boundary: to the internet from {from}: {e}");
                }
            }
            save(&a.switch)?;
        }
        if fds[1].revents & libc::POLLIN != 0 {
            let n = tun
                .read(&mut buf)
                .map_err(|e| format!("reading {}: {e}", a.tun))?;
            match a.switch.from_internet(&buf[..n]) {
                Some((sled, geneve)) => {
                    if let Err(e) = sock.send_to(&geneve, SocketAddr::from((sled, GENEVE_PORT))) {
                        eprintln!("boundary: to sled {sled}: {e}");
                    }
                }
                None => {
                    let dst = destination(&buf[..n]);
                    if !dst.is_some_and(|(d, _)| d.is_multicast()) {
                        eprintln!("boundary: no ingress entry for {dst:?} ({n} bytes)");
                    }
                }
            }
            save(&a.switch)?;
        }
    }
}

fn main() -> ExitCode {
    let result = parse_args().and_then(run);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("boundary: {e}");
            ExitCode::FAILURE
        }
    }
}
