//! The one place where Plexus's failures become CNI error codes.
//!
//! Codes 0–99 are the CNI spec's well-known codes; 100+ are Plexus's own (the spec leaves them to plugins):
//! see `docs/conformance.md` for the table.

use plexus_cluster::ClusterError;
use plexus_core::cni::{ConfError, ErrorCode};
use plexus_core::spec::{CapabilityError, NamingError, ResolveError, SelectionError};
use plexus_hooks::HookError;

/// Plexus's own codes; the spec's well-known ones are core's [`ErrorCode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum PlexusCode {
    /// A delegate (or hook) reported a CNI error object, or failed without one.
    DelegateFailed = 100,
    /// A delegate did not finish within `delegateTimeoutMs` and was killed.
    DelegateTimeout = 101,
    /// A policy hook rejected the pod's selection (spec 7.4).
    PolicyDenied = 102,
    /// A hook faulted (trap, timeout, memory, invalid output) under `failurePolicy: Fail`.
    HookFault = 103,
}

impl PlexusCode {
    pub const fn code(self) -> u32 {
        self as u32
    }
}

/// The most bytes of a message plexus prints (the CNI error's `msg` and `details`, a log line's message, an
/// event): errors can echo input (a pod name, a delegate's output) and the runtime stores what it is given.
pub const MESSAGE_CAP: usize = 4096;

/// `text` cut to at most [`MESSAGE_CAP`] bytes on a character boundary, saying how much was cut.
pub fn bounded(text: String) -> String {
    if text.len() <= MESSAGE_CAP {
        return text;
    }
    let mut end = MESSAGE_CAP - 64;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} more bytes)", &text[..end], text.len() - end)
}

