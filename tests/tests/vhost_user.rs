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
use e2e::{Context, Error, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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
for i in 1 2 3 4 5 6 7 8 9 10; do
  if ping -6 -c 1 -W 3 -s "$size6" "$peer6" >/dev/null 2>&1; then echo "VM-PING6-OK"; break; fi
done
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

/// The guest kernel and initramfs, built from Debian's packages on first use.
fn assets() -> Result<(PathBuf, PathBuf)> {
    let dir = cache_dir();
    let (kernel, initrd) = (dir.join("vmlinuz"), dir.join("initrd.cpio.gz"));
    if kernel.exists() && initrd.exists() {
        return Ok((kernel, initrd));
    }
    let work = dir.join("build");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(work.join("root/lib/modules"))?;
    let init = INIT.replace("MODULES", &MODULES.join(" "));
    std::fs::write(work.join("root/init"), init)?;
    // The cloud kernel's metapackage names the versioned image it depends on.
    sh(
        r#"
        image=$(apt-cache depends linux-image-cloud-amd64 | sed -n 's/.*Depends: \(linux-image-[0-9].*\)/\1/p' | head -n1)
        apt-get download -q "$image" busybox-static >/dev/null
        for d in *.deb; do dpkg-deb -x "$d" x; done
        cp x/boot/vmlinuz-* ../vmlinuz.new
        mkdir -p root/bin root/proc root/sys root/dev
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
    /// (QEMU connects: overlayd listens), `append` added to the kernel command line.
    fn boot(sock: &Path, mac: &str, append: &str, serial: PathBuf) -> Result<Qemu> {
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
            .arg(format!("socket,id=vu0,path={},reconnect=1", sock.display()))
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
        let start = Instant::now();
        loop {
            let console = self.console();
            if console.contains("VM-DONE") {
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
                    "the guest was not done within {limit:?}; console:\n{console}"
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

#[test]
fn vm_on_vhost_user_port_gets_mtu_8500_and_pings_across_sleds_at_full_size() -> Result<()> {
    let rack = standard::rack("vu", &[])?;
    let vm = GuestSpec::dual("vu1", 0, 5);
    let sock = rack.dir().join("vu1.sock");
    let mut args = vm.create_args("-");
    let at = args
        .iter()
        .position(|a| a == "--netns")
        .ok_or_else(|| Error::new("create-xde arguments without --netns"))?;
    args.drain(at..at + 2);
    args.extend(["--vhost-user".into(), sock.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    rack.sled(0)?.admin(&args)?;
    let sled0 = rack.sled(0)?.addr.to_string();
    for ip in vm.addresses() {
        let vni = vm.vni.to_string();
        rack.sled(1)?
            .admin(&["set-v2p", &ip.to_string(), &vm.mac, &sled0, &vni])?;
    }

    let peer = rack.guest(B1)?;
    let (Some(ip4), Some(ip6)) = (vm.ipv4, vm.ipv6) else {
        return Err(Error::new("the VM's spec is dual-stack"));
    };
    let append = format!(
        "vm.ip4={ip4} vm.gw4={} vm.ip6={ip6} vm.gw6={} vm.peer4={} vm.peer6={} \
         vm.size4={} vm.size6={}",
        vm.gateway_ipv4,
        vm.gateway_ipv6()?,
        peer.ipv4()?,
        peer.ipv6()?,
        JUMBO_MTU - 28,
        JUMBO_MTU - 48,
    );
    let mut qemu = Qemu::boot(&sock, &vm.mac, &append, rack.dir().join("vu1.console"))?;
    let console = qemu.wait_done(Duration::from_secs(300))?;
    let lines: Vec<&str> = console.lines().filter(|l| l.starts_with("VM-")).collect();
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
