//! Plexus end to end on a real network: the `plexus` binary drives the CNI reference plugins (v1.10.0; bridge,
//! macvlan, host-local, static, tuning, portmap, bandwidth) inside network namespaces these tests create, and
//! every assertion reads what the kernel (or host-local's dataDir, or iptables) really holds.
//!
//! Needs root and the reference plugins of `tests/parts.sh`; `cargo build --release -p plexus -p plexus-tests
//! --bin plexus --bin fake-cni` first.

use std::net::IpAddr;
use std::process::Command;

use plexus_tests::netns::{
    cni_bin_dir, host_link, host_links_on_bridge, iptables_nat, require_root_and_plugins,
    unique_subnet24, HostBridge, IpamDir, Link, NetNs, Subnet24, VethPair,
};
use plexus_tests::plexus::{Run, Sandbox};
use serde_json::{json, Value};

const POD_NS: &str = "default";

/// One pod on a real network: plexus's sandbox of directories, the pod's namespace, host-local's dataDir.
struct Pod {
    sb: Sandbox,
    ns: NetNs,
    ipam: IpamDir,
    name: String,
    id: String,
}

impl Pod {
    fn new(tag: &str) -> Pod {
        require_root_and_plugins();
        let ns = NetNs::new(tag);
        Pod {
            sb: Sandbox::new(),
            ipam: IpamDir::new(),
            name: format!("pod-{}", tag.replace('_', "-")),
            id: format!("e2e-{tag}-{}", std::process::id()),
            ns,
        }
    }

    /// The pod manifest; `networks` is the selection annotation.
    fn manifest(&self, networks: Option<&str>) {
        self.sb.pod(POD_NS, &self.name, networks);
    }

    /// The cluster network `cluster-net` in confDir: bridge + host-local.
    fn cluster_net(
        &self,
        bridge: &HostBridge,
        subnet: Subnet24,
        routes: Value,
        extra_plugins: &[Value],
    ) {
        self.ns.cleanup_host_link(bridge.name());
        self.sb.conf_file(
            "00-cluster.conflist",
            &bridge_net(
                "cluster-net",
                bridge,
                subnet,
                &self.ipam,
                routes,
                extra_plugins,
            ),
        );
    }

    /// A NAD in the pod's namespace whose spec.config is `config`.
    fn nad(&self, name: &str, config: Value) {
        self.sb.nad(POD_NS, name, Some(config));
    }

    fn conf(&self) -> Value {
        self.sb.conf(json!({}))
    }

    /// Runs plexus for this pod, the way a runtime would, with the reference plugins on CNI_PATH.
    fn cni(&self, command: &str, conf: &Value) -> Run {
        self.cni_with_args(command, conf, &Sandbox::pod_args(POD_NS, &self.name))
    }

    /// The same with the runtime's `CNI_ARGS` as given.
    fn cni_with_args(&self, command: &str, conf: &Value, args: &str) -> Run {
        let env = [
            ("CNI_COMMAND", command.to_string()),
            ("CNI_CONTAINERID", self.id.clone()),
            ("CNI_NETNS", self.ns.path().display().to_string()),
            ("CNI_IFNAME", "eth0".to_string()),
            ("CNI_PATH", cni_bin_dir().to_string()),
            ("CNI_ARGS", args.to_string()),
        ];
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        self.sb.run_env(&env, conf.to_string().as_bytes())
    }

    fn add(&self) -> Value {
        self.cni("ADD", &self.conf()).ok().json()
    }

    fn status(&self) -> Vec<Value> {
        let st = self
            .sb
            .status(POD_NS, &self.name)
            .expect("plexus wrote the network-status");
        st.as_array().expect("network-status is a list").clone()
    }

    /// The attachment plan plexus cached for this pod (results of every attachment included).
    fn cached_plan(&self) -> Value {
        self.sb
            .cached_plan(&self.id)
            .unwrap_or_else(|| panic!("no cached plan for {}", self.id))
    }

    /// The host-side interfaces (no sandbox) every cached result names, bridges excluded.
    fn host_veths(&self, bridges: &[&str]) -> Vec<String> {
        let plan = self.cached_plan();
        let mut out = Vec::new();
        for att in plan["attachments"].as_array().expect("attachments") {
            for i in att["result"]["interfaces"].as_array().into_iter().flatten() {
                let name = i["name"].as_str().unwrap_or_default();
                if i.get("sandbox")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .is_empty()
                    && !bridges.contains(&name)
                {
                    out.push(name.to_string());
                }
            }
        }
        out
    }

    fn link(&self, ifname: &str) -> Link {
        self.ns.link(ifname).unwrap_or_else(|| {
            panic!(
                "{ifname} is missing in the pod: {:?}",
                names(&self.ns.links())
            )
        })
    }

    /// DEL, then the namespace holds nothing but lo, the cache is empty and host-local holds nothing for us.
    fn del_and_assert_clean(&self, networks: &[&str], bridges: &[&str]) {
        let veths = self.host_veths(bridges);
        self.cni("DEL", &self.conf()).ok();
        assert_eq!(
            names(&self.ns.links()),
            vec!["lo"],
            "only lo may remain in the pod after DEL"
        );
        for v in &veths {
            assert!(host_link(v).is_none(), "host veth {v} survived DEL");
        }
        for b in bridges {
            assert!(
                host_links_on_bridge(b).is_empty(),
                "links left on bridge {b}: {:?}",
                names(&host_links_on_bridge(b))
            );
        }
        for n in networks {
            assert_eq!(
                self.ipam.reservations(n),
                vec![],
                "host-local still holds addresses in {n}"
            );
        }
        assert_eq!(
            self.sb.cached(),
            Vec::<String>::new(),
            "the attachment cache outlived DEL"
        );
    }
}

/// The world most tests start from: `cluster-net` on bridge `br` (subnet `s0`) and a NAD on bridge `br2`
/// (subnet `s1`), both bridge + host-local without routes. The bridges are deleted when this is dropped.
struct Side {
    br: HostBridge,
    br2: HostBridge,
    s0: Subnet24,
    s1: Subnet24,
}

