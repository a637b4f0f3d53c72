//! A status hook: adds `"io.plexus.pod-labels": {label: value}` to every network-status entry, for
//! the pod labels named in `labels` that the pod has (merged into the map an earlier hook left there).

use plexus_sdk::{Error, Pod, Status, StatusEntry, Value};
use serde::Deserialize;
use serde_json::Map;

const KEY: &str = "io.plexus.pod-labels";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[serde(default)]
    labels: Vec<String>,
}

pub struct StatusLabels;

impl Status for StatusLabels {
    fn shape(pod: &Pod, mut entries: Vec<StatusEntry>) -> Result<Vec<StatusEntry>, Error> {
        let settings: Settings = plexus_sdk::settings()?;
        let picked: Map<String, Value> = settings
            .labels
            .iter()
            .filter_map(|l| {
                pod.labels
                    .get(l)
                    .map(|v| (l.clone(), Value::String(v.clone())))
            })
            .collect();
        // Merged into what an earlier hook put there, so several of these hooks can each add their labels.
        for e in &mut entries {
            let slot = e
                .extras
                .entry(KEY.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            match slot {
                Value::Object(m) => m.extend(picked.clone()),
                other => *other = Value::Object(picked.clone()),
            }
        }
        Ok(entries)
    }
}

plexus_sdk::export!(status: StatusLabels);

#[cfg(test)]
mod tests {
    use super::*;
    use plexus_sdk::testing::Harness;
    use serde_json::json;

    #[test]
    fn chosen_labels_are_added_to_every_entry() {
        let pod = Pod::new("default", "web")
            .with_label("app", "web")
            .with_label("tier", "front")
            .with_label("secret", "x");
        let out = Harness::new()
            .pod(pod)
            .settings(json!({"labels": ["app", "tier", "missing"]}))
            .shape::<StatusLabels>(vec![
                StatusEntry::new("kube-system/pod-net", true),
                StatusEntry::new("default/lab", false),
            ])
            .unwrap();
        assert_eq!(out.len(), 2);
        for e in &out {
            assert_eq!(e.extras[KEY], json!({"app": "web", "tier": "front"}));
        }
        assert!(out[0].default && !out[1].default);
    }

    #[test]
    fn labels_merge_with_those_an_earlier_hook_added() {
        let pod = Pod::new("default", "web")
            .with_label("app", "web")
            .with_label("tier", "front");
        let mut earlier = StatusEntry::new("kube-system/pod-net", true);
        earlier
            .extras
            .insert(KEY.into(), json!({"tier": "old", "zone": "a"}));
        let out = Harness::new()
            .pod(pod)
            .settings(json!({"labels": ["tier"]}))
            .shape::<StatusLabels>(vec![earlier])
            .unwrap();
        assert_eq!(out[0].extras[KEY], json!({"tier": "front", "zone": "a"}));
    }
}
