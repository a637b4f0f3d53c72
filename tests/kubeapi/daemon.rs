//! `plexus daemon` against a real kube-apiserver (1.37, of the build of `tests/parts.sh`) and etcd: its watch
//! caches (pods by field selector, NADs), 410 Gone and relist, the socket it serves, and the CNI binary asking it
//! first and working without it (thin mode). The project's CRDs and RBAC are applied as written; an audit log
//! tells which identity sent which request.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use plexus_cni::daemon::client::ask;
use plexus_cni::daemon::proto::{Answer, Request};
use plexus_tests::deploy_manifest;
use plexus_tests::kubeapi::{KubeApiServer, PLEXUS_USER};
use plexus_tests::plexus::{plexus_bin, NodeDaemon, Sandbox};
use serde_json::{json, Value};

/// The CNI binary's own identity in these tests, bound to the same ClusterRole, so the audit log tells its
/// requests from the daemon's.
const CNI_USER: &str = "system:serviceaccount:kube-system:plexus-cni";
/// The daemon's identity (the DaemonSet's service account).
const DAEMON_USER: &str = "system:serviceaccount:kube-system:plexus";
const NODE: &str = "node1";

struct Cluster {
    api: KubeApiServer,
    sb: Sandbox,
}

/// A real API server with the project's CRDs and RBAC, a second service account for the CNI binary bound to
/// the same role, namespace `team-a`, and a sandbox with fake delegates.
fn cluster(extra_args: &[&str]) -> Cluster {
    let api = KubeApiServer::start(&[("cni-token", "kube-system/plexus-cni")], extra_args);
    api.apply_file(&deploy_manifest("crds.yaml"));
    api.apply_file(&deploy_manifest("rbac.yaml"));
    api.create(&json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "plexus-cni"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "plexus"},
        "subjects": [{"kind": "ServiceAccount", "name": "plexus-cni", "namespace": "kube-system"}]
    }));
    api.namespace("team-a");
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    sb.fakes(&["secondary-plugin"]);
    api.write_kubeconfig(&sb.path("cni.kubeconfig"), "cni-token");
    // The daemon's identity as a DaemonSet pod's projected token carries it: bound to a pod on its node
    // (TOKEN_POD more pod in its cache), its writes checked by the node-authority policy.
    api.apply_node_authority();
    let token = api.node_bound_token("kube-system", "plexus", NODE);
    api.write_kubeconfig(&sb.path("daemon.kubeconfig"), &token);
    Cluster { api, sb }
}

/// The pod the daemon's token is bound to: on its node, so in its cache.
const TOKEN_POD: usize = 1;

fn nad_config(name: &str, marker: &str) -> Value {
    json!({"cniVersion": "1.0.0", "name": name, "type": "secondary-plugin", "marker": marker})
}

impl Cluster {
    fn conf(&self, daemon: Value) -> Value {
        self.sb.conf(json!({
            "cluster": {
                "source": "kube", "kubeconfig": self.sb.path("cni.kubeconfig"),
                "requestTimeoutMs": 2000, "deadlineMs": 5000, "retries": 2,
                "initialBackoffMs": 20, "maxBackoffMs": 100
            },
            "daemon": daemon,
        }))
    }

    fn socket(&self) -> PathBuf {
        self.sb.path("run/daemon.sock")
    }

    fn daemon(&self, extra: &[&str]) -> NodeDaemon {
        self.daemon_with(&self.sb.path("daemon.kubeconfig"), extra)
    }

    fn daemon_with(&self, kubeconfig: &Path, extra: &[&str]) -> NodeDaemon {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        NodeDaemon::start(
            NODE,
            kubeconfig,
            &self.socket(),
            &self.sb.path("cache"),
            &self.sb.path(&format!("daemon-{n}.log")),
            extra,
        )
    }

    /// A pod of `team-a` on this node selecting `networks`; its UID.
    fn selecting_pod(&self, name: &str, networks: &str) -> String {
        let pod = self.api.pod(
            "team-a",
            name,
            NODE,
            json!({"k8s.v1.cni.cncf.io/networks": networks}),
        );
        pod["metadata"]["uid"].as_str().unwrap().to_string()
    }

    /// ADD for a pod of `team-a`, with its real UID.
    fn add(&self, id: &str, pod: &str, uid: &str, conf: &Value) -> plexus_tests::plexus::Run {
        self.sb.run("ADD", id, &pod_args(pod, uid), conf)
    }

    fn requests_of(&self, user: &str) -> Vec<(String, String)> {
        self.api.requests_of(user)
    }
}

/// The daemon's answer for NAD `team-a/name`.
fn nad_answer(d: &NodeDaemon, name: &str) -> Answer {
    let request = Request::Nad {
        namespace: "team-a".into(),
        name: name.into(),
        within_ms: None,
    };
    ask(&d.socket, &request, Duration::from_secs(5)).unwrap()
}

/// CNI_ARGS for a pod of `team-a` with its real UID.
fn pod_args(pod: &str, uid: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME={pod};K8S_POD_UID={uid}")
}

fn status_of(api: &KubeApiServer, pod: &str) -> Vec<(String, String)> {
    api.network_status("team-a", pod)
}

