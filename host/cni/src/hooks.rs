//! The hook points (design.md, "Hooks") as orchestration sees them, [`HookRunner`], and the wasm hook runtime
//! behind it.

use std::path::Path;

use plexus_core::spec::dra::ClaimDevice;
use plexus_core::spec::{NetworkAttachmentDefinition, Pod, Selection};
use plexus_hooks::{Compile, HookSpec, Hooks, PolicyOutcome, SelectionDevices};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::conf::PlexusConf;
use crate::error::PlexusError;

/// The hook points, as orchestration calls them.
pub trait HookRunner {
    fn is_empty(&self) -> bool;
    /// The policy hooks' verdict on the pod's selections (spec 7.4); what they admit follows the spec's
    /// rules. `devices`: the claim device each network will use, by network (what `host.selection-device`
    /// answers).
    fn policy(
        &self,
        pod: &Pod,
        selections: Vec<Selection>,
        devices: SelectionDevices,
    ) -> Result<PolicyOutcome<Selection>, PlexusError>;
    /// The resolver hooks' config for `selection`, which will use the claim device `device`, if any.
    fn resolve(
        &self,
        pod: &Pod,
        selection: &Selection,
        nad: &NetworkAttachmentDefinition,
        config: Option<&Value>,
        device: Option<&ClaimDevice>,
    ) -> Result<Option<Value>, PlexusError>;
    /// The status entries after the status hooks; they follow the spec's rules (section 5).
    fn status(&self, pod: &Pod, entries: Vec<Value>) -> Result<Vec<Value>, PlexusError>;
    /// Every hook call made so far, for the report to the node daemon.
    fn calls(&self) -> Vec<crate::daemon::proto::HookCall> {
        Vec::new()
    }
}

/// No hooks configured.
#[derive(Debug, Default)]
pub struct NoHooks;

impl HookRunner for NoHooks {
    fn is_empty(&self) -> bool {
        true
    }
    fn policy(
        &self,
        _: &Pod,
        selections: Vec<Selection>,
        _: SelectionDevices,
    ) -> Result<PolicyOutcome<Selection>, PlexusError> {
        Ok(PolicyOutcome::Admit(selections))
    }
    fn resolve(
        &self,
        _: &Pod,
        _: &Selection,
        _: &NetworkAttachmentDefinition,
        _: Option<&Value>,
        _: Option<&ClaimDevice>,
    ) -> Result<Option<Value>, PlexusError> {
        Ok(None)
    }
    fn status(&self, _: &Pod, entries: Vec<Value>) -> Result<Vec<Value>, PlexusError> {
        Ok(entries)
    }
}

/// The hooks an ADD with `conf` runs: the conf's own, then the node's active hook set (read once, here: the
/// whole ADD runs the set it saw); none loaded when there are none. `pod_running` is what `host.pod-running`
/// answers them: true for a change of a running pod's networks (the node daemon), false in an ADD. `compile`:
/// whether this process may compile a component nobody compiled (the CNI plugin never does).
pub fn for_conf(
    conf: &PlexusConf,
    pod_running: bool,
    compile: Compile,
) -> Result<Box<dyn HookRunner>, PlexusError> {
    let set = if conf.cluster_hooks {
        match HookSet::read(&conf.cache_dir)? {
            Some(set) => Some(set).filter(|s| !s.hooks.is_empty()),
            None => return Err(no_hook_set(&conf.cache_dir)),
        }
    } else {
        None
    };
    if conf.hooks.is_empty() && set.is_none() {
        return Ok(Box::new(NoHooks));
    }
    let mut hooks = load(&conf.hooks, set, &conf.cache_dir, compile)?;
    hooks.set_pod_running(pod_running);
    Ok(Box::new(hooks))
}

/// Why an ADD is refused on a node whose agent has not published a hook set yet: the node cannot tell which
/// policies the cluster asks it to enforce, and a policy never fails open (design.md, "Policy fails closed").
/// Retryable: the runtime tries the sandbox again, and the ADD goes through once the set is there (an empty set
/// counts).
fn no_hook_set(cache_dir: &Path) -> PlexusError {
    PlexusError::NotReady(format!(
        "this node has no published hook set yet ({} is missing): ADDs wait until the node agent in `plexus daemon` \
         has published the cluster's NetworkHooks for this node, so that no policy is skipped; see the daemon's \
         log and `plexus status` (a node that runs no node agent sets \"clusterHooks\": false in its plexus conf)",
        HookSet::path(cache_dir).display()
    ))
}

