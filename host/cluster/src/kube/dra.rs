//! Dynamic Resource Allocation through the Kubernetes API: a pod's ResourceClaims and the node's ResourceSlices
//! (`resource.k8s.io/v1`), trimmed to planning's types, and the claim's device status written back.
//!
//! A cluster that does not serve `resource.k8s.io/v1` (404) has no claims: nothing fails for it. A server that
//! refuses the field selector on `spec.nodeName` (CRD stand-ins of older servers answer 400) is asked for every
//! slice, and the client keeps the node's.

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams};
use plexus_core::spec::dra::{
    join_pod_claims, AllocatedDevice, AttachmentConfig, Claim, ClaimName, DeviceKey,
    DeviceNetworkData, PodClaims, SliceDevice, DEVICE_ID_ATTRIBUTE, MAX_POD_CLAIM_ITEMS,
    RESOURCE_NAME_ATTRIBUTE,
};
use plexus_core::spec::Pod;
use serde_json::{json, Value};

use super::request::{Failure, Op};
use super::{KubeApi, FIELD_MANAGER};
use crate::{ClusterError, ObjectKind};

/// The API group and version of DRA's objects.
pub const DRA_API_VERSION: &str = "resource.k8s.io/v1";
const DRA_GROUP: &str = "resource.k8s.io";
/// How often a claim's device status is read and written again when the claim changed in between.
pub const CLAIM_WRITE_ATTEMPTS: u32 = 5;
/// The most objects of one kind a node reads in one list (pages of 500).
const MAX_LISTED: usize = 20_000;

/// A claim read by name.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimRead {
    Allocated(Claim),
    /// It exists and has no allocation (yet, or any more).
    Unallocated,
    /// It does not exist (or DRA is not served).
    Missing,
}

impl ClaimRead {
    pub fn allocated(&self) -> Option<&Claim> {
        match self {
            ClaimRead::Allocated(c) => Some(c),
            _ => None,
        }
    }
}

/// `status.allocation.devices.config[].source` of a configuration copied from the claim's spec.
const ALLOCATION_FROM_CLAIM: &str = "FromClaim";

/// The claim as planning reads it; `None` for a claim not allocated (it gives no device).
pub fn claim_from_kube(found: ResourceClaim) -> Option<Claim> {
    let status = found.status?;
    let allocation = status.allocation?.devices.unwrap_or_default();
    let mut claim = Claim {
        name: ClaimName {
            namespace: found.metadata.namespace.unwrap_or_default(),
            name: found.metadata.name.unwrap_or_default(),
        },
        results: allocation
            .results
            .unwrap_or_default()
            .into_iter()
            .map(|r| AllocatedDevice {
                request: r.request,
                key: DeviceKey {
                    driver: r.driver,
                    pool: r.pool,
                    device: r.device,
                },
                share_id: r.share_id,
            })
            .collect(),
        attachments: Vec::new(),
    };
    let from_spec = found
        .spec
        .and_then(|s| s.devices)
        .and_then(|d| d.config)
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.requests, c.opaque, false));
    // The allocation repeats the claim's own configurations (source FromClaim), and a real scheduler may write
    // them without their `requests`, which would widen one to every request: only the class's are taken from it.
    let from_allocation = allocation
        .config
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.source != ALLOCATION_FROM_CLAIM)
        .map(|c| (c.requests, c.opaque, true));
    for (requests, opaque, from_class) in from_spec.chain(from_allocation) {
        let Some(opaque) = opaque else {
            continue;
        };
        let parameters = opaque.parameters.0;
        if Claim::is_attachment(&parameters) {
            claim.add_attachment(AttachmentConfig {
                requests: requests.unwrap_or_default(),
                driver: opaque.driver,
                from_class,
                parameters,
            });
        }
    }
    Some(claim)
}

