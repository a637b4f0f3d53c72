//! ADD, DEL, CHECK, STATUS and GC in process, without root: in-memory fakes of every outside effect (delegate
//! exec, the cluster source, the pod's network) and a temp dir for the cache and locks. The real-namespace,
//! libcni and containerd suites under `tests/` are the integration layer; these pin the orchestration itself.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use plexus_cluster::{Cluster, ClusterError, ObjectKind, PodEvent};

use crate::podresources::FixedDevices;

static NO_DEVICES: FixedDevices = FixedDevices(std::collections::BTreeMap::new());
use plexus_core::spec::{NetworkAttachmentDefinition, Pod, PodRef, Selection};
use plexus_hooks::PolicyOutcome;
use serde_json::{json, Value};

use crate::conf::stdin_json;
use crate::effects::Effects;
use crate::error::PlexusError;
use crate::exec::{Exec, ExecOutput, ExecRequest};
use crate::hooks::{HookRunner, NoHooks};
use crate::invocation::{ClusterBy, Invocation};
use crate::orchestrate;
use crate::podnet::PodNetwork;

/// One delegate call as the fake saw it.
#[derive(Debug, Clone, PartialEq)]
struct Call {
    plugin: String,
    command: String,
    ifname: String,
    stdin: Value,
}

/// Delegates that attach nothing: ADD answers a result naming `CNI_IFNAME`, everything else succeeds, unless
/// a failure was set for (plugin, command).
#[derive(Default)]
struct FakeExec {
    calls: RefCell<Vec<Call>>,
    failures: BTreeSet<(String, String)>,
}

impl FakeExec {
    fn failing(plugin: &str, command: &str) -> FakeExec {
        FakeExec {
            failures: [(plugin.to_string(), command.to_string())].into(),
            ..FakeExec::default()
        }
    }

    fn summary(&self) -> Vec<(String, String, String)> {
        self.calls
            .borrow()
            .iter()
            .map(|c| (c.plugin.clone(), c.command.clone(), c.ifname.clone()))
            .collect()
    }
}

impl Exec for FakeExec {
    fn run(&self, req: &ExecRequest<'_>) -> std::io::Result<ExecOutput> {
        let env: BTreeMap<&str, &str> = req
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let plugin = req
            .plugin
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let command = env["CNI_COMMAND"].to_string();
        let ifname = env
            .get("CNI_IFNAME")
            .copied()
            .unwrap_or_default()
            .to_string();
        let stdin: Value = serde_json::from_slice(req.stdin).unwrap();
        self.calls.borrow_mut().push(Call {
            plugin: plugin.clone(),
            command: command.clone(),
            ifname: ifname.clone(),
            stdin: stdin.clone(),
        });
        if self.failures.contains(&(plugin.clone(), command.clone())) {
            let err = json!({"cniVersion": "1.0.0", "code": 11, "msg": format!("{plugin} refuses {command}")});
            return Ok(ExecOutput {
                code: Some(1),
                stdout: err.to_string().into_bytes(),
                ..ExecOutput::default()
            });
        }
        let stdout = if command == "ADD" {
            let n = self.calls.borrow().len();
            stdin.get("prevResult").cloned().unwrap_or_else(|| {
                json!({"cniVersion": stdin["cniVersion"], "interfaces": [{"name": ifname, "sandbox": "/run/netns/x"}],
                       "ips": [{"address": format!("10.0.0.{n}/24"), "interface": 0}]})
            })
            .to_string()
        } else {
            String::new()
        };
        Ok(ExecOutput {
            code: Some(0),
            stdout: stdout.into_bytes(),
            ..ExecOutput::default()
        })
    }

    fn find(&self, plugin: &str, _: &[PathBuf]) -> Option<PathBuf> {
        Some(Path::new("/fake").join(plugin))
    }
}

/// Pods and NADs in memory; what plexus writes back is recorded.
#[derive(Default)]
struct FakeCluster {
    pods: BTreeMap<(String, String), Pod>,
    nads: BTreeMap<(String, String), NetworkAttachmentDefinition>,
    statuses: RefCell<Vec<(String, Value)>>,
    /// Warning events: (pod and the node reporting it, reason and message).
    warnings: RefCell<Vec<(String, String)>>,
    down: bool,
    /// What the pod's ResourceClaims give (every pod's).
    claims: plexus_core::spec::dra::PodClaims,
    /// The claims cannot be read (the API server stops answering claim reads).
    claims_down: bool,
    /// Claim status writes: (claim, interfaces of its entries).
    claim_writes: RefCell<Vec<(String, Vec<String>)>>,
}

impl FakeCluster {
    fn with_pod(networks: &str) -> FakeCluster {
        let mut c = FakeCluster::default();
        c.pods.insert(
            ("ns".into(), "web".into()),
            Pod {
                namespace: "ns".into(),
                name: "web".into(),
                uid: Some("uid-web".into()),
                annotations: [(
                    "k8s.v1.cni.cncf.io/networks".to_string(),
                    networks.to_string(),
                )]
                .into(),
                node_name: Some("node-a".into()),
                ..Pod::default()
            },
        );
        for name in ["a", "b", "c"] {
            c.nads.insert(
                ("ns".into(), name.into()),
                NetworkAttachmentDefinition {
                    namespace: "ns".into(),
                    name: name.into(),
                    config: Some(
                        json!({"cniVersion": "1.0.0", "type": format!("{name}-plugin")})
                            .to_string(),
                    ),
                    annotations: BTreeMap::new(),
                },
            );
        }
        c
    }
}

impl Cluster for FakeCluster {
    fn pod(&self, pod: &PodRef) -> Result<Pod, ClusterError> {
        if self.down {
            return Err(ClusterError::unavailable("connection refused"));
        }
        self.pods
            .get(&(pod.namespace.clone(), pod.name.clone()))
            .cloned()
            .ok_or_else(|| ClusterError::NotFound {
                object: ObjectKind::Pod,
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
            })
    }

