//! The one integration-test harness: the fixtures the suite's tests start (which group of tests needs which, and
//! what each costs: tests/README.md).

pub mod apiserver;
pub mod churn;
pub mod containerd;
pub mod control_plane;
pub mod cri;
pub mod crio;
pub mod daemonset;
pub mod dra_driver;
pub mod image;
pub mod kubeapi;
pub mod kubelet;
pub mod libcni;
pub mod netns;
pub mod node_events;
pub mod parts;
pub mod plexus;
pub mod podresources;
pub mod registry;
pub mod runtime;

/// The last `n` lines of a log file (empty if it cannot be read), for failure messages.
pub fn tail(path: &std::path::Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A file of the suite's own data (`tests/data`).
pub fn test_data(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(name)
}

/// A manifest of the project's deployment (`examples/deploy/<name>`), applied as written.
pub fn deploy_manifest(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/deploy")
        .join(name)
}

/// Every mount point of the test's mount namespace.
pub fn mount_points() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(str::to_string))
        .collect()
}

/// kill -9 of every process whose command line names `text` (a runtime's shims or conmons, which outlive it by
/// design and name its socket or directory).
pub fn kill_processes_naming(text: &str) {
    kill_processes_where(|_, cmd| String::from_utf8_lossy(cmd).contains(text));
}

/// kill -9 of every `runc init` whose parent is gone (its parent is then pid 1): a container's first process, left
/// waiting to be started when the shim or conmon that was making it was killed (a power-off, a runtime killed
/// mid-create). A live one's parent is `runc create`, or its shim or conmon (subreapers), never pid 1.
pub fn kill_orphaned_runc_inits() {
    kill_processes_where(|pid, cmd| {
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        let runc_init = args.len() >= 2 && args[0].ends_with(b"runc") && args[1] == b"init";
        runc_init && parent_of(pid) == Some(1)
    });
}

/// kill -9 of every process `kill(pid, command line)` picks (the command line as `/proc/<pid>/cmdline` has it).
fn kill_processes_where(kill: impl Fn(u32, &[u8]) -> bool) {
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if kill(pid, &cmd) {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
        }
    }
}

/// The parent of process `pid` (the second field after the parenthesized name in `/proc/<pid>/stat`).
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// kill -9 of the process a fixture keeps in `slot` (a runtime, the kubelet, kube-apiserver), if one runs, and its
/// reaping; the slot is left empty for the next start.
pub fn kill_child(slot: &std::sync::Mutex<Option<std::process::Child>>) {
    let child = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(mut child) = child {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Stops the process in `slot` as a service manager does: SIGTERM, then SIGKILL once `grace` has passed.
pub fn stop_child(
    slot: &std::sync::Mutex<Option<std::process::Child>>,
    grace: std::time::Duration,
) {
    let child = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(mut child) = child {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + grace;
        while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Lazily unmounts every mount point under `prefix`, deepest first.
pub fn unmount_under(prefix: &str) {
    unmount_deepest_first(
        mount_points()
            .into_iter()
            .filter(|m| m.starts_with(prefix))
            .collect(),
    );
}

/// Lazily unmounts `mounts`, deepest first (a mount under another goes before it).
pub fn unmount_deepest_first(mut mounts: Vec<String>) {
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounts {
        let _ = std::process::Command::new("umount")
            .args(["-l", &m])
            .status();
    }
}

/// Kills (SIGKILL) every container in runc's state at `root` whose bundle lies under `ours`, and deletes its
/// state, as a power-off would: other tests' containers under the same root are left alone.
pub fn runc_power_off(root: &std::path::Path, ours: &str) {
    let out = std::process::Command::new("runc")
        .arg("--root")
        .arg(root)
        .args(["list", "--format", "json"])
        .output();
    let Ok(out) = out else { return };
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
    for c in list {
        let (Some(id), Some(bundle)) = (c["id"].as_str(), c["bundle"].as_str()) else {
            continue;
        };
        if !bundle.starts_with(ours) {
            continue;
        }
        for args in [vec!["kill", id, "KILL"], vec!["delete", "--force", id]] {
            let _ = std::process::Command::new("runc")
                .arg("--root")
                .arg(root)
                .args(&args)
                .output();
        }
    }
    kill_orphaned_runc_inits();
}
