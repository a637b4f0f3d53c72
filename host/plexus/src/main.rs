//! The `plexus` binary: a CNI plugin when exec'd by a runtime, plus the node's long-running process and the
//! operator subcommands. (The CNI plugin alone, without the compiler and the node's parts, is `plexus-cni`.)
//!
//! Each crate has one job: `plexus-cni` is the CNI path, `plexus-node` what runs on a node (`plexus daemon`, the
//! hook agent and its distribution, `plexus install`), and this crate the command line: the dispatch, and the
//! commands an operator types against a node or the cluster ([`status`], [`hook`], [`migrate`] check), each a
//! client of the other two.

// The test harness brings its own main.
#![cfg_attr(not(test), no_main)]
#![warn(clippy::too_many_lines)]

use clap::{CommandFactory, Parser, Subcommand};

mod cluster_args;
mod hook;
mod migrate;
mod status;

plexus_cni::c_main!(real_main);

/// Plexus: a CNI plugin that attaches pods to several networks (the multi-net spec), with WebAssembly hooks.
#[derive(Debug, Parser)]
#[command(
    name = "plexus",
    version,
    after_help = "Run with no arguments and CNI_COMMAND set, plexus is the CNI plugin (as a container runtime \
                  runs it).",
    disable_help_subcommand = true
)]
struct Cli {
    #[command(subcommand)]
    command: PlexusCommand,
}

#[derive(Debug, Subcommand)]
enum PlexusCommand {
    Install(plexus_node::install::InstallArgs),
    Daemon(plexus_node::daemon::DaemonArgs),
    /// Inspect, compile, run, push and verify WebAssembly hooks
    Hook(hook::HookArgs),
    Status(status::StatusArgs),
    /// Moving from Multus: what would behave differently under Plexus
    Migrate(migrate::MigrateArgs),
    /// Print a shell completion script for plexus
    Completions {
        /// bash, elvish, fish, powershell or zsh
        shell: clap_complete::Shell,
    },
}

#[cfg_attr(test, allow(dead_code))]
fn real_main() -> u8 {
    // A runtime execs the plugin with no arguments; only an operator's command line is parsed.
    if std::env::args_os().len() <= 1 {
        return plexus_cni::entry::cni_process(plexus_cni::entry::Compile::WhenNeeded);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return plexus_cni::cli::exit_code(&e),
    };
    match cli.command {
        PlexusCommand::Install(args) => plexus_node::install::main(&args),
        PlexusCommand::Daemon(args) => plexus_node::daemon::main(args),
        PlexusCommand::Hook(args) => hook::main(args),
        PlexusCommand::Status(args) => status::main(&args),
        PlexusCommand::Migrate(args) => migrate::main(args),
        PlexusCommand::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "plexus", &mut std::io::stdout());
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
