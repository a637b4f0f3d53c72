//! plexus-bench: what Plexus costs a pod, measured against a floor that execs the same delegates directly.
//!
//! Not a test. Run by `tests/bench.sh` (as root: the real-plugin cases create namespaces and bridges), which
//! renders `docs/benchmarks.md` from the JSON this writes (`target/bench/results.json`). Under the name
//! `bench-noop` the binary is the no-op delegate (see noop.rs). Its options: `plexus-bench --help`.

mod cpu;
mod daemon;
mod density;
mod floor;
mod hook_memory;
mod languages;
mod multus;
mod noop;
mod phases;
mod proc;
mod stats;
mod world;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::builder::RangedU64ValueParser;
use clap::{Parser, ValueEnum};
use plexus_tests::netns::{require_root_and_plugins, NetNs};
use serde_json::{json, Value};

use crate::world::{Delegates, World};

fn main() -> ExitCode {
    // The no-op delegate is this binary under another name, exec'd as a CNI plugin: it has no options.
    let argv0 = std::env::args().next().unwrap_or_default();
    if Path::new(&argv0)
        .file_name()
        .is_some_and(|n| n == noop::NAME)
    {
        return noop::main();
    }
    let args = Args::parse();
    match opts(args).and_then(|o| run(&o)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plexus-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What Plexus costs a pod, against a floor that execs the same delegates (as root; run by tests/bench.sh)
#[derive(Parser)]
#[command(name = "plexus-bench")]
struct Args {
    /// ADD/DEL runs per case.
    #[arg(long, value_name = "N", default_value_t = 50)]
    runs: usize,
    /// Where the results go [default: TARGET/bench/results.json].
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// The plexus binary measured [default: the one beside this binary].
    #[arg(long, value_name = "BIN")]
    plexus: Option<PathBuf>,
    /// The CNI plugin alone (no compiler), as installed on nodes [default: the one beside this binary].
    #[arg(long, value_name = "BIN")]
    plexus_cni: Option<PathBuf>,
    /// The cargo target directory: the wasm guests, the work directory [default: the one above this binary].
    #[arg(long, value_name = "DIR")]
    target: Option<PathBuf>,
    /// A shorter run: fewer rounds in the concurrency, hammer, daemon and density sections.
    #[arg(long)]
    quick: bool,
    /// Run only this section (repeatable; every section when absent).
    #[arg(long, value_name = "SECTION")]
    only: Vec<Section>,
    /// Pods per density burst (at most 240: the test kubelet's pod limit is 250).
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=240))]
    density_pods: usize,
    /// Rounds of the density section's four subjects.
    #[arg(long, value_name = "N", default_value_t = 5,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    density_rounds: usize,
    /// Only these subjects of the density section (comma-separated; every subject when absent): floor,
    /// runtime-3, plexus-daemon, plexus-thin, plexus-nri, multus-thick.
    #[arg(long, value_name = "SUBJECTS", value_delimiter = ',')]
    density_subjects: Vec<String>,
    /// Pods per burst of the large density section: the kubelet's usual maximum of pods per node.
    #[arg(long, value_name = "N", default_value_t = 240,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=240))]
    density_large_pods: usize,
    /// Rounds of the large density section.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    density_large_rounds: usize,
    /// The large density section's subjects (comma-separated).
    #[arg(
        long,
        value_name = "SUBJECTS",
        value_delimiter = ',',
        default_value = "floor,runtime-3,plexus-daemon,plexus-nri"
    )]
    density_large_subjects: Vec<String>,
    /// The container runtime of the density section's node.
    #[arg(long, value_enum, default_value_t = Runtime::Containerd)]
    runtime: Runtime,
}

/// A container runtime, as `--runtime` names it.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Runtime {
    Containerd,
    #[value(name = "cri-o")]
    CriO,
}

/// A section of the benchmark, as `--only` names it.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Section {
    Startup,
    MatrixNoop,
    MatrixReal,
    Scaling,
    Concurrency,
    Hammer,
    Daemon,
    Density,
    /// The density section at the kubelet's usual maximum of pods per node (`--density-large-*`).
    DensityLarge,
    HookMemory,
    Languages,
    Profile,
    // Internal: the profile section runs this binary under `perf record` with one of these (ADD/DEL loops only).
    #[value(hide = true)]
    PerfLoopNohooks,
    #[value(hide = true)]
    PerfLoopHooks,
}

