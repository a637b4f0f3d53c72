//! The Network Attachment Selection Annotation, `k8s.v1.cni.cncf.io/networks` (multi-net spec 4.1).
//!
//! Both formats are accepted: the comma-delimited list of references (4.1.1, plus Multus's `@ifname` suffix)
//! and the JSON list of selection maps (4.1.2). Every key of 4.1.2.1.x is validated as the spec defines it;
//! keys containing a period are carried verbatim in [`Selection::extras`], other unknown keys are rejected.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde_json::{Map, Value};

use super::is_extension_key;
use super::naming::{is_dns1123_label, is_dns1123_subdomain, validate_ifname, NamingError};

/// The keys 4.1.2.1 defines, in the order the spec lists them.
pub const SELECTION_KEYS: &[&str] = &[
    "name",
    "namespace",
    "ips",
    "mac",
    "interface",
    "cni-args",
    "portMappings",
    "bandwidth",
    "default-route",
    "infiniband-guid",
    "ipam-claim-reference",
];

/// What to do with an annotation that is invalid.
///
/// The spec says an invalid value makes "the Network Attachment Selection Annotation ... invalid and
/// ignored by the implementation" (4.1.2.1.3 and the other keys). `Ignore` is that literal reading: the
/// whole annotation is dropped (the pod gets only the cluster-wide default network) and the error is kept
/// as a warning. `Fail` (the default) fails the pod's network setup instead, so a typo cannot silently
/// leave a pod without the networks it asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InvalidSelectionPolicy {
    #[default]
    Fail,
    Ignore,
}

/// `portMappings[].protocol` (4.1.2.1.7): case-insensitive on input, default TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// Lower case, as CNI's CONVENTIONS.md writes it in `runtimeConfig.portMappings`.
    pub fn as_lowercase(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// Case-insensitive parse of `TCP`, `UDP` or `SCTP`.
    pub fn parse(s: &str) -> Option<Protocol> {
        if s.eq_ignore_ascii_case("tcp") {
            Some(Protocol::Tcp)
        } else if s.eq_ignore_ascii_case("udp") {
            Some(Protocol::Udp)
        } else if s.eq_ignore_ascii_case("sctp") {
            Some(Protocol::Sctp)
        } else {
            None
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        })
    }
}

/// One element of `portMappings` (4.1.2.1.7).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PortMapping {
    pub host_port: u16,
    pub container_port: u16,
    pub protocol: Protocol,
    /// `hostIP`: not in the multi-net spec but part of CNI's CONVENTIONS.md port-mapping entry; accepted
    /// (it must be an IP address) and passed through.
    pub host_ip: Option<String>,
}

/// `bandwidth` (4.1.2.1.8): rates in bits per second, bursts in bits; every present value is non-zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Bandwidth {
    pub ingress_rate: Option<u64>,
    pub ingress_burst: Option<u64>,
    pub egress_rate: Option<u64>,
    pub egress_burst: Option<u64>,
}

/// One validated network selection: an element of the JSON list, or one reference of the comma format.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Selection {
    /// The NetworkAttachmentDefinition's name (4.1.2.1.1).
    pub name: String,
    /// Its namespace: the pod's when the key is missing or empty (4.1.2.1.2).
    pub namespace: String,
    /// `ips` (4.1.2.1.3), verbatim. Empty when the key is absent (the key itself may not be empty).
    pub ips: Vec<String>,
    /// `mac` (4.1.2.1.4), verbatim.
    pub mac: Option<String>,
    /// `interface` (4.1.2.1.5), or the comma format's `@ifname`.
    pub interface: Option<String>,
    /// `cni-args` (4.1.2.1.6).
    pub cni_args: Option<Map<String, Value>>,
    /// `portMappings` (4.1.2.1.7); never `Some(empty)`.
    pub port_mappings: Option<Vec<PortMapping>>,
    /// `bandwidth` (4.1.2.1.8).
    pub bandwidth: Option<Bandwidth>,
    /// `default-route` (4.1.2.1.9): the gateways; `Some(empty)` is allowed by the spec.
    pub default_route: Option<Vec<IpAddr>>,
    /// `infiniband-guid` (4.1.2.1.10), verbatim.
    pub infiniband_guid: Option<String>,
    /// `ipam-claim-reference` (4.1.2.1.11): the name of an IPAMClaim in the pod's namespace.
    pub ipam_claim_reference: Option<String>,
    /// Keys containing a period (implementation extensions, 4.1.2.1), verbatim and in order.
    pub extras: Map<String, Value>,
}

