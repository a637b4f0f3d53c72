//! What one node reports of its NetworkHooks, in an object of its own: a cluster-scoped `NodeHookStatus` named
//! after the node and owned by its Node object, written only by that node's agent. Bounded (at most
//! [`MAX_HOOKS`] entries, messages cut at [`MAX_MESSAGE`] bytes), so its size depends on the node's hooks alone;
//! no object that every node writes grows with the number of nodes. And the cluster-wide view an operator asks
//! for (`plexus hook status NAME`), summarised from every node's object.

use std::collections::BTreeMap;

use kube::api::ApiResource;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::terminal::printable;

pub const GROUP: &str = "plexus.dev";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "NodeHookStatus";
pub const PLURAL: &str = "nodehookstatuses";

/// Hooks listed in one node's object at most (failing ones first); past it, `omitted` counts the rest.
pub const MAX_HOOKS: usize = 100;
/// A message longer than this is cut (at a character boundary) and marked.
pub const MAX_MESSAGE: usize = 512;

/// The API description of the per-node object.
pub fn api_resource() -> ApiResource {
    plexus_resource(KIND, PLURAL)
}

/// A cluster-scoped resource of the project's API group (`plexus.dev/v1alpha1`).
pub fn plexus_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// One hook as a node reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookReport {
    /// The NetworkHook's name.
    pub name: String,
    /// The hook runs in this node's ADDs (perhaps an earlier version: see `digest`).
    pub active: bool,
    /// `Active`, or why not (or why the wanted version is not): see [`crate::hook_state::Reason`].
    pub reason: String,
    pub message: String,
    /// The manifest digest running on the node, when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// When the agent tries again (a registry failure); absent when it waits for a change instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_time: Option<String>,
    /// The NetworkHook's generation this report is about.
    pub observed_generation: i64,
}

/// The `status` of a node's `NodeHookStatus`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    /// Hooks running on the node.
    pub active: usize,
    /// Hooks whose wanted version does not run here (the reason says why).
    pub failing: usize,
    /// Hooks not listed, past [`MAX_HOOKS`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub omitted: usize,
    #[serde(default)]
    pub hooks: Vec<HookReport>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// `message`, cut to at most [`MAX_MESSAGE`] bytes at a character boundary.
fn bounded(message: &str) -> String {
    if message.len() <= MAX_MESSAGE {
        return message.to_string();
    }
    const MARK: &str = " ...(cut)";
    let mut end = MAX_MESSAGE - MARK.len();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &message[..end])
}

impl NodeReport {
    /// The report of the hooks that apply to this node (`None`: the hook does not), bounded.
    pub fn of(reports: &BTreeMap<String, Option<HookReport>>) -> NodeReport {
        let mut hooks: Vec<HookReport> = reports
            .iter()
            .filter_map(|(name, h)| {
                let h = h.as_ref()?;
                Some(HookReport {
                    name: name.clone(),
                    message: bounded(&h.message),
                    ..h.clone()
                })
            })
            .collect();
        let active = hooks.iter().filter(|h| h.active).count();
        let failing = hooks.iter().filter(|h| h.reason != "Active").count();
        let omitted = hooks.len().saturating_sub(MAX_HOOKS);
        if omitted > 0 {
            // What needs a person's eyes stays listed.
            hooks.sort_by_key(|h| (h.reason == "Active", h.name.clone()));
            hooks.truncate(MAX_HOOKS);
            hooks.sort_by(|a, b| a.name.cmp(&b.name));
        }
        NodeReport {
            active,
            failing,
            omitted,
            hooks,
        }
    }

    /// The whole object, as the node applies it: named after the node and owned by its Node (`node_uid`), so that
    /// the garbage collector removes it with the Node.
    pub fn object(&self, node: &str, node_uid: &str) -> Value {
        json!({
            "apiVersion": format!("{GROUP}/{VERSION}"),
            "kind": KIND,
            "metadata": {
                "name": node,
                "ownerReferences": [{
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node,
                    "uid": node_uid,
                }],
            },
            "status": self,
        })
    }
}

/// Nodes sharing one answer about a hook.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Group {
    /// The digest (running) or the reason (failing).
    pub key: String,
    pub nodes: Vec<String>,
    /// One node's message, as an example (failing groups).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One NetworkHook across the cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub hook: String,
    /// The hook's current generation, when the resource exists.
    pub generation: Option<i64>,
    /// Nodes that report the hook.
    pub nodes: usize,
    pub active: usize,
    /// Nodes running each digest.
    pub running: Vec<Group>,
    /// Nodes whose wanted version does not run, by reason.
    pub failing: Vec<Group>,
    /// Nodes whose report is about an older generation of the hook (not yet reconciled).
    pub behind: Vec<String>,
}

