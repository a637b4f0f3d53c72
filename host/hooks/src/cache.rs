//! Compiled components on disk: `<cacheDir>/hooks/<component sha256>-<engine hash>.cwasm`, and an index from
//! component files to their sha256: `<cacheDir>/hooks/<sha256 of the path, 16 hex>.module`.
//!
//! Loading precompiled code skips validation of the machine code, so an artifact is only used when
//! nobody but root (or the user plexus runs as) could have written it: the directory and the file
//! must be owned by such a user and not group- or other-writable. A trailer (magic, length) catches a truncated
//! or foreign file; wasmtime checks the rest of the structure (its ELF layout, the engine it was compiled for).
//! The machine code itself is trusted as any executable root installed is: checksumming the ~1 MB artifact on
//! every load (sha256 first, CRC32 later) cost more than the rest of loading. Anything else is refused, logged
//! and recompiled; the artifact is written with a sync and an atomic rename, so a crash cannot leave half of one.
//!
//! A warm load reads neither the component nor the whole artifact into memory: the index says which sha256 an
//! unchanged component file has (same device, inode, size, mtime and ctime; ctime cannot be set back by a
//! user, so a file changed in any way misses), and the artifact's trailer is checked and the file handed to
//! wasmtime, which maps it. Every copy of a megabyte into fresh memory costs page faults, which
//! were most of the time of an ADD with hooks.

use atomic_write_file::unix::OpenOptionsExt as _;
use atomic_write_file::AtomicWriteFile;
use sha2::{Digest, Sha256};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use wasmtime::component::Component;
use wasmtime::Engine;

use crate::declared::Declared;

/// The trailer after the wasmtime artifact: the component's declared kinds (one byte, [`Declared`]), magic,
/// artifact length (u64 LE).
const MAGIC: &[u8; 8] = b"PLXHOOK5";
const TRAILER: usize = 1 + 8 + 8;

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

/// The engine's identity in artifact names: artifacts of another wasmtime release, target or engine
/// configuration get another file name. The same for a build with the compiler (which writes artifacts) and one
/// without (which only loads them); wasmtime's own `precompile_compatibility_hash` exists only with a compiler.
/// Loading still checks compatibility itself (an artifact wasmtime refuses is refused here too), so the name only
/// has to keep different engines apart: it changes with plexus-hooks' version (every release) and wasmtime's
/// major version.
pub(crate) fn engine_hash(_engine: &Engine) -> String {
    let id = format!(
        "wasmtime {}; {}-{}; plexus-hooks {}; {}",
        crate::engine::WASMTIME_MAJOR,
        std::env::consts::ARCH,
        std::env::consts::OS,
        env!("CARGO_PKG_VERSION"),
        crate::engine::CONFIG_ID,
    );
    hex::encode(&Sha256::digest(id.as_bytes())[..8])
}

fn trusted_owner(uid: u32) -> bool {
    uid == 0 || uid == rustix::process::geteuid().as_raw()
}

