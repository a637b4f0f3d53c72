//! Teardown through a real container runtime, each test on both: containerd 2 with its CRI plugin and runc, and
//! CRI-O with conmon and runc, plexus as their CNI plugin, driven over CRI as kubelet drives them (RunPodSandbox,
//! StopPodSandbox, RemovePodSandbox). The pod's networks are the reference bridge + host-local, the cluster source
//! the API server emulator over real HTTP.
//!
//! containerd calls DEL on StopPodSandbox and again on RemovePodSandbox (the second with an empty CNI_NETNS): the
//! repeated DEL these tests watch. CRI-O calls DEL once, at StopPodSandbox, and not again when the sandbox is
//! removed. Needs root, both runtimes, runc, conmon and busybox-static (tests/setup.sh, tests/parts.sh).

use std::path::PathBuf;

use plexus_tests::apiserver::{ApiServer, Fault};
use plexus_tests::containerd::cni_dirs;
use plexus_tests::netns::{bridge_host_local, require_root_and_plugins, HostBridge, IpamDir};
use plexus_tests::plexus::{plexus_bin, Sandbox};
use plexus_tests::runtime::{Runtime, RuntimeKind};
use serde_json::{json, Value};

const POD_NS: &str = "team";

/// One node: plexus's directories, the runtime's CNI dirs, two bridge networks, the API emulator.
struct Node {
    sb: Sandbox,
    ipam: IpamDir,
    _bridges: [HostBridge; 3],
    server: Option<ApiServer>,
    runtime: Runtime,
}

impl Node {
    /// A node whose pod `web` selects `networks` out of the NADs `side` and `gone` (both exist).
    fn new(kind: RuntimeKind, networks: &str) -> Node {
        require_root_and_plugins();
        let sb = Sandbox::new();
        let ipam = IpamDir::new();
        let bridges = [
            HostBridge::reserve("cdc"),
            HostBridge::reserve("cds"),
            HostBridge::reserve("cdg"),
        ];
        let net = |name: &str, bridge: &HostBridge| bridge_host_local(name, bridge, &ipam);
        sb.conf_file("00-cluster.conflist", &net("cluster-net", &bridges[0]));
        let server = ApiServer::start();
        server.add_pod(json!({"metadata": {
            "name": "web", "namespace": POD_NS, "uid": "uid-web",
            "annotations": {"k8s.v1.cni.cncf.io/networks": networks}
        }}));
        for (name, bridge) in [("side", &bridges[1]), ("gone", &bridges[2])] {
            server.add_nad(json!({
                "metadata": {"name": name, "namespace": POD_NS},
                "spec": {"config": net(name, bridge).to_string()}
            }));
        }
        server.write_kubeconfig(&sb.path("kubeconfig"));
        // The runtime's CNI dirs: plexus and the reference plugins in one bin dir, plexus's conflist.
        let plexus = sb.conf(json!({
            "logFile": sb.path("plexus.log"),
            "cluster": {"source": "kube", "kubeconfig": sb.path("kubeconfig"),
                        "requestTimeoutMs": 1000, "deadlineMs": 3000, "retries": 2,
                        "initialBackoffMs": 10, "maxBackoffMs": 20},
        }));
        let (bin, conf) = cni_dirs(&sb, &plexus_bin(), plexus);
        let runtime = Runtime::start(kind, &bin, &conf);
        Node {
            sb,
            ipam,
            _bridges: bridges,
            server: Some(server),
            runtime,
        }
    }

    fn server(&self) -> &ApiServer {
        self.server.as_ref().expect("the API server is up")
    }

    fn run(&mut self) -> String {
        self.runtime
            .run_pod_sandbox(POD_NS, "web", "uid-web")
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\nplexus: {}", self.plexus_log()))
    }

    /// StopPodSandbox then RemovePodSandbox, as kubelet does when the pod is deleted.
    fn stop_and_remove(&self, id: &str) {
        let cri = self.runtime.cri();
        cri.stop_pod_sandbox(id)
            .unwrap_or_else(|e| panic!("StopPodSandbox: {e}\nplexus: {}", self.plexus_log()));
        cri.remove_pod_sandbox(id)
            .unwrap_or_else(|e| panic!("RemovePodSandbox: {e}\nplexus: {}", self.plexus_log()));
    }

    fn plexus_log(&self) -> String {
        std::fs::read_to_string(self.sb.path("plexus.log")).unwrap_or_default()
    }

    /// (network, container id) of every host-local reservation.
    fn reservations(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for n in ["cluster-net", "side", "gone"] {
            for r in self.ipam.reservations(n) {
                out.push((n.to_string(), r.container_id));
            }
        }
        out
    }

    /// How many times plexus was invoked with `command` (from its log).
    fn invocations(&self, command: &str) -> usize {
        self.plexus_log()
            .matches(&format!("invoked command=\"{command}\""))
            .count()
    }

