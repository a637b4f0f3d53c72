//! Hook distribution against real parts: modules pushed by `plexus hook push` to a real OCI registry (Debian's
//! docker-registry on loopback), NetworkHook resources in a real kube-apiserver with the project's CRD and RBAC,
//! and the node agent in `plexus daemon` pulling, verifying (keys made by openssl), compiling and publishing the
//! node's hook set, which real plexus ADDs then run. Also the swap guarantee: ADDs racing set publications run
//! one whole set, never a mix.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use plexus_cni::hooks::HookSet;
use plexus_hooks::{HookKind, HookSpec};
use plexus_tests::deploy_manifest;
use plexus_tests::kubeapi::KubeApiServer;
use plexus_tests::plexus::{
    example_builds, guest_wasm, plexus_bin, plexus_cni_bin, NodeDaemon, Sandbox,
};
use plexus_tests::registry::{key_pair, Registry};
use serde_json::{json, Value};
use sha2::Digest as _;

const NODE: &str = "node1";
const HOOKS: &str = "/apis/plexus.dev/v1alpha1/networkhooks";
const NODE_REPORTS: &str = "/apis/plexus.dev/v1alpha1/nodehookstatuses";
const LABELS_KEY: &str = "io.plexus.pod-labels";

struct World {
    api: KubeApiServer,
    sb: Sandbox,
    registry: Registry,
    /// The operator's trusted key pair, and another one nobody trusts.
    trusted: (PathBuf, PathBuf),
    untrusted: (PathBuf, PathBuf),
}

/// A real API server with the CRDs (NADs and NetworkHooks) and RBAC, Node `node1` without labels, a registry,
/// two key pairs, and a sandbox whose FileCluster has pod `team-a/web` (labels app, tier, zone).
fn world() -> World {
    let api = KubeApiServer::start(&[], &[]);
    api.apply_file(&deploy_manifest("crds.yaml"));
    api.apply_file(&deploy_manifest("networkhooks.yaml"));
    api.apply_file(&deploy_manifest("rbac.yaml"));
    api.apply_node_authority();
    api.wait_for("/apis/plexus.dev/v1alpha1/networkhooks");
    api.create(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    // The daemon's identity as a DaemonSet pod's projected token carries it: bound to its node, so the
    // node-authority policy lets it write its own node's report only.
    let token = api.node_bound_token("kube-system", "plexus", NODE);
    api.write_kubeconfig(&sb.path("daemon.kubeconfig"), &token);
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "web", "namespace": "team-a", "uid": "uid-web",
        "labels": {"app": "web", "tier": "front", "zone": "a"}}});
    sb.manifest("pod-team-a-web.json", &pod.to_string());
    let keys = sb.path("keys");
    std::fs::create_dir_all(&keys).unwrap();
    World {
        api,
        registry: Registry::start(),
        trusted: key_pair(&keys, "trusted"),
        untrusted: key_pair(&keys, "untrusted"),
        sb,
    }
}

impl World {
    /// `plexus hook push` of a guest to `repo:tag`, signed with `key` when given; the pinned reference.
    fn push(&self, guest: &str, repo_tag: &str, key: Option<&Path>) -> String {
        self.push_file(&guest_wasm(guest), repo_tag, key)
    }

    fn push_file(&self, file: &Path, repo_tag: &str, key: Option<&Path>) -> String {
        self.registry.push_hook(file, repo_tag, key)
    }

    /// `plexus hook verify REFERENCE --key PUB`: (success, stdout JSON or stderr).
    fn verify(&self, reference: &str, public: &Path) -> (bool, String) {
        let out = Command::new(plexus_bin())
            .args([
                "hook",
                "verify",
                reference,
                "--insecure-registry",
                &self.registry.addr,
            ])
            .arg("--key")
            .arg(public)
            .output()
            .unwrap();
        let text = if out.status.success() {
            String::from_utf8_lossy(&out.stdout).into_owned()
        } else {
            String::from_utf8_lossy(&out.stderr).into_owned()
        };
        (out.status.success(), text)
    }

    fn daemon(&self, extra: &[&str]) -> NodeDaemon {
        self.daemon_keyed(&self.trusted.1, extra)
    }

