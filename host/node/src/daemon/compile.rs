//! Compiling a pulled hook module for the node, and probing it, in processes of their own: `plexus hook compile`
//! and `plexus hook probe` run from the daemon's own binary. The compiler's working memory (tens of MiB for one module, which the allocator keeps once it is
//! freed) never enters the long-running daemon, so a node's daemon with hooks is as big as one without; a module
//! that crashes or exhausts the compiler ends only that process. Bounded in time and in what is read back.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use plexus_hooks::HookSpec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::hook_state::{Failure, Reason};

/// The longest a compile may take (the example guests take under a second each on two cores).
pub const COMPILE_TIMEOUT: Duration = Duration::from_secs(120);

/// The most read back of the compile's output and of its error.
const OUTPUT_CAP: u64 = 64 * 1024;

/// The program that compiles: the running daemon's own image, so that the artifact is made by the very wasmtime
/// build the node's CNI binary loads it with (an upgrade that replaced the file on disk does not change that).
pub fn own_binary() -> PathBuf {
    PathBuf::from("/proc/self/exe")
}

/// A module compiled into the cache: its component's sha256 and the artifact the node's CNI binary loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiled {
    pub sha256: String,
    pub artifact: PathBuf,
}

/// Compiles `module` into `cache_dir`'s hook artifacts with `compiler hook compile`, or says why not (the
/// compiler's own message, or what stopped it).
pub async fn compile_apart(
    compiler: &Path,
    module: &Path,
    cache_dir: &Path,
    timeout: Duration,
) -> Result<Compiled, String> {
    let args = [
        OsStr::new("hook"),
        OsStr::new("compile"),
        module.as_os_str(),
        OsStr::new("--cache-dir"),
        cache_dir.as_os_str(),
    ];
    let answer = run_apart(compiler, &args, None, timeout).await?;
    match (answer["sha256"].as_str(), answer["artifact"].as_str()) {
        (Some(sha), Some(artifact)) => Ok(Compiled {
            sha256: sha.to_string(),
            artifact: PathBuf::from(artifact),
        }),
        _ => Err(format!(
            "the compiler's answer names no sha256 and artifact: {}",
            plexus_cni::error::bounded(answer.to_string())
        )),
    }
}

/// Probes `entry` (one call of its kind on a synthetic pod, from the compiled artifact) with `compiler hook
/// probe`: the verdict, or why there is none.
pub async fn probe_apart(
    compiler: &Path,
    entry: &HookSpec,
    cache_dir: &Path,
    timeout: Duration,
) -> Result<Result<(), Failure>, String> {
    let args = [
        OsStr::new("hook"),
        OsStr::new("probe"),
        OsStr::new("--cache-dir"),
        cache_dir.as_os_str(),
    ];
    let input = serde_json::to_vec(entry).map_err(|e| e.to_string())?;
    let answer = run_apart(compiler, &args, Some(input), timeout).await?;
    if answer["passed"] == true {
        return Ok(Ok(()));
    }
    let reason = answer["reason"].as_str().and_then(Reason::parse);
    match (reason, answer["message"].as_str()) {
        (Some(reason), Some(message)) => Ok(Err(Failure::new(reason, message))),
        _ => Err(format!(
            "the probe's answer is not a verdict: {}",
            plexus_cni::error::bounded(answer.to_string())
        )),
    }
}

/// Runs `program args`, `input` on its stdin, within `timeout`: its JSON answer, or why there is none.
async fn run_apart(
    program: &Path,
    args: &[&OsStr],
    input: Option<Vec<u8>>,
    timeout: Duration,
) -> Result<serde_json::Value, String> {
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let finished = tokio::time::timeout(timeout, async {
        let write = async {
            if let (Some(mut stdin), Some(input)) = (stdin, input) {
                let _ = stdin.write_all(&input).await;
            }
        };
        tokio::join!(
            write,
            read_capped(stdout, &mut out),
            read_capped(stderr, &mut err)
        );
        child.wait().await
    })
    .await;
    let status = match finished {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => return Err(format!("waiting for it: {e}")),
        // Dropping the child kills it.
        Err(_) => return Err(format!("it did not finish within {} s", timeout.as_secs())),
    };
    if !status.success() {
        let message = String::from_utf8_lossy(&err);
        let message = message.trim().trim_start_matches("plexus hook: ");
        return Err(match message.is_empty() {
            true => format!("it ended with {status}"),
            false => plexus_cni::error::bounded(message.to_string()),
        });
    }
    serde_json::from_slice(&out).map_err(|e| format!("its answer is not JSON: {e}"))
}

