//! The CNI process's side of the node daemon: a [`Cluster`] that asks the daemon first and the API itself when
//! the daemon cannot answer in time (thin mode).
//!
//! Only an ADD asks the daemon; DEL, CHECK and GC never do, so a daemon can never block a teardown. An
//! invocation keeps one connection for all its questions. The first time the daemon fails to answer (no
//! socket, refused, timed out, unsynced, busy), the rest of the invocation goes thin at once: a dead or hung
//! daemon costs one bounded wait per ADD, not one per object.
//!
//! A DEL hands the daemon only what it takes back (a claim's device status, [`DelCluster`]), within a bound, and
//! never waits on the API server for it either.

use std::cell::{Cell, RefCell};
use std::io::{BufReader, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use plexus_cluster::{Cluster, ClusterError, PodEvent};
use plexus_core::spec::dra::{ClaimName, DeviceNetworkData, PodClaims};
use plexus_core::spec::{NetworkAttachmentDefinition, Pod, PodRef};

use super::proto::{read_message, write_message, Answer, ReadError, Request, MAX_ANSWER_BYTES};

/// Why the daemon gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("{}: {source}", path.display())]
    NoSocket {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Anything but a socket owned by root (or this process's user) could hand out plans.
    #[error("{} is not a socket owned by root", .0.display())]
    NotRootSocket(PathBuf),
    #[error("connect: {0}")]
    Connect(std::io::Error),
    #[error("send: {0}")]
    Send(std::io::Error),
    #[error("answer: {0}")]
    Answer(ReadError),
    #[error("its caches are not synced yet")]
    Unsynced,
    #[error("it is at its concurrency bound")]
    Busy,
}

/// A daemon that answers and says the node should not be sent new ADDs, with its reason.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unready(pub String);

/// Where the daemon listens and how long one request may take (connect, send, answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonConf {
    pub socket: PathBuf,
    pub timeout: Duration,
    /// The kube source's `events` setting: without it, no event is sent, by the daemon or otherwise.
    pub events: bool,
}

/// Asks the daemon, falls back to `thin`.
pub struct DaemonCluster<'a> {
    conf: DaemonConf,
    thin: &'a dyn Cluster,
    /// Set once the daemon failed to answer: later calls of this invocation go thin directly.
    gone: Cell<bool>,
    /// The connection this invocation's questions share.
    conn: RefCell<Option<BufReader<UnixStream>>>,
    /// What the pod's claims give, as the daemon answered with the pod.
    claims: RefCell<Option<(PodRef, PodClaims)>>,
}

impl<'a> DaemonCluster<'a> {
    pub fn new(conf: DaemonConf, thin: &'a dyn Cluster) -> Self {
        DaemonCluster {
            conf,
            thin,
            gone: Cell::new(false),
            conn: RefCell::new(None),
            claims: RefCell::new(None),
        }
    }

    /// Questions on the shared connection: every request is written, then the answers are read in turn (the
    /// daemon answers the requests of a connection in order), so they cost one round trip. A connection that
    /// served earlier questions and fails now (the daemon closed it while the delegates ran, or restarted) is
    /// replaced once.
    fn exchange_all(
        &self,
        requests: &[Request],
        timeout: Duration,
    ) -> Result<Vec<Answer>, AskError> {
        let mut slot = self.conn.borrow_mut();
        let reused = slot.is_some();
        if slot.is_none() {
            *slot = Some(BufReader::new(connect(&self.conf.socket)?));
        }
        let conn = slot.as_mut().expect("filled above");
        match exchange(conn, requests, timeout) {
            Ok(a) => Ok(a),
            Err(e) => {
                *slot = None;
                if !reused {
                    return Err(e);
                }
                let mut fresh = BufReader::new(connect(&self.conf.socket)?);
                let answers = exchange(&mut fresh, requests, timeout)?;
                *slot = Some(fresh);
                Ok(answers)
            }
        }
    }

