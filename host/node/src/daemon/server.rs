//! The daemon process: its command line, the socket server over the watch caches, the status writer; it
//! starts the node agent and the installer.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use plexus_cluster::{
    run_watches, ClusterError, KubeApi, KubeSettings, Lookup, NodeCache, WatchSettings,
};
use plexus_cni::daemon::proto::{Answer, DaemonHealth, Request, MAX_REQUEST_BYTES};
use plexus_cni::daemon::{client, proto, DEFAULT_SOCKET};
use plexus_core::spec::PodRef;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use crate::backoff::Backoff;
use super::metrics::{self, HookStates, Metrics, ResultLabel, Snapshot};
use super::status_queue::{Key, StatusQueue};
use super::{agent, files};
use crate::install::{self, InstallOptions};

/// How long a request waits for a slot when `--max-in-flight` are being served, before it is answered `busy`.
const QUEUE_WAIT: Duration = Duration::from_millis(250);

/// The daemon's settings, from its command line.
#[derive(Debug, Clone)]
pub struct DaemonSettings {
    pub node: String,
    pub socket: PathBuf,
    pub kube: KubeSettings,
    pub max_in_flight: usize,
    pub queue_wait: Duration,
    pub pod_wait: Duration,
    pub watch_timeout_secs: u32,
    pub log: plexus_cni::logging::LogArgs,
    pub install: Option<InstallOptions>,
    /// The node agent (NetworkHook delivery); `None` with --no-hooks.
    pub hooks: Option<HookAgentOptions>,
    /// Only ask a running daemon for its health, print it, and exit (0 when ready).
    pub health: bool,
    /// Where accepted status writes are kept until sent (`None`: `status-queue` beside the socket).
    pub status_queue_dir: Option<PathBuf>,
    /// Where `GET /metrics` is served (`None`: not at all).
    pub metrics_bind: Option<std::net::SocketAddr>,
    /// Networks that follow the annotation (`None`: off).
    pub dynamic: Option<super::dynamic::DynamicSettings>,
}

/// The node agent's settings (see [`agent`]).
#[derive(Debug, Clone)]
pub struct HookAgentOptions {
    pub cache_dir: PathBuf,
    pub key_files: Vec<PathBuf>,
    pub signatures: agent::SignaturePolicy,
    pub registry: crate::distribution::RegistryOptions,
}

/// What went wrong starting or running the daemon.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// A command line clap refused (or `--help`): print it with [`plexus_cni::cli::exit_code`].
    #[error("{0}")]
    Usage(clap::Error),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no node name: give --node-name or set NODE_NAME")]
    NoNodeName,
    #[error("another plexus daemon holds {0}")]
    AlreadyRunning(String),
    #[error("install: {0}")]
    Install(#[from] install::InstallError),
}

