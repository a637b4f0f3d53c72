//! An emulator of the Kubernetes API server, for testing Plexus's Kubernetes source through a real client.
//!
//! It is not a Kubernetes API server: it is a small HTTP/1.1 server (plain std threads, no TLS) on
//! `127.0.0.1:<ephemeral>` that keeps pods, NetworkAttachmentDefinitions and Events in memory and reproduces
//! the parts of the API behaviour Plexus depends on:
//!
//! - `GET /api/v1/namespaces/{ns}/pods/{name}`; `PATCH` on the pod and on its `status` subresource with
//!   `application/merge-patch+json` (RFC 7386). Every successful patch bumps `metadata.resourceVersion`; a
//!   patch carrying a stale `metadata.resourceVersion` is refused with 409 Conflict, as the API server does.
//! - `GET /apis/k8s.cni.cncf.io/v1/namespaces/{ns}/network-attachment-definitions/{name}` and `LIST` on the
//!   namespaced and the cluster-wide collection.
//! - `POST /api/v1/namespaces/{ns}/events` (`metadata.generateName` is honoured).
//! - Failures answer with a `v1` `Status` object (`reason`, `message`, `details`, `code`) like the real server.
//!
//! Tests inject faults per route ([`Fault`]: latency, an HTTP error status, a connection reset, a hang),
//! make the next N patches conflict, and read back every request exactly as it arrived
//! ([`RecordedRequest`]). [`ApiServer::write_kubeconfig`] writes a kubeconfig pointing at the emulator.
//!
//! Each response goes out in a single write with `TCP_NODELAY` set, so that a client never waits on a
//! delayed ACK between header and body.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Something a route does instead of (or before) answering normally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Wait this long, then answer normally.
    Latency(Duration),
    /// Answer with this HTTP status and a matching `Status` body (403, 404, 429, 500, 503, ...).
    Status(u16),
    /// Read the request, then reset the connection (RST) without answering.
    Reset,
    /// Read the request and never answer; the connection stays open until the emulator stops.
    Hang,
}

/// One request as the emulator received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    pub method: String,
    /// The path without the query string.
    pub path: String,
    /// The raw query string, if there was one.
    pub query: Option<String>,
    /// Header names in lower case.
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

impl RecordedRequest {
    /// The body parsed as JSON (panics if it is not JSON: the test asked for it).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{} {} body is not JSON ({e}): {:?}",
                self.method,
                self.path,
                self.body_text()
            )
        })
    }

    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

struct FaultRule {
    method: String,
    path: String,
    fault: Fault,
    remaining: usize,
}

#[derive(Default)]
struct State {
    pods: BTreeMap<(String, String), Value>,
    nads: BTreeMap<(String, String), Value>,
    /// DRA's ResourceClaims (`resource.k8s.io/v1`, served as a 1.34+ server does) and ResourceSlices.
    claims: BTreeMap<(String, String), Value>,
    slices: Vec<Value>,
    events: Vec<Value>,
    requests: Vec<RecordedRequest>,
    faults: Vec<FaultRule>,
    conflict_next: usize,
}

struct Shared {
    state: Mutex<State>,
    stop: AtomicBool,
    resource_version: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn next_version(&self) -> String {
        (self.resource_version.fetch_add(1, Ordering::SeqCst) + 1).to_string()
    }
}

