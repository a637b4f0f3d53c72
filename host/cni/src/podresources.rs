//! Devices from device plugins (Device Information Specification 4.1, 4.2.1): which devices kubelet allocated to
//! the pod, asked over the kubelet PodResources API (v1, gRPC over its unix socket).
//!
//! A NAD that names a device-plugin resource (annotation `k8s.v1.cni.cncf.io/resourceName`, as SR-IOV's) is
//! attached with one of the pod's devices of that resource: its ID goes to the delegate as `deviceID`, and the
//! device plugin's device-info file becomes the attachment's device information.
//!
//! Only the messages and fields Plexus reads are declared (prost's derive, no generated code); field numbers are
//! those of `k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`, and protobuf's rules skip the others.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use plexus_cluster::error_chain;
use plexus_core::spec::PodRef;
use tonic::codec::ProstCodec;
use tonic::transport::{Endpoint, Uri};

use crate::error::PlexusError;

/// The NAD annotation naming the device-plugin resource its network needs.
pub const RESOURCE_NAME_ANNOTATION: &str = "k8s.v1.cni.cncf.io/resourceName";
/// Where kubelet serves the PodResources API.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// Where device plugins write their device-info files (Device Information Specification 4.1).
pub const DEVICE_PLUGIN_INFO_DIR: &str = "/var/run/k8s.cni.cncf.io/devinfo/dp";
/// How long an ADD waits for kubelet's answer (connection included).
pub const POD_RESOURCES_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest answer read: a List answer covers every pod of the node.
const MAX_ANSWER_BYTES: usize = 4 << 20;

/// The gRPC messages, as declared by kubelet's `podresources/v1/api.proto`.
pub mod v1 {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodResourcesRequest {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodResourcesResponse {
        #[prost(message, repeated, tag = "1")]
        pub pod_resources: Vec<PodResources>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GetPodResourcesRequest {
        #[prost(string, tag = "1")]
        pub pod_name: String,
        #[prost(string, tag = "2")]
        pub pod_namespace: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GetPodResourcesResponse {
        #[prost(message, optional, tag = "1")]
        pub pod_resources: Option<PodResources>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodResources {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub namespace: String,
        #[prost(message, repeated, tag = "3")]
        pub containers: Vec<ContainerResources>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerResources {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, repeated, tag = "2")]
        pub devices: Vec<ContainerDevices>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerDevices {
        #[prost(string, tag = "1")]
        pub resource_name: String,
        #[prost(string, repeated, tag = "2")]
        pub device_ids: Vec<String>,
    }

    pub const LIST: &str = "/v1.PodResourcesLister/List";
    pub const GET: &str = "/v1.PodResourcesLister/Get";
}

/// Devices allocated to one pod: resource name -> device IDs, in the order kubelet lists them (containers in
/// order, each container's devices in order), without repeats.
pub type Allocated = BTreeMap<String, Vec<String>>;

/// Where the devices allocated to a pod come from.
pub trait DeviceSource {
    fn allocated(&self, pod: &PodRef) -> Result<Allocated, PlexusError>;
}

/// A fixed allocation, for tests and for callers without a kubelet.
#[derive(Debug, Clone, Default)]
pub struct FixedDevices(pub Allocated);

impl DeviceSource for FixedDevices {
    fn allocated(&self, _pod: &PodRef) -> Result<Allocated, PlexusError> {
        Ok(self.0.clone())
    }
}

/// The kubelet's PodResources API on its unix socket.
#[derive(Debug, Clone)]
pub struct KubeletPodResources {
    pub socket: PathBuf,
    pub timeout: Duration,
}

fn unavailable(socket: &Path, what: impl std::fmt::Display) -> PlexusError {
    PlexusError::NotReady(format!(
        "kubelet PodResources API at {}: {what}",
        socket.display()
    ))
}

impl DeviceSource for KubeletPodResources {
    /// `Get` (kubelet 1.27+), or `List` where kubelet does not implement `Get`. Bounded by `timeout` as a whole.
    fn allocated(&self, pod: &PodRef) -> Result<Allocated, PlexusError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| unavailable(&self.socket, e))?;
        let socket = self.socket.clone();
        let timeout = self.timeout;
        let found = runtime.block_on(async {
            tokio::time::timeout(timeout, query(&socket, timeout, pod))
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {} ms", timeout.as_millis())))
        });
        let resources = found.map_err(|e| unavailable(&self.socket, e))?;
        Ok(allocated_of(resources.iter()))
    }
}

async fn query(
    socket: &Path,
    timeout: Duration,
    pod: &PodRef,
) -> Result<Vec<v1::PodResources>, String> {
    let path = socket.to_path_buf();
    // The URI is required by the API but unused: every connection goes to the socket.
    let channel = Endpoint::from_static("http://kubelet.invalid")
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .map_err(|e| format!("connect: {}", error_chain(&e)))?;
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_ANSWER_BYTES);
    grpc.ready().await.map_err(|e| format!("connect: {e}"))?;
    let get = v1::GetPodResourcesRequest {
        pod_name: pod.name.clone(),
        pod_namespace: pod.namespace.clone(),
    };
    let answer: Result<tonic::Response<v1::GetPodResourcesResponse>, tonic::Status> = grpc
        .unary(
            tonic::Request::new(get),
            http::uri::PathAndQuery::from_static(v1::GET),
            ProstCodec::default(),
        )
        .await;
    match answer {
        Ok(r) => return Ok(r.into_inner().pod_resources.into_iter().collect()),
        Err(s) if s.code() == tonic::Code::Unimplemented => {}
        // Get answers NotFound for a pod kubelet has not admitted: no devices.
        Err(s) if s.code() == tonic::Code::NotFound => return Ok(Vec::new()),
        Err(s) => return Err(format!("Get: {} ({:?})", s.message(), s.code())),
    }
    grpc.ready().await.map_err(|e| format!("connect: {e}"))?;
    let list: tonic::Response<v1::ListPodResourcesResponse> = grpc
        .unary(
            tonic::Request::new(v1::ListPodResourcesRequest {}),
            http::uri::PathAndQuery::from_static(v1::LIST),
            ProstCodec::default(),
        )
        .await
        .map_err(|s| format!("List: {} ({:?})", s.message(), s.code()))?;
    Ok(list
        .into_inner()
        .pod_resources
        .into_iter()
        .filter(|p| p.name == pod.name && p.namespace == pod.namespace)
        .collect())
}

fn allocated_of<'a>(pods: impl Iterator<Item = &'a v1::PodResources>) -> Allocated {
    let mut out = Allocated::new();
    for pod in pods {
        for c in &pod.containers {
            for d in &c.devices {
                let ids = out.entry(d.resource_name.clone()).or_default();
                for id in &d.device_ids {
                    if !ids.contains(id) {
                        ids.push(id.clone());
                    }
                }
            }
        }
    }
    out
}

