//! The floor: a minimal runtime that execs a network's plugins directly, the way libcni runs a list (name
//! and cniVersion injected into each plugin's conf, `prevResult` chained on ADD, the cached result given to
//! DEL in reverse order). What a pod would wait without Plexus.

use std::process::{Command, Stdio};

use serde_json::Value;

use crate::proc;

fn plugin_conf(list: &Value, plugin: &Value, prev: Option<&Value>) -> Value {
    let mut conf = plugin.clone();
    conf["name"] = list["name"].clone();
    conf["cniVersion"] = list["cniVersion"].clone();
    if let Some(p) = prev {
        conf["prevResult"] = p.clone();
    }
    conf
}

fn exec(
    cni_path: &str,
    plugin: &Value,
    conf: &Value,
    env: &[(String, String)],
) -> Result<Vec<u8>, String> {
    let ty = plugin["type"].as_str().unwrap_or_default();
    let bin = std::path::Path::new(cni_path).join(ty);
    let mut cmd = Command::new(&bin);
    cmd.env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stderr(Stdio::null());
    let run = proc::run(&mut cmd, conf.to_string().as_bytes())
        .map_err(|e| format!("spawn {}: {e}", bin.display()))?;
    if !run.success {
        return Err(format!(
            "floor: {ty} failed: {}",
            String::from_utf8_lossy(&run.stdout).trim()
        ));
    }
    Ok(run.stdout)
}

/// ADD of one list; returns the last plugin's result.
pub fn add(list: &Value, cni_path: &str, env: &[(String, String)]) -> Result<Value, String> {
    let mut prev: Option<Value> = None;
    for plugin in list["plugins"].as_array().into_iter().flatten() {
        let conf = plugin_conf(list, plugin, prev.as_ref());
        let out = exec(cni_path, plugin, &conf, env)?;
        prev = Some(
            serde_json::from_slice(&out).map_err(|e| format!("floor: result is not JSON: {e}"))?,
        );
    }
    prev.ok_or_else(|| "floor: a list without plugins".to_string())
}

/// DEL of one list, plugins in reverse, each given the ADD result.
pub fn del(
    list: &Value,
    cni_path: &str,
    env: &[(String, String)],
    result: &Value,
) -> Result<(), String> {
    for plugin in list["plugins"].as_array().into_iter().flatten().rev() {
        let conf = plugin_conf(list, plugin, Some(result));
        exec(cni_path, plugin, &conf, env)?;
    }
    Ok(())
}
