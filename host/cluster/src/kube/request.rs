//! One call to the API server as every method of [`KubeApi`] makes it: what it is for ([`Op`]), each attempt's
//! timeout, the retries with the one [`Backoff`], and what a failure means ([`Failure`], then a [`ClusterError`]).
//!
//! Retrying happens here or in a durable writer above, never in both. A caller that keeps what it writes and
//! tries it again itself (the node daemon's status queue) uses [`KubeApi::without_retries`]: each call is one
//! attempt, and a transient failure comes back at once as [`ClusterError::Unavailable`]. Every other caller (a CNI
//! process in thin mode, an operator's command, the daemon's reads for an ADD that waits) has its transient
//! failures retried here until the settings' retries or the call's deadline run out. A write for which the API
//! server's 409 Conflict means "again" (the network-status patch) has its conflicts retried in the same loop,
//! counted apart, with the same backoff.

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{error_chain, explain, KubeApi};
use crate::backoff::Backoff;
use crate::{ClusterError, ObjectKind};

/// What a request was for, so that errors can name the object and the permission involved.
pub(crate) struct Op<'a> {
    pub verb: &'static str,
    /// The RBAC resource, with its subresource (`pods/status`).
    pub resource: &'static str,
    /// The API group; empty for the core group.
    pub group: &'static str,
    pub namespace: &'a str,
    pub name: &'a str,
}

impl Op<'_> {
    pub fn forbidden(&self, server: &str) -> ClusterError {
        let group = if self.group.is_empty() {
            "core".to_string()
        } else {
            format!("{:?}", self.group)
        };
        let scope = if self.namespace.is_empty() {
            "across the cluster".to_string()
        } else {
            format!("in namespace {:?}", self.namespace)
        };
        ClusterError::forbidden(format!(
            "missing permission to {} {} (API group {group}) {scope} on the server {server}",
            self.verb, self.resource
        ))
    }

    /// The error for the server's `status` answer to this request (one with no more specific meaning for it).
    pub fn answered(
        &self,
        server: &str,
        object: ObjectKind,
        status: &kube::core::Status,
    ) -> ClusterError {
        // RBAC let the request through and admission refused it (the node-authority policy, say): the policy and
        // its reason, not a permission to grant.
        if let Some(denial) = explain::Denial::of(&status.message) {
            tracing::warn!(request = %self.describe(), server, message = %status.message, "refused by admission control");
            return ClusterError::forbidden(format!(
                "{}: {}",
                self.describe(),
                denial.words(server)
            ));
        }
        match status.code {
            404 => ClusterError::NotFound {
                object,
                namespace: self.namespace.into(),
                name: self.name.into(),
            },
            403 => {
                tracing::warn!(request = %self.describe(), server, message = %status.message, "forbidden");
                self.forbidden(server)
            }
            401 => ClusterError::forbidden(format!(
                "the server {server} rejected the credentials (401 Unauthorized) for {}",
                self.describe()
            )),
            code => ClusterError::Invalid {
                what: self.describe(),
                reason: format!(
                    "API server answered {code} {}: {}",
                    status.reason, status.message
                ),
            },
        }
    }

    pub fn describe(&self) -> String {
        match (self.namespace, self.name) {
            ("", "") => format!("{} {}", self.verb, self.resource),
            ("", name) => format!("{} {} {name}", self.verb, self.resource),
            (ns, name) => format!("{} {} {ns}/{name}", self.verb, self.resource),
        }
    }
}

/// Why a call did not succeed.
pub(crate) enum Failure {
    /// The API server answered with a status that retrying does not change.
    Api(Box<kube::core::Status>),
    /// Retries or the deadline ran out; the text says what went wrong last.
    Exhausted(String),
    /// The request could not be made or its answer not understood.
    Broken(String),
}

/// What one call may try: attempts until `deadline`, `retries` more after a transient failure, and `conflicts`
/// more after a 409 where the operation takes it as "again" (`None`: a 409 is the answer).
#[derive(Clone, Copy)]
pub(crate) struct Tries {
    pub deadline: Instant,
    pub retries: u32,
    pub conflicts: Option<u32>,
}

impl Tries {
    /// The same, a 409 Conflict tried again at most `conflicts` times.
    pub fn with_conflicts(self, conflicts: u32) -> Tries {
        Tries {
            conflicts: Some(conflicts),
            ..self
        }
    }
}

/// One attempt's outcome, when it is not the answer.
enum Attempt {
    /// Worth another attempt.
    Transient(String),
    /// A 409 Conflict.
    Conflict,
    Final(Failure),
}