/// `plexus daemon`'s flags.
#[derive(Debug, Clone, clap::Args)]
#[command(
    about = "The node's long-running process: watch caches, the socket the CNI process asks, the hook agent",
    long_about = "Runs on every node (the DaemonSet's long-running container). Watches the node's pods (field \
                  selector spec.nodeName) and every NetworkAttachmentDefinition, keeps only what planning reads, \
                  and answers the plexus CNI process over a root-only unix socket, so that an ADD reads nothing \
                  from the API; it also sends the network-status write and the events. Without an answer in \
                  time the CNI process works without it."
)]
pub struct DaemonArgs {
    /// The node whose pods are cached [default: $NODE_NAME]
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// API credentials [default: the pod's service account]
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Where to listen (an absolute path)
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET, value_parser = absolute)]
    pub socket: PathBuf,
    /// Requests served at once; more wait up to 250 ms, then get 'busy'
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_in_flight: u64,
    /// How long a pod not yet in the cache waits for its watch event before the daemon reads it from the API
    #[arg(long, value_name = "N", default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..))]
    pub pod_wait_ms: u64,
    /// How long one watch request stays open before it is renewed (at most 3600)
    #[arg(long, value_name = "N", default_value_t = 290, value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub watch_timeout_secs: u32,
    #[command(flatten)]
    pub log: plexus_cni::logging::LogArgs,
    /// The plexus cacheDir: pulled hook modules, compiled hooks and the node's active hook set
    #[arg(long, value_name = "DIR", default_value = plexus_cni::conf::DEFAULT_CACHE_DIR, value_parser = absolute)]
    pub cache_dir: PathBuf,
    /// Do not deliver NetworkHook resources to this node
    #[arg(long)]
    pub no_hooks: bool,
    /// A public key (ECDSA P-256, PEM, e.g. cosign.pub) hook module signatures may verify with, or a directory
    /// of them (*.pub, *.pem); read again every 5 s; repeatable
    #[arg(long, value_name = "PEM|DIR")]
    pub hook_key: Vec<PathBuf>,
    /// required: a module is used only when a cosign-format signature of its manifest digest verifies with a
    /// --hook-key; off: the digest alone pins it
    #[arg(long, value_name = "POLICY", value_enum, default_value = "required")]
    pub hook_signatures: agent::SignaturePolicy,
    /// A registry spoken to over plain HTTP (host or host:port); repeatable
    #[arg(long, value_name = "HOST[:PORT]")]
    pub insecure_registry: Vec<String>,
    /// A CA certificate trusted for registries besides the system's; repeatable
    #[arg(long, value_name = "PEM")]
    pub registry_ca: Vec<PathBuf>,
    /// Where accepted network-status writes are kept until the API server takes them
    /// [default: status-queue beside the socket]
    #[arg(long, value_name = "DIR", value_parser = absolute)]
    pub status_queue_dir: Option<PathBuf>,
    /// Where GET /metrics is served: HOST:PORT (the Prometheus text format; OpenMetrics when asked for), or 0
    /// for nowhere
    #[arg(long, value_name = "HOST:PORT", default_value = metrics::DEFAULT_BIND, value_parser = metrics_bind)]
    pub metrics_bind_address: MetricsBind,
    /// Networks follow the annotation: when the k8s.v1.cni.cncf.io/networks annotation of a running pod of this
    /// node changes, attach what was added and detach what was removed
    #[arg(long)]
    pub dynamic_networks: bool,
    /// With --dynamic-networks: sandboxes changed at once at most
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub max_network_changes: u64,
    /// Ask the running daemon for its health, print it as JSON and exit: 0 when it is synced and below its
    /// concurrency bound, 1 when not, 2 when it does not answer
    #[arg(long)]
    pub health: bool,
    /// Also run `plexus install INSTALL-FLAGS...` (usually with --watch) in this process; every argument after
    /// --install is an install flag
    #[arg(long, value_name = "INSTALL-FLAGS", num_args = 0.., allow_hyphen_values = true)]
    pub install: Option<Vec<String>>,
}

/// `--metrics-bind-address`: an address, or `0` for none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsBind(pub Option<std::net::SocketAddr>);

fn metrics_bind(text: &str) -> Result<MetricsBind, String> {
    if text == "0" {
        return Ok(MetricsBind(None));
    }
    // HOST:PORT, HOST an IP address; an IPv6 address with or without brackets (what $(POD_IP) expands to).
    let wrong = || "must be IP:PORT (127.0.0.1:9471, [::1]:9471), or 0 for none".to_string();
    let (host, port) = text.rsplit_once(':').ok_or_else(wrong)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let ip: std::net::IpAddr = host.parse().map_err(|_| wrong())?;
    let port: u16 = port.parse().map_err(|_| wrong())?;
    Ok(MetricsBind(Some(std::net::SocketAddr::new(ip, port))))
}

fn absolute(text: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(text);
    if path.is_absolute() {
        Ok(path)
    } else {
        Err("must be an absolute path".into())
    }
}

