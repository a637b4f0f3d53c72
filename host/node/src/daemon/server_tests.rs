//! The daemon's socket in process: real unix sockets, the fake API server, tokio's paused clock. The idle
//! timeout, shedding past `--max-in-flight`, health under load, and what a bad request gets.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use plexus_cni::daemon::proto::{self, Answer, Request, MAX_REQUEST_BYTES};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::time::Instant;

use super::fake::{self, pod, pod_ref, synced_cache, Call, FakeApi};
use super::server::{connection, drain, DRAIN_TIMEOUT, IDLE_TIMEOUT};
use super::state::enqueue_status;
use super::state::NodeState;

/// Serves `state` on a socket in a temporary directory, as the daemon does.
fn serve(state: Arc<NodeState>) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("daemon.sock");
    let listener = UnixListener::bind(&path).unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(connection(stream, state.clone(), 0));
        }
    });
    (dir, path)
}

struct Client(BufReader<UnixStream>);

impl Client {
    async fn connect(path: &PathBuf) -> Client {
        Client(BufReader::new(UnixStream::connect(path).await.unwrap()))
    }

    async fn send(&mut self, request: &Request) {
        let bytes = proto::encode(request).unwrap();
        self.0.get_mut().write_all(&bytes).await.unwrap();
    }

    /// The next answer, or `None` when the daemon closed the connection.
    async fn answer(&mut self) -> Option<Answer> {
        let mut line = Vec::new();
        self.0.read_until(b'\n', &mut line).await.ok()?;
        proto::decode_line(&line, MAX_REQUEST_BYTES).unwrap()
    }

