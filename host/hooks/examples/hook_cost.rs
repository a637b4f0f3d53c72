//! What one hook component costs (not a test), whatever language it was written in: prints JSON with its size,
//! its compile time as an ADD without an artifact compiles it, its cached load, the first call after that load
//! (what an ADD adds: a fresh process maps the artifact and makes one call), and the warm per-call latency
//! (p50/p99, each call a fresh store and instance), with the inputs of `hook_bench`.
//!
//! `cargo run --release -p plexus-hooks --example hook_cost -- FILE KIND [SETTINGS-JSON] [CALLS]`; run it under
//! `/usr/bin/time -v` for the peak memory of the whole (the compile dominates it).

mod common;

use common::{load_twice, ms, percentiles, timed, Inputs};
use plexus_hooks::{HookKind, HookSpec};
use serde_json::{json, Value};
use std::time::Instant;

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

    let inputs = Inputs::new();
    let mut spec = HookSpec::new("hook", kind, &file);
    spec.settings = settings;
    let (compile, cached, hooks, _cache) = load_twice(std::slice::from_ref(&spec))?;
    let start = Instant::now();
    inputs.call(&hooks, kind)?;
    let first = start.elapsed();
    for _ in 0..20 {
        inputs.call(&hooks, kind)?;
    }
    let samples = timed(calls, || inputs.call(&hooks, kind))?;
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
