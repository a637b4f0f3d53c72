//! JSON values (as plexus holds them) to the WIT records and back. What hooks return is checked by the spec's
//! own rules, in plexus-core; only the wire form's own mistakes (a JSON string that is not JSON, an extra key
//! that shadows a field) are caught here.

use crate::bindings::plexus::hooks::types as w;
use plexus_core::spec::selection::{
    validate_selections, BandwidthElement, PortMappingElement, Selection, SelectionElement,
};
use plexus_core::spec::status::validate_status_entries;
use serde_json::{Map, Value};

use plexus_core::spec::selection::SELECTION_KEYS;
use plexus_core::spec::status::STATUS_KEYS;

type R<T> = Result<T, String>;

pub(crate) fn pod(pod: &plexus_core::spec::Pod) -> w::Pod {
    w::Pod {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        labels: pod
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        annotations: pod
            .annotations
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    }
}

fn object<'a>(v: &'a Value, what: &str) -> R<&'a Map<String, Value>> {
    v.as_object()
        .ok_or_else(|| format!("{what} is not a JSON object"))
}

fn string(v: &Value, key: &str) -> R<String> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("{key:?} is not a string"))
}

fn strings(v: &Value, key: &str) -> R<Vec<String>> {
    v.as_array()
        .ok_or_else(|| format!("{key:?} is not a list"))?
        .iter()
        .map(|e| string(e, key))
        .collect()
}

fn uint(v: &Value, key: &str) -> R<u64> {
    v.as_u64()
        .ok_or_else(|| format!("{key:?} is not a non-negative integer"))
}

fn u32_of(v: &Value, key: &str) -> R<u32> {
    u32::try_from(uint(v, key)?).map_err(|_| format!("{key:?} is out of range"))
}

fn extras_to_wire(key: &str, value: &Value, extras: &mut Vec<(String, String)>) {
    extras.push((key.to_string(), value.to_string()));
}

/// The record's `extras` into `out`. Which keys an extension may use is the spec's rule, checked by
/// plexus-core on the whole element; here only what the wire form itself can get wrong.
fn extras_from_wire(
    extras: Vec<(String, String)>,
    spec_keys: &[&str],
    out: &mut Map<String, Value>,
) -> R<()> {
    for (key, text) in extras {
        if spec_keys.contains(&key.as_str()) {
            return Err(format!("extra key {key:?} shadows a spec key"));
        }
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| format!("value of key {key:?} is not valid JSON: {e}"))?;
        if out.insert(key.clone(), value).is_some() {
            return Err(format!("key {key:?} appears twice"));
        }
    }
    Ok(())
}

/// A selection as its WIT record. The namespace is always there: a parsed selection has the pod's when the
/// annotation had none (spec 4.1.2.1.2).
pub(crate) fn selection_to_wire(s: &Selection) -> w::Selection {
    w::Selection {
        name: s.name.clone(),
        namespace: s.namespace.clone(),
        ips: (!s.ips.is_empty()).then(|| s.ips.clone()),
        mac: s.mac.clone(),
        interface: s.interface.clone(),
        cni_args: s
            .cni_args
            .as_ref()
            .map(|m| Value::Object(m.clone()).to_string()),
        port_mappings: s.port_mappings.as_ref().map(|pms| {
            pms.iter()
                .map(|pm| w::PortMapping {
                    host_port: pm.host_port.into(),
                    container_port: pm.container_port.into(),
                    protocol: Some(pm.protocol.as_lowercase().to_string()),
                })
                .collect()
        }),
        bandwidth: s.bandwidth.map(|b| w::Bandwidth {
            ingress_rate: b.ingress_rate,
            ingress_burst: b.ingress_burst,
            egress_rate: b.egress_rate,
            egress_burst: b.egress_burst,
        }),
        default_route: s
            .default_route
            .as_ref()
            .map(|gws| gws.iter().map(ToString::to_string).collect()),
        infiniband_guid: s.infiniband_guid.clone(),
        ipam_claim_reference: s.ipam_claim_reference.clone(),
        extras: s
            .extras
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect(),
    }
}

