//! The deployment manifests in examples/deploy/ parse into typed Kubernetes objects, with no stray keys,
//! and grant Plexus exactly the permissions it uses.

use plexus_node::install;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/deploy")
}

/// Every document of every manifest, with the file it came from.
fn documents() -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no manifests in {}",
        deploy_dir().display()
    );
    let mut docs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let values: Vec<Value> =
            serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        for value in values.into_iter().filter(|v| !v.is_null()) {
            docs.push((name.clone(), value));
        }
    }
    docs
}

/// Parses `value` as `T` and insists that serializing it back gives the same document: k8s-openapi ignores
/// unknown keys, so a typo'd key would otherwise vanish silently.
fn strict<T: DeserializeOwned + Serialize>(file: &str, value: &Value) -> Result<T, String> {
    let typed: T = serde_json::from_value(value.clone()).map_err(|e| format!("{file}: {e}"))?;
    let back = serde_json::to_value(&typed).unwrap();
    if &back != value {
        return Err(format!(
            "{file}: keys lost or changed in a round trip: {}",
            first_difference(value, &back, "")
        ));
    }
    Ok(typed)
}

fn first_difference(a: &Value, b: &Value, at: &str) -> String {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                match y.get(k) {
                    None => return format!("{at}/{k} is not a known field"),
                    Some(w) if v != w => return first_difference(v, w, &format!("{at}/{k}")),
                    _ => {}
                }
            }
            format!("{at}: extra keys after the round trip")
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            let i = x.iter().zip(y).position(|(v, w)| v != w).unwrap_or(0);
            first_difference(&x[i], &y[i], &format!("{at}/{i}"))
        }
        _ => format!("{at}: {a} became {b}"),
    }
}

#[derive(Default)]
struct Manifests {
    crds: Vec<CustomResourceDefinition>,
    roles: Vec<ClusterRole>,
    bindings: Vec<ClusterRoleBinding>,
    accounts: Vec<ServiceAccount>,
    daemonsets: Vec<DaemonSet>,
    config_maps: Vec<ConfigMap>,
    policies: Vec<ValidatingAdmissionPolicy>,
    policy_bindings: Vec<ValidatingAdmissionPolicyBinding>,
    /// PrometheusRule objects (prometheus-operator's CRD; no typed model here).
    alerts: Vec<Value>,
}

fn manifests() -> Manifests {
    let mut m = Manifests::default();
    for (file, doc) in documents() {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        let r = match kind.as_str() {
            "CustomResourceDefinition" => strict(&file, &doc).map(|o| m.crds.push(o)),
            "ClusterRole" => strict(&file, &doc).map(|o| m.roles.push(o)),
            "ClusterRoleBinding" => strict(&file, &doc).map(|o| m.bindings.push(o)),
            "ServiceAccount" => strict(&file, &doc).map(|o| m.accounts.push(o)),
            "DaemonSet" => strict(&file, &doc).map(|o| m.daemonsets.push(o)),
            "ConfigMap" => strict(&file, &doc).map(|o| m.config_maps.push(o)),
            "ValidatingAdmissionPolicy" => strict(&file, &doc).map(|o| m.policies.push(o)),
            "ValidatingAdmissionPolicyBinding" => {
                strict(&file, &doc).map(|o| m.policy_bindings.push(o))
            }
            "PrometheusRule" if doc["apiVersion"] == "monitoring.coreos.com/v1" => {
                m.alerts.push(doc);
                Ok(())
            }
            other => Err(format!("{file}: unexpected kind {other:?}")),
        };
        r.unwrap_or_else(|e| panic!("{e}"));
    }
    m
}

