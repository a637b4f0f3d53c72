//! The node agent: turns the cluster's NetworkHook resources into the node's active hook set.
//!
//! It watches the NetworkHook resources and its own Node (for the labels a hook's `nodeSelector` matches), pulls
//! each selected hook's module by digest from its OCI registry, verifies its signature against the operator's
//! keys (see [`crate::distribution`]), compiles it into the hook cache, and publishes the set
//! (`<cacheDir>/hook-set.json`, [`HookSet`]) in one rename. An ADD reads that file once and loads only
//! compiled artifacts: it never downloads and never compiles.
//!
//! Activation is earned: before a module runs, its component must export the interface its `spec.kind` names at
//! the host's WIT version, instantiate within the hook's limits, and answer one call of that export on a
//! synthetic pod without a fault (a deny is an answer).
//!
//! Last good means last good: a hook that ran keeps its version running (from its compiled artifact, with the
//! key that verified it recorded in the set) whatever happens to the registry, the pulled component or a new
//! version, until its resource is deleted, the node leaves its selector, or that key leaves the trusted set.
//! Registry failures are retried with backoff (1 s doubling to 5 min, with jitter). A selected hook with no
//! version that may run is published as an unready entry, so its `failurePolicy` decides the ADDs it applies to
//! (`Fail` refuses them) rather than its absence. Every hook's state on this node (active, or why not, with the
//! time of the next attempt) is in the node's own `NodeHookStatus` object ([`crate::node_report`]); a failure is
//! also a Warning event on the resource and a line in the log, never a reason to stop the process. No node
//! writes the NetworkHook itself: an agent of this version removes the `status.nodes` entry an earlier one wrote
//! there.
//!
//! Trust follows the keys: the key files are read again every few seconds, and when the set of keys changes
//! every module in the set is checked against the new keys; one whose signature verifies with none of them
//! stops running (`Untrusted`).
//!
//! What it does outside its memory (pull, compile, probe, the API server's writes and events) goes through
//! [`AgentEffects`], so that these guarantees are tested in process on a paused clock (`reconcile_tests`);
//! the real parts test the wiring. The report and the removal of old status entries go through the cluster
//! crate's request layer with one attempt each ([`KubeApi::without_retries`]): the agent is their durable writer,
//! keeping what it has not got through and sending it again (a refused report when it changes, one that failed for
//! a transient reason after its own backoff, 1 s doubling to 5 min), so nothing below it retries.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{reflector, WatchStreamExt};
use plexus_hooks::{FailurePolicy, HookKind, HookSpec};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::hook_plan::{plan, select, Entry, LastGood, PlanInput, Ready, Resource, Wanted};
pub use super::hook_plan::{selects, NetworkHookSpec};
use crate::controller::{self, Controller};
use crate::distribution::{self, RegistryOptions, TrustedKeys};
use crate::hook_state::{Failure, Reason};
use crate::node_report::{self, HookReport, NodeReport};
use plexus_cluster::{ClusterError, KubeApi};
use plexus_cni::hooks::{HookSet, PublishedRun, MODULES_DIR};

mod effects;
pub use effects::{AgentEffects, Fetched, KubeEffects};

/// The hook resource's API group, version and kind.
pub const GROUP: &str = "plexus.dev";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "NetworkHook";
pub const PLURAL: &str = "networkhooks";
/// The RBAC resource of the hook's status (where agents before per-node objects wrote).
const STATUS_RESOURCE: &str = "networkhooks/status";

/// Backoff of a hook whose module could not be made ready.
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(300);
/// How often the trusted keys are read again (a ConfigMap's update reaches the mounted files within a minute).
const KEY_POLL: Duration = Duration::from_secs(5);
/// The field manager of the node's own object (one writer per object: the node it is named after).
const REPORT_MANAGER: &str = "plexus-agent";
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
    /// The program whose `hook compile` and `hook probe` compile and probe pulled modules
    /// ([`super::compile::own_binary`] in the daemon).
    pub compiler: PathBuf,
    /// What each of those processes may use.
    pub limits: super::compile::ProcessLimits,
}

#[derive(Default)]
struct Inputs {
    /// The resources' specs, from the reflector's store once it has listed (`None` before).
    hooks: Option<BTreeMap<String, Resource>>,
    /// The node's labels and UID, once its Node is seen.
    node: Option<(BTreeMap<String, String>, String)>,
    /// Why its Node is not seen (missing, deleted, unreadable), once the watch knows.
    node_wait: Option<String>,
    /// Resources that still carry this node's entry in `status.nodes`, written by an agent of an earlier
    /// version: removed by this one.
    legacy: BTreeSet<String>,
}

