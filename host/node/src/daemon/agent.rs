//! The node agent: turns the cluster's NetworkHook resources into the node's active hook set.
//!
//! It watches the NetworkHook resources and its own Node (for the labels a hook's `nodeSelector` matches), pulls
//! each selected hook's module by digest from its OCI registry, verifies its signature against the operator's
//! keys (see [`crate::distribution`]), compiles it into the hook cache, and publishes the set
//! (`<cacheDir>/hook-set.json`, [`HookSet`]) in one rename. An ADD reads that file once and loads only
//! compiled artifacts: it never downloads and never compiles.
//!
//! Activation is earned: before a module enters the set, its component must export the interface its
//! `spec.kind` names at the host's WIT version, instantiate within the hook's limits, and answer one call of
//! that export on a synthetic pod without a fault (a deny is an answer). A module that does not stays out, so
//! one bad NetworkHook cannot fail the node's ADDs.
//!
//! A hook whose module cannot be made ready (registry unreachable, not found, content that does not match its
//! digest, bad or missing signature, does not compile, fails its probe) keeps the version last published for
//! it, if that version is still trusted; registry failures are retried with backoff (1 s doubling to 5 min,
//! with jitter). Every failure is reported in the resource's status (one entry per node, with the time of the
//! next attempt), as a Warning event on the resource, and in the log, never by stopping the process.
//!
//! Trust follows the keys: the key files are read again every few seconds, and when the set of keys changes
//! every module in the set is checked against the new keys; one whose signature verifies with none of them
//! leaves the set (`Untrusted`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{reflector, WatchStreamExt};
use plexus_hooks::{FailurePolicy, HookKind, HookSpec};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::distribution::{self, DistError, Registry, RegistryOptions, TrustedKeys};
use plexus_cluster::KubeApi;
use plexus_cni::hooks::{HookSet, MODULES_DIR};

/// The hook resource's API group, version and kind.
pub const GROUP: &str = "plexus.dev";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "NetworkHook";
pub const PLURAL: &str = "networkhooks";

/// Backoff of a hook whose module could not be made ready.
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(300);
/// How often the trusted keys are read again (a ConfigMap's update reaches the mounted files within a minute).
const KEY_POLL: Duration = Duration::from_secs(5);
/// How long a module no longer in the set is kept (an ADD that read the previous set may still be loading it).
const RETIRE_AFTER: Duration = Duration::from_secs(60);

/// Whether modules must carry a signature that verifies with one of the operator's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SignaturePolicy {
    Required,
    /// Only the digest pins the module.
    Off,
}

/// The agent's settings, from the daemon's command line.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    pub node: String,
    /// Where the agent leaves each hook's state on this node, for the metrics.
    pub states: super::metrics::HookStates,
    pub cache_dir: PathBuf,
    pub key_files: Vec<PathBuf>,
    pub signatures: SignaturePolicy,
    pub registry: RegistryOptions,
    pub watch_timeout_secs: u32,
}

/// A NetworkHook's spec.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkHookSpec {
    pub kind: HookKind,
    /// `REGISTRY/REPOSITORY@sha256:<digest>`.
    pub module: String,
    #[serde(default)]
    pub settings: Option<Value>,
    #[serde(default)]
    pub order: i32,
    #[serde(default)]
    pub failure_policy: FailurePolicy,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    #[serde(default, rename = "memoryLimitMiB")]
    pub memory_limit_mib: Option<u64>,
    #[serde(default)]
    pub namespaces: Option<Vec<String>>,
    #[serde(default)]
    pub node_selector: Option<LabelSelector>,
}

/// One node's report in a NetworkHook's `status.nodes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    pub node: String,
    /// The hook runs in this node's ADDs (perhaps an earlier version: see `digest`).
    pub active: bool,
    /// `Active`, or why not (or why the wanted version is not): `PullFailed`, `Unauthorized`, `NotFound`,
    /// `DigestMismatch`, `NotAWasmModule`, `SignatureMissing`, `SignatureInvalid`, `NoTrustedKeys`, `Untrusted`,
    /// `InvalidReference`, `CompileFailed`, `KindMismatch`, `Incompatible`, `FailedProbe`, `InvalidSpec`.
    pub reason: String,
    pub message: String,
    /// The manifest digest running on the node, when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// When the agent tries again (a registry failure); absent when it waits for a change instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_time: Option<String>,
    pub observed_generation: i64,
}

#[derive(Debug, Clone, PartialEq)]
struct Resource {
    spec: Result<NetworkHookSpec, String>,
    generation: i64,
}

