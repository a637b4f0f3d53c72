//! plexus-soak: the reliability report. Injects the faults operators fear in a CNI plugin's teardown, many times
//! over, and counts what leaked: interfaces, IP reservations, cache entries, lock files, processes.
//!
//! Not a test. Run by `tests/soak.sh` (as root: real namespaces, bridges and the reference plugins), which
//! writes `docs/reliability.md` from what this prints on stdout (Markdown).
//!
//! Its options: `plexus-soak --help`. The node daemon's rows need the real kube-apiserver (the build of
//! `tests/parts.sh`, which `tests/soak.sh` runs) and the wasm guests.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use plexus_cni::daemon::client::ask;
use plexus_cni::daemon::proto::{Answer, DaemonHealth, Request};
use plexus_tests::apiserver::{ApiServer, Fault};
use plexus_tests::deploy_manifest;
use plexus_tests::kubeapi::KubeApiServer;
use plexus_tests::netns::{
    bridge_host_local, cni_bin_dir, host_links_on_bridge, require_root_and_plugins, HostBridge,
    IpamDir, NetNs,
};
use plexus_tests::plexus::{self, Sandbox};
use plexus_tests::registry::{key_pair, Registry};
use plexus_tests::runtime::RuntimeKind;
use serde_json::{json, Value};

mod node;

const POD_NS: &str = "soak";
/// Every container id of a run starts with this, so leftover processes can be found by their environment.
const ID_PREFIX: &str = "soak-";

/// Teardown and node daemon faults injected, what leaked or was lost, as Markdown (as root; run by tests/soak.sh)
#[derive(Parser)]
#[command(name = "plexus-soak")]
struct Args {
    /// Iterations of each teardown fault (the slower faults run a quarter or a tenth as many).
    #[arg(long, value_name = "N", default_value_t = 200)]
    iterations: usize,
    /// Pods added and deleted at once in the concurrency row.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pods: usize,
    /// Pods added through the node daemon during its API outage (half as many in each of its other two rows).
    #[arg(long, value_name = "N", default_value_t = 100)]
    daemon_pods: usize,
    /// Length of the API server outage in the node daemon's rows, in seconds.
    #[arg(long = "outage-secs", value_name = "N", default_value_t = 60)]
    outage: u64,
    /// The runtimes of the node section (`containerd`, `cri-o`), comma-separated; `none` leaves the section out.
    #[arg(long, value_name = "LIST", default_value = "containerd,cri-o")]
    node_runtimes: String,
    /// How long pods churn on after each event of the node section, in seconds.
    #[arg(long = "node-churn-secs", value_name = "N", default_value_t = 20)]
    node_churn: u64,
}

fn main() {
    let Args {
        iterations,
        pods,
        daemon_pods,
        outage,
        node_runtimes,
        node_churn,
    } = Args::parse();
    let runtimes = node_runtimes_of(&node_runtimes);
    require_root_and_plugins();
    let started = Instant::now();
    let mut rows = Vec::new();
    let mut latency = Vec::new();
    let mut rng = Rng::new();
    eprintln!("soak: kill -9 during ADD");
    rows.push(kill_during(&mut rng, "ADD", iterations));
    eprintln!("soak: kill -9 during DEL");
    rows.push(kill_during(&mut rng, "DEL", iterations));
    eprintln!("soak: hung delegate");
    rows.push(hung_delegate(iterations / 4));
    eprintln!("soak: flooding delegate");
    rows.push(flooding_delegate(iterations / 10));
    for api in [Api::Refused, Api::Hung, Api::Slow] {
        eprintln!("soak: API {}", api.label());
        let (row, lat) = api_fault(api, iterations / 4);
        rows.push(row);
        latency.push(lat);
    }
    eprintln!("soak: disk full");
    rows.push(disk_full(iterations / 10));
    eprintln!("soak: read-only cacheDir");
    rows.push(read_only_cache(iterations / 10));
    eprintln!("soak: concurrent ADD and DEL of one container");
    rows.push(concurrent_add_del(&mut rng, iterations / 4));
    eprintln!("soak: {pods}-way concurrent pods");
    rows.push(concurrent_pods(pods, 3));
    let daemon = daemon_rows(daemon_pods, Duration::from_secs(outage));
    let (outage, node_churn) = (Duration::from_secs(outage), Duration::from_secs(node_churn));
    let node = node::rows(&runtimes, outage, node_churn);
    print_report(&rows, &latency, started.elapsed(), iterations);
    print_daemon_rows(&daemon);
    if !node.is_empty() {
        node::print(&node, outage, node_churn);
    }
    print_writes();
}

/// The runtimes `--node-runtimes` names; exits 2 naming one it does not know.
fn node_runtimes_of(list: &str) -> Vec<RuntimeKind> {
    if list == "none" {
        return Vec::new();
    }
    list.split(',')
        .map(|name| match name.trim() {
            "containerd" => RuntimeKind::Containerd,
            "cri-o" | "crio" => RuntimeKind::CriO,
            other => {
                eprintln!("plexus-soak: --node-runtimes: unknown runtime {other:?} (containerd, cri-o, none)");
                std::process::exit(2);
            }
        })
        .collect()
}

/// One row of the report.
struct Row {
    fault: String,
    setup: &'static str,
    iterations: usize,
    outcome: String,
    leaks: Leaks,
}

/// What was left after the row's final DELs.
#[derive(Default)]
struct Leaks {
    interfaces: usize,
    ips: usize,
    cache: usize,
    locks: usize,
    processes: usize,
    notes: Vec<String>,
}

impl Leaks {
    fn add(&mut self, other: Leaks) {
        self.interfaces += other.interfaces;
        self.ips += other.ips;
        self.cache += other.cache;
        self.locks += other.locks;
        self.processes += other.processes;
        self.notes.extend(other.notes);
    }