/// Why the annotation (or one selection element) is invalid. Names the element (index in the list,
/// 0-based, and its `name` when known) and the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectionError {
    /// The element's 0-based position; `None` for errors about the annotation as a whole.
    pub index: Option<usize>,
    /// The element's `name`, when it is a string (even an invalid one).
    pub name: Option<String>,
    /// The offending key (for the comma format: the part, `name`, `namespace` or `interface`).
    pub key: Option<String>,
    /// What is wrong, e.g. `"zz" is not a 6-byte MAC address`.
    pub message: String,
}

impl fmt::Display for SelectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("networks annotation")?;
        if let Some(i) = self.index {
            write!(f, " element {i}")?;
            if let Some(n) = &self.name {
                write!(f, " ({})", quote(n))?;
            }
        }
        f.write_str(": ")?;
        if let Some(k) = &self.key {
            write!(f, "{}: ", quote(k))?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for SelectionError {}

/// The outcome of [`parse_selection_annotation`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParsedSelections {
    /// The selections, in annotation order.
    pub selections: Vec<Selection>,
    /// Under [`InvalidSelectionPolicy::Ignore`], why the whole annotation was ignored (a warning to log).
    pub ignored: Option<SelectionError>,
}

/// Parses the value of `k8s.v1.cni.cncf.io/networks`.
///
/// An empty or all-whitespace value selects nothing. A value whose first non-blank character is `[` or
/// `{` is the JSON format; anything else is the comma-delimited format. On an invalid annotation, `Fail`
/// returns the error and `Ignore` returns no selections with the error in [`ParsedSelections::ignored`].
pub fn parse_selection_annotation(
    value: &str,
    pod_namespace: &str,
    policy: InvalidSelectionPolicy,
) -> Result<ParsedSelections, SelectionError> {
    match parse_selections(value, pod_namespace) {
        Ok(selections) => Ok(ParsedSelections {
            selections,
            ignored: None,
        }),
        Err(e) => match policy {
            InvalidSelectionPolicy::Fail => Err(e),
            InvalidSelectionPolicy::Ignore => Ok(ParsedSelections {
                selections: Vec::new(),
                ignored: Some(e),
            }),
        },
    }
}

/// The annotation's JSON form with the element keys that are neither the standard's ([`SELECTION_KEYS`]) nor
/// reverse-DNS extension keys left out (what Multus ignores: `ipRequest`, `macRequest`, ...), and those keys;
/// `None` when nothing was left out, for the comma format, and for text that is not JSON (its parse names what is
/// wrong).
pub fn without_unknown_keys(value: &str) -> Option<(String, Vec<String>)> {
    let mut json: Value = serde_json::from_str(value.trim()).ok()?;
    let elements: Vec<&mut Value> = match &mut json {
        Value::Array(items) => items.iter_mut().collect(),
        obj @ Value::Object(_) => vec![obj],
        _ => return None,
    };
    let mut dropped = Vec::new();
    for element in elements {
        if let Value::Object(m) = element {
            m.retain(|k, _| {
                let keep = SELECTION_KEYS.contains(&k.as_str()) || is_extension_key(k);
                if !keep {
                    dropped.push(k.clone());
                }
                keep
            });
        }
    }
    (!dropped.is_empty()).then(|| (json.to_string(), dropped))
}

