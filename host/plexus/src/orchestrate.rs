//! ADD, DEL, CHECK, STATUS and GC for a pod: plan, persist, delegate, adjust routes, publish status.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use plexus_cluster::Cluster;
use plexus_core::cni::{CniResult, CniVersion, NetworkConfigList};
use plexus_core::spec::naming::IfNameAllocator;
use plexus_core::spec::resolve::{resolve_nad, OnDiskConf};
use plexus_core::spec::selection::{
    parse_selection_annotation, validate_selections, InvalidSelectionPolicy, Selection,
};
use plexus_core::spec::status::{
    network_status, status_default_route, validate_status_entries, NetworkStatus,
};
use plexus_core::spec::{check_capabilities, merge_cni_args, NetworkAttachmentDefinition, Pod};
use serde_json::{json, Map, Value};

use crate::cache::{Attachment, AttachmentCache, AttachmentPlan};
use crate::deleted::DeletedLog;
use crate::error::{bounded, PlexusError};
use crate::exec::Exec;
use crate::invocation::Invocation;
use crate::lock::ContainerLock;
use crate::podnet::PodNetwork;
use crate::runner::{Delegator, RuntimeParams};

/// The CNI capability carrying the device-info file path (Device Information Specification 5.1).
const DEVICE_INFO_CAPABILITY: &str = "CNIDeviceInfoFile";

/// The device-info file of an attachment, if its list asked for one.
fn device_info_path(att: &Attachment) -> Option<&str> {
    att.capability_args.get(DEVICE_INFO_CAPABILITY)?.as_str()
}

/// What a plugin wrote into the attachment's device-info file (spec 5.3.8), if anything valid.
fn read_device_info(att: &Attachment) -> Option<Value> {
    let text = std::fs::read(device_info_path(att)?).ok()?;
    let info: Value = serde_json::from_slice(&text).ok()?;
    info.get("type")
        .and_then(Value::as_str)
        .is_some()
        .then_some(info)
}

/// A policy hook's verdict on a pod's selections.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyVerdict {
    Admit(Vec<Value>),
    Deny { hook: String, reason: String },
}

/// The hook points (design.md, "Hooks"), as orchestration sees them.
pub trait HookRunner {
    fn is_empty(&self) -> bool;
    fn policy(&self, pod: &Pod, selections: Vec<Value>) -> Result<PolicyVerdict, PlexusError>;
    fn resolve(
        &self,
        pod: &Pod,
        selection: &Value,
        nad: &Value,
        config: Option<&Value>,
    ) -> Result<Option<Value>, PlexusError>;
    fn status(&self, pod: &Pod, entries: Vec<Value>) -> Result<Vec<Value>, PlexusError>;
}

/// No hooks configured.
#[derive(Debug, Default)]
pub struct NoHooks;

impl HookRunner for NoHooks {
    fn is_empty(&self) -> bool {
        true
    }
    fn policy(&self, _: &Pod, selections: Vec<Value>) -> Result<PolicyVerdict, PlexusError> {
        Ok(PolicyVerdict::Admit(selections))
    }
    fn resolve(
        &self,
        _: &Pod,
        _: &Value,
        _: &Value,
        _: Option<&Value>,
    ) -> Result<Option<Value>, PlexusError> {
        Ok(None)
    }
    fn status(&self, _: &Pod, entries: Vec<Value>) -> Result<Vec<Value>, PlexusError> {
        Ok(entries)
    }
}

/// What planning does with a network it cannot resolve: an ADD fails on it, a DEL without a cache skips it
/// and names it.
enum Unplannable<'e> {
    Fail,
    Skip(&'e mut Vec<PlexusError>),
}

impl Unplannable<'_> {
    fn handle<T>(&mut self, r: Result<T, PlexusError>) -> Result<Option<T>, PlexusError> {
        match (r, self) {
            (Ok(v), _) => Ok(Some(v)),
            (Err(e), Unplannable::Fail) => Err(e),
            (Err(e), Unplannable::Skip(skipped)) => {
                skipped.push(e);
                Ok(None)
            }
        }
    }
}

/// The event reason of a DEL that could not release everything.
const TEARDOWN_INCOMPLETE: &str = "TeardownIncomplete";

/// The most networks one pod may select: each is an interface, a delegate run and a cache record.
pub const MAX_SELECTIONS: usize = 64;

/// True when `e` says the cluster source did not answer.
fn is_unavailable(e: &PlexusError) -> bool {
    match e {
        PlexusError::Cluster(c) => c.is_transient(),
        PlexusError::Context { source, .. } => is_unavailable(source),
        _ => false,
    }
}

/// Every outside effect orchestration has, behind its trait.
pub struct Effects<'a> {
    pub exec: &'a dyn Exec,
    pub cluster: Option<&'a dyn Cluster>,
    pub podnet: &'a dyn PodNetwork,
    pub hooks: &'a dyn HookRunner,
}

