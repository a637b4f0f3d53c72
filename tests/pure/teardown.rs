//! Teardown that never sticks and never leaks, through the real `plexus` binary: delegates bounded in time and
//! bytes, DEL without a cache, repeated DELs, GC's preconditions, what a completed DEL leaves on disk, and a
//! read-only cache directory. Real-namespace cases are in e2e_netns.rs; the reliability report
//! (tests/soak.sh) repeats these faults many times.

use std::path::Path;

use plexus_tests::apiserver::{ApiServer, Fault};
use plexus_tests::plexus::{Run, Sandbox};
use serde_json::{json, Value};

const POD_NS: &str = "ns";

/// Processes whose command line contains `needle`.
fn processes_matching(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        if let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) {
                found.push(format!("{}: {cmd}", entry.file_name().to_string_lossy()));
            }
        }
    }
    found
}

/// Waits until `done` holds, at most 10 s (the caller asserts what it needs afterwards).
fn wait_until(mut done: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !done() && start.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Every file under `dir`, relative, sorted (nothing if it does not exist).
fn files_under(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
        {
            let p = e.path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[track_caller]
fn assert_small_error(run: &Run, code: u64) {
    assert_eq!(
        run.code(),
        code,
        "{}",
        &run.stdout[..run.stdout.len().min(2000)]
    );
    assert!(
        run.stdout.len() < 10_000,
        "the error object is {} bytes",
        run.stdout.len()
    );
}

#[test]
fn a_delegate_that_closes_stdout_and_keeps_running_is_killed_and_the_del_that_follows_runs() {
    let sb = Sandbox::new();
    sb.script_cluster("exec 1>&-; exec sleep 987651", "exit 0");
    let conf = sb.conf(json!({"delegateTimeoutMs": 500}));
    let run = sb.run("ADD", "c1", "", &conf);
    assert_small_error(&run, 101);
    assert!(run.msg().contains("did not finish within"), "{}", run.msg());
    assert!(
        processes_matching("sleep 987651").is_empty(),
        "the delegate outlived its deadline: {:?}",
        processes_matching("sleep 987651")
    );
    // Nothing was attached, so the DEL that follows has nothing to wait for.
    sb.run("DEL", "c1", "", &conf).ok();

    // The DEL verb is bounded the same way: an attached container whose delegate hangs in DEL.
    let result = r#"echo '{"cniVersion":"1.0.0"}'"#;
    sb.script_cluster(result, "exec 1>&-; exec sleep 987652");
    sb.run("ADD", "c2", "", &conf).ok();
    let run = sb.run("DEL", "c2", "", &conf);
    assert_small_error(&run, 101);
    assert!(processes_matching("sleep 987652").is_empty());
    assert_eq!(sb.cached(), vec!["c2.json"], "a failed DEL keeps the plan");
    // The lock was let go: the runtime's retry goes through.
    sb.script_cluster(result, "exit 0");
    sb.run("DEL", "c2", "", &conf).ok();
    assert!(sb.cached().is_empty(), "{:?}", sb.cached());
    assert_eq!(files_under(&sb.path("run/locks")), Vec::<String>::new());
}

#[test]
fn a_delegate_dies_with_a_killed_plexus() {
    // A runtime kills plexus at its own timeout and calls DEL at once: a delegate left running would attach
    // after that DEL.
    let sb = Sandbox::new();
    let marker = sb.path("attached-after-kill");
    let started = sb.path("delegate-started");
    sb.script_cluster(
        &format!(
            "touch {}; sleep 3; touch {}",
            started.display(),
            marker.display()
        ),
        "exit 0",
    );
    let conf = sb.conf(json!({}));
    let env = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "c1"),
        ("CNI_NETNS", "/run/netns/fake-c1"),
        ("CNI_IFNAME", "eth0"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()));
    let mut env = env.to_vec();
    env.push(("CNI_PATH".into(), sb.path("bin").display().to_string()));
    let mut child = plexus_tests::plexus::spawn_plexus(
        &env,
        conf.to_string().as_bytes(),
        std::process::Stdio::null(),
        std::process::Stdio::null(),
    );
    // Until the delegate runs; killed well before it would touch the marker, which is then looked for after the
    // delegate's whole sleep.
    wait_until(|| started.exists());
    child.kill().unwrap();
    child.wait().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(3500));
    assert!(
        !marker.exists(),
        "the delegate outlived plexus and finished its ADD"
    );
    // The runtime's DEL cleans up from the plan.
    sb.run("DEL", "c1", "", &conf).ok();
    assert!(sb.cached().is_empty());
}