/// A running emulator; it stops when dropped.
pub struct ApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl ApiServer {
    /// Starts the emulator on an ephemeral port of 127.0.0.1.
    pub fn start() -> ApiServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the API server emulator");
        let addr = listener.local_addr().expect("emulator address");
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            stop: AtomicBool::new(false),
            resource_version: AtomicU64::new(1000),
        });
        let accept_shared = shared.clone();
        thread::Builder::new()
            .name("apiserver-accept".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if accept_shared.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let conn_shared = accept_shared.clone();
                    let _ = thread::Builder::new()
                        .name("apiserver-conn".into())
                        .spawn(move || serve(stream, &conn_shared));
                }
            })
            .expect("spawn the emulator's accept thread");
        ApiServer { addr, shared }
    }

    /// `http://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes a kubeconfig whose only context points at this emulator, with a bearer token it records.
    pub fn write_kubeconfig(&self, path: &Path) {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: emulator\n  cluster:\n    server: {}\n\
             users:\n- name: plexus\n  user:\n    token: emulator-token\n\
             contexts:\n- name: emulator\n  context:\n    cluster: emulator\n    user: plexus\n    namespace: default\n\
             current-context: emulator\n",
            self.url()
        );
        std::fs::write(path, text).expect("write the emulator's kubeconfig");
    }

    /// Stores a pod (a full JSON object with `metadata.namespace` and `metadata.name`); a missing
    /// `resourceVersion` is assigned.
    pub fn add_pod(&self, mut pod: Value) {
        let key = object_key(&pod);
        if pod.pointer("/metadata/resourceVersion").is_none() {
            pod["metadata"]["resourceVersion"] = Value::String(self.shared.next_version());
        }
        pod.as_object_mut()
            .expect("pod is an object")
            .entry("kind")
            .or_insert(json!("Pod"));
        pod.as_object_mut()
            .expect("pod is an object")
            .entry("apiVersion")
            .or_insert(json!("v1"));
        self.shared.lock().pods.insert(key, pod);
    }

    /// Stores a NetworkAttachmentDefinition (a full JSON object).
    /// Adds a ResourceClaim (served from `resource.k8s.io/v1`, list only).
    pub fn add_claim(&self, claim: Value) {
        let key = object_key(&claim);
        self.shared.lock().claims.insert(key, claim);
    }

    /// Adds a ResourceSlice (listed with the `spec.nodeName` field selector honoured, as 1.34+ does).
    pub fn add_slice(&self, slice: Value) {
        self.shared.lock().slices.push(slice);
    }

    pub fn add_nad(&self, mut nad: Value) {
        let key = object_key(&nad);
        if nad.pointer("/metadata/resourceVersion").is_none() {
            nad["metadata"]["resourceVersion"] = Value::String(self.shared.next_version());
        }
        self.shared.lock().nads.insert(key, nad);
    }

    /// The stored pod, as a later GET would return it.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .lock()
            .pods
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    pub fn remove_pod(&self, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .lock()
            .pods
            .remove(&(namespace.to_string(), name.to_string()))
    }

    pub fn remove_nad(&self, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .lock()
            .nads
            .remove(&(namespace.to_string(), name.to_string()))
    }

    /// Every Event posted so far, as stored.
    pub fn events(&self) -> Vec<Value> {
        self.shared.lock().events.clone()
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().requests.clone()
    }

    pub fn clear_requests(&self) {
        self.shared.lock().requests.clear();
    }

    /// The next `times` requests matching `method` (or `"*"`) and exactly `path` (or `"*"`) suffer `fault`.
    pub fn inject(&self, method: &str, path: &str, fault: Fault, times: usize) {
        self.shared.lock().faults.push(FaultRule {
            method: method.to_string(),
            path: path.to_string(),
            fault,
            remaining: times,
        });
    }

    /// The next `n` PATCH requests answer 409 Conflict, whatever they carry.
    pub fn conflict_next_patches(&self, n: usize) {
        self.shared.lock().conflict_next = n;
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

fn object_key(obj: &Value) -> (String, String) {
    let ns = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .expect("object has metadata.name");
    (ns.to_string(), name.to_string())
}

/// One HTTP/1.1 connection: requests are answered in order until the client closes it.
fn serve(stream: TcpStream, shared: &Shared) {
    let _ = stream.set_nodelay(true);
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    while let Some(request) = read_request(&mut reader) {
        let fault = {
            let mut state = shared.lock();
            state.requests.push(request.clone());
            take_fault(&mut state, &request)
        };
        match fault {
            Some(Fault::Latency(d)) => thread::sleep(d),
            Some(Fault::Status(code)) => {
                let body = status_body(
                    code,
                    reason_for(code),
                    &format!("injected fault: {code}"),
                    None,
                );
                if respond(&write_half, code, &body).is_err() || wants_close(&request) {
                    return;
                }
                continue;
            }
            Some(Fault::Reset) => {
                reset(&write_half);
                return;
            }
            Some(Fault::Hang) => {
                let until = Instant::now() + Duration::from_secs(120);
                while !shared.stop.load(Ordering::SeqCst) && Instant::now() < until {
                    thread::sleep(Duration::from_millis(20));
                }
                return;
            }
            None => {}
        }
        let (code, body) = route(shared, &request);
        if respond(&write_half, code, &body).is_err() || wants_close(&request) {
            return;
        }
    }
}

fn wants_close(request: &RecordedRequest) -> bool {
    request
        .headers
        .get("connection")
        .is_some_and(|v| v.eq_ignore_ascii_case("close"))
}

fn take_fault(state: &mut State, request: &RecordedRequest) -> Option<Fault> {
    let rule = state.faults.iter_mut().find(|r| {
        r.remaining > 0
            && (r.method == "*" || r.method == request.method)
            && (r.path == "*" || r.path == request.path)
    })?;
    rule.remaining -= 1;
    Some(rule.fault.clone())
}

/// Closes the connection with SO_LINGER 0, which makes the kernel send RST instead of FIN.
fn reset(stream: &TcpStream) {
    let _ = rustix::net::sockopt::set_socket_linger(stream, Some(Duration::ZERO));
    let _ = stream.shutdown(std::net::Shutdown::Read);
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<RecordedRequest> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let target = parts.next()?.to_string();
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
    }
    let body = if headers
        .get("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        read_chunked(reader)?
    } else {
        let len: usize = headers
            .get("content-length")
            .map_or(Some(0), |v| v.parse().ok())?;
        let mut body = vec![0; len];
        reader.read_exact(&mut body).ok()?;
        body
    };
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), Some(q.to_string())),
        None => (target, None),
    };
    Some(RecordedRequest {
        method,
        path,
        query,
        headers,
        body,
    })
}

