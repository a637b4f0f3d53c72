//! An in-memory API server for the daemon's in-process tests ([`FakeApi`]), and a [`NodeState`] over it with
//! caches filled by hand: what the real-process suites do over kube-apiserver, here in milliseconds on tokio's
//! paused clock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::watcher::Event;
use plexus_cluster::{ClusterError, NodeCache, ObjectKind};
use plexus_core::spec::{NetworkAttachmentDefinition, Pod, PodRef};

use super::metrics::{HookStates, Metrics};
use super::state::{Load, NodeApi, NodeState, StateParts};
use super::status_queue::StatusQueue;

/// What the fake API server was asked, and when (tokio's clock).
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    Pod(String),
    Nad(String),
    Write {
        pod: String,
        value: String,
    },
    Event {
        pod: String,
        kind: String,
        reason: String,
    },
    /// An event seen again, counted: its name and count.
    Count {
        event: String,
        count: i32,
    },
    /// The claims of a pod read by name (the pod's `namespace/name`); the fake has none allocated.
    Claims(String),
    /// A claim's device status applied: the claim and the interfaces of its entries.
    Claim {
        claim: String,
        interfaces: Vec<String>,
    },
}

/// An API server in memory: pods and NADs by `namespace/name`, down (every call `Unavailable`) when told so,
/// and event posts that hang while `hold_events` is set.
#[derive(Default)]
pub struct FakeApi {
    pub pods: Mutex<HashMap<String, Pod>>,
    pub nads: Mutex<HashMap<String, NetworkAttachmentDefinition>>,
    pub down: AtomicBool,
    pub hold_events: AtomicBool,
    pub no_events: AtomicBool,
    /// How many of the next calls the server refuses as forbidden (a server whose authorizer has not synced).
    pub forbid: AtomicUsize,
    /// How long each call takes.
    pub latency: Mutex<Duration>,
    calls: Mutex<Vec<(tokio::time::Instant, Call)>>,
    /// Every call, answered or refused, with when it arrived.
    attempts: Mutex<Vec<(tokio::time::Instant, Call)>>,
    answered: AtomicUsize,
}

impl FakeApi {
    pub fn new() -> Arc<FakeApi> {
        Arc::new(FakeApi::default())
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Every call so far, with when it was made.
    pub fn calls(&self) -> Vec<(tokio::time::Instant, Call)> {
        self.calls.lock().unwrap().clone()
    }

    /// The status writes the server took (not those it refused while down).
    pub fn writes(&self) -> Vec<(String, String)> {
        self.calls()
            .into_iter()
            .filter_map(|(_, c)| match c {
                Call::Write { pod, value } => Some((pod, value)),
                _ => None,
            })
            .collect()
    }

    /// Every call that arrived, answered or not.
    pub fn attempts(&self) -> Vec<(tokio::time::Instant, Call)> {
        self.attempts.lock().unwrap().clone()
    }

    /// Calls the server answered with success.
    pub fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }

    async fn call<T>(
        &self,
        call: Call,
        answer: impl FnOnce() -> Result<T, ClusterError>,
    ) -> Result<T, ClusterError> {
        self.attempts
            .lock()
            .unwrap()
            .push((tokio::time::Instant::now(), call.clone()));
        let latency = *self.latency.lock().unwrap();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if self.down.load(Ordering::SeqCst) {
            return Err(ClusterError::unavailable(
                "connection refused (the fake API server is down)",
            ));
        }
        let forbidden = self
            .forbid
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if forbidden {
            return Err(ClusterError::forbidden("the fake API server refuses it"));
        }
        let result = answer();
        if result.is_ok() {
            self.calls
                .lock()
                .unwrap()
                .push((tokio::time::Instant::now(), call));
            self.answered.fetch_add(1, Ordering::SeqCst);
        }
        result
    }
}

fn not_found(object: ObjectKind, key: &str) -> ClusterError {
    let (namespace, name) = key.split_once('/').unwrap_or(("", key));
    ClusterError::NotFound {
        object,
        namespace: namespace.into(),
        name: name.into(),
    }
}

#[async_trait::async_trait]
impl NodeApi for FakeApi {
    async fn pod(&self, pod: &PodRef) -> Result<Pod, ClusterError> {
        let key = format!("{}/{}", pod.namespace, pod.name);
        let found = self.pods.lock().unwrap().get(&key).cloned();
        self.call(Call::Pod(key.clone()), || {
            found.ok_or_else(|| not_found(ObjectKind::Pod, &key))
        })
        .await
    }

