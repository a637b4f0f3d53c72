//! Networks from Dynamic Resource Allocation on the real API server (1.37, `resource.k8s.io/v1` as it serves it):
//! validation, RBAC with the per-driver authorization of a claim's `status.devices`, watches, the status
//! subresource and server-side apply are the real server's. The test plays the scheduler and the DRA driver: it
//! writes the node's ResourceSlices and each claim's allocation (node-local, as the scheduler writes it) and
//! `reservedFor`; each pod names its claims in `spec.resourceClaims`. The CNI binary and the daemon authenticate with real
//! service-account tokens bound to a pod on the node, as a DaemonSet pod's are. The delegates are the recording
//! fake. (tests/node/e2e_kubelet.rs has the real scheduler, controllers and kubelet.)

use std::time::{Duration, Instant};

use plexus_tests::deploy_manifest;
use plexus_tests::kubeapi::KubeApiServer;
use plexus_tests::plexus::{guest_wasm, NodeDaemon, Sandbox};
use serde_json::{json, Value};

const CNI_USER: &str = "system:serviceaccount:kube-system:plexus-cni";
const DAEMON_USER: &str = "system:serviceaccount:kube-system:plexus";
const NODE: &str = "node1";
const DRIVER: &str = "sriov.example.com";
const RESOURCE: &str = "example.com/sriov";
/// A user of namespace `team-a` (a service account there), granted claims by [`grant_claims`].
const TENANT_TOKEN: &str = "tenant-token";

struct Dra {
    api: KubeApiServer,
    sb: Sandbox,
}

/// The API server with the project's CRDs and RBAC; the CNI binary's own account bound to the project's role, its
/// and the daemon's kubeconfigs with tokens bound to a pod on `node1`; `node1`'s slice (vf0, vf1 with both attributes, vf3 with none) and `node2`'s (vf2, the
/// only slice that lists it); NADs `sriov-net` (resourceName example.com/sriov) and `fast`.
fn dra_cluster() -> Dra {
    let api = KubeApiServer::start(&[(TENANT_TOKEN, "team-a/tenant")], &[]);
    api.apply_file(&deploy_manifest("crds.yaml"));
    api.apply_file(&deploy_manifest("rbac.yaml"));
    api.apply_node_authority();
    api.create(&json!({"apiVersion": "v1", "kind": "ServiceAccount",
                       "metadata": {"name": "plexus-cni", "namespace": "kube-system"}}));
    api.create(&json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "plexus-cni"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "plexus"},
        "subjects": [{"kind": "ServiceAccount", "name": "plexus-cni", "namespace": "kube-system"}]
    }));
    api.namespace("team-a");
    let device = |name: &str, id: Option<&str>| {
        let mut attributes = serde_json::Map::new();
        if let Some(id) = id {
            attributes.insert("k8s.cni.cncf.io/deviceID".into(), json!({ "string": id }));
            attributes.insert(
                "k8s.cni.cncf.io/resourceName".into(),
                json!({ "string": RESOURCE }),
            );
        }
        json!({"name": name, "attributes": attributes})
    };
    for (node, devices) in [
        (
            "node1",
            vec![
                device("vf0", Some("0000:01:00.1")),
                device("vf1", Some("0000:01:00.2")),
                device("vf3", None),
            ],
        ),
        ("node2", vec![device("vf2", Some("0000:02:00.1"))]),
    ] {
        api.create(&json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{node}-{}", DRIVER.replace('.', "-"))},
            "spec": {
                "driver": DRIVER, "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices
            }
        }));
    }
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    sb.fakes(&["secondary-plugin"]);
    let cni_token = api.node_bound_token("kube-system", "plexus-cni", NODE);
    api.write_kubeconfig(&sb.path("cni.kubeconfig"), &cni_token);
    let daemon_token = api.node_bound_token("kube-system", "plexus", NODE);
    api.write_kubeconfig(&sb.path("daemon.kubeconfig"), &daemon_token);
    let nad = |name: &str, resource: Option<&str>| {
        let mut annotations = serde_json::Map::new();
        if let Some(r) = resource {
            annotations.insert("k8s.v1.cni.cncf.io/resourceName".into(), json!(r));
        }
        let config = json!({"cniVersion": "1.0.0", "name": name, "type": "secondary-plugin",
            "capabilities": {"deviceID": true}});
        api.create(&json!({
            "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": "team-a", "annotations": annotations},
            "spec": {"config": config.to_string()}
        }));
    };
    nad("sriov-net", Some(RESOURCE));
    nad("fast", None);
    // A NAD without a config, for a resolver hook to fill.
    api.create(&json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "bare", "namespace": "team-a"}, "spec": {}
    }));
    Dra { api, sb }
}

/// A NetworkAttachment request in a claim's opaque configuration.
fn attachment(requests: &[&str], body: Value) -> Value {
    json!({"requests": requests, "opaque": {"driver": DRIVER, "parameters": body}})
}

impl Dra {
    fn conf(&self, daemon: bool) -> Value {
        let mut extra = json!({
            "cluster": {
                "source": "kube", "kubeconfig": self.sb.path("cni.kubeconfig"),
                "requestTimeoutMs": 2000, "deadlineMs": 5000, "retries": 2,
                "initialBackoffMs": 20, "maxBackoffMs": 100
            },
        });
        extra["daemon"] = match daemon {
            true => json!({"socket": self.sb.path("run/daemon.sock"), "timeoutMs": 5000}),
            false => json!(false),
        };
        self.sb.conf(extra)
    }

