//! One CNI invocation: the `CNI_*` environment and stdin, parsed in two steps (raw, then validated).

use std::collections::BTreeMap;
use std::path::PathBuf;

use plexus_core::cni::CniArgs;
use plexus_core::spec::naming::{validate_container_id, validate_ifname};
use plexus_core::spec::PodRef;

use crate::cache::{AttachmentPlan, RuntimeContext};
use crate::conf::PlexusConf;
use crate::error::{bounded, PlexusError};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Status,
    Gc,
}

impl Command {
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Status => "STATUS",
            Command::Gc => "GC",
        }
    }
}

/// The longest container id accepted: it names files (`<id>.json`, `.<id>.json.tmp`, `<id>.lock`) whose names
/// the filesystem limits to 255 bytes. Runtimes use 64 hex digits.
pub const MAX_CONTAINER_ID: usize = 200;

/// The longest `CNI_ARGS` accepted.
pub const MAX_CNI_ARGS: usize = 64 << 10;

/// Kubernetes' own limits on the pod identity the runtime passes (a namespace is a DNS label, a name a DNS
/// subdomain); longer values cannot name a pod, and would be echoed into every message.
const POD_ARG_LIMITS: [(&str, usize); 3] = [
    ("K8S_POD_NAMESPACE", 63),
    ("K8S_POD_NAME", 253),
    ("K8S_POD_UID", 128),
];

/// A validated invocation. Everything below the entry point works from this value alone.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub container_id: String,
    pub netns: Option<String>,
    pub ifname: String,
    pub args: CniArgs,
    /// `binDir` (when configured) followed by `CNI_PATH`.
    pub path: Vec<PathBuf>,
    pub pod: Option<PodRef>,
    pub conf: PlexusConf,
    /// The environment handed to delegates besides the `CNI_*` variables (e.g. PATH for iptables).
    pub base_env: Vec<(String, String)>,
    /// The conf and `CNI_*` values as the runtime gave them, recorded in the plan (see [`RuntimeContext`]).
    pub context: RuntimeContext,
    /// Who attaches the cluster network.
    pub cluster_by: ClusterBy,
}

/// Who attaches a pod's cluster network.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum ClusterBy {
    /// Plexus, as the runtime's CNI plugin: it runs the cluster network's delegates and tears them down.
    #[default]
    Plexus,
    /// The runtime's own CNI, before Plexus is called (the node daemon's NRI mode). The plan records the
    /// cluster network with this result (`None` for a DEL, which does not need it) as an external attachment:
    /// Plexus never runs or tears down its delegates.
    Runtime(Option<Value>),
}

/// The parts of the process environment Plexus reads.
pub fn command_of(env: &BTreeMap<String, String>) -> Result<Command, PlexusError> {
    match env.get("CNI_COMMAND").map(String::as_str) {
        Some("ADD") => Ok(Command::Add),
        Some("DEL") => Ok(Command::Del),
        Some("CHECK") => Ok(Command::Check),
        Some("VERSION") => Ok(Command::Version),
        Some("STATUS") => Ok(Command::Status),
        Some("GC") => Ok(Command::Gc),
        Some(other) => Err(PlexusError::Env(format!("unknown CNI_COMMAND {other:?}"))),
        None => Err(PlexusError::Env("CNI_COMMAND is not set".into())),
    }
}

impl Invocation {
    /// `pod ns/name`, or `container <id>` without a pod: how errors name what they happened to.
    pub fn pod_label(&self) -> String {
        self.pod.as_ref().map_or_else(
            || format!("container {}", self.container_id),
            |p| format!("pod {p}"),
        )
    }

