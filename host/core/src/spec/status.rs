//! The Network Attachment Status Annotation, `k8s.v1.cni.cncf.io/network-status` (multi-net spec 5).

use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use thiserror::Error;

use super::selection::is_ip_with_optional_prefix;

/// The status map keys 5.3 defines, plus `infiniband-guid`, which the spec's own 5.4 example uses.
pub const STATUS_KEYS: &[&str] = &[
    "name",
    "interface",
    "ips",
    "mac",
    "mtu",
    "default",
    "dns",
    "default-route",
    "device-info",
    "infiniband-guid",
];

/// `dns` (5.3.7). Empty parts are omitted when serialized.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.as_deref().is_none_or(str::is_empty)
            && self.search.is_empty()
    }
}

fn dns_is_empty(d: &Option<Dns>) -> bool {
    d.as_ref().is_none_or(Dns::is_empty)
}

fn str_is_empty(s: &Option<String>) -> bool {
    s.as_deref().is_none_or(str::is_empty)
}

fn list_is_empty(l: &Option<Vec<String>>) -> bool {
    l.as_ref().is_none_or(Vec::is_empty)
}

/// One element of the status annotation (5.3), serialized with the spec's key names. Empty and `None` fields
/// are omitted; `default` is always written. `extra` holds implementation keys (which must contain a
/// period) and is flattened into the map.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct NetworkStatus {
    /// `namespace/name` of the selected NAD, or the cluster-wide default network's name (5.3.1).
    pub name: String,
    #[serde(default, skip_serializing_if = "str_is_empty")]
    pub interface: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    #[serde(default, skip_serializing_if = "str_is_empty")]
    pub mac: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default)]
    pub default: bool,
    #[serde(default, skip_serializing_if = "dns_is_empty")]
    pub dns: Option<Dns>,
    #[serde(
        rename = "default-route",
        default,
        skip_serializing_if = "list_is_empty"
    )]
    pub default_route: Option<Vec<String>>,
    #[serde(
        rename = "device-info",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub device_info: Option<Value>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl NetworkStatus {
    /// This entry as a JSON object.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("a NetworkStatus always serializes")
    }
}

/// The annotation value for `entries`: a JSON list of status maps.
pub fn status_annotation_value(entries: &[NetworkStatus]) -> String {
    serde_json::to_string(entries).expect("a NetworkStatus always serializes")
}

/// A CNI version string as (major, minor, patch); missing parts are 0.
fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let mut parts = v.split('.').map(|p| p.parse::<u64>().ok());
    let major = parts.next()??;
    let minor = parts.next().unwrap_or(Some(0))?;
    let patch = parts.next().unwrap_or(Some(0))?;
    if parts.next().is_some() {
        return None;
    }
    Some((major, minor, patch))
}

/// Whether `result` has the pre-0.3.0 shape (`ip4`/`ip6`): by its `cniVersion`, or, without a usable one,
/// by which keys it has.
fn is_legacy(result: &Map<String, Value>) -> bool {
    match result
        .get("cniVersion")
        .and_then(Value::as_str)
        .and_then(parse_version)
    {
        Some(v) => v < (0, 3, 0),
        None => {
            (result.contains_key("ip4") || result.contains_key("ip6"))
                && !result.contains_key("interfaces")
                && !result.contains_key("ips")
        }
    }
}

