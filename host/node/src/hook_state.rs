//! How a NetworkHook stands on a node: the reason words of its status, and the failure that carries one.

use std::fmt;

/// Why a hook is not active on a node, or not in the version its spec wants (the `reason` of its status).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The registry could not be reached, timed out, or the module could not be stored.
    PullFailed,
    Unauthorized,
    NotFound,
    DigestMismatch,
    NotAWasmModule,
    SignatureMissing,
    SignatureInvalid,
    NoTrustedKeys,
    /// It ran here, but no trusted key verifies it any more.
    Untrusted,
    InvalidReference,
    CompileFailed,
    /// The module does not implement the kind its spec names.
    KindMismatch,
    /// Built against a contract version this node does not implement.
    Incompatible,
    FailedProbe,
    InvalidSpec,
}

impl Reason {
    const ALL: [Reason; 15] = [
        Reason::PullFailed,
        Reason::Unauthorized,
        Reason::NotFound,
        Reason::DigestMismatch,
        Reason::NotAWasmModule,
        Reason::SignatureMissing,
        Reason::SignatureInvalid,
        Reason::NoTrustedKeys,
        Reason::Untrusted,
        Reason::InvalidReference,
        Reason::CompileFailed,
        Reason::KindMismatch,
        Reason::Incompatible,
        Reason::FailedProbe,
        Reason::InvalidSpec,
    ];

    /// The reason [`Reason::as_str`] names.
    pub fn parse(word: &str) -> Option<Reason> {
        Self::ALL.into_iter().find(|r| r.as_str() == word)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::PullFailed => "PullFailed",
            Reason::Unauthorized => "Unauthorized",
            Reason::NotFound => "NotFound",
            Reason::DigestMismatch => "DigestMismatch",
            Reason::NotAWasmModule => "NotAWasmModule",
            Reason::SignatureMissing => "SignatureMissing",
            Reason::SignatureInvalid => "SignatureInvalid",
            Reason::NoTrustedKeys => "NoTrustedKeys",
            Reason::Untrusted => "Untrusted",
            Reason::InvalidReference => "InvalidReference",
            Reason::CompileFailed => "CompileFailed",
            Reason::KindMismatch => "KindMismatch",
            Reason::Incompatible => "Incompatible",
            Reason::FailedProbe => "FailedProbe",
            Reason::InvalidSpec => "InvalidSpec",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A reason and the message that says what happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: Reason,
    pub message: String,
}

impl Failure {
    pub fn new(reason: Reason, message: impl Into<String>) -> Failure {
        Failure {
            reason,
            message: message.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}
