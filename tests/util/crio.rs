//! A private CRI-O (1.36, of the build of `tests/parts.sh`, with its `pinns`; Debian's conmon and runc) started for
//! one test, with plexus as its CNI plugin: the second runtime of the node tests ([`crate::runtime`]).
//!
//! Everything lives in a temp dir: storage (the `vfs` driver: no overlay mounts to leak), run state, the CRI socket,
//! the CNI bin and conf dirs, the signature policy and registries configuration; but the pods' namespaces are
//! where a node's CRI-O keeps them (`namespaces_dir` `/var/run`: `/var/run/netns/<uuid>`), which the DaemonSet's
//! daemon sees through its `/run/netns` mount. CRI-O has no
//! import of an image file: every image it runs comes from a registry, so each instance has its own
//! ([`crate::registry::Registry`], plain HTTP on loopback) serving the names under `plexus.test/` (the sandbox image
//! among them), and a registry a test names is trusted too.
//!
//! What differs from a production node, and why:
//! - runc is called through a wrapper (`runc-wrapper`, written at start) that changes two things of a container's
//!   OCI config, both for what the project's machines lack (the containerd tests tell containerd the same:
//!   `restrict_oom_score_adj`, `disable_cgroup`):
//!   - a negative `oom_score_adj` is raised to 0: root here has no `CAP_SYS_RESOURCE`, so runc cannot lower a
//!     process's score, and CRI-O gives every sandbox's infra container -998;
//!   - hugepage limits are dropped: the machines mount no hugetlb cgroup hierarchy, and kubelet gives every
//!     container a (zero) limit per page size, which runc then fails to set;
//!   - capabilities outside this process's bounding set are dropped: CRI-O gives a privileged container every
//!     capability it knows (containerd gives the ones its own process has), and runc cannot grant one it lacks.
//! - `pause_command` is empty: the infra container runs the suite's sandbox image's own entrypoint (busybox
//!   sleeping), not `/pause`.
//! - NRI is off (its socket would be the host's).
//!
//! Dropping a [`CriO`] stops and removes every sandbox it runs (the test's and a kubelet's), kills CRI-O and its
//! conmons, and unmounts what they left.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use crate::cri::{Cri, CriError};
use crate::registry::Registry;

/// How long a CRI call may take: RunPodSandbox runs plexus and every delegate.
const CRI_TIMEOUT: Duration = Duration::from_secs(60);

/// The prefix of image names each instance's own registry serves.
pub const IMAGE_PREFIX: &str = "plexus.test/";

/// What CRI-O makes on the host whatever its configuration says: containers/image's cache of blob metadata (a fixed
/// path for root), and pinns's directory of each kind of namespace beside `/var/run/netns`. Those that were not
/// there before the first instance of this process started are removed when the last one stops (the namespace
/// directories only if empty).
const HOST_DIRS: [&str; 5] = [
    "/var/lib/containers",
    "/var/run/ipcns",
    "/var/run/utsns",
    "/var/run/userns",
    "/var/run/pidns",
];

/// (instances running, the [`HOST_DIRS`] absent before the first).
static HOST_PATHS: Mutex<(usize, Vec<&str>)> = Mutex::new((0, Vec::new()));

pub struct CriO {
    dir: tempfile::TempDir,
    /// The runtime's process while it runs (a restart replaces it).
    child: std::sync::Mutex<Option<Child>>,
    sandboxes: Vec<String>,
    registry: Registry,
}

/// Fails the test with a message when CRI-O's build, conmon, runc, jq or busybox are missing; tests/setup.sh and
/// tests/parts.sh provide them.
pub fn available() -> bool {
    let missing: Vec<&str> = [
        "/usr/bin/conmon",
        "/usr/sbin/runc",
        "/usr/bin/jq",
        "/usr/bin/busybox",
    ]
    .into_iter()
    .filter(|p| !Path::new(p).exists())
    .collect();
    assert!(
        missing.is_empty(),
        "missing {missing:?}: run tests/setup.sh (apt-get install conmon runc jq busybox-static)"
    );
    crate::parts::bin("crio");
    crate::parts::bin("pinns");
    true
}

