//! Multi-net spec v1.3 conformance of the `plexus` binary (issue 3), asserted on what recording fake
//! delegates received and on what plexus printed and wrote. Tests are named after the clause they check;
//! `docs/conformance.md` maps each clause to its test.
//!
//! Every test runs the real binary in a `Sandbox`: the cluster network is `cluster-net` (from `net.d/`, one
//! fake `cluster-plugin` declaring `portMappings`), pods and NADs come from FileCluster manifests.

use std::io::Write;
use std::time::{Duration, Instant};

use plexus_tests::plexus::{Call, Run, Sandbox};
use serde_json::{json, Value};

const NS: &str = "default";

/// A sandbox with the cluster network and fakes installed under `plugins`.
fn sandbox(plugins: &[&str]) -> Sandbox {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    sb.fakes(plugins);
    sb
}

/// A one-plugin configuration list (no `name`: the NAD's is injected, spec 3.4.2).
fn list(plugin: &str) -> Value {
    json!({"cniVersion": "1.0.0", "plugins": [{"type": plugin}]})
}

/// NADs `default/<name>` whose list is one fake called `<name>-plugin`.
fn simple_nads(sb: &Sandbox, names: &[&str]) {
    for n in names {
        let plugin = format!("{n}-plugin");
        sb.fakes(&[plugin.as_str()]);
        sb.nad(NS, n, Some(list(&plugin)));
    }
}

fn container(pod: &str) -> String {
    format!("c-{pod}")
}

/// Runs `command` for pod `default/<pod>` (container `c-<pod>`) with the base conf plus `extra`.
fn run_pod(sb: &Sandbox, command: &str, pod: &str, extra: Value) -> Run {
    sb.run(
        command,
        &container(pod),
        &Sandbox::pod_args(NS, pod),
        &sb.conf(extra),
    )
}

/// Creates pod `default/<pod>` with `networks` and runs ADD for it.
fn add_pod(sb: &Sandbox, pod: &str, networks: Option<&str>, extra: Value) -> Run {
    sb.pod(NS, pod, networks);
    run_pod(sb, "ADD", pod, extra)
}

fn calls_of(sb: &Sandbox, command: &str) -> Vec<Call> {
    sb.calls()
        .into_iter()
        .filter(|c| c.command == command)
        .collect()
}

/// `(plugin, CNI_IFNAME)` of every call of `command`, in order.
fn order(sb: &Sandbox, command: &str) -> Vec<(String, String)> {
    calls_of(sb, command)
        .into_iter()
        .map(|c| {
            (
                c.plugin,
                c.env.get("CNI_IFNAME").cloned().unwrap_or_default(),
            )
        })
        .collect()
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

fn the_call<'a>(calls: &'a [Call], plugin: &str) -> &'a Call {
    calls
        .iter()
        .find(|c| c.plugin == plugin)
        .unwrap_or_else(|| {
            panic!(
                "no call of {plugin} in {:?}",
                calls.iter().map(|c| &c.plugin).collect::<Vec<_>>()
            )
        })
}

fn status_of(sb: &Sandbox, pod: &str) -> Vec<Value> {
    let v = sb
        .status(NS, pod)
        .unwrap_or_else(|| panic!("no network-status written for {NS}/{pod}"));
    v.as_array().expect("network-status is a list").clone()
}

/// Asserts a failed ADD left nothing behind: no delegate ran, no plan is cached, no status was written.
#[track_caller]
fn assert_nothing_attached(sb: &Sandbox, pod: &str) {
    assert!(
        sb.calls().is_empty(),
        "no delegate may run: {:?}",
        sb.call_summary()
    );
    assert!(
        sb.cached().is_empty(),
        "no plan may stay cached: {:?}",
        sb.cached()
    );
    assert!(sb.status(NS, pod).is_none(), "no status may be written");
}

// ---------------------------------------------------------------------------------------------------
// 4.1 Selection annotation: both formats reach the delegates
// ---------------------------------------------------------------------------------------------------

#[test]
fn s4_1_1_comma_format_reaches_delegates() {
    let sb = sandbox(&["b-plugin"]);
    simple_nads(&sb, &["net-a", "net-c"]);
    sb.nad("other", "net-b", Some(list("b-plugin")));
    add_pod(
        &sb,
        "p1",
        Some("net-a, other/net-b ,net-c@extra0"),
        json!({}),
    )
    .ok();
    assert_eq!(
        order(&sb, "ADD"),
        pairs(&[
            ("cluster-plugin", "eth0"),
            ("net-a-plugin", "net1"),
            ("b-plugin", "net2"),
            ("net-c-plugin", "extra0")
        ])
    );
    let adds = calls_of(&sb, "ADD");
    assert_eq!(adds[1].stdin["name"], "net-a");
    assert_eq!(adds[2].stdin["name"], "net-b");
    assert_eq!(adds[3].stdin["name"], "net-c");
    for c in &adds {
        assert_eq!(c.env["CNI_CONTAINERID"], "c-p1");
        assert_eq!(c.env["CNI_NETNS"], "/run/netns/fake-c-p1");
    }
    let names: Vec<_> = status_of(&sb, "p1")
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "cluster-net",
            "default/net-a",
            "other/net-b",
            "default/net-c"
        ]
    );
}

#[test]
fn s4_1_2_json_format_reaches_delegates() {
    let sb = sandbox(&["b-plugin"]);
    simple_nads(&sb, &["net-a"]);
    sb.nad("other", "net-b", Some(list("b-plugin")));
    let annotation = json!([
        {"name": "net-b", "namespace": "other", "interface": "blue0"},
        {"name": "net-a", "namespace": ""},
    ]);
    add_pod(&sb, "p1", Some(&annotation.to_string()), json!({})).ok();
    assert_eq!(
        order(&sb, "ADD"),
        pairs(&[
            ("cluster-plugin", "eth0"),
            ("b-plugin", "blue0"),
            ("net-a-plugin", "net2")
        ])
    );
    let st = status_of(&sb, "p1");
    assert_eq!(st[1]["name"], "other/net-b");
    assert_eq!(st[1]["interface"], "blue0");
    assert_eq!(
        st[2]["name"], "default/net-a",
        "an empty namespace is the pod's (4.1.2.1.2)"
    );
}

// ---------------------------------------------------------------------------------------------------
// 4.1.2.1.x runtimeConfig keys: exactly the plugins declaring the capability receive them
// ---------------------------------------------------------------------------------------------------

/// NAD `default/net-a` with plugins `yes-plugin` (declares `capability`), `no-plugin` (declares nothing)
/// and `false-plugin` (declares it `false`); the pod selects it with `key: value`. Returns the ADD calls.
fn runtime_config_for(capability: &str, key: &str, value: Value) -> (Sandbox, Vec<Call>) {
    let sb = sandbox(&["yes-plugin", "no-plugin", "false-plugin"]);
    sb.nad(
        NS,
        "net-a",
        Some(json!({"cniVersion": "1.0.0", "plugins": [
            {"type": "yes-plugin", "capabilities": {capability: true}},
            {"type": "no-plugin"},
            {"type": "false-plugin", "capabilities": {capability: false}},
        ]})),
    );
    let mut sel = json!({"name": "net-a"});
    sel[key] = value;
    add_pod(&sb, "p1", Some(&json!([sel]).to_string()), json!({})).ok();
    let adds = calls_of(&sb, "ADD");
    assert_eq!(adds.len(), 4, "{:?}", sb.call_summary());
    (sb, adds)
}

