//! `plexus install`: puts Plexus on a node — the binary, a service-account kubeconfig, the CNI conflist.
//!
//! Run by the DaemonSet (see `examples/deploy/`): an init container installs once, the main container runs
//! `--watch` to keep the kubeconfig in step with the projected token and the conflist with the cluster
//! network's conf. Every file is written to a temporary name in its directory, synced and renamed, so the
//! container runtime never reads half a conf and a running `plexus` never blocks the binary update
//! ("text file busy"). The kubeconfig is kube's own type, written with serde-saphyr.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use plexus_cni::conf::{is_conf_file, is_plexus_conf};
pub use plexus_cni::uninstall::{uninstall, CONFLIST_NAME, DEFAULT_CONF_DIR};
/// The installed binary's name in the CNI bin dir (the `type` of the conflist's plugin).
pub const BINARY_NAME: &str = "plexus";
pub const DEFAULT_BIN_DIR: &str = "/opt/cni/bin";
pub const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
pub const DEFAULT_CA_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
const MIN_POLL: Duration = Duration::from_millis(100);
const MAX_POLL: Duration = Duration::from_secs(60);

/// What can go wrong installing Plexus on a node. Messages name the file or flag involved.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// A command line clap refused (or `--help`, which is not a failure): print it with
    /// [`plexus_cni::cli::exit_code`].
    #[error("{0}")]
    Usage(clap::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cluster network conf {path}: {reason}")]
    BadClusterConf { path: PathBuf, reason: String },
    #[error("no cluster network conf {what} appeared in {dir} within {waited}")]
    Timeout {
        what: String,
        dir: PathBuf,
        waited: String,
    },
    #[error("service account: {0}")]
    ServiceAccount(String),
    #[error(transparent)]
    Uninstall(#[from] plexus_cni::uninstall::UninstallError),
    #[error("--from-multus {0}")]
    FromMultus(String),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> InstallError + '_ {
    move |source| InstallError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What to do, from the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallOptions {
    pub bin_dir: PathBuf,
    pub conf_dir: PathBuf,
    /// The binary to install; `None` means the running executable.
    pub cni_bin_source: Option<PathBuf>,
    pub kubeconfig_out: PathBuf,
    /// A conf's `name` or file name in `conf_dir`, or an absolute path; `None` picks the first conf in
    /// `conf_dir` that is not Plexus's own.
    pub cluster_network_conf: Option<String>,
    /// How long to wait for the cluster network's conf; zero waits forever.
    pub timeout: Duration,
    pub poll_interval: Duration,
    pub token_file: PathBuf,
    pub ca_file: PathBuf,
    pub watch: bool,
    pub uninstall: bool,
    /// Where the node's Plexus processes meet, written into the conflist when they are not the CNI plugin's
    /// defaults (so a DaemonSet that moves them moves the CNI plugin with it).
    pub node_paths: NodePaths,
    /// Only print the plexus conflist equivalent to this Multus conf (and what has no equivalent).
    pub from_multus: Option<PathBuf>,
    /// Write `"compat": "multus"` into the conflist.
    pub compat_multus: bool,
    /// Whether the node runs a node agent that publishes the cluster's hooks: without one the conflist says
    /// `"clusterHooks": false`, since the CNI plugin would otherwise wait for a hook set nobody publishes.
    pub cluster_hooks: bool,
}

/// The plexus conf's `runDir` (locks, the daemon's socket), `daemon.socket` and `cacheDir`: `None` or the
/// default leaves the key out of the conflist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePaths {
    pub run_dir: Option<PathBuf>,
    pub daemon_socket: Option<PathBuf>,
    pub cache_dir: Option<PathBuf>,
}

impl NodePaths {
    /// Sets the keys that differ from the CNI plugin's defaults on the conflist's plexus conf.
    fn apply(&self, conflist: &mut Value) {
        let Some(plugin) = conflist["plugins"][0].as_object_mut() else {
            return;
        };
        let run_dir = self
            .run_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(plexus_cni::conf::DEFAULT_RUN_DIR));
        if run_dir != Path::new(plexus_cni::conf::DEFAULT_RUN_DIR) {
            plugin.insert("runDir".into(), json!(run_dir));
        }
        if let Some(socket) = &self.daemon_socket {
            if *socket != run_dir.join(plexus_cni::conf::DAEMON_SOCKET_NAME) {
                plugin.insert("daemon".into(), json!({ "socket": socket }));
            }
        }
        if let Some(cache) = &self.cache_dir {
            if cache != Path::new(plexus_cni::conf::DEFAULT_CACHE_DIR) {
                plugin.insert("cacheDir".into(), json!(cache));
            }
        }
    }
}

