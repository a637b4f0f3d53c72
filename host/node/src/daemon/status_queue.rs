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

/// One pod's write, as kept; or, with `claim`, a claim's device status written for that pod.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Kept {
    pub pod: PodRef,
    #[serde(default)]
    pub network_status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<ClaimWrite>,
}

/// Plexus's entries of a claim's `status.devices[]` (all of them: none takes them back).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimWrite {
    pub claim: ClaimName,
    pub devices: Vec<DeviceNetworkData>,
}

pub type Key = (String, String);

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

fn key_of(pod: &PodRef) -> Key {
    (pod.namespace.clone(), pod.name.clone())
}

/// A claim's key: its namespace behind a prefix no namespace name can have (a `/`), so a claim and a pod of the
/// same name never share a file.
pub fn claim_key(claim: &ClaimName) -> Key {
    (
        format!("resourceclaims/{}", claim.namespace),
        claim.name.clone(),
    )
}

/// What a kept write is filed under: its claim, or its pod.
fn key_of_kept(kept: &Kept) -> Key {
    match &kept.claim {
        Some(c) => claim_key(&c.claim),
        None => key_of(&kept.pod),
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
            network_status,
            claim: None,
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
            network_status: String::new(),
            claim: Some(ClaimWrite { claim, devices }),
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
    let digest = sha2::Sha256::digest(format!("{}/{}", key.0, key.1).as_bytes());
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
        let key = ("ns".to_string(), "a".to_string());
        let file = q.path_of(&key);
        assert_eq!(std::fs::metadata(&file).unwrap().mode() & 0o777, 0o600);
        let taken = q.take(&key).unwrap();
        assert_eq!(taken.network_status, "[2]");
        // Accepted while the writer sends [2]: the file holds [3] and stays when [2] is done.
        assert!(!q.accept(pod("a", "u1"), "[3]".into()).unwrap());
        q.finished(&key);
        assert!(file.exists());
        assert_eq!(q.len(), 1);
        assert_eq!(q.take(&key).unwrap().network_status, "[3]");
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
            let path = q.path_of(&("ns".into(), "c".into()));
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            std::fs::rename(&path, qdir.join(path.file_name().unwrap())).unwrap();
        }
        std::os::unix::fs::symlink("/etc/hostname", qdir.join("link.json")).unwrap();
        let (q, mut found) = StatusQueue::open(&qdir).unwrap();
        found.sort();
        assert_eq!(
            found,
            vec![
                ("ns".to_string(), "a".to_string()),
                ("ns".to_string(), "b".to_string())
            ]
        );
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
        assert_eq!(
            found,
            vec![("ns".to_string(), "a".to_string()), claim_key(&claim)]
        );
        let kept = q.take(&claim_key(&claim)).unwrap();
        assert_eq!(kept.claim.unwrap().claim, claim);
        assert_eq!(q.take(&found[0]).unwrap().network_status, "[1]");
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
}
