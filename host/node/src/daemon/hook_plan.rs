//! The node agent's decision, a pure function: which NetworkHooks run on this node and what each one's status
//! says, from the resources, the node's labels, what could be made ready (pulled, verified, compiled, probed)
//! and what ran before. The agent ([`super::agent`]) gathers those and carries the decision out.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};
use plexus_hooks::{FailurePolicy, HookKind, HookSpec};
use serde::Deserialize;
use serde_json::Value;

use crate::hook_state::{Failure, Reason};
use crate::node_report::HookReport;

/// A NetworkHook's spec.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkHookSpec {
    pub kind: HookKind,
    /// `REGISTRY/REPOSITORY@sha256:<digest>`.
    pub module: String,
    #[serde(default)]
    pub settings: Option<Value>,
    #[serde(default)]
    pub order: i32,
    #[serde(default)]
    pub failure_policy: FailurePolicy,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    #[serde(default, rename = "memoryLimitMiB")]
    pub memory_limit_mib: Option<u64>,
    #[serde(default)]
    pub namespaces: Option<Vec<String>>,
    #[serde(default)]
    pub node_selector: Option<LabelSelector>,
}

/// A NetworkHook as the agent reads it: its spec (or why it does not parse) and generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    pub spec: Result<NetworkHookSpec, String>,
    pub generation: i64,
}

/// Whether a hook's node selector picks a node with these labels (no selector: every node).
pub fn selects(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> Result<bool, String> {
    let Some(sel) = selector else {
        return Ok(true);
    };
    let sel: Selector = sel
        .clone()
        .try_into()
        .map_err(|e| format!("nodeSelector: {e}"))?;
    Ok(sel.matches(labels))
}

/// How one resource applies to a node.
#[derive(Debug, Clone, PartialEq)]
pub enum Wanted<'a> {
    /// Its node selector leaves this node out.
    NotSelected,
    /// Its spec (or node selector) is invalid; the spec, when only its node selector is.
    Invalid(Failure, Option<&'a NetworkHookSpec>),
    Selected(&'a NetworkHookSpec),
}

/// How each resource applies to a node with these labels.
pub fn select<'a>(
    hooks: &'a BTreeMap<String, Resource>,
    labels: &BTreeMap<String, String>,
) -> BTreeMap<&'a str, Wanted<'a>> {
    hooks
        .iter()
        .map(|(name, res)| {
            let wanted = match &res.spec {
                Err(e) => Wanted::Invalid(Failure::new(Reason::InvalidSpec, e.clone()), None),
                Ok(spec) => match selects(spec.node_selector.as_ref(), labels) {
                    Ok(true) => Wanted::Selected(spec),
                    Ok(false) => Wanted::NotSelected,
                    Err(e) => Wanted::Invalid(Failure::new(Reason::InvalidSpec, e), Some(spec)),
                },
            };
            (name.as_str(), wanted)
        })
        .collect()
}

/// A hook made ready on this node: the manifest digest, the key its signature verified with (none when
/// signatures are off) and the entry it runs as.
#[derive(Debug, Clone, PartialEq)]
pub struct Ready {
    pub digest: String,
    pub verified_by: Option<String>,
    pub entry: HookSpec,
}

/// What ran for a hook before (the last published version), and whether it may still run: signatures are off,
/// or the key its signature verified with is still trusted.
#[derive(Debug, Clone, PartialEq)]
pub struct LastGood {
    pub entry: HookSpec,
    pub digest: String,
    /// Its order when published (unknown for a set published by an agent that did not record it).
    pub order: Option<i32>,
    pub verified_by: Option<String>,
    pub trusted: bool,
}

/// One entry of the node's hook set, with what it runs (nothing, for an unready entry: its digest is empty).
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub order: i32,
    pub name: String,
    pub spec: HookSpec,
    pub digest: String,
    pub verified_by: Option<String>,
}

/// What [`plan`] decides from.
pub struct PlanInput<'a> {
    pub hooks: &'a BTreeMap<String, Resource>,
    /// How each resource applies to the node ([`select`] of the resources and the node's labels).
    pub wanted: &'a BTreeMap<&'a str, Wanted<'a>>,
    /// For each selected hook: made ready, or why not.
    pub ready: &'a HashMap<String, Result<Ready, Failure>>,
    /// What ran before, by hook name.
    pub last_good: &'a HashMap<String, LastGood>,
    /// When a failing hook's module is tried again (RFC 3339), by hook name.
    pub next_attempt: &'a HashMap<String, String>,
}