impl DaemonArgs {
    /// The settings; `node_env` is `$NODE_NAME`, used when there is no --node-name.
    pub fn settings(self, node_env: Option<String>) -> Result<DaemonSettings, DaemonError> {
        let node = self.node_name.or(node_env).unwrap_or_default();
        if node.is_empty() && !self.health {
            return Err(DaemonError::NoNodeName);
        }
        let install = self
            .install
            .map(|rest| install::parse_args(&rest))
            .transpose()?;
        let dynamic = self
            .dynamic_networks
            .then(|| super::dynamic::DynamicSettings {
                cache_dir: self.cache_dir.clone(),
                max_changes: usize::try_from(self.max_network_changes).unwrap_or(4),
            });
        let hooks = (!self.no_hooks).then(|| HookAgentOptions {
            cache_dir: self.cache_dir,
            key_files: self.hook_key,
            signatures: self.hook_signatures,
            registry: crate::distribution::RegistryOptions {
                insecure: self.insecure_registry,
                ca_files: self.registry_ca,
                ..Default::default()
            },
        });
        Ok(DaemonSettings {
            node,
            socket: self.socket,
            kube: KubeSettings {
                kubeconfig: self.kubeconfig,
                ..KubeSettings::default()
            },
            max_in_flight: usize::try_from(self.max_in_flight).unwrap_or(usize::MAX),
            pod_wait: Duration::from_millis(self.pod_wait_ms),
            watch_timeout_secs: self.watch_timeout_secs,
            log: self.log,
            install,
            hooks,
            health: self.health,
            status_queue_dir: self.status_queue_dir,
            queue_wait: QUEUE_WAIT,
            metrics_bind: self.metrics_bind_address.0,
            dynamic,
        })
    }
}

/// `plexus daemon` on its own, for [`parse_args`].
#[derive(clap::Parser)]
#[command(name = "plexus daemon")]
struct DaemonCli {
    #[command(flatten)]
    args: DaemonArgs,
}

/// Parses `plexus daemon` arguments (those after `daemon`); `node_env` is `$NODE_NAME`.
pub fn parse_args(
    args: &[String],
    node_env: Option<String>,
) -> Result<DaemonSettings, DaemonError> {
    use clap::Parser;
    let argv = std::iter::once("plexus daemon").chain(args.iter().map(String::as_str));
    DaemonCli::try_parse_from(argv)
        .map_err(DaemonError::Usage)?
        .args
        .settings(node_env)
}

/// `plexus daemon ARGS...`.
pub fn main(args: DaemonArgs) -> u8 {
    let settings = match args.settings(std::env::var("NODE_NAME").ok()) {
        Ok(s) => s,
        Err(DaemonError::Usage(e)) | Err(DaemonError::Install(install::InstallError::Usage(e))) => {
            return plexus_cni::cli::exit_code(&e)
        }
        Err(e) => {
            eprintln!("plexus daemon: {e}");
            return 2;
        }
    };
    if settings.health {
        return print_health(&settings.socket);
    }
    settings.log.init();
    match run(settings) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!(error = %e, "daemon stopped");
            eprintln!("plexus daemon: {e}");
            1
        }
    }
}

fn print_health(socket: &Path) -> u8 {
    match client::ask(socket, &Request::Health, Duration::from_secs(2)) {
        Ok(Answer::Health(h)) => {
            println!("{}", serde_json::to_string_pretty(&h).unwrap_or_default());
            match h.unready() {
                None => 0,
                Some(why) => {
                    eprintln!("plexus daemon: not ready: {why}");
                    1
                }
            }
        }
        Ok(other) => {
            eprintln!("plexus daemon: unexpected answer {other:?}");
            2
        }
        Err(e) => {
            eprintln!("plexus daemon: no answer from {}: {e}", socket.display());
            2
        }
    }
}

/// Maps an I/O error on `path` (a file, or what was being set up) to the daemon's error.
fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DaemonError {
    let path = path.display().to_string();
    move |source| DaemonError::Io { path, source }
}

