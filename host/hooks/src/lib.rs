//! WebAssembly hooks: the wasmtime engine, component cache, limits and the deny-by-default sandbox.
//!
//! [`Hooks::load`] compiles (or loads from the cache) the components of the plexus configuration's
//! `hooks` list; [`Hooks::policy`], [`Hooks::resolve`] and [`Hooks::status`] run the hooks of one kind
//! in configured order, each call in a fresh store with an epoch deadline and a memory limit. The WIT
//! contract is `wit/plexus-hooks.wit`; `docs/hooks.md` describes it for hook authors.

mod cache;
mod convert;
pub mod declared;
mod engine;
mod error;
mod sandbox;
mod spec;

pub use cache::{distrust, ArtifactSource, Compile};
pub use error::{Fault, HookError, LoadError};
pub use spec::{FailurePolicy, HookKind, HookSpec, DEFAULT_MEMORY_LIMIT_MIB, DEFAULT_TIMEOUT_MS};

use bindings::exports::plexus::hooks::{policy, resolver, status};
use plexus_core::spec::{Pod, Selection};
use sandbox::{HookInfo, State};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::component::{Component, HasSelf, Instance, InstancePre, Linker};
use wasmtime::{Engine, Store, Trap};

/// The version of the `plexus:hooks` WIT package this host implements.
pub const WIT_VERSION: &str = "0.1.2";

/// Longest deny reason passed on (the rest is cut).
const REASON_CAP: usize = 4096;

#[allow(clippy::all)]
mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "hooks",
    });
}

// The future node daemon shares one `Hooks` between threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Hooks>();
};

/// What the policy hooks decided, about selections in their spec JSON form or (for a host that has parsed
/// them) as core's `Selection`s.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyOutcome<T = Value> {
    /// Go ahead with these selections (the input, or a hook's rewrite).
    Admit(Vec<T>),
    /// A hook refused the pod; `reason` is its message for the CNI error.
    Deny { hook: String, reason: String },
}

/// How a hook's component was made ready by [`Hooks::load`].
#[derive(Debug, Clone)]
pub struct Artifact {
    pub hook: String,
    pub module: PathBuf,
    pub sha256: String,
    pub source: ArtifactSource,
    /// Time spent reading, hashing and compiling or deserializing.
    pub elapsed: Duration,
}

/// What `plexus hook inspect` shows about a component file.
#[derive(Debug, Clone)]
pub struct Inspection {
    pub path: PathBuf,
    pub size: u64,
    pub sha256: String,
    /// Every export and import of the component, by name.
    pub exports: Vec<String>,
    pub imports: Vec<String>,
    /// The hook kinds it serves: its `plexus:hooks/<kind>` exports this host understands, and of those only the
    /// ones it declares when it declares any ([`declared`]).
    pub kinds: Vec<HookKind>,
    /// Whether it declares its kinds (the SDK's components do); without a declaration every export serves.
    pub declares_kinds: bool,
    /// Versions of the `plexus:hooks` package it was built against.
    pub wit_versions: Vec<String>,
}

enum Exports {
    Policy(policy::GuestIndices),
    Resolver(resolver::GuestIndices),
    Status(status::GuestIndices),
    /// Selected but not ready (see [`HookSpec::unready`]): every call fails with this reason.
    Unready(String),
}

struct LoadedHook {
    name: String,
    kind: HookKind,
    /// The namespaces whose pods it sees (`None`: all).
    namespaces: Option<Vec<String>>,
    failure_policy: FailurePolicy,
    timeout_ms: u64,
    memory_mib: u64,
    info: Arc<HookInfo>,
    /// `None` for an unready hook: it has no component.
    pre: Option<InstancePre<State>>,
    exports: Exports,
}

struct Runtime {
    engine: Engine,
    ticker: engine::Ticker,
}

/// The loaded hooks of one plexus configuration.
pub struct Hooks {
    hooks: Vec<LoadedHook>,
    artifacts: Vec<Artifact>,
    runtime: Option<Runtime>,
    /// Every call made, in order, with its outcome (for the node daemon's metrics).
    calls: std::sync::Mutex<Vec<HookCall>>,
    /// What `host.pod-running` answers (see [`Hooks::set_pod_running`]).
    pod_running: bool,
}

