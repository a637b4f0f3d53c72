//! Pods created and deleted continuously on a [`DsNode`] while something happens to the node, and what the kubelet
//! saw of them: the churn of the upgrade and restart tests and of the reliability report.
//!
//! One thread does all of it, one step per tick: it creates a pod (the cluster network and the NADs `networks`
//! selects, or `claim_networks` with a device claim for every other pod), lists the namespace's pods to see which are
//! Running and what their network-status says, and deletes the oldest Running pods beyond `live`. Every
//! `forbidden_every`-th pod selects a network the node's policy hook denies as well: it must never run; once the
//! kubelet shows its denial (an event) it is deleted. While the API server is down nothing can be created, listed or
//! deleted: those steps are counted and skipped, as a controller's would be. Once told to stop, it waits (bounded)
//! for every pod still there to be Running, deletes them all, waits (bounded) for them to be gone, and counts what is
//! left on the node ([`ChurnReport`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::daemonset::{DsNode, CLAIM_TEMPLATE, DENIAL, FORBIDDEN_NAD, NS};
use crate::kubelet::{pod_on_node, with_claim};
use crate::plexus::{list_cache, read_cached_plan};

/// What the churn does.
#[derive(Clone, Debug)]
pub struct ChurnSpec {
    /// The pods' names start with this (one churn per name prefix and node).
    pub prefix: String,
    /// One pod created per tick.
    pub tick: Duration,
    /// At most this many pods are created in all.
    pub max_pods: usize,
    /// Running pods beyond this many (the oldest first) are deleted.
    pub live: usize,
    /// The selection annotation of every pod.
    pub networks: String,
    /// Entries a Running pod's network-status must have (the cluster network's and one per network selected).
    pub status_entries: usize,
    /// Every this many pods (0: none), a pod selects `forbidden_networks` instead, which the node's policy hook
    /// denies.
    pub forbidden_every: usize,
    pub forbidden_networks: String,
    /// Every other pod (the even ones) has a device claim made from this ResourceClaimTemplate, selects
    /// `claim_networks` instead, and is placed by the scheduler (the node then needs its devices,
    /// [`DsNode::start_with`]); its second network (`net-b`, interface `net2`) takes the device. The others, and all
    /// when None, have no claim and are bound to the node. (A kubelet prepares a pod's claims by reading them from
    /// the API server: while it is down, only pods without claims can start.)
    pub claim_template: Option<String>,
    pub claim_networks: String,
    /// The longest wait, after the stop, for the pods still there to be Running, and then for them to be gone.
    pub settle: Duration,
}

impl ChurnSpec {
    /// Four pods a second, each with the cluster network and two NADs, eight alive at a time.
    pub fn new(prefix: &str) -> ChurnSpec {
        ChurnSpec {
            prefix: prefix.to_string(),
            tick: Duration::from_millis(250),
            max_pods: 10_000,
            live: 8,
            networks: "net-a,net-c".to_string(),
            status_entries: 3,
            forbidden_every: 8,
            forbidden_networks: format!("net-a,{FORBIDDEN_NAD}"),
            claim_template: Some(CLAIM_TEMPLATE.to_string()),
            claim_networks: "net-a,net-b".to_string(),
            settle: Duration::from_secs(150),
        }
    }
}

/// One pod of the churn, as the churn saw it.
#[derive(Clone, Debug, Default)]
pub struct PodRecord {
    pub name: String,
    created: Option<Instant>,
    /// When a list first showed it Running.
    running: Option<Instant>,
    /// The network-status entries when a list first showed it Running with a network-status, or at the last list.
    status_entries: usize,
    deleted: bool,
    /// It selects a network the policy hook denies.
    forbidden: bool,
    /// A FailedCreatePodSandBox event of the pod carries the policy hook's denial.
    denied: bool,
    /// It has a device claim.
    claim: bool,
    /// The NADs it selects.
    networks: Vec<String>,
}

impl PodRecord {
    /// From creation to the first list that showed it Running (the churn lists once a tick).
    pub fn startup(&self) -> Option<Duration> {
        Some(self.running?.duration_since(self.created?))
    }
}