    fn nad(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<NetworkAttachmentDefinition, ClusterError> {
        if self.down {
            return Err(ClusterError::unavailable("connection refused"));
        }
        self.nads
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| ClusterError::NotFound {
                object: ObjectKind::NetworkAttachmentDefinition,
                namespace: namespace.into(),
                name: name.into(),
            })
    }

    fn pod_claims(&self, _pod: &Pod) -> Result<plexus_core::spec::dra::PodClaims, ClusterError> {
        if self.claims_down {
            return Err(ClusterError::unavailable("connection refused"));
        }
        Ok(self.claims.clone())
    }

    fn write_claim_status(
        &self,
        _pod: &PodRef,
        claim: &plexus_core::spec::dra::ClaimName,
        devices: &[plexus_core::spec::dra::DeviceNetworkData],
    ) -> Result<(), ClusterError> {
        let interfaces = devices
            .iter()
            .filter_map(|d| d.interface_name.clone())
            .collect();
        self.claim_writes
            .borrow_mut()
            .push((claim.to_string(), interfaces));
        Ok(())
    }

    fn write_status(&self, pod: &PodRef, network_status: &str) -> Result<(), ClusterError> {
        self.statuses.borrow_mut().push((
            pod.to_string(),
            serde_json::from_str(network_status).unwrap(),
        ));
        Ok(())
    }

    fn record(&self, event: &PodEvent<'_>) -> Result<(), ClusterError> {
        if !event.warning {
            return Ok(());
        }
        self.warnings.borrow_mut().push((
            format!("{} from {}", event.pod, event.node.unwrap_or("?")),
            format!("{}: {}", event.reason, event.message),
        ));
        Ok(())
    }
}

/// The pod's network: nothing to do without default-route selections.
struct NoPodNetwork;

impl PodNetwork for NoPodNetwork {
    fn set_default_route(
        &self,
        _: &str,
        _: &str,
        _: &[IpAddr],
        _: &[String],
    ) -> Result<(), PlexusError> {
        Ok(())
    }
}

/// A node: confDir with the cluster network `cluster-net` (plugin `cluster-plugin`), cacheDir, runDir.
struct Node {
    dir: tempfile::TempDir,
    version: &'static str,
}

impl Node {
    fn new(version: &'static str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("net.d")).unwrap();
        std::fs::write(
            dir.path().join("net.d/00-cluster.conflist"),
            json!({"cniVersion": version, "name": "cluster-net", "plugins": [{"type": "cluster-plugin"}]})
                .to_string(),
        )
        .unwrap();
        Node { dir, version }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn invocation(&self, command: &str, extra: Value) -> Invocation {
        let mut conf = json!({
            "cniVersion": self.version, "name": "plexus", "type": "plexus", "clusterNetwork": "cluster-net",
            "confDir": self.path("net.d"), "cacheDir": self.path("cache"), "runDir": self.path("run"),
        });
        for (k, v) in extra.as_object().unwrap() {
            conf[k] = v.clone();
        }
        let env: BTreeMap<String, String> = [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/fake"),
            (
                "CNI_ARGS",
                "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web;K8S_POD_UID=uid-web",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        Invocation::from_env(&env, stdin_json(conf.to_string().as_bytes())).unwrap()
    }

    fn cached(&self) -> bool {
        self.path("cache/attachments/c1.json").exists()
    }
}

fn effects<'a>(exec: &'a FakeExec, cluster: &'a FakeCluster) -> Effects<'a> {
    Effects {
        exec,
        cluster: Some(cluster),
        podnet: &NoPodNetwork,
        hooks: &NoHooks,
        devices: &NO_DEVICES,
    }
}

fn s(plugin: &str, command: &str, ifname: &str) -> (String, String, String) {
    (plugin.into(), command.into(), ifname.into())
}

#[test]
fn add_attaches_in_order_publishes_status_and_returns_the_cluster_result() {
    let node = Node::new("1.0.0");
    let (exec, cluster) = (FakeExec::default(), FakeCluster::with_pod("a,b"));
    let result = orchestrate::add(
        &node.invocation("ADD", json!({})),
        &effects(&exec, &cluster),
    )
    .unwrap();
    assert_eq!(
        exec.summary(),
        vec![
            s("cluster-plugin", "ADD", "eth0"),
            s("a-plugin", "ADD", "net1"),
            s("b-plugin", "ADD", "net2")
        ]
    );
    assert_eq!(result["interfaces"][0]["name"], "eth0");
    let statuses = cluster.statuses.borrow();
    let names: Vec<&Value> = statuses[0]
        .1
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["name"])
        .collect();
    assert_eq!(names, vec!["cluster-net", "ns/a", "ns/b"]);
    assert!(node.cached());
}

#[test]
fn a_failure_in_the_nth_attachment_rolls_back_the_earlier_ones_in_reverse() {
    let node = Node::new("1.0.0");
    let (exec, cluster) = (
        FakeExec::failing("c-plugin", "ADD"),
        FakeCluster::with_pod("a,b,c"),
    );
    let err = orchestrate::add(
        &node.invocation("ADD", json!({})),
        &effects(&exec, &cluster),
    )
    .unwrap_err();
    assert_eq!(err.cni_code(), 11, "the delegate's own code");
    assert!(err.to_string().contains("network ns/c (net3)"), "{err}");
    // The failed attachment gets its DEL (CNI: a failed ADD is followed by DEL), then the earlier ones in
    // reverse; nothing after it ran.
    assert_eq!(
        exec.summary()[4..],
        [
            s("c-plugin", "DEL", "net3"),
            s("b-plugin", "DEL", "net2"),
            s("a-plugin", "DEL", "net1"),
            s("cluster-plugin", "DEL", "eth0")
        ]
    );
    assert!(!node.cached(), "a clean rollback removes the plan");
    assert!(cluster.statuses.borrow().is_empty());
    // The pod carries a Warning event naming the network and the cause, reported as from the pod's node.
    let warnings = cluster.warnings.borrow();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].0, "ns/web from node-a");
    assert!(
        warnings[0].1.starts_with("NetworkAttachFailed: ")
            && warnings[0].1.contains("network ns/c (net3)"),
        "{warnings:?}"
    );
}