impl Manifests {
    /// The DaemonSet `name`: `plexus` (daemonset.yaml, CNI mode) or `plexus-nri` (nri-daemonset.yaml).
    fn daemonset(&self, name: &str) -> &DaemonSet {
        self.daemonsets
            .iter()
            .find(|d| d.metadata.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no DaemonSet {name}"))
    }
}

#[test]
fn every_manifest_is_a_typed_object_without_stray_keys() {
    let m = manifests();
    assert_eq!(
        (
            m.crds.len(),
            m.roles.len(),
            m.bindings.len(),
            m.accounts.len(),
            m.daemonsets.len(),
            m.alerts.len(),
            m.policies.len(),
            m.policy_bindings.len(),
            m.config_maps.len(),
        ),
        (4, 1, 1, 1, 2, 1, 1, 1, 1)
    );
    // The binding enforces the policy shipped beside it.
    let binding = &m.policy_bindings[0].spec;
    assert_eq!(
        Some(binding.policy_name.as_str()),
        m.policies[0].metadata.name.as_deref()
    );
    assert_eq!(binding.validation_actions, ["Deny"]);
}

#[test]
fn alerts_name_metrics_the_daemon_exports_and_promtool_accepts_them() {
    let m = manifests();
    let rule = &m.alerts[0];
    // The families the daemon's /metrics has, by their names in the classic format.
    // The series the daemon's /metrics can have (a histogram's are its _bucket, _sum and _count).
    let exported: BTreeSet<String> = plexus_node::daemon::metrics::Metrics::new()
        .families()
        .iter()
        .flat_map(|(name, kind)| match *kind {
            "histogram" => ["_bucket", "_sum", "_count"]
                .iter()
                .map(|s| format!("{name}{s}"))
                .collect::<Vec<_>>(),
            _ => vec![name.clone()],
        })
        .collect();
    let mut alerts = 0;
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for r in group["rules"].as_array().unwrap() {
            alerts += 1;
            let name = r["alert"].as_str().unwrap();
            let expr = r["expr"].as_str().unwrap();
            assert!(r["labels"]["severity"].is_string(), "{name}: no severity");
            assert!(
                r["annotations"]["summary"].is_string(),
                "{name}: no summary"
            );
            // Every metric an alert reads exists: one misspelt name and the alert can never fire.
            let names: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("plexus_") || w.starts_with("process_"))
                .collect();
            assert!(!names.is_empty(), "{name}: reads no Plexus metric");
            for n in names {
                assert!(
                    exported.contains(n),
                    "{name}: {n} is not exported ({exported:?})"
                );
            }
        }
    }
    assert!(alerts >= 5, "{alerts}");
    // Prometheus's own checker on the rule groups (a rules file is the spec's `groups`).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.json");
    std::fs::write(&file, serde_json::to_string(&rule["spec"]).unwrap()).unwrap();
    let out = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool (Debian's prometheus package) must be installed: tests/setup.sh");
    assert!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn strict_parsing_catches_a_typo() {
    let mut doc = documents()
        .into_iter()
        .find(|(_, d)| d["kind"] == "DaemonSet")
        .unwrap()
        .1;
    let spec = doc["spec"]["template"]["spec"].as_object_mut().unwrap();
    let sa = spec.remove("serviceAccountName").unwrap();
    spec.insert("serviceAcountName".into(), sa);
    let err = strict::<DaemonSet>("typo.yaml", &doc).unwrap_err();
    assert_eq!(err, "typo.yaml: keys lost or changed in a round trip: /spec/template/spec/serviceAcountName is not a known field");
}

#[test]
fn rbac_grants_exactly_what_plexus_uses() {
    let m = manifests();
    let role = &m.roles[0];
    let mut granted = BTreeSet::new();
    for rule in role.rules.as_deref().unwrap_or_default() {
        assert!(
            rule.resource_names.is_none() && rule.non_resource_urls.is_none(),
            "{rule:?}"
        );
        for group in rule.api_groups.as_deref().unwrap_or_default() {
            for resource in rule.resources.as_deref().unwrap_or_default() {
                for verb in &rule.verbs {
                    assert!(
                        granted.insert((group.as_str(), resource.as_str(), verb.as_str())),
                        "granted twice: {verb} {resource}"
                    );
                }
            }
        }
    }
    let expected: BTreeSet<_> = [
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods/status", "patch"),
        ("k8s.cni.cncf.io", "network-attachment-definitions", "get"),
        ("k8s.cni.cncf.io", "network-attachment-definitions", "list"),
        ("k8s.cni.cncf.io", "network-attachment-definitions", "watch"),
        ("", "events", "create"),
        ("", "events", "patch"),
        // The node agent: hook resources read, its node's NodeHookStatus applied (and the status entry of an
        // earlier version removed), its Node's labels read.
        ("plexus.dev", "networkhooks", "list"),
        ("plexus.dev", "networkhooks", "watch"),
        ("plexus.dev", "networkhooks/status", "patch"),
        ("plexus.dev", "nodehookstatuses", "create"),
        ("plexus.dev", "nodehookstatuses", "patch"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        // Dynamic Resource Allocation: the pods' claims read by name, slices watched, the claims' device
        // status written back, and the per-driver grant 1.36's granular status authorization asks for.
        ("resource.k8s.io", "resourceclaims", "get"),
        ("resource.k8s.io", "resourceslices", "list"),
        ("resource.k8s.io", "resourceslices", "watch"),
        ("resource.k8s.io", "resourceclaims/status", "patch"),
        (
            "resource.k8s.io",
            "resourceclaims/driver",
            "associated-node:patch",
        ),
    ]
    .into();
    assert_eq!(granted, expected);
    assert!(role.aggregation_rule.is_none());
}

#[test]
fn binding_ties_the_role_to_the_daemonsets_service_account() {
    let m = manifests();
    let (role, binding, account) = (&m.roles[0], &m.bindings[0], &m.accounts[0]);
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(
        binding.role_ref.api_group.as_deref(),
        Some("rbac.authorization.k8s.io")
    );
    assert_eq!(Some(&binding.role_ref.name), role.metadata.name.as_ref());
    let subjects = binding.subjects.as_deref().unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(Some(&subjects[0].name), account.metadata.name.as_ref());
    assert_eq!(subjects[0].namespace, account.metadata.namespace);
    // Both DaemonSets (CNI mode and NRI mode) run as the account.
    assert_eq!(m.daemonsets.len(), 2);
    for ds in &m.daemonsets {
        let pod = ds.spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.service_account_name, account.metadata.name);
        assert_eq!(ds.metadata.namespace, account.metadata.namespace);
    }
}

/// `$(NAME)` in an argument, as kubelet expands it from the container's environment: each variable must be
/// declared there (a literal value, or a field reference: `status.podIP` gets `pod_ip`).
fn expand_env(
    arg: &str,
    container: &k8s_openapi::api::core::v1::Container,
    pod_ip: &str,
) -> String {
    let mut out = arg.to_string();
    for var in container.env.as_deref().unwrap_or_default() {
        let value = match (
            &var.value,
            var.value_from.as_ref().and_then(|f| f.field_ref.as_ref()),
        ) {
            (Some(v), _) => v.clone(),
            (None, Some(f)) if f.field_path == "status.podIP" => pod_ip.to_string(),
            (None, Some(f)) if f.field_path == "spec.nodeName" => "node".to_string(),
            _ => continue,
        };
        out = out.replace(&format!("$({})", var.name), &value);
    }
    assert!(
        !out.contains("$("),
        "{arg}: a variable the container does not declare"
    );
    out
}

/// The pod's hostPath volumes: name to host path.
fn host_paths(pod: &k8s_openapi::api::core::v1::PodSpec) -> BTreeMap<&str, &str> {
    pod.volumes
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter_map(|v| Some((v.name.as_str(), v.host_path.as_ref()?.path.as_str())))
        .collect()
}

/// A mount with propagation needs its host path to be, or lie under, a shared or slave mount, and the runtime
/// looks the path up as written: through the `/var/run -> /run` symlink it finds the root mount, which is private
/// on nodes without systemd, and the container is never created. Real paths (`/run/...`) work either way.
#[test]
fn no_host_path_with_mount_propagation_goes_through_var_run() {
    let m = manifests();
    let mut checked = 0;
    for ds in &m.daemonsets {
        let pod = ds.spec.template.spec.as_ref().unwrap();
        let host_paths = host_paths(pod);
        let containers = pod.init_containers.iter().flatten().chain(&pod.containers);
        for c in containers {
            for mount in c.volume_mounts.iter().flatten() {
                let Some(path) = host_paths.get(mount.name.as_str()) else {
                    continue;
                };
                assert!(
                    !path.starts_with("/var/run/"),
                    "{}: volume {} (hostPath {path}) is a {} mount through the /var/run symlink: use /run",
                    c.name,
                    mount.name,
                    mount.mount_propagation.as_deref().unwrap_or("plain")
                );
                checked += usize::from(mount.mount_propagation.is_some());
            }
        }
    }
    assert!(
        checked > 0,
        "the DaemonSet has a propagation mount to check"
    );
}

#[test]
fn daemonset_installs_plexus_with_flags_the_installer_accepts() {
    let m = manifests();
    let ds = m.daemonset("plexus");
    let spec = &ds.spec;
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(
        spec.selector.match_labels,
        spec.template.metadata.as_ref().unwrap().labels,
        "selector matches the pods"
    );
    assert!(
        pod.tolerations
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists")),
        "runs on every node"
    );

    let host_paths = host_paths(pod);
    let init = pod.init_containers.as_deref().unwrap_or_default();
    assert_eq!(init.len(), 1);
    assert_eq!(pod.containers.len(), 1, "one long-running process per node");
    let daemon = &pod.containers[0];
    let mut commands = vec![(init[0].clone(), false)];
    commands.extend(pod.containers.iter().map(|c| (c.clone(), true)));
    for (container, long_running) in commands {
        let command = container.command.clone().unwrap_or_default();
        let mut agent_dirs = Vec::new();
        let opts = if long_running {
            assert_eq!(command.get(1).map(String::as_str), Some("daemon"));
            // `$(NAME)` is expanded by kubelet from the container's environment: here from its field
            // references, with values such a pod gets (an IPv6 pod's address has no brackets).
            for pod_ip in ["192.0.2.7", "fd00::7"] {
                let expanded: Vec<String> = command[2..]
                    .iter()
                    .map(|a| expand_env(a, &container, pod_ip))
                    .collect();
                let settings = plexus_node::daemon::parse_args(&expanded, Some("node".into()))
                    .unwrap_or_else(|e| panic!("{}: {e}", container.name));
                // Scraped on the node's address, on the port the pod declares and the annotations name.
                let bind = settings.metrics_bind.expect("the daemon serves metrics");
                assert_eq!(bind.ip(), pod_ip.parse::<std::net::IpAddr>().unwrap());
                let declared = container
                    .ports
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .find(|p| p.name.as_deref() == Some("metrics"))
                    .map(|p| p.container_port);
                assert_eq!(declared, Some(i32::from(bind.port())));
                let annotations = spec.template.metadata.as_ref().unwrap().annotations.clone();
                let annotation = |k: &str| annotations.as_ref().and_then(|a| a.get(k).cloned());
                assert_eq!(
                    annotation("prometheus.io/port"),
                    Some(bind.port().to_string())
                );
                assert_eq!(annotation("prometheus.io/scrape"), Some("true".into()));
                assert_eq!(annotation("prometheus.io/path"), Some("/metrics".into()));
            }
            let expanded: Vec<String> = command[2..]
                .iter()
                .map(|a| expand_env(a, &container, "192.0.2.7"))
                .collect();
            let settings = plexus_node::daemon::parse_args(&expanded, Some("node".into()))
                .unwrap_or_else(|e| panic!("{}: {e}", container.name));
            // The CNI binary's default (runDir /run/plexus) finds this socket.
            assert_eq!(settings.socket, Path::new("/run/plexus/daemon.sock"));
            // The node agent publishes the hook set where the CNI binary's default cacheDir looks.
            let agent = settings.hooks.clone().expect("the daemon delivers hooks");
            assert_eq!(agent.cache_dir, Path::new("/var/lib/plexus"));
            assert_eq!(
                agent.signatures,
                plexus_node::daemon::agent::SignaturePolicy::Required
            );
            agent_dirs.push(agent.cache_dir.clone());
            // Dynamic networks read the attachment cache under the CNI binary's default cacheDir, and the
            // delegates they run need the pods' namespaces (seen as the runtime creates them), host-local's
            // store and a plugin's privileges.
            let dynamic = settings.dynamic.clone().expect("dynamic networks are on");
            assert_eq!(dynamic.cache_dir, Path::new("/var/lib/plexus"));
            let mounts = container.volume_mounts.as_deref().unwrap_or_default();
            for path in ["/run/netns", "/var/run/netns"] {
                let netns = mounts
                    .iter()
                    .find(|m| m.mount_path == path)
                    .unwrap_or_else(|| panic!("{path} is mounted"));
                assert_eq!(netns.mount_propagation.as_deref(), Some("HostToContainer"));
            }
            assert!(mounts.iter().any(|m| m.mount_path == "/var/lib/cni"));
            assert_eq!(
                container
                    .security_context
                    .as_ref()
                    .and_then(|s| s.privileged),
                Some(true)
            );
            agent_dirs.push("/run/netns".into());
            agent_dirs.push("/var/lib/cni".into());
            for key in &agent.key_files {
                assert!(
                    container
                        .volume_mounts
                        .as_deref()
                        .unwrap_or_default()
                        .iter()
                        .any(|vm| key.starts_with(&vm.mount_path)),
                    "hook key {} is mounted",
                    key.display()
                );
            }
            settings
                .install
                .expect("the daemon also keeps the install current")
        } else {
            assert_eq!(command.get(1).map(String::as_str), Some("install"));
            install::parse_args(&command[2..]).unwrap_or_else(|e| panic!("{}: {e}", container.name))
        };
        assert_eq!(opts.watch, long_running, "{}", container.name);
        assert!(!opts.uninstall);
        // Host directories are mounted at their host paths, so the paths written into the conflist hold.
        let mut dirs = vec![
            opts.bin_dir.clone(),
            opts.conf_dir.clone(),
            opts.kubeconfig_out
                .parent()
                .unwrap()
                .parent()
                .unwrap()
                .to_path_buf(),
        ];
        if long_running {
            dirs.push("/run/plexus".into());
        }
        dirs.extend(agent_dirs);
        for dir in &dirs {
            let mount = container
                .volume_mounts
                .as_deref()
                .unwrap_or_default()
                .iter()
                .find(|vm| dir.starts_with(&vm.mount_path))
                .unwrap_or_else(|| {
                    panic!("{}: nothing mounted at {}", container.name, dir.display())
                });
            assert_eq!(
                host_paths.get(mount.name.as_str()),
                Some(&mount.mount_path.as_str()),
                "{}",
                mount.name
            );
        }
    }
    // Every container runs the image examples/image/build.sh makes (its default name).
    let script = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/image/build.sh"),
    )
    .unwrap();
    let built = script
        .lines()
        .find_map(|l| l.strip_prefix("name=\""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("build.sh names its image");
    for c in init.iter().chain(&pod.containers) {
        assert_eq!(c.image.as_deref(), Some(built), "{}", c.name);
    }
    // The daemon learns its node from the downward API.
    let env = daemon.env.as_deref().unwrap_or_default();
    let node = env
        .iter()
        .find(|e| e.name == "NODE_NAME")
        .expect("NODE_NAME");
    assert_eq!(
        node.value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str()),
        Some("spec.nodeName")
    );
}

/// The NRI variant: the daemon alone (nothing installed into the node's CNI dirs, which it mounts read only),
/// `plexus daemon --nri` with flags it accepts and the conf of its ConfigMap, and every path the conf and the flags
/// name mounted from the host at the same path: the NRI socket's directory, the delegates, the pods' namespaces,
/// host-local's store, the attachment cache (where the node agent publishes the hook set), the run dir, the kubelet's
/// pod resources and the device-info files.
#[test]
fn the_nri_daemonset_runs_the_daemon_in_nri_mode_with_its_configmaps_conf() {
    let m = manifests();
    let ds = m.daemonset("plexus-nri");
    let pod = ds.spec.template.spec.as_ref().unwrap();
    assert_eq!(
        pod.host_network,
        Some(true),
        "the daemon tells host-network pods by its own namespace"
    );
    assert!(pod.init_containers.is_none(), "nothing is installed");
    assert_eq!(pod.containers.len(), 1);
    let daemon = &pod.containers[0];
    let cni = m.daemonset("plexus").spec.template.spec.as_ref().unwrap();
    assert_eq!(daemon.image, cni.containers[0].image, "the same image");
    let host_paths = host_paths(pod);
    let mounts = daemon.volume_mounts.as_deref().unwrap_or_default();
    // The path inside the container of `dir`, checked to be the host's same path.
    let mounted = |dir: &Path| {
        let mount = mounts
            .iter()
            .find(|vm| dir.starts_with(&vm.mount_path))
            .unwrap_or_else(|| panic!("nothing mounted at {}", dir.display()));
        let host = host_paths
            .get(mount.name.as_str())
            .unwrap_or_else(|| panic!("{} is not a host path", mount.mount_path));
        // The same path, or /var/run/X from the host's /run/X (/var/run is /run on a node).
        assert!(
            *host == mount.mount_path || mount.mount_path.strip_prefix("/var") == Some(*host),
            "{} is mounted from {host}",
            mount.mount_path
        );
        mount
    };

    // The conf: the ConfigMap's entry, mounted where --nri-conf names it.
    let command = daemon.command.clone().unwrap_or_default();
    assert_eq!(command.get(1).map(String::as_str), Some("daemon"));
    let conf_path = command
        .iter()
        .find_map(|a| a.strip_prefix("--nri-conf="))
        .map(PathBuf::from)
        .expect("--nri-conf");
    let conf_mount = mounts
        .iter()
        .find(|vm| conf_path.parent() == Some(Path::new(&vm.mount_path)))
        .expect("the conf's directory is mounted");
    let volume = pod
        .volumes
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|v| v.name == conf_mount.name)
        .unwrap();
    let map_name = volume
        .config_map
        .as_ref()
        .expect("a ConfigMap")
        .name
        .clone();
    let map = m
        .config_maps
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(map_name.as_str()))
        .expect("the ConfigMap is in the manifest");
    assert_eq!(map.metadata.namespace, ds.metadata.namespace);
    let key = conf_path.file_name().unwrap().to_str().unwrap();
    let text = map
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .expect("the conf's entry");
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join(key);
    std::fs::write(&local, text).unwrap();

    let args: Vec<String> = command[2..]
        .iter()
        .map(|a| expand_env(a, daemon, "192.0.2.7"))
        .map(|a| match a.starts_with("--nri-conf=") {
            true => format!("--nri-conf={}", local.display()),
            false => a,
        })
        .collect();
    let settings = plexus_node::daemon::parse_args(&args, Some("node".into()))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(settings.install.is_none(), "NRI mode installs nothing");
    let (nri, conf) = settings.nri.clone().expect("NRI mode");
    let conf = plexus_cni::conf::PlexusConf::from_json(conf, false).unwrap();
    mounted(nri.socket.parent().unwrap());
    for dir in [
        Path::new(&nri.cni_path),
        conf.conf_dir.as_path(),
        conf.cache_dir.as_path(),
        conf.run_dir.as_path(),
        conf.pod_resources_socket.parent().unwrap(),
        conf.device_info_dir.as_path(),
        conf.device_plugin_info_dir.as_path(),
        Path::new("/var/lib/cni"),
    ] {
        mounted(dir);
    }
    for dir in [Path::new(&nri.cni_path), conf.conf_dir.as_path()] {
        assert_eq!(mounted(dir).read_only, Some(true), "{}", dir.display());
    }
    for path in ["/run/netns", "/var/run/netns"] {
        let netns = mounted(Path::new(path));
        assert_eq!(netns.mount_propagation.as_deref(), Some("HostToContainer"));
    }
    // The daemon's socket where the health probe asks, the hook set published where the conf's hooks are read,
    // and dynamic networks on the same attachment cache.
    assert_eq!(settings.socket, Path::new("/run/plexus/daemon.sock"));
    let agent = settings.hooks.clone().expect("the daemon delivers hooks");
    assert_eq!(agent.cache_dir, conf.cache_dir);
    assert!(
        conf.cluster_hooks,
        "the node's hook set applies (NRI mode's default)"
    );
    let dynamic = settings.dynamic.clone().expect("dynamic networks are on");
    assert_eq!(dynamic.cache_dir, conf.cache_dir);
    assert_eq!(
        daemon.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );
}

