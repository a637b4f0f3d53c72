//! The agent's guarantees in process, against [`FakeEffects`] on tokio's paused clock: last good kept through
//! outages, unready entries, a refused report not sent again and a failed one sent again with backoff, trust
//! following the keys, the order of a rollout, and the registry's backoff. The hook set and the module records are real files in a temporary
//! directory, as an ADD reads them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use p256::ecdsa::SigningKey;
use p256::pkcs8::{EncodePublicKey as _, LineEnding};
use plexus_cni::hooks::HookSet;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::fake::{Effect, FakeEffects};
use super::{Agent, AgentSettings, Resource, SignaturePolicy};
use crate::daemon::compile::ProcessLimits;
use crate::daemon::metrics::HookStates;
use crate::distribution::{key_id, RegistryOptions};
use crate::hook_state::{Failure, Reason};

/// An agent over the fake, the resources it is given and its Node's labels.
struct World {
    dir: tempfile::TempDir,
    fx: Arc<FakeEffects>,
    agent: Agent,
    hooks: BTreeMap<String, Resource>,
    labels: BTreeMap<String, String>,
    states: HookStates,
}

impl World {
    fn new(signatures: SignaturePolicy) -> World {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        std::fs::create_dir(&keys).unwrap();
        let states = HookStates::default();
        let settings = AgentSettings {
            node: "node1".into(),
            states: states.clone(),
            cache_dir: dir.path().join("cache"),
            key_files: match signatures {
                SignaturePolicy::Required => vec![keys],
                SignaturePolicy::Off => vec![],
            },
            signatures,
            registry: RegistryOptions::default(),
            watch_timeout_secs: 290,
            compiler: PathBuf::from("/nonexistent/plexus"),
            limits: ProcessLimits::default(),
        };
        std::fs::create_dir(&settings.cache_dir).unwrap();
        let fx = Arc::new(FakeEffects::new(&settings.cache_dir));
        World {
            agent: Agent::new(settings, fx.clone()),
            fx,
            dir,
            hooks: BTreeMap::new(),
            labels: BTreeMap::new(),
            states,
        }
    }

    /// Trusts a key (written to the key directory, as a mounted ConfigMap's entry); its ID.
    fn trust(&self, seed: u8) -> String {
        let key = SigningKey::from_slice(&[seed; 32]).unwrap();
        let public = key.verifying_key();
        let pem = public.to_public_key_pem(LineEnding::LF).unwrap();
        let file = self.dir.path().join(format!("keys/key-{seed}.pub"));
        std::fs::write(file, pem).unwrap();
        key_id(public)
    }

    fn distrust(&self, seed: u8) {
        std::fs::remove_file(self.dir.path().join(format!("keys/key-{seed}.pub"))).unwrap();
    }

    fn hook(&mut self, name: &str, module: &str, extra: Value) {
        let mut spec = json!({"kind": "policy", "module": module});
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let generation = self.hooks.get(name).map_or(1, |r| r.generation + 1);
        let spec = serde_json::from_value(spec).map_err(|e| e.to_string());
        self.hooks
            .insert(name.into(), Resource { spec, generation });
    }

    /// One reconciliation, as the controller runs it: when a retry is due.
    async fn reconcile(&mut self) -> Option<Instant> {
        self.agent
            .reconcile(&self.hooks, &self.labels, "uid-1")
            .await
    }

    fn set(&self) -> HookSet {
        HookSet::read(&self.agent.settings.cache_dir)
            .unwrap()
            .expect("a hook set is published")
    }

    /// The entries that run something: name and component sha256, in order.
    fn running(&self) -> Vec<(String, String)> {
        let hooks = self.set().hooks.into_iter();
        hooks
            .filter(|h| h.unready.is_none())
            .map(|h| (h.name, h.sha256.unwrap_or_default()))
            .collect()
    }

    fn unready(&self) -> Vec<(String, String)> {
        let hooks = self.set().hooks.into_iter();
        hooks.filter_map(|h| Some((h.name, h.unready?))).collect()
    }

