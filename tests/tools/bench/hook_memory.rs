//! What hooks cost the node daemon in memory: two daemons side by side on one real kube-apiserver, with the same
//! flags (trusted key, registry), one on a node that three NetworkHooks select (a policy, a resolver and a status
//! hook, pulled from a real registry, signature-checked, compiled and probed as in production) and one on a node
//! they do not select. Both are sampled over the same seconds once the first runs all three; the rounds start
//! fresh daemons. The same again with three hooks written in Python and three in TypeScript, each set on a node of
//! its own.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use plexus_tests::registry::{key_pair, Registry};
use serde_json::{json, Value};

use crate::daemon::{bench_api, Daemon};
use crate::{log, proc, stats, world, Opts};

const BARE: &str = "hooks-none";
const HOOKED: &str = "hooks-three";
const LABEL: &str = "bench.plexus.dev/hooks";
/// Samples per round, one every half second, after the settle time.
const SAMPLES: usize = 20;
const SETTLE: Duration = Duration::from_secs(5);
const ROUNDS: usize = 3;

/// `plexus hook push` of a guest, signed with `key`: its pinned reference.
fn push(o: &Opts, registry: &Registry, key: &Path, guest: &str) -> Result<String, String> {
    let what = format!("plexus hook push {guest}");
    let v = proc::json_answer(
        Command::new(&o.plexus)
            .args(["hook", "push"])
            .arg(world::guest(&o.target, guest))
            .arg(format!("{}/vendor/{guest}:v1", registry.addr))
            .args(["--insecure-registry", &registry.addr, "--key"])
            .arg(key),
        &what,
    )?;
    v["reference"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("{what} printed no reference: {v}"))
}

/// Resident memory of a process, KiB: total, anonymous, file-backed.
fn resident(pid: u32) -> [f64; 3] {
    ["VmRSS:", "RssAnon:", "RssFile:"].map(|f| proc::status_kib(pid, f) as f64)
}

pub fn hook_memory(o: &Opts) -> Result<Value, String> {
    let root = o.work.join("hook-memory");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).map_err(|e| format!("create {}: {e}", root.display()))?;
    let api = bench_api(false);
    let registry = Registry::start();
    let (private, public) = key_pair(&root, "vendor");
    api.create(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": BARE}}));
    let mut sets = Vec::new();
    for (language, hooks) in world::hook_sets() {
        let hooked = format!("{HOOKED}-{}", language.to_ascii_lowercase());
        api.create(&json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": hooked, "labels": {LABEL: language.to_ascii_lowercase()}}}));
        for (name, guest, kind, settings) in &hooks {
            let module = push(o, &registry, &private, guest)?;
            api.create(
                &json!({"apiVersion": "plexus.dev/v1alpha1", "kind": "NetworkHook",
                "metadata": {"name": name},
                "spec": {"kind": kind, "module": module, "settings": settings,
                         "nodeSelector": {"matchLabels": {LABEL: language.to_ascii_lowercase()}}}}),
            );
        }
        let mut rounds = Vec::new();
        for round in 0..ROUNDS {
            rounds.push(measure_round(
                o, &api, &registry, &public, &root, &hooked, round,
            )?);
        }
        // Per round, [no hooks, three hooks] × [total, anonymous, file-backed].
        let of = |daemon: usize, which: usize| -> Vec<f64> {
            rounds.iter().map(|r| r[daemon][which]).collect()
        };
        let delta = |which: usize| -> Vec<f64> {
            rounds.iter().map(|r| r[1][which] - r[0][which]).collect()
        };
        sets.push(json!({
            "language": language,
            "hooks": hooks.iter().map(|h| json!({"name": h.0, "guest": h.1, "kind": h.2})).collect::<Vec<_>>(),
            "rounds": rounds.iter().map(|[none, three]| json!({"none": {"kib": none}, "three": {"kib": three}}))
                .collect::<Vec<_>>(),
            "noneRssKiB": stats::median_of(of(0, 0)),
            "threeRssKiB": stats::median_of(of(1, 0)),
            "deltaKiB": stats::median_of(delta(0)),
            "anonDeltaKiB": stats::median_of(delta(1)),
        }));
    }
    // The Rust set's figures at the top (as before the other languages were measured), every set under `sets`.
    let mut result = sets[0].clone();
    result["sets"] = json!(sets);
    Ok(result)
}

/// One round: both daemons started fresh, sampled together once the hooked one runs its three hooks.
fn measure_round(
    o: &Opts,
    api: &plexus_tests::kubeapi::KubeApiServer,
    registry: &Registry,
    key: &Path,
    root: &Path,
    hooked_node: &str,
    round: usize,
) -> Result<[[f64; 3]; 2], String> {
    let start = |node: &str| -> Result<Daemon, String> {
        let dir = root.join(format!("{node}-{round}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let kubeconfig = dir.join("kubeconfig");
        api.write_kubeconfig(
            &kubeconfig,
            &api.node_bound_token("kube-system", "plexus", node),
        );
        let cache = dir.join("cache");
        let extra = [
            "--cache-dir".as_ref(),
            cache.as_os_str(),
            "--hook-key".as_ref(),
            key.as_os_str(),
            "--insecure-registry".as_ref(),
            registry.addr.as_ref(),
            "--metrics-bind-address".as_ref(),
            "0".as_ref(),
        ];
        Daemon::start_on(
            &o.plexus,
            node,
            &kubeconfig,
            &dir.join("daemon.sock"),
            &dir.join("daemon.log"),
            &extra,
        )
    };
    let bare = start(BARE)?;
    let hooked = start(hooked_node)?;
    let limit = Duration::from_secs(120);
    hooked.wait("three hooks active", limit, |h| {
        h.hooks.len() == 3 && h.hooks.iter().all(|x| x.active)
    })?;
    bare.wait("its agent knowing that no hook selects it", limit, |h| {
        h.hook_agent_waiting.is_none() && h.hooks.is_empty()
    })?;
    std::thread::sleep(SETTLE);
    let mut samples = [Vec::new(), Vec::new()];
    for _ in 0..SAMPLES {
        for (d, s) in [&bare, &hooked].iter().zip(samples.iter_mut()) {
            s.push(resident(d.pid()));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let [none, three] =
        samples.map(|s: Vec<[f64; 3]>| [0, 1, 2].map(|i| stats::median_of(s.iter().map(|x| x[i]))));
    log(&format!(
        "hook-memory: {hooked_node}: round {round}: daemon RSS {:.1} MiB with no hooks, {:.1} MiB with three",
        none[0] / 1024.0,
        three[0] / 1024.0
    ));
    Ok([none, three])
}
