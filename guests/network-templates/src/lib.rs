//! A resolver hook: a NetworkAttachmentDefinition without a config (spec 3.2.4) whose name has an
//! entry in `templates` resolves to that CNI configuration; one whose selection uses a ResourceClaim's
//! device (WIT 0.1.2) and has no template of its own resolves to the template of the device's DRA driver
//! in `driverTemplates`.

use plexus_sdk::{Error, Pod, Resolver, Selection, Value};
use serde::Deserialize;
use serde_json::Map;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[serde(default)]
    templates: Map<String, Value>,
    /// Templates by DRA driver name, for selections that use a claim's device.
    #[serde(default, rename = "driverTemplates")]
    driver_templates: Map<String, Value>,
}

pub struct NetworkTemplates;

impl Resolver for NetworkTemplates {
    fn resolve(
        _pod: &Pod,
        selection: &Selection,
        _nad: Option<&Value>,
        config: Option<&Value>,
    ) -> Result<Option<Value>, Error> {
        if config.is_some() {
            // The NAD (or an earlier resolver) already has a config: templates only fill gaps.
            return Ok(None);
        }
        let settings: Settings = plexus_sdk::settings()?;
        let (key, template) = match settings.templates.get(&selection.name) {
            Some(t) => (selection.name.clone(), t),
            None => {
                let Some(device) = plexus_sdk::selection_device(selection) else {
                    return Ok(None);
                };
                match settings.driver_templates.get(&device.driver) {
                    Some(t) => {
                        plexus_sdk::log::debug(format!(
                            "{} uses {} of claim {}: template of its driver",
                            selection.name, device.device, device.claim
                        ));
                        (device.driver, t)
                    }
                    None => return Ok(None),
                }
            }
        };
        match template {
            Value::Object(_) => {
                plexus_sdk::log::debug(format!("template for {}", selection.name));
                Ok(Some(template.clone()))
            }
            _ => Err(Error::msg(format_args!(
                "template {key:?} is not a JSON object"
            ))),
        }
    }
}

plexus_sdk::export!(resolver: NetworkTemplates);

#[cfg(test)]
mod tests {
    use super::*;
    use plexus_sdk::testing::Harness;
    use serde_json::json;

    fn harness() -> Harness {
        Harness::new().settings(json!({"templates": {
            "lab": {"cniVersion": "1.0.0", "type": "bridge", "bridge": "lab0"}
        }}))
    }

    #[test]
    fn nad_without_config_resolves_to_its_template() {
        let nad = json!({"metadata": {"name": "lab", "namespace": "default"}});
        let out = harness()
            .resolve::<NetworkTemplates>(&Selection::new("default", "lab"), Some(&nad), None)
            .unwrap();
        assert_eq!(out.unwrap()["bridge"], "lab0");
    }

    #[test]
    fn existing_config_is_left_alone() {
        let cfg = json!({"type": "macvlan"});
        let out = harness()
            .resolve::<NetworkTemplates>(&Selection::new("default", "lab"), None, Some(&cfg))
            .unwrap();
        assert_eq!(out, None);
    }

    #[test]
    fn names_without_template_are_left_alone() {
        let out = harness()
            .resolve::<NetworkTemplates>(&Selection::new("default", "other"), None, None)
            .unwrap();
        assert_eq!(out, None);
    }

    #[test]
    fn a_selection_with_a_claim_device_gets_its_drivers_template() {
        let device = plexus_sdk::ClaimDevice {
            claim: "web-nics".into(),
            request: "nic".into(),
            driver: "sriov.example.com".into(),
            pool: "node1".into(),
            device: "vf1".into(),
            device_id: Some("0000:01:00.2".into()),
            resource_name: None,
        };
        let h = Harness::new()
            .settings(json!({"driverTemplates": {"sriov.example.com": {"type": "sriov"}}}))
            .device("default", "fast", device);
        let out = h
            .resolve::<NetworkTemplates>(&Selection::new("default", "fast"), None, None)
            .unwrap();
        assert_eq!(out.unwrap()["type"], "sriov");
        // Another selection has no device: nothing to template.
        let out = h
            .resolve::<NetworkTemplates>(&Selection::new("default", "other"), None, None)
            .unwrap();
        assert_eq!(out, None);
    }

    #[test]
    fn non_object_template_is_a_fault() {
        let err = Harness::new()
            .settings(json!({"templates": {"lab": "bridge"}}))
            .resolve::<NetworkTemplates>(&Selection::new("default", "lab"), None, None)
            .unwrap_err();
        assert!(err.to_string().contains("not a JSON object"), "{err}");
    }
}
