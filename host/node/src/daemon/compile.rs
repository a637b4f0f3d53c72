//! Compiling a pulled hook module for the node, and probing it, in processes of their own: `plexus hook compile`
//! and `plexus hook probe` run from the daemon's own binary. The compiler's working memory (tens of MiB for one module, which the allocator keeps once it is
//! freed) never enters the long-running daemon, so a node's daemon with hooks is as big as one without; a module
//! that crashes or exhausts the compiler ends only that process. Bounded in time and in what is read back.
//!
//! Each such process starts with a clean environment, [`CHILD_ENV`] and nothing else (the daemon's environment
//! holds the node's and the cluster's settings, which a module has no business near), and with limits of its
//! own, below the daemon container's ([`ProcessLimits`]): a module that makes the compiler or its own instance
//! grow fails there, with a message, instead of taking the daemon's container to its memory limit.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use plexus_hooks::HookSpec;
use rustix::process::{Resource, Rlimit};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::hook_state::{Failure, Reason};

/// The longest a compile may take (the example guests take under a second each on two cores).
pub const COMPILE_TIMEOUT: Duration = Duration::from_secs(120);

/// The most read back of the compile's output and of its error.
const OUTPUT_CAP: u64 = 64 * 1024;

/// The program that compiles: the running daemon's own image, so that the artifact is made by the very wasmtime
/// build the node's CNI binary loads it with (an upgrade that replaced the file on disk does not change that).
pub fn own_binary() -> PathBuf {
    PathBuf::from("/proc/self/exe")
}

/// The whole environment of a compile or probe process: the two variables it reads. Its flags say everything
/// else; its logging reads no variable. The thread pools it would otherwise size by the node's CPUs are
/// wasmtime's parallel compiler (rayon) and wasmtime-wasi's runtime for the hook's stdio (tokio): every thread's
/// stack (2 MiB) counts in `RLIMIT_DATA`, so on a node of 64 CPUs they alone would take 256 MiB of a limit
/// meant for the compiler and the module.
pub const CHILD_ENV: [(&str, &str); 2] =
    [("RAYON_NUM_THREADS", "2"), ("TOKIO_WORKER_THREADS", "1")];

/// What one compile or probe process may use (`plexus daemon --hook-process-memory-mib`,
/// `--hook-compile-memory-mib` and `--hook-process-cpu-secs`).
///
/// Memory is bounded by `RLIMIT_DATA`, not `RLIMIT_AS`: wasmtime reserves address space far beyond what it uses
/// (a linear memory is a reservation of several GiB, mapped inaccessible until the module grows into it), so
/// an address-space limit anywhere near the container's memory refuses every instantiation (measured with the
/// example modules: a compile passes under an `RLIMIT_AS` of 256 MiB, but a probe fails to map its instance's
/// memory, "Cannot allocate memory", under 4 GiB and passes only from 8 GiB). `RLIMIT_DATA` counts the
/// private writable mappings (heap, thread stacks, and the part of a linear memory made accessible), which is
/// what the compiler and the instance really take (measured: each example module compiles within 20 MiB, and
/// a probe whose module grows to its 64 MiB `memoryLimitMiB` ends cleanly, with the hook's own limit error,
/// from 68 MiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessLimits {
    /// `RLIMIT_DATA` of a probe, in MiB.
    pub memory_mib: u64,
    /// `RLIMIT_DATA` of a compile, in MiB: the compiler's working memory grows with the module's code, not with
    /// what the hook may use, so it has a bound of its own.
    pub compile_memory_mib: u64,
    /// `RLIMIT_CPU`, in seconds of CPU time (every thread's).
    pub cpu_secs: u64,
}