/// The options checked and completed: absolute paths, the binaries and guests there.
struct Opts {
    runs: usize,
    out: PathBuf,
    target: PathBuf,
    plexus: PathBuf,
    /// The CNI plugin alone (no compiler), as installed on nodes.
    plexus_cni: PathBuf,
    work: PathBuf,
    quick: bool,
    /// Node density: pods per burst, rounds and subjects (all when empty).
    density: density::Shape,
    /// The same at the kubelet's usual maximum of pods per node.
    density_large: density::Shape,
    /// The density section's container runtime.
    runtime: plexus_tests::runtime::RuntimeKind,
    /// Sections to run (all when empty).
    only: Vec<Section>,
}

fn opts(args: Args) -> Result<Opts, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    let release = exe
        .parent()
        .ok_or("the bench binary has no directory")?
        .to_path_buf();
    let target = match args.target {
        // Confs need absolute paths.
        Some(dir) => {
            std::fs::canonicalize(&dir).map_err(|e| format!("--target {}: {e}", dir.display()))?
        }
        None => release
            .parent()
            .ok_or("the bench binary is not under target/")?
            .to_path_buf(),
    };
    for (flag, subjects) in [
        ("--density-subjects", &args.density_subjects),
        ("--density-large-subjects", &args.density_large_subjects),
    ] {
        if let Some(unknown) = subjects
            .iter()
            .find(|s| !density::SUBJECTS.contains(&s.as_str()))
        {
            return Err(format!(
                "{flag}: {unknown:?} is not one of {}",
                density::SUBJECTS.join(", ")
            ));
        }
    }
    let o = Opts {
        runs: args.runs,
        out: args
            .out
            .unwrap_or_else(|| target.join("bench/results.json")),
        plexus: args.plexus.unwrap_or_else(|| release.join("plexus")),
        plexus_cni: args
            .plexus_cni
            .unwrap_or_else(|| release.join("plexus-cni")),
        work: target.join("bench/work"),
        target,
        quick: args.quick,
        density: density::Shape {
            pods: args.density_pods,
            rounds: args.density_rounds,
            subjects: args.density_subjects,
        },
        density_large: density::Shape {
            pods: args.density_large_pods,
            rounds: args.density_large_rounds,
            subjects: args.density_large_subjects,
        },
        runtime: match args.runtime {
            Runtime::Containerd => plexus_tests::runtime::RuntimeKind::Containerd,
            Runtime::CriO => plexus_tests::runtime::RuntimeKind::CriO,
        },
        only: args.only,
    };
    if !o.plexus_cni.is_file() {
        return Err(format!(
            "{} is missing: build it with `cargo build --release -p plexus-cni`",
            o.plexus_cni.display()
        ));
    }
    if !o.plexus.is_file() {
        return Err(format!(
            "{} is missing: build with `cargo build --release --workspace --bins`",
            o.plexus.display()
        ));
    }
    for (_, g, _, _) in world::example_hooks() {
        let p = world::guest(&o.target, g);
        if !p.is_file() {
            return Err(format!("{} is missing: run guests/build.sh", p.display()));
        }
    }
    Ok(o)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn log(msg: &str) {
    eprintln!("plexus-bench: {msg}");
}

/// Latency samples of one case, plus the peak RSS of every plexus ADD.
#[derive(Default)]
struct Case {
    add: Vec<f64>,
    del: Vec<f64>,
    rss_kib: Vec<u64>,
    /// CPU time of the ADD's whole process tree.
    add_cpu: Vec<f64>,
}

impl Case {
    fn to_json(&self, id: &str, meta: Value) -> Value {
        let mut v =
            json!({"id": id, "add": stats::summary(&self.add), "del": stats::summary(&self.del)});
        if !self.add_cpu.is_empty() {
            v["addCpu"] = stats::summary(&self.add_cpu);
        }
        if !self.rss_kib.is_empty() {
            let mut r = self.rss_kib.clone();
            r.sort_unstable();
            v["maxRssKiB"] =
                json!({"median": r[r.len() / 2], "max": r[r.len() - 1], "samples": self.rss_kib});
        }
        if let (Value::Object(v), Value::Object(m)) = (&mut v, meta) {
            v.extend(m);
        }
        v
    }
}