/// The decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// The node's hook set, in order (`order`, then name).
    pub entries: Vec<Entry>,
    /// Each resource's status on this node; `None`: the hook does not apply to it (its entry goes).
    pub reports: BTreeMap<String, Option<HookReport>>,
}

/// Which hooks run and what each one's status says. Last good means last good: a hook made ready runs
/// (`Active`); one that is not keeps the version that ran before, whatever went wrong with the new one, as long
/// as its resource selects the node and that version may still run (its signer is trusted). A selected hook
/// with nothing to run is an unready entry: every call it would get fails under its `failurePolicy` (an ADD it
/// applies to is refused with `Fail`), so a policy the cluster asks for is enforced or the ADD refused.
pub fn plan(input: &PlanInput<'_>) -> Planned {
    let mut entries = Vec::new();
    let mut reports = BTreeMap::new();
    for (&name, wanted) in input.wanted {
        let generation = input.hooks[name].generation;
        let (spec, failure) = match wanted {
            Wanted::NotSelected => {
                reports.insert(name.to_string(), None);
                continue;
            }
            Wanted::Invalid(f, spec) => (*spec, f.clone()),
            Wanted::Selected(spec) => match input.ready.get(name) {
                None => continue,
                Some(Ok(r)) => {
                    entries.push(Entry {
                        order: spec.order,
                        name: name.to_string(),
                        spec: r.entry.clone(),
                        digest: r.digest.clone(),
                        verified_by: r.verified_by.clone(),
                    });
                    let message = format!("module {} is active", r.digest);
                    let report = HookReport {
                        name: name.to_string(),
                        active: true,
                        reason: "Active".into(),
                        message,
                        digest: Some(r.digest.clone()),
                        next_attempt_time: None,
                        observed_generation: generation,
                    };
                    reports.insert(name.to_string(), Some(report));
                    continue;
                }
                Some(Err(f)) => (Some(*spec), f.clone()),
            },
        };
        let (kept, failure) = match input.last_good.get(name) {
            Some(old) if !old.trusted => (
                None,
                Failure::new(
                    Reason::Untrusted,
                    format!(
                        "{} ran here but no trusted key verifies it any more, so it was taken out of the \
                         node's hook set; {failure}",
                        old.digest
                    ),
                ),
            ),
            kept => (kept, failure),
        };
        let mut message = failure.message.clone();
        match (kept, spec) {
            (Some(old), _) => {
                // The entry last published, as it was (its module and its settings): the last good one.
                let order = old.order.or(spec.map(|s| s.order)).unwrap_or_default();
                entries.push(Entry {
                    order,
                    name: name.to_string(),
                    spec: old.entry.clone(),
                    digest: old.digest.clone(),
                    verified_by: old.verified_by.clone(),
                });
            }
            (None, Some(spec)) => {
                message.push_str(match spec.failure_policy {
                    FailurePolicy::Fail => {
                        "; the ADDs it applies to are refused (failurePolicy Fail)"
                    }
                    FailurePolicy::Ignore => {
                        "; the ADDs it applies to go on without it (failurePolicy Ignore)"
                    }
                });
                entries.push(Entry {
                    order: spec.order,
                    name: name.to_string(),
                    spec: unready_entry(name, spec, &failure),
                    digest: String::new(),
                    verified_by: None,
                });
            }
            // A spec that does not parse says nothing of its kind or namespaces (the resource's schema refuses
            // such objects): reported, not enforced.
            (None, None) => {}
        }
        let report = HookReport {
            name: name.to_string(),
            active: kept.is_some(),
            reason: failure.reason.as_str().into(),
            message,
            digest: kept.map(|old| old.digest.clone()),
            next_attempt_time: input.next_attempt.get(name).cloned(),
            observed_generation: generation,
        };
        reports.insert(name.to_string(), Some(report));
    }
    entries.sort_by(|a, b| (a.order, &a.name).cmp(&(b.order, &b.name)));
    Planned { entries, reports }
}

