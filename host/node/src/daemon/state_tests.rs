//! The daemon's shared state in process, against the fake API server on tokio's paused clock: the durable status
//! writer across an outage and a restart, the event cap, and the pod and NAD lookups.

use std::time::Duration;

use kube::runtime::watcher::Event;
use plexus_cluster::{Lookup, NodeCache};
use tokio::time::Instant;

use super::fake::{self, pod, pod_ref, synced_cache, Call, FakeApi};
use super::metrics::ResultLabel;
use super::state::{
    enqueue_claim_status, enqueue_status, send_event, start_writer, EVENT_RETRY_FOR,
    FORBIDDEN_RETRY_FOR, MAX_EVENTS_IN_FLIGHT,
};

/// A device's network data for a claim's status: the device `d/p/vf0` as interface `ifname`.
fn data(ifname: &str) -> plexus_core::spec::dra::DeviceNetworkData {
    use plexus_core::spec::dra::{DeviceKey, DeviceNetworkData};
    DeviceNetworkData {
        key: DeviceKey {
            driver: "d".into(),
            pool: "p".into(),
            device: "vf0".into(),
        },
        share_id: None,
        interface_name: Some(ifname.into()),
        ips: vec!["10.1.0.5/24".into()],
        hardware_address: None,
    }
}

fn writes_counted(state: &super::state::NodeState, result: &str) -> u64 {
    state
        .metrics
        .status_writes
        .get_or_create(&ResultLabel {
            result: result.into(),
        })
        .get()
}