impl Default for InstallOptions {
    /// What `plexus install` does with no flags: the defaults are written once, on [`InstallArgs`].
    fn default() -> Self {
        parse_args(&[]).expect("the install defaults parse")
    }
}

/// `30`, `30s`, `500ms`, `5m`.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let (digits, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, ""), |i| text.split_at(i));
    let n: u64 = digits.parse().ok()?;
    match unit {
        "" | "s" => Some(Duration::from_secs(n)),
        "ms" => Some(Duration::from_millis(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        _ => None,
    }
}

fn fmt_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// `plexus install`'s flags.
#[derive(Debug, Clone, clap::Args)]
#[command(
    about = "Put plexus on a node: the binary, a service-account kubeconfig, the CNI conflist",
    long_about = "Copies the plexus binary into --bin-dir, writes a kubeconfig for the pod's service account to \
                  --kubeconfig-out, waits up to --timeout (0 = forever) for the cluster network's CNI conf in \
                  --conf-dir, then writes 00-plexus.conflist delegating to it. --watch keeps both files current, \
                  checking every --poll-interval. --uninstall removes the conflist and the kubeconfig.",
    after_help = "Durations: 30, 30s, 500ms, 5m."
)]
pub struct InstallArgs {
    /// Keep the kubeconfig and the conflist current until stopped
    #[arg(long, conflicts_with = "uninstall")]
    pub watch: bool,
    /// Remove the conflist (when it is Plexus's) and the kubeconfig; the binary stays
    #[arg(long)]
    pub uninstall: bool,
    /// Print the plexus conflist that does the job of this Multus conf (thin, thick shim, or the thick daemon's
    /// config), with "compat": "multus", and name on stderr what has no equivalent; installs nothing
    #[arg(long, value_name = "FILE", conflicts_with_all = ["watch", "uninstall"])]
    pub from_multus: Option<PathBuf>,
    /// "multus": write "compat": "multus" into the conflist (inputs written for Multus behave as under Multus)
    #[arg(long, value_name = "MODE", default_value = "strict", value_parser = ["strict", "multus"])]
    pub compat: String,
    /// The node runs no node agent (`plexus daemon --no-hooks`, or no daemon): write "clusterHooks": false, so
    /// that ADDs do not wait for a hook set nobody publishes
    #[arg(long)]
    pub no_cluster_hooks: bool,
    /// Where the plexus binary goes
    #[arg(long, value_name = "DIR", default_value = DEFAULT_BIN_DIR)]
    pub bin_dir: PathBuf,
    #[command(flatten)]
    pub target: plexus_cni::uninstall::UninstallArgs,
    /// The binary to install [default: this executable]
    #[arg(long, value_name = "FILE")]
    pub cni_bin_source: Option<PathBuf>,
    /// The cluster network's conf: a conf's name, a file name in --conf-dir, or an absolute path
    /// [default: the first conf in --conf-dir that is not Plexus's]
    #[arg(long, value_name = "NAME|PATH")]
    pub cluster_network_conf: Option<String>,
    /// How long to wait for the cluster network's conf (0 waits forever)
    #[arg(long, value_name = "DURATION", default_value = "300s", value_parser = duration_arg)]
    pub timeout: Duration,
    /// How often --watch looks (100ms..60s)
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = poll_arg)]
    pub poll_interval: Duration,
    /// The projected service-account token
    #[arg(long, value_name = "FILE", default_value = DEFAULT_TOKEN_FILE)]
    pub token_file: PathBuf,
    /// The API server's CA certificate
    #[arg(long, value_name = "FILE", default_value = DEFAULT_CA_FILE)]
    pub ca_file: PathBuf,
    /// The CNI plugin's runDir (locks, the daemon's socket), written into the conflist unless it is
    /// /run/plexus [default: the directory of the daemon's --socket under `plexus daemon --install`]
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// The node daemon's socket, written into the conflist unless it is daemon.sock in the runDir
    /// [default: the daemon's --socket under `plexus daemon --install`]
    #[arg(long, value_name = "FILE")]
    pub daemon_socket: Option<PathBuf>,
    /// The CNI plugin's cacheDir (plans, delivered hooks), written into the conflist unless it is
    /// /var/lib/plexus [default: the daemon's --cache-dir under `plexus daemon --install`]
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
}

