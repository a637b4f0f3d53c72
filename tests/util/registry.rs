//! A real OCI registry for the tests: Debian's `docker-registry` (the CNCF distribution registry) on loopback,
//! plain HTTP, storage in a temp dir; and ECDSA P-256 key pairs made with openssl.

use std::net::TcpListener;
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
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
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
