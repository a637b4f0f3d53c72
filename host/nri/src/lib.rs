//! The Node Resource Interface (NRI) as an external plugin speaks it, for the node daemon's NRI mode: the runtime
//! (containerd 2, CRI-O) listens on a Unix socket; a plugin connects, registers, and is called at pod sandbox
//! events.
//!
//! Three layers, each in its module: the socket's multiplexer ([`mux`]: two byte streams in one connection),
//! ttrpc over each stream ([`ttrpc`]: unary requests and responses), and NRI's messages ([`api`], the subset
//! Plexus uses), with one plugin session on top ([`plugin`]).
//!
//! ttrpc is written here rather than taken from the `ttrpc` crate: that crate wants a listening or connected
//! socket per ttrpc connection (NRI multiplexes two over one), and its messages are rust-protobuf's, generated at
//! build time, beside the prost messages the rest of the workspace declares. What NRI uses of ttrpc (unary calls,
//! a 10-byte header, two protobuf messages) is smaller than the glue either would need.

pub mod api;
pub mod mux;
pub mod plugin;
pub mod ttrpc;

pub use api::{Event, PodSandbox};
pub use plugin::{run, Ended, Plugin, Registration, Runtime};
