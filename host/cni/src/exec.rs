//! Running delegate plugin binaries: lookup in `binDir` + `CNI_PATH`, exec with a deadline, output capture.
//!
//! A delegate is bounded in time and in bytes: `delegateTimeoutMs` covers its whole life (a delegate that closes
//! stdout and keeps running is killed at the deadline like one that never answers), and at most
//! [`STDOUT_CAP`] bytes of stdout and [`STDERR_CAP`] bytes of stderr are kept.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::process::{Pid, Signal, WaitOptions, WaitStatus};

/// The most a delegate may print on stdout. A CNI result or error object is a few KiB; past this the delegate
/// is killed and the call fails.
pub const STDOUT_CAP: usize = 1 << 20;

/// The most of a delegate's stderr that is kept (for the log and error messages); the rest is read and dropped.
pub const STDERR_CAP: usize = 64 << 10;

/// One plugin execution.
#[derive(Debug, Clone)]
pub struct ExecRequest<'a> {
    pub plugin: &'a Path,
    /// The arguments after the program's name (a CNI plugin gets none).
    pub args: &'a [String],
    /// The complete environment of the child (nothing else is inherited).
    pub env: &'a [(String, String)],
    pub stdin: &'a [u8],
    pub timeout: Duration,
}

#[derive(Debug, Clone, Default)]
pub struct ExecOutput {
    /// Exit code; `None` when killed by a signal.
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The deadline passed and the delegate's process group was killed.
    pub timed_out: bool,
    /// The delegate printed more than [`STDOUT_CAP`] on stdout and its process group was killed.
    pub overflowed: bool,
    pub elapsed: Duration,
}

/// Everything Plexus does to run a plugin, behind a trait so orchestration can be tested without processes.
pub trait Exec {
    fn run(&self, req: &ExecRequest<'_>) -> std::io::Result<ExecOutput>;

    /// The first executable file named `plugin` in `dirs`.
    fn find(&self, plugin: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
        dirs.iter()
            .map(|d| d.join(plugin))
            .find(|p| is_executable(p))
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Runs another [`Exec`] and keeps what each run was, for the invocation's report to the daemon.
pub struct RecordingExec<'a> {
    inner: &'a dyn Exec,
    calls: std::cell::RefCell<Vec<crate::daemon::proto::DelegateCall>>,
}

impl<'a> RecordingExec<'a> {
    pub fn new(inner: &'a dyn Exec) -> Self {
        RecordingExec {
            inner,
            calls: Default::default(),
        }
    }

    pub fn calls(&self) -> Vec<crate::daemon::proto::DelegateCall> {
        self.calls.borrow().clone()
    }
}

impl Exec for RecordingExec<'_> {
    fn run(&self, req: &ExecRequest<'_>) -> std::io::Result<ExecOutput> {
        let start = Instant::now();
        let out = self.inner.run(req);
        let result = match &out {
            Ok(o) if o.timed_out => "timeout".to_string(),
            Ok(o) if o.overflowed => "overflow".to_string(),
            Ok(o) if o.code == Some(0) => "success".to_string(),
            // A CNI error object's code, when the plugin printed one.
            Ok(o) => serde_json::from_slice::<serde_json::Value>(&o.stdout)
                .ok()
                .and_then(|v| v.get("code")?.as_u64())
                .map_or_else(|| "error".to_string(), |c| c.to_string()),
            Err(_) => "error".to_string(),
        };
        let command = req
            .env
            .iter()
            .find(|(k, _)| k == "CNI_COMMAND")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        self.calls
            .borrow_mut()
            .push(crate::daemon::proto::DelegateCall {
                plugin: req
                    .plugin
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                command,
                result,
                seconds: start.elapsed().as_secs_f64(),
            });
        out
    }

    fn find(&self, plugin: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
        self.inner.find(plugin, dirs)
    }
}

/// How long plexus still waits for a killed delegate to exit (and for its stdout to close).
const KILL_GRACE: Duration = Duration::from_secs(2);

/// What an empty pipe accepts without blocking (POSIX PIPE_BUF on Linux).
const PIPE_BUF: usize = 4096;

/// How often the exit of a delegate is checked where the kernel has no pidfds (before Linux 5.3).
const EXIT_POLL: Duration = Duration::from_millis(10);

/// Runs real processes. Each delegate gets its own process group, so a delegate that hangs is killed
/// together with anything it started.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessExec;

impl Exec for ProcessExec {
    fn run(&self, req: &ExecRequest<'_>) -> std::io::Result<ExecOutput> {
        let start = Instant::now();
        let crate::spawn::Spawned {
            pid,
            mut stdin,
            stdout,
            stderr,
        } = crate::spawn::spawn(req.plugin, req.args, req.env)?;
        // Every hand-off between threads waits for a core on a busy node, so the common path has none: small
        // input is written here (an empty pipe takes PIPE_BUF bytes without blocking), and stdout and stderr
        // are read here under the deadline.
        let writer = if req.stdin.len() <= PIPE_BUF {
            // A plugin that exits without reading stdin closes the pipe; that is its business.
            let _ = stdin.write_all(req.stdin);
            drop(stdin);
            None
        } else {
            // Large configs (big prevResults) can exceed the pipe buffer, so they are fed from a thread.
            let input = req.stdin.to_vec();
            Some(std::thread::spawn(move || {
                let _ = stdin.write_all(&input);
            }))
        };
        let mut watch = Watch {
            pid,
            pidfd: rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok(),
            deadline: start + req.timeout,
            kill_end: None,
            timed_out: false,
            overflowed: false,
        };
        let (status, stdout, stderr) = watch.run(stdout, stderr)?;
        let (timed_out, overflowed) = (watch.timed_out, watch.overflowed);
        // The writer ends when the delegate's group is gone (EPIPE); one still blocked on a process that left
        // the group is not waited for.
        if let Some(w) = writer.filter(|w| w.is_finished()) {
            let _ = w.join();
        }
        Ok(ExecOutput {
            code: status.and_then(|s| s.exit_status()),
            stdout,
            stderr,
            timed_out,
            overflowed,
            elapsed: start.elapsed(),
        })
    }
}

/// Adds `fd` to the poll set when `on`; its index.
fn watch_fd<'a>(
    fds: &mut Vec<PollFd<'a>>,
    on: bool,
    fd: std::os::fd::BorrowedFd<'a>,
) -> Option<usize> {
    on.then(|| {
        fds.push(PollFd::from_borrowed_fd(fd, PollFlags::IN));
        fds.len() - 1
    })
}

