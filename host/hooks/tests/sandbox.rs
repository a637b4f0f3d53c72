//! The hook runtime against real components from `guests/` (built by `guests/build.sh`): the example
//! hooks work, every hostile guest is contained, faults name the hook, `Ignore` skips, the cache is
//! used and distrusted when it should be.

use plexus_core::spec::Pod;
use plexus_hooks::{
    ArtifactSource, FailurePolicy, Fault, HookError, HookKind, HookSpec, Hooks, LoadError,
    PolicyOutcome,
};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn guests_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PLEXUS_GUESTS_DIR") {
        return PathBuf::from(dir);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("guests")
}

fn guest(name: &str) -> PathBuf {
    let path = guests_dir().join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "guest component {} is missing: build the guests first with `guests/build.sh` \
         (from the repository root)",
        path.display()
    );
    path
}

/// The builds of an example hook that answer alike: the Rust guest and its Python build (`guests/python`).
fn builds(name: &str) -> [String; 2] {
    [name.to_string(), format!("py-{name}")]
}

fn spec(name: &str, kind: HookKind, guest_name: &str) -> HookSpec {
    HookSpec::new(name, kind, guest(guest_name))
}

fn pod() -> Pod {
    Pod {
        namespace: "team-a".into(),
        name: "web".into(),
        uid: Some("uid-1".into()),
        labels: [("app".to_string(), "web".to_string())].into(),
        annotations: Default::default(),
        ..Default::default()
    }
}

fn entries() -> Vec<Value> {
    vec![
        json!({"name": "kube-system/pod-net", "interface": "eth0", "ips": ["10.0.0.2"], "default": true}),
        json!({"name": "team-a/lab", "interface": "net1", "default": false}),
    ]
}

fn load(specs: &[HookSpec]) -> Hooks {
    Hooks::load_uncached(specs).expect("hooks load")
}

fn fault_of(err: HookError) -> (String, Fault) {
    match err {
        HookError::Fault { hook, fault, .. } => (hook, fault),
        other => panic!("expected a fault, got {other}"),
    }
}

#[test]
fn namespace_isolation_admits_own_and_global_namespaces_and_denies_others() {
    for build in builds("namespace-isolation") {
        // One cache for both loads of the build: its second load does not compile again.
        let cache = tempfile::tempdir().unwrap();
        let load = |s: HookSpec| Hooks::load(&[s], cache.path()).expect("hooks load");
        let hooks = load(spec("ns-iso", HookKind::Policy, &build));
        let own = vec![
            json!({"name": "lab", "namespace": "team-a"}),
            json!({"name": "shared", "namespace": "default", "org.example.x": 1}),
        ];
        assert_eq!(
            hooks.policy(&pod(), own.clone()).unwrap(),
            PolicyOutcome::Admit(own),
            "{build}"
        );
        let other = vec![json!({"name": "secret", "namespace": "team-b"})];
        match hooks.policy(&pod(), other).unwrap() {
            PolicyOutcome::Deny { hook, reason } => {
                assert_eq!(hook, "ns-iso");
                assert_eq!(
                    reason,
                    "pod team-a/web may not select network team-b/secret: only its own namespace and default \
                     are allowed",
                    "{build}"
                );
            }
            admit => panic!("{build}: expected a deny, got {admit:?}"),
        }
        // An unknown setting is a fault of the hook, not a decision, naming the setting.
        let mut typo = spec("ns-iso", HookKind::Policy, &build);
        typo.settings = Some(json!({"globalNamespace": ["infra"]}));
        let err = load(typo).policy(&pod(), vec![]).unwrap_err();
        let (hook, fault) = fault_of(err);
        assert_eq!(hook, "ns-iso");
        assert_eq!(
            fault.to_string(),
            "failed: invalid settings: unknown field `globalNamespace`, expected `globalNamespaces`",
            "{build}"
        );
    }
}

#[test]
fn network_templates_fills_nads_without_config_only() {
    let mut s = spec("templates", HookKind::Resolver, "network-templates");
    s.settings = Some(
        json!({"templates": {"lab": {"cniVersion": "1.0.0", "type": "bridge", "bridge": "lab0"}}}),
    );
    let hooks = load(&[s]);
    let sel = json!({"name": "lab", "namespace": "team-a"});
    let nad = json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                     "metadata": {"name": "lab", "namespace": "team-a"}});
    let out = hooks.resolve(&pod(), &sel, Some(&nad), None).unwrap();
    assert_eq!(out.unwrap()["bridge"], "lab0");
    let existing = json!({"cniVersion": "1.0.0", "type": "macvlan"});
    assert_eq!(
        hooks
            .resolve(&pod(), &sel, Some(&nad), Some(&existing))
            .unwrap(),
        None
    );
    let other = json!({"name": "other", "namespace": "team-a"});
    assert_eq!(hooks.resolve(&pod(), &other, None, None).unwrap(), None);
}

