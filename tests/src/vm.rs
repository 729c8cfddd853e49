//! Virtual machines as guests: a real guest kernel (Debian's cloud kernel, virtio-net)
//! in QEMU, attached to a port the way a hypervisor attaches it, and driven by the
//! test over a serial line.
//!
//! - [`GuestImage`]: the kernel and initramfs `tests/vm/build-guest.sh` assembles from
//!   Debian packages and caches between runs.
//! - [`Accel`]: KVM where a probe shows a kernel actually boots with it, else TCG
//!   (nested KVM on some machines starts a VM that never gets through the kernel's
//!   boot; see docs/testing.md).
//! - [`Attachment`]: how the VM's tap reaches the port.
//! - [`Vm`]: the QEMU process, its tap and the guest's command channel. The guest's
//!   init (tests/vm/init) configures the network as a VM's OS does (DHCP, RA) and
//!   then runs one shell command per line received on its second serial port,
//!   answering with the output and `@@END <status>`. Every QEMU also serves QMP,
//!   through which [`Vm::migrate_to`] live-migrates the guest into a QEMU started
//!   by [`Vm::receive_migration`].

use crate::cmd::{terminate, Cmd};
use crate::guest::{create_port, GuestSpec};
use crate::netns::Netns;
use crate::rack::Sled;
use crate::{Context, Error, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::Ipv6Addr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The QEMU binary (package qemu-system-x86).
pub const QEMU: &str = "qemu-system-x86_64";

/// How long a boot may take until the guest's command channel is ready: about 3 s
/// under TCG on an idle machine, but TCG is CPU-bound and the test machines are
/// small and shared.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(180);

/// How long the KVM probe waits for a kernel to reach its end of boot: about a
/// second where KVM works (two under TCG). Too short a wait only costs speed: the
/// VM then runs under TCG.
const KVM_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a live migration may take from `migrate` to `completed`: 2.5 to 4.5 s
/// here for a 512 MiB guest under TCG with transfers running both ways, but QEMU
/// copies again what the guest writes meanwhile, and a loaded machine runs both
/// slower.
pub const MIGRATION_TIMEOUT: Duration = Duration::from_secs(300);

/// How long QEMU may take to answer a QMP command (it answers between two slices
/// of guest execution, which under TCG on a loaded machine can be long).
const QMP_TIMEOUT: Duration = Duration::from_secs(60);

/// Environment variable forcing the accelerator (`kvm` or `tcg`), skipping the probe.
pub const ACCEL_ENV: &str = "OVERLAY_TEST_VM_ACCEL";

/// What the guest prints when its command channel is ready, and after each command.
const READY: &str = "@@READY";
const END: &str = "@@END ";

/// The guest's kernel and initramfs.
#[derive(Clone, Debug)]
pub struct GuestImage {
    /// The cache directory holding `vmlinuz`, `initrd.img` and `versions`.
    pub dir: PathBuf,
    /// How long `build-guest.sh` took in this process (building or finding the cache).
    pub prepared_in: Duration,
}

impl GuestImage {
    /// Builds (or finds in the cache) the guest image, once per test process.
    pub fn get() -> Result<&'static GuestImage> {
        static IMAGE: OnceLock<Result<GuestImage>> = OnceLock::new();
        IMAGE
            .get_or_init(GuestImage::build)
            .as_ref()
            .map_err(Clone::clone)
    }

    fn build() -> Result<GuestImage> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("vm/build-guest.sh");
        let started = Instant::now();
        let out = Cmd::new(script.display().to_string())
            .timeout(Duration::from_secs(600))
            .output()?;
        if !out.status.success() {
            return Err(Error::new(format!(
                "building the VM guest image with {} failed ({}): {}",
                script.display(),
                out.status,
                out.stderr.trim()
            )));
        }
        let dir = out
            .stdout
            .lines()
            .last()
            .map(PathBuf::from)
            .ok_or_else(|| Error::new(format!("{} printed no directory", script.display())))?;
        let image = GuestImage {
            dir,
            prepared_in: started.elapsed(),
        };
        for f in [image.kernel(), image.initrd()] {
            if !f.is_file() {
                return Err(Error::new(format!(
                    "{} did not make {}",
                    script.display(),
                    f.display()
                )));
            }
        }
        Ok(image)
    }

    pub fn kernel(&self) -> PathBuf {
        self.dir.join("vmlinuz")
    }

    pub fn initrd(&self) -> PathBuf {
        self.dir.join("initrd.img")
    }

    /// The packages the image was made of (`build-guest.sh`'s `versions` file).
    pub fn versions(&self) -> String {
        std::fs::read_to_string(self.dir.join("versions"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }
}

/// How QEMU runs the guest's CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualization, the host's CPU model.
    Kvm,
    /// QEMU's binary translator emulating its most capable CPU: slow but works
    /// everywhere.
    Tcg,
}

impl Accel {
    /// QEMU's `-accel` and `-cpu` values.
    fn qemu_args(self) -> [&'static str; 4] {
        match self {
            Accel::Kvm => ["-accel", "kvm", "-cpu", "host"],
            Accel::Tcg => ["-accel", "tcg", "-cpu", "max"],
        }
    }

    fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }

    /// The accelerator for this machine, once per test process: [`ACCEL_ENV`] if
    /// set; TCG without a usable `/dev/kvm`; else the probe's verdict, kept next to
    /// the image cache for this QEMU, host kernel and CPU (the probe costs
    /// [`KVM_PROBE_TIMEOUT`] where KVM hangs).
    pub fn for_this_machine(image: &GuestImage) -> Result<Accel> {
        static ACCEL: OnceLock<Result<Accel>> = OnceLock::new();
        ACCEL
            .get_or_init(|| Accel::choose(image))
            .as_ref()
            .map(|a| *a)
            .map_err(Clone::clone)
    }

    fn choose(image: &GuestImage) -> Result<Accel> {
        let qemu_version = Cmd::new(QEMU).arg("--version").run().map_err(|e| {
            e.context(format!(
                "{QEMU} is needed for the VM tests (package qemu-system-x86, \
                 installed by scripts/install-deps.sh)"
            ))
        })?;
        match std::env::var(ACCEL_ENV).as_deref() {
            Ok("kvm") => return Ok(Accel::Kvm),
            Ok("tcg") => return Ok(Accel::Tcg),
            Ok(other) => {
                return Err(Error::new(format!(
                    "{ACCEL_ENV}={other:?}: expected \"kvm\" or \"tcg\""
                )))
            }
            Err(_) => {}
        }
        if std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_err()
        {
            return Ok(Accel::Tcg);
        }
        let key = format!(
            "{} | {} | {}",
            qemu_version.lines().next().unwrap_or_default(),
            std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim(),
            std::fs::read_to_string("/proc/cpuinfo")
                .unwrap_or_default()
                .lines()
                .find(|l| l.starts_with("model name"))
                .unwrap_or_default()
        );
        let verdict_file = image.dir.parent().unwrap_or(&image.dir).join("kvm-probe");
        if let Ok(saved) = std::fs::read_to_string(&verdict_file) {
            if let Some((k, v)) = saved.trim_end().rsplit_once('\n') {
                if k == key {
                    match v {
                        "kvm" => return Ok(Accel::Kvm),
                        "tcg" => return Ok(Accel::Tcg),
                        _ => {}
                    }
                }
            }
        }
        let accel = if kvm_boots(image)? {
            Accel::Kvm
        } else {
            Accel::Tcg
        };
        std::fs::write(&verdict_file, format!("{key}\n{}\n", accel.name()))
            .with_context(|| format!("writing {}", verdict_file.display()))?;
        Ok(accel)
    }
}

/// Whether the guest kernel boots under KVM: booted without a root filesystem and
/// with `panic=-1`, it must reach its "Kernel panic" (the end of a boot that found
/// nothing to run) and QEMU must exit, within [`KVM_PROBE_TIMEOUT`].
fn kvm_boots(image: &GuestImage) -> Result<bool> {
    let log = tempfile_path("kvm-probe.log");
    let out = Cmd::new(QEMU)
        .args(Accel::Kvm.qemu_args())
        .args(["-m", "128", "-nodefaults", "-display", "none", "-no-reboot"])
        .arg("-kernel")
        .arg(image.kernel().display().to_string())
        .args(["-append", "console=ttyS0 panic=-1"])
        .arg("-serial")
        .arg(format!("file:{}", log.display()))
        .timeout(KVM_PROBE_TIMEOUT)
        .output();
    let console = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    let booted = out.is_ok() && console.contains("Kernel panic");
    eprintln!(
        "vm: KVM {} (probe: {})",
        if booted {
            "boots the guest"
        } else {
            "does not boot the guest; using TCG"
        },
        match &out {
            Ok(o) => format!("QEMU exited {}", o.status),
            Err(e) => e.to_string(),
        }
    );
    Ok(booted)
}

/// A path for a temporary file of this process.
fn tempfile_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("e2e-{}-{name}", std::process::id()))
}

/// What a VM is and how its virtio-net device looks to it.
#[derive(Clone, Debug)]
pub struct VmSpec {
    /// Short name (at most 12 bytes): QEMU's `-name` and the stem of the host-side
    /// interface names (`t-NAME`, `br-NAME`).
    pub name: String,
    /// The guest's MAC: its virtio NIC's, and the port's `--guest-mac`.
    pub mac: String,
    /// The link MTU the virtio device advertises (`host_mtu`): the port's MTU, as
    /// `xdeadm mtu PORT` says (`virtio_host_mtu`).
    pub host_mtu: u16,
    /// The guest's static IPv6 address (the datapath's RA carries no prefix for
    /// SLAAC; its addresses come from DHCPv6, which busybox has no client for).
    pub ipv6: Option<Ipv6Addr>,
    pub memory_mib: u32,
}

