//! CPU accounting from `/proc`: the whole machine's busy time (`/proc/stat`) and the
//! per-thread time of the daemons that do a setup's packet work
//! (`/proc/PID/task/TID/stat`), sampled at the start and end of a measurement window.
//!
//! The machine figure is what makes setups comparable: the kernel's VXLAN works in
//! softirq context charged to whichever task was running, so only the whole
//! machine's busy time captures it; a daemon's own time shows how much of that a
//! user-space datapath spends itself.

use crate::{Context, Error, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// The label of a VM's QEMU process among the watched ones: reported apart from
/// the daemons (it is the guest, not the datapath).
pub const VM_LABEL: &str = "qemu";

/// A process whose CPU time is reported, e.g. `overlayd s0`.
#[derive(Clone, Debug)]
pub struct Watched {
    pub label: String,
    pub pid: u32,
}

/// Clock ticks per second of the times in `/proc` (`USER_HZ`).
pub fn user_hz() -> Result<f64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        Ok(hz as f64)
    } else {
        Err(Error::new("sysconf(_SC_CLK_TCK) failed"))
    }
}

/// The aggregate `cpu` line of `/proc/stat`, in ticks summed over all CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MachineTicks {
    /// Every state except idle and iowait: user, nice, system, irq, softirq, steal.
    pub busy: u64,
}

impl MachineTicks {
    pub fn read() -> Result<MachineTicks> {
        let text = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        Self::parse(&text)
    }

    /// Parses `/proc/stat`. guest and guest_nice are left out: the kernel already
    /// counts them in user and nice.
    pub fn parse(text: &str) -> Result<MachineTicks> {
        let line = text
            .lines()
            .find(|l| l.starts_with("cpu "))
            .ok_or_else(|| Error::new("no aggregate `cpu` line in /proc/stat"))?;
        let f: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|e| Error::new(format!("/proc/stat line {line:?}: {e}")))?;
        let [user, nice, system, _idle, _iowait, irq, softirq, steal, ..] = f[..] else {
            return Err(Error::new(format!(
                "/proc/stat line {line:?} has fewer than 8 fields"
            )));
        };
        Ok(MachineTicks {
            busy: user + nice + system + irq + softirq + steal,
        })
    }
}

/// How many cores the machine keeps busy over `span` while nothing of the
/// benchmark runs: other users' load, which inflates every busy-core figure.
pub fn background_busy_cores(span: Duration, hz: f64) -> Result<f64> {
    let (a, start) = (MachineTicks::read()?, Instant::now());
    std::thread::sleep(span);
    let b = MachineTicks::read()?;
    let seconds = start.elapsed().as_secs_f64().max(1e-9);
    Ok(b.busy.saturating_sub(a.busy) as f64 / (seconds * hz))
}

/// One thread's name, allowed CPUs and CPU time so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadTicks {
    pub tid: u32,
    pub name: String,
    /// `Cpus_allowed_list` from the thread's status: a single core for a pinned worker.
    pub cpus: String,
    pub ticks: u64,
}

/// A watched process's CPU time so far: its total (live and exited threads) and
/// each live thread.
#[derive(Clone, Debug)]
pub struct ProcessTicks {
    pub label: String,
    pub total: u64,
    pub threads: Vec<ThreadTicks>,
}

impl ProcessTicks {
    pub fn read(w: &Watched) -> Result<ProcessTicks> {
        let dir = format!("/proc/{}", w.pid);
        let (_, total) = read_stat(Path::new(&dir))
            .with_context(|| format!("CPU time of {} (pid {})", w.label, w.pid))?;
        let mut threads = Vec::new();
        let tasks = std::fs::read_dir(format!("{dir}/task"))
            .with_context(|| format!("listing threads of {} (pid {})", w.label, w.pid))?;
        for entry in tasks.flatten() {
            let Some(tid) = entry.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            // A thread may exit between the listing and the read: skip it.
            let Ok((name, ticks)) = read_stat(&entry.path()) else {
                continue;
            };
            let cpus = cpus_allowed(&entry.path()).unwrap_or_default();
            threads.push(ThreadTicks {
                tid,
                name,
                cpus,
                ticks,
            });
        }
        Ok(ProcessTicks {
            label: w.label.clone(),
            total,
            threads,
        })
    }
}