/// The claim devices selections will use, by the network's (namespace, name): what `host.selection-device`
/// answers.
pub type SelectionDevices =
    std::collections::BTreeMap<(String, String), plexus_core::spec::dra::ClaimDevice>;

/// One hook call and how it ended: `allow` (admitted, rewrote, resolved or shaped), `deny` (a policy hook
/// refused the selections), `timeout` (cut off at its deadline) or `error` (any other fault, whatever the
/// failurePolicy made of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookCall {
    pub hook: String,
    pub kind: HookKind,
    pub outcome: &'static str,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("artifacts", &self.artifacts)
            .finish()
    }
}

fn read_module(path: &Path) -> Result<(Vec<u8>, String), LoadError> {
    let bytes = std::fs::read(path).map_err(|error| LoadError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    let sha = cache::sha256_hex(&bytes);
    Ok((bytes, sha))
}

/// The sha256 of a component file, from the cache's index when the file is unchanged (then without its bytes),
/// else read and hashed (and recorded in the index when the file did not change meanwhile).
fn module_digest(
    path: &Path,
    cache: cache::CacheUse<'_>,
) -> Result<(String, Option<Vec<u8>>), LoadError> {
    let cache::CacheUse::Dir(dir) = cache else {
        let (bytes, sha) = read_module(path)?;
        return Ok((sha, Some(bytes)));
    };
    let read_err = |error| LoadError::Read {
        path: path.to_path_buf(),
        error,
    };
    let before = cache::ModuleStat::of(path).map_err(read_err)?;
    if let Some(sha) = cache::indexed_sha256(dir, path, &before) {
        return Ok((sha, None));
    }
    let (bytes, sha) = read_module(path)?;
    if cache::ModuleStat::of(path).map_err(read_err)? == before {
        cache::record_sha256(dir, path, &before, &sha);
    }
    Ok((sha, Some(bytes)))
}

/// A hook selected but not ready: its calls fail with `why`.
fn unready_hook(spec: &HookSpec, why: String) -> LoadedHook {
    LoadedHook {
        name: spec.name.clone(),
        kind: spec.kind,
        namespaces: spec.namespaces.clone(),
        failure_policy: spec.failure_policy,
        timeout_ms: spec.timeout_ms(),
        memory_mib: spec.memory_limit_mib(),
        info: Arc::new(HookInfo {
            name: spec.name.clone(),
            settings: "null".into(),
            memory_bytes: 0,
        }),
        pre: None,
        exports: Exports::Unready(why),
    }
}

/// Selection elements given as JSON, read by plexus-core's reader (4.1.2.1; a missing namespace is
/// `pod_namespace`): an element that breaks the spec is the caller's mistake, named with its position.
fn parse_selections(elements: &[Value], pod_namespace: &str) -> Result<Vec<Selection>, HookError> {
    elements
        .iter()
        .enumerate()
        .map(|(i, v)| Selection::from_json(v, pod_namespace, i))
        .collect::<Result<_, _>>()
        .map_err(|e| HookError::Input(e.to_string()))
}

/// The error of loading `spec`'s component.
fn load_error(spec: &HookSpec, error: LoadError) -> HookError {
    HookError::Load {
        hook: spec.name.clone(),
        kind: spec.kind,
        error,
    }
}

/// Compiles (or takes from the cache) each distinct component of a load once, and records how each came.
struct Loader<'a> {
    engine: &'a Engine,
    cache_use: cache::CacheUse<'a>,
    compile: Compile,
    /// By sha256: the components compiled so far and the kinds they declare.
    components: HashMap<String, (Component, declared::Declared)>,
    artifacts: Vec<Artifact>,
}

