//! The daemon's Prometheus metrics: `GET /metrics` on `--metrics-bind-address` (loopback by default; `0` turns
//! it off).
//!
//! The families are prometheus-client's; it writes the OpenMetrics text format, which a scraper gets when it
//! asks for it (`Accept: application/openmetrics-text`). Everyone else (Prometheus's classic parser, `promtool
//! check metrics`, curl) gets the Prometheus text format 0.0.4, made from the same output by [`to_classic`]:
//! the two differ in how a counter family is named (`x` with samples `x_total` against `x_total`) and in the
//! `# UNIT` and `# EOF` lines. Labels are bounded sets: verbs, resources, codes, results, hook names (one per
//! NetworkHook) and plugin types; never pods, UIDs or addresses.
//!
//! Gauges that mirror state held elsewhere (the cache's sizes, pending writes, requests in flight, hook states,
//! the process's own figures) are set when a scrape comes, from that state ([`Metrics::refresh`]), so nothing
//! on the ADD path pays for them.

use plexus_cluster::backoff::Backoff;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The Content-Type of each format.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Where the metrics are served unless told otherwise: loopback, so that a node does not expose them until its
/// operator says where (the DaemonSet example binds the node's address).
pub const DEFAULT_BIND: &str = "127.0.0.1:9471";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommandResult {
    pub command: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommandLabel {
    pub command: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginCommandResult {
    pub plugin: String,
    pub command: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginCommand {
    pub plugin: String,
    pub command: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Latency buckets, seconds: from a no-op delegate's millisecond to a DHCP lease's half minute.
fn latency_histogram() -> Histogram {
    Histogram::new([
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ])
}

/// The most plugin label values kept; reports of more plugins are counted under `other`.
const MAX_PLUGINS: usize = 64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HookCallLabels {
    pub hook: String,
    pub kind: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabels {
    pub verb: String,
    pub resource: String,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabel {
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HookStateLabels {
    pub hook: String,
    pub state: String,
}

/// What the node agent last knew of each NetworkHook for this node, by name, and why it waits when it cannot
/// decide (its Node is missing or unreadable).
#[derive(Debug, Clone, Default)]
pub struct HookStates {
    pub hooks: Arc<Mutex<BTreeMap<String, plexus_cni::daemon::proto::HookHealth>>>,
    pub waiting: Arc<Mutex<Option<String>>>,
    /// The node-authority self-check's last finding (see [`super::authority`]).
    pub authority: Arc<Mutex<Option<super::authority::Finding>>>,
}

impl HookStates {
    pub fn hooks(&self) -> BTreeMap<String, plexus_cni::daemon::proto::HookHealth> {
        self.hooks.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn authority(&self) -> Option<super::authority::Finding> {
        self.authority
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// [`Snapshot::authority_enforced`].
    pub fn authority_enforced(&self) -> i64 {
        match self.authority() {
            Some(super::authority::Finding::Enforced) => 1,
            Some(super::authority::Finding::NotEnforced(_)) => 0,
            _ => -1,
        }
    }

    pub fn waiting(&self) -> Option<String> {
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The state the refreshed gauges are read from at a scrape.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub in_flight: usize,
    pub pending_writes: usize,
    /// The watch caches: their sizes, completed lists (the first one, then one per relist after a watch failed),
    /// what the cached NADs weigh and how many were dropped to keep within the budget.
    pub cache: plexus_cluster::CacheHealth,
    /// The node-authority self-check: 1 enforced, 0 not enforced, -1 not known (yet).
    pub authority_enforced: i64,
    pub hooks: BTreeMap<String, plexus_cni::daemon::proto::HookHealth>,
}

/// Every metric family the daemon exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Every family's name as the classic format writes it, and its type.
    families: Vec<(String, &'static str)>,
    cni_operations: Family<CommandResult, Counter>,
    cni_duration: Histograms<CommandLabel>,
    delegate_operations: Family<PluginCommandResult, Counter>,
    delegate_duration: Histograms<PluginCommand>,
    plugins_seen: Mutex<std::collections::HashSet<String>>,
    hook_calls: Family<HookCallLabels, Counter>,
    hooks_seen: Mutex<std::collections::HashSet<String>>,
    pub requests_shed: Counter,
    pub requests_in_flight: Gauge,
    pub status_writes: Family<ResultLabel, Counter>,
    pub status_writes_pending: Gauge,
    /// Changes of running pods' networks (`--dynamic-networks`), by result.
    pub network_changes: Family<ResultLabel, Counter>,
    pub api_requests: Family<ApiLabels, Counter>,
    watch_restarts: Family<ResourceLabel, Counter>,
    cache_objects: Family<ResourceLabel, Gauge>,
    /// Objects left out of lists and watches for their size (a counter kept by the API client).
    objects_oversized: Counter,
    nad_cache_bytes: Gauge,
    nads_evicted: Counter,
    authority_enforced: Gauge,
    hooks_active: Gauge,
    hook_module_state: Family<HookStateLabels, Gauge>,
    process: ProcessMetrics,
}

#[derive(Debug, Default)]
struct ProcessMetrics {
    cpu_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    resident_bytes: Gauge,
    start_time_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    open_fds: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut reg = Reg::default();
        let m = Metrics {
            families: Vec::new(),
            cni_operations: Family::default(),
            cni_duration: Family::new_with_constructor(latency_histogram),
            delegate_operations: Family::default(),
            delegate_duration: Family::new_with_constructor(latency_histogram),
            plugins_seen: Mutex::default(),
            hook_calls: Family::default(),
            hooks_seen: Mutex::default(),
            requests_shed: Counter::default(),
            requests_in_flight: Gauge::default(),
            status_writes: Family::default(),
            status_writes_pending: Gauge::default(),
            network_changes: Family::default(),
            api_requests: Family::default(),
            watch_restarts: Family::default(),
            cache_objects: Family::default(),
            objects_oversized: Counter::default(),
            nad_cache_bytes: Gauge::default(),
            nads_evicted: Counter::default(),
            authority_enforced: Gauge::default(),
            hooks_active: Gauge::default(),
            hook_module_state: Family::default(),
            process: ProcessMetrics::default(),
            registry: Registry::default(),
        };
        register_invocations_and_daemon(&m, &mut reg);
        register_hooks_and_process(&m, &mut reg);
        Metrics {
            registry: reg.registry,
            families: reg.families,
            ..m
        }
    }

    /// Every family's name (as the classic format writes it: a counter's ends in `_total`) and its type,
    /// whether or not it has samples yet (a family with labels has none until the first event).
    pub fn families(&self) -> &[(String, &'static str)] {
        &self.families
    }

    /// Counts one CNI invocation's report. Label values are checked, so a report cannot grow the label sets
    /// without bound: an unknown command is dropped, an unknown result or a plugin past [`MAX_PLUGINS`] is
    /// counted as `other`.
    pub fn record(&self, report: &plexus_cni::daemon::proto::Report) {
        const COMMANDS: [&str; 5] = ["ADD", "DEL", "CHECK", "GC", "STATUS"];
        let seconds_ok = |s: f64| s.is_finite() && (0.0..=86_400.0).contains(&s);
        if !COMMANDS.contains(&report.command.as_str()) || !seconds_ok(report.seconds) {
            return;
        }
        self.cni_operations
            .get_or_create(&CommandResult {
                command: report.command.clone(),
                result: result_label(&report.result),
            })
            .inc();
        self.cni_duration
            .get_or_create(&CommandLabel {
                command: report.command.clone(),
            })
            .observe(report.seconds);
        for call in report.hooks.iter().take(256) {
            let kind_ok = matches!(call.kind.as_str(), "policy" | "resolver" | "status");
            let outcome_ok = matches!(
                call.outcome.as_str(),
                "allow" | "deny" | "error" | "timeout" | "unready"
            );
            if !kind_ok || !outcome_ok {
                continue;
            }
            self.hook_calls
                .get_or_create(&HookCallLabels {
                    hook: bounded_hook_name(&self.hooks_seen, &call.hook),
                    kind: call.kind.clone(),
                    outcome: call.outcome.clone(),
                })
                .inc();
        }
        for call in report.delegates.iter().take(256) {
            if !COMMANDS.contains(&call.command.as_str()) || !seconds_ok(call.seconds) {
                continue;
            }
            let plugin = bounded_name(&self.plugins_seen, &call.plugin);
            self.delegate_operations
                .get_or_create(&PluginCommandResult {
                    plugin: plugin.clone(),
                    command: call.command.clone(),
                    result: result_label(&call.result),
                })
                .inc();
            self.delegate_duration
                .get_or_create(&PluginCommand {
                    plugin,
                    command: call.command.clone(),
                })
                .observe(call.seconds);
        }
    }

    /// Counts one response of the API server (or `None`: no answer).
    pub fn api_request(&self, verb: &str, resource: &str, code: Option<u16>) {
        self.api_requests
            .get_or_create(&ApiLabels {
                verb: verb.into(),
                resource: resource.into(),
                code: code.map_or_else(|| "error".into(), |c| c.to_string()),
            })
            .inc();
    }

    /// Sets the gauges that mirror state held elsewhere.
    pub fn refresh(&self, s: &Snapshot) {
        self.requests_in_flight.set(s.in_flight as i64);
        self.status_writes_pending.set(s.pending_writes as i64);
        catch_up(&self.objects_oversized, plexus_cluster::skipped_objects());
        self.nad_cache_bytes.set(s.cache.nad_bytes as i64);
        catch_up(&self.nads_evicted, s.cache.nads_evicted);
        self.authority_enforced.set(s.authority_enforced);
        for (resource, objects, lists) in [
            ("pods", s.cache.pods, s.cache.pod_lists),
            (
                "networkattachmentdefinitions",
                s.cache.nads,
                s.cache.nad_lists,
            ),
        ] {
            let label = ResourceLabel {
                resource: resource.into(),
            };
            self.cache_objects.get_or_create(&label).set(objects as i64);
            catch_up(
                &self.watch_restarts.get_or_create(&label),
                lists.saturating_sub(1),
            );
        }
        self.hooks_active
            .set(s.hooks.values().filter(|h| h.active).count() as i64);
        self.hook_module_state.clear();
        for (hook, h) in &s.hooks {
            self.hook_module_state
                .get_or_create(&HookStateLabels {
                    // The name its calls are counted under.
                    hook: format!("{}{hook}", plexus_cni::hooks::CLUSTER_HOOK_PREFIX),
                    state: h.reason.clone(),
                })
                .set(1);
        }
        self.process.refresh();
    }

    /// The registry in the OpenMetrics text format.
    pub fn openmetrics(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// What to answer a scrape that sent `accept`: the body and its Content-Type.
    pub fn exposition(&self, accept: Option<&str>) -> (String, &'static str) {
        let text = self.openmetrics();
        if accept.is_some_and(|a| a.contains("application/openmetrics-text")) {
            (text, OPENMETRICS)
        } else {
            (to_classic(&text), CLASSIC)
        }
    }
}

impl ProcessMetrics {
    /// From /proc/self: CPU time and start time (`stat`), resident memory (`statm`), open descriptors (`fd`).
    fn refresh(&self) {
        let page = rustix::param::page_size() as i64;
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
            // Fields after the command name (which may hold spaces), counted from field 3 (state).
            if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
                let f: Vec<&str> = rest.split_whitespace().collect();
                let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
                // utime and stime are fields 14 and 15, starttime 22 (1-based): 11, 12 and 19 here.
                if let (Some(u), Some(s)) = (num(11), num(12)) {
                    let cpu = (u + s) as f64 / USER_HZ;
                    let now = self.cpu_seconds.get();
                    if cpu > now {
                        self.cpu_seconds.inc_by(cpu - now);
                    }
                }
                if let (Some(start), Some(boot)) = (num(19), boot_time()) {
                    self.start_time_seconds
                        .set(boot as f64 + start as f64 / USER_HZ);
                }
            }
        }
        if let Ok(statm) = std::fs::read_to_string("/proc/self/statm") {
            if let Some(rss) = statm
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<i64>().ok())
            {
                self.resident_bytes.set(rss * page);
            }
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds.set(fds.count() as i64);
        }
    }
}

/// The registry, and the names and types registered in it.
#[derive(Default)]
struct Reg {
    registry: Registry,
    families: Vec<(String, &'static str)>,
}

impl Reg {
    fn add<M>(&mut self, name: &str, help: &str, metric: M)
    where
        M: prometheus_client::registry::Metric + prometheus_client::encoding::EncodeMetric,
    {
        let kind = match metric.metric_type() {
            prometheus_client::metrics::MetricType::Counter => "counter",
            prometheus_client::metrics::MetricType::Gauge => "gauge",
            prometheus_client::metrics::MetricType::Histogram => "histogram",
            _ => "untyped",
        };
        let classic = if kind == "counter" {
            format!("{name}_total")
        } else {
            name.to_string()
        };
        self.families.push((classic, kind));
        self.registry.register(name, help, metric);
    }
}

/// `name` when it is a plausible name (a plugin type, a hook's name) and one of the first [`MAX_PLUGINS`]
/// distinct ones seen; `other` otherwise.
fn bounded_name(seen: &Mutex<std::collections::HashSet<String>>, name: &str) -> String {
    if !plain_name(name, 64) {
        return "other".into();
    }
    first_seen(seen, name)
}

/// A hook's name as its calls run under it: a conf hook's `name`, or `networkhook/<NetworkHook name>` (an
/// object name, up to 253 characters), bounded as [`bounded_name`] bounds.
fn bounded_hook_name(seen: &Mutex<std::collections::HashSet<String>>, name: &str) -> String {
    let valid = match name.strip_prefix(plexus_cni::hooks::CLUSTER_HOOK_PREFIX) {
        Some(object) => plain_name(object, 253),
        None => plain_name(name, 64),
    };
    if !valid {
        return "other".into();
    }
    first_seen(seen, name)
}

fn plain_name(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// `name` while fewer than [`MAX_PLUGINS`] distinct names were seen (or it is one of them); `other` after.
fn first_seen(seen: &Mutex<std::collections::HashSet<String>>, name: &str) -> String {
    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    if seen.contains(name) || seen.len() < MAX_PLUGINS {
        seen.insert(name.to_string());
        name.to_string()
    } else {
        "other".into()
    }
}

/// `success`, a CNI error code (digits), `timeout`, `overflow` or `error`; anything else is `other`.
fn result_label(result: &str) -> String {
    let known = matches!(result, "success" | "timeout" | "overflow" | "error")
        || (!result.is_empty() && result.len() <= 3 && result.chars().all(|c| c.is_ascii_digit()));
    if known {
        result.to_string()
    } else {
        "other".into()
    }
}

/// The kernel's clock ticks per second (USER_HZ), the unit of /proc's CPU times: 100 on every Linux
/// architecture plexus builds for.
const USER_HZ: f64 = 100.0;

/// The boot time, seconds since the epoch (`btime` in /proc/stat).
fn boot_time() -> Option<u64> {
    std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The Prometheus text format 0.0.4 of prometheus-client's OpenMetrics output: counter families are named
/// after their samples (`x_total`), `# UNIT` lines and the closing `# EOF` go. Everything else (sample lines,
/// label escaping, histograms' `_bucket`/`_sum`/`_count`) is the same in both.
pub fn to_classic(openmetrics: &str) -> String {
    let mut counters = std::collections::HashSet::new();
    for line in openmetrics.lines() {
        if let Some(name) = line
            .strip_prefix("# TYPE ")
            .and_then(|r| r.strip_suffix(" counter"))
        {
            counters.insert(name.to_string());
        }
    }
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                if counters.contains(name) {
                    out.push_str(&format!("{prefix}{name}_total {tail}"));
                } else {
                    out.push_str(line);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Serves `GET /metrics` on `addr` until the task is dropped. An address that cannot be bound (in use, not
/// this node's) is logged and tried again, backing off to every 30 s: the metrics never keep the daemon from
/// its work. Bounded: a request head must arrive within 5 s and fit in 16 KiB, at most 16 connections are served
/// at once (others wait in the listener's backlog), and a connection lives at most 60 s.
pub async fn serve(
    addr: std::net::SocketAddr,
    metrics: Arc<Metrics>,
    snapshot: impl Fn() -> Snapshot + Send + Sync + 'static,
) -> std::io::Result<()> {
    let mut backoff = Backoff::jittered(Duration::from_secs(1), Duration::from_secs(30));
    let mut last_error = String::new();
    let listener = loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(e) => {
                let error = e.to_string();
                if error != last_error {
                    tracing::warn!(address = %addr, error = %e, "cannot serve metrics there yet; trying again");
                    last_error = error;
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    };
    tracing::info!(address = %listener.local_addr()?, "serving metrics");
    let snapshot = Arc::new(snapshot);
    let slots = Arc::new(tokio::sync::Semaphore::new(16));
    loop {
        let permit = slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| std::io::Error::other("metrics slots closed"))?;
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let (metrics, snapshot) = (metrics.clone(), snapshot.clone());
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let response = respond(&metrics, &*snapshot, &req);
                    async move { Ok::<_, std::convert::Infallible>(response) }
                });
            // One request per connection, its head within 5 s, the whole exchange within 10 s: a slow or idle
            // client cannot hold one of the 16 slots for long.
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(5))
                .keep_alive(false)
                .max_buf_size(16 << 10)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let _ = tokio::time::timeout(Duration::from_secs(10), conn).await;
            drop(permit);
        });
    }
}

fn respond(
    metrics: &Metrics,
    snapshot: &dyn Fn() -> Snapshot,
    req: &hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<http_body_util::Full<bytes::Bytes>> {
    let plain = |status: u16, text: &str| {
        hyper::Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(http_body_util::Full::new(bytes::Bytes::from(
                text.to_string(),
            )))
            .expect("a valid response")
    };
    if req.uri().path() != "/metrics" {
        return plain(404, "not found: the metrics are at /metrics\n");
    }
    if req.method() != http::Method::GET && req.method() != http::Method::HEAD {
        return plain(405, "only GET\n");
    }
    metrics.refresh(&snapshot());
    let accept = req
        .headers()
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    let (body, content_type) = metrics.exposition(accept);
    hyper::Response::builder()
        .status(200)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .expect("a valid response")
}

/// The families of CNI invocations, delegates, the socket, status writes, network changes, the API and the caches.
fn register_invocations_and_daemon(m: &Metrics, reg: &mut Reg) {
    reg.add(
        "plexus_cni_operations",
        "CNI invocations on this node while the daemon was up (daemon mode), by command and result (success \
         or the CNI error code)",
        m.cni_operations.clone(),
    );
    reg.add(
        "plexus_cni_operation_duration_seconds",
        "Time from a CNI process's start to its answer, by command",
        m.cni_duration.clone(),
    );
    reg.add(
        "plexus_delegate_operations",
        "Delegate plugin executions, by plugin type, command and result (success, the CNI error code, \
         timeout, overflow, or error)",
        m.delegate_operations.clone(),
    );
    reg.add(
        "plexus_delegate_duration_seconds",
        "Time of one delegate plugin execution, by plugin type and command",
        m.delegate_duration.clone(),
    );
    reg.add(
        "plexus_daemon_requests_in_flight",
        "Requests from CNI processes being served now (bounded by --max-in-flight)",
        m.requests_in_flight.clone(),
    );
    reg.add(
        "plexus_daemon_requests_shed",
        "Requests answered busy because --max-in-flight were being served for longer than the queue wait",
        m.requests_shed.clone(),
    );
    reg.add(
        "plexus_status_writes",
        "Network-status writes the daemon sent to the API server, by result (success, or error for a try \
         that failed and is retried)",
        m.status_writes.clone(),
    );
    reg.add(
        "plexus_status_writes_pending",
        "Network-status writes accepted and kept on disk, not yet taken by the API server",
        m.status_writes_pending.clone(),
    );
    reg.add(
        "plexus_network_changes",
        "Changes of running pods' networks to follow their annotation (--dynamic-networks), by result \
         (changed, or failed: refused or failed, nothing changed, a NetworkChangeFailed event says why)",
        m.network_changes.clone(),
    );
    reg.add(
        "plexus_api_requests",
        "Requests the daemon sent to the Kubernetes API, by verb, resource and HTTP status code (error: no \
         answer)",
        m.api_requests.clone(),
    );
    reg.add(
        "plexus_watch_restarts",
        "Relists of a watched resource after its watch failed (the first list is not counted)",
        m.watch_restarts.clone(),
    );
    reg.add(
        "plexus_cache_objects",
        "Objects in the daemon's watch caches, by resource",
        m.cache_objects.clone(),
    );
    reg.add(
        "plexus_api_objects_oversized",
        "Objects left out of the API's lists and watches (and so of the caches) for being over the per-object \
         size bound (1 MiB); the log names each",
        m.objects_oversized.clone(),
    );
    reg.add(
        "plexus_nad_cache_bytes",
        "What the NetworkAttachmentDefinitions in the daemon's cache weigh, in bytes (bounded by --nad-cache-mib)",
        m.nad_cache_bytes.clone(),
    );
    reg.add(
        "plexus_nad_cache_evictions",
        "NetworkAttachmentDefinitions dropped from the cache to keep it within --nad-cache-mib (each is read by \
         name when an ADD needs it)",
        m.nads_evicted.clone(),
    );
    reg.add(
        "plexus_node_authority_enforced",
        "Whether the API server refuses, as it must, a write of this node that the plexus-node-authority admission \
         policy forbids (a dry run at start and hourly): 1 yes, 0 no (the policy or its binding is missing), -1 not \
         known",
        m.authority_enforced.clone(),
    );
}

/// Brings `counter` up to `total`, a count kept elsewhere that only grows.
fn catch_up(counter: &Counter, total: u64) {
    if total > counter.get() {
        counter.inc_by(total - counter.get());
    }
}

/// The families of hooks and of the process itself.
fn register_hooks_and_process(m: &Metrics, reg: &mut Reg) {
    reg.add(
        "plexus_hook_calls",
        "Hook calls made by CNI invocations in daemon mode, by hook, kind (policy, resolver, status) and \
         outcome (allow, deny, error, timeout, unready: the hook is selected for the node but not ready there)",
        m.hook_calls.clone(),
    );
    reg.add(
        "plexus_hooks_active",
        "NetworkHooks running in this node's ADDs",
        m.hooks_active.clone(),
    );
    reg.add(
        "plexus_hook_module_state",
        "Each NetworkHook's state on this node: 1 for its current state (Active, or why not: PullFailed, \
         SignatureInvalid, CompileFailed, ...)",
        m.hook_module_state.clone(),
    );
    reg.add(
        "process_cpu_seconds",
        "User and system CPU time of the daemon, seconds",
        m.process.cpu_seconds.clone(),
    );
    reg.add(
        "process_resident_memory_bytes",
        "Resident memory of the daemon, bytes",
        m.process.resident_bytes.clone(),
    );
    reg.add(
        "process_start_time_seconds",
        "Start time of the daemon since the Unix epoch, seconds",
        m.process.start_time_seconds.clone(),
    );
    reg.add(
        "process_open_fds",
        "Open file descriptors of the daemon",
        m.process.open_fds.clone(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(text: &str, line_start: &str) -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit_once(' '))
            .and_then(|(_, v)| v.parse().ok())
    }

    #[test]
    fn counters_are_named_after_their_samples_in_the_classic_format() {
        let m = Metrics::new();
        m.requests_shed.inc();
        m.api_request("get", "pods", Some(200));
        m.api_request("patch", "pods/status", None);
        let om = m.openmetrics();
        assert!(
            om.contains("# TYPE plexus_daemon_requests_shed counter\n"),
            "{om}"
        );
        assert!(om.ends_with("# EOF\n"), "{om}");
        let classic = to_classic(&om);
        assert!(
            classic.contains("# TYPE plexus_daemon_requests_shed_total counter\n"),
            "{classic}"
        );
        assert!(
            classic.contains("# HELP plexus_daemon_requests_shed_total Requests answered busy"),
            "{classic}"
        );
        assert!(!classic.contains("# EOF"), "{classic}");
        assert_eq!(
            sample(&classic, "plexus_daemon_requests_shed_total "),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &classic,
                "plexus_api_requests_total{verb=\"get\",resource=\"pods\",code=\"200\"}"
            ),
            Some(1.0),
            "{classic}"
        );
        assert_eq!(
            sample(
                &classic,
                "plexus_api_requests_total{verb=\"patch\",resource=\"pods/status\",code=\"error\"}"
            ),
            Some(1.0),
            "{classic}"
        );
        // Gauges keep their names.
        assert!(
            classic.contains("# TYPE plexus_status_writes_pending gauge\n"),
            "{classic}"
        );
    }

    #[test]
    fn the_scrape_sets_the_mirrored_gauges_and_the_process_figures() {
        let m = Metrics::new();
        let mut s = Snapshot {
            in_flight: 3,
            pending_writes: 2,
            cache: plexus_cluster::CacheHealth {
                pods: 10,
                nads: 4,
                pod_lists: 3,
                nad_lists: 1,
                ..Default::default()
            },
            ..Snapshot::default()
        };
        let state =
            |name: &str, active: bool, reason: &str| plexus_cni::daemon::proto::HookHealth {
                name: name.into(),
                active,
                reason: reason.into(),
                message: String::new(),
            };
        s.hooks
            .insert("isolation".into(), state("isolation", true, "Active"));
        s.hooks.insert(
            "templates".into(),
            state("templates", false, "SignatureInvalid"),
        );
        m.refresh(&s);
        let text = to_classic(&m.openmetrics());
        assert_eq!(
            sample(&text, "plexus_daemon_requests_in_flight "),
            Some(3.0)
        );
        assert_eq!(sample(&text, "plexus_status_writes_pending "), Some(2.0));
        assert_eq!(
            sample(&text, "plexus_cache_objects{resource=\"pods\"}"),
            Some(10.0)
        );
        assert_eq!(
            sample(&text, "plexus_watch_restarts_total{resource=\"pods\"}"),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                "plexus_watch_restarts_total{resource=\"networkattachmentdefinitions\"}"
            ),
            Some(0.0)
        );
        assert_eq!(sample(&text, "plexus_hooks_active "), Some(1.0));
        assert_eq!(
            sample(
                &text,
                "plexus_hook_module_state{hook=\"networkhook/templates\",state=\"SignatureInvalid\"}"
            ),
            Some(1.0)
        );
        // A hook whose state changed is listed under its new state only.
        s.hooks
            .insert("templates".into(), state("templates", true, "Active"));
        s.cache.pod_lists = 3;
        m.refresh(&s);
        let text = to_classic(&m.openmetrics());
        assert_eq!(
            sample(
                &text,
                "plexus_hook_module_state{hook=\"networkhook/templates\",state=\"SignatureInvalid\"}"
            ),
            None,
            "{text}"
        );
        assert_eq!(
            sample(
                &text,
                "plexus_hook_module_state{hook=\"networkhook/templates\",state=\"Active\"}"
            ),
            Some(1.0)
        );
        assert_eq!(sample(&text, "plexus_hooks_active "), Some(2.0));
        assert_eq!(
            sample(&text, "plexus_watch_restarts_total{resource=\"pods\"}"),
            Some(2.0)
        );
        assert!(
            sample(&text, "process_resident_memory_bytes ").unwrap() > 1e6,
            "{text}"
        );
        assert!(sample(&text, "process_open_fds ").unwrap() >= 3.0, "{text}");
        let start = sample(&text, "process_start_time_seconds ").unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            start > now - 3600.0 && start <= now + 1.0,
            "{start} vs {now}"
        );
    }

    /// A call of a hook selected for the node but not ready, skipped under failurePolicy Ignore, is counted.
    #[test]
    fn unready_hook_calls_are_counted() {
        use plexus_cni::daemon::proto::{HookCall, Report};
        let m = Metrics::new();
        m.record(&Report {
            command: "ADD".into(),
            result: "success".into(),
            seconds: 0.01,
            delegates: vec![],
            hooks: vec![HookCall {
                hook: "networkhook/audit".into(),
                kind: "status".into(),
                outcome: "unready".into(),
            }],
        });
        let text = to_classic(&m.openmetrics());
        let key = "plexus_hook_calls_total{hook=\"networkhook/audit\",kind=\"status\",outcome=\"unready\"}";
        assert_eq!(sample(&text, key), Some(1.0), "{text}");
    }

    #[test]
    fn reports_count_invocations_and_delegates_with_bounded_labels() {
        use plexus_cni::daemon::proto::{DelegateCall, HookCall, Report};
        let m = Metrics::new();
        let call = |plugin: &str, result: &str| DelegateCall {
            plugin: plugin.into(),
            command: "ADD".into(),
            result: result.into(),
            seconds: 0.002,
        };
        m.record(&Report {
            command: "ADD".into(),
            result: "success".into(),
            seconds: 0.012,
            delegates: vec![call("bridge", "success"), call("macvlan", "success")],
            hooks: vec![
                HookCall {
                    hook: "isolation".into(),
                    kind: "policy".into(),
                    outcome: "allow".into(),
                },
                HookCall {
                    hook: "isolation".into(),
                    kind: "bogus".into(),
                    outcome: "allow".into(),
                },
            ],
        });
        m.record(&Report {
            command: "ADD".into(),
            result: "7".into(),
            seconds: 0.3,
            delegates: vec![call("bridge", "success"), call("macvlan", "timeout")],
            hooks: vec![HookCall {
                hook: "isolation".into(),
                kind: "policy".into(),
                outcome: "deny".into(),
            }],
        });
        // Dropped or folded: an unknown command, a nonsense result, a plugin name that is not one.
        m.record(&Report {
            command: "BOGUS".into(),
            result: "success".into(),
            seconds: 0.1,
            delegates: vec![],
            hooks: vec![],
        });
        m.record(&Report {
            command: "DEL".into(),
            result: "pod-7f3a".into(),
            seconds: 0.1,
            delegates: vec![call("../../x y", "success")],
            hooks: vec![],
        });
        let text = to_classic(&m.openmetrics());
        let get = |s: &str| sample(&text, s).unwrap_or_else(|| panic!("{s}:\n{text}"));
        assert_eq!(
            get("plexus_cni_operations_total{command=\"ADD\",result=\"success\"}"),
            1.0
        );
        assert_eq!(
            get("plexus_cni_operations_total{command=\"ADD\",result=\"7\"}"),
            1.0
        );
        assert_eq!(
            get("plexus_cni_operations_total{command=\"DEL\",result=\"other\"}"),
            1.0
        );
        assert!(
            !text.contains("BOGUS") && !text.contains("pod-7f3a") && !text.contains("x y"),
            "{text}"
        );
        assert_eq!(
            get("plexus_delegate_operations_total{plugin=\"bridge\",command=\"ADD\",result=\"success\"}"),
            2.0
        );
        assert_eq!(
            get("plexus_delegate_operations_total{plugin=\"macvlan\",command=\"ADD\",result=\"timeout\"}"),
            1.0
        );
        assert_eq!(get("plexus_delegate_operations_total{plugin=\"other\",command=\"ADD\",result=\"success\"}"), 1.0);
        assert_eq!(
            get("plexus_cni_operation_duration_seconds_count{command=\"ADD\"}"),
            2.0
        );
        assert_eq!(
            get("plexus_hook_calls_total{hook=\"isolation\",kind=\"policy\",outcome=\"allow\"}"),
            1.0
        );
        assert_eq!(
            get("plexus_hook_calls_total{hook=\"isolation\",kind=\"policy\",outcome=\"deny\"}"),
            1.0
        );
        assert!(!text.contains("bogus"), "{text}");
        assert_eq!(
            get("plexus_cni_operation_duration_seconds_bucket{le=\"0.025\",command=\"ADD\"}"),
            1.0
        );
        assert_eq!(
            get("plexus_cni_operation_duration_seconds_bucket{le=\"+Inf\",command=\"ADD\"}"),
            2.0
        );
    }

    /// A NetworkHook's calls are counted under the name they run under (`networkhook/<name>`, an object name of
    /// up to 253 characters), as its module state is; a name that is not one counts as `other`.
    #[test]
    fn cluster_hooks_are_counted_under_their_names() {
        use plexus_cni::daemon::proto::{HookCall, Report};
        let m = Metrics::new();
        let long = format!("networkhook/deny-forbidden.{}", "x".repeat(100));
        let call = |hook: &str| HookCall {
            hook: hook.into(),
            kind: "policy".into(),
            outcome: "deny".into(),
        };
        m.record(&Report {
            command: "ADD".into(),
            result: "7".into(),
            seconds: 0.1,
            delegates: vec![],
            hooks: vec![call(&long), call("networkhook/Not_A/Name")],
        });
        let text = to_classic(&m.openmetrics());
        let get = |s: &str| sample(&text, s).unwrap_or_else(|| panic!("{s}:\n{text}"));
        let calls = |hook: &str| {
            get(&format!(
                "plexus_hook_calls_total{{hook=\"{hook}\",kind=\"policy\",outcome=\"deny\"}}"
            ))
        };
        assert_eq!(calls(&long), 1.0);
        assert_eq!(calls("other"), 1.0);
        assert!(!text.contains("Not_A"), "{text}");
    }

    #[test]
    fn past_max_plugins_distinct_plugin_names_are_counted_as_other() {
        use plexus_cni::daemon::proto::{DelegateCall, Report};
        let m = Metrics::new();
        let call = |plugin: &str, result: &str| DelegateCall {
            plugin: plugin.into(),
            command: "ADD".into(),
            result: result.into(),
            seconds: 0.002,
        };
        for i in 0..MAX_PLUGINS + 5 {
            m.record(&Report {
                command: "DEL".into(),
                result: "success".into(),
                seconds: 0.1,
                delegates: vec![call(&format!("p{i}"), "success")],
                hooks: vec![],
            });
        }
        let text = to_classic(&m.openmetrics());
        let plugins: std::collections::BTreeSet<&str> = text
            .lines()
            .filter(|l| l.starts_with("plexus_delegate_operations_total{"))
            .filter_map(|l| l.split('"').nth(1))
            .collect();
        assert_eq!(plugins.len(), MAX_PLUGINS + 1, "{plugins:?}");
    }

    #[test]
    fn a_scraper_asking_for_openmetrics_gets_it() {
        let m = Metrics::new();
        let (text, ct) = m.exposition(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
        ));
        assert_eq!(ct, OPENMETRICS);
        assert!(text.ends_with("# EOF\n"));
        let (text, ct) = m.exposition(Some("text/plain"));
        assert_eq!(ct, CLASSIC);
        assert!(!text.contains("# EOF"));
        let (_, ct) = m.exposition(None);
        assert_eq!(ct, CLASSIC);
    }
}