    /// The hook's entry in the report the API server holds.
    fn reported(&self, hook: &str) -> Option<Value> {
        let report = self.fx.report.lock().unwrap().clone()?;
        let hooks = report["status"]["hooks"].as_array()?.clone();
        hooks.into_iter().find(|h| h["name"] == hook)
    }

    /// Deletes every pulled component and record (what a node's disk loses, or an operator clears).
    fn lose_pulled_modules(&self) {
        let modules = self.agent.modules.clone();
        for entry in std::fs::read_dir(modules).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
    }
}

fn sha(wasm: &[u8]) -> String {
    crate::distribution::sha256_digest(wasm)["sha256:".len()..].to_string()
}

fn digest(reference: &str) -> &str {
    reference.split_once('@').unwrap().1
}

#[tokio::test(start_paused = true)]
async fn the_last_good_version_runs_through_registry_and_api_outages_and_a_failed_rollout() {
    let mut w = World::new(SignaturePolicy::Off);
    let v1 = w.fx.push("labels", b"v1", None);
    w.hook("labels", &v1, json!({}));
    w.reconcile().await;
    assert_eq!(w.running(), [("labels".into(), sha(b"v1"))]);
    let good = w.set();

    // The registry and the API server down, the pulled files gone: reconciled again and again, the hook keeps
    // running from what was published.
    w.fx.registry_down.store(true, Ordering::SeqCst);
    w.fx.api_down.store(true, Ordering::SeqCst);
    w.lose_pulled_modules();
    for _ in 0..5 {
        let next = w.reconcile().await.expect("a retry is due");
        tokio::time::sleep_until(next).await;
        assert_eq!(w.set().hooks, good.hooks);
    }
    assert!(w.states.hooks()["labels"].active, "the node knows it runs");
    assert_eq!(w.states.hooks()["labels"].reason, "PullFailed");

    // A rollout to v2 while the registry is down: v1 runs on, the report says why v2 does not.
    w.fx.api_down.store(false, Ordering::SeqCst);
    let v2 = w.fx.push("labels", b"v2", None);
    w.hook("labels", &v2, json!({}));
    w.reconcile().await;
    assert_eq!(w.set().hooks, good.hooks, "the last good set stays");
    let r = w.reported("labels").unwrap();
    assert_eq!(
        (r["active"].clone(), r["reason"].clone()),
        (json!(true), json!("PullFailed"))
    );
    assert_eq!(r["digest"], digest(&v1), "{r}");
    assert!(r["nextAttemptTime"].is_string(), "{r}");

    // Back: v2 runs.
    w.fx.registry_down.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(400)).await;
    assert_eq!(w.reconcile().await, None, "nothing left to retry");
    assert_eq!(w.running(), [("labels".into(), sha(b"v2"))]);
    let r = w.reported("labels").unwrap();
    assert_eq!(
        (r["reason"].clone(), r["digest"].clone()),
        (json!("Active"), json!(digest(&v2)))
    );
}