#[track_caller]
fn assert_runtime_config_only_on_yes(adds: &[Call], expected: Value) {
    assert_eq!(
        the_call(adds, "yes-plugin").stdin["runtimeConfig"],
        expected
    );
    for p in ["no-plugin", "false-plugin", "cluster-plugin"] {
        let stdin = &the_call(adds, p).stdin;
        assert!(
            stdin.get("runtimeConfig").is_none(),
            "{p} must get no runtimeConfig: {stdin}"
        );
    }
}

#[test]
fn s4_1_2_1_3_2_ips_reach_runtime_config_of_declaring_plugins_only() {
    let (_sb, adds) = runtime_config_for("ips", "ips", json!(["10.1.0.5/24", "fd00::5/64"]));
    assert_runtime_config_only_on_yes(&adds, json!({"ips": ["10.1.0.5/24", "fd00::5/64"]}));
}

#[test]
fn s4_1_2_1_4_2_mac_reaches_runtime_config_of_declaring_plugins_only() {
    let (_sb, adds) = runtime_config_for("mac", "mac", json!("c2:11:22:33:44:55"));
    assert_runtime_config_only_on_yes(&adds, json!({"mac": "c2:11:22:33:44:55"}));
}

#[test]
fn s4_1_2_1_10_2_infiniband_guid_reaches_runtime_config_as_infiniband_guid() {
    let (_sb, adds) = runtime_config_for(
        "infinibandGUID",
        "infiniband-guid",
        json!("c2:11:22:33:44:55:66:77"),
    );
    assert_runtime_config_only_on_yes(&adds, json!({"infinibandGUID": "c2:11:22:33:44:55:66:77"}));
}

#[test]
fn s4_1_2_1_7_2_port_mappings_reach_runtime_config_of_declaring_plugins_only() {
    let (_sb, adds) = runtime_config_for(
        "portMappings",
        "portMappings",
        json!([{"hostPort": 8080, "containerPort": 80, "protocol": "UDP"}, {"hostPort": 8443, "containerPort": 443}]),
    );
    // The cluster plugin declares portMappings too: the pod's selection must not reach it.
    assert_runtime_config_only_on_yes(
        &adds,
        json!({"portMappings": [
            {"hostPort": 8080, "containerPort": 80, "protocol": "udp"},
            {"hostPort": 8443, "containerPort": 443, "protocol": "tcp"},
        ]}),
    );
}

#[test]
fn s4_1_2_1_8_2_bandwidth_reaches_runtime_config_of_declaring_plugins_only() {
    let (_sb, adds) = runtime_config_for(
        "bandwidth",
        "bandwidth",
        json!({"ingressRate": 1000, "ingressBurst": 2000, "egressRate": 3000}),
    );
    assert_runtime_config_only_on_yes(
        &adds,
        json!({"bandwidth": {"ingressRate": 1000, "ingressBurst": 2000, "egressRate": 3000, "egressBurst": 2147483647u64}}),
    );
}

#[test]
fn s4_1_2_1_3_2_missing_capability_fails_the_attachment_for_every_key() {
    for (capability, key, value) in [
        ("ips", "ips", json!(["10.1.0.5/24"])),
        ("mac", "mac", json!("c2:11:22:33:44:55")),
        (
            "infinibandGUID",
            "infiniband-guid",
            json!("c2:11:22:33:44:55:66:77"),
        ),
        (
            "portMappings",
            "portMappings",
            json!([{"hostPort": 8080, "containerPort": 80}]),
        ),
        ("bandwidth", "bandwidth", json!({"ingressRate": 1000})),
    ] {
        let sb = sandbox(&["a-plugin", "b-plugin"]);
        sb.nad(NS, "net-a", Some(list("a-plugin")));
        // The other capability is declared, and by a `false`: neither counts.
        sb.nad(
            NS,
            "net-b",
            Some(json!({"cniVersion": "1.0.0", "plugins": [
                {"type": "b-plugin", "capabilities": {capability: false, "other": true}},
            ]})),
        );
        let mut sel = json!({"name": "net-b"});
        sel[key] = value;
        let run = add_pod(
            &sb,
            "p1",
            Some(&json!([{"name": "net-a"}, sel]).to_string()),
            json!({}),
        );
        assert_eq!(run.code(), 7, "{key}: {}", run.msg());
        let msg = run.msg();
        assert!(
            msg.contains(&format!("{capability:?}")),
            "{key}: error names the capability: {msg}"
        );
        assert_eq!(
            msg.matches("default/net-b").count(),
            1,
            "{key}: error names the network, once: {msg}"
        );
        assert!(
            msg.contains("default/p1"),
            "{key}: error names the pod: {msg}"
        );
        assert_nothing_attached(&sb, "p1");
    }
}

#[test]
fn s4_1_2_1_6_2_cni_args_merged_into_every_plugin_annotation_wins() {
    let sb = sandbox(&["first-plugin", "second-plugin"]);
    sb.nad(
        NS,
        "net-a",
        Some(json!({"cniVersion": "1.0.0", "args": {"cni": {"list-level": "ignored"}}, "plugins": [
            {"type": "first-plugin", "args": {"cni": {"color": "from-config", "keep": "yes"}, "other": 1}},
            {"type": "second-plugin"},
        ]})),
    );
    let sel = json!([{"name": "net-a", "cni-args": {"color": "from-annotation", "extra": [1, 2]}}]);
    add_pod(&sb, "p1", Some(&sel.to_string()), json!({})).ok();
    let adds = calls_of(&sb, "ADD");
    assert_eq!(
        the_call(&adds, "first-plugin").stdin["args"],
        json!({"cni": {"color": "from-annotation", "keep": "yes", "extra": [1, 2]}, "other": 1})
    );
    assert_eq!(
        the_call(&adds, "second-plugin").stdin["args"],
        json!({"cni": {"color": "from-annotation", "extra": [1, 2]}})
    );
    assert!(
        the_call(&adds, "cluster-plugin")
            .stdin
            .get("args")
            .is_none(),
        "cni-args are the selection's only"
    );
}

#[test]
fn s4_1_2_1_11_ipam_claim_reference_reaches_delegates_in_args_cni() {
    let sb = sandbox(&["first-plugin", "second-plugin"]);
    sb.nad(
        NS,
        "net-b",
        Some(json!({"cniVersion": "1.0.0", "plugins": [{"type": "first-plugin"}, {"type": "second-plugin"}]})),
    );
    // No capability is declared: the claim needs none (delegates may ignore it).
    let sel = json!([{"name": "net-b", "ipam-claim-reference": "vm123.tenantblue"}]);
    add_pod(&sb, "p1", Some(&sel.to_string()), json!({})).ok();
    let adds = calls_of(&sb, "ADD");
    for p in ["first-plugin", "second-plugin"] {
        let stdin = &the_call(&adds, p).stdin;
        assert_eq!(
            stdin["args"]["cni"]["ipam-claim-reference"], "vm123.tenantblue",
            "{p}: {stdin}"
        );
        assert!(stdin.get("runtimeConfig").is_none(), "{p}: {stdin}");
    }
}

#[test]
fn s4_1_2_1_period_keys_are_accepted_and_ignored() {
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a"]);
    let sel = json!([{"name": "net-a", "org.example.team/color": "blue", "com.example.weight": {"w": 5}}]);
    add_pod(&sb, "p1", Some(&sel.to_string()), json!({})).ok();
    let adds = calls_of(&sb, "ADD");
    assert_eq!(adds.len(), 2);
    for c in &adds {
        let text = c.stdin.to_string();
        assert!(
            !text.contains("org.example") && !text.contains("com.example"),
            "{}: {text}",
            c.plugin
        );
        assert!(
            !c.env["CNI_ARGS"].contains("example"),
            "{}",
            c.env["CNI_ARGS"]
        );
    }
    assert_eq!(status_of(&sb, "p1").len(), 2);
}