/// The hook set's entry of a selected hook that has nothing to run: no module, its calls fail with the reason.
pub fn unready_entry(name: &str, spec: &NetworkHookSpec, failure: &Failure) -> HookSpec {
    let mut entry = HookSpec::new(name, spec.kind, "");
    entry.failure_policy = spec.failure_policy;
    entry.namespaces = spec.namespaces.clone();
    entry.precompiled = true;
    entry.unready = Some(format!("{}: {}", failure.reason.as_str(), failure.message));
    entry
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn resource(spec: serde_json::Value, generation: i64) -> Resource {
        Resource {
            spec: serde_json::from_value(spec).map_err(|e| e.to_string()),
            generation,
        }
    }

    fn hooks(list: &[(&str, serde_json::Value)]) -> BTreeMap<String, Resource> {
        list.iter()
            .map(|(n, spec)| (n.to_string(), resource(spec.clone(), 3)))
            .collect()
    }

    fn entry(name: &str, sha: &str) -> HookSpec {
        let mut h = HookSpec::new(name, HookKind::Policy, format!("/m/{sha}.wasm"));
        h.sha256 = Some(sha.into());
        h.precompiled = true;
        h
    }

    fn ready(name: &str, digest: &str) -> Result<Ready, Failure> {
        Ok(Ready {
            digest: digest.into(),
            verified_by: Some("key-1".into()),
            entry: entry(name, &format!("sha-{digest}")),
        })
    }

    struct World {
        hooks: BTreeMap<String, Resource>,
        labels: BTreeMap<String, String>,
        ready: HashMap<String, Result<Ready, Failure>>,
        last_good: HashMap<String, LastGood>,
        next_attempt: HashMap<String, String>,
    }

    impl World {
        fn new(hooks: BTreeMap<String, Resource>) -> World {
            World {
                hooks,
                labels: BTreeMap::new(),
                ready: HashMap::new(),
                last_good: HashMap::new(),
                next_attempt: HashMap::new(),
            }
        }

        fn plan(&self) -> Planned {
            plan(&PlanInput {
                hooks: &self.hooks,
                wanted: &select(&self.hooks, &self.labels),
                ready: &self.ready,
                last_good: &self.last_good,
                next_attempt: &self.next_attempt,
            })
        }

        fn ran_before(&mut self, name: &str, digest: &str, trusted: bool) {
            self.last_good.insert(
                name.into(),
                LastGood {
                    entry: entry(name, &format!("sha-{digest}")),
                    digest: digest.into(),
                    order: Some(0),
                    verified_by: Some("key-1".into()),
                    trusted,
                },
            );
        }
    }

    fn policy(module: &str) -> serde_json::Value {
        json!({"kind": "policy", "module": module})
    }

    /// The names of the entries that run something, in order.
    fn running(p: &Planned) -> Vec<&str> {
        p.entries
            .iter()
            .filter(|e| e.spec.unready.is_none())
            .map(|e| e.name.as_str())
            .collect()
    }

    /// The unready entries: name and reason.
    fn unready(p: &Planned) -> Vec<(&str, &str)> {
        p.entries
            .iter()
            .filter_map(|e| Some((e.name.as_str(), e.spec.unready.as_deref()?)))
            .collect()
    }

    #[test]
    fn ready_hooks_run_in_order_and_report_active() {
        let mut w = World::new(hooks(&[
            (
                "b",
                json!({"kind": "policy", "module": "r/b@sha256:1", "order": 1}),
            ),
            (
                "a",
                json!({"kind": "status", "module": "r/a@sha256:2", "order": 1}),
            ),
            (
                "first",
                json!({"kind": "policy", "module": "r/f@sha256:3", "order": -5}),
            ),
        ]));
        for (n, d) in [("a", "d-a"), ("b", "d-b"), ("first", "d-f")] {
            w.ready.insert(n.into(), ready(n, d));
        }
        let p = w.plan();
        let names: Vec<&str> = p.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["first", "a", "b"]);
        let a = p.reports["a"].clone().unwrap();
        assert!(a.active);
        assert_eq!(
            (a.reason.as_str(), a.digest.as_deref()),
            ("Active", Some("d-a"))
        );
        assert_eq!((a.name.as_str(), a.observed_generation), ("a", 3));
    }

    #[test]
    fn a_module_of_another_kind_never_runs_and_says_kind_mismatch() {
        let mut w = World::new(hooks(&[("deny", policy("r/d@sha256:1"))]));
        w.ready.insert(
            "deny".into(),
            Err(Failure::new(
                Reason::KindMismatch,
                "spec.kind is resolver but the module exports policy only",
            )),
        );
        let p = w.plan();
        assert!(running(&p).is_empty());
        // Selected and not ready: an unready entry, whose calls fail under its failurePolicy (Fail by default).
        let entries = unready(&p);
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(entries[0].0, "deny");
        assert!(entries[0].1.starts_with("KindMismatch: "), "{entries:?}");
        assert_eq!(p.entries[0].spec.failure_policy, FailurePolicy::Fail);
        let r = p.reports["deny"].clone().unwrap();
        assert!(!r.active);
        assert_eq!(r.reason, "KindMismatch");
        assert!(r.message.contains("exports policy only"), "{}", r.message);
        assert!(
            r.message
                .ends_with("the ADDs it applies to are refused (failurePolicy Fail)"),
            "{}",
            r.message
        );
        assert_eq!(r.digest, None);
    }

    #[test]
    fn a_hook_that_never_became_ready_is_enforced_by_its_failure_policy() {
        let mut w = World::new(hooks(&[
            (
                "strict",
                json!({"kind": "policy", "module": "r/s@sha256:1", "namespaces": ["team"]}),
            ),
            (
                "lenient",
                json!({"kind": "status", "module": "r/l@sha256:1", "failurePolicy": "Ignore",
                       "order": 2}),
            ),
        ]));
        for n in ["strict", "lenient"] {
            w.ready.insert(
                n.into(),
                Err(Failure::new(Reason::PullFailed, "registry unreachable")),
            );
        }
        let p = w.plan();
        let by_name = |n: &str| p.entries.iter().find(|e| e.name == n).unwrap();
        let strict = &by_name("strict").spec;
        assert_eq!(
            strict.unready.as_deref(),
            Some("PullFailed: registry unreachable")
        );
        assert_eq!(strict.failure_policy, FailurePolicy::Fail);
        assert_eq!(strict.kind, HookKind::Policy);
        assert_eq!(strict.namespaces, Some(vec!["team".to_string()]));
        let lenient = &by_name("lenient").spec;
        assert_eq!(lenient.failure_policy, FailurePolicy::Ignore);
        assert!(p.reports["lenient"]
            .clone()
            .unwrap()
            .message
            .ends_with("go on without it (failurePolicy Ignore)"));
        // In order, as they would run.
        let names: Vec<&str> = p.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["strict", "lenient"]);
    }

    #[test]
    fn last_good_means_last_good_whatever_the_new_version_or_spec() {
        // A rollout whose new version cannot be pulled, and then a new spec whose node selector is invalid: the
        // version that ran stays, as long as it may run.
        let mut w = World::new(hooks(&[("h", policy("r/h@sha256:new"))]));
        w.ran_before("h", "d-old", true);
        w.ready.insert(
            "h".into(),
            Err(Failure::new(Reason::NotFound, "no manifest")),
        );
        assert_eq!(running(&w.plan()), ["h"]);
        w.hooks = hooks(&[(
            "h",
            json!({"kind": "policy", "module": "r/h@sha256:new",
                   "nodeSelector": {"matchExpressions": [{"key": "k", "operator": "Sometimes"}]}}),
        )]);
        w.ready.clear();
        let p = w.plan();
        assert_eq!(running(&p), ["h"]);
        assert_eq!(p.entries[0].digest, "d-old");
        assert_eq!(p.entries[0].verified_by.as_deref(), Some("key-1"));
        let r = p.reports["h"].clone().unwrap();
        assert!(r.active);
        assert_eq!(r.reason, "InvalidSpec");
        // Without a last good version, the same spec is an unready entry of its kind.
        w.last_good.clear();
        assert_eq!(unready(&w.plan()).len(), 1);
    }

    #[test]
    fn a_failing_new_version_keeps_the_last_good_one_running() {
        let mut w = World::new(hooks(&[("h", policy("r/h@sha256:new"))]));
        w.ran_before("h", "d-old", true);
        w.ready.insert(
            "h".into(),
            Err(Failure::new(Reason::PullFailed, "registry unreachable")),
        );
        w.next_attempt
            .insert("h".into(), "2026-11-25T20:00:00Z".into());
        let p = w.plan();
        assert_eq!(p.entries.len(), 1);
        assert_eq!(p.entries[0].digest, "d-old");
        assert_eq!(p.entries[0].spec, entry("h", "sha-d-old"));
        let r = p.reports["h"].clone().unwrap();
        assert!(r.active, "the last good version runs");
        assert_eq!(
            r.reason, "PullFailed",
            "and the status says why the new one does not"
        );
        assert_eq!(r.digest.as_deref(), Some("d-old"));
        assert_eq!(r.next_attempt_time.as_deref(), Some("2026-11-25T20:00:00Z"));
    }

    #[test]
    fn after_a_key_rotation_an_unverified_last_good_version_leaves_and_a_verified_one_stays() {
        let mut w = World::new(hooks(&[
            ("old", policy("r/o@sha256:1")),
            ("resigned", policy("r/r@sha256:2")),
        ]));
        // Signed with the retired key only: its new pull fails to verify, and what ran is no longer trusted.
        w.ran_before("old", "d-o", false);
        w.ready.insert(
            "old".into(),
            Err(Failure::new(
                Reason::SignatureInvalid,
                "no trusted key verifies it",
            )),
        );
        // Signed again with the new key: made ready again.
        w.ran_before("resigned", "d-r", false);
        w.ready.insert("resigned".into(), ready("resigned", "d-r"));
        let p = w.plan();
        assert_eq!(running(&p), ["resigned"]);
        // Still selected: enforced as unready (its ADDs refused), not silently absent.
        assert_eq!(unready(&p).len(), 1);
        assert!(
            unready(&p)[0].1.starts_with("Untrusted: "),
            "{:?}",
            unready(&p)
        );
        let old = p.reports["old"].clone().unwrap();
        assert!(!old.active);
        assert_eq!(old.reason, "Untrusted");
        assert!(
            old.message
                .starts_with("d-o ran here but no trusted key verifies it any more")
                && old
                    .message
                    .contains("SignatureInvalid: no trusted key verifies it"),
            "{}",
            old.message
        );
        assert_eq!(p.reports["resigned"].clone().unwrap().reason, "Active");
    }

    #[test]
    fn unselected_hooks_report_nothing_and_invalid_specs_say_so() {
        let mut w = World::new(hooks(&[
            (
                "canary",
                json!({"kind": "policy", "module": "r/c@sha256:1",
                    "nodeSelector": {"matchLabels": {"plexus.dev/canary": "true"}}}),
            ),
            (
                "typo",
                json!({"kind": "policy", "module": "r/t@sha256:1", "ordr": 1}),
            ),
            (
                "badsel",
                json!({"kind": "policy", "module": "r/b@sha256:1",
                    "nodeSelector": {"matchExpressions": [{"key": "k", "operator": "Sometimes"}]}}),
            ),
        ]));
        w.ran_before("canary", "d-c", true);
        let p = w.plan();
        assert!(
            running(&p).is_empty(),
            "a node the selector leaves out runs nothing, not even the last good"
        );
        // A spec that does not parse says nothing of its kind: reported only. One whose selector alone is
        // invalid is enforced as unready.
        assert_eq!(unready(&p).len(), 1);
        assert_eq!(unready(&p)[0].0, "badsel");
        assert_eq!(p.reports["canary"], None);
        let typo = p.reports["typo"].clone().unwrap();
        assert_eq!(typo.reason, "InvalidSpec");
        assert!(typo.message.contains("ordr"), "{}", typo.message);
        assert_eq!(p.reports["badsel"].clone().unwrap().reason, "InvalidSpec");

        w.labels.insert("plexus.dev/canary".into(), "true".into());
        w.ready.insert("canary".into(), ready("canary", "d-c2"));
        let p = w.plan();
        assert_eq!(running(&p), ["canary"]);
        let canary = p.entries.iter().find(|e| e.name == "canary").unwrap();
        assert_eq!(canary.digest, "d-c2");
    }
}
