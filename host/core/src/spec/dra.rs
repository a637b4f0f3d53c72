//! Devices from Dynamic Resource Allocation (`resource.k8s.io/v1`): which devices a pod's ResourceClaims were
//! allocated, what the node's ResourceSlices say of them, and the networks a claim asks for itself.
//!
//! The contract for NADs is the one Multus reads: a device's attributes `k8s.cni.cncf.io/deviceID` and
//! `k8s.cni.cncf.io/resourceName` (string values) in the node's ResourceSlices; a NAD whose
//! `k8s.v1.cni.cncf.io/resourceName` annotation equals a device's resourceName gets that device's ID. Beyond it, a
//! claim's opaque device configuration of the form [`ATTACHMENT_API_VERSION`] / [`ATTACHMENT_KIND`] attaches a
//! network with the device of its request (docs/conformance.md, "Networks from ResourceClaims").
//!
//! Pure: the cluster sources trim claims and slices to these types, and [`pod_claims`] joins them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::selection::{parse_selections, Selection};
use super::{json_excerpt, json_type, NetworkAttachmentDefinition, Pod};

/// The device attribute holding the ID a delegate is given (a PCI address for SR-IOV).
pub const DEVICE_ID_ATTRIBUTE: &str = "k8s.cni.cncf.io/deviceID";
/// The device attribute a NAD's `k8s.v1.cni.cncf.io/resourceName` is compared with.
pub const RESOURCE_NAME_ATTRIBUTE: &str = "k8s.cni.cncf.io/resourceName";
/// The `apiVersion` of a claim's opaque configuration that asks for a network.
pub const ATTACHMENT_API_VERSION: &str = "plexus.dev/v1alpha1";
/// Its `kind`.
pub const ATTACHMENT_KIND: &str = "NetworkAttachment";
/// The `apiVersion`s of the opaque parameters the Kubernetes CNI DRA driver (kubernetes-sigs/cni-dra-driver) reads:
/// a CNI configuration list carried in the claim (its examples use the first; its design the second).
pub const CNI_CONFIG_API_VERSIONS: [&str; 2] = [
    "cni.networking.x-k8s.io/v1alpha1",
    "cni.dra.networking.x-k8s.io/v1alpha1",
];
/// Their `kind`s (its examples say `CNI`, its Go type is `CNIConfig`).
pub const CNI_CONFIG_KINDS: [&str; 2] = ["CNI", "CNIConfig"];
/// That driver's name: a device it allocated is its to attach (at the sandbox's creation, through NRI), so a
/// configuration of its form for such a device is left to it.
pub const CNI_DRA_DRIVER: &str = "cni.dra.networking.x-k8s.io";
/// The most claims, devices or claim networks one pod's answer carries: past that the rest are left out.
pub const MAX_POD_CLAIM_ITEMS: usize = 64;

/// A device as DRA names it: the driver, its pool, and the device's name in the pool.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceKey {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

impl std::fmt::Display for DeviceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// A ResourceClaim's namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClaimName {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for ClaimName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One device of a claim's allocation (`status.allocation.devices.results[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatedDevice {
    pub request: String,
    #[serde(flatten)]
    pub key: DeviceKey,
    /// The share of a device allocated more than once (`shareID`, KEP-5075): each share is its own entry of
    /// `status.devices`.
    #[serde(default, rename = "shareID", skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
}

/// An opaque device configuration of the claim that asks for a network: the requests it applies to (all of the
/// claim's when empty), the driver it is for (`opaque.driver`), where it came from, and its `parameters` as
/// written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentConfig {
    #[serde(default)]
    pub requests: Vec<String>,
    /// `opaque.driver`: the driver the configuration is for. DRA hands a configuration to that driver alone, so
    /// it configures only devices of that driver.
    #[serde(default)]
    pub driver: String,
    /// From the DeviceClass (`source: FromClass` in the allocation): the admin's, not the claim author's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_class: bool,
    pub parameters: Value,
}

/// A ResourceClaim as planning reads it: only allocated claims matter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Claim {
    #[serde(flatten)]
    pub name: ClaimName,
    #[serde(default)]
    pub results: Vec<AllocatedDevice>,
    /// The configurations of [`ATTACHMENT_API_VERSION`], from `spec.devices.config[]` and
    /// `status.allocation.devices.config[]` (the same one once).
    #[serde(default)]
    pub attachments: Vec<AttachmentConfig>,
}

