//! A real kubelet (1.37, of the build of `tests/parts.sh`, the API server's release) running node `node1` over a
//! private containerd 2 ([`crate::containerd::Containerd`]): it registers the node, runs the
//! pods bound to it and calls their CNI plugin exactly as on a production node.
//!
//! kubelet changes the host beyond its `--root-dir`: kernel tunables it sets at start, the device-plugin socket
//! and the pod log directories it writes at fixed paths, and a bind mount of its root dir onto itself. A
//! [`Kubelet`] records all of them before the start and puts them back when dropped (during unwinding too).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::kubeapi::KubeApiServer;
use crate::mount_points;

/// The node the kubelet registers, and the token user the API server knows it by (`system:node:node1`).
pub const NODE: &str = "node1";
pub const NODE_TOKEN: &str = "node1-token";

/// A pod bound to [`NODE`] running the test pause image, selecting `networks` (the selection annotation's
/// value); it stops within a second.
pub fn pod_on_node(namespace: &str, name: &str, networks: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "annotations": {"k8s.v1.cni.cncf.io/networks": networks}},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": crate::containerd::PAUSE_IMAGE, "imagePullPolicy": "Never"}]
        }
    })
}

/// `pod` (of [`pod_on_node`]) left to the scheduler instead (no node named), its container given the device claim
/// `claim`: a `spec.resourceClaims[]` entry's source, `{"resourceClaimName": ...}` or
/// `{"resourceClaimTemplateName": ...}`, under the name `nics`.
pub fn with_claim(pod: &mut serde_json::Value, claim: serde_json::Value) {
    pod["spec"].as_object_mut().unwrap().remove("nodeName");
    let mut entry = claim;
    entry["name"] = serde_json::json!("nics");
    pod["spec"]["resourceClaims"] = serde_json::json!([entry]);
    pod["spec"]["containers"][0]["resources"] = serde_json::json!({"claims": [{"name": "nics"}]});
}

/// The kernel tunables kubelet's container manager sets when it starts.
const SYSCTLS: [&str; 6] = [
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
];

/// Paths kubelet writes whatever `--root-dir` says: removed after it stops if they did not exist before.
const FIXED_PATHS: [&str; 5] = [
    "/var/lib/kubelet",
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet/device-plugins/kubelet.sock",
    "/var/log/pods",
    "/var/log/containers",
];

/// What kubelet changes outside its root dir, as it was before.
struct HostState {
    sysctls: Vec<(&'static str, String)>,
    absent: Vec<&'static str>,
    mounts: Vec<String>,
    /// The node's address was added to `lo` for this kubelet (it was not there before).
    node_ip_added: bool,
}

/// The node's address: a documentation address (kubelet refuses a loopback one, and 1.37 wants it on an interface
/// of the host), put on `lo` while the kubelet runs. Nothing but the node's own processes use it.
pub const NODE_IP: &str = "192.0.2.10";

fn lo_has_node_ip() -> bool {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "dev", "lo"])
        .output()
        .expect("run ip");
    String::from_utf8_lossy(&out.stdout).contains(&format!(" {NODE_IP}/"))
}

impl HostState {
    fn record() -> HostState {
        HostState {
            sysctls: SYSCTLS
                .iter()
                .filter_map(|k| {
                    let path = Path::new("/proc/sys").join(k.replace('.', "/"));
                    std::fs::read_to_string(path)
                        .ok()
                        .map(|v| (*k, v.trim().to_string()))
                })
                .collect(),
            absent: FIXED_PATHS
                .into_iter()
                .filter(|p| !Path::new(p).exists())
                .collect(),
            mounts: mount_points(),
            node_ip_added: false,
        }
    }

