//! Watch caches for the node daemon: the node's pods and the cluster's NADs, trimmed to what planning reads, and
//! the ResourceClaims the node's pods use, each read by name.
//!
//! Pods are watched with the field selector `spec.nodeName=<node>`, so the cache grows with what the node runs,
//! not with the cluster; each is trimmed on arrival to its metadata, node and claims (its
//! `spec.resourceClaims[]` and the claims `status.resourceClaimStatuses[]` names). A NAD keeps its namespace,
//! name, config and annotations. Claims are not watched: a claim a pod of the node uses is read by name when the
//! pod appears (or names it later), kept while a pod of the node uses it, and dropped after; an allocated claim
//! does not change while a pod is reserved for it. A claim not there or not allocated when read is read again
//! with backoff, and when its pod changes. So a node holds and receives its own pods' claims only, as the
//! kubelet does. Each list (the first one and every relist after a 410 Gone) fills a
//! fresh table that replaces the old one whole when the list is complete, so a lookup never sees half a list.
//!
//! The streams are kube-runtime's watchers; the tables are not its reflector store, for what an ADD needs of
//! them: the store keeps the kube object (`Arc<K>`, K a `kube::Resource`), so each lookup on the ADD path
//! would convert a `PartialObjectMeta<Pod>` or a NAD object into planning's types, where these tables convert
//! once per watch event; a lookup here answers synchronously whether the cache has listed yet
//! ([`Lookup::Unsynced`], the store only offers an async wait), and every change bumps a signal a lookup
//! that missed waits on. The list semantics are the store's (buffer until `InitDone`, then swap). The node
//! agent, which reads its few NetworkHooks only when reconciling, uses the store itself.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod as KubePod;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use plexus_core::spec::dra::{join_pod_claims, Claim, ClaimName, PodClaims, SliceDevice};
use plexus_core::spec::{NetworkAttachmentDefinition, Pod};
use tokio::time::Instant;

use crate::kube::{nad_from_kube, pod_from_kube, slice_devices, ClaimRead, NadObject};
use crate::{CacheHealth, KubeApi, Lookup};

type Key = (String, String);

/// Objects by key, with what they weigh when the table has a budget.
struct Held<T> {
    map: HashMap<Key, (T, usize)>,
    /// The weights added up (zero without a budget).
    used: usize,
    /// Weight and key of each object, heaviest last (kept only with a budget).
    by_weight: BTreeSet<(usize, Key)>,
}

impl<T> Default for Held<T> {
    fn default() -> Self {
        Held {
            map: HashMap::new(),
            used: 0,
            by_weight: BTreeSet::new(),
        }
    }
}

impl<T> Held<T> {
    fn values(&self) -> impl Iterator<Item = &T> + Clone {
        self.map.values().map(|(v, _)| v)
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    fn remove(&mut self, k: &Key) {
        if let Some((_, w)) = self.map.remove(k) {
            self.used -= w;
            self.by_weight.remove(&(w, k.clone()));
        }
    }
}

/// What a table may hold in total: bytes as [`Budget::weigh`] counts them. Past it the heaviest objects are
/// dropped (the lookups of an object not held read it by name), so that no one namespace's objects size the node's
/// memory.
pub(crate) struct Budget<T> {
    pub(crate) bytes: usize,
    pub(crate) weigh: fn(&T) -> usize,
}

impl<T> Clone for Budget<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Budget<T> {}

struct Table<T> {
    items: Held<T>,
    /// Filled while a list is in progress; replaces `items` when it completes.
    listing: Option<Held<T>>,
    synced: bool,
    lists: u64,
    budget: Option<Budget<T>>,
    /// Objects dropped for the budget.
    evicted: u64,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table {
            items: Held::default(),
            listing: None,
            synced: false,
            lists: 0,
            budget: None,
            evicted: 0,
        }
    }
}

impl<T> Table<T> {
    fn with_budget(budget: Budget<T>) -> Self {
        Table {
            budget: Some(budget),
            ..Table::default()
        }
    }

