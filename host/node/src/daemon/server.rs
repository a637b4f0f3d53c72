//! The daemon process's life: take its lock, open the status queue, start the watches and tasks, accept on the
//! socket until told to stop, drain. And the socket's protocol: each connection's requests answered from the
//! shared state ([`NodeState`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use plexus_cluster::{run_watches, ClusterError, KubeApi, NodeCache, WatchSettings};
use plexus_cni::daemon::proto::{self, Answer, DaemonHealth, Request, MAX_REQUEST_BYTES};
use plexus_core::spec::dra::PodClaims;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinSet;

use super::cli::{DaemonError, DaemonSettings};
use super::metrics::{self, HookStates, Metrics, ResultLabel};
use super::state::{self, Load, NodeState, StateParts};
use super::status_queue::{Key, StatusQueue};
use super::{agent, dynamic, files};
use crate::install;

/// How long the daemon waits for a client's next request (a CNI process keeps its connection for the whole
/// ADD, delegates included; one that waits longer reconnects), and for an answer to be taken.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long accepted status writes may hold a stopping daemon (a dead API server does not hold it longer).
pub(super) const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Maps an I/O error on `path` (a file, or what was being set up) to the daemon's error.
fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DaemonError {
    let path = path.display().to_string();
    move |source| DaemonError::Io { path, source }
}

/// Makes the allocator give large buffers back when they are freed. glibc's malloc raises its mmap threshold to
/// the size of each large block freed (up to 32 MiB), so that the next such block comes from the heap, whose
/// freed space it keeps: a daemon that pulls a 12 MiB hook module (a hook in TypeScript) kept 15 to 25 MiB of
/// such buffers for good (docs/benchmarks.md, what hooks cost the node daemon in memory). Setting the threshold
/// fixes it. Other allocators (musl's) give large blocks back already.
fn give_large_buffers_back() {
    #[cfg(target_env = "gnu")]
    {
        /// Allocations from this size up get pages of their own, given back to the system when freed.
        const MMAP_THRESHOLD: i32 = 1 << 20;
        #[allow(unsafe_code)]
        // SAFETY: mallopt only changes the allocator's parameters; called before the daemon's threads start.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        }
    }
}

