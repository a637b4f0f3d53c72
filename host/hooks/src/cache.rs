//! Compiled components on disk: `<cacheDir>/hooks/<component sha256>-<engine hash>.cwasm`.
//!
//! Loading precompiled code skips validation of the machine code, so an artifact is only used when
//! nobody but root (or the user plexus runs as) could have written it: the directory and the file
//! must be owned by such a user and not group- or other-writable. A CRC32 in the file catches truncation
//! and corruption (trust comes from the permissions; a cryptographic hash of the ~1 MB artifact on every
//! load cost more than the rest of loading). Anything else is refused, logged and recompiled.

use sha2::{Digest, Sha256};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use wasmtime::component::Component;
use wasmtime::Engine;

const MAGIC: &[u8; 8] = b"PLXHOOK2";

/// Where a loaded component's machine code came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArtifactSource {
    /// Compiled now and written to the cache.
    Compiled,
    /// Compiled now; the cache was not usable (the reason is logged).
    CompiledUncached(String),
    /// Loaded from the cache, no compilation.
    Cached,
    /// A cached artifact existed but was refused (reason), then recompiled and rewritten.
    Recompiled(String),
}

/// A hex sha256.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The engine's compatibility hash: artifacts of another wasmtime version or configuration get a
/// different file name.
pub(crate) fn engine_hash(engine: &Engine) -> String {
    struct ShaHasher(Sha256);
    impl std::hash::Hasher for ShaHasher {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, bytes: &[u8]) {
            self.0.update(bytes);
        }
    }
    let mut h = ShaHasher(Sha256::new());
    std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut h);
    hex::encode(&h.0.finalize()[..8])
}

fn trusted_owner(uid: u32) -> bool {
    uid == 0 || uid == rustix::process::geteuid().as_raw()
}

/// Why `meta` may not be trusted, if it may not.
fn distrust(meta: &fs::Metadata) -> Option<String> {
    if !trusted_owner(meta.uid()) {
        return Some(format!("owned by uid {}", meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Some(format!(
            "writable by group or others (mode {:o})",
            meta.mode() & 0o7777
        ));
    }
    None
}

/// The cache directory, created (0700) if missing, or why it cannot be used.
fn cache_dir(base: &Path) -> Result<PathBuf, String> {
    // Whoever can write the base directory can swap the `hooks` directory itself.
    if let Ok(meta) = fs::metadata(base) {
        if let Some(why) = distrust(&meta) {
            return Err(format!("{} is {why}", base.display()));
        }
    }
    let dir = base.join("hooks");
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let meta =
        fs::symlink_metadata(&dir).map_err(|e| format!("cannot stat {}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if let Some(why) = distrust(&meta) {
        return Err(format!("{} is {why}", dir.display()));
    }
    Ok(dir)
}

/// The artifact path for a component with this digest, as `load` would use it.
pub(crate) fn artifact_path(base: &Path, engine: &Engine, sha256: &str) -> PathBuf {
    base.join("hooks")
        .join(format!("{sha256}-{}.cwasm", engine_hash(engine)))
}

fn read_artifact(engine: &Engine, path: &Path) -> Result<Component, String> {
    let meta = fs::symlink_metadata(path).map_err(|e| format!("cannot stat: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if let Some(why) = distrust(&meta) {
        return Err(why);
    }
    let bytes = fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    let header = MAGIC.len() + 4;
    if bytes.len() < header || &bytes[..MAGIC.len()] != MAGIC {
        return Err("not a plexus hook artifact".into());
    }
    let (digest, payload) = bytes[MAGIC.len()..].split_at(4);
    if crc32fast::hash(payload).to_le_bytes() != digest {
        return Err("checksum mismatch (corrupted or tampered)".into());
    }
    // SAFETY: wasmtime requires that deserialized bytes come from `Component::serialize` of a
    // compatible engine. The file name carries this engine's compatibility hash, the checksum above
    // matches what `write_artifact` stored, and the file and its directory are writable only by root or
    // the user plexus runs as (checked above and in `cache_dir`).
    #[allow(unsafe_code)]
    let component = unsafe { Component::deserialize(engine, payload) };
    component.map_err(|e| format!("cannot deserialize: {e}"))
}

fn write_artifact(dir: &Path, path: &Path, payload: &[u8]) -> Result<(), String> {
    let tmp = dir.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("artifact")
    ));
    let write = || -> std::io::Result<()> {
        let _ = fs::remove_file(&tmp);
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(MAGIC)?;
        f.write_all(&crc32fast::hash(payload).to_le_bytes())?;
        f.write_all(payload)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        if let Ok(d) = fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        format!("cannot write {}: {e}", path.display())
    })
}

/// Compiles `wasm` or loads its cached artifact. `Err` only when the component does not compile.
pub(crate) fn load(
    engine: &Engine,
    wasm: &[u8],
    sha256: &str,
    base: Option<&Path>,
) -> Result<(Component, ArtifactSource), String> {
    let Some(base) = base else {
        let c = Component::from_binary(engine, wasm).map_err(|e| format!("{e:#}"))?;
        return Ok((
            c,
            ArtifactSource::CompiledUncached("no cache directory".into()),
        ));
    };
    let dir = match cache_dir(base) {
        Ok(dir) => dir,
        Err(why) => {
            tracing::warn!("not using the hook cache: {why}");
            let c = Component::from_binary(engine, wasm).map_err(|e| format!("{e:#}"))?;
            return Ok((c, ArtifactSource::CompiledUncached(why)));
        }
    };
    let path = artifact_path(base, engine, sha256);
    let mut refused = None;
    if path.exists() || fs::symlink_metadata(&path).is_ok() {
        match read_artifact(engine, &path) {
            Ok(c) => return Ok((c, ArtifactSource::Cached)),
            Err(why) => {
                tracing::warn!("refusing cached hook artifact {}: {why}", path.display());
                if let Err(e) = fs::remove_file(&path) {
                    tracing::warn!("cannot remove {}: {e}", path.display());
                }
                refused = Some(why);
            }
        }
    }
    let c = Component::from_binary(engine, wasm).map_err(|e| format!("{e:#}"))?;
    let source = match c.serialize() {
        Ok(payload) => match write_artifact(&dir, &path, &payload) {
            Ok(()) => refused.map_or(ArtifactSource::Compiled, ArtifactSource::Recompiled),
            Err(why) => {
                tracing::warn!("{why}");
                ArtifactSource::CompiledUncached(why)
            }
        },
        Err(e) => {
            let why = format!("cannot serialize: {e}");
            tracing::warn!("{why}");
            ArtifactSource::CompiledUncached(why)
        }
    };
    Ok((c, source))
}