    /// Builds an invocation for any command but VERSION from the environment and stdin, parsed by
    /// [`stdin_json`](crate::conf::stdin_json) (its error is reported after those of the environment).
    pub fn from_env(
        env: &BTreeMap<String, String>,
        stdin: Result<Value, PlexusError>,
    ) -> Result<Self, PlexusError> {
        let command = command_of(env)?;
        let per_container = matches!(command, Command::Add | Command::Del | Command::Check);
        let get = |k: &str| env.get(k).filter(|v| !v.is_empty()).cloned();
        let require = |k: &str| {
            get(k).ok_or_else(|| {
                PlexusError::Env(format!("{k} is required for {}", command.as_str()))
            })
        };

        let (container_id, ifname) = if per_container {
            let id = require("CNI_CONTAINERID")?;
            if id.len() > MAX_CONTAINER_ID {
                return Err(PlexusError::Env(format!(
                    "CNI_CONTAINERID is {} bytes long; at most {MAX_CONTAINER_ID} are accepted",
                    id.len()
                )));
            }
            validate_container_id(&id)
                .map_err(|e| PlexusError::Env(format!("CNI_CONTAINERID: {e}")))?;
            let ifname = require("CNI_IFNAME")?;
            validate_ifname(&ifname).map_err(|e| PlexusError::Env(format!("CNI_IFNAME: {e}")))?;
            (id, ifname)
        } else {
            (String::new(), String::new())
        };
        let netns = match command {
            Command::Add | Command::Check => Some(require("CNI_NETNS")?),
            _ => get("CNI_NETNS"),
        };
        let raw_args = env.get("CNI_ARGS").map(String::as_str).unwrap_or("");
        if raw_args.len() > MAX_CNI_ARGS {
            return Err(PlexusError::Env(format!(
                "CNI_ARGS is {} bytes long; at most {MAX_CNI_ARGS} are accepted",
                raw_args.len()
            )));
        }
        let args = CniArgs::parse(raw_args)
            .map_err(|e| PlexusError::Env(bounded(format!("CNI_ARGS: {e}"))))?;
        for (key, max) in POD_ARG_LIMITS {
            if let Some(len) = args.get(key).map(str::len).filter(|len| *len > max) {
                return Err(PlexusError::Env(format!(
                    "CNI_ARGS: {key} is {len} bytes long; Kubernetes allows at most {max}"
                )));
            }
        }
        let stdin = stdin?;
        let context = RuntimeContext {
            conf: stdin.clone(),
            ifname: ifname.clone(),
            args: raw_args.to_string(),
            cni_path: env.get("CNI_PATH").cloned().unwrap_or_default(),
            networks: None,
        };
        let conf = PlexusConf::from_json(stdin, env.contains_key("KUBERNETES_SERVICE_HOST"))?;
        let mut path: Vec<PathBuf> = conf.bin_dir.iter().cloned().collect();
        path.extend(
            env.get("CNI_PATH")
                .map(|p| std::env::split_paths(p).collect::<Vec<_>>())
                .unwrap_or_default(),
        );
        if path.is_empty() && command != Command::Gc {
            return Err(PlexusError::Env(
                "CNI_PATH is not set and no binDir is configured".into(),
            ));
        }
        let pod = match (args.get("K8S_POD_NAMESPACE"), args.get("K8S_POD_NAME")) {
            (Some(ns), Some(name)) if !ns.is_empty() && !name.is_empty() => Some(PodRef {
                namespace: ns.into(),
                name: name.into(),
                uid: args
                    .get("K8S_POD_UID")
                    .filter(|u| !u.is_empty())
                    .map(Into::into),
            }),
            _ => None,
        };
        let base_env = env
            .iter()
            .filter(|(k, _)| !k.starts_with("CNI_"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Ok(Self {
            container_id,
            netns,
            ifname,
            args,
            path,
            pod,
            conf,
            base_env,
            context,
            cluster_by: ClusterBy::Plexus,
        })
    }

    /// The ADD-time invocation of a sandbox whose plan recorded its runtime context, for a change of its
    /// attachments made later by the node daemon; `base_env` is the daemon's own environment for delegates.
    /// Validated as the runtime's was.
    pub fn of_plan(
        plan: &AttachmentPlan,
        base_env: &[(String, String)],
    ) -> Result<Self, PlexusError> {
        let ctx = plan.runtime.as_ref().ok_or_else(|| {
            PlexusError::config(
                format!("the plan of container {}", plan.container_id),
                "was made by an earlier version, without its runtime context",
            )
        })?;
        let mut env: BTreeMap<String, String> = base_env
            .iter()
            .filter(|(k, _)| !k.starts_with("CNI_"))
            .cloned()
            .collect();
        for (k, v) in [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", plan.container_id.as_str()),
            ("CNI_NETNS", plan.netns.as_deref().unwrap_or_default()),
            ("CNI_IFNAME", ctx.ifname.as_str()),
            ("CNI_ARGS", ctx.args.as_str()),
            ("CNI_PATH", ctx.cni_path.as_str()),
        ] {
            env.insert(k.into(), v.into());
        }
        let mut inv = Self::from_env(&env, Ok(ctx.conf.clone()))?;
        inv.context.networks = ctx.networks.clone();
        Ok(inv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conf::stdin_json;

    const CONF: &[u8] =
        br#"{"cniVersion":"1.0.0","name":"plexus","type":"plexus","clusterNetwork":"cbr0"}"#;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn add_needs_container_netns_ifname_path() {
        let full = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
            (
                "CNI_ARGS",
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=u1",
            ),
            ("PATH", "/usr/bin"),
        ];
        let inv = Invocation::from_env(&env(&full), stdin_json(CONF)).unwrap();
        assert_eq!(
            inv.pod,
            Some(PodRef {
                namespace: "ns".into(),
                name: "p".into(),
                uid: Some("u1".into())
            })
        );
        assert_eq!(
            inv.path,
            vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]
        );
        assert_eq!(
            inv.base_env,
            vec![("PATH".to_string(), "/usr/bin".to_string())]
        );
        for missing in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"] {
            let e: Vec<_> = full
                .iter()
                .copied()
                .filter(|(k, _)| *k != missing)
                .collect();
            let err = Invocation::from_env(&env(&e), stdin_json(CONF)).unwrap_err();
            assert_eq!(err.cni_code(), 4, "{missing}");
            assert!(err.to_string().contains(missing), "{err}");
        }
    }