    /// Puts `obj` under `k` into `held`, then drops the heaviest objects until `held` is within the budget.
    fn hold(budget: Option<Budget<T>>, evicted: &mut u64, held: &mut Held<T>, k: Key, obj: T) {
        let Some(budget) = budget else {
            held.map.insert(k, (obj, 0));
            return;
        };
        held.remove(&k);
        let w = (budget.weigh)(&obj) + k.0.len() + k.1.len();
        held.map.insert(k.clone(), (obj, w));
        held.used += w;
        held.by_weight.insert((w, k));
        while held.used > budget.bytes {
            let Some((w, k)) = held.by_weight.pop_last() else {
                break;
            };
            held.map.remove(&k);
            held.used -= w;
            *evicted += 1;
            tracing::warn!(
                namespace = %k.0, name = %k.1, bytes = w, budget = budget.bytes,
                "the cache is over its budget: dropped its largest object (an ADD that needs it reads it by name)"
            );
        }
    }

    /// Applies one watch event; `key` names an object, `None` for one without a name (never stored).
    fn apply(&mut self, event: Event<T>, key: impl Fn(&T) -> Option<Key>) {
        match event {
            Event::Init => self.listing = Some(Held::default()),
            Event::InitApply(obj) => {
                if let Some(k) = key(&obj) {
                    let listing = self.listing.get_or_insert_with(Held::default);
                    Self::hold(self.budget, &mut self.evicted, listing, k, obj);
                }
            }
            Event::InitDone => {
                let mut listed = self.listing.take().unwrap_or_default();
                listed.map.shrink_to_fit();
                self.items = listed;
                self.synced = true;
                self.lists += 1;
            }
            Event::Apply(obj) => {
                if let Some(k) = key(&obj) {
                    Self::hold(self.budget, &mut self.evicted, &mut self.items, k, obj);
                }
            }
            Event::Delete(obj) => {
                if let Some(k) = key(&obj) {
                    self.items.remove(&k);
                }
            }
        }
    }

    fn get(&self, namespace: &str, name: &str) -> Lookup<T>
    where
        T: Clone,
    {
        if !self.synced {
            return Lookup::Unsynced;
        }
        match self
            .items
            .map
            .get(&(namespace.to_string(), name.to_string()))
        {
            Some((v, _)) => Lookup::Found(v.clone()),
            None => Lookup::Missing,
        }
    }
}

/// What a NAD weighs in the cache: its strings, and a little for the structures around them.
fn nad_weight(n: &NetworkAttachmentDefinition) -> usize {
    const OVERHEAD: usize = 256;
    OVERHEAD
        + n.config.as_ref().map_or(0, String::len)
        + n.annotations
            .iter()
            .map(|(k, v)| k.len() + v.len() + 64)
            .sum::<usize>()
        + n.namespace.len()
        + n.name.len()
}

/// The NAD cache's budget when the daemon is given none: room for tens of thousands of ordinary NADs (a few KiB
/// each), and well inside the DaemonSet's memory limit even while a relist holds a second table.
pub const DEFAULT_NAD_BUDGET_BYTES: usize = 24 << 20;

/// Whether the cluster serves DRA's `resource.k8s.io/v1`, as the daemon last found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DraServed {
    /// Not asked yet: a pod's claims cannot be told.
    #[default]
    Unknown,
    /// The API server answers 404: no pod has claims.
    No,
    /// Served: the claims and the node's slices are watched.
    Yes,
}

/// A claim a pod of the node uses, as the cache holds it.
#[derive(Debug, Clone, PartialEq)]
enum ClaimSlot {
    /// To be read: new, or its pod changed while it could not be used.
    Unread,
    /// Being read now (after `attempts` unusable reads).
    Reading {
        attempts: u32,
    },
    Allocated(Claim),
    /// Read and not there or not allocated, or not read (the API failed): read again at `at`, or when a pod that
    /// uses it changes.
    Retry {
        at: Instant,
        attempts: u32,
    },
}

/// How long after its `attempts`th unusable read a claim is read again (1 s doubling, at most 30 s).
fn claim_retry_delay(attempts: u32) -> std::time::Duration {
    std::time::Duration::from_secs(1u64 << attempts.min(5)).min(std::time::Duration::from_secs(30))
}

/// A slice as the cache keeps it: its devices on this node.
#[derive(Clone)]
struct SliceEntry {
    name: String,
    devices: Vec<SliceDevice>,
}

