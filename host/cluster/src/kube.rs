//! KubeCluster: pods and NetworkAttachmentDefinitions read from the Kubernetes API, network-status written back.
//!
//! The [`Cluster`] trait is synchronous, so a `KubeCluster` owns a current-thread tokio runtime and blocks on
//! each request. Nothing (runtime, configuration, client) is built until the first call needs it, so a CNI
//! invocation that never touches the API pays nothing for it.
//!
//! Every request has its own timeout, and every trait call a total deadline. Connection errors, timeouts and
//! the API server's 429, 500, 502, 503 and 504 answers are retried with exponential backoff until the
//! retries or the deadline run out, which yields [`ClusterError::Unavailable`] (CNI "try again later"). One
//! module makes every call that way for every method of [`KubeApi`] (`request.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod as KubePod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use plexus_core::spec::dra::{ClaimName, DeviceNetworkData, PodClaims};
use plexus_core::spec::objects::NETWORK_STATUS_ANNOTATION;
use plexus_core::spec::{NetworkAttachmentDefinition, Pod, PodClaimRef, PodRef};
use serde::{Deserialize, Serialize};

use crate::{Cluster, ClusterError, ObjectKind, PodEvent};

/// How Plexus talks to the Kubernetes API: the `cluster` object of a plexus conf with `"source": "kube"`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct KubeSettings {
    /// A kubeconfig file; without one, the in-cluster service account configuration is used.
    pub kubeconfig: Option<PathBuf>,
    /// Upper bound for one HTTP request, connection set-up included.
    pub request_timeout_ms: u64,
    /// Upper bound for one operation (a read or a write) with all its retries.
    pub deadline_ms: u64,
    /// How often a request failing transiently is retried (the first attempt not counted).
    pub retries: u32,
    /// Pause before the first retry; it doubles with every further retry.
    pub initial_backoff_ms: u64,
    /// Upper bound for the pause between two retries.
    pub max_backoff_ms: u64,
    /// How often the status patch is retried when the API server answers 409 Conflict.
    pub conflict_retries: u32,
    /// Post an `AddedInterface` Event on the pod for each attachment.
    pub events: bool,
    /// How long a call whose node credentials the API server refuses (401) waits for `plexus install` to write
    /// new ones (see [`KubeCluster`]); 0 fails at once.
    pub credentials_wait_ms: u64,
    /// The credentials are the node's CNI plugin's (its conf's kubeconfig, which `plexus install` wrote): a 401
    /// then names the uninstall step a deleted DaemonSet leaves undone. Not a key of the conf.
    #[serde(skip)]
    pub node_credentials: bool,
}

impl Default for KubeSettings {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            request_timeout_ms: 5000,
            deadline_ms: 20000,
            retries: 5,
            initial_backoff_ms: 200,
            max_backoff_ms: 3000,
            conflict_retries: 5,
            events: true,
            credentials_wait_ms: CREDENTIALS_WAIT.as_millis() as u64,
            node_credentials: false,
        }
    }
}

/// The environment variable kubelet sets in every pod; its absence means "not running in a cluster".
const SERVICE_HOST_ENV: &str = "KUBERNETES_SERVICE_HOST";
const NAD_GROUP: &str = "k8s.cni.cncf.io";
const NAD_PLURAL: &str = "network-attachment-definitions";
/// The reason of the event posted for each attachment (Multus's, so tooling that looks for it finds it).
pub const ADDED_INTERFACE: &str = "AddedInterface";

/// The largest API answer read whole (one object), and the largest envelope of a list. A pod or a NAD is a few
/// KiB; the largest objects Kubernetes stores are about 1.5 MiB (etcd's request limit). Lists and watches are
/// bounded per object instead ([`MAX_OBJECT_BYTES`]).
pub const MAX_RESPONSE_BYTES: usize = 4 << 20;
const COMPONENT: &str = "plexus";
/// How every request names its sender, so an API server's audit log can tell Plexus's traffic apart: the node
/// daemon's and the commands' ...
const USER_AGENT: &str = concat!("plexus/", env!("CARGO_PKG_VERSION"));
/// ... and the CNI plugin's (with the node's credentials, [`KubeSettings::node_credentials`]): an ADD's own reads.
const CNI_USER_AGENT: &str = concat!("plexus-cni/", env!("CARGO_PKG_VERSION"));
/// The field manager of every write, so managedFields tell Plexus's fields apart.
const FIELD_MANAGER: &str = "plexus";

mod bounded;
mod dra;
mod explain;
mod request;
mod resolve;
pub use bounded::{skipped_objects, MAX_OBJECT_BYTES};
pub use dra::{claim_from_kube, claim_status_patch, slice_devices, ClaimRead, DRA_API_VERSION};
#[cfg(feature = "watch")]
pub use explain::explain_watch;
pub use explain::{explain, Unreachable};
use request::{Failure, Op};
pub use resolve::{ConfigSource, KubectlSelection};

/// A cluster source backed by the Kubernetes API server, for a CNI process.
///
/// A call the API server refuses with the node's CNI credentials (401, [`ClusterError::CredentialsRefused`]) waits,
/// at most `credentialsWaitMs` ([`CREDENTIALS_WAIT`] by default), for the kubeconfig to be rewritten, and is then made once more with the new one.
/// Those credentials are the token of the plexus DaemonSet's pod, which `plexus install` writes: it dies with that
/// pod, and in a rolling update of the DaemonSet the next pod's installer writes its own a few seconds later. So an
/// ADD in that gap waits for the new token instead of failing; after a deletion of the DaemonSet without the
/// node's uninstall step, no new token comes and the error names that step.
pub struct KubeCluster {
    settings: KubeSettings,
    /// Built on first use; shared by every later call.
    conn: Mutex<Option<Arc<Connection>>>,
}