    /// Puts [`NODE_IP`] on `lo` unless it is there already (then it is left there when the kubelet stops).
    fn add_node_ip(&mut self) {
        if !lo_has_node_ip() {
            let ok = Command::new("ip")
                .args(["addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "ip addr add {NODE_IP}/32 dev lo");
            self.node_ip_added = true;
        }
    }

    /// Puts back what kubelet changed; `root` is its root dir (the mounts under it are kubelet's).
    fn restore(&self, root: &Path) {
        if self.node_ip_added {
            let _ = Command::new("ip")
                .args(["addr", "del", &format!("{NODE_IP}/32"), "dev", "lo"])
                .status();
        }
        // kubelet's mounts made since (its root dir onto itself, volumes), deepest first.
        let root = root.display().to_string();
        crate::unmount_deepest_first(
            mount_points()
                .into_iter()
                .filter(|m| !self.mounts.contains(m))
                .filter(|m| m.starts_with(&root) || m.starts_with("/var/lib/kubelet"))
                .collect(),
        );
        for (key, value) in &self.sysctls {
            let path = Path::new("/proc/sys").join(key.replace('.', "/"));
            let _ = std::fs::write(path, value);
        }
        // Deepest first; a path that was there before is left alone.
        for p in self.absent.iter().rev() {
            if Path::new(p).is_dir() {
                let _ = std::fs::remove_dir_all(p);
            } else {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// One kubelet at a time in the test process: each writes the same fixed paths and kernel tunables, and
/// registers the same node.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub struct Kubelet {
    dir: tempfile::TempDir,
    /// The kubelet's process while it runs (a restart replaces it).
    child: std::sync::Mutex<Option<Child>>,
    host: HostState,
    /// Held until the kubelet is stopped and the host put back (dropped last).
    _turn: std::sync::MutexGuard<'static, ()>,
}

impl Kubelet {
    /// The kubelet's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.lock().unwrap().as_ref().map(Child::id)
    }

    /// Starts kubelet for [`NODE`] against `api`, with the containerd listening on `runtime_socket`; returns
    /// once the node is Ready (containerd reports its network ready once a CNI conf is present).
    pub fn start(api: &KubeApiServer, runtime_socket: &Path) -> Kubelet {
        let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::Builder::new()
            .prefix("plx-kubelet-")
            .tempdir_in("/var/tmp")
            .expect("kubelet dir");
        let d = dir.path();
        api.write_kubeconfig(&d.join("node.kubeconfig"), NODE_TOKEN);
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization: {{mode: AlwaysAllow}}
address: 127.0.0.1
healthzBindAddress: 127.0.0.1
healthzPort: 0
readOnlyPort: 0
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
makeIPTablesUtilChains: false
imageGCHighThresholdPercent: 100
evictionHard: {{}}
volumePluginDir: {root}/volume-plugins
staticPodPath: ''
syncFrequency: 5s
nodeStatusUpdateFrequency: 2s
# Room for the density benchmark's larger bursts (110 is kubelet's default).
maxPods: 250
containerRuntimeEndpoint: unix://{runtime}
# The project's machines have cgroup v1, which kubelet 1.35+ refuses unless told otherwise.
failCgroupV1: false
",
            root = d.display(),
            runtime = runtime_socket.display(),
        );
        std::fs::write(d.join("kubelet.yaml"), config).expect("kubelet config");
        // Recorded before kubelet runs, so that a start that fails half-way is undone too.
        let mut host = HostState::record();
        host.add_node_ip();
        let kubelet = Kubelet {
            dir,
            child: std::sync::Mutex::new(None),
            host,
            _turn: turn,
        };
        kubelet.spawn();
        kubelet.wait_ready(api);
        kubelet
    }

    /// Starts the kubelet process, its log appended to the one before.
    fn spawn(&self) {
        let d = self.dir.path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("kubelet.log"))
            .expect("kubelet log");
        let child = Command::new(crate::parts::bin("kubelet"))
            .arg(format!(
                "--kubeconfig={}",
                d.join("node.kubeconfig").display()
            ))
            .arg(format!("--hostname-override={NODE}"))
            .arg("--register-node=true")
            .arg(format!("--root-dir={}", d.join("root").display()))
            .arg(format!("--cert-dir={}", d.join("pki").display()))
            .arg(format!("--config={}", d.join("kubelet.yaml").display()))
            // A documentation address, as a node's would be (kubelet refuses a loopback one); nothing connects to it.
            .arg(format!("--node-ip={NODE_IP}"))
            .arg("--v=2")
            // Its built-in credential provider would otherwise probe a cloud metadata address.
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start kubelet");
        *self.child.lock().unwrap() = Some(child);
    }

    /// Stops the kubelet (SIGTERM, then SIGKILL after 10 s).
    fn stop(&self) {
        crate::stop_child(&self.child, Duration::from_secs(10));
    }

    /// The node powered off, as far as the kubelet goes: killed (kill -9), and its volumes' mounts (tmpfs, gone
    /// with a reboot) undone. [`Kubelet::power_on`] starts it again.
    pub fn power_off(&self) {
        crate::kill_child(&self.child);
        let pods = self.root_dir().join("pods").display().to_string();
        crate::unmount_under(&pods);
    }

    /// The kubelet started after [`Kubelet::power_off`], on the same root dir; returns once the node is Ready.
    pub fn power_on(&self, api: &KubeApiServer) {
        self.spawn();
        self.wait_ready(api);
    }

    /// The kubelet restarted, as `systemctl restart kubelet` does: stopped, started on the same root dir and
    /// config; returns once the node is Ready again. Its pods and their sandboxes live on.
    pub fn restart(&self, api: &KubeApiServer) {
        self.stop();
        self.spawn();
        self.wait_ready(api);
    }

    fn wait_ready(&self, api: &KubeApiServer) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Ok((200, body)) = api.request("GET", &format!("/api/v1/nodes/{NODE}"), None) {
                let node: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                let ready = node["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                if ready {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "node {NODE} not Ready within 90 s; kubelet's log:\n{}",
                self.log_tail(40)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// kubelet's `--root-dir`: its plugin registration directory (`plugins_registry`) and plugins' directories
    /// (`plugins/<name>`) are under it.
    pub fn root_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("root")
    }

    /// The last `n` lines of kubelet's log, for failure messages.
    pub fn log_tail(&self, n: usize) -> String {
        crate::tail(&self.dir.path().join("kubelet.log"), n)
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop();
        self.host.restore(self.dir.path());
    }
}
