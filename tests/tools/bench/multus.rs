//! Multus's thick plugin beside plexus's daemon mode, when one is provided: the same API server, pods, NADs and
//! no-op delegates, cycles interleaved in the same run. The project does not build or ship Multus:
//! `PLEXUS_BENCH_MULTUS=DIR` names a directory holding `multus-shim` and `multus-daemon`; without it the
//! comparison is skipped and the report says so.
//!
//! multus-daemon reads its Kubernetes credentials only from the in-cluster locations (the
//! `KUBERNETES_SERVICE_HOST`/`_PORT` environment and a token and CA under
//! `/run/secrets/kubernetes.io/serviceaccount`), so it is started in a mount namespace of its own
//! (`unshare -m`) where that directory is a bind mount of the bench's; the host sees at most an empty
//! directory, removed afterwards if the bench made it. It opens `CNI_NETNS` itself, so its pods get a real,
//! empty network namespace (the no-op delegates do nothing in it).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use plexus_tests::kubeapi::KubeApiServer;
use plexus_tests::netns::NetNs;
use serde_json::{json, Value};

use crate::proc;
use crate::world::World;

/// The environment variable naming the directory with `multus-shim` and `multus-daemon`.
pub const ENV: &str = "PLEXUS_BENCH_MULTUS";

/// Multus's service account: its token, and the rules of Multus's own ClusterRole.
pub const TOKEN: (&str, &str) = ("multus-token", "kube-system/multus");

const SECRETS: &str = "/run/secrets/kubernetes.io/serviceaccount";

pub struct Multus {
    daemon: Child,
    shim: PathBuf,
    shim_conf: Value,
    netns: NetNs,
    /// Directories the bench created on the host for the mount point, deepest first.
    made: Vec<PathBuf>,
    pub version: String,
}

/// The binaries' directory, when one is given.
pub fn provided() -> Option<PathBuf> {
    std::env::var_os(ENV).map(PathBuf::from)
}

/// Multus's RBAC: its ClusterRole's rules, bound to its service account.
pub fn rbac(api: &KubeApiServer) {
    api.create(&json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "multus", "namespace": "kube-system"}}));
    api.create(&json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "multus"},
        "rules": [
            {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["*"], "verbs": ["*"]},
            {"apiGroups": [""], "resources": ["pods", "pods/status"], "verbs": ["get", "list", "update", "watch"]},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]}]}));
    api.create(&json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "multus"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "multus"},
        "subjects": [{"kind": "ServiceAccount", "name": "multus", "namespace": "kube-system"}]}));
}

impl Multus {
    /// Starts multus-daemon for `node` with `w`'s cluster network as its default network and `w`'s delegates.
    pub fn start(
        bins: &Path,
        api: &KubeApiServer,
        w: &World,
        node: &str,
    ) -> Result<Multus, String> {
        let shim = bins.join("multus-shim");
        let daemon_bin = bins.join("multus-daemon");
        for b in [&shim, &daemon_bin] {
            if !b.is_file() {
                return Err(format!("{ENV}: {} is missing", b.display()));
            }
        }
        let version = daemon_version(&daemon_bin);
        let root = w.root.join("multus");
        write_root(&root, api, w)?;
        let made = mount_point()?;
        let daemon = spawn_daemon(&root, &daemon_bin, api, node)?;
        let mut m = Multus {
            daemon,
            shim,
            shim_conf: Value::Null,
            netns: NetNs::new("mlt"),
            made,
            version,
        };
        m.wait_ready(&root)?;
        Ok(m)
    }