    fn total(&self) -> usize {
        self.interfaces + self.ips + self.cache + self.locks + self.processes
    }
}

/// A tiny xorshift generator: random kill points without a dependency, seeded from the clock.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Rng(seed | 1)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// A real two-network world: the cluster network (bridge + host-local) from confDir and one NAD on a second
/// bridge, FileCluster with pods `pod-<i>` selecting the NAD.
struct RealWorld {
    sb: Sandbox,
    ipam: IpamDir,
    bridges: [HostBridge; 2],
}

impl RealWorld {
    fn new(pods: usize) -> RealWorld {
        let sb = Sandbox::new();
        let ipam = IpamDir::new();
        let bridges = [HostBridge::reserve("sbc"), HostBridge::reserve("sbs")];
        // A /24 has room for the 64-way row's pods; the ranges are only bookkeeping inside namespaces.
        let net = |name: &str, bridge: &HostBridge| bridge_host_local(name, bridge, &ipam);
        sb.conf_file("00-cluster.conflist", &net("cluster-net", &bridges[0]));
        sb.nad(POD_NS, "side", Some(net("side", &bridges[1])));
        for i in 0..pods {
            sb.pod(POD_NS, &format!("pod-{i}"), Some("side"));
        }
        RealWorld { sb, ipam, bridges }
    }

    fn conf(&self) -> Value {
        self.sb.conf(json!({"logLevel": "warn"}))
    }

    fn env(&self, command: &str, id: &str, pod: usize, netns: &Path) -> Vec<(String, String)> {
        env_for(
            command,
            id,
            netns,
            cni_bin_dir(),
            &Sandbox::pod_args(POD_NS, &format!("pod-{pod}")),
        )
    }

    /// Runs plexus to completion.
    fn run(&self, command: &str, id: &str, pod: usize, netns: &Path) -> bool {
        self.sb
            .run_env(
                &self.env(command, id, pod, netns),
                self.conf().to_string().as_bytes(),
            )
            .success
    }

    /// Starts plexus and returns the child (stdin written and closed).
    fn spawn(&self, command: &str, id: &str, pod: usize, netns: &Path) -> Child {
        spawn_plexus(&self.env(command, id, pod, netns), &self.conf())
    }

    /// Everything left once every pod was deleted: interfaces on the bridges, reservations, cache, locks,
    /// processes of this run.
    fn leaks(&self) -> Leaks {
        let mut leaks = sandbox_leaks(&self.sb);
        for b in &self.bridges {
            leaks.interfaces += host_links_on_bridge(b.name()).len();
        }
        for n in ["cluster-net", "side"] {
            let held = self.ipam.reservations(n);
            if !held.is_empty() {
                leaks.notes.push(format!("{n} holds {held:?}"));
            }
            leaks.ips += held.len();
        }
        leaks
    }
}

