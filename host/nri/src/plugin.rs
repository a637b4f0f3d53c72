//! One session of an external NRI plugin: connect to the runtime's socket, register, answer the runtime's calls
//! until it closes the connection or asks the plugin to shut down.
//!
//! The order is the protocol's: the plugin calls `RegisterPlugin`; the runtime calls `Configure` (the plugin answers
//! with the events it wants) and `Synchronize` (the pods it has, in one or more parts); then one call per event.
//! A call runs as a task of its own, at most [`MAX_IN_FLIGHT`] at once; the runtime waits for each answer until
//! its deadline (the request's own, else the request timeout it configured). Past that deadline the runtime
//! treats the plugin as broken, drops it and lets the pod go on without it, so a session answers an event shortly
//! before the deadline ([`answer_by`]) and leaves the handler running: a `RunPodSandbox` with an error (the
//! runtime then fails the sandbox and sends its stop and remove events, which find the handler's work done or under
//! way), a `CreateContainer` with an error too (the kubelet makes the container again later), a stop or removal
//! with success (it is not held up).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message as _;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

use crate::api::{self, Event, PodSandbox};
use crate::mux::{self, PLUGIN_SERVICE, RUNTIME_SERVICE};
use crate::ttrpc::{self, code, Assembler, Message, Request, Response};

/// How long connecting to the socket may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the runtime may take to answer the registration (NRI's own default for the other direction).
pub const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);
/// The request timeout NRI's runtimes use unless configured otherwise, for a runtime that did not say.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Calls of the runtime handled at once; one more is refused at once (the runtimes send one at a time).
pub const MAX_IN_FLIGHT: usize = 64;
/// Answers waiting for the socket: one for every call in flight, and room for refusals.
const OUTBOX: usize = MAX_IN_FLIGHT + 16;
/// How long one write to the socket may take. A runtime that reads no answer for this long is stuck: the session
/// ends (the next one registers afresh).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How the plugin names itself to the runtime.
#[derive(Debug, Clone)]
pub struct Registration {
    /// `[a-zA-Z0-9_.+-]+`.
    pub name: String,
    /// Two digits: where the plugin runs among the runtime's plugins.
    pub index: String,
    /// The events the plugin subscribes to.
    pub events: Vec<Event>,
}

/// What the runtime said of itself when it configured the plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    pub name: String,
    pub version: String,
    /// Its NRI version, when it says (runtimes before NRI 0.10 do not).
    pub nri_version: String,
    /// How long it waits for an answer to one call.
    pub request_timeout: Duration,
    /// The plugin's configuration from the runtime's own, if any.
    pub config: String,
}

/// What a plugin does with the runtime's calls.
#[async_trait::async_trait]
pub trait Plugin: Send + Sync + 'static {
    /// The runtime configured the session (before [`Plugin::synchronize`]).
    async fn configured(&self, _runtime: &Runtime) {}

    /// The pods the runtime has at registration, all of them, before any event of this session.
    async fn synchronize(&self, pods: Vec<PodSandbox>) -> Result<(), String>;

    /// An event the plugin subscribed to. An error fails a `RunPodSandbox` (the runtime removes the sandbox and
    /// reports the message); `deadline` is when the runtime stops waiting.
    async fn pod_event(
        &self,
        event: Event,
        pod: PodSandbox,
        deadline: Instant,
    ) -> Result<(), String>;

    /// A `RunPodSandbox` the session answered with an error at its deadline, whose handler then succeeded: the
    /// runtime failed the sandbox and removed it without a stop or removal event (neither containerd nor CRI-O
    /// sends one for a sandbox a plugin failed), so the plugin undoes what its handler did.
    async fn run_abandoned(&self, _pod: PodSandbox) {}
}

/// How a session ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The runtime closed the connection (it stopped or restarted).
    Closed,
    /// The runtime asked the plugin to shut down.
    Shutdown,
}

/// When a session answers a call whose deadline is `deadline`: a tenth of the time left before it, at most a
/// quarter second, so that the answer arrives while the runtime still waits.
pub fn answer_by(now: Instant, deadline: Instant) -> Instant {
    let left = deadline.saturating_duration_since(now);
    deadline - (left / 10).min(Duration::from_millis(250))
}

