//! What one hook component costs (not a test), whatever language it was written in: prints JSON with its size,
//! its compile time as an ADD without an artifact compiles it, its cached load, the first call after that load
//! (what an ADD adds: a fresh process maps the artifact and makes one call), and the warm per-call latency
//! (p50/p99, each call a fresh store and instance), with the inputs of `hook_bench`.
//!
//! `cargo run --release -p plexus-hooks --example hook_cost -- FILE KIND [SETTINGS-JSON] [CALLS]`; run it under
//! `/usr/bin/time -v` for the peak memory of the whole (the compile dominates it).

use plexus_core::spec::Pod;
use plexus_hooks::{ArtifactSource, HookKind, HookSpec, Hooks};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn percentiles(mut samples: Vec<Duration>) -> Value {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[i].as_secs_f64() * 1e6
    };
    json!({"calls": samples.len(), "p50Us": at(0.5), "p99Us": at(0.99), "maxUs": at(1.0)})
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: hook_cost FILE KIND [SETTINGS-JSON] [CALLS]";
    let file = args.next().ok_or(usage)?;
    let kind: HookKind = args.next().ok_or(usage)?.parse().map_err(|_| usage)?;
    let settings: Option<Value> = args
        .next()
        .map(|s| serde_json::from_str(&s).map_err(|e| format!("SETTINGS-JSON: {e}")))
        .transpose()?;
    let calls: usize = args
        .next()
        .map(|a| {
            a.parse()
                .map_err(|_| format!("CALLS {a:?} is not a number"))
        })
        .transpose()?
        .unwrap_or(1000)
        .max(100);

    let pod = Pod {
        namespace: "team-a".into(),
        name: "web-0".into(),
        uid: Some("6f1c".into()),
        labels: [("app", "web"), ("tier", "front")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
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
        json!({"name": "team-a/lab", "interface": "net1", "ips": ["10.10.0.4"], "default": false}),
        json!({"name": "infra/storage", "interface": "net2", "ips": ["10.20.0.5"], "default": false}),
    ];
    let call = |hooks: &Hooks| -> Result<(), String> {
        match kind {
            HookKind::Policy => hooks.policy(&pod, selections.clone()).map(drop),
            HookKind::Resolver => hooks
                .resolve(&pod, &selections[0], Some(&nad), None)
                .map(drop),
            HookKind::Status => hooks.status(&pod, entries.clone()).map(drop),
        }
        .map_err(|e| e.to_string())
    };

    let mut spec = HookSpec::new("hook", kind, &file);
    spec.settings = settings;
    let specs = std::slice::from_ref(&spec);
    let cache = tempfile::tempdir().map_err(|e| e.to_string())?;
    let start = Instant::now();
    let cold = Hooks::load(specs, cache.path()).map_err(|e| e.to_string())?;
    let compile = start.elapsed();
    drop(cold);
    let start = Instant::now();
    let hooks = Hooks::load(specs, cache.path()).map_err(|e| e.to_string())?;
    let cached = start.elapsed();
    if hooks.artifacts()[0].source != ArtifactSource::Cached {
        return Err("the second load did not use the cache".into());
    }
    let start = Instant::now();
    call(&hooks)?;
    let first = start.elapsed();
    for _ in 0..20 {
        call(&hooks)?;
    }
    let mut samples = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        call(&hooks)?;
        samples.push(t.elapsed());
    }
    let report = json!({
        "component": file,
        "kind": kind,
        "componentBytes": std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0),
        "compileMs": ms(compile),
        "cachedLoadMs": ms(cached),
        "firstCallMs": ms(first),
        "perAddMs": ms(cached + first),
        "warmCall": percentiles(samples),
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
    );
    Ok(())
}