#[derive(Debug, thiserror::Error)]
pub enum PlexusError {
    #[error("{0}")]
    Env(String),
    #[error("{0}")]
    Decode(String),
    /// A value Plexus was given and cannot use: `field` names it (a conf key such as `cluster.dir`, a
    /// network, a hook, an annotation), `reason` says why.
    #[error("{field}: {reason}")]
    Config { field: String, reason: String },
    /// A delegate's `type` with no executable of that name on the CNI path.
    #[error("plugin {plugin:?} not found in {path}")]
    PluginNotFound { plugin: String, path: String },
    #[error("{0}")]
    Version(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    NotReady(String),
    #[error("{0}")]
    NotAvailable(String),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// A network configuration list that is not one (CNI spec).
    #[error(transparent)]
    Conf(#[from] ConfError),
    /// An invalid networks annotation, or policy hook output (spec 4.1).
    #[error(transparent)]
    Selection(#[from] SelectionError),
    /// A NetworkAttachmentDefinition that resolves to no configuration (spec 3.4.1).
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// An interface or network name the rules refuse (spec 4.1.2.1.5).
    #[error(transparent)]
    Naming(#[from] NamingError),
    /// A selection asks for a capability the network's plugins do not declare.
    #[error(transparent)]
    Capability(#[from] CapabilityError),
    #[error(transparent)]
    Hook(#[from] HookError),
    /// Plexus's own values that do not (de)serialize.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A delegate's own CNI error object (code, msg, details) or a failure without one.
    #[error("{msg}")]
    Delegate {
        code: u32,
        msg: String,
        details: String,
    },
    #[error("{0}")]
    PolicyDenied(String),
    #[error("{0}")]
    HookFault(String),
    /// Wraps a failure with the pod and network it happened on.
    #[error("{context}: {source}")]
    Context {
        context: String,
        source: Box<PlexusError>,
    },
    /// A failure whose clean-up failed as well: the code and details are the original failure's, so the
    /// runtime learns why the operation failed, not why the clean-up did.
    #[error("{source}; {cleanup}")]
    Cleanup {
        source: Box<PlexusError>,
        cleanup: Box<PlexusError>,
    },
    /// Several failures (DEL tears everything down, then reports all of them).
    #[error("{summary}: {}", .errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Many {
        summary: String,
        errors: Vec<PlexusError>,
    },
}

impl PlexusError {
    /// [`PlexusError::Config`]: `field` is what was wrong, `reason` why.
    pub fn config(field: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        PlexusError::Config {
            field: field.into(),
            reason: reason.to_string(),
        }
    }

    pub fn context(self, context: impl Into<String>) -> Self {
        PlexusError::Context {
            context: context.into(),
            source: Box::new(self),
        }
    }

    /// The CNI error code for this failure: the one table from failures to codes.
    pub fn cni_code(&self) -> u32 {
        match self {
            PlexusError::Env(_) => ErrorCode::InvalidEnvironment.code(),
            PlexusError::Decode(_) | PlexusError::Json(_) => ErrorCode::Decoding.code(),
            // A delegate list's version is the list's content, not the runtime's request: 7, not 1.
            PlexusError::Config { .. }
            | PlexusError::PluginNotFound { .. }
            | PlexusError::Conf(_)
            | PlexusError::Selection(_)
            | PlexusError::Resolve(_)
            | PlexusError::Naming(_)
            | PlexusError::Capability(_) => ErrorCode::InvalidConfig.code(),
            PlexusError::Version(_) => ErrorCode::IncompatibleVersion.code(),
            PlexusError::Io { .. } => ErrorCode::Io.code(),
            PlexusError::NotReady(_) => ErrorCode::TryAgainLater.code(),
            PlexusError::NotAvailable(_) => ErrorCode::PluginNotAvailable.code(),
            PlexusError::Cluster(e) => match e {
                ClusterError::NotFound { .. } | ClusterError::Invalid { .. } => {
                    ErrorCode::InvalidConfig.code()
                }
                ClusterError::UidMismatch { .. } | ClusterError::Unavailable { .. } => {
                    ErrorCode::TryAgainLater.code()
                }
                ClusterError::Forbidden { .. }
                | ClusterError::CredentialsRefused { .. }
                | ClusterError::Io { .. } => ErrorCode::Io.code(),
            },
            // A hook that cannot be loaded is a configuration problem of the node.
            PlexusError::Hook(HookError::Load { .. } | HookError::Config(_)) => {
                ErrorCode::InvalidConfig.code()
            }
            PlexusError::Hook(HookError::Fault { .. } | HookError::Engine(_))
            | PlexusError::HookFault(_) => PlexusCode::HookFault.code(),
            // Selections the spec's reader refuses: as an annotation's would be.
            PlexusError::Hook(HookError::Input(_)) => ErrorCode::InvalidConfig.code(),
            PlexusError::Delegate { code, .. } => *code,
            PlexusError::PolicyDenied(_) => PlexusCode::PolicyDenied.code(),
            PlexusError::Context { source, .. } | PlexusError::Cleanup { source, .. } => {
                source.cni_code()
            }
            PlexusError::Many { errors, .. } => errors
                .first()
                .map_or(ErrorCode::Io.code(), PlexusError::cni_code),
        }
    }

    /// Details for the CNI error object: a delegate's own details, where there are any.
    pub fn details(&self) -> String {
        match self {
            PlexusError::Delegate { details, .. } => details.clone(),
            PlexusError::Context { source, .. } | PlexusError::Cleanup { source, .. } => {
                source.details()
            }
            PlexusError::Many { errors, .. } => errors
                .iter()
                .map(PlexusError::details)
                .filter(|d| !d.is_empty())
                .collect::<Vec<_>>()
                .join("; "),
            _ => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexus_cluster::ObjectKind;
    use plexus_core::cni::UnsupportedVersion;
    use plexus_hooks::{Fault, HookKind};

    /// Every kind of failure, with the code the runtime gets for it: the table of docs/conformance.md.
    #[test]
    fn every_failure_has_its_code() {
        let text = || "x".to_string();
        let json_error = serde_json::from_str::<u8>("{").unwrap_err();
        let table: Vec<(PlexusError, u32)> = vec![
            (PlexusError::Version(text()), 1),
            (
                PlexusError::Conf(ConfError::UnsupportedCniVersion(UnsupportedVersion(
                    "9.9.9".into(),
                ))),
                7,
            ),
            (PlexusError::Env(text()), 4),
            (
                PlexusError::Io {
                    path: text(),
                    source: std::io::ErrorKind::Other.into(),
                },
                5,
            ),
            (PlexusError::Cluster(ClusterError::forbidden(text())), 5),
            (PlexusError::Decode(text()), 6),
            (PlexusError::Json(json_error), 6),
            (PlexusError::config("cluster.dir", text()), 7),
            (
                PlexusError::PluginNotFound {
                    plugin: text(),
                    path: text(),
                },
                7,
            ),
            (PlexusError::Conf(ConfError::MissingName), 7),
            (PlexusError::Naming(NamingError::EmptyContainerId), 7),
            (
                PlexusError::Capability(CapabilityError {
                    network: text(),
                    capability: text(),
                }),
                7,
            ),
            (
                PlexusError::Cluster(ClusterError::NotFound {
                    object: ObjectKind::Pod,
                    namespace: text(),
                    name: text(),
                }),
                7,
            ),
            (PlexusError::Hook(HookError::Config(text())), 7),
            (PlexusError::NotReady(text()), 11),
            (PlexusError::Cluster(ClusterError::unavailable(text())), 11),
            (PlexusError::NotAvailable(text()), 50),
            (
                PlexusError::Delegate {
                    code: 100,
                    msg: text(),
                    details: text(),
                },
                100,
            ),
            (PlexusError::PolicyDenied(text()), 102),
            (PlexusError::HookFault(text()), 103),
            (
                PlexusError::Hook(HookError::Fault {
                    hook: text(),
                    kind: HookKind::Policy,
                    fault: Fault::Timeout(5),
                }),
                103,
            ),
        ];
        for (err, code) in table {
            assert_eq!(err.cni_code(), code, "{err:?}");
        }
        assert_eq!(PlexusCode::DelegateFailed.code(), 100);
        assert_eq!(PlexusCode::DelegateTimeout.code(), 101);
    }

    #[test]
    fn codes_follow_the_cni_spec_and_survive_context() {
        assert_eq!(PlexusError::Env("x".into()).cni_code(), 4);
        assert_eq!(PlexusError::Decode("x".into()).cni_code(), 6);
        assert_eq!(PlexusError::config("x", "y").cni_code(), 7);
        assert_eq!(PlexusError::NotReady("x".into()).cni_code(), 11);
        let d = PlexusError::Delegate {
            code: 42,
            msg: "boom".into(),
            details: "why".into(),
        };
        let wrapped = d.context("pod a/b: network a/n (net1)");
        assert_eq!(wrapped.cni_code(), 42);
        assert_eq!(wrapped.details(), "why");
        assert_eq!(wrapped.to_string(), "pod a/b: network a/n (net1): boom");
        let nf = PlexusError::Cluster(ClusterError::NotFound {
            object: ObjectKind::Pod,
            namespace: "a".into(),
            name: "b".into(),
        });
        assert_eq!(nf.cni_code(), 7);
        let down = PlexusError::Cluster(ClusterError::unavailable("refused"));
        assert_eq!(down.cni_code(), 11);
    }

    #[test]
    fn messages_are_bounded_on_a_character_boundary() {
        assert_eq!(bounded("short".into()), "short");
        let long = "é".repeat(MESSAGE_CAP);
        let cut = bounded(long.clone());
        assert!(cut.len() <= MESSAGE_CAP, "{}", cut.len());
        assert!(cut.ends_with(" more bytes)"), "{cut}");
        assert!(long.starts_with(cut.split("...").next().unwrap()));
    }

    #[test]
    fn many_reports_every_failure_and_the_first_code() {
        let e = PlexusError::Many {
            summary: "2 of 3 detachments failed".into(),
            errors: vec![
                PlexusError::config("a", "bad"),
                PlexusError::NotReady("b".into()),
            ],
        };
        assert_eq!(e.to_string(), "2 of 3 detachments failed: a: bad; b");
        assert_eq!(e.cni_code(), 7);
    }

    #[test]
    fn cleanup_keeps_the_original_code_and_details() {
        let e = PlexusError::Cleanup {
            source: Box::new(PlexusError::Delegate {
                code: 42,
                msg: "pool exhausted".into(),
                details: "no free address".into(),
            }),
            cleanup: Box::new(PlexusError::Many {
                summary: "rolling back also failed".into(),
                errors: vec![PlexusError::NotReady("bridge busy".into())],
            }),
        };
        assert_eq!(e.cni_code(), 42);
        assert_eq!(e.details(), "no free address");
        assert_eq!(
            e.to_string(),
            "pool exhausted; rolling back also failed: bridge busy"
        );
    }
}