/// What a churn did and what it left.
#[derive(Debug, Default)]
pub struct ChurnReport {
    pub pods: Vec<PodRecord>,
    /// Creates the API server did not take (it was down): no pod.
    pub creates_refused: usize,
    /// Lists and deletes the API server did not answer (then done again on a later tick).
    pub calls_refused: usize,
    /// `(pod, message)` of each FailedCreatePodSandBox event: an ADD that failed as the kubelet saw it.
    pub add_failures: Vec<(String, String)>,
    /// `(pod, message)` of each FailedKillPod event: a DEL (StopPodSandbox) that failed as the kubelet saw it.
    pub del_failures: Vec<(String, String)>,
    /// Running pods without an AddedInterface event (an event Plexus posts for each attachment).
    pub no_added_event: Vec<String>,
    /// Pods that were never Running.
    pub stuck: Vec<String>,
    /// Running pods whose network-status did not have the entries it should.
    pub status_wrong: Vec<(String, usize)>,
    /// Pods still there after the settle time of the deletion.
    pub not_deleted: Vec<String>,
    /// Running pods kept to the end whose claim's status has no network data for the interface that took its
    /// device (`net2`): the device did not reach the network, or the node did not say so.
    pub device_wrong: Vec<String>,
    /// The pods' ResourceClaims still there once the pods are gone.
    pub leaked_claims: usize,
    /// Pods selecting a network the policy hook denies that ran anyway: a policy decision skipped.
    pub policy_skipped: Vec<String>,
    /// Such pods whose denial the kubelet never showed (within the settle time).
    pub policy_undecided: Vec<String>,
    /// Per network, the addresses reserved beyond one per pod once the pods kept were Running and the pods deleted
    /// were gone (negative: fewer).
    pub extra_addresses: BTreeMap<String, i64>,
    /// Host-local reservations left, per network.
    pub leaked_ips: BTreeMap<String, usize>,
    /// Attachment cache entries left.
    pub leaked_cache: usize,
    /// Each sandbox whose plan was left: its container id, pod, and what the runtime's log says of it (its
    /// last lines naming the id), so that a leak names where to look.
    pub left_sandboxes: Vec<String>,
    /// Host ends of veths still on the node's bridges.
    pub leaked_links: usize,
}

impl ChurnReport {
    pub fn created(&self) -> usize {
        self.pods.len()
    }

    /// Pods the policy hook denied, as their events show.
    pub fn policy_denied(&self) -> usize {
        self.pods.iter().filter(|p| p.denied).count()
    }

    /// Pods with a failed ADD that were Running in the end (the kubelet's retry succeeded).
    pub fn retried_to_running(&self) -> usize {
        self.pods
            .iter()
            .filter(|p| p.running.is_some() && self.add_failures.iter().any(|(n, _)| *n == p.name))
            .count()
    }

    pub fn longest_startup(&self) -> Option<Duration> {
        self.pods.iter().filter_map(PodRecord::startup).max()
    }

    pub fn median_startup(&self) -> Option<Duration> {
        let mut all: Vec<Duration> = self.pods.iter().filter_map(PodRecord::startup).collect();
        all.sort();
        all.get(all.len() / 2).copied()
    }

    /// Everything left on the node or in the cluster that should not be.
    pub fn leaks(&self) -> usize {
        self.leaked_ips.values().sum::<usize>()
            + self.leaked_claims
            + self.leaked_cache
            + self.leaked_links
            + self.not_deleted.len()
    }

    /// Asserts the promises every event keeps: no pod lost (each one Running in the end, its network-status whole and
    /// its AddedInterface events posted),
    /// every failed ADD retried to success, nothing left.
    #[track_caller]
    pub fn assert_nothing_lost(&self, node: &DsNode) {
        assert!(
            self.no_added_event.is_empty(),
            "{}\n{}",
            self.summary(),
            node.logs_of_daemons()
        );
        self.assert_nothing_lost_but_events(node);
    }

    /// [`ChurnReport::assert_nothing_lost`] but for AddedInterface events, which live in the daemon's memory until
    /// posted: a power loss (a reboot) loses those of the last ADDs, by design.
    #[track_caller]
    pub fn assert_nothing_lost_but_events(&self, node: &DsNode) {
        let ok = self.stuck.is_empty()
            && self.policy_skipped.is_empty()
            && self.policy_undecided.is_empty()
            && self.status_wrong.is_empty()
            && self.device_wrong.is_empty()
            && self.extra_addresses.is_empty()
            && self.retried_to_running() == self.failed_pods()
            && self.leaks() == 0;
        assert!(ok, "{}\n{}", self.summary(), node.logs_of_daemons());
    }

