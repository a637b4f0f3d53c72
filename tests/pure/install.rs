//! `plexus install` against temporary CNI directories.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use plexus_node::install::*;
use serde_json::{json, Value};

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn write_json(path: &Path, value: &Value) {
    fs::write(path, serde_json::to_vec_pretty(value).unwrap()).unwrap();
}

fn calico() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "k8s-pod-network",
        "plugins": [
            {"type": "calico", "ipam": {"type": "calico-ipam"}},
            {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true},
            {"type": "bandwidth", "capabilities": {"bandwidth": true, "ips": false}}
        ]
    })
}

#[test]
fn flags_are_parsed() {
    let o = parse_args(&args(&[
        "install",
        "--bin-dir=/b",
        "--conf-dir",
        "/c",
        "--cni-bin-source",
        "/src/plexus",
        "--cluster-network-conf",
        "k8s-pod-network",
        "--timeout",
        "5m",
        "--poll-interval=250ms",
        "--watch",
    ]))
    .unwrap();
    assert_eq!(o.bin_dir, Path::new("/b"));
    assert_eq!(o.conf_dir, Path::new("/c"));
    assert_eq!(o.cni_bin_source.as_deref(), Some(Path::new("/src/plexus")));
    assert_eq!(o.cluster_network_conf.as_deref(), Some("k8s-pod-network"));
    assert_eq!(o.timeout, Duration::from_secs(300));
    assert_eq!(o.poll_interval, Duration::from_millis(250));
    assert!(o.watch && !o.uninstall);
    assert_eq!(
        o.kubeconfig_out,
        Path::new("/c/plexus.d/plexus.kubeconfig"),
        "follows --conf-dir"
    );

    let d = parse_args(&[]).unwrap();
    assert_eq!(d.bin_dir, Path::new("/opt/cni/bin"));
    assert_eq!(d.conf_dir, Path::new("/etc/cni/net.d"));
    assert_eq!(
        d.kubeconfig_out,
        Path::new("/etc/cni/net.d/plexus.d/plexus.kubeconfig")
    );
    assert_eq!(d.timeout, Duration::from_secs(300));
    let k = parse_args(&args(&["--kubeconfig-out", "/k", "--uninstall"])).unwrap();
    assert_eq!(k.kubeconfig_out, Path::new("/k"));
    assert!(k.uninstall);
}

