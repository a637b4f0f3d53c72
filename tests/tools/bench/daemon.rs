//! The node daemon against a real kube-apiserver (with etcd, on loopback): per-cycle cost of thin mode and
//! daemon mode against the exec floor, API requests per ADD by identity (from the server's audit log), the
//! daemon's memory with 500 pods on its node and 10,000 NADs in the cluster, a burst of 200 simultaneous ADDs,
//! and the daemon killed during a burst.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use plexus_cni::daemon::client::ask;
use plexus_cni::daemon::proto::{Answer, DaemonHealth, Request};
use plexus_tests::deploy_manifest;
use plexus_tests::kubeapi::{KubeApiServer, PLEXUS_USER};
use serde_json::{json, Value};

use crate::world::{Delegates, World, POD_NS};
use crate::{log, ms, multus, phases, proc, stats, Opts};

const NODE: &str = "bench-node";
/// The node's pods the daemon caches: the measured ones, and the pod whose token is the daemon's node-bound identity.
const NODE_PODS: usize = PODS + PODS_10 + 2 * PODS_DRA + 1;
const CNI_USER: &str = "system:serviceaccount:kube-system:plexus-cni";
const PODS: usize = 500;
const NADS: usize = 10_000;
const BURST: usize = 200;
/// The namespace of the pods that select 10 NADs, and how many there are.
const NS_10: &str = "bench-10";
/// The namespace of the DRA comparison's pods, and how many of each kind.
const NS_DRA: &str = "bench-dra";
const PODS_DRA: usize = 10;
const PODS_10: usize = 10;

pub(crate) struct Daemon {
    child: Child,
    socket: std::path::PathBuf,
}

impl Daemon {
    fn start(
        plexus: &Path,
        kubeconfig: &Path,
        socket: &Path,
        log: &Path,
    ) -> Result<Daemon, String> {
        Self::start_on(plexus, NODE, kubeconfig, socket, log, &[])
    }

    /// The daemon of node `node`, with `extra` arguments.
    pub(crate) fn start_on(
        plexus: &Path,
        node: &str,
        kubeconfig: &Path,
        socket: &Path,
        log: &Path,
        extra: &[&std::ffi::OsStr],
    ) -> Result<Daemon, String> {
        let child = Command::new(plexus)
            .args(["daemon", "--node-name", node, "--kubeconfig"])
            .arg(kubeconfig)
            .arg("--socket")
            .arg(socket)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(log)
                    .map(Stdio::from)
                    .unwrap_or(Stdio::null()),
            )
            .spawn()
            .map_err(|e| format!("spawn plexus daemon: {e}"))?;
        Ok(Daemon {
            child,
            socket: socket.into(),
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    fn health(&self) -> Option<DaemonHealth> {
        match ask(&self.socket, &Request::Health, Duration::from_secs(2)) {
            Ok(Answer::Health(h)) => Some(h),
            _ => None,
        }
    }

    pub(crate) fn wait(
        &self,
        what: &str,
        limit: Duration,
        ok: impl Fn(&DaemonHealth) -> bool,
    ) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            if self.health().as_ref().is_some_and(&ok) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "daemon: {what} not reached; health {:?}",
                    self.health()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The status writes the API server took from the daemon so far (0 while it does not answer).
    fn status_writes(&self) -> u64 {
        self.health().map(|h| h.status_writes).unwrap_or(0)
    }

    /// Resident and peak resident memory, KiB, from /proc.
    fn memory_kib(&self) -> (u64, u64) {
        let pid = self.child.id();
        (
            proc::status_kib(pid, "VmRSS:"),
            proc::status_kib(pid, "VmHWM:"),
        )
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn args(pod: &str, uid: &str) -> String {
    args_in(POD_NS, pod, uid)
}

fn args_in(ns: &str, pod: &str, uid: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={pod};K8S_POD_UID={uid}")
}

/// Creates pods `pod-0..count` in `ns`, on the bench node, selecting `selection`; their UIDs by index.
fn create_pods(
    api: &KubeApiServer,
    ns: &str,
    count: usize,
    selection: &[String],
) -> Result<Vec<String>, String> {
    let pods: Vec<Value> = (0..count)
        .map(|p| {
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("pod-{p}"), "namespace": ns,
                    "annotations": {"k8s.v1.cni.cncf.io/networks": selection.join(",")}},
                "spec": {"nodeName": NODE, "automountServiceAccountToken": false,
                    "containers": [{"name": "c", "image": "pause"}]}})
        })
        .collect();
    let failed = api.create_many(&pods);
    if failed > 0 {
        return Err(format!(
            "{failed} of {count} pods in {ns} could not be created"
        ));
    }
    let list = api.must("GET", &format!("/api/v1/namespaces/{ns}/pods"), None);
    let mut uids = vec![String::new(); count];
    for item in list["items"].as_array().into_iter().flatten() {
        let name = item["metadata"]["name"].as_str().unwrap_or_default();
        if let Some(p) = name
            .strip_prefix("pod-")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|p| *p < count)
        {
            uids[p] = item["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string();
        }
    }
    Ok(uids)
}

/// One ADD then one DEL of `conf` for a pod: their wall times, ms.
fn cycle(
    plexus: &Path,
    w: &World,
    conf: &Value,
    id: &str,
    pod_args: &str,
) -> Result<(f64, f64), String> {
    add_then_del(id, |command| {
        w.plexus_args(plexus, conf, command, id, pod_args)
    })
}

/// `run("ADD")` then `run("DEL")`, each a whole CNI invocation that must succeed: their wall times, ms.
pub fn add_then_del(
    id: &str,
    mut run: impl FnMut(&str) -> std::io::Result<crate::proc::ChildRun>,
) -> Result<(f64, f64), String> {
    let mut times = [0.0; 2];
    for (i, command) in ["ADD", "DEL"].into_iter().enumerate() {
        let r = run(command).map_err(|e| e.to_string())?;
        if !r.success {
            return Err(format!(
                "{command} {id}: {}",
                String::from_utf8_lossy(&r.stdout)
            ));
        }
        times[i] = ms(r.elapsed);
    }
    Ok((times[0], times[1]))
}

/// ADD and DEL of the delegates exec'd directly, in a world's order: their wall times, ms.
fn floor_cycle(w: &World, id: &str) -> Result<(f64, f64), String> {
    let netns = "/var/run/netns/bench-noop";
    let (add, results) = w.floor_add(id, netns, 0)?;
    let del = w.floor_del(id, netns, 0, &results)?;
    Ok((ms(add), ms(del)))
}

/// Requests of one identity, without the daemon's list and watch: `[reads, status writes, events]`.
fn counts(api: &KubeApiServer, user: &str) -> [usize; 3] {
    let mut n = [0; 3];
    for (u, verb, uri) in api.audit() {
        if u != user {
            continue;
        }
        match verb.as_str() {
            "get" => n[0] += 1,
            "patch" if uri.contains("/status") => n[1] += 1,
            "create" if uri.contains("/events") => n[2] += 1,
            _ => {}
        }
    }
    n
}

/// The bench's API server: the CNI plugin's token (`cni-token`, its own service account bound to plexus's
/// ClusterRole) and, with `multus`, Multus's; the project's CRDs and RBAC as an operator installs them.
pub(crate) fn bench_api(multus: bool) -> KubeApiServer {
    let mut users = vec![("cni-token", "kube-system/plexus-cni")];
    if multus {
        users.push(multus::TOKEN);
    }
    let api = KubeApiServer::start(&users, &[]);
    api.apply_file(&deploy_manifest("crds.yaml"));
    // The NetworkHook CRDs as an operator installs them: without them the node agent's watch retries its list,
    // and every retry takes a token of the daemon's --kube-api-qps from the writes measured.
    api.apply_file(&deploy_manifest("networkhooks.yaml"));
    api.apply_file(&deploy_manifest("rbac.yaml"));
    api.create(&json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "plexus-cni"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "plexus"},
        "subjects": [{"kind": "ServiceAccount", "name": "plexus-cni", "namespace": "kube-system"}]
    }));
    api
}

