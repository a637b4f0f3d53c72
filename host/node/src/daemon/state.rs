//! What the daemon's parts share: the watch caches and the one pod lookup over them, the API side behind
//! [`NodeApi`], the durable status writer, the event poster and the counters. The socket server, dynamic networks
//! and the metrics read and drive it; none of them reaches the API any other way.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use plexus_cluster::{ClaimRead, ClusterError, KubeApi, Lookup, NodeCache};
use plexus_core::spec::dra::{ClaimName, DeviceNetworkData, PodClaims};
use plexus_core::spec::{NetworkAttachmentDefinition, Pod, PodRef};

use super::metrics::{HookStates, Metrics, ResultLabel, Snapshot};
use super::status_queue::{ClaimWrite, Kept, Key, StatusQueue, Write};
use plexus_cluster::backoff::Backoff;

/// What the daemon asks of the API server: [`DaemonApi`] in the process, an in-memory fake in tests.
///
/// Reads are retried below (an ADD waits for them); writes are one attempt each, retried by the durable writer
/// that keeps them ([`start_writer`]), and events are one attempt whatever happens (best effort).
#[async_trait::async_trait]
pub trait NodeApi: Send + Sync + 'static {
    async fn pod(&self, pod: &PodRef) -> Result<Pod, ClusterError>;
    async fn nad(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<NetworkAttachmentDefinition, ClusterError>;
    /// One attempt; a transient failure is [`ClusterError::Unavailable`].
    async fn write_status(&self, pod: &PodRef, network_status: &str) -> Result<(), ClusterError>;
    /// One attempt; `kind` is (type, reason); the new event's name.
    async fn post_event(
        &self,
        pod: &PodRef,
        kind: (&str, &str),
        message: &str,
    ) -> Result<String, ClusterError>;
    /// An event seen again: its count set to `count` (one attempt).
    async fn count_event(
        &self,
        namespace: &str,
        name: &str,
        count: i32,
    ) -> Result<(), ClusterError>;
    /// Whether events are posted at all (the `events` setting of the API source).
    fn events(&self) -> bool;
    /// Writes Plexus's entries of a claim's `status.devices[]`: one read and one write (again when the claim changed
    /// in between), each one attempt.
    async fn apply_claim_status(
        &self,
        _claim: &ClaimName,
        _devices: &[DeviceNetworkData],
    ) -> Result<(), ClusterError> {
        Err(ClusterError::unavailable(
            "this API side writes no claim status",
        ))
    }
    /// Each of the pod's claims read by name.
    async fn claims_of(&self, _pod: &Pod) -> Result<Vec<(ClaimName, ClaimRead)>, ClusterError> {
        Err(ClusterError::unavailable("this API side reads no claims"))
    }
}

/// The daemon's API side: the daemon's client for reads, and the same client without retries for the writes the
/// daemon retries itself: status and claim writes (the durable writer) and events ([`send_event`]); one loop of
/// retries, not one inside another. Its events are reported as from its node.
pub struct DaemonApi {
    api: KubeApi,
    writes: KubeApi,
    node: String,
}

impl DaemonApi {
    pub fn new(api: KubeApi, node: String) -> DaemonApi {
        DaemonApi {
            writes: api.without_retries(),
            api,
            node,
        }
    }
}

