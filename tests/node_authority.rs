//! A node's authority ends at its node: with the project's RBAC and its node-authority policy
//! (examples/deploy/node-authority.yaml) on the real API server, node A's plexus token (node-bound, as a DaemonSet
//! pod's projected token is) can write the network-status of node A's pods and node A's NodeHookStatus, and
//! nothing else of what RBAC alone would let it write.

use plexus_tests::kubeapi::KubeApiServer;
use serde_json::{json, Value};

const STATUS: &str = "k8s.v1.cni.cncf.io/network-status";
const REPORTS: &str = "/apis/plexus.dev/v1alpha1/nodehookstatuses";

fn pod(api: &KubeApiServer, name: &str, node: &str) {
    api.create(&json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team", "labels": {"app": name}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]}}));
}

/// A merge patch of `pods/status` of `team/<pod>` with `token`: the answer's code and body.
fn patch_status(api: &KubeApiServer, token: &str, pod: &str, patch: &Value) -> (u16, String) {
    api.request_as(
        token,
        "PATCH",
        &format!("/api/v1/namespaces/team/pods/{pod}/status"),
        Some(patch),
    )
    .unwrap()
}

/// The API server with the project's CRDs, RBAC and node-authority policy, namespace `team`, nodes `node-a` and
/// `node-b` each with a plexus token bound to it; node A's token.
fn cluster() -> (KubeApiServer, String) {
    let api = KubeApiServer::start(&[], &["--disable-admission-plugins=ServiceAccount"]);
    api.apply_file(&plexus_tests::deploy_manifest("crds.yaml"));
    api.apply_file(&plexus_tests::deploy_manifest("networkhooks.yaml"));
    api.apply_file(&plexus_tests::deploy_manifest("rbac.yaml"));
    api.apply_node_authority();
    api.namespace("team");
    let a = api.node_bound_token("kube-system", "plexus", "node-a");
    api.node_bound_token("kube-system", "plexus", "node-b");
    (api, a)
}

#[track_caller]
fn assert_refused(answer: &(u16, String), naming: &str) {
    assert_eq!(answer.0, 403, "{}", answer.1);
    assert!(
        answer.1.contains("plexus-node-authority") && answer.1.contains(naming),
        "{}",
        answer.1
    );
}

#[test]
fn a_nodes_token_writes_only_what_belongs_to_its_node() {
    let (api, a) = cluster();
    pod(&api, "web-a", "node-a");
    pod(&api, "web-b", "node-b");
    let status = json!({"metadata": {"annotations": {STATUS: "[{\"name\":\"cbr0\"}]"}}});

    // Its own node's pod: the network-status annotation, and nothing else.
    let ok = patch_status(&api, &a, "web-a", &status);
    assert_eq!(ok.0, 200, "{}", ok.1);
    let refused = patch_status(
        &api,
        &a,
        "web-a",
        &json!({"metadata": {"labels": {"app": "other"}}}),
    );
    assert_refused(
        &refused,
        "may change only the k8s.v1.cni.cncf.io/network-status",
    );
    let refused = patch_status(
        &api,
        &a,
        "web-a",
        &json!({"metadata": {"annotations": {"k8s.v1.cni.cncf.io/networks": "team/anything"}}}),
    );
    assert_refused(&refused, "may change only");
    let refused = patch_status(
        &api,
        &a,
        "web-a",
        &json!({"metadata": {"finalizers": ["example.com/hold"]}}),
    );
    assert_refused(&refused, "may change only");
    let refused = patch_status(
        &api,
        &a,
        "web-a",
        &json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
    );
    assert_refused(&refused, "may change only");

    // Another node's pod: not even its network-status.
    let refused = patch_status(&api, &a, "web-b", &status);
    assert_refused(&refused, "it is not bound to that node");
    let b = api.must("GET", "/api/v1/namespaces/team/pods/web-b", None);
    assert!(b["metadata"]["annotations"][STATUS].is_null(), "{b}");

    // Node reports: its own, not another node's.
    let report = |node: &str| {
        json!({"apiVersion": "plexus.dev/v1alpha1", "kind": "NodeHookStatus",
        "metadata": {"name": node}, "status": {"active": 0, "failing": 0}})
    };
    let created = api
        .request_as(&a, "POST", REPORTS, Some(&report("node-a")))
        .unwrap();
    assert_eq!(created.0, 201, "{}", created.1);
    let refused = api
        .request_as(&a, "POST", REPORTS, Some(&report("node-b")))
        .unwrap();
    assert_refused(&refused, "may write only the NodeHookStatus named node-a");

    // A NetworkHook's legacy status.nodes: its own node's entry may go, another node's not.
    api.create(&json!({"apiVersion": "plexus.dev/v1alpha1", "kind": "NetworkHook",
        "metadata": {"name": "labels"},
        "spec": {"kind": "status", "module": "registry.example/labels@sha256:0000000000000000000000000000000000000000000000000000000000000000"}}));
    let entry = |node: &str| json!({"node": node, "active": true, "reason": "Active", "observedGeneration": 1});
    let hook_status = "/apis/plexus.dev/v1alpha1/networkhooks/labels/status";
    api.must(
        "PATCH",
        hook_status,
        Some(&json!({"status": {"nodes": [entry("node-a"), entry("node-b")]}})),
    );
    let refused = api
        .request_as(
            &a,
            "PATCH",
            hook_status,
            Some(&json!({"status": {"nodes": [entry("node-a")]}})),
        )
        .unwrap();
    assert_refused(&refused, "may only remove its own node's entry");
    let removed = api
        .request_as(
            &a,
            "PATCH",
            hook_status,
            Some(&json!({"status": {"nodes": [entry("node-b")]}})),
        )
        .unwrap();
    assert_eq!(removed.0, 200, "{}", removed.1);

    // Events: only as its node. The CNI plugin's cluster source (thin mode) reports as the node of the pod it
    // read, with node A's token.
    let event = |instance: &str| {
        json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": "web-a.", "namespace": "team"},
        "involvedObject": {"kind": "Pod", "name": "web-a", "namespace": "team"},
        "reason": "AddedInterface", "message": "x", "type": "Normal",
        "reportingComponent": "plexus", "reportingInstance": instance})
    };
    let events = "/api/v1/namespaces/team/events";
    let posted = api
        .request_as(&a, "POST", events, Some(&event("node-a")))
        .unwrap();
    assert_eq!(posted.0, 201, "{}", posted.1);
    assert_refused(
        &api.request_as(&a, "POST", events, Some(&event("node-b")))
            .unwrap(),
        "may post events only as that node",
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("a.kubeconfig");
    api.write_kubeconfig(&kubeconfig, &a);
    let thin = std::thread::spawn(move || {
        use plexus_cluster::{Cluster, KubeCluster, KubeSettings};
        let cluster = KubeCluster::new(KubeSettings {
            kubeconfig: Some(kubeconfig),
            ..KubeSettings::default()
        })
        .unwrap();
        let pod = plexus_core::spec::PodRef {
            namespace: "team".into(),
            name: "web-a".into(),
            uid: None,
        };
        cluster.pod(&pod).unwrap();
        cluster.write_status(&pod, "[]").unwrap();
        cluster.record_attachment(&pod, "thin-mode event").unwrap();
    });
    thin.join().unwrap();
    let listed = api.must("GET", events, None);
    let thin_event = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["message"] == "thin-mode event")
        .cloned()
        .unwrap_or_else(|| panic!("no thin-mode event in {listed}"));
    assert_eq!(thin_event["reportingInstance"], "node-a", "{thin_event}");

    // A plexus token that names no node (a static one here) writes nothing.
    let refused = patch_status(&api, "plexus-token", "web-a", &status);
    assert_refused(&refused, "names no node");

    // Reading is RBAC's alone: unchanged.
    let read = api
        .request_as(&a, "GET", "/api/v1/namespaces/team/pods/web-b", None)
        .unwrap();
    assert_eq!(read.0, 200, "{}", read.1);
}

