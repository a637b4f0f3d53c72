//! The node process's own files under `runDir` and `cacheDir`: root's alone.
//!
//! A local user who can open one of them can hold a `flock` on the daemon's lock (the daemon then never
//! starts), read the status queue, or swap a file for a symlink. So every directory the daemon keeps files in
//! must belong to it and be writable by nobody else (a directory that is not is refused, never repaired: the
//! daemon cannot know what else was done there), and every file is opened without following symlinks and
//! checked after opening: one of another owner or mode is replaced, not trusted.

use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{Mode, OFlags};

/// A directory the daemon keeps files in: created (mode `mode`) if missing; refused when it is a symlink, is
/// not a directory, belongs to another user, or is writable by group or others.
pub fn private_dir(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
    {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(path)?;
    let uid = rustix::process::geteuid().as_raw();
    let refuse = |why: String| {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            why,
        ))
    };
    if !meta.file_type().is_dir() {
        return refuse("not a directory (a symlink is not followed)".into());
    }
    if meta.uid() != uid {
        return refuse(format!("owned by uid {}, not {uid}", meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return refuse(format!(
            "mode {:o} lets others write into it",
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Whether an open file is one of the daemon's own: a regular file of this user with exactly `mode`.
pub fn is_private(st: &rustix::fs::Stat, mode: u32) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
        && st.st_uid == rustix::process::geteuid().as_raw()
        && st.st_mode & 0o7777 == mode
}

/// What [`open_private`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// Created, or there already: ours, with the right mode.
    Kept,
    /// A file of another owner or mode (or not a regular file) was there: removed and created anew.
    Replaced,
}

/// Opens (read-write, creating it mode `mode`) a file only the daemon's user may use. The name is never
/// followed as a symlink; an existing file that is not a regular file owned by this user with exactly `mode`
/// is unlinked and created anew (`O_EXCL`), so an open file descriptor someone else holds on it (a `flock`,
/// say) no longer matters. The directory must already be [`private_dir`].
pub fn open_private(path: &Path, mode: u32) -> std::io::Result<(OwnedFd, Opened)> {
    let base = OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NOCTTY;
    let mut replaced = false;
    // Twice at most: the second open creates with O_EXCL after the unlink; losing that race to another
    // process of ours is an error worth seeing, not a loop.
    for _ in 0..2 {
        let flags = if replaced {
            base | OFlags::CREATE | OFlags::EXCL
        } else {
            base | OFlags::CREATE
        };
        match rustix::fs::open(path, flags, Mode::from_raw_mode(mode)) {
            Ok(fd) => {
                let st = rustix::fs::fstat(&fd)?;
                if is_private(&st, mode) {
                    let how = if replaced {
                        Opened::Replaced
                    } else {
                        Opened::Kept
                    };
                    return Ok((fd, how));
                }
                if replaced {
                    // Created with O_EXCL by us: only a umask can have changed the mode.
                    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
                    return Ok((fd, Opened::Replaced));
                }
            }
            // O_NOFOLLOW on a symlink, or something we may not open: replaced below.
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::ACCESS | rustix::io::Errno::PERM)
                if !replaced => {}
            Err(e) => return Err(e.into()),
        }
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        replaced = true;
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        "another process created it again while it was being replaced",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn a_file_of_the_wrong_mode_or_a_symlink_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("daemon.lock");
        let (_, how) = open_private(&path, 0o600).unwrap();
        assert_eq!(how, Opened::Kept);
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
        let ino = std::fs::metadata(&path).unwrap().ino();
        // Held open, as someone holding a flock on it would: its inode cannot be reused for the new file.
        let (held, how) = open_private(&path, 0o600).unwrap();
        assert_eq!(how, Opened::Kept);
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), ino);

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let (_, how) = open_private(&path, 0o600).unwrap();
        assert_eq!(how, Opened::Replaced);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o600);
        assert_ne!(meta.ino(), ino);
        drop(held);

        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "keep").unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let (_, how) = open_private(&path, 0o600).unwrap();
        assert_eq!(how, Opened::Replaced);
        assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }

    #[test]
    fn a_directory_others_may_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        private_dir(&run, 0o755).unwrap();
        assert_eq!(std::fs::metadata(&run).unwrap().mode() & 0o777, 0o755);
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = private_dir(&run, 0o755).unwrap_err().to_string();
        assert!(e.contains("lets others write"), "{e}");
        let link = dir.path().join("link");
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&run, &link).unwrap();
        let e = private_dir(&link, 0o755).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
    }
}