/// The devices of `slice` that are on `node` (the slice's `spec.nodeName`, or a device's own `nodeName`), with
/// their network attributes. Devices of slices for all nodes or a node selector are not any one node's.
pub fn slice_devices(slice: ResourceSlice, node: &str) -> Vec<SliceDevice> {
    let spec = slice.spec;
    let slice_on_node = spec.node_name.as_deref() == Some(node);
    let string =
        |attrs: &std::collections::BTreeMap<_, k8s_openapi::api::resource::v1::DeviceAttribute>,
         name: &str| {
            attrs
                .get(name)
                .and_then(|a: &k8s_openapi::api::resource::v1::DeviceAttribute| a.string.clone())
        };
    spec.devices
        .unwrap_or_default()
        .into_iter()
        .filter(|d| slice_on_node || d.node_name.as_deref() == Some(node))
        .map(|d| {
            let attrs = d.attributes.unwrap_or_default();
            SliceDevice {
                key: DeviceKey {
                    driver: spec.driver.clone(),
                    pool: spec.pool.name.clone(),
                    device: d.name,
                },
                device_id: string(&attrs, DEVICE_ID_ATTRIBUTE),
                resource_name: string(&attrs, RESOURCE_NAME_ATTRIBUTE),
            }
        })
        .collect()
}

/// The condition Plexus sets on the entry of each device its network used; its reason marks the network data in
/// that entry as Plexus's (what a DEL takes back).
const ATTACHED_REASON: &str = "NetworkAttached";

/// The `networkData` of one device's entry.
fn network_data_json(d: &DeviceNetworkData) -> Value {
    let mut network = serde_json::Map::new();
    if let Some(i) = &d.interface_name {
        network.insert("interfaceName".into(), json!(i));
    }
    if !d.ips.is_empty() {
        network.insert("ips".into(), json!(d.ips));
    }
    if let Some(m) = &d.hardware_address {
        network.insert("hardwareAddress".into(), json!(m));
    }
    Value::Object(network)
}

fn attached_condition(d: &DeviceNetworkData, now: &str) -> Value {
    json!({
        "type": "Ready",
        "status": "True",
        "reason": ATTACHED_REASON,
        "message": format!("attached by Plexus as {}", d.interface_name.as_deref().unwrap_or("?")),
        "lastTransitionTime": now,
    })
}

/// Where in an entry's `conditions` Plexus's condition is.
fn attached_condition_index(entry: &Value) -> Option<usize> {
    entry["conditions"]
        .as_array()?
        .iter()
        .position(|c| c["reason"] == ATTACHED_REASON)
}

/// Whether `entry` of `status.devices` is `d`'s: the same driver, pool, device and share (an entry without
/// `shareID` is the unshared device's).
fn same_device(entry: &Value, d: &DeviceNetworkData) -> bool {
    entry["driver"] == d.key.driver.as_str()
        && entry["pool"] == d.key.pool.as_str()
        && entry["device"] == d.key.device.as_str()
        && entry["shareID"].as_str() == d.share_id.as_deref()
}

/// Whether `entry` carries network data another writer (the device's DRA driver) put there: Plexus leaves such
/// an entry alone rather than take the device's network data over.
fn drivers_network_data(entry: &Value) -> bool {
    !entry["networkData"].is_null()
        && entry["networkData"] != json!({})
        && attached_condition_index(entry).is_none()
}