#[test]
fn s4_1_invalid_annotation_fails_add_naming_element_and_key() {
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a", "net-b"]);
    let sel = json!([{"name": "net-a"}, {"name": "net-b", "mac": "zz:11"}]);
    let run = add_pod(&sb, "p1", Some(&sel.to_string()), json!({}));
    assert_eq!(run.code(), 7, "{}", run.msg());
    let msg = run.msg();
    assert!(msg.contains("element 1"), "names the element: {msg}");
    assert!(msg.contains("net-b"), "names the element's network: {msg}");
    assert!(msg.contains("\"mac\""), "names the key: {msg}");
    assert!(msg.contains("default/p1"), "names the pod: {msg}");
    assert_eq!(
        msg.matches("default/p1").count(),
        1,
        "the pod is named once: {msg}"
    );
    assert_nothing_attached(&sb, "p1");
    // The comma format: an invalid interface name is named too.
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a"]);
    let run = add_pod(&sb, "p1", Some("net-a@bad/name"), json!({}));
    assert_eq!(run.code(), 7);
    assert!(
        run.msg().contains("element 0") && run.msg().contains("net-a"),
        "{}",
        run.msg()
    );
    assert_nothing_attached(&sb, "p1");
}

#[test]
fn s4_1_invalid_annotation_is_ignored_with_invalid_selections_ignore() {
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a", "net-b"]);
    let sel = json!([{"name": "net-a"}, {"name": "net-b", "mac": "zz:11"}]);
    let out = add_pod(
        &sb,
        "p1",
        Some(&sel.to_string()),
        json!({"invalidSelections": "ignore"}),
    )
    .ok()
    .json();
    assert_eq!(out["interfaces"][0]["name"], "eth0");
    // The literal reading of "invalid and ignored": the whole annotation, valid element included.
    assert_eq!(order(&sb, "ADD"), pairs(&[("cluster-plugin", "eth0")]));
    let st = status_of(&sb, "p1");
    assert_eq!(st.len(), 1);
    assert_eq!(
        (st[0]["name"].as_str(), st[0]["default"].as_bool()),
        (Some("cluster-net"), Some(true))
    );
}

// ---------------------------------------------------------------------------------------------------
// 4.2 Multiple attachments to the same network
// ---------------------------------------------------------------------------------------------------

/// `(CNI_CONTAINERID, network name in stdin, CNI_IFNAME)` of a call: the spec 4.2.1 tuple.
fn tuple(c: &Call) -> (String, String, String) {
    (
        c.env["CNI_CONTAINERID"].clone(),
        c.stdin["name"].as_str().unwrap_or_default().to_string(),
        c.env["CNI_IFNAME"].clone(),
    )
}

#[test]
fn s4_2_same_network_twice_is_two_attachments_with_stable_tuples() {
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a"]);
    add_pod(&sb, "p1", Some("net-a,net-a"), json!({})).ok();
    let adds: Vec<_> = calls_of(&sb, "ADD").iter().map(tuple).collect();
    let t = |n: &str, i: &str| ("c-p1".to_string(), n.to_string(), i.to_string());
    assert_eq!(
        adds,
        vec![
            t("cluster-net", "eth0"),
            t("net-a", "net1"),
            t("net-a", "net2")
        ]
    );
    let st = status_of(&sb, "p1");
    assert_eq!(st.len(), 3, "one status entry per attachment");
    assert_eq!(
        (st[1]["name"].as_str(), st[1]["interface"].as_str()),
        (Some("default/net-a"), Some("net1"))
    );
    assert_eq!(
        (st[2]["name"].as_str(), st[2]["interface"].as_str()),
        (Some("default/net-a"), Some("net2"))
    );
    assert_ne!(st[1]["ips"], st[2]["ips"], "two separate attachments");

    sb.clear_calls();
    run_pod(&sb, "CHECK", "p1", json!({})).ok();
    let checks: Vec<_> = calls_of(&sb, "CHECK").iter().map(tuple).collect();
    assert_eq!(checks, adds, "CHECK uses the ADD tuples, in order");

    sb.clear_calls();
    // The NAD disappears before DEL: the cached tuples are still used.
    std::fs::remove_file(sb.path("cluster/nad-default-net-a.json")).unwrap();
    run_pod(&sb, "DEL", "p1", json!({})).ok();
    let dels: Vec<_> = calls_of(&sb, "DEL").iter().map(tuple).collect();
    let mut reversed = adds.clone();
    reversed.reverse();
    assert_eq!(dels, reversed, "DEL uses the ADD tuples, in reverse");
}

// ---------------------------------------------------------------------------------------------------
// 6 / 6.2 Cluster-wide default network, defaultNetworks, plexusNamespace
// ---------------------------------------------------------------------------------------------------

#[test]
fn s6_2_cluster_network_then_default_networks_then_annotation() {
    let sb = sandbox(&["dflt-plugin", "ks-plugin"]);
    simple_nads(&sb, &["net-a"]);
    sb.conf_file(
        "10-dflt.conf",
        &json!({"cniVersion": "1.0.0", "name": "dflt-net", "type": "dflt-plugin"}),
    );
    sb.nad("kube-system", "ks-net", Some(list("ks-plugin")));
    let extra = json!({"defaultNetworks": ["dflt-net", "ks-net"]});
    add_pod(&sb, "p1", Some("net-a"), extra.clone()).ok();
    assert_eq!(
        order(&sb, "ADD"),
        pairs(&[
            ("cluster-plugin", "eth0"),
            ("dflt-plugin", "net1"),
            ("ks-plugin", "net2"),
            ("net-a-plugin", "net3")
        ])
    );
    let st = status_of(&sb, "p1");
    let names: Vec<_> = st.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "cluster-net",
            "dflt-net",
            "kube-system/ks-net",
            "default/net-a"
        ]
    );
    let defaults: Vec<_> = st.iter().map(|e| e["default"].as_bool().unwrap()).collect();
    assert_eq!(defaults, [true, false, false, false]);

    // A pod without the annotation gets them too.
    sb.clear_calls();
    add_pod(&sb, "p2", None, extra).ok();
    assert_eq!(
        order(&sb, "ADD"),
        pairs(&[
            ("cluster-plugin", "eth0"),
            ("dflt-plugin", "net1"),
            ("ks-plugin", "net2")
        ])
    );
}

#[test]
fn s6_cluster_network_and_default_networks_from_plexus_namespace() {
    let sb = Sandbox::new();
    sb.fakes(&["ks-cluster-plugin", "ks-extra-plugin"]);
    // Not in confDir: found as NADs in plexusNamespace (kube-system by default).
    sb.nad("kube-system", "ks-cluster", Some(list("ks-cluster-plugin")));
    sb.nad("kube-system", "ks-extra", Some(list("ks-extra-plugin")));
    sb.nad("plexus-system", "ks-cluster", Some(list("wrong-plugin")));
    let extra = json!({"clusterNetwork": "ks-cluster", "defaultNetworks": ["ks-extra"]});
    add_pod(&sb, "p1", None, extra).ok();
    assert_eq!(
        order(&sb, "ADD"),
        pairs(&[("ks-cluster-plugin", "eth0"), ("ks-extra-plugin", "net1")])
    );
    assert_eq!(calls_of(&sb, "ADD")[0].stdin["name"], "ks-cluster");
    let st = status_of(&sb, "p1");
    assert_eq!(
        (st[0]["name"].as_str(), st[0]["default"].as_bool()),
        (Some("kube-system/ks-cluster"), Some(true))
    );
    assert_eq!(st[1]["name"], "kube-system/ks-extra");

    // plexusNamespace moves the lookup.
    let sb2 = Sandbox::new();
    sb2.fakes(&["ks-cluster-plugin", "ps-plugin"]);
    sb2.nad("kube-system", "ks-cluster", Some(list("ks-cluster-plugin")));
    sb2.nad("plexus-system", "ks-cluster", Some(list("ps-plugin")));
    add_pod(
        &sb2,
        "p1",
        None,
        json!({"clusterNetwork": "ks-cluster", "plexusNamespace": "plexus-system"}),
    )
    .ok();
    assert_eq!(order(&sb2, "ADD"), pairs(&[("ps-plugin", "eth0")]));
    assert_eq!(status_of(&sb2, "p1")[0]["name"], "plexus-system/ks-cluster");
}

