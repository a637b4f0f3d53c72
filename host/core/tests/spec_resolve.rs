//! Multi-net spec 3.4.1 (which configuration a NAD stands for) and 3.4.2 ('name' injection).

use std::collections::BTreeMap;

use plexus_core::spec::{
    resolve_nad, ConfigSource, NetworkAttachmentDefinition, OnDiskConf, ResolveError,
};
use serde_json::{json, Value};

macro_rules! confdir_file {
    ($name:literal) => {
        OnDiskConf {
            file_name: $name.to_string(),
            contents: include_str!(concat!("../../../tests/data/spec/resolve/confdir/", $name))
                .to_string(),
        }
    };
}

/// tests/data/spec/resolve/confdir, sorted by file name as the caller passes it.
fn confdir() -> Vec<OnDiskConf> {
    vec![
        confdir_file!("00-broken.conf"),
        confdir_file!("05-array.json"),
        confdir_file!("10-macvlan.conf"),
        confdir_file!("20-macvlan.conflist"),
        confdir_file!("30-conf-only.json"),
        confdir_file!("40-badname.conflist"),
        confdir_file!("50-nolist.conflist"),
        confdir_file!("60-nolist.conf"),
        confdir_file!("99-readme.txt"),
    ]
}

fn nad(name: &str, config: Option<&str>) -> NetworkAttachmentDefinition {
    NetworkAttachmentDefinition {
        namespace: "ns1".into(),
        name: name.into(),
        config: config.map(str::to_owned),
        annotations: BTreeMap::new(),
    }
}

#[test]
fn s3_4_1_rule1_spec_config_is_used_first() {
    let cfg = r#"{"cniVersion": "1.0.0", "name": "macvlan-net", "type": "bridge"}"#;
    let r = resolve_nad(&nad("macvlan-net", Some(cfg)), &confdir()).unwrap();
    assert_eq!(r.source, ConfigSource::NadSpec);
    assert_eq!(
        r.config,
        json!({"cniVersion": "1.0.0", "name": "macvlan-net", "type": "bridge"})
    );
    assert!(r.skipped.is_empty());
    assert!(!r.is_conflist());
}

#[test]
fn s3_4_1_rule1_spec_config_list() {
    let cfg = r#"{"cniVersion": "0.3.0", "name": "another-bridge-network", "plugins": [
        {"type": "bridge", "bridge": "br0", "ipam": {"type": "host-local", "subnet": "192.168.5.0/24"}},
        {"type": "port-forwarding"}, {"type": "tuning", "sysctl": {"net.ipv4.conf.all.log_martians": "1"}}]}"#;
    let r = resolve_nad(&nad("another-bridge-network", Some(cfg)), &[]).unwrap();
    assert!(r.is_conflist());
    assert_eq!(r.name(), Some("another-bridge-network"));
}