/// Loads the conf's `hooks` list, then the node's active hook set when given (compiled artifacts cached under
/// `cache_dir`).
pub fn load(
    entries: &[Value],
    set: Option<HookSet>,
    cache_dir: &Path,
    compile: Compile,
) -> Result<Hooks, PlexusError> {
    let mut specs = entries
        .iter()
        .enumerate()
        .map(|(i, v)| {
            serde_json::from_value::<HookSpec>(v.clone())
                .map_err(|e| PlexusError::config(format!("hooks[{i}]"), e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // The node's set after the conf's own hooks, each named after its resource so that no cluster hook can take a
    // conf hook's name.
    specs.extend(set.into_iter().flat_map(|s| s.hooks).map(|mut h| {
        h.name = format!("{CLUSTER_HOOK_PREFIX}{}", h.name);
        h
    }));
    Ok(Hooks::load_with(&specs, cache_dir, compile)?)
}

/// The node's active hook set: what the node agent (in `plexus daemon`) published from the cluster's NetworkHook
/// resources, in `<cacheDir>/hook-set.json`. One file, replaced whole by rename: an ADD reads it once, so it runs
/// the old set or the new one, never a mix. Its entries are `precompiled`: an ADD loads their compiled artifacts
/// by digest and never reads a component or compiles.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookSet {
    /// Incremented by every publication.
    pub generation: u64,
    /// In run order (after the conf's own hooks). An entry with `unready` set is a hook selected for the node
    /// that has nothing to run: its calls fail under its failurePolicy.
    pub hooks: Vec<HookSpec>,
    /// What the node agent knows of each entry that runs, by name (an ADD does not read it).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub runs: std::collections::BTreeMap<String, PublishedRun>,
}

/// Where a published entry came from: its manifest digest, its order, and the key its signature verified with
/// (none when signatures are off). The agent keeps a hook's last good version running from this alone, whatever
/// happens to the registry or to the pulled component.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublishedRun {
    pub digest: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_by: Option<String>,
}

/// What the names of the node's hook set get in front in an ADD (logs, errors, policy denials).
pub const CLUSTER_HOOK_PREFIX: &str = "networkhook/";

/// The hook set's file name under `cacheDir`.
pub const SET_FILE: &str = "hook-set.json";
/// Where the node agent keeps pulled components, under `cacheDir`.
pub const MODULES_DIR: &str = "hook-modules";
/// The largest hook set file read.
const SET_CAP: usize = 4 << 20;

impl HookSet {
    pub fn path(cache_dir: &Path) -> std::path::PathBuf {
        cache_dir.join(SET_FILE)
    }

    /// The published set; `None` when nothing was ever published.
    pub fn read(cache_dir: &Path) -> Result<Option<HookSet>, PlexusError> {
        let path = Self::path(cache_dir);
        let bytes = match crate::conf::read_capped(&path, SET_CAP) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(PlexusError::config(
                    format!("node hook set {}", path.display()),
                    e,
                ))
            }
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| PlexusError::config(format!("node hook set {}", path.display()), e))
    }

    /// Replaces the published set (temp file, sync, rename, sync of the directory); root's alone, like every
    /// file of the node process.
    pub fn publish(&self, cache_dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(cache_dir)?;
        let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        crate::conf::replace_file(&Self::path(cache_dir), &json, 0o600)
    }
}

impl HookRunner for Hooks {
    fn is_empty(&self) -> bool {
        Hooks::is_empty(self)
    }

    fn calls(&self) -> Vec<crate::daemon::proto::HookCall> {
        Hooks::calls(self)
            .into_iter()
            .map(|c| crate::daemon::proto::HookCall {
                hook: c.hook,
                kind: c.kind.as_str().to_string(),
                outcome: c.outcome.to_string(),
            })
            .collect()
    }

    fn policy(
        &self,
        pod: &Pod,
        selections: Vec<Selection>,
        devices: SelectionDevices,
    ) -> Result<PolicyOutcome<Selection>, PlexusError> {
        Ok(Hooks::policy_selections(self, pod, selections, devices)?)
    }

    fn resolve(
        &self,
        pod: &Pod,
        selection: &Selection,
        nad: &NetworkAttachmentDefinition,
        config: Option<&Value>,
        device: Option<&ClaimDevice>,
    ) -> Result<Option<Value>, PlexusError> {
        // The WIT carries both in their Kubernetes JSON forms.
        let nad = serde_json::json!({
            "apiVersion": "k8s.cni.cncf.io/v1",
            "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": nad.name, "namespace": nad.namespace, "annotations": nad.annotations},
            "spec": nad.config.as_ref().map_or(serde_json::json!({}), |c| serde_json::json!({"config": c})),
        });
        Ok(Hooks::resolve_selection(
            self,
            pod,
            selection,
            Some(&nad),
            config,
            device.cloned(),
        )?)
    }

    fn status(&self, pod: &Pod, entries: Vec<Value>) -> Result<Vec<Value>, PlexusError> {
        Ok(Hooks::status(self, pod, entries)?)
    }
}