struct State {
    pods: Table<Pod>,
    nads: Table<NetworkAttachmentDefinition>,
    claims: HashMap<Key, ClaimSlot>,
    /// Reads of claims made, and claims read that could not be used yet.
    claim_reads: u64,
    slices: Table<SliceEntry>,
    dra: DraServed,
    watch_errors: u64,
}

impl State {
    fn new(nad_budget: usize) -> State {
        State {
            pods: Table::default(),
            nads: Table::with_budget(Budget {
                bytes: nad_budget,
                weigh: nad_weight,
            }),
            claims: HashMap::new(),
            claim_reads: 0,
            slices: Table::default(),
            dra: DraServed::default(),
            watch_errors: 0,
        }
    }

    /// Makes the claims cache hold the claims of the node's pods: a claim newly used is to be read, a claim no
    /// pod uses any more is dropped; the claims of `changed` (a pod that changed) that could not be used are
    /// read again now.
    fn keep_pods_claims(&mut self, changed: Option<&Pod>) {
        let mut used: std::collections::HashSet<Key> = std::collections::HashSet::new();
        for pod in self.pods.items.values() {
            for name in pod.claim_names() {
                used.insert((pod.namespace.clone(), name.to_string()));
            }
        }
        self.claims.retain(|k, _| used.contains(k));
        for k in used {
            self.claims.entry(k).or_insert(ClaimSlot::Unread);
        }
        if let Some(pod) = changed {
            for name in pod.claim_names() {
                let k = (pod.namespace.clone(), name.to_string());
                if let Some(slot @ ClaimSlot::Retry { .. }) = self.claims.get_mut(&k) {
                    *slot = ClaimSlot::Unread;
                }
            }
        }
    }

    fn claim_read(&mut self, claim: &ClaimName, read: Result<ClaimRead, ()>, now: Instant) {
        self.claim_reads += 1;
        let Some(slot) = self
            .claims
            .get_mut(&(claim.namespace.clone(), claim.name.clone()))
        else {
            return; // No pod of the node uses it any more.
        };
        let attempts = match slot {
            ClaimSlot::Retry { attempts, .. } | ClaimSlot::Reading { attempts } => *attempts,
            _ => 0,
        };
        *slot = match read {
            Ok(ClaimRead::Allocated(c)) => ClaimSlot::Allocated(c),
            Ok(_) | Err(()) => ClaimSlot::Retry {
                at: now + claim_retry_delay(attempts),
                attempts: attempts + 1,
            },
        };
    }

    /// `pod_claims` of the pod's claims (those in `allocated`) with the node's slices.
    fn join_claims(&self, pod: &Pod, allocated: &[&Claim]) -> PodClaims {
        let devices = self.slices.items.values().flat_map(|e| e.devices.iter());
        join_pod_claims(pod, allocated, devices)
    }
}

/// The node daemon's view of the cluster: the node's pods and every NAD, kept current by watches.
pub struct NodeCache {
    state: Mutex<State>,
    /// Bumped on every change, so a lookup that missed can wait for the next event.
    changed: tokio::sync::watch::Sender<u64>,
}

impl Default for NodeCache {
    fn default() -> Self {
        NodeCache::with_nad_budget_bytes(DEFAULT_NAD_BUDGET_BYTES)
    }
}

impl NodeCache {
    pub fn new() -> Arc<NodeCache> {
        Arc::new(NodeCache::default())
    }

    /// A cache whose NADs take `bytes` at most (see [`Budget`]).
    pub fn with_nad_budget(bytes: usize) -> Arc<NodeCache> {
        Arc::new(NodeCache::with_nad_budget_bytes(bytes))
    }

