//! `plexus-node`: the node's long-running process as a library — `plexus daemon` (the socket server over the
//! watch caches, the durable status writer, the node agent that delivers NetworkHook modules, the metrics),
//! hook distribution (OCI pulls and pushes, signatures), `plexus install`, `plexus status`, the `plexus hook`
//! commands, and what a change of a running pod's selections asks of its sandbox (`hotplug`). Built on
//! `plexus-cni` (the CNI path and the daemon's wire protocol), never the other way round.

#![warn(clippy::too_many_lines)]

pub mod cluster_args;
pub mod controller;
pub mod daemon;
pub mod distribution;
pub mod hook_cli;
pub mod hook_state;
pub mod hotplug;
pub mod install;
pub mod multus;
pub mod node_report;
pub mod status;
pub mod terminal;
