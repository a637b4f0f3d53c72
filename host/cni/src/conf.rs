//! The plexus CNI configuration (design.md, "The plexus CNI configuration"): raw form, then validated.

use std::path::{Path, PathBuf};
use std::time::Duration;

use plexus_cluster::KubeSettings;
use plexus_core::cni::CniVersion;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::PlexusError;

/// What the runtime put on stdin, as it came.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConf {
    cni_version: Option<String>,
    /// The network's name: plexus does not use it, but a conf whose `name` is not a string is not a conf
    /// (`null` included, hence `present`).
    #[serde(default, deserialize_with = "present")]
    name: Option<Value>,
    cluster_network: Option<String>,
    #[serde(default)]
    default_networks: Vec<String>,
    plexus_namespace: Option<String>,
    conf_dir: Option<PathBuf>,
    bin_dir: Option<PathBuf>,
    cache_dir: Option<PathBuf>,
    run_dir: Option<PathBuf>,
    cluster: Option<Value>,
    daemon: Option<Value>,
    readiness_indicator_file: Option<PathBuf>,
    readiness_timeout_ms: Option<u64>,
    device_info_dir: Option<PathBuf>,
    device_plugin_info_dir: Option<PathBuf>,
    pod_resources_socket: Option<PathBuf>,
    delegate_timeout_ms: Option<u64>,
    invalid_selections: Option<String>,
    #[serde(default)]
    hooks: Vec<Value>,
    cluster_hooks: Option<bool>,
    dynamic_resource_allocation: Option<bool>,
    #[serde(default)]
    claim_cni_drivers: Vec<String>,
    #[serde(default)]
    class_cni_drivers: Vec<String>,
    log_level: Option<String>,
    log_file: Option<PathBuf>,
    #[serde(default)]
    runtime_config: Map<String, Value>,
    #[serde(rename = "cni.dev/valid-attachments")]
    valid_attachments: Option<Vec<ValidAttachment>>,
    compat: Option<String>,
    system_namespaces: Option<Vec<String>>,
}

/// How inputs written for Multus are read (`"compat"`; docs/migrating-from-multus.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compat {
    /// The standard's reading, and Plexus's own choices where it is silent.
    #[default]
    Strict,
    /// What worked under Multus works: NAD configs without `cniVersion`, the pod's
    /// `v1.multus-cni.io/default-network`, `systemNamespaces`, a directory as `clusterNetwork`, unknown keys of a
    /// selection element ignored. Where the standard decides a case, its answer holds here too.
    Multus,
}

/// A key that is in the object, whatever its value (`null` too, which `Option` alone would take for absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// A `(containerID, ifname)` pair the runtime still uses (CNI 1.1 GC).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ValidAttachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// Where pods and NADs come from.
#[derive(Debug, Clone, PartialEq)]
pub enum ClusterSource {
    /// No cluster source: only the cluster network is attached.
    None,
    Files {
        dir: PathBuf,
    },
    /// The Kubernetes API, with the source's own settings (kubeconfig, timeouts, ...).
    Kube(KubeSettings),
}

/// Where the node daemon listens, and how long an ADD waits for one of its answers before it reads the API itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonRef {
    pub socket: PathBuf,
    pub timeout: Duration,
    /// Each invocation hands the daemon a report for its metrics after answering (`"report": false`: none).
    pub report: bool,
}

/// The default wait for the daemon: long enough for a pod the watch has not delivered yet, short against the
/// runtime's own timeouts.
pub const DAEMON_TIMEOUT_MS: u64 = 2000;