impl Inputs {
    /// Why the agent waits for its Node, as `plexus status` shows it: only while there are NetworkHooks the node
    /// cannot decide on.
    fn shown_wait(&self) -> Option<String> {
        let hooks_exist = self.hooks.as_ref().is_some_and(|h| !h.is_empty());
        self.node_wait.clone().filter(|_| hooks_exist)
    }
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

/// A module that could not be made ready, tried again with backoff.
struct Retrying {
    retry: Retry,
    error: Failure,
}

/// When something is tried again, and the backoff that says so.
struct Retry {
    backoff: plexus_cluster::backoff::Backoff,
    next: Instant,
}

impl Retry {
    /// After a failure: due in about [`FIRST_RETRY`] after a first one, the delay doubling with each one after
    /// `previous`, up to [`MAX_RETRY`].
    fn after(previous: Option<Retry>) -> Retry {
        let mut backoff = previous.map_or_else(
            || plexus_cluster::backoff::Backoff::jittered(FIRST_RETRY, MAX_RETRY),
            |r| r.backoff,
        );
        let next = Instant::now() + backoff.next_delay();
        Retry { backoff, next }
    }
}

/// The agent's state between reconciliations.
struct Agent {
    settings: AgentSettings,
    effects: Arc<dyn AgentEffects>,
    keys: Result<TrustedKeys, String>,
    modules: PathBuf,
    /// The set last published; its `runs` say what each entry runs and who signed it.
    published: HookSet,
    /// Whether a set is on disk: until one is, the node's ADDs are refused, so the first reconciliation
    /// publishes even an empty set.
    on_disk: bool,
    /// Failed modules by reference (a signature lives in a repository: the same digest elsewhere is another
    /// module as far as trust goes).
    failures: HashMap<String, Retrying>,
    /// What was last reported of each hook (for the Warning events of a newly failing one).
    reported: HashMap<String, HookReport>,
    /// The node's object as last applied.
    applied: Option<Value>,
    /// The node's object as last refused by the API server as invalid: not sent again until it changes.
    refused: Option<Value>,
    /// A report that did not get through for a transient reason: sent again with its own backoff (1 s doubling
    /// to 5 min, jittered), not only at the next change or resync.
    report_retry: Option<Retry>,
    /// Component digests no longer in the set, since when.
    retired: HashMap<String, Instant>,
    /// Probe verdicts by the entry probed (component, kind, settings, limits): a module is probed once per
    /// version of its spec.
    probes: HashMap<String, Result<(), Failure>>,
    probes_used: std::collections::HashSet<String>,
    /// The artifacts this run compiled, by component sha256.
    compiled: HashMap<String, PathBuf>,
    /// What the keys were when last read (their IDs, or the error), to notice a change.
    keys_seen: String,
}

/// The NetworkHook resource's API description.
pub fn api_resource() -> ApiResource {
    crate::node_report::plexus_resource(KIND, PLURAL)
}

/// Runs the agent until the future is dropped.
pub async fn run(api: KubeApi, settings: AgentSettings) {
    let client = api.client().clone();
    let inputs = Arc::new(Mutex::new(Inputs::default()));
    let controller = Controller::<()>::new(controller::Settings {
        concurrency: 1,
        retry_first: FIRST_RETRY,
        retry_max: MAX_RETRY,
        resync: Some(MAX_RETRY),
    });
    let hooks_api = Api::<DynamicObject>::all_with(client.clone(), &api_resource());
    let server: Arc<str> = api.server().into();
    let hook_watch = watch_hooks(&hooks_api, (&settings, &server), &inputs, &controller);
    let node_watch = watch_node(&client, (&settings, &server), &inputs, &controller);
    let waiting = settings.states.waiting.clone();
    let effects = Arc::new(KubeEffects::new(api, &settings));
    let agent = Arc::new(tokio::sync::Mutex::new(Agent::new(settings, effects)));
    // One key, the node's hook set: reconciled on a change of the resources or labels, of the keys, when a retry
    // is due, and every MAX_RETRY at least.
    let reconcile = {
        let (agent, inputs) = (agent.clone(), inputs.clone());
        move |()| {
            let (agent, inputs, waiting) = (agent.clone(), inputs.clone(), waiting.clone());
            async move {
                let (snapshot, legacy) = {
                    let i = inputs.lock().expect("inputs");
                    *waiting.lock().unwrap_or_else(|e| e.into_inner()) = i.shown_wait();
                    (i.hooks.clone().zip(i.node.clone()), i.legacy.clone())
                };
                let Some((hooks, (labels, uid))) = snapshot else {
                    return controller::Outcome::Settled;
                };
                let mut agent = agent.lock().await;
                agent.remove_legacy_entries(&legacy).await;
                match agent.reconcile(&hooks, &labels, &uid).await {
                    Some(at) => controller::Outcome::RequeueAfter(
                        at.saturating_duration_since(Instant::now()),
                    ),
                    None => controller::Outcome::Settled,
                }
            }
        }
    };
    let keys = {
        let controller = controller.clone();
        async move {
            loop {
                tokio::time::sleep(KEY_POLL).await;
                if agent.lock().await.reload_keys() {
                    controller.schedule(());
                }
            }
        }
    };
    controller.schedule(());
    tokio::join!(hook_watch, node_watch, controller.run(reconcile), keys);
}

/// Watches the NetworkHook resources; schedules the hook set when their specs change (after the first list).
fn watch_hooks(
    hooks_api: &Api<DynamicObject>,
    (settings, server): (&AgentSettings, &Arc<str>),
    inputs: &Arc<Mutex<Inputs>>,
    controller: &Controller<()>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    // kube-runtime's reflector keeps the resources (each list fills a buffer that replaces the store when
    // complete); what the agent reads of them is their specs.
    let writer = reflector::store::Writer::<DynamicObject>::new(api_resource());
    let store = writer.as_reader();
    let (inputs, changed) = (inputs.clone(), controller.clone());
    let (node, server) = (settings.node.clone(), server.clone());
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
                    let state = store.state();
                    if listed && update_hooks(&mut inputs.lock().expect("inputs"), &state, &node) {
                        changed.schedule(());
                    }
                }
                Err(e) => {
                    let error = plexus_cluster::explain_watch(&server, &e);
                    tracing::warn!(watch = PLURAL, %error, "watch failed; retrying");
                    // A cluster that does not serve NetworkHooks asks for none: the node's set is empty, and
                    // published, so that its ADDs do not wait for a set nobody can ask for.
                    if !listed && not_served(&e) {
                        let mut i = inputs.lock().expect("inputs");
                        if i.hooks.is_none() && update_hooks(&mut i, &[], &node) {
                            changed.schedule(());
                        }
                    }
                }
            }
        }
    }
}