#[tokio::test(start_paused = true)]
async fn a_selected_hook_with_nothing_to_run_is_an_unready_entry_its_failure_policy_enforces() {
    let mut w = World::new(SignaturePolicy::Off);
    // Before any hook: an empty set is published all the same (ADDs wait for a set).
    w.reconcile().await;
    assert!(w.set().hooks.is_empty());

    w.fx.registry_down.store(true, Ordering::SeqCst);
    let strict = w.fx.push("strict", b"s", None);
    let lenient = w.fx.push("lenient", b"l", None);
    w.hook("strict", &strict, json!({"namespaces": ["team"]}));
    w.hook(
        "lenient",
        &lenient,
        json!({"failurePolicy": "Ignore", "order": 1}),
    );
    let bad = w.fx.push("bad", b"b", None);
    w.fx.probe_fails.lock().unwrap().insert(
        sha(b"b"),
        Failure::new(Reason::KindMismatch, "exports status only"),
    );
    w.hook("bad", &bad, json!({"order": 2}));
    w.reconcile().await;

    assert!(w.running().is_empty());
    let set = w.set();
    let names: Vec<&str> = set.hooks.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(
        names,
        ["strict", "lenient", "bad"],
        "in order, as they would run"
    );
    let unready = w.unready();
    assert!(unready[0].1.starts_with("PullFailed: "), "{unready:?}");
    assert_eq!(
        set.hooks[0].failure_policy,
        plexus_hooks::FailurePolicy::Fail
    );
    assert_eq!(set.hooks[0].namespaces, Some(vec!["team".to_string()]));
    assert_eq!(
        set.hooks[1].failure_policy,
        plexus_hooks::FailurePolicy::Ignore
    );
    let r = w.reported("strict").unwrap();
    assert_eq!(
        (r["active"].clone(), r["reason"].clone()),
        (json!(false), json!("PullFailed"))
    );
    assert!(r["nextAttemptTime"].is_string(), "{r}");
    assert!(r["message"]
        .as_str()
        .unwrap()
        .ends_with("the ADDs it applies to are refused (failurePolicy Fail)"));

    // The registry back: the module that fails its probe stays unready, the others run.
    w.fx.registry_down.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    w.reconcile().await;
    let running: Vec<String> = w.running().into_iter().map(|(n, _)| n).collect();
    assert_eq!(running, ["strict", "lenient"]);
    assert_eq!(w.unready().len(), 1);
    assert!(
        w.unready()[0].1.starts_with("KindMismatch: "),
        "{:?}",
        w.unready()
    );
    assert_eq!(w.reported("bad").unwrap()["reason"], "KindMismatch");
    // A Warning event on each hook as it starts failing, not at every reconcile.
    let warned = |hook: &str| {
        let effects = w.fx.effects().into_iter();
        effects
            .filter(|e| matches!(e, Effect::Warn { hook: h, .. } if h == hook))
            .count()
    };
    assert_eq!(
        (warned("strict"), warned("bad")),
        (1, 2),
        "bad: PullFailed, then KindMismatch"
    );
}

#[tokio::test(start_paused = true)]
async fn a_refused_report_is_not_sent_again_until_it_changes_and_a_failed_one_is() {
    let mut w = World::new(SignaturePolicy::Off);
    let m = w.fx.push("a", b"a", None);
    w.hook("a", &m, json!({}));
    w.fx.refuse_reports.store(true, Ordering::SeqCst);
    for _ in 0..5 {
        w.reconcile().await;
    }
    assert_eq!(w.fx.reports_sent(), 1, "refused once, not sent again");

    // A new report (another hook) is sent, once.
    let b = w.fx.push("b", b"b", None);
    w.hook("b", &b, json!({}));
    for _ in 0..3 {
        w.reconcile().await;
    }
    assert_eq!(w.fx.reports_sent(), 2);

    // A report that did not get through for a transient reason is sent again at the next reconcile.
    w.fx.refuse_reports.store(false, Ordering::SeqCst);
    w.fx.api_down.store(true, Ordering::SeqCst);
    w.hook("b", &b, json!({"order": 3}));
    w.reconcile().await;
    assert_eq!(w.fx.reports_sent(), 3);
    w.fx.api_down.store(false, Ordering::SeqCst);
    w.reconcile().await;
    assert_eq!(w.fx.reports_sent(), 4);
    assert_eq!(w.reported("b").unwrap()["observedGeneration"], 2);
    // Taken: nothing to send until it changes.
    w.reconcile().await;
    assert_eq!(w.fx.reports_sent(), 4);
}

