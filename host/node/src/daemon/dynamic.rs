//! Networks that follow the annotation (`plexus daemon --dynamic-networks`): when the
//! `k8s.v1.cni.cncf.io/networks` annotation of a pod of this node changes, its running sandbox is brought to
//! match, through the same lock, plan and delegates as the runtime's ADD and DEL (`plexus_cni::change`).
//!
//! Level-triggered: every plan in the attachment cache records the annotation its selections came from, and a
//! sandbox whose pod now carries another one is changed. Checked when the pods' annotations in the watch cache
//! change (a burst of watch events is taken as one), once when the caches first sync (what changed while the
//! daemon was down, and what a daemon killed mid-change left), and every [`RESYNC`] (an annotation changed
//! while the sandbox's ADD was still running). The node's [`Controller`] runs the changes: one worker per sandbox
//! at a time (a change noticed meanwhile runs after it, to the annotation the pod has then), at most
//! `max_changes` sandboxes at once.
//!
//! What is decided where: [`crate::hotplug::diff`] says what the change is; refusals and failures leave a
//! Warning event (`NetworkChangeFailed`) naming the network and the cause, and are not tried again until the
//! annotation changes (unless the cluster did not answer: then it is tried again with backoff); a change made
//! leaves a Normal event (`NetworksChanged`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use plexus_cluster::{Cluster, ClusterError, Lookup, PodEvent};
use plexus_cni::cache::AttachmentCache;
use plexus_cni::change::{Edit, Sandbox};
use plexus_cni::effects::Effects;
use plexus_cni::exec::ProcessExec;
use plexus_cni::podnet::IpRoute;
use plexus_cni::podresources::{KubeletPodResources, POD_RESOURCES_TIMEOUT};
use plexus_core::spec::dra::{ClaimName, DeviceNetworkData};
use plexus_core::spec::{NetworkAttachmentDefinition, Pod, PodRef};

use super::state::{enqueue_claim_status, enqueue_status, send_event, NodeState};
use crate::controller::{self, Controller};
use crate::hotplug::{diff, Change};

/// The event reason of a change made.
pub const CHANGED: &str = "NetworksChanged";
/// The event reason of a change refused or failed (nothing changed).
pub const CHANGE_FAILED: &str = "NetworkChangeFailed";

/// How often every sandbox is checked against its pod even when no annotation changed.
pub const RESYNC: Duration = Duration::from_secs(30);
/// How long a burst of watch events is gathered before the check.
const SETTLE: Duration = Duration::from_millis(20);
/// How long a change waits for the sandbox's lock (the runtime's ADD or DEL may hold it).
const LOCK_WAIT: Duration = Duration::from_secs(60);

/// The daemon's dynamic networks settings.
#[derive(Debug, Clone)]
pub struct DynamicSettings {
    /// The plexus `cacheDir` (where the attachment cache is).
    pub cache_dir: PathBuf,
    /// Sandboxes changed at once at most.
    pub max_changes: usize,
}

/// Each pod of the node (namespace, name) with its UID and selection annotation, as last checked.
type Annotations = HashMap<(String, String), (Option<String>, Option<String>)>;

/// A sandbox as the cache records it.
struct Recorded {
    container_id: String,
    pod: PodRef,
    networks: Option<String>,
}

/// Annotations refused for a sandbox (by container ID): not tried again until the pod's annotation changes.
type Refused = Arc<Mutex<HashMap<String, Option<String>>>>;

/// Runs until the daemon stops: the checks schedule the sandboxes whose pods' annotations differ from their
/// plans, and the node's controller changes them (one worker per sandbox, `max_changes` at once, failures of an
/// unanswering cluster retried with backoff).
pub async fn run(state: Arc<NodeState>, settings: DynamicSettings) {
    let controller = Controller::new(controller::Settings {
        concurrency: settings.max_changes.max(1),
        retry_first: Duration::from_secs(1),
        retry_max: RESYNC,
        resync: None,
    });
    let refused = Refused::default();
    let worker = {
        let (state, refused, dir) = (state.clone(), refused.clone(), settings.cache_dir.clone());
        move |id: String| work(state.clone(), refused.clone(), dir.clone(), id)
    };
    tokio::join!(
        controller.run(worker),
        check(&state, &settings, &controller, &refused)
    );
}

