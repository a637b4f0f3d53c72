//! Robustness of the real `plexus` binary: bad input, failing delegates, the per-container lock, the
//! attachment cache, STATUS and GC. Every failure must be one CNI error object on stdout with the right code
//! and a message naming what was wrong, and must leave nothing attached.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plexus_tests::plexus::{Run, Sandbox};
use serde_json::{json, Value};

const POD_NS: &str = "ns";

/// A process environment, as `Sandbox::run_env` takes it.
type Env = Vec<(String, String)>;

/// The environment a runtime gives plexus for `command` on container `id`.
fn cni_env(sb: &Sandbox, command: &str, id: &str, args: &str) -> Vec<(String, String)> {
    [
        ("CNI_COMMAND", command.to_string()),
        ("CNI_CONTAINERID", id.to_string()),
        ("CNI_NETNS", format!("/run/netns/fake-{id}")),
        ("CNI_IFNAME", "eth0".to_string()),
        ("CNI_PATH", sb.path("bin").display().to_string()),
        ("CNI_ARGS", args.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn without(env: &[(String, String)], key: &str) -> Env {
    env.iter().filter(|(k, _)| k != key).cloned().collect()
}

fn with(env: &[(String, String)], key: &str, value: &str) -> Env {
    let mut e = without(env, key);
    e.push((key.to_string(), value.to_string()));
    e
}

/// Asserts a failed run whose stdout is exactly one CNI error object with `code` and a `msg` containing
/// every needle; returns the error object.
#[track_caller]
fn assert_cni_error(run: &Run, code: u64, needles: &[&str]) -> Value {
    assert!(
        !run.success,
        "expected a failure, got success: {}\nstderr: {}",
        run.stdout, run.stderr
    );
    // from_str refuses trailing non-whitespace: stdout must hold the error object and nothing else.
    let err: Value = serde_json::from_str(&run.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not a single JSON value ({e}): {:?}\nstderr: {}",
            run.stdout, run.stderr
        )
    });
    let obj = err
        .as_object()
        .unwrap_or_else(|| panic!("error is not an object: {err}"));
    assert!(obj["cniVersion"].is_string(), "no cniVersion in {err}");
    assert_eq!(
        obj["code"].as_u64(),
        Some(code),
        "{err}\nstderr: {}",
        run.stderr
    );
    let msg = obj["msg"]
        .as_str()
        .unwrap_or_else(|| panic!("no msg in {err}"));
    for needle in needles {
        assert!(msg.contains(needle), "msg {msg:?} does not name {needle:?}");
    }
    assert!(
        !run.stderr.contains("panicked"),
        "plexus panicked: {}",
        run.stderr
    );
    err
}

/// Every delegate ADD that happened for `id` got a later DEL of the same plugin and interface, and the
/// attachment cache holds nothing for `id`.
#[track_caller]
fn assert_nothing_attached(sb: &Sandbox, id: &str) {
    let calls: Vec<_> = sb
        .calls()
        .into_iter()
        .filter(|c| c.env.get("CNI_CONTAINERID").map(String::as_str) == Some(id))
        .collect();
    for (i, add) in calls.iter().enumerate().filter(|(_, c)| c.command == "ADD") {
        let undone = calls[i + 1..].iter().any(|c| {
            c.command == "DEL"
                && c.plugin == add.plugin
                && c.env.get("CNI_IFNAME") == add.env.get("CNI_IFNAME")
        });
        assert!(
            undone,
            "ADD of {} ({:?}) was never deleted: {:?}",
            add.plugin,
            add.env.get("CNI_IFNAME"),
            sb.call_summary()
        );
    }
    let file = format!("{id}.json");
    assert!(
        !sb.cached().contains(&file),
        "attachment cache still holds {file}: {:?}",
        sb.cached()
    );
}

/// Every file and directory under `root`, relative to it.
fn tree(root: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            out.insert(p.strip_prefix(root).unwrap().to_path_buf());
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(p);
            }
        }
    }
    out
}

/// `base.join(rel)` with `..` resolved lexically (the files may not exist).
fn lexical_join(base: &Path, rel: &str) -> PathBuf {
    let mut p = base.to_path_buf();
    for part in Path::new(rel).components() {
        match part {
            std::path::Component::ParentDir => {
                p.pop();
            }
            other => p.push(other),
        }
    }
    p
}

// ---------------------------------------------------------------------------------------------------------
// Bad input from the runtime

#[test]
fn bad_stdin_is_a_decoding_error_and_attaches_nothing() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    let env = cni_env(&sb, "ADD", "c1", "");
    for (stdin, code, needles) in [
        (&b""[..], 6, &["empty"][..]),
        (b"  \n", 6, &["empty"]),
        (b"{\"cniVersion\": \"1.0.0\", ", 6, &["not valid JSON"]),
        (b"[\"cniVersion\", \"1.0.0\"]", 6, &["not a JSON object"]),
        (b"\"1.0.0\"", 6, &["not a JSON object"]),
    ] {
        let run = sb.run_env(&env, stdin);
        assert_cni_error(&run, code, needles);
    }
    assert!(sb.calls().is_empty(), "{:?}", sb.call_summary());
    assert_nothing_attached(&sb, "c1");
}

