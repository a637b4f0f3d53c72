//! The session against a runtime written here (the runtime's side of the same protocol, in process); the suite's
//! node tests run it against containerd.

use super::*;
use tokio::net::UnixListener;

#[test]
fn an_answer_comes_a_tenth_of_the_time_left_before_the_deadline_and_at_most_a_quarter_second() {
    let now = Instant::now();
    assert_eq!(
        answer_by(now, now + Duration::from_secs(1)),
        now + Duration::from_millis(900)
    );
    assert_eq!(
        answer_by(now, now + Duration::from_secs(30)),
        now + Duration::from_millis(29_750)
    );
    assert_eq!(answer_by(now, now), now);
}

/// What the plugin was told, in order.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<String>>,
    /// How long a `RunPodSandbox` takes.
    run_takes: Duration,
    /// How long a `StopPodSandbox` takes.
    stop_takes: Duration,
    /// How long a `CreateContainer` takes.
    create_takes: Duration,
}

#[async_trait::async_trait]
impl Plugin for Recorder {
    async fn configured(&self, runtime: &Runtime) {
        self.seen.lock().unwrap().push(format!(
            "configured {} {} {:?}",
            runtime.name, runtime.nri_version, runtime.request_timeout
        ));
    }

    async fn synchronize(&self, pods: Vec<PodSandbox>) -> Result<(), String> {
        let names: Vec<_> = pods.iter().map(|p| p.name.as_str()).collect();
        self.seen
            .lock()
            .unwrap()
            .push(format!("synchronize {names:?}"));
        Ok(())
    }

    async fn run_abandoned(&self, pod: PodSandbox) {
        self.seen
            .lock()
            .unwrap()
            .push(format!("abandoned {}", pod.name));
    }

    async fn pod_event(
        &self,
        event: Event,
        pod: PodSandbox,
        _deadline: Instant,
    ) -> Result<(), String> {
        match event {
            Event::RunPodSandbox => tokio::time::sleep(self.run_takes).await,
            Event::StopPodSandbox => tokio::time::sleep(self.stop_takes).await,
            Event::CreateContainer => tokio::time::sleep(self.create_takes).await,
            Event::RemovePodSandbox => {}
        }
        self.seen.lock().unwrap().push(format!(
            "{event:?} {} {:?}",
            pod.name,
            pod.network_namespace()
        ));
        match pod.name.as_str() {
            "refused" => Err("no network for you".into()),
            _ => Ok(()),
        }
    }
}

/// The runtime's end of one connection.
struct FakeRuntime {
    stream: UnixStream,
    calls: Assembler,
    answers: Assembler,
    next_stream: u32,
}

impl FakeRuntime {
    /// The next whole message on `conn`.
    async fn read(&mut self, conn: u32) -> Message {
        loop {
            let asm = if conn == PLUGIN_SERVICE {
                &mut self.calls
            } else {
                &mut self.answers
            };
            if let Some(m) = asm.next_message().unwrap() {
                return m;
            }
            let (c, payload) = mux::read_frame(&mut self.stream)
                .await
                .unwrap()
                .expect("the plugin closed");
            match c {
                PLUGIN_SERVICE => self.calls.push(&payload),
                RUNTIME_SERVICE => self.answers.push(&payload),
                other => panic!("a frame on connection {other}"),
            }
        }
    }

    async fn registration(&mut self) -> (u32, api::RegisterPluginRequest) {
        let m = self.read(RUNTIME_SERVICE).await;
        let req = Request::decode(m.data.as_slice()).unwrap();
        assert_eq!(
            (req.service.as_str(), req.method.as_str()),
            (api::RUNTIME, "RegisterPlugin")
        );
        (
            m.stream,
            api::RegisterPluginRequest::decode(req.payload.as_slice()).unwrap(),
        )
    }

    async fn answer_registration(&mut self, stream: u32, response: Response) {
        let bytes = Message::response(stream, &response).encode();
        mux::write_frames(&mut self.stream, RUNTIME_SERVICE, &bytes)
            .await
            .unwrap();
    }

