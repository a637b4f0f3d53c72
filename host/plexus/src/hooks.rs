//! The hook points (design.md, "Hooks") as orchestration sees them, [`HookRunner`], and the wasm hook runtime
//! behind it.

use std::path::Path;

use plexus_core::spec::{NetworkAttachmentDefinition, Pod, Selection};
use plexus_hooks::{HookSpec, Hooks, PolicyOutcome};
use serde_json::Value;

use crate::error::PlexusError;

/// The hook points, as orchestration calls them.
pub trait HookRunner {
    fn is_empty(&self) -> bool;
    /// The policy hooks' verdict on the pod's selections (spec 7.4); what they admit follows the spec's
    /// rules.
    fn policy(
        &self,
        pod: &Pod,
        selections: Vec<Selection>,
    ) -> Result<PolicyOutcome<Selection>, PlexusError>;
    fn resolve(
        &self,
        pod: &Pod,
        selection: &Selection,
        nad: &NetworkAttachmentDefinition,
        config: Option<&Value>,
    ) -> Result<Option<Value>, PlexusError>;
    /// The status entries after the status hooks; they follow the spec's rules (section 5).
    fn status(&self, pod: &Pod, entries: Vec<Value>) -> Result<Vec<Value>, PlexusError>;
}

/// No hooks configured.
#[derive(Debug, Default)]
pub struct NoHooks;

impl HookRunner for NoHooks {
    fn is_empty(&self) -> bool {
        true
    }
    fn policy(
        &self,
        _: &Pod,
        selections: Vec<Selection>,
    ) -> Result<PolicyOutcome<Selection>, PlexusError> {
        Ok(PolicyOutcome::Admit(selections))
    }
    fn resolve(
        &self,
        _: &Pod,
        _: &Selection,
        _: &NetworkAttachmentDefinition,
        _: Option<&Value>,
    ) -> Result<Option<Value>, PlexusError> {
        Ok(None)
    }
    fn status(&self, _: &Pod, entries: Vec<Value>) -> Result<Vec<Value>, PlexusError> {
        Ok(entries)
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

    fn policy(
        &self,
        pod: &Pod,
        selections: Vec<Selection>,
    ) -> Result<PolicyOutcome<Selection>, PlexusError> {
        let input = selections.iter().map(Selection::to_json).collect();
        Ok(match Hooks::policy(self, pod, input)? {
            PolicyOutcome::Deny { hook, reason } => PolicyOutcome::Deny { hook, reason },
            // Checked by the hook chain against the same rules; parsing cannot fail on what passed them.
            PolicyOutcome::Admit(list) => PolicyOutcome::Admit(
                list.iter()
                    .enumerate()
                    .map(|(i, v)| Selection::from_json(v, &pod.namespace, i))
                    .collect::<Result<_, _>>()
                    .map_err(|e| PlexusError::HookFault(format!("policy hook output: {e}")))?,
            ),
        })
    }

    fn resolve(
        &self,
        pod: &Pod,
        selection: &Selection,
        nad: &NetworkAttachmentDefinition,
        config: Option<&Value>,
    ) -> Result<Option<Value>, PlexusError> {
        // The WIT carries both in their Kubernetes JSON forms.
        let nad = serde_json::json!({
            "apiVersion": "k8s.cni.cncf.io/v1",
            "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": nad.name, "namespace": nad.namespace, "annotations": nad.annotations},
            "spec": nad.config.as_ref().map_or(serde_json::json!({}), |c| serde_json::json!({"config": c})),
        });
        Ok(Hooks::resolve(
            self,
            pod,
            &selection.to_json(),
            Some(&nad),
            config,
        )?)
    }

    fn status(&self, pod: &Pod, entries: Vec<Value>) -> Result<Vec<Value>, PlexusError> {
        Ok(Hooks::status(self, pod, entries)?)
    }
}
