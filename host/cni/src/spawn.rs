//! Starting a delegate the way `posix_spawn` does (a child that shares plexus's memory until it execs, so
//! nothing is copied), plus the step `posix_spawn` cannot take: `PR_SET_PDEATHSIG`, so that the delegate gets
//! SIGKILL when plexus dies.
//!
//! `std::process::Command` takes that step only in a `pre_exec` hook, and a hook makes it fork: every page
//! table of plexus copied and every page it then writes faulted back, ~0.15 ms per delegate on the node this
//! was measured on (docs/benchmarks.md). Here the child is started with `clone(CLONE_VM | CLONE_VFORK)`: it
//! runs on a stack of its own in plexus's address space while the calling thread waits, makes a handful of
//! system calls (process group, death signal, stdio, signal dispositions) and execs. It touches nothing but
//! what [`spawn`] prepared before the clone: no allocation, no lock, no Rust standard library.

use std::ffi::{c_int, c_void, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};

use rustix::process::Pid;

/// The child's stack. It makes a few system calls through libc before exec, a few hundred bytes deep.
const STACK: usize = 64 << 10;

/// A started delegate: its pid (also its process group) and the parent's ends of its stdio pipes.
#[derive(Debug)]
pub struct Spawned {
    pub pid: Pid,
    pub stdin: File,
    pub stdout: File,
    pub stderr: File,
}

/// What the child reads, all prepared before the clone.
struct ChildPlan {
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    /// The child's ends of the pipes, to become fds 0, 1 and 2 (each above 2: see `above_stdio`).
    stdio: [c_int; 3],
    /// Plexus's pid: the child checks that plexus has not died before the death signal was armed.
    parent: libc::pid_t,
    /// The signal mask the delegate starts with (empty, as `Command` leaves it).
    mask: libc::sigset_t,
    /// The errno of the step that failed in the child, written before it exits (0: it exec'd).
    error: AtomicI32,
}

/// Starts `program` with `args` after its name, exactly `env` as its environment, its own process group, stdio on
/// pipes, and SIGKILL as its parent-death signal.
pub fn spawn(program: &Path, args: &[String], env: &[(String, String)]) -> io::Result<Spawned> {
    let path = CString::new(program.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "plugin path holds a NUL byte"))?;
    let args: Vec<CString> = args
        .iter()
        .map(|a| CString::new(a.as_str()))
        .collect::<Result<_, _>>()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "an argument holds a NUL byte"))?;
    let env: Vec<CString> = env
        .iter()
        .map(|(k, v)| CString::new(format!("{k}={v}")))
        .collect::<Result<_, _>>()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "environment holds a NUL byte"))?;
    let argv: Vec<*const libc::c_char> = std::iter::once(path.as_ptr())
        .chain(args.iter().map(|a| a.as_ptr()))
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: Vec<*const libc::c_char> = env
        .iter()
        .map(|e| e.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();

    // Pipes are close-on-exec on both ends; the child's dup2 onto 0, 1 and 2 clears the flag on the copies.
    let (stdin_r, stdin_w) = pipe()?;
    let (stdout_r, stdout_w) = pipe()?;
    let (stderr_r, stderr_w) = pipe()?;
    let plan = ChildPlan {
        path: path.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        stdio: [
            stdin_r.as_raw_fd(),
            stdout_w.as_raw_fd(),
            stderr_w.as_raw_fd(),
        ],
        parent: rustix::process::getpid().as_raw_nonzero().get(),
        mask: empty_sigset(),
        error: AtomicI32::new(0),
    };
    let pid = clone_and_exec(&plan)?;
    // The child has exec'd or exited: nothing of `plan`, `argv`, `envp` or the child's pipe ends is in use.
    drop((stdin_r, stdout_w, stderr_w));
    let error = plan.error.load(Ordering::Acquire);
    if error != 0 {
        // The child exited at once: reap it, and report why.
        let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
        return Err(io::Error::from_raw_os_error(error));
    }
    Ok(Spawned {
        pid,
        stdin: File::from(stdin_w),
        stdout: File::from(stdout_r),
        stderr: File::from(stderr_r),
    })
}

/// A close-on-exec pipe whose ends are both above fd 2, so that no dup2 in the child overwrites another of its
/// pipe ends (a process started with 0, 1 or 2 closed gets pipes there).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as c_int; 2];
    #[allow(unsafe_code)]
    // SAFETY: pipe2 writes two new descriptors into `fds`; each is owned once, by the OwnedFd made of it.
    let (r, w) = unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(io::Error::last_os_error());
        }
        (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
    };
    Ok((above_stdio(r)?, above_stdio(w)?))
}

fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    Ok(rustix::io::fcntl_dupfd_cloexec(&fd, 3)?)
}

fn empty_sigset() -> libc::sigset_t {
    #[allow(unsafe_code)]
    // SAFETY: sigemptyset initialises the whole set it is given.
    unsafe {
        let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        libc::sigemptyset(set.as_mut_ptr());
        set.assume_init()
    }
}

