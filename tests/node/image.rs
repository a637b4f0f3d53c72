//! Plexus's container image: built by `examples/image/build.sh` (an OCI image layout, Debian's tools only),
//! imported into a real containerd (2.4.2 of `tests/parts.sh`, the one the teardown tests drive) with `ctr` and run
//! there with runc, as the DaemonSet runs it: its `plexus install` puts the CNI plugin (`plexus-cni`, installed as
//! `plexus`) and the conflist onto the "node" (directories bind-mounted from the host), and the installed binary
//! then answers the CNI VERSION command on the host. The documented uninstall step is run both ways an operator
//! can: with the binary installed on the node, and from the image with the node's root mounted.

use std::path::Path;
use std::process::{Command, Stdio};

use plexus_tests::containerd::Containerd;
use plexus_tests::image::{ctr, IMAGE};
use plexus_tests::plexus::plexus_cni_bin;
use serde_json::{json, Value};

/// `ctr run --rm --snapshotter native ARGS...` (the image was imported with that snapshotter).
fn ctr_run(containerd: &Containerd, args: &[&str]) -> std::process::Output {
    let mut all = vec!["run", "--rm", "--snapshotter", "native"];
    all.extend_from_slice(args);
    ctr(containerd, &all)
}

#[test]
fn the_image_runs_in_containerd_and_installs_plexus_on_the_node() {
    let dir = tempfile::Builder::new()
        .prefix("plexus-image-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let image = dir.path().join("plexus.tar");
    plexus_tests::image::build(&image);

    // The "node": a CNI bin dir and a conf dir holding the cluster network's conf.
    let (bin, conf) = (dir.path().join("node-bin"), dir.path().join("node-net.d"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::write(
        conf.join("10-cluster.conflist"),
        json!({"cniVersion": "1.0.0", "name": "cluster-net", "plugins": [{"type": "bridge"}]})
            .to_string(),
    )
    .unwrap();
    let containerd = Containerd::start(&dir.path().join("cri-bin"), &dir.path().join("cri-net.d"));
    plexus_tests::image::import(&containerd, &image);

    // A service account as the DaemonSet's pod has one, so that install writes the kubeconfig too.
    let sa = dir.path().join("sa");
    std::fs::create_dir_all(&sa).unwrap();
    std::fs::write(sa.join("token"), "token-1\n").unwrap();
    std::fs::write(sa.join("ca.crt"), "not checked by install\n").unwrap();
    let kubeconfig = conf.join("plexus.d/plexus.kubeconfig");
    // Something else of the node's in its conf dir: uninstall must leave it.
    std::fs::write(conf.join("99-other.conf"), "{}").unwrap();

    // Mounted at their host paths, as the DaemonSet does, so the paths written into the conflist hold.
    let mount = |dir: &Path| format!("type=bind,src={0},dst={0},options=rbind:rw", dir.display());
    let bin_flag = format!("--bin-dir={}", bin.display());
    let conf_flag = format!("--conf-dir={}", conf.display());
    let sa_mount = format!(
        "type=bind,src={},dst=/var/run/secrets/kubernetes.io/serviceaccount,options=rbind:ro",
        sa.display()
    );
    let install = |n: u32| {
        let run = ctr_run(
            &containerd,
            &[
                "--env",
                "KUBERNETES_SERVICE_HOST=10.96.0.1",
                "--env",
                "KUBERNETES_SERVICE_PORT=443",
                "--mount",
                &mount(&bin),
                "--mount",
                &mount(&conf),
                "--mount",
                &sa_mount,
                IMAGE,
                &format!("plexus-install-{}-{n}", std::process::id()),
                "/usr/local/bin/plexus",
                "install",
                "--cni-bin-source=/usr/local/bin/plexus-cni",
                &bin_flag,
                &conf_flag,
                "--timeout=10s",
            ],
        );
        assert!(
            run.status.success(),
            "ctr run: {}\n{}\ncontainerd log:\n{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr),
            containerd.log()
        );
    };
    install(1);
    assert!(kubeconfig.exists());

    // What the container installed works on the host.
    let conflist: Value =
        serde_json::from_slice(&std::fs::read(conf.join("00-plexus.conflist")).unwrap()).unwrap();
    assert_eq!(conflist["plugins"][0]["type"], "plexus");
    assert_eq!(
        conflist["plugins"][0]["clusterNetwork"].as_str(),
        conf.join("10-cluster.conflist").to_str()
    );
    let installed = bin.join("plexus");
    let version = Command::new(&installed)
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(version.status.success());
    let v: Value = serde_json::from_slice(&version.stdout).unwrap();
    assert!(v["supportedVersions"]
        .as_array()
        .unwrap()
        .contains(&json!("1.1.0")));
    // What is installed is the CNI plugin alone, stripped.
    let about = Command::new(&installed).arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&about.stdout).contains("CNI plugin only"));
    assert!(
        std::fs::metadata(&installed).unwrap().len()
            < std::fs::metadata(plexus_cni_bin()).unwrap().len()
    );

    // The tools the daemon runs in a pod's namespace are in the image with what they link: `nsenter --net=NETNS ip
    // -j addr` (how NRI mode reads the cluster network's interface), here on the container's own namespace.
    let ip = ctr_run(
        &containerd,
        &[
            "--privileged",
            IMAGE,
            &format!("plexus-ip-{}", std::process::id()),
            "nsenter",
            "--net=/proc/1/ns/net",
            "ip",
            "-j",
            "addr",
            "show",
            "dev",
            "lo",
        ],
    );
    assert!(
        ip.status.success(),
        "nsenter and ip in the image: {}",
        String::from_utf8_lossy(&ip.stderr)
    );
    let links: Value = serde_json::from_slice(&ip.stdout).expect("ip's JSON");
    assert_eq!(links[0]["ifname"], "lo", "{links}");

    // The full binary in the image runs too: the node's long-running process answers for itself.
    let help = ctr_run(
        &containerd,
        &[
            IMAGE,
            &format!("plexus-help-{}", std::process::id()),
            "/usr/local/bin/plexus",
            "daemon",
            "--help",
        ],
    );
    assert!(
        help.status.success(),
        "{}",
        String::from_utf8_lossy(&help.stderr)
    );
    assert!(String::from_utf8_lossy(&help.stdout).contains("--hook-signatures"));

    // Uninstall, as docs/operations.md says, with what is really on the node. First on the node itself: the
    // installed binary (plexus-cni) with the DaemonSet's paths.
    let left_alone = |what: &str| {
        assert!(
            !conf.join("00-plexus.conflist").exists(),
            "{what}: conflist left"
        );
        assert!(!kubeconfig.exists(), "{what}: kubeconfig left");
        assert!(
            installed.exists(),
            "{what}: the binary stays for DEL of existing pods"
        );
        assert!(
            conf.join("10-cluster.conflist").exists(),
            "{what}: the cluster network's conf"
        );
        assert!(
            conf.join("99-other.conf").exists(),
            "{what}: another file of the node's"
        );
    };
    let out = Command::new(&installed)
        .args(["install", "--uninstall"])
        .arg(&conf_flag)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("removed"));
    left_alone("the installed binary");
    // Anything but uninstalling is the full binary's, and says so.
    let out = Command::new(&installed)
        .args(["install", "--watch"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("full plexus binary"));

    // Then as a one-off pod from the image with the node's root at /host (what `kubectl debug node/...` runs).
    install(2);
    assert!(conf.join("00-plexus.conflist").exists() && kubeconfig.exists());
    let host_root = format!(
        "type=bind,src={},dst=/host,options=rbind:rw",
        dir.path().display()
    );
    let in_host = |p: &Path| {
        Path::new("/host")
            .join(p.strip_prefix(dir.path()).unwrap())
            .display()
            .to_string()
    };
    let run = ctr_run(
        &containerd,
        &[
            "--mount",
            &host_root,
            IMAGE,
            &format!("plexus-uninstall-{}", std::process::id()),
            "/usr/local/bin/plexus",
            "install",
            "--uninstall",
            &format!("--conf-dir={}", in_host(&conf)),
        ],
    );
    assert!(
        run.status.success(),
        "ctr run: {}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    left_alone("the image's plexus");
}

/// The packages `cargo tree` resolves for `package` built alone (normal dependencies, this machine's target), as
/// the image build (`cargo build -p plexus-cni`) resolves them.
fn dependencies_alone(package: &str) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new("timeout")
        .arg("120")
        .arg(cargo)
        .args([
            "tree",
            "--offline",
            "--locked",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .args(["--format", "{p}", "-p", package])
        .current_dir(root)
        .stdin(Stdio::null())
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// The suite runs the workspace build's `plexus-cni`, whose shared crates carry the features plexus-node turns on;
/// the image's build of it alone must not: no wasm compiler, no watch runtime, no OCI client. Read from cargo's
/// resolution, without a second build.
#[test]
fn the_cni_plugin_built_alone_links_no_compiler_no_watch_runtime_no_oci_client() {
    let node_only = ["cranelift-codegen", "kube-runtime", "oci-client"];
    let node = dependencies_alone("plexus-node");
    for p in node_only {
        assert!(node.iter().any(|d| d == p), "plexus-node has {p}: {node:?}");
    }
    let cni = dependencies_alone("plexus-cni");
    assert!(cni.iter().any(|d| d == "wasmtime"), "{cni:?}");
    for p in node_only {
        assert!(!cni.iter().any(|d| d == p), "plexus-cni alone links {p}");
    }
}