/// Runs until SIGTERM or SIGINT, or until the installer running in this process fails.
pub fn run(settings: DaemonSettings) -> Result<(), DaemonError> {
    give_large_buffers_back();
    // A first install that fails stops the daemon (the pod restarts and says why; the watch loop itself only
    // logs), through the same way out as a signal, so that accepted status writes are flushed first.
    let (install_failed, install_result) = tokio::sync::oneshot::channel();
    if let Some(opts) = settings.install.clone() {
        let env = install::ApiServerEnv::from_process();
        std::thread::Builder::new()
            .name("install".into())
            .spawn(move || {
                if let Err(e) = install::run(&opts, &env) {
                    let _ = install_failed.send(e);
                }
            })
            .map_err(io(Path::new("install thread")))?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(io(Path::new("tokio runtime")))?;
    runtime.block_on(serve(settings, install_result))
}

async fn serve(
    settings: DaemonSettings,
    install_result: tokio::sync::oneshot::Receiver<install::InstallError>,
) -> Result<(), DaemonError> {
    let lock = take_lock(&settings.socket)?;
    let (writes, kept, queue_dir) = open_queue(&settings)?;
    let metrics = Arc::new(Metrics::new());
    let api = connect(&settings, &metrics).await?;
    let hook_states = HookStates::default();
    let state = Arc::new(NodeState::new(
        NodeCache::with_nad_budget(settings.nad_budget_bytes),
        Arc::new(state::DaemonApi::new(api.clone(), settings.node.clone())),
        StateParts {
            node: settings.node.clone(),
            writes,
            metrics,
            hook_states,
            load: Load::new(settings.max_in_flight, settings.queue_wait),
            pod_wait: settings.pod_wait,
        },
    ));
    let mut tasks = start_tasks(&settings, &api, &state, kept);
    let listener = bind(&settings.socket)?;
    tracing::info!(socket = %settings.socket.display(), node = %settings.node, "serving");
    let stopped = accept(&listener, &state, install_result).await;
    tracing::info!("stopping");
    // No ADD waits on a daemon that is going: from now on a CNI plugin finds no socket and plans by itself.
    drop(listener);
    let _ = std::fs::remove_file(&settings.socket);
    tasks.abort_all();
    drain(&state, &queue_dir).await;
    drop(lock);
    stopped
}

/// One daemon per socket: a lock beside it, held for the process's life and released by the kernel at exit;
/// then the socket a daemon that died left (nobody listens on it any more: we hold the lock) is removed.
fn take_lock(socket: &Path) -> Result<std::os::fd::OwnedFd, DaemonError> {
    let dir = socket.parent().ok_or_else(|| DaemonError::Io {
        path: socket.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "no parent directory"),
    })?;
    files::private_dir(dir, 0o755).map_err(io(dir))?;
    // Root's alone (0600, never a symlink): a lock file anyone can open is one anyone can hold, and the daemon
    // would then never start.
    let lock_path = socket.with_extension("lock");
    let (lock, opened) = files::open_private(&lock_path, 0o600).map_err(io(&lock_path))?;
    if opened == files::Opened::Replaced {
        tracing::warn!(path = %lock_path.display(), "replaced a lock file of another owner or mode");
    }
    match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            return Err(DaemonError::AlreadyRunning(lock_path.display().to_string()));
        }
        Err(e) => return Err(io(&lock_path)(e.into())),
    }
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(socket)(e)),
    }
    Ok(lock)
}

/// The durable status queue, with the writes an earlier run (killed, restarted) accepted and did not send.
fn open_queue(settings: &DaemonSettings) -> Result<(StatusQueue, Vec<Key>, PathBuf), DaemonError> {
    let queue_dir = settings.status_queue_dir.clone().unwrap_or_else(|| {
        settings
            .socket
            .parent()
            .unwrap_or(Path::new("/"))
            .join("status-queue")
    });
    let (queue, kept) = StatusQueue::open(&queue_dir).map_err(io(&queue_dir))?;
    if !kept.is_empty() {
        tracing::info!(writes = kept.len(), dir = %queue_dir.display(), "sending status writes kept by an earlier run");
    }
    Ok((queue, kept, queue_dir))
}

/// The daemon's API client, every request counted in the metrics and paced by `--kube-api-qps`/`--kube-api-burst`.
async fn connect(
    settings: &DaemonSettings,
    metrics: &Arc<Metrics>,
) -> Result<KubeApi, DaemonError> {
    let counted = metrics.clone();
    let observer = Arc::new(move |verb: &str, resource: &str, code: Option<u16>| {
        counted.api_request(verb, resource, code)
    });
    Ok(KubeApi::connect_observed(
        settings.kube.clone(),
        Some(observer),
        Some(settings.kube_rate),
    )
    .await?)
}

