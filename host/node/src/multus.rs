//! Moving a node from Multus: `plexus install --from-multus FILE` turns a Multus conf into the plexus conflist
//! that does the same job (`"compat": "multus"`, so what the cluster wrote for Multus keeps working), and names
//! every key that has no equivalent. Thin Multus (`"type": "multus"`, its `00-multus.conf`), the thick plugin's
//! shim conf (`"type": "multus-shim"`) and the thick daemon's own configuration (`daemon-config.json`) are read.

use serde_json::{json, Map, Value};

/// The node's CNI conf dir, where the runtime and Multus's auto-configuration look.
const NODE_CONF_DIR: &str = "/etc/cni/net.d";

/// The largest Multus conf read (they are a few KiB).
const MAX_BYTES: usize = 1 << 20;

/// What a Multus conf becomes: the conflist, and a line for each key that was not carried over.
#[derive(Debug, Clone, PartialEq)]
pub struct Converted {
    pub conflist: Value,
    pub notes: Vec<String>,
}

/// A Multus conf file as JSON, read bounded ([`MAX_BYTES`]); errors name the file.
pub fn read_conf(path: &std::path::Path) -> Result<Value, String> {
    let text = plexus_cni::conf::read_capped(path, MAX_BYTES)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))
}

/// Reads a Multus conf from `path` (bounded) and converts it.
pub fn from_file(path: &std::path::Path) -> Result<Converted, String> {
    from_multus(&read_conf(path)?).map_err(|e| format!("{}: {e}", path.display()))
}

/// Multus's `logLevel` as Plexus's (`panic` and `verbose` have no level of their own).
fn log_level(level: &str) -> Option<&'static str> {
    match level {
        "panic" | "error" => Some("error"),
        "warning" | "warn" => Some("warn"),
        "verbose" => Some("info"),
        "debug" => Some("debug"),
        _ => None,
    }
}

/// Converts one Multus conf (a conflist whose first plugin is Multus counts as that plugin).
pub fn from_multus(conf: &Value) -> Result<Converted, String> {
    let Value::Object(top) = conf else {
        return Err("a Multus conf is a JSON object".into());
    };
    // The thick daemon's configuration has no type; a conflist carries the conf as its first plugin.
    let (conf, list_version) = match top.get("plugins").and_then(Value::as_array) {
        Some(plugins) => (
            plugins
                .first()
                .and_then(Value::as_object)
                .ok_or("its \"plugins\" has no first plugin object")?,
            top.get("cniVersion"),
        ),
        None => (top, None),
    };
    let daemon_config = conf.contains_key("multusConfigFile") || conf.contains_key("chrootDir");
    match conf.get("type").and_then(Value::as_str) {
        Some("multus") | Some("multus-shim") => {}
        None if daemon_config => {}
        Some(other) => return Err(format!("not a Multus conf: its type is {other:?}")),
        None => return Err("not a Multus conf: no \"type\"".into()),
    }
    let mut plugin = Map::new();
    plugin.insert("type".into(), json!("plexus"));
    plugin.insert("compat".into(), json!("multus"));
    let mut notes: Vec<String> = conf
        .iter()
        .filter_map(|(key, value)| {
            let why = convert_key(&mut plugin, key, value)?;
            Some(format!("{key}: {why}"))
        })
        .collect();
    if !plugin.contains_key("clusterNetwork") {
        // Multus then generates its conf from the first conf of the node's CNI conf dir; under compat a directory
        // as clusterNetwork means just that.
        plugin.insert("clusterNetwork".into(), json!(NODE_CONF_DIR));
        notes.push(format!(
            "clusterNetwork: not set (Multus takes the first conf of the node's conf dir): set to {NODE_CONF_DIR}, \
             whose first conf file other than Plexus's is the cluster network under \"compat\": \"multus\""
        ));
    }
    let version = list_version
        .or_else(|| conf.get("cniVersion"))
        .cloned()
        .unwrap_or_else(|| json!("1.0.0"));
    Ok(Converted {
        conflist: json!({"cniVersion": version, "name": "plexus", "plugins": [Value::Object(plugin)]}),
        notes,
    })
}

/// Carries one key of a Multus conf over to the plexus conf `plugin`, or says why not: the note for the operator.
fn convert_key(plugin: &mut Map<String, Value>, key: &str, value: &Value) -> Option<String> {
    let text = value.as_str().unwrap_or_default();
    let why = match key {
        "type" | "name" | "cniVersion" => return None,
        "defaultNetworks" | "systemNamespaces" | "confDir" | "binDir" | "logFile" | "capabilities"
        | "clusterNetwork" => {
            plugin.insert(key.into(), value.clone());
            return None;
        }
        "multusNamespace" => {
            plugin.insert("plexusNamespace".into(), value.clone());
            return None;
        }
        "readinessindicatorfile" | "readinessIndicatorFile" => {
            if !text.is_empty() {
                plugin.insert("readinessIndicatorFile".into(), value.clone());
            }
            return None;
        }
        "kubeconfig" if !text.is_empty() => {
            plugin.insert("cluster".into(), json!({"source": "kube", "kubeconfig": value}));
            return None;
        }
        "logLevel" => {
            let Some(level) = log_level(text) else {
                return Some(format!("{value} is not a level; Plexus logs at info"));
            };
            plugin.insert("logLevel".into(), json!(level));
            return None;
        }
        "logToStderr" | "logOptions" => {
            "Plexus logs to stderr unless logFile is set, and does not rotate logFile (leave that to logrotate)"
        }
        "cniDir" => "Plexus keeps its attachment cache in cacheDir (/var/lib/plexus), in its own format; Multus's is not read",
        "namespaceIsolation" | "globalNamespaces" => {
            "no built-in equivalent: the namespace-isolation policy hook (guests/namespace-isolation) keeps pods to their \
             own namespace's NADs and the global namespaces its settings list"
        }
        "delegates" => {
            "inline delegates are not read: put the cluster network's conf in the conf dir and name it in clusterNetwork"
        }
        "socketDir" | "daemonSocketDir" => {
            "the thick plugin's socket: Plexus's node daemon has its own (daemon.socket, default /run/plexus/daemon.sock)"
        }
        "multusConfigFile" if text == "auto" => {
            "\"auto\": plexus install picks the cluster network's conf the same way (the first conf in --conf-dir that \
             is not its own): install with the DaemonSet instead of this file"
        }
        "cniConfigDir" | "multusAutoconfigDir" | "chrootDir" | "multusConfigFile" => {
            "the thick daemon's own setting: the DaemonSet's install does this job"
        }
        "retryDeleteOnError" => {
            "Plexus retries nothing on DEL: a failed delegate DEL is reported and the next DEL tries again"
        }
        _ => "no equivalent in Plexus",
    };
    Some(why.to_string())
}