#[test]
fn status_labels_adds_pod_labels_to_every_entry() {
    for build in builds("status-labels") {
        let mut s = spec("labels", HookKind::Status, &build);
        s.settings = Some(json!({"labels": ["app", "tier"]}));
        let hooks = load(&[s]);
        let mut given = entries();
        // What an earlier hook left under the key is merged with, not replaced.
        given[1]["io.plexus.pod-labels"] = json!({"zone": "a", "app": "old"});
        let out = hooks.status(&pod(), given).unwrap();
        assert_eq!(out.len(), 2, "{build}");
        assert_eq!(
            out[0]["io.plexus.pod-labels"],
            json!({"app": "web"}),
            "{build}"
        );
        assert_eq!(
            out[1]["io.plexus.pod-labels"],
            json!({"app": "web", "zone": "a"}),
            "{build}"
        );
        assert_eq!(out[0]["ips"], json!(["10.0.0.2"]), "{build}");
        assert_eq!(out[0]["default"], true, "{build}");
        assert_eq!(out[1]["default"], false, "{build}");
    }
}

/// A hostile guest, by what it does (`loop`, `bomb`, `flood`): the spec of hook `name` of `kind`, and how its hooks
/// are loaded. The same tests hold for each language's build.
struct Hostile {
    spec: fn(&str, HookKind, &str) -> HookSpec,
    load: fn(&[HookSpec]) -> Hooks,
}

/// The Rust guests, one per misbehaviour, each compiled anew.
const RUST: Hostile = Hostile {
    spec: rust_hostile,
    load,
};

/// The TypeScript guest, whose settings pick the misbehaviour, through one cache.
const TYPESCRIPT: Hostile = Hostile {
    spec: ts_hostile,
    load: load_ts,
};

fn rust_hostile(name: &str, kind: HookKind, mode: &str) -> HookSpec {
    let guest = match mode {
        "loop" => "test-endless-loop",
        "bomb" => "test-memory-bomb",
        "flood" => "test-log-flood",
        other => panic!("no Rust guest does {other}"),
    };
    spec(name, kind, guest)
}

fn endless_loop_times_out_within_budget(h: &Hostile) {
    let mut s = (h.spec)("loop", HookKind::Policy, "loop");
    s.timeout_ms = Some(50);
    let hooks = (h.load)(&[s, spec("ns-iso", HookKind::Policy, "namespace-isolation")]);
    let start = Instant::now();
    let err = hooks
        .policy(&pod(), vec![json!({"name": "a", "namespace": "team-a"})])
        .unwrap_err();
    let elapsed = start.elapsed();
    assert_eq!(
        err.to_string(),
        "hook \"loop\" (policy): timed out after 50 ms"
    );
    assert!(elapsed >= Duration::from_millis(50), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(50 * 20), "{elapsed:?}");
    // The process survives and the same Hooks keeps working.
    let again = hooks.policy(&pod(), vec![]).unwrap_err();
    assert_eq!(fault_of(again).1, Fault::Timeout(50));
}

fn endless_loop_in_kinds_times_out(h: &Hostile, kinds: &[HookKind]) {
    let specs: Vec<HookSpec> = kinds
        .iter()
        .map(|k| {
            let mut s = (h.spec)(&format!("loop-{k}"), *k, "loop");
            s.timeout_ms = Some(20);
            s
        })
        .collect();
    let hooks = (h.load)(&specs);
    let sel = json!({"name": "a", "namespace": "team-a"});
    let e = hooks.resolve(&pod(), &sel, None, None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "hook \"loop-resolver\" (resolver): timed out after 20 ms"
    );
    let e = hooks.status(&pod(), entries()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "hook \"loop-status\" (status): timed out after 20 ms"
    );
}

fn memory_bomb_hits_the_limit(h: &Hostile) {
    let mut s = (h.spec)("bomb", HookKind::Policy, "bomb");
    s.memory_limit_mib = Some(16);
    s.timeout_ms = Some(5_000);
    let hooks = (h.load)(&[s]);
    let err = hooks.policy(&pod(), vec![]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "hook \"bomb\" (policy): exceeded its memory limit of 16 MiB"
    );
}