/// The watches, the node agent, the metrics endpoint, dynamic networks, and the writers of kept status writes.
fn start_tasks(
    settings: &DaemonSettings,
    api: &KubeApi,
    state: &Arc<NodeState>,
    kept: Vec<Key>,
) -> JoinSet<()> {
    let mut tasks = JoinSet::new();
    tasks.spawn(run_watches(
        api.clone(),
        state.cache.clone(),
        WatchSettings {
            node: settings.node.clone(),
            timeout_secs: settings.watch_timeout_secs,
            server: api.server().to_string(),
        },
    ));
    if let Some(h) = settings.hooks.clone() {
        tasks.spawn(agent::run(
            api.clone(),
            agent::AgentSettings {
                node: settings.node.clone(),
                cache_dir: h.cache_dir,
                key_files: h.key_files,
                signatures: h.signatures,
                registry: h.registry,
                watch_timeout_secs: settings.watch_timeout_secs,
                states: state.hook_states.clone(),
                compiler: super::compile::own_binary(),
                limits: h.limits,
            },
        ));
    }
    tasks.spawn(super::authority::run(
        api.clone(),
        settings.node.clone(),
        state.hook_states.clone(),
    ));
    // The metrics endpoint binds and serves in the background (see metrics::serve).
    if let Some(addr) = settings.metrics_bind {
        let seen = state.clone();
        tasks.spawn(async move {
            let metrics = seen.metrics.clone();
            if let Err(e) = metrics::serve(addr, metrics, move || seen.snapshot()).await {
                tracing::warn!(error = %e, "metrics endpoint stopped");
            }
        });
    }
    for key in kept {
        state::start_writer(state, key);
    }
    if let Some(d) = settings.dynamic.clone() {
        tasks.spawn(dynamic::run(state.clone(), d));
    }
    match settings.nri.clone() {
        Some((nri, conf)) => tasks.spawn(super::nri::run(state.clone(), nri, conf)),
        None => tasks.spawn(super::nri::sweep_after_nri_mode(
            state.clone(),
            settings.cache_dir.clone(),
        )),
    };
    tasks
}

/// The socket, root's only: created under a umask that leaves no permission to group or others.
fn bind(socket: &Path) -> Result<UnixListener, DaemonError> {
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
    let bound = UnixListener::bind(socket);
    rustix::process::umask(old);
    bound.map_err(io(socket))
}

/// Serves connections until SIGTERM or SIGINT (`Ok`), or until the installer in this process fails (its error).
async fn accept(
    listener: &UnixListener,
    state: &Arc<NodeState>,
    install_result: tokio::sync::oneshot::Receiver<install::InstallError>,
) -> Result<(), DaemonError> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(io(Path::new("SIGTERM handler")))?;
    let our_uid = rustix::process::geteuid().as_raw();
    // An installer that ends well (no --watch) or is not running never fails.
    let mut install_failed = std::pin::pin!(async move {
        match install_result.await {
            Ok(e) => e,
            Err(_) => std::future::pending().await,
        }
    });
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let state = state.clone();
                    tokio::spawn(async move {
                        if let Err(e) = connection(stream, state, our_uid).await {
                            tracing::debug!(error = %e, "connection ended early");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = term.recv() => return Ok(()),
            _ = tokio::signal::ctrl_c() => return Ok(()),
            e = &mut install_failed => return Err(DaemonError::Install(e)),
        }
    }
}

/// Writes already accepted, and the events of ADDs already answered, are sent before the process goes, for
/// [`DRAIN_TIMEOUT`] at most; writes left stay on disk for the next run, events left are lost (they live in memory
/// only: best effort past the drain).
pub(super) async fn drain(state: &NodeState, queue_dir: &Path) {
    let deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
    while (state.pending_writes() > 0 || state.events_in_flight() > 0)
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if state.events_in_flight() > 0 {
        tracing::warn!(
            left = state.events_in_flight(),
            "stopped with events unposted (the API server did not take them within the drain)"
        );
    }
    if state.pending_writes() > 0 {
        tracing::warn!(
            left = state.pending_writes(),
            dir = %queue_dir.display(),
            "stopped with status writes unsent: kept, sent by the next run"
        );
    }
}

