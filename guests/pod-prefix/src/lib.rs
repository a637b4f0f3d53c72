//! docs/hooks.md's walkthrough hook, exactly as the page writes it (its steps 2 and 3; a test checks that
//! they stay the same), so the page's code compiles, its native test runs, and the walkthrough's commands run it.

use plexus_sdk::{Decision, Error, Pod, Policy, Selection};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Settings {
    #[serde(default)]
    allowed_prefixes: Vec<String>,
}

pub struct PodPrefix;

impl Policy for PodPrefix {
    fn check(pod: &Pod, selections: Vec<Selection>) -> Result<Decision, Error> {
        let settings: Settings = plexus_sdk::settings()?;
        for s in &selections {
            if !settings.allowed_prefixes.iter().any(|p| s.name.starts_with(p.as_str())) {
                plexus_sdk::log::info(format!("{}/{}: refusing {}", pod.namespace, pod.name, s.name));
                return Ok(Decision::Deny(format!("network {} is not allowed", s.name)));
            }
        }
        Ok(Decision::Admit)
    }
}

plexus_sdk::export!(policy: PodPrefix);
// several kinds: plexus_sdk::export!(policy: PodPrefix, status: MyStatus);

#[cfg(test)]
mod tests {
    use super::*;
    use plexus_sdk::testing::Harness;
    use serde_json::json;

    #[test]
    fn only_prefixed_networks_pass() {
        let h = Harness::new()
            .pod(Pod::new("team-a", "web"))
            .settings(json!({"allowedPrefixes": ["lab-"]}));
        assert_eq!(h.check::<PodPrefix>(vec![Selection::new("team-a", "lab-1")]).unwrap(), Decision::Admit);
        assert!(matches!(h.check::<PodPrefix>(vec![Selection::new("team-a", "prod")]).unwrap(),
                         Decision::Deny(_)));
        assert_eq!(h.logs().len(), 1);
    }
}