/// The section's node: its API server with the measured pods and their NADs, and the plexus confs of each mode.
struct Node<'a> {
    o: &'a Opts,
    /// The pods with 4 attachments, and those with 11 (in a namespace and world of their own).
    w: World,
    w10: World,
    api: KubeApiServer,
    uids: Vec<String>,
    uids10: Vec<String>,
    daemon_kubeconfig: std::path::PathBuf,
    socket: std::path::PathBuf,
    /// Thin mode, daemon mode, daemon mode without the CNI process's report, daemon mode for the 11-attachment pods.
    thin: Value,
    served: Value,
    unreported: Value,
    served10: Value,
}

/// Each cycle's (ADD, DEL) times, ms, by subject.
type Samples = std::collections::BTreeMap<&'static str, (Vec<f64>, Vec<f64>)>;

/// The ADDs of a burst: each one's run, its container id and its pod.
type BurstRuns = Vec<(std::io::Result<crate::proc::ChildRun>, String, usize)>;

pub fn daemon(o: &Opts) -> Result<Value, String> {
    let t0 = Instant::now();
    let n = Node::new(o)?;
    log(&format!(
        "daemon: API server with {PODS} pods in {:.1}s",
        t0.elapsed().as_secs_f64()
    ));
    let cycles = n.cycle_section()?;
    log(&format!(
        "daemon: cycles done ({:.0}s)",
        t0.elapsed().as_secs_f64()
    ));
    let (d, memory) = n.memory_section()?;
    log(&format!(
        "daemon: {} KiB resident with {PODS} pods and {NADS} NADs",
        memory["rssKiB"]
    ));
    let burst = n.burst_section(&d);
    let killed = n.killed_section(&d);
    drop(d);
    // 5. Dynamic networks: a running pod's annotation changed, to its network-status written (the API server
    // took the daemon's write), attaching a second network and detaching it again, one change at a time.
    let hotplug = n.hotplug_section()?;
    Ok(json!({
        "cycles": cycles,
        "memory": memory,
        "burst": burst,
        "killedDuringBurst": killed,
        "hotplug": hotplug,
        "seconds": t0.elapsed().as_secs_f64(),
    }))
}