#[test]
fn every_failed_add_leaves_a_warning_but_not_when_the_cluster_did_not_answer() {
    let node = Node::new("1.0.0");
    // A NAD that does not exist.
    let (exec, cluster) = (FakeExec::default(), FakeCluster::with_pod("a,missing"));
    let mut cluster = cluster;
    cluster
        .nads
        .remove(&("ns".to_string(), "missing".to_string()));
    orchestrate::add(
        &node.invocation("ADD", json!({})),
        &effects(&exec, &cluster),
    )
    .unwrap_err();
    let warnings = cluster.warnings.borrow().clone();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].1.contains("missing"), "{warnings:?}");
    // The cluster source down: no event (it could not go either), the ADD fails as before.
    let down = FakeCluster {
        down: true,
        ..FakeCluster::with_pod("a")
    };
    orchestrate::add(&node.invocation("ADD", json!({})), &effects(&exec, &down)).unwrap_err();
    assert!(down.warnings.borrow().is_empty());
}

/// Claims for [`FakeCluster`]: claim `ns/c` with request `nic` allocated `vf0` (resourceName `example.com/sriov`,
/// deviceID `0000:01:00.1`) and request `extra` allocated `vf1` (no attributes), and `networks` asking for NADs
/// by (request, NAD name, interface).
fn claims(networks: &[(&str, &str, Option<&str>)]) -> plexus_core::spec::dra::PodClaims {
    use plexus_core::spec::dra::{ClaimDevice, ClaimName, ClaimNetwork, DeviceKey};
    let claim = ClaimName {
        namespace: "ns".into(),
        name: "c".into(),
    };
    let device = |request: &str, device: &str, id: Option<&str>| ClaimDevice {
        claim: claim.clone(),
        pod_claim: "nics".into(),
        share_id: None,
        request: request.into(),
        key: DeviceKey {
            driver: "d".into(),
            pool: "p".into(),
            device: device.into(),
        },
        device_id: id.map(str::to_string),
        resource_name: id.map(|_| "example.com/sriov".to_string()),
    };
    plexus_core::spec::dra::PodClaims {
        devices: vec![
            device("nic", "vf0", Some("0000:01:00.1")),
            device("extra", "vf1", None),
        ],
        networks: networks
            .iter()
            .map(|(request, name, ifname)| {
                let mut parameters = json!({"apiVersion": "plexus.dev/v1alpha1",
                    "kind": "NetworkAttachment", "name": name});
                if let Some(i) = ifname {
                    parameters["interface"] = json!(i);
                }
                ClaimNetwork {
                    claim: claim.clone(),
                    request: request.to_string(),
                    driver: "d".into(),
                    from_class: false,
                    device_drivers: vec!["d".into()],
                    parameters,
                }
            })
            .collect(),
    }
}

#[test]
fn a_network_the_annotation_and_a_claim_both_name_is_attached_once_with_the_claims_device() {
    let node = Node::new("1.0.0");
    let exec = FakeExec::default();
    let mut cluster = FakeCluster::with_pod("a");
    cluster.claims = claims(&[("extra", "a", Some("ignored0")), ("nic", "b", None)]);
    orchestrate::add(
        &node.invocation("ADD", json!({})),
        &effects(&exec, &cluster),
    )
    .unwrap();
    // `a` once, on the annotation's interface, with the claim's `extra` device (no deviceID: it has none);
    // `b` after it, with `nic`'s device and its ID.
    assert_eq!(
        exec.summary(),
        vec![
            s("cluster-plugin", "ADD", "eth0"),
            s("a-plugin", "ADD", "net1"),
            s("b-plugin", "ADD", "net2")
        ]
    );
    let calls = exec.calls.borrow();
    assert!(
        calls[1].stdin.get("deviceID").is_none(),
        "{}",
        calls[1].stdin
    );
    assert_eq!(calls[2].stdin["deviceID"], "0000:01:00.1");
    drop(calls);
    let plan: Value =
        serde_json::from_slice(&std::fs::read(node.path("cache/attachments/c1.json")).unwrap())
            .unwrap();
    assert_eq!(plan["attachments"][1]["device"]["claim"]["device"], "vf1");
    // Each claim's entries in one write, after the ADD; taken back (an empty write) by the DEL.
    assert_eq!(
        *cluster.claim_writes.borrow(),
        vec![(
            "ns/c".to_string(),
            vec!["net1".to_string(), "net2".to_string()]
        )]
    );
    orchestrate::del(
        &node.invocation("DEL", json!({})),
        &effects(&exec, &cluster),
    )
    .unwrap();
    assert_eq!(
        cluster.claim_writes.borrow()[1],
        ("ns/c".to_string(), Vec::new())
    );
}

#[test]
fn a_nad_takes_a_claim_device_of_its_resource_before_a_device_plugins() {
    let node = Node::new("1.0.0");
    let exec = FakeExec::default();
    let mut cluster = FakeCluster::with_pod("a,b");
    for name in ["a", "b"] {
        cluster
            .nads
            .get_mut(&("ns".to_string(), name.to_string()))
            .unwrap()
            .annotations
            .insert(
                "k8s.v1.cni.cncf.io/resourceName".into(),
                "example.com/sriov".into(),
            );
    }
    cluster.claims = claims(&[]);
    // One claim device of the resource for two networks: the second finds none left, and the error says so
    // (a device plugin is not asked for a resource the claims serve).
    let err = orchestrate::add(
        &node.invocation("ADD", json!({})),
        &effects(&exec, &cluster),
    )
    .unwrap_err();
    assert_eq!(err.cni_code(), 7, "{err}");
    assert!(
        err.to_string()
            .contains("no device of resource example.com/sriov left"),
        "{err}"
    );
    assert!(err.to_string().contains("network ns/b"), "{err}");
    assert!(!node.cached());
    assert!(cluster.claim_writes.borrow().is_empty());
}