/// The validated plexus configuration.
#[derive(Debug, Clone)]
pub struct PlexusConf {
    pub cni_version: CniVersion,
    pub cluster_network: String,
    pub default_networks: Vec<String>,
    pub plexus_namespace: String,
    pub conf_dir: PathBuf,
    pub bin_dir: Option<PathBuf>,
    pub cache_dir: PathBuf,
    pub run_dir: PathBuf,
    pub cluster: ClusterSource,
    /// The node daemon an ADD asks first (with the kube source); `None` when switched off.
    pub daemon: Option<DaemonRef>,
    pub readiness_indicator_file: Option<PathBuf>,
    pub readiness_timeout: Duration,
    /// Where CNI device-info files live (Device Information Specification 4.2).
    pub device_info_dir: PathBuf,
    /// Where device plugins write theirs (Device Information Specification 4.1).
    pub device_plugin_info_dir: PathBuf,
    /// The kubelet PodResources API, asked for the devices of NADs with a resourceName.
    pub pod_resources_socket: PathBuf,
    pub delegate_timeout: Duration,
    pub ignore_invalid_selections: bool,
    pub hooks: Vec<Value>,
    /// Whether an ADD also runs the node's active hook set (published by the node agent from the cluster's
    /// NetworkHook resources) after the `hooks` of this file; an ADD is then refused (retryably) until a set is
    /// published. Default: with the kube cluster source.
    pub cluster_hooks: bool,
    /// Whether planning reads the pod's ResourceClaims (`"dynamicResourceAllocation"`, default true).
    pub dra: bool,
    /// The drivers whose claims (`claimCniDrivers`) and DeviceClasses (`classCniDrivers`) may carry a CNI
    /// configuration (default: none).
    pub carried_config_drivers: plexus_core::spec::dra::CarriedConfigDrivers,
    pub log_level: String,
    pub log_file: Option<PathBuf>,
    pub runtime_config: Map<String, Value>,
    pub valid_attachments: Option<Vec<ValidAttachment>>,
    pub compat: Compat,
    /// Under [`Compat::Multus`], the namespaces whose pods get no `defaultNetworks` (Multus's
    /// `systemNamespaces`); empty otherwise.
    pub system_namespaces: Vec<String>,
}

/// The range `delegateTimeoutMs` may take: below it no real plugin finishes (0 or 1 would fail every call), above
/// it a hung delegate would hold the container's lock past any runtime's own timeout.
pub const DELEGATE_TIMEOUT_MS: std::ops::RangeInclusive<u64> = 100..=3_600_000;

/// The longest an ADD may wait for the readiness indicator (a runtime gives up on the sandbox long before).
pub const MAX_READINESS_TIMEOUT_MS: u64 = 3_600_000;
/// `cacheDir` when the conf does not set it; also where the node agent keeps the hooks it delivers.
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/plexus";
/// `runDir` when the conf does not set it: the containers' locks and the node daemon's socket.
pub const DEFAULT_RUN_DIR: &str = "/run/plexus";
/// The node daemon's socket in the `runDir` when `daemon.socket` is not set.
pub const DAEMON_SOCKET_NAME: &str = "daemon.sock";

fn absolute(key: &str, p: PathBuf) -> Result<PathBuf, PlexusError> {
    if p.is_absolute() {
        Ok(p)
    } else {
        Err(PlexusError::config(
            key,
            format!("must be an absolute path, got {:?}", p.display()),
        ))
    }
}

/// The `daemon` key: `false` switches the daemon off; an object may set `socket`, `timeoutMs` and `report`.
fn daemon_ref(raw: Option<Value>, run_dir: &Path) -> Result<Option<DaemonRef>, PlexusError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Raw {
        socket: Option<PathBuf>,
        timeout_ms: Option<u64>,
        report: Option<bool>,
    }
    let raw = match raw {
        Some(Value::Bool(false)) => return Ok(None),
        None | Some(Value::Bool(true)) => Raw {
            socket: None,
            timeout_ms: None,
            report: None,
        },
        Some(v) => serde_json::from_value(v).map_err(|e| {
            PlexusError::config("daemon", format!("{e} (expected false or an object)"))
        })?,
    };
    let timeout_ms = raw.timeout_ms.unwrap_or(DAEMON_TIMEOUT_MS);
    if !(1..=60_000).contains(&timeout_ms) {
        return Err(PlexusError::config(
            "daemon.timeoutMs",
            format!("must be between 1 and 60000, got {timeout_ms}"),
        ));
    }
    Ok(Some(DaemonRef {
        socket: match raw.socket {
            Some(p) => absolute("daemon.socket", p)?,
            None => run_dir.join(DAEMON_SOCKET_NAME),
        },
        timeout: Duration::from_millis(timeout_ms),
        report: raw.report.unwrap_or(true),
    }))
}

