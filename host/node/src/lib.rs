//! `plexus-node`: the node's long-running process as a library — `plexus daemon` (the socket server over the
//! watch caches, the durable status writer, the node agent that delivers NetworkHook modules), hook
//! distribution (OCI pulls and pushes, signatures), `plexus install` and the `plexus hook` commands. Built on
//! `plexus-cni` (the CNI path and the daemon's wire protocol), never the other way round.

pub mod daemon;
pub mod distribution;
pub mod hook_cli;
pub mod install;
pub mod status;
