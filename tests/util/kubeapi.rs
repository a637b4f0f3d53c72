//! A real Kubernetes API server for the tests: kube-apiserver over etcd, both of the build of `tests/parts.sh`
//! (Kubernetes 1.37, etcd 3.7, from the Go module proxy, once per machine), both on loopback, both stopped and
//! their data removed when the value is dropped.
//!
//! Static tokens stand in for credentials: `admin` (system:masters) sets up, and each other token is a service
//! account whose permissions come from the RBAC the test applies, so the project's manifests are exercised as
//! written. An audit log records every request with its user, so tests count who read what.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The service account the project's RBAC binds (examples/deploy/rbac.yaml).
pub const PLEXUS_USER: &str = "system:serviceaccount:kube-system:plexus";

pub struct KubeApiServer {
    dir: tempfile::TempDir,
    etcd: Child,
    /// The running kube-apiserver; `None` while [`KubeApiServer::stop`] has it stopped.
    apiserver: std::sync::Mutex<Option<Child>>,
    /// Its command line, for a start after a stop.
    apiserver_args: Vec<String>,
    pub port: u16,
    etcd_port: u16,
}

/// The kube-apiserver binary of the cached build.
pub fn apiserver_bin() -> PathBuf {
    crate::parts::bin("kube-apiserver")
}