impl Pod {
    /// Sets up [`Side`] with the NAD named `nad` (its network has the same name).
    fn with_side_nad(&self, nad: &str) -> Side {
        self.with_side_nad_routes(nad, false, false)
    }

    /// The same, with a default route through the cluster network's gateway and/or the NAD's.
    fn with_side_nad_routes(&self, nad: &str, cluster_default: bool, side_default: bool) -> Side {
        self.with_side_nad_full(nad, cluster_default, side_default, &[])
    }

    /// The same, with `extra` plugins chained after the NAD's bridge.
    fn with_side_nad_plugins(&self, nad: &str, extra: &[Value]) -> Side {
        self.with_side_nad_full(nad, false, false, extra)
    }

    fn with_side_nad_full(
        &self,
        nad: &str,
        cluster_default: bool,
        side_default: bool,
        extra: &[Value],
    ) -> Side {
        let side = Side {
            br: HostBridge::reserve("cbr"),
            br2: HostBridge::reserve("sbr"),
            s0: unique_subnet24(),
            s1: unique_subnet24(),
        };
        let default_via = |on: bool, s: Subnet24| {
            if on {
                json!([{"dst": "0.0.0.0/0", "gw": s.host(1)}])
            } else {
                no_routes()
            }
        };
        self.cluster_net(
            &side.br,
            side.s0,
            default_via(cluster_default, side.s0),
            &[],
        );
        self.ns.cleanup_host_link(side.br2.name());
        self.nad(
            nad,
            bridge_net(
                nad,
                &side.br2,
                side.s1,
                &self.ipam,
                default_via(side_default, side.s1),
                extra,
            ),
        );
        side
    }
}

impl Drop for Pod {
    /// A test that failed between ADD and DEL still leaves no iptables rules, qdiscs or reservations: DEL runs
    /// best effort while the plan is cached (the namespace itself goes with `NetNs`).
    fn drop(&mut self) {
        if !self.sb.cached().is_empty() {
            let run = self.cni("DEL", &self.conf());
            if !run.success {
                eprintln!("cleanup: DEL of {} failed: {}", self.id, run.stdout);
            }
        }
    }
}

fn names(links: &[Link]) -> Vec<String> {
    links.iter().map(|l| l.ifname.clone()).collect()
}

fn host_local(ipam: &IpamDir, subnet: Subnet24, routes: Value) -> Value {
    json!({
        "type": "host-local",
        "dataDir": ipam.path(),
        "ranges": [[{"subnet": subnet.cidr(), "gateway": subnet.host(1)}]],
        "routes": routes,
    })
}

/// A bridge + host-local configuration list; `routes` must give every route a `gw` (bridge 1.1's CHECK).
fn bridge_net(
    name: &str,
    bridge: &HostBridge,
    subnet: Subnet24,
    ipam: &IpamDir,
    routes: Value,
    extra_plugins: &[Value],
) -> Value {
    let mut plugins = vec![json!({
        "type": "bridge",
        "bridge": bridge.name(),
        "isGateway": true,
        "ipMasq": false,
        "ipam": host_local(ipam, subnet, routes),
    })];
    plugins.extend(extra_plugins.iter().cloned());
    json!({"cniVersion": "1.0.0", "name": name, "plugins": plugins})
}

fn no_routes() -> Value {
    json!([])
}

/// The single address the result assigns to the sandbox interface called `ifname`.
fn result_addr(result: &Value, ifname: &str) -> (String, String) {
    let ifs = result["interfaces"]
        .as_array()
        .expect("result has interfaces");
    let idx = ifs
        .iter()
        .position(|i| i["name"] == ifname && i.get("sandbox").is_some())
        .unwrap_or_else(|| panic!("no sandbox interface {ifname} in {result}"));
    let ips: Vec<&Value> = result["ips"]
        .as_array()
        .expect("ips")
        .iter()
        .filter(|ip| ip["interface"] == idx)
        .collect();
    assert_eq!(ips.len(), 1, "one address on {ifname}: {result}");
    (
        ips[0]["address"].as_str().unwrap().to_string(),
        ifs[idx]["mac"].as_str().unwrap().to_string(),
    )
}

fn ip_of(cidr: &str) -> IpAddr {
    cidr.split('/').next().unwrap().parse().unwrap()
}

/// The status entry called `name` (there must be exactly one).
fn entry<'a>(status: &'a [Value], name: &str, ifname: &str) -> &'a Value {
    let found: Vec<&Value> = status
        .iter()
        .filter(|e| e["name"] == name && e["interface"] == ifname)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one status entry for {name} on {ifname}: {status:?}"
    );
    found[0]
}

/// The status entry's ips and mac are what the kernel holds on that interface in the pod.
fn assert_entry_matches_kernel(pod: &Pod, e: &Value) {
    let ifname = e["interface"].as_str().expect("status entry has interface");
    let link = pod.link(ifname);
    let ips = e["ips"]
        .as_array()
        .unwrap_or_else(|| panic!("status entry has ips: {e}"));
    assert!(!ips.is_empty(), "{e}");
    for ip in ips {
        // Spec 5.4's example writes addresses with their prefix length, as the CNI result has them.
        let cidr = ip
            .as_str()
            .unwrap_or_else(|| panic!("status ip {ip} is a string"));
        assert!(
            link.has_addr(cidr),
            "{ifname} lacks {cidr} from the status: {:?}",
            link.cidrs()
        );
    }
    assert_eq!(
        e["mac"].as_str().map(str::to_ascii_lowercase),
        link.address.clone(),
        "status mac of {ifname}"
    );
}

fn macvlan_net(name: &str, master: &str, subnet: Subnet24, ipam: &IpamDir) -> Value {
    json!({"cniVersion": "1.0.0", "name": name, "plugins": [{
        "type": "macvlan", "master": master, "mode": "bridge",
        "ipam": host_local(ipam, subnet, no_routes()),
    }]})
}