#[test]
fn bad_plexus_conf_keys_name_the_key() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    let env = cni_env(&sb, "ADD", "c1", "");
    let mut no_version = sb.conf(json!({}));
    no_version.as_object_mut().unwrap().remove("cniVersion");
    let mut no_cluster = sb.conf(json!({}));
    no_cluster.as_object_mut().unwrap().remove("clusterNetwork");
    for (conf, code, needles) in [
        (no_version, 7, &["cniVersion"][..]),
        (sb.conf(json!({"cniVersion": "9.9.9"})), 1, &["9.9.9"]),
        (
            sb.conf(json!({"cniVersion": 1})),
            7,
            &["plexus configuration"],
        ),
        (no_cluster, 7, &["clusterNetwork"]),
        (
            sb.conf(json!({"clusterNetwork": "  "})),
            7,
            &["clusterNetwork"],
        ),
    ] {
        let run = sb.run_env(&env, conf.to_string().as_bytes());
        assert_cni_error(&run, code, needles);
    }
    assert!(sb.calls().is_empty(), "{:?}", sb.call_summary());
    assert_nothing_attached(&sb, "c1");
}

#[test]
fn missing_or_unknown_environment_is_invalid_env() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    let conf = sb.conf(json!({})).to_string();
    let env = cni_env(&sb, "ADD", "c1", "");
    let cases: Vec<(Env, &[&str])> = vec![
        (without(&env, "CNI_COMMAND"), &["CNI_COMMAND"]),
        (with(&env, "CNI_COMMAND", "FROB"), &["CNI_COMMAND", "FROB"]),
        (with(&env, "CNI_COMMAND", "add"), &["CNI_COMMAND", "add"]),
        (without(&env, "CNI_CONTAINERID"), &["CNI_CONTAINERID"]),
        (with(&env, "CNI_CONTAINERID", ""), &["CNI_CONTAINERID"]),
        (without(&env, "CNI_IFNAME"), &["CNI_IFNAME"]),
        (without(&env, "CNI_NETNS"), &["CNI_NETNS"]),
    ];
    for (env, needles) in cases {
        let run = sb.run_env(&env, conf.as_bytes());
        assert_cni_error(&run, 4, needles);
    }
    assert!(sb.calls().is_empty(), "{:?}", sb.call_summary());
    assert_nothing_attached(&sb, "c1");
}

