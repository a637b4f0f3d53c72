//! Running one child process the way a container runtime does, timed, with its peak RSS from wait4.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What one child did.
#[derive(Debug)]
pub struct ChildRun {
    pub pid: u32,
    pub success: bool,
    pub stdout: Vec<u8>,
    /// From just before fork to just after the child was reaped: what the caller waited.
    pub elapsed: Duration,
    /// `ru_maxrss` of the child alone, in KiB.
    pub max_rss_kib: u64,
}

/// Spawns `cmd` with `stdin`, reads its stdout to the end and reaps it with wait4 (which, unlike
/// `Child::wait`, also returns the child's own resource usage). stderr is whatever the caller configured.
pub fn run(cmd: &mut Command, stdin: &[u8]) -> std::io::Result<ChildRun> {
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn()?;
    {
        // Confs are far below the pipe buffer size, so writing before reading cannot deadlock.
        let mut input = child.stdin.take().expect("stdin is piped");
        let _ = input.write_all(stdin);
    }
    let mut stdout = Vec::new();
    child
        .stdout
        .take()
        .expect("stdout is piped")
        .read_to_end(&mut stdout)?;
    let pid = child.id();
    let (code, max_rss_kib) = wait4(pid as i32)?;
    let elapsed = start.elapsed();
    Ok(ChildRun {
        pid,
        success: code == Some(0),
        stdout,
        elapsed,
        max_rss_kib,
    })
}

/// Reaps `pid`; returns its exit code (None when killed by a signal) and ru_maxrss.
#[allow(unsafe_code)]
fn wait4(pid: i32) -> std::io::Result<(Option<i32>, u64)> {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data, all-zero is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `pid` is an unreaped child of this process (std never reaps without being asked), and
        // both out-pointers point to live, properly aligned locals.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    Ok((code, usage.ru_maxrss.max(0) as u64))
}

/// User plus system CPU time of every child of this process reaped so far (with their own reaped descendants).
/// Differences around a sequential operation give the CPU that operation's processes used, which a loaded
/// machine inflates far less than it inflates wall time.
#[allow(unsafe_code)]
pub fn children_cpu() -> Duration {
    // SAFETY: rusage is plain old data, all-zero is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_CHILDREN is a valid selector and `usage` is a live, aligned out-pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let tv =
        |t: libc::timeval| Duration::new(t.tv_sec.max(0) as u64, (t.tv_usec.max(0) as u32) * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// A KiB field of `/proc/<pid>/status` (`VmRSS:`, `VmHWM:`); 0 when the process or field is gone.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Runs `cmd` to its end and reads its stdout as JSON; `what` names it in the error (with its stderr when it
/// failed).
pub fn json_answer(cmd: &mut Command, what: &str) -> Result<serde_json::Value, String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{what}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("{what}: its answer is not JSON: {e}"))
}