/// Runs one session on the runtime's NRI socket at `socket`. Returns when the runtime ends it; an error names what
/// went wrong (connecting, the registration, the protocol, the socket).
pub async fn run(
    socket: &Path,
    registration: &Registration,
    plugin: Arc<dyn Plugin>,
) -> Result<Ended, String> {
    let stream = connect(socket).await?;
    let (mut rd, mut wr) = stream.into_split();
    let (out, mut outbox) = mpsc::channel::<(u32, Vec<u8>)>(OUTBOX);
    let mut writer = tokio::spawn(async move {
        while let Some((conn, bytes)) = outbox.recv().await {
            tokio::time::timeout(WRITE_TIMEOUT, mux::write_frames(&mut wr, conn, &bytes))
                .await
                .map_err(|_| {
                    std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("the runtime read no answer for {WRITE_TIMEOUT:?}"),
                    )
                })??;
        }
        Ok::<_, std::io::Error>(())
    });
    let session = Arc::new(Session {
        plugin,
        events: api::Event::mask(&registration.events),
        out: out.clone(),
        runtime: Mutex::new(None),
        synced: Mutex::new(Vec::new()),
        slots: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
    });
    let _ = out.send((RUNTIME_SERVICE, register(registration))).await;
    let registered_by = Instant::now() + REGISTRATION_TIMEOUT;
    let mut registered = false;
    let mut calls = Assembler::default();
    let mut answers = Assembler::default();
    let ended = loop {
        let frame = tokio::select! {
            frame = mux::read_frame(&mut rd) => frame,
            _ = tokio::time::sleep_until(registered_by), if !registered => {
                break Err(format!("the runtime did not answer the plugin's registration within {REGISTRATION_TIMEOUT:?}"));
            }
            written = &mut writer => {
                break Err(match written {
                    Ok(Err(e)) => format!("writing to the NRI socket: {e}"),
                    _ => "the NRI socket's writer stopped".into(),
                });
            }
        };
        let (conn, payload) = match frame {
            Ok(Some(frame)) => frame,
            Ok(None) if registered => break Ok(Ended::Closed),
            Ok(None) => {
                break Err(
                    "the runtime closed the NRI connection before it answered the registration"
                        .into(),
                )
            }
            Err(e) => break Err(format!("reading the NRI socket: {e}")),
        };
        let step = match conn {
            PLUGIN_SERVICE => {
                calls.push(&payload);
                session.take_calls(&mut calls)
            }
            RUNTIME_SERVICE => {
                answers.push(&payload);
                take_registration(&mut answers).map(|done| {
                    registered |= done;
                    None
                })
            }
            other => Err(format!(
                "the runtime sent a frame on connection {other}, which NRI does not use"
            )),
        };
        match step {
            Ok(None) => {}
            Ok(Some(ended)) => break Ok(ended),
            Err(e) => break Err(e),
        }
    };
    // Let the last answers (a shutdown's) reach the socket, briefly.
    drop(out);
    drop(session);
    if tokio::time::timeout(Duration::from_millis(500), &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
    ended
}

/// Connects to the runtime's socket, within [`CONNECT_TIMEOUT`].
async fn connect(socket: &Path) -> Result<UnixStream, String> {
    tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(socket))
        .await
        .map_err(|_| {
            format!(
                "connecting to the NRI socket {} took over {CONNECT_TIMEOUT:?}",
                socket.display()
            )
        })?
        .map_err(|e| format!("cannot connect to the NRI socket {}: {e}", socket.display()))
}

/// The plugin's `RegisterPlugin` call, on stream 1 of the runtime's service, encoded.
fn register(registration: &Registration) -> Vec<u8> {
    let register = api::RegisterPluginRequest {
        plugin_name: registration.name.clone(),
        plugin_idx: registration.index.clone(),
        nri_version: api::NRI_VERSION.into(),
    };
    let request = Request {
        service: api::RUNTIME.into(),
        method: "RegisterPlugin".into(),
        payload: register.encode_to_vec(),
        timeout_nano: REGISTRATION_TIMEOUT.as_nanos() as i64,
        metadata: Vec::new(),
    };
    Message::request(1, &request).encode()
}

/// The registration's answer, once it has come: `Ok(true)` when the runtime accepted it.
fn take_registration(answers: &mut Assembler) -> Result<bool, String> {
    let mut accepted = false;
    while let Some(m) = answers.next_message()? {
        if m.kind != ttrpc::RESPONSE || m.stream != 1 {
            return Err(format!(
                "the runtime sent message type {} on stream {} of its service's connection, where only the \
                 registration's answer (stream 1) is expected",
                m.kind, m.stream
            ));
        }
        let response = Response::decode(m.data.as_slice())
            .map_err(|e| format!("the registration's answer: {e}"))?;
        response.into_result().map_err(|(code, msg)| {
            format!("the runtime refused the plugin's registration (code {code}): {msg}")
        })?;
        accepted = true;
    }
    Ok(accepted)
}

