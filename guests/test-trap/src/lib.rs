//! Misbehaves on purpose: panics, which aborts the guest with a trap.

use plexus_sdk::{Decision, Error, Pod, Policy, Selection};

pub struct Trap;

impl Policy for Trap {
    fn check(pod: &Pod, _s: Vec<Selection>) -> Result<Decision, Error> {
        panic!("test-trap deliberately panicked for pod {}", pod.name)
    }
}

plexus_sdk::export!(policy: Trap);
