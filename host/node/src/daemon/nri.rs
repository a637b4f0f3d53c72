//! NRI mode (`plexus daemon --nri`): the daemon registers with the container runtime's NRI socket as an external
//! plugin and attaches each pod's networks itself, after the runtime's own CNI has set up the cluster network.
//! The node's CNI configuration stays the cluster network's alone.
//!
//! At `RunPodSandbox` the daemon runs the same ADD as the CNI path (`plexus_cni::orchestrate::add`: planner,
//! hooks, per-container lock, attachment cache, status), with the cluster network recorded as the runtime's
//! ([`ClusterBy::Runtime`]: its result read from the sandbox's eth0) and never run or torn down by Plexus in this
//! mode. An ADD that fails fails the sandbox: the runtime reports the error, removes the sandbox, and kubelet
//! tries again. At `StopPodSandbox` and `RemovePodSandbox` it runs DEL; one that fails does not hold the runtime
//! up (the stop succeeds) and is tried again until it succeeds. When a session starts, the pods the runtime reports are
//! reconciled with the attachment cache: pods without a plan are attached, plans without a pod are deleted. At
//! `CreateContainer`, a sandbox without a finished plan is attached before its container is made: one whose
//! `RunPodSandbox` no session heard (made while the daemon was registering again) or whose attachment at the
//! session's start failed. An ADD that fails there fails the container, so no container of a pod runs without its
//! networks once the daemon is registered.
//! The daemon registers once its caches have listed; when the runtime closes the connection (a restart), it
//! connects again, backing off up to 30 s. A daemon in CNI mode deletes what NRI mode left on a node moved back
//! ([`sweep_after_nri_mode`]).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use plexus_cni::cache::{AttachmentCache, AttachmentPlan};
use plexus_cni::effects::Effects;
use plexus_cni::invocation::{ClusterBy, Invocation};
use plexus_nri::{Ended, Event, PodSandbox, Registration, Runtime};
use serde_json::Value;

use super::dynamic::LocalEffects;
use super::state::NodeState;

/// The NRI socket containerd and CRI-O listen on unless configured otherwise.
pub const DEFAULT_SOCKET: &str = "/var/run/nri/nri.sock";
/// The plugin's name and place among the runtime's plugins.
const NAME: &str = "plexus";
const INDEX: &str = "50";
/// The most bytes of the plexus configuration file read.
const CONF_CAP: u64 = 1 << 20;
/// Where containerd and CRI-O pin the sandboxes' network namespaces.
const NETNS_DIR: &str = "/var/run/netns";
/// The interface the runtime's CNI gave the cluster network (kubelet's, always).
const CLUSTER_IFNAME: &str = "eth0";
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A failed DEL is tried again after this, then after twice as long each time, up to [`MAX_DEL_BACKOFF`].
const DEL_RETRY: Duration = Duration::from_secs(1);
const MAX_DEL_BACKOFF: Duration = Duration::from_secs(60);
/// Sandboxes whose DEL is retried at most (a node runs a few hundred pods); past that the oldest is dropped, and
/// a new session's reconciliation finds its plan.
const MAX_RETRIED: usize = 4096;
/// How often the plans are checked for sandboxes whose network namespace is gone.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// NRI mode's settings.
#[derive(Debug, Clone)]
pub struct NriSettings {
    /// The runtime's NRI socket.
    pub socket: PathBuf,
    /// The plexus configuration the attachments are made with (JSON: one plugin's conf, as in a conflist).
    pub conf: PathBuf,
    /// Where the delegate plugins are (`CNI_PATH`).
    pub cni_path: String,
}