    /// Pods with at least one failed ADD.
    pub fn failed_pods(&self) -> usize {
        let mut names: Vec<&String> = self.add_failures.iter().map(|(n, _)| n).collect();
        names.sort();
        names.dedup();
        names.len()
    }

    /// One paragraph of the figures, for failure messages and logs.
    pub fn summary(&self) -> String {
        let ms = |d: Option<Duration>| d.map_or("-".to_string(), |d| d.as_millis().to_string());
        format!(
            "churn: {} pods created; startups (ms) in creation order: {:?}\n ({} creates refused, {} calls refused), {} stuck {:?}; failed ADDs {} on {} pods, \
             {} of them Running after a retry; failed DELs {}; network-status wrong {:?}; device data missing {:?}; addresses beyond one per pod {:?}; without an AddedInterface event {:?}; startup median {} ms, \
             longest {} ms; policy: {} pods denied, run anyway {:?}, no denial seen {:?}; left: IPs {:?}, claims {}, cache {}, links {}, pods {:?}\nADD failures: {:?}\nDEL failures: {:?}{}",
            self.created(),
            self.pods
                .iter()
                .map(|p| p.startup().map_or(-1, |d| d.as_millis() as i64))
                .collect::<Vec<_>>(),
            self.creates_refused,
            self.calls_refused,
            self.stuck.len(),
            self.stuck,
            self.add_failures.len(),
            self.failed_pods(),
            self.retried_to_running(),
            self.del_failures.len(),
            self.status_wrong,
            self.device_wrong,
            self.extra_addresses,
            self.no_added_event,
            ms(self.median_startup()),
            ms(self.longest_startup()),
            self.policy_denied(),
            self.policy_skipped,
            self.policy_undecided,
            self.leaked_ips,
            self.leaked_claims,
            self.leaked_cache,
            self.leaked_links,
            self.not_deleted,
            self.add_failures.iter().take(5).collect::<Vec<_>>(),
            self.del_failures.iter().take(5).collect::<Vec<_>>(),
            self.left_sandboxes
                .iter()
                .map(|s| format!("\nleft: {s}"))
                .collect::<String>(),
        )
    }
}

/// The churn while it runs, for the event to add to it.
pub struct Churner<'a> {
    node: &'a DsNode,
    spec: &'a ChurnSpec,
    report: Mutex<ChurnReport>,
    next: AtomicUsize,
    /// Held by the churn's loop for each tick's creates and deletes; [`Churner::pause`] holds it between ticks.
    ticking: Mutex<()>,
}

impl Churner<'_> {
    /// Creates the churn's next pod (counted as refused if the API server does not take it).
    pub fn create(&self) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        if n >= self.spec.max_pods {
            return;
        }
        let name = format!("{}-{n}", self.spec.prefix);
        let every = self.spec.forbidden_every;
        let forbidden = every > 0 && n % every == every - 1;
        let claim = !forbidden && n.is_multiple_of(2) && self.spec.claim_template.is_some();
        let networks = match (forbidden, claim) {
            (true, _) => &self.spec.forbidden_networks,
            (false, true) => &self.spec.claim_networks,
            (false, false) => &self.spec.networks,
        };
        let mut pod = pod_on_node(NS, &name, networks);
        if let Some(template) = self.spec.claim_template.as_ref().filter(|_| claim) {
            with_claim(&mut pod, json!({"resourceClaimTemplateName": template}));
        }
        let created = Instant::now();
        let answer =
            self.node
                .api
                .request("POST", &format!("/api/v1/namespaces/{NS}/pods"), Some(&pod));
        let mut report = self.report.lock().unwrap();
        match answer {
            Ok((201, _)) => report.pods.push(PodRecord {
                name,
                created: Some(created),
                forbidden,
                claim,
                networks: networks.split(',').map(str::to_string).collect(),
                ..PodRecord::default()
            }),
            _ => report.creates_refused += 1,
        }
    }

    /// Stops the churn's loop before its next tick until the guard is dropped (the event's own creates go on).
    pub fn pause(&self) -> std::sync::MutexGuard<'_, ()> {
        self.ticking.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates `n` pods at once, more than the kubelet starts in a tick: some are still starting a few seconds on.
    pub fn burst(&self, n: usize) {
        for _ in 0..n {
            self.create();
        }
    }
}