#[derive(Default)]
struct Inputs {
    /// The resources' specs, from the reflector's store once it has listed (`None` before).
    hooks: Option<BTreeMap<String, Resource>>,
    labels: Option<BTreeMap<String, String>>,
}

/// A module made ready: where its component is and what was checked.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    /// The module's manifest digest.
    digest: String,
    /// The component's sha256 (hex).
    sha256: String,
    /// The trusted key its signature verified with (`None`: signatures were off).
    verified_by: Option<String>,
}

struct Failure {
    attempts: u32,
    next: Instant,
    error: (String, String),
}

/// The agent's state between reconciliations.
struct Agent {
    settings: AgentSettings,
    keys: Result<TrustedKeys, String>,
    registry: Result<Registry, String>,
    modules: PathBuf,
    published: HookSet,
    /// What each published hook runs: its manifest digest, and its order (unknown for a set published before a
    /// restart, whose entries carry no order).
    published_runs: HashMap<String, (String, Option<i32>)>,
    /// Failed modules by reference (a signature lives in a repository: the same digest elsewhere is another
    /// module as far as trust goes).
    failures: HashMap<String, Failure>,
    reported: HashMap<String, NodeStatus>,
    /// Component digests no longer in the set, since when.
    retired: HashMap<String, Instant>,
    /// Probe verdicts by the entry probed (component, kind, settings, limits): a module is probed once per
    /// version of its spec.
    probes: HashMap<String, Result<(), (String, String)>>,
    probes_used: std::collections::HashSet<String>,
    /// What the keys were when last read (their IDs, or the error), to notice a change.
    keys_seen: String,
    status_api: Api<DynamicObject>,
    /// For the Warning events on the resources.
    api: KubeApi,
}

/// The NetworkHook resource's API description.
pub fn api_resource() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: KIND.into(),
        plural: PLURAL.into(),
    }
}

/// Runs the agent until the future is dropped.
pub async fn run(api: KubeApi, settings: AgentSettings) {
    let client = api.client().clone();
    let inputs = Arc::new(Mutex::new(Inputs::default()));
    let changed = Arc::new(tokio::sync::Notify::new());
    let ar = api_resource();
    let hooks_api = Api::<DynamicObject>::all_with(client.clone(), &ar);
    // kube-runtime's reflector keeps the resources (each list fills a buffer that replaces the store when
    // complete); what the agent reads of them is their specs.
    let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
    let store = writer.as_reader();
    let hook_watch = {
        let (inputs, changed) = (inputs.clone(), changed.clone());
        let config = watcher::Config::default().timeout(settings.watch_timeout_secs);
        let stream = watcher::watcher(hooks_api.clone(), config)
            .default_backoff()
            .reflect(writer);
        async move {
            let mut stream = std::pin::pin!(stream);
            let mut listed = false;
            while let Some(item) = stream.next().await {
                match item {
                    Ok(event) => {
                        listed |= matches!(event, Event::InitDone);
                        // Status writes of other nodes change the resource too; only its spec matters here.
                        if listed
                            && update_hooks(&mut inputs.lock().expect("inputs"), &store.state())
                        {
                            changed.notify_one();
                        }
                    }
                    Err(e) => tracing::warn!(watch = PLURAL, error = %e, "watch failed; retrying"),
                }
            }
        }
    };
    let node_watch = {
        let (inputs, changed) = (inputs.clone(), changed.clone());
        let config = watcher::Config::default()
            .fields(&format!("metadata.name={}", settings.node))
            .timeout(settings.watch_timeout_secs);
        let stream = watcher::watcher(Api::<Node>::all(client.clone()), config).default_backoff();
        async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(item) = stream.next().await {
                match item {
                    Ok(Event::Apply(n) | Event::InitApply(n)) => {
                        // kubelet updates its Node often; only a change of labels matters here.
                        let labels = Some(n.metadata.labels.unwrap_or_default());
                        let mut i = inputs.lock().expect("inputs");
                        if i.labels != labels {
                            i.labels = labels;
                            changed.notify_one();
                        }
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(watch = "node", error = %e, "watch failed; retrying"),
                }
            }
        }
    };
    let mut agent = Agent::new(settings, hooks_api, api);
    let reconcile = async move {
        // Reconciled on a change of the resources or labels, of the keys, when a retry is due, and every
        // MAX_RETRY at least.
        let mut due = Instant::now();
        loop {
            if Instant::now() >= due {
                let snapshot = {
                    let i = inputs.lock().expect("inputs");
                    i.hooks.clone().zip(i.labels.clone())
                };
                let next_retry = match snapshot {
                    Some((hooks, labels)) => agent.reconcile(&hooks, &labels).await,
                    None => None,
                };
                due = next_retry.unwrap_or_else(|| Instant::now() + MAX_RETRY);
            }
            let wait = due.saturating_duration_since(Instant::now()).min(KEY_POLL);
            tokio::select! {
                _ = changed.notified() => due = Instant::now(),
                _ = tokio::time::sleep(wait) => {
                    if agent.reload_keys() {
                        due = Instant::now();
                    }
                }
            }
        }
    };
    tokio::join!(hook_watch, node_watch, reconcile);
}

