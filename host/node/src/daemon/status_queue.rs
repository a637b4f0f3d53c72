//! The daemon's durable queue of accepted network-status writes, and of the network data written into
//! ResourceClaims' `status.devices[]` (one file per claim, newest write wins, as per pod).
//!
//! A write the daemon answers `done` to is first kept in a file of its own (one per pod, newest write wins) in a
//! root-only directory, so that an API outage of any length, a restart or a `kill -9` does not lose it: it stays
//! until the API server accepts it or the pod is gone (deleted, or replaced by one with a new UID). Bounded in
//! pods and bytes: past either bound the daemon answers `busy` and the CNI process writes the status itself.
//!
//! The directory lives beside the socket (`/run/plexus/status-queue` by default): a tmpfs, where a write and its
//! sync cost little, kept exactly as long as what it is about: a node's reboot ends every pod.

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use plexus_core::spec::dra::{ClaimName, DeviceNetworkData};
use plexus_core::spec::PodRef;
use serde::{Deserialize, Serialize};

use super::files;
use plexus_cni::daemon::proto::MAX_REQUEST_BYTES;

/// Pods with a write kept at most.
pub const MAX_PODS: usize = 4096;
/// Bytes of kept writes at most (a network-status value is at most a request's size).
pub const MAX_BYTES: usize = 64 << 20;
/// A kept write's mode: root's alone.
const FILE_MODE: u32 = 0o600;

/// One write, as kept: for a pod, its network-status, or a claim's device status written for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "KeptFile", into = "KeptFile")]
pub struct Kept {
    pub pod: PodRef,
    pub write: Write,
}

/// What a kept write sets.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// The pod's network-status annotation.
    Status(String),
    /// Plexus's entries of a claim's `status.devices[]`.
    Claim(ClaimWrite),
}

/// A kept write's file (the form daemons before the [`Write`] enum kept too, so a restart across versions keeps
/// its writes).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KeptFile {
    pod: PodRef,
    #[serde(default)]
    network_status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    claim: Option<ClaimWrite>,
}

impl From<KeptFile> for Kept {
    fn from(f: KeptFile) -> Kept {
        let write = match f.claim {
            Some(c) => Write::Claim(c),
            None => Write::Status(f.network_status),
        };
        Kept { pod: f.pod, write }
    }
}

impl From<Kept> for KeptFile {
    fn from(k: Kept) -> KeptFile {
        let (network_status, claim) = match k.write {
            Write::Status(s) => (s, None),
            Write::Claim(c) => (String::new(), Some(c)),
        };
        KeptFile {
            pod: k.pod,
            network_status,
            claim,
        }
    }
}

/// Plexus's entries of a claim's `status.devices[]` (all of them: none takes them back).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimWrite {
    pub claim: ClaimName,
    pub devices: Vec<DeviceNetworkData>,
}

/// What a kept write is filed under: one file and one writer each.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    Pod { namespace: String, name: String },
    Claim(ClaimName),
}

