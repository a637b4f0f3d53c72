//! Node density with secondary networks, as the field measures it (kube-burner's node-density-cni): N pods created
//! at once on one real node (kubelet over containerd 2, or CRI-O with `--runtime cri-o`, placed by the real
//! kube-scheduler), each with the cluster
//! network and two secondary networks (the reference bridge + host-local), until every pod is Ready; then all are
//! deleted. Subjects, each on the same kubelet, runtime, NADs and delegates, interleaved round by round:
//!
//! - `floor`: the cluster network's conflist alone is the runtime's CNI configuration (no secondary networks);
//! - `runtime-3`: the same three networks attached by the runtime itself, no multi-network plugin: containerd
//!   loads the cluster network's and the two NADs' conflists and runs them one after another (`max_conf_num` 3,
//!   `setup_serially`), as Plexus runs its delegates. Plexus over it is what Plexus adds to the networks' own work;
//! - `plexus-daemon`: the plexus CNI plugin with the node daemon (the pod and NADs from its caches);
//! - `plexus-thin`: the plexus CNI plugin reading the API server itself on every ADD;
//! - `plexus-nri`: the cluster network's conflist alone is the runtime's CNI configuration, as for the floor, and
//!   the node daemon in NRI mode attaches the two secondary networks at each sandbox's `RunPodSandbox` (the
//!   runtime's own NRI request timeout, 2 s);
//! - `multus-thick`: Multus's shim and daemon (tests/parts/multus), configured as its DaemonSet is.
//!
//! Per subject and round: each pod's startup latency (created to Ready, and to `PodReadyToStartContainers`, the
//! kubelet's "sandbox created and its network set up"), as the bench sees the conditions change (a watch); pods
//! per second; the node agent's RSS (resting before the burst, peak during it, after it) and CPU during it; the
//! API requests of the subject's identities during it; the addresses the pods left once deleted; containerd's own
//! timer of the network plugin per sandbox (set-up and teardown), which leaves out the rest of a pod's start; and
//! the node's CPU time over the burst, by part (`cpu::Ledger`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use plexus_tests::containerd::{self, Containerd};
use plexus_tests::control_plane::Component;
use plexus_tests::crio::{self, CriO};
use plexus_tests::kubeapi::{KubeApiServer, PLEXUS_USER};
use plexus_tests::kubelet::{pod_on_node, Kubelet, NODE};
use plexus_tests::runtime::{Runtime, RuntimeKind};
use serde_json::{json, Value};

use crate::cpu::{self, Of};
use crate::daemon::Daemon;
use crate::world::{Delegates, World};
use crate::{log, multus, proc, stats, Opts};

const NS: &str = "density";
const CNI_USER: &str = "system:serviceaccount:kube-system:plexus-cni";
const MULTUS_USER: &str = "system:serviceaccount:kube-system:multus";
/// Busy cores below which the machine counts as quiet before a burst: the control plane, kubelet and containerd at
/// rest use a fraction of one.
const QUIET_CORES: f64 = 0.5;
pub(crate) const SUBJECTS: [&str; 6] = [
    "floor",
    "runtime-3",
    "plexus-daemon",
    "plexus-thin",
    "plexus-nri",
    "multus-thick",
];

/// One subject's burst: what was measured.
struct Burst {
    /// Per pod, ms from its creation request: (sandbox ready, Ready).
    startup: Vec<(f64, f64)>,
    pods_per_second: f64,
    agent: Option<AgentUse>,
    api_requests: usize,
    /// Addresses host-local still held once the pods were gone, by network.
    left_addresses: Vec<(String, usize)>,
    /// containerd's own timer of the network plugin, mean ms per sandbox: setting up (ADD) and tearing down (DEL).
    cni_ms: Option<(f64, f64)>,
    /// CPU seconds from the first create to the last pod Ready, by part of the node (`cpu::Ledger`).
    cpu: BTreeMap<String, f64>,
    /// How long the burst waited for a quiet machine before its first create.
    settle_seconds: f64,
    /// Memory cgroups the kernel still kept before the burst, and after its clean caches were dropped (`None`: the
    /// bench may not drop them here).
    dropped: Option<(u64, u64)>,
}

/// The node agent's memory (KiB) and CPU over a burst.
#[derive(Default, Clone, Copy)]
struct AgentUse {
    rest_kib: u64,
    peak_kib: u64,
    after_kib: u64,
    cpu_seconds: f64,
}

/// The node agent of a subject, while its burst runs.
enum Agent {
    None,
    Plexus(Daemon),
    Multus(multus::Multus),
}

impl Agent {
    fn pid(&self) -> Option<u32> {
        match self {
            Agent::None => None,
            Agent::Plexus(d) => Some(d.pid()),
            Agent::Multus(m) => Some(m.pid()),
        }
    }
}

/// A density section's bursts: pods in each, rounds, and the subjects (every one when empty).
pub struct Shape {
    pub pods: usize,
    pub rounds: usize,
    pub subjects: Vec<String>,
}

