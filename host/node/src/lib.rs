//! `plexus-node`: what runs on a node, as a library — `plexus daemon` (the socket server over the watch caches, the
//! durable status writer, the node agent that delivers NetworkHook modules, NRI mode, the metrics), hook
//! distribution (OCI pulls and pushes, signatures), `plexus install` (with the Multus conf conversion of
//! `--from-multus`), and what a change of a running pod's selections asks of its sandbox (`hotplug`). Built on
//! `plexus-cni` (the CNI path and the daemon's wire protocol), never the other way round. The commands an operator
//! types against a node or the cluster (`plexus status`, `plexus hook`, `plexus migrate check`) are the `plexus`
//! crate's, clients of this one.

#![warn(clippy::too_many_lines)]

pub mod controller;
pub mod daemon;
pub mod distribution;
pub mod hook_state;
pub mod hotplug;
pub mod install;
pub mod multus;
pub mod node_report;
pub mod terminal;
