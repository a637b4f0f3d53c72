//! Plexus as a CNI runtime towards its delegates: runs a configuration list the way libcni does.
//!
//! ADD runs the plugins in order, chaining `prevResult`; DEL runs them in reverse with the cached result;
//! CHECK runs them in order with the cached result; STATUS and GC go to lists of CNI 1.1.0.

use std::path::{Path, PathBuf};
use std::time::Duration;

use plexus_core::cni::{CniArgs, CniError, CniResult, CniVersion, NetworkConfigList};
use serde_json::{Map, Value};

use crate::error::{bounded, PlexusCode, PlexusError};
use crate::exec::{Exec, ExecRequest};
use crate::invocation::{Command, Invocation};

/// The runtime side of one attachment: the unique [container, network, ifname] tuple and its environment.
#[derive(Debug, Clone)]
pub struct RuntimeParams<'a> {
    pub container_id: &'a str,
    pub netns: Option<&'a str>,
    pub ifname: &'a str,
    pub args: &'a CniArgs,
    pub path: &'a [PathBuf],
    pub base_env: &'a [(String, String)],
    pub timeout: Duration,
}

impl<'a> RuntimeParams<'a> {
    /// The invocation's own container and namespace, on `ifname`.
    pub fn of(inv: &'a Invocation, ifname: &'a str) -> Self {
        Self {
            container_id: &inv.container_id,
            netns: inv.netns.as_deref(),
            ifname,
            args: &inv.args,
            path: &inv.path,
            base_env: &inv.base_env,
            timeout: inv.conf.delegate_timeout,
        }
    }
}

pub struct Delegator<'a> {
    pub exec: &'a dyn Exec,
}

/// How much of a delegate's stderr is kept in the log.
const STDERR_LOG_CAP: usize = 16 * 1024;