/// A pod namespace for one ADD/DEL: real for the reference plugins (made and removed outside the timed region),
/// a path nobody opens for the no-op delegate.
fn pod_netns(d: Delegates) -> (Option<NetNs>, String) {
    match d {
        Delegates::Real => {
            let ns = NetNs::new("bench");
            let p = ns.path().display().to_string();
            (Some(ns), p)
        }
        Delegates::Noop => (None, "/var/run/netns/bench-noop".into()),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    Floor,
    Plexus,
    HooksWarm,
    HooksCold,
    /// The three hooks as the node agent publishes them (precompiled, in the node's hook set), full binary.
    HooksAgent,
    /// plexus-cni (no compiler): what nodes run, without hooks and with the agent's three, in the language whose
    /// builds start with the prefix ([`world::LANGUAGES`]).
    Cni,
    CniAgent(&'static str),
}

impl Variant {
    fn id(self) -> &'static str {
        match self {
            Variant::Floor => "floor",
            Variant::Plexus => "plexus",
            Variant::HooksWarm => "plexus+3 hooks warm",
            Variant::HooksCold => "plexus+3 hooks cold",
            Variant::HooksAgent => "plexus+3 hooks from the node agent",
            Variant::Cni => "plexus-cni",
            Variant::CniAgent("") => "plexus-cni+3 hooks from the node agent",
            Variant::CniAgent("py-") => "plexus-cni+3 Python hooks from the node agent",
            Variant::CniAgent(_) => "plexus-cni+3 TypeScript hooks from the node agent",
        }
    }
}

/// One ADD then DEL of pod 0 in `w` through `v`.
fn add_del(
    o: &Opts,
    w: &World,
    v: Variant,
    container: &str,
    case: &mut Case,
) -> Result<(), String> {
    let (_ns, netns) = pod_netns(w.delegates);
    match v {
        Variant::Floor => {
            let cpu = proc::children_cpu();
            let (t, results) = w.floor_add(container, &netns, 0)?;
            case.add.push(ms(t));
            case.add_cpu
                .push(ms(proc::children_cpu().saturating_sub(cpu)));
            case.del
                .push(ms(w.floor_del(container, &netns, 0, &results)?));
        }
        _ => {
            let conf = match v {
                Variant::HooksAgent => w.agent_conf(&o.target, ""),
                Variant::CniAgent(prefix) => w.agent_conf(&o.target, prefix),
                _ => w.conf(
                    &o.target,
                    matches!(v, Variant::HooksWarm | Variant::HooksCold),
                ),
            };
            let bin = match v {
                Variant::Cni | Variant::CniAgent(_) => &o.plexus_cni,
                _ => &o.plexus,
            };
            if v == Variant::HooksCold {
                w.empty_hook_cache();
            }
            let cpu = proc::children_cpu();
            let add = w.plexus(bin, &conf, "ADD", container, &netns, 0)?;
            case.add.push(ms(add.elapsed));
            case.add_cpu
                .push(ms(proc::children_cpu().saturating_sub(cpu)));
            case.rss_kib.push(add.max_rss_kib);
            let del = w.plexus(bin, &conf, "DEL", container, &netns, 0)?;
            case.del.push(ms(del.elapsed));
        }
    }
    Ok(())
}

/// ADD and DEL of a pod with the cluster network and 3 NADs, every variant interleaved run by run.
fn matrix(o: &Opts, d: Delegates) -> Result<Vec<Value>, String> {
    let w = World::new(
        &o.work,
        &format!("matrix-{}", d.as_str()),
        d,
        4,
        1,
        &json!({}),
    );
    let variants = [
        Variant::Floor,
        Variant::Plexus,
        Variant::HooksWarm,
        Variant::HooksCold,
        Variant::HooksAgent,
        Variant::Cni,
        Variant::CniAgent(""),
        Variant::CniAgent("py-"),
        Variant::CniAgent("ts-"),
    ];
    // What the node agent does before any ADD sees a hook: compile the components into the cache and publish the
    // node's hook set (untimed, once per language).
    for (_, prefix) in world::LANGUAGES {
        w.publish_agent_set(&o.plexus, &o.target, prefix)?;
    }
    let mut cases: Vec<Case> = variants.iter().map(|_| Case::default()).collect();
    // One untimed round: page cache, the compiled hooks for the warm variant.
    for v in variants {
        add_del(
            o,
            &w,
            v,
            &format!("warmup-{}", v.id().replace([' ', '+'], "-")),
            &mut Case::default(),
        )?;
    }
    let t0 = Instant::now();
    for i in 0..o.runs {
        for (v, case) in variants.iter().zip(cases.iter_mut()) {
            add_del(
                o,
                &w,
                *v,
                &format!("{}-{i}", v.id().replace([' ', '+'], "-")),
                case,
            )?;
        }
    }
    log(&format!(
        "matrix with {} delegates: {} runs in {:.1}s",
        d.as_str(),
        o.runs,
        t0.elapsed().as_secs_f64()
    ));
    let left = w.cached();
    if !left.is_empty() {
        return Err(format!(
            "matrix {}: the attachment cache kept {left:?} after DEL",
            d.as_str()
        ));
    }
    Ok(variants
        .iter()
        .zip(&cases)
        .map(|(v, c)| {
            c.to_json(
                &format!("{}/{}", d.as_str(), v.id()),
                json!({"delegates": d.as_str(), "variant": v.id(), "attachments": 4}),
            )
        })
        .collect())
}

/// Latency against the number of attachments (no-op delegates).
fn scaling(o: &Opts) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for k in [1usize, 2, 4, 8, 16] {
        let w = World::new(
            &o.work,
            &format!("scale-{k}"),
            Delegates::Noop,
            k,
            1,
            &json!({}),
        );
        let variants = [Variant::Floor, Variant::Plexus, Variant::HooksWarm];
        let mut cases: Vec<Case> = variants.iter().map(|_| Case::default()).collect();
        for v in variants {
            add_del(o, &w, v, "warmup", &mut Case::default())?;
        }
        for i in 0..o.runs {
            for (v, case) in variants.iter().zip(cases.iter_mut()) {
                add_del(o, &w, *v, &format!("s{k}-{i}"), case)?;
            }
        }
        let mut entry = json!({"attachments": k});
        for (v, c) in variants.iter().zip(&cases) {
            entry[v.id()] = c.to_json(v.id(), json!({}));
        }
        out.push(entry);
    }
    log("scaling done");
    Ok(out)
}