impl CriO {
    /// Starts CRI-O with `cni_bin` (plexus and the reference plugins) and `cni_conf` as its CNI directories, pulls
    /// the sandbox image and waits until its CRI answers. Images are also pulled from `registry` (`127.0.0.1:PORT`,
    /// plain HTTP) when one is given.
    /// It waits for an NRI plugin's answer for `nri_timeout` (`None`: CRI-O's own default, 2 s).
    pub fn start(
        cni_bin: &Path,
        cni_conf: &Path,
        registry: Option<&str>,
        nri_timeout: Option<Duration>,
    ) -> CriO {
        available();
        let dir = tempfile::Builder::new()
            .prefix("plx-crio-")
            .tempdir_in("/var/tmp")
            .expect("CRI-O dir");
        let root = dir.path();
        for sub in ["exits", "attach", "pods", "auth", "policies", "cdi"] {
            std::fs::create_dir_all(root.join(sub)).expect("a CRI-O dir");
        }
        let own = Registry::start();
        std::fs::write(
            root.join("policy.json"),
            r#"{"default": [{"type": "insecureAcceptAnything"}]}"#,
        )
        .expect("policy.json");
        let mut registries = format!(
            "[[registry]]\nprefix = \"{prefix}\"\nlocation = \"{addr}/{prefix}\"\ninsecure = true\n",
            prefix = IMAGE_PREFIX.trim_end_matches('/'),
            addr = own.addr
        );
        if let Some(addr) = registry {
            registries.push_str(&format!(
                "\n[[registry]]\nlocation = \"{addr}\"\ninsecure = true\n"
            ));
        }
        std::fs::write(root.join("registries.conf"), registries).expect("registries.conf");
        std::fs::write(
            root.join("runc-wrapper"),
            RUNC_WRAPPER.replace("@UNAVAILABLE_CAPS@", &unavailable_capabilities()),
        )
        .expect("runc-wrapper");
        std::fs::set_permissions(
            root.join("runc-wrapper"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod runc-wrapper");
        let nri_timeout = nri_timeout
            .map(|t| format!("nri_plugin_request_timeout = \"{}ms\"\n", t.as_millis()))
            .unwrap_or_default();
        let config = format!(
            r#"[crio]
root = "{root}/storage"
runroot = "{root}/runroot"
storage_driver = "vfs"
log_dir = "{root}/pods"
version_file = "{root}/version"
version_file_persist = "{root}/version-persist"
clean_shutdown_file = "{root}/clean.shutdown"

[crio.api]
listen = "{root}/crio.sock"
stream_address = "127.0.0.1"

[crio.runtime]
default_runtime = "runc"
conmon = "/usr/bin/conmon"
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
pinns_path = "{pinns}"
namespaces_dir = "/var/run"
container_exits_dir = "{root}/exits"
container_attach_socket_dir = "{root}/attach"
hooks_dir = []
cdi_spec_dirs = ["{root}/cdi"]
decryption_keys_path = "{root}/keys"

[crio.runtime.runtimes.runc]
runtime_path = "{root}/runc-wrapper"
runtime_root = "{root}/runc"

[crio.image]
pause_image = "{IMAGE_PREFIX}pause:1"
pause_command = ""
signature_policy = "{root}/policy.json"
signature_policy_dir = "{root}/policies"
namespaced_auth_dir = "{root}/auth"

[crio.network]
network_dir = "{conf}"
plugin_dirs = ["{bin}"]

# NRI as on a real node (CRI-O enables it by default), on this CRI-O's own socket.
[crio.nri]
enable_nri = true
nri_listen = "{root}/nri/nri.sock"
{nri_timeout}"#,
            root = root.display(),
            pinns = crate::parts::bin("pinns").display(),
            bin = cni_bin.display(),
            conf = cni_conf.display(),
        );
        std::fs::write(root.join("crio.conf"), config).expect("crio.conf");
        {
            let mut host = HOST_PATHS.lock().unwrap_or_else(|e| e.into_inner());
            if host.0 == 0 {
                host.1 = HOST_DIRS
                    .into_iter()
                    .filter(|d| !Path::new(d).exists())
                    .collect();
            }
            host.0 += 1;
        }
        let c = CriO {
            dir,
            child: std::sync::Mutex::new(None),
            sandboxes: Vec::new(),
            registry: own,
        };
        c.spawn();
        c.load_image(
            crate::containerd::pause_image(),
            &format!("{IMAGE_PREFIX}pause:1"),
        );
        c
    }

    /// CRI-O's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.lock().unwrap().as_ref().map(Child::id)
    }

    /// CRI-O's NRI socket (its own, not the host's), where an external NRI plugin connects; alone in its directory,
    /// which a plugin's pod mounts.
    pub fn nri_socket(&self) -> PathBuf {
        self.dir.path().join("nri/nri.sock")
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("crio.sock")
    }

    /// CRI-O's storage root (its images and the containers' root file systems).
    pub fn storage(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// CRI-O's own log (its stderr): what it says about CNI calls.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("crio.log")).unwrap_or_default()
    }

    /// Puts the image of an OCI layout tar into CRI-O's storage as `name` (under [`IMAGE_PREFIX`]): pushed to this
    /// instance's registry, then pulled through the CRI (crictl, at most 120 s).
    pub fn load_image(&self, layout_tar: &Path, name: &str) {
        let path = name
            .strip_prefix(IMAGE_PREFIX)
            .unwrap_or_else(|| panic!("{name}: CRI-O's images are named {IMAGE_PREFIX}..."));
        let (repository, tag) = path.rsplit_once(':').unwrap_or((path, "latest"));
        self.registry
            .push_layout(layout_tar, &format!("{IMAGE_PREFIX}{repository}"), tag);
        let out = self.crictl(&["pull", name]);
        assert!(
            out.status.success(),
            "crictl pull {name}: {}\nCRI-O: {}",
            String::from_utf8_lossy(&out.stderr),
            crate::tail(&self.dir.path().join("crio.log"), 20)
        );
    }

    /// `crictl ARGS` against this CRI-O (at most 120 s).
    pub fn crictl(&self, args: &[&str]) -> std::process::Output {
        let endpoint = format!("unix://{}", self.socket().display());
        Command::new("timeout")
            .arg("120")
            .arg(crate::parts::bin("crictl"))
            .arg(format!("--runtime-endpoint={endpoint}"))
            .arg(format!("--image-endpoint={endpoint}"))
            .args(args)
            // crictl looks for a config file in its working directory's parent otherwise.
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("run crictl")
    }

    fn spawn(&self) {
        let root = self.dir.path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(root.join("crio.log"))
            .expect("CRI-O log");
        let child = Command::new(crate::parts::bin("crio"))
            .arg("--config")
            .arg(root.join("crio.conf"))
            .args(["--config-dir", ""])
            .arg("--registries-conf")
            .arg(root.join("registries.conf"))
            .arg("--registries-conf-dir")
            .arg(root.join("registries.d"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start crio");
        *self.child.lock().unwrap() = Some(child);
        crate::cri::wait_until_serving(&self.socket(), "CRI-O", || self.log());
    }

    /// kill -9 of CRI-O (its conmons and sandboxes live on, as on a real node), then a fresh start on the same
    /// state.
    pub fn restart(&self) {
        crate::kill_child(&self.child);
        self.spawn();
    }

    /// The node powered off, as far as CRI-O goes: CRI-O, its conmons and every container of it killed (kill -9),
    /// and what lives in `/run` gone: its run root, its version file (how CRI-O tells a reboot), the runc state of
    /// its containers, their mounts. Its storage stays, as a disk does. [`CriO::power_on`] starts it again.
    pub fn power_off(&self) {
        crate::kill_child(&self.child);
        let root = self.dir.path();
        let ours = root.display().to_string();
        crate::runc_power_off(&root.join("runc"), &ours);
        crate::kill_processes_naming(&ours);
        crate::unmount_under(&ours);
        for gone in ["runroot", "runc", "version"] {
            let path = root.join(gone);
            let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
        }
    }

    /// CRI-O started after [`CriO::power_off`], on the same storage.
    pub fn power_on(&self) {
        self.spawn();
    }

    pub fn cri(&self) -> Cri {
        Cri::connect(&self.socket(), CRI_TIMEOUT).expect("connect to CRI-O's CRI")
    }

    /// RunPodSandbox, remembered so that drop removes it if the test does not.
    pub fn run_pod_sandbox(
        &mut self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<String, CriError> {
        let id = self.cri().run_pod_sandbox(namespace, name, uid)?;
        self.sandboxes.push(id.clone());
        Ok(id)
    }
}

/// runc with a container's negative `oom_score_adj` raised to 0, its hugepage limits dropped and the capabilities
/// this machine's root lacks taken out of each set (see the module's doc): on `create`, the bundle's config.json is
/// rewritten with jq before runc reads it.
const RUNC_WRAPPER: &str = r#"#!/bin/sh
# rewrite FILE JQ-FILTER: FILE through the filter, in place.
rewrite() { jq -c "$2" "$1" > "$1.plexus" && mv "$1.plexus" "$1"; }
drop_caps='map_values(map(select(IN(@UNAVAILABLE_CAPS@[]) | not)))'
bundle=; create=; process=; prev=
for a in "$@"; do
  case "$prev" in --bundle|-b) bundle=$a ;; --process|-p) process=$a ;; esac
  case "$a" in create) create=1 ;; --bundle=*) bundle=${a#--bundle=} ;; --process=*) process=${a#--process=} ;; esac
  prev=$a
done
if [ -n "$create" ] && [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
  rewrite "$bundle/config.json" "if (.process.oomScoreAdj // 0) < 0 then .process.oomScoreAdj = 0 else . end
    | del(.linux.resources.hugepageLimits)
    | if .process.capabilities then .process.capabilities |= $drop_caps else . end"
fi
# exec (a probe, kubectl exec) gives its process as a file of its own.
if [ -n "$process" ] && [ -f "$process" ]; then
  rewrite "$process" "if .capabilities then .capabilities |= $drop_caps else . end"
fi
exec /usr/sbin/runc "$@"
"#;

/// The capabilities of Linux 6.x by number.
const CAPABILITIES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// The capabilities outside this process's bounding set (`CapBnd` of /proc/self/status), as a JSON array of names.
fn unavailable_capabilities() -> String {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let bounding = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .expect("CapBnd in /proc/self/status");
    let names: Vec<&str> = CAPABILITIES
        .iter()
        .enumerate()
        .filter(|(bit, _)| bounding & (1 << bit) == 0)
        .map(|(_, name)| *name)
        .collect();
    serde_json::to_string(&names).expect("names as JSON")
}

impl Drop for CriO {
    fn drop(&mut self) {
        if self.pid().is_some() {
            crate::cri::remove_every_sandbox(&self.socket(), &self.sandboxes);
        }
        crate::kill_child(&self.child);
        // conmons outlive CRI-O by design; their command lines name paths in our dir.
        let root = self.dir.path().display().to_string();
        crate::kill_processes_naming(&root);
        // Containers conmon was making when killed: their runc state, and a first process waiting to start.
        crate::runc_power_off(&self.dir.path().join("runc"), &root);
        // Mounts left under our dir (shm, the containers' root file systems), deepest first.
        crate::unmount_under(&root);
        let mut host = HOST_PATHS.lock().unwrap_or_else(|e| e.into_inner());
        host.0 -= 1;
        if host.0 == 0 {
            for d in std::mem::take(&mut host.1) {
                let _ = match d {
                    "/var/lib/containers" => std::fs::remove_dir_all(d),
                    _ => std::fs::remove_dir(d),
                };
            }
        }
    }
}
