//! Hooks by language: the example hooks that exist in Rust, Python and TypeScript (namespace-isolation, a policy;
//! status-labels, a status hook), each build measured alike. Its component's size; the node agent's compile of it
//! (`plexus hook compile`, what the agent runs in its compile process: wall time and the process's peak RSS, median
//! of three into an empty cache); and, from `hook_cost` (an example of plexus-hooks), what a fresh process adds to an
//! ADD with the compiled artifact there (its load and one call) and the warm call's p50/p99 (a fresh store and
//! instance per call, as an ADD makes them).

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use crate::{log, proc, stats, world, Opts};

const COMPILES: usize = 3;
const CALLS: &str = "1000";

pub fn languages(o: &Opts) -> Result<Value, String> {
    let hook_cost = o.target.join("release/examples/hook_cost");
    if !hook_cost.exists() {
        return Err(format!(
            "{} is missing: build the examples (cargo build --release --workspace --examples)",
            hook_cost.display()
        ));
    }
    let root = o.work.join("languages");
    let mut rows = Vec::new();
    for (_, guest, kind, settings) in world::hooks_in_every_language() {
        for (language, prefix) in world::LANGUAGES {
            let name = format!("{prefix}{guest}");
            let file = world::guest(&o.target, &name);
            let bytes = std::fs::metadata(&file)
                .map_err(|e| format!("{}: {e} (guests/build.sh builds it)", file.display()))?
                .len();
            log(&format!("languages: {name}: compile x{COMPILES}"));
            let mut compile_ms = Vec::new();
            let mut compile_rss_kib = Vec::new();
            for round in 0..COMPILES {
                let cache = root.join(format!("{name}-{round}"));
                let _ = std::fs::remove_dir_all(&cache);
                let mut cmd = Command::new(&o.plexus);
                cmd.args(["hook", "compile"])
                    .arg(&file)
                    .arg("--cache-dir")
                    .arg(&cache)
                    .stderr(Stdio::null());
                let run = proc::run(&mut cmd, b"")
                    .map_err(|e| format!("plexus hook compile {name}: {e}"))?;
                let _ = std::fs::remove_dir_all(&cache);
                if !run.success {
                    return Err(format!("plexus hook compile {name} failed"));
                }
                compile_ms.push(run.elapsed.as_secs_f64() * 1e3);
                compile_rss_kib.push(run.max_rss_kib as f64);
            }
            log(&format!("languages: {name}: load and {CALLS} calls"));
            let cost = proc::json_answer(
                Command::new(&hook_cost)
                    .arg(&file)
                    .arg(kind)
                    .arg(settings.to_string())
                    .arg(CALLS)
                    .stderr(Stdio::null()),
                &format!("hook_cost {name}"),
            )?;
            rows.push(json!({
                "guest": guest,
                "kind": kind,
                "language": language,
                "build": name,
                "componentBytes": bytes,
                "compileMs": stats::median_of(compile_ms),
                "compilePeakRssKiB": stats::median_of(compile_rss_kib),
                "perAddMs": cost["perAddMs"],
                "cachedLoadMs": cost["cachedLoadMs"],
                "firstCallMs": cost["firstCallMs"],
                "warmCall": cost["warmCall"],
            }));
        }
    }
    let _ = std::fs::remove_dir_all(&root);
    Ok(json!({
        "compileMemoryBoundMiB": compile_memory_bound(&o.plexus),
        "hooks": rows,
    }))
}

/// The node agent's bound on a compile process's memory, as `plexus daemon --help` states its default.
fn compile_memory_bound(plexus: &Path) -> Option<u64> {
    let help = Command::new(plexus)
        .args(["daemon", "--help"])
        .output()
        .ok()?;
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let flag = help.split("--hook-compile-memory-mib").nth(1)?;
    let default = flag.split("[default: ").nth(1)?;
    default.split(']').next()?.trim().parse().ok()
}