/// Schedules every sandbox whose pod's annotation is not the one its plan records (and was not refused): when
/// the pods' annotations in the watch cache change, and every [`RESYNC`].
async fn check(
    state: &NodeState,
    settings: &DynamicSettings,
    controller: &Controller<String>,
    refused: &Refused,
) {
    let mut changes = state.cache.subscribe();
    let mut seen: Option<Annotations> = None;
    let mut next_resync = tokio::time::Instant::now() + RESYNC;
    loop {
        let forced = tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
                false
            }
            () = tokio::time::sleep_until(next_resync) => true,
        };
        tokio::time::sleep(SETTLE).await;
        changes.borrow_and_update();
        let Some(pods) = state.cache.pods() else {
            continue;
        };
        let now: Annotations = pods
            .iter()
            .map(|p| {
                (
                    (p.namespace.clone(), p.name.clone()),
                    (p.uid.clone(), p.networks_annotation().map(str::to_string)),
                )
            })
            .collect();
        if !forced && seen.as_ref() == Some(&now) {
            continue;
        }
        seen = Some(now);
        next_resync = tokio::time::Instant::now() + RESYNC;
        let dir = settings.cache_dir.clone();
        let recorded = match tokio::task::spawn_blocking(move || recorded(&dir)).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the attachment cache");
                continue;
            }
        };
        let refused = refused.lock().unwrap_or_else(|e| e.into_inner());
        for id in differing(&pods, recorded, &refused) {
            controller.schedule(id);
        }
    }
}

/// The sandboxes whose pod (the same UID) carries another annotation than their plan records, and not one
/// refused for them before.
fn differing(
    pods: &[Pod],
    recorded: Vec<Recorded>,
    refused: &HashMap<String, Option<String>>,
) -> Vec<String> {
    let pods: HashMap<(&str, &str), &Pod> = pods
        .iter()
        .map(|p| ((p.namespace.as_str(), p.name.as_str()), p))
        .collect();
    recorded
        .into_iter()
        .filter(|sb| {
            let Some(pod) = pods.get(&(sb.pod.namespace.as_str(), sb.pod.name.as_str())) else {
                return false;
            };
            if sb.pod.uid.is_some() && pod.uid != sb.pod.uid {
                return false;
            }
            let networks = pod.networks_annotation().map(str::to_string);
            networks != sb.networks && refused.get(&sb.container_id) != Some(&networks)
        })
        .map(|sb| sb.container_id)
        .collect()
}

/// One sandbox's change (on a blocking thread), then what it leaves: the metrics, the event, the refusal kept.
async fn work(
    state: Arc<NodeState>,
    refused: Refused,
    dir: PathBuf,
    id: String,
) -> controller::Outcome {
    let worker = state.clone();
    let container = id.clone();
    let outcome = tokio::task::spawn_blocking(move || change(&worker, &dir, &container))
        .await
        .unwrap_or_else(|e| Outcome::Failed {
            pod: None,
            error: format!("the change stopped: {e}"),
            retry: true,
        });
    let result = match &outcome {
        Outcome::Done(..) => Some("changed"),
        Outcome::Failed { .. } => Some("failed"),
        Outcome::Nothing => None,
    };
    if let Some(result) = result {
        state
            .metrics
            .network_changes
            .get_or_create(&super::metrics::ResultLabel {
                result: result.into(),
            })
            .inc();
    }
    let mut refused = refused.lock().unwrap_or_else(|e| e.into_inner());
    match outcome {
        Outcome::Failed {
            pod: Some((pod, networks)),
            error,
            retry,
        } => {
            tracing::warn!(pod = %pod, container = %id, "network change failed: {error}");
            send_event(&state, pod, true, CHANGE_FAILED.into(), error);
            if retry {
                return controller::Outcome::Retry;
            }
            refused.insert(id, networks);
            controller::Outcome::Settled
        }
        Outcome::Failed {
            pod: None, error, ..
        } => {
            tracing::warn!(container = %id, "network change failed: {error}");
            controller::Outcome::Retry
        }
        Outcome::Done(pod, message) => {
            refused.remove(&id);
            tracing::info!(pod = %pod, container = %id, "{message}");
            send_event(&state, pod, false, CHANGED.into(), message);
            controller::Outcome::Settled
        }
        Outcome::Nothing => controller::Outcome::Settled,
    }
}