#[test]
fn foundation_bridge_host_local_add_check_del() {
    let pod = Pod::new("found");
    let br = HostBridge::reserve("fbr");
    let subnet = unique_subnet24();
    pod.cluster_net(
        &br,
        subnet,
        json!([{"dst": "10.198.0.0/16", "gw": subnet.host(1)}]),
        &[],
    );
    pod.manifest(None);

    let result = pod.add();

    assert_eq!(result["cniVersion"], "1.0.0");
    let (addr, mac) = result_addr(&result, "eth0");
    assert!(subnet.contains(&addr), "{addr} outside {}", subnet.cidr());
    let eth0 = pod.link("eth0");
    assert!(
        eth0.has_addr(&addr),
        "eth0 lacks {addr}: {:?}",
        eth0.cidrs()
    );
    assert_eq!(
        eth0.address.as_deref(),
        Some(mac.as_str()),
        "eth0's MAC is the result's"
    );
    assert_eq!(eth0.kind(), Some("veth"));
    assert!(pod
        .ns
        .routes()
        .iter()
        .any(|r| r.dst == "10.198.0.0/16" && r.dev.as_deref() == Some("eth0")));
    let veths = pod.host_veths(&[br.name()]);
    assert_eq!(veths.len(), 1, "{veths:?}");
    assert_eq!(
        host_link(&veths[0]).and_then(|l| l.master),
        Some(br.name().to_string())
    );
    let reserved = pod.ipam.reservations("cluster-net");
    assert_eq!(reserved.len(), 1, "{reserved:?}");
    assert_eq!(
        (reserved[0].ip, reserved[0].container_id.as_str()),
        (ip_of(&addr), pod.id.as_str())
    );
    assert_eq!(pod.sb.cached(), vec![format!("{}.json", pod.id)]);
    let status = pod.status();
    assert_eq!(status.len(), 1, "{status:?}");
    let e = entry(&status, "cluster-net", "eth0");
    assert_eq!(e["default"], true);
    assert_entry_matches_kernel(&pod, e);

    pod.cni("CHECK", &pod.conf()).ok();

    pod.del_and_assert_clean(&["cluster-net"], &[br.name()]);
    // DEL is idempotent: again, with nothing cached and nothing attached.
    pod.cni("DEL", &pod.conf()).ok();
}

#[test]
fn check_fails_naming_the_attachment_whose_interface_is_gone_and_del_still_cleans_up() {
    let pod = Pod::new("chk");
    let Side { br, br2, .. } = pod.with_side_nad("side");
    pod.manifest(Some("side"));
    pod.add();
    pod.cni("CHECK", &pod.conf()).ok();
    let veths = pod.host_veths(&[br.name(), br2.name()]);

    pod.ns.ip(&["link", "del", "net1"]);

    let run = pod.cni("CHECK", &pod.conf());
    assert!(run.code() != 0, "{}", run.stdout);
    assert!(
        run.msg().contains("default/side (net1)"),
        "CHECK names the broken attachment: {}",
        run.msg()
    );
    pod.cni("DEL", &pod.conf()).ok();
    assert_eq!(names(&pod.ns.links()), vec!["lo"]);
    for v in &veths {
        assert!(host_link(v).is_none(), "host veth {v} survived DEL");
    }
    for n in ["cluster-net", "side"] {
        assert_eq!(
            pod.ipam.reservations(n),
            vec![],
            "host-local still holds addresses in {n}"
        );
    }
    assert_eq!(pod.sb.cached(), Vec::<String>::new());
}

#[test]
fn s4_2_1_secondary_networks_get_net1_net2_and_status_matches_the_kernel() {
    let pod = Pod::new("multi");
    let br = HostBridge::reserve("mbr");
    let br2 = HostBridge::reserve("mb2");
    let parent = VethPair::create("mvp");
    let (s0, s1, s2) = (unique_subnet24(), unique_subnet24(), unique_subnet24());
    pod.cluster_net(&br, s0, no_routes(), &[]);
    pod.ns.cleanup_host_link(br2.name());
    pod.nad(
        "macnet",
        macvlan_net("macnet", parent.name(), s1, &pod.ipam),
    );
    pod.nad(
        "br2",
        bridge_net("br2", &br2, s2, &pod.ipam, no_routes(), &[]),
    );
    pod.manifest(Some("macnet,br2"));

    pod.add();

    let eth0 = pod.link("eth0");
    let net1 = pod.link("net1");
    let net2 = pod.link("net2");
    assert_eq!(
        (eth0.kind(), net1.kind(), net2.kind()),
        (Some("veth"), Some("macvlan"), Some("veth"))
    );
    assert!(
        net1.cidrs().iter().any(|c| s1.contains(c)),
        "net1 is on macnet: {:?}",
        net1.cidrs()
    );
    assert!(
        net2.cidrs().iter().any(|c| s2.contains(c)),
        "net2 is on br2: {:?}",
        net2.cidrs()
    );
    assert_eq!(
        host_links_on_bridge(br2.name()).len(),
        1,
        "one host veth on br2"
    );
    let status = pod.status();
    assert_eq!(status.len(), 3, "{status:?}");
    assert_eq!(
        status.iter().filter(|e| e["default"] == true).count(),
        1,
        "{status:?}"
    );
    for (name, ifname) in [
        ("cluster-net", "eth0"),
        ("default/macnet", "net1"),
        ("default/br2", "net2"),
    ] {
        let e = entry(&status, name, ifname);
        assert_eq!(e["default"], name == "cluster-net", "{e}");
        assert_entry_matches_kernel(&pod, e);
    }
    assert_eq!(pod.ipam.reservations("macnet").len(), 1);
    assert_eq!(pod.ipam.reservations("br2").len(), 1);

    pod.cni("CHECK", &pod.conf()).ok();
    pod.del_and_assert_clean(&["cluster-net", "macnet", "br2"], &[br.name(), br2.name()]);
}