    async fn nad(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<NetworkAttachmentDefinition, ClusterError> {
        let key = format!("{namespace}/{name}");
        let found = self.nads.lock().unwrap().get(&key).cloned();
        self.call(Call::Nad(key.clone()), || {
            found.ok_or_else(|| not_found(ObjectKind::NetworkAttachmentDefinition, &key))
        })
        .await
    }

    async fn write_status(&self, pod: &PodRef, network_status: &str) -> Result<(), ClusterError> {
        let call = Call::Write {
            pod: format!("{}/{}", pod.namespace, pod.name),
            value: network_status.into(),
        };
        self.call(call, || Ok(())).await
    }

    async fn post_event(
        &self,
        pod: &PodRef,
        (kind, reason): (&str, &str),
        _message: &str,
    ) -> Result<String, ClusterError> {
        while self.hold_events.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let call = Call::Event {
            pod: format!("{}/{}", pod.namespace, pod.name),
            kind: kind.into(),
            reason: reason.into(),
        };
        let name = format!("{}.{}", pod.name, self.answered());
        self.call(call, || Ok(name)).await
    }

    async fn count_event(
        &self,
        _namespace: &str,
        name: &str,
        count: i32,
    ) -> Result<(), ClusterError> {
        let call = Call::Count {
            event: name.into(),
            count,
        };
        self.call(call, || Ok(())).await
    }

    fn events(&self) -> bool {
        !self.no_events.load(Ordering::SeqCst)
    }

    async fn apply_claim_status(
        &self,
        claim: &plexus_core::spec::dra::ClaimName,
        devices: &[plexus_core::spec::dra::DeviceNetworkData],
    ) -> Result<(), ClusterError> {
        let call = Call::Claim {
            claim: claim.to_string(),
            interfaces: devices
                .iter()
                .filter_map(|d| d.interface_name.clone())
                .collect(),
        };
        self.call(call, || Ok(())).await
    }

    async fn claims_of(
        &self,
        pod: &Pod,
    ) -> Result<Vec<(plexus_core::spec::dra::ClaimName, plexus_cluster::ClaimRead)>, ClusterError>
    {
        let call = Call::Claims(format!("{}/{}", pod.namespace, pod.name));
        let read = pod
            .claim_names()
            .into_iter()
            .map(|name| {
                let claim = plexus_core::spec::dra::ClaimName {
                    namespace: pod.namespace.clone(),
                    name: name.into(),
                };
                (claim, plexus_cluster::ClaimRead::Unallocated)
            })
            .collect();
        self.call(call, || Ok(read)).await
    }
}

pub fn pod(namespace: &str, name: &str, uid: &str) -> Pod {
    Pod {
        namespace: namespace.into(),
        name: name.into(),
        uid: Some(uid.into()),
        labels: Default::default(),
        annotations: Default::default(),
        ..Default::default()
    }
}

pub fn pod_ref(namespace: &str, name: &str, uid: &str) -> PodRef {
    PodRef {
        namespace: namespace.into(),
        name: name.into(),
        uid: Some(uid.into()),
    }
}

/// Caches that have listed `pods` and no NAD (synced).
pub fn synced_cache(pods: &[Pod]) -> Arc<NodeCache> {
    let cache = NodeCache::new();
    cache.apply_pod(Event::Init);
    for p in pods {
        cache.apply_pod(Event::InitApply(p.clone()));
    }
    cache.apply_pod(Event::InitDone);
    cache.apply_nad(Event::Init);
    cache.apply_nad(Event::InitDone);
    cache
}

/// A daemon's state over `api` and `cache`, its status queue in `queue_dir`.
pub fn state(
    api: Arc<FakeApi>,
    cache: Arc<NodeCache>,
    queue_dir: &std::path::Path,
    max_in_flight: usize,
) -> (Arc<NodeState>, Vec<super::status_queue::Key>) {
    let (writes, kept) = StatusQueue::open(queue_dir).expect("status queue");
    let state = NodeState::new(
        cache,
        api,
        StateParts {
            node: "node1".into(),
            writes,
            metrics: Arc::new(Metrics::new()),
            hook_states: HookStates::default(),
            load: Load::new(max_in_flight, Duration::from_millis(250)),
            pod_wait: Duration::from_millis(500),
        },
    );
    (Arc::new(state), kept)
}
