//! Plexus as a CNI runtime towards its delegates (issue: foundation), asserted on what recording fake
//! delegates received.

use plexus_tests::plexus::Sandbox;
use serde_json::{json, Value};

fn two_plugin_cluster(sb: &Sandbox, version: &str) {
    sb.fakes(&["cluster-plugin", "chain-plugin"]);
    sb.conf_file(
        "00-cluster.conflist",
        &json!({"cniVersion": version, "name": "cluster-net", "plugins": [
            {"type": "cluster-plugin", "bridge": "br-x"},
            {"type": "chain-plugin", "capabilities": {"portMappings": true, "bandwidth": false}},
        ]}),
    );
}

#[test]
fn add_chains_prev_result_and_injects_name_version_runtime_config() {
    let sb = Sandbox::new();
    two_plugin_cluster(&sb, "1.0.0");
    let pm = json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]);
    let conf =
        sb.conf(json!({"runtimeConfig": {"portMappings": pm, "bandwidth": {"ingressRate": 1}}}));
    let run = sb.run("ADD", "c1", "IgnoreUnknown=1", &conf);
    run.ok();
    let calls = sb.calls();
    assert_eq!(calls.len(), 2);
    let (first, second) = (&calls[0], &calls[1]);
    assert_eq!(
        (first.plugin.as_str(), first.command.as_str()),
        ("cluster-plugin", "ADD")
    );
    assert_eq!(first.env["CNI_CONTAINERID"], "c1");
    assert_eq!(first.env["CNI_IFNAME"], "eth0");
    assert_eq!(first.env["CNI_NETNS"], "/run/netns/fake-c1");
    assert_eq!(first.env["CNI_ARGS"], "IgnoreUnknown=1");
    assert_eq!(first.env["CNI_PATH"], sb.path("bin").display().to_string());
    // name and cniVersion come from the list; plugin keys survive; no runtimeConfig without capabilities.
    assert_eq!(first.stdin["name"], "cluster-net");
    assert_eq!(first.stdin["cniVersion"], "1.0.0");
    assert_eq!(first.stdin["bridge"], "br-x");
    assert!(
        first.stdin.get("runtimeConfig").is_none(),
        "{}",
        first.stdin
    );
    assert!(first.stdin.get("prevResult").is_none());
    // The second plugin declares portMappings only (bandwidth: false): it gets exactly that.
    assert_eq!(second.stdin["runtimeConfig"], json!({"portMappings": pm}));
    assert!(
        second.stdin.get("capabilities").is_none(),
        "capabilities are removed: {}",
        second.stdin
    );
    assert_eq!(second.stdin["prevResult"]["interfaces"][0]["name"], "eth0");
    // What plexus prints is the list's final result.
    assert_eq!(
        run.json()["ips"][0]["address"],
        second.stdin["prevResult"]["ips"][0]["address"]
    );
}

#[test]
fn del_runs_plugins_in_reverse_with_the_cached_result_and_clears_the_cache() {
    let sb = Sandbox::new();
    two_plugin_cluster(&sb, "1.0.0");
    let conf = sb.conf(json!({}));
    let added = sb.run("ADD", "c1", "", &conf).ok().json();
    assert_eq!(sb.cached(), vec!["c1.json"]);
    sb.clear_calls();
    sb.run("DEL", "c1", "", &conf).ok();
    let calls = sb.calls();
    let order: Vec<_> = calls
        .iter()
        .map(|c| (c.plugin.as_str(), c.command.as_str()))
        .collect();
    assert_eq!(
        order,
        vec![("chain-plugin", "DEL"), ("cluster-plugin", "DEL")]
    );
    for c in &calls {
        assert_eq!(c.stdin["prevResult"], added, "DEL gets the cached result");
    }
    assert!(
        sb.cached().is_empty(),
        "cache removed after a fully successful DEL"
    );
    // Repeated DEL succeeds (spec 7.2 / CNI: DEL is idempotent).
    sb.run("DEL", "c1", "", &conf).ok();
}

#[test]
fn del_of_pre_0_4_0_lists_gets_no_prev_result() {
    let sb = Sandbox::new();
    two_plugin_cluster(&sb, "0.3.1");
    let conf = sb.conf(json!({"cniVersion": "0.3.1"}));
    sb.run("ADD", "c1", "", &conf).ok();
    sb.clear_calls();
    sb.run("DEL", "c1", "", &conf).ok();
    assert!(sb
        .calls()
        .iter()
        .all(|c| c.stdin.get("prevResult").is_none()));
}

#[test]
fn result_is_converted_to_the_requested_version() {
    for (requested, check) in [
        (
            "0.2.0",
            Box::new(|v: &Value| v["ip4"]["ip"].is_string() && v.get("ips").is_none())
                as Box<dyn Fn(&Value) -> bool>,
        ),
        ("0.3.1", Box::new(|v: &Value| v["ips"][0]["version"] == "4")),
        (
            "1.1.0",
            Box::new(|v: &Value| {
                v["ips"][0].get("version").is_none() && v["interfaces"][0]["name"] == "eth0"
            }),
        ),
    ] {
        let sb = Sandbox::new();
        sb.cluster_net("1.0.0");
        let out = sb
            .run("ADD", "c1", "", &sb.conf(json!({"cniVersion": requested})))
            .ok()
            .json();
        assert_eq!(out["cniVersion"], requested);
        assert!(check(&out), "{requested}: {out}");
    }
}

#[test]
fn check_uses_cached_result_and_honours_disable_check() {
    let sb = Sandbox::new();
    two_plugin_cluster(&sb, "1.0.0");
    let conf = sb.conf(json!({}));
    let added = sb.run("ADD", "c1", "", &conf).ok().json();
    sb.clear_calls();
    sb.run("CHECK", "c1", "", &conf).ok();
    let calls = sb.calls();
    assert_eq!(
        calls.iter().map(|c| c.command.as_str()).collect::<Vec<_>>(),
        vec!["CHECK", "CHECK"]
    );
    assert_eq!(calls[0].stdin["prevResult"], added);

    let sb = Sandbox::new();
    sb.fakes(&["cluster-plugin"]);
    sb.conf_file("00.conflist", &json!({"cniVersion": "1.0.0", "name": "cluster-net", "disableCheck": true, "plugins": [{"type": "cluster-plugin"}]}));
    let conf = sb.conf(json!({}));
    sb.run("ADD", "c1", "", &conf).ok();
    sb.clear_calls();
    sb.run("CHECK", "c1", "", &conf).ok();
    assert!(sb.calls().is_empty(), "disableCheck: no delegate CHECK");
}

#[test]
fn check_is_refused_below_0_4_0() {
    let sb = Sandbox::new();
    sb.cluster_net("0.3.1");
    let conf = sb.conf(json!({"cniVersion": "0.3.1"}));
    sb.run("ADD", "c1", "", &conf).ok();
    let run = sb.run("CHECK", "c1", "", &conf);
    assert_eq!(run.code(), 1);
    assert!(run.msg().contains("0.3.1"), "{}", run.msg());
}

#[test]
fn version_reports_every_supported_version() {
    let sb = Sandbox::new();
    let run = sb.run_env(
        &[("CNI_COMMAND".into(), "VERSION".into())],
        br#"{"cniVersion":"0.4.0"}"#,
    );
    let v = run.ok().json();
    assert_eq!(v["cniVersion"], "0.4.0");
    assert_eq!(
        v["supportedVersions"],
        json!(["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
    );
}