struct Ctx<'a> {
    inv: &'a Invocation,
    fx: &'a Effects<'a>,
    on_disk: std::cell::OnceCell<Vec<OnDiskConf>>,
}

impl<'a> Ctx<'a> {
    fn new(inv: &'a Invocation, fx: &'a Effects<'a>) -> Self {
        Self {
            inv,
            fx,
            on_disk: std::cell::OnceCell::new(),
        }
    }

    fn delegator(&self) -> Delegator<'_> {
        Delegator { exec: self.fx.exec }
    }

    fn rt<'b>(&'b self, ifname: &'b str) -> RuntimeParams<'b> {
        RuntimeParams {
            container_id: &self.inv.container_id,
            netns: self.inv.netns.as_deref(),
            ifname,
            args: &self.inv.args,
            path: &self.inv.path,
            base_env: &self.inv.base_env,
            timeout: self.inv.conf.delegate_timeout,
        }
    }

    fn pod_label(&self) -> String {
        self.inv.pod.as_ref().map_or_else(
            || format!("container {}", self.inv.container_id),
            |p| format!("pod {p}"),
        )
    }

    /// The on-disk confs of `confDir`, read once, in file-name order. A missing directory is empty.
    fn on_disk(&self) -> &[OnDiskConf] {
        self.on_disk
            .get_or_init(|| read_conf_dir(&self.inv.conf.conf_dir))
    }

    fn cluster(&self) -> Result<&'a dyn Cluster, PlexusError> {
        self.fx.cluster.ok_or_else(|| {
            PlexusError::Config(
                "a NetworkAttachmentDefinition is needed but no cluster source is configured"
                    .into(),
            )
        })
    }

    /// Resolves `clusterNetwork`/`defaultNetworks` entries: an absolute path, `ns/name` of a NAD, or a name
    /// found in `confDir` first and then as a NAD in `plexusNamespace`. Returns (status name, list).
    fn resolve_ref(
        &self,
        reference: &str,
        pod: Option<&Pod>,
    ) -> Result<(String, NetworkConfigList), PlexusError> {
        if reference.starts_with('/') {
            let text = std::fs::read(reference).map_err(|source| PlexusError::Io {
                path: reference.into(),
                source,
            })?;
            let value: Value = serde_json::from_slice(&text).map_err(|e| {
                PlexusError::Config(format!(
                    "network configuration {reference}: invalid JSON: {e}"
                ))
            })?;
            let list = NetworkConfigList::parse(&value).map_err(|e| {
                PlexusError::Config(format!("network configuration {reference}: {e}"))
            })?;
            return Ok((list.name.clone(), list));
        }
        let (ns, name) = match reference.split_once('/') {
            Some((ns, name)) => (ns.to_string(), name.to_string()),
            None => {
                let bare = NetworkAttachmentDefinition {
                    namespace: self.inv.conf.plexus_namespace.clone(),
                    name: reference.into(),
                    config: None,
                    annotations: BTreeMap::new(),
                };
                if let Ok(found) = resolve_nad(&bare, self.on_disk()) {
                    let list = parse_list(&found.config, reference)?;
                    return Ok((list.name.clone(), list));
                }
                if self.fx.cluster.is_none() {
                    return Err(PlexusError::Config(format!(
                        "network {reference:?} is not in {} and no cluster source is configured",
                        self.inv.conf.conf_dir.display()
                    )));
                }
                (
                    self.inv.conf.plexus_namespace.clone(),
                    reference.to_string(),
                )
            }
        };
        let nad = self.cluster()?.nad(&ns, &name)?;
        let list = self.resolve_nad_config(&nad, None, pod)?;
        Ok((format!("{ns}/{name}"), list))
    }

    /// Spec 3.4.1 with resolver hooks first: a hook may supply or rewrite the config.
    fn resolve_nad_config(
        &self,
        nad: &NetworkAttachmentDefinition,
        selection: Option<&Value>,
        pod: Option<&Pod>,
    ) -> Result<NetworkConfigList, PlexusError> {
        let label = format!("NetworkAttachmentDefinition {}/{}", nad.namespace, nad.name);
        if let (false, Some(pod)) = (self.fx.hooks.is_empty(), pod) {
            let current = match &nad.config {
                Some(text) => Some(serde_json::from_str::<Value>(text).map_err(|e| {
                    PlexusError::Config(format!("{label}: spec.config is not valid JSON: {e}"))
                })?),
                None => None,
            };
            let nad_json = json!({
                "apiVersion": "k8s.cni.cncf.io/v1",
                "kind": "NetworkAttachmentDefinition",
                "metadata": {"name": nad.name, "namespace": nad.namespace, "annotations": nad.annotations},
                "spec": nad.config.as_ref().map(|c| json!({"config": c})).unwrap_or(json!({})),
            });
            let sel = selection
                .cloned()
                .unwrap_or_else(|| json!({"name": nad.name, "namespace": nad.namespace}));
            if let Some(cfg) = self
                .fx
                .hooks
                .resolve(pod, &sel, &nad_json, current.as_ref())?
            {
                return parse_list(&cfg, &nad.name)
                    .map_err(|e| e.context(format!("{label} (from resolver hook)")));
            }
        }
        let resolved =
            resolve_nad(nad, self.on_disk()).map_err(|e| PlexusError::Config(e.to_string()))?;
        parse_list(&resolved.config, &nad.name).map_err(|e| e.context(label))
    }

    /// Builds the full plan: cluster network, defaultNetworks, then the pod's selections (spec 6.2, 4). What
    /// cannot be planned fails the plan or is skipped, as `unplannable` says.
    fn plan(
        &self,
        pod: Option<&Pod>,
        mut unplannable: Unplannable<'_>,
    ) -> Result<AttachmentPlan, PlexusError> {
        let inv = self.inv;
        let mut plan = AttachmentPlan::new(
            &inv.container_id,
            inv.netns.as_deref(),
            inv.conf.cni_version.as_str(),
            inv.pod.clone(),
        );
        let cluster = self
            .resolve_ref(&inv.conf.cluster_network, pod)
            .map_err(|e| e.context("cluster network"));
        if let Some((name, list)) = unplannable.handle(cluster)? {
            plan.attachments.push(Attachment {
                network: name,
                ifname: inv.ifname.clone(),
                is_default: true,
                config: list.to_value(),
                // Spec 7.5: the runtime's runtimeConfig goes to the cluster network only.
                capability_args: inv.conf.runtime_config.clone(),
                selection: None,
                result: None,
            });
        }
        let mut ifnames = IfNameAllocator::new(&inv.ifname);
        if inv.pod.is_none() {
            return Ok(plan);
        }
        for reference in &inv.conf.default_networks {
            let resolved = self
                .resolve_ref(reference, pod)
                .map_err(|e| e.context(format!("default network {reference:?}")));
            let ifname = ifnames
                .next(None)
                .map_err(|e| PlexusError::Config(e.to_string()));
            let Some((name, list)) = unplannable.handle(resolved)? else {
                continue;
            };
            let Some(ifname) = unplannable.handle(ifname)? else {
                continue;
            };
            plan.attachments.push(Attachment {
                network: name,
                ifname,
                is_default: false,
                config: list.to_value(),
                capability_args: Map::new(),
                selection: None,
                result: None,
            });
        }
        let Some(pod) = pod else { return Ok(plan) };
        let Some(selections) = unplannable.handle(self.selections(pod))? else {
            return Ok(plan);
        };
        for sel in selections {
            let network = sel.namespaced_name();
            let ctx = |e: PlexusError| e.context(format!("network {network}"));
            let sel_json = sel.to_json();
            let resolved = self
                .cluster()
                .and_then(|c| c.nad(&sel.namespace, &sel.name).map_err(|e| ctx(e.into())))
                .and_then(|nad| {
                    self.resolve_nad_config(&nad, Some(&sel_json), Some(pod))
                        .map_err(ctx)
                })
                .and_then(|list| {
                    check_capabilities(&sel.required_capabilities(), &list.plugins, &network)
                        .map_err(|e| PlexusError::Config(e.to_string()))?;
                    Ok(list)
                });
            // The interface name is taken whether or not the network resolves, so a DEL that skips one
            // network gives the others the names their ADD gave them.
            let ifname = ifnames
                .next(sel.interface.as_deref())
                .map_err(|e| ctx(PlexusError::Config(e.to_string())));
            let Some(mut list) = unplannable.handle(resolved)? else {
                continue;
            };
            let Some(ifname) = unplannable.handle(ifname)? else {
                continue;
            };
            if let Some(args) = sel.delegate_cni_args() {
                for plugin in &mut list.plugins {
                    merge_cni_args(plugin, &args);
                }
            }
            let mut capability_args = sel.runtime_config();
            if list.capabilities_declared(DEVICE_INFO_CAPABILITY) {
                // Device Information Specification 4.2 / 5.1: a file unique per attachment.
                let file = inv.conf.device_info_dir.join(format!(
                    "{}-{}-{}-{}-device-info.json",
                    sel.namespace, sel.name, inv.container_id, ifname
                ));
                capability_args.insert(DEVICE_INFO_CAPABILITY.into(), json!(file));
            }
            plan.attachments.push(Attachment {
                network,
                ifname,
                is_default: false,
                config: list.to_value(),
                capability_args,
                selection: Some(sel_json),
                result: None,
            });
        }
        Ok(plan)
    }

    /// The plan of a DEL that found no cache entry (the cache was lost, or ADD never got as far as planning):
    /// everything that still resolves. What does not is named in the log and, where the cluster answered, in
    /// an event on the pod; the DEL goes on without it (docs/conformance.md, "DEL without a cache"). The flag
    /// says whether the cluster answered every question: if it did not, what is left may still resolve later,
    /// so the DEL must not be recorded as complete.
    fn replan_for_del(&self) -> (AttachmentPlan, bool) {
        let mut unresolved = Vec::new();
        let pod = match (&self.inv.pod, self.fx.cluster) {
            (Some(pod_ref), Some(cluster)) => match cluster.pod(pod_ref) {
                Ok(pod) => Some(pod),
                Err(e) => {
                    unresolved.push(PlexusError::from(e).context("the pod's own networks"));
                    None
                }
            },
            _ => None,
        };
        let plan = self
            .plan(pod.as_ref(), Unplannable::Skip(&mut unresolved))
            .unwrap_or_else(|e| {
                // Skip reports every failure through `unresolved`; nothing else fails.
                tracing::warn!(container = %self.inv.container_id, "DEL without a cached plan: {e}");
                AttachmentPlan::new(&self.inv.container_id, None, "", None)
            });
        if unresolved.is_empty() {
            return (plan, true);
        }
        let names: Vec<String> = unresolved.iter().map(ToString::to_string).collect();
        let message = bounded(format!(
            "DEL without a cached plan released {} network(s); cannot release what does not resolve any more: {}",
            plan.attachments.len(),
            names.join("; ")
        ));
        tracing::warn!(container = %self.inv.container_id, "{}: {message}", self.pod_label());
        let cluster_answered = !unresolved.iter().any(is_unavailable);
        if let (Some(cluster), Some(pod_ref), true) =
            (self.fx.cluster, self.inv.pod.as_ref(), cluster_answered)
        {
            let _ = cluster.record_warning(pod_ref, TEARDOWN_INCOMPLETE, &message);
        }
        (plan, cluster_answered)
    }

    /// The pod's selections after parsing (spec 4.1) and policy hooks (spec 7.4).
    fn selections(&self, pod: &Pod) -> Result<Vec<Selection>, PlexusError> {
        let Some(raw) = pod.networks_annotation() else {
            return Ok(Vec::new());
        };
        let policy = if self.inv.conf.ignore_invalid_selections {
            InvalidSelectionPolicy::Ignore
        } else {
            InvalidSelectionPolicy::Fail
        };
        let parsed = parse_selection_annotation(raw, &pod.namespace, policy)
            // The caller names the pod.
            .map_err(|e| PlexusError::Config(e.to_string()))?;
        if parsed.selections.len() > MAX_SELECTIONS {
            return Err(PlexusError::Config(format!(
                "the networks annotation selects {} networks; at most {MAX_SELECTIONS} are allowed",
                parsed.selections.len()
            )));
        }
        if let Some(ignored) = &parsed.ignored {
            tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), "ignoring the invalid networks annotation: {ignored}");
        }
        if self.fx.hooks.is_empty() {
            return Ok(parsed.selections);
        }
        let input: Vec<Value> = parsed.selections.iter().map(Selection::to_json).collect();
        match self.fx.hooks.policy(pod, input)? {
            PolicyVerdict::Deny { hook, reason } => Err(PlexusError::PolicyDenied(format!(
                "selection rejected by policy hook {hook:?}: {reason}"
            ))),
            PolicyVerdict::Admit(list) => {
                let sels = list
                    .iter()
                    .enumerate()
                    .map(|(i, v)| Selection::from_json(v, &pod.namespace, i))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| PlexusError::HookFault(format!("policy hook output: {e}")))?;
                validate_selections(&sels)
                    .map_err(|e| PlexusError::HookFault(format!("policy hook output: {e}")))?;
                Ok(sels)
            }
        }
    }

    /// `pod ns/name: network ns/net (ifname)`, how errors name an attachment.
    fn attachment_label(&self, att: &Attachment) -> String {
        format!(
            "{}: network {} ({})",
            self.pod_label(),
            att.network,
            att.ifname
        )
    }

    /// DEL of the first `upto` attachments of `plan`, in reverse; all are attempted.
    ///
    /// An attachment without a result never finished ADD (it failed, was never reached, or plexus died during
    /// it, or the plan was rebuilt for a DEL without cache): it gets its DEL, but a failure is only logged. A
    /// plugin that cannot undo its own failed ADD (macvlan with a missing master) would otherwise make every
    /// DEL of the pod fail forever.
    fn teardown(&self, plan: &AttachmentPlan, upto: usize) -> Vec<PlexusError> {
        let mut errors = Vec::new();
        for att in plan.attachments[..upto].iter().rev() {
            match self.detach(att) {
                Err(e) if att.result.is_none() => {
                    tracing::warn!(container = %plan.container_id, "DEL of an attachment that never finished ADD failed: {e}");
                }
                Err(e) => errors.push(e),
                Ok(()) => {}
            }
        }
        errors
    }

    /// DEL of one attachment's list, with its cached result.
    fn detach(&self, att: &Attachment) -> Result<(), PlexusError> {
        cached_list(att)
            .and_then(|list| {
                self.delegator().del(
                    &list,
                    &self.rt(&att.ifname),
                    &att.capability_args,
                    att.result.as_ref(),
                )
            })
            .map_err(|e| e.context(format!("network {} ({})", att.network, att.ifname)))?;
        // Device Information Specification 4.2.1: the implementation deletes the file on DEL.
        if let Some(file) = device_info_path(att) {
            match std::fs::remove_file(file) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!("cannot remove device-info file {file}: {e}")
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// The delegate configuration list an attachment was planned with.
fn cached_list(att: &Attachment) -> Result<NetworkConfigList, PlexusError> {
    NetworkConfigList::parse(&att.config)
        .map_err(|e| PlexusError::Decode(format!("cached config: {e}")))
}

fn parse_list(config: &Value, default_name: &str) -> Result<NetworkConfigList, PlexusError> {
    NetworkConfigList::parse_with_default_name(config, Some(default_name))
        .map_err(|e| PlexusError::Config(e.to_string()))
}

fn read_conf_dir(dir: &Path) -> Vec<OnDiskConf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut confs: Vec<OnDiskConf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
        .filter_map(|e| {
            let file_name = e.file_name().to_string_lossy().into_owned();
            std::fs::read_to_string(e.path())
                .ok()
                .map(|contents| OnDiskConf {
                    file_name,
                    contents,
                })
        })
        .collect();
    confs.sort_by(|a, b| a.file_name.cmp(&b.file_name));
    confs
}

/// Spec 6.1.2: block until the readiness indicator exists, for a bounded time.
fn wait_ready(inv: &Invocation) -> Result<(), PlexusError> {
    let Some(file) = &inv.conf.readiness_indicator_file else {
        return Ok(());
    };
    let deadline = Instant::now() + inv.conf.readiness_timeout;
    loop {
        if file.exists() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(PlexusError::NotReady(format!(
                "cluster network not ready: readiness indicator file {} did not appear within {:?}",
                file.display(),
                inv.conf.readiness_timeout
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Verifies that requested ips and mac were honoured (spec v1.0 4.1.2.1.3/4: "must assign").
fn verify_requested(att: &Attachment, result: &Value) -> Result<(), PlexusError> {
    let Some(sel) = &att.selection else {
        return Ok(());
    };
    let status = network_status(&att.network, Some(result), &att.ifname, false);
    let have: BTreeSet<IpAddr> = status
        .ips
        .iter()
        .filter_map(|ip| ip.split('/').next()?.parse().ok())
        .collect();
    for ip in sel
        .get("ips")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let addr: Option<IpAddr> = ip.split('/').next().and_then(|a| a.parse().ok());
        if !addr.is_some_and(|a| have.contains(&a)) {
            return Err(PlexusError::Config(format!(
                "requested ip {ip} was not assigned to {} (result has {:?})",
                att.ifname, status.ips
            )));
        }
    }
    if let Some(mac) = sel.get("mac").and_then(Value::as_str) {
        if !status
            .mac
            .as_deref()
            .is_some_and(|m| m.eq_ignore_ascii_case(mac))
        {
            return Err(PlexusError::Config(format!(
                "requested mac {mac} was not assigned to {} (result has {})",
                att.ifname,
                status.mac.as_deref().unwrap_or("no mac")
            )));
        }
    }
    Ok(())
}

fn default_route_of(att: &Attachment) -> Option<Vec<IpAddr>> {
    let list = att.selection.as_ref()?.get("default-route")?.as_array()?;
    Some(
        list.iter()
            .filter_map(|v| v.as_str()?.parse().ok())
            .collect(),
    )
}

/// ADD: returns the cluster network's result in the requested cniVersion.
pub fn add(inv: &Invocation, fx: &Effects<'_>) -> Result<Value, PlexusError> {
    let ctx = Ctx::new(inv, fx);
    wait_ready(inv)?;
    let _lock = ContainerLock::acquire(&inv.conf.run_dir, &inv.container_id)?;
    DeletedLog::new(&inv.conf.run_dir).forget(&inv.container_id);
    let cache = AttachmentCache::open(&inv.conf.cache_dir)?;
    if let Some(stale) = cache.load(&inv.container_id)? {
        // ADD twice without DEL breaks the runtime contract; tear the old attachments down so nothing leaks.
        tracing::warn!(container = %inv.container_id, "ADD over an existing plan: tearing the old attachments down first");
        let errors = ctx.teardown(&stale, stale.attachments.len());
        if !errors.is_empty() {
            return Err(PlexusError::Many {
                summary: "cannot replace the previous attachments".into(),
                errors,
            });
        }
        cache.remove(&inv.container_id)?;
    }
    let pod = match (&inv.pod, fx.cluster) {
        (Some(pod_ref), Some(cluster)) => Some(cluster.pod(pod_ref)?),
        _ => None,
    };
    let mut plan = ctx
        .plan(pod.as_ref(), Unplannable::Fail)
        .map_err(|e| e.context(ctx.pod_label()))?;
    cache.store(&plan)?;

    let rollback = |plan: &AttachmentPlan, upto: usize, err: PlexusError| -> PlexusError {
        let errors = ctx.teardown(plan, upto);
        let cleanup = if errors.is_empty() {
            match cache.remove(&inv.container_id) {
                Ok(()) => return err,
                Err(e) => PlexusError::Many {
                    summary: "removing the plan also failed".into(),
                    errors: vec![e],
                },
            }
        } else {
            PlexusError::Many {
                summary: format!(
                    "rolling back also failed (the plan stays in {} for DEL)",
                    cache.path_of(&inv.container_id).display()
                ),
                errors,
            }
        };
        PlexusError::Cleanup {
            source: Box::new(err),
            cleanup: Box::new(cleanup),
        }
    };

    let mut journal = cache.journal(&inv.container_id);
    for i in 0..plan.attachments.len() {
        let att = &plan.attachments[i];
        let label = ctx.attachment_label(att);
        let outcome = cached_list(att).and_then(|list| {
            ctx.delegator()
                .add(&list, &ctx.rt(&att.ifname), &att.capability_args)
        });
        match outcome {
            Ok(result) => {
                let verified = verify_requested(att, &result);
                // Kept even when rejected: the delegate did attach, so its DEL gets the result and counts.
                plan.attachments[i].result = Some(result);
                if let Err(e) = verified {
                    return Err(rollback(&plan, i + 1, e.context(label)));
                }
                if let Err(e) =
                    journal.record(i, plan.attachments[i].result.as_ref().expect("set above"))
                {
                    return Err(rollback(&plan, i + 1, e));
                }
            }
            Err(e) => return Err(rollback(&plan, i + 1, e.context(label))),
        }
    }

    let n = plan.attachments.len();
    let recorded: Vec<Option<Value>> = plan.attachments.iter().map(|a| a.result.clone()).collect();
    if let Err(e) = finish_add(&ctx, &mut plan, pod.as_ref()) {
        return Err(rollback(&plan, n, e.context(ctx.pod_label())));
    }
    // finish_add may have moved default routes between the results; DEL and CHECK must see them as printed.
    for (i, before) in recorded.iter().enumerate() {
        let now = plan.attachments[i].result.as_ref().expect("set above");
        if before.as_ref() != Some(now) {
            if let Err(e) = journal.record(i, now) {
                return Err(rollback(&plan, n, e));
            }
        }
    }
    let cluster_result = plan.attachments[0].result.as_ref().expect("set above");
    let out = CniResult::parse(cluster_result)
        .and_then(|r| r.to_json(inv.conf.cni_version))
        .map_err(|e| {
            PlexusError::Version(format!(
                "cluster network result as cniVersion {}: {e}",
                inv.conf.cni_version
            ))
        });
    match out {
        Ok(v) => Ok(v),
        Err(e) => Err(rollback(&plan, n, e)),
    }
}

/// After every delegate succeeded: default route, status entries, status hooks, publish.
fn finish_add(
    ctx: &Ctx<'_>,
    plan: &mut AttachmentPlan,
    pod: Option<&Pod>,
) -> Result<(), PlexusError> {
    let routed = plan
        .attachments
        .iter()
        .find_map(|a| default_route_of(a).map(|g| (a.network.clone(), a.ifname.clone(), g)));
    if let Some((network, target, gateways)) = routed {
        let netns = ctx.inv.netns.as_deref().unwrap_or_default();
        let clear: Vec<String> = plan.attachments.iter().map(|a| a.ifname.clone()).collect();
        ctx.fx
            .podnet
            .set_default_route(netns, &target, &gateways, &clear)
            .map_err(|e| e.context(format!("default-route of network {network} ({target})")))?;
        crate::podnet::reroute_results(
            plan.attachments
                .iter_mut()
                .filter_map(|a| Some((a.ifname.as_str(), a.result.as_mut()?))),
            &target,
            &gateways,
            &clear,
        );
    }
    let plan = &*plan;
    let (Some(pod), Some(pod_ref)) = (pod, ctx.inv.pod.as_ref()) else {
        return Ok(());
    };
    let statuses: Vec<NetworkStatus> = plan
        .attachments
        .iter()
        .map(|a| {
            let mut st = network_status(&a.network, a.result.as_ref(), &a.ifname, a.is_default);
            if st.device_info.is_none() {
                st.device_info = read_device_info(a);
            }
            if let Some(gws) = default_route_of(a) {
                st.default_route = status_default_route(Some(&gws), a.result.as_ref());
            }
            st
        })
        .collect();
    let mut entries: Vec<Value> = statuses.iter().map(NetworkStatus::to_json).collect();
    if !ctx.fx.hooks.is_empty() {
        entries = ctx.fx.hooks.status(pod, entries)?;
        validate_status_entries(&entries)
            .map_err(|e| PlexusError::HookFault(format!("status hook output: {e}")))?;
    }
    let value = serde_json::to_string(&entries).map_err(|e| PlexusError::Decode(e.to_string()))?;
    if let Some(cluster) = ctx.fx.cluster {
        // The status annotation is informative (spec 5: "may publish"); a failure to write it must not
        // fail a pod whose networks are all attached.
        if let Err(e) = cluster.write_status(pod_ref, &value) {
            tracing::error!(pod = %pod_ref, "cannot publish network-status: {e}");
        }
        for (a, st) in plan
            .attachments
            .iter()
            .zip(&statuses)
            .filter(|(a, _)| !a.is_default)
        {
            let _ = cluster.record_attachment(
                pod_ref,
                &format!("Add {} [{}] from {}", a.ifname, st.ips.join(","), a.network),
            );
        }
    }
    Ok(())
}

/// DEL: from the cache when there is one; every attachment is torn down even if some fail (spec 7.2).
///
/// Without a cache entry: a DEL repeated after a completed one is answered from `runDir` alone (no cluster
/// request); otherwise plexus re-plans what still resolves. A DEL with nothing to tear down succeeds whatever
/// the state of the disk.
pub fn del(inv: &Invocation, fx: &Effects<'_>) -> Result<(), PlexusError> {
    let ctx = Ctx::new(inv, fx);
    let _lock = ContainerLock::acquire(&inv.conf.run_dir, &inv.container_id)?;
    let deleted = DeletedLog::new(&inv.conf.run_dir);
    let cache = AttachmentCache::open_existing(&inv.conf.cache_dir)?;
    let cached = match &cache {
        Some(cache) => cache.load(&inv.container_id)?,
        None => None,
    };
    let from_cache = cached.is_some();
    let (plan, complete) = match cached {
        Some(plan) => (plan, true),
        None if deleted.contains(&inv.container_id) => {
            tracing::debug!(container = %inv.container_id, "DEL repeated after a completed DEL: nothing to do");
            return Ok(());
        }
        None => ctx.replan_for_del(),
    };
    let errors = ctx.teardown(&plan, plan.attachments.len());
    if !errors.is_empty() {
        return Err(PlexusError::Many {
            summary: format!(
                "{}: {} of {} detachments failed",
                ctx.pod_label(),
                errors.len(),
                plan.attachments.len()
            ),
            errors,
        });
    }
    if let Some(cache) = &cache {
        match cache.remove(&inv.container_id) {
            Ok(()) => {}
            Err(e) if from_cache => return Err(e),
            // Nothing was cached, so at most a temp file of a killed ADD is left; a disk that cannot remove
            // it (read-only) must not fail a DEL that had nothing else to do.
            Err(e) => tracing::warn!(container = %inv.container_id, "{e}"),
        }
    }
    // A DEL that could not ask the cluster is not recorded: the runtime's next DEL re-plans, and releases
    // what resolves once the cluster answers again.
    if complete {
        deleted.record(&inv.container_id);
    }
    Ok(())
}

/// CHECK: every cached attachment, in order, against its cached result.
pub fn check(inv: &Invocation, fx: &Effects<'_>) -> Result<(), PlexusError> {
    if !inv.conf.cni_version.supports_check() {
        return Err(PlexusError::Version(format!(
            "CHECK is not supported by cniVersion {}",
            inv.conf.cni_version
        )));
    }
    let ctx = Ctx::new(inv, fx);
    let _lock = ContainerLock::acquire(&inv.conf.run_dir, &inv.container_id)?;
    let cache = AttachmentCache::open(&inv.conf.cache_dir)?;
    let plan = cache
        .load(&inv.container_id)?
        .ok_or_else(|| PlexusError::Delegate {
            code: crate::error::CODE_UNKNOWN_CONTAINER,
            msg: format!(
                "no attachments are known for container {}",
                inv.container_id
            ),
            details: String::new(),
        })?;
    for att in &plan.attachments {
        let label = ctx.attachment_label(att);
        let list = cached_list(att)?;
        let result = att
            .result
            .as_ref()
            .ok_or_else(|| PlexusError::Config(format!("{label}: was never attached")))?;
        ctx.delegator()
            .check(&list, &ctx.rt(&att.ifname), &att.capability_args, result)
            .map_err(|e| e.context(label))?;
    }
    Ok(())
}

/// STATUS (CNI 1.1): ready when the readiness indicator exists and the cluster network answers.
pub fn status(inv: &Invocation, fx: &Effects<'_>) -> Result<(), PlexusError> {
    if let Some(file) = &inv.conf.readiness_indicator_file {
        if !file.exists() {
            return Err(PlexusError::NotAvailable(format!(
                "readiness indicator file {} does not exist",
                file.display()
            )));
        }
    }
    let ctx = Ctx::new(inv, fx);
    let (_, list) = ctx
        .resolve_ref(&inv.conf.cluster_network, None)
        .map_err(|e| PlexusError::NotAvailable(format!("cluster network: {e}")))?;
    ctx.delegator().status(&list, &ctx.rt(""))
}

/// GC (CNI 1.1): tears down cached plans of containers the runtime no longer knows, then passes GC on to
/// every 1.1.0 delegate network with the attachments that remain valid for it.
///
/// CNI 1.1: GC exists from cniVersion 1.1.0, and `cni.dev/valid-attachments` is required; without it nothing
/// can tell which attachments are in use, so GC refuses rather than read it as "none are".
pub fn gc(inv: &Invocation, fx: &Effects<'_>) -> Result<(), PlexusError> {
    if !inv.conf.cni_version.supports_status_gc() {
        return Err(PlexusError::Version(format!(
            "GC is not supported by cniVersion {}",
            inv.conf.cni_version
        )));
    }
    let Some(valid_attachments) = &inv.conf.valid_attachments else {
        return Err(PlexusError::Config(
            "GC needs cni.dev/valid-attachments (the attachments still in use); it is missing"
                .into(),
        ));
    };
    let ctx = Ctx::new(inv, fx);
    let valid: BTreeSet<&str> = valid_attachments
        .iter()
        .map(|a| a.container_id.as_str())
        .collect();
    let cache = AttachmentCache::open(&inv.conf.cache_dir)?;
    let mut errors = Vec::new();
    // The runtime's own clean-up is a good time for the record of completed DELs too.
    DeletedLog::new(&inv.conf.run_dir).prune();
    // Temp files of plans a killed ADD never renamed; under the container's lock no ADD is writing one.
    for (id, name) in cache.temp_files()? {
        let _lock = ContainerLock::acquire(&inv.conf.run_dir, &id)?;
        if let Err(e) = cache.remove_temp(&name) {
            errors.push(e);
        }
    }
    let mut per_network: BTreeMap<String, (Value, Vec<Value>)> = BTreeMap::new();
    for id in cache.container_ids()? {
        let _lock = ContainerLock::acquire(&inv.conf.run_dir, &id)?;
        // One unreadable plan must not stop the collection of every other container.
        let plan = match cache.load(&id) {
            Ok(Some(plan)) => plan,
            Ok(None) => continue,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        let is_valid = valid.contains(id.as_str());
        // Every network plexus knows of gets GC, even with no valid attachment left (it may then collect
        // everything it still holds).
        for a in &plan.attachments {
            let name = a
                .config
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let entry = per_network
                .entry(name)
                .or_insert_with(|| (a.config.clone(), Vec::new()));
            if is_valid {
                entry.1.push(json!({"containerID": id, "ifname": a.ifname}));
            }
        }
        if is_valid {
            continue;
        }
        let mut del_inv = inv.clone();
        del_inv.container_id = id.clone();
        del_inv.netns = plan.netns.clone();
        let del_ctx = Ctx::new(&del_inv, fx);
        let errs = del_ctx.teardown(&plan, plan.attachments.len());
        if errs.is_empty() {
            cache.remove(&id)?;
        } else {
            errors.extend(errs);
        }
    }
    // The runtime's own pairs are the cluster network's attachments (its ifname is the runtime's), so the
    // cluster network is collected even when nothing is cached, and never loses a pair the runtime uses.
    match ctx.resolve_ref(&inv.conf.cluster_network, None) {
        Ok((_, list)) => {
            let entry = per_network
                .entry(list.name.clone())
                .or_insert_with(|| (list.to_value(), Vec::new()));
            for a in valid_attachments {
                let pair = json!({"containerID": a.container_id, "ifname": a.ifname});
                if !entry.1.contains(&pair) {
                    entry.1.push(pair);
                }
            }
        }
        Err(e) => tracing::warn!("GC cannot resolve the cluster network: {e}"),
    }
    for (config, attachments) in per_network.values() {
        if let Ok(list) = NetworkConfigList::parse(config) {
            if let Err(e) = ctx.delegator().gc(&list, &ctx.rt(""), attachments) {
                errors.push(e.context(format!("GC of network {}", list.name)));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(PlexusError::Many {
            summary: "garbage collection failed".into(),
            errors,
        })
    }
}

/// The version the runtime asked for, for replies (falls back to the newest).
pub fn reply_version(requested: Option<&str>) -> CniVersion {
    requested
        .and_then(|v| v.parse().ok())
        .unwrap_or(CniVersion::V1_1_0)
}
