//! Multi-net spec 4.1 / 4.2: the selection annotation `k8s.v1.cni.cncf.io/networks`.

use std::net::IpAddr;

use plexus_core::spec::selection::{is_infiniband_guid, is_ip_with_optional_prefix, is_mac48};
use plexus_core::spec::{
    parse_selection_annotation, parse_selections, validate_selections, Bandwidth,
    InvalidSelectionPolicy, PortMapping, Protocol, Selection, SelectionError,
};
use serde_json::{json, Value};

const NS: &str = "my-namespace";

fn parse(annotation: &str) -> Vec<Selection> {
    parse_selections(annotation, NS).unwrap_or_else(|e| panic!("{annotation:?} should parse: {e}"))
}

fn err(annotation: &str) -> SelectionError {
    match parse_selections(annotation, NS) {
        Ok(s) => panic!("{annotation:?} should be invalid, parsed as {s:?}"),
        Err(e) => e,
    }
}

/// The error for a one-element JSON annotation `[{"name": "net-b", <extra>}]`.
fn err_key(extra: &str) -> String {
    err(&format!(r#"[{{"name": "net-b", {extra}}}]"#)).to_string()
}

fn ok_key(extra: &str) -> Selection {
    parse(&format!(r#"[{{"name": "net-b", {extra}}}]"#)).remove(0)
}

fn as_json(sels: &[Selection]) -> Value {
    Value::Array(sels.iter().map(Selection::to_json).collect())
}

fn golden(annotation: &str, expected: &str) {
    let got = as_json(&parse(annotation));
    let want: Value = serde_json::from_str(expected).unwrap();
    assert_eq!(got, want);
}

// ---- 4.1: formats ----

#[test]
fn s4_1_empty_annotation_selects_nothing() {
    assert!(parse("").is_empty());
    assert!(parse("  \n\t ").is_empty());
    assert!(parse("[]").is_empty());
    assert!(parse(" [ ] ").is_empty());
}

#[test]
fn s4_1_1_comma_format_spec_example() {
    golden(
        include_str!("../../../tests/data/spec/selection/s4_1_1_comma.annotation"),
        include_str!("../../../tests/data/spec/selection/s4_1_1_comma.expected.json"),
    );
}

#[test]
fn s4_1_1_comma_format_trims_whitespace() {
    let s = parse("  net-a ,\tother/net-b@eth7 ,\n net-c@x1  ");
    assert_eq!(s.len(), 3);
    assert_eq!(
        (
            s[0].namespace.as_str(),
            s[0].name.as_str(),
            s[0].interface.as_deref()
        ),
        (NS, "net-a", None)
    );
    assert_eq!(
        (
            s[1].namespace.as_str(),
            s[1].name.as_str(),
            s[1].interface.as_deref()
        ),
        ("other", "net-b", Some("eth7"))
    );
    assert_eq!(
        (
            s[2].namespace.as_str(),
            s[2].name.as_str(),
            s[2].interface.as_deref()
        ),
        (NS, "net-c", Some("x1"))
    );
}

#[test]
fn s4_1_1_comma_format_interface_suffix() {
    let s = parse("a,b@foo,other-ns/c@bar");
    assert_eq!(s[1].interface.as_deref(), Some("foo"));
    assert_eq!(s[2].interface.as_deref(), Some("bar"));
    assert_eq!(s[2].namespace, "other-ns");
}

#[test]
fn s4_1_1_comma_format_rejects_malformed_references() {
    for (bad, needle) in [
        ("a,,b", "element 1: is empty"),
        ("a,", "element 1: is empty"),
        ("a/b/c", "element 0"),
        ("a@b@c", "element 0"),
        ("/net-a", "\"namespace\": \"\" is not a DNS-1123 label"),
        ("Net-A", "\"name\": \"Net-A\" is not a DNS-1123 label"),
        ("net_a", "\"name\": \"net_a\" is not a DNS-1123 label"),
        ("ns/-a", "\"name\": \"-a\""),
        ("NS/a", "\"namespace\": \"NS\""),
        (
            "a@",
            "\"interface\": \"\" is not a valid Linux interface name",
        ),
        ("a@this-name-is-too-long", "longer than 15 bytes"),
        ("a@x:y", "'/' or ':'"),
        ("\"net-a\"", "is not a DNS-1123 label"),
    ] {
        let e = err(bad).to_string();
        assert!(
            e.contains(needle),
            "{bad:?}: {e:?} should contain {needle:?}"
        );
    }
}

#[test]
fn s4_1_2_json_format_spec_example() {
    golden(
        include_str!("../../../tests/data/spec/selection/s4_1_2_json.annotation"),
        include_str!("../../../tests/data/spec/selection/s4_1_2_json.expected.json"),
    );
}

#[test]
fn s4_1_2_json_format_all_keys_golden() {
    golden(
        include_str!("../../../tests/data/spec/selection/all_keys.annotation"),
        include_str!("../../../tests/data/spec/selection/all_keys.expected.json"),
    );
}

#[test]
fn s4_1_2_json_format_must_be_a_list_of_objects() {
    assert!(err(r#"{"name": "net-a"}"#)
        .to_string()
        .contains("must be a list"));
    assert!(err(r#"[{"name": "net-a"}"#)
        .to_string()
        .contains("is not valid JSON"));
    let e = err(r#"[{"name": "net-a"}, "net-b"]"#);
    assert_eq!(e.index, Some(1));
    assert!(
        e.to_string()
            .contains("is a string, not a selection object"),
        "{e}"
    );
}

#[test]
fn s4_1_2_1_period_keys_are_carried_verbatim() {
    let s = ok_key(r#""org.foo.bar.key-name": {"x": [1, "y"]}, "a.b": null"#);
    assert_eq!(
        s.extras.get("org.foo.bar.key-name"),
        Some(&json!({"x": [1, "y"]}))
    );
    assert_eq!(s.extras.get("a.b"), Some(&Value::Null));
    assert_eq!(
        s.extras.keys().collect::<Vec<_>>(),
        ["org.foo.bar.key-name", "a.b"]
    );
}

#[test]
fn s4_1_2_1_unknown_key_without_period_is_rejected() {
    let e = err(r#"[{"name": "net-a"}, {"name": "net-b", "ipz": ["1.2.3.4"]}]"#);
    assert_eq!(e.index, Some(1));
    assert_eq!(e.name.as_deref(), Some("net-b"));
    assert_eq!(e.key.as_deref(), Some("ipz"));
    assert!(
        e.to_string()
            .starts_with(r#"networks annotation element 1 ("net-b"): "ipz": is not a key"#),
        "{e}"
    );
}

#[test]
fn s4_1_2_1_1_name_is_required_string_dns_label() {
    let e = err(r#"[{"namespace": "x"}]"#);
    assert_eq!(
        e.to_string(),
        r#"networks annotation element 0: "name": is required"#
    );
    assert!(err(r#"[{"name": 5}]"#)
        .to_string()
        .contains(r#""name": 5 is a number, not a string"#));
    assert!(err(r#"[{"name": null}]"#)
        .to_string()
        .contains("null, not a string"));
    let e = err(r#"[{"name": "Net_B"}]"#);
    assert_eq!(e.name.as_deref(), Some("Net_B"));
    assert!(
        e.to_string()
            .contains(r#"element 0 ("Net_B"): "name": "Net_B" is not a DNS-1123 label"#),
        "{e}"
    );
    assert!(err(r#"[{"name": ""}]"#)
        .to_string()
        .contains("is not a DNS-1123 label"));
}

#[test]
fn s4_1_2_1_2_namespace_defaults_to_pods_when_missing_or_empty() {
    assert_eq!(ok_key(r#""namespace": """#).namespace, NS);
    assert_eq!(parse(r#"[{"name": "a"}]"#)[0].namespace, NS);
    assert_eq!(ok_key(r#""namespace": "other-ns""#).namespace, "other-ns");
    assert!(err_key(r#""namespace": "Other""#)
        .contains(r#""namespace": "Other" is not a DNS-1123 label"#));
    assert!(err_key(r#""namespace": 3"#).contains("not a string"));
}

#[test]
fn s3_3_names_are_dns1123_labels_without_length_limit() {
    let long = "a".repeat(100);
    assert_eq!(parse(&long)[0].name, long);
    assert_eq!(parse("0-9")[0].name, "0-9");
    assert!(err("a.b").to_string().contains("DNS-1123"));
}

#[test]
fn s4_1_2_1_3_ips_must_be_valid_addresses() {
    let s = ok_key(
        r#""ips": ["10.2.2.42/24", "2001:db8::5/64", "1.2.3.4", "::1", "0.0.0.0/0", "::/128"]"#,
    );
    assert_eq!(s.ips.len(), 6);
    for bad in [
        "1.2.3",
        "1.2.3.4/33",
        "2001:db8::/129",
        "1.2.3.4/",
        "1.2.3.4/024",
        "1.2.3.4/+8",
        "010.0.0.1",
        "fe80::1%eth0",
        " 1.2.3.4",
        "host.example.com",
        "1.2.3.4/24/1",
    ] {
        let e = err_key(&format!(r#""ips": ["1.1.1.1", "{bad}"]"#));
        assert!(
            e.contains(r#""ips": "#) && e.contains("is not an IPv4 or IPv6 address"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn s4_1_2_1_3_ips_must_not_be_empty() {
    assert!(err_key(r#""ips": []"#).contains("at least one"));
}

#[test]
fn s4_1_2_1_3_ips_wrong_types_are_errors() {
    assert!(err_key(r#""ips": "1.2.3.4""#).contains("is a string, not a list"));
    assert!(err_key(r#""ips": [1]"#).contains("is a number, not a string"));
}

#[test]
fn s4_1_2_1_4_mac_must_be_6_byte_mac() {
    for good in [
        "02:23:45:67:89:01",
        "AA:BB:CC:DD:EE:FF",
        "02-23-45-67-89-01",
        "0223.4567.8901",
    ] {
        assert_eq!(
            ok_key(&format!(r#""mac": "{good}""#)).mac.as_deref(),
            Some(good)
        );
    }
    let e = err(r#"[{"name": "net-a"}, {"name": "net-b", "mac": "zz"}]"#);
    assert_eq!(
        e.to_string(),
        r#"networks annotation element 1 ("net-b"): "mac": "zz" is not a 6-byte MAC address"#
    );
    for bad in [
        "02:23:45:67:89",
        "02:23:45:67:89:01:02",
        "2:23:45:67:89:01",
        "02:23:45-67:89:01",
        "0223.4567.890",
        "24:8a:07:03:00:8d:ae:2f",
        "",
    ] {
        assert!(
            err_key(&format!(r#""mac": "{bad}""#)).contains("is not a 6-byte MAC address"),
            "{bad}"
        );
    }
    assert!(err_key(r#""mac": 5"#).contains("not a string"));
    assert!(is_mac48("02:23:45:67:89:01") && !is_mac48("02:23:45:67:89:0g"));
}

#[test]
fn s4_1_2_1_5_interface_must_be_valid_kernel_ifname() {
    assert_eq!(
        ok_key(r#""interface": "eth1""#).interface.as_deref(),
        Some("eth1")
    );
    assert_eq!(
        ok_key(r#""interface": "123456789012345""#)
            .interface
            .as_deref(),
        Some("123456789012345")
    );
    for bad in [
        "",
        ".",
        "..",
        "a/b",
        "a:b",
        "a b",
        "a\tb",
        "1234567890123456",
        "é\u{a0}",
    ] {
        let e = err_key(&format!(r#""interface": {}"#, json!(bad)));
        assert!(
            e.contains(r#""interface": "#) && e.contains("is not a valid Linux interface name"),
            "{bad:?}: {e}"
        );
    }
    assert!(err_key(r#""interface": ["eth1"]"#).contains("not a string"));
}

#[test]
fn s4_1_2_1_6_cni_args_must_be_an_object() {
    let s = ok_key(r#""cni-args": {"spoofchk": "on", "n": 1}"#);
    assert_eq!(
        Value::Object(s.cni_args.unwrap()),
        json!({"spoofchk": "on", "n": 1})
    );
    assert!(err_key(r#""cni-args": ["spoofchk"]"#).contains("is a list, not an object"));
    assert!(err_key(r#""cni-args": "spoofchk=on""#).contains("not an object"));
}

#[test]
fn s4_1_2_1_7_port_mappings_validated() {
    let s = ok_key(
        r#""portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 1, "containerPort": 65535, "protocol": "Sctp", "hostIP": "192.0.2.1"},
            {"hostPort": 53, "containerPort": 53}]"#,
    );
    assert_eq!(
        s.port_mappings.unwrap(),
        vec![
            PortMapping {
                host_port: 8080,
                container_port: 80,
                protocol: Protocol::Tcp,
                host_ip: None
            },
            PortMapping {
                host_port: 1,
                container_port: 65535,
                protocol: Protocol::Sctp,
                host_ip: Some("192.0.2.1".into())
            },
            PortMapping {
                host_port: 53,
                container_port: 53,
                protocol: Protocol::Tcp,
                host_ip: None
            },
        ]
    );
    for (bad, needle) in [
        (r#"[]"#, "at least one port mapping"),
        (
            r#"{"hostPort": 1, "containerPort": 1}"#,
            "is an object, not a list",
        ),
        (
            r#"[{"containerPort": 80}]"#,
            r#"element 0: "hostPort" is required"#,
        ),
        (r#"[{"hostPort": 80}]"#, r#""containerPort" is required"#),
        (
            r#"[{"hostPort": 0, "containerPort": 80}]"#,
            "0 is not a port number",
        ),
        (
            r#"[{"hostPort": 65536, "containerPort": 80}]"#,
            "65536 is not a port number",
        ),
        (
            r#"[{"hostPort": -1, "containerPort": 80}]"#,
            "-1 is not a port number",
        ),
        (
            r#"[{"hostPort": 80.5, "containerPort": 80}]"#,
            "80.5 is not a port number",
        ),
        (
            r#"[{"hostPort": "80", "containerPort": 80}]"#,
            "is a string, not an integer",
        ),
        (
            r#"[{"hostPort": 80, "containerPort": 80, "protocol": "icmp"}]"#,
            r#""icmp" is not one of TCP, UDP or SCTP"#,
        ),
        (
            r#"[{"hostPort": 80, "containerPort": 80, "protocol": 6}]"#,
            "not a string",
        ),
        (
            r#"[{"hostPort": 80, "containerPort": 80, "hostIP": "x"}]"#,
            "is not an IPv4 or IPv6 address",
        ),
        (
            r#"[{"hostPort": 80, "containerPort": 80, "extra": 1}]"#,
            "is not a port mapping key",
        ),
        (
            r#"[{"hostPort": 80, "containerPort": 80}, 5]"#,
            "element 1: 5 is a number, not an object",
        ),
    ] {
        let e = err_key(&format!(r#""portMappings": {bad}"#));
        assert!(
            e.contains(r#""portMappings": "#) && e.contains(needle),
            "{bad}: {e}"
        );
    }
}

#[test]
fn s4_1_2_1_7_protocol_is_case_insensitive_default_tcp() {
    for (p, want) in [
        ("tcp", Protocol::Tcp),
        ("TCP", Protocol::Tcp),
        ("uDp", Protocol::Udp),
        ("SCTP", Protocol::Sctp),
    ] {
        let s = ok_key(&format!(
            r#""portMappings": [{{"hostPort": 1, "containerPort": 2, "protocol": "{p}"}}]"#
        ));
        assert_eq!(s.port_mappings.unwrap()[0].protocol, want);
    }
    assert_eq!(Protocol::default(), Protocol::Tcp);
}

#[test]
fn s4_1_2_1_8_bandwidth_validated() {
    let s = ok_key(
        r#""bandwidth": {"ingressRate": 2048, "ingressBurst": 300, "egressRate": 8000, "egressBurst": 200}"#,
    );
    assert_eq!(
        s.bandwidth,
        Some(Bandwidth {
            ingress_rate: Some(2048),
            ingress_burst: Some(300),
            egress_rate: Some(8000),
            egress_burst: Some(200)
        })
    );
    assert_eq!(
        ok_key(r#""bandwidth": {"egressRate": 1}"#)
            .bandwidth
            .unwrap()
            .egress_rate,
        Some(1)
    );
    for (bad, needle) in [
        ("{}", "at least one of"),
        ("[]", "is a list, not an object"),
        (
            r#"{"ingressRate": 0}"#,
            "0 is not a positive (non-zero) integer",
        ),
        (r#"{"ingressRate": -5}"#, "-5 is not a positive"),
        (r#"{"ingressRate": 1.5}"#, "1.5 is not a positive"),
        (r#"{"ingressRate": "1000"}"#, "is a string, not an integer"),
        (
            r#"{"ingressBurst": 300}"#,
            r#""ingressBurst" is set but "ingressRate" is not"#,
        ),
        (
            r#"{"ingressRate": 1, "egressBurst": 300}"#,
            r#""egressBurst" is set but "egressRate" is not"#,
        ),
        (r#"{"ingressrate": 1}"#, "is not a bandwidth key"),
    ] {
        let e = err_key(&format!(r#""bandwidth": {bad}"#));
        assert!(
            e.contains(r#""bandwidth": "#) && e.contains(needle),
            "{bad}: {e}"
        );
    }
}

#[test]
fn s4_1_2_1_9_default_route_list_of_gateways_may_be_empty() {
    let s = ok_key(r#""default-route": ["10.0.0.1", "2001:db8::1"]"#);
    assert_eq!(
        s.default_route,
        Some(vec![
            "10.0.0.1".parse::<IpAddr>().unwrap(),
            "2001:db8::1".parse().unwrap()
        ])
    );
    assert_eq!(ok_key(r#""default-route": []"#).default_route, Some(vec![]));
    assert!(
        err_key(r#""default-route": ["10.0.0.1/24"]"#).contains("is not an IPv4 or IPv6 address")
    );
    assert!(err_key(r#""default-route": "10.0.0.1""#).contains("not a list"));
    assert!(err_key(r#""default-route": [1]"#).contains("not a string"));
}

#[test]
fn s4_1_2_1_9_default_route_on_at_most_one_element() {
    let e = err(
        r#"[{"name": "net-a", "default-route": []}, {"name": "net-b"}, {"name": "net-c", "default-route": ["10.0.0.1"]}]"#,
    );
    assert_eq!(e.index, Some(2));
    assert_eq!(e.key.as_deref(), Some("default-route"));
    assert!(
        e.to_string()
            .contains(r#"element 0 ("net-a") already does"#),
        "{e}"
    );
    let sels = vec![
        Selection {
            default_route: Some(vec![]),
            ..Selection::new("a", "x")
        },
        Selection {
            default_route: Some(vec![]),
            ..Selection::new("a", "y")
        },
    ];
    assert_eq!(validate_selections(&sels).unwrap_err().index, Some(1));
    assert!(validate_selections(&sels[..1]).is_ok());
}

#[test]
fn s4_1_2_1_9_default_route_spec_example() {
    let s = parse(r#"[{ "name": "net-a" }, { "name": "net-b", "default-route": ["10.0.0.1"] }]"#);
    assert_eq!(s[0].default_route, None);
    assert_eq!(s[1].default_route, Some(vec!["10.0.0.1".parse().unwrap()]));
}

#[test]
fn s4_1_2_1_10_infiniband_guid_must_be_8_bytes() {
    assert_eq!(
        ok_key(r#""infiniband-guid": "24:8a:07:03:00:8d:ae:2f""#)
            .infiniband_guid
            .as_deref(),
        Some("24:8a:07:03:00:8d:ae:2f")
    );
    for bad in [
        "24:8a:07:03:00:8d:ae",
        "24:8a:07:03:00:8d:ae:2f:00",
        "24-8a-07-03-00-8d-ae-2f",
        "02:23:45:67:89:01",
        "zz:8a:07:03:00:8d:ae:2f",
    ] {
        assert!(
            err_key(&format!(r#""infiniband-guid": "{bad}""#))
                .contains("is not an 8-byte InfiniBand GUID"),
            "{bad}"
        );
    }
    assert!(err_key(r#""infiniband-guid": 1"#).contains("not a string"));
    assert!(is_infiniband_guid("24:8A:07:03:00:8D:AE:2F"));
}

#[test]
fn s4_1_2_1_11_ipam_claim_reference() {
    let s = ok_key(r#""ipam-claim-reference": "vm123.tenantblue""#);
    assert_eq!(s.ipam_claim_reference.as_deref(), Some("vm123.tenantblue"));
    assert!(err_key(r#""ipam-claim-reference": """#).contains("is not a Kubernetes object name"));
    assert!(
        err_key(r#""ipam-claim-reference": "VM_1""#).contains("is not a Kubernetes object name")
    );
    assert!(err_key(r#""ipam-claim-reference": 1"#).contains("not a string"));
}

#[test]
fn s4_1_2_1_11_ips_with_ipam_claim_reference_is_an_error() {
    for order in [
        r#""ips": ["10.0.0.1"], "ipam-claim-reference": "claim""#,
        r#""ipam-claim-reference": "claim", "ips": ["10.0.0.1"]"#,
    ] {
        let e = err_key(order);
        assert!(
            e.contains(r#""ipam-claim-reference": cannot be combined with "ips""#),
            "{e}"
        );
    }
}

#[test]
fn s4_1_invalid_annotation_policy_fail_returns_error() {
    let e = parse_selection_annotation(
        r#"[{"name": "net-a", "mac": "zz"}]"#,
        NS,
        InvalidSelectionPolicy::Fail,
    )
    .unwrap_err();
    assert_eq!(e.key.as_deref(), Some("mac"));
    assert_eq!(
        InvalidSelectionPolicy::default(),
        InvalidSelectionPolicy::Fail
    );
}

#[test]
fn s4_1_invalid_annotation_policy_ignore_drops_whole_annotation() {
    let p = parse_selection_annotation(
        r#"[{"name": "net-a"}, {"name": "net-b", "mac": "zz"}]"#,
        NS,
        InvalidSelectionPolicy::Ignore,
    )
    .unwrap();
    assert!(
        p.selections.is_empty(),
        "the whole annotation is ignored, valid elements included"
    );
    assert_eq!(p.ignored.unwrap().index, Some(1));
    let p = parse_selection_annotation("net-a", NS, InvalidSelectionPolicy::Ignore).unwrap();
    assert_eq!(p.selections.len(), 1);
    assert!(p.ignored.is_none());
}

#[test]
fn s4_2_same_network_selected_twice_gives_two_selections() {
    let s = parse("net-a,net-a");
    assert_eq!(s.len(), 2);
    assert_eq!(s[0], s[1]);
}

#[test]
fn s4_1_2_to_json_round_trips() {
    let all = parse(include_str!(
        "../../../tests/data/spec/selection/all_keys.annotation"
    ));
    for (i, s) in all.iter().enumerate() {
        assert_eq!(
            &Selection::from_json(&s.to_json(), "elsewhere", i).unwrap(),
            s
        );
    }
    let text = serde_json::to_string(&as_json(&all)).unwrap();
    assert_eq!(parse_selections(&text, "elsewhere").unwrap(), all);
}

#[test]
fn s4_1_2_from_json_validates_a_single_element() {
    let e = Selection::from_json(&json!({"name": "hooked", "mac": "nope"}), NS, 4).unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"networks annotation element 4 ("hooked"): "mac": "nope" is not a 6-byte MAC address"#
    );
    let s = Selection::from_json(&json!({"name": "hooked"}), NS, 0).unwrap();
    assert_eq!(s.namespaced_name(), "my-namespace/hooked");
}

#[test]
fn s4_1_2_1_3_prefix_helper() {
    assert!(is_ip_with_optional_prefix("10.0.0.1/0"));
    assert!(is_ip_with_optional_prefix("::ffff:1.2.3.4/128"));
    assert!(!is_ip_with_optional_prefix("10.0.0.1/00"));
}

#[test]
fn s4_1_2_1_extension_keys_are_reverse_domain_names() {
    assert!(ok_key(r#""org.example.vlan": 3"#)
        .extras
        .contains_key("org.example.vlan"));
    for key in [".vlan", "vlan.", "org..example"] {
        let e = err_key(&format!(r#""{key}": 3"#));
        assert!(e.contains("is reserved"), "{key}: {e}");
    }
}