pub fn density(o: &Opts, shape: &Shape) -> Result<Value, String> {
    let available = match o.runtime {
        RuntimeKind::Containerd => containerd::available(),
        RuntimeKind::CriO => crio::available(),
    };
    if !available {
        return Ok(json!({"skipped": "the runtime or the cluster parts are not available"}));
    }
    let pods = shape.pods;
    let rounds = if o.quick { 1 } else { shape.rounds };
    let c = Cluster::new(o)?;
    let mut bursts: BTreeMap<&str, Vec<Burst>> = BTreeMap::new();
    let mut multus_version = None;
    for round in 0..rounds {
        // Each round starts with another subject, so that none always follows the same one.
        let order = SUBJECTS
            .iter()
            .cycle()
            .skip(round % SUBJECTS.len())
            .take(SUBJECTS.len());
        for &subject in order {
            let chosen = shape.subjects.is_empty() || shape.subjects.iter().any(|s| s == subject);
            if !chosen || (subject == "runtime-3" && o.runtime == RuntimeKind::CriO) {
                continue;
            }
            if let Some(burst) = c.subject_burst(subject, round, pods, &mut multus_version)? {
                bursts.entry(subject).or_default().push(burst);
            }
        }
    }
    let subjects = subjects_json(&bursts);
    Ok(json!({
        "runtime": o.runtime.name(),
        "pods": pods,
        "rounds": rounds,
        "networks": c.w.nets.len(),
        "multus": multus_version.map_or_else(
            || json!({"skipped": format!("{} not set", multus::ENV)}),
            |v| json!({"version": v})),
        "subjects": subjects,
    }))
}

/// Each subject's rounds ([`summarize`]), with containerd's timer of its CNI set-up and teardown per round where
/// every round has it.
fn subjects_json<'s>(bursts: &BTreeMap<&'s str, Vec<Burst>>) -> BTreeMap<&'s str, Value> {
    let p99s = |subject: &str| -> Vec<f64> {
        bursts
            .get(subject)
            .map(|runs| runs.iter().map(p99_of).collect())
            .unwrap_or_default()
    };
    let (floor_p99, runtime_p99) = (p99s("floor"), p99s("runtime-3"));
    let runtime_setup: Vec<f64> = bursts.get("runtime-3").map_or_else(Vec::new, |runs| {
        runs.iter()
            .map(|b| b.cni_ms.map_or(f64::NAN, |c| c.0))
            .collect()
    });
    bursts
        .iter()
        .map(|(subject, runs)| {
            let mut v = summarize(runs, &floor_p99, &runtime_p99);
            if runs.iter().all(|b| b.cni_ms.is_some()) {
                let ms = |of: fn((f64, f64)) -> f64| -> Vec<f64> {
                    runs.iter().filter_map(|b| b.cni_ms).map(of).collect()
                };
                let setup = ms(|c| c.0);
                v["cniSetupOverRuntime3"] = stats::by_round(
                    setup
                        .iter()
                        .zip(&runtime_setup)
                        .map(|(a, r)| a / r)
                        .collect(),
                );
                v["cniSetupMs"] = stats::by_round(setup);
                v["cniTeardownMs"] = stats::by_round(ms(|c| c.1));
            }
            (*subject, v)
        })
        .collect()
}

/// The density section's cluster, set up once for all its bursts: the API server with the NADs, the scheduler and
/// the controllers, the kubeconfigs of the CNI plugin and of the node's daemon, the runtime's CNI binary dir.
struct Cluster<'a> {
    o: &'a Opts,
    /// The scheduler and the controller manager (stopped first as the section ends), and their processes.
    _control: [Component; 2],
    control_pids: Vec<u32>,
    w: World,
    api: KubeApiServer,
    /// Multus's binaries, when provided.
    multus_bins: Option<PathBuf>,
    /// The NADs every pod selects.
    selection: Vec<String>,
    cni_kubeconfig: PathBuf,
    daemon_kubeconfig: PathBuf,
    /// The runtime's CNI binary dir.
    bin: PathBuf,
}

/// When each pod's create was sent, and when each was first seen with `PodReadyToStartContainers` and with `Ready`.
type PodTimes = (
    BTreeMap<String, Instant>,
    BTreeMap<String, (Instant, Instant)>,
);