impl<'a> Node<'a> {
    /// The API server with 500 pods selecting 3 NADs and 10 pods selecting 10 NADs, and the confs.
    fn new(o: &'a Opts) -> Result<Node<'a>, String> {
        let w = World::new(&o.work, "daemon", Delegates::Noop, 4, 0, &json!({}));
        let api = bench_api(multus::provided().is_some());
        api.namespace(POD_NS);
        let selection: Vec<String> = (1..w.nets.len()).map(|i| format!("net{i}")).collect();
        for (i, net) in w.nets.iter().enumerate().skip(1) {
            api.nad(POD_NS, &format!("net{i}"), &net.list);
        }
        let uids = create_pods(&api, POD_NS, PODS, &selection)?;
        // Pods that select 10 NADs, in a namespace of their own (the worlds name their networks alike).
        let w10 = World::new(&o.work, "daemon-10", Delegates::Noop, 11, 0, &json!({}));
        api.namespace(NS_10);
        let selection10: Vec<String> = (1..w10.nets.len()).map(|i| format!("net{i}")).collect();
        for (i, net) in w10.nets.iter().enumerate().skip(1) {
            api.nad(NS_10, &format!("net{i}"), &net.list);
        }
        let uids10 = create_pods(&api, NS_10, PODS_10, &selection10)?;
        let cni_kubeconfig = w.root.join("cni.kubeconfig");
        let daemon_kubeconfig = w.root.join("daemon.kubeconfig");
        api.write_kubeconfig(&cni_kubeconfig, "cni-token");
        // The node's identity, as the DaemonSet pod's token carries it: the API server authorizes the claims'
        // network data by it.
        let daemon_token = api.node_bound_token("kube-system", "plexus", NODE);
        api.write_kubeconfig(&daemon_kubeconfig, &daemon_token);
        // One node, one runDir: the daemon's socket is there.
        let socket = w.run.join("daemon.sock");
        let thin = w.kube_conf(&cni_kubeconfig, json!(false));
        let served = w.kube_conf(&cni_kubeconfig, json!({"timeoutMs": 5000}));
        // The same without the report each CNI process hands the daemon for its metrics: what reporting costs.
        let unreported = w.kube_conf(&cni_kubeconfig, json!({"timeoutMs": 5000, "report": false}));
        let mut served10 = w10.kube_conf(&cni_kubeconfig, json!({"timeoutMs": 5000}));
        served10["runDir"] = json!(w.run);
        Ok(Node {
            o,
            w,
            w10,
            api,
            uids,
            uids10,
            daemon_kubeconfig,
            socket,
            thin,
            served,
            unreported,
            served10,
        })
    }

    /// Cycles per subject.
    fn runs(&self) -> usize {
        if self.o.quick {
            5
        } else {
            self.o.runs.min(40)
        }
    }

    /// The CNI_ARGS of the 4-attachment pod `pod`.
    fn pod_args(&self, pod: usize) -> String {
        args(&format!("pod-{pod}"), &self.uids[pod])
    }

    /// Section 1: per-cycle cost, interleaved run by run: 4 attachments (floor, thin, daemon through plexus and through
    /// plexus-cni, Multus when provided) and 11 (floor, daemon); DELs while the API server hangs; where an ADD and
    /// a DEL spend their time; requests per ADD; the DRA comparison.
    fn cycle_section(&self) -> Result<Value, String> {
        let (o, w, api) = (self.o, &self.w, &self.api);
        let d = Daemon::start(
            &o.plexus,
            &self.daemon_kubeconfig,
            &self.socket,
            &w.root.join("daemon-1.log"),
        )?;
        let dra_pods = dra_setup(api, w)?;
        d.wait("synced", Duration::from_secs(60), |h| {
            plexus_tests::plexus::settled(h) && h.cache.pods == NODE_PODS && h.cache.dra_synced
        })?;
        // Multus's thick plugin on the same node, pods and NADs, when one is provided.
        let multus = match multus::provided() {
            Some(bins) => {
                multus::rbac(api);
                let m = multus::Multus::start(&bins, api, w, NODE)?;
                m.warm(w, &self.pod_args(0))?;
                log(&format!("daemon: Multus {} answers", m.version));
                Some(m)
            }
            None => None,
        };
        let runs = self.runs();
        let samples = self.cycles(multus.as_ref(), runs)?;
        let hung_runs = runs.min(20);
        let hung = self.dels_with_the_api_stopped(hung_runs)?;
        let breakdown = self.traced_phases(&samples, &self.served, "daemon", runs.min(30))?;
        let breakdown_thin = self.traced_phases(&samples, &self.thin, "thin", runs.min(10))?;
        let requests = json!({
            "thin": self.requests_per_add(&d, &self.thin, "thin")?,
            "daemon": self.requests_per_add(&d, &self.served, "daemon")?,
        });
        let dra = dra_cycles(o, api, w, &dra_pods, runs)?;
        let mut cycles = cycles_json(&samples, runs, self.w10.nets.len());
        cycles["del"]["apiStopped"] = hung_json(&hung, hung_runs);
        cycles["requestsPerAdd"] = requests;
        cycles["breakdown"] = breakdown;
        cycles["breakdownThin"] = breakdown_thin;
        cycles["dra"] = dra;
        cycles["multus"] = match &multus {
            Some(m) => multus_json(m, &samples),
            None => json!({"skipped": format!("{} not set", multus::ENV)}),
        };
        Ok(cycles)
    }

    /// `runs` cycles of each subject, interleaved run by run (after one warm-up cycle of each Plexus mode).
    fn cycles(&self, multus: Option<&multus::Multus>, runs: usize) -> Result<Samples, String> {
        let (o, w, w10) = (self.o, &self.w, &self.w10);
        let mut samples = Samples::new();
        let mut push = |key: &'static str, (add, del): (f64, f64)| {
            let e = samples.entry(key).or_default();
            e.0.push(add);
            e.1.push(del);
        };
        let pod_args10 = |pod: usize| args_in(NS_10, &format!("pod-{pod}"), &self.uids10[pod]);
        cycle(&o.plexus, w, &self.thin, "warm-thin", &self.pod_args(0))?;
        cycle(&o.plexus, w, &self.served, "warm-daemon", &self.pod_args(0))?;
        cycle(
            &o.plexus_cni,
            w10,
            &self.served10,
            "warm-daemon",
            &pod_args10(0),
        )?;
        for i in 0..runs {
            let a = self.pod_args(1 + i % 10);
            push("floor", floor_cycle(w, &format!("floor-{i}"))?);
            push(
                "thin",
                cycle(&o.plexus, w, &self.thin, &format!("thin-{i}"), &a)?,
            );
            push(
                "daemon",
                cycle(&o.plexus, w, &self.served, &format!("daemon-{i}"), &a)?,
            );
            push(
                "daemonCni",
                cycle(&o.plexus_cni, w, &self.served, &format!("cni-{i}"), &a)?,
            );
            push(
                "daemonCniUnreported",
                cycle(
                    &o.plexus_cni,
                    w,
                    &self.unreported,
                    &format!("unreported-{i}"),
                    &a,
                )?,
            );
            if let Some(m) = multus {
                push("multus", m.cycle(w, &format!("multus-{i}"), &a)?);
            }
            push("floor10", floor_cycle(w10, &format!("floor-{i}"))?);
            push(
                "daemon10",
                cycle(
                    &o.plexus_cni,
                    w10,
                    &self.served10,
                    &format!("daemon-{i}"),
                    &pod_args10(i % PODS_10),
                )?,
            );
        }
        Ok(samples)
    }