/// How long a call whose node credentials were refused waits for new ones by default (`credentialsWaitMs`, see
/// [`KubeCluster`]): a DaemonSet pod's replacement, its image present, starts in seconds; the kubelet gives a
/// sandbox's set-up two minutes.
pub const CREDENTIALS_WAIT: Duration = Duration::from_secs(60);

/// How often the kubeconfig is read while waiting for new credentials.
const CREDENTIALS_POLL: Duration = Duration::from_millis(200);

/// The most of a kubeconfig read to compare it (it is read in full, bounded, when the client is built).
const KUBECONFIG_MAX_BYTES: u64 = 1 << 20;

struct Connection {
    runtime: tokio::runtime::Runtime,
    api: KubeApi,
    /// The kubeconfig's bytes when the client was built (read just before it), to see it rewritten.
    kubeconfig: Option<Vec<u8>>,
}

/// The file at `path`, at most [`KUBECONFIG_MAX_BYTES`] of it; `None` if it cannot be read.
fn read_kubeconfig(path: &std::path::Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(KUBECONFIG_MAX_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

impl std::fmt::Debug for KubeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCluster")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The NetworkAttachmentDefinition custom resource (spec 3.2) as kube-rs sees it.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub(crate) struct NadObject {
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<NadSpec>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub(crate) struct NadSpec {
    #[serde(default)]
    config: Option<String>,
}

impl kube::Resource for NadObject {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "NetworkAttachmentDefinition".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        NAD_GROUP.into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        NAD_PLURAL.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// An error and its sources in one line: connection errors hide the useful part (refused, reset) deep down.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// `config` with the settings' bounds: retries are Plexus's own (bounded by the deadline; kube-rs's policy would
/// multiply them), the connection set-up bounded by the request timeout.
fn bounded(mut config: Config, settings: &KubeSettings) -> Config {
    config.default_retry = false;
    config.connect_timeout = Some(Duration::from_millis(settings.request_timeout_ms));
    config
}

impl KubeCluster {
    /// Checks the settings; builds nothing yet. Without a kubeconfig this must run inside a pod.
    pub fn new(settings: KubeSettings) -> Result<KubeCluster, ClusterError> {
        settings.validate()?;
        Ok(KubeCluster {
            settings,
            conn: Mutex::new(None),
        })
    }

    /// The settings this source was built with.
    pub fn settings(&self) -> &KubeSettings {
        &self.settings
    }

    fn connection(&self) -> Result<Arc<Connection>, ClusterError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(ClusterError::Invalid {
                what: "kube cluster source".into(),
                reason: "it blocks and cannot be called from inside an async runtime".into(),
            });
        }
        let mut slot = self
            .conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(conn) = slot.as_ref() {
            return Ok(conn.clone());
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClusterError::io("tokio runtime for the kube cluster source", &e))?;
        let kubeconfig = self
            .settings
            .kubeconfig
            .as_deref()
            .and_then(read_kubeconfig);
        // The client spawns its request buffer onto the runtime it is built in.
        let api = runtime.block_on(KubeApi::connect(self.settings.clone()))?;
        let conn = Arc::new(Connection {
            runtime,
            api,
            kubeconfig,
        });
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// Runs `call` on the connection; when the node's credentials are refused, waits for new ones (see
    /// [`KubeCluster`]) and runs it once more on a connection built from them.
    fn with_api<T, F, Fut>(&self, call: F) -> Result<T, ClusterError>
    where
        F: Fn(KubeApi) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClusterError>>,
    {
        let conn = self.connection()?;
        match conn.runtime.block_on(call(conn.api.clone())) {
            Err(refused @ ClusterError::CredentialsRefused { .. }) => {
                let wait = Duration::from_millis(self.settings.credentials_wait_ms);
                if !self.renewed_credentials(&conn, wait) {
                    return Err(refused);
                }
                tracing::info!(
                    "the node's credentials were rewritten; trying again with the new ones"
                );
                let conn = self.connection()?;
                conn.runtime.block_on(call(conn.api.clone()))
            }
            other => other,
        }
    }

    /// Waits, at most `wait`, until the kubeconfig differs from the one `conn` was built from; then drops `conn`,
    /// so that the next call builds a client from the new file. Whether it changed.
    fn renewed_credentials(&self, conn: &Arc<Connection>, wait: Duration) -> bool {
        let Some(path) = self.settings.kubeconfig.as_deref() else {
            return false;
        };
        tracing::warn!(kubeconfig = %path.display(), "the API server refused the node's credentials; waiting up to {} s for new ones", wait.as_secs());
        let deadline = std::time::Instant::now() + wait;
        loop {
            let now = read_kubeconfig(path);
            if now.is_some() && now != conn.kubeconfig {
                let mut slot = self
                    .conn
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
                    *slot = None;
                }
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(CREDENTIALS_POLL);
        }
    }
}

impl KubeSettings {
    fn validate(&self) -> Result<(), ClusterError> {
        self.validate_bounds()?;
        if self.kubeconfig.is_none() && std::env::var_os(SERVICE_HOST_ENV).is_none() {
            return Err(ClusterError::Invalid {
                what: "kube cluster settings".into(),
                reason: format!(
                    "no kubeconfig given and not running in a cluster ({SERVICE_HOST_ENV} is not set)"
                ),
            });
        }
        Ok(())
    }

    /// The time and retry bounds alone (an operator's command finds its kubeconfig as kubectl does).
    fn validate_bounds(&self) -> Result<(), ClusterError> {
        let invalid = |reason: String| ClusterError::Invalid {
            what: "kube cluster settings".into(),
            reason,
        };
        if self.request_timeout_ms == 0 {
            return Err(invalid("requestTimeoutMs must be greater than 0".into()));
        }
        if self.deadline_ms == 0 {
            return Err(invalid("deadlineMs must be greater than 0".into()));
        }
        if self.initial_backoff_ms > self.max_backoff_ms {
            return Err(invalid(format!(
                "initialBackoffMs ({}) is greater than maxBackoffMs ({})",
                self.initial_backoff_ms, self.max_backoff_ms
            )));
        }
        Ok(())
    }
}

/// The Kubernetes API as Plexus uses it, for async callers: the node daemon uses it directly, [`KubeCluster`]
/// blocks on it. Requests are bounded in time (per request and per operation, with retries) and in bytes.
/// Cloning is cheap and shares the connection pool.
#[derive(Clone)]
pub struct KubeApi {
    settings: KubeSettings,
    /// Everything but what `status_client` sends; watches too.
    client: Client,
    /// Pods' network-status writes, and reads of single ResourceClaims: what a person or a starting pod waits
    /// for, with a rate budget of its own (see ratelimit.rs); the same client when there are no budgets.
    status_client: Client,
    /// Events, paced by `event_bucket` before each attempt (see ratelimit.rs); the same client when there are no
    /// budgets.
    event_client: Client,
    event_bucket: Option<Arc<crate::ratelimit::TokenBucket>>,
    /// The API server's `host:port`, named in errors.
    server: Arc<str>,
}

impl KubeApi {
    /// Reads the configuration (kubeconfig or in-cluster) and builds the client; sends nothing yet.
    pub async fn connect(settings: KubeSettings) -> Result<KubeApi, ClusterError> {
        Self::connect_observed(settings, None, None).await
    }

    /// The same, with every request's verb, resource and answer told to `observer` (the daemon's metrics), and
    /// requests sent no faster than `rate` allows (the daemon's `--kube-api-qps` and `--kube-api-burst`).
    pub async fn connect_observed(
        settings: KubeSettings,
        observer: Option<crate::observe::RequestObserver>,
        rate: Option<crate::ratelimit::Rates>,
    ) -> Result<KubeApi, ClusterError> {
        settings.validate()?;
        let config = Self::config(&settings).await?;
        Self::with_config(settings, config, observer, rate)
    }

    /// For a person's command: the cluster found as kubectl finds it (see [`KubectlSelection`]); `settings`'
    /// kubeconfig is not used. Also says where the configuration came from.
    pub async fn connect_as_kubectl(
        settings: KubeSettings,
        selection: &KubectlSelection,
    ) -> Result<(KubeApi, ConfigSource), ClusterError> {
        settings.validate_bounds()?;
        let source = resolve::choose(selection, &resolve::Environment::of_process())?;
        let config = resolve::load(&source, selection).await?;
        let api = Self::with_config(settings.clone(), bounded(config, &settings), None, None)?;
        Ok((api, source))
    }

    fn with_config(
        settings: KubeSettings,
        config: Config,
        observer: Option<crate::observe::RequestObserver>,
        rate: Option<crate::ratelimit::Rates>,
    ) -> Result<KubeApi, ClusterError> {
        let server: Arc<str> = explain::server_of(&config.cluster_url).into();
        let agent = match settings.node_credentials {
            true => CNI_USER_AGENT,
            false => USER_AGENT,
        };
        let (client, status_client, event_client) =
            Self::clients_of(config, server.clone(), agent, observer, rate).map_err(|e| {
                ClusterError::Invalid {
                    what: "kube client configuration".into(),
                    reason: error_chain(&e),
                }
            })?;
        Ok(KubeApi {
            settings,
            client,
            status_client,
            event_client,
            event_bucket: rate.map(|r| Arc::new(crate::ratelimit::TokenBucket::new(r.events))),
            server,
        })
    }

    /// The API server's `host:port`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// An error of this client in words, naming the server.
    pub fn explain(&self, err: &kube::Error) -> String {
        explain::explain(&self.server, err)
    }

    /// The clients, for everything, for status writes and for events (the same one without `rate`; events' budget
    /// is taken by the caller, before the attempt's timeout starts): each its own token bucket over one stack of
    /// kube's layers (base URI, authentication, extra headers) over a hyper client (one connection pool) whose TCP
    /// connections have Nagle's algorithm off.
    ///
    /// kube's own builder makes its connector with Nagle on. A request then waits for the server's delayed ACK
    /// whenever it is written in two pieces (the TLS handshake's last flight and the first request; a request's
    /// head and its body): 40 ms on Linux. A CNI process in thin mode opens a new connection for every ADD, so
    /// that was 40 ms of each (docs/benchmarks.md). The stack is otherwise what the builder makes with this
    /// configuration (rustls, the connect/read/write timeouts; no retry layer, as `default_retry` is off).
    fn clients_of(
        config: kube::Config,
        server: Arc<str>,
        user_agent: &'static str,
        observer: Option<crate::observe::RequestObserver>,
        rate: Option<crate::ratelimit::Rates>,
    ) -> Result<(Client, Client, Client), kube::Error> {
        use kube::client::ConfigExt;
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        let https = config.rustls_https_connector_with_connector(http)?;
        let mut connector = hyper_timeout::TimeoutConnector::new(https);
        connector.set_connect_timeout(config.connect_timeout);
        connector.set_read_timeout(config.read_timeout);
        connector.set_write_timeout(config.write_timeout);
        connector.set_reset_reader_on_write(config.reset_reader_on_write);
        let hyper =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(connector);
        let service = tower::ServiceBuilder::new()
            .layer(config.base_uri_layer())
            .option_layer(config.auth_layer()?)
            .layer(config.extra_headers_layer()?)
            .layer(tower::util::MapRequestLayer::new(
                move |mut request: http::Request<kube::client::Body>| {
                    request.headers_mut().insert(
                        http::header::USER_AGENT,
                        http::HeaderValue::from_static(user_agent),
                    );
                    request
                },
            ))
            // Every answer is bounded in bytes as well as time: per object in lists and watches (an object over
            // the bound is left out), whole for anything else (see bounded.rs).
            .layer(bounded::BoundLayer)
            // A request that does not reach the server fails in words naming the server and the cause.
            .map_err(
                move |e: hyper_util::client::legacy::Error| -> tower::BoxError {
                    Box::new(explain::Unreachable::new(server.clone(), &e))
                },
            )
            // Innermost: every attempt is counted once, retries included, with its own answer.
            .option_layer(observer.map(crate::observe::ObserveLayer))
            .service(hyper);
        // Outermost: every attempt waits for its client's token (retries too), before it is counted and sent.
        let client = |limit: Option<crate::ratelimit::RateLimit>| {
            let limited = tower::ServiceBuilder::new()
                .option_layer(limit.map(crate::ratelimit::RateLimitLayer::new))
                .service(service.clone());
            Client::new(limited, config.default_namespace.clone())
        };
        Ok(match rate {
            Some(rates) => (
                client(Some(rates.background)),
                client(Some(rates.status)),
                client(None),
            ),
            None => {
                let one = client(None);
                (one.clone(), one.clone(), one)
            }
        })
    }

    /// The client, for watches.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The settings the client was built with.
    pub fn settings(&self) -> &KubeSettings {
        &self.settings
    }

    async fn config(settings: &KubeSettings) -> Result<Config, ClusterError> {
        let config = match &settings.kubeconfig {
            Some(path) => {
                let what = || format!("kubeconfig {}", path.display());
                let kubeconfig =
                    Kubeconfig::read_from(path).map_err(|e| ClusterError::Invalid {
                        what: what(),
                        reason: error_chain(&e),
                    })?;
                Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                    .await
                    .map_err(|e| ClusterError::Invalid {
                        what: what(),
                        reason: error_chain(&e),
                    })?
            }
            None => Config::incluster().map_err(|e| ClusterError::Invalid {
                what: "in-cluster kube configuration".into(),
                reason: error_chain(&e),
            })?,
        };
        Ok(bounded(config, settings))
    }

    /// Posts an event on the pod (one attempt), reported as from `node` (`reportingInstance`, `source.host`: the
    /// node-authority policy lets a node's identity post events as that node only); the new event's name.
    pub async fn post_event(
        &self,
        pod: &PodRef,
        node: Option<&str>,
        kind: (&str, &str),
        message: &str,
    ) -> Result<String, ClusterError> {
        let object = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            uid: pod.uid.clone(),
            ..ObjectReference::default()
        };
        self.post_event_about(object, kind, message, (COMPONENT, node))
            .await
    }

    /// Posts an event about any object (one attempt), reported by `component` (on `host`, when given): in the
    /// object's namespace, or in `default` for a cluster-scoped one. The new event's name.
    pub async fn post_event_about(
        &self,
        object: ObjectReference,
        (type_, reason): (&str, &str),
        message: &str,
        (component, host): (&str, Option<&str>),
    ) -> Result<String, ClusterError> {
        let namespace = object.namespace.clone().unwrap_or_else(|| "default".into());
        let name = object.name.clone().unwrap_or_default();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{name}.")),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: object,
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some(type_.into()),
            source: Some(EventSource {
                component: Some(component.into()),
                host: host.map(str::to_string),
            }),
            reporting_component: Some(component.into()),
            reporting_instance: host.map(str::to_string),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            ..Event::default()
        };
        let api: Api<Event> = Api::namespaced(self.event_client.clone(), &namespace);
        let op = Op {
            verb: "create",
            resource: "events",
            group: "",
            namespace: &namespace,
            name: &name,
        };
        // Best effort: one attempt, so a slow API server cannot stretch the ADD with an event nobody awaits.
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        self.event_token().await;
        self.call(&op, self.one_try(), || api.create(&params, &event))
            .await
            .map(|e| e.metadata.name.unwrap_or_default())
            .map_err(|f| self.generic(&op, ObjectKind::Event, f))
    }

    /// Waits for an event's token, when events have a budget; outside the attempt, whose timeout starts after.
    async fn event_token(&self) {
        if let Some(bucket) = &self.event_bucket {
            bucket.acquire().await;
        }
    }

    /// An event seen again: its `count` set to `count` and its `lastTimestamp` to now, as kubelet aggregates a
    /// repeated event instead of creating another object (one attempt, best effort). It never waits for the events'
    /// budget: without a token at hand it sends nothing (the next repeat sends the count then reached), so that new
    /// events never queue behind the counts of old ones.
    pub async fn count_event(
        &self,
        namespace: &str,
        name: &str,
        count: i32,
    ) -> Result<(), ClusterError> {
        let api: Api<Event> = Api::namespaced(self.event_client.clone(), namespace);
        let op = Op {
            verb: "patch",
            resource: "events",
            group: "",
            namespace,
            name,
        };
        let body = serde_json::json!({
            "count": count,
            "lastTimestamp": Time(k8s_openapi::jiff::Timestamp::now()),
        });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        let patch = Patch::Merge(&body);
        if self.event_bucket.as_ref().is_some_and(|b| !b.try_take()) {
            tracing::debug!(
                event = name,
                count,
                "the events' budget is spent: the count waits for a repeat"
            );
            return Ok(());
        }
        self.call(&op, self.one_try(), || api.patch(name, &params, &patch))
            .await
            .map(drop)
            .map_err(|f| self.generic(&op, ObjectKind::Event, f))
    }

    /// The pod; when `pod.uid` is set, a pod with another UID is [`ClusterError::UidMismatch`].
    pub async fn pod(&self, pod: &PodRef) -> Result<Pod, ClusterError> {
        let api: Api<KubePod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let op = Op {
            verb: "get",
            resource: "pods",
            group: "",
            namespace: &pod.namespace,
            name: &pod.name,
        };
        let found = self
            .call(&op, self.tries(), || api.get(&pod.name))
            .await
            .map_err(|f| self.generic(&op, ObjectKind::Pod, f))?;
        let mut found = pod_from_kube(found);
        if found.namespace.is_empty() {
            found.namespace = pod.namespace.clone();
        }
        if let Some(expected) = &pod.uid {
            let actual = found.uid.clone().unwrap_or_default();
            if *expected != actual {
                return Err(ClusterError::UidMismatch {
                    pod: pod.to_string(),
                    expected: expected.clone(),
                    actual,
                });
            }
        }
        Ok(found)
    }

    /// Every object `api` reaches, 500 a page; each page bounded and retried as every call is (an operator's
    /// command reads the whole cluster this way; the node never does).
    pub async fn list_all<K>(
        &self,
        api: &Api<K>,
        resource: &'static str,
        group: &'static str,
    ) -> Result<Vec<K>, ClusterError>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        self.list_in(api, (resource, group), "").await
    }

    /// The same for `api` made for one namespace, named in errors (empty: the whole cluster).
    pub async fn list_in<K>(
        &self,
        api: &Api<K>,
        (resource, group): (&'static str, &'static str),
        namespace: &str,
    ) -> Result<Vec<K>, ClusterError>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let op = Op {
            verb: "list",
            resource,
            group,
            namespace,
            name: "",
        };
        self.list_pages(api, &op, ListParams::default(), usize::MAX)
            .await
            .map_err(|f| match f {
                // No object is missing: the kind is (its CRD not applied).
                Failure::Api(status) if status.code == 404 => ClusterError::Invalid {
                    what: op.describe(),
                    reason: format!("the API server does not serve it (404): {}", status.message),
                },
                f => self.generic(&op, ObjectKind::Pod, f),
            })
    }

    /// Every object of `api`'s list with `params`, 500 a page, each page bounded and retried as every call is;
    /// more than `max_items` fails.
    async fn list_pages<K>(
        &self,
        api: &Api<K>,
        op: &Op<'_>,
        params: ListParams,
        max_items: usize,
    ) -> Result<Vec<K>, Failure>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let mut params = params.limit(500);
        let mut all = Vec::new();
        loop {
            let page = self.call(op, self.tries(), || api.list(&params)).await?;
            all.extend(page.items);
            if all.len() > max_items {
                return Err(Failure::Broken(format!(
                    "more than {max_items} objects listed; refusing to read further"
                )));
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(next) => params = params.continue_token(&next),
                None => return Ok(all),
            }
        }
    }

    /// The cluster-scoped object `name` of `api`, or none; bounded and retried as every call is.
    pub async fn get_cluster_scoped<K>(
        &self,
        api: &Api<K>,
        (resource, group): (&'static str, &'static str),
        name: &str,
    ) -> Result<Option<K>, ClusterError>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let op = Op {
            verb: "get",
            resource,
            group,
            namespace: "",
            name,
        };
        match self.call(&op, self.tries(), || api.get(name)).await {
            Ok(found) => Ok(Some(found)),
            Err(Failure::Api(status)) if status.code == 404 => Ok(None),
            Err(f) => Err(self.generic(&op, ObjectKind::Pod, f)),
        }
    }

    /// Applies `body` to the cluster-scoped object `name` of `api` (server-side apply, forced, as `manager`);
    /// `resource` is the RBAC resource, with its subresource when the apply is to that (`networkhooks/status`).
    /// Tried as every call is: a writer that keeps what it writes and tries it again itself calls it on
    /// [`KubeApi::without_retries`]. A 404 is an [`ClusterError::Invalid`] answer: an apply creates a missing
    /// object, so the resource is not served (its CRD is missing) or, for a subresource, the object is gone.
    pub async fn apply_cluster_scoped(
        &self,
        api: &Api<kube::api::DynamicObject>,
        (resource, group): (&'static str, &'static str),
        name: &str,
        (manager, body): (&str, &serde_json::Value),
    ) -> Result<(), ClusterError> {
        let op = Op {
            verb: "patch",
            resource,
            group,
            namespace: "",
            name,
        };
        let params = PatchParams::apply(manager).force();
        let patch = Patch::Apply(body);
        let sent = self
            .call(&op, self.tries(), || async {
                match resource.split_once('/') {
                    Some((_, sub)) => api.patch_subresource(sub, name, &params, &patch).await,
                    None => api.patch(name, &params, &patch).await,
                }
            })
            .await;
        match sent {
            Ok(_) => Ok(()),
            Err(Failure::Api(status)) if status.code == 404 => Err(ClusterError::Invalid {
                what: op.describe(),
                reason: format!(
                    "the server {} answered 404 Not Found: it does not serve {resource} (API group \
                     {group:?}), or the object is gone",
                    self.server
                ),
            }),
            // Every other answer is the generic one (the object kind only names a 404's object).
            Err(f) => Err(self.generic(&op, ObjectKind::Pod, f)),
        }
    }

    /// The namespaced resource's API in `namespace`, or across the cluster without one.
    fn api_in<K>(&self, namespace: Option<&str>) -> Api<K>
    where
        K: kube::Resource<Scope = NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }

    /// Every NetworkAttachmentDefinition of `namespace` (of the cluster without one), as planning sees them.
    pub async fn nads(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<NetworkAttachmentDefinition>, ClusterError> {
        let api: Api<NadObject> = self.api_in(namespace);
        let found = self
            .list_in(&api, (NAD_PLURAL, NAD_GROUP), namespace.unwrap_or(""))
            .await?;
        Ok(found.into_iter().map(nad_from_kube).collect())
    }

    /// Every pod of `namespace` (of the cluster without one), as planning sees them.
    pub async fn pods(&self, namespace: Option<&str>) -> Result<Vec<Pod>, ClusterError> {
        let api: Api<KubePod> = self.api_in(namespace);
        let found = self
            .list_in(&api, ("pods", ""), namespace.unwrap_or(""))
            .await?;
        Ok(found
            .into_iter()
            .map(|p| pod_from_meta(p.metadata))
            .collect())
    }

    /// The NetworkAttachmentDefinition `namespace/name`.
    pub async fn nad(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<NetworkAttachmentDefinition, ClusterError> {
        let api: Api<NadObject> = Api::namespaced(self.client.clone(), namespace);
        let op = Op {
            verb: "get",
            resource: NAD_PLURAL,
            group: NAD_GROUP,
            namespace,
            name,
        };
        let found = self
            .call(&op, self.tries(), || api.get(name))
            .await
            .map_err(|f| self.generic(&op, ObjectKind::NetworkAttachmentDefinition, f))?;
        let mut nad = nad_from_kube(found);
        // Answers normally carry both; the request's own names are the fallback.
        if nad.namespace.is_empty() {
            nad.namespace = namespace.into();
        }
        if nad.name.is_empty() {
            nad.name = name.into();
        }
        Ok(nad)
    }

    /// Publishes the network-status annotation value with a merge patch of `pods/status`.
    pub async fn write_status(
        &self,
        pod: &PodRef,
        network_status: &str,
    ) -> Result<(), ClusterError> {
        let api: Api<KubePod> = Api::namespaced(self.status_client.clone(), &pod.namespace);
        let op = Op {
            verb: "patch",
            resource: "pods/status",
            group: "",
            namespace: &pod.namespace,
            name: &pod.name,
        };
        let patch_body = status_patch(network_status);
        let patch = Patch::Merge(&patch_body);
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        let sent = self
            .call(&op, self.tries_with_conflicts(), || {
                api.patch_status(&pod.name, &params, &patch)
            })
            .await;
        match sent {
            Ok(_) => Ok(()),
            Err(Failure::Api(status)) if status.code == 404 => {
                tracing::warn!(pod = %pod, "pod vanished before its network-status could be written");
                Ok(())
            }
            Err(failure) => Err(self.generic(&op, ObjectKind::Pod, failure)),
        }
    }
}

/// kubectl's copy of the whole object as last applied: the largest annotation a pod or NAD commonly carries (a
/// NAD's holds its whole config a second time), and not one planning or a hook has a use for. Dropped from
/// every pod and NAD Plexus reads, whether from a GET or a watch. (`managedFields` never gets this far: only
/// the fields planning reads are copied out of the object.)
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// An object's annotations as planning keeps them: without [`LAST_APPLIED`].
fn kept_annotations(annotations: Option<BTreeMap<String, String>>) -> BTreeMap<String, String> {
    let mut annotations = annotations.unwrap_or_default();
    annotations.remove(LAST_APPLIED);
    annotations
}

/// The pod as planning sees it: identity, labels and annotations from its metadata.
/// The pod as planning reads it, with its node and its claims (each of `spec.resourceClaims[]` with the claim it
/// names, or the one `status.resourceClaimStatuses[]` says was made from its template).
pub(crate) fn pod_from_kube(found: KubePod) -> Pod {
    let spec = found.spec.unwrap_or_default();
    let made: BTreeMap<String, Option<String>> = found
        .status
        .and_then(|s| s.resource_claim_statuses)
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.name, c.resource_claim_name))
        .collect();
    let resource_claims = spec
        .resource_claims
        .unwrap_or_default()
        .into_iter()
        .map(|r| {
            let claim = r
                .resource_claim_name
                .or_else(|| made.get(&r.name).cloned().flatten());
            PodClaimRef {
                name: r.name,
                claim,
            }
        })
        .collect();
    Pod {
        node_name: spec.node_name,
        resource_claims,
        ..pod_from_meta(found.metadata)
    }
}

