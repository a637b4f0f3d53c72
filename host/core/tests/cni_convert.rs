//! Golden tests for CNI result conversion: every ordered pair of the seven versions.
//!
//! Inputs: `tests/data/cni/results/<from>.json`; expected outputs:
//! `tests/data/cni/convert/<from>_to_<to>.json` (pretty JSON, key order significant). `BLESS=1` rewrites
//! the expected files from the current code; review the diff before committing.

use std::path::PathBuf;

use plexus_core::cni::{CniResult, CniVersion, ResultError};
use serde_json::{json, Value};

fn data_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/cni"))
}

fn input(v: CniVersion) -> Value {
    let path = data_dir().join("results").join(format!("{v}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn convert(from: CniVersion, to: CniVersion) -> Value {
    let r = CniResult::parse(&input(from)).unwrap_or_else(|e| panic!("parse {from}: {e}"));
    r.to_json(to)
        .unwrap_or_else(|e| panic!("{from} -> {to}: {e}"))
}

#[test]
fn golden_conversions_for_every_pair() {
    let bless = std::env::var_os("BLESS").is_some_and(|v| v == "1");
    let mut failures = Vec::new();
    let mut compared = 0;
    for from in CniVersion::ALL {
        let parsed = CniResult::parse(&input(from)).unwrap();
        assert_eq!(parsed.source_version(), from);
        for to in CniVersion::ALL {
            let out = convert(from, to);
            assert_eq!(out["cniVersion"], to.as_str(), "{from} -> {to}");
            // The output is a valid result of the target version and converting it again is a no-op.
            let reparsed =
                CniResult::parse(&out).unwrap_or_else(|e| panic!("{from} -> {to} re-parse: {e}"));
            assert_eq!(reparsed.source_version(), to);
            assert_eq!(
                reparsed.to_json(to).unwrap(),
                out,
                "{from} -> {to} not idempotent"
            );

            let text = serde_json::to_string_pretty(&out).unwrap() + "\n";
            let path = data_dir()
                .join("convert")
                .join(format!("{from}_to_{to}.json"));
            if bless {
                std::fs::write(&path, &text).unwrap();
                continue;
            }
            match std::fs::read_to_string(&path) {
                Ok(expected) if expected == text => compared += 1,
                Ok(expected) => failures.push(format!(
                    "{}:\n--- expected\n{expected}--- actual\n{text}",
                    path.display()
                )),
                Err(e) => failures.push(format!("{}: {e} (run with BLESS=1)", path.display())),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} golden mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    if !bless {
        assert_eq!(compared, 49);
    }
}

#[test]
fn the_0_3_version_field() {
    // Dropped going up to 1.x ...
    let out = convert(CniVersion::V0_3_0, CniVersion::V1_0_0);
    for ip in out["ips"].as_array().unwrap() {
        assert!(ip.get("version").is_none(), "{ip}");
    }
    // ... derived from the address going down from 1.x (the 1.0.0 input has v4, v6, v4).
    let out = convert(CniVersion::V1_0_0, CniVersion::V0_3_1);
    let versions: Vec<&str> = out["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ip| ip["version"].as_str().unwrap())
        .collect();
    assert_eq!(versions, ["4", "6", "4"]);
    // ... kept between 0.3.0, 0.3.1 and 0.4.0, and added when coming up from the legacy shape.
    assert_eq!(
        convert(CniVersion::V0_3_1, CniVersion::V0_4_0)["ips"][0]["version"],
        "6"
    );
    let out = convert(CniVersion::V0_1_0, CniVersion::V0_3_0);
    assert_eq!(
        out["ips"],
        json!([
            {"version": "4", "address": "10.1.0.5/16", "gateway": "10.1.0.1"},
            {"version": "6", "address": "fd00:1::5/64", "gateway": "fd00:1::1"}
        ])
    );
    // A version field that contradicts the address is refused rather than trusted.
    let bad = json!({"cniVersion": "0.3.1", "ips": [{"version": "6", "address": "10.0.0.1/8"}]});
    assert!(
        matches!(CniResult::parse(&bad), Err(ResultError::Invalid { path, .. }) if path == "ips[0].version")
    );
}

#[test]
fn interface_indices() {
    // Kept between 0.3.x and 1.x, including their absence.
    let out = convert(CniVersion::V0_3_1, CniVersion::V1_1_0);
    let idx: Vec<Option<u64>> = out["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ip| ip.get("interface").and_then(Value::as_u64))
        .collect();
    assert_eq!(idx, [Some(2), Some(2), None]);
    assert_eq!(out["interfaces"].as_array().unwrap().len(), 3);
    let out = convert(CniVersion::V1_0_0, CniVersion::V0_4_0);
    assert_eq!(out["ips"][0]["interface"], 0);
    assert!(out["ips"][2].get("interface").is_none());
    // Legacy results have neither interfaces nor indices; coming up, none are invented.
    let out = convert(CniVersion::V0_2_0, CniVersion::V1_0_0);
    assert!(out.get("interfaces").is_none());
    assert!(out["ips"][0].get("interface").is_none());
    // Going down to legacy, interfaces and indices disappear.
    for from in [CniVersion::V0_3_0, CniVersion::V1_1_0] {
        let out = convert(from, CniVersion::V0_2_0);
        assert!(
            out.get("interfaces").is_none() && out.get("ips").is_none(),
            "{out}"
        );
        assert!(out["ip4"].get("interface").is_none());
    }
}

#[test]
fn legacy_down_conversion() {
    // 0.3.0 has two IPv4 addresses: only the first survives, with its gateway; routes go under the
    // family of their destination, with dst/gw only.
    let out = convert(CniVersion::V0_3_0, CniVersion::V0_2_0);
    assert_eq!(
        out,
        json!({
            "cniVersion": "0.2.0",
            "ip4": {"ip": "10.48.0.5/24", "gateway": "10.48.0.1",
                    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "172.16.0.0/12", "gw": "10.49.0.1"}]},
            "ip6": {"ip": "fd00:48::5/64", "gateway": "fd00:48::1", "routes": [{"dst": "::/0", "gw": "fd00:48::1"}]},
            "dns": {"nameservers": ["10.48.0.10"], "search": ["default.svc.cluster.local"]}
        })
    );
    // The first address of a family, not the first address: 0.3.1 lists IPv6 first.
    let out = convert(CniVersion::V0_3_1, CniVersion::V0_1_0);
    assert_eq!(out["ip4"]["ip"], "192.168.10.10/24");
    assert_eq!(out["ip6"]["ip"], "2001:db8:1::10/64");
    // IPv6-only: the IPv4 route has no ip4 to live under and is dropped.
    let out = convert(CniVersion::V0_4_0, CniVersion::V0_2_0);
    assert!(out.get("ip4").is_none());
    assert_eq!(
        out["ip6"]["routes"],
        json!([{"dst": "::/0", "gw": "fd00:40::1"}])
    );
    // 1.1.0-only route attributes do not survive.
    let out = convert(CniVersion::V1_1_0, CniVersion::V0_2_0);
    assert_eq!(
        out["ip4"]["routes"],
        json!([{"dst": "0.0.0.0/0", "gw": "198.51.100.1"}, {"dst": "203.0.113.0/24"}])
    );
    // No address at all: not representable.
    let no_ip = CniResult::parse(&json!({"cniVersion": "1.1.0", "interfaces": [{"name": "eth0"}]}))
        .unwrap();
    assert_eq!(
        no_ip.to_json(CniVersion::V0_2_0),
        Err(ResultError::NoIpAddresses {
            target: CniVersion::V0_2_0
        })
    );
}

#[test]
fn legacy_up_conversion() {
    let out = convert(CniVersion::V0_1_0, CniVersion::V1_1_0);
    assert_eq!(
        out["ips"],
        json!([
            {"address": "10.1.0.5/16", "gateway": "10.1.0.1"},
            {"address": "fd00:1::5/64", "gateway": "fd00:1::1"}
        ])
    );
    // ip4's routes, then ip6's.
    assert_eq!(
        out["routes"],
        json!([
            {"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.1.0.254"}, {"dst": "::/0"}
        ])
    );
    assert_eq!(out["dns"]["options"], json!(["ndots:5"]));
}

#[test]
fn fields_newer_than_the_target_are_dropped() {
    let v11 = input(CniVersion::V1_1_0);
    for to in [CniVersion::V1_0_0, CniVersion::V0_4_0, CniVersion::V0_3_0] {
        let out = convert(CniVersion::V1_1_0, to);
        for i in out["interfaces"].as_array().unwrap() {
            for k in ["mtu", "socketPath", "pciID"] {
                assert!(i.get(k).is_none(), "{to}: {i}");
            }
        }
        for r in out["routes"].as_array().unwrap() {
            assert_eq!(
                r.as_object()
                    .unwrap()
                    .keys()
                    .filter(|k| *k != "dst" && *k != "gw")
                    .count(),
                0,
                "{to}: {r}"
            );
        }
    }
    // ... and kept (table 0 and scope 0 included) at 1.1.0.
    assert_eq!(convert(CniVersion::V1_1_0, CniVersion::V1_1_0), v11);
}
