//! The `hooks` entries of the plexus configuration.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Default per-call deadline.
pub const DEFAULT_TIMEOUT_MS: u64 = 100;
/// Default per-call linear memory limit.
pub const DEFAULT_MEMORY_LIMIT_MIB: u64 = 64;

/// One entry of the plexus configuration's `hooks` list.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HookSpec {
    pub name: String,
    pub kind: HookKind,
    pub module: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<serde_json::Value>,
    #[serde(default)]
    pub failure_policy: FailurePolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(
        default,
        rename = "memoryLimitMiB",
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_limit_mib: Option<u64>,
    /// Pods of these namespaces only (absent: every namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Vec<String>>,
    /// Load only the compiled artifact of `sha256` from the cache, never the component file, never compiling
    /// (the entries the node agent publishes).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub precompiled: bool,
    /// Set by the node agent for a NetworkHook selected for the node but not active there (why, in words): the
    /// entry loads nothing, and every call it would get fails with this reason under its `failurePolicy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unready: Option<String>,
}

impl HookSpec {
    /// A spec with defaults for everything but name, kind and module.
    pub fn new(name: impl Into<String>, kind: HookKind, module: impl Into<PathBuf>) -> Self {
        HookSpec {
            name: name.into(),
            kind,
            module: module.into(),
            sha256: None,
            settings: None,
            failure_policy: FailurePolicy::Fail,
            timeout_ms: None,
            memory_limit_mib: None,
            namespaces: None,
            precompiled: false,
            unready: None,
        }
    }

    pub(crate) fn timeout_ms(&self) -> u64 {
        self.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)
    }

    pub(crate) fn memory_limit_mib(&self) -> u64 {
        self.memory_limit_mib.unwrap_or(DEFAULT_MEMORY_LIMIT_MIB)
    }
}

/// Which extension point a hook entry serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HookKind {
    Policy,
    Resolver,
    Status,
}

impl HookKind {
    pub const ALL: [HookKind; 3] = [HookKind::Policy, HookKind::Resolver, HookKind::Status];

    pub fn as_str(self) -> &'static str {
        match self {
            HookKind::Policy => "policy",
            HookKind::Resolver => "resolver",
            HookKind::Status => "status",
        }
    }

    /// The WIT interface a component must export to serve this kind.
    pub fn interface(self) -> String {
        format!("plexus:hooks/{}@{}", self.as_str(), crate::WIT_VERSION)
    }

    /// Whether an export named `name` serves this kind: its interface at this host's version or any other
    /// patch version of the same minor (a 0.1.1 host runs components built against 0.1.0), as the component
    /// model's semver rules for 0.x versions match them.
    pub fn exported_as(self, name: &str) -> bool {
        let minor = crate::WIT_VERSION
            .rsplit_once('.')
            .map_or(crate::WIT_VERSION, |(m, _)| m);
        name.strip_prefix(&format!("plexus:hooks/{}@", self.as_str()))
            .and_then(|v| v.strip_prefix(minor))
            .and_then(|patch| patch.strip_prefix('.'))
            .is_some_and(|patch| !patch.is_empty() && patch.bytes().all(|b| b.is_ascii_digit()))
    }
}

impl std::fmt::Display for HookKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for HookKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "policy" => Ok(HookKind::Policy),
            "resolver" => Ok(HookKind::Resolver),
            "status" => Ok(HookKind::Status),
            other => Err(format!(
                "unknown hook kind {other:?} (expected policy, resolver or status)"
            )),
        }
    }
}

/// What a fault of the hook (trap, timeout, out of memory, invalid output) does to the operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum FailurePolicy {
    /// The operation fails with an error naming the hook.
    #[default]
    Fail,
    /// The fault is logged and the hook skipped, as if it had changed nothing.
    Ignore,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conf_entry_parses_with_defaults() {
        let spec: HookSpec =
            serde_json::from_str(r#"{"name":"ns-iso","kind":"policy","module":"/opt/ns.wasm"}"#)
                .unwrap();
        assert_eq!(spec.failure_policy, FailurePolicy::Fail);
        assert_eq!(spec.timeout_ms(), 100);
        assert_eq!(spec.memory_limit_mib(), 64);
    }

    #[test]
    fn conf_entry_parses_every_key() {
        let spec: HookSpec = serde_json::from_str(
            r#"{"name":"t","kind":"resolver","module":"m.wasm","sha256":"ab","settings":{"a":1},
                "failurePolicy":"Ignore","timeoutMs":5,"memoryLimitMiB":8}"#,
        )
        .unwrap();
        assert_eq!(spec.kind, HookKind::Resolver);
        assert_eq!(spec.failure_policy, FailurePolicy::Ignore);
        assert_eq!((spec.timeout_ms(), spec.memory_limit_mib()), (5, 8));
        assert_eq!(spec.settings.unwrap()["a"], 1);
    }

    #[test]
    fn conf_entry_rejects_unknown_keys_and_kinds() {
        let typo = r#"{"name":"t","kind":"policy","module":"m","timeoutMS":5}"#;
        assert!(serde_json::from_str::<HookSpec>(typo).is_err());
        let kind = r#"{"name":"t","kind":"admission","module":"m"}"#;
        assert!(serde_json::from_str::<HookSpec>(kind).is_err());
    }
}
