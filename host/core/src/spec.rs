//! The multi-net spec (v1.3) rules: selection annotation, NAD resolution, naming, runtimeConfig, status.

pub mod objects;

pub use objects::{NetworkAttachmentDefinition, Pod, PodRef};
