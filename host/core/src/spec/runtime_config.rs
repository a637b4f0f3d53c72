//! What a selection adds to the delegate's CNI configuration (the "CNI Delegating Plugin Requirements" of
//! 4.1.2.1.3 to 4.1.2.1.11): `runtimeConfig` entries in CNI CONVENTIONS.md form, the capability check, and
//! `args.cni` for `cni-args` and `ipam-claim-reference`.

use serde_json::{Map, Value};
use thiserror::Error;

use super::selection::{port_mapping_json, Selection};

/// The burst, in bits, used for a rate given without its burst.
///
/// The CNI reference `bandwidth` plugin refuses a rate without a burst ("if rate is set, burst must also be
/// set") and a burst of 4 GiB (bytes) or more. Kubelet's CNI driver uses `math.MaxInt32` bits for
/// pod bandwidth annotations, "in practice ... the equivalent of setting no limit"; Plexus does the same.
pub const DEFAULT_BURST_BITS: u64 = i32::MAX as u64;

/// The `args.cni` key that carries `ipam-claim-reference` to delegates.
///
/// The spec defines no transport. OVN-Kubernetes reads the claim from the pod's annotation itself and
/// Multus forwards nothing, so Plexus uses the CONVENTIONS.md channel for optional data a plugin may ignore
/// (`args.cni`), under the spec's own key name. This matches 4.1.2.1.11: delegates that do not implement the
/// feature "simply ignore this request".
pub const IPAM_CLAIM_REFERENCE_ARG: &str = "ipam-claim-reference";

/// A capability the selection requires that no plugin of the attachment declares (4.1.2.1.3.2 etc.).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("network {network}: the selection requires the {capability:?} capability, but no plugin in its configuration declares \"capabilities\": {{\"{capability}\": true}}")]
pub struct CapabilityError {
    /// The attachment's network, as the caller names it (normally `namespace/name`).
    pub network: String,
    pub capability: String,
}

impl Selection {
    /// The `runtimeConfig` entries this selection requires, keyed as CNI CONVENTIONS.md names them:
    /// `ips` (4.1.2.1.3.2), `mac` (4.1.2.1.4.2), `infinibandGUID` (4.1.2.1.10.2), `portMappings`
    /// (4.1.2.1.7.2: `{hostPort, containerPort, protocol}` with the protocol in lower case, plus `hostIP` when
    /// given) and `bandwidth` (4.1.2.1.8.2: `{ingressRate, ingressBurst, egressRate, egressBurst}` for the
    /// directions given, a missing burst defaulting to [`DEFAULT_BURST_BITS`]).
    ///
    /// Apply it per plugin with [`filter_runtime_config`], which keeps what that plugin declares.
    pub fn runtime_config(&self) -> Map<String, Value> {
        let mut rc = Map::new();
        if !self.ips.is_empty() {
            rc.insert(
                "ips".into(),
                self.ips.iter().cloned().map(Value::String).collect(),
            );
        }
        if let Some(mac) = &self.mac {
            rc.insert("mac".into(), Value::String(mac.clone()));
        }
        if let Some(guid) = &self.infiniband_guid {
            rc.insert("infinibandGUID".into(), Value::String(guid.clone()));
        }
        if let Some(pms) = &self.port_mappings {
            rc.insert(
                "portMappings".into(),
                pms.iter().map(port_mapping_json).collect(),
            );
        }
        if let Some(bw) = &self.bandwidth {
            let mut m = Map::new();
            if let Some(rate) = bw.ingress_rate {
                m.insert("ingressRate".into(), rate.into());
                m.insert(
                    "ingressBurst".into(),
                    bw.ingress_burst.unwrap_or(DEFAULT_BURST_BITS).into(),
                );
            }
            if let Some(rate) = bw.egress_rate {
                m.insert("egressRate".into(), rate.into());
                m.insert(
                    "egressBurst".into(),
                    bw.egress_burst.unwrap_or(DEFAULT_BURST_BITS).into(),
                );
            }
            rc.insert("bandwidth".into(), Value::Object(m));
        }
        rc
    }

