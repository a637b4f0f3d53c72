//! Which CNI configuration a NetworkAttachmentDefinition stands for (multi-net spec 3.4.1), with 'name'
//! injection (3.4.2). Pure: the caller lists and reads the CNI configuration directory.

use serde_json::{Map, Value};
use thiserror::Error;

use super::objects::NetworkAttachmentDefinition;

/// One file from the CNI configuration directory, as read by the caller (who passes them sorted by file
/// name, the order libcni uses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnDiskConf {
    /// The file's name (not its path), e.g. `10-macvlan.conflist`.
    pub file_name: String,
    pub contents: String,
}

/// Where a resolved configuration came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    /// Rule 1: the NAD's `spec.config`.
    NadSpec,
    /// Rules 2 and 3: this file of the configuration directory.
    OnDisk(String),
}

/// The CNI configuration (or configuration list) to execute for an attachment.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedConfig {
    /// The configuration, with `name` injected when `spec.config` had none (3.4.2).
    pub config: Value,
    pub source: ConfigSource,
    /// On-disk files that could not be considered, each as `file: reason` (not fatal).
    pub skipped: Vec<String>,
}

impl ResolvedConfig {
    /// Whether the configuration is a configuration list (has a `plugins` key).
    pub fn is_conflist(&self) -> bool {
        self.config.get("plugins").is_some()
    }

    /// The configuration's `name`.
    pub fn name(&self) -> Option<&str> {
        self.config.get("name").and_then(Value::as_str)
    }
}

/// Why no configuration could be determined.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ResolveError {
    /// Rule 1 applies but `spec.config` is not a usable CNI configuration.
    #[error("NetworkAttachmentDefinition {namespace}/{name}: spec.config is not a valid CNI configuration: {reason}")]
    InvalidSpecConfig {
        namespace: String,
        name: String,
        reason: String,
    },
    /// Rule 4: "Otherwise, the network request must fail".
    #[error("NetworkAttachmentDefinition {namespace}/{name} has no spec.config, and no .conflist or .conf file in the CNI configuration directory has \"name\": {name:?}{}", skipped_note(.skipped))]
    NotFound {
        namespace: String,
        name: String,
        /// Files skipped as unreadable while searching, each `file: reason`.
        skipped: Vec<String>,
    },
}

fn skipped_note(skipped: &[String]) -> String {
    if skipped.is_empty() {
        String::new()
    } else {
        format!(" (skipped: {})", skipped.join("; "))
    }
}

/// File name suffixes of configuration lists (rule 2): libcni's `.conflist`, and the spec's literal
/// `.configlist`.
pub const CONFLIST_SUFFIXES: &[&str] = &[".conflist", ".configlist"];
/// File name suffixes of single configurations (rule 3): libcni's `.conf` and `.json`, and the spec's
/// literal `.config`.
pub const CONF_SUFFIXES: &[&str] = &[".conf", ".json", ".config"];

/// Applies 3.4.1 rules 1 to 4, in order, and 3.4.2 name injection.
///
/// 1. `spec.config` present (non-blank): it is used; it must be a JSON object that is either a
///    configuration list (`plugins`: a list of objects) or a configuration (`type`: a string), and a
///    `name`, if present, must be a string. A missing `name` is set to the NAD's name (at list level for a
///    list).
/// 2. Otherwise the first configuration-list file (in the order given) whose `name` equals the NAD's name.
/// 3. Otherwise the first single-configuration file whose `name` equals it.
/// 4. Otherwise [`ResolveError::NotFound`].
///
/// Files that do not parse as JSON objects, or whose `name` is not a string, are skipped with a note;
/// files with other suffixes are not considered at all.
pub fn resolve_nad(
    nad: &NetworkAttachmentDefinition,
    on_disk: &[OnDiskConf],
) -> Result<ResolvedConfig, ResolveError> {
    if let Some(text) = nad.config.as_deref().filter(|c| !c.trim().is_empty()) {
        let invalid = |reason: String| ResolveError::InvalidSpecConfig {
            namespace: nad.namespace.clone(),
            name: nad.name.clone(),
            reason,
        };
        let value: Value =
            serde_json::from_str(text).map_err(|e| invalid(format!("invalid JSON: {e}")))?;
        let Value::Object(mut obj) = value else {
            return Err(invalid("it is not a JSON object".into()));
        };
        check_shape(&obj).map_err(invalid)?;
        if !obj.contains_key("name") {
            obj.insert("name".into(), Value::String(nad.name.clone()));
        }
        return Ok(ResolvedConfig {
            config: Value::Object(obj),
            source: ConfigSource::NadSpec,
            skipped: Vec::new(),
        });
    }

    let mut skipped = Vec::new();
    let mut first_conf: Option<(&OnDiskConf, Value)> = None;
    for file in on_disk {
        let is_list = CONFLIST_SUFFIXES
            .iter()
            .any(|s| file.file_name.ends_with(s));
        let is_conf = CONF_SUFFIXES.iter().any(|s| file.file_name.ends_with(s));
        if !is_list && !is_conf {
            continue;
        }
        let obj = match serde_json::from_str::<Value>(&file.contents) {
            Ok(Value::Object(o)) => o,
            Ok(_) => {
                skipped.push(format!("{}: not a JSON object", file.file_name));
                continue;
            }
            Err(e) => {
                skipped.push(format!("{}: invalid JSON: {e}", file.file_name));
                continue;
            }
        };
        let name = match obj.get("name") {
            Some(Value::String(n)) => n,
            Some(_) => {
                skipped.push(format!("{}: \"name\" is not a string", file.file_name));
                continue;
            }
            None => continue,
        };
        if *name != nad.name {
            continue;
        }
        if is_list {
            if !matches!(obj.get("plugins"), Some(Value::Array(_))) {
                skipped.push(format!(
                    "{}: a configuration list without a \"plugins\" list",
                    file.file_name
                ));
                continue;
            }
            return Ok(ResolvedConfig {
                config: Value::Object(obj),
                source: ConfigSource::OnDisk(file.file_name.clone()),
                skipped,
            });
        }
        if first_conf.is_none() {
            first_conf = Some((file, Value::Object(obj)));
        }
    }
    if let Some((file, config)) = first_conf {
        return Ok(ResolvedConfig {
            config,
            source: ConfigSource::OnDisk(file.file_name.clone()),
            skipped,
        });
    }
    Err(ResolveError::NotFound {
        namespace: nad.namespace.clone(),
        name: nad.name.clone(),
        skipped,
    })
}

fn check_shape(obj: &Map<String, Value>) -> Result<(), String> {
    match obj.get("name") {
        None | Some(Value::String(_)) => {}
        Some(_) => return Err("\"name\" is not a string".into()),
    }
    match obj.get("plugins") {
        Some(Value::Array(ps)) => {
            if let Some(i) = ps.iter().position(|p| !p.is_object()) {
                return Err(format!("\"plugins\" element {i} is not an object"));
            }
            Ok(())
        }
        Some(_) => Err("\"plugins\" is not a list".into()),
        None => match obj.get("type") {
            Some(Value::String(_)) => Ok(()),
            Some(_) => Err("\"type\" is not a string".into()),
            None => Err(
                "it has neither \"type\" (a configuration) nor \"plugins\" (a configuration list)"
                    .into(),
            ),
        },
    }
}