/// The JSON patch (RFC 6902) that makes Plexus's part of a claim's `status.devices` (`current`, read at
/// `resource_version`) exactly `devices`: each device's entry (driver, pool, device and `shareID`) gets its
/// `networkData` and Plexus's `Ready` condition (an entry is added for a device that has none), and what Plexus
/// wrote for devices not in `devices` is taken back (its condition and `networkData`; the whole entry when nothing
/// else is in it). Entries and fields of others (the DRA driver's `data`, its conditions) are not touched, a
/// driver's own `Ready` condition is not overridden, and an entry whose `networkData` the driver wrote is left
/// as it is (no forced takeover). The first operation tests the resourceVersion, so that the indices hold: a claim changed in between
/// fails the patch, and the caller reads it again. `None` when nothing would change.
///
/// A JSON patch rather than a server-side apply: Kubernetes 1.37's server-side apply of a claim's status round
/// trips the whole object through its field schema, which rewrites the allocation's opaque configuration (its keys
/// sorted) and then refuses the write as a change of the allocation, whenever the user wrote that configuration
/// with its keys in another order.
pub fn claim_status_patch(
    current: &[Value],
    resource_version: &str,
    devices: &[DeviceNetworkData],
    now: &str,
) -> Option<Value> {
    let mut edits = Vec::new();
    let mut removals = Vec::new();
    let mut appends = Vec::new();
    for (i, entry) in current.iter().enumerate() {
        let path = format!("/status/devices/{i}");
        match devices.iter().find(|d| same_device(entry, d)) {
            Some(_) if drivers_network_data(entry) => {}
            Some(d) => {
                let network = network_data_json(d);
                if entry["networkData"] != network {
                    edits.push(json!({"op": "add", "path": format!("{path}/networkData"), "value": network}));
                }
                let condition = attached_condition(d, now);
                match (
                    attached_condition_index(entry),
                    entry["conditions"].as_array(),
                ) {
                    (Some(j), _) => {
                        let mine = &entry["conditions"][j];
                        if mine["message"] != condition["message"] || mine["status"] != "True" {
                            edits.push(json!({"op": "replace", "path": format!("{path}/conditions/{j}"), "value": condition}));
                        }
                    }
                    (None, Some(list)) if list.iter().any(|c| c["type"] == "Ready") => {}
                    (None, Some(list)) if !list.is_empty() => {
                        edits.push(json!({"op": "add", "path": format!("{path}/conditions/-"), "value": condition}));
                    }
                    (None, _) => {
                        edits.push(json!({"op": "add", "path": format!("{path}/conditions"), "value": [condition]}));
                    }
                }
            }
            None => {
                let Some(j) = attached_condition_index(entry) else {
                    continue;
                };
                let others = entry.as_object().map_or(0, |m| {
                    m.iter()
                        .filter(|(k, v)| {
                            !matches!(
                                k.as_str(),
                                "driver"
                                    | "pool"
                                    | "device"
                                    | "shareID"
                                    | "networkData"
                                    | "conditions"
                            ) && !v.is_null()
                        })
                        .count()
                });
                let conditions = entry["conditions"].as_array().map_or(0, Vec::len);
                if others == 0 && conditions == 1 {
                    removals.push(json!({"op": "remove", "path": path}));
                } else {
                    edits.push(json!({"op": "remove", "path": format!("{path}/conditions/{j}")}));
                    if !entry["networkData"].is_null() {
                        edits.push(json!({"op": "remove", "path": format!("{path}/networkData")}));
                    }
                }
            }
        }
    }
    for d in devices {
        if !current.iter().any(|e| same_device(e, d)) {
            let mut entry = json!({
                "driver": d.key.driver, "pool": d.key.pool, "device": d.key.device,
                "networkData": network_data_json(d),
                "conditions": [attached_condition(d, now)],
            });
            if let Some(share) = &d.share_id {
                entry["shareID"] = json!(share);
            }
            appends.push(json!({"op": "add", "path": "/status/devices/-", "value": entry}));
        }
    }
    if edits.is_empty() && removals.is_empty() && appends.is_empty() {
        return None;
    }
    let mut ops =
        vec![json!({"op": "test", "path": "/metadata/resourceVersion", "value": resource_version})];
    if current.is_empty() && !appends.is_empty() {
        // `/status/devices/-` needs the list to exist.
        ops.push(json!({"op": "add", "path": "/status/devices", "value": []}));
    }
    ops.extend(edits);
    // Whole entries last and from the end, so that the indices above still name the entries they were read for.
    removals.reverse();
    ops.extend(removals);
    ops.extend(appends);
    Some(Value::Array(ops))
}