/// Whether a watch failed because the API server does not serve the resource (404: its CRD is not installed).
fn not_served(e: &watcher::Error) -> bool {
    matches!(
        e,
        watcher::Error::InitialListFailed(kube::Error::Api(s)) if s.code == 404
    )
}

/// Watches the node's own Node object; schedules the hook set when its labels change.
fn watch_node(
    client: &kube::Client,
    (settings, server): (&AgentSettings, &Arc<str>),
    inputs: &Arc<Mutex<Inputs>>,
    controller: &Controller<()>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (inputs, changed, server) = (inputs.clone(), controller.clone(), server.clone());
    let config = watcher::Config::default()
        .fields(&format!("metadata.name={}", settings.node))
        .timeout(settings.watch_timeout_secs);
    let stream = watcher::watcher(Api::<Node>::all(client.clone()), config).default_backoff();
    let waiting = NodeWait {
        node: settings.node.clone(),
        inputs: inputs.clone(),
        changed: controller.clone(),
    };
    async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            match item {
                Ok(Event::Apply(n) | Event::InitApply(n)) => {
                    waiting.set(None);
                    // kubelet updates its Node often; only a change of labels (or a new Node) matters here.
                    let uid = n.metadata.uid.unwrap_or_default();
                    let seen = Some((n.metadata.labels.unwrap_or_default(), uid));
                    let mut i = inputs.lock().expect("inputs");
                    if i.node != seen {
                        i.node = seen;
                        changed.schedule(());
                    }
                }
                Ok(Event::InitDone) if inputs.lock().expect("inputs").node.is_none() => {
                    waiting.set(Some(waiting.missing()));
                }
                Ok(Event::Delete(_)) => {
                    inputs.lock().expect("inputs").node = None;
                    waiting.set(Some(waiting.missing()));
                }
                Ok(_) => {}
                Err(e) => {
                    let error = plexus_cluster::explain_watch(&server, &e);
                    tracing::warn!(watch = "node", %error, "watch failed; retrying");
                    if inputs.lock().expect("inputs").node.is_none() {
                        waiting.set(Some(format!(
                            "cannot read its Node {}: {error}",
                            waiting.node
                        )));
                    }
                }
            }
        }
    }
}

/// Why the agent waits for its Node: logged once per change, and kept for `plexus status` (published by the
/// reconcile while NetworkHooks exist).
struct NodeWait {
    node: String,
    inputs: Arc<Mutex<Inputs>>,
    changed: Controller<()>,
}

impl NodeWait {
    fn missing(&self) -> String {
        format!(
            "there is no Node named {0}: NetworkHooks are selected by its labels, so none is set up on this node \
             until it exists (is {0}, from --node-name or NODE_NAME, the Node's name?)",
            self.node
        )
    }