    /// A pod of `team-a` on `node1` using the ResourceClaims `claims` (`spec.resourceClaims[]`, the pod's name for
    /// each `nicN`); its UID.
    fn pod(&self, name: &str, networks: Option<&str>, claims: &[&str]) -> String {
        let annotations = match networks {
            Some(n) => json!({"k8s.v1.cni.cncf.io/networks": n}),
            None => json!({}),
        };
        let claims: Vec<Value> = claims
            .iter()
            .enumerate()
            .map(|(i, c)| json!({"name": format!("nic{i}"), "resourceClaimName": c}))
            .collect();
        let pod = self.api.create(&json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-a", "annotations": annotations},
            "spec": {
                "nodeName": NODE,
                "automountServiceAccountToken": false,
                "resourceClaims": claims,
                "containers": [{"name": "c", "image": "pause"}]
            }
        }));
        pod["metadata"]["uid"].as_str().unwrap().to_string()
    }

    /// A claim of `team-a` with `config`, allocated (as the scheduler does for node-local devices: the pool's node
    /// in the allocation's node selector) `results` of (request, pool, device) of [`DRIVER`] and reserved for the
    /// pod `uid`.
    fn claim(
        &self,
        name: &str,
        config: Vec<Value>,
        results: &[(&str, &str, &str)],
        pod: (&str, &str),
    ) {
        let results: Vec<Allocated> = results
            .iter()
            .map(|&(request, pool, device)| (request, DRIVER, pool, device, None))
            .collect();
        self.allocated_claim(name, config, &results, pod);
    }

    /// [`Dra::claim`] with each device's driver and share given.
    fn allocated_claim(
        &self,
        name: &str,
        config: Vec<Value>,
        results: &[Allocated],
        pod: (&str, &str),
    ) {
        let mut requests: Vec<&str> = results.iter().map(|r| r.0).collect();
        requests.dedup();
        let requests: Vec<Value> = requests
            .iter()
            .map(|r| json!({"name": r, "exactly": {"deviceClassName": "sriov"}}))
            .collect();
        self.api.create(&json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"devices": {"requests": requests, "config": config}}
        }));
        let node = results.first().map_or(NODE, |r| r.2);
        let results: Vec<Value> = results
            .iter()
            .map(|(request, driver, pool, device, share)| {
                let mut r =
                    json!({"request": request, "driver": driver, "pool": pool, "device": device});
                if let Some(share) = share {
                    r["shareID"] = json!(share);
                }
                r
            })
            .collect();
        self.api.allocate_claim("team-a", name, results, node, pod);
    }

    /// The node daemon of `node1`, with the daemon's kubeconfig and the sandbox's socket, cache and log.
    fn daemon(&self) -> NodeDaemon {
        NodeDaemon::start(
            NODE,
            &self.sb.path("daemon.kubeconfig"),
            &self.sb.path("run/daemon.sock"),
            &self.sb.path("cache"),
            &self.sb.path("daemon.log"),
            &[],
        )
    }

    fn claim_object(&self, name: &str) -> Value {
        self.api.must(
            "GET",
            &format!("/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/{name}"),
            None,
        )
    }

    /// Waits (at most 20 s) until the claim's `status.devices` satisfies `ok`; the claim.
    #[track_caller]
    fn wait_claim(&self, name: &str, what: &str, ok: impl Fn(&[Value]) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let claim = self.claim_object(name);
            let devices = claim["status"]["devices"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if ok(&devices) {
                return claim;
            }
            assert!(
                Instant::now() < deadline,
                "claim {name}: {what} not reached: {claim:#}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn add(&self, id: &str, pod: &str, uid: &str, conf: &Value) -> plexus_tests::plexus::Run {
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME={pod};K8S_POD_UID={uid}"
        );
        self.sb.run("ADD", id, &args, conf)
    }

    fn del(&self, id: &str, pod: &str, uid: &str, conf: &Value) -> plexus_tests::plexus::Run {
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME={pod};K8S_POD_UID={uid}"
        );
        self.sb.run("DEL", id, &args, conf)
    }

    /// Each secondary delegate ADD since the last clear: (ifname, top-level deviceID, runtimeConfig deviceID).
    fn device_calls(&self) -> Vec<(String, String, String)> {
        self.sb
            .calls()
            .iter()
            .filter(|c| c.plugin == "secondary-plugin" && c.command == "ADD")
            .map(|c| {
                let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
                (
                    c.env.get("CNI_IFNAME").cloned().unwrap_or_default(),
                    s(&c.stdin["deviceID"]),
                    s(&c.stdin["runtimeConfig"]["deviceID"]),
                )
            })
            .collect()
    }

    fn cni_requests(&self) -> Vec<String> {
        self.api
            .requests_of(CNI_USER)
            .into_iter()
            .map(|(verb, uri)| format!("{verb} {uri}"))
            .collect()
    }
}

/// The claim's `status.devices[]` entry of `device`.
fn entry<'a>(devices: &'a [Value], device: &str) -> Option<&'a Value> {
    devices.iter().find(|d| d["device"] == device)
}