/// [`parse_selection_annotation`] with [`InvalidSelectionPolicy::Fail`], returning the selections.
pub fn parse_selections(
    value: &str,
    pod_namespace: &str,
) -> Result<Vec<Selection>, SelectionError> {
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    let selections = if trimmed.starts_with('[') || trimmed.starts_with('{') {
        parse_json_format(trimmed, pod_namespace)?
    } else {
        parse_comma_format(trimmed, pod_namespace)?
    };
    validate_selections(&selections)?;
    Ok(selections)
}

/// The rules that span elements: `default-route` may be set on at most one element (4.1.2.1.9).
/// [`parse_selections`] applies them; call this on selections that did not come from it (e.g. a hook's).
pub fn validate_selections(selections: &[Selection]) -> Result<(), SelectionError> {
    let mut first: Option<(usize, &Selection)> = None;
    for (i, s) in selections.iter().enumerate() {
        if s.default_route.is_some() {
            if let Some((j, f)) = first {
                return Err(SelectionError {
                    index: Some(i),
                    name: Some(s.name.clone()),
                    key: Some("default-route".into()),
                    message: format!(
                        "only one element may set \"default-route\", and element {j} ({}) already does",
                        quote(&f.name)
                    ),
                });
            }
            first = Some((i, s));
        }
    }
    Ok(())
}

fn parse_json_format(text: &str, pod_namespace: &str) -> Result<Vec<Selection>, SelectionError> {
    let whole = |message: String| SelectionError {
        index: None,
        name: None,
        key: None,
        message,
    };
    let v: Value =
        serde_json::from_str(text).map_err(|e| whole(format!("is not valid JSON: {e}")))?;
    let Value::Array(items) = v else {
        return Err(whole(
            "the JSON format must be a list of selection objects, not a single object".into(),
        ));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| Selection::from_json(item, pod_namespace, i))
        .collect()
}

fn parse_comma_format(text: &str, pod_namespace: &str) -> Result<Vec<Selection>, SelectionError> {
    text.split(',')
        .enumerate()
        .map(|(i, item)| parse_reference(item.trim(), pod_namespace, i))
        .collect()
}

/// One comma-format reference: `name`, `namespace/name`, `name@ifname` or `namespace/name@ifname`.
fn parse_reference(
    item: &str,
    pod_namespace: &str,
    index: usize,
) -> Result<Selection, SelectionError> {
    let mut ctx = Ctx { index, name: None };
    if item.is_empty() {
        return Err(ctx.err(
            None,
            "is empty; expected name, namespace/name, name@interface or namespace/name@interface"
                .into(),
        ));
    }
    let shape_err = || {
        format!(
            "{} is not name, namespace/name, name@interface or namespace/name@interface",
            quote(item)
        )
    };
    let (reference, ifname) = match item.split_once('@') {
        Some((r, i)) if !i.contains('@') => (r, Some(i)),
        Some(_) => return Err(ctx.err(None, shape_err())),
        None => (item, None),
    };
    let (namespace, name) = match reference.split_once('/') {
        Some((ns, n)) if !n.contains('/') => (Some(ns), n),
        Some(_) => return Err(ctx.err(None, shape_err())),
        None => (None, reference),
    };
    ctx.name = Some(name.to_owned());
    if !is_dns1123_label(name) {
        return Err(ctx.err(Some("name"), not_label(name)));
    }
    let namespace = match namespace {
        Some(ns) if !is_dns1123_label(ns) => return Err(ctx.err(Some("namespace"), not_label(ns))),
        Some(ns) => ns.to_owned(),
        None => pod_namespace.to_owned(),
    };
    if let Some(i) = ifname {
        if let Err(e) = validate_ifname(i) {
            return Err(ctx.err(Some("interface"), ifname_message(&e)));
        }
    }
    Ok(Selection {
        interface: ifname.map(str::to_owned),
        ..Selection::new(namespace, name)
    })
}

struct Ctx {
    index: usize,
    name: Option<String>,
}

impl Ctx {
    fn err(&self, key: Option<&str>, message: String) -> SelectionError {
        SelectionError {
            index: Some(self.index),
            name: self.name.clone(),
            key: key.map(str::to_owned),
            message,
        }
    }
}