fn resource_of(obj: &DynamicObject) -> Option<(String, Resource)> {
    let name = obj.metadata.name.clone()?;
    let spec = obj
        .data
        .get("spec")
        .cloned()
        .ok_or_else(|| "no spec".to_string())
        .and_then(|s| serde_json::from_value(s).map_err(|e| format!("spec: {e}")));
    Some((
        name,
        Resource {
            spec,
            generation: obj.metadata.generation.unwrap_or(0),
        },
    ))
}

/// Takes the resources' specs from the store's objects; true when they changed (a new generation or spec, a
/// resource added or gone, or the first list).
fn update_hooks(inputs: &mut Inputs, objects: &[Arc<DynamicObject>]) -> bool {
    let hooks: BTreeMap<String, Resource> =
        objects.iter().filter_map(|obj| resource_of(obj)).collect();
    if inputs.hooks.as_ref() == Some(&hooks) {
        return false;
    }
    inputs.hooks = Some(hooks);
    true
}

/// Whether a hook's node selector picks a node with these labels (no selector: every node).
pub fn selects(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> Result<bool, String> {
    let Some(sel) = selector else {
        return Ok(true);
    };
    let sel: Selector = sel
        .clone()
        .try_into()
        .map_err(|e| format!("nodeSelector: {e}"))?;
    Ok(sel.matches(labels))
}

/// What a set of keys (or the error reading them) is, for noticing a change.
fn keys_fingerprint(keys: &Result<TrustedKeys, String>) -> String {
    match keys {
        Ok(k) => {
            let mut ids = k.ids();
            ids.sort();
            ids.join(",")
        }
        Err(e) => format!("error: {e}"),
    }
}

impl Agent {
    fn new(settings: AgentSettings, status_api: Api<DynamicObject>, api: KubeApi) -> Agent {
        let keys = TrustedKeys::load(&settings.key_files).map_err(|e| e.to_string());
        if let Err(e) = &keys {
            tracing::error!(error = %e, "hook signature keys unusable: every hook is refused until fixed");
        }
        let keys_seen = keys_fingerprint(&keys);
        let registry = Registry::new(&settings.registry).map_err(|e| e.to_string());
        let modules = settings.cache_dir.join(MODULES_DIR);
        // What was published before a restart stays active until this run publishes.
        let published = match HookSet::read(&settings.cache_dir) {
            Ok(s) => s.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring the previous hook set");
                HookSet::default()
            }
        };
        let published_runs = published
            .hooks
            .iter()
            .filter_map(|h| Some((h.name.clone(), (digest_of_module_path(&h.module)?, None))))
            .collect();
        Agent {
            settings,
            keys,
            registry,
            modules,
            published,
            published_runs,
            failures: HashMap::new(),
            reported: HashMap::new(),
            retired: HashMap::new(),
            probes: HashMap::new(),
            probes_used: Default::default(),
            keys_seen,
            status_api,
            api,
        }
    }

    /// Reads the key files again; true when the keys changed (then every module's trust is checked anew).
    fn reload_keys(&mut self) -> bool {
        if self.settings.key_files.is_empty() {
            return false;
        }
        let keys = TrustedKeys::load(&self.settings.key_files).map_err(|e| e.to_string());
        let seen = keys_fingerprint(&keys);
        if seen == self.keys_seen {
            return false;
        }
        match &keys {
            Ok(k) => {
                tracing::info!(keys = ?k.ids(), "trusted hook keys changed; checking every module again")
            }
            Err(e) => {
                tracing::error!(error = %e, "hook signature keys unusable: every hook is refused until fixed")
            }
        }
        self.keys = keys;
        self.keys_seen = seen;
        // Verdicts reached with the old keys are stale: try again now.
        self.failures.clear();
        true
    }

    /// Whether what a record says was checked still holds: signatures are off, or the key its signature verified
    /// with is still trusted.
    fn trusts(&self, rec: &Record) -> bool {
        match (self.settings.signatures, &self.keys, &rec.verified_by) {
            (SignaturePolicy::Off, _, _) => true,
            (SignaturePolicy::Required, Ok(keys), Some(by)) => keys.ids().contains(by),
            (SignaturePolicy::Required, _, _) => false,
        }
    }

    /// Whether a component (by sha256) may still run: a record of it is trusted.
    fn still_trusted(&self, sha: &str) -> bool {
        records(&self.modules).any(|r| r.sha256 == sha && self.trusts(&r))
    }

    /// The module's first call, once per version of the entry: see the module docs.
    async fn probe(
        &mut self,
        name: &str,
        spec: &NetworkHookSpec,
        sha: &str,
    ) -> Result<(), (String, String)> {
        let mut entry = hook_spec(name, spec, &self.modules, sha);
        // A fault must show, and the synthetic pod is in no namespace the hook names.
        entry.failure_policy = FailurePolicy::Fail;
        entry.namespaces = None;
        let key = serde_json::to_string(&entry).expect("a hook entry serializes");
        self.probes_used.insert(key.clone());
        if let Some(verdict) = self.probes.get(&key) {
            return verdict.clone();
        }
        let cache = self.settings.cache_dir.clone();
        let verdict = tokio::task::spawn_blocking(move || probe_entry(&entry, &cache))
            .await
            .unwrap_or_else(|e| Err(("FailedProbe".into(), format!("the probe panicked: {e}"))));
        match &verdict {
            Ok(()) => tracing::info!(hook = name, sha256 = sha, "module passed its probe"),
            Err((reason, message)) => {
                tracing::warn!(hook = name, sha256 = sha, reason = %reason, "{message}")
            }
        }
        self.probes.insert(key, verdict.clone());
        verdict
    }

    /// Brings the published set in line with the resources; answers when a failed module is due for a retry.
    async fn reconcile(
        &mut self,
        hooks: &BTreeMap<String, Resource>,
        labels: &BTreeMap<String, String>,
    ) -> Option<Instant> {
        let mut entries: Vec<(i32, String, HookSpec, String)> = Vec::new();
        let mut reports: BTreeMap<String, Option<NodeStatus>> = BTreeMap::new();
        let node = self.settings.node.clone();
        self.probes_used.clear();
        for (name, res) in hooks {
            let status = |active: bool, reason: &str, message: String, digest: Option<String>| {
                Some(NodeStatus {
                    node: node.clone(),
                    active,
                    reason: reason.into(),
                    message,
                    digest,
                    next_attempt_time: None,
                    observed_generation: res.generation,
                })
            };
            let spec = match &res.spec {
                Ok(s) => s,
                Err(e) => {
                    reports.insert(name.clone(), status(false, "InvalidSpec", e.clone(), None));
                    continue;
                }
            };
            match selects(spec.node_selector.as_ref(), labels) {
                Ok(true) => {}
                Ok(false) => {
                    reports.insert(name.clone(), None);
                    continue;
                }
                Err(e) => {
                    reports.insert(name.clone(), status(false, "InvalidSpec", e, None));
                    continue;
                }
            }
            let outcome = match self.ready(&spec.module).await {
                Ok((digest, sha)) => match self.probe(name, spec, &sha).await {
                    Ok(()) => Ok((digest, sha)),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            match outcome {
                Ok((digest, sha)) => {
                    entries.push((
                        spec.order,
                        name.clone(),
                        hook_spec(name, spec, &self.modules, &sha),
                        digest.clone(),
                    ));
                    let message = format!("module {digest} is active");
                    reports.insert(name.clone(), status(true, "Active", message, Some(digest)));
                }
                Err((mut reason, mut message)) => {
                    // The version published before keeps running, as long as it is still trusted.
                    let mut kept = self
                        .published
                        .hooks
                        .iter()
                        .find(|h| &h.name == name)
                        .cloned()
                        .zip(self.published_runs.get(name).cloned());
                    if let Some((old, (d, _))) = &kept {
                        if !old
                            .sha256
                            .as_deref()
                            .is_some_and(|sha| self.still_trusted(sha))
                        {
                            message = format!(
                                "{d} ran here but no trusted key verifies it any more, so it was taken out \
                                 of the node's hook set; {reason}: {message}"
                            );
                            reason = "Untrusted".into();
                            kept = None;
                        }
                    }
                    let active = kept.is_some();
                    let digest = kept.as_ref().map(|(_, (d, _))| d.clone());
                    if let Some((old, (d, order))) = kept {
                        // The entry last published, as it was (its module and its settings): the last good one.
                        entries.push((order.unwrap_or(spec.order), name.clone(), old, d));
                    }
                    let mut report = status(active, &reason, message, digest);
                    if let (Some(r), Some(f)) = (report.as_mut(), self.failures.get(&spec.module)) {
                        r.next_attempt_time = Some(wall_clock(f.next));
                    }
                    reports.insert(name.clone(), report);
                }
            }
        }
        entries.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        let specs: Vec<HookSpec> = entries.iter().map(|e| e.2.clone()).collect();
        if specs != self.published.hooks {
            let set = HookSet {
                generation: self.published.generation + 1,
                hooks: specs,
            };
            match set.publish(&self.settings.cache_dir) {
                Ok(()) => {
                    tracing::info!(
                        generation = set.generation,
                        hooks = set.hooks.len(),
                        "hook set published"
                    );
                    self.published = set;
                    self.published_runs = entries
                        .iter()
                        .map(|(order, name, _, digest)| {
                            (name.clone(), (digest.clone(), Some(*order)))
                        })
                        .collect();
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot publish the hook set; the previous one stays")
                }
            }
        }
        let used = std::mem::take(&mut self.probes_used);
        self.probes.retain(|k, _| used.contains(k));
        self.collect_garbage();
        self.report(reports).await;
        self.failures.values().map(|f| f.next).min()
    }

    /// The module of a pinned reference, pulled, verified and compiled if not already: its manifest digest and
    /// component sha256, or (reason, message).
    async fn ready(&mut self, module: &str) -> Result<(String, String), (String, String)> {
        let reference = distribution::pinned_reference(module)
            .map_err(|e| (e.reason().to_string(), e.to_string()))?;
        let digest = reference.digest().unwrap_or_default().to_string();
        let required = self.settings.signatures == SignaturePolicy::Required;
        let keys = match (&self.keys, required) {
            (Err(e), true) => return Err(("NoTrustedKeys".into(), e.clone())),
            (Ok(k), true) => Some(k.clone()),
            (_, false) => None,
        };
        // Made ready before (this run or an earlier one), under the current signature policy and keys.
        if let Some(rec) = self.record(module) {
            let path = self.module_path(&rec.sha256);
            if self.trusts(&rec) && path.exists() {
                let (path, cache) = (path.clone(), self.settings.cache_dir.clone());
                let compiled =
                    tokio::task::spawn_blocking(move || plexus_hooks::compile(&path, &cache)).await;
                if let Ok(Ok(a)) = compiled {
                    if a.sha256 == rec.sha256 {
                        self.failures.remove(module);
                        return Ok((digest, rec.sha256));
                    }
                }
            }
        }
        if let Some(f) = self.failures.get(module) {
            if Instant::now() < f.next {
                return Err(f.error.clone());
            }
        }
        match self.fetch(&reference, &digest, keys.as_ref()).await {
            Ok(sha) => {
                self.failures.remove(module);
                Ok((digest, sha))
            }
            Err(error) => {
                tracing::warn!(module, reason = %error.0, "{}; retrying with backoff", error.1);
                let f = self.failures.entry(module.to_string()).or_insert(Failure {
                    attempts: 0,
                    next: Instant::now(),
                    error: error.clone(),
                });
                let delay = crate::backoff::jitter(
                    FIRST_RETRY
                        .saturating_mul(1u32 << f.attempts.min(16))
                        .min(MAX_RETRY),
                );
                f.attempts += 1;
                f.next = Instant::now() + delay;
                f.error = error.clone();
                Err(error)
            }
        }
    }

    async fn fetch(
        &self,
        reference: &oci_client::Reference,
        digest: &str,
        keys: Option<&TrustedKeys>,
    ) -> Result<String, (String, String)> {
        let fail = |e: DistError| (e.reason().to_string(), e.to_string());
        let registry = self
            .registry
            .as_ref()
            .map_err(|e| ("PullFailed".to_string(), e.clone()))?;
        // Pulled first (bounded), so a module that is not there is reported as such; nothing of it is used
        // before its signature verifies.
        let pulled = registry.pull_module(reference).await.map_err(fail)?;
        let verified_by = match keys {
            Some(k) => Some(registry.verify(reference, digest, k).await.map_err(fail)?),
            None => None,
        };
        let path = self.module_path(&pulled.sha256);
        let io = |e: std::io::Error| ("PullFailed".to_string(), format!("{}: {e}", path.display()));
        super::files::private_dir(&self.modules, 0o700).map_err(io)?;
        plexus_cni::conf::replace_file(&path, &pulled.wasm, 0o600).map_err(io)?;
        let (p, cache) = (path.clone(), self.settings.cache_dir.clone());
        let artifact = tokio::task::spawn_blocking(move || plexus_hooks::compile(&p, &cache))
            .await
            .map_err(|e| ("CompileFailed".to_string(), e.to_string()))?
            .map_err(|e| ("CompileFailed".to_string(), e.to_string()))?;
        if artifact.sha256 != pulled.sha256 {
            return Err((
                "DigestMismatch".into(),
                format!(
                    "{} changed while compiling: expected sha256:{}, got sha256:{}",
                    path.display(),
                    pulled.sha256,
                    artifact.sha256
                ),
            ));
        }
        let rec = Record {
            digest: digest.to_string(),
            sha256: pulled.sha256.clone(),
            verified_by,
        };
        let rec_path = self.record_path(&reference.whole());
        plexus_cni::conf::replace_file(&rec_path, &serde_json::to_vec(&rec).expect("json"), 0o600)
            .map_err(|e| {
                (
                    "PullFailed".to_string(),
                    format!("{}: {e}", rec_path.display()),
                )
            })?;
        tracing::info!(module = %reference.whole(), sha256 = %pulled.sha256, "module pulled, verified and compiled");
        Ok(pulled.sha256)
    }

    fn module_path(&self, sha: &str) -> PathBuf {
        self.modules.join(format!("{sha}.wasm"))
    }

    /// A module's record: named by the sha256 of its reference.
    fn record_path(&self, module: &str) -> PathBuf {
        self.modules.join(format!(
            "{}.json",
            &distribution::sha256_digest(module.as_bytes())["sha256:".len()..]
        ))
    }

    fn record(&self, module: &str) -> Option<Record> {
        read_record(&self.record_path(module))
    }

    /// Removes modules (component, record, compiled artifact) out of the set for longer than [`RETIRE_AFTER`].
    fn collect_garbage(&mut self) {
        let in_use: std::collections::HashSet<String> = self
            .published
            .hooks
            .iter()
            .filter_map(|h| h.sha256.clone())
            .collect();
        let Ok(dir) = std::fs::read_dir(&self.modules) else {
            return;
        };
        let now = Instant::now();
        for entry in dir.flatten() {
            let path = entry.path();
            let Some(stem) = path
                .file_stem()
                .and_then(|s| s.to_str())
                .map(str::to_string)
            else {
                continue;
            };
            let sha = match path.extension().and_then(|e| e.to_str()) {
                Some("wasm") => stem,
                Some("json") => match read_record(&path) {
                    Some(r) => r.sha256,
                    None => continue,
                },
                _ => continue,
            };
            if in_use.contains(&sha) {
                self.retired.remove(&sha);
                continue;
            }
            let since = *self.retired.entry(sha.clone()).or_insert(now);
            if now.duration_since(since) < RETIRE_AFTER {
                continue;
            }
            if path.extension().is_some_and(|e| e == "wasm") {
                if let Ok(artifact) = plexus_hooks::artifact_path(&path, &self.settings.cache_dir) {
                    let _ = std::fs::remove_file(artifact);
                }
            }
            match std::fs::remove_file(&path) {
                Ok(()) => tracing::info!(path = %path.display(), "retired hook module removed"),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove a retired module")
                }
            }
        }
        self.retired.retain(|sha, _| !in_use.contains(sha));
    }

    /// A Warning event on the NetworkHook (cluster scoped, so in the `default` namespace), best effort.
    async fn warn(&self, hook: &str, s: &NodeStatus) {
        let object = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(format!("{GROUP}/{VERSION}")),
            kind: Some(KIND.into()),
            name: Some(hook.into()),
            ..Default::default()
        };
        let message = format!("node {}: {}", s.node, s.message);
        let reporter = ("plexus-agent", Some(s.node.as_str()));
        let posted = self
            .api
            .post_event_about(object, ("Warning", &s.reason), &message, reporter)
            .await;
        if let Err(e) = posted {
            tracing::warn!(hook, error = %e, "cannot post the hook's event");
        }
    }

    /// Applies this node's entry of each resource's `status.nodes` (server-side apply, one field manager per
    /// node, so nodes never overwrite each other); `None` removes the entry. Only changes are sent.
    async fn report(&mut self, reports: BTreeMap<String, Option<NodeStatus>>) {
        // What the node knows, whether or not the API server takes it.
        *self
            .settings
            .states
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = reports
            .iter()
            .filter_map(|(name, s)| {
                let s = s.as_ref()?;
                Some((
                    name.clone(),
                    plexus_cni::daemon::proto::HookHealth {
                        name: name.clone(),
                        active: s.active,
                        reason: s.reason.clone(),
                        message: s.message.clone(),
                    },
                ))
            })
            .collect();
        let manager = format!("plexus-agent-{}", self.settings.node);
        // Resources gone: forget what was reported.
        self.reported.retain(|name, _| reports.contains_key(name));
        for (name, status) in reports {
            let unchanged = match (&status, self.reported.get(&name)) {
                (Some(s), Some(r)) => s == r,
                (None, None) => true,
                _ => false,
            };
            if unchanged {
                continue;
            }
            let mut body = json!({
                "apiVersion": format!("{GROUP}/{VERSION}"),
                "kind": KIND,
                "metadata": {"name": name},
            });
            if let Some(s) = &status {
                body["status"] = json!({"nodes": [s]});
            }
            let params = PatchParams::apply(&manager).force();
            let sent = tokio::time::timeout(
                Duration::from_secs(10),
                self.status_api
                    .patch_status(&name, &params, &Patch::Apply(&body)),
            )
            .await;
            let newly_failing = status.as_ref().is_some_and(|s| {
                s.reason != "Active"
                    && self
                        .reported
                        .get(&name)
                        .is_none_or(|r| r.reason != s.reason)
            });
            if newly_failing {
                if let Some(s) = &status {
                    self.warn(&name, s).await;
                }
            }
            match sent {
                Ok(Ok(_)) => match status {
                    Some(s) => {
                        self.reported.insert(name, s);
                    }
                    None => {
                        self.reported.remove(&name);
                    }
                },
                Ok(Err(e)) => {
                    tracing::warn!(hook = %name, error = %e, "cannot report the hook's status")
                }
                Err(_) => tracing::warn!(hook = %name, "reporting the hook's status timed out"),
            }
        }
    }
}