impl Key {
    pub fn pod(namespace: &str, name: &str) -> Key {
        Key::Pod {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The name its file's name is the digest of: the pod's `namespace/name`; a claim's behind a prefix no
    /// namespace can have (a `/`), so a claim and a pod of the same name never share a file.
    fn file_name(&self) -> String {
        match self {
            Key::Pod { namespace, name } => format!("{namespace}/{name}"),
            Key::Claim(c) => format!("resourceclaims/{}/{}", c.namespace, c.name),
        }
    }
}

#[derive(Default)]
struct State {
    /// The newest write of each pod not yet taken by its writer.
    pending: HashMap<Key, Kept>,
    /// Pods whose writer runs.
    busy: HashSet<Key>,
    /// The size of each pod's file.
    sizes: HashMap<Key, usize>,
    bytes: usize,
}

/// Why a write was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    #[error("the status queue is full ({0})")]
    Full(String),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub struct StatusQueue {
    dir: PathBuf,
    state: Mutex<State>,
}

/// What a kept write is filed under: its claim, or its pod.
fn key_of_kept(kept: &Kept) -> Key {
    match &kept.write {
        Write::Claim(c) => Key::Claim(c.claim.clone()),
        Write::Status(_) => Key::pod(&kept.pod.namespace, &kept.pod.name),
    }
}

impl StatusQueue {
    /// Opens (creating it, root's alone) the queue in `dir`; answers the pods whose writes an earlier run kept
    /// there: they are pending again, and marked as having a writer, which the caller starts for each. A file
    /// that is not one of ours (another owner or mode, not a regular file, not a write, too large, or under the
    /// wrong name) is removed, never sent.
    pub fn open(dir: &Path) -> std::io::Result<(StatusQueue, Vec<Key>)> {
        files::private_dir(dir, 0o700)?;
        let queue = StatusQueue {
            dir: dir.to_path_buf(),
            state: Mutex::default(),
        };
        let mut found = Vec::new();
        let mut names: Vec<PathBuf> = std::fs::read_dir(dir)?
            .flatten()
            .map(|e| e.path())
            .collect();
        names.sort();
        for path in names {
            match queue.read_kept(&path) {
                Ok((kept, size)) => {
                    let key = key_of_kept(&kept);
                    let mut s = queue.lock();
                    if s.pending.len() >= MAX_PODS || s.bytes + size > MAX_BYTES {
                        tracing::warn!(path = %path.display(), "status queue over its bounds: dropped a kept write");
                        drop(s);
                        let _ = std::fs::remove_file(&path);
                        continue;
                    }
                    s.bytes += size;
                    s.sizes.insert(key.clone(), size);
                    s.pending.insert(key.clone(), kept);
                    s.busy.insert(key.clone());
                    found.push(key);
                }
                Err(why) => {
                    tracing::warn!(path = %path.display(), "removed from the status queue: {why}");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        Ok((queue, found))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A pod's file.
    fn path_of(&self, key: &Key) -> PathBuf {
        path_in(&self.dir, key)
    }

    fn read_kept(&self, path: &Path) -> Result<(Kept, usize), String> {
        read_kept(&self.dir, path)
    }

    /// Keeps a pod's write (replacing one not yet taken); true when the pod has no writer yet (the caller
    /// starts one). The write is on disk when this returns.
    pub fn accept(&self, pod: PodRef, network_status: String) -> Result<bool, AcceptError> {
        self.accept_kept(Kept {
            pod,
            write: Write::Status(network_status),
        })
    }

    /// Keeps a claim's device status written for `pod` (replacing one of the claim not yet taken), as
    /// [`StatusQueue::accept`] keeps a pod's.
    pub fn accept_claim(
        &self,
        pod: PodRef,
        claim: ClaimName,
        devices: Vec<DeviceNetworkData>,
    ) -> Result<bool, AcceptError> {
        self.accept_kept(Kept {
            pod,
            write: Write::Claim(ClaimWrite { claim, devices }),
        })
    }

    fn accept_kept(&self, kept: Kept) -> Result<bool, AcceptError> {
        let key = key_of_kept(&kept);
        let bytes = serde_json::to_vec(&kept).expect("a write serializes");
        let path = self.path_of(&key);
        // Under the lock, so that the file and the map always agree on which write is the newest.
        let mut s = self.lock();
        let old = s.sizes.get(&key).copied().unwrap_or(0);
        if !s.sizes.contains_key(&key) && s.sizes.len() >= MAX_PODS {
            return Err(AcceptError::Full(format!("{MAX_PODS} pods")));
        }
        if s.bytes - old + bytes.len() > MAX_BYTES {
            return Err(AcceptError::Full(format!("{MAX_BYTES} bytes")));
        }
        plexus_cni::conf::replace_file(&path, &bytes, FILE_MODE).map_err(|source| {
            AcceptError::Io {
                path: path.clone(),
                source,
            }
        })?;
        s.bytes = s.bytes - old + bytes.len();
        s.sizes.insert(key.clone(), bytes.len());
        s.pending.insert(key.clone(), kept);
        Ok(s.busy.insert(key))
    }

    /// The pod's newest write for its writer to send; `None` ends the writer.
    pub fn take(&self, key: &Key) -> Option<Kept> {
        let mut s = self.lock();
        match s.pending.remove(key) {
            Some(k) => Some(k),
            None => {
                s.busy.remove(key);
                None
            }
        }
    }

    /// A newer write of the pod, if one was accepted since [`StatusQueue::take`].
    pub fn newer(&self, key: &Key) -> Option<Kept> {
        self.lock().pending.remove(key)
    }

    /// The write taken last was sent, or is no longer wanted (the pod is gone): its file goes, unless a newer
    /// write replaced it.
    pub fn finished(&self, key: &Key) {
        let mut s = self.lock();
        if s.pending.contains_key(key) {
            return;
        }
        if let Some(size) = s.sizes.remove(key) {
            s.bytes -= size;
        }
        let path = self.path_of(key);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove a sent write")
            }
        }
    }

    /// Writes kept and not yet sent (waiting, or being sent).
    pub fn len(&self) -> usize {
        self.lock().sizes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A pod's file under `dir`: named by the digest of namespace/name (bounded, and no name can climb out).
fn path_in(dir: &Path, key: &Key) -> PathBuf {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(key.file_name().as_bytes());
    dir.join(format!("{}.json", hex::encode(&digest[..16])))
}

/// A write kept under `dir` at `path`, and the size of its file: root's alone, never a symlink, bounded, and
/// under its own pod's name (for the daemon and for `plexus status`, which reads the queue without owning it).
pub fn read_kept(dir: &Path, path: &Path) -> Result<(Kept, usize), String> {
    use rustix::fs::{Mode, OFlags};
    let fd: OwnedFd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open: {e}"))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| e.to_string())?;
    if !files::is_private(&st, FILE_MODE) {
        return Err(format!(
            "owned by uid {} with mode {:o}: not written by this daemon",
            st.st_uid,
            st.st_mode & 0o7777
        ));
    }
    let bytes = plexus_cni::conf::read_to_cap(std::fs::File::from(fd), MAX_REQUEST_BYTES + 4096)
        .map_err(|e| e.to_string())?;
    let kept: Kept = serde_json::from_slice(&bytes).map_err(|e| format!("not a write: {e}"))?;
    if path_in(dir, &key_of_kept(&kept)) != path {
        return Err("not under its pod's name".into());
    }
    Ok((kept, bytes.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn pod(name: &str, uid: &str) -> PodRef {
        PodRef {
            namespace: "ns".into(),
            name: name.into(),
            uid: Some(uid.into()),
        }
    }

    #[test]
    fn the_newest_write_of_a_pod_is_kept_until_sent() {
        let dir = tempfile::tempdir().unwrap();
        let qdir = dir.path().join("q");
        let (q, found) = StatusQueue::open(&qdir).unwrap();
        assert!(found.is_empty());
        assert_eq!(std::fs::metadata(&qdir).unwrap().mode() & 0o777, 0o700);
        assert!(q.accept(pod("a", "u1"), "[1]".into()).unwrap());
        // A second write before the writer took the first: replaces it, no second writer.
        assert!(!q.accept(pod("a", "u1"), "[2]".into()).unwrap());
        let key = Key::pod("ns", "a");
        let file = q.path_of(&key);
        assert_eq!(std::fs::metadata(&file).unwrap().mode() & 0o777, 0o600);
        let taken = q.take(&key).unwrap();
        assert_eq!(taken.write, Write::Status("[2]".into()));
        // Accepted while the writer sends [2]: the file holds [3] and stays when [2] is done.
        assert!(!q.accept(pod("a", "u1"), "[3]".into()).unwrap());
        q.finished(&key);
        assert!(file.exists());
        assert_eq!(q.len(), 1);
        assert_eq!(q.take(&key).unwrap().write, Write::Status("[3]".into()));
        q.finished(&key);
        assert!(!file.exists());
        assert!(q.take(&key).is_none());
        assert!(q.is_empty());
        // The writer ended: the next write starts one.
        assert!(q.accept(pod("a", "u1"), "[4]".into()).unwrap());
    }

    #[test]
    fn kept_writes_survive_a_restart_and_foreign_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let qdir = dir.path().join("q");
        {
            let (q, _) = StatusQueue::open(&qdir).unwrap();
            q.accept(pod("a", "u1"), "[\"a\"]".into()).unwrap();
            q.accept(pod("b", "u2"), "[\"b\"]".into()).unwrap();
        }
        // Another's file, one of the wrong mode, a symlink: none is sent.
        std::fs::write(qdir.join("junk.json"), "{}").unwrap();
        let q2 = dir.path().join("other");
        {
            let (q, _) = StatusQueue::open(&q2).unwrap();
            q.accept(pod("c", "u3"), "[\"c\"]".into()).unwrap();
            let path = q.path_of(&Key::pod("ns", "c"));
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            std::fs::rename(&path, qdir.join(path.file_name().unwrap())).unwrap();
        }
        std::os::unix::fs::symlink("/etc/hostname", qdir.join("link.json")).unwrap();
        let (q, mut found) = StatusQueue::open(&qdir).unwrap();
        found.sort();
        assert_eq!(found, vec![Key::pod("ns", "a"), Key::pod("ns", "b")]);
        assert_eq!(q.take(&found[0]).unwrap().pod.uid.as_deref(), Some("u1"));
        let left: Vec<_> = std::fs::read_dir(&qdir).unwrap().flatten().collect();
        assert_eq!(left.len(), 2, "{left:?}");
    }

    #[test]
    fn a_claims_write_is_kept_under_the_claim_beside_its_pods() {
        let dir = tempfile::tempdir().unwrap();
        let qdir = dir.path().join("q");
        let claim = ClaimName {
            namespace: "ns".into(),
            name: "a".into(),
        };
        {
            let (q, _) = StatusQueue::open(&qdir).unwrap();
            assert!(q.accept(pod("a", "u1"), "[1]".into()).unwrap());
            // A claim named as the pod: its own file and writer.
            assert!(q
                .accept_claim(pod("a", "u1"), claim.clone(), Vec::new())
                .unwrap());
            assert!(!q
                .accept_claim(pod("a", "u1"), claim.clone(), Vec::new())
                .unwrap());
            assert_eq!(q.len(), 2);
        }
        let (q, mut found) = StatusQueue::open(&qdir).unwrap();
        found.sort();
        assert_eq!(found, vec![Key::pod("ns", "a"), Key::Claim(claim.clone())]);
        let kept = q.take(&Key::Claim(claim.clone())).unwrap();
        assert!(matches!(kept.write, Write::Claim(w) if w.claim == claim));
        assert_eq!(
            q.take(&found[0]).unwrap().write,
            Write::Status("[1]".into())
        );
    }

    #[test]
    fn the_queue_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let (q, _) = StatusQueue::open(&dir.path().join("q")).unwrap();
        let big = "x".repeat(MAX_REQUEST_BYTES - 200);
        let mut n = 0;
        let err = loop {
            match q.accept(pod(&format!("p{n}"), "u"), big.clone()) {
                Ok(_) => n += 1,
                Err(e) => break e,
            }
        };
        assert!(matches!(err, AcceptError::Full(_)), "{err}");
        assert!(n > 0 && n <= MAX_BYTES / (MAX_REQUEST_BYTES - 200), "{n}");
        // A pod already kept may still replace its own write.
        q.accept(pod("p0", "u"), "[]".into()).unwrap();
    }

    #[test]
    fn a_kept_file_keeps_the_form_earlier_daemons_wrote() {
        let status = Kept {
            pod: pod("a", "u1"),
            write: Write::Status("[1]".into()),
        };
        assert_eq!(
            serde_json::to_value(&status).unwrap(),
            serde_json::json!({"pod": {"namespace": "ns", "name": "a", "uid": "u1"}, "networkStatus": "[1]"})
        );
        let earlier = serde_json::json!({"pod": {"namespace": "ns", "name": "a"}, "networkStatus": "",
            "claim": {"claim": {"namespace": "ns", "name": "c"}, "devices": []}});
        let kept: Kept = serde_json::from_value(earlier.clone()).unwrap();
        assert!(matches!(&kept.write, Write::Claim(w) if w.claim.name == "c"));
        assert_eq!(serde_json::to_value(&kept).unwrap(), earlier);
    }
}