#[test]
fn del_from_the_cache_runs_in_reverse_with_the_cached_results_and_asks_the_cluster_nothing() {
    let node = Node::new("1.0.0");
    let (exec, cluster) = (FakeExec::default(), FakeCluster::with_pod("a,b"));
    orchestrate::add(
        &node.invocation("ADD", json!({})),
        &effects(&exec, &cluster),
    )
    .unwrap();
    let added: Vec<Value> = exec
        .calls
        .borrow()
        .iter()
        .map(|c| c.stdin.clone())
        .collect();
    let exec = FakeExec::default();
    // The cluster is down: DEL needs nothing from it.
    let down = FakeCluster {
        down: true,
        ..FakeCluster::default()
    };
    orchestrate::del(&node.invocation("DEL", json!({})), &effects(&exec, &down)).unwrap();
    assert_eq!(
        exec.summary(),
        vec![
            s("b-plugin", "DEL", "net2"),
            s("a-plugin", "DEL", "net1"),
            s("cluster-plugin", "DEL", "eth0")
        ]
    );
    let calls = exec.calls.borrow();
    assert!(
        calls[2].stdin.get("prevResult").is_some(),
        "{}",
        calls[2].stdin
    );
    assert_eq!(added.len(), 3);
    assert!(!node.cached());
    assert!(node.path("run/deleted/c1").exists());
    // Repeated: nothing runs.
    let again = FakeExec::default();
    orchestrate::del(&node.invocation("DEL", json!({})), &effects(&again, &down)).unwrap();
    assert!(again.summary().is_empty());
}

#[test]
fn del_without_a_cache_replans_and_skips_what_no_longer_resolves() {
    let node = Node::new("1.0.0");
    let mut cluster = FakeCluster::with_pod("a,b");
    cluster.nads.remove(&("ns".to_string(), "a".to_string()));
    let exec = FakeExec::default();
    orchestrate::del(
        &node.invocation("DEL", json!({})),
        &effects(&exec, &cluster),
    )
    .unwrap();
    assert_eq!(
        exec.summary(),
        vec![
            s("b-plugin", "DEL", "net2"),
            s("cluster-plugin", "DEL", "eth0")
        ]
    );
    let warnings = cluster.warnings.borrow();
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].0, "ns/web from node-a");
    assert!(warnings[0].1.starts_with("TeardownIncomplete") && warnings[0].1.contains("ns/a"));
    assert!(node.path("run/deleted/c1").exists());
}

#[test]
fn a_del_without_a_cache_whose_claims_cannot_be_read_releases_the_rest_and_is_not_complete() {
    let node = Node::new("1.0.0");
    let mut cluster = FakeCluster::with_pod("a,b");
    cluster.claims = claims(&[("extra", "c", None)]);
    cluster.claims_down = true;
    let exec = FakeExec::default();
    let del = || node.invocation("DEL", json!({}));
    orchestrate::del(&del(), &effects(&exec, &cluster)).unwrap();
    assert_eq!(
        exec.summary(),
        vec![
            s("b-plugin", "DEL", "net2"),
            s("a-plugin", "DEL", "net1"),
            s("cluster-plugin", "DEL", "eth0")
        ]
    );
    // The claim's network is still to release: the DEL is not recorded as complete, and no warning blames a
    // cluster that did not answer.
    assert!(!node.path("run/deleted/c1").exists());
    assert!(cluster.warnings.borrow().is_empty());
    cluster.claims_down = false;
    let again = FakeExec::default();
    orchestrate::del(&del(), &effects(&again, &cluster)).unwrap();
    assert!(again.summary().contains(&s("c-plugin", "DEL", "net3")));
    assert!(node.path("run/deleted/c1").exists());
}

#[test]
fn a_partial_del_attempts_every_attachment_reports_the_failure_and_keeps_the_plan() {
    let node = Node::new("1.0.0");
    let cluster = FakeCluster::with_pod("a,b");
    orchestrate::add(
        &node.invocation("ADD", json!({})),
        &effects(&FakeExec::default(), &cluster),
    )
    .unwrap();
    let exec = FakeExec::failing("b-plugin", "DEL");
    let err = orchestrate::del(
        &node.invocation("DEL", json!({})),
        &effects(&exec, &cluster),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("1 of 3 detachments failed"),
        "{err}"
    );
    assert_eq!(exec.summary().len(), 3, "every attachment attempted");
    assert!(node.cached(), "the runtime's retry has the plan");
    assert!(!node.path("run/deleted/c1").exists());
}

#[test]
fn check_runs_every_cached_list_in_order_with_its_result() {
    let node = Node::new("1.0.0");
    let cluster = FakeCluster::with_pod("a");
    orchestrate::add(
        &node.invocation("ADD", json!({})),
        &effects(&FakeExec::default(), &cluster),
    )
    .unwrap();
    let exec = FakeExec::default();
    orchestrate::check(
        &node.invocation("CHECK", json!({})),
        &effects(&exec, &cluster),
    )
    .unwrap();
    assert_eq!(
        exec.summary(),
        vec![
            s("cluster-plugin", "CHECK", "eth0"),
            s("a-plugin", "CHECK", "net1")
        ]
    );
    assert!(exec
        .calls
        .borrow()
        .iter()
        .all(|c| c.stdin.get("prevResult").is_some()));
}

