//! Conversions between the wire records (`wit`) and the SDK's types, and the calls the export macro
//! forwards to. Both the wasm export path and the native `testing` harness go through here, so the
//! conversions are exercised by ordinary `cargo test`.

use crate::types::{Bandwidth, Decision, Dns, Error, Pod, PortMapping, Selection, StatusEntry};
use crate::wit::exports::plexus::hooks::policy as wpolicy;
use crate::wit::plexus::hooks::types as w;
use crate::{Policy, Resolver, Status};
use serde_json::{Map, Value};

fn json_object(text: &str, what: &str) -> Result<Map<String, Value>, Error> {
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(Error::msg(format_args!("{what} is not a JSON object"))),
        Err(e) => Err(Error::msg(format_args!("{what} is not valid JSON: {e}"))),
    }
}

fn extras_from_wire(extras: Vec<(String, String)>) -> Result<Map<String, Value>, Error> {
    let mut map = Map::new();
    for (key, text) in extras {
        let value = serde_json::from_str(&text)
            .map_err(|e| Error::msg(format_args!("value of key {key:?} is not valid JSON: {e}")))?;
        map.insert(key, value);
    }
    Ok(map)
}

fn extras_to_wire(extras: Map<String, Value>) -> Vec<(String, String)> {
    extras
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect()
}

pub(crate) fn pod_from_wire(p: w::Pod) -> Pod {
    Pod {
        namespace: p.namespace,
        name: p.name,
        uid: p.uid,
        labels: p.labels.into_iter().collect(),
        annotations: p.annotations.into_iter().collect(),
    }
}

pub(crate) fn pod_to_wire(p: &Pod) -> w::Pod {
    w::Pod {
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        uid: p.uid.clone(),
        labels: p.labels.clone().into_iter().collect(),
        annotations: p.annotations.clone().into_iter().collect(),
    }
}

pub(crate) fn selection_from_wire(s: w::Selection) -> Result<Selection, Error> {
    Ok(Selection {
        name: s.name,
        namespace: s.namespace,
        ips: s.ips,
        mac: s.mac,
        interface: s.interface,
        cni_args: s
            .cni_args
            .map(|t| json_object(&t, "cni-args"))
            .transpose()?,
        port_mappings: s.port_mappings.map(|pms| {
            pms.into_iter()
                .map(|pm| PortMapping {
                    host_port: pm.host_port,
                    container_port: pm.container_port,
                    protocol: pm.protocol,
                })
                .collect()
        }),
        bandwidth: s.bandwidth.map(|b| Bandwidth {
            ingress_rate: b.ingress_rate,
            ingress_burst: b.ingress_burst,
            egress_rate: b.egress_rate,
            egress_burst: b.egress_burst,
        }),
        default_route: s.default_route,
        infiniband_guid: s.infiniband_guid,
        ipam_claim_reference: s.ipam_claim_reference,
        extras: extras_from_wire(s.extras)?,
    })
}

pub(crate) fn selection_to_wire(s: Selection) -> w::Selection {
    w::Selection {
        name: s.name,
        namespace: s.namespace,
        ips: s.ips,
        mac: s.mac,
        interface: s.interface,
        cni_args: s.cni_args.map(|m| Value::Object(m).to_string()),
        port_mappings: s.port_mappings.map(|pms| {
            pms.into_iter()
                .map(|pm| w::PortMapping {
                    host_port: pm.host_port,
                    container_port: pm.container_port,
                    protocol: pm.protocol,
                })
                .collect()
        }),
        bandwidth: s.bandwidth.map(|b| w::Bandwidth {
            ingress_rate: b.ingress_rate,
            ingress_burst: b.ingress_burst,
            egress_rate: b.egress_rate,
            egress_burst: b.egress_burst,
        }),
        default_route: s.default_route,
        infiniband_guid: s.infiniband_guid,
        ipam_claim_reference: s.ipam_claim_reference,
        extras: extras_to_wire(s.extras),
    }
}

