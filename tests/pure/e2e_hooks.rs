//! The example wasm hooks on plexus's ADD path, with the real bridge/host-local plugins in a real network
//! namespace (issue: WebAssembly hooks, "End to end"). Needs the guests built (tests/run.sh does it).

use plexus_tests::netns::{self, HostBridge, IpamDir, NetNs};
use plexus_tests::plexus::{guest_wasm, Sandbox};
use serde_json::{json, Value};

struct World {
    sb: Sandbox,
    ns: NetNs,
    ipam: IpamDir,
    cluster_br: HostBridge,
    sec_br: HostBridge,
    conf: Value,
}

fn world(tag: &str) -> World {
    netns::require_root_and_plugins();
    let sb = Sandbox::new();
    let ns = NetNs::new(tag);
    let ipam = IpamDir::new();
    let (cluster_br, sec_br) = (HostBridge::reserve("hc"), HostBridge::reserve("hs"));
    let (cluster_net, sec_net) = (netns::unique_subnet24(), netns::unique_subnet24());
    sb.conf_file(
        "00-cluster.conflist",
        &json!({"cniVersion": "1.0.0", "name": "cluster-net", "plugins": [{"type": "bridge", "bridge": cluster_br.name(),
            "ipam": {"type": "host-local", "subnet": cluster_net.cidr(), "dataDir": ipam.path()}}]}),
    );
    // team-a/templated has no spec: only the network-templates resolver can resolve it (spec 3.2.4).
    sb.nad("team-a", "templated", None);
    sb.nad(
        "team-b",
        "foreign",
        Some(json!({"cniVersion": "1.0.0", "type": "bridge", "bridge": sec_br.name()})),
    );
    let template = json!({"cniVersion": "1.0.0", "type": "bridge", "bridge": sec_br.name(),
        "ipam": {"type": "host-local", "subnet": sec_net.cidr(), "dataDir": ipam.path()}});
    let conf = sb.conf(json!({"hooks": [
        {"name": "isolation", "kind": "policy", "module": guest_wasm("namespace-isolation")},
        {"name": "templates", "kind": "resolver", "module": guest_wasm("network-templates"),
         "settings": {"templates": {"templated": template}}},
        {"name": "labels", "kind": "status", "module": guest_wasm("status-labels"), "settings": {"labels": ["app"]}},
    ]}));
    World {
        sb,
        ns,
        ipam,
        cluster_br,
        sec_br,
        conf,
    }
}

fn env(w: &World, id: &str, pod: &str) -> Vec<(String, String)> {
    [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", id),
        ("CNI_NETNS", w.ns.path().to_str().unwrap()),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", netns::cni_bin_dir()),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain([("CNI_ARGS".to_string(), Sandbox::pod_args("team-a", pod))])
    .collect()
}

fn with_command(mut env: Vec<(String, String)>, command: &str) -> Vec<(String, String)> {
    env[0].1 = command.into();
    env
}

#[test]
fn s7_4_policy_hook_denial_is_the_cni_error_and_nothing_is_attached() {
    let w = world("hkd");
    w.sb.pod("team-a", "intruder", Some("team-b/foreign"));
    let before: Vec<String> = w.ns.links().into_iter().map(|l| l.ifname).collect();
    let run =
        w.sb.run_env(&env(&w, "deny1", "intruder"), w.conf.to_string().as_bytes());
    assert_eq!(run.code(), 102, "{}", run.stdout);
    let msg = run.msg();
    assert!(
        msg.contains("\"isolation\"") && msg.contains("team-b/foreign"),
        "names the hook and the network: {msg}"
    );
    let after: Vec<String> = w.ns.links().into_iter().map(|l| l.ifname).collect();
    assert_eq!(before, after, "no interface added");
    assert!(
        w.ipam.reserved_ips("cluster-net").is_empty(),
        "policy runs before any delegate: no IP taken"
    );
    assert!(w.sb.cached().is_empty());
    assert!(netns::host_links_on_bridge(w.cluster_br.name()).is_empty());
}

#[test]
fn s3_2_4_nad_without_config_attached_via_resolver_and_status_carries_labels() {
    let w = world("hkr");
    w.sb.pod("team-a", "web", Some("templated"));
    let e = env(&w, "res1", "web");
    w.sb.run_env(&e, w.conf.to_string().as_bytes()).ok();
    let net1 =
        w.ns.link("net1")
            .expect("net1 attached through the template");
    assert_eq!(net1.master, None);
    let global: Vec<String> = net1
        .cidrs()
        .into_iter()
        .filter(|c| !c.starts_with("fe80:"))
        .collect();
    assert_eq!(global.len(), 1, "{net1:?}");
    assert_eq!(
        netns::host_links_on_bridge(w.sec_br.name()).len(),
        1,
        "the template's bridge got the veth"
    );
    let status = w.sb.status("team-a", "web").expect("status written");
    let entries = status.as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[1]["name"], "team-a/templated");
    assert_eq!(entries[1]["ips"][0], global[0]);
    for entry in entries {
        assert_eq!(
            entry["io.plexus.pod-labels"],
            json!({"app": "web"}),
            "status hook ran: {entry}"
        );
    }
    // DEL runs from the cache: no hooks, no NAD needed.
    w.sb.run_env(&with_command(e, "DEL"), w.conf.to_string().as_bytes())
        .ok();
    assert!(w.ns.link("net1").is_none() && w.ns.link("eth0").is_none());
    assert!(w.ipam.reserved_ips("cluster-net").is_empty());
    assert!(w.sb.cached().is_empty());
}

#[test]
fn hook_fault_under_fail_policy_rolls_back_and_ignore_skips_it() {
    let w = world("hkf");
    w.sb.pod("team-a", "web", None);
    let mut conf = w.conf.clone();
    conf["hooks"] = json!([{"name": "looper", "kind": "status", "module": guest_wasm("test-endless-loop"), "timeoutMs": 50}]);
    let e = env(&w, "fault1", "web");
    let run = w.sb.run_env(&e, conf.to_string().as_bytes());
    assert_eq!(run.code(), 103, "{}", run.stdout);
    assert!(run.msg().contains("\"looper\""), "{}", run.msg());
    assert!(
        w.ns.link("eth0").is_none(),
        "the cluster network was rolled back"
    );
    assert!(w.ipam.reserved_ips("cluster-net").is_empty());
    assert!(w.sb.cached().is_empty());

    conf["hooks"][0]["failurePolicy"] = json!("Ignore");
    w.sb.run_env(&e, conf.to_string().as_bytes()).ok();
    assert!(w.ns.link("eth0").is_some());
    w.sb.run_env(&with_command(e, "DEL"), conf.to_string().as_bytes())
        .ok();
}