#[test]
fn crds_define_the_spec_resources() {
    let m = manifests();
    let by_name: BTreeMap<_, _> = m
        .crds
        .iter()
        .map(|c| (c.metadata.name.clone().unwrap(), c))
        .collect();

    // The hook resource, as the node agent reads and reports it.
    use plexus_node::daemon::agent;
    let hook = by_name[&format!("{}.{}", agent::PLURAL, agent::GROUP)];
    assert_eq!(hook.spec.group, agent::GROUP);
    assert_eq!(hook.spec.scope, "Cluster");
    assert_eq!(hook.spec.names.kind, agent::KIND);
    let version = &hook.spec.versions[0];
    assert_eq!(version.name, agent::VERSION);
    assert!(version
        .subresources
        .as_ref()
        .is_some_and(|s| s.status.is_some()));
    let schema = serde_json::to_value(version.schema.as_ref().unwrap()).unwrap();
    let props = &schema["openAPIV3Schema"]["properties"];
    let spec_fields: BTreeSet<&str> = props["spec"]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        spec_fields,
        [
            "kind",
            "module",
            "settings",
            "order",
            "failurePolicy",
            "timeoutMs",
            "memoryLimitMiB",
            "namespaces",
            "nodeSelector"
        ]
        .into()
    );
    // The per-node list of earlier versions stays in the schema for a rolling upgrade, keyed so that an agent can
    // still remove its own entry.
    let nodes = &props["status"]["properties"]["nodes"];
    assert_eq!(nodes["x-kubernetes-list-type"], "map");
    assert_eq!(
        nodes["x-kubernetes-list-map-keys"],
        serde_json::json!(["node"])
    );

    // What a node reports, in an object of its own, as the agent writes it and `plexus hook status` reads it.
    use plexus_node::node_report;
    let per_node = by_name[&format!("{}.{}", node_report::PLURAL, node_report::GROUP)];
    assert_eq!(per_node.spec.scope, "Cluster");
    assert_eq!(per_node.spec.names.kind, node_report::KIND);
    let version = &per_node.spec.versions[0];
    assert_eq!(version.name, node_report::VERSION);
    let columns: Vec<(&str, &str)> = version
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| (c.name.as_str(), c.json_path.as_str()))
        .collect();
    assert_eq!(
        columns,
        [
            ("Active", ".status.active"),
            ("Failing", ".status.failing"),
            ("Age", ".metadata.creationTimestamp")
        ]
    );
    let schema = serde_json::to_value(version.schema.as_ref().unwrap()).unwrap();
    let status = &schema["openAPIV3Schema"]["properties"]["status"]["properties"];
    assert_eq!(status["hooks"]["maxItems"], node_report::MAX_HOOKS);
    assert_eq!(
        status["hooks"]["items"]["properties"]["message"]["maxLength"],
        node_report::MAX_MESSAGE
    );
    // The schema takes exactly what the agent writes.
    let written = serde_json::to_value(node_report::HookReport {
        name: "h".into(),
        active: true,
        reason: "Active".into(),
        message: "m".into(),
        digest: Some("sha256:0".into()),
        next_attempt_time: Some("2026-01-01T00:00:00Z".into()),
        observed_generation: 1,
    })
    .unwrap();
    let fields: BTreeSet<&str> = written
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let declared: BTreeSet<&str> = status["hooks"]["items"]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(fields, declared);

    let nad = by_name["network-attachment-definitions.k8s.cni.cncf.io"];
    assert_eq!(nad.spec.group, "k8s.cni.cncf.io");
    assert_eq!(nad.spec.scope, "Namespaced");
    assert_eq!(nad.spec.names.kind, "NetworkAttachmentDefinition");
    assert_eq!(nad.spec.names.plural, "network-attachment-definitions");
    assert_eq!(
        nad.spec.names.short_names.as_deref(),
        Some(&["net-attach-def".to_string()][..])
    );
    let v1 = &nad.spec.versions[0];
    assert_eq!(
        (v1.name.as_str(), v1.served, v1.storage),
        ("v1", true, true)
    );
    let schema = v1
        .schema
        .as_ref()
        .unwrap()
        .open_api_v3_schema
        .as_ref()
        .unwrap();
    let config = &schema.properties.as_ref().unwrap()["spec"]
        .properties
        .as_ref()
        .unwrap()["config"];
    assert_eq!(config.type_.as_deref(), Some("string"));

    let claim = by_name["ipamclaims.k8s.cni.cncf.io"];
    assert_eq!(claim.spec.group, "k8s.cni.cncf.io");
    assert_eq!(claim.spec.names.kind, "IPAMClaim");
    assert_eq!(claim.spec.names.list_kind.as_deref(), Some("IPAMClaimList"));
    let v = &claim.spec.versions[0];
    assert_eq!(
        (v.name.as_str(), v.served, v.storage),
        ("v1alpha1", true, true)
    );
    assert!(
        v.subresources.as_ref().unwrap().status.is_some(),
        "status is a subresource (spec 8.2)"
    );
    let props = v
        .schema
        .as_ref()
        .unwrap()
        .open_api_v3_schema
        .as_ref()
        .unwrap()
        .properties
        .as_ref()
        .unwrap();
    assert_eq!(
        props["spec"].required.as_deref(),
        Some(&["interface".to_string(), "network".to_string()][..])
    );
    assert_eq!(
        props["status"].required.as_deref(),
        Some(&["ips".to_string()][..])
    );

    for crd in &m.crds {
        let expected = format!("{}.{}", crd.spec.names.plural, crd.spec.group);
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some(expected.as_str()),
            "a CRD is named plural.group"
        );
    }
}

