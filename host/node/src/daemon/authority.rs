//! The node's self-check of its own authority: whether the API server refuses a write that the
//! `plexus-node-authority` admission policy (examples/deploy/node-authority.yaml) must refuse.
//!
//! RBAC lets the plexus identity write every node's NodeHookStatus and every pod's status; only the policy ties
//! those writes to the node the token names. A cluster upgraded without the policy, or with its binding deleted,
//! works as before and says nothing: so the daemon asks, at start and hourly, with a server-side dry run (nothing
//! is stored) of the NodeHookStatus of a name that is not its node's. Refused by the policy: enforced. Admitted:
//! not enforced, and the operator is told (a Warning event on the Node, the metric
//! `plexus_node_authority_enforced` at 0, and `plexus status`). Anything else (RBAC refusing the create, the
//! CRD missing, no answer) tells nothing.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DynamicObject, PostParams};
use plexus_cluster::KubeApi;

use super::metrics::HookStates;
use crate::node_report;

/// The admission policy's name, as the API server names it when it refuses.
pub const POLICY: &str = "plexus-node-authority";
/// How often the check is made again.
const RECHECK: Duration = Duration::from_secs(3600);
/// How long one check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// What one check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    Enforced,
    /// The write was admitted: why that matters and what to apply.
    NotEnforced(String),
    /// The check could not tell (the reason, for the log).
    Unknown(String),
}

/// The name of the report the dry run writes: never the node's own.
fn probe_name(node: &str) -> String {
    let name = "plexus-authority-self-check";
    if node == name {
        format!("{name}-2")
    } else {
        name.to_string()
    }
}

/// What the API server's answer to the dry run means: `Ok` admitted, `Err((code, message))` refused.
pub fn finding(node: &str, answer: Result<(), (u16, String)>) -> Finding {
    match answer {
        Ok(()) => Finding::NotEnforced(format!(
            "the API server admitted a write the {POLICY} admission policy must refuse (a dry-run create of the \
             NodeHookStatus {:?} by node {node}): this node could write other nodes' reports and pods' status; apply \
             the policy and its binding (examples/deploy/node-authority.yaml, Kubernetes 1.30+)",
            probe_name(node)
        )),
        Err((_, message)) if message.contains("ValidatingAdmissionPolicy") && message.contains(POLICY) => {
            Finding::Enforced
        }
        Err((code, message)) => Finding::Unknown(format!("HTTP {code}: {message}")),
    }
}

/// One dry run.
async fn check(api: &KubeApi, node: &str) -> Finding {
    let reports: Api<DynamicObject> =
        Api::all_with(api.client().clone(), &node_report::api_resource());
    let mut object = DynamicObject::new(&probe_name(node), &node_report::api_resource());
    object.data = serde_json::json!({"spec": {}});
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match tokio::time::timeout(CHECK_TIMEOUT, reports.create(&params, &object)).await {
        Err(_) => Finding::Unknown(format!("no answer within {CHECK_TIMEOUT:?}")),
        Ok(Ok(_)) => finding(node, Ok(())),
        Ok(Err(kube::Error::Api(s))) => finding(node, Err((s.code, s.message))),
        Ok(Err(e)) => Finding::Unknown(e.to_string()),
    }
}

/// Checks at start and every hour; keeps the finding in `states`, logs a change, and posts a Warning event on
/// the node's Node when the policy is found not enforced.
pub async fn run(api: KubeApi, node: String, states: HookStates) {
    loop {
        let found = check(&api, &node).await;
        let before = states.authority();
        if before.as_ref() != Some(&found) {
            match &found {
                Finding::Enforced => {
                    tracing::info!(policy = POLICY, "the node's authority is enforced")
                }
                Finding::NotEnforced(why) => {
                    tracing::error!(
                        policy = POLICY,
                        "the node's authority is not enforced: {why}"
                    );
                    let object = ObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Node".into()),
                        name: Some(node.clone()),
                        ..ObjectReference::default()
                    };
                    let reporter = ("plexus-agent", Some(node.as_str()));
                    if let Err(e) = api
                        .post_event_about(
                            object,
                            ("Warning", "NodeAuthorityNotEnforced"),
                            why,
                            reporter,
                        )
                        .await
                    {
                        tracing::warn!(error = %e, "cannot post the node's event");
                    }
                }
                Finding::Unknown(why) => {
                    tracing::info!(
                        policy = POLICY,
                        "cannot tell whether the node's authority is enforced: {why}"
                    )
                }
            }
        }
        *states.authority.lock().unwrap_or_else(|e| e.into_inner()) = Some(found);
        tokio::time::sleep(RECHECK).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_policys_own_refusal_counts_as_enforced() {
        let denied = "nodehookstatuses.plexus.dev \"plexus-authority-self-check\" is forbidden: \
                      ValidatingAdmissionPolicy 'plexus-node-authority' with binding 'plexus-node-authority' \
                      denied request: plexus on node n1 may write only the NodeHookStatus named n1";
        assert_eq!(finding("n1", Err((403, denied.into()))), Finding::Enforced);
        let Finding::NotEnforced(why) = finding("n1", Ok(())) else {
            panic!("admitted is not enforced")
        };
        assert!(
            why.contains("node-authority.yaml") && why.contains("n1"),
            "{why}"
        );
        // RBAC's refusal, or another policy's, says nothing of this one.
        let rbac = "nodehookstatuses.plexus.dev is forbidden: User \"system:serviceaccount:kube-system:plexus\" \
                    cannot create resource \"nodehookstatuses\"";
        assert!(matches!(
            finding("n1", Err((403, rbac.into()))),
            Finding::Unknown(_)
        ));
        let other = "ValidatingAdmissionPolicy 'someone-else' with binding 'x' denied request: no";
        assert!(matches!(
            finding("n1", Err((403, other.into()))),
            Finding::Unknown(_)
        ));
        assert_eq!(
            probe_name("plexus-authority-self-check"),
            "plexus-authority-self-check-2"
        );
    }
}