/// How the VM's tap (created by [`Vm::boot`] in the sled's namespace) reaches the
/// port.
#[derive(Clone, Debug)]
pub enum Attachment {
    /// The port was created without `--netns`: its tap (interface `port`, which
    /// carries `fe:` + the guest's MAC) and the VM's tap are joined in a Linux bridge
    /// `br-NAME`, as libvirt does.
    Bridge { port: String },
    /// The daemon attaches the port to the VM's tap itself: `create` is the
    /// `xdeadm create-xde` command of the port, which gets `--attach TAP` and runs
    /// once the tap exists, before QEMU starts (a hypervisor's tap exists before
    /// the port is made); `then` runs after it (the port's firewall rules).
    Attach { create: Cmd, then: Vec<Cmd> },
    /// A vhost-user port: QEMU's virtio-net device is served by the daemon over
    /// unix socket `socket` (no tap; the guest's memory is shared with the
    /// daemon). `create` (the port's `create-xde ... --vhost-user`) and `then` run
    /// before QEMU starts; `qemu_listens`: QEMU is the socket's server (the port in
    /// client mode), else the daemon is and QEMU connects (and reconnects).
    VhostUser {
        create: Cmd,
        then: Vec<Cmd>,
        socket: PathBuf,
        qemu_listens: bool,
    },
}

impl Attachment {
    /// Connects `tap` to the port; what it creates goes into `links`.
    fn attach(&self, links: &mut HostLinks, vm: &VmSpec, tap: &str) -> Result<()> {
        match self {
            Attachment::Bridge { port } => {
                let bridge = format!("br-{}", vm.name);
                links.create(&bridge, &["link", "add", &bridge, "type", "bridge"])?;
                links.ip(&["link", "set", tap, "master", &bridge])?;
                links.ip(&["link", "set", port, "master", &bridge])?;
                links.ip(&["link", "set", &bridge, "up"])?;
                Ok(())
            }
            Attachment::Attach { create, then } => {
                create.clone().args(["--attach", tap]).run()?;
                for cmd in then {
                    cmd.clone().run()?;
                }
                Ok(())
            }
            Attachment::VhostUser { .. } => Err(Error::new(
                "a vhost-user port has no tap to attach (Vm::boot makes none for it)",
            )),
        }
    }
}

/// The ways a VM is attached to a port, each with how its port is made: what the
/// VM tests and the benchmark's VM rows run through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// The port is created without `--netns` and its tap bridged to the VM's, as
    /// libvirt does ([`Attachment::Bridge`]).
    Bridge,
    /// The port is created with `--attach` on the VM's own tap
    /// ([`Attachment::Attach`]).
    Attach,
    /// The port is a vhost-user backend, the daemon the socket's server
    /// ([`Attachment::VhostUser`]).
    VhostUser,
}

impl Way {
    /// Every way, in the order the benchmark runs them (the first is the others'
    /// reference in its report).
    pub const ALL: [Way; 3] = [Way::Bridge, Way::Attach, Way::VhostUser];

    pub fn name(self) -> &'static str {
        match self {
            Way::Bridge => "bridge",
            Way::Attach => "attach",
            Way::VhostUser => "vhost-user",
        }
    }

    /// Creates `spec`'s port on `sled` as this way needs it (for `Attach`, when
    /// the VM's tap exists: [`Vm::boot`] does it) and says how the VM attaches.
    pub fn port(self, sled: &Sled, spec: &GuestSpec) -> Result<Attachment> {
        match self {
            Way::Bridge => {
                create_port(sled, spec, None)?;
                Ok(Attachment::Bridge {
                    port: spec.name.clone(),
                })
            }
            Way::Attach => {
                let (create, then) = port_commands(sled, spec, &[])?;
                Ok(Attachment::Attach { create, then })
            }
            Way::VhostUser => Attachment::vhost_user(sled, spec, false),
        }
    }
}

impl Attachment {
    /// A vhost-user port for `spec` on `sled`, its socket in the sled's directory;
    /// `qemu_listens`: the port in client mode, QEMU the socket's server.
    pub fn vhost_user(sled: &Sled, spec: &GuestSpec, qemu_listens: bool) -> Result<Attachment> {
        let socket = sled.dir().join(format!("{}.vhost.sock", spec.name));
        let path = socket.display().to_string();
        let mut extra = vec!["--vhost-user", path.as_str()];
        if qemu_listens {
            extra.extend(["--vhost-user-mode", "client"]);
        }
        let (create, then) = port_commands(sled, spec, &extra)?;
        Ok(Attachment::VhostUser {
            create,
            then,
            socket,
            qemu_listens,
        })
    }
}

/// Makes a vhost-user port for `spec` on `sled` (the daemon the socket's server)
/// with its firewall rules, for a front end that is not a VM of [`Vm::boot`]
/// (testpmd), and returns its socket.
pub fn vhost_user_port(sled: &Sled, spec: &GuestSpec) -> Result<PathBuf> {
    let Attachment::VhostUser {
        create,
        then,
        socket,
        ..
    } = Attachment::vhost_user(sled, spec, false)?
    else {
        return Err(Error::new("not a vhost-user attachment"));
    };
    for cmd in std::iter::once(create).chain(then) {
        cmd.run()?;
    }
    Ok(socket)
}

/// The `xdeadm` commands that make `spec`'s port on `sled` in the daemon's
/// namespace (`create-xde` with `extra`) and then let in its allowed sources.
fn port_commands(sled: &Sled, spec: &GuestSpec, extra: &[&str]) -> Result<(Cmd, Vec<Cmd>)> {
    let cmd = |args: Vec<String>| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        sled.xdeadm(&refs)
    };
    let create = cmd(spec.create_args_in_sled(extra))?;
    let then = spec
        .inbound_rule_args()
        .into_iter()
        .map(cmd)
        .collect::<Result<_>>()?;
    Ok((create, then))
}