#[test]
fn path_traversal_in_container_id_or_ifname_is_refused_and_creates_nothing() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    let conf = sb.conf(json!({})).to_string();
    // Sanity: the same setup attaches with honest names, so the refusals below are about the names.
    sb.run_env(&cni_env(&sb, "ADD", "honest", ""), conf.as_bytes())
        .ok();
    sb.run_env(&cni_env(&sb, "DEL", "honest", ""), conf.as_bytes())
        .ok();
    sb.clear_calls();
    let before = tree(sb.root.path());
    let escape = format!("../../../plexus-escape-{}", std::process::id());
    let hostile = ["../x", "a/b", "..", escape.as_str(), "x/../../y"];
    for command in ["ADD", "DEL", "CHECK"] {
        for bad in hostile {
            let env = cni_env(&sb, command, bad, "");
            let run = sb.run_env(&env, conf.as_bytes());
            assert_cni_error(&run, 4, &["CNI_CONTAINERID"]);
            let env = with(&cni_env(&sb, command, "c1", ""), "CNI_IFNAME", bad);
            let run = sb.run_env(&env, conf.as_bytes());
            assert_cni_error(&run, 4, &["CNI_IFNAME"]);
        }
    }
    assert!(sb.calls().is_empty(), "{:?}", sb.call_summary());
    assert_eq!(
        tree(sb.root.path()),
        before,
        "nothing may be created in the sandbox"
    );
    for bad in hostile {
        for (dir, ext) in [("cache/attachments", "json"), ("run/locks", "lock")] {
            let target = lexical_join(&sb.path(dir), &format!("{bad}.{ext}"));
            assert!(!target.exists(), "{} was created", target.display());
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Failing delegates, as the cluster network and as the second attachment of a pod

/// One way a delegate can fail on ADD, and what plexus must answer.
struct Failure {
    name: &'static str,
    /// The plugin `type` of the failing network.
    plugin: &'static str,
    /// Whether the fake is installed under that name.
    installed: bool,
    /// The fake's ADD behaviour.
    add: Value,
    code: u64,
    needles: Vec<String>,
    details: Option<&'static str>,
    /// `delegateTimeoutMs` for the run.
    timeout_ms: u64,
}

fn failures(sb: &Sandbox) -> Vec<Failure> {
    let bin = sb.path("bin").display().to_string();
    let base = |name, plugin, add: Value, code, needles: &[&str]| Failure {
        name,
        plugin,
        installed: true,
        add,
        code,
        needles: needles.iter().map(|s| s.to_string()).collect(),
        details: None,
        timeout_ms: 20_000,
    };
    vec![
        Failure {
            installed: false,
            needles: vec!["missing-plugin".into(), "not found".into(), bin],
            ..base("missing binary", "missing-plugin", Value::Null, 7, &[])
        },
        base(
            "type with a slash",
            "../bin/bad-plugin",
            Value::Null,
            7,
            &["../bin/bad-plugin", "plain file name"],
        ),
        base(
            "non-zero exit with garbage and stderr",
            "bad-plugin",
            json!({"exit": 2, "stdout": "%%garbage-out%%", "stderr": "fatal: bridge br9 is gone"}),
            100,
            &["bad-plugin", "exit status 2", "fatal: bridge br9 is gone"],
        ),
        base(
            "non-zero exit with garbage only",
            "bad-plugin",
            json!({"exit": 3, "stdout": "%%garbage-out%%"}),
            100,
            &["bad-plugin", "exit status 3", "%%garbage-out%%"],
        ),
        Failure {
            details: Some("10.9.0.0/30 has no free address"),
            ..base(
                "CNI error object",
                "bad-plugin",
                json!({"error": {"cniVersion": "1.0.0", "code": 42, "msg": "address pool exhausted",
                    "details": "10.9.0.0/30 has no free address"}}),
                42,
                &["bad-plugin", "address pool exhausted"],
            )
        },
        base(
            "exit 0 with invalid JSON",
            "bad-plugin",
            json!({"exit": 0, "stdout": "{\"cniVersion\": \"1.0.0\", oops"}),
            6,
            &["bad-plugin", "invalid JSON"],
        ),
        base(
            "exit 0 with a JSON non-result",
            "bad-plugin",
            json!({"exit": 0, "stdout": "[1, 2]"}),
            6,
            &["bad-plugin", "invalid result"],
        ),
        Failure {
            timeout_ms: 400,
            ..base(
                "hung delegate",
                "bad-plugin",
                json!({"sleepMs": 60_000}),
                101,
                &["bad-plugin", "did not finish", "killed"],
            )
        },
    ]
}

fn install_failure(sb: &Sandbox, f: &Failure) {
    if f.installed {
        sb.fakes(&[f.plugin]);
    }
    sb.fake_config(json!({ f.plugin: {"ADD": f.add} }));
}

#[track_caller]
fn assert_failure(f: &Failure, run: &Run, elapsed: Duration) {
    let needles: Vec<&str> = f.needles.iter().map(String::as_str).collect();
    let err = assert_cni_error(run, f.code, &needles);
    if let Some(details) = f.details {
        assert_eq!(err["details"], details, "{}: {err}", f.name);
    }
    if f.code == 101 {
        // Killed at the deadline, not waited out: 10x the timeout covers process start-up and rollback.
        let limit = Duration::from_millis(f.timeout_ms * 10);
        assert!(elapsed < limit, "{}: took {elapsed:?}", f.name);
    }
}

#[test]
fn failing_cluster_network_delegate_reports_and_leaves_nothing_attached() {
    let probe = Sandbox::new();
    for f in failures(&probe) {
        let sb = Sandbox::new();
        let f = failures(&sb)
            .into_iter()
            .find(|x| x.name == f.name)
            .unwrap();
        install_failure(&sb, &f);
        sb.conf_file(
            "00-cluster.conflist",
            &json!({"cniVersion": "1.0.0", "name": "cluster-net", "plugins": [{"type": f.plugin}]}),
        );
        let conf = sb.conf(json!({"delegateTimeoutMs": f.timeout_ms}));
        let start = Instant::now();
        let run = sb.run("ADD", "c1", "", &conf);
        assert_failure(&f, &run, start.elapsed());
        assert_nothing_attached(&sb, "c1");
        if f.installed && f.plugin == "bad-plugin" {
            let adds = sb.calls().iter().filter(|c| c.command == "ADD").count();
            assert_eq!(adds, 1, "{}: {:?}", f.name, sb.call_summary());
        }
    }
}

#[test]
fn failing_second_attachment_rolls_back_the_first() {
    let probe = Sandbox::new();
    for f in failures(&probe) {
        let sb = Sandbox::new();
        let f = failures(&sb)
            .into_iter()
            .find(|x| x.name == f.name)
            .unwrap();
        sb.cluster_net("1.0.0");
        install_failure(&sb, &f);
        sb.pod(POD_NS, "p", Some("net-a"));
        sb.nad(
            POD_NS,
            "net-a",
            Some(json!({"cniVersion": "1.0.0", "name": "net-a", "type": f.plugin})),
        );
        let conf = sb.conf(json!({"delegateTimeoutMs": f.timeout_ms}));
        let start = Instant::now();
        let run = sb.run("ADD", "c1", &Sandbox::pod_args(POD_NS, "p"), &conf);
        assert_failure(&f, &run, start.elapsed());
        assert!(
            run.msg().contains("ns/net-a"),
            "{}: msg names the network: {}",
            f.name,
            run.msg()
        );
        assert_nothing_attached(&sb, "c1");
        let summary = sb.call_summary();
        let cluster_add = (
            "cluster-plugin".to_string(),
            "ADD".to_string(),
            "eth0".to_string(),
        );
        let cluster_del = (
            "cluster-plugin".to_string(),
            "DEL".to_string(),
            "eth0".to_string(),
        );
        if f.plugin.contains('/') {
            // An invalid type is refused while planning, before any delegate runs.
            assert!(summary.is_empty(), "{}: {summary:?}", f.name);
        } else {
            assert_eq!(
                summary.first(),
                Some(&cluster_add),
                "{}: {summary:?}",
                f.name
            );
            assert_eq!(
                summary.last(),
                Some(&cluster_del),
                "{}: {summary:?}",
                f.name
            );
        }
        assert_eq!(
            sb.status(POD_NS, "p"),
            None,
            "{}: no network-status for a pod that failed",
            f.name
        );
    }
}

// ---------------------------------------------------------------------------------------------------------
// The attachment cache

/// Container `id` of pod `p` added: the cluster network and the NAD `side` (fake `side-plugin`). Returns the
/// sandbox, the conf and the pod's CNI_ARGS.
fn added_pod_with_side_network(id: &str) -> (Sandbox, Value, String) {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    sb.fakes(&["side-plugin"]);
    sb.pod(POD_NS, "p", Some("side"));
    sb.nad(
        POD_NS,
        "side",
        Some(json!({"cniVersion": "1.0.0", "name": "side", "type": "side-plugin"})),
    );
    let conf = sb.conf(json!({}));
    let args = Sandbox::pod_args(POD_NS, "p");
    sb.run("ADD", id, &args, &conf).ok();
    (sb, conf, args)
}

#[test]
fn an_empty_plan_file_is_no_plan_so_del_replans_from_the_cluster() {
    // What a power loss right after an ADD can leave: the name on disk, not the data (the cache is not synced).
    let (sb, conf, args) = added_pod_with_side_network("c1");
    std::fs::write(sb.path("cache/attachments/c1.json"), "").unwrap();
    std::fs::remove_file(sb.path("cache/attachments/c1.results")).unwrap();
    sb.clear_calls();
    sb.run("DEL", "c1", &args, &conf).ok();
    let dels: Vec<(String, String)> = sb
        .call_summary()
        .into_iter()
        .map(|(plugin, command, ifname)| {
            assert_eq!(command, "DEL");
            (plugin, ifname)
        })
        .collect();
    assert_eq!(
        dels,
        [
            ("side-plugin".to_string(), "net1".to_string()),
            ("cluster-plugin".to_string(), "eth0".to_string())
        ],
        "re-planned from the pod and its NAD, torn down in reverse"
    );
    assert!(sb.cached().is_empty(), "{:?}", sb.cached());
}

#[test]
fn del_after_a_killed_add_passes_each_recorded_result_and_ignores_a_torn_record() {
    let (sb, conf, args) = added_pod_with_side_network("c1");
    // As if plexus had been killed while appending the second attachment's result.
    let journal = sb.path("cache/attachments/c1.results");
    let text = std::fs::read_to_string(&journal).unwrap();
    let first = text.lines().next().unwrap();
    std::fs::write(
        &journal,
        format!("{first}\n{{\"index\":1,\"result\":{{\"cniV"),
    )
    .unwrap();
    sb.clear_calls();
    sb.run("DEL", "c1", &args, &conf).ok();
    let calls = sb.calls();
    assert_eq!(calls.len(), 2, "{:?}", sb.call_summary());
    assert_eq!(calls[0].plugin, "side-plugin");
    assert!(
        calls[0].stdin.get("prevResult").is_none(),
        "no result was recorded for the second attachment: {}",
        calls[0].stdin
    );
    assert_eq!(calls[1].plugin, "cluster-plugin");
    let recorded: Value = serde_json::from_str(first).unwrap();
    assert_eq!(
        calls[1].stdin["prevResult"]["interfaces"], recorded["result"]["interfaces"],
        "the cluster network's DEL gets its recorded result"
    );
    assert!(sb.cached().is_empty(), "{:?}", sb.cached());
}

#[test]
fn corrupt_cache_file_fails_del_and_check_naming_the_file() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    let conf = sb.conf(json!({}));
    sb.run("ADD", "c1", "", &conf).ok();
    let file = sb.path("cache/attachments/c1.json");
    assert!(file.exists());
    for garbage in [
        "{\"format\": 1, \"containerId\": ",
        "\u{0}\u{1}binary",
        "[]",
    ] {
        std::fs::write(&file, garbage).unwrap();
        sb.clear_calls();
        for command in ["DEL", "CHECK"] {
            let run = sb.run(command, "c1", "", &conf);
            assert_cni_error(&run, 6, &[&file.display().to_string()]);
        }
        assert!(
            sb.calls().is_empty(),
            "no delegate runs from a corrupt plan"
        );
    }
    // A plan written for another container is refused as well.
    let other = sb.path("cache/attachments/c2.json");
    sb.run("ADD", "c2", "", &conf).ok();
    std::fs::copy(&other, &file).unwrap();
    let run = sb.run("DEL", "c1", "", &conf);
    assert_cni_error(&run, 6, &[&file.display().to_string(), "c2"]);
}

#[test]
fn check_of_an_unknown_container_is_code_3() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    let conf = sb.conf(json!({}));
    sb.run("ADD", "known", "", &conf).ok();
    sb.clear_calls();
    let run = sb.run("CHECK", "stranger", "", &conf);
    assert_cni_error(&run, 3, &["stranger"]);
    assert!(sb.calls().is_empty(), "{:?}", sb.call_summary());
    sb.run("CHECK", "known", "", &conf).ok();
}