fn log_flood_is_capped(h: &Hostile) {
    let mut s = (h.spec)("flood", HookKind::Policy, "flood");
    s.timeout_ms = Some(10_000);
    let hooks = (h.load)(&[s]);
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .finish();
    let out = tracing::subscriber::with_default(subscriber, || hooks.policy(&pod(), vec![]));
    assert_eq!(out.unwrap(), PolicyOutcome::Admit(vec![]));
    let logged = capture.0.lock().unwrap();
    let text = String::from_utf8_lossy(&logged);
    // The guest wrote ~8 MiB to stdout+stderr and ~2 MiB through the log import.
    assert!(logged.len() < 1024 * 1024, "{} bytes logged", logged.len());
    assert!(
        text.contains("flood line 0"),
        "log import lines reach the log"
    );
    assert!(
        text.contains("guest output truncated"),
        "truncation is reported"
    );
    assert!(
        text.contains("guest log truncated"),
        "log truncation is reported"
    );
}

#[test]
fn endless_loop_times_out_within_budget_and_names_the_hook() {
    endless_loop_times_out_within_budget(&RUST);
}

#[test]
fn endless_loop_in_every_kind_times_out() {
    endless_loop_in_kinds_times_out(&RUST, &HookKind::ALL);
}

#[test]
fn memory_bomb_hits_the_memory_limit() {
    memory_bomb_hits_the_limit(&RUST);
}

#[test]
fn trap_is_a_fault_with_the_guest_panic_message() {
    let hooks = load(&[spec("trap", HookKind::Policy, "test-trap")]);
    let (hook, fault) = fault_of(hooks.policy(&pod(), vec![]).unwrap_err());
    assert_eq!(hook, "trap");
    match fault {
        Fault::Trap(msg) => assert!(msg.contains("deliberately panicked for pod web"), "{msg}"),
        other => panic!("expected a trap, got {other:?}"),
    }
}

#[test]
fn host_files_env_and_args_are_not_visible() {
    for path in ["/etc/passwd", "/", "."] {
        let mut s = spec("reader", HookKind::Policy, "test-read-host-file");
        s.settings = Some(json!({"path": path}));
        let hooks = load(&[s]);
        match hooks.policy(&pod(), vec![]).unwrap() {
            PolicyOutcome::Deny { reason, .. } => {
                assert!(reason.contains("file: denied"), "{path}: {reason}");
                assert!(reason.contains("dir: denied"), "{path}: {reason}");
                assert!(reason.contains("env: 0 vars; args: 0"), "{path}: {reason}");
            }
            other => panic!("the probe always reports by denying, got {other:?}"),
        }
    }
}

/// Collects everything the hooks log, to measure it.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn log_flood_is_capped_and_the_call_completes() {
    log_flood_is_capped(&RUST);
}

#[test]
fn bad_output_of_every_kind_is_a_fault() {
    let hooks = load(&[
        spec("bad-p", HookKind::Policy, "test-bad-output"),
        spec("bad-r", HookKind::Resolver, "test-bad-output"),
        spec("bad-s", HookKind::Status, "test-bad-output"),
    ]);
    let sel = json!({"name": "a", "namespace": "team-a"});
    let (hook, fault) = fault_of(hooks.policy(&pod(), vec![sel.clone()]).unwrap_err());
    assert_eq!(hook, "bad-p");
    assert!(
        matches!(&fault, Fault::InvalidOutput(m) if m.contains("\"color\" is reserved")),
        "{fault}"
    );
    let (hook, fault) = fault_of(hooks.resolve(&pod(), &sel, None, None).unwrap_err());
    assert_eq!(hook, "bad-r");
    assert!(
        matches!(&fault, Fault::InvalidOutput(m) if m.contains("neither \"type\"")),
        "{fault}"
    );
    let (hook, fault) = fault_of(hooks.status(&pod(), entries()).unwrap_err());
    assert_eq!(hook, "bad-s");
    assert!(
        matches!(&fault, Fault::InvalidOutput(m) if m.contains("owner")),
        "{fault}"
    );
}

#[test]
fn ignore_skips_faulting_hooks_and_keeps_the_chain_going() {
    let ignore = |mut s: HookSpec| {
        s.failure_policy = FailurePolicy::Ignore;
        s.timeout_ms = Some(20);
        s
    };
    let hooks = load(&[
        ignore(spec("loop", HookKind::Policy, "test-endless-loop")),
        ignore(spec("trap", HookKind::Policy, "test-trap")),
        ignore(spec("bad", HookKind::Policy, "test-bad-output")),
        spec("ns-iso", HookKind::Policy, "namespace-isolation"),
        ignore(spec("bad-s", HookKind::Status, "test-bad-output")),
    ]);
    let sel = vec![json!({"name": "a", "namespace": "team-b"})];
    match hooks.policy(&pod(), sel).unwrap() {
        PolicyOutcome::Deny { hook, .. } => assert_eq!(hook, "ns-iso"),
        other => panic!("the hook after the skipped ones decides, got {other:?}"),
    }
    assert_eq!(hooks.status(&pod(), entries()).unwrap(), entries());
}

