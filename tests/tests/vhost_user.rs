//! A real VM on a vhost-user port: QEMU (TCG: nested KVM fails on these machines)
//! boots Debian's cloud kernel with a busybox initramfs, its virtio-net device
//! served by overlayd over vhost-user, and the guest's own kernel shows what the
//! port negotiated: the link MTU from `VIRTIO_NET_F_MTU`, and jumbo pings to a
//! namespace guest on the other sled, IPv4 and IPv6.
//!
//! The guest kernel and busybox come from Debian's packages (`apt-get download`),
//! extracted once into a cache under the target directory.

use e2e::guest::{GuestSpec, JUMBO_MTU};
use e2e::standard::{self, B1};
use e2e::{Context, Error, Guest, Rack, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The virtio modules of the cloud kernel, in dependency order.
const MODULES: [&str; 8] = [
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "failover",
    "net_failover",
    "virtio_net",
];

/// The guest's init: loads virtio-net, reports the link MTU, configures the
/// addresses given on the kernel command line (`vm.NAME=VALUE`), pings the peer
/// at full size in both families and powers off. Every result is a line starting
/// with `VM-` on the serial console.
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in MODULES; do insmod /lib/modules/$m.ko || echo "VM-INSMOD-FAIL $m"; done
for kv in $(cat /proc/cmdline); do
  case "$kv" in vm.*=*) k=${kv%%=*}; k=${k#vm.}; eval "$k=${kv#*=}";; esac
done
ip link set lo up
# As the namespace guests (busybox's ip has no nodad).
echo 0 > /proc/sys/net/ipv6/conf/eth0/accept_dad
echo 1 > /proc/sys/net/ipv6/conf/eth0/accept_ra
ip link set eth0 up
echo "VM-MTU $(cat /sys/class/net/eth0/mtu)"
# As a VPC guest is configured: everything through the gateway.
ip addr add "$ip4/32" dev eth0 || echo "VM-ERR ipv4 address"
ip route add "$gw4" dev eth0 scope link || echo "VM-ERR ipv4 gateway"
ip route add default via "$gw4" dev eth0 || echo "VM-ERR ipv4 route"
ip -6 addr add "$ip6/128" dev eth0 || echo "VM-ERR ipv6 address"
ip -6 route add default via "$gw6" dev eth0 || echo "VM-ERR ipv6 route"
for i in 1 2 3 4 5 6 7 8 9 10; do
  if ping -c 1 -W 3 -s "$size4" "$peer4" >/dev/null 2>&1; then echo "VM-PING4-OK"; break; fi
done
if [ "$job" = ping ]; then
  for i in 1 2 3 4 5 6 7 8 9 10; do
    if ping -6 -c 1 -W 3 -s "$size6" "$peer6" >/dev/null 2>&1; then echo "VM-PING6-OK"; break; fi
  done
fi
if [ "$job" = tcp ]; then
  dd if=/dev/urandom of=/tmp/data bs=1048576 count="$mib" 2>/dev/null
  echo "VM-MD5 $(md5sum /tmp/data | cut -d' ' -f1)"
  echo "VM-TCP-START"
  nc "$peer4" "$port" < /tmp/data && echo "VM-TCP-SENT"
fi
sed -n 's/^ *eth0:/VM-COUNTERS/p' /proc/net/dev
echo "VM-DONE"
poweroff -f
"#;

/// Where the kernel and initramfs are kept between runs.
fn cache_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("vm-assets")
}

