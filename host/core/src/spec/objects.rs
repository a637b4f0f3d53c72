//! The Kubernetes objects Plexus reads: the parts of a Pod and of a NetworkAttachmentDefinition it uses.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The selection annotation (spec 4.1).
pub const NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";
/// The status annotation (spec 5).
pub const NETWORK_STATUS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/network-status";

/// Which pod an invocation is for, from `K8S_POD_NAMESPACE`, `K8S_POD_NAME`, `K8S_POD_UID` in `CNI_ARGS`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The parts of a Pod that Plexus reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub uid: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// `spec.nodeName`, where the source read it.
    #[serde(default, rename = "nodeName", skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The pod's `spec.resourceClaims[]`, in order, each with the ResourceClaim it is, where the source read them.
    #[serde(
        default,
        rename = "resourceClaims",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub resource_claims: Vec<PodClaimRef>,
}

/// One of a pod's `spec.resourceClaims[]`: the name the pod gives it, and the ResourceClaim it is: its
/// `resourceClaimName`, or for a template the claim made from it as `status.resourceClaimStatuses[]` names it
/// (`None` until the claim is made, or when the template needs none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "PodClaimWire")]
pub struct PodClaimRef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
}

/// A [`PodClaimRef`] as read: daemons before it sent the claims' names alone.
#[derive(Deserialize)]
#[serde(untagged)]
enum PodClaimWire {
    Ref {
        name: String,
        #[serde(default)]
        claim: Option<String>,
    },
    Name(String),
}

impl From<PodClaimWire> for PodClaimRef {
    fn from(w: PodClaimWire) -> Self {
        match w {
            PodClaimWire::Ref { name, claim } => PodClaimRef { name, claim },
            PodClaimWire::Name(n) => PodClaimRef {
                name: n.clone(),
                claim: Some(n),
            },
        }
    }
}

impl Pod {
    /// The raw value of the selection annotation, if the pod has one.
    pub fn networks_annotation(&self) -> Option<&str> {
        self.annotations
            .get(NETWORKS_ANNOTATION)
            .map(String::as_str)
    }

    /// The names of the ResourceClaims the pod uses, in its order, each once.
    pub fn claim_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for name in self
            .resource_claims
            .iter()
            .filter_map(|r| r.claim.as_deref())
        {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }
}

/// A NetworkAttachmentDefinition (spec 3.2), as Plexus sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkAttachmentDefinition {
    pub namespace: String,
    pub name: String,
    /// `spec.config`: a CNI config or config list as a JSON string. `None` when the object has no spec or
    /// an empty config (spec 3.2.4: the implementation resolves the name itself).
    pub config: Option<String>,
    pub annotations: BTreeMap<String, String>,
}
