//! What an operator does to a node while pods come and go: the events of the restart tests (tests/node/restarts.rs)
//! and of the reliability report's node section (`bash tests/soak.sh`), each done to a fresh [`DsNode`] with its
//! DaemonSet pod Ready while pods churn ([`crate::churn`]). The tests run them short and assert; the report runs
//! them longer and writes their figures.

use std::time::{Duration, SystemTime};

use crate::churn::{self, ChurnReport, ChurnSpec};
use crate::daemonset::{ready, DsNode, Mode, IMAGE_2};
use crate::image;
use crate::kubeapi::PLEXUS_USER;
use crate::kubelet::NODE;
use crate::plexus::list_cache;
use crate::runtime::RuntimeKind;

/// One event.
#[derive(Clone, Copy, Debug)]
pub enum NodeEvent {
    /// The DaemonSet's pod replaced by one of the image's second tag, as its controller does with
    /// `maxUnavailable: 1`: the old one deleted, and once it is gone the new one created.
    RollingUpdate,
    /// kube-apiserver stopped (etcd kept) this long, right after a burst of pods, then started again.
    ApiOutage(Duration),
    /// The runtime killed (kill -9) during a burst and started again; then, a few seconds on, the kubelet
    /// restarted during another burst.
    RuntimeAndKubeletRestart,
    /// Every process of the node stopped at once, `/run` emptied, the pods' network namespaces gone, then the
    /// runtime and the kubelet started again ([`DsNode::reboot`]).
    Reboot,
    /// The file system of Plexus's `cacheDir` (16 MiB of its own) full this long.
    CacheFull(Duration),
}

/// What an event did, beside the churn's report.
#[derive(Debug, Default)]
pub struct EventFigures {
    /// [`NodeEvent::ApiOutage`]: the node daemon's requests from the server's start until 10 s after it was
    /// ready, `(verb, path)`.
    pub requests_after_outage: Option<Vec<(String, String)>>,
    /// [`NodeEvent::RollingUpdate`]: the new DaemonSet pod's container restarts.
    pub new_daemon_restarts: Option<i64>,
}

impl NodeEvent {
    /// What the report's row calls it.
    pub fn describe(&self) -> String {
        match self {
            NodeEvent::RollingUpdate => "rolling update of the DaemonSet (image tag 1 to 2)".into(),
            NodeEvent::ApiOutage(d) => {
                format!(
                    "API server stopped {} s (etcd kept), then started",
                    d.as_secs()
                )
            }
            NodeEvent::RuntimeAndKubeletRestart => {
                "runtime killed (kill -9) and started, then the kubelet restarted".into()
            }
            NodeEvent::Reboot => {
                "node reboot (every process killed, /run and the pods' namespaces gone)".into()
            }
            NodeEvent::CacheFull(d) => format!("cacheDir's disk full {} s", d.as_secs()),
        }
    }

    /// Starts a node on `kind` with its DaemonSet pod Ready, churns pods as `spec` says, does the event (a few
    /// seconds into the churn), churns on for `after`, settles and counts. The node is returned for what a test
    /// wants to look at or assert next.
    pub fn run(
        self,
        kind: RuntimeKind,
        spec: &ChurnSpec,
        after: Duration,
    ) -> (DsNode, ChurnReport, EventFigures) {
        self.run_in(kind, Mode::Cni, spec, after)
    }

    /// [`NodeEvent::run`] with Plexus installed in `mode`.
    pub fn run_in(
        self,
        kind: RuntimeKind,
        mode: Mode,
        spec: &ChurnSpec,
        after: Duration,
    ) -> (DsNode, ChurnReport, EventFigures) {
        let cache_mib = matches!(self, NodeEvent::CacheFull(_)).then_some(16);
        let ds = DsNode::start_in(kind, cache_mib, spec.claim_template.is_some(), mode);
        let daemon = format!("plexus-{NODE}");
        ds.run_daemon_pod(&daemon, image::IMAGE);
        ds.within(60, "the DaemonSet's pod Ready", &daemon, &|| {
            ds.pod("kube-system", &daemon).is_some_and(|p| ready(&p))
        });
        ds.within(60, "the node's policy hook active", &daemon, &|| {
            ds.policy_active()
        });
        let (figures, report) = churn::during(&ds, spec, after, |churn| {
            // Some pods under the node as it was first.
            std::thread::sleep(Duration::from_secs(3));
            self.happen(&ds, churn, &daemon)
        });
        eprintln!(
            "{} on {}: {}",
            self.describe(),
            kind.name(),
            report.summary()
        );
        (ds, report, figures)
    }

