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
use std::path::PathBuf;

use plexus_tests::daemonset::{get, interfaces, ready, DsNode, DENIAL, FORBIDDEN_NAD, NS};
use plexus_tests::image;
use plexus_tests::kubelet::{pod_on_node, NODE};
use plexus_tests::plexus::{list_cache, read_cached_plan};
use plexus_tests::runtime::RuntimeKind;
use serde_json::{json, Value};

const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";

plexus_tests::on_each_runtime!(
    the_daemonsets_pod_is_ready_and_runs_pods_on_a_node_whose_root_mount_is_private,
    the_nri_daemonsets_pod_attaches_a_pods_networks_beside_the_runtimes_cluster_network,
);

/// examples/deploy/nri-daemonset.yaml on a node whose CNI configuration is the cluster network's alone: the
/// daemon's pod goes Ready and registers with the runtime's NRI; a pod with two NADs gets them beside the cluster
/// network the runtime attached, and its network-status; the node's policy hook (delivered by the daemon's agent)
/// fails a pod selecting a NAD of another namespace; a third network is attached to the running pod; once the pod
/// is deleted nothing is left. Nothing of Plexus is installed into the node's CNI dirs.
fn the_nri_daemonsets_pod_attaches_a_pods_networks_beside_the_runtimes_cluster_network(
    kind: RuntimeKind,
) {
    let ds = DsNode::start_nri(kind);
    let (api, ipam) = (&ds.api, &ds.ipam);
    let node = |p: &str| ds.node(p);
    let prefix = |i: usize| ds.prefixes[i].clone();
    let daemon = format!("plexus-nri-{NODE}");
    ds.run_daemon_pod(&daemon, image::IMAGE);
    let within = |secs: u64, what: &str, ok: &dyn Fn() -> bool| ds.within(secs, what, &daemon, ok);
    let daemon_pod = format!("/api/v1/namespaces/kube-system/pods/{daemon}");
    within(60, "the DaemonSet's pod Ready and registered", &|| {
        get(api, &daemon_pod).is_some_and(|p| ready(&p))
            && ds
                .logs(&daemon)
                .contains("registered with the runtime's NRI")
    });
    within(60, "the node's policy hook in force", &|| {
        ds.policy_active()
    });
    let installed: Vec<_> = std::fs::read_dir(node("/etc/cni/net.d"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        installed,
        ["10-cluster.conflist"],
        "the node's CNI conf untouched"
    );
    assert!(!node("/opt/cni/bin/plexus").exists());

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
        api.network_status(NS, "web")
            == [
                ("cluster-net".to_string(), "eth0".to_string()),
                (format!("{NS}/net-a"), "net1".to_string()),
                (format!("{NS}/net-b"), "net2".to_string()),
            ]
    });

    // The policy hook the daemon's agent delivered denies a NAD of another namespace: the sandbox fails.
    api.create(&pod_on_node(NS, "denied", FORBIDDEN_NAD));
    within(60, "the denied pod's sandbox failing", &|| {
        api.events_of(NS, "denied", "FailedCreatePodSandBox")
            .iter()
            .any(|(_, m)| m.contains(DENIAL))
    });

    let patch = json!({"metadata": {"annotations": {NETWORKS: "net-a,net-b,net-c"}}});
    let (code, body) = api.request("PATCH", &web_path, Some(&patch)).unwrap();
    assert_eq!(code, 200, "{body}");
    within(60, "net-c attached by the daemon", &|| {
        has("net3", &prefix(3))
    });

    for pod in [&web_path, &format!("/api/v1/namespaces/{NS}/pods/denied")] {
        let (code, body) = api.request("DELETE", pod, None).unwrap();
        assert_eq!(code, 200, "{body}");
    }
    within(90, "the pods gone and their addresses released", &|| {
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
