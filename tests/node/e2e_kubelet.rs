//! A node as in production: a real kubelet (1.37) runs pods through a container runtime (each test on containerd 2
//! and on CRI-O 1.36), which calls the plexus CNI binary; the node daemon runs beside them with
//! `--dynamic-networks`; all against a real kube-apiserver (1.37) with the project's CRDs and RBAC. The pod's
//! networks are the reference bridge + host-local (v1.10.0) in the namespace the runtime made for it, and the
//! user's side is Kubernetes' own `kubectl`.
//!
//! Needs root, runc, conmon, busybox-static (tests/setup.sh) and the build of `tests/parts.sh` (tests/run.sh runs
//! both).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use plexus_tests::containerd::{cluster_cni_dirs, cni_dirs};
use plexus_tests::control_plane::Component;
use plexus_tests::dra_driver::{allocated, DraDriver, DRIVER_OWNED_REQUEST, SHARED_DEVICE};
use plexus_tests::kubeapi::{KubeApiServer, PLEXUS_USER};
use plexus_tests::kubelet::{pod_on_node, with_claim, Kubelet, NODE};
use plexus_tests::netns::{
    bridge_host_local, host_links_on_bridge, links_at, require_root_and_plugins, HostBridge,
    IpamDir,
};
use plexus_tests::plexus::{
    fake_cni_bin, guest_wasm, plexus_bin, plexus_cni_bin, NodeDaemon, Sandbox,
};
use plexus_tests::runtime::{Runtime, RuntimeKind};
use plexus_tests::{deploy_manifest, tail};
use serde_json::{json, Value};

const NS: &str = "team";
const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";

/// One node and its cluster. Fields drop in order: the control plane's controllers (they must not schedule or
/// allocate again), kubelet (it must not start pods again), the DRA driver, then the runtime (its sandboxes' DEL
/// releases what they hold), the daemon, the API server.
struct Node {
    _control: Vec<Component>,
    /// The cluster network's name (its conflist's, and the network-status's default entry): one of this node's
    /// own, since in NRI mode its list is the runtime's, and CRI-O, when it starts, tears down every attachment the
    /// host's libcni cache holds under the names of its lists that is not one of its sandboxes.
    cluster: String,
    kubelet: Kubelet,
    driver: Option<DraDriver>,
    runtime: Runtime,
    daemon: NodeDaemon,
    api: KubeApiServer,
    bridges: Vec<(String, HostBridge)>,
    /// Each network's host-local subnet.
    subnets: Vec<(String, String)>,
    ipam: IpamDir,
    sb: Sandbox,
}

/// How the node's runtime reaches Plexus.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Plexus is the runtime's CNI configuration and delegates the cluster network (the standard's model).
    Cni,
    /// The runtime's only CNI configuration is the cluster network; the daemon, an NRI plugin of the runtime
    /// (`plexus daemon --nri`), attaches the rest.
    Nri,
}

/// The DRA driver of the test's devices.
const DRIVER: &str = "sriov.example.com";
const RESOURCE: &str = "example.com/sriov";

impl Node {
    fn start(kind: RuntimeKind, mode: Mode) -> Node {
        Node::start_with(kind, false, mode)
    }