fn env_for(command: &str, id: &str, netns: &Path, path: &str, args: &str) -> Vec<(String, String)> {
    [
        ("CNI_COMMAND", command.to_string()),
        ("CNI_CONTAINERID", id.to_string()),
        ("CNI_NETNS", netns.display().to_string()),
        ("CNI_IFNAME", "eth0".to_string()),
        ("CNI_PATH", path.to_string()),
        ("CNI_ARGS", args.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn spawn_plexus(env: &[(String, String)], conf: &Value) -> Child {
    plexus::spawn_plexus(
        env,
        conf.to_string().as_bytes(),
        Stdio::null(),
        Stdio::null(),
    )
}

/// Cache files, lock files and processes of this run left in a sandbox.
fn sandbox_leaks(sb: &Sandbox) -> Leaks {
    let count = |dir: PathBuf| {
        std::fs::read_dir(dir)
            .map(|d| d.filter_map(Result::ok).count())
            .unwrap_or(0)
    };
    let mut leaks = Leaks {
        cache: count(sb.path("cache/attachments")),
        locks: count(sb.path("run/locks")),
        processes: our_processes().len(),
        ..Leaks::default()
    };
    if leaks.processes > 0 {
        leaks
            .notes
            .push(format!("processes: {:?}", our_processes()));
    }
    leaks
}

/// Live processes whose environment carries a container id of this run (plexus and its delegates).
fn our_processes() -> Vec<String> {
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if pid == me || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let marker = format!("CNI_CONTAINERID={ID_PREFIX}");
        if environ
            .split(|b| *b == 0)
            .any(|var| var.starts_with(marker.as_bytes()))
        {
            let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            found.push(format!(
                "{pid} {}",
                String::from_utf8_lossy(&cmd).replace('\0', " ")
            ));
        }
    }
    found
}

/// Interfaces other than lo left in a pod's namespace.
fn pod_interfaces(ns: &NetNs) -> usize {
    ns.links().iter().filter(|l| l.ifname != "lo").count()
}

/// Waits for `child` at most `limit`, killing it past that; true when it exited successfully.
fn wait_bounded(child: &mut Child, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return status.success();
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// kill -9 of plexus at a random point of `verb`, then what the runtime does next: DEL until it succeeds.
fn kill_during(rng: &mut Rng, verb: &str, iterations: usize) -> Row {
    let world = RealWorld::new(1);
    // How long one uncontended verb takes here (median of five), so kill points spread over its whole length.
    let probe = NetNs::new("soakprobe");
    let (mut adds, mut dels) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = Instant::now();
        assert!(world.run("ADD", "soak-probe", 0, probe.path()), "probe ADD");
        adds.push(t.elapsed());
        let t = Instant::now();
        assert!(world.run("DEL", "soak-probe", 0, probe.path()), "probe DEL");
        dels.push(t.elapsed());
    }
    drop(probe);
    adds.sort();
    dels.sort();
    let (add_time, del_time) = (adds[2], dels[2]);
    let span = if verb == "ADD" { add_time } else { del_time };
    let span_us = (span.as_micros() as u64 * 5 / 4).max(1000);

    let (mut killed, mut finished, mut del_retries, mut stuck) = (0, 0, 0, 0);
    let mut leaks = Leaks::default();
    for i in 0..iterations {
        let ns = NetNs::new("soakkill");
        let id = format!("{ID_PREFIX}kill-{}-{i}", verb.to_lowercase());
        if verb == "DEL" {
            assert!(
                world.run("ADD", &id, 0, ns.path()),
                "ADD before the killed DEL"
            );
        }
        let mut child = world.spawn(verb, &id, 0, ns.path());
        std::thread::sleep(Duration::from_micros(rng.below(span_us)));
        match child.try_wait() {
            Ok(Some(_)) => finished += 1,
            _ => {
                let _ = child.kill();
                killed += 1;
            }
        }
        let _ = child.wait();
        // The runtime's DEL after a failed (killed) ADD or DEL, retried as a runtime retries.
        let mut ok = false;
        for attempt in 0..3 {
            if world.run("DEL", &id, 0, ns.path()) {
                ok = true;
                break;
            }
            del_retries += 1;
            std::thread::sleep(Duration::from_millis(50 * (attempt + 1)));
        }
        if !ok {
            stuck += 1;
        }
        let left = pod_interfaces(&ns);
        if left > 0 {
            leaks
                .notes
                .push(format!("{id}: {left} interfaces left in the pod"));
        }
        leaks.interfaces += left;
    }
    leaks.add(world.leaks());
    Row {
        fault: format!("kill -9 of plexus at a random point of {verb} (0 to {} ms), then DEL", span_us / 1000),
        setup: "bridge + host-local, 2 networks, real namespaces",
        iterations,
        outcome: format!(
            "{killed} killed, {finished} finished first; DEL succeeded for {}/{iterations} ({del_retries} retries)",
            iterations - stuck
        ),
        leaks,
    }
}

/// A script delegate as the cluster network's only plugin (DEL succeeds).
fn script_world(add: &str) -> Sandbox {
    let sb = Sandbox::new();
    sb.script_cluster(add, "exit 0");
    sb
}

fn script_env(sb: &Sandbox, command: &str, id: &str) -> Vec<(String, String)> {
    env_for(
        command,
        id,
        Path::new("/run/netns/none"),
        &sb.path("bin").display().to_string(),
        "",
    )
}

/// A delegate that closes stdout and keeps running, under a 200 ms delegateTimeoutMs.
fn hung_delegate(iterations: usize) -> Row {
    let sb = script_world("exec 1>&-; exec sleep 86400");
    let conf = sb.conf(json!({"delegateTimeoutMs": 200, "logLevel": "error"}));
    let mut failed_101 = 0;
    let mut worst = Duration::ZERO;
    for i in 0..iterations {
        let id = format!("{ID_PREFIX}hung-{i}");
        let t = Instant::now();
        let run = sb.run_env(&script_env(&sb, "ADD", &id), conf.to_string().as_bytes());
        worst = worst.max(t.elapsed());
        if !run.success && run.json()["code"] == 101 {
            failed_101 += 1;
        }
        sb.run_env(&script_env(&sb, "DEL", &id), conf.to_string().as_bytes());
    }
    Row {
        fault: "delegate closes stdout and keeps running (delegateTimeoutMs 200)".into(),
        setup: "script delegate",
        iterations,
        outcome: format!(
            "ADD failed with code 101 {failed_101}/{iterations}; slowest ADD {} ms",
            worst.as_millis()
        ),
        leaks: sandbox_leaks(&sb),
    }
}

/// A delegate that floods stdout (`yes`) and one that floods stderr.
fn flooding_delegate(iterations: usize) -> Row {
    let sb = script_world("if [ -e \"$0.stderr\" ]; then exec yes >&2; else exec yes; fi");
    let conf = sb.conf(json!({"delegateTimeoutMs": 3000, "logLevel": "error"}));
    let (mut failed, mut peak_kib, mut longest) = (0, 0u64, 0usize);
    for i in 0..iterations {
        // Every other iteration floods stderr instead (until the timeout).
        let marker = sb.path("bin/cluster-script.stderr");
        if i % 2 == 1 {
            std::fs::write(&marker, "").expect("marker");
        } else {
            let _ = std::fs::remove_file(&marker);
        }
        let id = format!("{ID_PREFIX}flood-{i}");
        let (ok, out_len, rss) = run_measured(&script_env(&sb, "ADD", &id), &conf);
        failed += usize::from(!ok);
        peak_kib = peak_kib.max(rss);
        longest = longest.max(out_len);
        sb.run_env(&script_env(&sb, "DEL", &id), conf.to_string().as_bytes());
    }
    Row {
        fault: "delegate floods stdout (`yes`) or stderr (`yes >&2`)".into(),
        setup: "script delegate",
        iterations,
        outcome: format!(
            "ADD failed {failed}/{iterations}; plexus peak RSS {:.1} MiB; longest error object {longest} bytes",
            peak_kib as f64 / 1024.0
        ),
        leaks: sandbox_leaks(&sb),
    }
}

/// Runs plexus to completion; (success, stdout length, peak RSS in KiB of plexus itself). Reaped with wait4
/// (for its rusage), which clippy cannot see.
#[allow(clippy::zombie_processes)]
fn run_measured(env: &[(String, String)], conf: &Value) -> (bool, usize, u64) {
    let mut child = plexus::spawn_plexus(
        env,
        conf.to_string().as_bytes(),
        Stdio::piped(),
        Stdio::null(),
    );
    let mut out = Vec::new();
    let _ = std::io::Read::read_to_end(&mut child.stdout.take().expect("stdout"), &mut out);
    let mut status = 0;
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    #[allow(unsafe_code)]
    // SAFETY: wait4 on our own child's pid, writing into a struct we own.
    let (pid, usage) = unsafe {
        let pid = libc::wait4(child.id() as i32, &mut status, 0, usage.as_mut_ptr());
        (pid, usage.assume_init())
    };
    assert!(pid > 0, "wait4 failed");
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    (ok, out.len(), usage.ru_maxrss as u64)
}

#[derive(Clone, Copy)]
enum Api {
    Refused,
    Hung,
    Slow,
}

impl Api {
    fn label(self) -> &'static str {
        match self {
            Api::Refused => "refused",
            Api::Hung => "hung",
            Api::Slow => "slow (2 s per request)",
        }
    }
}

/// DEL latency per pod with the API failing, after ADDs made while it answered: the first DEL (from the
/// cache) and a repeated one (from runDir), fake delegates.
struct Latency {
    api: &'static str,
    first_del_ms: Vec<f64>,
    repeated_del_ms: Vec<f64>,
}

fn api_fault(api: Api, pods: usize) -> (Row, Latency) {
    let server = ApiServer::start();
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    sb.fakes(&["side-plugin"]);
    let kubeconfig = sb.path("kubeconfig");
    server.write_kubeconfig(&kubeconfig);
    server.add_nad(json!({
        "metadata": {"name": "side", "namespace": POD_NS},
        "spec": {"config": "{\"cniVersion\":\"1.0.0\",\"type\":\"side-plugin\"}"}
    }));
    for i in 0..pods {
        server.add_pod(json!({"metadata": {
            "name": format!("pod-{i}"), "namespace": POD_NS, "uid": format!("uid-pod-{i}"),
            "annotations": {"k8s.v1.cni.cncf.io/networks": "side"}
        }}));
    }
    let conf = sb.conf(
        json!({"logLevel": "error", "cluster": {"source": "kube", "kubeconfig": kubeconfig}}),
    );
    let env = |command: &str, i: usize| {
        env_for(
            command,
            &format!("{ID_PREFIX}api-{i}"),
            Path::new("/run/netns/none"),
            &sb.path("bin").display().to_string(),
            &Sandbox::pod_args(POD_NS, &format!("pod-{i}")),
        )
    };
    let mut added = 0;
    for i in 0..pods {
        added += usize::from(
            sb.run_env(&env("ADD", i), conf.to_string().as_bytes())
                .success,
        );
    }
    let server = match api {
        Api::Refused => {
            drop(server);
            None
        }
        Api::Hung | Api::Slow => {
            let fault = match api {
                Api::Hung => Fault::Hang,
                _ => Fault::Latency(Duration::from_secs(2)),
            };
            server.inject("*", "*", fault, usize::MAX);
            server.clear_requests();
            Some(server)
        }
    };
    let mut lat = Latency {
        api: api.label(),
        first_del_ms: Vec::new(),
        repeated_del_ms: Vec::new(),
    };
    let mut ok = 0;
    for i in 0..pods {
        for (n, sink) in [(0, &mut lat.first_del_ms), (1, &mut lat.repeated_del_ms)] {
            let t = Instant::now();
            let run = sb.run_env(&env("DEL", i), conf.to_string().as_bytes());
            sink.push(t.elapsed().as_secs_f64() * 1e3);
            ok += usize::from(run.success && n == 1);
        }
    }
    let requests = server.as_ref().map_or(0, |s| s.requests().len());
    let row = Row {
        fault: format!("API {} during teardown", api.label()),
        setup: "kube source (API emulator), fake delegates",
        iterations: pods,
        outcome: format!(
            "{added}/{pods} ADDs with the API up; DEL then repeated DEL succeeded {ok}/{pods}; API requests during teardown: {}",
            if server.is_some() { requests.to_string() } else { "none possible".into() }
        ),
        leaks: sandbox_leaks(&sb),
    };
    (row, lat)
}

/// cacheDir on a full tmpfs: ADD must fail before attaching anything, DEL must succeed.
fn disk_full(iterations: usize) -> Row {
    let world = RealWorld::new(1);
    let cache = world.sb.path("cache");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "plexus-soak-full"])
        .arg(&cache)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(mounted, "mount a small tmpfs on {}", cache.display());
    // Fill it to the last block.
    let _ = std::fs::write(cache.join("filler"), vec![0u8; 64 << 10]);
    let (mut failed, mut del_ok, mut left_ifaces) = (0, 0, 0);
    for i in 0..iterations {
        let ns = NetNs::new("soakfull");
        let id = format!("{ID_PREFIX}full-{i}");
        failed += usize::from(!world.run("ADD", &id, 0, ns.path()));
        left_ifaces += pod_interfaces(&ns);
        del_ok += usize::from(world.run("DEL", &id, 0, ns.path()));
    }
    let _ = std::fs::remove_file(cache.join("filler"));
    let mut leaks = world.leaks();
    leaks.interfaces += left_ifaces;
    let _ = Command::new("umount").arg(&cache).status();
    Row {
        fault: "disk full under cacheDir".into(),
        setup: "bridge + host-local, 2 networks, real namespaces",
        iterations,
        outcome: format!(
            "ADD failed {failed}/{iterations} with nothing attached; DEL succeeded {del_ok}/{iterations}"
        ),
        leaks,
    }
}