/// (comm, utime + stime) from `dir/stat` (a process or a task directory).
fn read_stat(dir: &Path) -> Result<(String, u64)> {
    let path = dir.join("stat");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    parse_stat(&text).with_context(|| path.display().to_string())
}

/// The name sits in parentheses and may itself contain spaces and parentheses, so
/// fields are counted from the last `)`: after it come state (field 3), ..., utime
/// (field 14) and stime (field 15).
fn parse_stat(text: &str) -> Result<(String, u64)> {
    let (open, close) = match (text.find('('), text.rfind(')')) {
        (Some(o), Some(c)) if o < c => (o, c),
        _ => return Err(Error::new(format!("no (comm) in {text:?}"))),
    };
    let name = text[open + 1..close].to_string();
    let fields: Vec<&str> = text[close + 1..].split_whitespace().collect();
    let num = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| Error::new(format!("field {} of {text:?} is not a number", i + 3)))
    };
    Ok((name, num(11)? + num(12)?))
}

fn cpus_allowed(task: &Path) -> Option<String> {
    let status = std::fs::read_to_string(task.join("status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_string())
}

/// Everything sampled at one instant.
#[derive(Clone, Debug)]
pub struct Snapshot {
    at: Instant,
    machine: MachineTicks,
    processes: Vec<ProcessTicks>,
}

impl Snapshot {
    pub fn take(watched: &[Watched]) -> Result<Snapshot> {
        let processes = watched
            .iter()
            .map(ProcessTicks::read)
            .collect::<Result<Vec<_>>>()?;
        Ok(Snapshot {
            at: Instant::now(),
            machine: MachineTicks::read()?,
            processes,
        })
    }
}

/// CPU use of one thread name within a process over a window, in cores.
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadUse {
    pub name: String,
    pub cpus: String,
    pub cores: f64,
}

/// A watched process's CPU use over a window, in cores.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessUse {
    pub label: String,
    pub cores: f64,
    /// By thread name (threads of the same name summed), sorted by name.
    pub threads: Vec<ThreadUse>,
}

/// CPU use over the window between two snapshots.
#[derive(Clone, Debug, PartialEq)]
pub struct Usage {
    pub seconds: f64,
    /// Busy ticks / (seconds * USER_HZ): how many cores were busy on average.
    pub busy_cores: f64,
    pub processes: Vec<ProcessUse>,
}

impl Usage {
    pub fn between(a: &Snapshot, b: &Snapshot, hz: f64) -> Usage {
        let seconds = b.at.duration_since(a.at).as_secs_f64();
        let cores = |ticks: u64| ticks as f64 / (seconds.max(1e-9) * hz);
        let processes = b
            .processes
            .iter()
            .filter_map(|after| {
                let before = a.processes.iter().find(|p| p.label == after.label)?;
                Some(ProcessUse {
                    label: after.label.clone(),
                    cores: cores(after.total.saturating_sub(before.total)),
                    threads: thread_use(before, after, &cores),
                })
            })
            .collect();
        Usage {
            seconds,
            busy_cores: cores(b.machine.busy.saturating_sub(a.machine.busy)),
            processes,
        }
    }

    /// The watched daemons' total, in cores; `None` for a setup without daemons.
    pub fn daemon_cores(&self) -> Option<f64> {
        self.cores_where(|label| label != VM_LABEL)
    }

    /// The VM's QEMU process, in cores; `None` for a setup without a VM.
    pub fn vm_cores(&self) -> Option<f64> {
        self.cores_where(|label| label == VM_LABEL)
    }

    fn cores_where(&self, keep: impl Fn(&str) -> bool) -> Option<f64> {
        let mut kept = self.processes.iter().filter(|p| keep(&p.label)).peekable();
        kept.peek()?;
        Some(kept.map(|p| p.cores).sum())
    }
}

/// Per thread name: the ticks each thread used between the snapshots (a thread
/// started in between counts from zero), summed by name.
fn thread_use(
    before: &ProcessTicks,
    after: &ProcessTicks,
    cores: &dyn Fn(u64) -> f64,
) -> Vec<ThreadUse> {
    let mut by_name: BTreeMap<&str, (String, u64)> = BTreeMap::new();
    for t in &after.threads {
        let start = before
            .threads
            .iter()
            .find(|b| b.tid == t.tid)
            .map_or(0, |b| b.ticks);
        let entry = by_name
            .entry(t.name.as_str())
            .or_insert_with(|| (t.cpus.clone(), 0));
        entry.1 += t.ticks.saturating_sub(start);
    }
    by_name
        .into_iter()
        .map(|(name, (cpus, ticks))| ThreadUse {
            name: name.to_string(),
            cpus,
            cores: cores(ticks),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_ticks_leave_out_idle_iowait_and_guest() {
        let t = MachineTicks::parse(
            "cpu  100 2 30 500 7 1 20 3 40 0\ncpu0 50 1 15 250 3 0 10 1 20 0\n",
        )
        .unwrap();
        assert_eq!(t.busy, 100 + 2 + 30 + 1 + 20 + 3);
        assert!(MachineTicks::parse("cpu0 1 2 3\n").is_err());
        assert!(MachineTicks::parse("cpu  1 2 3\n").is_err());
    }

    #[test]
    fn stat_fields_count_from_the_last_parenthesis() {
        let line = "4242 (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 37 5 0 0 20 0 3";
        assert_eq!(parse_stat(line).unwrap(), ("odd) name".to_string(), 42));
        assert!(parse_stat("4242 odd S 1").is_err());
    }

    #[test]
    fn own_process_is_readable() {
        let me = Watched {
            label: "self".into(),
            pid: std::process::id(),
        };
        let a = Snapshot::take(std::slice::from_ref(&me)).unwrap();
        let b = Snapshot::take(&[me]).unwrap();
        let u = Usage::between(&a, &b, user_hz().unwrap());
        assert_eq!(u.processes.len(), 1);
        assert!(!u.processes[0].threads.is_empty());
        assert!(u.busy_cores >= 0.0);
    }

    #[test]
    fn qemu_is_counted_apart_from_the_daemons() {
        let process = |label: &str, cores| ProcessUse {
            label: label.into(),
            cores,
            threads: Vec::new(),
        };
        let mut u = Usage {
            seconds: 1.0,
            busy_cores: 2.0,
            processes: vec![process("overlayd s0", 0.5), process("overlayd s1", 0.25)],
        };
        assert_eq!((u.daemon_cores(), u.vm_cores()), (Some(0.75), None));
        u.processes.push(process(VM_LABEL, 1.0));
        assert_eq!((u.daemon_cores(), u.vm_cores()), (Some(0.75), Some(1.0)));
        u.processes.clear();
        assert_eq!((u.daemon_cores(), u.vm_cores()), (None, None));
    }

    #[test]
    fn threads_are_summed_by_name_and_new_ones_count_from_zero() {
        let t = |tid, name: &str, ticks| ThreadTicks {
            tid,
            name: name.into(),
            cpus: "0".into(),
            ticks,
        };
        let before = ProcessTicks {
            label: "d".into(),
            total: 0,
            threads: vec![t(1, "worker0", 100), t(2, "api", 5)],
        };
        let after = ProcessTicks {
            label: "d".into(),
            total: 0,
            threads: vec![t(1, "worker0", 150), t(2, "api", 6), t(3, "api", 4)],
        };
        let u = thread_use(&before, &after, &|ticks| ticks as f64);
        assert_eq!(
            u.iter()
                .map(|t| (t.name.as_str(), t.cores))
                .collect::<Vec<_>>(),
            vec![("api", 5.0), ("worker0", 50.0)]
        );
    }
}
