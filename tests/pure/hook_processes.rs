//! The node agent's compile and probe processes, real ones (`plexus hook compile` and the hidden `plexus hook probe`
//! of the built binary), started as the daemon starts them: the example modules (the Python and TypeScript builds
//! too) compile and pass their probe within the default limits, a module that grows to its `memoryLimitMiB` ends with the hook's own limit error
//! within them, and a compile past its memory ends with a message that names the limit and its flag.

use std::path::Path;

use plexus_hooks::{HookKind, HookSpec};
use plexus_node::daemon::compile::{
    compile_apart, probe_apart, Compiled, ProcessLimits, COMPILE_TIMEOUT,
};
use plexus_node::hook_state::{Failure, Reason};
use plexus_tests::plexus::{example_builds, guest_wasm, plexus_bin};

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// A cache directory as the daemon's: root's alone.
fn cache() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn compile(guest: &str, cache: &Path, limits: &ProcessLimits) -> Result<Compiled, String> {
    block_on(compile_apart(
        &plexus_bin(),
        &guest_wasm(guest),
        cache,
        limits,
        COMPILE_TIMEOUT,
    ))
}

/// The entry the agent probes: the compiled artifact of `compiled`, with the hook's memory limit.
fn probe(
    guest: &str,
    kind: HookKind,
    compiled: &Compiled,
    memory_limit_mib: Option<u64>,
    cache: &Path,
) -> Result<(), Failure> {
    let mut entry = HookSpec::new(guest, kind, guest_wasm(guest));
    entry.sha256 = Some(compiled.sha256.clone());
    entry.precompiled = true;
    entry.memory_limit_mib = memory_limit_mib;
    entry.timeout_ms = Some(5_000);
    block_on(probe_apart(
        &plexus_bin(),
        &entry,
        cache,
        &ProcessLimits::default(),
        COMPILE_TIMEOUT,
    ))
    .unwrap_or_else(|why| panic!("{guest}: no verdict: {why}"))
}

#[test]
fn the_example_modules_compile_and_pass_their_probe_within_the_default_limits() {
    let limits = ProcessLimits::default();
    let [isolation, py_isolation] = example_builds("namespace-isolation");
    let [labels, py_labels] = example_builds("status-labels");
    for (guest, kind) in [
        ("pod-prefix", HookKind::Policy),
        (isolation.as_str(), HookKind::Policy),
        ("network-templates", HookKind::Resolver),
        (labels.as_str(), HookKind::Status),
        // The Python builds: an interpreter each, the largest modules a node is expected to compile.
        (py_isolation.as_str(), HookKind::Policy),
        (py_labels.as_str(), HookKind::Status),
        // The TypeScript builds: a JavaScript engine each.
        ("ts-namespace-isolation", HookKind::Policy),
        ("ts-status-labels", HookKind::Status),
    ] {
        let cache = cache();
        let compiled =
            compile(guest, cache.path(), &limits).unwrap_or_else(|e| panic!("{guest}: {e}"));
        assert!(compiled.artifact.exists(), "{guest}: {compiled:?}");
        assert_eq!(
            probe(guest, kind, &compiled, None, cache.path()),
            Ok(()),
            "{guest}"
        );
    }
}

#[test]
fn a_module_that_grows_to_its_memory_limit_is_stopped_by_it_within_the_process_limit() {
    let cache = cache();
    let compiled = compile("test-memory-bomb", cache.path(), &ProcessLimits::default()).unwrap();
    // The largest memoryLimitMiB the defaults admit.
    let largest = ProcessLimits::DEFAULT_MEMORY_MIB - ProcessLimits::RUNTIME_MIB;
    assert_eq!(ProcessLimits::default().admits(Some(largest)), Ok(()));
    let verdict = probe(
        "test-memory-bomb",
        HookKind::Policy,
        &compiled,
        Some(largest),
        cache.path(),
    );
    let failure = verdict.unwrap_err();
    assert_eq!(failure.reason, Reason::FailedProbe, "{failure}");
    assert!(
        failure
            .message
            .contains(&format!("exceeded its memory limit of {largest} MiB")),
        "the hook's own limit, not the process's: {failure}"
    );
}

#[test]
fn a_compile_past_its_memory_says_so_and_names_the_flag() {
    let cache = cache();
    let tight = ProcessLimits {
        memory_mib: 96,
        compile_memory_mib: 8,
        cpu_secs: 60,
    };
    let err = compile("network-templates", cache.path(), &tight).unwrap_err();
    assert!(
        err.starts_with("it ran out of its 8 MiB (plexus daemon --hook-compile-memory-mib)"),
        "{err}"
    );
}
