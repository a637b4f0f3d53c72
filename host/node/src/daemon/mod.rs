//! `plexus daemon`: the node's long-running process. It keeps watch caches of the node's pods and the cluster's
//! NADs and answers the CNI process's reads from them over a unix socket (the protocol is
//! `plexus_cni::daemon::proto`), and it sends the network-status write and the events with its own warm client,
//! so that an ADD in steady state reads nothing from the API.
//!
//! The same process is the node agent ([`agent`]: NetworkHook resources pulled, verified, probed, compiled and
//! published as the node's hook set) and runs `plexus install --watch`: one long-lived process per node.

pub mod agent;
pub mod dynamic;
pub mod files;
pub mod metrics;
mod server;
pub mod status_queue;

pub use server::*;

/// A retry delay spread by ±25%, so that nodes (or pods) failing together do not come back together.
pub(crate) fn jitter(delay: std::time::Duration) -> std::time::Duration {
    use std::hash::{BuildHasher, Hasher};
    // A fresh RandomState is randomly keyed: enough randomness for spreading retries.
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    delay.mul_f64(0.75 + (r % 1000) as f64 / 2000.0)
}