/// Serves one client: requests one after another on the same connection, each answered in turn. A client of
/// another user (not root, not the daemon's own) is refused.
pub async fn connection(
    stream: UnixStream,
    state: Arc<NodeState>,
    our_uid: u32,
) -> std::io::Result<()> {
    let peer = stream.peer_cred()?.uid();
    if peer != 0 && peer != our_uid {
        tracing::warn!(
            uid = peer,
            "refused a connection from an unprivileged process"
        );
        return Ok(());
    }
    let (read_half, mut write_half) = stream.into_split();
    let mut reader = tokio::io::BufReader::new(read_half);
    loop {
        let request = match tokio::time::timeout(IDLE_TIMEOUT, read_request(&mut reader)).await {
            Ok(Ok(Some(r))) => r,
            // The client is done (or idle too long).
            Ok(Ok(None)) | Err(_) => return Ok(()),
            // A CNI process that sent its report and exited closes with unread data: normal, not a fault.
            Ok(Err(proto::ReadError::Io(e))) if closed_by_peer(&e) => return Ok(()),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "bad request");
                return Ok(());
            }
        };
        let answer = answer_in_turn(&state, request).await;
        let bytes = proto::encode(&answer)?;
        tokio::time::timeout(WRITE_TIMEOUT, write_half.write_all(&bytes))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    }
}

/// Whether a read failed because the client went away (reset, or closed mid-write).
fn closed_by_peer(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
    matches!(e.kind(), ConnectionReset | BrokenPipe | ConnectionAborted)
}

/// The answer, once a slot is free: `busy` when none frees within the queue wait. Health never waits for a slot
/// (it is how an operator sees a daemon under load), nor does a report (counted and answered; the CNI process
/// has usually gone already).
async fn answer_in_turn(state: &Arc<NodeState>, request: Request) -> Answer {
    let received = tokio::time::Instant::now();
    if matches!(request, Request::Health | Request::Report { .. }) {
        return answer(state, request, received).await;
    }
    let load = &state.load;
    match tokio::time::timeout(load.queue_wait, load.permits.acquire()).await {
        Ok(Ok(_permit)) => answer(state, request, received).await,
        _ => {
            state.metrics.requests_shed.inc();
            Answer::Busy
        }
    }
}

/// The next request, or `None` when the client closed the connection between requests.
async fn read_request(
    reader: &mut tokio::io::BufReader<tokio::net::unix::OwnedReadHalf>,
) -> Result<Option<Request>, proto::ReadError> {
    let mut line = Vec::new();
    let mut limited = (&mut *reader).take(MAX_REQUEST_BYTES as u64 + 1);
    limited.read_until(b'\n', &mut line).await?;
    proto::decode_line(&line, MAX_REQUEST_BYTES)
}

fn health(state: &NodeState) -> Answer {
    let mut h = DaemonHealth::new(&state.node, state.cache.health());
    h.in_flight = state.load.in_flight();
    h.max_in_flight = state.load.max_in_flight;
    h.shed = state.metrics.requests_shed.get();
    h.api_reads = state.api_reads();
    h.status_writes = state
        .metrics
        .status_writes
        .get_or_create(&ResultLabel {
            result: "success".into(),
        })
        .get();
    h.pending_writes = state.pending_writes();
    h.hooks = state.hook_states.hooks().into_values().collect();
    h.hook_agent_waiting = state.hook_states.waiting();
    h.authority_not_enforced = match state.hook_states.authority() {
        Some(super::authority::Finding::NotEnforced(why)) => Some(why),
        _ => None,
    };
    Answer::Health(h)
}

/// What the pod's claims give its networks, to answer with the pod; `None` when the daemon cannot tell (the CNI
/// process then reads them itself, and meets the same error if it was one).
async fn pod_claims_or_none(state: &NodeState, pod: &plexus_core::spec::Pod) -> Option<PodClaims> {
    match state.pod_claims(pod).await? {
        Ok(claims) => Some(claims),
        Err(e) => {
            tracing::debug!(pod = %pod.name, error = %e, "the pod's claims not answered with it");
            None
        }
    }
}

/// An answer from the caches, or from what they could not answer (`unsynced`, or the API's answer).
fn looked_up<T>(
    found: Option<Result<T, ClusterError>>,
    answer: impl FnOnce(T) -> Answer,
) -> Answer {
    match found {
        Some(Ok(v)) => answer(v),
        Some(Err(error)) => Answer::Failed { error },
        None => Answer::Unsynced,
    }
}

