//! The CNI Delegating Plugin requirements of 4.1.2.1.x: runtimeConfig, capabilities, args.cni.

use plexus_core::spec::{
    check_capabilities, config_plugins, filter_runtime_config, has_capability,
    inject_runtime_config, merge_cni_args, merge_cni_args_into_config, parse_selections,
    CapabilityError, Selection, DEFAULT_BURST_BITS, IPAM_CLAIM_REFERENCE_ARG,
};
use serde_json::{json, Map, Value};

fn one(annotation: &str) -> Selection {
    parse_selections(annotation, "ns").unwrap().remove(0)
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("{other} is not an object"),
    }
}

#[test]
fn s4_1_2_1_runtime_config_all_keys_golden() {
    let s = one(include_str!(
        "../../../tests/data/spec/selection/all_keys.annotation"
    ));
    let want: Value = serde_json::from_str(include_str!(
        "../../../tests/data/spec/selection/all_keys.runtime_config.json"
    ))
    .unwrap();
    assert_eq!(Value::Object(s.runtime_config()), want);
}

#[test]
fn s4_1_2_1_3_2_ips_runtime_config_spec_example() {
    let s = one(r#"[{"name": "net-b", "ips": ["10.2.2.42/24", "2001:db8::5/64"]}]"#);
    assert_eq!(
        Value::Object(s.runtime_config()),
        json!({"ips": ["10.2.2.42/24", "2001:db8::5/64"]})
    );
    assert_eq!(s.required_capabilities(), ["ips"]);
}

#[test]
fn s4_1_2_1_4_2_mac_runtime_config_spec_example() {
    let s = one(r#"[{"name": "net-b", "mac": "02:23:45:67:89:01"}]"#);
    assert_eq!(
        Value::Object(s.runtime_config()),
        json!({"mac": "02:23:45:67:89:01"})
    );
    assert_eq!(s.required_capabilities(), ["mac"]);
}

#[test]
fn s4_1_2_1_10_2_infiniband_guid_runtime_config_spec_example() {
    let s = one(r#"[{"name": "net-b", "infiniband-guid": "24:8a:07:03:00:8d:ae:2f"}]"#);
    assert_eq!(
        Value::Object(s.runtime_config()),
        json!({"infinibandGUID": "24:8a:07:03:00:8d:ae:2f"})
    );
    assert_eq!(s.required_capabilities(), ["infinibandGUID"]);
}

#[test]
fn s4_1_2_1_7_2_port_mappings_runtime_config_lowercase_protocol() {
    let s = one(r#"[{"name": "net-b", "portMappings": [
        { "hostPort": 8080, "containerPort": 80, "protocol": "TCP" },
        { "hostPort": 8000, "containerPort": 8001, "protocol": "udp", "hostIP": "192.0.2.7" },
        { "hostPort": 9, "containerPort": 9 }]}]"#);
    assert_eq!(
        Value::Object(s.runtime_config()),
        json!({"portMappings": [
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 8000, "containerPort": 8001, "protocol": "udp", "hostIP": "192.0.2.7"},
            {"hostPort": 9, "containerPort": 9, "protocol": "tcp"}
        ]})
    );
    assert_eq!(s.required_capabilities(), ["portMappings"]);
}