fn marker_of_last_secondary_call(sb: &Sandbox) -> String {
    sb.calls()
        .iter()
        .rev()
        .find(|c| c.plugin == "secondary-plugin" && c.command == "ADD")
        .map(|c| c.stdin["marker"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default()
}

#[test]
fn an_add_served_by_the_daemon_reads_nothing_from_the_api() {
    let c = cluster(&[]);
    let d = c.daemon(&[]);
    d.wait("synced", plexus_tests::plexus::settled);
    assert_eq!(health_exit(&d.socket), 0);
    // A second daemon on the same socket refuses to start.
    let second = Command::new(plexus_bin())
        .args(["daemon", "--node-name", NODE, "--kubeconfig"])
        .arg(c.sb.path("daemon.kubeconfig"))
        .arg("--socket")
        .arg(c.socket())
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("another plexus daemon holds"),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );

    // Created after the daemon synced: they reach it through its watches, not its first list.
    c.api.nad("team-a", "net-a", &nad_config("net-a", "v1"));
    let uid = c.selecting_pod("web", "net-a");
    // A pod of another node is not cached.
    c.api.pod("team-a", "elsewhere", "node2", json!({}));
    d.wait("pod and NAD cached", |h| {
        h.cache.pods == 1 + TOKEN_POD && h.cache.nads == 1
    });

    let conf = c.conf(json!({"timeoutMs": 5000}));
    let before = c.requests_of(PLEXUS_USER).len();
    c.add("c1", "web", &uid, &conf).ok();
    assert_eq!(
        c.requests_of(CNI_USER),
        vec![],
        "the CNI process sent no request"
    );
    // The daemon accepted the status write and sends it on its own.
    let h = d.wait("status written", |h| {
        h.status_writes == 1 && h.pending_writes == 0
    });
    assert_eq!(h.api_reads, 0, "{h:?}");
    assert_eq!(
        status_of(&c.api, "web"),
        vec![
            ("cluster-net".to_string(), "eth0".to_string()),
            ("team-a/net-a".to_string(), "net1".to_string())
        ]
    );
    assert_eq!(marker_of_last_secondary_call(&c.sb), "v1");
    // The daemon's own requests for this ADD: the status patch and the event, nothing read.
    let deadline = Instant::now() + Duration::from_secs(10);
    let daemon_requests = loop {
        let r: Vec<_> = c.requests_of(PLEXUS_USER)[before..]
            .iter()
            // The node-authority self-check's dry run and the node agent's report are the daemon's own, not the
            // ADD's (they go out when the daemon starts, and may land after the snapshot above).
            .filter(|(verb, uri)| {
                verb != "watch"
                    && verb != "list"
                    && !uri.contains("dryRun")
                    && !uri.contains("/nodehookstatuses")
            })
            .cloned()
            .collect();
        if r.len() >= 2 || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut verbs: Vec<_> = daemon_requests
        .iter()
        .map(|(verb, uri)| format!("{verb} {}", uri.split('?').next().unwrap()))
        .collect();
    verbs.sort();
    assert_eq!(
        verbs,
        vec![
            "create /api/v1/namespaces/team-a/events",
            "patch /api/v1/namespaces/team-a/pods/web/status"
        ]
    );

    // A NAD changed after the daemon cached it: the next ADD plans with the new config.
    c.api.must(
        "PATCH",
        "/apis/k8s.cni.cncf.io/v1/namespaces/team-a/network-attachment-definitions/net-a",
        Some(&json!({"spec": {"config": nad_config("net-a", "v2").to_string()}})),
    );
    let uid2 = c.selecting_pod("web2", "net-a");
    d.wait("second pod cached", |h| h.cache.pods == 2 + TOKEN_POD);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match nad_answer(&d, "net-a") {
            Answer::Nad { nad } if nad.config.as_deref().unwrap_or_default().contains("v2") => {
                break
            }
            _ => assert!(
                Instant::now() < deadline,
                "the NAD's change did not reach the daemon"
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    c.add("c2", "web2", &uid2, &conf).ok();
    assert_eq!(marker_of_last_secondary_call(&c.sb), "v2");

    // A deleted NAD: the daemon's answer is the API's own (not found), and the ADD names it.
    c.api.must(
        "DELETE",
        "/apis/k8s.cni.cncf.io/v1/namespaces/team-a/network-attachment-definitions/net-a",
        None,
    );
    d.wait("NAD gone", |h| h.cache.nads == 0);
    let uid3 = c.selecting_pod("web3", "net-a");
    let run = c.add("c3", "web3", &uid3, &conf);
    assert!(
        run.msg().contains("team-a/net-a"),
        "{} {}",
        run.stdout,
        run.stderr
    );
    assert_eq!(
        c.requests_of(CNI_USER),
        vec![],
        "still nothing from the CNI process"
    );

    // SIGTERM right after an ADD: the daemon sends the status it accepted before it goes, and removes its socket.
    c.api.nad("team-a", "net-b", &nad_config("net-b", "v1"));
    let uid4 = c.selecting_pod("web4", "net-b");
    d.wait("web4 cached", |h| {
        h.cache.pods == 4 + TOKEN_POD && h.cache.nads == 1
    });
    c.add("c4", "web4", &uid4, &conf).ok();
    let mut d = d;
    terminate(&d);
    let exit = exited_within(&mut d, Duration::from_secs(10), "stop on SIGTERM");
    assert!(exit.success(), "{exit:?}");
    assert!(!d.socket.exists(), "socket left behind");
    assert_eq!(status_of(&c.api, "web4").len(), 2);

    // DEL never asks the daemon (nor the API: it runs from the attachment cache).
    drop(d);
    for (id, pod, uid) in [("c1", "web", &uid), ("c2", "web2", &uid2)] {
        c.sb.run("DEL", id, &pod_args(pod, uid), &conf).ok();
    }
    assert_eq!(c.requests_of(CNI_USER), vec![]);
}

#[test]
fn a_pod_the_cache_cannot_answer_is_read_by_the_daemon_not_the_cni_process() {
    let c = cluster(&[]);
    c.api.nad("team-a", "net-a", &nad_config("net-a", "v1"));
    let uid = c.selecting_pod("web", "net-a");
    // Listed at start-up, this pod is served from the cache.
    let d = c.daemon(&["--pod-wait-ms", "50"]);
    d.wait("synced", |h| {
        plexus_tests::plexus::settled(h) && h.cache.pods == 1 + TOKEN_POD
    });
    let conf = c.conf(json!({"timeoutMs": 5000}));
    c.add("c1", "web", &uid, &conf).ok();
    assert_eq!(d.health().unwrap().api_reads, 0);
    // The kube source's `"events": false` holds in daemon mode too: the daemon posts none.
    let events = |c: &Cluster| {
        c.requests_of(PLEXUS_USER)
            .into_iter()
            .filter(|(verb, uri)| verb == "create" && uri.contains("/events"))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while events(&c) < 1 {
        assert!(
            Instant::now() < deadline,
            "the daemon posted no event for c1"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut quiet = conf.clone();
    quiet["cluster"]["events"] = json!(false);
    c.add("c3", "web", &uid, &quiet).ok();
    d.wait("c3's status written", |h| {
        h.status_writes == 2 && h.pending_writes == 0
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(events(&c), 1, "an event was posted with events off");
    // A UID the cache does not have (the pod recreated under the same name, and the watch not there yet): the
    // daemon waits for the event, then reads the API once and answers its verdict, which the ADD reports.
    let run = c.add("c2", "web", "not-the-uid", &conf);
    assert!(
        run.msg().contains("has uid") && run.msg().contains("not-the-uid"),
        "{}",
        run.stdout
    );
    assert_eq!(d.health().unwrap().api_reads, 1);
    let daemon_gets: Vec<_> = c
        .requests_of(PLEXUS_USER)
        .into_iter()
        .filter(|(verb, _)| verb == "get")
        .collect();
    assert_eq!(daemon_gets.len(), 1, "{daemon_gets:?}");
    assert!(daemon_gets[0]
        .1
        .starts_with("/api/v1/namespaces/team-a/pods/web"));
    assert_eq!(c.requests_of(CNI_USER), vec![]);
}

#[test]
fn the_daemon_relists_after_410_gone() {
    // Without the API server's watch cache, a watch resumed from a compacted resourceVersion gets etcd's
    // verdict, 410 Gone, as a busy cluster gives it.
    let c = cluster(&["--watch-cache=false"]);
    c.api.nad("team-a", "old", &nad_config("old", "v1"));
    let d = c.daemon(&["--watch-timeout-secs", "1"]);
    let first = d.wait("synced", |h| {
        plexus_tests::plexus::settled(h) && h.cache.nads == 1
    });
    assert_eq!((first.cache.pod_lists, first.cache.nad_lists), (1, 1));

    // Freeze the daemon past its watches' timeout, change things, compact etcd's history, thaw it: its
    // watches resume from a resourceVersion that no longer exists.
    let pid = d.child.id().to_string();
    Command::new("kill").args(["-STOP", &pid]).status().unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    c.api.must(
        "DELETE",
        "/apis/k8s.cni.cncf.io/v1/namespaces/team-a/network-attachment-definitions/old",
        None,
    );
    c.api.nad("team-a", "new", &nad_config("new", "v1"));
    c.api.pod("team-a", "p", NODE, json!({}));
    c.api.compact();
    Command::new("kill").args(["-CONT", &pid]).status().unwrap();

    let h = d.wait("relisted", |h| {
        h.cache.nad_lists >= 2
            && h.cache.pod_lists >= 2
            && h.cache.nads == 1
            && h.cache.pods == 1 + TOKEN_POD
    });
    assert!(plexus_tests::plexus::settled(&h));
    let log = std::fs::read_to_string(&d.log).unwrap();
    // The API server's 410 Gone (reason Expired), then a fresh list.
    assert!(
        log.contains("watch failed") && log.contains("too old"),
        "{log}"
    );
    // The cache answers as the API does now: `old` is gone, `new` is there.
    assert!(matches!(nad_answer(&d, "new"), Answer::Nad { .. }));
    assert!(matches!(nad_answer(&d, "old"), Answer::Failed { .. }));
}

#[test]
fn without_an_answer_in_time_the_cni_process_reads_the_api_itself() {
    let c = cluster(&[]);
    c.api.nad("team-a", "net-a", &nad_config("net-a", "v1"));
    let uid = c.selecting_pod("web", "net-a");
    let conf = c.conf(json!({"timeoutMs": 300}));

    // No daemon at all.
    c.add("c1", "web", &uid, &conf).ok();
    let reads = |c: &Cluster| {
        c.requests_of(CNI_USER)
            .into_iter()
            .filter(|(verb, _)| verb == "get")
            .count()
    };
    assert_eq!(reads(&c), 2, "pod and NAD, read by the CNI process");

    // A daemon that accepts and never answers (hung): the ADD waits 300 ms once, then goes thin.
    std::fs::create_dir_all(c.sb.path("run")).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(c.socket()).unwrap();
    listener.set_nonblocking(true).unwrap();
    let started = Instant::now();
    c.add("c2", "web", &uid, &conf).ok();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(reads(&c), 4);
    // What reached the hung daemon's socket, by connection: the ADD's questions (one connection: one wait),
    // and the report it left after answering, which it did not wait for.
    let taken = |listener: &std::os::unix::net::UnixListener| -> Vec<String> {
        let mut sent = Vec::new();
        while let Ok((mut conn, _)) = listener.accept() {
            use std::io::Read;
            conn.set_nonblocking(true).unwrap();
            let mut text = String::new();
            let _ = conn.read_to_string(&mut text);
            sent.push(text);
        }
        sent
    };
    let sent = taken(&listener);
    assert_eq!(
        sent.len(),
        2,
        "one wait per ADD, not one per object: {sent:?}"
    );
    assert!(sent[0].contains("\"op\":\"pod\""), "{sent:?}");
    assert!(
        sent[1].starts_with("{\"op\":\"report\"") && sent[1].contains("\"command\":\"ADD\""),
        "{sent:?}"
    );

    // DEL asks the daemon nothing; it only leaves its report, without waiting for the daemon to take it.
    let args =
        format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=web;K8S_POD_UID={uid}");
    c.sb.run("DEL", "c2", &args, &conf).ok();
    let sent = taken(&listener);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(
        sent[0].starts_with("{\"op\":\"report\"") && sent[0].contains("\"command\":\"DEL\""),
        "{sent:?}"
    );
    drop(listener);
    std::fs::remove_file(c.socket()).unwrap();

    // A daemon whose API server is unreachable never syncs: it answers `unsynced`, the ADD goes thin.
    let dead = c.sb.path("dead.kubeconfig");
    let text = std::fs::read_to_string(c.sb.path("daemon.kubeconfig"))
        .unwrap()
        .replace(&format!("127.0.0.1:{}", c.api.port), "127.0.0.1:9");
    std::fs::write(&dead, text).unwrap();
    assert_eq!(health_exit(&c.socket()), 2, "no daemon answers");
    let d = c.daemon_with(&dead, &[]);
    let h = d.wait("serving, with failed watches", |h| h.cache.watch_errors > 0);
    assert!(!h.synced());
    c.add("c3", "web", &uid, &conf).ok();
    assert_eq!(reads(&c), 6);
    // The node says so: CNI STATUS is "not available" (50) and the daemon's health check fails, so the runtime
    // holds new sandboxes back instead of sending them all to the API in thin mode.
    assert_eq!(health_exit(&c.socket()), 1);
    let mut status_conf = conf.clone();
    status_conf["cniVersion"] = json!("1.1.0");
    let run = c.sb.run("STATUS", "", "", &status_conf);
    assert_eq!(run.code(), 50, "{}", run.stdout);
    assert!(
        run.msg().contains("has not synced its caches"),
        "{}",
        run.msg()
    );
}

/// `plexus daemon --health`'s exit code.
/// SIGTERM to the daemon, as the kubelet stops its pod.
fn terminate(d: &NodeDaemon) {
    Command::new("kill")
        .args(["-TERM", &d.child.id().to_string()])
        .status()
        .unwrap();
}

/// How the daemon exited, which it must within `limit` (`what` says what it failed to do).
fn exited_within(d: &mut NodeDaemon, limit: Duration, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = d.child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "the daemon did not {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn health_exit(socket: &Path) -> i32 {
    Command::new(plexus_bin())
        .args(["daemon", "--health", "--socket"])
        .arg(socket)
        .output()
        .unwrap()
        .status
        .code()
        .unwrap()
}

#[test]
fn the_socket_is_root_only() {
    let c = cluster(&[]);
    // Open the way to the socket, so that only the socket's own mode stands in the way.
    for dir in [c.sb.root.path().to_path_buf(), c.sb.path("run")] {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let d = c.daemon(&[]);
    d.wait("serving", |_| true);
    let meta = std::fs::metadata(&d.socket).unwrap();
    assert_eq!(meta.uid(), 0);
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // An unprivileged process cannot connect.
    let script = format!(
        "import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect({:?})\n    print('connected')\nexcept PermissionError:\n    print('refused')\n",
        d.socket.display().to_string()
    );
    let out = as_nobody("/usr/bin/python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "refused",
        "{out:?}"
    );
}

/// The `key=value` pairs of a request URI's query.
fn query(uri: &str) -> Vec<(String, String)> {
    uri.split_once('?')
        .map(|(_, q)| q)
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.replace("%3D", "=")))
        .collect()
}

#[test]
fn the_daemons_watches_are_node_scoped_and_resume_from_bookmarks() {
    let c = cluster(&[]);
    let d = c.daemon(&["--watch-timeout-secs", "5"]);
    d.wait("synced", plexus_tests::plexus::settled);
    // Pods of another node change while the daemon's pod watch is open: it sees none of them (field selector),
    // but the API server's bookmarks carry the newer resourceVersion, from which the renewed watch resumes.
    for i in 0..3 {
        c.api
            .pod("team-a", &format!("other-{i}"), "node2", json!({}));
    }
    let pod_watches = |c: &Cluster| -> Vec<Vec<(String, String)>> {
        c.requests_of(PLEXUS_USER)
            .into_iter()
            .filter(|(verb, uri)| verb == "watch" && uri.starts_with("/api/v1/pods"))
            .map(|(_, uri)| query(&uri))
            .collect()
    };
    let get = |q: &[(String, String)], k: &str| {
        q.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let rv = |q: &[(String, String)]| get(q, "resourceVersion").parse::<u64>().unwrap();
    // The API server sends a bookmark when it chooses (2 s before a watch times out, on a one-second tick, or once a minute), so a renewal may
    // resume from where the last one started; within a few renewals one resumes from a bookmark's newer version.
    let deadline = Instant::now() + Duration::from_secs(30);
    let watches = loop {
        let watches = pod_watches(&c);
        if watches.len() >= 2 && watches[1..].iter().any(|q| rv(q) > rv(&watches[0])) {
            break watches;
        }
        assert!(
            Instant::now() < deadline,
            "no renewed watch resumed from a bookmark's resourceVersion: {watches:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    for q in &watches {
        assert_eq!(get(q, "fieldSelector"), format!("spec.nodeName={NODE}"));
        assert_eq!(get(q, "allowWatchBookmarks"), "true");
    }
    let h = d.health().unwrap();
    assert_eq!(
        (h.cache.pods, h.cache.pod_lists),
        (TOKEN_POD, 1),
        "no other node's pod, no relist: {h:?}"
    );
}

/// `setpriv` as uid/gid 65534 (nobody), no supplementary groups.
fn as_nobody(program: &str) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", program]);
    cmd
}

#[test]
fn an_unprivileged_user_cannot_keep_the_daemon_from_starting() {
    let c = cluster(&[]);
    let run = c.sb.path("run");
    std::fs::create_dir_all(&run).unwrap();
    for dir in [c.sb.root.path().to_path_buf(), run.clone()] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // A lock file as earlier versions left it (0644), which anyone may open and flock: nobody holds it.
    let lock = run.join("daemon.lock");
    std::fs::write(&lock, "").unwrap();
    std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut holder = as_nobody("flock")
        .args(["--shared", "--nonblock"])
        .arg(&lock)
        .args(["sleep", "120"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        holder.try_wait().unwrap().is_none(),
        "nobody could flock the old lock file"
    );

    let d = c.daemon(&[]);
    d.wait("serving despite the held lock", |_| true);
    let meta = std::fs::symlink_metadata(&lock).unwrap();
    assert!(meta.is_file());
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o600));
    // Nobody can open the new one, so nobody can hold it.
    let out = as_nobody("flock")
        .args(["--shared", "--nonblock"])
        .arg(&lock)
        .arg("true")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let _ = holder.kill();
    let _ = holder.wait();
    drop(d);

    // A symlink in its place is not followed (it would let the daemon be made to create or lock any file).
    let target = c.sb.path("not-a-lock");
    std::fs::write(&target, "keep").unwrap();
    let _ = std::fs::remove_file(&lock);
    std::os::unix::fs::symlink(&target, &lock).unwrap();
    let d = c.daemon(&[]);
    d.wait("serving", |_| true);
    assert!(std::fs::symlink_metadata(&lock).unwrap().is_file());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    drop(d);

    // A run directory others may write into is refused, with its reason.
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut d = c.daemon(&[]);
    let status = d.child.wait().unwrap();
    assert_eq!(status.code(), Some(1));
    let log = std::fs::read_to_string(&d.log).unwrap();
    assert!(log.contains("lets others write into it"), "{log}");
}

/// The wiring of the socket's connections; the idle timeout itself is timed in process (daemon::server_tests).
#[test]
fn a_connection_carries_requests_in_turn_and_a_non_request_ends_it() {
    use std::io::{BufRead, BufReader, Write};
    let c = cluster(&[]);
    let d = c.daemon(&[]);
    d.wait("synced", plexus_tests::plexus::settled);
    let stream = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(40)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let line = |r: &mut BufReader<std::os::unix::net::UnixStream>| {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        l
    };
    let health = format!("{}\n", serde_json::to_string(&Request::Health).unwrap());
    for _ in 0..3 {
        writer.write_all(health.as_bytes()).unwrap();
        let answer: Answer = serde_json::from_str(&line(&mut reader)).unwrap();
        assert!(matches!(answer, Answer::Health(_)), "{answer:?}");
    }
    // A request that is not one ends the connection at once.
    let stream = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    writer.write_all(b"{\"not\": \"a request\"}\n").unwrap();
    assert_eq!(line(&mut reader), "");

    // A CNI process sends its report and exits without reading the answer: the daemon's next read meets a reset
    // connection. That is how every daemon-mode invocation ends, not a fault: no warning.
    let report = Request::Report {
        report: plexus_cni::daemon::proto::Report {
            command: "ADD".into(),
            result: "success".into(),
            seconds: 0.01,
            delegates: vec![],
            hooks: vec![],
        },
    };
    for _ in 0..5 {
        let mut stream = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
        let line = format!("{}\n", serde_json::to_string(&report).unwrap());
        stream.write_all(line.as_bytes()).unwrap();
        // The answer arrives and stays unread; then the process is gone.
        std::thread::sleep(Duration::from_millis(200));
    }
    let health = d.health().unwrap();
    assert!(health.in_flight <= 1, "{health:?}");
    std::thread::sleep(Duration::from_millis(300));
    let log = std::fs::read_to_string(&d.log).unwrap();
    // The malformed request above is one; the reports none.
    assert_eq!(log.matches("bad request").count(), 1, "{log}");
    assert!(!log.contains("reset by peer"), "{log}");
}

#[test]
fn the_nad_cache_keeps_only_what_planning_reads() {
    let c = cluster(&[]);
    let config = nad_config("net-a", "v1");
    // As `kubectl apply` leaves it: the whole object again in an annotation.
    let last_applied = json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "net-a", "namespace": "team-a"}, "spec": {"config": config.to_string()}});
    c.api.create(&json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "net-a", "namespace": "team-a", "annotations": {
            "kubectl.kubernetes.io/last-applied-configuration": last_applied.to_string(),
            "k8s.v1.cni.cncf.io/resourceName": "example.com/nic"}},
        "spec": {"config": config.to_string()}
    }));
    let d = c.daemon(&[]);
    d.wait("NAD cached", |h| {
        plexus_tests::plexus::settled(h) && h.cache.nads == 1
    });
    let Answer::Nad { nad } = nad_answer(&d, "net-a") else {
        panic!("no NAD answer")
    };
    assert_eq!(
        nad.annotations.keys().collect::<Vec<_>>(),
        vec!["k8s.v1.cni.cncf.io/resourceName"]
    );
    assert!(nad.config.unwrap().contains("secondary-plugin"));
}

/// The files of the daemon's status queue (beside the socket).
/// `plexus status ARGS...` for the cluster's node files and daemon socket: its stdout.
fn node_status(c: &Cluster, args: &[&str]) -> String {
    let out = Command::new(plexus_bin())
        .arg("status")
        .arg("--socket")
        .arg(c.socket())
        .arg("--cache-dir")
        .arg(c.sb.path("cache"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn queued(c: &Cluster) -> Vec<PathBuf> {
    std::fs::read_dir(c.sb.path("run/status-queue"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// `--kube-api-qps` and `--kube-api-status-qps`: a burst of ADDs on one node reaches the API server no faster than
/// the limits allow (the buckets' own timing is tested in process, plexus-cluster's ratelimit), and every status
/// write still arrives.
#[test]
fn with_a_low_api_qps_a_burst_of_adds_is_written_no_faster_and_all_of_it() {
    const PODS: usize = 6;
    let c = cluster(&[]);
    c.api.nad("team-a", "net-a", &nad_config("net-a", "v1"));
    let pods: Vec<(String, String)> = (0..PODS)
        .map(|i| {
            let name = format!("web{i}");
            let uid = c.selecting_pod(&name, "net-a");
            (name, uid)
        })
        .collect();
    let d = c.daemon(&[
        "--kube-api-qps",
        "2",
        "--kube-api-burst",
        "1",
        "--kube-api-status-qps",
        "2",
        "--kube-api-status-burst",
        "1",
    ]);
    // The DRA caches too (the server serves resource.k8s.io/v1, and at 2 requests a second their lists come last):
    // until they are synced the daemon leaves a pod's claims, and so its writes, to the CNI process.
    d.wait("synced with the pods", |h| {
        plexus_tests::plexus::settled(h) && h.cache.pods == PODS + TOKEN_POD && h.cache.dra_synced
    });
    let conf = c.conf(json!({}));
    for (i, (name, uid)) in pods.iter().enumerate() {
        let run = c.add(&format!("c{i}"), name, uid, &conf);
        assert!(run.success, "{}", run.stdout);
    }
    d.wait("every write taken", |h| {
        h.status_writes == PODS as u64 && h.pending_writes == 0
    });
    let mut sent: Vec<k8s_openapi::jiff::Timestamp> = c
        .api
        .audit_entries()
        .into_iter()
        .filter(|e| {
            e["user"]["username"] == DAEMON_USER
                && e["verb"] == "patch"
                && e["requestURI"].as_str().is_some_and(|u| {
                    u.contains("/namespaces/team-a/pods/") && u.contains("/status")
                })
        })
        .map(|e| {
            e["requestReceivedTimestamp"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    sent.sort();
    assert_eq!(sent.len(), PODS, "{sent:?}");
    // Six status writes at 2 a second (their own budget; the events take theirs): at least 2 s from the second to
    // the last (the first's time at the server includes its connection's set-up, so it is not counted), unlimited
    // they would take milliseconds. The bound leaves half a second for the second write's own delay.
    let span = sent[PODS - 1].duration_since(sent[1]);
    assert!(
        span >= k8s_openapi::jiff::SignedDuration::from_millis(1500),
        "{span:?}: {sent:?}"
    );
}

#[test]
fn a_status_write_accepted_during_a_long_api_outage_is_written_when_it_ends() {
    let c = cluster(&[]);
    c.api.nad("team-a", "net-a", &nad_config("net-a", "v1"));
    let uid = c.selecting_pod("web", "net-a");
    let d = c.daemon(&[]);
    d.wait("synced with the pod", |h| {
        plexus_tests::plexus::settled(h) && h.cache.pods == 1 + TOKEN_POD
    });
    let conf = c.conf(json!({"timeoutMs": 5000}));

    // The outage's length and the retries' timing are tested in process (daemon::state_tests); here, that the
    // write is kept on disk, shown, and sent when the API server answers again.
    c.api.pause();
    c.add("c1", "web", &uid, &conf).ok();
    let h = d.wait("the write kept", |h| h.pending_writes == 1);
    assert_eq!(h.status_writes, 0);
    let files = queued(&c);
    assert_eq!(files.len(), 1, "{files:?}");
    let meta = std::fs::metadata(&files[0]).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o600));
    // Root's alone: an unprivileged user cannot read what the queue holds.
    let read = as_nobody("cat").arg(&files[0]).output().unwrap();
    assert!(!read.status.success(), "{read:?}");

    // `plexus status` shows the node from its own files and the daemon, the API server being down.
    let status = node_status(&c, &["--json"]);
    let s: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(s["daemon"]["answering"], true, "{s}");
    assert_eq!(s["daemon"]["health"]["pendingWrites"], 1, "{s}");
    assert_eq!(s["pendingWrites"][0]["pod"], "team-a/web", "{s}");
    let sandbox = &s["sandboxes"][0];
    assert_eq!(
        (&sandbox["containerId"], &sandbox["pod"]),
        (&json!("c1"), &json!("team-a/web")),
        "{s}"
    );
    let interfaces: Vec<(String, String, bool)> = sandbox["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["name"].as_str().unwrap().to_string(),
                i["network"].as_str().unwrap().to_string(),
                i["attached"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        interfaces,
        vec![
            ("eth0".to_string(), "cluster-net".to_string(), true),
            ("net1".to_string(), "team-a/net-a".to_string(), true)
        ]
    );
    assert_eq!(s["problems"], json!([]), "{s}");
    let text = node_status(&c, &[]);
    assert!(
        text.contains("pending status writes: 1\n  team-a/web"),
        "{text}"
    );
    assert!(text.contains("sandboxes: 1\n  team-a/web c1"), "{text}");

    c.api.resume();
    d.wait("written after the outage", |h| {
        h.status_writes == 1 && h.pending_writes == 0
    });
    assert_eq!(
        status_of(&c.api, "web"),
        vec![
            ("cluster-net".to_string(), "eth0".to_string()),
            ("team-a/net-a".to_string(), "net1".to_string())
        ]
    );
    assert!(queued(&c).is_empty());
}

/// A daemon told to stop while the API server does not answer drains its writes for a while (then keeps them on
/// disk for the next run). From the signal on, its socket is gone: an ADD meanwhile finds no daemon and plans by
/// itself at once, rather than wait in the backlog of a listener nobody accepts on any more.
#[test]
fn a_stopping_daemon_removes_its_socket_before_it_drains() {
    let c = cluster(&[]);
    c.api.nad("team-a", "net-a", &nad_config("net-a", "v1"));
    let uid = c.selecting_pod("web", "net-a");
    let mut d = c.daemon(&[]);
    d.wait("synced with the pod", |h| {
        plexus_tests::plexus::settled(h) && h.cache.pods == 1 + TOKEN_POD
    });
    let conf = c.conf(json!({"timeoutMs": 5000}));
    c.api.pause();
    c.add("c1", "web", &uid, &conf).ok();
    d.wait("the write kept", |h| h.pending_writes == 1);

    terminate(&d);
    let deadline = Instant::now() + Duration::from_secs(2);
    while d.socket.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!d.socket.exists(), "the socket is still there");
    assert!(
        d.child.try_wait().unwrap().is_none(),
        "not draining: already gone"
    );
    let exit = exited_within(&mut d, Duration::from_secs(15), "stop after its drain");
    assert!(exit.success(), "{exit:?}");
    assert_eq!(queued(&c).len(), 1, "the write kept for the next run");
    c.api.resume();
}

#[test]
fn status_writes_pending_at_a_kill_are_sent_by_the_next_run() {
    let c = cluster(&[]);
    c.api.nad("team-a", "net-a", &nad_config("net-a", "v1"));
    let pods: Vec<(String, String)> = ["p1", "p2", "p3"]
        .iter()
        .map(|p| (p.to_string(), c.selecting_pod(p, "net-a")))
        .collect();
    let mut d = c.daemon(&[]);
    d.wait("synced with the pods", |h| {
        plexus_tests::plexus::settled(h) && h.cache.pods == 3 + TOKEN_POD
    });
    let conf = c.conf(json!({"timeoutMs": 5000}));
    c.api.pause();
    for (i, (pod, uid)) in pods.iter().enumerate() {
        c.add(&format!("c{i}"), pod, uid, &conf).ok();
    }
    d.wait("three writes kept", |h| h.pending_writes == 3);
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    assert_eq!(queued(&c).len(), 3);
    c.api.resume();
    // p3 is deleted meanwhile: its write is dropped, not retried for ever.
    c.api
        .must("DELETE", "/api/v1/namespaces/team-a/pods/p3", None);

    let d = c.daemon(&[]);
    d.wait("the kept writes sent", |h| h.pending_writes == 0);
    for pod in ["p1", "p2"] {
        assert_eq!(
            status_of(&c.api, pod).len(),
            2,
            "{pod} has its network-status"
        );
    }
    assert!(queued(&c).is_empty());
    let log = std::fs::read_to_string(&d.log).unwrap();
    assert!(
        log.contains("sending status writes kept by an earlier run"),
        "{log}"
    );
}

#[test]
fn a_failing_first_install_stops_the_daemon_only_after_its_writes_are_kept() {
    let c = cluster(&[]);
    c.api.nad("team-a", "net-a", &nad_config("net-a", "v1"));
    let uid = c.selecting_pod("web", "net-a");
    // No cluster network conf ever appears in this conf dir: the first install gives up after 8 s.
    let empty = c.sb.path("node-net.d");
    std::fs::create_dir_all(&empty).unwrap();
    let conf_dir = format!("--conf-dir={}", empty.display());
    let bin_dir = format!("--bin-dir={}", c.sb.path("node-bin").display());
    let mut d = c.daemon(&[
        "--install",
        &conf_dir,
        &bin_dir,
        "--cni-bin-source=/bin/true",
        "--timeout=8s",
    ]);
    d.wait("synced", |h| {
        plexus_tests::plexus::settled(h) && h.cache.pods == 1 + TOKEN_POD
    });
    c.api.pause();
    c.add("c1", "web", &uid, &c.conf(json!({"timeoutMs": 5000})))
        .ok();
    let status = d.child.wait().unwrap();
    assert_eq!(status.code(), Some(1));
    let log = std::fs::read_to_string(&d.log).unwrap();
    assert!(log.contains("install: no cluster network conf"), "{log}");
    assert!(log.contains("kept, sent by the next run"), "{log}");
    assert_eq!(queued(&c).len(), 1);

    c.api.resume();
    let d = c.daemon(&[]);
    d.wait("the kept write sent", |h| {
        h.status_writes == 1 && h.pending_writes == 0
    });
    assert_eq!(status_of(&c.api, "web").len(), 2);
}

/// `kubectl delete ds plexus` leaves the conflist, the binary and the kubeconfig the installer wrote, whose token
/// was bound to the deleted daemon pod and is now refused. A new pod on that node then fails with an error that
/// says why (the kubelet shows it as FailedCreatePodSandBox), with nothing attached: it is never started with
/// the cluster network alone while it selects NADs.
#[test]
fn a_node_left_by_a_deleted_daemonset_fails_new_pods_naming_why() {
    let c = cluster(&[]);
    c.api.nad("team-a", "net-a", &nad_config("net-a", "v1"));
    let uid = c.selecting_pod("web", "net-a");
    let revoked = c.sb.path("revoked.kubeconfig");
    c.api.write_kubeconfig(&revoked, "token-of-a-deleted-pod");
    // It waits this long for a new token (a rolling update's next pod writes one), and none comes.
    let conf = c.sb.conf(json!({
        "cluster": {"source": "kube", "kubeconfig": revoked, "deadlineMs": 5000, "retries": 1,
                    "credentialsWaitMs": 1000},
    }));
    // No daemon answers on the node any more.
    assert!(!c.socket().exists());
    let started = std::time::Instant::now();
    let run = c.add("c1", "web", &uid, &conf);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "it waited for new credentials"
    );
    assert_eq!(run.code(), 5, "{}", run.stdout);
    let msg = run.msg();
    assert!(msg.contains("401 Unauthorized"), "{msg}");
    // It names the file and the step that was skipped.
    assert!(
        msg.contains(&revoked.display().to_string()) && msg.contains("plexus install --uninstall"),
        "{msg}"
    );
    assert!(
        c.sb.calls().iter().all(|call| call.command != "ADD"),
        "no delegate ran: {:?}",
        c.sb.call_summary()
    );
}

/// One HTTP GET to `127.0.0.1:port` (bounded): the status line, the headers and the body.
fn http_get(port: u16, path: &str, accept: Option<&str>) -> (String, String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: node\r\n{accept}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.take(16 << 20).read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let (status, headers) = head.split_once("\r\n").unwrap();
    (
        status.to_string(),
        headers.to_ascii_lowercase(),
        body.to_string(),
    )
}

/// The value of the sample whose line starts with `series` (name and labels, as written).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
}

#[test]
fn the_metrics_endpoint_counts_what_the_daemon_did_and_passes_promtool() {
    let c = cluster(&[]);
    let port = plexus_tests::kubeapi::free_port();
    let d = c.daemon(&["--metrics-bind-address", &format!("127.0.0.1:{port}")]);
    d.wait("synced", plexus_tests::plexus::settled);
    c.api.nad("team-a", "net-a", &nad_config("net-a", "v1"));
    let uid = c.selecting_pod("web", "net-a");
    d.wait("pod and NAD cached", |h| {
        h.cache.pods == 1 + TOKEN_POD && h.cache.nads == 1
    });

    let (status, headers, before) = http_get(port, "/metrics", None);
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        headers.contains("content-type: text/plain; version=0.0.4"),
        "{headers}"
    );
    assert_eq!(
        sample(&before, "plexus_status_writes_total{result=\"success\"}").unwrap_or(0.0),
        0.0
    );

    let mut conf = c.conf(json!({"timeoutMs": 5000}));
    conf["hooks"] = json!([{"name": "isolation", "kind": "policy",
        "module": plexus_tests::plexus::guest_wasm("namespace-isolation")}]);
    c.add("c1", "web", &uid, &conf).ok();
    d.wait("status written", |h| h.status_writes == 1);
    // Two failed ADDs (a NAD that does not exist; a selection the policy hook denies) and a DEL: each CNI
    // process reports after answering.
    let uid2 = c.selecting_pod("broken", "missing-net");
    let missing = c.add("c2", "broken", &uid2, &conf).code();
    let uid3 = c.selecting_pod("intruder", "team-b/foreign");
    let denied = c.add("c3", "intruder", &uid3, &conf);
    assert!(denied.msg().contains("\"isolation\""), "{}", denied.msg());
    let denied = denied.code();
    c.sb.run("DEL", "c1", &pod_args("web", &uid), &conf).ok();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let text = loop {
        let (_, _, text) = http_get(port, "/metrics", None);
        if sample(
            &text,
            "plexus_cni_operations_total{command=\"DEL\",result=\"success\"}",
        )
        .is_some()
            || std::time::Instant::now() > deadline
        {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let get =
        |series: &str| sample(&text, series).unwrap_or_else(|| panic!("no {series} in:\n{text}"));
    assert_eq!(
        get("plexus_cni_operations_total{command=\"ADD\",result=\"success\"}"),
        1.0
    );
    let failed = |code: u64| {
        get(&format!(
            "plexus_cni_operations_total{{command=\"ADD\",result=\"{code}\"}}"
        ))
    };
    let failures = if missing == denied {
        failed(missing)
    } else {
        failed(missing) + failed(denied)
    };
    assert_eq!(failures, 2.0);
    // The policy hook admitted web's and broken's selections and denied intruder's.
    assert_eq!(
        get("plexus_hook_calls_total{hook=\"isolation\",kind=\"policy\",outcome=\"allow\"}"),
        2.0
    );
    assert_eq!(
        get("plexus_hook_calls_total{hook=\"isolation\",kind=\"policy\",outcome=\"deny\"}"),
        1.0
    );
    assert_eq!(
        get("plexus_cni_operations_total{command=\"DEL\",result=\"success\"}"),
        1.0
    );
    assert_eq!(
        get("plexus_cni_operation_duration_seconds_count{command=\"ADD\"}"),
        3.0
    );
    // The successful ADD ran the cluster network's plugin and the NAD's; the DEL ran both again. The failed
    // ADD failed while planning, before any delegate ran.
    for (plugin, command) in [
        ("cluster-plugin", "ADD"),
        ("secondary-plugin", "ADD"),
        ("cluster-plugin", "DEL"),
        ("secondary-plugin", "DEL"),
    ] {
        assert_eq!(
            get(&format!("plexus_delegate_operations_total{{plugin=\"{plugin}\",command=\"{command}\",result=\"success\"}}")),
            1.0
        );
    }
    let get =
        |series: &str| sample(&text, series).unwrap_or_else(|| panic!("no {series} in:\n{text}"));
    assert_eq!(get("plexus_status_writes_total{result=\"success\"}"), 1.0);
    assert_eq!(get("plexus_status_writes_pending"), 0.0);
    assert_eq!(
        get("plexus_cache_objects{resource=\"pods\"}"),
        (3 + TOKEN_POD) as f64,
        "web, broken, intruder and the token's pod"
    );
    assert_eq!(
        get("plexus_cache_objects{resource=\"networkattachmentdefinitions\"}"),
        1.0
    );
    assert_eq!(get("plexus_watch_restarts_total{resource=\"pods\"}"), 0.0);
    assert_eq!(get("plexus_daemon_requests_shed_total"), 0.0);
    // The daemon's own API requests, by verb, resource and code: the lists and watches of its caches, the
    // status write, the AddedInterface event.
    assert!(get("plexus_api_requests_total{verb=\"list\",resource=\"pods\",code=\"200\"}") >= 1.0);
    assert!(get("plexus_api_requests_total{verb=\"watch\",resource=\"network-attachment-definitions\",code=\"200\"}") >= 1.0);
    assert_eq!(
        get("plexus_api_requests_total{verb=\"patch\",resource=\"pods/status\",code=\"200\"}"),
        1.0
    );
    assert!(get("process_resident_memory_bytes") > 1e6);
    assert!(get("process_open_fds") > 3.0);
    // The audit log agrees with the daemon about its status writes.
    let patches = c
        .requests_of(PLEXUS_USER)
        .iter()
        .filter(|(verb, uri)| verb == "patch" && uri.contains("/pods/web/status"))
        .count();
    assert_eq!(patches, 1);

    // Each failed ADD left a Warning event on its pod naming the network and the cause (sent by the daemon).
    let warned = |pod: &str| -> Vec<String> {
        c.api.must("GET", "/api/v1/namespaces/team-a/events", None)["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["reason"] == "NetworkAttachFailed" && e["involvedObject"]["name"] == pod)
            .map(|e| {
                assert_eq!(e["type"], "Warning");
                e["message"].as_str().unwrap().to_string()
            })
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while (warned("broken").is_empty() || warned("intruder").is_empty())
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        warned("broken")[0].contains("team-a/missing-net"),
        "{:?}",
        warned("broken")
    );
    assert!(
        warned("intruder")[0].contains("isolation")
            && warned("intruder")[0].contains("team-b/foreign"),
        "{:?}",
        warned("intruder")
    );
    assert!(
        warned("web").is_empty(),
        "the ADD that succeeded left no warning"
    );
    // Thin mode too: the CNI process posts it itself.
    let before = c.requests_of(CNI_USER).len();
    let mut thin = c.conf(json!(false));
    thin["hooks"] = conf["hooks"].clone();
    c.add("c4", "intruder", &uid3, &thin).code();
    assert!(
        c.requests_of(CNI_USER)[before..]
            .iter()
            .any(|(verb, uri)| verb == "create" && uri.contains("/events")),
        "{:?}",
        c.requests_of(CNI_USER)
    );

    // Prometheus's own checker takes the classic format as served.
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package) must be installed: tests/setup.sh");
    use std::io::Write;
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // OpenMetrics for a scraper that asks for it; nothing but /metrics.
    let (_, headers, om) = http_get(
        port,
        "/metrics",
        Some("application/openmetrics-text; version=1.0.0"),
    );
    assert!(
        headers.contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{headers}"
    );
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(om.contains("# TYPE plexus_status_writes counter\n"), "{om}");
    let (status, _, _) = http_get(port, "/", None);
    assert_eq!(status, "HTTP/1.1 404 Not Found");
}

#[test]
fn a_metrics_address_in_use_does_not_stop_the_daemon() {
    let c = cluster(&[]);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let d = c.daemon(&["--metrics-bind-address", &format!("127.0.0.1:{port}")]);
    // It serves the CNI process all the same, and says why there are no metrics.
    d.wait("synced", plexus_tests::plexus::settled);
    let said = |d: &NodeDaemon| {
        let log = std::fs::read_to_string(&d.log).unwrap_or_default();
        log.lines()
            .any(|l| l.contains(&format!("127.0.0.1:{port}")) && l.contains("metrics"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !said(&d) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        said(&d),
        "{}",
        std::fs::read_to_string(&d.log).unwrap_or_default()
    );
    // Once the address is free, the endpoint comes up (the daemon tries again).
    drop(taken);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no metrics endpoint after the address was freed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (status, _, _) = http_get(port, "/metrics", None);
    assert_eq!(status, "HTTP/1.1 200 OK");
}

/// The pod's events of `reason`, their messages.
fn events_of(api: &KubeApiServer, pod: &str, reason: &str) -> Vec<String> {
    api.events_of("team-a", pod, reason)
        .into_iter()
        .map(|(_, message)| message)
        .collect()
}

/// Sets the pod's selection annotation (`None`: removes it), as `kubectl annotate --overwrite` does.
fn annotate(api: &KubeApiServer, pod: &str, networks: Option<&str>) {
    api.must(
        "PATCH",
        &format!("/api/v1/namespaces/team-a/pods/{pod}"),
        Some(&json!({"metadata": {"annotations": {"k8s.v1.cni.cncf.io/networks": networks}}})),
    );
}

/// Waits (at most 20 s) until `ok` holds; how long it took.
#[track_caller]
fn within_20s(what: &str, d: &NodeDaemon, ok: impl Fn() -> bool) -> Duration {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{what}: not within 20 s; daemon log:\n{}",
            std::fs::read_to_string(&d.log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

#[test]
fn dynamic_networks_follow_the_annotation_of_a_running_pod_in_a_real_namespace() {
    use plexus_tests::netns::{
        bridge_host_local, cni_bin_dir, require_root_and_plugins, HostBridge, IpamDir, NetNs,
    };
    require_root_and_plugins();
    let c = cluster(&[]);
    let ns = NetNs::new("hotplug");
    let ipam = IpamDir::new();
    let (br_a, br_b) = (HostBridge::reserve("hpa"), HostBridge::reserve("hpb"));
    let net_a = bridge_host_local("net-a", &br_a, &ipam);
    let net_b = bridge_host_local("net-b", &br_b, &ipam);
    let subnet_b = net_b["plugins"][0]["ipam"]["ranges"][0][0]["subnet"]
        .as_str()
        .unwrap()
        .to_string();
    c.api.nad("team-a", "net-a", &net_a);
    c.api.nad("team-a", "net-b", &net_b);
    c.api.namespace("team-b");
    c.api.nad("team-b", "net-c", &net_b);
    let port = plexus_tests::kubeapi::free_port();
    let metrics_at = format!("127.0.0.1:{port}");
    let d = c.daemon(&[
        "--dynamic-networks",
        "--metrics-bind-address",
        metrics_at.as_str(),
    ]);
    d.wait("synced", plexus_tests::plexus::settled);
    let uid = c.selecting_pod("hp", "net-a");
    let mut conf = c.conf(json!({"timeoutMs": 5000}));
    // The policy hooks: NADs of the pod's own namespace only; `start-only*` networks only when a pod starts
    // (the hook asks `host.pod-running`).
    conf["hooks"] = json!([
        {"name": "isolation", "kind": "policy",
         "module": plexus_tests::plexus::guest_wasm("namespace-isolation")},
        {"name": "start-only", "kind": "policy",
         "module": plexus_tests::plexus::guest_wasm("test-pod-running")},
    ]);
    c.api
        .nad("team-a", "start-only-x", &nad_config("start-only-x", "s"));
    let cni = |command: &str, id: &str, pod: &str, uid: &str| {
        let env: Vec<(String, String)> = [
            ("CNI_COMMAND", command.to_string()),
            ("CNI_CONTAINERID", id.to_string()),
            ("CNI_NETNS", ns.path().display().to_string()),
            ("CNI_IFNAME", "eth0".to_string()),
            (
                "CNI_PATH",
                format!("{}:{}", c.sb.path("bin").display(), cni_bin_dir()),
            ),
            ("CNI_ARGS", pod_args(pod, uid)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        c.sb.run_env(&env, conf.to_string().as_bytes())
    };
    d.wait("pod cached", |h| {
        h.cache.pods == 1 + TOKEN_POD && h.cache.nads == 4
    });
    cni("ADD", "hp1", "hp", &uid).ok();
    assert!(ns.link("net1").is_some());
    let status = |pod: &str| status_of(&c.api, pod);
    within_20s("the ADD's status", &d, || status("hp").len() == 2);

    // Added: the interface is in the pod's namespace with a host-local address, and the status lists it.
    annotate(&c.api, "hp", Some("net-a,net-b"));
    let took = within_20s("net-b attached", &d, || {
        status("hp").contains(&("team-a/net-b".into(), "net2".into()))
    });
    eprintln!("annotation change to network-status: {took:?}");
    let net2 = ns.link("net2").expect("net2 in the pod's namespace");
    let prefix = subnet_b.rsplit_once('.').unwrap().0.to_string();
    assert!(
        net2.cidrs()
            .iter()
            .any(|a| a.starts_with(&format!("{prefix}."))),
        "{:?} not in {subnet_b}",
        net2.cidrs()
    );
    assert_eq!(ipam.reserved_ips("net-b").len(), 1);
    within_20s("the NetworksChanged event", &d, || {
        events_of(&c.api, "hp", "NetworksChanged")
            .iter()
            .any(|m| m.contains("attached team-a/net-b (net2)"))
    });

    // Removed (the selection had no interface key): gone from the namespace, its address released.
    annotate(&c.api, "hp", Some("net-a"));
    within_20s("net-b detached", &d, || {
        ns.link("net2").is_none() && ipam.reserved_ips("net-b").is_empty()
    });
    within_20s("the status without net-b", &d, || status("hp").len() == 2);
    assert!(ns.link("net1").is_some(), "net-a was not touched");

    // Denied by the policy hook: nothing changes, and a Warning names the network and the cause.
    annotate(&c.api, "hp", Some("net-a,team-b/net-c"));
    within_20s("the NetworkChangeFailed event", &d, || {
        events_of(&c.api, "hp", "NetworkChangeFailed")
            .iter()
            .any(|m| m.contains("team-b/net-c") && m.contains("policy"))
    });
    let names: Vec<String> = ns.links().into_iter().map(|l| l.ifname).collect();
    assert!(!names.iter().any(|n| n == "net2"), "{names:?}");
    assert_eq!(status("hp").len(), 2);
    assert!(ipam.reserved_ips("net-b").is_empty());

    // Hooks know a change of a running pod from its ADD: the start-only network is refused now...
    annotate(&c.api, "hp", Some("net-a,start-only-x"));
    within_20s("the start-only refusal", &d, || {
        events_of(&c.api, "hp", "NetworkChangeFailed")
            .iter()
            .any(|m| m.contains("team-a/start-only-x") && m.contains("is running"))
    });
    assert_eq!(status("hp").len(), 2);

    // A delegate that fails: what the change attached first is rolled back, nothing else moves.
    let broken = json!({"cniVersion": "1.0.0", "name": "broken", "type": "no-such-plugin"});
    c.api.nad("team-a", "broken", &broken);
    annotate(&c.api, "hp", Some("net-a,net-b,broken"));
    within_20s("the failed change's event", &d, || {
        events_of(&c.api, "hp", "NetworkChangeFailed")
            .iter()
            .any(|m| m.contains("team-a/broken"))
    });
    assert!(ns.link("net2").is_none(), "net-b was rolled back");
    assert!(ipam.reserved_ips("net-b").is_empty());
    assert_eq!(status("hp").len(), 2);

    // Counted: the attach and the detach changed; the two denials and the delegate failure did not.
    let text = http_get(port, "/metrics", None).2;
    let changes = |result: &str| {
        sample(
            &text,
            &format!("plexus_network_changes_total{{result=\"{result}\"}}"),
        )
    };
    assert_eq!(
        (changes("changed"), changes("failed")),
        (Some(2.0), Some(3.0)),
        "{}",
        text.lines()
            .filter(|l| l.contains("network_changes"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // The pod's DEL tears down what is attached, hot-plugged or not; nothing is left on the node.
    annotate(&c.api, "hp", Some("net-a,net-b"));
    within_20s("net-b attached again", &d, || ns.link("net2").is_some());
    within_20s("the plan records it", &d, || {
        c.sb.cached_plan("hp1")
            .is_some_and(|p| p["runtime"]["networks"] == "net-a,net-b")
    });
    cni("DEL", "hp1", "hp", &uid).ok();
    let names: Vec<String> = ns.links().into_iter().map(|l| l.ifname).collect();
    assert_eq!(names, vec!["lo".to_string()]);
    assert!(ipam.reserved_ips("net-a").is_empty() && ipam.reserved_ips("net-b").is_empty());
    assert!(c.sb.cached().is_empty(), "{:?}", c.sb.cached());

    // ... and admitted in the ADD of a pod that starts with it.
    let uid3 = c.selecting_pod("starter", "start-only-x");
    d.wait("third pod cached", |h| h.cache.pods == 2 + TOKEN_POD);
    cni("ADD", "st1", "starter", &uid3).ok();
    cni("DEL", "st1", "starter", &uid3).ok();

    // A pod that started without a selection annotation can have one added.
    let uid2 = {
        let pod = c.api.pod("team-a", "bare", NODE, json!({}));
        pod["metadata"]["uid"].as_str().unwrap().to_string()
    };
    d.wait("second pod cached", |h| h.cache.pods == 3 + TOKEN_POD);
    cni("ADD", "bare1", "bare", &uid2).ok();
    assert!(ns.link("net1").is_none());
    annotate(&c.api, "bare", Some("net-b"));
    within_20s("net-b attached to the bare pod", &d, || {
        status("bare").contains(&("team-a/net-b".into(), "net1".into()))
    });
    assert!(ns.link("net1").is_some());
    cni("DEL", "bare1", "bare", &uid2).ok();
    assert!(ipam.reserved_ips("net-b").is_empty());
}

/// The daemon changes a sandbox only from a plan no one but root can have written (a plan names the delegates it
/// runs as root). The CNI binary writes its cache that way whatever umask the runtime gives it: here none at all.
#[test]
fn the_cni_binary_writes_its_cache_root_only_under_any_umask() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0").fakes(&["secondary-plugin"]);
    sb.pod("team-a", "p", Some("net-b"));
    sb.nad("team-a", "net-b", Some(nad_config("net-b", "b")));
    let wrapper = sb.path("plexus-umask-0");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\numask 000\nexec '{}' \"$@\"\n",
            plexus_bin().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::remove_dir_all(sb.path("cache")).unwrap();
    let conf = sb.conf(json!({"daemon": false}));
    sb.run_bin(
        &wrapper,
        "ADD",
        "c1",
        &Sandbox::pod_args("team-a", "p"),
        &conf,
    )
    .ok();
    let mut paths = vec![sb.path("cache"), sb.path("cache/attachments")];
    paths.extend(
        std::fs::read_dir(sb.path("cache/attachments"))
            .unwrap()
            .map(|e| e.unwrap().path()),
    );
    assert!(paths.len() > 2, "a plan was written: {paths:?}");
    for p in &paths {
        let mode = std::fs::symlink_metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode & 0o022, 0, "{} is {mode:o}", p.display());
    }
}

/// A daemon killed in the middle of a change leaves an addition in the plan with no result. The next daemon's
/// first look at the node repairs it: the unfinished attachment gets its DEL and leaves the plan, and the
/// change is made again, now to the end.
#[test]
fn a_change_cut_off_by_kill_9_is_repaired_and_made_again_by_the_next_daemon() {
    let c = cluster(&[]);
    c.sb.fakes(&["slow-plugin"]);
    c.api.nad("team-a", "net-a", &nad_config("net-a", "a"));
    c.api.nad(
        "team-a",
        "net-s",
        &json!({"cniVersion": "1.0.0", "name": "net-s", "type": "slow-plugin"}),
    );
    let d1 = c.daemon(&["--dynamic-networks"]);
    d1.wait("synced", plexus_tests::plexus::settled);
    let uid = c.selecting_pod("rp", "net-a");
    d1.wait("pod cached", |h| h.cache.pods == 1 + TOKEN_POD);
    let conf = c.conf(json!({"timeoutMs": 5000}));
    c.add("rp1", "rp", &uid, &conf).ok();
    within_20s("the ADD's status", &d1, || {
        status_of(&c.api, "rp").len() == 2
    });

    // The added network's delegate takes long; the daemon is killed while it runs.
    c.sb.fake_config(json!({"slow-plugin": {"ADD": {"sleepMs": 3000}}}));
    annotate(&c.api, "rp", Some("net-a,net-s"));
    let slow_calls = || {
        c.sb.call_summary()
            .into_iter()
            .filter(|(plugin, _, _)| plugin == "slow-plugin")
            .map(|(_, command, ifname)| format!("{command} {ifname}"))
            .collect::<Vec<_>>()
    };
    within_20s("the change under way", &d1, || !slow_calls().is_empty());
    drop(d1);
    let plan = c.sb.cached_plan("rp1").unwrap();
    let unfinished: Vec<&Value> = plan["attachments"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["result"].is_null())
        .collect();
    assert_eq!(
        unfinished.len(),
        1,
        "the addition is in the plan, unfinished: {plan}"
    );

    // The next daemon: DEL of what may be half-attached, then the change made again.
    c.sb.fake_config(json!({}));
    let d2 = c.daemon(&["--dynamic-networks"]);
    within_20s("net-s attached by the next daemon", &d2, || {
        status_of(&c.api, "rp").contains(&("team-a/net-s".into(), "net2".into()))
    });
    assert_eq!(slow_calls(), vec!["ADD net2", "DEL net2", "ADD net2"]);
    let plan = c.sb.cached_plan("rp1").unwrap();
    assert!(
        plan["attachments"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| !a["result"].is_null()),
        "{plan}"
    );
    assert_eq!(plan["runtime"]["networks"], "net-a,net-s");
    c.sb.run("DEL", "rp1", &pod_args("rp", &uid), &conf).ok();
    assert!(c.sb.cached().is_empty());
}

/// Big answers are bounded per object, not per stream: NADs whose list is well over 4 MiB in one namespace, and
/// over 10 MB of NAD updates through the running watch, leave the daemon synced (no watch error, no relist), an
/// ADD of a pod with a small NAD reads nothing from the API, and a NAD created afterwards is seen. One NAD over
/// the per-object bound is left out, named in the log and counted, and the rest stays synced.
#[test]
fn big_answers_are_bounded_per_object_and_never_unsync_the_cache() {
    let c = cluster(&[]);
    // Six NADs of ~900 KB (etcd takes up to 1.5 MiB an object): a 5.4 MB list.
    let big = |name: &str, fill: &str| {
        let mut config = nad_config(name, "big");
        config["padding"] = json!(fill.repeat(900_000 / fill.len()));
        c.api.nad("team-a", name, &config);
    };
    for i in 0..6 {
        big(&format!("big-{i}"), "a");
    }
    // Over the bound (1 MiB): left out, and only it.
    let mut config = nad_config("huge", "huge");
    config["padding"] = json!("h".repeat(1_200_000));
    c.api.nad("team-a", "huge", &config);
    c.api.nad("team-a", "net-a", &nad_config("net-a", "v1"));
    let port = plexus_tests::kubeapi::free_port();
    let d = c.daemon(&["--metrics-bind-address", &format!("127.0.0.1:{port}")]);
    d.wait("synced with the big NADs", |h| {
        plexus_tests::plexus::settled(h) && h.cache.nads == 7
    });
    // Over 10 MB through the watch: each big NAD replaced twice.
    for round in ["b", "c"] {
        for i in 0..6 {
            let path = format!(
                "/apis/k8s.cni.cncf.io/v1/namespaces/team-a/network-attachment-definitions/big-{i}"
            );
            let mut config = nad_config(&format!("big-{i}"), round);
            config["padding"] = json!(round.repeat(900_000));
            c.api.must(
                "PATCH",
                &path,
                Some(&json!({"spec": {"config": config.to_string()}})),
            );
        }
    }
    c.api.nad("team-a", "after", &nad_config("after", "v1"));
    let h = d.wait("the NAD created afterwards cached", |h| h.cache.nads == 8);
    assert!(h.cache.nads_synced, "{h:?}");
    assert_eq!(h.cache.watch_errors, 0, "{h:?}\n{}", d.log_text());
    assert_eq!(h.cache.nad_lists, 1, "no relist: {h:?}");
    let log = d.log_text();
    assert!(
        log.contains("an object over the size bound was left out") && log.contains("name=huge"),
        "{log}"
    );
    let (_, _, metrics) = http_get(port, "/metrics", None);
    assert!(
        sample(&metrics, "plexus_api_objects_oversized_total").is_some_and(|n| n >= 1.0),
        "{metrics}"
    );

    // An ADD of a pod with a small NAD: served from the cache.
    let uid = c.selecting_pod("web", "net-a");
    d.wait("pod cached", |h| h.cache.pods == 1 + TOKEN_POD);
    let conf = c.conf(json!({"timeoutMs": 5000}));
    assert!(c.add("c1", "web", &uid, &conf).success);
    assert_eq!(
        c.requests_of(CNI_USER),
        vec![],
        "the CNI process sent no request"
    );
    let h = d.wait("status written", |h| h.status_writes == 1);
    assert_eq!(h.api_reads, 0, "{h:?}");
}

/// A NAD grown past the per-object bound, and then deleted, is not attached as it was: the watch event over the
/// bound evicts the cached version, the next ADD reads the NAD by name (the current version), and after the
/// deletion an ADD fails for the missing NAD instead of running the old configuration.
#[test]
fn a_nad_grown_past_the_bound_and_then_deleted_is_not_attached_as_it_was() {
    let c = cluster(&[]);
    c.api.nad("team-a", "grow", &nad_config("grow", "old"));
    let uid = c.selecting_pod("web", "grow");
    let d = c.daemon(&[]);
    d.wait("pod and NAD cached", |h| {
        plexus_tests::plexus::settled(h) && h.cache.nads == 1 && h.cache.pods == 1 + TOKEN_POD
    });
    let conf = c.conf(json!({"timeoutMs": 5000}));
    let del = |id: &str| {
        c.sb.run("DEL", id, &pod_args("web", &uid), &conf).ok();
    };
    c.add("c1", "web", &uid, &conf).ok();
    assert_eq!(marker_of_last_secondary_call(&c.sb), "old");
    del("c1");

    // Past the 1 MiB bound of one object (etcd takes it: its default bound is 1.5 MiB).
    let mut grown = nad_config("grow", "new");
    grown["padding"] = json!("x".repeat(1_200_000));
    c.api.must(
        "PATCH",
        "/apis/k8s.cni.cncf.io/v1/namespaces/team-a/network-attachment-definitions/grow",
        Some(&json!({"spec": {"config": grown.to_string()}})),
    );
    d.wait("the cached version evicted", |h| h.cache.nads == 0);
    let reads = d.health().unwrap().api_reads;
    c.add("c2", "web", &uid, &conf).ok();
    assert_eq!(marker_of_last_secondary_call(&c.sb), "new");
    assert_eq!(d.health().unwrap().api_reads, reads + 1, "read by name");
    del("c2");

    c.api.must(
        "DELETE",
        "/apis/k8s.cni.cncf.io/v1/namespaces/team-a/network-attachment-definitions/grow",
        None,
    );
    c.sb.clear_calls();
    let run = c.add("c3", "web", &uid, &conf);
    assert!(!run.success, "{}", run.stdout);
    assert!(run.msg().contains("grow"), "{}", run.msg());
    assert!(
        c.sb.calls()
            .iter()
            .all(|call| call.plugin != "secondary-plugin"),
        "{:?}",
        c.sb.call_summary()
    );
}

/// One namespace's NADs cannot size a node's memory: 120 NADs of ~0.9 MiB (108 MiB) in namespace `big`, most before the daemon starts (its list) and some after (its watch). The
/// daemon stays up with its NAD cache within its budget (largest dropped first), its peak resident memory within
/// its share of the DaemonSet's limit (96 MiB of it; the rest is for a hook compile process beside it); an ADD of a small NAD reads nothing from the API, and one selecting a big NAD still
/// attaches it (read by name when it is not cached).
#[test]
fn one_namespaces_nads_cannot_size_the_daemons_memory() {
    let c = cluster(&[]);
    c.api.namespace("big");
    c.api.nad("team-a", "small", &nad_config("small", "small"));
    let big = |i: usize| {
        let mut config = nad_config(&format!("big-{i}"), &format!("big-{i}"));
        config["padding"] = json!("x".repeat(900_000));
        json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
               "metadata": {"name": format!("big-{i}"), "namespace": "big"},
               "spec": {"config": config.to_string()}})
    };
    let before: Vec<Value> = (0..100).map(big).collect();
    assert_eq!(c.api.create_many(&before), 0);
    let small_uid = c.selecting_pod("web", "small");
    let big_uid = c.selecting_pod("heavy", "big/big-7");
    let d = c.daemon(&[]);
    let budget = (plexus_cluster::DEFAULT_NAD_BUDGET_BYTES) as u64;
    let h = d.wait("synced", |h| {
        plexus_tests::plexus::settled(h) && h.cache.pods == 2 + TOKEN_POD
    });
    assert!(h.cache.nad_bytes <= budget, "{h:?}");
    assert!(
        h.cache.nads < 100,
        "the list did not bring every big NAD into memory: {h:?}"
    );
    // Each NAD the watch brings is held or makes the cache drop another: either way the sum grows by one.
    let seen =
        |h: &plexus_cni::daemon::proto::DaemonHealth| h.cache.nads as u64 + h.cache.nads_evicted;
    let listed = seen(&h);
    let after: Vec<Value> = (100..120).map(big).collect();
    assert_eq!(c.api.create_many(&after), 0);
    let h = d.wait("the NADs created after the start seen", |h| {
        seen(h) >= listed + 20
    });
    assert!(h.cache.nad_bytes <= budget, "{h:?}");
    assert!(
        h.cache.nads >= 2,
        "the small NAD and some big ones stay: {h:?}"
    );

    let conf = c.conf(json!({"timeoutMs": 5000}));
    let reads = h.api_reads;
    c.add("c-small", "web", &small_uid, &conf).ok();
    assert_eq!(marker_of_last_secondary_call(&c.sb), "small");
    assert_eq!(
        d.health().unwrap().api_reads,
        reads,
        "the small NAD is cached"
    );
    c.add("c-big", "heavy", &big_uid, &conf).ok();
    assert_eq!(marker_of_last_secondary_call(&c.sb), "big-7");

    let status = std::fs::read_to_string(format!("/proc/{}/status", d.child.id())).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    eprintln!(
        "daemon resident memory with 108 MiB of NADs: peak {} MiB, now {} MiB",
        peak_kib / 1024,
        rss_kib / 1024
    );
    assert!(
        peak_kib < 96 * 1024,
        "the daemon's peak resident memory {} MiB is over its 96 MiB share of the DaemonSet's limit",
        peak_kib / 1024
    );
    assert!(d.health().is_some(), "the daemon is up");
}

/// The daemon checks, with a server-side dry run, that the API server refuses a write its node may not make: with
/// the node-authority policy in place it finds it enforced and says nothing; without it (a cluster upgraded
/// without node-authority.yaml) it says so in its health, `plexus status`, a Warning event on its Node and the
/// metric `plexus_node_authority_enforced`.
#[test]
fn a_missing_node_authority_policy_is_reported() {
    // With the policy: nothing to report.
    let c = cluster(&[]);
    let d = c.daemon(&[]);
    d.wait("synced", plexus_tests::plexus::settled);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(d.health().unwrap().authority_not_enforced, None);
    drop(d);

    // Without it.
    let api = KubeApiServer::start(&[], &[]);
    api.apply_file(&deploy_manifest("crds.yaml"));
    api.apply_file(&deploy_manifest("networkhooks.yaml"));
    api.apply_file(&deploy_manifest("rbac.yaml"));
    api.create(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    let sb = Sandbox::new();
    let token = api.node_bound_token("kube-system", "plexus", NODE);
    api.write_kubeconfig(&sb.path("daemon.kubeconfig"), &token);
    let d = NodeDaemon::start(
        NODE,
        &sb.path("daemon.kubeconfig"),
        &sb.path("run/daemon.sock"),
        &sb.path("cache"),
        &sb.path("daemon.log"),
        &["--no-hooks"],
    );
    let h = d.wait("the self-check's finding", |h| {
        h.authority_not_enforced.is_some()
    });
    let why = h.authority_not_enforced.unwrap();
    assert!(why.contains("node-authority.yaml"), "{why}");
    let events = api.must("GET", "/api/v1/namespaces/default/events", None);
    let warned =
        events["items"].as_array().unwrap().iter().any(|e| {
            e["reason"] == "NodeAuthorityNotEnforced" && e["involvedObject"]["name"] == NODE
        });
    assert!(warned, "{events}");
    // Nothing was stored by the dry run.
    let (code, _) = api
        .request(
            "GET",
            "/apis/plexus.dev/v1alpha1/nodehookstatuses/plexus-authority-self-check",
            None,
        )
        .unwrap();
    assert_eq!(code, 404);
    let out = Command::new(plexus_bin())
        .args(["status", "--json", "--socket"])
        .arg(sb.path("run/daemon.sock"))
        .arg("--cache-dir")
        .arg(sb.path("cache"))
        .output()
        .unwrap();
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        s["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap().starts_with("node authority:")),
        "{s}"
    );
}