    /// The daemon's answer, or `None` (after which this invocation stops asking): it does not answer, or is
    /// unsynced or busy.
    fn ask(&self, request: &Request, timeout: Duration) -> Option<Answer> {
        match self
            .ask_all(std::slice::from_ref(request), timeout)?
            .remove(0)
        {
            Answer::Unsynced => self.give_up(AskError::Unsynced),
            Answer::Busy => self.give_up(AskError::Busy),
            answer => Some(answer),
        }
    }

    /// One answer per request, or `None` when the daemon does not answer (after which this invocation stops
    /// asking).
    fn ask_all(&self, requests: &[Request], timeout: Duration) -> Option<Vec<Answer>> {
        if self.gone.get() {
            return None;
        }
        self.exchange_all(requests, timeout)
            .map_err(|reason| self.give_up::<()>(reason))
            .ok()
    }

    /// How long this process waits for an answer, told to the daemon so that it answers with what it has before.
    fn within_ms(&self) -> u64 {
        u64::try_from(self.conf.timeout.as_millis()).unwrap_or(u64::MAX)
    }

    /// Stops asking the daemon for the rest of this invocation.
    fn give_up<T>(&self, reason: AskError) -> Option<T> {
        self.gone.set(true);
        tracing::debug!(socket = %self.conf.socket.display(), %reason, "node daemon cannot answer; asking the API directly");
        None
    }

    /// A status write's outcome from the daemon's answer; without one (no answer, unsynced, busy) it is written
    /// to the API directly: the merge patch is idempotent, so writing it again after a daemon died holding it
    /// is harmless.
    fn status_written(
        &self,
        answer: Option<Answer>,
        pod: &PodRef,
        network_status: &str,
    ) -> Result<(), ClusterError> {
        match answer {
            // Accepted: the daemon sends it, with retries.
            Some(Answer::Done) => Ok(()),
            Some(Answer::Failed { error }) => Err(error),
            None | Some(Answer::Unsynced | Answer::Busy) => {
                self.thin.write_status(pod, network_status)
            }
            Some(other) => Err(unexpected("a status write", other)),
        }
    }
}

fn status_request(pod: &PodRef, network_status: &str) -> Request {
    Request::Status {
        pod: pod.clone(),
        network_status: network_status.into(),
    }
}

fn event_request(pod: &PodRef, warning: bool, reason: &str, message: &str) -> Request {
    Request::Event {
        pod: pod.clone(),
        warning,
        reason: reason.into(),
        message: message.into(),
    }
}

/// Hands the daemon an invocation's report without waiting for anything: a non-blocking connect and one
/// non-blocking write, given up at the first sign of a daemon that is not there or not taking it (no socket,
/// its backlog or buffer full). No answer is read. Costs a connect and a write on the way out of the process.
pub fn report(socket: &std::path::Path, report: &super::proto::Report) {
    let sent = (|| -> Result<(), String> {
        check_socket(socket).map_err(|e| e.to_string())?;
        let mut line = Vec::new();
        write_message(
            &mut line,
            &Request::Report {
                report: report.clone(),
            },
        )
        .map_err(|e| e.to_string())?;
        let conn = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)
            .map_err(|e| e.to_string())?;
        conn.set_nonblocking(true).map_err(|e| e.to_string())?;
        conn.connect(&socket2::SockAddr::unix(socket).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        let n = conn.send(&line).map_err(|e| e.to_string())?;
        if n < line.len() {
            return Err(format!("wrote {n} of {} bytes", line.len()));
        }
        Ok(())
    })();
    if let Err(e) = sent {
        tracing::debug!(socket = %socket.display(), "report not handed to the daemon: {e}");
    }
}

/// One request and its answer over a fresh connection, all within `timeout`.
pub fn ask(
    socket: &std::path::Path,
    request: &Request,
    timeout: Duration,
) -> Result<Answer, AskError> {
    let mut answers = exchange(
        &mut BufReader::new(connect(socket)?),
        std::slice::from_ref(request),
        timeout,
    )?;
    Ok(answers.remove(0))
}