/// Why a file or directory whose content makes root run code (compiled hooks here, attachment plans for the
/// node daemon) may not be trusted, if it may not: owned by anyone but root or this process's user, or
/// writable by group or others.
pub fn distrust(meta: &fs::Metadata) -> Option<String> {
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
pub(crate) fn cache_dir(base: &Path) -> Result<PathBuf, String> {
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
    base.join("hooks").join(artifact_name(engine, sha256))
}

fn artifact_name(engine: &Engine, sha256: &str) -> String {
    format!("{sha256}-{}.cwasm", engine_hash(engine))
}

/// Checks the trailer of an artifact file of `len` bytes (reads only its last bytes); the kinds it declares.
fn check_artifact(file: &fs::File, len: usize) -> Result<Declared, String> {
    use std::os::unix::fs::FileExt;
    if len < TRAILER {
        return Err("not a plexus hook artifact (too short)".into());
    }
    let mut trailer = [0u8; TRAILER];
    file.read_exact_at(&mut trailer, (len - TRAILER) as u64)
        .map_err(|e| format!("cannot read: {e}"))?;
    if &trailer[1..9] != MAGIC {
        return Err("not a plexus hook artifact".into());
    }
    let stored_len = u64::from_le_bytes(trailer[9..17].try_into().expect("8 bytes"));
    let payload = (len - TRAILER) as u64;
    if stored_len != payload {
        return Err(format!(
            "length mismatch ({payload} bytes, trailer says {stored_len}: truncated or corrupted)"
        ));
    }
    Ok(Declared::from_byte(trailer[0]))
}

fn read_artifact(engine: &Engine, path: &Path) -> Result<(Component, Declared), String> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(o_nofollow())
        .open(path)
        .map_err(|e| format!("cannot open: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("cannot stat: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if let Some(why) = distrust(&meta) {
        return Err(why);
    }
    let declared = check_artifact(&file, meta.len() as usize)?;
    // SAFETY: wasmtime requires that the file holds what `Component::serialize` of a compatible engine
    // produced, and that it does not change while mapped. The file name carries this engine's compatibility
    // hash, the trailer checked above matches what `write_artifact` stored, and the file and its directory are
    // writable only by root or the user plexus runs as (checked above and in `cache_dir`), who replace
    // artifacts by rename, never in place. wasmtime maps the file privately and ignores the trailer.
    #[allow(unsafe_code)]
    let component = unsafe { Component::deserialize_file(engine, path) };
    component
        .map(|c| (c, declared))
        .map_err(|e| format!("cannot deserialize: {e:#}"))
}

fn o_nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

/// Replaces `path` with `bytes`, mode 0600: a temp file without a name until commit, synced, renamed, and the
/// directory synced, so a reader sees the old file or the whole new one.
fn replace_private(path: &Path, bytes: &[&[u8]]) -> std::io::Result<()> {
    let mut f = AtomicWriteFile::options()
        .mode(0o600)
        .preserve_mode(false)
        .open(path)?;
    for part in bytes {
        f.write_all(part)?;
    }
    f.commit()
}

fn write_artifact(path: &Path, payload: &[u8], declared: Declared) -> Result<(), String> {
    let len = (payload.len() as u64).to_le_bytes();
    replace_private(path, &[payload, &[declared.to_byte()], MAGIC, &len])
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Whether and where [`load`] keeps compiled artifacts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum CacheUse<'a> {
    /// No cache configured (one-off runs).
    Off,
    /// A cache was configured but cannot be trusted or created (why).
    Unusable(&'a str),
    /// The verified `hooks` directory (from [`cache_dir`]).
    Dir(&'a Path),
}

/// The component's bytes, asked of `wasm` now, and the kinds they declare.
fn read_wasm(
    wasm: &mut dyn FnMut() -> Result<Vec<u8>, String>,
) -> Result<(Vec<u8>, Declared), String> {
    let bytes = wasm()?;
    let declared = crate::declared::read(&bytes)?;
    Ok((bytes, declared))
}

/// A component ready to instantiate, the kinds it declares, and where its machine code came from.
pub(crate) type Loaded = (Component, Declared, ArtifactSource);

/// Loads the cached artifact of the component with this digest, or compiles the component (its bytes come
/// from `wasm`, asked only then) and caches the result with the kinds it declares. `Err` only when the
/// component does not compile.
pub(crate) fn load(
    engine: &Engine,
    sha256: &str,
    wasm: &mut dyn FnMut() -> Result<Vec<u8>, String>,
    cache: CacheUse<'_>,
) -> Result<Loaded, String> {
    let compile = |wasm: &mut dyn FnMut() -> Result<Vec<u8>, String>| {
        let (bytes, declared) = read_wasm(wasm)?;
        compile_component(engine, &bytes).map(|c| (c, declared))
    };
    let dir = match cache {
        CacheUse::Off => {
            let (c, declared) = compile(wasm)?;
            return Ok((
                c,
                declared,
                ArtifactSource::CompiledUncached("no cache directory".into()),
            ));
        }
        CacheUse::Unusable(why) => {
            let (c, declared) = compile(wasm)?;
            return Ok((
                c,
                declared,
                ArtifactSource::CompiledUncached(why.to_string()),
            ));
        }
        CacheUse::Dir(dir) => dir,
    };
    let path = dir.join(artifact_name(engine, sha256));
    let mut refused = None;
    if fs::symlink_metadata(&path).is_ok() {
        match read_artifact(engine, &path) {
            Ok((c, declared)) => return Ok((c, declared, ArtifactSource::Cached)),
            Err(why) => {
                tracing::warn!("refusing cached hook artifact {}: {why}", path.display());
                if let Err(e) = fs::remove_file(&path) {
                    tracing::warn!("cannot remove {}: {e}", path.display());
                }
                refused = Some(why);
            }
        }
    }
    // Compiled straight to the artifact's bytes, written, and then mapped like any cached artifact: the
    // compiled code is never held twice (as a loaded component and as its serialization), which kept the peak
    // memory of an ADD that compiles its hooks several MiB higher.
    let (bytes, declared) = read_wasm(wasm)?;
    let payload = precompile(engine, &bytes)?;
    drop(bytes);
    let written = write_artifact(&path, &payload, declared);
    if written.is_ok() {
        drop(payload);
        match read_artifact(engine, &path) {
            Ok((c, declared)) => {
                let source = refused.map_or(ArtifactSource::Compiled, ArtifactSource::Recompiled);
                return Ok((c, declared, source));
            }
            Err(why) => return Err(format!("the artifact just written is unusable: {why}")),
        }
    }
    let why = written.expect_err("handled above");
    tracing::warn!("{why}");
    // SAFETY: `payload` is what `precompile_component` of this very engine returned a moment ago.
    #[allow(unsafe_code)]
    let c = unsafe { Component::deserialize(engine, &payload) }.map_err(|e| format!("{e:#}"))?;
    Ok((c, declared, ArtifactSource::CompiledUncached(why)))
}

/// Whether loading may compile a component that has no compiled artifact in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compile {
    /// Compile it and cache the artifact (a build without the compiler refuses all the same).
    WhenNeeded,
    /// Never: such a component is an error that says how to compile it. The CNI plugin loads this way whatever
    /// it was linked with, so that it behaves the same built alone or in a build of the whole workspace.
    Never,
}

/// Compiles a component (with the `compiler` feature).
pub(crate) fn compile_component(engine: &Engine, wasm: &[u8]) -> Result<Component, String> {
    #[cfg(feature = "compiler")]
    return Component::from_binary(engine, wasm).map_err(|e| format!("{e:#}"));
    #[cfg(not(feature = "compiler"))]
    {
        let _ = (engine, wasm);
        Err(NO_COMPILER.into())
    }
}

/// Compiles a component to the bytes of an artifact (with the `compiler` feature).
fn precompile(engine: &Engine, wasm: &[u8]) -> Result<Vec<u8>, String> {
    #[cfg(feature = "compiler")]
    return engine
        .precompile_component(wasm)
        .map_err(|e| format!("{e:#}"));
    #[cfg(not(feature = "compiler"))]
    {
        let _ = (engine, wasm);
        Err(NO_COMPILER.into())
    }
}

/// Why a process that does not compile (the CNI plugin, or a build without the compiler) cannot load a
/// component that has no compiled artifact.
pub(crate) const NO_COMPILER: &str = "the plexus CNI plugin has no compiler and the component has no compiled artifact in \
     the cache: compile it with `plexus hook compile FILE --cache-dir DIR` (or deliver it as a NetworkHook)";

/// What identifies an unchanged component file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ModuleStat {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl ModuleStat {
    pub(crate) fn of(path: &Path) -> std::io::Result<ModuleStat> {
        let m = fs::metadata(path)?;
        Ok(ModuleStat {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        })
    }

    fn line(&self) -> String {
        format!(
            "{} {} {} {} {}",
            self.dev, self.ino, self.size, self.mtime_ns, self.ctime_ns
        )
    }
}

const INDEX_HEADER: &str = "plexus-hook-module 1";

/// How long a component file must have been left unchanged before its digest is recorded.
const RACY_NS: i128 = 2_000_000_000;

fn index_path(dir: &Path, module: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let key = sha256_hex(module.as_os_str().as_bytes());
    dir.join(format!("{}.module", &key[..16]))
}

/// The sha256 recorded for `module` when the file is unchanged since (see the module docs).
pub(crate) fn indexed_sha256(dir: &Path, module: &Path, stat: &ModuleStat) -> Option<String> {
    use std::io::Read;
    use std::os::unix::ffi::OsStrExt;
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(o_nofollow())
        .open(index_path(dir, module))
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || distrust(&meta).is_some() || meta.len() > 64 * 1024 {
        return None;
    }
    let mut text = Vec::new();
    file.read_to_end(&mut text).ok()?;
    // header, path, stat line, sha256: the path is compared whole (the file name is only a hash of it).
    let mut lines = text.split(|b| *b == b'\n');
    let (header, path, st, sha) = (lines.next()?, lines.next()?, lines.next()?, lines.next()?);
    if header != INDEX_HEADER.as_bytes()
        || path != module.as_os_str().as_bytes()
        || st != stat.line().as_bytes()
        || sha.len() != 64
        || !sha.iter().all(|b| b.is_ascii_hexdigit())
    {
        return None;
    }
    Some(String::from_utf8_lossy(sha).into_owned())
}

/// Records that `module`, as `stat` describes it, has this sha256. Best effort: a failure only costs the next
/// load a read and a hash.
pub(crate) fn record_sha256(dir: &Path, module: &Path, stat: &ModuleStat, sha256: &str) {
    use std::os::unix::ffi::OsStrExt;
    // A file changed within the filesystem's timestamp granularity after this stat could keep the same times
    // (and size): only files left alone for a while are recorded (as git does with racily clean files).
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    if now_ns - stat.mtime_ns.max(stat.ctime_ns) < RACY_NS {
        return;
    }
    let path = index_path(dir, module);
    let mut text = Vec::new();
    text.extend_from_slice(INDEX_HEADER.as_bytes());
    text.push(b'\n');
    text.extend_from_slice(module.as_os_str().as_bytes());
    text.push(b'\n');
    text.extend_from_slice(stat.line().as_bytes());
    text.push(b'\n');
    text.extend_from_slice(sha256.as_bytes());
    text.push(b'\n');
    if let Err(e) = replace_private(&path, &[&text]) {
        tracing::debug!("cannot record the digest of {}: {e}", module.display());
    }
}