/// The plexus configuration of `path`, checked as an ADD would read it; `clusterHooks` is true unless it says
/// otherwise.
pub fn read_conf(path: &Path) -> Result<Value, String> {
    let what = || format!("the NRI mode's plexus configuration {}", path.display());
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(CONF_CAP + 1).read_to_string(&mut text))
        .map_err(|e| format!("{}: {e}", what()))?;
    if text.len() as u64 > CONF_CAP {
        return Err(format!("{}: over {CONF_CAP} bytes", what()));
    }
    let mut conf: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", what()))?;
    // The daemon reads the cluster from the API, whatever the conf's `cluster` says: the node's hook set (its
    // agent's) applies unless the conf turns it off.
    if let Some(fields) = conf.as_object_mut() {
        fields.entry("clusterHooks").or_insert(Value::Bool(true));
    }
    plexus_cni::conf::PlexusConf::from_json(conf.clone(), false)
        .map_err(|e| format!("{}: {e}", what()))?;
    Ok(conf)
}

/// Sessions with the runtime, one after another, for the daemon's life.
pub async fn run(state: Arc<NodeState>, settings: NriSettings, conf: Value) {
    // Checked when the daemon started (read_conf).
    let cache_dir = match plexus_cni::conf::PlexusConf::from_json(conf.clone(), false) {
        Ok(c) => c.cache_dir,
        Err(e) => return tracing::error!("NRI mode: {e}"),
    };
    let plugin = Arc::new(NriPlugin(Arc::new(Inner {
        state,
        settings,
        conf,
        cache_dir,
        handle: tokio::runtime::Handle::current(),
        retry: Mutex::new(Retries::default()),
        attaching: Turns::default(),
    })));
    tokio::spawn(retry_dels(plugin.0.clone()));
    let registration = Registration {
        name: NAME.into(),
        index: INDEX.into(),
        events: vec![
            Event::RunPodSandbox,
            Event::StopPodSandbox,
            Event::RemovePodSandbox,
            Event::CreateContainer,
        ],
    };
    let socket = plugin.0.settings.socket.clone();
    // Registered only once the caches can answer: a sandbox's ADD (and the new session's reconciliation) reads
    // the pod, its NADs and its claims from them.
    while !plugin.0.state.cache.health().settled() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut backoff = Duration::from_secs(1);
    loop {
        let p: Arc<dyn plexus_nri::Plugin> = plugin.clone();
        match plexus_nri::run(&socket, &registration, p).await {
            Ok(Ended::Closed) => {
                tracing::info!(socket = %socket.display(), "the runtime closed the NRI connection; connecting again");
                backoff = Duration::from_secs(1);
            }
            Ok(Ended::Shutdown) => {
                tracing::info!(socket = %socket.display(), "the runtime asked the NRI plugin to stop; connecting again");
                backoff = Duration::from_secs(1);
            }
            Err(e) => tracing::warn!(socket = %socket.display(), retry_in = ?backoff, "NRI: {e}"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

struct Inner {
    state: Arc<NodeState>,
    settings: NriSettings,
    conf: Value,
    /// The conf's `cacheDir`: where the attachment cache is.
    cache_dir: PathBuf,
    handle: tokio::runtime::Handle,
    /// Sandboxes whose DEL failed.
    retry: Mutex<Retries>,
    /// Sandboxes being attached by [`Inner::attach_unplanned`].
    attaching: Turns,
}

/// What the attachment cache holds for a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Planned {
    No,
    /// A plan with an attachment of Plexus's without a result: its ADD did not finish.
    Unfinished,
    Finished,
}

/// Turns by key, one holder at a time: the sandboxes being attached by [`Inner::attach_unplanned`], and the
/// signal that one is done.
#[derive(Default)]
struct Turns {
    busy: Mutex<BTreeSet<String>>,
    done: Condvar,
}

impl Turns {
    /// Waits until no one holds `id`'s turn, then holds it (until the [`Turn`] is dropped). The wait is as long
    /// as the holder's work (an ADD, bounded by its delegates' and the API's timeouts).
    fn take(&self, id: &str) -> Turn<'_> {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        while busy.contains(id) {
            busy = self.done.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        busy.insert(id.to_string());
        Turn {
            turns: self,
            id: id.to_string(),
        }
    }
}

/// A held turn of [`Turns`]; given back when dropped.
struct Turn<'a> {
    turns: &'a Turns,
    id: String,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.turns
            .busy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
        self.turns.done.notify_all();
    }
}