/// Whether only root (or this process's user) can have written `path`: not a symlink, of the expected kind,
/// and trusted as the compiled hooks are ([`plexus_hooks::distrust`]). A plan names the delegates the daemon
/// runs as root, so a plan someone else could have written is never acted on.
fn trusted(path: &std::path::Path, dir: bool) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    let kind_ok = if dir {
        meta.file_type().is_dir()
    } else {
        meta.file_type().is_file()
    };
    if !kind_ok {
        return Err(format!(
            "not a {} (a symlink is not followed)",
            if dir { "directory" } else { "regular file" }
        ));
    }
    plexus_hooks::distrust(&meta).map_or(Ok(()), Err)
}

/// Every sandbox whose plan records its runtime context (plans of earlier versions cannot be changed), from a
/// cache only root can write (see [`trusted`]).
fn recorded(cache_dir: &std::path::Path) -> Vec<Recorded> {
    for (path, dir) in [
        (cache_dir.to_path_buf(), true),
        (cache_dir.join("attachments"), true),
    ] {
        match trusted(&path, dir) {
            Ok(()) => {}
            // No sandbox yet.
            Err(_) if !path.exists() => return Vec::new(),
            Err(why) => {
                tracing::warn!(path = %path.display(), "dynamic networks: the attachment cache is not root's alone ({why}); no sandbox is changed");
                return Vec::new();
            }
        }
    }
    let Ok(Some(cache)) = AttachmentCache::open_existing(cache_dir) else {
        return Vec::new();
    };
    let Ok(ids) = cache.container_ids() else {
        return Vec::new();
    };
    ids.into_iter()
        .filter_map(|id| {
            if let Err(why) = trusted(&cache.path_of(&id), false) {
                tracing::warn!(container = %id, "dynamic networks: its plan is not root's alone ({why}); not changed");
                return None;
            }
            let plan = cache.load(&id).ok()??;
            let rt = plan.runtime?;
            Some(Recorded {
                container_id: id,
                pod: plan.pod?,
                networks: rt.networks,
            })
        })
        .collect()
}

enum Outcome {
    /// Nothing to do (no sandbox any more, the pod is gone, or the plan already matched).
    Nothing,
    Done(PodRef, String),
    /// Refused or failed; nothing changed. `retry`: the cluster did not answer, try again (with backoff).
    Failed {
        pod: Option<(PodRef, Option<String>)>,
        error: String,
        retry: bool,
    },
}

/// One change of one sandbox, under its lock (a blocking thread of the daemon's runtime).
fn change(shared: &Arc<NodeState>, cache_dir: &std::path::Path, container_id: &str) -> Outcome {
    let failed = |error: String| Outcome::Failed {
        pod: None,
        error,
        retry: true,
    };
    let base_env: Vec<(String, String)> = std::env::vars().collect();
    let mut sb = match Sandbox::open(cache_dir, container_id, &base_env, LOCK_WAIT) {
        Ok(Some(sb)) => sb,
        Ok(None) => return Outcome::Nothing,
        Err(e) => return failed(e.to_string()),
    };
    let Some(pod_ref) = sb.plan.pod.clone() else {
        return Outcome::Nothing;
    };
    let Lookup::Found(pod) = shared.cached_pod(&pod_ref) else {
        return Outcome::Nothing;
    };
    let networks = pod.networks_annotation().map(str::to_string);
    if sb.networks() == networks.as_deref() || !sb.is_up() {
        return Outcome::Nothing;
    }
    let refuse = |error: String, retry: bool| Outcome::Failed {
        pod: Some((pod_ref.clone(), networks.clone())),
        error,
        retry,
    };
    let local = match LocalEffects::new(shared, tokio::runtime::Handle::current(), &sb.inv.conf) {
        Ok(local) => local,
        Err(e) => return refuse(format!("{}: {e}", sb.inv.pod_label()), true),
    };
    let fx = local.effects();
    match sb.repair(&fx) {
        Ok(0) => {}
        Ok(n) => {
            tracing::info!(pod = %pod_ref, container = %container_id, "removed {n} attachment(s) a change killed in the middle left")
        }
        Err(e) => return failed(e.to_string()),
    }
    let wanted = match sb.wanted(&fx, &pod) {
        Ok(w) => w,
        Err(e) => {
            let retry = plexus_cni::plan::is_unavailable(&e);
            return refuse(format!("{}: {e}", sb.inv.pod_label()), retry);
        }
    };
    let Change {
        detach,
        reattach,
        attach,
    } = match diff(&sb.plan, &wanted) {
        Ok(c) => c,
        Err(e) => return refuse(format!("{}: {e}", sb.inv.pod_label()), false),
    };
    if let Some((i, _)) = reattach.first() {
        let att = &sb.plan.attachments[*i];
        return refuse(
            format!(
                "{}: network {} ({}) is attached and its selection's other keys changed: a running pod's \
                 attachment is not changed in place; remove the selection, then add it again",
                sb.inv.pod_label(),
                att.network,
                att.ifname
            ),
            false,
        );
    }
    if detach.is_empty() && attach.is_empty() {
        return match sb.settle(&pod) {
            Ok(()) => Outcome::Nothing,
            Err(e) => failed(e.to_string()),
        };
    }
    match sb.apply(&fx, &pod, Edit { attach, detach }) {
        Ok(applied) => {
            if let Some(error) = detach_failures(&sb, &applied) {
                send_event(shared, pod_ref.clone(), true, CHANGE_FAILED.into(), error);
            }
            Outcome::Done(pod_ref, made(&applied))
        }
        Err(e) => {
            let retry = plexus_cni::plan::is_unavailable(&e);
            refuse(e.to_string(), retry)
        }
    }
}

