//! A private containerd (2.x with its runc shim, of the build of `tests/parts.sh`; Debian's runc) started for one
//! test, with plexus as its CNI plugin.
//!
//! Everything lives in a temp dir: root, state, the gRPC socket, the CNI bin and conf dirs. No image can be
//! pulled here, so the sandbox ("pause") image is built by [`pause_image`] from Debian's static busybox and
//! imported. Dropping a [`Containerd`] stops and removes every sandbox it runs (the test's and a kubelet's),
//! kills containerd and its shims and unmounts what they left.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::cri::{Cri, CriError};

/// The name the sandbox image is imported under (`sandbox_image` in the CRI config).
pub const PAUSE_IMAGE: &str = "plexus.test/pause:1";

/// How long a CRI call may take: RunPodSandbox runs plexus and every delegate.
const CRI_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Containerd {
    dir: tempfile::TempDir,
    /// The runtime's process while it runs (a restart replaces it).
    child: std::sync::Mutex<Option<Child>>,
    sandboxes: Vec<String>,
    /// Where its Prometheus metrics are served (`127.0.0.1:PORT`, path `/v1/metrics`), when asked for.
    metrics: Option<String>,
}

/// Fails the test with a message when containerd's build, runc or busybox are missing; tests/setup.sh and
/// tests/parts.sh provide them.
pub fn available() -> bool {
    let missing: Vec<&str> = ["/usr/sbin/runc", "/usr/bin/busybox"]
        .into_iter()
        .filter(|p| !Path::new(p).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "missing {missing:?}: run tests/setup.sh (apt-get install runc busybox-static)"
    );
    crate::parts::bin("containerd-shim-runc-v2");
    true
}

/// `ctr` of the same build as containerd.
pub fn ctr_bin() -> PathBuf {
    crate::parts::bin("ctr")
}

impl Containerd {
    /// Starts containerd with `cni_bin` (plexus and the reference plugins) and `cni_conf` (plexus's conflist) as
    /// its CNI directories, imports the pause image and waits until its CRI answers.
    pub fn start(cni_bin: &Path, cni_conf: &Path) -> Containerd {
        Containerd::start_with(cni_bin, cni_conf, None)
    }

    /// [`Containerd::start`], pulling images from `registry` (`127.0.0.1:PORT`, plain HTTP) when one is given.
    pub fn start_with(cni_bin: &Path, cni_conf: &Path, registry: Option<&str>) -> Containerd {
        Containerd::start_nri(
            cni_bin,
            cni_conf,
            registry,
            Some(crate::runtime::TEST_NRI_TIMEOUT),
        )
    }

    /// [`Containerd::start_with`], waiting for an NRI plugin's answer for `nri_timeout` (`None`: containerd's own
    /// default, 2 s).
    pub fn start_nri(
        cni_bin: &Path,
        cni_conf: &Path,
        registry: Option<&str>,
        nri_timeout: Option<Duration>,
    ) -> Containerd {
        Containerd::start_config(cni_bin, cni_conf, registry, 1, false, nri_timeout)
    }

    /// [`Containerd::start`] serving its metrics on a loopback port ([`Containerd::metrics`]) and attaching the
    /// first `networks` CNI configurations of `cni_conf` (by file name) to every sandbox itself, one after another
    /// (`max_conf_num`, `setup_serially`): eth0, eth1, ...
    pub fn start_measured(cni_bin: &Path, cni_conf: &Path, networks: usize) -> Containerd {
        Containerd::start_config(cni_bin, cni_conf, None, networks, true, None)
    }