/// A policy hook's rewrite, read and checked by plexus-core's reader of the spec's element
/// ([`Selection::from_json`]: each element as 4.1.2.1 says, a missing or empty namespace the pod's), then the
/// list as a whole.
pub(crate) fn selections_from_wire(
    list: Vec<w::Selection>,
    pod_namespace: &str,
) -> R<Vec<Selection>> {
    let typed = list
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let v = selection_from_wire(s)?;
            Selection::from_json(&v, pod_namespace, i).map_err(|e| e.to_string())
        })
        .collect::<R<Vec<_>>>()?;
    validate_selections(&typed).map_err(|e| e.to_string())?;
    Ok(typed)
}

/// One selection record as spec JSON, unchecked (plexus-core's element form names the keys).
fn selection_from_wire(s: w::Selection) -> R<Value> {
    let cni_args = s
        .cni_args
        .map(|args| {
            serde_json::from_str::<Value>(&args)
                .map_err(|e| format!("\"cni-args\" of {:?} is not valid JSON: {e}", s.name))
        })
        .transpose()?;
    let mut extras = Map::new();
    extras_from_wire(s.extras, SELECTION_KEYS, &mut extras)
        .map_err(|e| format!("selection {:?}: {e}", s.name))?;
    let element = SelectionElement {
        name: s.name,
        namespace: s.namespace,
        ips: s.ips,
        mac: s.mac,
        interface: s.interface,
        cni_args,
        port_mappings: s.port_mappings.map(|pms| {
            pms.into_iter()
                .map(|pm| PortMappingElement {
                    host_port: pm.host_port.into(),
                    container_port: pm.container_port.into(),
                    protocol: pm.protocol,
                    host_ip: None,
                })
                .collect()
        }),
        bandwidth: s.bandwidth.map(|b| BandwidthElement {
            ingress_rate: b.ingress_rate,
            ingress_burst: b.ingress_burst,
            egress_rate: b.egress_rate,
            egress_burst: b.egress_burst,
        }),
        default_route: s.default_route,
        infiniband_guid: s.infiniband_guid,
        ipam_claim_reference: s.ipam_claim_reference,
        extras,
    };
    Ok(element.to_json())
}

pub(crate) fn entry_to_wire(v: &Value) -> R<w::StatusEntry> {
    let m = object(v, "status entry")?;
    let name = string(m.get("name").ok_or("status entry has no \"name\"")?, "name")?;
    let mut e = w::StatusEntry {
        name,
        interface: None,
        ips: None,
        mac: None,
        mtu: None,
        is_default: false,
        dns: None,
        default_route: None,
        device_info: None,
        infiniband_guid: None,
        extras: Vec::new(),
    };
    for (key, value) in m {
        match key.as_str() {
            "name" => {}
            "interface" => e.interface = Some(string(value, key)?),
            "ips" => e.ips = Some(strings(value, key)?),
            "mac" => e.mac = Some(string(value, key)?),
            "mtu" => e.mtu = Some(u32_of(value, key)?),
            "default" => e.is_default = value.as_bool().ok_or("\"default\" is not a boolean")?,
            "dns" => {
                let d = object(value, "\"dns\"")?;
                e.dns = Some(w::Dns {
                    nameservers: d
                        .get("nameservers")
                        .map(|v| strings(v, "nameservers"))
                        .transpose()?,
                    domain: d.get("domain").map(|v| string(v, "domain")).transpose()?,
                    search: d.get("search").map(|v| strings(v, "search")).transpose()?,
                });
            }
            "default-route" => e.default_route = Some(strings(value, key)?),
            "device-info" => {
                object(value, "\"device-info\"")?;
                e.device_info = Some(value.to_string());
            }
            "infiniband-guid" => e.infiniband_guid = Some(string(value, key)?),
            _ => extras_to_wire(key, value, &mut e.extras),
        }
    }
    Ok(e)
}

/// A status hook's entries, checked by the spec's rules in plexus-core (section 5: each entry, and exactly
/// one default).
pub(crate) fn entries_from_wire(list: Vec<w::StatusEntry>) -> R<Vec<Value>> {
    let values = list
        .into_iter()
        .map(entry_from_wire)
        .collect::<R<Vec<_>>>()?;
    validate_status_entries(&values).map_err(|e| e.to_string())?;
    Ok(values)
}

