//! ADD's publish step: the network-status annotation (spec 5) after the status hooks, the attachment events, and
//! the reply the runtime prints (the cluster network's result in the cniVersion it asked for).

use std::collections::BTreeMap;

use plexus_core::cni::CniResult;
use plexus_core::spec::dra::{ClaimName, DeviceNetworkData};
use plexus_core::spec::status::{network_status, status_default_route, NetworkStatus};
use plexus_core::spec::Pod;
use serde_json::Value;

use crate::cache::{Attachment, AttachmentPlan};
use crate::device_info::read_device_info;
use crate::effects::Effects;
use crate::error::PlexusError;
use crate::invocation::Invocation;

/// The network-status annotation (spec 5), after the status hooks; with the cluster's events.
pub(crate) fn publish_status(
    inv: &Invocation,
    fx: &Effects<'_>,
    plan: &AttachmentPlan,
    pod: Option<&Pod>,
) -> Result<(), PlexusError> {
    publish_announcing(inv, fx, plan, pod, 0)
}

/// [`publish_status`], announcing in events only the attachments from index `announce_from` on (those a change
/// of a running pod added).
pub(crate) fn publish_announcing(
    inv: &Invocation,
    fx: &Effects<'_>,
    plan: &AttachmentPlan,
    pod: Option<&Pod>,
    announce_from: usize,
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
            if let Some(gws) = a.default_route() {
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
        let added: Vec<String> = plan
            .attachments
            .iter()
            .zip(&statuses)
            .skip(announce_from)
            .filter(|(a, _)| !a.is_default)
            .map(|(a, st)| format!("Add {} [{}] from {}", a.ifname, st.ips.join(","), a.network))
            .collect();
        // The status annotation is informative (spec 5: "may publish"); a failure to write it must not
        // fail a pod whose networks are all attached.
        let claims = claim_statuses(plan, true);
        let node = pod.node_name.as_deref();
        if let Err(e) = cluster.publish(pod_ref, node, &value, &added, &claims) {
            tracing::error!(pod = %pod_ref, "cannot publish network-status: {e}");
        }
    }
    Ok(())
}

/// After a DEL: the claims' device status the ADD wrote, taken back (an empty list per claim) through the cluster
/// source, which for a DEL hands it to the node daemon and never waits long on the API server
/// ([`crate::daemon::client::DelCluster`]); a failure is logged and the entries stay (they are informative, as
/// network-status).
pub(crate) fn take_back_claim_statuses(inv: &Invocation, fx: &Effects<'_>, plan: &AttachmentPlan) {
    let (Some(cluster), Some(pod_ref)) = (fx.cluster, inv.pod.as_ref()) else {
        return;
    };
    for (claim, devices) in claim_statuses(plan, false) {
        if let Err(e) = cluster.write_claim_status(pod_ref, &claim, &devices) {
            tracing::warn!(pod = %pod_ref, claim = %claim, "cannot take back the claim's device status: {e}");
        }
    }
}

/// Each claim an attachment's device came from, with Plexus's entries: the attachments' network data after an ADD
/// (`attached`), none after a DEL.
fn claim_statuses(
    plan: &AttachmentPlan,
    attached: bool,
) -> Vec<(ClaimName, Vec<DeviceNetworkData>)> {
    let mut by_claim: BTreeMap<ClaimName, Vec<DeviceNetworkData>> = BTreeMap::new();
    for att in &plan.attachments {
        let Some(used) = att.device.as_ref().and_then(|d| d.claim.as_ref()) else {
            continue;
        };
        let entries = by_claim.entry(used.claim.clone()).or_default();
        if attached {
            entries.push(network_data(att, used.key.clone(), used.share_id.clone()));
        }
    }
    by_claim.into_iter().collect()
}

/// What the attachment made of its device: the pod-side interface's name and MAC and its addresses with their
/// prefix length, from the CNI result.
fn network_data(
    att: &Attachment,
    key: plexus_core::spec::dra::DeviceKey,
    share_id: Option<String>,
) -> DeviceNetworkData {
    let mut data = DeviceNetworkData {
        key,
        share_id,
        interface_name: Some(att.ifname.clone()),
        ips: Vec::new(),
        hardware_address: None,
    };
    let Some(result) = att.result.as_ref().and_then(|r| CniResult::parse(r).ok()) else {
        return data;
    };
    let pod_side = result
        .interfaces
        .iter()
        .position(|i| i.sandbox.as_deref().is_some_and(|s| !s.is_empty()) && i.name == att.ifname)
        .or_else(|| {
            result
                .interfaces
                .iter()
                .position(|i| i.sandbox.as_deref().is_some_and(|s| !s.is_empty()))
        });
    if let Some(i) = pod_side {
        data.hardware_address = result.interfaces[i].mac.clone().filter(|m| !m.is_empty());
    }
    data.ips = result
        .ips
        .iter()
        .filter(|ip| match (ip.interface, pod_side) {
            (Some(n), Some(i)) => n as usize == i,
            _ => true,
        })
        .map(|ip| ip.address.to_string())
        .collect();
    data
}

/// The cluster network's result (the plan's first attachment), in the cniVersion the runtime asked for.
pub(crate) fn reply(inv: &Invocation, plan: &AttachmentPlan) -> Result<Value, PlexusError> {
    let version = inv.conf.cni_version;
    let result = plan
        .attachments
        .first()
        .and_then(|a| a.result.as_ref())
        .ok_or_else(|| PlexusError::config("clusterNetwork", "the plan has no result for it"))?;
    CniResult::parse(result)
        .and_then(|r| r.to_json(version))
        .map_err(|e| {
            PlexusError::Version(format!(
                "cluster network result as cniVersion {version}: {e}"
            ))
        })
}