// ---------------------------------------------------------------------------------------------------
// 3.4 Resolution
// ---------------------------------------------------------------------------------------------------

#[test]
fn s3_4_1_rule1_spec_config_preferred_over_on_disk() {
    let sb = sandbox(&["spec-plugin", "disk-plugin"]);
    sb.nad(
        NS,
        "net-a",
        Some(json!({"cniVersion": "1.0.0", "name": "net-a", "plugins": [{"type": "spec-plugin"}]})),
    );
    sb.conf_file(
        "10-net-a.conflist",
        &json!({"cniVersion": "1.0.0", "name": "net-a", "plugins": [{"type": "disk-plugin"}]}),
    );
    add_pod(&sb, "p1", Some("net-a"), json!({})).ok();
    assert_eq!(
        order(&sb, "ADD"),
        pairs(&[("cluster-plugin", "eth0"), ("spec-plugin", "net1")])
    );
}

#[test]
fn s3_4_1_rule2_on_disk_conflist_for_nad_without_spec() {
    // Spec 3.2.4: a NAD without spec is resolved through confDir; the .conflist wins over a .conf that
    // sorts first.
    let sb = sandbox(&["conf-plugin", "list-plugin"]);
    sb.nad(NS, "net-a", None);
    sb.conf_file(
        "05-net-a.conf",
        &json!({"cniVersion": "1.0.0", "name": "net-a", "type": "conf-plugin"}),
    );
    sb.conf_file(
        "10-net-a.conflist",
        &json!({"cniVersion": "1.0.0", "name": "net-a", "plugins": [{"type": "list-plugin"}]}),
    );
    add_pod(&sb, "p1", Some("net-a"), json!({})).ok();
    assert_eq!(
        order(&sb, "ADD"),
        pairs(&[("cluster-plugin", "eth0"), ("list-plugin", "net1")])
    );
    assert_eq!(status_of(&sb, "p1")[1]["name"], "default/net-a");
}

#[test]
fn s3_4_1_rule3_on_disk_conf_when_no_conflist_matches() {
    let sb = sandbox(&["conf-plugin", "list-plugin"]);
    sb.nad(NS, "net-a", None);
    sb.conf_file(
        "05-net-a.conf",
        &json!({"cniVersion": "1.0.0", "name": "net-a", "type": "conf-plugin"}),
    );
    sb.conf_file(
        "10-other.conflist",
        &json!({"cniVersion": "1.0.0", "name": "other", "plugins": [{"type": "list-plugin"}]}),
    );
    add_pod(&sb, "p1", Some("net-a"), json!({})).ok();
    assert_eq!(
        order(&sb, "ADD"),
        pairs(&[("cluster-plugin", "eth0"), ("conf-plugin", "net1")])
    );
    assert_eq!(calls_of(&sb, "ADD")[1].stdin["name"], "net-a");
}

#[test]
fn s3_4_1_rule4_no_config_fails_naming_namespace_and_name() {
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a"]);
    sb.nad("team", "net-z", None);
    let run = add_pod(&sb, "p1", Some("net-a,team/net-z"), json!({}));
    assert_eq!(run.code(), 7, "{}", run.msg());
    assert!(run.msg().contains("team/net-z"), "{}", run.msg());
    assert_nothing_attached(&sb, "p1");
}

#[test]
fn s3_4_2_name_injected_into_delegate_stdin_and_3_4_3_existing_name_kept() {
    let sb = sandbox(&["single-plugin", "named-plugin"]);
    sb.nad(
        NS,
        "net-a",
        Some(json!({"cniVersion": "1.0.0", "type": "single-plugin"})),
    );
    sb.nad(
        NS,
        "net-b",
        Some(json!({"cniVersion": "1.0.0", "name": "other-name", "type": "named-plugin"})),
    );
    add_pod(&sb, "p1", Some("net-a,net-b"), json!({})).ok();
    let adds = calls_of(&sb, "ADD");
    assert_eq!(the_call(&adds, "single-plugin").stdin["name"], "net-a");
    assert_eq!(the_call(&adds, "named-plugin").stdin["name"], "other-name");
    // The status names the NAD, not the CNI name.
    assert_eq!(status_of(&sb, "p1")[2]["name"], "default/net-b");
}

// ---------------------------------------------------------------------------------------------------
// 7.5 runtimeConfig from the runtime
// ---------------------------------------------------------------------------------------------------

#[test]
fn s7_5_runtime_config_reaches_only_the_cluster_network() {
    let sb = sandbox(&["dflt-plugin", "nad-plugin"]);
    let caps = json!({"portMappings": true, "bandwidth": true});
    sb.conf_file("10-dflt.conflist", &json!({"cniVersion": "1.0.0", "name": "dflt-net", "plugins": [{"type": "dflt-plugin", "capabilities": caps}]}));
    sb.nad(NS, "net-a", Some(json!({"cniVersion": "1.0.0", "plugins": [{"type": "nad-plugin", "capabilities": caps}]})));
    let pm = json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]);
    let extra = json!({"defaultNetworks": ["dflt-net"], "runtimeConfig": {"portMappings": pm, "bandwidth": {"ingressRate": 5, "ingressBurst": 5}}});
    add_pod(&sb, "p1", Some("net-a"), extra).ok();
    let adds = calls_of(&sb, "ADD");
    // The cluster plugin declares portMappings only.
    assert_eq!(
        the_call(&adds, "cluster-plugin").stdin["runtimeConfig"],
        json!({"portMappings": pm})
    );
    for p in ["dflt-plugin", "nad-plugin"] {
        let stdin = &the_call(&adds, p).stdin;
        assert!(stdin.get("runtimeConfig").is_none(), "{p}: {stdin}");
    }
    // DEL, from the cache, keeps to the same rule.
    sb.clear_calls();
    run_pod(&sb, "DEL", "p1", json!({})).ok();
    let dels = calls_of(&sb, "DEL");
    assert_eq!(
        the_call(&dels, "cluster-plugin").stdin["runtimeConfig"],
        json!({"portMappings": pm})
    );
    assert!(the_call(&dels, "nad-plugin")
        .stdin
        .get("runtimeConfig")
        .is_none());
}

// ---------------------------------------------------------------------------------------------------
// v1.0 4.1.2.1.3.2 / 4.1.2.1.4.2: requested ips and mac must be assigned
// ---------------------------------------------------------------------------------------------------

/// NAD `default/net-b` whose plugin declares `capability` but ignores runtimeConfig.
fn ignoring_nad(sb: &Sandbox, capability: &str) {
    sb.fakes(&["deaf-plugin"]);
    sb.nad(
        NS,
        "net-b",
        Some(json!({"cniVersion": "1.0.0", "plugins": [
            {"type": "deaf-plugin", "capabilities": {capability: true}, "fakeIgnoreRuntimeConfig": true},
        ]})),
    );
}

