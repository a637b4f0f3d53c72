//! A node with Plexus installed as an operator installs it: the project's image in a real containerd or CRI-O, the
//! pod of examples/deploy/daemonset.yaml run by a real kubelet (1.37) against a real API server with the project's
//! CRDs and RBAC ([`DsNode`]), and pods churned on it while something happens to the node ([`crate::churn`]).
//!
//! What stands in for the parts of a cluster that are not here, and nothing else changes in the pod:
//! - no DaemonSet controller or scheduler: the DaemonSet's pod template is created as a pod bound to the node;
//! - no service-account token controller and no kube-proxy: the pod's token is a secret holding a static token of
//!   the API server for `kube-system/plexus`, and `KUBERNETES_SERVICE_HOST`/`_PORT` name the API server's loopback
//!   address instead of the service's cluster IP;
//! - the node's directories (`/opt/cni/bin`, `/etc/cni/net.d`, `/var/lib/cni`, `/run/plexus`, `/var/lib/plexus`)
//!   are directories of the test, mounted at the same paths in the pod (every path of the pod spec is moved
//!   alike); `/run/netns` is the host's own;
//! - the node's address is a documentation address (kubelet refuses loopback), so metrics listen on
//!   loopback; the networks' host-local store is one more host directory;
//! - the OCI registry the node's hooks come from is a real one on loopback over plain HTTP, which the daemon is told
//!   with `--insecure-registry`.
//!
//! As an operator's cluster would, the node enforces a policy hook: NetworkHook [`POLICY_HOOK`], the
//! namespace-isolation guest pushed signed to that registry, its key in ConfigMap `plexus-hook-keys`. A pod may then
//! select NADs of its own namespace only: [`FORBIDDEN_NAD`] (in namespace `other`) is denied.
//!
//! With devices ([`DsNode::start_with`]), the cluster allocates them as a current one does: a DeviceClass of
//! [`DRIVER`], the kube-scheduler, the controller-manager's resourceclaim, garbage collector and node lifecycle
//! controllers, and the
//! suite's DRA driver's kubelet plugin publishing [`DEVICES`] devices of resource [`RESOURCE`]. NAD `net-b` then
//! names that resource (`k8s.v1.cni.cncf.io/resourceName`): a pod selecting it takes the device its claim (from
//! ResourceClaimTemplate [`CLAIM_TEMPLATE`]) was allocated. Unlike a real node's driver, the driver process is not
//! stopped by [`DsNode::reboot`] (its plugin registers again with the new kubelet).
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use plexus_node::install::base64;
use serde_json::{json, Value};

use crate::control_plane::Component;
use crate::dra_driver::DraDriver;
use crate::kubeapi::KubeApiServer;
use crate::kubelet::{Kubelet, NODE};
use crate::netns::{
    bridge_host_local, cni_bin_dir, host_links_on_bridge, links_at, require_root_and_plugins,
    HostBridge, IpamDir,
};
use crate::plexus::{guest_wasm, list_cache, read_cached_plan};
use crate::registry::{key_pair, Registry};
use crate::runtime::{Runtime, RuntimeKind};
use crate::{deploy_manifest, image, tail};

/// The namespace of the node's NADs and of the pods the tests start.
pub const NS: &str = "team";
/// The secondary networks (NADs in [`NS`]), after the cluster network `cluster-net`.
pub const NADS: [&str; 3] = ["net-a", "net-b", "net-c"];
/// The DRA driver of the node's devices, and its DeviceClass.
pub const DRIVER: &str = "nic.example.com";
/// The devices' resource name, which NAD `net-b` names when the node has devices.
pub const RESOURCE: &str = "example.com/nic";
/// The devices the driver publishes (more than the pods alive at once, with the claims of deleted pods still
/// being released).
pub const DEVICES: usize = 32;
/// The ResourceClaimTemplate (in [`NS`]) asking for one device of [`DRIVER`].
pub const CLAIM_TEMPLATE: &str = "nic";
/// The policy hook every node enforces (NetworkHook `isolation`, the namespace-isolation guest).
pub const POLICY_HOOK: &str = "isolation";
/// A NAD the policy hook denies to the pods of [`NS`]: a network of another namespace (`net-c`'s conf).
pub const FORBIDDEN_NAD: &str = "other/net-c";
/// What the policy hook's denial says (in the failed ADD's error, hence the kubelet's FailedCreatePodSandBox).
pub const DENIAL: &str = "may not select network other/net-c";
/// The node directories the DaemonSets mount that the test gives its own directory (a path under `/var/run/` is
/// the same as under `/run/`, as on a node).
const NODE_DIRS: [&str; 7] = [
    "/opt/cni/bin",
    "/etc/cni/net.d",
    "/var/lib/cni",
    "/run/plexus",
    "/var/lib/plexus",
    "/var/lib/kubelet/pod-resources",
    "/run/k8s.cni.cncf.io",
];

