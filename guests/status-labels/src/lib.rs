//! A status hook: adds `"io.plexus.pod-labels": {label: value}` to every network-status entry, for
//! the pod labels named in `labels` that the pod has.

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
        for e in &mut entries {
            e.extras
                .insert(KEY.to_string(), Value::Object(picked.clone()));
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
}
