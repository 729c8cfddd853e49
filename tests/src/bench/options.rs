//! `bench-e2e`'s command line (parsed with std only: a handful of flags).

use super::iperf::{GuestKind, Test, Timing};
use super::setup::{Kind, Setup, FIXED, GROUPS};
use crate::{Error, Result};
use std::path::PathBuf;

pub const USAGE: &str = "\
usage: bench-e2e [OPTIONS]

Builds the same two-sled job several ways in network namespaces and measures
each in alternation, round after round. With iperf3 (throughput) and sockperf
(latency) between namespace guests: this datapath (ours), kernel VXLAN over
IPv6 (vxlan), the same with the sleds' underlay unable to take tunnel GSO so TSO
buffers are cut at the sled's edge (vxlan-wire), a plain veth pair (veth), OVS
userspace with Geneve over IPv6 (ovs). With DPDK's testpmd as both guests on vhost-user ports (txonly to
rxonly): this datapath (ours-vhost) and OVS with DPDK, Geneve over IPv6
(ovs-dpdk).

options:
  --rounds N          rounds (default 3; 1 with --smoke)
  --seconds S         measured seconds per run (default 5; 2 with --smoke)
  --omit S            warm-up seconds before each run, left out (default 1;
                      sockperf leaves out its own first 0.4 s instead)
  --variant NAME=FLAGS
                      a variant of this datapath: overlayd started with FLAGS
                      (split at spaces), e.g. --variant ours2w='--cores 0,1';
                      repeatable; default: one variant `ours` with no flags
  --ours-flags FLAGS  the same as --variant ours=FLAGS
  --vm                add the VM setups (slow: QEMU, emulated where KVM does not
                      work): this datapath with a VM on sled 0 as the client,
                      one setup per attachment way (vm-bridge), measured with
                      the vm-tcp1-v4-8500 and vm-tcp1-v6-8500 tests; not in the
                      default run nor in --smoke
  --skip SETUP[,..]   leave setups out: vxlan, vxlan-wire, veth, ovs, ours-vhost,
                      ovs-dpdk, a variant's name, a VM setup's name, `ours` for
                      every variant, `vm` for every VM setup or `testpmd` for
                      ours-vhost and ovs-dpdk; repeatable
  --tests ID[,..]     tests to run, e.g. tcp1-v6-8500,udp64-v4-8500 (default: all of
                      tcp1/tcp4 x v4/v6 x 8500/1500, udp64 x v4/v6 at 8500,
                      lat64-v4-8500 (sockperf UDP ping-pong, round-trip
                      percentiles; IPv4 only, as sockperf 3.7 is), and
                      testpmd's pmd64, pmd1500 (frame bytes; guests without
                      offloads) and pmd64tso, pmd1500tso (guests acking checksum
                      and TSO offloads), v4 at 1500; with --vm also vm-tcp1 x
                      v4/v6 at 8500); naming a vm- test implies --vm
  --smoke             a quick check of the harness: 1 round of 2 s runs of
                      tcp1-v6-8500, udp64-v6-8500, lat64-v4-8500,
                      pmd64-v4-1500 and pmd1500tso-v4-1500
  --json PATH         where to write every run and the medians
                      (default target/bench-e2e/results.json)
  -h, --help          this text

environment: BENCH_E2E_PREFIX starts every namespace name (default `bx`);
OVERLAYD_BIN and XDEADM_BIN name the daemon and admin tool (else they are built).";

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub rounds: usize,
    pub timing: Timing,
    /// In run order: this datapath's variants, then vxlan, veth, ovs, then the
    /// VM setups.
    pub setups: Vec<Setup>,
    /// In run order.
    pub tests: Vec<Test>,
    pub json: PathBuf,
    /// `--smoke`: a check of the harness, whose figures say nothing about speed.
    pub smoke: bool,
}

