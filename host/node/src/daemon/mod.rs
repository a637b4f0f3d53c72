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
