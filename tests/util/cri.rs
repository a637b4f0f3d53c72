//! A minimal CRI client (`runtime.v1.RuntimeService`), to drive a real containerd the way kubelet does:
//! RunPodSandbox, StopPodSandbox, RemovePodSandbox, PodSandboxStatus, ListPodSandbox, and CreateContainer (which the
//! runtime's NRI plugins hear of). gRPC over the runtime's unix socket.
//!
//! Only the messages and fields these calls need are declared (with prost's derive); unknown fields in answers
//! are skipped by protobuf's rules. Field numbers are those of the CRI API (`k8s.io/cri-api`,
//! `pkg/apis/runtime/v1/api.proto`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::codec::ProstCodec;
use tonic::transport::{Channel, Endpoint, Uri};

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub namespace: String,
    #[prost(uint32, tag = "4")]
    pub attempt: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(string, tag = "2")]
    pub hostname: String,
    #[prost(string, tag = "3")]
    pub log_directory: String,
    #[prost(map = "string, string", tag = "6")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "7")]
    pub annotations: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    pub config: Option<PodSandboxConfig>,
    #[prost(string, tag = "2")]
    pub runtime_handler: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxResponse {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(uint32, tag = "2")]
    pub attempt: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageSpec {
    #[prost(string, tag = "1")]
    pub image: String,
    /// The image as the pod spec names it (CRI-O checks the image's signature policy by it).
    #[prost(string, tag = "18")]
    pub user_specified_image: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(message, optional, tag = "2")]
    pub image: Option<ImageSpec>,
    #[prost(string, repeated, tag = "3")]
    pub command: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(message, optional, tag = "2")]
    pub config: Option<ContainerConfig>,
    #[prost(message, optional, tag = "3")]
    pub sandbox_config: Option<PodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerResponse {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

/// The request of StopPodSandbox and of RemovePodSandbox (both carry only the id).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxIdRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatusRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxNetworkStatus {
    #[prost(string, tag = "1")]
    pub ip: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatus {
    #[prost(string, tag = "1")]
    pub id: String,
    /// 0 ready, 1 not ready.
    #[prost(int32, tag = "3")]
    pub state: i32,
    #[prost(message, optional, tag = "5")]
    pub network: Option<PodSandboxNetworkStatus>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatusResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<PodSandboxStatus>,
    /// With `verbose`: JSON documents, among them the sandbox's network namespace path.
    #[prost(map = "string, string", tag = "2")]
    pub info: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandbox {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxResponse {
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<PodSandbox>,
}

/// A connection to one runtime's CRI socket. Every call is bounded by `timeout`.
pub struct Cri {
    runtime: tokio::runtime::Runtime,
    channel: Channel,
    timeout: Duration,
}

/// A failed CRI call: the gRPC status (code and message), or the transport's error.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CriError(pub String);

impl Cri {
    /// Connects to `socket` (the runtime's `grpc.address`).
    pub fn connect(socket: &Path, timeout: Duration) -> Result<Cri, CriError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| CriError(format!("tokio runtime: {e}")))?;
        let path: PathBuf = socket.to_path_buf();
        let channel = runtime
            .block_on(async move {
                // The URI is required by the API but unused: every connection goes to the socket.
                Endpoint::try_from("http://cri.invalid")
                    .expect("static URI")
                    .connect_timeout(timeout)
                    .timeout(timeout)
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let path = path.clone();
                        async move {
                            Ok::<_, std::io::Error>(TokioIo::new(
                                tokio::net::UnixStream::connect(path).await?,
                            ))
                        }
                    }))
                    .await
            })
            .map_err(|e| CriError(format!("connect {}: {e}", socket.display())))?;
        Ok(Cri {
            runtime,
            channel,
            timeout,
        })
    }

    fn call<Req, Resp>(&self, method: &'static str, req: Req) -> Result<Resp, CriError>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(method);
        let timeout = self.timeout;
        self.runtime.block_on(async move {
            let call = async {
                grpc.ready()
                    .await
                    .map_err(|e| CriError(format!("{method}: not ready: {e}")))?;
                grpc.unary(
                    tonic::Request::new(req),
                    path,
                    ProstCodec::<Req, Resp>::default(),
                )
                .await
                .map(tonic::Response::into_inner)
                .map_err(|s| CriError(format!("{method}: {:?}: {}", s.code(), s.message())))
            };
            tokio::time::timeout(timeout, call)
                .await
                .map_err(|_| CriError(format!("{method}: no answer within {timeout:?}")))?
        })
    }

    /// RunPodSandbox for pod `namespace/name` (uid `uid`), as kubelet sends it; returns the sandbox id.
    pub fn run_pod_sandbox(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<String, CriError> {
        let req = RunPodSandboxRequest {
            config: Some(sandbox_config(namespace, name, uid)),
            runtime_handler: String::new(),
        };
        let resp: RunPodSandboxResponse =
            self.call("/runtime.v1.RuntimeService/RunPodSandbox", req)?;
        Ok(resp.pod_sandbox_id)
    }

    /// CreateContainer of a container `container` (image `image`, which the runtime has: Plexus's, whose binary it
    /// would run) in the sandbox `sandbox` that [`Cri::run_pod_sandbox`] made for `namespace/name` (uid `uid`);
    /// returns the container's id. The container is not started; removing the sandbox removes it.
    pub fn create_container(
        &self,
        sandbox: &str,
        namespace: &str,
        name: &str,
        uid: &str,
        container: &str,
        image: &str,
    ) -> Result<String, CriError> {
        let req = CreateContainerRequest {
            pod_sandbox_id: sandbox.into(),
            config: Some(ContainerConfig {
                metadata: Some(ContainerMetadata {
                    name: container.into(),
                    attempt: 0,
                }),
                image: Some(ImageSpec {
                    image: image.into(),
                    user_specified_image: image.into(),
                }),
                command: vec!["/usr/local/bin/plexus".into(), "--version".into()],
            }),
            sandbox_config: Some(sandbox_config(namespace, name, uid)),
        };
        let resp: CreateContainerResponse =
            self.call("/runtime.v1.RuntimeService/CreateContainer", req)?;
        Ok(resp.container_id)
    }

    pub fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let req = PodSandboxIdRequest {
            pod_sandbox_id: id.into(),
        };
        self.call::<_, Empty>("/runtime.v1.RuntimeService/StopPodSandbox", req)
            .map(drop)
    }

    pub fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let req = PodSandboxIdRequest {
            pod_sandbox_id: id.into(),
        };
        self.call::<_, Empty>("/runtime.v1.RuntimeService/RemovePodSandbox", req)
            .map(drop)
    }

    /// Every sandbox the runtime knows, whoever ran it (the test or a kubelet).
    pub fn list_pod_sandboxes(&self) -> Result<Vec<PodSandbox>, CriError> {
        let resp: ListPodSandboxResponse = self.call(
            "/runtime.v1.RuntimeService/ListPodSandbox",
            ListPodSandboxRequest {},
        )?;
        Ok(resp.items)
    }

    pub fn pod_sandbox_status(&self, id: &str) -> Result<PodSandboxStatusResponse, CriError> {
        let req = PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: true,
        };
        self.call("/runtime.v1.RuntimeService/PodSandboxStatus", req)
    }
}