fn classify(err: kube::Error, conflicts_retried: bool) -> Attempt {
    match err {
        kube::Error::Api(status) if matches!(status.code, 429 | 500 | 502 | 503 | 504) => {
            Attempt::Transient(format!(
                "API server answered {} {}",
                status.code, status.reason
            ))
        }
        kube::Error::Api(status) if status.code == 409 && conflicts_retried => Attempt::Conflict,
        kube::Error::Api(status) => Attempt::Final(Failure::Api(status)),
        kube::Error::HyperError(e) => Attempt::Transient(format!("connection error: {e}")),
        // In words already, naming the server (see explain::Unreachable).
        kube::Error::Service(e) => Attempt::Transient(error_chain(&*e)),
        kube::Error::SerdeError(e) => {
            Attempt::Final(Failure::Broken(format!("malformed response: {e}")))
        }
        other => Attempt::Final(Failure::Broken(error_chain(&other))),
    }
}

/// A 401 with the credentials of `kubeconfig`. On a node, that file is the one `plexus install` wrote, with the
/// token of the plexus DaemonSet's pod: refused once that pod is gone, as after a deletion of the DaemonSet
/// without the node step of the uninstall, which this names.
pub(crate) fn unauthorized(server: &str, what: &str, kubeconfig: &Path) -> String {
    format!(
        "the server {server} rejected the credentials (401 Unauthorized) for {what}: the token in {} is no longer \
         accepted. `plexus install` writes there the token of the plexus DaemonSet's pod on this node, which the API \
         server stops accepting once that pod is gone: if Plexus was uninstalled (its DaemonSet deleted), finish \
         with the node step, `plexus install --uninstall` on this node (docs/operations.md, \"Uninstall\"); if the \
         DaemonSet is there, its pod writes a new token when it starts",
        kubeconfig.display()
    )
}

impl KubeApi {
    /// The same client for a caller that retries by itself (a durable writer): every call is one attempt, a
    /// transient failure or a conflict returned as [`ClusterError::Unavailable`] at once.
    pub fn without_retries(&self) -> KubeApi {
        let mut api = self.clone();
        api.settings.retries = 0;
        api.settings.conflict_retries = 0;
        api
    }

    /// What a call may try: the settings' retries within the settings' deadline, from now.
    pub(crate) fn tries(&self) -> Tries {
        Tries {
            deadline: Instant::now() + Duration::from_millis(self.settings.deadline_ms),
            retries: self.settings.retries,
            conflicts: None,
        }
    }

    /// One attempt, whoever asks: for what nobody waits on (an event), so that a slow API server cannot stretch
    /// the operation that sends it.
    pub(crate) fn one_try(&self) -> Tries {
        Tries {
            retries: 0,
            ..self.tries()
        }
    }

    /// A status write's tries: a 409 Conflict is tried again too, as often as the settings say.
    pub(crate) fn tries_with_conflicts(&self) -> Tries {
        self.tries().with_conflicts(self.settings.conflict_retries)
    }