impl Loader<'_> {
    /// `spec`'s component and the kinds it declares.
    fn component(&mut self, spec: &HookSpec) -> Result<(Component, declared::Declared), HookError> {
        let start = Instant::now();
        let (sha, mut bytes) = self.digest(spec)?;
        if let Some(c) = self.components.get(&sha) {
            return Ok(c.clone());
        }
        // The bytes are needed only to compile; when the digest came from the index they are read now, and must
        // still be what the index said.
        let compile = self.compile;
        let mut wasm = || -> Result<Vec<u8>, String> {
            if spec.precompiled {
                return Err(format!(
                    "no precompiled artifact for component sha256 {sha} in the cache (hooks published by the node \
                     agent are compiled before they are published)"
                ));
            }
            if compile == Compile::Never {
                return Err(cache::NO_COMPILER.into());
            }
            if let Some(b) = bytes.take() {
                return Ok(b);
            }
            let (b, now) = read_module(&spec.module).map_err(|e| e.to_string())?;
            if now != sha {
                return Err(format!(
                    "the file changed while loading (sha256 {sha}, now {now})"
                ));
            }
            Ok(b)
        };
        let (c, declared, source) = cache::load(self.engine, &sha, &mut wasm, self.cache_use)
            .map_err(|reason| {
                load_error(
                    spec,
                    LoadError::Compile {
                        path: spec.module.clone(),
                        reason,
                    },
                )
            })?;
        tracing::debug!(hook = %spec.name, ?source, elapsed = ?start.elapsed(), "hook component ready");
        self.artifacts.push(Artifact {
            hook: spec.name.clone(),
            module: spec.module.clone(),
            sha256: sha.clone(),
            source,
            elapsed: start.elapsed(),
        });
        self.components.insert(sha, (c.clone(), declared));
        Ok((c, declared))
    }

    /// The sha256 of `spec`'s component, with its bytes when they were read to get it. A precompiled entry is
    /// loaded by its pinned digest alone: its component file is not read, and a missing artifact is an error, never
    /// a compilation. Another entry's pin must be its file's digest.
    fn digest(&self, spec: &HookSpec) -> Result<(String, Option<Vec<u8>>), HookError> {
        if spec.precompiled {
            let pin = spec.sha256.as_deref().ok_or_else(|| {
                HookError::Config(format!(
                    "hook {:?}: a precompiled hook needs its sha256",
                    spec.name
                ))
            })?;
            return Ok((normal_pin(pin), None));
        }
        let (sha, bytes) =
            module_digest(&spec.module, self.cache_use).map_err(|e| load_error(spec, e))?;
        if let Some(pin) = spec.sha256.as_deref().map(normal_pin) {
            if pin != sha {
                return Err(load_error(
                    spec,
                    LoadError::Sha256Mismatch {
                        path: spec.module.clone(),
                        expected: pin,
                        actual: sha,
                    },
                ));
            }
        }
        Ok((sha, bytes))
    }
}

/// `spec`'s hook, of its `component` (which declares `declared`), linked and ready to call.
fn ready_hook(
    spec: &HookSpec,
    component: &Component,
    declared: declared::Declared,
    linker: &Linker<State>,
) -> Result<LoadedHook, HookError> {
    let load_err = |error| load_error(spec, error);
    if !declared.allows(spec.kind) {
        return Err(load_err(LoadError::KindNotImplemented {
            path: spec.module.clone(),
            kind: spec.kind,
            declared: declared.kinds().unwrap_or_default(),
        }));
    }
    let pre = linker.instantiate_pre(component).map_err(|e| {
        load_err(LoadError::Link {
            path: spec.module.clone(),
            reason: format!("{e:#}"),
        })
    })?;
    let missing = |_| {
        load_err(LoadError::MissingExport {
            path: spec.module.clone(),
            interface: spec.kind.interface(),
        })
    };
    let exports = match spec.kind {
        HookKind::Policy => Exports::Policy(policy::GuestIndices::new(&pre).map_err(missing)?),
        HookKind::Resolver => {
            Exports::Resolver(resolver::GuestIndices::new(&pre).map_err(missing)?)
        }
        HookKind::Status => Exports::Status(status::GuestIndices::new(&pre).map_err(missing)?),
    };
    let memory_mib = spec.memory_limit_mib();
    Ok(LoadedHook {
        name: spec.name.clone(),
        kind: spec.kind,
        namespaces: spec.namespaces.clone(),
        failure_policy: spec.failure_policy,
        timeout_ms: spec.timeout_ms(),
        memory_mib,
        info: Arc::new(HookInfo {
            name: spec.name.clone(),
            settings: spec
                .settings
                .as_ref()
                .map_or_else(|| "null".to_string(), Value::to_string),
            memory_bytes: (memory_mib as usize) << 20,
        }),
        pre: Some(pre),
        exports,
    })
}

fn normal_pin(pin: &str) -> String {
    pin.trim()
        .trim_start_matches("sha256:")
        .to_ascii_lowercase()
}

