//! The records a hook works with, as plain Rust values (the wire types stay hidden in `wit`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// A device of one of the pod's ResourceClaims (Dynamic Resource Allocation) as a network uses it (WIT 0.1.2).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimDevice {
    /// The ResourceClaim's name (in the pod's namespace) and the request the device was allocated for.
    pub claim: String,
    pub request: String,
    /// The device as DRA names it: driver, pool, and its name in the pool.
    pub driver: String,
    pub pool: String,
    pub device: String,
    /// Its `k8s.cni.cncf.io/deviceID` and `k8s.cni.cncf.io/resourceName` attributes on this node.
    pub device_id: Option<String>,
    pub resource_name: Option<String>,
}

/// The pod being attached.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

impl Pod {
    /// A pod with only a namespace and a name, handy in tests.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Pod {
            namespace: namespace.into(),
            name: name.into(),
            ..Pod::default()
        }
    }

    /// Adds a label (builder style).
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }
}

/// One element of "portMappings" (spec 4.1.2.1.7).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortMapping {
    pub host_port: u32,
    pub container_port: u32,
    /// "TCP", "UDP" or "SCTP" in any case; `None` means TCP.
    pub protocol: Option<String>,
}

/// The "bandwidth" map (spec 4.1.2.1.8).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bandwidth {
    pub ingress_rate: Option<u64>,
    pub ingress_burst: Option<u64>,
    pub egress_rate: Option<u64>,
    pub egress_burst: Option<u64>,
}

/// One network selection element (spec 4.1.2.1). The host always fills `namespace`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Selection {
    pub name: String,
    pub namespace: String,
    pub ips: Option<Vec<String>>,
    pub mac: Option<String>,
    pub interface: Option<String>,
    pub cni_args: Option<Map<String, Value>>,
    pub port_mappings: Option<Vec<PortMapping>>,
    pub bandwidth: Option<Bandwidth>,
    pub default_route: Option<Vec<String>>,
    pub infiniband_guid: Option<String>,
    pub ipam_claim_reference: Option<String>,
    /// Keys outside the spec; new ones must be reverse-DNS names (e.g. "org.example.vlan").
    pub extras: Map<String, Value>,
}

impl Selection {
    /// A selection of NAD `namespace/name` with no other keys.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Selection {
            name: name.into(),
            namespace: namespace.into(),
            ..Selection::default()
        }
    }
}

/// The "dns" map of a status entry (spec 5.3.7).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    pub nameservers: Option<Vec<String>>,
    pub domain: Option<String>,
    pub search: Option<Vec<String>>,
}

/// One network-status entry (spec 5.3).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusEntry {
    pub name: String,
    pub interface: Option<String>,
    pub ips: Option<Vec<String>>,
    pub mac: Option<String>,
    pub mtu: Option<u32>,
    /// The spec's "default" key: exactly one entry (the cluster-wide default network) has it.
    pub default: bool,
    pub dns: Option<Dns>,
    pub default_route: Option<Vec<String>>,
    pub device_info: Option<Map<String, Value>>,
    pub infiniband_guid: Option<String>,
    /// Keys outside the spec; they must be reverse-DNS names (e.g. "io.plexus.pod-labels").
    pub extras: Map<String, Value>,
}

impl StatusEntry {
    /// An entry for network `name` with no other keys.
    pub fn new(name: impl Into<String>, default: bool) -> Self {
        StatusEntry {
            name: name.into(),
            default,
            ..StatusEntry::default()
        }
    }
}

/// What a policy hook decides about a pod's selections.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Keep the selections as they are.
    Admit,
    /// Fail the pod's network operation with this reason (it becomes the CNI error message).
    Deny(String),
    /// Replace the selection list.
    Rewrite(Vec<Selection>),
}

/// A hook's own failure (bad settings, a bug): the host treats it as a fault of the hook and applies
/// its `failurePolicy`. To refuse a pod, return [`Decision::Deny`] instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(String);

impl Error {
    pub fn msg(message: impl std::fmt::Display) -> Self {
        Error(message.to_string())
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error(e.to_string())
    }
}

impl From<String> for Error {
    fn from(e: String) -> Self {
        Error(e)
    }
}

impl From<&str> for Error {
    fn from(e: &str) -> Self {
        Error(e.to_string())
    }
}