fn quote(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// A JSON value as it appears in an error, shortened when long.
fn show(v: &Value) -> String {
    super::json_excerpt(v, 80)
}

fn wrong_type(v: &Value, want: &str) -> String {
    format!("{} is {}, not {want}", show(v), super::json_type(v))
}

fn not_label(s: &str) -> String {
    format!(
        "{} is not a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter or digit)",
        quote(s)
    )
}

fn ifname_message(e: &NamingError) -> String {
    match e {
        NamingError::InvalidIfName { name, reason } => {
            format!(
                "{} is not a valid Linux interface name: {reason}",
                quote(name)
            )
        }
        other => other.to_string(),
    }
}

/// An IPv4 or IPv6 address with an optional `/prefix` (decimal, no sign or leading zero, at most 32 or 128).
pub fn is_ip_with_optional_prefix(s: &str) -> bool {
    let (addr, prefix) = match s.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (s, None),
    };
    let Ok(ip) = IpAddr::from_str(addr) else {
        return false;
    };
    match prefix {
        None => true,
        Some(p) => {
            let max = if ip.is_ipv4() { 32 } else { 128 };
            !p.is_empty()
                && p.len() <= 3
                && p.bytes().all(|b| b.is_ascii_digit())
                && !(p.len() > 1 && p.starts_with('0'))
                && p.parse::<u32>().is_ok_and(|n| n <= max)
        }
    }
}

/// A 6-byte Ethernet MAC address in one of the forms Go's `net.ParseMAC` (used by the reference plugins)
/// accepts for 6 bytes: `01:23:45:67:89:ab`, `01-23-45-67-89-ab` or `0123.4567.89ab`, any hex case.
pub fn is_mac48(s: &str) -> bool {
    is_hex_groups(s, ':', 2, 6) || is_hex_groups(s, '-', 2, 6) || is_hex_groups(s, '.', 4, 3)
}

/// An 8-byte InfiniBand GUID written as eight colon-separated hex pairs, e.g. `24:8a:07:03:00:8d:ae:2f`.
pub fn is_infiniband_guid(s: &str) -> bool {
    is_hex_groups(s, ':', 2, 8)
}