/// DEL of containers never added, with cacheDir read-only.
fn read_only_cache(iterations: usize) -> Row {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    let conf = sb.conf(json!({"logLevel": "error"}));
    let cache = sb.path("cache");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "ro,size=64k", "plexus-soak-ro"])
        .arg(&cache)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(mounted, "mount a read-only tmpfs on {}", cache.display());
    let mut ok = 0;
    for i in 0..iterations {
        let env = script_env(&sb, "DEL", &format!("{ID_PREFIX}ro-{i}"));
        ok += usize::from(sb.run_env(&env, conf.to_string().as_bytes()).success);
    }
    let leaks = sandbox_leaks(&sb);
    let _ = Command::new("umount").arg(&cache).status();
    Row {
        fault: "read-only cacheDir, DEL of a container never added".into(),
        setup: "fake delegates",
        iterations,
        outcome: format!("DEL succeeded {ok}/{iterations}"),
        leaks,
    }
}

/// ADD and DEL of one container started together (a runtime bug), then the runtime's final DEL.
fn concurrent_add_del(rng: &mut Rng, iterations: usize) -> Row {
    let world = RealWorld::new(1);
    let (mut final_ok, mut leaks) = (0, Leaks::default());
    for i in 0..iterations {
        let ns = NetNs::new("soakrace");
        let id = format!("{ID_PREFIX}race-{i}");
        let mut add = world.spawn("ADD", &id, 0, ns.path());
        std::thread::sleep(Duration::from_micros(rng.below(3000)));
        let mut del = world.spawn("DEL", &id, 0, ns.path());
        wait_bounded(&mut add, Duration::from_secs(60));
        wait_bounded(&mut del, Duration::from_secs(60));
        final_ok += usize::from(world.run("DEL", &id, 0, ns.path()));
        leaks.interfaces += pod_interfaces(&ns);
    }
    leaks.add(world.leaks());
    Row {
        fault: "ADD and DEL of one container at once, then DEL".into(),
        setup: "bridge + host-local, 2 networks, real namespaces",
        iterations,
        outcome: format!("final DEL succeeded {final_ok}/{iterations}"),
        leaks,
    }
}