/// The runtime that asked for an ADD is killed while the ADD runs (as a node's runtime is, mid-RunPodSandbox): the
/// ADD goes on to its end, sees that no one will take its answer, and tears down what it attached, as a DEL would.
/// A runtime that starts again may not know the sandbox, and then no DEL would ever come for it.
#[test]
fn an_add_whose_runtime_is_killed_before_its_answer_tears_itself_down() {
    use std::os::unix::process::CommandExt;
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0")
        .fake_config(json!({"cluster-plugin": {"ADD": {"sleepMs": 4000}}}));
    let conf_file = sb.path("conf.json");
    std::fs::write(&conf_file, sb.conf(json!({})).to_string()).unwrap();
    let (out, pid_file) = (sb.path("plexus.out"), sb.path("plexus.pid"));
    // The runtime: a shell that starts plexus and waits for it.
    let mut runtime = std::process::Command::new("sh")
        .args([
            "-c",
            r#""$0" <"$1" >"$2" 2>&1 & echo $! >"$3"; wait"#,
            plexus_tests::plexus::plexus_bin().to_str().unwrap(),
            conf_file.to_str().unwrap(),
            out.to_str().unwrap(),
            pid_file.to_str().unwrap(),
        ])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(sb.cni_env("ADD", "c1", ""))
        .process_group(0)
        .spawn()
        .unwrap();
    // Killed while the delegate runs (the plan is cached just before it), once the shell has written plexus's pid
    // (on a loaded machine plexus can plan before the shell's echo). The plan is written to a temporary file and
    // renamed: wait for its name.
    wait_until(|| {
        sb.planned("c1") && std::fs::read_to_string(&pid_file).is_ok_and(|p| p.ends_with('\n'))
    });
    assert_eq!(sb.cached(), vec!["c1.json".to_string()], "the ADD planned");
    runtime.kill().unwrap();
    runtime.wait().unwrap();
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    let proc_dir = Path::new("/proc").join(pid.trim());
    let alive = || {
        std::fs::read_to_string(proc_dir.join("stat")).is_ok_and(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    };
    wait_until(|| !alive());
    assert!(!alive(), "plexus did not finish");
    let said = std::fs::read_to_string(&out).unwrap();
    assert!(said.contains("exited before its answer"), "{said}");
    assert_eq!(
        sb.call_summary(),
        vec![
            ("cluster-plugin".into(), "ADD".into(), "eth0".into()),
            ("cluster-plugin".into(), "DEL".into(), "eth0".into()),
        ],
        "{said}"
    );
    assert!(sb.cached().is_empty(), "{said}");
    // The runtime, started again, may still DEL the sandbox: nothing to do, and no error.
    sb.run("DEL", "c1", "", &sb.conf(json!({}))).ok();
    assert_eq!(sb.call_summary().len(), 2);
}

/// The runtime kills the plugin during a DEL (CRI-O does, with SIGKILL, when the kubelet's request is cancelled,
/// and then never sends that DEL again): the teardown runs in a process of its own, which finishes it anyway.
#[test]
fn a_del_whose_plugin_is_killed_finishes_its_teardown() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0")
        .fake_config(json!({"cluster-plugin": {"DEL": {"sleepMs": 3000}}}));
    let conf = sb.conf(json!({}));
    sb.run("ADD", "c1", "", &conf).ok();
    assert_eq!(sb.cached(), vec!["c1.json".to_string()]);
    let mut plugin = plexus_tests::plexus::spawn_plexus(
        &sb.cni_env("DEL", "c1", ""),
        conf.to_string().as_bytes(),
        std::process::Stdio::null(),
        std::process::Stdio::null(),
    );
    // Killed while the delegate's DEL runs.
    wait_until(|| sb.call_summary().iter().any(|(_, c, _)| c == "DEL"));
    plugin.kill().unwrap();
    plugin.wait().unwrap();
    assert!(!sb.cached().is_empty(), "killed before the teardown ended");
    wait_until(|| sb.cached().is_empty());
    assert!(sb.cached().is_empty(), "the teardown did not finish");
    // The runtime's next DEL (containerd sends one) has nothing left to do.
    sb.run("DEL", "c1", "", &conf).ok();
    let dels = sb
        .call_summary()
        .iter()
        .filter(|(_, c, _)| c == "DEL")
        .count();
    assert_eq!(dels, 1);
}