#[async_trait::async_trait]
impl NodeApi for DaemonApi {
    async fn pod(&self, pod: &PodRef) -> Result<Pod, ClusterError> {
        self.api.pod(pod).await
    }
    async fn nad(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<NetworkAttachmentDefinition, ClusterError> {
        self.api.nad(namespace, name).await
    }
    async fn write_status(&self, pod: &PodRef, network_status: &str) -> Result<(), ClusterError> {
        self.writes.write_status(pod, network_status).await
    }
    async fn post_event(
        &self,
        pod: &PodRef,
        kind: (&str, &str),
        message: &str,
    ) -> Result<String, ClusterError> {
        let node = Some(self.node.as_str());
        self.writes.post_event(pod, node, kind, message).await
    }
    async fn count_event(
        &self,
        namespace: &str,
        name: &str,
        count: i32,
    ) -> Result<(), ClusterError> {
        self.api.count_event(namespace, name, count).await
    }
    fn events(&self) -> bool {
        self.api.settings().events
    }
    async fn apply_claim_status(
        &self,
        claim: &ClaimName,
        devices: &[DeviceNetworkData],
    ) -> Result<(), ClusterError> {
        self.writes.apply_claim_status(claim, devices).await
    }
    async fn claims_of(&self, pod: &Pod) -> Result<Vec<(ClaimName, ClaimRead)>, ClusterError> {
        self.api.claims_of(pod).await
    }
}

/// Events posted at once at most, waiting for their turn included; more are dropped (they are best effort, and a
/// burst must not pile up tasks without bound). As many as client-go's event broadcaster queues (1,000): a node
/// that starts its pods' maximum (110) at once with a few networks each asks for a few hundred, which wait for
/// `--event-qps`. A waiting event holds its request's state, about 4 KiB: 4 MiB at the bound.
pub const MAX_EVENTS_IN_FLIGHT: usize = 1024;
/// How long an event is tried again while the API server cannot take it (client-go's recorder: 12 tries, 10 s apart).
pub const EVENT_RETRY_FOR: Duration = Duration::from_secs(120);
const FIRST_EVENT_RETRY: Duration = Duration::from_secs(1);
const MAX_EVENT_RETRY: Duration = Duration::from_secs(10);
/// How long an event seen again is counted on the first one instead of posted anew (kubelet's window).
pub const EVENT_WINDOW: Duration = Duration::from_secs(600);
/// Distinct events remembered for that at most (the oldest are forgotten first).
const MAX_EVENT_KEYS: usize = 4096;

/// What makes two events the same one: the pod (with its UID), the type, the reason and the message.
type EventKey = (String, String, Option<String>, bool, String, String);

/// An event posted within the window: its name once the API server gave it one, how often it was seen, and
/// whether a count is being sent (one at a time per event: a repeat meanwhile only raises the count, which the
/// sender sends again when it is done).
struct Seen {
    name: Option<String>,
    count: i32,
    first: tokio::time::Instant,
    counting: bool,
}

/// How long a claim write or an event the API server refuses as forbidden is tried again before it is dropped: a
/// server that has just started may refuse, until its authorizer's caches have synced, what it allows a moment
/// later (seen after an outage: a claim's read and an event refused in the first second after the server's
/// return). A refusal that lasts is final after it.
pub const FORBIDDEN_RETRY_FOR: Duration = Duration::from_secs(60);

/// Whether a failed write is final: neither transient nor a forbidden within [`FORBIDDEN_RETRY_FOR`] of the first
/// (`since`, set at the first).
fn refused_for_good(e: &ClusterError, since: &mut Option<tokio::time::Instant>) -> bool {
    if e.is_transient() {
        return false;
    }
    if matches!(e, ClusterError::Forbidden { .. }) {
        let first = *since.get_or_insert_with(tokio::time::Instant::now);
        return first.elapsed() >= FORBIDDEN_RETRY_FOR;
    }
    true
}

/// How long a status write that failed waits at most before it is tried again.
pub const MAX_STATUS_RETRY: Duration = Duration::from_secs(30);
/// How long a status write that failed first waits.
const FIRST_STATUS_RETRY: Duration = Duration::from_secs(1);

/// How many requests the socket serves at once, and how long one waits for a slot.
pub struct Load {
    pub permits: tokio::sync::Semaphore,
    pub max_in_flight: usize,
    pub queue_wait: Duration,
}

impl Load {
    pub fn new(max_in_flight: usize, queue_wait: Duration) -> Load {
        Load {
            permits: tokio::sync::Semaphore::new(max_in_flight),
            max_in_flight,
            queue_wait,
        }
    }