#[test]
fn s4_1_2_1_3_static_ips_through_the_ips_capability_are_on_the_interface() {
    let pod = Pod::new("ips");
    let br = HostBridge::reserve("ibr");
    let br2 = HostBridge::reserve("ib2");
    let (s0, s1) = (unique_subnet24(), unique_subnet24());
    pod.cluster_net(&br, s0, no_routes(), &[]);
    pod.ns.cleanup_host_link(br2.name());
    pod.nad(
        "static-net",
        json!({"cniVersion": "1.0.0", "name": "static-net", "plugins": [{
            "type": "bridge", "bridge": br2.name(), "capabilities": {"ips": true},
            "ipam": {"type": "static"},
        }]}),
    );
    let wanted = format!("{}/24", s1.host(77));
    let wanted2 = format!("{}/24", s1.host(78));
    pod.manifest(Some(
        &json!([{"name": "static-net", "ips": [wanted, wanted2]}]).to_string(),
    ));

    pod.add();

    let net1 = pod.link("net1");
    assert!(
        net1.has_addr(&wanted),
        "net1 lacks {wanted}: {:?}",
        net1.cidrs()
    );
    assert!(
        net1.has_addr(&wanted2),
        "net1 lacks {wanted2}: {:?}",
        net1.cidrs()
    );
    let e = entry(&pod.status(), "default/static-net", "net1").clone();
    let mut ips: Vec<&str> = e["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    ips.sort();
    assert_eq!(ips, vec![wanted.as_str(), wanted2.as_str()]);
    assert_entry_matches_kernel(&pod, &e);

    pod.cni("CHECK", &pod.conf()).ok();
    pod.del_and_assert_clean(&["cluster-net"], &[br.name(), br2.name()]);
}

#[test]
fn s4_1_2_1_4_mac_through_tuning_is_set_on_the_interface() {
    let pod = Pod::new("mac");
    let tuning = json!({"type": "tuning", "capabilities": {"mac": true}});
    let Side { br, br2, s1, .. } = pod.with_side_nad_plugins("mac-net", &[tuning]);
    // A locally administered unicast address that no kernel would pick at random for a veth.
    let mac = format!(
        "02:42:c6:{:02x}:{:02x}:2a",
        s1.third_octet,
        std::process::id() % 256
    );
    pod.manifest(Some(&json!([{"name": "mac-net", "mac": mac}]).to_string()));

    pod.add();

    assert_eq!(
        pod.link("net1").address.as_deref(),
        Some(mac.as_str()),
        "tuning set the requested MAC"
    );
    let e = entry(&pod.status(), "default/mac-net", "net1").clone();
    assert_eq!(e["mac"], mac.as_str());
    assert_entry_matches_kernel(&pod, &e);

    pod.cni("CHECK", &pod.conf()).ok();
    pod.del_and_assert_clean(&["cluster-net", "mac-net"], &[br.name(), br2.name()]);
}

fn tc_qdiscs(dev: &str) -> String {
    let out = Command::new("tc")
        .args(["qdisc", "show", "dev", dev])
        .output()
        .expect("run tc");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn s4_1_2_1_7_and_8_port_mappings_and_bandwidth_from_the_selection() {
    let pod = Pod::new("pmbw");
    let br = HostBridge::reserve("pbr");
    let br2 = HostBridge::reserve("pb2");
    let (s0, s1) = (unique_subnet24(), unique_subnet24());
    pod.cluster_net(&br, s0, no_routes(), &[]);
    pod.ns.cleanup_host_link(br2.name());
    let extra = [
        json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": false}),
        json!({"type": "bandwidth", "capabilities": {"bandwidth": true}}),
    ];
    let mut shaped = bridge_net("shaped", &br2, s1, &pod.ipam, no_routes(), &extra);
    // portmap 1.1.1's CHECK looks for its chain in ip6tables too and fails for an IPv4-only container.
    shaped["disableCheck"] = json!(true);
    pod.nad("shaped", shaped);
    let host_port = 20000 + (std::process::id() % 10000);
    pod.manifest(Some(
        &json!([{
            "name": "shaped",
            "portMappings": [{"hostPort": host_port, "containerPort": 8080, "protocol": "TCP"}],
            "bandwidth": {"ingressRate": 1_000_000, "ingressBurst": 100_000, "egressRate": 2_000_000, "egressBurst": 200_000},
        }])
        .to_string(),
    ));

    pod.add();

    let net1_ip = ip_of(
        &pod.link("net1")
            .cidrs()
            .into_iter()
            .find(|c| s1.contains(c))
            .expect("net1 address"),
    );
    let nat = iptables_nat();
    let dnat = format!("--dport {host_port} -j DNAT --to-destination {net1_ip}:8080");
    assert!(
        nat.contains(&dnat),
        "no `{dnat}` for the container in:\n{nat}"
    );
    assert!(
        nat.contains(&pod.id),
        "portmap rules carry the container id:\n{nat}"
    );
    let veths = pod.host_veths(&[br.name(), br2.name()]);
    let on_br2: Vec<String> = names(&host_links_on_bridge(br2.name()));
    assert_eq!(on_br2.len(), 1, "{on_br2:?}");
    assert!(veths.contains(&on_br2[0]), "{veths:?}");
    let qd = tc_qdiscs(&on_br2[0]);
    assert!(
        qd.contains("tbf"),
        "bandwidth shapes traffic into the pod on the host veth: {qd}"
    );
    assert!(
        qd.contains("ingress"),
        "egress is redirected from the host veth's ingress: {qd}"
    );
    // The egress side lives on an ifb that bandwidth names in its result.
    let ifb = veths.iter().find(|v| {
        host_link(v)
            .and_then(|l| l.kind().map(str::to_string))
            .as_deref()
            == Some("ifb")
    });
    let ifb = ifb
        .unwrap_or_else(|| panic!("no ifb among the host interfaces {veths:?}"))
        .clone();
    assert!(tc_qdiscs(&ifb).contains("tbf"), "egress shaping on {ifb}");
    // The cluster network got nothing of this (spec 7.5 in reverse: a selection's runtimeConfig is its own).
    let eth0_veth = veths
        .iter()
        .find(|v| host_link(v).and_then(|l| l.master).as_deref() == Some(br.name()))
        .unwrap();
    assert!(
        !tc_qdiscs(eth0_veth).contains("tbf"),
        "the cluster network is not shaped"
    );

    pod.cni("CHECK", &pod.conf()).ok();
    pod.del_and_assert_clean(&["cluster-net", "shaped"], &[br.name(), br2.name()]);
    let nat = iptables_nat();
    assert!(!nat.contains(&pod.id), "portmap rules outlived DEL:\n{nat}");
    assert!(!nat.contains(&dnat), "the DNAT rule outlived DEL");
    assert!(host_link(&ifb).is_none(), "{ifb} outlived DEL");
}

#[test]
fn s4_1_2_1_9_default_route_moves_to_the_requested_gateway() {
    let pod = Pod::new("dr");
    let Side { br, br2, s1, .. } = pod.with_side_nad_routes("exit", true, false);
    let gw = s1.host(1);
    pod.manifest(Some(
        &json!([{"name": "exit", "default-route": [gw]}]).to_string(),
    ));

    let result = pod.add();

    let defaults: Vec<_> = pod
        .ns
        .routes()
        .into_iter()
        .filter(|r| r.is_default())
        .collect();
    assert_eq!(defaults.len(), 1, "exactly one default route: {defaults:?}");
    assert_eq!(
        (defaults[0].gateway.as_deref(), defaults[0].dev.as_deref()),
        (Some(gw.as_str()), Some("net1")),
        "{defaults:?}"
    );
    let status = pod.status();
    assert_eq!(
        entry(&status, "default/exit", "net1")["default-route"],
        json!([gw])
    );
    assert!(entry(&status, "cluster-net", "eth0")
        .get("default-route")
        .is_none());
    // What plexus returns for the cluster network no longer claims the default route it lost.
    let claims_default = result["routes"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|r| r["dst"] == "0.0.0.0/0");
    assert!(
        !claims_default,
        "the cluster network's result still claims the default route: {result}"
    );

    pod.cni("CHECK", &pod.conf()).ok();
    pod.del_and_assert_clean(&["cluster-net", "exit"], &[br.name(), br2.name()]);
}

/// A dual-stack bridge + host-local list: `subnet` and `fd00:199:<n>::/64`, default routes with explicit gateways.
fn dual_stack_net(
    name: &str,
    bridge: &HostBridge,
    subnet: Subnet24,
    ipam: &IpamDir,
    default_routes: bool,
) -> Value {
    let v6 = v6_subnet(subnet);
    let routes = if default_routes {
        json!([{"dst": "0.0.0.0/0", "gw": subnet.host(1)}, {"dst": "::/0", "gw": format!("{v6}1")}])
    } else {
        json!([])
    };
    json!({"cniVersion": "1.0.0", "name": name, "plugins": [{
        "type": "bridge", "bridge": bridge.name(), "isGateway": true, "ipMasq": false,
        "ipam": {
            "type": "host-local", "dataDir": ipam.path(),
            "ranges": [
                [{"subnet": subnet.cidr(), "gateway": subnet.host(1)}],
                [{"subnet": format!("{v6}/64"), "gateway": format!("{v6}1")}],
            ],
            "routes": routes,
        },
    }]})
}

/// `fd00:199:<n>::` for a test subnet `10.199.<n>.0/24`.
fn v6_subnet(subnet: Subnet24) -> String {
    format!("fd00:199:{:x}::", subnet.third_octet)
}

#[test]
fn s4_1_2_1_9_default_route_moves_for_ipv4_and_ipv6() {
    let pod = Pod::new("dr6");
    let br = HostBridge::reserve("ebr");
    let br2 = HostBridge::reserve("eb2");
    let (s0, s1) = (unique_subnet24(), unique_subnet24());
    pod.ns.cleanup_host_link(br.name());
    pod.ns.cleanup_host_link(br2.name());
    pod.sb.conf_file(
        "00-cluster.conflist",
        &dual_stack_net("cluster-net", &br, s0, &pod.ipam, true),
    );
    pod.nad("exit", dual_stack_net("exit", &br2, s1, &pod.ipam, false));
    let (gw4, gw6) = (s1.host(1), format!("{}1", v6_subnet(s1)));
    pod.manifest(Some(
        &json!([{"name": "exit", "default-route": [gw4, gw6]}]).to_string(),
    ));

    let result = pod.add();

    let (eth0, net1) = (pod.link("eth0"), pod.link("net1"));
    for (link, subnet) in [(&eth0, s0), (&net1, s1)] {
        let v6 = v6_subnet(subnet);
        assert!(
            link.addr_info
                .iter()
                .any(|a| a.family == "inet6" && a.local.starts_with(&v6)),
            "{} has no address in {v6}/64: {:?}",
            link.ifname,
            link.cidrs()
        );
    }
    let d4: Vec<_> = pod
        .ns
        .routes()
        .into_iter()
        .filter(|r| r.is_default())
        .collect();
    let d6: Vec<_> = pod
        .ns
        .routes6()
        .into_iter()
        .filter(|r| r.is_default())
        .collect();
    assert_eq!(d4.len(), 1, "{d4:?}");
    assert_eq!(
        (d4[0].gateway.as_deref(), d4[0].dev.as_deref()),
        (Some(gw4.as_str()), Some("net1"))
    );
    assert_eq!(d6.len(), 1, "{d6:?}");
    let got6: Option<IpAddr> = d6[0].gateway.as_deref().and_then(|g| g.parse().ok());
    assert_eq!(
        (got6, d6[0].dev.as_deref()),
        (gw6.parse().ok(), Some("net1")),
        "{d6:?}"
    );
    assert_eq!(
        entry(&pod.status(), "default/exit", "net1")["default-route"],
        json!([gw4, gw6])
    );
    let routes = result["routes"].as_array().cloned().unwrap_or_default();
    assert!(
        !routes
            .iter()
            .any(|r| r["dst"] == "0.0.0.0/0" || r["dst"] == "::/0"),
        "the cluster network's result still claims a default route: {result}"
    );

    pod.cni("CHECK", &pod.conf()).ok();
    pod.del_and_assert_clean(&["cluster-net", "exit"], &[br.name(), br2.name()]);
}

#[test]
fn s4_2_same_network_twice_two_interfaces_two_reservations() {
    let pod = Pod::new("twice");
    let Side { br, br2, .. } = pod.with_side_nad("side");
    pod.manifest(Some("side,side"));

    pod.add();

    let (a, b) = (pod.link("net1"), pod.link("net2"));
    let res = pod.ipam.reservations("side");
    assert_eq!(res.len(), 2, "{res:?}");
    let mut ifnames: Vec<Option<&str>> = res.iter().map(|r| r.ifname.as_deref()).collect();
    ifnames.sort();
    assert_eq!(ifnames, vec![Some("net1"), Some("net2")]);
    assert!(res.iter().all(|r| r.container_id == pod.id), "{res:?}");
    for (link, r) in [
        (
            &a,
            res.iter()
                .find(|r| r.ifname.as_deref() == Some("net1"))
                .unwrap(),
        ),
        (
            &b,
            res.iter()
                .find(|r| r.ifname.as_deref() == Some("net2"))
                .unwrap(),
        ),
    ] {
        assert!(
            link.addr_info
                .iter()
                .any(|x| x.local.parse::<IpAddr>().ok() == Some(r.ip)),
            "{} lacks {}",
            link.ifname,
            r.ip
        );
    }
    assert_eq!(host_links_on_bridge(br2.name()).len(), 2);
    let status = pod.status();
    assert_eq!(
        status
            .iter()
            .filter(|e| e["name"] == "default/side")
            .count(),
        2,
        "{status:?}"
    );

    pod.cni("CHECK", &pod.conf()).ok();
    pod.del_and_assert_clean(&["cluster-net", "side"], &[br.name(), br2.name()]);
}

/// Everything observable inside a namespace: links (name, kind, mac, up, addresses) and both routing tables.
fn snapshot(ns: &NetNs) -> (Vec<String>, Vec<String>) {
    let links = ns
        .links()
        .into_iter()
        .map(|l| {
            format!(
                "{} {:?} {:?} up={} {:?}",
                l.ifname,
                l.kind(),
                l.address,
                l.is_up(),
                l.cidrs()
            )
        })
        .collect();
    let routes = ns
        .routes()
        .into_iter()
        .chain(ns.routes6())
        .map(|r| format!("{} {:?} {:?}", r.dst, r.gateway, r.dev))
        .collect();
    (links, routes)
}

#[test]
fn s7_2_failure_in_the_third_attachment_leaves_the_namespace_as_it_was() {
    let pod = Pod::new("fail3");
    let Side { br, br2, .. } = pod.with_side_nad("ok-net");
    let s2 = unique_subnet24();
    pod.nad("broken", macvlan_net("broken", "pxnosuch0", s2, &pod.ipam));
    pod.manifest(Some("ok-net,broken"));
    let before = snapshot(&pod.ns);

    let run = pod.cni("ADD", &pod.conf());

    let code = run.code();
    assert!(code != 0, "{}", run.stdout);
    let msg = run.msg();
    assert!(
        msg.contains("default/broken") && msg.contains("net2"),
        "the error names the network: {msg}"
    );
    assert_eq!(
        snapshot(&pod.ns),
        before,
        "the namespace changed although ADD failed"
    );
    for n in ["cluster-net", "ok-net", "broken"] {
        assert_eq!(pod.ipam.reservations(n), vec![], "{n} kept a reservation");
    }
    for b in [br.name(), br2.name()] {
        assert!(host_links_on_bridge(b).is_empty(), "host veths left on {b}");
    }
    assert_eq!(
        pod.sb.cached(),
        Vec::<String>::new(),
        "the plan outlived the rollback"
    );
    // The runtime's DEL after a failed ADD finds nothing and succeeds.
    pod.cni("DEL", &pod.conf()).ok();
}

#[test]
fn s4_1_2_1_5_and_6_interface_name_and_cni_args_reach_the_plugins() {
    let pod = Pod::new("ifargs");
    let Side { br, br2, s1, .. } = pod.with_side_nad("side");
    // host-local honours `args.cni.ips`: an address it would never pick first proves cni-args arrived.
    let wanted = s1.host(200);
    pod.manifest(Some(
        &json!([{"name": "side", "interface": "data0", "cni-args": {"ips": [wanted]}}]).to_string(),
    ));

    pod.add();

    let data0 = pod.link("data0");
    assert!(
        data0.has_addr(&format!("{wanted}/24")),
        "data0 lacks {wanted}: {:?}",
        data0.cidrs()
    );
    assert!(
        pod.ns.link("net1").is_none(),
        "the requested name replaces net1"
    );
    let res = pod.ipam.reservations("side");
    assert_eq!(res.len(), 1, "{res:?}");
    assert_eq!(
        (res[0].ip.to_string(), res[0].ifname.as_deref()),
        (wanted.clone(), Some("data0"))
    );
    assert_entry_matches_kernel(&pod, entry(&pod.status(), "default/side", "data0"));

    pod.cni("CHECK", &pod.conf()).ok();
    pod.del_and_assert_clean(&["cluster-net", "side"], &[br.name(), br2.name()]);
}

#[test]
fn s3_4_1_rule2_config_less_nad_uses_the_conf_dir_list_on_a_real_network() {
    let pod = Pod::new("confdir");
    let br = HostBridge::reserve("rbr");
    let br2 = HostBridge::reserve("rb2");
    let (s0, s1) = (unique_subnet24(), unique_subnet24());
    pod.cluster_net(&br, s0, no_routes(), &[]);
    pod.ns.cleanup_host_link(br2.name());
    pod.sb.nad(POD_NS, "ondisk", None);
    pod.sb.conf_file(
        "50-ondisk.conflist",
        &bridge_net("ondisk", &br2, s1, &pod.ipam, no_routes(), &[]),
    );
    pod.manifest(Some("ondisk"));

    pod.add();

    let net1 = pod.link("net1");
    assert!(
        net1.cidrs().iter().any(|c| s1.contains(c)),
        "net1 is on the on-disk network: {:?}",
        net1.cidrs()
    );
    assert_eq!(pod.ipam.reservations("ondisk").len(), 1);
    pod.cni("CHECK", &pod.conf()).ok();
    pod.del_and_assert_clean(&["cluster-net", "ondisk"], &[br.name(), br2.name()]);
}

#[test]
fn add_repeated_without_del_replaces_the_attachments_without_leaking() {
    let pod = Pod::new("again");
    let Side { br, br2, .. } = pod.with_side_nad("side");
    pod.manifest(Some("side"));
    pod.add();
    let first_veths = pod.host_veths(&[br.name(), br2.name()]);

    // A runtime that timed out waiting for ADD retries it.
    let result = pod.add();

    let (addr, _) = result_addr(&result, "eth0");
    assert!(
        pod.link("eth0").has_addr(&addr),
        "eth0 carries the second ADD's address"
    );
    pod.link("net1");
    for v in &first_veths {
        assert!(host_link(v).is_none(), "{v} from the first ADD leaked");
    }
    for (n, b) in [("cluster-net", br.name()), ("side", br2.name())] {
        assert_eq!(pod.ipam.reservations(n).len(), 1, "one reservation in {n}");
        assert_eq!(host_links_on_bridge(b).len(), 1, "one host veth on {b}");
    }
    pod.cni("CHECK", &pod.conf()).ok();
    pod.del_and_assert_clean(&["cluster-net", "side"], &[br.name(), br2.name()]);
}

#[test]
fn s4_1_2_1_9_empty_default_route_list_clears_every_default_route() {
    let pod = Pod::new("drnone");
    let Side { br, br2, s1, .. } = pod.with_side_nad_routes("isolated", true, true);
    pod.manifest(Some(
        &json!([{"name": "isolated", "default-route": []}]).to_string(),
    ));
    let before_add = pod.ns.routes();
    assert!(!before_add.iter().any(|r| r.is_default()));

    pod.add();

    let defaults: Vec<_> = pod
        .ns
        .routes()
        .into_iter()
        .filter(|r| r.is_default())
        .collect();
    assert_eq!(
        defaults.len(),
        0,
        "no default route may remain: {defaults:?}"
    );
    assert!(
        pod.ns.routes().iter().any(|r| r.dst == s1.cidr()),
        "the subnet routes stay"
    );
    pod.cni("CHECK", &pod.conf()).ok();
    pod.del_and_assert_clean(&["cluster-net", "isolated"], &[br.name(), br2.name()]);
}

#[test]
fn del_works_from_the_cache_after_the_pod_and_nads_are_gone() {
    let pod = Pod::new("gone");
    let Side { br, br2, .. } = pod.with_side_nad("side");
    pod.manifest(Some("side"));
    pod.add();
    pod.link("net1");

    for entry in std::fs::read_dir(pod.sb.path("cluster")).unwrap().flatten() {
        if entry.path().is_file() {
            std::fs::remove_file(entry.path()).unwrap();
        }
    }
    std::fs::remove_file(pod.sb.path("net.d/00-cluster.conflist")).unwrap();

    pod.cni("CHECK", &pod.conf()).ok();
    pod.del_and_assert_clean(&["cluster-net", "side"], &[br.name(), br2.name()]);
}

#[test]
fn s4_1_2_1_3_ips_a_plugin_ignored_fail_the_pod_and_are_rolled_back() {
    let pod = Pod::new("ipsno");
    // The list claims the ips capability (on tuning, which ignores it), so the capability check passes, but
    // host-local never sees the request and hands out the range's first address.
    let tuning = json!({"type": "tuning", "capabilities": {"ips": true}});
    let Side { br, br2, s1, .. } = pod.with_side_nad_plugins("liar", &[tuning]);
    let wanted = format!("{}/24", s1.host(123));
    pod.manifest(Some(
        &json!([{"name": "liar", "ips": [wanted]}]).to_string(),
    ));
    let before = snapshot(&pod.ns);

    let run = pod.cni("ADD", &pod.conf());

    assert!(run.code() != 0, "{}", run.stdout);
    let msg = run.msg();
    assert!(
        msg.contains(&wanted) && msg.contains("default/liar"),
        "the error names ip and network: {msg}"
    );
    assert_eq!(
        snapshot(&pod.ns),
        before,
        "the namespace changed although ADD failed"
    );
    for n in ["cluster-net", "liar"] {
        assert_eq!(pod.ipam.reservations(n), vec![], "{n} kept a reservation");
    }
    for b in [br.name(), br2.name()] {
        assert!(host_links_on_bridge(b).is_empty(), "host veths left on {b}");
    }
    assert_eq!(pod.sb.cached(), Vec::<String>::new());
}

#[test]
fn kubernetes_args_without_ignore_unknown_reach_the_real_bridge_plugin() {
    // Runtimes that do not add IgnoreUnknown=1 themselves: bridge and host-local load CNI_ARGS strictly and
    // would refuse the K8S_POD_* keys; plexus adds IgnoreUnknown=1 for its delegates, as Multus does.
    let pod = Pod::new("k8sargs");
    let Side { br, br2, .. } = pod.with_side_nad("side");
    pod.manifest(Some("side"));
    let args = format!(
        "K8S_POD_NAMESPACE={POD_NS};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID=uid-{}",
        pod.name, pod.id, pod.name
    );
    pod.cni_with_args("ADD", &pod.conf(), &args).ok();
    pod.link("eth0");
    pod.link("net1");
    let veths = pod.host_veths(&[br.name(), br2.name()]);
    pod.cni_with_args("DEL", &pod.conf(), &args).ok();
    assert_eq!(names(&pod.ns.links()), vec!["lo"]);
    for v in &veths {
        assert!(host_link(v).is_none(), "host veth {v} survived DEL");
    }
    assert_eq!(pod.ipam.reservations("side"), vec![]);
    assert_eq!(pod.ipam.reservations("cluster-net"), vec![]);
}

#[test]
fn del_without_a_cache_releases_what_still_resolves_when_a_nad_is_gone() {
    let pod = Pod::new("lostcache");
    let _side = pod.with_side_nad("side");
    // A second NAD on a bridge of its own: deleted before the DEL.
    let br3 = HostBridge::reserve("dbr");
    pod.ns.cleanup_host_link(br3.name());
    pod.nad(
        "doomed",
        bridge_net(
            "doomed",
            &br3,
            unique_subnet24(),
            &pod.ipam,
            no_routes(),
            &[],
        ),
    );
    pod.manifest(Some("doomed,side"));
    pod.add();
    for n in ["cluster-net", "doomed", "side"] {
        assert_eq!(pod.ipam.reservations(n).len(), 1, "{n}");
    }
    // The cache is lost (disk wiped, cacheDir changed) and the NAD deleted.
    std::fs::remove_dir_all(pod.sb.path("cache")).unwrap();
    std::fs::remove_file(pod.sb.path(&format!("cluster/nad-{POD_NS}-doomed.json"))).unwrap();

    let run = pod.cni("DEL", &pod.conf());
    run.ok();
    assert!(
        run.stderr.contains("cannot release") && run.stderr.contains("default/doomed"),
        "{}",
        run.stderr
    );
    // The cluster network and `side` (net2, the name its ADD gave it) are released, addresses and interfaces.
    assert_eq!(pod.ipam.reservations("cluster-net"), vec![]);
    assert_eq!(pod.ipam.reservations("side"), vec![]);
    let left = names(&pod.ns.links());
    assert!(
        !left.contains(&"eth0".to_string()) && !left.contains(&"net2".to_string()),
        "{left:?}"
    );
    // Only the deleted NAD's attachment is left (nothing says how to undo it), as the log says.
    assert!(left.contains(&"net1".to_string()), "{left:?}");
    assert_eq!(pod.ipam.reservations("doomed").len(), 1);
}

/// NRI mode reads the cluster network's result from the sandbox the runtime's CNI set up, in-process: the interface
/// read in a real namespace has its MAC, its global addresses of both families with their prefix lengths and the
/// gateways of its own default routes; its link-local address, another interface's addresses and routes, and the
/// daemon's own namespace (where the test runs) do not leak in.
#[test]
fn the_cluster_networks_interface_reads_from_its_namespace_as_a_result() {
    require_root_and_plugins();
    let ns = NetNs::new("ifread");
    let net = unique_subnet24();
    ns.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "net1",
    ]);
    for args in [
        vec!["link", "set", "eth0", "address", "0a:58:0a:01:02:03"],
        vec!["link", "set", "eth0", "up"],
        vec!["link", "set", "net1", "up"],
        vec!["addr", "add", &format!("{}/24", net.host(5)), "dev", "eth0"],
        vec!["addr", "add", "fd00:5::5/64", "dev", "eth0", "nodad"],
        vec!["addr", "add", "192.168.77.2/24", "dev", "net1"],
        vec![
            "route",
            "add",
            "default",
            "via",
            &net.host(1),
            "dev",
            "eth0",
        ],
        vec![
            "-6",
            "route",
            "add",
            "default",
            "via",
            "fd00:5::1",
            "dev",
            "eth0",
        ],
    ] {
        ns.ip(&args);
    }
    let netns = ns.path().to_str().unwrap();
    let result = plexus_cni::podnet::interface_result(netns, "eth0", "1.1.0").unwrap();
    assert_eq!(
        result,
        json!({"cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "mac": "0a:58:0a:01:02:03", "sandbox": netns}],
            "ips": [{"address": format!("{}/24", net.host(5)), "interface": 0, "gateway": net.host(1)},
                    {"address": "fd00:5::5/64", "interface": 0, "gateway": "fd00:5::1"}]})
    );
    // net1 has an address and no default route.
    let other = plexus_cni::podnet::interface_result(netns, "net1", "1.1.0").unwrap();
    assert_eq!(
        other["ips"],
        json!([{"address": "192.168.77.2/24", "interface": 0}])
    );
    // The reader's thread left the daemon's namespace alone: the host has no eth0 of the pod's.
    assert!(plexus_cni::podnet::interface_result("/proc/self/ns/net", "net1", "1.1.0").is_err());
    let missing = plexus_cni::podnet::interface_result(netns, "eth9", "1.1.0").unwrap_err();
    assert!(missing.to_string().contains("eth9"), "{missing}");
    let gone =
        plexus_cni::podnet::interface_result("/run/netns/plexus-no-such-ns", "eth0", "1.1.0")
            .unwrap_err();
    assert!(gone.to_string().contains("plexus-no-such-ns"), "{gone}");

    // A sandbox known by its address alone: its namespace is found among the pinned ones by its eth0's address,
    // not by another interface's, and none holds an address of the subnet that no interface has.
    // The scan runs over a directory of the test's own, linking this namespace (the node's `/run/netns` holds other
    // tests' namespaces, whose addresses may be the same).
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("ns");
    std::os::unix::fs::symlink(ns.path(), &link).unwrap();
    let holding = |ifname: &str, ips: &[std::net::IpAddr]| {
        plexus_cni::podnet::namespace_holding(dir.path(), ifname, ips)
    };
    assert_eq!(
        holding("eth0", &[ip(&net.host(9)), ip(&net.host(5))]),
        Some(link.clone())
    );
    assert_eq!(holding("eth0", &[ip("fd00:5::5")]), Some(link.clone()));
    assert_eq!(holding("net1", &[ip(&net.host(5))]), None);
    assert_eq!(holding("eth0", &[ip(&net.host(9))]), None);
    assert_eq!(holding("eth0", &[]), None);
}