fn is_hex_groups(s: &str, sep: char, width: usize, count: usize) -> bool {
    let groups: Vec<&str> = s.split(sep).collect();
    groups.len() == count
        && groups
            .iter()
            .all(|g| g.len() == width && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A string value, or what it is instead.
fn string(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        other => Err(wrong_type(other, "a string")),
    }
}

/// A string value that `valid` accepts; else the value quoted and `not_valid`.
fn checked(v: &Value, valid: fn(&str) -> bool, not_valid: &str) -> Result<String, String> {
    let s = string(v)?;
    if !valid(&s) {
        return Err(format!("{} {not_valid}", quote(&s)));
    }
    Ok(s)
}

/// `ips` (4.1.2.1.3): a non-empty list of addresses, each with an optional prefix length.
fn ips(v: &Value) -> Result<Vec<String>, String> {
    let Value::Array(items) = v else {
        return Err(wrong_type(v, "a list of IP addresses"));
    };
    if items.is_empty() {
        return Err("must contain at least one IP address".into());
    }
    items
        .iter()
        .map(|item| {
            checked(
                item,
                is_ip_with_optional_prefix,
                "is not an IPv4 or IPv6 address with an optional prefix length",
            )
        })
        .collect()
}

/// `default-route` (4.1.2.1.9): a list of gateway addresses.
fn gateways(v: &Value) -> Result<Vec<IpAddr>, String> {
    let Value::Array(items) = v else {
        return Err(wrong_type(v, "a list of gateway IP addresses"));
    };
    items
        .iter()
        .map(|item| {
            let s = string(item)?;
            IpAddr::from_str(&s)
                .map_err(|_| format!("{} is not an IPv4 or IPv6 address", quote(&s)))
        })
        .collect()
}

impl Selection {
    /// A selection of `namespace/name` with no other keys.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Selection {
        Selection {
            name: name.into(),
            namespace: namespace.into(),
            ips: Vec::new(),
            mac: None,
            interface: None,
            cni_args: None,
            port_mappings: None,
            bandwidth: None,
            default_route: None,
            infiniband_guid: None,
            ipam_claim_reference: None,
            extras: Map::new(),
        }
    }

    /// `namespace/name`, the form status entries use (5.3.1).
    pub fn namespaced_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Validates one element of the JSON format (4.1.2.1.x). `index` is its position, used in errors.
    /// Does not apply the cross-element rules; see [`validate_selections`].
    pub fn from_json(
        value: &Value,
        pod_namespace: &str,
        index: usize,
    ) -> Result<Selection, SelectionError> {
        let mut ctx = Ctx { index, name: None };
        let Value::Object(obj) = value else {
            return Err(ctx.err(None, wrong_type(value, "a selection object")));
        };
        if let Some(Value::String(n)) = obj.get("name") {
            ctx.name = Some(n.clone());
        }
        let name = match obj.get("name") {
            None => return Err(ctx.err(Some("name"), "is required".into())),
            Some(Value::String(n)) if is_dns1123_label(n) => n.clone(),
            Some(Value::String(n)) => return Err(ctx.err(Some("name"), not_label(n))),
            Some(v) => return Err(ctx.err(Some("name"), wrong_type(v, "a string"))),
        };
        let mut sel = Selection::new(pod_namespace, name);
        for (key, v) in obj.iter().filter(|(key, _)| *key != "name") {
            sel.set(key, v).map_err(|m| ctx.err(Some(key), m))?;
        }
        if sel.ipam_claim_reference.is_some() && !sel.ips.is_empty() {
            return Err(ctx.err(
                Some("ipam-claim-reference"),
                "cannot be combined with \"ips\" in the same element (4.1.2.1.11)".into(),
            ));
        }
        Ok(sel)
    }

    /// Sets the element's key `key` (not `name`) to `v`, or says what is wrong with the value.
    fn set(&mut self, key: &str, v: &Value) -> Result<(), String> {
        match key {
            "namespace" => {
                let ns = string(v)?;
                if !ns.is_empty() {
                    if !is_dns1123_label(&ns) {
                        return Err(not_label(&ns));
                    }
                    self.namespace = ns;
                }
            }
            "ips" => self.ips = ips(v)?,
            "mac" => {
                self.mac = Some(checked(v, is_mac48, "is not a 6-byte MAC address")?);
            }
            "interface" => {
                let s = string(v)?;
                validate_ifname(&s).map_err(|e| ifname_message(&e))?;
                self.interface = Some(s);
            }
            "cni-args" => match v {
                Value::Object(m) => self.cni_args = Some(m.clone()),
                other => return Err(wrong_type(other, "an object")),
            },
            "portMappings" => self.port_mappings = Some(parse_port_mappings(v)?),
            "bandwidth" => self.bandwidth = Some(parse_bandwidth(v)?),
            "default-route" => self.default_route = Some(gateways(v)?),
            "infiniband-guid" => {
                self.infiniband_guid = Some(checked(
                    v,
                    is_infiniband_guid,
                    "is not an 8-byte InfiniBand GUID (eight colon-separated hex bytes)",
                )?);
            }
            "ipam-claim-reference" => {
                self.ipam_claim_reference = Some(checked(
                    v,
                    is_dns1123_subdomain,
                    "is not a Kubernetes object name (DNS-1123 subdomain)",
                )?);
            }
            other if is_extension_key(other) => {
                self.extras.insert(other.to_owned(), v.clone());
            }
            other => {
                return Err(format!(
                    "is not a key the multi-net spec defines; {} is reserved (keys without a period are the \
                     spec's), and implementation-specific keys must use reverse domain name notation (e.g. \
                     \"org.example.key\")",
                    quote(other)
                ))
            }
        }
        Ok(())
    }

    /// The spec's JSON element form of this selection; [`Selection::from_json`] reads it back unchanged.
    /// `namespace` is always written; `protocol` is written in lower case.
    pub fn to_json(&self) -> Value {
        SelectionElement::from(self).to_json()
    }
}