impl ProcessLimits {
    /// The default memory bound of a probe: enough for the default `memoryLimitMiB` (64) and the runtime.
    pub const DEFAULT_MEMORY_MIB: u64 = 96;
    /// The default memory bound of a compile: enough for a hook in Python (componentize-py 0.25 bundles CPython:
    /// 18.5 MB of component, 6 MB of it code; its compile under `RAYON_NUM_THREADS=2` fails under an `RLIMIT_DATA`
    /// of 384 MiB and passes from 400, 357 MB peak RSS), with a margin; the Rust example modules compile within
    /// 20 MiB. Within the DaemonSet's 576 MiB limit of the daemon's container with the daemon beside it.
    pub const DEFAULT_COMPILE_MEMORY_MIB: u64 = 448;
    /// The default CPU bound: the example modules compile in under a second; a compile that needs a minute of
    /// CPU is not one a node should finish.
    pub const DEFAULT_CPU_SECS: u64 = 60;
    /// What a probe process takes besides its hook's own memory (`memoryLimitMiB`): the runtime, the loaded
    /// artifact, the allocator's and the threads' share (about 4 MiB measured with the example modules; more
    /// for larger ones). A probe that runs out of it does not always end cleanly (a thread that cannot start
    /// aborts while printing a backtrace, and the abort can hang): the wall-clock bound then ends it.
    pub const RUNTIME_MIB: u64 = 32;

    /// The limits set in the child before it execs: memory and CPU time, and no core file (the kernel ends a
    /// process past its CPU time with SIGXCPU, whose default action dumps core; a dump of a compiler is tens of
    /// MiB written to the node for nothing). The hard CPU limit is a second above the soft one, so SIGXCPU, not
    /// SIGKILL, says what happened.
    pub fn rlimits(&self, job: Job) -> [(Resource, Rlimit); 3] {
        let bytes = self.memory_of(job).saturating_mul(1 << 20);
        let limit = |soft: u64, hard: u64| Rlimit {
            current: Some(soft),
            maximum: Some(hard),
        };
        [
            (Resource::Data, limit(bytes, bytes)),
            (
                Resource::Cpu,
                limit(self.cpu_secs, self.cpu_secs.saturating_add(1)),
            ),
            (Resource::Core, limit(0, 0)),
        ]
    }

    fn memory_of(&self, job: Job) -> u64 {
        match job {
            Job::Compile => self.compile_memory_mib,
            Job::Probe => self.memory_mib,
        }
    }

    /// Whether a hook with this `memoryLimitMiB` fits in a probe process, and so in what the node lets a hook
    /// take: its instance's memory and the runtime's share within the memory bound.
    pub fn admits(&self, memory_limit_mib: Option<u64>) -> Result<(), String> {
        let wanted = memory_limit_mib.unwrap_or(plexus_hooks::DEFAULT_MEMORY_LIMIT_MIB);
        let room = self.memory_mib.saturating_sub(Self::RUNTIME_MIB);
        if wanted <= room {
            return Ok(());
        }
        Err(format!(
            "memoryLimitMiB {wanted} is more than this node lets a hook take: {room} MiB (its hook processes may \
             use {} MiB, plexus daemon --hook-process-memory-mib, {} of them the runtime's own)",
            self.memory_mib,
            Self::RUNTIME_MIB
        ))
    }

    /// What a process that ended this way, with this on its stderr, ran into, when it was one of these limits.
    fn hit(&self, job: Job, status: std::process::ExitStatus, stderr: &str) -> Option<String> {
        use std::os::unix::process::ExitStatusExt;
        if status.signal() == Some(libc::SIGXCPU) {
            return Some(format!(
                "it used up its {} s of CPU time (plexus daemon --hook-process-cpu-secs)",
                self.cpu_secs
            ));
        }
        // std's own line when an allocation fails (the process aborts), or the process's error naming the
        // kernel's ENOMEM. Only lines the process itself starts: a hook's log lines are on its stderr too.
        let out_of_memory = stderr.lines().any(|line| {
            (line.starts_with("memory allocation of") && line.ends_with("bytes failed"))
                || (line.starts_with("plexus hook: ") && line.contains("(os error 12)"))
        });
        out_of_memory.then(|| {
            let flag = match job {
                Job::Compile => "--hook-compile-memory-mib",
                Job::Probe => "--hook-process-memory-mib",
            };
            format!(
                "it ran out of its {} MiB (plexus daemon {flag})",
                self.memory_of(job)
            )
        })
    }
}