#[test]
fn status_asks_the_cluster_network_and_gc_tears_down_what_is_no_longer_valid() {
    let node = Node::new("1.1.0");
    let cluster = FakeCluster::with_pod("a");
    let exec = FakeExec::default();
    orchestrate::status(
        &node.invocation("STATUS", json!({})),
        &effects(&exec, &cluster),
    )
    .unwrap();
    assert_eq!(exec.summary(), vec![s("cluster-plugin", "STATUS", "")]);

    orchestrate::add(
        &node.invocation("ADD", json!({})),
        &effects(&FakeExec::default(), &cluster),
    )
    .unwrap();
    let exec = FakeExec::default();
    let gc = node.invocation("GC", json!({"cni.dev/valid-attachments": []}));
    orchestrate::gc(&gc, &effects(&exec, &cluster)).unwrap();
    assert_eq!(
        exec.summary(),
        vec![
            s("a-plugin", "DEL", "net1"),
            s("cluster-plugin", "DEL", "eth0"),
            s("cluster-plugin", "GC", "")
        ]
    );
    assert!(!node.cached());
}

/// Hooks in memory: the policy denies pods named in `deny`, or rewrites the selections to `rewrite`; the
/// resolver supplies `config` for every network; the status hook tags every entry. Calls are recorded.
#[derive(Default)]
struct FakeHooks {
    deny: bool,
    rewrite: Option<Vec<Selection>>,
    config: Option<Value>,
    calls: RefCell<Vec<String>>,
}

impl HookRunner for FakeHooks {
    fn is_empty(&self) -> bool {
        false
    }

    fn policy(
        &self,
        pod: &Pod,
        selections: Vec<Selection>,
        devices: plexus_hooks::SelectionDevices,
    ) -> Result<PolicyOutcome<Selection>, PlexusError> {
        let seen: Vec<String> = devices
            .iter()
            .map(|((_, net), d)| format!(" {net}={}", d.key.device))
            .collect();
        self.calls.borrow_mut().push(format!(
            "policy {} {}{}",
            pod.name,
            selections.len(),
            seen.concat()
        ));
        if self.deny {
            return Ok(PolicyOutcome::Deny {
                hook: "fake".into(),
                reason: "no".into(),
            });
        }
        Ok(PolicyOutcome::Admit(
            self.rewrite.clone().unwrap_or(selections),
        ))
    }

    fn resolve(
        &self,
        _: &Pod,
        selection: &Selection,
        nad: &NetworkAttachmentDefinition,
        _: Option<&Value>,
        device: Option<&plexus_core::spec::dra::ClaimDevice>,
    ) -> Result<Option<Value>, PlexusError> {
        let seen = device.map_or(String::new(), |d| format!(" device {}", d.key.device));
        self.calls.borrow_mut().push(format!(
            "resolve {} {}{seen}",
            selection.namespaced_name(),
            nad.name
        ));
        Ok(self.config.clone())
    }

    fn status(&self, _: &Pod, mut entries: Vec<Value>) -> Result<Vec<Value>, PlexusError> {
        self.calls
            .borrow_mut()
            .push(format!("status {}", entries.len()));
        for e in &mut entries {
            e["org.example.tag"] = json!("fake");
        }
        Ok(entries)
    }
}

/// One `set_default_route`: the target interface, its gateways, the interfaces cleared.
type RouteCall = (String, Vec<IpAddr>, Vec<String>);

/// The pod's network, recording what it was asked to do.
#[derive(Default)]
struct RecordingPodNetwork {
    routes: RefCell<Vec<RouteCall>>,
}

impl PodNetwork for RecordingPodNetwork {
    fn set_default_route(
        &self,
        _: &str,
        target: &str,
        gateways: &[IpAddr],
        clear: &[String],
    ) -> Result<(), PlexusError> {
        self.routes
            .borrow_mut()
            .push((target.into(), gateways.to_vec(), clear.to_vec()));
        Ok(())
    }
}

#[test]
fn a_policy_hook_that_denies_fails_add_with_code_102_before_any_delegate_runs() {
    let node = Node::new("1.0.0");
    let (exec, cluster) = (FakeExec::default(), FakeCluster::with_pod("a"));
    let hooks = FakeHooks {
        deny: true,
        ..FakeHooks::default()
    };
    let fx = Effects {
        hooks: &hooks,
        ..effects(&exec, &cluster)
    };
    let err = orchestrate::add(&node.invocation("ADD", json!({})), &fx).unwrap_err();
    assert_eq!(err.cni_code(), 102, "{err}");
    assert!(
        err.to_string().contains("policy hook \"fake\": no"),
        "{err}"
    );
    assert!(exec.summary().is_empty(), "no delegate ran");
    assert!(!node.cached(), "nothing planned, nothing cached");
    let warnings = cluster.warnings.borrow();
    assert!(
        warnings.len() == 1 && warnings[0].1.contains("policy hook \"fake\": no"),
        "{warnings:?}"
    );
}

/// Each hook call is handed the devices of its selections as an argument: the policy hooks the devices of the
/// networks the claims ask for, each resolver call its own network's device.
#[test]
fn hooks_are_handed_their_selections_devices() {
    let node = Node::new("1.0.0");
    let exec = FakeExec::default();
    let mut cluster = FakeCluster::with_pod("a");
    cluster.claims = claims(&[("extra", "a", Some("ignored0")), ("nic", "b", None)]);
    let hooks = FakeHooks::default();
    let fx = Effects {
        hooks: &hooks,
        ..effects(&exec, &cluster)
    };
    orchestrate::add(&node.invocation("ADD", json!({})), &fx).unwrap();
    assert_eq!(
        *hooks.calls.borrow(),
        vec![
            "policy web 2 a=vf1 b=vf0",
            "resolve ns/a a device vf1",
            "resolve ns/b b device vf0",
            "status 3"
        ]
    );
}

