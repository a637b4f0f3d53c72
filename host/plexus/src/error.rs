//! The one place where Plexus's failures become CNI error codes.
//!
//! Codes 0–99 are the CNI spec's well-known codes; 100+ are Plexus's own (the spec leaves them to plugins):
//! see `docs/conformance.md` for the table.

use plexus_cluster::ClusterError;

/// A delegate (or hook) reported a CNI error object, or failed without one.
pub const CODE_DELEGATE_FAILED: u32 = 100;
/// A delegate did not finish within `delegateTimeoutMs` and was killed.
pub const CODE_DELEGATE_TIMEOUT: u32 = 101;
/// A policy hook rejected the pod's selection (spec 7.4).
pub const CODE_POLICY_DENIED: u32 = 102;
/// A hook faulted (trap, timeout, memory, invalid output) under `failurePolicy: Fail`.
pub const CODE_HOOK_FAULT: u32 = 103;

pub const CODE_INCOMPATIBLE_VERSION: u32 = 1;
pub const CODE_UNKNOWN_CONTAINER: u32 = 3;
pub const CODE_INVALID_ENV: u32 = 4;
pub const CODE_IO: u32 = 5;
pub const CODE_DECODING: u32 = 6;
pub const CODE_INVALID_CONFIG: u32 = 7;
pub const CODE_TRY_AGAIN_LATER: u32 = 11;
pub const CODE_NOT_AVAILABLE: u32 = 50;

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
    #[error("{0}")]
    Config(String),
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
    pub fn context(self, context: impl Into<String>) -> Self {
        PlexusError::Context {
            context: context.into(),
            source: Box::new(self),
        }
    }

    /// The CNI error code for this failure.
    pub fn cni_code(&self) -> u32 {
        match self {
            PlexusError::Env(_) => CODE_INVALID_ENV,
            PlexusError::Decode(_) => CODE_DECODING,
            PlexusError::Config(_) => CODE_INVALID_CONFIG,
            PlexusError::Version(_) => CODE_INCOMPATIBLE_VERSION,
            PlexusError::Io { .. } => CODE_IO,
            PlexusError::NotReady(_) => CODE_TRY_AGAIN_LATER,
            PlexusError::NotAvailable(_) => CODE_NOT_AVAILABLE,
            PlexusError::Cluster(e) => match e {
                ClusterError::NotFound { .. } | ClusterError::Invalid { .. } => CODE_INVALID_CONFIG,
                ClusterError::UidMismatch { .. } | ClusterError::Unavailable(_) => {
                    CODE_TRY_AGAIN_LATER
                }
                ClusterError::Forbidden(_) | ClusterError::Io { .. } => CODE_IO,
            },
            PlexusError::Delegate { code, .. } => *code,
            PlexusError::PolicyDenied(_) => CODE_POLICY_DENIED,
            PlexusError::HookFault(_) => CODE_HOOK_FAULT,
            PlexusError::Context { source, .. } | PlexusError::Cleanup { source, .. } => {
                source.cni_code()
            }
            PlexusError::Many { errors, .. } => {
                errors.first().map_or(CODE_IO, PlexusError::cni_code)
            }
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

    #[test]
    fn codes_follow_the_cni_spec_and_survive_context() {
        assert_eq!(PlexusError::Env("x".into()).cni_code(), 4);
        assert_eq!(PlexusError::Decode("x".into()).cni_code(), 6);
        assert_eq!(PlexusError::Config("x".into()).cni_code(), 7);
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
            kind: "pod",
            namespace: "a".into(),
            name: "b".into(),
        });
        assert_eq!(nf.cni_code(), 7);
        let down = PlexusError::Cluster(ClusterError::Unavailable("refused".into()));
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
                PlexusError::Config("a".into()),
                PlexusError::NotReady("b".into()),
            ],
        };
        assert_eq!(e.to_string(), "2 of 3 detachments failed: a; b");
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
