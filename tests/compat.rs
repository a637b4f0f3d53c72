//! `"compat": "multus"`: the inputs written for Multus that the standard leaves open, or that Plexus refuses,
//! behave as under Multus (its documented behaviour: a NAD config without `cniVersion` runs, the pod's
//! `v1.multus-cni.io/default-network` replaces the cluster network, `systemNamespaces` get no default networks, a
//! directory as `clusterNetwork` means its first conf file, unknown keys of a selection element are ignored).
//! Each is checked both ways: the strict answer without the key, the Multus one with it. Where the standard
//! decides, its answer holds in both modes. The real binary with recording delegates, as in the conformance
//! tests.

use plexus_tests::plexus::{Call, Run, Sandbox};
use serde_json::{json, Value};

const NS: &str = "default";

fn sandbox(plugins: &[&str]) -> Sandbox {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    sb.fakes(plugins);
    sb
}

fn multus() -> Value {
    json!({"compat": "multus"})
}

/// ADD of pod `<ns>/<pod>` (a new container each time) with the base conf plus `extra`.
fn add(sb: &Sandbox, ns: &str, pod: &str, extra: Value) -> Run {
    static CONTAINERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CONTAINERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    sb.run(
        "ADD",
        &format!("c-{pod}-{n}"),
        &Sandbox::pod_args(ns, pod),
        &sb.conf(extra),
    )
}

/// The plugins ADD ran, with the interface each got.
fn added(sb: &Sandbox) -> Vec<(String, String)> {
    sb.calls()
        .into_iter()
        .filter(|c| c.command == "ADD")
        .map(|c| {
            (
                c.plugin,
                c.env.get("CNI_IFNAME").cloned().unwrap_or_default(),
            )
        })
        .collect()
}

fn call_of(sb: &Sandbox, plugin: &str) -> Call {
    sb.calls()
        .into_iter()
        .find(|c| c.plugin == plugin)
        .unwrap_or_else(|| panic!("no call of {plugin}: {:?}", sb.call_summary()))
}

