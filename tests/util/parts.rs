//! The real cluster parts the suite runs: Kubernetes (API server, controller-manager, scheduler, kubelet, kubectl),
//! etcd, containerd 2 with its runc shim, cri-tools and the CNI reference plugins, built from the Go module proxy
//! by `tests/parts.sh` (once per machine) at the versions its Go modules pin (`tests/parts/*/go.mod`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The directory the build script filled: `$PLEXUS_PARTS` (tests/run.sh sets it), else the script's answer (it
/// only checks a finished build, or builds once).
pub fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(d) = std::env::var_os("PLEXUS_PARTS").filter(|d| !d.is_empty()) {
            return PathBuf::from(d);
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("parts.sh");
        let out = std::process::Command::new("bash")
            .arg(&script)
            .stderr(std::process::Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "{} failed ({}): the cluster parts are not built",
            script.display(),
            out.status
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// One program of the build (`kube-apiserver`, `kubelet`, `etcd`, `containerd`, `crictl`, ...).
pub fn bin(name: &str) -> PathBuf {
    let bin = dir().join(name);
    assert!(
        bin.is_file(),
        "{} is missing: run `bash tests/parts.sh` (tests/run.sh does)",
        bin.display()
    );
    bin
}

/// The CNI reference plugins of the build (bridge, host-local, static, macvlan, tuning, portmap, bandwidth, ...).
pub fn cni_plugins() -> PathBuf {
    let d = dir().join("cni");
    assert!(
        d.join("bridge").is_file(),
        "{} has no CNI plugins: run `bash tests/parts.sh` (tests/run.sh does)",
        d.display()
    );
    d
}
