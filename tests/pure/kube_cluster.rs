//! KubeCluster through kube-rs against the API server emulator: reads, the status write, retries, faults.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use plexus_cluster::{Cluster, ClusterError, KubeCluster, KubeSettings, PodEvent};
use plexus_core::spec::PodRef;
use plexus_tests::apiserver::{ApiServer, Fault, RecordedRequest};
use serde_json::{json, Value};

const POD_PATH: &str = "/api/v1/namespaces/team-a/pods/web";
const STATUS_PATH: &str = "/api/v1/namespaces/team-a/pods/web/status";
const NAD_PATH: &str =
    "/apis/k8s.cni.cncf.io/v1/namespaces/team-a/network-attachment-definitions/net-a";
const EVENTS_PATH: &str = "/api/v1/namespaces/team-a/events";

struct Env {
    server: ApiServer,
    _dir: tempfile::TempDir,
    cluster: KubeCluster,
}

/// Fast settings so that retries and timeouts cost milliseconds.
fn settings() -> KubeSettings {
    KubeSettings {
        request_timeout_ms: 1000,
        deadline_ms: 5000,
        retries: 3,
        initial_backoff_ms: 10,
        max_backoff_ms: 40,
        conflict_retries: 3,
        ..KubeSettings::default()
    }
}

fn env_with(tweak: impl FnOnce(&mut KubeSettings)) -> Env {
    let server = ApiServer::start();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig);
    let mut s = KubeSettings {
        kubeconfig: Some(kubeconfig),
        ..settings()
    };
    tweak(&mut s);
    let cluster = KubeCluster::new(s).unwrap();
    server.add_pod(json!({
        "metadata": {
            "name": "web", "namespace": "team-a", "uid": "uid-1",
            "labels": {"app": "web"},
            "annotations": {"k8s.v1.cni.cncf.io/networks": "net-a", "keep": "me"}
        },
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    }));
    server.add_nad(json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "net-a", "namespace": "team-a", "annotations": {"k8s.v1.cni.cncf.io/resourceName": "x/y"}},
        "spec": {"config": "{\"cniVersion\":\"1.0.0\",\"type\":\"bridge\"}"}
    }));
    Env {
        server,
        _dir: dir,
        cluster,
    }
}

fn env() -> Env {
    env_with(|_| {})
}

fn web(uid: Option<&str>) -> PodRef {
    PodRef {
        namespace: "team-a".into(),
        name: "web".into(),
        uid: uid.map(Into::into),
    }
}

/// The `key=value` parameters of a request's query string.
fn query_params(r: &RecordedRequest) -> Vec<&str> {
    r.query
        .as_deref()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .collect()
}

fn count(server: &ApiServer, method: &str, path: &str) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.method == method && r.path == path)
        .count()
}

#[test]
fn pod_is_read_and_its_uid_checked() {
    let e = env();
    let pod = e.cluster.pod(&web(Some("uid-1"))).unwrap();
    assert_eq!(
        (
            pod.namespace.as_str(),
            pod.name.as_str(),
            pod.uid.as_deref()
        ),
        ("team-a", "web", Some("uid-1"))
    );
    assert_eq!(pod.labels["app"], "web");
    assert_eq!(pod.networks_annotation(), Some("net-a"));

    let reqs = e.server.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        (reqs[0].method.as_str(), reqs[0].path.as_str()),
        ("GET", POD_PATH)
    );
    assert_eq!(
        reqs[0].headers.get("authorization").map(String::as_str),
        Some("Bearer emulator-token")
    );

    let err = e.cluster.pod(&web(Some("uid-2"))).unwrap_err();
    assert!(matches!(err, ClusterError::UidMismatch { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "pod team-a/web has uid uid-1, but the runtime asked for uid uid-2"
    );
    // Without a uid to check, any pod of that name will do.
    assert!(e.cluster.pod(&web(None)).is_ok());
}

#[test]
fn an_oversized_answer_is_refused_not_read_whole() {
    let e = env();
    // A pod far larger than any the API server can store: the client stops reading at its limit.
    let huge = "x".repeat(plexus_cluster::MAX_RESPONSE_BYTES + 1024);
    e.server.add_pod(json!({"metadata": {
        "name": "huge", "namespace": "team-a", "uid": "uid-h",
        "annotations": {"k8s.v1.cni.cncf.io/networks": huge}
    }}));
    let err = e
        .cluster
        .pod(&PodRef {
            namespace: "team-a".into(),
            name: "huge".into(),
            uid: None,
        })
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("the answer is over 4194304 bytes"), "{msg}");
    assert!(
        msg.len() < 2000,
        "the error does not echo the body: {}",
        msg.len()
    );
}

