//! A stand-in for kubelet's PodResources API (v1, gRPC over a unix socket): there is no kubelet in these tests.
//! It serves the real protocol (`/v1.PodResourcesLister/List` and, unless told otherwise, `Get`, with the
//! messages of kubelet's `api.proto` as plexus declares them) from an allocation the test gives, and records
//! which methods were called. A server without `Get` behaves as kubelet before 1.27 does: `Unimplemented`.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hyper_util::rt::{TokioExecutor, TokioIo};
use plexus_cni::podresources::v1;
use tonic::codec::ProstCodec;

/// One pod's devices: `(namespace, name, [(container, resource, [device IDs])])`.
pub type PodDevices = (String, String, Vec<(String, String, Vec<String>)>);

pub struct PodResourcesServer {
    pub socket: PathBuf,
    calls: Arc<Mutex<Vec<String>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn pod_resources(pods: &[PodDevices]) -> Vec<v1::PodResources> {
    pods.iter()
        .map(|(ns, name, containers)| v1::PodResources {
            name: name.clone(),
            namespace: ns.clone(),
            containers: containers
                .iter()
                .map(|(c, resource, ids)| v1::ContainerResources {
                    name: c.clone(),
                    devices: vec![v1::ContainerDevices {
                        resource_name: resource.clone(),
                        device_ids: ids.clone(),
                    }],
                })
                .collect(),
        })
        .collect()
}

impl PodResourcesServer {
    /// Serves `pods` on `socket` (created; removed on drop). `get`: whether `Get` is implemented.
    pub fn start(socket: &Path, pods: Vec<PodDevices>, get: bool) -> PodResourcesServer {
        let _ = std::fs::remove_file(socket);
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        let std_listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let state = Arc::new((pod_resources(&pods), get, calls.clone()));
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::UnixListener::from_std(std_listener).unwrap();
                loop {
                    tokio::select! {
                        accepted = listener.accept() => {
                            let Ok((stream, _)) = accepted else { continue };
                            let state = state.clone();
                            tokio::spawn(async move {
                                let service = hyper::service::service_fn(move |req| serve(req, state.clone()));
                                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                                    .serve_connection(TokioIo::new(stream), service)
                                    .await;
                            });
                        }
                        _ = &mut stopped => break,
                    }
                }
            });
        });
        PodResourcesServer {
            socket: socket.to_path_buf(),
            calls,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The gRPC methods called so far, in order (`List`, `Get`).
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

type State = Arc<(Vec<v1::PodResources>, bool, Arc<Mutex<Vec<String>>>)>;

async fn serve(
    req: http::Request<hyper::body::Incoming>,
    state: State,
) -> Result<http::Response<tonic::body::Body>, Infallible> {
    let (pods, get, calls) = (&state.0, state.1, &state.2);
    let path = req.uri().path().to_string();
    calls
        .lock()
        .unwrap()
        .push(path.rsplit('/').next().unwrap_or_default().to_string());
    Ok(match path.as_str() {
        v1::LIST => {
            let answer = v1::ListPodResourcesResponse {
                pod_resources: pods.clone(),
            };
            let svc = tower::service_fn(move |_: tonic::Request<v1::ListPodResourcesRequest>| {
                let answer = answer.clone();
                async move { Ok::<_, tonic::Status>(tonic::Response::new(answer)) }
            });
            tonic::server::Grpc::new(ProstCodec::default())
                .unary(svc, req)
                .await
        }
        v1::GET if get => {
            let pods = pods.clone();
            let svc = tower::service_fn(move |r: tonic::Request<v1::GetPodResourcesRequest>| {
                let r = r.into_inner();
                let found = pods
                    .iter()
                    .find(|p| p.name == r.pod_name && p.namespace == r.pod_namespace)
                    .cloned();
                async move {
                    match found {
                        Some(p) => Ok(tonic::Response::new(v1::GetPodResourcesResponse {
                            pod_resources: Some(p),
                        })),
                        None => Err(tonic::Status::not_found("pod not found")),
                    }
                }
            });
            tonic::server::Grpc::new(ProstCodec::default())
                .unary(svc, req)
                .await
        }
        _ => tonic::Status::unimplemented(format!("unknown method {path}")).into_http(),
    })
}

impl Drop for PodResourcesServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}