/// An instant of the agent's clock as an RFC 3339 time (seconds).
fn wall_clock(at: Instant) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = (now + at.saturating_duration_since(Instant::now())).as_secs();
    k8s_openapi::jiff::Timestamp::from_second(secs as i64)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Loads one entry as an ADD would and calls its kind's export once on a synthetic pod; (reason, message) when
/// the module cannot serve as that kind.
fn probe_entry(entry: &HookSpec, cache_dir: &Path) -> Result<(), (String, String)> {
    use plexus_hooks::{HookError, Hooks, LoadError};
    let hooks = match Hooks::load(std::slice::from_ref(entry), cache_dir) {
        Ok(h) => h,
        Err(HookError::Load {
            error: LoadError::MissingExport { .. },
            ..
        }) => return Err(export_mismatch(entry)),
        Err(HookError::Load {
            error: LoadError::Link { reason, .. },
            ..
        }) => {
            let host = plexus_hooks::WIT_VERSION;
            let why =
                format!("the module imports what this node (plexus:hooks@{host}) lacks: {reason}");
            return Err(("Incompatible".into(), why));
        }
        Err(e) => return Err(("FailedProbe".into(), e.to_string())),
    };
    let pod = plexus_core::spec::Pod {
        namespace: "plexus-probe".into(),
        name: "probe".into(),
        uid: Some("00000000-0000-0000-0000-000000000000".into()),
        labels: [("app".to_string(), "probe".to_string())].into(),
        annotations: Default::default(),
    };
    let selection = json!({"name": "probe-net", "namespace": "plexus-probe"});
    let config = json!({"cniVersion": "1.0.0", "name": "probe-net", "type": "bridge"});
    let result = match entry.kind {
        HookKind::Policy => hooks.policy(&pod, vec![selection]).map(drop),
        HookKind::Resolver => {
            let nad = json!({
                "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                "metadata": {"name": "probe-net", "namespace": "plexus-probe"},
                "spec": {"config": config.to_string()},
            });
            hooks
                .resolve(&pod, &selection, Some(&nad), Some(&config))
                .map(drop)
        }
        HookKind::Status => {
            // What an ADD with the cluster network and one selection writes (spec 5: exactly one default).
            let entries = vec![
                json!({"name": "plexus-probe/cluster-net", "interface": "eth0",
                    "ips": ["192.0.2.2"], "mac": "02:00:00:00:00:02", "default": true, "dns": {}}),
                json!({"name": "plexus-probe/probe-net", "interface": "net1",
                    "ips": ["192.0.2.10"], "mac": "02:00:00:00:00:01", "default": false, "dns": {}}),
            ];
            hooks.status(&pod, entries).map(drop)
        }
    };
    result.map_err(|e| {
        (
            "FailedProbe".into(),
            format!(
                "one call of its {} export on a synthetic pod failed: {e}",
                entry.kind
            ),
        )
    })
}

