//! `plexus daemon`: the node's long-running process. It keeps watch caches of the node's pods and the cluster's
//! NADs and answers the CNI process's reads from them over a unix socket (the protocol is
//! `plexus_cni::daemon::proto`), and it sends the network-status write and the events with its own warm client,
//! so that an ADD in steady state reads nothing from the API.
//!
//! The same process is the node agent ([`agent`]: NetworkHook resources pulled, verified, probed, compiled and
//! published as the node's hook set) and runs `plexus install --watch`: one long-lived process per node.

//!
//! The parts: [`cli`] (flags and settings), [`server`] (the process's life and the socket), [`state`] (what the
//! parts share: caches, the one pod lookup, the API behind [`state::NodeApi`], the status writer, events),
//! [`agent`] (its decision is [`hook_plan::plan`]), [`dynamic`], [`nri`] (NRI mode), [`metrics`], [`status_queue`].

pub mod agent;
pub mod authority;
pub mod cli;
pub mod compile;
pub mod dynamic;
pub mod files;
pub mod hook_plan;
pub mod metrics;
pub mod nri;
pub mod server;
pub mod state;
pub mod status_queue;

pub use cli::{parse_args, DaemonArgs, DaemonError, DaemonSettings, HookAgentOptions};
pub use server::run;

use crate::install;

/// `plexus daemon ARGS...`.
pub fn main(args: DaemonArgs) -> u8 {
    let settings = match args.settings(std::env::var("NODE_NAME").ok()) {
        Ok(s) => s,
        Err(DaemonError::Usage(e)) | Err(DaemonError::Install(install::InstallError::Usage(e))) => {
            return plexus_cni::cli::exit_code(&e)
        }
        Err(e) => {
            eprintln!("plexus daemon: {e}");
            return 2;
        }
    };
    if settings.health {
        return cli::print_health(&settings.socket);
    }
    settings.log.init();
    match server::run(settings) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!(error = %e, "daemon stopped");
            eprintln!("plexus daemon: {e}");
            1
        }
    }
}

#[cfg(test)]
mod fake;
#[cfg(test)]
mod server_tests;
#[cfg(test)]
mod state_tests;