impl Delegator<'_> {
    pub fn add(
        &self,
        list: &NetworkConfigList,
        rt: &RuntimeParams<'_>,
        caps: &Map<String, Value>,
    ) -> Result<Value, PlexusError> {
        let mut prev: Option<Value> = None;
        for i in 0..list.plugins.len() {
            let conf = list.plugin_config(i, caps, prev.as_ref());
            let out = self.invoke(Command::Add, list, i, &conf, rt)?;
            let ty = plugin_type(list, i);
            let result = out.ok_or_else(|| {
                PlexusError::Decode(format!("plugin {ty:?} printed no result for ADD"))
            })?;
            CniResult::parse(&result).map_err(|e| {
                PlexusError::Decode(format!("plugin {ty:?} printed an invalid result: {e}"))
            })?;
            prev = Some(result);
        }
        prev.ok_or_else(|| {
            PlexusError::config(format!("network {:?}", list.name), "has no plugins")
        })
    }

    pub fn del(
        &self,
        list: &NetworkConfigList,
        rt: &RuntimeParams<'_>,
        caps: &Map<String, Value>,
        cached: Option<&Value>,
    ) -> Result<(), PlexusError> {
        // libcni passes the cached result to DEL only from 0.4.0 on.
        let prev = cached.filter(|_| list.cni_version >= CniVersion::V0_4_0);
        for i in (0..list.plugins.len()).rev() {
            // A plugin that cannot be found attached nothing (its ADD never ran) or is no longer installed;
            // failing DEL for it would leave the pod undeletable forever, so it is skipped with a warning.
            let plugin = match self.locate(&plugin_type(list, i), rt) {
                Ok(plugin) => plugin,
                Err(e) => {
                    tracing::warn!(network = %list.name, ifname = rt.ifname, "DEL skips a plugin: {e}");
                    continue;
                }
            };
            let conf = list.plugin_config(i, caps, prev);
            self.run_plugin(&plugin, Command::Del, list, i, &conf, rt)?;
        }
        Ok(())
    }

    /// CHECK; a list below 0.4.0 or with `disableCheck` is skipped (returns false).
    pub fn check(
        &self,
        list: &NetworkConfigList,
        rt: &RuntimeParams<'_>,
        caps: &Map<String, Value>,
        cached: &Value,
    ) -> Result<bool, PlexusError> {
        if list.disable_check || !list.cni_version.supports_check() {
            return Ok(false);
        }
        for i in 0..list.plugins.len() {
            let conf = list.plugin_config(i, caps, Some(cached));
            self.invoke(Command::Check, list, i, &conf, rt)?;
        }
        Ok(true)
    }

    /// STATUS for a 1.1.0 list; older lists cannot answer and count as available.
    pub fn status(
        &self,
        list: &NetworkConfigList,
        rt: &RuntimeParams<'_>,
    ) -> Result<(), PlexusError> {
        if !list.cni_version.supports_status_gc() {
            return Ok(());
        }
        for i in 0..list.plugins.len() {
            let conf = list.plugin_config(i, &Map::new(), None);
            self.invoke(Command::Status, list, i, &conf, rt)?;
        }
        Ok(())
    }

    /// GC for a 1.1.0 list without `disableGC`, telling it which attachments are still valid.
    pub fn gc(
        &self,
        list: &NetworkConfigList,
        rt: &RuntimeParams<'_>,
        valid: &[Value],
    ) -> Result<(), PlexusError> {
        if !list.cni_version.supports_status_gc() || list.disable_gc {
            return Ok(());
        }
        for i in 0..list.plugins.len() {
            let mut conf = list.plugin_config(i, &Map::new(), None);
            conf["cni.dev/valid-attachments"] = Value::Array(valid.to_vec());
            self.invoke(Command::Gc, list, i, &conf, rt)?;
        }
        Ok(())
    }

    /// The plugin binary for `ty` in the search path.
    ///
    /// Never plexus itself, by name or as the same file under another name: planning refuses such a delegate,
    /// and this holds for plans made before it did (DEL then skips it).
    fn locate(&self, ty: &str, rt: &RuntimeParams<'_>) -> Result<PathBuf, PlexusError> {
        let refused =
            |why: &str| PlexusError::config(format!("plugin type {ty:?}"), why.to_string());
        if plexus_core::cni::is_delegating_plugin_type(ty) {
            return Err(refused("is a delegating plugin; a delegate is never plexus itself or another delegating plugin"));
        }
        let found = self.exec.find(ty, rt.path).ok_or_else(|| {
            let dirs: Vec<_> = rt.path.iter().map(|p| p.display().to_string()).collect();
            PlexusError::PluginNotFound {
                plugin: ty.to_string(),
                path: dirs.join(":"),
            }
        })?;
        if is_this_executable(&found) {
            return Err(refused(
                "is this plexus binary under another name; a delegate is never plexus itself",
            ));
        }
        Ok(found)
    }

    fn invoke(
        &self,
        command: Command,
        list: &NetworkConfigList,
        index: usize,
        conf: &Value,
        rt: &RuntimeParams<'_>,
    ) -> Result<Option<Value>, PlexusError> {
        let plugin = self.locate(&plugin_type(list, index), rt)?;
        self.run_plugin(&plugin, command, list, index, conf, rt)
    }

    /// Runs the located binary of plugin `index` of `list` with `conf` on stdin.
    fn run_plugin(
        &self,
        plugin: &Path,
        command: Command,
        list: &NetworkConfigList,
        index: usize,
        conf: &Value,
        rt: &RuntimeParams<'_>,
    ) -> Result<Option<Value>, PlexusError> {
        let ty = plugin_type(list, index);
        let _p =
            tracing::debug_span!("phase", name = "exec", plugin = %ty, command = command.as_str())
                .entered();
        let env = delegate_env(command, rt)?;
        let stdin = serde_json::to_vec(conf).map_err(PlexusError::from)?;
        tracing::debug!(plugin = %plugin.display(), command = command.as_str(), network = %list.name, ifname = rt.ifname, "exec delegate");
        let out = self
            .exec
            .run(&ExecRequest {
                plugin,
                args: &[],
                env: &env,
                stdin: &stdin,
                timeout: rt.timeout,
            })
            .map_err(|source| PlexusError::Io {
                path: plugin.display().to_string(),
                source,
            })?;
        if !out.stderr.is_empty() {
            let text = String::from_utf8_lossy(&out.stderr[..out.stderr.len().min(STDERR_LOG_CAP)]);
            tracing::info!(plugin = %ty, command = command.as_str(), network = %list.name, "delegate stderr: {}", text.trim_end());
        }
        tracing::debug!(plugin = %ty, elapsed_ms = out.elapsed.as_secs_f64() * 1e3, "delegate done");
        delegate_outcome(&ty, command, rt.timeout, &out)
    }
}