/// The sandbox configuration of pod `namespace/name` (uid `uid`), as the tests' RunPodSandbox sends it.
fn sandbox_config(namespace: &str, name: &str, uid: &str) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: uid.into(),
            namespace: namespace.into(),
            attempt: 0,
        }),
        hostname: name.into(),
        ..PodSandboxConfig::default()
    }
}

/// Waits, at most 30 s, until the runtime `what` serves its CRI on `socket`: it answers a status query for a sandbox
/// that does not exist. Fails the test with `log()` otherwise.
pub fn wait_until_serving(socket: &Path, what: &str, log: impl Fn() -> String) {
    let end = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(cri) = Cri::connect(socket, Duration::from_secs(2)) {
            if let Err(CriError(msg)) = cri.pod_sandbox_status("probe") {
                if msg.contains("NotFound") || msg.contains("not found") {
                    return;
                }
            }
        }
        assert!(
            std::time::Instant::now() < end,
            "{what} did not come up within 30 s:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Stops and removes the sandboxes `known` and every other one the runtime on `socket` lists (a kubelet's), so
/// that their DEL releases what the CNI plugin attached. Best effort: a runtime that does not answer is left.
pub fn remove_every_sandbox(socket: &Path, known: &[String]) {
    let Ok(cri) = Cri::connect(socket, Duration::from_secs(10)) else {
        return;
    };
    let mut ids = known.to_vec();
    for sandbox in cri.list_pod_sandboxes().unwrap_or_default() {
        if !ids.contains(&sandbox.id) {
            ids.push(sandbox.id);
        }
    }
    for id in &ids {
        let _ = cri.stop_pod_sandbox(id);
        let _ = cri.remove_pod_sandbox(id);
    }
}