/// Sandboxes whose DEL failed, by id, with when each is tried next: the runtime does not ask again, so the daemon
/// does.
#[derive(Default)]
struct Retries(BTreeMap<String, Retry>);

struct Retry {
    pod: PodSandbox,
    next: Instant,
    backoff: Duration,
}

impl Retries {
    /// `pod`'s DEL failed at `now`: tried again after [`DEL_RETRY`], then twice as long after each failure, up to
    /// [`MAX_DEL_BACKOFF`]. Past [`MAX_RETRIED`] sandboxes, the one due first is dropped. Returns the wait.
    fn failed(&mut self, pod: &PodSandbox, now: Instant) -> Duration {
        let backoff = self
            .0
            .get(&pod.id)
            .map_or(DEL_RETRY, |r| (r.backoff * 2).min(MAX_DEL_BACKOFF));
        if self.0.len() >= MAX_RETRIED && !self.0.contains_key(&pod.id) {
            let first = self
                .0
                .iter()
                .min_by_key(|(_, r)| r.next)
                .map(|(id, _)| id.clone());
            if let Some(id) = first {
                self.0.remove(&id);
            }
        }
        let retry = Retry {
            pod: pod.clone(),
            next: now + backoff,
            backoff,
        };
        self.0.insert(pod.id.clone(), retry);
        backoff
    }

    /// `id`'s DEL succeeded: whether it had failed before.
    fn succeeded(&mut self, id: &str) -> bool {
        self.0.remove(id).is_some()
    }

    /// The sandboxes whose DEL is due at `now`.
    fn due(&self, now: Instant) -> Vec<PodSandbox> {
        self.0
            .values()
            .filter(|r| r.next <= now)
            .map(|r| r.pod.clone())
            .collect()
    }
}

/// Tries each failed DEL again when its time comes, until it succeeds; and every [`SWEEP_EVERY`] deletes the plans
/// of sandboxes gone without an event ([`Inner::sweep`]).
async fn retry_dels(inner: Arc<Inner>) {
    let mut swept = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if swept.elapsed() >= SWEEP_EVERY {
            swept = Instant::now();
            let i = inner.clone();
            let _ = tokio::task::spawn_blocking(move || i.sweep()).await;
        }
        let due = inner.retry.lock().unwrap().due(Instant::now());
        for pod in due {
            let i = inner.clone();
            let _ = tokio::task::spawn_blocking(move || i.del(&pod)).await;
        }
    }
}