/// Runs until SIGTERM or SIGINT, or until the installer running in this process fails.
pub fn run(settings: DaemonSettings) -> Result<(), DaemonError> {
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

pub(crate) struct Shared {
    node: String,
    writes: StatusQueue,
    pub(crate) cache: Arc<NodeCache>,
    pub(crate) api: KubeApi,
    permits: tokio::sync::Semaphore,
    max_in_flight: usize,
    queue_wait: Duration,
    pod_wait: Duration,
    api_reads: AtomicU64,
    events_in_flight: Arc<AtomicUsize>,
    pub(crate) metrics: Arc<Metrics>,
    hook_states: HookStates,
}

/// Events posted at once at most; more are dropped (they are best effort, and a burst must not pile up tasks).
const MAX_EVENTS_IN_FLIGHT: usize = 256;

async fn serve(
    settings: DaemonSettings,
    install_result: tokio::sync::oneshot::Receiver<install::InstallError>,
) -> Result<(), DaemonError> {
    let dir = settings.socket.parent().ok_or_else(|| DaemonError::Io {
        path: settings.socket.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "no parent directory"),
    })?;
    files::private_dir(dir, 0o755).map_err(io(dir))?;
    // One daemon per socket: the lock is held for the process's life and released by the kernel at exit. Root's
    // alone (0600, never a symlink): a lock file anyone can open is one anyone can hold, and the daemon would
    // then never start.
    let lock_path = settings.socket.with_extension("lock");
    let (lock, opened) = files::open_private(&lock_path, 0o600).map_err(io(&lock_path))?;
    if opened == files::Opened::Replaced {
        tracing::warn!(path = %lock_path.display(), "replaced a lock file of another owner or mode");
    }
    match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            return Err(DaemonError::AlreadyRunning(lock_path.display().to_string()))
        }
        Err(e) => return Err(io(&lock_path)(e.into())),
    }
    // A socket left by a daemon that died: nobody listens on it any more (we hold the lock).
    match std::fs::remove_file(&settings.socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(&settings.socket)(e)),
    }
    // Writes accepted by an earlier run (killed, restarted) are sent first.
    let queue_dir = settings
        .status_queue_dir
        .clone()
        .unwrap_or_else(|| dir.join("status-queue"));
    let (queue, kept) = StatusQueue::open(&queue_dir).map_err(io(&queue_dir))?;
    if !kept.is_empty() {
        tracing::info!(writes = kept.len(), dir = %queue_dir.display(), "sending status writes kept by an earlier run");
    }
    let metrics = Arc::new(Metrics::new());
    let counted = metrics.clone();
    let api = KubeApi::connect_observed(
        settings.kube.clone(),
        Some(Arc::new(
            move |verb: &str, resource: &str, code: Option<u16>| {
                counted.api_request(verb, resource, code)
            },
        )),
    )
    .await?;
    let hook_states = HookStates::default();
    let cache = NodeCache::new();
    let watches = tokio::spawn(run_watches(
        api.client().clone(),
        cache.clone(),
        WatchSettings {
            node: settings.node.clone(),
            timeout_secs: settings.watch_timeout_secs,
        },
    ));
    let agent = settings.hooks.clone().map(|h| {
        tokio::spawn(agent::run(
            api.clone(),
            agent::AgentSettings {
                node: settings.node.clone(),
                cache_dir: h.cache_dir,
                key_files: h.key_files,
                signatures: h.signatures,
                registry: h.registry,
                watch_timeout_secs: settings.watch_timeout_secs,
                states: hook_states.clone(),
            },
        ))
    });
    let listener = {
        // Root only: created under a umask that leaves no permission to group or others.
        let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
        let bound = UnixListener::bind(&settings.socket);
        rustix::process::umask(old);
        bound.map_err(io(&settings.socket))?
    };
    tracing::info!(socket = %settings.socket.display(), node = %settings.node, "serving");
    let shared = Arc::new(Shared {
        node: settings.node.clone(),
        writes: queue,
        cache,
        api,
        permits: tokio::sync::Semaphore::new(settings.max_in_flight),
        max_in_flight: settings.max_in_flight,
        queue_wait: settings.queue_wait,
        pod_wait: settings.pod_wait,
        api_reads: AtomicU64::new(0),
        events_in_flight: Arc::new(AtomicUsize::new(0)),
        metrics: metrics.clone(),
        hook_states: hook_states.clone(),
    });
    // The metrics endpoint (it binds and serves in the background; see metrics::serve).
    let metrics_server = settings.metrics_bind.map(|addr| {
        let seen = shared.clone();
        let hooks = hook_states.clone();
        tokio::spawn(async move {
            let snapshot = move || seen.snapshot(&hooks);
            if let Err(e) = metrics::serve(addr, metrics, snapshot).await {
                tracing::warn!(error = %e, "metrics endpoint stopped");
            }
        })
    });
    for key in kept {
        start_writer(&shared, key);
    }
    let dynamic = settings
        .dynamic
        .clone()
        .map(|d| tokio::spawn(super::dynamic::run(shared.clone(), d)));
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
    let mut failure = None;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        if let Err(e) = connection(stream, shared, our_uid).await {
                            tracing::debug!(error = %e, "connection ended early");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            e = &mut install_failed => {
                failure = Some(DaemonError::Install(e));
                break;
            }
        }
    }
    tracing::info!("stopping");
    watches.abort();
    if let Some(m) = metrics_server {
        m.abort();
    }
    if let Some(a) = agent {
        a.abort();
    }
    if let Some(d) = dynamic {
        d.abort();
    }
    // Writes already accepted are sent before the process goes (bounded: a dead API server does not hold it).
    let flush_deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while shared.pending_writes() > 0 && tokio::time::Instant::now() < flush_deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if shared.pending_writes() > 0 {
        tracing::warn!(
            left = shared.pending_writes(),
            dir = %queue_dir.display(),
            "stopped with status writes unsent: kept, sent by the next run"
        );
    }
    let _ = std::fs::remove_file(&settings.socket);
    drop(lock);
    failure.map_or(Ok(()), Err)
}

