//! ADD's attach step: each attachment's delegates in order, every result journaled as it exists, the requested
//! addresses checked, the pod's default route set; and the rollback of what was attached when a later step
//! fails.

use std::collections::BTreeSet;
use std::net::IpAddr;

use serde_json::Value;

use crate::cache::{Attachment, AttachmentCache, AttachmentPlan, Journal};
use crate::effects::Effects;
use crate::error::PlexusError;
use crate::invocation::Invocation;
use crate::runner::{Delegator, RuntimeParams};
use crate::teardown::Teardown;
use plexus_core::spec::status::network_status;

/// Each attachment's delegates, one attachment after another (spec 7.3); each result is journaled as soon as
/// it exists. On failure: how many attachments to roll back (the failed one included), and why.
pub(crate) fn attach_all(
    inv: &Invocation,
    fx: &Effects<'_>,
    plan: &mut AttachmentPlan,
    journal: &mut Journal<'_>,
) -> Result<(), (usize, PlexusError)> {
    attach_from(inv, fx, plan, journal, 0)
}

/// [`attach_all`] from attachment `from` on (the attachments a change adds to a running pod).
pub(crate) fn attach_from(
    inv: &Invocation,
    fx: &Effects<'_>,
    plan: &mut AttachmentPlan,
    journal: &mut Journal<'_>,
    from: usize,
) -> Result<(), (usize, PlexusError)> {
    let delegator = Delegator { exec: fx.exec };
    for i in from..plan.attachments.len() {
        let att = &plan.attachments[i];
        if att.external {
            continue;
        }
        let label = attachment_label(inv, att);
        crate::device_info::offer_device_plugin_info(inv, att);
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
pub(crate) fn rollback(
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
pub(crate) fn route_default(
    inv: &Invocation,
    fx: &Effects<'_>,
    plan: &mut AttachmentPlan,
    journal: &mut Journal<'_>,
) -> Result<(), PlexusError> {
    let routed = plan.attachments.iter().find_map(|a| {
        a.default_route()
            .map(|g| (a.network.clone(), a.ifname.clone(), g))
    });
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
            return Err(PlexusError::config(
                "ips",
                format!(
                    "requested ip {ip} was not assigned to {} (result has {:?})",
                    att.ifname, status.ips
                ),
            ));
        }
    }
    if let Some(mac) = &sel.mac {
        if !status
            .mac
            .as_deref()
            .is_some_and(|m| m.eq_ignore_ascii_case(mac))
        {
            return Err(PlexusError::config(
                "mac",
                format!(
                    "requested mac {mac} was not assigned to {} (result has {})",
                    att.ifname,
                    status.mac.as_deref().unwrap_or("no mac")
                ),
            ));
        }
    }
    Ok(())
}

/// `pod ns/name: network ns/net (ifname)`, how errors name an attachment.
pub(crate) fn attachment_label(inv: &Invocation, att: &Attachment) -> String {
    format!(
        "{}: network {} ({})",
        inv.pod_label(),
        att.network,
        att.ifname
    )
}
