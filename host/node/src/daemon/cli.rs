//! `plexus daemon`'s command line: its flags, the settings made of them, `--health`, and the process's exit
//! status.

use std::path::{Path, PathBuf};
use std::time::Duration;

use plexus_cluster::{ClusterError, KubeSettings};
use plexus_cni::daemon::proto::{Answer, Request};
use plexus_cni::daemon::{client, DEFAULT_SOCKET};

use super::metrics;
use super::{agent, dynamic, nri};
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
    /// What the NAD cache may hold, in bytes.
    pub nad_budget_bytes: usize,
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
    pub dynamic: Option<dynamic::DynamicSettings>,
    /// NRI mode, with its plexus configuration (`None`: off).
    pub nri: Option<(nri::NriSettings, serde_json::Value)>,
    /// The attachment cache (`--cache-dir`): in CNI mode the daemon deletes there the plans of sandboxes made in
    /// NRI mode that went without Plexus ([`nri::sweep_after_nri_mode`]).
    pub cache_dir: PathBuf,
    /// The bound on the daemon's requests to the API server.
    pub kube_rate: plexus_cluster::ratelimit::Rates,
}

/// The node agent's settings (see [`agent`]).
#[derive(Debug, Clone)]
pub struct HookAgentOptions {
    pub cache_dir: PathBuf,
    pub key_files: Vec<PathBuf>,
    pub signatures: agent::SignaturePolicy,
    pub registry: crate::distribution::RegistryOptions,
    /// What each compile and probe process may use.
    pub limits: super::compile::ProcessLimits,
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
    #[error("{0}")]
    Nri(String),
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
    /// What the cached NetworkAttachmentDefinitions may take in memory, in MiB: past it the largest are dropped
    /// from the cache and read by name when an ADD needs one (logged, counted in `plexus daemon --health`)
    #[arg(long, value_name = "MIB", default_value_t = (plexus_cluster::DEFAULT_NAD_BUDGET_BYTES >> 20) as u64,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub nad_cache_mib: u64,
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
    /// The memory (RLIMIT_DATA) each process that probes a hook module may use; a NetworkHook whose
    /// memoryLimitMiB does not fit in it, with 32 MiB for the runtime, is refused. Keep it below the container's
    /// memory limit, less the daemon's own
    #[arg(long, value_name = "MIB", default_value_t = super::compile::ProcessLimits::DEFAULT_MEMORY_MIB,
          value_parser = clap::value_parser!(u64).range(48..=65_536))]
    pub hook_process_memory_mib: u64,
    /// The memory (RLIMIT_DATA) each process that compiles a hook module may use (a module in Python needs about
    /// 400 MiB, one in Rust 20). Keep it below the container's memory limit, less the daemon's own
    #[arg(long, value_name = "MIB", default_value_t = super::compile::ProcessLimits::DEFAULT_COMPILE_MEMORY_MIB,
          value_parser = clap::value_parser!(u64).range(48..=65_536))]
    pub hook_compile_memory_mib: u64,
    /// The CPU time (RLIMIT_CPU) each process that compiles or probes a hook module may use
    #[arg(long, value_name = "SECS", default_value_t = super::compile::ProcessLimits::DEFAULT_CPU_SECS,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub hook_process_cpu_secs: u64,
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
    /// NRI mode: attach the pods' networks through the container runtime's NRI, after its own CNI has set up the
    /// cluster network, instead of as the runtime's CNI plugin (needs --nri-conf)
    #[arg(long, requires = "nri_conf")]
    pub nri: bool,
    /// With --nri: the runtime's NRI socket
    #[arg(long, value_name = "PATH", default_value = nri::DEFAULT_SOCKET, value_parser = absolute)]
    pub nri_socket: PathBuf,
    /// With --nri: the plexus configuration the attachments are made with (JSON: one plugin's conf, as in a
    /// conflist)
    #[arg(long, value_name = "FILE", value_parser = absolute)]
    pub nri_conf: Option<PathBuf>,
    /// With --nri: where the delegate plugins are (CNI_PATH)
    #[arg(long, value_name = "DIRS", default_value = "/opt/cni/bin")]
    pub nri_cni_path: String,
    /// Requests a second the daemon sends the API server at most, on average (reads its caches miss, watches,
    /// reports, claim writes; status writes and events have budgets of their own); a token bucket, as kubelet's
    #[arg(long, value_name = "QPS", default_value_t = 5.0, value_parser = positive_qps)]
    pub kube_api_qps: f64,
    /// Requests the daemon may send at once before --kube-api-qps paces them
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub kube_api_burst: u32,
    /// Pod network-status writes a second, on average: a budget of their own, so that a write someone waits for
    /// (a hot-plugged network) never queues behind background requests; one per ADD or change of a pod of the
    /// node (kubelet's own default for its writes is the same)
    #[arg(long, value_name = "QPS", default_value_t = 50.0, value_parser = positive_qps)]
    pub kube_api_status_qps: f64,
    /// Network-status writes the daemon may send at once before --kube-api-status-qps paces them
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub kube_api_status_burst: u32,
    /// Events a second the daemon posts at most, on average: a budget of their own (one AddedInterface event per
    /// attachment, so they come in proportion to the pods the node starts, as kubelet's own events do, which have
    /// their own --event-qps); 10 keeps up with a node starting five pods a second with two networks each
    #[arg(long, value_name = "QPS", default_value_t = 10.0, value_parser = positive_qps)]
    pub event_qps: f64,
    /// Events the daemon may post at once before --event-qps paces them
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub event_burst: u32,
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