/// A connection to the daemon. The socket must belong to root (or to this process's user): anything else could
/// hand out plans.
fn connect(socket: &std::path::Path) -> Result<UnixStream, AskError> {
    check_socket(socket)?;
    UnixStream::connect(socket).map_err(AskError::Connect)
}

/// The socket exists and is root's (or this process's user's).
fn check_socket(socket: &std::path::Path) -> Result<(), AskError> {
    let meta = std::fs::metadata(socket).map_err(|source| AskError::NoSocket {
        path: socket.to_path_buf(),
        source,
    })?;
    let euid = rustix::process::geteuid().as_raw();
    if !meta.file_type().is_socket() || (meta.uid() != 0 && meta.uid() != euid) {
        return Err(AskError::NotRootSocket(socket.to_path_buf()));
    }
    Ok(())
}

/// Sends every request, then reads one answer per request, all within `timeout`.
fn exchange(
    conn: &mut BufReader<UnixStream>,
    requests: &[Request],
    timeout: Duration,
) -> Result<Vec<Answer>, AskError> {
    let deadline = std::time::Instant::now() + timeout;
    let left = || {
        deadline
            .saturating_duration_since(std::time::Instant::now())
            .max(Duration::from_millis(1))
    };
    let stream = conn.get_mut();
    stream
        .set_write_timeout(Some(left()))
        .map_err(AskError::Send)?;
    // One write: the requests are small (a status write is the largest, bounded by MAX_REQUEST_BYTES).
    let mut out = Vec::new();
    for request in requests {
        write_message(&mut out, request).map_err(AskError::Send)?;
    }
    stream.write_all(&out).map_err(AskError::Send)?;
    let _ = stream.flush();
    let mut answers = Vec::with_capacity(requests.len());
    for _ in requests {
        conn.get_mut()
            .set_read_timeout(Some(left()))
            .map_err(|e| AskError::Answer(e.into()))?;
        answers.push(read_message(conn, MAX_ANSWER_BYTES).map_err(AskError::Answer)?);
    }
    Ok(answers)
}

/// CNI STATUS with a daemon configured: not available while a daemon that answers says it should not be sent
/// new ADDs (caches unsynced, every slot taken), so the runtime holds new sandboxes back instead of sending them
/// all to the API server in thin mode. A daemon that does not answer does not make the node unready: thin mode
/// works without it.
pub fn readiness(socket: &std::path::Path, timeout: Duration) -> Result<(), Unready> {
    match ask(socket, &Request::Health, timeout) {
        Ok(Answer::Health(h)) => h.unready().map_or(Ok(()), |why| Err(Unready(why))),
        _ => Ok(()),
    }
}

fn pod_ref(pod: &Pod) -> PodRef {
    PodRef {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
    }
}

fn unexpected(what: &str, answer: Answer) -> ClusterError {
    ClusterError::Invalid {
        what: "node daemon answer".into(),
        reason: format!("asked for {what}, got {answer:?}"),
    }
}