#[test]
fn hooks_run_in_configured_order_across_kinds() {
    let mut templates = spec("templates", HookKind::Resolver, "network-templates");
    templates.settings = Some(json!({"templates": {"lab": {"type": "bridge"}}}));
    let mut labels = spec("labels", HookKind::Status, "status-labels");
    labels.settings = Some(json!({"labels": ["app"]}));
    let hooks = load(&[
        spec("ns-iso", HookKind::Policy, "namespace-isolation"),
        templates,
        labels,
    ]);
    let sel = json!({"name": "lab", "namespace": "team-a"});
    assert!(matches!(
        hooks.policy(&pod(), vec![sel.clone()]).unwrap(),
        PolicyOutcome::Admit(_)
    ));
    assert_eq!(
        hooks.resolve(&pod(), &sel, None, None).unwrap(),
        Some(json!({"type": "bridge"}))
    );
    assert!(hooks.status(&pod(), entries()).unwrap()[1]
        .get("io.plexus.pod-labels")
        .is_some());
}

#[test]
fn cache_is_used_on_second_load_and_distrusted_when_writable() {
    let dir = tempfile::tempdir().unwrap();
    let specs = [spec("ns-iso", HookKind::Policy, "namespace-isolation")];
    let first = Hooks::load(&specs, dir.path()).unwrap();
    assert_eq!(first.artifacts()[0].source, ArtifactSource::Compiled);
    let second = Hooks::load(&specs, dir.path()).unwrap();
    assert_eq!(second.artifacts()[0].source, ArtifactSource::Cached);
    // A cached component still works.
    assert!(matches!(
        second.policy(&pod(), vec![]).unwrap(),
        PolicyOutcome::Admit(_)
    ));

    let artifact = plexus_hooks::artifact_path(&guest("namespace-isolation"), dir.path()).unwrap();
    assert!(artifact.is_file(), "{}", artifact.display());
    let mode = std::fs::metadata(&artifact).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "artifact is private, mode {mode:o}");

    std::fs::set_permissions(&artifact, std::fs::Permissions::from_mode(0o666)).unwrap();
    let third = Hooks::load(&specs, dir.path()).unwrap();
    match &third.artifacts()[0].source {
        ArtifactSource::Recompiled(why) => assert!(why.contains("writable"), "{why}"),
        other => panic!("a world-writable artifact must be refused, got {other:?}"),
    }
    // Rewritten safely: the next load uses it again.
    let fourth = Hooks::load(&specs, dir.path()).unwrap();
    assert_eq!(fourth.artifacts()[0].source, ArtifactSource::Cached);

    let mut bytes = std::fs::read(&artifact).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&artifact, &bytes).unwrap();
    let fifth = Hooks::load(&specs, dir.path()).unwrap();
    match &fifth.artifacts()[0].source {
        ArtifactSource::Recompiled(why) => assert!(why.contains("length mismatch"), "{why}"),
        other => panic!("a tampered artifact must be refused, got {other:?}"),
    }
    assert!(matches!(
        fifth.policy(&pod(), vec![]).unwrap(),
        PolicyOutcome::Admit(_)
    ));
}