    fn start_config(
        cni_bin: &Path,
        cni_conf: &Path,
        registry: Option<&str>,
        networks: usize,
        metrics: bool,
        nri_timeout: Option<Duration>,
    ) -> Containerd {
        available();
        let dir = tempfile::Builder::new()
            .prefix("plx-containerd-")
            .tempdir_in("/var/tmp")
            .expect("containerd dir");
        let root = dir.path();
        let hosts = root.join("certs.d");
        if let Some(addr) = registry {
            let host = hosts.join(addr);
            std::fs::create_dir_all(&host).expect("certs.d");
            std::fs::write(
                host.join("hosts.toml"),
                format!("server = \"http://{addr}\"\n[host.\"http://{addr}\"]\n  capabilities = [\"pull\", \"resolve\", \"push\"]\n"),
            )
            .expect("hosts.toml");
        }
        // A free port, released for containerd to bind: only when asked for.
        let metrics = metrics.then(|| format!("127.0.0.1:{}", crate::kubeapi::free_port()));
        let metrics_section = metrics
            .as_ref()
            .map(|a| format!("\n[metrics]\n  address = \"{a}\"\n"))
            .unwrap_or_default();
        let nri_timeout = nri_timeout
            .map(|t| format!("  plugin_request_timeout = \"{}ms\"\n", t.as_millis()))
            .unwrap_or_default();
        let config = format!(
            r#"version = 3
root = "{root}/root"
state = "{root}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = "{root}/containerd.sock"
{metrics_section}
[ttrpc]
  address = "{root}/containerd.sock.ttrpc"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "native"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "{hosts}"

[plugins.'io.containerd.cri.v1.runtime']
  disable_cgroup = true
  restrict_oom_score_adj = true
  disable_apparmor = true
  cdi_spec_dirs = ["{root}/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{bin}"]
    conf_dir = "{conf}"
    max_conf_num = {networks}
    setup_serially = {serially}

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"

# What the transfer service (ctr images import, push) unpacks into, and where it finds registries.
[plugins.'io.containerd.transfer.v1.local']
  config_path = "{hosts}"
[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
  platform = "linux/amd64"
  snapshotter = "native"

# NRI is on by default in containerd 2: its socket is this containerd's own, not the host's.
[plugins.'io.containerd.nri.v1.nri']
  socket_path = "{root}/nri/nri.sock"
{nri_timeout}"#,
            root = root.display(),
            hosts = hosts.display(),
            bin = cni_bin.display(),
            conf = cni_conf.display(),
            serially = networks > 1,
        );
        std::fs::write(root.join("config.toml"), config).expect("containerd config");
        let c = Containerd {
            dir,
            child: std::sync::Mutex::new(None),
            sandboxes: Vec::new(),
            metrics,
        };
        c.spawn();
        let import = crate::image::ctr(
            &c,
            &[
                "images",
                "import",
                "--snapshotter",
                "native",
                &pause_image().display().to_string(),
            ],
        );
        assert!(
            import.status.success(),
            "ctr images import: {}",
            String::from_utf8_lossy(&import.stderr)
        );
        c
    }

    /// containerd's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.lock().unwrap().as_ref().map(Child::id)
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    /// containerd's NRI socket (its own, not the host's), where an external NRI plugin connects; alone in its directory,
    /// which a plugin's pod mounts.
    pub fn nri_socket(&self) -> PathBuf {
        self.dir.path().join("nri/nri.sock")
    }

    /// containerd's root directory (its content store and snapshots).
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// containerd's own log (its stderr): what it says about CNI calls.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// Its Prometheus metrics as text (`GET /v1/metrics`, at most 8 MiB, within 5 s).
    pub fn metrics(&self) -> Result<String, String> {
        use std::io::Read;
        let at = self.metrics.as_deref().ok_or(
            "containerd was started without metrics (Containerd::start_measured serves them)",
        )?;
        let fail = |e: std::io::Error| format!("containerd metrics at {at}: {e}");
        let addr: std::net::SocketAddr = at.parse().map_err(|e| format!("{e}"))?;
        let mut conn =
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(fail)?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(fail)?;
        conn.write_all(b"GET /v1/metrics HTTP/1.0\r\nHost: containerd\r\n\r\n")
            .map_err(fail)?;
        let mut body = Vec::new();
        conn.take(8 << 20).read_to_end(&mut body).map_err(fail)?;
        let text = String::from_utf8_lossy(&body);
        match text.split_once("\r\n\r\n") {
            Some((head, rest)) if head.starts_with("HTTP/1.") && head.contains(" 200 ") => {
                Ok(rest.to_string())
            }
            _ => Err(format!(
                "containerd metrics at {at}: {}",
                text.lines().next().unwrap_or("no answer")
            )),
        }
    }

    fn spawn(&self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("containerd.log"))
            .expect("containerd log");
        // The runc shim is found on PATH, beside containerd.
        let path = std::env::join_paths(std::iter::once(crate::parts::dir().to_path_buf()).chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ))
        .expect("PATH");
        let child = Command::new(crate::parts::bin("containerd"))
            .env("PATH", path)
            .arg("--config")
            .arg(self.dir.path().join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start containerd");
        *self.child.lock().unwrap() = Some(child);
        crate::cri::wait_until_serving(&self.socket(), "containerd", || self.log());
    }

    /// kill -9 of containerd (its shims and sandboxes live on, as on a real node), then a fresh start on the
    /// same state.
    pub fn restart(&self) {
        crate::kill_child(&self.child);
        self.spawn();
    }

