//! The operator's commands (`plexus hook status`, `plexus migrate check`) find the cluster as kubectl does, on
//! the real API server: `--kubeconfig`, `KUBECONFIG` (several files merged, `--context`), `~/.kube/config`
//! through `HOME`, the in-cluster service account; and every failure names what was tried, the server and the
//! cause.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};

use plexus_tests::kubeapi::KubeApiServer;
use plexus_tests::plexus::plexus_bin;
use serde_json::{json, Value};

/// A command with none of the environment's own cluster settings: no KUBECONFIG, an empty home, not in a pod.
fn plexus(home: &Path) -> Command {
    let mut cmd = Command::new(plexus_bin());
    cmd.env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env("HOME", home);
    cmd
}

/// `plexus hook status labels --json`, with [`plexus`]'s environment; flags may follow.
fn status(home: &Path) -> Command {
    let mut cmd = plexus(home);
    cmd.args(["hook", "status", "labels", "--json"]);
    cmd
}

fn hook_status(cmd: &mut Command) -> Output {
    cmd.output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The report `hook status` prints about the one node the test's cluster has.
#[track_caller]
fn assert_sees_the_cluster(out: &Output) {
    assert!(out.status.success(), "{}", stderr(out));
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["nodes"], 1, "{s}");
    assert_eq!(
        s["running"],
        json!([{"key": "sha256:aaaa", "nodes": ["node-a"]}]),
        "{s}"
    );
}

/// A kubeconfig: `contexts` are `(name, server, token)`, the first the current one. Its CA is the test
/// server's (given), or none.
fn kubeconfig(path: &Path, ca: Option<&Path>, contexts: &[(&str, &str, &str)]) {
    let mut clusters = String::new();
    let mut users = String::new();
    let mut named = String::new();
    for (name, server, token) in contexts {
        clusters.push_str(&format!(
            "- name: {name}\n  cluster:\n    server: {server}\n"
        ));
        if let Some(ca) = ca {
            clusters.push_str(&format!("    certificate-authority: {}\n", ca.display()));
        }
        users.push_str(&format!("- name: {name}\n  user:\n    token: {token}\n"));
        named.push_str(&format!(
            "- name: {name}\n  context:\n    cluster: {name}\n    user: {name}\n"
        ));
    }
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n{clusters}users:\n{users}contexts:\n{named}current-context: {}\n",
        contexts[0].0
    );
    std::fs::write(path, text).unwrap();
}

fn cluster_with_a_report() -> KubeApiServer {
    let api = KubeApiServer::start(
        &[("nobody-token", "default/nobody")],
        &["--disable-admission-plugins=ServiceAccount"],
    );
    api.apply_file(&plexus_tests::deploy_manifest("crds.yaml"));
    api.apply_file(&plexus_tests::deploy_manifest("networkhooks.yaml"));
    // The agent writes the whole object (the resource has no status subresource).
    api.create(
        &json!({"apiVersion": "plexus.dev/v1alpha1", "kind": "NodeHookStatus",
        "metadata": {"name": "node-a"},
        "status": {"active": 1, "failing": 0, "hooks": [
            {"name": "labels", "active": true, "reason": "Active", "message": "",
             "digest": "sha256:aaaa", "observedGeneration": 1}]}}),
    );
    api
}

