//! The command line of the CNI-only binary, and what every plexus command line shares: usage mistakes go to
//! stderr with exit code 2, `--help` and `--version` to stdout with 0 (clap's conventions).
//!
//! A container runtime execs the plugin with no arguments (the CNI protocol is the environment and stdin):
//! that path never builds the parser.

use clap::{Args, Parser, Subcommand};

use crate::uninstall::{self, UninstallArgs};

/// What a mistake on this binary's command line is told.
const FULL_BINARY: &str = "plexus-cni only uninstalls (install --uninstall); installing, the daemon and \
                           the hook commands are the full plexus binary's (the image's /usr/local/bin/plexus).";

/// `plexus-cni`: the plexus CNI plugin alone (installed on nodes as `plexus`).
#[derive(Debug, Parser)]
#[command(
    name = "plexus-cni",
    version = concat!(env!("CARGO_PKG_VERSION"), " (CNI plugin only)"),
    about = "The plexus CNI plugin alone: run by a container runtime with CNI_COMMAND set and no arguments.",
    after_help = "The daemon, the installer and the hook commands are the full plexus binary's \
                  (the image's /usr/local/bin/plexus).",
    disable_help_subcommand = true
)]
pub struct CniCli {
    #[command(subcommand)]
    pub command: CniCommand,
}

#[derive(Debug, Subcommand)]
pub enum CniCommand {
    /// Take Plexus's conf off this node: install --uninstall (installing is the full binary's)
    Install(UninstallOnly),
}

/// `install --uninstall`: the node's documented uninstall step runs the binary that is on the node, this one.
#[derive(Debug, Args)]
#[command(
    after_help = "Removes <conf-dir>/00-plexus.conflist when it is Plexus's, and the kubeconfig plexus install \
                  wrote. The binary stays: pods attached while Plexus was installed need it for DEL. Installing \
                  is a command of the full plexus binary (the image's /usr/local/bin/plexus)."
)]
pub struct UninstallOnly {
    /// Remove what plexus install wrote (required: this binary does nothing else)
    #[arg(long, required = true)]
    pub uninstall: bool,
    #[command(flatten)]
    pub target: UninstallArgs,
}

/// Prints a parse failure as clap does and gives the exit code: 0 for `--help`/`--version`, 2 for a mistake.
pub fn exit_code(e: &clap::Error) -> u8 {
    let _ = e.print();
    if e.use_stderr() {
        2
    } else {
        0
    }
}

/// The CNI-only binary's `main`: `args` is the whole command line, program name first.
pub fn main(args: impl IntoIterator<Item = std::ffi::OsString>) -> u8 {
    match CniCli::try_parse_from(args) {
        Ok(CniCli {
            command: CniCommand::Install(only),
        }) => uninstall::main(&only.target.options()),
        Err(e) => {
            let code = exit_code(&e);
            if code != 0 {
                eprintln!("\n{FULL_BINARY}");
            }
            code
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(a: &[&str]) -> Result<CniCli, clap::Error> {
        CniCli::try_parse_from(std::iter::once("plexus-cni").chain(a.iter().copied()))
    }

    #[test]
    fn only_uninstall_is_accepted() {
        let CniCommand::Install(o) = parse(&["install", "--uninstall", "--conf-dir=/h"])
            .unwrap()
            .command;
        assert!(o.uninstall);
        assert_eq!(
            o.target.options().kubeconfig_out,
            std::path::Path::new("/h/plexus.d/plexus.kubeconfig")
        );
        let e = parse(&["install"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        assert!(e.to_string().contains("--uninstall"), "{e}");
        let e = parse(&["install", "--uninstall", "--watch"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument);
        assert!(e.to_string().contains("--watch"), "{e}");
        let e = parse(&["daemon"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidSubcommand);
        let help = parse(&["install", "--help"]).unwrap_err();
        assert!(!help.use_stderr());
        assert!(help.to_string().contains("full plexus binary"), "{help}");
    }
}