/// Whether a file name is a CNI conf file as runtimes list them (`.conf`, `.conflist`, `.json`), and not a hidden
/// one (installers write hidden temporary files before renaming them).
pub fn is_conf_file(name: &str) -> bool {
    !name.starts_with('.')
        && [".conf", ".conflist", ".json"]
            .iter()
            .any(|ext| name.ends_with(ext))
}

/// Whether a conf (or conflist) is Plexus's own: its (first) plugin's type is `plexus`. Never a cluster network.
pub fn is_plexus_conf(conf: &Value) -> bool {
    let ty = conf.pointer("/plugins/0/type").or_else(|| conf.get("type"));
    ty.and_then(Value::as_str) == Some("plexus")
}

/// The most bytes of network configuration plexus reads from stdin (a conf with a large prevResult is tens of
/// KiB).
pub const STDIN_CAP: usize = 4 << 20;

/// The file at `path`, at most `cap` bytes: a larger one is an `InvalidData` error naming the limit, not read
/// whole. For files plexus reads but does not write (network confs, plugins' device-info files).
pub fn read_capped(path: &Path, cap: usize) -> std::io::Result<Vec<u8>> {
    read_to_cap(std::fs::File::open(path)?, cap)
}

/// Everything `from` gives, at most `cap` bytes: more is an `InvalidData` error naming the limit, and is not read.
pub fn read_to_cap(from: impl std::io::Read, cap: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    from.take(cap as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > cap {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {cap} bytes"),
        ));
    }
    Ok(bytes)
}

/// Replaces the file at `path` with `contents`, mode `mode`, as one step: a temp file in the same directory
/// (unnamed, or hidden, until committed, so nobody scanning the directory sees half a file), synced, renamed over
/// `path`, the directory synced. For files written rarely that must survive a crash or reboot whole.
pub fn replace_file(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    use atomic_write_file::unix::OpenOptionsExt as _;
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let mut f = atomic_write_file::AtomicWriteFile::options()
        .mode(mode)
        .preserve_mode(false)
        .open(path)?;
    f.write_all(contents)?;
    // The mode asked for, whatever the umask.
    f.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))?;
    f.commit()
}

/// Stdin as a JSON object: what every command but VERSION needs, and where VERSION finds the
/// `cniVersion` to answer in. Parsed once per invocation.
pub fn stdin_json(stdin: &[u8]) -> Result<Value, PlexusError> {
    if stdin.len() > STDIN_CAP {
        return Err(PlexusError::Decode(format!(
            "network configuration on stdin is larger than {STDIN_CAP} bytes"
        )));
    }
    if stdin.iter().all(u8::is_ascii_whitespace) {
        return Err(PlexusError::Decode(
            "empty network configuration on stdin".into(),
        ));
    }
    let value: Value = serde_json::from_slice(stdin).map_err(|e| {
        PlexusError::Decode(format!(
            "network configuration on stdin is not valid JSON: {e}"
        ))
    })?;
    if !value.is_object() {
        return Err(PlexusError::Decode(
            "network configuration on stdin is not a JSON object".into(),
        ));
    }
    Ok(value)
}

/// `invalidSelections`: what an ADD does with a selection element it cannot read.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum InvalidSelections {
    #[default]
    Fail,
    Ignore,
}

/// `cluster.source`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum SourceKind {
    Files,
    Kube,
}

/// The value of `key`, one of the names of the enum `T` (its serde names): absent is `T`'s default.
fn choice<T: serde::de::DeserializeOwned + Default>(
    key: &str,
    value: Option<String>,
) -> Result<T, PlexusError> {
    value.map_or(Ok(T::default()), |v| named(key, v))
}