    /// The capabilities at least one plugin must declare for this selection, in a fixed order: `ips`,
    /// `mac`, `infinibandGUID`, `portMappings`, `bandwidth`. `ipam-claim-reference` requires none: delegates
    /// may ignore it (4.1.2.1.11).
    pub fn required_capabilities(&self) -> Vec<&'static str> {
        let mut caps = Vec::new();
        if !self.ips.is_empty() {
            caps.push("ips");
        }
        if self.mac.is_some() {
            caps.push("mac");
        }
        if self.infiniband_guid.is_some() {
            caps.push("infinibandGUID");
        }
        if self.port_mappings.is_some() {
            caps.push("portMappings");
        }
        if self.bandwidth.is_some() {
            caps.push("bandwidth");
        }
        caps
    }

    /// The `args.cni` entries for this selection's delegates: `cni-args` (4.1.2.1.6), plus
    /// [`IPAM_CLAIM_REFERENCE_ARG`] when `ipam-claim-reference` is set (it wins over a same-named
    /// `cni-args` key). `None` when there is nothing to add (no keys).
    pub fn delegate_cni_args(&self) -> Option<Map<String, Value>> {
        let mut args = self.cni_args.clone().unwrap_or_default();
        if let Some(claim) = &self.ipam_claim_reference {
            args.insert(
                IPAM_CLAIM_REFERENCE_ARG.into(),
                Value::String(claim.clone()),
            );
        }
        if args.is_empty() {
            None
        } else {
            Some(args)
        }
    }
}

/// Whether `plugin` declares `"capabilities": {capability: true}` (exactly the JSON boolean `true`).
pub fn has_capability(plugin: &Map<String, Value>, capability: &str) -> bool {
    plugin
        .get("capabilities")
        .and_then(Value::as_object)
        .and_then(|c| c.get(capability))
        == Some(&Value::Bool(true))
}

/// Each required capability must be declared by at least one of the attachment's plugins, or "the entire
/// attachment request must fail" (4.1.2.1.3.2, .4.2, .7.2, .8.2, .10.2). The error names the first missing
/// capability and `network`.
pub fn check_capabilities(
    required: &[&str],
    plugins: &[Map<String, Value>],
    network: &str,
) -> Result<(), CapabilityError> {
    for cap in required {
        if !plugins.iter().any(|p| has_capability(p, cap)) {
            return Err(CapabilityError {
                network: network.to_owned(),
                capability: (*cap).to_owned(),
            });
        }
    }
    Ok(())
}

/// The plugin objects of a network configuration: the `plugins` list of a configuration list, or the
/// configuration itself when it has no `plugins` key. Non-object list entries are skipped.
pub fn config_plugins(config: &Value) -> Vec<Map<String, Value>> {
    match config.get("plugins") {
        Some(Value::Array(ps)) => ps.iter().filter_map(|p| p.as_object().cloned()).collect(),
        Some(_) => Vec::new(),
        None => config.as_object().cloned().into_iter().collect(),
    }
}

/// The part of `runtime_config` one plugin receives: the keys it declares as capabilities, as libcni
/// injects `runtimeConfig` (a plugin must not be sent capabilities it did not ask for).
pub fn filter_runtime_config(
    runtime_config: &Map<String, Value>,
    plugin: &Map<String, Value>,
) -> Map<String, Value> {
    runtime_config
        .iter()
        .filter(|(k, _)| has_capability(plugin, k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Sets `plugin["runtimeConfig"]` to the part of `runtime_config` the plugin declares (see
/// [`filter_runtime_config`]), as libcni's `injectRuntimeConfig` does: when nothing applies the plugin is
/// left unchanged; otherwise its `runtimeConfig` is replaced.
pub fn inject_runtime_config(plugin: &mut Map<String, Value>, runtime_config: &Map<String, Value>) {
    let rc = filter_runtime_config(runtime_config, plugin);
    if !rc.is_empty() {
        plugin.insert("runtimeConfig".into(), Value::Object(rc));
    }
}

/// Writes `annotation_args` into `plugin["args"]["cni"]` (4.1.2.1.6.2): keys from the annotation win over
/// the configuration's own `args.cni` keys of the same name; the configuration's other keys stay. A
/// non-object `args` or `args.cni` (invalid per CNI, where `args` is a dictionary) is replaced.
pub fn merge_cni_args(plugin: &mut Map<String, Value>, annotation_args: &Map<String, Value>) {
    let args = plugin
        .entry("args")
        .and_modify(|a| {
            if !a.is_object() {
                *a = Value::Object(Map::new());
            }
        })
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(args) = args else {
        unreachable!("args was made an object")
    };
    let cni = args
        .entry("cni")
        .and_modify(|c| {
            if !c.is_object() {
                *c = Value::Object(Map::new());
            }
        })
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(cni) = cni else {
        unreachable!("args.cni was made an object")
    };
    for (k, v) in annotation_args {
        cni.insert(k.clone(), v.clone());
    }
}

/// [`merge_cni_args`] applied to a whole configuration: each plugin of a configuration list, or the single
/// configuration.
pub fn merge_cni_args_into_config(config: &mut Value, annotation_args: &Map<String, Value>) {
    let Value::Object(obj) = config else {
        return;
    };
    match obj.get_mut("plugins") {
        Some(Value::Array(ps)) => {
            for p in ps.iter_mut().filter_map(Value::as_object_mut) {
                merge_cni_args(p, annotation_args);
            }
        }
        Some(_) => {}
        None => merge_cni_args(obj, annotation_args),
    }
}
