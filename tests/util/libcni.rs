//! The libcni client: builds the Go driver in `tests/libcni/driver` against the reference runtime library (libcni
//! 1.1.2 from Debian's golang-github-appc-cni-dev) and runs ADD, CHECK, DEL and validation through it, the way
//! containerd, CRI-O and kubelet call CNI plugins.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::netns::cni_bin_dir;

/// Where Debian installs Go sources, libcni among them.
pub const GOPATH: &str = "/usr/share/gocode";

/// How long one driver run may take before the test fails instead of hanging.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the repository")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => {
            let d = PathBuf::from(d);
            if d.is_absolute() {
                d
            } else {
                repo_root().join(d)
            }
        }
        _ => repo_root().join("target"),
    }
}

/// Debian's Go (the `golang-go` package, what `/usr/share/gocode` is packaged for), which still builds in GOPATH mode;
/// a newer Go first on PATH is not asked to.
fn go_binary() -> PathBuf {
    PathBuf::from("/usr/lib/go/bin/go")
}

fn modified(path: &Path) -> Option<std::time::SystemTime> {
    fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The driver's source directory.
pub fn driver_source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("libcni/driver")
}

/// The built driver (`$CARGO_TARGET_DIR` or `<repo>/target`, then `/libcni-driver`), built on first use in this
/// process and rebuilt only when `main.go` is newer than the binary. Fails the test if Go or libcni is missing.
pub fn driver_path() -> &'static Path {
    static DRIVER: OnceLock<PathBuf> = OnceLock::new();
    DRIVER.get_or_init(|| {
        let src = driver_source_dir();
        let main_go = src.join("main.go");
        let src_time =
            modified(&main_go).unwrap_or_else(|| panic!("{} is missing", main_go.display()));
        let target = target_dir();
        let bin = target.join("libcni-driver");
        if modified(&bin).is_some_and(|t| t >= src_time) {
            return bin;
        }
        let libcni = Path::new(GOPATH).join("src/github.com/containernetworking/cni/libcni");
        assert!(
            libcni.is_dir(),
            "{} is missing: install golang-github-appc-cni-dev (tests/setup.sh does)",
            libcni.display()
        );
        fs::create_dir_all(&target).unwrap_or_else(|e| panic!("create {}: {e}", target.display()));
        // Several test binaries may build at once: each writes its own file and renames it into place.
        let tmp = target.join(format!("libcni-driver.tmp-{}", std::process::id()));
        let go = go_binary();
        let out = Command::new(&go)
            .args(["build", "-o"])
            .arg(&tmp)
            .arg(".")
            .current_dir(&src)
            .env("GOPATH", GOPATH)
            .env("GO111MODULE", "off")
            .env("GOFLAGS", "")
            // No dependence on $HOME, which CI runners as root may not have.
            .env("GOCACHE", target.join("go-build-cache"))
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "run {} (install golang-go; tests/setup.sh does): {e}",
                    go.display()
                )
            });
        assert!(
            out.status.success(),
            "building the libcni driver failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        fs::rename(&tmp, &bin)
            .unwrap_or_else(|e| panic!("rename {} to {}: {e}", tmp.display(), bin.display()));
        bin
    })
}

/// Why a driver run failed.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// A plugin (or plexus) returned a CNI error object, passed through libcni unchanged.
    #[error("CNI error {code}: {msg}")]
    Cni {
        code: u32,
        msg: String,
        details: String,
    },
    /// libcni itself failed (plugin not found, bad conflist, missing cached result, ...).
    #[error("libcni driver exited with {status}: {stderr}")]
    Failed { status: ExitStatus, stderr: String },
    #[error("libcni driver did not finish within {0:?}")]
    Timeout(Duration),
    /// stdout was not what the command promises (add: a result object, validate: a list).
    #[error("libcni driver printed unexpected output ({reason}): {stdout}")]
    BadOutput { reason: String, stdout: String },
}

impl DriverError {
    /// The CNI error code, when a plugin returned one.
    pub fn cni_code(&self) -> Option<u32> {
        match self {
            DriverError::Cni { code, .. } => Some(*code),
            _ => None,
        }
    }
}

#[derive(Deserialize)]
struct CniErrorLine {
    code: u32,
    #[serde(default)]
    msg: String,
    #[serde(default)]
    details: String,
}

/// What a successful run printed.
#[derive(Debug, Clone)]
pub struct DriverOutput {
    pub stdout: String,
    /// Plugins' diagnostics, which libcni lets through to the driver's stderr.
    pub stderr: String,
}

/// One CNI operation context: a network configuration, a container and its namespace, as a runtime holds them.
/// Build it once per attachment and call [`add`](Libcni::add), [`check`](Libcni::check) and [`del`](Libcni::del)
/// on it; libcni keys its cached results on (network name, container id, ifname) under `cache_dir`.
#[derive(Debug, Clone)]
pub struct Libcni {
    conflist: PathBuf,
    cache_dir: PathBuf,
    netns: Option<PathBuf>,
    container_id: String,
    ifname: String,
    bin_dirs: Vec<PathBuf>,
    args: Vec<(String, String)>,
    capability_args: Option<serde_json::Value>,
    env: Vec<(OsString, OsString)>,
    timeout: Duration,
}

