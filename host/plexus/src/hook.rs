//! `plexus hook ...`: operator commands for WebAssembly hooks (inspect, compile into the cache, run
//! one call).

use plexus_hooks::{HookKind, HookSpec, Hooks, PolicyOutcome};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plexus_node::distribution::{self, Registry, RegistryOptions, TrustedKeys};
use plexus_node::node_report;

const RUN_INPUT: &str = "\
--input, by kind:
  policy    {\"pod\": POD, \"selections\": [SELECTION, ...]}
  resolver  {\"pod\": POD, \"selection\": SELECTION, \"nad\": NAD?, \"config\": CONFIG?}
  status    {\"pod\": POD, \"entries\": [STATUS-ENTRY, ...]}
  POD       {\"namespace\": .., \"name\": .., \"uid\"?: .., \"labels\"?: {..}, \"annotations\"?: {..}}
JSON arguments are inline or @FILE.
Exit status: 0 when the policy admits (or rewrites) and for a resolver's or status hook's output, 3 when the
policy denies, 1 when the hook fails (error, trap, timeout, a module without KIND), 2 for bad arguments.";

/// `plexus hook run`'s exit status when the policy denies (0 admits, 1 is an error, 2 bad arguments).
pub const RUN_DENIED: u8 = 3;

use plexus_cni::conf::DEFAULT_CACHE_DIR;

/// `plexus hook ...`: inspect, compile, run, push and verify WebAssembly hooks. Each prints JSON on stdout.
#[derive(Debug, clap::Args)]
pub struct HookArgs {
    #[command(subcommand)]
    pub command: HookCommand,
    #[command(flatten)]
    pub log: plexus_cni::logging::LogArgs,
}

#[derive(Debug, clap::Subcommand)]
pub enum HookCommand {
    /// What a component exports and imports, and which hook kinds it implements
    Inspect {
        /// A hook component (.wasm)
        file: PathBuf,
    },
    /// Compile a component into the cache where the CNI plugin loads it
    Compile {
        /// A hook component (.wasm)
        file: PathBuf,
        /// The plexus cacheDir
        #[arg(long, value_name = "DIR", default_value = DEFAULT_CACHE_DIR)]
        cache_dir: PathBuf,
    },
    /// Run one call of a hook, in the sandbox an ADD runs it in
    #[command(after_help = RUN_INPUT)]
    Run(RunArgs),
    /// The node agent's probe of a hook entry (JSON on stdin): one call of its kind on a synthetic pod, from the
    /// compiled artifact; prints the verdict. Run by the daemon in a process of its own.
    #[command(hide = true)]
    Probe {
        /// The plexus cacheDir
        #[arg(long, value_name = "DIR", default_value = DEFAULT_CACHE_DIR)]
        cache_dir: PathBuf,
    },
    /// Push a component to REFERENCE (REGISTRY/REPOSITORY:TAG) as a wasm artifact, optionally signed
    #[command(
        long_about = "FILE (a hook component) goes to REFERENCE as a wasm artifact (one application/wasm layer); \
                      with --key (unencrypted PKCS#8 PEM, ECDSA P-256) its manifest digest is signed in cosign's \
                      format (REPOSITORY:sha256-<hex>.sig). Prints the reference pinned by digest, for a NetworkHook."
    )]
    Push {
        /// A hook component (.wasm)
        file: PathBuf,
        /// REGISTRY/REPOSITORY:TAG
        reference: String,
        /// The signing key (unencrypted PKCS#8 PEM, ECDSA P-256)
        #[arg(long, value_name = "PRIVATE-PEM")]
        key: Option<PathBuf>,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Check a pushed module as the node agent does; exit 1 when any check fails
    #[command(
        long_about = "What the node agent checks: the signature of the manifest digest verifies with one of the \
                      --key public keys (PEM; cosign.pub works), the manifest and the module match their \
                      digests, the module is a component exporting a hook interface. Exit 1 when any check fails."
    )]
    Verify {
        /// REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@DIGEST
        reference: String,
        /// A public key the signature may verify with (PEM; cosign.pub works); repeatable
        #[arg(long, value_name = "PUBLIC-PEM", required_unless_present = "unsigned")]
        key: Vec<PathBuf>,
        /// Skip the signature check
        #[arg(long)]
        unsigned: bool,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// How a NetworkHook stands across the cluster: how many nodes run which digest, which fail and why
    #[command(
        long_about = "Reads every node's NodeHookStatus (one object per node, written by its agent) and the \
                      NetworkHook, and prints how many nodes, and which, run each digest of NAME, which fail and \
                      why (one message as an example), and which have not yet seen its latest generation. Text \
                      for a person, or --json.",
        after_help = crate::cluster_args::CLUSTER_HELP
    )]
    Status(StatusArgs),
}

