//! What wasmtime's compiler settings cost one component (not a test): compiles FILE once with the settings given
//! and prints the time and the artifact's size; run it under `/usr/bin/time` or `prlimit --data` for its memory.
//!
//! `cargo run --release -p plexus-hooks --example compile_settings -- FILE [--sequential] [--opt none|speed]
//! [--regalloc single-pass|backtracking]`

use std::time::Instant;
use wasmtime::{Config, Engine, OptLevel, RegallocAlgorithm};

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let file = args
        .next()
        .ok_or("usage: compile_settings FILE [options]")?;
    let mut config = Config::new();
    config.epoch_interruption(true);
    config.wasm_component_model(true);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--sequential" => {
                config.parallel_compilation(false);
            }
            "--opt" => {
                config.cranelift_opt_level(match args.next().as_deref() {
                    Some("none") => OptLevel::None,
                    Some("speed") => OptLevel::Speed,
                    other => return Err(format!("--opt {other:?}")),
                });
            }
            "--regalloc" => {
                config.cranelift_regalloc_algorithm(match args.next().as_deref() {
                    Some("single-pass") => RegallocAlgorithm::SinglePass,
                    Some("backtracking") => RegallocAlgorithm::Backtracking,
                    other => return Err(format!("--regalloc {other:?}")),
                });
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    let engine = Engine::new(&config).map_err(|e| format!("{e:#}"))?;
    let wasm = std::fs::read(&file).map_err(|e| format!("{file}: {e}"))?;
    let start = Instant::now();
    let artifact = engine
        .precompile_component(&wasm)
        .map_err(|e| format!("{e:#}"))?;
    println!(
        "{{\"compileMs\": {:.1}, \"artifactBytes\": {}}}",
        start.elapsed().as_secs_f64() * 1e3,
        artifact.len()
    );
    Ok(())
}