/// Claims: node A's token may write `status.devices` of a claim allocated on node A, and nothing of a claim
/// allocated elsewhere, nor the allocation or reservation of its own.
#[test]
fn a_nodes_token_writes_only_the_device_status_of_its_nodes_claims() {
    let (api, a) = cluster();
    let claims = "/apis/resource.k8s.io/v1/namespaces/team/resourceclaims";
    for (name, node) in [("claim-a", "node-a"), ("claim-b", "node-b")] {
        api.create(&json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "team"},
            "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "nic"}}]}}}));
        let results =
            vec![json!({"request": "nic", "driver": "example.com", "pool": node, "device": "vf0"})];
        api.allocate_claim("team", name, results, node, ("web", "uid-web"));
    }
    let devices = json!({"status": {"devices": [{"driver": "example.com", "pool": "node-a", "device": "vf0",
        "networkData": {"interfaceName": "net1", "ips": ["10.1.1.2/24"]}}]}});
    let patch = |claim: &str, body: &Value| {
        api.request_as(&a, "PATCH", &format!("{claims}/{claim}/status"), Some(body))
            .unwrap()
    };
    let ok = patch("claim-a", &devices);
    assert_eq!(ok.0, 200, "{}", ok.1);
    // Another node's claim, and the allocation or reservation of its own: since 1.36 the API server refuses
    // these itself before admission (the writer's node must be the claim's; allocation and reservedFor need
    // resourceclaims/binding), so on this server the policy's claim rules (for 1.35) are not reached.
    let mut theirs = devices.clone();
    theirs["status"]["devices"][0]["pool"] = json!("node-b");
    for (claim, body, why) in [
        ("claim-b", theirs, "arbitrary-node:patch"),
        (
            "claim-b",
            json!({"status": {"reservedFor": []}}),
            "resourceclaims/binding",
        ),
        (
            "claim-a",
            json!({"status": {"reservedFor": []}}),
            "resourceclaims/binding",
        ),
    ] {
        let refused = patch(claim, &body);
        assert!(
            refused.0 >= 400 && refused.1.contains(why),
            "{claim}: {}",
            refused.1
        );
    }
    let claim = api.must("GET", &format!("{claims}/claim-b"), None);
    assert!(claim["status"]["devices"].is_null(), "{claim}");
    assert_eq!(claim["status"]["reservedFor"][0]["name"], "web");
}