/// One status record as spec JSON, unchecked.
fn entry_from_wire(e: w::StatusEntry) -> R<Value> {
    let mut m = Map::new();
    m.insert("name".into(), e.name.clone().into());
    if let Some(i) = e.interface {
        m.insert("interface".into(), i.into());
    }
    if let Some(ips) = e.ips {
        m.insert("ips".into(), ips.into());
    }
    if let Some(mac) = e.mac {
        m.insert("mac".into(), mac.into());
    }
    if let Some(mtu) = e.mtu {
        m.insert("mtu".into(), mtu.into());
    }
    m.insert("default".into(), e.is_default.into());
    if let Some(d) = e.dns {
        let mut o = Map::new();
        if let Some(ns) = d.nameservers {
            o.insert("nameservers".into(), ns.into());
        }
        if let Some(dom) = d.domain {
            o.insert("domain".into(), dom.into());
        }
        if let Some(s) = d.search {
            o.insert("search".into(), s.into());
        }
        m.insert("dns".into(), Value::Object(o));
    }
    if let Some(gw) = e.default_route {
        m.insert("default-route".into(), gw.into());
    }
    if let Some(info) = e.device_info {
        let v: Value = serde_json::from_str(&info)
            .map_err(|err| format!("\"device-info\" of {:?} is not valid JSON: {err}", e.name))?;
        m.insert("device-info".into(), v);
    }
    if let Some(g) = e.infiniband_guid {
        m.insert("infiniband-guid".into(), g.into());
    }
    extras_from_wire(e.extras, STATUS_KEYS, &mut m)
        .map_err(|err| format!("status entry {:?}: {err}", e.name))?;
    Ok(Value::Object(m))
}

