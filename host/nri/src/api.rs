//! The NRI messages Plexus reads and writes, declared here from the protocol's definition (`pkg/api/api.proto` of
//! github.com/containerd/nri, package `nri.pkg.api.v1alpha1`; field numbers as of v0.12). Only the fields Plexus
//! uses are declared: protobuf skips the others when decoding, and an answer without them means "no change".

use std::collections::HashMap;

/// The runtime's service, which the plugin calls.
pub const RUNTIME: &str = "nri.pkg.api.v1alpha1.Runtime";
/// The plugin's service, which the runtime calls.
pub const PLUGIN: &str = "nri.pkg.api.v1alpha1.Plugin";

/// The NRI version this crate's messages follow, sent at registration.
pub const NRI_VERSION: &str = "v0.12.3";

/// NRI's events, by their number in the protocol's `Event` enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    RunPodSandbox = 1,
    StopPodSandbox = 2,
    RemovePodSandbox = 3,
    /// A container about to be made in a pod's sandbox: the runtime's `CreateContainer` call, which carries the
    /// pod (and the container, which Plexus does not read). An error fails the container's creation.
    CreateContainer = 4,
}

impl Event {
    /// The pod events a `StateChange` call may carry (a container's are not read).
    pub fn from_number(n: i32) -> Option<Event> {
        match n {
            1 => Some(Event::RunPodSandbox),
            2 => Some(Event::StopPodSandbox),
            3 => Some(Event::RemovePodSandbox),
            _ => None,
        }
    }

