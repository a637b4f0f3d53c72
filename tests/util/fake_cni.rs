//! A recording fake CNI plugin for conformance tests (a fake: it attaches nothing).
//!
//! Installed under several names (copies or symlinks) in a test's bin dir. Every call appends one JSON line
//! `{"plugin","command","env","stdin"}` to `calls.jsonl` beside it, then behaves as `fake-config.json` beside
//! it says for `[<plugin name>][<CNI_COMMAND>]`:
//! `{"result": R}` prints R; `{"error": E}` prints the error object E and exits 1;
//! `{"exit": N, "stdout": S, "stderr": S}` prints raw text; `{"sleepMs": N}` sleeps first.
//! Without an entry, ADD passes `prevResult` through (as tuning does) or makes a result for `CNI_IFNAME` in
//! `CNI_NETNS`, honouring `runtimeConfig.ips` / `runtimeConfig.mac` (as static IPAM and tuning do) unless the
//! plugin config says `"fakeIgnoreRuntimeConfig": true`, and writes the plugin config's `fakeDeviceInfo` to
//! `runtimeConfig.CNIDeviceInfoFile` when both are there; other commands print nothing.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::path::PathBuf;

use serde_json::{json, Value};

fn main() {
    let argv0 = PathBuf::from(std::env::args().next().unwrap_or_default());
    let name = argv0
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = argv0.parent().map(PathBuf::from).unwrap_or_default();
    let mut input = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut input);
    let stdin: Value = serde_json::from_slice(&input)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&input).into()));
    let env: BTreeMap<String, String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("CNI_") || k == "PATH")
        .collect();
    let command = env.get("CNI_COMMAND").cloned().unwrap_or_default();
    let line = json!({"plugin": name, "command": command, "env": env, "stdin": stdin});
    if let Ok(mut f) = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("calls.jsonl"))
    {
        // One write per line: appends from concurrent processes stay whole.
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
    let config: Value = std::fs::read(dir.join("fake-config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    let behaviour = config
        .get(&name)
        .and_then(|p| p.get(&command))
        .cloned()
        .unwrap_or(Value::Null);
    if let Some(ms) = behaviour.get("sleepMs").and_then(Value::as_u64) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    if let Some(result) = behaviour.get("result") {
        println!("{result}");
        return;
    }
    if let Some(err) = behaviour.get("error") {
        println!("{err}");
        std::process::exit(1);
    }
    if let Some(code) = behaviour.get("exit").and_then(Value::as_i64) {
        print!(
            "{}",
            behaviour
                .get("stdout")
                .and_then(Value::as_str)
                .unwrap_or("")
        );
        eprint!(
            "{}",
            behaviour
                .get("stderr")
                .and_then(Value::as_str)
                .unwrap_or("")
        );
        std::process::exit(code as i32);
    }
    if command == "ADD" {
        // Like an SR-IOV plugin: write device information where the runtime said (device-info spec 5.1.2).
        if let (Some(info), Some(path)) = (
            stdin.get("fakeDeviceInfo"),
            stdin
                .pointer("/runtimeConfig/CNIDeviceInfoFile")
                .and_then(Value::as_str),
        ) {
            let path = std::path::Path::new(path);
            let _ = std::fs::create_dir_all(path.parent().unwrap_or(path));
            let _ = std::fs::write(path, info.to_string());
        }
        println!("{}", default_add(&stdin, &env));
    }
}

fn default_add(conf: &Value, env: &BTreeMap<String, String>) -> Value {
    if let Some(prev) = conf.get("prevResult") {
        return prev.clone();
    }
    let version = conf
        .get("cniVersion")
        .and_then(Value::as_str)
        .unwrap_or("1.0.0");
    let ifname = env.get("CNI_IFNAME").cloned().unwrap_or_default();
    let ignore_rc = conf
        .get("fakeIgnoreRuntimeConfig")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let rc = if ignore_rc {
        Value::Null
    } else {
        conf.get("runtimeConfig").cloned().unwrap_or(Value::Null)
    };
    // A stable per-interface MAC and address, so tests can predict them.
    let n = ifname
        .bytes()
        .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32))
        % 200
        + 10;
    let mac = rc
        .get("mac")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or(format!("02:00:00:00:00:{n:02x}"));
    let addresses: Vec<String> = match rc.get("ips").and_then(Value::as_array) {
        Some(ips) => ips
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        None => vec![conf
            .get("fakeAddress")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or(format!("10.88.0.{n}/24"))],
    };
    if version == "0.1.0" || version == "0.2.0" {
        return json!({"cniVersion": version, "ip4": {"ip": addresses[0], "gateway": "10.88.0.1"}});
    }
    let v3 = version.starts_with("0.3") || version == "0.4.0";
    let ips: Vec<Value> = addresses
        .iter()
        .map(|a| {
            let mut ip = json!({"address": a, "interface": 0});
            if v3 {
                ip["version"] = json!(if a.contains(':') { "6" } else { "4" });
            }
            ip
        })
        .collect();
    json!({
        "cniVersion": version,
        "interfaces": [{"name": ifname, "mac": mac, "sandbox": env.get("CNI_NETNS").cloned().unwrap_or_default()}],
        "ips": ips,
        "dns": {"nameservers": ["10.88.0.53"]},
    })
}
