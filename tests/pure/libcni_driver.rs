//! The real-network harness checked on its own, without plexus: libcni (through the Go driver) drives the CNI
//! reference plugins in namespaces made by the `netns` fixtures, and the fixtures see and clean up what they did.

use std::fs;
use std::path::{Path, PathBuf};

use plexus_tests::libcni::{DriverError, Libcni};
use plexus_tests::netns::{
    host_link, host_links_on_bridge, require_root_and_plugins, unique_subnet24, HostBridge,
    IpamDir, NetNs, Reservation, Subnet24, VethPair, NETNS_RUN_DIR,
};
use serde_json::{json, Value};
use tempfile::TempDir;

/// A test's private directory for confs and libcni's cache.
struct Work {
    dir: TempDir,
}

impl Work {
    fn new() -> Work {
        Work {
            dir: tempfile::Builder::new()
                .prefix("plx-libcni-")
                .tempdir()
                .expect("temp dir"),
        }
    }

    fn write_conf(&self, file: &str, conf: &Value) -> PathBuf {
        let path = self.dir.path().join(file);
        fs::write(
            &path,
            serde_json::to_vec_pretty(conf).expect("serialize conf"),
        )
        .expect("write conf");
        path
    }

    fn cache(&self) -> PathBuf {
        self.dir.path().join("cache")
    }
}

fn bridge_conflist(name: &str, bridge: &str, subnet: Subnet24, ipam: &IpamDir) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": [{
            "type": "bridge",
            "bridge": bridge,
            "isGateway": true,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "dataDir": ipam.path(),
                "ranges": [[{ "subnet": subnet.cidr(), "gateway": subnet.host(1) }]],
                // With an explicit gw: bridge 1.1.x's CHECK wants the result's route verbatim in the table, and
                // without one the kernel records the range's gateway that the result leaves out.
                "routes": [{ "dst": "10.198.0.0/16", "gw": subnet.host(1) }]
            }
        }]
    })
}

