//! Network configuration lists (spec section 1) and the per-plugin request configuration derived from
//! them (spec section 3, "Deriving request configuration from plugin configuration").

use serde_json::{Map, Value};

use super::error::{kind, CniErrorCode, ErrorCode};
use super::version::{parse_triple, CniVersion, UnsupportedVersion};

/// A parsed network configuration: a `.conflist`, or a single `.conf` plugin object promoted to a
/// one-plugin list (as libcni's `ConfListFromConf` does).
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkConfigList {
    /// The selected version: the highest supported one among `cniVersion` and `cniVersions`.
    pub cni_version: CniVersion,
    pub name: String,
    pub disable_check: bool,
    pub disable_gc: bool,
    /// The plugin configuration objects, unchanged (each has a valid `type`).
    pub plugins: Vec<Map<String, Value>>,
}

/// What is wrong with a network configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfError {
    #[error("network configuration must be a JSON object, got {0}")]
    NotAnObject(&'static str),
    #[error("network configuration has no \"cniVersion\"")]
    MissingCniVersion,
    #[error("network configuration has an invalid cniVersion: {0}")]
    InvalidCniVersion(String),
    #[error("network configuration: {0}")]
    UnsupportedCniVersion(UnsupportedVersion),
    #[error("network configuration has no \"name\"")]
    MissingName,
    #[error("invalid network name {0:?}: it must start with an ASCII letter or digit, followed by letters, digits, '_', '.' or '-'")]
    InvalidName(String),
    #[error("network configuration: invalid {field}: {reason}")]
    InvalidField { field: String, reason: String },
    #[error("network configuration has an empty \"plugins\" list")]
    NoPlugins,
    #[error("network configuration: plugins[{index}] is not a JSON object")]
    PluginNotObject { index: usize },
    #[error("network configuration: plugins[{index}] has no \"type\"")]
    MissingType { index: usize },
    #[error("network configuration: plugins[{index}] has an invalid \"type\" {type_name:?}: it must be a plain file name")]
    InvalidType { index: usize, type_name: String },
}

impl CniErrorCode for ConfError {
    fn cni_code(&self) -> u32 {
        match self {
            ConfError::NotAnObject(_) => ErrorCode::Decoding.code(),
            ConfError::UnsupportedCniVersion(_) => ErrorCode::IncompatibleVersion.code(),
            _ => ErrorCode::InvalidConfig.code(),
        }
    }
}

/// The CNI network name rule: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$` (spec section 1; libcni
/// `utils.ValidateNetworkName`).
pub fn is_valid_network_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A plugin `type` must name a file in a plugin directory: non-empty, not `.` or `..`, and without `/`,
/// `\` or NUL.
pub fn is_valid_plugin_type(t: &str) -> bool {
    !t.is_empty() && t != "." && t != ".." && !t.contains(['/', '\\', '\0'])
}

/// Delegating plugins that take the directories they exec from out of their own configuration (`binDir`,
/// `confDir`, a kubeconfig): Plexus itself and Multus. A delegate of one of these types would let whoever wrote
/// the configuration (a NAD's or a claim's author) choose what the node runs as root, so none is ever a delegate
/// (design.md, "Who may make a node run what").
pub const DELEGATING_PLUGIN_TYPES: [&str; 3] = ["plexus", "multus", "multus-shim"];

/// Whether `t` is one of [`DELEGATING_PLUGIN_TYPES`].
pub fn is_delegating_plugin_type(t: &str) -> bool {
    DELEGATING_PLUGIN_TYPES.contains(&t)
}

