//! Changing a running sandbox's attachments, for the node daemon's networks that follow the annotation: the
//! same lock, plan, journal, delegates and teardown as ADD and DEL, so that the runtime's own ADD and DEL of
//! the sandbox are serialized with a change, and the pod's final DEL tears down whatever a change attached.
//!
//! What to change is decided by the caller from the cached plan and the pod's selections (after parsing and
//! the policy hooks, [`Sandbox::wanted`]); this module carries it out, all or nothing for what it adds:
//!
//! 1. every added selection is planned as ADD plans one (NAD, resolver hooks, capability checks, `cni-args`,
//!    runtimeConfig); one that cannot be planned fails the change before anything runs;
//! 2. the plan with the new attachments appended is stored before the first delegate runs (a process killed
//!    during the change leaves a plan the final DEL tears everything down from);
//! 3. the added attachments are attached in order; if one fails, those attached are torn down in reverse and
//!    the plan as it was is stored again: nothing moved;
//! 4. the removed attachments are torn down (from the cache: no NAD or `interface` key is needed), last first;
//!    one whose DEL fails stays in the plan, so that the pod's DEL tries again;
//! 5. the plan is stored with the new annotation, and the network-status annotation is published for what is
//!    attached now.

use std::time::Duration;

use plexus_core::spec::{Pod, Selection};

use crate::attach::{attach_from, route_default};
use crate::cache::{AttachmentCache, AttachmentPlan};
use crate::devices::DeviceBook;
use crate::effects::Effects;
use crate::error::PlexusError;
use crate::invocation::Invocation;
use crate::lock::ContainerLock;
use crate::plan::Planner;
use crate::publish::publish_announcing;
use crate::teardown::Teardown;

/// What a change does to a sandbox.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Edit {
    /// Selections to attach, in order, each on the interface name the caller chose.
    pub attach: Vec<(Selection, String)>,
    /// Plan indexes of attachments to detach.
    pub detach: Vec<usize>,
}

/// What a change did: `network (ifname)` of each attachment added and removed.
#[derive(Debug, Default)]
pub struct Applied {
    pub attached: Vec<String>,
    pub detached: Vec<String>,
    /// Detachments whose DEL failed: they stay in the plan for the pod's DEL.
    pub failed: Vec<PlexusError>,
}

/// A running sandbox, opened for a change under its container's lock.
pub struct Sandbox {
    /// The invocation the sandbox's ADD had, rebuilt from the plan's runtime context.
    pub inv: Invocation,
    /// The cached plan, with every result of the journal.
    pub plan: AttachmentPlan,
    cache: AttachmentCache,
    _lock: ContainerLock,
}

impl Sandbox {
    /// Opens container `container_id`'s sandbox from the cache of `cache_dir`: `None` when it has no plan (no
    /// sandbox, or one torn down meanwhile). The lock is the runtime's own (the conf's `runDir`), waited for at
    /// most `lock_wait`; `base_env` is the environment the delegates get besides the `CNI_*` variables.
    pub fn open(
        cache_dir: &std::path::Path,
        container_id: &str,
        base_env: &[(String, String)],
        lock_wait: Duration,
    ) -> Result<Option<Sandbox>, PlexusError> {
        let Some(cache) = AttachmentCache::open_existing(cache_dir)? else {
            return Ok(None);
        };
        // The plan names the runtime's conf, and with it the lock's directory; read again under the lock.
        let Some(unlocked) = cache.load(container_id)? else {
            return Ok(None);
        };
        let inv = Invocation::of_plan(&unlocked, base_env)?;
        let lock = ContainerLock::acquire_within(&inv.conf.run_dir, container_id, lock_wait)?;
        let Some(plan) = cache.load(container_id)? else {
            return Ok(None);
        };
        let inv = Invocation::of_plan(&plan, base_env)?;
        Ok(Some(Sandbox {
            inv,
            plan,
            cache,
            _lock: lock,
        }))
    }

    /// Whether the sandbox is up: its cluster network attached (an ADD that was killed leaves a plan without
    /// that result; its runtime repeats the ADD or tears it down).
    pub fn is_up(&self) -> bool {
        self.plan
            .attachments
            .first()
            .is_some_and(|a| a.is_default && a.result.is_some())
    }

    /// Repairs what a change killed in the middle left (the daemon's crash or `kill -9` during a change): its
    /// additions are in the plan without a result. Each gets its DEL (best effort: it may never have run) and
    /// leaves the plan, so that the next change attaches it again from the annotation. How many went.
    pub fn repair(&mut self, fx: &Effects<'_>) -> Result<usize, PlexusError> {
        let unfinished: Vec<usize> = (0..self.plan.attachments.len())
            .filter(|&i| {
                let a = &self.plan.attachments[i];
                !a.is_default && a.result.is_none()
            })
            .collect();
        if unfinished.is_empty() {
            return Ok(0);
        }
        let teardown = Teardown::of_invocation(&self.inv, fx);
        for &i in unfinished.iter().rev() {
            let att = self.plan.attachments.remove(i);
            // Without a result, a failed DEL is only logged.
            let _ = teardown.detach_settled(&att);
        }
        self.cache.store(&self.plan)?;
        Ok(unfinished.len())
    }