#[test]
fn a_flooding_delegate_is_cut_off_and_plexus_stays_small() {
    let sb = Sandbox::new();
    sb.script_cluster("exec yes", "exit 0");
    let conf = sb.conf(json!({"delegateTimeoutMs": 20000}));
    let (run, rss) = sb.run_measured("ADD", "c1", "", &conf);
    assert_small_error(&run, 100);
    assert!(
        run.msg().contains("printed more than 1048576 bytes"),
        "{}",
        run.msg()
    );
    // Before the cap, plexus read `yes` until the deadline (1.6 GB in 3 s).
    assert!(rss < 200 * 1024, "plexus reached {rss} KiB");
    assert!(
        sb.cached().is_empty(),
        "nothing is cached: {:?}",
        sb.cached()
    );

    // An oversized result is refused the same way, and nothing of it reaches the cache.
    sb.script_cluster(
        r#"printf '{"cniVersion":"1.0.0","dns":{"domain":"'; head -c 3000000 /dev/zero | tr '\0' x; printf '"}}'"#,
        "exit 0",
    );
    assert_small_error(&sb.run("ADD", "c2", "", &conf), 100);
    assert!(sb.cached().is_empty(), "{:?}", sb.cached());
}

#[test]
fn long_messages_are_cut_before_they_reach_the_runtime() {
    let sb = Sandbox::new();
    // A CNI error object with a 400 KB message and details (under the stdout cap, so it is parsed and relayed).
    sb.script_cluster(
        r#"printf '{"cniVersion":"1.0.0","code":7,"msg":"'; head -c 400000 /dev/zero | tr '\0' m; printf '","details":"'; head -c 400000 /dev/zero | tr '\0' d; printf '"}'; exit 1"#,
        "exit 0",
    );
    let conf = sb.conf(json!({}));
    let run = sb.run("ADD", "c1", "", &conf);
    assert_small_error(&run, 7);
    assert!(run.msg().contains("more bytes)"), "{}", run.msg());
    assert!(
        run.stderr.len() < 64 * 1024,
        "the log line is {} bytes",
        run.stderr.len()
    );
    // A pod name far past Kubernetes' limit is refused without being echoed.
    let args = format!(
        "K8S_POD_NAMESPACE={POD_NS};K8S_POD_NAME={}",
        "p".repeat(60_000)
    );
    let run = sb.run("ADD", "c2", &args, &conf);
    assert_small_error(&run, 4);
    assert!(run.msg().contains("K8S_POD_NAME"), "{}", run.msg());
}

/// A pod selecting `gone` and `kept`, added; then the cache is wiped and the NAD `gone` deleted.
fn lost_cache_and_deleted_nad(sb: &Sandbox) -> Value {
    sb.cluster_net("1.0.0");
    sb.fakes(&["gone-plugin", "kept-plugin"]);
    sb.pod(POD_NS, "web", Some("gone,kept"));
    for n in ["gone", "kept"] {
        sb.nad(
            POD_NS,
            n,
            Some(json!({"cniVersion": "1.0.0", "name": n, "type": format!("{n}-plugin")})),
        );
    }
    let conf = sb.conf(json!({}));
    sb.run("ADD", "c1", &Sandbox::pod_args(POD_NS, "web"), &conf)
        .ok();
    std::fs::remove_dir_all(sb.path("cache")).unwrap();
    std::fs::remove_file(sb.path(&format!("cluster/nad-{POD_NS}-gone.json"))).unwrap();
    sb.clear_calls();
    conf
}

