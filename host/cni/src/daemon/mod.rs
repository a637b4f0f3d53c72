//! The CNI side of the node daemon: its wire protocol ([`proto`], the one definition both sides use) and the
//! client the CNI process asks ([`client`]). The daemon itself (`plexus daemon`: watch caches, status writer,
//! node agent) is the `plexus-node` crate.
//!
//! The CNI process keeps everything that touches the pod (lock, cache journal, delegates, rollback, DEL): the
//! daemon only answers questions, and a daemon that is absent, unsynced, busy or slow means the CNI process
//! asks the API itself (thin mode). See [`client`].

pub mod client;
pub mod proto;

/// Where the daemon listens unless told otherwise (the CNI side's default is `<runDir>/daemon.sock`).
pub const DEFAULT_SOCKET: &str = "/run/plexus/daemon.sock";