fn sh(script: &str, dir: &Path) -> Result<String> {
    let out = Command::new("sh")
        .arg("-euc")
        .arg(script)
        .current_dir(dir)
        .output()
        .with_context(|| format!("sh -c {script:?}"))?;
    if !out.status.success() {
        return Err(Error::new(format!(
            "{script:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The guest kernel and initramfs, built from Debian's packages on first use
/// (once per test process: the tests run in parallel).
fn assets() -> Result<(PathBuf, PathBuf)> {
    static ASSETS: Mutex<()> = Mutex::new(());
    let _one = ASSETS.lock().unwrap_or_else(|p| p.into_inner());
    build_assets()
}

fn build_assets() -> Result<(PathBuf, PathBuf)> {
    let dir = cache_dir();
    let init = INIT.replace("MODULES", &MODULES.join(" "));
    // Named for its init's contents: a changed init builds a new initramfs.
    let id = init.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let (kernel, initrd) = (
        dir.join("vmlinuz"),
        dir.join(format!("initrd-{id:016x}.cpio.gz")),
    );
    if kernel.exists() && initrd.exists() {
        return Ok((kernel, initrd));
    }
    let work = dir.join("build");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(work.join("root/lib/modules"))?;
    std::fs::write(work.join("root/init"), init)?;
    // The cloud kernel's metapackage names the versioned image it depends on.
    sh(
        r#"
        image() { apt-cache depends linux-image-cloud-amd64 2>/dev/null | sed -n 's/.*Depends: \(linux-image-[0-9].*\)/\1/p' | head -n1; }
        # A fresh machine may have no package lists yet.
        [ -n "$(image)" ] || apt-get update -qq
        image=$(image)
        apt-get download -q "$image" busybox-static >/dev/null
        for d in *.deb; do dpkg-deb -x "$d" x; done
        cp x/boot/vmlinuz-* ../vmlinuz.new
        mkdir -p root/bin root/proc root/sys root/dev root/tmp
        cp x/bin/busybox root/bin/busybox
        for m in MODULES; do cp "$(find x/lib/modules -name "$m.ko" | head -n1)" root/lib/modules/; done
        chmod +x root/init
        # The guest's own busybox makes the archive: no cpio needed on the host.
        (cd root && find . | ./bin/busybox cpio -o -H newc) > initrd.cpio
        gzip -1 < initrd.cpio > ../initrd.cpio.gz.new
        "#
        .replace("MODULES", &MODULES.join(" "))
        .as_str(),
        &work,
    )?;
    std::fs::rename(dir.join("vmlinuz.new"), &kernel)?;
    std::fs::rename(dir.join("initrd.cpio.gz.new"), &initrd)?;
    let _ = std::fs::remove_dir_all(&work);
    Ok((kernel, initrd))
}

/// A QEMU process, killed (by its own pid) when dropped.
struct Qemu {
    child: Child,
    serial: PathBuf,
}

impl Qemu {
    /// Boots the test VM with its virtio-net device on vhost-user socket `sock`
    /// (`listen`: QEMU is the socket's server, overlayd its client), `append` added
    /// to the kernel command line.
    fn boot(sock: &Path, listen: bool, mac: &str, append: &str, serial: PathBuf) -> Result<Qemu> {
        let (kernel, initrd) = assets()?;
        let child = Command::new("qemu-system-x86_64")
            .args(["-accel", "tcg", "-cpu", "max", "-m", "512", "-smp", "1"])
            .args(["-display", "none", "-no-reboot", "-nodefaults"])
            .arg("-serial")
            .arg(format!("file:{}", serial.display()))
            .arg("-kernel")
            .arg(&kernel)
            .arg("-initrd")
            .arg(&initrd)
            .arg("-append")
            .arg(format!("console=ttyS0 panic=-1 {append}"))
            // vhost-user needs the guest's memory shared with the backend.
            .args([
                "-object",
                "memory-backend-memfd,id=mem,size=512M,share=on",
                "-machine",
                "memory-backend=mem",
            ])
            .arg("-chardev")
            .arg(format!(
                "socket,id=vu0,path={},{}",
                sock.display(),
                if listen {
                    "server=on,wait=off"
                } else {
                    "reconnect=1"
                }
            ))
            .args(["-netdev", "vhost-user,id=n0,chardev=vu0"])
            // vectors=0: QEMU 7.2 under TCG crashes (null dereference in
            // msix_set_vector_notifiers) starting a vhost-user device with MSI-X;
            // the guest then uses a legacy interrupt.
            .arg("-device")
            .arg(format!(
                "virtio-net-pci,netdev=n0,mac={mac},host_mtu={JUMBO_MTU},vectors=0,mrg_rxbuf=on,\
                 csum=on,guest_csum=on,host_tso4=on,host_tso6=on,guest_tso4=on,guest_tso6=on"
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("qemu-system-x86_64")?;
        Ok(Qemu { child, serial })
    }

    fn console(&self) -> String {
        std::fs::read_to_string(&self.serial).unwrap_or_default()
    }

    /// Waits for the guest to print `VM-DONE` (or for QEMU to exit); returns
    /// the console.
    fn wait_done(&mut self, limit: Duration) -> Result<String> {
        self.wait_for("VM-DONE", limit)
    }

    /// Waits for the guest to print `line` (or for QEMU to exit); returns the
    /// console.
    fn wait_for(&mut self, line: &str, limit: Duration) -> Result<String> {
        let start = Instant::now();
        loop {
            let console = self.console();
            if console.lines().any(|l| l.starts_with(line)) {
                return Ok(console);
            }
            if let Some(st) = self.child.try_wait()? {
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                return Err(Error::new(format!(
                    "qemu exited ({st}) before the guest was done: {err}\nconsole:\n{console}"
                )));
            }
            if start.elapsed() > limit {
                return Err(Error::new(format!(
                    "the guest did not print {line:?} within {limit:?}; console:\n{console}"
                )));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The test VM's port: `vu1` on sled 0, its V2P published on sled 1.
struct VmPort {
    spec: GuestSpec,
    sock: PathBuf,
    /// overlayd connects (QEMU listens) rather than the other way round.
    client: bool,
}

impl VmPort {
    fn create(rack: &Rack, client: bool) -> Result<VmPort> {
        let spec = GuestSpec::dual("vu1", 0, 5);
        let sock = rack.dir().join("vu1.sock");
        let mut args = spec.create_args(None);
        args.extend(["--vhost-user".into(), sock.display().to_string()]);
        if client {
            args.extend(["--vhost-user-mode".into(), "client".into()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        rack.sled(0)?.admin(&args)?;
        let sled0 = rack.sled(0)?.addr.to_string();
        let vni = spec.vni.to_string();
        for ip in spec.addresses() {
            rack.sled(1)?
                .admin(&["set-v2p", &ip.to_string(), &spec.mac, &sled0, &vni])?;
        }
        Ok(VmPort { spec, sock, client })
    }

    /// Boots the VM to run `job` (`vm.job=...` and the rest of `extra` on its
    /// command line) against guest `peer`.
    fn boot(&self, rack: &Rack, peer: &Guest, extra: &str) -> Result<Qemu> {
        let (Some(ip4), Some(ip6)) = (self.spec.ipv4, self.spec.ipv6) else {
            return Err(Error::new("the VM's spec is dual-stack"));
        };
        let append = format!(
            "vm.ip4={ip4} vm.gw4={} vm.ip6={ip6} vm.gw6={} vm.peer4={} vm.peer6={} \
             vm.size4={} vm.size6={} {extra}",
            self.spec.gateway_ipv4,
            self.spec.gateway_ipv6()?,
            peer.ipv4()?,
            peer.ipv6()?,
            JUMBO_MTU - 28,
            JUMBO_MTU - 48,
        );
        let serial = rack.dir().join("vu1.console");
        Qemu::boot(&self.sock, self.client, &self.spec.mac, &append, serial)
    }
}

/// The `VM-` lines of a console.
fn vm_lines(console: &str) -> Vec<&str> {
    console.lines().filter(|l| l.starts_with("VM-")).collect()
}

#[test]
fn vm_on_vhost_user_port_gets_mtu_8500_and_pings_across_sleds_at_full_size() -> Result<()> {
    let rack = standard::rack("vu", &[])?;
    let vm = VmPort::create(&rack, false)?;
    let mut qemu = vm.boot(&rack, rack.guest(B1)?, "vm.job=ping")?;
    let console = qemu.wait_done(Duration::from_secs(300))?;
    let lines = vm_lines(&console);
    assert!(
        lines.contains(&format!("VM-MTU {JUMBO_MTU}").as_str()),
        "the guest's link MTU is not {JUMBO_MTU}: {lines:?}\n{console}"
    );
    assert!(
        lines.contains(&"VM-PING4-OK"),
        "no full-size IPv4 ping: {lines:?}\n{console}"
    );
    assert!(
        lines.contains(&"VM-PING6-OK"),
        "no full-size IPv6 ping: {lines:?}\n{console}"
    );
    Ok(())
}

/// Receives `bytes` on TCP `port` in `guest`'s namespace and prints their MD5
/// (python3: the receiver needs no more than the harness has).
fn md5_receiver(guest: &Guest, port: u16, bytes: u64) -> Result<Child> {
    let script = format!(
        "import socket,hashlib\n\
         s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         s.settimeout(60);s.bind(('0.0.0.0',{port}));s.listen(1);c,_=s.accept()\n\
         c.settimeout(120);h=hashlib.md5();n=0\n\
         while n<{bytes}:\n b=c.recv(1<<20)\n if not b: break\n h.update(b);n+=len(b)\n\
         print(n,h.hexdigest())\n"
    );
    Command::new("ip")
        .args(["netns", "exec", guest.ns.name(), "python3", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("python3 receiver")
}

/// The receiver's `BYTES MD5` line.
fn received(rx: Child) -> Result<String> {
    let out = rx.wait_with_output()?;
    if !out.status.success() {
        return Err(Error::new(format!(
            "receiver: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The MD5 the VM printed for the data it sent.
fn sent_md5(console: &str) -> Result<&str> {
    console
        .lines()
        .find_map(|l| l.strip_prefix("VM-MD5 "))
        .map(str::trim)
        .ok_or_else(|| Error::new(format!("no VM-MD5 line:\n{console}")))
}

/// Sums a counter over the ports of sled `index`.
fn sled_counter(rack: &Rack, index: usize, name: &str) -> Result<u64> {
    let counters = e2e::stats::parse(&rack.sled(index)?.admin(&["--json", "stats"])?)?;
    Ok(e2e::stats::sum(&counters, name))
}

const MIB: u64 = 1 << 20;

/// A transfer of `mib` MiB of random bytes from the VM to guest B1 (TCP port 5001).
struct Transfer {
    rx: Child,
    qemu: Qemu,
    bytes: u64,
}

impl Transfer {
    /// Starts B1's receiver, then boots the VM to send.
    fn start(rack: &Rack, vm: &VmPort, mib: u64) -> Result<Transfer> {
        let peer = rack.guest(B1)?;
        let bytes = mib * MIB;
        let rx = md5_receiver(peer, 5001, bytes)?;
        let job = format!("vm.job=tcp vm.mib={mib} vm.port=5001");
        let qemu = vm.boot(rack, peer, &job)?;
        Ok(Transfer { rx, qemu, bytes })
    }

    /// Waits for the VM to be done and checks that B1 received every byte and
    /// that the VM's sender succeeded; returns the VM's console.
    fn finish(mut self) -> Result<String> {
        let console = self.qemu.wait_done(Duration::from_secs(600))?;
        let got = received(self.rx).map_err(|e| e.context(format!("console:\n{console}")))?;
        let want = format!("{} {}", self.bytes, sent_md5(&console)?);
        assert_eq!(
            got, want,
            "received (bytes md5) differs from sent; console:\n{console}"
        );
        assert!(
            vm_lines(&console).contains(&"VM-TCP-SENT"),
            "the VM's sender failed: {console}"
        );
        Ok(console)
    }
}

#[test]
fn vm_on_vhost_user_port_sends_tcp_across_sleds_with_tso() -> Result<()> {
    let rack = standard::rack("vut", &[])?;
    let vm = VmPort::create(&rack, false)?;
    let tso_before = sled_counter(&rack, 0, e2e::stats::TSO_BUFFERS)?;
    let console = Transfer::start(&rack, &vm, 16)?.finish()?;
    let tso = sled_counter(&rack, 0, e2e::stats::TSO_BUFFERS)? - tso_before;
    assert!(
        tso > 0,
        "the VM sent no TSO buffer (tso_buffers_in did not grow); console:\n{console}"
    );
    Ok(())
}

#[test]
fn vm_on_client_mode_port_survives_sigkill_and_restart_of_overlayd_mid_transfer() -> Result<()> {
    let mut rack = standard::rack("vur", &[])?;
    let vm = VmPort::create(&rack, true)?;
    let mut transfer = Transfer::start(&rack, &vm, 128)?;
    transfer
        .qemu
        .wait_for("VM-TCP-START", Duration::from_secs(300))?;
    std::thread::sleep(Duration::from_millis(500));
    rack.kill_daemon(0)?;
    let at_kill = transfer.qemu.console();
    assert!(
        !at_kill.contains("VM-TCP-SENT"),
        "the transfer was over before the kill: {:?}",
        vm_lines(&at_kill)
    );
    // The new daemon restores the port from its state and connects to QEMU again.
    rack.start_daemon(0, &[])?;
    transfer.finish()?;
    let log = rack.sled(0)?.daemon()?.log();
    assert!(
        log.contains("vhost-user front end connected"),
        "the restarted daemon did not reconnect to QEMU:\n{log}"
    );
    Ok(())
}