/// What a change made, for its event: `attached net2 (net2); detached ...`.
fn made(applied: &plexus_cni::change::Applied) -> String {
    let mut parts = Vec::new();
    if !applied.attached.is_empty() {
        parts.push(format!("attached {}", applied.attached.join(", ")));
    }
    if !applied.detached.is_empty() {
        parts.push(format!("detached {}", applied.detached.join(", ")));
    }
    parts.join("; ")
}

/// The detachments that failed (their attachments are kept for the pod's DEL), as one warning.
fn detach_failures(sb: &Sandbox, applied: &plexus_cni::change::Applied) -> Option<String> {
    if applied.failed.is_empty() {
        return None;
    }
    let errors: Vec<String> = applied.failed.iter().map(ToString::to_string).collect();
    Some(format!(
        "{}: could not detach (kept for the pod's DEL): {}",
        sb.inv.pod_label(),
        errors.join("; ")
    ))
}

/// What an attachment change made inside the daemon runs with (a dynamic network's, an ADD or DEL of NRI mode):
/// the daemon's caches for the cluster ([`LocalCluster`]), the delegates as processes, the route changes with
/// `ip`, the conf's hooks, and the kubelet's PodResources API for devices.
pub(super) struct LocalEffects {
    cluster: LocalCluster,
    hooks: Box<dyn plexus_cni::hooks::HookRunner>,
    devices: KubeletPodResources,
}

impl LocalEffects {
    pub(super) fn new(
        shared: &Arc<NodeState>,
        handle: tokio::runtime::Handle,
        conf: &plexus_cni::conf::PlexusConf,
    ) -> Result<LocalEffects, plexus_cni::error::PlexusError> {
        Ok(LocalEffects {
            cluster: LocalCluster {
                shared: shared.clone(),
                handle,
            },
            hooks: plexus_cni::hooks::for_conf(conf, true, plexus_cni::entry::Compile::WhenNeeded)?,
            devices: KubeletPodResources {
                socket: conf.pod_resources_socket.clone(),
                timeout: POD_RESOURCES_TIMEOUT,
            },
        })
    }

    pub(super) fn effects(&self) -> Effects<'_> {
        Effects {
            exec: &ProcessExec,
            cluster: Some(&self.cluster),
            podnet: &IpRoute,
            hooks: self.hooks.as_ref(),
            devices: &self.devices,
        }
    }
}

/// The cluster as a change sees it: the daemon's watch caches first (the API when they miss), status writes
/// through the daemon's durable queue, events from the daemon.
struct LocalCluster {
    shared: Arc<NodeState>,
    handle: tokio::runtime::Handle,
}

