//! Misbehaves on purpose: every kind returns output the host must reject. The policy invents a
//! reserved key (no period, not a spec key), the resolver returns a config without "type", the
//! status hook marks every entry default and adds a non-reverse-DNS key.

use plexus_sdk::{Decision, Error, Pod, Policy, Resolver, Selection, Status, StatusEntry, Value};
use serde_json::json;

pub struct BadOutput;

impl Policy for BadOutput {
    fn check(_pod: &Pod, mut selections: Vec<Selection>) -> Result<Decision, Error> {
        for s in &mut selections {
            s.extras.insert("color".to_string(), json!("blue"));
        }
        Ok(Decision::Rewrite(selections))
    }
}

impl Resolver for BadOutput {
    fn resolve(
        _: &Pod,
        _: &Selection,
        _: Option<&Value>,
        _: Option<&Value>,
    ) -> Result<Option<Value>, Error> {
        Ok(Some(json!({"cniVersion": "1.0.0", "bridge": "br0"})))
    }
}

impl Status for BadOutput {
    fn shape(_pod: &Pod, mut entries: Vec<StatusEntry>) -> Result<Vec<StatusEntry>, Error> {
        for e in &mut entries {
            e.default = true;
            e.extras.insert("owner".to_string(), json!("me"));
        }
        Ok(entries)
    }
}

plexus_sdk::export!(policy: BadOutput, resolver: BadOutput, status: BadOutput);
