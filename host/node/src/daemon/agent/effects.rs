//! What the node agent does outside its own memory, behind one seam ([`AgentEffects`]): the OCI registry, the
//! compile and probe processes, and the API server's writes (the node's report, the removal of an earlier
//! version's status entries, Warning events). [`KubeEffects`] is the node's; the agent's tests put an in-memory
//! one in its place.
//!
//! The clock is tokio's (`tokio::time::Instant`, as the controller's): a test pauses and advances it. The files
//! the agent keeps (the hook set, the pulled modules and their records) are on local disk in every case: they are
//! what an ADD reads, so the tests read them too.

use std::path::{Path, PathBuf};

use kube::api::{Api, DynamicObject};
use oci_client::Reference;
use plexus_cluster::{ClusterError, KubeApi};
use plexus_hooks::HookSpec;
use serde_json::{json, Value};

use super::{AgentSettings, GROUP, KIND, VERSION};
use crate::daemon::compile::{self, Compiled};
use crate::distribution::{DistError, Registry, TrustedKeys};
use crate::hook_state::{Failure, Reason};
use crate::node_report;

/// A module pulled by its pinned reference, and the trusted key its signature verified with (`None`: no keys
/// were given, signatures are off).
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The component's sha256 (hex), checked against the manifest.
    pub sha256: String,
    pub wasm: Vec<u8>,
    pub verified_by: Option<String>,
}

/// The agent's effects. Each is one attempt: the agent keeps what it wants (its backoff per module, the report
/// it has not got through) and tries again itself, so nothing below it retries.
#[async_trait::async_trait]
pub trait AgentEffects: Send + Sync + 'static {
    /// Pulls the module `reference` pins (bounded) and, given `keys`, verifies its signature with them; nothing
    /// of it is used before that.
    async fn pull(
        &self,
        reference: &Reference,
        keys: Option<&TrustedKeys>,
    ) -> Result<Fetched, Failure>;
    /// Compiles a module file into the node's hook cache, in a process of its own: its sha256 and artifact.
    async fn compile(&self, module: &Path) -> Result<Compiled, String>;
    /// Loads one entry as an ADD would and calls its kind's export once on a synthetic pod, in a process of its
    /// own (the module runs, its memory goes with the process).
    async fn probe(&self, entry: &HookSpec) -> Result<(), Failure>;
    /// Applies the node's own `NodeHookStatus` object. A refusal (the request itself is wrong: invalid,
    /// forbidden) is any error that is not [`ClusterError::is_transient`] nor refused credentials.
    async fn apply_report(&self, object: &Value) -> Result<(), ClusterError>;
    /// Removes this node's entry from the hook's `status.nodes`, where an agent of an earlier version wrote it.
    async fn remove_legacy_entry(&self, hook: &str) -> Result<(), ClusterError>;
    /// Posts a Warning event on the NetworkHook, best effort.
    async fn warn(&self, hook: &str, reason: &str, message: &str) -> Result<(), ClusterError>;
}

/// The node's effects: its registry client, its own binary as compiler and prober, and its API client; the
/// writes without retries (see [`AgentEffects`]), the events with the client's one attempt.
pub struct KubeEffects {
    api: KubeApi,
    writes: KubeApi,
    reports: Api<DynamicObject>,
    hooks: Api<DynamicObject>,
    registry: Result<Registry, String>,
    node: String,
    compiler: PathBuf,
    cache_dir: PathBuf,
    limits: compile::ProcessLimits,
}

impl KubeEffects {
    pub fn new(api: KubeApi, settings: &AgentSettings) -> KubeEffects {
        let client = api.client().clone();
        KubeEffects {
            writes: api.without_retries(),
            reports: Api::all_with(client.clone(), &node_report::api_resource()),
            hooks: Api::all_with(client, &super::api_resource()),
            api,
            registry: Registry::new(&settings.registry).map_err(|e| e.to_string()),
            node: settings.node.clone(),
            compiler: settings.compiler.clone(),
            cache_dir: settings.cache_dir.clone(),
            limits: settings.limits,
        }
    }
}

#[async_trait::async_trait]
impl AgentEffects for KubeEffects {
    async fn pull(
        &self,
        reference: &Reference,
        keys: Option<&TrustedKeys>,
    ) -> Result<Fetched, Failure> {
        let fail = |e: DistError| Failure::new(e.reason(), e.to_string());
        let registry = self
            .registry
            .as_ref()
            .map_err(|e| Failure::new(Reason::PullFailed, e.clone()))?;
        let digest = reference.digest().unwrap_or_default();
        // Pulled first (bounded), so a module that is not there is reported as such.
        let pulled = registry.pull_module(reference).await.map_err(fail)?;
        let verified_by = match keys {
            Some(k) => Some(registry.verify(reference, digest, k).await.map_err(fail)?),
            None => None,
        };
        Ok(Fetched {
            sha256: pulled.sha256,
            wasm: pulled.wasm,
            verified_by,
        })
    }

    async fn compile(&self, module: &Path) -> Result<Compiled, String> {
        let timeout = compile::COMPILE_TIMEOUT;
        compile::compile_apart(
            &self.compiler,
            module,
            &self.cache_dir,
            &self.limits,
            timeout,
        )
        .await
    }

    async fn probe(&self, entry: &HookSpec) -> Result<(), Failure> {
        let timeout = compile::COMPILE_TIMEOUT;
        compile::probe_apart(
            &self.compiler,
            entry,
            &self.cache_dir,
            &self.limits,
            timeout,
        )
        .await
        .unwrap_or_else(|why| Err(Failure::new(Reason::FailedProbe, why)))
    }

    async fn apply_report(&self, object: &Value) -> Result<(), ClusterError> {
        let resource = (node_report::PLURAL, node_report::GROUP);
        let body = (super::REPORT_MANAGER, object);
        self.writes
            .apply_cluster_scoped(&self.reports, resource, &self.node, body)
            .await
    }

    async fn remove_legacy_entry(&self, hook: &str) -> Result<(), ClusterError> {
        // The earlier agent's field manager: applying nothing under it removes what it owned.
        let manager = format!("plexus-agent-{}", self.node);
        let body = json!({
            "apiVersion": format!("{GROUP}/{VERSION}"),
            "kind": KIND,
            "metadata": {"name": hook},
        });
        let resource = (super::STATUS_RESOURCE, GROUP);
        self.writes
            .apply_cluster_scoped(&self.hooks, resource, hook, (&manager, &body))
            .await
    }

    async fn warn(&self, hook: &str, reason: &str, message: &str) -> Result<(), ClusterError> {
        // Cluster scoped, so the event goes to the `default` namespace.
        let object = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(format!("{GROUP}/{VERSION}")),
            kind: Some(KIND.into()),
            name: Some(hook.into()),
            ..Default::default()
        };
        let message = format!("node {}: {message}", self.node);
        let reporter = ("plexus-agent", Some(self.node.as_str()));
        self.api
            .post_event_about(object, ("Warning", reason), &message, reporter)
            .await
            .map(drop)
    }
}