    /// The pod's `k8s.v1.cni.cncf.io/networks` annotation the plan was made from.
    pub fn networks(&self) -> Option<&str> {
        self.plan.runtime.as_ref()?.networks.as_deref()
    }

    /// The pod's selections as an ADD would take them now: parsed (spec 4.1) and through the policy hooks.
    pub fn wanted(&self, fx: &Effects<'_>, pod: &Pod) -> Result<Vec<Selection>, PlexusError> {
        let devices = DeviceBook::read(&self.inv, fx, Some(pod))?;
        Planner::new(&self.inv, fx)
            .selections(pod, &devices)
            .map(|s| s.selections)
    }

    /// Records that the plan matches `pod`'s annotation without changing any attachment (a change that asked
    /// for nothing, or only reordered the selections).
    pub fn settle(&mut self, pod: &Pod) -> Result<(), PlexusError> {
        record_networks(&mut self.plan, pod);
        self.cache.store(&self.plan)
    }

    /// Carries `edit` out (see the module docs). An error means nothing changed: what it attached was torn
    /// down again and the plan is as it was.
    pub fn apply(
        &mut self,
        fx: &Effects<'_>,
        pod: &Pod,
        edit: Edit,
    ) -> Result<Applied, PlexusError> {
        let inv = &self.inv;
        let label = inv.pod_label();
        let before = self.plan.clone();
        let planner = Planner::new(inv, fx);
        let mut plan = self.plan.clone();
        for (sel, ifname) in edit.attach {
            let att = planner
                .added_attachment(sel, ifname, pod)
                .map_err(|e| e.context(label.clone()))?;
            plan.attachments.push(att);
        }
        let from = before.attachments.len();
        let teardown = Teardown::of_invocation(inv, fx);
        if from < plan.attachments.len() {
            self.cache.store(&plan)?;
            let mut journal = self.cache.journal(&inv.container_id);
            let attached = attach_from(inv, fx, &mut plan, &mut journal, from).and_then(|()| {
                let routed = plan.attachments[from..]
                    .iter()
                    .any(|a| a.default_route().is_some());
                if routed {
                    route_default(inv, fx, &mut plan, &mut journal)
                        .map_err(|e| (plan.attachments.len(), e))
                } else {
                    Ok(())
                }
            });
            if let Err((upto, e)) = attached {
                let errors = teardown.run_range(&plan, from, upto);
                let restored = self.cache.store(&before);
                let e = e.context(label.clone());
                return Err(match (errors.is_empty(), restored) {
                    (true, Ok(())) => e,
                    (_, restored) => PlexusError::Cleanup {
                        source: Box::new(e),
                        cleanup: Box::new(PlexusError::Many {
                            summary: "rolling the change back also failed (the plan keeps the attachments \
                                      for the pod's DEL)"
                                .into(),
                            errors: errors.into_iter().chain(restored.err()).collect(),
                        }),
                    },
                });
            }
        }
        let mut applied = Applied {
            attached: plan.attachments[from..].iter().map(describe).collect(),
            ..Applied::default()
        };
        let mut detach = edit.detach;
        detach.sort_unstable();
        detach.dedup();
        let mut gone = Vec::new();
        for &i in detach.iter().rev() {
            let Some(att) = plan.attachments.get(i).filter(|a| !a.is_default) else {
                continue;
            };
            match teardown.detach_settled(att) {
                Ok(()) => {
                    applied.detached.push(describe(att));
                    gone.push(i);
                }
                Err(e) => applied.failed.push(e),
            }
        }
        // Highest index first, so the others keep theirs; all are below `from` (the plan before the change).
        let announce_from = from - gone.len();
        for i in gone {
            plan.attachments.remove(i);
        }
        record_networks(&mut plan, pod);
        self.cache.store(&plan)?;
        if let Err(e) = publish_announcing(inv, fx, &plan, Some(pod), announce_from) {
            tracing::warn!(pod = %label, "network-status after a change: {e}");
        }
        self.plan = plan;
        Ok(applied)
    }
}

/// Records in `plan` that its selections are `pod`'s annotation as it is now.
fn record_networks(plan: &mut AttachmentPlan, pod: &Pod) {
    if let Some(rt) = plan.runtime.as_mut() {
        rt.networks = pod.networks_annotation().map(str::to_string);
    }
}

fn describe(att: &crate::cache::Attachment) -> String {
    format!("{} ({})", att.network, att.ifname)
}