/// N pods added, then deleted, in parallel: distinct containers, one shared cache and run dir.
fn concurrency(o: &Opts) -> Result<Vec<Value>, String> {
    const PODS: usize = 64;
    let w = World::new(&o.work, "concurrency", Delegates::Noop, 4, PODS, &json!({}));
    let conf = w.conf(&o.target, false);
    let mut out = Vec::new();
    for n in [1usize, 8, 64] {
        let rounds = (o.runs.max(PODS)).div_ceil(n).max(2);
        let rounds = if o.quick { rounds.min(3) } else { rounds };
        let (mut add_lat, mut del_lat, mut add_tp, mut del_tp) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut errors = Vec::new();
        let mut rss = Vec::new();
        for r in 0..rounds {
            for command in ["ADD", "DEL"] {
                let barrier = Barrier::new(n);
                let results = Mutex::new(Vec::new());
                let start = Instant::now();
                std::thread::scope(|s| {
                    for p in 0..n {
                        let (w, conf, barrier, results) = (&w, &conf, &barrier, &results);
                        s.spawn(move || {
                            barrier.wait();
                            let r = w.plexus(
                                &o.plexus,
                                conf,
                                command,
                                &format!("c{n}-{r}-{p}"),
                                "/var/run/netns/bench-noop",
                                p,
                            );
                            results.lock().unwrap_or_else(|e| e.into_inner()).push(r);
                        });
                    }
                });
                let wall = start.elapsed();
                let (lat, tp) = if command == "ADD" {
                    (&mut add_lat, &mut add_tp)
                } else {
                    (&mut del_lat, &mut del_tp)
                };
                tp.push(n as f64 / wall.as_secs_f64());
                for r in results.into_inner().unwrap_or_else(|e| e.into_inner()) {
                    match r {
                        Ok(run) => {
                            lat.push(ms(run.elapsed));
                            if command == "ADD" {
                                rss.push(run.max_rss_kib);
                            }
                        }
                        Err(e) => errors.push(e),
                    }
                }
            }
        }
        let statuses = (0..n).filter(|p| w.status_written(*p)).count();
        let left = w.cached();
        log(&format!(
            "concurrency {n}: {rounds} rounds, {} errors",
            errors.len()
        ));
        out.push(json!({
            "pods": n,
            "rounds": rounds,
            "add": stats::summary(&add_lat),
            "del": stats::summary(&del_lat),
            "addPodsPerSec": stats::summary(&add_tp),
            "delPodsPerSec": stats::summary(&del_tp),
            "errors": errors,
            "statusWritten": statuses,
            "cacheLeftAfterDel": left,
            "maxRssKiB": rss.iter().max(),
        }));
    }
    Ok(out)
}