fn new_linker(engine: &Engine) -> Result<Linker<State>, String> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(|e| format!("{e:#}"))?;
    sandbox::shadow_clock_waits(&mut linker).map_err(|e| format!("{e:#}"))?;
    bindings::Hooks::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)
        .map_err(|e| format!("{e:#}"))?;
    Ok(linker)
}

fn check_specs(specs: &[HookSpec]) -> Result<(), HookError> {
    let mut seen = std::collections::HashSet::new();
    for s in specs {
        if s.name.is_empty() {
            return Err(HookError::Config("a hook has an empty name".into()));
        }
        if !seen.insert((s.name.as_str(), s.kind)) {
            return Err(HookError::Config(format!(
                "two {} hooks are named {:?}",
                s.kind, s.name
            )));
        }
        if s.timeout_ms == Some(0) {
            return Err(HookError::Config(format!(
                "hook {:?}: timeoutMs must be positive",
                s.name
            )));
        }
        if let Some(m) = s.memory_limit_mib {
            if m == 0 || m > 4096 {
                return Err(HookError::Config(format!(
                    "hook {:?}: memoryLimitMiB must be between 1 and 4096",
                    s.name
                )));
            }
        }
    }
    Ok(())
}

impl Hooks {
    /// Whether the calls are part of a change of a running pod's networks (the node daemon's dynamic
    /// networks) rather than the ADD that makes its sandbox: what every hook's `host.pod-running` answers.
    pub fn set_pod_running(&mut self, running: bool) {
        self.pod_running = running;
    }

    /// Loads the hooks in configured order, compiling each distinct component once and caching the
    /// result under `cache_dir/hooks`.
    pub fn load(specs: &[HookSpec], cache_dir: &Path) -> Result<Hooks, HookError> {
        Self::load_inner(specs, Some(cache_dir), Compile::WhenNeeded)
    }

    /// Like [`Hooks::load`], compiling only when `compile` allows it: with [`Compile::Never`], a component
    /// without a compiled artifact in the cache is an error.
    pub fn load_with(
        specs: &[HookSpec],
        cache_dir: &Path,
        compile: Compile,
    ) -> Result<Hooks, HookError> {
        Self::load_inner(specs, Some(cache_dir), compile)
    }

    /// Like [`Hooks::load`], without reading or writing a cache (for one-off runs).
    pub fn load_uncached(specs: &[HookSpec]) -> Result<Hooks, HookError> {
        Self::load_inner(specs, None, Compile::WhenNeeded)
    }

    fn load_inner(
        specs: &[HookSpec],
        cache_dir: Option<&Path>,
        compile: Compile,
    ) -> Result<Hooks, HookError> {
        check_specs(specs)?;
        // Unready entries have no component: they need no engine.
        let mut hooks: Vec<LoadedHook> = specs
            .iter()
            .filter_map(|spec| Some(unready_hook(spec, spec.unready.clone()?)))
            .collect();
        if hooks.len() == specs.len() {
            return Ok(Hooks {
                calls: Default::default(),
                pod_running: false,
                hooks,
                artifacts: Vec::new(),
                runtime: None,
            });
        }
        let engine = engine::new_engine(false).map_err(HookError::Engine)?;
        let linker = new_linker(&engine).map_err(HookError::Engine)?;
        let dir = cache_dir.map(cache::cache_dir);
        if let Some(Err(why)) = &dir {
            tracing::warn!("not using the hook cache: {why}");
        }
        let mut loader = Loader {
            engine: &engine,
            cache_use: match &dir {
                None => cache::CacheUse::Off,
                Some(Err(why)) => cache::CacheUse::Unusable(why),
                Some(Ok(d)) => cache::CacheUse::Dir(d),
            },
            compile,
            components: HashMap::new(),
            artifacts: Vec::new(),
        };
        for spec in specs.iter().filter(|s| s.unready.is_none()) {
            let (component, declared) = loader.component(spec)?;
            hooks.push(ready_hook(spec, &component, declared, &linker)?);
        }
        // In the configured order, the unready entries where they were.
        let position = |name: &str, kind: HookKind| {
            specs
                .iter()
                .position(|s| s.name == name && s.kind == kind)
                .unwrap_or(usize::MAX)
        };
        hooks.sort_by_key(|h| position(&h.name, h.kind));
        let artifacts = loader.artifacts;
        let ticker = engine::Ticker::start(engine.clone()).map_err(HookError::Engine)?;
        Ok(Hooks {
            calls: Default::default(),
            pod_running: false,
            hooks,
            artifacts,
            runtime: Some(Runtime { engine, ticker }),
        })
    }

