//! An in-memory registry, compiler, prober and API server for the agent's in-process tests ([`FakeEffects`]):
//! what the real-parts suite does with a registry, the plexus binary and kube-apiserver, here on tokio's paused
//! clock. Each call is recorded with what the node's hook set on disk ran at that moment, so a test can say what
//! happened before what.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use oci_client::Reference;
use plexus_cluster::ClusterError;
use plexus_cni::hooks::HookSet;
use plexus_hooks::HookSpec;
use serde_json::Value;
use tokio::time::Instant;

use super::effects::{AgentEffects, Fetched};
use crate::daemon::compile::Compiled;
use crate::distribution::{self, TrustedKeys};
use crate::hook_state::{Failure, Reason};

/// One effect, as the fake saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// A pull of a module by reference (answered or not).
    Pull(String),
    /// A compile, by the component's sha256.
    Compile(String),
    /// A probe of a hook, with the component's sha256.
    Probe {
        hook: String,
        sha256: String,
    },
    /// A report sent (answered or not).
    Report(Value),
    Legacy(String),
    Warn {
        hook: String,
        reason: String,
    },
}

/// An effect with when it happened, and the hook set on disk then: each entry's name and component sha256
/// (empty for an unready one).
pub type Call = (Instant, Effect, Vec<(String, String)>);

/// A module in the registry: its component and the key ID that signed it (none: unsigned).
#[derive(Debug, Clone)]
pub struct Stored {
    pub wasm: Vec<u8>,
    pub signed_by: Option<String>,
}

/// The registry, the API server and the compile and probe processes, in memory. The registry and the API server
/// are down while told so; reports are refused (as invalid) while `refuse_reports` is set.
#[derive(Default)]
pub struct FakeEffects {
    /// Modules by reference (`REGISTRY/REPOSITORY@sha256:...`).
    pub registry: Mutex<HashMap<String, Stored>>,
    pub registry_down: AtomicBool,
    pub api_down: AtomicBool,
    pub refuse_reports: AtomicBool,
    /// Probe verdicts by component sha256 (passes when absent).
    pub probe_fails: Mutex<HashMap<String, Failure>>,
    /// The report the API server holds.
    pub report: Mutex<Option<Value>>,
    cache_dir: PathBuf,
    calls: Mutex<Vec<Call>>,
}

impl FakeEffects {
    pub fn new(cache_dir: &Path) -> FakeEffects {
        FakeEffects {
            cache_dir: cache_dir.to_path_buf(),
            ..FakeEffects::default()
        }
    }

    /// Puts a module in the registry: its reference (`r.example/<repo>@sha256:<sha of wasm>`).
    pub fn push(&self, repo: &str, wasm: &[u8], signed_by: Option<&str>) -> String {
        let reference = format!("r.example/{repo}@{}", distribution::sha256_digest(wasm));
        let stored = Stored {
            wasm: wasm.to_vec(),
            signed_by: signed_by.map(str::to_string),
        };
        self.registry
            .lock()
            .unwrap()
            .insert(reference.clone(), stored);
        reference
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn effects(&self) -> Vec<Effect> {
        self.calls().into_iter().map(|(_, e, _)| e).collect()
    }

    /// When each pull of `reference` was made.
    pub fn pulls_of(&self, reference: &str) -> Vec<Instant> {
        self.calls()
            .into_iter()
            .filter(|(_, e, _)| *e == Effect::Pull(reference.to_string()))
            .map(|(at, _, _)| at)
            .collect()
    }

    /// The reports sent, answered or not.
    pub fn reports_sent(&self) -> usize {
        let reports = self.effects().into_iter();
        reports.filter(|e| matches!(e, Effect::Report(_))).count()
    }

    fn record(&self, effect: Effect) {
        let set = HookSet::read(&self.cache_dir).ok().flatten();
        let running = set
            .map(|s| s.hooks)
            .unwrap_or_default()
            .into_iter()
            .map(|h| (h.name, h.sha256.unwrap_or_default()))
            .collect();
        let now = Instant::now();
        self.calls.lock().unwrap().push((now, effect, running));
    }

    fn api(&self) -> Result<(), ClusterError> {
        if self.api_down.load(Ordering::SeqCst) {
            return Err(ClusterError::unavailable(
                "connection refused (the fake API server is down)",
            ));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl AgentEffects for FakeEffects {
    async fn pull(
        &self,
        reference: &Reference,
        keys: Option<&TrustedKeys>,
    ) -> Result<Fetched, Failure> {
        self.record(Effect::Pull(reference.whole()));
        if self.registry_down.load(Ordering::SeqCst) {
            let why = "connection refused (the fake registry is down)";
            return Err(Failure::new(Reason::PullFailed, why));
        }
        let found = self
            .registry
            .lock()
            .unwrap()
            .get(&reference.whole())
            .cloned();
        let stored = found.ok_or_else(|| Failure::new(Reason::NotFound, "no such manifest"))?;
        let verified_by = match (keys, &stored.signed_by) {
            (None, _) => None,
            (Some(_), None) => return Err(Failure::new(Reason::SignatureMissing, "no signature")),
            (Some(k), Some(by)) if k.ids().contains(by) => Some(by.clone()),
            (Some(_), Some(_)) => {
                let why = "no trusted key verifies its signature";
                return Err(Failure::new(Reason::SignatureInvalid, why));
            }
        };
        let sha256 = distribution::sha256_digest(&stored.wasm)["sha256:".len()..].to_string();
        let wasm = stored.wasm;
        Ok(Fetched {
            sha256,
            wasm,
            verified_by,
        })
    }

    /// "Compiles" into `<cache_dir>/compiled/<sha256>`: the agent checks that the artifact is there.
    async fn compile(&self, module: &Path) -> Result<Compiled, String> {
        let wasm = std::fs::read(module).map_err(|e| e.to_string())?;
        let sha256 = distribution::sha256_digest(&wasm)["sha256:".len()..].to_string();
        self.record(Effect::Compile(sha256.clone()));
        let artifact = self.cache_dir.join("compiled").join(&sha256);
        std::fs::create_dir_all(artifact.parent().unwrap()).map_err(|e| e.to_string())?;
        std::fs::write(&artifact, b"artifact").map_err(|e| e.to_string())?;
        Ok(Compiled { sha256, artifact })
    }

    async fn probe(&self, entry: &HookSpec) -> Result<(), Failure> {
        let sha256 = entry.sha256.clone().unwrap_or_default();
        let hook = entry.name.clone();
        self.record(Effect::Probe {
            hook,
            sha256: sha256.clone(),
        });
        match self.probe_fails.lock().unwrap().get(&sha256) {
            Some(f) => Err(f.clone()),
            None => Ok(()),
        }
    }

    async fn apply_report(&self, object: &Value) -> Result<(), ClusterError> {
        self.record(Effect::Report(object.clone()));
        self.api()?;
        if self.refuse_reports.load(Ordering::SeqCst) {
            return Err(ClusterError::Invalid {
                what: "patch nodehookstatuses node1".into(),
                reason: "API server answered 422 Invalid: refused".into(),
            });
        }
        *self.report.lock().unwrap() = Some(object.clone());
        Ok(())
    }

    async fn remove_legacy_entry(&self, hook: &str) -> Result<(), ClusterError> {
        self.record(Effect::Legacy(hook.into()));
        self.api()
    }

    async fn warn(&self, hook: &str, reason: &str, _message: &str) -> Result<(), ClusterError> {
        let (hook, reason) = (hook.into(), reason.into());
        self.record(Effect::Warn { hook, reason });
        self.api()
    }
}
