//! One benchmark world: plexus's directories (confDir, FileCluster manifests, cache, run), the network
//! configurations of a pod's attachments, and how to run an ADD/DEL either through plexus or through the floor
//! driver on exactly the same configurations.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use plexus_tests::netns::{cni_bin_dir, unique_subnet24, HostBridge, IpamDir};
use serde_json::{json, Value};

use crate::floor;
use crate::noop;
use crate::proc::{self, ChildRun};

pub const POD_NS: &str = "bench";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delegates {
    /// The bench binary as `bench-noop`: prints a fixed result.
    Noop,
    /// Debian's bridge + host-local, in real namespaces.
    Real,
}

impl Delegates {
    pub fn as_str(self) -> &'static str {
        match self {
            Delegates::Noop => "noop",
            Delegates::Real => "real",
        }
    }
}

/// One network of the pod: the list the delegates get, and the interface it is attached as.
#[derive(Debug, Clone)]
pub struct Net {
    pub list: Value,
    pub ifname: String,
}

pub struct World {
    pub root: PathBuf,
    /// plexus's runDir (locks, the daemon's socket and status queue), on tmpfs as a node's /run is.
    pub run: PathBuf,
    /// Made by [`World::new`] (not re-opened by a child process): its run dir goes with it.
    owned: bool,
    pub delegates: Delegates,
    pub nets: Vec<Net>,
    pub cni_path: String,
    stderr_log: PathBuf,
    _bridges: Vec<HostBridge>,
    _ipam: Option<IpamDir>,
}

/// A world's runDir: on tmpfs (/dev/shm), as /run is on a node, so that locks and the daemon's status queue
/// cost what they cost there.
fn run_dir(tag: &str) -> PathBuf {
    Path::new("/dev/shm").join(format!("plexus-bench-{tag}"))
}

impl Drop for World {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.run);
        }
    }
}

/// Where the guests are (`guests/build.sh` output).
pub fn guest(target: &Path, name: &str) -> PathBuf {
    target.join("guests").join(format!("{name}.wasm"))
}

/// The languages the example hooks are written in, and the prefix of their builds' names (`guests/build.sh`).
pub const LANGUAGES: [(&str, &str); 3] = [("Rust", ""), ("Python", "py-"), ("TypeScript", "ts-")];

/// The bench's hooks written in every language of [`LANGUAGES`]: all of [`example_hooks`] but the resolver.
pub fn hooks_in_every_language() -> Vec<(&'static str, &'static str, &'static str, Value)> {
    example_hooks()
        .into_iter()
        .filter(|(_, _, kind, _)| *kind != "resolver")
        .collect()
}

