//! Plexus's pure core: CNI data types, version conversion and the multi-net spec's rules.
//!
//! Nothing in this crate performs I/O: every function takes data and returns data, so the rules can be
//! tested exhaustively and reused by a future node daemon.

pub mod cni;
pub mod spec;