#[test]
fn missing_pod_is_not_found() {
    let e = env();
    let err = e
        .cluster
        .pod(&PodRef {
            namespace: "team-a".into(),
            name: "gone".into(),
            uid: None,
        })
        .unwrap_err();
    assert!(matches!(err, ClusterError::NotFound { .. }), "{err:?}");
    assert_eq!(err.to_string(), "pod team-a/gone not found");
    assert_eq!(e.server.requests().len(), 1, "a 404 is final, not retried");
}

#[test]
fn nad_is_read_as_typed_resource() {
    let e = env();
    let nad = e.cluster.nad("team-a", "net-a").unwrap();
    assert_eq!(
        nad.config.as_deref(),
        Some(r#"{"cniVersion":"1.0.0","type":"bridge"}"#)
    );
    assert_eq!(nad.annotations["k8s.v1.cni.cncf.io/resourceName"], "x/y");
    assert_eq!(count(&e.server, "GET", NAD_PATH), 1);

    // No spec, or an empty config: the implementation resolves the name itself (spec 3.2.4).
    e.server
        .add_nad(json!({"metadata": {"name": "bare", "namespace": "team-a"}}));
    e.server.add_nad(
        json!({"metadata": {"name": "blank", "namespace": "team-a"}, "spec": {"config": "  "}}),
    );
    assert_eq!(e.cluster.nad("team-a", "bare").unwrap().config, None);
    assert_eq!(e.cluster.nad("team-a", "blank").unwrap().config, None);
}

#[test]
fn missing_nad_names_namespace_and_name() {
    let e = env();
    let err = e.cluster.nad("team-b", "net-a").unwrap_err();
    assert!(matches!(err, ClusterError::NotFound { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "NetworkAttachmentDefinition team-b/net-a not found"
    );
    assert!(!err.is_transient());
}

#[test]
fn status_is_written_as_a_merge_patch_on_the_status_subresource() {
    let e = env();
    let status = r#"[{"name":"cbr0","interface":"eth0","ips":["10.0.0.5"],"default":true}]"#;
    e.cluster.write_status(&web(Some("uid-1")), status).unwrap();

    let reqs = e.server.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    let patch = &reqs[0];
    assert_eq!(
        (patch.method.as_str(), patch.path.as_str()),
        ("PATCH", STATUS_PATH)
    );
    assert_eq!(
        query_params(patch),
        ["fieldManager=plexus"],
        "plexus's field manager, no dry run, no force"
    );
    assert_eq!(
        patch.headers.get("content-type").map(String::as_str),
        Some("application/merge-patch+json")
    );
    assert_eq!(
        patch.json(),
        json!({"metadata": {"annotations": {"k8s.v1.cni.cncf.io/network-status": status}}})
    );

    let stored = e.server.pod("team-a", "web").unwrap();
    assert_eq!(
        stored["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"],
        status
    );
    assert_eq!(
        stored["metadata"]["annotations"]["keep"], "me",
        "other annotations are untouched"
    );
}

#[test]
fn every_request_names_plexus_and_every_write_its_field_manager() {
    let e = env();
    e.cluster.pod(&web(Some("uid-1"))).unwrap();
    e.cluster.nad("team-a", "net-a").unwrap();
    e.cluster.write_status(&web(Some("uid-1")), "[]").unwrap();
    e.cluster
        .record(&PodEvent::attached(&web(None), None, "Add net1"))
        .unwrap();
    let reqs = e.server.requests();
    assert_eq!(reqs.len(), 4, "{reqs:?}");
    let agent = format!("plexus/{}", env!("CARGO_PKG_VERSION"));
    for r in &reqs {
        assert_eq!(
            r.headers.get("user-agent"),
            Some(&agent),
            "{} {}",
            r.method,
            r.path
        );
        if r.method != "GET" {
            assert_eq!(
                query_params(r),
                ["fieldManager=plexus"],
                "{} {}",
                r.method,
                r.path
            );
        }
    }
}

#[test]
fn injected_not_found_is_final() {
    let e = env();
    e.server.inject("GET", POD_PATH, Fault::Status(404), 1);
    let err = e.cluster.pod(&web(None)).unwrap_err();
    assert_eq!(err.to_string(), "pod team-a/web not found");
    assert_eq!(count(&e.server, "GET", POD_PATH), 1);
    assert!(
        e.cluster.pod(&web(None)).is_ok(),
        "the fault was for one request only"
    );
}

#[test]
fn status_patch_is_retried_on_conflict() {
    let e = env();
    e.server.conflict_next_patches(2);
    e.cluster.write_status(&web(None), "[]").unwrap();
    assert_eq!(count(&e.server, "PATCH", STATUS_PATH), 3);
    assert_eq!(
        e.server.pod("team-a", "web").unwrap()["metadata"]["annotations"]
            ["k8s.v1.cni.cncf.io/network-status"],
        "[]"
    );
}

#[test]
fn endless_conflicts_give_up() {
    let e = env(); // conflict_retries: 3
    e.server.conflict_next_patches(100);
    let err = e.cluster.write_status(&web(None), "[]").unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert_eq!(err.to_string(), "cluster source unavailable: patch pods/status team-a/web: still conflicting after 4 attempts");
    assert_eq!(count(&e.server, "PATCH", STATUS_PATH), 4);
}

#[test]
fn vanished_pod_is_not_an_error_on_write() {
    let e = env();
    e.server.remove_pod("team-a", "web");
    e.cluster.write_status(&web(Some("uid-1")), "[]").unwrap();
    assert_eq!(
        count(&e.server, "PATCH", STATUS_PATH),
        1,
        "a 404 is final, not retried"
    );
}

#[test]
fn transient_statuses_are_retried_then_succeed() {
    for code in [429, 500, 503] {
        let e = env();
        e.server.inject("GET", POD_PATH, Fault::Status(code), 2);
        let pod = e
            .cluster
            .pod(&web(None))
            .unwrap_or_else(|err| panic!("{code}: {err}"));
        assert_eq!(pod.name, "web");
        assert_eq!(
            count(&e.server, "GET", POD_PATH),
            3,
            "{code}: two failures, then success"
        );
    }
}

#[test]
fn transient_statuses_exhaust_retries() {
    let e = env(); // retries: 3
    e.server
        .inject("GET", NAD_PATH, Fault::Status(503), usize::MAX);
    let err = e.cluster.nad("team-a", "net-a").unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.starts_with("cluster source unavailable: get network-attachment-definitions team-a/net-a: API server answered 503"),
        "{msg}"
    );
    assert!(msg.contains("gave up after 4 attempts"), "{msg}");
    assert_eq!(count(&e.server, "GET", NAD_PATH), 4);
}

#[test]
fn status_write_retries_server_errors() {
    let e = env();
    e.server.inject("PATCH", STATUS_PATH, Fault::Status(500), 1);
    e.cluster.write_status(&web(None), "[]").unwrap();
    assert_eq!(count(&e.server, "PATCH", STATUS_PATH), 2);
}

#[test]
fn forbidden_names_the_missing_permission() {
    let e = env();
    e.server
        .inject("GET", NAD_PATH, Fault::Status(403), usize::MAX);
    let err = e.cluster.nad("team-a", "net-a").unwrap_err();
    assert!(matches!(err, ClusterError::Forbidden { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.starts_with(
            r#"forbidden: missing permission to get network-attachment-definitions (API group "k8s.cni.cncf.io") in namespace "team-a" on the server 127.0.0.1:"#
        ),
        "{msg}"
    );
    assert_eq!(
        count(&e.server, "GET", NAD_PATH),
        1,
        "403 is final, not retried"
    );

    e.server
        .inject("PATCH", STATUS_PATH, Fault::Status(403), usize::MAX);
    let err = e.cluster.write_status(&web(None), "[]").unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with(
            r#"forbidden: missing permission to patch pods/status (API group core) in namespace "team-a" on the server 127.0.0.1:"#
        ),
        "{msg}"
    );
}

#[test]
fn a_hanging_server_is_bounded_by_the_timeouts() {
    let e = env_with(|s| {
        s.request_timeout_ms = 200;
        s.deadline_ms = 700;
        // Without the deadline, 50 retries of 200 ms each would take over 10 s.
        s.retries = 50;
    });
    e.server.inject("GET", POD_PATH, Fault::Hang, usize::MAX);
    let started = Instant::now();
    let err = e.cluster.pod(&web(None)).unwrap_err();
    let took = started.elapsed();
    assert!(err.is_transient(), "{err:?}");
    assert!(
        err.to_string()
            .contains("no answer from the server 127.0.0.1:"),
        "{err}"
    );
    assert!(
        took >= Duration::from_millis(600),
        "gave up early: {took:?}"
    );
    assert!(
        took < Duration::from_millis(3000),
        "deadline of 700 ms overrun: {took:?}"
    );
    let attempts = count(&e.server, "GET", POD_PATH);
    assert!(
        (2..=4).contains(&attempts),
        "{attempts} attempts in a 700 ms deadline with 200 ms timeouts"
    );
}

#[test]
fn one_hang_then_success() {
    let e = env_with(|s| s.request_timeout_ms = 200);
    e.server.inject("GET", NAD_PATH, Fault::Hang, 1);
    assert!(e.cluster.nad("team-a", "net-a").is_ok());
    assert_eq!(count(&e.server, "GET", NAD_PATH), 2);
}

#[test]
fn latency_below_the_timeout_is_tolerated() {
    let e = env_with(|s| s.request_timeout_ms = 1000);
    e.server.inject(
        "GET",
        POD_PATH,
        Fault::Latency(Duration::from_millis(150)),
        1,
    );
    assert!(e.cluster.pod(&web(None)).is_ok());
    assert_eq!(
        count(&e.server, "GET", POD_PATH),
        1,
        "slow but in time: no retry"
    );
}

#[test]
fn connection_resets_are_retried() {
    let e = env();
    e.server.inject("GET", POD_PATH, Fault::Reset, 2);
    assert!(e.cluster.pod(&web(None)).is_ok());
    assert_eq!(count(&e.server, "GET", POD_PATH), 3);

    e.server.inject("GET", POD_PATH, Fault::Reset, usize::MAX);
    let err = e.cluster.pod(&web(None)).unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    // The message names the server the connection was to.
    assert!(
        err.to_string().contains(&format!(
            "the server {}",
            e.server.url().trim_start_matches("http://")
        )),
        "{err}"
    );
}

#[test]
fn refused_connection_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let server = ApiServer::start();
    server.write_kubeconfig(&kubeconfig);
    let addr = server.url().trim_start_matches("http://").to_string();
    drop(server);
    std::thread::sleep(Duration::from_millis(50));
    let cluster = KubeCluster::new(KubeSettings {
        kubeconfig: Some(kubeconfig),
        retries: 1,
        ..settings()
    })
    .unwrap();
    let err = cluster.pod(&web(None)).unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert!(
        err.to_string().contains("gave up after 2 attempts"),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains(&format!("the connection to the server {addr} was refused")),
        "{err}"
    );
}

#[test]
fn attachments_are_recorded_as_events() {
    let e = env();
    e.cluster
        .record(&PodEvent::attached(
            &web(Some("uid-1")),
            Some("node-1"),
            "Add net1 [10.1.0.5/24] from team-a/net-a",
        ))
        .unwrap();
    let posts: Vec<_> = e
        .server
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0].path, EVENTS_PATH);
    let event = posts[0].json();
    assert_eq!(event["reason"], "AddedInterface");
    assert_eq!(event["type"], "Normal");
    assert_eq!(event["message"], "Add net1 [10.1.0.5/24] from team-a/net-a");
    assert_eq!(
        event["involvedObject"],
        json!({"apiVersion": "v1", "kind": "Pod", "name": "web", "namespace": "team-a", "uid": "uid-1"})
    );
    assert_eq!(event["metadata"]["generateName"], "web.");
    assert_eq!(event["reportingInstance"], "node-1");
    assert_eq!(e.server.events().len(), 1);
}

