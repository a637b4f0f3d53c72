//! A real OCI registry for the tests: Debian's `docker-registry` (the CNCF distribution registry) on loopback,
//! plain HTTP, storage in a temp dir; and ECDSA P-256 key pairs made with openssl.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Registry {
    pub dir: tempfile::TempDir,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    child: Option<Child>,
}

impl Registry {
    /// Starts a registry on a free port and waits (at most 20 s) until `GET /v2/` answers.
    pub fn start() -> Registry {
        // Stopped and started again on the same port by some tests: one no connection takes meanwhile.
        let port = crate::kubeapi::free_port();
        let dir = tempfile::Builder::new()
            .prefix("plexus-registry-")
            .tempdir()
            .unwrap();
        let mut r = Registry {
            dir,
            addr: format!("127.0.0.1:{port}"),
            child: None,
        };
        r.up();
        r
    }

    /// Starts the registry process again (same port, same storage) after [`Registry::down`].
    pub fn up(&mut self) {
        assert!(self.child.is_none(), "registry already running");
        let config = self.dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {}\n",
                self.dir.path().join("data").display(),
                self.addr
            ),
        )
        .unwrap();
        let log = std::fs::File::create(self.dir.path().join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("docker-registry (tests/setup.sh installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = Command::new("curl")
                .args([
                    "-sf",
                    "--max-time",
                    "2",
                    &format!("http://{}/v2/", self.addr),
                ])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry did not answer within 20 s: {}",
                std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `plexus hook push` of the module `wasm` to `repo_tag` in this registry, signed with `key` (a private key)
    /// when given: the pinned reference it prints.
    pub fn push_hook(&self, wasm: &Path, repo_tag: &str, key: Option<&Path>) -> String {
        let mut push = Command::new(crate::plexus::plexus_bin());
        push.args(["hook", "push"])
            .arg(wasm)
            .arg(format!("{}/{repo_tag}", self.addr))
            .args(["--insecure-registry", &self.addr]);
        if let Some(key) = key {
            push.arg("--key").arg(key);
        }
        let out = push.output().expect("run plexus hook push");
        assert!(
            out.status.success(),
            "plexus hook push {}: {}",
            wasm.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let pushed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("push's JSON");
        pushed["reference"]
            .as_str()
            .expect("push's reference")
            .to_string()
    }

    /// Pushes the image of an OCI image layout tar (as [`crate::containerd::busybox_image`] writes it: one
    /// manifest) to this registry as `repository:tag`: every blob with a monolithic upload, then the manifest as
    /// it is, so the image's digest stays the layout's. Over curl, the harness's HTTP client for the registry (plain
    /// HTTP on loopback, three kinds of request: no TLS, no async client needed). Each request at most 60 s.
    pub fn push_layout(&self, layout_tar: &Path, repository: &str, tag: &str) {
        let dir = tempfile::tempdir().expect("a dir for the layout");
        let ok = Command::new("tar")
            .arg("-C")
            .arg(dir.path())
            .arg("-xf")
            .arg(layout_tar)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "untar {}", layout_tar.display());
        let index: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.path().join("index.json")).expect("index.json"),
        )
        .expect("index.json is JSON");
        let blob = |digest: &str| {
            dir.path()
                .join("blobs/sha256")
                .join(digest.trim_start_matches("sha256:"))
        };
        let manifest_digest = index["manifests"][0]["digest"]
            .as_str()
            .expect("the layout names a manifest");
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(blob(manifest_digest)).expect("the manifest"))
                .expect("the manifest is JSON");
        let base = format!("http://{}/v2/{repository}", self.addr);
        let digests = std::iter::once(&manifest["config"])
            .chain(manifest["layers"].as_array().into_iter().flatten())
            .map(|d| d["digest"].as_str().expect("a descriptor's digest"));
        for digest in digests {
            // POST opens the upload; its Location (relative or absolute, with or without a query) takes the blob.
            let start = curl(
                &["-s", "-D", "-", "-o", "/dev/null", "-X", "POST"],
                &format!("{base}/blobs/uploads/"),
            );
            let location = start
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("location")
                        .then(|| v.trim().to_string())
                })
                .unwrap_or_else(|| panic!("the registry opened no upload: {start}"));
            let location = if location.starts_with('/') {
                format!("http://{}{location}", self.addr)
            } else {
                location
            };
            let sep = if location.contains('?') { '&' } else { '?' };
            put(
                &format!("{location}{sep}digest={digest}"),
                "application/octet-stream",
                &blob(digest),
            );
        }
        put(
            &format!("{base}/manifests/{tag}"),
            manifest["mediaType"]
                .as_str()
                .expect("the manifest's media type"),
            &blob(manifest_digest),
        );
    }

    /// Stops the registry process (its storage stays).
    pub fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.down();
    }
}

/// `PUT url` of the file at `body` as `content_type` (curl, at most 60 s); a failed request fails the test.
fn put(url: &str, content_type: &str, body: &Path) {
    curl(
        &[
            "-sf",
            "-o",
            "/dev/null",
            "-X",
            "PUT",
            "-H",
            &format!("Content-Type: {content_type}"),
            "--data-binary",
            &format!("@{}", body.display()),
        ],
        url,
    );
}

/// `curl ARGS URL` (at most 60 s): what it printed; a failed request fails the test.
fn curl(args: &[&str], url: &str) -> String {
    let out = Command::new("curl")
        .args(["--max-time", "60"])
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .expect("curl");
    assert!(
        out.status.success(),
        "curl {url}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An ECDSA P-256 key pair made by openssl: (private PKCS#8 PEM, public PEM) under `dir`.
pub fn key_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let key = dir.join(format!("{name}.key"));
    let public = dir.join(format!("{name}.pub"));
    let ok = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
        ])
        .arg(&key)
        .status()
        .unwrap()
        .success();
    assert!(ok, "openssl genpkey");
    let ok = Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&key)
        .arg("-out")
        .arg(&public)
        .status()
        .unwrap()
        .success();
    assert!(ok, "openssl pkey -pubout");
    (key, public)
}