/// One read of a delegate's stderr into `kept`, which keeps the first STDERR_CAP bytes (the rest is read and
/// dropped, so the delegate never blocks on a full pipe). False once the pipe is closed, failed or empty.
fn read_capped(pipe: &mut impl Read, buf: &mut [u8], kept: &mut Vec<u8>) -> bool {
    match pipe.read(buf) {
        Ok(0) => false,
        Ok(n) => {
            let room = STDERR_CAP.saturating_sub(kept.len());
            kept.extend_from_slice(&buf[..n.min(room)]);
            true
        }
        Err(e) => e.kind() == std::io::ErrorKind::Interrupted,
    }
}

/// One running delegate and its deadline.
struct Watch {
    /// The delegate, also its process group.
    pid: Pid,
    /// Readable once the child exits; `None` where the kernel has no pidfds.
    pidfd: Option<rustix::fd::OwnedFd>,
    deadline: Instant,
    /// Set when the group was killed: how long to wait for it to go.
    kill_end: Option<Instant>,
    timed_out: bool,
    overflowed: bool,
}

impl Watch {
    fn kill(&mut self) {
        if self.kill_end.is_none() {
            let _ = rustix::process::kill_process_group(self.pid, Signal::KILL);
            self.kill_end = Some(Instant::now() + KILL_GRACE);
        }
    }

    /// The delegate's exit status, if it has exited (it is reaped then).
    fn try_wait(&self) -> std::io::Result<Option<WaitStatus>> {
        Ok(rustix::process::waitpid(Some(self.pid), WaitOptions::NOHANG)?.map(|(_, s)| s))
    }