/// `value`, the value of `key`, as the variant of the enum `T` it names; another name is an error naming the key
/// and the names it may take.
fn named<T: serde::de::DeserializeOwned>(key: &str, value: String) -> Result<T, PlexusError> {
    use serde::de::IntoDeserializer as _;
    T::deserialize(value.into_deserializer())
        .map_err(|e: serde::de::value::Error| PlexusError::config(key, e))
}

/// A duration in milliseconds at `key`: `default` when absent, an error naming the key outside `range`.
fn millis(
    key: &str,
    value: Option<u64>,
    default: u64,
    range: std::ops::RangeInclusive<u64>,
) -> Result<Duration, PlexusError> {
    let ms = value.unwrap_or(default);
    if !range.contains(&ms) {
        return Err(PlexusError::config(
            key,
            format!(
                "must be between {} and {}, got {ms}",
                range.start(),
                range.end()
            ),
        ));
    }
    Ok(Duration::from_millis(ms))
}

/// The absolute path at `key`, or `default` when absent.
fn path_or(key: &str, value: Option<PathBuf>, default: &str) -> Result<PathBuf, PlexusError> {
    absolute(key, value.unwrap_or_else(|| default.into()))
}

/// The absolute path at `key`, if set.
fn optional_path(key: &str, value: Option<PathBuf>) -> Result<Option<PathBuf>, PlexusError> {
    value.map(|p| absolute(key, p)).transpose()
}

/// Refuses a whole conflist on stdin, with how to get the one conf from it.
fn refuse_conflist(value: &Value) -> Result<(), PlexusError> {
    if value.get("plugins").is_some_and(Value::is_array) && value.get("type").is_none() {
        return Err(PlexusError::config(
            "plugins",
            "stdin holds a whole conflist, but a CNI plugin reads one plugin's conf: the runtime hands plexus \
             its entry of the list (plugins[0] with the list's cniVersion and name added; by hand: \
             jq '.plugins[0] + {cniVersion, name}' LIST)",
        ));
    }
    Ok(())
}

/// `cniVersion`: required, and one plexus speaks.
fn cni_version(value: Option<String>) -> Result<CniVersion, PlexusError> {
    value
        .ok_or_else(|| PlexusError::config("cniVersion", "is missing"))?
        .parse()
        .map_err(|e: plexus_core::cni::UnsupportedVersion| PlexusError::Version(e.to_string()))
}

/// The `cluster` key: absent is the Kubernetes API inside a cluster and no source outside one; an object names its
/// `source` and that source's settings, typed here so that a misspelt key is named when the conf is read, whatever
/// the verb.
fn cluster_source(raw: Option<Value>, in_kubernetes: bool) -> Result<ClusterSource, PlexusError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Files {
        dir: Option<PathBuf>,
    }
    let mut m = match raw {
        None if in_kubernetes => return Ok(ClusterSource::Kube(KubeSettings::default())),
        None => return Ok(ClusterSource::None),
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(PlexusError::config(
                "cluster",
                format!("must be an object, got {other}"),
            ))
        }
    };
    let kind = match m.remove("source") {
        Some(Value::String(s)) => Some(named::<SourceKind>("cluster.source", s)?),
        None => None,
        Some(other) => {
            return Err(PlexusError::config(
                "cluster.source",
                format!("must be \"files\" or \"kube\", got {other}"),
            ))
        }
    };
    let settings = |source: &str, e: serde_json::Error| {
        PlexusError::config("cluster", format!("source \"{source}\": {e}"))
    };
    match kind {
        Some(SourceKind::Files) => {
            let files: Files =
                serde_json::from_value(Value::Object(m)).map_err(|e| settings("files", e))?;
            let dir = files.dir.ok_or_else(|| {
                PlexusError::config("cluster.dir", "is required for source \"files\"")
            })?;
            Ok(ClusterSource::Files {
                dir: absolute("cluster.dir", dir)?,
            })
        }
        Some(SourceKind::Kube) => {
            let mut settings: KubeSettings =
                serde_json::from_value(Value::Object(m)).map_err(|e| settings("kube", e))?;
            settings.node_credentials = true;
            Ok(ClusterSource::Kube(settings))
        }
        None => Err(PlexusError::config(
            "cluster.source",
            "must be \"files\" or \"kube\", got nothing",
        )),
    }
}

