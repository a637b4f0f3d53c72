//! Networks that follow the annotation (hot-plug): what a change of a running pod's
//! `k8s.v1.cni.cncf.io/networks` annotation asks of its sandbox.
//!
//! This module is the decision alone, pure over the sandbox's cached plan and the new selections, so that it is
//! tested without processes: which attachments stay, which go, which come and under what interface name, and
//! which had a key other than their identity changed. The daemon's `dynamic` module carries a change out
//! (`plexus_cni::change`: the per-container lock, the planner, attach with rollback, detach, the cache).
//!
//! The rules:
//! - Only attachments made from a selection take part. The cluster network and the conf's `defaultNetworks`
//!   (spec 6) have none; the default-network annotation is not hot-pluggable.
//! - A selection's identity is its NAD (namespace and name) and its `interface` key as written. A cached
//!   attachment and a wanted selection with the same identity are the same attachment; they are matched in
//!   annotation order, so two selections of one NAD without `interface` keep their interfaces.
//! - Same identity, other keys changed (`ips`, `mac`, `cni-args`, `default-route`, `portMappings`,
//!   `bandwidth`, `ipam-claim-reference`, extensions): reported as `reattach`. A delegate has no verb to
//!   change an attachment in place, and detaching then attaching again cannot be undone if the new attach
//!   fails (the old address may be gone), so the daemon refuses such a change whole: remove the selection,
//!   then add it again.
//! - A cached attachment no wanted selection matches is detached: this works without an `interface` key in
//!   the annotation, and when the NAD is gone, since it runs from the cache.
//! - A wanted selection no cached attachment matches is attached, under its `interface` key or the first
//!   `net<N>` (from 1) no attachment of the sandbox has, before or after the change, and no other selection of
//!   the change takes. An `interface` key naming an interface the sandbox has before the change is refused,
//!   even one the same change detaches: the change attaches first (so that a failure leaves everything as it
//!   was), and never a name in use. The next change may take a name this one freed.

use std::collections::BTreeSet;

use plexus_cni::cache::AttachmentPlan;
use plexus_core::spec::Selection;

/// What one annotation change asks of a sandbox.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Change {
    /// Plan indexes of the attachments to detach, last first (teardown's order).
    pub detach: Vec<usize>,
    /// Plan indexes of attachments to detach and attach again with the new selection, same interface.
    pub reattach: Vec<(usize, Selection)>,
    /// Selections to attach, in annotation order, each with its interface name.
    pub attach: Vec<(Selection, String)>,
}

impl Change {
    /// Nothing to do: the sandbox already matches the annotation.
    pub fn is_empty(&self) -> bool {
        self.detach.is_empty() && self.reattach.is_empty() && self.attach.is_empty()
    }
}

/// Why a change cannot be made as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "selection {network} asks for interface {ifname}, which the pod's {holder} has (an interface name is \
         never reused while in use; a name a change frees can be taken by the next one)"
    )]
    InterfaceInUse {
        network: String,
        ifname: String,
        holder: String,
    },
    #[error("two selections ask for interface {0}")]
    DuplicateInterface(String),
}

/// The identity of a selection: its NAD and its `interface` key as written.
fn identity(s: &Selection) -> (&str, &str, Option<&str>) {
    (&s.namespace, &s.name, s.interface.as_deref())
}