#[tokio::test(start_paused = true)]
async fn a_status_write_waits_out_an_outage_with_doubling_jittered_delays() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::new();
    api.set_down(true);
    let cache = synced_cache(&[pod("ns", "web", "u1")]);
    let (state, _) = fake::state(api.clone(), cache, dir.path(), 4);

    assert!(enqueue_status(
        &state,
        pod_ref("ns", "web", "u1"),
        "[1]".into()
    ));
    tokio::time::sleep(Duration::from_secs(40)).await;
    let tries: Vec<Instant> = api.attempts().into_iter().map(|(t, _)| t).collect();
    assert!(tries.len() >= 5, "{tries:?}");
    // 1 s doubling, ±25%, capped at 30 s.
    for (i, gap) in tries.windows(2).map(|w| w[1] - w[0]).enumerate() {
        let nominal = Duration::from_secs(1 << i).min(Duration::from_secs(30));
        assert!(
            gap >= nominal.mul_f64(0.75) && gap <= nominal.mul_f64(1.25),
            "retry {i}: {gap:?} for {nominal:?}"
        );
    }
    assert!(api.writes().is_empty());
    assert_eq!(state.pending_writes(), 1, "kept while the API is down");
    assert_eq!(writes_counted(&state, "error"), tries.len() as u64);

    api.set_down(false);
    tokio::time::sleep(Duration::from_secs(40)).await;
    assert_eq!(
        api.writes(),
        vec![("ns/web".to_string(), "[1]".to_string())]
    );
    assert_eq!(state.pending_writes(), 0);
    assert_eq!(writes_counted(&state, "success"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_newer_write_replaces_the_one_kept_during_an_outage() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::new();
    api.set_down(true);
    let cache = synced_cache(&[pod("ns", "web", "u1")]);
    let (state, _) = fake::state(api.clone(), cache, dir.path(), 4);
    assert!(enqueue_status(
        &state,
        pod_ref("ns", "web", "u1"),
        "[1]".into()
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(enqueue_status(
        &state,
        pod_ref("ns", "web", "u1"),
        "[2]".into()
    ));
    api.set_down(false);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        api.writes(),
        vec![("ns/web".to_string(), "[2]".to_string())]
    );
    assert_eq!(state.pending_writes(), 0);
}

#[tokio::test(start_paused = true)]
async fn writes_a_daemon_kept_are_sent_by_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let down = FakeApi::new();
    down.set_down(true);
    let cache = synced_cache(&[pod("ns", "web", "u1"), pod("ns", "db", "u2")]);
    let (first, kept) = fake::state(down.clone(), cache.clone(), dir.path(), 4);
    assert!(kept.is_empty());
    assert!(enqueue_status(
        &first,
        pod_ref("ns", "web", "u1"),
        "[w]".into()
    ));
    assert!(enqueue_status(
        &first,
        pod_ref("ns", "db", "u2"),
        "[d]".into()
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(down.writes().is_empty());

    // The next daemon (same queue directory) finds both and sends them.
    let up = FakeApi::new();
    let (next, mut kept) = fake::state(up.clone(), cache, dir.path(), 4);
    kept.sort();
    assert_eq!(
        kept,
        vec![
            super::status_queue::Key::pod("ns", "db"),
            super::status_queue::Key::pod("ns", "web")
        ]
    );
    for key in kept {
        start_writer(&next, key);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut writes = up.writes();
    writes.sort();
    assert_eq!(
        writes,
        vec![
            ("ns/db".to_string(), "[d]".to_string()),
            ("ns/web".to_string(), "[w]".to_string())
        ]
    );
    assert_eq!(next.pending_writes(), 0);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no file left"
    );
}

#[tokio::test(start_paused = true)]
async fn a_write_for_a_pod_replaced_under_another_uid_is_dropped_unsent() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::new();
    let cache = synced_cache(&[pod("ns", "web", "new-uid")]);
    let (state, _) = fake::state(api.clone(), cache, dir.path(), 4);
    assert!(enqueue_status(
        &state,
        pod_ref("ns", "web", "old-uid"),
        "[1]".into()
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(api.attempts().is_empty(), "{:?}", api.attempts());
    assert_eq!(state.pending_writes(), 0);
}

#[tokio::test(start_paused = true)]
async fn events_past_the_cap_are_dropped_and_none_are_posted_when_off() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::new();
    api.hold_events
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let (state, _) = fake::state(api.clone(), synced_cache(&[]), dir.path(), 4);
    for i in 0..MAX_EVENTS_IN_FLIGHT + 44 {
        let pod = pod_ref("ns", &format!("p{i}"), "u");
        send_event(&state, pod, true, "NetworkAttachFailed".into(), "m".into());
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(api.answered(), 0, "held");
    api.hold_events
        .store(false, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let posted = api
        .calls()
        .into_iter()
        .filter(|(_, c)| matches!(c, Call::Event { kind, .. } if kind == "Warning"))
        .count();
    assert_eq!(posted, MAX_EVENTS_IN_FLIGHT);
    // Once they are out, there is room again.
    send_event(
        &state,
        pod_ref("ns", "late", "u"),
        false,
        "R".into(),
        "m".into(),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(api.answered(), MAX_EVENTS_IN_FLIGHT + 1);
    // One dropped at the cap was never posted: sent again, it is posted, not counted on an event that does not
    // exist.
    let dropped = pod_ref("ns", &format!("p{}", MAX_EVENTS_IN_FLIGHT + 1), "u");
    send_event(
        &state,
        dropped,
        true,
        "NetworkAttachFailed".into(),
        "m".into(),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let posted = api
        .calls()
        .into_iter()
        .filter(|(_, c)| matches!(c, Call::Event { kind, .. } if kind == "Warning"))
        .count();
    assert_eq!(posted, MAX_EVENTS_IN_FLIGHT + 1);

    api.no_events
        .store(true, std::sync::atomic::Ordering::SeqCst);
    send_event(
        &state,
        pod_ref("ns", "off", "u"),
        true,
        "R".into(),
        "m".into(),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(api.attempts().len(), MAX_EVENTS_IN_FLIGHT + 2);
}

#[tokio::test(start_paused = true)]
async fn a_pod_the_watch_delivers_within_the_wait_is_answered_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::new();
    let cache = synced_cache(&[]);
    let (state, _) = fake::state(api.clone(), cache.clone(), dir.path(), 4);
    let asking = state.clone();
    let asked = tokio::spawn(async move { asking.pod_for_add(&pod_ref("ns", "web", "u1")).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    cache.apply_pod(Event::Apply(pod("ns", "web", "u1")));
    let got = asked.await.unwrap().unwrap().unwrap();
    assert_eq!(got.uid.as_deref(), Some("u1"));
    assert_eq!(state.api_reads(), 0);
    assert!(api.attempts().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_pod_the_watch_has_not_delivered_is_read_from_the_api_after_the_wait() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::new();
    api.pods
        .lock()
        .unwrap()
        .insert("ns/web".into(), pod("ns", "web", "u1"));
    let (state, _) = fake::state(api.clone(), synced_cache(&[]), dir.path(), 4);
    let start = Instant::now();
    let got = state.pod_for_add(&pod_ref("ns", "web", "u1")).await;
    let waited = start.elapsed();
    assert!(
        waited >= state.pod_wait && waited < state.pod_wait + Duration::from_millis(5),
        "{waited:?}"
    );
    assert_eq!(got.unwrap().unwrap().name, "web");
    assert_eq!(state.api_reads(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_pod_recreated_under_its_name_is_not_taken_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::new();
    api.pods
        .lock()
        .unwrap()
        .insert("ns/web".into(), pod("ns", "web", "new"));
    let cache = synced_cache(&[pod("ns", "web", "old")]);
    let (state, _) = fake::state(api.clone(), cache, dir.path(), 4);
    assert!(matches!(
        state.cached_pod(&pod_ref("ns", "web", "new")),
        Lookup::Missing
    ));
    // Without a UID the cached pod is the pod.
    let any = plexus_core::spec::PodRef {
        uid: None,
        ..pod_ref("ns", "web", "x")
    };
    assert!(matches!(state.cached_pod(&any), Lookup::Found(_)));
    let got = state.pod(&pod_ref("ns", "web", "new")).await.unwrap();
    assert_eq!(got.uid.as_deref(), Some("new"));
    assert_eq!(state.api_reads(), 1);
}

#[tokio::test(start_paused = true)]
async fn unsynced_caches_answer_unsynced_and_a_missing_nad_is_read_from_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::new();
    let (unsynced, _) = fake::state(api.clone(), NodeCache::new(), dir.path(), 4);
    assert!(unsynced
        .pod_for_add(&pod_ref("ns", "web", "u1"))
        .await
        .is_none());
    assert!(unsynced.nad("ns", "net1").await.is_none());
    assert!(api.attempts().is_empty());

    let other = tempfile::tempdir().unwrap();
    let (state, _) = fake::state(api.clone(), synced_cache(&[]), other.path(), 4);
    let missing = state.nad("ns", "net1").await.unwrap().unwrap_err();
    assert!(missing.to_string().contains("ns/net1"), "{missing}");
    assert_eq!(state.api_reads(), 1);
    let calls: Vec<Call> = api.attempts().into_iter().map(|(_, c)| c).collect();
    assert_eq!(calls, vec![Call::Nad("ns/net1".into())]);
}

/// An event repeated while its count is being sent waits for it: one count in flight per event, then one more with
/// the count the repeats reached (a flood of one event costs two requests, not one per repeat).
#[tokio::test(start_paused = true)]
async fn repeats_of_an_event_while_its_count_is_sent_are_sent_as_one_count() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::new();
    let (state, _) = fake::state(api.clone(), synced_cache(&[]), dir.path(), 4);
    let send = || {
        send_event(
            &state,
            pod_ref("ns", "web", "u1"),
            false,
            "AddedInterface".into(),
            "Add net1".into(),
        );
    };
    send();
    tokio::time::sleep(Duration::from_secs(1)).await;
    *api.latency.lock().unwrap() = Duration::from_secs(2);
    for _ in 0..5 {
        send();
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let counts: Vec<i32> = api
        .calls()
        .into_iter()
        .filter_map(|(_, c)| match c {
            Call::Count { count, .. } => Some(count),
            _ => None,
        })
        .collect();
    assert_eq!(counts, [2, 6]);
    // The next repeat is counted at once again.
    send();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let last = api.calls().into_iter().last().map(|(_, c)| c);
    assert!(
        matches!(last, Some(Call::Count { count: 7, .. })),
        "{last:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_repeated_event_increments_the_first_ones_count_within_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::new();
    let (state, _) = fake::state(api.clone(), synced_cache(&[]), dir.path(), 4);
    let web = || pod_ref("ns", "web", "u1");
    let send = |message: &str| {
        send_event(
            &state,
            web(),
            true,
            "NetworkChangeFailed".into(),
            message.into(),
        );
    };
    for _ in 0..4 {
        send("net2: no such NAD");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Another message is another event.
    send("net3: denied");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let calls: Vec<Call> = api.calls().into_iter().map(|(_, c)| c).collect();
    let first = calls
        .iter()
        .filter(|c| matches!(c, Call::Event { .. }))
        .count();
    assert_eq!(first, 2, "{calls:?}");
    let counts: Vec<i32> = calls
        .iter()
        .filter_map(|c| match c {
            Call::Count { count, .. } => Some(*count),
            _ => None,
        })
        .collect();
    assert_eq!(counts, [2, 3, 4], "{calls:?}");
    let Some(Call::Count { event, .. }) = calls.iter().find(|c| matches!(c, Call::Count { .. }))
    else {
        unreachable!()
    };
    assert!(
        event.starts_with("web."),
        "counted on the event posted first: {event}"
    );

    // Seen again at once, while its post is still in flight: counted on it when the post answers.
    *api.latency.lock().unwrap() = Duration::from_secs(2);
    send("net4: slow");
    send("net4: slow");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let calls: Vec<Call> = api.calls().into_iter().map(|(_, c)| c).collect();
    assert!(
        calls.ends_with(&[
            Call::Event {
                pod: "ns/web".into(),
                kind: "Warning".into(),
                reason: "NetworkChangeFailed".into()
            },
            Call::Count {
                event: match &calls[calls.len() - 1] {
                    Call::Count { event, .. } => event.clone(),
                    other => panic!("{other:?}"),
                },
                count: 2
            }
        ]),
        "{calls:?}"
    );

    // Past the window, the same event is posted anew.
    *api.latency.lock().unwrap() = Duration::ZERO;
    tokio::time::sleep(super::state::EVENT_WINDOW).await;
    let before = api.calls().len();
    send("net2: no such NAD");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after: Vec<Call> = api
        .calls()
        .into_iter()
        .skip(before)
        .map(|(_, c)| c)
        .collect();
    assert!(
        matches!(after.as_slice(), [Call::Event { .. }]),
        "{after:?}"
    );
}

/// A claim's device status written across an outage and a restart: kept on disk under the claim, the newest
/// write wins, and the next daemon sends what the last one kept.
#[tokio::test(start_paused = true)]
async fn a_claim_status_write_is_kept_across_an_outage_and_a_restart() {
    use plexus_core::spec::dra::ClaimName;
    let dir = tempfile::tempdir().unwrap();
    let claim = ClaimName {
        namespace: "ns".into(),
        name: "web-nics".into(),
    };
    {
        let api = FakeApi::new();
        api.set_down(true);
        let (state, _) = fake::state(api.clone(), synced_cache(&[]), dir.path(), 4);
        let web = pod_ref("ns", "web", "u1");
        assert!(enqueue_claim_status(
            &state,
            web.clone(),
            claim.clone(),
            vec![data("net1")]
        ));
        assert!(enqueue_claim_status(
            &state,
            web,
            claim.clone(),
            vec![data("net2")]
        ));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!api.attempts().is_empty());
        assert_eq!(api.answered(), 0);
        assert_eq!(state.pending_writes(), 1, "one file for the claim");
    }
    // The next daemon finds it and sends the newest.
    let api = FakeApi::new();
    let (state, found) = fake::state(api.clone(), synced_cache(&[]), dir.path(), 4);
    for key in found {
        start_writer(&state, key);
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let sent: Vec<Call> = api.calls().into_iter().map(|(_, c)| c).collect();
    assert_eq!(
        sent,
        vec![Call::Claim {
            claim: "ns/web-nics".into(),
            interfaces: vec!["net2".into()]
        }]
    );
    assert_eq!(state.pending_writes(), 0);
}

#[tokio::test(start_paused = true)]
async fn an_event_sent_while_the_api_is_down_is_posted_once_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::new();
    let (state, _) = fake::state(api.clone(), synced_cache(&[]), dir.path(), 4);
    let posted = |api: &FakeApi| {
        api.calls()
            .into_iter()
            .filter(|(_, c)| matches!(c, Call::Event { .. }))
            .count()
    };
    api.set_down(true);
    send_event(
        &state,
        pod_ref("ns", "web", "u1"),
        false,
        "AddedInterface".into(),
        "net1".into(),
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(posted(&api), 0);
    let tries = api.attempts().len();
    assert!((4..=12).contains(&tries), "tried {tries} times in 60 s");
    api.set_down(false);
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(posted(&api), 1, "{:?}", api.attempts());

    // An outage longer than the retry budget: given up, and nothing is left in flight.
    api.set_down(true);
    send_event(
        &state,
        pod_ref("ns", "db", "u2"),
        false,
        "AddedInterface".into(),
        "net1".into(),
    );
    tokio::time::sleep(EVENT_RETRY_FOR + Duration::from_secs(15)).await;
    api.set_down(false);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(posted(&api), 1, "{:?}", api.attempts());
}

/// A claim write and an event the API server refuses as forbidden for a while (a server just started, its
/// authorizer's caches not synced yet) are tried again and delivered; a refusal that lasts past
/// `FORBIDDEN_RETRY_FOR` is final: both are dropped, and tried no more.
#[tokio::test(start_paused = true)]
async fn a_refusal_as_forbidden_is_tried_again_for_a_while_then_final() {
    use plexus_core::spec::dra::ClaimName;
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::new();
    let (state, _) = fake::state(api.clone(), synced_cache(&[]), dir.path(), 4);
    let data = vec![data("net1")];
    let claim = |name: &str| ClaimName {
        namespace: "ns".into(),
        name: name.into(),
    };
    // The claim write's and the event's calls of `pod`, among `calls`.
    let of_pod = |calls: Vec<(Instant, Call)>, pod: &str| {
        calls
            .iter()
            .filter(|(_, c)| match c {
                Call::Claim { claim, .. } => claim == &format!("ns/{pod}-nic"),
                Call::Event { pod: p, .. } => p == &format!("ns/{pod}"),
                _ => false,
            })
            .count()
    };
    let tried = |api: &FakeApi, pod: &str| of_pod(api.attempts(), pod);
    let delivered = |api: &FakeApi, pod: &str| of_pod(api.calls(), pod);
    let send = |pod: &str| {
        let at = pod_ref("ns", pod, "u1");
        assert!(enqueue_claim_status(
            &state,
            at.clone(),
            claim(&format!("{pod}-nic")),
            data.clone()
        ));
        send_event(&state, at, false, "AddedInterface".into(), "m".into());
    };

    api.forbid.store(4, SeqCst);
    send("web");
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(api.forbid.load(SeqCst), 0, "refused four times");
    assert_eq!(tried(&api, "web"), 6);
    assert_eq!(delivered(&api, "web"), 2, "the claim and the event");
    assert_eq!(state.pending_writes(), 0);

    api.forbid.store(usize::MAX, SeqCst);
    send("db");
    tokio::time::sleep(FORBIDDEN_RETRY_FOR + Duration::from_secs(60)).await;
    assert_eq!(delivered(&api, "db"), 0);
    assert_eq!(state.pending_writes(), 0, "dropped");
    let attempts = tried(&api, "db");
    assert!(attempts > 2, "tried again: {attempts}");
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(tried(&api, "db"), attempts, "and no more");
}