    /// The node powered off, as far as containerd goes: containerd, its shims and every container of it killed
    /// (kill -9), and what lives in `/run` gone: its state directory, the runc state of its containers, their
    /// mounts. Its root (images, the sandboxes' metadata) stays, as a disk does. [`Containerd::power_on`] starts it
    /// again.
    pub fn power_off(&self) {
        crate::kill_child(&self.child);
        crate::kill_processes_naming(&self.socket().display().to_string());
        // The runc shim keeps its containers' state under runc's default root, per namespace.
        let ours = self.dir.path().display().to_string();
        crate::runc_power_off(Path::new(RUNC_ROOT), &ours);
        crate::unmount_under(&ours);
        let _ = std::fs::remove_dir_all(self.dir.path().join("state"));
    }

    /// containerd started after [`Containerd::power_off`], on the same root.
    pub fn power_on(&self) {
        self.spawn();
    }

    pub fn cri(&self) -> Cri {
        Cri::connect(&self.socket(), CRI_TIMEOUT).expect("connect to containerd's CRI")
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

impl Drop for Containerd {
    fn drop(&mut self) {
        if self.pid().is_some() {
            crate::cri::remove_every_sandbox(&self.socket(), &self.sandboxes);
        }
        crate::kill_child(&self.child);
        // Shims outlive containerd by design; they name its socket on their command line.
        let socket = self.socket().display().to_string();
        crate::kill_processes_naming(&socket);
        // Containers the shims were making when killed: their runc state, and a first process waiting to start.
        let root = self.dir.path().display().to_string();
        crate::runc_power_off(Path::new(RUNC_ROOT), &root);
        // Mounts the shims left (sandbox rootfs, shm) under our dir, deepest first.
        crate::unmount_under(&root);
    }
}

/// Where containerd's runc shim keeps the state of the CRI's containers (runc's default root, the `k8s.io`
/// namespace): shared by every containerd on the machine.
const RUNC_ROOT: &str = "/run/containerd/runc/k8s.io";

/// A runtime's CNI directories in `sb`: `cni-bin` with `plexus` (the binary given) beside the reference plugins,
/// and `cni-conf` with `00-plexus.conflist`, a list of the one plexus conf `plexus_conf` (as
/// [`crate::plexus::Sandbox::conf`] makes it: its `cniVersion` goes to the list), named `plexus-<sandbox>`. Returns
/// both dirs.
pub fn cni_dirs(
    sb: &crate::plexus::Sandbox,
    plexus: &Path,
    mut plexus_conf: serde_json::Value,
) -> (PathBuf, PathBuf) {
    let (bin, conf) = reference_cni_dirs(sb);
    std::os::unix::fs::symlink(plexus, bin.join("plexus")).expect("link plexus");
    let obj = plexus_conf.as_object_mut().expect("a plexus conf object");
    obj.remove("cniVersion");
    obj.remove("name");
    // A name of this sandbox's own: the runtimes keep each sandbox's result under the list's name in the host's
    // /var/lib/cni, and CRI-O, when it starts, tears down every attachment cached under the names of its lists
    // that is not one of its own sandboxes (libcni's GC for lists before CNI 1.1), whichever runtime made it.
    let name = format!(
        "plexus-{}",
        sb.root
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    );
    let list = json!({"cniVersion": "1.0.0", "name": name, "plugins": [plexus_conf]});
    std::fs::write(conf.join("00-plexus.conflist"), list.to_string()).expect("the conflist");
    (bin, conf)
}

/// A runtime's CNI dirs for a node whose CNI configuration is the cluster network's alone (Plexus in NRI mode):
/// the reference plugins in `cni-bin`, and `cluster` (a conflist, named uniquely: see [`cni_dirs`]) in `cni-conf`.
pub fn cluster_cni_dirs(
    sb: &crate::plexus::Sandbox,
    cluster: &serde_json::Value,
) -> (PathBuf, PathBuf) {
    let (bin, conf) = reference_cni_dirs(sb);
    std::fs::write(conf.join("10-cluster.conflist"), cluster.to_string()).expect("the conflist");
    (bin, conf)
}

/// `cni-bin` with links to the reference plugins, and an empty `cni-conf`, in `sb`.
fn reference_cni_dirs(sb: &crate::plexus::Sandbox) -> (PathBuf, PathBuf) {
    let bin = sb.path("cni-bin");
    std::fs::create_dir_all(&bin).expect("cni-bin");
    for plugin in std::fs::read_dir(crate::netns::cni_bin_dir())
        .expect("the reference plugins")
        .flatten()
    {
        std::os::unix::fs::symlink(plugin.path(), bin.join(plugin.file_name()))
            .expect("link a reference plugin");
    }
    let conf = sb.path("cni-conf");
    std::fs::create_dir_all(&conf).expect("cni-conf");
    (bin, conf)
}

/// An OCI image layout (tar) of a sandbox image: Debian's static busybox, sleeping, and exiting on SIGTERM as the
/// real pause does (a PID 1 without a handler ignores it, and CRI-O stops an infra container with SIGTERM before it
/// kills it, minutes later). Built once per process.
pub fn pause_image() -> &'static Path {
    static IMAGE: OnceLock<PathBuf> = OnceLock::new();
    IMAGE.get_or_init(|| {
        busybox_image(
            PAUSE_IMAGE,
            json!([
                "/bin/busybox",
                "sh",
                "-c",
                "trap 'exit 0' TERM INT; /bin/busybox sleep 2147483647 & wait"
            ]),
            false,
            &[],
        )
    })
}

/// An OCI image layout (tar), image `name` (`host/path:tag`): Debian's static busybox as `/bin/busybox` (with a
/// link for each of its applets when `applets`, so `sh`, `top`, `httpd`... are on `PATH=/bin`), the `files`
/// (path in the image, content), and `entrypoint` (JSON, `null` for none). Kept in a directory of this process.
pub fn busybox_image(
    name: &str,
    entrypoint: serde_json::Value,
    applets: bool,
    files: &[(&str, &str)],
) -> PathBuf {
    // One directory per test process (it lives as long as the process); those of processes that are gone are
    // removed.
    for entry in std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        let entry_name = entry.file_name().to_string_lossy().into_owned();
        if let Some(pid) = entry_name.strip_prefix("plx-images-") {
            if !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let tag = name.replace(['/', ':', '.'], "-");
    let dir = std::env::temp_dir()
        .join(format!("plx-images-{}", std::process::id()))
        .join(tag);
    let _ = std::fs::remove_dir_all(&dir);
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin")).expect("rootfs");
    std::fs::copy("/usr/bin/busybox", rootfs.join("bin/busybox")).expect("copy busybox");
    if applets {
        let list = Command::new("/usr/bin/busybox")
            .arg("--list")
            .output()
            .expect("busybox --list");
        for applet in String::from_utf8_lossy(&list.stdout).lines() {
            if applet != "busybox" && !applet.is_empty() {
                std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))
                    .expect("link an applet");
            }
        }
    }
    for (path, content) in files {
        let file = rootfs.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(file.parent().expect("a file in a directory")).expect("dir");
        std::fs::write(&file, content).expect("write a file of the image");
    }
    let layer = dir.join("layer.tar");
    let ok = Command::new("tar")
        .args(["--owner=0", "--group=0", "--numeric-owner", "-C"])
        .arg(&rootfs)
        .arg("-cf")
        .arg(&layer)
        .arg(".")
        .status()
        .expect("tar")
        .success();
    assert!(ok, "tar the pause rootfs");
    let layout = dir.join("layout");
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).expect("blobs dir");
    let put = |bytes: &[u8]| -> (String, usize) {
        let digest = hex::encode(Sha256::digest(bytes));
        std::fs::write(blobs.join(&digest), bytes).expect("write blob");
        (format!("sha256:{digest}"), bytes.len())
    };
    let (layer_digest, layer_size) = put(&std::fs::read(&layer).expect("layer"));
    let config = json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    });
    let (config_digest, config_size) = put(config.to_string().as_bytes());
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer_size}],
    });
    let (manifest_digest, manifest_size) = put(manifest.to_string().as_bytes());
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": manifest_size,
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name.rsplit(':').next().unwrap_or("latest")},
        }],
    });
    std::fs::write(layout.join("index.json"), index.to_string()).expect("index.json");
    let mut f = std::fs::File::create(layout.join("oci-layout")).expect("oci-layout");
    f.write_all(br#"{"imageLayoutVersion":"1.0.0"}"#)
        .expect("oci-layout");
    let tar = dir.join("pause.tar");
    let ok = Command::new("tar")
        .args(["--owner=0", "--group=0", "--numeric-owner", "-C"])
        .arg(&layout)
        .arg("-cf")
        .arg(&tar)
        .args(["oci-layout", "index.json", "blobs"])
        .status()
        .expect("tar")
        .success();
    assert!(ok, "tar the pause image layout");
    // Only the image is kept.
    let _ = std::fs::remove_dir_all(&rootfs);
    let _ = std::fs::remove_file(&layer);
    let _ = std::fs::remove_dir_all(&layout);
    tar
}
