//! Running delegate plugin binaries: lookup in `binDir` + `CNI_PATH`, exec with a deadline, output capture.

use std::io::{Read, Seek, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One plugin execution.
#[derive(Debug, Clone)]
pub struct ExecRequest<'a> {
    pub plugin: &'a Path,
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
    pub timed_out: bool,
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

/// How long stdout is still read after a timed-out delegate's process group was killed.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// What an empty pipe accepts without blocking (POSIX PIPE_BUF on Linux).
const PIPE_BUF: usize = 4096;

/// Runs real processes. Each delegate gets its own process group, so a delegate that hangs is killed
/// together with anything it started.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessExec;

impl Exec for ProcessExec {
    fn run(&self, req: &ExecRequest<'_>) -> std::io::Result<ExecOutput> {
        let start = Instant::now();
        // stderr goes to an anonymous memory file rather than a pipe: a pipe would need a reader thread, and
        // joining it is a hand-off that waits for a core on a busy node.
        let err_file = std::fs::File::from(rustix::fs::memfd_create(
            "plexus-delegate-stderr",
            rustix::fs::MemfdFlags::CLOEXEC,
        )?);
        let mut child = Command::new(req.plugin)
            .env_clear()
            .envs(req.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err_file.try_clone()?))
            .process_group(0)
            .spawn()?;
        let pid = child.id();
        let mut stdin = child.stdin.take().expect("stdin piped");
        let mut stdout = child.stdout.take().expect("stdout piped");
        // Every hand-off between threads waits for a core on a busy node, so the common path has none: small
        // input is written here (an empty pipe takes PIPE_BUF bytes without blocking), and stdout is read here
        // under the deadline.
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
        // The deadline is kept by polling stdout with the time left: when stdout is still open at the deadline
        // the process group is killed. Reading ends when the plugin (and every process it left holding the
        // pipe) is gone, or killed. No thread: every hand-off waits for a core on a busy node.
        let deadline = start + req.timeout;
        let mut timed_out = false;
        let mut out = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            let now = Instant::now();
            if now >= deadline && !timed_out {
                timed_out = true;
                if let Some(pgid) = rustix::process::Pid::from_raw(pid as i32) {
                    let _ =
                        rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
                }
            }
            // After the kill, a process that left the group may still hold the pipe: stop reading after a grace.
            let until = if timed_out {
                deadline + KILL_GRACE
            } else {
                deadline
            };
            let left = until.saturating_duration_since(now);
            if timed_out && left.is_zero() {
                break;
            }
            let mut fds = [rustix::event::PollFd::new(
                &stdout,
                rustix::event::PollFlags::IN,
            )];
            let wait = rustix::event::Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: i64::from(left.subsec_nanos()),
            };
            match rustix::event::poll(&mut fds, Some(&wait)) {
                Ok(0) => continue,
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
            match stdout.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let status = child.wait()?;
        if let Some(w) = writer {
            let _ = w.join();
        }
        let mut stderr = Vec::new();
        let mut err_file = err_file;
        err_file.seek(std::io::SeekFrom::Start(0))?;
        err_file.read_to_end(&mut stderr)?;
        let stdout = out;
        Ok(ExecOutput {
            code: status.code(),
            stdout,
            stderr,
            timed_out,
            elapsed: start.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
        let out = ProcessExec
            .run(&ExecRequest {
                plugin: &p,
                env: &env,
                stdin: b"{\"a\":1}",
                timeout: Duration::from_secs(10),
            })
            .unwrap();
        assert_eq!(out.stdout, b"{\"a\":1}");
        // The environment is exactly what was given: HOME is not inherited.
        assert_eq!(String::from_utf8_lossy(&out.stderr), "cmd=ADD home=\n");
        assert_eq!(out.code, Some(3));
        assert!(!out.timed_out);
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
        let out = ProcessExec
            .run(&ExecRequest {
                plugin: &p,
                env: &[],
                stdin: &input,
                timeout: Duration::from_secs(10),
            })
            .unwrap();
        assert!(!out.timed_out);
        assert_eq!(out.code, Some(0));
        assert_eq!(out.stdout, input);
        assert_eq!(out.stderr.len(), 200_000);
        assert!(out.stderr.iter().all(|b| *b == b'e'));
    }

    #[test]
    fn hung_plugin_and_its_children_are_killed() {
        let tmp = tempfile::tempdir().unwrap();
        let marker = tmp.path().join("child-survived");
        let body = format!("(sleep 2; touch {}) & sleep 30", marker.display());
        let p = script(tmp.path(), "hang", &body);
        let out = ProcessExec
            .run(&ExecRequest {
                plugin: &p,
                env: &[],
                stdin: b"",
                timeout: Duration::from_millis(200),
            })
            .unwrap();
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