impl Libcni {
    /// `conflist` is a `.conflist` or a single-plugin `.conf`; `cache_dir` is libcni's cache (use a per-test
    /// temp dir, never `/var/lib/cni`). Defaults: a unique container id, ifname `eth0`, plugins from
    /// [`cni_bin_dir`], no namespace, no CNI_ARGS, no capability args.
    pub fn new(conflist: impl Into<PathBuf>, cache_dir: impl Into<PathBuf>) -> Libcni {
        static IDS: AtomicU32 = AtomicU32::new(0);
        Libcni {
            conflist: conflist.into(),
            cache_dir: cache_dir.into(),
            netns: None,
            container_id: format!(
                "plx-ctr-{}-{}",
                std::process::id(),
                IDS.fetch_add(1, Ordering::Relaxed)
            ),
            ifname: "eth0".to_owned(),
            bin_dirs: vec![PathBuf::from(cni_bin_dir())],
            args: Vec::new(),
            capability_args: None,
            env: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The namespace path (`CNI_NETNS`).
    pub fn netns(mut self, path: impl Into<PathBuf>) -> Self {
        self.netns = Some(path.into());
        self
    }

    pub fn container_id(mut self, id: impl Into<String>) -> Self {
        self.container_id = id.into();
        self
    }

    pub fn ifname(mut self, ifname: impl Into<String>) -> Self {
        self.ifname = ifname.into();
        self
    }

    /// Replaces the plugin search path (`CNI_PATH`), searched in order.
    pub fn bin_dirs<I, P>(mut self, dirs: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<PathBuf>,
    {
        self.bin_dirs = dirs.into_iter().map(Into::into).collect();
        self
    }

    /// Appends one `CNI_ARGS` pair (e.g. `K8S_POD_NAME`).
    pub fn arg(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.args.push((key.into(), value.into()));
        self
    }

    /// The runtime's capability arguments (`portMappings`, `ips`, `mac`, ...), a JSON object; libcni passes each
    /// key only to plugins that declare the capability.
    pub fn capability_args(mut self, args: serde_json::Value) -> Self {
        self.capability_args = Some(args);
        self
    }

    /// An environment variable for the driver and so for every plugin it execs.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn container(&self) -> &str {
        &self.container_id
    }

    pub fn interface(&self) -> &str {
        &self.ifname
    }

    /// `AddNetworkList`: the result JSON, in the conflist's cniVersion.
    pub fn add(&self) -> Result<serde_json::Value, DriverError> {
        let out = self.run("add")?;
        match serde_json::from_str::<serde_json::Value>(&out.stdout) {
            Ok(v) if v.is_object() => Ok(v),
            Ok(_) => Err(DriverError::BadOutput {
                reason: "not a JSON object".to_owned(),
                stdout: out.stdout,
            }),
            Err(e) => Err(DriverError::BadOutput {
                reason: e.to_string(),
                stdout: out.stdout,
            }),
        }
    }

    /// `CheckNetworkList` (needs the cached result of an earlier [`add`](Libcni::add) with the same context).
    pub fn check(&self) -> Result<(), DriverError> {
        self.run("check").map(drop)
    }

    /// `DelNetworkList`.
    pub fn del(&self) -> Result<(), DriverError> {
        self.run("del").map(drop)
    }

    /// `ValidateNetworkList`: asks each plugin for its VERSION and returns the capabilities the list declares,
    /// sorted.
    pub fn validate(&self) -> Result<Vec<String>, DriverError> {
        let out = self.run("validate")?;
        serde_json::from_str(&out.stdout).map_err(|e| DriverError::BadOutput {
            reason: e.to_string(),
            stdout: out.stdout,
        })
    }

    /// Runs the driver with `command` (`add`, `check`, `del` or `validate`) and returns what it printed.
    pub fn run(&self, command: &str) -> Result<DriverOutput, DriverError> {
        let mut cmd = Command::new(driver_path());
        cmd.arg(command)
            .arg("--conflist")
            .arg(&self.conflist)
            .arg("--cache-dir")
            .arg(&self.cache_dir)
            .args(["--container-id", self.container_id.as_str()])
            .args(["--ifname", self.ifname.as_str()])
            .arg("--bin-dirs")
            .arg(std::env::join_paths(&self.bin_dirs).expect("plugin directories contain no ':'"));
        if let Some(ns) = &self.netns {
            cmd.arg("--netns").arg(ns);
        }
        if !self.args.is_empty() {
            let joined: Vec<String> = self.args.iter().map(|(k, v)| format!("{k}={v}")).collect();
            cmd.arg("--args").arg(joined.join(";"));
        }
        if let Some(caps) = &self.capability_args {
            cmd.arg("--capability-args").arg(caps.to_string());
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        run_with_timeout(cmd, self.timeout)
    }
}

fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Result<DriverOutput, DriverError> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let reader = |mut pipe: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            // A read error just truncates diagnostics; the exit status decides the outcome.
            let _ = pipe.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let stdout = reader(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = reader(Box::new(child.stderr.take().expect("piped stderr")));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the libcni driver") {
            break status;
        }
        if started.elapsed() > timeout {
            // Only the driver is ours to kill; plugins it started die with their stdio closed or finish alone.
            let _ = child.kill();
            let _ = child.wait();
            return Err(DriverError::Timeout(timeout));
        }
        thread::sleep(Duration::from_millis(5));
    };
    let stdout = stdout.join().expect("stdout reader");
    let stderr = stderr.join().expect("stderr reader");
    if status.success() {
        return Ok(DriverOutput { stdout, stderr });
    }
    // The driver prints a CNI error object as its last stderr line; plugin chatter may precede it.
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    if let Ok(e) = serde_json::from_str::<CniErrorLine>(last) {
        return Err(DriverError::Cni {
            code: e.code,
            msg: e.msg,
            details: e.details,
        });
    }
    Err(DriverError::Failed {
        status,
        stderr: stderr.trim().to_owned(),
    })
}