impl Claim {
    /// Whether `config` (an opaque configuration's `parameters`) is one this module reads: Plexus's
    /// NetworkAttachment, or a CNI configuration in the CNI DRA driver's form.
    pub fn is_attachment(parameters: &Value) -> bool {
        parameters
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| v == ATTACHMENT_API_VERSION || is_cni_config(v))
    }

    /// Adds `config` unless the claim has it already.
    pub fn add_attachment(&mut self, config: AttachmentConfig) {
        if !self.attachments.contains(&config) {
            self.attachments.push(config);
        }
    }
}

fn is_cni_config(api_version: &str) -> bool {
    CNI_CONFIG_API_VERSIONS.contains(&api_version)
}

/// A device of one of the node's ResourceSlices, with the attributes networks read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SliceDevice {
    #[serde(flatten)]
    pub key: DeviceKey,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_name: Option<String>,
}

/// A device one of the pod's claims was allocated, with what the node's slices say of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimDevice {
    pub claim: ClaimName,
    /// The name the pod gives the claim (its `spec.resourceClaims[].name`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_claim: String,
    pub request: String,
    #[serde(flatten)]
    pub key: DeviceKey,
    /// The allocation's `shareID` for a shared device.
    #[serde(default, rename = "shareID", skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// `k8s.cni.cncf.io/deviceID`, when a slice of this node lists the device with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// `k8s.cni.cncf.io/resourceName`, likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_name: Option<String>,
}

/// A network a claim asks for (an [`AttachmentConfig`] of one request).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimNetwork {
    pub claim: ClaimName,
    pub request: String,
    /// The configuration's `opaque.driver`.
    #[serde(default)]
    pub driver: String,
    /// The configuration came from the DeviceClass.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_class: bool,
    /// The drivers of the request's allocated devices, each once.
    #[serde(default)]
    pub device_drivers: Vec<String>,
    pub parameters: Value,
}

/// Which drivers' claims may carry a CNI configuration on this node (the node conf's `claimCniDrivers` and
/// `classCniDrivers`): a CNI configuration names the plugin the node execs as root, so only the admin may let a
/// claim carry one (design.md, "Who may make a node run what"). Empty lists, the default, allow none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CarriedConfigDrivers {
    /// Drivers whose claims' own configurations (`FromClaim`, written by the claim's author) may carry one.
    #[serde(default)]
    pub claim: Vec<String>,
    /// Drivers whose DeviceClasses' configurations (`FromClass`, the admin's) may carry one.
    #[serde(default)]
    pub class: Vec<String>,
}

/// Why a claim's configuration does not attach a network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimNetworkRefusal {
    /// The configuration is not for the request's devices (another driver's, or a request with no device): DRA
    /// never hands it to their driver, so it asks for nothing. Skipped.
    NotTheDevicesDriver(String),
    /// A CNI configuration carried where the node conf does not allow it: the ADD fails.
    CarriedNotAllowed(String),
}

impl ClaimNetwork {
    /// Whether the configuration is a CNI configuration in the CNI DRA driver's form (the network it names is
    /// the configuration itself, not a NAD).
    pub fn carries_cni_config(&self) -> bool {
        self.parameters
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(is_cni_config)
    }

    /// Whether the configuration may attach its network on a node that allows `carried`: it must be for the
    /// driver of every device of its request (a claim's author can write a configuration for any driver name),
    /// and a carried CNI configuration must be of a driver the node conf lists for its source.
    pub fn admitted(&self, carried: &CarriedConfigDrivers) -> Result<(), ClaimNetworkRefusal> {
        if self.device_drivers.is_empty() {
            return Err(ClaimNetworkRefusal::NotTheDevicesDriver(format!(
                "request {:?} has no allocated device for its configuration of driver {:?}",
                self.request, self.driver
            )));
        }
        if let Some(other) = self.device_drivers.iter().find(|d| **d != self.driver) {
            return Err(ClaimNetworkRefusal::NotTheDevicesDriver(format!(
                "the configuration is for driver {:?}, but request {:?} was allocated a device of driver {other:?}; \
                 a configuration counts only for its own driver's devices",
                self.driver, self.request
            )));
        }
        if !self.carries_cni_config() {
            return Ok(());
        }
        let (allowed, key, source) = match self.from_class {
            true => (&carried.class, "classCniDrivers", "its DeviceClass"),
            false => (&carried.claim, "claimCniDrivers", "the claim"),
        };
        if allowed.contains(&self.driver) {
            return Ok(());
        }
        Err(ClaimNetworkRefusal::CarriedNotAllowed(format!(
            "{source} carries a CNI configuration for driver {:?}, which this node's plexus conf does not allow \
             ({key}: {allowed:?}); a CNI configuration names what the node runs as root, so only drivers the admin \
             lists may carry one (a NetworkAttachment naming a NAD needs no listing)",
            self.driver
        )))
    }