/// The environment of a delegate run for `command`: the runtime's, with the CNI variables of this call.
fn delegate_env(
    command: Command,
    rt: &RuntimeParams<'_>,
) -> Result<Vec<(String, String)>, PlexusError> {
    let mut env: Vec<(String, String)> = rt.base_env.to_vec();
    env.push(("CNI_COMMAND".into(), command.as_str().into()));
    let path =
        std::env::join_paths(rt.path).map_err(|e| PlexusError::Env(format!("CNI_PATH: {e}")))?;
    env.push(("CNI_PATH".into(), path.to_string_lossy().into_owned()));
    if !matches!(command, Command::Status | Command::Gc) {
        env.push(("CNI_CONTAINERID".into(), rt.container_id.into()));
        env.push(("CNI_IFNAME".into(), rt.ifname.into()));
        env.push(("CNI_NETNS".into(), rt.netns.unwrap_or_default().into()));
        env.push(("CNI_ARGS".into(), delegate_args(rt.args)));
    }
    Ok(env)
}

/// What a delegate's run of `command` (type `ty`, given `timeout`) amounts to: its result (`None` when it printed
/// nothing), or its CNI error, or an error saying how it failed without one.
fn delegate_outcome(
    ty: &str,
    command: Command,
    timeout: Duration,
    out: &crate::exec::ExecOutput,
) -> Result<Option<Value>, PlexusError> {
    let failed = |code: PlexusCode, msg: String| PlexusError::Delegate {
        code: code.code(),
        msg,
        details: String::new(),
    };
    if out.timed_out {
        return Err(failed(
            PlexusCode::DelegateTimeout,
            format!(
                "plugin {ty:?} ({}) did not finish within {timeout:?} and was killed",
                command.as_str(),
            ),
        ));
    }
    if out.overflowed {
        return Err(failed(
            PlexusCode::DelegateFailed,
            format!(
                "plugin {ty:?} ({}) printed more than {} bytes on stdout and was killed",
                command.as_str(),
                crate::exec::STDOUT_CAP
            ),
        ));
    }
    if out.code != Some(0) {
        if let Ok(err) = CniError::parse_bytes(&out.stdout) {
            return Err(PlexusError::Delegate {
                code: err.code,
                // Bounded here, where the delegate's text enters: every log line and error built from it stays
                // small.
                msg: format!(
                    "plugin {ty:?} failed {}: {}",
                    command.as_str(),
                    bounded(err.msg)
                ),
                details: bounded(err.details),
            });
        }
        let status = out.code.map_or("killed by a signal".to_string(), |c| {
            format!("exit status {c}")
        });
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let hint = [stderr.trim(), stdout.trim()]
            .into_iter()
            .find(|s| !s.is_empty())
            .unwrap_or("no output");
        return Err(failed(
            PlexusCode::DelegateFailed,
            format!(
                "plugin {ty:?} failed {} ({status}) without a CNI error: {}",
                command.as_str(),
                truncate(hint, 512)
            ),
        ));
    }
    if out.stdout.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    serde_json::from_slice(&out.stdout).map(Some).map_err(|e| {
        PlexusError::Decode(format!(
            "plugin {ty:?} printed invalid JSON for {}: {e}",
            command.as_str()
        ))
    })
}

/// `CNI_ARGS` for a delegate: the runtime's, with `IgnoreUnknown=1` first unless the runtime gave one. Plugins
/// that load their args strictly (bridge, host-local, ...) otherwise fail on the `K8S_POD_*` keys the runtime
/// adds for plexus; Multus does the same.
fn delegate_args(args: &plexus_core::cni::CniArgs) -> String {
    if args.is_empty() || args.get("IgnoreUnknown").is_some() {
        return args.to_string();
    }
    format!("IgnoreUnknown=1;{args}")
}

/// Whether `path` is the running executable's file (a link or another name of it). The executable's identity is
/// read once per process, not once per delegate.
fn is_this_executable(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    static THIS: std::sync::OnceLock<Option<(u64, u64)>> = std::sync::OnceLock::new();
    let this = THIS.get_or_init(|| {
        std::fs::metadata("/proc/self/exe")
            .ok()
            .map(|m| (m.dev(), m.ino()))
    });
    match (this, std::fs::metadata(path)) {
        (Some(this), Ok(found)) => *this == (found.dev(), found.ino()),
        _ => false,
    }
}

