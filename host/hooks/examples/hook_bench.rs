//! Hook benchmark (not a test): prints JSON with, per example guest, the cold compile and cached load
//! time and the warm per-call latency (p50/p99 over many calls, each a fresh store + instantiation) from
//! the engine the plexus binary uses (instances on demand), and the latency of the three kinds in sequence as
//! one ADD runs them.
//!
//! Needs the guests (`guests/build.sh`). Run: `cargo run --release -p plexus-hooks --example hook_bench
//! [-- CALLS]` (default 2000 calls per measurement).

mod common;

use common::{load_twice, ms, percentiles, timed, Inputs};
use plexus_hooks::{HookKind, HookSpec};
use serde_json::{json, Value};
use std::path::PathBuf;

fn guests_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PLEXUS_GUESTS_DIR") {
        return PathBuf::from(dir);
    }
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"))
        .join("guests")
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

/// One guest's row: its size, its loads and its warm calls.
fn guest_row(ex: &Example, calls: usize, inputs: &Inputs) -> Result<Value, String> {
    let (cold, cached, hooks, _cache) = load_twice(std::slice::from_ref(&ex.spec))?;
    for _ in 0..50 {
        inputs.call(&hooks, ex.spec.kind)?;
    }
    let samples = timed(calls, || inputs.call(&hooks, ex.spec.kind))?;
    Ok(json!({
        "guest": ex.guest,
        "kind": ex.spec.kind,
        "componentBytes": std::fs::metadata(&ex.spec.module).map(|m| m.len()).unwrap_or(0),
        "coldCompileMs": ms(cold),
        "cachedLoadMs": ms(cached),
        "warmCall": percentiles(samples),
    }))
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
    let inputs = Inputs::new();
    let per_guest = examples
        .iter()
        .map(|ex| guest_row(ex, calls, &inputs))
        .collect::<Result<Vec<_>, _>>()?;

    let specs: Vec<HookSpec> = examples.iter().map(|e| e.spec.clone()).collect();
    let (cold_all, cached_all, hooks, _cache) = load_twice(&specs)?;
    let samples = timed(calls, || {
        HookKind::ALL
            .into_iter()
            .try_for_each(|kind| inputs.call(&hooks, kind))
    })?;
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
