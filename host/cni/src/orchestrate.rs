//! The CNI verbs for a pod, each as its steps: ADD, DEL, CHECK, STATUS, GC.
//!
//! ADD: wait for readiness (spec 6.1.2), take the container's lock, plan every attachment (`plan`: the cluster
//! network, `defaultNetworks`, the selections; spec 6.2, 4, 3.4), persist the plan, run each attachment's
//! delegates in order (spec 7.1, 7.3), then the default route (4.1.2.1.9) and the status annotation (spec 5).
//! A failure tears down what was attached, in reverse (`teardown`). DEL tears down from the cached plan, or
//! from a re-plan when there is none (spec 7.2).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use plexus_cluster::Cluster;

use crate::podresources::{device_plugin_info_file, DeviceSource};
use plexus_core::cni::{CniResult, ErrorCode, NetworkConfigList};
use plexus_core::spec::status::{network_status, status_default_route, NetworkStatus};
use plexus_core::spec::Pod;
use serde_json::{json, Value};

use crate::cache::{Attachment, AttachmentCache, AttachmentPlan, Journal};
use crate::conf::read_capped;
use crate::deleted::DeletedLog;
use crate::error::PlexusError;
use crate::exec::Exec;
use crate::hooks::HookRunner;
use crate::invocation::Invocation;
use crate::lock::ContainerLock;
use crate::plan::{Planner, Unplannable};
use crate::podnet::PodNetwork;
use crate::runner::{Delegator, RuntimeParams};
use crate::teardown::Teardown;

/// Every outside effect orchestration has, behind its trait.
pub struct Effects<'a> {
    pub exec: &'a dyn Exec,
    pub cluster: Option<&'a dyn Cluster>,
    pub podnet: &'a dyn PodNetwork,
    pub hooks: &'a dyn HookRunner,
    /// The devices kubelet allocated to the pod, for NADs that name a device-plugin resource.
    pub devices: &'a dyn DeviceSource,
}

/// ADD: returns the cluster network's result in the requested cniVersion.
pub fn add(inv: &Invocation, fx: &Effects<'_>) -> Result<Value, PlexusError> {
    wait_ready(inv)?;
    let _lock = ContainerLock::acquire(&inv.conf.run_dir, &inv.container_id)?;
    DeletedLog::new(&inv.conf.run_dir).forget(&inv.container_id);
    let cache = AttachmentCache::open(&inv.conf.cache_dir)?;
    let teardown = Teardown::of_invocation(inv, fx);
    replace_stale_plan(inv, &cache, &teardown)?;
    let pod = match (&inv.pod, fx.cluster) {
        (Some(pod_ref), Some(cluster)) => Some(cluster.pod(pod_ref)?),
        _ => None,
    };
    let mut plan = Planner::new(inv, fx)
        .plan(pod.as_ref(), Unplannable::Fail)
        .map_err(|e| e.context(pod_label(inv)))?;
    cache.store(&plan)?;
    let mut journal = cache.journal(&inv.container_id);
    if let Err((upto, e)) = attach_all(inv, fx, &mut plan, &mut journal) {
        return Err(rollback(&cache, &teardown, &plan, upto, e));
    }
    let finished = route_default(inv, fx, &mut plan, &mut journal)
        .and_then(|()| publish_status(inv, fx, &plan, pod.as_ref()))
        .map_err(|e| e.context(pod_label(inv)))
        .and_then(|()| reply(inv, &plan));
    finished.map_err(|e| rollback(&cache, &teardown, &plan, plan.attachments.len(), e))
}