/// The manifests (`kubectl apply -f examples/deploy/NAME`) the section of docs/operations.md under `heading`
/// applies, in order.
fn applied_in(heading: &str) -> Vec<String> {
    named_in(heading, "kubectl apply -f examples/deploy/")
}

/// The manifests `kubectl delete -f examples/deploy/...` lines of a section of docs/operations.md delete, in order.
fn deleted_in(heading: &str) -> Vec<String> {
    named_in(heading, "kubectl delete -f examples/deploy/")
}

fn named_in(heading: &str, command: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let section: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != heading)
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .collect();
    assert!(
        !section.is_empty(),
        "no section {heading:?} in {}",
        path.display()
    );
    section
        .iter()
        .filter_map(|l| l.trim().strip_prefix(command))
        .map(|rest| {
            rest.split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

/// An upgrade applies every manifest an install applies (a policy rule or a permission a release adds must reach
/// clusters installed before it), the DaemonSet last in both, and each is a file of examples/deploy.
#[test]
fn the_uninstall_deletes_every_manifest_the_install_applies() {
    let install = applied_in("## Install");
    let uninstall = deleted_in("## Uninstall");
    for manifest in install.iter().filter(|m| *m != "daemonset.yaml") {
        assert!(
            uninstall.contains(manifest),
            "the uninstall steps do not delete {manifest} (they delete {uninstall:?})"
        );
    }
    // The definitions last: deleting them deletes the objects of their kinds.
    assert_eq!(
        uninstall.last().map(String::as_str),
        Some("crds.yaml"),
        "{uninstall:?}"
    );
}

#[test]
fn the_upgrade_applies_every_manifest_the_install_applies() {
    let install = applied_in("## Install");
    let upgrade = applied_in("## Upgrade");
    assert!(install.len() >= 5, "{install:?}");
    for manifest in &install {
        assert!(
            upgrade.contains(manifest),
            "the upgrade steps do not apply {manifest} (they apply {upgrade:?})"
        );
        assert!(deploy_dir().join(manifest).is_file(), "{manifest}");
    }
    for steps in [&install, &upgrade] {
        assert_eq!(
            steps.last().map(String::as_str),
            Some("daemonset.yaml"),
            "{steps:?}"
        );
    }
}
