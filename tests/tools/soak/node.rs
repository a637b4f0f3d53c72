//! The report's node section: each event of `plexus_tests::node_events` on each runtime, longer than the suite's
//! short versions, with a row of what the kubelet saw and what was left.

use std::time::Duration;

use plexus_tests::churn::{ChurnReport, ChurnSpec};
use plexus_tests::node_events::{hammered, EventFigures, NodeEvent};
use plexus_tests::runtime::RuntimeKind;

/// One event on one runtime.
pub struct NodeRow {
    runtime: &'static str,
    event: String,
    report: ChurnReport,
    figures: EventFigures,
}

impl NodeRow {
    /// Whether the row meets every target: no pod lost, no policy decision skipped, every failed ADD retried to
    /// Running, nothing left.
    fn met(&self) -> bool {
        let r = &self.report;
        // A reboot loses the events still in the daemon's memory, by design: shown, not a target.
        let events_kept = r.no_added_event.is_empty() || self.event.starts_with("node reboot");
        r.stuck.is_empty()
            && r.policy_skipped.is_empty()
            && r.policy_undecided.is_empty()
            && r.status_wrong.is_empty()
            && r.device_wrong.is_empty()
            && events_kept
            && r.extra_addresses.is_empty()
            && r.retried_to_running() == r.failed_pods()
            && r.leaks() == 0
            && self
                .figures
                .requests_after_outage
                .as_ref()
                .is_none_or(|q| hammered(q).is_empty())
    }
}

/// Every event on each of `runtimes`, the API server down `outage` in its row, pods churned for `churn` after each
/// event.
pub fn rows(runtimes: &[RuntimeKind], outage: Duration, churn: Duration) -> Vec<NodeRow> {
    let events = [
        NodeEvent::RollingUpdate,
        NodeEvent::ApiOutage(outage),
        NodeEvent::RuntimeAndKubeletRestart,
        NodeEvent::Reboot,
        NodeEvent::CacheFull(Duration::from_secs(20)),
    ];
    let mut rows = Vec::new();
    for &kind in runtimes {
        for (i, event) in events.into_iter().enumerate() {
            eprintln!("soak: on the node ({}): {}", kind.name(), event.describe());
            let spec = ChurnSpec::new(&format!("soak-{i}"));
            let (ds, report, figures) = event.run(kind, &spec, churn);
            drop(ds);
            rows.push(NodeRow {
                runtime: kind.name(),
                event: event.describe(),
                report,
                figures,
            });
        }
    }
    rows
}

