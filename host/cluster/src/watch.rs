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
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use plexus_core::spec::{NetworkAttachmentDefinition, Pod};

use crate::kube::{nad_from_kube, pod_from_meta, NadObject};
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

#[derive(Default)]
struct State {
    pods: Table<Pod>,
    nads: Table<NetworkAttachmentDefinition>,
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
    let nads = watcher::watcher(Api::<NadObject>::all(client), nad_config).default_backoff();
    tokio::join!(
        drive("pods", pods, &cache, |c, ev| c
            .apply_pod(map_event(ev, |m| pod_from_meta(m.metadata)))),
        drive("network-attachment-definitions", nads, &cache, |c, ev| c
            .apply_nad(map_event(ev, nad_from_kube))),
    );
}

/// Feeds one watch stream into `cache` through `apply`, counting and logging its errors.
async fn drive<K, S>(
    what: &'static str,
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
                tracing::warn!(watch = what, error = %err, "watch failed; retrying");
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