/// Whether `netns` is the network namespace the daemon runs in: the host's (the daemon runs on the host's
/// network). A pod with `hostNetwork: true` has no networks of its own to attach or detach, as kubelet runs no
/// CNI for it; containerd names no network namespace for its sandbox, CRI-O names the host's.
fn on_host_network(netns: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (
        std::fs::metadata(netns),
        std::fs::metadata("/proc/self/ns/net"),
    ) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

struct NriPlugin(Arc<Inner>);

#[async_trait::async_trait]
impl plexus_nri::Plugin for NriPlugin {
    async fn configured(&self, runtime: &Runtime) {
        tracing::info!(runtime = %runtime.name, version = %runtime.version, nri = %runtime.nri_version,
            request_timeout = ?runtime.request_timeout, "registered with the runtime's NRI");
    }

    /// Answered at once, the reconciliation going on in the background: it may attach many pods, and the runtime
    /// drops a plugin that does not answer within its request timeout. An event for one of those pods meanwhile
    /// waits for the reconciliation's work on it (the per-container lock).
    async fn synchronize(&self, pods: Vec<PodSandbox>) -> Result<(), String> {
        tracing::debug!(pods = pods.len(), "NRI Synchronize");
        let inner = self.0.clone();
        tokio::task::spawn_blocking(move || inner.reconcile(&pods));
        Ok(())
    }

    /// The runtime failed the sandbox and sends no stop for it: its DEL, retried as any other until it succeeds.
    async fn run_abandoned(&self, pod: PodSandbox) {
        let inner = self.0.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if inner.del(&pod).is_ok() {
                tracing::info!(pod = %pod.label(), container = %pod.id,
                    "deleted the networks of a sandbox attached past the runtime's deadline (it failed the sandbox)");
            }
        })
        .await;
    }

    async fn pod_event(
        &self,
        event: Event,
        pod: PodSandbox,
        _deadline: tokio::time::Instant,
    ) -> Result<(), String> {
        let inner = self.0.clone();
        let name = pod.label();
        tracing::debug!(pod = %name, container = %pod.id, netns = ?pod.network_namespace(), "NRI {event:?}");
        tokio::task::spawn_blocking(move || match event {
            Event::RunPodSandbox => inner.add(&pod),
            Event::CreateContainer => match inner.attach_unplanned(&pod) {
                Ok(attached) => {
                    if attached.is_some() {
                        tracing::info!(pod = %pod.label(), container = %pod.id,
                            "attached a sandbox at its container's creation (no session had attached it)");
                    }
                    Ok(())
                }
                Err((_, e)) => Err(e),
            },
            // A failed DEL is the daemon's to retry ([`retry_dels`]); refusing the stop or removal would only hold
            // the sandbox (CRI-O fails its StopPodSandbox, and kubelet would try again for as long as it fails).
            Event::StopPodSandbox | Event::RemovePodSandbox => {
                let _ = inner.del(&pod);
                Ok(())
            }
        })
        .await
        .map_err(|e| format!("plexus: {event:?} of {name}: {e}"))?
    }
}

