//! `plexus hook ...`: operator commands for WebAssembly hooks (inspect, compile into the cache, run
//! one call).

use plexus_hooks::{HookKind, HookSpec, Hooks, PolicyOutcome};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::distribution::{self, Registry, RegistryOptions, TrustedKeys};

const USAGE: &str = "\
usage: plexus hook inspect FILE
       plexus hook compile FILE [--cache-dir DIR]
       plexus hook run FILE --kind policy|resolver|status --input JSON|@FILE
                       [--settings JSON|@FILE] [--timeout-ms N] [--memory-limit-mib N]
       plexus hook push FILE REFERENCE [--key PRIVATE-PEM] [REGISTRY-FLAGS]
       plexus hook verify REFERENCE --key PUBLIC-PEM... [--unsigned] [REGISTRY-FLAGS]

push: FILE (a hook component) goes to REFERENCE (REGISTRY/REPOSITORY:TAG) as a wasm artifact (one
  application/wasm layer); with --key (unencrypted PKCS#8 PEM, ECDSA P-256) its manifest digest is signed in
  cosign's format (REPOSITORY:sha256-<hex>.sig). Prints the reference pinned by digest, for a NetworkHook.
verify: what the node agent checks: the signature of the manifest digest verifies with one of the --key public
  keys (PEM; cosign.pub works), the manifest and the module match their digests, the module is a component
  exporting a hook interface. --unsigned skips the signature. Exit 1 when any check fails.
REGISTRY-FLAGS: --insecure-registry HOST[:PORT] (plain HTTP; repeatable), --registry-ca PEM (repeatable),
  --timeout-ms N (each registry operation; default 30000)

run input, by kind:
  policy    {\"pod\": POD, \"selections\": [SELECTION, ...]}
  resolver  {\"pod\": POD, \"selection\": SELECTION, \"nad\": NAD?, \"config\": CONFIG?}
  status    {\"pod\": POD, \"entries\": [STATUS-ENTRY, ...]}
  POD       {\"namespace\": .., \"name\": .., \"uid\"?: .., \"labels\"?: {..}, \"annotations\"?: {..}}";

const DEFAULT_CACHE_DIR: &str = "/var/lib/plexus";

/// Failures of a command: usage mistakes (exit 2) or errors (exit 1).
enum CliError {
    /// `--help` after a command: the usage, on stdout, exit 0.
    Help,
    Usage(String),
    Failed(String),
}

/// Runs `plexus hook ARGS...` (`args` is what follows `hook`).
pub fn main(args: &[String]) -> u8 {
    init_logging();
    let result = match args.first().map(String::as_str) {
        Some("inspect") => inspect(&args[1..]),
        Some("compile") => compile(&args[1..]),
        Some("run") => run(&args[1..]),
        Some("push") => push(&args[1..]),
        Some("verify") => verify(&args[1..]),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            return 0;
        }
        Some(other) => Err(CliError::Usage(format!("unknown hook command {other:?}"))),
        None => Err(CliError::Usage("missing hook command".into())),
    };
    match result {
        Ok(out) => {
            println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
            0
        }
        Err(CliError::Help) => {
            println!("{USAGE}");
            0
        }
        Err(CliError::Usage(msg)) => {
            eprintln!("plexus hook: {msg}\n{USAGE}");
            2
        }
        Err(CliError::Failed(msg)) => {
            eprintln!("plexus hook: {msg}");
            1
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// `--flag value` pairs, flag without its dashes.
type Flags = Vec<(String, String)>;

/// Splits `FILE --flag value ...` into the file and the flags, refusing unknown flags; `--help` anywhere asks
/// for the usage.
fn parse(args: &[String], known: &[&str]) -> Result<(PathBuf, Flags), CliError> {
    let (mut pos, flags) = parse_n(args, known, &[], &["FILE"])?;
    Ok((PathBuf::from(pos.remove(0)), flags))
}

/// Like [`parse`] with the positional arguments `names` (all required) and the value-less `switches`.
fn parse_n(
    args: &[String],
    known: &[&str],
    switches: &[&str],
    names: &[&str],
) -> Result<(Vec<String>, Flags), CliError> {
    use lexopt::Arg::{Long, Short, Value as Positional};
    let usage = |e: lexopt::Error| CliError::Usage(e.to_string());
    let mut parser = lexopt::Parser::from_args(args);
    let mut positional = Vec::new();
    let mut flags = Vec::new();
    while let Some(arg) = parser.next().map_err(usage)? {
        match arg {
            Long("help") | Short('h') => return Err(CliError::Help),
            Long(name) if switches.contains(&name) => {
                flags.push((name.to_string(), String::new()));
            }
            Long(name) if known.contains(&name) => {
                let name = name.to_string();
                let value = parser
                    .value()
                    .map_err(|_| CliError::Usage(format!("--{name} needs a value")))?;
                flags.push((name, value.to_string_lossy().into_owned()));
            }
            Long(name) => return Err(CliError::Usage(format!("unknown option --{name}"))),
            Short(c) => return Err(CliError::Usage(format!("unknown option -{c}"))),
            Positional(v) if positional.len() < names.len() => {
                positional.push(v.to_string_lossy().into_owned())
            }
            Positional(v) => {
                return Err(CliError::Usage(format!("unexpected argument {v:?}")));
            }
        }
    }
    if let Some(missing) = names.get(positional.len()) {
        return Err(CliError::Usage(format!("missing {missing}")));
    }
    Ok((positional, flags))
}

fn flags_named<'a>(flags: &'a [(String, String)], name: &'a str) -> impl Iterator<Item = &'a str> {
    flags
        .iter()
        .filter(move |(f, _)| f == name)
        .map(|(_, v)| v.as_str())
}

fn flag<'a>(flags: &'a [(String, String)], name: &str) -> Option<&'a str> {
    flags
        .iter()
        .rev()
        .find(|(f, _)| f == name)
        .map(|(_, v)| v.as_str())
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

fn inspect(args: &[String]) -> Result<Value, CliError> {
    let (file, _) = parse(args, &[])?;
    let i = plexus_hooks::inspect(&file).map_err(|e| failed_err(&e))?;
    Ok(json!({
        "path": i.path,
        "size": i.size,
        "sha256": i.sha256,
        "witVersions": i.wit_versions,
        "hostWitVersion": plexus_hooks::WIT_VERSION,
        "kinds": i.kinds,
        "exports": i.exports,
        "imports": i.imports,
    }))
}

fn compile(args: &[String]) -> Result<Value, CliError> {
    let (file, flags) = parse(args, &["cache-dir"])?;
    let cache_dir = PathBuf::from(flag(&flags, "cache-dir").unwrap_or(DEFAULT_CACHE_DIR));
    let a = plexus_hooks::compile(&file, &cache_dir).map_err(|e| failed_err(&e))?;
    let artifact = plexus_hooks::artifact_path(&file, &cache_dir).map_err(|e| failed_err(&e))?;
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

fn run(args: &[String]) -> Result<Value, CliError> {
    let (file, flags) = parse(
        args,
        &[
            "kind",
            "input",
            "settings",
            "timeout-ms",
            "memory-limit-mib",
        ],
    )?;
    let kind: HookKind = flag(&flags, "kind")
        .ok_or_else(|| CliError::Usage("missing --kind".into()))?
        .parse()
        .map_err(CliError::Usage)?;
    let input = json_arg(
        flag(&flags, "input").ok_or_else(|| CliError::Usage("missing --input".into()))?,
        "--input",
    )?;
    let number = |name: &str| -> Result<Option<u64>, CliError> {
        flag(&flags, name)
            .map(|v| {
                v.parse()
                    .map_err(|_| CliError::Usage(format!("--{name} is not a number")))
            })
            .transpose()
    };
    let mut spec = HookSpec::new(hook_name(&file), kind, file.clone());
    spec.settings = flag(&flags, "settings")
        .map(|s| json_arg(s, "--settings"))
        .transpose()?;
    spec.timeout_ms = number("timeout-ms")?;
    spec.memory_limit_mib = number("memory-limit-mib")?;
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

const REGISTRY_FLAGS: [&str; 3] = ["insecure-registry", "registry-ca", "timeout-ms"];

fn registry_options(flags: &[(String, String)]) -> Result<RegistryOptions, CliError> {
    let mut opts = RegistryOptions {
        insecure: flags_named(flags, "insecure-registry")
            .map(String::from)
            .collect(),
        ca_files: flags_named(flags, "registry-ca")
            .map(PathBuf::from)
            .collect(),
        ..RegistryOptions::default()
    };
    if let Some(ms) = flag(flags, "timeout-ms") {
        let ms: u64 =
            ms.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                CliError::Usage("--timeout-ms needs a positive whole number".into())
            })?;
        opts.timeout = Duration::from_millis(ms);
    }
    Ok(opts)
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> Result<T, CliError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Failed(format!("tokio runtime: {e}")))?;
    Ok(rt.block_on(f))
}

fn push(args: &[String]) -> Result<Value, CliError> {
    let known: Vec<&str> = REGISTRY_FLAGS.iter().copied().chain(["key"]).collect();
    let (pos, flags) = parse_n(args, &known, &[], &["FILE", "REFERENCE"])?;
    let file = PathBuf::from(&pos[0]);
    let options = registry_options(&flags)?;
    let reference = distribution::parse_reference(&pos[1]).map_err(failed)?;
    // Only components this host can load as hooks are published.
    let inspected = plexus_hooks::inspect(&file).map_err(|e| failed_err(&e))?;
    if inspected.kinds.is_empty() {
        return Err(CliError::Failed(format!(
            "{} exports no plexus:hooks interface of version {} (exports: {})",
            file.display(),
            plexus_hooks::WIT_VERSION,
            inspected.exports.join(", ")
        )));
    }
    let key = flag(&flags, "key")
        .map(|k| distribution::load_signing_key(Path::new(k)))
        .transpose()
        .map_err(failed)?;
    let registry = Registry::new(&options).map_err(failed)?;
    let wasm =
        std::fs::read(&file).map_err(|e| CliError::Failed(format!("{}: {e}", file.display())))?;
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
    Ok(json!({
        "reference": format!("{}/{}@{digest}", reference.registry(), reference.repository()),
        "digest": digest,
        "sha256": inspected.sha256,
        "kinds": inspected.kinds,
        "signedBy": signed,
    }))
}

fn verify(args: &[String]) -> Result<Value, CliError> {
    let known: Vec<&str> = REGISTRY_FLAGS.iter().copied().chain(["key"]).collect();
    let (pos, flags) = parse_n(args, &known, &["unsigned"], &["REFERENCE"])?;
    let reference = distribution::parse_reference(&pos[0]).map_err(failed)?;
    let unsigned = flag(&flags, "unsigned").is_some();
    let key_files: Vec<PathBuf> = flags_named(&flags, "key").map(PathBuf::from).collect();
    if key_files.is_empty() && !unsigned {
        return Err(CliError::Usage(
            "give --key PUBLIC-PEM (or --unsigned)".into(),
        ));
    }
    let keys = TrustedKeys::load(&key_files).map_err(failed)?;
    let registry = Registry::new(&registry_options(&flags)?).map_err(failed)?;
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