#[test]
fn the_digest_index_is_used_only_for_unchanged_trusted_entries() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.wasm"), dir.path().join("b.wasm"));
    std::fs::copy(guest("namespace-isolation"), &a).unwrap();
    std::fs::copy(guest("test-policy-only"), &b).unwrap();
    let specs = |m: &PathBuf| [HookSpec::new("h", HookKind::Policy, m)];
    let index_entries = || -> Vec<PathBuf> {
        std::fs::read_dir(dir.path().join("hooks"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "module"))
            .collect()
    };
    // A file changed a moment ago is not indexed (its times may not move on the next change).
    let fresh = Hooks::load(&specs(&a), dir.path()).unwrap();
    assert_eq!(fresh.artifacts()[0].source, ArtifactSource::Compiled);
    assert!(index_entries().is_empty());
    std::thread::sleep(Duration::from_millis(2100));
    let sha_b = Hooks::load(&specs(&b), dir.path()).unwrap().artifacts()[0]
        .sha256
        .clone();
    let first = Hooks::load(&specs(&a), dir.path()).unwrap();
    assert_eq!(first.artifacts()[0].source, ArtifactSource::Cached);
    let sha_a = first.artifacts()[0].sha256.clone();
    assert_eq!(index_entries().len(), 2, "both files indexed now");
    // The index is believed while the file is unchanged...
    let second = Hooks::load(&specs(&a), dir.path()).unwrap();
    assert_eq!(second.artifacts()[0].sha256, sha_a);
    assert_eq!(second.artifacts()[0].source, ArtifactSource::Cached);

    // (It is the index that answers: a trusted entry claiming b's digest for a is believed, the file is not
    // read.)
    let entry_a = index_entries()
        .into_iter()
        .find(|p| std::fs::read_to_string(p).unwrap().contains(&sha_a))
        .expect("a's entry");
    let text = std::fs::read_to_string(&entry_a).unwrap();
    std::fs::write(&entry_a, text.replace(&sha_a, &sha_b)).unwrap();
    std::fs::set_permissions(&entry_a, std::fs::Permissions::from_mode(0o600)).unwrap();
    let lied_to = Hooks::load(&specs(&a), dir.path()).unwrap();
    assert_eq!(lied_to.artifacts()[0].sha256, sha_b);
    // ...but an entry anyone could have written is not.
    std::fs::set_permissions(&entry_a, std::fs::Permissions::from_mode(0o666)).unwrap();
    let third = Hooks::load(&specs(&a), dir.path()).unwrap();
    assert_eq!(third.artifacts()[0].sha256, sha_a);

    // Same path, other contents: hashed again, compiled anew, and a pin is checked against the real digest.
    std::fs::write(&a, std::fs::read(guest("test-trap")).unwrap()).unwrap();
    let fourth = Hooks::load(&specs(&a), dir.path()).unwrap();
    assert_eq!(
        fourth.artifacts()[0].sha256,
        plexus_hooks::inspect(&a).unwrap().sha256
    );
    assert_eq!(fourth.artifacts()[0].source, ArtifactSource::Compiled);
    let mut pinned = HookSpec::new("h", HookKind::Policy, &a);
    pinned.sha256 = Some(sha_a);
    match Hooks::load(&[pinned], dir.path()) {
        Err(HookError::Load {
            error: LoadError::Sha256Mismatch { .. },
            ..
        }) => {}
        other => panic!("expected a sha256 mismatch, got {other:?}"),
    }
}

#[test]
fn a_truncated_artifact_is_refused_and_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let specs = [spec("ns-iso", HookKind::Policy, "namespace-isolation")];
    Hooks::load(&specs, dir.path()).unwrap();
    let artifact = plexus_hooks::artifact_path(&guest("namespace-isolation"), dir.path()).unwrap();
    let bytes = std::fs::read(&artifact).unwrap();
    for keep in [bytes.len() / 2, 10] {
        std::fs::write(&artifact, &bytes[..keep]).unwrap();
        let hooks = Hooks::load(&specs, dir.path()).unwrap();
        match &hooks.artifacts()[0].source {
            ArtifactSource::Recompiled(why) => assert!(
                why.contains("not a plexus hook artifact") || why.contains("length"),
                "{why}"
            ),
            other => panic!("a truncated artifact must be refused, got {other:?}"),
        }
        assert!(matches!(
            hooks.policy(&pod(), vec![]).unwrap(),
            PolicyOutcome::Admit(_)
        ));
    }
}

#[test]
fn writable_cache_directory_is_not_used() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("hooks")).unwrap();
    std::fs::set_permissions(
        dir.path().join("hooks"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let specs = [spec("ns-iso", HookKind::Policy, "namespace-isolation")];
    let hooks = Hooks::load(&specs, dir.path()).unwrap();
    match &hooks.artifacts()[0].source {
        ArtifactSource::CompiledUncached(why) => assert!(why.contains("writable"), "{why}"),
        other => panic!("expected no cache use, got {other:?}"),
    }
    assert_eq!(
        std::fs::read_dir(dir.path().join("hooks")).unwrap().count(),
        0
    );

    // A writable base directory is as bad: whoever can write it can swap `hooks`.
    let base = tempfile::tempdir().unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let hooks = Hooks::load(&specs, base.path()).unwrap();
    assert!(
        matches!(&hooks.artifacts()[0].source, ArtifactSource::CompiledUncached(why) if why.contains("writable")),
        "{:?}",
        hooks.artifacts()[0].source
    );
}

#[test]
fn what_hook_compile_caches_is_what_an_add_loads() {
    // `plexus hook compile` (install time) compiles in parallel, an ADD does not: the artifacts must be the
    // same ones.
    let dir = tempfile::tempdir().unwrap();
    let compiled = plexus_hooks::compile(&guest("status-labels"), dir.path()).unwrap();
    assert_eq!(compiled.source, ArtifactSource::Compiled);
    let hooks = Hooks::load(
        &[spec("labels", HookKind::Status, "status-labels")],
        dir.path(),
    )
    .unwrap();
    assert_eq!(hooks.artifacts()[0].source, ArtifactSource::Cached);
    assert_eq!(hooks.artifacts()[0].sha256, compiled.sha256);
}

#[test]
fn one_component_serving_several_hooks_is_compiled_once() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = Hooks::load(
        &[
            spec("bad-p", HookKind::Policy, "test-bad-output"),
            spec("bad-r", HookKind::Resolver, "test-bad-output"),
        ],
        dir.path(),
    )
    .unwrap();
    assert_eq!(hooks.artifacts().len(), 1);
}

