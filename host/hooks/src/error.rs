//! Errors of the hook runtime. Every message names the hook it is about.

use crate::spec::HookKind;
use std::path::PathBuf;

/// An error from loading or calling hooks.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The hook misbehaved during a call (and its failurePolicy is Fail).
    #[error("hook {hook:?} ({kind}): {fault}")]
    Fault {
        hook: String,
        kind: HookKind,
        fault: Fault,
    },
    /// The hook's component could not be loaded.
    /// (The load error is part of the message, not a `source`, so that printing the message alone
    /// tells the whole story, as a CNI error message must.)
    #[error("hook {hook:?} ({kind}): {error}")]
    Load {
        hook: String,
        kind: HookKind,
        error: LoadError,
    },
    /// The hooks list itself is invalid.
    #[error("invalid hooks configuration: {0}")]
    Config(String),
    /// The wasm engine could not be set up.
    #[error("cannot set up the wasm engine: {0}")]
    Engine(String),
    /// What the caller gave the hooks breaks the spec (a selection element the spec's reader refuses).
    #[error("invalid hook input: {0}")]
    Input(String),
}

impl HookError {
    /// The name of the hook this error is about, if it is about one.
    pub fn hook(&self) -> Option<&str> {
        match self {
            HookError::Fault { hook, .. } | HookError::Load { hook, .. } => Some(hook),
            HookError::Config(_) | HookError::Engine(_) | HookError::Input(_) => None,
        }
    }
}

/// How a hook misbehaved during a call. A deny is not a fault: it is a decision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    #[error("timed out after {0} ms")]
    Timeout(u64),
    #[error("exceeded its memory limit of {0} MiB")]
    OutOfMemory(u64),
    #[error("trapped: {0}")]
    Trap(String),
    /// The guest returned its own error (bad settings, a bug).
    #[error("failed: {0}")]
    Failed(String),
    #[error("returned invalid output: {0}")]
    InvalidOutput(String),
    /// Plexus handed the hook a value the WIT records cannot carry.
    #[error("cannot pass input: {0}")]
    Input(String),
    /// The hook is selected for the node but not ready there (its module could not be pulled, verified,
    /// compiled or probed): every call it would get fails so.
    #[error("is not ready on this node: {0}")]
    NotReady(String),
}

/// Why a component could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{} has sha256 {actual}, the configuration pins {expected}", path.display())]
    Sha256Mismatch {
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("{} is not a valid component: {reason}", path.display())]
    Compile { path: PathBuf, reason: String },
    #[error("{} does not export {interface}", path.display())]
    MissingExport { path: PathBuf, interface: String },
    /// The component declares the kinds it implements, and this is not one of them (the interface it exports
    /// for it is the SDK's pass-through).
    #[error(
        "{} implements {} only, not {kind} (the kinds it declares; its other exports pass everything through)",
        path.display(),
        crate::declared::names(declared)
    )]
    KindNotImplemented {
        path: PathBuf,
        kind: crate::HookKind,
        declared: Vec<crate::HookKind>,
    },
    #[error("{} needs imports plexus does not provide: {reason}", path.display())]
    Link { path: PathBuf, reason: String },
}