fn field(field: impl Into<String>, reason: impl Into<String>) -> ConfError {
    ConfError::InvalidField {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The version to use: with `cniVersions`, the highest supported among it and `cniVersion` (entries
/// newer than 1.1.0 or not a released version are skipped; malformed ones are errors, as in libcni);
/// without it, `cniVersion`, which must be a supported version.
fn select_version(obj: &Map<String, Value>) -> Result<CniVersion, ConfError> {
    let version = match obj.get("cniVersion") {
        None => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(other) => {
            return Err(ConfError::InvalidCniVersion(format!(
                "expected a string, got {}",
                kind(other)
            )))
        }
    };
    let Some(list) = obj.get("cniVersions") else {
        return match version {
            None | Some("") => Err(ConfError::MissingCniVersion),
            Some(v) => v.parse().map_err(ConfError::UnsupportedCniVersion),
        };
    };
    let list = list.as_array().ok_or_else(|| {
        ConfError::InvalidCniVersion(format!(
            "\"cniVersions\" must be an array, got {}",
            kind(list)
        ))
    })?;
    let mut candidates = Vec::with_capacity(list.len() + 1);
    for (i, v) in list.iter().enumerate() {
        let s = v.as_str().ok_or_else(|| {
            ConfError::InvalidCniVersion(format!("cniVersions[{i}] is {}, not a string", kind(v)))
        })?;
        candidates.push(s);
    }
    candidates.extend(version.filter(|v| !v.is_empty()));
    let mut best: Option<CniVersion> = None;
    for s in &candidates {
        let triple = parse_triple(s)
            .ok_or_else(|| ConfError::InvalidCniVersion(format!("{s:?} is not a version")))?;
        let known = CniVersion::ALL
            .iter()
            .copied()
            .find(|v| v.triple() == triple);
        if let Some(v) = known {
            best = best.max(Some(v));
        }
    }
    best.ok_or_else(|| {
        if candidates.is_empty() {
            ConfError::MissingCniVersion
        } else {
            ConfError::UnsupportedCniVersion(UnsupportedVersion(candidates.join(", ")))
        }
    })
}

/// libcni's `readBool`: a boolean, or the string "true"/"false" in any case; absent is false.
fn read_bool(obj: &Map<String, Value>, key: &str) -> Result<bool, ConfError> {
    match obj.get(key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) => match s.to_ascii_lowercase().as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(field(key, format!("expected true or false, got {s:?}"))),
        },
        Some(other) => Err(field(
            key,
            format!("expected a boolean, got {}", kind(other)),
        )),
    }
}

fn check_plugin(index: usize, plugin: &Map<String, Value>) -> Result<(), ConfError> {
    match plugin.get("type") {
        None | Some(Value::Null) => return Err(ConfError::MissingType { index }),
        Some(Value::String(t)) if t.is_empty() => return Err(ConfError::MissingType { index }),
        Some(Value::String(t)) if !is_valid_plugin_type(t) => {
            return Err(ConfError::InvalidType {
                index,
                type_name: t.clone(),
            })
        }
        Some(Value::String(_)) => {}
        Some(other) => {
            return Err(ConfError::InvalidType {
                index,
                type_name: other.to_string(),
            })
        }
    }
    match plugin.get("capabilities") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(caps)) => match caps.iter().find(|(_, v)| !v.is_boolean()) {
            None => Ok(()),
            Some((k, v)) => Err(field(
                format!("plugins[{index}].capabilities.{k}"),
                format!("expected a boolean, got {v}"),
            )),
        },
        Some(other) => Err(field(
            format!("plugins[{index}].capabilities"),
            format!("expected an object, got {}", kind(other)),
        )),
    }
}

impl NetworkConfigList {
    /// Parses a `.conflist` (an object with `"plugins"`) or a single `.conf` plugin object.
    pub fn parse(value: &Value) -> Result<NetworkConfigList, ConfError> {
        NetworkConfigList::parse_with_default_name(value, None)
    }