#[test]
fn event_failures_are_only_logged() {
    let e = env();
    e.server
        .inject("POST", EVENTS_PATH, Fault::Status(403), usize::MAX);
    e.cluster
        .record(&PodEvent::attached(&web(None), None, "Add net1"))
        .unwrap();
    assert_eq!(count(&e.server, "POST", EVENTS_PATH), 1);
    assert!(e.server.events().is_empty());
}

#[test]
fn events_can_be_switched_off() {
    let e = env_with(|s| s.events = false);
    e.cluster
        .record(&PodEvent::attached(&web(None), None, "Add net1"))
        .unwrap();
    assert!(e.server.requests().is_empty());
}

#[test]
fn construction_reads_nothing() {
    let server = ApiServer::start();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    // The kubeconfig does not exist yet: new() must not read it.
    let cluster = KubeCluster::new(KubeSettings {
        kubeconfig: Some(kubeconfig.clone()),
        ..settings()
    })
    .unwrap();
    server.write_kubeconfig(&kubeconfig);
    server.add_pod(json!({"metadata": {"name": "web", "namespace": "team-a"}}));
    assert!(server.requests().is_empty());
    assert_eq!(cluster.pod(&web(None)).unwrap().name, "web");
}

#[test]
fn without_kubeconfig_outside_a_cluster_says_so() {
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        return; // running inside a pod: in-cluster configuration is legitimately available
    }
    let err = KubeCluster::new(KubeSettings::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid kube cluster settings: no kubeconfig given and not running in a cluster (KUBERNETES_SERVICE_HOST is not set)"
    );
}

