//! Cluster sources: where Plexus reads pods and NetworkAttachmentDefinitions and writes network-status.
//!
//! The orchestration only sees the [`Cluster`] trait. [`FileCluster`] reads a directory of manifests
//! (development, demos, tests); the Kubernetes API source lives beside it.

pub mod backoff;
mod file;
mod kube;
pub mod observe;
pub mod ratelimit;
#[cfg(feature = "watch")]
mod watch;

#[cfg(feature = "watch")]
pub use self::kube::explain_watch;
pub use self::kube::ClaimRead;
pub use self::kube::{
    claim_from_kube, claim_status_patch, error_chain, explain, skipped_objects, slice_devices,
    ConfigSource, KubeApi, KubeCluster, KubeSettings, KubectlSelection, Unreachable,
    ADDED_INTERFACE, DRA_API_VERSION, MAX_OBJECT_BYTES, MAX_RESPONSE_BYTES,
};
pub use file::FileCluster;
use plexus_core::spec::dra::{ClaimName, DeviceNetworkData, PodClaims};
use plexus_core::spec::{NetworkAttachmentDefinition, Pod, PodRef};
use serde::{Deserialize, Serialize};
#[cfg(feature = "watch")]
pub use watch::{run_watches, DraServed, NodeCache, WatchSettings, DEFAULT_NAD_BUDGET_BYTES};

/// What a lookup in a cache found.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup<T> {
    Found(T),
    /// The cache holds a complete list and the object is not in it (it may not have arrived yet).
    Missing,
    /// The first list has not completed: the cache cannot tell.
    Unsynced,
}

/// A cache's state, for health reports and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheHealth {
    pub pods_synced: bool,
    pub nads_synced: bool,
    pub pods: usize,
    pub nads: usize,
    /// Completed lists of pods (the first one, then one per relist).
    pub pod_lists: u64,
    pub nad_lists: u64,
    /// Watch errors seen (each is retried with backoff).
    pub watch_errors: u64,
    /// Whether the cluster serves DRA (`resource.k8s.io/v1`); absent until known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dra: Option<bool>,
    /// Whether the node's slices have listed.
    #[serde(default)]
    pub dra_synced: bool,
    /// Allocated claims cached (those the node's pods use), and devices of this node's slices.
    #[serde(default)]
    pub claims: usize,
    #[serde(default)]
    pub slice_devices: usize,
    /// Reads of single claims made since start (by the cache's reader and for ADDs it could not answer).
    #[serde(default)]
    pub claim_reads: u64,
    /// What the cached NADs weigh (bytes), and how many were dropped since start to keep within the budget (each
    /// is read by name when an ADD needs it).
    #[serde(default)]
    pub nad_bytes: u64,
    #[serde(default)]
    pub nads_evicted: u64,
}

impl CacheHealth {
    /// The caches answer an ADD alone: pods and NADs listed, and whether the API server serves Dynamic Resource
    /// Allocation known and, where it does, the claims and slices listed.
    pub fn settled(&self) -> bool {
        self.pods_synced
            && self.nads_synced
            && match self.dra {
                Some(true) => self.dra_synced,
                Some(false) => true,
                None => false,
            }
    }
}

/// The kinds of object a cluster source reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ObjectKind {
    #[serde(rename = "pod")]
    Pod,
    NetworkAttachmentDefinition,
    #[serde(rename = "event")]
    Event,
    ResourceClaim,
}

impl std::fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ObjectKind::Pod => "pod",
            ObjectKind::NetworkAttachmentDefinition => "NetworkAttachmentDefinition",
            ObjectKind::Event => "event",
            ObjectKind::ResourceClaim => "ResourceClaim",
        })
    }
}

/// What can go wrong talking to a cluster source. Messages name the object involved.
///
/// It is also what the node daemon answers a failed request with: one line of JSON tagged by `kind`, so the
/// CNI process meets the same error it would have met reading the API itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum ClusterError {
    #[error("{object} {namespace}/{name} not found")]
    NotFound {
        object: ObjectKind,
        namespace: String,
        name: String,
    },
    #[error("pod {pod} has uid {actual}, but the runtime asked for uid {expected}")]
    UidMismatch {
        pod: String,
        expected: String,
        actual: String,
    },
    #[error("forbidden: {message}")]
    Forbidden { message: String },
    /// The API server refused the node's CNI credentials (401): those `plexus install` wrote, which end with the
    /// DaemonSet pod they belong to (see [`crate::KubeCluster`] for how a call waits for new ones).
    #[error("forbidden: {message}")]
    CredentialsRefused { message: String },
    #[error("cluster source unavailable: {message}")]
    Unavailable { message: String },
    #[error("invalid {what}: {reason}")]
    Invalid { what: String, reason: String },
    /// A local file or resource the source could not use (the files source's directory, the client's runtime).
    #[error("{path}: {message}")]
    Io { path: String, message: String },
}