fn string_list(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

fn dns_from(v: Option<&Value>) -> Option<Dns> {
    let obj = v?.as_object()?;
    let dns = Dns {
        nameservers: string_list(obj.get("nameservers")),
        domain: obj
            .get("domain")
            .and_then(Value::as_str)
            .filter(|d| !d.is_empty())
            .map(str::to_owned),
        search: string_list(obj.get("search")),
    };
    (!dns.is_empty()).then_some(dns)
}

/// The index of the first element of `interfaces` with a valid (non-empty string) `sandbox`.
fn first_sandbox_interface(result: &Map<String, Value>) -> Option<(usize, &Map<String, Value>)> {
    result
        .get("interfaces")?
        .as_array()?
        .iter()
        .enumerate()
        .filter_map(|(i, v)| v.as_object().map(|o| (i, o)))
        .find(|(_, o)| {
            o.get("sandbox")
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
        })
}

/// The status entry for one attachment (5.1.1, 5.3.x).
///
/// `name` is `namespace/name` (or the cluster network's name); `result` the delegate's raw result in any
/// CNI version, `None` when ADD returned none; `ifname` the `CNI_IFNAME` used.
///
/// * No result (or one that is not a JSON object): the minimal map `{name, interface: ifname, default}`.
/// * Result 0.3.0 or later: `interface`, `mac` and `mtu` from the first `interfaces` element with a
///   non-empty `sandbox` (5.3.2.1, 5.3.4.1); `ips` from the `ips` entries whose `interface` index is that
///   element's (5.3.3.1 rule 1), or, when no interface has a sandbox, from the entries with no `interface`
///   or a negative one (rule 2); addresses are kept as the result writes them (with prefix length, as the
///   5.4 example shows). Without a sandbox interface, `interface` is `ifname`.
/// * Result before 0.3.0: `ips` from `ip4.ip` and `ip6.ip`, `interface` from `ifname`.
/// * `dns` from the result's `dns`, omitted when empty.
///
/// `default_route`, `device_info` and `extra` are left for the caller (see [`status_default_route`]).
pub fn network_status(
    name: &str,
    result: Option<&Value>,
    ifname: &str,
    is_default: bool,
) -> NetworkStatus {
    let mut st = NetworkStatus {
        name: name.to_owned(),
        interface: Some(ifname.to_owned()),
        default: is_default,
        ..NetworkStatus::default()
    };
    let Some(Value::Object(result)) = result else {
        return st;
    };
    st.dns = dns_from(result.get("dns"));
    if is_legacy(result) {
        for key in ["ip4", "ip6"] {
            if let Some(ip) = result
                .get(key)
                .and_then(|v| v.get("ip"))
                .and_then(Value::as_str)
            {
                st.ips.push(ip.to_owned());
            }
        }
        return st;
    }
    let sandbox = first_sandbox_interface(result);
    if let Some((_, iface)) = sandbox {
        if let Some(n) = iface
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            st.interface = Some(n.to_owned());
        }
        st.mac = iface
            .get("mac")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .map(str::to_owned);
        st.mtu = iface
            .get("mtu")
            .and_then(Value::as_u64)
            .filter(|m| *m > 0)
            .and_then(|m| u32::try_from(m).ok());
    }
    let ips = result
        .get("ips")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    for ip in ips {
        let idx = ip.get("interface").filter(|v| !v.is_null());
        let wanted = match sandbox {
            // Rule 1: the entries whose index is the first sandbox interface's.
            Some((i, _)) => idx.and_then(Value::as_u64) == Some(i as u64),
            // Rule 2: the entries not tied to an interface.
            None => idx.is_none() || idx.and_then(Value::as_i64).is_some_and(|n| n < 0),
        };
        if wanted {
            if let Some(addr) = ip.get("address").and_then(Value::as_str) {
                st.ips.push(addr.to_owned());
            }
        }
    }
    st
}

/// The gateways of the default routes (`0.0.0.0/0`, `::/0`) in a result of any CNI version. A default
/// route without `gw` takes the gateway of the first address of its family that has one.
pub fn default_gateways(result: &Value) -> Vec<String> {
    let Some(obj) = result.as_object() else {
        return Vec::new();
    };
    let is_default = |dst: &str| dst == "0.0.0.0/0" || dst == "::/0";
    let family_v4 = |dst: &str| dst.contains('.');
    let mut out: Vec<String> = Vec::new();
    let mut push = |gw: &str| {
        if !gw.is_empty() && !out.iter().any(|g| g == gw) {
            out.push(gw.to_owned());
        }
    };
    if is_legacy(obj) {
        for key in ["ip4", "ip6"] {
            let Some(ipc) = obj.get(key) else { continue };
            let fallback = ipc.get("gateway").and_then(Value::as_str);
            for r in ipc
                .get("routes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if r.get("dst").and_then(Value::as_str).is_some_and(is_default) {
                    if let Some(gw) = r.get("gw").and_then(Value::as_str).or(fallback) {
                        push(gw);
                    }
                }
            }
        }
        return out;
    }
    let ip_gateway = |v4: bool| {
        obj.get("ips")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find_map(|ip| {
                let gw = ip.get("gateway").and_then(Value::as_str)?;
                let is_v4 = IpAddr::from_str(gw).ok()?.is_ipv4();
                (is_v4 == v4).then_some(gw)
            })
    };
    for r in obj
        .get("routes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(dst) = r
            .get("dst")
            .and_then(Value::as_str)
            .filter(|d| is_default(d))
        else {
            continue;
        };
        if let Some(gw) = r
            .get("gw")
            .and_then(Value::as_str)
            .or_else(|| ip_gateway(family_v4(dst)))
        {
            push(gw);
        }
    }
    out
}

/// `default-route` for a status entry (5.3.7.4): set only when the selection had a `default-route` key
/// (`requested`). Its value is the gateways of the default routes the result reports, or, when the result
/// reports none, the requested gateways.
pub fn status_default_route(
    requested: Option<&[IpAddr]>,
    result: Option<&Value>,
) -> Option<Vec<String>> {
    let requested = requested?;
    let from_result = result.map(default_gateways).unwrap_or_default();
    if from_result.is_empty() {
        Some(requested.iter().map(IpAddr::to_string).collect())
    } else {
        Some(from_result)
    }
}