impl InstallArgs {
    pub fn options(&self) -> InstallOptions {
        let target = self.target.options();
        InstallOptions {
            bin_dir: self.bin_dir.clone(),
            conf_dir: target.conf_dir,
            cni_bin_source: self.cni_bin_source.clone(),
            kubeconfig_out: target.kubeconfig_out,
            cluster_network_conf: self.cluster_network_conf.clone(),
            timeout: self.timeout,
            poll_interval: self.poll_interval,
            token_file: self.token_file.clone(),
            ca_file: self.ca_file.clone(),
            watch: self.watch,
            uninstall: self.uninstall,
            from_multus: self.from_multus.clone(),
            compat_multus: self.compat == "multus",
            cluster_hooks: !self.no_cluster_hooks,
            node_paths: NodePaths {
                run_dir: self.run_dir.clone(),
                daemon_socket: self.daemon_socket.clone(),
                cache_dir: self.cache_dir.clone(),
            },
        }
    }
}

fn duration_arg(text: &str) -> Result<Duration, String> {
    parse_duration(text).ok_or_else(|| "not a duration (30, 30s, 500ms, 5m)".into())
}

fn poll_arg(text: &str) -> Result<Duration, String> {
    let d = duration_arg(text)?;
    if !(MIN_POLL..=MAX_POLL).contains(&d) {
        return Err(format!(
            "must be between {} and {}",
            fmt_duration(MIN_POLL),
            fmt_duration(MAX_POLL)
        ));
    }
    Ok(d)
}

/// `plexus install` on its own, for [`parse_args`].
#[derive(clap::Parser)]
#[command(name = "plexus install")]
struct InstallCli {
    #[command(flatten)]
    args: InstallArgs,
}

/// Parses install flags (a leading `install` is skipped): the flags after `plexus daemon --install`, and tests.
pub fn parse_args(args: &[String]) -> Result<InstallOptions, InstallError> {
    use clap::Parser;
    let args = match args.first() {
        Some(first) if first == "install" => &args[1..],
        _ => args,
    };
    let argv = std::iter::once("plexus install").chain(args.iter().map(String::as_str));
    InstallCli::try_parse_from(argv)
        .map(|c| c.args.options())
        .map_err(InstallError::Usage)
}

/// Replaces `path` with `contents` atomically: temp file in the same directory, fsync, rename, fsync dir.
/// Returns false (and writes nothing) when the file already has exactly these contents and mode.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<bool, InstallError> {
    if let Ok(existing) = fs::read(path) {
        let same_mode = fs::metadata(path)
            .map(|m| m.permissions().mode() & 0o7777 == mode)
            .unwrap_or(false);
        if existing == contents && same_mode {
            return Ok(false);
        }
    }
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    plexus_cni::conf::replace_file(path, contents, mode).map_err(io_err(path))?;
    Ok(true)
}

/// Copies the plexus binary into `bin_dir` under [`BINARY_NAME`]; a running copy keeps its old inode.
pub fn install_binary(source: &Path, bin_dir: &Path) -> Result<(PathBuf, bool), InstallError> {
    let bytes = fs::read(source).map_err(io_err(source))?;
    let target = bin_dir.join(BINARY_NAME);
    let changed = write_atomic(&target, &bytes, 0o755)?;
    Ok((target, changed))
}