#[test]
fn del_without_a_cache_releases_every_network_that_still_resolves() {
    let sb = Sandbox::new();
    let conf = lost_cache_and_deleted_nad(&sb);
    let run = sb.run("DEL", "c1", &Sandbox::pod_args(POD_NS, "web"), &conf);
    // Success, so the pod can be deleted; what could not be released is named in the log.
    run.ok();
    assert_eq!(
        sb.call_summary(),
        vec![
            ("kept-plugin".into(), "DEL".into(), "net2".into()),
            ("cluster-plugin".into(), "DEL".into(), "eth0".into()),
        ],
        "the remaining network keeps the interface name its ADD gave it"
    );
    assert!(
        run.stderr.contains("cannot release") && run.stderr.contains("ns/gone"),
        "{}",
        run.stderr
    );
}

#[test]
fn add_after_a_completed_del_is_torn_down_by_the_next_del() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    let conf = sb.conf(json!({}));
    for _ in 0..2 {
        sb.run("ADD", "c1", "", &conf).ok();
        sb.clear_calls();
        sb.run("DEL", "c1", "", &conf).ok();
        assert_eq!(
            sb.call_summary(),
            vec![("cluster-plugin".into(), "DEL".into(), "eth0".into())],
            "a new ADD makes the container's next DEL real again"
        );
    }
    // The repeated DEL is answered from the record: no delegate runs.
    sb.clear_calls();
    sb.run("DEL", "c1", "", &conf).ok();
    assert!(sb.calls().is_empty(), "{:?}", sb.call_summary());
}

#[test]
fn a_completed_del_leaves_nothing_for_the_container_but_its_record() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    let conf = sb.conf(json!({}));
    sb.run("ADD", "c1", "", &conf).ok();
    // What a process killed between writing the plan's temp file and renaming it leaves.
    std::fs::write(sb.path("cache/attachments/.c1.json.tmp"), "{\"torn").unwrap();
    sb.run("DEL", "c1", "", &conf).ok();
    assert_eq!(files_under(&sb.path("cache")), Vec::<String>::new());
    assert_eq!(
        files_under(&sb.path("run")),
        vec!["deleted/.pruned", "deleted/c1"]
    );

    // A killed ADD that never planned leaves its temp file too; DEL without a cache removes it.
    std::fs::write(sb.path("cache/attachments/.c2.json.tmp"), "{").unwrap();
    sb.run("DEL", "c2", "", &conf).ok();
    assert_eq!(files_under(&sb.path("cache")), Vec::<String>::new());
    assert!(files_under(&sb.path("run/locks")).is_empty());
}

#[test]
fn gc_collects_temp_files_of_killed_adds_and_expired_del_records() {
    let sb = Sandbox::new();
    sb.cluster_net("1.1.0");
    let conf = sb.conf(json!({"cniVersion": "1.1.0"}));
    sb.run("ADD", "live", "", &conf).ok();
    std::fs::write(sb.path("cache/attachments/.dead.json.tmp"), "{").unwrap();
    std::fs::write(sb.path("cache/attachments/.old.json.777.tmp"), "{").unwrap();
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "live", "ifname": "eth0"}]);
    let env = vec![
        ("CNI_COMMAND".to_string(), "GC".to_string()),
        ("CNI_PATH".to_string(), sb.path("bin").display().to_string()),
    ];
    // A record of a DEL older than its 24 h, and a fresh one.
    std::fs::create_dir_all(sb.path("run/deleted")).unwrap();
    for name in ["expired", "fresh"] {
        std::fs::write(sb.path(&format!("run/deleted/{name}")), "").unwrap();
    }
    std::fs::File::options()
        .write(true)
        .open(sb.path("run/deleted/expired"))
        .unwrap()
        .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(25 * 3600))
        .unwrap();
    sb.run_env(&env, gc.to_string().as_bytes()).ok();
    assert_eq!(
        files_under(&sb.path("cache/attachments")),
        vec!["live.json", "live.results"]
    );
    assert_eq!(
        files_under(&sb.path("run/deleted")),
        vec![".pruned", "fresh"],
        "GC prunes expired DEL records"
    );
}

