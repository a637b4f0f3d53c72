//! plexus-scale: what nodes cost the cluster around them, measured against the real kube-apiserver and etcd.
//!
//! Not a test. Run by `tests/scale.sh`, which writes `docs/scale.md` from what this prints. For each N it runs N
//! node agents (N `plexus daemon` processes with their own node names, directories and sockets) on one hook and
//! measures: the bytes of every plexus.dev object, the watch events and bytes one node receives during a rollout
//! of the hook, the API requests per node per minute at rest and during the rollout, the daemons' memory. The
//! "before" rows play the writes the agents of the previous version sent (one Active entry per node in the
//! NetworkHook's `status.nodes`, each by server-side apply under the node's field manager) on a second hook, with
//! a watch on it, as the issue that asked for this measured them.
//!
//! Usage: `plexus-scale [N...]` (default 1 10 30).

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use plexus_tests::deploy_manifest;
use plexus_tests::kubeapi::KubeApiServer;
use plexus_tests::plexus::{guest_wasm, plexus_bin, NodeDaemon, Sandbox};
use plexus_tests::registry::{key_pair, Registry};
use serde_json::{json, Value};

const HOOKS: &str = "/apis/plexus.dev/v1alpha1/networkhooks";
const REPORTS: &str = "/apis/plexus.dev/v1alpha1/nodehookstatuses";
/// How long the agents are watched at rest.
const REST: Duration = Duration::from_secs(60);
const AGENT: &str = "system:serviceaccount:kube-system:plexus";

fn main() -> ExitCode {
    let ns: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let ns = if ns.is_empty() { vec![1, 10, 30] } else { ns };
    let mut rows = Vec::new();
    for n in ns {
        eprintln!("plexus-scale: {n} node(s)");
        rows.push(measure(n));
    }
    println!("{}", serde_json::to_string_pretty(&rows).unwrap());
    ExitCode::SUCCESS
}

struct Cluster {
    api: KubeApiServer,
    sb: Sandbox,
    registry: Registry,
    keys: (PathBuf, PathBuf),
}

impl Cluster {
    fn new() -> Cluster {
        let api = KubeApiServer::start(&[], &[]);
        api.apply_file(&deploy_manifest("crds.yaml"));
        api.apply_file(&deploy_manifest("networkhooks.yaml"));
        api.apply_file(&deploy_manifest("rbac.yaml"));
        api.wait_for(HOOKS);
        api.wait_for(REPORTS);
        let sb = Sandbox::new();
        api.write_kubeconfig(&sb.path("daemon.kubeconfig"), "plexus-token");
        let keys_dir = sb.path("keys");
        std::fs::create_dir_all(&keys_dir).unwrap();
        let keys = key_pair(&keys_dir, "vendor");
        Cluster {
            api,
            sb,
            registry: Registry::start(),
            keys,
        }
    }

    /// `plexus hook push` of a guest, signed: the pinned reference. With `release`, a new release of the same
    /// guest: its component with a custom section naming the release appended (other bytes, the same code).
    fn push(&self, guest: &str, tag: &str, release: Option<&str>) -> String {
        let mut wasm = guest_wasm(guest);
        if let Some(name) = release {
            let mut bytes = std::fs::read(&wasm).unwrap();
            // A custom section (id 0): its size (LEB128), then the name as a vector of bytes, then no payload.
            let mut body = vec![name.len() as u8];
            body.extend_from_slice(name.as_bytes());
            bytes.push(0);
            let mut size = body.len();
            loop {
                let byte = (size & 0x7f) as u8;
                size >>= 7;
                bytes.push(if size == 0 { byte } else { byte | 0x80 });
                if size == 0 {
                    break;
                }
            }
            bytes.extend_from_slice(&body);
            wasm = self.sb.path(&format!("{guest}-{name}.wasm"));
            std::fs::write(&wasm, bytes).unwrap();
        }
        let out = Command::new(plexus_bin())
            .args(["hook", "push"])
            .arg(&wasm)
            .arg(format!("{}/vendor/labels:{tag}", self.registry.addr))
            .args(["--insecure-registry", &self.registry.addr, "--key"])
            .arg(&self.keys.0)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["reference"].as_str().unwrap().to_string()
    }

    fn get(&self, path: &str) -> (usize, Value) {
        let (code, text) = self.api.request("GET", path, None).unwrap();
        assert_eq!(code, 200, "GET {path}: {text}");
        (text.len(), serde_json::from_str(&text).unwrap())
    }