/// The service account identity a kubeconfig is made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccount {
    /// `https://host:port`
    pub server: String,
    pub token: String,
    pub ca_pem: Vec<u8>,
}

impl ServiceAccount {
    /// From `KUBERNETES_SERVICE_HOST`/`_PORT` values and the projected token and CA files.
    pub fn load(
        host: &str,
        port: &str,
        token_file: &Path,
        ca_file: &Path,
    ) -> Result<Self, InstallError> {
        if host.is_empty() || port.is_empty() || port.parse::<u16>().is_err() {
            return Err(InstallError::ServiceAccount(format!(
                "API server address {host:?}:{port:?} is not usable"
            )));
        }
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        let token = fs::read_to_string(token_file)
            .map_err(io_err(token_file))?
            .trim()
            .to_string();
        if token.is_empty() {
            return Err(InstallError::ServiceAccount(format!(
                "token file {} is empty",
                token_file.display()
            )));
        }
        let ca_pem = fs::read(ca_file).map_err(io_err(ca_file))?;
        Ok(Self {
            server: format!("https://{host}:{port}"),
            token,
            ca_pem,
        })
    }

    /// A kubeconfig with the token and CA embedded: the host's `plexus` cannot read the pod's projected volume.
    pub fn kubeconfig(&self) -> Result<String, InstallError> {
        use kube::config::{
            AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
        };
        let config = Kubeconfig {
            api_version: Some("v1".into()),
            kind: Some("Config".into()),
            clusters: vec![NamedCluster {
                name: "local".into(),
                cluster: Some(Cluster {
                    server: Some(self.server.clone()),
                    certificate_authority_data: Some(base64(&self.ca_pem)),
                    ..Cluster::default()
                }),
                ..NamedCluster::default()
            }],
            auth_infos: vec![NamedAuthInfo {
                name: "plexus".into(),
                auth_info: Some(AuthInfo {
                    token: Some(self.token.clone().into()),
                    ..AuthInfo::default()
                }),
                ..NamedAuthInfo::default()
            }],
            contexts: vec![NamedContext {
                name: "plexus".into(),
                context: Some(Context {
                    cluster: "local".into(),
                    user: Some("plexus".into()),
                    ..Context::default()
                }),
                ..NamedContext::default()
            }],
            current_context: Some("plexus".into()),
            ..Kubeconfig::default()
        };
        let yaml = serde_saphyr::to_string(&config)
            .map_err(|e| InstallError::ServiceAccount(format!("cannot write a kubeconfig: {e}")))?;
        Ok(format!(
            "# Written by plexus install; rewritten when the service account token changes.\n{yaml}"
        ))
    }
}

/// Standard base64 with padding (RFC 4648 section 4), as a kubeconfig embeds certificates.
pub fn base64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Finds the cluster network's conf now: by absolute path, by `name` or file name in `conf_dir`, or the first
/// conf in `conf_dir` (in file-name order, as the runtime picks) that is not Plexus's own. Files that do not
/// parse yet (half-written by their installer) count as absent.
pub fn find_cluster_conf(
    conf_dir: &Path,
    selector: Option<&str>,
) -> Result<Option<(PathBuf, Value)>, InstallError> {
    if let Some(path) = selector.filter(|s| s.starts_with('/')) {
        let path = PathBuf::from(path);
        return Ok(read_conf(&path).map(|conf| (path, conf)));
    }
    let mut names = Vec::new();
    match fs::read_dir(conf_dir) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry.map_err(io_err(conf_dir))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if name != CONFLIST_NAME && is_conf_file(&name) && entry.path().is_file() {
                    names.push(name);
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(InstallError::Io {
                path: conf_dir.to_path_buf(),
                source,
            })
        }
    }
    names.sort();
    for name in names {
        let path = conf_dir.join(&name);
        let Some(conf) = read_conf(&path) else {
            continue;
        };
        if is_plexus_conf(&conf) {
            continue;
        }
        let wanted = match selector {
            None => true,
            Some(s) => conf.get("name").and_then(Value::as_str) == Some(s) || name == s,
        };
        if wanted {
            return Ok(Some((path, conf)));
        }
    }
    Ok(None)
}

