//! The CNI entry point as a function: environment and stdin in, stdout text and exit status out.

use std::collections::BTreeMap;

use plexus_cluster::{Cluster, FileCluster, KubeCluster, KubeSettings};
use plexus_core::cni::{CniError, CniVersion};
pub use plexus_hooks::Compile;
use serde_json::{json, Value};

use crate::conf::{stdin_json, ClusterSource, PlexusConf};
use crate::daemon::client::{DaemonCluster, DaemonConf, DelCluster, TAKE_BACK_BOUND};
use crate::daemon::proto::Report;
use crate::effects::Effects;
use crate::error::{bounded, PlexusError};
use crate::exec::{ProcessExec, RecordingExec};
use crate::hooks::{HookRunner, NoHooks};
use crate::invocation::{command_of, Command, Invocation};
use crate::orchestrate;
use crate::podnet::IpRoute;
use crate::podresources::{KubeletPodResources, POD_RESOURCES_TIMEOUT};

/// What the process prints on stdout and how it exits.
#[derive(Debug)]
pub struct Outcome {
    pub stdout: Option<String>,
    pub success: bool,
    /// What to hand the node daemon once the runtime has its answer, and where (daemon mode only).
    pub report: Option<(std::path::PathBuf, Report)>,
}

/// The CNI plugin process: the environment and stdin (at most [`crate::conf::STDIN_CAP`] bytes plus one, so an
/// oversized conf is refused rather than cut) in, the result on stdout; the exit status. `compile`: whether an ADD
/// may compile a hook that has no compiled artifact (the full `plexus` binary), or never (`plexus-cni`).
pub fn cni_process(compile: Compile) -> u8 {
    use std::io::{Read, Write};
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let mut stdin = Vec::new();
    // VERSION may come with no stdin at all; a read error is treated as empty input.
    let _ = std::io::stdin()
        .take(crate::conf::STDIN_CAP as u64 + 1)
        .read_to_end(&mut stdin);
    if env.get("CNI_COMMAND").map(String::as_str) == Some("DEL") {
        if let Some(code) = del_detached() {
            return code;
        }
    }
    let outcome = run(&env, &stdin, compile);
    if let Some(text) = outcome.stdout {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }
    // After the answer: the report never delays what the runtime reads (and is never waited for).
    if let Some((socket, report)) = &outcome.report {
        crate::daemon::client::report(socket, report);
    }
    u8::from(!outcome.success)
}

/// Runs this DEL in a process of its own (a fork of this one, in a process group of its own) and answers what it
/// answered; `None` in that process, and when it cannot be started (the DEL then runs here). A runtime may kill the
/// plugin it runs: CRI-O kills it with SIGKILL when the kubelet's request is cancelled (a kubelet restart does
/// that), then counts the sandbox's network as stopped and never sends the DEL again, leaving its addresses and
/// interfaces. The teardown process outlives such a kill and finishes (a DEL is always wanted, and repeating one is
/// harmless; another DEL of the container waits for it on the container's lock). Its answer then has no reader.
///
/// A fork, not a new process of this executable: nothing is loaded again (the exec cost about 1.4 ms per DEL), and
/// this process has read its environment and stdin and started no thread, so the copy goes on from here as a
/// process of its own would. With more than one thread (never in the plugin's `main`) the DEL runs here.
fn del_detached() -> Option<u8> {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    if !single_threaded() {
        return None;
    }
    let (mut answer_read, answer_write) = std::io::pipe().ok()?;
    // SAFETY: this process has one thread (checked above), so the child is a whole copy of it, free to go on.
    #[allow(unsafe_code)]
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return None;
    }
    if pid == 0 {
        // The child: a process group of its own (a kill of the plugin's group does not reach it), and its answer
        // to the parent: the runtime's end of stdout must not wait for the teardown.
        // SAFETY: plain system calls on this process and fds it owns.
        #[allow(unsafe_code)]
        unsafe {
            libc::setpgid(0, 0);
            libc::dup2(answer_write.as_raw_fd(), libc::STDOUT_FILENO);
        }
        drop((answer_read, answer_write));
        return None;
    }
    drop(answer_write);
    let mut answer = Vec::new();
    let _ = (&mut answer_read)
        .take(crate::conf::STDIN_CAP as u64)
        .read_to_end(&mut answer);
    drop(answer_read);
    let mut status = 0;
    loop {
        // SAFETY: waits for this process's own child.
        #[allow(unsafe_code)]
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        if waited == pid {
            break;
        }
        if waited < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return Some(1);
        }
    }
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(&answer);
    let _ = out.flush();
    Some(if libc::WIFEXITED(status) {
        u8::try_from(libc::WEXITSTATUS(status)).unwrap_or(1)
    } else {
        128u8.saturating_add(u8::try_from(libc::WTERMSIG(status)).unwrap_or(0))
    })
}

