//! A peer's test suite: the networking cases of `critest` (cri-tools v1.37.0, the CRI validation suite) run against
//! each runtime (containerd 2, CRI-O 1.36) whose CNI is Plexus (the cluster network, bridge + host-local + portmap,
//! and a second bridge network for every pod through `defaultNetworks`), and, as the reference, against the same
//! runtime with the cluster network's conflist alone. critest pulls its images through the CRI, so they are built here
//! (Debian's static busybox: a test image, and a web server image running busybox `httpd` on port 80) and served by
//! a registry on loopback; `--test-images-file` names them.
//!
//! The cases: DNS config, hostname, port mapping with a container port only (the pod's IP from the CRI status), and
//! with a host port (127.0.0.1:12000 through portmap).

use std::path::Path;
use std::process::Command;

use plexus_tests::containerd::{busybox_image, cni_dirs};
use plexus_tests::netns::{bridge_host_local, require_root_and_plugins, HostBridge, IpamDir};
use plexus_tests::plexus::{plexus_cni_bin, Sandbox};
use plexus_tests::registry::Registry;
use plexus_tests::runtime::{Runtime, RuntimeKind};
use serde_json::{json, Value};

/// Builds critest's two images and pushes them to `registry` (critest pulls them through the runtime); returns the
/// `--test-images-file` naming them.
fn push_images(registry: &Registry, dir: &Path) -> std::path::PathBuf {
    let (test_repo, web_repo) = ("critest/busybox", "critest/web");
    let test_image = format!("{}/{test_repo}:1", registry.addr);
    let web_image = format!("{}/{web_repo}:1", registry.addr);
    let images = [
        busybox_image(&test_image, Value::Null, true, &[]),
        busybox_image(
            &web_image,
            json!(["/bin/httpd", "-f", "-p", "80", "-h", "/www"]),
            true,
            &[("/www/index.html", "plexus critest\n")],
        ),
    ];
    for (image, repo) in images.iter().zip([test_repo, web_repo]) {
        registry.push_layout(image, repo, "1");
    }
    let file = dir.join("critest-images.yaml");
    std::fs::write(
        &file,
        format!("defaultTestContainerImage: {test_image}\nwebServerTestImage: {web_image}\n"),
    )
    .expect("the images file");
    file
}