    /// Calls the plugin's `method`, the request's bytes split over two frames, and waits for the answer.
    async fn call(&mut self, method: &str, payload: Vec<u8>, timeout: Duration) -> Response {
        let stream = self.next_stream;
        self.next_stream += 2;
        let req = Request {
            service: api::PLUGIN.into(),
            method: method.into(),
            payload,
            timeout_nano: timeout.as_nanos() as i64,
            metadata: Vec::new(),
        };
        let bytes = Message::request(stream, &req).encode();
        let (a, b) = bytes.split_at(bytes.len() / 2);
        mux::write_frames(&mut self.stream, PLUGIN_SERVICE, a)
            .await
            .unwrap();
        mux::write_frames(&mut self.stream, PLUGIN_SERVICE, b)
            .await
            .unwrap();
        let m = self.read(PLUGIN_SERVICE).await;
        assert_eq!((m.kind, m.stream), (ttrpc::RESPONSE, stream));
        Response::decode(m.data.as_slice()).unwrap()
    }
}

fn pod(name: &str, netns: &str) -> PodSandbox {
    PodSandbox {
        id: format!("{name}-id"),
        name: name.into(),
        namespace: "team-a".into(),
        linux: Some(api::LinuxPodSandbox {
            cgroup_parent: String::new(),
            namespaces: vec![api::LinuxNamespace {
                r#type: "network".into(),
                path: netns.into(),
            }],
        }),
        ..Default::default()
    }
}

fn pod_call(name: &str) -> Vec<u8> {
    api::PodSandboxRequest {
        pod: Some(pod(name, &format!("/run/netns/{name}"))),
    }
    .encode_to_vec()
}

/// A `CreateContainerRequest` of a container in `name`'s sandbox.
fn container_call(name: &str) -> Vec<u8> {
    let mut wire = pod_call(name);
    // container { id: "c1" }, which the plugin does not read
    wire.extend([0x12, 4, 0x0a, 2, b'c', b'1']);
    wire
}

fn registration() -> Registration {
    Registration {
        name: "plexus".into(),
        index: "10".into(),
        events: vec![
            Event::RunPodSandbox,
            Event::StopPodSandbox,
            Event::RemovePodSandbox,
            Event::CreateContainer,
        ],
    }
}

/// A session of `plugin` against a runtime at a fresh socket: the session's task and the runtime's end.
async fn start(
    plugin: Arc<Recorder>,
) -> (
    tokio::task::JoinHandle<Result<Ended, String>>,
    FakeRuntime,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let session = tokio::spawn(async move { run(&socket, &registration(), plugin).await });
    let (stream, _) = listener.accept().await.unwrap();
    let runtime = FakeRuntime {
        stream,
        calls: Assembler::default(),
        answers: Assembler::default(),
        next_stream: 1,
    };
    (session, runtime, dir)
}

/// [`start`], the registration answered.
async fn registered(
    plugin: Arc<Recorder>,
) -> (
    tokio::task::JoinHandle<Result<Ended, String>>,
    FakeRuntime,
    tempfile::TempDir,
) {
    let (session, mut rt, dir) = start(plugin).await;
    let (stream, _) = rt.registration().await;
    rt.answer_registration(stream, Response::ok(Vec::new()))
        .await;
    (session, rt, dir)
}