/// DEL: from the cache when there is one; every attachment is torn down even if some fail (spec 7.2).
///
/// Without a cache entry: a DEL repeated after a completed one is answered from `runDir` alone (no cluster
/// request); otherwise plexus re-plans what still resolves. A DEL with nothing to tear down succeeds whatever
/// the state of the disk.
pub fn del(inv: &Invocation, fx: &Effects<'_>) -> Result<(), PlexusError> {
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
        None => Planner::new(inv, fx).replan_for_del(),
    };
    let errors = Teardown::of_invocation(inv, fx).run(&plan, plan.attachments.len());
    if !errors.is_empty() {
        return Err(PlexusError::Many {
            summary: format!(
                "{}: {} of {} detachments failed",
                pod_label(inv),
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
    let _lock = ContainerLock::acquire(&inv.conf.run_dir, &inv.container_id)?;
    let cache = AttachmentCache::open(&inv.conf.cache_dir)?;
    let plan = cache
        .load(&inv.container_id)?
        .ok_or_else(|| PlexusError::Delegate {
            code: ErrorCode::UnknownContainer.code(),
            msg: format!(
                "no attachments are known for container {}",
                inv.container_id
            ),
            details: String::new(),
        })?;
    for att in &plan.attachments {
        let label = attachment_label(inv, att);
        let result = att
            .result
            .as_ref()
            .ok_or_else(|| PlexusError::Config(format!("{label}: was never attached")))?;
        Delegator { exec: fx.exec }
            .check(
                &att.config,
                &RuntimeParams::of(inv, &att.ifname),
                &att.capability_args,
                result,
            )
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
    let (_, list) = Planner::new(inv, fx)
        .resolve_ref(&inv.conf.cluster_network, None)
        .map_err(|e| PlexusError::NotAvailable(format!("cluster network: {e}")))?;
    Delegator { exec: fx.exec }.status(&list, &RuntimeParams::of(inv, ""))
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
    let mut per_network: BTreeMap<String, (NetworkConfigList, Vec<Value>)> = BTreeMap::new();
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
            let entry = per_network
                .entry(a.config.name.clone())
                .or_insert_with(|| (a.config.clone(), Vec::new()));
            if is_valid {
                entry.1.push(json!({"containerID": id, "ifname": a.ifname}));
            }
        }
        if is_valid {
            continue;
        }
        let errs = Teardown::of_container(inv, fx, &id, plan.netns.as_deref())
            .run(&plan, plan.attachments.len());
        if errs.is_empty() {
            cache.remove(&id)?;
        } else {
            errors.extend(errs);
        }
    }
    // The runtime's own pairs are the cluster network's attachments (its ifname is the runtime's), so the
    // cluster network is collected even when nothing is cached, and never loses a pair the runtime uses.
    match Planner::new(inv, fx).resolve_ref(&inv.conf.cluster_network, None) {
        Ok((_, list)) => {
            let entry = per_network
                .entry(list.name.clone())
                .or_insert_with(|| (list, Vec::new()));
            for a in valid_attachments {
                let pair = json!({"containerID": a.container_id, "ifname": a.ifname});
                if !entry.1.contains(&pair) {
                    entry.1.push(pair);
                }
            }
        }
        Err(e) => tracing::warn!("GC cannot resolve the cluster network: {e}"),
    }
    for (list, attachments) in per_network.values() {
        let gc = Delegator { exec: fx.exec }.gc(list, &RuntimeParams::of(inv, ""), attachments);
        if let Err(e) = gc {
            errors.push(e.context(format!("GC of network {}", list.name)));
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

// ADD's steps, in the order `add` takes them.

/// ADD twice without DEL breaks the runtime contract; the old attachments are torn down first so nothing leaks.
fn replace_stale_plan(
    inv: &Invocation,
    cache: &AttachmentCache,
    teardown: &Teardown<'_>,
) -> Result<(), PlexusError> {
    let Some(stale) = cache.load(&inv.container_id)? else {
        return Ok(());
    };
    tracing::warn!(container = %inv.container_id, "ADD over an existing plan: tearing the old attachments down first");
    let errors = teardown.run(&stale, stale.attachments.len());
    if !errors.is_empty() {
        return Err(PlexusError::Many {
            summary: "cannot replace the previous attachments".into(),
            errors,
        });
    }
    cache.remove(&inv.container_id)
}

/// Each attachment's delegates, one attachment after another (spec 7.3); each result is journaled as soon as
/// it exists. On failure: how many attachments to roll back (the failed one included), and why.
fn attach_all(
    inv: &Invocation,
    fx: &Effects<'_>,
    plan: &mut AttachmentPlan,
    journal: &mut Journal<'_>,
) -> Result<(), (usize, PlexusError)> {
    let delegator = Delegator { exec: fx.exec };
    for i in 0..plan.attachments.len() {
        let att = &plan.attachments[i];
        let label = attachment_label(inv, att);
        offer_device_plugin_info(inv, att);
        let rt = RuntimeParams::of(inv, &att.ifname);
        let result = delegator
            .add(&att.config, &rt, &att.capability_args)
            .map_err(|e| (i + 1, e.context(label.clone())))?;
        let accepted = verify_requested(att, &result)
            .map_err(|e| e.context(label))
            .and_then(|()| journal.record(i, &result));
        // Kept even when rejected: the delegate did attach, so its DEL gets the result and counts.
        plan.attachments[i].result = Some(result);
        accepted.map_err(|e| (i + 1, e))?;
    }
    Ok(())
}

/// Tears down the first `upto` attachments after `err`, and the plan with them; the error keeps `err`'s code.
fn rollback(
    cache: &AttachmentCache,
    teardown: &Teardown<'_>,
    plan: &AttachmentPlan,
    upto: usize,
    err: PlexusError,
) -> PlexusError {
    let errors = teardown.run(plan, upto);
    let cleanup = if errors.is_empty() {
        match cache.remove(&plan.container_id) {
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
                cache.path_of(&plan.container_id).display()
            ),
            errors,
        }
    };
    PlexusError::Cleanup {
        source: Box::new(err),
        cleanup: Box::new(cleanup),
    }
}

/// The `default-route` a selection asked for (spec 4.1.2.1.9): set in the pod, cleared from every other
/// interface, and the results rewritten (and journaled again) so DEL and CHECK see them as printed.
fn route_default(
    inv: &Invocation,
    fx: &Effects<'_>,
    plan: &mut AttachmentPlan,
    journal: &mut Journal<'_>,
) -> Result<(), PlexusError> {
    let routed = plan
        .attachments
        .iter()
        .find_map(|a| default_route_of(a).map(|g| (a.network.clone(), a.ifname.clone(), g)));
    let Some((network, target, gateways)) = routed else {
        return Ok(());
    };
    let netns = inv.netns.as_deref().unwrap_or_default();
    let clear: Vec<String> = plan.attachments.iter().map(|a| a.ifname.clone()).collect();
    fx.podnet
        .set_default_route(netns, &target, &gateways, &clear)
        .map_err(|e| e.context(format!("default-route of network {network} ({target})")))?;
    let before: Vec<Option<Value>> = plan.attachments.iter().map(|a| a.result.clone()).collect();
    crate::podnet::reroute_results(
        plan.attachments
            .iter_mut()
            .filter_map(|a| Some((a.ifname.as_str(), a.result.as_mut()?))),
        &target,
        &gateways,
        &clear,
    );
    for (i, (att, before)) in plan.attachments.iter().zip(&before).enumerate() {
        if let Some(now) = att
            .result
            .as_ref()
            .filter(|now| before.as_ref() != Some(*now))
        {
            journal.record(i, now)?;
        }
    }
    Ok(())
}

/// The network-status annotation (spec 5), after the status hooks; with the cluster's events.
fn publish_status(
    inv: &Invocation,
    fx: &Effects<'_>,
    plan: &AttachmentPlan,
    pod: Option<&Pod>,
) -> Result<(), PlexusError> {
    let (Some(pod), Some(pod_ref)) = (pod, inv.pod.as_ref()) else {
        return Ok(());
    };
    let statuses: Vec<NetworkStatus> = plan
        .attachments
        .iter()
        .map(|a| {
            let mut st = network_status(&a.network, a.result.as_ref(), &a.ifname, a.is_default);
            if st.device_info.is_none() {
                st.device_info = read_device_info(inv, a);
            }
            if let Some(gws) = default_route_of(a) {
                st.default_route = status_default_route(Some(&gws), a.result.as_ref());
            }
            st
        })
        .collect();
    let mut entries: Vec<Value> = statuses.iter().map(NetworkStatus::to_json).collect();
    if !fx.hooks.is_empty() {
        entries = fx.hooks.status(pod, entries)?;
    }
    let value = serde_json::to_string(&entries).map_err(PlexusError::from)?;
    if let Some(cluster) = fx.cluster {
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

/// The cluster network's result (the plan's first attachment), in the cniVersion the runtime asked for.
fn reply(inv: &Invocation, plan: &AttachmentPlan) -> Result<Value, PlexusError> {
    let version = inv.conf.cni_version;
    let result = plan
        .attachments
        .first()
        .and_then(|a| a.result.as_ref())
        .ok_or_else(|| PlexusError::Config("the plan has no cluster network result".into()))?;
    CniResult::parse(result)
        .and_then(|r| r.to_json(version))
        .map_err(|e| {
            PlexusError::Version(format!(
                "cluster network result as cniVersion {version}: {e}"
            ))
        })
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
    for ip in &sel.ips {
        let addr: Option<IpAddr> = ip.split('/').next().and_then(|a| a.parse().ok());
        if !addr.is_some_and(|a| have.contains(&a)) {
            return Err(PlexusError::Config(format!(
                "requested ip {ip} was not assigned to {} (result has {:?})",
                att.ifname, status.ips
            )));
        }
    }
    if let Some(mac) = &sel.mac {
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

/// The gateways of the attachment's `default-route` (4.1.2.1.9), if its selection asked for it.
fn default_route_of(att: &Attachment) -> Option<Vec<IpAddr>> {
    att.selection.as_ref()?.default_route.clone()
}

/// The most bytes of a device-info file plexus reads (the spec's objects are a few hundred bytes).
const DEVICE_INFO_CAP: usize = 64 << 10;

/// The device plugin's device-info file of the attachment's device, if it has one.
fn device_plugin_file(inv: &Invocation, att: &Attachment) -> Option<std::path::PathBuf> {
    let d = att.device.as_ref()?;
    Some(device_plugin_info_file(
        &inv.conf.device_plugin_info_dir,
        &d.resource,
        &d.id,
    ))
}

/// Device Information Specification 4.2.1: a plugin offered a device-info file, whose device came from a
/// device plugin, finds the device plugin's information in it (it may add to it or replace it).
fn offer_device_plugin_info(inv: &Invocation, att: &Attachment) {
    let (Some(cni_file), Some(dp_file)) = (att.device_info_file(), device_plugin_file(inv, att))
    else {
        return;
    };
    let Ok(text) = read_capped(&dp_file, DEVICE_INFO_CAP) else {
        return;
    };
    let cni_file = Path::new(cni_file);
    if let Some(dir) = cni_file.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = std::fs::write(cni_file, text) {
        tracing::warn!(file = %cni_file.display(), "cannot offer the device plugin's device-info: {e}");
    }
}

/// The attachment's device information (spec 5.3.8): what the plugin wrote into its device-info file, else
/// what the device plugin wrote for its device; only a valid object.
fn read_device_info(inv: &Invocation, att: &Attachment) -> Option<Value> {
    let parse = |path: &Path| {
        let text = read_capped(path, DEVICE_INFO_CAP).ok()?;
        let info: Value = serde_json::from_slice(&text).ok()?;
        info.get("type")
            .and_then(Value::as_str)
            .is_some()
            .then_some(info)
    };
    att.device_info_file()
        .and_then(|f| parse(Path::new(f)))
        .or_else(|| parse(&device_plugin_file(inv, att)?))
}

/// `pod ns/name`, or `container <id>` without a pod: how errors name what they happened to.
pub(crate) fn pod_label(inv: &Invocation) -> String {
    inv.pod.as_ref().map_or_else(
        || format!("container {}", inv.container_id),
        |p| format!("pod {p}"),
    )
}

/// `pod ns/name: network ns/net (ifname)`, how errors name an attachment.
fn attachment_label(inv: &Invocation, att: &Attachment) -> String {
    format!(
        "{}: network {} ({})",
        pod_label(inv),
        att.network,
        att.ifname
    )
}