/// critest's networking cases against `runtime`: its exit status and what it printed.
fn critest(runtime: &Runtime, images: &Path) -> (bool, String) {
    let endpoint = format!("unix://{}", runtime.socket().display());
    let out = Command::new("timeout")
        .arg("300")
        .arg(plexus_tests::parts::bin("critest"))
        .arg(format!("--runtime-endpoint={endpoint}"))
        .arg(format!("--image-endpoint={endpoint}"))
        .arg(format!("--test-images-file={}", images.display()))
        .args(["--ginkgo.focus=Networking", "--ginkgo.no-color"])
        // critest looks for a crictl config in the working directory's temp dir first.
        .current_dir(images.parent().unwrap())
        .output()
        .expect("run critest");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

plexus_tests::on_each_runtime!(
    critests_networking_cases_pass_with_plexus_as_with_the_bridge_conflist
);

/// CRI-O maps a pod's host ports itself (its own NAT rules on the pod's first address) and never hands
/// `portMappings` to the CNI plugin, whatever the CNI configuration says; its rules do not make a host port reachable
/// from 127.0.0.1, where critest's host-port case connects. What a node's kube-proxy does for node ports, the test does
/// for its own bridge while it lives: `route_localnet` on it, and a masquerade of loopback sources leaving through it
/// (an nftables table of the test's own, deleted on drop).
struct LoopbackHostPorts {
    table: String,
}

impl LoopbackHostPorts {
    fn to(bridge: &HostBridge) -> LoopbackHostPorts {
        let name = bridge.name();
        let sysctl = format!("/proc/sys/net/ipv4/conf/{name}/route_localnet");
        std::fs::write(&sysctl, "1").unwrap_or_else(|e| panic!("{sysctl}: {e}"));
        let table = format!("plexus-critest-{name}");
        let rules = format!(
            "table ip {table} {{\n  chain post {{\n    type nat hook postrouting priority 100;\n    ip saddr 127.0.0.0/8 oifname \"{name}\" masquerade\n  }}\n}}\n"
        );
        let mut nft = Command::new("nft")
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("nft");
        std::io::Write::write_all(nft.stdin.as_mut().unwrap(), rules.as_bytes()).unwrap();
        assert!(nft.wait().unwrap().success(), "nft: {rules}");
        LoopbackHostPorts { table }
    }
}

impl Drop for LoopbackHostPorts {
    fn drop(&mut self) {
        let _ = Command::new("nft")
            .args(["delete", "table", "ip", &self.table])
            .status();
    }
}

/// critest's host-port case binds 127.0.0.1:12000 (its value, not ours): one critest run at a time.
static HOST_PORT: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn critests_networking_cases_pass_with_plexus_as_with_the_bridge_conflist(kind: RuntimeKind) {
    require_root_and_plugins();
    let _turn = HOST_PORT.lock().unwrap_or_else(|e| e.into_inner());
    let registry = Registry::start();
    let sb = Sandbox::new();
    let ipam = IpamDir::new();
    let (cluster_bridge, second_bridge) = (HostBridge::create("ccl"), HostBridge::reserve("csc"));
    let _loopback = (kind == RuntimeKind::CriO).then(|| LoopbackHostPorts::to(&cluster_bridge));
    let mut cluster = bridge_host_local("critest-net", &cluster_bridge, &ipam);
    cluster["plugins"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "portmap", "capabilities": {"portMappings": true}}));
    let second = bridge_host_local("critest-second", &second_bridge, &ipam);
    let nets = sb.path("nets");
    std::fs::create_dir_all(&nets).unwrap();
    std::fs::write(nets.join("cluster.conflist"), cluster.to_string()).unwrap();
    std::fs::write(nets.join("second.conflist"), second.to_string()).unwrap();

    // The runtime's CNI directories: the reference plugins and plexus, and Plexus's conflist with the same cluster
    // network and a second network in every pod.
    let (bin, plexus_conf) = cni_dirs(
        &sb,
        &plexus_cni_bin(),
        json!({
            "type": "plexus",
            "clusterNetwork": nets.join("cluster.conflist"),
            "defaultNetworks": [nets.join("second.conflist")],
            "cacheDir": sb.path("cache"), "runDir": sb.path("run"),
            "logFile": sb.path("plexus.log"), "logLevel": "debug",
            "capabilities": {"portMappings": true}
        }),
    );

    // The reference: the runtime with the cluster network's conflist as its CNI configuration.
    let plain_conf = sb.path("conf-plain");
    std::fs::create_dir_all(&plain_conf).unwrap();
    std::fs::copy(
        nets.join("cluster.conflist"),
        plain_conf.join("10-critest.conflist"),
    )
    .unwrap();
    let images = push_images(&registry, sb.root.path());
    {
        let runtime = Runtime::start_with(kind, &bin, &plain_conf, Some(&registry.addr));
        let (ok, out) = critest(&runtime, &images);
        assert!(
            ok && out.contains("4 Passed | 0 Failed"),
            "critest on {} with the bridge conflist:\n{out}\n{} log:\n{}",
            kind.name(),
            kind.name(),
            runtime.log()
        );
    }
    assert!(
        ipam.reserved_ips("critest-net").is_empty(),
        "critest's pods released their addresses"
    );

    // Plexus: the same cluster network, and a second network in every pod.
    {
        let runtime = Runtime::start_with(kind, &bin, &plexus_conf, Some(&registry.addr));
        let (ok, out) = critest(&runtime, &images);
        assert!(
            ok && out.contains("4 Passed | 0 Failed"),
            "critest on {} with Plexus:\n{out}\nplexus log:\n{}",
            kind.name(),
            plexus_tests::tail(&sb.path("plexus.log"), 40)
        );
    }
    let log = std::fs::read_to_string(sb.path("plexus.log")).unwrap_or_default();
    let second_adds = log
        .lines()
        .filter(|l| {
            l.contains("network=critest-second")
                && l.contains("command=\"ADD\"")
                && l.contains("exec delegate")
        })
        .count();
    // Each of the four cases runs one pod in a network namespace of its own.
    assert!(
        second_adds >= 4,
        "every pod got the second network through Plexus ({second_adds} ADDs of it):\n{log}"
    );
    for net in ["critest-net", "critest-second"] {
        assert!(
            ipam.reserved_ips(net).is_empty(),
            "{net}: every address released: {:?}",
            ipam.reserved_ips(net)
        );
    }
    assert_eq!(sb.cached(), Vec::<String>::new(), "no cache entry left");
}