/// `plexus hook status`'s flags.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The NetworkHook
    name: String,
    /// Print JSON instead of text
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    cluster: crate::cluster_args::ClusterArgs,
}

/// `plexus hook run`'s flags.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// A hook component (.wasm)
    file: PathBuf,
    /// Which export to call
    #[arg(long, value_name = "KIND", value_parser = ["policy", "resolver", "status"])]
    kind: String,
    /// The call's input (JSON, or @FILE)
    #[arg(long, value_name = "JSON|@FILE")]
    input: String,
    /// The hook's settings (JSON, or @FILE)
    #[arg(long, value_name = "JSON|@FILE")]
    settings: Option<String>,
    /// The call's time limit [default: the hook default]
    #[arg(long, value_name = "N")]
    timeout_ms: Option<u64>,
    /// The instance's memory limit [default: the hook default]
    #[arg(long, value_name = "N")]
    memory_limit_mib: Option<u64>,
}

/// How registries are reached, for push and verify.
#[derive(Debug, clap::Args)]
pub struct RegistryArgs {
    /// A registry spoken to over plain HTTP (host or host:port); repeatable
    #[arg(long, value_name = "HOST[:PORT]")]
    insecure_registry: Vec<String>,
    /// A CA certificate trusted for registries besides the system's; repeatable
    #[arg(long, value_name = "PEM")]
    registry_ca: Vec<PathBuf>,
    /// Each registry operation's time limit
    #[arg(long, value_name = "N", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    timeout_ms: u64,
}

impl RegistryArgs {
    fn options(&self) -> RegistryOptions {
        RegistryOptions {
            insecure: self.insecure_registry.clone(),
            ca_files: self.registry_ca.clone(),
            timeout: Duration::from_millis(self.timeout_ms),
        }
    }
}

/// Failures of a command: usage mistakes (exit 2) or errors (exit 1).
enum CliError {
    Usage(String),
    Failed(String),
}

/// Runs `plexus hook ...`.
pub fn main(args: HookArgs) -> u8 {
    args.log.init();
    let result = match args.command {
        HookCommand::Inspect { file } => inspect(&file),
        HookCommand::Compile { file, cache_dir } => compile(&file, &cache_dir),
        HookCommand::Run(run_args) => run(run_args),
        HookCommand::Probe { cache_dir } => probe(&cache_dir),
        HookCommand::Push {
            file,
            reference,
            key,
            registry,
        } => push(&file, &reference, key.as_deref(), &registry.options()),
        HookCommand::Verify {
            reference,
            key,
            unsigned,
            registry,
        } => verify(&reference, &key, unsigned, &registry.options()),
        HookCommand::Status(status_args) => match status(&status_args) {
            Ok(summary) if !status_args.json => {
                return match write_stdout(&mut std::io::stdout().lock(), &summary.text()) {
                    Ok(()) => 0,
                    Err(msg) => fail(msg),
                };
            }
            Ok(summary) => serde_json::to_value(summary).map_err(failed),
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(out) => {
            // What registries, hooks and nodes wrote, without a character a terminal would act on.
            let text = format!(
                "{}\n",
                plexus_node::terminal::json(&out).unwrap_or_default()
            );
            if let Err(msg) = write_stdout(&mut std::io::stdout().lock(), &text) {
                return fail(msg);
            }
            // Only `hook run` has a decision; a script tells allow from deny by the status.
            if out["output"]["decision"] == "deny" {
                RUN_DENIED
            } else {
                0
            }
        }
        Err(CliError::Usage(msg)) => {
            eprintln!("plexus hook: {}", plexus_node::terminal::printable(&msg));
            2
        }
        Err(CliError::Failed(msg)) => fail(msg),
    }
}

fn fail(msg: String) -> u8 {
    eprintln!("plexus hook: {}", plexus_node::terminal::printable(&msg));
    1
}

/// Writes a command's answer. A reader that closed the pipe early (`| head`) took all it wanted: the command did
/// its work, so that ends quietly with the command's own status, as other tools in a pipeline do; any other write
/// error (a full disk) is a failure.
fn write_stdout(out: &mut impl std::io::Write, text: &str) -> Result<(), String> {
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(format!("writing to stdout: {e}"))
        }
        _ => Ok(()),
    }
}