#[test]
fn hooks_rewrite_the_selections_supply_the_config_and_shape_the_status() {
    let node = Node::new("1.0.0");
    let (exec, cluster) = (FakeExec::default(), FakeCluster::with_pod("a,b"));
    let hooks = FakeHooks {
        // The policy keeps only b.
        rewrite: Some(vec![Selection::new("ns", "b")]),
        config: Some(json!({"cniVersion": "1.0.0", "type": "from-hook"})),
        ..FakeHooks::default()
    };
    let fx = Effects {
        hooks: &hooks,
        ..effects(&exec, &cluster)
    };
    orchestrate::add(&node.invocation("ADD", json!({})), &fx).unwrap();
    assert_eq!(
        exec.summary(),
        vec![
            s("cluster-plugin", "ADD", "eth0"),
            s("from-hook", "ADD", "net1")
        ]
    );
    assert_eq!(
        *hooks.calls.borrow(),
        vec!["policy web 2", "resolve ns/b b", "status 2"]
    );
    let statuses = cluster.statuses.borrow();
    let entries = statuses[0].1.as_array().unwrap();
    assert_eq!(entries[1]["name"], "ns/b");
    assert!(entries.iter().all(|e| e["org.example.tag"] == "fake"));
}

#[test]
fn default_route_moves_to_the_selected_network_and_the_cached_results_say_so() {
    let node = Node::new("1.0.0");
    let (exec, cluster) = (
        FakeExec::default(),
        FakeCluster::with_pod(r#"[{"name": "a", "default-route": ["10.0.0.254"]}]"#),
    );
    let podnet = RecordingPodNetwork::default();
    let fx = Effects {
        podnet: &podnet,
        ..effects(&exec, &cluster)
    };
    orchestrate::add(&node.invocation("ADD", json!({})), &fx).unwrap();
    assert_eq!(
        *podnet.routes.borrow(),
        vec![(
            "net1".to_string(),
            vec!["10.0.0.254".parse::<IpAddr>().unwrap()],
            vec!["eth0".to_string(), "net1".to_string()]
        )]
    );
    // DEL hands the delegate the result as rewritten: the default route is on net1's.
    orchestrate::del(&node.invocation("DEL", json!({})), &fx).unwrap();
    let calls = exec.calls.borrow();
    let del_a = calls
        .iter()
        .find(|c| c.plugin == "a-plugin" && c.command == "DEL")
        .unwrap();
    assert_eq!(
        del_a.stdin["prevResult"]["routes"],
        json!([{"dst": "0.0.0.0/0", "gw": "10.0.0.254"}])
    );
}

// A running sandbox changed (networks that follow the annotation): `crate::change`.

mod change {
    use super::*;
    use crate::change::{Edit, Sandbox};
    use std::time::Duration;

    /// ADD of pod `ns/web` selecting `networks`; the exec's calls are cleared afterwards.
    fn added(node: &Node, networks: &str) {
        let (exec, cluster) = (FakeExec::default(), FakeCluster::with_pod(networks));
        orchestrate::add(
            &node.invocation("ADD", json!({})),
            &effects(&exec, &cluster),
        )
        .unwrap();
    }

    fn open(node: &Node) -> Sandbox {
        Sandbox::open(&node.path("cache"), "c1", &[], Duration::from_secs(5))
            .unwrap()
            .expect("a plan")
    }

    fn pod(cluster: &FakeCluster) -> Pod {
        cluster.pods[&("ns".to_string(), "web".to_string())].clone()
    }

    /// The wanted selection of NAD `name` from `cluster`'s pod (parsed as an ADD parses it).
    fn wanted(sb: &Sandbox, exec: &FakeExec, cluster: &FakeCluster, name: &str) -> Selection {
        sb.wanted(&effects(exec, cluster), &pod(cluster))
            .unwrap()
            .into_iter()
            .find(|s| s.name == name)
            .unwrap()
    }

    fn cached_networks(node: &Node) -> (Vec<String>, Value) {
        let plan: Value =
            serde_json::from_slice(&std::fs::read(node.path("cache/attachments/c1.json")).unwrap())
                .unwrap();
        let ifnames = plan["attachments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["ifname"].as_str().unwrap().to_string())
            .collect();
        (ifnames, plan["runtime"]["networks"].clone())
    }

    #[test]
    fn the_plan_records_what_the_runtime_gave_and_rebuilds_the_invocation() {
        let node = Node::new("1.0.0");
        added(&node, "a");
        let sb = open(&node);
        assert_eq!(sb.networks(), Some("a"));
        assert_eq!(sb.inv.container_id, "c1");
        assert_eq!(sb.inv.netns.as_deref(), Some("/run/netns/x"));
        assert_eq!(sb.inv.ifname, "eth0");
        assert_eq!(sb.inv.path, vec![PathBuf::from("/fake")]);
        assert_eq!(sb.inv.pod.as_ref().unwrap().to_string(), "ns/web");
        assert_eq!(sb.inv.conf.cache_dir, node.path("cache"));
        // A plan of an earlier version has no runtime context: refused, naming why.
        drop(sb);
        let path = node.path("cache/attachments/c1.json");
        let mut plan: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        plan.as_object_mut().unwrap().remove("runtime");
        std::fs::write(&path, plan.to_string()).unwrap();
        let err = Sandbox::open(&node.path("cache"), "c1", &[], Duration::from_secs(5))
            .err()
            .unwrap();
        assert!(err.to_string().contains("earlier version"), "{err}");
        // No plan: no sandbox.
        assert!(
            Sandbox::open(&node.path("cache"), "c2", &[], Duration::from_secs(5))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn an_added_selection_is_attached_after_the_others_and_the_final_del_tears_it_down() {
        let node = Node::new("1.0.0");
        added(&node, "a");
        let (exec, cluster) = (FakeExec::default(), FakeCluster::with_pod("a,b"));
        let mut sb = open(&node);
        let b = wanted(&sb, &exec, &cluster, "b");
        let applied = sb
            .apply(
                &effects(&exec, &cluster),
                &pod(&cluster),
                Edit {
                    attach: vec![(b, "net2".into())],
                    detach: vec![],
                },
            )
            .unwrap();
        assert_eq!(applied.attached, vec!["ns/b (net2)".to_string()]);
        assert_eq!(exec.summary(), vec![s("b-plugin", "ADD", "net2")]);
        assert_eq!(
            cached_networks(&node),
            (
                vec!["eth0".into(), "net1".into(), "net2".into()],
                json!("a,b")
            )
        );
        let statuses = cluster.statuses.borrow();
        let names: Vec<&Value> = statuses[0]
            .1
            .as_array()
            .unwrap()
            .iter()
            .map(|e| &e["name"])
            .collect();
        assert_eq!(names, vec!["cluster-net", "ns/a", "ns/b"]);
        drop(sb);
        // The pod's DEL runs from the plan the change stored: the added attachment goes too.
        let del_exec = FakeExec::default();
        orchestrate::del(
            &node.invocation("DEL", json!({})),
            &effects(&del_exec, &cluster),
        )
        .unwrap();
        assert_eq!(
            del_exec.summary(),
            vec![
                s("b-plugin", "DEL", "net2"),
                s("a-plugin", "DEL", "net1"),
                s("cluster-plugin", "DEL", "eth0")
            ]
        );
    }

    #[test]
    fn a_failing_addition_rolls_back_what_the_change_attached_and_nothing_else_moves() {
        let node = Node::new("1.0.0");
        added(&node, "a,b");
        let load = || {
            crate::cache::AttachmentCache::open(&node.path("cache"))
                .unwrap()
                .load("c1")
                .unwrap()
        };
        let before = load();
        let (exec, cluster) = (
            FakeExec::failing("c-plugin", "ADD"),
            FakeCluster::with_pod("a,c,c"),
        );
        let mut sb = open(&node);
        let c = wanted(&sb, &exec, &cluster, "c");
        let err = sb
            .apply(
                &effects(&exec, &cluster),
                &pod(&cluster),
                // b is to go, but the additions come first and fail: b stays.
                Edit {
                    attach: vec![(c.clone(), "net3".into()), (c, "net4".into())],
                    detach: vec![2],
                },
            )
            .unwrap_err();
        assert!(err.to_string().contains("ns/c"), "{err}");
        // The first c failed: its DEL (a plugin cleans up its own failed ADD), nothing of a or b.
        assert_eq!(
            exec.summary(),
            vec![s("c-plugin", "ADD", "net3"), s("c-plugin", "DEL", "net3")]
        );
        drop(sb);
        assert_eq!(load(), before);
        assert!(cluster.statuses.borrow().is_empty());
    }

    #[test]
    fn a_later_failure_rolls_back_every_earlier_addition_in_reverse() {
        let node = Node::new("1.0.0");
        added(&node, "a");
        let (exec, cluster) = (
            FakeExec::failing("c-plugin", "ADD"),
            FakeCluster::with_pod("a,b,c"),
        );
        let mut sb = open(&node);
        let (b, c) = (
            wanted(&sb, &exec, &cluster, "b"),
            wanted(&sb, &exec, &cluster, "c"),
        );
        sb.apply(
            &effects(&exec, &cluster),
            &pod(&cluster),
            Edit {
                attach: vec![(b, "net2".into()), (c, "net3".into())],
                detach: vec![],
            },
        )
        .unwrap_err();
        assert_eq!(
            exec.summary(),
            vec![
                s("b-plugin", "ADD", "net2"),
                s("c-plugin", "ADD", "net3"),
                s("c-plugin", "DEL", "net3"),
                s("b-plugin", "DEL", "net2")
            ]
        );
        assert_eq!(
            cached_networks(&node),
            (vec!["eth0".into(), "net1".into()], json!("a"))
        );
    }

    #[test]
    fn what_a_change_killed_in_the_middle_left_is_torn_down_and_attached_again() {
        let node = Node::new("1.0.0");
        added(&node, "a");
        // A change stored its plan with b appended, then died before b's result was journaled.
        let cache = crate::cache::AttachmentCache::open(&node.path("cache")).unwrap();
        let mut plan = cache.load("c1").unwrap().unwrap();
        let mut b = plan.attachments[1].clone();
        b.network = "ns/b".into();
        b.ifname = "net2".into();
        b.result = None;
        plan.attachments.push(b);
        cache.store(&plan).unwrap();
        let (exec, cluster) = (FakeExec::default(), FakeCluster::with_pod("a,b"));
        let mut sb = open(&node);
        assert!(sb.is_up());
        assert_eq!(sb.repair(&effects(&exec, &cluster)).unwrap(), 1);
        assert_eq!(exec.summary(), vec![s("a-plugin", "DEL", "net2")]);
        assert_eq!(
            cached_networks(&node),
            (vec!["eth0".into(), "net1".into()], json!("a"))
        );
        // Nothing left to repair; a sandbox whose ADD never attached its cluster network is not up.
        assert_eq!(sb.repair(&effects(&exec, &cluster)).unwrap(), 0);
        drop(sb);
        let mut plan = cache.load("c1").unwrap().unwrap();
        plan.attachments[0].result = None;
        cache.store(&plan).unwrap();
        assert!(!open(&node).is_up());
    }

    #[test]
    fn a_removal_runs_from_the_cache_without_the_nad_and_a_failed_del_keeps_the_attachment() {
        let node = Node::new("1.0.0");
        added(&node, "a,b");
        // The NADs are gone: the plan alone says how to detach.
        let mut cluster = FakeCluster::with_pod("a");
        cluster.nads.clear();
        let exec = FakeExec::failing("a-plugin", "DEL");
        let mut sb = open(&node);
        let applied = sb
            .apply(
                &effects(&exec, &cluster),
                &pod(&cluster),
                Edit {
                    attach: vec![],
                    detach: vec![1, 2],
                },
            )
            .unwrap();
        assert_eq!(applied.detached, vec!["ns/b (net2)".to_string()]);
        assert_eq!(applied.failed.len(), 1, "{:?}", applied.failed);
        assert_eq!(
            exec.summary(),
            vec![s("b-plugin", "DEL", "net2"), s("a-plugin", "DEL", "net1")]
        );
        // a's DEL failed: it stays for the pod's DEL; b is gone; the cluster network is never detached.
        assert_eq!(
            cached_networks(&node),
            (vec!["eth0".into(), "net1".into()], json!("a"))
        );
    }
}

/// The cluster network as the runtime's own CNI attached it (the node daemon's NRI mode).
fn runtime_attached() -> ClusterBy {
    ClusterBy::Runtime(Some(json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "mac": "0a:58:0a:00:00:05", "sandbox": "/run/netns/x"}],
        "ips": [{"address": "10.0.0.5/24", "interface": 0}]
    })))
}