#[test]
fn add_twice_without_del_tears_the_old_attachments_down_first() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    sb.fakes(&["extra-plugin"]);
    sb.pod(POD_NS, "p", Some("extra"));
    sb.nad(
        POD_NS,
        "extra",
        Some(json!({"cniVersion": "1.0.0", "name": "extra", "type": "extra-plugin"})),
    );
    let conf = sb.conf(json!({}));
    let args = Sandbox::pod_args(POD_NS, "p");
    let first = sb.run("ADD", "c1", &args, &conf).ok().json();
    sb.clear_calls();
    let second = sb.run("ADD", "c1", &args, &conf).ok().json();
    let s = |p: &str, c: &str, i: &str| (p.to_string(), c.to_string(), i.to_string());
    assert_eq!(
        sb.call_summary(),
        vec![
            s("extra-plugin", "DEL", "net1"),
            s("cluster-plugin", "DEL", "eth0"),
            s("cluster-plugin", "ADD", "eth0"),
            s("extra-plugin", "ADD", "net1"),
        ]
    );
    let calls = sb.calls();
    assert_eq!(
        calls[1].stdin["prevResult"], first,
        "the old attachment is deleted with its cached result"
    );
    assert_eq!(first, second);
    assert_eq!(sb.cached(), vec!["c1.json"]);
    sb.clear_calls();
    sb.run("DEL", "c1", &args, &conf).ok();
    assert_eq!(sb.call_summary().len(), 2);
    assert!(sb.cached().is_empty());
}