fn read_chunked(reader: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut size = String::new();
        reader.read_line(&mut size).ok()?;
        let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
        let mut chunk = vec![0; size + 2];
        reader.read_exact(&mut chunk).ok()?;
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(&chunk[..size]);
    }
}

fn respond(stream: &TcpStream, code: u16, body: &Value) -> std::io::Result<()> {
    let body = serde_json::to_vec(body).expect("serialize a response");
    let mut out = format!(
        "HTTP/1.1 {code} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        reason_phrase(code),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    // One write: header and body in one segment.
    (&*stream).write_all(&out)
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// The `reason` field Kubernetes puts in a `Status` for each code.
fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        _ => "Unknown",
    }
}

fn status_body(code: u16, reason: &str, message: &str, details: Option<Value>) -> Value {
    let mut status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    if let Some(details) = details {
        status["details"] = details;
    }
    status
}

fn not_found(group: &str, resource: &str, name: &str) -> (u16, Value) {
    let qualified = if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    };
    // Kubernetes puts the plural resource in `details.kind`.
    let details = json!({ "name": name, "group": group, "kind": resource });
    (
        404,
        status_body(
            404,
            "NotFound",
            &format!("{qualified} \"{name}\" not found"),
            Some(details),
        ),
    )
}

fn route(shared: &Shared, req: &RecordedRequest) -> (u16, Value) {
    let segments: Vec<&str> = req.path.trim_matches('/').split('/').collect();
    match (req.method.as_str(), segments.as_slice()) {
        ("GET", ["api", "v1", "namespaces", ns, "pods", name]) => {
            match shared.lock().pods.get(&(ns.to_string(), name.to_string())) {
                Some(pod) => (200, pod.clone()),
                None => not_found("", "pods", name),
            }
        }
        ("PATCH", ["api", "v1", "namespaces", ns, "pods", name]) => {
            patch_pod(shared, req, ns, name, false)
        }
        ("PATCH", ["api", "v1", "namespaces", ns, "pods", name, "status"]) => {
            patch_pod(shared, req, ns, name, true)
        }
        (
            "GET",
            ["apis", "k8s.cni.cncf.io", "v1", "namespaces", ns, "network-attachment-definitions", name],
        ) => match shared.lock().nads.get(&(ns.to_string(), name.to_string())) {
            Some(nad) => (200, with_type_meta(nad.clone())),
            None => not_found("k8s.cni.cncf.io", "network-attachment-definitions", name),
        },
        (
            "GET",
            ["apis", "k8s.cni.cncf.io", "v1", "namespaces", ns, "network-attachment-definitions"],
        ) => list_nads(shared, Some(ns)),
        ("GET", ["apis", "k8s.cni.cncf.io", "v1", "network-attachment-definitions"]) => {
            list_nads(shared, None)
        }
        ("POST", ["api", "v1", "namespaces", ns, "events"]) => create_event(shared, req, ns),
        ("GET", ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims", name]) => {
            let found = shared
                .lock()
                .claims
                .get(&(ns.to_string(), name.to_string()))
                .cloned();
            match found {
                Some(claim) => (200, claim),
                None => not_found("resource.k8s.io", "resourceclaims", name),
            }
        }
        ("GET", ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims"]) => {
            let items: Vec<Value> = shared
                .lock()
                .claims
                .iter()
                .filter(|((n, _), _)| n == ns)
                .map(|(_, c)| c.clone())
                .collect();
            (200, dra_list("ResourceClaimList", items))
        }
        ("GET", ["apis", "resource.k8s.io", "v1", "resourceslices"]) => {
            let node = req.query.as_deref().and_then(|q| {
                q.split('&')
                    .find_map(|kv| kv.strip_prefix("fieldSelector="))
                    .map(|v| v.replace("%3D", "=").replace("%2F", "/"))
                    .and_then(|v| v.strip_prefix("spec.nodeName=").map(str::to_string))
            });
            let items: Vec<Value> = shared
                .lock()
                .slices
                .iter()
                .filter(|s| {
                    node.as_ref()
                        .is_none_or(|n| s["spec"]["nodeName"] == n.as_str())
                })
                .cloned()
                .collect();
            (200, dra_list("ResourceSliceList", items))
        }
        _ => (
            404,
            status_body(
                404,
                "NotFound",
                &format!(
                    "the server could not find the requested resource ({} {})",
                    req.method, req.path
                ),
                None,
            ),
        ),
    }
}