/// A set of three hooks in one language: (hook name, guest build, kind, settings).
pub type HookSet = Vec<(String, String, &'static str, Value)>;

/// The three hooks written in the language whose builds start with `prefix` ([`LANGUAGES`]): for Rust the bench's
/// three example hooks, for Python and TypeScript two policies and a status hook (no resolver is written in those
/// languages). Names and builds carry the prefix.
pub fn hook_set(prefix: &str) -> HookSet {
    let named = |(name, guest, kind, settings): (&str, &str, &'static str, Value)| {
        (
            format!("{prefix}{name}"),
            format!("{prefix}{guest}"),
            kind,
            settings,
        )
    };
    match prefix {
        "" => example_hooks().into_iter().map(named).collect(),
        _ => hooks_in_every_language()
            .into_iter()
            .chain([(
                "prefix",
                "pod-prefix",
                "policy",
                json!({"allowedPrefixes": ["net"]}),
            )])
            .map(named)
            .collect(),
    }
}

/// [`hook_set`] of every language of [`LANGUAGES`], Rust first.
pub fn hook_sets() -> Vec<(&'static str, HookSet)> {
    LANGUAGES
        .into_iter()
        .map(|(language, prefix)| (language, hook_set(prefix)))
        .collect()
}

/// The bench's three hooks, from the example guests: (name, guest, kind, settings).
pub fn example_hooks() -> [(&'static str, &'static str, &'static str, Value); 3] {
    [
        (
            "isolation",
            "namespace-isolation",
            "policy",
            json!({"globalNamespaces": ["default"]}),
        ),
        (
            "templates",
            "network-templates",
            "resolver",
            json!({"templates": {"lab": {"cniVersion": "1.0.0", "type": "bridge", "bridge": "lab0"}}}),
        ),
        (
            "labels",
            "status-labels",
            "status",
            json!({"labels": ["app", "tier"]}),
        ),
    ]
}

impl World {
    /// A world under `base/<tag>` (wiped first) whose pods have `attachments` networks: the cluster network
    /// plus `attachments - 1` NADs in the pod's namespace. `pods` pod manifests `pod-0..` select all of them.
    /// `extra` is merged into every delegate plugin conf (the serialization check's log).
    pub fn new(
        base: &Path,
        tag: &str,
        delegates: Delegates,
        attachments: usize,
        pods: usize,
        extra: &Value,
    ) -> World {
        let root = base.join(tag);
        let _ = std::fs::remove_dir_all(&root);
        for d in ["bin", "net.d", "cluster", "cache"] {
            std::fs::create_dir_all(root.join(d)).expect("create bench dirs");
        }
        let run = run_dir(tag);
        let _ = std::fs::remove_dir_all(&run);
        std::fs::create_dir_all(&run).expect("create the bench run dir");
        let mut bridges = Vec::new();
        let ipam = (delegates == Delegates::Real).then(IpamDir::new);
        let cni_path = match delegates {
            Delegates::Noop => {
                let me = std::env::current_exe().expect("current exe");
                std::os::unix::fs::symlink(me, root.join("bin").join(noop::NAME))
                    .expect("symlink the no-op delegate");
                root.join("bin").display().to_string()
            }
            Delegates::Real => cni_bin_dir().to_string(),
        };
        let plugin = |bridges: &mut Vec<HostBridge>| -> Value {
            let mut p = match delegates {
                Delegates::Noop => json!({"type": noop::NAME}),
                Delegates::Real => {
                    let br = HostBridge::reserve("bb");
                    let subnet = unique_subnet24();
                    let p = json!({"type": "bridge", "bridge": br.name(), "isGateway": true, "ipMasq": false,
                        "ipam": {"type": "host-local", "dataDir": ipam.as_ref().expect("ipam").path(),
                                 "ranges": [[{"subnet": subnet.cidr(), "gateway": subnet.host(1)}]]}});
                    bridges.push(br);
                    p
                }
            };
            if let (Value::Object(p), Value::Object(e)) = (&mut p, extra) {
                p.extend(e.clone());
            }
            p
        };
        let mut nets = Vec::new();
        let cluster = json!({"cniVersion": "1.0.0", "name": "cluster-net", "plugins": [plugin(&mut bridges)]});
        write_json(&root.join("net.d/00-cluster.conflist"), &cluster);
        nets.push(Net {
            list: cluster,
            ifname: "eth0".into(),
        });
        let mut selection = Vec::new();
        for i in 1..attachments {
            let name = format!("net{i}");
            let list =
                json!({"cniVersion": "1.0.0", "name": name, "plugins": [plugin(&mut bridges)]});
            let nad = json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                "metadata": {"name": name, "namespace": POD_NS}, "spec": {"config": list.to_string()}});
            write_json(&root.join(format!("cluster/nad-{name}.json")), &nad);
            nets.push(Net {
                list,
                ifname: format!("net{i}"),
            });
            selection.push(name);
        }
        for p in 0..pods {
            let mut meta = json!({"name": format!("pod-{p}"), "namespace": POD_NS, "uid": format!("uid-{p}"),
                "labels": {"app": "bench", "tier": "front"}});
            if !selection.is_empty() {
                meta["annotations"] = json!({"k8s.v1.cni.cncf.io/networks": selection.join(",")});
            }
            write_json(
                &root.join(format!("cluster/pod-{p}.json")),
                &json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta}),
            );
        }
        World {
            stderr_log: root.join("plexus-stderr.log"),
            root,
            run,
            owned: true,
            delegates,
            nets,
            cni_path,
            _bridges: bridges,
            _ipam: ipam,
        }
    }

    /// A world [`World::new`] made earlier (no-op delegates), to run plexus in again.
    pub fn existing(base: &Path, tag: &str) -> World {
        let root = base.join(tag);
        World {
            stderr_log: root.join("plexus-stderr.log"),
            cni_path: root.join("bin").display().to_string(),
            root,
            run: run_dir(tag),
            owned: false,
            delegates: Delegates::Noop,
            nets: Vec::new(),
            _bridges: Vec::new(),
            _ipam: None,
        }
    }

    /// The plexus conf; `hooks` selects none or the three example hooks.
    pub fn conf(&self, target: &Path, hooks: bool) -> Value {
        let mut c = json!({
            "cniVersion": "1.0.0",
            "name": "plexus",
            "type": "plexus",
            "clusterNetwork": "cluster-net",
            "confDir": self.root.join("net.d"),
            "cacheDir": self.root.join("cache"),
            "runDir": self.run,
            "cluster": {"source": "files", "dir": self.root.join("cluster")},
        });
        if hooks {
            c["hooks"] = example_hooks()
                .into_iter()
                .map(|(name, g, kind, settings)| {
                    json!({"name": name, "kind": kind, "module": guest(target, g), "settings": settings})
                })
                .collect();
        }
        c
    }

    /// The cache dir of a node whose agent published the hooks of `prefix`'s language ([`World::publish_agent_set`]).
    fn agent_cache(&self, prefix: &str) -> PathBuf {
        match prefix.trim_end_matches('-') {
            "" => self.root.join("cache-agent"),
            language => self.root.join(format!("cache-agent-{language}")),
        }
    }

    /// The three hooks of `prefix`'s language ([`hook_set`]) as the node agent delivers them: compiled by
    /// `plexus hook compile` (what the agent calls) into the agent's cache dir and published as that dir's hook set,
    /// precompiled entries. Rust's are [`World::conf`]'s three hooks, with the same settings.
    pub fn publish_agent_set(
        &self,
        plexus: &Path,
        target: &Path,
        prefix: &str,
    ) -> Result<(), String> {
        let cache = self.agent_cache(prefix);
        let mut hooks = Vec::new();
        for (name, g, kind, settings) in hook_set(prefix) {
            let module = guest(target, &g);
            let compiled = crate::proc::json_answer(
                Command::new(plexus)
                    .args(["hook", "compile"])
                    .arg(&module)
                    .arg("--cache-dir")
                    .arg(&cache),
                "plexus hook compile",
            )?;
            let mut spec: plexus_hooks::HookSpec = serde_json::from_value(
                json!({"name": name, "kind": kind, "module": module, "settings": settings}),
            )
            .map_err(|e| e.to_string())?;
            spec.sha256 = compiled["sha256"].as_str().map(String::from);
            spec.precompiled = true;
            hooks.push(spec);
        }
        plexus_cni::hooks::HookSet {
            generation: 1,
            hooks,
            runs: Default::default(),
        }
        .publish(&cache)
        .map_err(|e| format!("publish the hook set: {e}"))
    }

    /// The conf of an ADD on a node whose agent published the hooks of `prefix`'s language
    /// ([`World::publish_agent_set`]): no hooks of its own, the agent's cache dir.
    pub fn agent_conf(&self, target: &Path, prefix: &str) -> Value {
        let mut c = self.conf(target, false);
        c["cacheDir"] = json!(self.agent_cache(prefix));
        c["clusterHooks"] = json!(true);
        c
    }

    /// Removes the compiled hooks, so that the next ADD compiles them.
    pub fn empty_hook_cache(&self) {
        let _ = std::fs::remove_dir_all(self.root.join("cache/hooks"));
    }

    /// The attachment cache's plans, plus any results journal left without its plan.
    pub fn cached(&self) -> Vec<String> {
        let mut left = plexus_tests::plexus::list_cache(&self.root.join("cache/attachments"));
        for (_, prefix) in LANGUAGES {
            left.extend(plexus_tests::plexus::list_cache(
                &self.agent_cache(prefix).join("attachments"),
            ));
        }
        left
    }

    /// The plan cached for `container`, results applied.
    pub fn plan(&self, container: &str) -> Option<Value> {
        plexus_tests::plexus::read_cached_plan(&self.root.join("cache/attachments"), container)
    }

    pub fn status_written(&self, pod: usize) -> bool {
        self.root
            .join(format!("cluster/status/{POD_NS}/pod-{pod}.json"))
            .exists()
    }

    fn cni_env(
        &self,
        command: &str,
        container: &str,
        netns: &str,
        pod: usize,
    ) -> Vec<(String, String)> {
        self.cni_env_args(command, container, netns, &pod_args(pod))
    }

    pub fn cni_env_args(
        &self,
        command: &str,
        container: &str,
        netns: &str,
        cni_args: &str,
    ) -> Vec<(String, String)> {
        vec![
            ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
            ("CNI_COMMAND".into(), command.into()),
            ("CNI_CONTAINERID".into(), container.into()),
            ("CNI_NETNS".into(), netns.into()),
            ("CNI_IFNAME".into(), "eth0".into()),
            ("CNI_PATH".into(), self.cni_path.clone()),
            ("CNI_ARGS".into(), cni_args.into()),
        ]
    }

    /// One plexus invocation with these `CNI_ARGS` (a pod of a real API server, with its own UID); a failure is
    /// returned as a run, not an error.
    pub fn plexus_args(
        &self,
        plexus: &Path,
        conf: &Value,
        command: &str,
        container: &str,
        cni_args: &str,
    ) -> std::io::Result<ChildRun> {
        let mut cmd = Command::new(plexus);
        cmd.env_clear()
            .envs(self.cni_env_args(command, container, "/var/run/netns/bench-noop", cni_args))
            .stderr(self.stderr());
        proc::run(&mut cmd, conf.to_string().as_bytes())
    }

    /// The plexus conf of [`World::conf`] with the Kubernetes API as its cluster source.
    /// The addresses host-local holds for each of the world's networks that holds any (real delegates).
    pub fn reserved_addresses(&self) -> Vec<(String, usize)> {
        let Some(ipam) = &self._ipam else {
            return Vec::new();
        };
        self.nets
            .iter()
            .filter_map(|n| n.list["name"].as_str())
            .map(|name| (name.to_string(), ipam.reserved_ips(name).len()))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// Drops every host-local reservation of the world's networks (a reservation is a file named by its address):
    /// what a failed DEL left must not shrink the next run's address ranges. Only with nothing attached.
    pub fn clear_reservations(&self) {
        let Some(ipam) = &self._ipam else { return };
        for name in self.nets.iter().filter_map(|n| n.list["name"].as_str()) {
            let Ok(entries) = std::fs::read_dir(ipam.path().join(name)) else {
                continue;
            };
            for e in entries.flatten() {
                if e.file_name()
                    .to_string_lossy()
                    .parse::<std::net::IpAddr>()
                    .is_ok()
                {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }

    pub fn kube_conf(&self, kubeconfig: &Path, daemon: Value) -> Value {
        let mut c = self.conf(Path::new("/"), false);
        c["cluster"] = json!({"source": "kube", "kubeconfig": kubeconfig});
        c["daemon"] = daemon;
        // The bench's daemons deliver no hooks: the ADDs measured run none.
        c["clusterHooks"] = json!(false);
        c
    }

    /// One plexus invocation, as the runtime makes it.
    pub fn plexus(
        &self,
        plexus: &Path,
        conf: &Value,
        command: &str,
        container: &str,
        netns: &str,
        pod: usize,
    ) -> Result<ChildRun, String> {
        self.plexus_wrapped(&[], plexus, conf, command, container, netns, pod)
    }

    /// The same, run under `wrapper` (a profiler command line) when it is not empty.
    #[allow(clippy::too_many_arguments)]
    pub fn plexus_wrapped(
        &self,
        wrapper: &[String],
        plexus: &Path,
        conf: &Value,
        command: &str,
        container: &str,
        netns: &str,
        pod: usize,
    ) -> Result<ChildRun, String> {
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(plexus);
                c
            }
            None => Command::new(plexus),
        };
        cmd.env_clear()
            .envs(self.cni_env(command, container, netns, pod))
            .stderr(self.stderr());
        let run = proc::run(&mut cmd, conf.to_string().as_bytes())
            .map_err(|e| format!("spawn {}: {e}", plexus.display()))?;
        if !run.success {
            return Err(format!(
                "plexus {command} {container} failed: {}",
                String::from_utf8_lossy(&run.stdout).trim()
            ));
        }
        Ok(run)
    }

    /// The floor: the same lists exec'd directly, as a runtime would, one after the other.
    pub fn floor_add(
        &self,
        container: &str,
        netns: &str,
        pod: usize,
    ) -> Result<(Duration, Vec<Value>), String> {
        let env = |ifname: &str| {
            let mut e = self.cni_env("ADD", container, netns, pod);
            e[4].1 = ifname.into();
            e
        };
        let start = std::time::Instant::now();
        let mut results = Vec::with_capacity(self.nets.len());
        for net in &self.nets {
            results.push(floor::add(&net.list, &self.cni_path, &env(&net.ifname))?);
        }
        Ok((start.elapsed(), results))
    }

    pub fn floor_del(
        &self,
        container: &str,
        netns: &str,
        pod: usize,
        results: &[Value],
    ) -> Result<Duration, String> {
        let start = std::time::Instant::now();
        for (net, result) in self.nets.iter().zip(results).rev() {
            let mut e = self.cni_env("DEL", container, netns, pod);
            e[4].1 = net.ifname.clone();
            floor::del(&net.list, &self.cni_path, &e, result)?;
        }
        Ok(start.elapsed())
    }

    fn stderr(&self) -> Stdio {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.stderr_log)
            .map(Stdio::from)
            .unwrap_or_else(|_| Stdio::null())
    }
}

pub fn pod_args(pod: usize) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={POD_NS};K8S_POD_NAME=pod-{pod};K8S_POD_UID=uid-{pod}"
    )
}

fn write_json(path: &Path, v: &Value) {
    let mut f = File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    std::io::Write::write_all(&mut f, v.to_string().as_bytes())
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
