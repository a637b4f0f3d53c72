//! Plexus driven by the real runtime library: libcni (through the Go driver, as containerd, CRI-O and kubelet call
//! CNI) runs AddNetworkList, CheckNetworkList and DelNetworkList on a conflist whose plugin is `plexus`, which
//! in turn runs Debian's reference plugins in a real namespace. Needs root; build plexus first.

use std::path::{Path, PathBuf};

use plexus_tests::libcni::Libcni;
use plexus_tests::netns::{
    cni_bin_dir, host_links_on_bridge, iptables_nat, require_root_and_plugins, unique_subnet24,
    HostBridge, IpamDir, Link, NetNs, Subnet24,
};
use plexus_tests::plexus::{plexus_bin, Sandbox};
use serde_json::{json, Value};

const POD_NS: &str = "default";

/// A pod whose runtime is libcni: plexus's sandbox, a bin dir holding only `plexus`, the namespace, IPAM state.
struct Setup {
    sb: Sandbox,
    ns: NetNs,
    ipam: IpamDir,
    pod: String,
    cluster_bridge: HostBridge,
    side_bridge: HostBridge,
    cluster_subnet: Subnet24,
    side_subnet: Subnet24,
}

impl Setup {
    /// Cluster network `cluster-net` (bridge + host-local in confDir) and a NAD `side` (a second bridge) that
    /// the pod selects.
    fn new(tag: &str) -> Setup {
        Setup::with_plugins(tag, &[])
    }

    /// As [`Setup::new`], with `extra` plugins appended to both networks' lists.
    fn with_plugins(tag: &str, extra: &[Value]) -> Setup {
        require_root_and_plugins();
        let s = Setup {
            sb: Sandbox::new(),
            ns: NetNs::new(tag),
            ipam: IpamDir::new(),
            pod: format!("pod-{tag}"),
            cluster_bridge: HostBridge::reserve("lcb"),
            side_bridge: HostBridge::reserve("lsb"),
            cluster_subnet: unique_subnet24(),
            side_subnet: unique_subnet24(),
        };
        s.ns.cleanup_host_link(s.cluster_bridge.name());
        s.ns.cleanup_host_link(s.side_bridge.name());
        s.sb.conf_file(
            "00-cluster.conflist",
            &bridge_net(
                "cluster-net",
                &s.cluster_bridge,
                s.cluster_subnet,
                &s.ipam,
                extra,
            ),
        );
        s.sb.nad(
            POD_NS,
            "side",
            Some(bridge_net(
                "side",
                &s.side_bridge,
                s.side_subnet,
                &s.ipam,
                extra,
            )),
        );
        s.sb.pod(POD_NS, &s.pod, Some("side"));
        std::os::unix::fs::symlink(plexus_bin(), s.sb.path("bin/plexus"))
            .expect("symlink plexus into bin/");
        s
    }

    /// The `plexus` plugin entry: plexus's own keys, as an operator installs them (name and cniVersion come
    /// from the list).
    fn plexus_plugin(&self) -> Value {
        let mut p = self.sb.conf(json!({}));
        let obj = p.as_object_mut().expect("conf is an object");
        obj.remove("name");
        obj.remove("cniVersion");
        p
    }

    fn write_conflist(&self, plugins: Vec<Value>, extra: Value) -> PathBuf {
        let mut list = json!({"cniVersion": "1.0.0", "name": "plexus-lc", "plugins": plugins});
        for (k, v) in extra.as_object().into_iter().flatten() {
            list[k] = v.clone();
        }
        let path = self.sb.path("runtime.conflist");
        std::fs::write(&path, serde_json::to_vec_pretty(&list).unwrap())
            .expect("write the conflist");
        path
    }

    /// The runtime's view: libcni with plexus's bin dir first, then the reference plugins, and the pod's K8S_*
    /// args as kubelet passes them.
    fn libcni(&self, conflist: &Path) -> Libcni {
        Libcni::new(conflist, self.sb.path("libcni-cache"))
            .netns(self.ns.path())
            .container_id(format!("lc-{}-{}", self.pod, std::process::id()))
            .bin_dirs([self.sb.path("bin"), PathBuf::from(cni_bin_dir())])
            .arg("IgnoreUnknown", "1")
            .arg("K8S_POD_NAMESPACE", POD_NS)
            .arg("K8S_POD_NAME", &self.pod)
            .arg("K8S_POD_UID", format!("uid-{}", self.pod))
    }

    fn link(&self, ifname: &str) -> Link {
        self.ns.link(ifname).unwrap_or_else(|| {
            let names: Vec<String> = self.ns.links().into_iter().map(|l| l.ifname).collect();
            panic!("{ifname} is missing in the pod: {names:?}")
        })
    }