/// NAD `ns/name` whose list is the one fake `plugin`.
fn one_plugin_nad(sb: &Sandbox, ns: &str, name: &str, plugin: &str) {
    sb.nad(
        ns,
        name,
        Some(json!({"cniVersion": "1.0.0", "plugins": [{"type": plugin}]})),
    );
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn a_nad_config_without_cni_version_runs_as_0_1_0_under_multus_and_is_refused_otherwise() {
    let sb = sandbox(&["old-plugin"]);
    sb.nad(
        NS,
        "old",
        Some(json!({"type": "old-plugin", "name": "old"})),
    );
    sb.pod(NS, "web", Some("old"));

    let strict = add(&sb, NS, "web", json!({}));
    assert!(!strict.success, "{}", strict.stdout);
    assert!(strict.stdout.contains("cniVersion"), "{}", strict.stdout);
    assert!(sb.calls().is_empty(), "{:?}", sb.call_summary());

    let run = add(&sb, NS, "web", multus());
    assert!(run.success, "{}\n{}", run.stdout, run.stderr);
    // The delegate gets the version a plugin reads a config without one as, and its legacy result is taken.
    assert_eq!(call_of(&sb, "old-plugin").stdin["cniVersion"], "0.1.0");
    let status = sb.status(NS, "web").unwrap();
    assert_eq!(status[1]["name"], "default/old", "{status}");
    assert_eq!(status[1]["interface"], "net1", "{status}");
}

#[test]
fn the_pods_default_network_annotation_replaces_the_cluster_network_under_multus_only() {
    let sb = sandbox(&["alt-plugin", "a-plugin"]);
    // A bare name is read in plexusNamespace (kube-system), as Multus reads it in its own namespace.
    one_plugin_nad(&sb, "kube-system", "alt-net", "alt-plugin");
    one_plugin_nad(&sb, NS, "net-a", "a-plugin");
    let pod = |name: &str, default: &str| {
        let doc = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": NS, "uid": format!("uid-{name}"),
            "annotations": {"k8s.v1.cni.cncf.io/networks": "net-a",
                            "v1.multus-cni.io/default-network": default}}});
        sb.manifest(&format!("pod-{NS}-{name}.json"), &doc.to_string());
    };
    pod("web", "alt-net");

    let strict = add(&sb, NS, "web", json!({}));
    assert!(strict.success, "{}", strict.stderr);
    assert_eq!(
        added(&sb),
        pairs(&[("cluster-plugin", "eth0"), ("a-plugin", "net1")])
    );
    sb.clear_calls();

    let run = add(&sb, "default", "web", multus());
    assert!(run.success, "{}", run.stderr);
    assert_eq!(
        added(&sb),
        pairs(&[("alt-plugin", "eth0"), ("a-plugin", "net1")])
    );
    let status = sb.status(NS, "web").unwrap();
    assert_eq!(status[0]["name"], "kube-system/alt-net", "{status}");
    assert_eq!(status[0]["default"], true, "{status}");
    sb.clear_calls();

    // Multus takes exactly one; a missing one fails the ADD naming it, and nothing runs.
    pod("two", "alt-net,other");
    let run = add(&sb, NS, "two", multus());
    assert!(!run.success);
    assert!(
        run.stdout.contains("v1.multus-cni.io/default-network")
            && run.stdout.contains("takes exactly one"),
        "{}",
        run.stdout
    );
    pod("gone", "default/nope");
    let run = add(&sb, NS, "gone", multus());
    assert!(!run.success);
    assert!(run.stdout.contains("nope"), "{}", run.stdout);
    assert!(sb.calls().is_empty(), "{:?}", sb.call_summary());

    // The pod chooses its cluster network here: the policy hooks judge that choice like any selection. A
    // namespace-isolation policy refuses kube-system's network to a pod of another namespace, and admits one of
    // the pod's own.
    let mut isolated = multus();
    isolated["hooks"] = json!([{"name": "isolation", "kind": "policy",
        "module": plexus_tests::plexus::guest_wasm("namespace-isolation"),
        "settings": {"globalNamespaces": []}}]);
    one_plugin_nad(&sb, NS, "own-net", "alt-plugin");
    let run = add(&sb, NS, "web", isolated.clone());
    assert!(!run.success);
    assert!(
        run.stdout
            .contains("v1.multus-cni.io/default-network rejected by policy hook")
            && run.stdout.contains("kube-system/alt-net"),
        "{}",
        run.stdout
    );
    assert!(sb.calls().is_empty(), "{:?}", sb.call_summary());
    pod("own", &format!("{NS}/own-net"));
    let run = add(&sb, NS, "own", isolated);
    assert!(run.success, "{}", run.stdout);
    assert_eq!(
        added(&sb),
        pairs(&[("alt-plugin", "eth0"), ("a-plugin", "net1")])
    );
}

#[test]
fn system_namespaces_get_no_default_networks_under_multus() {
    let sb = sandbox(&["extra-plugin"]);
    one_plugin_nad(&sb, "kube-system", "extra", "extra-plugin");
    sb.pod("kube-system", "dns", None);
    sb.pod("team", "web", None);
    let with = |extra: Value| {
        let mut conf = json!({"defaultNetworks": ["extra"]});
        for (k, v) in extra.as_object().unwrap() {
            conf[k] = v.clone();
        }
        conf
    };

    // Strict: every pod gets the default networks (the standard has no system namespaces).
    assert!(add(&sb, "kube-system", "dns", with(json!({}))).success);
    assert_eq!(
        added(&sb),
        pairs(&[("cluster-plugin", "eth0"), ("extra-plugin", "net1")])
    );
    sb.clear_calls();

    // Multus: kube-system by default.
    assert!(add(&sb, "kube-system", "dns", with(multus())).success);
    assert_eq!(added(&sb), pairs(&[("cluster-plugin", "eth0")]));
    sb.clear_calls();
    assert!(add(&sb, "team", "web", with(multus())).success);
    assert_eq!(
        added(&sb),
        pairs(&[("cluster-plugin", "eth0"), ("extra-plugin", "net1")])
    );
    sb.clear_calls();
    // A list of its own.
    let own = with(json!({"compat": "multus", "systemNamespaces": ["team"]}));
    assert!(add(&sb, "team", "web", own.clone()).success);
    assert_eq!(added(&sb), pairs(&[("cluster-plugin", "eth0")]));
    sb.clear_calls();
    assert!(add(&sb, "kube-system", "dns", own).success);
    assert_eq!(
        added(&sb),
        pairs(&[("cluster-plugin", "eth0"), ("extra-plugin", "net1")])
    );
    sb.clear_calls();

    // Without the mode the Multus key is a mistake, named.
    let run = add(&sb, "team", "web", json!({"systemNamespaces": ["team"]}));
    assert!(!run.success);
    assert!(run.stdout.contains("systemNamespaces"), "{}", run.stdout);
}