/// `pods` pods added at once, then deleted at once, `rounds` times: every ADD succeeds, no address is given
/// twice, nothing is left.
fn concurrent_pods(pods: usize, rounds: usize) -> Row {
    let world = RealWorld::new(pods);
    let (mut added, mut deleted, mut duplicates) = (0, 0, 0);
    let mut leaks = Leaks::default();
    for round in 0..rounds {
        let namespaces: Vec<NetNs> = (0..pods).map(|_| NetNs::new("soakpods")).collect();
        let ids: Vec<String> = (0..pods)
            .map(|i| format!("{ID_PREFIX}pods-{round}-{i}"))
            .collect();
        let mut children: Vec<Child> = (0..pods)
            .map(|i| world.spawn("ADD", &ids[i], i, namespaces[i].path()))
            .collect();
        added += children
            .iter_mut()
            .map(|c| wait_bounded(c, Duration::from_secs(120)))
            .filter(|ok| *ok)
            .count();
        let mut seen = BTreeSet::new();
        for n in ["cluster-net", "side"] {
            for ip in world.ipam.reserved_ips(n) {
                if !seen.insert((n, ip)) {
                    duplicates += 1;
                }
            }
        }
        duplicates += duplicate_addresses(&namespaces);
        let mut children: Vec<Child> = (0..pods)
            .map(|i| world.spawn("DEL", &ids[i], i, namespaces[i].path()))
            .collect();
        deleted += children
            .iter_mut()
            .map(|c| wait_bounded(c, Duration::from_secs(120)))
            .filter(|ok| *ok)
            .count();
        leaks.interfaces += namespaces.iter().map(pod_interfaces).sum::<usize>();
    }
    leaks.add(world.leaks());
    if duplicates > 0 {
        leaks
            .notes
            .push(format!("{duplicates} addresses given twice"));
    }
    Row {
        fault: format!("{pods} pods added at once, then deleted at once ({rounds} rounds)"),
        setup: "bridge + host-local, 2 networks, real namespaces",
        iterations: pods * rounds,
        outcome: format!(
            "ADD succeeded {added}/{}, DEL {deleted}/{}; addresses given twice: {duplicates}",
            pods * rounds,
            pods * rounds
        ),
        leaks,
    }
}

/// Addresses that appear in more than one pod namespace.
fn duplicate_addresses(namespaces: &[NetNs]) -> usize {
    let mut seen: BTreeSet<IpAddr> = BTreeSet::new();
    let mut dups = 0;
    for ns in namespaces {
        for link in ns.links().iter().filter(|l| l.ifname != "lo") {
            for cidr in link.cidrs() {
                if let Ok(ip) = cidr.split('/').next().unwrap_or_default().parse::<IpAddr>() {
                    if !seen.insert(ip) {
                        dups += 1;
                    }
                }
            }
        }
    }
    dups
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return f64::NAN;
    }
    s[s.len() / 2]
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

fn print_report(rows: &[Row], latency: &[Latency], elapsed: Duration, iterations: usize) {
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let total: usize = rows.iter().map(|r| r.leaks.total()).sum();
    println!("# Reliability report\n");
    println!(
        "Produced by `bash tests/soak.sh` (as root) on {date}, in {:.0} s, with `--iterations {iterations}`; \
         regenerate it with the same command. Every row injects one fault, then does what a container runtime \
         does next (DEL, retried up to three times), and counts what is left afterwards: interfaces (in the pod \
         namespaces and on the test bridges), host-local IP reservations, attachment cache entries, lock files, \
         and processes (plexus or delegates still running with a container id of the run).\n",
        elapsed.as_secs_f64()
    );
    println!("**Leaks in all rows: {total}.**\n");
    println!(
        "| fault | set-up | iterations | outcome | interfaces | IPs | cache | locks | processes |"
    );
    println!("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.fault,
            r.setup,
            r.iterations,
            r.outcome,
            r.leaks.interfaces,
            r.leaks.ips,
            r.leaks.cache,
            r.leaks.locks,
            r.leaks.processes
        );
    }
    let notes: Vec<&String> = rows.iter().flat_map(|r| &r.leaks.notes).collect();
    if !notes.is_empty() {
        println!("\nWhat leaked:\n");
        for n in notes {
            println!("- {n}");
        }
    }
    println!("\n## DEL latency with the API server failing\n");
    println!(
        "Per pod (cluster network + one NAD, the project's no-op fake delegates, kube source against the API \
         emulator on loopback). The ADDs ran while the API answered; then the API failed, and each pod got its \
         first DEL (from the attachment cache) and a repeated DEL (answered from `runDir`). Targets: a \
         repeated DEL ≤ 5 ms, a first DEL from cache ≤ 20 ms, whatever the API does. Whole-process wall time \
         measured by the caller, milliseconds, median and max over the pods.\n"
    );
    println!("| API | pods | first DEL median | first DEL max | repeated DEL median | repeated DEL max |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for l in latency {
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
            l.api,
            l.first_del_ms.len(),
            median(&l.first_del_ms),
            max(&l.first_del_ms),
            median(&l.repeated_del_ms),
            max(&l.repeated_del_ms)
        );
    }
    println!(
        "\nThe figures are from one run on a shared 2-core machine: compare medians, not single values."
    );
}