/// A status annotation that breaks 5.3 (used to validate what a policy hook returns).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("network-status{}: {message}", .index.map(|i| format!(" element {i}")).unwrap_or_default())]
pub struct StatusError {
    /// The element's 0-based position; `None` for errors about the list as a whole.
    pub index: Option<usize>,
    pub message: String,
}

/// Checks status entries against 5.2 and 5.3: each is an object whose period-free keys are all spec keys;
/// `name` is a non-empty string; `default` is a boolean and exactly one element has it `true`; the other
/// keys have the spec's types (`interface`, `mac`: strings, `mac` only with `interface`; `ips`, `default-route`:
/// lists of addresses; `mtu`: an unsigned integer; `dns`: an object whose `nameservers`/`search` are string
/// lists and `domain` a string; `device-info`: an object with string `type` and `version`).
pub fn validate_status_entries(entries: &[Value]) -> Result<(), StatusError> {
    let mut defaults = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let is_default = status_entry(e).map_err(|message| StatusError {
            index: Some(i),
            message,
        })?;
        if is_default {
            defaults.push(i);
        }
    }
    match defaults.as_slice() {
        [_] => Ok(()),
        [] => Err(StatusError {
            index: None,
            message: "no element has \"default\": true (the cluster-wide default network's entry, 5.2)".into(),
        }),
        [_, second, ..] => Err(StatusError {
            index: Some(*second),
            message: format!(
                "\"default\" is true here and in element {}; only one element may be the default (5.3.6)",
                defaults[0]
            ),
        }),
    }
}

/// Checks one status entry (see [`validate_status_entries`]); whether it is the default network's.
fn status_entry(e: &Value) -> Result<bool, String> {
    let Value::Object(obj) = e else {
        return Err(format!("is {}, not an object", super::json_type(e)));
    };
    for (k, v) in obj {
        status_key(k, v)?;
    }
    if !obj.contains_key("name") {
        return Err("\"name\" is required".into());
    }
    if !obj.contains_key("default") {
        return Err("\"default\" is required".into());
    }
    if obj.contains_key("mac") && !obj.contains_key("interface") {
        return Err("\"mac\" is present but \"interface\" is not".into());
    }
    Ok(obj.get("default") == Some(&Value::Bool(true)))
}

/// Checks one key of a status entry and its value.
fn status_key(k: &str, v: &Value) -> Result<(), String> {
    let bad = |want: &str| format!("{k:?}: {} is {}, not {want}", short(v), super::json_type(v));
    match k {
        "name" => match v {
            Value::String(s) if !s.is_empty() => {}
            Value::String(_) => return Err("\"name\" is empty".into()),
            _ => return Err(bad("a string")),
        },
        "interface" | "mac" | "infiniband-guid" => {
            if !v.is_string() {
                return Err(bad("a string"));
            }
        }
        "ips" | "default-route" => {
            let Value::Array(items) = v else {
                return Err(bad("a list of IP addresses"));
            };
            if let Some(item) = items
                .iter()
                .find(|item| !item.as_str().is_some_and(is_ip_with_optional_prefix))
            {
                return Err(format!("{k:?}: {} is not an IP address", short(item)));
            }
        }
        "mtu" => {
            if v.as_u64().is_none_or(|m| m > u64::from(u32::MAX)) {
                return Err(bad("an unsigned integer"));
            }
        }
        "default" => {
            if !v.is_boolean() {
                return Err(bad("a boolean"));
            }
        }
        "dns" => {
            let Value::Object(d) = v else {
                return Err(bad("an object"));
            };
            for key in ["nameservers", "search"] {
                if let Some(l) = d.get(key) {
                    if !l.as_array().is_some_and(|a| a.iter().all(Value::is_string)) {
                        return Err(format!("\"dns\".{key:?} is not a list of strings"));
                    }
                }
            }
            if d.get("domain").is_some_and(|x| !x.is_string()) {
                return Err("\"dns\".\"domain\" is not a string".into());
            }
        }
        "device-info" => {
            let Value::Object(d) = v else {
                return Err(bad("an object"));
            };
            for key in ["type", "version"] {
                if !d.get(key).is_some_and(Value::is_string) {
                    return Err(format!("\"device-info\" has no string {key:?}"));
                }
            }
        }
        other if super::is_extension_key(other) => {}
        other => {
            return Err(format!(
                "{other:?} is not a status key the multi-net spec defines; keys without a period are reserved, \
                 and implementation-specific keys must use reverse domain name notation"
            ))
        }
    }
    Ok(())
}

fn short(v: &Value) -> String {
    super::json_excerpt(v, 60)
}