#[tokio::test]
async fn a_session_registers_then_is_configured_synchronized_and_called_at_each_event() {
    let plugin = Arc::new(Recorder::default());
    let (session, mut rt, _dir) = start(plugin.clone()).await;
    let (stream, reg) = rt.registration().await;
    assert_eq!(
        (reg.plugin_name.as_str(), reg.plugin_idx.as_str()),
        ("plexus", "10")
    );
    assert_eq!(reg.nri_version, api::NRI_VERSION);
    rt.answer_registration(stream, Response::ok(Vec::new()))
        .await;

    let configure = api::ConfigureRequest {
        runtime_name: "containerd".into(),
        runtime_version: "v2.4.2".into(),
        request_timeout: 3000,
        nri_version: "v0.12.3".into(),
        ..Default::default()
    };
    let answer = rt
        .call(
            "Configure",
            configure.encode_to_vec(),
            Duration::from_secs(2),
        )
        .await;
    let events = api::ConfigureResponse::decode(answer.into_result().unwrap().as_slice())
        .unwrap()
        .events;
    assert_eq!(events, 0b1111);

    // The pods in two parts: the plugin hears of them once, all together.
    let part = |names: &[&str], more| {
        api::SynchronizeRequest {
            pods: names.iter().map(|n| pod(n, "")).collect(),
            more,
        }
        .encode_to_vec()
    };
    let first = rt
        .call(
            "Synchronize",
            part(&["a", "b"], true),
            Duration::from_secs(2),
        )
        .await;
    assert!(
        api::SynchronizeResponse::decode(first.into_result().unwrap().as_slice())
            .unwrap()
            .more
    );
    let last = rt
        .call("Synchronize", part(&["c"], false), Duration::from_secs(2))
        .await;
    assert!(
        !api::SynchronizeResponse::decode(last.into_result().unwrap().as_slice())
            .unwrap()
            .more
    );

    assert!(rt
        .call("RunPodSandbox", pod_call("web"), Duration::from_secs(2))
        .await
        .into_result()
        .is_ok());
    let refused = rt
        .call("RunPodSandbox", pod_call("refused"), Duration::from_secs(2))
        .await;
    assert_eq!(
        refused.into_result(),
        Err((code::UNKNOWN, "no network for you".into()))
    );
    let change = api::StateChangeEvent {
        event: Event::StopPodSandbox as i32,
        pod: Some(pod("old", "")),
    };
    assert!(rt
        .call(
            "StateChange",
            change.encode_to_vec(),
            Duration::from_secs(2)
        )
        .await
        .into_result()
        .is_ok());
    let container = api::StateChangeEvent {
        event: 6,
        pod: Some(pod("old", "")),
    };
    assert!(rt
        .call(
            "StateChange",
            container.encode_to_vec(),
            Duration::from_secs(2)
        )
        .await
        .into_result()
        .is_ok());
    assert!(rt
        .call(
            "CreateContainer",
            container_call("web"),
            Duration::from_secs(2)
        )
        .await
        .into_result()
        .is_ok());
    let refused = rt
        .call(
            "CreateContainer",
            container_call("refused"),
            Duration::from_secs(2),
        )
        .await;
    assert_eq!(
        refused.into_result(),
        Err((code::UNKNOWN, "no network for you".into()))
    );
    let other = rt
        .call("UpdateContainer", Vec::new(), Duration::from_secs(2))
        .await
        .into_result()
        .unwrap_err();
    assert_eq!(other.0, code::UNIMPLEMENTED);
    assert!(
        other
            .1
            .contains("nri.pkg.api.v1alpha1.Plugin.UpdateContainer"),
        "{}",
        other.1
    );
    let no_pod = rt
        .call("StopPodSandbox", Vec::new(), Duration::from_secs(2))
        .await
        .into_result()
        .unwrap_err();
    assert!(no_pod.1.contains("names no pod"), "{}", no_pod.1);

    assert!(rt
        .call("Shutdown", Vec::new(), Duration::from_secs(2))
        .await
        .into_result()
        .is_ok());
    assert_eq!(session.await.unwrap(), Ok(Ended::Shutdown));
    assert_eq!(
        *plugin.seen.lock().unwrap(),
        [
            "configured containerd v0.12.3 3s",
            r#"synchronize ["a", "b", "c"]"#,
            r#"RunPodSandbox web Some("/run/netns/web")"#,
            r#"RunPodSandbox refused Some("/run/netns/refused")"#,
            "StopPodSandbox old None",
            r#"CreateContainer web Some("/run/netns/web")"#,
            r#"CreateContainer refused Some("/run/netns/refused")"#,
        ]
    );
}

#[tokio::test]
async fn a_refused_registration_ends_the_session_with_the_runtimes_reason() {
    let (session, mut rt, _dir) = start(Arc::new(Recorder::default())).await;
    let (stream, _) = rt.registration().await;
    rt.answer_registration(
        stream,
        Response::error(code::UNKNOWN, "invalid plugin index"),
    )
    .await;
    let err = session.await.unwrap().unwrap_err();
    assert!(
        err.contains("refused the plugin's registration") && err.contains("invalid plugin index"),
        "{err}"
    );
}

#[tokio::test]
async fn a_runtime_that_closes_before_answering_the_registration_is_an_error_and_after_it_an_end() {
    let (session, mut rt, _dir) = start(Arc::new(Recorder::default())).await;
    rt.registration().await;
    drop(rt);
    let err = session.await.unwrap().unwrap_err();
    assert!(err.contains("before it answered the registration"), "{err}");

    let (session, mut rt, _dir) = start(Arc::new(Recorder::default())).await;
    let (stream, _) = rt.registration().await;
    rt.answer_registration(stream, Response::ok(Vec::new()))
        .await;
    drop(rt);
    assert_eq!(session.await.unwrap(), Ok(Ended::Closed));
}

