//! The Plexus guest SDK: write policy, resolver and status hooks in Rust and export them as a WASI
//! component with one macro.
//!
//! A hook is a type implementing one or more of [`Policy`], [`Resolver`] and [`Status`]; every method
//! has a default that changes nothing, so a hook implements only what it needs. [`export!`] turns it
//! into the component's exports. Settings come from the hook's entry in the plexus configuration and
//! are read, typed, with [`settings`]. [`log`] writes to the plexus log. The [`testing`] module runs
//! the same code natively, so hook logic is tested with `cargo test`.
//!
//! # Example
//!
//! A policy that only admits networks whose name starts with a prefix from its settings:
//!
//! ```
//! use plexus_sdk::{Decision, Error, Pod, Policy, Selection};
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! #[serde(rename_all = "camelCase")]
//! struct Settings {
//!     #[serde(default = "default_prefix")]
//!     allowed_prefix: String,
//! }
//!
//! fn default_prefix() -> String {
//!     "shared-".to_string()
//! }
//!
//! struct PrefixPolicy;
//!
//! impl Policy for PrefixPolicy {
//!     fn check(pod: &Pod, selections: Vec<Selection>) -> Result<Decision, Error> {
//!         let settings: Settings = plexus_sdk::settings()?;
//!         for s in &selections {
//!             if !s.name.starts_with(&settings.allowed_prefix) {
//!                 plexus_sdk::log::info(format!("{}/{} asked for {}", pod.namespace, pod.name, s.name));
//!                 return Ok(Decision::Deny(format!("network {} is not allowed", s.name)));
//!             }
//!         }
//!         Ok(Decision::Admit)
//!     }
//! }
//!
//! // In a guest crate (crate-type = ["cdylib"]) this line creates the component's exports:
//! // plexus_sdk::export!(policy: PrefixPolicy);
//!
//! // Natively, the testing harness runs the same logic:
//! use plexus_sdk::testing::Harness;
//! use serde_json::json;
//!
//! let harness = Harness::new().settings(json!({"allowedPrefix": "lab-"}));
//! let decision = harness
//!     .check::<PrefixPolicy>(vec![Selection::new("default", "lab-net")])
//!     .unwrap();
//! assert_eq!(decision, Decision::Admit);
//! let decision = harness
//!     .check::<PrefixPolicy>(vec![Selection::new("default", "prod-net")])
//!     .unwrap();
//! assert_eq!(decision, Decision::Deny("network prod-net is not allowed".into()));
//! assert_eq!(harness.logs().len(), 1);
//! ```

extern crate self as plexus_sdk;

mod glue;
pub mod log;
pub mod testing;
mod types;

pub use serde_json::Value;
pub use types::{
    Bandwidth, ClaimDevice, Decision, Dns, Error, Pod, PortMapping, Selection, StatusEntry,
};

/// The generated wire bindings; use the SDK's types and [`export!`] instead.
#[doc(hidden)]
#[allow(unsafe_code, clippy::all, missing_docs)]
pub mod wit {
    wit_bindgen::generate!({
        path: "../wit",
        world: "hooks",
        pub_export_macro: true,
        export_macro_name: "__export_hooks_impl",
        default_bindings_module: "plexus_sdk::wit",
        runtime_path: "plexus_sdk::__private::wit_bindgen::rt",
    });
}

/// Annotation policy (spec 7.4): admit, deny or rewrite a pod's selections.
pub trait Policy {
    /// Called with the pod's selection list (every element has its namespace filled). The default
    /// admits everything.
    fn check(pod: &Pod, selections: Vec<Selection>) -> Result<Decision, Error> {
        let _ = (pod, selections);
        Ok(Decision::Admit)
    }
}

/// NAD resolution: supply or rewrite the delegate CNI configuration of one selection.
pub trait Resolver {
    /// `nad` is the NetworkAttachmentDefinition object (`None` when it does not exist), `config` the
    /// delegate configuration found so far (`None` when there is none yet). Return `Some(config)` to
    /// supply or replace it: a CNI object with `"type"`, or a conflist with `"plugins"`. The default
    /// changes nothing.
    fn resolve(
        pod: &Pod,
        selection: &Selection,
        nad: Option<&Value>,
        config: Option<&Value>,
    ) -> Result<Option<Value>, Error> {
        let _ = (pod, selection, nad, config);
        Ok(None)
    }
}