struct Session {
    plugin: Arc<dyn Plugin>,
    events: i32,
    out: mpsc::Sender<(u32, Vec<u8>)>,
    runtime: Mutex<Option<Runtime>>,
    /// The parts of a synchronization received so far.
    synced: Mutex<Vec<PodSandbox>>,
    slots: Arc<Semaphore>,
}

impl Session {
    /// Starts a task for each whole call received; `Some` when the runtime asked the plugin to shut down.
    fn take_calls(self: &Arc<Self>, calls: &mut Assembler) -> Result<Option<Ended>, String> {
        while let Some(m) = calls.next_message()? {
            if m.kind != ttrpc::REQUEST {
                return Err(format!(
                    "the runtime sent message type {} on stream {}: NRI's calls are unary requests",
                    m.kind, m.stream
                ));
            }
            let request = Request::decode(m.data.as_slice())
                .map_err(|e| format!("a call of the runtime: {e}"))?;
            if request.service == api::PLUGIN && request.method == "Shutdown" {
                self.answer_now(m.stream, Response::ok(api::Empty {}.encode_to_vec()))?;
                return Ok(Some(Ended::Shutdown));
            }
            let Ok(slot) = self.slots.clone().try_acquire_owned() else {
                self.answer_now(
                    m.stream,
                    Response::error(
                        code::RESOURCE_EXHAUSTED,
                        format!("plexus: over {MAX_IN_FLIGHT} calls at once"),
                    ),
                )?;
                continue;
            };
            let session = self.clone();
            tokio::spawn(async move {
                let response = session.call(request).await;
                session.answer(m.stream, response).await;
                drop(slot);
            });
        }
        Ok(None)
    }

    /// A call's answer, queued for the socket once there is room. The outbox has room for an answer of every call
    /// in flight, and a stuck socket ends the session ([`WRITE_TIMEOUT`]), which closes it: the wait is bounded.
    async fn answer(&self, stream: u32, response: Response) {
        let bytes = Message::response(stream, &response).encode();
        // Closed: the session ended, and the runtime's connection with it.
        let _ = self.out.send((PLUGIN_SERVICE, bytes)).await;
    }

    /// An answer given by the reader itself (a refusal, a shutdown's), which must not wait: the outbox full means
    /// the runtime sends calls and reads no answers, and the session ends with an error.
    fn answer_now(&self, stream: u32, response: Response) -> Result<(), String> {
        let bytes = Message::response(stream, &response).encode();
        match self.out.try_send((PLUGIN_SERVICE, bytes)) {
            Err(mpsc::error::TrySendError::Full(_)) => Err(format!(
                "the runtime sends calls and reads no answers ({OUTBOX} wait for the socket)"
            )),
            _ => Ok(()),
        }
    }

    async fn call(&self, request: Request) -> Response {
        let now = Instant::now();
        let deadline = match request.timeout_nano {
            n if n > 0 => now + Duration::from_nanos(n as u64),
            _ => now + self.request_timeout(),
        };
        if request.service != api::PLUGIN {
            return unimplemented(&request);
        }
        let payload = request.payload.as_slice();
        let result = match request.method.as_str() {
            "Configure" => return self.configure(payload).await,
            "Synchronize" => return self.synchronize(payload).await,
            "RunPodSandbox" => {
                self.event(Event::RunPodSandbox, decode_pod(payload), deadline)
                    .await
            }
            "StopPodSandbox" => {
                self.event(Event::StopPodSandbox, decode_pod(payload), deadline)
                    .await
            }
            "RemovePodSandbox" => {
                self.event(Event::RemovePodSandbox, decode_pod(payload), deadline)
                    .await
            }
            // Its answer is a `CreateContainerResponse` with no adjustment: empty, as an `Empty` is.
            "CreateContainer" => {
                self.event(Event::CreateContainer, decode_pod(payload), deadline)
                    .await
            }
            "StateChange" => match api::StateChangeEvent::decode(payload) {
                Ok(change) => match Event::from_number(change.event) {
                    Some(event) => {
                        self.event(event, change.pod.ok_or_else(no_pod), deadline)
                            .await
                    }
                    // An event this plugin did not subscribe to (a container's): nothing to do.
                    None => Ok(()),
                },
                Err(e) => Err(format!("plexus: cannot decode the StateChange call: {e}")),
            },
            _ => return unimplemented(&request),
        };
        match result {
            Ok(()) => Response::ok(Vec::new()),
            Err(e) => Response::error(code::UNKNOWN, e),
        }
    }