#[test]
fn a_cluster_network_the_runtime_attached_is_recorded_for_the_status_and_never_run_by_plexus() {
    let node = Node::new("1.0.0");
    let (exec, cluster) = (FakeExec::default(), FakeCluster::with_pod("a,b"));
    let mut add = node.invocation("ADD", json!({}));
    add.cluster_by = runtime_attached();
    let result = orchestrate::add(&add, &effects(&exec, &cluster)).unwrap();
    assert_eq!(
        exec.summary(),
        vec![s("a-plugin", "ADD", "net1"), s("b-plugin", "ADD", "net2")]
    );
    assert_eq!(result["ips"][0]["address"], "10.0.0.5/24", "{result}");
    let statuses = cluster.statuses.borrow();
    let entries = statuses[0].1.as_array().unwrap();
    let names: Vec<&Value> = entries.iter().map(|e| &e["name"]).collect();
    assert_eq!(names, vec!["cluster-net", "ns/a", "ns/b"]);
    assert_eq!(entries[0]["ips"], json!(["10.0.0.5/24"]));
    assert_eq!(entries[0]["mac"], "0a:58:0a:00:00:05");
    assert_eq!(entries[0]["default"], true);
    drop(statuses);

    // CHECK and the daemon's DEL (NRI mode's calls carry no result) run Plexus's attachments only.
    orchestrate::check(
        &node.invocation("CHECK", json!({})),
        &effects(&exec, &cluster),
    )
    .unwrap();
    let mut del = node.invocation("DEL", json!({}));
    del.cluster_by = ClusterBy::Runtime(None);
    orchestrate::del(&del, &effects(&exec, &cluster)).unwrap();
    assert_eq!(
        exec.summary()[2..],
        [
            s("a-plugin", "CHECK", "net1"),
            s("b-plugin", "CHECK", "net2"),
            s("b-plugin", "DEL", "net2"),
            s("a-plugin", "DEL", "net1")
        ]
    );
    assert!(!node.cached());
}