// ---------------------------------------------------------------------------------------------------------
// The per-container lock

/// Installs `slow-plugin`: a wrapper that logs start and end times around the recording fake (which sleeps
/// `ms` on ADD and DEL).
fn slow_cluster_net(sb: &Sandbox, ms: u64) {
    sb.fakes(&["inner-plugin"]);
    let script = "#!/bin/sh\n\
        d=$(dirname \"$0\")\n\
        echo \"start $CNI_COMMAND $CNI_CONTAINERID $(date +%s%N)\" >> \"$d/times.log\"\n\
        \"$d/inner-plugin\"\n\
        rc=$?\n\
        echo \"end $CNI_COMMAND $CNI_CONTAINERID $(date +%s%N)\" >> \"$d/times.log\"\n\
        exit $rc\n";
    let path = sb.path("bin/slow-plugin");
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    sb.fake_config(json!({"inner-plugin": {"ADD": {"sleepMs": ms}, "DEL": {"sleepMs": ms}}}));
    sb.conf_file(
        "00-cluster.conflist",
        &json!({"cniVersion": "1.0.0", "name": "cluster-net", "plugins": [{"type": "slow-plugin"}]}),
    );
}

/// `(command, container) -> (start ns, end ns)` from the wrapper's log.
fn intervals(sb: &Sandbox) -> Vec<(String, String, u128, u128)> {
    let text = std::fs::read_to_string(sb.path("bin/times.log")).unwrap_or_default();
    let mut starts = Vec::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [kind, command, id, t] = parts[..] else {
            panic!("bad line {line:?}")
        };
        let t: u128 = t.parse().unwrap();
        match kind {
            "start" => starts.push((command.to_string(), id.to_string(), t)),
            _ => {
                let i = starts
                    .iter()
                    .position(|(c, d, _)| c == command && d == id)
                    .unwrap_or_else(|| panic!("end without start: {line}"));
                let (c, d, s) = starts.remove(i);
                out.push((c, d, s, t));
            }
        }
    }
    assert!(starts.is_empty(), "unfinished delegate calls: {starts:?}");
    out
}