#[test]
fn each_source_is_found_as_kubectl_finds_it() {
    let api = cluster_with_a_report();
    let dir = tempfile::tempdir().unwrap();
    let empty_home = dir.path().join("empty-home");
    std::fs::create_dir_all(&empty_home).unwrap();
    let ca = api.ca_cert();
    let refused = "https://127.0.0.1:1";

    // --kubeconfig.
    let flag = dir.path().join("flag.kubeconfig");
    kubeconfig(&flag, Some(&ca), &[("real", &api.url(), "admin-token")]);
    assert_sees_the_cluster(&hook_status(
        status(&empty_home).arg("--kubeconfig").arg(&flag),
    ));

    // KUBECONFIG with two files: the first sets the current context (a server that refuses), the second holds
    // the context asked for; a listed file that does not exist is skipped.
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    kubeconfig(&first, Some(&ca), &[("broken", refused, "admin-token")]);
    kubeconfig(&second, Some(&ca), &[("real", &api.url(), "admin-token")]);
    let list = format!(
        "{}:{}:{}",
        first.display(),
        dir.path().join("gone").display(),
        second.display()
    );
    assert_sees_the_cluster(&hook_status(
        status(&empty_home)
            .env("KUBECONFIG", &list)
            .args(["--context", "real"]),
    ));
    // Without --context: the first file's current-context, named with its server and where it came from.
    let out = hook_status(status(&empty_home).env("KUBECONFIG", &list));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("the connection to the server 127.0.0.1:1 was refused"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "(the cluster of kubeconfig {}, {} (KUBECONFIG))",
            first.display(),
            second.display()
        )),
        "{err}"
    );
    // A context that exists nowhere is named, with the contexts there are.
    let out = hook_status(
        status(&empty_home)
            .env("KUBECONFIG", &list)
            .args(["--context", "prod"]),
    );
    let err = stderr(&out);
    assert!(
        err.contains(r#"context "prod" does not exist (contexts: broken, real)"#),
        "{err}"
    );
    // The flag wins over KUBECONFIG.
    assert_sees_the_cluster(&hook_status(
        status(&empty_home)
            .env("KUBECONFIG", first.as_os_str())
            .arg("--kubeconfig")
            .arg(&flag),
    ));

    // ~/.kube/config, through HOME.
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join(".kube")).unwrap();
    kubeconfig(
        &home.join(".kube/config"),
        Some(&ca),
        &[("real", &api.url(), "admin-token")],
    );
    assert_sees_the_cluster(&hook_status(&mut status(&home)));

    // migrate check follows the same rules.
    let out = plexus(&home)
        .args(["migrate", "check", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    // Nothing anywhere: each place looked at is named.
    let out = hook_status(&mut status(&empty_home));
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    for looked in [
        "no cluster found",
        "no --kubeconfig given",
        &format!(
            "{} does not exist",
            empty_home.join(".kube/config").display()
        ),
        "KUBERNETES_SERVICE_HOST is not set",
    ] {
        assert!(err.contains(looked), "{looked}: {err}");
    }
}

/// In a pod: the service account's files where kubelet mounts them, in a mount namespace of the command's own
/// (a tmpfs over /run there, so the machine's /run is untouched), and the service host and port kubelet sets.
#[test]
fn in_a_pod_the_service_account_is_used() {
    let api = cluster_with_a_report();
    let dir = tempfile::tempdir().unwrap();
    let account = dir.path().join("account");
    std::fs::create_dir_all(&account).unwrap();
    std::fs::write(account.join("token"), "admin-token").unwrap();
    std::fs::copy(api.ca_cert(), account.join("ca.crt")).unwrap();
    std::fs::write(account.join("namespace"), "kube-system").unwrap();
    let script = "mount -t tmpfs plexus-test /run && \
                  mkdir -p /run/secrets/kubernetes.io/serviceaccount && \
                  cp \"$ACCOUNT\"/* /run/secrets/kubernetes.io/serviceaccount/ && \
                  exec \"$PLEXUS\" hook status labels --json";
    let run = |home: &Path, kubeconfig: Option<&Path>| {
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "sh", "-c", script])
            .env_remove("KUBECONFIG")
            .env("HOME", home)
            .env("ACCOUNT", &account)
            .env("PLEXUS", plexus_bin())
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", api.port().to_string());
        if let Some(k) = kubeconfig {
            cmd.env("KUBECONFIG", k);
        }
        cmd.output().unwrap()
    };
    let empty_home = dir.path().join("empty-home");
    std::fs::create_dir_all(&empty_home).unwrap();
    assert_sees_the_cluster(&run(&empty_home, None));

    // A kubeconfig found first wins over the pod's account (its server refuses: the error says so).
    let first = dir.path().join("first");
    kubeconfig(&first, None, &[("broken", "https://127.0.0.1:1", "x")]);
    let out = run(&empty_home, Some(&first));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the connection to the server 127.0.0.1:1 was refused"),
        "{}",
        stderr(&out)
    );
}