/// Printed with the figures of a `--smoke` run, which look like a regression next to
/// a real run's (one round of 2 s runs, many setups on a shared machine).
pub const SMOKE_CAVEAT: &str = "--smoke checks that the harness works: its figures (1 round \
     of 2 s runs) are meaningless for comparison with each other or with a full run; measure \
     with `bash scripts/bench-e2e.sh` (docs/benchmarks.md)";

/// What the command line asked for: either options or the usage text.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    Run(Options),
    Help,
}

impl Options {
    /// What to say next to the figures about how far they can be trusted.
    pub fn caveat(&self) -> Option<&'static str> {
        self.smoke.then_some(SMOKE_CAVEAT)
    }

    /// Parses the arguments after the program name. `--smoke` sets defaults that
    /// explicit options override, wherever they appear.
    pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Parsed> {
        let mut raw = Raw::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| args.next())
                    .ok_or_else(|| Error::new(format!("{flag} needs a value")))
            };
            match flag.as_str() {
                "-h" | "--help" => return Ok(Parsed::Help),
                "--smoke" => raw.smoke = true,
                "--vm" => raw.vm = true,
                "--rounds" => raw.rounds = Some(positive(&flag, &value()?)?),
                "--seconds" => raw.seconds = Some(positive(&flag, &value()?)?),
                "--omit" => raw.omit = Some(number(&flag, &value()?)?),
                "--variant" => raw.variants.push(variant(&value()?)?),
                "--ours-flags" => raw.variants.push(("ours".into(), split_flags(&value()?))),
                "--skip" => raw.skip.extend(list(&value()?)),
                "--tests" => {
                    raw.tests = Some(
                        list(&value()?)
                            .iter()
                            .map(|id| Test::parse(id))
                            .collect::<Result<_>>()?,
                    );
                }
                "--json" => raw.json = Some(PathBuf::from(value()?)),
                _ => return Err(Error::new(format!("unknown option {arg:?}; see --help"))),
            }
        }
        raw.resolve().map(Parsed::Run)
    }
}

/// The command line as given, before defaults.
#[derive(Default)]
struct Raw {
    smoke: bool,
    vm: bool,
    rounds: Option<u32>,
    seconds: Option<u32>,
    omit: Option<u32>,
    variants: Vec<(String, Vec<String>)>,
    skip: Vec<String>,
    tests: Option<Vec<Test>>,
    json: Option<PathBuf>,
}

impl Raw {
    /// Defaults filled in. Without `--tests`, the tests are those of the kept
    /// setups; with it, every test named must have a setup to run on.
    fn resolve(self) -> Result<Options> {
        let vm = self.vm || self.tests.iter().flatten().any(|t| t.from_vm);
        let setups = setups(self.variants, vm, &self.skip)?;
        let tests = match self.tests {
            Some(tests) => tests,
            None => {
                let mut tests = if self.smoke {
                    Test::smoke_list()
                } else {
                    Test::default_list()
                };
                tests.extend(Test::vm_list());
                // The tests some kept setup runs.
                tests.retain(|t| setups.iter().any(|s| s.runs(t)));
                tests
            }
        };
        if tests.is_empty() {
            return Err(Error::new("--tests names no test"));
        }
        if let Some(t) = tests.iter().find(|t| !setups.iter().any(|s| s.runs(t))) {
            let which = match t.guest_kind() {
                GuestKind::Vm => "a VM setup",
                GuestKind::Testpmd => "a testpmd setup (ours-vhost, ovs-dpdk)",
                GuestKind::Netns => "a setup with namespace guests",
            };
            return Err(Error::new(format!(
                "test {t} needs {which}, and --skip leaves none"
            )));
        }
        let smoke_or = |smoke: u32, full: u32| if self.smoke { smoke } else { full };
        Ok(Options {
            rounds: self.rounds.unwrap_or(smoke_or(1, 3)) as usize,
            timing: Timing {
                seconds: self.seconds.unwrap_or(smoke_or(2, 5)),
                omit: self.omit.unwrap_or(1),
            },
            setups,
            tests,
            json: self
                .json
                .unwrap_or_else(|| PathBuf::from("target/bench-e2e/results.json")),
            smoke: self.smoke,
        })
    }
}