    /// The network the parameters describe: a selection, and for a CNI configuration carried in the claim the
    /// NetworkAttachmentDefinition it stands for (no object of the cluster is read for it).
    pub fn network(&self) -> Result<(Selection, Option<NetworkAttachmentDefinition>), String> {
        match self.parameters.get("apiVersion").and_then(Value::as_str) {
            Some(v) if is_cni_config(v) => self.carried().map(|(s, n)| (s, Some(n))),
            _ => self.selection().map(|s| (s, None)),
        }
    }

    /// A CNI configuration in the CNI DRA driver's form: `ifName` (the pod's interface; the next free `netN`
    /// without it) and `config` (a configuration list, or a single configuration, as a JSON object). Its network
    /// is the configuration's `name` (a DNS-1123 label, as a NAD's) in the claim's namespace; it stands for no
    /// NAD of the cluster. Other keys are ignored, as that driver ignores them.
    fn carried(&self) -> Result<(Selection, NetworkAttachmentDefinition), String> {
        let Value::Object(body) = &self.parameters else {
            return Err("opaque parameters must be an object".into());
        };
        match body.get("kind") {
            Some(Value::String(k)) if CNI_CONFIG_KINDS.contains(&k.as_str()) => {}
            other => {
                return Err(format!(
                    "kind must be one of {CNI_CONFIG_KINDS:?}, not {}",
                    other.map_or("missing".into(), |v| json_excerpt(v, 60))
                ))
            }
        }
        let mut element = Map::new();
        match body.get("ifName") {
            None | Some(Value::Null) => {}
            Some(Value::String(i)) if i.is_empty() => {}
            Some(Value::String(i)) => {
                element.insert("interface".into(), Value::String(i.clone()));
            }
            Some(v) => return Err(format!("ifName must be a string, not {}", json_type(v))),
        }
        let config = match body.get("config") {
            Some(c @ Value::Object(_)) => c,
            None => return Err("config (the CNI configuration) is missing".into()),
            Some(v) => {
                return Err(format!(
                    "config must be a CNI configuration (a JSON object), not {}",
                    json_type(v)
                ))
            }
        };
        match config.get("name") {
            Some(Value::String(n)) => element.insert("name".into(), Value::String(n.clone())),
            _ => return Err("config has no \"name\": it names the network".into()),
        };
        let text = Value::Array(vec![Value::Object(element)]).to_string();
        let selection = parse_selections(&text, &self.claim.namespace)
            .map_err(|e| format!("config's name or ifName: {e}"))?
            .remove(0);
        let nad = NetworkAttachmentDefinition {
            namespace: self.claim.namespace.clone(),
            name: selection.name.clone(),
            config: Some(config.to_string()),
            annotations: BTreeMap::new(),
        };
        Ok((selection, nad))
    }

    /// The selection the parameters describe: one element of the `networks` annotation's JSON-list form plus
    /// `apiVersion` and `kind`; its namespace defaults to the claim's. The error says what is wrong, without
    /// naming the claim (the caller does).
    pub fn selection(&self) -> Result<Selection, String> {
        let Value::Object(body) = &self.parameters else {
            return Err(format!(
                "opaque parameters of apiVersion {ATTACHMENT_API_VERSION} must be an object, not {}",
                json_type(&self.parameters)
            ));
        };
        match body.get("kind") {
            Some(Value::String(k)) if k == ATTACHMENT_KIND => {}
            other => {
                return Err(format!(
                    "kind must be {ATTACHMENT_KIND:?}, not {}",
                    other.map_or("missing".into(), |v| json_excerpt(v, 60))
                ))
            }
        }
        let element: Map<String, Value> = body
            .iter()
            .filter(|(k, _)| k.as_str() != "apiVersion" && k.as_str() != "kind")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let text = Value::Array(vec![Value::Object(element)]).to_string();
        let mut parsed =
            parse_selections(&text, &self.claim.namespace).map_err(|e| e.to_string())?;
        match parsed.len() {
            1 => Ok(parsed.remove(0)),
            n => Err(format!("describes {n} networks; it takes one")),
        }
    }
}

/// The selection element's extension key (4.1.2.1) naming the claim, and optionally the request, its network's
/// device comes from: `{"name": <the pod's name for the claim, spec.resourceClaims[].name>, "request": <a request
/// of that claim>}`.
pub const CLAIM_REFERENCE_KEY: &str = "dev.plexus.resourceClaim";