/// What every node (`(node, its report)`) says of `hook`.
pub fn summarise(hook: &str, generation: Option<i64>, reports: &[(String, NodeReport)]) -> Summary {
    let mut running: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut failing: BTreeMap<String, (Vec<String>, String)> = BTreeMap::new();
    let mut behind = Vec::new();
    let (mut nodes, mut active) = (0, 0);
    for (node, report) in reports {
        let Some(h) = report.hooks.iter().find(|h| h.name == hook) else {
            continue;
        };
        nodes += 1;
        if h.active {
            active += 1;
            let digest = h.digest.clone().unwrap_or_else(|| "(unknown)".into());
            running.entry(digest).or_default().push(node.clone());
        }
        if h.reason != "Active" {
            let group = failing
                .entry(h.reason.clone())
                .or_insert_with(|| (Vec::new(), h.message.clone()));
            group.0.push(node.clone());
        }
        if generation.is_some_and(|g| h.observed_generation < g) {
            behind.push(node.clone());
        }
    }
    Summary {
        hook: hook.to_string(),
        generation,
        nodes,
        active,
        running: running
            .into_iter()
            .map(|(key, nodes)| Group {
                key,
                nodes,
                message: None,
            })
            .collect(),
        failing: failing
            .into_iter()
            .map(|(key, (nodes, message))| Group {
                key,
                nodes,
                message: Some(message),
            })
            .collect(),
        behind,
    }
}

/// At most `max` names (shown: see [`printable`]), then how many more.
fn names(nodes: &[String], max: usize) -> String {
    let mut text = nodes
        .iter()
        .take(max)
        .map(|n| printable(n))
        .collect::<Vec<_>>()
        .join(", ");
    if nodes.len() > max {
        text.push_str(&format!(" and {} more", nodes.len() - max));
    }
    text
}

