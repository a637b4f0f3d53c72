//! The NRI plugin session (plexus-nri) and the daemon's NRI mode against each runtime's own NRI (containerd 2.4 and
//! CRI-O 1.36, each on its private socket; containerd calls the events' own methods, CRI-O's NRI 0.11 the older
//! StateChange), driven over
//! CRI as kubelet drives it. The runtime's only CNI configuration is the cluster network (bridge + host-local):
//! what an NRI plugin finds on a node it does not own. Checks what the NRI mode is built on: registration and the
//! pods already there, each sandbox's events after its cluster network is up (the network namespace and its
//! address), a refused sandbox failing and undone by the runtime, and a session ending when the runtime restarts.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use plexus_cni::podnet::interface_result;
use plexus_nri::{Ended, Event, PodSandbox, Registration, Runtime};
use plexus_tests::deploy_manifest;
use plexus_tests::kubeapi::KubeApiServer;
use plexus_tests::netns::{
    bridge_host_local, cni_bin_dir, links_at, require_root_and_plugins, HostBridge, IpamDir, Link,
};
use plexus_tests::plexus::{fake_cni_bin, plexus_bin, NodeDaemon};
use plexus_tests::runtime::{Runtime as ContainerRuntime, RuntimeKind};
use serde_json::json;

const NS: &str = "team";
/// The cluster network's conflist, in Plexus's conf dir and (NRI mode) in the runtime's.
const CLUSTER_CONFLIST: &str = "10-cluster.conflist";
/// Plexus's conflist in the runtime's conf dir (CNI mode).
const PLEXUS_CONFLIST: &str = "00-plexus.conflist";

#[derive(Debug, Clone)]
enum Record {
    Configured(Box<Runtime>),
    Synchronized(Vec<String>),
    /// An event, its pod, and the interfaces in the pod's network namespace when the plugin was called.
    Pod(Event, Box<PodSandbox>, Vec<String>),
    /// The cluster network's result, as Plexus reads it from the sandbox (`podnet::interface_result`), with the
    /// kernel's eth0 beside it.
    ClusterResult(serde_json::Value, Box<Link>),
}

/// A plugin that records what it is told and refuses the sandboxes of pods called `refused`.
#[derive(Default)]
struct Recorder {
    records: Mutex<Vec<Record>>,
}

#[async_trait::async_trait]
impl plexus_nri::Plugin for Recorder {
    async fn configured(&self, runtime: &Runtime) {
        self.records
            .lock()
            .unwrap()
            .push(Record::Configured(Box::new(runtime.clone())));
    }

    async fn synchronize(&self, pods: Vec<PodSandbox>) -> Result<(), String> {
        let names = pods.into_iter().map(|p| p.name).collect();
        self.records
            .lock()
            .unwrap()
            .push(Record::Synchronized(names));
        Ok(())
    }

    async fn pod_event(
        &self,
        event: Event,
        pod: PodSandbox,
        _deadline: tokio::time::Instant,
    ) -> Result<(), String> {
        let netns = pod.network_namespace().map(str::to_owned);
        let links = match (event, netns) {
            (Event::RunPodSandbox, Some(path)) => {
                let (links, result) = tokio::task::spawn_blocking(move || {
                    let result = interface_result(&path, "eth0", "1.0.0");
                    (links_at(Path::new(&path)), result)
                })
                .await
                .map_err(|e| format!("reading the sandbox's interfaces: {e}"))?;
                if let (Ok(result), Some(eth0)) =
                    (result, links.iter().find(|l| l.ifname == "eth0"))
                {
                    let record = Record::ClusterResult(result, Box::new(eth0.clone()));
                    self.records.lock().unwrap().push(record);
                }
                links.into_iter().map(|l| l.ifname).collect()
            }
            _ => Vec::new(),
        };
        let refuse = event == Event::RunPodSandbox && pod.name == "refused";
        self.records
            .lock()
            .unwrap()
            .push(Record::Pod(event, Box::new(pod), links));
        match refuse {
            true => Err("plexus: no network for refused".into()),
            false => Ok(()),
        }
    }
}