/// One container hammered by concurrent ADD and DEL: the per-container lock must serialize them.
fn hammer(o: &Opts) -> Result<Value, String> {
    let log_path = o.work.join("hammer-delegates.log");
    let _ = std::fs::remove_file(&log_path);
    let w = World::new(
        &o.work,
        "hammer",
        Delegates::Noop,
        4,
        1,
        &json!({"benchLog": log_path, "benchSleepMs": 1}),
    );
    let conf = w.conf(&o.target, false);
    let container = "hammered";
    let ops = hammer_ops(o, &w, &conf, container);
    let by_pid: BTreeMap<u32, &str> = ops
        .iter()
        .filter_map(|(c, r)| r.as_ref().ok().map(|r| (r.pid, *c)))
        .collect();
    let errors: Vec<String> = ops
        .iter()
        .filter_map(|(_, r)| r.as_ref().err().cloned())
        .collect();
    let calls = delegate_calls(&log_path, &by_pid)?;
    let overlaps = calls.windows(2).filter(|p| p[1].3 < p[0].4).count();
    let runs = plexus_runs(&calls);
    let mut seen = std::collections::BTreeSet::new();
    let interleaved = runs.iter().filter(|p| !seen.insert(**p)).count();
    let last_op = runs.last().and_then(|p| by_pid.get(p)).copied();
    let consistent = hammered_consistent(&w, container, last_op);
    // Leave nothing behind.
    w.plexus(
        &o.plexus,
        &conf,
        "DEL",
        container,
        "/var/run/netns/bench-noop",
        0,
    )?;
    let unknown_parents = runs.iter().filter(|p| !by_pid.contains_key(p)).count();
    log(&format!("hammer: {} ops, {} delegate calls, {overlaps} overlaps, {interleaved} interleavings, consistent {consistent}", ops.len(), calls.len()));
    Ok(json!({
        "threads": HAMMER_THREADS,
        "ops": ops.len(),
        "adds": ops.iter().filter(|(c, _)| *c == "ADD").count(),
        "dels": ops.iter().filter(|(c, _)| *c == "DEL").count(),
        "errors": errors,
        "delegateCalls": calls.len(),
        "plexusProcessesSeen": runs.len(),
        "overlappingDelegateCalls": overlaps,
        "interleavedProcesses": interleaved,
        "callsFromUnknownParents": unknown_parents,
        "lastOperation": last_op,
        "finalStateConsistent": consistent,
        "cacheLeftAfterFinalDel": w.cached(),
    }))
}

/// The threads of the hammer section, each alternating ADD and DEL of the one container.
const HAMMER_THREADS: usize = 8;

/// One delegate call of the hammer section's log: (the plexus pid it ran under, command, ifname, start, end).
type DelegateCall = (u32, String, String, u128, u128);

/// ADDs and DELs of `container` from [`HAMMER_THREADS`] threads started together, alternating in each: every
/// operation with its outcome, in the order they ended.
fn hammer_ops(
    o: &Opts,
    w: &World,
    conf: &Value,
    container: &str,
) -> Vec<(&'static str, Result<proc::ChildRun, String>)> {
    let ops_per_thread = if o.quick { 3 } else { 6 };
    let ops = Mutex::new(Vec::new());
    let barrier = Barrier::new(HAMMER_THREADS);
    std::thread::scope(|s| {
        for t in 0..HAMMER_THREADS {
            let (ops, barrier) = (&ops, &barrier);
            s.spawn(move || {
                barrier.wait();
                for i in 0..ops_per_thread {
                    let command = if (t + i) % 2 == 0 { "ADD" } else { "DEL" };
                    let r = w.plexus(
                        &o.plexus,
                        conf,
                        command,
                        container,
                        "/var/run/netns/bench-noop",
                        0,
                    );
                    ops.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((command, r));
                }
            });
        }
    });
    ops.into_inner().unwrap_or_else(|e| e.into_inner())
}

