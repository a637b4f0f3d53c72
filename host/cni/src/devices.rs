//! The pod's book of devices: its devices from both sources (its ResourceClaims and kubelet's device plugins) and
//! the networks its claims ask for. It is built before planning and handed to the planner, which takes each
//! network's device from it; each device serves one network.
//!
//! The claims are read when the book is built. The device plugins' allocation is asked for the first time a
//! network names a resource no claim carries: that is a round trip to kubelet's socket, and most pods need none.
//! Both are state of the book, which the planner borrows mutably; the planner itself keeps none.

use std::collections::BTreeMap;

use plexus_core::spec::dra::{
    claim_reference, CarriedConfigDrivers, ClaimDevice, ClaimDevices, ClaimName, ClaimNetwork,
    ClaimNetworkRefusal, PodClaims,
};
use plexus_core::spec::objects::PodRef;
use plexus_core::spec::selection::Selection;
use plexus_core::spec::{NetworkAttachmentDefinition, Pod};

use crate::cache::Device;
use crate::effects::Effects;
use crate::error::PlexusError;
use crate::invocation::Invocation;
use crate::podresources::{DeviceAllocator, DeviceSource};

/// A network one of the pod's claims asks for: the claim and request whose device it uses, and the NAD a CNI
/// configuration carried in the claim stands for.
#[derive(Debug, Clone)]
pub(crate) struct FromClaim {
    pub(crate) claim: ClaimName,
    pub(crate) request: String,
    pub(crate) carried: Option<NetworkAttachmentDefinition>,
}

/// The networks of the pod's claims, by `namespace/name`.
pub(crate) type ClaimNetworks = BTreeMap<String, FromClaim>;

/// The pod's devices and its claims' networks (see the module docs).
pub(crate) struct DeviceBook<'a> {
    /// The claims' devices not yet given to a network.
    claims: ClaimDevices,
    /// The networks the claims ask for, as the claims carry them.
    networks: Vec<ClaimNetwork>,
    plugins: PluginDevices<'a>,
}

/// kubelet's device-plugin devices of the pod: not asked yet, or asked and being given out.
enum PluginDevices<'a> {
    Unasked {
        source: &'a dyn DeviceSource,
        pod: Option<PodRef>,
    },
    Asked(DeviceAllocator),
}

impl<'a> DeviceBook<'a> {
    /// A book of `claims`, with the device plugins' devices of `pod` asked of `source` when first needed.
    pub(crate) fn new(
        claims: PodClaims,
        source: &'a dyn DeviceSource,
        pod: Option<PodRef>,
    ) -> Self {
        DeviceBook {
            claims: ClaimDevices::new(claims.devices),
            networks: claims.networks,
            plugins: PluginDevices::Unasked { source, pod },
        }
    }

    /// A book without claims: the invocation's device plugins only.
    pub(crate) fn without_claims(inv: &Invocation, fx: &Effects<'a>) -> Self {
        Self::new(PodClaims::default(), fx.devices, inv.pod.clone())
    }