#[test]
fn bad_flags_are_named() {
    let err = |list: &[&str]| parse_args(&args(list)).unwrap_err().to_string();
    assert!(
        err(&["--bin"]).starts_with("error: unexpected argument '--bin' found"),
        "{}",
        err(&["--bin"])
    );
    assert!(err(&["--timeout", "soon"])
        .starts_with("error: invalid value 'soon' for '--timeout <DURATION>': not a duration"));
    assert!(err(&["--conf-dir"]).starts_with("error: a value is required for '--conf-dir <DIR>'"));
    assert!(err(&["--watch", "--uninstall"])
        .starts_with("error: the argument '--watch' cannot be used with '--uninstall'"));
    assert!(err(&["--poll-interval", "10m"])
        .contains("'10m' for '--poll-interval <DURATION>': must be between 100ms and 60s"));
    assert!(err(&["--poll-interval", "10ms"]).contains("must be between"));
    match parse_args(&args(&["--help"])) {
        Err(InstallError::Usage(e)) => {
            assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
            assert!(
                e.to_string().contains("--cluster-network-conf <NAME|PATH>"),
                "{e}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn durations() {
    assert_eq!(parse_duration("30"), Some(Duration::from_secs(30)));
    assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
    assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
    assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
    assert_eq!(parse_duration("2h"), None);
    assert_eq!(parse_duration("s"), None);
    assert_eq!(parse_duration("-1"), None);
}

#[test]
fn base64_matches_rfc4648_vectors() {
    let cases = [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ];
    for (plain, encoded) in cases {
        assert_eq!(base64(plain.as_bytes()), encoded, "{plain:?}");
    }
    assert_eq!(base64(&[0xfb, 0xff, 0xbf]), "+/+/");
}

#[test]
fn binary_replaces_a_running_copy_without_text_file_busy() {
    let tmp = tempfile::tempdir().unwrap();
    let bin_dir = tmp.path().join("bin");
    fs::create_dir(&bin_dir).unwrap();
    let target = bin_dir.join("plexus");
    // A running executable at the target path: opening it for writing would fail with ETXTBSY.
    fs::copy("/bin/sleep", &target).unwrap();
    fs::set_permissions(&target, fs::Permissions::from_mode(0o755)).unwrap();
    let mut running = Command::new(&target).arg("30").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let old_inode = fs::metadata(&target).unwrap().ino();

    let source = tmp.path().join("new-plexus");
    fs::write(&source, b"#!/bin/sh\necho new\n").unwrap();
    let (installed, changed) = install_binary(&source, &bin_dir).unwrap();
    assert!(changed);
    assert_eq!(installed, target);
    assert_eq!(fs::read(&target).unwrap(), b"#!/bin/sh\necho new\n");
    let meta = fs::metadata(&target).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o755);
    assert_ne!(
        meta.ino(),
        old_inode,
        "replaced by rename, not rewritten in place"
    );
    assert!(
        running.try_wait().unwrap().is_none(),
        "the running copy is untouched"
    );
    running.kill().unwrap();
    running.wait().unwrap();

    let (_, changed) = install_binary(&source, &bin_dir).unwrap();
    assert!(!changed, "same bytes: nothing rewritten");
    let leftovers: Vec<_> = fs::read_dir(&bin_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        leftovers,
        vec![std::ffi::OsString::from("plexus")],
        "no temp file left behind"
    );
}

#[test]
fn missing_binary_source_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let err = install_binary(&tmp.path().join("absent"), tmp.path())
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!("{}: ", tmp.path().join("absent").display())),
        "{err}"
    );
}

fn service_account_files(dir: &Path, token: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let token_file = dir.join("token");
    let ca_file = dir.join("ca.crt");
    fs::write(&token_file, format!("{token}\n")).unwrap();
    fs::write(
        &ca_file,
        "-----BEGIN CERTIFICATE-----\nfoobar\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    (token_file, ca_file)
}

#[test]
fn kubeconfig_embeds_token_ca_and_server() {
    let tmp = tempfile::tempdir().unwrap();
    let (token_file, ca_file) = service_account_files(tmp.path(), "tok-1");
    let sa = ServiceAccount::load("10.96.0.1", "443", &token_file, &ca_file).unwrap();
    assert_eq!(sa.server, "https://10.96.0.1:443");
    assert_eq!(sa.token, "tok-1", "trailing newline trimmed");
    let kc: Value = serde_saphyr::from_str(&sa.kubeconfig().unwrap()).unwrap();
    assert_eq!(kc["current-context"], "plexus");
    assert_eq!(
        kc["clusters"][0]["cluster"]["server"],
        "https://10.96.0.1:443"
    );
    assert_eq!(
        kc["clusters"][0]["cluster"]["certificate-authority-data"],
        base64(&fs::read(&ca_file).unwrap())
    );
    assert_eq!(kc["users"][0]["user"]["token"], "tok-1");
    assert_eq!(
        kc["contexts"][0]["context"],
        json!({"cluster": "local", "user": "plexus"})
    );

    let v6 = ServiceAccount::load("fd00::1", "6443", &token_file, &ca_file).unwrap();
    assert_eq!(v6.server, "https://[fd00::1]:6443");
    let err = ServiceAccount::load("10.96.0.1", "https", &token_file, &ca_file).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("service account: API server address"),
        "{err}"
    );
    fs::write(&token_file, "\n").unwrap();
    let err = ServiceAccount::load("10.96.0.1", "443", &token_file, &ca_file).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "service account: token file {} is empty",
            token_file.display()
        )
    );
}