/// Every delegate interval the no-op delegates logged at `log_path`, in start order, each under the plexus process
/// of `plexus_pids` it ran for: its parent, or its parent's parent (a DEL's teardown process), else its parent.
fn delegate_calls(
    log_path: &Path,
    plexus_pids: &BTreeMap<u32, &str>,
) -> Result<Vec<DelegateCall>, String> {
    let text = std::fs::read_to_string(log_path)
        .map_err(|e| format!("read {}: {e}", log_path.display()))?;
    let mut calls: Vec<DelegateCall> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let parent: u32 = f[0].parse().ok()?;
            let grandparent: Option<u32> = f.get(5).and_then(|g| g.parse().ok());
            let ran_for = match grandparent {
                Some(g) if !plexus_pids.contains_key(&parent) && plexus_pids.contains_key(&g) => g,
                _ => parent,
            };
            Some((
                ran_for,
                f[1].to_string(),
                f[2].to_string(),
                f[3].parse().ok()?,
                f[4].parse().ok()?,
            ))
        })
        .collect();
    calls.sort_by_key(|c| c.3);
    Ok(calls)
}

/// The plexus processes of `calls` run by run: serialized means each process's delegate calls form one contiguous
/// run, so a pid seen twice is an interleaving.
fn plexus_runs(calls: &[DelegateCall]) -> Vec<u32> {
    let mut runs: Vec<u32> = Vec::new();
    for c in calls {
        if runs.last() != Some(&c.0) {
            runs.push(c.0);
        }
    }
    runs
}

/// Whether `container`'s state is the last operation's: after an ADD a plan with the 4 attachments' results and the
/// status written, after a DEL no plan.
fn hammered_consistent(w: &World, container: &str, last_op: Option<&str>) -> bool {
    let plan = w.plan(container);
    match last_op {
        Some("ADD") => {
            plan.as_ref().is_some_and(|p| {
                p["attachments"]
                    .as_array()
                    .is_some_and(|a| a.len() == 4 && a.iter().all(|x| x.get("result").is_some()))
            }) && w.status_written(0)
        }
        Some("DEL") => plan.is_none(),
        _ => false,
    }
}

/// Where the time of one no-op ADD goes: strace's syscall summary, perf stat, callgrind's top functions.
fn profile(o: &Opts) -> Value {
    let dir = o.target.join("bench/profile");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::create_dir_all(&dir);
    let w = World::new(&o.work, "profile", Delegates::Noop, 4, 1, &json!({}));
    let mut out = json!({});
    for (name, hooks) in [("nohooks", false), ("hooks", true)] {
        let conf = w.conf(&o.target, hooks);
        let prof = |command: &str| {
            w.plexus(
                &o.plexus,
                &conf,
                command,
                "prof",
                "/var/run/netns/bench-noop",
                0,
            )
        };
        // Fill the hook cache: the profile is of the warm path.
        let _ = prof("ADD");
        let _ = prof("DEL");
        for (tool, wrapper) in profilers(&dir, name) {
            if !installed(&wrapper[0]) {
                out[format!("{tool}-{name}")] =
                    json!({"error": format!("{} is not installed", wrapper[0])});
                continue;
            }
            let r = w.plexus_wrapped(
                &wrapper,
                &o.plexus,
                &conf,
                "ADD",
                "prof",
                "/var/run/netns/bench-noop",
                0,
            );
            let _ = prof("DEL");
            out[format!("{tool}-{name}")] = match r {
                Ok(_) => json!({"text": profile_text(&dir, tool, name)}),
                Err(e) => json!({"error": e}),
            };
        }
    }
    for (name, _) in [("nohooks", false), ("hooks", true)] {
        out[format!("perfrecord-{name}")] = perf_record(o, name, &dir);
    }
    log("profiles done");
    out
}