    /// The book of `pod` for `inv`: its claims read from the cluster source when `dynamicResourceAllocation` is on
    /// (none otherwise, without a cluster source, or without a pod). A source that may not read claims (RBAC from
    /// before DRA) gives none, with a warning: the pod's other networks still attach.
    pub(crate) fn read(
        inv: &Invocation,
        fx: &Effects<'a>,
        pod: Option<&Pod>,
    ) -> Result<Self, PlexusError> {
        let claims = match (inv.conf.dra, fx.cluster, pod) {
            (true, Some(cluster), Some(pod)) => match cluster.pod_claims(pod) {
                Ok(found) => found,
                Err(e @ plexus_cluster::ClusterError::Forbidden { .. }) => {
                    tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), "not reading the pod's ResourceClaims: {e}");
                    PodClaims::default()
                }
                Err(e) => return Err(PlexusError::from(e).context("the pod's ResourceClaims")),
            },
            _ => PodClaims::default(),
        };
        Ok(Self::new(claims, fx.devices, inv.pod.clone()))
    }

    /// The networks the claims ask for, added after `selections` (the annotation's): one the annotation names
    /// already is attached once, with the claim's device. A malformed request fails, naming the claim. A
    /// configuration for another driver than its devices' asks for nothing (logged); a CNI configuration carried
    /// where `carried` does not allow it fails the ADD.
    pub(crate) fn claim_networks(
        &self,
        selections: &mut Vec<Selection>,
        carried: &CarriedConfigDrivers,
    ) -> Result<ClaimNetworks, PlexusError> {
        let mut bound = ClaimNetworks::new();
        for net in &self.networks {
            let at = || format!("ResourceClaim {} (request {:?})", net.claim, net.request);
            match net.admitted(carried) {
                Ok(()) => {}
                Err(ClaimNetworkRefusal::NotTheDevicesDriver(why)) => {
                    tracing::warn!(claim = %net.claim, request = %net.request, "not attaching the network of a claim's configuration: {why}");
                    continue;
                }
                Err(ClaimNetworkRefusal::CarriedNotAllowed(why)) => {
                    return Err(PlexusError::config(at(), why));
                }
            }
            let (sel, carried) = net
                .network()
                .map_err(|why| PlexusError::config(format!("{}: opaque parameters", at()), why))?;
            let name = sel.namespaced_name();
            let selected = selections.iter().any(|s| s.namespaced_name() == name);
            if carried.is_some() && (bound.contains_key(&name) || selected) {
                return Err(PlexusError::config(
                    at(),
                    format!("its CNI configuration's network {name} is a network the pod selects already; give the configuration another name"),
                ));
            }
            if bound.contains_key(&name) {
                tracing::warn!(claim = %net.claim, network = %name, "another claim asks for this network already; attaching it once");
                continue;
            }
            if !selected {
                selections.push(sel);
            }
            let from = FromClaim {
                claim: net.claim.clone(),
                request: net.request.clone(),
                carried,
            };
            bound.insert(name, from);
        }
        Ok(bound)
    }

    /// The device a claim's network will get, without giving it out (what the policy hooks are shown).
    pub(crate) fn peek(&self, from: &FromClaim) -> Option<ClaimDevice> {
        self.claims.peek_request(&from.claim, &from.request)
    }

    /// Gives out the device of a selection's network: the device of the claim it names
    /// ([`plexus_core::spec::dra::CLAIM_REFERENCE_KEY`]), else of the claim that asks for the network, else the
    /// next device of the NAD's `resource`; none for a network without any of these.
    pub(crate) fn take(
        &mut self,
        sel: &Selection,
        resource: Option<String>,
        from_claim: Option<&FromClaim>,
    ) -> Result<Option<Device>, PlexusError> {
        let network = || format!("network {}", sel.namespaced_name());
        let reference = claim_reference(sel).map_err(|why| PlexusError::config(network(), why))?;
        if let Some(reference) = reference {
            let d = self.claims.take_referenced(&reference).ok_or_else(|| {
                PlexusError::config(
                    network(),
                    format!("{reference} has no allocated device left for it (the pod's claims are those of its spec.resourceClaims; each device serves one network)"),
                )
            })?;
            return Ok(Some(Device::of_claim(resource, d)));
        }
        match (from_claim, resource) {
            (Some(f), resource) => self.take_request(f, resource).map(Some),
            (None, Some(resource)) => self.take_resource(&resource).map(Some),
            (None, None) => Ok(None),
        }
    }

    /// The device of the claim's request for a network the claim asks for.
    fn take_request(
        &mut self,
        from: &FromClaim,
        resource: Option<String>,
    ) -> Result<Device, PlexusError> {
        let d = self
            .claims
            .take_request(&from.claim, &from.request)
            .ok_or_else(|| {
                PlexusError::config(
                    format!("ResourceClaim {}", from.claim),
                    format!(
                        "request {:?} has no allocated device left for its network",
                        from.request
                    ),
                )
            })?;
        Ok(Device::of_claim(resource, d))
    }

    /// The next of the pod's devices of `resource`: a claim's device with that resourceName where the claims
    /// have one (Dynamic Resource Allocation), else a device plugin's (Device Information Specification 4.1).
    fn take_resource(&mut self, resource: &str) -> Result<Device, PlexusError> {
        if self.claims.has_resource(resource) {
            let d = self.claims.take_resource(resource).ok_or_else(|| {
                PlexusError::config(
                    "the pod's ResourceClaims",
                    format!("no device of resource {resource} left for this network (each network takes its own)"),
                )
            })?;
            return Ok(Device::of_claim(Some(resource.to_string()), d));
        }
        let id = self
            .plugins()
            .map_err(|e| e.context(format!("devices of resource {resource}")))?
            .take(resource)
            .map_err(|why| PlexusError::config(format!("resource {resource}"), why))?;
        Ok(Device {
            resource: resource.to_string(),
            id,
            claim: None,
        })
    }

    /// The device plugins' devices, asked of kubelet the first time.
    fn plugins(&mut self) -> Result<&mut DeviceAllocator, PlexusError> {
        if let PluginDevices::Unasked { source, pod } = &self.plugins {
            let pod = pod.as_ref().ok_or_else(|| {
                PlexusError::config("device plugins", "no pod to ask devices for")
            })?;
            self.plugins = PluginDevices::Asked(DeviceAllocator::new(source.allocated(pod)?));
        }
        match &mut self.plugins {
            PluginDevices::Asked(alloc) => Ok(alloc),
            PluginDevices::Unasked { .. } => unreachable!("asked above"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::podresources::Allocated;
    use serde_json::json;
    use std::cell::Cell;

    /// Counts how often kubelet is asked.
    struct Counted {
        allocated: Allocated,
        asked: Cell<usize>,
    }

    impl DeviceSource for Counted {
        fn allocated(&self, _pod: &PodRef) -> Result<Allocated, PlexusError> {
            self.asked.set(self.asked.get() + 1);
            Ok(self.allocated.clone())
        }
    }

    fn plugins(resource: &str, ids: &[&str]) -> Counted {
        let mut allocated = Allocated::new();
        allocated.insert(resource.into(), ids.iter().map(|s| s.to_string()).collect());
        Counted {
            allocated,
            asked: Cell::new(0),
        }
    }

    fn pod_ref() -> Option<PodRef> {
        Some(PodRef {
            namespace: "ns".into(),
            name: "p".into(),
            uid: None,
        })
    }

    fn claim_name(name: &str) -> ClaimName {
        ClaimName {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn device(
        claim: &str,
        pod_claim: &str,
        request: &str,
        id: &str,
        resource: Option<&str>,
    ) -> ClaimDevice {
        ClaimDevice {
            claim: claim_name(claim),
            pod_claim: pod_claim.into(),
            request: request.into(),
            key: plexus_core::spec::dra::DeviceKey {
                driver: "sriov.example.com".into(),
                pool: "node-a".into(),
                device: id.into(),
            },
            share_id: None,
            device_id: Some(id.into()),
            resource_name: resource.map(str::to_string),
        }
    }

    fn network(claim: &str, request: &str, parameters: serde_json::Value) -> ClaimNetwork {
        ClaimNetwork {
            claim: claim_name(claim),
            request: request.into(),
            driver: "sriov.example.com".into(),
            from_class: false,
            device_drivers: vec!["sriov.example.com".into()],
            parameters,
        }
    }

    /// A node conf that lets the test driver's claims carry CNI configurations.
    fn carrying() -> CarriedConfigDrivers {
        CarriedConfigDrivers {
            claim: vec!["sriov.example.com".into()],
            class: Vec::new(),
        }
    }

    fn attachment(ns: &str, name: &str) -> serde_json::Value {
        json!({"apiVersion": "plexus.dev/v1alpha1", "kind": "NetworkAttachment",
               "namespace": ns, "name": name})
    }

    #[test]
    fn a_claims_network_takes_its_requests_device_and_the_hooks_see_it_first() {
        let source = plugins("vendor/nic", &["0000:01:00.0"]);
        let claims = PodClaims {
            devices: vec![
                device("c1", "nic", "a", "dev-a", None),
                device("c1", "nic", "b", "dev-b", None),
            ],
            networks: vec![network("c1", "b", attachment("ns", "fast"))],
        };
        let mut book = DeviceBook::new(claims, &source, pod_ref());
        let mut selections = vec![Selection::new("ns", "plain")];
        let from = book
            .claim_networks(&mut selections, &carrying())
            .expect("networks");
        assert_eq!(
            selections
                .iter()
                .map(Selection::namespaced_name)
                .collect::<Vec<_>>(),
            ["ns/plain", "ns/fast"]
        );
        let f = &from["ns/fast"];
        assert_eq!(book.peek(f).expect("shown").key.device, "dev-b");
        let got = book
            .take(&selections[1], None, Some(f))
            .expect("taken")
            .expect("a device");
        assert_eq!(got.id, "dev-b");
        assert!(book.peek(f).is_none(), "each device serves one network");
        assert!(book
            .take(&selections[0], None, None)
            .expect("none")
            .is_none());
        assert_eq!(
            source.asked.get(),
            0,
            "no network needed a device plugin's device"
        );
    }

    #[test]
    fn a_resource_comes_from_the_claims_before_the_device_plugins_which_are_asked_once() {
        let source = plugins("vendor/nic", &["pci-1", "pci-2"]);
        let claims = PodClaims {
            devices: vec![device("c1", "nic", "a", "dra-1", Some("vendor/dra"))],
            networks: vec![],
        };
        let mut book = DeviceBook::new(claims, &source, pod_ref());
        let sel = Selection::new("ns", "n");
        let dra = book
            .take(&sel, Some("vendor/dra".into()), None)
            .unwrap()
            .unwrap();
        assert_eq!((dra.id.as_str(), dra.claim.is_some()), ("dra-1", true));
        let err = book
            .take(&sel, Some("vendor/dra".into()), None)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("no device of resource vendor/dra left"),
            "{err}"
        );
        assert_eq!(source.asked.get(), 0);
        let ids: Vec<String> = (0..2)
            .map(|_| {
                book.take(&sel, Some("vendor/nic".into()), None)
                    .unwrap()
                    .unwrap()
                    .id
            })
            .collect();
        assert_eq!(ids, ["pci-1", "pci-2"]);
        let err = book
            .take(&sel, Some("vendor/nic".into()), None)
            .unwrap_err();
        assert!(
            err.to_string().contains("more of its networks need one"),
            "{err}"
        );
        assert_eq!(source.asked.get(), 1, "kubelet asked once");
    }

    #[test]
    fn a_selections_claim_reference_picks_that_claims_device() {
        let source = plugins("vendor/nic", &[]);
        let claims = PodClaims {
            devices: vec![
                device("gen-1", "first", "r", "one", Some("vendor/nic")),
                device("gen-2", "second", "r", "two", Some("vendor/nic")),
            ],
            networks: vec![],
        };
        let mut book = DeviceBook::new(claims, &source, pod_ref());
        let mut sel = Selection::new("ns", "n");
        sel.extras.insert(
            plexus_core::spec::dra::CLAIM_REFERENCE_KEY.into(),
            json!({"name": "second"}),
        );
        let got = book
            .take(&sel, Some("vendor/nic".into()), None)
            .unwrap()
            .unwrap();
        assert_eq!(got.id, "two");
        let err = book.take(&sel, None, None).unwrap_err();
        assert!(
            err.to_string().contains("no allocated device left"),
            "{err}"
        );
        // The other claim's device is still there for the resource.
        let next = book.take(&Selection::new("ns", "m"), Some("vendor/nic".into()), None);
        assert_eq!(next.unwrap().unwrap().id, "one");
    }

    #[test]
    fn a_carried_configuration_may_not_take_a_selected_networks_name() {
        let source = plugins("vendor/nic", &[]);
        let carried = json!({"apiVersion": "cni.networking.x-k8s.io/v1alpha1", "kind": "CNI",
            "ifName": "net1", "config": {"cniVersion": "1.0.0", "name": "plain", "plugins": [{"type": "bridge"}]}});
        let claims = PodClaims {
            devices: vec![],
            networks: vec![network("c1", "a", carried)],
        };
        let book = DeviceBook::new(claims, &source, pod_ref());
        let mut selections = vec![Selection::new("ns", "plain")];
        let err = book
            .claim_networks(&mut selections, &carrying())
            .unwrap_err();
        assert!(err.to_string().contains("ResourceClaim ns/c1"), "{err}");
        assert!(err.to_string().contains("another name"), "{err}");
    }

    #[test]
    fn without_a_pod_a_device_plugins_resource_fails_naming_it() {
        let source = plugins("vendor/nic", &["pci-1"]);
        let mut book = DeviceBook::new(PodClaims::default(), &source, None);
        let err = book
            .take(&Selection::new("ns", "n"), Some("vendor/nic".into()), None)
            .unwrap_err();
        assert!(err.to_string().contains("vendor/nic"), "{err}");
        assert_eq!(source.asked.get(), 0);
    }
}
