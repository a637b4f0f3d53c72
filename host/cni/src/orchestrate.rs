//! The CNI verbs for a pod, each as its steps: ADD, DEL, CHECK, STATUS, GC.
//!
//! ADD reads top-down as a path through its own modules: wait for readiness (spec 6.1.2) and take the
//! container's lock (here), plan every attachment (`plan`: the cluster network, `defaultNetworks`, the
//! selections; spec 6.2, 4, 3.4), record the plan (`cache`), attach each attachment's delegates in order and set
//! the default route (`attach`; spec 7.1, 7.3, 4.1.2.1.9), publish the status annotation and reply (`publish`;
//! spec 5). A failure tears down what was attached, in reverse (`attach::rollback`, `teardown`). DEL tears down
//! from the cached plan, or from a re-plan when there is none (spec 7.2).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use plexus_cluster::PodEvent;
use plexus_core::cni::{ErrorCode, NetworkConfigList};
use serde_json::{json, Value};

use crate::attach::{attach_all, attachment_label, rollback, route_default};
use crate::cache::AttachmentCache;
use crate::deleted::DeletedLog;
use crate::devices::DeviceBook;
use crate::effects::Effects;
use crate::error::PlexusError;
use crate::invocation::Invocation;
use crate::lock::ContainerLock;
use crate::logging::phase;
use crate::plan::{Planner, Unplannable};
use crate::publish::{publish_status, reply};
use crate::runner::{Delegator, RuntimeParams};
use crate::teardown::Teardown;

/// The reason of the Warning event a failed ADD leaves on its pod.
pub const ADD_FAILED: &str = "NetworkAttachFailed";

/// ADD: returns the cluster network's result in the requested cniVersion. A failure leaves a Warning event on
/// the pod (see [`warn_pod`]).
pub fn add(inv: &Invocation, fx: &Effects<'_>) -> Result<Value, PlexusError> {
    // The pod's node once the pod is read: the node the event reports as from.
    let mut node = None;
    let added = add_steps(inv, fx, &mut node);
    if let Err(e) = &added {
        warn_pod(inv, fx, node.as_deref(), e);
    }
    added
}

/// A failed ADD's Warning event on its pod: the error's text, which names the network (`network ns/name
/// (ifname)`, the NAD, the policy hook and the selection it denied) and the cause. Whatever failed: planning,
/// a hook's fault, a policy denial, a delegate, the readiness wait. Not when the cluster source itself did not
/// answer: the event could not be posted either, and the ADD would wait for it.
fn warn_pod(inv: &Invocation, fx: &Effects<'_>, node: Option<&str>, e: &PlexusError) {
    let (Some(cluster), Some(pod)) = (fx.cluster, inv.pod.as_ref()) else {
        return;
    };
    if crate::plan::is_unavailable(e) {
        return;
    }
    let message = crate::error::bounded(e.to_string());
    if let Err(posted) = cluster.record(&PodEvent::warning(pod, node, ADD_FAILED, &message)) {
        tracing::debug!(pod = %pod, "could not post the {ADD_FAILED} event: {posted}");
    }
}

fn add_steps(
    inv: &Invocation,
    fx: &Effects<'_>,
    node: &mut Option<String>,
) -> Result<Value, PlexusError> {
    wait_ready(inv)?;
    let _lock = {
        let _p = phase("lock");
        ContainerLock::acquire(&inv.conf.run_dir, &inv.container_id)?
    };
    let (cache, teardown) = {
        let _p = phase("cache");
        DeletedLog::new(&inv.conf.run_dir).forget(&inv.container_id);
        let cache = AttachmentCache::open(&inv.conf.cache_dir)?;
        let teardown = Teardown::of_invocation(inv, fx);
        replace_stale_plan(inv, &cache, &teardown)?;
        (cache, teardown)
    };
    let pod = match (&inv.pod, fx.cluster) {
        (Some(pod_ref), Some(cluster)) => {
            let _p = phase("pod");
            Some(cluster.pod(pod_ref)?)
        }
        _ => None,
    };
    *node = pod.as_ref().and_then(|p| p.node_name.clone());
    let mut plan = {
        let _p = phase("plan");
        let mut devices =
            DeviceBook::read(inv, fx, pod.as_ref()).map_err(|e| e.context(inv.pod_label()))?;
        Planner::new(inv, fx)
            .plan(pod.as_ref(), &mut devices, Unplannable::Fail)
            .map_err(|e| e.context(inv.pod_label()))?
    };
    {
        let _p = phase("record");
        cache.store(&plan)?;
    }
    let mut journal = cache.journal(&inv.container_id);
    let attached = {
        let _p = phase("attach");
        attach_all(inv, fx, &mut plan, &mut journal)
    };
    if let Err((upto, e)) = attached {
        return Err(rollback(&cache, &teardown, &plan, upto, e));
    }
    let finished = {
        let _p = phase("route");
        route_default(inv, fx, &mut plan, &mut journal)
    }
    .and_then(|()| {
        let _p = phase("publish");
        publish_status(inv, fx, &plan, pod.as_ref())
    })
    .map_err(|e| e.context(inv.pod_label()))
    .and_then(|()| reply(inv, &plan));
    finished.map_err(|e| rollback(&cache, &teardown, &plan, plan.attachments.len(), e))
}

/// DEL: from the cache when there is one; every attachment is torn down even if some fail (spec 7.2).
///
/// Without a cache entry: a DEL repeated after a completed one is answered from `runDir` alone (no cluster
/// request); otherwise plexus re-plans what still resolves. A DEL with nothing to tear down succeeds whatever
/// the state of the disk.
pub fn del(inv: &Invocation, fx: &Effects<'_>) -> Result<(), PlexusError> {
    let _lock = {
        let _p = phase("lock");
        ContainerLock::acquire(&inv.conf.run_dir, &inv.container_id)?
    };
    let deleted = DeletedLog::new(&inv.conf.run_dir);
    let (cache, cached) = {
        let _p = phase("cache");
        let cache = AttachmentCache::open_existing(&inv.conf.cache_dir)?;
        let cached = match &cache {
            Some(cache) => cache.load(&inv.container_id)?,
            None => None,
        };
        (cache, cached)
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
    let errors = {
        let _p = phase("detach");
        Teardown::of_invocation(inv, fx).run(&plan, plan.attachments.len())
    };
    if !errors.is_empty() {
        return Err(PlexusError::Many {
            summary: format!(
                "{}: {} of {} detachments failed",
                inv.pod_label(),
                errors.len(),
                plan.attachments.len()
            ),
            errors,
        });
    }
    // The claims' device status written by the ADD goes with the attachments.
    crate::publish::take_back_claim_statuses(inv, fx, &plan);
    let _p = phase("forget");
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
    // What the runtime attached itself, its own CNI checks.
    for att in plan.attachments.iter().filter(|a| !a.external) {
        let label = attachment_label(inv, att);
        let result = att
            .result
            .as_ref()
            .ok_or_else(|| PlexusError::config(label.clone(), "was never attached"))?;
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
        return Err(PlexusError::config(
            "cni.dev/valid-attachments",
            "is missing; GC needs it (the attachments still in use)",
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

// ADD's own steps (the others are `plan`, `attach`, `cache` and `publish`).

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
