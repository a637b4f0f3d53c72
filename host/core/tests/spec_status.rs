//! Multi-net spec 5: the status annotation `k8s.v1.cni.cncf.io/network-status`.

use std::net::IpAddr;

use plexus_core::spec::{
    default_gateways, network_status, status_annotation_value, status_default_route,
    validate_status_entries, Dns, NetworkStatus,
};
use serde_json::{json, Map, Value};

fn golden(result: &str, expected: &str, name: &str, ifname: &str, is_default: bool) {
    let result: Value = serde_json::from_str(result).unwrap();
    let want: Value = serde_json::from_str(expected).unwrap();
    let got = network_status(name, Some(&result), ifname, is_default);
    assert_eq!(got.to_json(), want);
    // What we produce is valid when it is the one default entry.
    let mut entry = got.clone();
    entry.default = true;
    validate_status_entries(&[entry.to_json()]).unwrap();
}

#[test]
fn s5_3_3_1_legacy_result_ips_from_ip4_ip6_interface_from_ifname() {
    golden(
        include_str!("../../../tests/data/spec/status/result-0.2.0.json"),
        include_str!("../../../tests/data/spec/status/result-0.2.0.status.json"),
        "ns1/legacy",
        "net1",
        false,
    );
}

#[test]
fn s5_3_3_1_rule1_ips_of_first_sandbox_interface_only() {
    golden(
        include_str!("../../../tests/data/spec/status/result-0.3.1.json"),
        include_str!("../../../tests/data/spec/status/result-0.3.1.status.json"),
        "namespace-b/some-network",
        "net1",
        false,
    );
}

#[test]
fn s5_1_1_first_sandbox_interface_gives_interface_mac_mtu() {
    golden(
        include_str!("../../../tests/data/spec/status/result-1.0.0.json"),
        include_str!("../../../tests/data/spec/status/result-1.0.0.status.json"),
        "namespace-a/cluster-wide-default",
        "eth0",
        true,
    );
}

#[test]
fn s5_3_3_1_rule2_no_interfaces_takes_unbound_ips() {
    golden(
        include_str!("../../../tests/data/spec/status/result-1.1.0-no-interfaces.json"),
        include_str!("../../../tests/data/spec/status/result-1.1.0-no-interfaces.status.json"),
        "ns1/ipam-only",
        "net2",
        false,
    );
}

#[test]
fn s5_3_3_1_rule2_no_valid_sandbox_takes_negative_index_ips() {
    golden(
        include_str!("../../../tests/data/spec/status/result-0.4.0-no-sandbox.json"),
        include_str!("../../../tests/data/spec/status/result-0.4.0-no-sandbox.status.json"),
        "ns1/bridge",
        "net1",
        false,
    );
}

#[test]
fn s5_3_3_1_rule1_sandbox_without_matching_ips_omits_ips() {
    let r = json!({"cniVersion": "1.0.0",
        "interfaces": [{"name": "net1", "sandbox": "/ns"}],
        "ips": [{"address": "10.0.0.1/24"}, {"interface": 3, "address": "10.0.0.2/24"}]});
    let st = network_status("ns/n", Some(&r), "net1", false);
    assert!(st.ips.is_empty());
    assert_eq!(
        st.to_json(),
        json!({"name": "ns/n", "interface": "net1", "default": false})
    );
}

#[test]
fn s5_1_1_no_result_gives_minimal_map() {
    let st = network_status("ns/net-a", None, "net1", false);
    assert_eq!(
        st.to_json(),
        json!({"name": "ns/net-a", "interface": "net1", "default": false})
    );
    // A result that is not an object is treated the same way.
    let st = network_status("ns/net-a", Some(&json!("junk")), "net1", false);
    assert_eq!(
        st.to_json(),
        json!({"name": "ns/net-a", "interface": "net1", "default": false})
    );
}

#[test]
fn s5_3_2_1_interface_name_comes_from_result_not_ifname() {
    let r = json!({"cniVersion": "1.1.0", "interfaces": [{"name": "renamed0", "sandbox": "/ns"}]});
    assert_eq!(
        network_status("ns/n", Some(&r), "net1", false)
            .interface
            .as_deref(),
        Some("renamed0")
    );
}

#[test]
fn s5_3_legacy_detected_without_cni_version() {
    let r = json!({"ip4": {"ip": "10.0.0.2/24"}});
    assert_eq!(
        network_status("ns/n", Some(&r), "net1", false).ips,
        ["10.0.0.2/24"]
    );
    let r = json!({"ips": [{"address": "10.0.0.3/24"}]});
    assert_eq!(
        network_status("ns/n", Some(&r), "net1", false).ips,
        ["10.0.0.3/24"]
    );
    let r = json!({"cniVersion": "0.1.0", "ip4": {"ip": "10.0.0.4/24"}});
    assert_eq!(
        network_status("ns/n", Some(&r), "net1", false).ips,
        ["10.0.0.4/24"]
    );
}