    /// After DEL: only lo in the pod, nothing on either bridge, no reservations, no plexus plan.
    fn assert_clean(&self) {
        let names: Vec<String> = self.ns.links().into_iter().map(|l| l.ifname).collect();
        assert_eq!(names, vec!["lo"], "only lo may remain in the pod after DEL");
        for b in [self.cluster_bridge.name(), self.side_bridge.name()] {
            assert!(host_links_on_bridge(b).is_empty(), "host veths left on {b}");
        }
        for n in ["cluster-net", "side"] {
            assert_eq!(
                self.ipam.reservations(n),
                vec![],
                "host-local still holds addresses in {n}"
            );
        }
        assert_eq!(
            self.sb.cached(),
            Vec::<String>::new(),
            "plexus's plan outlived DEL"
        );
    }
}

fn bridge_net(
    name: &str,
    bridge: &HostBridge,
    subnet: Subnet24,
    ipam: &IpamDir,
    extra: &[Value],
) -> Value {
    let mut plugins = vec![json!({
        "type": "bridge", "bridge": bridge.name(), "isGateway": true, "ipMasq": false,
        "ipam": {
            "type": "host-local", "dataDir": ipam.path(),
            "ranges": [[{"subnet": subnet.cidr(), "gateway": subnet.host(1)}]],
            "routes": [{"dst": "10.198.0.0/16", "gw": subnet.host(1)}],
        },
    })];
    plugins.extend(extra.iter().cloned());
    let mut list = json!({"cniVersion": "1.0.0", "name": name, "plugins": plugins});
    if !extra.is_empty() {
        // portmap 1.1.1's CHECK looks for its chain in ip6tables too and fails for IPv4-only pods.
        list["disableCheck"] = json!(true);
    }
    list
}

/// The address the result gives the sandbox interface `ifname`.
fn sandbox_addr(result: &Value, ifname: &str) -> String {
    let ifs = result["interfaces"]
        .as_array()
        .expect("result has interfaces");
    let idx = ifs
        .iter()
        .position(|i| i["name"] == ifname && i.get("sandbox").is_some())
        .unwrap_or_else(|| panic!("no sandbox interface {ifname} in {result}"));
    result["ips"]
        .as_array()
        .expect("result has ips")
        .iter()
        .find(|ip| ip["interface"] == idx)
        .and_then(|ip| ip["address"].as_str())
        .unwrap_or_else(|| panic!("no address for {ifname} in {result}"))
        .to_string()
}

#[test]
fn libcni_runs_plexus_add_check_del_with_a_secondary_network() {
    let s = Setup::new("lcadd");
    let conflist = s.write_conflist(vec![s.plexus_plugin()], json!({}));
    let cni = s.libcni(&conflist);

    let result = cni.add().expect("AddNetworkList through plexus");

    assert_eq!(result["cniVersion"], "1.0.0");
    let addr = sandbox_addr(&result, "eth0");
    assert!(
        s.cluster_subnet.contains(&addr),
        "{addr} is not on the cluster network"
    );
    let eth0 = s.link("eth0");
    assert!(
        eth0.has_addr(&addr),
        "eth0 lacks {addr}: {:?}",
        eth0.cidrs()
    );
    let net1 = s.link("net1");
    assert!(
        net1.cidrs().iter().any(|c| s.side_subnet.contains(c)),
        "net1 is not on the selected network: {:?}",
        net1.cidrs()
    );
    let status = s.sb.status(POD_NS, &s.pod).expect("network-status written");
    let names: Vec<&str> = status
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["cluster-net", "default/side"]);
    assert_eq!(s.ipam.reservations("side")[0].container_id, cni.container());

    cni.check().expect("CheckNetworkList through plexus");
    cni.del().expect("DelNetworkList through plexus");

    s.assert_clean();
    // A runtime repeats DEL freely.
    cni.del().expect("second DelNetworkList");
}

/// Runs DelNetworkList when dropped, so a failed assertion leaves no portmap rules behind in the host's tables.
struct DelOnDrop<'a>(&'a Libcni);

impl Drop for DelOnDrop<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.del() {
            eprintln!("cleanup: DelNetworkList of {}: {e}", self.0.container());
        }
    }
}

#[test]
fn libcni_chains_portmap_after_plexus_with_plexus_result_as_prev_result() {
    let s = Setup::new("lcpm");
    // portmap 1.1.1's CHECK looks for its chain in ip6tables too and fails for IPv4-only pods: no CHECK here.
    let conflist = s.write_conflist(
        vec![
            s.plexus_plugin(),
            json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": false}),
        ],
        json!({"disableCheck": true}),
    );
    let host_port = 40000 + (std::process::id() % 10000);
    let cni = s.libcni(&conflist).capability_args(json!({
        "portMappings": [{"hostPort": host_port, "containerPort": 80, "protocol": "tcp"}],
    }));

    let result = cni.add().expect("AddNetworkList plexus -> portmap");
    let _cleanup = DelOnDrop(&cni);

    // portmap passes its prevResult (plexus's) through, and found the pod's address in it.
    let addr = sandbox_addr(&result, "eth0");
    let ip = addr.split('/').next().unwrap();
    assert!(s.link("eth0").has_addr(&addr));
    s.link("net1");
    let nat = iptables_nat();
    let dnat = format!("--dport {host_port} -j DNAT --to-destination {ip}:80");
    assert!(nat.contains(&dnat), "no `{dnat}` in:\n{nat}");

    cni.del().expect("DelNetworkList portmap -> plexus");

    assert!(
        !iptables_nat().contains(&dnat),
        "the DNAT rule outlived DEL"
    );
    s.assert_clean();
}