    async fn ask(&mut self, request: &Request) -> Option<Answer> {
        self.send(request).await;
        self.answer().await
    }
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_is_closed_after_the_idle_timeout_and_a_busy_one_is_not() {
    let queue = tempfile::tempdir().unwrap();
    let (state, _) = fake::state(FakeApi::new(), synced_cache(&[]), queue.path(), 4);
    let (_dir, path) = serve(state);

    let mut idle = Client::connect(&path).await;
    let start = Instant::now();
    let mut rest = Vec::new();
    assert_eq!(idle.0.read_to_end(&mut rest).await.unwrap(), 0, "closed");
    assert!(
        start.elapsed() >= IDLE_TIMEOUT && start.elapsed() < IDLE_TIMEOUT + Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );

    // A client that asks within the timeout keeps its connection.
    let mut busy = Client::connect(&path).await;
    for _ in 0..3 {
        tokio::time::sleep(IDLE_TIMEOUT - Duration::from_secs(1)).await;
        assert!(matches!(
            busy.ask(&Request::Health).await,
            Some(Answer::Health(_))
        ));
    }
}

#[tokio::test(start_paused = true)]
async fn past_max_in_flight_a_request_is_shed_after_the_queue_wait_and_health_still_answers() {
    let queue = tempfile::tempdir().unwrap();
    let api = FakeApi::new();
    api.pods
        .lock()
        .unwrap()
        .insert("ns/web".into(), pod("ns", "web", "u1"));
    *api.latency.lock().unwrap() = Duration::from_secs(10);
    let (state, _) = fake::state(api.clone(), synced_cache(&[]), queue.path(), 1);
    let (_dir, path) = serve(state.clone());

    // The one slot: a pod the cache does not have, read from a slow API.
    let mut first = Client::connect(&path).await;
    first
        .send(&Request::Pod {
            pod: pod_ref("ns", "web", "u1"),
            within_ms: Some(60_000),
        })
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mut second = Client::connect(&path).await;
    let start = Instant::now();
    let shed = second
        .ask(&Request::Nad {
            namespace: "ns".into(),
            name: "net1".into(),
            within_ms: None,
        })
        .await;
    assert_eq!(shed, Some(Answer::Busy));
    let waited = start.elapsed();
    assert!(
        waited >= state.load.queue_wait
            && waited < state.load.queue_wait + Duration::from_millis(5),
        "{waited:?}"
    );
    assert_eq!(state.metrics.requests_shed.get(), 1);

    let mut operator = Client::connect(&path).await;
    let start = Instant::now();
    let Some(Answer::Health(h)) = operator.ask(&Request::Health).await else {
        panic!("no health")
    };
    assert!(start.elapsed() < Duration::from_millis(10), "health waited");
    assert_eq!((h.in_flight, h.max_in_flight, h.shed), (1, 1, 1));

    let Some(Answer::Pod { pod, .. }) = first.answer().await else {
        panic!("no pod")
    };
    assert_eq!(pod.name, "web");
    // The slot is free again: the same request is served.
    assert!(matches!(
        second
            .ask(&Request::Nad {
                namespace: "ns".into(),
                name: "net1".into(),
                within_ms: Some(60_000),
            })
            .await,
        Some(Answer::Failed { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_status_request_is_answered_at_once_and_written_behind_it() {
    let queue = tempfile::tempdir().unwrap();
    let api = FakeApi::new();
    *api.latency.lock().unwrap() = Duration::from_secs(3);
    let cache = synced_cache(&[pod("ns", "web", "u1")]);
    let (state, _) = fake::state(api.clone(), cache, queue.path(), 4);
    let (_dir, path) = serve(state.clone());
    let mut client = Client::connect(&path).await;
    let start = Instant::now();
    let done = client
        .ask(&Request::Status {
            pod: pod_ref("ns", "web", "u1"),
            network_status: "[]".into(),
        })
        .await;
    assert_eq!(done, Some(Answer::Done));
    assert!(start.elapsed() < Duration::from_millis(10));
    assert!(api.writes().is_empty());
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(api.writes(), vec![("ns/web".to_string(), "[]".to_string())]);
    assert_eq!(state.pending_writes(), 0);
    // From the cache, without the API.
    let Some(Answer::Pod { pod, .. }) = client
        .ask(&Request::Pod {
            pod: pod_ref("ns", "web", "u1"),
            within_ms: None,
        })
        .await
    else {
        panic!("no pod")
    };
    assert_eq!(pod.uid.as_deref(), Some("u1"));
    assert!(!api
        .attempts()
        .iter()
        .any(|(_, c)| matches!(c, Call::Pod(_))));
}

/// An answer is due a quarter before the CNI process stops waiting for it (`within_ms`): what the daemon has not
/// cached and the API has not given by then is left to the CNI process (it reads it with its own retries), rather
/// than the daemon's read running past the wait, after which the process would stop asking the daemon at all,
/// status write included. With time enough, the read's answer comes with the pod.
#[tokio::test(start_paused = true)]
async fn an_answer_is_due_before_the_cni_process_stops_waiting_for_it() {
    let queue = tempfile::tempdir().unwrap();
    let api = FakeApi::new();
    *api.latency.lock().unwrap() = Duration::from_secs(10);
    let mut web = pod("ns", "web", "u1");
    web.resource_claims = vec![plexus_core::spec::PodClaimRef {
        name: "nic".into(),
        claim: Some("web-nic".into()),
    }];
    let cache = synced_cache(&[web]);
    cache.set_dra_served(plexus_cluster::DraServed::Yes);
    cache.listed_no_slices();
    let (state, _) = fake::state(api.clone(), cache, queue.path(), 4);
    let (_dir, path) = serve(state);
    let mut client = Client::connect(&path).await;
    let ask = |pod: &str, within_ms: u64| Request::Pod {
        pod: pod_ref("ns", pod, "u1"),
        within_ms: Some(within_ms),
    };
    let claims_reads = || {
        api.attempts()
            .iter()
            .filter(|(_, c)| *c == Call::Claims("ns/web".into()))
            .count()
    };

    // The pod is cached, its claim is not.
    let start = Instant::now();
    let answer = client.ask(&ask("web", 2000)).await;
    let took = start.elapsed();
    assert!(
        matches!(&answer, Some(Answer::Pod { pod, claims: None }) if pod.name == "web"),
        "{answer:?}"
    );
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_millis(1510),
        "{took:?}"
    );
    assert_eq!(claims_reads(), 1);

    let start = Instant::now();
    let answer = client.ask(&ask("web", 20_000)).await;
    assert!(
        matches!(
            &answer,
            Some(Answer::Pod {
                claims: Some(_),
                ..
            })
        ),
        "{answer:?}"
    );
    assert!(
        start.elapsed() >= Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(claims_reads(), 2);

    // A pod or a NAD not cached at all.
    let start = Instant::now();
    assert_eq!(client.ask(&ask("db", 2000)).await, Some(Answer::Unsynced));
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_millis(1510),
        "{took:?}"
    );
    let start = Instant::now();
    let nad = Request::Nad {
        namespace: "ns".into(),
        name: "net1".into(),
        within_ms: Some(1000),
    };
    assert_eq!(client.ask(&nad).await, Some(Answer::Unsynced));
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(750) && took < Duration::from_millis(760),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_malformed_or_oversized_request_closes_the_connection_unanswered() {
    let queue = tempfile::tempdir().unwrap();
    let (state, _) = fake::state(FakeApi::new(), synced_cache(&[]), queue.path(), 4);
    let (_dir, path) = serve(state);
    for bytes in [
        b"{\"nope\": 1}\n".to_vec(),
        vec![b'x'; MAX_REQUEST_BYTES + 10],
    ] {
        let mut client = Client::connect(&path).await;
        // The daemon may close before taking all of an oversized one.
        let _ = client.0.get_mut().write_all(&bytes).await;
        assert_eq!(client.answer().await, None);
    }
    // The daemon serves the next client as before.
    let mut client = Client::connect(&path).await;
    assert!(matches!(
        client.ask(&Request::Health).await,
        Some(Answer::Health(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn a_stopping_daemon_waits_for_accepted_writes_but_not_past_the_drain_timeout() {
    let queue = tempfile::tempdir().unwrap();
    let api = FakeApi::new();
    *api.latency.lock().unwrap() = Duration::from_secs(2);
    let cache = synced_cache(&[pod("ns", "web", "u1")]);
    let (state, _) = fake::state(api.clone(), cache, queue.path(), 4);
    assert!(enqueue_status(
        &state,
        pod_ref("ns", "web", "u1"),
        "[1]".into()
    ));
    let start = Instant::now();
    drain(&state, queue.path()).await;
    assert!(start.elapsed() < DRAIN_TIMEOUT, "{:?}", start.elapsed());
    assert_eq!(api.writes().len(), 1, "sent before stopping");

    // A dead API server does not hold the process: the write stays on disk for the next run.
    api.set_down(true);
    assert!(enqueue_status(
        &state,
        pod_ref("ns", "web", "u1"),
        "[2]".into()
    ));
    let start = Instant::now();
    drain(&state, queue.path()).await;
    let waited = start.elapsed();
    assert!(
        waited >= DRAIN_TIMEOUT && waited < DRAIN_TIMEOUT + Duration::from_millis(100),
        "{waited:?}"
    );
    assert_eq!(state.pending_writes(), 1);
    assert_eq!(std::fs::read_dir(queue.path()).unwrap().count(), 1, "kept");
}

#[tokio::test(start_paused = true)]
async fn a_stopping_daemon_posts_the_events_of_answered_adds_first() {
    let queue = tempfile::tempdir().unwrap();
    let api = FakeApi::new();
    *api.latency.lock().unwrap() = Duration::from_secs(1);
    let (state, _) = fake::state(api.clone(), synced_cache(&[]), queue.path(), 4);
    for pod in ["web", "db"] {
        crate::daemon::state::send_event(
            &state,
            pod_ref("ns", pod, "u1"),
            false,
            "AddedInterface".into(),
            "net1".into(),
        );
    }
    drain(&state, queue.path()).await;
    let events = api
        .calls()
        .into_iter()
        .filter(|(_, c)| matches!(c, fake::Call::Event { .. }))
        .count();
    assert_eq!(events, 2, "posted before stopping");
    assert_eq!(state.events_in_flight(), 0);
}