/// One pod with a NAD naming the resource and a claim that asks for a second network: in thin mode and through the
/// daemon, each network gets its device's ID, the claim's network attaches with its interface name, the claim's
/// status carries each device's network data after ADD and not after DEL, and the allocation stays.
#[test]
fn claim_devices_go_to_nads_by_resource_and_to_the_claims_own_networks() {
    let c = dra_cluster();
    let uid = c.pod("web", Some("sriov-net"), &["web-nics"]);
    c.claim(
        "web-nics",
        vec![attachment(
            &["extra"],
            json!({"apiVersion": "plexus.dev/v1alpha1", "kind": "NetworkAttachment",
                   "name": "fast", "interface": "fast0"}),
        )],
        &[("nic", "node1", "vf0"), ("extra", "node1", "vf1")],
        ("web", &uid),
    );

    // Thin mode: the CNI process reads the claims and the node's slices itself.
    let conf = c.conf(false);
    c.add("c-thin", "web", &uid, &conf).ok();
    let claim_requests: Vec<String> = c
        .cni_requests()
        .into_iter()
        .filter(|r| r.contains("/resourceclaims"))
        .collect();
    assert!(
        !claim_requests.is_empty()
            && claim_requests
                .iter()
                .all(|r| r.starts_with("get ") || r.starts_with("patch "))
            && claim_requests
                .iter()
                .all(|r| r.contains("/team-a/resourceclaims/web-nics")),
        "the CNI process reads its pod's claim by name, no list: {claim_requests:?}"
    );
    assert_eq!(
        c.device_calls(),
        [
            (
                "net1".to_string(),
                "0000:01:00.1".to_string(),
                "0000:01:00.1".to_string()
            ),
            (
                "fast0".to_string(),
                "0000:01:00.2".to_string(),
                "0000:01:00.2".to_string()
            ),
        ],
        "the NAD gets the device of its resource, the claim's network its request's device"
    );
    let status = c.api.network_status("team-a", "web");
    let names: Vec<&str> = status.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["cluster-net", "team-a/sriov-net", "team-a/fast"],
        "{status:?}"
    );
    assert_eq!(status[2].1, "fast0");

    let claim = c.wait_claim("web-nics", "network data of both devices", |d| d.len() == 2);
    let devices = claim["status"]["devices"].as_array().unwrap();
    let vf0 = entry(devices, "vf0").expect("vf0's entry");
    assert_eq!(vf0["driver"], DRIVER);
    assert_eq!(vf0["pool"], "node1");
    assert_eq!(vf0["networkData"]["interfaceName"], "net1");
    let ips = vf0["networkData"]["ips"].as_array().expect("ips");
    assert!(
        !ips.is_empty() && ips.iter().all(|ip| ip.as_str().unwrap().contains('/')),
        "{vf0}"
    );
    assert!(
        vf0["networkData"]["hardwareAddress"]
            .as_str()
            .is_some_and(|m| m.len() == 17),
        "{vf0}"
    );
    assert_eq!(vf0["conditions"][0]["type"], "Ready");
    assert_eq!(vf0["conditions"][0]["status"], "True");
    assert_eq!(
        entry(devices, "vf1").unwrap()["networkData"]["interfaceName"],
        "fast0"
    );
    let managers: Vec<String> = claim["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["manager"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(managers.contains(&"plexus".to_string()), "{managers:?}");

    c.del("c-thin", "web", &uid, &conf).ok();
    let claim = c.wait_claim("web-nics", "no network data after DEL", |d| d.is_empty());
    assert_eq!(
        claim["status"]["allocation"]["devices"]["results"]
            .as_array()
            .map(Vec::len),
        Some(2),
        "the allocation stays: {claim:#}"
    );
    assert_eq!(claim["status"]["reservedFor"][0]["uid"], uid.as_str());

    // Through the daemon: the same plan, and the ADD reads nothing from the API.
    let d = c.daemon();
    let h = d.wait("caches synced, DRA included", |h| {
        h.cache.pods_synced && h.cache.nads_synced && h.cache.dra_synced
    });
    assert_eq!(h.cache.dra, Some(true));
    assert_eq!(h.cache.slice_devices, 3, "node1's devices only: {h:?}");
    c.sb.clear_calls();
    let before = c.cni_requests().len();
    let conf = c.conf(true);
    c.add("c-daemon", "web", &uid, &conf).ok();
    assert_eq!(c.device_calls().len(), 2);
    assert_eq!(c.device_calls()[0].1, "0000:01:00.1");
    assert_eq!(c.device_calls()[1].0, "fast0");
    assert_eq!(
        c.cni_requests()[before..].to_vec(),
        Vec::<String>::new(),
        "a daemon-mode ADD reads nothing from the API"
    );
    c.wait_claim("web-nics", "network data written by the daemon", |d| {
        entry(d, "vf1").is_some_and(|e| e["networkData"]["interfaceName"] == "fast0")
    });
    c.del("c-daemon", "web", &uid, &conf).ok();
    c.wait_claim("web-nics", "taken back through the daemon", |d| {
        d.is_empty()
    });
    drop(d);
}