/// Churns pods on `node` as `spec` says while `event` runs on this thread, then settles and counts
/// ([`ChurnReport`]). The churn goes on for `after` once the event has returned.
pub fn during<R>(
    node: &DsNode,
    spec: &ChurnSpec,
    after: Duration,
    event: impl FnOnce(&Churner) -> R,
) -> (R, ChurnReport) {
    let stop = AtomicBool::new(false);
    let churner = Churner {
        node,
        spec,
        report: Mutex::default(),
        next: AtomicUsize::new(0),
        ticking: Mutex::new(()),
    };
    let result = std::thread::scope(|scope| {
        let churn = scope.spawn(|| churn(&churner, &stop));
        let result = event(&churner);
        std::thread::sleep(after);
        stop.store(true, Ordering::Relaxed);
        churn.join().expect("the churn thread");
        result
    });
    let mut report = churner.report.into_inner().unwrap();
    settle(node, spec, &mut report);
    (result, report)
}

/// The churn's loop, until `stop`.
fn churn(churner: &Churner, stop: &AtomicBool) {
    let mut ticks = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let tick = Instant::now();
        let turn = churner.pause();
        churner.create();
        {
            let mut report = churner.report.lock().unwrap();
            observe(churner.node, &mut report);
            delete_beyond_live(churner.node, churner.spec, &mut report);
            ticks += 1;
            if ticks.is_multiple_of(4) {
                delete_denied(churner.node, &mut report);
            }
        }
        drop(turn);
        std::thread::sleep(churner.spec.tick.saturating_sub(tick.elapsed()));
    }
}

/// One list of the namespace's pods: which of the churn's are Running, and their network-status.
fn observe(node: &DsNode, report: &mut ChurnReport) -> Option<Vec<String>> {
    let list = match node
        .api
        .request("GET", &format!("/api/v1/namespaces/{NS}/pods"), None)
    {
        Ok((200, body)) => serde_json::from_str::<Value>(&body).unwrap_or_default(),
        _ => {
            report.calls_refused += 1;
            return None;
        }
    };
    let now = Instant::now();
    let items = list["items"].as_array().cloned().unwrap_or_default();
    for pod in &items {
        let Some(record) = report
            .pods
            .iter_mut()
            .find(|p| pod["metadata"]["name"] == p.name.as_str())
        else {
            continue;
        };
        if pod["status"]["phase"] == "Running" {
            record.running.get_or_insert(now);
            record.status_entries = status_entries(pod);
        }
    }
    Some(
        items
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
            .collect(),
    )
}

/// The entries of a pod's network-status annotation (0 when it has none or it is not JSON).
fn status_entries(pod: &Value) -> usize {
    pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"]
        .as_str()
        .and_then(|s| serde_json::from_str::<Vec<Value>>(s).ok())
        .map_or(0, |v| v.len())
}

/// Deletes the oldest Running pods beyond `spec.live` that have their network-status (so that each pod is seen
/// whole before it goes).
fn delete_beyond_live(node: &DsNode, spec: &ChurnSpec, report: &mut ChurnReport) {
    let alive: Vec<usize> = (0..report.pods.len())
        .filter(|&i| !report.pods[i].deleted && !report.pods[i].forbidden)
        .collect();
    let mut excess = alive.len().saturating_sub(spec.live);
    for i in alive {
        if excess == 0 {
            break;
        }
        let pod = &report.pods[i];
        if pod.running.is_none() || pod.status_entries < spec.status_entries {
            continue;
        }
        if delete(node, &pod.name) {
            report.pods[i].deleted = true;
            excess -= 1;
        } else {
            report.calls_refused += 1;
            return;
        }
    }
}

