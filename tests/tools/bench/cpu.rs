//! Where the machine's CPU time went over a stretch of a benchmark: the whole machine's busy time (`/proc/stat`)
//! and, per named part, the user + system time of its processes, or of the children they reaped (a process's
//! `cutime`/`cstime`: what its short-lived children used, counted once each is waited for). What no part names
//! (containers and their shims, runc, the kernel's threads) is the rest.

use std::collections::BTreeMap;

/// What of a process a part counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Of {
    /// Its own threads.
    Own,
    /// The children it has reaped (and theirs, as each reaped its own).
    Reaped,
    /// Both.
    All,
}

/// CPU seconds of the machine and of named parts since [`Ledger::start`].
pub struct Ledger {
    parts: Vec<(String, Vec<(u32, Of)>)>,
    start: Vec<f64>,
    /// The machine's busy and stolen seconds at the start.
    machine_start: (f64, f64),
}

impl Ledger {
    /// Starts counting `parts`: each a name and the processes it counts.
    pub fn start(parts: Vec<(String, Vec<(u32, Of)>)>) -> Ledger {
        let start = parts.iter().map(|(_, p)| seconds_of(p)).collect();
        Ledger {
            parts,
            start,
            machine_start: machine_seconds(),
        }
    }

    /// CPU seconds since the start: per part, `rest` (the machine's busy time that no part counts), `machine`, and
    /// `steal` (time the hypervisor ran others while the machine wanted a core; not in `machine`).
    pub fn stop(self) -> BTreeMap<String, f64> {
        let now = machine_seconds();
        let machine = now.0 - self.machine_start.0;
        let mut out: BTreeMap<String, f64> = self
            .parts
            .iter()
            .zip(&self.start)
            .map(|((name, p), start)| (name.clone(), (seconds_of(p) - start).max(0.0)))
            .collect();
        let counted: f64 = out.values().sum();
        out.insert("rest".into(), (machine - counted).max(0.0));
        out.insert("machine".into(), machine);
        out.insert("steal".into(), now.1 - self.machine_start.1);
        out
    }
}

fn seconds_of(procs: &[(u32, Of)]) -> f64 {
    procs
        .iter()
        .map(|&(pid, of)| process_seconds(pid, of))
        .sum()
}

/// CPU seconds (user + system) of process `pid` so far: its own, its reaped children's, or both; 0 once it is
/// gone.
pub fn process_seconds(pid: u32, of: Of) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: utime, stime, cutime and cstime are the 12th to 15th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let own = ticks(11) + ticks(12);
    let reaped = ticks(13) + ticks(14);
    let t = match of {
        Of::Own => own,
        Of::Reaped => reaped,
        Of::All => own + reaped,
    };
    t / clock_ticks()
}

/// The machine's busy CPU seconds since boot, all CPUs: user, nice, system, irq and softirq (not idle, iowait, or
/// the time the hypervisor gave to others).
pub fn machine_busy_seconds() -> f64 {
    machine_seconds().0
}

/// The machine's busy and stolen CPU seconds since boot (`/proc/stat`'s first line: user nice system idle iowait
/// irq softirq steal).
fn machine_seconds() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return (0.0, 0.0);
    };
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
    let busy = at(0) + at(1) + at(2) + at(5) + at(6);
    (busy / clock_ticks(), at(7) / clock_ticks())
}

/// Waits until the machine is quiet: fewer than `cores` of busy CPU over one second, for at most `limit`. The
/// seconds it waited and the busy cores of the last second.
pub fn settle(cores: f64, limit: std::time::Duration) -> (f64, f64) {
    let start = std::time::Instant::now();
    loop {
        let before = machine_busy_seconds();
        std::thread::sleep(std::time::Duration::from_secs(1));
        let busy = machine_busy_seconds() - before;
        if busy < cores || start.elapsed() >= limit {
            return (start.elapsed().as_secs_f64(), busy);
        }
    }
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`; 100 on Linux's usual builds).
fn clock_ticks() -> f64 {
    static HZ: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *HZ.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .filter(|hz: &f64| *hz > 0.0)
            .unwrap_or(100.0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_child_counts_once_reaped() {
        let me = std::process::id();
        let before = process_seconds(me, Of::Reaped);
        // A child that burns ~0.3 s of CPU, then is waited for.
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(status.success());
        let after = process_seconds(me, Of::Reaped);
        assert!(after - before > 0.05, "reaped {before} -> {after}");
        assert!(machine_busy_seconds() > 0.0);
    }
}