/// This datapath's variants (or the default one), then the fixed setups, then the
/// VM setups if `vm`, less the skipped ones. Names must be unique and skips must
/// name a setup or a group ([`GROUPS`]).
fn setups(variants: Vec<(String, Vec<String>)>, vm: bool, skip: &[String]) -> Result<Vec<Setup>> {
    let variants = if variants.is_empty() {
        vec![("ours".to_string(), Vec::new())]
    } else {
        variants
    };
    let mut all: Vec<Setup> = Vec::new();
    for (name, flags) in variants {
        if all.iter().any(|s| s.name == name) {
            return Err(Error::new(format!("variant {name:?} is given twice")));
        }
        all.push(Setup {
            name,
            kind: Kind::Ours { flags },
        });
    }
    all.extend(FIXED.iter().filter_map(|n| Setup::fixed(n)));
    if vm {
        all.extend(Setup::vms());
    }
    for name in skip {
        if !(GROUPS.contains(&name.as_str()) || all.iter().any(|s| &s.name == name)) {
            let known: Vec<&str> = GROUPS
                .iter()
                .copied()
                .chain(all.iter().map(|s| s.name.as_str()))
                .collect();
            return Err(Error::new(format!(
                "--skip {name:?}: no such setup (known: {})",
                known.join(", ")
            )));
        }
    }
    let kept: Vec<Setup> = all
        .into_iter()
        .filter(|s| !skip.iter().any(|k| *k == s.name || s.in_group(k)))
        .collect();
    if kept.is_empty() {
        return Err(Error::new("--skip leaves no setup to run"));
    }
    Ok(kept)
}

/// `NAME=FLAGS` of `--variant`.
fn variant(v: &str) -> Result<(String, Vec<String>)> {
    let (name, flags) = v
        .split_once('=')
        .ok_or_else(|| Error::new(format!("--variant {v:?}: expected NAME=FLAGS")))?;
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid || Setup::fixed(name).is_some() || GROUPS.contains(&name) || name.starts_with("vm-") {
        return Err(Error::new(format!(
            "--variant {v:?}: the name must be letters, digits, '-' or '_' and not one of \
             {}, vm-*, {}",
            GROUPS.join(", "),
            FIXED.join(", ")
        )));
    }
    Ok((name.to_string(), split_flags(flags)))
}

fn split_flags(flags: &str) -> Vec<String> {
    flags.split_whitespace().map(String::from).collect()
}

fn list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn number(flag: &str, v: &str) -> Result<u32> {
    v.parse()
        .map_err(|_| Error::new(format!("{flag} {v:?}: expected a whole number")))
}