#[test]
fn cluster_conf_is_found_by_order_name_and_path() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    assert!(find_cluster_conf(&dir.join("absent"), None)
        .unwrap()
        .is_none());
    assert!(find_cluster_conf(dir, None).unwrap().is_none());
    write_json(
        &dir.join(CONFLIST_NAME),
        &json!({"cniVersion": "1.0.0", "name": "plexus", "plugins": [{"type": "plexus"}]}),
    );
    write_json(
        &dir.join("05-old-plexus.conf"),
        &json!({"cniVersion": "1.0.0", "name": "x", "type": "plexus"}),
    );
    fs::write(dir.join("07-half-written.conflist"), "{\"cniVersion\":").unwrap();
    fs::write(dir.join(".10-hidden.conflist"), "{}").unwrap();
    fs::write(dir.join("08-notes.txt"), "{}").unwrap();
    assert!(
        find_cluster_conf(dir, None).unwrap().is_none(),
        "only plexus, broken, hidden and non-conf files"
    );

    write_json(
        &dir.join("20-other.conf"),
        &json!({"cniVersion": "0.4.0", "name": "other-net", "type": "bridge"}),
    );
    write_json(&dir.join("10-calico.conflist"), &calico());
    let (path, conf) = find_cluster_conf(dir, None).unwrap().unwrap();
    assert_eq!(
        path,
        dir.join("10-calico.conflist"),
        "file-name order, as the runtime picks"
    );
    assert_eq!(conf["name"], "k8s-pod-network");
    let (path, _) = find_cluster_conf(dir, Some("other-net")).unwrap().unwrap();
    assert_eq!(path, dir.join("20-other.conf"), "by the conf's name");
    let (path, _) = find_cluster_conf(dir, Some("20-other.conf"))
        .unwrap()
        .unwrap();
    assert_eq!(path, dir.join("20-other.conf"), "by file name");
    let elsewhere = tmp.path().join("elsewhere.conflist");
    write_json(&elsewhere, &calico());
    let by_path = elsewhere.to_string_lossy().into_owned();
    assert_eq!(
        find_cluster_conf(dir, Some(&by_path)).unwrap().unwrap().0,
        elsewhere
    );
    assert!(find_cluster_conf(dir, Some("nope")).unwrap().is_none());
}

#[test]
fn waiting_for_the_cluster_conf_times_out_or_sees_it_appear() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let started = Instant::now();
    let err = wait_for_cluster_conf(
        &dir,
        Some("k8s-pod-network"),
        Duration::from_millis(300),
        Duration::from_millis(50),
    )
    .unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(
        err.to_string(),
        format!(
            "no cluster network conf \"k8s-pod-network\" appeared in {} within 300ms",
            dir.display()
        )
    );

    let writer_dir = dir.clone();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        write_json(&writer_dir.join("10-calico.conflist"), &calico());
    });
    let (path, _) = wait_for_cluster_conf(
        &dir,
        None,
        Duration::from_secs(10),
        Duration::from_millis(20),
    )
    .unwrap();
    writer.join().unwrap();
    assert_eq!(path, dir.join("10-calico.conflist"));
}

#[test]
fn conflist_carries_the_cluster_networks_capabilities() {
    let cluster = Path::new("/etc/cni/net.d/10-calico.conflist");
    let kubeconfig = Path::new("/etc/cni/net.d/plexus.d/plexus.kubeconfig");
    let conf = plexus_conflist(cluster, &calico(), Some(kubeconfig)).unwrap();
    assert_eq!(
        conf,
        json!({
            "cniVersion": "1.0.0",
            "name": "plexus",
            "plugins": [{
                "type": "plexus",
                "clusterNetwork": "/etc/cni/net.d/10-calico.conflist",
                "cluster": {"source": "kube", "kubeconfig": "/etc/cni/net.d/plexus.d/plexus.kubeconfig"},
                "capabilities": {"portMappings": true, "bandwidth": true}
            }]
        })
    );

    let single = json!({"cniVersion": "0.4.0", "name": "br", "type": "bridge", "capabilities": {"ips": true}});
    let conf = plexus_conflist(Path::new("/x/br.conf"), &single, None).unwrap();
    assert_eq!(conf["cniVersion"], "0.4.0");
    assert_eq!(conf["plugins"][0]["capabilities"], json!({"ips": true}));
    assert!(
        conf["plugins"][0].get("cluster").is_none(),
        "no kubeconfig, no cluster source"
    );

    let err = plexus_conflist(Path::new("/x/bad.conf"), &json!({"name": "bad"}), None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "cluster network conf /x/bad.conf: has neither \"plugins\" nor \"type\""
    );
    let err = plexus_conflist(Path::new("/x/bad.conf"), &json!({"plugins": []}), None).unwrap_err();
    assert!(err.to_string().contains("non-empty list"), "{err}");
}