#[test]
fn a_directory_as_cluster_network_means_its_first_conf_file_under_multus() {
    let sb = sandbox(&[]);
    let dir = sb.path("net.d");
    // Plexus's own conflist sorts first and is skipped; a file of another kind is not a conf.
    sb.conf_file(
        "00-aaa-plexus.conflist",
        &json!({"cniVersion": "1.0.0", "name": "plexus", "plugins": [{"type": "plexus"}]}),
    );
    std::fs::write(dir.join("000-notes.txt"), "not a conf").unwrap();
    sb.pod(NS, "web", None);
    let conf = |compat: bool| {
        let mut c = json!({"clusterNetwork": dir});
        if compat {
            c["compat"] = json!("multus");
        }
        c
    };

    let strict = add(&sb, NS, "web", conf(false));
    assert!(!strict.success);
    assert!(sb.calls().is_empty());

    let run = add(&sb, NS, "web", conf(true));
    assert!(run.success, "{}", run.stderr);
    assert_eq!(added(&sb), pairs(&[("cluster-plugin", "eth0")]));
    assert_eq!(sb.status(NS, "web").unwrap()[0]["name"], "cluster-net");
}

#[test]
fn unknown_keys_of_a_selection_element_are_ignored_with_a_warning_under_multus() {
    let sb = sandbox(&["a-plugin"]);
    one_plugin_nad(&sb, NS, "net-a", "a-plugin");
    let networks = r#"[{"name": "net-a", "interface": "data0", "ipRequest": ["10.1.1.1/24"],
                       "org.example.vlan": 7}]"#;
    sb.pod(NS, "web", Some(networks));

    let strict = add(&sb, NS, "web", json!({}));
    assert!(!strict.success);
    assert!(strict.stdout.contains("ipRequest"), "{}", strict.stdout);
    assert!(sb.calls().is_empty());

    let run = add(&sb, NS, "web", multus());
    assert!(run.success, "{}", run.stderr);
    assert_eq!(
        added(&sb),
        pairs(&[("cluster-plugin", "eth0"), ("a-plugin", "data0")])
    );
    // Dropped and named; the spec's keys and the reverse-DNS one still count.
    let log = std::fs::read_to_string(sb.path("plexus.log")).unwrap_or_default() + &run.stderr;
    assert!(log.contains("ipRequest"), "{log}");
    assert!(call_of(&sb, "a-plugin").stdin["runtimeConfig"]["ips"].is_null());
}

/// Where the standard decides, compat mode keeps its answer: a request of `ips` on a NAD whose plugins do not
/// declare the capability fails (4.1.2.1.3.2), and a pod that cannot be found fails the ADD (6, 7.2).
#[test]
fn the_standards_answers_hold_under_multus_too() {
    let sb = sandbox(&["a-plugin"]);
    one_plugin_nad(&sb, NS, "net-a", "a-plugin");
    sb.pod(
        NS,
        "web",
        Some(r#"[{"name": "net-a", "ips": ["10.1.1.1/24"]}]"#),
    );
    let run = add(&sb, NS, "web", multus());
    assert!(!run.success);
    assert!(run.stdout.contains("ips"), "{}", run.stdout);
    assert!(sb.calls().is_empty(), "{:?}", sb.call_summary());

    let run = add(&sb, NS, "missing", multus());
    assert!(!run.success);
    assert!(run.stdout.contains("missing"), "{}", run.stdout);
    assert!(sb.calls().is_empty(), "{:?}", sb.call_summary());
}

/// `plexus migrate check` against a real API server with NADs and pods of each kind: every difference named
/// per object in both modes, the totals, and the exit status of the mode asked about.
#[test]
fn migrate_check_names_what_would_differ_for_each_object() {
    use plexus_tests::kubeapi::KubeApiServer;
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