/// The change that brings `plan`'s attachments to `wanted` (the pod's selections after parsing and policy).
pub fn diff(plan: &AttachmentPlan, wanted: &[Selection]) -> Result<Change, Refused> {
    let mut matched = vec![false; plan.attachments.len()];
    let mut change = Change::default();
    let mut unmatched_wanted = Vec::new();
    for w in wanted {
        let found = plan.attachments.iter().enumerate().find(|(i, a)| {
            !matched[*i]
                && a.selection
                    .as_ref()
                    .is_some_and(|s| identity(s) == identity(w))
        });
        match found {
            Some((i, a)) => {
                matched[i] = true;
                // Same identity; any other key changed means attaching again.
                if a.selection.as_ref() != Some(w) {
                    change.reattach.push((i, w.clone()));
                }
            }
            None => unmatched_wanted.push(w),
        }
    }
    // What goes: every attachment from a selection that nothing wanted matched.
    for (i, a) in plan.attachments.iter().enumerate().rev() {
        if a.selection.is_some() && !matched[i] {
            change.detach.push(i);
        }
    }
    // Names no new attachment may take: every name of the plan (attachments come before detachments).
    let mut taken: BTreeSet<String> = plan.attachments.iter().map(|a| a.ifname.clone()).collect();
    let mut explicit = BTreeSet::new();
    for w in &unmatched_wanted {
        if let Some(ifname) = &w.interface {
            if let Some(holder) = plan.attachments.iter().find(|a| &a.ifname == ifname) {
                return Err(Refused::InterfaceInUse {
                    network: format!("{}/{}", w.namespace, w.name),
                    ifname: ifname.clone(),
                    holder: format!("network {}", holder.network),
                });
            }
            if !explicit.insert(ifname.clone()) {
                return Err(Refused::DuplicateInterface(ifname.clone()));
            }
            taken.insert(ifname.clone());
        }
    }
    for w in unmatched_wanted {
        let ifname = match &w.interface {
            Some(name) => name.clone(),
            None => {
                let name = (1..)
                    .map(|n| format!("net{n}"))
                    .find(|n| !taken.contains(n))
                    .expect("an unused net<N> exists");
                taken.insert(name.clone());
                name
            }
        };
        change.attach.push((w.clone(), ifname));
    }
    Ok(change)
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexus_cni::cache::Attachment;
    use plexus_core::cni::NetworkConfigList;
    use plexus_core::spec::parse_selections;
    use serde_json::json;

    fn sel(annotation: &str) -> Vec<Selection> {
        parse_selections(annotation, "team-a").unwrap()
    }

    fn list(name: &str) -> NetworkConfigList {
        NetworkConfigList::parse(
            &json!({"cniVersion": "1.0.0", "name": name, "plugins": [{"type": "x"}]}),
        )
        .unwrap()
    }

    /// A sandbox: the cluster network on eth0, then one attachment per `(selection, ifname)`.
    fn plan(attached: &[(Selection, &str)]) -> AttachmentPlan {
        let mut p = AttachmentPlan::new("c1", Some("/run/netns/x"), "1.0.0", None);
        p.attachments.push(Attachment {
            network: "cluster-net".into(),
            ifname: "eth0".into(),
            is_default: true,
            config: list("cluster-net"),
            capability_args: Default::default(),
            selection: None,
            device: None,
            result: Some(json!({"cniVersion": "1.0.0"})),
            external: false,
        });
        for (s, ifname) in attached {
            p.attachments.push(Attachment {
                network: format!("{}/{}", s.namespace, s.name),
                ifname: ifname.to_string(),
                is_default: false,
                config: list(&s.name),
                capability_args: Default::default(),
                selection: Some(s.clone()),
                device: None,
                result: Some(json!({"cniVersion": "1.0.0"})),
                external: false,
            });
        }
        p
    }

    #[test]
    fn a_pod_that_started_without_selections_gets_the_next_free_names() {
        let p = plan(&[]);
        let c = diff(&p, &sel("net-a,net-b")).unwrap();
        assert!(c.detach.is_empty() && c.reattach.is_empty());
        let names: Vec<(&str, &str)> = c
            .attach
            .iter()
            .map(|(s, i)| (s.name.as_str(), i.as_str()))
            .collect();
        assert_eq!(names, vec![("net-a", "net1"), ("net-b", "net2")]);
    }

    #[test]
    fn an_unchanged_annotation_is_no_change_and_order_alone_is_none_either() {
        let a = sel("net-a,net-b");
        let p = plan(&[(a[0].clone(), "net1"), (a[1].clone(), "net2")]);
        assert!(diff(&p, &a).unwrap().is_empty());
        assert!(diff(&p, &sel("net-b,net-a")).unwrap().is_empty());
    }

    #[test]
    fn added_selections_never_take_a_name_in_use_or_one_just_freed() {
        let a = sel("net-a,net-b");
        // net1 is kept, net2 goes (net-b removed), net3 is free: the new one gets net3, not net2.
        let p = plan(&[(a[0].clone(), "net1"), (a[1].clone(), "net2")]);
        let c = diff(&p, &sel("net-a,net-c")).unwrap();
        assert_eq!(c.detach, vec![2]);
        assert_eq!(c.attach.len(), 1);
        assert_eq!(
            (c.attach[0].0.name.as_str(), c.attach[0].1.as_str()),
            ("net-c", "net3")
        );
    }

    #[test]
    fn a_removed_selection_is_detached_from_the_cache_without_an_interface_key() {
        let a = sel("net-a,other/net-b@fast0");
        let p = plan(&[(a[0].clone(), "net1"), (a[1].clone(), "fast0")]);
        // The whole annotation gone: both go, last first; the cluster network stays.
        let c = diff(&p, &[]).unwrap();
        assert_eq!(c.detach, vec![2, 1]);
        assert!(c.attach.is_empty());
        // Only the one with an interface key removed.
        let c = diff(&p, &sel("net-a")).unwrap();
        assert_eq!(c.detach, vec![2]);
    }

    #[test]
    fn two_selections_of_one_nad_keep_their_interfaces_in_annotation_order() {
        let a = sel("net-a,net-a");
        let p = plan(&[(a[0].clone(), "net1"), (a[1].clone(), "net2")]);
        // One of the two removed: the second one goes (matching is in order).
        let c = diff(&p, &sel("net-a")).unwrap();
        assert_eq!(c.detach, vec![2]);
        assert!(c.attach.is_empty() && c.reattach.is_empty());
    }

    #[test]
    fn other_keys_changed_reattach_under_the_same_interface() {
        let before = sel(r#"[{"name": "net-a", "ips": ["10.1.0.5/24"]}]"#);
        let p = plan(&[(before[0].clone(), "net1")]);
        let after = sel(r#"[{"name": "net-a", "ips": ["10.1.0.6/24"]}]"#);
        let c = diff(&p, &after).unwrap();
        assert_eq!(c.reattach, vec![(1, after[0].clone())]);
        assert!(c.detach.is_empty() && c.attach.is_empty());
        // A new interface key is a new identity: the old attachment goes, the new one comes under its name.
        let renamed = sel(r#"[{"name": "net-a", "ips": ["10.1.0.5/24"], "interface": "fast0"}]"#);
        let c = diff(&p, &renamed).unwrap();
        assert_eq!(c.detach, vec![1]);
        assert_eq!(c.attach[0].1, "fast0");
    }

    #[test]
    fn an_interface_key_naming_a_kept_interface_is_refused() {
        let a = sel("net-a");
        let p = plan(&[(a[0].clone(), "net1")]);
        let err = diff(&p, &sel("net-a,net-b@net1")).unwrap_err();
        assert_eq!(
            err,
            Refused::InterfaceInUse {
                network: "team-a/net-b".into(),
                ifname: "net1".into(),
                holder: "network team-a/net-a".into()
            }
        );
        let err = diff(&p, &sel("net-a,net-b@eth0")).unwrap_err();
        assert!(err.to_string().contains("cluster-net"), "{err}");
        // Not even the name of an interface the same change detaches (it is attached first).
        let err = diff(&p, &sel("net-b@net1")).unwrap_err();
        assert!(matches!(err, Refused::InterfaceInUse { .. }), "{err}");
        // Once it is gone, the next change may take it.
        let after = plan(&[]);
        let c = diff(&after, &sel("net-b@net1")).unwrap();
        assert_eq!(c.attach[0].1, "net1");
        assert_eq!(
            diff(&p, &sel("net-b@x1,net-c@x1")).unwrap_err(),
            Refused::DuplicateInterface("x1".into())
        );
    }
}
