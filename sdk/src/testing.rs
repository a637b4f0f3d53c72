//! Native test harness: runs a hook's logic with `cargo test`, no wasm involved.
//!
//! Calls go through the same conversions as the component's exports (SDK types to wire records and
//! back), settings come from [`Harness::settings`] and log lines are collected for assertions.
//!
//! ```
//! use plexus_sdk::testing::Harness;
//! use plexus_sdk::{Pod, Status, StatusEntry};
//!
//! struct Noop;
//! impl Status for Noop {}
//!
//! let out = Harness::new()
//!     .pod(Pod::new("default", "web"))
//!     .shape::<Noop>(vec![StatusEntry::new("default/pod-net", true)])
//!     .unwrap();
//! assert_eq!(out[0].name, "default/pod-net");
//! ```

use crate::glue;
use crate::log::Level;
use crate::types::{ClaimDevice, Decision, Error, Pod, Selection, StatusEntry};
use crate::{Policy, Resolver, Status};
use serde_json::Value;
use std::cell::RefCell;

/// Runs hook calls natively with given settings and pod.
#[derive(Debug, Default)]
pub struct Harness {
    settings: Value,
    pod: Pod,
    pod_running: bool,
    devices: Vec<((String, String), ClaimDevice)>,
    logs: RefCell<Vec<(Level, String)>>,
}

impl Harness {
    /// A harness with no settings (`null`) and pod `default/test-pod`.
    pub fn new() -> Self {
        Harness {
            settings: Value::Null,
            pod: Pod::new("default", "test-pod"),
            pod_running: false,
            devices: Vec::new(),
            logs: RefCell::new(Vec::new()),
        }
    }

    /// The hook's settings, as they would appear in the plexus configuration.
    pub fn settings(mut self, settings: Value) -> Self {
        self.settings = settings;
        self
    }

    /// What `pod_running()` answers in every call (`false`: the ADD that makes the sandbox).
    pub fn pod_running(mut self, running: bool) -> Self {
        self.pod_running = running;
        self
    }

    /// What `selection_device()` answers for the selection of network `namespace`/`name` in every call.
    pub fn device(mut self, namespace: &str, name: &str, device: ClaimDevice) -> Self {
        self.devices
            .push(((namespace.to_string(), name.to_string()), device));
        self
    }

    /// The pod passed to every call.
    pub fn pod(mut self, pod: Pod) -> Self {
        self.pod = pod;
        self
    }

    /// Every line the hook logged so far through this harness.
    pub fn logs(&self) -> Vec<(Level, String)> {
        self.logs.borrow().clone()
    }

    /// Calls `P::check` as the host would.
    pub fn check<P: Policy>(&self, selections: Vec<Selection>) -> Result<Decision, Error> {
        let wire: Vec<_> = selections
            .into_iter()
            .map(glue::selection_to_wire)
            .collect();
        let pod = glue::pod_to_wire(&self.pod);
        let out = self.run(|| glue::policy_check::<P>(pod, wire))?;
        glue::decision_from_wire(out)
    }

    /// Calls `R::resolve` as the host would.
    pub fn resolve<R: Resolver>(
        &self,
        selection: &Selection,
        nad: Option<&Value>,
        config: Option<&Value>,
    ) -> Result<Option<Value>, Error> {
        let pod = glue::pod_to_wire(&self.pod);
        let sel = glue::selection_to_wire(selection.clone());
        let nad = nad.map(Value::to_string);
        let config = config.map(Value::to_string);
        let out = self.run(|| glue::resolver_resolve::<R>(pod, sel, nad, config))?;
        out.map(|text| serde_json::from_str(&text).map_err(Error::from))
            .transpose()
    }

    /// Calls `S::shape` as the host would.
    pub fn shape<S: Status>(&self, entries: Vec<StatusEntry>) -> Result<Vec<StatusEntry>, Error> {
        let pod = glue::pod_to_wire(&self.pod);
        let wire: Vec<_> = entries.into_iter().map(glue::entry_to_wire).collect();
        let out = self.run(|| glue::status_shape::<S>(pod, wire))?;
        out.into_iter().map(glue::entry_from_wire).collect()
    }

    fn run<T>(&self, call: impl FnOnce() -> Result<T, String>) -> Result<T, Error> {
        native::SETTINGS.with(|s| *s.borrow_mut() = self.settings.to_string());
        native::POD_RUNNING.with(|r| r.set(self.pod_running));
        native::DEVICES.with(|d| *d.borrow_mut() = self.devices.clone());
        native::LOGS.with(|l| l.borrow_mut().clear());
        let out = call();
        let logs = native::LOGS.with(|l| std::mem::take(&mut *l.borrow_mut()));
        self.logs.borrow_mut().extend(logs);
        out.map_err(Error::msg)
    }
}