#[test]
fn s5_3_7_dns_from_result_omitted_when_empty() {
    let r = json!({"cniVersion": "1.0.0", "dns": {"nameservers": [], "domain": "", "search": [], "options": ["ndots:2"]}});
    let st = network_status("ns/n", Some(&r), "net1", false);
    assert_eq!(st.dns, None);
    let r = json!({"cniVersion": "1.0.0", "dns": {"domain": "corp.example"}});
    let st = network_status("ns/n", Some(&r), "net1", false);
    assert_eq!(st.to_json()["dns"], json!({"domain": "corp.example"}));
    let explicit_empty = NetworkStatus {
        name: "x".into(),
        dns: Some(Dns::default()),
        ..Default::default()
    };
    assert_eq!(
        explicit_empty.to_json(),
        json!({"name": "x", "default": false})
    );
}

#[test]
fn s5_3_serialization_uses_spec_key_names() {
    let mut extra = Map::new();
    extra.insert("org.example.plexus/zone".into(), json!("a"));
    let st = NetworkStatus {
        name: "namespace-a/cluster-wide-default".into(),
        interface: Some("eth5".into()),
        ips: vec!["192.0.2.2/24".into(), "2001:db8::2230/32".into()],
        mac: Some("02:11:22:33:44:54".into()),
        mtu: Some(1500),
        default: true,
        dns: Some(Dns {
            nameservers: vec!["192.0.2.1".into()],
            domain: None,
            search: vec!["example.com".into()],
        }),
        default_route: Some(vec!["192.0.2.1".into()]),
        device_info: Some(
            json!({"type": "pci", "version": "1.0.0", "pci": {"pci-address": "0000:18:02.5"}}),
        ),
        extra,
    };
    let v = st.to_json();
    assert_eq!(
        v,
        json!({
            "name": "namespace-a/cluster-wide-default",
            "interface": "eth5",
            "ips": ["192.0.2.2/24", "2001:db8::2230/32"],
            "mac": "02:11:22:33:44:54",
            "mtu": 1500,
            "default": true,
            "dns": {"nameservers": ["192.0.2.1"], "search": ["example.com"]},
            "default-route": ["192.0.2.1"],
            "device-info": {"type": "pci", "version": "1.0.0", "pci": {"pci-address": "0000:18:02.5"}},
            "org.example.plexus/zone": "a"
        })
    );
    let back: NetworkStatus = serde_json::from_value(v).unwrap();
    assert_eq!(back, st);
    let text = status_annotation_value(std::slice::from_ref(&st));
    assert!(text.starts_with("[{\"name\":"));
    validate_status_entries(&serde_json::from_str::<Vec<Value>>(&text).unwrap()).unwrap();
}

#[test]
fn s5_3_empty_fields_omitted_default_always_present() {
    let st = NetworkStatus {
        name: "n".into(),
        interface: Some(String::new()),
        mac: Some(String::new()),
        default_route: Some(vec![]),
        ..Default::default()
    };
    assert_eq!(st.to_json(), json!({"name": "n", "default": false}));
}

