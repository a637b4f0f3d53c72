//! A policy hook that tells an ADD from a change of a running pod (`plexus_sdk::pod_running`, WIT 0.1.1):
//! networks whose NAD name starts with `start-only` are admitted when the pod's sandbox is made and denied
//! when they are added to a running pod. Everything else is admitted.

use plexus_sdk::{Decision, Error, Pod, Policy, Selection};

pub struct PodRunning;

impl Policy for PodRunning {
    fn check(pod: &Pod, selections: Vec<Selection>) -> Result<Decision, Error> {
        if !plexus_sdk::pod_running() {
            return Ok(Decision::Admit);
        }
        match selections.iter().find(|s| s.name.starts_with("start-only")) {
            Some(s) => Ok(Decision::Deny(format!(
                "network {}/{} is attached only when a pod starts, and pod {}/{} is running",
                s.namespace, s.name, pod.namespace, pod.name
            ))),
            None => Ok(Decision::Admit),
        }
    }
}

plexus_sdk::export!(policy: PodRunning);

#[cfg(test)]
mod tests {
    use super::*;
    use plexus_sdk::testing::Harness;

    fn selections() -> Vec<Selection> {
        vec![
            Selection::new("team-a", "start-only-a"),
            Selection::new("team-a", "net1"),
        ]
    }

    #[test]
    fn start_only_networks_are_admitted_when_the_pod_starts() {
        let out = Harness::new().check::<PodRunning>(selections()).unwrap();
        assert_eq!(out, Decision::Admit);
    }

    #[test]
    fn start_only_networks_are_denied_for_a_running_pod() {
        let h = Harness::new().pod_running(true);
        match h.check::<PodRunning>(selections()).unwrap() {
            Decision::Deny(reason) => assert!(reason.contains("team-a/start-only-a"), "{reason}"),
            other => panic!("expected a deny, got {other:?}"),
        }
        let out = h
            .check::<PodRunning>(vec![Selection::new("team-a", "net1")])
            .unwrap();
        assert_eq!(out, Decision::Admit);
    }
}