fn failed(e: impl std::fmt::Display) -> CliError {
    CliError::Failed(error_chain(&e.to_string(), None))
}

fn error_chain(top: &str, mut source: Option<&(dyn std::error::Error + 'static)>) -> String {
    let mut msg = top.to_string();
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

fn failed_err(e: &(dyn std::error::Error + 'static)) -> CliError {
    CliError::Failed(error_chain(&e.to_string(), e.source()))
}

fn inspect(file: &Path) -> Result<Value, CliError> {
    let i = plexus_hooks::inspect(file).map_err(|e| failed_err(&e))?;
    Ok(json!({
        "path": i.path,
        "size": i.size,
        "sha256": i.sha256,
        "witVersions": i.wit_versions,
        "hostWitVersion": plexus_hooks::WIT_VERSION,
        "kinds": i.kinds,
        "kindsDeclared": i.declares_kinds,
        "exports": i.exports,
        "imports": i.imports,
    }))
}

/// The most of an entry read from stdin.
const PROBE_INPUT_CAP: u64 = 1024 * 1024;

fn probe(cache_dir: &Path) -> Result<Value, CliError> {
    use std::io::Read;
    let mut text = Vec::new();
    std::io::stdin()
        .take(PROBE_INPUT_CAP)
        .read_to_end(&mut text)
        .map_err(failed)?;
    let entry: plexus_hooks::HookSpec = serde_json::from_slice(&text)
        .map_err(|e| CliError::Usage(format!("the entry on stdin is not a hook entry: {e}")))?;
    Ok(
        match plexus_node::daemon::agent::probe_entry(&entry, cache_dir) {
            Ok(()) => json!({"passed": true}),
            Err(f) => json!({"passed": false, "reason": f.reason.as_str(), "message": f.message}),
        },
    )
}

fn compile(file: &Path, cache_dir: &Path) -> Result<Value, CliError> {
    let a = plexus_hooks::compile(file, cache_dir).map_err(|e| failed_err(&e))?;
    let artifact = plexus_hooks::artifact_path(file, cache_dir).map_err(|e| failed_err(&e))?;
    Ok(json!({
        "path": a.module,
        "sha256": a.sha256,
        "artifact": artifact,
        "source": format!("{:?}", a.source),
        "elapsedMs": a.elapsed.as_secs_f64() * 1e3,
    }))
}

/// A JSON argument, inline or `@path`.
fn json_arg(text: &str, what: &str) -> Result<Value, CliError> {
    let owned;
    let text = match text.strip_prefix('@') {
        Some(path) => {
            owned = std::fs::read_to_string(path)
                .map_err(|e| CliError::Failed(format!("cannot read {what} file {path}: {e}")))?;
            owned.as_str()
        }
        None => text,
    };
    serde_json::from_str(text)
        .map_err(|e| CliError::Usage(format!("{what} is not valid JSON: {e}")))
}

/// What `--input` holds; which keys a kind needs is checked where it runs.
#[derive(serde::Deserialize)]
struct RunInput {
    pod: plexus_core::spec::Pod,
    selections: Option<Vec<Value>>,
    selection: Option<Value>,
    nad: Option<Value>,
    config: Option<Value>,
    entries: Option<Vec<Value>>,
}

fn needs<T>(value: Option<T>, key: &str) -> Result<T, CliError> {
    value.ok_or_else(|| CliError::Usage(format!("input has no {key:?}")))
}

fn run(args: RunArgs) -> Result<Value, CliError> {
    let file = args.file;
    let kind: HookKind = args.kind.parse().map_err(CliError::Usage)?;
    let input = json_arg(&args.input, "--input")?;
    let mut spec = HookSpec::new(hook_name(&file), kind, file.clone());
    spec.settings = args
        .settings
        .as_deref()
        .map(|s| json_arg(s, "--settings"))
        .transpose()?;
    spec.timeout_ms = args.timeout_ms;
    spec.memory_limit_mib = args.memory_limit_mib;
    let input: RunInput =
        serde_json::from_value(input).map_err(|e| CliError::Usage(format!("--input: {e}")))?;
    let pod = input.pod;

    let start = Instant::now();
    let hooks = Hooks::load_uncached(std::slice::from_ref(&spec)).map_err(|e| failed_err(&e))?;
    let load_ms = start.elapsed().as_secs_f64() * 1e3;

    let start = Instant::now();
    let output = match kind {
        HookKind::Policy => match hooks
            .policy(&pod, needs(input.selections, "selections")?)
            .map_err(failed)?
        {
            PolicyOutcome::Admit(selections) => {
                json!({"decision": "admit", "selections": selections})
            }
            PolicyOutcome::Deny { hook, reason } => {
                json!({"decision": "deny", "hook": hook, "reason": reason})
            }
        },
        HookKind::Resolver => {
            let selection = needs(input.selection, "selection")?;
            let out = hooks
                .resolve(&pod, &selection, input.nad.as_ref(), input.config.as_ref())
                .map_err(failed)?;
            json!({"config": out})
        }
        HookKind::Status => {
            let out = hooks
                .status(&pod, needs(input.entries, "entries")?)
                .map_err(failed)?;
            json!({"entries": out})
        }
    };
    let call_ms = start.elapsed().as_secs_f64() * 1e3;
    Ok(json!({
        "hook": spec.name,
        "kind": kind,
        "output": output,
        "timing": {"loadMs": load_ms, "callMs": call_ms},
    }))
}

fn hook_name(file: &Path) -> String {
    file.file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("hook")
        .to_string()
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> Result<T, CliError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Failed(format!("tokio runtime: {e}")))?;
    Ok(rt.block_on(f))
}

fn push(
    file: &Path,
    reference: &str,
    key: Option<&Path>,
    options: &RegistryOptions,
) -> Result<Value, CliError> {
    let reference = distribution::parse_reference(reference).map_err(failed)?;
    // Only components this host can load as hooks are published.
    let inspected = plexus_hooks::inspect(file).map_err(|e| failed_err(&e))?;
    if inspected.kinds.is_empty() {
        return Err(CliError::Failed(format!(
            "{} exports no plexus:hooks interface of version {} (exports: {})",
            file.display(),
            plexus_hooks::WIT_VERSION,
            inspected.exports.join(", ")
        )));
    }
    let key = key
        .map(distribution::load_signing_key)
        .transpose()
        .map_err(failed)?;
    let registry = Registry::new(options).map_err(failed)?;
    let wasm =
        std::fs::read(file).map_err(|e| CliError::Failed(format!("{}: {e}", file.display())))?;
    let (digest, signed) = block_on(async {
        let digest = registry.push_module(&reference, wasm).await?;
        let signed = match &key {
            Some(k) => {
                registry.push_signature(&reference, &digest, k).await?;
                Some(distribution::key_id(k.verifying_key()))
            }
            None => None,
        };
        Ok::<_, distribution::DistError>((digest, signed))
    })?
    .map_err(failed)?;
    let pinned = format!(
        "{}/{}@{digest}",
        reference.registry(),
        reference.repository()
    );
    // A NetworkHook ready to apply (`jq .networkHook | kubectl apply -f -`): the module by digest, as the CRD
    // requires, named after the repository, of the module's (first) kind.
    let name = reference
        .repository()
        .rsplit('/')
        .next()
        .unwrap_or("hook")
        .to_string();
    let network_hook = json!({
        "apiVersion": "plexus.dev/v1alpha1",
        "kind": "NetworkHook",
        "metadata": {"name": name},
        "spec": {"kind": inspected.kinds[0], "module": pinned},
    });
    Ok(json!({
        "reference": pinned,
        "digest": digest,
        "sha256": inspected.sha256,
        "kinds": inspected.kinds,
        "signedBy": signed,
        "networkHook": network_hook,
    }))
}

fn verify(
    reference: &str,
    key_files: &[PathBuf],
    unsigned: bool,
    options: &RegistryOptions,
) -> Result<Value, CliError> {
    let reference = distribution::parse_reference(reference).map_err(failed)?;
    let keys = TrustedKeys::load(key_files).map_err(failed)?;
    let registry = Registry::new(options).map_err(failed)?;
    let (digest, verified_by, pulled) = block_on(async {
        let digest = match reference.digest() {
            Some(d) => d.to_string(),
            None => registry.resolve(&reference).await?,
        };
        let pinned = reference.clone_with_digest(digest.clone());
        let verified_by = if unsigned {
            None
        } else {
            Some(registry.verify(&pinned, &digest, &keys).await?)
        };
        let pulled = registry.pull_module(&pinned).await?;
        Ok::<_, distribution::DistError>((digest, verified_by, pulled))
    })?
    .map_err(failed)?;
    let tmp = tempfile::NamedTempFile::new().map_err(failed)?;
    std::fs::write(tmp.path(), &pulled.wasm).map_err(failed)?;
    let inspected = plexus_hooks::inspect(tmp.path()).map_err(|e| failed_err(&e))?;
    if inspected.kinds.is_empty() {
        return Err(CliError::Failed(format!(
            "{}: the module exports no plexus:hooks interface of version {}",
            reference.whole(),
            plexus_hooks::WIT_VERSION
        )));
    }
    Ok(json!({
        "reference": format!("{}/{}@{digest}", reference.registry(), reference.repository()),
        "digest": digest,
        "sha256": pulled.sha256,
        "size": pulled.wasm.len(),
        "kinds": inspected.kinds,
        "verifiedBy": verified_by,
    }))
}

/// The NetworkHook's generation (none when it does not exist) and every node's report.
async fn read_reports(
    api: &plexus_cluster::KubeApi,
    name: &str,
) -> Result<(Option<i64>, Vec<(String, node_report::NodeReport)>), String> {
    use kube::api::{Api, DynamicObject};
    let hooks = Api::<DynamicObject>::all_with(
        api.client().clone(),
        &plexus_node::daemon::agent::api_resource(),
    );
    let generation = api
        .get_cluster_scoped(
            &hooks,
            (plexus_node::daemon::agent::PLURAL, node_report::GROUP),
            name,
        )
        .await
        .map_err(|e| e.to_string())?
        .and_then(|h| h.metadata.generation);
    let per_node =
        Api::<DynamicObject>::all_with(api.client().clone(), &node_report::api_resource());
    let reports = api
        .list_all(&per_node, node_report::PLURAL, node_report::GROUP)
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|obj| {
            let node = obj.metadata.name.clone().unwrap_or_default();
            let report: node_report::NodeReport =
                serde_json::from_value(obj.data["status"].clone()).unwrap_or_default();
            (node, report)
        })
        .collect();
    Ok((generation, reports))
}

/// `plexus hook status NAME`: every node's report of the hook, from the API.
fn status(args: &StatusArgs) -> Result<node_report::Summary, CliError> {
    let (generation, reports) = block_on(async {
        let (api, source) = args.cluster.connect().await.map_err(failed)?;
        // An error names the server; this says which configuration named it.
        let failed_on = |e: String| CliError::Failed(format!("{e} (the cluster of {source})"));
        read_reports(&api, &args.name).await.map_err(failed_on)
    })??;
    Ok(node_report::summarise(&args.name, generation, &reports))
}