fn node(tmp: &Path) -> (InstallOptions, ApiServerEnv) {
    let conf_dir = tmp.join("net.d");
    fs::create_dir_all(&conf_dir).unwrap();
    let (token_file, ca_file) = service_account_files(tmp, "tok-1");
    let opts = InstallOptions {
        bin_dir: tmp.join("bin"),
        kubeconfig_out: conf_dir.join("plexus.d/plexus.kubeconfig"),
        conf_dir,
        cni_bin_source: Some("/bin/true".into()),
        timeout: Duration::from_secs(5),
        poll_interval: Duration::from_millis(20),
        token_file,
        ca_file,
        ..InstallOptions::default()
    };
    let env = ApiServerEnv {
        host: Some("10.96.0.1".into()),
        port: Some("443".into()),
    };
    (opts, env)
}

#[test]
fn refresh_rewrites_only_what_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let (opts, env) = node(tmp.path());
    let ours = opts.conf_dir.join(CONFLIST_NAME);
    let calico_path = opts.conf_dir.join("10-calico.conflist");
    write_json(&calico_path, &calico());

    let touched = refresh(&opts, &env, true).unwrap();
    assert_eq!(touched, vec![opts.kubeconfig_out.clone(), ours.clone()]);
    assert_eq!(
        fs::metadata(&opts.kubeconfig_out)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600,
        "holds a token"
    );
    let conflist: Value = serde_json::from_slice(&fs::read(&ours).unwrap()).unwrap();
    assert_eq!(
        conflist["plugins"][0]["clusterNetwork"],
        calico_path.to_string_lossy().as_ref()
    );
    assert_eq!(
        conflist["plugins"][0]["cluster"]["kubeconfig"],
        opts.kubeconfig_out.to_string_lossy().as_ref()
    );

    assert!(
        refresh(&opts, &env, false).unwrap().is_empty(),
        "nothing changed, nothing written"
    );

    // The kubelet rotates the projected token.
    fs::write(&opts.token_file, "tok-2\n").unwrap();
    assert_eq!(
        refresh(&opts, &env, false).unwrap(),
        vec![opts.kubeconfig_out.clone()]
    );
    assert!(fs::read_to_string(&opts.kubeconfig_out)
        .unwrap()
        .contains("token: tok-2"));

    // The cluster network gains a capability.
    let mut more = calico();
    more["plugins"][0]["capabilities"] = json!({"ips": true});
    write_json(&calico_path, &more);
    assert_eq!(refresh(&opts, &env, false).unwrap(), vec![ours.clone()]);
    let conflist: Value = serde_json::from_slice(&fs::read(&ours).unwrap()).unwrap();
    assert_eq!(conflist["plugins"][0]["capabilities"]["ips"], true);

    // The cluster network goes away: so does Plexus's conf (spec 6.1, not ready).
    fs::remove_file(&calico_path).unwrap();
    assert_eq!(refresh(&opts, &env, false).unwrap(), vec![ours.clone()]);
    assert!(!ours.exists());
}