    /// Like [`NetworkConfigList::parse`], but a configuration without a `name` (or with `""`) gets
    /// `default_name` (multi-net spec 3.4.2: the NetworkAttachmentDefinition's name). The default must
    /// satisfy the same naming rule.
    pub fn parse_with_default_name(
        value: &Value,
        default_name: Option<&str>,
    ) -> Result<NetworkConfigList, ConfError> {
        let obj = value
            .as_object()
            .ok_or(ConfError::NotAnObject(kind(value)))?;
        let cni_version = select_version(obj)?;
        let name = match obj.get("name") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                return Err(field(
                    "name",
                    format!("expected a string, got {}", kind(other)),
                ))
            }
        };
        let name = name
            .or_else(|| default_name.map(str::to_owned))
            .ok_or(ConfError::MissingName)?;
        if !is_valid_network_name(&name) {
            return Err(ConfError::InvalidName(name));
        }

        let (plugins, disable_check, disable_gc) = match obj.get("plugins") {
            Some(list) => {
                let list = list.as_array().ok_or_else(|| {
                    field("plugins", format!("expected an array, got {}", kind(list)))
                })?;
                if list.is_empty() {
                    return Err(ConfError::NoPlugins);
                }
                let plugins = list
                    .iter()
                    .enumerate()
                    .map(|(index, p)| {
                        p.as_object()
                            .cloned()
                            .ok_or(ConfError::PluginNotObject { index })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                (
                    plugins,
                    read_bool(obj, "disableCheck")?,
                    read_bool(obj, "disableGC")?,
                )
            }
            // A single plugin configuration (.conf).
            None => (vec![obj.clone()], false, false),
        };
        for (index, p) in plugins.iter().enumerate() {
            check_plugin(index, p)?;
        }
        Ok(NetworkConfigList {
            cni_version,
            name,
            disable_check,
            disable_gc,
            plugins,
        })
    }

    /// The list as a `.conflist` object (re-parses to an equal list); for caching.
    pub fn to_value(&self) -> Value {
        let mut o = Map::new();
        o.insert("cniVersion".into(), self.cni_version.as_str().into());
        o.insert("name".into(), self.name.clone().into());
        if self.disable_check {
            o.insert("disableCheck".into(), true.into());
        }
        if self.disable_gc {
            o.insert("disableGC".into(), true.into());
        }
        o.insert(
            "plugins".into(),
            Value::Array(self.plugins.iter().cloned().map(Value::Object).collect()),
        );
        Value::Object(o)
    }

    /// The first plugin of the list whose type is a delegating plugin ([`DELEGATING_PLUGIN_TYPES`]), which no
    /// delegate may be.
    pub fn delegating_plugin(&self) -> Option<&str> {
        self.plugins
            .iter()
            .filter_map(|p| p.get("type").and_then(Value::as_str))
            .find(|t| is_delegating_plugin_type(t))
    }

    /// Whether any plugin declares capability `key` as `true`.
    pub fn capabilities_declared(&self, key: &str) -> bool {
        self.plugins.iter().any(|p| declared(p, key))
    }

    /// The request configuration for plugin `index` (libcni `buildOneConfig` + `injectRuntimeConfig`):
    /// the plugin object with `cniVersion` and `name` set from the list, `capabilities` removed (the
    /// spec: "must not be set"), `runtimeConfig` set to those `capability_args` the plugin declares
    /// `true` (only when there is at least one; otherwise a `runtimeConfig` in the plugin object is left
    /// as it is, as in libcni), and `prevResult` set when given. Other keys pass through unchanged.
    ///
    /// # Panics
    /// If `index >= self.plugins.len()`.
    pub fn plugin_config(
        &self,
        index: usize,
        capability_args: &Map<String, Value>,
        prev_result: Option<&Value>,
    ) -> Value {
        let plugin = &self.plugins[index];
        let mut runtime_config = Map::new();
        if let Some(Value::Object(caps)) = plugin.get("capabilities") {
            for (cap, supported) in caps {
                if supported == &Value::Bool(true) {
                    if let Some(v) = capability_args.get(cap) {
                        runtime_config.insert(cap.clone(), v.clone());
                    }
                }
            }
        }
        let mut out = Map::new();
        out.insert("cniVersion".into(), self.cni_version.as_str().into());
        out.insert("name".into(), self.name.clone().into());
        for (k, v) in plugin {
            let replaced = match k.as_str() {
                "cniVersion" | "name" | "capabilities" => true,
                "runtimeConfig" => !runtime_config.is_empty(),
                "prevResult" => prev_result.is_some(),
                _ => false,
            };
            if !replaced {
                out.insert(k.clone(), v.clone());
            }
        }
        if !runtime_config.is_empty() {
            out.insert("runtimeConfig".into(), Value::Object(runtime_config));
        }
        if let Some(prev) = prev_result {
            out.insert("prevResult".into(), prev.clone());
        }
        Value::Object(out)
    }
}