/// The agent is the report's durable writer: a report the API server did not take for a transient reason is sent
/// again when the agent says a retry is due, 1 s doubling (jittered), with nothing else changing in between.
#[tokio::test(start_paused = true)]
async fn a_report_that_failed_for_a_transient_reason_is_sent_again_with_backoff() {
    let mut w = World::new(SignaturePolicy::Off);
    let m = w.fx.push("a", b"a", None);
    w.hook("a", &m, json!({}));
    w.fx.api_down.store(true, Ordering::SeqCst);
    let mut next = w.reconcile().await.expect("the report is due again");
    for _ in 0..6 {
        tokio::time::sleep_until(next).await;
        next = w.reconcile().await.expect("the report is still due again");
    }
    let sent: Vec<Instant> =
        w.fx.calls()
            .into_iter()
            .filter_map(|(at, e, _)| matches!(e, super::fake::Effect::Report(_)).then_some(at))
            .collect();
    let gaps: Vec<Duration> = sent.windows(2).map(|p| p[1] - p[0]).collect();
    assert_eq!(gaps.len(), 6, "{gaps:?}");
    for (i, gap) in gaps.iter().enumerate() {
        let nominal = Duration::from_secs(1 << i);
        assert!(
            *gap >= nominal.mul_f64(0.75) && *gap <= nominal.mul_f64(1.25),
            "retry {i}: {gap:?} for {nominal:?} ({gaps:?})"
        );
    }
    assert!(w.reported("a").is_none());

    // Back: taken at the next retry, and nothing more is due.
    w.fx.api_down.store(false, Ordering::SeqCst);
    tokio::time::sleep_until(next).await;
    assert_eq!(w.reconcile().await, None, "taken: nothing left to retry");
    assert_eq!(w.reported("a").unwrap()["reason"], "Active");
    assert_eq!(w.fx.reports_sent(), 8);

    // A later failure starts again at about a second.
    w.fx.api_down.store(true, Ordering::SeqCst);
    w.hook("a", &m, json!({"order": 3}));
    let now = Instant::now();
    let next = w.reconcile().await.expect("the new report is due again");
    assert!(
        next - now <= Duration::from_millis(1250),
        "{:?}",
        next - now
    );
    assert_eq!(w.fx.reports_sent(), 9);
}

#[tokio::test(start_paused = true)]
async fn a_module_whose_key_leaves_the_trusted_set_stops_running_whatever_the_registry() {
    let mut w = World::new(SignaturePolicy::Required);
    let (key_a, key_b) = (w.trust(1), w.trust(2));
    w.agent.reload_keys();
    let a = w.fx.push("a", b"a", Some(&key_a));
    let b = w.fx.push("b", b"b", Some(&key_b));
    let unsigned = w.fx.push("u", b"u", None);
    w.hook("a", &a, json!({}));
    w.hook("b", &b, json!({}));
    w.hook("unsigned", &unsigned, json!({}));
    w.reconcile().await;
    let names = |w: &World| -> Vec<String> { w.running().into_iter().map(|(n, _)| n).collect() };
    assert_eq!(names(&w), ["a", "b"]);
    assert_eq!(
        w.reported("unsigned").unwrap()["reason"],
        "SignatureMissing"
    );
    assert_eq!(
        w.set().runs["a"].verified_by.as_deref(),
        Some(key_a.as_str())
    );

    // Key A removed while the registry is down: the agent notices on its next read of the keys, and the module it
    // verified leaves the set (enforced as unready); B's stays.
    w.fx.registry_down.store(true, Ordering::SeqCst);
    w.distrust(1);
    assert!(w.agent.reload_keys(), "the keys changed");
    assert!(!w.agent.reload_keys(), "and not again");
    w.reconcile().await;
    assert_eq!(names(&w), ["b"]);
    assert!(
        w.unready()[0].1.starts_with("Untrusted: "),
        "{:?}",
        w.unready()
    );
    let r = w.reported("a").unwrap();
    assert_eq!(
        (r["active"].clone(), r["reason"].clone()),
        (json!(false), json!("Untrusted"))
    );

    // Trusted again: pulled and verified again.
    w.fx.registry_down.store(false, Ordering::SeqCst);
    w.trust(1);
    assert!(w.agent.reload_keys());
    w.reconcile().await;
    assert_eq!(names(&w), ["a", "b"]);
}

