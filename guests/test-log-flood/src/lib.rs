//! Misbehaves on purpose: writes megabytes to stdout and stderr and thousands of lines to the log
//! import, then admits (the host's output caps must hold and the call must still complete).

use plexus_sdk::{Decision, Error, Pod, Policy, Selection};
use std::io::Write;

pub struct LogFlood;

impl Policy for LogFlood {
    fn check(_pod: &Pod, _s: Vec<Selection>) -> Result<Decision, Error> {
        let line = "flood ".repeat(170) + "\n";
        for _ in 0..4096 {
            // print! panics when a write fails: a cap that errors instead of dropping would trap here.
            print!("{line}");
            eprint!("{line}");
        }
        let _ = std::io::stdout().flush();
        for i in 0..10_000 {
            plexus_sdk::log::info(format!("flood line {i} {}", "x".repeat(200)));
        }
        Ok(Decision::Admit)
    }
}

plexus_sdk::export!(policy: LogFlood);