/// One row of the node daemon's section: what the node promised (a network-status write, a working ADD) and how
/// much of it was lost.
struct DaemonRow {
    fault: String,
    pods: usize,
    outcome: String,
    lost: usize,
    leaks: Leaks,
}

/// A real kube-apiserver with the project's CRDs and RBAC, `pods` pods of namespace `soak` on `node1` selecting
/// NAD `side` (a fake delegate), a registry, a trusted key, and `plexus daemon` for `node1` with hooks on.
struct DaemonWorld {
    api: KubeApiServer,
    sb: Sandbox,
    registry: Registry,
    key: (PathBuf, PathBuf),
    uids: Vec<String>,
    daemon: Option<Child>,
}

const NODE: &str = "node1";

impl DaemonWorld {
    fn new(pods: usize) -> DaemonWorld {
        let api = KubeApiServer::start(&[], &[]);
        for f in ["crds.yaml", "networkhooks.yaml", "rbac.yaml"] {
            api.apply_file(&deploy_manifest(f));
        }
        api.wait_for("/apis/plexus.dev/v1alpha1/networkhooks");
        api.create(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
        api.namespace(POD_NS);
        api.nad(
            POD_NS,
            "side",
            &json!({"cniVersion": "1.0.0", "name": "side", "type": "side-plugin"}),
        );
        let uids = (0..pods)
            .map(|i| {
                let p = api.pod(
                    POD_NS,
                    &format!("pod-{i}"),
                    NODE,
                    json!({"k8s.v1.cni.cncf.io/networks": "side"}),
                );
                p["metadata"]["uid"].as_str().unwrap().to_string()
            })
            .collect();
        let sb = Sandbox::new();
        sb.cluster_net("1.0.0");
        sb.fakes(&["side-plugin"]);
        api.write_kubeconfig(&sb.path("kubeconfig"), "plexus-token");
        let keys = sb.path("keys");
        std::fs::create_dir_all(&keys).unwrap();
        DaemonWorld {
            api,
            registry: Registry::start(),
            key: key_pair(&keys, "vendor"),
            sb,
            uids,
            daemon: None,
        }
    }

    fn start_daemon(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.sb.path("daemon.log"))
            .unwrap();
        let child = Command::new(plexus::plexus_bin())
            .args(["daemon", "--node-name", NODE, "--log-level", "info"])
            .arg("--kubeconfig")
            .arg(self.sb.path("kubeconfig"))
            .arg("--socket")
            .arg(self.sb.path("run/daemon.sock"))
            .arg("--cache-dir")
            .arg(self.sb.path("cache"))
            .arg("--hook-key")
            .arg(&self.key.1)
            .args(["--insecure-registry", &self.registry.addr])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.daemon = Some(child);
        self.wait_health("synced", plexus_tests::plexus::settled);
    }