#[test]
fn a_del_in_cni_mode_deletes_the_cluster_network_the_runtime_had_attached_in_nri_mode() {
    // The node moved back from NRI mode: the runtime calls Plexus alone, whose DEL is then the only one the
    // cluster network gets.
    let node = Node::new("1.0.0");
    let (exec, cluster) = (FakeExec::default(), FakeCluster::with_pod("a"));
    let mut add = node.invocation("ADD", json!({}));
    add.cluster_by = runtime_attached();
    orchestrate::add(&add, &effects(&exec, &cluster)).unwrap();
    orchestrate::del(
        &node.invocation("DEL", json!({})),
        &effects(&exec, &cluster),
    )
    .unwrap();
    assert_eq!(
        exec.summary()[1..],
        [
            s("a-plugin", "DEL", "net1"),
            s("cluster-plugin", "DEL", "eth0")
        ]
    );
    assert!(!node.cached());
}

#[test]
fn a_failed_attachment_rolls_back_only_plexus_own_when_the_runtime_attached_the_cluster_network() {
    let node = Node::new("1.0.0");
    let (exec, cluster) = (
        FakeExec::failing("b-plugin", "ADD"),
        FakeCluster::with_pod("a,b"),
    );
    let mut add = node.invocation("ADD", json!({}));
    add.cluster_by = runtime_attached();
    orchestrate::add(&add, &effects(&exec, &cluster)).unwrap_err();
    assert_eq!(
        exec.summary(),
        [
            s("a-plugin", "ADD", "net1"),
            s("b-plugin", "ADD", "net2"),
            s("b-plugin", "DEL", "net2"),
            s("a-plugin", "DEL", "net1")
        ]
    );
    assert!(!node.cached());

    // A DEL without a plan (lost, or never made) re-plans: the cluster network stays the runtime's.
    let exec = FakeExec::default();
    let mut del = node.invocation("DEL", json!({}));
    del.cluster_by = ClusterBy::Runtime(None);
    orchestrate::del(&del, &effects(&exec, &cluster)).unwrap();
    assert_eq!(
        exec.summary(),
        [s("b-plugin", "DEL", "net2"), s("a-plugin", "DEL", "net1")]
    );
}

#[test]
fn a_pod_cannot_replace_a_cluster_network_the_runtime_attached() {
    let node = Node::new("1.0.0");
    let exec = FakeExec::default();
    let mut cluster = FakeCluster::with_pod("b");
    let pod = cluster
        .pods
        .get_mut(&("ns".to_string(), "web".to_string()))
        .unwrap();
    pod.annotations.insert(
        crate::plan::MULTUS_DEFAULT_NETWORK.to_string(),
        "ns/a".to_string(),
    );
    let mut add = node.invocation("ADD", json!({"compat": "multus"}));
    add.cluster_by = runtime_attached();
    let err = orchestrate::add(&add, &effects(&exec, &cluster)).unwrap_err();
    assert!(err.to_string().contains("a pod cannot replace it"), "{err}");
    assert!(
        exec.summary().is_empty(),
        "nothing attached: {:?}",
        exec.summary()
    );
    // The same pod through the CNI path gets its own default network.
    orchestrate::add(
        &node.invocation("ADD", json!({"compat": "multus"})),
        &effects(&exec, &cluster),
    )
    .unwrap();
    assert_eq!(exec.summary()[0], s("a-plugin", "ADD", "eth0"));
}