    /// Waits (at most 30 s) until the daemon is ready: its socket listens, and it has written the shim's conf (what a
    /// runtime would find first in its conf dir, naming the default network; the daemon reads the network settings
    /// from it), which it keeps.
    fn wait_ready(&mut self, root: &Path) -> Result<(), String> {
        let socket = root.join("sock/multus.sock");
        let conf = root.join("net.d/00-multus.conf");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() || !conf.exists() {
            if let Ok(Some(status)) = self.daemon.try_wait() {
                let err = std::fs::read_to_string(root.join("daemon.stderr")).unwrap_or_default();
                return Err(format!("multus-daemon exited ({status}): {}", err.trim()));
            }
            if Instant::now() > deadline {
                return Err("multus-daemon: no socket within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let text = std::fs::read(&conf).map_err(|e| format!("{}: {e}", conf.display()))?;
        self.shim_conf =
            serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", conf.display()))?;
        Ok(())
    }

    /// The daemon's process (the mount namespace's shell execs it).
    pub fn pid(&self) -> u32 {
        self.daemon.id()
    }

    /// The shim's conf the daemon wrote: what a runtime finds first in its conf dir.
    pub fn shim_conf(&self) -> &Value {
        &self.shim_conf
    }

    /// The size of the binary the runtime execs, bytes.
    pub fn shim_bytes(&self) -> u64 {
        std::fs::metadata(&self.shim).map(|m| m.len()).unwrap_or(0)
    }

    /// One ADD then one DEL through multus-shim: their wall times, ms.
    pub fn cycle(&self, w: &World, id: &str, pod_args: &str) -> Result<(f64, f64), String> {
        let netns = self.netns.path().display().to_string();
        crate::daemon::add_then_del(&format!("Multus {id}"), |command| {
            let mut cmd = Command::new(&self.shim);
            cmd.env_clear()
                .envs(w.cni_env_args(command, id, &netns, pod_args))
                .stderr(Stdio::null());
            proc::run(&mut cmd, self.shim_conf.to_string().as_bytes())
        })
    }

    /// A first cycle, retried while the daemon's pod and NAD informers fill (bounded).
    pub fn warm(&self, w: &World, pod_args: &str) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.cycle(w, "warm-multus", pod_args) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }
}

impl Drop for Multus {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        for d in &self.made {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// multus-daemon's version, from its `-version` ("multus-daemon: version:v4.3.0(...), commit:..., date:...").
fn daemon_version(daemon_bin: &Path) -> String {
    Command::new(daemon_bin)
        .arg("-version")
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            let v = text
                .split("version:")
                .nth(1)?
                .split([',', '('])
                .next()?
                .trim();
            Some(v.to_string())
        })
        .unwrap_or_else(|| "(version unknown)".into())
}

/// Multus's directory `root`, made afresh: the service account's token, namespace and CA, the default network and
/// the daemon's config.
fn write_root(root: &Path, api: &KubeApiServer, w: &World) -> Result<(), String> {
    // A socket or shim conf of an earlier daemon must not pass for this one's.
    let _ = std::fs::remove_dir_all(root);
    for d in ["secrets", "sock", "cache", "net.d", "multus.d"] {
        std::fs::create_dir_all(root.join(d)).map_err(|e| format!("{}: {e}", root.display()))?;
    }
    let write = |p: PathBuf, text: &[u8]| {
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))
    };
    write(root.join("secrets/token"), TOKEN.0.as_bytes())?;
    write(root.join("secrets/namespace"), b"kube-system")?;
    std::fs::copy(api.ca_cert(), root.join("secrets/ca.crt")).map_err(|e| format!("CA: {e}"))?;
    // The default network: the world's cluster network, the only conf in Multus's conf dir.
    write(
        root.join("net.d/10-cluster.conflist"),
        w.nets[0].list.to_string().as_bytes(),
    )?;
    let config = json!({
        "cniVersion": "1.0.0",
        "logLevel": "error",
        "logFile": root.join("multus.log"),
        "socketDir": root.join("sock"),
        "daemonSocketDir": root.join("sock"),
        "binDir": w.cni_path,
        "cniDir": root.join("cache"),
        "confDir": root.join("multus.d"),
        "cniConfigDir": root.join("net.d"),
        "multusAutoconfigDir": root.join("net.d"),
        "multusConfigFile": "auto",
    });
    write(
        root.join("daemon-config.json"),
        config.to_string().as_bytes(),
    )
}

/// multus-daemon for `node`, in a mount namespace of its own where the secrets of `root` are the in-cluster ones,
/// with the API server's address in its environment and its stderr in `root`.
fn spawn_daemon(
    root: &Path,
    daemon_bin: &Path,
    api: &KubeApiServer,
    node: &str,
) -> Result<Child, String> {
    let log = std::fs::File::create(root.join("daemon.stderr")).map_err(|e| e.to_string())?;
    let script = format!(
        "mount --bind {} {SECRETS} && exec {} -config {}",
        root.join("secrets").display(),
        daemon_bin.display(),
        root.join("daemon-config.json").display()
    );
    Command::new("unshare")
        .args(["-m", "--propagation", "slave", "sh", "-c", &script])
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", api.port().to_string())
        .env("MULTUS_NODE_NAME", node)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("start multus-daemon (unshare): {e}"))
}

/// Makes the mount point on the host if it is not there; the directories it made, deepest first.
fn mount_point() -> Result<Vec<PathBuf>, String> {
    let mut made = Vec::new();
    let mut missing: Vec<&Path> = Path::new(SECRETS)
        .ancestors()
        .take_while(|p| !p.exists())
        .collect();
    missing.reverse();
    for d in missing {
        std::fs::create_dir(d).map_err(|e| format!("{}: {e}", d.display()))?;
        made.push(d.to_path_buf());
    }
    made.reverse();
    Ok(made)
}