#[test]
fn run_installs_and_uninstall_removes() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut opts, env) = node(tmp.path());
    write_json(&opts.conf_dir.join("10-calico.conflist"), &calico());
    run(&opts, &env).unwrap();
    assert_eq!(
        fs::read(opts.bin_dir.join("plexus")).unwrap(),
        fs::read("/bin/true").unwrap()
    );
    assert!(opts.kubeconfig_out.exists());
    let ours = opts.conf_dir.join(CONFLIST_NAME);
    assert!(ours.exists());

    opts.uninstall = true;
    run(&opts, &env).unwrap();
    assert!(!ours.exists());
    assert!(!opts.kubeconfig_out.exists());
    assert!(
        opts.bin_dir.join("plexus").exists(),
        "the binary stays for DEL of existing pods"
    );
    assert!(
        opts.conf_dir.join("10-calico.conflist").exists(),
        "the cluster network's conf is not ours"
    );
    assert!(
        uninstall(&opts.conf_dir, &opts.kubeconfig_out)
            .unwrap()
            .is_empty(),
        "idempotent"
    );
}

#[test]
fn run_outside_a_cluster_writes_no_kubeconfig() {
    let tmp = tempfile::tempdir().unwrap();
    let (opts, _) = node(tmp.path());
    write_json(&opts.conf_dir.join("10-calico.conflist"), &calico());
    run(&opts, &ApiServerEnv::default()).unwrap();
    assert!(!opts.kubeconfig_out.exists());
    let conflist: Value =
        serde_json::from_slice(&fs::read(opts.conf_dir.join(CONFLIST_NAME)).unwrap()).unwrap();
    assert!(conflist["plugins"][0].get("cluster").is_none());
}

#[test]
fn run_gives_up_when_the_cluster_network_never_comes() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut opts, env) = node(tmp.path());
    opts.timeout = Duration::from_millis(100);
    let err = run(&opts, &env).unwrap_err();
    assert!(matches!(err, InstallError::Timeout { .. }), "{err:?}");
    assert!(!opts.conf_dir.join(CONFLIST_NAME).exists());
}

/// The conflist's plexus conf as the CNI plugin reads it (the list's `cniVersion` and `name` in it).
fn plugin_conf(conflist: &Value) -> plexus_cni::conf::PlexusConf {
    let mut plugin = conflist["plugins"][0].clone();
    plugin["cniVersion"] = conflist["cniVersion"].clone();
    plugin["name"] = conflist["name"].clone();
    plexus_cni::conf::PlexusConf::from_json(plugin, false).unwrap()
}

#[test]
fn the_conflist_leads_the_cni_plugin_to_a_daemon_and_cache_that_moved() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut opts, env) = node(tmp.path());
    write_json(&opts.conf_dir.join("10-calico.conflist"), &calico());
    let read = |opts: &InstallOptions| -> Value {
        refresh(opts, &env, false).unwrap();
        serde_json::from_slice(&fs::read(opts.conf_dir.join(CONFLIST_NAME)).unwrap()).unwrap()
    };

    // The defaults (what `plexus daemon --install` fills in with its own default flags) add no key.
    opts.node_paths = NodePaths {
        run_dir: Some("/run/plexus".into()),
        daemon_socket: Some("/run/plexus/daemon.sock".into()),
        cache_dir: Some("/var/lib/plexus".into()),
    };
    let conflist = read(&opts);
    for key in ["runDir", "daemon", "cacheDir"] {
        assert!(
            conflist["plugins"][0].get(key).is_none(),
            "{key}: {conflist}"
        );
    }

    // A DaemonSet that moved them: the CNI plugin finds the daemon, takes its locks and reads plans there.
    opts.node_paths = NodePaths {
        run_dir: Some("/srv/plexus/run".into()),
        daemon_socket: Some("/srv/plexus/run/daemon.sock".into()),
        cache_dir: Some("/srv/plexus/cache".into()),
    };
    let conf = plugin_conf(&read(&opts));
    assert_eq!(conf.run_dir, Path::new("/srv/plexus/run"));
    assert_eq!(
        conf.daemon.unwrap().socket,
        Path::new("/srv/plexus/run/daemon.sock")
    );
    assert_eq!(conf.cache_dir, Path::new("/srv/plexus/cache"));

    // A socket elsewhere than its run dir is named on its own.
    opts.node_paths.daemon_socket = Some("/srv/other.sock".into());
    let conflist = read(&opts);
    assert_eq!(
        conflist["plugins"][0]["daemon"]["socket"],
        "/srv/other.sock"
    );
    assert_eq!(
        plugin_conf(&conflist).daemon.unwrap().socket,
        Path::new("/srv/other.sock")
    );

    // Compat mode for a cluster coming from Multus.
    opts.compat_multus = true;
    let conf = plugin_conf(&read(&opts));
    assert_eq!(conf.compat, plexus_cni::conf::Compat::Multus);
    assert_eq!(conf.system_namespaces, vec!["kube-system"]);
    assert!(
        parse_args(&args(&["--compat", "multus"]))
            .unwrap()
            .compat_multus
    );
    assert!(!parse_args(&args(&[])).unwrap().compat_multus);
    assert!(parse_args(&args(&["--compat", "loose"])).is_err());

    // From the command line.
    let parsed = parse_args(&args(&[
        "--run-dir=/a",
        "--daemon-socket=/a/d.sock",
        "--cache-dir=/c",
    ]))
    .unwrap();
    assert_eq!(parsed.node_paths.run_dir, Some("/a".into()));
    assert_eq!(parsed.node_paths.daemon_socket, Some("/a/d.sock".into()));
    assert_eq!(parsed.node_paths.cache_dir, Some("/c".into()));
}