/// Reads at most [`OUTPUT_CAP`] bytes of `from` into `buf`, and drains the rest so the writer is not blocked.
async fn read_capped(from: Option<impl tokio::io::AsyncRead + Unpin>, buf: &mut Vec<u8>) {
    let Some(from) = from else { return };
    let mut limited = from.take(OUTPUT_CAP);
    let _ = limited.read_to_end(buf).await;
    let _ = tokio::io::copy(&mut limited.into_inner(), &mut tokio::io::sink()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shell script at `dir/compiler`. Written by a shell of its own: a file this process held open for writing
    /// could be inherited by another test's fork and make exec fail with ETXTBSY.
    fn script(dir: &Path, body: &str) -> PathBuf {
        use std::io::Write;
        let path = dir.join("compiler");
        let mut writer = std::process::Command::new("/bin/sh")
            .args(["-c", r#"cat > "$1" && chmod 755 "$1""#, "sh"])
            .arg(&path)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = writer.stdin.take().unwrap();
        write!(stdin, "#!/bin/sh\n{body}\n").unwrap();
        drop(stdin);
        assert!(writer.wait().unwrap().success());
        path
    }

    #[tokio::test]
    async fn the_sha256_comes_from_the_compilers_answer_and_its_arguments_are_the_clis() {
        let dir = tempfile::tempdir().unwrap();
        let seen = dir.path().join("args");
        let compiler = script(
            dir.path(),
            &format!(
                "echo \"$@\" > {}; echo '{{\"sha256\": \"abc\", \"artifact\": \"x\"}}'",
                seen.display()
            ),
        );
        let got = compile_apart(
            &compiler,
            Path::new("/m.wasm"),
            Path::new("/c"),
            COMPILE_TIMEOUT,
        )
        .await;
        assert_eq!(
            got,
            Ok(Compiled {
                sha256: "abc".into(),
                artifact: "x".into()
            })
        );
        assert_eq!(
            std::fs::read_to_string(&seen).unwrap().trim(),
            "hook compile /m.wasm --cache-dir /c"
        );
    }

    #[tokio::test]
    async fn a_failed_compile_says_why_and_a_hung_one_is_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let failing = script(
            dir.path(),
            "echo 'plexus hook: m.wasm: not a component' >&2; exit 1",
        );
        let err = compile_apart(&failing, Path::new("/m"), Path::new("/c"), COMPILE_TIMEOUT)
            .await
            .unwrap_err();
        assert_eq!(err, "m.wasm: not a component");
        let hung = dir.path().join("hung");
        std::fs::create_dir(&hung).unwrap();
        let hung = script(&hung, "sleep 30");
        let started = std::time::Instant::now();
        let err = compile_apart(
            &hung,
            Path::new("/m"),
            Path::new("/c"),
            Duration::from_millis(300),
        )
        .await
        .unwrap_err();
        assert!(err.contains("did not finish"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
        let noisy = dir.path().join("noisy");
        std::fs::create_dir(&noisy).unwrap();
        let noisy = script(&noisy, "head -c 1000000 /dev/zero | tr '\\0' 'x'; exit 0");
        let err = compile_apart(&noisy, Path::new("/m"), Path::new("/c"), COMPILE_TIMEOUT)
            .await
            .unwrap_err();
        assert!(err.contains("not JSON"), "{err}");
    }

    #[tokio::test]
    async fn a_probes_verdict_is_read_back_and_its_entry_goes_on_stdin() {
        let dir = tempfile::tempdir().unwrap();
        let seen = dir.path().join("stdin");
        let entry: HookSpec = serde_json::from_value(
            serde_json::json!({"name": "h", "kind": "policy", "module": "/m.wasm"}),
        )
        .unwrap();
        let failing = script(
            dir.path(),
            &format!(
                "cat > {}; echo '{{\"passed\": false, \"reason\": \"KindMismatch\", \"message\": \"serves status\"}}'",
                seen.display()
            ),
        );
        let verdict = probe_apart(&failing, &entry, Path::new("/c"), COMPILE_TIMEOUT).await;
        assert_eq!(
            verdict,
            Ok(Err(Failure::new(Reason::KindMismatch, "serves status")))
        );
        let sent: HookSpec = serde_json::from_slice(&std::fs::read(&seen).unwrap()).unwrap();
        assert_eq!(sent, entry);
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        let passing = script(&other, "cat > /dev/null; echo '{\"passed\": true}'");
        let verdict = probe_apart(&passing, &entry, Path::new("/c"), COMPILE_TIMEOUT).await;
        assert_eq!(verdict, Ok(Ok(())));
    }
}