impl Cluster for DaemonCluster<'_> {
    fn pod(&self, pod: &PodRef) -> Result<Pod, ClusterError> {
        let request = Request::Pod {
            pod: pod.clone(),
            within_ms: Some(self.within_ms()),
        };
        match self.ask(&request, self.conf.timeout) {
            Some(Answer::Pod { pod: found, claims }) => {
                *self.claims.borrow_mut() = claims.map(|c| (pod_ref(&found), c));
                Ok(found)
            }
            Some(Answer::Failed { error }) => Err(error),
            Some(other) => Err(unexpected("a pod", other)),
            None => self.thin.pod(pod),
        }
    }

    fn nad(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<NetworkAttachmentDefinition, ClusterError> {
        let request = Request::Nad {
            namespace: namespace.into(),
            name: name.into(),
            within_ms: Some(self.within_ms()),
        };
        match self.ask(&request, self.conf.timeout) {
            Some(Answer::Nad { nad }) => Ok(nad),
            Some(Answer::Failed { error }) => Err(error),
            Some(other) => Err(unexpected("a NetworkAttachmentDefinition", other)),
            None => self.thin.nad(namespace, name),
        }
    }

    /// As the daemon answered with the pod (no round trip of its own); where it could not tell, read here.
    fn pod_claims(&self, pod: &Pod) -> Result<PodClaims, ClusterError> {
        match self.claims.borrow().as_ref() {
            Some((of, claims)) if *of == pod_ref(pod) => return Ok(claims.clone()),
            _ => {}
        }
        self.thin.pod_claims(pod)
    }

    fn write_claim_status(
        &self,
        pod: &PodRef,
        claim: &ClaimName,
        devices: &[DeviceNetworkData],
    ) -> Result<(), ClusterError> {
        let request = Request::ClaimStatus {
            pod: pod.clone(),
            claim: claim.clone(),
            devices: devices.to_vec(),
        };
        match self.ask(&request, self.conf.timeout) {
            Some(Answer::Done) => Ok(()),
            Some(Answer::Failed { error }) => Err(error),
            _ => self.thin.write_claim_status(pod, claim, devices),
        }
    }

    fn write_status(&self, pod: &PodRef, network_status: &str) -> Result<(), ClusterError> {
        let answer = self.ask(&status_request(pod, network_status), self.conf.timeout);
        self.status_written(answer, pod, network_status)
    }

    /// Posted by the daemon (as from its own node), or directly when it does not answer.
    fn record(&self, event: &PodEvent<'_>) -> Result<(), ClusterError> {
        if !self.conf.events {
            return Ok(());
        }
        let request = event_request(event.pod, event.warning, event.reason, event.message);
        match self.ask(&request, self.conf.timeout) {
            Some(_) => Ok(()),
            None => self.thin.record(event),
        }
    }

    /// The status write, the claim writes and the AddedInterface events in one round trip; what the daemon does
    /// not take goes to the API directly, as each would alone. The daemon posts events as from its own node.
    fn publish(
        &self,
        pod: &PodRef,
        node: Option<&str>,
        network_status: &str,
        attachments: &[String],
        claims: &[(ClaimName, Vec<DeviceNetworkData>)],
    ) -> Result<(), ClusterError> {
        let mut requests = vec![status_request(pod, network_status)];
        requests.extend(claims.iter().map(|(claim, devices)| Request::ClaimStatus {
            pod: pod.clone(),
            claim: claim.clone(),
            devices: devices.clone(),
        }));
        let events = if self.conf.events { attachments } else { &[] };
        requests.extend(
            events
                .iter()
                .map(|m| event_request(pod, false, plexus_cluster::ADDED_INTERFACE, m)),
        );
        let Some(answers) = self.ask_all(&requests, self.conf.timeout) else {
            return self
                .thin
                .publish(pod, node, network_status, attachments, claims);
        };
        let mut answers = answers.into_iter();
        let status = self.status_written(answers.next(), pod, network_status);
        for (claim, devices) in claims {
            if !matches!(answers.next(), Some(Answer::Done)) {
                if let Err(e) = self.thin.write_claim_status(pod, claim, devices) {
                    tracing::warn!(pod = %pod, claim = %claim, "cannot write the claim's device status: {e}");
                }
            }
        }
        for (message, answer) in events.iter().zip(answers) {
            if matches!(answer, Answer::Unsynced | Answer::Busy) {
                let _ = self.thin.record(&PodEvent::attached(pod, node, message));
            }
        }
        status
    }
}

/// How long a DEL gives a claim's device status taken back, each way (the daemon's answer, or one direct
/// request).
pub const TAKE_BACK_BOUND: Duration = Duration::from_millis(1000);