#[test]
fn sha256_pin_mismatch_fails_and_a_matching_pin_loads() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec("ns-iso", HookKind::Policy, "namespace-isolation");
    s.sha256 = Some("00".repeat(32));
    let err = Hooks::load(&[s.clone()], dir.path()).unwrap_err();
    assert!(
        err.to_string().starts_with("hook \"ns-iso\" (policy): "),
        "{err}"
    );
    assert!(matches!(
        err,
        HookError::Load {
            error: LoadError::Sha256Mismatch { .. },
            ..
        }
    ));
    let inspected = plexus_hooks::inspect(&s.module).unwrap();
    s.sha256 = Some(inspected.sha256.to_uppercase());
    Hooks::load(&[s], dir.path()).unwrap();
}

#[test]
fn missing_or_invalid_modules_name_the_hook() {
    let dir = tempfile::tempdir().unwrap();
    let missing = HookSpec::new("gone", HookKind::Status, dir.path().join("nope.wasm"));
    let err = Hooks::load_uncached(&[missing]).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("hook \"gone\" (status): cannot read"),
        "{err}"
    );
    assert!(
        err.to_string()
            .ends_with("nope.wasm: No such file or directory (os error 2)"),
        "{err}"
    );
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"\0asm\x01\0\0\0garbage").unwrap();
    let err = Hooks::load_uncached(&[HookSpec::new("junk", HookKind::Policy, &junk)]).unwrap_err();
    assert!(
        err.to_string().contains("is not a valid component"),
        "{err}"
    );
}

#[test]
fn inspect_reports_exports_and_wit_version() {
    let i = plexus_hooks::inspect(&guest("status-labels")).unwrap();
    // Built with the SDK's `export!(status: ...)`: it exports all three interfaces, and declares status alone.
    assert_eq!(i.kinds, vec![HookKind::Status]);
    assert!(i.declares_kinds);
    for kind in HookKind::ALL {
        assert!(
            i.exports.iter().any(|e| kind.exported_as(e)),
            "{kind}: {:?}",
            i.exports
        );
    }
    assert_eq!(i.wit_versions, vec![plexus_hooks::WIT_VERSION.to_string()]);
    assert!(
        i.imports
            .iter()
            .any(|n| *n == format!("plexus:hooks/host@{}", plexus_hooks::WIT_VERSION)),
        "{:?}",
        i.imports
    );
    assert_eq!(i.sha256.len(), 64);
    assert_eq!(
        i.size,
        std::fs::metadata(guest("status-labels")).unwrap().len()
    );
}

#[test]
fn selections_are_read_by_the_specs_reader_before_any_hook_runs() {
    let hooks = load(&[spec("ns-iso", HookKind::Policy, "namespace-isolation")]);
    let bad = vec![
        json!({"name": "a", "namespace": "team-a"}),
        json!({"name": "a", "color": "blue"}),
    ];
    match hooks.policy(&pod(), bad).unwrap_err() {
        HookError::Input(m) => assert!(m.contains("element 1") && m.contains("color"), "{m}"),
        other => panic!("expected the caller's mistake, got {other}"),
    }
    assert!(hooks.calls().is_empty(), "no hook ran: {:?}", hooks.calls());
    // A missing namespace is the pod's, as in the annotation, and the admitted element says so.
    assert_eq!(
        hooks.policy(&pod(), vec![json!({"name": "lab"})]).unwrap(),
        PolicyOutcome::Admit(vec![json!({"name": "lab", "namespace": "team-a"})])
    );
}