pub(crate) fn entry_from_wire(e: w::StatusEntry) -> Result<StatusEntry, Error> {
    Ok(StatusEntry {
        name: e.name,
        interface: e.interface,
        ips: e.ips,
        mac: e.mac,
        mtu: e.mtu,
        default: e.is_default,
        dns: e.dns.map(|d| Dns {
            nameservers: d.nameservers,
            domain: d.domain,
            search: d.search,
        }),
        default_route: e.default_route,
        device_info: e
            .device_info
            .map(|t| json_object(&t, "device-info"))
            .transpose()?,
        infiniband_guid: e.infiniband_guid,
        extras: extras_from_wire(e.extras)?,
    })
}

pub(crate) fn entry_to_wire(e: StatusEntry) -> w::StatusEntry {
    w::StatusEntry {
        name: e.name,
        interface: e.interface,
        ips: e.ips,
        mac: e.mac,
        mtu: e.mtu,
        is_default: e.default,
        dns: e.dns.map(|d| w::Dns {
            nameservers: d.nameservers,
            domain: d.domain,
            search: d.search,
        }),
        default_route: e.default_route,
        device_info: e.device_info.map(|m| Value::Object(m).to_string()),
        infiniband_guid: e.infiniband_guid,
        extras: extras_to_wire(e.extras),
    }
}

fn parse_optional_json(text: Option<String>, what: &str) -> Result<Option<Value>, Error> {
    text.map(|t| {
        serde_json::from_str(&t)
            .map_err(|e| Error::msg(format_args!("{what} is not valid JSON: {e}")))
    })
    .transpose()
}

/// The `policy.check` export, forwarded to `P`.
pub fn policy_check<P: Policy>(
    pod: w::Pod,
    selections: Vec<w::Selection>,
) -> Result<wpolicy::Decision, String> {
    let pod = pod_from_wire(pod);
    let selections = selections
        .into_iter()
        .map(selection_from_wire)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    match P::check(&pod, selections).map_err(|e| e.to_string())? {
        Decision::Admit => Ok(wpolicy::Decision::Admit),
        Decision::Deny(reason) => Ok(wpolicy::Decision::Deny(reason)),
        Decision::Rewrite(list) => Ok(wpolicy::Decision::Rewrite(
            list.into_iter().map(selection_to_wire).collect(),
        )),
    }
}

/// The `resolver.resolve` export, forwarded to `R`.
pub fn resolver_resolve<R: Resolver>(
    pod: w::Pod,
    selection: w::Selection,
    nad: Option<String>,
    config: Option<String>,
) -> Result<Option<String>, String> {
    let pod = pod_from_wire(pod);
    let selection = selection_from_wire(selection).map_err(|e| e.to_string())?;
    let nad = parse_optional_json(nad, "the NAD").map_err(|e| e.to_string())?;
    let config = parse_optional_json(config, "the config").map_err(|e| e.to_string())?;
    let out =
        R::resolve(&pod, &selection, nad.as_ref(), config.as_ref()).map_err(|e| e.to_string())?;
    Ok(out.map(|v| v.to_string()))
}

/// The `status.shape` export, forwarded to `S`.
pub fn status_shape<S: Status>(
    pod: w::Pod,
    entries: Vec<w::StatusEntry>,
) -> Result<Vec<w::StatusEntry>, String> {
    let pod = pod_from_wire(pod);
    let entries = entries
        .into_iter()
        .map(entry_from_wire)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let out = S::shape(&pod, entries).map_err(|e| e.to_string())?;
    Ok(out.into_iter().map(entry_to_wire).collect())
}

/// Decodes a wire decision (used by the native harness).
pub(crate) fn decision_from_wire(d: wpolicy::Decision) -> Result<Decision, Error> {
    Ok(match d {
        wpolicy::Decision::Admit => Decision::Admit,
        wpolicy::Decision::Deny(r) => Decision::Deny(r),
        wpolicy::Decision::Rewrite(list) => Decision::Rewrite(
            list.into_iter()
                .map(selection_from_wire)
                .collect::<Result<_, _>>()?,
        ),
    })
}