impl Inner {
    /// The invocation the runtime would have made for `command` on `pod`'s sandbox.
    fn invocation(
        &self,
        command: &str,
        pod: &PodSandbox,
        netns: Option<&str>,
    ) -> Result<Invocation, String> {
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
            pod.namespace, pod.name, pod.id, pod.uid
        );
        let mut env: BTreeMap<String, String> = delegates_env().collect();
        for (k, v) in [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", &pod.id),
            ("CNI_IFNAME", CLUSTER_IFNAME),
            ("CNI_PATH", &self.settings.cni_path),
            ("CNI_ARGS", &args),
        ] {
            env.insert(k.into(), v.into());
        }
        if let Some(netns) = netns {
            env.insert("CNI_NETNS".into(), netns.into());
        }
        Invocation::from_env(&env, Ok(self.conf.clone()))
            .map_err(|e| format!("plexus: pod {}: {e}", pod.label()))
    }

    /// An ADD or DEL run with the daemon's caches and processes ([`LocalEffects`]).
    fn with_effects<T>(
        &self,
        inv: &Invocation,
        f: impl FnOnce(&Effects<'_>) -> T,
    ) -> Result<T, String> {
        let local = LocalEffects::new(&self.state, self.handle.clone(), &inv.conf)
            .map_err(|e| format!("plexus: {}: {e}", inv.pod_label()))?;
        Ok(f(&local.effects()))
    }

    /// ADD of the pod's networks; nothing for a pod on the host's network ([`on_host_network`]).
    fn add(&self, pod: &PodSandbox) -> Result<(), String> {
        match sandbox_netns(pod).filter(|n| !on_host_network(n)) {
            Some(netns) => self.add_in(pod, &netns),
            None => Ok(()),
        }
    }

    /// ADD of the pod's networks in its sandbox's namespace `netns`.
    fn add_in(&self, pod: &PodSandbox, netns: &str) -> Result<(), String> {
        let mut inv = self.invocation("ADD", pod, Some(netns))?;
        let cluster = plexus_cni::podnet::interface_result(
            netns,
            CLUSTER_IFNAME,
            inv.conf.cni_version.as_str(),
        )
        .map_err(|e| {
            format!(
                "plexus: pod {}: the cluster network's interface: {e}",
                pod.label()
            )
        })?;
        inv.cluster_by = ClusterBy::Runtime(Some(cluster));
        self.with_effects(&inv, |fx| plexus_cni::orchestrate::add(&inv, fx))?
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// DEL of the pod's networks (its cached plan, or what still resolves). One that fails is tried again later
    /// ([`retry_dels`]) until it succeeds.
    fn del(&self, pod: &PodSandbox) -> Result<(), String> {
        if pod.network_namespace().is_some_and(on_host_network) {
            return Ok(());
        }
        let deleted = self
            .invocation("DEL", pod, pod.network_namespace())
            .and_then(|mut inv| {
                inv.cluster_by = ClusterBy::Runtime(None);
                self.with_effects(&inv, |fx| plexus_cni::orchestrate::del(&inv, fx))?
                    .map_err(|e| e.to_string())
            });
        let mut retry = self.retry.lock().unwrap();
        match &deleted {
            Ok(()) if retry.succeeded(&pod.id) => {
                tracing::info!(pod = %pod.label(), container = %pod.id, "DEL succeeded on a retry");
            }
            Ok(()) => {}
            Err(e) => {
                let backoff = retry.failed(pod, Instant::now());
                tracing::warn!(pod = %pod.label(), container = %pod.id,
                    retry_in = ?backoff, "DEL failed: {e}");
            }
        }
        deleted
    }

    /// A new session's pods against the attachment cache: pods with a namespace and no plan are attached, and so
    /// are pods whose plan an ADD left unfinished (the daemon killed during a `RunPodSandbox`: the runtime drops
    /// a plugin that goes away mid-request and starts the sandbox without it; the ADD tears down what the
    /// unfinished one attached first). Plans of sandboxes the runtime no longer has are deleted. Failures are
    /// logged: the session goes on.
    fn reconcile(&self, pods: &[PodSandbox]) {
        let what = |was: Planned| match was {
            Planned::Unfinished => "a pod whose ADD an earlier session left unfinished",
            _ => "a pod the runtime had before this session",
        };
        for pod in pods {
            match self.attach_unplanned(pod) {
                Ok(Some(was)) => tracing::info!(pod = %pod.label(), "attached {}", what(was)),
                // Attached already (or meanwhile, at its container's creation), or nothing to attach.
                Ok(None) => {}
                Err((was, e)) => {
                    tracing::warn!(pod = %pod.label(), "attaching {}: {e}", what(was))
                }
            }
        }
        let Some(cache) = AttachmentCache::open_existing(&self.cache_dir)
            .ok()
            .flatten()
        else {
            return;
        };
        let live: BTreeSet<&str> = pods.iter().map(|p| p.id.as_str()).collect();
        self.del_plans(
            &cache,
            |plan| !live.contains(plan.container_id.as_str()),
            "deleted the networks of a sandbox the runtime no longer has",
        );
    }

    /// What the attachment cache holds for the sandbox `id`.
    fn planned(&self, id: &str) -> Planned {
        let plan = AttachmentCache::open_existing(&self.cache_dir)
            .ok()
            .flatten()
            .and_then(|c| c.load(id).ok().flatten());
        match plan {
            None => Planned::No,
            Some(p)
                if p.attachments
                    .iter()
                    .any(|a| !a.external && a.result.is_none()) =>
            {
                Planned::Unfinished
            }
            Some(_) => Planned::Finished,
        }
    }

    /// ADD of an attachable sandbox ([`attachable`]) without a finished plan: what the cache held for it when the
    /// ADD ran (with the ADD's error), `None` when none ran. One sandbox is attached by one caller at a time (a
    /// session's reconciliation, a container's creation), and a caller that waited finds the plan the other made.
    fn attach_unplanned(&self, pod: &PodSandbox) -> Result<Option<Planned>, (Planned, String)> {
        if self.planned(&pod.id) == Planned::Finished {
            return Ok(None);
        }
        let Some(netns) = attachable(pod) else {
            return Ok(None);
        };
        let _turn = self.attaching.take(&pod.id);
        match self.planned(&pod.id) {
            Planned::Finished => Ok(None),
            was => self
                .add_in(pod, &netns)
                .map(|()| Some(was))
                .map_err(|e| (was, e)),
        }
    }

    /// DEL of each plan made in NRI mode (its cluster network the runtime's) whose sandbox's network namespace is
    /// gone: the runtime stopped the sandbox without telling the plugin. containerd 2.4 forgets across its own
    /// restart which sandboxes it told plugins about, and sends no stop or removal for those.
    fn sweep(&self) {
        let Some(cache) = AttachmentCache::open_existing(&self.cache_dir)
            .ok()
            .flatten()
        else {
            return;
        };
        self.del_plans(
            &cache,
            |plan| made_in_nri_mode(plan) && namespace_gone(plan),
            "deleted the networks of a sandbox whose network namespace is gone (the runtime sent no stop)",
        );
    }

    /// [`del_plans`] with this mode's DEL (retried until it succeeds).
    fn del_plans(
        &self,
        cache: &AttachmentCache,
        gone: impl Fn(&AttachmentPlan) -> bool,
        done: &str,
    ) {
        del_plans(cache, gone, |plan| self.del(&sandbox_of(plan)?).ok(), done);
    }
}

/// DEL (`del`) of the sandbox of each plan in `cache` that `gone` picks, logging `done` for each that succeeds
/// (`del` gives `None` for one that fails, having said why).
fn del_plans(
    cache: &AttachmentCache,
    gone: impl Fn(&AttachmentPlan) -> bool,
    del: impl Fn(AttachmentPlan) -> Option<()>,
    done: &str,
) {
    for id in cache.container_ids().unwrap_or_default() {
        let Ok(Some(plan)) = cache.load(&id) else {
            continue;
        };
        let label = plan
            .pod
            .as_ref()
            .map(|p| format!("{}/{}", p.namespace, p.name));
        if gone(&plan) && del(plan).is_some() {
            tracing::info!(pod = label.as_deref().unwrap_or("?"), container = %id, "{done}");
        }
    }
}

/// The network namespace of `pod`'s sandbox when Plexus attaches networks to it: one of its own, which still
/// exists (a stopped sandbox's is gone).
fn attachable(pod: &PodSandbox) -> Option<String> {
    sandbox_netns(pod).filter(|n| !on_host_network(n) && Path::new(n).exists())
}

/// The network namespace of `pod`'s sandbox: as the runtime names it; else, when the runtime gives the sandbox's
/// addresses but not its namespace (containerd, killed while it made the sandbox, keeps the sandbox without its
/// spec once restarted), the one of the runtime's ([`NETNS_DIR`]) whose cluster interface holds one of them.
fn sandbox_netns(pod: &PodSandbox) -> Option<String> {
    if let Some(netns) = pod.network_namespace() {
        return Some(netns.to_string());
    }
    let ips: Vec<std::net::IpAddr> = pod.ips.iter().filter_map(|ip| ip.parse().ok()).collect();
    let found = plexus_cni::podnet::namespace_holding(Path::new(NETNS_DIR), CLUSTER_IFNAME, &ips)?;
    let found = found.display().to_string();
    tracing::info!(pod = %pod.label(), container = %pod.id, netns = %found, ips = ?pod.ips,
        "the runtime names no network namespace for the sandbox; found it by its address");
    Some(found)
}

/// Whether `plan` was made in NRI mode: its cluster network the runtime's.
fn made_in_nri_mode(plan: &AttachmentPlan) -> bool {
    plan.attachments.iter().any(|a| a.external)
}

/// Whether the network namespace of `plan`'s sandbox is gone.
fn namespace_gone(plan: &AttachmentPlan) -> bool {
    plan.netns
        .as_deref()
        .is_some_and(|n| !Path::new(n).exists())
}

/// The daemon's environment without the CNI variables: what a delegate inherits besides its invocation's.
fn delegates_env() -> impl Iterator<Item = (String, String)> {
    std::env::vars().filter(|(k, _)| !k.starts_with("CNI_"))
}

/// In CNI mode, every [`SWEEP_EVERY`]: DEL of each plan made in NRI mode whose sandbox's network namespace is gone.
/// On a node moved back from NRI mode, CRI-O tears such a sandbox down with the CNI configuration it set it up with
/// (the cluster network's, from its cache), without calling Plexus: what Plexus attached is Plexus's to delete
/// (its DEL deletes the cluster network again, harmlessly). containerd calls Plexus, whose DEL leaves no plan.
/// The sweep ends after a pass that finds no plan made in NRI mode: a daemon in CNI mode makes none.
pub async fn sweep_after_nri_mode(state: Arc<NodeState>, cache_dir: PathBuf) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let (state, cache_dir) = (state.clone(), cache_dir.clone());
        let handle = tokio::runtime::Handle::current();
        let left = tokio::task::spawn_blocking(move || {
            let Some(cache) = AttachmentCache::open_existing(&cache_dir).ok().flatten() else {
                return false;
            };
            let found = std::sync::atomic::AtomicBool::new(false);
            let pick = |plan: &AttachmentPlan| {
                let nri = made_in_nri_mode(plan);
                found.fetch_or(nri, std::sync::atomic::Ordering::Relaxed);
                nri && namespace_gone(plan)
            };
            let del = |plan: AttachmentPlan| {
                let id = plan.container_id.clone();
                del_in_cni_mode(&state, &handle, &plan)
                    .map_err(|e| {
                        tracing::warn!(container = %id,
                        "DEL of a sandbox made in NRI mode, gone without Plexus: {e}")
                    })
                    .ok()
            };
            del_plans(
                &cache,
                pick,
                del,
                "deleted the networks of a sandbox made in NRI mode, gone without Plexus",
            );
            found.into_inner()
        })
        .await;
        if matches!(left, Ok(false)) {
            return tracing::debug!(
                "no plan made in NRI mode is left: the sweep after NRI mode ends"
            );
        }
    }
}