/// The profilers of an ADD with the hooks of `name`, each with the command line it wraps plexus in, writing under
/// `dir`.
fn profilers(dir: &Path, name: &str) -> [(&'static str, Vec<String>); 3] {
    [
        (
            "strace",
            vec![
                "strace".into(),
                "-c".into(),
                "-w".into(),
                "-o".into(),
                dir.join(format!("strace-{name}.txt")).display().to_string(),
            ],
        ),
        (
            "perf",
            vec![
                "perf".into(),
                "stat".into(),
                "-o".into(),
                dir.join(format!("perf-{name}.txt")).display().to_string(),
            ],
        ),
        (
            "callgrind",
            vec![
                "valgrind".into(),
                "--tool=callgrind".into(),
                "--quiet".into(),
                format!(
                    "--callgrind-out-file={}",
                    dir.join(format!("callgrind-{name}.out")).display()
                ),
            ],
        ),
    ]
}

/// Whether the shell finds `program`.
fn installed(program: &str) -> bool {
    let which = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status();
    matches!(which, Ok(s) if s.success())
}

/// What profiler `tool` wrote under `dir` for the hooks of `name` (callgrind's through callgrind_annotate).
fn profile_text(dir: &Path, tool: &str, name: &str) -> String {
    match tool {
        "callgrind" => Command::new("callgrind_annotate")
            .args(["--inclusive=no", "--threshold=90", "--auto=no"])
            .arg(dir.join(format!("callgrind-{name}.out")))
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default(),
        _ => std::fs::read_to_string(dir.join(format!("{tool}-{name}.txt"))).unwrap_or_default(),
    }
}

/// Process start and exit alone: plexus and plexus-cni answering VERSION against the no-op delegate doing the
/// same, interleaved.
fn startup(o: &Opts) -> Result<Value, String> {
    let w = World::new(&o.work, "startup", Delegates::Noop, 1, 1, &json!({}));
    let noop = w.root.join("bin").join(noop::NAME);
    let (mut px, mut cni, mut np, mut rss) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..=o.runs {
        for (bin, samples) in [
            (&o.plexus, &mut px),
            (&o.plexus_cni, &mut cni),
            (&noop, &mut np),
        ] {
            let mut cmd = Command::new(bin);
            cmd.env_clear()
                .env("CNI_COMMAND", "VERSION")
                .stderr(Stdio::null());
            let r = proc::run(&mut cmd, b"{\"cniVersion\":\"1.0.0\"}")
                .map_err(|e| format!("spawn {}: {e}", bin.display()))?;
            if !r.success {
                return Err(format!("{} VERSION failed", bin.display()));
            }
            // The first round only warms the page cache.
            if i > 0 {
                samples.push(ms(r.elapsed));
                if bin == &o.plexus {
                    rss.push(r.max_rss_kib);
                }
            }
        }
    }
    Ok(
        json!({"plexusVersion": stats::summary(&px), "plexusCniVersion": stats::summary(&cni),
               "noopVersion": stats::summary(&np), "plexusVersionMaxRssKiB": rss.iter().max()}),
    )
}

/// ADD/DEL rounds in the profile world (already set up, hook cache filled), for `perf record` to sample.
fn perf_loop(o: &Opts, hooks: bool) -> Result<(), String> {
    let w = World::existing(&o.work, "profile");
    let conf = w.conf(&o.target, hooks);
    for i in 0..o.runs {
        let id = format!("perf-{i}");
        w.plexus(&o.plexus, &conf, "ADD", &id, "/var/run/netns/bench-noop", 0)?;
        w.plexus(&o.plexus, &conf, "DEL", &id, "/var/run/netns/bench-noop", 0)?;
    }
    Ok(())
}

/// `perf record` of this binary re-run as `--only perf-loop-<name>`: CPU samples of the plexus processes only,
/// functions with their callees, heaviest first.
fn perf_record(o: &Opts, name: &str, dir: &Path) -> Value {
    let data = dir.join(format!("perf-{name}.data"));
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return json!({"error": format!("current exe: {e}")}),
    };
    let rec = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-F", "10000", "-g", "-o"])
        .arg(&data)
        .arg("--")
        .arg(exe)
        .arg("--target")
        .arg(&o.target)
        .arg("--plexus")
        .arg(&o.plexus)
        .args([
            "--runs",
            &o.runs.to_string(),
            "--only",
            &format!("perf-loop-{name}"),
        ])
        .stdout(Stdio::null())
        .output();
    match rec {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            return json!({"error": format!("perf record failed: {}", String::from_utf8_lossy(&out.stderr).trim())})
        }
        Err(e) => return json!({"error": format!("perf: {e}")}),
    }
    let report = Command::new("perf")
        .args(["report", "-i"])
        .arg(&data)
        .args([
            "--comm",
            "plexus",
            "--percentage",
            "relative",
            "--children",
            "--sort",
            "symbol",
            "--stdio",
            "-g",
            "none",
        ])
        .stderr(Stdio::null())
        .output();
    match report {
        Ok(out) => json!({"text": String::from_utf8_lossy(&out.stdout)}),
        Err(e) => json!({"error": format!("perf report: {e}")}),
    }
}

fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_default();
    let mem_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("MemTotal:")
                    .and_then(|r| r.trim().trim_end_matches(" kB").parse().ok())
            })
        })
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let fs = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg("/")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu": cpu,
        "memMiB": mem_kib / 1024,
        "kernel": kernel,
        "loadavg": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
        "rootFs": fs,
    })
}

