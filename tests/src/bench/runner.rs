//! Rounds in alternation: in each round, for each guest MTU, every setup in turn
//! is built, runs all the tests at that MTU, and is torn down before the next is
//! built (a b c d, a b c d, ...). Alternating spreads slow drifts of a shared
//! machine's load over all setups alike; keeping one topology alive at a time means
//! no idle daemon (a busy-polling one in particular) takes CPU from another setup's
//! run.

use super::cpu::background_busy_cores;
use super::iperf::GuestKind;
use super::iperf::{self, Measurement, Test};
use super::options::Options;
use super::report::Run;
use super::setup::{with_diagnostics, Guests, Kind, Setup, Topology};
use super::signals;
use super::{pmd, vm};
use crate::cmd::on_path;
use crate::{Error, Result};
use std::path::Path;
use std::time::Duration;

/// How long the machine's load is sampled before each topology is built.
const BACKGROUND_SPAN: Duration = Duration::from_secs(1);

/// What the rounds produced.
#[derive(Debug)]
pub struct Outcome {
    /// In the order they ran.
    pub runs: Vec<Run>,
    /// A stop was asked for (Ctrl-C): `runs` holds what completed before it.
    pub interrupted: bool,
}

/// What every run needs besides its setup and test.
pub struct Runner<'a> {
    pub opts: &'a Options,
    /// Start of every namespace name.
    pub prefix: &'a str,
    /// For the iperf3 and sockperf servers' logs.
    pub dir: &'a Path,
    /// `USER_HZ`.
    pub hz: f64,
}

impl Runner<'_> {
    /// Runs every round; `report` sees each run as it completes.
    pub fn run_rounds(&self, mut report: impl FnMut(&Run)) -> Outcome {
        let mut runs = Vec::new();
        let mtus = mtus(&self.opts.tests);
        for round in 1..=self.opts.rounds {
            for &mtu in &mtus {
                for setup in &self.opts.setups {
                    let tests: Vec<Test> = self
                        .opts
                        .tests
                        .iter()
                        .copied()
                        .filter(|t| t.mtu == mtu && setup.runs(t))
                        .collect();
                    if tests.is_empty() {
                        continue;
                    }
                    if signals::interrupted() {
                        return Outcome {
                            runs,
                            interrupted: true,
                        };
                    }
                    self.run_setup(round, setup, mtu, &tests, &mut |run| {
                        report(&run);
                        runs.push(run);
                    });
                }
            }
        }
        Outcome {
            runs,
            interrupted: signals::interrupted(),
        }
    }

    /// Builds `setup` at `mtu` and runs `tests` on it, handing each run to `done`.
    /// A build failure fails each of the tests; a run cut short by a stop request
    /// is left out (it measured nothing).
    fn run_setup(
        &self,
        round: usize,
        setup: &Setup,
        mtu: u16,
        tests: &[Test],
        done: &mut dyn FnMut(Run),
    ) {
        let background = match background_busy_cores(BACKGROUND_SPAN, self.hz) {
            Ok(cores) => Some(cores),
            Err(e) => {
                eprintln!("bench-e2e: measuring the background load: {e}");
                None
            }
        };
        println!(
            "round {round}/{}: {} at guest MTU {mtu} (background load {} cores)",
            self.opts.rounds,
            setup.name,
            background.map_or_else(|| "?".to_string(), |c| format!("{c:.2}"))
        );
        let run = |test: Test, result: Result<Measurement>| Run {
            round,
            setup: setup.name.clone(),
            test,
            background_cores: background,
            result: result.map_err(|e| e.to_string()),
        };
        let topo = match setup.build(self.prefix, mtu) {
            Ok(t) => t,
            Err(_) if signals::interrupted() => return,
            Err(e) => {
                let e = e.context(format!("building {} at guest MTU {mtu}", setup.name));
                for &test in tests {
                    done(run(test, Err(e.clone())));
                }
                return;
            }
        };
        for &test in tests {
            let result = signals::check().and_then(|()| self.measure(topo.as_ref(), test));
            if signals::interrupted() {
                return;
            }
            done(run(test, result));
        }
    }

    /// iperf3 or sockperf between guest namespaces, a stream from a VM, or
    /// testpmd's frames.
    fn measure(&self, topo: &dyn Topology, test: Test) -> Result<Measurement> {
        let (timing, hz) = (self.opts.timing, self.hz);
        match topo.guests() {
            Guests::Netns { client, server } => {
                iperf::measure((client, server), topo, test, timing, self.dir, hz)
            }
            Guests::Vm { client, server } => vm::measure((client, server), topo, test, timing, hz),
            Guests::Testpmd(ports) => pmd::measure(ports, topo, test, timing, hz),
        }
        .map_err(|e| with_diagnostics(e, topo))
    }
}

/// The guest MTUs of `tests`, in the order they first appear.
fn mtus(tests: &[Test]) -> Vec<u16> {
    let mut mtus: Vec<u16> = Vec::new();
    for t in tests {
        if !mtus.contains(&t.mtu) {
            mtus.push(t.mtu);
        }
    }
    mtus
}

/// Fails naming the first program the selected setups need that is not on `PATH`,
/// before anything is built.
pub fn preflight(opts: &Options) -> Result<()> {
    let mut needed = vec!["ip", "ping", "ss", "iperf3"];
    if opts.tests.iter().any(Test::is_latency) {
        needed.push("sockperf");
    }
    let has = |kind: Kind| opts.setups.iter().any(|s| s.kind == kind);
    if opts.setups.iter().any(Setup::is_vm) {
        needed.push(crate::vm::QEMU);
    }
    if has(Kind::Ovs) || has(Kind::OvsDpdk) {
        needed.extend([
            "ethtool",
            "ovsdb-tool",
            "ovsdb-server",
            "ovs-vsctl",
            "ovs-ofctl",
        ]);
    }
    if has(Kind::Ovs) {
        needed.push("ovs-vswitchd");
    }
    if has(Kind::VxlanWire) {
        needed.push("ethtool");
    }
    if opts
        .setups
        .iter()
        .any(|s| s.guest_kind() == GuestKind::Testpmd)
    {
        needed.extend(["stdbuf", crate::testpmd::TESTPMD]);
    }
    for program in needed {
        if !on_path(program) {
            return Err(Error::new(format!(
                "{program} is not on PATH (scripts/bench-e2e.sh installs what is missing)"
            )));
        }
    }
    if has(Kind::OvsDpdk) {
        super::ovs::require_dpdk_vswitchd()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtus_in_first_appearance_order() {
        let tests: Vec<Test> = ["tcp1-v4-1500", "tcp1-v4-8500", "udp64-v6-1500"]
            .iter()
            .map(|id| Test::parse(id).unwrap())
            .collect();
        assert_eq!(mtus(&tests), [1500, 8500]);
    }
}
