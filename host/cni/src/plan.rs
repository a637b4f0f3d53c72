//! Planning (spec 6.2, 4, 3.4): from the invocation and the pod to the [`AttachmentPlan`], every network
//! resolved to the delegate list it runs with: the cluster network, `defaultNetworks`, then the pod's
//! selections after the policy hooks, each through the resolver hooks or the 3.4.1 rules.

use std::collections::BTreeMap;
use std::path::Path;

use plexus_cluster::{Cluster, PodEvent};
use plexus_core::cni::NetworkConfigList;
use plexus_core::spec::naming::IfNameAllocator;
use plexus_core::spec::resolve::{resolve_nad, OnDiskConf};
use plexus_core::spec::selection::{parse_selection_annotation, InvalidSelectionPolicy, Selection};
use plexus_core::spec::{check_capabilities, merge_cni_args, NetworkAttachmentDefinition, Pod};
use serde_json::{json, Map, Value};

use crate::cache::{Attachment, AttachmentPlan, Device, DEVICE_INFO_CAPABILITY};
use crate::devices::{ClaimNetworks, DeviceBook, FromClaim};
use crate::podresources::RESOURCE_NAME_ANNOTATION;

/// The key a device's ID is passed under (plugin conf and runtimeConfig).
const DEVICE_ID: &str = "deviceID";
pub use crate::compat::{with_missing_version, MISSING_CNI_VERSION, MULTUS_DEFAULT_NETWORK};
use crate::conf::{read_capped, STDIN_CAP};
use crate::effects::Effects;
use crate::error::{bounded, PlexusError};
use crate::invocation::{ClusterBy, Invocation};
use plexus_hooks::PolicyOutcome;

/// What planning does with a network it cannot resolve: an ADD fails on it, a DEL without a cache skips it
/// and names it.
pub(crate) enum Unplannable<'e> {
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
pub fn is_unavailable(e: &PlexusError) -> bool {
    match e {
        PlexusError::Cluster(c) => c.is_transient(),
        PlexusError::Context { source, .. } => is_unavailable(source),
        _ => false,
    }
}

/// Plans one invocation's attachments; reads `confDir` at most once.
pub(crate) struct Planner<'a> {
    inv: &'a Invocation,
    fx: &'a Effects<'a>,
    on_disk: std::cell::OnceCell<Vec<OnDiskConf>>,
}

/// The pod's selections (after the policy hooks), and which of them its claims ask for, by network.
#[derive(Debug, Default)]
pub(crate) struct Selected {
    pub(crate) selections: Vec<Selection>,
    from_claims: ClaimNetworks,
}

impl<'a> Planner<'a> {
    pub(crate) fn new(inv: &'a Invocation, fx: &'a Effects<'a>) -> Self {
        Self {
            inv,
            fx,
            on_disk: std::cell::OnceCell::new(),
        }
    }

    /// The on-disk confs of `confDir`, read once, in file-name order. A missing directory is empty.
    fn on_disk(&self) -> &[OnDiskConf] {
        self.on_disk
            .get_or_init(|| read_conf_dir(&self.inv.conf.conf_dir))
    }