impl<'a> Cluster<'a> {
    /// The API server (with Multus's RBAC when Multus is provided) and the namespace's NADs, the scheduler and the
    /// controllers, the kubeconfigs, the CNI binary dir.
    fn new(o: &'a Opts) -> Result<Cluster<'a>, String> {
        let multus_bins = multus::provided();
        let api = crate::daemon::bench_api(multus_bins.is_some());
        api.apply_node_authority();
        if multus_bins.is_some() {
            multus::rbac(&api);
        }
        api.namespace(NS);
        let w = World::new(&o.work, "density", Delegates::Real, 3, 0, &json!({}));
        let selection: Vec<String> = (1..w.nets.len()).map(|i| format!("net{i}")).collect();
        for (i, net) in w.nets.iter().enumerate().skip(1) {
            api.nad(NS, &format!("net{i}"), &net.list);
        }
        let control = [
            Component::scheduler(&api, &w.root),
            Component::controller_manager(&api, &w.root, &["node-lifecycle-controller"]),
        ];
        let control_pids: Vec<u32> = control.iter().map(Component::pid).collect();
        let cni_kubeconfig = w.root.join("cni.kubeconfig");
        api.write_kubeconfig(&cni_kubeconfig, "cni-token");
        let daemon_kubeconfig = w.root.join("daemon.kubeconfig");
        let token = api.node_bound_token("kube-system", "plexus", NODE);
        api.write_kubeconfig(&daemon_kubeconfig, &token);
        let bin = cni_bin_dir(o, &w, multus_bins.as_deref())?;
        Ok(Cluster {
            o,
            _control: control,
            control_pids,
            w,
            api,
            multus_bins,
            selection,
            cni_kubeconfig,
            daemon_kubeconfig,
            bin,
        })
    }

    /// Round `round`'s burst of `subject`, with its CNI configuration and node agent; `None` for Multus when it is not
    /// provided.
    fn subject_burst(
        &self,
        subject: &str,
        round: usize,
        pods: usize,
        multus_version: &mut Option<String>,
    ) -> Result<Option<Burst>, String> {
        let w = &self.w;
        let conf_dir = w.root.join(format!("conf-{subject}"));
        let _ = std::fs::remove_dir_all(&conf_dir);
        std::fs::create_dir_all(&conf_dir).map_err(|e| e.to_string())?;
        let Some(agent) = self.agent(subject, round, &conf_dir, multus_version)? else {
            return Ok(None);
        };
        let nri = (subject == "plexus-nri").then(|| NriStart {
            plexus: self.o.plexus.clone(),
            kubeconfig: self.daemon_kubeconfig.clone(),
            conf: w.root.join("nri-plexus.json"),
            socket: w.run.join("daemon.sock"),
            log: w.root.join(format!("daemon-nri-{round}.log")),
            cni_path: self.bin.clone(),
        });
        if let Some(n) = &nri {
            write_conf(&n.conf, &w.kube_conf(&self.daemon_kubeconfig, json!(false)))?;
        }
        log(&format!("density: round {round}, {subject}: {pods} pods"));
        let burst = self.burst(&conf_dir, (&agent, nri.as_ref()), subject, pods)?;
        log(&format!(
            "density: {subject}: Ready p50 {:.0} ms, p99 {:.0} ms, {:.1} pods/s",
            stats::percentile_of(burst.startup.iter().map(|s| s.1), 0.5),
            stats::percentile_of(burst.startup.iter().map(|s| s.1), 0.99),
            burst.pods_per_second
        ));
        Ok(Some(burst))
    }

    /// Writes `subject`'s CNI configuration into `conf_dir` and starts its node agent; `None` for Multus when it is
    /// not provided.
    fn agent(
        &self,
        subject: &str,
        round: usize,
        conf_dir: &Path,
        multus_version: &mut Option<String>,
    ) -> Result<Option<Agent>, String> {
        let w = &self.w;
        Ok(Some(match subject {
            // NRI mode's daemon registers with the runtime, which each burst starts afresh: started there.
            "floor" | "plexus-nri" => {
                write_conf(&conf_dir.join("10-cluster.conflist"), &w.nets[0].list)?;
                Agent::None
            }
            "runtime-3" => {
                for (i, net) in w.nets.iter().enumerate() {
                    write_conf(&conf_dir.join(format!("{i}0-net.conflist")), &net.list)?;
                }
                Agent::None
            }
            "plexus-daemon" | "plexus-thin" => self.plexus_agent(subject, round, conf_dir)?,
            _ => match &self.multus_bins {
                Some(bins) => {
                    let m = multus::Multus::start(bins, &self.api, w, NODE)?;
                    *multus_version = Some(m.version.clone());
                    write_conf(&conf_dir.join("00-multus.conf"), m.shim_conf())?;
                    Agent::Multus(m)
                }
                None => return Ok(None),
            },
        }))
    }

    /// The plexus conflist in `conf_dir`, with the node daemon (`plexus-daemon`, its daemon started and synced) or
    /// without (`plexus-thin`).
    fn plexus_agent(&self, subject: &str, round: usize, conf_dir: &Path) -> Result<Agent, String> {
        let w = &self.w;
        let socket = w.run.join("daemon.sock");
        let served = subject == "plexus-daemon";
        let daemon = if served {
            json!({"socket": socket, "timeoutMs": 5000})
        } else {
            json!(false)
        };
        let conf = plexus_list(w.kube_conf(&self.cni_kubeconfig, daemon));
        write_conf(&conf_dir.join("00-plexus.conflist"), &conf)?;
        if !served {
            return Ok(Agent::None);
        }
        let d = Daemon::start_on(
            &self.o.plexus,
            NODE,
            &self.daemon_kubeconfig,
            &socket,
            &w.root.join(format!("daemon-{round}.log")),
            &[],
        )?;
        d.wait("synced", Duration::from_secs(60), |h| {
            plexus_tests::plexus::settled(h)
        })?;
        Ok(Agent::Plexus(d))
    }
}

/// The runtime's CNI binary dir: `plexus` (the CNI-only binary, as nodes install it), `multus-shim`, the reference
/// plugins.
fn cni_bin_dir(o: &Opts, w: &World, multus: Option<&Path>) -> Result<PathBuf, String> {
    let bin = w.root.join("cni-bin");
    std::fs::create_dir_all(&bin).map_err(|e| e.to_string())?;
    let link = |from: &Path, name: &str| {
        let from = std::fs::canonicalize(from).map_err(|e| format!("{}: {e}", from.display()))?;
        std::os::unix::fs::symlink(&from, bin.join(name))
            .map_err(|e| format!("link {}: {e}", from.display()))
    };
    link(&o.plexus_cni, "plexus")?;
    if let Some(m) = multus {
        link(&m.join("multus-shim"), "multus-shim")?;
    }
    let plugins = std::fs::read_dir(plexus_tests::netns::cni_bin_dir())
        .map_err(|e| format!("the reference plugins: {e}"))?;
    for p in plugins.flatten() {
        link(&p.path(), &p.file_name().to_string_lossy())?;
    }
    Ok(bin)
}

/// A conflist of the one plexus conf `conf` (its `cniVersion` and `name` go to the list).
fn plexus_list(mut conf: Value) -> Value {
    if let Some(obj) = conf.as_object_mut() {
        obj.remove("cniVersion");
        obj.remove("name");
    }
    json!({"cniVersion": "1.0.0", "name": "plexus", "plugins": [conf]})
}

fn write_conf(path: &Path, conf: &Value) -> Result<(), String> {
    std::fs::write(path, conf.to_string()).map_err(|e| format!("{}: {e}", path.display()))
}

/// How NRI mode's daemon is started, once its burst's runtime is up.
struct NriStart {
    plexus: PathBuf,
    kubeconfig: PathBuf,
    /// The NRI conf (a plexus conf).
    conf: PathBuf,
    /// The daemon's own socket.
    socket: PathBuf,
    log: PathBuf,
    /// The delegates' directory.
    cni_path: PathBuf,
}

impl NriStart {
    /// The daemon in NRI mode on `runtime`'s NRI socket, once its caches have listed and it has registered.
    fn start(&self, runtime: &Runtime) -> Result<Agent, String> {
        let nri_socket = runtime.nri_socket();
        let extra: [&std::ffi::OsStr; 7] = [
            "--nri".as_ref(),
            "--nri-socket".as_ref(),
            nri_socket.as_os_str(),
            "--nri-conf".as_ref(),
            self.conf.as_os_str(),
            "--nri-cni-path".as_ref(),
            self.cni_path.as_os_str(),
        ];
        let d = Daemon::start_on(
            &self.plexus,
            NODE,
            &self.kubeconfig,
            &self.socket,
            &self.log,
            &extra,
        )?;
        d.wait("synced", Duration::from_secs(60), |h| {
            plexus_tests::plexus::settled(h)
        })?;
        let until = Instant::now() + Duration::from_secs(60);
        while !std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .contains("registered with the runtime's NRI")
        {
            if Instant::now() > until {
                return Err(format!(
                    "the NRI daemon did not register with the runtime within 60 s (log: {})",
                    self.log.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(Agent::Plexus(d))
    }
}

impl Cluster<'_> {
    /// One burst of `pods` pods on a fresh runtime and kubelet with `conf_dir` as the runtime's CNI configuration. The
    /// subject's node agent is `agent`, or NRI mode's daemon, started once the runtime is.
    fn burst(
        &self,
        conf_dir: &Path,
        (agent, nri): (&Agent, Option<&NriStart>),
        subject: &str,
        pods: usize,
    ) -> Result<Burst, String> {
        let (api, w) = (&self.api, &self.w);
        let runtime = self.start_runtime(conf_dir, subject);
        let nri_agent = nri.map(|n| n.start(&runtime)).transpose()?;
        let agent = nri_agent.as_ref().unwrap_or(agent);
        let since = Timestamp::now();
        let kubelet = Kubelet::start(api, &runtime.socket());
        // The node stays Ready in the API from the previous burst's kubelet: wait for this one's heartbeat.
        wait_heartbeat(api, &since)?;
        // Every burst starts from the same machine, whatever the bursts before it left.
        let dropped = fresh_caches(&self.warm_files(&runtime));
        let settle_seconds = quiet_machine(subject);
        let users = users_of(subject);
        let requests_before = requests_of(api, users);
        let sampler = agent.pid().map(Sampler::start);
        let ledger = cpu_ledger(api, &runtime, &kubelet, agent, &self.control_pids);
        let names: Vec<String> = (0..pods).map(|i| format!("p{i}")).collect();
        let (created, seen) = self.create_until_ready(&runtime, &kubelet, subject, &names)?;
        let done = Instant::now();
        let cpu = ledger.stop();
        let agent_use = sampler.map(|s| s.stop());
        check_held(w, subject, pods)?;
        // NRI mode's secondary networks are attached outside the runtime's CNI calls: its timer would show the floor's.
        let timed = subject != "plexus-nri";
        let setup_ms = cni_timer(&runtime, "set_up_pod").filter(|_| timed);
        let api_requests = requests_of(api, users).saturating_sub(requests_before);
        let (startup, pods_per_second) = startup_ms(&names, &created, &seen, done);
        let after_kib = agent.pid().map(|pid| {
            std::thread::sleep(Duration::from_secs(5));
            rss_kib(pid)
        });
        delete_all(api, pods)?;
        let teardown_ms = cni_timer(&runtime, "tear_down_pod").filter(|_| timed);
        let addresses = addresses_left(w);
        drop(kubelet);
        drop(runtime);
        // Counted above; the next burst starts with every address free.
        w.clear_reservations();
        Ok(Burst {
            startup,
            pods_per_second,
            agent: agent_use.map(|mut a| {
                a.after_kib = after_kib.unwrap_or(0);
                a
            }),
            api_requests,
            left_addresses: addresses,
            cni_ms: setup_ms.zip(teardown_ms),
            cpu,
            settle_seconds,
            dropped,
        })
    }

    /// A fresh runtime with `conf_dir` as its CNI configuration: containerd serves its timer of the CNI calls on a
    /// metrics port; CRI-O is measured without one.
    fn start_runtime(&self, conf_dir: &Path, subject: &str) -> Runtime {
        let networks = if subject == "runtime-3" {
            self.w.nets.len()
        } else {
            1
        };
        match self.o.runtime {
            RuntimeKind::Containerd => {
                Runtime::Containerd(Containerd::start_measured(&self.bin, conf_dir, networks))
            }
            RuntimeKind::CriO => Runtime::CriO(CriO::start(&self.bin, conf_dir, None, None)),
        }
    }

    /// What a burst on `runtime` execs and reads, read back into the page cache before it ([`fresh_caches`]).
    fn warm_files(&self, runtime: &Runtime) -> Vec<PathBuf> {
        match runtime {
            Runtime::Containerd(c) => vec![
                self.bin.clone(),
                c.root(),
                plexus_tests::parts::bin("containerd-shim-runc-v2"),
                PathBuf::from("/usr/sbin/runc"),
            ],
            Runtime::CriO(c) => vec![
                self.bin.clone(),
                c.storage(),
                PathBuf::from("/usr/bin/conmon"),
                PathBuf::from("/usr/sbin/runc"),
            ],
        }
    }

    /// Creates the pods `names`, watched from before the creates, and waits until every one is Ready; on failure the
    /// error carries the tails of the kubelet's and the runtime's logs.
    fn create_until_ready(
        &self,
        runtime: &Runtime,
        kubelet: &Kubelet,
        subject: &str,
        names: &[String],
    ) -> Result<PodTimes, String> {
        let api = &self.api;
        let limit = Duration::from_secs(60 + 2 * names.len() as u64);
        let watch = PodWatch::start(api, limit)?;
        let created = create_all(api, names, &self.selection.join(","))?;
        let seen = watch.until_ready(names).map_err(|e| {
            let log = runtime.log();
            let lines: Vec<&str> = log.lines().collect();
            format!(
                "density {subject}: {e}\nkubelet:\n{}\n{}:\n{}",
                kubelet.log_tail(20),
                self.o.runtime.name(),
                lines[lines.len().saturating_sub(20)..].join("\n")
            )
        })?;
        Ok((created, seen))
    }
}

/// Waits (at most 120 s) for a quiet machine before a burst of `subject`, saying so when that took long; the seconds
/// waited.
fn quiet_machine(subject: &str) -> f64 {
    let (settle_seconds, busy) = cpu::settle(QUIET_CORES, Duration::from_secs(120));
    if settle_seconds > 1.5 {
        log(&format!(
            "density: {subject}: waited {settle_seconds:.0} s for a quiet machine ({busy:.2} cores busy)"
        ));
    }
    settle_seconds
}

/// The identities whose API requests a burst of `subject` counts.
fn users_of(subject: &str) -> &'static [&'static str] {
    match subject {
        "plexus-daemon" => &[PLEXUS_USER, CNI_USER],
        "plexus-thin" => &[CNI_USER],
        "plexus-nri" => &[PLEXUS_USER],
        "multus-thick" => &[MULTUS_USER],
        _ => &[],
    }
}

/// Every subject but the floor gave each pod all three networks: each network must hold an address per pod once the
/// `pods` pods are Ready.
fn check_held(w: &World, subject: &str, pods: usize) -> Result<(), String> {
    let held = w.reserved_addresses();
    let wanted = if subject == "floor" { 1 } else { w.nets.len() };
    for net in w.nets.iter().take(wanted) {
        let name = net.list["name"].as_str().unwrap_or_default();
        let n = held.iter().find(|h| h.0 == name).map_or(0, |h| h.1);
        if n < pods {
            return Err(format!(
                "density {subject}: {n} addresses of {name} held once the {pods} pods were Ready"
            ));
        }
    }
    Ok(())
}

/// containerd's timer of network plugin operation `operation`, mean ms per sandbox; `None` on CRI-O.
fn cni_timer(runtime: &Runtime, operation: &str) -> Option<f64> {
    match runtime {
        Runtime::Containerd(c) => c.metrics().ok().and_then(|m| cni_mean_ms(&m, operation)),
        Runtime::CriO(_) => None,
    }
}

/// Each pod's startup, ms from its creation request to (sandbox ready, Ready), and the pods per second from the first
/// create to the last pod Ready (`done` where there is none).
fn startup_ms(
    names: &[String],
    created: &BTreeMap<String, Instant>,
    seen: &BTreeMap<String, (Instant, Instant)>,
    done: Instant,
) -> (Vec<(f64, f64)>, f64) {
    let first = created.values().min().copied().unwrap_or(done);
    let last_ready = seen.values().map(|s| s.1).max().unwrap_or(done);
    let startup = names
        .iter()
        .map(|n| {
            let c = created[n];
            let (sandbox, ready) = seen[n];
            (
                sandbox.duration_since(c).as_secs_f64() * 1e3,
                ready.duration_since(c).as_secs_f64() * 1e3,
            )
        })
        .collect();
    let pods_per_second = names.len() as f64 / last_ready.duration_since(first).as_secs_f64();
    (startup, pods_per_second)
}

/// The parts of the node whose CPU time a burst counts, from the first create to the last pod Ready.
fn cpu_ledger(
    api: &KubeApiServer,
    runtime: &Runtime,
    kubelet: &Kubelet,
    agent: &Agent,
    control: &[u32],
) -> cpu::Ledger {
    let (apiserver, etcd) = api.pids();
    let one = |pid: Option<u32>, of: Of| pid.map(|p| (p, of)).into_iter().collect::<Vec<_>>();
    cpu::Ledger::start(vec![
        // The CNI plugin, its delegates and IPAM: what the runtime execs and reaps (also containerd's runc shim
        // start command, CRI-O's conmon and pinns: the same for every subject).
        ("network plugins".into(), one(runtime.pid(), Of::Reaped)),
        (runtime.kind().name().into(), one(runtime.pid(), Of::Own)),
        ("kubelet".into(), one(kubelet.pid(), Of::All)),
        ("node agent".into(), one(agent.pid(), Of::All)),
        ("kube-apiserver".into(), vec![(apiserver, Of::Own)]),
        ("etcd".into(), vec![(etcd, Of::Own)]),
        (
            "scheduler, controllers".into(),
            control.iter().map(|&p| (p, Of::Own)).collect(),
        ),
        // The bench itself: its watch of the pods and the RSS sampler.
        ("bench".into(), vec![(std::process::id(), Of::All)]),
    ])
}

/// Drops the kernel's clean caches, then reads `warm` (files, or every file under a directory, symlinks followed;
/// 1 GiB at most) back into them: the memory cgroups of the pods before (each freed only once the page cache
/// charged to it is, they pile up by the thousand over a run, and every burst on top of them costs the whole node
/// more CPU) go, and what the burst execs is not read from disk during it. The number of memory cgroups before and
/// after; `None` where the caches cannot be dropped (not root, read-only /proc/sys).
fn fresh_caches(warm: &[PathBuf]) -> Option<(u64, u64)> {
    let before = memory_cgroups()?;
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3").ok()?;
    let after = memory_cgroups()?;
    let mut budget: u64 = 1 << 30;
    let mut todo: Vec<PathBuf> = warm.to_vec();
    while let Some(p) = todo.pop() {
        let Ok(meta) = std::fs::metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&p) {
                todo.extend(entries.flatten().map(|e| e.path()));
            }
        } else if meta.is_file() && meta.len() <= budget {
            budget -= meta.len();
            if let Ok(mut f) = std::fs::File::open(&p) {
                let _ = std::io::copy(&mut f, &mut std::io::sink());
            }
        }
    }
    Some((before, after))
}

/// The memory cgroups the kernel keeps, those being removed included (`/proc/cgroups`).
fn memory_cgroups() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/cgroups").ok()?;
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.first() == Some(&"memory"))
        .and_then(|f| f.get(2)?.parse().ok())
}