/// A selection element as the spec's JSON list form writes it (4.1.2.1), unchecked: the one place that names
/// its keys for writing. [`Selection::to_json`] writes through it, and so does whatever builds an element from
/// other data (a policy hook's rewrite) before [`Selection::from_json`] checks it like the annotation.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct SelectionElement {
    pub name: String,
    pub namespace: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ips: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    #[serde(rename = "cni-args", skip_serializing_if = "Option::is_none")]
    pub cni_args: Option<Value>,
    #[serde(rename = "portMappings", skip_serializing_if = "Option::is_none")]
    pub port_mappings: Option<Vec<PortMappingElement>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<BandwidthElement>,
    #[serde(rename = "default-route", skip_serializing_if = "Option::is_none")]
    pub default_route: Option<Vec<String>>,
    #[serde(rename = "infiniband-guid", skip_serializing_if = "Option::is_none")]
    pub infiniband_guid: Option<String>,
    #[serde(
        rename = "ipam-claim-reference",
        skip_serializing_if = "Option::is_none"
    )]
    pub ipam_claim_reference: Option<String>,
    /// Extension keys, after the spec's, in order. One that repeats a spec key is the caller's to refuse.
    #[serde(flatten)]
    pub extras: Map<String, Value>,
}

/// A `portMappings` element (4.1.2.1.7), in CNI CONVENTIONS.md's shape, unchecked.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMappingElement {
    pub host_port: u64,
    pub container_port: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(rename = "hostIP", skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<String>,
}

/// The `bandwidth` map (4.1.2.1.8), unchecked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BandwidthElement {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingress_rate: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingress_burst: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_rate: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_burst: Option<u64>,
}

/// JSON of a value whose serialization cannot fail (string keys, no foreign types).
fn json_of(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).expect("serializing an element of plain fields to JSON cannot fail")
}

impl SelectionElement {
    pub fn to_json(&self) -> Value {
        json_of(self)
    }
}

impl From<&Selection> for SelectionElement {
    fn from(s: &Selection) -> Self {
        SelectionElement {
            name: s.name.clone(),
            namespace: s.namespace.clone(),
            ips: (!s.ips.is_empty()).then(|| s.ips.clone()),
            mac: s.mac.clone(),
            interface: s.interface.clone(),
            cni_args: s.cni_args.clone().map(Value::Object),
            port_mappings: s
                .port_mappings
                .as_ref()
                .map(|pms| pms.iter().map(PortMappingElement::from).collect()),
            bandwidth: s.bandwidth.as_ref().map(BandwidthElement::from),
            default_route: s
                .default_route
                .as_ref()
                .map(|gws| gws.iter().map(IpAddr::to_string).collect()),
            infiniband_guid: s.infiniband_guid.clone(),
            ipam_claim_reference: s.ipam_claim_reference.clone(),
            extras: s.extras.clone(),
        }
    }
}

impl From<&PortMapping> for PortMappingElement {
    fn from(p: &PortMapping) -> Self {
        PortMappingElement {
            host_port: p.host_port.into(),
            container_port: p.container_port.into(),
            protocol: Some(p.protocol.as_lowercase().into()),
            host_ip: p.host_ip.clone(),
        }
    }
}

impl From<&Bandwidth> for BandwidthElement {
    fn from(b: &Bandwidth) -> Self {
        BandwidthElement {
            ingress_rate: b.ingress_rate,
            ingress_burst: b.ingress_burst,
            egress_rate: b.egress_rate,
            egress_burst: b.egress_burst,
        }
    }
}

/// `{hostPort, containerPort, protocol (lower case)[, hostIP]}`: the CONVENTIONS.md entry of
/// `runtimeConfig.portMappings`, the same shape as the selection's.
pub(crate) fn port_mapping_json(p: &PortMapping) -> Value {
    json_of(&PortMappingElement::from(p))
}