    /// Runs `request` until it succeeds, fails for good, or `tries` run out. Each attempt is bounded by the
    /// request timeout and by what is left until the deadline; a retry waits for the backoff's next delay, and is
    /// not made when that delay would end past the deadline.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        op: &Op<'_>,
        tries: Tries,
        mut request: F,
    ) -> Result<T, Failure>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        let started = Instant::now();
        let per_request = Duration::from_millis(self.settings.request_timeout_ms);
        let mut backoff = Backoff::new(
            Duration::from_millis(self.settings.initial_backoff_ms),
            Duration::from_millis(self.settings.max_backoff_ms),
        );
        let (mut attempts, mut transient, mut conflicts) = (0u32, 0u32, 0u32);
        loop {
            attempts += 1;
            let remaining = tries.deadline.saturating_duration_since(Instant::now());
            let limit = per_request.min(remaining);
            let outcome = match tokio::time::timeout(limit, request()).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(err)) => classify(err, tries.conflicts.is_some()),
                Err(_) => Attempt::Transient(format!(
                    "no answer from the server {} within {} ms",
                    self.server,
                    limit.as_millis()
                )),
            };
            let delay = backoff.next_delay();
            let out_of_time = Instant::now() + delay >= tries.deadline;
            let last = match outcome {
                Attempt::Final(failure) => return Err(failure),
                Attempt::Conflict => {
                    conflicts += 1;
                    if out_of_time || conflicts > tries.conflicts.unwrap_or(0) {
                        return Err(Failure::Exhausted(format!(
                            "{}: still conflicting after {conflicts} attempt{}",
                            op.describe(),
                            if conflicts == 1 { "" } else { "s" }
                        )));
                    }
                    "conflict".to_string()
                }
                Attempt::Transient(last) => {
                    transient += 1;
                    if out_of_time || transient > tries.retries {
                        return Err(Failure::Exhausted(format!(
                            "{}: {last} (gave up after {attempts} attempt{} in {} ms)",
                            op.describe(),
                            if attempts == 1 { "" } else { "s" },
                            started.elapsed().as_millis()
                        )));
                    }
                    last
                }
            };
            tracing::debug!(request = %op.describe(), attempt = attempts, error = %last, "retrying");
            tokio::time::sleep(delay).await;
        }
    }

    /// The error for a failure that has no more specific meaning for the operation.
    pub(crate) fn generic(
        &self,
        op: &Op<'_>,
        object: ObjectKind,
        failure: Failure,
    ) -> ClusterError {
        match failure {
            Failure::Exhausted(reason) => ClusterError::unavailable(reason),
            Failure::Broken(reason) => ClusterError::Invalid {
                what: op.describe(),
                reason,
            },
            Failure::Api(status) => match (status.code, &self.settings.kubeconfig) {
                (401, Some(kubeconfig)) if self.settings.node_credentials => {
                    ClusterError::CredentialsRefused {
                        message: unauthorized(&self.server, &op.describe(), kubeconfig),
                    }
                }
                _ => op.answered(&self.server, object, &status),
            },
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::{BufRead, Read, Write};
    use std::sync::{Arc, Mutex};

    /// What the test server answers a request with, from its head (request line and headers): a status code.
    pub(crate) type Decide = dyn Fn(&[String]) -> u16 + Send + Sync;

    /// An API server that answers each request with the next of `codes` (the last one from then on), and the
    /// requests it got (`METHOD path`).
    fn server(codes: &[u16]) -> (String, Arc<Mutex<Vec<String>>>) {
        let codes = Mutex::new(codes.to_vec());
        server_deciding(Arc::new(move |_: &[String]| {
            let mut codes = codes.lock().unwrap();
            if codes.len() > 1 {
                codes.remove(0)
            } else {
                codes[0]
            }
        }))
    }

    /// An API server that answers each request with the code `decide` gives for its head: 200 with pod team/web
    /// (uid u1), anything else with a Status of that code; and the requests it got (`METHOD path`).
    pub(crate) fn server_deciding(decide: Arc<Decide>) -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let (Ok(conn), log, decide) = (conn, log.clone(), decide.clone()) else {
                    return;
                };
                std::thread::spawn(move || serve(conn, &log, &*decide));
            }
        });
        (url, seen)
    }

    fn serve(conn: std::net::TcpStream, log: &Mutex<Vec<String>>, decide: &Decide) {
        let mut writer = conn.try_clone().unwrap();
        let mut reader = std::io::BufReader::new(conn);
        loop {
            let mut head = Vec::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                if line == "\r\n" {
                    break;
                }
                head.push(line.trim_end().to_string());
            }
            let length = head
                .iter()
                .find_map(|h| {
                    h.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|n| n.parse().unwrap())
                })
                .unwrap_or(0);
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            let request: Vec<&str> = head[0].split(' ').collect();
            log.lock()
                .unwrap()
                .push(format!("{} {}", request[0], request[1]));
            let code = decide(&head);
            let body = if code == 200 && request[1].contains("/events") {
                r#"{"apiVersion":"v1","kind":"Event","metadata":{"name":"web.1","namespace":"team"},"involvedObject":{}}"#
                    .to_string()
            } else if code == 200 {
                r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web","namespace":"team","uid":"u1"}}"#
                    .to_string()
            } else {
                format!(
                    r#"{{"apiVersion":"v1","kind":"Status","status":"Failure","message":"m","reason":"r","code":{code}}}"#
                )
            };
            let answer = format!(
                "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            writer.write_all(answer.as_bytes()).unwrap();
        }
    }

    fn api(url: &str) -> KubeApi {
        api_with_rates(url, None)
    }

    fn api_with_rates(url: &str, rates: Option<crate::ratelimit::Rates>) -> KubeApi {
        let settings = crate::KubeSettings {
            retries: 3,
            conflict_retries: 3,
            initial_backoff_ms: 1,
            max_backoff_ms: 2,
            ..crate::KubeSettings::default()
        };
        KubeApi::with_config(
            settings,
            kube::Config::new(url.parse().unwrap()),
            None,
            rates,
        )
        .unwrap()
    }

    fn web() -> plexus_core::spec::PodRef {
        plexus_core::spec::PodRef {
            namespace: "team".into(),
            name: "web".into(),
            uid: None,
        }
    }

    #[tokio::test]
    async fn conflicts_and_transient_failures_are_retried_in_one_loop_counted_apart() {
        // Three of each is what the settings allow: the write gets through on the seventh attempt.
        let (url, seen) = server(&[409, 503, 409, 500, 409, 503, 200]);
        api(&url).write_status(&web(), "[]").await.unwrap();
        assert_eq!(seen.lock().unwrap().len(), 7);
        // A fourth conflict is one too many.
        let (url, seen) = server(&[409, 409, 409, 409, 200]);
        let err = api(&url).write_status(&web(), "[]").await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "cluster source unavailable: patch pods/status team/web: still conflicting after 4 attempts"
        );
        assert_eq!(seen.lock().unwrap().len(), 4);
    }

    /// The daemon's status queue keeps a write and tries it again itself: below it, one attempt, and a failure worth
    /// another attempt comes back as one (transient), not as a refusal the queue would drop.
    #[tokio::test]
    async fn a_caller_that_retries_itself_gets_one_attempt_per_call() {
        for code in [503, 409] {
            let (url, seen) = server(&[code, 200]);
            let err = api(&url)
                .without_retries()
                .write_status(&web(), "[]")
                .await
                .unwrap_err();
            assert!(err.is_transient(), "{code}: {err}");
            assert_eq!(
                *seen.lock().unwrap(),
                vec![
                    "PATCH /api/v1/namespaces/team/pods/web/status?&fieldManager=plexus"
                        .to_string()
                ],
                "{code}"
            );
        }
        // Reads too.
        let (url, seen) = server(&[500, 200]);
        let err = api(&url).without_retries().pod(&web()).await.unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert_eq!(seen.lock().unwrap().len(), 1);
        let (url, seen) = server(&[500, 200]);
        api(&url).pod(&web()).await.unwrap();
        assert_eq!(
            seen.lock().unwrap().len(),
            2,
            "retried with the settings' retries"
        );
    }

    #[test]
    fn a_401_with_the_nodes_credentials_names_the_uninstall_step() {
        let msg = unauthorized(
            "10.0.0.1:6443",
            "get pods team/web",
            Path::new("/etc/cni/net.d/plexus.d/plexus.kubeconfig"),
        );
        assert!(msg.starts_with("the server 10.0.0.1:6443 rejected the credentials (401 Unauthorized) for get pods team/web"), "{msg}");
        assert!(
            msg.contains("/etc/cni/net.d/plexus.d/plexus.kubeconfig"),
            "{msg}"
        );
        assert!(msg.contains("plexus install --uninstall"), "{msg}");
    }

    #[test]
    fn forbidden_names_verb_resource_and_namespace() {
        let op = Op {
            verb: "get",
            resource: super::super::NAD_PLURAL,
            group: super::super::NAD_GROUP,
            namespace: "team-a",
            name: "n",
        };
        assert_eq!(
            op.forbidden("10.0.0.1:6443").to_string(),
            r#"forbidden: missing permission to get network-attachment-definitions (API group "k8s.cni.cncf.io") in namespace "team-a" on the server 10.0.0.1:6443"#
        );
    }

    /// A write RBAC allows and an admission policy refuses is not a missing permission: the error names the policy
    /// and says why, whichever code the policy's reason gave.
    #[test]
    fn an_admission_policys_refusal_names_the_policy() {
        let op = Op {
            verb: "patch",
            resource: "pods/status",
            group: "",
            namespace: "team",
            name: "web-b",
        };
        let message = "pods \"web-b\" is forbidden: ValidatingAdmissionPolicy 'plexus-node-authority' with binding \
                       'plexus-node-authority' denied request: plexus on node node-a may not write the status of pod \
                       team/web-b: it is not bound to that node";
        for (code, reason) in [(403, "Forbidden"), (422, "Invalid")] {
            let status = kube::core::Status {
                code,
                reason: reason.into(),
                message: message.into(),
                ..Default::default()
            };
            let err = op.answered("10.0.0.1:6443", ObjectKind::Pod, &status);
            assert_eq!(
                err.to_string(),
                "forbidden: patch pods/status team/web-b: the ValidatingAdmissionPolicy plexus-node-authority (binding \
                 plexus-node-authority) on the server 10.0.0.1:6443 refused the request: plexus on node node-a may not \
                 write the status of pod team/web-b: it is not bound to that node"
            );
        }
        // RBAC's own refusal still names the permission.
        let rbac = kube::core::Status {
            code: 403,
            reason: "Forbidden".into(),
            message: r#"pods "web-b" is forbidden: User "u" cannot patch resource "pods/status""#
                .into(),
            ..Default::default()
        };
        assert!(op
            .answered("10.0.0.1:6443", ObjectKind::Pod, &rbac)
            .to_string()
            .contains("missing permission to patch pods/status"));
    }

    /// A pod's status write, and a read of one claim, have a budget of their own: they do not wait behind the
    /// background work that used up the other.
    #[tokio::test]
    async fn status_writes_do_not_queue_behind_background_work() {
        use crate::ratelimit::{RateLimit, Rates};
        let (url, seen) = server(&[200]);
        let api = api_with_rates(
            &url,
            Some(Rates {
                background: RateLimit { qps: 1.0, burst: 1 },
                status: RateLimit {
                    qps: 50.0,
                    burst: 100,
                },
                events: RateLimit {
                    qps: 50.0,
                    burst: 100,
                },
            }),
        );
        let claim = plexus_core::spec::dra::ClaimName {
            namespace: "team".into(),
            name: "nic".into(),
        };
        let mut took = Vec::new();
        let started = Instant::now();
        // The background budget's one token.
        let _ = api.nad("team", "net").await;
        took.push(("a NAD read", started.elapsed()));
        let started = Instant::now();
        api.write_status(&web(), "[]").await.unwrap();
        took.push(("a status write", started.elapsed()));
        let started = Instant::now();
        let _ = api.claim(&claim).await;
        took.push(("a claim read", started.elapsed()));
        for (what, took) in took {
            assert!(took < Duration::from_millis(500), "{what} took {took:?}");
        }
        // The next background request waits for the bucket's next token.
        let started = Instant::now();
        let _ = api.pod(&web()).await;
        let waited = started.elapsed();
        assert!(waited > Duration::from_millis(700), "{waited:?}");
        assert_eq!(seen.lock().unwrap().len(), 4);
    }

    /// Events have a budget of their own: they do not wait behind the background work that used up the other, nor
    /// does background work wait behind them. A burst of events waits for its tokens before each attempt starts,
    /// not within the attempt's timeout: each is posted in its turn, none times out in the queue.
    #[tokio::test]
    async fn events_have_a_budget_of_their_own_and_wait_for_it_outside_their_timeout() {
        use crate::ratelimit::{RateLimit, Rates};
        const EVENTS: usize = 6;
        let (url, seen) = server(&[200]);
        let settings = crate::KubeSettings {
            request_timeout_ms: 300,
            ..crate::KubeSettings::default()
        };
        let api = KubeApi::with_config(
            settings,
            kube::Config::new(url.parse().unwrap()),
            None,
            Some(Rates {
                // One token, the next in 100 s.
                background: RateLimit {
                    qps: 0.01,
                    burst: 1,
                },
                status: RateLimit {
                    qps: 50.0,
                    burst: 100,
                },
                events: RateLimit { qps: 4.0, burst: 1 },
            }),
        )
        .unwrap();
        api.pod(&web()).await.unwrap();
        let started = Instant::now();
        let mut posts = tokio::task::JoinSet::new();
        for i in 0..EVENTS {
            let api = api.clone();
            posts.spawn(async move {
                api.post_event(
                    &web(),
                    Some("node-a"),
                    ("Normal", "AddedInterface"),
                    &format!("m{i}"),
                )
                .await
            });
        }
        while let Some(posted) = posts.join_next().await {
            assert_eq!(posted.unwrap().unwrap(), "web.1");
        }
        // At 4 a second after the first: the last waited 1.25 s for its token, four times the request's timeout.
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(1200), "{took:?}");
        let events = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.starts_with("POST /api/v1/namespaces/team/events"))
            .count();
        assert_eq!(events, EVENTS);
    }

    /// A count of a repeated event never waits for the events' budget: without a token at hand it is not sent (the
    /// next repeat sends the count reached), so new events do not queue behind the counts of old ones.
    #[tokio::test]
    async fn a_repeated_events_count_is_not_sent_without_a_token_at_hand() {
        use crate::ratelimit::{RateLimit, Rates};
        let (url, seen) = server(&[200]);
        let every = RateLimit {
            qps: 50.0,
            burst: 100,
        };
        let api = api_with_rates(
            &url,
            Some(Rates {
                background: every,
                status: every,
                // One token, the next in 100 s.
                events: RateLimit {
                    qps: 0.01,
                    burst: 1,
                },
            }),
        );
        let name = api
            .post_event(&web(), None, ("Normal", "AddedInterface"), "m")
            .await
            .unwrap();
        api.count_event("team", &name, 2).await.unwrap();
        let sent: Vec<String> = seen.lock().unwrap().clone();
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert!(
            sent[0].starts_with("POST /api/v1/namespaces/team/events"),
            "{sent:?}"
        );
    }
}