#[test]
fn libcni_receives_plexus_error_object_and_the_namespace_stays_empty() {
    let s = Setup::new("lcerr");
    s.sb.pod(POD_NS, &s.pod, Some("side,no-such-net"));
    let conflist = s.write_conflist(vec![s.plexus_plugin()], json!({}));
    let cni = s.libcni(&conflist);

    let err = cni
        .add()
        .expect_err("a pod selecting a missing NAD must not start");

    let code = err
        .cni_code()
        .unwrap_or_else(|| panic!("libcni passes plexus's error object on: {err}"));
    assert!(code != 0, "{err}");
    assert!(
        err.to_string().contains("default/no-such-net"),
        "the error names the network: {err}"
    );
    s.assert_clean();
    cni.del().expect("DEL after the failed ADD");
}

#[test]
fn s7_5_runtime_port_mappings_reach_only_the_cluster_network() {
    let portmap = json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": false});
    // Both networks could map ports; only the cluster network may receive the runtime's request.
    let s = Setup::with_plugins("lc75", &[portmap]);
    let mut plexus = s.plexus_plugin();
    plexus["capabilities"] = json!({"portMappings": true});
    let conflist = s.write_conflist(vec![plexus], json!({}));
    let host_port = 30000 + (std::process::id() % 10000);
    let cni = s.libcni(&conflist).capability_args(json!({
        "portMappings": [{"hostPort": host_port, "containerPort": 8080, "protocol": "tcp"}],
    }));

    let result = cni.add().expect("AddNetworkList with portMappings");
    let _cleanup = DelOnDrop(&cni);

    let eth0_ip = sandbox_addr(&result, "eth0")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let net1 = s.link("net1");
    let net1_ip = net1
        .addr_info
        .iter()
        .map(|a| a.local.clone())
        .find(|a| s.side_subnet.contains(a));
    let net1_ip = net1_ip.unwrap_or_else(|| panic!("net1 address: {:?}", net1.cidrs()));
    let nat = iptables_nat();
    let to_eth0 = format!("--dport {host_port} -j DNAT --to-destination {eth0_ip}:8080");
    assert!(nat.contains(&to_eth0), "no `{to_eth0}` in:\n{nat}");
    assert!(
        !nat.contains(&format!("--to-destination {net1_ip}:")),
        "the secondary network got the runtime's portMappings:\n{nat}"
    );

    cni.del().expect("DelNetworkList");
    assert!(
        !iptables_nat().contains(&to_eth0),
        "the DNAT rule outlived DEL"
    );
    s.assert_clean();
}

#[test]
fn s7_1_results_reach_libcni_in_the_conflist_version() {
    // The delegates speak 1.0.0; plexus converts the cluster network's result to what the runtime asked for.
    for version in ["0.3.1", "0.4.0", "1.0.0"] {
        let s = Setup::new(&format!("lcv{}", version.replace('.', "")));
        let mut plugin = s.plexus_plugin();
        plugin["cniVersion"] = json!(version);
        let conflist = s.write_conflist(vec![plugin], json!({"cniVersion": version}));
        let cni = s.libcni(&conflist);

        let result = cni
            .add()
            .unwrap_or_else(|e| panic!("ADD as {version}: {e}"));

        assert_eq!(result["cniVersion"], version);
        let addr = sandbox_addr(&result, "eth0");
        assert!(
            s.link("eth0").has_addr(&addr),
            "{version}: eth0 lacks {addr}"
        );
        if version == "0.3.1" {
            assert!(
                result["ips"][0].get("version").is_some(),
                "0.3.x results carry ips[].version: {result}"
            );
        } else if version == "1.0.0" {
            assert!(
                result["ips"][0].get("version").is_none(),
                "1.0.0 results have no ips[].version: {result}"
            );
        }
        s.link("net1");
        // CHECK exists from 0.4.0 on (libcni refuses it for older lists before any plugin runs).
        if version != "0.3.1" {
            cni.check()
                .unwrap_or_else(|e| panic!("CHECK as {version}: {e}"));
        }
        cni.del()
            .unwrap_or_else(|e| panic!("DEL as {version}: {e}"));
        s.assert_clean();
    }
}
