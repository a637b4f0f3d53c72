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
//! Then the DRA row: 30 daemons (the largest N) among thousands of allocated ResourceClaims, a few on each daemon's
//! node (each used by a pod there) and the rest on other nodes: what each daemon holds, the requests it makes and
//! the bytes it receives for claims, against what the previous version's watch of every claim received.
//!
//! Its options: `plexus-scale --help` (default N: 1 10 30, and 3,000 claims; `--dra-claims 0` skips the DRA row).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use plexus_tests::deploy_manifest;
use plexus_tests::kubeapi::KubeApiServer;
use plexus_tests::plexus::{guest_wasm, NodeDaemon, Sandbox};
use plexus_tests::registry::{key_pair, Registry};
use serde_json::{json, Value};

const HOOKS: &str = "/apis/plexus.dev/v1alpha1/networkhooks";
const REPORTS: &str = "/apis/plexus.dev/v1alpha1/nodehookstatuses";
/// How long the agents are watched at rest.
const REST: Duration = Duration::from_secs(60);
const AGENT: &str = "system:serviceaccount:kube-system:plexus";

/// What node agents cost a real API server and etcd, as JSON (as root; run by tests/scale.sh)
#[derive(Parser)]
#[command(name = "plexus-scale")]
struct Args {
    /// Numbers of node agents to measure, one row each.
    #[arg(value_name = "N", default_values_t = [1, 10, 30])]
    nodes: Vec<usize>,
    /// ResourceClaims in the DRA row, which runs as many agents as the largest N (0 skips the row).
    #[arg(long, value_name = "C", default_value_t = 3000)]
    dra_claims: usize,
}

fn main() -> ExitCode {
    let Args {
        nodes: ns,
        dra_claims: claims,
    } = Args::parse();
    let mut rows = Vec::new();
    for &n in &ns {
        eprintln!("plexus-scale: {n} node(s)");
        rows.push(measure(n));
    }
    let dra = (claims > 0).then(|| {
        let n = ns.iter().copied().max().unwrap_or(30);
        eprintln!("plexus-scale: DRA, {n} node(s), {claims} claims");
        measure_dra(n, claims)
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({"hooks": rows, "dra": dra})).unwrap()
    );
    ExitCode::SUCCESS
}

/// Claims each measured node's pods use.
const CLAIMS_PER_NODE: usize = 3;
const DRA_NS: &str = "team";

/// An allocated claim `name` of [`DRA_NS`] on `node`, reserved for pod `pod`; its size as the API server sends it
/// to a client that asks for JSON (compact).
fn allocated_claim(api: &KubeApiServer, name: &str, node: &str, pod: &str) -> usize {
    api.create(&json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": DRA_NS},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "nics"}}]}}
    }));
    let results = vec![
        json!({"request": "nic", "driver": "sriov.example.com", "pool": node, "device": "vf0"}),
    ];
    let claim = api.allocate_claim(DRA_NS, name, results, node, (pod, &format!("uid-{pod}")));
    claim.to_string().len()
}

/// The DRA row: `n` daemons, each node with [`CLAIMS_PER_NODE`] pods using a claim of their own, among `total`
/// claims in all (the rest on 1,000 other nodes).
fn measure_dra(n: usize, total: usize) -> Value {
    let c = Cluster::new();
    c.api.namespace(DRA_NS);
    let nodes: Vec<String> = (1..=n).map(|i| format!("node{i}")).collect();
    // Every claim created is an event of the previous version's watch of all claims, on every node.
    let (_, list) = c.get("/apis/resource.k8s.io/v1/resourceclaims?limit=1");
    let watch = c.api.watch(
        "/apis/resource.k8s.io/v1/resourceclaims",
        list["metadata"]["resourceVersion"].as_str().unwrap(),
        1800,
    );
    let others = total.saturating_sub(n * CLAIMS_PER_NODE);
    let threads = 4;
    let mut own_bytes = 0;
    std::thread::scope(|scope| {
        let api = &c.api;
        for t in 0..threads {
            scope.spawn(move || {
                for i in (t..others).step_by(threads) {
                    allocated_claim(
                        api,
                        &format!("far-{i}"),
                        &format!("far-node-{}", i % 1000),
                        &format!("far-{i}"),
                    );
                }
            });
        }
        for node in &nodes {
            for k in 0..CLAIMS_PER_NODE {
                let pod = format!("{node}-pod-{k}");
                let claim = format!("{pod}-nic");
                own_bytes += allocated_claim(api, &claim, node, &pod);
                api.create(&json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod, "namespace": DRA_NS},
                    "spec": {"nodeName": node, "automountServiceAccountToken": false,
                             "resourceClaims": [{"name": "nic", "resourceClaimName": claim}],
                             "containers": [{"name": "c", "image": "pause"}]}
                }));
            }
        }
    });
    std::thread::sleep(Duration::from_secs(1));
    let (before_events, before_watch_bytes) = watch.events();
    // What a node of the previous version listed at its start: every claim of the cluster.
    let (_, all) = c.get("/apis/resource.k8s.io/v1/resourceclaims");
    let listed_bytes = all.to_string().len();
    let listed = all["items"].as_array().map_or(0, Vec::len);

    let from = now();
    let daemons: Vec<NodeDaemon> = nodes.iter().map(|node| c.start(node)).collect();
    let mut held = Vec::new();
    for d in &daemons {
        let h = d.wait("the node's pods' claims read", |h| {
            h.cache.claims == CLAIMS_PER_NODE
        });
        held.push((h.cache.claims, h.cache.claim_reads));
    }
    std::thread::sleep(Duration::from_secs(2));
    let mut claim_requests = std::collections::BTreeMap::<String, usize>::new();
    for e in c.api.audit_entries() {
        let uri = e["requestURI"].as_str().unwrap_or_default();
        let at: Option<Timestamp> = e["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse().ok());
        if e["user"]["username"] == AGENT
            && uri.contains("/resourceclaims")
            && at.is_some_and(|at| at >= from)
        {
            let verb = e["verb"].as_str().unwrap_or_default().to_string();
            *claim_requests.entry(verb).or_default() += 1;
        }
    }
    let mut rss: Vec<u64> = daemons.iter().map(|d| rss_kib(d.child.id())).collect();
    rss.sort_unstable();
    drop(daemons);
    json!({
        "nodes": n,
        "claims": listed,
        "claimsPerNode": CLAIMS_PER_NODE,
        "after": {
            "heldPerNodeMax": held.iter().map(|h| h.0).max(),
            "claimReadsPerNodeMax": held.iter().map(|h| h.1).max(),
            "claimRequestsByVerb": claim_requests,
            "bytesPerNode": own_bytes / n,
            "daemonRssKibMedian": rss[rss.len() / 2],
        },
        "before": {
            "heldPerNode": listed,
            "listBytesPerNode": listed_bytes,
            "watchEventsPerNode": before_events.len(),
            "watchBytesPerNode": before_watch_bytes,
        },
    })
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
        self.registry
            .push_hook(&wasm, &format!("vendor/labels:{tag}"), Some(&self.keys.0))
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