    /// True when no hooks are configured (every call then passes its input through).
    pub fn is_empty(&self) -> bool {
        self.hooks.is_empty()
    }

    /// Every call made so far, in order, with its outcome.
    pub fn calls(&self) -> Vec<HookCall> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn record(&self, hook: &LoadedHook, outcome: &'static str) {
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(HookCall {
                hook: hook.name.clone(),
                kind: hook.kind,
                outcome,
            });
    }

    fn record_fault(&self, hook: &LoadedHook, fault: &Fault) {
        let outcome = match fault {
            Fault::Timeout(_) => "timeout",
            _ => "error",
        };
        self.record(hook, outcome);
    }

    /// When `hook` is unready: its call is recorded (`unready`) and fails under its failurePolicy (an error with
    /// `Fail`, skipped with `Ignore`); true when it was.
    fn unready(&self, hook: &LoadedHook) -> Result<bool, HookError> {
        let Exports::Unready(why) = &hook.exports else {
            return Ok(false);
        };
        self.record(hook, "unready");
        self.fault(hook, Fault::NotReady(why.clone()))?;
        Ok(true)
    }

    /// How each distinct component was made ready (compiled or loaded from the cache).
    pub fn artifacts(&self) -> &[Artifact] {
        &self.artifacts
    }

    /// Runs the policy hooks in order over spec selection elements, read by plexus-core's reader (a missing
    /// namespace is the pod's); each hook sees the previous one's rewrite. The first deny ends the chain. The
    /// selections admitted are in the spec's element form as [`Selection::to_json`] writes it.
    pub fn policy(&self, pod: &Pod, selections: Vec<Value>) -> Result<PolicyOutcome, HookError> {
        let typed = parse_selections(&selections, &pod.namespace)?;
        Ok(
            match self.policy_selections(pod, typed, SelectionDevices::new())? {
                PolicyOutcome::Admit(list) => {
                    PolicyOutcome::Admit(list.iter().map(Selection::to_json).collect())
                }
                PolicyOutcome::Deny { hook, reason } => PolicyOutcome::Deny { hook, reason },
            },
        )
    }

    /// [`Hooks::policy`] over parsed selections, the hooks seeing `devices` (what `host.selection-device`
    /// answers, WIT 0.1.2).
    pub fn policy_selections(
        &self,
        pod: &Pod,
        selections: Vec<Selection>,
        devices: SelectionDevices,
    ) -> Result<PolicyOutcome<Selection>, HookError> {
        let devices = Arc::new(devices);
        let wpod = convert::pod(pod);
        let mut current = selections;
        for hook in self.of_kind(HookKind::Policy, &pod.namespace) {
            if self.unready(hook)? {
                continue;
            }
            let Exports::Policy(idx) = &hook.exports else {
                continue;
            };
            let step = (|| {
                let wire: Vec<_> = current.iter().map(convert::selection_to_wire).collect();
                let decision = self.call(hook, &devices, |store, inst| {
                    idx.load(&mut *store, inst)?
                        .call_check(&mut *store, &wpod, &wire)
                })?;
                Ok(match decision {
                    policy::Decision::Admit => None,
                    policy::Decision::Deny(reason) => Some(Err(cut(reason, REASON_CAP))),
                    policy::Decision::Rewrite(list) => {
                        Some(Ok(convert::selections_from_wire(list, &pod.namespace)
                            .map_err(Fault::InvalidOutput)?))
                    }
                })
            })();
            match &step {
                Ok(Some(Err(_))) => self.record(hook, "deny"),
                Ok(_) => self.record(hook, "allow"),
                Err(fault) => self.record_fault(hook, fault),
            }
            match step {
                Ok(None) => {}
                Ok(Some(Ok(list))) => current = list,
                Ok(Some(Err(reason))) => {
                    return Ok(PolicyOutcome::Deny {
                        hook: hook.name.clone(),
                        reason,
                    })
                }
                Err(fault) => self.fault(hook, fault)?,
            }
        }
        Ok(PolicyOutcome::Admit(current))
    }