    /// Reads stdout (up to its cap) and stderr (keeping its first STDERR_CAP bytes) and waits for the exit, all
    /// under the deadline, in one poll loop (no thread). Ends when stdout is closed and the child has exited, or
    /// when the group was killed and the grace after the kill is over (then the status is `None` if the child
    /// is still not gone). stderr is not waited for: a process the delegate left behind may hold it open.
    fn run(
        &mut self,
        mut stdout: File,
        mut stderr: File,
    ) -> std::io::Result<(Option<WaitStatus>, Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let (mut out_open, mut err_open) = (true, true);
        let mut status = None;
        let mut buf = [0u8; 8192];
        while out_open || status.is_none() {
            let now = Instant::now();
            if now >= self.deadline && self.kill_end.is_none() {
                self.timed_out = true;
                self.kill();
            }
            let until = self.kill_end.unwrap_or(self.deadline);
            let mut left = until.saturating_duration_since(now);
            if self.kill_end.is_some() && left.is_zero() {
                break;
            }
            if self.pidfd.is_none() && status.is_none() {
                left = left.min(EXIT_POLL);
            }
            let wait = rustix::event::Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: i64::from(left.subsec_nanos()),
            };
            let (out_ready, err_ready, exited) = {
                let mut fds = Vec::with_capacity(3);
                let out_slot = watch_fd(&mut fds, out_open, stdout.as_fd());
                let err_slot = watch_fd(&mut fds, err_open, stderr.as_fd());
                let pid_slot = match (&self.pidfd, status.is_none()) {
                    (Some(fd), true) => watch_fd(&mut fds, true, fd.as_fd()),
                    _ => None,
                };
                match rustix::event::poll(&mut fds, Some(&wait)) {
                    Ok(_) => {}
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => return Err(e.into()),
                }
                let ready = |i: Option<usize>| i.is_some_and(|i| !fds[i].revents().is_empty());
                (
                    ready(out_slot),
                    ready(err_slot),
                    ready(pid_slot) || (self.pidfd.is_none() && status.is_none()),
                )
            };
            if out_ready {
                match stdout.read(&mut buf) {
                    Ok(0) => out_open = false,
                    Ok(n) => {
                        out.extend_from_slice(&buf[..n]);
                        if out.len() > STDOUT_CAP {
                            out.truncate(STDOUT_CAP);
                            out_open = false;
                            self.overflowed = true;
                            self.kill();
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => out_open = false,
                }
            }
            if err_ready {
                err_open = read_capped(&mut stderr, &mut buf, &mut err);
            }
            if exited && status.is_none() {
                status = self.try_wait()?;
            }
        }
        if status.is_none() {
            status = self.try_wait()?;
        }
        // What is already in the stderr pipe, without waiting for a writer that may never close it.
        if err_open {
            let _ = rustix::fs::fcntl_setfl(&stderr, rustix::fs::OFlags::NONBLOCK);
            for _ in 0..(STDERR_CAP / buf.len() + 1) {
                if !read_capped(&mut stderr, &mut buf, &mut err) {
                    break;
                }
            }
        }
        Ok((status, out, err))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn run(p: &Path, env: &[(String, String)], stdin: &[u8], timeout: Duration) -> ExecOutput {
        ProcessExec
            .run(&ExecRequest {
                plugin: p,
                args: &[],
                env,
                stdin,
                timeout,
            })
            .unwrap()
    }

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn captures_output_env_and_stdin() {
        let tmp = tempfile::tempdir().unwrap();
        let p = script(
            tmp.path(),
            "echo",
            "cat; echo \"cmd=$CNI_COMMAND home=$HOME\" >&2; exit 3",
        );
        let env = vec![("CNI_COMMAND".to_string(), "ADD".to_string())];
        let out = run(&p, &env, b"{\"a\":1}", Duration::from_secs(10));
        assert_eq!(out.stdout, b"{\"a\":1}");
        // The environment is exactly what was given: HOME is not inherited.
        assert_eq!(String::from_utf8_lossy(&out.stderr), "cmd=ADD home=\n");
        assert_eq!(out.code, Some(3));
        assert!(!out.timed_out);
    }

    #[test]
    fn arguments_follow_the_programs_name_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        let p = script(tmp.path(), "args", "printf '%s|' \"$0\" \"$@\"");
        let out = ProcessExec
            .run(&ExecRequest {
                plugin: &p,
                args: &["a b".into(), String::new(), "--net=/x".into()],
                env: &[],
                stdin: &[],
                timeout: Duration::from_secs(10),
            })
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{}|a b||--net=/x|", p.display())
        );
    }