/// Marks the forbidden pods whose denial a FailedCreatePodSandBox event shows, and deletes them. Nothing when the
/// API server does not answer.
fn delete_denied(node: &DsNode, report: &mut ChurnReport) {
    if !report.pods.iter().any(|p| p.forbidden && !p.deleted) {
        return;
    }
    let path =
        format!("/api/v1/namespaces/{NS}/events?fieldSelector=reason%3DFailedCreatePodSandBox");
    let Ok((200, body)) = node.api.request("GET", &path, None) else {
        report.calls_refused += 1;
        return;
    };
    let events: Value = serde_json::from_str(&body).unwrap_or_default();
    let denied: Vec<&str> = events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["message"].as_str().is_some_and(|m| m.contains(DENIAL)))
        .filter_map(|e| e["involvedObject"]["name"].as_str())
        .collect();
    for pod in report.pods.iter_mut().filter(|p| p.forbidden) {
        pod.denied |= denied.contains(&pod.name.as_str());
        if pod.denied && !pod.deleted && delete(node, &pod.name) {
            pod.deleted = true;
        }
    }
}

fn delete(node: &DsNode, name: &str) -> bool {
    matches!(
        node.api.request(
            "DELETE",
            &format!("/api/v1/namespaces/{NS}/pods/{name}"),
            None
        ),
        Ok((200 | 404, _))
    )
}