/// DEL's cluster source. Reads go to `reads` directly (a teardown never depends on the daemon). A claim's device
/// status taken back is handed to the daemon, whose durable queue sends it, when it takes it within its timeout
/// and [`TAKE_BACK_BOUND`]; otherwise it goes to `writes`, which the caller bounds the same way. Nothing else is
/// written by a DEL.
pub struct DelCluster<'a> {
    reads: &'a dyn Cluster,
    writes: &'a dyn Cluster,
    /// The daemon's socket and its timeout, when one is configured.
    daemon: Option<(PathBuf, Duration)>,
}

impl<'a> DelCluster<'a> {
    pub fn new(
        reads: &'a dyn Cluster,
        writes: &'a dyn Cluster,
        daemon: Option<(PathBuf, Duration)>,
    ) -> Self {
        DelCluster {
            reads,
            writes,
            daemon,
        }
    }
}

impl Cluster for DelCluster<'_> {
    fn pod(&self, pod: &PodRef) -> Result<Pod, ClusterError> {
        self.reads.pod(pod)
    }

    fn nad(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<NetworkAttachmentDefinition, ClusterError> {
        self.reads.nad(namespace, name)
    }

    fn pod_claims(&self, pod: &Pod) -> Result<PodClaims, ClusterError> {
        self.reads.pod_claims(pod)
    }

    fn write_status(&self, pod: &PodRef, network_status: &str) -> Result<(), ClusterError> {
        self.reads.write_status(pod, network_status)
    }

    fn write_claim_status(
        &self,
        pod: &PodRef,
        claim: &ClaimName,
        devices: &[DeviceNetworkData],
    ) -> Result<(), ClusterError> {
        if let Some((socket, timeout)) = &self.daemon {
            let request = Request::ClaimStatus {
                pod: pod.clone(),
                claim: claim.clone(),
                devices: devices.to_vec(),
            };
            if let Ok(Answer::Done) = ask(socket, &request, (*timeout).min(TAKE_BACK_BOUND)) {
                return Ok(());
            }
        }
        self.writes.write_claim_status(pod, claim, devices)
    }

    fn record(&self, event: &PodEvent<'_>) -> Result<(), ClusterError> {
        self.reads.record(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::os::unix::net::UnixListener;
    use std::sync::Mutex;

    /// The thin path's calls, by kind.
    #[derive(Default)]
    struct Thin {
        calls: Mutex<Vec<String>>,
    }

    impl Cluster for Thin {
        fn pod(&self, _: &PodRef) -> Result<Pod, ClusterError> {
            Err(ClusterError::unavailable("thin"))
        }
        fn nad(&self, _: &str, _: &str) -> Result<NetworkAttachmentDefinition, ClusterError> {
            Err(ClusterError::unavailable("thin"))
        }
        fn write_status(&self, _: &PodRef, _: &str) -> Result<(), ClusterError> {
            self.calls.lock().unwrap().push("status".into());
            Ok(())
        }
        fn record(&self, event: &PodEvent<'_>) -> Result<(), ClusterError> {
            let message = event.message;
            self.calls.lock().unwrap().push(format!("event {message}"));
            Ok(())
        }
        fn write_claim_status(
            &self,
            _: &PodRef,
            claim: &ClaimName,
            _: &[DeviceNetworkData],
        ) -> Result<(), ClusterError> {
            self.calls.lock().unwrap().push(format!("claim {claim}"));
            Ok(())
        }
    }

    /// A daemon that reads `expect` requests before it answers any, then answers with `answers` in turn.
    fn daemon(
        dir: &std::path::Path,
        expect: usize,
        answers: Vec<Answer>,
    ) -> (PathBuf, std::thread::JoinHandle<Vec<Request>>) {
        let socket = dir.join("daemon.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let server = std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut seen = Vec::new();
            for _ in 0..expect {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                seen.push(serde_json::from_str::<Request>(&line).unwrap());
            }
            let mut conn = conn;
            for a in &answers {
                let _ = write_message(&mut conn, a);
            }
            seen
        });
        (socket, server)
    }

    fn pod() -> PodRef {
        PodRef {
            namespace: "ns".into(),
            name: "p".into(),
            uid: None,
        }
    }

    #[test]
    fn publish_sends_the_status_and_events_before_reading_answers() {
        let dir = tempfile::tempdir().unwrap();
        // This daemon answers nothing until it has all four requests: a client that waited for each answer
        // would time out and go to the API instead.
        let (socket, server) = daemon(dir.path(), 4, vec![Answer::Done; 4]);
        let thin = Thin::default();
        let conf = DaemonConf {
            socket,
            timeout: Duration::from_secs(2),
            events: true,
        };
        let added = ["Add net1".to_string(), "Add net2".into(), "Add net3".into()];
        DaemonCluster::new(conf, &thin)
            .publish(&pod(), None, "[]", &added, &[])
            .unwrap();
        let seen = server.join().unwrap();
        assert!(
            matches!(&seen[0], Request::Status { network_status, .. } if network_status == "[]"),
            "{seen:?}"
        );
        let events: Vec<&str> = seen[1..]
            .iter()
            .filter_map(|r| match r {
                Request::Event { message, .. } => Some(message.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(events, ["Add net1", "Add net2", "Add net3"]);
        assert!(thin.calls.lock().unwrap().is_empty(), "nothing went thin");
    }

    #[test]
    fn what_the_daemon_does_not_take_goes_to_the_api() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, server) = daemon(dir.path(), 2, vec![Answer::Busy, Answer::Unsynced]);
        let thin = Thin::default();
        let conf = DaemonConf {
            socket,
            timeout: Duration::from_secs(2),
            events: true,
        };
        DaemonCluster::new(conf, &thin)
            .publish(&pod(), None, "[]", &["Add net1".to_string()], &[])
            .unwrap();
        server.join().unwrap();
        assert_eq!(*thin.calls.lock().unwrap(), ["status", "event Add net1"]);

        // No daemon at all: everything goes thin, events only when they are on.
        let thin = Thin::default();
        let conf = DaemonConf {
            socket: dir.path().join("none.sock"),
            timeout: Duration::from_secs(1),
            events: false,
        };
        DaemonCluster::new(conf, &thin)
            .publish(&pod(), None, "[]", &[], &[])
            .unwrap();
        assert_eq!(*thin.calls.lock().unwrap(), ["status"]);
    }

    /// A DEL hands the claim status it takes back to the daemon; what the daemon does not take (it is not there, or
    /// busy) goes to the writer the DEL bounds, never to the source its reads go to.
    #[test]
    fn a_del_hands_what_it_takes_back_to_the_daemon_and_writes_it_itself_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let claim = ClaimName {
            namespace: "ns".into(),
            name: "c".into(),
        };
        let (reads, writes) = (Thin::default(), Thin::default());
        let (socket, server) = daemon(dir.path(), 1, vec![Answer::Done]);
        let timeout = Duration::from_secs(5);
        DelCluster::new(&reads, &writes, Some((socket.clone(), timeout)))
            .write_claim_status(&pod(), &claim, &[])
            .unwrap();
        let seen = server.join().unwrap();
        assert!(
            matches!(&seen[..], [Request::ClaimStatus { claim: c, devices, .. }] if *c == claim && devices.is_empty()),
            "{seen:?}"
        );
        assert!(writes.calls.lock().unwrap().is_empty());

        std::fs::remove_file(&socket).unwrap();
        let (socket, server) = daemon(dir.path(), 1, vec![Answer::Busy]);
        DelCluster::new(&reads, &writes, Some((socket, timeout)))
            .write_claim_status(&pod(), &claim, &[])
            .unwrap();
        server.join().unwrap();
        let none = dir.path().join("none.sock");
        DelCluster::new(&reads, &writes, Some((none, timeout)))
            .write_claim_status(&pod(), &claim, &[])
            .unwrap();
        DelCluster::new(&reads, &writes, None)
            .write_claim_status(&pod(), &claim, &[])
            .unwrap();
        assert_eq!(*writes.calls.lock().unwrap(), ["claim ns/c"; 3]);
        assert!(reads.calls.lock().unwrap().is_empty());
    }
}
