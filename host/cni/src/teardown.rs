//! Teardown: DEL of a plan's attachments in reverse, every one attempted (spec 7.2), for DEL, for ADD's
//! rollback and for GC.

use crate::cache::{Attachment, AttachmentPlan};
use crate::effects::Effects;
use crate::error::PlexusError;
use crate::invocation::{ClusterBy, Invocation};
use crate::runner::{Delegator, RuntimeParams};

/// Tears down the attachments of one container.
pub(crate) struct Teardown<'a> {
    inv: &'a Invocation,
    delegator: Delegator<'a>,
    container_id: &'a str,
    netns: Option<&'a str>,
}

impl<'a> Teardown<'a> {
    /// For the invocation's own container, in the namespace the runtime names (none at all, on a DEL after
    /// the namespace is gone).
    pub(crate) fn of_invocation(inv: &'a Invocation, fx: &'a Effects<'a>) -> Self {
        Self::of_container(inv, fx, &inv.container_id, inv.netns.as_deref())
    }

    /// For another container (GC), with the runtime's environment of this invocation.
    pub(crate) fn of_container(
        inv: &'a Invocation,
        fx: &'a Effects<'a>,
        container_id: &'a str,
        netns: Option<&'a str>,
    ) -> Self {
        Self {
            inv,
            delegator: Delegator { exec: fx.exec },
            container_id,
            netns,
        }
    }

    /// DEL of the first `upto` attachments of `plan`, in reverse; all are attempted.
    ///
    /// An attachment without a result never finished ADD (it failed, was never reached, or plexus died during
    /// it, or the plan was rebuilt for a DEL without cache): it gets its DEL, but a failure is only logged. A
    /// plugin that cannot undo its own failed ADD (macvlan with a missing master) would otherwise make every
    /// DEL of the pod fail forever.
    pub(crate) fn run(&self, plan: &AttachmentPlan, upto: usize) -> Vec<PlexusError> {
        self.run_range(plan, 0, upto)
    }

    /// DEL of attachments `from..upto` of `plan`, in reverse; all are attempted (see [`Self::run`]).
    pub(crate) fn run_range(
        &self,
        plan: &AttachmentPlan,
        from: usize,
        upto: usize,
    ) -> Vec<PlexusError> {
        plan.attachments[from..upto]
            .iter()
            .rev()
            .filter_map(|att| self.detach_settled(att).err())
            .collect()
    }

    /// DEL of one attachment; one without a result never finished ADD (see [`Self::run`]): its failure is only
    /// logged.
    pub(crate) fn detach_settled(&self, att: &Attachment) -> Result<(), PlexusError> {
        match self.detach(att) {
            Err(e) if att.result.is_none() => {
                tracing::warn!(container = %self.container_id, "DEL of an attachment that never finished ADD failed: {e}");
                Ok(())
            }
            done => done,
        }
    }

    /// DEL of one attachment's list, with its cached result. Nothing for one the runtime attached itself while
    /// the runtime's own CNI still runs (NRI mode): only when Plexus is the runtime's CNI plugin again (the node
    /// moved back to CNI mode) is that attachment Plexus's to delete, since the runtime now calls Plexus alone.
    pub(crate) fn detach(&self, att: &Attachment) -> Result<(), PlexusError> {
        if att.external && self.inv.cluster_by != ClusterBy::Plexus {
            return Ok(());
        }
        let rt = RuntimeParams {
            container_id: self.container_id,
            netns: self.netns,
            ..RuntimeParams::of(self.inv, &att.ifname)
        };
        self.delegator
            .del(&att.config, &rt, &att.capability_args, att.result.as_ref())
            .map_err(|e| e.context(format!("network {} ({})", att.network, att.ifname)))?;
        // Device Information Specification 4.2.1: the implementation deletes the file on DEL.
        if let Some(file) = att.device_info_file() {
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