// The emulator's own API behaviour, spoken to over raw HTTP.

fn raw(
    server: &ApiServer,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> (u16, Value) {
    let addr = server.url().trim_start_matches("http://").to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out[9..12].parse().unwrap();
    let body = out.split_once("\r\n\r\n").unwrap().1;
    (code, serde_json::from_str(body).unwrap())
}

#[test]
fn emulator_refuses_stale_resource_versions() {
    let e = env();
    let rv = e.server.pod("team-a", "web").unwrap()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let patch =
        |rv: &str| format!(r#"{{"metadata":{{"resourceVersion":"{rv}","labels":{{"x":"1"}}}}}}"#);
    let (code, body) = raw(
        &e.server,
        "PATCH",
        POD_PATH,
        "application/merge-patch+json",
        &patch("1"),
    );
    assert_eq!(code, 409);
    assert_eq!(
        (
            body["kind"].as_str(),
            body["reason"].as_str(),
            body["code"].as_u64()
        ),
        (Some("Status"), Some("Conflict"), Some(409))
    );
    let (code, body) = raw(
        &e.server,
        "PATCH",
        POD_PATH,
        "application/merge-patch+json",
        &patch(&rv),
    );
    assert_eq!(code, 200);
    assert_eq!(body["metadata"]["labels"], json!({"app": "web", "x": "1"}));
    assert_ne!(
        body["metadata"]["resourceVersion"].as_str(),
        Some(rv.as_str()),
        "a patch bumps resourceVersion"
    );
}

#[test]
fn emulator_lists_nads() {
    let e = env();
    e.server
        .add_nad(json!({"metadata": {"name": "other", "namespace": "team-b"}}));
    let (code, list) = raw(
        &e.server,
        "GET",
        "/apis/k8s.cni.cncf.io/v1/namespaces/team-a/network-attachment-definitions",
        "",
        "",
    );
    assert_eq!(code, 200);
    assert_eq!(list["kind"], "NetworkAttachmentDefinitionList");
    let names: Vec<_> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].clone())
        .collect();
    assert_eq!(names, vec![json!("net-a")]);
    let (_, all) = raw(
        &e.server,
        "GET",
        "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions",
        "",
        "",
    );
    assert_eq!(all["items"].as_array().unwrap().len(), 2);
    let (code, body) = raw(
        &e.server,
        "GET",
        "/apis/k8s.cni.cncf.io/v1/namespaces/team-a/network-attachment-definitions/nope",
        "",
        "",
    );
    assert_eq!((code, body["reason"].as_str()), (404, Some("NotFound")));
}