/// Calls `method` with `payload` and a deadline of 400 ms on a session of `plugin` (whose handler takes 700 ms):
/// checks that the answer came before the deadline, waits until the handler has ended, and ends the session. The
/// answer, and what the plugin was told.
async fn late_call(
    plugin: Recorder,
    method: &str,
    payload: Vec<u8>,
) -> (Result<Vec<u8>, (i32, String)>, Vec<String>) {
    let plugin = Arc::new(plugin);
    let (session, mut rt, _dir) = registered(plugin.clone()).await;
    let started = std::time::Instant::now();
    let answer = rt.call(method, payload, Duration::from_millis(400)).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(400),
        "answered after {took:?}, past the deadline"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(rt);
    assert_eq!(session.await.unwrap(), Ok(Ended::Closed));
    let seen = plugin.seen.lock().unwrap().clone();
    (answer.into_result(), seen)
}

#[tokio::test]
async fn an_event_not_done_by_its_deadline_is_answered_with_an_error_in_time_and_its_handler_goes_on(
) {
    let slow = Recorder {
        run_takes: Duration::from_millis(700),
        ..Default::default()
    };
    let (answer, seen) = late_call(slow, "RunPodSandbox", pod_call("slow")).await;
    let (code, msg) = answer.unwrap_err();
    assert_eq!(code, code::UNKNOWN);
    assert!(
        msg.contains("not done before the runtime's deadline"),
        "{msg}"
    );
    // The handler was not cancelled: it finishes on its own, and the plugin is told to undo it (the runtime
    // failed the sandbox and sends no stop for it).
    assert_eq!(
        seen,
        [
            r#"RunPodSandbox slow Some("/run/netns/slow")"#,
            "abandoned slow"
        ]
    );
}

#[tokio::test]
async fn a_late_sandbox_whose_handler_then_fails_has_nothing_to_undo() {
    let slow = Recorder {
        run_takes: Duration::from_millis(700),
        ..Default::default()
    };
    let (answer, seen) = late_call(slow, "RunPodSandbox", pod_call("refused")).await;
    assert!(answer.is_err());
    assert_eq!(
        seen,
        [r#"RunPodSandbox refused Some("/run/netns/refused")"#],
        "a handler that failed undid itself"
    );
}

/// A container whose `CreateContainer` is not done in time fails (the kubelet makes it again); the handler goes on
/// and nothing is undone: the sandbox lives, and the container's next creation finds the work done.
#[tokio::test]
async fn a_container_not_done_by_its_deadline_fails_in_time_and_its_handler_goes_on_undone() {
    let slow = Recorder {
        create_takes: Duration::from_millis(700),
        ..Default::default()
    };
    let (answer, seen) = late_call(slow, "CreateContainer", container_call("slow")).await;
    let (_, msg) = answer.unwrap_err();
    assert!(
        msg.contains("not done before the runtime's deadline"),
        "{msg}"
    );
    assert_eq!(
        seen,
        [r#"CreateContainer slow Some("/run/netns/slow")"#],
        "nothing undone"
    );
}

#[tokio::test]
async fn a_stop_not_done_by_its_deadline_is_answered_with_success_in_time_and_its_handler_goes_on()
{
    let slow = Recorder {
        stop_takes: Duration::from_millis(700),
        ..Default::default()
    };
    let (answer, seen) = late_call(slow, "StopPodSandbox", pod_call("slow")).await;
    assert!(answer.is_ok(), "a stop is not held up");
    assert_eq!(seen, [r#"StopPodSandbox slow Some("/run/netns/slow")"#]);
}

/// A runtime that sends calls and reads none of the answers: the answers fill the socket and then the outbox, and
/// the session ends with an error that says so, instead of dropping answers the runtime would wait for.
#[tokio::test]
async fn a_runtime_that_reads_no_answers_ends_the_session_with_an_error() {
    let plugin = Arc::new(Recorder::default());
    let (mut session, mut rt, _dir) = registered(plugin).await;
    let request = Request {
        service: api::PLUGIN.into(),
        method: "RunPodSandbox".into(),
        payload: pod_call("p"),
        timeout_nano: Duration::from_secs(2).as_nanos() as i64,
        metadata: Vec::new(),
    };
    for i in 0..200_000u32 {
        let bytes = Message::request(2 * i + 1, &request).encode();
        if session.is_finished()
            || mux::write_frames(&mut rt.stream, PLUGIN_SERVICE, &bytes)
                .await
                .is_err()
        {
            break;
        }
    }
    let ended = tokio::time::timeout(WRITE_TIMEOUT * 2, &mut session)
        .await
        .expect("the session went on though the runtime read no answer")
        .unwrap();
    let err = ended.unwrap_err();
    assert!(err.contains("no answer"), "{err}");
}