fn positive(flag: &str, v: &str) -> Result<u32> {
    match number(flag, v)? {
        0 => Err(Error::new(format!("{flag} must be at least 1"))),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options> {
        match Options::parse(args.iter().map(std::string::ToString::to_string))? {
            Parsed::Run(o) => Ok(o),
            Parsed::Help => Err(Error::new("help")),
        }
    }

    fn names(o: &Options) -> Vec<&str> {
        o.setups.iter().map(|s| s.name.as_str()).collect()
    }

    /// The default setups, in run order.
    const ALL_FIXED: [&str; 7] = [
        "ours",
        "vxlan",
        "vxlan-wire",
        "veth",
        "ovs",
        "ours-vhost",
        "ovs-dpdk",
    ];

    #[test]
    fn defaults() {
        let o = parse(&[]).unwrap();
        assert_eq!(o.rounds, 3);
        assert_eq!(
            o.timing,
            Timing {
                seconds: 5,
                omit: 1
            }
        );
        assert_eq!(names(&o), ALL_FIXED);
        assert_eq!(o.setups[0].kind, Kind::Ours { flags: vec![] });
        assert_eq!(o.tests, Test::default_list());
        assert_eq!(o.json, PathBuf::from("target/bench-e2e/results.json"));
    }

    #[test]
    fn smoke_sets_defaults_that_explicit_options_override() {
        let o = parse(&["--seconds", "3", "--smoke", "--skip", "ovs,testpmd"]).unwrap();
        assert_eq!(
            (o.rounds, o.timing),
            (
                1,
                Timing {
                    seconds: 3,
                    omit: 1
                }
            )
        );
        let netns: Vec<Test> = Test::smoke_list()
            .into_iter()
            .filter(|t| t.guest_kind() == GuestKind::Netns)
            .collect();
        assert_eq!(o.tests, netns);
        assert_eq!(names(&o), ["ours", "vxlan", "vxlan-wire", "veth"]);
        let o = parse(&["--smoke"]).unwrap();
        assert_eq!(o.tests, Test::smoke_list());
        assert_eq!(names(&o), ALL_FIXED);
        assert_eq!(o.caveat(), Some(SMOKE_CAVEAT));
        assert_eq!(parse(&[]).unwrap().caveat(), None);
    }

    #[test]
    fn variants_carry_flags_and_can_be_skipped() {
        let o = parse(&[
            "--variant",
            "ours1w=",
            "--variant=ours2w=--cores 0,1  --poll busy",
            "--skip=veth,ovs,vxlan-wire,testpmd",
        ])
        .unwrap();
        assert_eq!(names(&o), ["ours1w", "ours2w", "vxlan"]);
        assert_eq!(
            o.setups[1].kind,
            Kind::Ours {
                flags: ["--cores", "0,1", "--poll", "busy"]
                    .map(String::from)
                    .to_vec()
            }
        );
        let o = parse(&["--ours-flags", "--cores 0", "--skip", "ours"]).unwrap();
        assert_eq!(names(&o), &ALL_FIXED[1..]);
    }

    #[test]
    fn testpmd_setups_run_testpmd_tests_only() {
        // Only the testpmd setups left: only their tests by default.
        let o = parse(&["--skip", "ours,vxlan,vxlan-wire,veth,ovs"]).unwrap();
        assert_eq!(names(&o), ["ours-vhost", "ovs-dpdk"]);
        assert!(o.tests.iter().all(|t| t.guest_kind() == GuestKind::Testpmd));
        assert_eq!(o.tests.len(), 4);

        let o = parse(&["--skip", "testpmd"]).unwrap();
        assert_eq!(names(&o), ["ours", "vxlan", "vxlan-wire", "veth", "ovs"]);
        assert!(o.tests.iter().all(|t| t.guest_kind() == GuestKind::Netns));

        let o = parse(&["--skip", "ovs-dpdk", "--tests", "pmd64-v4-1500"]).unwrap();
        assert!(names(&o).contains(&"ours-vhost"));

        let e = parse(&["--skip", "testpmd", "--tests", "pmd64-v4-1500"]).unwrap_err();
        assert!(e.0.contains("needs a testpmd setup"), "{e}");
        let e = parse(&["--variant", "testpmd=--cores 0"]).unwrap_err();
        assert!(e.0.contains("not one of"), "{e}");
        let e = parse(&["--variant", "ovs-dpdk=--cores 0"]).unwrap_err();
        assert!(e.0.contains("not one of"), "{e}");
    }

    #[test]
    fn latency_tests_are_named_and_run_on_namespace_setups() {
        let o = parse(&["--tests", "lat64-v4-8500,tcp1-v4-8500", "--skip", "testpmd"]).unwrap();
        assert_eq!(o.tests[0].to_string(), "lat64-v4-8500");
        assert!(o.tests[0].is_latency());
        assert_eq!(names(&o), ["ours", "vxlan", "vxlan-wire", "veth", "ovs"]);
        assert!(parse(&[]).unwrap().tests.iter().any(Test::is_latency));
        assert!(parse(&["--smoke"])
            .unwrap()
            .tests
            .iter()
            .any(Test::is_latency));
        let e = parse(&["--tests", "lat64-v6-8500"]).unwrap_err();
        assert!(e.0.contains("IPv4 addresses only"), "{e}");
        let e = parse(&[
            "--tests",
            "lat64-v4-8500",
            "--skip",
            "ours,vxlan,vxlan-wire,veth,ovs",
        ])
        .unwrap_err();
        assert!(e.0.contains("needs a setup with namespace guests"), "{e}");
    }

    #[test]
    fn vm_setups_only_when_asked_for() {
        assert!(!parse(&[]).unwrap().setups.iter().any(Setup::is_vm));
        assert!(!parse(&["--smoke"]).unwrap().setups.iter().any(Setup::is_vm));

        let o = parse(&["--vm", "--skip", "vxlan,vxlan-wire,veth,ovs,testpmd"]).unwrap();
        assert_eq!(
            names(&o),
            ["ours", "vm-bridge", "vm-attach", "vm-vhost-user"]
        );
        let netns: Vec<Test> = Test::default_list()
            .into_iter()
            .filter(|t| t.guest_kind() == GuestKind::Netns)
            .collect();
        assert_eq!(o.tests, [netns, Test::vm_list()].concat());

        // Only VM setups left: only VM tests by default.
        let o = parse(&["--vm", "--skip", "ours,vxlan,vxlan-wire,veth,ovs,testpmd"]).unwrap();
        assert_eq!(names(&o), ["vm-bridge", "vm-attach", "vm-vhost-user"]);
        assert_eq!(o.tests, Test::vm_list());

        // Naming a VM test brings the VM setups in.
        let o = parse(&["--tests", "vm-tcp1-v6-8500,tcp1-v4-8500"]).unwrap();
        assert_eq!(
            names(&o),
            [&ALL_FIXED[..], &["vm-bridge", "vm-attach", "vm-vhost-user"]].concat()
        );
        assert!(o.tests[0].from_vm && !o.tests[1].from_vm);

        let o = parse(&["--vm", "--skip", "vm"]).unwrap();
        assert_eq!(names(&o), ALL_FIXED);
        assert_eq!(o.tests, Test::default_list());
    }

    #[test]
    fn mistakes_are_named() {
        for (args, want) in [
            (&["--skip", "ovz"][..], "no such setup"),
            (&["--variant", "vxlan=--cores 0"][..], "not one of"),
            (&["--variant", "nameonly"][..], "NAME=FLAGS"),
            (&["--variant", "a=", "--variant", "a=x"][..], "twice"),
            (&["--rounds", "0"][..], "at least 1"),
            (&["--seconds"][..], "needs a value"),
            (&["--tests", "tcp9-v7-1"][..], "invalid test"),
            (&["--frobnicate"][..], "unknown option"),
            (
                &["--skip", "ours,vxlan,vxlan-wire,veth,ovs,testpmd"][..],
                "no setup",
            ),
            (&["--skip", "vm-bridge"][..], "no such setup"),
            (&["--variant", "vm-x=--cores 0"][..], "vm-*"),
            (
                &["--tests", "vm-tcp1-v4-8500", "--skip", "vm"][..],
                "needs a VM setup",
            ),
            (
                &[
                    "--vm",
                    "--tests",
                    "tcp1-v4-8500",
                    "--skip",
                    "ours,vxlan,vxlan-wire,veth,ovs,testpmd",
                ][..],
                "needs a setup with namespace guests",
            ),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.0.contains(want), "{args:?}: {e}");
        }
        assert_eq!(Options::parse(["-h".to_string()]).unwrap(), Parsed::Help);
    }
}