    /// With `dra`: the cluster allocates devices as a current one does: the DeviceClass of the driver, the
    /// kube-scheduler, the controller-manager's resourceclaim controller, and the driver's kubelet plugin, which
    /// publishes this node's ResourceSlice (vf0-vf5 with both network attributes) and prepares claims; NAD
    /// `sriov-net` (net-b's bridge and a recording chained plugin, `resourceName` example.com/sriov), and the
    /// daemon waits for its DRA caches too.
    fn start_with(kind: RuntimeKind, dra: bool, mode: Mode) -> Node {
        require_root_and_plugins();
        let api = KubeApiServer::start(&[], &[]);
        api.apply_file(&deploy_manifest("crds.yaml"));
        api.apply_file(&deploy_manifest("rbac.yaml"));
        api.apply_node_authority();
        if dra {
            api.create(&json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": DRIVER},
                "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}]}
            }));
        }
        api.namespace(NS);
        api.namespace("other");
        let sb = Sandbox::new();
        let ipam = IpamDir::new();
        let mut bridges: Vec<(String, HostBridge)> = ["cluster", "net-a", "net-b", "net-c"]
            .into_iter()
            .zip(["kcl", "kna", "knb", "knc"])
            .map(|(net, tag)| (net.to_string(), HostBridge::reserve(tag)))
            .collect();
        let cluster = format!("cluster-{}", bridges[0].1.name());
        bridges[0].0 = cluster.clone();
        let confs: Vec<(String, Value)> = bridges
            .iter()
            .map(|(name, bridge)| (name.clone(), bridge_host_local(name, bridge, &ipam)))
            .collect();
        let subnets = confs
            .iter()
            .map(|(name, conf)| {
                let subnet = conf["plugins"][0]["ipam"]["ranges"][0][0]["subnet"].as_str();
                (name.clone(), subnet.unwrap().to_string())
            })
            .collect();
        sb.conf_file("00-cluster.conflist", &confs[0].1);
        api.nad(NS, "net-a", &confs[1].1);
        api.nad(NS, "net-b", &confs[2].1);
        api.nad("other", "net-c", &confs[3].1);
        if dra {
            let mut list = confs[2].1.clone();
            list["plugins"]
                .as_array_mut()
                .unwrap()
                .push(json!({"type": "recorder", "capabilities": {"deviceID": true}}));
            api.create(&json!({
                "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                "metadata": {"name": "sriov-net", "namespace": NS,
                    "annotations": {"k8s.v1.cni.cncf.io/resourceName": RESOURCE}},
                "spec": {"config": list.to_string()}
            }));
        }
        // The node's identity: a token bound to a pod on the node, as the DaemonSet pod's projected token is (the
        // API server authorizes a claim's network data by it).
        let token = api.node_bound_token("kube-system", "plexus", NODE);
        api.write_kubeconfig(&sb.path("plexus.kubeconfig"), &token);
        api.write_kubeconfig(&sb.path("admin.kubeconfig"), "admin-token");

        // Plexus's conf, with a policy hook that keeps pods to their own namespace's NADs: the runtime's CNI
        // conflist in CNI mode, the daemon's `--nri-conf` in NRI mode.
        let plexus = sb.conf(json!({
            "clusterNetwork": cluster,
            // The test driver's claims may carry CNI configurations (a node conf allows none by default).
            "claimCniDrivers": [DRIVER],
            "logFile": sb.path("plexus.log"),
            "cluster": {"source": "kube", "kubeconfig": sb.path("plexus.kubeconfig"),
                        "requestTimeoutMs": 2000, "deadlineMs": 5000, "retries": 2,
                        "initialBackoffMs": 20, "maxBackoffMs": 100},
            "daemon": {"socket": sb.path("run/daemon.sock"), "timeoutMs": 5000},
            "hooks": [{"name": "isolation", "kind": "policy",
                       "module": guest_wasm("namespace-isolation")}],
        }));
        // The runtime's CNI dirs: in CNI mode the CNI binary as `plexus` beside the reference plugins and plexus's
        // conflist; in NRI mode the reference plugins and the cluster network's conflist alone.
        let (bin, conf_dir) = match mode {
            Mode::Cni => cni_dirs(&sb, &plexus_cni_bin(), plexus.clone()),
            Mode::Nri => cluster_cni_dirs(&sb, &confs[0].1),
        };
        // The recording fake, chained after a real plugin: it passes the result on and keeps what it was given.
        std::os::unix::fs::symlink(fake_cni_bin(), bin.join("recorder"))
            .expect("link the recorder");

        // The CNI binary carries no wasm compiler: a hook of the conf is compiled once with the full binary, as an
        // operator does from the daemon's container (docs/operations.md).
        let compiled = Command::new(plexus_bin())
            .args(["hook", "compile"])
            .arg(guest_wasm("namespace-isolation"))
            .arg("--cache-dir")
            .arg(sb.path("cache"))
            .output()
            .expect("run plexus hook compile");
        assert!(
            compiled.status.success(),
            "plexus hook compile: {}",
            String::from_utf8_lossy(&compiled.stderr)
        );
        let start_daemon = |extra: &[&str]| {
            let daemon = NodeDaemon::start(
                NODE,
                &sb.path("plexus.kubeconfig"),
                &sb.path("run/daemon.sock"),
                &sb.path("cache"),
                &sb.path("daemon.log"),
                extra,
            );
            daemon.wait("synced", |h| {
                plexus_tests::plexus::settled(h) && (!dra || h.cache.dra_synced)
            });
            daemon
        };
        let (daemon, runtime) = match mode {
            Mode::Cni => {
                let daemon = start_daemon(&["--dynamic-networks"]);
                (daemon, Runtime::start(kind, &bin, &conf_dir))
            }
            // The runtime first: the daemon registers with its NRI socket once its caches have synced.
            Mode::Nri => {
                let runtime = Runtime::start(kind, &bin, &conf_dir);
                let conf = sb.path("nri-plexus.json");
                std::fs::write(&conf, plexus.to_string()).expect("the NRI mode's conf");
                let daemon = start_daemon(&[
                    "--dynamic-networks",
                    "--nri",
                    "--nri-socket",
                    runtime.nri_socket().to_str().unwrap(),
                    "--nri-conf",
                    conf.to_str().unwrap(),
                    "--nri-cni-path",
                    bin.to_str().unwrap(),
                ]);
                let until = Instant::now() + Duration::from_secs(20);
                while !daemon
                    .log_text()
                    .contains("registered with the runtime's NRI")
                {
                    assert!(
                        Instant::now() < until,
                        "the daemon did not register with the runtime's NRI:\n{}",
                        daemon.log_text()
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
                (daemon, runtime)
            }
        };
        let kubelet = Kubelet::start(&api, &runtime.socket());
        let (control, driver) = match dra {
            true => {
                let control = vec![
                    Component::scheduler(&api, &sb.path("")),
                    Component::controller_manager(
                        &api,
                        &sb.path(""),
                        &[
                            "resourceclaim-controller",
                            "garbage-collector-controller",
                            "node-lifecycle-controller",
                        ],
                    ),
                ];
                let devices = [
                    ("vf0", "0000:01:00.1"),
                    ("vf1", "0000:01:00.2"),
                    ("vf2", "0000:01:00.3"),
                    ("vf3", "0000:01:00.4"),
                    ("vf4", "0000:01:00.5"),
                    ("vf5", "0000:01:00.6"),
                ];
                let driver =
                    DraDriver::start(&api, &kubelet, DRIVER, RESOURCE, &devices, sb.path("dra"));
                (control, Some(driver))
            }
            false => (Vec::new(), None),
        };
        Node {
            _control: control,
            cluster,
            kubelet,
            driver,
            runtime,
            daemon,
            api,
            bridges,
            subnets,
            ipam,
            sb,
        }
    }

    /// `kubectl annotate --overwrite` of the pod's selection annotation.
    fn annotate(&self, networks: &str) {
        let value = format!("{NETWORKS}={networks}");
        self.kubectl(&["-n", NS, "annotate", "--overwrite", "pod", "web", &value]);
    }

    /// `kubectl create -f` of `manifest`, written to a file named after the object.
    fn kubectl_create(&self, manifest: &Value) {
        let file = self.sb.path(&format!(
            "{}.json",
            manifest["metadata"]["name"]
                .as_str()
                .expect("a named object")
        ));
        std::fs::write(&file, manifest.to_string()).unwrap();
        self.kubectl(&["create", "-f", &file.display().to_string()]);
    }

    /// `kubectl` as the cluster's admin; its stdout, failing the test unless it succeeds.
    #[track_caller]
    fn kubectl(&self, args: &[&str]) -> String {
        let out = Command::new(plexus_tests::parts::bin("kubectl"))
            .arg(format!(
                "--kubeconfig={}",
                self.sb.path("admin.kubeconfig").display()
            ))
            .arg("--request-timeout=20s")
            .args(args)
            .output()
            .expect("run kubectl");
        assert!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn pod(&self) -> Option<Value> {
        match self
            .api
            .request("GET", &format!("/api/v1/namespaces/{NS}/pods/web"), None)
        {
            Ok((200, body)) => serde_json::from_str(&body).ok(),
            _ => None,
        }
    }

    /// The pod's network-status: (network name, interface) of each entry.
    fn status(&self) -> Vec<(String, String)> {
        self.api.network_status(NS, "web")
    }

    /// The pod's events of `reason`: (type, message).
    fn events(&self, reason: &str) -> Vec<(String, String)> {
        self.api.events_of(NS, "web", reason)
    }

    /// Host-local's reservations of one network.
    fn reserved(&self, network: &str) -> Vec<std::net::IpAddr> {
        self.ipam.reserved_ips(network)
    }

    /// The subnet prefix (`a.b.c.`) of a network's range.
    fn prefix(&self, network: &str) -> String {
        let (_, subnet) = self.subnets.iter().find(|(n, _)| n == network).unwrap();
        format!("{}.", subnet.rsplit_once('.').unwrap().0)
    }

    fn logs(&self) -> String {
        let mut text = format!(
            "plexus log:\n{}\ndaemon log:\n{}\n{} log:\n{}\nkubelet log:\n{}",
            tail(&self.sb.path("plexus.log"), 40),
            tail(&self.daemon.log, 40),
            self.runtime.kind().name(),
            {
                let log = self.runtime.log();
                let lines: Vec<&str> = log.lines().collect();
                lines[lines.len().saturating_sub(20)..].join("\n")
            },
            self.kubelet.log_tail(40)
        );
        if let Some(pod) = self.pod() {
            text.push_str(&format!("\npod web's status: {}", pod["status"]));
        }
        if let Some(claim) = self.claim("web-nics") {
            text.push_str(&format!("\nclaim web-nics: {claim}"));
        }
        for log in [
            "kube-scheduler.log",
            "kube-controller-manager.log",
            "dra/dra-driver.log",
        ] {
            if self.sb.path(log).exists() {
                text.push_str(&format!("\n{log}:\n{}", tail(&self.sb.path(log), 20)));
            }
        }
        text
    }

    /// Waits (at most `secs`) until `ok` holds; names what was awaited and shows the logs if it does not.
    #[track_caller]
    fn within(&self, secs: u64, what: &str, ok: impl Fn() -> bool) -> Duration {
        let start = Instant::now();
        while !ok() {
            assert!(
                start.elapsed() < Duration::from_secs(secs),
                "{what}: not within {secs} s\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        start.elapsed()
    }
}

/// Interface names and IPv4 addresses in the namespace at `netns`, sorted by name.
fn interfaces(netns: &Path) -> Vec<(String, Vec<String>)> {
    let mut v: Vec<(String, Vec<String>)> = links_at(netns)
        .into_iter()
        .map(|l| {
            let cidrs = l.cidrs().into_iter().filter(|c| !c.contains(':')).collect();
            (l.ifname, cidrs)
        })
        .collect();
    v.sort();
    v
}

fn has_addr_in(ifs: &[(String, Vec<String>)], ifname: &str, prefix: &str) -> bool {
    ifs.iter()
        .any(|(n, cidrs)| n == ifname && cidrs.iter().any(|c| c.starts_with(prefix)))
}

plexus_tests::on_each_runtime!(
    kubectl_annotate_attaches_and_detaches_networks_of_a_running_pod,
    in_nri_mode_a_pods_networks_are_attached_changed_refused_and_released_as_in_cni_mode,
    a_pods_resource_claims_give_its_networks_their_devices,
    in_nri_mode_a_pods_resource_claims_give_its_networks_their_devices,
);

fn kubectl_annotate_attaches_and_detaches_networks_of_a_running_pod(kind: RuntimeKind) {
    a_pods_networks_over_its_life(kind, Mode::Cni)
}

/// The same life in NRI mode: the runtime's CNI sets up the cluster network, the daemon the rest.
fn in_nri_mode_a_pods_networks_are_attached_changed_refused_and_released_as_in_cni_mode(
    kind: RuntimeKind,
) {
    a_pods_networks_over_its_life(kind, Mode::Nri)
}

/// A pod's networks from its creation to its deletion: the sandbox's ADD, a missing NAD and a network the policy
/// denies failing their sandboxes and leaving nothing, `kubectl annotate` adding and removing a network of the
/// running pod (and a denied one changing nothing), and nothing left on the node once it is deleted.
fn a_pods_networks_over_its_life(kind: RuntimeKind, mode: Mode) {
    let node = Node::start(kind, mode);
    node.kubectl_create(&pod_on_node(NS, "web", "net-a"));
    node.within(90, "the pod Running", || {
        node.pod()
            .is_some_and(|p| p["status"]["phase"] == "Running")
    });

    // The sandbox the runtime made, from the plan plexus cached for it (the node's own plexus pod runs on the
    // host's network: no plan for it, in either mode).
    let ids = node.sb.cached();
    assert_eq!(ids.len(), 1, "one sandbox: {ids:?}\n{}", node.logs());
    let plan = node
        .sb
        .cached_plan(ids[0].trim_end_matches(".json"))
        .unwrap();
    let netns = PathBuf::from(plan["netns"].as_str().unwrap());
    let ifs = interfaces(&netns);
    assert!(
        has_addr_in(&ifs, "eth0", &node.prefix(&node.cluster)),
        "{ifs:?}"
    );
    assert!(has_addr_in(&ifs, "net1", &node.prefix("net-a")), "{ifs:?}");
    node.within(20, "the ADD's network-status", || {
        node.status()
            == [
                (node.cluster.clone(), "eth0".to_string()),
                (format!("{NS}/net-a"), "net1".to_string()),
            ]
    });
    // The default entry carries the cluster network's address as the pod's eth0 has it (in NRI mode read from
    // the sandbox, the runtime's CNI having made it).
    let default = node.pod().and_then(|p| {
        let status = p["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"].as_str()?;
        serde_json::from_str::<Vec<Value>>(status)
            .ok()?
            .into_iter()
            .next()
    });
    let default = default.expect("the network-status's first entry");
    assert_eq!(default["default"], true, "{default}");
    let eth0 = ifs.iter().find(|(n, _)| n == "eth0").unwrap();
    assert_eq!(default["ips"], json!(eth0.1), "{default} against {eth0:?}");

    // Pods whose sandbox cannot have its networks fail it, the kubelet's event saying why, and the failed attempts
    // leave no address behind: one selecting a NAD that does not exist, one a NAD of another namespace (the policy
    // hook denies it).
    node.kubectl_create(&pod_on_node(NS, "lost", "net-missing"));
    node.kubectl_create(&pod_on_node(NS, "denied", "other/net-c"));
    for (pod, names) in [("lost", "net-missing"), ("denied", "other/net-c")] {
        node.within(60, &format!("the kubelet's event naming {names}"), || {
            node.api
                .events_of(NS, pod, "FailedCreatePodSandBox")
                .iter()
                .any(|(kind, m)| kind == "Warning" && m.contains(names))
        });
    }
    // (Awaited: in NRI mode each of the kubelet's attempts has the runtime's CNI reserve an address before the
    // daemon refuses the sandbox and the runtime releases it; one leaked would stay.)
    node.within(
        20,
        "only web's address: the failed sandboxes released theirs",
        || node.reserved(&node.cluster).len() == 1,
    );
    assert!(node.reserved("net-c").is_empty());
    node.kubectl(&["-n", NS, "delete", "pod", "lost", "denied", "--wait=false"]);

    // Added: the interface is in the pod's namespace with a host-local address, and the status lists it.
    node.annotate("net-a,net-b");
    let took = node.within(20, "net-b attached and in the network-status", || {
        node.status()
            .contains(&(format!("{NS}/net-b"), "net2".to_string()))
    });
    eprintln!("kubectl annotate to network-status: {took:?}");
    let ifs = interfaces(&netns);
    assert!(has_addr_in(&ifs, "net2", &node.prefix("net-b")), "{ifs:?}");
    assert_eq!(node.reserved("net-b").len(), 1);
    // The event is posted once the change is done, apart from the status write: it may come a little later.
    node.within(20, "the NetworksChanged event naming net-b", || {
        node.events("NetworksChanged")
            .iter()
            .any(|(_, m)| m.contains("net-b"))
    });

    // Removed: the interface is gone and its address released; the rest is untouched.
    node.annotate("net-a");
    node.within(20, "net-b detached and released", || {
        !interfaces(&netns).iter().any(|(n, _)| n == "net2") && node.reserved("net-b").is_empty()
    });
    node.within(20, "the network-status without net-b", || {
        node.status().len() == 2
    });
    let before = interfaces(&netns);
    assert!(
        has_addr_in(&before, "net1", &node.prefix("net-a")),
        "{before:?}"
    );

    // A network the policy hook denies: nothing changes, and a Warning event names it.
    node.annotate("net-a,other/net-c");
    node.within(20, "the Warning naming other/net-c", || {
        node.events("NetworkChangeFailed")
            .iter()
            .any(|(kind, m)| kind == "Warning" && m.contains("other/net-c"))
    });
    assert_eq!(interfaces(&netns), before);
    assert!(node.reserved("net-c").is_empty());
    assert_eq!(node.status().len(), 2, "{:?}", node.status());
    // All the while the pod ran on in the same sandbox.
    let pod = node.pod().unwrap();
    assert_eq!(pod["status"]["phase"], "Running");
    assert_eq!(pod["status"]["containerStatuses"][0]["restartCount"], 0);
    assert_eq!(node.sb.cached(), ids);

    // Deleted: kubelet stops the sandbox and nothing is left on the node.
    node.kubectl(&["-n", NS, "delete", "pod", "web", "--wait=false"]);
    node.within(90, "the pod gone from the API", || node.pod().is_none());
    node.within(60, "every address released and the plan gone", || {
        [node.cluster.as_str(), "net-a", "net-b", "net-c"]
            .iter()
            .all(|n| node.reserved(n).is_empty())
            && node.sb.cached().is_empty()
    });
    node.within(60, "the pod's network namespace removed", || {
        !netns.exists()
    });
    // kubelet and the runtime repeat the DEL for a while (its garbage collection): what one leaked would stay.
    let bin = node.sb.path("cni-bin").display().to_string();
    let leftovers = || {
        let locks = std::fs::read_dir(node.sb.path("run/locks"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned());
        let running = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.starts_with(&bin));
        locks.chain(running).collect::<Vec<String>>()
    };
    node.within(30, "no lock file and no CNI process left", || {
        leftovers().is_empty()
    });
    for (net, bridge) in &node.bridges {
        assert!(
            host_links_on_bridge(bridge.name()).is_empty(),
            "a veth left on {net}'s bridge: {:?}",
            host_links_on_bridge(bridge.name())
        );
    }
}

/// What the recording chained plugin was given on ADD: (CNI_IFNAME, top-level deviceID, runtimeConfig deviceID).
fn recorded_devices(sb: &Sandbox) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(sb.path("cni-bin/calls.jsonl")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|c| c["command"] == "ADD")
        .map(|c| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                s(&c["env"]["CNI_IFNAME"]),
                s(&c["stdin"]["deviceID"]),
                s(&c["stdin"]["runtimeConfig"]["deviceID"]),
            )
        })
        .collect()
}