#[track_caller]
fn assert_rolled_back_after_net_b(sb: &Sandbox) {
    let summary: Vec<_> = sb
        .calls()
        .iter()
        .map(|c| (c.plugin.clone(), c.command.clone()))
        .collect();
    let expect: Vec<(String, String)> = [
        ("cluster-plugin", "ADD"),
        ("net-a-plugin", "ADD"),
        ("deaf-plugin", "ADD"),
        ("deaf-plugin", "DEL"),
        ("net-a-plugin", "DEL"),
        ("cluster-plugin", "DEL"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(summary, expect);
    assert!(
        sb.cached().is_empty(),
        "rolled back: no plan left {:?}",
        sb.cached()
    );
    assert!(sb.status(NS, "p1").is_none());
}

#[test]
fn v1_0_s4_1_2_1_3_2_unassigned_ips_fail_the_attachment_and_roll_back() {
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a"]);
    ignoring_nad(&sb, "ips");
    let sel = json!([{"name": "net-a"}, {"name": "net-b", "ips": ["10.1.0.5/24"]}]);
    let run = add_pod(&sb, "p1", Some(&sel.to_string()), json!({}));
    assert!(!run.success);
    let msg = run.msg();
    for want in ["10.1.0.5", "default/net-b", "net2", "default/p1"] {
        assert!(msg.contains(want), "error names {want}: {msg}");
    }
    assert_rolled_back_after_net_b(&sb);
}

#[test]
fn v1_0_s4_1_2_1_4_2_unassigned_mac_fails_the_attachment_and_rolls_back() {
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a"]);
    ignoring_nad(&sb, "mac");
    let sel = json!([{"name": "net-a"}, {"name": "net-b", "mac": "c2:11:22:33:44:55"}]);
    let run = add_pod(&sb, "p1", Some(&sel.to_string()), json!({}));
    assert!(!run.success);
    let msg = run.msg();
    for want in ["c2:11:22:33:44:55", "default/net-b", "net2"] {
        assert!(msg.contains(want), "error names {want}: {msg}");
    }
    assert_rolled_back_after_net_b(&sb);
}

#[test]
fn v1_0_s4_1_2_1_3_2_assigned_ips_and_mac_pass_in_any_notation() {
    // The fake echoes the request: an upper-case MAC and an address compared without its prefix pass.
    let sb = sandbox(&["ok-plugin"]);
    sb.nad(NS, "net-b", Some(json!({"cniVersion": "1.0.0", "plugins": [{"type": "ok-plugin", "capabilities": {"ips": true, "mac": true}}]})));
    let sel = json!([{"name": "net-b", "ips": ["10.1.0.5/24"], "mac": "C2:11:22:33:44:55"}]);
    add_pod(&sb, "p1", Some(&sel.to_string()), json!({})).ok();
    let st = status_of(&sb, "p1");
    assert_eq!(st[1]["ips"], json!(["10.1.0.5/24"]));
    assert!(st[1]["mac"]
        .as_str()
        .unwrap()
        .eq_ignore_ascii_case("c2:11:22:33:44:55"));
}

// ---------------------------------------------------------------------------------------------------
// 4.1.2.1.5 / 4.2.1 Interface names
// ---------------------------------------------------------------------------------------------------

#[test]
fn s4_1_2_1_5_1_generated_names_and_explicit_names_consume_a_position() {
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a", "net-b", "net-c"]);
    add_pod(&sb, "p1", Some("net-a,net-b@foo,net-c"), json!({})).ok();
    assert_eq!(
        order(&sb, "ADD"),
        pairs(&[
            ("cluster-plugin", "eth0"),
            ("net-a-plugin", "net1"),
            ("net-b-plugin", "foo"),
            ("net-c-plugin", "net3")
        ])
    );
    let ifaces: Vec<_> = status_of(&sb, "p1")
        .iter()
        .map(|e| e["interface"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ifaces, ["eth0", "net1", "foo", "net3"]);
}

#[test]
fn s4_1_2_1_5_duplicate_interface_name_fails_before_anything_is_attached() {
    for (annotation, dup) in [
        ("net-a@foo,net-b@foo", "foo"),
        ("net-a@eth0", "eth0"),
        ("net-a@net2,net-b", "net2"),
    ] {
        let sb = sandbox(&[]);
        simple_nads(&sb, &["net-a", "net-b"]);
        let run = add_pod(&sb, "p1", Some(annotation), json!({}));
        assert_eq!(run.code(), 7, "{annotation}: {}", run.msg());
        assert!(
            run.msg().contains(&format!("{dup:?}")) || run.msg().contains(dup),
            "{annotation}: {}",
            run.msg()
        );
        assert_nothing_attached(&sb, "p1");
    }
}

// ---------------------------------------------------------------------------------------------------
// 5 Status
// ---------------------------------------------------------------------------------------------------

#[test]
fn s5_status_from_the_first_sandbox_interface_default_only_on_cluster_network() {
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a"]);
    let result = json!({
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": "veth1234", "mac": "aa:aa:aa:aa:aa:aa"},
            {"name": "net1", "mac": "02:42:ac:11:00:05", "mtu": 1400, "sandbox": "/run/netns/fake-c-p1"},
            {"name": "other", "mac": "bb:bb:bb:bb:bb:bb", "sandbox": "/run/netns/fake-c-p1"},
        ],
        "ips": [
            {"address": "192.168.1.1/24", "interface": 0},
            {"address": "10.1.0.5/24", "interface": 1, "gateway": "10.1.0.1"},
            {"address": "fd00::5/64", "interface": 1},
            {"address": "10.2.0.5/24", "interface": 2},
        ],
        "dns": {"nameservers": ["10.1.0.53"], "domain": "example.org", "search": ["a.example.org"]},
    });
    sb.fake_config(json!({"net-a-plugin": {"ADD": {"result": result}}}));
    add_pod(&sb, "p1", Some("net-a"), json!({})).ok();
    let st = status_of(&sb, "p1");
    assert_eq!(
        st[1],
        json!({
            "name": "default/net-a", "interface": "net1", "ips": ["10.1.0.5/24", "fd00::5/64"],
            "mac": "02:42:ac:11:00:05", "mtu": 1400, "default": false,
            "dns": {"nameservers": ["10.1.0.53"], "domain": "example.org", "search": ["a.example.org"]},
        })
    );
    assert_eq!(st[0]["name"], "cluster-net");
    assert_eq!(st[0]["default"], true);
    assert_eq!(st[0]["interface"], "eth0");
    assert_eq!(st.iter().filter(|e| e["default"] == true).count(), 1);
}

#[test]
fn s5_3_3_1_status_from_a_result_below_0_3_0() {
    let sb = sandbox(&["old-plugin"]);
    sb.nad(
        NS,
        "net-old",
        Some(json!({"cniVersion": "0.2.0", "type": "old-plugin"})),
    );
    add_pod(&sb, "p1", Some("net-old"), json!({})).ok();
    let add = &calls_of(&sb, "ADD")[1];
    assert_eq!(add.stdin["cniVersion"], "0.2.0");
    let st = status_of(&sb, "p1");
    // The fake answers 0.2.0 with ip4 only: the address comes from ip4.ip, the interface from CNI_IFNAME.
    assert_eq!(st[1]["name"], "default/net-old");
    assert_eq!(st[1]["interface"], "net1");
    assert_eq!(st[1]["ips"].as_array().map(Vec::len), Some(1));
    assert!(
        st[1]["ips"][0].as_str().unwrap().starts_with("10.88.0."),
        "{}",
        st[1]
    );
    assert!(st[1].get("mac").is_none());
    // CHECK skips the pre-0.4.0 list; DEL reaches it without prevResult.
    sb.clear_calls();
    run_pod(&sb, "DEL", "p1", json!({})).ok();
    let dels = calls_of(&sb, "DEL");
    assert!(the_call(&dels, "old-plugin")
        .stdin
        .get("prevResult")
        .is_none());
}

#[test]
fn s5_3_3_1_rule2_status_from_a_result_without_interfaces() {
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a"]);
    let result = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.7.0.2/24"}, {"address": "fd07::2/64"}]});
    sb.fake_config(json!({"net-a-plugin": {"ADD": {"result": result}}}));
    add_pod(&sb, "p1", Some("net-a"), json!({})).ok();
    let st = status_of(&sb, "p1");
    assert_eq!(
        st[1],
        json!({"name": "default/net-a", "interface": "net1", "ips": ["10.7.0.2/24", "fd07::2/64"], "default": false})
    );
}

// ---------------------------------------------------------------------------------------------------
// 4.1.2.1.9 default-route (with fakes; the routing itself is exercised in real namespaces elsewhere)
// ---------------------------------------------------------------------------------------------------

#[test]
fn s4_1_2_1_9_default_route_on_two_elements_fails_before_any_delegate() {
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a", "net-b"]);
    let sel = json!([{"name": "net-a", "default-route": ["10.1.0.1"]}, {"name": "net-b", "default-route": []}]);
    let run = add_pod(&sb, "p1", Some(&sel.to_string()), json!({}));
    assert_eq!(run.code(), 7);
    let msg = run.msg();
    assert!(
        msg.contains("element 1") && msg.contains("net-b") && msg.contains("default-route"),
        "{msg}"
    );
    assert_nothing_attached(&sb, "p1");
}

#[test]
fn s4_1_2_1_9_default_route_failure_rolls_everything_back() {
    // The fake netns does not exist, so plexus cannot change routes in it: the pod fails after every
    // delegate succeeded, and every attachment is torn down in reverse.
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a", "net-b"]);
    let sel = json!([{"name": "net-a"}, {"name": "net-b", "default-route": ["10.88.0.1"]}]);
    let run = add_pod(&sb, "p1", Some(&sel.to_string()), json!({}));
    assert!(!run.success);
    let msg = run.msg();
    for want in [
        "default/p1",
        "default-route",
        "default/net-b",
        "net2",
        "/run/netns/fake-c-p1",
    ] {
        assert!(msg.contains(want), "error names {want}: {msg}");
    }
    assert_eq!(
        sb.call_summary()
            .into_iter()
            .map(|(p, c, i)| format!("{c} {p} {i}"))
            .collect::<Vec<_>>(),
        [
            "ADD cluster-plugin eth0",
            "ADD net-a-plugin net1",
            "ADD net-b-plugin net2",
            "DEL net-b-plugin net2",
            "DEL net-a-plugin net1",
            "DEL cluster-plugin eth0",
        ]
    );
    assert!(sb.cached().is_empty());
    assert!(sb.status(NS, "p1").is_none());
}

/// A named network namespace, deleted on drop. `None` when this process cannot create one (not root).
struct TempNetns(String);

impl TempNetns {
    fn new(tag: &str) -> Option<Self> {
        let name = format!("plexus-conf-{tag}-{}", std::process::id());
        let ok = std::process::Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| TempNetns(name))
    }
    fn path(&self) -> String {
        format!("/run/netns/{}", self.0)
    }
}

impl Drop for TempNetns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .status();
    }
}