    pub fn in_flight(&self) -> usize {
        self.max_in_flight - self.permits.available_permits()
    }
}

/// The daemon's shared state.
pub struct NodeState {
    pub node: String,
    pub cache: Arc<NodeCache>,
    pub api: Arc<dyn NodeApi>,
    pub metrics: Arc<Metrics>,
    pub hook_states: HookStates,
    pub load: Load,
    /// How long a pod not yet in the cache is waited for before it is read from the API.
    pub pod_wait: Duration,
    writes: StatusQueue,
    api_reads: AtomicU64,
    events_in_flight: Arc<AtomicUsize>,
    events_seen: Arc<std::sync::Mutex<std::collections::HashMap<EventKey, Seen>>>,
}

/// What [`NodeState::new`] takes besides the caches and the API.
pub struct StateParts {
    pub node: String,
    pub writes: StatusQueue,
    pub metrics: Arc<Metrics>,
    pub hook_states: HookStates,
    pub load: Load,
    pub pod_wait: Duration,
}

impl NodeState {
    pub fn new(cache: Arc<NodeCache>, api: Arc<dyn NodeApi>, parts: StateParts) -> NodeState {
        NodeState {
            node: parts.node,
            cache,
            api,
            metrics: parts.metrics,
            hook_states: parts.hook_states,
            load: parts.load,
            pod_wait: parts.pod_wait,
            writes: parts.writes,
            api_reads: AtomicU64::new(0),
            events_in_flight: Arc::new(AtomicUsize::new(0)),
            events_seen: Arc::default(),
        }
    }

    /// Reads the daemon sent to the API server because its caches could not answer.
    pub fn api_reads(&self) -> u64 {
        self.api_reads.load(Ordering::Relaxed)
    }

    /// Status writes accepted and not yet taken by the API server.
    pub fn pending_writes(&self) -> usize {
        self.writes.len()
    }

    /// Events being posted (or waiting to be tried again) in the background.
    pub fn events_in_flight(&self) -> usize {
        self.events_in_flight.load(Ordering::Relaxed)
    }

    /// What the scrape-time gauges mirror.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            in_flight: self.load.in_flight(),
            pending_writes: self.pending_writes(),
            cache: self.cache.health(),
            authority_enforced: self.hook_states.authority_enforced(),
            hooks: self.hook_states.hooks(),
        }
    }

    /// The pod as the cache has it, when it is this pod: same name and, when `pod` names one, the same UID (a pod
    /// recreated under the same name is another pod).
    pub fn cached_pod(&self, pod: &PodRef) -> Lookup<Pod> {
        match self.cache.pod(&pod.namespace, &pod.name) {
            Lookup::Found(p) if pod.uid.is_some() && p.uid != pod.uid => Lookup::Missing,
            found => found,
        }
    }

    /// The pod from the cache, else from the API (counted as an API read).
    pub async fn pod(&self, pod: &PodRef) -> Result<Pod, ClusterError> {
        match self.cached_pod(pod) {
            Lookup::Found(p) => Ok(p),
            _ => self.read_pod(pod).await,
        }
    }

    /// The pod from the cache, waiting up to `pod_wait` for one the watch has not delivered yet (or delivered
    /// with another UID: a pod recreated under the same name), then from the API. `None`: the cache is unsynced.
    pub async fn pod_for_add(&self, pod: &PodRef) -> Option<Result<Pod, ClusterError>> {
        let mut changes = self.cache.subscribe();
        let deadline = tokio::time::Instant::now() + self.pod_wait;
        loop {
            match self.cached_pod(pod) {
                Lookup::Unsynced => return None,
                Lookup::Found(p) => return Some(Ok(p)),
                Lookup::Missing => {}
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => continue,
                _ => break,
            }
        }
        tracing::debug!(pod = %pod, "pod not in the cache in time; reading it from the API");
        Some(self.read_pod(pod).await)
    }

    /// What `pod`'s claims give its networks: from the cache, else each of its claims read by name (counted as
    /// API reads, and kept for the next time). `None`: the cache cannot tell yet (DRA's state unknown, the node's
    /// slices not listed).
    pub async fn pod_claims(&self, pod: &Pod) -> Option<Result<PodClaims, ClusterError>> {
        match self.cache.pod_claims(pod) {
            Lookup::Found(claims) => Some(Ok(claims)),
            Lookup::Unsynced => None,
            Lookup::Missing => {
                let names = pod.claim_names().len() as u64;
                self.api_reads.fetch_add(names, Ordering::Relaxed);
                tracing::debug!(pod = %pod.namespace, name = %pod.name, "the pod's claims are not cached yet; reading them");
                Some(
                    self.api
                        .claims_of(pod)
                        .await
                        .map(|read| self.cache.claims_read(pod, read)),
                )
            }
        }
    }

    async fn read_pod(&self, pod: &PodRef) -> Result<Pod, ClusterError> {
        self.api_reads.fetch_add(1, Ordering::Relaxed);
        self.api.pod(pod).await
    }

    /// The NAD from the cache, else from the API (perhaps created a moment ago: the API has the last word).
    /// `None`: the cache is unsynced.
    pub async fn nad(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Result<NetworkAttachmentDefinition, ClusterError>> {
        match self.cache.nad(namespace, name) {
            Lookup::Found(nad) => Some(Ok(nad)),
            Lookup::Unsynced => None,
            Lookup::Missing => {
                self.api_reads.fetch_add(1, Ordering::Relaxed);
                Some(self.api.nad(namespace, name).await)
            }
        }
    }
}