    fn happen(self, ds: &DsNode, churn: &churn::Churner, daemon: &str) -> EventFigures {
        let mut figures = EventFigures::default();
        match self {
            NodeEvent::RollingUpdate => {
                figures.new_daemon_restarts = Some(rolling_update(ds, daemon));
            }
            NodeEvent::ApiOutage(outage) => {
                // More pods than the kubelet starts at once: their ADDs run during the outage. The server stops
                // once the daemon's watch has delivered them: the kubelet may have a pod the daemon's watch does
                // not yet (two streams), and an ADD of such a pod has no cache to start from (it fails, naming
                // the pod's read, and the kubelet's retry succeeds once the server is back).
                let paused = churn.pause();
                churn.burst(16);
                ds.wait_for_daemon_pod_cache(Duration::from_secs(10));
                ds.api.stop();
                drop(paused);
                std::thread::sleep(outage);
                let back = SystemTime::now();
                ds.api.start_again();
                let ready_at = SystemTime::now();
                // The daemon may reach the server before its /readyz says ok: counted from its start.
                std::thread::sleep(Duration::from_secs(10));
                let window =
                    ready_at.duration_since(back).unwrap_or_default() + Duration::from_secs(10);
                figures.requests_after_outage = Some(daemon_requests_within(ds, back, window));
            }
            NodeEvent::RuntimeAndKubeletRestart => {
                churn.burst(8);
                ds.runtime.restart();
                std::thread::sleep(Duration::from_secs(5));
                churn.burst(8);
                ds.kubelet.restart(&ds.api);
            }
            NodeEvent::Reboot => reboot(ds, daemon),
            NodeEvent::CacheFull(full) => {
                let fill = ds.fill_cache();
                churn.burst(4);
                std::thread::sleep(full);
                std::fs::remove_file(fill).expect("remove the file that filled cacheDir");
            }
        }
        figures
    }
}

/// The rolling update; the new pod's container restarts once it is Ready.
fn rolling_update(ds: &DsNode, old: &str) -> i64 {
    let new = format!("{old}-2");
    ds.api.must(
        "DELETE",
        &format!("/api/v1/namespaces/kube-system/pods/{old}"),
        None,
    );
    ds.within(60, "the old DaemonSet pod gone", old, &|| {
        ds.pod("kube-system", old).is_none()
    });
    ds.run_daemon_pod(&new, IMAGE_2);
    ds.within(60, "the new DaemonSet pod Ready", &new, &|| {
        ds.pod("kube-system", &new).is_some_and(|p| ready(&p))
    });
    let pod = ds.pod("kube-system", &new).unwrap_or_default();
    pod["status"]["containerStatuses"][0]["restartCount"]
        .as_i64()
        .unwrap_or(-1)
}

/// The reboot, then a wait (bounded) until every sandbox from before it is torn down: its plan leaves the
/// attachment cache, which only its DEL does.
fn reboot(ds: &DsNode, daemon: &str) {
    let attachments = ds.node("/var/lib/plexus").join("attachments");
    let before = list_cache(&attachments);
    assert!(!before.is_empty(), "pods attached before the reboot");
    ds.reboot();
    ds.within(
        120,
        "every sandbox from before the reboot torn down",
        daemon,
        &|| {
            let now = list_cache(&attachments);
            before.iter().all(|id| !now.contains(id))
        },
    );
}

/// The node daemon's requests the API server received within `window` from `from`: its service account's, but not
/// the CNI plugin's (the same account, user agent `plexus-cni/...`: an ADD that reads for itself while the daemon's
/// watches list again); `(verb, path)`, the query left out.
pub fn daemon_requests_within(
    ds: &DsNode,
    from: SystemTime,
    window: Duration,
) -> Vec<(String, String)> {
    let since_epoch = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
    let from = since_epoch(from);
    let to = from + window;
    let mut seen = std::collections::HashSet::new();
    ds.api
        .audit_all()
        .into_iter()
        .filter(|e| e["user"]["username"] == PLEXUS_USER)
        .filter(|e| {
            !e["userAgent"]
                .as_str()
                .is_some_and(|a| a.starts_with("plexus-cni/"))
        })
        // A watch is logged when it starts and again when it ends: each request once.
        .filter(|e| seen.insert(e["auditID"].to_string()))
        .filter(|e| {
            e["requestReceivedTimestamp"]
                .as_str()
                .and_then(parse_time)
                .is_some_and(|t| t >= from && t <= to)
        })
        .map(|e| {
            let uri = e["requestURI"].as_str().unwrap_or_default();
            let path = uri.split('?').next().unwrap_or_default();
            (
                e["verb"].as_str().unwrap_or_default().to_string(),
                path.to_string(),
            )
        })
        .collect()
}

/// An audit timestamp (RFC 3339, UTC, microseconds) as time since the epoch.
fn parse_time(s: &str) -> Option<Duration> {
    let t: k8s_openapi::jiff::Timestamp = s.parse().ok()?;
    Some(Duration::from_micros(t.as_microsecond().try_into().ok()?))
}

/// Requests that change or watch one object (status writes, watches and lists; not event posts, which share one
/// path) more than twice: a retry storm. Reads are left out: while its watches list again after an outage, the
/// daemon reads the pod and NADs of each ADD from the API server (one GET each), which is one read per ADD, not a
/// retry.
pub fn hammered(requests: &[(String, String)]) -> Vec<(String, usize)> {
    let mut per_object = std::collections::BTreeMap::new();
    for (verb, path) in requests
        .iter()
        .filter(|(v, p)| v != "get" && !(v == "create" && p.contains("/events")))
    {
        *per_object.entry(format!("{verb} {path}")).or_insert(0) += 1;
    }
    per_object.into_iter().filter(|(_, n)| *n > 2).collect()
}