#[test]
fn s5_3_7_4_default_route_in_the_status_entry() {
    // The fakes create no interfaces, so the test gives the namespace the one the route needs (a veth
    // `net2` on 10.2.0.0/24, its peer beside it); plexus then really moves the default route. Needs root for `ip netns`.
    let Some(netns) = TempNetns::new("dr") else {
        assert_ne!(
            process_uid(),
            0,
            "root must be able to create a network namespace"
        );
        eprintln!("skipped: not root");
        return;
    };
    for args in [
        &[
            "link",
            "add",
            "net2",
            "type",
            "veth",
            "peer",
            "name",
            "net2-peer",
        ][..],
        &["addr", "add", "10.2.0.5/24", "dev", "net2"],
        &["link", "set", "net2-peer", "up"],
        &["link", "set", "net2", "up"],
    ] {
        let ok = std::process::Command::new("ip")
            .args(["-n", &netns.0])
            .args(args)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip {args:?} in {}", netns.0);
    }
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a", "net-b"]);
    // The delegate reports its own default route via .1: the requested gateway replaces it.
    let result = json!({"cniVersion": "1.0.0",
        "interfaces": [{"name": "net2", "sandbox": netns.path()}],
        "ips": [{"address": "10.2.0.5/24", "interface": 0, "gateway": "10.2.0.1"}],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.2.0.1"}, {"dst": "10.9.0.0/16"}]});
    sb.fake_config(json!({"net-b-plugin": {"ADD": {"result": result}}}));
    sb.pod(
        NS,
        "p1",
        Some(
            &json!([{"name": "net-a"}, {"name": "net-b", "default-route": ["10.2.0.254"]}])
                .to_string(),
        ),
    );
    let env: Vec<(String, String)> = [
        ("CNI_COMMAND", "ADD".to_string()),
        ("CNI_CONTAINERID", "c-p1".to_string()),
        ("CNI_NETNS", netns.path()),
        ("CNI_IFNAME", "eth0".to_string()),
        ("CNI_PATH", sb.path("bin").display().to_string()),
        ("CNI_ARGS", Sandbox::pod_args(NS, "p1")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    sb.run_env(&env, sb.conf(json!({})).to_string().as_bytes())
        .ok();
    let st = status_of(&sb, "p1");
    assert_eq!(st[2]["name"], "default/net-b");
    assert_eq!(st[2]["default-route"], json!(["10.2.0.254"]), "{st:?}");
    assert!(
        st[0].get("default-route").is_none() && st[1].get("default-route").is_none(),
        "{st:?}"
    );
    let routes = std::process::Command::new("ip")
        .args(["-n", &netns.0, "-4", "route", "show", "default"])
        .output()
        .unwrap();
    let routes = String::from_utf8_lossy(&routes.stdout);
    assert!(
        routes.contains("via 10.2.0.254 dev net2"),
        "the route status reports is the pod's: {routes}"
    );
}

fn process_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(u32::MAX)
}

// ---------------------------------------------------------------------------------------------------
// 6.1 Readiness
// ---------------------------------------------------------------------------------------------------

#[test]
fn s6_1_2_missing_readiness_indicator_fails_add_with_code_11_and_no_delegate() {
    let sb = sandbox(&[]);
    let extra = json!({"readinessIndicatorFile": sb.path("ready"), "readinessTimeoutMs": 300});
    let start = Instant::now();
    let run = add_pod(&sb, "p1", None, extra);
    assert_eq!(run.code(), 11, "{}", run.msg());
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "waited for the timeout"
    );
    assert!(
        run.msg().contains(&sb.path("ready").display().to_string()),
        "{}",
        run.msg()
    );
    assert_nothing_attached(&sb, "p1");
}

#[test]
fn s6_1_2_readiness_indicator_created_during_the_wait_lets_add_proceed() {
    let sb = sandbox(&[]);
    let ready = sb.path("ready");
    let extra = json!({"readinessIndicatorFile": ready, "readinessTimeoutMs": 20000});
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(600));
        std::fs::write(ready, "").unwrap();
    });
    let start = Instant::now();
    add_pod(&sb, "p1", None, extra).ok();
    let waited = start.elapsed();
    writer.join().unwrap();
    assert!(
        waited >= Duration::from_millis(600),
        "ADD waited for the file: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(15),
        "ADD went on once the file appeared: {waited:?}"
    );
    assert_eq!(order(&sb, "ADD"), pairs(&[("cluster-plugin", "eth0")]));
}

