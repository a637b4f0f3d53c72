//! Dynamic Resource Allocation through the Kubernetes API: a pod's ResourceClaims and the node's ResourceSlices
//! (`resource.k8s.io/v1`), trimmed to planning's types, and the claim's device status written back.
//!
//! A cluster that does not serve `resource.k8s.io/v1` (404) has no claims: nothing fails for it. A server that
//! refuses the field selector on `spec.nodeName` (CRD stand-ins of older servers answer 400) is asked for every
//! slice, and the client keeps the node's.

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, Patch, PatchParams};
use plexus_core::spec::dra::{
    pod_claims, AllocatedDevice, AttachmentConfig, Claim, ClaimName, DeviceKey, DeviceNetworkData,
    PodClaims, SliceDevice, DEVICE_ID_ATTRIBUTE, RESOURCE_NAME_ATTRIBUTE,
};
use plexus_core::spec::Pod;
use serde_json::{json, Value};

use super::{Failure, KubeApi, Op, FIELD_MANAGER};
use crate::{ClusterError, ObjectKind};

/// The API group and version of DRA's objects.
pub const DRA_API_VERSION: &str = "resource.k8s.io/v1";
const DRA_GROUP: &str = "resource.k8s.io";
/// The most objects of one kind a node reads in one list (pages of 500).
const MAX_LISTED: usize = 20_000;

/// The claim as planning reads it; `None` for a claim not allocated (it gives no device).
pub fn claim_from_kube(found: ResourceClaim) -> Option<Claim> {
    let status = found.status?;
    let allocation = status.allocation?.devices.unwrap_or_default();
    let mut claim = Claim {
        name: ClaimName {
            namespace: found.metadata.namespace.unwrap_or_default(),
            name: found.metadata.name.unwrap_or_default(),
        },
        reserved_for: status
            .reserved_for
            .unwrap_or_default()
            .into_iter()
            .map(|r| r.uid)
            .collect(),
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
        .map(|c| (c.requests, c.opaque));
    let from_allocation = allocation
        .config
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.requests, c.opaque));
    for (requests, opaque) in from_spec.chain(from_allocation) {
        let Some(parameters) = opaque.map(|o| o.parameters.0) else {
            continue;
        };
        if Claim::is_attachment(&parameters) {
            claim.add_attachment(AttachmentConfig {
                requests: requests.unwrap_or_default(),
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

/// The server-side apply body of Plexus's part of a claim's `status.devices[]`: one entry per device with its
/// network data and a `Ready` condition. An empty `devices` gives up every entry Plexus wrote.
pub fn claim_status_apply(claim: &ClaimName, devices: &[DeviceNetworkData], now: &str) -> Value {
    let entries: Vec<Value> = devices
        .iter()
        .map(|d| {
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
            json!({
                "driver": d.key.driver,
                "pool": d.key.pool,
                "device": d.key.device,
                "networkData": network,
                "conditions": [{
                    "type": "Ready",
                    "status": "True",
                    "reason": "NetworkAttached",
                    "message": format!("attached by Plexus as {}", d.interface_name.as_deref().unwrap_or("?")),
                    "lastTransitionTime": now,
                }],
            })
        })
        .collect();
    json!({
        "apiVersion": DRA_API_VERSION,
        "kind": "ResourceClaim",
        "metadata": { "name": claim.name, "namespace": claim.namespace },
        "status": { "devices": entries },
    })
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

    /// The allocated claims of `namespace`; none where DRA is not served.
    pub async fn claims_in(&self, namespace: &str) -> Result<Vec<Claim>, ClusterError> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        let op = Op {
            verb: "list",
            resource: "resourceclaims",
            group: DRA_GROUP,
            namespace,
            name: "",
        };
        let found = self
            .list_dra(&api, &op, ListParams::default())
            .await
            .map_err(|f| Self::generic(&op, ObjectKind::ResourceClaim, f))?;
        Ok(found
            .unwrap_or_default()
            .into_iter()
            .filter_map(claim_from_kube)
            .collect())
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
        .map_err(|f| Self::generic(&op, ObjectKind::ResourceClaim, f))?;
        Ok(found
            .unwrap_or_default()
            .into_iter()
            .flat_map(|s| slice_devices(s, node))
            .collect())
    }

    /// What the pod's claims give its networks (thin mode: one list of the namespace's claims, and the node's
    /// slices only when a claim of the pod has a device).
    pub async fn pod_claims(&self, pod: &Pod) -> Result<PodClaims, ClusterError> {
        let claims = self.claims_in(&pod.namespace).await?;
        let mine = plexus_core::spec::dra::claims_of_pod(
            &pod.namespace,
            pod.uid.as_deref(),
            &pod.resource_claims,
            &claims,
        );
        if mine.is_empty() {
            return Ok(PodClaims::default());
        }
        let devices = match (&pod.node_name, mine.iter().any(|c| !c.results.is_empty())) {
            (Some(node), true) => self.node_slice_devices(node).await?,
            _ => Vec::new(),
        };
        Ok(pod_claims(mine, |k| {
            devices.iter().find(|d| d.key == *k).cloned()
        }))
    }

    /// Applies Plexus's entries of `claim`'s `status.devices[]` (server-side apply on the status subresource,
    /// field manager `plexus`, forced: the entries are Plexus's own). A claim that is gone is no error.
    pub async fn apply_claim_status(
        &self,
        claim: &ClaimName,
        devices: &[DeviceNetworkData],
    ) -> Result<(), ClusterError> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &claim.namespace);
        let op = Op {
            verb: "patch",
            resource: "resourceclaims/status",
            group: DRA_GROUP,
            namespace: &claim.namespace,
            name: &claim.name,
        };
        let now = k8s_openapi::jiff::Timestamp::now()
            .round(k8s_openapi::jiff::Unit::Second)
            .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now())
            .to_string();
        let body = claim_status_apply(claim, devices, &now);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let patch = Patch::Apply(&body);
        match self
            .call(&op, self.deadline(), self.settings.retries, || {
                api.patch_status(&claim.name, &params, &patch)
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(Failure::Api(status)) if status.code == 404 => {
                tracing::debug!(claim = %claim, "claim gone before its device status was written");
                Ok(())
            }
            Err(f) => Err(Self::generic(&op, ObjectKind::ResourceClaim, f)),
        }
    }
}