fn read_conf(path: &Path) -> Option<Value> {
    let text = fs::read(path).ok()?;
    serde_json::from_slice::<Value>(&text)
        .ok()
        .filter(Value::is_object)
}

/// Waits (spec 6.1) until the cluster network's conf is in place; polls every `poll`; a zero `timeout` waits
/// forever.
pub fn wait_for_cluster_conf(
    conf_dir: &Path,
    selector: Option<&str>,
    timeout: Duration,
    poll: Duration,
) -> Result<(PathBuf, Value), InstallError> {
    let started = Instant::now();
    loop {
        if let Some(found) = find_cluster_conf(conf_dir, selector)? {
            return Ok(found);
        }
        if !timeout.is_zero() && started.elapsed() >= timeout {
            return Err(InstallError::Timeout {
                what: selector.map_or_else(|| "(any)".to_string(), |s| format!("{s:?}")),
                dir: conf_dir.to_path_buf(),
                waited: fmt_duration(timeout),
            });
        }
        std::thread::sleep(poll);
    }
}

/// Plexus's conflist, delegating to the cluster network conf at `cluster_path` and advertising the
/// capabilities that conf's plugins take (spec 7.5: they are passed on to the cluster network only).
pub fn plexus_conflist(
    cluster_path: &Path,
    cluster_conf: &Value,
    kubeconfig: Option<&Path>,
) -> Result<Value, InstallError> {
    let bad = |reason: &str| InstallError::BadClusterConf {
        path: cluster_path.to_path_buf(),
        reason: reason.into(),
    };
    let plugins: Vec<&Value> = match cluster_conf.get("plugins") {
        Some(Value::Array(list)) if !list.is_empty() => list.iter().collect(),
        Some(_) => return Err(bad("\"plugins\" must be a non-empty list")),
        None if cluster_conf.get("type").is_some_and(Value::is_string) => vec![cluster_conf],
        None => return Err(bad("has neither \"plugins\" nor \"type\"")),
    };
    let mut capabilities = Map::new();
    for plugin in plugins {
        match plugin.get("capabilities") {
            None => {}
            Some(Value::Object(caps)) => {
                for (cap, on) in caps {
                    if on.as_bool() == Some(true) {
                        capabilities.insert(cap.clone(), Value::Bool(true));
                    }
                }
            }
            Some(_) => return Err(bad("\"capabilities\" must be an object")),
        }
    }
    let cni_version = match cluster_conf.get("cniVersion") {
        Some(Value::String(v)) => v.clone(),
        None => "1.0.0".into(),
        Some(_) => return Err(bad("\"cniVersion\" must be a string")),
    };
    let mut plugin = json!({
        "type": BINARY_NAME,
        "clusterNetwork": cluster_path.to_string_lossy(),
    });
    if let Some(k) = kubeconfig {
        plugin["cluster"] = json!({ "source": "kube", "kubeconfig": k.to_string_lossy() });
    }
    if !capabilities.is_empty() {
        plugin["capabilities"] = Value::Object(capabilities);
    }
    Ok(json!({ "cniVersion": cni_version, "name": "plexus", "plugins": [plugin] }))
}

/// Writes `00-plexus.conflist` into `conf_dir`; false when it was already up to date.
pub fn write_conflist(conf_dir: &Path, conflist: &Value) -> Result<bool, InstallError> {
    let mut text = serde_json::to_string_pretty(conflist).expect("a JSON value serializes");
    text.push('\n');
    write_atomic(&conf_dir.join(CONFLIST_NAME), text.as_bytes(), 0o644)
}

/// Where the API server is, from `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiServerEnv {
    pub host: Option<String>,
    pub port: Option<String>,
}

impl ApiServerEnv {
    /// The address kubelet gives every pod (`KUBERNETES_SERVICE_HOST`, `KUBERNETES_SERVICE_PORT`).
    pub fn from_process() -> ApiServerEnv {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        ApiServerEnv {
            host: var("KUBERNETES_SERVICE_HOST"),
            port: var("KUBERNETES_SERVICE_PORT"),
        }
    }
}