    fn start(&self, node: &str) -> NodeDaemon {
        self.api
            .create(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}));
        let dir = self.sb.path(node);
        let key = self.keys.1.display().to_string();
        NodeDaemon::start(
            node,
            &self.sb.path("daemon.kubeconfig"),
            &dir.join("run/daemon.sock"),
            &dir.join("cache"),
            &dir.join("daemon.log"),
            &[
                "--hook-key",
                &key,
                "--insecure-registry",
                &self.registry.addr,
            ],
        )
    }

    /// Waits until every node reports `digest` running.
    fn wait_running(&self, nodes: &[String], digest: &str) -> Duration {
        let start = Instant::now();
        let running = |node: &String| {
            let (code, text) = self
                .api
                .request("GET", &format!("{REPORTS}/{node}"), None)
                .unwrap();
            // Compact, whatever layout the server chose (it pretty-prints for curl).
            let text = serde_json::from_str::<Value>(&text).map_or(text, |v| v.to_string());
            code == 200 && text.contains(digest) && text.contains("\"active\":1")
        };
        while !nodes.iter().all(running) {
            assert!(
                start.elapsed() < Duration::from_secs(300),
                "not every node runs {digest} within 300 s; {}'s report: {:?}; its log:\n{}",
                nodes[0],
                self.api
                    .request("GET", &format!("{REPORTS}/{}", nodes[0]), None),
                plexus_tests::tail(&self.sb.path(&nodes[0]).join("daemon.log"), 30)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
        start.elapsed()
    }

    /// Requests the agents sent (audit log, each once) received within `[from, to]`.
    fn agent_requests(&self, from: Timestamp, to: Timestamp) -> usize {
        let mut ids = std::collections::BTreeSet::new();
        for e in self.api.audit_all() {
            let at: Option<Timestamp> = e["requestReceivedTimestamp"]
                .as_str()
                .and_then(|t| t.parse().ok());
            if e["user"]["username"] == AGENT && at.is_some_and(|at| at >= from && at <= to) {
                ids.insert(e["auditID"].as_str().unwrap_or_default().to_string());
            }
        }
        ids.len()
    }
}

use k8s_openapi::jiff::Timestamp;

fn now() -> Timestamp {
    Timestamp::now()
}

/// Resident memory of a process, KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn measure(n: usize) -> Value {
    let c = Cluster::new();
    // The rollout goes to another artifact: a new release of the same status hook.
    let v1 = c.push("status-labels", "v1", None);
    let v2 = c.push("status-labels", "v2", Some("release-2"));
    let digest = |r: &str| r.split_once('@').unwrap().1.to_string();
    c.api.create(
        &json!({"apiVersion": "plexus.dev/v1alpha1", "kind": "NetworkHook",
        "metadata": {"name": "labels"},
        "spec": {"kind": "status", "module": v1, "settings": {"labels": ["app"]}}}),
    );
    let nodes: Vec<String> = (1..=n).map(|i| format!("node{i}")).collect();
    let daemons: Vec<NodeDaemon> = nodes.iter().map(|node| c.start(node)).collect();
    let settle = c.wait_running(&nodes, &digest(&v1));

    // At rest.
    let rest_from = now();
    std::thread::sleep(REST);
    let rest = c.agent_requests(rest_from, now());

    // A rollout of one hook, as one node's agent sees it (its watch on NetworkHooks).
    let (_, hook) = c.get(&format!("{HOOKS}/labels"));
    let watch = c.api.watch(
        HOOKS,
        hook["metadata"]["resourceVersion"].as_str().unwrap(),
        900,
    );
    let roll_from = now();
    c.api.must(
        "PATCH",
        &format!("{HOOKS}/labels"),
        Some(&json!({"spec": {"module": v2}})),
    );
    let rollout = c.wait_running(&nodes, &digest(&v2));
    std::thread::sleep(Duration::from_secs(1));
    let roll_requests = c.agent_requests(roll_from, now());
    let (events, watch_bytes) = watch.events();

    let (hook_bytes, _) = c.get(&format!("{HOOKS}/labels"));
    let (report_bytes, _) = c.get(&format!("{REPORTS}/node1"));
    let (reports_bytes, _) = c.get(REPORTS);
    let mut rss: Vec<u64> = daemons.iter().map(|d| rss_kib(d.child.id())).collect();
    rss.sort_unstable();
    drop(daemons);

    // Before: the previous version's writes, one Active entry per node in status.nodes, on another hook.
    c.api.create(
        &json!({"apiVersion": "plexus.dev/v1alpha1", "kind": "NetworkHook",
        "metadata": {"name": "legacy"},
        "spec": {"kind": "status", "module": v1, "settings": {"labels": ["app"]}}}),
    );
    let (_, legacy) = c.get(&format!("{HOOKS}/legacy"));
    let watch = c.api.watch(
        HOOKS,
        legacy["metadata"]["resourceVersion"].as_str().unwrap(),
        900,
    );
    for node in &nodes {
        let entry = json!({"node": node, "active": true, "reason": "Active",
            "message": format!("module {} is active", digest(&v1)), "digest": digest(&v1),
            "observedGeneration": 1});
        c.api.apply_as(
            &format!("{HOOKS}/legacy/status"),
            &format!("plexus-agent-{node}"),
            &json!({"apiVersion": "plexus.dev/v1alpha1", "kind": "NetworkHook",
                "metadata": {"name": "legacy"}, "status": {"nodes": [entry]}}),
        );
    }
    std::thread::sleep(Duration::from_secs(1));
    let (before_events, before_bytes) = watch.events();
    let (before_hook_bytes, _) = c.get(&format!("{HOOKS}/legacy"));

    json!({
        "nodes": n,
        "settleSeconds": settle.as_secs_f64(),
        "after": {
            "hookBytes": hook_bytes,
            "nodeReportBytes": report_bytes,
            "allReportsBytes": reports_bytes,
            "rolloutSeconds": rollout.as_secs_f64(),
            "rolloutWatchEvents": events.len(),
            "rolloutWatchBytes": watch_bytes,
            "requestsPerNodePerMinuteAtRest": rest as f64 / n as f64 * 60.0 / REST.as_secs_f64(),
            "requestsPerNodeDuringRollout": roll_requests as f64 / n as f64,
            "daemonRssKibMedian": rss[rss.len() / 2],
            "daemonRssKibMax": rss[rss.len() - 1],
        },
        "before": {
            "hookBytes": before_hook_bytes,
            "rolloutWatchEvents": before_events.len(),
            "rolloutWatchBytes": before_bytes,
        },
    })
}