#[test]
fn no_hooks_pass_everything_through() {
    let hooks = Hooks::load_uncached(&[]).unwrap();
    assert!(hooks.is_empty());
    let sel = vec![json!({"name": "a", "namespace": "b"})];
    assert_eq!(
        hooks.policy(&pod(), sel.clone()).unwrap(),
        PolicyOutcome::Admit(sel)
    );
    assert_eq!(
        hooks
            .resolve(&pod(), &json!({"name": "a"}), None, None)
            .unwrap(),
        None
    );
    assert_eq!(hooks.status(&pod(), entries()).unwrap(), entries());
}

#[test]
fn a_component_exporting_a_subset_loads_for_its_kinds_only() {
    let module = guest("test-policy-only");
    let i = plexus_hooks::inspect(&module).unwrap();
    assert_eq!(i.kinds, vec![HookKind::Policy]);
    // Built against the contract's 0.1.0 (before host.pod-running): this host runs it.
    assert_eq!(i.wit_versions, vec!["0.1.0".to_string()]);
    assert_ne!(plexus_hooks::WIT_VERSION, "0.1.0");

    let mut s = HookSpec::new("only", HookKind::Policy, &module);
    s.settings = Some(json!({"k": 1}));
    match load(&[s])
        .policy(&pod(), vec![json!({"name": "a", "namespace": "team-a"})])
        .unwrap()
    {
        PolicyOutcome::Deny { hook, reason } => {
            assert_eq!(hook, "only");
            assert_eq!(
                reason,
                "policy-only saw 1 selections of team-a/web with settings {\"k\":1}"
            );
        }
        other => panic!("expected the guest's deny, got {other:?}"),
    }

    let err =
        Hooks::load_uncached(&[HookSpec::new("only", HookKind::Status, &module)]).unwrap_err();
    assert!(
        matches!(&err, HookError::Load { error: LoadError::MissingExport { interface, .. }, .. }
            if *interface == format!("plexus:hooks/status@{}", plexus_hooks::WIT_VERSION)),
        "{err}"
    );
    assert!(
        err.to_string().starts_with("hook \"only\" (status): "),
        "{err}"
    );
}

#[test]
fn sleeping_guest_times_out_too() {
    let mut s = spec("sleeper", HookKind::Policy, "test-endless-loop");
    s.timeout_ms = Some(50);
    s.settings = Some(json!({"mode": "sleep"}));
    let hooks = load(&[s]);
    let start = Instant::now();
    let err = hooks.policy(&pod(), vec![]).unwrap_err();
    let elapsed = start.elapsed();
    assert_eq!(
        err.to_string(),
        "hook \"sleeper\" (policy): timed out after 50 ms"
    );
    assert!(elapsed < Duration::from_millis(50 * 20), "{elapsed:?}");
}

#[test]
fn a_hook_is_told_whether_the_pod_is_running() {
    let selections = vec![json!({"name": "start-only-a", "namespace": "team-a"})];
    let mut hooks = load(&[spec("running", HookKind::Policy, "test-pod-running")]);
    // The ADD that makes the sandbox: not running.
    assert_eq!(
        hooks.policy(&pod(), selections.clone()).unwrap(),
        PolicyOutcome::Admit(selections.clone())
    );
    // A change of a running pod's networks.
    hooks.set_pod_running(true);
    match hooks.policy(&pod(), selections).unwrap() {
        PolicyOutcome::Deny { reason, .. } => {
            assert!(reason.contains("team-a/start-only-a"), "{reason}")
        }
        other => panic!("expected the guest's deny, got {other:?}"),
    }
}

#[test]
fn exports_of_other_patch_versions_serve_and_other_minors_do_not() {
    assert!(HookKind::Policy.exported_as("plexus:hooks/policy@0.1.0"));
    assert!(HookKind::Policy.exported_as(&HookKind::Policy.interface()));
    assert!(HookKind::Policy.exported_as("plexus:hooks/policy@0.1.17"));
    assert!(!HookKind::Policy.exported_as("plexus:hooks/policy@0.2.0"));
    assert!(!HookKind::Policy.exported_as("plexus:hooks/policy@0.10.0"));
    assert!(!HookKind::Policy.exported_as("plexus:hooks/policy@0.1.0-rc1"));
    assert!(!HookKind::Policy.exported_as("plexus:hooks/status@0.1.0"));
    assert!(!HookKind::Policy.exported_as("plexus:hooks/policy"));
}