/// Hands out the pod's devices to its networks: each network of a resource gets the next device of that
/// resource that no earlier network got (two networks on one SR-IOV resource get two VFs).
#[derive(Debug, Default)]
pub struct DeviceAllocator {
    allocated: Allocated,
    next: BTreeMap<String, usize>,
}

impl DeviceAllocator {
    pub fn new(allocated: Allocated) -> Self {
        DeviceAllocator {
            allocated,
            next: BTreeMap::new(),
        }
    }

    /// The next device of `resource`, or why there is none.
    pub fn take(&mut self, resource: &str) -> Result<String, String> {
        let ids = self
            .allocated
            .get(resource)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let n = self.next.entry(resource.to_string()).or_default();
        match ids.get(*n) {
            Some(id) => {
                *n += 1;
                Ok(id.clone())
            }
            None if ids.is_empty() => Err(format!(
                "no device of resource {resource} is allocated to the pod (its containers must request {resource})"
            )),
            None => Err(format!(
                "the pod has {} device(s) of resource {resource}, and more of its networks need one",
                ids.len()
            )),
        }
    }
}

/// The device plugin's device-info file for one device (Device Information Specification 4.1): the resource
/// name with `/` replaced by `-`, then the device ID.
pub fn device_plugin_info_file(dir: &Path, resource: &str, device_id: &str) -> PathBuf {
    dir.join(format!(
        "{}-{device_id}-device.json",
        resource.replace('/', "-")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devices(resource: &str, ids: &[&str]) -> v1::ContainerDevices {
        v1::ContainerDevices {
            resource_name: resource.into(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn devices_of_every_container_in_order_without_repeats() {
        let pod = v1::PodResources {
            name: "p".into(),
            namespace: "ns".into(),
            containers: vec![
                v1::ContainerResources {
                    name: "a".into(),
                    devices: vec![devices(
                        "intel.com/sriov",
                        &["0000:01:00.1", "0000:01:00.2"],
                    )],
                },
                v1::ContainerResources {
                    name: "b".into(),
                    devices: vec![
                        devices("intel.com/sriov", &["0000:01:00.2", "0000:01:00.3"]),
                        devices("example.com/gpu", &["gpu0"]),
                    ],
                },
            ],
        };
        let a = allocated_of([pod].iter());
        assert_eq!(
            a["intel.com/sriov"],
            vec!["0000:01:00.1", "0000:01:00.2", "0000:01:00.3"]
        );
        let mut alloc = DeviceAllocator::new(a);
        assert_eq!(alloc.take("example.com/gpu").unwrap(), "gpu0");
        let err = alloc.take("example.com/gpu").unwrap_err();
        assert!(err.contains("has 1 device(s)"), "{err}");
        assert_eq!(alloc.take("intel.com/sriov").unwrap(), "0000:01:00.1");
        assert_eq!(alloc.take("intel.com/sriov").unwrap(), "0000:01:00.2");
        let err = alloc.take("other.com/x").unwrap_err();
        assert!(err.contains("must request other.com/x"), "{err}");
    }

    #[test]
    fn device_plugin_file_names_follow_the_spec() {
        assert_eq!(
            device_plugin_info_file(Path::new("/d"), "intel.com/sriov_netdevice", "0000:01:00.1"),
            PathBuf::from("/d/intel.com-sriov_netdevice-0000:01:00.1-device.json")
        );
    }
}