/// Accepts a status write: kept on disk (see [`StatusQueue`]), answered at once, and sent by the pod's writer
/// task. The annotation is informative (spec 5) and a failed write never failed an ADD, so the ADD need not
/// wait for the API server's commit. `false` when the queue is full or cannot be written (the CNI process then
/// writes it itself). Needs the daemon's runtime.
pub fn enqueue_status(state: &Arc<NodeState>, pod: PodRef, value: String) -> bool {
    let key = Key::pod(&pod.namespace, &pod.name);
    match state.writes.accept(pod, value) {
        Ok(true) => {
            start_writer(state, key);
            true
        }
        Ok(false) => true,
        Err(e) => {
            tracing::warn!(error = %e, "status write not kept; the CNI process writes it");
            false
        }
    }
}

/// Accepts a claim status write for `pod`: kept on disk beside the status writes (see [`StatusQueue`]),
/// answered at once, and sent by the claim's writer task (the newest write of a claim replaces one not sent
/// yet). `false` when the queue is full or cannot be written (the CNI process then writes it itself).
pub fn enqueue_claim_status(
    state: &Arc<NodeState>,
    pod: PodRef,
    claim: ClaimName,
    devices: Vec<DeviceNetworkData>,
) -> bool {
    let key = Key::Claim(claim.clone());
    match state.writes.accept_claim(pod, claim, devices) {
        Ok(true) => {
            start_writer(state, key);
            true
        }
        Ok(false) => true,
        Err(e) => {
            tracing::warn!(error = %e, "claim status write not kept; the CNI process writes it");
            false
        }
    }
}

/// One kept claim write, until the API server takes it (a newer write of the claim replaces it meanwhile) or
/// refuses it for good (invalid, or forbidden for [`FORBIDDEN_RETRY_FOR`]: dropped with a warning; a claim that
/// is gone is taken as written).
async fn send_claim(state: &NodeState, key: &Key, mut write: ClaimWrite) {
    let mut backoff = Backoff::jittered(FIRST_STATUS_RETRY, MAX_STATUS_RETRY);
    let mut forbidden_since = None;
    loop {
        match state
            .api
            .apply_claim_status(&write.claim, &write.devices)
            .await
        {
            Ok(()) => return,
            Err(e) if refused_for_good(&e, &mut forbidden_since) => {
                tracing::warn!(claim = %write.claim, error = %e, "the claim's device status is refused: dropped");
                return;
            }
            Err(e) => {
                let wait = backoff.next_delay();
                tracing::warn!(claim = %write.claim, error = %e, retry_in = ?wait, "cannot write the claim's device status yet; kept and retried");
                tokio::time::sleep(wait).await;
            }
        }
        if let Some(Write::Claim(newer)) = state.writes.newer(key).map(|k| k.write) {
            write = newer;
        }
    }
}