    #[test]
    fn hostile_ids_and_unknown_commands_are_rejected() {
        let base = [
            ("CNI_NETNS", "/n"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/b"),
        ];
        let mut e = env(&base);
        e.insert("CNI_COMMAND".into(), "ADD".into());
        e.insert("CNI_CONTAINERID".into(), "../../etc/passwd".into());
        assert_eq!(
            Invocation::from_env(&e, stdin_json(CONF))
                .unwrap_err()
                .cni_code(),
            4
        );
        e.insert("CNI_CONTAINERID".into(), "ok".into());
        e.insert("CNI_IFNAME".into(), "eth0/../x".into());
        assert_eq!(
            Invocation::from_env(&e, stdin_json(CONF))
                .unwrap_err()
                .cni_code(),
            4
        );
        e.insert("CNI_COMMAND".into(), "FROB".into());
        let err = Invocation::from_env(&e, stdin_json(CONF)).unwrap_err();
        assert_eq!(
            (err.cni_code(), err.to_string()),
            (4, "unknown CNI_COMMAND \"FROB\"".to_string())
        );
    }

    #[test]
    fn oversized_ids_and_pod_names_are_refused_without_echoing_them() {
        let long = "a".repeat(1 << 20);
        let base = [
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/b"),
        ];
        let pod_args = format!("K8S_POD_NAMESPACE=ns;K8S_POD_NAME={long}");
        let just_too_long = format!("K8S_POD_NAMESPACE=ns;K8S_POD_NAME={}", "a".repeat(254));
        for (key, value, needle) in [
            ("CNI_CONTAINERID", long.as_str(), "CNI_CONTAINERID"),
            ("CNI_ARGS", pod_args.as_str(), "CNI_ARGS"),
            ("CNI_ARGS", just_too_long.as_str(), "K8S_POD_NAME"),
        ] {
            let mut e = env(&base);
            e.insert(key.into(), value.into());
            let err = Invocation::from_env(&e, stdin_json(CONF)).unwrap_err();
            assert_eq!(err.cni_code(), 4, "{err}");
            let msg = err.to_string();
            assert!(msg.contains(needle) && msg.len() < 200, "{msg}");
        }
    }

    #[test]
    fn del_does_not_need_netns() {
        let e = env(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/b"),
        ]);
        assert_eq!(
            Invocation::from_env(&e, stdin_json(CONF)).unwrap().netns,
            None
        );
    }
}