    fn with_nad_budget_bytes(bytes: usize) -> NodeCache {
        NodeCache {
            state: Mutex::new(State::new(bytes)),
            changed: tokio::sync::watch::Sender::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Lookup<Pod> {
        self.state().pods.get(namespace, name)
    }

    pub fn nad(&self, namespace: &str, name: &str) -> Lookup<NetworkAttachmentDefinition> {
        self.state().nads.get(namespace, name)
    }

    /// What the claims of `pod` give its networks, from the claims cache and the node's slices: unsynced until
    /// the slices have listed (or DRA is known not served), missing when a claim of the pod has not been read
    /// allocated yet (the caller reads them itself: [`NodeCache::claims_read`]).
    pub fn pod_claims(&self, pod: &Pod) -> Lookup<PodClaims> {
        let s = self.state();
        match s.dra {
            DraServed::No => return Lookup::Found(PodClaims::default()),
            DraServed::Unknown => return Lookup::Unsynced,
            DraServed::Yes if !s.slices.synced => return Lookup::Unsynced,
            DraServed::Yes => {}
        }
        let mut allocated = Vec::new();
        for name in pod.claim_names() {
            match s.claims.get(&(pod.namespace.clone(), name.to_string())) {
                Some(ClaimSlot::Allocated(c)) => allocated.push(c),
                _ => return Lookup::Missing,
            }
        }
        Lookup::Found(s.join_claims(pod, &allocated))
    }

    /// Keeps claims the caller read for `pod` (the cache had not read them allocated) and answers from them.
    pub fn claims_read(&self, pod: &Pod, read: Vec<(ClaimName, ClaimRead)>) -> PodClaims {
        let mut s = self.state();
        let now = Instant::now();
        let mut allocated = Vec::new();
        for (name, r) in read {
            if let ClaimRead::Allocated(c) = &r {
                allocated.push(c.clone());
            }
            s.claim_read(&name, Ok(r), now);
        }
        let allocated: Vec<&Claim> = allocated.iter().collect();
        s.join_claims(pod, &allocated)
    }

    /// The claims due to be read now, each marked as being read, and when the next retry is due.
    pub fn claims_due(&self, now: Instant) -> (Vec<ClaimName>, Option<Instant>) {
        let mut s = self.state();
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for ((namespace, name), slot) in s.claims.iter_mut() {
            let attempts = match slot {
                ClaimSlot::Unread => 0,
                ClaimSlot::Retry { at, attempts } if *at <= now => *attempts,
                ClaimSlot::Retry { at, .. } => {
                    next = Some(next.map_or(*at, |n| n.min(*at)));
                    continue;
                }
                ClaimSlot::Reading { .. } | ClaimSlot::Allocated(_) => continue,
            };
            *slot = ClaimSlot::Reading { attempts };
            due.push(ClaimName {
                namespace: namespace.clone(),
                name: name.clone(),
            });
        }
        due.sort();
        (due, next)
    }

    /// Records the outcome of reading `claim` (an `Err` for an API failure).
    pub fn claim_read(&self, claim: &ClaimName, read: Result<ClaimRead, ()>) {
        self.state().claim_read(claim, read, Instant::now());
        self.changed.send_modify(|n| *n += 1);
    }

    /// Whether DRA is served, as last found.
    pub fn dra_served(&self) -> DraServed {
        self.state().dra
    }

    /// Records whether DRA is served.
    pub fn set_dra_served(&self, served: DraServed) {
        self.state().dra = served;
        self.changed.send_modify(|n| *n += 1);
    }

    /// Records a slice list that found none of this node's, as the watch does on one: for callers without a
    /// watch, such as the daemon's in-process tests.
    pub fn listed_no_slices(&self) {
        self.apply_slice(Event::Init);
        self.apply_slice(Event::InitDone);
    }

    /// Applies a slice watch event (the slice's devices on this node).
    fn apply_slice(&self, event: Event<SliceEntry>) {
        self.state()
            .slices
            .apply(event, |e| Some((String::new(), e.name.clone())));
        self.changed.send_modify(|n| *n += 1);
    }

    /// Every pod of the node, once the pods are listed (`None` before).
    pub fn pods(&self) -> Option<Vec<Pod>> {
        let s = self.state();
        s.pods
            .synced
            .then(|| s.pods.items.values().cloned().collect())
    }

    pub fn health(&self) -> CacheHealth {
        let s = self.state();
        CacheHealth {
            pods_synced: s.pods.synced,
            nads_synced: s.nads.synced,
            pods: s.pods.items.len(),
            nads: s.nads.items.len(),
            nad_bytes: s.nads.items.used as u64,
            nads_evicted: s.nads.evicted,
            pod_lists: s.pods.lists,
            nad_lists: s.nads.lists,
            watch_errors: s.watch_errors,
            dra: match s.dra {
                DraServed::Unknown => None,
                DraServed::No => Some(false),
                DraServed::Yes => Some(true),
            },
            dra_synced: s.dra == DraServed::Yes && s.slices.synced,
            claims: s
                .claims
                .values()
                .filter(|c| matches!(c, ClaimSlot::Allocated(_)))
                .count(),
            claim_reads: s.claim_reads,
            slice_devices: s.slices.items.values().map(|e| e.devices.len()).sum(),
        }
    }

    /// A receiver that sees every later change.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Applies a pod watch event, and keeps the claims of the node's pods (and only those) in the claims cache.
    pub fn apply_pod(&self, event: Event<Pod>) {
        let mut s = self.state();
        let changed = match &event {
            Event::Apply(p) => Some(p.clone()),
            _ => None,
        };
        s.pods
            .apply(event, |p| Some((p.namespace.clone(), p.name.clone())));
        s.keep_pods_claims(changed.as_ref());
        drop(s);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Applies a NAD watch event.
    pub fn apply_nad(&self, event: Event<NetworkAttachmentDefinition>) {
        self.state()
            .nads
            .apply(event, |n| Some((n.namespace.clone(), n.name.clone())));
        self.changed.send_modify(|n| *n += 1);
    }

    fn watch_error(&self) {
        self.state().watch_errors += 1;
    }
}

/// How the daemon watches.
#[derive(Debug, Clone)]
pub struct WatchSettings {
    /// The node whose pods are cached.
    pub node: String,
    /// How long one watch request stays open before the client renews it (from the last resourceVersion).
    pub timeout_secs: u32,
    /// The API server's `host:port`, named in the log's errors.
    pub server: String,
}

/// Runs the pod and NAD watches into `cache` until the future is dropped, and the node's DRA (its ResourceSlices
/// watched, its pods' claims read by name). Errors (connection loss, 410 Gone, forbidden) are logged and retried
/// with backoff; a 410 makes the watcher list again.
pub async fn run_watches(api: KubeApi, cache: Arc<NodeCache>, settings: WatchSettings) {
    let client = api.client().clone();
    let pod_config = watcher::Config::default()
        .fields(&format!("spec.nodeName={}", settings.node))
        .timeout(settings.timeout_secs)
        .any_semantic();
    let pods = watcher::watcher(Api::<KubePod>::all(client.clone()), pod_config).default_backoff();
    let nad_config = watcher::Config::default()
        .timeout(settings.timeout_secs)
        .any_semantic();
    let nads =
        watcher::watcher(Api::<NadObject>::all(client.clone()), nad_config).default_backoff();
    tokio::join!(
        drive(("pods", &settings.server), pods, &cache, |c, ev| c
            .apply_pod(map_event(ev, pod_from_kube))),
        drive(
            ("network-attachment-definitions", &settings.server),
            nads,
            &cache,
            |c, ev| c.apply_nad(map_event(ev, nad_from_kube))
        ),
        run_dra(&api, &cache, &settings),
    );
}

/// How often the daemon asks again whether DRA is served, while it is not.
const DRA_PROBE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether the API server serves ResourceSlices, and whether it can select them by `spec.nodeName` (CRD
/// stand-ins of older servers answer 400). `Err` when it did not answer.
async fn probe_dra(client: &Client, node: &str) -> Result<Option<bool>, kube::Error> {
    let api = Api::<ResourceSlice>::all(client.clone());
    let selected = kube::api::ListParams::default()
        .limit(1)
        .fields(&format!("spec.nodeName={node}"));
    match api.list_metadata(&selected).await {
        Ok(_) => Ok(Some(true)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(kube::Error::Api(s)) if s.code == 400 => {
            match api
                .list_metadata(&kube::api::ListParams::default().limit(1))
                .await
            {
                Ok(_) => Ok(Some(false)),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// The node's DRA: its ResourceSlices' devices, watched, and its pods' claims, read by name. Until the API
/// server says whether it serves DRA, a pod's claims are unsynced; where it does not, they are none, and it is
/// asked again every minute.
async fn run_dra(api: &KubeApi, cache: &NodeCache, settings: &WatchSettings) {
    let client = api.client().clone();
    let node = settings.node.clone();
    let by_field = loop {
        match probe_dra(&client, &node).await {
            Ok(Some(by_field)) => break by_field,
            Ok(None) => {
                if cache.dra_served() != DraServed::No {
                    tracing::info!("resource.k8s.io/v1 is not served: no pod has ResourceClaims");
                }
                cache.set_dra_served(DraServed::No);
                tokio::time::sleep(DRA_PROBE_INTERVAL).await;
            }
            Err(e) => {
                cache.watch_error();
                let error = crate::explain(&settings.server, &e);
                tracing::warn!(%error, "cannot tell whether resource.k8s.io/v1 is served; asking again");
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            }
        }
    };
    tracing::info!(
        by_field,
        "watching this node's ResourceSlices; reading its pods' ResourceClaims by name"
    );
    let mut slice_config = watcher::Config::default()
        .timeout(settings.timeout_secs)
        .any_semantic();
    if by_field {
        slice_config = slice_config.fields(&format!("spec.nodeName={node}"));
    }
    let slices =
        watcher::watcher(Api::<ResourceSlice>::all(client), slice_config).default_backoff();
    cache.set_dra_served(DraServed::Yes);
    let slice_entry = |s: ResourceSlice| SliceEntry {
        name: s.metadata.name.clone().unwrap_or_default(),
        devices: slice_devices(s, &node),
    };
    tokio::join!(
        drive(
            ("resourceslices", &settings.server),
            slices,
            cache,
            |c, ev| c.apply_slice(map_event(ev, slice_entry))
        ),
        read_claims(api, cache),
    );
}

/// Reads the claims the node's pods use as they become due ([`NodeCache::claims_due`]), one at a time, until
/// the future is dropped.
async fn read_claims(api: &KubeApi, cache: &NodeCache) {
    let mut changes = cache.subscribe();
    loop {
        changes.mark_unchanged();
        let (due, next) = cache.claims_due(Instant::now());
        for claim in &due {
            let read = api.claim(claim).await.map_err(|e| {
                tracing::warn!(claim = %claim, error = %e, "cannot read a pod's ResourceClaim; reading it again later");
            });
            if let Ok(r @ (ClaimRead::Missing | ClaimRead::Unallocated)) = &read {
                tracing::debug!(claim = %claim, read = ?r, "a pod's ResourceClaim is not allocated yet");
            }
            cache.claim_read(claim, read);
        }
        if !due.is_empty() {
            continue;
        }
        let wait = next.map_or(std::time::Duration::from_secs(3600), |at| {
            at.saturating_duration_since(Instant::now())
        });
        let _ = tokio::time::timeout(wait, changes.changed()).await;
    }
}

/// Feeds one watch stream into `cache` through `apply`, counting and logging its errors.
async fn drive<K, S>(
    (what, server): (&'static str, &str),
    stream: S,
    cache: &NodeCache,
    apply: impl Fn(&NodeCache, Event<K>),
) where
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Ok(event) => {
                if matches!(event, Event::InitDone) {
                    tracing::info!(watch = what, "list complete");
                }
                apply(cache, event);
            }
            Err(err) => {
                cache.watch_error();
                let error = crate::explain_watch(server, &err);
                tracing::warn!(watch = what, %error, "watch failed; retrying");
            }
        }
    }
}

fn map_event<A, B>(event: Event<A>, f: impl Fn(A) -> B) -> Event<B> {
    match event {
        Event::Apply(a) => Event::Apply(f(a)),
        Event::Delete(a) => Event::Delete(f(a)),
        Event::Init => Event::Init,
        Event::InitApply(a) => Event::InitApply(f(a)),
        Event::InitDone => Event::InitDone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, uid: &str) -> Pod {
        Pod {
            namespace: ns.into(),
            name: name.into(),
            uid: Some(uid.into()),
            ..Pod::default()
        }
    }

    #[test]
    fn a_list_replaces_the_table_only_when_complete() {
        let cache = NodeCache::default();
        assert_eq!(cache.pod("ns", "a"), Lookup::Unsynced);
        cache.apply_pod(Event::Init);
        cache.apply_pod(Event::InitApply(pod("ns", "a", "1")));
        assert_eq!(
            cache.pod("ns", "a"),
            Lookup::Unsynced,
            "half a list is not served"
        );
        cache.apply_pod(Event::InitDone);
        assert_eq!(cache.pod("ns", "a"), Lookup::Found(pod("ns", "a", "1")));
        assert_eq!(cache.pod("ns", "b"), Lookup::Missing);

        // A relist (after 410 Gone): the old table serves until the new one is complete, then objects that
        // were not listed again are gone.
        cache.apply_pod(Event::Apply(pod("ns", "b", "2")));
        cache.apply_pod(Event::Init);
        cache.apply_pod(Event::InitApply(pod("ns", "c", "3")));
        assert_eq!(cache.pod("ns", "b"), Lookup::Found(pod("ns", "b", "2")));
        cache.apply_pod(Event::InitDone);
        assert_eq!(cache.pod("ns", "b"), Lookup::Missing);
        assert_eq!(cache.pod("ns", "a"), Lookup::Missing);
        assert_eq!(cache.pod("ns", "c"), Lookup::Found(pod("ns", "c", "3")));
        let h = cache.health();
        assert_eq!((h.pods_synced, h.pods, h.pod_lists), (true, 1, 2));
        assert!(!h.nads_synced);
    }

    #[test]
    fn updates_and_deletes_apply_and_wake_waiters() {
        let cache = NodeCache::default();
        let mut rx = cache.subscribe();
        cache.apply_pod(Event::Init);
        cache.apply_pod(Event::InitDone);
        cache.apply_pod(Event::Apply(pod("ns", "a", "1")));
        cache.apply_pod(Event::Apply(pod("ns", "a", "2")));
        assert_eq!(cache.pod("ns", "a"), Lookup::Found(pod("ns", "a", "2")));
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        cache.apply_pod(Event::Delete(pod("ns", "a", "2")));
        assert_eq!(cache.pod("ns", "a"), Lookup::Missing);
        assert!(rx.has_changed().unwrap());
    }

    fn nad(ns: &str, name: &str, config_len: usize) -> NetworkAttachmentDefinition {
        NetworkAttachmentDefinition {
            namespace: ns.into(),
            name: name.into(),
            config: Some("x".repeat(config_len)),
            annotations: Default::default(),
        }
    }

    #[test]
    fn the_nad_cache_keeps_within_its_budget_by_dropping_its_largest_nads() {
        let cache = NodeCache::with_nad_budget_bytes(64 << 10);
        cache.apply_nad(Event::Init);
        // One namespace's large NADs come first in the list, the others' small ones after.
        for i in 0..20 {
            cache.apply_nad(Event::InitApply(nad("big", &format!("b{i}"), 16 << 10)));
        }
        for i in 0..20 {
            cache.apply_nad(Event::InitApply(nad("small", &format!("s{i}"), 100)));
        }
        cache.apply_nad(Event::InitDone);
        let h = cache.health();
        assert!(h.nad_bytes <= 64 << 10, "{h:?}");
        assert!(h.nads_evicted >= 17, "{h:?}");
        for i in 0..20 {
            assert!(
                matches!(cache.nad("small", &format!("s{i}")), Lookup::Found(_)),
                "small NADs stay"
            );
        }
        // A dropped one is missing from the cache: the daemon reads it by name.
        let held = (0..20)
            .filter(|i| matches!(cache.nad("big", &format!("b{i}")), Lookup::Found(_)))
            .count();
        assert!(held <= 3, "{held}");
        // A watch update over the budget drops the largest again; a delete frees its bytes.
        cache.apply_nad(Event::Apply(nad("small", "s0", 40 << 10)));
        assert!(cache.health().nad_bytes <= 64 << 10);
        assert_eq!(
            cache.nad("small", "s1"),
            Lookup::Found(nad("small", "s1", 100))
        );
        let before = cache.health().nad_bytes;
        cache.apply_nad(Event::Delete(nad("small", "s1", 100)));
        assert!(cache.health().nad_bytes < before);
        assert_eq!(cache.nad("small", "s1"), Lookup::Missing);
    }

    fn claim_name(name: &str) -> ClaimName {
        ClaimName {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn allocated(name: &str) -> ClaimRead {
        ClaimRead::Allocated(Claim {
            name: claim_name(name),
            results: Vec::new(),
            attachments: Vec::new(),
        })
    }

    fn with_claims(name: &str, claims: &[(&str, Option<&str>)]) -> Pod {
        Pod {
            resource_claims: claims
                .iter()
                .map(|(n, c)| plexus_core::spec::PodClaimRef {
                    name: n.to_string(),
                    claim: c.map(Into::into),
                })
                .collect(),
            ..pod("ns", name, name)
        }
    }

    fn synced_dra() -> NodeCache {
        let cache = NodeCache::default();
        cache.set_dra_served(DraServed::Yes);
        cache.apply_slice(Event::Init);
        cache.apply_slice(Event::InitDone);
        cache.apply_pod(Event::Init);
        cache.apply_pod(Event::InitDone);
        cache
    }

    #[tokio::test(start_paused = true)]
    async fn the_cache_holds_the_claims_of_its_pods_and_reads_each_when_due() {
        let cache = synced_dra();
        let web = with_claims("web", &[("nics", Some("a")), ("extra", None)]);
        cache.apply_pod(Event::Apply(web.clone()));
        assert_eq!(cache.pod_claims(&web), Lookup::Missing, "not read yet");
        let (due, _) = cache.claims_due(Instant::now());
        assert_eq!(due, [claim_name("a")]);
        assert!(
            cache.claims_due(Instant::now()).0.is_empty(),
            "a claim being read is not due again"
        );
        cache.claim_read(&claim_name("a"), Ok(allocated("a")));
        assert!(matches!(cache.pod_claims(&web), Lookup::Found(_)));

        // The template's claim is named later; pod changes read nothing more once it is read.
        let web = with_claims("web", &[("nics", Some("a")), ("extra", Some("b"))]);
        cache.apply_pod(Event::Apply(web.clone()));
        assert_eq!(cache.claims_due(Instant::now()).0, [claim_name("b")]);
        cache.claim_read(&claim_name("b"), Ok(allocated("b")));
        cache.apply_pod(Event::Apply(web.clone()));
        assert!(cache.claims_due(Instant::now()).0.is_empty());
        assert_eq!((cache.health().claims, cache.health().claim_reads), (2, 2));

        // Another pod shares `a`; `a` stays until neither uses it.
        let db = with_claims("db", &[("nics", Some("a"))]);
        cache.apply_pod(Event::Apply(db.clone()));
        cache.apply_pod(Event::Delete(web));
        assert_eq!(cache.health().claims, 1);
        assert!(matches!(cache.pod_claims(&db), Lookup::Found(_)));
        cache.apply_pod(Event::Delete(db));
        assert_eq!(cache.health().claims, 0);
        // A read that comes back for a claim no pod uses any more keeps nothing.
        cache.claim_read(&claim_name("a"), Ok(allocated("a")));
        assert_eq!(cache.health().claims, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_not_allocated_is_read_again_with_backoff_or_when_its_pod_changes() {
        let cache = synced_dra();
        let web = with_claims("web", &[("nics", Some("a"))]);
        cache.apply_pod(Event::Apply(web.clone()));
        let t0 = Instant::now();
        assert_eq!(cache.claims_due(t0).0.len(), 1);
        cache.claim_read(&claim_name("a"), Ok(ClaimRead::Unallocated));
        assert_eq!(cache.pod_claims(&web), Lookup::Missing);
        let (due, next) = cache.claims_due(t0);
        assert!(due.is_empty());
        assert_eq!(next, Some(t0 + std::time::Duration::from_secs(1)));
        // Failed reads back off: 1 s, 2 s, 4 s ...
        assert_eq!(
            cache
                .claims_due(t0 + std::time::Duration::from_secs(1))
                .0
                .len(),
            1
        );
        cache.claim_read(&claim_name("a"), Err(()));
        let (_, next) = cache.claims_due(t0);
        assert_eq!(next, Some(t0 + std::time::Duration::from_secs(2)));
        // ...and a change of the pod makes it due at once.
        cache.apply_pod(Event::Apply(web.clone()));
        assert_eq!(cache.claims_due(t0).0, [claim_name("a")]);
        cache.claim_read(&claim_name("a"), Ok(allocated("a")));
        assert!(matches!(cache.pod_claims(&web), Lookup::Found(_)));
    }

    #[test]
    fn claims_cannot_be_told_before_dra_and_the_slices_are_known() {
        let cache = NodeCache::default();
        let web = with_claims("web", &[("nics", Some("a"))]);
        assert_eq!(cache.pod_claims(&web), Lookup::Unsynced);
        cache.set_dra_served(DraServed::Yes);
        assert_eq!(
            cache.pod_claims(&web),
            Lookup::Unsynced,
            "slices not listed"
        );
        cache.set_dra_served(DraServed::No);
        assert_eq!(cache.pod_claims(&web), Lookup::Found(PodClaims::default()));
    }
}