/// Sends a pod's kept writes, newest first taken, until none is left: each is retried with backoff for as long
/// as the API server does not take it, and dropped when the pod is gone (the cache holding the pod under another
/// UID). Needs the daemon's runtime.
pub fn start_writer(state: &Arc<NodeState>, key: Key) {
    let state = state.clone();
    tokio::spawn(async move {
        while let Some(kept) = state.writes.take(&key) {
            send_kept(&state, &key, kept).await;
            state.writes.finished(&key);
        }
    });
}

/// One kept write, until the API server takes it (a newer write of the same pod or claim replaces it meanwhile).
async fn send_kept(state: &NodeState, key: &Key, kept: Kept) {
    match kept.write {
        Write::Claim(write) => send_claim(state, key, write).await,
        Write::Status(value) => send_status(state, key, kept.pod, value).await,
    }
}

/// One kept network-status write, until the API server takes it, or dropped when the pod is gone (the cache
/// holds the pod under another UID).
async fn send_status(state: &NodeState, key: &Key, mut pod: PodRef, mut value: String) {
    let mut backoff = Backoff::jittered(FIRST_STATUS_RETRY, MAX_STATUS_RETRY);
    loop {
        if let Lookup::Found(p) = state.cache.pod(&pod.namespace, &pod.name) {
            if p.uid.is_some() && pod.uid.is_some() && p.uid != pod.uid {
                tracing::info!(pod = %pod, "pod replaced by one with another UID: its status write is dropped");
                return;
            }
        }
        let result = state.api.write_status(&pod, &value).await;
        let label = ResultLabel {
            result: if result.is_ok() { "success" } else { "error" }.into(),
        };
        state.metrics.status_writes.get_or_create(&label).inc();
        let Err(e) = result else {
            return;
        };
        let wait = backoff.next_delay();
        tracing::warn!(pod = %pod, error = %e, retry_in = ?wait, "cannot publish network-status yet; kept and retried");
        tokio::time::sleep(wait).await;
        if let Some(Kept {
            pod: newer_pod,
            write: Write::Status(newer),
        }) = state.writes.newer(key)
        {
            (pod, value) = (newer_pod, newer);
        }
    }
}

/// What to do with an event: post it, or count it on the one posted before.
enum EventAction {
    Post,
    Count(String, i32),
    /// Counted on one whose post is still in flight (its answer sends the count).
    Wait,
}

/// Whether `key` was seen within [`EVENT_WINDOW`]; remembers it.
fn event_action(
    seen: &mut std::collections::HashMap<EventKey, Seen>,
    key: EventKey,
) -> EventAction {
    let now = tokio::time::Instant::now();
    if seen.len() >= MAX_EVENT_KEYS {
        seen.retain(|_, s| now.duration_since(s.first) < EVENT_WINDOW);
        if seen.len() >= MAX_EVENT_KEYS {
            if let Some(oldest) = seen
                .iter()
                .min_by_key(|(_, s)| s.first)
                .map(|(k, _)| k.clone())
            {
                seen.remove(&oldest);
            }
        }
    }
    match seen.get_mut(&key) {
        Some(s) if now.duration_since(s.first) < EVENT_WINDOW => {
            s.count += 1;
            match &s.name {
                Some(name) if !s.counting => {
                    s.counting = true;
                    EventAction::Count(name.clone(), s.count)
                }
                _ => EventAction::Wait,
            }
        }
        _ => {
            seen.insert(
                key,
                Seen {
                    name: None,
                    count: 1,
                    first: now,
                    counting: false,
                },
            );
            EventAction::Post
        }
    }
}

fn forget_event(state: &NodeState, key: &EventKey) {
    state
        .events_seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(key);
}