    #[test]
    fn large_stdin_and_stderr_do_not_block() {
        let tmp = tempfile::tempdir().unwrap();
        // More stdin than an empty pipe takes at once, and more stderr than a pipe would buffer.
        let p = script(
            tmp.path(),
            "big",
            "cat; head -c 200000 /dev/zero | tr '\\0' e >&2",
        );
        let input = vec![b'x'; 100_000];
        let out = run(&p, &[], &input, Duration::from_secs(10));
        assert!(!out.timed_out);
        assert_eq!(out.code, Some(0));
        assert_eq!(out.stdout, input);
        // stderr is kept up to its cap (the rest was read and dropped).
        assert_eq!(out.stderr.len(), STDERR_CAP);
        assert!(out.stderr.iter().all(|b| *b == b'e'));
    }

    #[test]
    fn hung_plugin_and_its_children_are_killed() {
        let tmp = tempfile::tempdir().unwrap();
        let marker = tmp.path().join("child-survived");
        let body = format!("(sleep 2; touch {}) & sleep 30", marker.display());
        let p = script(tmp.path(), "hang", &body);
        let out = run(&p, &[], b"", Duration::from_millis(200));
        assert!(out.timed_out);
        assert_eq!(out.code, None, "killed by a signal");
        assert!(out.elapsed < Duration::from_secs(10), "{:?}", out.elapsed);
        std::thread::sleep(Duration::from_millis(2500));
        assert!(
            !marker.exists(),
            "the delegate's background child must die with it"
        );
    }

    #[test]
    fn a_delegate_that_closes_stdout_and_keeps_running_is_killed_at_the_deadline() {
        let tmp = tempfile::tempdir().unwrap();
        let p = script(tmp.path(), "closer", "exec 1>&-; exec sleep 100000");
        let out = run(&p, &[], b"", Duration::from_millis(300));
        assert!(out.timed_out, "{out:?}");
        assert_eq!(out.code, None, "killed by a signal");
        assert!(out.elapsed < Duration::from_secs(10), "{:?}", out.elapsed);
    }

    #[test]
    fn a_flooding_delegate_is_killed_at_the_stdout_cap_and_stderr_is_capped() {
        let tmp = tempfile::tempdir().unwrap();
        let p = script(tmp.path(), "yes", "exec yes");
        let out = run(&p, &[], b"", Duration::from_secs(30));
        assert!(out.overflowed && !out.timed_out, "{out:?}");
        assert_eq!(out.stdout.len(), STDOUT_CAP);
        assert_eq!(out.code, None, "killed by a signal");

        // stderr: 1 MiB written, the first STDERR_CAP bytes kept, and the delegate still exits normally.
        let p = script(
            tmp.path(),
            "loud",
            "head -c 1048576 /dev/zero | tr '\\0' e >&2; echo done",
        );
        let out = run(&p, &[], b"", Duration::from_secs(30));
        assert!(!out.timed_out && !out.overflowed, "{out:?}");
        assert_eq!(out.stdout, b"done\n");
        assert_eq!(out.stderr.len(), STDERR_CAP);
        assert!(out.stderr.iter().all(|b| *b == b'e'));
    }

    #[test]
    fn stderr_opened_by_path_works_and_a_process_left_holding_it_is_not_waited_for() {
        let tmp = tempfile::tempdir().unwrap();
        // Scripts log with `> /dev/stderr` (a new open of the same pipe), and a helper the delegate leaves
        // behind may keep stderr open long after the delegate exited.
        let p = script(
            tmp.path(),
            "logger",
            "echo hello > /dev/stderr; sleep 4 >/dev/null & echo '{}'",
        );
        // Waiting for the helper's stderr would pass this deadline.
        let out = run(&p, &[], b"", Duration::from_secs(2));
        assert!(!out.timed_out, "{out:?}");
        assert_eq!(out.code, Some(0));
        assert_eq!(out.stdout, b"{}\n");
        assert_eq!(out.stderr, b"hello\n");
    }

    #[test]
    fn lookup_takes_the_first_executable() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        std::fs::write(a.path().join("p"), "not executable").unwrap();
        let want = script(b.path(), "p", "true");
        let dirs = vec![a.path().to_path_buf(), b.path().to_path_buf()];
        assert_eq!(ProcessExec.find("p", &dirs), Some(want));
        assert_eq!(ProcessExec.find("missing", &dirs), None);
    }
}