/// `systemNamespaces`: a Multus setting, `kube-system` by default under [`Compat::Multus`].
fn system_namespaces(compat: Compat, raw: Option<Vec<String>>) -> Result<Vec<String>, PlexusError> {
    match (compat, raw) {
        (Compat::Multus, None) => Ok(vec!["kube-system".to_string()]),
        (Compat::Multus, Some(list)) => Ok(list),
        (Compat::Strict, None) => Ok(Vec::new()),
        (Compat::Strict, Some(_)) => Err(PlexusError::config(
            "systemNamespaces",
            "is a Multus setting: it needs \"compat\": \"multus\"",
        )),
    }
}

/// `logLevel`: one of [`crate::logging::LEVELS`], `info` by default.
fn log_level(raw: Option<String>) -> Result<String, PlexusError> {
    let level = raw.unwrap_or_else(|| "info".into());
    if !crate::logging::is_level(&level) {
        return Err(PlexusError::config(
            "logLevel",
            format!(
                "{level:?} is not one of {}",
                crate::logging::LEVELS.join(", ")
            ),
        ));
    }
    Ok(level)
}

impl PlexusConf {
    /// The validated conf from stdin parsed by [`stdin_json`]. `in_kubernetes` says whether
    /// `KUBERNETES_SERVICE_HOST` was set (the default source).
    pub fn from_json(value: Value, in_kubernetes: bool) -> Result<Self, PlexusError> {
        refuse_conflist(&value)?;
        let raw: RawConf = serde_json::from_value(value)
            .map_err(|e| PlexusError::config("plexus configuration", e))?;
        let cni_version = cni_version(raw.cni_version)?;
        if let Some(name) = raw.name.as_ref().filter(|n| !n.is_string()) {
            return Err(PlexusError::config(
                "name",
                format!("must be a string, got {name}"),
            ));
        }
        let cluster_network = raw
            .cluster_network
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| PlexusError::config("clusterNetwork", "is required"))?;
        let cluster = cluster_source(raw.cluster, in_kubernetes)?;
        let run_dir = path_or("runDir", raw.run_dir, DEFAULT_RUN_DIR)?;
        let compat: Compat = choice("compat", raw.compat)?;
        // The node agent delivers hooks from the Kubernetes API: a node reading its cluster from there runs the
        // set it publishes (and waits for it); one reading files or nothing has no agent to wait for.
        let cluster_hooks = raw
            .cluster_hooks
            .unwrap_or(matches!(cluster, ClusterSource::Kube(_)));
        Ok(Self {
            compat,
            system_namespaces: system_namespaces(compat, raw.system_namespaces)?,
            cni_version,
            cluster_network,
            default_networks: raw.default_networks,
            plexus_namespace: raw.plexus_namespace.unwrap_or_else(|| "kube-system".into()),
            conf_dir: path_or("confDir", raw.conf_dir, "/etc/cni/plexus/net.d")?,
            bin_dir: optional_path("binDir", raw.bin_dir)?,
            cache_dir: path_or("cacheDir", raw.cache_dir, DEFAULT_CACHE_DIR)?,
            daemon: daemon_ref(raw.daemon, &run_dir)?,
            run_dir,
            cluster,
            readiness_indicator_file: optional_path(
                "readinessIndicatorFile",
                raw.readiness_indicator_file,
            )?,
            readiness_timeout: millis(
                "readinessTimeoutMs",
                raw.readiness_timeout_ms,
                30_000,
                0..=MAX_READINESS_TIMEOUT_MS,
            )?,
            device_info_dir: path_or(
                "deviceInfoDir",
                raw.device_info_dir,
                "/var/run/k8s.cni.cncf.io/devinfo/cni",
            )?,
            device_plugin_info_dir: path_or(
                "devicePluginInfoDir",
                raw.device_plugin_info_dir,
                crate::podresources::DEVICE_PLUGIN_INFO_DIR,
            )?,
            pod_resources_socket: path_or(
                "podResourcesSocket",
                raw.pod_resources_socket,
                crate::podresources::DEFAULT_SOCKET,
            )?,
            delegate_timeout: millis(
                "delegateTimeoutMs",
                raw.delegate_timeout_ms,
                120_000,
                DELEGATE_TIMEOUT_MS,
            )?,
            ignore_invalid_selections: matches!(
                choice("invalidSelections", raw.invalid_selections)?,
                InvalidSelections::Ignore
            ),
            hooks: raw.hooks,
            cluster_hooks,
            dra: raw.dynamic_resource_allocation.unwrap_or(true),
            carried_config_drivers: plexus_core::spec::dra::CarriedConfigDrivers {
                claim: raw.claim_cni_drivers,
                class: raw.class_cni_drivers,
            },
            log_level: log_level(raw.log_level)?,
            log_file: optional_path("logFile", raw.log_file)?,
            runtime_config: raw.runtime_config,
            valid_attachments: raw.valid_attachments,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_read_up_to_their_cap_and_refused_past_it() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, [b'x'; 16]).unwrap();
        assert_eq!(read_capped(&file, 16).unwrap().len(), 16);
        let err = read_capped(&file, 15).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("larger than 15 bytes"), "{err}");
    }

    fn parse(stdin: &[u8], in_kubernetes: bool) -> Result<PlexusConf, PlexusError> {
        PlexusConf::from_json(stdin_json(stdin)?, in_kubernetes)
    }

    #[test]
    fn defaults_and_required_keys() {
        let c = parse(
            br#"{"cniVersion":"1.0.0","name":"p","type":"plexus","clusterNetwork":"cbr0"}"#,
            false,
        )
        .unwrap();
        assert_eq!(c.plexus_namespace, "kube-system");
        assert_eq!(c.cache_dir, PathBuf::from("/var/lib/plexus"));
        assert_eq!(c.cluster, ClusterSource::None);
        let c = parse(br#"{"cniVersion":"1.0.0","clusterNetwork":"cbr0"}"#, true).unwrap();
        assert!(matches!(c.cluster, ClusterSource::Kube(_)));
        let e = parse(br#"{"cniVersion":"1.0.0"}"#, false).unwrap_err();
        assert_eq!(
            (e.cni_code(), e.to_string().as_str()),
            (7, "clusterNetwork: is required")
        );
        assert!(
            matches!(&e, PlexusError::Config { field, .. } if field == "clusterNetwork"),
            "{e:?}"
        );
        // A whole conflist on stdin says what a plugin reads instead.
        let list = br#"{"cniVersion":"1.0.0","name":"plexus","plugins":[{"type":"plexus","clusterNetwork":"c"}]}"#;
        let e = parse(list, false).unwrap_err();
        assert!(
            e.to_string().contains("stdin holds a whole conflist")
                && e.to_string().contains("plugins[0]"),
            "{e}"
        );
    }

    #[test]
    fn a_name_that_is_not_a_string_is_a_configuration_error() {
        for name in ["1", "[]", "{}", "true", "null"] {
            let text = format!(r#"{{"cniVersion":"1.0.0","name":{name},"clusterNetwork":"x"}}"#);
            let e = parse(text.as_bytes(), false).unwrap_err();
            assert_eq!(e.cni_code(), 7, "{name}: {e}");
            assert!(
                matches!(&e, PlexusError::Config { field, .. } if field == "name"),
                "{name}: {e:?}"
            );
            assert!(e.to_string().contains(name), "{e}");
        }
        assert!(parse(
            br#"{"cniVersion":"1.0.0","name":"plexus","clusterNetwork":"x"}"#,
            false
        )
        .is_ok());
    }

    #[test]
    fn the_cluster_block_is_typed_and_names_a_key_it_does_not_know() {
        let conf = |cluster: &str| {
            format!(r#"{{"cniVersion":"1.0.0","clusterNetwork":"x","cluster":{cluster}}}"#)
        };
        let c = parse(
            conf(r#"{"source":"kube","kubeconfig":"/k","deadlineMs":500,"events":false}"#)
                .as_bytes(),
            false,
        )
        .unwrap();
        let ClusterSource::Kube(k) = c.cluster else {
            panic!("not kube: {:?}", c.cluster)
        };
        assert_eq!(k.kubeconfig, Some(PathBuf::from("/k")));
        assert_eq!((k.deadline_ms, k.events, k.retries), (500, false, 5));
        let e = parse(
            conf(r#"{"source":"kube","deadlinMs":500}"#).as_bytes(),
            false,
        )
        .unwrap_err();
        assert_eq!(e.cni_code(), 7);
        assert!(e.to_string().contains("unknown field `deadlinMs`"), "{e}");
        let e = parse(
            conf(r#"{"source":"files","dir":"/d","dri":"/e"}"#).as_bytes(),
            false,
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown field `dri`"), "{e}");
        let e = parse(conf(r#"{"source":"kube","retries":"x"}"#).as_bytes(), false).unwrap_err();
        assert!(e.to_string().contains("cluster: source \"kube\""), "{e}");
    }

    #[test]
    fn bad_stdin_maps_to_the_right_codes() {
        assert_eq!(parse(b"", false).unwrap_err().cni_code(), 6);
        assert_eq!(parse(b"{nope", false).unwrap_err().cni_code(), 6);
        assert_eq!(
            parse(br#"{"cniVersion":"9.9.9","clusterNetwork":"x"}"#, false)
                .unwrap_err()
                .cni_code(),
            1
        );
        let e = parse(
            br#"{"cniVersion":"1.0.0","clusterNetwork":"x","cacheDir":"rel"}"#,
            false,
        )
        .unwrap_err();
        assert!(e.to_string().contains("cacheDir"), "{e}");
        for (extra, key) in [
            (r#""logFile":"plexus.log""#, "logFile"),
            (
                r#""readinessIndicatorFile":"ready""#,
                "readinessIndicatorFile",
            ),
            (r#""delegateTimeoutMs":0"#, "delegateTimeoutMs"),
            (r#""delegateTimeoutMs":1"#, "delegateTimeoutMs"),
            (r#""delegateTimeoutMs":86400000"#, "delegateTimeoutMs"),
            (r#""readinessTimeoutMs":86400000"#, "readinessTimeoutMs"),
            (r#""invalidSelections":"maybe""#, "invalidSelections"),
            (r#""compat":"calico""#, "compat"),
            (r#""logLevel":"loud""#, "logLevel"),
            (r#""cluster":{"dir":"/d"}"#, "cluster.source"),
            (r#""cluster":{"source":7}"#, "cluster.source"),
        ] {
            let text = format!(r#"{{"cniVersion":"1.0.0","clusterNetwork":"x",{extra}}}"#);
            let e = parse(text.as_bytes(), false).unwrap_err();
            assert_eq!(e.cni_code(), 7, "{e}");
            assert!(e.to_string().contains(key), "{e}");
        }
        let big = vec![b' '; STDIN_CAP + 1];
        let e = parse(&big, false).unwrap_err();
        assert!(e.to_string().contains("larger than"), "{e}");
        let e = parse(
            br#"{"cniVersion":"1.0.0","clusterNetwork":"x","cluster":{"source":"etcd"}}"#,
            false,
        )
        .unwrap_err();
        assert!(e.to_string().contains("etcd"), "{e}");
    }
}