// The real `plexus` binary (built by tests/run.sh) with `"cluster": {"source": "kube"}` against the
// emulator: what an ADD reads from and writes to the API server.

mod binary {
    use plexus_tests::apiserver::{ApiServer, Fault};
    use plexus_tests::plexus::Sandbox;
    use serde_json::{json, Value};

    use super::{NAD_PATH, POD_PATH, STATUS_PATH};

    fn sandbox(server: &ApiServer) -> (Sandbox, Value) {
        let sb = Sandbox::new();
        sb.cluster_net("1.0.0");
        sb.fakes(&["secondary-plugin"]);
        let kubeconfig = sb.path("kubeconfig");
        server.write_kubeconfig(&kubeconfig);
        server.add_pod(json!({"metadata": {
            "name": "web", "namespace": "team-a", "uid": "uid-web",
            "annotations": {"k8s.v1.cni.cncf.io/networks": "net-a"}
        }}));
        server.add_nad(json!({
            "metadata": {"name": "net-a", "namespace": "team-a"},
            "spec": {"config": "{\"cniVersion\":\"1.0.0\",\"type\":\"secondary-plugin\"}"}
        }));
        let conf = sb.conf(json!({"cluster": {
            "source": "kube", "kubeconfig": kubeconfig,
            "requestTimeoutMs": 1000, "deadlineMs": 3000, "retries": 2,
            "initialBackoffMs": 10, "maxBackoffMs": 20
        }}));
        (sb, conf)
    }

