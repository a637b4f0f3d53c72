//! Running delegate plugin binaries: lookup in `binDir` + `CNI_PATH`, exec with a deadline, output capture.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
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

/// Runs real processes. Each delegate gets its own process group, so a delegate that hangs is killed
/// together with anything it started.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessExec;

impl Exec for ProcessExec {
    fn run(&self, req: &ExecRequest<'_>) -> std::io::Result<ExecOutput> {
        let start = Instant::now();
        let mut child = Command::new(req.plugin)
            .env_clear()
            .envs(req.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()?;
        let pid = child.id();
        let mut stdin = child.stdin.take().expect("stdin piped");
        let mut stdout = child.stdout.take().expect("stdout piped");
        let mut stderr = child.stderr.take().expect("stderr piped");
        let input = req.stdin.to_vec();
        // Large configs (big prevResults) can exceed the pipe buffer, so stdin is fed from a thread.
        let writer = std::thread::spawn(move || {
            // A plugin that exits without reading stdin closes the pipe; that is its business.
            let _ = stdin.write_all(&input);
        });
        let err_reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = stderr.read_to_end(&mut buf);
            buf
        });
        let (tx, rx) = mpsc::channel();
        let out_reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = stdout.read_to_end(&mut buf);
            let _ = tx.send(());
            buf
        });
        // stdout closes when the plugin (and every process it left holding the pipe) is gone.
        let timed_out = matches!(
            rx.recv_timeout(req.timeout),
            Err(mpsc::RecvTimeoutError::Timeout)
        );
        if timed_out {
            if let Some(pgid) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
            }
        }
        let status = child.wait()?;
        let _ = writer.join();
        let stdout = out_reader.join().unwrap_or_default();
        let stderr = err_reader.join().unwrap_or_default();
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