/// A thin Multus conf as Multus's quick-start writes one (the keys of its configuration reference).
fn thin_multus() -> Value {
    json!({
        "cniVersion": "0.3.1",
        "name": "multus-cni-network",
        "type": "multus",
        "kubeconfig": "/etc/cni/net.d/multus.d/multus.kubeconfig",
        "confDir": "/etc/cni/multus/net.d",
        "cniDir": "/var/lib/cni/multus",
        "binDir": "/opt/cni/bin",
        "logFile": "/var/log/multus.log",
        "logLevel": "verbose",
        "logToStderr": true,
        "capabilities": {"portMappings": true},
        "readinessindicatorfile": "/run/flannel/subnet.env",
        "namespaceIsolation": true,
        "globalNamespaces": "default,shared",
        "clusterNetwork": "k8s-pod-network",
        "defaultNetworks": ["sidecar-net"],
        "systemNamespaces": ["kube-system", "monitoring"],
        "multusNamespace": "network-system",
        "retryDeleteOnError": false
    })
}

#[test]
fn a_thin_multus_conf_becomes_the_equivalent_plexus_conflist() {
    let converted = plexus_node::multus::from_multus(&thin_multus()).unwrap();
    let conf = plugin_conf(&converted.conflist);
    assert_eq!(converted.conflist["cniVersion"], "0.3.1");
    assert_eq!(conf.compat, plexus_cni::conf::Compat::Multus);
    assert_eq!(conf.cluster_network, "k8s-pod-network");
    assert_eq!(conf.default_networks, vec!["sidecar-net".to_string()]);
    assert_eq!(conf.system_namespaces, vec!["kube-system", "monitoring"]);
    assert_eq!(conf.plexus_namespace, "network-system");
    assert_eq!(conf.conf_dir, Path::new("/etc/cni/multus/net.d"));
    assert_eq!(conf.bin_dir.as_deref(), Some(Path::new("/opt/cni/bin")));
    assert_eq!(
        conf.readiness_indicator_file.as_deref(),
        Some(Path::new("/run/flannel/subnet.env"))
    );
    assert_eq!(conf.log_level, "info");
    let plugin = &converted.conflist["plugins"][0];
    assert_eq!(
        plugin["cluster"],
        json!({"source": "kube", "kubeconfig": "/etc/cni/net.d/multus.d/multus.kubeconfig"})
    );
    assert_eq!(plugin["capabilities"], json!({"portMappings": true}));
    // Each key without an equivalent is named, with what to do instead.
    let named = |key: &str| {
        converted
            .notes
            .iter()
            .any(|n| n.starts_with(&format!("{key}:")))
    };
    for key in [
        "cniDir",
        "namespaceIsolation",
        "globalNamespaces",
        "logToStderr",
        "retryDeleteOnError",
    ] {
        assert!(named(key), "{key}: {:?}", converted.notes);
    }
    assert!(
        !named("clusterNetwork") && !named("kubeconfig"),
        "{:?}",
        converted.notes
    );
    assert!(converted
        .notes
        .iter()
        .any(|n| n.contains("namespace-isolation")));
}