impl Recorder {
    /// The first record `pick` finds, waiting up to 20 s for it.
    fn wait_for<T>(&self, what: &str, pick: impl Fn(&Record) -> Option<T>) -> T {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(found) = self.records.lock().unwrap().iter().find_map(&pick) {
                return found;
            }
            assert!(
                Instant::now() < until,
                "no {what} within 20 s; the plugin saw {:#?}",
                self.records.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn event(&self, event: Event, pod: &str) -> (PodSandbox, Vec<String>) {
        self.wait_for(&format!("{event:?} of {pod}"), |r| match r {
            Record::Pod(e, p, links) if *e == event && p.name == pod => {
                Some((p.as_ref().clone(), links.clone()))
            }
            _ => None,
        })
    }

    fn events_of(&self, pod: &str) -> Vec<Event> {
        let records = self.records.lock().unwrap();
        records
            .iter()
            .filter_map(|r| match r {
                Record::Pod(e, p, _) if p.name == pod => Some(*e),
                _ => None,
            })
            .collect()
    }
}

/// A runtime with the cluster network as its only CNI configuration.
/// Fields drop in order: the runtime removes the test's sandboxes (a CNI DEL each) while the network's conf, bridge
/// and address reservations are still there.
struct Node {
    runtime: ContainerRuntime,
    /// The session's runtime; sessions run on it while the test drives CRI.
    rt: tokio::runtime::Runtime,
    _bridge: HostBridge,
    ipam: IpamDir,
    dirs: tempfile::TempDir,
    /// The cluster network's name (its conflist's).
    cluster_name: String,
}

impl Node {
    /// A node whose runtime waits for its NRI plugins for [`plexus_tests::runtime::TEST_NRI_TIMEOUT`].
    fn new(kind: RuntimeKind) -> Node {
        Node::start(kind, false)
    }

    /// A node whose runtime waits for its NRI plugins for its own default time (2 s).
    fn with_default_nri_timeout(kind: RuntimeKind) -> Node {
        Node::start(kind, true)
    }

    /// The runtime's CNI: `cri-net.d` holds the cluster network's conflist (Plexus's own conf dir, `net.d`, has
    /// it too), and `cri-bin` the reference plugins and plexus, so that a test can also make it a node in CNI
    /// mode ([`Node::cni_mode`]).
    fn start(kind: RuntimeKind, default_nri_timeout: bool) -> Node {
        require_root_and_plugins();
        let dirs = tempfile::tempdir().unwrap();
        let conf = dirs.path().join("net.d");
        let cri_conf = dirs.path().join("cri-net.d");
        let cri_bin = dirs.path().join("cri-bin");
        for dir in [&conf, &cri_conf, &cri_bin] {
            std::fs::create_dir_all(dir).unwrap();
        }
        for plugin in std::fs::read_dir(cni_bin_dir()).unwrap().flatten() {
            std::os::unix::fs::symlink(plugin.path(), cri_bin.join(plugin.file_name())).unwrap();
        }
        std::os::unix::fs::symlink(plexus_bin(), cri_bin.join("plexus")).unwrap();
        let ipam = IpamDir::new();
        let bridge = HostBridge::reserve("nri");
        // A name of this node's own: CRI-O, when it starts, tears down every attachment the host's libcni cache
        // holds under the names of its lists that is not one of its sandboxes, whichever runtime made it.
        let cluster_name = format!("cluster-{}", bridge.name());
        let cluster = bridge_host_local(&cluster_name, &bridge, &ipam);
        for dir in [&conf, &cri_conf] {
            std::fs::write(dir.join(CLUSTER_CONFLIST), cluster.to_string()).unwrap();
        }
        let runtime = if default_nri_timeout {
            ContainerRuntime::start_with_default_nri_timeout(kind, &cri_bin, &cri_conf)
        } else {
            ContainerRuntime::start(kind, &cri_bin, &cri_conf)
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        Node {
            dirs,
            cluster_name,
            ipam,
            _bridge: bridge,
            runtime,
            rt,
        }
    }

    /// The plan of the sandbox `id` in Plexus's attachment cache, if any.
    fn plan(&self, id: &str) -> Option<serde_json::Value> {
        let path = self
            .dirs
            .path()
            .join(format!("cache/attachments/{id}.json"));
        let text = std::fs::read_to_string(path).ok()?;
        Some(serde_json::from_str(&text).unwrap())
    }

    /// Makes the runtime's CNI Plexus's conflist (the cluster network its delegate, read from the API of `api`
    /// with the node's credentials), as a node in CNI mode has it, and waits until the runtime uses it.
    fn cni_mode(&mut self, api: &KubeApiServer) {
        let token = api.node_bound_token("kube-system", "plexus", NODE);
        let kubeconfig = self.dirs.path().join("cni.kubeconfig");
        api.write_kubeconfig(&kubeconfig, &token);
        let plexus = json!({
            "type": "plexus", "clusterNetwork": self.cluster_name,
            "confDir": self.dirs.path().join("net.d"), "cacheDir": self.dirs.path().join("cache"),
            "runDir": self.dirs.path().join("run"), "logFile": self.dirs.path().join("plexus.log"),
            "cluster": {"source": "kube", "kubeconfig": kubeconfig},
            "daemon": false, "clusterHooks": false,
        });
        let list = json!({"cniVersion": "1.0.0", "name": format!("plexus-{}", self.cluster_name),
                          "plugins": [plexus]});
        let cri_conf = self.dirs.path().join("cri-net.d");
        // Before the cluster network's file in name order, so the runtime takes it at once.
        std::fs::write(cri_conf.join(PLEXUS_CONFLIST), list.to_string()).unwrap();
        std::fs::remove_file(cri_conf.join(CLUSTER_CONFLIST)).unwrap();
        self.await_runtime_cni(api, true);
    }

    /// Makes the runtime's CNI the cluster network's conflist again, as a node in NRI mode has it, and waits until
    /// the runtime uses it. No NRI plugin may be registered yet.
    fn nri_mode(&mut self, api: &KubeApiServer) {
        let cri_conf = self.dirs.path().join("cri-net.d");
        std::fs::copy(
            self.dirs.path().join("net.d").join(CLUSTER_CONFLIST),
            cri_conf.join(CLUSTER_CONFLIST),
        )
        .unwrap();
        std::fs::remove_file(cri_conf.join(PLEXUS_CONFLIST)).unwrap();
        self.await_runtime_cni(api, false);
    }

    /// Waits until the runtime has read its changed CNI configuration: a probe sandbox gets a plan of Plexus's
    /// exactly when Plexus is the runtime's CNI (`plexus`). The runtimes read the directory again when it changes.
    fn await_runtime_cni(&mut self, api: &KubeApiServer, plexus: bool) {
        static PROBES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let name = format!("probe-{n}");
            let pod = api.pod(NS, &name, NODE, json!({}));
            let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
            let taken = match self.runtime.run_pod_sandbox(NS, &name, &uid) {
                Ok(id) => {
                    let taken = self.plan(&id).is_some() == plexus;
                    let cri = self.runtime.cri();
                    cri.stop_pod_sandbox(&id).unwrap();
                    cri.remove_pod_sandbox(&id).unwrap();
                    taken
                }
                Err(_) => false,
            };
            if taken {
                return;
            }
            assert!(
                Instant::now() < until,
                "the runtime did not take its new CNI configuration; runtime:\n{}",
                self.runtime.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A session of a fresh recorder on the runtime's NRI socket.
    fn register(
        &self,
    ) -> (
        Arc<Recorder>,
        tokio::task::JoinHandle<Result<Ended, String>>,
    ) {
        let plugin = Arc::new(Recorder::default());
        let registration = Registration {
            name: "plexus".into(),
            index: "50".into(),
            events: vec![
                Event::RunPodSandbox,
                Event::StopPodSandbox,
                Event::RemovePodSandbox,
            ],
        };
        let socket = self.runtime.nri_socket();
        let p: Arc<dyn plexus_nri::Plugin> = plugin.clone();
        let session = self
            .rt
            .spawn(async move { plexus_nri::run(&socket, &registration, p).await });
        (plugin, session)
    }

    /// A sandbox for pod `name` of the API server, with its UID.
    fn run_as(&mut self, name: &str, uid: &str) -> String {
        self.runtime
            .run_pod_sandbox(NS, name, uid)
            .unwrap_or_else(|e| {
                panic!("RunPodSandbox {name}: {e}\nruntime: {}", self.runtime.log())
            })
    }

    fn run(&mut self, name: &str) -> String {
        self.runtime
            .run_pod_sandbox(NS, name, &format!("uid-{name}"))
            .unwrap_or_else(|e| {
                panic!("RunPodSandbox {name}: {e}\nruntime: {}", self.runtime.log())
            })
    }
}

fn a_plugin_registers_with_the_runtime_and_sees_each_sandbox_after_its_cluster_network(
    kind: RuntimeKind,
) {
    let mut node = Node::with_default_nri_timeout(kind);
    let before = node.run("before");
    let (plugin, session) = node.register();

    let runtime = plugin.wait_for("Configure", |r| match r {
        Record::Configured(rt) => Some(rt.as_ref().clone()),
        _ => None,
    });
    assert_eq!(runtime.name, kind.name());
    assert_eq!(
        runtime.request_timeout,
        Duration::from_secs(2),
        "the runtime's default NRI request timeout"
    );
    let synced = plugin.wait_for("Synchronize", |r| match r {
        Record::Synchronized(names) => Some(names.clone()),
        _ => None,
    });
    assert_eq!(
        synced,
        ["before"],
        "the pods the runtime had at registration"
    );

    let id = node.run("web");
    let (pod, links) = plugin.event(Event::RunPodSandbox, "web");
    assert_eq!(
        (pod.id.as_str(), pod.namespace.as_str(), pod.uid.as_str()),
        (id.as_str(), NS, "uid-web")
    );
    let netns = pod
        .network_namespace()
        .expect("the sandbox's network namespace");
    assert!(Path::new(netns).exists(), "{netns}");
    assert!(
        links.iter().any(|l| l == "eth0"),
        "the cluster network was up before the plugin's call: {links:?}"
    );
    assert_eq!(
        pod.ips.len(),
        1,
        "the cluster network's address: {:?}",
        pod.ips
    );
    assert!(
        pod.ips[0].parse::<std::net::IpAddr>().is_ok(),
        "{:?}",
        pod.ips
    );
    // What Plexus will record as the cluster network's result: the runtime's address with its prefix, eth0's MAC.
    let (result, eth0) = plugin.wait_for("the cluster network's result", |r| match r {
        Record::ClusterResult(result, eth0) => Some((result.clone(), eth0.clone())),
        _ => None,
    });
    assert_eq!(
        result["ips"][0]["address"],
        format!("{}/24", pod.ips[0]),
        "{result}"
    );
    assert_eq!(
        result["interfaces"][0]["mac"].as_str(),
        eth0.address.as_deref(),
        "{result}"
    );
    assert_eq!(result["interfaces"][0]["sandbox"], netns);

    let cri = node.runtime.cri();
    cri.stop_pod_sandbox(&id).unwrap();
    plugin.event(Event::StopPodSandbox, "web");
    cri.remove_pod_sandbox(&id).unwrap();
    plugin.event(Event::RemovePodSandbox, "web");
    assert_eq!(
        plugin.events_of("web"),
        [
            Event::RunPodSandbox,
            Event::StopPodSandbox,
            Event::RemovePodSandbox
        ]
    );
    assert!(
        plugin.events_of("before").is_empty(),
        "no event for a pod that was there before"
    );
    cri.stop_pod_sandbox(&before).unwrap();
    cri.remove_pod_sandbox(&before).unwrap();
    assert!(
        !session.is_finished(),
        "the session ended: {:?}",
        node.rt.block_on(session)
    );
}

fn a_sandbox_the_plugin_refuses_fails_with_its_message_and_the_runtime_undoes_it(
    kind: RuntimeKind,
) {
    let mut node = Node::new(kind);
    let (plugin, _session) = node.register();
    plugin.wait_for("Synchronize", |r| {
        matches!(r, Record::Synchronized(_)).then_some(())
    });

    let err = node
        .runtime
        .run_pod_sandbox(NS, "refused", "uid-refused")
        .unwrap_err()
        .to_string();
    assert!(err.contains("plexus: no network for refused"), "{err}");
    // The runtime tells the plugins the sandbox is gone, and runs nothing of it. It removes the sandbox as it
    // fails, or, when a step of its own cleanup failed (containerd), keeps it, not ready, for kubelet to remove.
    plugin.event(Event::StopPodSandbox, "refused");
    plugin.event(Event::RemovePodSandbox, "refused");
    let cri = node.runtime.cri();
    for sandbox in cri.list_pod_sandboxes().unwrap() {
        if sandbox
            .metadata
            .as_ref()
            .is_some_and(|m| m.name == "refused")
        {
            let status = cri.pod_sandbox_status(&sandbox.id).unwrap().status.unwrap();
            assert_eq!(
                status.state, 1,
                "the refused sandbox is kept ready: {sandbox:?}"
            );
            cri.remove_pod_sandbox(&sandbox.id).unwrap();
        }
    }
    // The next sandbox is not refused.
    node.run("next");
    plugin.event(Event::RunPodSandbox, "next");
}

fn a_session_ends_when_the_runtime_restarts_and_the_next_one_synchronizes_its_pods(
    kind: RuntimeKind,
) {
    let mut node = Node::new(kind);
    let (plugin, session) = node.register();
    plugin.wait_for("Synchronize", |r| {
        matches!(r, Record::Synchronized(_)).then_some(())
    });
    node.run("web");
    plugin.event(Event::RunPodSandbox, "web");

    node.runtime.restart();
    let ended = node
        .rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(20), session).await });
    assert_eq!(ended.expect("the session ends").unwrap(), Ok(Ended::Closed));

    // The runtime opens its NRI socket a moment after its CRI answers.
    let until = Instant::now() + Duration::from_secs(20);
    let plugin = loop {
        let (plugin, session) = node.register();
        let done = node.rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(3), async {
                loop {
                    if plugin
                        .records
                        .lock()
                        .unwrap()
                        .iter()
                        .any(|r| matches!(r, Record::Synchronized(_)))
                    {
                        return None;
                    }
                    if session.is_finished() {
                        return Some(());
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await
        });
        match done {
            Ok(None) => break plugin,
            _ if Instant::now() < until => std::thread::sleep(Duration::from_millis(200)),
            _ => panic!(
                "no session after the runtime's restart; runtime: {}",
                node.runtime.log()
            ),
        }
    };
    let synced = plugin.wait_for("Synchronize", |r| match r {
        Record::Synchronized(names) => Some(names.clone()),
        _ => None,
    });
    assert_eq!(synced, ["web"]);
}

const NODE: &str = "node1";

/// A real API server with the project's CRDs and RBAC, the namespace of the tests' pods, and the node authority.
fn api_server() -> KubeApiServer {
    let api = KubeApiServer::start(&[], &[]);
    api.apply_file(&deploy_manifest("crds.yaml"));
    api.apply_file(&deploy_manifest("rbac.yaml"));
    api.namespace(NS);
    api.apply_node_authority();
    api
}

/// `plexus daemon --nri` for `node`, on a real API server with the project's CRDs and RBAC (its identity bound to
/// the node, as a DaemonSet pod's), the plexus conf of NRI mode naming the runtime's cluster network.
struct NriDaemon {
    api: KubeApiServer,
    daemon: NodeDaemon,
}

impl NriDaemon {
    fn start(node: &Node) -> NriDaemon {
        NriDaemon::start_with(node, Path::new(cni_bin_dir()))
    }

    /// [`NriDaemon::start`] with its delegates in `cni_path`.
    fn start_with(node: &Node, cni_path: &Path) -> NriDaemon {
        NriDaemon::on(node, api_server(), cni_path)
    }

    /// A second daemon of the node, on the first one's API server (and attachment cache).
    fn restart(node: &Node, api: KubeApiServer) -> NriDaemon {
        NriDaemon::on(node, api, Path::new(cni_bin_dir()))
    }

    fn on(node: &Node, api: KubeApiServer, cni_path: &Path) -> NriDaemon {
        let token = api.node_bound_token("kube-system", "plexus", NODE);
        let kubeconfig = node.dirs.path().join("daemon.kubeconfig");
        api.write_kubeconfig(&kubeconfig, &token);
        let conf = node.dirs.path().join("nri-plexus.json");
        let plexus = json!({
            "cniVersion": "1.0.0", "name": "plexus", "type": "plexus",
            "clusterNetwork": node.cluster_name, "confDir": node.dirs.path().join("net.d"),
            "cacheDir": node.dirs.path().join("cache"), "runDir": node.dirs.path().join("run"),
            "cluster": {"source": "kube", "kubeconfig": kubeconfig},
            // The daemon runs without its node agent here (--no-hooks): no hook set is published.
            "clusterHooks": false,
        });
        std::fs::write(&conf, plexus.to_string()).unwrap();
        let socket = node.runtime.nri_socket();
        let daemon = NodeDaemon::start(
            NODE,
            &kubeconfig,
            &node.dirs.path().join("daemon.sock"),
            &node.dirs.path().join("cache"),
            &node.dirs.path().join("daemon.log"),
            &[
                "--no-hooks",
                "--nri",
                "--nri-socket",
                socket.to_str().unwrap(),
                "--nri-conf",
                conf.to_str().unwrap(),
                "--nri-cni-path",
                cni_path.to_str().unwrap(),
            ],
        );
        daemon.wait("synced", plexus_tests::plexus::settled);
        daemon.wait_for_log(
            "registered with the runtime's NRI",
            20,
            "the registration with the runtime's NRI",
        );
        NriDaemon { api, daemon }
    }

    /// A pod of the node selecting `networks`; its UID.
    fn pod(&self, name: &str, networks: &str) -> String {
        pod_of(&self.api, name, networks)
    }
}

/// A pod of the node on `api` selecting `networks`; its UID.
fn pod_of(api: &KubeApiServer, name: &str, networks: &str) -> String {
    let pod = api.pod(
        NS,
        name,
        NODE,
        json!({"k8s.v1.cni.cncf.io/networks": networks}),
    );
    pod["metadata"]["uid"].as_str().unwrap().to_string()
}

/// A node of `kind`, its daemon in NRI mode, and the NAD `side` (bridge and host-local on a bridge of its own,
/// the bridge returned to be kept for the test).
fn with_side_network(kind: RuntimeKind) -> (Node, HostBridge, NriDaemon) {
    let node = Node::new(kind);
    let bridge = HostBridge::reserve("nrs");
    let side = bridge_host_local("side", &bridge, &node.ipam);
    let d = NriDaemon::start(&node);
    d.api.nad(NS, "side", &side);
    (node, bridge, d)
}

fn the_daemon_in_nri_mode_attaches_a_pods_networks_after_the_cluster_network_and_detaches_them(
    kind: RuntimeKind,
) {
    let (mut node, _side, d) = with_side_network(kind);
    let uid = d.pod("web", "side");
    let id = node
        .runtime
        .run_pod_sandbox(NS, "web", &uid)
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\ndaemon: {}", d.daemon.log_text()));

    let reserved = node.ipam.reserved_ips("side");
    assert_eq!(
        reserved.len(),
        1,
        "one address on the secondary network: {reserved:?}"
    );
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let entries = d.api.network_status(NS, "web");
        if !entries.is_empty() {
            assert_eq!(
                entries,
                [
                    (node.cluster_name.clone(), "eth0".to_string()),
                    (format!("{NS}/side"), "net1".to_string())
                ],
                "the default entry from the runtime's cluster network, then the secondary"
            );
            break;
        }
        assert!(
            Instant::now() < until,
            "no network-status; daemon:\n{}",
            d.daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let cri = node.runtime.cri();
    cri.stop_pod_sandbox(&id).unwrap();
    assert!(
        node.ipam.reserved_ips("side").is_empty(),
        "the secondary's address was released at StopPodSandbox"
    );
    cri.remove_pod_sandbox(&id).unwrap();
    assert!(
        !node
            .dirs
            .path()
            .join(format!("cache/attachments/{id}.json"))
            .exists(),
        "the plan is gone after the sandbox"
    );
}

fn the_daemon_in_nri_mode_fails_a_sandbox_whose_network_does_not_resolve_and_leaves_nothing(
    kind: RuntimeKind,
) {
    let (mut node, _side, d) = with_side_network(kind);
    let uid = d.pod("web", "side,missing");
    let err = node
        .runtime
        .run_pod_sandbox(NS, "web", &uid)
        .unwrap_err()
        .to_string();
    assert!(err.contains(&format!("{NS}/missing")), "{err}");
    assert!(
        node.ipam.reserved_ips("side").is_empty(),
        "nothing of the pod's attachments is left"
    );
    // The runtime removes the failed sandbox after it answers (on a loaded machine it was still listed just after).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let sandboxes = node.runtime.cri().list_pod_sandboxes().unwrap();
        let gone = sandboxes
            .iter()
            .all(|s| s.metadata.as_ref().is_none_or(|m| m.name != "web"));
        if gone {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the runtime did not remove the sandbox within 15 s: {sandboxes:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

fn a_del_that_fails_in_nri_mode_is_tried_again_until_it_succeeds(kind: RuntimeKind) {
    let mut node = Node::new(kind);
    // The delegates: the reference plugins and a recording fake, `flaky`, whose DEL fails until told otherwise.
    let bin = node.dirs.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for plugin in std::fs::read_dir(cni_bin_dir()).unwrap().flatten() {
        std::os::unix::fs::symlink(plugin.path(), bin.join(plugin.file_name())).unwrap();
    }
    std::os::unix::fs::symlink(fake_cni_bin(), bin.join("flaky")).unwrap();
    let fake_config = bin.join("fake-config.json");
    let failing = json!({"flaky": {"DEL": {"error": {"code": 11, "msg": "flaky: not now"}}}});
    std::fs::write(&fake_config, failing.to_string()).unwrap();
    let d = NriDaemon::start_with(&node, &bin);
    d.api.nad(
        NS,
        "flaky",
        &json!({"cniVersion": "1.0.0", "name": "flaky", "type": "flaky"}),
    );
    let uid = d.pod("web", "flaky");
    let id = node
        .runtime
        .run_pod_sandbox(NS, "web", &uid)
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\ndaemon: {}", d.daemon.log_text()));
    let plan = node
        .dirs
        .path()
        .join(format!("cache/attachments/{id}.json"));
    assert!(plan.exists(), "the plan of the sandbox");

    let cri = node.runtime.cri();
    cri.stop_pod_sandbox(&id).unwrap();
    cri.remove_pod_sandbox(&id).unwrap();
    let dels = || {
        std::fs::read_to_string(bin.join("calls.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(r#""command":"DEL""#))
            .count()
    };
    assert!(dels() >= 2, "DEL at stop and at removal");
    assert!(plan.exists(), "a failed DEL keeps the plan");

    // The delegate recovers: the daemon's next try succeeds, with nobody asking.
    std::fs::write(&fake_config, "{}").unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    // The plan goes as the retried DEL ends; the daemon says so just after.
    while plan.exists() || !d.daemon.log_text().contains("DEL succeeded on a retry") {
        assert!(
            Instant::now() < until,
            "the DEL was not tried again; daemon:\n{}",
            d.daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let settled = dels();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(dels(), settled, "no DEL after the one that succeeded");
}

plexus_tests::on_each_runtime!(
    a_plugin_registers_with_the_runtime_and_sees_each_sandbox_after_its_cluster_network,
    a_sandbox_the_plugin_refuses_fails_with_its_message_and_the_runtime_undoes_it,
    a_session_ends_when_the_runtime_restarts_and_the_next_one_synchronizes_its_pods,
    the_daemon_in_nri_mode_attaches_a_pods_networks_after_the_cluster_network_and_detaches_them,
    the_daemon_in_nri_mode_fails_a_sandbox_whose_network_does_not_resolve_and_leaves_nothing,
    a_del_that_fails_in_nri_mode_is_tried_again_until_it_succeeds,
);

fn a_new_session_attaches_the_pods_it_missed_and_deletes_the_sandboxes_gone_meanwhile(
    kind: RuntimeKind,
) {
    // A daemon that registers once and is then killed: the API server and the NAD stay.
    let (mut node, _side, d) = with_side_network(kind);
    let early_uid = d.pod("early", "side");
    let late_uid = d.pod("late", "side");
    let early = node.run_as("early", &early_uid);
    assert_eq!(
        node.ipam.reserved_ips("side").len(),
        1,
        "early's secondary network"
    );
    let NriDaemon { api, daemon } = d;
    drop(daemon);

    // While no plugin is registered: early's sandbox goes, late's comes without its secondary network.
    let cri = node.runtime.cri();
    cri.stop_pod_sandbox(&early).unwrap();
    cri.remove_pod_sandbox(&early).unwrap();
    let late = node.run_as("late", &late_uid);
    let early_plan = node
        .dirs
        .path()
        .join(format!("cache/attachments/{early}.json"));
    let late_plan = node
        .dirs
        .path()
        .join(format!("cache/attachments/{late}.json"));
    assert!(early_plan.exists() && !late_plan.exists());

    // The next daemon's session puts both right.
    let d = NriDaemon::restart(&node, api);
    let until = Instant::now() + Duration::from_secs(20);
    while early_plan.exists() || !late_plan.exists() {
        assert!(
            Instant::now() < until,
            "not reconciled; daemon:\n{}",
            d.daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let reserved = node.ipam.reserved_ips("side");
    assert_eq!(reserved.len(), 1, "late's address only: {reserved:?}");
    let until = Instant::now() + Duration::from_secs(20);
    while d.api.network_status(NS, "late").is_empty() {
        assert!(
            Instant::now() < until,
            "no network-status for late; daemon:\n{}",
            d.daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        d.api.network_status(NS, "late")[1],
        (format!("{NS}/side"), "net1".to_string())
    );
    cri.stop_pod_sandbox(&late).unwrap();
    cri.remove_pod_sandbox(&late).unwrap();
    assert!(node.ipam.reserved_ips("side").is_empty());
}

fn a_daemon_killed_during_a_sandboxs_add_has_the_next_one_finish_it(kind: RuntimeKind) {
    let mut node = Node::new(kind);
    // The delegates: the reference plugins and `slow`, a recording fake whose ADD takes 5 s (the daemon is killed
    // well within it).
    let bin = slow_delegates(&node, 5000);
    let fake_config = bin.join("fake-config.json");
    let side_bridge = HostBridge::reserve("nrk");
    let d = NriDaemon::start_with(&node, &bin);
    d.api.nad(
        NS,
        "side",
        &bridge_host_local("side", &side_bridge, &node.ipam),
    );
    d.api.nad(
        NS,
        "slow",
        &json!({"cniVersion": "1.0.0", "name": "slow", "type": "slow"}),
    );
    let uid = d.pod("web", "side,slow");
    let adds = {
        let calls = bin.join("calls.jsonl");
        move || {
            std::fs::read_to_string(&calls)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains(r#""command":"ADD""#))
                .count()
        }
    };

    // Killed while `slow` attaches, `side` attached before it: the runtime drops the plugin and starts the
    // sandbox without it.
    let NriDaemon { api, mut daemon } = d;
    let id = std::thread::scope(|s| {
        let run = s.spawn(|| node.runtime.run_pod_sandbox(NS, "web", &uid));
        let until = Instant::now() + Duration::from_secs(20);
        while adds() == 0 {
            assert!(
                Instant::now() < until,
                "slow's ADD never started; daemon:\n{}",
                daemon.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        daemon.child.kill().unwrap();
        daemon.child.wait().unwrap();
        run.join().unwrap()
    });
    let id = id.unwrap_or_else(|e| panic!("the runtime failed the sandbox: {e}"));
    let plan = node
        .dirs
        .path()
        .join(format!("cache/attachments/{id}.json"));
    assert!(plan.exists(), "the unfinished ADD's plan");
    assert_eq!(
        node.ipam.reserved_ips("side").len(),
        1,
        "side attached before the kill"
    );
    drop(daemon);

    // The next daemon's session finishes the pod's ADD: what the unfinished one attached is torn down and
    // attached again, `slow` this time too.
    std::fs::write(&fake_config, "{}").unwrap();
    let d = NriDaemon::on(&node, api, &bin);
    let until = Instant::now() + Duration::from_secs(20);
    while d.api.network_status(NS, "web").len() < 3 {
        assert!(
            Instant::now() < until,
            "the ADD was not finished; daemon:\n{}",
            d.daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        d.api.network_status(NS, "web"),
        [
            (node.cluster_name.clone(), "eth0".to_string()),
            (format!("{NS}/side"), "net1".to_string()),
            (format!("{NS}/slow"), "net2".to_string()),
        ]
    );
    assert!(
        d.daemon.log_text().contains("left unfinished"),
        "{}",
        d.daemon.log_text()
    );
    assert_eq!(adds(), 2, "slow's ADD, killed and then finished");
    let reserved = node.ipam.reserved_ips("side");
    assert_eq!(
        reserved.len(),
        1,
        "one address of side's, not two: {reserved:?}"
    );

    // The sandbox goes: nothing of it is left, nor of the killed daemon (its lock, a delegate it ran).
    let cri = node.runtime.cri();
    cri.stop_pod_sandbox(&id).unwrap();
    cri.remove_pod_sandbox(&id).unwrap();
    assert!(node.ipam.reserved_ips("side").is_empty());
    assert!(!plan.exists(), "the plan is gone after the sandbox");
    let locks: Vec<_> = std::fs::read_dir(node.dirs.path().join("run/locks"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(locks.is_empty(), "lock files left: {locks:?}");
}

fn a_sandbox_attached_past_the_runtimes_deadline_fails_and_its_networks_are_then_deleted(
    kind: RuntimeKind,
) {
    let mut node = Node::with_default_nri_timeout(kind);
    // The delegates: the reference plugins and `slow`, a recording fake whose ADD outlasts the runtime's 2 s.
    let bin = slow_delegates(&node, 2600);
    let side_bridge = HostBridge::reserve("nrl");
    let d = NriDaemon::start_with(&node, &bin);
    d.api.nad(
        NS,
        "side",
        &bridge_host_local("side", &side_bridge, &node.ipam),
    );
    d.api.nad(
        NS,
        "slow",
        &json!({"cniVersion": "1.0.0", "name": "slow", "type": "slow"}),
    );
    let uid = d.pod("web", "side,slow");
    let err = node
        .runtime
        .run_pod_sandbox(NS, "web", &uid)
        .expect_err("a sandbox not attached in time fails")
        .to_string();
    assert!(
        err.contains("not done before the runtime's deadline"),
        "{err}"
    );

    // The ADD goes on and succeeds after the runtime gave up; the runtime sends no stop for the sandbox it
    // failed, so the daemon deletes what the ADD attached itself.
    d.daemon.wait_for_log(
        "attached past the runtime's deadline",
        20,
        "the late ADD undone",
    );
    assert!(
        node.ipam.reserved_ips("side").is_empty(),
        "side's address released"
    );
    let plans: Vec<_> = std::fs::read_dir(node.dirs.path().join("cache/attachments"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(plans.is_empty(), "plans left: {plans:?}");
}

fn a_node_moves_between_cni_and_nri_mode_and_each_pods_networks_are_deleted_whole(
    kind: RuntimeKind,
) {
    let mut node = Node::new(kind);
    let api = api_server();
    let side_bridge = HostBridge::reserve("nrm");
    api.nad(
        NS,
        "side",
        &bridge_host_local("side", &side_bridge, &node.ipam),
    );
    let reserved = |node: &Node, id: &str| {
        [node.cluster_name.as_str(), "side"].map(|net| {
            node.ipam
                .reservations(net)
                .iter()
                .filter(|r| r.container_id == id)
                .count()
        })
    };
    let networks = |node: &Node, id: &str| -> Vec<(String, bool)> {
        let plan = node.plan(id).expect("the sandbox's plan");
        plan["attachments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["ifname"].as_str().unwrap().to_string(),
                    a["external"].as_bool().unwrap_or(false),
                )
            })
            .collect()
    };

    // CNI mode: Plexus is the runtime's CNI and attaches the cluster network too.
    node.cni_mode(&api);
    let a = node.run_as("a", &pod_of(&api, "a", "side"));
    assert_eq!(
        networks(&node, &a),
        [("eth0".into(), false), ("net1".into(), false)]
    );
    assert_eq!(reserved(&node, &a), [1, 1]);

    // NRI mode: the runtime attaches the cluster network, the daemon the rest. `a` keeps what it has.
    node.nri_mode(&api);
    let d = NriDaemon::on(&node, api, Path::new(cni_bin_dir()));
    let b = node.run_as("b", &d.pod("b", "side"));
    assert_eq!(
        networks(&node, &b),
        [("eth0".into(), true), ("net1".into(), false)]
    );
    assert_eq!(reserved(&node, &b), [1, 1]);
    assert_eq!(
        reserved(&node, &a),
        [1, 1],
        "a pod of CNI mode keeps its networks"
    );

    // `a`, made in CNI mode, deleted in NRI mode: the runtime deletes the cluster network, the daemon the rest.
    let cri = node.runtime.cri();
    cri.stop_pod_sandbox(&a).unwrap();
    cri.remove_pod_sandbox(&a).unwrap();
    assert_eq!(
        reserved(&node, &a),
        [0, 0],
        "daemon:\n{}",
        d.daemon.log_text()
    );
    assert!(node.plan(&a).is_none());

    // Back to CNI mode, the daemon too: `b`, made in NRI mode, is deleted by Plexus alone, its cluster network
    // included (containerd calls Plexus; CRI-O deletes the cluster network with the conflist it cached for `b`,
    // and the daemon then deletes the rest).
    let NriDaemon { api, daemon } = d;
    drop(daemon);
    node.cni_mode(&api);
    let daemon = NodeDaemon::start(
        NODE,
        &node.dirs.path().join("daemon.kubeconfig"),
        &node.dirs.path().join("daemon.sock"),
        &node.dirs.path().join("cache"),
        &node.dirs.path().join("daemon-cni.log"),
        &["--no-hooks"],
    );
    daemon.wait("synced", plexus_tests::plexus::settled);
    let c = node.run_as("c", &pod_of(&api, "c", "side"));
    assert_eq!(
        networks(&node, &c),
        [("eth0".into(), false), ("net1".into(), false)]
    );
    assert_eq!(
        reserved(&node, &b),
        [1, 1],
        "a pod of NRI mode keeps its networks"
    );
    for id in [&b, &c] {
        cri.stop_pod_sandbox(id).unwrap();
        cri.remove_pod_sandbox(id).unwrap();
    }
    let until = Instant::now() + Duration::from_secs(30);
    while [&b, &c].iter().any(|id| node.plan(id).is_some()) {
        assert!(
            Instant::now() < until,
            "a plan is left; daemon:\n{}",
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for id in [&b, &c] {
        assert_eq!(
            reserved(&node, id),
            [0, 0],
            "{id}; daemon:\n{}",
            daemon.log_text()
        );
    }
    let left: Vec<_> = [node.cluster_name.as_str(), "side"]
        .iter()
        .flat_map(|net| node.ipam.reservations(net))
        .collect();
    assert!(left.is_empty(), "no address is left: {left:?}");
}

plexus_tests::on_each_runtime!(
    a_node_moves_between_cni_and_nri_mode_and_each_pods_networks_are_deleted_whole
);

/// A bin dir of the reference plugins and `slow`, a recording fake whose ADD takes `ms`; its config file is
/// `fake-config.json` in it.
fn slow_delegates(node: &Node, ms: u64) -> std::path::PathBuf {
    let bin = node.dirs.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for plugin in std::fs::read_dir(cni_bin_dir()).unwrap().flatten() {
        std::os::unix::fs::symlink(plugin.path(), bin.join(plugin.file_name())).unwrap();
    }
    std::os::unix::fs::symlink(fake_cni_bin(), bin.join("slow")).unwrap();
    let config = json!({"slow": {"ADD": {"sleepMs": ms}}});
    std::fs::write(bin.join("fake-config.json"), config.to_string()).unwrap();
    bin
}

/// A sandbox no session attached (made while no plugin was registered; its attachment at the next session's start
/// failed, its NAD missing) is attached at its container's creation: while the NAD is missing, CreateContainer fails
/// naming it and nothing is attached; once it exists, the container is made with the pod's networks in place, and a
/// second container's creation attaches nothing again.
fn a_sandbox_no_session_attached_is_attached_before_its_container_is_made(kind: RuntimeKind) {
    let mut node = Node::new(kind);
    let image_dir = tempfile::tempdir().unwrap();
    let image_tar = image_dir.path().join("plexus.tar");
    plexus_tests::image::build(&image_tar);
    node.runtime
        .load_image(&image_tar, plexus_tests::image::IMAGE);
    let bridge = HostBridge::reserve("nrc");
    let side = bridge_host_local("side", &bridge, &node.ipam);
    let api = api_server();
    let uid = pod_of(&api, "web", "side");
    let id = node.run_as("web", &uid);
    let d = NriDaemon::on(&node, api, Path::new(cni_bin_dir()));
    d.daemon.wait_for_log(
        "attaching a pod the runtime had before this session",
        20,
        "the session's start trying the pod",
    );
    assert!(
        node.plan(&id).is_none(),
        "the failed attachment left no plan"
    );

    let cri = node.runtime.cri();
    let create = |container: &str| {
        cri.create_container(&id, NS, "web", &uid, container, plexus_tests::image::IMAGE)
    };
    let refused = create("app").unwrap_err().to_string();
    assert!(refused.contains(&format!("{NS}/side")), "{refused}");
    assert!(node.ipam.reserved_ips("side").is_empty() && node.plan(&id).is_none());

    d.api.nad(NS, "side", &side);
    create("app").unwrap_or_else(|e| {
        panic!(
            "CreateContainer: {e}\ndaemon: {}\nruntime: {}",
            d.daemon.log_text(),
            node.runtime.log()
        )
    });
    let plan = node
        .plan(&id)
        .expect("attached before the container was made");
    assert_eq!(node.ipam.reserved_ips("side").len(), 1);
    let names: Vec<String> = links_at(Path::new(plan["netns"].as_str().unwrap()))
        .into_iter()
        .map(|l| l.ifname)
        .collect();
    assert!(names.contains(&"net1".to_string()), "{names:?}");

    create("sidecar").unwrap();
    assert_eq!(node.ipam.reserved_ips("side").len(), 1, "attached once");
    let attached = "attached a sandbox at its container's creation";
    assert_eq!(d.daemon.log_text().matches(attached).count(), 1);

    cri.stop_pod_sandbox(&id).unwrap();
    cri.remove_pod_sandbox(&id).unwrap();
    assert!(node.ipam.reserved_ips("side").is_empty() && node.plan(&id).is_none());
}

plexus_tests::on_each_runtime!(
    a_sandbox_no_session_attached_is_attached_before_its_container_is_made,
    a_sandbox_attached_past_the_runtimes_deadline_fails_and_its_networks_are_then_deleted,
    a_new_session_attaches_the_pods_it_missed_and_deletes_the_sandboxes_gone_meanwhile,
    a_daemon_killed_during_a_sandboxs_add_has_the_next_one_finish_it,
);