fn positive_qps(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(q) if q.is_finite() && q > 0.0 && q <= 10_000.0 => Ok(q),
        _ => Err("must be a number above 0 and at most 10000".into()),
    }
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
        let mut install = self
            .install
            .map(|rest| install::parse_args(&rest))
            .transpose()?;
        // The conflist it writes leads the CNI plugin to this daemon: its socket, the locks and status queue
        // beside it, its cache dir.
        if let Some(paths) = install.as_mut().map(|i| &mut i.node_paths) {
            paths.run_dir = paths
                .run_dir
                .take()
                .or_else(|| self.socket.parent().map(Path::to_path_buf));
            paths
                .daemon_socket
                .get_or_insert_with(|| self.socket.clone());
            paths
                .cache_dir
                .get_or_insert_with(|| self.cache_dir.clone());
        }
        // Without the agent nobody publishes the node's hook set: the conflist must not make ADDs wait for one.
        if let Some(i) = install.as_mut().filter(|_| self.no_hooks) {
            i.cluster_hooks = false;
        }
        let dynamic = self.dynamic_networks.then(|| dynamic::DynamicSettings {
            cache_dir: self.cache_dir.clone(),
            max_changes: usize::try_from(self.max_network_changes).unwrap_or(4),
        });
        let nri = match (self.nri, &self.nri_conf) {
            (true, Some(conf)) => Some((
                nri::NriSettings {
                    socket: self.nri_socket.clone(),
                    conf: conf.clone(),
                    cni_path: self.nri_cni_path.clone(),
                },
                nri::read_conf(conf).map_err(DaemonError::Nri)?,
            )),
            _ => None,
        };
        let cache_dir = self.cache_dir.clone();
        let hooks = (!self.no_hooks).then(|| HookAgentOptions {
            cache_dir: self.cache_dir,
            key_files: self.hook_key,
            signatures: self.hook_signatures,
            registry: crate::distribution::RegistryOptions {
                insecure: self.insecure_registry,
                ca_files: self.registry_ca,
                ..Default::default()
            },
            limits: super::compile::ProcessLimits {
                memory_mib: self.hook_process_memory_mib,
                compile_memory_mib: self.hook_compile_memory_mib,
                cpu_secs: self.hook_process_cpu_secs,
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
            nad_budget_bytes: usize::try_from(self.nad_cache_mib << 20).unwrap_or(usize::MAX),
            log: self.log,
            install,
            hooks,
            health: self.health,
            status_queue_dir: self.status_queue_dir,
            queue_wait: QUEUE_WAIT,
            metrics_bind: self.metrics_bind_address.0,
            dynamic,
            nri,
            cache_dir,
            kube_rate: plexus_cluster::ratelimit::Rates {
                background: plexus_cluster::ratelimit::RateLimit {
                    qps: self.kube_api_qps,
                    burst: self.kube_api_burst,
                },
                status: plexus_cluster::ratelimit::RateLimit {
                    qps: self.kube_api_status_qps,
                    burst: self.kube_api_status_burst,
                },
                events: plexus_cluster::ratelimit::RateLimit {
                    qps: self.event_qps,
                    burst: self.event_burst,
                },
            },
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

/// `plexus daemon --health`: asks the running daemon, prints its health; the exit status (0 ready, 1 not, 2 no
/// answer).
pub fn print_health(socket: &Path) -> u8 {
    match client::ask(socket, &Request::Health, Duration::from_secs(2)) {
        Ok(Answer::Health(h)) => {
            // The health carries hooks' names and messages, which the cluster and the hooks wrote.
            println!("{}", crate::terminal::json(&h).unwrap_or_default());
            match h.unready() {
                None => 0,
                Some(why) => {
                    eprintln!(
                        "plexus daemon: not ready: {}",
                        crate::terminal::printable(&why)
                    );
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
        assert_eq!(
            (s.kube_rate.background.qps, s.kube_rate.background.burst),
            (5.0, 10)
        );
        assert_eq!(
            (s.kube_rate.status.qps, s.kube_rate.status.burst),
            (50.0, 100)
        );
        assert_eq!(
            (s.kube_rate.events.qps, s.kube_rate.events.burst),
            (10.0, 100)
        );
        let install = s.install.unwrap();
        assert!(install.watch);
        assert_eq!(install.bin_dir, PathBuf::from("/b"));
        // The conflist it writes names this daemon's socket (and the dir beside it) and its cache dir.
        assert_eq!(
            install.node_paths,
            install::NodePaths {
                run_dir: Some("/run".into()),
                daemon_socket: Some("/run/x.sock".into()),
                cache_dir: Some("/var/lib/plexus".into()),
            }
        );
        // Install's own flags win.
        let s = parse_args(
            &args(&["--install", "--run-dir=/r", "--cache-dir=/c"]),
            Some("node1".into()),
        )
        .unwrap();
        let paths = s.install.unwrap().node_paths;
        assert_eq!(paths.run_dir, Some("/r".into()));
        assert_eq!(paths.cache_dir, Some("/c".into()));
        assert_eq!(paths.daemon_socket, Some(PathBuf::from(DEFAULT_SOCKET)));
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
        let e = err(&["--kube-api-qps", "0"]);
        assert!(e.contains("--kube-api-qps") && e.contains("above 0"), "{e}");
        let e = err(&["--event-qps", "0"]);
        assert!(e.contains("--event-qps") && e.contains("above 0"), "{e}");
        let e = err(&["--kube-api-burst", "0"]);
        assert!(e.contains("--kube-api-burst"), "{e}");
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