    fn kill_daemon(&mut self) {
        if let Some(mut c) = self.daemon.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn health(&self) -> Option<DaemonHealth> {
        match ask(
            &self.sb.path("run/daemon.sock"),
            &Request::Health,
            Duration::from_secs(2),
        ) {
            Ok(Answer::Health(h)) => Some(h),
            _ => None,
        }
    }

    /// Waits (at most 120 s) for the daemon's health to satisfy `ok`.
    fn wait_health(&self, what: &str, ok: impl Fn(&DaemonHealth) -> bool) -> bool {
        let end = Instant::now() + Duration::from_secs(120);
        while Instant::now() < end {
            if self.health().is_some_and(|h| ok(&h)) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("soak: daemon: {what} not reached within 120 s");
        false
    }

    fn conf(&self) -> Value {
        self.sb.conf(json!({"logLevel": "error",
            "cluster": {"source": "kube", "kubeconfig": self.sb.path("kubeconfig")},
            "daemon": {"timeoutMs": 5000}}))
    }

    fn run(&self, command: &str, i: usize) -> bool {
        self.run_answer(command, i).is_ok()
    }

    /// The invocation's error object's message when it failed.
    fn run_answer(&self, command: &str, i: usize) -> Result<(), String> {
        let env = env_for(
            command,
            &format!("{ID_PREFIX}daemon-{i}"),
            Path::new("/run/netns/none"),
            &self.sb.path("bin").display().to_string(),
            &format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE={POD_NS};K8S_POD_NAME=pod-{i};K8S_POD_UID={}",
                self.uids[i]
            ),
        );
        let run = self.sb.run_env(&env, self.conf().to_string().as_bytes());
        if run.success {
            Ok(())
        } else {
            Err(run.stdout.clone())
        }
    }

    /// Pods among `range` whose network-status lists the NAD.
    fn with_status(&self, range: std::ops::Range<usize>) -> usize {
        range
            .filter(|i| {
                let p = self.api.must(
                    "GET",
                    &format!("/api/v1/namespaces/{POD_NS}/pods/pod-{i}"),
                    None,
                );
                p["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"]
                    .as_str()
                    .is_some_and(|s| s.contains(&format!("{POD_NS}/side")))
            })
            .count()
    }

    /// Waits (at most 120 s) until every pod of `range` has its network-status; how many lack it then.
    fn lost(&self, range: std::ops::Range<usize>) -> usize {
        let end = Instant::now() + Duration::from_secs(120);
        loop {
            let have = self.with_status(range.clone());
            if have == range.len() || Instant::now() >= end {
                return range.len() - have;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// DEL of every pod of `range`, then what is left: cache entries, locks, processes, queued writes.
    fn teardown(&self, range: std::ops::Range<usize>) -> Leaks {
        for i in range {
            if !self.run("DEL", i) {
                self.run("DEL", i);
            }
        }
        let mut leaks = sandbox_leaks(&self.sb);
        let queued = std::fs::read_dir(self.sb.path("run/status-queue"))
            .map(|d| d.count())
            .unwrap_or(0);
        if queued > 0 {
            leaks
                .notes
                .push(format!("{queued} status writes still queued"));
            leaks.cache += queued;
        }
        leaks
    }
}

impl Drop for DaemonWorld {
    fn drop(&mut self) {
        self.kill_daemon();
    }
}

/// The node daemon's promises under the faults of issue "node trust": an API outage of `outage` while `pods`
/// pods are added, a kill -9 with writes pending, a NetworkHook whose module cannot serve its kind applied while
/// pods are added.
fn daemon_rows(pods: usize, outage: Duration) -> Vec<DaemonRow> {
    let (killed, hooked) = (pods / 2, pods / 2);
    let mut w = DaemonWorld::new(pods + killed + hooked);
    w.start_daemon();
    vec![
        w.outage_row(pods, outage),
        w.killed_row(pods..pods + killed),
        w.hook_row(pods + killed..pods + killed + hooked),
    ]
}

impl DaemonWorld {
    /// The API server hung for `outage` while pods `0..pods` are added: the statuses written after it.
    fn outage_row(&self, pods: usize, outage: Duration) -> DaemonRow {
        eprintln!("soak: daemon: API outage of {outage:?} while {pods} pods are added");
        self.api.pause();
        let paused = Instant::now();
        let added = (0..pods).filter(|i| self.run("ADD", *i)).count();
        std::thread::sleep(outage.saturating_sub(paused.elapsed()));
        self.api.resume();
        let lost = self.lost(0..pods);
        DaemonRow {
            fault: format!(
                "API server hung (SIGSTOP) for {} s while pods are added",
                outage.as_secs()
            ),
            pods,
            outcome: format!(
                "ADD succeeded {added}/{pods} during the outage; network-status present on {}/{pods} after it",
                pods - lost
            ),
            lost,
            leaks: self.teardown(0..pods),
        }
    }

    /// The daemon killed (-9) with the status writes of the pods of `range` pending, the API server hung; the statuses
    /// the new daemon writes.
    fn killed_row(&mut self, range: std::ops::Range<usize>) -> DaemonRow {
        let killed = range.len();
        eprintln!("soak: daemon: kill -9 with {killed} status writes pending");
        self.api.pause();
        let added = range.clone().filter(|i| self.run("ADD", *i)).count();
        let pending = self.health().map(|h| h.pending_writes).unwrap_or_default();
        self.kill_daemon();
        self.api.resume();
        self.start_daemon();
        let lost = self.lost(range.clone());
        DaemonRow {
            fault: "kill -9 of the daemon with status writes pending (API server hung), then a new daemon"
                .into(),
            pods: killed,
            outcome: format!(
                "ADD succeeded {added}/{killed}; {pending} writes pending at the kill; network-status present on {}/{killed} after the restart",
                killed - lost
            ),
            lost,
            leaks: self.teardown(range),
        }
    }

    /// A NetworkHook whose module cannot serve its kind (failurePolicy Fail) applied while the pods of `range` are
    /// added: the ADDs refused naming it, and those that failed otherwise (lost).
    fn hook_row(&self, range: std::ops::Range<usize>) -> DaemonRow {
        let hooked = range.len();
        eprintln!("soak: daemon: a NetworkHook that cannot serve its kind, applied while {hooked} pods are added");
        let reference = self.registry.push_hook(
            &plexus::guest_wasm("test-policy-only"),
            "vendor/policy-only:v1",
            Some(&self.key.0),
        );
        self.api.create(
            &json!({"apiVersion": "plexus.dev/v1alpha1", "kind": "NetworkHook",
            "metadata": {"name": "wrong-kind"},
            "spec": {"kind": "status", "module": reference, "failurePolicy": "Fail"}}),
        );
        // failurePolicy Fail fails closed (#45): once the node knows the hook cannot serve, its ADDs are refused,
        // naming the hook; an ADD that failed otherwise is lost.
        let answers: Vec<Result<(), String>> =
            range.clone().map(|i| self.run_answer("ADD", i)).collect();
        let refused = answers
            .iter()
            .filter(|a| a.as_ref().is_err_and(|e| e.contains("wrong-kind")))
            .count();
        let failed_otherwise = answers.iter().filter(|a| a.is_err()).count() - refused;
        let reason = self.hook_reason();
        DaemonRow {
            fault: "a NetworkHook whose module exports another kind (failurePolicy Fail), applied while pods are added"
                .into(),
            pods: hooked,
            outcome: format!(
                "{} ADDs before the node knew it succeeded; then {refused} refused naming the hook (failurePolicy Fail \
                 fails closed), {failed_otherwise} failed otherwise; the node reported the hook {reason}",
                hooked - refused - failed_otherwise
            ),
            lost: failed_otherwise,
            leaks: self.teardown(range),
        }
    }

    /// The reason the node reports for hook `wrong-kind` in its NodeHookStatus, waited for (at most 60 s); "not
    /// reported" when it does not.
    fn hook_reason(&self) -> String {
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let (code, text) = self
                .api
                .request(
                    "GET",
                    &format!("/apis/plexus.dev/v1alpha1/nodehookstatuses/{NODE}"),
                    None,
                )
                .unwrap();
            let report: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            let found = report["status"]["hooks"]
                .as_array()
                .and_then(|hooks| hooks.iter().find(|h| h["name"] == "wrong-kind"))
                .and_then(|h| h["reason"].as_str())
                .map(str::to_string);
            if let (200, Some(r)) = (code, found) {
                return r;
            }
            if Instant::now() >= end {
                return "not reported".into();
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn print_daemon_rows(rows: &[DaemonRow]) {
    let lost: usize = rows.iter().map(|r| r.lost).sum();
    let leaks: usize = rows.iter().map(|r| r.leaks.total()).sum();
    println!("\n## The node daemon\n");
    println!(
        "A real kube-apiserver (with the project's CRDs and RBAC) and a real OCI registry on loopback, `plexus \
         daemon` for the node, kube source with the daemon, the project's no-op fake delegates. What the node \
         promised and lost: a network-status write the daemon accepted that never reached the API server, or an \
         ADD that failed because of the fault. Then every pod is deleted and what is left counted as above (a \
         status write still queued counts as cache).\n"
    );
    println!("**Lost in all rows: {lost}; leaks: {leaks}.**\n");
    println!("| fault | pods | outcome | lost | cache | locks | processes |");
    println!("| --- | ---: | --- | ---: | ---: | ---: | ---: |");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.fault, r.pods, r.outcome, r.lost, r.leaks.cache, r.leaks.locks, r.leaks.processes
        );
    }
    let notes: Vec<&String> = rows.iter().flat_map(|r| &r.leaks.notes).collect();
    for n in notes {
        println!("- {n}");
    }
}

/// What an ADD and a DEL write to disk, and which of those writes are synced and why. Not measured by this
/// command: the list of the code's writes (crates/modules named), kept here so that the report that counts
/// leaks also says what a crash or a power loss can leave.
fn print_writes() {
    println!("\n## What is written, and what is synced\n");
    println!(
        "Every file an ADD or a DEL writes on a node, with what a crash (plexus killed, the node daemon \
         killed) and a power loss leave of it. The rule: a write is synced only where a lost write would break a \
         promise that outlives the process that made it; everything else survives a crash in the page cache, \
         and a power loss also ends every pod network namespace, so the node's own restart repairs it. The rows \
         above are what tests that rule by killing processes.\n"
    );
    println!("| file | written by | when | synced | why |");
    println!("| --- | --- | --- | --- | --- |");
    for (file, by, when, synced, why) in [
        (
            "`runDir/locks/<id>`",
            "ADD, DEL, CHECK (plexus-cni `lock`)",
            "created and flocked at the start, unlinked before the lock is let go",
            "no",
            "a flock lives only as long as its holder; the kernel drops it when the process dies, and `runDir` is a tmpfs",
        ),
        (
            "`cacheDir/attachments/<id>.json` (the plan)",
            "ADD (`cache::store`)",
            "once, before the first delegate runs: a temp file renamed over the name (one write, one rename)",
            "no",
            "what it must survive is plexus killed or crashing, which the page cache does. After a power loss within \
             the kernel's writeback delay an empty or missing plan counts as no plan, and DEL re-plans from the \
             cluster. Syncing file and directory cost 0.3–1.3 ms of every ADD (docs/benchmarks.md); libcni's and \
             Multus's caches are not synced either",
        ),
        (
            "`cacheDir/attachments/<id>.results` (the results journal)",
            "ADD (`cache::Journal::record`)",
            "one appended line per attachment that succeeded (one `write` each)",
            "no",
            "as the plan; a line torn by a kill is ignored on load, so DEL passes each delegate the results recorded \
             whole, and a delegate whose result was not recorded gets DEL without a prevResult, as the CNI spec allows",
        ),
        (
            "`runDir/deleted/<id>`",
            "DEL (`deleted::record`); ADD removes it",
            "an empty file after a completed DEL; pruned by age and count",
            "no",
            "a shortcut for repeated DELs only: without it a DEL re-plans, which is correct, only slower",
        ),
        (
            "`runDir/status-queue/<pod>` (the daemon's kept status writes)",
            "the node daemon, for an ADD's status hand-off",
            "before the daemon answers `done` to the CNI process: temp file, sync, rename, sync of the directory",
            "yes",
            "the one promise that outlives the CNI process: once the daemon answered, nobody else will write that \
             status, so it must survive the daemon's kill -9 (row above: status writes pending at a kill). On the \
             tmpfs `/run` the sync costs nothing measurable; a reboot ends the pods it is about",
        ),
        (
            "device-info files (`deviceInfoDir`, `/var/run/k8s.cni.cncf.io/devinfo/cni`)",
            "ADD, for a delegate offered one whose device came from a device plugin; then the delegate; DEL removes it",
            "before the delegate runs: a copy of the device plugin's file (Device Information Specification 4.2.1)",
            "no",
            "read back by the same ADD for the network-status; under `/var/run`, a tmpfs that ends with the pods",
        ),
        (
            "`cacheDir/hooks/` (compiled hooks)",
            "the node agent; an ADD only when it must compile a hook itself",
            "a temp file without a name, synced, renamed, the directory synced",
            "yes",
            "a compiled module is loaded as machine code without re-validation: it must be whole or absent (a \
             trailer also catches truncation); written once per hook and engine, never on the daemon-mode ADD path",
        ),
    ] {
        println!("| {file} | {by} | {when} | {synced} | {why} |");
    }
}