/// One pass of installation: the kubeconfig (when in a cluster) and the conflist, each rewritten only if it
/// changed. Without a cluster network conf the conflist is removed, so the node reports the network as not
/// ready instead of failing every pod (spec 6.1). Returns the files it wrote or removed.
pub fn refresh(
    opts: &InstallOptions,
    env: &ApiServerEnv,
    wait: bool,
) -> Result<Vec<PathBuf>, InstallError> {
    let mut touched = Vec::new();
    let kubeconfig = match (&env.host, &env.port) {
        (Some(host), Some(port)) => {
            let sa = ServiceAccount::load(host, port, &opts.token_file, &opts.ca_file)?;
            if write_atomic(&opts.kubeconfig_out, sa.kubeconfig()?.as_bytes(), 0o600)? {
                touched.push(opts.kubeconfig_out.clone());
            }
            Some(opts.kubeconfig_out.as_path())
        }
        _ => None,
    };
    let selector = opts.cluster_network_conf.as_deref();
    let found = if wait {
        Some(wait_for_cluster_conf(
            &opts.conf_dir,
            selector,
            opts.timeout,
            opts.poll_interval,
        )?)
    } else {
        find_cluster_conf(&opts.conf_dir, selector)?
    };
    let ours = opts.conf_dir.join(CONFLIST_NAME);
    match found {
        Some((path, conf)) => {
            let mut conflist = plexus_conflist(&path, &conf, kubeconfig)?;
            opts.node_paths.apply(&mut conflist);
            if opts.compat_multus {
                conflist["plugins"][0]["compat"] = json!("multus");
            }
            if !opts.cluster_hooks {
                conflist["plugins"][0]["clusterHooks"] = json!(false);
            }
            if write_conflist(&opts.conf_dir, &conflist)? {
                touched.push(ours);
            }
        }
        None => match fs::remove_file(&ours) {
            Ok(()) => touched.push(ours),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(InstallError::Io { path: ours, source }),
        },
    }
    Ok(touched)
}

/// Everything `plexus install` does, given its options and the API server's address.
pub fn run(opts: &InstallOptions, env: &ApiServerEnv) -> Result<(), InstallError> {
    if let Some(file) = &opts.from_multus {
        let converted = crate::multus::from_file(file).map_err(InstallError::FromMultus)?;
        let mut text =
            serde_json::to_string_pretty(&converted.conflist).expect("a JSON value serializes");
        text.push('\n');
        print!("{text}");
        for note in &converted.notes {
            eprintln!("plexus install: not carried over: {note}");
        }
        return Ok(());
    }
    if opts.uninstall {
        for path in uninstall(&opts.conf_dir, &opts.kubeconfig_out)? {
            eprintln!("plexus install: removed {}", path.display());
        }
        return Ok(());
    }
    let source = match &opts.cni_bin_source {
        Some(p) => p.clone(),
        None => std::env::current_exe().map_err(io_err(Path::new("/proc/self/exe")))?,
    };
    let (target, changed) = install_binary(&source, &opts.bin_dir)?;
    if changed {
        eprintln!("plexus install: installed {}", target.display());
    }
    if env.host.is_none() {
        eprintln!("plexus install: KUBERNETES_SERVICE_HOST is not set, writing no kubeconfig");
    }
    for path in refresh(opts, env, true)? {
        eprintln!("plexus install: wrote {}", path.display());
    }
    if !opts.watch {
        return Ok(());
    }
    loop {
        std::thread::sleep(opts.poll_interval);
        match refresh(opts, env, false) {
            Ok(touched) => {
                for path in touched {
                    eprintln!("plexus install: updated {}", path.display());
                }
            }
            // A token mid-rotation or a conf mid-write: the next poll sees the settled state.
            Err(err) => eprintln!("plexus install: {err}"),
        }
    }
}

/// `plexus install [flags]`; `args` are the arguments after the program name.
pub fn main(args: &InstallArgs) -> u8 {
    match run(&args.options(), &ApiServerEnv::from_process()) {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("plexus install: {err}");
            1
        }
    }
}