/// The daemon reads the claims of its node's pods by name and nothing else: 30 claims of pods on another node stay
/// unread; a claim made for a pod after it appeared (the test plays the resourceclaim controller: the claim, then
/// the pod's `status.resourceClaimStatuses`) is read once, however often the pod changes after; the ADD reads
/// nothing; the claim is dropped with its pod.
#[test]
fn a_daemon_reads_only_its_pods_claims_each_once() {
    let c = dra_cluster();
    for i in 0..30 {
        let far = format!("far-{i}");
        let claim = format!("far-{i}-nic");
        let pod = c.api.create(&json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": far, "namespace": "team-a"},
            "spec": {"nodeName": "node2", "automountServiceAccountToken": false,
                     "resourceClaims": [{"name": "nic", "resourceClaimName": claim}],
                     "containers": [{"name": "c", "image": "pause"}]}
        }));
        let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
        c.claim(&claim, Vec::new(), &[("nic", "node2", "vf2")], (&far, &uid));
    }
    c.claim(
        "web-nics",
        Vec::new(),
        &[("nic", "node1", "vf0")],
        ("web", "later"),
    );
    // The pod's second entry is a template's: its claim does not exist yet.
    let pod = c.api.create(&json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "team-a",
                     "annotations": {"k8s.v1.cni.cncf.io/networks": "sriov-net,sriov-net"}},
        "spec": {"nodeName": NODE, "automountServiceAccountToken": false,
                 "resourceClaims": [{"name": "nics", "resourceClaimName": "web-nics"},
                                    {"name": "extra", "resourceClaimTemplateName": "one-vf"}],
                 "containers": [{"name": "c", "image": "pause"}]}
    }));
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let d = c.daemon();
    let h = d.wait("the pod's one claim read", |h| {
        h.cache.dra_synced && h.cache.claims == 1
    });
    assert_eq!(h.cache.claim_reads, 1, "{h:?}");

    // The resourceclaim controller's part: the claim from the template, named in the pod's status.
    c.claim(
        "web-extra-7x2k",
        Vec::new(),
        &[("nic", "node1", "vf1")],
        ("web", &uid),
    );
    let status = |conditions: Value| {
        c.api.must(
            "PATCH",
            "/api/v1/namespaces/team-a/pods/web/status",
            Some(&json!({"status": {
                "resourceClaimStatuses": [{"name": "extra", "resourceClaimName": "web-extra-7x2k"}],
                "conditions": conditions
            }})),
        );
    };
    status(json!([]));
    d.wait("the claim made later read", |h| h.cache.claims == 2);
    for i in 0..5 {
        status(json!([{"type": "PodScheduled", "status": "True", "reason": format!("r{i}")}]));
    }
    c.api.must(
        "PATCH",
        "/api/v1/namespaces/team-a/pods/web",
        Some(&json!({"metadata": {"labels": {"changed": "yes"}}})),
    );
    // The watch delivers these within milliseconds; a re-read would follow them as fast.
    std::thread::sleep(Duration::from_millis(500));

    let daemon_claim_requests: Vec<(String, String)> = c
        .api
        .requests_of(DAEMON_USER)
        .into_iter()
        .filter(|(_, uri)| uri.contains("/resourceclaims"))
        .collect();
    assert_eq!(
        daemon_claim_requests,
        ["web-nics", "web-extra-7x2k"]
            .map(|n| (
                "get".to_string(),
                format!("/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/{n}")
            ))
            .to_vec(),
        "before the ADD (whose claim status writes read each claim again), the daemon asked for its pod's \
         claims by name, once each, and for no list or watch"
    );
    c.sb.clear_calls();
    let before = c.cni_requests().len();
    let conf = c.conf(true);
    c.add("c-web", "web", &uid, &conf).ok();
    assert_eq!(
        c.device_calls(),
        [("net1", "0000:01:00.1"), ("net2", "0000:01:00.2")].map(|(i, d)| (
            i.to_string(),
            d.to_string(),
            d.to_string()
        )),
        "each NAD got a device of the pod's two claims"
    );
    assert_eq!(
        c.cni_requests()[before..].to_vec(),
        Vec::<String>::new(),
        "the ADD reads nothing from the API"
    );
    let h = d.health().unwrap();
    assert_eq!(
        (h.cache.claims, h.cache.claim_reads),
        (2, 2),
        "two claims held, each read once: {h:?}"
    );
    c.del("c-web", "web", &uid, &conf).ok();
    c.api.must(
        "DELETE",
        "/api/v1/namespaces/team-a/pods/web?gracePeriodSeconds=0",
        None,
    );
    d.wait("the claims dropped with their pod", |h| h.cache.claims == 0);
}

/// One device of a claim's allocation: (request, driver, pool, device, shareID).
type Allocated<'a> = (&'a str, &'a str, &'a str, &'a str, Option<&'a str>);

/// [`Dra::allocated_claim`] on node1's pool: `results` are (request, driver, device, shareID).
fn raw_claim(
    c: &Dra,
    name: &str,
    config: Vec<Value>,
    results: &[(&str, &str, &str, Option<&str>)],
    pod: (&str, &str),
) {
    let results: Vec<Allocated> = results
        .iter()
        .map(|&(request, driver, device, share)| (request, driver, NODE, device, share))
        .collect();
    c.allocated_claim(name, config, &results, pod);
}

