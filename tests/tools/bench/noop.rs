//! The no-op delegate: the bench binary itself, exec'd under the name `bench-noop`. It reads its conf and prints
//! a fixed result for ADD, so that what remains of a pod's wait is process creation plus the caller's own work.
//!
//! With `"benchLog": PATH` in its plugin conf it appends `<parent pid> <command> <ifname> <start ns> <end ns>
//! <grandparent pid>` to PATH, sleeping `benchSleepMs` in between, so that the serialization check sees every
//! delegate's interval and which plexus process ran it (a DEL runs its delegates from a teardown process of its
//! own, whose parent is the plexus process the runtime started).

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub const NAME: &str = "bench-noop";

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

pub fn main() -> ExitCode {
    let mut input = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut input);
    let command = std::env::var("CNI_COMMAND").unwrap_or_default();
    let ifname = std::env::var("CNI_IFNAME").unwrap_or_default();
    let start = now_ns();
    // Parsing is only paid by the serialization check, which asks for it.
    if input.windows(8).any(|w| w == b"benchLog") {
        let conf: serde_json::Value = serde_json::from_slice(&input).unwrap_or_default();
        if let Some(ms) = conf.get("benchSleepMs").and_then(|v| v.as_u64()) {
            std::thread::sleep(Duration::from_millis(ms));
        }
        if let Some(path) = conf.get("benchLog").and_then(|v| v.as_str()) {
            let parent = std::os::unix::process::parent_id();
            let line = format!(
                "{parent} {command} {ifname} {start} {} {}\n",
                now_ns(),
                plexus_tests::parent_of(parent).unwrap_or(0)
            );
            // O_APPEND and one write per line: lines of concurrent writers never interleave.
            let ok = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| f.write_all(line.as_bytes()));
            if ok.is_err() {
                return ExitCode::FAILURE;
            }
        }
    }
    let mut out = std::io::stdout().lock();
    let text = match command.as_str() {
        "ADD" => format!(
            r#"{{"cniVersion":"1.0.0","interfaces":[{{"name":"{ifname}","mac":"02:42:ac:11:00:02","sandbox":"/var/run/netns/bench"}}],"ips":[{{"address":"10.77.0.2/24","gateway":"10.77.0.1","interface":0}}],"dns":{{}}}}"#
        ),
        "VERSION" => {
            r#"{"cniVersion":"1.0.0","supportedVersions":["0.3.1","0.4.0","1.0.0"]}"#.to_string()
        }
        _ => String::new(),
    };
    let _ = out.write_all(text.as_bytes());
    ExitCode::SUCCESS
}
