//! A private CRI-O (1.36, of the build of `tests/parts.sh`, with its `pinns`; Debian's conmon and runc) started for
//! one test, with plexus as its CNI plugin: the second runtime of the node tests ([`crate::runtime`]).
//!
//! Everything lives in a temp dir: storage (the `vfs` driver: no overlay mounts to leak), run state, the CRI socket,
//! the pods' network namespaces (`namespaces_dir`: `<dir>/ns/netns/<uuid>`, where a node's CRI-O has
//! `/var/run/netns`), the CNI bin and conf dirs, the signature policy and registries configuration. CRI-O has no
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
//!     container a (zero) limit per page size, which runc then fails to set.
//! - `pause_command` is empty: the infra container runs the suite's sandbox image's own entrypoint (busybox
//!   sleeping), not `/pause`.
//! - NRI is off (its socket would be the host's).
//!
//! Dropping a [`CriO`] stops and removes every sandbox it runs (the test's and a kubelet's), kills CRI-O and its
//! conmons, and unmounts what they left.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::cri::{Cri, CriError};
use crate::registry::Registry;

/// How long a CRI call may take: RunPodSandbox runs plexus and every delegate.
const CRI_TIMEOUT: Duration = Duration::from_secs(60);

/// The prefix of image names each instance's own registry serves.
pub const IMAGE_PREFIX: &str = "plexus.test/";

/// containers/image keeps a cache of blob metadata at a fixed path for root, whatever CRI-O's storage root is.
/// Removed when the last instance of this process stops, if it was not there before the first started.
const BLOB_INFO_CACHE: &str = "/var/lib/containers/cache";

/// (instances running, whether [`BLOB_INFO_CACHE`]'s parent existed before the first).
static HOST_PATHS: Mutex<(usize, bool)> = Mutex::new((0, false));

pub struct CriO {
    dir: tempfile::TempDir,
    child: Option<Child>,
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
    pub fn start(cni_bin: &Path, cni_conf: &Path, registry: Option<&str>) -> CriO {
        available();
        let dir = tempfile::Builder::new()
            .prefix("plx-crio-")
            .tempdir_in("/var/tmp")
            .expect("CRI-O dir");
        let root = dir.path();
        for sub in ["ns", "exits", "attach", "pods", "auth", "policies", "cdi"] {
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
        std::fs::write(root.join("runc-wrapper"), RUNC_WRAPPER).expect("runc-wrapper");
        std::fs::set_permissions(
            root.join("runc-wrapper"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod runc-wrapper");
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
namespaces_dir = "{root}/ns"
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

[crio.nri]
enable_nri = false
"#,
            root = root.display(),
            pinns = crate::parts::bin("pinns").display(),
            bin = cni_bin.display(),
            conf = cni_conf.display(),
        );
        std::fs::write(root.join("crio.conf"), config).expect("crio.conf");
        {
            let mut host = HOST_PATHS.lock().unwrap_or_else(|e| e.into_inner());
            if host.0 == 0 {
                host.1 = Path::new(BLOB_INFO_CACHE)
                    .parent()
                    .is_some_and(Path::exists);
            }
            host.0 += 1;
        }
        let mut c = CriO {
            dir,
            child: None,
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
        self.child.as_ref().map(Child::id)
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("crio.sock")
    }

    /// CRI-O's own log (its stderr): what it says about CNI calls.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("crio.log")).unwrap_or_default()
    }

    /// Where CRI-O makes the pods' network namespaces (`netns/<uuid>` under it).
    pub fn namespaces_dir(&self) -> PathBuf {
        self.dir.path().join("ns")
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

    fn spawn(&mut self) {
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
        self.child = Some(child);
        // Ready when the CRI answers a status query for a sandbox that does not exist.
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(cri) = Cri::connect(&self.socket(), Duration::from_secs(2)) {
                if let Err(CriError(msg)) = cri.pod_sandbox_status("probe") {
                    if msg.contains("NotFound") || msg.contains("not found") {
                        return;
                    }
                }
            }
            assert!(
                Instant::now() < end,
                "CRI-O did not come up within 30 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// kill -9 of CRI-O (its conmons and sandboxes live on, as on a real node), then a fresh start on the same
    /// state.
    pub fn restart(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
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

/// runc with a container's negative `oom_score_adj` raised to 0 and its hugepage limits dropped (see the module's
/// doc): on `create`, the bundle's config.json is rewritten with jq before runc reads it.
const RUNC_WRAPPER: &str = r#"#!/bin/sh
bundle=; create=; prev=
for a in "$@"; do
  case "$prev" in --bundle|-b) bundle=$a ;; esac
  case "$a" in create) create=1 ;; --bundle=*) bundle=${a#--bundle=} ;; esac
  prev=$a
done
if [ -n "$create" ] && [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
  jq -c 'if (.process.oomScoreAdj // 0) < 0 then .process.oomScoreAdj = 0 else . end
         | del(.linux.resources.hugepageLimits)' \
    "$bundle/config.json" > "$bundle/config.json.plexus" && mv "$bundle/config.json.plexus" "$bundle/config.json"
fi
exec /usr/sbin/runc "$@"
"#;

impl Drop for CriO {
    fn drop(&mut self) {
        if self.child.is_some() {
            if let Ok(cri) = Cri::connect(&self.socket(), Duration::from_secs(10)) {
                // Those a kubelet ran too: their DEL releases what the CNI plugin attached.
                let mut ids = self.sandboxes.clone();
                for sandbox in cri.list_pod_sandboxes().unwrap_or_default() {
                    if !ids.contains(&sandbox.id) {
                        ids.push(sandbox.id);
                    }
                }
                for id in &ids {
                    let _ = cri.stop_pod_sandbox(id);
                    let _ = cri.remove_pod_sandbox(id);
                }
            }
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // conmons outlive CRI-O by design; their command lines name paths in our dir.
        let root = self.dir.path().display().to_string();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmd).contains(&root) {
                if let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() {
                    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                }
            }
        }
        // Mounts left under our dir (the pods' namespaces, shm), deepest first.
        crate::unmount_deepest_first(
            crate::mount_points()
                .into_iter()
                .filter(|m| m.starts_with(&root))
                .collect(),
        );
        let mut host = HOST_PATHS.lock().unwrap_or_else(|e| e.into_inner());
        host.0 -= 1;
        if host.0 == 0 && !host.1 {
            let _ = std::fs::remove_dir_all(
                Path::new(BLOB_INFO_CACHE)
                    .parent()
                    .expect("the cache's parent"),
            );
        }
    }
}
