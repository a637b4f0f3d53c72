//! `plexus migrate check` against a real API server: which objects of a cluster written for Multus fail under the
//! standard, which under `"compat": "multus"`. The compat behaviours themselves are in `pure/compat.rs`.

use plexus_tests::kubeapi::KubeApiServer;
use serde_json::{json, Value};

/// `plexus migrate check` against a real API server with NADs and pods of each kind: every difference named
/// per object in both modes, the totals, and the exit status of the mode asked about.
#[test]
fn migrate_check_names_what_would_differ_for_each_object() {
    // No controller manager makes namespaces' default service accounts here (the pods are never run).
    let api = KubeApiServer::start(&[], &["--disable-admission-plugins=ServiceAccount"]);
    api.apply_file(&plexus_tests::deploy_manifest("crds.yaml"));
    api.namespace("team");
    api.nad("team", "old", &json!({"type": "bridge", "name": "old"}));
    api.nad(
        "team",
        "plain",
        &json!({"cniVersion": "1.0.0", "type": "bridge"}),
    );
    api.nad(
        "team",
        "static",
        &json!({"cniVersion": "1.0.0", "plugins": [{"type": "macvlan", "capabilities": {"ips": true}}]}),
    );
    let pod = |ns: &str, name: &str, annotations: Value| {
        api.create(&json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "annotations": annotations},
            "spec": {"containers": [{"name": "c", "image": "pause"}]}}));
    };
    let networks = "k8s.v1.cni.cncf.io/networks";
    pod("team", "a", json!({networks: "old"}));
    pod(
        "team",
        "b",
        json!({networks: r#"[{"name": "plain", "ips": ["10.1.1.1/24"]}]"#}),
    );
    pod(
        "team",
        "c",
        json!({networks: r#"[{"name": "static", "ipRequest": ["10.1.1.2/24"]}]"#}),
    );
    pod(
        "team",
        "d",
        json!({"v1.multus-cni.io/default-network": "kube-system/alt"}),
    );
    pod("kube-system", "e", json!({}));
    pod("team", "f", json!({networks: "static"}));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("admin.kubeconfig");
    api.write_kubeconfig(&kubeconfig, "admin-token");
    let multus_conf = dir.path().join("00-multus.conf");
    std::fs::write(
        &multus_conf,
        json!({"cniVersion": "0.3.1", "type": "multus", "clusterNetwork": "k8s-pod-network",
               "defaultNetworks": ["sidecar"]})
        .to_string(),
    )
    .unwrap();
    let check = |extra: &[&str]| {
        std::process::Command::new(plexus_tests::plexus::plexus_bin())
            .args(["migrate", "check", "--kubeconfig"])
            .arg(&kubeconfig)
            .arg("--multus-conf")
            .arg(&multus_conf)
            .args(extra)
            .output()
            .unwrap()
    };

    let out = check(&["--json"]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["pods"], 6, "{report:#}");
    assert_eq!(report["nads"], 3, "{report:#}");
    let of = |object: &str| -> Vec<Value> {
        report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["object"] == object)
            .cloned()
            .collect()
    };
    let one = |object: &str| {
        let found = of(object);
        assert_eq!(found.len(), 1, "{object}: {report:#}");
        found[0].clone()
    };
    let fails = |f: &Value| {
        (
            f["strictFails"].as_bool().unwrap(),
            f["multusFails"].as_bool().unwrap(),
        )
    };
    assert!(one("nad team/old")["issue"]
        .as_str()
        .unwrap()
        .contains("no cniVersion"));
    let a = one("pod team/a");
    assert_eq!(fails(&a), (true, false), "{a}");
    let b = one("pod team/b");
    assert_eq!(fails(&b), (true, true), "{b}");
    assert!(
        b["issue"]
            .as_str()
            .unwrap()
            .contains("requests ips on team/plain"),
        "{b}"
    );
    let c = one("pod team/c");
    assert_eq!(fails(&c), (true, false), "{c}");
    assert!(c["issue"].as_str().unwrap().contains("ipRequest"), "{c}");
    let d = one("pod team/d");
    assert_eq!(fails(&d), (false, false), "{d}");
    assert!(d["strict"].as_str().unwrap().contains("ignored"), "{d}");
    let e = one("pod kube-system/e");
    assert!(e["issue"].as_str().unwrap().contains("sidecar"), "{e}");
    assert!(of("pod team/f").is_empty(), "{report:#}");
    assert_eq!(report["podsFailingStrict"], 3);
    assert_eq!(report["podsFailingMultus"], 1);

    // The text names each object; the exit status follows the mode asked about.
    let out = check(&[]);
    let text = String::from_utf8_lossy(&out.stdout);
    for object in [
        "pod team/a",
        "pod team/b",
        "pod team/c",
        "pod team/d",
        "nad team/old",
    ] {
        assert!(text.contains(object), "{object}: {text}");
    }
    assert!(text.contains("3 strict, 1 with"), "{text}");
    let (code, body) = api
        .request("DELETE", "/api/v1/namespaces/team/pods/b", None)
        .unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(check(&[]).status.code(), Some(0));
    assert_eq!(check(&["--compat", "strict"]).status.code(), Some(3));

    // An API server that is not there is an error (1), named.
    std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://127.0.0.1:1\"}\nusers:\n- name: u\n  user: {token: x}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n").unwrap();
    let out = check(&[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("plexus migrate check"));
}