    /// Runs the resolver hooks in order for one selection, a spec selection element read by plexus-core's
    /// reader. `nad` is the NetworkAttachmentDefinition object, `config` the delegate configuration found so
    /// far. Each hook sees the previous one's output; `None` means no hook supplied or changed anything.
    pub fn resolve(
        &self,
        pod: &Pod,
        selection: &Value,
        nad: Option<&Value>,
        config: Option<&Value>,
    ) -> Result<Option<Value>, HookError> {
        let selection = parse_selections(std::slice::from_ref(selection), &pod.namespace)?;
        self.resolve_selection(pod, &selection[0], nad, config, None)
    }

    /// [`Hooks::resolve`] for a parsed selection, the hooks seeing `device` as its device
    /// (`host.selection-device`, WIT 0.1.2).
    pub fn resolve_selection(
        &self,
        pod: &Pod,
        selection: &Selection,
        nad: Option<&Value>,
        config: Option<&Value>,
        device: Option<plexus_core::spec::dra::ClaimDevice>,
    ) -> Result<Option<Value>, HookError> {
        let mut devices = SelectionDevices::new();
        if let Some(d) = device {
            devices.insert((selection.namespace.clone(), selection.name.clone()), d);
        }
        let devices = Arc::new(devices);
        let mut resolvers = self.of_kind(HookKind::Resolver, &pod.namespace).peekable();
        if resolvers.peek().is_none() {
            return Ok(None);
        }
        let wpod = convert::pod(pod);
        let sel = convert::selection_to_wire(selection);
        let nad_text = nad.map(Value::to_string);
        let mut current = config.cloned();
        let mut changed = false;
        for hook in resolvers {
            if self.unready(hook)? {
                continue;
            }
            let Exports::Resolver(idx) = &hook.exports else {
                continue;
            };
            let step = (|| {
                let cfg_text = current.as_ref().map(Value::to_string);
                let out = self.call(hook, &devices, |store, inst| {
                    idx.load(&mut *store, inst)?.call_resolve(
                        &mut *store,
                        &wpod,
                        &sel,
                        nad_text.as_deref(),
                        cfg_text.as_deref(),
                    )
                })?;
                out.map(|text| {
                    let v: Value = serde_json::from_str(&text).map_err(|e| {
                        Fault::InvalidOutput(format!("the config is not valid JSON: {e}"))
                    })?;
                    convert::check_cni_config(&v).map_err(Fault::InvalidOutput)?;
                    Ok(v)
                })
                .transpose()
            })();
            match &step {
                Ok(_) => self.record(hook, "allow"),
                Err(fault) => self.record_fault(hook, fault),
            }
            match step {
                Ok(None) => {}
                Ok(Some(v)) => {
                    current = Some(v);
                    changed = true;
                }
                Err(fault) => self.fault(hook, fault)?,
            }
        }
        Ok(if changed { current } else { None })
    }

    /// Runs the status hooks in order over the network-status entries (spec 5) before they are
    /// written; each hook sees the previous one's output.
    pub fn status(&self, pod: &Pod, entries: Vec<Value>) -> Result<Vec<Value>, HookError> {
        let wpod = convert::pod(pod);
        let mut current = entries;
        for hook in self.of_kind(HookKind::Status, &pod.namespace) {
            if self.unready(hook)? {
                continue;
            }
            let Exports::Status(idx) = &hook.exports else {
                continue;
            };
            let step = (|| {
                let wire = current
                    .iter()
                    .map(convert::entry_to_wire)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(Fault::Input)?;
                let out = self.call(hook, &Arc::default(), |store, inst| {
                    idx.load(&mut *store, inst)?
                        .call_shape(&mut *store, &wpod, &wire)
                })?;
                convert::entries_from_wire(out).map_err(Fault::InvalidOutput)
            })();
            match &step {
                Ok(_) => self.record(hook, "allow"),
                Err(fault) => self.record_fault(hook, fault),
            }
            match step {
                Ok(list) => current = list,
                Err(fault) => self.fault(hook, fault)?,
            }
        }
        Ok(current)
    }

