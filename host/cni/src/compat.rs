//! What Plexus reads differently under `"compat": "multus"` (docs/migrating-from-multus.md), in one place: the
//! planner asks [`Compat`] and has no branch of its own on the mode.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use plexus_core::spec::resolve::OnDiskConf;
use plexus_core::spec::Pod;
use serde_json::{json, Value};

use crate::conf::{is_conf_file, is_plexus_conf, Compat};
use crate::error::PlexusError;

impl Compat {
    /// The conf file a `clusterNetwork`/`defaultNetworks` path names: the path itself; under Multus a directory's
    /// first conf file, in libcni's order.
    pub(crate) fn conf_file(self, reference: &Path) -> Result<PathBuf, PlexusError> {
        match self {
            Compat::Multus if reference.is_dir() => first_conf_file(reference),
            _ => Ok(reference.to_path_buf()),
        }
    }

    /// A delegate config as planning reads it: under Multus one without `cniVersion` gets `0.1.0`, the version a
    /// plugin reads a config without one as (libcni passes such a config on unchanged, as Multus does).
    pub(crate) fn versioned(self, config: &Value) -> Value {
        match self {
            Compat::Multus => with_missing_version(config).unwrap_or_else(|| config.clone()),
            Compat::Strict => config.clone(),
        }
    }

    /// Under Multus, the pod's `v1.multus-cni.io/default-network` (the network it takes instead of the cluster
    /// network), when it has a non-empty one.
    pub(crate) fn pod_default_network(self, pod: &Pod) -> Option<&str> {
        if self != Compat::Multus {
            return None;
        }
        pod.annotations
            .get(MULTUS_DEFAULT_NETWORK)
            .map(String::as_str)
            .filter(|v| !v.trim().is_empty())
    }

    /// Whether the pod gets the `defaultNetworks`: Multus gives pods of its system namespaces none.
    pub(crate) fn gives_default_networks(
        self,
        namespace: &str,
        system_namespaces: &[String],
    ) -> bool {
        self != Compat::Multus || !system_namespaces.iter().any(|n| n == namespace)
    }

    /// The selection annotation as parsed: under Multus without the element keys Multus ignores, each named in a
    /// warning.
    pub(crate) fn selection_annotation<'a>(self, raw: &'a str, pod: &Pod) -> Cow<'a, str> {
        if self != Compat::Multus {
            return Cow::Borrowed(raw);
        }
        match plexus_core::spec::selection::without_unknown_keys(raw) {
            Some((lenient, dropped)) => {
                tracing::warn!(
                    pod = %format!("{}/{}", pod.namespace, pod.name),
                    "ignoring keys of the networks annotation that are not the standard's (compat multus): {}",
                    dropped.join(", ")
                );
                Cow::Owned(lenient)
            }
            None => Cow::Borrowed(raw),
        }
    }
}

/// The pod annotation Multus reads as the pod's own cluster network.
pub const MULTUS_DEFAULT_NETWORK: &str = "v1.multus-cni.io/default-network";
/// The version a config without `cniVersion` is run as under [`Compat::Multus`].
pub const MISSING_CNI_VERSION: &str = "0.1.0";

/// `config` with `"cniVersion": "0.1.0"` added when it is an object without one (how compat multus runs such a
/// config); `None` otherwise.
pub fn with_missing_version(config: &Value) -> Option<Value> {
    let mut m = config
        .as_object()
        .filter(|m| !m.contains_key("cniVersion"))?
        .clone();
    m.insert("cniVersion".into(), json!(MISSING_CNI_VERSION));
    Some(Value::Object(m))
}

/// The first conf file of `dir` in libcni's order (file names sorted; `.conf`, `.conflist`, `.json`), skipping
/// Plexus's own, as `plexus install` picks the cluster network.
fn first_conf_file(dir: &Path) -> Result<PathBuf, PlexusError> {
    let ours = |c: &OnDiskConf| {
        serde_json::from_str::<Value>(&c.contents).is_ok_and(|v| is_plexus_conf(&v))
    };
    crate::plan::read_conf_dir(dir)
        .into_iter()
        .filter(|c| is_conf_file(&c.file_name))
        .find(|c| !ours(c))
        .map(|c| dir.join(c.file_name))
        .ok_or_else(|| {
            PlexusError::config(
                "clusterNetwork",
                format!(
                    "directory {} holds no conf file (.conf, .conflist, .json)",
                    dir.display()
                ),
            )
        })
}