#[test]
fn s4_1_2_1_8_2_bandwidth_runtime_config_with_default_bursts() {
    // The reference bandwidth plugin refuses a rate without a burst, and a burst of 4 GiB or more.
    assert_eq!(DEFAULT_BURST_BITS, 2_147_483_647);
    assert!(DEFAULT_BURST_BITS / 8 < u64::from(u32::MAX));
    let s = one(
        r#"[{"name": "net-b", "bandwidth": {"ingressRate": 2048, "ingressBurst": 300, "egressRate": 8000, "egressBurst": 200}}]"#,
    );
    assert_eq!(
        Value::Object(s.runtime_config()),
        json!({"bandwidth": {"ingressRate": 2048, "ingressBurst": 300, "egressRate": 8000, "egressBurst": 200}})
    );
    let s = one(r#"[{"name": "net-b", "bandwidth": {"egressRate": 8000}}]"#);
    assert_eq!(
        Value::Object(s.runtime_config()),
        json!({"bandwidth": {"egressRate": 8000, "egressBurst": DEFAULT_BURST_BITS}})
    );
    assert_eq!(s.required_capabilities(), ["bandwidth"]);
}

#[test]
fn s4_1_2_1_runtime_config_empty_without_keys() {
    let s = one("net-a@eth9");
    assert!(s.runtime_config().is_empty());
    assert!(s.required_capabilities().is_empty());
    assert!(s.delegate_cni_args().is_none());
    assert!(check_capabilities(&s.required_capabilities(), &[], "ns/net-a").is_ok());
}

#[test]
fn s4_1_2_1_required_capabilities_order() {
    let s = one(include_str!(
        "../../../tests/data/spec/selection/all_keys.annotation"
    ));
    assert_eq!(
        s.required_capabilities(),
        ["ips", "mac", "infinibandGUID", "portMappings", "bandwidth"]
    );
}

#[test]
fn s4_1_2_1_3_2_missing_capability_fails_the_attachment() {
    let plugins = config_plugins(&json!({
        "cniVersion": "1.0.0", "name": "n",
        "plugins": [
            {"type": "macvlan", "capabilities": {"ips": true}},
            {"type": "tuning", "capabilities": {"mac": false}},
            {"type": "x", "capabilities": {"mac": "true"}}
        ]
    }));
    assert_eq!(plugins.len(), 3);
    assert!(check_capabilities(&["ips"], &plugins, "ns/net-b").is_ok());
    let e = check_capabilities(&["ips", "mac"], &plugins, "ns/net-b").unwrap_err();
    assert_eq!(
        e,
        CapabilityError {
            network: "ns/net-b".into(),
            capability: "mac".into()
        }
    );
    let msg = e.to_string();
    assert!(msg.contains("ns/net-b") && msg.contains("\"mac\""), "{msg}");
}

#[test]
fn s4_1_2_1_7_2_and_8_2_capability_checks() {
    let s = one(
        r#"[{"name": "n", "portMappings": [{"hostPort": 1, "containerPort": 1}], "bandwidth": {"ingressRate": 1}}]"#,
    );
    let pm = obj(json!({"type": "portmap", "capabilities": {"portMappings": true}}));
    let bw = obj(json!({"type": "bandwidth", "capabilities": {"bandwidth": true}}));
    assert!(check_capabilities(
        &s.required_capabilities(),
        &[pm.clone(), bw.clone()],
        "ns/n"
    )
    .is_ok());
    assert_eq!(
        check_capabilities(&s.required_capabilities(), &[pm], "ns/n")
            .unwrap_err()
            .capability,
        "bandwidth"
    );
    assert_eq!(
        check_capabilities(&s.required_capabilities(), &[bw], "ns/n")
            .unwrap_err()
            .capability,
        "portMappings"
    );
}

#[test]
fn s4_1_2_1_3_2_single_conf_is_its_own_plugin_list() {
    let p = config_plugins(&json!({"type": "bridge", "capabilities": {"mac": true}}));
    assert_eq!(p.len(), 1);
    assert!(has_capability(&p[0], "mac"));
    assert!(!has_capability(&p[0], "ips"));
}

#[test]
fn s4_1_2_1_runtime_config_filtered_per_plugin_capabilities() {
    let s = one(include_str!(
        "../../../tests/data/spec/selection/all_keys.annotation"
    ));
    let rc = s.runtime_config();
    let plugin = obj(json!({"type": "tuning", "capabilities": {"mac": true, "bandwidth": false}}));
    assert_eq!(
        Value::Object(filter_runtime_config(&rc, &plugin)),
        json!({"mac": "02:23:45:67:89:01"})
    );
    assert!(filter_runtime_config(&rc, &obj(json!({"type": "x"}))).is_empty());
}

#[test]
fn s4_1_2_1_6_2_cni_args_annotation_wins_over_config_args() {
    let mut plugin = obj(json!({
        "type": "sriov",
        "args": {"cni": {"spoofchk": "off", "trust": "on"}, "other": 1}
    }));
    let s = one(r#"[{"name": "net-b", "cni-args": {"spoofchk": "on", "vlan": 5}}]"#);
    merge_cni_args(&mut plugin, &s.delegate_cni_args().unwrap());
    assert_eq!(
        Value::Object(plugin),
        json!({
            "type": "sriov",
            "args": {"cni": {"spoofchk": "on", "trust": "on", "vlan": 5}, "other": 1}
        })
    );
}

#[test]
fn s4_1_2_1_6_2_cni_args_created_when_config_has_none() {
    let mut plugin = obj(json!({"type": "x"}));
    merge_cni_args(&mut plugin, &obj(json!({"a": "b"})));
    assert_eq!(
        Value::Object(plugin),
        json!({"type": "x", "args": {"cni": {"a": "b"}}})
    );
    let mut plugin = obj(json!({"type": "x", "args": {"labels": []}}));
    merge_cni_args(&mut plugin, &obj(json!({"a": "b"})));
    assert_eq!(plugin["args"], json!({"labels": [], "cni": {"a": "b"}}));
    // Invalid (non-object) args are replaced.
    let mut plugin = obj(json!({"type": "x", "args": "junk"}));
    merge_cni_args(&mut plugin, &obj(json!({"a": "b"})));
    assert_eq!(plugin["args"], json!({"cni": {"a": "b"}}));
    let mut plugin = obj(json!({"type": "x", "args": {"cni": 3}}));
    merge_cni_args(&mut plugin, &obj(json!({"a": "b"})));
    assert_eq!(plugin["args"], json!({"cni": {"a": "b"}}));
}

#[test]
fn s4_1_2_1_6_2_cni_args_merged_into_every_plugin_of_a_list() {
    let mut conf =
        json!({"name": "n", "plugins": [{"type": "a"}, {"type": "b", "args": {"cni": {"k": 0}}}]});
    merge_cni_args_into_config(&mut conf, &obj(json!({"k": 1})));
    assert_eq!(
        conf,
        json!({"name": "n", "plugins": [
            {"type": "a", "args": {"cni": {"k": 1}}},
            {"type": "b", "args": {"cni": {"k": 1}}}
        ]})
    );
    let mut single = json!({"name": "n", "type": "a"});
    merge_cni_args_into_config(&mut single, &obj(json!({"k": 1})));
    assert_eq!(single["args"], json!({"cni": {"k": 1}}));
}

#[test]
fn s4_1_2_1_11_ipam_claim_reference_carried_in_args_cni() {
    assert_eq!(IPAM_CLAIM_REFERENCE_ARG, "ipam-claim-reference");
    let s = one(r#"[{"name": "net-b", "ipam-claim-reference": "vm123.tenantblue"}]"#);
    assert!(
        s.required_capabilities().is_empty(),
        "delegates may ignore the claim"
    );
    assert!(s.runtime_config().is_empty());
    assert_eq!(
        Value::Object(s.delegate_cni_args().unwrap()),
        json!({"ipam-claim-reference": "vm123.tenantblue"})
    );
    let s = one(
        r#"[{"name": "net-b", "cni-args": {"ipam-claim-reference": "other", "x": 1}, "ipam-claim-reference": "mine"}]"#,
    );
    assert_eq!(
        Value::Object(s.delegate_cni_args().unwrap()),
        json!({"ipam-claim-reference": "mine", "x": 1})
    );
}

#[test]
fn s4_1_2_1_runtime_config_injected_per_plugin_like_libcni() {
    let s = one(r#"[{"name": "n", "mac": "02:23:45:67:89:01", "ips": ["10.0.0.2/24"]}]"#);
    let rc = s.runtime_config();
    let mut tuning =
        obj(json!({"type": "tuning", "capabilities": {"mac": true}, "runtimeConfig": {"old": 1}}));
    inject_runtime_config(&mut tuning, &rc);
    assert_eq!(tuning["runtimeConfig"], json!({"mac": "02:23:45:67:89:01"}));
    let mut plain = obj(json!({"type": "bridge"}));
    inject_runtime_config(&mut plain, &rc);
    assert_eq!(Value::Object(plain), json!({"type": "bridge"}));
}