/// DEL of `plan`'s sandbox as the runtime's CNI plugin would make it (its namespace gone), with the daemon's caches
/// and processes.
fn del_in_cni_mode(
    state: &Arc<NodeState>,
    handle: &tokio::runtime::Handle,
    plan: &AttachmentPlan,
) -> Result<(), String> {
    let base_env: Vec<(String, String)> = delegates_env().collect();
    let mut inv = Invocation::of_plan(plan, &base_env).map_err(|e| e.to_string())?;
    inv.netns = None;
    let local = LocalEffects::new(state, handle.clone(), &inv.conf).map_err(|e| e.to_string())?;
    plexus_cni::orchestrate::del(&inv, &local.effects()).map_err(|e| e.to_string())
}

/// The sandbox a plan was made for, as a DEL without its namespace needs it.
fn sandbox_of(plan: AttachmentPlan) -> Option<PodSandbox> {
    let pod = plan.pod?;
    Some(PodSandbox {
        id: plan.container_id,
        name: pod.name,
        namespace: pod.namespace,
        uid: pod.uid.unwrap_or_default(),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(id: &str) -> PodSandbox {
        PodSandbox {
            id: id.into(),
            name: format!("pod-{id}"),
            namespace: "team-a".into(),
            ..Default::default()
        }
    }

    /// One holder of a sandbox's turn at a time; another sandbox's turn is not held up, and a waiter takes the
    /// turn once it is given back.
    #[test]
    fn a_sandboxs_turn_has_one_holder_and_the_next_takes_it_when_given_back() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let turns = Turns::default();
        let given_back = AtomicBool::new(false);
        std::thread::scope(|s| {
            let first = turns.take("a");
            let waiter = s.spawn(|| {
                let _second = turns.take("a");
                // Only after the first holder gave it back.
                given_back.load(Ordering::SeqCst)
            });
            // Another sandbox's turn is free meanwhile.
            drop(turns.take("b"));
            std::thread::sleep(Duration::from_millis(100));
            assert!(!waiter.is_finished(), "a second holder of the same turn");
            given_back.store(true, Ordering::SeqCst);
            drop(first);
            assert!(
                waiter.join().unwrap(),
                "the waiter held the turn before it was given back"
            );
        });
        assert!(turns.busy.lock().unwrap().is_empty());
    }

    #[test]
    fn a_failed_del_is_due_after_a_second_then_twice_as_long_each_time_up_to_a_minute() {
        let mut retries = Retries::default();
        let t0 = Instant::now();
        assert_eq!(retries.failed(&pod("a"), t0), DEL_RETRY);
        assert!(retries.due(t0).is_empty());
        assert_eq!(retries.due(t0 + DEL_RETRY)[0].id, "a");
        let waits: Vec<Duration> = (0..8).map(|_| retries.failed(&pod("a"), t0)).collect();
        let secs: Vec<u64> = waits.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [2, 4, 8, 16, 32, 60, 60, 60]);
        assert!(retries.due(t0 + Duration::from_secs(59)).is_empty());
        // One retried sandbox's backoff is its own.
        assert_eq!(retries.failed(&pod("b"), t0), DEL_RETRY);
        assert_eq!(retries.due(t0 + DEL_RETRY).len(), 1);
        assert!(retries.succeeded("a"));
        assert!(!retries.succeeded("a"));
        // After a success, a new failure starts over.
        assert_eq!(retries.failed(&pod("a"), t0), DEL_RETRY);
    }

    #[test]
    fn past_the_most_sandboxes_retried_the_one_due_first_is_dropped() {
        let mut retries = Retries::default();
        let t0 = Instant::now();
        for i in 0..MAX_RETRIED {
            retries.failed(&pod(&format!("p{i}")), t0 + Duration::from_millis(i as u64));
        }
        // p1 fails again: it is already there, nothing is dropped.
        retries.failed(&pod("p1"), t0 + Duration::from_secs(5));
        assert_eq!(retries.0.len(), MAX_RETRIED);
        retries.failed(&pod("new"), t0 + Duration::from_secs(5));
        assert_eq!(retries.0.len(), MAX_RETRIED);
        assert!(!retries.0.contains_key("p0"), "the one due first goes");
        assert!(retries.0.contains_key("p1") && retries.0.contains_key("new"));
    }

    #[test]
    fn a_plan_is_swept_when_it_was_made_in_nri_mode_and_its_namespace_is_gone() {
        let live = tempfile::NamedTempFile::new().unwrap();
        let live = live.path().to_str().unwrap();
        let plan = |external: bool, netns: &str| -> AttachmentPlan {
            serde_json::from_value(serde_json::json!({
                "format": 1, "containerId": "c1", "netns": netns, "cniVersion": "1.0.0",
                "attachments": [{
                    "network": "cluster", "ifname": "eth0", "isDefault": true,
                    "config": {"cniVersion": "1.0.0", "name": "cluster", "plugins": [{"type": "bridge"}]},
                    "capabilityArgs": {}, "external": external,
                }],
            }))
            .unwrap()
        };
        let swept = |p: &AttachmentPlan| made_in_nri_mode(p) && namespace_gone(p);
        assert!(swept(&plan(true, "/run/netns/plexus-gone-for-good")));
        assert!(!swept(&plan(true, live)), "its namespace is there");
        assert!(
            !swept(&plan(false, "/run/netns/plexus-gone-for-good")),
            "made in CNI mode: the runtime's DEL is coming"
        );
    }
}