/// A CNI configuration in the claim, in the CNI DRA driver's form (kubernetes-sigs/cni-dra-driver), attaches with
/// its request's device on its `ifName`, through the daemon too; the same form for a device of that driver
/// itself is left to it; a selection element naming the pod's claim and request
/// (`dev.plexus.resourceClaim`) gets that claim's device where the NAD's resource alone would have taken the
/// first claim's.
#[test]
fn the_cni_dra_drivers_form_attaches_and_a_selection_picks_its_claim() {
    let c = dra_cluster();
    let annotation = json!([{"name": "sriov-net",
                             "dev.plexus.resourceClaim": {"name": "nic1", "request": "nic"}}]);
    let uid = c.pod(
        "multi",
        Some(&annotation.to_string()),
        &["multi-a", "multi-b", "multi-own"],
    );
    let carried = |driver: &str, request: &str, marker: &str| {
        json!({"requests": [request], "opaque": {"driver": driver, "parameters": {
            "apiVersion": "cni.networking.x-k8s.io/v1alpha1", "kind": "CNI", "ifName": "cni0",
            "config": {"cniVersion": "1.0.0", "name": "macvlan-eth0",
                       "plugins": [{"type": "secondary-plugin", "marker": marker,
                                    "capabilities": {"deviceID": true}}]}
        }}})
    };
    raw_claim(
        &c,
        "multi-a",
        vec![carried(DRIVER, "nic", "carried")],
        &[("nic", DRIVER, "vf0", None)],
        ("multi", &uid),
    );
    raw_claim(
        &c,
        "multi-b",
        Vec::new(),
        &[("nic", DRIVER, "vf1", None)],
        ("multi", &uid),
    );
    // A claim the CNI DRA driver allocated itself: its configuration is that driver's to attach.
    raw_claim(
        &c,
        "multi-own",
        vec![carried("cni.dra.networking.x-k8s.io", "own", "not-plexus")],
        &[("own", "cni.dra.networking.x-k8s.io", "eth1", None)],
        ("multi", &uid),
    );
    for daemon in [false, true] {
        let _d = daemon.then(|| {
            let d = c.daemon();
            d.wait("the pod's claims read", |h| h.cache.claims == 3);
            d
        });
        c.sb.clear_calls();
        let mut conf = c.conf(daemon);
        // The node conf lets this driver's claims carry CNI configurations (by default none may).
        conf["claimCniDrivers"] = json!([DRIVER]);
        let id = format!("c-multi-{daemon}");
        c.add(&id, "multi", &uid, &conf).ok();
        assert_eq!(
            c.device_calls(),
            [("net1", "0000:01:00.2"), ("cni0", "0000:01:00.1")]
                .map(|(i, d)| (i.to_string(), d.to_string(), d.to_string())),
            "the NAD took nic1's device, the carried configuration its request's (daemon: {daemon})"
        );
        let markers: Vec<String> =
            c.sb.calls()
                .iter()
                .filter(|call| call.command == "ADD")
                .filter_map(|call| call.stdin["marker"].as_str().map(str::to_string))
                .collect();
        assert_eq!(
            markers,
            ["carried"],
            "the claim's own configuration ran, the driver's was left to it"
        );
        let names: Vec<String> = c
            .api
            .network_status("team-a", "multi")
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            names,
            ["cluster-net", "team-a/sriov-net", "team-a/macvlan-eth0"]
        );
        let claim = c.wait_claim("multi-a", "the carried network's data", |d| {
            entry(d, "vf0").is_some_and(|e| e["networkData"]["interfaceName"] == "cni0")
        });
        assert!(entry(claim["status"]["devices"].as_array().unwrap(), "vf1").is_none());
        c.wait_claim("multi-b", "the referenced device's data", |d| {
            entry(d, "vf1").is_some_and(|e| e["networkData"]["interfaceName"] == "net1")
        });
        c.del(&id, "multi", &uid, &conf).ok();
        c.wait_claim("multi-a", "taken back", <[Value]>::is_empty);
    }

    // A reference to a claim the pod does not have fails the ADD, naming it; nothing attached.
    let bad = json!([{"name": "sriov-net", "dev.plexus.resourceClaim": {"name": "nope"}}]);
    let uid = c.pod("stray", Some(&bad.to_string()), &[]);
    c.sb.clear_calls();
    let run = c.add("c-stray", "stray", &uid, &c.conf(false));
    assert_eq!(run.code(), 7, "a configuration error");
    let err = run.msg();
    assert!(
        err.contains("the pod's claim \"nope\"") && err.contains("team-a/sriov-net"),
        "{err}"
    );
    assert!(c.device_calls().is_empty());
}

/// A shared device's allocations (KEP-5075) are each their own entry of `status.devices`, with the allocation's
/// `shareID`; an entry whose network data the DRA driver wrote itself is kept as the driver wrote it.
#[test]
fn shares_get_entries_of_their_own_and_a_drivers_network_data_is_kept() {
    let c = dra_cluster();
    let uid = c.pod("shared", Some("sriov-net,sriov-net"), &["shared-nics"]);
    let (s1, s2) = (
        "6a3c1b8e-2f4d-4e5a-9b7c-0d1e2f3a4b5c",
        "7b4d2c9f-3a5e-4f6b-8c8d-1e2f3a4b5c6d",
    );
    raw_claim(
        &c,
        "shared-nics",
        Vec::new(),
        &[
            ("nic", DRIVER, "vf0", Some(s1)),
            ("nic", DRIVER, "vf0", Some(s2)),
        ],
        ("shared", &uid),
    );
    let allocated = c.claim_object("shared-nics");
    assert_eq!(
        allocated["status"]["allocation"]["devices"]["results"][1]["shareID"], s2,
        "the API server keeps shareID: {allocated:#}"
    );
    c.add("c-shared", "shared", &uid, &c.conf(false)).ok();
    let claim = c.wait_claim("shared-nics", "two entries", |d| d.len() == 2);
    let devices = claim["status"]["devices"].as_array().unwrap();
    let by_share = |s: &str| devices.iter().find(|d| d["shareID"] == s).cloned();
    assert_eq!(
        by_share(s1).expect("share 1")["networkData"]["interfaceName"],
        "net1"
    );
    assert_eq!(
        by_share(s2).expect("share 2")["networkData"]["interfaceName"],
        "net2"
    );
    c.del("c-shared", "shared", &uid, &c.conf(false)).ok();
    c.wait_claim("shared-nics", "taken back", <[Value]>::is_empty);

    // The driver wrote vf0's network data itself.
    let uid = c.pod("driven", Some("sriov-net"), &["driven-nic"]);
    raw_claim(
        &c,
        "driven-nic",
        Vec::new(),
        &[("nic", DRIVER, "vf0", None)],
        ("driven", &uid),
    );
    let drivers = json!({"driver": DRIVER, "pool": NODE, "device": "vf0",
                         "networkData": {"interfaceName": "eth9", "ips": ["10.9.0.2/24"]}});
    c.api.must(
        "PATCH",
        "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/driven-nic/status",
        Some(&json!({"status": {"devices": [drivers]}})),
    );
    let before = c.claim_object("driven-nic")["status"]["devices"].clone();
    assert_eq!(before[0]["networkData"], drivers["networkData"]);
    c.sb.clear_calls();
    c.add("c-driven", "driven", &uid, &c.conf(false)).ok();
    assert_eq!(
        c.device_calls().len(),
        1,
        "the network attached with the device"
    );
    std::thread::sleep(Duration::from_millis(500));
    let devices = c.claim_object("driven-nic")["status"]["devices"].clone();
    assert_eq!(devices, before, "the driver's entry as it wrote it");
    c.del("c-driven", "driven", &uid, &c.conf(false)).ok();
    let devices = c.claim_object("driven-nic")["status"]["devices"].clone();
    assert_eq!(devices, before, "and after DEL");
}

