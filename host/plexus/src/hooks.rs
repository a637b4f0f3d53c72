//! The wasm hook runtime behind orchestration's [`HookRunner`] trait.

use std::path::Path;

use plexus_core::spec::Pod;
use plexus_hooks::{HookError, HookSpec, Hooks, PolicyOutcome};
use serde_json::Value;

use crate::error::PlexusError;
use crate::orchestrate::{HookRunner, PolicyVerdict};

impl From<HookError> for PlexusError {
    fn from(e: HookError) -> Self {
        match e {
            // A hook that cannot be loaded is a configuration problem of the node.
            HookError::Load { .. } | HookError::Config(_) => PlexusError::Config(e.to_string()),
            HookError::Fault { .. } | HookError::Engine(_) => PlexusError::HookFault(e.to_string()),
        }
    }
}

/// Loads the conf's `hooks` list (compiled artifacts cached under `cache_dir`).
pub fn load(entries: &[Value], cache_dir: &Path) -> Result<Hooks, PlexusError> {
    let specs = entries
        .iter()
        .enumerate()
        .map(|(i, v)| {
            serde_json::from_value::<HookSpec>(v.clone())
                .map_err(|e| PlexusError::Config(format!("hooks[{i}]: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Hooks::load(&specs, cache_dir)?)
}

impl HookRunner for Hooks {
    fn is_empty(&self) -> bool {
        Hooks::is_empty(self)
    }

    fn policy(&self, pod: &Pod, selections: Vec<Value>) -> Result<PolicyVerdict, PlexusError> {
        Ok(match Hooks::policy(self, pod, selections)? {
            PolicyOutcome::Admit(list) => PolicyVerdict::Admit(list),
            PolicyOutcome::Deny { hook, reason } => PolicyVerdict::Deny { hook, reason },
        })
    }

    fn resolve(
        &self,
        pod: &Pod,
        selection: &Value,
        nad: &Value,
        config: Option<&Value>,
    ) -> Result<Option<Value>, PlexusError> {
        Ok(Hooks::resolve(self, pod, selection, Some(nad), config)?)
    }

    fn status(&self, pod: &Pod, entries: Vec<Value>) -> Result<Vec<Value>, PlexusError> {
        Ok(Hooks::status(self, pod, entries)?)
    }
}
