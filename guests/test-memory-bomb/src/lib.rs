//! Misbehaves on purpose: allocates and touches memory until it is stopped (the host's memory limit
//! must hold).

use plexus_sdk::{Decision, Error, Pod, Policy, Selection};

pub struct MemoryBomb;

impl Policy for MemoryBomb {
    fn check(_pod: &Pod, _s: Vec<Selection>) -> Result<Decision, Error> {
        let mut hoard: Vec<Vec<u8>> = Vec::new();
        loop {
            hoard.push(vec![0xa5; 1 << 20]);
            std::hint::black_box(&hoard);
        }
    }
}

plexus_sdk::export!(policy: MemoryBomb);