/// Status shaping: adjust the network-status entries before they are written.
pub trait Status {
    /// Return the entries to write. Keys outside the spec must be reverse-DNS names and exactly one
    /// entry must stay `default`. The default returns them unchanged.
    fn shape(pod: &Pod, entries: Vec<StatusEntry>) -> Result<Vec<StatusEntry>, Error> {
        let _ = pod;
        Ok(entries)
    }
}

/// Whether the pod is already running: `true` when this call is part of a change of a running pod's networks
/// (the node daemon's dynamic networks), `false` during the ADD that makes its sandbox (WIT 0.1.1).
pub fn pod_running() -> bool {
    host::pod_running()
}

/// The claim device `selection`'s network will use, if it uses one (Dynamic Resource Allocation, WIT 0.1.2): in
/// a resolver call the device planning gave that selection; in a policy call the device of each network a
/// ResourceClaim asks for. `None` otherwise. In native tests: [`testing::Harness::device`].
pub fn selection_device(selection: &Selection) -> Option<ClaimDevice> {
    host::selection_device(&selection.namespace, &selection.name)
}

/// The hook's settings (the `settings` of its entry in the plexus configuration), deserialized.
///
/// Absent settings deserialize from an empty object, so a settings type whose fields all have serde
/// defaults works without configuration.
pub fn settings<T: serde::de::DeserializeOwned>() -> Result<T, Error> {
    let text = host::settings();
    let value: Value = serde_json::from_str(&text)?;
    let value = if value.is_null() {
        Value::Object(Default::default())
    } else {
        value
    };
    serde_json::from_value(value).map_err(|e| Error::msg(format_args!("invalid settings: {e}")))
}