/// A selection element's [`CLAIM_REFERENCE_KEY`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimReference {
    /// The pod's name for the claim (`spec.resourceClaims[].name`), as its containers name it.
    pub name: String,
    pub request: Option<String>,
}

impl std::fmt::Display for ClaimReference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.request {
            Some(r) => write!(f, "the pod's claim {:?} (request {r:?})", self.name),
            None => write!(f, "the pod's claim {:?}", self.name),
        }
    }
}

/// The claim reference of `sel`, if it has one; the error says what is wrong with it.
pub fn claim_reference(sel: &Selection) -> Result<Option<ClaimReference>, String> {
    let Some(value) = sel.extras.get(CLAIM_REFERENCE_KEY) else {
        return Ok(None);
    };
    let Value::Object(body) = value else {
        return Err(format!(
            "{CLAIM_REFERENCE_KEY} must be an object with \"name\" and optionally \"request\", not {}",
            json_type(value)
        ));
    };
    if let Some(k) = body.keys().find(|k| *k != "name" && *k != "request") {
        return Err(format!("{CLAIM_REFERENCE_KEY}: unknown key {k:?}"));
    }
    let text = |key: &str| match body.get(key) {
        None => Ok(None),
        Some(Value::String(v)) if !v.is_empty() => Ok(Some(v.clone())),
        Some(v) => Err(format!(
            "{CLAIM_REFERENCE_KEY}.{key} must be a non-empty string, not {}",
            json_excerpt(v, 60)
        )),
    };
    let name = text("name")?.ok_or_else(|| format!("{CLAIM_REFERENCE_KEY}.name is missing"))?;
    Ok(Some(ClaimReference {
        name,
        request: text("request")?,
    }))
}

/// What the network made of a claim's device, for the claim's `status.devices[]` (`networkData`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNetworkData {
    #[serde(flatten)]
    pub key: DeviceKey,
    /// The allocation's `shareID`: part of the entry's identity for a shared device.
    #[serde(default, rename = "shareID", skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_name: Option<String>,
    /// Addresses with their prefix length (`10.1.0.5/24`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_address: Option<String>,
}

/// What a pod's claims give its networks: their devices in order (claims in order, each claim's results in
/// order) and the networks they ask for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PodClaims {
    #[serde(default)]
    pub devices: Vec<ClaimDevice>,
    #[serde(default)]
    pub networks: Vec<ClaimNetwork>,
}

impl PodClaims {
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty() && self.networks.is_empty()
    }
}

/// The pod's claims in its order, each once, with the name the pod gives it: those of its
/// `spec.resourceClaims[]` that name a claim `find` has (the pod's namespace is the claims').
pub fn claims_of_pod<'c>(
    pod: &Pod,
    find: impl Fn(&str) -> Option<&'c Claim>,
) -> Vec<(String, &'c Claim)> {
    let mut found: Vec<(String, &Claim)> = Vec::new();
    for r in &pod.resource_claims {
        let Some(claim) = r.claim.as_deref().and_then(&find) else {
            continue;
        };
        if !found.iter().any(|(_, c)| c.name == claim.name) {
            found.push((r.name.clone(), claim));
        }
    }
    found.truncate(MAX_POD_CLAIM_ITEMS);
    found
}

/// [`pod_claims`] of `pod`'s claims found among `allocated` (the claims read allocated), each device's attributes
/// from `node_devices` (what the node's slices list).
pub fn join_pod_claims<'d>(
    pod: &Pod,
    allocated: &[&Claim],
    node_devices: impl Iterator<Item = &'d SliceDevice> + Clone,
) -> PodClaims {
    let mine = claims_of_pod(pod, |n| {
        allocated.iter().copied().find(|c| c.name.name == n)
    });
    pod_claims(mine, |k| {
        node_devices.clone().find(|d| d.key == *k).cloned()
    })
}