    fn request_timeout(&self) -> Duration {
        self.runtime
            .lock()
            .unwrap()
            .as_ref()
            .map_or(DEFAULT_REQUEST_TIMEOUT, |r| r.request_timeout)
    }

    async fn configure(&self, payload: &[u8]) -> Response {
        let req = match api::ConfigureRequest::decode(payload) {
            Ok(req) => req,
            Err(e) => {
                return Response::error(
                    code::INVALID_ARGUMENT,
                    format!("plexus: the Configure call: {e}"),
                )
            }
        };
        let runtime = Runtime {
            name: req.runtime_name,
            version: req.runtime_version,
            nri_version: req.nri_version,
            request_timeout: match req.request_timeout {
                ms if ms > 0 => Duration::from_millis(ms as u64),
                _ => DEFAULT_REQUEST_TIMEOUT,
            },
            config: req.config,
        };
        self.plugin.configured(&runtime).await;
        *self.runtime.lock().unwrap() = Some(runtime);
        Response::ok(
            api::ConfigureResponse {
                events: self.events,
            }
            .encode_to_vec(),
        )
    }

    async fn synchronize(&self, payload: &[u8]) -> Response {
        let req = match api::SynchronizeRequest::decode(payload) {
            Ok(req) => req,
            Err(e) => {
                return Response::error(
                    code::INVALID_ARGUMENT,
                    format!("plexus: the Synchronize call: {e}"),
                )
            }
        };
        let pods = {
            let mut synced = self.synced.lock().unwrap();
            synced.extend(req.pods);
            if req.more {
                return Response::ok(api::SynchronizeResponse { more: true }.encode_to_vec());
            }
            std::mem::take(&mut *synced)
        };
        match self.plugin.synchronize(pods).await {
            Ok(()) => Response::ok(api::SynchronizeResponse { more: false }.encode_to_vec()),
            Err(e) => Response::error(code::UNKNOWN, e),
        }
    }

    /// Runs the plugin's handler of one event, answering by [`answer_by`] of its deadline whether or not the
    /// handler is done (it goes on).
    async fn event(
        &self,
        event: Event,
        pod: Result<PodSandbox, String>,
        deadline: Instant,
    ) -> Result<(), String> {
        let pod = pod?;
        let name = pod.label();
        let plugin = self.plugin.clone();
        let kept = pod.clone();
        let mut handler = tokio::spawn(async move { plugin.pod_event(event, pod, deadline).await });
        match tokio::time::timeout_at(answer_by(Instant::now(), deadline), &mut handler).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => Err(format!(
                "plexus: the {event:?} handler of {name} failed: {e}"
            )),
            // A sandbox that is not set up in time fails; so does a container (the kubelet makes it again, and
            // the handler's work, done by then, stays); its stop and removal are not held up.
            Err(_) if event == Event::CreateContainer => Err(format!(
                "plexus: {event:?} in {name} was not done before the runtime's deadline (its NRI request \
                 timeout); it goes on, and the container's next creation finds it done"
            )),
            Err(_) if event == Event::RunPodSandbox => {
                let plugin = self.plugin.clone();
                tokio::spawn(async move {
                    if let Ok(Ok(())) = handler.await {
                        plugin.run_abandoned(kept).await;
                    }
                });
                Err(format!(
                    "plexus: {event:?} of {name} was not done before the runtime's deadline (its NRI request \
                     timeout); it goes on and is then undone"
                ))
            }
            Err(_) => {
                tracing::info!(pod = %name, "{event:?} goes on past the runtime's deadline");
                Ok(())
            }
        }
    }
}

fn decode_pod(payload: &[u8]) -> Result<PodSandbox, String> {
    api::PodSandboxRequest::decode(payload)
        .map_err(|e| format!("plexus: cannot decode the pod of the call: {e}"))?
        .pod
        .ok_or_else(no_pod)
}

fn no_pod() -> String {
    "plexus: the call names no pod".into()
}

fn unimplemented(request: &Request) -> Response {
    Response::error(
        code::UNIMPLEMENTED,
        format!(
            "plexus does not implement the NRI call {}.{}",
            request.service, request.method
        ),
    )
}

#[cfg(test)]
#[path = "plugin_tests.rs"]
mod tests;
