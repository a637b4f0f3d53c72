//! The DaemonSet as an operator installs it, on each runtime: the project's image in a real containerd or CRI-O, the
//! pod of
//! examples/deploy/daemonset.yaml run by a real kubelet (1.37) against a real API server with the project's CRDs
//! and RBAC. Its init container installs the CNI plugin and the conflist onto the node, its daemon goes Ready, a
//! pod with two NADs starts through the installed plugin, and the daemon, in its container, attaches a third
//! network to that pod's namespace, which the runtime made after the daemon had started: the `/run/netns` mount
//! with HostToContainer propagation at work. On this kind of machine the root mount is private and only
//! `/run/netns` is shared (the case the manifest once failed on).
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
//!   loopback; the networks' host-local store is one more host directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use plexus_node::install::base64;
use plexus_tests::kubeapi::KubeApiServer;
use plexus_tests::kubelet::{pod_on_node, Kubelet, NODE};
use plexus_tests::netns::{
    bridge_host_local, cni_bin_dir, links_at, require_root_and_plugins, HostBridge, IpamDir,
};
use plexus_tests::plexus::{list_cache, read_cached_plan};
use plexus_tests::runtime::{Runtime, RuntimeKind};
use plexus_tests::{deploy_manifest, image, tail};
use serde_json::{json, Value};

const NS: &str = "team";
const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
/// The node directories the DaemonSet mounts that the test gives its own directory.
const NODE_DIRS: [&str; 5] = [
    "/opt/cni/bin",
    "/etc/cni/net.d",
    "/var/lib/cni",
    "/run/plexus",
    "/var/lib/plexus",
];