/// Joins a pod's claims with the node's slice devices: every allocated device with its attributes (a device no
/// slice of the node lists has none, so it never matches a NAD's resourceName), and every network the claims ask
/// for, one per configuration and request.
pub fn pod_claims<'c>(
    claims: impl IntoIterator<Item = (String, &'c Claim)>,
    node_devices: impl Fn(&DeviceKey) -> Option<SliceDevice>,
) -> PodClaims {
    let mut out = PodClaims::default();
    for (pod_claim, claim) in claims {
        for result in &claim.results {
            let attrs = node_devices(&result.key);
            out.devices.push(ClaimDevice {
                claim: claim.name.clone(),
                pod_claim: pod_claim.clone(),
                request: result.request.clone(),
                key: result.key.clone(),
                share_id: result.share_id.clone(),
                device_id: attrs.as_ref().and_then(|a| a.device_id.clone()),
                resource_name: attrs.and_then(|a| a.resource_name),
            });
        }
        for config in &claim.attachments {
            let requests: Vec<&str> = if config.requests.is_empty() {
                let mut all = Vec::new();
                for r in &claim.results {
                    if !all.contains(&r.request.as_str()) {
                        all.push(r.request.as_str());
                    }
                }
                all
            } else {
                config.requests.iter().map(String::as_str).collect()
            };
            for request in requests {
                if left_to_cni_dra_driver(claim, &config.parameters, request) {
                    continue;
                }
                let mut device_drivers: Vec<String> = Vec::new();
                for r in claim.results.iter().filter(|r| r.request == request) {
                    if !device_drivers.contains(&r.key.driver) {
                        device_drivers.push(r.key.driver.clone());
                    }
                }
                out.networks.push(ClaimNetwork {
                    claim: claim.name.clone(),
                    request: request.to_string(),
                    driver: config.driver.clone(),
                    from_class: config.from_class,
                    device_drivers,
                    parameters: config.parameters.clone(),
                });
            }
        }
    }
    out.devices.truncate(MAX_POD_CLAIM_ITEMS);
    out.networks.truncate(MAX_POD_CLAIM_ITEMS);
    out
}

/// Whether a configuration of the CNI DRA driver's form for `request` is that driver's to attach: the request's
/// devices are all its own.
fn left_to_cni_dra_driver(claim: &Claim, parameters: &Value, request: &str) -> bool {
    let form = parameters.get("apiVersion").and_then(Value::as_str);
    let mut devices = claim
        .results
        .iter()
        .filter(|r| r.request == request)
        .peekable();
    form.is_some_and(is_cni_config)
        && devices.peek().is_some()
        && devices.all(|r| r.key.driver == CNI_DRA_DRIVER)
}

/// Hands out a pod's claim devices to its networks, each device once: by a claim's request (a claim network) or
/// by resourceName (a NAD naming one), in the order [`pod_claims`] lists them.
#[derive(Debug, Default)]
pub struct ClaimDevices {
    devices: Vec<ClaimDevice>,
    used: Vec<bool>,
}

impl ClaimDevices {
    pub fn new(devices: Vec<ClaimDevice>) -> Self {
        let used = vec![false; devices.len()];
        ClaimDevices { devices, used }
    }

    /// Whether some device of the claims carries `resource` (both attributes), used or not.
    pub fn has_resource(&self, resource: &str) -> bool {
        self.devices
            .iter()
            .any(|d| d.device_id.is_some() && d.resource_name.as_deref() == Some(resource))
    }

    /// The first unused device `f` accepts.
    fn find(&self, f: impl Fn(&ClaimDevice) -> bool) -> Option<usize> {
        (0..self.devices.len()).find(|&i| !self.used[i] && f(&self.devices[i]))
    }

    fn take_where(&mut self, f: impl Fn(&ClaimDevice) -> bool) -> Option<ClaimDevice> {
        let i = self.find(f)?;
        self.used[i] = true;
        Some(self.devices[i].clone())
    }