#[tokio::test(start_paused = true)]
async fn a_rollout_is_pulled_compiled_and_probed_before_it_runs_and_reported_once_it_does() {
    let mut w = World::new(SignaturePolicy::Off);
    let v1 = w.fx.push("h", b"v1", None);
    let other = w.fx.push("o", b"o", None);
    w.hook("h", &v1, json!({"order": 5}));
    w.hook("other", &other, json!({"order": 1}));
    w.reconcile().await;
    let order: Vec<String> = w.running().into_iter().map(|(n, _)| n).collect();
    assert_eq!(order, ["other", "h"], "by order, then name");

    let v2 = w.fx.push("h", b"v2", None);
    w.hook("h", &v2, json!({"order": -1}));
    let before = w.fx.calls().len();
    w.reconcile().await;
    let rollout: Vec<(Effect, Vec<(String, String)>)> = w.fx.calls()[before..]
        .iter()
        .map(|(_, e, set)| (e.clone(), set.clone()))
        .collect();
    let old = vec![
        ("other".to_string(), sha(b"o")),
        ("h".to_string(), sha(b"v1")),
    ];
    let new = vec![
        ("h".to_string(), sha(b"v2")),
        ("other".to_string(), sha(b"o")),
    ];
    let steps: Vec<&Effect> = rollout.iter().map(|(e, _)| e).collect();
    assert!(
        matches!(
            steps[..],
            [
                Effect::Pull(_),
                Effect::Compile(_),
                Effect::Probe { .. },
                Effect::Report(_)
            ]
        ),
        "{steps:?}"
    );
    assert_eq!(rollout[0].0, Effect::Pull(v2.clone()));
    assert_eq!(rollout[1].0, Effect::Compile(sha(b"v2")));
    // The old set runs while the new version is pulled, compiled and probed; the new one runs (in its new
    // place) before the report says it is active.
    for (step, set) in &rollout[..3] {
        assert_eq!(*set, old, "during {step:?}");
    }
    assert_eq!(rollout[3].1, new);
    assert_eq!(w.reported("h").unwrap()["digest"], digest(&v2));

    // A version that fails its probe never runs: v2 stays.
    let v3 = w.fx.push("h", b"v3", None);
    let failure = Failure::new(Reason::FailedProbe, "trapped");
    w.fx.probe_fails.lock().unwrap().insert(sha(b"v3"), failure);
    w.hook("h", &v3, json!({"order": -1}));
    w.reconcile().await;
    assert_eq!(w.running(), new);
    let r = w.reported("h").unwrap();
    assert_eq!(
        (r["reason"].clone(), r["digest"].clone()),
        (json!("FailedProbe"), json!(digest(&v2)))
    );
}

#[tokio::test(start_paused = true)]
async fn a_failing_pull_is_retried_with_doubling_jittered_delays_up_to_five_minutes() {
    let mut w = World::new(SignaturePolicy::Off);
    let m = w.fx.push("m", b"m", None);
    w.hook("m", &m, json!({}));
    w.fx.registry_down.store(true, Ordering::SeqCst);
    let start = Instant::now();
    // The controller runs the reconcile again when it says a retry is due; other reconciles (a label change
    // of the Node, say) come in between and pull nothing.
    while Instant::now() - start < Duration::from_secs(1800) {
        let next = w.reconcile().await.expect("a retry is due");
        tokio::time::sleep((next - Instant::now()) / 2).await;
        w.labels
            .insert("poke".into(), format!("{:?}", Instant::now() - start));
        w.reconcile().await;
        tokio::time::sleep_until(next).await;
    }
    let pulls = w.fx.pulls_of(&m);
    let gaps: Vec<Duration> = pulls.windows(2).map(|p| p[1] - p[0]).collect();
    assert!(gaps.len() >= 10, "{gaps:?}");
    for (i, gap) in gaps.iter().enumerate() {
        let nominal = Duration::from_secs(1 << i.min(9)).min(Duration::from_secs(300));
        assert!(
            *gap >= nominal.mul_f64(0.75) && *gap <= nominal.mul_f64(1.25),
            "retry {i}: {gap:?} for {nominal:?} ({gaps:?})"
        );
    }

    // Back: pulled at the next retry. A later failure of the same module starts again at a second.
    w.fx.registry_down.store(false, Ordering::SeqCst);
    assert_eq!(w.reconcile().await, None, "pulled: nothing left to retry");
    assert_eq!(w.running().len(), 1);
    w.fx.registry_down.store(true, Ordering::SeqCst);
    w.lose_pulled_modules();
    let now = Instant::now();
    let next = w.reconcile().await.unwrap();
    assert!(
        next - now <= Duration::from_millis(1250),
        "{:?}",
        next - now
    );
}
