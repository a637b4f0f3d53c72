//! Per-container serialization: an exclusive flock per container id under `runDir/locks`.
//!
//! The CNI spec forbids parallel operations on one container, but runtimes are not perfect and a node
//! daemon may retry; the lock makes ADD/DEL/CHECK for one container strictly sequential across processes
//! while different containers proceed in parallel.

use std::path::Path;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions};
use rustix::fs::{flock, FlockOperation};

use crate::error::PlexusError;

/// Held while an operation runs; the kernel drops the lock when the file is closed (or the process dies).
#[derive(Debug)]
pub struct ContainerLock {
    _file: cap_std::fs::File,
}

impl ContainerLock {
    /// Blocks until the lock for `container_id` is ours. `container_id` must already be validated.
    pub fn acquire(run_dir: &Path, container_id: &str) -> Result<Self, PlexusError> {
        let io = |what: &str, e: std::io::Error| PlexusError::Io {
            path: run_dir.join(what).display().to_string(),
            source: e,
        };
        std::fs::create_dir_all(run_dir.join("locks")).map_err(|e| io("locks", e))?;
        let dir = Dir::open_ambient_dir(run_dir.join("locks"), ambient_authority())
            .map_err(|e| io("locks", e))?;
        let name = format!("{container_id}.lock");
        let file = dir
            .open_with(
                &name,
                OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .read(true)
                    .write(true),
            )
            .map_err(|e| io(&format!("locks/{name}"), e))?;
        flock(&file, FlockOperation::LockExclusive)
            .map_err(|e| io(&format!("locks/{name}"), e.into()))?;
        Ok(Self { _file: file })
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
}