/// Each way a server can fail is named with the server and the cause.
#[test]
fn api_errors_name_the_server_and_the_cause() {
    let api = cluster_with_a_report();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let server = format!("127.0.0.1:{}", api.port());
    let failing = |name: &str, ca: Option<&Path>, url: &str, token: &str| {
        let file = dir.path().join(name);
        kubeconfig(&file, ca, &[(name, url, token)]);
        let out = hook_status(status(&home).arg("--kubeconfig").arg(&file));
        assert_eq!(out.status.code(), Some(1), "{name}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(&format!(
                "(the cluster of kubeconfig {} (--kubeconfig))",
                file.display()
            )),
            "{name}: {err}"
        );
        err
    };
    let ca = api.ca_cert();

    let err = failing("unauthorized", Some(&ca), &api.url(), "wrong-token");
    assert!(
        err.contains(&format!(
            "the server {server} rejected the credentials (401 Unauthorized)"
        )),
        "{err}"
    );
    let err = failing("forbidden", Some(&ca), &api.url(), "nobody-token");
    assert!(
        err.contains("missing permission to get networkhooks")
            && err.contains(&format!("on the server {server}")),
        "{err}"
    );
    let err = failing("untrusted", None, &api.url(), "admin-token");
    assert!(
        err.contains(&format!("TLS with the server {server} failed"))
            && err.contains("certificate"),
        "{err}"
    );
    // A server that accepts connections and never answers: bounded, named.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let err = failing(
        "silent",
        Some(&ca),
        &format!("https://{silent_addr}"),
        "admin-token",
    );
    assert!(
        err.contains(&format!("the server {silent_addr}"))
            && (err.contains("no answer") || err.contains("timed out")),
        "{err}"
    );
    drop(silent);
}

/// `migrate check -n NS`: that namespace's pods and NADs, and the NADs its pods select elsewhere.
#[test]
fn migrate_check_reads_one_namespace() {
    let api = KubeApiServer::start(&[], &["--disable-admission-plugins=ServiceAccount"]);
    api.apply_file(&plexus_tests::deploy_manifest("crds.yaml"));
    for ns in ["team", "shared", "other"] {
        api.namespace(ns);
    }
    api.nad("shared", "old", &json!({"type": "bridge", "name": "old"}));
    api.nad(
        "other",
        "older",
        &json!({"type": "bridge", "name": "older"}),
    );
    let networks = "k8s.v1.cni.cncf.io/networks";
    for (ns, name, selects) in [
        ("team", "a", "shared/old"),
        ("other", "b", "older"),
        ("other", "c", "shared/old"),
    ] {
        api.create(&json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "annotations": {networks: selects}},
            "spec": {"containers": [{"name": "c", "image": "pause"}]}}));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("admin.kubeconfig");
    api.write_kubeconfig(&file, "admin-token");
    let out = plexus(dir.path())
        .env("KUBECONFIG", &file)
        .args(["migrate", "check", "--json", "-n", "team"])
        .output()
        .unwrap();
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
    assert_eq!(report["pods"], 1, "{report:#}");
    assert_eq!(
        report["nads"], 1,
        "the NAD in shared its pod selects: {report:#}"
    );
    let objects: Vec<&str> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["object"].as_str())
        .collect();
    assert!(objects.contains(&"pod team/a"), "{report:#}");
    assert!(objects.contains(&"nad shared/old"), "{report:#}");
    assert!(!objects.iter().any(|o| o.contains("other")), "{report:#}");
}

/// What a node wrote in its report reaches the operator's terminal with its control characters escaped: the text
/// has no character a terminal acts on and no line the node made; the JSON means what the node wrote.
#[test]
fn hook_status_shows_what_a_node_wrote_without_its_escape_sequences() {
    let api = cluster_with_a_report();
    let message =
        "pull failed\u{1b}]0;owned\u{7}\u{1b}[2J\n  running sha256:fake: 9 node(s): node-z\u{9b}1m";
    api.create(
        &json!({"apiVersion": "plexus.dev/v1alpha1", "kind": "NodeHookStatus",
        "metadata": {"name": "node-b"},
        "status": {"active": 0, "failing": 1, "hooks": [
            {"name": "labels", "active": false, "reason": "Pull\u{1b}[31mFailed", "message": message,
             "observedGeneration": 1}]}}),
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("admin.kubeconfig");
    api.write_kubeconfig(&file, "admin-token");
    let run = |json: bool| {
        let mut cmd = plexus(dir.path());
        cmd.args(["hook", "status", "labels", "--kubeconfig"])
            .arg(&file);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let text = run(false);
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "{text:?}"
    );
    assert!(
        text.contains(r"Pull\u{1b}[31mFailed: 1 node(s): node-b"),
        "{text}"
    );
    assert!(
        text.contains(r"e.g. pull failed\u{1b}]0;owned\u{7}\u{1b}[2J\n  running sha256:fake"),
        "{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("  running")).count(),
        1,
        "node-a's line only: the message's line is escaped inside its e.g. line: {text}"
    );
    let json = run(true);
    assert!(
        !json.chars().any(|c| c.is_control() && c != '\n'),
        "{json:?}"
    );
    let summary: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(summary["failing"][0]["message"], message, "{summary:#}");
}