    fn cluster(&self) -> Result<&'a dyn Cluster, PlexusError> {
        self.fx.cluster.ok_or_else(|| {
            PlexusError::config(
                "cluster",
                "a NetworkAttachmentDefinition is needed but no cluster source is configured",
            )
        })
    }

    /// Resolves `clusterNetwork`/`defaultNetworks` entries: an absolute path, `ns/name` of a NAD, or a name
    /// found in `confDir` first and then as a NAD in `plexusNamespace`. Returns (status name, list).
    pub(crate) fn resolve_ref(
        &self,
        reference: &str,
        pod: Option<&Pod>,
    ) -> Result<(String, NetworkConfigList), PlexusError> {
        if reference.starts_with('/') {
            let file = self.inv.conf.compat.conf_file(Path::new(reference))?;
            let reference = file.to_string_lossy();
            let reference = reference.as_ref();
            // A conf file is held to the limit of a conf on stdin.
            let text =
                read_capped(Path::new(reference), STDIN_CAP).map_err(|source| PlexusError::Io {
                    path: reference.into(),
                    source,
                })?;
            let value: Value = serde_json::from_slice(&text).map_err(|e| {
                PlexusError::config(
                    format!("network configuration {reference}"),
                    format!("invalid JSON: {e}"),
                )
            })?;
            let list = NetworkConfigList::parse(&self.versioned(&value))
                .map_err(PlexusError::from)
                .and_then(no_delegating_plugin)
                .map_err(|e| e.context(format!("network configuration {reference}")))?;
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
                    let list = self.parse_list(&found.config, reference)?;
                    return Ok((list.name.clone(), list));
                }
                if self.fx.cluster.is_none() {
                    return Err(PlexusError::config(
                        format!("network {reference:?}"),
                        format!(
                            "is not in {} and no cluster source is configured",
                            self.inv.conf.conf_dir.display()
                        ),
                    ));
                }
                (
                    self.inv.conf.plexus_namespace.clone(),
                    reference.to_string(),
                )
            }
        };
        let nad = self.cluster()?.nad(&ns, &name)?;
        let list = self.resolve_nad_config(&nad, None, pod, None)?;
        Ok((format!("{ns}/{name}"), list))
    }

    fn versioned(&self, config: &Value) -> Value {
        self.inv.conf.compat.versioned(config)
    }

    fn parse_list(
        &self,
        config: &Value,
        default_name: &str,
    ) -> Result<NetworkConfigList, PlexusError> {
        parse_list(&self.versioned(config), default_name)
    }

    /// Under [`crate::conf::Compat::Multus`], the network the pod's `v1.multus-cni.io/default-network` names instead of the
    /// cluster network: one NAD, `name` or `namespace/name` (a bare name is in `plexusNamespace`, as Multus reads
    /// it in its own namespace), resolved like a selection's. `None` without the annotation or outside that mode.
    fn pod_default_network(
        &self,
        pod: Option<&Pod>,
    ) -> Option<Result<(String, NetworkConfigList), PlexusError>> {
        let the_pod = pod?;
        let value = self.inv.conf.compat.pod_default_network(the_pod)?;
        let resolve = || {
            let bad = |why: String| PlexusError::config(MULTUS_DEFAULT_NETWORK, why);
            let mut sels =
                plexus_core::spec::parse_selections(value, &self.inv.conf.plexus_namespace)
                    .map_err(|e| bad(e.to_string()))?;
            if sels.len() != 1 {
                return Err(bad(format!(
                    "names {} networks; it takes exactly one",
                    sels.len()
                )));
            }
            let sel = self.admitted_default_network(the_pod, sels.remove(0))?;
            let nad = self.cluster()?.nad(&sel.namespace, &sel.name)?;
            let list = self.resolve_nad_config(&nad, Some(&sel), pod, None)?;
            Ok((sel.namespaced_name(), list))
        };
        Some(resolve())
    }

    /// The pod's default network (Multus compatibility) as the policy hooks admit it: the pod chooses its cluster
    /// network there, so the hooks judge that choice as they judge any selection (one network in, one out).
    fn admitted_default_network(
        &self,
        pod: &Pod,
        sel: Selection,
    ) -> Result<Selection, PlexusError> {
        if self.fx.hooks.is_empty() {
            return Ok(sel);
        }
        match self
            .fx
            .hooks
            .policy(pod, vec![sel], plexus_hooks::SelectionDevices::new())?
        {
            PolicyOutcome::Deny { hook, reason } => Err(PlexusError::PolicyDenied(format!(
                "{MULTUS_DEFAULT_NETWORK} rejected by policy hook {hook:?}: {reason}"
            ))),
            PolicyOutcome::Admit(mut admitted) if admitted.len() == 1 => Ok(admitted.remove(0)),
            PolicyOutcome::Admit(admitted) => Err(PlexusError::PolicyDenied(format!(
                "{MULTUS_DEFAULT_NETWORK}: the policy hooks answered {} networks for the pod's one default network",
                admitted.len()
            ))),
        }
    }

    /// Spec 3.4.1 with resolver hooks first: a hook may supply or rewrite the config.
    fn resolve_nad_config(
        &self,
        nad: &NetworkAttachmentDefinition,
        selection: Option<&Selection>,
        pod: Option<&Pod>,
        device: Option<&Device>,
    ) -> Result<NetworkConfigList, PlexusError> {
        let label = format!("NetworkAttachmentDefinition {}/{}", nad.namespace, nad.name);
        if let (false, Some(pod)) = (self.fx.hooks.is_empty(), pod) {
            let current = match &nad.config {
                Some(text) => Some(serde_json::from_str::<Value>(text).map_err(|e| {
                    PlexusError::config(
                        label.clone(),
                        format!("spec.config is not valid JSON: {e}"),
                    )
                })?),
                None => None,
            };
            let sel = selection
                .cloned()
                .unwrap_or_else(|| Selection::new(&nad.namespace, &nad.name));
            let claim_device = device.and_then(|d| d.claim.as_ref());
            if let Some(cfg) =
                self.fx
                    .hooks
                    .resolve(pod, &sel, nad, current.as_ref(), claim_device)?
            {
                return self
                    .parse_list(&cfg, &nad.name)
                    .map_err(|e| e.context(format!("{label} (from resolver hook)")));
            }
        }
        let resolved = resolve_nad(nad, self.on_disk())?;
        self.parse_list(&resolved.config, &nad.name)
            .map_err(|e| e.context(label))
    }

    /// Builds the full plan: cluster network, defaultNetworks, then the pod's selections (spec 6.2, 4), each
    /// network's device taken from `devices`. What cannot be planned fails the plan or is skipped, as
    /// `unplannable` says.
    pub(crate) fn plan(
        &self,
        pod: Option<&Pod>,
        devices: &mut DeviceBook<'_>,
        mut unplannable: Unplannable<'_>,
    ) -> Result<AttachmentPlan, PlexusError> {
        let inv = self.inv;
        let mut plan = AttachmentPlan::new(
            &inv.container_id,
            inv.netns.as_deref(),
            inv.conf.cni_version.as_str(),
            inv.pod.clone(),
        );
        plan.runtime = Some(crate::cache::RuntimeContext {
            networks: pod.and_then(|p| p.networks_annotation().map(str::to_string)),
            ..inv.context.clone()
        });
        let out = &mut plan.attachments;
        out.extend(self.cluster_attachment(pod, &mut unplannable)?);
        if inv.pod.is_none() {
            return Ok(plan);
        }
        let mut ifnames = IfNameAllocator::new(&inv.ifname);
        self.default_attachments(pod, &mut ifnames, out, &mut unplannable)?;
        let Some(pod) = pod else { return Ok(plan) };
        let Some(selected) = unplannable.handle(self.selections(pod, devices))? else {
            return Ok(plan);
        };
        for sel in selected.selections {
            let from_claim = selected.from_claims.get(&sel.namespaced_name());
            let planned = self.selected_attachment(
                sel,
                from_claim,
                pod,
                devices,
                &mut ifnames,
                &mut unplannable,
            );
            out.extend(planned?);
        }
        Ok(plan)
    }

    /// The cluster network's attachment: the pod's default network under Multus compatibility, else
    /// `clusterNetwork`.
    fn cluster_attachment(
        &self,
        pod: Option<&Pod>,
        unplannable: &mut Unplannable<'_>,
    ) -> Result<Option<Attachment>, PlexusError> {
        let inv = self.inv;
        let own_default = self.pod_default_network(pod);
        // The runtime attached its cluster network already: a pod cannot choose another.
        if let (Some(_), ClusterBy::Runtime(_)) = (&own_default, &inv.cluster_by) {
            return Err(PlexusError::config(
                MULTUS_DEFAULT_NETWORK,
                "the runtime's own CNI attaches the cluster network on this node (NRI mode): a pod cannot \
                 replace it",
            ));
        }
        let cluster = own_default
            .unwrap_or_else(|| self.resolve_ref(&inv.conf.cluster_network, pod))
            .map_err(|e| e.context("cluster network"));
        Ok(unplannable.handle(cluster)?.map(|(name, list)| Attachment {
            network: name,
            ifname: inv.ifname.clone(),
            is_default: true,
            config: list,
            // Spec 7.5: the runtime's runtimeConfig goes to the cluster network only.
            capability_args: inv.conf.runtime_config.clone(),
            selection: None,
            device: None,
            result: match &inv.cluster_by {
                ClusterBy::Runtime(result) => result.clone(),
                ClusterBy::Plexus => None,
            },
            external: matches!(inv.cluster_by, ClusterBy::Runtime(_)),
        }))
    }

    /// The attachments of `defaultNetworks`, added to `out` (none for the pods Multus gives none).
    fn default_attachments(
        &self,
        pod: Option<&Pod>,
        ifnames: &mut IfNameAllocator,
        out: &mut Vec<Attachment>,
        unplannable: &mut Unplannable<'_>,
    ) -> Result<(), PlexusError> {
        let inv = self.inv;
        // Multus gives pods of its system namespaces no default networks.
        let gets_defaults = inv.pod.as_ref().is_none_or(|p| {
            inv.conf
                .compat
                .gives_default_networks(&p.namespace, &inv.conf.system_namespaces)
        });
        for reference in inv.conf.default_networks.iter().filter(|_| gets_defaults) {
            let resolved = self
                .resolve_ref(reference, pod)
                .map_err(|e| e.context(format!("default network {reference:?}")));
            let ifname = ifnames.next(None).map_err(PlexusError::from);
            let Some((name, list)) = unplannable.handle(resolved)? else {
                continue;
            };
            let Some(ifname) = unplannable.handle(ifname)? else {
                continue;
            };
            out.push(Attachment {
                network: name,
                ifname,
                is_default: false,
                config: list,
                capability_args: Map::new(),
                selection: None,
                device: None,
                result: None,
                external: false,
            });
        }
        Ok(())
    }

    /// The attachment of one of the pod's selections, with its device from `devices`; `None` where
    /// `unplannable` skips it.
    fn selected_attachment(
        &self,
        sel: Selection,
        from_claim: Option<&FromClaim>,
        pod: &Pod,
        devices: &mut DeviceBook<'_>,
        ifnames: &mut IfNameAllocator,
        unplannable: &mut Unplannable<'_>,
    ) -> Result<Option<Attachment>, PlexusError> {
        let network = sel.namespaced_name();
        let in_claim = |e: PlexusError| match from_claim {
            Some(f) => e.context(format!(
                "ResourceClaim {} (request {:?})",
                f.claim, f.request
            )),
            None => e,
        };
        let carried = from_claim.and_then(|f| f.carried.as_ref());
        let fetched = self.fetch_nad(&sel, carried).map_err(in_claim);
        // The interface name is taken whether or not the network resolves, so a DEL that skips one
        // network gives the others the names their ADD gave them.
        let ifname = ifnames
            .next(sel.interface.as_deref())
            .map_err(|e| PlexusError::from(e).context(format!("network {network}")));
        let Some((nad, resource)) = unplannable.handle(fetched)? else {
            return Ok(None);
        };
        let Some(ifname) = unplannable.handle(ifname)? else {
            return Ok(None);
        };
        // The device first: resolver hooks see it (`host.selection-device`).
        let device = match (devices.take(&sel, resource, from_claim), &unplannable) {
            (Ok(device), _) => device,
            (Err(e), Unplannable::Fail) => return Err(e.context(format!("network {network}"))),
            // A DEL without a cache tears down without the device rather than not at all.
            (Err(e), Unplannable::Skip(_)) => {
                tracing::warn!(network = %network, "planning the DEL without its device: {e}");
                None
            }
        };
        let resolved = self
            .resolve_fetched(&sel, &nad, pod, device.as_ref())
            .map_err(in_claim);
        let Some(list) = unplannable.handle(resolved)? else {
            return Ok(None);
        };
        Ok(Some(self.attachment(sel, ifname, list, device)))
    }

    /// A selection's NAD, with the device-plugin resource it names, if any. Errors name the network.
    /// `carried`: the NAD a CNI configuration carried in a claim stands for (no object of the cluster is read).
    fn fetch_nad(
        &self,
        sel: &Selection,
        carried: Option<&NetworkAttachmentDefinition>,
    ) -> Result<(NetworkAttachmentDefinition, Option<String>), PlexusError> {
        let network = sel.namespaced_name();
        let nad = match carried {
            Some(nad) => nad.clone(),
            None => self
                .cluster()?
                .nad(&sel.namespace, &sel.name)
                .map_err(|e| PlexusError::from(e).context(format!("network {network}")))?,
        };
        let resource = nad
            .annotations
            .get(RESOURCE_NAME_ANNOTATION)
            .filter(|r| !r.trim().is_empty())
            .cloned();
        Ok((nad, resource))
    }

    /// A fetched NAD resolved for `sel` (resolver hooks, then spec 3.4.1) and checked against the capabilities
    /// the selection needs. Errors name the network.
    fn resolve_fetched(
        &self,
        sel: &Selection,
        nad: &NetworkAttachmentDefinition,
        pod: &Pod,
        device: Option<&Device>,
    ) -> Result<NetworkConfigList, PlexusError> {
        let network = sel.namespaced_name();
        let list = self
            .resolve_nad_config(nad, Some(sel), Some(pod), device)
            .map_err(|e| e.context(format!("network {network}")))?;
        check_capabilities(&sel.required_capabilities(), &list.plugins, &network)?;
        Ok(list)
    }

    /// The attachment of a resolved selection on `ifname`: its `cni-args` merged into every plugin, its
    /// runtimeConfig, the device and the device-info file.
    fn attachment(
        &self,
        sel: Selection,
        ifname: String,
        mut list: NetworkConfigList,
        device: Option<Device>,
    ) -> Attachment {
        let inv = self.inv;
        if let Some(args) = sel.delegate_cni_args() {
            for plugin in &mut list.plugins {
                merge_cni_args(plugin, &args);
            }
        }
        let mut capability_args = sel.runtime_config();
        if let Some(d) = device.as_ref().filter(|d| !d.id.is_empty()) {
            // As SR-IOV's plugin and Multus expect it: `deviceID` in every plugin of the list, and in
            // runtimeConfig for plugins that declare the `deviceID` capability (host-device).
            for plugin in &mut list.plugins {
                plugin.insert(DEVICE_ID.into(), json!(d.id));
            }
            capability_args.insert(DEVICE_ID.into(), json!(d.id));
        }
        if list.capabilities_declared(DEVICE_INFO_CAPABILITY) {
            // Device Information Specification 4.2 / 5.1: a file unique per attachment.
            let file = inv.conf.device_info_dir.join(format!(
                "{}-{}-{}-{}-device-info.json",
                sel.namespace, sel.name, inv.container_id, ifname
            ));
            capability_args.insert(DEVICE_INFO_CAPABILITY.into(), json!(file));
        }
        Attachment {
            network: sel.namespaced_name(),
            ifname,
            is_default: false,
            config: list,
            capability_args,
            selection: Some(sel),
            device,
            result: None,
            external: false,
        }
    }

    /// The attachment of a selection added to a running pod, on the interface name the change chose. A NAD
    /// that names a device-plugin resource is refused: kubelet allocates a pod's devices when it starts.
    pub(crate) fn added_attachment(
        &self,
        sel: Selection,
        ifname: String,
        pod: &Pod,
    ) -> Result<Attachment, PlexusError> {
        let (nad, resource) = self.fetch_nad(&sel, None)?;
        if let Some(resource) = resource {
            return Err(PlexusError::config(
                format!("network {}", sel.namespaced_name()),
                format!(
                    "uses device-plugin resource {resource}, which is allocated when the pod starts: it \
                     cannot be added to a running pod"
                ),
            ));
        }
        let list = self.resolve_fetched(&sel, &nad, pod, None)?;
        Ok(self.attachment(sel, ifname, list, None))
    }

    /// The plan of a DEL that found no cache entry (the cache was lost, or ADD never got as far as planning):
    /// everything that still resolves. What does not is named in the log and, where the cluster answered, in
    /// an event on the pod; the DEL goes on without it (docs/conformance.md, "DEL without a cache"). The flag
    /// says whether the cluster answered every question: if it did not, what is left may still resolve later,
    /// so the DEL must not be recorded as complete.
    pub(crate) fn replan_for_del(&self) -> (AttachmentPlan, bool) {
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
        // Claims that cannot be read leave their networks out, and the annotation's networks are released
        // without their claims' devices; the DEL is not complete then.
        let mut devices = DeviceBook::read(self.inv, self.fx, pod.as_ref()).unwrap_or_else(|e| {
            unresolved.push(e);
            DeviceBook::without_claims(self.inv, self.fx)
        });
        let plan = self
            .plan(pod.as_ref(), &mut devices, Unplannable::Skip(&mut unresolved))
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
        tracing::warn!(container = %self.inv.container_id, "{}: {message}", self.inv.pod_label());
        let cluster_answered = !unresolved.iter().any(is_unavailable);
        if let (Some(cluster), Some(pod_ref), true) =
            (self.fx.cluster, self.inv.pod.as_ref(), cluster_answered)
        {
            let node = pod.as_ref().and_then(|p| p.node_name.as_deref());
            let event = PodEvent::warning(pod_ref, node, TEARDOWN_INCOMPLETE, &message);
            let _ = cluster.record(&event);
        }
        (plan, cluster_answered)
    }

    /// The pod's selections after parsing (spec 4.1), with the networks its ResourceClaims ask for, and policy
    /// hooks (spec 7.4).
    pub(crate) fn selections(
        &self,
        pod: &Pod,
        devices: &DeviceBook<'_>,
    ) -> Result<Selected, PlexusError> {
        let Some(raw) = pod.networks_annotation() else {
            // No annotation: the claims' networks alone, if they ask for any.
            let mut selections = Vec::new();
            let from_claims =
                devices.claim_networks(&mut selections, &self.inv.conf.carried_config_drivers)?;
            if selections.is_empty() {
                return Ok(Selected::default());
            }
            return self.admitted(pod, selections, from_claims, devices);
        };
        let policy = if self.inv.conf.ignore_invalid_selections {
            InvalidSelectionPolicy::Ignore
        } else {
            InvalidSelectionPolicy::Fail
        };
        let raw = self.inv.conf.compat.selection_annotation(raw, pod);
        let parsed = parse_selection_annotation(&raw, &pod.namespace, policy)
            // The caller names the pod.
            .map_err(PlexusError::from)?;
        if let Some(ignored) = &parsed.ignored {
            tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), "ignoring the invalid networks annotation: {ignored}");
        }
        let mut selections = parsed.selections;
        let from_claims =
            devices.claim_networks(&mut selections, &self.inv.conf.carried_config_drivers)?;
        if selections.len() > MAX_SELECTIONS {
            return Err(PlexusError::config(
                plexus_core::spec::objects::NETWORKS_ANNOTATION,
                format!(
                    "selects {} networks; at most {MAX_SELECTIONS} are allowed",
                    selections.len()
                ),
            ));
        }
        self.admitted(pod, selections, from_claims, devices)
    }

    /// The selections the policy hooks admit (spec 7.4). The hooks see the device of each network a claim asks
    /// for (`host.selection-device`).
    fn admitted(
        &self,
        pod: &Pod,
        selections: Vec<Selection>,
        from_claims: ClaimNetworks,
        devices: &DeviceBook<'_>,
    ) -> Result<Selected, PlexusError> {
        let mut shown = plexus_hooks::SelectionDevices::new();
        if !self.fx.hooks.is_empty() {
            for (network, f) in &from_claims {
                let found = devices.peek(f);
                if let (Some(d), Some((ns, name))) = (found, network.split_once('/')) {
                    shown.insert((ns.to_string(), name.to_string()), d);
                }
            }
        }
        match self.fx.hooks.policy(pod, selections, shown)? {
            PolicyOutcome::Deny { hook, reason } => Err(PlexusError::PolicyDenied(format!(
                "selection rejected by policy hook {hook:?}: {reason}"
            ))),
            PolicyOutcome::Admit(selections) => Ok(Selected {
                selections,
                from_claims,
            }),
        }
    }
}