    /// A daemon trusting `keys` (a key file, or a directory of them).
    fn daemon_keyed(&self, keys: &Path, extra: &[&str]) -> NodeDaemon {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let log = self.sb.path(&format!(
            "daemon-{}.log",
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        let keys = keys.display().to_string();
        let mut args = vec![
            "--hook-key",
            keys.as_str(),
            "--insecure-registry",
            &self.registry.addr,
        ];
        args.extend_from_slice(extra);
        NodeDaemon::start(
            NODE,
            &self.sb.path("daemon.kubeconfig"),
            &self.sb.path("run/daemon.sock"),
            &self.sb.path("cache"),
            &log,
            &args,
        )
    }

    /// Creates NetworkHook `name`: a status hook adding the pod labels `labels`, plus `extra` spec fields.
    fn hook(&self, name: &str, module: &str, labels: &[&str], extra: Value) {
        let mut spec = json!({"kind": "status", "module": module, "settings": {"labels": labels}});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        self.api.create(&json!({
            "apiVersion": "plexus.dev/v1alpha1", "kind": "NetworkHook",
            "metadata": {"name": name}, "spec": spec,
        }));
    }

    fn patch(&self, path: &str, body: Value) {
        self.api.must("PATCH", path, Some(&body));
    }

    fn set(&self) -> HookSet {
        HookSet::read(&self.sb.path("cache"))
            .unwrap()
            .unwrap_or_default()
    }

    /// `plexus status --json` of the daemon whose socket is in the sandbox's `run_dir` and cache in `cache_dir`.
    fn plexus_status(&self, run_dir: &str, cache_dir: &str) -> std::process::Output {
        Command::new(plexus_bin())
            .args(["status", "--json", "--socket"])
            .arg(self.sb.path(&format!("{run_dir}/daemon.sock")))
            .arg("--cache-dir")
            .arg(self.sb.path(cache_dir))
            .output()
            .unwrap()
    }

    /// The names of the set's entries that run a module (not the unready ones).
    fn set_names(&self) -> Vec<String> {
        self.set()
            .hooks
            .into_iter()
            .filter(|h| h.unready.is_none())
            .map(|h| h.name)
            .collect()
    }

    /// The set's unready entries: name and why.
    fn unready(&self) -> Vec<(String, String)> {
        self.set()
            .hooks
            .into_iter()
            .filter_map(|h| Some((h.name, h.unready?)))
            .collect()
    }

    /// An ADD of `team-a/web` that fails: its error message. Nothing of it stays (no attachment entry, no
    /// network-status written); the DEL the runtime would send follows.
    #[track_caller]
    fn refused_add(&self, id: &str) -> String {
        let conf = self.sb.conf(json!({"clusterHooks": true}));
        let args = Sandbox::pod_args("team-a", "web");
        let run = self.sb.run("ADD", id, &args, &conf);
        assert!(!run.success, "the ADD succeeded: {}", run.stdout);
        let kept: Vec<_> = std::fs::read_dir(self.sb.path("cache/attachments"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(id))
            .map(|e| e.path())
            .collect();
        assert!(kept.is_empty(), "attachment cache entries stayed: {kept:?}");
        self.sb.run("DEL", id, &args, &conf).ok();
        run.msg()
    }

    /// The node's own report (its NodeHookStatus), if it has written one.
    fn node_report(&self) -> Option<Value> {
        let (code, text) = self
            .api
            .request("GET", &format!("{NODE_REPORTS}/{NODE}"), None)
            .unwrap();
        (code == 200).then(|| serde_json::from_str(&text).unwrap())
    }

    /// What the node reports of `hook`, in its own NodeHookStatus.
    fn node_status(&self, hook: &str) -> Option<Value> {
        self.node_report()?["status"]["hooks"]
            .as_array()?
            .iter()
            .find(|h| h["name"] == hook)
            .cloned()
    }

    /// The nodes with an entry in the hook's own `status.nodes` (what agents before NodeHookStatus wrote).
    fn nodes_in_hook(&self, hook: &str) -> Vec<String> {
        let h = self.api.must("GET", &format!("{HOOKS}/{hook}"), None);
        h["status"]["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n["node"].as_str().map(str::to_string))
            .collect()
    }

    /// Waits (at most 60 s) until `ok`.
    #[track_caller]
    fn wait(&self, daemon: &NodeDaemon, what: &str, ok: impl Fn(&World) -> bool) {
        self.wait_doing(daemon, what, ok, || {
            std::thread::sleep(Duration::from_millis(100))
        });
    }

    /// Waits (at most 60 s) until `ok`, doing `step` between two checks.
    #[track_caller]
    fn wait_doing(
        &self,
        daemon: &NodeDaemon,
        what: &str,
        ok: impl Fn(&World) -> bool,
        mut step: impl FnMut(),
    ) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ok(self) {
            assert!(
                Instant::now() < deadline,
                "{what} not reached within 60 s; set {:?}; daemon log:\n{}",
                self.set(),
                daemon.log_text()
            );
            step();
        }
    }

    /// ADD then DEL of `team-a/web`; whether the ADD succeeded.
    fn add_del(&self, id: &str) -> bool {
        let conf = self.sb.conf(json!({"clusterHooks": true}));
        let args = Sandbox::pod_args("team-a", "web");
        let ok = self.sb.run("ADD", id, &args, &conf).success;
        self.sb.run("DEL", id, &args, &conf).ok();
        ok
    }

    /// Waits (at most 60 s) until `ok`, running pods all the while (ADD then DEL); the number of failed ADDs.
    #[track_caller]
    fn wait_adding(&self, daemon: &NodeDaemon, what: &str, ok: impl Fn(&World) -> bool) -> usize {
        let (mut n, mut failed) = (0, 0);
        self.wait_doing(daemon, what, ok, || {
            n += 1;
            if !self.add_del(&format!("busy{n}")) {
                failed += 1;
            }
        });
        failed
    }

    /// ADD then DEL of `team-a/web`: the pod labels the status hooks added to its network-status.
    fn add_labels(&self, id: &str) -> Value {
        let conf = self.sb.conf(json!({"clusterHooks": true}));
        let args = Sandbox::pod_args("team-a", "web");
        self.sb.run("ADD", id, &args, &conf).ok();
        let status = self.sb.status("team-a", "web").expect("status written");
        self.sb.run("DEL", id, &args, &conf).ok();
        status[0].get(LABELS_KEY).cloned().unwrap_or(Value::Null)
    }
}

#[test]
fn a_signed_module_is_pulled_verified_compiled_and_run_then_removed_with_its_resource() {
    let [rust, _] = example_builds("status-labels");
    pulled_verified_compiled_and_run_then_removed(&rust);
}

/// The same path for the Python build of the example: an 18 MB module with an interpreter, which the node compiles
/// within its default limits (`--hook-compile-memory-mib`) and runs as it runs the Rust one.
#[test]
fn a_signed_python_module_is_pulled_verified_compiled_and_run_then_removed_with_its_resource() {
    let [_, python] = example_builds("status-labels");
    pulled_verified_compiled_and_run_then_removed(&python);
}

/// The same path for the TypeScript build of the example: a 12 MB module with a JavaScript engine.
#[test]
fn a_signed_typescript_module_is_pulled_verified_compiled_and_run_then_removed_with_its_resource() {
    pulled_verified_compiled_and_run_then_removed("ts-status-labels");
}

fn pulled_verified_compiled_and_run_then_removed(guest: &str) {
    let mut w = world();
    let reference = w.push(guest, "vendor/labels:v1", Some(&w.trusted.0));
    assert!(reference.contains("@sha256:"), "{reference}");

    // What the agent will check, checked by the vendor's command.
    let (ok, out) = w.verify(&reference, &w.trusted.1);
    assert!(ok, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(
        v["kinds"].as_array().unwrap().contains(&json!("status")),
        "{v}"
    );
    assert!(v["verifiedBy"].is_string());
    let (ok, err) = w.verify(&reference, &w.untrusted.1);
    assert!(
        !ok && err.contains("does not verify with any trusted key"),
        "{err}"
    );

    w.hook(
        "labels",
        &reference,
        &["app", "tier"],
        json!({"namespaces": ["team-a"]}),
    );
    let mut daemon = w.daemon(&[]);
    w.wait(&daemon, "hook active", |w| {
        w.node_status("labels").is_some_and(|s| s["active"] == true)
    });
    let status = w.node_status("labels").unwrap();
    assert_eq!(status["reason"], "Active");
    assert_eq!(
        status["digest"].as_str(),
        reference.split_once('@').map(|(_, d)| d)
    );
    let set = w.set();
    assert_eq!(set.hooks.len(), 1);
    let entry = &set.hooks[0];
    assert!(entry.precompiled && entry.sha256.is_some());
    // `plexus status` lists it: published in the node's set, and Active by the node agent's account.
    let out = w.plexus_status("run", "cache");
    assert!(out.status.success(), "{out:?}");
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    let hooks = s["hooks"].as_array().unwrap();
    assert_eq!(hooks.len(), 1, "{s}");
    assert_eq!(hooks[0]["name"], "networkhook/labels", "{s}");
    assert_eq!(hooks[0]["kind"], "status", "{s}");
    assert_eq!(hooks[0]["published"], true, "{s}");
    assert_eq!(hooks[0]["state"], "Active", "{s}");
    assert_eq!(hooks[0]["digest"].as_str(), entry.sha256.as_deref(), "{s}");
    assert_eq!(entry.namespaces, Some(vec!["team-a".to_string()]));

    // The ADD reads neither the registry nor the component: with the pulled component gone it still runs
    // the hook, from the compiled artifact (a compile would have needed the component).
    w.registry.down();
    std::fs::remove_file(&entry.module).unwrap();
    assert_eq!(w.add_labels("c1"), json!({"app": "web", "tier": "front"}));

    // Deleting the resource removes the hook from the node.
    w.api.must(
        "DELETE",
        "/apis/plexus.dev/v1alpha1/networkhooks/labels",
        None,
    );
    w.wait(&daemon, "hook removed", |w| w.set().hooks.is_empty());
    assert_eq!(w.add_labels("c2"), Value::Null);
    assert!(
        daemon.child.try_wait().unwrap().is_none(),
        "the daemon is running"
    );
    // The node's last hook gone: its report lists none, within seconds, written a handful of times (a write
    // the API server refused would otherwise be sent again and again).
    w.wait(&daemon, "the report empty", |w| {
        w.node_report().is_some_and(|r| {
            r["status"]["active"] == 0
                && r["status"]["hooks"]
                    .as_array()
                    .is_none_or(|hooks| hooks.is_empty())
        })
    });
    std::thread::sleep(Duration::from_secs(3));
    let writes = w
        .api
        .audit_entries()
        .into_iter()
        .filter(|e| {
            e["verb"] == "patch"
                && e["requestURI"]
                    .as_str()
                    .is_some_and(|u| u.contains("nodehookstatuses"))
        })
        .map(|e| e["responseStatus"]["code"].as_i64().unwrap_or_default())
        .collect::<Vec<_>>();
    assert!(
        writes.len() <= 5 && writes.iter().all(|c| (200..300).contains(c)),
        "the node's report writes: {writes:?}; daemon log:\n{}",
        daemon.log_text()
    );
}

/// A node reports in an object of its own (named after it, owned by its Node, naming no other node), never in the
/// NetworkHook every node watches; an agent of this version removes the entry an earlier one wrote there; and an
/// operator reads the cluster-wide view from the per-node objects.
#[test]
fn a_node_reports_in_its_own_object_and_removes_its_entry_of_an_earlier_version_from_the_hook() {
    let mut w = world();
    let reference = w.push("status-labels", "vendor/labels:v1", Some(&w.trusted.0));
    w.hook("labels", &reference, &["app"], json!({}));
    // What agents of the earlier version wrote: each node its entry, under its own field manager.
    for node in [NODE, "node2"] {
        let entry = json!({"node": node, "active": true, "reason": "Active", "message": "old agent",
            "observedGeneration": 1});
        w.api.apply_as(
            &format!("{HOOKS}/labels/status"),
            &format!("plexus-agent-{node}"),
            &json!({"apiVersion": "plexus.dev/v1alpha1", "kind": "NetworkHook",
                "metadata": {"name": "labels"}, "status": {"nodes": [entry]}}),
        );
    }
    assert_eq!(w.nodes_in_hook("labels"), [NODE, "node2"]);

    let daemon = w.daemon(&[]);
    w.wait(&daemon, "active in the node's own object", |w| {
        w.node_status("labels").is_some_and(|s| s["active"] == true)
    });
    w.wait(&daemon, "this node's old entry removed", |w| {
        w.nodes_in_hook("labels") == ["node2"]
    });
    let hook_version =
        w.api.must("GET", &format!("{HOOKS}/labels"), None)["metadata"]["resourceVersion"].clone();

    let report = w.node_report().unwrap();
    let node = w.api.must("GET", &format!("/api/v1/nodes/{NODE}"), None);
    assert_eq!(
        report["metadata"]["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node["metadata"]["uid"]}])
    );
    assert_eq!(
        (&report["status"]["active"], &report["status"]["failing"]),
        (&json!(1), &json!(0))
    );
    let digest = reference.split_once('@').unwrap().1;
    assert_eq!(w.node_status("labels").unwrap()["digest"], digest);
    let text = report.to_string();
    assert!(!text.contains("node2"), "names no other node: {text}");
    assert!(text.len() < 8 << 10, "{} bytes", text.len());

    // The node's later reports change its own object, not the hook: a failure (the registry gone, the module
    // changed) is reported there while the hook's resourceVersion stays.
    w.registry.down();
    let moved = format!(
        "{}@sha256:{}",
        reference.split_once('@').unwrap().0,
        "1".repeat(64)
    );
    w.patch(
        &format!("{HOOKS}/labels"),
        json!({"spec": {"module": moved}}),
    );
    w.wait(&daemon, "the failure reported", |w| {
        w.node_status("labels")
            .is_some_and(|s| s["reason"] == "PullFailed")
    });
    let after = w.api.must("GET", &format!("{HOOKS}/labels"), None);
    assert_ne!(
        after["metadata"]["resourceVersion"], hook_version,
        "the spec changed"
    );
    assert_eq!(
        w.nodes_in_hook("labels"),
        ["node2"],
        "and nothing of this node was written into it"
    );

    // The cluster-wide view, from the per-node objects.
    let admin = w.sb.path("admin.kubeconfig");
    w.api.write_kubeconfig(&admin, "admin-token");
    let status = |json: bool| {
        let mut cmd = Command::new(plexus_bin());
        cmd.args(["hook", "status", "labels", "--kubeconfig"])
            .arg(&admin);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let s: Value = serde_json::from_str(&status(true)).unwrap();
    assert_eq!((&s["nodes"], &s["active"]), (&json!(1), &json!(1)), "{s}");
    assert_eq!(
        s["running"],
        json!([{"key": digest, "nodes": [NODE]}]),
        "{s}"
    );
    assert_eq!(s["failing"][0]["key"], "PullFailed", "{s}");
    assert_eq!(s["failing"][0]["nodes"], json!([NODE]), "{s}");
    assert_eq!(s["generation"], after["metadata"]["generation"], "{s}");
    let text = status(false);
    assert!(
        text.contains("1 node(s) report it: 1 running it, 1 failing")
            && text.contains(&format!("running {digest}: 1 node(s): {NODE}"))
            && text.contains(&format!("PullFailed: 1 node(s): {NODE}")),
        "{text}"
    );
}

/// Twelve nodes, each its own `plexus daemon`, go Active on one hook: the NetworkHook stays the size it was with
/// one node, a watch on NetworkHooks sees (almost) nothing of their reports, and each node's report is a small
/// object of its own that names no other node.
#[test]
fn twelve_nodes_going_active_neither_grow_the_hook_nor_reach_each_other() {
    const NODES: usize = 12;
    let w = world();
    let reference = w.push("status-labels", "vendor/labels:v1", Some(&w.trusted.0));
    w.hook("labels", &reference, &["app"], json!({}));
    let size = || {
        let (code, text) = w
            .api
            .request("GET", &format!("{HOOKS}/labels"), None)
            .unwrap();
        assert_eq!(code, 200);
        (text.len(), serde_json::from_str::<Value>(&text).unwrap())
    };
    let daemons: std::cell::RefCell<Vec<NodeDaemon>> = Default::default();
    let start = |node: &str| {
        // Each node's daemon with its own node-bound token (the Node is created with it).
        let token = w.api.node_bound_token("kube-system", "plexus", node);
        let kubeconfig = w.sb.path(&format!("{node}.kubeconfig"));
        w.api.write_kubeconfig(&kubeconfig, &token);
        let dir = w.sb.path(node);
        let keys = w.trusted.1.display().to_string();
        daemons.borrow_mut().push(NodeDaemon::start(
            node,
            &kubeconfig,
            &dir.join("run/daemon.sock"),
            &dir.join("cache"),
            &dir.join("daemon.log"),
            &["--hook-key", &keys, "--insecure-registry", &w.registry.addr],
        ));
    };
    let active = |node: &str| {
        let (code, text) = w
            .api
            .request("GET", &format!("{NODE_REPORTS}/{node}"), None)
            .unwrap();
        code == 200 && serde_json::from_str::<Value>(&text).unwrap()["status"]["active"] == 1
    };
    let wait_active = |nodes: &[String]| {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !nodes.iter().all(|n| active(n)) {
            assert!(
                Instant::now() < deadline,
                "not all of {nodes:?} active within 120 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };

    start(NODE);
    wait_active(&[NODE.to_string()]);
    let (one_node, hook) = size();
    let watch = w.api.watch(
        HOOKS,
        hook["metadata"]["resourceVersion"].as_str().unwrap(),
        180,
    );
    let others: Vec<String> = (2..=NODES).map(|i| format!("node{i}")).collect();
    for node in &others {
        start(node);
    }
    wait_active(&others);
    // Reports settle (a node's later writes would show here too).
    std::thread::sleep(Duration::from_secs(2));
    let (twelve_nodes, _) = size();
    let (events, bytes) = watch.events();
    assert!(
        twelve_nodes.abs_diff(one_node) <= 1024,
        "the NetworkHook grew from {one_node} to {twelve_nodes} bytes"
    );
    assert!(
        events.len() <= 2,
        "a watching node received {} events ({bytes} bytes) while 11 nodes went Active: {events:?}",
        events.len()
    );
    for i in 1..=NODES {
        let node = format!("node{i}");
        let (code, text) = w
            .api
            .request("GET", &format!("{NODE_REPORTS}/{node}"), None)
            .unwrap();
        assert_eq!(code, 200);
        assert!(text.len() < 8 << 10, "{node}: {} bytes", text.len());
        let mentioned: Vec<String> = (1..=NODES)
            .map(|j| format!("\"node{j}\""))
            .filter(|n| text.contains(n.as_str()))
            .collect();
        assert_eq!(
            mentioned,
            [format!("\"{node}\"")],
            "{node}'s report names only itself"
        );
    }
    drop(daemons);
}

/// The node's report goes with its Node: with kube-controller-manager's garbage collector running, deleting the
/// Node removes the NodeHookStatus its ownerReference names it in.
#[test]
fn a_nodes_report_is_garbage_collected_with_its_node() {
    let w = world();
    let reference = w.push("status-labels", "vendor/labels:v1", Some(&w.trusted.0));
    w.hook("labels", &reference, &["app"], json!({}));
    let _gc = plexus_tests::control_plane::Component::garbage_collector(&w.api, &w.sb.path(""));
    let daemon = w.daemon(&[]);
    w.wait(&daemon, "the node's report written", |w| {
        w.node_status("labels").is_some_and(|s| s["active"] == true)
    });
    // The node is gone (its daemon with it), then its Node object is deleted.
    drop(daemon);
    w.api.must("DELETE", &format!("/api/v1/nodes/{NODE}"), None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while w.node_report().is_some() {
        assert!(
            Instant::now() < deadline,
            "the NodeHookStatus outlived its Node by 60 s; kube-controller-manager's log:\n{}",
            std::fs::read_to_string(w.sb.path("kube-controller-manager.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn signatures_are_required_and_digests_pinned() {
    let w = world();
    let unsigned = w.push("status-labels", "vendor/unsigned:v1", None);
    let foreign = w.push("status-labels", "vendor/foreign:v1", Some(&w.untrusted.0));
    let good = w.push("status-labels", "vendor/good:v1", Some(&w.trusted.0));
    let (repo, _) = good.split_once('@').unwrap();
    let missing = format!("{repo}@sha256:{}", "0".repeat(64));
    // Ignore: the ADDs go on without them while they are not ready; the missing one applies to another
    // namespace only.
    w.hook(
        "unsigned",
        &unsigned,
        &["app"],
        json!({"failurePolicy": "Ignore"}),
    );
    w.hook(
        "foreign",
        &foreign,
        &["app"],
        json!({"failurePolicy": "Ignore"}),
    );
    w.hook(
        "missing",
        &missing,
        &["app"],
        json!({"namespaces": ["elsewhere"]}),
    );
    w.hook("good", &good, &["zone"], json!({"order": 5}));
    let mut daemon = w.daemon(&[]);
    let reason = |w: &World, name: &str| {
        w.node_status(name)
            .map(|s| s["reason"].as_str().unwrap_or_default().to_string())
    };
    w.wait(&daemon, "all four reported", |w| {
        ["unsigned", "foreign", "missing", "good"]
            .iter()
            .all(|n| reason(w, n).is_some())
    });
    assert_eq!(reason(&w, "unsigned").unwrap(), "SignatureMissing");
    assert_eq!(reason(&w, "foreign").unwrap(), "SignatureInvalid");
    assert_eq!(reason(&w, "missing").unwrap(), "NotFound");
    assert_eq!(reason(&w, "good").unwrap(), "Active");
    for n in ["unsigned", "foreign", "missing"] {
        let s = w.node_status(n).unwrap();
        assert_eq!(s["active"], false, "{s}");
        assert!(s["message"].as_str().unwrap().contains("vendor/"), "{s}");
    }
    assert_eq!(w.set_names(), vec!["good"]);
    let unready: Vec<String> = w.unready().into_iter().map(|(n, _)| n).collect();
    assert_eq!(unready, ["foreign", "missing", "unsigned"]);
    assert_eq!(w.add_labels("c1"), json!({"zone": "a"}));
    assert!(
        daemon.child.try_wait().unwrap().is_none(),
        "the daemon is running"
    );
    drop(daemon);

    // With signatures off, the digest alone pins a module: the unsigned and foreign ones become active.
    let daemon = w.daemon(&["--hook-signatures", "off"]);
    w.wait(&daemon, "unsigned modules active", |w| {
        w.set_names().len() == 3
    });
    assert_eq!(reason(&w, "missing").unwrap(), "NotFound");
}

#[test]
fn an_unreachable_registry_is_retried_and_keeps_the_last_good_set() {
    let mut w = world();
    let v1 = w.push("status-labels", "vendor/labels:v1", Some(&w.trusted.0));
    // A different component for v2: the same hook, rebuilt (a pushed copy with one custom section more).
    let v2_file = w.sb.path("labels-v2.wasm");
    let mut bytes = std::fs::read(guest_wasm("status-labels")).unwrap();
    bytes.extend_from_slice(&[0, 8, 7]);
    bytes.extend_from_slice(b"plexus2");
    std::fs::write(&v2_file, &bytes).unwrap();
    let v2 = w.push_file(&v2_file, "vendor/labels:v2", Some(&w.trusted.0));

    // Down when the agent starts: reported, retried, the daemon keeps running.
    w.registry.down();
    w.hook("labels", &v1, &["app"], json!({}));
    let mut daemon = w.daemon(&[]);
    w.wait(&daemon, "pull failure reported", |w| {
        w.node_status("labels")
            .is_some_and(|s| s["reason"] == "PullFailed")
    });
    // Selected, never ready, failurePolicy Fail (the default): the ADDs it applies to are refused, naming it.
    assert!(w.set_names().is_empty());
    assert_eq!(w.unready().len(), 1, "{:?}", w.set());
    let refused = w.refused_add("c0");
    assert!(
        refused.contains("networkhook/labels")
            && refused.contains("is not ready on this node: PullFailed"),
        "{refused}"
    );
    assert!(
        w.sb.status("team-a", "web").is_none(),
        "no network-status was written"
    );
    // `plexus status` says so, as a problem of the node.
    let out = w.plexus_status("run", "cache");
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["hooks"][0]["name"], "networkhook/labels", "{s}");
    assert_eq!(s["hooks"][0]["state"], "PullFailed", "{s}");
    assert!(
        s["problems"].as_array().unwrap().iter().any(|p| p
            .as_str()
            .unwrap()
            .contains("networkhook/labels (status) is not ready on this node")),
        "{s}"
    );
    assert!(
        daemon.child.try_wait().unwrap().is_none(),
        "the daemon is running"
    );
    w.registry.up();
    w.wait(&daemon, "active once the registry is back", |w| {
        w.node_status("labels")
            .is_some_and(|s| s["active"] == true && s["reason"] == "Active")
    });
    let good = w.set();
    assert_eq!(w.add_labels("c1"), json!({"app": "web"}));

    // Last good means last good: the registry down and the pulled files gone, the agent reconciling again
    // and again (each label change of the Node makes it), the hook keeps running from its compiled artifact.
    w.registry.down();
    // Every pulled file goes: the components and the agent's records of them (who signed what).
    for entry in std::fs::read_dir(w.sb.path("cache/hook-modules")).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    for i in 0..8 {
        w.patch(
            &format!("/api/v1/nodes/{NODE}"),
            json!({"metadata": {"labels": {"plexus.dev/poke": i.to_string()}}}),
        );
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(w.set().hooks, good.hooks, "round {i}: the set changed");
        assert_eq!(w.add_labels(&format!("poke{i}")), json!({"app": "web"}));
    }
    w.wait(&daemon, "the failed re-pull reported", |w| {
        w.node_status("labels")
            .is_some_and(|s| s["reason"] == "PullFailed" && s["active"] == true)
    });
    assert!(
        !daemon.log_text().contains("left this node's running set"),
        "{}",
        daemon.log_text()
    );
    // Back: the component is pulled again.
    w.registry.up();
    w.wait(&daemon, "active again", |w| {
        w.node_status("labels")
            .is_some_and(|s| s["reason"] == "Active")
    });

    // Down later, while the resource moves to v2: v1 stays active, and the failure is reported against it.
    w.registry.down();
    w.patch(
        "/apis/plexus.dev/v1alpha1/networkhooks/labels",
        json!({"spec": {"module": v2, "settings": {"labels": ["tier"]}}}),
    );
    w.wait(&daemon, "v2 failure reported", |w| {
        w.node_status("labels")
            .is_some_and(|s| s["reason"] == "PullFailed")
    });
    let s = w.node_status("labels").unwrap();
    assert_eq!(s["active"], true, "{s}");
    assert_eq!(s["digest"].as_str(), v1.split_once('@').map(|(_, d)| d));
    assert_eq!(w.set().hooks, good.hooks, "the last good set stays");
    assert_eq!(w.add_labels("c2"), json!({"app": "web"}));
    assert!(
        daemon.child.try_wait().unwrap().is_none(),
        "the daemon is running"
    );

    // Back again: v2 with its settings.
    w.registry.up();
    w.wait(&daemon, "v2 active", |w| {
        w.node_status("labels").is_some_and(|s| {
            s["reason"] == "Active" && s["digest"].as_str() == v2.split_once('@').map(|(_, d)| d)
        })
    });
    assert_eq!(w.add_labels("c3"), json!({"tier": "front"}));
}

#[test]
fn a_node_selector_rolls_out_to_labelled_nodes_only() {
    let w = world();
    let reference = w.push("status-labels", "vendor/labels:v1", Some(&w.trusted.0));
    w.hook(
        "canary",
        &reference,
        &["app"],
        json!({"nodeSelector": {"matchLabels": {"plexus.dev/canary": "true"}}}),
    );
    w.hook("everywhere", &reference, &["zone"], json!({"order": -1}));
    let daemon = w.daemon(&[]);
    w.wait(&daemon, "the unselected hook is active", |w| {
        w.set_names() == vec!["everywhere"]
    });
    assert!(
        w.node_status("canary").is_none(),
        "a node not selected reports nothing"
    );
    assert_eq!(w.add_labels("c1"), json!({"zone": "a"}));

    w.patch(
        &format!("/api/v1/nodes/{NODE}"),
        json!({"metadata": {"labels": {"plexus.dev/canary": "true"}}}),
    );
    w.wait(&daemon, "the canary hook follows the label", |w| {
        w.set_names() == vec!["everywhere", "canary"]
            && w.node_status("canary").is_some_and(|s| s["active"] == true)
    });
    assert_eq!(w.add_labels("c2"), json!({"zone": "a", "app": "web"}));

    w.patch(
        &format!("/api/v1/nodes/{NODE}"),
        json!({"metadata": {"labels": {"plexus.dev/canary": null}}}),
    );
    w.wait(&daemon, "the canary hook leaves with the label", |w| {
        w.set_names() == vec!["everywhere"] && w.node_status("canary").is_none()
    });
}

/// ADDs racing publications of the node's hook set (the agent's own publish) each run one whole set: two status
/// hooks that switch together from labels (app, tier) to (zone, app) never show one from each set.
#[test]
fn adds_during_a_swap_see_the_old_set_or_the_new_one() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "web", "namespace": "team-a", "uid": "uid-web",
        "labels": {"app": "web", "tier": "front", "zone": "a"}}});
    sb.manifest("pod-team-a-web.json", &pod.to_string());
    let cache = sb.path("cache");
    let sha = compile_hook(&guest_wasm("status-labels"), &cache);
    let set = |generation: u64, first: &str, second: &str| {
        let hook = |name: &str, label: &str| {
            let mut h = HookSpec::new(name, HookKind::Status, sb.path("absent.wasm"));
            h.sha256 = Some(sha.clone());
            h.precompiled = true;
            h.settings = Some(json!({"labels": [label]}));
            h
        };
        HookSet {
            generation,
            hooks: vec![hook("a", first), hook("b", second)],
            runs: Default::default(),
        }
    };
    set(1, "app", "tier").publish(&cache).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (stop, sets) = (stop.clone(), [set(0, "app", "tier"), set(0, "zone", "app")]);
        let cache = cache.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut s = sets[(n % 2) as usize].clone();
                s.generation = n;
                s.publish(&cache).unwrap();
                n += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            n
        })
    };
    let old = json!({"app": "web", "tier": "front"});
    let new = json!({"zone": "a", "app": "web"});
    let mut seen = (0, 0);
    let conf = sb.conf(json!({"clusterHooks": true}));
    let args = Sandbox::pod_args("team-a", "web");
    for i in 0..40 {
        let id = format!("swap{i}");
        sb.run("ADD", &id, &args, &conf).ok();
        let labels = sb.status("team-a", "web").unwrap()[0][LABELS_KEY].clone();
        sb.run("DEL", &id, &args, &conf).ok();
        if labels == old {
            seen.0 += 1;
        } else if labels == new {
            seen.1 += 1;
        } else {
            panic!("ADD {i} ran a mix of two sets: {labels}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    let published = publisher.join().unwrap();
    assert!(
        published > 40,
        "the set changed under the ADDs ({published} publications)"
    );
    assert!(seen.0 > 0 && seen.1 > 0, "both sets were run: {seen:?}");
}

/// One registry request with curl (bounded); the response headers and body.
fn curl(args: &[&str]) -> String {
    let out = Command::new("curl")
        .args(["-sS", "-i", "--max-time", "10"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Uploads a blob with the distribution API (POST, then PUT to the upload location); its digest.
fn upload_blob(addr: &str, repo: &str, file: &Path) -> String {
    let bytes = std::fs::read(file).unwrap();
    let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&bytes)));
    let answer = curl(&[
        "-X",
        "POST",
        &format!("http://{addr}/v2/{repo}/blobs/uploads/"),
    ]);
    let location = answer
        .lines()
        .find_map(|l| {
            l.strip_prefix("Location: ")
                .or_else(|| l.strip_prefix("location: "))
        })
        .expect("upload location")
        .trim()
        .to_string();
    let sep = if location.contains('?') { '&' } else { '?' };
    let answer = curl(&[
        "-X",
        "PUT",
        "-H",
        "Content-Type: application/octet-stream",
        "--data-binary",
        &format!("@{}", file.display()),
        &format!("{location}{sep}digest={digest}"),
    ]);
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    digest
}

/// A signature made without plexus, as cosign makes one: the simple-signing payload signed by openssl (ECDSA
/// P-256, SHA-256, DER), stored by plain HTTP requests under the `sha256-<hex>.sig` tag, verifies with
/// `plexus hook verify`; the same layout with the payload naming another digest does not.
#[test]
fn a_signature_in_cosigns_layout_made_by_openssl_verifies() {
    let w = world();
    let reference = w.push("status-labels", "vendor/cosigned:v1", None);
    let (repo_path, digest) = reference.split_once('@').unwrap();
    let repo = repo_path.split_once('/').unwrap().1;
    let dir = w.sb.path("cosign");
    std::fs::create_dir_all(&dir).unwrap();
    let sign = |signed_digest: &str| {
        let payload = dir.join("payload.json");
        std::fs::write(
            &payload,
            format!(
                r#"{{"critical":{{"identity":{{"docker-reference":"{repo_path}"}},"image":{{"docker-manifest-digest":"{signed_digest}"}},"type":"cosign container image signature"}},"optional":null}}"#
            ),
        )
        .unwrap();
        let sig = dir.join("payload.sig");
        let ok = Command::new("openssl")
            .args(["dgst", "-sha256", "-sign"])
            .arg(&w.trusted.0)
            .arg("-out")
            .arg(&sig)
            .arg(&payload)
            .status()
            .unwrap()
            .success();
        assert!(ok, "openssl dgst -sign");
        let sig_b64 = base64_of(&std::fs::read(&sig).unwrap());
        let payload_digest = upload_blob(&w.registry.addr, repo, &payload);
        let config = dir.join("config.json");
        std::fs::write(&config, "{}").unwrap();
        let config_digest = upload_blob(&w.registry.addr, repo, &config);
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": 2},
            "layers": [{
                "mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
                "digest": payload_digest,
                "size": std::fs::metadata(&payload).unwrap().len(),
                "annotations": {"dev.cosignproject.cosign/signature": sig_b64},
            }],
        });
        let tag = format!("{}.sig", digest.replace(':', "-"));
        let answer = curl(&[
            "-X",
            "PUT",
            "-H",
            "Content-Type: application/vnd.oci.image.manifest.v1+json",
            "--data-binary",
            &manifest.to_string(),
            &format!("http://{}/v2/{repo}/manifests/{tag}", w.registry.addr),
        ]);
        assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    };

    sign(&format!("sha256:{}", "1".repeat(64)));
    let (ok, err) = w.verify(&reference, &w.trusted.1);
    assert!(!ok && err.contains("the signature is for"), "{err}");

    sign(digest);
    let (ok, out) = w.verify(&reference, &w.trusted.1);
    assert!(ok, "{out}");
    let (ok, err) = w.verify(&reference, &w.untrusted.1);
    assert!(!ok, "{err}");
}

fn base64_of(bytes: &[u8]) -> String {
    let out = Command::new("base64")
        .arg("-w0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(bytes)?;
            c.wait_with_output()
        })
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

/// The CNI binary without the compiler (`plexus-cni`, what the image installs on nodes) runs hooks the agent (or
/// `plexus hook compile`) compiled, and refuses, naming the fix, a hook nobody compiled; the full binary compiles
/// that one itself.
#[test]
fn the_cni_binary_without_a_compiler_runs_precompiled_hooks_only() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "web", "namespace": "team-a", "uid": "uid-web", "labels": {"app": "web", "zone": "b"}}});
    sb.manifest("pod-team-a-web.json", &pod.to_string());
    let cache = sb.path("cache");
    let args = Sandbox::pod_args("team-a", "web");
    let cni = plexus_cni_bin();

    // A conf hook whose component nobody compiled.
    let module = sb.path("labels.wasm");
    std::fs::copy(guest_wasm("status-labels"), &module).unwrap();
    let conf = sb.conf(
        json!({"hooks": [{"name": "labels", "kind": "status", "module": module,
        "settings": {"labels": ["app"]}}]}),
    );
    let run = sb.run_bin(&cni, "ADD", "c1", &args, &conf);
    assert!(!run.success, "{}", run.stdout);
    assert!(run.msg().contains("no compiler"), "{}", run.msg());
    assert!(run.msg().contains("plexus hook compile"), "{}", run.msg());
    assert!(sb.cached().is_empty(), "nothing half-attached");

    // Compiled by the full binary (as the agent does), the same conf runs in plexus-cni.
    let sha = compile_hook(&module, &cache);
    sb.run_bin(&cni, "ADD", "c2", &args, &conf).ok();
    assert_eq!(
        sb.status("team-a", "web").unwrap()[0][LABELS_KEY],
        json!({"app": "web"})
    );
    sb.run_bin(&cni, "DEL", "c2", &args, &conf).ok();

    // A published hook set (precompiled entries) runs after the conf's own hooks; its hook of the same name and
    // kind as the conf's is no clash (it runs as networkhook/labels).
    let mut h = HookSpec::new("labels", HookKind::Status, sb.path("gone.wasm"));
    h.sha256 = Some(sha);
    h.precompiled = true;
    h.settings = Some(json!({"labels": ["zone"]}));
    HookSet {
        generation: 1,
        hooks: vec![h],
        runs: Default::default(),
    }
    .publish(&cache)
    .unwrap();
    let conf = sb.conf(
        json!({"clusterHooks": true, "hooks": [{"name": "labels", "kind": "status", "module": module,
        "settings": {"labels": ["app"]}}]}),
    );
    sb.run_bin(&cni, "ADD", "c3", &args, &conf).ok();
    assert_eq!(
        sb.status("team-a", "web").unwrap()[0][LABELS_KEY],
        json!({"app": "web", "zone": "b"})
    );
    sb.run_bin(&cni, "DEL", "c3", &args, &conf).ok();
    // "clusterHooks": false leaves the node's set out.
    let conf = sb.conf(json!({"clusterHooks": false}));
    sb.run_bin(&cni, "ADD", "c4", &args, &conf).ok();
    assert_eq!(sb.status("team-a", "web").unwrap()[0].get(LABELS_KEY), None);
    sb.run_bin(&cni, "DEL", "c4", &args, &conf).ok();
}

/// `plexus hook compile FILE --cache-dir DIR` (what the node agent runs): the component's sha256.
fn compile_hook(module: &Path, cache: &Path) -> String {
    let out = Command::new(plexus_bin())
        .args(["hook", "compile"])
        .arg(module)
        .arg("--cache-dir")
        .arg(cache)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout).unwrap()["sha256"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Activation is earned: a module that does not export what its kind names, traps, or does not answer in time is
/// never made active, while the node keeps running pods with the set it had (0 ADDs failed); a deny is an answer.
#[test]
fn a_module_that_cannot_serve_its_kind_never_becomes_active() {
    let w = world();
    let labels = w.push("status-labels", "vendor/labels:v1", Some(&w.trusted.0));
    let policy_only = w.push(
        "test-policy-only",
        "vendor/policy-only:v1",
        Some(&w.trusted.0),
    );
    let trap = w.push("test-trap", "vendor/trap:v1", Some(&w.trusted.0));
    let endless = w.push("test-endless-loop", "vendor/endless:v1", Some(&w.trusted.0));
    // Built with the SDK's export!(policy: ...): it exports the resolver interface too (a pass-through).
    let sdk_policy = w.push(
        "namespace-isolation",
        "vendor/isolation:v1",
        Some(&w.trusted.0),
    );
    w.hook("labels", &labels, &["app"], json!({}));
    let daemon = w.daemon(&[]);
    w.wait(&daemon, "the good hook active", |w| {
        w.set_names() == vec!["labels"]
    });

    // Applied while pods are being added on the node; with failurePolicy Ignore, the ADDs go on without them
    // while they are not ready (with Fail they would be refused: see the registry test).
    w.hook(
        "wrong-kind",
        &policy_only,
        &[],
        json!({"kind": "status", "order": 1, "failurePolicy": "Ignore"}),
    );
    w.hook(
        "trap",
        &trap,
        &[],
        json!({"kind": "policy", "order": 2, "failurePolicy": "Ignore"}),
    );
    w.hook(
        "endless",
        &endless,
        &[],
        json!({"kind": "policy", "order": 3, "timeoutMs": 100, "failurePolicy": "Ignore"}),
    );
    w.hook(
        "sdk-wrong-kind",
        &sdk_policy,
        &[],
        json!({"kind": "resolver", "order": 5, "failurePolicy": "Ignore"}),
    );
    // Denies every pod it sees, but sees only namespace other: a deny is an answer, so it is active.
    w.hook(
        "denier",
        &policy_only,
        &[],
        json!({"kind": "policy", "order": 4, "namespaces": ["other"]}),
    );
    let reason = |w: &World, n: &str| {
        w.node_status(n)
            .map(|s| s["reason"].as_str().unwrap().to_string())
    };
    let failed = w.wait_adding(&daemon, "every hook reported", |w| {
        ["wrong-kind", "trap", "endless", "denier", "sdk-wrong-kind"]
            .iter()
            .all(|n| reason(w, n).is_some())
    });
    assert_eq!(failed, 0, "ADDs failed while bad hooks were applied");
    assert_eq!(reason(&w, "wrong-kind").unwrap(), "KindMismatch");
    // The SDK's policy hook as a resolver would resolve nothing and enforce nothing: refused, never Active.
    assert_eq!(reason(&w, "sdk-wrong-kind").unwrap(), "KindMismatch");
    let message = w.node_status("sdk-wrong-kind").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("spec.kind is resolver")
            && message.contains("declares that it implements policy only"),
        "{message}"
    );
    assert_eq!(reason(&w, "trap").unwrap(), "FailedProbe");
    assert_eq!(reason(&w, "endless").unwrap(), "FailedProbe");
    assert_eq!(reason(&w, "denier").unwrap(), "Active");
    let s = w.node_status("wrong-kind").unwrap();
    assert_eq!(s["active"], false);
    let message = s["message"].as_str().unwrap();
    assert!(
        message.contains("policy") && message.contains("plexus:hooks/status"),
        "{message}"
    );
    assert!(w.node_status("trap").unwrap()["message"]
        .as_str()
        .unwrap()
        .contains("trapped"));
    assert!(w.node_status("endless").unwrap()["message"]
        .as_str()
        .unwrap()
        .contains("timed out"));
    assert_eq!(w.set_names(), vec!["labels", "denier"]);
    for i in 0..5 {
        assert!(
            w.add_del(&format!("after{i}")),
            "an ADD failed after the bad hooks were reported"
        );
    }
    assert_eq!(w.add_labels("c1"), json!({"app": "web"}));

    // Each refusal is also a Warning event on the resource.
    let events = w.api.must("GET", "/api/v1/namespaces/default/events", None);
    let warned: Vec<(String, String)> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "Warning" && e["involvedObject"]["kind"] == "NetworkHook")
        .map(|e| {
            (
                e["involvedObject"]["name"].as_str().unwrap().to_string(),
                e["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for (hook, why) in [
        ("wrong-kind", "KindMismatch"),
        ("sdk-wrong-kind", "KindMismatch"),
        ("trap", "FailedProbe"),
        ("endless", "FailedProbe"),
    ] {
        assert!(
            warned.contains(&(hook.into(), why.into())),
            "{hook}: {warned:?}"
        );
    }

    // Fixed (the right kind for the same module): it becomes active.
    w.patch(
        "/apis/plexus.dev/v1alpha1/networkhooks/wrong-kind",
        json!({"spec": {"kind": "policy", "namespaces": ["other"]}}),
    );
    w.wait(&daemon, "the fixed hook active", |w| {
        reason(w, "wrong-kind").as_deref() == Some("Active")
    });
}

/// A blob whose bytes do not match its digest is tampering, told apart from an outage (both digests named), and
/// retried with backoff, not in a tight loop.
#[test]
fn content_that_does_not_match_its_digest_is_reported_as_such() {
    let w = world();
    let wasm = std::fs::read(guest_wasm("status-labels")).unwrap();
    let reference = w.push("status-labels", "vendor/labels:v1", Some(&w.trusted.0));
    // The registry's stored copy of the module's layer, changed in one byte.
    let layer = hex::encode(sha2::Sha256::digest(&wasm));
    let data = w.registry.dir.path().join(format!(
        "data/docker/registry/v2/blobs/sha256/{}/{layer}/data",
        &layer[..2]
    ));
    let mut stored = std::fs::read(&data).unwrap();
    let last = stored.len() - 1;
    stored[last] ^= 0xff;
    std::fs::write(&data, &stored).unwrap();
    let tampered = hex::encode(sha2::Sha256::digest(&stored));

    w.hook("labels", &reference, &["app"], json!({}));
    let daemon = w.daemon(&[]);
    w.wait(&daemon, "the mismatch reported", |w| {
        w.node_status("labels").is_some()
    });
    let s = w.node_status("labels").unwrap();
    assert_eq!(s["reason"], "DigestMismatch", "{s}");
    assert_eq!(s["active"], false);
    let message = s["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("sha256:{layer}"))
            && message.contains(&format!("sha256:{tampered}")),
        "{message}"
    );
    assert!(
        s["nextAttemptTime"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{s}"
    );
    assert!(w.set_names().is_empty());
    assert!(
        w.unready()[0].1.starts_with("DigestMismatch: "),
        "{:?}",
        w.unready()
    );
    // Backoff: 1 s doubling (±25%), so at most 4 attempts in the first 6 s.
    std::thread::sleep(Duration::from_secs(6));
    let attempts = daemon.log_text().matches("retrying with backoff").count();
    assert!(
        (2..=4).contains(&attempts),
        "{attempts} attempts in ~6 s:\n{}",
        daemon.log_text()
    );
}

/// Trust follows the keys: rotation (add the new key, re-sign, remove the old one) keeps the hook running with no
/// ADD failing; removing the last key that verifies a running module takes it out of the node's set (Untrusted).
#[test]
fn trust_follows_the_keys() {
    let w = world();
    let keys = w.sb.path("trusted-keys");
    std::fs::create_dir_all(&keys).unwrap();
    std::fs::copy(&w.trusted.1, keys.join("old.pub")).unwrap();
    let reference = w.push("status-labels", "vendor/labels:v1", Some(&w.trusted.0));
    w.hook("labels", &reference, &["app"], json!({}));
    let daemon = w.daemon_keyed(&keys, &[]);
    w.wait(&daemon, "active with the old key", |w| {
        w.set_names() == vec!["labels"]
    });
    let record_key = |w: &World| -> Vec<String> {
        std::fs::read_dir(w.sb.path("cache/hook-modules"))
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .map(|e| {
                let v: Value = serde_json::from_slice(&std::fs::read(e.path()).unwrap()).unwrap();
                v["verifiedBy"].as_str().unwrap_or_default().to_string()
            })
            .collect()
    };
    let old_id = record_key(&w);

    // Rotation: the new key is added, the module signed with it (the same digest), then the old key removed.
    let new = key_pair(&w.sb.path("keys"), "new");
    std::fs::copy(&new.1, keys.join("new.pub")).unwrap();
    let again = w.push("status-labels", "vendor/labels:v1", Some(&new.0));
    assert_eq!(again, reference);
    std::fs::remove_file(keys.join("old.pub")).unwrap();
    let failed = w.wait_adding(&daemon, "re-verified with the new key", |w| {
        let ids = record_key(w);
        !ids.is_empty() && ids != old_id
    });
    assert_eq!(failed, 0, "ADDs failed during the rotation");
    assert_eq!(w.set_names(), vec!["labels"]);
    assert_eq!(w.node_status("labels").unwrap()["reason"], "Active");
    assert_eq!(w.add_labels("c1"), json!({"app": "web"}));

    // The only key that verifies it removed (another key stays): the module leaves the node's set.
    std::fs::copy(&w.untrusted.1, keys.join("other.pub")).unwrap();
    std::fs::remove_file(keys.join("new.pub")).unwrap();
    w.wait(&daemon, "untrusted", |w| {
        w.node_status("labels")
            .is_some_and(|s| s["reason"] == "Untrusted")
    });
    let s = w.node_status("labels").unwrap();
    assert_eq!(s["active"], false, "{s}");
    assert!(w.set_names().is_empty());
    let log = daemon.log_text();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("a hook left this node's running set")
            && l.contains("reason=Untrusted")),
        "{log}"
    );
    // Still selected, failurePolicy Fail: its ADDs are refused rather than run without it.
    let refused = w.refused_add("c2");
    assert!(
        refused.contains("networkhook/labels") && refused.contains("Untrusted"),
        "{refused}"
    );
    // The hook deleted: out of the set, and the ADDs go on.
    let (code, body) = w
        .api
        .request("DELETE", &format!("{HOOKS}/labels"), None)
        .unwrap();
    assert_eq!(code, 200, "{body}");
    w.wait(&daemon, "the set empty", |w| w.set().hooks.is_empty());
    assert_eq!(w.add_labels("c3"), Value::Null);
}

/// What a vendor or operator gets wrong on the way, answered with what to do: a plain-HTTP registry named without
/// `--insecure-registry` (push, verify, and the node agent's PullFailed say to name it), and a node agent whose
/// Node does not exist (it logs why it waits once, `plexus status` shows it, and it goes on once the Node exists).
#[test]
fn a_plain_http_registry_and_a_missing_node_are_named_with_what_to_do() {
    let w = world();
    let reference = w.push("status-labels", "vendor/labels:v1", Some(&w.trusted.0));
    let tagged = format!("{}/vendor/labels:v1", w.registry.addr);
    let hint = format!("--insecure-registry {}", w.registry.addr);
    let push = Command::new(plexus_bin())
        .args(["hook", "push"])
        .arg(guest_wasm("status-labels"))
        .arg(&tagged)
        .output()
        .unwrap();
    let verify = Command::new(plexus_bin())
        .args(["hook", "verify", &tagged, "--key"])
        .arg(&w.trusted.1)
        .output()
        .unwrap();
    for (what, out) in [("push", push), ("verify", verify)] {
        assert_eq!(out.status.code(), Some(1), "{what}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&hint), "{what}: {stderr}");
    }
    w.hook("labels", &reference, &["app"], json!({}));

    // The agent of a node whose Node is not there yet. Its token is an administrator's: a token bound to a node
    // needs the Node, and this node has none yet.
    let late = "node-late";
    let log = w.sb.path("late.log");
    w.api
        .write_kubeconfig(&w.sb.path("late.kubeconfig"), "admin-token");
    let daemon = NodeDaemon::start(
        late,
        &w.sb.path("late.kubeconfig"),
        &w.sb.path("run-late/daemon.sock"),
        &w.sb.path("cache-late"),
        &log,
        &[
            "--hook-key",
            w.trusted.1.to_str().unwrap(),
            "--insecure-registry",
            &w.registry.addr,
        ],
    );
    let status = || -> Value {
        let out = w.plexus_status("run-late", "cache-late");
        serde_json::from_slice(&out.stdout).unwrap_or_default()
    };
    let waits = |s: &Value| {
        s["problems"].as_array().into_iter().flatten().any(|p| {
            p.as_str()
                .is_some_and(|p| p.contains("hook agent: there is no Node named node-late"))
        })
    };
    w.wait(&daemon, "plexus status naming the missing Node", |_| {
        waits(&status())
    });
    // Logged once, however long it waits.
    std::thread::sleep(Duration::from_secs(2));
    let logged = || {
        std::fs::read_to_string(&log)
            .unwrap()
            .matches("the hook agent waits")
            .count()
    };
    assert_eq!(logged(), 1, "{}", std::fs::read_to_string(&log).unwrap());
    // Until its agent has published a set, the node refuses ADDs, retryably and saying why (a policy never fails
    // open in a node's first minutes); no delegate runs, nothing stays, and DEL is not held back.
    let late_conf =
        w.sb.conf(json!({"clusterHooks": true, "cacheDir": w.sb.path("cache-late")}));
    let args = Sandbox::pod_args("team-a", "web");
    w.sb.clear_calls();
    let run = w.sb.run("ADD", "late-1", &args, &late_conf);
    assert_eq!(run.code(), 11, "{}", run.stdout);
    assert!(run.msg().contains("no published hook set"), "{}", run.msg());
    assert!(w.sb.calls().is_empty(), "{:?}", w.sb.call_summary());
    assert!(plexus_tests::plexus::list_cache(&w.sb.path("cache-late/attachments")).is_empty());
    w.sb.run("DEL", "late-1", &args, &late_conf).ok();
    w.api
        .create(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": late}}));
    let report = || {
        let (code, text) = w
            .api
            .request("GET", &format!("{NODE_REPORTS}/{late}"), None)
            .unwrap();
        (code == 200).then(|| serde_json::from_str::<Value>(&text).unwrap())
    };
    w.wait(&daemon, "the late node's hook Active", |_| {
        report().is_some_and(|r| r["status"]["hooks"][0]["reason"] == "Active")
    });
    assert!(!waits(&status()), "{}", status());
    // Published: the same ADD goes through, and runs the hook.
    w.sb.run("ADD", "late-2", &args, &late_conf).ok();
    assert_eq!(
        w.sb.status("team-a", "web").unwrap()[0][LABELS_KEY],
        json!({"app": "web"})
    );
    w.sb.run("DEL", "late-2", &args, &late_conf).ok();
    drop(daemon);

    // An agent told nothing of the plain-HTTP registry: PullFailed, and the message says which flag.
    let daemon = NodeDaemon::start(
        NODE,
        &w.sb.path("daemon.kubeconfig"),
        &w.sb.path("run/daemon.sock"),
        &w.sb.path("cache"),
        &w.sb.path("plain.log"),
        &["--hook-key", w.trusted.1.to_str().unwrap()],
    );
    w.wait(&daemon, "PullFailed naming --insecure-registry", |w| {
        w.node_status("labels").is_some_and(|s| {
            s["reason"] == "PullFailed" && s["message"].as_str().unwrap().contains(&hint)
        })
    });
}

/// The text between two markers of docs/hooks.md, without a code fence around it.
fn doc_block(doc: &str, begin: &str, end: &str) -> String {
    let start = doc.find(begin).expect("the begin marker") + begin.len();
    let len = doc[start..].find(end).expect("the end marker");
    let block = doc[start..start + len].trim();
    let block = block.strip_prefix("```sh").expect("a sh block");
    block
        .strip_suffix("```")
        .expect("a closed block")
        .to_string()
}

/// docs/hooks.md's walkthrough, run exactly as the page writes it: its hook's code (steps 2 and 3) is the
/// `pod-prefix` guest, built and tested with the guests; its commands, from the built component to an allowed and
/// a denied ADD, run in an empty directory against a real API server and a real registry, as root, with only the
/// page's own variables set (the registry's address, an admin kubeconfig, where the CNI plugins are).
#[test]
fn the_walkthrough_in_docs_hooks_md_runs_as_written() {
    walkthrough(
        "pod-prefix",
        &[
            (
                "rust",
                "guests/pod-prefix/src/lib.rs",
                "impl Policy for PodPrefix",
            ),
            (
                "rust",
                "guests/pod-prefix/src/lib.rs",
                "fn only_prefixed_networks_pass",
            ),
        ],
    );
}

/// The walkthrough's Python track: the page's Python blocks (P2 and P3) are the `guests/python/pod-prefix` guest,
/// built and tested with the guests, and step 8's commands run as written with that component.
#[test]
fn the_walkthrough_in_docs_hooks_md_runs_as_written_with_the_python_build() {
    walkthrough(
        "py-pod-prefix",
        &[
            (
                "python",
                "guests/python/pod-prefix/pod_prefix.py",
                "def check(",
            ),
            (
                "python",
                "guests/python/pod-prefix/test_pod_prefix.py",
                "def test_only_prefixed_networks_pass",
            ),
        ],
    );
}

/// The walkthrough's TypeScript track: the page's TypeScript blocks (T2 and T3) are the
/// `guests/typescript/pod-prefix` guest, built and tested with the guests, and step 8's commands run as written with
/// that component.
#[test]
fn the_walkthrough_in_docs_hooks_md_runs_as_written_with_the_typescript_build() {
    walkthrough(
        "ts-pod-prefix",
        &[
            (
                "ts",
                "guests/typescript/pod-prefix/pod-prefix.ts",
                "export function check(",
            ),
            (
                "ts",
                "guests/typescript/pod-prefix/pod-prefix.test.ts",
                "only prefixed networks pass",
            ),
        ],
    );
}

/// Runs the walkthrough with the component `guest`, after checking that each of the page's `(language, file,
/// needle)` blocks, the one of that language holding the needle, is in that file of the repository.
fn walkthrough(guest: &str, blocks: &[(&str, &str, &str)]) {
    // The page's network namespaces, links and subnets are fixed names: one walkthrough at a time.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/hooks.md")).unwrap();
    for (language, file, needle) in blocks {
        let code = std::fs::read_to_string(root.join(file)).unwrap();
        let block = doc
            .split(&format!("```{language}\n"))
            .skip(1)
            .map(|b| b.split("```").next().unwrap())
            .find(|b| b.contains(needle))
            .unwrap_or_else(|| panic!("no {language} block of docs/hooks.md has {needle}"));
        assert!(
            code.contains(block),
            "{file} differs from the page's block with {needle}"
        );
    }
    let script = doc_block(
        &doc,
        "<!-- walkthrough:begin -->",
        "<!-- walkthrough:end -->",
    );

    plexus_tests::netns::require_root_and_plugins();
    // No controller manager here makes a namespace's default service account, which the ServiceAccount admission
    // plugin looks up for every pod: it is off (a cluster makes the account as the namespace is created).
    let api = KubeApiServer::start(&[], &["--disable-admission-plugins=ServiceAccount"]);
    api.apply_file(&deploy_manifest("crds.yaml"));
    api.apply_file(&deploy_manifest("networkhooks.yaml"));
    api.apply_file(&deploy_manifest("rbac.yaml"));
    api.wait_for(HOOKS);
    let registry = Registry::start();
    let dir = tempfile::Builder::new()
        .prefix("plx-walk-")
        .tempdir()
        .unwrap();
    std::fs::copy(guest_wasm(guest), dir.path().join("pod-prefix.wasm")).unwrap();
    let kubeconfig = dir.path().join("admin.kubeconfig");
    api.write_kubeconfig(&kubeconfig, "admin-token");
    // The page's fixed names, in case an earlier run was killed half-way.
    let cleanup = || {
        for ns in ["demo-web", "demo-db"] {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
        for link in ["demo-cluster", "demo-lab-net"] {
            let _ = Command::new("ip")
                .args(["link", "del", link])
                .stderr(Stdio::null())
                .status();
        }
    };
    cleanup();
    let path = format!(
        "{}:{}:{}",
        plexus_bin().parent().unwrap().display(),
        plexus_tests::parts::bin("kubectl")
            .parent()
            .unwrap()
            .display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("timeout")
        .args(["300", "bash", "-o", "pipefail", "-c", &script])
        .current_dir(dir.path())
        .env("PATH", path)
        .env("REGISTRY", &registry.addr)
        .env("KUBECONFIG", &kubeconfig)
        .env("CNI_PATH", plexus_tests::netns::cni_bin_dir())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    cleanup();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    let log = std::fs::read_to_string(dir.path().join("daemon.log")).unwrap_or_default();
    let context = format!("stdout:\n{stdout}\nstderr:\n{stderr}\ndaemon log:\n{log}");
    assert!(out.status.success(), "the walkthrough failed\n{context}");
    // Active on the node, the allowed pod with both its interfaces, the denied one told why.
    assert!(stdout.contains("1 running it"), "{context}");
    let address = |ifname: &str, subnet: &str| {
        stdout
            .lines()
            .any(|l| l.starts_with(&format!("{ifname}@")) && l.contains(subnet))
    };
    assert!(address("eth0", "10.250.0."), "{context}");
    assert!(address("net1", "10.251.0."), "{context}");
    assert!(
        stdout.contains("network prod-net is not allowed"),
        "{context}"
    );
    let pushed: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("pushed.json")).unwrap()).unwrap();
    assert_eq!(pushed["networkHook"]["spec"]["kind"], "policy");
    assert_eq!(pushed["networkHook"]["spec"]["module"], pushed["reference"]);
    // Its clean-up left nothing: the hook and the node are gone from the API server.
    assert_eq!(
        api.request("GET", &format!("{HOOKS}/pod-prefix"), None)
            .unwrap()
            .0,
        404
    );
}

/// The hook set file is the node's word on which policies apply: one that exists and cannot be read fails the
/// ADD (naming it), never runs as an empty set.
#[test]
fn an_unreadable_hook_set_fails_the_add() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "web", "namespace": "team-a", "uid": "uid-web"}});
    sb.manifest("pod-team-a-web.json", &pod.to_string());
    std::fs::create_dir_all(sb.path("cache")).unwrap();
    std::fs::write(
        sb.path("cache/hook-set.json"),
        "{\"generation\": 3, \"hooks\": [",
    )
    .unwrap();
    let conf = sb.conf(json!({"clusterHooks": true}));
    let args = Sandbox::pod_args("team-a", "web");
    let run = sb.run("ADD", "c1", &args, &conf);
    assert!(!run.success, "{}", run.stdout);
    assert!(
        run.msg().contains("node hook set") && run.msg().contains("hook-set.json"),
        "{}",
        run.msg()
    );
    assert!(sb.calls().is_empty(), "{:?}", sb.call_summary());
    // DELs never load hooks: teardown goes on.
    assert!(sb.run("DEL", "c1", &args, &conf).success);
}

/// A report the API server refuses for what it says (here a ValidatingAdmissionPolicy refuses any report naming
/// the hook `refused`) is logged once and not sent again until it changes: no tight loop of writes.
#[test]
fn a_refused_report_is_not_sent_again_until_it_changes() {
    let w = world();
    let admission = "/apis/admissionregistration.k8s.io/v1";
    w.api.must("POST", &format!("{admission}/validatingadmissionpolicies"), Some(&json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "refuse-reports"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": ["plexus.dev"], "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE"], "resources": ["nodehookstatuses"]}]},
            "validations": [{
                "expression": "!has(object.status) || !has(object.status.hooks) || object.status.hooks.all(h, h.name != 'refused')",
                "reason": "Invalid",
                "message": "this report names the hook refused"}]}})));
    w.api.must(
        "POST",
        &format!("{admission}/validatingadmissionpolicybindings"),
        Some(&json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "refuse-reports"},
        "spec": {"policyName": "refuse-reports", "validationActions": ["Deny"]}})),
    );
    let reference = w.push("status-labels", "vendor/labels:v1", Some(&w.trusted.0));
    w.hook(
        "refused",
        &reference,
        &["app"],
        json!({"namespaces": ["elsewhere"]}),
    );
    // The policy takes effect once the API server has loaded it.
    let probe = json!({"apiVersion": "plexus.dev/v1alpha1", "kind": "NodeHookStatus",
        "metadata": {"name": "probe"},
        "status": {"active": 0, "failing": 0, "hooks": [
            {"name": "refused", "active": false, "reason": "X"}]}});
    let deadline = Instant::now() + Duration::from_secs(30);
    while w.api.request("POST", NODE_REPORTS, Some(&probe)).unwrap().0 != 422 {
        assert!(Instant::now() < deadline, "the policy never took effect");
        std::thread::sleep(Duration::from_millis(200));
    }
    let daemon = w.daemon(&[]);
    w.wait(&daemon, "the refusal logged", |_| {
        daemon.log_text().contains("refused the node's hook report")
    });
    // The agent keeps reconciling (each label change of its Node makes it), and sends nothing it was refused.
    for i in 0..5 {
        w.patch(
            &format!("/api/v1/nodes/{NODE}"),
            json!({"metadata": {"labels": {"plexus.dev/poke": i.to_string()}}}),
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let writes = w
        .api
        .audit_entries()
        .into_iter()
        .filter(|e| {
            e["user"]["username"] == plexus_tests::kubeapi::PLEXUS_USER
                && e["requestURI"]
                    .as_str()
                    .is_some_and(|u| u.contains(&format!("nodehookstatuses/{NODE}")))
        })
        .count();
    assert_eq!(writes, 1, "daemon log:\n{}", daemon.log_text());
    assert_eq!(
        daemon
            .log_text()
            .matches("refused the node's hook report")
            .count(),
        1
    );
    assert!(daemon
        .log_text()
        .contains("this report names the hook refused"));
}

/// A NetworkHook whose memoryLimitMiB does not fit in the node's hook processes (`--hook-process-memory-mib`, with
/// the runtime's share) is refused before its module is pulled, with a message naming both numbers and the flag;
/// a daemon that gives those processes more memory runs it.
#[test]
fn a_memory_limit_past_the_hook_processes_is_refused_naming_the_flag() {
    let w = world();
    let labels = w.push("status-labels", "vendor/labels:v1", Some(&w.trusted.0));
    w.hook("big", &labels, &["app"], json!({"memoryLimitMiB": 200}));
    let daemon = w.daemon(&[]);
    w.wait(&daemon, "the hook refused", |w| {
        w.node_status("big")
            .is_some_and(|s| s["reason"] == "InvalidSpec")
    });
    let status = w.node_status("big").unwrap();
    let message = status["message"].as_str().unwrap();
    assert!(
        message.contains("memoryLimitMiB 200")
            && message.contains("64 MiB")
            && message.contains("--hook-process-memory-mib"),
        "{message}"
    );
    assert_eq!(status["active"], false, "{status}");
    assert_eq!(w.unready().len(), 1, "{:?}", w.set());
    let pulled = std::fs::read_dir(w.sb.path("cache/hook-modules"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(pulled, 0, "nothing pulled");
    drop(daemon);

    let daemon = w.daemon(&["--hook-process-memory-mib", "256"]);
    w.wait(&daemon, "the hook active and reported so", |w| {
        w.set_names() == vec!["big"]
            && w.node_status("big")
                .is_some_and(|s| s["reason"] == "Active")
    });
}