#[test]
fn gc_needs_cni_1_1_and_the_valid_attachments_key() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    let conf = sb.conf(json!({}));
    sb.run("ADD", "c1", "", &conf).ok();
    sb.clear_calls();
    let env = vec![
        ("CNI_COMMAND".to_string(), "GC".to_string()),
        ("CNI_PATH".to_string(), sb.path("bin").display().to_string()),
    ];
    // GC exists from cniVersion 1.1.0: a 1.0.0 conf gets "incompatible version", and nothing is torn down.
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([]);
    let run = sb.run_env(&env, gc.to_string().as_bytes());
    assert_eq!(run.code(), 1, "{}", run.stdout);
    assert!(run.msg().contains("GC"), "{}", run.msg());
    // A 1.1.0 GC without the key is an error, not "nothing is valid".
    let mut gc = conf.clone();
    gc["cniVersion"] = json!("1.1.0");
    let run = sb.run_env(&env, gc.to_string().as_bytes());
    assert_eq!(run.code(), 7, "{}", run.stdout);
    assert!(
        run.msg().contains("cni.dev/valid-attachments"),
        "{}",
        run.msg()
    );
    assert!(sb.calls().is_empty(), "{:?}", sb.call_summary());
    assert_eq!(sb.cached(), vec!["c1.json"]);
}

/// A read-only tmpfs mounted over `dir` until dropped.
struct ReadOnlyMount(std::path::PathBuf);

impl ReadOnlyMount {
    fn new(dir: &Path) -> ReadOnlyMount {
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "ro,size=1m", "plexus-ro"])
            .arg(dir)
            .status()
            .unwrap()
            .success();
        assert!(
            ok,
            "mount a read-only tmpfs on {} (needs root)",
            dir.display()
        );
        ReadOnlyMount(dir.to_path_buf())
    }
}

impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_del_with_nothing_to_do_succeeds_on_a_read_only_cache_dir() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    let conf = sb.conf(json!({}));
    let _ro = ReadOnlyMount::new(&sb.path("cache"));
    sb.run("DEL", "never-added", "", &conf).ok();
    // The cluster network still got its DEL (its IPAM may hold an address for the id).
    assert_eq!(
        sb.call_summary(),
        vec![("cluster-plugin".into(), "DEL".into(), "eth0".into())]
    );
}

#[test]
fn more_selections_than_the_limit_are_refused_naming_it() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    let names: Vec<String> = (0..65).map(|i| format!("n{i}")).collect();
    sb.pod(POD_NS, "many", Some(&names.join(",")));
    let run = sb.run(
        "ADD",
        "c1",
        &Sandbox::pod_args(POD_NS, "many"),
        &sb.conf(json!({})),
    );
    assert_eq!(run.code(), 7, "{}", run.stdout);
    assert!(run.msg().contains("at most 64"), "{}", run.msg());
    assert!(sb.calls().is_empty());
}

// The Kubernetes source (the API server emulator over real HTTP): what DEL asks the API.

fn kube_sandbox(server: &ApiServer) -> (Sandbox, Value) {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    sb.fakes(&["gone-plugin", "kept-plugin"]);
    let kubeconfig = sb.path("kubeconfig");
    server.write_kubeconfig(&kubeconfig);
    kube_objects(server);
    let conf = sb.conf(json!({"cluster": {
        "source": "kube", "kubeconfig": kubeconfig,
        "requestTimeoutMs": 1000, "deadlineMs": 3000, "retries": 2,
        "initialBackoffMs": 10, "maxBackoffMs": 20
    }}));
    (sb, conf)
}