/// Exports hook types as the component's `policy`, `resolver` and `status` interfaces.
///
/// Name each kind the component implements with the type implementing it. The component declares exactly
/// those kinds (in its `plexus:hooks/kinds` custom section): `plexus hook inspect` lists them, and the host
/// refuses the component for any other kind (a node reports such a NetworkHook as `KindMismatch`). The kinds not
/// named are still exported, as pass-throughs (admit / unchanged / unchanged) that the host never calls:
///
/// ```ignore
/// plexus_sdk::export!(policy: MyPolicy);
/// plexus_sdk::export!(policy: MyHook, status: MyHook);
/// ```
///
/// Use it once per component, at the crate root of a `cdylib`.
#[macro_export]
macro_rules! export {
    ($($kind:ident : $ty:ty),+ $(,)?) => {
        $( $crate::__check_kind!($kind); )+

        /// The kinds this component implements, as the host reads them.
        #[cfg(target_arch = "wasm32")]
        #[doc(hidden)]
        #[link_section = "plexus:hooks/kinds"]
        #[used]
        pub static __PLEXUS_HOOK_KINDS: [u8; $crate::__private::kinds_len(&[$(stringify!($kind)),+])] =
            $crate::__private::kinds(&[$(stringify!($kind)),+]);

        #[doc(hidden)]
        pub struct __PlexusHooks;

        impl $crate::wit::exports::plexus::hooks::policy::Guest for __PlexusHooks {
            fn check(
                pod: $crate::wit::plexus::hooks::types::Pod,
                selections: ::std::vec::Vec<$crate::wit::plexus::hooks::types::Selection>,
            ) -> ::std::result::Result<
                $crate::wit::exports::plexus::hooks::policy::Decision,
                ::std::string::String,
            > {
                $crate::__private::policy_check::<$crate::__pick!(policy; $($kind : $ty),+)>(
                    pod, selections,
                )
            }
        }

        impl $crate::wit::exports::plexus::hooks::resolver::Guest for __PlexusHooks {
            fn resolve(
                pod: $crate::wit::plexus::hooks::types::Pod,
                selection: $crate::wit::plexus::hooks::types::Selection,
                nad: ::std::option::Option<::std::string::String>,
                config: ::std::option::Option<::std::string::String>,
            ) -> ::std::result::Result<
                ::std::option::Option<::std::string::String>,
                ::std::string::String,
            > {
                $crate::__private::resolver_resolve::<$crate::__pick!(resolver; $($kind : $ty),+)>(
                    pod, selection, nad, config,
                )
            }
        }

        impl $crate::wit::exports::plexus::hooks::status::Guest for __PlexusHooks {
            fn shape(
                pod: $crate::wit::plexus::hooks::types::Pod,
                entries: ::std::vec::Vec<$crate::wit::plexus::hooks::types::StatusEntry>,
            ) -> ::std::result::Result<
                ::std::vec::Vec<$crate::wit::plexus::hooks::types::StatusEntry>,
                ::std::string::String,
            > {
                $crate::__private::status_shape::<$crate::__pick!(status; $($kind : $ty),+)>(
                    pod, entries,
                )
            }
        }

        $crate::__export_hooks_impl!(__PlexusHooks with_types_in $crate::wit);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __check_kind {
    (policy) => {};
    (resolver) => {};
    (status) => {};
    ($other:ident) => {
        compile_error!(concat!(
            "unknown hook kind `",
            stringify!($other),
            "` (expected policy, resolver or status)"
        ));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __pick {
    ($want:ident;) => { $crate::__private::Passthrough };
    (policy; policy : $t:ty $(, $k:ident : $u:ty)*) => { $t };
    (resolver; resolver : $t:ty $(, $k:ident : $u:ty)*) => { $t };
    (status; status : $t:ty $(, $k:ident : $u:ty)*) => { $t };
    ($want:ident; $k0:ident : $t0:ty $(, $k:ident : $u:ty)*) => {
        $crate::__pick!($want; $($k : $u),*)
    };
}

/// What the export macro expands to; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::glue::{policy_check, resolver_resolve, status_shape};
    pub use wit_bindgen;

    /// The length of `names` joined by commas.
    pub const fn kinds_len(names: &[&str]) -> usize {
        let mut len = 0;
        let mut i = 0;
        while i < names.len() {
            len += names[i].len() + if i > 0 { 1 } else { 0 };
            i += 1;
        }
        len
    }

    /// `names` joined by commas, the content of the `plexus:hooks/kinds` custom section.
    pub const fn kinds<const N: usize>(names: &[&str]) -> [u8; N] {
        let mut out = [0u8; N];
        let (mut at, mut i) = (0, 0);
        while i < names.len() {
            if i > 0 {
                out[at] = b',';
                at += 1;
            }
            let name = names[i].as_bytes();
            let mut j = 0;
            while j < name.len() {
                out[at] = name[j];
                at += 1;
                j += 1;
            }
            i += 1;
        }
        out
    }

    /// Stands in for the kinds a component does not implement.
    pub struct Passthrough;
    impl crate::Policy for Passthrough {}
    impl crate::Resolver for Passthrough {}
    impl crate::Status for Passthrough {}
}

/// The host imports, or their native stand-ins driven by [`testing`].
mod host {
    #[cfg(target_arch = "wasm32")]
    pub(crate) fn settings() -> String {
        crate::wit::plexus::hooks::host::settings()
    }

    #[cfg(target_arch = "wasm32")]
    pub(crate) fn pod_running() -> bool {
        crate::wit::plexus::hooks::host::pod_running()
    }

    #[cfg(target_arch = "wasm32")]
    pub(crate) fn selection_device(namespace: &str, name: &str) -> Option<crate::ClaimDevice> {
        crate::wit::plexus::hooks::host::selection_device(namespace, name).map(|d| {
            crate::ClaimDevice {
                claim: d.claim,
                request: d.request,
                driver: d.driver,
                pool: d.pool,
                device: d.device,
                device_id: d.device_id,
                resource_name: d.resource_name,
            }
        })
    }

    #[cfg(target_arch = "wasm32")]
    pub(crate) fn log(level: crate::log::Level, message: &str) {
        use crate::log::Level;
        use crate::wit::plexus::hooks::host::{self as h, Level as W};
        let level = match level {
            Level::Error => W::Error,
            Level::Warn => W::Warn,
            Level::Info => W::Info,
            Level::Debug => W::Debug,
            Level::Trace => W::Trace,
        };
        h::log(level, message);
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) use crate::testing::native::{log, pod_running, selection_device, settings};
}
