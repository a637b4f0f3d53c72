//! The multi-net spec (v1.3) rules: selection annotation, NAD resolution, naming, runtimeConfig, status.
//!
//! Every function here is pure. `docs/conformance.md` maps each clause to the code and the test that
//! checks it, and records the choices made where the spec's text is ambiguous.

pub mod dra;
pub mod naming;
pub mod objects;
pub mod resolve;
pub mod runtime_config;
pub mod selection;
pub mod status;

/// Whether `key` may name an implementation's extension in a selection element or a status entry: the spec
/// reserves keys without a period, and extensions use reverse domain name notation (`org.example.key`), so a
/// period at either end or two in a row is not one.
pub fn is_extension_key(key: &str) -> bool {
    key.contains('.') && !key.starts_with('.') && !key.ends_with('.') && !key.contains("..")
}

/// What kind of JSON value `v` is, as an error message says it ("a list", "an object").
pub(crate) fn json_type(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// `v` as JSON text for an error message, cut to `max` characters (the last three an ellipsis).
pub(crate) fn json_excerpt(v: &serde_json::Value, max: usize) -> String {
    let s = v.to_string();
    if s.chars().count() > max {
        let cut: String = s.chars().take(max.saturating_sub(3)).collect();
        format!("{cut}...")
    } else {
        s
    }
}

pub use naming::{
    is_dns1123_label, validate_container_id, validate_dns1123_label, validate_ifname,
    validate_network_name, IfNameAllocator, NamingError,
};
pub use objects::{NetworkAttachmentDefinition, Pod, PodClaimRef, PodRef};
pub use resolve::{resolve_nad, ConfigSource, OnDiskConf, ResolveError, ResolvedConfig};
pub use runtime_config::{
    check_capabilities, config_plugins, filter_runtime_config, has_capability,
    inject_runtime_config, merge_cni_args, merge_cni_args_into_config, CapabilityError,
    DEFAULT_BURST_BITS, IPAM_CLAIM_REFERENCE_ARG,
};
pub use selection::{
    parse_selection_annotation, parse_selections, validate_selections, Bandwidth,
    InvalidSelectionPolicy, ParsedSelections, PortMapping, Protocol, Selection, SelectionError,
};
pub use status::{
    default_gateways, network_status, status_annotation_value, status_default_route,
    validate_status_entries, Dns, NetworkStatus, StatusError,
};