/// After the stop: the pods still there Running (bounded), their network-status checked, all deleted and gone
/// (bounded), the kubelet's failure events collected, and what is left counted.
fn settle(node: &DsNode, spec: &ChurnSpec, report: &mut ChurnReport) {
    let deadline = Instant::now() + spec.settle;
    while Instant::now() < deadline {
        let listed = observe(node, report);
        delete_denied(node, report);
        // Every pod kept Running with its network-status, every pod deleted gone (its sandbox torn down), every
        // forbidden pod denied.
        let pending = |names: &Vec<String>| {
            report.pods.iter().any(|p| {
                if p.forbidden && !p.denied {
                    true
                } else if p.deleted {
                    names.contains(&p.name)
                } else {
                    p.running.is_none() || p.status_entries < spec.status_entries
                }
            })
        };
        if listed.as_ref().is_some_and(|names| !pending(names)) {
            // The node converges a little later than the API shows (a sandbox made again after a reboot).
            let converged = Instant::now() + Duration::from_secs(60);
            while {
                count_addresses(node, report);
                !report.extra_addresses.is_empty() && Instant::now() < converged
            } {
                std::thread::sleep(Duration::from_millis(500));
            }
            if spec.claim_template.is_some() {
                check_devices(node, report);
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    for p in &report.pods {
        if p.forbidden {
            if p.running.is_some() {
                report.policy_skipped.push(p.name.clone());
            }
            if !p.denied {
                report.policy_undecided.push(p.name.clone());
            }
        } else if p.running.is_none() {
            report.stuck.push(p.name.clone());
        } else if p.status_entries != spec.status_entries {
            report.status_wrong.push((p.name.clone(), p.status_entries));
        }
    }
    let names: Vec<String> = report.pods.iter().map(|p| p.name.clone()).collect();
    let deadline = Instant::now() + spec.settle;
    let mut left = names.clone();
    while !left.is_empty() && Instant::now() < deadline {
        left.retain(|n| !delete(node, n) || node.pod(NS, n).is_some());
        if !left.is_empty() {
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    report.not_deleted = left;
    collect_events(node, report);
    count_leftovers(node, report);
}

/// The kept pods whose claim's status lacks the network data of `net2` (waiting, bounded, for claim status writes
/// still queued).
fn check_devices(node: &DsNode, report: &mut ChurnReport) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        report.device_wrong = report
            .pods
            .iter()
            .filter(|p| p.claim && !p.deleted && p.running.is_some())
            .filter(|p| !device_data_written(node, &p.name))
            .map(|p| p.name.clone())
            .collect();
        if report.device_wrong.is_empty() || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Whether the claim made for pod `name` has a device whose network data names `net2`.
fn device_data_written(node: &DsNode, name: &str) -> bool {
    let Some(pod) = node.pod(NS, name) else {
        return false;
    };
    let Some(claim) = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"].as_str()
    else {
        return false;
    };
    let path = format!("/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{claim}");
    let Some(claim) = crate::daemonset::get(&node.api, &path) else {
        return false;
    };
    claim["status"]["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|d| d["networkData"]["interfaceName"] == "net2")
}

/// With every pod kept Running and every pod deleted gone: the addresses each network has reserved beyond one per
/// pod that selects it (a sandbox attached twice, or one torn down without its DEL; a denied pod attached anyway).
fn count_addresses(node: &DsNode, report: &mut ChurnReport) {
    let kept: Vec<&PodRecord> = report
        .pods
        .iter()
        .filter(|p| !p.deleted && !p.forbidden)
        .collect();
    report.extra_addresses = node
        .networks()
        .into_iter()
        .map(|n| {
            let expected = kept
                .iter()
                .filter(|p| n == "cluster-net" || p.networks.iter().any(|s| s == n))
                .count();
            (
                n.to_string(),
                node.ipam.reserved_ips(n).len() as i64 - expected as i64,
            )
        })
        .filter(|(_, extra)| *extra != 0)
        .collect();
}

/// The kubelet's FailedCreatePodSandBox and FailedKillPod events of the churn's pods, and which Running pods have
/// no AddedInterface event (waiting, bounded, for events still being posted). The daemon posts events within its
/// `--event-qps` (10 a second), above the eight a second of a churn of four pods a second with two NADs each;
/// after an outage it posts the outage's backlog at that rate.
fn collect_events(node: &DsNode, report: &mut ChurnReport) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        report.add_failures.clear();
        report.del_failures.clear();
        list_events(node, report);
        if report.no_added_event.is_empty() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn list_events(node: &DsNode, report: &mut ChurnReport) {
    let events = node
        .api
        .must("GET", &format!("/api/v1/namespaces/{NS}/events"), None);
    let mut added = Vec::new();
    for e in events["items"].as_array().into_iter().flatten() {
        let pod = e["involvedObject"]["name"].as_str().unwrap_or_default();
        // A forbidden pod's failed ADDs are its denials (delete_denied), not failures.
        if !report.pods.iter().any(|p| p.name == pod && !p.forbidden) {
            continue;
        }
        let entry = (
            pod.to_string(),
            e["message"].as_str().unwrap_or_default().to_string(),
        );
        match e["reason"].as_str() {
            Some("FailedCreatePodSandBox") => report.add_failures.push(entry),
            Some("FailedKillPod") => report.del_failures.push(entry),
            Some("AddedInterface") => added.push(entry.0),
            _ => {}
        }
    }
    report.no_added_event = report
        .pods
        .iter()
        .filter(|p| p.running.is_some() && !added.contains(&p.name))
        .map(|p| p.name.clone())
        .collect();
}

/// What the pods left on the node once they are gone (waiting, bounded, for the runtime's last DELs).
fn count_leftovers(node: &DsNode, report: &mut ChurnReport) {
    let attachments = node.node("/var/lib/plexus").join("attachments");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        report.leaked_ips = node
            .networks()
            .into_iter()
            .map(|n| (n.to_string(), node.ipam.reserved_ips(n).len()))
            .filter(|(_, n)| *n > 0)
            .collect();
        report.leaked_cache = list_cache(&attachments).len();
        report.leaked_links = node.bridge_ports();
        report.leaked_claims = node.claims(NS);
        let left = report.leaked_ips.values().sum::<usize>()
            + report.leaked_cache
            + report.leaked_links
            + report.leaked_claims;
        if left == 0 || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let log = node.runtime.log();
    report.left_sandboxes = list_cache(&attachments)
        .iter()
        .map(|file| {
            let id = file.trim_end_matches(".json");
            let pod = read_cached_plan(&attachments, id)
                .and_then(|p| {
                    Some(format!(
                        "{}/{}",
                        p["pod"]["namespace"].as_str()?,
                        p["pod"]["name"].as_str()?
                    ))
                })
                .unwrap_or_default();
            let said: Vec<&str> = log
                .lines()
                .filter(|l| l.contains(&id[..12.min(id.len())]))
                .collect();
            let last = &said[said.len().saturating_sub(8)..];
            format!(
                "{id} ({pod}), {} runtime log lines name it; the last:\n  {}",
                said.len(),
                last.join("\n  ")
            )
        })
        .collect();
}