/// How Plexus is installed on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// examples/deploy/daemonset.yaml: the CNI plugin installed as the node's CNI configuration, and the daemon.
    Cni,
    /// examples/deploy/nri-daemonset.yaml: the daemon alone, an NRI plugin of the runtime, whose CNI
    /// configuration is the cluster network's alone.
    Nri,
}

/// The mount's propagation (`shared`, `private`, ...) of the mount point that holds `path`.
pub fn propagation(path: &str) -> String {
    let out = Command::new("findmnt")
        .args(["-no", "PROPAGATION", "--target", path])
        .output()
        .expect("run findmnt");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Every string of `v` that is, or lies under, one of [`NODE_DIRS`] moved under `root`.
fn move_node_dirs(v: &mut Value, root: &Path) {
    match v {
        Value::String(s) => {
            // A flag's value too (`--bin-dir=/opt/cni/bin`).
            let (flag, path) = match s.split_once('=') {
                Some((f, p)) if f.starts_with("--") => (format!("{f}="), p.to_string()),
                _ => (String::new(), s.clone()),
            };
            let path = match path.strip_prefix("/var/run/") {
                Some(rest) => format!("/run/{rest}"),
                None => path,
            };
            let under = |d: &str| path == d || path.starts_with(&format!("{d}/"));
            if NODE_DIRS.iter().any(|d| under(d)) {
                let moved = root.join(path.trim_start_matches('/'));
                *s = format!("{flag}{}", moved.display());
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| move_node_dirs(i, root)),
        Value::Object(map) => map.values_mut().for_each(|i| move_node_dirs(i, root)),
        _ => {}
    }
}

/// The DaemonSet's pod template as pod `name` bound to [`NODE`] running `image`, its token from secret `token`,
/// with the stand-ins of the module's header.
#[allow(clippy::too_many_arguments)]
fn daemonset_pod(
    root: &Path,
    api: &KubeApiServer,
    ipam: &Path,
    registry: &str,
    name: &str,
    image: &str,
    token: &str,
    nri_socket: Option<&Path>,
) -> Value {
    let ds = manifest_object(nri_socket.is_some(), "DaemonSet");
    let mut spec = ds["spec"]["template"]["spec"].clone();
    move_node_dirs(&mut spec, root);
    // NRI mode: the runtime's NRI socket is the test's own, its directory mounted where the manifest mounts the
    // node's.
    if let Some(socket) = nri_socket {
        for volume in spec["volumes"].as_array_mut().unwrap() {
            if volume["name"] == "nri" {
                volume["hostPath"]["path"] = json!(socket.parent().unwrap());
            }
        }
        for arg in spec["containers"][0]["command"].as_array_mut().unwrap() {
            if arg.as_str().is_some_and(|a| a.starts_with("--nri-socket=")) {
                let file = socket.file_name().unwrap().to_string_lossy();
                *arg = json!(format!("--nri-socket=/run/nri/{file}"));
            }
        }
    }
    spec["nodeName"] = json!(NODE);
    spec["automountServiceAccountToken"] = json!(false);
    spec["volumes"].as_array_mut().unwrap().extend([
        json!({"name": "sa-token", "secret": {"secretName": token}}),
        json!({"name": "ipam", "hostPath": {"path": ipam, "type": "Directory"}}),
    ]);
    let service = [
        json!({"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}),
        json!({"name": "KUBERNETES_SERVICE_PORT", "value": api.port().to_string()}),
    ];
    for list in ["initContainers", "containers"] {
        let Some(containers) = spec[list].as_array_mut() else {
            continue;
        };
        for c in containers {
            c["image"] = json!(image);
            c["imagePullPolicy"] = json!("Never");
            let env = c["env"]
                .as_array_mut()
                .map(std::mem::take)
                .unwrap_or_default();
            // POD_IP is the node's address (hostNetwork), which is not on this machine.
            let mut env: Vec<Value> = env.into_iter().filter(|e| e["name"] != "POD_IP").collect();
            env.push(json!({"name": "POD_IP", "value": "127.0.0.1"}));
            env.extend(service.iter().cloned());
            c["env"] = json!(env);
            for arg in c["command"].as_array_mut().unwrap() {
                if arg
                    .as_str()
                    .is_some_and(|a| a.starts_with("--metrics-bind-address="))
                {
                    *arg = json!("--metrics-bind-address=127.0.0.1:0");
                }
            }
            if c["name"] == "daemon" {
                // Among the daemon's own flags: those after `--install` are the installer's.
                let command = c["command"].as_array_mut().unwrap();
                let at = command.iter().position(|a| a == "daemon").unwrap() + 1;
                command.insert(at, json!(format!("--insecure-registry={registry}")));
            }
            let mounts = c["volumeMounts"].as_array_mut().unwrap();
            mounts.push(json!({"name": "sa-token", "readOnly": true,
                               "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}));
            mounts.push(json!({"name": "ipam", "mountPath": ipam}));
        }
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "kube-system",
                     "labels": ds["spec"]["template"]["metadata"]["labels"].clone()},
        "spec": spec,
    })
}

/// The object of `kind` in the DaemonSet's manifest: daemonset.yaml's, or with `nri` nri-daemonset.yaml's.
fn manifest_object(nri: bool, kind: &str) -> Value {
    let file = if nri {
        "nri-daemonset.yaml"
    } else {
        "daemonset.yaml"
    };
    let text = std::fs::read_to_string(deploy_manifest(file)).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    docs.into_iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {file}"))
}

/// The object at `path`, if the API server answers 200.
pub fn get(api: &KubeApiServer, path: &str) -> Option<Value> {
    match api.request("GET", path, None) {
        Ok((200, body)) => serde_json::from_str(&body).ok(),
        _ => None,
    }
}

/// Whether a pod's Ready condition is True.
pub fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// Interface names with their IPv4 addresses in the namespace at `netns`.
pub fn interfaces(netns: &Path) -> Vec<(String, Vec<String>)> {
    links_at(netns)
        .into_iter()
        .map(|l| {
            let cidrs = l.cidrs().into_iter().filter(|c| !c.contains(':')).collect();
            (l.ifname, cidrs)
        })
        .collect()
}

/// A node with the DaemonSet's directories, the cluster network's conf and three NADs, the runtime (the image in it
/// under two tags, [`image::IMAGE`] and [`IMAGE_2`]) and a kubelet; no DaemonSet pod yet. Fields drop in order:
/// kubelet (it must not start pods again), the runtime (its sandboxes' DEL runs the installed plugin), the API
/// server, the host's bridges and store, and last the node's directories.
pub struct DsNode {
    pub kind: RuntimeKind,
    pub mode: Mode,
    pub kubelet: Kubelet,
    pub runtime: Runtime,
    /// Dropped after the runtime: the namespaces it made and left.
    runtime_netns: RuntimeNetns,
    pub api: KubeApiServer,
    pub ipam: IpamDir,
    bridges: Vec<(&'static str, HostBridge)>,
    /// The subnet prefix (`a.b.c.`) of cluster-net, net-a, net-b, net-c.
    pub prefixes: Vec<String>,
    /// A small file system of its own at `cacheDir` when asked for ([`DsNode::start_with_cache_mib`]).
    _cache_fs: Option<Tmpfs>,
    /// Where the node's hook modules come from.
    pub registry: Registry,
    /// With devices: the scheduler and controller-manager, and the DRA driver.
    pub dra: Option<(Vec<Component>, DraDriver)>,
    pub root: PathBuf,
    _dir: tempfile::TempDir,
}

/// kill -9 of every process running a CNI invocation whose `CNI_PATH` lies under `root` (this node's plugins);
/// the `CNI_NETNS` each was given.
fn kill_cni_invocations_under(root: &Path) -> Vec<String> {
    let root = root.display().to_string();
    let mut namespaces = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let env = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        let vars: Vec<String> = env
            .split(|b| *b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        let var = |name: &str| {
            vars.iter()
                .find_map(|v| v.strip_prefix(&format!("{name}=")).map(str::to_string))
        };
        if !var("CNI_PATH").is_some_and(|p| p.contains(&root)) {
            continue;
        }
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        if let Some(netns) = var("CNI_NETNS").filter(|n| !n.is_empty()) {
            namespaces.push(netns);
        }
    }
    namespaces
}

/// A pinned network namespace gone, as a reboot ends it: unmounted and its file removed.
fn remove_netns(path: &str) {
    let _ = Command::new("umount").args(["-l", path]).status();
    let _ = std::fs::remove_file(path);
}

/// The pods' network namespaces a runtime makes in `/run/netns` (CRI-O: a UUID; containerd: `cni-` and a UUID; the
/// tests' own have a prefix of their own). A runtime leaves some behind when it is killed while it makes or removes
/// a sandbox (it forgets a sandbox it was making; a real node's reboot empties `/run/netns`), so the node removes
/// them at a reboot and when it is done: those made since the node started that hold no interface but `lo` and that
/// no process is in. Runtimes of other tests may run beside it (one kubelet runs at a time, runtimes without one
/// do not wait for it, and the next node's kubelet starts while this node's runtime is still being stopped): a
/// namespace of theirs has its interfaces, or its sandbox's process, except between its making and the end of its
/// cluster network's ADD, which can be seconds (an ADD that waits for an API server that is down). So when the node
/// is done it removes only those left empty for [`ABANDONED_AFTER`] since they were made; a reboot, which must
/// leave none of its own, removes them whatever their age, once those made in its last seconds are still empty a
/// few seconds later.
struct RuntimeNetns {
    before: std::collections::HashSet<String>,
}

impl RuntimeNetns {
    fn from_now() -> RuntimeNetns {
        RuntimeNetns {
            before: Self::names().collect(),
        }
    }

    fn names() -> impl Iterator<Item = String> {
        std::fs::read_dir(crate::netns::NETNS_RUN_DIR)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| is_uuid(name.strip_prefix("cni-").unwrap_or(name)))
    }

    /// Those made since the node started and left empty, with how long ago each was made.
    fn left(&self) -> Vec<(String, Duration)> {
        let in_use = netns_in_use();
        Self::names()
            .filter(|name| !self.before.contains(name) && left_empty(name, &in_use))
            .filter_map(|name| age(&name).map(|age| (name, age)))
            .collect()
    }

    /// At a reboot: every one left empty, whatever its age (this node's runtime is off, so its own stay empty).
    /// One made in the last seconds may be another runtime's before its cluster network's ADD: those are looked at
    /// again after a few seconds, and removed if still empty.
    fn remove_at_reboot(&self) {
        const SETTLE: Duration = Duration::from_secs(5);
        self.remove(SETTLE);
        let young: Vec<String> = self.left().into_iter().map(|(name, _)| name).collect();
        if young.is_empty() {
            return;
        }
        std::thread::sleep(SETTLE);
        for (name, _) in self.left() {
            if young.contains(&name) {
                remove_netns(&format!("{}/{name}", crate::netns::NETNS_RUN_DIR));
            }
        }
    }

    /// Removes those made since the node started and left empty, at least `min_age` old; their names.
    fn remove(&self, min_age: Duration) -> Vec<String> {
        let old: Vec<String> = self
            .left()
            .into_iter()
            .filter(|(_, age)| *age >= min_age)
            .map(|(name, _)| name)
            .collect();
        for name in &old {
            remove_netns(&format!("{}/{name}", crate::netns::NETNS_RUN_DIR));
        }
        old
    }
}

/// How long a namespace a runtime made stays without interfaces before the node takes it for abandoned.
const ABANDONED_AFTER: Duration = Duration::from_secs(60);

/// How long ago the namespace `name` in `/run/netns` was made: its pinned inode (nsfs) is made when the runtime
/// mounts it there, and so carries that time.
fn age(name: &str) -> Option<Duration> {
    let made = std::fs::metadata(format!("{}/{name}", crate::netns::NETNS_RUN_DIR))
        .and_then(|m| m.modified())
        .ok()?;
    Some(
        std::time::SystemTime::now()
            .duration_since(made)
            .unwrap_or_default(),
    )
}

impl Drop for RuntimeNetns {
    /// Removes those left empty long enough; while younger ones are empty, waits for each to be filled or removed
    /// by its runtime, or to be old enough (at most [`ABANDONED_AFTER`] and a few seconds).
    fn drop(&mut self) {
        let deadline = Instant::now() + ABANDONED_AFTER + Duration::from_secs(5);
        let mut removed = Vec::new();
        loop {
            removed.extend(self.remove(ABANDONED_AFTER));
            let young = self.left();
            if young.is_empty() || Instant::now() >= deadline {
                if !young.is_empty() {
                    eprintln!("cleanup: left the young empty namespaces {young:?} (another test's, or made late)");
                }
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        if !removed.is_empty() {
            eprintln!("cleanup: removed the runtime's namespaces {removed:?}");
        }
    }
}

/// The network namespaces processes are in, as their `/proc/<pid>/ns/net` links read (`net:[<inode>]`).
fn netns_in_use() -> std::collections::HashSet<std::ffi::OsString> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|p| std::fs::read_link(p.path().join("ns/net")).ok())
        .map(PathBuf::into_os_string)
        .collect()
}

/// Whether the namespace `name` in `/run/netns` has no interface but `lo`, and is none of `in_use`.
fn left_empty(name: &str, in_use: &std::collections::HashSet<std::ffi::OsString>) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(links) = Command::new("ip").args(["-n", name, "-o", "link"]).output() else {
        return false;
    };
    let links = String::from_utf8_lossy(&links.stdout).into_owned();
    let links: Vec<&str> = links.lines().filter(|l| !l.trim().is_empty()).collect();
    if !matches!(links.as_slice(), [lo] if lo.starts_with("1: lo:")) {
        return false;
    }
    std::fs::metadata(format!("{}/{name}", crate::netns::NETNS_RUN_DIR))
        .is_ok_and(|ns| !in_use.contains(std::ffi::OsStr::new(&format!("net:[{}]", ns.ino()))))
}

/// `8-4-4-4-12` hex digits.
fn is_uuid(name: &str) -> bool {
    let groups: Vec<&str> = name.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The second tag of the project's image: the same build, as a rolling update moves from one tag to another.
pub const IMAGE_2: &str = "plexus.test/plexus:2";

/// The policy hook an operator installs, before the DaemonSet's pod starts: a key pair, the namespace-isolation
/// guest pushed to `registry` signed with its private key (`plexus hook push --key`), the public key in ConfigMap
/// `kube-system/plexus-hook-keys` (which the DaemonSet mounts at `--hook-key`), and NetworkHook [`POLICY_HOOK`].
fn enforce_isolation(api: &KubeApiServer, registry: &Registry, dir: &Path) {
    let (key, public) = key_pair(dir, "operator");
    let reference = registry.push_hook(
        &guest_wasm("namespace-isolation"),
        "hooks/isolation:1",
        Some(&key),
    );
    let pem = std::fs::read_to_string(&public).unwrap();
    api.create(&json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "plexus-hook-keys", "namespace": "kube-system"},
        "data": {"operator.pub": pem},
    }));
    api.wait_for("/apis/plexus.dev/v1alpha1/networkhooks");
    api.create(&json!({
        "apiVersion": "plexus.dev/v1alpha1", "kind": "NetworkHook",
        "metadata": {"name": POLICY_HOOK},
        "spec": {"kind": "policy", "module": reference},
    }));
}

impl DsNode {
    pub fn start(kind: RuntimeKind) -> DsNode {
        DsNode::start_with_cache_mib(kind, None)
    }

    /// [`DsNode::start`], with Plexus's `cacheDir` (`/var/lib/plexus`) on a file system of its own of `mib` MiB
    /// when given, which a test can fill ([`DsNode::fill_cache`]).
    pub fn start_with_cache_mib(kind: RuntimeKind, mib: Option<u32>) -> DsNode {
        DsNode::start_with(kind, mib, false)
    }

    /// [`DsNode::start_with_cache_mib`], and with `devices`, the devices of the module's header and what allocates
    /// them.
    pub fn start_with(kind: RuntimeKind, mib: Option<u32>, devices: bool) -> DsNode {
        DsNode::start_in(kind, mib, devices, Mode::Cni)
    }

    /// A node to install Plexus on in NRI mode ([`Mode::Nri`]); no DaemonSet pod yet.
    pub fn start_nri(kind: RuntimeKind) -> DsNode {
        DsNode::start_in(kind, None, false, Mode::Nri)
    }

    /// [`DsNode::start_with`], Plexus to be installed in `mode`.
    pub fn start_in(kind: RuntimeKind, mib: Option<u32>, devices: bool, mode: Mode) -> DsNode {
        require_root_and_plugins();
        let runtime_netns = RuntimeNetns::from_now();
        // What this run covers: the manifest once failed where the root mount is private.
        eprintln!(
            "root mount: {}, /run/netns: {}",
            propagation("/"),
            propagation("/run/netns")
        );
        // The daemon runs delegates, privileged as a CNI plugin is (a cluster that runs CNI DaemonSets allows it).
        let api = KubeApiServer::start(&[], &["--allow-privileged=true"]);
        api.apply_file(&deploy_manifest("crds.yaml"));
        api.apply_file(&deploy_manifest("networkhooks.yaml"));
        api.apply_file(&deploy_manifest("rbac.yaml"));
        api.apply_node_authority();
        api.namespace(NS);

        let dir = tempfile::Builder::new()
            .prefix("plx-ds-")
            .tempdir_in("/var/tmp")
            .unwrap();
        let root = dir.path().join("node");
        let node = |p: &str| root.join(p.trim_start_matches('/'));
        for d in NODE_DIRS {
            std::fs::create_dir_all(node(d)).unwrap();
        }
        // Mounted before the DaemonSet's pod starts, so that its hostPath mount holds it too. Mode 0755 as a disk's
        // root is: compiled hooks are kept only in a directory nobody else may write (a tmpfs's default is 1777).
        let cache_fs = mib.map(|mib| {
            let at = node("/var/lib/plexus");
            let status = Command::new("mount")
                .args([
                    "-t",
                    "tmpfs",
                    "-o",
                    &format!("size={mib}m,mode=0755"),
                    "tmpfs",
                ])
                .arg(&at)
                .status()
                .expect("mount");
            assert!(status.success(), "mount a tmpfs at {}", at.display());
            Tmpfs(at)
        });
        // The plugins as files (a symlink to a host path would not resolve in the daemon's container).
        for plugin in ["bridge", "host-local", "loopback"] {
            std::fs::copy(
                Path::new(cni_bin_dir()).join(plugin),
                node("/opt/cni/bin").join(plugin),
            )
            .unwrap();
        }
        let ipam = IpamDir::new();
        let bridges: Vec<(&str, HostBridge)> = ["cluster-net", "net-a", "net-b", "net-c"]
            .into_iter()
            .zip(["dcl", "dna", "dnb", "dnc"])
            .map(|(net, tag)| (net, HostBridge::reserve(tag)))
            .collect();
        // CNI 1.1, as the reference plugins of the suite speak it: a runtime's GC then names the attachments
        // still valid, which releases those of sandboxes the runtime lost (CRI-O's start-up GC).
        let confs: Vec<Value> = bridges
            .iter()
            .map(|(name, bridge)| {
                let mut conf = bridge_host_local(name, bridge, &ipam);
                conf["cniVersion"] = json!("1.1.0");
                conf
            })
            .collect();
        let prefixes = confs
            .iter()
            .map(|c| {
                let subnet = c["plugins"][0]["ipam"]["ranges"][0][0]["subnet"]
                    .as_str()
                    .unwrap();
                format!("{}.", subnet.rsplit_once('.').unwrap().0)
            })
            .collect();
        std::fs::write(
            node("/etc/cni/net.d").join("10-cluster.conflist"),
            confs[0].to_string(),
        )
        .unwrap();
        for (i, name) in ["net-a", "net-b", "net-c"].into_iter().enumerate() {
            if devices && name == "net-b" {
                api.create(&json!({
                    "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                    "metadata": {"name": name, "namespace": NS,
                        "annotations": {"k8s.v1.cni.cncf.io/resourceName": RESOURCE}},
                    "spec": {"config": confs[i + 1].to_string()}
                }));
            } else {
                api.nad(NS, name, &confs[i + 1]);
            }
        }
        if devices {
            api.create(&json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": DRIVER},
                "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}]}
            }));
            api.create(&json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": CLAIM_TEMPLATE, "namespace": NS},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "nic", "exactly": {"deviceClassName": DRIVER}}]}}}
            }));
        }
        api.namespace("other");
        api.nad("other", "net-c", &confs[3]);
        let registry = Registry::start();
        enforce_isolation(&api, &registry, dir.path());

        let runtime = Runtime::start(kind, &node("/opt/cni/bin"), &node("/etc/cni/net.d"));
        let image_tar = dir.path().join("plexus.tar");
        image::build(&image_tar);
        runtime.load_image(&image_tar, image::IMAGE);
        runtime.load_image(&image_tar, IMAGE_2);
        let kubelet = Kubelet::start(&api, &runtime.socket());
        let dra = devices.then(|| {
            let at = dir.path().join("control");
            std::fs::create_dir_all(&at).unwrap();
            let control = vec![
                Component::scheduler(&api, &at),
                Component::controller_manager(
                    &api,
                    &at,
                    // The node lifecycle controller takes the not-ready taint off once the node is Ready.
                    &[
                        "resourceclaim-controller",
                        "garbage-collector-controller",
                        "node-lifecycle-controller",
                    ],
                ),
            ];
            let names: Vec<(String, String)> = (0..DEVICES)
                .map(|i| (format!("nic{i}"), format!("0000:01:{i:02x}.0")))
                .collect();
            let list: Vec<(&str, &str)> = names
                .iter()
                .map(|(n, p)| (n.as_str(), p.as_str()))
                .collect();
            let driver = DraDriver::start(
                &api,
                &kubelet,
                DRIVER,
                RESOURCE,
                &list,
                dir.path().join("dra"),
            );
            (control, driver)
        });
        DsNode {
            kind,
            mode,
            kubelet,
            runtime,
            runtime_netns,
            api,
            ipam,
            bridges,
            prefixes,
            _cache_fs: cache_fs,
            registry,
            dra,
            root,
            _dir: dir,
        }
    }

    /// The ResourceClaims of `namespace` (0 when the API server does not answer).
    pub fn claims(&self, namespace: &str) -> usize {
        let path = format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims");
        get(&self.api, &path)
            .and_then(|l| l["items"].as_array().map(Vec::len))
            .unwrap_or(0)
    }

    /// Waits (at most `limit`) until the node daemon's pod cache holds as many pods as the API server has on the
    /// node; whether it did. Meant for when no pod is being created or deleted: the counts then meet once the
    /// daemon's watch has delivered every pod the server has.
    pub fn wait_for_daemon_pod_cache(&self, limit: Duration) -> bool {
        let socket = self.node("/run/plexus").join("daemon.sock");
        let path = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}");
        let deadline = Instant::now() + limit;
        let mut last = (None, None);
        while Instant::now() < deadline {
            let cached = crate::plexus::daemon_health(&socket).map(|h| h.cache.pods);
            let listed = get(&self.api, &path).and_then(|l| l["items"].as_array().map(Vec::len));
            if cached.is_some() && cached == listed {
                return true;
            }
            last = (cached, listed);
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!(
            "the daemon's pod cache did not meet the API server's pods of the node within {limit:?}: (cached, listed) {last:?}"
        );
        false
    }

    /// Whether the node runs [`POLICY_HOOK`] in its ADDs, as its own NodeHookStatus says.
    pub fn policy_active(&self) -> bool {
        let path = format!("/apis/plexus.dev/v1alpha1/nodehookstatuses/{NODE}");
        get(&self.api, &path).is_some_and(|report| {
            report["status"]["hooks"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|h| h["name"] == POLICY_HOOK && h["active"] == true)
        })
    }

    /// A node directory of [`NODE_DIRS`] as the test moved it.
    pub fn node(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    /// The DaemonSet's pod `name` running `image`. The pod first, then its token: one the API server binds to that
    /// pod on this node (the node-authority policy is installed), as the kubelet's projection of a
    /// service-account token would be, in a secret of the pod's own. The kubelet waits for the secret to mount it.
    pub fn run_daemon_pod(&self, name: &str, image: &str) {
        let token_secret = format!("{name}-token");
        let nri_socket = (self.mode == Mode::Nri).then(|| self.runtime.nri_socket());
        if nri_socket.is_some() {
            self.nri_conf();
        }
        let spec = daemonset_pod(
            &self.root,
            &self.api,
            self.ipam.path(),
            &self.registry.addr,
            name,
            image,
            &token_secret,
            nri_socket.as_deref(),
        );
        let pod = self.api.create(&spec);
        let answer = self.api.must(
            "POST",
            "/api/v1/namespaces/kube-system/serviceaccounts/plexus/token",
            Some(&json!({
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": 3600, "boundObjectRef": {
                    "apiVersion": "v1", "kind": "Pod",
                    "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}}
            })),
        );
        let token = answer["status"]["token"].as_str().unwrap().to_string();
        let ca = std::fs::read(self.api.ca_cert()).unwrap();
        self.api.create(&json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": token_secret, "namespace": "kube-system"},
            // What a service account's token volume holds.
            "data": {"token": base64(token.as_bytes()), "ca.crt": base64(&ca),
                     "namespace": base64(b"kube-system")},
        }));
    }

    /// NRI mode's ConfigMap, as the manifest has it with the node's directories moved and the node's cluster
    /// network named; created once.
    fn nri_conf(&self) {
        let mut map = manifest_object(true, "ConfigMap");
        let name = map["metadata"]["name"].as_str().unwrap().to_string();
        let path = format!("/api/v1/namespaces/kube-system/configmaps/{name}");
        if get(&self.api, &path).is_some() {
            return;
        }
        let mut conf: Value =
            serde_json::from_str(map["data"]["plexus.json"].as_str().unwrap()).unwrap();
        move_node_dirs(&mut conf, &self.root);
        conf["clusterNetwork"] = json!("cluster-net");
        map["data"]["plexus.json"] = json!(conf.to_string());
        self.api.create(&map);
    }

    pub fn logs(&self, daemon_pod: &str) -> String {
        self.logs_of_pods(&format!("kube-system_{daemon_pod}_"))
    }

    /// The logs of the pods whose log directory starts with `prefix`, the kubelet's and the runtime's.
    fn logs_of_pods(&self, prefix: &str) -> String {
        let log = self.runtime.log();
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "the DaemonSet's pod:\n{}\nkubelet:\n{}\n{}:\n{}",
            container_logs(prefix),
            self.kubelet.log_tail(30),
            self.kind.name(),
            lines[lines.len().saturating_sub(30)..].join("\n")
        )
    }

    /// Waits (at most `secs`) until `ok` holds; names what was awaited and shows the logs if it does not.
    #[track_caller]
    pub fn within(&self, secs: u64, what: &str, daemon_pod: &str, ok: &dyn Fn() -> bool) {
        let start = Instant::now();
        while !ok() {
            assert!(
                start.elapsed() < Duration::from_secs(secs),
                "{what}: not within {secs} s\n{}",
                self.logs(daemon_pod)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The node rebooted: every process of the node stopped at once (kill -9: the kubelet, the runtime, its shims
    /// and containers, the daemon with them, the CNI invocations in flight), what lives in `/run` gone (the runtime's state, Plexus's `runDir`, the
    /// pods' network namespaces, and with them their interfaces), then the runtime and the kubelet started again.
    /// Disks stay: the runtime's root, the kubelet's, Plexus's `cacheDir`, the host-local store.
    pub fn reboot(&self) {
        self.kubelet.power_off();
        self.runtime.power_off();
        // The CNI invocations in flight (plexus and its delegates, which outlive a killed runtime) die too, and the
        // namespace each was attaching goes, whether or not its plan was written yet.
        for netns in kill_cni_invocations_under(&self.root) {
            remove_netns(&netns);
        }
        let attachments = self.node("/var/lib/plexus").join("attachments");
        for id in list_cache(&attachments) {
            let plan = read_cached_plan(&attachments, id.trim_end_matches(".json"));
            if let Some(netns) = plan.as_ref().and_then(|p| p["netns"].as_str()) {
                remove_netns(netns);
            }
        }
        // And every other namespace the runtime made: `/run/netns` is emptied.
        self.runtime_netns.remove_at_reboot();
        let run = self.node("/run/plexus");
        for entry in std::fs::read_dir(&run).into_iter().flatten().flatten() {
            let path = entry.path();
            let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
        }
        self.runtime.power_on();
        self.kubelet.power_on(&self.api);
    }

    /// Fills `cacheDir`'s file system (one file, written until the disk is full); returns the file, whose removal
    /// frees the space again.
    pub fn fill_cache(&self) -> PathBuf {
        let fill = self.node("/var/lib/plexus").join("fill");
        let _ = Command::new("dd")
            .args(["if=/dev/zero", "bs=1M", "status=none"])
            .arg(format!("of={}", fill.display()))
            .status();
        fill
    }

    /// The node's networks: the cluster network's and the NADs' (each a bridge with a host-local range).
    pub fn networks(&self) -> Vec<&'static str> {
        self.bridges.iter().map(|(n, _)| *n).collect()
    }

    /// Host ends of veths on the node's bridges: one per pod and network while pods are attached.
    pub fn bridge_ports(&self) -> usize {
        self.bridges
            .iter()
            .map(|(_, b)| host_links_on_bridge(b.name()).len())
            .sum()
    }

    /// The logs of every DaemonSet pod there was, the kubelet's and the runtime's, for failure messages.
    pub fn logs_of_daemons(&self) -> String {
        self.logs_of_pods("kube-system_plexus-")
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        get(
            &self.api,
            &format!("/api/v1/namespaces/{namespace}/pods/{name}"),
        )
    }
}

/// The last lines of each container log kubelet wrote for the pod whose log directory starts with `prefix`.
pub fn container_logs(prefix: &str) -> String {
    let mut out = String::new();
    for pod in std::fs::read_dir("/var/log/pods")
        .into_iter()
        .flatten()
        .flatten()
    {
        if !pod.file_name().to_string_lossy().starts_with(prefix) {
            continue;
        }
        for container in std::fs::read_dir(pod.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            for log in std::fs::read_dir(container.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                out.push_str(&format!(
                    "{}:\n{}\n",
                    log.path().display(),
                    tail(&log.path(), 600)
                ));
            }
        }
    }
    out
}
