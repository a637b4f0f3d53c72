//! Errors talking to the API in words: which server, and what went wrong (refused, timed out, TLS, ...).
//!
//! Transport errors are put in words where the client's stack meets the connection ([`Unreachable`], a layer
//! of `KubeApi::client_of`), so every caller of the client (the daemon's watches, an operator's command, a
//! CNI invocation) meets the same text; answers of the server (401, 403, ...) are put in words by [`explain`]
//! where they are shown.

use std::fmt;
use std::sync::Arc;

/// What kind of transport failure a connection met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    Refused,
    TimedOut,
    NameNotResolved,
    Tls,
    Closed,
    Other,
}

/// A request that did not reach the server, or got no answer: its server and the cause in words.
#[derive(Debug)]
pub struct Unreachable {
    server: Arc<str>,
    cause: Cause,
    /// The underlying errors, one line.
    detail: String,
}

impl Unreachable {
    pub(crate) fn new(server: Arc<str>, err: &(dyn std::error::Error + 'static)) -> Unreachable {
        let detail = super::error_chain(err);
        Unreachable {
            server,
            cause: cause_of(err, &detail),
            detail,
        }
    }
}

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let server = &self.server;
        match self.cause {
            Cause::Refused => write!(f, "the connection to the server {server} was refused"),
            Cause::TimedOut => write!(f, "the connection to the server {server} timed out"),
            Cause::NameNotResolved => write!(
                f,
                "the server {server}'s host name could not be resolved ({})",
                self.detail
            ),
            Cause::Tls => write!(f, "TLS with the server {server} failed: {}", self.detail),
            Cause::Closed => write!(
                f,
                "the server {server} closed the connection ({})",
                self.detail
            ),
            Cause::Other => write!(f, "cannot talk to the server {server}: {}", self.detail),
        }
    }
}

impl std::error::Error for Unreachable {}

/// The cause of a transport error, from the I/O error kinds in its chain and, where the TLS and DNS layers give
/// no kind, its text (`chain`, the error and its sources in one line).
fn cause_of(err: &(dyn std::error::Error + 'static), chain: &str) -> Cause {
    let mut source = Some(err);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            match io.kind() {
                K::ConnectionRefused => return Cause::Refused,
                K::TimedOut => return Cause::TimedOut,
                K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof
                    if !looks_like_tls(&io.to_string()) =>
                {
                    return Cause::Closed
                }
                _ => {}
            }
        }
        source = e.source();
    }
    let text = chain.to_ascii_lowercase();
    if text.contains("dns error") || text.contains("failed to lookup address") {
        Cause::NameNotResolved
    } else if looks_like_tls(&text) {
        Cause::Tls
    } else {
        Cause::Other
    }
}

fn looks_like_tls(text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    [
        "certificate",
        "tls",
        "handshake",
        "corrupt message",
        "alert",
    ]
    .iter()
    .any(|w| text.contains(w))
}

/// An error of the client in words, naming `server`: the server's answers (401, 403 with the verb and resource
/// it names, an admission policy's or webhook's refusal with its name and reason, ...) and what the transport
/// layer said.
pub fn explain(server: &str, err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => explain_status(server, status),
        // Already names the server and the cause (Unreachable); without kube's "ServiceError: " prefix.
        kube::Error::Service(e) => super::error_chain(&**e),
        other => format!(
            "talking to the server {server}: {}",
            super::error_chain(other)
        ),
    }
}

/// The server's answer in words.
pub(crate) fn explain_status(server: &str, status: &kube::core::Status) -> String {
    if let Some(denial) = Denial::of(&status.message) {
        return denial.words(server);
    }
    match status.code {
        401 => format!("the server {server} rejected the credentials (401 Unauthorized)"),
        // The server's message names the user, the verb, the resource and the scope.
        403 => format!(
            "the server {server} refused (403 Forbidden): {}",
            status.message
        ),
        code => format!(
            "the server {server} answered {code} {}: {}",
            status.reason, status.message
        ),
    }
}