    /// The hooks of a kind that apply to a pod in `namespace`, in order.
    fn of_kind<'a>(
        &'a self,
        kind: HookKind,
        namespace: &'a str,
    ) -> impl Iterator<Item = &'a LoadedHook> {
        self.hooks.iter().filter(move |h| {
            h.kind == kind
                && h.namespaces
                    .as_ref()
                    .is_none_or(|list| list.iter().any(|n| n == namespace))
        })
    }

    /// Applies the hook's failurePolicy to a fault.
    fn fault(&self, hook: &LoadedHook, fault: Fault) -> Result<(), HookError> {
        match hook.failure_policy {
            FailurePolicy::Fail => Err(HookError::Fault {
                hook: hook.name.clone(),
                kind: hook.kind,
                fault,
            }),
            FailurePolicy::Ignore => {
                tracing::warn!(
                    hook = %hook.name,
                    kind = %hook.kind,
                    "hook {:?} ({}): {fault}; skipped (failurePolicy Ignore)",
                    hook.name,
                    hook.kind
                );
                Ok(())
            }
        }
    }

    /// One call in a fresh store: instantiate from the `InstancePre`, run `f` under the deadline and
    /// memory limit, turn whatever went wrong into a [`Fault`].
    fn call<T>(
        &self,
        hook: &LoadedHook,
        devices: &Arc<SelectionDevices>,
        f: impl FnOnce(&mut Store<State>, &Instance) -> wasmtime::Result<Result<T, String>>,
    ) -> Result<T, Fault> {
        let (Some(rt), Some(pre)) = (&self.runtime, &hook.pre) else {
            return Err(Fault::Trap("no engine".into()));
        };
        let mut store = Store::new(
            &rt.engine,
            State::new(
                hook.info.clone(),
                Duration::from_millis(hook.timeout_ms),
                self.pod_running,
                devices.clone(),
            ),
        );
        store.limiter(|s| &mut s.limits);
        store.set_epoch_deadline(engine::deadline_ticks(hook.timeout_ms));
        store.epoch_deadline_trap();
        let start = Instant::now();
        let result = {
            let _running = rt.ticker.run();
            pre.instantiate(&mut store)
                .and_then(|inst| f(&mut store, &inst))
        };
        let elapsed = start.elapsed();
        let out = match result {
            Ok(Ok(v)) => Ok(v),
            // An engine that catches its own failed allocation (SpiderMonkey's "out of memory" exception) returns
            // an error rather than trapping: the limit is still what stopped it.
            Ok(Err(_)) if store.data().limits.memory_denied => {
                Err(Fault::OutOfMemory(hook.memory_mib))
            }
            Ok(Err(message)) => Err(Fault::Failed(cut(message, REASON_CAP))),
            Err(e) => Err(classify(&e, &store, hook)),
        };
        sandbox::flush_output(store.data());
        tracing::debug!(hook = %hook.name, kind = %hook.kind, ?elapsed, ok = out.is_ok(), "hook call");
        out
    }
}

fn classify(e: &wasmtime::Error, store: &Store<State>, hook: &LoadedHook) -> Fault {
    let trap = e.downcast_ref::<Trap>();
    if trap == Some(&Trap::Interrupt) {
        return Fault::Timeout(hook.timeout_ms);
    }
    if store.data().limits.memory_denied {
        return Fault::OutOfMemory(hook.memory_mib);
    }
    let what = match trap {
        Some(t) => t.to_string(),
        None => e.root_cause().to_string(),
    };
    match sandbox::last_stderr_line(store.data()) {
        Some(line) => Fault::Trap(format!("{what} (guest stderr: {line})")),
        None => Fault::Trap(what),
    }
}

fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

/// Compiles a component into the cache under `cache_dir/hooks` (what `plexus hook compile` does).
pub fn compile(path: &Path, cache_dir: &Path) -> Result<Artifact, LoadError> {
    let start = Instant::now();
    let (bytes, sha) = read_module(path)?;
    let engine = engine::new_engine(true).map_err(|reason| LoadError::Compile {
        path: path.to_path_buf(),
        reason,
    })?;
    let dir = cache::cache_dir(cache_dir);
    let cache_use = match &dir {
        Ok(d) => cache::CacheUse::Dir(d),
        Err(why) => {
            tracing::warn!("not using the hook cache: {why}");
            cache::CacheUse::Unusable(why)
        }
    };
    let mut bytes = Some(bytes);
    let mut wasm = || {
        bytes
            .take()
            .ok_or_else(|| "component read twice".to_string())
    };
    let (_, _, source) =
        cache::load(&engine, &sha, &mut wasm, cache_use).map_err(|reason| LoadError::Compile {
            path: path.to_path_buf(),
            reason,
        })?;
    Ok(Artifact {
        hook: path.display().to_string(),
        module: path.to_path_buf(),
        sha256: sha,
        source,
        elapsed: start.elapsed(),
    })
}