fn plugin_type(list: &NetworkConfigList, index: usize) -> String {
    list.plugins[index]
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexus_core::cni::CniArgs;

    /// Answers every run with the same output.
    struct Canned(crate::exec::ExecOutput);

    impl Exec for Canned {
        fn run(&self, _: &ExecRequest<'_>) -> std::io::Result<crate::exec::ExecOutput> {
            Ok(self.0.clone())
        }
        fn find(&self, plugin: &str, _: &[PathBuf]) -> Option<PathBuf> {
            Some(PathBuf::from(plugin))
        }
    }

    #[test]
    fn a_delegates_long_error_is_bounded_where_it_enters() {
        let huge = "x".repeat(500_000);
        let err =
            serde_json::json!({"cniVersion": "1.0.0", "code": 7, "msg": huge, "details": huge});
        let exec = Canned(crate::exec::ExecOutput {
            code: Some(1),
            stdout: err.to_string().into_bytes(),
            ..Default::default()
        });
        let list = NetworkConfigList::parse(
            &serde_json::json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "p"}]}),
        )
        .unwrap();
        let args = CniArgs::new();
        let rt = RuntimeParams {
            container_id: "c1",
            netns: Some("/run/netns/x"),
            ifname: "eth0",
            args: &args,
            path: &[],
            base_env: &[],
            timeout: Duration::from_secs(1),
        };
        let e = Delegator { exec: &exec }
            .del(&list, &rt, &Map::new(), None)
            .unwrap_err();
        assert_eq!(e.cni_code(), 7);
        assert!(
            e.to_string().len() < 2 * crate::error::MESSAGE_CAP,
            "{}",
            e.to_string().len()
        );
        assert!(e.details().len() <= crate::error::MESSAGE_CAP);
    }

    #[test]
    fn delegates_get_ignore_unknown_unless_the_runtime_set_it() {
        let args = |s: &str| delegate_args(&CniArgs::parse(s).unwrap());
        assert_eq!(
            args("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p"),
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p"
        );
        assert_eq!(
            args("IgnoreUnknown=0;K8S_POD_NAME=p"),
            "IgnoreUnknown=0;K8S_POD_NAME=p"
        );
        assert_eq!(
            args("K8S_POD_NAME=p;IgnoreUnknown=true"),
            "K8S_POD_NAME=p;IgnoreUnknown=true"
        );
        assert_eq!(args(""), "");
    }

    /// Runs nothing: counts the runs, and finds plugins as the real lookup does.
    #[derive(Default)]
    struct Counting(std::cell::Cell<usize>);

    impl Exec for Counting {
        fn run(&self, _: &ExecRequest<'_>) -> std::io::Result<crate::exec::ExecOutput> {
            self.0.set(self.0.get() + 1);
            Ok(crate::exec::ExecOutput {
                code: Some(0),
                stdout: br#"{"cniVersion":"1.0.0"}"#.to_vec(),
                ..Default::default()
            })
        }
    }

    #[test]
    fn a_delegate_is_never_plexus_itself_by_name_or_as_another_name_of_this_file() {
        let dir = tempfile::tempdir().unwrap();
        let exe = std::env::current_exe().unwrap();
        std::os::unix::fs::symlink(&exe, dir.path().join("innocent")).unwrap();
        std::fs::hard_link(&exe, dir.path().join("plexus"))
            .or_else(|_| std::fs::copy(&exe, dir.path().join("plexus")).map(drop))
            .unwrap();
        let path = [dir.path().to_path_buf()];
        let args = CniArgs::new();
        let rt = RuntimeParams {
            container_id: "c1",
            netns: Some("/run/netns/x"),
            ifname: "net1",
            args: &args,
            path: &path,
            base_env: &[],
            timeout: Duration::from_secs(1),
        };
        for ty in ["plexus", "innocent", "multus"] {
            let list = NetworkConfigList::parse(
                &serde_json::json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": ty}]}),
            )
            .unwrap();
            let exec = Counting::default();
            let d = Delegator { exec: &exec };
            let err = d.add(&list, &rt, &Map::new()).unwrap_err().to_string();
            assert!(
                err.contains(ty) && err.contains("never plexus itself"),
                "{ty}: {err}"
            );
            // DEL of a plan that had one does not stick on it: it skips what it may not run.
            d.del(&list, &rt, &Map::new(), None).expect("DEL skips it");
            assert_eq!(exec.0.get(), 0, "{ty} never ran");
        }
    }
}
