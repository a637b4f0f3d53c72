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

/// The DaemonSet's pod template as a pod bound to [`NODE`], with the stand-ins of the module's header.
fn daemonset_pod(root: &Path, api: &KubeApiServer, ipam: &Path) -> Value {
    let text = std::fs::read_to_string(deploy_manifest("daemonset.yaml")).unwrap();
    let ds: Value = serde_saphyr::from_str(&text).unwrap();
    let mut spec = ds["spec"]["template"]["spec"].clone();
    move_node_dirs(&mut spec, root);
    spec["nodeName"] = json!(NODE);
    spec["automountServiceAccountToken"] = json!(false);
    spec["volumes"].as_array_mut().unwrap().extend([
        json!({"name": "sa-token", "secret": {"secretName": "plexus-token"}}),
        json!({"name": "ipam", "hostPath": {"path": ipam, "type": "Directory"}}),
    ]);
    let service = [
        json!({"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}),
        json!({"name": "KUBERNETES_SERVICE_PORT", "value": api.port().to_string()}),
    ];
    for list in ["initContainers", "containers"] {
        for c in spec[list].as_array_mut().unwrap() {
            c["image"] = json!(image::IMAGE);
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
        "metadata": {"name": format!("plexus-{NODE}"), "namespace": "kube-system",
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
    the_daemonsets_pod_is_ready_and_runs_pods_on_a_node_whose_root_mount_is_private
);

fn the_daemonsets_pod_is_ready_and_runs_pods_on_a_node_whose_root_mount_is_private(
    kind: RuntimeKind,
) {
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
    let prefix = |i: usize| {
        let subnet = confs[i]["plugins"][0]["ipam"]["ranges"][0][0]["subnet"]
            .as_str()
            .unwrap();
        format!("{}.", subnet.rsplit_once('.').unwrap().0)
    };
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
    let kubelet = Kubelet::start(&api, &runtime.socket());

    // The pod first, then its token: one the API server binds to that pod on this node (the node-authority
    // policy is installed), as the kubelet's projection of a service-account token would be. The kubelet waits
    // for the secret to mount it.
    let pod = api.create(&daemonset_pod(&root, &api, ipam.path()));
    let answer = api.must(
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
    let ca = std::fs::read(api.ca_cert()).unwrap();
    api.create(&json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "plexus-token", "namespace": "kube-system"},
        // What a service account's token volume holds.
        "data": {"token": base64(token.as_bytes()), "ca.crt": base64(&ca),
                 "namespace": base64(b"kube-system")},
    }));

    let logs = || {
        let log = runtime.log();
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "the DaemonSet's pod:\n{}\nkubelet:\n{}\n{}:\n{}",
            container_logs(&format!("kube-system_plexus-{NODE}_")),
            kubelet.log_tail(30),
            kind.name(),
            lines[lines.len().saturating_sub(30)..].join("\n")
        )
    };
    let within = |secs: u64, what: &str, ok: &dyn Fn() -> bool| {
        let start = Instant::now();
        while !ok() {
            assert!(
                start.elapsed() < Duration::from_secs(secs),
                "{what}: not within {secs} s\n{}",
                logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let daemon_pod = format!("/api/v1/namespaces/kube-system/pods/plexus-{NODE}");
    within(60, "the DaemonSet's pod Ready", &|| {
        get(&api, &daemon_pod).is_some_and(|p| ready(&p))
    });
    let pod = get(&api, &daemon_pod).unwrap();
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
        get(&api, &web_path).is_some_and(|p| p["status"]["phase"] == "Running")
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
        get(&api, &web_path).is_none()
            && ["cluster-net", "net-a", "net-b", "net-c"]
                .iter()
                .all(|n| ipam.reserved_ips(n).is_empty())
            && list_cache(&attachments).is_empty()
    });
    let (code, body) = api.request("DELETE", &daemon_pod, None).unwrap();
    assert_eq!(code, 200, "{body}");
    within(60, "the DaemonSet's pod gone", &|| {
        get(&api, &daemon_pod).is_none()
    });
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