/// Claims as the DRA drivers write them, through the real scheduler, resourceclaim controller and kubelet: pod
/// `drivers` has claim `cni-nics` (its `first`), whose request carries a CNI configuration in the CNI DRA driver's
/// form, and a claim the controller makes from template `ref-nics` (its `second`) after the pod appears, whose
/// device the suite's driver writes network data for itself. The annotation's `sriov-net` names the `second` claim
/// (`dev.plexus.resourceClaim`): it gets that claim's device although `first`'s has the same resource and comes
/// first; the carried configuration attaches on its `ifName` with `first`'s device; Plexus writes the carried
/// network's data and leaves the driver's alone. Its third claim, `shared-nics`, has two requests the scheduler
/// allocates from one device shared (KEP-5075), each asking for a network: each share gets an entry of its own
/// with its `shareID`. Returns the three claims' names.
fn claims_as_the_drivers_write_them(node: &Node) -> [String; 3] {
    let carried = bridge_host_local("carried", &node.bridges[3].1, &node.ipam);
    let carried_subnet = carried["plugins"][0]["ipam"]["ranges"][0][0]["subnet"]
        .as_str()
        .unwrap()
        .to_string();
    let carried_prefix = format!("{}.", carried_subnet.rsplit_once('.').unwrap().0);
    node.api.create(&json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "cni-nics", "namespace": NS},
        "spec": claim_spec(&[("cni", "0000:01:00.5")], json!([{"requests": ["cni"], "opaque": {
            "driver": DRIVER, "parameters": {"apiVersion": "cni.networking.x-k8s.io/v1alpha1",
                "kind": "CNI", "ifName": "cni0", "config": carried}}}]))
    }));
    node.api.create(&json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "ref-nics", "namespace": NS},
        "spec": {"spec": claim_spec(&[(DRIVER_OWNED_REQUEST, "0000:01:00.6")], json!([]))}
    }));
    let share_of = |request: &str, network: &str, ifname: &str| {
        json!({"requests": [request], "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "plexus.dev/v1alpha1", "kind": "NetworkAttachment",
            "name": network, "interface": ifname}}})
    };
    node.api.create(&json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "shared-nics", "namespace": NS},
        "spec": claim_spec(&[("s1", SHARED_DEVICE.1), ("s2", SHARED_DEVICE.1)],
                           json!([share_of("s1", "net-a", "sh1"), share_of("s2", "net-b", "sh2")]))
    }));
    let networks = json!([{"name": "sriov-net", "interface": "ref1",
                           "dev.plexus.resourceClaim": {"name": "second"}}]);
    let mut pod = pod_on_node(NS, "drivers", &networks.to_string());
    pod["spec"].as_object_mut().unwrap().remove("nodeName");
    pod["spec"]["resourceClaims"] = json!([{"name": "first", "resourceClaimName": "cni-nics"},
                                           {"name": "second", "resourceClaimTemplateName": "ref-nics"},
                                           {"name": "third", "resourceClaimName": "shared-nics"}]);
    pod["spec"]["containers"][0]["resources"] =
        json!({"claims": [{"name": "first"}, {"name": "second"}, {"name": "third"}]});
    node.api.create(&pod);
    node.within(90, "pod drivers Running", || {
        node.api
            .request(
                "GET",
                &format!("/api/v1/namespaces/{NS}/pods/drivers"),
                None,
            )
            .ok()
            .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
            .is_some_and(|p| p["status"]["phase"] == "Running")
    });
    let generated = node
        .generated_claim("drivers")
        .expect("the claim made from ref-nics");
    node.within(20, "drivers' network-status", || {
        node.api.network_status(NS, "drivers")
            == [
                (node.cluster.clone(), "eth0".to_string()),
                (format!("{NS}/sriov-net"), "ref1".to_string()),
                (format!("{NS}/carried"), "cni0".to_string()),
                (format!("{NS}/net-a"), "sh1".to_string()),
                (format!("{NS}/net-b"), "sh2".to_string()),
            ]
    });
    assert!(
        recorded_devices(&node.sb).contains(&(
            "ref1".to_string(),
            "0000:01:00.6".to_string(),
            "0000:01:00.6".to_string()
        )),
        "sriov-net got the device of the claim it names: {:?}",
        recorded_devices(&node.sb)
    );
    assert!(
        node.driver
            .as_ref()
            .unwrap()
            .calls()
            .contains(&format!("networkData {NS}/{generated}")),
        "the driver wrote its network data when it prepared the claim"
    );
    node.within(20, "the carried network's data", || {
        node.claim_devices("cni-nics").len() == 1
    });
    let entry = &node.claim_devices("cni-nics")[0];
    assert_eq!(
        (&entry["device"], &entry["networkData"]["interfaceName"]),
        (&json!("vf4"), &json!("cni0")),
        "{entry}"
    );
    let ips = entry["networkData"]["ips"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        ips.iter().any(|ip| ip
            .as_str()
            .is_some_and(|ip| ip.starts_with(&carried_prefix))),
        "{entry}"
    );
    // The driver's entry is as the driver wrote it: Plexus did not take it over.
    let owned = node.claim_devices(&generated);
    assert_eq!(owned.len(), 1, "{owned:?}");
    assert_eq!(owned[0]["device"], "vf5");
    assert_eq!(
        owned[0]["networkData"],
        json!({"interfaceName": "drv-vf5", "ips": ["192.0.2.10/24"]}),
        "{owned:?}"
    );
    // The shares: one device allocated twice, each allocation with its shareID, each share's entry its own.
    let shared = node.claim("shared-nics").unwrap();
    let shares: Vec<(String, String)> = shared["status"]["allocation"]["devices"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["device"], SHARED_DEVICE.0, "{r}");
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (s(&r["request"]), s(&r["shareID"]))
        })
        .collect();
    assert!(
        shares.len() == 2
            && shares.iter().all(|(_, id)| !id.is_empty())
            && shares[0].1 != shares[1].1,
        "the scheduler allocated two shares: {shared:#}"
    );
    node.within(20, "the shares' network data", || {
        node.claim_devices("shared-nics").len() == 2
    });
    for (request, ifname) in [("s1", "sh1"), ("s2", "sh2")] {
        let (_, share) = shares.iter().find(|(r, _)| r == request).unwrap();
        let entries = node.claim_devices("shared-nics");
        let entry = entries.iter().find(|e| e["shareID"] == share.as_str());
        assert_eq!(
            entry.map(|e| e["networkData"]["interfaceName"].clone()),
            Some(json!(ifname)),
            "share {share} of {request}: {entries:?}"
        );
    }
    ["cni-nics".to_string(), generated, "shared-nics".to_string()]
}