    /// A pod's claim made from a template is named in `status.resourceClaimStatuses` (a generated name): that claim
    /// is the pod's and is read by name, whatever `reservedFor` says of others, and the node's slices are listed
    /// with the `spec.nodeName` selector (another node lists a device of the same name).
    #[test]
    fn a_pods_claims_come_from_its_resource_claim_statuses() {
        let server = ApiServer::start();
        let (sb, conf) = sandbox(&server);
        server.add_pod(json!({
            "metadata": {"name": "dra", "namespace": "team-a", "uid": "uid-dra",
                "annotations": {"k8s.v1.cni.cncf.io/networks": "sriov-net"}},
            "spec": {"nodeName": "node1",
                     "resourceClaims": [{"name": "nic", "resourceClaimTemplateName": "one-vf"}]},
            "status": {"resourceClaimStatuses": [{"name": "nic", "resourceClaimName": "dra-nic-x7k2p"}]}
        }));
        server.add_nad(json!({
            "metadata": {"name": "sriov-net", "namespace": "team-a",
                "annotations": {"k8s.v1.cni.cncf.io/resourceName": "example.com/sriov"}},
            "spec": {"config": "{\"cniVersion\":\"1.0.0\",\"type\":\"secondary-plugin\"}"}
        }));
        let claim = |name: &str, device: &str, reserved: &[&str]| {
            let reserved: Vec<Value> = reserved
                .iter()
                .map(|uid| json!({"resource": "pods", "name": "dra", "uid": uid}))
                .collect();
            json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "team-a"},
                "spec": {},
                "status": {
                    "allocation": {"devices": {"results": [
                        {"request": "nic", "driver": "sriov.example.com", "pool": "pool-a", "device": device}
                    ]}},
                    "reservedFor": reserved
                }
            })
        };
        // Named by the pod's status (its reservedFor is not read when the pod names its claims).
        server.add_claim(claim("dra-nic-x7k2p", "vf1", &[]));
        // Reserved for the pod but not named by it: not the pod's claim on this path.
        server.add_claim(claim("stale", "vf0", &["uid-dra"]));
        for (node, id) in [("node2", "0000:99:00.2"), ("node1", "0000:01:00.2")] {
            server.add_slice(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": format!("{node}-slice")},
                "spec": {"driver": "sriov.example.com", "nodeName": node,
                    "pool": {"name": "pool-a", "generation": 1, "resourceSliceCount": 1},
                    "devices": [
                        {"name": "vf0", "attributes": {
                            "k8s.cni.cncf.io/deviceID": {"string": "0000:01:00.1"},
                            "k8s.cni.cncf.io/resourceName": {"string": "example.com/sriov"}}},
                        {"name": "vf1", "attributes": {
                            "k8s.cni.cncf.io/deviceID": {"string": id},
                            "k8s.cni.cncf.io/resourceName": {"string": "example.com/sriov"}}}
                    ]}
            }));
        }
        sb.run("ADD", "c-dra", &Sandbox::pod_args("team-a", "dra"), &conf)
            .ok();
        let call = sb
            .calls()
            .into_iter()
            .find(|c| c.plugin == "secondary-plugin" && c.command == "ADD")
            .expect("the NAD's delegate ran");
        assert_eq!(call.stdin["deviceID"], "0000:01:00.2", "{}", call.stdin);
        let claim_reads: Vec<String> = server
            .requests()
            .into_iter()
            .filter(|r| r.path.contains("/resourceclaims"))
            .map(|r| r.path)
            .collect();
        assert!(
            !claim_reads.is_empty()
                && claim_reads.iter().all(|p| p
                    .starts_with("/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/dra-nic-x7k2p")),
            "the pod's claim read by name (and its status written), no list and no other claim: {claim_reads:?}"
        );
        let slices = server
            .requests()
            .into_iter()
            .find(|r| r.path == "/apis/resource.k8s.io/v1/resourceslices")
            .expect("the node's slices were listed");
        let query = slices.query.unwrap_or_default();
        assert!(
            query.contains("fieldSelector=spec.nodeName%3Dnode1"),
            "{query}"
        );
    }

    #[test]
    fn add_reads_pod_and_nad_then_patches_status_and_posts_an_event() {
        let server = ApiServer::start();
        let (sb, conf) = sandbox(&server);
        sb.run("ADD", "c1", &Sandbox::pod_args("team-a", "web"), &conf)
            .ok();

        let sent: Vec<(String, String)> = server
            .requests()
            .iter()
            .map(|r| (r.method.clone(), r.path.clone()))
            .collect();
        let expected = [
            // A pod without claims: no claim is read.
            ("GET", POD_PATH),
            ("GET", NAD_PATH),
            ("PATCH", STATUS_PATH),
            ("POST", "/api/v1/namespaces/team-a/events"),
        ];
        assert_eq!(
            sent,
            expected.map(|(m, p)| (m.to_string(), p.to_string())),
            "{sent:?}"
        );

        let pod = server.pod("team-a", "web").unwrap();
        let status: Value = serde_json::from_str(
            pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        let names: Vec<_> = status
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["name"].clone(), e["interface"].clone()))
            .collect();
        assert_eq!(
            names,
            vec![
                (json!("cluster-net"), json!("eth0")),
                (json!("team-a/net-a"), json!("net1"))
            ]
        );
        let events = server.events();
        assert_eq!(events.len(), 1, "one event per secondary attachment");
        assert_eq!(events[0]["reason"], "AddedInterface");
        assert!(
            events[0]["message"]
                .as_str()
                .unwrap()
                .starts_with("Add net1 ["),
            "{}",
            events[0]["message"]
        );
    }

    #[test]
    fn add_fails_naming_the_missing_permission() {
        let server = ApiServer::start();
        let (sb, conf) = sandbox(&server);
        server.inject("GET", NAD_PATH, Fault::Status(403), usize::MAX);
        let run = sb.run("ADD", "c1", &Sandbox::pod_args("team-a", "web"), &conf);
        assert!(
            run.msg().contains(
                r#"missing permission to get network-attachment-definitions (API group "k8s.cni.cncf.io") in namespace "team-a""#
            ),
            "{}",
            run.stdout
        );
        assert!(!server.requests().iter().any(|r| r.method == "PATCH"));
    }

    #[test]
    fn add_with_the_api_server_down_asks_to_try_again_later() {
        let server = ApiServer::start();
        let (sb, conf) = sandbox(&server);
        drop(server);
        let run = sb.run("ADD", "c1", &Sandbox::pod_args("team-a", "web"), &conf);
        assert_eq!(run.code(), 11, "{}", run.stdout);
    }

    #[test]
    fn del_runs_from_the_cache_without_the_api() {
        let server = ApiServer::start();
        let (sb, conf) = sandbox(&server);
        let args = Sandbox::pod_args("team-a", "web");
        sb.run("ADD", "c1", &args, &conf).ok();
        server.clear_requests();
        sb.clear_calls();
        sb.run("DEL", "c1", &args, &conf).ok();
        assert!(
            server.requests().is_empty(),
            "DEL with a cache asks the API nothing: {:?}",
            server.requests()
        );
        let dels: Vec<_> = sb
            .calls()
            .into_iter()
            .map(|c| (c.plugin, c.command))
            .collect();
        assert_eq!(
            dels,
            vec![
                ("secondary-plugin".to_string(), "DEL".to_string()),
                ("cluster-plugin".to_string(), "DEL".to_string())
            ]
        );
        // With the API server gone, a cached DEL still works (ADD again, then kill the server).
        sb.run("ADD", "c2", &args, &conf).ok();
        drop(server);
        sb.run("DEL", "c2", &args, &conf).ok();
        assert!(sb.cached().is_empty());
    }

    #[test]
    fn del_without_cache_and_without_api_succeeds() {
        let server = ApiServer::start();
        let (sb, conf) = sandbox(&server);
        drop(server);
        let run = sb.run(
            "DEL",
            "never-added",
            &Sandbox::pod_args("team-a", "web"),
            &conf,
        );
        run.ok();
        // The cluster network resolves from disk, so it is still torn down (its IPAM may hold an address).
        let dels: Vec<_> = sb
            .calls()
            .into_iter()
            .map(|c| (c.plugin, c.command))
            .collect();
        assert_eq!(
            dels,
            vec![("cluster-plugin".to_string(), "DEL".to_string())]
        );
    }

    #[test]
    fn uid_mismatch_fails_add_before_any_delegate() {
        let server = ApiServer::start();
        let (sb, conf) = sandbox(&server);
        let args =
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=web;K8S_POD_UID=other-uid";
        let run = sb.run("ADD", "c1", args, &conf);
        assert_eq!(run.code(), 11, "{}", run.stdout);
        assert!(run.msg().contains("other-uid"), "{}", run.msg());
        assert!(sb.calls().is_empty());
        assert!(sb.cached().is_empty());
    }

    #[test]
    fn a_failing_status_write_does_not_fail_an_attached_pod() {
        let server = ApiServer::start();
        let (sb, conf) = sandbox(&server);
        server.inject("PATCH", STATUS_PATH, Fault::Status(500), usize::MAX);
        let run = sb.run("ADD", "c1", &Sandbox::pod_args("team-a", "web"), &conf);
        run.ok();
        assert!(
            run.stderr.contains("cannot publish network-status"),
            "{}",
            run.stderr
        );
        assert!(
            server
                .requests()
                .iter()
                .filter(|r| r.method == "PATCH")
                .count()
                > 1,
            "retried"
        );
    }
}