impl Default for ProcessLimits {
    fn default() -> Self {
        ProcessLimits {
            memory_mib: Self::DEFAULT_MEMORY_MIB,
            compile_memory_mib: Self::DEFAULT_COMPILE_MEMORY_MIB,
            cpu_secs: Self::DEFAULT_CPU_SECS,
        }
    }
}

/// Which kind of process a limit is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    Compile,
    Probe,
}

/// A module compiled into the cache: its component's sha256 and the artifact the node's CNI binary loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiled {
    pub sha256: String,
    pub artifact: PathBuf,
}

/// Compiles `module` into `cache_dir`'s hook artifacts with `compiler hook compile`, or says why not (the
/// compiler's own message, or what stopped it).
pub async fn compile_apart(
    compiler: &Path,
    module: &Path,
    cache_dir: &Path,
    limits: &ProcessLimits,
    timeout: Duration,
) -> Result<Compiled, String> {
    let args = [
        OsStr::new("hook"),
        OsStr::new("compile"),
        module.as_os_str(),
        OsStr::new("--cache-dir"),
        cache_dir.as_os_str(),
    ];
    let answer = run_apart(compiler, &args, None, limits, Job::Compile, timeout).await?;
    match (answer["sha256"].as_str(), answer["artifact"].as_str()) {
        (Some(sha), Some(artifact)) => Ok(Compiled {
            sha256: sha.to_string(),
            artifact: PathBuf::from(artifact),
        }),
        _ => Err(format!(
            "the compiler's answer names no sha256 and artifact: {}",
            plexus_cni::error::bounded(answer.to_string())
        )),
    }
}

/// Probes `entry` (one call of its kind on a synthetic pod, from the compiled artifact) with `compiler hook
/// probe`: the verdict, or why there is none.
pub async fn probe_apart(
    compiler: &Path,
    entry: &HookSpec,
    cache_dir: &Path,
    limits: &ProcessLimits,
    timeout: Duration,
) -> Result<Result<(), Failure>, String> {
    let args = [
        OsStr::new("hook"),
        OsStr::new("probe"),
        OsStr::new("--cache-dir"),
        cache_dir.as_os_str(),
    ];
    let input = serde_json::to_vec(entry).map_err(|e| e.to_string())?;
    let answer = run_apart(compiler, &args, Some(input), limits, Job::Probe, timeout).await?;
    if answer["passed"] == true {
        return Ok(Ok(()));
    }
    let reason = answer["reason"].as_str().and_then(Reason::parse);
    match (reason, answer["message"].as_str()) {
        (Some(reason), Some(message)) => Ok(Err(Failure::new(reason, message))),
        _ => Err(format!(
            "the probe's answer is not a verdict: {}",
            plexus_cni::error::bounded(answer.to_string())
        )),
    }
}

/// `program args` as a compile or probe process starts: [`CHILD_ENV`] as its whole environment, stdio on pipes
/// (or stdin on nothing), killed when dropped, and `limits` set between fork and exec.
fn command(
    program: &Path,
    args: &[&OsStr],
    stdin: bool,
    limits: &ProcessLimits,
    job: Job,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(CHILD_ENV)
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let rlimits = limits.rlimits(job);
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe calls are sound; it
    // makes three setrlimit system calls (rustix calls the kernel directly: no allocation, no lock) on values
    // prepared before the fork.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            for (resource, limit) in rlimits {
                rustix::process::setrlimit(resource, limit)?;
            }
            Ok(())
        });
    }
    command
}

