//! Misbehaves on purpose: tries to read a host file (settings `path`, default `/etc/passwd`), list
//! the environment and the arguments, and reports what it got as a deny reason, so a test can assert
//! that the sandbox gave it nothing.

use plexus_sdk::{Decision, Error, Pod, Policy, Selection};
use serde::Deserialize;

#[derive(Deserialize)]
struct Settings {
    #[serde(default = "default_path")]
    path: String,
}

fn default_path() -> String {
    "/etc/passwd".to_string()
}

pub struct ReadHostFile;

impl Policy for ReadHostFile {
    fn check(_pod: &Pod, _s: Vec<Selection>) -> Result<Decision, Error> {
        let settings: Settings = plexus_sdk::settings()?;
        let file = match std::fs::read(&settings.path) {
            Ok(bytes) => format!("file: read {} bytes", bytes.len()),
            Err(e) => format!("file: denied ({e})"),
        };
        let dir = match std::fs::read_dir("/") {
            Ok(entries) => format!("dir: listed {} entries", entries.count()),
            Err(e) => format!("dir: denied ({e})"),
        };
        let env = std::env::vars().count();
        let args = std::env::args().count();
        Ok(Decision::Deny(format!(
            "{file}; {dir}; env: {env} vars; args: {args}"
        )))
    }
}

plexus_sdk::export!(policy: ReadHostFile);
