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
        use plexus_cluster::{Cluster, KubeCluster, KubeSettings, PodEvent};
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
        let node = cluster.pod(&pod).unwrap().node_name;
        cluster.write_status(&pod, "[]").unwrap();
        cluster
            .record(&PodEvent::attached(
                &pod,
                node.as_deref(),
                "thin-mode event",
            ))
            .unwrap();
        // A write the policy refuses is reported as the policy's refusal, not as a permission RBAC lacks.
        let theirs = plexus_core::spec::PodRef {
            name: "web-b".into(),
            ..pod
        };
        let refused = cluster.write_status(&theirs, "[]").unwrap_err().to_string();
        assert!(
            refused.contains(
                "patch pods/status team/web-b: the ValidatingAdmissionPolicy plexus-node-authority"
            ) && refused.contains(
                "refused the request: plexus on node node-a may not write the status of pod"
            ) && !refused.contains("permission"),
            "{refused}"
        );
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

/// An event of the plexus identity says what plexus says of itself: reported from its node (`reportingInstance`,
/// `source.host`) by a component of plexus (`reportingComponent`, the core/v1 name of events.k8s.io's
/// `reportingController`, and `source.component`), so node A's token cannot post, as kubelet or as node B, that
/// something happened to node B's pod. Each refusal below is by its own rule of the policy, named by its message.
#[test]
fn a_nodes_events_are_plexus_speaking_from_that_node() {
    let (api, a) = cluster();
    pod(&api, "web-a", "node-a");
    pod(&api, "web-b", "node-b");
    let events = "/api/v1/namespaces/team/events";
    // As the daemon and the CNI plugin post one (host/cluster/src/kube.rs, post_event_about).
    let event = |about: &str, component: &str, host: &str| {
        json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": format!("{about}."), "namespace": "team"},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": about, "namespace": "team"},
        "reason": "AddedInterface", "message": "x", "type": "Normal",
        "source": {"component": component, "host": host},
        "reportingComponent": component, "reportingInstance": "node-a"})
    };
    let post = |body: &Value| api.request_as(&a, "POST", events, Some(body)).unwrap();

    // Its own: plexus, from node A.
    let posted = post(&event("web-a", "plexus", "node-a"));
    assert_eq!(posted.0, 201, "{}", posted.1);
    let own: Value = serde_json::from_str(&posted.1).unwrap();
    // The node agent's warning on a NetworkHook (cluster scoped, so in `default`).
    let mut warning = event("labels", "plexus-agent", "node-a");
    warning["metadata"]["namespace"] = json!("default");
    warning["involvedObject"] =
        json!({"apiVersion": "plexus.dev/v1alpha1", "kind": "NetworkHook", "name": "labels"});
    let posted = api
        .request_as(
            &a,
            "POST",
            "/api/v1/namespaces/default/events",
            Some(&warning),
        )
        .unwrap();
    assert_eq!(posted.0, 201, "{}", posted.1);

    // Kubelet on node B speaking of node B's pod, through node A's token (as node A: reportingInstance passes).
    let refused = post(&event("web-b", "kubelet", "node-b"));
    assert_refused(
        &refused,
        "may post events only from that node (source.host node-a)",
    );
    // Each part alone: another node as the source's host, another component as the source's or the reporter.
    let refused = post(&event("web-b", "plexus", "node-b"));
    assert_refused(
        &refused,
        "may post events only from that node (source.host node-a)",
    );
    let only_plexus = "may post events only as plexus or plexus-agent";
    let refused = post(&event("web-a", "kubelet", "node-a"));
    assert_refused(&refused, only_plexus);
    let mut reporter = event("web-a", "plexus", "node-a");
    reporter["reportingComponent"] = json!("kube-controller-manager");
    assert_refused(&post(&reporter), only_plexus);
    let mut bare = reporter.clone();
    bare.as_object_mut().unwrap().remove("source");
    assert_refused(&post(&bare), only_plexus);
    // events.k8s.io, where the field is called reportingController, is not granted at all (RBAC).
    let other_api = api
        .request_as(
            &a,
            "POST",
            "/apis/events.k8s.io/v1/namespaces/team/events",
            Some(&json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"generateName": "web-b.", "namespace": "team"},
                "regarding": {"kind": "Pod", "name": "web-b", "namespace": "team"},
                "reason": "Killing", "action": "Kill", "type": "Normal", "note": "x",
                "eventTime": "2026-01-01T00:00:00.000000Z",
                "reportingController": "kubelet", "reportingInstance": "node-a"})),
        )
        .unwrap();
    assert_eq!(other_api.0, 403, "{}", other_api.1);
    assert!(
        other_api.1.contains("cannot create resource"),
        "{}",
        other_api.1
    );

    // Counting: its own event, yes; turning it into another component's, or counting another's, no.
    let own_path = format!("{events}/{}", own["metadata"]["name"].as_str().unwrap());
    let counted = api
        .request_as(&a, "PATCH", &own_path, Some(&json!({"count": 2})))
        .unwrap();
    assert_eq!(counted.0, 200, "{}", counted.1);
    let recast = json!({"source": {"component": "kubelet"}});
    assert_refused(
        &api.request_as(&a, "PATCH", &own_path, Some(&recast))
            .unwrap(),
        only_plexus,
    );
    let kubelets = api.create(&event("web-a", "kubelet", "node-a"));
    let kubelets = format!(
        "{events}/{}",
        kubelets["metadata"]["name"].as_str().unwrap()
    );
    assert_refused(
        &api.request_as(&a, "PATCH", &kubelets, Some(&json!({"count": 2})))
            .unwrap(),
        only_plexus,
    );
}