fn with_type_meta(mut nad: Value) -> Value {
    if let Some(obj) = nad.as_object_mut() {
        obj.entry("apiVersion")
            .or_insert(json!("k8s.cni.cncf.io/v1"));
        obj.entry("kind")
            .or_insert(json!("NetworkAttachmentDefinition"));
    }
    nad
}

fn dra_list(kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items})
}

fn list_nads(shared: &Shared, namespace: Option<&str>) -> (u16, Value) {
    let items: Vec<Value> = shared
        .lock()
        .nads
        .iter()
        .filter(|((ns, _), _)| namespace.is_none_or(|want| want == ns))
        .map(|(_, nad)| with_type_meta(nad.clone()))
        .collect();
    let list = json!({
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinitionList",
        "metadata": { "resourceVersion": shared.resource_version.load(Ordering::SeqCst).to_string() },
        "items": items,
    });
    (200, list)
}

fn patch_pod(
    shared: &Shared,
    req: &RecordedRequest,
    ns: &str,
    name: &str,
    status: bool,
) -> (u16, Value) {
    let content_type = req
        .headers
        .get("content-type")
        .map(String::as_str)
        .unwrap_or_default();
    if !content_type.starts_with("application/merge-patch+json") {
        let msg = format!("the emulator only speaks merge patch, not {content_type:?}");
        return (415, status_body(415, "UnsupportedMediaType", &msg, None));
    }
    let Ok(patch) = serde_json::from_slice::<Value>(&req.body) else {
        return (
            400,
            status_body(400, "BadRequest", "the patch body is not JSON", None),
        );
    };
    let mut state = shared.lock();
    let key = (ns.to_string(), name.to_string());
    let Some(current) = state.pods.get(&key).cloned() else {
        return not_found("", "pods", name);
    };
    let conflict_msg = format!(
        "Operation cannot be fulfilled on pods \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
    );
    let conflict_details = json!({ "name": name, "kind": "pods" });
    if state.conflict_next > 0 {
        state.conflict_next -= 1;
        return (
            409,
            status_body(409, "Conflict", &conflict_msg, Some(conflict_details)),
        );
    }
    if let Some(sent) = patch
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
    {
        if Some(sent)
            != current
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
        {
            return (
                409,
                status_body(409, "Conflict", &conflict_msg, Some(conflict_details)),
            );
        }
    }
    let mut updated = current;
    // The status subresource ignores changes to spec; the main resource ignores changes to status.
    let mut patch = patch;
    if let Some(obj) = patch.as_object_mut() {
        obj.remove(if status { "spec" } else { "status" });
    }
    merge_patch(&mut updated, &patch);
    updated["metadata"]["resourceVersion"] = Value::String(shared.next_version());
    state.pods.insert(key, updated.clone());
    (200, updated)
}

fn create_event(shared: &Shared, req: &RecordedRequest, ns: &str) -> (u16, Value) {
    let Ok(mut event) = serde_json::from_slice::<Value>(&req.body) else {
        return (
            400,
            status_body(400, "BadRequest", "the event body is not JSON", None),
        );
    };
    if event.pointer("/metadata/name").is_none() {
        let Some(prefix) = event
            .pointer("/metadata/generateName")
            .and_then(Value::as_str)
        else {
            return (
                422,
                status_body(
                    422,
                    "Invalid",
                    "metadata.name or metadata.generateName is required",
                    None,
                ),
            );
        };
        let name = format!(
            "{prefix}{:x}",
            shared.resource_version.load(Ordering::SeqCst)
        );
        event["metadata"]["name"] = Value::String(name);
    }
    event["metadata"]["namespace"] = Value::String(ns.to_string());
    event["metadata"]["resourceVersion"] = Value::String(shared.next_version());
    shared.lock().events.push(event.clone());
    (201, event)
}

/// RFC 7386 JSON merge patch: objects merge recursively, `null` deletes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_obj) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    let target_obj = target.as_object_mut().expect("made an object above");
    for (key, value) in patch_obj {
        if value.is_null() {
            target_obj.remove(key);
        } else {
            merge_patch(target_obj.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}