/// How long the daemon waits for a client's next request (a CNI process keeps its connection for the whole
/// ADD, delegates included; one that waits longer reconnects), and for an answer to be taken.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves one client: requests one after another on the same connection, each answered in turn.
async fn connection(stream: UnixStream, shared: Arc<Shared>, our_uid: u32) -> std::io::Result<()> {
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
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "bad request");
                return Ok(());
            }
        };
        let answer = match request {
            // Health never waits for a permit: it is how an operator sees a daemon under load. Nor does a
            // report: it is counted and answered (the CNI process has usually gone already).
            request @ (Request::Health | Request::Report { .. }) => answer(&shared, request).await,
            request => {
                match tokio::time::timeout(shared.queue_wait, shared.permits.acquire()).await {
                    Ok(Ok(_permit)) => answer(&shared, request).await,
                    _ => {
                        shared.metrics.requests_shed.inc();
                        Answer::Busy
                    }
                }
            }
        };
        let bytes = proto::encode(&answer)?;
        tokio::time::timeout(WRITE_TIMEOUT, write_half.write_all(&bytes))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
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

fn health(shared: &Shared) -> Answer {
    let mut h = DaemonHealth::new(&shared.node, shared.cache.health());
    h.in_flight = shared.max_in_flight - shared.permits.available_permits();
    h.max_in_flight = shared.max_in_flight;
    h.shed = shared.metrics.requests_shed.get();
    h.api_reads = shared.api_reads.load(Ordering::Relaxed);
    h.status_writes = shared.metrics.status_writes.get_or_create(&success()).get();
    h.pending_writes = shared.pending_writes();
    h.hooks = shared
        .hook_states
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .cloned()
        .collect();
    Answer::Health(h)
}

fn failed(e: &ClusterError) -> Answer {
    Answer::Failed { error: e.clone() }
}

