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