#[test]
fn s6_1_2_del_does_not_wait_for_readiness() {
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a"]);
    std::fs::write(sb.path("ready"), "").unwrap();
    let extra = json!({"readinessIndicatorFile": sb.path("ready"), "readinessTimeoutMs": 60000});
    add_pod(&sb, "p1", Some("net-a"), extra.clone()).ok();
    std::fs::remove_file(sb.path("ready")).unwrap();
    sb.clear_calls();
    let start = Instant::now();
    run_pod(&sb, "DEL", "p1", extra).ok();
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "DEL must not wait: {:?}",
        start.elapsed()
    );
    assert_eq!(
        order(&sb, "DEL"),
        pairs(&[("net-a-plugin", "net1"), ("cluster-plugin", "eth0")])
    );
}

// ---------------------------------------------------------------------------------------------------
// 7.2 Failure handling
// ---------------------------------------------------------------------------------------------------

#[test]
fn s7_2_first_failing_attachment_stops_add_and_earlier_ones_are_deleted_in_reverse() {
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a", "net-b", "net-c"]);
    sb.fake_config(json!({"net-b-plugin": {"ADD": {"error": {"cniVersion": "1.0.0", "code": 120, "msg": "no more leases", "details": "pool 7"}}}}));
    let run = add_pod(&sb, "p1", Some("net-a,net-b,net-c"), json!({}));
    assert_eq!(
        run.code(),
        120,
        "the delegate's code is kept: {}",
        run.msg()
    );
    let msg = run.msg();
    for want in ["default/p1", "default/net-b", "net2", "no more leases"] {
        assert!(msg.contains(want), "error names {want}: {msg}");
    }
    assert_eq!(run.json()["details"], "pool 7");
    assert_eq!(
        sb.call_summary()
            .into_iter()
            .map(|(p, c, i)| format!("{c} {p} {i}"))
            .collect::<Vec<_>>(),
        [
            "ADD cluster-plugin eth0",
            "ADD net-a-plugin net1",
            "ADD net-b-plugin net2",
            "DEL net-b-plugin net2",
            "DEL net-a-plugin net1",
            "DEL cluster-plugin eth0",
        ],
        "net-c is never attempted; the failed one and the earlier ones are deleted in reverse"
    );
    assert!(sb.cached().is_empty());
    assert!(sb.status(NS, "p1").is_none());
    // The rollback DELs get the results of the attachments that succeeded.
    let dels = calls_of(&sb, "DEL");
    assert_eq!(
        the_call(&dels, "net-a-plugin").stdin["prevResult"]["interfaces"][0]["name"],
        "net1"
    );
    assert!(the_call(&dels, "net-b-plugin")
        .stdin
        .get("prevResult")
        .is_none());
}

#[test]
fn s7_2_del_tears_down_everything_reports_all_failures_and_keeps_the_cache() {
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a", "net-b", "net-c"]);
    add_pod(&sb, "p1", Some("net-a,net-b,net-c"), json!({})).ok();
    assert_eq!(sb.cached(), ["c-p1.json"]);
    sb.clear_calls();
    sb.fake_config(json!({
        "net-a-plugin": {"DEL": {"error": {"cniVersion": "1.0.0", "code": 11, "msg": "busy a"}}},
        "net-c-plugin": {"DEL": {"exit": 2, "stderr": "crash c"}},
    }));
    let run = run_pod(&sb, "DEL", "p1", json!({}));
    assert!(!run.success);
    let msg = run.msg();
    for want in [
        "default/p1",
        "2 of 4",
        "default/net-a",
        "busy a",
        "default/net-c",
        "crash c",
    ] {
        assert!(msg.contains(want), "error names {want}: {msg}");
    }
    assert_eq!(
        order(&sb, "DEL"),
        pairs(&[
            ("net-c-plugin", "net3"),
            ("net-b-plugin", "net2"),
            ("net-a-plugin", "net1"),
            ("cluster-plugin", "eth0")
        ]),
        "every attachment is attempted despite failures"
    );
    assert_eq!(sb.cached(), ["c-p1.json"], "the plan stays for a retry");

    // Retried once the delegates recover: everything is torn down again and the cache goes.
    sb.fake_config(json!({}));
    sb.clear_calls();
    run_pod(&sb, "DEL", "p1", json!({})).ok();
    assert_eq!(order(&sb, "DEL").len(), 4);
    assert!(
        calls_of(&sb, "DEL")
            .iter()
            .all(|c| c.stdin.get("prevResult").is_some()),
        "retry uses the cached results"
    );
    assert!(sb.cached().is_empty());
    // And once more: DEL of a container that is gone succeeds.
    run_pod(&sb, "DEL", "p1", json!({})).ok();
}

#[test]
fn s7_2_cluster_network_failure_fails_the_pod_before_any_selection() {
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a"]);
    sb.fake_config(json!({"cluster-plugin": {"ADD": {"error": {"cniVersion": "1.0.0", "code": 11, "msg": "cluster network down"}}}}));
    let run = add_pod(&sb, "p1", Some("net-a"), json!({}));
    assert_eq!(run.code(), 11, "{}", run.msg());
    assert!(
        run.msg().contains("cluster network down") && run.msg().contains("cluster-net"),
        "{}",
        run.msg()
    );
    assert_eq!(
        sb.call_summary()
            .into_iter()
            .map(|(p, c, _)| format!("{c} {p}"))
            .collect::<Vec<_>>(),
        ["ADD cluster-plugin", "DEL cluster-plugin"],
        "net-a is never attempted"
    );
    assert!(sb.cached().is_empty());
}

#[test]
fn s7_2_failed_rollback_keeps_the_plan_and_a_later_del_finishes_it() {
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a", "net-b"]);
    sb.fake_config(json!({
        "net-b-plugin": {"ADD": {"error": {"cniVersion": "1.0.0", "code": 120, "msg": "no more leases"}}},
        "net-a-plugin": {"DEL": {"error": {"cniVersion": "1.0.0", "code": 11, "msg": "a is busy"}}},
    }));
    let run = add_pod(&sb, "p1", Some("net-a,net-b"), json!({}));
    assert!(!run.success);
    let msg = run.msg();
    for want in [
        "no more leases",
        "default/net-b",
        "a is busy",
        "default/net-a",
    ] {
        assert!(msg.contains(want), "error names {want}: {msg}");
    }
    // The rollback went on past the failure: the cluster network was still torn down.
    assert_eq!(
        order(&sb, "DEL"),
        pairs(&[
            ("net-b-plugin", "net2"),
            ("net-a-plugin", "net1"),
            ("cluster-plugin", "eth0")
        ])
    );
    assert_eq!(
        sb.cached(),
        ["c-p1.json"],
        "the plan stays for the runtime's DEL"
    );

    sb.fake_config(json!({}));
    sb.clear_calls();
    run_pod(&sb, "DEL", "p1", json!({})).ok();
    assert_eq!(
        order(&sb, "DEL"),
        pairs(&[
            ("net-b-plugin", "net2"),
            ("net-a-plugin", "net1"),
            ("cluster-plugin", "eth0")
        ])
    );
    assert!(sb.cached().is_empty());
}