impl ClusterError {
    /// True when retrying later could succeed (maps to CNI code 11, "try again later").
    pub fn is_transient(&self) -> bool {
        matches!(self, ClusterError::Unavailable { .. })
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        ClusterError::Forbidden {
            message: message.into(),
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        ClusterError::Unavailable {
            message: message.into(),
        }
    }

    pub fn io(path: impl Into<String>, source: &std::io::Error) -> Self {
        ClusterError::Io {
            path: path.into(),
            message: source.to_string(),
        }
    }
}

/// A source of pods and NetworkAttachmentDefinitions, and the sink for network-status and events.
///
/// Implementations are synchronous: a CNI invocation is one short-lived process doing one thing at a time.
pub trait Cluster {
    /// The pod; when `pod.uid` is set, a pod with another UID is [`ClusterError::UidMismatch`].
    fn pod(&self, pod: &PodRef) -> Result<Pod, ClusterError>;
    /// The NetworkAttachmentDefinition `namespace/name`.
    fn nad(&self, namespace: &str, name: &str)
        -> Result<NetworkAttachmentDefinition, ClusterError>;
    /// What the pod's ResourceClaims give its networks (Dynamic Resource Allocation). A source without DRA, or a
    /// cluster that does not serve it, has none.
    fn pod_claims(&self, _pod: &Pod) -> Result<PodClaims, ClusterError> {
        Ok(PodClaims::default())
    }
    /// Writes Plexus's entries of a claim's `status.devices[]` for `pod` (all of them: an empty list takes back
    /// every entry written before).
    fn write_claim_status(
        &self,
        _pod: &PodRef,
        _claim: &ClaimName,
        _devices: &[DeviceNetworkData],
    ) -> Result<(), ClusterError> {
        Ok(())
    }
    /// Publishes the network-status annotation value (a JSON list, spec 5) on the pod.
    fn write_status(&self, pod: &PodRef, network_status: &str) -> Result<(), ClusterError>;
    /// Records an event about a pod (a Kubernetes Event where the source supports it): an interface added, or a
    /// problem an operator should see.
    fn record(&self, _event: &PodEvent<'_>) -> Result<(), ClusterError> {
        Ok(())
    }
    /// What an ADD publishes at its end: the network-status value, one AddedInterface record per secondary network,
    /// then each claim's device status (`claims`: every claim an attachment's device came from, with Plexus's
    /// entries). Events and claim writes are best effort (a failed claim write is logged); the status write's
    /// outcome is returned. A source that can send them all together does so (the node daemon's client sends every
    /// request, then reads the answers).
    fn publish(
        &self,
        pod: &PodRef,
        node: Option<&str>,
        network_status: &str,
        attachments: &[String],
        claims: &[(ClaimName, Vec<DeviceNetworkData>)],
    ) -> Result<(), ClusterError> {
        let status = self.write_status(pod, network_status);
        for message in attachments {
            let _ = self.record(&PodEvent::attached(pod, node, message));
        }
        for (claim, devices) in claims {
            if let Err(e) = self.write_claim_status(pod, claim, devices) {
                tracing::warn!(pod = %pod, claim = %claim, "cannot write the claim's device status: {e}");
            }
        }
        status
    }
}

/// An event about a pod, as the node the pod runs on reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodEvent<'a> {
    pub pod: &'a PodRef,
    /// The pod's node (its `spec.nodeName`; `None` when the pod was not read), which reports the event: a node's
    /// identity may post events only as that node.
    pub node: Option<&'a str>,
    /// A Warning, or a Normal event.
    pub warning: bool,
    pub reason: &'a str,
    pub message: &'a str,
}

impl<'a> PodEvent<'a> {
    /// An interface added ([`ADDED_INTERFACE`]).
    pub fn attached(pod: &'a PodRef, node: Option<&'a str>, message: &'a str) -> Self {
        PodEvent {
            pod,
            node,
            warning: false,
            reason: ADDED_INTERFACE,
            message,
        }
    }

    /// A problem an operator should see, for `reason`.
    pub fn warning(
        pod: &'a PodRef,
        node: Option<&'a str>,
        reason: &'a str,
        message: &'a str,
    ) -> Self {
        PodEvent {
            pod,
            node,
            warning: true,
            reason,
            message,
        }
    }
}
