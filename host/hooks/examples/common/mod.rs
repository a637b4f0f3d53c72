//! What the hook examples share: the inputs each hook kind is called with, the two loads of a component, and
//! the timings.

use plexus_core::spec::Pod;
use plexus_hooks::{ArtifactSource, HookKind, HookSpec, Hooks};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// p50, p99, mean and max of `samples`, in microseconds.
pub fn percentiles(mut samples: Vec<Duration>) -> Value {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[i].as_secs_f64() * 1e6
    };
    let mean = samples.iter().sum::<Duration>().as_secs_f64() * 1e6 / samples.len() as f64;
    json!({"calls": samples.len(), "p50Us": at(0.5), "p99Us": at(0.99), "meanUs": mean, "maxUs": at(1.0)})
}

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// What each hook is called with: one pod, two selections, a NAD and three status entries.
pub struct Inputs {
    pod: Pod,
    selections: Vec<Value>,
    nad: Value,
    entries: Vec<Value>,
}

impl Inputs {
    pub fn new() -> Inputs {
        Inputs {
            pod: Pod {
                namespace: "team-a".into(),
                name: "web-0".into(),
                uid: Some("6f1c".into()),
                labels: [("app", "web"), ("tier", "front")]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                annotations: Default::default(),
                ..Default::default()
            },
            selections: vec![
                json!({"name": "lab", "namespace": "team-a", "interface": "net1"}),
                json!({"name": "storage", "namespace": "infra", "ips": ["10.20.0.5/24"]}),
            ],
            nad: json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                        "metadata": {"name": "lab", "namespace": "team-a"}}),
            entries: vec![
                json!({"name": "kube-system/pod-net", "interface": "eth0", "ips": ["10.0.0.2"], "default": true}),
                json!({"name": "team-a/lab", "interface": "net1", "ips": ["10.10.0.4"], "mac": "02:00:00:00:00:04", "default": false}),
                json!({"name": "infra/storage", "interface": "net2", "ips": ["10.20.0.5"], "default": false}),
            ],
        }
    }

    /// One call of `hooks`' hooks of `kind`.
    pub fn call(&self, hooks: &Hooks, kind: HookKind) -> Result<(), String> {
        match kind {
            HookKind::Policy => hooks.policy(&self.pod, self.selections.clone()).map(drop),
            HookKind::Resolver => hooks
                .resolve(&self.pod, &self.selections[0], Some(&self.nad), None)
                .map(drop),
            HookKind::Status => hooks.status(&self.pod, self.entries.clone()).map(drop),
        }
        .map_err(|e| e.to_string())
    }
}

/// Loads `specs` twice into one cache: the cold (compiling) and the cached load's times, and the hooks of the second.
pub fn load_twice(
    specs: &[HookSpec],
) -> Result<(Duration, Duration, Hooks, tempfile::TempDir), String> {
    let cache = tempfile::tempdir().map_err(|e| e.to_string())?;
    let start = Instant::now();
    let cold = Hooks::load(specs, cache.path()).map_err(|e| e.to_string())?;
    let cold_time = start.elapsed();
    if cold.artifacts()[0].source != ArtifactSource::Compiled {
        return Err(format!("{}: the first load did not compile", specs[0].name));
    }
    drop(cold);
    let start = Instant::now();
    let hooks = Hooks::load(specs, cache.path()).map_err(|e| e.to_string())?;
    let cached_time = start.elapsed();
    if hooks.artifacts()[0].source != ArtifactSource::Cached {
        return Err(format!(
            "{}: second load did not use the cache",
            specs[0].name
        ));
    }
    Ok((cold_time, cached_time, hooks, cache))
}

/// `calls` timings of `one`.
pub fn timed(
    calls: usize,
    mut one: impl FnMut() -> Result<(), String>,
) -> Result<Vec<Duration>, String> {
    let mut samples = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        one()?;
        samples.push(t.elapsed());
    }
    Ok(samples)
}