/// Stripped sizes of the binaries measured, and of the shipped builds when they exist (`target/dist/plexus`,
/// `target/dist-cni/plexus-cni`, from examples/image/build.sh or the cargo commands it runs).
fn binary_sizes(o: &Opts) -> Value {
    let stripped = |bin: &Path| -> Option<u64> {
        let tmp = o.work.join("stripped");
        std::fs::create_dir_all(&o.work).ok()?;
        let ok = std::process::Command::new("strip")
            .arg("-o")
            .arg(&tmp)
            .arg(bin)
            .status()
            .ok()?
            .success();
        let size = ok.then(|| std::fs::metadata(&tmp).ok().map(|m| m.len()))??;
        let _ = std::fs::remove_file(&tmp);
        Some(size)
    };
    let dist = |rel: &str| -> Option<u64> {
        let p = o.target.join(rel);
        std::fs::metadata(&p).ok().map(|m| m.len())
    };
    json!({
        "releaseStripped": {"plexus": stripped(&o.plexus), "plexusCni": stripped(&o.plexus_cni)},
        "dist": {"plexus": dist("dist/plexus"), "plexusCni": dist("dist-cni/plexus-cni")},
    })
}

fn run(o: &Opts) -> Result<(), String> {
    require_root_and_plugins();
    let plexus_size = std::fs::metadata(&o.plexus).map(|m| m.len()).unwrap_or(0);
    let binaries = binary_sizes(o);
    let started = Instant::now();
    let machine = machine();
    let perf_loops = [Section::PerfLoopNohooks, Section::PerfLoopHooks];
    if let Some(&which) = o.only.iter().find(|s| perf_loops.contains(s)) {
        return perf_loop(o, which == Section::PerfLoopHooks);
    }
    let on = |s: Section| o.only.is_empty() || o.only.contains(&s);
    let startup = section(on(Section::Startup), || startup(o))?;
    let mut cases = Vec::new();
    if on(Section::MatrixNoop) {
        cases.extend(matrix(o, Delegates::Noop)?);
    }
    if on(Section::MatrixReal) {
        cases.extend(matrix(o, Delegates::Real)?);
    }
    let scaling = section(on(Section::Scaling), || Ok(json!(scaling(o)?)))?;
    let concurrency = section(on(Section::Concurrency), || Ok(json!(concurrency(o)?)))?;
    let hammer = section(on(Section::Hammer), || hammer(o))?;
    let daemon = section(on(Section::Daemon), || daemon::daemon(o))?;
    let density = section(on(Section::Density), || density::density(o, &o.density))?;
    // A failure here is reported, not fatal: the run's other sections stand.
    let density_large = section(on(Section::DensityLarge), || {
        Ok(density::density(o, &o.density_large).unwrap_or_else(|e| {
            log(&format!("density-large: {e}"));
            json!({"failed": e})
        }))
    })?;
    let hook_memory = section(on(Section::HookMemory), || hook_memory::hook_memory(o))?;
    let languages = section(on(Section::Languages), || languages::languages(o))?;
    let profile = section(on(Section::Profile), || Ok(profile(o)))?;
    let results = json!({
        "generatedAt": SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        "runs": o.runs,
        "machine": machine,
        "plexusBinaryBytes": plexus_size,
        "binaries": binaries,
        "workDir": o.work,
        "startup": startup,
        "cases": cases,
        "scaling": scaling,
        "concurrency": concurrency,
        "hammer": hammer,
        "daemon": daemon,
        "density": density,
        "densityLarge": density_large,
        "hookMemory": hook_memory,
        "languages": languages,
        "profile": profile,
        "benchSeconds": started.elapsed().as_secs_f64(),
        "loadavgEnd": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
    });
    write_results(o, &results)?;
    log(&format!(
        "wrote {} in {:.0}s",
        o.out.display(),
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// A section's results when it is `on` (run by `run`), null when it is not.
fn section(on: bool, run: impl FnOnce() -> Result<Value, String>) -> Result<Value, String> {
    if on {
        run()
    } else {
        Ok(Value::Null)
    }
}

/// Writes `results` to `--out`, then removes the work directory unless `PLEXUS_BENCH_KEEP` is set.
fn write_results(o: &Opts, results: &Value) -> Result<(), String> {
    if let Some(dir) = o.out.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    }
    std::fs::write(
        &o.out,
        serde_json::to_vec_pretty(results).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("write {}: {e}", o.out.display()))?;
    if std::env::var_os("PLEXUS_BENCH_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&o.work);
    }
    Ok(())
}