/// Node A's report may carry what the agent writes (its Node as owner) and nothing by which it could hold up the
/// deletion of another object: no finalizer it adds, no other owner, no blocking owner reference.
#[test]
fn a_nodes_report_holds_up_nothing_but_is_owned_by_its_node() {
    let (api, a) = cluster();
    let uid = |node: &str| {
        api.must("GET", &format!("/api/v1/nodes/{node}"), None)["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (uid_a, uid_b) = (uid("node-a"), uid("node-b"));
    // Exactly what the agent applies.
    let report = plexus_node::node_report::NodeReport::default().object("node-a", &uid_a);
    let create = |body: &Value| api.request_as(&a, "POST", REPORTS, Some(body)).unwrap();

    let no_finalizer = "may not add a finalizer to NodeHookStatus node-a";
    let mut held = report.clone();
    held["metadata"]["finalizers"] = json!(["example.com/hold"]);
    assert_refused(&create(&held), no_finalizer);
    let no_owner =
        "may give NodeHookStatus node-a no owner but its Node node-a (without blockOwnerDeletion)";
    let node_b = json!({"apiVersion": "v1", "kind": "Node", "name": "node-b", "uid": uid_b,
        "blockOwnerDeletion": true});
    let mut elsewhere = report.clone();
    elsewhere["metadata"]["ownerReferences"]
        .as_array_mut()
        .unwrap()
        .push(node_b.clone());
    assert_refused(&create(&elsewhere), no_owner);
    let mut blocking = report.clone();
    blocking["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] = json!(true);
    assert_refused(&create(&blocking), no_owner);

    let created = create(&report);
    assert_eq!(created.0, 201, "{}", created.1);
    let path = format!("{REPORTS}/node-a");
    let patch = |body: Value| api.request_as(&a, "PATCH", &path, Some(&body)).unwrap();
    assert_refused(
        &patch(json!({"metadata": {"finalizers": ["example.com/hold"]}})),
        no_finalizer,
    );
    let owners = json!({"metadata": {"ownerReferences": [report["metadata"]["ownerReferences"][0], node_b]}});
    assert_refused(&patch(owners), no_owner);
    let stored = api.must("GET", &path, None);
    assert!(stored["metadata"]["finalizers"].is_null(), "{stored}");
    assert_eq!(
        stored["metadata"]["ownerReferences"],
        report["metadata"]["ownerReferences"]
    );

    // What another writer (an admin's tool) put there stays, and does not stop the node's own updates.
    api.must(
        "PATCH",
        &path,
        Some(&json!({"metadata": {"finalizers": ["example.com/backup"]}})),
    );
    let updated = patch(json!({"status": {"active": 1}}));
    assert_eq!(updated.0, 200, "{}", updated.1);
    let stored = api.must("GET", &path, None);
    assert_eq!(
        stored["metadata"]["finalizers"],
        json!(["example.com/backup"])
    );
}
