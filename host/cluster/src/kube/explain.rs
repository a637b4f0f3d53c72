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
/// it names, ...) and what the transport layer said.
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
    fn servers_are_named_with_their_port() {
        let of = |s: &str| server_of(&s.parse().unwrap());
        assert_eq!(of("https://k8s.example:6443"), "k8s.example:6443");
        assert_eq!(of("https://k8s.example"), "k8s.example:443");
        assert_eq!(of("http://127.0.0.1"), "127.0.0.1:80");
        assert_eq!(of("https://[::1]:6443"), "[::1]:6443");
    }
}