/// Whether this process has one thread (`Threads:` in its status).
fn single_threaded() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.strip_prefix("Threads:").is_some_and(|n| n.trim() == "1"))
    })
}

/// Runs one CNI invocation. Logging is set up here from the conf (stderr or `logFile`). Meant for a process that
/// exits afterwards (see the end of `run_inner`); a long-lived host drives [`orchestrate`] itself.
pub fn run(env: &BTreeMap<String, String>, stdin: &[u8], compile: Compile) -> Outcome {
    let started = std::time::Instant::now();
    let stdin = stdin_json(stdin);
    let reply_version = reply_version(
        stdin
            .as_ref()
            .ok()
            .and_then(|v| v.get("cniVersion")?.as_str()),
    );
    let mut trace = Trace {
        exec: RecordingExec::new(&ProcessExec),
        report_to: None,
        hooks: Vec::new(),
        compile,
    };
    let ran = run_inner(env, stdin, reply_version, started, &mut trace);
    let (outcome, result) = match ran {
        Ok(stdout) => (
            Outcome {
                stdout,
                success: true,
                report: None,
            },
            "success".to_string(),
        ),
        Err(e) => {
            let msg = bounded(e.to_string());
            tracing::error!(code = e.cni_code(), "{msg}");
            let err = CniError::new(reply_version, e.cni_code(), msg, bounded(e.details()));
            (
                Outcome {
                    stdout: Some(err.to_json().to_string()),
                    success: false,
                    report: None,
                },
                e.cni_code().to_string(),
            )
        }
    };
    let delegates = trace.exec.calls();
    let report = trace.report_to.map(|(socket, command)| {
        let report = Report {
            command,
            result,
            seconds: started.elapsed().as_secs_f64(),
            delegates,
            hooks: trace.hooks,
        };
        (socket, report)
    });
    Outcome { report, ..outcome }
}

/// What one invocation did, for its report to the node daemon: each delegate run (through the recording
/// exec), each hook call, and where to send it (daemon mode only).
struct Trace<'a> {
    exec: RecordingExec<'a>,
    /// The daemon's socket and the command, once the conf says to report.
    report_to: Option<(std::path::PathBuf, String)>,
    hooks: Vec<crate::daemon::proto::HookCall>,
    /// Whether hooks may be compiled here.
    compile: Compile,
}

fn run_inner(
    env: &BTreeMap<String, String>,
    stdin: Result<Value, PlexusError>,
    reply_version: CniVersion,
    started: std::time::Instant,
    trace: &mut Trace<'_>,
) -> Result<Option<String>, PlexusError> {
    // The process that asked (the runtime): an ADD it is no longer there to take is undone.
    let caller = std::os::unix::process::parent_id();
    let command = command_of(env)?;
    if command == Command::Version {
        let supported: Vec<&str> = CniVersion::ALL.iter().map(|v| v.as_str()).collect();
        return Ok(Some(
            json!({"cniVersion": reply_version.as_str(), "supportedVersions": supported})
                .to_string(),
        ));
    }
    let inv = Invocation::from_env(env, stdin)?;
    init_logging(&inv.conf);
    // In daemon mode every verb is reported to the daemon for its metrics, failures included.
    if let (ClusterSource::Kube(_), Some(d)) = (&inv.conf.cluster, &inv.conf.daemon) {
        if d.report {
            trace.report_to = Some((d.socket.clone(), command.as_str().to_string()));
        }
    }
    // Reading the environment and the conf happens before logging is set up: its time is logged after.
    tracing::debug!(
        command = command.as_str(),
        container = %inv.container_id,
        conf_us = started.elapsed().as_micros() as u64,
        "invoked"
    );
    let setup = crate::logging::phase("setup");

    let mut sources = Sources::default();
    let mut wrappers = Wrappers::default();
    let cluster = cluster_source(&inv, command, &mut sources, &mut wrappers)?;
    // Hooks only act on ADD; DEL, CHECK, STATUS and GC never pay for loading them.
    let hooks: Box<dyn HookRunner> = if command == Command::Add {
        crate::hooks::for_conf(&inv.conf, false, trace.compile)?
    } else {
        Box::new(NoHooks)
    };
    let devices = KubeletPodResources {
        socket: inv.conf.pod_resources_socket.clone(),
        timeout: POD_RESOURCES_TIMEOUT,
    };
    drop(setup);
    let fx = Effects {
        exec: &trace.exec,
        cluster,
        podnet: &IpRoute,
        hooks: hooks.as_ref(),
        devices: &devices,
    };
    if command == Command::Status {
        if let (ClusterSource::Kube(_), Some(d)) = (&inv.conf.cluster, &inv.conf.daemon) {
            crate::daemon::client::readiness(&d.socket, d.timeout)
                .map_err(|e| PlexusError::NotAvailable(e.0))?;
        }
    }
    let out = match command {
        Command::Add => orchestrate::add(&inv, &fx)
            .and_then(|r| answered_to(caller, &inv, &fx).map(|()| Some(r.to_string()))),
        Command::Del => orchestrate::del(&inv, &fx).map(|()| None),
        Command::Check => orchestrate::check(&inv, &fx).map(|()| None),
        Command::Status => orchestrate::status(&inv, &fx).map(|()| None),
        Command::Gc => orchestrate::gc(&inv, &fx).map(|()| None),
        Command::Version => unreachable!("handled above"),
    };
    trace.hooks = hooks.calls();
    // The process exits right after: the hook runtime's mappings (compiled code, the instance pool) and its
    // epoch thread are left to the exit, which releases them at once, instead of being unmapped and joined one
    // by one (measurable on every ADD with hooks).
    std::mem::forget(hooks);
    out
}

