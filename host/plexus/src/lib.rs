//! Plexus's orchestration: the CNI entry point, delegate execution, locks, the attachment cache.
//!
//! Everything here is driven by an [`invocation::Invocation`] value: no process-global state, no exit, no
//! reading of the environment or stdin below the entry point in `main.rs`.

pub mod cache;
pub mod conf;
pub mod daemon;
pub mod deleted;
pub mod distribution;
pub mod entry;
pub mod error;
pub mod exec;
pub mod hook_cli;
pub mod hooks;
pub mod install;
pub mod invocation;
pub mod lock;
pub mod orchestrate;
pub mod plan;
pub mod podnet;
pub mod podresources;
pub mod runner;
pub mod teardown;

#[cfg(test)]
mod orchestrate_tests;