    fn cache_files(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.sb.path("cache/attachments"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    }
}

plexus_tests::on_each_runtime!(
    kubelets_sandbox_lifecycle_attaches_then_releases_everything,
    teardown_succeeds_with_the_api_hung_and_then_refused,
    teardown_after_the_cache_is_lost_and_a_nad_deleted_releases_the_rest,
    a_runtime_restart_between_add_and_teardown_leaks_nothing,
    a_failed_add_leaves_nothing_and_the_runtime_cleans_up_with_del,
);

fn kubelets_sandbox_lifecycle_attaches_then_releases_everything(kind: RuntimeKind) {
    let mut node = Node::new(kind, "side");
    let id = node.run();
    assert_eq!(
        node.reservations(),
        vec![
            ("cluster-net".to_string(), id.clone()),
            ("side".to_string(), id.clone())
        ]
    );
    let status = node.runtime.cri().pod_sandbox_status(&id).unwrap();
    let ip = status.status.unwrap().network.unwrap().ip;
    assert_eq!(
        node.ipam.reserved_ips("cluster-net"),
        vec![ip.parse::<std::net::IpAddr>().unwrap()],
        "the runtime's pod IP is the cluster network's"
    );
    let pod = node.server().pod(POD_NS, "web").unwrap();
    let st: Value = serde_json::from_str(
        pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(st.as_array().unwrap().len(), 2, "{st}");

    node.server().clear_requests();
    node.stop_and_remove(&id);
    assert_eq!(node.reservations(), vec![], "every address released");
    assert!(node.cache_files().is_empty(), "{:?}", node.cache_files());
    match kind {
        RuntimeKind::Containerd => {
            assert!(
                node.invocations("DEL") >= 2,
                "containerd calls DEL on stop and on remove:\n{}",
                node.plexus_log()
            );
            assert!(
                node.plexus_log()
                    .contains("DEL repeated after a completed DEL"),
                "the repeated DEL is answered from runDir"
            );
        }
        RuntimeKind::CriO => assert_eq!(
            node.invocations("DEL"),
            1,
            "CRI-O calls DEL once, on stop:\n{}",
            node.plexus_log()
        ),
    }
    assert!(
        node.server().requests().is_empty(),
        "teardown asked the API nothing: {:?}",
        node.server().requests()
    );
}

fn teardown_succeeds_with_the_api_hung_and_then_refused(kind: RuntimeKind) {
    let mut node = Node::new(kind, "side");
    let hung = node.run();
    node.server().inject("*", "*", Fault::Hang, usize::MAX);
    node.server().clear_requests();
    node.stop_and_remove(&hung);
    assert!(
        node.server().requests().is_empty(),
        "{:?}",
        node.server().requests()
    );
    assert_eq!(node.reservations(), vec![]);

    // A second pod, added while the API answers, torn down with the API gone.
    node.server = None;
    let server = ApiServer::start();
    server.add_pod(json!({"metadata": {
        "name": "web", "namespace": POD_NS, "uid": "uid-web",
        "annotations": {"k8s.v1.cni.cncf.io/networks": ""}
    }}));
    server.write_kubeconfig(&node.sb.path("kubeconfig"));
    let refused = node.run();
    assert_eq!(node.reservations().len(), 1, "{:?}", node.reservations());
    drop(server);
    node.stop_and_remove(&refused);
    assert_eq!(node.reservations(), vec![]);
    assert!(node.cache_files().is_empty());
}

fn teardown_after_the_cache_is_lost_and_a_nad_deleted_releases_the_rest(kind: RuntimeKind) {
    let mut node = Node::new(kind, "gone,side");
    let id = node.run();
    assert_eq!(node.reservations().len(), 3, "{:?}", node.reservations());
    std::fs::remove_dir_all(node.sb.path("cache")).unwrap();
    node.server().remove_nad(POD_NS, "gone");
    node.stop_and_remove(&id);
    // The deleted NAD's address cannot be released without its configuration: the only thing left, and named.
    assert_eq!(
        node.reservations(),
        vec![("gone".to_string(), id.clone())],
        "cluster-net and side are released"
    );
    let warnings: Vec<Value> = node
        .server()
        .events()
        .into_iter()
        .filter(|e| e["reason"] == "TeardownIncomplete")
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0]["message"]
        .as_str()
        .unwrap()
        .contains("team/gone"));
}

fn a_runtime_restart_between_add_and_teardown_leaks_nothing(kind: RuntimeKind) {
    let mut node = Node::new(kind, "side");
    let id = node.run();
    let held = node.reservations();
    node.runtime.restart();
    // The restarted runtime keeps the running sandbox and its networks (CRI-O's start-up garbage collection of
    // CNI attachments, CNI GC, needs a 1.1.0 conflist; this one is 1.0.0, as `plexus install` writes it for a
    // cluster network of 1.0.0).
    let status = node.runtime.cri().pod_sandbox_status(&id).unwrap();
    assert_eq!(
        status.status.unwrap().state,
        0,
        "the sandbox is still ready"
    );
    assert_eq!(node.reservations(), held, "{}", node.plexus_log());
    node.stop_and_remove(&id);
    assert_eq!(node.reservations(), vec![]);
    assert!(node.cache_files().is_empty());
}

fn a_failed_add_leaves_nothing_and_the_runtime_cleans_up_with_del(kind: RuntimeKind) {
    let mut node = Node::new(kind, "side,missing");
    let err = node
        .runtime
        .run_pod_sandbox(POD_NS, "web", "uid-web")
        .expect_err("a sandbox of a missing NAD fails");
    assert!(err.0.contains("missing"), "{err}");
    // Plexus undid its own partial attachment before answering; each runtime then calls DEL for the sandbox it
    // gives up (containerd and CRI-O both do), which finds nothing left to do.
    assert_eq!(node.invocations("ADD"), 1, "{}", node.plexus_log());
    assert!(
        node.invocations("DEL") >= 1,
        "{} calls DEL after a failed ADD:\n{}",
        kind.name(),
        node.plexus_log()
    );
    assert_eq!(node.reservations(), vec![], "no address held");
    assert!(node.cache_files().is_empty(), "{:?}", node.cache_files());
    assert!(
        node.runtime.cri().list_pod_sandboxes().unwrap().is_empty(),
        "{} keeps no sandbox of a failed RunPodSandbox",
        kind.name()
    );
}