/// An SDK-built policy hook exports the resolver and status interfaces as pass-throughs; it declares policy alone,
/// and is refused as anything else, whether compiled now or loaded from the cache's artifact (where the CNI plugin,
/// which cannot read the component, finds the declaration).
#[test]
fn an_sdk_hook_is_refused_for_a_kind_it_does_not_declare() {
    let module = guest("namespace-isolation");
    let i = plexus_hooks::inspect(&module).unwrap();
    assert_eq!(i.kinds, vec![HookKind::Policy]);
    assert!(i.declares_kinds);
    // Several kinds named in export! are all declared.
    assert_eq!(
        plexus_hooks::inspect(&guest("test-bad-output"))
            .unwrap()
            .kinds,
        HookKind::ALL.to_vec()
    );
    // A component written against the WIT directly declares nothing: its exports are its kinds.
    assert!(
        !plexus_hooks::inspect(&guest("test-policy-only"))
            .unwrap()
            .declares_kinds
    );

    let refused = |err: HookError| match err {
        HookError::Load {
            error: LoadError::KindNotImplemented { kind, declared, .. },
            ..
        } => (kind, declared),
        other => panic!("expected KindNotImplemented, got {other}"),
    };
    let as_resolver = HookSpec::new("isolation", HookKind::Resolver, &module);
    let err = Hooks::load_uncached(std::slice::from_ref(&as_resolver)).unwrap_err();
    assert!(
        err.to_string()
            .contains("implements policy only, not resolver"),
        "{err}"
    );
    assert_eq!(refused(err), (HookKind::Resolver, vec![HookKind::Policy]));

    let cache = tempfile::tempdir().unwrap();
    // Compiled into the cache as a policy hook (what `plexus hook compile` leaves for the CNI plugin) ...
    let policy = HookSpec::new("isolation", HookKind::Policy, &module);
    let hooks = Hooks::load(std::slice::from_ref(&policy), cache.path()).unwrap();
    assert_eq!(
        hooks.artifacts()[0].source,
        plexus_hooks::ArtifactSource::Compiled
    );
    // ... then loaded from that artifact without its bytes, as another kind: refused all the same.
    let mut cached = HookSpec::new("isolation", HookKind::Status, &module);
    cached.precompiled = true;
    cached.sha256 = Some(i.sha256.clone());
    let err = Hooks::load(std::slice::from_ref(&cached), cache.path()).unwrap_err();
    assert_eq!(refused(err), (HookKind::Status, vec![HookKind::Policy]));
    cached.kind = HookKind::Policy;
    let hooks = Hooks::load(std::slice::from_ref(&cached), cache.path()).unwrap();
    assert_eq!(
        hooks.artifacts()[0].source,
        plexus_hooks::ArtifactSource::Cached
    );
}

/// The hostile guests JavaScript can express, as one TypeScript component (`guests/typescript/test-hostile`) whose
/// settings pick the misbehaviour. Reading host files, the environment or the arguments has no JavaScript API in
/// the engine, so it has no TypeScript variant.
fn ts_hostile(name: &str, kind: HookKind, mode: &str) -> HookSpec {
    let mut s = spec(name, kind, "ts-test-hostile");
    s.settings = Some(json!({ "mode": mode }));
    s
}

/// Loads through one cache shared by the TypeScript tests, one at a time: the first compiles the engine's
/// component (seconds), the others load its artifact.
fn load_ts(specs: &[HookSpec]) -> Hooks {
    static CACHE: Mutex<Option<tempfile::TempDir>> = Mutex::new(None);
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = cache.get_or_insert_with(|| tempfile::tempdir().unwrap());
    Hooks::load(specs, dir.path()).expect("hooks load")
}

#[test]
fn typescript_endless_loop_times_out_within_budget_and_names_the_hook() {
    endless_loop_times_out_within_budget(&TYPESCRIPT);
}

#[test]
fn typescript_endless_loop_in_the_other_kinds_times_out() {
    endless_loop_in_kinds_times_out(&TYPESCRIPT, &[HookKind::Resolver, HookKind::Status]);
}

#[test]
fn typescript_memory_bomb_hits_the_memory_limit() {
    memory_bomb_hits_the_limit(&TYPESCRIPT);
}

#[test]
fn typescript_log_flood_is_capped_and_the_call_completes() {
    log_flood_is_capped(&TYPESCRIPT);
}

/// JavaScript cannot trap on purpose; its uncaught error is the same kind of event, and the host reports it with
/// the guest's message as it does a Rust guest's panic.
#[test]
fn typescript_uncaught_error_is_a_fault_with_the_guest_message() {
    let hooks = load_ts(&[ts_hostile("throw", HookKind::Policy, "throw")]);
    let (hook, fault) = fault_of(hooks.policy(&pod(), vec![]).unwrap_err());
    assert_eq!(hook, "throw");
    match fault {
        Fault::Failed(msg) => assert!(msg.contains("deliberately threw for pod web"), "{msg}"),
        other => panic!("expected a failure, got {other:?}"),
    }
}