    /// Whether a device is of `claim`'s `request`.
    fn of_request<'a>(
        claim: &'a ClaimName,
        request: &'a str,
    ) -> impl Fn(&ClaimDevice) -> bool + 'a {
        move |d| d.claim == *claim && d.request == request
    }

    /// The next unused device with `resource` and a device ID.
    pub fn take_resource(&mut self, resource: &str) -> Option<ClaimDevice> {
        self.take_where(|d| d.device_id.is_some() && d.resource_name.as_deref() == Some(resource))
    }

    /// The device [`ClaimDevices::take_request`] would give, without taking it.
    pub fn peek_request(&self, claim: &ClaimName, request: &str) -> Option<ClaimDevice> {
        self.find(Self::of_request(claim, request))
            .map(|i| self.devices[i].clone())
    }

    /// The next unused device of the claim the pod calls `pod_claim` (of `request`, when given).
    pub fn take_referenced(&mut self, reference: &ClaimReference) -> Option<ClaimDevice> {
        self.take_where(|d| {
            d.pod_claim == reference.name
                && reference.request.as_ref().is_none_or(|r| *r == d.request)
        })
    }

    /// The next unused device of `claim`'s `request`.
    pub fn take_request(&mut self, claim: &ClaimName, request: &str) -> Option<ClaimDevice> {
        self.take_where(Self::of_request(claim, request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::PodClaimRef;
    use serde_json::json;

    fn key(device: &str) -> DeviceKey {
        DeviceKey {
            driver: "sriov.example.com".into(),
            pool: "node-a".into(),
            device: device.into(),
        }
    }

    fn claim(ns: &str, name: &str, results: &[(&str, &str)]) -> Claim {
        Claim {
            name: ClaimName {
                namespace: ns.into(),
                name: name.into(),
            },
            results: results
                .iter()
                .map(|(request, device)| AllocatedDevice {
                    request: request.to_string(),
                    key: key(device),
                    share_id: None,
                })
                .collect(),
            attachments: Vec::new(),
        }
    }

    #[test]
    fn a_pods_claims_in_its_order_each_once_with_the_pods_names_for_them() {
        let claims = [
            claim("ns", "b", &[]),
            claim("ns", "a", &[]),
            claim("ns", "d", &[]),
        ];
        let find = |n: &str| claims.iter().find(|c| c.name.name == n);
        let r = |name: &str, claim: Option<&str>| PodClaimRef {
            name: name.into(),
            claim: claim.map(Into::into),
        };
        let pod = Pod {
            namespace: "ns".into(),
            name: "p".into(),
            resource_claims: vec![
                r("gpu", Some("d")),
                r("pending", None),
                r("gone", Some("x")),
                r("nics", Some("b")),
                r("again", Some("d")),
            ],
            ..Pod::default()
        };
        let found: Vec<(String, String)> = claims_of_pod(&pod, find)
            .into_iter()
            .map(|(p, c)| (p, c.name.name.clone()))
            .collect();
        assert_eq!(
            found,
            [("gpu", "d"), ("nics", "b")].map(|(a, b)| (a.to_string(), b.to_string())),
            "a template not yet resolved and a claim not found give nothing; a claim named twice counts once"
        );
        assert!(claims_of_pod(&Pod::default(), find).is_empty());
    }

    #[test]
    fn a_pod_claim_reference_reads_the_older_wire_form() {
        let old: Vec<PodClaimRef> = serde_json::from_value(json!(["c1"])).unwrap();
        assert_eq!(old[0].claim.as_deref(), Some("c1"));
        let new: Vec<PodClaimRef> =
            serde_json::from_value(json!([{"name": "nics"}, {"name": "gpu", "claim": "g-1"}]))
                .unwrap();
        assert_eq!(
            (new[0].claim.as_deref(), new[1].claim.as_deref()),
            (None, Some("g-1"))
        );
    }

    #[test]
    fn devices_take_attributes_from_the_nodes_slices_only() {
        let mut c = claim("ns", "c", &[("nic", "vf0"), ("nic", "vf1")]);
        c.attachments.push(AttachmentConfig {
            requests: Vec::new(),
            driver: "sriov.example.com".into(),
            from_class: false,
            parameters: json!({"apiVersion": ATTACHMENT_API_VERSION, "kind": ATTACHMENT_KIND, "name": "n"}),
        });
        let slices = |k: &DeviceKey| {
            (k.device == "vf0").then(|| SliceDevice {
                key: k.clone(),
                device_id: Some("0000:01:00.1".into()),
                resource_name: Some("example.com/sriov".into()),
            })
        };
        let got = pod_claims([("nics".to_string(), &c)], slices);
        assert_eq!(got.devices[0].pod_claim, "nics");
        assert_eq!(got.devices.len(), 2);
        assert_eq!(got.devices[0].device_id.as_deref(), Some("0000:01:00.1"));
        assert_eq!(got.devices[1].device_id, None);
        // One network for the one request the configuration applies to (all of them: it names none).
        assert_eq!(got.networks.len(), 1);
        assert_eq!(got.networks[0].request, "nic");
        assert_eq!(got.networks[0].device_drivers, ["sriov.example.com"]);

        let mut devices = ClaimDevices::new(got.devices);
        assert!(devices.has_resource("example.com/sriov"));
        assert_eq!(
            devices
                .take_resource("example.com/sriov")
                .unwrap()
                .key
                .device,
            "vf0"
        );
        // vf1 has no attributes: it is no device of that resource.
        assert!(devices.take_resource("example.com/sriov").is_none());
        let name = c.name.clone();
        assert_eq!(
            devices.take_request(&name, "nic").unwrap().key.device,
            "vf1"
        );
        assert!(devices.take_request(&name, "nic").is_none());
    }

    #[test]
    fn a_selection_names_the_claim_and_request_its_device_comes_from() {
        let sel = |extra: Value| {
            let mut text = json!([{"name": "n"}]);
            text[0][CLAIM_REFERENCE_KEY] = extra;
            parse_selections(&text.to_string(), "ns").unwrap().remove(0)
        };
        let r = claim_reference(&sel(json!({"name": "nics", "request": "b"})))
            .unwrap()
            .unwrap();
        assert_eq!((r.name.as_str(), r.request.as_deref()), ("nics", Some("b")));
        let none = parse_selections(r#"[{"name": "n"}]"#, "ns")
            .unwrap()
            .remove(0);
        assert_eq!(claim_reference(&none), Ok(None));
        for (bad, says) in [
            (json!("nics"), "must be an object"),
            (json!({"request": "b"}), "name is missing"),
            (json!({"name": ""}), "non-empty string"),
            (json!({"name": "nics", "pool": "x"}), "unknown key"),
        ] {
            let err = claim_reference(&sel(bad)).unwrap_err();
            assert!(err.contains(says), "{err}");
        }

        let claim_a = ClaimName {
            namespace: "ns".into(),
            name: "web-a".into(),
        };
        let dev = |pod_claim: &str, request: &str, device: &str| ClaimDevice {
            claim: claim_a.clone(),
            pod_claim: pod_claim.into(),
            request: request.into(),
            key: key(device),
            share_id: None,
            device_id: None,
            resource_name: None,
        };
        let mut devices = ClaimDevices::new(vec![
            dev("nics", "a", "vf0"),
            dev("nics", "b", "vf1"),
            dev("gpu", "a", "g0"),
        ]);
        assert_eq!(devices.take_referenced(&r).unwrap().key.device, "vf1");
        assert!(devices.take_referenced(&r).is_none(), "each device once");
        let any = ClaimReference {
            name: "nics".into(),
            request: None,
        };
        assert_eq!(devices.take_referenced(&any).unwrap().key.device, "vf0");
        assert!(devices.take_referenced(&any).is_none());
    }

    #[test]
    fn a_claim_network_is_one_selection_element() {
        let net = |parameters: Value| ClaimNetwork {
            claim: ClaimName {
                namespace: "team".into(),
                name: "c".into(),
            },
            request: "nic".into(),
            driver: "d".into(),
            from_class: false,
            device_drivers: vec!["d".into()],
            parameters,
        };
        let sel = net(json!({
            "apiVersion": ATTACHMENT_API_VERSION, "kind": ATTACHMENT_KIND,
            "name": "fast", "interface": "fast0", "ips": ["10.1.0.5/24"]
        }))
        .selection()
        .unwrap();
        assert_eq!(sel.namespaced_name(), "team/fast");
        assert_eq!(sel.interface.as_deref(), Some("fast0"));
        assert_eq!(sel.ips, ["10.1.0.5/24"]);
        let other = net(
            json!({"apiVersion": ATTACHMENT_API_VERSION, "kind": ATTACHMENT_KIND,
            "name": "n", "namespace": "infra"}),
        )
        .selection()
        .unwrap();
        assert_eq!(other.namespaced_name(), "infra/n");

        let err = net(json!({"apiVersion": ATTACHMENT_API_VERSION, "kind": "Other", "name": "n"}))
            .selection()
            .unwrap_err();
        assert!(err.contains("kind must be"), "{err}");
        let err = net(json!({"apiVersion": ATTACHMENT_API_VERSION, "kind": ATTACHMENT_KIND}))
            .selection()
            .unwrap_err();
        assert!(err.contains("name"), "{err}");
        let err = net(json!(["x"])).selection().unwrap_err();
        assert!(err.contains("must be an object"), "{err}");

        // The CNI DRA driver's form: the configuration is the network, named by its `name`.
        let cni = |body: Value| {
            let mut p = json!({"apiVersion": CNI_CONFIG_API_VERSIONS[0], "kind": "CNI"});
            p.as_object_mut()
                .unwrap()
                .extend(body.as_object().unwrap().clone());
            net(p).network()
        };
        let (sel, nad) = cni(
            json!({"ifName": "net7", "config": {"cniVersion": "1.0.0", "name": "mv",
                                                              "plugins": [{"type": "macvlan"}]}}),
        )
        .unwrap();
        assert_eq!(
            (sel.namespaced_name(), sel.interface.as_deref()),
            ("team/mv".into(), Some("net7"))
        );
        let nad = nad.expect("the NAD it stands for");
        assert_eq!((nad.namespace.as_str(), nad.name.as_str()), ("team", "mv"));
        assert!(nad.config.unwrap().contains("macvlan"));
        for (body, says) in [
            (json!({"config": {"type": "x"}}), "has no \"name\""),
            (json!({"config": "text"}), "must be a CNI configuration"),
            (
                json!({"ifName": 3, "config": {"name": "a"}}),
                "ifName must be a string",
            ),
            (json!({"config": {"name": "Not_A_Label"}}), "DNS-1123"),
            (json!({}), "is missing"),
        ] {
            let err = cni(body).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
        let err = net(json!({"apiVersion": CNI_CONFIG_API_VERSIONS[1], "kind": "Other"}))
            .network()
            .unwrap_err();
        assert!(err.contains("kind must be one of"), "{err}");
    }

    #[test]
    fn a_claims_configuration_counts_only_for_its_own_driver_and_carries_a_conf_only_where_listed()
    {
        let net =
            |driver: &str, devices: &[&str], from_class: bool, parameters: Value| ClaimNetwork {
                claim: ClaimName {
                    namespace: "team".into(),
                    name: "c".into(),
                },
                request: "nic".into(),
                driver: driver.into(),
                from_class,
                device_drivers: devices.iter().map(|d| d.to_string()).collect(),
                parameters,
            };
        let attachment =
            json!({"apiVersion": ATTACHMENT_API_VERSION, "kind": ATTACHMENT_KIND, "name": "fast"});
        let carried = json!({"apiVersion": CNI_CONFIG_API_VERSIONS[0], "kind": "CNI",
            "config": {"cniVersion": "1.0.0", "name": "pwn", "type": "host-device", "device": "eth0"}});
        let none = CarriedConfigDrivers::default();
        let listed = CarriedConfigDrivers {
            claim: vec!["sriov.example.com".into()],
            class: vec!["class.example.com".into()],
        };

        // A NetworkAttachment (it names a NAD, the admin's) for the device's own driver needs no listing.
        assert_eq!(
            net(
                "sriov.example.com",
                &["sriov.example.com"],
                false,
                attachment.clone()
            )
            .admitted(&none),
            Ok(())
        );
        // Under another driver's name, or for a request without a device, it asks for nothing.
        for (driver, devices) in [
            ("nobody.example.com", &["gpu.example.com"][..]),
            (
                "gpu.example.com",
                &["gpu.example.com", "sriov.example.com"][..],
            ),
            ("gpu.example.com", &[][..]),
        ] {
            let got = net(driver, devices, false, attachment.clone()).admitted(&listed);
            assert!(
                matches!(got, Err(ClaimNetworkRefusal::NotTheDevicesDriver(_))),
                "{driver} on {devices:?}: {got:?}"
            );
        }
        let got = net(
            "nobody.example.com",
            &["gpu.example.com"],
            false,
            carried.clone(),
        )
        .admitted(&listed);
        let Err(ClaimNetworkRefusal::NotTheDevicesDriver(why)) = got else {
            panic!("{got:?}")
        };
        assert!(
            why.contains("\"nobody.example.com\"") && why.contains("gpu.example.com"),
            "{why}"
        );

        // A carried CNI configuration: only for the drivers listed for its source.
        let claim_carried = net(
            "sriov.example.com",
            &["sriov.example.com"],
            false,
            carried.clone(),
        );
        let Err(ClaimNetworkRefusal::CarriedNotAllowed(why)) = claim_carried.admitted(&none) else {
            panic!("refused by default")
        };
        assert!(why.contains("claimCniDrivers"), "{why}");
        assert_eq!(claim_carried.admitted(&listed), Ok(()));
        // A class's configuration is allowed by its own list, not by the claims'.
        let class_carried = net(
            "sriov.example.com",
            &["sriov.example.com"],
            true,
            carried.clone(),
        );
        let Err(ClaimNetworkRefusal::CarriedNotAllowed(why)) = class_carried.admitted(&listed)
        else {
            panic!("the class list does not name sriov.example.com")
        };
        assert!(why.contains("classCniDrivers"), "{why}");
        let class_ok = net(
            "class.example.com",
            &["class.example.com"],
            true,
            carried.clone(),
        );
        assert_eq!(class_ok.admitted(&listed), Ok(()));
        let claim_of_class_driver =
            net("class.example.com", &["class.example.com"], false, carried);
        assert!(claim_of_class_driver.admitted(&listed).is_err());
    }
}