/// The native stand-ins for the host imports.
pub(crate) mod native {
    use crate::log::Level;
    use std::cell::RefCell;

    thread_local! {
        pub(crate) static SETTINGS: RefCell<String> = RefCell::new("null".to_string());
        pub(crate) static POD_RUNNING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        pub(crate) static LOGS: RefCell<Vec<(Level, String)>> = const { RefCell::new(Vec::new()) };
        pub(crate) static DEVICES: RefCell<Vec<((String, String), crate::ClaimDevice)>> =
            const { RefCell::new(Vec::new()) };
    }

    #[allow(dead_code)]
    pub(crate) fn selection_device(namespace: &str, name: &str) -> Option<crate::ClaimDevice> {
        DEVICES.with(|d| {
            d.borrow()
                .iter()
                .find(|((ns, n), _)| ns == namespace && n == name)
                .map(|(_, device)| device.clone())
        })
    }

    #[allow(dead_code)]
    pub(crate) fn settings() -> String {
        SETTINGS.with(|s| s.borrow().clone())
    }

    #[allow(dead_code)]
    pub(crate) fn pod_running() -> bool {
        POD_RUNNING.with(|r| r.get())
    }

    #[allow(dead_code)]
    pub(crate) fn log(level: Level, message: &str) {
        LOGS.with(|l| l.borrow_mut().push((level, message.to_string())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Bandwidth, Dns, PortMapping};
    use serde_json::json;

    struct Echo;
    impl Policy for Echo {
        fn check(_pod: &Pod, selections: Vec<Selection>) -> Result<Decision, Error> {
            Ok(Decision::Rewrite(selections))
        }
    }
    impl Status for Echo {}

    struct Fails;
    impl Policy for Fails {
        fn check(_pod: &Pod, _s: Vec<Selection>) -> Result<Decision, Error> {
            let _: std::collections::BTreeMap<String, u32> = crate::settings()?;
            Ok(Decision::Admit)
        }
    }

    #[test]
    fn every_selection_key_survives_the_wire() {
        let mut s = Selection::new("ns", "net");
        s.ips = Some(vec!["10.0.0.1/24".into()]);
        s.mac = Some("02:00:00:00:00:01".into());
        s.interface = Some("net1".into());
        s.cni_args = Some(json!({"a": 1}).as_object().unwrap().clone());
        s.port_mappings = Some(vec![PortMapping {
            host_port: 8080,
            container_port: 80,
            protocol: Some("tcp".into()),
        }]);
        s.bandwidth = Some(Bandwidth {
            ingress_rate: Some(1000),
            ..Bandwidth::default()
        });
        s.default_route = Some(vec!["10.0.0.254".into()]);
        s.infiniband_guid = Some("24:8a:07:03:00:8d:ae:2f".into());
        s.ipam_claim_reference = Some("claim".into());
        s.extras.insert("org.example.vlan".into(), json!({"id": 7}));
        let out = Harness::new().check::<Echo>(vec![s.clone()]).unwrap();
        assert_eq!(out, Decision::Rewrite(vec![s]));
    }

    #[test]
    fn every_status_key_survives_the_wire() {
        let mut e = StatusEntry::new("ns/net", false);
        e.interface = Some("net1".into());
        e.ips = Some(vec!["10.0.0.1".into()]);
        e.mac = Some("02:00:00:00:00:01".into());
        e.mtu = Some(1400);
        e.dns = Some(Dns {
            nameservers: Some(vec!["10.0.0.53".into()]),
            domain: Some("example.com".into()),
            search: None,
        });
        e.default_route = Some(vec!["10.0.0.254".into()]);
        e.device_info = Some(json!({"type": "pci"}).as_object().unwrap().clone());
        e.extras.insert("org.example.x".into(), json!([1, 2]));
        let out = Harness::new().shape::<Echo>(vec![e.clone()]).unwrap();
        assert_eq!(out, vec![e]);
    }

    #[test]
    fn bad_settings_are_an_error_of_the_hook() {
        let err = Harness::new()
            .settings(json!({"x": "not a number"}))
            .check::<Fails>(vec![])
            .unwrap_err();
        assert!(err.to_string().contains("invalid settings"), "{err}");
        let ok = Harness::new()
            .settings(json!({"x": 3}))
            .check::<Fails>(vec![]);
        assert_eq!(ok, Ok(Decision::Admit));
    }
}
