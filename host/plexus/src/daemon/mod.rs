//! `plexus daemon`: the node's long-running process. It keeps watch caches of the node's pods and the cluster's
//! NADs and answers the CNI process's reads from them over a unix socket, and it sends the network-status
//! write and the events with its own warm client, so that an ADD in steady state reads nothing from the API.
//!
//! The CNI process keeps everything that touches the pod (lock, cache journal, delegates, rollback, DEL): the
//! daemon only answers questions, and a daemon that is absent, unsynced, busy or slow means the CNI process
//! asks the API itself (thin mode). See [`client`].
//!
//! The same process is the node agent ([`agent`]: NetworkHook resources pulled, verified, compiled and published
//! as the node's hook set) and runs `plexus install --watch`: one long-lived process per node.

#[cfg(feature = "node")]
pub mod agent;
pub mod client;
#[cfg(feature = "node")]
pub mod files;
pub mod proto;
#[cfg(feature = "node")]
mod server;
#[cfg(feature = "node")]
pub mod status_queue;

#[cfg(feature = "node")]
pub use server::*;

/// Where the daemon listens unless told otherwise (the CNI side's default is `<runDir>/daemon.sock`).
pub const DEFAULT_SOCKET: &str = "/run/plexus/daemon.sock";

/// A retry delay spread by ±25%, so that nodes (or pods) failing together do not come back together.
#[cfg(feature = "node")]
pub(crate) fn jitter(delay: std::time::Duration) -> std::time::Duration {
    use std::hash::{BuildHasher, Hasher};
    // A fresh RandomState is randomly keyed: enough randomness for spreading retries.
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    delay.mul_f64(0.75 + (r % 1000) as f64 / 2000.0)
}