    /// DEL while the API server hangs (SIGSTOP): ADDs with it up, then their DELs with it stopped, in thin and
    /// daemon mode, against the floor's DELs of the same run. DEL times, ms, by subject.
    fn dels_with_the_api_stopped(
        &self,
        runs: usize,
    ) -> Result<std::collections::BTreeMap<&'static str, Vec<f64>>, String> {
        let (o, w) = (self.o, &self.w);
        let mut hung: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
        for (key, conf) in [("thin", &self.thin), ("daemon", &self.served)] {
            for i in 0..runs {
                let id = format!("hung-{key}-{i}");
                let add = w
                    .plexus_args(&o.plexus_cni, conf, "ADD", &id, &self.pod_args(1 + i % 10))
                    .map_err(|e| e.to_string())?;
                if !add.success {
                    return Err(format!(
                        "ADD {id}: {}",
                        String::from_utf8_lossy(&add.stdout)
                    ));
                }
            }
            self.api.pause();
            let mut dels = Vec::new();
            let mut failed = None;
            for i in 0..runs {
                let id = format!("hung-{key}-{i}");
                match w.plexus_args(&o.plexus_cni, conf, "DEL", &id, &self.pod_args(1 + i % 10)) {
                    Ok(r) if r.success => dels.push(ms(r.elapsed)),
                    Ok(r) => {
                        failed = Some(format!("DEL {id}: {}", String::from_utf8_lossy(&r.stdout)))
                    }
                    Err(e) => failed = Some(e.to_string()),
                }
                let floor = floor_cycle(w, &format!("hung-floor-{key}-{i}"))?;
                hung.entry("floor").or_default().push(floor.1);
            }
            self.api.resume();
            if let Some(e) = failed {
                return Err(format!("with the API server stopped: {e}"));
            }
            hung.insert(key, dels);
        }
        Ok(hung)
    }

    /// Where one ADD and one DEL of plexus-cni spend their time: the same cycles with logLevel debug, each
    /// invocation's phases read back from its log (a separate run: the log lines cost time of their own). Daemon
    /// mode, and thin mode (where the pod, the NADs and the status are API requests of the CNI process).
    fn traced_phases(
        &self,
        samples: &Samples,
        conf: &Value,
        tag: &str,
        runs: usize,
    ) -> Result<Value, String> {
        let w = &self.w;
        let phase_log = w.root.join(format!("phases-{tag}.log"));
        let _ = std::fs::remove_file(&phase_log);
        let mut traced = conf.clone();
        traced["logLevel"] = json!("debug");
        traced["logFile"] = json!(phase_log);
        let (mut add_wall, mut del_wall) = (Vec::new(), Vec::new());
        for i in 0..runs {
            let a = self.pod_args(1 + i % 10);
            let id = format!("phases-{tag}-{i}");
            for (command, wall) in [("ADD", &mut add_wall), ("DEL", &mut del_wall)] {
                let r = w
                    .plexus_args(&self.o.plexus_cni, &traced, command, &id, &a)
                    .map_err(|e| e.to_string())?;
                if !r.success {
                    return Err(format!(
                        "{command} {id}: {}",
                        String::from_utf8_lossy(&r.stdout)
                    ));
                }
                wall.push(ms(r.elapsed));
            }
        }
        let text = std::fs::read_to_string(&phase_log)
            .map_err(|e| format!("{}: {e}", phase_log.display()))?;
        Ok(json!({
            "binary": "plexus-cni",
            "runs": add_wall.len(),
            "add": phases::summary(&text, "ADD", &add_wall),
            "del": phases::summary(&text, "DEL", &del_wall),
            "floorPerDelegateExec": (stats::median_of(samples["floor"].0.iter().copied())
                + stats::median_of(samples["floor"].1.iter().copied()))
                / (2 * w.nets.len()) as f64,
            "delegates": w.nets.len(),
        }))
    }

    /// Requests per ADD, by identity, over 10 ADDs with `conf`.
    fn requests_per_add(&self, d: &Daemon, conf: &Value, tag: &str) -> Result<Value, String> {
        let api = &self.api;
        let before = (counts(api, CNI_USER), counts(api, PLEXUS_USER));
        for i in 0..10 {
            cycle(
                &self.o.plexus,
                &self.w,
                conf,
                &format!("count-{tag}-{i}"),
                &self.pod_args(20 + i),
            )?;
        }
        // The daemon writes and posts after it answered, paced by its --kube-api-qps: count once its writes are
        // sent, and its events (not queued) had the time the bucket gives them (3 per ADD at 5 a second).
        d.wait("the writes sent", Duration::from_secs(60), |h| {
            h.pending_writes == 0
        })?;
        std::thread::sleep(Duration::from_secs(8));
        let after = (counts(api, CNI_USER), counts(api, PLEXUS_USER));
        let per = |a: [usize; 3], b: [usize; 3]| {
            let d = |i: usize| (b[i] - a[i]) as f64 / 10.0;
            json!({"reads": d(0), "statusWrites": d(1), "events": d(2)})
        };
        Ok(json!({"cni": per(before.0, after.0), "daemon": per(before.1, after.1)}))
    }

    /// Section 2: memory with 500 pods on the node and 10,000 NADs in the cluster: a new daemon synced with all of
    /// them, returned for the bursts.
    fn memory_section(&self) -> Result<(Daemon, Value), String> {
        let api = &self.api;
        let nads: Vec<Value> = (0..NADS)
            .map(|i| {
                let ns = format!("tenant-{}", i % 20);
                json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                    "metadata": {"name": format!("nad-{i}"), "namespace": ns},
                    "spec": {"config": json!({"cniVersion": "1.0.0", "name": format!("nad-{i}"), "type": "macvlan",
                        "master": "eth0", "mode": "bridge",
                        "ipam": {"type": "host-local", "subnet": format!("10.{}.{}.0/24", 100 + i / 256 % 100, i % 256)}}).to_string()}})
            })
            .collect();
        for t in 0..20 {
            api.create(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("tenant-{t}")}}));
        }
        let failed = api.create_many(&nads);
        if failed > 0 {
            return Err(format!("{failed} of {NADS} NADs could not be created"));
        }
        log(&format!("daemon: {NADS} NADs created"));
        let d = Daemon::start(
            &self.o.plexus,
            &self.daemon_kubeconfig,
            &self.socket,
            &self.w.root.join("daemon-2.log"),
        )?;
        let started = Instant::now();
        d.wait("synced with everything", Duration::from_secs(120), |h| {
            plexus_tests::plexus::settled(h)
                && h.cache.pods == NODE_PODS
                && h.cache.nads == NADS + 3 + 10 + 4
        })?;
        let sync_seconds = started.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_secs(2));
        let (rss, hwm) = d.memory_kib();
        let memory = json!({"pods": PODS + PODS_10 + 2 * PODS_DRA, "nads": NADS + 17, "syncSeconds": sync_seconds, "rssKiB": rss, "peakKiB": hwm});
        Ok((d, memory))
    }

    /// [`BURST`] simultaneous ADDs of daemon mode, of the pods from `first`; with `kill`, that daemon killed 100 ms
    /// into them.
    fn burst(&self, tag: &str, first: usize, kill: Option<&Daemon>) -> BurstRuns {
        let barrier = Barrier::new(BURST + 1);
        let results = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for p in first..first + BURST {
                let (barrier, results) = (&barrier, &results);
                s.spawn(move || {
                    barrier.wait();
                    let id = format!("{tag}-{p}");
                    let r = self.w.plexus_args(
                        &self.o.plexus,
                        &self.served,
                        "ADD",
                        &id,
                        &self.pod_args(p),
                    );
                    results
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((r, id, p));
                });
            }
            barrier.wait();
            if let Some(d) = kill {
                std::thread::sleep(Duration::from_millis(100));
                let _ = Command::new("kill")
                    .args(["-KILL", &d.child.id().to_string()])
                    .status();
            }
        });
        results.into_inner().unwrap_or_else(|e| e.into_inner())
    }

    /// DELs of `ids`, 16 at a time; how many failed.
    fn del_all(&self, ids: &[(String, usize)]) -> usize {
        let failures = Mutex::new(0usize);
        std::thread::scope(|s| {
            for chunk in ids.chunks(ids.len().div_ceil(16).max(1)) {
                let failures = &failures;
                s.spawn(move || {
                    for (id, p) in chunk {
                        let ok = self
                            .w
                            .plexus_args(
                                &self.o.plexus,
                                &self.served,
                                "DEL",
                                id,
                                &self.pod_args(*p),
                            )
                            .is_ok_and(|r| r.success);
                        if !ok {
                            *failures.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                        }
                    }
                });
            }
        });
        failures.into_inner().unwrap_or_else(|e| e.into_inner())
    }

    /// Section 3: a burst of 200 simultaneous ADDs, then their DELs.
    fn burst_section(&self, d: &Daemon) -> Value {
        let shed_before = d.health().map(|h| h.shed).unwrap_or(0);
        let results = self.burst("burst", 0, None);
        let (_, hwm_burst) = d.memory_kib();
        let mut lat = Vec::new();
        let mut failures = Vec::new();
        for (r, _, _) in &results {
            match r {
                Ok(run) if run.success => lat.push(ms(run.elapsed)),
                Ok(run) => failures.push(String::from_utf8_lossy(&run.stdout).into_owned()),
                Err(e) => failures.push(e.to_string()),
            }
        }
        let h = d.health();
        let del_failures = self.del_all(&ids_of(&results));
        log(&format!(
            "daemon: burst of {BURST}: {} failures, daemon peak {hwm_burst} KiB",
            failures.len()
        ));
        json!({
            "adds": BURST,
            "add": stats::summary(&lat),
            "failures": failures,
            "delFailures": del_failures,
            "shed": h.as_ref().map(|h| h.shed - shed_before),
            "apiReadsByDaemon": h.as_ref().map(|h| h.api_reads),
            "daemonPeakKiB": hwm_burst,
            "cacheLeftAfterDel": self.w.cached(),
        })
    }

    /// Section 4: the daemon killed 100 ms into a burst: every ADD completes or fails with a CNI error, every DEL
    /// succeeds, nothing is left in the attachment cache.
    fn killed_section(&self, d: &Daemon) -> Value {
        let cni_before = counts(&self.api, CNI_USER);
        let results = self.burst("killed", BURST, Some(d));
        let cni_after = counts(&self.api, CNI_USER);
        let (mut ok, mut clean, mut unclean) = (0, 0, Vec::new());
        for (r, _, _) in &results {
            match r {
                Ok(run) if run.success => ok += 1,
                Ok(run)
                    if serde_json::from_slice::<Value>(&run.stdout)
                        .is_ok_and(|v| v["code"].is_u64()) =>
                {
                    clean += 1
                }
                Ok(run) => unclean.push(String::from_utf8_lossy(&run.stdout).into_owned()),
                Err(e) => unclean.push(e.to_string()),
            }
        }
        let del_failures = self.del_all(&ids_of(&results));
        log(&format!("daemon: killed mid-burst: {ok} ADDs ok, {clean} failed cleanly, {} otherwise; {del_failures} DEL failures", unclean.len()));
        json!({
            "adds": BURST,
            "succeeded": ok,
            "failedCleanly": clean,
            "failedUncleanly": unclean,
            // What the CNI processes that went thin after the kill read and wrote themselves.
            "thinReads": cni_after[0] - cni_before[0],
            "thinStatusWrites": cni_after[1] - cni_before[1],
            "delFailures": del_failures,
            "cacheLeftAfterDel": self.w.cached(),
        })
    }

    /// Section 5: hot-plug latency, ms, from the annotation patch's answer to the daemon's status write being taken
    /// by the API server, for attach and detach; the sandbox's cache is empty after its DEL.
    fn hotplug_section(&self) -> Result<Value, String> {
        let (o, w) = (self.o, &self.w);
        let runs = self.runs();
        let (d, uid) = self.hotplug_daemon()?;
        let cni = |command: &str| {
            w.plexus_args(
                &o.plexus,
                &self.served,
                command,
                "hotplug-0",
                &args("hotplug", &uid),
            )
            .map_err(|e| e.to_string())
        };
        let run = cni("ADD")?;
        if !run.success {
            return Err(format!(
                "hot-plug ADD: {}",
                String::from_utf8_lossy(&run.stdout)
            ));
        }
        // Writes kept by the daemon killed in section 4 are sent first, and the ADD's own: none left pending.
        d.wait("no status write pending", Duration::from_secs(60), |h| {
            h.pending_writes == 0
        })?;
        let (attach, detach) = self.hotplug_changes(&d, runs)?;
        let del = cni("DEL")?;
        log(&format!(
            "daemon: hot-plug attach median {:.1} ms, detach median {:.1} ms",
            stats::summary(&attach)["median"].as_f64().unwrap_or(0.0),
            stats::summary(&detach)["median"].as_f64().unwrap_or(0.0)
        ));
        Ok(json!({
            "changes": runs,
            "attach": stats::summary(&attach),
            "detach": stats::summary(&detach),
            "delOk": del.success,
            "cacheLeftAfterDel": w.cached(),
        }))
    }

    /// A daemon with dynamic networks on, synced with the pod `hotplug` (selecting `net1`) and with no write left
    /// from the daemon killed before it; the pod's UID.
    fn hotplug_daemon(&self) -> Result<(Daemon, String), String> {
        let (o, w, api) = (self.o, &self.w, &self.api);
        let cache_dir = w.root.join("cache");
        let d = Daemon::start_on(
            &o.plexus,
            NODE,
            &self.daemon_kubeconfig,
            &self.socket,
            &w.root.join("daemon-hotplug.log"),
            &[
                "--dynamic-networks".as_ref(),
                "--cache-dir".as_ref(),
                cache_dir.as_os_str(),
                "--metrics-bind-address".as_ref(),
                "0".as_ref(),
            ],
        )?;
        let pod = api.pod(
            POD_NS,
            "hotplug",
            NODE,
            json!({"k8s.v1.cni.cncf.io/networks": "net1"}),
        );
        let uid = pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        d.wait(
            "synced with the hot-plug pod",
            Duration::from_secs(120),
            |h| plexus_tests::plexus::settled(h) && h.cache.pods == NODE_PODS + 1,
        )?;
        // The writes the daemon killed mid-burst kept are sent first (at --kube-api-qps): measured once they are.
        d.wait("the kept writes sent", Duration::from_secs(180), |h| {
            h.pending_writes == 0
        })?;
        Ok((d, uid))
    }

    /// `runs` changes of the pod `hotplug`'s networks each way, one at a time: attaching `net2`, then detaching it;
    /// each change's latency to its status write taken, ms.
    fn hotplug_changes(&self, d: &Daemon, runs: usize) -> Result<(Vec<f64>, Vec<f64>), String> {
        let (mut attach, mut detach) = (Vec::new(), Vec::new());
        for i in 0..runs {
            for (networks, into) in [("net1,net2", &mut attach), ("net1", &mut detach)] {
                let before = d.status_writes();
                self.api.must(
                    "PATCH",
                    &format!("/api/v1/namespaces/{POD_NS}/pods/hotplug"),
                    Some(&json!({"metadata": {"annotations": {"k8s.v1.cni.cncf.io/networks": networks}}})),
                );
                let t = Instant::now();
                status_write_taken(d, before + 1)
                    .map_err(|e| format!("{e} (change {i}, {networks})"))?;
                into.push(ms(t.elapsed()));
            }
        }
        Ok((attach, detach))
    }
}