fn declared(plugin: &Map<String, Value>, key: &str) -> bool {
    matches!(plugin.get("capabilities"), Some(Value::Object(caps)) if caps.get(key) == Some(&Value::Bool(true)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dbnet() -> Value {
        json!({
            "cniVersion": "1.1.0",
            "cniVersions": ["0.3.1", "0.4.0", "1.0.0", "1.1.0"],
            "name": "dbnet",
            "plugins": [
                {"type": "bridge", "bridge": "cni0",
                 "ipam": {"type": "host-local", "subnet": "10.1.0.0/16"}},
                {"type": "tuning", "capabilities": {"mac": true}, "sysctl": {"net.core.somaxconn": "500"}},
                {"type": "portmap", "capabilities": {"portMappings": true, "bandwidth": false}}
            ]
        })
    }

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn parses_the_spec_example() {
        let l = NetworkConfigList::parse(&dbnet()).unwrap();
        assert_eq!(l.cni_version, CniVersion::V1_1_0);
        assert_eq!(l.name, "dbnet");
        assert!(!l.disable_check && !l.disable_gc);
        assert_eq!(l.plugins.len(), 3);
        assert_eq!(l.plugins[0]["bridge"], "cni0");
        assert!(l.capabilities_declared("mac"));
        assert!(l.capabilities_declared("portMappings"));
        assert!(!l.capabilities_declared("bandwidth"), "declared false");
        assert!(!l.capabilities_declared("ips"));
    }

    #[test]
    fn single_conf_becomes_a_one_plugin_list() {
        let conf = json!({"cniVersion": "0.3.1", "name": "net1", "type": "macvlan", "master": "eth0",
                          "capabilities": {"ips": true}});
        let l = NetworkConfigList::parse(&conf).unwrap();
        assert_eq!(l.cni_version, CniVersion::V0_3_1);
        assert_eq!(l.name, "net1");
        assert_eq!(l.plugins, vec![map(conf.clone())]);
        assert!(l.capabilities_declared("ips"));
        let pc = l.plugin_config(0, &map(json!({"ips": ["10.0.0.5/24"]})), None);
        assert_eq!(
            pc,
            json!({"cniVersion": "0.3.1", "name": "net1", "type": "macvlan", "master": "eth0",
                   "runtimeConfig": {"ips": ["10.0.0.5/24"]}})
        );
    }

    #[test]
    fn plugin_config_injects_like_libcni() {
        let l = NetworkConfigList::parse(&dbnet()).unwrap();
        let caps = map(
            json!({"mac": "c2:11:22:33:44:55", "portMappings": [{"hostPort": 8080}], "bandwidth": {"x": 1}}),
        );
        // First plugin: no capabilities → no runtimeConfig; no prevResult for the first ADD.
        let pc0 = l.plugin_config(0, &caps, None);
        assert_eq!(
            pc0,
            json!({"cniVersion": "1.1.0", "name": "dbnet", "type": "bridge", "bridge": "cni0",
                   "ipam": {"type": "host-local", "subnet": "10.1.0.0/16"}})
        );
        assert!(pc0.get("runtimeConfig").is_none());
        assert!(pc0.get("prevResult").is_none());
        let prev = json!({"cniVersion": "1.1.0", "ips": [{"address": "10.1.0.5/16"}]});
        let pc1 = l.plugin_config(1, &caps, Some(&prev));
        assert_eq!(
            pc1,
            json!({"cniVersion": "1.1.0", "name": "dbnet", "type": "tuning",
                   "sysctl": {"net.core.somaxconn": "500"},
                   "runtimeConfig": {"mac": "c2:11:22:33:44:55"}, "prevResult": prev})
        );
        // bandwidth is declared false: not passed even though the runtime provides it.
        let pc2 = l.plugin_config(2, &caps, Some(&prev));
        assert_eq!(
            pc2["runtimeConfig"],
            json!({"portMappings": [{"hostPort": 8080}]})
        );
        assert!(pc2.get("capabilities").is_none());
        // No matching capability args → no runtimeConfig key at all.
        let pc2 = l.plugin_config(2, &map(json!({"mac": "x"})), None);
        assert!(pc2.get("runtimeConfig").is_none(), "{pc2}");
    }

    #[test]
    fn plugin_config_overrides_name_and_version_and_keeps_unknown_keys() {
        let l = NetworkConfigList::parse(&json!({
            "cniVersion": "0.4.0", "name": "outer",
            "plugins": [{"type": "p", "name": "inner", "cniVersion": "0.3.0", "args": {"a": 1}, "cni.dev/x": 2,
                         "runtimeConfig": {"static": true}, "prevResult": {"old": 1}}]
        }))
        .unwrap();
        let pc = l.plugin_config(0, &Map::new(), None);
        assert_eq!(pc["name"], "outer");
        assert_eq!(pc["cniVersion"], "0.4.0");
        assert_eq!(pc["args"], json!({"a": 1}));
        assert_eq!(pc["cni.dev/x"], 2);
        // libcni only overwrites these when it has something to put there.
        assert_eq!(pc["runtimeConfig"], json!({"static": true}));
        assert_eq!(pc["prevResult"], json!({"old": 1}));
        let l2 = NetworkConfigList {
            plugins: vec![map(json!({"type": "p", "capabilities": {"c": true},
            "runtimeConfig": {"static": true}}))],
            ..l
        };
        let pc = l2.plugin_config(0, &map(json!({"c": 1})), Some(&json!({"new": 1})));
        assert_eq!(pc["runtimeConfig"], json!({"c": 1}));
        assert_eq!(pc["prevResult"], json!({"new": 1}));
    }

    #[test]
    #[should_panic]
    fn plugin_config_index_out_of_range_panics() {
        NetworkConfigList::parse(&dbnet())
            .unwrap()
            .plugin_config(3, &Map::new(), None);
    }

    #[test]
    fn default_name_injection() {
        let conf = json!({"cniVersion": "1.0.0", "plugins": [{"type": "bridge"}]});
        assert_eq!(NetworkConfigList::parse(&conf), Err(ConfError::MissingName));
        let l = NetworkConfigList::parse_with_default_name(&conf, Some("my-nad")).unwrap();
        assert_eq!(l.name, "my-nad");
        let conf_empty = json!({"cniVersion": "1.0.0", "name": "", "type": "bridge"});
        assert_eq!(
            NetworkConfigList::parse_with_default_name(&conf_empty, Some("nad"))
                .unwrap()
                .name,
            "nad"
        );
        // A configured name wins over the default.
        let named = json!({"cniVersion": "1.0.0", "name": "cfg", "type": "bridge"});
        assert_eq!(
            NetworkConfigList::parse_with_default_name(&named, Some("nad"))
                .unwrap()
                .name,
            "cfg"
        );
        // The default must be a valid name too.
        assert_eq!(
            NetworkConfigList::parse_with_default_name(&conf, Some("bad/name")),
            Err(ConfError::InvalidName("bad/name".into()))
        );
    }

    #[test]
    fn version_selection() {
        let with = |v: Value| {
            let mut o = map(json!({"name": "n", "type": "t"}));
            o.extend(map(v));
            NetworkConfigList::parse(&Value::Object(o))
        };
        assert_eq!(
            with(json!({"cniVersion": "0.4.0"})).unwrap().cni_version,
            CniVersion::V0_4_0
        );
        // cniVersions: the highest supported wins; newer ones are skipped.
        assert_eq!(
            with(json!({"cniVersion": "0.3.1", "cniVersions": ["0.4.0", "1.0.0", "2.0.0"]}))
                .unwrap()
                .cni_version,
            CniVersion::V1_0_0
        );
        assert_eq!(
            with(json!({"cniVersion": "9.9.9", "cniVersions": ["0.3.1"]}))
                .unwrap()
                .cni_version,
            CniVersion::V0_3_1
        );
        assert_eq!(
            with(json!({"cniVersions": ["1.1.0", "0.2.0"]}))
                .unwrap()
                .cni_version,
            CniVersion::V1_1_0
        );
        assert_eq!(with(json!({})), Err(ConfError::MissingCniVersion));
        assert_eq!(
            with(json!({"cniVersion": ""})),
            Err(ConfError::MissingCniVersion)
        );
        assert_eq!(
            with(json!({"cniVersions": []})),
            Err(ConfError::MissingCniVersion)
        );
        assert_eq!(
            with(json!({"cniVersion": "1.2.0"})),
            Err(ConfError::UnsupportedCniVersion(UnsupportedVersion(
                "1.2.0".into()
            )))
        );
        assert_eq!(
            with(json!({"cniVersions": ["2.0.0", "1.2.0"]})),
            Err(ConfError::UnsupportedCniVersion(UnsupportedVersion(
                "2.0.0, 1.2.0".into()
            )))
        );
        for bad in [
            json!({"cniVersion": 1}),
            json!({"cniVersions": "1.0.0"}),
            json!({"cniVersions": [1]}),
            json!({"cniVersions": ["x.y"]}),
            json!({"cniVersion": "bogus", "cniVersions": ["1.0.0"]}),
        ] {
            assert!(
                matches!(with(bad.clone()), Err(ConfError::InvalidCniVersion(_))),
                "{bad}"
            );
        }
        let err = with(json!({"cniVersion": "0.5.0"})).unwrap_err();
        assert!(err.to_string().contains("0.5.0"), "{err}");
        assert_eq!(err.cni_code(), 1);
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let cases: Vec<(Value, ConfError)> = vec![
            (json!("x"), ConfError::NotAnObject("a string")),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "plugins": []}),
                ConfError::NoPlugins,
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "a"}, 3]}),
                ConfError::PluginNotObject { index: 1 },
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "a"}, {"bridge": "x"}]}),
                ConfError::MissingType { index: 1 },
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": ""}]}),
                ConfError::MissingType { index: 0 },
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "bridge": "x"}),
                ConfError::MissingType { index: 0 },
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "../bin/sh"}]}),
                ConfError::InvalidType {
                    index: 0,
                    type_name: "../bin/sh".into(),
                },
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "type": "a\\b"}),
                ConfError::InvalidType {
                    index: 0,
                    type_name: "a\\b".into(),
                },
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "type": ".."}),
                ConfError::InvalidType {
                    index: 0,
                    type_name: "..".into(),
                },
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "type": "a\u{0}b"}),
                ConfError::InvalidType {
                    index: 0,
                    type_name: "a\u{0}b".into(),
                },
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "type": 5}),
                ConfError::InvalidType {
                    index: 0,
                    type_name: "5".into(),
                },
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "-net", "type": "a"}),
                ConfError::InvalidName("-net".into()),
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "a b", "type": "a"}),
                ConfError::InvalidName("a b".into()),
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "né", "type": "a"}),
                ConfError::InvalidName("né".into()),
            ),
            (
                json!({"cniVersion": "1.0.0", "name": 7, "type": "a"}),
                field("name", "expected a string, got a number"),
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "plugins": {}}),
                field("plugins", "expected an array, got an object"),
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "disableCheck": "yes", "plugins": [{"type": "a"}]}),
                field("disableCheck", "expected true or false, got \"yes\""),
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "disableGC": 1, "plugins": [{"type": "a"}]}),
                field("disableGC", "expected a boolean, got a number"),
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "a", "capabilities": {"mac": "true"}}]}),
                field(
                    "plugins[0].capabilities.mac",
                    "expected a boolean, got \"true\"",
                ),
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "a", "capabilities": []}]}),
                field(
                    "plugins[0].capabilities",
                    "expected an object, got an array",
                ),
            ),
        ];
        for (v, want) in cases {
            let got = NetworkConfigList::parse(&v);
            assert_eq!(got, Err(want.clone()), "{v}");
            assert!(!want.to_string().is_empty());
        }
        let e = NetworkConfigList::parse(
            &json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "x/y"}]}),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("plugins[0]") && e.to_string().contains("x/y"),
            "{e}"
        );
        assert_eq!(e.cni_code(), 7);
    }

    #[test]
    fn name_rule() {
        for ok in ["a", "0", "dbnet", "my-net.v1_2", "A-", "9."] {
            assert!(is_valid_network_name(ok), "{ok}");
        }
        for bad in ["", "-a", "_a", ".a", "a/b", "a b", "a:b", "é", "a\n"] {
            assert!(!is_valid_network_name(bad), "{bad}");
        }
        for ok in ["bridge", "host-local", "a.b", "..."] {
            assert!(is_valid_plugin_type(ok), "{ok}");
        }
    }

    #[test]
    fn disable_flags_and_to_value_round_trip() {
        let v = json!({"cniVersion": "1.1.0", "name": "n", "disableCheck": "TRUE", "disableGC": true,
                       "plugins": [{"type": "a", "x": [1, 2]}, {"type": "b", "capabilities": {"mac": true}}]});
        let l = NetworkConfigList::parse(&v).unwrap();
        assert!(l.disable_check && l.disable_gc);
        let cached = l.to_value();
        assert_eq!(
            cached,
            json!({"cniVersion": "1.1.0", "name": "n", "disableCheck": true, "disableGC": true,
                   "plugins": [{"type": "a", "x": [1, 2]}, {"type": "b", "capabilities": {"mac": true}}]})
        );
        assert_eq!(NetworkConfigList::parse(&cached).unwrap(), l);
        let l = NetworkConfigList::parse(
            &json!({"cniVersion": "0.4.0", "name": "n", "disableCheck": false, "type": "a"}),
        )
        .unwrap();
        let cached = l.to_value();
        assert!(cached.get("disableCheck").is_none() && cached.get("disableGC").is_none());
        assert_eq!(NetworkConfigList::parse(&cached).unwrap(), l);
    }
}