fn run_concurrently(sb: &Sandbox, ops: &[(&str, &str)]) -> Vec<Run> {
    let conf = sb.conf(json!({}));
    std::thread::scope(|s| {
        let handles: Vec<_> = ops
            .iter()
            .map(|(command, id)| {
                let conf = &conf;
                s.spawn(move || sb.run(command, id, "", conf))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn operations_on_one_container_never_overlap() {
    let sb = Sandbox::new();
    slow_cluster_net(&sb, 700);
    for run in run_concurrently(&sb, &[("ADD", "c1"), ("DEL", "c1")]) {
        run.ok();
    }
    let iv = intervals(&sb);
    assert_eq!(iv.len(), 2, "{iv:?}");
    let (a, b) = (&iv[0], &iv[1]);
    assert!(
        a.3 <= b.2 || b.3 <= a.2,
        "ADD and DEL of one container overlapped: {iv:?}"
    );
    // Two ADDs of one container: also strictly one after the other.
    let sb = Sandbox::new();
    slow_cluster_net(&sb, 500);
    for run in run_concurrently(&sb, &[("ADD", "c1"), ("ADD", "c1")]) {
        run.ok();
    }
    let mut iv = intervals(&sb);
    iv.sort_by_key(|x| x.2);
    for pair in iv.windows(2) {
        assert!(pair[0].3 <= pair[1].2, "overlap: {iv:?}");
    }
}

#[test]
fn operations_on_different_containers_overlap() {
    let sb = Sandbox::new();
    slow_cluster_net(&sb, 3000);
    for run in run_concurrently(&sb, &[("ADD", "c1"), ("ADD", "c2")]) {
        run.ok();
    }
    let iv = intervals(&sb);
    assert_eq!(iv.len(), 2, "{iv:?}");
    let (a, b) = (&iv[0], &iv[1]);
    assert_ne!(a.1, b.1);
    assert!(
        a.2 < b.3 && b.2 < a.3,
        "different containers must run in parallel: {iv:?}"
    );
    assert_eq!(sb.cached(), vec!["c1.json", "c2.json"]);
}

// ---------------------------------------------------------------------------------------------------------
// Logging

fn chatty_cluster_net(sb: &Sandbox, marker: &str) -> Value {
    sb.fakes(&["chatty-plugin"]);
    let result = json!({"cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:aa", "sandbox": "/run/netns/fake-c1"}],
        "ips": [{"address": "10.7.0.5/24", "interface": 0}]});
    sb.fake_config(json!({"chatty-plugin": {"ADD": {"exit": 0, "stdout": result.to_string(), "stderr": marker}}}));
    sb.conf_file(
        "00-cluster.conflist",
        &json!({"cniVersion": "1.0.0", "name": "cluster-net", "plugins": [{"type": "chatty-plugin"}]}),
    );
    result
}

#[test]
fn delegate_stderr_is_logged_and_stdout_holds_only_the_result() {
    let marker = "chatty-plugin says: using bridge br-log";
    for level in ["info", "debug"] {
        let sb = Sandbox::new();
        let result = chatty_cluster_net(&sb, marker);
        let run = sb.run("ADD", "c1", "", &sb.conf(json!({"logLevel": level})));
        run.ok();
        let out: Value = serde_json::from_str(&run.stdout).unwrap_or_else(|e| {
            panic!(
                "{level}: stdout is not only the result ({e}): {:?}",
                run.stdout
            )
        });
        assert_eq!(out, result, "{level}");
        assert!(
            run.stderr.contains(marker),
            "{level}: delegate stderr not logged to stderr: {}",
            run.stderr
        );
        assert!(!run.stdout.contains(marker));
    }
}

#[test]
fn delegate_stderr_goes_to_log_file_when_configured() {
    let marker = "chatty-plugin says: to the log file";
    let sb = Sandbox::new();
    let result = chatty_cluster_net(&sb, marker);
    let log = sb.path("plexus.log");
    let conf = sb.conf(json!({"logLevel": "debug", "logFile": log}));
    let run = sb.run("ADD", "c1", "", &conf);
    run.ok();
    assert_eq!(serde_json::from_str::<Value>(&run.stdout).unwrap(), result);
    let text = std::fs::read_to_string(&log).expect("log file written");
    assert!(text.contains(marker), "log file: {text}");
    assert!(
        !run.stderr.contains(marker),
        "with logFile, stderr stays quiet: {}",
        run.stderr
    );
    // Errors go to the log file too, and stdout still holds only the error object.
    sb.fake_config(json!({"chatty-plugin": {"ADD": {"exit": 1, "stderr": "second-run-failure"}}}));
    let run = sb.run("ADD", "c2", "", &conf);
    assert_cni_error(&run, 100, &["second-run-failure"]);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("second-run-failure"), "log file: {text}");
}

// ---------------------------------------------------------------------------------------------------------
// STATUS (CNI 1.1)

fn status_env(sb: &Sandbox) -> Vec<(String, String)> {
    vec![
        ("CNI_COMMAND".into(), "STATUS".into()),
        ("CNI_PATH".into(), sb.path("bin").display().to_string()),
    ]
}

#[test]
fn status_asks_a_1_1_0_cluster_network() {
    let sb = Sandbox::new();
    sb.cluster_net("1.1.0");
    let conf = sb.conf(json!({"cniVersion": "1.1.0"}));
    let run = sb.run_env(&status_env(&sb), conf.to_string().as_bytes());
    run.ok();
    assert_eq!(run.stdout.trim(), "", "STATUS prints nothing on success");
    let calls = sb.calls();
    assert_eq!(calls.len(), 1, "{:?}", sb.call_summary());
    assert_eq!(
        (calls[0].plugin.as_str(), calls[0].command.as_str()),
        ("cluster-plugin", "STATUS")
    );
    assert_eq!(calls[0].stdin["cniVersion"], "1.1.0");
    assert_eq!(calls[0].stdin["name"], "cluster-net");

    sb.fake_config(json!({"cluster-plugin": {"STATUS": {"error":
        {"cniVersion": "1.1.0", "code": 50, "msg": "ipam pool not ready", "details": "waiting for leases"}}}}));
    let run = sb.run_env(&status_env(&sb), conf.to_string().as_bytes());
    let err = assert_cni_error(&run, 50, &["cluster-plugin", "ipam pool not ready"]);
    assert_eq!(err["details"], "waiting for leases");
}

#[test]
fn status_without_the_readiness_indicator_is_not_available() {
    let sb = Sandbox::new();
    sb.cluster_net("1.1.0");
    let indicator = sb.path("ready/indicator");
    let conf = sb.conf(json!({"cniVersion": "1.1.0", "readinessIndicatorFile": indicator}));
    let run = sb.run_env(&status_env(&sb), conf.to_string().as_bytes());
    assert_cni_error(&run, 50, &[&indicator.display().to_string()]);
    assert!(sb.calls().is_empty(), "{:?}", sb.call_summary());
    std::fs::create_dir_all(indicator.parent().unwrap()).unwrap();
    std::fs::write(&indicator, "").unwrap();
    sb.run_env(&status_env(&sb), conf.to_string().as_bytes())
        .ok();
    assert_eq!(sb.calls().len(), 1);
}

#[test]
fn status_is_not_sent_to_a_1_0_0_cluster_network() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    // Would fail if it were asked.
    sb.fake_config(json!({"cluster-plugin": {"STATUS": {"error": {"code": 50, "msg": "asked"}}}}));
    let conf = sb.conf(json!({"cniVersion": "1.1.0"}));
    sb.run_env(&status_env(&sb), conf.to_string().as_bytes())
        .ok();
    assert!(sb.calls().is_empty(), "{:?}", sb.call_summary());
}

// ---------------------------------------------------------------------------------------------------------
// GC (CNI 1.1)

#[test]
fn gc_tears_down_invalid_attachments_and_passes_the_valid_ones_on() {
    let sb = Sandbox::new();
    sb.cluster_net("1.1.0");
    sb.fakes(&["b-plugin", "old-plugin"]);
    sb.pod(POD_NS, "pa", Some("old"));
    sb.pod(POD_NS, "pb", Some("bnet"));
    sb.nad(
        POD_NS,
        "bnet",
        Some(json!({"cniVersion": "1.1.0", "name": "bnet", "type": "b-plugin"})),
    );
    sb.nad(
        POD_NS,
        "old",
        Some(json!({"cniVersion": "1.0.0", "name": "old", "type": "old-plugin"})),
    );
    let conf = sb.conf(json!({"cniVersion": "1.1.0"}));
    sb.run("ADD", "ca", &Sandbox::pod_args(POD_NS, "pa"), &conf)
        .ok();
    let b_result = sb
        .run("ADD", "cb", &Sandbox::pod_args(POD_NS, "pb"), &conf)
        .ok()
        .json();
    assert_eq!(sb.cached(), vec!["ca.json", "cb.json"]);
    sb.clear_calls();

    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "ca", "ifname": "eth0"}]);
    let env = vec![
        ("CNI_COMMAND".to_string(), "GC".to_string()),
        ("CNI_PATH".to_string(), sb.path("bin").display().to_string()),
    ];
    sb.run_env(&env, gc.to_string().as_bytes()).ok();

    assert_eq!(
        sb.cached(),
        vec!["ca.json"],
        "cb's plan is gone, ca's stays"
    );
    let calls = sb.calls();
    let dels: Vec<_> = calls.iter().filter(|c| c.command == "DEL").collect();
    let del_summary: Vec<_> = dels
        .iter()
        .map(|c| {
            (
                c.plugin.as_str(),
                c.env["CNI_CONTAINERID"].as_str(),
                c.env["CNI_IFNAME"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        del_summary,
        vec![("b-plugin", "cb", "net1"), ("cluster-plugin", "cb", "eth0")]
    );
    assert_eq!(dels[1].stdin["prevResult"], b_result);
    assert_eq!(dels[1].env["CNI_NETNS"], "/run/netns/fake-cb");

    let gcs: Vec<_> = calls.iter().filter(|c| c.command == "GC").collect();
    let valid = |plugin: &str| -> Option<Value> {
        gcs.iter()
            .find(|c| c.plugin == plugin)
            .map(|c| c.stdin["cni.dev/valid-attachments"].clone())
    };
    assert_eq!(
        valid("cluster-plugin"),
        Some(json!([{"containerID": "ca", "ifname": "eth0"}])),
        "{:?}",
        sb.call_summary()
    );
    // bnet is a 1.1.0 network plexus knows of with no valid attachment left: GC lets it collect everything.
    assert_eq!(
        valid("b-plugin"),
        Some(json!([])),
        "{:?}",
        sb.call_summary()
    );
    assert_eq!(valid("old-plugin"), None, "a 1.0.0 list gets no GC");
    assert_eq!(gcs.len(), 2, "{:?}", sb.call_summary());
    for c in &gcs {
        assert_eq!(c.stdin["cniVersion"], "1.1.0");
        assert!(!c.env.contains_key("CNI_CONTAINERID"), "{:?}", c.env);
    }
}

#[test]
fn gc_with_nothing_cached_still_collects_the_cluster_network() {
    let sb = Sandbox::new();
    sb.cluster_net("1.1.0");
    let mut gc = sb.conf(json!({"cniVersion": "1.1.0"}));
    // The runtime's pairs are the cluster network's own, cached or not: they are passed on unchanged.
    let valid = json!([{"containerID": "uncached", "ifname": "eth0"}]);
    gc["cni.dev/valid-attachments"] = valid.clone();
    let env = vec![
        ("CNI_COMMAND".to_string(), "GC".to_string()),
        ("CNI_PATH".to_string(), sb.path("bin").display().to_string()),
    ];
    sb.run_env(&env, gc.to_string().as_bytes()).ok();
    let calls = sb.calls();
    assert_eq!(calls.len(), 1, "{:?}", sb.call_summary());
    assert_eq!(calls[0].command, "GC");
    assert_eq!(calls[0].stdin["cni.dev/valid-attachments"], valid);
}

#[test]
fn gc_goes_on_past_a_corrupt_plan_and_reports_it() {
    let sb = Sandbox::new();
    sb.cluster_net("1.1.0");
    let conf = sb.conf(json!({"cniVersion": "1.1.0"}));
    sb.run("ADD", "stale", "", &conf).ok();
    let broken = sb.path("cache/attachments/broken.json");
    std::fs::write(&broken, "{ torn").unwrap();
    sb.clear_calls();
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([]);
    let env = vec![
        ("CNI_COMMAND".to_string(), "GC".to_string()),
        ("CNI_PATH".to_string(), sb.path("bin").display().to_string()),
    ];
    let run = sb.run_env(&env, gc.to_string().as_bytes());
    assert_cni_error(&run, 6, &[&broken.display().to_string()]);
    // The stale container was still torn down and the cluster network still collected.
    let summary: Vec<_> = sb
        .calls()
        .iter()
        .map(|c| (c.command.clone(), c.env.get("CNI_CONTAINERID").cloned()))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("DEL".to_string(), Some("stale".to_string())),
            ("GC".to_string(), None)
        ]
    );
    assert_eq!(sb.cached(), vec!["broken.json"]);
}

