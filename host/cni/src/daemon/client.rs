//! The CNI process's side of the node daemon: a [`Cluster`] that asks the daemon first and the API itself when
//! the daemon cannot answer in time (thin mode).
//!
//! Only an ADD asks the daemon; DEL, CHECK and GC never do, so a daemon can never block a teardown. An
//! invocation keeps one connection for all its questions. The first time the daemon fails to answer (no
//! socket, refused, timed out, unsynced, busy), the rest of the invocation goes thin at once: a dead or hung
//! daemon costs one bounded wait per ADD, not one per object.

use std::cell::{Cell, RefCell};
use std::io::{BufReader, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use plexus_cluster::{Cluster, ClusterError};
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
}

impl<'a> DaemonCluster<'a> {
    pub fn new(conf: DaemonConf, thin: &'a dyn Cluster) -> Self {
        DaemonCluster {
            conf,
            thin,
            gone: Cell::new(false),
            conn: RefCell::new(None),
        }
    }

    /// One question on the shared connection; a connection that served earlier questions and fails now (the
    /// daemon closed it while the delegates ran, or restarted) is replaced once.
    fn exchange(&self, request: &Request, timeout: Duration) -> Result<Answer, AskError> {
        let mut slot = self.conn.borrow_mut();
        let reused = slot.is_some();
        if slot.is_none() {
            *slot = Some(BufReader::new(connect(&self.conf.socket)?));
        }
        let conn = slot.as_mut().expect("filled above");
        match exchange(conn, request, timeout) {
            Ok(a) => Ok(a),
            Err(e) => {
                *slot = None;
                if !reused {
                    return Err(e);
                }
                let mut fresh = BufReader::new(connect(&self.conf.socket)?);
                let answer = exchange(&mut fresh, request, timeout)?;
                *slot = Some(fresh);
                Ok(answer)
            }
        }
    }

    /// The daemon's answer, or `None` (after which this invocation stops asking).
    fn ask(&self, request: &Request, timeout: Duration) -> Option<Answer> {
        if self.gone.get() {
            return None;
        }
        let answer = match self.exchange(request, timeout) {
            Ok(Answer::Unsynced) => Err(AskError::Unsynced),
            Ok(Answer::Busy) => Err(AskError::Busy),
            Ok(answer) => Ok(answer),
            Err(e) => Err(e),
        };
        match answer {
            Ok(a) => Some(a),
            Err(reason) => {
                self.gone.set(true);
                tracing::debug!(socket = %self.conf.socket.display(), %reason, "node daemon cannot answer; asking the API directly");
                None
            }
        }
    }
}

/// One request and its answer over a fresh connection, all within `timeout`.
pub fn ask(
    socket: &std::path::Path,
    request: &Request,
    timeout: Duration,
) -> Result<Answer, AskError> {
    exchange(&mut BufReader::new(connect(socket)?), request, timeout)
}

/// A connection to the daemon. The socket must belong to root (or to this process's user): anything else could
/// hand out plans.
fn connect(socket: &std::path::Path) -> Result<UnixStream, AskError> {
    let meta = std::fs::metadata(socket).map_err(|source| AskError::NoSocket {
        path: socket.to_path_buf(),
        source,
    })?;
    let euid = rustix::process::geteuid().as_raw();
    if !meta.file_type().is_socket() || (meta.uid() != 0 && meta.uid() != euid) {
        return Err(AskError::NotRootSocket(socket.to_path_buf()));
    }
    UnixStream::connect(socket).map_err(AskError::Connect)
}

/// Sends `request` and reads its answer, all within `timeout`.
fn exchange(
    conn: &mut BufReader<UnixStream>,
    request: &Request,
    timeout: Duration,
) -> Result<Answer, AskError> {
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
    write_message(&mut *stream, request).map_err(AskError::Send)?;
    let _ = stream.flush();
    stream
        .set_read_timeout(Some(left()))
        .map_err(|e| AskError::Answer(e.into()))?;
    read_message(conn, MAX_ANSWER_BYTES).map_err(AskError::Answer)
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

fn unexpected(what: &str, answer: Answer) -> ClusterError {
    ClusterError::Invalid {
        what: "node daemon answer".into(),
        reason: format!("asked for {what}, got {answer:?}"),
    }
}

impl Cluster for DaemonCluster<'_> {
    fn pod(&self, pod: &PodRef) -> Result<Pod, ClusterError> {
        match self.ask(&Request::Pod { pod: pod.clone() }, self.conf.timeout) {
            Some(Answer::Pod { pod }) => Ok(pod),
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
        };
        match self.ask(&request, self.conf.timeout) {
            Some(Answer::Nad { nad }) => Ok(nad),
            Some(Answer::Failed { error }) => Err(error),
            Some(other) => Err(unexpected("a NetworkAttachmentDefinition", other)),
            None => self.thin.nad(namespace, name),
        }
    }

    fn write_status(&self, pod: &PodRef, network_status: &str) -> Result<(), ClusterError> {
        let request = Request::Status {
            pod: pod.clone(),
            network_status: network_status.into(),
        };
        match self.ask(&request, self.conf.timeout) {
            // Accepted: the daemon sends it, with retries.
            Some(Answer::Done) => Ok(()),
            Some(Answer::Failed { error }) => Err(error),
            Some(other) => Err(unexpected("a status write", other)),
            // The merge patch is idempotent: writing it again after a daemon died holding it is harmless.
            None => self.thin.write_status(pod, network_status),
        }
    }

    fn record_attachment(&self, pod: &PodRef, message: &str) -> Result<(), ClusterError> {
        self.event(pod, false, plexus_cluster::ADDED_INTERFACE, message)
    }

    fn record_warning(
        &self,
        pod: &PodRef,
        reason: &str,
        message: &str,
    ) -> Result<(), ClusterError> {
        self.event(pod, true, reason, message)
    }
}

impl DaemonCluster<'_> {
    fn event(
        &self,
        pod: &PodRef,
        warning: bool,
        reason: &str,
        message: &str,
    ) -> Result<(), ClusterError> {
        if !self.conf.events {
            return Ok(());
        }
        let request = Request::Event {
            pod: pod.clone(),
            warning,
            reason: reason.into(),
            message: message.into(),
        };
        match self.ask(&request, self.conf.timeout) {
            Some(_) => Ok(()),
            None if warning => self.thin.record_warning(pod, reason, message),
            None => self.thin.record_attachment(pod, message),
        }
    }
}