pub(crate) fn pod_from_meta(meta: ObjectMeta) -> Pod {
    let annotations = kept_annotations(meta.annotations);
    Pod {
        namespace: meta.namespace.unwrap_or_default(),
        name: meta.name.unwrap_or_default(),
        uid: meta.uid,
        labels: meta.labels.unwrap_or_default(),
        annotations,
        ..Pod::default()
    }
}

/// The NAD as planning sees it; an empty config is no config (spec 3.4.1).
pub(crate) fn nad_from_kube(found: NadObject) -> NetworkAttachmentDefinition {
    let config = found
        .spec
        .and_then(|s| s.config)
        .filter(|c| !c.trim().is_empty());
    NetworkAttachmentDefinition {
        namespace: found.metadata.namespace.unwrap_or_default(),
        name: found.metadata.name.unwrap_or_default(),
        config,
        annotations: kept_annotations(found.metadata.annotations),
    }
}

/// The merge patch that sets the network-status annotation and touches nothing else.
fn status_patch(network_status: &str) -> serde_json::Value {
    let annotations: BTreeMap<&str, &str> = [(NETWORK_STATUS_ANNOTATION, network_status)].into();
    serde_json::json!({ "metadata": { "annotations": annotations } })
}

impl Cluster for KubeCluster {
    fn pod(&self, pod: &PodRef) -> Result<Pod, ClusterError> {
        self.with_api(|api| async move { api.pod(pod).await })
    }

