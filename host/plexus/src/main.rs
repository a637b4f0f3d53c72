//! The `plexus` binary: a CNI plugin when exec'd by a runtime, plus a few operator subcommands.

use std::io::{Read, Write};
use std::process::ExitCode;

mod hook_cli;
mod install;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(sub) = args.get(1) {
        match sub.as_str() {
            "--version" | "version" => {
                println!("plexus {}", env!("CARGO_PKG_VERSION"));
                return ExitCode::SUCCESS;
            }
            "hook" => return hook_cli::main(&args[2..]),
            "install" => return install::main(&args[2..]),
            other => {
                eprintln!("plexus: unknown subcommand {other:?}; plexus is run by a container runtime with CNI_COMMAND set");
                return ExitCode::from(2);
            }
        }
    }
    let env = std::env::vars().collect();
    let mut stdin = Vec::new();
    // VERSION may come with no stdin at all; a read error is treated as empty input.
    let _ = std::io::stdin().read_to_end(&mut stdin);
    let outcome = plexus::entry::run(&env, &stdin);
    if let Some(text) = outcome.stdout {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }
    if outcome.success {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
