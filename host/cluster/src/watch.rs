//! Watch caches for the node daemon: the node's pods and the cluster's NADs, trimmed to what planning reads.
//!
//! Pods are watched by metadata only (the API server sends no spec or status) with the field selector
//! `spec.nodeName=<node>`, so the cache grows with what the node runs, not with the cluster. A NAD keeps its
//! namespace, name, config and annotations. Each list (the first one and every relist after a 410 Gone) fills a
//! fresh table that replaces the old one whole when the list is complete, so a lookup never sees half a list.
//!
//! The streams are kube-runtime's watchers; the tables are not its reflector store, for what an ADD needs of
//! them: the store keeps the kube object (`Arc<K>`, K a `kube::Resource`), so each lookup on the ADD path
//! would convert a `PartialObjectMeta<Pod>` or a NAD object into planning's types, where these tables convert
//! once per watch event; a lookup here answers synchronously whether the cache has listed yet
//! ([`Lookup::Unsynced`], the store only offers an async wait), and every change bumps a signal a lookup
//! that missed waits on. The list semantics are the store's (buffer until `InitDone`, then swap). The node
//! agent, which reads its few NetworkHooks only when reconciling, uses the store itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod as KubePod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use plexus_core::spec::dra::{claims_of_pod, pod_claims, Claim, PodClaims, SliceDevice};
use plexus_core::spec::{NetworkAttachmentDefinition, Pod};

use crate::kube::{claim_from_kube, nad_from_kube, pod_from_meta, slice_devices, NadObject};
use crate::{CacheHealth, Lookup};

type Key = (String, String);

struct Table<T> {
    items: HashMap<Key, T>,
    /// Filled while a list is in progress; replaces `items` when it completes.
    listing: Option<HashMap<Key, T>>,
    synced: bool,
    lists: u64,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table {
            items: HashMap::new(),
            listing: None,
            synced: false,
            lists: 0,
        }
    }
}

