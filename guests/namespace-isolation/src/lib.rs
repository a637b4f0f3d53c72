//! A policy hook: a pod may select NetworkAttachmentDefinitions in its own namespace and in the
//! namespaces listed in `globalNamespaces` (default `["default"]`); anything else is denied.

use plexus_sdk::{Decision, Error, Pod, Policy, Selection};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Settings {
    #[serde(default = "default_global_namespaces")]
    global_namespaces: Vec<String>,
}

fn default_global_namespaces() -> Vec<String> {
    vec!["default".to_string()]
}

pub struct NamespaceIsolation;

impl Policy for NamespaceIsolation {
    fn check(pod: &Pod, selections: Vec<Selection>) -> Result<Decision, Error> {
        let settings: Settings = plexus_sdk::settings()?;
        for s in &selections {
            let allowed =
                s.namespace == pod.namespace || settings.global_namespaces.contains(&s.namespace);
            if !allowed {
                return Ok(Decision::Deny(format!(
                    "pod {}/{} may not select network {}/{}: only its own namespace and {} are allowed",
                    pod.namespace,
                    pod.name,
                    s.namespace,
                    s.name,
                    settings.global_namespaces.join(", ")
                )));
            }
        }
        Ok(Decision::Admit)
    }
}

plexus_sdk::export!(policy: NamespaceIsolation);

#[cfg(test)]
mod tests {
    use super::*;
    use plexus_sdk::testing::Harness;
    use serde_json::json;

    fn harness() -> Harness {
        Harness::new().pod(Pod::new("team-a", "web"))
    }

    #[test]
    fn own_namespace_and_default_are_admitted() {
        let out = harness()
            .check::<NamespaceIsolation>(vec![
                Selection::new("team-a", "net1"),
                Selection::new("default", "shared"),
            ])
            .unwrap();
        assert_eq!(out, Decision::Admit);
    }

    #[test]
    fn other_namespace_is_denied_with_a_reason() {
        let out = harness()
            .check::<NamespaceIsolation>(vec![
                Selection::new("team-a", "net1"),
                Selection::new("team-b", "secret"),
            ])
            .unwrap();
        match out {
            Decision::Deny(reason) => assert!(reason.contains("team-b/secret"), "{reason}"),
            other => panic!("expected a deny, got {other:?}"),
        }
    }

    #[test]
    fn listed_global_namespaces_replace_the_default() {
        let h = harness().settings(json!({"globalNamespaces": ["infra"]}));
        let admitted = h
            .check::<NamespaceIsolation>(vec![Selection::new("infra", "storage")])
            .unwrap();
        assert_eq!(admitted, Decision::Admit);
        let denied = h
            .check::<NamespaceIsolation>(vec![Selection::new("default", "shared")])
            .unwrap();
        assert!(matches!(denied, Decision::Deny(_)));
    }

    #[test]
    fn unknown_settings_are_a_fault_not_a_decision() {
        let err = harness()
            .settings(json!({"globalNamespace": ["typo"]}))
            .check::<NamespaceIsolation>(vec![])
            .unwrap_err();
        assert!(err.to_string().contains("globalNamespace"), "{err}");
    }
}