#[test]
fn s3_4_1_rule1_invalid_spec_config_names_the_nad() {
    for (cfg, needle) in [
        ("{not json", "invalid JSON"),
        ("[1]", "not a JSON object"),
        (r#"{"cniVersion": "1.0.0"}"#, "neither \"type\""),
        (r#"{"type": 5}"#, "\"type\" is not a string"),
        (r#"{"plugins": {}}"#, "\"plugins\" is not a list"),
        (
            r#"{"plugins": [{"type": "a"}, 3]}"#,
            "element 1 is not an object",
        ),
        (r#"{"name": 1, "type": "a"}"#, "\"name\" is not a string"),
    ] {
        let e = resolve_nad(&nad("net-x", Some(cfg)), &confdir()).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, ResolveError::InvalidSpecConfig { .. }));
        assert!(
            msg.contains("ns1/net-x") && msg.contains(needle),
            "{cfg}: {msg}"
        );
    }
}

#[test]
fn s3_4_1_rule1_blank_spec_config_counts_as_absent() {
    let r = resolve_nad(&nad("macvlan-net", Some("  \n")), &confdir()).unwrap();
    assert_eq!(r.source, ConfigSource::OnDisk("20-macvlan.conflist".into()));
}

#[test]
fn s3_4_1_rule2_conflist_preferred_over_conf() {
    let r = resolve_nad(&nad("macvlan-net", None), &confdir()).unwrap();
    assert_eq!(r.source, ConfigSource::OnDisk("20-macvlan.conflist".into()));
    assert!(r.is_conflist());
    assert_eq!(r.config["plugins"][1]["type"], "tuning");
}

#[test]
fn s3_4_1_rule3_conf_when_no_conflist_matches() {
    let r = resolve_nad(&nad("conf-only", None), &confdir()).unwrap();
    assert_eq!(r.source, ConfigSource::OnDisk("30-conf-only.json".into()));
    assert_eq!(r.config["bridge"], "br9");
    // A .conflist without "plugins" is skipped; the .conf of the same name is used.
    let r = resolve_nad(&nad("nolist", None), &confdir()).unwrap();
    assert_eq!(r.source, ConfigSource::OnDisk("60-nolist.conf".into()));
    assert!(r
        .skipped
        .iter()
        .any(|s| s.starts_with("50-nolist.conflist:")));
}

#[test]
fn s3_4_1_rule2_spec_literal_suffixes_accepted() {
    let files = vec![
        OnDiskConf {
            file_name: "a.config".into(),
            contents: r#"{"name": "lit", "type": "x"}"#.into(),
        },
        OnDiskConf {
            file_name: "b.configlist".into(),
            contents: r#"{"name": "lit", "plugins": [{"type": "y"}]}"#.into(),
        },
    ];
    let r = resolve_nad(&nad("lit", None), &files).unwrap();
    assert_eq!(r.source, ConfigSource::OnDisk("b.configlist".into()));
    let r = resolve_nad(&nad("lit", None), &files[..1]).unwrap();
    assert_eq!(r.source, ConfigSource::OnDisk("a.config".into()));
}

#[test]
fn s3_4_1_first_matching_file_in_given_order_wins() {
    let files = vec![
        OnDiskConf {
            file_name: "10-a.conf".into(),
            contents: r#"{"name": "dup", "type": "first"}"#.into(),
        },
        OnDiskConf {
            file_name: "20-b.conf".into(),
            contents: r#"{"name": "dup", "type": "second"}"#.into(),
        },
    ];
    let r = resolve_nad(&nad("dup", None), &files).unwrap();
    assert_eq!(r.config["type"], "first");
}

#[test]
fn s3_4_1_unparseable_files_are_skipped_with_a_note() {
    let r = resolve_nad(&nad("conf-only", None), &confdir()).unwrap();
    let skipped = r.skipped.join("\n");
    assert!(
        skipped.contains("00-broken.conf: invalid JSON"),
        "{skipped}"
    );
    assert!(
        skipped.contains("05-array.json: not a JSON object"),
        "{skipped}"
    );
    assert!(
        skipped.contains("40-badname.conflist: \"name\" is not a string"),
        "{skipped}"
    );
    assert!(
        !skipped.contains("99-readme.txt"),
        "other suffixes are not considered"
    );
}

#[test]
fn s3_4_1_rule4_no_config_fails_naming_namespace_and_name() {
    let e = resolve_nad(&nad("missing-net", None), &confdir()).unwrap_err();
    match &e {
        ResolveError::NotFound {
            namespace,
            name,
            skipped,
        } => {
            assert_eq!((namespace.as_str(), name.as_str()), ("ns1", "missing-net"));
            assert_eq!(skipped.len(), 3);
        }
        other => panic!("{other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("ns1/missing-net") && msg.contains("00-broken.conf"),
        "{msg}"
    );
    // 3.2.4: a NAD without spec and nothing on disk.
    assert!(matches!(
        resolve_nad(&nad("a-bridge-network", None), &[]),
        Err(ResolveError::NotFound { .. })
    ));
}

#[test]
fn s3_4_1_on_disk_name_must_match_exactly() {
    assert!(resolve_nad(&nad("macvlan", None), &confdir()).is_err());
    assert!(resolve_nad(&nad("macvlan-net2", None), &confdir()).is_err());
}

#[test]
fn s3_4_2_1_name_injection_spec_example() {
    let cfg = include_str!("../../../tests/data/spec/resolve/thick-nad-config.json");
    let want: Value = serde_json::from_str(include_str!(
        "../../../tests/data/spec/resolve/thick-nad-config.injected.json"
    ))
    .unwrap();
    let r = resolve_nad(&nad("a-bridge-network", Some(cfg)), &[]).unwrap();
    assert_eq!(r.config, want);
    assert_eq!(r.name(), Some("a-bridge-network"));
}

#[test]
fn s3_4_2_name_injection_at_list_level_for_conflist() {
    let cfg = r#"{"cniVersion": "1.0.0", "plugins": [{"type": "a"}]}"#;
    let r = resolve_nad(&nad("listy", Some(cfg)), &[]).unwrap();
    assert_eq!(
        r.config,
        json!({"cniVersion": "1.0.0", "plugins": [{"type": "a"}], "name": "listy"})
    );
}

#[test]
fn s3_4_3_existing_name_is_not_overwritten() {
    let cfg = r#"{"cniVersion": "1.0.0", "name": "cni-name", "type": "a"}"#;
    let r = resolve_nad(&nad("nad-name", Some(cfg)), &[]).unwrap();
    assert_eq!(r.name(), Some("cni-name"));
}