/// A refusal by admission control, read from the server's message: a ValidatingAdmissionPolicy (the project's
/// node-authority policy, or one of the cluster's) or an admission webhook said no. RBAC allowed the request, so
/// its words must not send the operator to the ClusterRole: they name what refused and say why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Denial<'a> {
    by: Denier<'a>,
    /// The policy's or webhook's own message.
    reason: &'a str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Denier<'a> {
    Policy {
        name: &'a str,
        binding: Option<&'a str>,
    },
    Webhook(&'a str),
}

impl<'a> Denial<'a> {
    /// The denial a status message reports, if it reports one. The API server words them (k8s.io/apiserver, its
    /// validating policy dispatcher and webhook errors) `ValidatingAdmissionPolicy 'NAME' with binding 'BINDING'
    /// denied request: MESSAGE` (`... 'NAME' denied request: ...` without a binding) and `admission webhook
    /// "NAME" denied the request: MESSAGE`, behind the resource and name (`pods "p" is forbidden: `); the code is
    /// the one the policy's `reason` maps to (403 Forbidden, 422 Invalid, ...) or the webhook's.
    pub(crate) fn of(message: &'a str) -> Option<Denial<'a>> {
        Self::of_policy(message).or_else(|| Self::of_webhook(message))
    }

    fn of_policy(message: &'a str) -> Option<Denial<'a>> {
        let (_, rest) = message.split_once("ValidatingAdmissionPolicy '")?;
        let (name, rest) = rest.split_once('\'')?;
        let (binding, rest) = match rest.strip_prefix(" with binding '") {
            Some(rest) => {
                let (binding, rest) = rest.split_once('\'')?;
                (Some(binding), rest)
            }
            None => (None, rest),
        };
        let reason = rest.strip_prefix(" denied request: ")?;
        Some(Denial {
            by: Denier::Policy { name, binding },
            reason,
        })
    }

    fn of_webhook(message: &'a str) -> Option<Denial<'a>> {
        let (_, rest) = message.split_once("admission webhook \"")?;
        let (name, rest) = rest.split_once('"')?;
        let rest = rest.strip_prefix(" denied the request")?;
        // " without explanation" when the webhook gave no message.
        let reason = rest.strip_prefix(": ").unwrap_or_default();
        Some(Denial {
            by: Denier::Webhook(name),
            reason,
        })
    }

    /// The denial in words, naming `server`.
    pub(crate) fn words(&self, server: &str) -> String {
        let by = match self.by {
            Denier::Policy {
                name,
                binding: Some(binding),
            } => format!("the ValidatingAdmissionPolicy {name} (binding {binding})"),
            Denier::Policy {
                name,
                binding: None,
            } => format!("the ValidatingAdmissionPolicy {name}"),
            Denier::Webhook(name) => format!("the admission webhook {name}"),
        };
        match self.reason {
            "" => format!("{by} on the server {server} refused the request without saying why"),
            reason => format!("{by} on the server {server} refused the request: {reason}"),
        }
    }
}

/// A watch's error in words (the daemon's log).
#[cfg(feature = "watch")]
pub fn explain_watch(server: &str, err: &kube::runtime::watcher::Error) -> String {
    use kube::runtime::watcher::Error as W;
    match err {
        W::InitialListFailed(e) => format!("cannot list: {}", explain(server, e)),
        W::WatchStartFailed(e) => format!("cannot start the watch: {}", explain(server, e)),
        W::WatchFailed(e) => format!("the watch failed: {}", explain(server, e)),
        W::WatchError(status) => format!(
            "the watch ended with an error: {}",
            explain_status(server, status)
        ),
        other => other.to_string(),
    }
}

/// The `host:port` of a server URL, the port made explicit (as kubectl names a server).
pub(crate) fn server_of(url: &http::Uri) -> String {
    let host = url.host().unwrap_or("?");
    let port = url.port_u16().unwrap_or(match url.scheme_str() {
        Some("http") => 80,
        _ => 443,
    });
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(kind: std::io::ErrorKind, text: &str) -> std::io::Error {
        std::io::Error::new(kind, text.to_string())
    }

    #[derive(Debug)]
    struct Wrapped(std::io::Error);
    impl fmt::Display for Wrapped {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("client error (Connect)")
        }
    }
    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    fn words(err: &(dyn std::error::Error + 'static)) -> String {
        Unreachable::new("10.0.0.1:6443".into(), err).to_string()
    }

    #[test]
    fn causes_are_found_deep_in_the_chain() {
        let refused = Wrapped(io(std::io::ErrorKind::ConnectionRefused, "refused"));
        assert_eq!(
            words(&refused),
            "the connection to the server 10.0.0.1:6443 was refused"
        );
        let slow = Wrapped(io(std::io::ErrorKind::TimedOut, "deadline"));
        assert_eq!(
            words(&slow),
            "the connection to the server 10.0.0.1:6443 timed out"
        );
        let tls = Wrapped(io(
            std::io::ErrorKind::InvalidData,
            "invalid peer certificate: UnknownIssuer",
        ));
        assert!(
            words(&tls).starts_with("TLS with the server 10.0.0.1:6443 failed: ")
                && words(&tls).contains("UnknownIssuer"),
            "{}",
            words(&tls)
        );
        let dns = Wrapped(io(
            std::io::ErrorKind::Other,
            "dns error: failed to lookup address information",
        ));
        assert!(words(&dns).contains("host name could not be resolved"));
        let reset = Wrapped(io(std::io::ErrorKind::ConnectionReset, "reset by peer"));
        assert!(words(&reset).contains("closed the connection"));
        let odd = Wrapped(io(std::io::ErrorKind::Other, "something else"));
        assert_eq!(
            words(&odd),
            "cannot talk to the server 10.0.0.1:6443: client error (Connect): something else"
        );
    }

    #[test]
    fn statuses_name_the_server() {
        let status = |code: u16, message: &str| kube::core::Status {
            code,
            message: message.into(),
            reason: "Forbidden".into(),
            ..Default::default()
        };
        let err = kube::Error::Api(Box::new(status(401, "Unauthorized")));
        assert_eq!(
            explain("h:1", &err),
            "the server h:1 rejected the credentials (401 Unauthorized)"
        );
        let err = kube::Error::Api(Box::new(status(
            403,
            r#"pods is forbidden: User "u" cannot list resource "pods""#,
        )));
        assert_eq!(
            explain("h:1", &err),
            r#"the server h:1 refused (403 Forbidden): pods is forbidden: User "u" cannot list resource "pods""#
        );
    }

    #[test]
    fn admission_denials_name_the_policy_not_rbac() {
        let status = |code: u16, reason: &str, message: &str| kube::core::Status {
            code,
            message: message.into(),
            reason: reason.into(),
            ..Default::default()
        };
        // As kube-apiserver 1.37 answers a write the node-authority policy refuses.
        let refused = status(
            403,
            "Forbidden",
            "pods \"web-b\" is forbidden: ValidatingAdmissionPolicy 'plexus-node-authority' with binding \
             'plexus-node-authority' denied request: plexus on node node-a may not write the status of pod \
             team/web-b: it is not bound to that node",
        );
        let words = explain("h:1", &kube::Error::Api(Box::new(refused)));
        assert_eq!(
            words,
            "the ValidatingAdmissionPolicy plexus-node-authority (binding plexus-node-authority) on the server h:1 \
             refused the request: plexus on node node-a may not write the status of pod team/web-b: it is not bound \
             to that node"
        );
        assert!(!words.contains("permission") && !words.contains("cannot"));
        // A policy whose validation says `reason: Invalid` answers 422; one denied without a binding's name.
        let invalid = status(
            422,
            "Invalid",
            "events is forbidden: ValidatingAdmissionPolicy 'p' denied request: expression 'x' resulted in error",
        );
        assert_eq!(
            explain_status("h:1", &invalid),
            "the ValidatingAdmissionPolicy p on the server h:1 refused the request: expression 'x' resulted in error"
        );
        // An admission webhook's refusal, with and without a message.
        let hooked = status(
            400,
            "BadRequest",
            "admission webhook \"validate.kyverno.svc\" denied the request: no",
        );
        assert_eq!(
            explain_status("h:1", &hooked),
            "the admission webhook validate.kyverno.svc on the server h:1 refused the request: no"
        );
        let silent = status(
            403,
            "Forbidden",
            "admission webhook \"w.example.com\" denied the request without explanation",
        );
        assert_eq!(
            explain_status("h:1", &silent),
            "the admission webhook w.example.com on the server h:1 refused the request without saying why"
        );
        // RBAC's refusal keeps its own words.
        let rbac = status(
            403,
            "Forbidden",
            r#"pods "p" is forbidden: User "u" cannot patch resource "pods/status""#,
        );
        assert_eq!(Denial::of(&rbac.message), None);
        assert!(
            explain_status("h:1", &rbac).starts_with("the server h:1 refused (403 Forbidden): ")
        );
    }

    #[test]
    fn servers_are_named_with_their_port() {
        let of = |s: &str| server_of(&s.parse().unwrap());
        assert_eq!(of("https://k8s.example:6443"), "k8s.example:6443");
        assert_eq!(of("https://k8s.example"), "k8s.example:443");
        assert_eq!(of("http://127.0.0.1"), "127.0.0.1:80");
        assert_eq!(of("https://[::1]:6443"), "[::1]:6443");
    }
}