/// Posts an event, trying again while the API server is unreachable or overloaded ([`ClusterError::is_transient`]),
/// or refuses it as forbidden for less than [`FORBIDDEN_RETRY_FOR`], for [`EVENT_RETRY_FOR`] at most: an outage
/// delays the event, it does not lose it. Any other refusal is final.
async fn post_until_delivered(
    api: &dyn NodeApi,
    pod: &PodRef,
    kind: (&str, &str),
    message: &str,
) -> Result<String, ClusterError> {
    let until = tokio::time::Instant::now() + EVENT_RETRY_FOR;
    let mut backoff = Backoff::jittered(FIRST_EVENT_RETRY, MAX_EVENT_RETRY);
    let mut forbidden_since = None;
    loop {
        match api.post_event(pod, kind, message).await {
            Err(e) if !refused_for_good(&e, &mut forbidden_since) => {
                let delay = backoff.next_delay();
                if tokio::time::Instant::now() + delay > until {
                    return Err(e);
                }
                tokio::time::sleep(delay).await;
            }
            done => return done,
        }
    }
}

/// Sets event `name`'s count to `count`, then again while repeats raised it meanwhile (one count in flight per event,
/// however often it repeats); the event's `counting` is cleared at the end, whatever the answer.
async fn send_counts(
    api: &dyn NodeApi,
    seen: &std::sync::Mutex<std::collections::HashMap<EventKey, Seen>>,
    key: &EventKey,
    namespace: &str,
    name: &str,
    mut count: i32,
) -> Result<(), ClusterError> {
    loop {
        let sent = api.count_event(namespace, name, count).await;
        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = seen.get_mut(key) else {
            return sent;
        };
        if sent.is_ok() && s.count > count {
            count = s.count;
            continue;
        }
        s.counting = false;
        return sent;
    }
}

/// Posts an event on `pod` in the background, unless events are off or [`MAX_EVENTS_IN_FLIGHT`] are in flight
/// already (events are best effort, and a burst must not pile up tasks). The same event again within
/// [`EVENT_WINDOW`] (same pod, type, reason and message) increments the first one's count instead of creating
/// another object, as kubelet's events do. Needs the daemon's runtime.
pub fn send_event(state: &NodeState, pod: PodRef, warning: bool, reason: String, message: String) {
    if !state.api.events() {
        return;
    }
    let key: EventKey = (
        pod.namespace.clone(),
        pod.name.clone(),
        pod.uid.clone(),
        warning,
        reason.clone(),
        message.clone(),
    );
    let action = event_action(
        &mut state.events_seen.lock().unwrap_or_else(|e| e.into_inner()),
        key.clone(),
    );
    if matches!(action, EventAction::Wait) {
        return;
    }
    if state.events_in_flight.fetch_add(1, Ordering::Relaxed) >= MAX_EVENTS_IN_FLIGHT {
        state.events_in_flight.fetch_sub(1, Ordering::Relaxed);
        tracing::warn!(pod = %pod, "too many events in flight; dropped one");
        if matches!(action, EventAction::Post) {
            // Never posted: the same event later is posted anew, not counted on one that does not exist.
            forget_event(state, &key);
        }
        return;
    }
    // The task outlives the request; it takes its own handles.
    let api = state.api.clone();
    let in_flight = state.events_in_flight.clone();
    let seen = state.events_seen.clone();
    tokio::spawn(async move {
        let kind = if warning { "Warning" } else { "Normal" };
        let result = match action {
            EventAction::Count(name, count) => {
                send_counts(api.as_ref(), &seen, &key, &pod.namespace, &name, count).await
            }
            _ => match post_until_delivered(api.as_ref(), &pod, (kind, &reason), &message).await {
                Ok(name) => {
                    // Seen again while it was being posted: the count goes on the new event.
                    let again = {
                        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                        seen.get_mut(&key).and_then(|s| {
                            s.name = Some(name.clone());
                            s.counting = s.count > 1;
                            s.counting.then_some(s.count)
                        })
                    };
                    match again {
                        Some(count) => {
                            send_counts(api.as_ref(), &seen, &key, &pod.namespace, &name, count)
                                .await
                        }
                        None => Ok(()),
                    }
                }
                Err(e) => {
                    // Not posted: the next one is posted anew.
                    seen.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                    Err(e)
                }
            },
        };
        if let Err(e) = result {
            tracing::warn!(pod = %pod, error = %e, "could not post the {reason} event");
        }
        in_flight.fetch_sub(1, Ordering::Relaxed);
    });
}