    /// The subscription mask of `events`, as `ConfigureResponse.events` carries it: bit `n - 1` for event `n`.
    pub fn mask(events: &[Event]) -> i32 {
        events.iter().fold(0, |m, e| m | 1 << (*e as i32 - 1))
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RegisterPluginRequest {
    #[prost(string, tag = "1")]
    pub plugin_name: String,
    /// Two digits: the plugin's place in the runtime's order of plugins.
    #[prost(string, tag = "2")]
    pub plugin_idx: String,
    #[prost(string, tag = "3")]
    pub nri_version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ConfigureRequest {
    #[prost(string, tag = "1")]
    pub config: String,
    #[prost(string, tag = "2")]
    pub runtime_name: String,
    #[prost(string, tag = "3")]
    pub runtime_version: String,
    /// Milliseconds.
    #[prost(int64, tag = "4")]
    pub registration_timeout: i64,
    /// Milliseconds: how long the runtime waits for the plugin's answer to one request.
    #[prost(int64, tag = "5")]
    pub request_timeout: i64,
    #[prost(string, tag = "6")]
    pub nri_version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ConfigureResponse {
    #[prost(int32, tag = "2")]
    pub events: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SynchronizeRequest {
    #[prost(message, repeated, tag = "1")]
    pub pods: Vec<PodSandbox>,
    // 2: the containers, not read.
    /// More requests follow with the rest of the pods and containers.
    #[prost(bool, tag = "3")]
    pub more: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SynchronizeResponse {
    // 1: container updates, never sent.
    #[prost(bool, tag = "2")]
    pub more: bool,
}

/// `RunPodSandboxRequest`, `StopPodSandboxRequest` and `RemovePodSandboxRequest` alike: the pod, field 1.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    pub pod: Option<PodSandbox>,
}

/// The deprecated form of an event, for runtimes that send it instead of the event's own call.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StateChangeEvent {
    #[prost(int32, tag = "1")]
    pub event: i32,
    #[prost(message, optional, tag = "2")]
    pub pod: Option<PodSandbox>,
    // 3: the container, not read.
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandbox {
    /// The sandbox's id (the CNI container id of its network attachments).
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub uid: String,
    #[prost(string, tag = "4")]
    pub namespace: String,
    #[prost(map = "string, string", tag = "5")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "6")]
    pub annotations: HashMap<String, String>,
    #[prost(string, tag = "7")]
    pub runtime_handler: String,
    #[prost(message, optional, tag = "8")]
    pub linux: Option<LinuxPodSandbox>,
    #[prost(uint32, tag = "9")]
    pub pid: u32,
    /// The pod's addresses on the cluster network, as the runtime's CNI reported them.
    #[prost(string, repeated, tag = "10")]
    pub ips: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxPodSandbox {
    // 1, 2, 6: resources; 4: the cgroups path; not read.
    #[prost(string, tag = "3")]
    pub cgroup_parent: String,
    #[prost(message, repeated, tag = "5")]
    pub namespaces: Vec<LinuxNamespace>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxNamespace {
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(string, tag = "2")]
    pub path: String,
}

impl PodSandbox {
    /// `namespace/name`: how messages name the pod.
    pub fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The path of the sandbox's network namespace, when the runtime gave one (it leaves it out once the namespace
    /// is gone, and for a pod on the host's network).
    pub fn network_namespace(&self) -> Option<&str> {
        self.linux
            .as_ref()?
            .namespaces
            .iter()
            .find(|n| n.r#type == "network" && !n.path.is_empty())
            .map(|n| n.path.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    #[test]
    fn the_event_mask_has_bit_n_minus_one_for_event_n() {
        assert_eq!(Event::mask(&[Event::RunPodSandbox]), 0b1);
        assert_eq!(
            Event::mask(&[
                Event::RunPodSandbox,
                Event::StopPodSandbox,
                Event::RemovePodSandbox
            ]),
            0b111
        );
        assert_eq!(Event::mask(&[Event::RemovePodSandbox]), 0b100);
        assert_eq!(
            Event::mask(&[Event::RunPodSandbox, Event::CreateContainer]),
            0b1001
        );
    }

    /// `CreateContainerRequest` is `{pod = 1, container = 2}`: the pod decodes as a `PodSandboxRequest`'s, the
    /// container skipped.
    #[test]
    fn a_create_container_call_decodes_as_its_pod() {
        let pod = PodSandbox {
            id: "sb".into(),
            name: "web".into(),
            ..PodSandbox::default()
        }
        .encode_to_vec();
        let mut wire = vec![0x0a, pod.len() as u8];
        wire.extend(&pod);
        // container { id: "c1" }
        wire.extend([0x12, 4, 0x0a, 2, b'c', b'1']);
        let req = PodSandboxRequest::decode(wire.as_slice()).unwrap();
        assert_eq!(
            req.pod.map(|p| (p.id, p.name)),
            Some(("sb".into(), "web".into()))
        );
    }

    /// The field numbers, checked against bytes written by hand from the protocol's definition: a pod with its id
    /// (1), namespace (4), one annotation (6), its network namespace (8 → 5 → 1, 2) and one address (10), with an
    /// unknown field (99) that a newer runtime might add.
    #[test]
    fn a_pod_decodes_from_the_protocols_field_numbers() {
        let mut wire = vec![0x0a, 2, b'i', b'd', 0x22, 2, b'n', b's'];
        // annotations: map entry {1: "k", 2: "v"}
        wire.extend([0x32, 6, 0x0a, 1, b'k', 0x12, 1, b'v']);
        // linux { namespaces { type: "network", path: "/p" } }
        let ns = [&[0x0a, 7][..], b"network", &[0x12, 2], b"/p"].concat();
        let linux = [&[0x2a, ns.len() as u8][..], &ns].concat();
        wire.extend([0x42, linux.len() as u8]);
        wire.extend(linux);
        wire.extend([0x52, 8]);
        wire.extend(b"10.0.0.2");
        wire.extend([0x98, 0x06, 1]); // field 99, varint 1
        let pod = PodSandbox::decode(wire.as_slice()).unwrap();
        assert_eq!((pod.id.as_str(), pod.namespace.as_str()), ("id", "ns"));
        assert_eq!(pod.annotations.get("k").map(String::as_str), Some("v"));
        assert_eq!(pod.network_namespace(), Some("/p"));
        assert_eq!(pod.ips, vec!["10.0.0.2"]);
    }

    #[test]
    fn a_pod_without_a_network_namespace_path_has_none() {
        let mut pod = PodSandbox::default();
        assert_eq!(pod.network_namespace(), None);
        pod.linux = Some(LinuxPodSandbox {
            cgroup_parent: String::new(),
            namespaces: vec![
                LinuxNamespace {
                    r#type: "ipc".into(),
                    path: "/ipc".into(),
                },
                LinuxNamespace {
                    r#type: "network".into(),
                    path: String::new(),
                },
            ],
        });
        assert_eq!(pod.network_namespace(), None);
    }
}