    fn nad(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<NetworkAttachmentDefinition, ClusterError> {
        self.with_api(|api| async move { api.nad(namespace, name).await })
    }

    fn write_status(&self, pod: &PodRef, network_status: &str) -> Result<(), ClusterError> {
        self.with_api(|api| async move { api.write_status(pod, network_status).await })
    }

    fn pod_claims(&self, pod: &Pod) -> Result<PodClaims, ClusterError> {
        self.with_api(|api| async move { api.pod_claims(pod).await })
    }

    fn write_claim_status(
        &self,
        _pod: &PodRef,
        claim: &ClaimName,
        devices: &[DeviceNetworkData],
    ) -> Result<(), ClusterError> {
        self.with_api(|api| async move { api.apply_claim_status(claim, devices).await })
    }

    /// Posted as from the event's node, best effort (one attempt, failures logged).
    fn record(&self, event: &PodEvent<'_>) -> Result<(), ClusterError> {
        if !self.settings.events {
            return Ok(());
        }
        let conn = self.connection()?;
        let kind = (
            if event.warning { "Warning" } else { "Normal" },
            event.reason,
        );
        let posted = conn
            .api
            .post_event(event.pod, event.node, kind, event.message);
        if let Err(err) = conn.runtime.block_on(posted) {
            tracing::warn!(pod = %event.pod, error = %err, "could not post the {} event", event.reason);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TCP_NODELAY of this process's connection to `peer`, if it has one.
    #[allow(unsafe_code)]
    fn nodelay_of_connection_to(peer: std::net::SocketAddr) -> Option<bool> {
        for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
            let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let is_socket = std::fs::read_link(entry.path())
                .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"));
            if !is_socket {
                continue;
            }
            // SAFETY: getpeername and getsockopt write at most the lengths given into the locals passed; a
            // descriptor closed meanwhile only makes them fail.
            unsafe {
                let mut addr: libc::sockaddr_in = std::mem::zeroed();
                let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                if libc::getpeername(fd, &mut addr as *mut _ as *mut libc::sockaddr, &mut len) != 0
                    || i32::from(addr.sin_family) != libc::AF_INET
                    || u16::from_be(addr.sin_port) != peer.port()
                {
                    continue;
                }
                let mut on: libc::c_int = 0;
                let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                if libc::getsockopt(
                    fd,
                    libc::IPPROTO_TCP,
                    libc::TCP_NODELAY,
                    &mut on as *mut _ as *mut libc::c_void,
                    &mut len,
                ) == 0
                {
                    return Some(on != 0);
                }
            }
        }
        None
    }

    /// The lines of one HTTP request's head read from `conn` (up to the empty line), without their line ends.
    fn request_head(conn: &std::net::TcpStream) -> Vec<String> {
        use std::io::BufRead;
        let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" || line.is_empty() {
                return head;
            }
            head.push(line.trim_end().to_string());
        }
    }

