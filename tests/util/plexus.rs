//! Running the real `plexus` binary in a throwaway sandbox of directories, with recording fake delegates.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

/// The cargo target directory: `CARGO_TARGET_DIR`, or the workspace's `target/`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// `target/release/plexus` (or under `CARGO_TARGET_DIR`); the test command builds it first.
pub fn plexus_bin() -> PathBuf {
    let target = target_dir();
    let bin = target.join("release/plexus");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --release -p plexus` first (tests/run.sh does)",
        bin.display()
    );
    bin
}

/// `target/release/plexus-cni`, the CNI plugin without the compiler: the test command builds it on its own
/// (`cargo build --release -p plexus-cni`) after the workspace, so that the features plexus-node turns on in its
/// dependencies (the wasm compiler, the watch runtime) are not unified into it.
pub fn plexus_cni_bin() -> PathBuf {
    let target = target_dir();
    let bin = target.join("release/plexus-cni");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --release --workspace --bins` (tests/run.sh does)",
        bin.display()
    );
    bin
}

/// A guest component built by `guests/build.sh` (the test command runs it), by crate name.
pub fn guest_wasm(name: &str) -> PathBuf {
    let target = target_dir();
    let p = target.join("guests").join(format!("{name}.wasm"));
    assert!(
        p.exists(),
        "{} is missing: run guests/build.sh (tests/run.sh does)",
        p.display()
    );
    p
}

/// The builds of an example hook that tests run alike: the Rust guest `name` and its Python build
/// (`guests/python/<name>`, built to `py-<name>.wasm`), which must answer exactly as the Rust one.
pub fn example_builds(name: &str) -> [String; 2] {
    [name.to_string(), format!("py-{name}")]
}