#[test]
fn the_thick_plugins_confs_and_what_is_not_a_multus_conf() {
    // The shim conf the thick daemon writes, in a conflist.
    let shim = json!({"cniVersion": "0.3.1", "name": "multus-cni-network",
                      "plugins": [{"type": "multus-shim", "logLevel": "debug", "socketDir": "/run/multus/"}]});
    let converted = plexus_node::multus::from_multus(&shim).unwrap();
    let conf = plugin_conf(&converted.conflist);
    assert_eq!(conf.log_level, "debug");
    // What Multus's auto-configuration takes: the node's conf dir, a directory, read as Multus reads it.
    assert_eq!(conf.cluster_network, "/etc/cni/net.d");
    assert!(
        converted.notes.iter().any(|n| n.starts_with("socketDir:")),
        "{:?}",
        converted.notes
    );
    // No clusterNetwork: said, and what install does instead.
    assert!(
        converted
            .notes
            .iter()
            .any(|n| n.starts_with("clusterNetwork:")),
        "{:?}",
        converted.notes
    );

    // The thick daemon's configuration.
    let daemon = json!({"chrootDir": "/hostroot", "cniVersion": "0.3.1", "logLevel": "verbose",
                        "cniConfigDir": "/host/etc/cni/net.d", "multusAutoconfigDir": "/host/etc/cni/net.d",
                        "multusConfigFile": "auto", "socketDir": "/host/run/multus/"});
    let converted = plexus_node::multus::from_multus(&daemon).unwrap();
    assert_eq!(converted.conflist["plugins"][0]["compat"], "multus");
    assert!(converted
        .notes
        .iter()
        .any(|n| n.starts_with("multusConfigFile:") && n.contains("auto")));

    for (bad, why) in [
        (
            json!({"cniVersion": "1.0.0", "type": "bridge"}),
            "its type is \"bridge\"",
        ),
        (json!([1]), "JSON object"),
        (json!({"cniVersion": "1.0.0"}), "no \"type\""),
    ] {
        let err = plexus_node::multus::from_multus(&bad).unwrap_err();
        assert!(err.contains(why), "{err}");
    }
}

#[test]
fn install_from_multus_prints_the_conflist_and_installs_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("00-multus.conf");
    write_json(&file, &thin_multus());
    let conf_dir = tmp.path().join("net.d");
    fs::create_dir_all(&conf_dir).unwrap();
    let out = Command::new(plexus_tests::plexus::plexus_bin())
        .args(["install", "--from-multus"])
        .arg(&file)
        .arg(format!("--conf-dir={}", conf_dir.display()))
        .arg(format!("--bin-dir={}", tmp.path().join("bin").display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        printed,
        plexus_node::multus::from_multus(&thin_multus())
            .unwrap()
            .conflist
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("not carried over: cniDir"));
    assert_eq!(
        fs::read_dir(&conf_dir).unwrap().count(),
        0,
        "nothing installed"
    );
    assert!(!tmp.path().join("bin").exists());

    // A file that is not one fails, naming it; --watch with it is a usage mistake.
    write_json(&file, &json!({"cniVersion": "1.0.0", "type": "bridge"}));
    let out = Command::new(plexus_tests::plexus::plexus_bin())
        .args(["install", "--from-multus"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("00-multus.conf"));
    let out = Command::new(plexus_tests::plexus::plexus_bin())
        .args(["install", "--watch", "--from-multus"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
