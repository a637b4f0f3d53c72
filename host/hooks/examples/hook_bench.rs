//! Hook benchmark (not a test): prints JSON with, per example guest, the cold compile and cached load
//! time and the warm per-call latency (p50/p99 over many calls, each a fresh store + instantiation) from
//! the engine the plexus binary uses (instances on demand), and the latency of the three kinds in sequence as
//! one ADD runs them.
//!
//! Needs the guests (`guests/build.sh`). Run: `cargo run --release -p plexus-hooks --example hook_bench
//! [-- CALLS]` (default 2000 calls per measurement).

use plexus_core::spec::Pod;
use plexus_hooks::{ArtifactSource, HookKind, HookSpec, Hooks};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn guests_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PLEXUS_GUESTS_DIR") {
        return PathBuf::from(dir);
    }
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"))
        .join("guests")
}

fn percentiles(mut samples: Vec<Duration>) -> Value {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[i].as_secs_f64() * 1e6
    };
    let mean = samples.iter().sum::<Duration>().as_secs_f64() * 1e6 / samples.len() as f64;
    json!({"calls": samples.len(), "p50Us": at(0.5), "p99Us": at(0.99), "meanUs": mean, "maxUs": at(1.0)})
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

struct Example {
    guest: &'static str,
    spec: HookSpec,
}

fn examples() -> Result<Vec<Example>, String> {
    let dir = guests_dir();
    let mut out = Vec::new();
    for (guest, kind, settings) in [
        (
            "namespace-isolation",
            HookKind::Policy,
            json!({"globalNamespaces": ["default", "infra"]}),
        ),
        (
            "network-templates",
            HookKind::Resolver,
            json!({"templates": {"lab": {"cniVersion": "1.0.0", "type": "bridge", "bridge": "lab0",
                   "ipam": {"type": "host-local", "subnet": "10.10.0.0/16"}}}}),
        ),
        (
            "status-labels",
            HookKind::Status,
            json!({"labels": ["app", "tier"]}),
        ),
    ] {
        let module = dir.join(format!("{guest}.wasm"));
        if !module.is_file() {
            return Err(format!(
                "{} is missing: build the guests first with guests/build.sh",
                module.display()
            ));
        }
        let mut spec = HookSpec::new(guest, kind, module);
        spec.settings = Some(settings);
        out.push(Example { guest, spec });
    }
    Ok(out)
}

fn main() -> Result<(), String> {
    let calls: usize = std::env::args()
        .nth(1)
        .map(|a| {
            a.parse()
                .map_err(|_| format!("CALLS {a:?} is not a number"))
        })
        .transpose()?
        .unwrap_or(2000)
        .max(1000);
    let examples = examples()?;
    let pod = Pod {
        namespace: "team-a".into(),
        name: "web-0".into(),
        uid: Some("6f1c".into()),
        labels: [("app", "web"), ("tier", "front")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        annotations: Default::default(),
        ..Default::default()
    };
    let selections = vec![
        json!({"name": "lab", "namespace": "team-a", "interface": "net1"}),
        json!({"name": "storage", "namespace": "infra", "ips": ["10.20.0.5/24"]}),
    ];
    let nad = json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                     "metadata": {"name": "lab", "namespace": "team-a"}});
    let entries = vec![
        json!({"name": "kube-system/pod-net", "interface": "eth0", "ips": ["10.0.0.2"], "default": true}),
        json!({"name": "team-a/lab", "interface": "net1", "ips": ["10.10.0.4"], "mac": "02:00:00:00:00:04", "default": false}),
        json!({"name": "infra/storage", "interface": "net2", "ips": ["10.20.0.5"], "default": false}),
    ];

    let call = |hooks: &Hooks, kind: HookKind| -> Result<(), String> {
        match kind {
            HookKind::Policy => hooks.policy(&pod, selections.clone()).map(drop),
            HookKind::Resolver => hooks
                .resolve(&pod, &selections[0], Some(&nad), None)
                .map(drop),
            HookKind::Status => hooks.status(&pod, entries.clone()).map(drop),
        }
        .map_err(|e| e.to_string())
    };

    let mut per_guest = Vec::new();
    for ex in &examples {
        let cache = tempfile::tempdir().map_err(|e| e.to_string())?;
        let specs = std::slice::from_ref(&ex.spec);
        let start = Instant::now();
        let cold = Hooks::load(specs, cache.path()).map_err(|e| e.to_string())?;
        let cold_time = start.elapsed();
        assert_eq!(cold.artifacts()[0].source, ArtifactSource::Compiled);
        drop(cold);
        let start = Instant::now();
        let hooks = Hooks::load(specs, cache.path()).map_err(|e| e.to_string())?;
        let cached_time = start.elapsed();
        if hooks.artifacts()[0].source != ArtifactSource::Cached {
            return Err(format!("{}: second load did not use the cache", ex.guest));
        }
        for _ in 0..50 {
            call(&hooks, ex.spec.kind)?;
        }
        let mut samples = Vec::with_capacity(calls);
        for _ in 0..calls {
            let t = Instant::now();
            call(&hooks, ex.spec.kind)?;
            samples.push(t.elapsed());
        }
        per_guest.push(json!({
            "guest": ex.guest,
            "kind": ex.spec.kind,
            "componentBytes": std::fs::metadata(&ex.spec.module).map(|m| m.len()).unwrap_or(0),
            "coldCompileMs": ms(cold_time),
            "cachedLoadMs": ms(cached_time),
            "warmCall": percentiles(samples),
        }));
    }

    let cache = tempfile::tempdir().map_err(|e| e.to_string())?;
    let specs: Vec<HookSpec> = examples.iter().map(|e| e.spec.clone()).collect();
    let start = Instant::now();
    let hooks = Hooks::load(&specs, cache.path()).map_err(|e| e.to_string())?;
    let cold_all = start.elapsed();
    drop(hooks);
    let start = Instant::now();
    let hooks = Hooks::load(&specs, cache.path()).map_err(|e| e.to_string())?;
    let cached_all = start.elapsed();
    let mut samples = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        for kind in HookKind::ALL {
            call(&hooks, kind)?;
        }
        samples.push(t.elapsed());
    }
    let report = json!({
        "calls": calls,
        "guests": per_guest,
        "threeInSequence": {
            "hooks": examples.iter().map(|e| e.guest).collect::<Vec<_>>(),
            "coldLoadMs": ms(cold_all),
            "cachedLoadMs": ms(cached_all),
            "perPod": percentiles(samples),
        },
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
    );
    Ok(())
}