/// Clones the child onto a fresh stack and returns when it has exec'd or exited.
#[allow(unsafe_code)]
fn clone_and_exec(plan: &ChildPlan) -> io::Result<Pid> {
    // SAFETY: a private anonymous mapping, unmapped below once the child no longer runs on it.
    let stack = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // Every signal is blocked across the clone, so that no handler of plexus runs in the child on plexus's
    // memory before the child has reset it (`child`); the calling thread's mask is restored after.
    let mut all = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigfillset initialises `all`; pthread_sigmask writes the previous mask into `old`. The clone:
    // the child runs `child` on the top of `stack` (it grows down) with `plan`, which outlives it because
    // CLONE_VFORK holds this thread until the child has exec'd or exited; `child` only reads `plan`, makes
    // system calls and writes `plan.error`.
    let (pid, clone_error) = unsafe {
        libc::sigfillset(all.as_mut_ptr());
        libc::pthread_sigmask(libc::SIG_SETMASK, all.as_ptr(), old.as_mut_ptr());
        let top = stack.cast::<u8>().add(STACK).cast::<c_void>();
        let pid = libc::clone(
            child,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            plan as *const ChildPlan as *mut c_void,
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, old.as_ptr(), std::ptr::null_mut());
        libc::munmap(stack, STACK);
        (pid, clone_error)
    };
    if pid < 0 {
        return Err(clone_error);
    }
    Pid::from_raw(pid).ok_or_else(|| io::Error::other("clone returned pid 0 to the parent"))
}

/// The child, between clone and exec. Runs on its own stack in plexus's memory with every signal blocked.
#[allow(unsafe_code)]
extern "C" fn child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `ChildPlan` that `clone_and_exec` holds alive until this child execs or exits.
    let plan = unsafe { &*(arg as *const ChildPlan) };
    // SAFETY: only system calls on values prepared before the clone; on any failure the errno is written to
    // `plan.error` (an atomic the parent reads after the clone returns) and the child exits without running
    // any destructor or atexit handler of plexus.
    unsafe {
        let fail = || -> ! {
            plan.error.store(
                io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO),
                Ordering::Release,
            );
            libc::_exit(127)
        };
        // Its own process group, so that a hung delegate is killed with everything it started.
        if libc::setpgid(0, 0) != 0 {
            fail();
        }
        // SIGKILL when plexus dies: the runtime kills plexus at its own timeout and calls DEL at once, and a
        // delegate left running would race that DEL and could attach after it (an interface or an address
        // nobody releases). Plexus may have died before the signal was armed: then none is coming.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            fail();
        }
        if libc::getppid() != plan.parent {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
        for (target, &fd) in plan.stdio.iter().enumerate() {
            if libc::dup2(fd, target as c_int) < 0 {
                fail();
            }
        }
        // Handlers of plexus must not run in the delegate, and SIGPIPE (which the Rust runtime ignores) goes
        // back to its default, as `Command` leaves it.
        for signal in 1..libc::SIGRTMAX() {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut current) != 0 {
                continue;
            }
            let handler = current.sa_sigaction;
            if handler != libc::SIG_DFL && (handler != libc::SIG_IGN || signal == libc::SIGPIPE) {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
        libc::sigprocmask(libc::SIG_SETMASK, &plan.mask, std::ptr::null_mut());
        libc::execve(plan.path, plan.argv, plan.envp);
        fail()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &Path, body: &str) -> std::path::PathBuf {
        let p = dir.join("plugin");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    fn wait(pid: Pid) -> rustix::process::WaitStatus {
        rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty())
            .unwrap()
            .unwrap()
            .1
    }

    #[test]
    fn the_child_has_its_own_group_no_blocked_signal_default_sigpipe_and_only_the_given_env() {
        let tmp = tempfile::tempdir().unwrap();
        // The shell reports its stdin, pid, process group and environment, and its blocked and ignored
        // signals from /proc. (The death signal is not in /proc: tests/pure/teardown.rs kills plexus to check it.)
        // It reads its own status with builtins: a child reading it (grep) can catch the shell inside a fork,
        // when the shell blocks every signal for a moment.
        let p = script(
            tmp.path(),
            "read line; echo \"in=$line pid=$$ pgid=$(cut -d' ' -f5 /proc/$$/stat) env=$(env | sort | tr '\\n' ' ')\"; \
             while read -r key mask; do case $key in SigBlk:|SigIgn:) echo \"$key $mask\" >&2;; esac; \
             done < /proc/$$/status",
        );
        let mut s = spawn(&p, &[], &[("ONLY".into(), "this".into())]).unwrap();
        s.stdin.write_all(b"hello\n").unwrap();
        drop(s.stdin);
        let mut out = String::new();
        s.stdout.read_to_string(&mut out).unwrap();
        let mut err = String::new();
        s.stderr.read_to_string(&mut err).unwrap();
        assert_eq!(wait(s.pid).exit_status(), Some(0));
        let pid = s.pid.as_raw_nonzero().get();
        assert!(
            out.starts_with(&format!("in=hello pid={pid} pgid={pid} env=")),
            "{out}"
        );
        // `env` of the shell adds PWD (and nothing from plexus's environment).
        assert!(out.contains("ONLY=this"), "{out}");
        assert!(!out.contains("PATH=/"), "{out}");
        assert_eq!(err.lines().count(), 2, "{err}");
        for line in err.lines() {
            let mask = u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap();
            assert_eq!(mask & (1 << (libc::SIGPIPE - 1)), 0, "{line}");
            if line.starts_with("SigBlk") {
                assert_eq!(
                    mask, 0,
                    "the delegate starts with no signal blocked: {line}"
                );
            }
        }
    }

    #[test]
    fn a_missing_or_unexecutable_program_is_an_error_naming_why() {
        let tmp = tempfile::tempdir().unwrap();
        let e = spawn(&tmp.path().join("missing"), &[], &[]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let p = tmp.path().join("data");
        std::fs::write(&p, "not a program").unwrap();
        let e = spawn(&p, &[], &[]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    }
}