impl Summary {
    /// The summary as text for a person. Every string in it was written by some node: each is shown with its
    /// control characters escaped ([`printable`]).
    pub fn text(&self) -> String {
        let mut out = format!("networkhook {}", printable(&self.hook));
        if let Some(g) = self.generation {
            out.push_str(&format!(" (generation {g})"));
        } else {
            out.push_str(" (no such NetworkHook: reports of an earlier one)");
        }
        out.push_str(&format!(
            "\n{} node(s) report it: {} running it, {} failing\n",
            self.nodes,
            self.active,
            self.failing.iter().map(|g| g.nodes.len()).sum::<usize>()
        ));
        for g in &self.running {
            out.push_str(&format!(
                "  running {}: {} node(s): {}\n",
                printable(&g.key),
                g.nodes.len(),
                names(&g.nodes, 10)
            ));
        }
        for g in &self.failing {
            out.push_str(&format!(
                "  {}: {} node(s): {}\n    e.g. {}\n",
                printable(&g.key),
                g.nodes.len(),
                names(&g.nodes, 10),
                printable(g.message.as_deref().unwrap_or_default())
            ));
        }
        if !self.behind.is_empty() {
            out.push_str(&format!(
                "  not yet at generation {}: {} node(s): {}\n",
                self.generation.unwrap_or_default(),
                self.behind.len(),
                names(&self.behind, 10)
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(
        active: bool,
        reason: &str,
        digest: Option<&str>,
        generation: i64,
    ) -> Option<HookReport> {
        Some(HookReport {
            name: "h".into(),
            active,
            reason: reason.into(),
            message: format!("{reason} message"),
            digest: digest.map(str::to_string),
            next_attempt_time: None,
            observed_generation: generation,
        })
    }

    #[test]
    fn a_report_lists_the_hooks_of_its_node_only_and_counts_them() {
        let reports: BTreeMap<String, Option<HookReport>> = [
            ("a".to_string(), status(true, "Active", Some("sha256:1"), 2)),
            (
                "b".to_string(),
                status(true, "PullFailed", Some("sha256:0"), 3),
            ),
            ("c".to_string(), status(false, "KindMismatch", None, 1)),
            ("elsewhere".to_string(), None),
        ]
        .into();
        let r = NodeReport::of(&reports);
        assert_eq!((r.active, r.failing, r.omitted), (2, 2, 0));
        let names: Vec<&str> = r.hooks.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        let object = r.object("node7", "uid-7");
        assert_eq!(object["metadata"]["name"], "node7");
        assert_eq!(
            object["metadata"]["ownerReferences"][0],
            json!({"apiVersion": "v1", "kind": "Node", "name": "node7", "uid": "uid-7"})
        );
        assert_eq!(object["status"]["hooks"][1]["reason"], "PullFailed");
        assert!(!object.to_string().contains("elsewhere"));
    }

    #[test]
    fn a_report_is_bounded_whatever_the_hooks_say() {
        let long = "é".repeat(2000);
        let reports: BTreeMap<String, Option<HookReport>> = (0..MAX_HOOKS + 30)
            .map(|i| {
                let mut s = status(
                    i % 3 != 0,
                    if i % 3 == 0 { "PullFailed" } else { "Active" },
                    None,
                    1,
                );
                s.as_mut().unwrap().message = long.clone();
                (format!("hook-{i:03}"), s)
            })
            .collect();
        let r = NodeReport::of(&reports);
        assert_eq!(r.hooks.len(), MAX_HOOKS);
        assert_eq!(r.omitted, 30);
        assert_eq!(r.failing, (MAX_HOOKS + 30).div_ceil(3));
        // Every failing hook is still listed.
        assert_eq!(
            r.hooks.iter().filter(|h| h.reason != "Active").count(),
            r.failing
        );
        assert!(r.hooks.iter().all(|h| h.message.len() <= MAX_MESSAGE));
        assert!(r.hooks[0].message.ends_with("...(cut)"));
        let bytes = r.object("n", "u").to_string().len();
        assert!(bytes < MAX_HOOKS * (MAX_MESSAGE + 300), "{bytes}");
    }

    #[test]
    fn the_summary_groups_nodes_by_digest_and_by_reason() {
        let report = |s: Option<HookReport>| NodeReport::of(&[("h".to_string(), s)].into());
        let reports = vec![
            (
                "n1".to_string(),
                report(status(true, "Active", Some("sha256:new"), 4)),
            ),
            (
                "n2".to_string(),
                report(status(true, "Active", Some("sha256:new"), 4)),
            ),
            (
                "n3".to_string(),
                report(status(true, "PullFailed", Some("sha256:old"), 4)),
            ),
            (
                "n4".to_string(),
                report(status(false, "SignatureInvalid", None, 3)),
            ),
            ("n5".to_string(), report(None)),
        ];
        let s = summarise("h", Some(4), &reports);
        assert_eq!((s.nodes, s.active), (4, 3));
        assert_eq!(
            s.running,
            vec![
                Group {
                    key: "sha256:new".into(),
                    nodes: vec!["n1".into(), "n2".into()],
                    message: None
                },
                Group {
                    key: "sha256:old".into(),
                    nodes: vec!["n3".into()],
                    message: None
                },
            ]
        );
        let failing: Vec<(&str, usize)> = s
            .failing
            .iter()
            .map(|g| (g.key.as_str(), g.nodes.len()))
            .collect();
        assert_eq!(failing, [("PullFailed", 1), ("SignatureInvalid", 1)]);
        assert_eq!(s.behind, ["n4"]);
        let text = s.text();
        assert!(
            text.contains("4 node(s) report it: 3 running it, 2 failing"),
            "{text}"
        );
        assert!(
            text.contains("running sha256:new: 2 node(s): n1, n2"),
            "{text}"
        );
        assert!(
            text.contains("SignatureInvalid: 1 node(s): n4\n    e.g. SignatureInvalid message"),
            "{text}"
        );
    }

    #[test]
    fn what_nodes_wrote_reaches_the_terminal_escaped() {
        let mut hostile = status(false, "Pull\u{1b}[2JFailed", Some("sha256:\u{9b}1m"), 1).unwrap();
        hostile.message = "no\u{1b}]0;title\u{7}\n  running sha256:fake: 1 node(s): n9".into();
        let running = status(true, "Active", Some("sha256:x\u{1b}[31m"), 1).unwrap();
        let reports = vec![
            (
                "n\u{1b}[1m1".to_string(),
                NodeReport::of(&[("h\u{7}".to_string(), Some(hostile))].into()),
            ),
            (
                "n2".to_string(),
                NodeReport::of(&[("h\u{7}".to_string(), Some(running))].into()),
            ),
        ];
        let text = summarise("h\u{7}", Some(1), &reports).text();
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        // Its own lines only: a message's newline does not start one.
        assert_eq!(text.lines().count(), 5, "{text}");
        assert!(
            text.contains(r"Pull\u{1b}[2JFailed: 1 node(s): n\u{1b}[1m1"),
            "{text}"
        );
        assert!(
            text.contains(r"e.g. no\u{1b}]0;title\u{7}\n  running"),
            "{text}"
        );
        assert!(
            text.contains(r"running sha256:x\u{1b}[31m: 1 node(s): n2"),
            "{text}"
        );
    }
}