#[test]
fn a_missing_plugin_inside_a_list_does_not_stop_del_of_the_others() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    sb.fakes(&["first-plugin"]);
    sb.pod(POD_NS, "p", Some("pair"));
    sb.nad(
        POD_NS,
        "pair",
        Some(json!({"cniVersion": "1.0.0", "name": "pair",
            "plugins": [{"type": "first-plugin"}, {"type": "absent-plugin"}]})),
    );
    let conf = sb.conf(json!({}));
    let run = sb.run("ADD", "c1", &Sandbox::pod_args(POD_NS, "p"), &conf);
    assert_cni_error(&run, 7, &["absent-plugin", "ns/pair"]);
    // first-plugin attached net1 before absent-plugin was looked up: it must be deleted too.
    assert_nothing_attached(&sb, "c1");
    let s = |p: &str, c: &str, i: &str| (p.to_string(), c.to_string(), i.to_string());
    assert_eq!(
        sb.call_summary(),
        vec![
            s("cluster-plugin", "ADD", "eth0"),
            s("first-plugin", "ADD", "net1"),
            s("first-plugin", "DEL", "net1"),
            s("cluster-plugin", "DEL", "eth0"),
        ]
    );
}

#[test]
fn a_failed_rollback_keeps_the_original_code_and_the_plan_for_del() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    sb.fakes(&["bad-plugin"]);
    sb.pod(POD_NS, "p", Some("net-a"));
    sb.nad(
        POD_NS,
        "net-a",
        Some(json!({"cniVersion": "1.0.0", "name": "net-a", "type": "bad-plugin"})),
    );
    sb.fake_config(json!({
        "bad-plugin": {"ADD": {"error": {"code": 42, "msg": "address pool exhausted"}}},
        "cluster-plugin": {"DEL": {"error": {"code": 11, "msg": "bridge busy"}}},
    }));
    let conf = sb.conf(json!({}));
    let args = Sandbox::pod_args(POD_NS, "p");
    let run = sb.run("ADD", "c1", &args, &conf);
    // The runtime learns why ADD failed; the failed rollback is reported alongside.
    assert_cni_error(&run, 42, &["address pool exhausted", "bridge busy"]);
    assert_eq!(
        sb.cached(),
        vec!["c1.json"],
        "the plan stays for the runtime's DEL"
    );
    sb.fake_config(json!({}));
    sb.run("DEL", "c1", &args, &conf).ok();
    assert_nothing_attached(&sb, "c1");
}
