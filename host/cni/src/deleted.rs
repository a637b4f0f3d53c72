//! The record of completed DELs, under `runDir/deleted`: what lets a repeated DEL be answered locally.
//!
//! Container runtimes call DEL more than once for one sandbox (containerd: on StopPodSandbox and again on
//! RemovePodSandbox; with kubelet, five or six times per pod deletion; CRI-O once per StopPodSandbox, which the
//! kubelet repeats). The first DEL removes the attachment
//! cache entry, so without a record a repeated DEL would have to re-plan through the cluster source, and during
//! an API outage pay its whole timeout per call. A completed DEL leaves an empty file named after the container;
//! a DEL that finds no plan but this file has nothing to do.
//!
//! The record lives under `runDir` (a tmpfs the node clears on reboot, as it clears the containers) and is
//! bounded: an entry counts for [`RETAIN`], and at most every [`PRUNE_EVERY`] a completed DEL removes the entries
//! older than that, and the oldest past [`MAX_ENTRIES`]. An ADD for the container forgets its entry.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How long a completed DEL answers repeated ones.
pub const RETAIN: Duration = Duration::from_secs(24 * 3600);
/// The most entries kept; past it the oldest go first.
pub const MAX_ENTRIES: usize = 16_384;
/// How often (at most) a DEL spends a directory scan on pruning.
pub const PRUNE_EVERY: Duration = Duration::from_secs(600);

/// Marks the last prune (its mtime); a dot file, so never a container id.
const PRUNE_MARK: &str = ".pruned";

/// The `runDir/deleted` directory. Every operation is best effort: a record that cannot be written or read only
/// costs a repeated DEL its shortcut.
#[derive(Debug, Clone)]
pub struct DeletedLog {
    dir: PathBuf,
}

impl DeletedLog {
    pub fn new(run_dir: &Path) -> Self {
        Self {
            dir: run_dir.join("deleted"),
        }
    }

    /// True when a DEL of `container_id` completed within [`RETAIN`]. `container_id` must be validated.
    pub fn contains(&self, container_id: &str) -> bool {
        std::fs::symlink_metadata(self.dir.join(container_id))
            .ok()
            .filter(|m| m.is_file())
            .and_then(|m| m.modified().ok())
            .is_some_and(|t| age(t) < RETAIN)
    }

    /// Records a completed DEL of `container_id`, and prunes when a prune is due.
    pub fn record(&self, container_id: &str) {
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&self.dir)?;
            // Truncating an existing entry renews its mtime.
            std::fs::File::create(self.dir.join(container_id))?;
            Ok(())
        };
        if let Err(e) = write() {
            tracing::warn!(dir = %self.dir.display(), "cannot record the completed DEL (a repeated DEL will re-plan): {e}");
            return;
        }
        if self.prune_due() {
            self.prune();
        }
    }

    /// Forgets `container_id` (an ADD for it began).
    pub fn forget(&self, container_id: &str) {
        match std::fs::remove_file(self.dir.join(container_id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(dir = %self.dir.display(), "cannot forget the DEL record of {container_id}: {e}")
            }
            _ => {}
        }
    }

    fn prune_due(&self) -> bool {
        std::fs::metadata(self.dir.join(PRUNE_MARK))
            .and_then(|m| m.modified())
            .map_or(true, |t| age(t) >= PRUNE_EVERY)
    }

    /// Removes entries older than [`RETAIN`], then the oldest past [`MAX_ENTRIES`].
    pub fn prune(&self) {
        let _ = std::fs::File::create(self.dir.join(PRUNE_MARK));
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut kept: Vec<(SystemTime, PathBuf)> = Vec::new();
        for entry in entries.filter_map(Result::ok) {
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let path = entry.path();
            match entry.metadata().and_then(|m| m.modified()) {
                Ok(t) if age(t) < RETAIN => kept.push((t, path)),
                _ => {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        if kept.len() > MAX_ENTRIES {
            kept.sort();
            for (_, path) in &kept[..kept.len() - MAX_ENTRIES] {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// How long ago `t` was; a time in the future (clock set back) counts as now.
fn age(t: SystemTime) -> Duration {
    SystemTime::now().duration_since(t).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_age(path: &Path, ago: Duration) {
        let f = std::fs::File::options().write(true).open(path).unwrap();
        f.set_modified(SystemTime::now() - ago).unwrap();
    }

    /// How many DELs are recorded.
    fn count(log: &DeletedLog) -> usize {
        std::fs::read_dir(&log.dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                    .count()
            })
            .unwrap_or(0)
    }

    #[test]
    fn record_contains_forget() {
        let tmp = tempfile::tempdir().unwrap();
        let log = DeletedLog::new(tmp.path());
        assert!(!log.contains("c1"));
        log.record("c1");
        assert!(log.contains("c1") && !log.contains("c2"));
        log.forget("c1");
        assert!(!log.contains("c1"));
        log.forget("c1");
    }

    #[test]
    fn entries_expire_and_prune_removes_old_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let log = DeletedLog::new(tmp.path());
        log.record("old");
        log.record("new");
        set_age(
            &tmp.path().join("deleted/old"),
            RETAIN + Duration::from_secs(1),
        );
        assert!(!log.contains("old"), "an expired entry does not answer");
        assert!(log.contains("new"));
        log.prune();
        assert!(!tmp.path().join("deleted/old").exists());
        assert_eq!(count(&log), 1);
    }

    #[test]
    fn a_due_prune_runs_on_record_and_keeps_at_most_max_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let log = DeletedLog::new(tmp.path());
        log.record("first");
        let dir = tmp.path().join("deleted");
        for i in 0..MAX_ENTRIES + 5 {
            std::fs::File::create(dir.join(format!("c{i}"))).unwrap();
        }
        set_age(&dir.join("c0"), Duration::from_secs(60));
        set_age(&dir.join("c1"), Duration::from_secs(50));
        // Not due yet: the first record marked a prune.
        log.record("second");
        assert_eq!(count(&log), MAX_ENTRIES + 7);
        set_age(&dir.join(PRUNE_MARK), PRUNE_EVERY);
        log.record("third");
        assert_eq!(count(&log), MAX_ENTRIES);
        assert!(
            !dir.join("c0").exists() && !dir.join("c1").exists(),
            "the oldest go first"
        );
        assert!(log.contains("third"));
    }
}