/// Hooks see the device (WIT 0.1.2): the example resolver `network-templates` fills a NAD without a config with
/// the template of the DRA driver whose device the selection uses, and leaves a selection without one alone.
#[test]
fn a_resolver_hook_sees_the_claim_device_of_its_selection() {
    let c = dra_cluster();
    let mut conf = c.conf(false);
    conf["hooks"] = json!([{
        "name": "templates", "kind": "resolver", "module": guest_wasm("network-templates"),
        "settings": {"driverTemplates": {DRIVER: {
            "cniVersion": "1.0.0", "type": "secondary-plugin", "marker": "driver-template"}}}
    }]);
    let uid = c.pod("templated", None, &["templated-nic"]);
    c.claim(
        "templated-nic",
        vec![attachment(
            &["nic"],
            json!({"apiVersion": "plexus.dev/v1alpha1", "kind": "NetworkAttachment", "name": "bare",
                   "interface": "dra0"}),
        )],
        &[("nic", "node1", "vf1")],
        ("templated", &uid),
    );
    c.add("c-templated", "templated", &uid, &conf).ok();
    let call =
        c.sb.calls()
            .into_iter()
            .find(|x| x.plugin == "secondary-plugin" && x.command == "ADD")
            .expect("the templated network's delegate ran");
    assert_eq!(call.stdin["marker"], "driver-template", "{}", call.stdin);
    assert_eq!(call.stdin["deviceID"], "0000:01:00.2");
    assert_eq!(call.env["CNI_IFNAME"], "dra0");

    // Without a claim device the NAD has no config and no template: the ADD fails naming it.
    let uid = c.pod("untemplated", Some("bare"), &[]);
    let run = c.add("c-untemplated", "untemplated", &uid, &conf);
    assert!(run.code() != 0, "{}", run.msg());
    assert!(run.msg().contains("bare"), "{}", run.msg());
}

/// A claim naming a NAD that does not exist, or with a malformed request, fails the ADD naming the claim, and
/// leaves nothing attached; a device only another node's slice lists is no device of the resource here.
#[test]
fn a_claim_that_cannot_be_attached_fails_the_add_naming_it() {
    let c = dra_cluster();
    let conf = c.conf(false);

    let uid = c.pod("missing", None, &["missing-nic"]);
    c.claim(
        "missing-nic",
        vec![attachment(
            &[],
            json!({"apiVersion": "plexus.dev/v1alpha1", "kind": "NetworkAttachment", "name": "nope"}),
        )],
        &[("nic", "node1", "vf0")],
        ("missing", &uid),
    );
    let run = c.add("c-missing", "missing", &uid, &conf);
    let msg = run.msg();
    assert!(run.code() != 0, "{msg}");
    assert!(msg.contains("ResourceClaim team-a/missing-nic"), "{msg}");
    assert!(msg.contains("nope"), "{msg}");
    let adds = c.sb.calls().iter().filter(|x| x.command == "ADD").count();
    let dels = c.sb.calls().iter().filter(|x| x.command == "DEL").count();
    assert!(
        adds <= dels,
        "everything added was taken back: {:?}",
        c.sb.call_summary()
    );
    assert!(
        c.sb.cached_plan("c-missing").is_none(),
        "no cache entry stays"
    );

    let uid = c.pod("malformed", None, &["malformed-nic"]);
    c.claim(
        "malformed-nic",
        vec![attachment(
            &["nic"],
            json!({"apiVersion": "plexus.dev/v1alpha1", "kind": "Other", "name": "fast"}),
        )],
        &[("nic", "node1", "vf0")],
        ("malformed", &uid),
    );
    let run = c.add("c-malformed", "malformed", &uid, &conf);
    let msg = run.msg();
    assert_eq!(run.code(), 7, "{msg}");
    assert!(msg.contains("ResourceClaim team-a/malformed-nic"), "{msg}");
    assert!(msg.contains("kind must be"), "{msg}");
    // With DRA switched off in the conf, the claims are not read: the pod attaches its cluster network alone.
    let mut off = conf.clone();
    off["dynamicResourceAllocation"] = json!(false);
    c.sb.clear_calls();
    c.add("c-off", "malformed", &uid, &off).ok();
    assert!(c.device_calls().is_empty(), "{:?}", c.sb.call_summary());

    // vf2 is listed by node2's slice only: on node1 it has no attributes, so the NAD finds no device.
    let uid = c.pod("elsewhere", Some("sriov-net"), &["elsewhere-nic"]);
    c.claim(
        "elsewhere-nic",
        Vec::new(),
        &[("nic", "node2", "vf2")],
        ("elsewhere", &uid),
    );
    let run = c.add("c-elsewhere", "elsewhere", &uid, &conf);
    let msg = run.msg();
    assert!(run.code() != 0, "{msg}");
    assert!(msg.contains(RESOURCE), "{msg}");

    // A pod without claims or devices attaches as before: the claims list answers empty.
    let uid = c.pod("plain", Some("fast"), &[]);
    c.sb.clear_calls();
    c.add("c-plain", "plain", &uid, &conf).ok();
    assert_eq!(
        c.device_calls(),
        [("net1".to_string(), String::new(), String::new())]
    );
}