    /// Records why it waits (`None`: it does not); logs and schedules the hook set only when that changed, and
    /// says whether it did.
    fn set(&self, why: Option<String>) -> bool {
        let mut inputs = self.inputs.lock().expect("inputs");
        if inputs.node_wait == why {
            return false;
        }
        match &why {
            Some(why) => tracing::warn!(node = %self.node, "the hook agent waits: {why}"),
            None if inputs.node_wait.is_some() => {
                tracing::info!(node = %self.node, "the hook agent sees its Node");
            }
            None => {}
        }
        inputs.node_wait = why;
        drop(inputs);
        self.changed.schedule(());
        true
    }
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

/// Whether the resource's `status.nodes` has an entry of `node` (what agents before per-node objects wrote).
fn has_legacy_entry(obj: &DynamicObject, node: &str) -> bool {
    obj.data["status"]["nodes"]
        .as_array()
        .is_some_and(|nodes| nodes.iter().any(|n| n["node"] == node))
}

/// Takes the resources' specs from the store's objects; true when they changed (a new generation or spec, a
/// resource added or gone, or the first list).
fn update_hooks(inputs: &mut Inputs, objects: &[Arc<DynamicObject>], node: &str) -> bool {
    inputs.legacy = objects
        .iter()
        .filter(|obj| has_legacy_entry(obj, node))
        .filter_map(|obj| obj.metadata.name.clone())
        .collect();
    let hooks: BTreeMap<String, Resource> =
        objects.iter().filter_map(|obj| resource_of(obj)).collect();
    if inputs.hooks.as_ref() == Some(&hooks) {
        return false;
    }
    inputs.hooks = Some(hooks);
    true
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
    fn new(settings: AgentSettings, effects: Arc<dyn AgentEffects>) -> Agent {
        let keys = TrustedKeys::load(&settings.key_files).map_err(|e| e.to_string());
        if let Err(e) = &keys {
            tracing::error!(error = %e, "hook signature keys unusable: every hook is refused until fixed");
        }
        let keys_seen = keys_fingerprint(&keys);
        let modules = settings.cache_dir.join(MODULES_DIR);
        // What was published before a restart stays active until this run publishes.
        let (mut published, on_disk) = match HookSet::read(&settings.cache_dir) {
            Ok(s) => (s.clone().unwrap_or_default(), s.is_some()),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring the previous hook set");
                (HookSet::default(), false)
            }
        };
        // A set of an agent that did not record its runs: what the modules' records say of them.
        for h in &published.hooks {
            if h.unready.is_none() && !published.runs.contains_key(&h.name) {
                if let Some(run) = run_of_module_path(&h.module) {
                    published.runs.insert(h.name.clone(), run);
                }
            }
        }
        Agent {
            settings,
            effects,
            keys,
            modules,
            published,
            on_disk,
            failures: HashMap::new(),
            report_retry: None,
            reported: HashMap::new(),
            applied: None,
            refused: None,
            retired: HashMap::new(),
            probes: HashMap::new(),
            probes_used: Default::default(),
            compiled: HashMap::new(),
            keys_seen,
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
    ) -> Result<(), Failure> {
        let mut entry = hook_spec(name, spec, &self.modules, sha);
        // A fault must show, and the synthetic pod is in no namespace the hook names.
        entry.failure_policy = FailurePolicy::Fail;
        entry.namespaces = None;
        let key = serde_json::to_string(&entry).expect("a hook entry serializes");
        self.probes_used.insert(key.clone());
        if let Some(verdict) = self.probes.get(&key) {
            return verdict.clone();
        }
        let verdict = self.effects.probe(&entry).await;
        match &verdict {
            Ok(()) => tracing::info!(hook = name, sha256 = sha, "module passed its probe"),
            Err(f) => {
                tracing::warn!(hook = name, sha256 = sha, reason = %f.reason, "{}", f.message)
            }
        }
        self.probes.insert(key, verdict.clone());
        verdict
    }

    /// Brings the published set in line with the resources; answers when a failed module is due for a retry.
    /// The effects (pulls, probes, the trust of what ran before) are gathered first; [`plan`] decides.
    async fn reconcile(
        &mut self,
        hooks: &BTreeMap<String, Resource>,
        labels: &BTreeMap<String, String>,
        node_uid: &str,
    ) -> Option<Instant> {
        self.probes_used.clear();
        let mut ready = HashMap::new();
        let mut next_attempt = HashMap::new();
        let wanted = select(hooks, labels);
        for (&name, wanted) in &wanted {
            let Wanted::Selected(spec) = wanted else {
                continue;
            };
            // A hook that may take more memory than its probe process has is refused before anything is pulled:
            // it would fail there, or pass a probe that never reached its limit and exceed the node's later.
            let made = async {
                self.settings
                    .limits
                    .admits(spec.memory_limit_mib)
                    .map_err(|why| Failure::new(Reason::InvalidSpec, why))?;
                let (digest, sha, verified_by) = self.ready(&spec.module).await?;
                self.probe(name, spec, &sha).await?;
                Ok(Ready {
                    digest,
                    verified_by,
                    entry: hook_spec(name, spec, &self.modules, &sha),
                })
            }
            .await;
            if let (Err(_), Some(f)) = (&made, self.failures.get(&spec.module)) {
                next_attempt.insert(name.to_string(), wall_clock(f.retry.next));
            }
            ready.insert(name.to_string(), made);
        }
        // A module no selected hook names any more is not tried again (nor does it keep the agent requeueing).
        self.failures.retain(|module, _| {
            let named = |w: &Wanted| matches!(w, Wanted::Selected(s) if s.module == *module);
            wanted.values().any(named)
        });
        let last_good = self.last_good();
        let planned = plan(&PlanInput {
            hooks,
            wanted: &wanted,
            ready: &ready,
            last_good: &last_good,
            next_attempt: &next_attempt,
        });
        self.publish(planned.entries, &planned.reports);
        let used = std::mem::take(&mut self.probes_used);
        self.probes.retain(|k, _| used.contains(k));
        self.collect_garbage();
        self.report(planned.reports, node_uid).await;
        let report_due = self.report_retry.as_ref().map(|r| r.next);
        let module_due = self.failures.values().map(|f| f.retry.next);
        module_due.chain(report_due).min()
    }

    /// What each published hook runs, and whether it may still run: signatures are off, or the key its signature
    /// verified with is still trusted. Neither the registry nor the pulled component has a say.
    fn last_good(&self) -> HashMap<String, LastGood> {
        self.published
            .hooks
            .iter()
            .filter(|entry| entry.unready.is_none())
            .map(|entry| {
                let run = self.published.runs.get(&entry.name);
                let verified_by = run.and_then(|r| r.verified_by.clone());
                let trusted = match (self.settings.signatures, &self.keys, &verified_by) {
                    (SignaturePolicy::Off, _, _) => true,
                    (SignaturePolicy::Required, Ok(keys), Some(by)) => keys.ids().contains(by),
                    // Published without its signer: the module's record says who signed it.
                    (SignaturePolicy::Required, Ok(_), None) => entry
                        .sha256
                        .as_deref()
                        .is_some_and(|sha| self.still_trusted(sha)),
                    (SignaturePolicy::Required, Err(_), _) => false,
                };
                let digest = run.map(|r| r.digest.clone()).unwrap_or_else(|| {
                    format!("sha256:{}", entry.sha256.as_deref().unwrap_or_default())
                });
                let last = LastGood {
                    entry: entry.clone(),
                    digest,
                    order: run.and_then(|r| r.order),
                    verified_by,
                    trusted,
                };
                (entry.name.clone(), last)
            })
            .collect()
    }

    /// Publishes the planned set when it differs from the one published (one rename; the previous set stays
    /// when that fails). A hook that leaves the hooks that run is logged at warning level with its reason.
    fn publish(&mut self, entries: Vec<Entry>, reports: &BTreeMap<String, Option<HookReport>>) {
        let specs: Vec<HookSpec> = entries.iter().map(|e| e.spec.clone()).collect();
        let runs: BTreeMap<String, PublishedRun> = entries
            .iter()
            .filter(|e| e.spec.unready.is_none())
            .map(|e| {
                let run = PublishedRun {
                    digest: e.digest.clone(),
                    order: Some(e.order),
                    verified_by: e.verified_by.clone(),
                };
                (e.name.clone(), run)
            })
            .collect();
        if self.on_disk && specs == self.published.hooks && runs == self.published.runs {
            return;
        }
        let set = HookSet {
            generation: self.published.generation + 1,
            hooks: specs,
            runs,
        };
        match set.publish(&self.settings.cache_dir) {
            Ok(()) => {
                let unready = set.hooks.iter().filter(|h| h.unready.is_some()).count();
                tracing::info!(
                    generation = set.generation,
                    hooks = set.hooks.len() - unready,
                    unready,
                    "hook set published"
                );
                log_departures(&self.published, &set, reports);
                self.published = set;
                self.on_disk = true;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot publish the hook set; the previous one stays")
            }
        }
    }

    /// The module of a pinned reference, pulled, verified and compiled if not already: its manifest digest and
    /// component sha256, or (reason, message).
    async fn ready(&mut self, module: &str) -> Result<(String, String, Option<String>), Failure> {
        let reference = distribution::pinned_reference(module)
            .map_err(|e| Failure::new(e.reason(), e.to_string()))?;
        let digest = reference.digest().unwrap_or_default().to_string();
        let required = self.settings.signatures == SignaturePolicy::Required;
        let keys = match (&self.keys, required) {
            (Err(e), true) => return Err(Failure::new(Reason::NoTrustedKeys, e.clone())),
            (Ok(k), true) => Some(k.clone()),
            (_, false) => None,
        };
        // Made ready before (this run or an earlier one), under the current signature policy and keys.
        if let Some(rec) = self.record(module) {
            let path = self.module_path(&rec.sha256);
            if self.trusts(&rec) && path.exists() {
                // Compiled by this run and its artifact still there; else compiled again (an earlier run's artifact
                // is found in the cache, so that costs a process and no compile).
                let known = self.compiled.get(&rec.sha256).is_some_and(|a| a.exists());
                let compiled = match known {
                    true => Ok(rec.sha256.clone()),
                    false => self.compile(&path).await,
                };
                if compiled.as_deref() == Ok(rec.sha256.as_str()) {
                    self.failures.remove(module);
                    return Ok((digest, rec.sha256, rec.verified_by));
                }
            }
        }
        if let Some(f) = self.failures.get(module) {
            if Instant::now() < f.retry.next {
                return Err(f.error.clone());
            }
        }
        match self.fetch(&reference, &digest, keys.as_ref()).await {
            Ok((sha, verified_by)) => {
                self.failures.remove(module);
                Ok((digest, sha, verified_by))
            }
            Err(error) => {
                tracing::warn!(module, reason = %error.reason, "{}; retrying with backoff", error.message);
                let retry = Retry::after(self.failures.remove(module).map(|f| f.retry));
                let failed = Retrying {
                    retry,
                    error: error.clone(),
                };
                self.failures.insert(module.to_string(), failed);
                Err(error)
            }
        }
    }

    /// Compiles a module into the node's cache in a process of its own (see [`super::compile`]): its sha256.
    async fn compile(&mut self, module: &Path) -> Result<String, String> {
        let compiled = self.effects.compile(module).await?;
        self.compiled
            .insert(compiled.sha256.clone(), compiled.artifact);
        Ok(compiled.sha256)
    }

    async fn fetch(
        &mut self,
        reference: &oci_client::Reference,
        digest: &str,
        keys: Option<&TrustedKeys>,
    ) -> Result<(String, Option<String>), Failure> {
        // Nothing of it is used before its signature verifies.
        let pulled = self.effects.pull(reference, keys).await?;
        let verified_by = pulled.verified_by.clone();
        let path = self.module_path(&pulled.sha256);
        let io = |e: std::io::Error| {
            Failure::new(Reason::PullFailed, format!("{}: {e}", path.display()))
        };
        super::files::private_dir(&self.modules, 0o700).map_err(io)?;
        plexus_cni::conf::replace_file(&path, &pulled.wasm, 0o600).map_err(io)?;
        let compiled = self
            .compile(&path)
            .await
            .map_err(|e| Failure::new(Reason::CompileFailed, format!("{}: {e}", path.display())))?;
        if compiled != pulled.sha256 {
            return Err(Failure::new(
                Reason::DigestMismatch,
                format!(
                    "{} changed while compiling: expected sha256:{}, got sha256:{}",
                    path.display(),
                    pulled.sha256,
                    compiled
                ),
            ));
        }
        let rec = Record {
            digest: digest.to_string(),
            sha256: pulled.sha256.clone(),
            verified_by: verified_by.clone(),
        };
        let rec_path = self.record_path(&reference.whole());
        plexus_cni::conf::replace_file(&rec_path, &serde_json::to_vec(&rec).expect("json"), 0o600)
            .map_err(|e| {
                Failure::new(Reason::PullFailed, format!("{}: {e}", rec_path.display()))
            })?;
        tracing::info!(module = %reference.whole(), sha256 = %pulled.sha256, "module pulled, verified and compiled");
        Ok((pulled.sha256, verified_by))
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

    /// A Warning event on the NetworkHook, best effort.
    async fn warn(&self, hook: &str, s: &HookReport) {
        if let Err(e) = self.effects.warn(hook, &s.reason, &s.message).await {
            tracing::warn!(hook, error = %e, "cannot post the hook's event");
        }
    }

    /// Applies the node's own object (`NodeHookStatus` named after the node, owned by its Node) when what it
    /// says changed, and posts a Warning event on each hook that newly fails.
    async fn report(&mut self, reports: BTreeMap<String, Option<HookReport>>, node_uid: &str) {
        // What the node knows, whether or not the API server takes it.
        *self
            .settings
            .states
            .hooks
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
        for (name, status) in &reports {
            let Some(s) = status else { continue };
            let newly_failing = s.reason != "Active"
                && self.reported.get(name).is_none_or(|r| r.reason != s.reason);
            if newly_failing {
                self.warn(name, s).await;
            }
        }
        self.reported = reports
            .iter()
            .filter_map(|(name, s)| Some((name.clone(), s.clone()?)))
            .collect();
        let report = NodeReport::of(&reports);
        if report.omitted > 0 {
            tracing::warn!(
                omitted = report.omitted,
                "the node's hook report lists {} hooks at most; failing ones first",
                node_report::MAX_HOOKS
            );
        }
        let object = report.object(&self.settings.node, node_uid);
        if self.applied.as_ref() == Some(&object) || self.refused.as_ref() == Some(&object) {
            // Nothing the API server has not had its answer on: nothing to try again.
            self.report_retry = None;
            return;
        }
        match self.effects.apply_report(&object).await {
            Ok(()) => {
                self.applied = Some(object);
                self.refused = None;
                self.report_retry = None;
            }
            // Refused for what it says (invalid, forbidden): sending it again changes nothing. Logged once, the
            // answer counted in the API request metrics by its code; sent again when the report changes.
            Err(error) if refusal(&error) => {
                tracing::error!(%error, "the API server refused the node's hook report; not sent again until it changes");
                self.refused = Some(object);
                self.report_retry = None;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot report the node's hooks; retrying with backoff");
                self.report_retry = Some(Retry::after(self.report_retry.take()));
            }
        }
    }

    /// Removes this node's entry from the `status.nodes` of each of `hooks`, where an agent of an earlier version
    /// wrote it. Tried again at the next reconcile until the watch no longer shows it.
    async fn remove_legacy_entries(&self, hooks: &BTreeSet<String>) {
        for name in hooks {
            match self.effects.remove_legacy_entry(name).await {
                Ok(()) => {
                    tracing::info!(hook = %name, "removed this node's entry of an earlier version from the hook's status")
                }
                Err(error) => {
                    tracing::warn!(hook = %name, %error, "cannot remove this node's old status entry")
                }
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
pub fn probe_entry(entry: &HookSpec, cache_dir: &Path) -> Result<(), Failure> {
    use plexus_hooks::{HookError, Hooks, LoadError};
    let hooks = match Hooks::load(std::slice::from_ref(entry), cache_dir) {
        Ok(h) => h,
        Err(HookError::Load {
            error: LoadError::MissingExport { .. } | LoadError::KindNotImplemented { .. },
            ..
        }) => return Err(export_mismatch(entry)),
        Err(HookError::Load {
            error: LoadError::Link { reason, .. },
            ..
        }) => {
            let host = plexus_hooks::WIT_VERSION;
            let why =
                format!("the module imports what this node (plexus:hooks@{host}) lacks: {reason}");
            return Err(Failure::new(Reason::Incompatible, why));
        }
        Err(e) => return Err(Failure::new(Reason::FailedProbe, e.to_string())),
    };
    let pod = plexus_core::spec::Pod {
        namespace: "plexus-probe".into(),
        name: "probe".into(),
        uid: Some("00000000-0000-0000-0000-000000000000".into()),
        labels: [("app".to_string(), "probe".to_string())].into(),
        annotations: Default::default(),
        ..Default::default()
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
        Failure::new(
            Reason::FailedProbe,
            format!(
                "one call of its {} export on a synthetic pod failed: {e}",
                entry.kind
            ),
        )
    })
}

/// Why a module lacks the export its kind needs: it serves another kind, or another version of the contract.
fn export_mismatch(entry: &HookSpec) -> Failure {
    let wanted = entry.kind.interface();
    match plexus_hooks::inspect(&entry.module) {
        Ok(i) if !i.kinds.is_empty() => Failure::new(
            Reason::KindMismatch,
            format!(
                "spec.kind is {} but the module {} {} only, not {wanted}",
                entry.kind,
                if i.declares_kinds {
                    "declares that it implements"
                } else {
                    "exports"
                },
                plexus_hooks::declared::names(&i.kinds)
            ),
        ),
        Ok(i) if !i.wit_versions.is_empty() => Failure::new(
            Reason::Incompatible,
            format!(
                "the module is built against plexus:hooks@{}; this node implements {}",
                i.wit_versions.join(", "),
                plexus_hooks::WIT_VERSION
            ),
        ),
        Ok(i) => Failure::new(
            Reason::KindMismatch,
            format!(
                "the module exports no plexus:hooks interface, not {wanted} (exports: {})",
                i.exports.join(", ")
            ),
        ),
        Err(e) => Failure::new(Reason::FailedProbe, e.to_string()),
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
        unready: None,
    }
}

/// An answer that says the request itself is wrong (invalid, forbidden, too large), not that the server is busy
/// or away, nor that the node's credentials are being replaced: a retry of the same request gets the same answer.
fn refusal(error: &ClusterError) -> bool {
    !error.is_transient() && !matches!(error, ClusterError::CredentialsRefused { .. })
}

/// The manifest digest a published entry came from is not in the entry; it is in its module's record.
fn run_of_module_path(module: &Path) -> Option<PublishedRun> {
    let sha = module.file_stem()?.to_str()?;
    records(module.parent()?)
        .find(|r| r.sha256 == sha)
        .map(|r| PublishedRun {
            digest: r.digest,
            order: None,
            verified_by: r.verified_by,
        })
}

/// Logs, at warning level with the reason, each hook that ran under `old` and does not under `new` (gone from
/// the set, or there as unready).
fn log_departures(old: &HookSet, new: &HookSet, reports: &BTreeMap<String, Option<HookReport>>) {
    let runs = |set: &HookSet| -> BTreeSet<String> {
        set.hooks
            .iter()
            .filter(|h| h.unready.is_none())
            .map(|h| h.name.clone())
            .collect()
    };
    let now = runs(new);
    for name in runs(old).difference(&now) {
        match reports.get(name) {
            Some(Some(r)) => tracing::warn!(
                hook = %name,
                reason = %r.reason,
                "a hook left this node's running set: {}",
                r.message
            ),
            Some(None) => tracing::warn!(
                hook = %name,
                reason = "NotSelected",
                "a hook left this node's running set: its nodeSelector no longer selects the node"
            ),
            None => tracing::warn!(
                hook = %name,
                reason = "Deleted",
                "a hook left this node's running set: its NetworkHook was deleted"
            ),
        }
    }
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
mod fake;
#[cfg(test)]
mod reconcile_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

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

    /// The wait for the Node is recorded (and logged) once per change, and `plexus status` shows it only while
    /// there are NetworkHooks to decide on.
    #[test]
    fn the_wait_for_the_node_is_kept_once_per_change_and_shown_while_hooks_exist() {
        let inputs = Arc::new(Mutex::new(Inputs::default()));
        let wait = NodeWait {
            node: "n1".into(),
            inputs: inputs.clone(),
            changed: Controller::new(controller::Settings {
                concurrency: 1,
                retry_first: FIRST_RETRY,
                retry_max: MAX_RETRY,
                resync: None,
            }),
        };
        assert!(wait.set(Some(wait.missing())));
        assert!(!wait.set(Some(wait.missing())), "the same reason again");
        let shown = || inputs.lock().unwrap().shown_wait();
        assert_eq!(shown(), None, "before the hooks are listed");
        inputs.lock().unwrap().hooks = Some(BTreeMap::new());
        assert_eq!(shown(), None, "no NetworkHook");
        inputs.lock().unwrap().hooks = Some(
            [(
                "h".to_string(),
                Resource {
                    spec: Err("x".into()),
                    generation: 1,
                },
            )]
            .into(),
        );
        assert!(shown().unwrap().contains("there is no Node named n1"));
        assert!(wait.set(Some("cannot read its Node n1: 403".into())));
        assert_eq!(shown().as_deref(), Some("cannot read its Node n1: 403"));
        assert!(wait.set(None));
        assert!(!wait.set(None));
        assert_eq!(shown(), None);
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
        assert!(update_hooks(&mut i, &[], "n"));
        assert!(update_hooks(&mut i, &[obj("a")], "n"));
        let hooks = i.hooks.clone().unwrap();
        assert_eq!(hooks["a"].generation, 2);
        assert_eq!(hooks["a"].spec.as_ref().unwrap().kind, HookKind::Status);
        // A status write of some node: same generation and spec, nothing to do.
        let mut with_status = (*obj("a")).clone();
        with_status.data["status"] = json!({"nodes": [{"node": "n"}]});
        assert!(!update_hooks(
            &mut i,
            &[Arc::new(with_status.clone())],
            "other"
        ));
        assert!(i.legacy.is_empty());
        // This node's entry, written by an agent before per-node objects: to be removed.
        assert!(!update_hooks(&mut i, &[Arc::new(with_status)], "n"));
        assert_eq!(i.legacy, BTreeSet::from(["a".to_string()]));
        let mut bad = (*obj("b")).clone();
        bad.data["spec"]["surprise"] = json!(1);
        assert!(update_hooks(&mut i, &[obj("a"), Arc::new(bad)], "n"));
        assert!(i.legacy.is_empty());
        let hooks = i.hooks.clone().unwrap();
        assert!(hooks["b"].spec.as_ref().unwrap_err().contains("surprise"));
        assert!(update_hooks(&mut i, &[], "n"));
        assert_eq!(i.hooks, Some(BTreeMap::new()));
    }
}