/// A port of 127.0.0.1 free when asked, for a server started later (or stopped and started again on it). It is
/// taken below the kernel's ephemeral range (`ip_local_port_range`), where no outgoing connection's source port
/// lands, so nothing but another server can take it between its release and its use; within this process each
/// call gives another port (a counter from a start of the process's own), and one found bound is skipped. Without
/// room below the range, the kernel's pick (which a connection may take in between).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    /// How many ports below the ephemeral range the tests use.
    const SPAN: u32 = 8192;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    if low > SPAN + 1024 {
        let base = low - SPAN;
        let start = std::process::id() * 97 % SPAN;
        for _ in 0..SPAN {
            let port = base + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN;
            let port = u16::try_from(port).expect("a port below the ephemeral range");
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl KubeApiServer {
    /// Starts etcd and the API server; `users` are extra service accounts `(token, namespace/name)`, `extra`
    /// more kube-apiserver flags.
    pub fn start(users: &[(&str, &str)], extra: &[&str]) -> KubeApiServer {
        // Ports are picked free and released before the servers bind them: another test may take one in
        // between. Such a start is tried again with other ports.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::try_start(users, extra) {
                Ok(server) => return server,
                Err(why) if why.contains("address already in use") && attempt < 3 => {}
                Err(why) => panic!("{why}"),
            }
        }
    }

    fn try_start(users: &[(&str, &str)], extra: &[&str]) -> Result<KubeApiServer, String> {
        let dir = tempfile::Builder::new()
            .prefix("plexus-kubeapi-")
            .tempdir()
            .unwrap();
        let d = dir.path();
        let (etcd_port, peer_port, port) = (free_port(), free_port(), free_port());
        let etcd_log = std::fs::File::create(d.join("etcd.log")).unwrap();
        let etcd = Command::new(crate::parts::bin("etcd"))
            .args([
                "--data-dir",
                &d.join("etcd").display().to_string(),
                "--listen-client-urls",
                &format!("http://127.0.0.1:{etcd_port}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{etcd_port}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer_port}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer_port}"),
                "--initial-cluster",
                &format!("default=http://127.0.0.1:{peer_port}"),
            ])
            .stdout(Stdio::null())
            .stderr(etcd_log)
            .spawn()
            .expect("start etcd");

        run(Command::new("openssl").args([
            "genrsa",
            "-out",
            &d.join("sa.key").display().to_string(),
            "2048",
        ]));
        run(Command::new("openssl").args([
            "rsa",
            "-in",
            &d.join("sa.key").display().to_string(),
            "-pubout",
            "-out",
            &d.join("sa.pub").display().to_string(),
        ]));
        let mut tokens = String::from("admin-token,admin,admin-uid,\"system:masters\"\n");
        // The node a kubelet registers (tests/util/kubelet.rs): the Node authorizer's user and group.
        tokens.push_str(&format!(
            "{},system:node:{},uid-{},\"system:nodes,system:authenticated\"\n",
            crate::kubelet::NODE_TOKEN,
            crate::kubelet::NODE,
            crate::kubelet::NODE,
        ));
        let mut all_users = vec![("plexus-token", "kube-system/plexus")];
        all_users.extend_from_slice(users);
        for (token, account) in all_users {
            let (ns, name) = account.split_once('/').unwrap();
            tokens.push_str(&format!(
                "{token},system:serviceaccount:{ns}:{name},uid-{name},\"system:serviceaccounts,system:serviceaccounts:{ns},system:authenticated\"\n"
            ));
        }
        std::fs::write(d.join("tokens.csv"), tokens).unwrap();
        std::fs::write(
            d.join("audit.yaml"),
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n  - level: Metadata\n",
        )
        .unwrap();
        let mut apiserver_args: Vec<String> = [
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            "--bind-address=127.0.0.1".to_string(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", d.join("certs").display()),
            format!("--token-auth-file={}", d.join("tokens.csv").display()),
            "--authorization-mode=Node,RBAC".to_string(),
            format!("--service-account-key-file={}", d.join("sa.pub").display()),
            format!(
                "--service-account-signing-key-file={}",
                d.join("sa.key").display()
            ),
            "--service-account-issuer=https://kubernetes.default.svc".to_string(),
            "--service-cluster-ip-range=10.96.0.0/16".to_string(),
            format!("--audit-policy-file={}", d.join("audit.yaml").display()),
            format!("--audit-log-path={}", d.join("audit.log").display()),
            "--audit-log-mode=blocking".to_string(),
        ]
        .into();
        apiserver_args.extend(extra.iter().map(|a| a.to_string()));
        let apiserver = spawn_apiserver(d, &apiserver_args);
        let mut server = KubeApiServer {
            dir,
            etcd,
            apiserver: std::sync::Mutex::new(Some(apiserver)),
            apiserver_args,
            port,
            etcd_port,
        };
        server.wait_ready()?;
        Ok(server)
    }

    /// Waits (at most 60 s) until the API server is ready; its log when it is not, or when it or etcd exited.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok((200, body)) = self.request("GET", "/readyz", None) {
                if body.trim() == "ok" {
                    break;
                }
            }
            let exited = self
                .apiserver
                .lock()
                .unwrap()
                .as_mut()
                .is_none_or(|c| matches!(c.try_wait(), Ok(Some(_))))
                || matches!(self.etcd.try_wait(), Ok(Some(_)));
            if exited || Instant::now() >= deadline {
                return Err(format!(
                    "kube-apiserver not ready within 60 s (or it or etcd exited); its log:\n{}\netcd's log:\n{}",
                    self.log_tail(),
                    crate::tail(&self.dir.path().join("etcd.log"), 10)
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        // The system namespaces are created by the server itself shortly after it is ready.
        self.wait_for("/api/v1/namespaces/kube-system");
        Ok(())
    }

    /// The last lines of the API server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        crate::tail(&self.dir.path().join("apiserver.log"), 30)
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The port the API server listens on (127.0.0.1, TLS).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's self-signed certificate, the CA a client trusts.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.path().join("certs/apiserver.crt")
    }

    /// A kubeconfig for a token user, trusting the server's self-signed certificate.
    pub fn write_kubeconfig(&self, path: &Path, token: &str) {
        let ca = self.ca_cert();
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
            self.url(),
            ca.display()
        );
        std::fs::write(path, text).unwrap();
    }

    /// One request as admin (curl, bounded); the status code and the body.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, String), String> {
        self.request_as("admin-token", method, path, body)
    }

    /// One request with `token` (curl, bounded); the status code and the body.
    pub fn request_as(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, String), String> {
        let mut cmd = Command::new("curl");
        cmd.args(["-sk", "--max-time", "10", "-X", method])
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .args(["-o", "-", "-w", "\n%{http_code}"]);
        // The body from a file: an object may be larger than a command line may be.
        let body_file = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
        if let Some(b) = body {
            let content_type = if method == "PATCH" {
                "application/merge-patch+json"
            } else {
                "application/json"
            };
            std::fs::write(body_file.path(), b.to_string()).map_err(|e| e.to_string())?;
            cmd.args(["-H", &format!("Content-Type: {content_type}")])
                .arg("--data-binary")
                .arg(format!("@{}", body_file.path().display()));
        }
        cmd.arg(format!("{}{path}", self.url()));
        let out = cmd.output().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').ok_or("no status")?;
        let code = code
            .trim()
            .parse::<u16>()
            .map_err(|e| format!("{e}: {text}"))?;
        Ok((code, body.to_string()))
    }

    /// Server-side apply of `body` at `path` as admin under the field manager `manager` (forced), as a
    /// controller with that manager writes; the answer as JSON.
    #[track_caller]
    pub fn apply_as(&self, path: &str, manager: &str, body: &Value) -> Value {
        let out = Command::new("curl")
            .args(["-sk", "--max-time", "10", "-X", "PATCH"])
            .args(["-H", "Authorization: Bearer admin-token"])
            .args(["-H", "Content-Type: application/apply-patch+yaml"])
            .args(["--data-binary", &body.to_string()])
            .args(["-o", "-", "-w", "\n%{http_code}"])
            .arg(format!(
                "{}{path}?fieldManager={manager}&force=true",
                self.url()
            ))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (answer, code) = text.rsplit_once('\n').unwrap_or((&text, ""));
        assert_eq!(code.trim(), "200", "apply {path} as {manager}: {answer}");
        serde_json::from_str(answer).unwrap_or(Value::Null)
    }

    /// Watches `path` (a collection) from `resource_version` as admin, in the background, for at most `seconds`:
    /// what the API server sent, read with [`Watch::events`] once it is stopped.
    pub fn watch(&self, path: &str, resource_version: &str, seconds: u32) -> Watch {
        let out = tempfile::NamedTempFile::new().unwrap();
        let child = self
            .watch_command(path, resource_version, seconds)
            .arg("-o")
            .arg(out.path())
            .spawn()
            .unwrap();
        Watch { child, out }
    }

    /// Watches `path` (a collection) from `resource_version` as admin for at most `seconds`, the events streamed
    /// on the returned process's stdout as they come (one JSON object a line).
    pub fn watch_stream(&self, path: &str, resource_version: &str, seconds: u32) -> Child {
        self.watch_command(path, resource_version, seconds)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// curl watching `path` from `resource_version` as admin, for at most `seconds`.
    fn watch_command(&self, path: &str, resource_version: &str, seconds: u32) -> Command {
        let mut cmd = Command::new("curl");
        cmd.args(["-skN", "--max-time", &seconds.to_string()])
            .args(["-H", "Authorization: Bearer admin-token"])
            .arg(format!(
                "{}{path}?watch=true&resourceVersion={resource_version}",
                self.url()
            ));
        cmd
    }

    /// `request`, asserting a 2xx answer; the body as JSON.
    #[track_caller]
    pub fn must(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let (code, text) = self.request(method, path, body).unwrap();
        assert!((200..300).contains(&code), "{method} {path}: {code} {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    /// Waits (at most 30 s) until GET `path` answers 200.
    pub fn wait_for(&self, path: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !matches!(self.request("GET", path, None), Ok((200, _))) {
            assert!(
                Instant::now() < deadline,
                "GET {path} did not answer 200 within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Creates an object as admin, from its `apiVersion`, `kind` and namespace.
    pub fn create(&self, obj: &Value) -> Value {
        self.must("POST", &collection_path(obj), Some(obj))
    }

    /// Creates many objects at once (one curl process, 16 transfers in parallel); returns how many failed.
    pub fn create_many(&self, objs: &[Value]) -> usize {
        let dir = self.dir.path().join(format!("bulk-{}", objs.len()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut config = String::new();
        for (i, obj) in objs.iter().enumerate() {
            let body = dir.join(format!("{i}.json"));
            std::fs::write(&body, obj.to_string()).unwrap();
            if i > 0 {
                config.push_str("next\n");
            }
            config.push_str(&format!(
                "url = \"{}{}\"\nrequest = \"POST\"\ninsecure\nsilent\nheader = \"Authorization: Bearer admin-token\"\nheader = \"Content-Type: application/json\"\ndata-binary = \"@{}\"\noutput = \"/dev/null\"\nwrite-out = \"%{{http_code}}\\n\"\nmax-time = 60\n",
                self.url(),
                collection_path(obj),
                body.display()
            ));
        }
        let cfg = dir.join("curl.cfg");
        std::fs::write(&cfg, config).unwrap();
        let out = Command::new("curl")
            .args(["--parallel", "--parallel-max", "16", "-K"])
            .arg(&cfg)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|code| !code.starts_with('2'))
            .count()
            + objs
                .len()
                .saturating_sub(String::from_utf8_lossy(&out.stdout).lines().count())
    }

    /// Creates every document of a manifest file (YAML, several documents), and waits for CRDs to serve.
    pub fn apply_file(&self, path: &Path) {
        let text = std::fs::read_to_string(path).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            self.create(&doc);
            if doc["kind"] == "CustomResourceDefinition" {
                let group = doc["spec"]["group"].as_str().unwrap();
                let plural = doc["spec"]["names"]["plural"].as_str().unwrap();
                for v in doc["spec"]["versions"].as_array().unwrap() {
                    let version = v["name"].as_str().unwrap();
                    self.wait_for(&format!("/apis/{group}/{version}/{plural}"));
                }
            }
        }
    }

    /// A real token of the service account `namespace/account` as a pod of it on `node` gets one: a pod
    /// `<account>-<node>` (bound to the node, created with the Node if they do not exist) and a TokenRequest bound
    /// to that pod, so the server writes the node into the token (`authentication.kubernetes.io/node-name`), as it
    /// does for a DaemonSet pod's projected token. The token is valid while the pod exists. The pod is a host-network
    /// pod of the test's pause image, so that a kubelet of the node runs it without calling any CNI plugin.
    pub fn node_bound_token(&self, namespace: &str, account: &str, node: &str) -> String {
        if !matches!(
            self.request("GET", &format!("/api/v1/nodes/{node}"), None),
            Ok((200, _))
        ) {
            self.create(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}));
        }
        let pod_name = format!("{account}-{node}");
        let path = format!("/api/v1/namespaces/{namespace}/pods/{pod_name}");
        let pod = match self.request("GET", &path, None) {
            Ok((200, body)) => serde_json::from_str(&body).unwrap(),
            _ => self.create(&json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod_name, "namespace": namespace},
                "spec": {
                    "nodeName": node,
                    "serviceAccountName": account,
                    "automountServiceAccountToken": false,
                    "hostNetwork": true,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "c", "image": crate::containerd::PAUSE_IMAGE,
                                    "imagePullPolicy": "Never"}]
                }
            })),
        };
        let answer = self.must(
            "POST",
            &format!("/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"),
            Some(&json!({
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {
                    "expirationSeconds": 3600,
                    "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                       "name": pod_name, "uid": pod["metadata"]["uid"]}
                }
            })),
        );
        answer["status"]["token"]
            .as_str()
            .unwrap_or_else(|| panic!("no token in {answer}"))
            .to_string()
    }

    /// Applies the project's node-authority policy (examples/deploy/node-authority.yaml) and waits until the API
    /// server enforces it (a ValidatingAdmissionPolicy takes effect a moment after it is created): a status write
    /// of the static plexus token, which names no node, is refused. The probe's pod (of the plexus service
    /// account, so rbac.yaml comes first) is deleted after.
    pub fn apply_node_authority(&self) {
        self.apply_file(&crate::deploy_manifest("node-authority.yaml"));
        let pods = "/api/v1/namespaces/kube-system/pods";
        self.create(&json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "node-authority-probe", "namespace": "kube-system"},
            "spec": {"nodeName": "nowhere", "serviceAccountName": "plexus",
                     "automountServiceAccountToken": false,
                     "containers": [{"name": "c", "image": "pause"}]}}));
        let probe = json!({"metadata": {"annotations": {"probe": "x"}}});
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let path = format!("{pods}/node-authority-probe/status");
            let (code, body) = self
                .request_as("plexus-token", "PATCH", &path, Some(&probe))
                .unwrap();
            if code == 403 && body.contains("plexus-node-authority") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the node-authority policy not enforced within 30 s: {code} {body}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        self.must(
            "DELETE",
            &format!("{pods}/node-authority-probe?gracePeriodSeconds=0"),
            None,
        );
    }

    /// A namespace with its `default` service account (there is no controller-manager to create it).
    pub fn namespace(&self, name: &str) {
        self.create(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}));
        self.create(&json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": name}}));
    }

    /// A pod bound to `node` (no scheduler here), with `annotations`.
    pub fn pod(&self, namespace: &str, name: &str, node: &str, annotations: Value) -> Value {
        self.create(&json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
            "spec": {
                "nodeName": node,
                "automountServiceAccountToken": false,
                "containers": [{"name": "c", "image": "pause"}]
            }
        }))
    }

    /// Allocates the claim `namespace`/`name` as the scheduler does for node-local devices (`results`, the
    /// entries of `status.allocation.devices.results[]`; `node` in the allocation's node selector) and reserves
    /// it for the pod `(name, uid)`; the claim as the server answers.
    pub fn allocate_claim(
        &self,
        namespace: &str,
        name: &str,
        results: Vec<Value>,
        node: &str,
        pod: (&str, &str),
    ) -> Value {
        self.must(
            "PATCH",
            &format!(
                "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}/status"
            ),
            Some(&json!({"status": {
                "allocation": {
                    "devices": {"results": results},
                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [node]}]}]}
                },
                "reservedFor": [{"resource": "pods", "name": pod.0, "uid": pod.1}]
            }})),
        )
    }

    pub fn nad(&self, namespace: &str, name: &str, config: &Value) -> Value {
        self.create(&json!({
            "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"config": config.to_string()}
        }))
    }

    /// The pod's network-status annotation: (network name, interface) of each entry, in order; empty when the
    /// pod has none.
    pub fn network_status(&self, namespace: &str, pod: &str) -> Vec<(String, String)> {
        let p = self.must(
            "GET",
            &format!("/api/v1/namespaces/{namespace}/pods/{pod}"),
            None,
        );
        let text = p["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"]
            .as_str()
            .unwrap_or("[]");
        let v: Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("network-status of {namespace}/{pod} ({e}): {text}"));
        v.as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_string(),
                    e["interface"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    /// The pod's events of `reason`: (type, message) of each.
    pub fn events_of(&self, namespace: &str, pod: &str, reason: &str) -> Vec<(String, String)> {
        self.must(
            "GET",
            &format!("/api/v1/namespaces/{namespace}/events"),
            None,
        )["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["involvedObject"]["name"] == pod && e["reason"] == reason)
            .map(|e| {
                (
                    e["type"].as_str().unwrap_or_default().to_string(),
                    e["message"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    /// Every audited request that completed, as the API server logged it (`user.username`, `verb`, `requestURI`,
    /// `requestReceivedTimestamp`, ...).
    pub fn audit_entries(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.dir.path().join("audit.log")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["stage"] == "ResponseComplete")
            .collect()
    }

    /// Every audit entry, whatever its stage (a watch is logged when it starts, and again when it ends).
    pub fn audit_all(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.dir.path().join("audit.log")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect()
    }

    /// The completed requests of `user`, in order: `(verb, requestURI)`.
    pub fn requests_of(&self, user: &str) -> Vec<(String, String)> {
        self.audit()
            .into_iter()
            .filter(|(u, _, _)| u == user)
            .map(|(_, verb, uri)| (verb, uri))
            .collect()
    }

    /// Every audited request that completed (a watch once it ended): `(user, verb, requestURI)`.
    pub fn audit(&self) -> Vec<(String, String, String)> {
        let text = std::fs::read_to_string(self.dir.path().join("audit.log")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["stage"] == "ResponseComplete")
            .map(|e| {
                (
                    e["user"]["username"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    e["verb"].as_str().unwrap_or_default().to_string(),
                    e["requestURI"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    /// Compacts etcd's history up to its current revision: a watch resumed from an older resourceVersion then
    /// gets 410 Gone. Uses etcd's JSON gateway.
    pub fn compact(&self) {
        let url = format!("http://127.0.0.1:{}/v3/kv/range", self.etcd_port);
        let out = Command::new("curl")
            .args([
                "-s",
                "--max-time",
                "10",
                "-X",
                "POST",
                &url,
                "-d",
                r#"{"key":"AA=="}"#,
            ])
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let rev = v["header"]["revision"].as_str().unwrap().to_string();
        let url = format!("http://127.0.0.1:{}/v3/kv/compaction", self.etcd_port);
        let out = Command::new("curl")
            .args(["-s", "--max-time", "10", "-X", "POST", &url, "-d"])
            .arg(json!({"revision": rev, "physical": true}).to_string())
            .output()
            .unwrap();
        assert!(out.status.success());
    }
}

/// Starts kube-apiserver with `args`, its log appended to `dir`'s `apiserver.log`.
fn spawn_apiserver(dir: &Path, args: &[String]) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("apiserver.log"))
        .unwrap();
    Command::new(apiserver_bin())
        .args(args)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn kube-apiserver")
}

/// The collection URL an object is created at.
fn collection_path(obj: &Value) -> String {
    let api_version = obj["apiVersion"].as_str().unwrap();
    let kind = obj["kind"].as_str().unwrap();
    let prefix = if api_version.contains('/') {
        format!("/apis/{api_version}")
    } else {
        format!("/api/{api_version}")
    };
    let plural = match kind {
        "NetworkAttachmentDefinition" => "network-attachment-definitions".to_string(),
        "CustomResourceDefinition" => "customresourcedefinitions".to_string(),
        k => {
            let lower = k.to_lowercase();
            if lower.ends_with('s') {
                format!("{lower}es")
            } else if let Some(stem) = lower.strip_suffix('y') {
                format!("{stem}ies")
            } else {
                format!("{lower}s")
            }
        }
    };
    match obj["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{prefix}/namespaces/{ns}/{plural}"),
        None => format!("{prefix}/{plural}"),
    }
}

impl KubeApiServer {
    /// The pids of kube-apiserver and of its etcd.
    pub fn pids(&self) -> (u32, u32) {
        (self.apiserver_pid(), self.etcd.id())
    }

    fn apiserver_pid(&self) -> u32 {
        let running = self.apiserver.lock().unwrap();
        running.as_ref().expect("kube-apiserver is stopped").id()
    }

    /// Stops kube-apiserver (SIGTERM, then SIGKILL after 10 s); etcd keeps running. Requests are refused until
    /// [`KubeApiServer::start_again`].
    pub fn stop(&self) {
        crate::stop_child(&self.apiserver, Duration::from_secs(10));
    }

    /// Starts kube-apiserver again after [`KubeApiServer::stop`], on the same port, etcd and files; returns once
    /// it is ready.
    pub fn start_again(&self) {
        let child = spawn_apiserver(self.dir.path(), &self.apiserver_args);
        *self.apiserver.lock().unwrap() = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !matches!(self.request("GET", "/readyz", None), Ok((200, ref b)) if b.trim() == "ok")
        {
            assert!(
                Instant::now() < deadline,
                "kube-apiserver not ready again within 60 s; its log:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the API server process (SIGSTOP): an outage where requests hang, as a wedged server's do.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Lets it run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, sig: &str) {
        run(Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.apiserver_pid().to_string()));
    }
}

impl Drop for KubeApiServer {
    fn drop(&mut self) {
        let apiserver = self.apiserver.get_mut().unwrap_or_else(|e| e.into_inner());
        for child in apiserver.iter_mut().chain([&mut self.etcd]) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Reads a child's stderr to the end in the background (bounded by what it writes), for failure messages.
pub fn drain(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// A watch running in the background (see [`KubeApiServer::watch`]).
pub struct Watch {
    child: std::process::Child,
    out: tempfile::NamedTempFile,
}

impl Watch {
    /// Ends the watch; the events it received (one JSON object a line) and their bytes.
    pub fn events(mut self) -> (Vec<Value>, usize) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let text = std::fs::read_to_string(self.out.path()).unwrap_or_default();
        let events = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        (events, text.len())
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