/// Pod `web` selecting `gone` and `kept`, and both NADs.
fn kube_objects(server: &ApiServer) {
    server.add_pod(json!({"metadata": {
        "name": "web", "namespace": POD_NS, "uid": "uid-web",
        "annotations": {"k8s.v1.cni.cncf.io/networks": "gone,kept"}
    }}));
    for n in ["gone", "kept"] {
        server.add_nad(json!({
            "metadata": {"name": n, "namespace": POD_NS},
            "spec": {"config": format!("{{\"cniVersion\":\"1.0.0\",\"type\":\"{n}-plugin\"}}")}
        }));
    }
}

#[test]
fn a_repeated_del_asks_the_api_nothing_whatever_it_does() {
    let server = ApiServer::start();
    let (sb, conf) = kube_sandbox(&server);
    let args = Sandbox::pod_args(POD_NS, "web");
    sb.run("ADD", "c1", &args, &conf).ok();
    sb.run("DEL", "c1", &args, &conf).ok();
    sb.clear_calls();
    server.clear_requests();
    // The API hangs: a re-plan would wait out its deadline.
    server.inject(
        "GET",
        "/api/v1/namespaces/ns/pods/web",
        Fault::Hang,
        usize::MAX,
    );
    let run = sb.run("DEL", "c1", &args, &conf);
    run.ok();
    assert!(server.requests().is_empty(), "{:?}", server.requests());
    assert!(sb.calls().is_empty(), "{:?}", sb.call_summary());
    // And refused (the server is gone): the same answer, still without a warning.
    drop(server);
    let run = sb.run("DEL", "c1", &args, &conf);
    run.ok();
    assert!(!run.stderr.contains("WARN"), "{}", run.stderr);
}

#[test]
fn del_without_a_cache_names_a_deleted_nad_in_a_warning_event() {
    let server = ApiServer::start();
    let (sb, conf) = kube_sandbox(&server);
    let args = Sandbox::pod_args(POD_NS, "web");
    sb.run("ADD", "c1", &args, &conf).ok();
    std::fs::remove_dir_all(sb.path("cache")).unwrap();
    server.remove_nad(POD_NS, "gone");
    sb.clear_calls();
    sb.run("DEL", "c1", &args, &conf).ok();
    assert_eq!(
        sb.call_summary(),
        vec![
            ("kept-plugin".into(), "DEL".into(), "net2".into()),
            ("cluster-plugin".into(), "DEL".into(), "eth0".into()),
        ]
    );
    let warnings: Vec<Value> = server
        .events()
        .into_iter()
        .filter(|e| e["type"] == "Warning")
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0]["reason"], "TeardownIncomplete");
    let msg = warnings[0]["message"].as_str().unwrap();
    assert!(
        msg.contains("ns/gone") && msg.contains("not found"),
        "{msg}"
    );
}

#[test]
fn a_del_that_could_not_ask_the_api_is_not_recorded_and_the_next_one_releases_the_rest() {
    let server = ApiServer::start();
    let (sb, conf) = kube_sandbox(&server);
    let args = Sandbox::pod_args(POD_NS, "web");
    sb.run("ADD", "c1", &args, &conf).ok();
    std::fs::remove_dir_all(sb.path("cache")).unwrap();
    sb.clear_calls();
    // The API refuses every request: only the cluster network (from confDir) can be released.
    server.inject("*", "*", Fault::Status(503), usize::MAX);
    sb.run("DEL", "c1", &args, &conf).ok();
    assert_eq!(
        sb.call_summary(),
        vec![("cluster-plugin".into(), "DEL".into(), "eth0".into())]
    );
    assert!(
        !sb.path("run/deleted/c1").exists(),
        "a DEL that could not ask the API is not complete"
    );
    // The API is back: the runtime's next DEL re-plans and releases the pod's own networks.
    drop(server);
    let server = ApiServer::start();
    kube_objects(&server);
    server.write_kubeconfig(&sb.path("kubeconfig"));
    sb.clear_calls();
    sb.run("DEL", "c1", &args, &conf).ok();
    let plugins: Vec<String> = sb.call_summary().into_iter().map(|c| c.0).collect();
    assert_eq!(
        plugins,
        vec!["kept-plugin", "gone-plugin", "cluster-plugin"]
    );
    assert!(sb.path("run/deleted/c1").exists());
}