/// The fake delegate built with this test crate.
pub fn fake_cni_bin() -> PathBuf {
    let target = target_dir();
    let bin = target.join("release/fake-cni");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --release -p plexus-tests --bin fake-cni`",
        bin.display()
    );
    bin
}

/// Starts plexus with exactly this environment (plus PATH), writes `stdin` and closes it; stdout and stderr go
/// where the caller says. For tests that kill it, time it or reap it themselves.
pub fn spawn_plexus(
    env: &[(String, String)],
    stdin: &[u8],
    stdout: Stdio,
    stderr: Stdio,
) -> std::process::Child {
    spawn_bin(&plexus_bin(), env, stdin, stdout, stderr)
}

/// [`spawn_plexus`] for another binary (`plexus-cni`, or a wrapper script a test has just written). A file just
/// written can be busy for an instant (ETXTBSY): a child another test thread forked while it was open for writing
/// holds it until that child execs. The spawn is tried again for up to a second then.
pub fn spawn_bin(
    bin: &Path,
    env: &[(String, String)],
    stdin: &[u8],
    stdout: Stdio,
    stderr: Stdio,
) -> std::process::Child {
    let mut command = Command::new(bin);
    command
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(stdout)
        .stderr(stderr);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    let mut child = loop {
        match command.spawn() {
            Err(e)
                if e.kind() == std::io::ErrorKind::ExecutableFileBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            spawned => break spawned.expect("spawn plexus"),
        }
    };
    // A plexus killed before it read its stdin closes the pipe: that is the caller's business.
    let _ = child.stdin.take().expect("stdin piped").write_all(stdin);
    child
}

/// One recorded delegate call.
#[derive(Debug, Clone)]
pub struct Call {
    pub plugin: String,
    pub command: String,
    pub env: BTreeMap<String, String>,
    pub stdin: Value,
}

/// What plexus printed and how it exited.
#[derive(Debug, Clone)]
pub struct Run {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {:?}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }
    /// The CNI error code, asserting this run failed with an error object.
    pub fn code(&self) -> u64 {
        assert!(
            !self.success,
            "expected failure, got success: {}",
            self.stdout
        );
        self.json()["code"]
            .as_u64()
            .unwrap_or_else(|| panic!("no code in {}", self.stdout))
    }
    pub fn msg(&self) -> String {
        self.json()["msg"].as_str().unwrap_or_default().to_string()
    }
    #[track_caller]
    pub fn ok(&self) -> &Self {
        assert!(
            self.success,
            "plexus failed: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        self
    }
}

/// A temp tree: `bin/` (fake delegates), `net.d/` (confDir), `cluster/` (FileCluster), `cache/`, `run/`.
pub struct Sandbox {
    pub root: tempfile::TempDir,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Sandbox {
    pub fn new() -> Self {
        let root = tempfile::Builder::new()
            .prefix("plexus-test-")
            .tempdir()
            .expect("tempdir");
        for d in ["bin", "net.d", "cluster", "cache", "run"] {
            std::fs::create_dir_all(root.path().join(d)).unwrap();
        }
        Self { root }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }

    /// Installs the recording fake under each name.
    pub fn fakes(&self, names: &[&str]) -> &Self {
        let bin = fake_cni_bin();
        for n in names {
            let dst = self.path("bin").join(n);
            let _ = std::fs::remove_file(&dst);
            std::os::unix::fs::symlink(&bin, &dst).unwrap();
        }
        self
    }

    /// Sets fake behaviour: `{"<plugin>": {"<COMMAND>": {...}}}` (see fake_cni.rs).
    pub fn fake_config(&self, config: Value) -> &Self {
        std::fs::write(self.path("bin/fake-config.json"), config.to_string()).unwrap();
        self
    }

    /// The cluster network `cluster-net` as one shell-script plugin, `cluster-script`: `add` runs for ADD, `del`
    /// for DEL (each a line of sh); other verbs do nothing. For delegates that misbehave (hang, flood, die).
    pub fn script_cluster(&self, add: &str, del: &str) -> &Self {
        use std::os::unix::fs::PermissionsExt;
        let path = self.path("bin/cluster-script");
        let body =
            format!("#!/bin/sh\ncase \"$CNI_COMMAND\" in\nADD) {add} ;;\nDEL) {del} ;;\nesac\n");
        std::fs::write(&path, body).expect("write the script delegate");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        self.conf_file(
            "00-cluster.conflist",
            &json!({"cniVersion": "1.0.0", "name": "cluster-net", "plugins": [{"type": "cluster-script"}]}),
        )
    }

    /// Writes a file into `net.d/` (the confDir).
    pub fn conf_file(&self, name: &str, value: &Value) -> &Self {
        std::fs::write(
            self.path("net.d").join(name),
            serde_json::to_vec_pretty(value).unwrap(),
        )
        .unwrap();
        self
    }

    /// Writes a manifest into `cluster/`.
    pub fn manifest(&self, name: &str, yaml: &str) -> &Self {
        std::fs::write(self.path("cluster").join(name), yaml).unwrap();
        self
    }

    /// A pod manifest with the given networks annotation (None: no annotation).
    pub fn pod(&self, namespace: &str, name: &str, networks: Option<&str>) -> &Self {
        let mut meta = json!({"name": name, "namespace": namespace, "uid": format!("uid-{name}"), "labels": {"app": name}});
        if let Some(n) = networks {
            meta["annotations"] = json!({"k8s.v1.cni.cncf.io/networks": n});
        }
        let doc = json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta});
        self.manifest(&format!("pod-{namespace}-{name}.json"), &doc.to_string())
    }

    /// A NAD manifest; `config` None makes one without spec (spec 3.2.4).
    pub fn nad(&self, namespace: &str, name: &str, config: Option<Value>) -> &Self {
        let mut doc = json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": namespace}});
        if let Some(c) = config {
            doc["spec"] = json!({"config": c.to_string()});
        }
        self.manifest(&format!("nad-{namespace}-{name}.json"), &doc.to_string())
    }

    /// The base plexus conf: cluster network `cluster-net` from `net.d/`, FileCluster, sandbox dirs.
    pub fn conf(&self, extra: Value) -> Value {
        let mut c = json!({
            "cniVersion": "1.0.0",
            "name": "plexus",
            "type": "plexus",
            "clusterNetwork": "cluster-net",
            "confDir": self.path("net.d"),
            "cacheDir": self.path("cache"),
            "runDir": self.path("run"),
            "cluster": {"source": "files", "dir": self.path("cluster")},
            "logLevel": "debug",
            // A test's node runs no node agent unless the test says so ("clusterHooks": true in `extra`).
            "clusterHooks": false,
        });
        if let Value::Object(m) = extra {
            for (k, v) in m {
                c[k] = v;
            }
        }
        c
    }

    /// The default cluster network: a one-plugin list of the fake `cluster-plugin`.
    pub fn cluster_net(&self, version: &str) -> &Self {
        self.fakes(&["cluster-plugin"]);
        self.conf_file(
            "00-cluster.conflist",
            &json!({"cniVersion": version, "name": "cluster-net", "plugins": [{"type": "cluster-plugin", "capabilities": {"portMappings": true}}]}),
        )
    }

    /// CNI_ARGS for a pod.
    pub fn pod_args(namespace: &str, name: &str) -> String {
        format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};K8S_POD_UID=uid-{name}")
    }

    /// Runs plexus with `CNI_COMMAND=command` for container `id`, netns `/run/netns/fake-<id>`.
    pub fn run(&self, command: &str, id: &str, cni_args: &str, conf: &Value) -> Run {
        self.run_bin(&plexus_bin(), command, id, cni_args, conf)
    }

    /// [`Sandbox::run`] with another plexus binary (`plexus-cni`).
    pub fn run_bin(
        &self,
        bin: &Path,
        command: &str,
        id: &str,
        cni_args: &str,
        conf: &Value,
    ) -> Run {
        let env = self.cni_env(command, id, cni_args);
        let child = spawn_bin(
            bin,
            &env,
            conf.to_string().as_bytes(),
            Stdio::piped(),
            Stdio::piped(),
        );
        let out = child.wait_with_output().unwrap();
        Run {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// [`Sandbox::run`], and the peak resident memory (KiB) of that one plexus process, as GNU time reports it
    /// for its own child. Not `wait4` of a child of this test process: a child spawned from a large process (the
    /// suite, with its servers' buffers) carries that process's high-water mark across exec.
    pub fn run_measured(
        &self,
        command: &str,
        id: &str,
        cni_args: &str,
        conf: &Value,
    ) -> (Run, i64) {
        use std::io::Write;
        let report = self.path(&format!("maxrss-{id}"));
        let mut child = Command::new("/usr/bin/time")
            .args(["-f", "%M", "-o"])
            .arg(&report)
            .arg(plexus_bin())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(self.cni_env(command, id, cni_args))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn /usr/bin/time (Debian's time package, tests/setup.sh)");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(conf.to_string().as_bytes()).unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        let text = std::fs::read_to_string(&report).unwrap();
        // A failed command's report starts with a line about its status; the figure is the last line.
        let kib = text
            .lines()
            .last()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or_else(|| panic!("no figure in {text:?}"));
        let run = Run {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        (run, kib)
    }

    /// The CNI environment of [`Sandbox::run`].
    pub fn cni_env(&self, command: &str, id: &str, cni_args: &str) -> Vec<(String, String)> {
        let env = [
            ("CNI_COMMAND", command.to_string()),
            ("CNI_CONTAINERID", id.to_string()),
            ("CNI_NETNS", format!("/run/netns/fake-{id}")),
            ("CNI_IFNAME", "eth0".to_string()),
            ("CNI_PATH", self.path("bin").display().to_string()),
            ("CNI_ARGS", cni_args.to_string()),
        ];
        env.iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    /// Runs plexus with exactly this environment (plus PATH) and stdin.
    pub fn run_env(&self, env: &[(String, String)], stdin: &[u8]) -> Run {
        let child = spawn_plexus(env, stdin, Stdio::piped(), Stdio::piped());
        let out = child.wait_with_output().unwrap();
        Run {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Every recorded delegate call so far, in order (a line still being written, without its newline, is not
    /// one yet).
    pub fn calls(&self) -> Vec<Call> {
        let Ok(text) = std::fs::read_to_string(self.path("bin/calls.jsonl")) else {
            return Vec::new();
        };
        text.split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                Call {
                    plugin: v["plugin"].as_str().unwrap().into(),
                    command: v["command"].as_str().unwrap().into(),
                    env: serde_json::from_value(v["env"].clone()).unwrap(),
                    stdin: v["stdin"].clone(),
                }
            })
            .collect()
    }

    /// Forgets recorded calls.
    pub fn clear_calls(&self) {
        let _ = std::fs::remove_file(self.path("bin/calls.jsonl"));
    }

    /// `(plugin, command, CNI_IFNAME)` of every call, for order assertions.
    pub fn call_summary(&self) -> Vec<(String, String, String)> {
        self.calls()
            .into_iter()
            .map(|c| {
                (
                    c.plugin,
                    c.command,
                    c.env.get("CNI_IFNAME").cloned().unwrap_or_default(),
                )
            })
            .collect()
    }

    /// The written network-status for a pod, if any.
    pub fn status(&self, namespace: &str, pod: &str) -> Option<Value> {
        let text =
            std::fs::read_to_string(self.path(&format!("cluster/status/{namespace}/{pod}.json")))
                .ok()?;
        Some(serde_json::from_str(&text).unwrap())
    }

    /// The attachment cache's plans (`<id>.json`) left, plus any results journal without its plan (a leak).
    pub fn cached(&self) -> Vec<String> {
        list_cache(&self.path("cache/attachments"))
    }

    /// Whether container `id`'s plan is in the cache (renamed into place: its temporary file does not count).
    pub fn planned(&self, id: &str) -> bool {
        self.path("cache/attachments")
            .join(format!("{id}.json"))
            .exists()
    }

    /// The plan cached for container `id` with its results journal applied, as plexus reads it.
    pub fn cached_plan(&self, id: &str) -> Option<Value> {
        read_cached_plan(&self.path("cache/attachments"), id)
    }
}

/// The plans (`<id>.json`) in an attachment cache directory, plus any `<id>.results` journal whose plan is gone
/// (which would be a leak), sorted.
pub fn list_cache(dir: &Path) -> Vec<String> {
    let names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let mut v: Vec<String> = names
        .iter()
        .filter(|n| match n.strip_suffix(".results") {
            Some(id) => !names.contains(&format!("{id}.json")),
            None => true,
        })
        .cloned()
        .collect();
    v.sort();
    v
}

/// Plan `<id>.json` with the results of its journal `<id>.results` applied (one JSON line per record, the last
/// for an attachment wins; a torn last line is ignored), the format documented in host/cni/src/cache.rs.
pub fn read_cached_plan(dir: &Path, id: &str) -> Option<Value> {
    let text = std::fs::read(dir.join(format!("{id}.json"))).ok()?;
    let mut plan: Value = serde_json::from_slice(&text).expect("cached plan is JSON");
    if let Ok(journal) = std::fs::read_to_string(dir.join(format!("{id}.results"))) {
        for line in journal.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
            let rec: Value = serde_json::from_str(line).expect("journal line is JSON");
            let i = rec["index"].as_u64().expect("record index") as usize;
            plan["attachments"][i]["result"] = rec["result"].clone();
        }
    }
    Some(plan)
}

/// `plexus daemon` started by a test: killed (`kill -9`) and reaped when dropped.
pub struct NodeDaemon {
    /// The process, for tests that signal or reap it themselves.
    pub child: std::process::Child,
    /// Its socket (`--socket`).
    pub socket: PathBuf,
    /// Its stderr.
    pub log: PathBuf,
}

/// The daemon answers ADDs from its caches alone: pods and NADs synced, and it knows whether the API server serves
/// Dynamic Resource Allocation and, where it does, has synced the claims and slices (until then the CNI process
/// reads a pod's claims, and writes what follows from them, itself).
pub fn settled(h: &plexus_cni::daemon::proto::DaemonHealth) -> bool {
    h.cache.settled()
}

impl NodeDaemon {
    /// Starts `plexus daemon` for node `node`, logging at debug level to `log`, with `--kubeconfig`, `--socket`
    /// and `--cache-dir` set and no metrics endpoint unless `extra` asks for one (tests run daemons side by
    /// side); `extra` holds the other flags.
    pub fn start(
        node: &str,
        kubeconfig: &Path,
        socket: &Path,
        cache_dir: &Path,
        log: &Path,
        extra: &[&str],
    ) -> NodeDaemon {
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir).expect("the socket's directory");
        }
        let child = Command::new(plexus_bin())
            .args(["daemon", "--node-name", node, "--log-level", "debug"])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--socket")
            .arg(socket)
            .arg("--cache-dir")
            .arg(cache_dir)
            .args(
                (!extra.contains(&"--metrics-bind-address"))
                    .then_some(["--metrics-bind-address", "0"])
                    .into_iter()
                    .flatten(),
            )
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("the daemon's log"))
            .spawn()
            .expect("start plexus daemon");
        NodeDaemon {
            child,
            socket: socket.to_path_buf(),
            log: log.to_path_buf(),
        }
    }

    /// Its health, or `None` while it does not answer (within 2 s).
    pub fn health(&self) -> Option<plexus_cni::daemon::proto::DaemonHealth> {
        daemon_health(&self.socket)
    }

    /// Waits (at most `secs`) until its log has `text`; fails naming `what`, with its log, if it does not.
    #[track_caller]
    pub fn wait_for_log(&self, text: &str, secs: u64, what: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        while !self.log_text().contains(text) {
            assert!(
                std::time::Instant::now() < deadline,
                "daemon: {what} not within {secs} s; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Waits (at most 30 s) until `ok` holds for its health; fails naming `what`, with its log, if it does not.
    #[track_caller]
    pub fn wait(
        &self,
        what: &str,
        ok: impl Fn(&plexus_cni::daemon::proto::DaemonHealth) -> bool,
    ) -> plexus_cni::daemon::proto::DaemonHealth {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if let Some(h) = self.health() {
                if ok(&h) {
                    return h;
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "daemon: {what} not reached within 30 s; health {:?}; log:\n{}",
                self.health(),
                self.log_text()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Everything it logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The health of the node daemon serving `socket`, or `None` while it does not answer (within 2 s).
pub fn daemon_health(socket: &Path) -> Option<plexus_cni::daemon::proto::DaemonHealth> {
    use plexus_cni::daemon::proto::{Answer, Request};
    match plexus_cni::daemon::client::ask(
        socket,
        &Request::Health,
        std::time::Duration::from_secs(2),
    ) {
        Ok(Answer::Health(h)) => Some(h),
        _ => None,
    }
}

impl Drop for NodeDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