    #[test]
    fn the_client_connects_with_nagle_off_and_keeps_kube_s_layers() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // One connection: the request's head is read and answered, and the connection is held open (kept
        // alive in the client's pool) until the test has looked at it.
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let server = std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            seen_tx.send(request_head(&conn)).unwrap();
            let mut conn = conn;
            conn.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
            )
            .unwrap();
            let _ = done_rx.recv_timeout(std::time::Duration::from_secs(10));
        });
        let mut config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        config.auth_info.token = Some("t0ken".to_string().into());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let body = runtime.block_on(async {
            let (client, _, _) =
                KubeApi::clients_of(config, "test:0".into(), USER_AGENT, None, None).unwrap();
            let text = client
                .request_text(http::Request::get("/version").body(Vec::new()).unwrap())
                .await
                .unwrap();
            (text, nodelay_of_connection_to(addr))
        });
        done_tx.send(()).unwrap();
        server.join().unwrap();
        assert_eq!(body.0, "{}");
        assert_eq!(
            body.1,
            Some(true),
            "the connection must have TCP_NODELAY set"
        );
        let head = seen_rx.recv().unwrap();
        assert_eq!(head[0], "GET /version HTTP/1.1");
        // kube's authentication layer and ours are in the stack.
        let has = |h: &str| head.iter().any(|l| l.to_ascii_lowercase() == h);
        assert!(has("authorization: bearer t0ken"), "{head:?}");
        assert!(
            has(&format!("user-agent: {}", USER_AGENT.to_ascii_lowercase())),
            "{head:?}"
        );
    }

    /// The CNI process's requests and the daemon's share one service account: the User-Agent is how an audit log
    /// (or an API server's metrics) tells them apart.
    #[test]
    fn the_cni_process_and_the_daemon_name_themselves_apart() {
        use std::io::Write;
        for (node_credentials, agent) in [(true, CNI_USER_AGENT), (false, USER_AGENT)] {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let server = std::thread::spawn(move || {
                let (mut conn, _) = listener.accept().unwrap();
                let head: Vec<String> = request_head(&conn)
                    .iter()
                    .map(|l| l.to_ascii_lowercase())
                    .collect();
                conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                    .unwrap();
                head
            });
            let settings = KubeSettings {
                node_credentials,
                ..KubeSettings::default()
            };
            let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let api = KubeApi::with_config(settings, config, None, None).unwrap();
                api.client()
                    .request_text(http::Request::get("/version").body(Vec::new()).unwrap())
                    .await
                    .unwrap();
            });
            let head = server.join().unwrap();
            let said = format!("user-agent: {}", agent.to_ascii_lowercase());
            assert!(head.contains(&said), "{node_credentials}: {head:?}");
        }
        assert!(CNI_USER_AGENT.starts_with("plexus-cni/") && USER_AGENT.starts_with("plexus/"));
    }

    #[test]
    fn settings_defaults_and_camel_case() {
        let s: KubeSettings = serde_json::from_str("{}").unwrap();
        assert_eq!(s, KubeSettings::default());
        assert_eq!(
            (s.request_timeout_ms, s.deadline_ms, s.events),
            (5000, 20000, true)
        );
        let s: KubeSettings = serde_json::from_str(
            r#"{"kubeconfig":"/k","requestTimeoutMs":10,"deadlineMs":50,"retries":1,"conflictRetries":2,"events":false}"#,
        )
        .unwrap();
        assert_eq!(s.kubeconfig.as_deref(), Some(std::path::Path::new("/k")));
        assert_eq!(
            (
                s.request_timeout_ms,
                s.deadline_ms,
                s.retries,
                s.conflict_retries
            ),
            (10, 50, 1, 2)
        );
        assert!(!s.events);
    }

    #[test]
    fn settings_reject_typos() {
        let err = serde_json::from_str::<KubeSettings>(r#"{"requestTimeout":10}"#).unwrap_err();
        assert!(err.to_string().contains("requestTimeout"), "{err}");
    }

    #[test]
    fn settings_fit_a_tagged_cluster_object() {
        // The plexus conf's `cluster` object carries `"source"` beside these keys.
        #[derive(Deserialize)]
        #[serde(tag = "source", rename_all = "lowercase")]
        enum Source {
            Kube(KubeSettings),
        }
        let Source::Kube(s) =
            serde_json::from_str(r#"{"source":"kube","kubeconfig":"/k","retries":2}"#).unwrap();
        assert_eq!(s.retries, 2);
    }

    #[test]
    fn new_validates_settings() {
        let with = |f: fn(&mut KubeSettings)| {
            let mut s = KubeSettings {
                kubeconfig: Some("/nonexistent".into()),
                ..KubeSettings::default()
            };
            f(&mut s);
            KubeCluster::new(s)
        };
        assert!(
            with(|_| {}).is_ok(),
            "a missing kubeconfig is only read on first use"
        );
        let err = with(|s| s.request_timeout_ms = 0).unwrap_err().to_string();
        assert!(err.contains("requestTimeoutMs"), "{err}");
        let err = with(|s| s.initial_backoff_ms = s.max_backoff_ms + 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("initialBackoffMs"), "{err}");
    }

    #[test]
    fn missing_kubeconfig_is_reported_on_first_use() {
        let c = KubeCluster::new(KubeSettings {
            kubeconfig: Some("/nonexistent/kubeconfig".into()),
            ..KubeSettings::default()
        })
        .unwrap();
        let err = c.nad("ns", "n").unwrap_err().to_string();
        assert!(
            err.starts_with("invalid kubeconfig /nonexistent/kubeconfig"),
            "{err}"
        );
    }

    /// An API server that answers with pod team/web to `Bearer new` and 401 to anything else; the requests it got.
    fn token_server() -> (String, Arc<Mutex<Vec<String>>>) {
        request::tests::server_deciding(Arc::new(|head: &[String]| {
            let authorized = head
                .iter()
                .any(|h| h.eq_ignore_ascii_case("authorization: bearer new"));
            if authorized {
                200
            } else {
                401
            }
        }))
    }

    fn kubeconfig(url: &str, token: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{url}\"}}}}]\n\
             users: [{{name: u, user: {{token: {token}}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\n\
             current-context: x\n"
        )
    }

    fn node_cluster(path: &std::path::Path, wait: Duration) -> KubeCluster {
        KubeCluster::new(KubeSettings {
            kubeconfig: Some(path.to_path_buf()),
            node_credentials: true,
            events: false,
            credentials_wait_ms: wait.as_millis() as u64,
            ..KubeSettings::default()
        })
        .unwrap()
    }

    #[test]
    fn refused_node_credentials_wait_for_the_installer_to_write_new_ones() {
        let (url, seen) = token_server();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plexus.kubeconfig");
        std::fs::write(&path, kubeconfig(&url, "old")).unwrap();
        let cluster = node_cluster(&path, Duration::from_secs(30));
        let writer = {
            let (path, url) = (path.clone(), url.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(500));
                std::fs::write(&path, kubeconfig(&url, "new")).unwrap();
            })
        };
        let started = std::time::Instant::now();
        let web = PodRef {
            namespace: "team".into(),
            name: "web".into(),
            uid: None,
        };
        let pod = cluster
            .pod(&web)
            .expect("answered once the new token is written");
        writer.join().unwrap();
        assert_eq!(pod.uid.as_deref(), Some("u1"));
        assert!(
            started.elapsed() >= Duration::from_millis(500),
            "it waited for the rewrite"
        );
        assert_eq!(
            seen.lock().unwrap().len(),
            2,
            "the 401, then one call with the new token"
        );
    }

    #[test]
    fn refused_node_credentials_that_nobody_renews_fail_naming_the_uninstall_step() {
        let (url, seen) = token_server();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plexus.kubeconfig");
        std::fs::write(&path, kubeconfig(&url, "old")).unwrap();
        let cluster = node_cluster(&path, Duration::from_millis(600));
        let web = PodRef {
            namespace: "team".into(),
            name: "web".into(),
            uid: None,
        };
        let started = std::time::Instant::now();
        let err = cluster.pod(&web).unwrap_err();
        assert!(
            matches!(err, ClusterError::CredentialsRefused { .. }),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("plexus install --uninstall"),
            "{err}"
        );
        assert!(
            started.elapsed() >= Duration::from_millis(600),
            "it waited its bound"
        );
        assert_eq!(
            seen.lock().unwrap().len(),
            1,
            "not asked again with the same token"
        );
    }

    #[test]
    fn status_patch_sets_only_the_annotation() {
        let patch = status_patch(r#"[{"name":"x"}]"#);
        assert_eq!(
            patch.to_string(),
            r#"{"metadata":{"annotations":{"k8s.v1.cni.cncf.io/network-status":"[{\"name\":\"x\"}]"}}}"#
        );
    }
}