/// Whether the ADD's answer still has a taker: the process that asked (`caller`, the runtime) is still its
/// parent. When it exited while the ADD ran (killed, crashed), no one will read the answer, and the runtime that
/// starts again may never know the sandbox (CRI-O forgets one whose RunPodSandbox did not finish, and its start-up
/// GC may run before this ADD wrote its plan): no DEL would ever release what the ADD attached. So it is torn
/// down here, as a DEL would, and the ADD fails. A DEL that does come later finds nothing to do.
fn answered_to(caller: u32, inv: &Invocation, fx: &Effects<'_>) -> Result<(), PlexusError> {
    let parent = std::os::unix::process::parent_id();
    if parent == caller {
        return Ok(());
    }
    tracing::warn!(
        container = %inv.container_id,
        caller,
        "the runtime that asked for this ADD exited before its answer; tearing down what it attached"
    );
    let undone = orchestrate::del(inv, fx);
    let outcome = match &undone {
        Ok(()) => "what it attached is torn down".to_string(),
        Err(e) => format!("tearing down what it attached failed: {e}"),
    };
    // 11, try again later: the sandbox may be made again.
    Err(PlexusError::NotReady(format!(
        "{}: the runtime that asked for the ADD (pid {caller}) exited before its answer; {outcome}",
        inv.pod_label()
    )))
}

/// The cluster sources of one invocation, built by [`cluster_source`] and borrowed by its effects. Building one
/// is cheap: a client is only made on the first call that needs the API.
#[derive(Default)]
struct Sources {
    files: Option<FileCluster>,
    kube: Option<KubeCluster>,
    /// For what a DEL takes back without the daemon: one request within [`TAKE_BACK_BOUND`].
    take_back: Option<KubeCluster>,
}

/// What wraps a source for its verb.
#[derive(Default)]
struct Wrappers<'s> {
    daemon: Option<DaemonCluster<'s>>,
    del: Option<DelCluster<'s>>,
}

/// The cluster source the verb's effects use. An ADD asks the node daemon first (kube source); a DEL reads the
/// source itself and hands the daemon only what it takes back, so that a teardown never depends on the daemon;
/// other verbs use the source as it is.
fn cluster_source<'s, 'w>(
    inv: &Invocation,
    command: Command,
    sources: &'s mut Sources,
    wrappers: &'w mut Wrappers<'s>,
) -> Result<Option<&'w dyn Cluster>, PlexusError> {
    let Sources {
        files,
        kube,
        take_back,
    } = sources;
    let source: &'s dyn Cluster = match &inv.conf.cluster {
        ClusterSource::None => return Ok(None),
        ClusterSource::Files { dir } => files.insert(FileCluster::open(dir)?),
        ClusterSource::Kube(settings) => kube.insert(KubeCluster::new(settings.clone())?),
    };
    let daemon = inv.conf.daemon.as_ref();
    Ok(Some(match (command, &inv.conf.cluster, daemon) {
        (Command::Add, ClusterSource::Kube(settings), Some(d)) => {
            let conf = DaemonConf {
                socket: d.socket.clone(),
                timeout: d.timeout,
                events: settings.events,
            };
            wrappers.daemon.insert(DaemonCluster::new(conf, source))
        }
        (Command::Del, cluster, daemon) => {
            let writes: &'s dyn Cluster = match cluster {
                ClusterSource::Kube(settings) => {
                    let bound = TAKE_BACK_BOUND.as_millis() as u64;
                    take_back.insert(KubeCluster::new(KubeSettings {
                        retries: 0,
                        deadline_ms: bound,
                        request_timeout_ms: bound,
                        ..settings.clone()
                    })?)
                }
                _ => source,
            };
            let daemon = daemon.map(|d| (d.socket.clone(), d.timeout));
            wrappers.del.insert(DelCluster::new(source, writes, daemon))
        }
        _ => source,
    }))
}

fn init_logging(conf: &PlexusConf) {
    crate::logging::init(&conf.log_level, conf.log_file.as_deref());
}

/// The version the runtime asked for, for replies (falls back to the newest).
fn reply_version(requested: Option<&str>) -> CniVersion {
    requested
        .and_then(|v| v.parse().ok())
        .unwrap_or(CniVersion::V1_1_0)
}