/// Kubernetes 1.36+ authorizes each driver's entries of a claim's `status.devices` on top of `resourceclaims/status`
/// (`resourceclaims/driver`, named after the driver, with `associated-node:` verbs for a service account whose
/// token names the claim's node). The project's RBAC lets the node-bound identity write them (the first test); the
/// same account without the node in its token is refused, and so is a role whose `resourceNames` list only other
/// drivers, while one that lists the claim's driver is enough. A refused write fails no ADD: the claim keeps no
/// network data and the log names the rule.
#[test]
fn the_claims_network_data_needs_the_drivers_rule_and_the_node_bound_identity() {
    let c = dra_cluster();
    // The project's role with its driver rule narrowed to `drivers`, bound to the account `narrow`.
    let narrowed = |drivers: &[&str]| {
        let mut role = c.api.must(
            "GET",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles/plexus",
            None,
        );
        let rules = role["rules"].as_array_mut().unwrap();
        let driver_rule = rules
            .iter_mut()
            .find(|r| r["resources"] == json!(["resourceclaims/driver"]))
            .expect("the project's role has a resourceclaims/driver rule");
        assert_eq!(driver_rule["verbs"], json!(["associated-node:patch"]));
        driver_rule["resourceNames"] = json!(drivers);
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": "plexus-narrow"}, "rules": role["rules"]})
    };
    c.api.create(&narrowed(&["other.example.com"]));
    c.api
        .create(&json!({"apiVersion": "v1", "kind": "ServiceAccount",
                         "metadata": {"name": "narrow", "namespace": "kube-system"}}));
    c.api.create(&json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "plexus-narrow"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "plexus-narrow"},
        "subjects": [{"kind": "ServiceAccount", "name": "narrow", "namespace": "kube-system"}]
    }));
    let narrow_token = c.api.node_bound_token("kube-system", "narrow", NODE);
    c.api
        .write_kubeconfig(&c.sb.path("narrow.kubeconfig"), &narrow_token);
    // The plexus account's static token: the same user and RBAC, but no node in the identity.
    c.api
        .write_kubeconfig(&c.sb.path("static.kubeconfig"), "plexus-token");

    let uid = c.pod("auth", Some("sriov-net"), &["auth-nic"]);
    c.claim(
        "auth-nic",
        Vec::new(),
        &[("nic", "node1", "vf0")],
        ("auth", &uid),
    );
    let with = |kubeconfig: &str| {
        let mut conf = c.conf(false);
        conf["cluster"]["kubeconfig"] = json!(c.sb.path(kubeconfig));
        conf
    };
    for (id, kubeconfig, who) in [
        ("c-static", "static.kubeconfig", "a token without the node"),
        (
            "c-narrow",
            "narrow.kubeconfig",
            "a role for other drivers only",
        ),
    ] {
        let conf = with(kubeconfig);
        let run = c.add(id, "auth", &uid, &conf);
        run.ok();
        assert!(
            run.stderr.contains("resourceclaims/driver"),
            "{who}: the refusal is logged naming the rule: {}",
            run.stderr
        );
        let claim = c.claim_object("auth-nic");
        assert!(
            claim["status"]["devices"]
                .as_array()
                .is_none_or(Vec::is_empty),
            "{who}: no network data written: {claim:#}"
        );
        c.del(id, "auth", &uid, &conf).ok();
    }

    c.api.must(
        "PUT",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/plexus-narrow",
        Some(&narrowed(&["other.example.com", DRIVER])),
    );
    let conf = with("narrow.kubeconfig");
    c.add("c-listed", "auth", &uid, &conf).ok();
    c.wait_claim(
        "auth-nic",
        "network data under a role listing the driver",
        |d| entry(d, "vf0").is_some_and(|e| e["networkData"]["interfaceName"] == "net1"),
    );
    c.del("c-listed", "auth", &uid, &conf).ok();
    c.wait_claim("auth-nic", "taken back", |d| d.is_empty());
}

/// As a cluster that runs DRA workloads does: the namespace's users may create ResourceClaims (Kubernetes' `edit`
/// role does not include them).
fn grant_claims(api: &KubeApiServer) {
    api.create(&json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "claims", "namespace": "team-a"},
        "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceclaimtemplates"],
                   "verbs": ["create", "get", "list", "delete"]}]
    }));
    api.create(&json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "claims", "namespace": "team-a"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "claims"},
        "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": "team-a"}]
    }));
}