/// When the answer to a request received at `received` is due: a quarter before the CNI process stops waiting
/// (`within_ms` it sent, or the default wait of CNI processes that send none), so that it gets what the daemon has
/// rather than nothing. Past that, an API read of what was not cached is dropped: while the API server is down it
/// would only fail after its retries, and the CNI process, its wait over, would stop asking the daemon at all.
pub(super) fn answer_due(
    received: tokio::time::Instant,
    within_ms: Option<u64>,
) -> tokio::time::Instant {
    let within = Duration::from_millis(within_ms.unwrap_or(plexus_cni::conf::DAEMON_TIMEOUT_MS));
    received + within - within / 4
}

/// The pod for an ADD, with what its claims give where they can be told by `due`: the pod from the cache (or
/// read, [`NodeState::pod_for_add`]), `unsynced` when it is not had by then; its claims read when not cached, and
/// left to the CNI process when that read is not done by then.
async fn pod_by(
    state: &NodeState,
    pod: &plexus_core::spec::PodRef,
    due: tokio::time::Instant,
) -> Answer {
    let found = match tokio::time::timeout_at(due, state.pod_for_add(pod)).await {
        Ok(found) => found,
        Err(_) => {
            tracing::info!(pod = %pod, "the pod is not cached and was not read in time; the CNI process reads it");
            return Answer::Unsynced;
        }
    };
    match found {
        Some(Ok(pod)) => {
            let claims = match tokio::time::timeout_at(due, pod_claims_or_none(state, &pod)).await {
                Ok(claims) => claims,
                Err(_) => {
                    tracing::info!(pod = %pod.namespace, name = %pod.name,
                        "the pod's claims are not cached and were not read in time; the CNI process reads them");
                    None
                }
            };
            Answer::Pod { pod, claims }
        }
        other => looked_up(other, |pod| Answer::Pod { pod, claims: None }),
    }
}

/// The answer to `request`, received at `received` (its pod and NAD answers are due by [`answer_due`]).
async fn answer(
    state: &Arc<NodeState>,
    request: Request,
    received: tokio::time::Instant,
) -> Answer {
    match request {
        Request::Health => health(state),
        Request::Report { report } => {
            state.metrics.record(&report);
            Answer::Done
        }
        Request::Pod { pod, within_ms } => {
            pod_by(state, &pod, answer_due(received, within_ms)).await
        }
        Request::Nad {
            namespace,
            name,
            within_ms,
        } => {
            let due = answer_due(received, within_ms);
            match tokio::time::timeout_at(due, state.nad(&namespace, &name)).await {
                Ok(found) => looked_up(found, |nad| Answer::Nad { nad }),
                Err(_) => {
                    tracing::info!(%namespace, %name, "the NAD is not cached and was not read in time; the CNI process reads it");
                    Answer::Unsynced
                }
            }
        }
        // From CNI processes of the version before claims came with the pod.
        Request::Claims { pod, .. } => match state.cached_pod(&pod) {
            plexus_cluster::Lookup::Found(pod) => match state.pod_claims(&pod).await {
                Some(Ok(claims)) => Answer::Claims { claims },
                Some(Err(error)) => Answer::Failed { error },
                None => Answer::Unsynced,
            },
            _ => Answer::Unsynced,
        },
        Request::ClaimStatus {
            pod,
            claim,
            devices,
        } => {
            if state::enqueue_claim_status(state, pod, claim, devices) {
                Answer::Done
            } else {
                Answer::Busy
            }
        }
        Request::Status {
            pod,
            network_status,
        } => {
            if state::enqueue_status(state, pod, network_status) {
                Answer::Done
            } else {
                Answer::Busy
            }
        }
        Request::Event {
            pod,
            warning,
            reason,
            message,
        } => {
            state::send_event(state, pod, warning, reason, message);
            Answer::Done
        }
    }
}
