//! Plexus's container image as the tests use it: built by `examples/image/build.sh` from the suite's own
//! binaries (an OCI image layout tar, Debian's tools only) and imported into a test's containerd with `ctr`.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::containerd::Containerd;
use crate::plexus::{plexus_bin, plexus_cni_bin};

/// The name the tests give the image.
pub const IMAGE: &str = "plexus.test/plexus:1";

/// Builds the image into `out` (an OCI image layout tar) with the suite's `plexus` and `plexus-cni`.
pub fn build(out: &Path) {
    let build = Command::new("timeout")
        .arg("300")
        .arg("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/image/build.sh"))
        .arg("--binary")
        .arg(plexus_bin())
        .arg("--cni-binary")
        .arg(plexus_cni_bin())
        .arg("--out")
        .arg(out)
        .args(["--name", IMAGE])
        .stdin(Stdio::null())
        .output()
        .expect("run examples/image/build.sh");
    assert!(
        build.status.success(),
        "build.sh: {}",
        String::from_utf8_lossy(&build.stderr)
    );
}

/// `ctr -n k8s.io ARGS...` against `containerd` (Kubernetes' namespace, where its CRI looks), at most 120 s.
pub fn ctr(containerd: &Containerd, args: &[&str]) -> Output {
    Command::new("timeout")
        .arg("120")
        .arg(crate::containerd::ctr_bin())
        .arg("--address")
        .arg(containerd.socket())
        .args(["-n", "k8s.io"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run ctr")
}

/// Imports the image tar at `image` (Plexus's, [`IMAGE`]) into `containerd` with the snapshotter its CRI uses.
pub fn import(containerd: &Containerd, image: &Path) {
    import_as(containerd, image, IMAGE);
}

/// Imports the image tar at `image` into `containerd` with the snapshotter its CRI uses, tags it `name` when that
/// is not the name inside the tar, and checks that it is listed as `name`.
pub fn import_as(containerd: &Containerd, image: &Path, name: &str) {
    let import = ctr(
        containerd,
        &[
            "images",
            "import",
            "--snapshotter",
            "native",
            &image.display().to_string(),
        ],
    );
    assert!(
        import.status.success(),
        "import: {}",
        String::from_utf8_lossy(&import.stderr)
    );
    let index = Command::new("tar")
        .arg("-xOf")
        .arg(image)
        .arg("index.json")
        .output()
        .expect("tar");
    let index: serde_json::Value = serde_json::from_slice(&index.stdout).unwrap_or_default();
    let own = index["manifests"][0]["annotations"]["io.containerd.image.name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if own != name {
        let tag = ctr(containerd, &["images", "tag", "--force", &own, name]);
        assert!(
            tag.status.success(),
            "ctr images tag {own} {name}: {}",
            String::from_utf8_lossy(&tag.stderr)
        );
    }
    let listed = ctr(containerd, &["images", "ls", "-q"]);
    assert!(
        String::from_utf8_lossy(&listed.stdout)
            .lines()
            .any(|l| l == name),
        "{name} not listed after the import"
    );
}