/// Reads a component's exports, imports and digest (what `plexus hook inspect` shows).
pub fn inspect(path: &Path) -> Result<Inspection, LoadError> {
    let (bytes, sha) = read_module(path)?;
    let compile_err = |reason| LoadError::Compile {
        path: path.to_path_buf(),
        reason,
    };
    let engine = engine::new_engine(false).map_err(compile_err)?;
    let component = cache::compile_component(&engine, &bytes).map_err(compile_err)?;
    let ty = component.component_type();
    let exports: Vec<String> = ty.exports(&engine).map(|(n, _)| n.to_string()).collect();
    let imports: Vec<String> = ty.imports(&engine).map(|(n, _)| n.to_string()).collect();
    let mut wit_versions: Vec<String> = exports
        .iter()
        .chain(&imports)
        .filter_map(|n| n.strip_prefix("plexus:hooks/"))
        .filter_map(|n| n.split_once('@').map(|(_, v)| v.to_string()))
        .collect();
    wit_versions.sort();
    wit_versions.dedup();
    let declared = declared::read(&bytes).map_err(compile_err)?;
    let kinds = HookKind::ALL
        .into_iter()
        .filter(|k| exports.iter().any(|e| k.exported_as(e)) && declared.allows(*k))
        .collect();
    Ok(Inspection {
        declares_kinds: declared.kinds().is_some(),
        path: path.to_path_buf(),
        size: bytes.len() as u64,
        sha256: sha,
        exports,
        imports,
        kinds,
        wit_versions,
    })
}

/// The cache file `Hooks::load` would use for this component (for tests and operators).
pub fn artifact_path(module: &Path, cache_dir: &Path) -> Result<PathBuf, LoadError> {
    let (_, sha) = read_module(module)?;
    let engine = engine::new_engine(false).map_err(|reason| LoadError::Compile {
        path: module.to_path_buf(),
        reason,
    })?;
    Ok(cache::artifact_path(cache_dir, &engine, &sha))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unready(name: &str, kind: HookKind, policy: FailurePolicy) -> HookSpec {
        let mut spec = HookSpec::new(name, kind, "");
        spec.failure_policy = policy;
        spec.precompiled = true;
        spec.unready = Some("PullFailed: registry unreachable".into());
        spec
    }

    fn pod(namespace: &str) -> Pod {
        Pod {
            namespace: namespace.into(),
            name: "web".into(),
            ..Pod::default()
        }
    }

    #[test]
    fn an_unready_hook_fails_each_call_it_would_get_under_its_failure_policy() {
        let mut strict = unready("networkhook/strict", HookKind::Policy, FailurePolicy::Fail);
        strict.namespaces = Some(vec!["team".into()]);
        let lenient = unready(
            "networkhook/lenient",
            HookKind::Status,
            FailurePolicy::Ignore,
        );
        // No component and no engine: an unready entry loads nothing.
        let hooks = Hooks::load_uncached(&[strict, lenient]).unwrap();
        assert!(!hooks.is_empty());
        assert!(hooks.runtime.is_none());

        let selections = vec![serde_json::json!({"name": "net", "namespace": "team"})];
        let err = hooks.policy(&pod("team"), selections.clone()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "hook \"networkhook/strict\" (policy): is not ready on this node: PullFailed: registry unreachable"
        );
        // A pod of a namespace the hook does not name: the hook would not be called, nothing fails.
        assert!(matches!(
            hooks.policy(&pod("other"), selections),
            Ok(PolicyOutcome::Admit(_))
        ));
        // Ignore: the call is skipped, the entries pass through.
        let entries = vec![serde_json::json!({"name": "cbr0", "default": true})];
        assert_eq!(
            hooks.status(&pod("team"), entries.clone()).unwrap(),
            entries
        );
        let outcomes: Vec<(String, &str)> = hooks
            .calls()
            .into_iter()
            .map(|c| (c.hook, c.outcome))
            .collect();
        assert_eq!(
            outcomes,
            [
                ("networkhook/strict".to_string(), "unready"),
                ("networkhook/lenient".to_string(), "unready"),
            ]
        );
    }
}