/// Waits (at most 20 s, polling every ms) until the API server has taken the hot-plug daemon's `n`th status write.
fn status_write_taken(d: &Daemon, n: u64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while d.status_writes() < n {
        if Instant::now() > deadline {
            return Err(format!("hot-plug: status write {n} not taken within 20 s"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Cycle `key`'s ADD+DEL times.
fn totals(samples: &Samples, key: &str) -> Vec<f64> {
    let (add, del) = &samples[key];
    add.iter().zip(del).map(|(a, d)| a + d).collect()
}

/// The median cycle of `key` over `floor`'s.
fn over(samples: &Samples, key: &str, floor: &str) -> f64 {
    stats::median_of(totals(samples, key)) / stats::median_of(totals(samples, floor))
}

/// The median of `v` over `floor`'s.
fn median_over(v: &[f64], floor: &[f64]) -> f64 {
    stats::median_of(v.iter().copied()) / stats::median_of(floor.iter().copied())
}

/// The cycles' figures, with 11 attachments for the `ten` subjects.
fn cycles_json(samples: &Samples, runs: usize, ten: usize) -> Value {
    let total = |key: &str| totals(samples, key);
    let over = |key: &str, floor: &str| over(samples, key, floor);
    json!({
        "runs": runs,
        "floor": stats::summary(&total("floor")),
        "thin": stats::summary(&total("thin")),
        "daemon": stats::summary(&total("daemon")),
        "daemonCni": stats::summary(&total("daemonCni")),
        "thinOverFloor": over("thin", "floor"),
        "daemonOverFloor": over("daemon", "floor"),
        "daemonCniOverFloor": over("daemonCni", "floor"),
        "report": {
            "on": stats::summary(&total("daemonCni")),
            "off": stats::summary(&total("daemonCniUnreported")),
            "onOverOff": over("daemonCni", "daemonCniUnreported"),
            "addOn": stats::summary(&samples["daemonCni"].0),
            "addOff": stats::summary(&samples["daemonCniUnreported"].0),
        },
        "ten": {
            "attachments": ten,
            "floor": stats::summary(&total("floor10")),
            "daemon": stats::summary(&total("daemon10")),
            "daemonOverFloor": over("daemon10", "floor10"),
        },
        "del": {
            "floor": stats::summary(&samples["floor"].1),
            "thin": stats::summary(&samples["thin"].1),
            "daemon": stats::summary(&samples["daemon"].1),
            "daemonCni": stats::summary(&samples["daemonCni"].1),
            "daemonCniOverFloor": median_over(&samples["daemonCni"].1, &samples["floor"].1),
            "thinOverFloor": median_over(&samples["thin"].1, &samples["floor"].1),
        },
    })
}

/// The DELs with the API server stopped.
fn hung_json(hung: &std::collections::BTreeMap<&str, Vec<f64>>, runs: usize) -> Value {
    json!({
        "runs": runs,
        "floor": stats::summary(&hung["floor"]),
        "thin": stats::summary(&hung["thin"]),
        "daemon": stats::summary(&hung["daemon"]),
        "thinOverFloor": median_over(&hung["thin"], &hung["floor"]),
        "daemonOverFloor": median_over(&hung["daemon"], &hung["floor"]),
    })
}

/// Multus's cycles against the floor's and plexus-cni's.
fn multus_json(m: &multus::Multus, samples: &Samples) -> Value {
    json!({
        "version": m.version,
        "shimBytes": m.shim_bytes(),
        "cycle": stats::summary(&totals(samples, "multus")),
        "add": stats::summary(&samples["multus"].0),
        "del": stats::summary(&samples["multus"].1),
        "overFloor": over(samples, "multus", "floor"),
        "plexusCniOverMultus": stats::median_of(totals(samples, "daemonCni"))
            / stats::median_of(totals(samples, "multus")),
        "delOverFloor": median_over(&samples["multus"].1, &samples["floor"].1),
    })
}

/// The container IDs of a burst's ADDs with their pods, for their DELs.
fn ids_of<R>(results: &[(R, String, usize)]) -> Vec<(String, usize)> {
    results.iter().map(|(_, id, p)| (id.clone(), *p)).collect()
}

/// Reads of one identity, gets and lists (a thin-mode ADD reads the pod's claims by name).
fn reads_of(api: &KubeApiServer, user: &str) -> usize {
    api.audit()
        .into_iter()
        .filter(|(u, verb, _)| u == user && (verb == "get" || verb == "list"))
        .count()
}

/// The DRA comparison's pods: `(dra pod UIDs, device-plugin pod UIDs)`.
type DraPods = (Vec<String>, Vec<String>);

/// Two NADs per resource in [`NS_DRA`] (the world's first two networks): `dra-a`, `dra-b` on resource
/// `example.com/dra`, whose devices come from ResourceClaims, and `dp-a`, `dp-b` on `example.com/dp`, from a
/// device plugin. The node's ResourceSlice lists two devices per DRA pod; each DRA pod `dra-<i>` names a claim
/// allocated two of them and reserved for it; pods `dp-<i>` select the device-plugin NADs.
fn dra_setup(api: &KubeApiServer, w: &World) -> Result<DraPods, String> {
    api.namespace(NS_DRA);
    for (name, resource, net) in [
        ("dra-a", "example.com/dra", 1),
        ("dra-b", "example.com/dra", 2),
        ("dp-a", "example.com/dp", 1),
        ("dp-b", "example.com/dp", 2),
    ] {
        api.create(&json!({
            "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": NS_DRA,
                "annotations": {"k8s.v1.cni.cncf.io/resourceName": resource}},
            "spec": {"config": w.nets[net].list.to_string()}
        }));
    }
    let devices: Vec<Value> = (0..2 * PODS_DRA)
        .map(|i| {
            json!({"name": format!("vf{i}"), "attributes": {
                "k8s.cni.cncf.io/deviceID": {"string": format!("0000:03:{:02x}.1", i)},
                "k8s.cni.cncf.io/resourceName": {"string": "example.com/dra"}}})
        })
        .collect();
    api.create(&json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "bench-node-dra"},
        "spec": {"driver": "dra.bench.example.com", "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1}, "devices": devices}
    }));
    // A DRA pod names its claim in spec.resourceClaims, as the claims of a pod are found.
    let pods = |prefix: &str, networks: &str| -> Result<Vec<String>, String> {
        (0..PODS_DRA)
            .map(|i| {
                let claims = match prefix {
                    "dra" => {
                        json!([{"name": "nics", "resourceClaimName": format!("dra-{i}-nics")}])
                    }
                    _ => json!([]),
                };
                let pod = api.create(&json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": format!("{prefix}-{i}"), "namespace": NS_DRA,
                        "annotations": {"k8s.v1.cni.cncf.io/networks": networks}},
                    "spec": {"nodeName": NODE, "automountServiceAccountToken": false,
                        "resourceClaims": claims,
                        "containers": [{"name": "c", "image": "pause"}]}}));
                pod["metadata"]["uid"]
                    .as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("pod {prefix}-{i}: no uid"))
            })
            .collect()
    };
    let dra = pods("dra", "dra-a,dra-b")?;
    let dp = pods("dp", "dp-a,dp-b")?;
    for (i, uid) in dra.iter().enumerate() {
        let claim = format!("dra-{i}-nics");
        api.create(&json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": claim, "namespace": NS_DRA}, "spec": {"devices": {"requests": [
                {"name": "nic", "exactly": {"deviceClassName": "dra.bench.example.com", "count": 2}}]}}}));
        let results: Vec<Value> = (0..2)
            .map(|k| {
                json!({"request": "nic", "driver": "dra.bench.example.com", "pool": NODE,
                            "device": format!("vf{}", 2 * i + k)})
            })
            .collect();
        api.must(
            "PATCH",
            &format!("/apis/resource.k8s.io/v1/namespaces/{NS_DRA}/resourceclaims/{claim}/status"),
            Some(
                &json!({"status": {"allocation": {"devices": {"results": results}},
                "reservedFor": [{"resource": "pods", "name": format!("dra-{i}"), "uid": uid}]}}),
            ),
        );
    }
    Ok((dra, dp))
}