fn parse_port_mappings(v: &Value) -> Result<Vec<PortMapping>, String> {
    let Value::Array(items) = v else {
        return Err(wrong_type(v, "a list of port mappings"));
    };
    if items.is_empty() {
        return Err("must contain at least one port mapping".into());
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| parse_port_mapping(item).map_err(|m| format!("element {i}: {m}")))
        .collect()
}

fn parse_port_mapping(v: &Value) -> Result<PortMapping, String> {
    let Value::Object(obj) = v else {
        return Err(wrong_type(v, "an object"));
    };
    let port = |key: &str| -> Result<u16, String> {
        match obj.get(key) {
            None => Err(format!("{} is required", quote(key))),
            Some(n) => match n.as_u64() {
                Some(p @ 1..=65535) => Ok(p as u16),
                _ if n.is_number() => Err(format!(
                    "{}: {} is not a port number (an integer from 1 to 65535)",
                    quote(key),
                    show(n)
                )),
                _ => Err(format!("{}: {}", quote(key), wrong_type(n, "an integer"))),
            },
        }
    };
    let host_port = port("hostPort")?;
    let container_port = port("containerPort")?;
    let mut pm = PortMapping {
        host_port,
        container_port,
        protocol: Protocol::Tcp,
        host_ip: None,
    };
    for (k, val) in obj {
        match k.as_str() {
            "hostPort" | "containerPort" => {}
            "protocol" => match val {
                Value::String(s) => {
                    pm.protocol = Protocol::parse(s).ok_or_else(|| {
                        format!("\"protocol\": {} is not one of TCP, UDP or SCTP", quote(s))
                    })?
                }
                other => return Err(format!("\"protocol\": {}", wrong_type(other, "a string"))),
            },
            "hostIP" => match val {
                Value::String(s) if IpAddr::from_str(s).is_ok() => pm.host_ip = Some(s.clone()),
                Value::String(s) => {
                    return Err(format!(
                        "\"hostIP\": {} is not an IPv4 or IPv6 address",
                        quote(s)
                    ))
                }
                other => return Err(format!("\"hostIP\": {}", wrong_type(other, "a string"))),
            },
            other => {
                return Err(format!(
                    "{} is not a port mapping key (hostPort, containerPort, protocol, hostIP)",
                    quote(other)
                ))
            }
        }
    }
    Ok(pm)
}

fn parse_bandwidth(v: &Value) -> Result<Bandwidth, String> {
    let Value::Object(obj) = v else {
        return Err(wrong_type(v, "an object"));
    };
    if obj.is_empty() {
        return Err(
            "must contain at least one of ingressRate, ingressBurst, egressRate, egressBurst"
                .into(),
        );
    }
    let mut bw = Bandwidth::default();
    for (k, val) in obj {
        let slot = match k.as_str() {
            "ingressRate" => &mut bw.ingress_rate,
            "ingressBurst" => &mut bw.ingress_burst,
            "egressRate" => &mut bw.egress_rate,
            "egressBurst" => &mut bw.egress_burst,
            other => {
                return Err(format!(
                "{} is not a bandwidth key (ingressRate, ingressBurst, egressRate, egressBurst)",
                quote(other)
            ))
            }
        };
        match val.as_u64() {
            Some(n) if n > 0 => *slot = Some(n),
            _ if val.is_number() => {
                return Err(format!(
                    "{}: {} is not a positive (non-zero) integer",
                    quote(k),
                    show(val)
                ))
            }
            _ => return Err(format!("{}: {}", quote(k), wrong_type(val, "an integer"))),
        }
    }
    if bw.ingress_burst.is_some() && bw.ingress_rate.is_none() {
        return Err(
            "\"ingressBurst\" is set but \"ingressRate\" is not; a burst requires its rate".into(),
        );
    }
    if bw.egress_burst.is_some() && bw.egress_rate.is_none() {
        return Err(
            "\"egressBurst\" is set but \"egressRate\" is not; a burst requires its rate".into(),
        );
    }
    Ok(bw)
}