impl<T> Table<T> {
    /// Applies one watch event; `key` names an object, `None` for one without a name (never stored).
    fn apply(&mut self, event: Event<T>, key: impl Fn(&T) -> Option<Key>) {
        match event {
            Event::Init => self.listing = Some(HashMap::new()),
            Event::InitApply(obj) => {
                if let Some(k) = key(&obj) {
                    self.listing.get_or_insert_with(HashMap::new).insert(k, obj);
                }
            }
            Event::InitDone => {
                let mut listed = self.listing.take().unwrap_or_default();
                listed.shrink_to_fit();
                self.items = listed;
                self.synced = true;
                self.lists += 1;
            }
            Event::Apply(obj) => {
                if let Some(k) = key(&obj) {
                    self.items.insert(k, obj);
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
        match self.items.get(&(namespace.to_string(), name.to_string())) {
            Some(v) => Lookup::Found(v.clone()),
            None => Lookup::Missing,
        }
    }
}

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

/// A claim as the cache keeps it: `None` for one not allocated (kept so an update that takes the allocation
/// away replaces the allocated one).
#[derive(Clone)]
struct ClaimEntry {
    key: Key,
    claim: Option<Claim>,
}

/// A slice as the cache keeps it: its devices on this node.
#[derive(Clone)]
struct SliceEntry {
    name: String,
    devices: Vec<SliceDevice>,
}

#[derive(Default)]
struct State {
    pods: Table<Pod>,
    nads: Table<NetworkAttachmentDefinition>,
    claims: Table<ClaimEntry>,
    slices: Table<SliceEntry>,
    dra: DraServed,
    watch_errors: u64,
}

/// The node daemon's view of the cluster: the node's pods and every NAD, kept current by watches.
pub struct NodeCache {
    state: Mutex<State>,
    /// Bumped on every change, so a lookup that missed can wait for the next event.
    changed: tokio::sync::watch::Sender<u64>,
}

impl Default for NodeCache {
    fn default() -> Self {
        NodeCache {
            state: Mutex::default(),
            changed: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl NodeCache {
    pub fn new() -> Arc<NodeCache> {
        Arc::new(NodeCache::default())
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

    /// What the claims of the pod (`namespace`, `uid`; `claim_names` from its status where known) give its
    /// networks, from the claim and slice caches; unsynced until both have listed (or DRA is known not served).
    pub fn pod_claims(
        &self,
        namespace: &str,
        uid: Option<&str>,
        claim_names: &[String],
    ) -> Lookup<PodClaims> {
        let s = self.state();
        match s.dra {
            DraServed::No => return Lookup::Found(PodClaims::default()),
            DraServed::Unknown => return Lookup::Unsynced,
            DraServed::Yes if !(s.claims.synced && s.slices.synced) => return Lookup::Unsynced,
            DraServed::Yes => {}
        }
        let claims = s.claims.items.values().filter_map(|e| e.claim.as_ref());
        let mine = claims_of_pod(namespace, uid, claim_names, claims);
        let found = pod_claims(mine, |k| {
            s.slices
                .items
                .values()
                .flat_map(|e| e.devices.iter())
                .find(|d| d.key == *k)
                .cloned()
        });
        Lookup::Found(found)
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

    /// Applies a claim watch event (the claim trimmed; `None` for one without an allocation).
    fn apply_claim(&self, event: Event<ClaimEntry>) {
        self.state().claims.apply(event, |e| Some(e.key.clone()));
        self.changed.send_modify(|n| *n += 1);
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
            pod_lists: s.pods.lists,
            nad_lists: s.nads.lists,
            watch_errors: s.watch_errors,
            dra: match s.dra {
                DraServed::Unknown => None,
                DraServed::No => Some(false),
                DraServed::Yes => Some(true),
            },
            dra_synced: s.dra == DraServed::Yes && s.claims.synced && s.slices.synced,
            claims: s
                .claims
                .items
                .values()
                .filter(|e| e.claim.is_some())
                .count(),
            slice_devices: s.slices.items.values().map(|e| e.devices.len()).sum(),
        }
    }

    /// A receiver that sees every later change.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Applies a pod watch event.
    pub fn apply_pod(&self, event: Event<Pod>) {
        self.state()
            .pods
            .apply(event, |p| Some((p.namespace.clone(), p.name.clone())));
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

/// Runs the pod and NAD watches into `cache` until the future is dropped. Errors (connection loss, 410 Gone,
/// forbidden) are logged and retried with backoff; a 410 makes the watcher list again.
pub async fn run_watches(client: Client, cache: Arc<NodeCache>, settings: WatchSettings) {
    let pod_config = watcher::Config::default()
        .fields(&format!("spec.nodeName={}", settings.node))
        .timeout(settings.timeout_secs)
        .any_semantic();
    let pods = watcher::watcher(
        Api::<PartialObjectMeta<KubePod>>::all(client.clone()),
        pod_config,
    )
    .default_backoff();
    let nad_config = watcher::Config::default()
        .timeout(settings.timeout_secs)
        .any_semantic();
    let nads =
        watcher::watcher(Api::<NadObject>::all(client.clone()), nad_config).default_backoff();
    tokio::join!(
        drive(("pods", &settings.server), pods, &cache, |c, ev| c
            .apply_pod(map_event(ev, |m| pod_from_meta(m.metadata)))),
        drive(
            ("network-attachment-definitions", &settings.server),
            nads,
            &cache,
            |c, ev| c.apply_nad(map_event(ev, nad_from_kube))
        ),
        run_dra_watches(client, &cache, &settings),
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

/// The DRA watches: every allocated ResourceClaim (trimmed to what planning reads) and this node's
/// ResourceSlices' devices. Until the API server says whether it serves DRA, a pod's claims are unsynced; where
/// it does not, they are none, and it is asked again every minute.
async fn run_dra_watches(client: Client, cache: &NodeCache, settings: &WatchSettings) {
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
        "watching ResourceClaims and this node's ResourceSlices"
    );
    let mut slice_config = watcher::Config::default()
        .timeout(settings.timeout_secs)
        .any_semantic();
    if by_field {
        slice_config = slice_config.fields(&format!("spec.nodeName={node}"));
    }
    let claim_config = watcher::Config::default()
        .timeout(settings.timeout_secs)
        .any_semantic();
    let claims =
        watcher::watcher(Api::<ResourceClaim>::all(client.clone()), claim_config).default_backoff();
    let slices =
        watcher::watcher(Api::<ResourceSlice>::all(client), slice_config).default_backoff();
    cache.set_dra_served(DraServed::Yes);
    let claim_entry = |c: ResourceClaim| ClaimEntry {
        key: (
            c.metadata.namespace.clone().unwrap_or_default(),
            c.metadata.name.clone().unwrap_or_default(),
        ),
        claim: claim_from_kube(c),
    };
    let slice_entry = |s: ResourceSlice| SliceEntry {
        name: s.metadata.name.clone().unwrap_or_default(),
        devices: slice_devices(s, &node),
    };
    tokio::join!(
        drive(
            ("resourceclaims", &settings.server),
            claims,
            cache,
            |c, ev| c.apply_claim(map_event(ev, claim_entry))
        ),
        drive(
            ("resourceslices", &settings.server),
            slices,
            cache,
            |c, ev| c.apply_slice(map_event(ev, slice_entry))
        ),
    );
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
}
