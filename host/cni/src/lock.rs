//! Per-container serialization: an exclusive flock per container id under `runDir/locks`.
//!
//! The CNI spec forbids parallel operations on one container, but runtimes are not perfect and a node
//! daemon may retry; the lock makes ADD/DEL/CHECK for one container strictly sequential across processes
//! while different containers proceed in parallel.
//!
//! The lock file exists only while an operation holds it: the holder unlinks it before it lets go, so a node
//! does not keep one file per container it ever ran. A process that was waiting on the unlinked file gets the
//! lock on a file that no longer has the name; it sees that (the name is gone or names another file) and
//! starts over, so two processes never hold different files for one container.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cap_std::ambient_authority;
use cap_std::fs::{Dir, MetadataExt, OpenOptions};
use rustix::fs::{flock, FlockOperation};

use crate::error::PlexusError;

/// How long an operation waits for another on the same container. Delegates are bounded by
/// `delegateTimeoutMs`, so a holder ends; this bounds the wait when something else keeps a lock.
pub const LOCK_WAIT: Duration = Duration::from_secs(300);

/// Held while an operation runs; the kernel drops the lock when the file is closed (or the process dies).
#[derive(Debug)]
pub struct ContainerLock {
    dir: Dir,
    name: String,
    file: Option<cap_std::fs::File>,
}

impl ContainerLock {
    /// Waits (at most [`LOCK_WAIT`]) until the lock for `container_id` is ours. `container_id` must already be
    /// validated.
    pub fn acquire(run_dir: &Path, container_id: &str) -> Result<Self, PlexusError> {
        Self::acquire_within(run_dir, container_id, LOCK_WAIT)
    }

    pub fn acquire_within(
        run_dir: &Path,
        container_id: &str,
        wait: Duration,
    ) -> Result<Self, PlexusError> {
        let locks = run_dir.join("locks");
        let io = |what: &str, e: std::io::Error| PlexusError::Io {
            path: locks.join(what).display().to_string(),
            source: e,
        };
        std::fs::create_dir_all(&locks).map_err(|e| io("", e))?;
        let dir = Dir::open_ambient_dir(&locks, ambient_authority()).map_err(|e| io("", e))?;
        let name = format!("{container_id}.lock");
        let deadline = Instant::now() + wait;
        let mut pause = Duration::from_millis(1);
        loop {
            let file = dir
                .open_with(
                    &name,
                    OpenOptions::new()
                        .create(true)
                        .truncate(false)
                        .read(true)
                        .write(true),
                )
                .map_err(|e| io(&name, e))?;
            match flock(&file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {
                    if still_named(&dir, &name, &file) {
                        return Ok(Self {
                            dir,
                            name,
                            file: Some(file),
                        });
                    }
                    // The holder unlinked it as we locked it: start over on the current file.
                    continue;
                }
                Err(rustix::io::Errno::WOULDBLOCK) => {}
                Err(e) => return Err(io(&name, e.into())),
            }
            if Instant::now() >= deadline {
                return Err(PlexusError::NotReady(format!(
                    "another operation on container {container_id} holds {} for more than {wait:?}",
                    Self::path(run_dir, container_id).display()
                )));
            }
            // Polling rather than a blocking flock keeps the wait bounded without a thread or a signal.
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// The lock file's path.
    pub fn path(run_dir: &Path, container_id: &str) -> PathBuf {
        run_dir.join("locks").join(format!("{container_id}.lock"))
    }
}

/// True when `name` in `dir` is still the file `file` is open on.
fn still_named(dir: &Dir, name: &str, file: &cap_std::fs::File) -> bool {
    match (dir.symlink_metadata(name), file.metadata()) {
        (Ok(at_name), Ok(held)) => at_name.dev() == held.dev() && at_name.ino() == held.ino(),
        _ => false,
    }
}

impl Drop for ContainerLock {
    fn drop(&mut self) {
        // Unlink while still holding the lock, then close (which releases it): see the module docs.
        let _ = self.dir.remove_file(&self.name);
        drop(self.file.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn same_container_is_serialized_different_containers_are_not() {
        let tmp = tempfile::tempdir().unwrap();
        let inside = Arc::new(AtomicUsize::new(0));
        let max_inside = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (dir, inside, max_inside) =
                    (tmp.path().to_path_buf(), inside.clone(), max_inside.clone());
                std::thread::spawn(move || {
                    // flock locks belong to the open file description, so separate opens exclude each other
                    // even within one process.
                    let _l = ContainerLock::acquire(&dir, "c1").unwrap();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    max_inside.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    inside.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(max_inside.load(Ordering::SeqCst), 1);

        let _a = ContainerLock::acquire(tmp.path(), "c1").unwrap();
        // A different container must not block (this would hang forever if it did).
        let _b = ContainerLock::acquire(tmp.path(), "c2").unwrap();
    }

    #[test]
    fn lock_files_are_removed_and_the_wait_is_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        let held = ContainerLock::acquire(tmp.path(), "c1").unwrap();
        assert!(ContainerLock::path(tmp.path(), "c1").exists());
        let err = ContainerLock::acquire_within(tmp.path(), "c1", Duration::from_millis(100))
            .unwrap_err();
        assert_eq!(err.cni_code(), 11, "{err}");
        assert!(err.to_string().contains("c1.lock"), "{err}");
        drop(held);
        assert!(
            std::fs::read_dir(tmp.path().join("locks"))
                .unwrap()
                .next()
                .is_none(),
            "no lock file outlives its operation"
        );
    }

    #[test]
    fn many_processes_churning_one_container_never_overlap() {
        // Every acquire and release creates and unlinks the file: the race the module docs describe.
        let tmp = tempfile::tempdir().unwrap();
        let inside = Arc::new(AtomicUsize::new(0));
        let overlap = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (dir, inside, overlap) =
                    (tmp.path().to_path_buf(), inside.clone(), overlap.clone());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let _l = ContainerLock::acquire(&dir, "c1").unwrap();
                        if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                            overlap.fetch_add(1, Ordering::SeqCst);
                        }
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(overlap.load(Ordering::SeqCst), 0);
        assert!(std::fs::read_dir(tmp.path().join("locks"))
            .unwrap()
            .next()
            .is_none());
    }
}