/// Every delegate configuration passes here: from a conf file, a NAD, a claim or a resolver hook.
fn parse_list(config: &Value, default_name: &str) -> Result<NetworkConfigList, PlexusError> {
    NetworkConfigList::parse_with_default_name(config, Some(default_name))
        .map_err(PlexusError::from)
        .and_then(no_delegating_plugin)
}

/// `list`, unless one of its plugins is a delegating plugin: a configuration of type `plexus` (or Multus) would
/// run a plexus that takes `binDir` and `confDir` from that configuration, so whoever wrote it would choose what
/// the node execs as root. Types resolve in the node conf's `binDir` and `CNI_PATH` only.
fn no_delegating_plugin(list: NetworkConfigList) -> Result<NetworkConfigList, PlexusError> {
    match list.delegating_plugin() {
        None => Ok(list),
        Some(ty) => Err(PlexusError::config(
            format!("plugin type {ty:?}"),
            "is a delegating plugin that reads its own binDir from its configuration; a delegate is never plexus \
             itself or another delegating plugin (plugins run only from the node conf's binDir and CNI_PATH)",
        )),
    }
}

pub(crate) fn read_conf_dir(dir: &Path) -> Vec<OnDiskConf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut confs: Vec<OnDiskConf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
        .filter_map(|e| {
            let file_name = e.file_name().to_string_lossy().into_owned();
            // A file over the limit is skipped like one that cannot be read.
            read_capped(&e.path(), STDIN_CAP)
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok())
                .map(|contents| OnDiskConf {
                    file_name,
                    contents,
                })
        })
        .collect();
    confs.sort_by(|a, b| a.file_name.cmp(&b.file_name));
    confs
}