/// What a namespace's user writes only selects among what the admin installed (design.md, "Who may make a node
/// run what"). A claim the tenant creates whose CNI configuration names another driver than its device's is not
/// attached (whatever the node conf lists), and one under its device's driver attaches only where the node conf
/// lists that driver (`claimCniDrivers`); a configuration of type `plexus`, carried in a claim or in a NAD, is
/// refused, and the executable it points at in a directory of the tenant's never runs. Through the daemon too.
#[test]
fn a_tenants_claims_and_nads_run_nothing_the_node_conf_does_not_allow() {
    let c = dra_cluster();
    grant_claims(&c.api);
    // The tenant's directory on the node (a pod's emptyDir, say): an executable and a conf naming it.
    let tenant_dir = c.sb.path("tenant-dir");
    std::fs::create_dir_all(&tenant_dir).unwrap();
    let ran = c.sb.path("tenant-ran");
    let marker = tenant_dir.join("marker");
    std::fs::write(
        &marker,
        format!(
            "#!/bin/sh\necho ran >> {}\necho '{{\"cniVersion\":\"1.0.0\"}}'\n",
            ran.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&marker, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        tenant_dir.join("pwn.conf"),
        json!({"cniVersion": "1.0.0", "name": "pwn", "type": "marker"}).to_string(),
    )
    .unwrap();
    // The node has plexus itself in its bin dir, as every node does.
    std::os::unix::fs::symlink(
        plexus_tests::plexus::plexus_cni_bin(),
        c.sb.path("bin/plexus"),
    )
    .unwrap();
    let nested = json!({"cniVersion": "1.0.0", "name": "nested", "type": "plexus",
        "binDir": tenant_dir, "confDir": tenant_dir, "clusterNetwork": tenant_dir.join("pwn.conf"),
        "cluster": {"source": "files", "dir": tenant_dir}, "clusterHooks": false});
    c.api.create(&json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "nested", "namespace": "team-a"},
        "spec": {"config": nested.to_string()}
    }));

    let carried = |driver: &str, config: Value| {
        json!({"requests": ["nic"], "opaque": {"driver": driver, "parameters": {
            "apiVersion": "cni.networking.x-k8s.io/v1alpha1", "kind": "CNI", "ifName": "t0",
            "config": config}}})
    };
    let secondary = |name: &str| {
        json!({"cniVersion": "1.0.0", "name": name,
               "plugins": [{"type": "secondary-plugin", "marker": name}]})
    };
    // The tenant creates each claim with its own token; the test plays the scheduler and allocates it.
    let tenant_claim = |name: &str, config: Value, device: (&str, &str), uid: &str, pod: &str| {
        let (code, body) = c
            .api
            .request_as(
                TENANT_TOKEN,
                "POST",
                "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims",
                Some(&json!({
                    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": name, "namespace": "team-a"},
                    "spec": {"devices": {
                        "requests": [{"name": "nic", "exactly": {"deviceClassName": "any"}}],
                        "config": [config]}}
                })),
            )
            .unwrap();
        assert_eq!(code, 201, "the tenant may create claims: {body}");
        c.api.allocate_claim(
            "team-a",
            name,
            vec![json!({"request": "nic", "driver": device.0, "pool": NODE, "device": device.1})],
            NODE,
            (pod, uid),
        );
    };
    let other_uid = c.pod("other-driver", None, &["t-other"]);
    // The device is a GPU; the configuration says it is for another driver.
    tenant_claim(
        "t-other",
        carried("nobody.example.com", secondary("pwn-other")),
        ("gpu.example.com", "g0"),
        &other_uid,
        "other-driver",
    );
    let unlisted_uid = c.pod("unlisted", None, &["t-unlisted"]);
    tenant_claim(
        "t-unlisted",
        carried(DRIVER, secondary("pwn-unlisted")),
        (DRIVER, "vf0"),
        &unlisted_uid,
        "unlisted",
    );
    let nested_uid = c.pod("nested-claim", None, &["t-nested"]);
    tenant_claim(
        "t-nested",
        carried(DRIVER, nested.clone()),
        (DRIVER, "vf1"),
        &nested_uid,
        "nested-claim",
    );
    let nad_uid = c.pod("nested-nad", Some("nested"), &[]);

    let markers = |c: &Dra| -> Vec<String> {
        c.sb.calls()
            .iter()
            .filter(|call| call.command == "ADD")
            .filter_map(|call| call.stdin["marker"].as_str().map(str::to_string))
            .collect()
    };
    for daemon in [false, true] {
        let _d = daemon.then(|| {
            let d = c.daemon();
            d.wait("the pods' claims read", |h| h.cache.claims == 3);
            d
        });
        let conf = c.conf(daemon);
        let mut listing = conf.clone();
        listing["claimCniDrivers"] = json!([DRIVER, "nobody.example.com", "gpu.example.com"]);

        // Another driver's name: nothing is attached from it, listed or not; the pod gets its cluster network.
        for (i, conf) in [&conf, &listing].into_iter().enumerate() {
            c.sb.clear_calls();
            let id = format!("t-other-{daemon}-{i}");
            c.add(&id, "other-driver", &other_uid, conf).ok();
            assert_eq!(markers(&c), Vec::<String>::new(), "daemon: {daemon}");
            assert_eq!(
                c.sb.call_summary(),
                [("cluster-plugin", "ADD", "eth0")].map(|(a, b, d)| (a.into(), b.into(), d.into())),
                "daemon: {daemon}"
            );
            c.del(&id, "other-driver", &other_uid, conf).ok();
        }

        // Its device's driver, not listed: refused, naming the claim and the conf key; nothing stays.
        c.sb.clear_calls();
        let id = format!("t-unlisted-{daemon}");
        let run = c.add(&id, "unlisted", &unlisted_uid, &conf);
        let msg = run.msg();
        assert!(run.code() != 0, "{msg}");
        assert!(msg.contains("ResourceClaim team-a/t-unlisted"), "{msg}");
        assert!(msg.contains("claimCniDrivers"), "{msg}");
        assert_eq!(markers(&c), Vec::<String>::new(), "daemon: {daemon}");
        assert!(c.sb.cached_plan(&id).is_none(), "no cache entry stays");
        c.del(&id, "unlisted", &unlisted_uid, &conf).ok();
        // Listed: it attaches.
        c.sb.clear_calls();
        let id = format!("t-listed-{daemon}");
        c.add(&id, "unlisted", &unlisted_uid, &listing).ok();
        assert_eq!(markers(&c), ["pwn-unlisted"], "daemon: {daemon}");
        c.del(&id, "unlisted", &unlisted_uid, &listing).ok();

        // type: plexus, in a claim of a listed driver and in a NAD: refused, the tenant's file never runs.
        for (pod, uid) in [("nested-claim", &nested_uid), ("nested-nad", &nad_uid)] {
            let id = format!("t-{pod}-{daemon}");
            let run = c.add(&id, pod, uid, &listing);
            let msg = run.msg();
            assert!(run.code() != 0, "{pod}: {msg}");
            assert!(
                msg.contains("\"plexus\"") && msg.contains("delegating plugin"),
                "{pod}: {msg}"
            );
            assert!(c.sb.cached_plan(&id).is_none(), "no cache entry stays");
            c.del(&id, pod, uid, &listing).ok();
            assert!(
                !ran.exists(),
                "the tenant's executable ran ({pod}, daemon: {daemon})"
            );
        }
    }
}