impl KubeApi {
    /// Every page of `api`'s list with `params`; `Ok(None)` when the server does not serve the kind (404).
    async fn list_dra<K>(
        &self,
        api: &Api<K>,
        op: &Op<'_>,
        params: ListParams,
    ) -> Result<Option<Vec<K>>, Failure>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        match self.list_pages(api, op, params, MAX_LISTED).await {
            Ok(all) => Ok(Some(all)),
            Err(Failure::Api(status)) if status.code == 404 => Ok(None),
            Err(f) => Err(f),
        }
    }

    /// The claim `namespace`/`name` as planning reads it: `None` when it does not exist, or where DRA is not
    /// served; [`ClaimRead::Unallocated`] for one that has no allocation yet.
    pub async fn claim(&self, claim: &ClaimName) -> Result<ClaimRead, ClusterError> {
        // A node reads each claim of its pods as they start, and an ADD may wait for it: the status writes' budget.
        let api: Api<ResourceClaim> = Api::namespaced(self.status_client.clone(), &claim.namespace);
        let op = Op {
            verb: "get",
            resource: "resourceclaims",
            group: DRA_GROUP,
            namespace: &claim.namespace,
            name: &claim.name,
        };
        match self.call(&op, self.tries(), || api.get(&claim.name)).await {
            Ok(found) => {
                Ok(claim_from_kube(found).map_or(ClaimRead::Unallocated, ClaimRead::Allocated))
            }
            Err(Failure::Api(status)) if status.code == 404 => Ok(ClaimRead::Missing),
            Err(f) => Err(self.generic(&op, ObjectKind::ResourceClaim, f)),
        }
    }

    /// The pod's claims, each read by name (at most [`MAX_POD_CLAIM_ITEMS`]); those missing or not allocated
    /// are left out.
    pub async fn claims_of(&self, pod: &Pod) -> Result<Vec<(ClaimName, ClaimRead)>, ClusterError> {
        let mut found = Vec::new();
        for name in pod.claim_names().into_iter().take(MAX_POD_CLAIM_ITEMS) {
            let claim = ClaimName {
                namespace: pod.namespace.clone(),
                name: name.to_string(),
            };
            let read = self.claim(&claim).await?;
            found.push((claim, read));
        }
        Ok(found)
    }

    /// The devices of `node`'s ResourceSlices; none where DRA is not served.
    pub async fn node_slice_devices(&self, node: &str) -> Result<Vec<SliceDevice>, ClusterError> {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let op = Op {
            verb: "list",
            resource: "resourceslices",
            group: DRA_GROUP,
            namespace: "",
            name: "",
        };
        let selected = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let found = match self.list_dra(&api, &op, selected).await {
            // The server cannot select on the field (a CRD of an older server): every slice, filtered here.
            Err(Failure::Api(status)) if status.code == 400 => {
                tracing::debug!(
                    node,
                    "the server refused the field selector on resourceslices; filtering here"
                );
                self.list_dra(&api, &op, ListParams::default()).await
            }
            other => other,
        }
        .map_err(|f| self.generic(&op, ObjectKind::ResourceClaim, f))?;
        Ok(found
            .unwrap_or_default()
            .into_iter()
            .flat_map(|s| slice_devices(s, node))
            .collect())
    }

    /// What the pod's claims give its networks (thin mode: each of the pod's claims read by name, and the node's
    /// slices only when a claim of the pod has a device).
    pub async fn pod_claims(&self, pod: &Pod) -> Result<PodClaims, ClusterError> {
        if pod.claim_names().is_empty() {
            return Ok(PodClaims::default());
        }
        let read = self.claims_of(pod).await?;
        let allocated: Vec<&Claim> = read.iter().filter_map(|(_, r)| r.allocated()).collect();
        let devices = match (
            &pod.node_name,
            allocated.iter().any(|c| !c.results.is_empty()),
        ) {
            (Some(node), true) => self.node_slice_devices(node).await?,
            _ => Vec::new(),
        };
        Ok(join_pod_claims(pod, &allocated, devices.iter()))
    }

    /// Makes Plexus's part of `claim`'s `status.devices[]` exactly `devices` (empty: takes back what Plexus wrote),
    /// by a JSON patch against the claim as read just before ([`claim_status_patch`]); a claim changed in between
    /// is read again (at most [`CLAIM_WRITE_ATTEMPTS`] times). A claim that is gone needs nothing.
    pub async fn apply_claim_status(
        &self,
        claim: &ClaimName,
        devices: &[DeviceNetworkData],
    ) -> Result<(), ClusterError> {
        // Read as every single claim is (the status writes' budget); the patch goes with the background work.
        let api: Api<ResourceClaim> = Api::namespaced(self.status_client.clone(), &claim.namespace);
        let read = Op {
            verb: "get",
            resource: "resourceclaims",
            group: DRA_GROUP,
            namespace: &claim.namespace,
            name: &claim.name,
        };
        let write = Op {
            verb: "patch",
            resource: "resourceclaims/status",
            ..read
        };
        // One deadline for every read and write of the claim.
        let tries = self.tries();
        let url = format!(
            "/apis/{DRA_API_VERSION}/namespaces/{}/resourceclaims/{}/status?fieldManager={FIELD_MANAGER}",
            claim.namespace, claim.name
        );
        for attempt in 1..=CLAIM_WRITE_ATTEMPTS {
            let found = match self.call(&read, tries, || api.get(&claim.name)).await {
                Ok(found) => found,
                Err(Failure::Api(status)) if status.code == 404 => {
                    tracing::debug!(claim = %claim, "claim gone before its device status was written");
                    return Ok(());
                }
                Err(f) => return Err(self.generic(&read, ObjectKind::ResourceClaim, f)),
            };
            let current: Vec<Value> = found
                .status
                .as_ref()
                .and_then(|s| s.devices.as_ref())
                .map(|d| {
                    d.iter()
                        .filter_map(|e| serde_json::to_value(e).ok())
                        .collect()
                })
                .unwrap_or_default();
            let version = found.metadata.resource_version.unwrap_or_default();
            let now = k8s_openapi::jiff::Timestamp::now()
                .round(k8s_openapi::jiff::Unit::Second)
                .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now())
                .to_string();
            let Some(patch) = claim_status_patch(&current, &version, devices, &now) else {
                return Ok(());
            };
            let body = patch.to_string().into_bytes();
            let answer = self
                .call(&write, tries, || {
                    let request = http::Request::patch(url.as_str())
                        .header(http::header::CONTENT_TYPE, "application/json-patch+json")
                        .body(body.clone())
                        .expect("a valid request");
                    self.client.request::<ResourceClaim>(request)
                })
                .await;
            match answer {
                Ok(_) => return Ok(()),
                Err(Failure::Api(status)) if status.code == 404 => return Ok(()),
                // The test of the resourceVersion failed: the claim changed since it was read.
                Err(Failure::Api(status))
                    if attempt < CLAIM_WRITE_ATTEMPTS
                        && (status.code == 409
                            || (status.code == 422 && status.message.contains("test"))) =>
                {
                    tracing::debug!(claim = %claim, attempt, "claim changed while its device status was written; reading it again");
                }
                Err(f) => return Err(self.generic(&write, ObjectKind::ResourceClaim, f)),
            }
        }
        Err(ClusterError::unavailable(format!(
            "{}: the claim kept changing while its device status was written ({CLAIM_WRITE_ATTEMPTS} attempts)",
            write.describe()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(device: &str, ifname: &str) -> DeviceNetworkData {
        DeviceNetworkData {
            key: DeviceKey {
                driver: "sriov.example.com".into(),
                pool: "node1".into(),
                device: device.into(),
            },
            share_id: None,
            interface_name: Some(ifname.into()),
            ips: vec!["10.1.0.5/24".into()],
            hardware_address: Some("aa:bb:cc:dd:ee:ff".into()),
        }
    }

    fn ops(patch: Option<Value>) -> Vec<(String, String)> {
        patch
            .expect("a patch")
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                (
                    o["op"].as_str().unwrap().to_string(),
                    o["path"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    /// As a 1.37 scheduler writes an allocation: the claim's configuration for request `cni` copied without its
    /// requests, beside a class's configuration for `nic`.
    #[test]
    fn the_allocations_copy_of_the_claims_configuration_is_not_read_twice_or_widened() {
        let parameters =
            json!({"apiVersion": "plexus.dev/v1alpha1", "kind": "NetworkAttachment", "name": "a"});
        let class_parameters =
            json!({"apiVersion": "plexus.dev/v1alpha1", "kind": "NetworkAttachment", "name": "b"});
        let found: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"devices": {
                "requests": [{"name": "cni"}, {"name": "nic"}],
                "config": [{"requests": ["cni"], "opaque": {"driver": "d", "parameters": parameters}}]}},
            "status": {"allocation": {"devices": {
                "results": [{"request": "cni", "driver": "d", "pool": "p", "device": "vf4"},
                            {"request": "nic", "driver": "d", "pool": "p", "device": "vf5"}],
                "config": [
                    {"source": "FromClaim", "opaque": {"driver": "d", "parameters": parameters}},
                    {"source": "FromClass", "requests": ["nic"],
                     "opaque": {"driver": "d", "parameters": class_parameters}}]}}}
        }))
        .expect("a claim");
        let claim = claim_from_kube(found).expect("allocated");
        let read: Vec<(Vec<String>, Value, String, bool)> = claim
            .attachments
            .into_iter()
            .map(|a| {
                (
                    a.requests,
                    a.parameters["name"].clone(),
                    a.driver,
                    a.from_class,
                )
            })
            .collect();
        assert_eq!(
            read,
            [
                (vec!["cni".to_string()], json!("a"), "d".to_string(), false),
                (vec!["nic".to_string()], json!("b"), "d".to_string(), true)
            ],
            "each keeps its opaque.driver; the class's is known as the class's"
        );
    }

    #[test]
    fn new_entries_are_appended_after_the_resource_version_test() {
        let patch = claim_status_patch(&[], "42", &[data("vf0", "net1"), data("vf1", "dra0")], "t");
        let p = patch.clone().unwrap();
        assert_eq!(
            p[0],
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": "42"})
        );
        assert_eq!(
            ops(patch),
            [
                ("test", "/metadata/resourceVersion"),
                ("add", "/status/devices"),
                ("add", "/status/devices/-"),
                ("add", "/status/devices/-"),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );
        assert_eq!(p[2]["value"]["device"], "vf0");
        assert_eq!(p[2]["value"]["networkData"]["interfaceName"], "net1");
        assert_eq!(p[2]["value"]["networkData"]["ips"], json!(["10.1.0.5/24"]));
        assert_eq!(p[2]["value"]["conditions"][0]["reason"], ATTACHED_REASON);
    }

    #[test]
    fn a_drivers_entry_keeps_its_fields_and_its_own_ready_condition() {
        let driver_entry = json!({"driver": "sriov.example.com", "pool": "node1", "device": "vf0",
                                  "data": {"vendor": "x"},
                                  "conditions": [{"type": "Ready", "status": "False", "reason": "Driver"}]});
        let bare_entry = json!({"driver": "sriov.example.com", "pool": "node1", "device": "vf1",
                                "data": {"vendor": "y"}});
        let patch = claim_status_patch(
            &[driver_entry, bare_entry],
            "7",
            &[data("vf0", "net1"), data("vf1", "dra0")],
            "t",
        );
        assert_eq!(
            ops(patch),
            [
                ("test", "/metadata/resourceVersion"),
                ("add", "/status/devices/0/networkData"),
                ("add", "/status/devices/1/networkData"),
                ("add", "/status/devices/1/conditions"),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );
    }

    #[test]
    fn taking_back_removes_only_what_plexus_wrote() {
        let mine = |device: &str, extra: Value| {
            let mut e = json!({"driver": "sriov.example.com", "pool": "node1", "device": device,
                               "networkData": network_data_json(&data(device, "net1")),
                               "conditions": [{"type": "Ready", "status": "True", "reason": ATTACHED_REASON,
                                               "message": "attached by Plexus as net1"}]});
            if let (Some(m), Some(x)) = (e.as_object_mut(), extra.as_object()) {
                m.extend(x.clone());
            }
            e
        };
        let others =
            json!({"driver": "gpu.example.com", "pool": "node1", "device": "g0", "data": {}});
        let current = [
            mine("vf0", json!({})),
            others,
            mine("vf1", json!({"data": {"vendor": "x"}})),
            mine("vf2", json!({})),
        ];
        // vf2 stays attached; vf0 and vf1 were detached.
        let patch = claim_status_patch(&current, "9", &[data("vf2", "net1")], "t");
        assert_eq!(
            ops(patch),
            [
                ("test", "/metadata/resourceVersion"),
                ("remove", "/status/devices/2/conditions/0"),
                ("remove", "/status/devices/2/networkData"),
                ("remove", "/status/devices/0"),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string())),
            "the driver's entry keeps its data, the entry that was Plexus's alone goes, vf2 is as written"
        );
        assert_eq!(
            claim_status_patch(&current[1..2], "9", &[], "t"),
            None,
            "nothing of Plexus's: nothing to do"
        );
    }

    #[test]
    fn shares_are_entries_of_their_own_and_a_drivers_network_data_is_kept() {
        let share = |id: &str, ifname: &str| DeviceNetworkData {
            share_id: Some(id.into()),
            ..data("pf0", ifname)
        };
        // Two shares of one device: two entries, each with its shareID.
        let patch =
            claim_status_patch(&[], "1", &[share("s-1", "net1"), share("s-2", "net2")], "t")
                .unwrap();
        assert_eq!(patch[2]["value"]["shareID"], "s-1");
        assert_eq!(patch[3]["value"]["shareID"], "s-2");
        assert_eq!(patch[3]["value"]["networkData"]["interfaceName"], "net2");
        // Share s-1's entry exists already (the driver's, without network data): edited in place; s-2 appended.
        let current = [
            json!({"driver": "sriov.example.com", "pool": "node1", "device": "pf0",
                              "shareID": "s-1", "data": {}}),
        ];
        assert_eq!(
            ops(claim_status_patch(
                &current,
                "2",
                &[share("s-1", "net1"), share("s-2", "net2")],
                "t"
            )),
            [
                ("test", "/metadata/resourceVersion"),
                ("add", "/status/devices/0/networkData"),
                ("add", "/status/devices/0/conditions"),
                ("add", "/status/devices/-"),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );
        // The driver wrote the device's network data itself: Plexus writes nothing there, takes nothing back.
        let drivers = [
            json!({"driver": "sriov.example.com", "pool": "node1", "device": "vf0",
                              "networkData": {"interfaceName": "eth1", "ips": ["10.9.0.2/24"]}}),
        ];
        assert_eq!(
            claim_status_patch(&drivers, "3", &[data("vf0", "net1")], "t"),
            None
        );
        assert_eq!(claim_status_patch(&drivers, "3", &[], "t"), None);
        // A share's entry that was Plexus's alone goes whole.
        let mine = json!({"driver": "sriov.example.com", "pool": "node1", "device": "pf0", "shareID": "s-1",
                          "networkData": {"interfaceName": "net1"},
                          "conditions": [{"type": "Ready", "status": "True", "reason": ATTACHED_REASON}]});
        assert_eq!(
            ops(claim_status_patch(&[mine], "4", &[], "t")),
            [
                ("test", "/metadata/resourceVersion"),
                ("remove", "/status/devices/0")
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );
    }
}