/// The mount's propagation (`shared`, `private`, ...) of the mount point that holds `path`.
fn propagation(path: &str) -> String {
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
fn daemonset_pod(
    root: &Path,
    api: &KubeApiServer,
    ipam: &Path,
    name: &str,
    image: &str,
    token: &str,
) -> Value {
    let text = std::fs::read_to_string(deploy_manifest("daemonset.yaml")).unwrap();
    let ds: Value = serde_saphyr::from_str(&text).unwrap();
    let mut spec = ds["spec"]["template"]["spec"].clone();
    move_node_dirs(&mut spec, root);
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
        for c in spec[list].as_array_mut().unwrap() {
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

fn get(api: &KubeApiServer, path: &str) -> Option<Value> {
    match api.request("GET", path, None) {
        Ok((200, body)) => serde_json::from_str(&body).ok(),
        _ => None,
    }
}

fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// Interface names with their IPv4 addresses in the namespace at `netns`.
fn interfaces(netns: &Path) -> Vec<(String, Vec<String>)> {
    links_at(netns)
        .into_iter()
        .map(|l| {
            let cidrs = l.cidrs().into_iter().filter(|c| !c.contains(':')).collect();
            (l.ifname, cidrs)
        })
        .collect()
}

plexus_tests::on_each_runtime!(
    the_daemonsets_pod_is_ready_and_runs_pods_on_a_node_whose_root_mount_is_private,
    a_rolling_update_of_the_daemonset_fails_no_pod,
);

/// A node with the DaemonSet's directories, the cluster network's conf and three NADs, the runtime (the image in it
/// under two tags, [`image::IMAGE`] and [`IMAGE_2`]) and a kubelet; no DaemonSet pod yet. Fields drop in order:
/// kubelet (it must not start pods again), the runtime (its sandboxes' DEL runs the installed plugin), the API
/// server, the host's bridges and store, and last the node's directories.
struct DsNode {
    kind: RuntimeKind,
    kubelet: Kubelet,
    runtime: Runtime,
    api: KubeApiServer,
    ipam: IpamDir,
    _bridges: Vec<(&'static str, HostBridge)>,
    /// The subnet prefix (`a.b.c.`) of cluster-net, net-a, net-b, net-c.
    prefixes: Vec<String>,
    root: PathBuf,
    _dir: tempfile::TempDir,
}

/// The second tag of the project's image: the same build, as a rolling update moves from one tag to another.
const IMAGE_2: &str = "plexus.test/plexus:2";

impl DsNode {
    fn start(kind: RuntimeKind) -> DsNode {
        require_root_and_plugins();
        // What this run covers: the manifest once failed where the root mount is private.
        eprintln!(
            "root mount: {}, /run/netns: {}",
            propagation("/"),
            propagation("/run/netns")
        );
        // The daemon runs delegates, privileged as a CNI plugin is (a cluster that runs CNI DaemonSets allows it).
        let api = KubeApiServer::start(&[], &["--allow-privileged=true"]);
        api.apply_file(&deploy_manifest("crds.yaml"));
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
        let confs: Vec<Value> = bridges
            .iter()
            .map(|(name, bridge)| bridge_host_local(name, bridge, &ipam))
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
            api.nad(NS, name, &confs[i + 1]);
        }

        let runtime = Runtime::start(kind, &node("/opt/cni/bin"), &node("/etc/cni/net.d"));
        let image_tar = dir.path().join("plexus.tar");
        image::build(&image_tar);
        runtime.load_image(&image_tar, image::IMAGE);
        runtime.load_image(&image_tar, IMAGE_2);
        let kubelet = Kubelet::start(&api, &runtime.socket());
        DsNode {
            kind,
            kubelet,
            runtime,
            api,
            ipam,
            _bridges: bridges,
            prefixes,
            root,
            _dir: dir,
        }
    }

    /// A node directory of [`NODE_DIRS`] as the test moved it.
    fn node(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    /// The DaemonSet's pod `name` running `image`. The pod first, then its token: one the API server binds to that
    /// pod on this node (the node-authority policy is installed), as the kubelet's projection of a
    /// service-account token would be, in a secret of the pod's own. The kubelet waits for the secret to mount it.
    fn run_daemon_pod(&self, name: &str, image: &str) {
        let token_secret = format!("{name}-token");
        let spec = daemonset_pod(
            &self.root,
            &self.api,
            self.ipam.path(),
            name,
            image,
            &token_secret,
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

    fn logs(&self, daemon_pod: &str) -> String {
        let log = self.runtime.log();
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "the DaemonSet's pod:\n{}\nkubelet:\n{}\n{}:\n{}",
            container_logs(&format!("kube-system_{daemon_pod}_")),
            self.kubelet.log_tail(30),
            self.kind.name(),
            lines[lines.len().saturating_sub(30)..].join("\n")
        )
    }

    /// Waits (at most `secs`) until `ok` holds; names what was awaited and shows the logs if it does not.
    #[track_caller]
    fn within(&self, secs: u64, what: &str, daemon_pod: &str, ok: &dyn Fn() -> bool) {
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

    fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        get(
            &self.api,
            &format!("/api/v1/namespaces/{namespace}/pods/{name}"),
        )
    }
}

fn the_daemonsets_pod_is_ready_and_runs_pods_on_a_node_whose_root_mount_is_private(
    kind: RuntimeKind,
) {
    let ds = DsNode::start(kind);
    let (api, ipam) = (&ds.api, &ds.ipam);
    let node = |p: &str| ds.node(p);
    let prefix = |i: usize| ds.prefixes[i].clone();
    let daemon = format!("plexus-{NODE}");
    ds.run_daemon_pod(&daemon, image::IMAGE);
    let within = |secs: u64, what: &str, ok: &dyn Fn() -> bool| ds.within(secs, what, &daemon, ok);
    let daemon_pod = format!("/api/v1/namespaces/kube-system/pods/{daemon}");
    within(60, "the DaemonSet's pod Ready", &|| {
        get(api, &daemon_pod).is_some_and(|p| ready(&p))
    });
    let pod = get(api, &daemon_pod).unwrap();
    assert!(
        pod["status"]["containerStatuses"][0]["restartCount"] == 0,
        "{}",
        pod["status"]
    );

    // The init container installed the plugin and the conflist, which leads to the daemon's moved directories.
    let conflist: Value = serde_json::from_slice(
        &std::fs::read(node("/etc/cni/net.d").join("00-plexus.conflist")).unwrap(),
    )
    .unwrap();
    let plexus = &conflist["plugins"][0];
    assert_eq!(plexus["type"], "plexus");
    assert_eq!(plexus["runDir"], json!(node("/run/plexus")));
    assert_eq!(plexus["cacheDir"], json!(node("/var/lib/plexus")));
    assert!(node("/opt/cni/bin/plexus").is_file());
    assert!(node("/run/plexus/daemon.sock").exists());

    // A pod with two NADs, started by kubelet through the installed plugin.
    let web = pod_on_node(NS, "web", "net-a,net-b");
    api.create(&web);
    let web_path = format!("/api/v1/namespaces/{NS}/pods/web");
    within(90, "the pod with two NADs Running", &|| {
        get(api, &web_path).is_some_and(|p| p["status"]["phase"] == "Running")
    });
    let attachments = node("/var/lib/plexus").join("attachments");
    let ids = list_cache(&attachments);
    assert_eq!(ids.len(), 1, "one sandbox: {ids:?}");
    let plan = read_cached_plan(&attachments, ids[0].trim_end_matches(".json")).unwrap();
    let netns = PathBuf::from(plan["netns"].as_str().unwrap());
    let has = |ifname: &str, prefix: &str| {
        interfaces(&netns)
            .iter()
            .any(|(n, cidrs)| n == ifname && cidrs.iter().any(|c| c.starts_with(prefix)))
    };
    for (ifname, i) in [("eth0", 0), ("net1", 1), ("net2", 2)] {
        assert!(
            has(ifname, &prefix(i)),
            "{ifname}: {:?}",
            interfaces(&netns)
        );
    }
    within(30, "the network-status of three networks", &|| {
        api.network_status(NS, "web").len() == 3
    });

    // The daemon, in its container, attaches a third network in the namespace made after it started.
    let patch = json!({"metadata": {"annotations": {NETWORKS: "net-a,net-b,net-c"}}});
    let (code, body) = api.request("PATCH", &web_path, Some(&patch)).unwrap();
    assert_eq!(code, 200, "{body}");
    within(60, "net-c attached by the daemon", &|| {
        has("net3", &prefix(3))
    });
    within(30, "net-c in the network-status", &|| {
        api.network_status(NS, "web")
            .contains(&(format!("{NS}/net-c"), "net3".to_string()))
    });

    // Deleted: every address released, the plan gone.
    let (code, body) = api.request("DELETE", &web_path, None).unwrap();
    assert_eq!(code, 200, "{body}");
    within(90, "the pod gone and its addresses released", &|| {
        get(api, &web_path).is_none()
            && ["cluster-net", "net-a", "net-b", "net-c"]
                .iter()
                .all(|n| ipam.reserved_ips(n).is_empty())
            && list_cache(&attachments).is_empty()
    });
    let (code, body) = api.request("DELETE", &daemon_pod, None).unwrap();
    assert_eq!(code, 200, "{body}");
    within(60, "the DaemonSet's pod gone", &|| {
        get(api, &daemon_pod).is_none()
    });
}

/// A rolling update of the DaemonSet on a node, as its controller does it with `maxUnavailable: 1`: the old pod is
/// deleted, and once it is gone the new one (the image's second tag) is created and becomes Ready; pods are created
/// all the while, one every 250 ms, each with the cluster network and two NADs. No pod's sandbox fails (the CNI
/// plugin plans by itself while no daemon answers, and the hook set on disk stays in force: an ADD is never refused
/// for want of one), each pod ends Running with its three networks in its network-status (the status writes of the
/// gap are delivered), and once they are deleted nothing is held.
fn a_rolling_update_of_the_daemonset_fails_no_pod(kind: RuntimeKind) {
    let ds = DsNode::start(kind);
    let old = format!("plexus-{NODE}");
    ds.run_daemon_pod(&old, image::IMAGE);
    ds.within(60, "the old DaemonSet pod Ready", &old, &|| {
        ds.pod("kube-system", &old).is_some_and(|p| ready(&p))
    });

    let new = format!("plexus-{NODE}-2");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let created: Vec<String> = std::thread::scope(|scope| {
        let churn = scope.spawn(|| {
            let mut names = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let name = format!("churn-{}", names.len());
                ds.api.create(&pod_on_node(NS, &name, "net-a,net-b"));
                names.push(name);
                std::thread::sleep(Duration::from_millis(250));
            }
            names
        });
        // Some pods under the old daemon, then the update.
        std::thread::sleep(Duration::from_secs(2));
        let (code, body) = ds
            .api
            .request(
                "DELETE",
                &format!("/api/v1/namespaces/kube-system/pods/{old}"),
                None,
            )
            .unwrap();
        assert_eq!(code, 200, "{body}");
        ds.within(60, "the old DaemonSet pod gone", &old, &|| {
            ds.pod("kube-system", &old).is_none()
        });
        ds.run_daemon_pod(&new, IMAGE_2);
        ds.within(60, "the new DaemonSet pod Ready", &new, &|| {
            ds.pod("kube-system", &new).is_some_and(|p| ready(&p))
        });
        // Some pods under the new daemon.
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        churn.join().unwrap()
    });
    eprintln!(
        "{}: {} pods created during the update",
        kind.name(),
        created.len()
    );
    assert!(created.len() >= 10, "{created:?}");

    ds.within(120, "every pod of the churn Running", &new, &|| {
        created.iter().all(|n| {
            ds.pod(NS, n)
                .is_some_and(|p| p["status"]["phase"] == "Running")
        })
    });
    let failed: Vec<(String, String)> = created
        .iter()
        .flat_map(|n| ds.api.events_of(NS, n, "FailedCreatePodSandBox"))
        .collect();
    assert_eq!(failed, vec![], "no sandbox failed during the update");
    ds.within(
        60,
        "every pod's network-status of three networks",
        &new,
        &|| {
            created
                .iter()
                .all(|n| ds.api.network_status(NS, n).len() == 3)
        },
    );
    let new_pod = ds.pod("kube-system", &new).unwrap();
    assert_eq!(
        new_pod["status"]["containerStatuses"][0]["restartCount"], 0,
        "{}",
        new_pod["status"]
    );

    for n in &created {
        let (code, body) = ds
            .api
            .request("DELETE", &format!("/api/v1/namespaces/{NS}/pods/{n}"), None)
            .unwrap();
        assert_eq!(code, 200, "{body}");
    }
    let attachments = ds.node("/var/lib/plexus").join("attachments");
    ds.within(
        120,
        "the pods gone and their addresses released",
        &new,
        &|| {
            created.iter().all(|n| ds.pod(NS, n).is_none())
                && ["cluster-net", "net-a", "net-b"]
                    .iter()
                    .all(|n| ds.ipam.reserved_ips(n).is_empty())
                && list_cache(&attachments).is_empty()
        },
    );
}

/// The last lines of each container log kubelet wrote for the pod whose log directory starts with `prefix`.
fn container_logs(prefix: &str) -> String {
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
                    tail(&log.path(), 15)
                ));
            }
        }
    }
    out
}