/// Why a module lacks the export its kind needs: it serves another kind, or another version of the contract.
fn export_mismatch(entry: &HookSpec) -> (String, String) {
    let wanted = entry.kind.interface();
    match plexus_hooks::inspect(&entry.module) {
        Ok(i) if !i.kinds.is_empty() => (
            "KindMismatch".into(),
            format!(
                "spec.kind is {} but the module exports {} only, not {wanted}",
                entry.kind,
                i.kinds
                    .iter()
                    .map(|k| k.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        Ok(i) if !i.wit_versions.is_empty() => (
            "Incompatible".into(),
            format!(
                "the module is built against plexus:hooks@{}; this node implements {}",
                i.wit_versions.join(", "),
                plexus_hooks::WIT_VERSION
            ),
        ),
        Ok(i) => (
            "KindMismatch".into(),
            format!(
                "the module exports no plexus:hooks interface, not {wanted} (exports: {})",
                i.exports.join(", ")
            ),
        ),
        Err(e) => ("FailedProbe".into(), e.to_string()),
    }
}

/// The conf entry a selected hook becomes.
fn hook_spec(name: &str, spec: &NetworkHookSpec, modules: &Path, sha: &str) -> HookSpec {
    HookSpec {
        name: name.to_string(),
        kind: spec.kind,
        module: modules.join(format!("{sha}.wasm")),
        sha256: Some(sha.to_string()),
        settings: spec.settings.clone(),
        failure_policy: spec.failure_policy,
        timeout_ms: spec.timeout_ms,
        memory_limit_mib: spec.memory_limit_mib,
        namespaces: spec.namespaces.clone(),
        precompiled: true,
    }
}

/// The manifest digest a published entry came from is not in the entry; it is in its module's record.
fn digest_of_module_path(module: &Path) -> Option<String> {
    let sha = module.file_stem()?.to_str()?;
    records(module.parent()?)
        .find(|r| r.sha256 == sha)
        .map(|r| r.digest)
}

/// Every readable module record in the modules directory.
fn records(modules: &Path) -> impl Iterator<Item = Record> {
    std::fs::read_dir(modules)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| read_record(&e.path()))
}

fn read_record(path: &Path) -> Option<Record> {
    let bytes = plexus_cni::conf::read_capped(path, 4096).ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn node_selectors_pick_labelled_nodes() {
        let sel: LabelSelector = serde_json::from_value(json!({
            "matchLabels": {"plexus.dev/canary": "true"},
            "matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["b"]}]
        }))
        .unwrap();
        assert!(selects(Some(&sel), &labels(&[("plexus.dev/canary", "true")])).unwrap());
        assert!(!selects(Some(&sel), &labels(&[])).unwrap());
        assert!(!selects(
            Some(&sel),
            &labels(&[("plexus.dev/canary", "true"), ("zone", "b")])
        )
        .unwrap());
        assert!(selects(None, &labels(&[])).unwrap());
    }

    #[test]
    fn only_a_change_of_the_specs_is_a_change() {
        let obj = |name: &str| -> Arc<DynamicObject> {
            Arc::new(
                serde_json::from_value(json!({
                    "apiVersion": "plexus.dev/v1alpha1", "kind": "NetworkHook",
                    "metadata": {"name": name, "generation": 2},
                    "spec": {"kind": "status", "module": "r.example/a@sha256:00"}
                }))
                .unwrap(),
            )
        };
        let mut i = Inputs::default();
        // The first list is a change even when it is empty.
        assert!(update_hooks(&mut i, &[]));
        assert!(update_hooks(&mut i, &[obj("a")]));
        let hooks = i.hooks.clone().unwrap();
        assert_eq!(hooks["a"].generation, 2);
        assert_eq!(hooks["a"].spec.as_ref().unwrap().kind, HookKind::Status);
        // A status write of some node: same generation and spec, nothing to do.
        let mut with_status = (*obj("a")).clone();
        with_status.data["status"] = json!({"nodes": [{"node": "n"}]});
        assert!(!update_hooks(&mut i, &[Arc::new(with_status)]));
        let mut bad = (*obj("b")).clone();
        bad.data["spec"]["surprise"] = json!(1);
        assert!(update_hooks(&mut i, &[obj("a"), Arc::new(bad)]));
        let hooks = i.hooks.clone().unwrap();
        assert!(hooks["b"].spec.as_ref().unwrap_err().contains("surprise"));
        assert!(update_hooks(&mut i, &[]));
        assert_eq!(i.hooks, Some(BTreeMap::new()));
    }
}