async fn answer(shared_arc: &Arc<Shared>, request: Request) -> Answer {
    let shared = shared_arc.as_ref();
    match request {
        Request::Health => health(shared),
        Request::Report { report } => {
            shared.metrics.record(&report);
            Answer::Done
        }
        Request::Pod { pod } => match pod_of(shared, &pod).await {
            Some(Ok(p)) => Answer::Pod { pod: p },
            Some(Err(e)) => failed(&e),
            None => Answer::Unsynced,
        },
        Request::Nad { namespace, name } => match shared.cache.nad(&namespace, &name) {
            Lookup::Found(nad) => Answer::Nad { nad },
            Lookup::Unsynced => Answer::Unsynced,
            // Perhaps created a moment ago: the API has the last word.
            Lookup::Missing => {
                shared.api_reads.fetch_add(1, Ordering::Relaxed);
                match shared.api.nad(&namespace, &name).await {
                    Ok(nad) => Answer::Nad { nad },
                    Err(e) => failed(&e),
                }
            }
        },
        Request::Status {
            pod,
            network_status,
        } => {
            if enqueue_status(shared_arc, pod, network_status) {
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
            send_event(shared, pod, warning, reason, message);
            Answer::Done
        }
    }
}

impl Shared {
    fn pending_writes(&self) -> usize {
        self.writes.len()
    }

    /// What the scrape-time gauges mirror.
    fn snapshot(&self, hooks: &HookStates) -> Snapshot {
        let cache = self.cache.health();
        Snapshot {
            in_flight: self.max_in_flight - self.permits.available_permits(),
            pending_writes: self.pending_writes(),
            pods: cache.pods,
            nads: cache.nads,
            pod_lists: cache.pod_lists,
            nad_lists: cache.nad_lists,
            hooks: hooks.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        }
    }
}

fn success() -> ResultLabel {
    ResultLabel {
        result: "success".into(),
    }
}

/// How long a status write that failed waits at most before it is tried again.
const MAX_STATUS_RETRY: Duration = Duration::from_secs(30);

/// Accepts a status write: kept on disk (see [`StatusQueue`]), answered at once, and sent by the pod's writer
/// task. The annotation is informative (spec 5) and a failed write never failed an ADD, so the ADD need not
/// wait for the API server's commit. `false` when the queue is full or cannot be written (the CNI process then
/// writes it itself).
pub(crate) fn enqueue_status(shared: &Arc<Shared>, pod: PodRef, value: String) -> bool {
    let key = (pod.namespace.clone(), pod.name.clone());
    match shared.writes.accept(pod, value) {
        Ok(true) => {
            start_writer(shared, key);
            true
        }
        Ok(false) => true,
        Err(e) => {
            tracing::warn!(error = %e, "status write not kept; the CNI process writes it");
            false
        }
    }
}

/// Sends a pod's kept writes, newest first taken, until none is left: each is retried with backoff for as long
/// as the API server does not take it, and dropped when the pod is gone (the API server's 404, or the cache
/// holding the pod under another UID).
fn start_writer(shared: &Arc<Shared>, key: Key) {
    let shared = shared.clone();
    tokio::spawn(async move {
        while let Some(mut kept) = shared.writes.take(&key) {
            let mut backoff = Backoff::new(Duration::from_secs(1), MAX_STATUS_RETRY);
            loop {
                if let Lookup::Found(p) = shared.cache.pod(&key.0, &key.1) {
                    if p.uid.is_some() && kept.pod.uid.is_some() && p.uid != kept.pod.uid {
                        tracing::info!(pod = %kept.pod, "pod replaced by one with another UID: its status write is dropped");
                        break;
                    }
                }
                match shared
                    .api
                    .write_status(&kept.pod, &kept.network_status)
                    .await
                {
                    Ok(()) => {
                        shared.metrics.status_writes.get_or_create(&success()).inc();
                        break;
                    }
                    Err(e) => {
                        shared
                            .metrics
                            .status_writes
                            .get_or_create(&ResultLabel {
                                result: "error".into(),
                            })
                            .inc();
                        let wait = backoff.next_delay();
                        tracing::warn!(pod = %kept.pod, error = %e, retry_in = ?wait, "cannot publish network-status yet; kept and retried");
                        tokio::time::sleep(wait).await;
                        if let Some(newer) = shared.writes.newer(&key) {
                            kept = newer;
                        }
                    }
                }
            }
            shared.writes.finished(&key);
        }
    });
}

/// Posts an event on `pod` in the background, unless events are off or too many are in flight already (events
/// are best effort, and a burst must not pile up tasks). Needs the daemon's runtime.
pub(crate) fn send_event(
    shared: &Shared,
    pod: PodRef,
    warning: bool,
    reason: String,
    message: String,
) {
    if !shared.api.settings().events {
        return;
    }
    if shared.events_in_flight.fetch_add(1, Ordering::Relaxed) < MAX_EVENTS_IN_FLIGHT {
        tokio::spawn(post_event(shared, pod, warning, reason, message));
    } else {
        shared.events_in_flight.fetch_sub(1, Ordering::Relaxed);
        tracing::warn!(pod = %pod, "too many events in flight; dropped one");
    }
}

fn post_event(
    shared: &Shared,
    pod: PodRef,
    warning: bool,
    reason: String,
    message: String,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    // The task outlives the request; it takes its own handles.
    let api = shared.api.clone();
    let in_flight = shared.events_in_flight.clone();
    async move {
        let kind = if warning { "Warning" } else { "Normal" };
        if let Err(e) = api.post_event(&pod, (kind, &reason), &message).await {
            tracing::warn!(pod = %pod, error = %e, "could not post the {reason} event");
        }
        in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The pod from the cache, waiting up to `pod_wait` for a pod the watch has not delivered yet (or delivered
/// with another UID: a pod recreated under the same name), then from the API. `None`: the cache is unsynced.
async fn pod_of(
    shared: &Shared,
    pod: &PodRef,
) -> Option<Result<plexus_core::spec::Pod, ClusterError>> {
    let mut changes = shared.cache.subscribe();
    let deadline = tokio::time::Instant::now() + shared.pod_wait;
    loop {
        match shared.cache.pod(&pod.namespace, &pod.name) {
            Lookup::Unsynced => return None,
            Lookup::Found(p) if pod.uid.is_none() || p.uid == pod.uid => return Some(Ok(p)),
            _ => {}
        }
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Ok(Ok(())) => continue,
            _ => break,
        }
    }
    tracing::debug!(pod = %pod, "pod not in the cache in time; reading it from the API");
    shared.api_reads.fetch_add(1, Ordering::Relaxed);
    Some(shared.api.pod(pod).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_flags_and_install_passthrough() {
        let s = parse_args(
            &args(&[
                "--socket",
                "/run/x.sock",
                "--pod-wait-ms=20",
                "--install",
                "--watch",
                "--bin-dir",
                "/b",
            ]),
            Some("node1".into()),
        )
        .unwrap();
        assert_eq!(s.node, "node1");
        assert_eq!(s.socket, PathBuf::from("/run/x.sock"));
        assert_eq!(s.pod_wait, Duration::from_millis(20));
        assert_eq!(s.metrics_bind, Some("127.0.0.1:9471".parse().unwrap()));
        let install = s.install.unwrap();
        assert!(install.watch);
        assert_eq!(install.bin_dir, PathBuf::from("/b"));
    }

    #[test]
    fn the_metrics_address_takes_what_pod_ip_expands_to() {
        let bind = |a: &str| {
            parse_args(&args(&["--metrics-bind-address", a]), Some("n".into()))
                .unwrap()
                .metrics_bind
        };
        assert_eq!(bind("0"), None);
        assert_eq!(
            bind("192.0.2.7:9471"),
            Some("192.0.2.7:9471".parse().unwrap())
        );
        // $(POD_IP) of an IPv6 pod has no brackets.
        assert_eq!(
            bind("fd00::7:9471"),
            Some("[fd00::7]:9471".parse().unwrap())
        );
        assert_eq!(
            bind("[fd00::7]:9471"),
            Some("[fd00::7]:9471".parse().unwrap())
        );
    }

    #[test]
    fn refuses_what_it_cannot_use() {
        let err = parse_args(&args(&[]), None).unwrap_err().to_string();
        assert!(err.contains("NODE_NAME"), "{err}");
        let err = |a: &[&str]| {
            parse_args(&args(a), Some("n".into()))
                .unwrap_err()
                .to_string()
        };
        let e = err(&["--socket", "rel.sock"]);
        assert!(e.contains("absolute"), "{e}");
        let e = err(&["--max-in-flight", "0"]);
        assert!(e.contains("'0'") && e.contains("--max-in-flight"), "{e}");
        let e = err(&["--hook-signatures", "maybe"]);
        assert!(e.contains("[possible values: required, off]"), "{e}");
        let e = err(&["--metrics-bind-address", "localhost:9471"]);
        assert!(
            e.contains("--metrics-bind-address") && e.contains("IP:PORT"),
            "{e}"
        );
        let e = err(&["--cache-dir", "var/lib"]);
        assert!(e.contains("--cache-dir") && e.contains("absolute"), "{e}");
        // A mistake in the install flags after --install is named too.
        let e = err(&["--install", "--bin"]);
        assert!(e.contains("'--bin'"), "{e}");
        match parse_args(&args(&["--help"]), None) {
            Err(DaemonError::Usage(e)) => {
                assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
                assert!(e.to_string().contains("--pod-wait-ms <N>"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
}