/// A delegate configuration must be a CNI network configuration: an object with a "type", or a
/// configuration list whose "plugins" are such objects.
pub(crate) fn check_cni_config(v: &Value) -> R<()> {
    let m = object(v, "the config")?;
    let has_type =
        |o: &Map<String, Value>| matches!(o.get("type"), Some(Value::String(t)) if !t.is_empty());
    if let Some(plugins) = m.get("plugins") {
        let list = plugins
            .as_array()
            .ok_or("\"plugins\" of the config is not a list")?;
        if list.is_empty() {
            return Err("\"plugins\" of the config is empty".into());
        }
        for (i, p) in list.iter().enumerate() {
            let p = p
                .as_object()
                .ok_or_else(|| format!("plugins[{i}] of the config is not an object"))?;
            if !has_type(p) {
                return Err(format!("plugins[{i}] of the config has no \"type\""));
            }
        }
        Ok(())
    } else if has_type(m) {
        Ok(())
    } else {
        Err("the config has neither \"type\" nor \"plugins\"".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parsed(v: &Value) -> Selection {
        Selection::from_json(v, "pod-ns", 0).unwrap()
    }

    fn roundtrip_selection(v: Value) -> R<Value> {
        let wire = selection_to_wire(&parsed(&v));
        Ok(selections_from_wire(vec![wire], "pod-ns")?
            .remove(0)
            .to_json())
    }

    #[test]
    fn selection_with_every_key_round_trips() {
        let v = json!({
            "name": "net-b", "namespace": "ns", "ips": ["10.1.1.1/24"], "mac": "02:00:00:00:00:01",
            "interface": "net1", "cni-args": {"a": [1]},
            "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
            "bandwidth": {"ingressRate": 1000, "egressRate": 10, "egressBurst": 5},
            "default-route": ["10.1.1.254"], "infiniband-guid": "24:8a:07:03:00:8d:ae:2f",
            "org.example.vlan": {"id": 3}
        });
        assert_eq!(roundtrip_selection(v.clone()).unwrap(), v);
        // Not with "ips" (4.1.2.1.11).
        let claim = json!({"name": "net-c", "namespace": "ns", "ipam-claim-reference": "claim"});
        assert_eq!(roundtrip_selection(claim.clone()).unwrap(), claim);
    }

    #[test]
    fn hooks_always_see_a_namespace() {
        let s = selection_to_wire(&parsed(&json!({"name": "a"})));
        assert_eq!(s.namespace, "pod-ns");
        let s = selection_to_wire(&parsed(&json!({"name": "a", "namespace": ""})));
        assert_eq!(s.namespace, "pod-ns");
        let s = selection_to_wire(&parsed(&json!({"name": "a", "namespace": "x"})));
        assert_eq!(s.namespace, "x");
    }

    /// The rules are plexus-core's (tested there in full); these pin that the hook chain applies them.
    #[test]
    fn selection_output_follows_the_spec_rules_of_core() {
        let base = selection_to_wire(&parsed(&json!({"name": "a", "namespace": "n"})));
        let out = |s: w::Selection| selections_from_wire(vec![s], "pod-ns");
        let mut s = base.clone();
        s.extras.push(("color".into(), "\"blue\"".into()));
        let err = out(s).unwrap_err();
        assert!(err.contains("\"color\" is reserved"), "{err}");
        let mut s = base.clone();
        s.port_mappings = Some(vec![w::PortMapping {
            host_port: 0,
            container_port: 80,
            protocol: None,
        }]);
        assert!(out(s).unwrap_err().contains("hostPort"));
        let mut s = base.clone();
        s.ips = Some(vec![]);
        assert!(out(s).unwrap_err().contains("ips"));
        let mut s = base.clone();
        s.extras.push(("org.x".into(), "{not json".into()));
        assert!(out(s).unwrap_err().contains("not valid JSON"));
        let mut s = base.clone();
        s.extras.push(("mac".into(), "\"x\"".into()));
        assert!(out(s).unwrap_err().contains("shadows"));
        // The list rule: at most one element sets the default route.
        let mut a = base.clone();
        a.default_route = Some(vec!["10.1.1.254".into()]);
        let b = a.clone();
        let err = selections_from_wire(vec![a, b], "pod-ns").unwrap_err();
        assert!(err.contains("only one element"), "{err}");
        // An empty namespace is the pod's, as in the annotation.
        let mut s = base;
        s.namespace.clear();
        assert!(out(s).is_ok());
    }

    #[test]
    fn status_entry_with_every_key_round_trips() {
        let v = json!({
            "name": "ns/net", "interface": "net1", "ips": ["10.0.0.2"], "mac": "02:00:00:00:00:02",
            "mtu": 1500, "default": true,
            "dns": {"nameservers": ["10.0.0.53"], "domain": "x.local", "search": ["x.local"]},
            "default-route": ["10.0.0.1"], "device-info": {"type": "pci", "version": "1.1.0"},
            "infiniband-guid": "g", "io.plexus.pod-labels": {"app": "web"}
        });
        let e = entry_to_wire(&v).unwrap();
        assert_eq!(entries_from_wire(vec![e]).unwrap(), vec![v]);
    }

    #[test]
    fn status_output_follows_the_spec_rules_of_core() {
        let e = entry_to_wire(&json!({"name": "a", "default": true})).unwrap();
        let mut bad = e.clone();
        bad.extras.push(("owner".into(), "\"me\"".into()));
        assert!(entries_from_wire(vec![bad]).unwrap_err().contains("owner"));
        let mut bad = e.clone();
        bad.mac = Some("02:00:00:00:00:01".into());
        assert!(entries_from_wire(vec![bad])
            .unwrap_err()
            .contains("\"interface\" is not"));
        let mut other = entry_to_wire(&json!({"name": "b", "default": false})).unwrap();
        assert!(entries_from_wire(vec![e.clone(), other.clone()]).is_ok());
        other.is_default = true;
        assert!(entries_from_wire(vec![e.clone(), other.clone()]).is_err());
        let mut none = e;
        none.is_default = false;
        assert!(entries_from_wire(vec![none]).is_err());
    }

    #[test]
    fn cni_config_rules() {
        assert!(check_cni_config(&json!({"cniVersion": "1.0.0", "type": "bridge"})).is_ok());
        assert!(
            check_cni_config(&json!({"plugins": [{"type": "bridge"}, {"type": "tuning"}]})).is_ok()
        );
        assert!(check_cni_config(&json!({"cniVersion": "1.0.0"})).is_err());
        assert!(check_cni_config(&json!({"plugins": [{"type": "bridge"}, {}]})).is_err());
        assert!(check_cni_config(&json!({"plugins": []})).is_err());
        assert!(check_cni_config(&json!("bridge")).is_err());
        assert!(check_cni_config(&json!({"type": ""})).is_err());
    }
}
