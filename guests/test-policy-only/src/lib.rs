//! Exports only `plexus:hooks/policy` (world `policy-hook`), written against the WIT directly: shows
//! that the host loads a component exporting a subset of the hook interfaces, and refuses it for a
//! kind it does not export. Denies every pod, reporting what it received.
//!
//! Built against a copy of the contract as it was at 0.1.0 (`wit/`, never edited), so that the same tests
//! show the host still loads and runs components built against an earlier patch version.

wit_bindgen::generate!({
    path: "wit",
    world: "policy-hook",
});

use exports::plexus::hooks::policy::{Decision, Guest};
use plexus::hooks::host::{self, Level};
use plexus::hooks::types::{Pod, Selection};

struct PolicyOnly;

impl Guest for PolicyOnly {
    fn check(pod: Pod, selections: Vec<Selection>) -> Result<Decision, String> {
        host::log(Level::Info, "test-policy-only called");
        Ok(Decision::Deny(format!(
            "policy-only saw {} selections of {}/{} with settings {}",
            selections.len(),
            pod.namespace,
            pod.name,
            host::settings()
        )))
    }
}

export!(PolicyOnly);