impl Cluster for LocalCluster {
    fn pod(&self, pod: &PodRef) -> Result<Pod, ClusterError> {
        self.handle.block_on(self.shared.pod(pod))
    }

    fn nad(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<NetworkAttachmentDefinition, ClusterError> {
        self.handle.block_on(async {
            match self.shared.nad(namespace, name).await {
                Some(found) => found,
                // Caches not synced yet: the API answers.
                None => self.shared.api.nad(namespace, name).await,
            }
        })
    }

    fn pod_claims(&self, pod: &Pod) -> Result<plexus_core::spec::dra::PodClaims, ClusterError> {
        match self.handle.block_on(self.shared.pod_claims(pod)) {
            Some(found) => found,
            // A change must not take a claim's network for absent because the caches cannot tell yet.
            None => Err(ClusterError::unavailable(
                "the daemon's DRA caches have not listed yet",
            )),
        }
    }

    fn write_status(&self, pod: &PodRef, network_status: &str) -> Result<(), ClusterError> {
        if enqueue_status(&self.shared, pod.clone(), network_status.to_string()) {
            Ok(())
        } else {
            // The queue (full, or its disk failing) did not keep it: one attempt, as the queue's writer makes.
            self.handle
                .block_on(self.shared.api.write_status(pod, network_status))
        }
    }

    /// Through the daemon's durable queue, as a CNI process's claim write is.
    fn write_claim_status(
        &self,
        pod: &PodRef,
        claim: &ClaimName,
        devices: &[DeviceNetworkData],
    ) -> Result<(), ClusterError> {
        if enqueue_claim_status(&self.shared, pod.clone(), claim.clone(), devices.to_vec()) {
            Ok(())
        } else {
            // The queue did not keep it: one attempt.
            self.handle
                .block_on(self.shared.api.apply_claim_status(claim, devices))
        }
    }

    /// Posted by the daemon, as from its own node (the pod's).
    fn record(&self, event: &PodEvent<'_>) -> Result<(), ClusterError> {
        send_event(
            &self.shared,
            event.pod.clone(),
            event.warning,
            event.reason.into(),
            event.message.into(),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(path: &std::path::Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn only_plans_of_a_cache_no_one_else_can_write_are_acted_on() {
        let dir = tempfile::tempdir().unwrap();
        let cache_dir = dir.path().join("cache");
        assert!(recorded(&cache_dir).is_empty(), "no cache yet");
        let cache = AttachmentCache::open(&cache_dir).unwrap();
        chmod(&cache_dir, 0o755);
        chmod(&cache_dir.join("attachments"), 0o755);
        let pod = PodRef {
            namespace: "team-a".into(),
            name: "web".into(),
            uid: Some("u1".into()),
        };
        let mut plan =
            plexus_cni::cache::AttachmentPlan::new("c1", Some("/run/netns/x"), "1.0.0", Some(pod));
        plan.runtime = Some(plexus_cni::cache::RuntimeContext {
            networks: Some("net-a".into()),
            ..Default::default()
        });
        cache.store(&plan).unwrap();
        // A plan of an earlier version (no runtime context) is left alone.
        let mut old = plexus_cni::cache::AttachmentPlan::new("c2", None, "1.0.0", None);
        old.runtime = None;
        cache.store(&old).unwrap();
        let found = recorded(&cache_dir);
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].container_id.as_str(), found[0].networks.as_deref()),
            ("c1", Some("net-a"))
        );
        // Anyone may write into the directory: nothing is acted on.
        chmod(&cache_dir.join("attachments"), 0o777);
        assert!(recorded(&cache_dir).is_empty());
        chmod(&cache_dir.join("attachments"), 0o755);
        chmod(&cache_dir, 0o775);
        assert!(recorded(&cache_dir).is_empty());
        chmod(&cache_dir, 0o755);
        // A plan file others may write is skipped; the others are not.
        chmod(&cache.path_of("c1"), 0o666);
        assert!(recorded(&cache_dir).is_empty());
        chmod(&cache.path_of("c1"), 0o644);
        assert_eq!(recorded(&cache_dir).len(), 1);
        // A plan that is a symlink is not followed.
        std::fs::rename(cache.path_of("c1"), dir.path().join("elsewhere.json")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere.json"), cache.path_of("c1")).unwrap();
        assert!(recorded(&cache_dir).is_empty());
    }
}