/// Runs `program args`, `input` on its stdin, within `limits` and `timeout`: its JSON answer, or why there is
/// none.
async fn run_apart(
    program: &Path,
    args: &[&OsStr],
    input: Option<Vec<u8>>,
    limits: &ProcessLimits,
    job: Job,
    timeout: Duration,
) -> Result<serde_json::Value, String> {
    let mut child = command(program, args, input.is_some(), limits, job)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let finished = tokio::time::timeout(timeout, async {
        let write = async {
            if let (Some(mut stdin), Some(input)) = (stdin, input) {
                let _ = stdin.write_all(&input).await;
            }
        };
        tokio::join!(
            write,
            read_capped(stdout, &mut out),
            read_capped(stderr, &mut err)
        );
        child.wait().await
    })
    .await;
    let status = match finished {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => return Err(format!("waiting for it: {e}")),
        // Dropping the child kills it.
        Err(_) => return Err(format!("it did not finish within {} s", timeout.as_secs())),
    };
    if !status.success() {
        let stderr = String::from_utf8_lossy(&err);
        let message = stderr.trim().trim_start_matches("plexus hook: ");
        let message = match (message.is_empty(), limits.hit(job, status, &stderr)) {
            (true, None) => format!("it ended with {status}"),
            (true, Some(hit)) => hit,
            (false, None) => message.to_string(),
            (false, Some(hit)) => format!("{hit}: {message}"),
        };
        return Err(plexus_cni::error::bounded(message));
    }
    serde_json::from_slice(&out).map_err(|e| format!("its answer is not JSON: {e}"))
}