/// The result's interface entries as (name, mac, sandbox).
fn result_interfaces(result: &Value) -> Vec<(String, String, Option<String>)> {
    result["interfaces"]
        .as_array()
        .expect("result has interfaces")
        .iter()
        .map(|i| {
            (
                i["name"].as_str().expect("interface name").to_owned(),
                i["mac"].as_str().unwrap_or_default().to_owned(),
                i["sandbox"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

#[test]
fn bridge_host_local_add_check_del_through_libcni() {
    require_root_and_plugins();
    let ns = NetNs::new("brhl");
    let bridge = HostBridge::reserve("br");
    let ipam = IpamDir::new();
    let work = Work::new();
    let subnet = unique_subnet24();
    let net = "plx-lcd-bridge";
    let conflist = work.write_conf(
        "bridge.conflist",
        &bridge_conflist(net, bridge.name(), subnet, &ipam),
    );
    let cni = Libcni::new(&conflist, work.cache())
        .netns(ns.path())
        .ifname("eth0");

    let result = cni.add().expect("ADD");

    assert_eq!(result["cniVersion"], "1.0.0");
    let interfaces = result_interfaces(&result);
    let sandbox = ns.path().to_str().expect("utf-8 netns path");
    let pod_if = interfaces
        .iter()
        .position(|(name, _, sb)| name == "eth0" && sb.as_deref() == Some(sandbox))
        .unwrap_or_else(|| panic!("no eth0 in {sandbox} among {interfaces:?}"));
    let host_veth = interfaces
        .iter()
        .find(|(name, _, sb)| sb.is_none() && name != bridge.name())
        .map(|(name, _, _)| name.clone())
        .unwrap_or_else(|| panic!("no host-side veth among {interfaces:?}"));

    let ips = result["ips"].as_array().expect("result has ips");
    assert_eq!(ips.len(), 1, "one address from one range: {ips:?}");
    let address = ips[0]["address"].as_str().expect("ips[0].address");
    assert!(
        subnet.contains(address),
        "{address} is outside {}",
        subnet.cidr()
    );
    assert!(
        address.ends_with("/24"),
        "{address} lost the range's prefix length"
    );
    assert_eq!(
        ips[0]["interface"],
        json!(pod_if),
        "ips[0] must point at eth0"
    );
    assert_eq!(ips[0]["gateway"], json!(subnet.host(1)));

    // What the result claims is what the kernel holds.
    let eth0 = ns.link("eth0").expect("eth0 exists inside the namespace");
    assert!(
        eth0.has_addr(address),
        "eth0 lacks {address}: {:?}",
        eth0.cidrs()
    );
    assert_eq!(
        eth0.address.as_deref(),
        Some(interfaces[pod_if].1.as_str()),
        "eth0's MAC"
    );
    assert_eq!(eth0.kind(), Some("veth"));
    assert!(eth0.is_up());
    let routes = ns.routes();
    assert!(
        routes.iter().any(|r| r.dst == "10.198.0.0/16"
            && r.gateway.as_deref() == Some(&*subnet.host(1))
            && r.dev.as_deref() == Some("eth0")),
        "the IPAM route is missing: {routes:?}"
    );
    assert!(
        routes
            .iter()
            .any(|r| r.dst == subnet.cidr() && r.dev.as_deref() == Some("eth0")),
        "the subnet route is missing: {routes:?}"
    );

    let veth = host_link(&host_veth).unwrap_or_else(|| panic!("host veth {host_veth} is missing"));
    assert_eq!(
        veth.master.as_deref(),
        Some(bridge.name()),
        "host veth must hang off the bridge"
    );
    let br = host_link(bridge.name()).expect("the plugin created the bridge");
    assert_eq!(br.kind(), Some("bridge"));
    assert!(
        br.has_addr(&format!("{}/24", subnet.host(1))),
        "isGateway puts the gateway on the bridge"
    );

    let ip = address
        .split('/')
        .next()
        .expect("address")
        .parse()
        .expect("an IP address");
    assert_eq!(
        ipam.reservations(net),
        vec![Reservation {
            ip,
            container_id: cni.container().to_owned(),
            ifname: Some("eth0".to_owned()),
        }]
    );

    cni.check().expect("CHECK right after ADD");

    cni.del().expect("DEL");

    assert!(ns.link("eth0").is_none(), "eth0 survived DEL");
    assert!(
        host_link(&host_veth).is_none(),
        "host veth {host_veth} leaked"
    );
    assert!(
        host_links_on_bridge(bridge.name()).is_empty(),
        "links left on the bridge"
    );
    assert!(
        ipam.reservations(net).is_empty(),
        "host-local kept the reservation: {:?}",
        ipam.reservations(net)
    );
    // Runtimes retry DEL; it must succeed when there is nothing left.
    cni.del().expect("second DEL");
}

#[test]
fn check_fails_when_the_namespace_drifts_from_the_result() {
    require_root_and_plugins();
    let ns = NetNs::new("drift");
    let bridge = HostBridge::reserve("br");
    let ipam = IpamDir::new();
    let work = Work::new();
    let subnet = unique_subnet24();
    let conflist = work.write_conf(
        "bridge.conflist",
        &bridge_conflist("plx-lcd-drift", bridge.name(), subnet, &ipam),
    );
    let cni = Libcni::new(&conflist, work.cache()).netns(ns.path());
    let result = cni.add().expect("ADD");
    cni.check().expect("CHECK before any change");

    let address = result["ips"][0]["address"]
        .as_str()
        .expect("ips[0].address");
    ns.ip(&["addr", "del", address, "dev", "eth0"]);
    let err = cni
        .check()
        .expect_err("CHECK must notice the missing address");
    assert!(
        matches!(&err, DriverError::Cni { msg, .. } if msg.contains("eth0") || msg.contains(address.split('/').next().unwrap())),
        "CHECK failed for another reason: {err}"
    );
    assert!(
        err.cni_code().is_some(),
        "the plugin's CNI error must come through libcni: {err}"
    );

    cni.del().expect("DEL after a failed CHECK");
    assert!(ipam.reservations("plx-lcd-drift").is_empty());
}

#[test]
fn capability_args_and_cni_args_reach_the_plugins() {
    require_root_and_plugins();
    let ns = NetNs::new("caps");
    let bridge = HostBridge::reserve("br");
    let work = Work::new();
    let subnet = unique_subnet24();
    let conflist = work.write_conf(
        "static.conflist",
        &json!({
            "cniVersion": "1.0.0",
            "name": "plx-lcd-static",
            "plugins": [{
                "type": "bridge",
                "bridge": bridge.name(),
                "capabilities": { "ips": true },
                "ipam": { "type": "static" }
            }]
        }),
    );
    let by_capability = format!("{}/24", subnet.host(77));
    let by_args = format!("{}/24", subnet.host(78));

    let first = Libcni::new(&conflist, work.cache())
        .netns(ns.path())
        .ifname("net1")
        .capability_args(json!({ "ips": [by_capability] }));
    let second = Libcni::new(&conflist, work.cache())
        .netns(ns.path())
        .ifname("net2")
        .arg("IgnoreUnknown", "true")
        .arg("IP", &by_args);

    assert_eq!(
        first.add().expect("ADD with capability ips")["ips"][0]["address"],
        json!(by_capability)
    );
    assert_eq!(
        second.add().expect("ADD with CNI_ARGS IP")["ips"][0]["address"],
        json!(by_args)
    );
    assert!(ns.link("net1").expect("net1").has_addr(&by_capability));
    assert!(ns.link("net2").expect("net2").has_addr(&by_args));

    first.del().expect("DEL net1");
    second.del().expect("DEL net2");
    assert!(ns.link("net1").is_none() && ns.link("net2").is_none());
}

#[test]
fn macvlan_on_a_veth_parent() {
    require_root_and_plugins();
    let ns = NetNs::new("mvlan");
    let parent = VethPair::create("mv");
    let ipam = IpamDir::new();
    let work = Work::new();
    let subnet = unique_subnet24();
    let conf = work.write_conf(
        "macvlan.conf",
        &json!({
            "cniVersion": "0.4.0",
            "name": "plx-lcd-macvlan",
            "type": "macvlan",
            "master": parent.name(),
            "mode": "bridge",
            "ipam": {
                "type": "host-local",
                "dataDir": ipam.path(),
                "ranges": [[{ "subnet": subnet.cidr() }]]
            }
        }),
    );
    // A single-plugin .conf goes through the same driver, as runtimes accept both forms.
    let cni = Libcni::new(&conf, work.cache())
        .netns(ns.path())
        .ifname("net1");
    let result = cni.add().expect("ADD");
    assert_eq!(
        result["cniVersion"], "0.4.0",
        "libcni returns the conf's version"
    );

    let net1 = ns.link("net1").expect("net1 inside the namespace");
    assert_eq!(net1.kind(), Some("macvlan"));
    let address = result["ips"][0]["address"]
        .as_str()
        .expect("ips[0].address");
    assert!(
        subnet.contains(address) && net1.has_addr(address),
        "{address} vs {:?}",
        net1.cidrs()
    );
    assert_eq!(ipam.reserved_ips("plx-lcd-macvlan").len(), 1);
    cni.check().expect("CHECK");

    cni.del().expect("DEL");
    assert!(ns.link("net1").is_none());
    assert!(ipam.reserved_ips("plx-lcd-macvlan").is_empty());
    assert!(
        host_link(parent.name()).is_some(),
        "DEL must leave the macvlan master alone"
    );
}

#[test]
fn validate_reports_declared_capabilities_and_driver_errors_are_typed() {
    require_root_and_plugins();
    let work = Work::new();
    let good = work.write_conf(
        "good.conflist",
        &json!({
            "cniVersion": "1.0.0",
            "name": "plx-lcd-validate",
            "plugins": [
                { "type": "bridge", "bridge": "unused0", "ipam": { "type": "host-local", "subnet": "10.199.0.0/24" } },
                { "type": "portmap", "capabilities": { "portMappings": true } },
                { "type": "tuning", "capabilities": { "mac": false } }
            ]
        }),
    );
    let caps = Libcni::new(&good, work.cache())
        .validate()
        .expect("validate");
    assert_eq!(caps, vec!["portMappings".to_owned()]);

    let missing = work.write_conf(
        "missing.conflist",
        &json!({ "cniVersion": "1.0.0", "name": "plx-lcd-missing", "plugins": [{ "type": "plx-no-such-plugin" }] }),
    );
    let err = Libcni::new(&missing, work.cache())
        .add()
        .expect_err("ADD with an absent plugin");
    match &err {
        DriverError::Failed { stderr, .. } => {
            assert!(stderr.contains("plx-no-such-plugin"), "{stderr}")
        }
        other => panic!("expected a libcni failure naming the plugin, got {other:?}"),
    }
}

#[test]
fn fixtures_clean_up_even_when_the_test_panics() {
    require_root_and_plugins();
    let mut names = None;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let ns = NetNs::new("panic");
        let bridge = HostBridge::create("br");
        let veth = VethPair::create("vp");
        // A host link the test made itself and handed to the namespace fixture.
        let extra = plexus_tests::netns::unique_ifname("xt");
        plexus_tests::netns::run_ok("ip", ["link", "add", extra.as_str(), "type", "bridge"]);
        ns.cleanup_host_link(&extra);
        // An interface inside the namespace whose host peer must go with it.
        let inner = plexus_tests::netns::unique_ifname("in");
        plexus_tests::netns::run_ok(
            "ip",
            [
                "link",
                "add",
                inner.as_str(),
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns.name(),
            ],
        );
        assert!(ns.link("eth0").is_some() && host_link(&inner).is_some());
        names = Some((
            ns.name().to_owned(),
            vec![
                bridge.name().to_owned(),
                veth.name().to_owned(),
                veth.peer().to_owned(),
                extra,
                inner,
            ],
        ));
        panic!("deliberate failure inside a test body");
    }));
    assert!(outcome.is_err());
    let (ns_name, links) = names.expect("the fixtures were created");
    assert!(
        !Path::new(NETNS_RUN_DIR).join(&ns_name).exists(),
        "namespace {ns_name} survived the panic"
    );
    // The kernel dismantles a deleted namespace's links from a work queue: the host end of a veth pair goes
    // shortly after the namespace does, so give it a bounded while.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    for link in links {
        while host_link(&link).is_some() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(
            host_link(&link).is_none(),
            "host link {link} survived the panic"
        );
    }
}