#[test]
fn s5_3_7_4_default_route_only_when_selection_had_the_key() {
    let r = json!({"cniVersion": "1.0.0",
        "ips": [{"address": "10.0.0.5/24", "gateway": "10.0.0.1"}, {"address": "fd00::5/64", "gateway": "fd00::1"}],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0", "gw": "fd00::fe"}, {"dst": "10.1.0.0/16", "gw": "10.0.0.9"}]});
    assert_eq!(default_gateways(&r), ["10.0.0.1", "fd00::fe"]);
    assert_eq!(status_default_route(None, Some(&r)), None);
    let req: Vec<IpAddr> = vec!["10.0.0.254".parse().unwrap()];
    assert_eq!(
        status_default_route(Some(&req), Some(&r)),
        Some(vec!["10.0.0.1".into(), "fd00::fe".into()])
    );
    assert_eq!(
        status_default_route(Some(&req), None),
        Some(vec!["10.0.0.254".into()])
    );
    assert_eq!(status_default_route(Some(&[]), None), Some(vec![]));
}

#[test]
fn s5_3_7_4_default_gateways_from_legacy_result() {
    let r: Value = serde_json::from_str(include_str!(
        "../../../tests/data/spec/status/result-0.2.0.json"
    ))
    .unwrap();
    assert_eq!(default_gateways(&r), ["10.1.0.1", "2001:db8::1"]);
}

#[test]
fn s5_2_exactly_one_default_entry() {
    let a = json!({"name": "ns/default", "default": true});
    let b = json!({"name": "ns/b", "default": false});
    assert!(validate_status_entries(&[b.clone(), a.clone()]).is_ok());
    let e = validate_status_entries(std::slice::from_ref(&b)).unwrap_err();
    assert!(
        e.to_string().contains("no element has \"default\": true"),
        "{e}"
    );
    let e = validate_status_entries(&[a.clone(), b, a]).unwrap_err();
    assert_eq!(e.index, Some(2));
    assert!(
        e.to_string().starts_with("network-status element 2:"),
        "{e}"
    );
}

#[test]
fn s5_3_reserved_keys_rejected_period_keys_allowed() {
    let ok = json!({"name": "n", "default": true, "org.example/x": {"any": 1}});
    assert!(validate_status_entries(&[ok]).is_ok());
    // The 5.4 example's "infiniband-guid" is accepted; its "device" (no period, not in 5.3) is not.
    let ib = json!({"name": "n", "default": true, "infiniband-guid": "80:00:11:22"});
    assert!(validate_status_entries(&[ib]).is_ok());
    let bad = json!({"name": "n", "default": true, "device": {"type": "vhost-user"}});
    let e = validate_status_entries(&[bad]).unwrap_err();
    assert!(
        e.to_string().contains("\"device\" is not a status key"),
        "{e}"
    );
}

#[test]
fn s5_3_1_name_required() {
    let e = validate_status_entries(&[json!({"default": true})]).unwrap_err();
    assert!(e.to_string().contains("\"name\" is required"), "{e}");
    assert!(validate_status_entries(&[json!({"name": "", "default": true})]).is_err());
    assert!(validate_status_entries(&[json!({"name": 1, "default": true})]).is_err());
}

#[test]
fn s5_3_6_default_required_boolean() {
    let e = validate_status_entries(&[json!({"name": "a", "default": true}), json!({"name": "b"})])
        .unwrap_err();
    assert_eq!(e.index, Some(1));
    assert!(e.to_string().contains("\"default\" is required"));
    assert!(validate_status_entries(&[json!({"name": "a", "default": "true"})]).is_err());
}

#[test]
fn s5_3_4_mac_requires_interface() {
    let e = validate_status_entries(&[
        json!({"name": "a", "default": true, "mac": "02:11:22:33:44:55"}),
    ])
    .unwrap_err();
    assert!(e.to_string().contains("\"interface\" is not"), "{e}");
}

#[test]
fn s5_3_key_types_checked() {
    for (bad, needle) in [
        (json!({"interface": 1}), "\"interface\""),
        (json!({"interface": "a", "mac": 1}), "\"mac\""),
        (json!({"ips": "10.0.0.1"}), "\"ips\""),
        (json!({"ips": ["nope"]}), "is not an IP address"),
        (json!({"mtu": -1}), "\"mtu\""),
        (json!({"mtu": 1.5}), "\"mtu\""),
        (json!({"dns": []}), "\"dns\""),
        (
            json!({"dns": {"nameservers": "1.1.1.1"}}),
            "\"nameservers\"",
        ),
        (json!({"dns": {"domain": 3}}), "\"domain\""),
        (json!({"default-route": ["x"]}), "\"default-route\""),
        (json!({"device-info": {"type": "pci"}}), "\"version\""),
        (json!({"device-info": "pci"}), "\"device-info\""),
    ] {
        let mut entry = bad.as_object().unwrap().clone();
        entry.insert("name".into(), json!("n"));
        entry.insert("default".into(), json!(true));
        let e = validate_status_entries(&[Value::Object(entry)]).unwrap_err();
        assert!(e.to_string().contains(needle), "{bad}: {e}");
    }
    assert!(validate_status_entries(&[json!("x")]).is_err());
}

#[test]
fn s5_4_spec_example_entries_validate() {
    // The 5.4 "with a single gateway" example, without its non-spec "infiniband-guid" key and with the
    // one default entry.
    let entries = json!([
        {"name": "namespace-a/cluster-wide-default", "interface": "eth5",
         "ips": ["192.0.2.2/24", "2001:db8::2230/32"], "mac": "02:11:22:33:44:54", "mtu": 1500,
         "default-route": ["192.0.2.1"], "default": true},
        {"name": "namespace-b/some-network", "interface": "eth1",
         "ips": ["192.0.2.2/24", "2001:db8::2234/32"], "mac": "02:11:22:33:44:55",
         "dns": {"nameservers": ["192.0.2.1", "2001:db8:4860::8888"], "search": ["eng.example.com", "example.com"]},
         "default": false},
        {"name": "namespace-b/sriov-network_a", "interface": "net1", "default": false,
         "device-info": {"type": "pci", "version": "1.0.0", "pci": {"pci-address": "0000:18:02.5", "pf-pci-address": "0000:18:00.0"}}}
    ]);
    validate_status_entries(entries.as_array().unwrap()).unwrap();
}

#[test]
fn s5_3_extension_keys_are_reverse_domain_names() {
    for key in [".tag", "tag.", "io..plexus"] {
        let bad = json!({"name": "n", "default": true, key: 1});
        assert!(validate_status_entries(&[bad]).is_err(), "{key}");
    }
}