/// The mean, in ms, of containerd's timer of network plugin operation `operation` (its histogram's sum over its
/// count, over every sandbox of this containerd).
fn cni_mean_ms(metrics: &str, operation: &str) -> Option<f64> {
    let label = format!("operation_type=\"{operation}\"");
    let value = |suffix: &str| -> Option<f64> {
        metrics
            .lines()
            .filter(|l| {
                l.starts_with("containerd_cri_network_plugin_operations_duration")
                    && l.contains(&label)
            })
            .find(|l| {
                l.split('{')
                    .next()
                    .is_some_and(|name| name.ends_with(suffix))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    };
    let (sum, count) = (value("_sum")?, value("_count")?);
    (count > 0.0).then(|| sum / count * 1e3)
}

/// Waits until the node's Ready condition says True with a heartbeat after `since` (the API server's times are
/// whole seconds: the first heartbeat in the second after `since`).
fn wait_heartbeat(api: &KubeApiServer, since: &Timestamp) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let node = api
            .request("GET", &format!("/api/v1/nodes/{NODE}"), None)
            .ok()
            .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
            .unwrap_or_default();
        let fresh = node["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["type"] == "Ready"
                    && c["status"] == "True"
                    && c["lastHeartbeatTime"]
                        .as_str()
                        .and_then(|t| t.parse::<Timestamp>().ok())
                        .is_some_and(|t| t > *since)
            });
        if fresh {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "node {NODE}: no Ready heartbeat after {since} within 60 s"
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Creates the pods from a few threads at once; when each create was sent.
fn create_all(
    api: &KubeApiServer,
    names: &[String],
    networks: &str,
) -> Result<BTreeMap<String, Instant>, String> {
    let chunks: Vec<&[String]> = names.chunks(names.len().div_ceil(4).max(1)).collect();
    let results: Vec<Result<Vec<(String, Instant)>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .iter()
            .map(|chunk| {
                s.spawn(move || {
                    let mut out = Vec::new();
                    for name in *chunk {
                        let mut pod = pod_on_node(NS, name, networks);
                        // The scheduler places them.
                        pod["spec"].as_object_mut().map(|s| s.remove("nodeName"));
                        let at = Instant::now();
                        match api.request(
                            "POST",
                            &format!("/api/v1/namespaces/{NS}/pods"),
                            Some(&pod),
                        ) {
                            Ok((201, _)) => out.push((name.clone(), at)),
                            Ok((code, body)) => {
                                return Err(format!("create pod {name}: {code} {body}"))
                            }
                            Err(e) => return Err(format!("create pod {name}: {e}")),
                        }
                    }
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a creating thread panicked".into()))
            })
            .collect()
    });
    let mut created = BTreeMap::new();
    for r in results {
        created.extend(r?);
    }
    Ok(created)
}

/// What the bench reads of the pods' watch at most: 240 pods' objects a few times each are a few MiB.
const WATCH_BYTES: u64 = 256 << 20;

/// The namespace's pods watched from before the creates (the API server streams each change as it happens, as an
/// informer sees it; polling a list of every pod would add its own load to the node it measures).
struct PodWatch {
    curl: std::process::Child,
    events: std::sync::mpsc::Receiver<(Instant, Value)>,
    deadline: Instant,
    limit: Duration,
}

impl PodWatch {
    fn start(api: &KubeApiServer, limit: Duration) -> Result<PodWatch, String> {
        let (code, body) = api
            .request(
                "GET",
                &format!("/api/v1/namespaces/{NS}/pods?limit=1"),
                None,
            )
            .map_err(|e| format!("list the pods: {e}"))?;
        let list: Value = serde_json::from_str(&body).unwrap_or_default();
        let version = list["metadata"]["resourceVersion"]
            .as_str()
            .filter(|_| code == 200)
            .ok_or_else(|| format!("list the pods: {code} {body}"))?
            .to_string();
        let seconds = u32::try_from(limit.as_secs()).unwrap_or(u32::MAX);
        let mut curl =
            api.watch_stream(&format!("/api/v1/namespaces/{NS}/pods"), &version, seconds);
        let Some(out) = curl.stdout.take() else {
            let _ = curl.kill();
            let _ = curl.wait();
            return Err("the pods' watch has no stdout".into());
        };
        let (tx, events) = std::sync::mpsc::channel();
        // Ends when curl does (killed as the watch is dropped, or at its --max-time), or after WATCH_BYTES.
        std::thread::spawn(move || {
            use std::io::{BufRead, Read};
            for line in std::io::BufReader::new(out.take(WATCH_BYTES)).lines() {
                let Ok(line) = line else { break };
                let at = Instant::now();
                if let Ok(event) = serde_json::from_str::<Value>(&line) {
                    if tx.send((at, event)).is_err() {
                        break;
                    }
                }
            }
        });
        Ok(PodWatch {
            curl,
            events,
            deadline: Instant::now() + limit,
            limit,
        })
    }

    /// Waits until each of `names` is Ready: when each was first seen with `PodReadyToStartContainers` and with
    /// `Ready`.
    fn until_ready(self, names: &[String]) -> Result<BTreeMap<String, (Instant, Instant)>, String> {
        let mut sandbox: BTreeMap<String, Instant> = BTreeMap::new();
        let mut ready: BTreeMap<String, Instant> = BTreeMap::new();
        while ready.len() < names.len() {
            let left = self.deadline.saturating_duration_since(Instant::now());
            let (at, event) = match self.events.recv_timeout(left) {
                Ok(e) => e,
                Err(e) => {
                    let why = match e {
                        std::sync::mpsc::RecvTimeoutError::Timeout => "",
                        std::sync::mpsc::RecvTimeoutError::Disconnected => " (the watch ended)",
                    };
                    return Err(format!(
                        "{} of {} pods Ready within {} s{why}",
                        ready.len(),
                        names.len(),
                        self.limit.as_secs()
                    ));
                }
            };
            if event["type"] == "ERROR" {
                return Err(format!("the pods' watch: {}", event["object"]));
            }
            let pod = &event["object"];
            let name = pod["metadata"]["name"].as_str().unwrap_or_default();
            let is = |kind: &str| {
                pod["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == kind && c["status"] == "True")
            };
            if is("PodReadyToStartContainers") {
                sandbox.entry(name.to_string()).or_insert(at);
            }
            if is("Ready") {
                ready.entry(name.to_string()).or_insert(at);
                sandbox.entry(name.to_string()).or_insert(at);
            }
        }
        // curl is stopped as the watch is dropped.
        names
            .iter()
            .map(|n| match (sandbox.get(n), ready.get(n)) {
                (Some(s), Some(r)) => Ok((n.clone(), (*s, *r))),
                _ => Err(format!("pod {n}: not among the watched pods")),
            })
            .collect()
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        let _ = self.curl.kill();
        let _ = self.curl.wait();
    }
}

/// The namespace's pods as the API server lists them; `None` when it does not answer with a list.
fn listed_pods(api: &KubeApiServer) -> Option<Vec<Value>> {
    let (code, body) = api
        .request("GET", &format!("/api/v1/namespaces/{NS}/pods"), None)
        .ok()?;
    let list: Value = serde_json::from_str(&body).ok().filter(|_| code == 200)?;
    list["items"].as_array().cloned()
}

/// Deletes the namespace's pods at once, gracefully (the API server keeps each until the kubelet has stopped its
/// sandbox, which runs the CNI DEL), and waits until they are gone. The collection's delete is sent again every
/// [`DELETE_AGAIN`] while some pods are not being deleted: the API server may end one before it has marked every
/// pod (of 240 pods, 86 were left unmarked, and waited for in vain).
fn delete_all(api: &KubeApiServer, pods: usize) -> Result<(), String> {
    let path = format!("/api/v1/namespaces/{NS}/pods?gracePeriodSeconds=1");
    let delete = || {
        api.request("DELETE", &path, None)
            .map_err(|e| format!("delete the pods: {e}"))
    };
    delete()?;
    let mut sent = Instant::now();
    // The kubelet stops a few sandboxes a second on two cores.
    let deadline = Instant::now() + Duration::from_secs(60 + 3 * pods as u64);
    loop {
        let listed = listed_pods(api);
        let left = listed.as_ref().map(Vec::len);
        if left == Some(0) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{left:?} pods still there after the delete"));
        }
        let unmarked = listed
            .iter()
            .flatten()
            .any(|p| p["metadata"].get("deletionTimestamp").is_none());
        if unmarked && sent.elapsed() >= DELETE_AGAIN {
            delete()?;
            sent = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// How long after a collection's delete the pods it did not mark are deleted again.
const DELETE_AGAIN: Duration = Duration::from_secs(5);

/// The addresses host-local still holds once the pods are gone, by network, after at most 30 s for teardowns under
/// way.
fn addresses_left(w: &World) -> Vec<(String, usize)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let held = w.reserved_addresses();
        if held.is_empty() || Instant::now() > deadline {
            return held;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Requests the API server audited from `users` so far.
fn requests_of(api: &KubeApiServer, users: &[&str]) -> usize {
    if users.is_empty() {
        return 0;
    }
    api.audit()
        .iter()
        .filter(|(u, _, _)| users.contains(&u.as_str()))
        .count()
}

fn rss_kib(pid: u32) -> u64 {
    proc::status_kib(pid, "VmRSS:")
}

/// Samples a process's RSS every 100 ms from its start to its stop.
struct Sampler {
    pid: u32,
    rest_kib: u64,
    cpu_start: f64,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl Sampler {
    fn start(pid: u32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !flag.load(Ordering::Relaxed) {
                peak = peak.max(rss_kib(pid));
                std::thread::sleep(Duration::from_millis(100));
            }
            peak.max(rss_kib(pid))
        });
        Sampler {
            pid,
            rest_kib: rss_kib(pid),
            cpu_start: cpu::process_seconds(pid, Of::Own),
            stop,
            thread,
        }
    }

    fn stop(self) -> AgentUse {
        self.stop.store(true, Ordering::Relaxed);
        let peak_kib = self.thread.join().unwrap_or(0);
        AgentUse {
            rest_kib: self.rest_kib,
            peak_kib,
            after_kib: 0,
            cpu_seconds: cpu::process_seconds(self.pid, Of::Own) - self.cpu_start,
        }
    }
}

fn p99_of(b: &Burst) -> f64 {
    stats::percentile_of(b.startup.iter().map(|s| s.1), 0.99)
}

/// A subject's rounds: startup latencies over every pod of every round, the rest per round (and their median);
/// its p99 over the floor's and over the runtime's own three networks' of the same round (by round).
fn summarize(runs: &[Burst], floor_p99: &[f64], runtime_p99: &[f64]) -> Value {
    let sandbox: Vec<f64> = runs
        .iter()
        .flat_map(|b| b.startup.iter().map(|s| s.0))
        .collect();
    let ready: Vec<f64> = runs
        .iter()
        .flat_map(|b| b.startup.iter().map(|s| s.1))
        .collect();
    let per_round = |f: &dyn Fn(&Burst) -> f64| stats::by_round(runs.iter().map(f).collect());
    let over = |reference: &[f64]| {
        stats::by_round(
            runs.iter()
                .zip(reference)
                .map(|(b, r)| p99_of(b) / r)
                .collect(),
        )
    };
    let mut v = json!({
        "ready": stats::summary(&ready),
        "sandbox": stats::summary(&sandbox),
        "readyP99": per_round(&p99_of),
        "readyP99OverFloor": over(floor_p99),
        "readyP99OverRuntime3": over(runtime_p99),
        "podsPerSecond": per_round(&|b| b.pods_per_second),
        "apiRequests": per_round(&|b| b.api_requests as f64),
        "settleSeconds": per_round(&|b| b.settle_seconds),
        "memoryCgroups": runs.iter().map(|b| b.dropped.map_or(json!(null), |(before, after)| json!({"before": before, "after": after}))).collect::<Vec<_>>(),
        "leftAddresses": runs.iter().flat_map(|b| b.left_addresses.iter().map(|l| l.1)).sum::<usize>(),
        "leftByNetwork": runs.iter().map(|b| b.left_addresses.iter().cloned().collect::<BTreeMap<_, _>>()).collect::<Vec<_>>(),
    });
    // CPU ms per pod by part of the node, per round.
    let parts: std::collections::BTreeSet<&String> =
        runs.iter().flat_map(|b| b.cpu.keys()).collect();
    v["cpuMsPerPod"] = parts
        .into_iter()
        .map(|part| {
            let per_pod = |b: &Burst| {
                b.cpu.get(part).copied().unwrap_or(0.0) * 1e3 / b.startup.len().max(1) as f64
            };
            (part.clone(), per_round(&per_pod))
        })
        .collect::<serde_json::Map<_, _>>()
        .into();
    let agents: Vec<AgentUse> = runs.iter().filter_map(|b| b.agent).collect();
    if !agents.is_empty() {
        let m = |f: &dyn Fn(&AgentUse) -> f64| stats::median_of(agents.iter().map(f));
        v["agent"] = json!({
            "restKiB": m(&|a| a.rest_kib as f64),
            "peakKiB": m(&|a| a.peak_kib as f64),
            "afterKiB": m(&|a| a.after_kib as f64),
            "cpuSeconds": m(&|a| a.cpu_seconds),
            "peakOverRestKiB": m(&|a| a.peak_kib as f64 - a.rest_kib as f64),
        });
    }
    v
}