/// Interfaces created in a namespace for a VM, deleted (newest first) on drop.
#[derive(Debug)]
struct HostLinks {
    ns: String,
    names: Vec<String>,
}

impl HostLinks {
    /// `ip -n NS ARGS...`, requiring success.
    fn ip(&self, args: &[&str]) -> Result<String> {
        Cmd::new("ip")
            .args(["-n", self.ns.as_str()])
            .args(args.iter().copied())
            .run()
    }

    /// Runs `ip -n NS ARGS...` that creates interface `name`, which is then deleted
    /// with the others.
    fn create(&mut self, name: &str, args: &[&str]) -> Result<()> {
        self.ip(args)?;
        self.names.push(name.to_string());
        Ok(())
    }
}

impl Drop for HostLinks {
    fn drop(&mut self) {
        while let Some(name) = self.names.pop() {
            if let Err(e) = self.ip(&["link", "del", &name]) {
                eprintln!("e2e cleanup: {e}");
            }
        }
    }
}

/// The QEMU process and its directory (console log, stderr, channel socket).
/// Dropping it stops QEMU (SIGTERM, then SIGKILL) and removes the directory.
#[derive(Debug)]
struct Qemu {
    name: String,
    child: Child,
    dir: PathBuf,
}

impl Qemu {
    /// An error unless QEMU still runs.
    fn check_running(&mut self) -> Result<()> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(status) => Err(self.failure(&format!("QEMU exited ({status})"))),
        }
    }

    /// `what`, with QEMU's stderr and the end of the guest's console.
    fn failure(&self, what: &str) -> Error {
        let stderr = std::fs::read_to_string(self.dir.join("qemu.log")).unwrap_or_default();
        Error::new(format!(
            "VM {}: {what}\nQEMU's stderr: {}\nconsole (last lines):\n{}",
            self.name,
            stderr.trim(),
            tail(&self.dir.join("console.log"), 40)
        ))
    }

    /// Waits for QEMU to connect the guest's second serial port to `listener`.
    fn accept_console(&mut self, listener: &UnixListener, deadline: Instant) -> Result<UnixStream> {
        loop {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false)?;
                    return Ok(s);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.into()),
            }
            self.check_running()?;
            if Instant::now() > deadline {
                return Err(self.failure("QEMU never connected the command channel"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        if let Err(e) = terminate(&mut self.child, &format!("QEMU of VM {}", self.name)) {
            eprintln!("e2e cleanup: stopping QEMU of VM {}: {e}", self.name);
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("e2e cleanup: removing {}: {e}", self.dir.display());
        }
    }
}

/// The last `n` lines of the file at `path` (empty if it cannot be read).
fn tail(path: &Path, n: usize) -> String {
    let all = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = all.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A running VM. Dropping it stops QEMU, then deletes the interfaces it created.
#[derive(Debug)]
pub struct Vm {
    pub spec: VmSpec,
    pub accel: Accel,
    /// From starting QEMU to the guest's command channel being ready (network
    /// configured); for a VM of [`Vm::receive_migration`], to QEMU answering QMP
    /// (it then waits for the migration).
    pub boot_time: Duration,
    console: UnixStream,
    /// Received from the command channel and not yet consumed.
    pending: Vec<u8>,
    qmp: Qmp,
    /// Where QEMU waits for a migration stream (a VM of [`Vm::receive_migration`]).
    incoming: Option<PathBuf>,
    // Dropped in this order: QEMU first (it holds the tap), then the interfaces.
    qemu: Qemu,
    _links: HostLinks,
}

/// What QEMU reports of a migration it completed (`query-migrate`).
#[derive(Clone, Copy, Debug)]
pub struct MigrationReport {
    /// From `migrate` to completion (`total-time`).
    pub total: Duration,
    /// How long the guest ran on neither side: the last copy of its dirty memory
    /// and of the devices' state, and the destination's start (`downtime`).
    pub downtime: Duration,
}

/// The longest [`VmSpec::name`]: `br-NAME` must fit an interface name (15 bytes).
const MAX_NAME: usize = 12;

impl Vm {
    /// Creates the VM's tap in `ns` (with the port's MTU, up), attaches it, starts
    /// QEMU there and waits for the guest's command channel. `dir` gets a directory
    /// `vm-NAME` for the console log, QEMU's stderr and the channel's socket.
    pub fn boot(ns: &Netns, spec: VmSpec, attach: &Attachment, dir: &Path) -> Result<Vm> {
        let started = Instant::now();
        let mut vm = Vm::start(ns, spec, attach, dir, false)?;
        vm.wait_for(READY, started + BOOT_TIMEOUT)
            .map_err(|e| e.context(format!("booting VM {}", vm.spec.name)))?;
        vm.boot_time = started.elapsed();
        Ok(vm)
    }

    /// Starts a QEMU in `ns` that waits for a guest to be migrated into it
    /// ([`Vm::migrate_to`]), attached as [`Vm::boot`] attaches one. QEMU requires
    /// the machine and devices of the source, so `spec` is the source's but for its
    /// name (which names this VM's directory and interfaces). The guest's command
    /// channel is accepted, not waited on: the guest is booted already, and its
    /// channel continues here once the migration completes.
    ///
    /// A vhost-user attachment's port is created before QEMU starts, as for
    /// [`Vm::boot`]: QEMU 7.2 does not start (nor serve QMP, nor listen for the
    /// migration) until a back end has connected to its vhost-user socket, also
    /// with `server=on,wait=off`.
    pub fn receive_migration(
        ns: &Netns,
        spec: VmSpec,
        attach: &Attachment,
        dir: &Path,
    ) -> Result<Vm> {
        Vm::start(ns, spec, attach, dir, true)
    }

    /// Attaches the VM and starts QEMU (waiting for a migration on a socket in its
    /// directory if `incoming`), up to the command channel and QMP being connected.
    fn start(
        ns: &Netns,
        spec: VmSpec,
        attach: &Attachment,
        dir: &Path,
        incoming: bool,
    ) -> Result<Vm> {
        if spec.name.is_empty() || spec.name.len() > MAX_NAME {
            return Err(Error::new(format!(
                "VM name {:?}: 1 to {MAX_NAME} bytes (it names interfaces)",
                spec.name
            )));
        }
        let image = GuestImage::get()?;
        let accel = Accel::for_this_machine(image)?;
        let mut links = HostLinks {
            ns: ns.name().to_string(),
            names: Vec::new(),
        };
        let nic = match attach {
            Attachment::VhostUser {
                create,
                then,
                socket,
                qemu_listens,
            } => {
                for cmd in std::iter::once(create).chain(then) {
                    cmd.clone().run()?;
                }
                Nic::VhostUser {
                    socket: socket.clone(),
                    qemu_listens: *qemu_listens,
                }
            }
            _ => {
                // Persistent, so it exists (and can be bridged) before QEMU opens
                // it, as libvirt does; QEMU's virtio-net turns on the tap's
                // offloads itself.
                let tap = format!("t-{}", spec.name);
                links.create(&tap, &["tuntap", "add", "dev", &tap, "mode", "tap"])?;
                let mtu = spec.host_mtu.to_string();
                links.ip(&["link", "set", &tap, "mtu", &mtu, "up"])?;
                attach.attach(&mut links, &spec, &tap)?;
                Nic::Tap(tap)
            }
        };

        let dir = dir.join(format!("vm-{}", spec.name));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let socket = dir.join(CONSOLE_SOCKET);
        let listener =
            UnixListener::bind(&socket).with_context(|| format!("binding {}", socket.display()))?;
        listener.set_nonblocking(true)?;
        let incoming = incoming.then(|| dir.join("incoming.sock"));
        let started = Instant::now();
        let qemu_cmd = qemu_command(
            image,
            accel,
            &spec,
            ns.name(),
            &nic,
            &dir,
            incoming.as_deref(),
        );
        let child = qemu_cmd.spawn_with(
            Stdio::null(),
            Stdio::from(File::create(dir.join("qemu.log"))?),
        )?;
        let mut qemu = Qemu {
            name: spec.name.clone(),
            child,
            dir,
        };
        let console = qemu.accept_console(&listener, started + BOOT_TIMEOUT)?;
        console.set_read_timeout(Some(Duration::from_millis(200)))?;
        let qmp = Qmp::connect(&mut qemu, started + BOOT_TIMEOUT)?;
        Ok(Vm {
            spec,
            accel,
            boot_time: started.elapsed(),
            console,
            pending: Vec::new(),
            qmp,
            incoming,
            qemu,
            _links: links,
        })
    }

    /// Runs QMP `command` with `arguments` (`Value::Null`: none); returns QEMU's
    /// `return` value.
    fn qmp(&mut self, command: &str, arguments: Value) -> Result<Value> {
        self.qmp
            .execute(&mut self.qemu, command, arguments)
            .map_err(|e| e.context(format!("VM {}", self.spec.name)))
    }

    /// Live-migrates the guest into `dest` (a VM of [`Vm::receive_migration`]) by
    /// QEMU's own means: QMP `migrate` to `dest`'s incoming socket, `query-migrate`
    /// polled until it completes. Once it returns, this QEMU has stopped the guest
    /// for good and `dest` runs it: talk to the guest through `dest`. The
    /// vhost-user back ends are not moved: on each side the port stays what it was.
    pub fn migrate_to(&mut self, dest: &mut Vm) -> Result<MigrationReport> {
        let incoming = dest.incoming.clone().ok_or_else(|| {
            Error::new(format!(
                "VM {} was not started to receive a migration (Vm::receive_migration)",
                dest.spec.name
            ))
        })?;
        let what = format!("migrating VM {} to {}", self.spec.name, dest.spec.name);
        self.qmp(
            "migrate",
            json!({ "uri": format!("unix:{}", incoming.display()) }),
        )
        .map_err(|e| e.context(&what))?;
        let deadline = Instant::now() + MIGRATION_TIMEOUT;
        let report = loop {
            let state = self.qmp("query-migrate", Value::Null)?;
            match state["status"].as_str() {
                Some("completed") => {
                    break MigrationReport {
                        total: millis(&state, "total-time")?,
                        downtime: millis(&state, "downtime")?,
                    }
                }
                Some(end @ ("failed" | "cancelled")) => {
                    let why = state["error-desc"].as_str().unwrap_or("no error-desc");
                    return Err(Error::new(format!(
                        "{what}: {end}: {why}\n{}\n{}",
                        self.qemu.failure("the source"),
                        dest.qemu.failure("the destination")
                    )));
                }
                _ => {}
            }
            dest.qemu.check_running()?;
            if Instant::now() > deadline {
                return Err(Error::new(format!(
                    "{what}: not completed in {MIGRATION_TIMEOUT:?}: {state}"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        // The source reports completion once it has sent everything; the
        // destination starts the guest when it has loaded it.
        crate::poll_until(
            &format!("{what}: the destination to run"),
            QMP_TIMEOUT,
            || {
                let status = dest.qmp("query-status", Value::Null)?;
                match status["status"].as_str() {
                    Some("running") => Ok(()),
                    _ => Err(Error::new(format!("query-status: {status}"))),
                }
            },
        )?;
        Ok(report)
    }

    /// QEMU's process id (`ip netns exec` execs it), for CPU accounting.
    pub fn pid(&self) -> u32 {
        self.qemu.child.id()
    }

    /// The guest's kernel console (ttyS0), with init's progress lines.
    pub fn console_log(&self) -> PathBuf {
        self.qemu.dir.join("console.log")
    }

    /// Reads the command channel until a line starting with `marker`; returns what
    /// came before that line and the rest of the line.
    fn wait_for(&mut self, marker: &str, deadline: Instant) -> Result<(String, String)> {
        let mut buf = [0u8; 4096];
        loop {
            if let Some(found) = take_marked(&mut self.pending, marker) {
                return Ok(found);
            }
            if Instant::now() > deadline {
                return Err(self.qemu.failure(&format!(
                    "no {marker:?} on the command channel in time; received: {:?}",
                    String::from_utf8_lossy(&self.pending)
                )));
            }
            match self.console.read(&mut buf) {
                Ok(0) => {
                    self.qemu.check_running()?;
                    return Err(self.qemu.failure("the command channel closed"));
                }
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    self.qemu.check_running()?;
                }
                Err(e) => {
                    return Err(self
                        .qemu
                        .failure(&format!("reading the command channel: {e}")))
                }
            }
        }
    }

    /// Runs one shell command line in the guest; returns its exit status and output
    /// (stdout and stderr together), whatever the status.
    pub fn output(&mut self, command: &str, timeout: Duration) -> Result<(i32, String)> {
        if command.contains('\n') {
            return Err(Error::new(format!(
                "VM command {command:?}: one line only (the guest reads a command a line)"
            )));
        }
        self.console
            .write_all(format!("{command}\n").as_bytes())
            .map_err(|e| self.qemu.failure(&format!("sending {command:?}: {e}")))?;
        let (out, rest) = self
            .wait_for(END, Instant::now() + timeout)
            .map_err(|e| e.context(format!("running {command:?}")))?;
        let status = rest.trim().parse().map_err(|_| {
            Error::new(format!(
                "VM command {command:?}: end marker with status {rest:?}"
            ))
        })?;
        Ok((status, out))
    }

    /// Runs one shell command line in the guest and requires exit status 0; returns
    /// its output.
    pub fn run(&mut self, command: &str, timeout: Duration) -> Result<String> {
        let (status, out) = self.output(command, timeout)?;
        if status == 0 {
            Ok(out)
        } else {
            Err(Error::new(format!(
                "in VM {}: `{command}` exited {status}: {}",
                self.spec.name,
                out.trim()
            )))
        }
    }

    /// Reads a file of the guest that holds one number (sysfs, procfs).
    pub fn read_number(&mut self, path: &str) -> Result<u64> {
        let out = self.run(&format!("cat {path}"), Duration::from_secs(30))?;
        out.trim()
            .parse()
            .map_err(|_| Error::new(format!("{path} in the VM is {out:?}, not a number")))
    }

    /// The guest kernel's IP counters (`/proc/net/snmp` and `/proc/net/snmp6`).
    pub fn snmp(&mut self) -> Result<BTreeMap<String, u64>> {
        let out = self.run(
            "cat /proc/net/snmp /proc/net/snmp6",
            Duration::from_secs(30),
        )?;
        Ok(parse_snmp(&out))
    }
}

/// The VM's network device's back end: a tap, or a vhost-user socket.
enum Nic {
    Tap(String),
    VhostUser { socket: PathBuf, qemu_listens: bool },
}

/// The socket in a VM's directory that QEMU connects the guest's command channel
/// to.
const CONSOLE_SOCKET: &str = "console.sock";

/// The socket in a VM's directory where QEMU serves QMP.
const QMP_SOCKET: &str = "qmp.sock";

/// The QEMU command line: the guest image booted directly, the kernel console on
/// the first serial port (a file in `dir`), the command channel on the second (a
/// client of [`CONSOLE_SOCKET`]), QMP on [`QMP_SOCKET`], a virtio-net NIC on `nic`,
/// and, with `incoming`, no guest of its own but one migrated to that socket; run
/// in namespace `ns`.
fn qemu_command(
    image: &GuestImage,
    accel: Accel,
    spec: &VmSpec,
    ns: &str,
    nic: &Nic,
    dir: &Path,
    incoming: Option<&Path>,
) -> Cmd {
    let mut append = String::from("console=ttyS0 panic=-1 loglevel=4");
    if let Some(ip6) = spec.ipv6 {
        append.push_str(&format!(" vm_ip6={ip6}"));
    }
    // Offloads on both ways (QEMU's defaults, spelled out): the guest hands the
    // datapath 64 KiB TSO buffers with partial checksums, and takes them too.
    let mut device = format!(
        "virtio-net-pci,netdev=net0,mac={},host_mtu={},romfile=,csum=on,guest_csum=on,\
         gso=on,host_tso4=on,host_tso6=on,guest_tso4=on,guest_tso6=on,mrg_rxbuf=on",
        spec.mac, spec.host_mtu
    );
    let memory = spec.memory_mib.to_string();
    let mut cmd = Cmd::in_netns(ns, QEMU)
        .args(["-name", &spec.name])
        .args(accel.qemu_args())
        .args(["-smp", "1", "-m", &memory])
        .args(["-nodefaults", "-display", "none", "-no-reboot"])
        .arg("-kernel")
        .arg(image.kernel().display().to_string())
        .arg("-initrd")
        .arg(image.initrd().display().to_string())
        .args(["-append", &append])
        .arg("-serial")
        .arg(format!("file:{}", dir.join("console.log").display()))
        .arg("-serial")
        .arg(format!("unix:{}", dir.join(CONSOLE_SOCKET).display()))
        .arg("-qmp")
        .arg(format!(
            "unix:{},server=on,wait=off",
            dir.join(QMP_SOCKET).display()
        ));
    if let Some(incoming) = incoming {
        cmd = cmd
            .arg("-incoming")
            .arg(format!("unix:{}", incoming.display()));
    }
    match nic {
        Nic::Tap(tap) => {
            cmd = cmd.arg("-netdev").arg(format!(
                "tap,id=net0,ifname={tap},script=no,downscript=no,vhost=off"
            ));
        }
        Nic::VhostUser {
            socket,
            qemu_listens,
        } => {
            // The guest's memory is shared with the daemon, which reads and writes
            // the rings and buffers in it.
            let role = if *qemu_listens {
                "server=on,wait=off"
            } else {
                "reconnect=1"
            };
            cmd = cmd
                .arg("-object")
                .arg(format!(
                    "memory-backend-memfd,id=mem,size={memory}M,share=on"
                ))
                .args(["-machine", "memory-backend=mem"])
                .arg("-chardev")
                .arg(format!("socket,id=vu0,path={},{role}", socket.display()))
                .args(["-netdev", "vhost-user,id=net0,chardev=vu0"]);
            // QEMU 7.2 under TCG crashes starting a vhost-user device with MSI-X
            // (a null dereference in msix_set_vector_notifiers): legacy interrupts.
            device.push_str(",vectors=0");
        }
    }
    cmd.args(["-device", &device]).die_with_parent()
}

/// A client of QEMU's QMP monitor: one command at a time, the asynchronous events
/// QEMU sends in between skipped.
#[derive(Debug)]
struct Qmp {
    stream: BufReader<UnixStream>,
    /// A message received in part when a read timed out.
    partial: Vec<u8>,
}

impl Qmp {
    /// Connects to the QMP socket of `qemu`, reads its greeting and leaves
    /// capabilities negotiation (where QEMU takes no other command).
    fn connect(qemu: &mut Qemu, deadline: Instant) -> Result<Qmp> {
        let path = qemu.dir.join(QMP_SOCKET);
        let stream = UnixStream::connect(&path)
            .map_err(|e| qemu.failure(&format!("connecting to {}: {e}", path.display())))?;
        stream.set_read_timeout(Some(Duration::from_millis(200)))?;
        let mut qmp = Qmp {
            stream: BufReader::new(stream),
            partial: Vec::new(),
        };
        let greeting = qmp.message(qemu, deadline)?;
        if greeting.get("QMP").is_none() {
            return Err(qemu.failure(&format!("QMP greeting {greeting}")));
        }
        qmp.execute(qemu, "qmp_capabilities", Value::Null)?;
        Ok(qmp)
    }

    /// Runs `command` with `arguments` (`Value::Null`: none); returns QEMU's
    /// `return` value, or its `error` (`desc`) as an error.
    fn execute(&mut self, qemu: &mut Qemu, command: &str, arguments: Value) -> Result<Value> {
        let mut request = json!({ "execute": command });
        if !arguments.is_null() {
            request["arguments"] = arguments;
        }
        writeln!(self.stream.get_mut(), "{request}")
            .map_err(|e| qemu.failure(&format!("sending QMP {request}: {e}")))?;
        let deadline = Instant::now() + QMP_TIMEOUT;
        loop {
            let message = self.message(qemu, deadline)?;
            if let Some(value) = message.get("return") {
                return Ok(value.clone());
            }
            if let Some(error) = message.get("error") {
                let desc = error["desc"]
                    .as_str()
                    .map_or_else(|| error.to_string(), String::from);
                return Err(Error::new(format!("QMP {command}: {desc}")));
            }
        }
    }

    /// The next message from QEMU (a line of JSON).
    fn message(&mut self, qemu: &mut Qemu, deadline: Instant) -> Result<Value> {
        loop {
            match self.stream.read_until(b'\n', &mut self.partial) {
                Ok(_) if self.partial.ends_with(b"\n") => {
                    let line = std::mem::take(&mut self.partial);
                    return serde_json::from_slice(&line).map_err(|e| {
                        Error::new(format!(
                            "QMP message {:?}: {e}",
                            String::from_utf8_lossy(&line)
                        ))
                    });
                }
                Ok(_) => {
                    qemu.check_running()?;
                    return Err(qemu.failure("QEMU closed QMP"));
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    qemu.check_running()?;
                    if Instant::now() > deadline {
                        return Err(qemu.failure("no answer on QMP in time"));
                    }
                }
                Err(e) => return Err(qemu.failure(&format!("reading QMP: {e}"))),
            }
        }
    }
}

/// `key` of a `query-migrate` answer, in milliseconds.
fn millis(state: &Value, key: &str) -> Result<Duration> {
    state[key]
        .as_u64()
        .map(Duration::from_millis)
        .ok_or_else(|| Error::new(format!("no {key} in query-migrate's {state}")))
}

/// Takes from `pending` everything up to the first complete line that starts with
/// `marker`: returns the text before that line (carriage returns removed) and the
/// rest of the marked line. `None` while no such line has arrived.
fn take_marked(pending: &mut Vec<u8>, marker: &str) -> Option<(String, String)> {
    let mut start = 0;
    while let Some(len) = pending[start..].iter().position(|&b| b == b'\n') {
        let line = &pending[start..start + len];
        if let Some(rest) = line.strip_prefix(marker.as_bytes()) {
            let rest = String::from_utf8_lossy(rest).trim_end().to_string();
            let before = String::from_utf8_lossy(&pending[..start]).replace('\r', "");
            pending.drain(..start + len + 1);
            return Some((before, rest));
        }
        start += len + 1;
    }
    None
}

/// The guest kernel's IP fragmentation and reassembly counters ([`Vm::snmp`]):
/// all zero after full-size traffic proves the path carried it whole.
pub const FRAGMENTATION_COUNTERS: [&str; 4] = [
    "Ip.FragCreates",
    "Ip.ReasmReqds",
    "Ip6FragCreates",
    "Ip6ReasmReqds",
];

/// Parses `/proc/net/snmp` (pairs of `Proto: names...` / `Proto: values...` lines)
/// and `/proc/net/snmp6` (`Name value` lines) into `Proto.Name` (snmp) and `Name`
/// (snmp6) counters.
pub fn parse_snmp(text: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let mut header: Option<(&str, Vec<&str>)> = None;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if let Some(proto) = first.strip_suffix(':') {
            let rest: Vec<&str> = words.collect();
            match header.take() {
                Some((p, names)) if p == proto && rest.iter().all(|w| w.parse::<i64>().is_ok()) => {
                    for (name, value) in names.iter().zip(&rest) {
                        if let Ok(v) = value.parse::<u64>() {
                            out.insert(format!("{proto}.{name}"), v);
                        }
                    }
                }
                _ => header = Some((proto, rest)),
            }
        } else if let (Some(value), None) = (words.next(), words.next()) {
            if let Ok(v) = value.parse::<u64>() {
                out.insert(first.to_string(), v);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marked_lines_split_output_from_status() {
        let mut p = b"hello\r\nworld\n@@END 3\nnext".to_vec();
        assert_eq!(
            take_marked(&mut p, END),
            Some(("hello\nworld\n".to_string(), "3".to_string()))
        );
        assert_eq!(p, b"next");
        let mut partial = b"out\n@@END 0".to_vec();
        assert_eq!(take_marked(&mut partial, END), None);
        let mut ready = b"@@READY\n".to_vec();
        assert_eq!(
            take_marked(&mut ready, READY),
            Some((String::new(), String::new()))
        );
        assert!(ready.is_empty());
    }

    #[test]
    fn snmp_counters_from_both_files() {
        let text = "Ip: Forwarding DefaultTTL ReasmReqds FragCreates\n\
                    Ip: 2 64 0 7\n\
                    Icmp: InMsgs OutMsgs\n\
                    Icmp: 5 6\n\
                    Ip6InReceives                   \t12\n\
                    Ip6FragCreates 0\n";
        let c = parse_snmp(text);
        assert_eq!(c.get("Ip.FragCreates"), Some(&7));
        assert_eq!(c.get("Ip.ReasmReqds"), Some(&0));
        assert_eq!(c.get("Icmp.OutMsgs"), Some(&6));
        assert_eq!(c.get("Ip6InReceives"), Some(&12));
        assert_eq!(c.get("Ip6FragCreates"), Some(&0));
        assert_eq!(c.get("Ip.Forwarding"), Some(&2));
    }
}