#[test]
fn s6_2_plexus_prints_the_cluster_networks_result() {
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a", "net-b"]);
    let out = add_pod(&sb, "p1", Some("net-a,net-b"), json!({}))
        .ok()
        .json();
    let adds = calls_of(&sb, "ADD");
    assert_eq!(out["interfaces"][0]["name"], "eth0", "{out}");
    let st = status_of(&sb, "p1");
    assert_eq!(out["ips"][0]["address"], st[0]["ips"][0], "{out}");
    assert_ne!(
        out["ips"][0]["address"], st[2]["ips"][0],
        "not the last attachment's result"
    );
    assert_eq!(adds.len(), 3);
}

// ---------------------------------------------------------------------------------------------------
// 7.3 Serialization
// ---------------------------------------------------------------------------------------------------

/// Installs `timed-plugin`: records `COMMAND CONTAINERID IFNAME start_ns end_ns` in `bin/times.log`
/// around a sleep of `sleep_ms`, and answers ADD with a minimal result.
fn timed_plugin(sb: &Sandbox, sleep_ms: u64) {
    let bin = sb.path("bin");
    let script = format!(
        r#"#!/bin/sh
cat >/dev/null
s=$(date +%s%N)
sleep {secs}
e=$(date +%s%N)
echo "$CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME $s $e" >> '{log}'
if [ "$CNI_COMMAND" = ADD ]; then
  printf '{{"cniVersion":"1.0.0","interfaces":[{{"name":"%s","sandbox":"%s"}}],"ips":[{{"address":"10.99.0.2/24","interface":0}}]}}\n' "$CNI_IFNAME" "$CNI_NETNS"
fi
"#,
        secs = sleep_ms as f64 / 1000.0,
        log = bin.join("times.log").display()
    );
    let path = bin.join("timed-plugin");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(script.as_bytes()).unwrap();
    drop(f);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[derive(Debug, Clone)]
struct Span {
    command: String,
    container: String,
    ifname: String,
    start: u128,
    end: u128,
}

fn spans(sb: &Sandbox) -> Vec<Span> {
    let text = std::fs::read_to_string(sb.path("bin/times.log")).unwrap_or_default();
    let mut v: Vec<Span> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Span {
                command: f[0].into(),
                container: f[1].into(),
                ifname: f[2].into(),
                start: f[3].parse().unwrap(),
                end: f[4].parse().unwrap(),
            }
        })
        .collect();
    v.sort_by_key(|s| s.start);
    v
}

fn overlap(a: &Span, b: &Span) -> bool {
    a.start < b.end && b.start < a.end
}

#[test]
fn s7_3_attachments_of_one_pod_run_strictly_one_after_another() {
    let sb = sandbox(&[]);
    timed_plugin(&sb, 200);
    for n in ["net-a", "net-b", "net-c"] {
        sb.nad(NS, n, Some(list("timed-plugin")));
    }
    add_pod(&sb, "p1", Some("net-a,net-b,net-c"), json!({})).ok();
    let s = spans(&sb);
    assert_eq!(
        s.iter().map(|s| s.ifname.as_str()).collect::<Vec<_>>(),
        ["net1", "net2", "net3"]
    );
    for w in s.windows(2) {
        assert!(w[0].end <= w[1].start, "{:?} overlaps {:?}", w[0], w[1]);
    }
}

/// The environment for `command` on container `id` without a pod (cluster network only).
fn bare_env(sb: &Sandbox, command: &str, id: &str) -> Vec<(String, String)> {
    [
        ("CNI_COMMAND", command.to_string()),
        ("CNI_CONTAINERID", id.to_string()),
        ("CNI_NETNS", format!("/run/netns/fake-{id}")),
        ("CNI_IFNAME", "eth0".to_string()),
        ("CNI_PATH", sb.path("bin").display().to_string()),
        ("CNI_ARGS", String::new()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Runs each `(delay, command, container)` as its own plexus process, started `delay` after the first.
fn run_concurrently(sb: &Sandbox, runs: &[(u64, &str, &str)]) -> Vec<Run> {
    let with_conf: Vec<_> = runs
        .iter()
        .map(|&(d, c, id)| (d, c, id, sb.conf(json!({}))))
        .collect();
    run_concurrently_with(sb, &with_conf)
}

/// [`run_concurrently`] with each run's own plexus conf.
fn run_concurrently_with(sb: &Sandbox, runs: &[(u64, &str, &str, Value)]) -> Vec<Run> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = runs
            .iter()
            .map(|(delay, command, id, conf)| {
                let (env, stdin) = (bare_env(sb, command, id), conf.to_string());
                let delay = Duration::from_millis(*delay);
                scope.spawn(move || {
                    std::thread::sleep(delay);
                    sb.run_env(&env, stdin.as_bytes())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn timed_cluster(sb: &Sandbox, sleep_ms: u64) {
    timed_plugin(sb, sleep_ms);
    sb.conf_file("00-cluster.conflist", &json!({"cniVersion": "1.0.0", "name": "cluster-net", "plugins": [{"type": "timed-plugin"}]}));
}

#[test]
fn s7_3_same_container_never_overlaps_across_processes() {
    let sb = Sandbox::new();
    timed_cluster(&sb, 600);
    let runs = run_concurrently(
        &sb,
        &[(0, "ADD", "c1"), (150, "DEL", "c1"), (150, "ADD", "c1")],
    );
    for run in &runs {
        assert!(run.success, "{} {}", run.stdout, run.stderr);
    }
    let s: Vec<Span> = spans(&sb)
        .into_iter()
        .filter(|s| s.container == "c1")
        .collect();
    assert!(s.len() >= 3, "{s:?}");
    assert!(s.iter().any(|s| s.command == "DEL"), "{s:?}");
    for (i, a) in s.iter().enumerate() {
        for b in &s[i + 1..] {
            assert!(!overlap(a, b), "same container overlapped: {a:?} and {b:?}");
        }
    }

    // Control: the same runs with a lock directory each do overlap, so the check above can see it.
    let sb = Sandbox::new();
    timed_cluster(&sb, 2000);
    let own_lock = |d: &str| sb.conf(json!({"runDir": sb.path(d)}));
    run_concurrently_with(
        &sb,
        &[
            (0, "ADD", "c1", own_lock("run-a")),
            (0, "DEL", "c1", own_lock("run-b")),
        ],
    );
    let s = spans(&sb);
    assert!(
        s.len() == 2 && overlap(&s[0], &s[1]),
        "without a shared lock the runs overlap: {s:?}"
    );
}

#[test]
fn s7_3_different_containers_run_in_parallel() {
    let sb = Sandbox::new();
    timed_cluster(&sb, 3000);
    for run in run_concurrently(&sb, &[(0, "ADD", "c1"), (0, "ADD", "c2")]) {
        assert!(run.success, "{} {}", run.stdout, run.stderr);
    }
    let s = spans(&sb);
    let c1 = s.iter().find(|s| s.container == "c1").expect("c1 ran");
    let c2 = s.iter().find(|s| s.container == "c2").expect("c2 ran");
    assert!(
        overlap(c1, c2),
        "different containers must not wait for each other: {c1:?} {c2:?}"
    );
}

// ---------------------------------------------------------------------------------------------------
// 7.4 Restrictions: a NAD that does not exist
// ---------------------------------------------------------------------------------------------------

#[test]
fn s7_4_selecting_a_missing_nad_fails_naming_it_with_nothing_attached() {
    let sb = sandbox(&[]);
    simple_nads(&sb, &["net-a"]);
    let run = add_pod(&sb, "p1", Some("net-a,team/ghost"), json!({}));
    assert_eq!(run.code(), 7, "{}", run.msg());
    let msg = run.msg();
    assert!(msg.contains("team/ghost"), "{msg}");
    assert!(msg.contains("default/p1"), "{msg}");
    assert_nothing_attached(&sb, "p1");
}