/// Reads at most [`OUTPUT_CAP`] bytes of `from` into `buf`, and drains the rest so the writer is not blocked.
async fn read_capped(from: Option<impl tokio::io::AsyncRead + Unpin>, buf: &mut Vec<u8>) {
    let Some(from) = from else { return };
    let mut limited = from.take(OUTPUT_CAP);
    let _ = limited.read_to_end(buf).await;
    let _ = tokio::io::copy(&mut limited.into_inner(), &mut tokio::io::sink()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shell script at `dir/compiler`. Written by a shell of its own: a file this process held open for writing
    /// could be inherited by another test's fork and make exec fail with ETXTBSY.
    fn script(dir: &Path, body: &str) -> PathBuf {
        use std::io::Write;
        let path = dir.join("compiler");
        let mut writer = std::process::Command::new("/bin/sh")
            .args(["-c", r#"cat > "$1" && chmod 755 "$1""#, "sh"])
            .arg(&path)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = writer.stdin.take().unwrap();
        write!(stdin, "#!/bin/sh\n{body}\n").unwrap();
        drop(stdin);
        assert!(writer.wait().unwrap().success());
        path
    }

    #[tokio::test]
    async fn the_sha256_comes_from_the_compilers_answer_and_its_arguments_are_the_clis() {
        let dir = tempfile::tempdir().unwrap();
        let seen = dir.path().join("args");
        let compiler = script(
            dir.path(),
            &format!(
                "echo \"$@\" > {}; echo '{{\"sha256\": \"abc\", \"artifact\": \"x\"}}'",
                seen.display()
            ),
        );
        let got = compile_apart(
            &compiler,
            Path::new("/m.wasm"),
            Path::new("/c"),
            &ProcessLimits::default(),
            COMPILE_TIMEOUT,
        )
        .await;
        assert_eq!(
            got,
            Ok(Compiled {
                sha256: "abc".into(),
                artifact: "x".into()
            })
        );
        assert_eq!(
            std::fs::read_to_string(&seen).unwrap().trim(),
            "hook compile /m.wasm --cache-dir /c"
        );
    }

    #[tokio::test]
    async fn a_failed_compile_says_why_and_a_hung_one_is_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let failing = script(
            dir.path(),
            "echo 'plexus hook: m.wasm: not a component' >&2; exit 1",
        );
        let err = compile_apart(
            &failing,
            Path::new("/m"),
            Path::new("/c"),
            &ProcessLimits::default(),
            COMPILE_TIMEOUT,
        )
        .await
        .unwrap_err();
        assert_eq!(err, "m.wasm: not a component");
        let hung = dir.path().join("hung");
        std::fs::create_dir(&hung).unwrap();
        let hung = script(&hung, "sleep 30");
        let started = std::time::Instant::now();
        let err = compile_apart(
            &hung,
            Path::new("/m"),
            Path::new("/c"),
            &ProcessLimits::default(),
            Duration::from_millis(300),
        )
        .await
        .unwrap_err();
        assert!(err.contains("did not finish"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
        let noisy = dir.path().join("noisy");
        std::fs::create_dir(&noisy).unwrap();
        let noisy = script(&noisy, "head -c 1000000 /dev/zero | tr '\\0' 'x'; exit 0");
        let err = compile_apart(
            &noisy,
            Path::new("/m"),
            Path::new("/c"),
            &ProcessLimits::default(),
            COMPILE_TIMEOUT,
        )
        .await
        .unwrap_err();
        assert!(err.contains("not JSON"), "{err}");
    }

    #[test]
    fn a_hook_process_gets_memory_and_cpu_limits_no_core_and_hooks_that_fit() {
        let limits = ProcessLimits {
            memory_mib: 96,
            compile_memory_mib: 448,
            cpu_secs: 60,
        };
        let got = |job| -> Vec<(Resource, Option<u64>, Option<u64>)> {
            limits
                .rlimits(job)
                .into_iter()
                .map(|(r, l)| (r, l.current, l.maximum))
                .collect()
        };
        assert_eq!(
            got(Job::Probe),
            [
                (Resource::Data, Some(96 << 20), Some(96 << 20)),
                (Resource::Cpu, Some(60), Some(61)),
                (Resource::Core, Some(0), Some(0)),
            ]
        );
        assert_eq!(
            got(Job::Compile)[0],
            (Resource::Data, Some(448 << 20), Some(448 << 20))
        );
        assert_eq!(got(Job::Compile)[1..], got(Job::Probe)[1..]);
        assert_eq!(limits, ProcessLimits::default());
        // The default memoryLimitMiB (64) and the runtime's 32 fit the default exactly.
        assert_eq!(limits.admits(None), Ok(()));
        assert_eq!(limits.admits(Some(64)), Ok(()));
        let err = limits.admits(Some(65)).unwrap_err();
        assert!(
            err.contains("memoryLimitMiB 65") && err.contains("64 MiB"),
            "{err}"
        );
        assert!(err.contains("--hook-process-memory-mib"), "{err}");
        let small = ProcessLimits {
            memory_mib: 48,
            compile_memory_mib: 48,
            cpu_secs: 1,
        };
        assert!(small.admits(None).is_err());
        assert_eq!(small.admits(Some(16)), Ok(()));

        use std::os::unix::process::ExitStatusExt;
        let (failed, xcpu) = (
            std::process::ExitStatus::from_raw(1 << 8),
            std::process::ExitStatus::from_raw(libc::SIGXCPU),
        );
        let memory = "it ran out of its 96 MiB (plexus daemon --hook-process-memory-mib)";
        assert!(limits
            .hit(Job::Probe, xcpu, "")
            .unwrap()
            .contains("60 s of CPU time"));
        let enomem = "plexus hook: m.wasm: mapping: Cannot allocate memory (os error 12)";
        assert_eq!(
            limits.hit(Job::Probe, failed, enomem).as_deref(),
            Some(memory)
        );
        assert_eq!(
            limits.hit(Job::Compile, failed, enomem).as_deref(),
            Some("it ran out of its 448 MiB (plexus daemon --hook-compile-memory-mib)")
        );
        // A hook's log line saying the same is the hook's, not the process's.
        let logged =
            "2026-01-01T00:00:00Z  INFO memory allocation of 1048576 bytes failed hook=\"b\"\n\
                      plexus hook: m.wasm: not a component";
        assert_eq!(limits.hit(Job::Probe, failed, logged), None);
    }

    #[tokio::test]
    async fn a_hook_process_sees_none_of_the_daemons_environment_and_runs_under_its_limits() {
        let dir = tempfile::tempdir().unwrap();
        let (environ, limits) = (dir.path().join("environ"), dir.path().join("limits"));
        // What exec handed the process, and the limits it runs under, as the kernel reports them.
        let compiler = script(
            dir.path(),
            &format!(
                "cat /proc/$$/environ > {}; cat /proc/$$/limits > {}; echo '{{\"sha256\": \"a\", \"artifact\": \"b\"}}'",
                environ.display(),
                limits.display()
            ),
        );
        assert!(
            std::env::vars_os().next().is_some(),
            "the test runs with an environment"
        );
        let set = ProcessLimits {
            memory_mib: 100,
            compile_memory_mib: 200,
            cpu_secs: 30,
        };
        let got = compile_apart(
            &compiler,
            Path::new("/m"),
            Path::new("/c"),
            &set,
            COMPILE_TIMEOUT,
        )
        .await;
        assert!(got.is_ok(), "{got:?}");
        let environ = std::fs::read_to_string(&environ).unwrap();
        let mut seen: Vec<&str> = environ.split_terminator('\0').collect();
        seen.sort_unstable();
        assert_eq!(seen, ["RAYON_NUM_THREADS=2", "TOKIO_WORKER_THREADS=1"]);
        let limits = std::fs::read_to_string(&limits).unwrap();
        let line = |name: &str| -> Vec<String> {
            let l = limits.lines().find(|l| l.starts_with(name)).unwrap();
            l[name.len()..]
                .split_whitespace()
                .map(str::to_string)
                .collect()
        };
        let bytes = (200u64 << 20).to_string();
        assert_eq!(
            line("Max data size"),
            [bytes.as_str(), &bytes, "bytes"],
            "{limits}"
        );
        assert_eq!(line("Max cpu time"), ["30", "31", "seconds"], "{limits}");
        assert_eq!(line("Max core file size"), ["0", "0", "bytes"], "{limits}");
    }

    #[tokio::test]
    async fn a_process_past_its_limits_says_which_one() {
        let dir = tempfile::tempdir().unwrap();
        let spinning = script(dir.path(), "while :; do :; done");
        let tight = ProcessLimits {
            memory_mib: 64,
            compile_memory_mib: 96,
            cpu_secs: 1,
        };
        let run = |program: PathBuf| async move {
            compile_apart(
                &program,
                Path::new("/m"),
                Path::new("/c"),
                &tight,
                COMPILE_TIMEOUT,
            )
            .await
            .unwrap_err()
        };
        let started = std::time::Instant::now();
        let err = run(spinning).await;
        assert_eq!(
            err,
            "it used up its 1 s of CPU time (plexus daemon --hook-process-cpu-secs)"
        );
        assert!(started.elapsed() < Duration::from_secs(30));
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        let starved = script(
            &other,
            "echo 'memory allocation of 1048576 bytes failed' >&2; kill -ABRT $$",
        );
        let err = run(starved).await;
        assert_eq!(
            err,
            "it ran out of its 96 MiB (plexus daemon --hook-compile-memory-mib): memory allocation of 1048576 bytes failed"
        );
    }

    #[tokio::test]
    async fn a_probes_verdict_is_read_back_and_its_entry_goes_on_stdin() {
        let dir = tempfile::tempdir().unwrap();
        let seen = dir.path().join("stdin");
        let entry: HookSpec = serde_json::from_value(
            serde_json::json!({"name": "h", "kind": "policy", "module": "/m.wasm"}),
        )
        .unwrap();
        let failing = script(
            dir.path(),
            &format!(
                "cat > {}; echo '{{\"passed\": false, \"reason\": \"KindMismatch\", \"message\": \"serves status\"}}'",
                seen.display()
            ),
        );
        let verdict = probe_apart(
            &failing,
            &entry,
            Path::new("/c"),
            &ProcessLimits::default(),
            COMPILE_TIMEOUT,
        )
        .await;
        assert_eq!(
            verdict,
            Ok(Err(Failure::new(Reason::KindMismatch, "serves status")))
        );
        let sent: HookSpec = serde_json::from_slice(&std::fs::read(&seen).unwrap()).unwrap();
        assert_eq!(sent, entry);
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        let passing = script(&other, "cat > /dev/null; echo '{\"passed\": true}'");
        let verdict = probe_apart(
            &passing,
            &entry,
            Path::new("/c"),
            &ProcessLimits::default(),
            COMPILE_TIMEOUT,
        )
        .await;
        assert_eq!(verdict, Ok(Ok(())));
    }
}