/// The section, as Markdown.
pub fn print(rows: &[NodeRow], outage: Duration, churn: Duration) {
    println!("\n## On a node: upgrades, outages and restarts under load\n");
    println!(
        "Kubernetes 1.37: a real kubelet, API server and runtime (containerd 2.4 or CRI-O 1.36), Plexus installed by \
         its DaemonSet from the project's image (examples/deploy). Pods are created four a second, each with the \
         cluster network and two NADs (bridge + host-local); every other pod has a ResourceClaim (from a template), \
         is placed by the kube-scheduler, which allocates it one of the devices the suite's DRA driver publishes, and \
         its second NAD takes that device (the others are bound to the node, as pods without claims start while the \
         API server is down: the kubelet reads a pod's claims from it before it makes the sandbox); eight kept \
         alive, the oldest Running ones deleted. The \
         node enforces a policy hook (NetworkHook, the namespace-isolation guest, pulled from a registry and verified \
         by the node agent): every eighth pod also selects a NAD of another namespace, which it denies; such a pod \
         must never run, and is deleted once the kubelet's event shows the denial. A \
         few seconds in, the event happens; the churn goes on {} s after it, then every pod still there must be \
         Running with its network-status (three entries), its AddedInterface events and, with a claim, the claim's network \
         data (the interface that took the device), each must hold exactly one \
         address per network, and once all are deleted nothing may be left. Failed ADDs and DELs are the kubelet's \
         events (FailedCreatePodSandBox, FailedKillPod); a failed ADD is fine if the kubelet's retry made the pod \
         Running. Startup: from the create to the first list that showed the pod Running (listed every 250 ms); \
         the kubelet's own backoffs after an outage or a restart are in it. AddedInterface events not yet posted live in the \
         daemon's memory: a reboot loses them (shown; not a target). The daemon posts events within its \
         --event-qps (10 a second, as shipped; this churn asks for eight), and the report waits up to 90 s after \
         the churn for those still being posted (after an outage, the backlog of the outage). The API server row counts the node \
         daemon's requests from the server's start until 10 s after it was ready (audit log).\n",
        churn.as_secs()
    );
    let met = rows.iter().filter(|r| r.met()).count();
    println!(
        "**Targets: no pod lost, every failed ADD retried to Running, no address kept twice or left, no request for \
         one object more than twice after the outage, no policy decision skipped (a denied pod Running, or no denial seen). Met in {met} of {} rows.** The API server was down {} s.\n",
        rows.len(),
        outage.as_secs()
    );
    println!(
        "| runtime | event | pods | failed ADDs (pods, Running after a retry) | failed DELs | stuck | network-status \
         wrong / events missing / device data missing | policy: denied / skipped / not seen | extra addresses | left: IPs, claims, cache, ports, pods | startup median / longest (s) | \
         daemon's requests after the outage |"
    );
    println!("| --- | --- | ---: | --- | ---: | ---: | --- | --- | ---: | --- | --- | --- |");
    for row in rows {
        print_row(row);
    }
    let failed_adds: Vec<&(String, String)> = rows
        .iter()
        .flat_map(|r| r.report.add_failures.iter().take(1))
        .collect();
    if !failed_adds.is_empty() {
        println!("\nWhat a failed ADD said, the first of each row that had one:\n");
        for (pod, message) in failed_adds {
            println!(
                "- `{pod}`: {}",
                without_test_dirs(message).replace('`', "'")
            );
        }
    }
}

fn print_row(row: &NodeRow) {
    let r = &row.report;
    let secs =
        |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{:.1}", d.as_secs_f64()));
    let requests = row
        .figures
        .requests_after_outage
        .as_ref()
        .map_or("".to_string(), |q| {
            let events = q
                .iter()
                .filter(|(v, p)| v == "create" && p.contains("/events"))
                .count();
            // Which ones, so that a row that misses names what was asked for again.
            let many: Vec<String> = hammered(q)
                .into_iter()
                .map(|(request, n)| format!("`{request}` {n} times"))
                .collect();
            match many.is_empty() {
                true => format!("{} ({events} events; no object more than twice)", q.len()),
                false => format!(
                    "{} ({events} events; more than twice: {})",
                    q.len(),
                    without_test_dirs(&many.join(", "))
                ),
            }
        });
    println!(
        "| {} | {} | {} | {} ({}, {}) | {} | {} | {} / {} / {} | {} / {} / {} | {} | {}, {}, {}, {}, {} | {} / {} | {} |",
        row.runtime,
        row.event,
        r.created(),
        r.add_failures.len(),
        r.failed_pods(),
        r.retried_to_running(),
        r.del_failures.len(),
        r.stuck.len(),
        r.status_wrong.len(),
        r.no_added_event.len(),
        r.device_wrong.len(),
        r.policy_denied(),
        r.policy_skipped.len(),
        r.policy_undecided.len(),
        r.extra_addresses.values().map(|n| n.abs()).sum::<i64>(),
        r.leaked_ips.values().sum::<usize>(),
        r.leaked_claims,
        r.leaked_cache,
        r.leaked_links,
        r.not_deleted.len(),
        secs(r.median_startup()),
        secs(r.longest_startup()),
        requests,
    );
}

/// A message with the test's own node directory taken out of its paths (`.../node/var/lib/plexus/...` becomes
/// `/var/lib/plexus/...`): the report names a node's paths, not one machine's.
fn without_test_dirs(message: &str) -> String {
    let mut out = message.to_string();
    while let Some(start) = out.find("/var/tmp/plx-ds-") {
        match out[start..].find("/node/") {
            Some(end) => out.replace_range(start..start + end + "/node".len(), ""),
            None => break,
        }
    }
    out
}