/// How a pod names its device claim.
enum ClaimRef<'a> {
    /// A ResourceClaim of that name.
    Claim(&'a str),
    /// A ResourceClaimTemplate of that name: the resourceclaim controller makes the pod's claim from it.
    Template(&'a str),
}

/// A claim's spec asking for one device of the driver per request (request, PCI address): each request's device is
/// picked by its `k8s.cni.cncf.io/deviceID` attribute (a CEL selector), so the test knows what the scheduler
/// allocates; `config` is the claim's device configuration.
fn claim_spec(requests: &[(&str, &str)], config: Value) -> Value {
    let requests: Vec<Value> = requests
        .iter()
        .map(|(name, pci)| {
            let cel = format!("device.attributes['k8s.cni.cncf.io'].deviceID == '{pci}'");
            json!({"name": name, "exactly": {"deviceClassName": DRIVER,
                                             "selectors": [{"cel": {"expression": cel}}]}})
        })
        .collect();
    json!({"devices": {"requests": requests, "config": config}})
}

impl Node {
    /// Pod `name` selecting `networks`, with the device claim `claim`, left to the scheduler (no node named).
    fn pod_with_claim(&self, name: &str, networks: Option<&str>, claim: ClaimRef<'_>) {
        let mut pod = pod_on_node(NS, name, networks.unwrap_or(""));
        if networks.is_none() {
            pod["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("annotations");
        }
        let source = match claim {
            ClaimRef::Claim(c) => json!({"resourceClaimName": c}),
            ClaimRef::Template(t) => json!({"resourceClaimTemplateName": t}),
        };
        with_claim(&mut pod, source);
        self.api.create(&pod);
    }

    fn claim(&self, claim: &str) -> Option<Value> {
        let path = format!("/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{claim}");
        match self.api.request("GET", &path, None) {
            Ok((200, body)) => serde_json::from_str(&body).ok(),
            _ => None,
        }
    }

    fn claim_devices(&self, claim: &str) -> Vec<Value> {
        self.claim(claim)
            .and_then(|c| c["status"]["devices"].as_array().cloned())
            .unwrap_or_default()
    }

    /// The name of the claim the resourceclaim controller made for pod `pod` (`status.resourceClaimStatuses`).
    fn generated_claim(&self, pod: &str) -> Option<String> {
        let (code, body) = self
            .api
            .request("GET", &format!("/api/v1/namespaces/{NS}/pods/{pod}"), None)
            .ok()?;
        let pod: Value = serde_json::from_str(&body).ok().filter(|_| code == 200)?;
        pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
            .as_str()
            .map(str::to_string)
    }
}

/// Dynamic Resource Allocation on a real node, as a current cluster does it: the kube-scheduler allocates a pod's
/// claims from the ResourceSlice the driver's kubelet plugin published and binds the pod, the kubelet has the plugin
/// prepare them (NodePrepareResources) before it makes the sandbox, and the resourceclaim controller makes a claim
/// from a template and names it in the pod's status. Through Plexus: a pod whose NAD takes its claim's device (the
/// chained plugin sees the device ID), the claim's own network on its interface name, the claim's
/// `status.devices[]` with the interfaces' real addresses and MACs, accepted by the API server from the node's
/// identity; a claim (from a template) naming a missing NAD fails the sandbox, naming the claim, and leaves no
/// address behind; once the pods are gone the network data is taken back, the driver unprepares the claims and the
/// controller deallocates them.
fn a_pods_resource_claims_give_its_networks_their_devices(kind: RuntimeKind) {
    claims_give_networks_devices(kind, Mode::Cni)
}

/// The same in NRI mode.
fn in_nri_mode_a_pods_resource_claims_give_its_networks_their_devices(kind: RuntimeKind) {
    claims_give_networks_devices(kind, Mode::Nri)
}

fn claims_give_networks_devices(kind: RuntimeKind, mode: Mode) {
    let node = Node::start_with(kind, true, mode);
    let driver = node.driver.as_ref().unwrap();
    let attachment = |name: &str, interface: &str| {
        json!([{"requests": ["extra"], "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "plexus.dev/v1alpha1", "kind": "NetworkAttachment",
            "name": name, "interface": interface}}}])
    };
    node.api.create(&json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "web-nics", "namespace": NS},
        "spec": claim_spec(&[("nic", "0000:01:00.1"), ("extra", "0000:01:00.2")],
                           attachment("net-a", "dra0"))
    }));
    node.pod_with_claim("web", Some("sriov-net"), ClaimRef::Claim("web-nics"));
    node.within(90, "the pod Running", || {
        node.pod()
            .is_some_and(|p| p["status"]["phase"] == "Running")
    });
    assert_eq!(
        node.pod().unwrap()["spec"]["nodeName"],
        NODE,
        "the scheduler placed it"
    );
    let claim = node.claim("web-nics").unwrap();
    assert_eq!(
        allocated(&claim),
        [
            ("nic".to_string(), "vf0".to_string()),
            ("extra".to_string(), "vf1".to_string())
        ],
        "the scheduler allocated the selected devices: {claim:#}"
    );
    assert_eq!(claim["status"]["reservedFor"][0]["name"], "web");
    let prepared: Vec<String> = driver
        .calls()
        .into_iter()
        .filter(|c| c.starts_with(&format!("prepare {NS}/web-nics ")))
        .collect();
    assert!(
        prepared.len() == 1 && prepared[0].ends_with("nic=node1/vf0 extra=node1/vf1"),
        "the kubelet had the driver prepare the claim: {:?}",
        driver.calls()
    );

    let ids = node.sb.cached();
    assert_eq!(ids.len(), 1, "one sandbox: {ids:?}\n{}", node.logs());
    let plan = node
        .sb
        .cached_plan(ids[0].trim_end_matches(".json"))
        .unwrap();
    let netns = PathBuf::from(plan["netns"].as_str().unwrap());
    let ifs = interfaces(&netns);
    assert!(has_addr_in(&ifs, "net1", &node.prefix("net-b")), "{ifs:?}");
    assert!(has_addr_in(&ifs, "dra0", &node.prefix("net-a")), "{ifs:?}");
    assert_eq!(
        recorded_devices(&node.sb),
        [(
            "net1".to_string(),
            "0000:01:00.1".to_string(),
            "0000:01:00.1".to_string()
        )],
        "the NAD's chained plugin got the claim device's ID"
    );
    node.within(20, "the network-status of three", || {
        node.status()
            == [
                (node.cluster.clone(), "eth0".to_string()),
                (format!("{NS}/sriov-net"), "net1".to_string()),
                (format!("{NS}/net-a"), "dra0".to_string()),
            ]
    });

    // The claim's status: each device's interface, its real addresses and MAC.
    node.within(20, "the claim's network data", || {
        node.claim_devices("web-nics").len() == 2
    });
    let links = links_at(&netns);
    for (device, ifname) in [("vf0", "net1"), ("vf1", "dra0")] {
        let devices = node.claim_devices("web-nics");
        let entry = devices.iter().find(|d| d["device"] == device).unwrap();
        let link = links.iter().find(|l| l.ifname == ifname).unwrap();
        let data = &entry["networkData"];
        assert_eq!(data["interfaceName"], ifname, "{entry}");
        assert_eq!(
            data["hardwareAddress"].as_str(),
            link.address.as_deref(),
            "{entry}"
        );
        let ips: Vec<String> = data["ips"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        let real: Vec<String> = link
            .cidrs()
            .into_iter()
            .filter(|c| !c.contains(':'))
            .collect();
        assert_eq!(ips, real, "{entry}");
        assert_eq!(entry["conditions"][0]["type"], "Ready");
    }

    let drivers_claims = claims_as_the_drivers_write_them(&node);

    // A claim made from a template, naming a NAD that does not exist: the sandbox fails, naming the claim the
    // controller made, and nothing stays.
    node.api.create(&json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "bad-nics", "namespace": NS},
        "spec": {"spec": claim_spec(&[("extra", "0000:01:00.3")], attachment("nope", "bad0"))}
    }));
    node.pod_with_claim("bad", None, ClaimRef::Template("bad-nics"));
    node.within(60, "the claim made from the template", || {
        node.generated_claim("bad").is_some()
    });
    let bad_claim = node.generated_claim("bad").unwrap();
    node.within(60, "a Warning naming the claim", || {
        node.api
            .events_of(NS, "bad", "NetworkAttachFailed")
            .iter()
            .any(|(_, m)| {
                m.contains(&format!("ResourceClaim {NS}/{bad_claim}")) && m.contains("nope")
            })
    });
    assert!(
        driver
            .calls()
            .iter()
            .any(|c| c.starts_with(&format!("prepare {NS}/{bad_claim} "))
                && c.ends_with("extra=node1/vf2")),
        "{:?}",
        driver.calls()
    );
    // (Awaited: in NRI mode each of the kubelet's attempts has the runtime's CNI reserve an address first.)
    node.within(20, "only the addresses of web and drivers", || {
        node.reserved(&node.cluster).len() == 2
    });

    // Gone: the claim's network data goes with the pod, the driver unprepares the claims, the controller
    // deallocates the claim and deletes the one it made.
    node.kubectl(&[
        "-n",
        NS,
        "delete",
        "pod",
        "web",
        "bad",
        "drivers",
        "--wait=false",
    ]);
    node.within(90, "the pods gone", || {
        node.pod().is_none() && node.sb.cached().is_empty()
    });
    node.within(30, "the claim's network data taken back", || {
        ["web-nics", "cni-nics", "shared-nics"]
            .iter()
            .all(|c| node.claim_devices(c).is_empty())
    });
    assert!(node.ipam.reserved_ips("carried").is_empty());
    // Only its pods' claims, each by name: no list or watch of claims by the node's identity.
    let mut ours = vec!["web-nics".to_string(), bad_claim.clone()];
    ours.extend(drivers_claims);
    let claim_requests: Vec<(String, String)> = node
        .api
        .requests_of(PLEXUS_USER)
        .into_iter()
        .filter(|(_, uri)| uri.contains("/resourceclaims"))
        .collect();
    assert!(!claim_requests.is_empty());
    for (verb, uri) in &claim_requests {
        let prefix = format!("/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/");
        let name = uri
            .strip_prefix(&prefix)
            .map(|rest| rest.split(['/', '?']).next().unwrap_or(""));
        assert!(
            matches!(verb.as_str(), "get" | "patch" | "update") && name.is_some_and(|n| ours.iter().any(|o| o == n)),
            "the node asked for something else than its pods' claims by name: {verb} {uri}\n{claim_requests:?}"
        );
    }
    node.within(
        30,
        "the claim deallocated, the template's claim deleted",
        || {
            node.claim("web-nics")
                .is_some_and(|c| c["status"]["allocation"].is_null())
                && node.claim(&bad_claim).is_none()
        },
    );
    for claim in ["web-nics", bad_claim.as_str()] {
        assert!(
            driver
                .calls()
                .iter()
                .any(|c| c.starts_with(&format!("unprepare {NS}/{claim} "))),
            "{claim} unprepared: {:?}",
            driver.calls()
        );
    }
    node.within(30, "every address released", || {
        [node.cluster.as_str(), "net-a", "net-b"]
            .iter()
            .all(|n| node.reserved(n).is_empty())
    });
}