/// Daemon-mode ADD+DEL of a pod with 2 NADs whose devices come from its ResourceClaim, against the same pod shape
/// with device-plugin devices (kubelet's PodResources API, a stand-in serving the real protocol on a local
/// socket), interleaved run by run through plexus-cni; and the API requests per ADD of each.
fn dra_cycles(
    o: &Opts,
    api: &KubeApiServer,
    w: &World,
    (dra, dp): &DraPods,
    runs: usize,
) -> Result<Value, String> {
    let socket = w.root.join("pod-resources.sock");
    let allocation = (0..PODS_DRA)
        .map(|i| {
            let ids = vec![
                format!("0000:04:{:02x}.1", 2 * i),
                format!("0000:04:{:02x}.1", 2 * i + 1),
            ];
            (
                NS_DRA.to_string(),
                format!("dp-{i}"),
                vec![("c".to_string(), "example.com/dp".to_string(), ids)],
            )
        })
        .collect();
    let _kubelet = plexus_tests::podresources::PodResourcesServer::start(&socket, allocation, true);
    let cni_kubeconfig = w.root.join("cni.kubeconfig");
    let mut conf = w.kube_conf(&cni_kubeconfig, json!({"timeoutMs": 5000}));
    conf["podResourcesSocket"] = json!(socket);
    let args = |prefix: &str, i: usize, uids: &[String]| {
        args_in(NS_DRA, &format!("{prefix}-{i}"), &uids[i])
    };
    let one = |prefix: &str, id: String, i: usize, uids: &[String]| -> Result<(f64, f64), String> {
        let r = cycle(&o.plexus_cni, w, &conf, &id, &args(prefix, i, uids))?;
        Ok(r)
    };
    one("dra", "warm-dra".into(), 0, dra)?;
    one("dp", "warm-dp".into(), 0, dp)?;
    let (mut claims, mut plugins) = (Vec::new(), Vec::new());
    let (mut claims_add, mut plugins_add) = (Vec::new(), Vec::new());
    for i in 0..runs {
        let p = i % PODS_DRA;
        let (a, d) = one("dra", format!("dra-{i}"), p, dra)?;
        claims.push(a + d);
        claims_add.push(a);
        let (a, d) = one("dp", format!("dp-{i}"), p, dp)?;
        plugins.push(a + d);
        plugins_add.push(a);
    }
    // Requests per ADD: 10 ADDs of each, the CNI process's and the daemon's reads from the audit log.
    let reads_per_add = |prefix: &str, uids: &[String]| -> Result<Value, String> {
        let before = (reads_of(api, CNI_USER), counts(api, PLEXUS_USER)[0]);
        for i in 0..PODS_DRA {
            one(prefix, format!("count-{prefix}-{i}"), i, uids)?;
        }
        let after = (reads_of(api, CNI_USER), counts(api, PLEXUS_USER)[0]);
        let n = PODS_DRA as f64;
        Ok(json!({"cniReads": (after.0 - before.0) as f64 / n,
                  "daemonReads": (after.1 - before.1) as f64 / n}))
    };
    let requests =
        json!({"claims": reads_per_add("dra", dra)?, "devicePlugin": reads_per_add("dp", dp)?});
    Ok(json!({
        "runs": runs,
        "nads": 2,
        "claims": stats::summary(&claims),
        "devicePlugin": stats::summary(&plugins),
        "claimsOverDevicePlugin": stats::median_of(claims.iter().copied()) / stats::median_of(plugins.iter().copied()),
        "claimsAdd": stats::summary(&claims_add),
        "devicePluginAdd": stats::summary(&plugins_add),
        "addOverDevicePlugin": stats::median_of(claims_add.iter().copied()) / stats::median_of(plugins_add.iter().copied()),
        "requestsPerAdd": requests,
    }))
}
